//! Device (global) memory as the executor sees it.

use std::sync::atomic::{AtomicU64, Ordering};

/// An access the memory refused: nothing is mapped at `addr..addr+len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no device memory at {addr:#x}+{len}")]
pub struct Fault {
    /// Start of the access.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// What an atomic operation does.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomKind {
    Add,
    Min,
    Max,
    Exch,
    Cas,
    And,
    Or,
    Xor,
    /// `old >= b ? 0 : old + 1`, unsigned 32-bit.
    Inc,
    /// `old == 0 || old > b ? b : old - 1`, unsigned 32-bit.
    Dec,
}

/// The operand type of an atomic operation.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomTy {
    U32,
    S32,
    U64,
    S64,
    F32,
    F64,
    /// Two halves (`atom.add.noftz.f16x2`), each added and rounded alone.
    F16x2,
    /// Two bfloat16 values (`atom.add.noftz.bf16x2`).
    Bf16x2,
}

/// An atomic read-modify-write: the operation and its operand type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicOp {
    /// The operation.
    pub kind: AtomKind,
    /// The operand type (also gives the size: 4 or 8 bytes).
    pub ty: AtomTy,
}

impl AtomicOp {
    /// Bytes accessed.
    pub fn size(self) -> usize {
        match self.ty {
            AtomTy::U32 | AtomTy::S32 | AtomTy::F32 | AtomTy::F16x2 | AtomTy::Bf16x2 => 4,
            _ => 8,
        }
    }

    /// The new value from the old one, the operand `b` and (for `Cas`)
    /// the value `c` to store when `old == b`. Values are the raw bits,
    /// in the low 32 bits for 4-byte types.
    pub fn apply(self, old: u64, b: u64, c: u64) -> u64 {
        use AtomKind as K;
        let m = if self.size() == 4 {
            0xffff_ffff
        } else {
            u64::MAX
        };
        let (old, b, c) = (old & m, b & m, c & m);
        let r = match (self.kind, self.ty) {
            (K::Add, AtomTy::F32) => {
                (f32::from_bits(old as u32) + f32::from_bits(b as u32)).to_bits() as u64
            }
            (K::Add, AtomTy::F64) => (f64::from_bits(old) + f64::from_bits(b)).to_bits(),
            (K::Add, AtomTy::F16x2 | AtomTy::Bf16x2) => {
                let ty = if self.ty == AtomTy::F16x2 {
                    crate::half::Half::F16
                } else {
                    crate::half::Half::Bf16
                };
                let add = |k: u32| {
                    let h = |x: u64| (x >> (16 * k)) as u16;
                    let r = crate::half::half_arith(
                        crate::half::HalfOp::Add,
                        ty,
                        false,
                        false,
                        false,
                        h(old),
                        h(b),
                        0,
                    );
                    (r as u64) << (16 * k)
                };
                add(0) | add(1)
            }
            (K::Add, _) => old.wrapping_add(b),
            (K::Min | K::Max, AtomTy::S32) => {
                let (x, y) = (old as u32 as i32, b as u32 as i32);
                (if self.kind == K::Min {
                    x.min(y)
                } else {
                    x.max(y)
                }) as u32 as u64
            }
            (K::Min | K::Max, AtomTy::S64) => {
                let (x, y) = (old as i64, b as i64);
                (if self.kind == K::Min {
                    x.min(y)
                } else {
                    x.max(y)
                }) as u64
            }
            (K::Min | K::Max, AtomTy::F32) => {
                let (x, y) = (f32::from_bits(old as u32), f32::from_bits(b as u32));
                (if self.kind == K::Min {
                    x.min(y)
                } else {
                    x.max(y)
                })
                .to_bits() as u64
            }
            (K::Min | K::Max, AtomTy::F64) => {
                let (x, y) = (f64::from_bits(old), f64::from_bits(b));
                (if self.kind == K::Min {
                    x.min(y)
                } else {
                    x.max(y)
                })
                .to_bits()
            }
            (K::Min, _) => old.min(b),
            (K::Max, _) => old.max(b),
            (K::Exch, _) => b,
            (K::Cas, _) => {
                if old == b {
                    c
                } else {
                    old
                }
            }
            (K::And, _) => old & b,
            (K::Or, _) => old | b,
            (K::Xor, _) => old ^ b,
            (K::Inc, _) => {
                if old >= b {
                    0
                } else {
                    old + 1
                }
            }
            (K::Dec, _) => {
                if old == 0 || old > b {
                    b
                } else {
                    old - 1
                }
            }
        };
        r & m
    }
}

/// Device memory a launch reads and writes. The implementation decides
/// what is mapped (the backend checks every access against the tenant's
/// allocations); the executor calls it from several threads at once.
pub trait GlobalMemory: Sync {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Writes `buf` at `addr`.
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Fault>;
    /// Atomically replaces the value at `addr` by
    /// `op.apply(old, b, c)` and returns `old`.
    fn atomic(&self, addr: u64, op: AtomicOp, b: u64, c: u64) -> Result<u64, Fault>;
}

/// A flat buffer of device memory at a base address, safe to share
/// between threads: bytes live in 64-bit atomic words (relaxed atomics
/// cost what plain accesses do on x86 and keep racy kernels defined).
#[derive(Debug)]
pub struct VecMemory {
    base: u64,
    len: u64,
    words: Vec<AtomicU64>,
}

impl VecMemory {
    /// `len` zero bytes at `base`.
    pub fn new(base: u64, len: usize) -> VecMemory {
        VecMemory {
            base,
            len: len as u64,
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A buffer at `base` holding `bytes`.
    pub fn from_bytes(base: u64, bytes: &[u8]) -> VecMemory {
        let m = VecMemory::new(base, bytes.len());
        // In range by construction.
        let _ = m.write(base, bytes);
        m
    }

    /// The base address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of all bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len as usize];
        let _ = self.read(self.base, &mut v);
        v
    }

    /// The buffer as a [`WordMemory`].
    pub fn view(&self) -> WordMemory<'_> {
        WordMemory {
            base: self.base,
            len: self.len,
            words: &self.words,
        }
    }
}

impl GlobalMemory for VecMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.view().read(addr, buf)
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Fault> {
        self.view().write(addr, buf)
    }

    fn atomic(&self, addr: u64, op: AtomicOp, b: u64, c: u64) -> Result<u64, Fault> {
        self.view().atomic(addr, op, b, c)
    }
}

/// Device memory held in 64-bit atomic words, borrowed: one allocation
/// as a backend lends it to a launch. Bytes are little-endian within a
/// word; relaxed atomics keep racy kernels defined, and partial-word
/// stores keep the neighbouring bytes other threads write.
#[derive(Debug, Clone, Copy)]
pub struct WordMemory<'a> {
    base: u64,
    len: u64,
    words: &'a [AtomicU64],
}

impl<'a> WordMemory<'a> {
    /// `len` bytes at `base` kept in `words`; `None` when `words` holds
    /// fewer than `len` bytes.
    pub fn new(base: u64, len: u64, words: &'a [AtomicU64]) -> Option<Self> {
        (len <= (words.len() as u64).saturating_mul(8)).then_some(WordMemory { base, len, words })
    }

    /// The first address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn offset(&self, addr: u64, len: usize) -> Result<usize, Fault> {
        let fault = Fault {
            addr,
            len: len as u64,
        };
        let off = addr.checked_sub(self.base).ok_or(fault)?;
        if off.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(fault);
        }
        Ok(off as usize)
    }

    fn load_word(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }
}

impl GlobalMemory for WordMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let off = self.offset(addr, buf.len())?;
        if buf.len() == 4 && off % 4 == 0 {
            let w = self.load_word(off / 8) >> ((off % 8) * 8);
            buf.copy_from_slice(&(w as u32).to_le_bytes());
            return Ok(());
        }
        if buf.len() == 8 && off % 8 == 0 {
            buf.copy_from_slice(&self.load_word(off / 8).to_le_bytes());
            return Ok(());
        }
        for (k, b) in buf.iter_mut().enumerate() {
            let o = off + k;
            *b = (self.load_word(o / 8) >> ((o % 8) * 8)) as u8;
        }
        Ok(())
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Fault> {
        let off = self.offset(addr, buf.len())?;
        if buf.len() == 8 && off % 8 == 0 {
            let mut w = [0u8; 8];
            w.copy_from_slice(buf);
            self.words[off / 8].store(u64::from_le_bytes(w), Ordering::Relaxed);
            return Ok(());
        }
        // Bytes of one word at a time; a CAS keeps the neighbours'.
        let mut k = 0;
        while k < buf.len() {
            let o = off + k;
            let wi = o / 8;
            let first = o % 8;
            let n = (8 - first).min(buf.len() - k);
            let mut mask = 0u64;
            let mut val = 0u64;
            for j in 0..n {
                mask |= 0xff << ((first + j) * 8);
                val |= (buf[k + j] as u64) << ((first + j) * 8);
            }
            let _ = self.words[wi].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some((w & !mask) | val)
            });
            k += n;
        }
        Ok(())
    }

    fn atomic(&self, addr: u64, op: AtomicOp, b: u64, c: u64) -> Result<u64, Fault> {
        let size = op.size();
        let off = self.offset(addr, size)?;
        if off % size != 0 {
            return Err(Fault {
                addr,
                len: size as u64,
            });
        }
        let shift = (off % 8) * 8;
        let mask = if size == 8 {
            u64::MAX
        } else {
            0xffff_ffffu64 << shift
        };
        let mut old = 0;
        let _ = self.words[off / 8].fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            old = (w & mask) >> shift;
            let new = op.apply(old, b, c);
            Some((w & !mask) | ((new << shift) & mask))
        });
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_memory_bounds_and_bytes() {
        let m = VecMemory::new(0x1000, 13);
        m.write(0x1003, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
        let mut b = [0u8; 9];
        m.read(0x1002, &mut b).unwrap();
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7, 0]);
        assert_eq!(
            m.read(0x1000, &mut [0u8; 14]),
            Err(Fault {
                addr: 0x1000,
                len: 14
            })
        );
        assert!(m.read(0xfff, &mut [0u8; 1]).is_err());
        assert!(m.write(0x100d, &[0]).is_err());
        assert!(m.read(u64::MAX, &mut [0u8; 2]).is_err());
    }

    #[test]
    fn atomic_ops() {
        let op = |kind, ty| AtomicOp { kind, ty };
        assert_eq!(op(AtomKind::Inc, AtomTy::U32).apply(5, 5, 0), 0);
        assert_eq!(op(AtomKind::Inc, AtomTy::U32).apply(4, 5, 0), 5);
        assert_eq!(op(AtomKind::Dec, AtomTy::U32).apply(0, 7, 0), 7);
        assert_eq!(op(AtomKind::Dec, AtomTy::U32).apply(9, 7, 0), 7);
        assert_eq!(op(AtomKind::Dec, AtomTy::U32).apply(3, 7, 0), 2);
        assert_eq!(
            op(AtomKind::Min, AtomTy::S32).apply(0xffff_ffff, 3, 0),
            0xffff_ffff
        );
        assert_eq!(op(AtomKind::Min, AtomTy::U32).apply(0xffff_ffff, 3, 0), 3);
        assert_eq!(op(AtomKind::Cas, AtomTy::U64).apply(4, 4, 9), 9);
        assert_eq!(op(AtomKind::Cas, AtomTy::U64).apply(4, 5, 9), 4);
        assert_eq!(op(AtomKind::Add, AtomTy::U32).apply(0xffff_ffff, 2, 0), 1);
        let f = op(AtomKind::Add, AtomTy::F32).apply(
            1.5f32.to_bits() as u64,
            2.25f32.to_bits() as u64,
            0,
        );
        assert_eq!(f32::from_bits(f as u32), 3.75);
        let m = VecMemory::new(0, 16);
        m.write(4, &7u32.to_le_bytes()).unwrap();
        assert_eq!(m.atomic(4, op(AtomKind::Add, AtomTy::U32), 1, 0), Ok(7));
        let mut b = [0u8; 8];
        m.read(0, &mut b).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 8, 0, 0, 0]);
        assert!(m.atomic(2, op(AtomKind::Add, AtomTy::U32), 1, 0).is_err());
    }
}
