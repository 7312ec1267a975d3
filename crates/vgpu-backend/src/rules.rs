//! The device's rules, the same for every backend: what an allocation may
//! ask for, the table that confines a partition to its own allocations,
//! and the checks that turn a built-in kernel's parameter block into a
//! validated call. Nothing here touches a device, so every backend runs
//! the same code and the rules exist once.
//!
//! Every range a partition touches on a guest's behalf (copies, fills,
//! built-in kernel operands) must lie inside one of the partition's own
//! allocations, checked here before any device work.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use log::debug;
use vgpu_abi::{self as abi, ByteValued};

use crate::{FunctionInfo, Launch, OpError, PartitionSpec};

/// Alignment of an allocation asked with alignment 0.
pub const DEFAULT_ALIGN: u64 = abi::ALLOC_DEFAULT_ALIGN;
/// Largest alignment an allocation may ask for.
pub const MAX_ALIGN: u64 = abi::ALLOC_MAX_ALIGN;
/// Most live allocations of one partition; bounds the host memory spent
/// on bookkeeping, whatever the allocation sizes.
pub const MAX_ALLOCATIONS: usize = abi::MAX_ALLOCATIONS as usize;

/// First device address of an address space a backend lays out itself
/// (see [`AddressSpace`]).
pub const ADDRESS_BASE: u64 = 0x0001_0000_0000;
/// End (exclusive) of such an address space.
pub const ADDRESS_END: u64 = 1 << 48;
/// Unmapped bytes kept after every allocation of such an address space.
pub const GUARD_GAP: u64 = 64 << 10;

/// The alignment an allocation of `size` bytes asking for `align` gets:
/// [`DEFAULT_ALIGN`] for 0, otherwise `align` itself, which must be a
/// power of two no larger than [`MAX_ALIGN`]. A size of 0 is refused.
pub fn alloc_align(size: u64, align: u64) -> Result<u64, OpError> {
    if size == 0 {
        return Err(OpError::Invalid("allocation of 0 bytes".into()));
    }
    let align = if align == 0 { DEFAULT_ALIGN } else { align };
    if !align.is_power_of_two() {
        return Err(OpError::Invalid(format!(
            "alignment {align:#x} is not a power of two"
        )));
    }
    if align > MAX_ALIGN {
        return Err(OpError::Invalid(format!(
            "alignment {align:#x} is larger than {MAX_ALIGN:#x}"
        )));
    }
    Ok(align)
}

/// A partition's quota changed from `old` to `new` bytes while it holds
/// `used` ([`Partition::set_memory`](crate::Partition::set_memory)):
/// below `used` is refused; the difference is drawn from or given back
/// to `left`, what the backend has not given out, where the partition
/// holds a reservation of it (`None`: another context of one that does).
/// A refusal changes nothing.
pub fn requota(left: Option<&mut u64>, used: u64, old: u64, new: u64) -> Result<(), OpError> {
    if new < used {
        return Err(OpError::Invalid(format!(
            "a quota of {new} bytes is less than the {used} in use"
        )));
    }
    let Some(left) = left else {
        return Ok(());
    };
    if new > old {
        let more = new - old;
        if more > *left {
            return Err(OpError::NoMemory {
                requested: more,
                available: *left,
            });
        }
        *left -= more;
    } else {
        *left = left.saturating_add(old - new);
    }
    Ok(())
}

/// `value` rounded up to a multiple of `align` (a power of two), or
/// `None` on overflow.
pub fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// One allocation of an [`Allocations`] table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<T> {
    /// Bytes the guest asked for: the range that may be touched.
    pub size: u64,
    /// Bytes charged to the quota (the size, plus any padding).
    pub charged: u64,
    /// What the backend keeps with it (host memory, a driver address).
    pub data: T,
}

/// A device range resolved to its allocation: `len` bytes at byte `off`
/// of the allocation starting at device address `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Device address of the allocation.
    pub start: u64,
    /// Offset of the range in the allocation.
    pub off: usize,
    /// Length of the range.
    pub len: usize,
}

impl Loc {
    /// The range, as indices into the allocation's bytes.
    pub fn range(&self) -> Range<usize> {
        self.off..self.off + self.len
    }

    /// Whether the two ranges share a byte (same allocation assumed).
    pub fn overlaps(&self, other: &Loc) -> bool {
        self.off < other.off + other.len && other.off < self.off + self.len
    }
}

/// Names a partition in the debug lines of its allocation table:
/// `<backend> backend: partition "<name>"`.
#[derive(Debug, Clone, Copy)]
pub struct PartitionName<'a> {
    /// The backend, e.g. `"cuda"`.
    pub backend: &'static str,
    /// The partition's name.
    pub name: &'a str,
}

impl<'a> PartitionName<'a> {
    /// The partition of `spec` on `backend`.
    pub fn of(backend: &'static str, spec: &'a PartitionSpec) -> Self {
        PartitionName {
            backend,
            name: &spec.name,
        }
    }
}

impl fmt::Display for PartitionName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} backend: partition {:?}", self.backend, self.name)
    }
}

/// A partition's allocations by device address, and the bytes they
/// charge to its quota.
#[derive(Debug)]
pub struct Allocations<T> {
    map: BTreeMap<u64, Entry<T>>,
    used: u64,
}

impl<T> Default for Allocations<T> {
    fn default() -> Self {
        Allocations {
            map: BTreeMap::new(),
            used: 0,
        }
    }
}

impl<T> Allocations<T> {
    /// Bytes charged to the quota.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Live allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// `Ok` if one more allocation charging `requested` bytes fits a
    /// quota with `available` bytes left and the [`MAX_ALLOCATIONS`]
    /// bound; `NoMemory` otherwise.
    pub fn admit(&self, requested: u64, available: u64) -> Result<(), OpError> {
        if requested > available || self.map.len() >= MAX_ALLOCATIONS {
            return Err(OpError::NoMemory {
                requested,
                available,
            });
        }
        Ok(())
    }

    /// [`admit`](Self::admit), a refusal logged for `owner` at debug
    /// level only: what a guest asks for beyond its quota is the guest's
    /// business.
    pub fn admit_logged(
        &self,
        owner: PartitionName<'_>,
        requested: u64,
        available: u64,
    ) -> Result<(), OpError> {
        self.admit(requested, available).inspect_err(|_| {
            debug!(
                "{owner}: {requested} bytes requested, {available} available, {} allocations",
                self.len()
            );
        })
    }

    /// Records an allocation of `size` bytes (charging `charged`) at
    /// `addr`. `size` must fit a `usize` (ranges are resolved to byte
    /// offsets).
    pub fn insert(&mut self, addr: u64, size: u64, charged: u64, data: T) {
        debug_assert!(usize::try_from(size).is_ok());
        self.used += charged;
        self.map.insert(
            addr,
            Entry {
                size,
                charged,
                data,
            },
        );
    }

    /// [`insert`](Self::insert), logged for `owner` at debug level.
    pub fn insert_logged(
        &mut self,
        owner: PartitionName<'_>,
        addr: u64,
        size: u64,
        charged: u64,
        data: T,
    ) {
        self.insert(addr, size, charged, data);
        debug!(
            "{owner}: allocated {size} bytes at {addr:#x} ({} in use)",
            self.used
        );
    }

    /// Removes the allocation that starts at `addr`; `NotFound` if none does.
    pub fn free(&mut self, addr: u64) -> Result<Entry<T>, OpError> {
        let e = self
            .map
            .remove(&addr)
            .ok_or_else(|| OpError::NotFound(format!("no allocation starts at {addr:#x}")))?;
        self.used -= e.charged;
        Ok(e)
    }

    /// [`free`](Self::free), logged for `owner` at debug level.
    pub fn free_logged(
        &mut self,
        owner: PartitionName<'_>,
        addr: u64,
    ) -> Result<Entry<T>, OpError> {
        let e = self.free(addr)?;
        debug!(
            "{owner}: freed {} bytes at {addr:#x} ({} in use)",
            e.size, self.used
        );
        Ok(e)
    }

    /// The allocation that starts at `addr`.
    pub fn get(&self, addr: u64) -> Option<&Entry<T>> {
        self.map.get(&addr)
    }

    /// Removes the allocations `drop` says to, returning them.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&T) -> bool) -> Vec<Entry<T>> {
        let gone: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, e)| drop(&e.data))
            .map(|(&a, _)| a)
            .collect();
        gone.into_iter().filter_map(|a| self.free(a).ok()).collect()
    }

    /// Removes everything, returning what was there.
    pub fn drain(&mut self) -> Vec<Entry<T>> {
        self.used = 0;
        std::mem::take(&mut self.map).into_values().collect()
    }

    /// What is kept with the allocation starting at `start` (the start
    /// of a [`Loc`] this table resolved).
    ///
    /// # Panics
    /// If no allocation starts there.
    pub fn data(&self, start: u64) -> &T {
        &self.map[&start].data
    }

    /// The allocations, by address.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Entry<T>)> {
        self.map.iter().map(|(&a, e)| (a, e))
    }

    /// Resolves `len` bytes at `addr`, which must lie inside one
    /// allocation; `OutOfRange` otherwise.
    pub fn locate(&self, addr: u64, len: u64) -> Result<Loc, OpError> {
        let out = OpError::OutOfRange { addr, len };
        let (&start, e) = self.map.range(..=addr).next_back().ok_or(out.clone())?;
        let off = addr - start;
        if off > e.size || len > e.size - off {
            return Err(out);
        }
        Ok(Loc {
            start,
            off: off as usize,
            len: len as usize,
        })
    }

    /// `Ok` if `[addr, addr + len)` lies inside one allocation.
    pub fn check(&self, addr: u64, len: u64) -> Result<(), OpError> {
        self.locate(addr, len).map(drop)
    }
}

/// An address space that a backend lays out itself, from
/// [`ADDRESS_BASE`] to [`ADDRESS_END`], with [`GUARD_GAP`] unmapped bytes
/// after every allocation, so that running off the end of a buffer is
/// reported instead of landing in a neighbour. Freed addresses are not
/// handed out again at once: the search starts where the last allocation
/// ended and wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressSpace {
    /// Where the search for free address space starts.
    pub cursor: u64,
}

impl Default for AddressSpace {
    fn default() -> Self {
        AddressSpace {
            cursor: ADDRESS_BASE,
        }
    }
}

impl AddressSpace {
    /// A free, aligned address for `size` bytes among `table`'s
    /// allocations and the `reserved` ranges (first address and size:
    /// virtual memory reservations, which ordinary allocations keep out
    /// of), or `None` when the address space has no such room.
    pub fn place<T>(
        &self,
        table: &Allocations<T>,
        reserved: &BTreeMap<u64, u64>,
        size: u64,
        align: u64,
    ) -> Option<u64> {
        find_from(table, reserved, self.cursor, size, align)
            .or_else(|| find_from(table, reserved, ADDRESS_BASE, size, align))
    }

    /// Whether `size` bytes at `addr` are free (guard gaps included) and
    /// inside the address space.
    pub fn is_free<T>(
        table: &Allocations<T>,
        reserved: &BTreeMap<u64, u64>,
        addr: u64,
        size: u64,
    ) -> bool {
        addr >= ADDRESS_BASE
            && addr.checked_add(size).is_some_and(|end| end <= ADDRESS_END)
            && conflict(table, reserved, addr, size).is_none()
    }

    /// Notes that `size` bytes were allocated at `addr`.
    pub fn placed(&mut self, addr: u64, size: u64) {
        self.cursor = addr + size + GUARD_GAP;
    }

    /// Starts over, as for an empty table.
    pub fn reset(&mut self) {
        self.cursor = ADDRESS_BASE;
    }
}

/// The end of the last range of `starts` (first address to size) that
/// comes within [`GUARD_GAP`] of `[cand, cand + size)`, if any: ranges of
/// one map never overlap, so the last that starts before the candidate's
/// end (and gap) ends last.
fn last_conflict(
    mut starts: impl DoubleEndedIterator<Item = (u64, u64)>,
    cand: u64,
    size: u64,
) -> Option<u64> {
    let (start, len) = starts.next_back()?;
    let end = start.saturating_add(len).saturating_add(GUARD_GAP);
    (end > cand && start < cand.saturating_add(size).saturating_add(GUARD_GAP)).then_some(end)
}

/// Where the latest range that conflicts with `[cand, cand + size)` ends.
fn conflict<T>(
    table: &Allocations<T>,
    reserved: &BTreeMap<u64, u64>,
    cand: u64,
    size: u64,
) -> Option<u64> {
    let until = cand.saturating_add(size).saturating_add(GUARD_GAP);
    let a = last_conflict(
        table.map.range(..until).map(|(&a, e)| (a, e.size)),
        cand,
        size,
    );
    let r = last_conflict(reserved.range(..until).map(|(&a, &s)| (a, s)), cand, size);
    a.max(r)
}

/// The first free, aligned address at or after `from` with room for
/// `size` bytes and the guard gaps around them. Each step passes at
/// least one range, so the search ends.
fn find_from<T>(
    table: &Allocations<T>,
    reserved: &BTreeMap<u64, u64>,
    from: u64,
    size: u64,
    align: u64,
) -> Option<u64> {
    let mut cand = align_up(from, align)?;
    loop {
        if cand.checked_add(size)? > ADDRESS_END {
            return None;
        }
        match conflict(table, reserved, cand, size) {
            None => return Some(cand),
            Some(end) => cand = align_up(end, align)?,
        }
    }
}

/// Bytes of `n` 32-bit elements; `u64::MAX` (never in range) on overflow.
pub fn words(n: u64) -> u64 {
    n.saturating_mul(4)
}

/// Whether two ranges share a byte.
pub fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// An input that is exactly the output range is read element by element
/// before the element is written, which is safe; one that overlaps the
/// output otherwise must be copied first.
fn needs_copy(out: u64, input: u64, len: u64) -> bool {
    input != out && overlaps(out, len, input, len)
}

/// Reads a kernel parameter block of exactly `size_of::<T>()` bytes.
pub fn params<T: ByteValued + Default>(entry: &str, bytes: &[u8]) -> Result<T, OpError> {
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

/// What a backend needs of the float operands of built-in kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatOperands {
    /// Any address (the backend reads floats byte by byte).
    Unaligned,
    /// 4-byte aligned addresses (the backend's kernels load whole floats).
    Aligned,
}

fn aligned(rule: FloatOperands, entry: &str, what: &str, addr: u64) -> Result<(), OpError> {
    if rule == FloatOperands::Aligned && !addr.is_multiple_of(4) {
        return Err(OpError::Invalid(format!(
            "{entry}: {what} {addr:#x} is not 4-byte aligned"
        )));
    }
    Ok(())
}

/// A built-in kernel call whose ranges all lie inside the partition's
/// allocations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Builtin {
    /// `count` words at `dst` set to `value`; `dst` may be unaligned.
    Fill {
        /// First byte.
        dst: u64,
        /// Words.
        count: u64,
        /// The word.
        value: u32,
    },
    /// `bytes` from `src` to `dst`, which do not overlap.
    Copy {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Length.
        bytes: u64,
    },
    /// `c = a + b`; a `*_copy` input overlaps `c` partly (so it must be
    /// read as it was before the kernel started).
    Vadd {
        /// Output.
        c: u64,
        /// First input.
        a: u64,
        /// Second input.
        b: u64,
        /// Elements.
        n: u64,
        /// `a` overlaps `c` partly.
        a_copy: bool,
        /// `b` overlaps `c` partly.
        b_copy: bool,
    },
    /// `y = a * x + y`.
    Saxpy {
        /// Output and input.
        y: u64,
        /// Input.
        x: u64,
        /// Elements.
        n: u64,
        /// The scalar.
        a: f32,
        /// `x` overlaps `y` partly.
        x_copy: bool,
    },
    /// `C = alpha * A * B + beta * C` with `m, n, k > 0` and `alpha != 0`.
    Sgemm {
        /// The call's parameters.
        p: abi::SgemmParams,
        /// A overlaps C.
        a_copy: bool,
        /// B overlaps C.
        b_copy: bool,
    },
    /// `C = beta * C` (`beta == 0` clears C without reading it).
    Scale {
        /// C.
        c: u64,
        /// Elements of C.
        count: u64,
        /// The scalar.
        beta: f32,
    },
    /// `out = sum(input[..n])`.
    Reduce {
        /// One float.
        out: u64,
        /// Input.
        input: u64,
        /// Elements of the input.
        n: u64,
    },
    /// Nothing to do (an empty sgemm).
    Nothing,
}

/// [`plan_builtin`] for `launch`, a launch of the built-in module (its
/// shared memory is not the built-ins' concern).
pub fn plan_builtin_launch<T>(
    launch: &Launch<'_>,
    allocs: &Allocations<T>,
    floats: FloatOperands,
) -> Result<Builtin, OpError> {
    if launch.cluster != [1, 1, 1] || launch.cooperative {
        return Err(OpError::Invalid(format!(
            "{}: the built-in kernels run without clusters, not cooperatively",
            launch.entry
        )));
    }
    plan_builtin(
        launch.entry,
        launch.grid,
        launch.block,
        launch.params,
        allocs,
        floats,
    )
}

/// Validates a launch of the built-in module's `entry`: the entry exists,
/// the shape has no zero dimension, the parameter block has the right size
/// and every operand lies inside one allocation of `allocs` (and, with
/// [`FloatOperands::Aligned`], float operands are 4-byte aligned).
pub fn plan_builtin<T>(
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    raw: &[u8],
    allocs: &Allocations<T>,
    floats: FloatOperands,
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
    // Float operands `(name, address, bytes)`: all must be in range
    // before any is checked for alignment, so that an operand outside the
    // allocations is reported as such first.
    let float_operands = |ops: &[(&str, u64, u64)]| -> Result<(), OpError> {
        for &(_, addr, len) in ops {
            allocs.check(addr, len)?;
        }
        for &(what, addr, _) in ops {
            aligned(floats, entry, what, addr)?;
        }
        Ok(())
    };
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
            float_operands(&[("c", p.c, len), ("a", p.a, len), ("b", p.b, len)])?;
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
            float_operands(&[("y", p.y, len), ("x", p.x, len)])?;
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
            float_operands(&[("c", p.c, clen), ("a", p.a, alen), ("b", p.b, blen)])?;
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
            // Parallel kernels read rows of A and columns of B while
            // others write C: any overlap with C means reading a copy.
            Ok(Builtin::Sgemm {
                p,
                a_copy: overlaps(p.c, clen, p.a, alen),
                b_copy: overlaps(p.c, clen, p.b, blen),
            })
        }
        "reduce_sum_f32" => {
            let p: abi::ReduceSumParams = params(entry, raw)?;
            float_operands(&[("out", p.out, 4), ("input", p.input, words(p.n))])?;
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

/// Limits of a loaded kernel, as its backend reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelLimits {
    /// Bytes of its parameter list, if the backend could tell.
    pub param_bytes: Option<usize>,
    /// Most threads per block.
    pub max_threads: u32,
    /// Most dynamic shared memory per block, bytes.
    pub max_dynamic_shared: u32,
}

impl KernelLimits {
    /// The limits a kernel's [`FunctionInfo`] sets.
    pub fn of(info: &FunctionInfo) -> KernelLimits {
        KernelLimits {
            param_bytes: Some(info.attrs.params_size as usize),
            max_threads: info.attrs.max_threads,
            max_dynamic_shared: info.attrs.max_dynamic_shared,
        }
    }
}

/// The built-in module's `entry` as FUNC_INFO describes it: one
/// parameter, its parameter structure.
pub fn builtin_function_info(entry: &str) -> Result<FunctionInfo, OpError> {
    let size = match entry {
        "fill_u32" => std::mem::size_of::<abi::FillParams>(),
        "copy" => std::mem::size_of::<abi::CopyParams>(),
        "vadd_f32" => std::mem::size_of::<abi::VaddParams>(),
        "saxpy_f32" => std::mem::size_of::<abi::SaxpyParams>(),
        "sgemm_f32" => std::mem::size_of::<abi::SgemmParams>(),
        "reduce_sum_f32" => std::mem::size_of::<abi::ReduceSumParams>(),
        _ => {
            return Err(OpError::NotFound(format!(
                "entry point {entry:?} in the built-in module"
            )))
        }
    };
    Ok(FunctionInfo::new(
        [(0, size as u32)],
        abi::FuncInfo {
            max_threads: abi::MAX_BLOCK_THREADS,
            ..Default::default()
        },
    ))
}

/// Checks what a backend says of a kernel before it reaches a guest.
pub fn checked_function_info(entry: &str, info: FunctionInfo) -> Result<FunctionInfo, OpError> {
    if info.params.len() > abi::MAX_FUNC_PARAMS as usize {
        return Err(OpError::Unsupported(format!(
            "{entry}: {} parameters, more than {}",
            info.params.len(),
            abi::MAX_FUNC_PARAMS
        )));
    }
    Ok(info)
}

/// Most modules a partition keeps loaded at once.
pub const MAX_MODULES: usize = 64;

/// Checks a module image's size (every format) and returns it.
pub fn module_image(image: &[u8]) -> Result<&[u8], OpError> {
    if image.is_empty() {
        return Err(OpError::Invalid("empty module image".into()));
    }
    if image.len() as u64 > abi::MAX_MODULE_SIZE {
        return Err(OpError::Invalid(format!(
            "module image of {} bytes is larger than {}",
            image.len(),
            abi::MAX_MODULE_SIZE
        )));
    }
    Ok(image)
}

/// The fatbinary of a [`abi::MODULE_FORMAT_FATBIN`] image, whole: a
/// driver given only its address reads as far as its headers say, so
/// they must hold inside the image.
pub fn fatbin_image(image: &[u8]) -> Result<&[u8], OpError> {
    let image = module_image(image)?;
    let len =
        vgpu_ptx::fatbin_len(image).map_err(|e| OpError::Invalid(format!("fatbinary: {e}")))?;
    Ok(&image[..len])
}

/// The cubin of a [`abi::MODULE_FORMAT_CUBIN`] image, whole: its header
/// tables, sections and segments must lie inside the image, since the
/// driver reads as far as they say.
pub fn cubin_image(image: &[u8]) -> Result<&[u8], OpError> {
    let image = module_image(image)?;
    let len = vgpu_ptx::cubin_len(image).map_err(|e| OpError::Invalid(format!("cubin: {e}")))?;
    if len > image.len() {
        return Err(OpError::Invalid(format!(
            "cubin: its headers reach byte {len}, past the {}-byte image",
            image.len()
        )));
    }
    Ok(&image[..len])
}

/// The text of a [`abi::MODULE_FORMAT_PTX`] image: its bytes before any
/// trailing NULs, which must hold no other NUL (a driver reads the image
/// as a C string).
pub fn ptx_text(image: &[u8]) -> Result<&[u8], OpError> {
    let image = module_image(image)?;
    let text_len = image.len() - image.iter().rev().take_while(|&&b| b == 0).count();
    if let Some(at) = image[..text_len].iter().position(|&b| b == 0) {
        return Err(OpError::Invalid(format!(
            "PTX image has a NUL byte at offset {at}"
        )));
    }
    Ok(&image[..text_len])
}

/// Validates a launch of a loaded kernel against its limits.
pub fn check_module_launch(
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    params: &[u8],
    limits: &KernelLimits,
) -> Result<(), OpError> {
    check_module_shape(entry, grid, block, shared_mem, limits)?;
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

/// Validates the shape of a launch of a loaded kernel (not its
/// parameters) against its limits: what an occupancy query needs.
pub fn check_module_shape(
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
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
    Ok(())
}

#[cfg(test)]
mod tests;
