//! What needs no GPU: a partition's allocation table, and the checks that
//! turn a built-in kernel's parameter block into a validated call.
//!
//! Device addresses are real `CUdeviceptr`s; the table is what confines a
//! tenant to its own memory. Every range a partition touches on a guest's
//! behalf (copies, fills, built-in kernel operands) must lie inside one of
//! the partition's own allocations, checked here before any device work.

use std::collections::BTreeMap;

use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::OpError;

/// One allocation: `size` bytes at the address it is keyed by, carved from
/// the driver allocation at `base` (which is what gets freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alloc {
    /// Bytes the guest asked for.
    pub size: u64,
    /// What cuMemAlloc returned.
    pub base: u64,
    /// Bytes charged to the quota (size plus alignment padding).
    pub charged: u64,
}

/// A partition's allocations by device address.
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    map: BTreeMap<u64, Alloc>,
    used: u64,
}

impl Allocations {
    /// Bytes charged to the quota.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Live allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Records an allocation at `addr`.
    pub fn insert(&mut self, addr: u64, a: Alloc) {
        self.used += a.charged;
        self.map.insert(addr, a);
    }

    /// Removes the allocation that starts at `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<Alloc> {
        let a = self.map.remove(&addr)?;
        self.used -= a.charged;
        Some(a)
    }

    /// Removes everything, returning what was there.
    pub fn drain(&mut self) -> Vec<Alloc> {
        self.used = 0;
        std::mem::take(&mut self.map).into_values().collect()
    }

    /// `Ok` if `[addr, addr + len)` lies inside one allocation.
    pub fn check(&self, addr: u64, len: u64) -> Result<(), OpError> {
        let out = OpError::OutOfRange { addr, len };
        let (&start, a) = self.map.range(..=addr).next_back().ok_or(out.clone())?;
        let off = addr - start;
        if off > a.size || len > a.size - off {
            return Err(out);
        }
        Ok(())
    }
}

/// Bytes of `n` 32-bit elements; `u64::MAX` (never in range) on overflow.
pub(crate) fn words(n: u64) -> u64 {
    n.saturating_mul(4)
}

/// Whether two checked ranges share a byte.
pub(crate) fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// An input that is exactly the output range is read element by element
/// before the element is written, which is safe; one that overlaps the
/// output otherwise must be copied first.
fn needs_copy(out: u64, input: u64, len: u64) -> bool {
    input != out && overlaps(out, len, input, len)
}

/// A built-in kernel call whose ranges all lie inside the partition's
/// allocations and whose float operands are 4-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Builtin {
    /// `count` words at `dst` set to `value`; `dst` may be unaligned.
    Fill { dst: u64, count: u64, value: u32 },
    /// `bytes` from `src` to `dst`, which do not overlap.
    Copy { dst: u64, src: u64, bytes: u64 },
    /// `c = a + b`; a `*_copy` input overlaps `c` partly and is read from
    /// a copy.
    Vadd {
        c: u64,
        a: u64,
        b: u64,
        n: u64,
        a_copy: bool,
        b_copy: bool,
    },
    /// `y = a * x + y`.
    Saxpy {
        y: u64,
        x: u64,
        n: u64,
        a: f32,
        x_copy: bool,
    },
    /// `C = alpha * A * B + beta * C` with `m, n, k > 0` and `alpha != 0`.
    Sgemm {
        p: abi::SgemmParams,
        a_copy: bool,
        b_copy: bool,
    },
    /// `C = beta * C` (`beta == 0` clears C without reading it).
    Scale { c: u64, count: u64, beta: f32 },
    /// `out = sum(input[..n])`.
    Reduce { out: u64, input: u64, n: u64 },
    /// Nothing to do (an empty sgemm).
    Nothing,
}

/// Reads a parameter block of exactly `size_of::<T>()` bytes.
fn params<T: ByteValued + Default>(entry: &str, bytes: &[u8]) -> Result<T, OpError> {
    let mut p = T::default();
    let size = std::mem::size_of::<T>();
    if bytes.len() != size {
        return Err(OpError::Invalid(format!(
            "{entry}: parameter block is {} bytes, expected {size}",
            bytes.len()
        )));
    }
    p.as_mut_slice().copy_from_slice(bytes);
    Ok(p)
}

fn aligned(entry: &str, what: &str, addr: u64) -> Result<(), OpError> {
    if !addr.is_multiple_of(4) {
        return Err(OpError::Invalid(format!(
            "{entry}: {what} {addr:#x} is not 4-byte aligned"
        )));
    }
    Ok(())
}

/// Validates a launch of the built-in module's `entry`: the entry exists,
/// the shape has no zero dimension, the parameter block has the right size
/// and every operand lies inside one allocation of `allocs`.
pub(crate) fn plan_builtin(
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    raw: &[u8],
    allocs: &Allocations,
) -> Result<Builtin, OpError> {
    if !abi::BUILTIN_ENTRIES.contains(&entry) {
        return Err(OpError::NotFound(format!(
            "entry point {entry:?} in the built-in module"
        )));
    }
    if grid.contains(&0) || block.contains(&0) {
        return Err(OpError::Invalid(format!(
            "{entry}: grid {grid:?} / block {block:?} has a zero dimension"
        )));
    }
    match entry {
        "fill_u32" => {
            let p: abi::FillParams = params(entry, raw)?;
            allocs.check(p.dst, words(p.count))?;
            Ok(Builtin::Fill {
                dst: p.dst,
                count: p.count,
                value: p.value,
            })
        }
        "copy" => {
            let p: abi::CopyParams = params(entry, raw)?;
            allocs.check(p.dst, p.bytes)?;
            allocs.check(p.src, p.bytes)?;
            if overlaps(p.dst, p.bytes, p.src, p.bytes) {
                return Err(OpError::Invalid(format!(
                    "copy: source {:#x} and destination {:#x} overlap ({} bytes)",
                    p.src, p.dst, p.bytes
                )));
            }
            Ok(Builtin::Copy {
                dst: p.dst,
                src: p.src,
                bytes: p.bytes,
            })
        }
        "vadd_f32" => {
            let p: abi::VaddParams = params(entry, raw)?;
            let len = words(p.n);
            allocs.check(p.c, len)?;
            allocs.check(p.a, len)?;
            allocs.check(p.b, len)?;
            aligned(entry, "c", p.c)?;
            aligned(entry, "a", p.a)?;
            aligned(entry, "b", p.b)?;
            Ok(Builtin::Vadd {
                c: p.c,
                a: p.a,
                b: p.b,
                n: p.n,
                a_copy: needs_copy(p.c, p.a, len),
                b_copy: needs_copy(p.c, p.b, len),
            })
        }
        "saxpy_f32" => {
            let p: abi::SaxpyParams = params(entry, raw)?;
            let len = words(p.n);
            allocs.check(p.y, len)?;
            allocs.check(p.x, len)?;
            aligned(entry, "y", p.y)?;
            aligned(entry, "x", p.x)?;
            Ok(Builtin::Saxpy {
                y: p.y,
                x: p.x,
                n: p.n,
                a: p.a,
                x_copy: needs_copy(p.y, p.x, len),
            })
        }
        "sgemm_f32" => {
            let p: abi::SgemmParams = params(entry, raw)?;
            let (m, n, k) = (u64::from(p.m), u64::from(p.n), u64::from(p.k));
            let (clen, alen, blen) = (words(m * n), words(m * k), words(k * n));
            allocs.check(p.c, clen)?;
            allocs.check(p.a, alen)?;
            allocs.check(p.b, blen)?;
            aligned(entry, "c", p.c)?;
            aligned(entry, "a", p.a)?;
            aligned(entry, "b", p.b)?;
            if m == 0 || n == 0 {
                return Ok(Builtin::Nothing);
            }
            if k == 0 || p.alpha == 0.0 {
                return Ok(Builtin::Scale {
                    c: p.c,
                    count: m * n,
                    beta: p.beta,
                });
            }
            // Blocks read rows of A and columns of B while others write
            // C: any overlap with C means reading from a copy.
            Ok(Builtin::Sgemm {
                p,
                a_copy: overlaps(p.c, clen, p.a, alen),
                b_copy: overlaps(p.c, clen, p.b, blen),
            })
        }
        "reduce_sum_f32" => {
            let p: abi::ReduceSumParams = params(entry, raw)?;
            allocs.check(p.out, 4)?;
            allocs.check(p.input, words(p.n))?;
            aligned(entry, "out", p.out)?;
            aligned(entry, "input", p.input)?;
            Ok(Builtin::Reduce {
                out: p.out,
                input: p.input,
                n: p.n,
            })
        }
        _ => Err(OpError::NotFound(format!(
            "entry point {entry:?} in the built-in module"
        ))),
    }
}

/// Limits of a loaded kernel, read from the driver once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelLimits {
    /// Bytes of its parameter list, if the driver could tell.
    pub param_bytes: Option<usize>,
    /// Most threads per block.
    pub max_threads: u32,
    /// Most dynamic shared memory per block, bytes.
    pub max_dynamic_shared: u32,
}

/// Validates a launch of a loaded kernel against its limits.
pub(crate) fn check_module_launch(
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    params: &[u8],
    limits: &KernelLimits,
) -> Result<(), OpError> {
    if grid.contains(&0) || block.contains(&0) {
        return Err(OpError::Invalid(format!(
            "{entry}: grid {grid:?} / block {block:?} has a zero dimension"
        )));
    }
    let threads = block.iter().map(|&d| u64::from(d)).product::<u64>();
    if threads > u64::from(limits.max_threads) {
        return Err(OpError::Invalid(format!(
            "{entry}: block {block:?} has {threads} threads, the kernel allows {}",
            limits.max_threads
        )));
    }
    if shared_mem > limits.max_dynamic_shared {
        return Err(OpError::Invalid(format!(
            "{entry}: {shared_mem} bytes of dynamic shared memory, the kernel allows {}",
            limits.max_dynamic_shared
        )));
    }
    if params.len() > abi::MAX_PARAMS_SIZE as usize {
        return Err(OpError::Invalid(format!(
            "{entry}: parameter block of {} bytes is larger than {}",
            params.len(),
            abi::MAX_PARAMS_SIZE
        )));
    }
    if let Some(want) = limits.param_bytes {
        if params.len() != want {
            return Err(OpError::Invalid(format!(
                "{entry}: parameter block is {} bytes, the kernel's parameters take {want}",
                params.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f00_0010_0000;
    const C: u64 = 0x7f00_0020_0000;

    fn table() -> Allocations {
        let mut t = Allocations::default();
        for addr in [A, B, C] {
            t.insert(
                addr,
                Alloc {
                    size: 400,
                    base: addr,
                    charged: 400,
                },
            );
        }
        t
    }

    fn plan<T: ByteValued>(t: &Allocations, entry: &str, p: T) -> Result<Builtin, OpError> {
        plan_builtin(entry, [1, 1, 1], [64, 1, 1], p.as_slice(), t)
    }

    fn oor(r: Result<Builtin, OpError>) -> bool {
        matches!(r, Err(OpError::OutOfRange { .. }))
    }

    fn invalid(r: Result<Builtin, OpError>) -> bool {
        matches!(r, Err(OpError::Invalid(_)))
    }

    #[test]
    fn test_table_check_and_accounting() {
        let mut t = table();
        assert_eq!(t.used(), 1200);
        assert_eq!(t.len(), 3);
        assert!(t.check(A, 400).is_ok());
        assert!(t.check(A + 400, 0).is_ok());
        assert!(t.check(A + 399, 1).is_ok());
        assert_eq!(
            t.check(A + 399, 2),
            Err(OpError::OutOfRange {
                addr: A + 399,
                len: 2
            })
        );
        assert!(t.check(A + 401, 0).is_err());
        assert!(t.check(A - 1, 1).is_err());
        assert!(t.check(0, 0).is_err());
        assert!(t.check(A, u64::MAX).is_err());
        assert!(t.check(u64::MAX, 1).is_err());
        assert_eq!(t.remove(B).map(|a| a.size), Some(400));
        assert!(t.remove(B).is_none());
        assert!(t.check(B, 1).is_err());
        assert_eq!(t.used(), 800);
        assert_eq!(t.drain().len(), 2);
        assert_eq!(t.used(), 0);
        assert!(t.check(A, 1).is_err());
    }

    #[test]
    fn test_unknown_entry_bad_shape_and_size() {
        let t = table();
        assert!(matches!(
            plan_builtin("nope", [1, 1, 1], [1, 1, 1], &[], &t),
            Err(OpError::NotFound(_))
        ));
        let p = abi::FillParams {
            dst: A,
            count: 1,
            value: 0,
            reserved: 0,
        };
        assert!(invalid(plan_builtin(
            "fill_u32",
            [0, 1, 1],
            [1, 1, 1],
            p.as_slice(),
            &t
        )));
        assert!(invalid(plan_builtin(
            "fill_u32",
            [1, 1, 1],
            [1, 0, 1],
            p.as_slice(),
            &t
        )));
        assert!(invalid(plan_builtin(
            "fill_u32",
            [1, 1, 1],
            [1, 1, 1],
            &p.as_slice()[..20],
            &t
        )));
        // Any grid the guest gives is accepted: built-ins pick their own.
        assert!(plan_builtin("fill_u32", [7, 3, 2], [1, 1, 1], p.as_slice(), &t).is_ok());
    }

    #[test]
    fn test_out_of_range_operands_are_refused() {
        let t = table();
        let huge = u64::MAX / 2; // n * 4 overflows
        let fill = |dst, count| abi::FillParams {
            dst,
            count,
            value: 1,
            reserved: 0,
        };
        assert!(oor(plan(&t, "fill_u32", fill(A, 101))));
        assert!(oor(plan(&t, "fill_u32", fill(A + 4, 100))));
        assert!(oor(plan(&t, "fill_u32", fill(A, huge))));
        assert!(oor(plan(&t, "fill_u32", fill(0, 1))));
        // Another partition's allocation is just an unknown address here.
        assert!(oor(plan(&t, "fill_u32", fill(A + 0x1000, 1))));

        let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
        assert!(oor(plan(&t, "copy", copy(A, B, 401))));
        assert!(oor(plan(&t, "copy", copy(A, B + 1, 400))));
        assert!(oor(plan(&t, "copy", copy(A + 1, B, 400))));
        assert!(oor(plan(&t, "copy", copy(A, B, u64::MAX))));

        let vadd = |c, a, b, n| abi::VaddParams { c, a, b, n };
        assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B, 101))));
        assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B + 4, 100))));
        assert!(oor(plan(&t, "vadd_f32", vadd(C + 4, A, B, 100))));
        assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B, huge))));
        assert!(oor(plan(&t, "vadd_f32", vadd(C, 0, B, 1))));

        let saxpy = |y, x, n| abi::SaxpyParams {
            y,
            x,
            n,
            a: 2.0,
            reserved: 0,
        };
        assert!(oor(plan(&t, "saxpy_f32", saxpy(A, B + 4, 100))));
        assert!(oor(plan(&t, "saxpy_f32", saxpy(A + 400, B, 1))));
        assert!(oor(plan(&t, "saxpy_f32", saxpy(A, B, huge))));

        let sgemm = |c, a, b, m, n, k| abi::SgemmParams {
            c,
            a,
            b,
            m,
            n,
            k,
            reserved: 0,
            alpha: 1.0,
            beta: 1.0,
        };
        assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 10, 10, 11))));
        assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 11, 10, 10))));
        assert!(oor(plan(&t, "sgemm_f32", sgemm(C + 4, A, B, 10, 10, 10))));
        assert!(oor(plan(
            &t,
            "sgemm_f32",
            sgemm(C, A, B, u32::MAX, u32::MAX, 1)
        )));
        assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 1, 1, u32::MAX))));
        // Empty shapes still need their pointers inside allocations.
        assert!(oor(plan(&t, "sgemm_f32", sgemm(0, A, B, 0, 0, 0))));

        let reduce = |out, input, n| abi::ReduceSumParams { out, input, n };
        assert!(oor(plan(&t, "reduce_sum_f32", reduce(A + 400, B, 1))));
        assert!(oor(plan(&t, "reduce_sum_f32", reduce(A + 397, B, 1))));
        assert!(oor(plan(&t, "reduce_sum_f32", reduce(A, B, 101))));
        assert!(oor(plan(&t, "reduce_sum_f32", reduce(A, B, huge))));

        // In range, the same calls pass.
        assert!(plan(&t, "sgemm_f32", sgemm(C, A, B, 10, 10, 10)).is_ok());
        assert!(plan(&t, "vadd_f32", vadd(C, A, B, 100)).is_ok());
    }

    #[test]
    fn test_float_operands_must_be_aligned_but_fill_and_copy_need_not() {
        let t = table();
        let vadd = abi::VaddParams {
            c: C,
            a: A + 2,
            b: B,
            n: 10,
        };
        assert!(invalid(plan(&t, "vadd_f32", vadd)));
        let reduce = abi::ReduceSumParams {
            out: A + 1,
            input: B,
            n: 1,
        };
        assert!(invalid(plan(&t, "reduce_sum_f32", reduce)));
        let fill = abi::FillParams {
            dst: A + 1,
            count: 99,
            value: 7,
            reserved: 0,
        };
        assert_eq!(
            plan(&t, "fill_u32", fill),
            Ok(Builtin::Fill {
                dst: A + 1,
                count: 99,
                value: 7
            })
        );
        let copy = abi::CopyParams {
            dst: A + 3,
            src: B + 1,
            bytes: 300,
        };
        assert!(plan(&t, "copy", copy).is_ok());
    }

    #[test]
    fn test_aliasing_decisions() {
        let t = table();
        // copy refuses overlap.
        let copy = abi::CopyParams {
            dst: A,
            src: A + 8,
            bytes: 16,
        };
        assert!(invalid(plan(&t, "copy", copy)));
        // vadd: exact aliasing is read in place, partial overlap copied.
        let v = |c, a, b| abi::VaddParams { c, a, b, n: 50 };
        assert_eq!(
            plan(&t, "vadd_f32", v(A, A, A)),
            Ok(Builtin::Vadd {
                c: A,
                a: A,
                b: A,
                n: 50,
                a_copy: false,
                b_copy: false
            })
        );
        assert_eq!(
            plan(&t, "vadd_f32", v(A + 4, A, B)),
            Ok(Builtin::Vadd {
                c: A + 4,
                a: A,
                b: B,
                n: 50,
                a_copy: true,
                b_copy: false
            })
        );
        // saxpy: x partly over y.
        let s = abi::SaxpyParams {
            y: A + 200,
            x: A + 196,
            n: 50,
            a: 1.0,
            reserved: 0,
        };
        assert!(matches!(
            plan(&t, "saxpy_f32", s),
            Ok(Builtin::Saxpy { x_copy: true, .. })
        ));
        // sgemm: any overlap of C with A or B.
        let g = abi::SgemmParams {
            c: A,
            a: A,
            b: B,
            m: 5,
            n: 5,
            k: 5,
            reserved: 0,
            alpha: 1.0,
            beta: 0.0,
        };
        assert!(matches!(
            plan(&t, "sgemm_f32", g),
            Ok(Builtin::Sgemm {
                a_copy: true,
                b_copy: false,
                ..
            })
        ));
        // k == 0 or alpha == 0 only scales C; m == 0 does nothing.
        assert_eq!(
            plan(&t, "sgemm_f32", abi::SgemmParams { k: 0, ..g }),
            Ok(Builtin::Scale {
                c: A,
                count: 25,
                beta: 0.0
            })
        );
        assert_eq!(
            plan(&t, "sgemm_f32", abi::SgemmParams { alpha: 0.0, ..g }),
            Ok(Builtin::Scale {
                c: A,
                count: 25,
                beta: 0.0
            })
        );
        assert_eq!(
            plan(&t, "sgemm_f32", abi::SgemmParams { m: 0, ..g }),
            Ok(Builtin::Nothing)
        );
        // reduce: out inside the input is fine (two passes).
        let r = abi::ReduceSumParams {
            out: A,
            input: A,
            n: 100,
        };
        assert!(plan(&t, "reduce_sum_f32", r).is_ok());
    }

    #[test]
    fn test_module_launch_checks() {
        let limits = KernelLimits {
            param_bytes: Some(16),
            max_threads: 1024,
            max_dynamic_shared: 48 << 10,
        };
        let p = [0u8; 16];
        let ok = |g, b, s, p: &[u8]| check_module_launch("k", g, b, s, p, &limits);
        assert!(ok([1, 1, 1], [256, 1, 1], 0, &p).is_ok());
        assert!(ok([0, 1, 1], [256, 1, 1], 0, &p).is_err());
        assert!(ok([1, 1, 1], [32, 32, 2], 0, &p).is_err());
        assert!(ok([1, 1, 1], [32, 32, 1], 48 << 10, &p).is_ok());
        assert!(ok([1, 1, 1], [32, 32, 1], (48 << 10) + 1, &p).is_err());
        assert!(ok([1, 1, 1], [1, 1, 1], 0, &p[..15]).is_err());
        assert!(ok([1, 1, 1], [1, 1, 1], 0, &[0u8; 17]).is_err());
        let unknown = KernelLimits {
            param_bytes: None,
            ..limits
        };
        assert!(check_module_launch("k", [1; 3], [1; 3], 0, &[0u8; 40], &unknown).is_ok());
        assert!(check_module_launch("k", [1; 3], [1; 3], 0, &[0u8; 4097], &unknown).is_err());
    }
}
