//! Memory a program holds: device allocations (module globals among
//! them) and host memory allocated or registered, each by start address:
//! the tables of them that [`crate::objects::Objects`] holds.

use std::collections::{BTreeMap, HashSet};

use crate::cu::CUdevice;
use crate::diag::log;
use crate::reserve::Reservations;

/// Device memory a program allocated.
pub struct Alloc {
    /// Its size in bytes.
    pub size: u64,
    /// The device it is memory of.
    pub device: CUdevice,
    /// The context it was allocated in.
    pub ctx: usize,
    /// The module whose global this is (copies reach it, `cuMemFree`
    /// does not free it, it goes with its module); `None` for memory of
    /// `cuMemAlloc`.
    pub module: Option<usize>,
    /// Managed memory (`cuMemAllocManaged`): host memory of the process
    /// at the same address too (see [`crate::managed`]).
    pub managed: bool,
    /// A mapping of a physical allocation (`cuMemMap`, [`crate::vmm`]):
    /// `cuMemFree` does not free it, and its pages are held by its
    /// reservation, not by it.
    pub mapping: Option<Mapping>,
}

/// What a mapping ([`Alloc::mapping`]) maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// The physical allocation's handle (`CUmemGenericAllocationHandle`).
    pub handle: u64,
    /// Where in it the mapping starts.
    pub offset: u64,
    /// `CU_MEM_ACCESS_FLAGS_PROT_*` of its device.
    pub access: u32,
}

/// Host memory from `cuMemHostAlloc`/`cuMemAllocHost`, or registered.
pub struct HostMem {
    /// Its size in bytes.
    pub size: usize,
    /// The context it was allocated or registered in.
    pub ctx: usize,
    /// Allocated here (freed by `cuMemFreeHost`), or the caller's
    /// (registered with `cuMemHostRegister`).
    pub owned: bool,
    /// The whole pages of it pinned for copies by this device's kernel
    /// driver (VGPU_IOCTL_PIN): (device, first page).
    pub pinned: Option<(CUdevice, usize)>,
    /// The flags it was allocated or registered with (`cuMemHostGetFlags`).
    pub flags: u32,
}

/// The device memory of the process: allocations and module globals by
/// start address, and the pages of them held in this process's address
/// space.
#[derive(Default)]
pub struct Allocs {
    /// Device allocations by start address.
    allocs: BTreeMap<u64, Alloc>,
    /// The pages of device allocations, held in this process's address
    /// space so no host memory of it ever shares an address with them.
    reserved: Reservations,
    /// Module globals whose pages `reserved` holds.
    globals_reserved: HashSet<u64>,
}

impl Allocs {
    /// Holds the pages of `[addr, addr + len)` in this process's address
    /// space; false where host memory of the process is there.
    pub fn reserve(&mut self, addr: u64, len: u64) -> bool {
        self.reserved.reserve(addr, len).is_ok()
    }

    /// Makes the held pages of `[addr, addr + len)` host memory too (for
    /// managed memory); false where the process cannot map them.
    pub fn make_host_memory(&mut self, addr: u64, len: u64) -> bool {
        self.reserved.make_host_memory(addr, len)
    }

    /// Lets go of the pages held for `[addr, addr + len)`.
    pub fn release(&mut self, addr: u64, len: u64) {
        self.reserved.release(addr, len);
    }

    /// Files the allocation `a` starting at `addr`.
    pub fn insert(&mut self, addr: u64, a: Alloc) {
        self.allocs.insert(addr, a);
    }

    /// Forgets the allocation starting at `addr`, letting go of its
    /// pages.
    pub fn free(&mut self, addr: u64) {
        if let Some(a) = self.allocs.remove(&addr) {
            self.reserved.release(addr, a.size);
        }
    }

    /// Files global `addr` (`size` bytes) of `module` among the device
    /// allocations: copies and pointer queries reach it, `cuMemFree`
    /// does not ([`Allocs::freeable`]), and it goes with its module.
    pub fn add_global(
        &mut self,
        module: usize,
        addr: u64,
        size: u64,
        device: CUdevice,
        ctx: usize,
    ) {
        if size > 0 {
            let a = Alloc {
                size,
                device,
                ctx,
                module: Some(module),
                managed: false,
                mapping: None,
            };
            // Its place in the module is the device's: held like an
            // allocation's where it can be (once, however often it is
            // asked for), and said where host memory of this process is
            // there already.
            if !self.globals_reserved.contains(&addr) {
                if self.reserved.reserve(addr, size).is_ok() {
                    self.globals_reserved.insert(addr);
                } else {
                    log(&format!(
                        "global at {addr:#x} ({size} bytes) lies over host memory of this process"
                    ));
                }
            }
            self.allocs.insert(addr, a);
        }
    }

    /// Forgets the globals of `module`, letting go of the pages held for
    /// them.
    pub fn forget_globals_of(&mut self, module: usize) {
        let (reserved, globals) = (&mut self.reserved, &mut self.globals_reserved);
        self.allocs.retain(|&addr, a| {
            let keep = a.module != Some(module);
            if !keep && globals.remove(&addr) {
                reserved.release(addr, a.size);
            }
            keep
        });
    }

    /// The device of the `cuMemAlloc` memory starting at `addr`, which
    /// `cuMemFree` may free (not a module's global).
    pub fn freeable(&self, addr: u64) -> Option<CUdevice> {
        self.allocs
            .get(&addr)
            .filter(|a| a.module.is_none() && a.mapping.is_none())
            .map(|a| a.device)
    }

    /// The allocation containing `[addr, addr + len)`. Mappings side by
    /// side (of one device) are one range to copies and kernels, as on a
    /// GPU: a range that starts in a mapping may run on through the
    /// mappings that follow it; the first is returned.
    pub fn alloc_at(&self, addr: u64, len: u64) -> Option<(u64, &Alloc)> {
        let (&start, a) = self.allocs.range(..=addr).next_back()?;
        let end = start.checked_add(a.size)?;
        if addr >= end.max(start + 1) {
            return None;
        }
        let want = addr.checked_add(len)?;
        if want <= end {
            return Some((start, a));
        }
        a.mapping?;
        let mut at = end;
        for (&s, b) in self.allocs.range(end..) {
            if s != at || b.mapping.is_none() || b.device != a.device {
                return None;
            }
            at = s.checked_add(b.size)?;
            if want <= at {
                return Some((start, a));
            }
        }
        None
    }

    /// Files mapping `a` at `addr`, whose pages its reservation holds.
    pub fn map(&mut self, addr: u64, a: Alloc) {
        self.allocs.insert(addr, a);
    }

    /// Forgets the mapping at `addr` (its pages stay its reservation's).
    pub fn unmap(&mut self, addr: u64) -> Option<Alloc> {
        match self.allocs.get(&addr) {
            Some(a) if a.mapping.is_some() => self.allocs.remove(&addr),
            _ => None,
        }
    }

    /// The mapping at `addr`, to change its access.
    pub fn mapping_mut(&mut self, addr: u64) -> Option<&mut Alloc> {
        self.allocs.get_mut(&addr).filter(|a| a.mapping.is_some())
    }

    /// The first addresses of the whole mappings `[addr, addr + len)` is
    /// made of, every byte mapped; `None` otherwise.
    pub fn whole_mappings(&self, addr: u64, len: u64) -> Option<Vec<u64>> {
        let end = addr.checked_add(len).filter(|_| len > 0)?;
        let mut at = addr;
        let mut out = Vec::new();
        for (&s, a) in self.allocs.range(addr..end) {
            if s != at || a.mapping.is_none() {
                return None;
            }
            at = s.checked_add(a.size)?;
            out.push(s);
        }
        (at == end).then_some(out)
    }

    /// Whether anything of the table overlaps `[addr, addr + len)`.
    pub fn overlaps(&self, addr: u64, len: u64) -> bool {
        self.allocations_end(addr, len).is_some()
    }

    /// The end of the last device allocation that overlaps `[addr, addr +
    /// len)`, if one does.
    pub fn allocations_end(&self, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        // Allocations do not overlap one another: the last one to start
        // before `end` ends last.
        let (&start, a) = self.allocs.range(..end).next_back()?;
        let last = start.saturating_add(a.size);
        (last > addr).then_some(last)
    }
}

/// Host memory allocated or registered, by start address.
#[derive(Default)]
pub struct HostAllocs {
    host: BTreeMap<usize, HostMem>,
}

impl HostAllocs {
    /// Files host memory `h` starting at `p`.
    pub fn insert(&mut self, p: usize, h: HostMem) {
        self.host.insert(p, h);
    }

    /// The host memory starting at `p`, to change.
    pub fn get_mut(&mut self, p: usize) -> Option<&mut HostMem> {
        self.host.get_mut(&p)
    }

    /// Takes the host memory starting at `p` out of the table if it is
    /// `owned` (allocated here) or, for `owned` false, registered.
    pub fn remove_if_owned(&mut self, p: usize, owned: bool) -> Option<HostMem> {
        match self.host.get(&p) {
            Some(h) if h.owned == owned => self.host.remove(&p),
            _ => None,
        }
    }

    /// The host allocation containing `[p, p + len)`.
    pub fn host_at(&self, p: usize, len: usize) -> Option<(usize, &HostMem)> {
        let (&start, h) = self.host.range(..=p).next_back()?;
        (p.checked_add(len)? <= start + h.size && p < start + h.size.max(1)).then_some((start, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_the_allocations_in_the_way() {
        let mut o = Allocs::default();
        for (start, size) in [(0x1000, 0x1000), (0x3000, 0x2000)] {
            let a = Alloc {
                size,
                device: 0,
                ctx: 0,
                module: None,
                managed: false,
                mapping: None,
            };
            o.insert(start, a);
        }
        // Over the first, over both, in the gap, past both.
        assert_eq!(o.allocations_end(0x1800, 0x10), Some(0x2000));
        assert_eq!(o.allocations_end(0x1800, 0x2000), Some(0x5000));
        assert_eq!(o.allocations_end(0x2000, 0x800), None);
        assert_eq!(o.allocations_end(0x5000, 0x1000), None);
        assert_eq!(o.allocations_end(0x2800, 0x1000), Some(0x5000));
    }

    #[test]
    fn allocation_lookup_needs_the_whole_range_inside_one_allocation() {
        let mut o = Allocs::default();
        for (a, s) in [(0x1000u64, 0x100u64), (0x2000, 0x10)] {
            o.insert(
                a,
                Alloc {
                    size: s,
                    device: 0,
                    ctx: 1,
                    module: None,
                    managed: false,
                    mapping: None,
                },
            );
        }
        assert_eq!(o.alloc_at(0x1000, 0x100).map(|a| a.0), Some(0x1000));
        assert_eq!(o.alloc_at(0x10ff, 1).map(|a| a.0), Some(0x1000));
        assert!(o.alloc_at(0x10ff, 2).is_none());
        assert!(o.alloc_at(0x1100, 1).is_none());
        assert!(o.alloc_at(0xfff, 1).is_none());
        assert!(o.alloc_at(u64::MAX, 2).is_none());
        assert_eq!(o.alloc_at(0x2008, 0).map(|a| a.0), Some(0x2000));
    }

    fn mapping(size: u64, device: CUdevice, handle: u64) -> Alloc {
        Alloc {
            size,
            device,
            ctx: 1,
            module: None,
            managed: false,
            mapping: Some(Mapping {
                handle,
                offset: 0,
                access: 3,
            }),
        }
    }

    #[test]
    fn mappings_side_by_side_are_one_range_but_never_freeable() {
        let mb2 = 2u64 << 20;
        let mut o = Allocs::default();
        o.map(0x4000_0000, mapping(mb2, 0, 1));
        o.map(0x4000_0000 + mb2, mapping(2 * mb2, 0, 2));
        // A gap, then another mapping.
        o.map(0x4000_0000 + 4 * mb2, mapping(mb2, 0, 3));
        // Across the first boundary: found, as the first mapping.
        assert_eq!(
            o.alloc_at(0x4000_0000 + mb2 - 16, 32).map(|a| a.0),
            Some(0x4000_0000)
        );
        assert!(o.alloc_at(0x4000_0000, 3 * mb2).is_some());
        // Into the gap: not.
        assert!(o.alloc_at(0x4000_0000, 3 * mb2 + 1).is_none());
        assert_eq!(o.freeable(0x4000_0000), None);
        // Whole mappings only, every byte mapped.
        assert_eq!(
            o.whole_mappings(0x4000_0000, 3 * mb2),
            Some(vec![0x4000_0000, 0x4000_0000 + mb2])
        );
        assert_eq!(o.whole_mappings(0x4000_0000, 2 * mb2), None);
        assert_eq!(o.whole_mappings(0x4000_0000, 5 * mb2), None);
        assert_eq!(o.whole_mappings(0x4000_0000 + mb2, 0), None);
        assert!(o.overlaps(0x4000_0000 + 3 * mb2 - 1, 1));
        assert!(!o.overlaps(0x4000_0000 + 3 * mb2, mb2));
        // An ordinary allocation after a mapping does not extend it.
        o.insert(0x4000_0000 + 5 * mb2, {
            let mut a = mapping(mb2, 0, 0);
            a.mapping = None;
            a
        });
        assert!(o.alloc_at(0x4000_0000 + 4 * mb2, 2 * mb2).is_none());
        assert!(o.unmap(0x4000_0000 + 5 * mb2).is_none(), "not a mapping");
        assert_eq!(
            o.unmap(0x4000_0000)
                .and_then(|a| a.mapping)
                .map(|m| m.handle),
            Some(1)
        );
        assert!(o.alloc_at(0x4000_0000, 1).is_none());
        // Another device's mapping side by side is not the same range.
        o.map(0x4000_0000, mapping(mb2, 1, 4));
        assert!(o.alloc_at(0x4000_0000, mb2 + 1).is_none());
    }
}
