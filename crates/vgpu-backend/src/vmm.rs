//! Virtual memory management (ABI 1.6): the bookkeeping every backend
//! shares. A context reserves ranges of device addresses with nothing
//! behind them, makes physical allocations that have no address, maps
//! pieces of those into its reservations and then says what kernels and
//! copies may do there, as CUDA's `cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap` and `cuMemSetAccess` do on a GPU.
//!
//! [`Vmm`] checks each request against what the context holds (the
//! guest's values are hostile: sizes, alignments and counts are bounded,
//! ranges checked) and records it; the backend does the device's part
//! around it (host memory on the `software` backend, the driver's calls
//! on the `cuda` backend). Physical allocations charge the quota;
//! reservations charge nothing.

use std::collections::BTreeMap;

use vgpu_abi as abi;

use crate::OpError;

/// A virtual memory request, as the device decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmmOp {
    /// Reserve `size` bytes aligned to `align` (0: the granularity),
    /// at `addr` if that is free (0: anywhere). Result: the address.
    Reserve {
        /// Bytes.
        size: u64,
        /// Alignment.
        align: u64,
        /// Address wanted.
        addr: u64,
    },
    /// Free the reservation at `addr` of `size` bytes.
    Free {
        /// First address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// Make a physical allocation of `size` bytes. Result: its handle.
    Create {
        /// Bytes.
        size: u64,
    },
    /// Release a physical allocation (freed once nothing maps it).
    Release {
        /// Handle.
        handle: u64,
    },
    /// Map `size` bytes of `handle` from `offset` at `addr`.
    Map {
        /// Device address.
        addr: u64,
        /// Bytes.
        size: u64,
        /// Physical allocation.
        handle: u64,
        /// Offset in it.
        offset: u64,
    },
    /// Unmap the whole mappings of `[addr, addr + size)`.
    Unmap {
        /// Device address.
        addr: u64,
        /// Bytes.
        size: u64,
    },
    /// Give the mappings of `[addr, addr + size)` `access`.
    Access {
        /// Device address.
        addr: u64,
        /// Bytes.
        size: u64,
        /// `abi::MEM_ACCESS_*`.
        access: u32,
    },
}

/// One mapping of a physical allocation into a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Bytes.
    pub size: u64,
    /// The physical allocation.
    pub handle: u64,
    /// Offset in it.
    pub offset: u64,
    /// `abi::MEM_ACCESS_*`.
    pub access: u32,
}

/// A physical allocation and what the backend keeps with it.
#[derive(Debug)]
pub struct Physical<P> {
    /// Bytes.
    pub size: u64,
    /// Mappings of it.
    pub mappings: u64,
    /// Released: it goes when its last mapping does.
    pub released: bool,
    /// The backend's (host memory, a driver handle).
    pub data: P,
}

/// Checks `value` is a non-zero multiple of the granularity.
fn granular(what: &str, value: u64) -> Result<(), OpError> {
    if value == 0 || !value.is_multiple_of(abi::VMM_GRANULARITY) {
        return Err(OpError::Invalid(format!(
            "{what} {value:#x} is not a non-zero multiple of {:#x}",
            abi::VMM_GRANULARITY
        )));
    }
    Ok(())
}

/// The alignment a reservation asking for `align` gets.
pub fn reserve_align(size: u64, align: u64) -> Result<u64, OpError> {
    granular("reservation size", size)?;
    if size > abi::VMM_MAX_RESERVATION {
        return Err(OpError::Invalid(format!(
            "reservation of {size:#x} bytes: more than {:#x}",
            abi::VMM_MAX_RESERVATION
        )));
    }
    if align != 0 && (!align.is_power_of_two() || align > abi::VMM_MAX_ALIGN) {
        return Err(OpError::Invalid(format!(
            "reservation alignment {align:#x}: not a power of two up to {:#x}",
            abi::VMM_MAX_ALIGN
        )));
    }
    Ok(align.max(abi::VMM_GRANULARITY))
}

/// A context's reservations, physical allocations and mappings.
#[derive(Debug)]
pub struct Vmm<P> {
    /// Reservations by first address: their sizes.
    reservations: BTreeMap<u64, u64>,
    /// Mappings by first address.
    mappings: BTreeMap<u64, Mapping>,
    /// Physical allocations by handle.
    physical: BTreeMap<u64, Physical<P>>,
    /// The handle the next physical allocation gets.
    next_handle: u64,
    /// Bytes of the live physical allocations.
    physical_bytes: u64,
}

impl<P> Default for Vmm<P> {
    fn default() -> Self {
        Vmm {
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            physical: BTreeMap::new(),
            next_handle: 1,
            physical_bytes: 0,
        }
    }
}

impl<P> Vmm<P> {
    /// Bytes of physical allocations, charged to the quota.
    pub fn physical_bytes(&self) -> u64 {
        self.physical_bytes
    }

    /// The reservations: first address and size.
    pub fn reservations(&self) -> &BTreeMap<u64, u64> {
        &self.reservations
    }

    /// The mappings by first address.
    pub fn mappings(&self) -> &BTreeMap<u64, Mapping> {
        &self.mappings
    }

    /// The physical allocation `handle`.
    pub fn physical(&self, handle: u64) -> Option<&Physical<P>> {
        self.physical.get(&handle)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.physical.is_empty()
    }

    /// Checks a reservation of `size` bytes may be made; returns its
    /// alignment.
    pub fn check_reserve(&self, size: u64, align: u64) -> Result<u64, OpError> {
        let align = reserve_align(size, align)?;
        if self.reservations.len() as u64 >= abi::VMM_MAX_RESERVATIONS {
            return Err(OpError::NoMemory {
                requested: 0,
                available: 0,
            });
        }
        Ok(align)
    }

    /// Whether `[addr, addr + size)` shares a byte with a reservation.
    pub fn reserved_overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.reservations
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &s)| a + s > addr)
    }

    /// Records a reservation the backend placed.
    pub fn reserved(&mut self, addr: u64, size: u64) {
        self.reservations.insert(addr, size);
    }

    /// Frees the reservation at `addr` of `size` bytes: it must be one,
    /// with nothing mapped in it.
    pub fn free(&mut self, addr: u64, size: u64) -> Result<(), OpError> {
        match self.reservations.get(&addr) {
            Some(&s) if s == size => {}
            Some(&s) => {
                return Err(OpError::Invalid(format!(
                    "reservation at {addr:#x} is {s:#x} bytes, not {size:#x}"
                )))
            }
            None => {
                return Err(OpError::Invalid(format!(
                    "no reservation starts at {addr:#x}"
                )))
            }
        }
        if self.mappings.range(addr..addr + size).next().is_some() {
            return Err(OpError::Invalid(format!(
                "reservation at {addr:#x} still has mappings"
            )));
        }
        self.reservations.remove(&addr);
        Ok(())
    }

    /// Checks a physical allocation of `size` bytes fits `available`.
    pub fn check_create(&self, size: u64, available: u64) -> Result<(), OpError> {
        granular("physical allocation size", size)?;
        if size > available || self.physical.len() as u64 >= abi::VMM_MAX_OBJECTS {
            return Err(OpError::NoMemory {
                requested: size,
                available,
            });
        }
        Ok(())
    }

    /// Records a physical allocation; returns its handle.
    pub fn created(&mut self, size: u64, data: P) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.physical_bytes += size;
        self.physical.insert(
            handle,
            Physical {
                size,
                mappings: 0,
                released: false,
                data,
            },
        );
        handle
    }

    /// Releases `handle`; returns it if it is to be freed now (nothing
    /// maps it).
    pub fn release(&mut self, handle: u64) -> Result<Option<Physical<P>>, OpError> {
        let p = self
            .physical
            .get_mut(&handle)
            .filter(|p| !p.released)
            .ok_or_else(|| OpError::NotFound(format!("physical allocation {handle:#x}")))?;
        p.released = true;
        Ok(self.collect(handle))
    }

    /// Removes `handle` if it is released and unmapped.
    fn collect(&mut self, handle: u64) -> Option<Physical<P>> {
        let p = self.physical.get(&handle)?;
        if !p.released || p.mappings > 0 {
            return None;
        }
        let p = self.physical.remove(&handle)?;
        self.physical_bytes -= p.size;
        Some(p)
    }

    /// Checks a mapping of `size` bytes of `handle` from `offset` at
    /// `addr`: aligned, inside one reservation, nothing mapped there yet,
    /// inside the allocation.
    pub fn check_map(&self, addr: u64, size: u64, handle: u64, offset: u64) -> Result<(), OpError> {
        granular("mapping size", size)?;
        if !addr.is_multiple_of(abi::VMM_GRANULARITY)
            || !offset.is_multiple_of(abi::VMM_GRANULARITY)
        {
            return Err(OpError::Invalid(format!(
                "mapping at {addr:#x}, offset {offset:#x}: not multiples of {:#x}",
                abi::VMM_GRANULARITY
            )));
        }
        let p = self
            .physical
            .get(&handle)
            .filter(|p| !p.released)
            .ok_or_else(|| OpError::NotFound(format!("physical allocation {handle:#x}")))?;
        if offset.checked_add(size).is_none_or(|end| end > p.size) {
            return Err(OpError::Invalid(format!(
                "mapping {offset:#x}+{size:#x} of a {:#x}-byte allocation",
                p.size
            )));
        }
        let end = addr
            .checked_add(size)
            .ok_or_else(|| OpError::Invalid(format!("mapping at {addr:#x} wraps")))?;
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &s)| end <= a + s);
        if !inside {
            return Err(OpError::Invalid(format!(
                "{addr:#x}+{size:#x} is not inside one reservation"
            )));
        }
        let before = self.mappings.range(..end).next_back();
        if before.is_some_and(|(&a, m)| a + m.size > addr) {
            return Err(OpError::Invalid(format!(
                "{addr:#x}+{size:#x} is already mapped"
            )));
        }
        if self.mappings.len() as u64 >= abi::VMM_MAX_OBJECTS {
            return Err(OpError::NoMemory {
                requested: 0,
                available: 0,
            });
        }
        Ok(())
    }

    /// Records a mapping [`Vmm::check_map`] let through.
    pub fn mapped(&mut self, addr: u64, size: u64, handle: u64, offset: u64) {
        if let Some(p) = self.physical.get_mut(&handle) {
            p.mappings += 1;
        }
        self.mappings.insert(
            addr,
            Mapping {
                size,
                handle,
                offset,
                access: abi::MEM_ACCESS_NONE,
            },
        );
    }

    /// The first addresses of the whole mappings that make up `[addr,
    /// addr + size)`, every byte mapped; `Invalid` otherwise.
    pub fn whole_mappings(&self, addr: u64, size: u64) -> Result<Vec<u64>, OpError> {
        let bad = || OpError::Invalid(format!("{addr:#x}+{size:#x} is not made of whole mappings"));
        let end = addr
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(bad)?;
        let mut at = addr;
        let mut out = Vec::new();
        for (&a, m) in self.mappings.range(addr..end) {
            if a != at {
                return Err(bad());
            }
            at = a + m.size;
            out.push(a);
        }
        if at != end {
            return Err(bad());
        }
        Ok(out)
    }

    /// Unmaps the whole mappings of `[addr, addr + size)`; returns them
    /// (by first address) and the physical allocations to free now.
    #[allow(clippy::type_complexity)]
    pub fn unmap(
        &mut self,
        addr: u64,
        size: u64,
    ) -> Result<(Vec<(u64, Mapping)>, Vec<Physical<P>>), OpError> {
        let starts = self.whole_mappings(addr, size)?;
        let mut gone = Vec::with_capacity(starts.len());
        let mut freed = Vec::new();
        for a in starts {
            let Some(m) = self.mappings.remove(&a) else {
                continue;
            };
            if let Some(p) = self.physical.get_mut(&m.handle) {
                p.mappings -= 1;
            }
            freed.extend(self.collect(m.handle));
            gone.push((a, m));
        }
        Ok((gone, freed))
    }

    /// Checks `access` for the whole mappings of `[addr, addr + size)`;
    /// returns their first addresses.
    pub fn check_access(&self, addr: u64, size: u64, access: u32) -> Result<Vec<u64>, OpError> {
        if !matches!(
            access,
            abi::MEM_ACCESS_NONE | abi::MEM_ACCESS_READ | abi::MEM_ACCESS_READ_WRITE
        ) {
            return Err(OpError::Invalid(format!("access {access:#x}")));
        }
        self.whole_mappings(addr, size)
    }

    /// Sets the access of the mapping at `addr`.
    pub fn set_access(&mut self, addr: u64, access: u32) {
        if let Some(m) = self.mappings.get_mut(&addr) {
            m.access = access;
        }
    }

    /// Whether `len` bytes at `addr` lie in mappings side by side that
    /// the device may read (and, with `write`, write).
    pub fn accessible(&self, addr: u64, len: u64, write: bool) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let mut at = addr;
        // Bounded by the mappings: each step passes one.
        loop {
            let Some((start, m)) = self.mapping_at(at) else {
                return false;
            };
            let ok = match m.access {
                abi::MEM_ACCESS_READ_WRITE => true,
                abi::MEM_ACCESS_READ => !write,
                _ => false,
            };
            if !ok {
                return false;
            }
            at = start + m.size;
            if at >= end {
                return true;
            }
        }
    }

    /// The mapping that holds `addr`, with its first address.
    pub fn mapping_at(&self, addr: u64) -> Option<(u64, &Mapping)> {
        self.mappings
            .range(..=addr)
            .next_back()
            .filter(|(&a, m)| addr - a < m.size)
            .map(|(&a, m)| (a, m))
    }

    /// Forgets everything; returns the physical allocations (mappings
    /// first gone).
    pub fn drain(&mut self) -> Vec<Physical<P>> {
        self.reservations.clear();
        self.mappings.clear();
        self.physical_bytes = 0;
        std::mem::take(&mut self.physical).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = abi::VMM_GRANULARITY;

    fn table() -> (Vmm<()>, u64, u64) {
        let mut v = Vmm::default();
        v.check_reserve(8 * G, 0).unwrap();
        v.reserved(0x1000_0000_0000, 8 * G);
        v.check_create(2 * G, 4 * G).unwrap();
        let h = v.created(2 * G, ());
        (v, 0x1000_0000_0000, h)
    }

    #[test]
    fn test_reserve_checks_sizes_and_alignment() {
        let v: Vmm<()> = Vmm::default();
        assert_eq!(v.check_reserve(G, 0), Ok(G));
        assert_eq!(v.check_reserve(G, 1 << 30), Ok(1 << 30));
        assert_eq!(v.check_reserve(G, 4096), Ok(G));
        for (size, align) in [(0, 0), (G + 1, 0), (G, 3), (G, 1 << 41), (1 << 45, 0)] {
            assert!(
                matches!(v.check_reserve(size, align), Err(OpError::Invalid(_))),
                "{size:#x} {align:#x}"
            );
        }
    }

    #[test]
    fn test_physical_allocations_charge_until_released_and_unmapped() {
        let (mut v, base, h) = table();
        assert_eq!(v.physical_bytes(), 2 * G);
        assert!(matches!(
            v.check_create(4 * G, 2 * G),
            Err(OpError::NoMemory { .. })
        ));
        v.check_map(base, 2 * G, h, 0).unwrap();
        v.mapped(base, 2 * G, h, 0);
        // Released while mapped: still charged, no longer mappable.
        assert!(v.release(h).unwrap().is_none());
        assert_eq!(v.physical_bytes(), 2 * G);
        assert!(matches!(
            v.check_map(base + 4 * G, 2 * G, h, 0),
            Err(OpError::NotFound(_))
        ));
        assert!(matches!(v.release(h), Err(OpError::NotFound(_))));
        let (gone, freed) = v.unmap(base, 2 * G).unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(freed.len(), 1);
        assert_eq!(v.physical_bytes(), 0);
    }

    #[test]
    fn test_map_refuses_misaligned_overlapping_and_outside() {
        let (mut v, base, h) = table();
        let bad = |r: Result<(), OpError>| matches!(r, Err(OpError::Invalid(_)));
        assert!(bad(v.check_map(base + 4096, 2 * G, h, 0)));
        assert!(bad(v.check_map(base, G + 4096, h, 0)));
        assert!(bad(v.check_map(base, G, h, 4096)));
        assert!(bad(v.check_map(base, 2 * G, h, G)));
        assert!(bad(v.check_map(base + 7 * G, 2 * G, h, 0)));
        assert!(bad(v.check_map(0x10_0000_0000, G, h, 0)));
        assert!(matches!(
            v.check_map(base, G, 99, 0),
            Err(OpError::NotFound(_))
        ));
        v.check_map(base + 2 * G, 2 * G, h, 0).unwrap();
        v.mapped(base + 2 * G, 2 * G, h, 0);
        assert!(bad(v.check_map(base + 2 * G, G, h, 0)));
        assert!(bad(v.check_map(base + G, 2 * G, h, 0)));
        assert!(bad(v.check_map(base + 3 * G, 2 * G, h, 0)));
        // The same memory again, elsewhere in the reservation.
        v.check_map(base + 4 * G, 2 * G, h, 0).unwrap();
        v.check_map(base, 2 * G, h, 0).unwrap();
    }

    #[test]
    fn test_unmap_and_access_take_whole_mappings() {
        let (mut v, base, h) = table();
        v.mapped(base, G, h, 0);
        v.mapped(base + G, G, h, G);
        let bad = |r: Result<Vec<u64>, OpError>| matches!(r, Err(OpError::Invalid(_)));
        assert_eq!(v.whole_mappings(base, 2 * G).unwrap(), vec![base, base + G]);
        assert!(bad(v.whole_mappings(base, G / 2)));
        assert!(bad(v.whole_mappings(base, 3 * G)));
        assert!(bad(v.whole_mappings(base + 2 * G, G)));
        assert!(bad(v.check_access(base, 2 * G, 2)));
        assert!(!v.accessible(base, 2 * G, false));
        v.set_access(base, abi::MEM_ACCESS_READ_WRITE);
        v.set_access(base + G, abi::MEM_ACCESS_READ);
        assert!(v.accessible(base + G - 8, 16, false));
        assert!(!v.accessible(base + G - 8, 16, true));
        assert!(v.accessible(base, G, true));
        assert!(!v.accessible(base, 2 * G + 1, false));
        assert_eq!(
            v.check_access(base, 2 * G, abi::MEM_ACCESS_READ_WRITE)
                .unwrap()
                .len(),
            2
        );
        // Freeing the reservation waits for its mappings.
        assert!(matches!(v.free(base, 8 * G), Err(OpError::Invalid(_))));
        assert!(v.unmap(base + G, 2 * G).is_err());
        v.unmap(base, 2 * G).unwrap();
        assert!(v.unmap(base, G).is_err());
        assert!(matches!(v.free(base, 4 * G), Err(OpError::Invalid(_))));
        v.free(base, 8 * G).unwrap();
        assert!(v.free(base, 8 * G).is_err());
    }
}
