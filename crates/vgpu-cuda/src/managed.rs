//! Managed memory (`cudaMallocManaged`) on a device without concurrent
//! managed access, as CUDA defines it for such devices
//! (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` = 0): the host may
//! touch managed memory only while the device runs nothing.
//!
//! A managed allocation is a device allocation whose pages in the
//! process (reserved for it anyway, see [`crate::reserve`]) are ordinary
//! host memory at the same address, so one pointer serves both sides.
//! Which copy is current follows the device's work: the first
//! submission after the host had the memory uploads every managed
//! allocation of the device, and the wait that finds the device idle
//! downloads them again. That costs two copies of all managed memory per
//! round of work, and spares the program nothing it would not have to do
//! itself with explicit copies.

use std::collections::BTreeMap;

use vgpu_guest::{Batch, Device, Pending};

use crate::host_pages::PAGE;

/// Bytes of host memory one batch copies at most (the guest driver pins
/// up to 256 MiB per batch).
const BATCH_BYTES: u64 = 64 << 20;

/// Commands per batch at most (the guest driver takes 256).
const BATCH_CMDS: usize = 128;

/// The managed allocations of one device, and which copy is current.
#[derive(Debug, Default)]
pub struct Managed {
    /// Start → length, whole pages each.
    ranges: BTreeMap<u64, u64>,
    /// The device's copy is current: work was submitted since the host
    /// last had the memory.
    on_device: bool,
}

/// Which way a transfer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From host memory to the device.
    ToDevice,
    /// From the device to host memory.
    ToHost,
}

impl Managed {
    /// Records managed allocation `[addr, addr + len)` (whole pages, host
    /// memory of the process at the same address), current on the host.
    pub fn add(&mut self, addr: u64, len: u64) {
        debug_assert!(addr.is_multiple_of(PAGE as u64) && len.is_multiple_of(PAGE as u64));
        self.ranges.insert(addr, len);
    }

    /// Forgets the managed allocation at `addr`; its length, if it was one.
    pub fn remove(&mut self, addr: u64) -> Option<u64> {
        self.ranges.remove(&addr)
    }

    /// The managed allocation holding `[addr, addr + len)`, if any.
    pub fn holding(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let (&start, &n) = self.ranges.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= start + n).then_some((start, n))
    }

    /// Whether the process has no managed allocation.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the device's copy is the current one.
    pub fn on_device(&self) -> bool {
        self.on_device
    }

    /// The transfer needed before the device runs more work, if any: the
    /// host had the memory and there is some.
    pub fn before_device_work(&mut self) -> Option<Vec<Batch>> {
        if self.on_device || self.ranges.is_empty() {
            return None;
        }
        self.on_device = true;
        Some(self.batches(Way::ToDevice))
    }

    /// The transfer needed once the device is idle, if any: its copy was
    /// current.
    pub fn once_idle(&mut self) -> Option<Vec<Batch>> {
        if !std::mem::take(&mut self.on_device) || self.ranges.is_empty() {
            return None;
        }
        Some(self.batches(Way::ToHost))
    }

    /// Batches copying every managed allocation `way`, each whole.
    fn batches(&self, way: Way) -> Vec<Batch> {
        let mut out = Vec::new();
        let (mut b, mut bytes) = (Batch::new(), 0u64);
        for (&addr, &len) in &self.ranges {
            let mut off = 0;
            while off < len {
                let n = (len - off).min(BATCH_BYTES);
                if b.len() >= BATCH_CMDS || bytes + n > BATCH_BYTES {
                    out.push(std::mem::take(&mut b));
                    bytes = 0;
                }
                let at = addr + off;
                match way {
                    // SAFETY: `at .. at + n` is host memory of the process
                    // at the managed allocation's own address, mapped
                    // until the allocation is freed, which waits for the
                    // device's work (and so these batches) first.
                    Way::ToDevice => unsafe { b.copy_user_to_device_addr(at, at as *const u8, n) },
                    // SAFETY: as above; the program does not touch managed
                    // memory while the device works (the device reports
                    // no concurrent managed access).
                    Way::ToHost => unsafe { b.copy_device_addr_to_user(at as *mut u8, at, n) },
                };
                bytes += n;
                off += n;
            }
        }
        if !b.is_empty() {
            out.push(b);
        }
        out
    }
}

/// Submits `batches` in order; the pending ones, or the first failure
/// (those already submitted are returned with it, to be waited for).
pub fn submit_all(dev: &Device, batches: Vec<Batch>) -> (Vec<Pending>, Option<vgpu_guest::Error>) {
    let mut pending = Vec::with_capacity(batches.len());
    for b in batches {
        match dev.submit(b) {
            Ok(p) => pending.push(p),
            Err(e) => return (pending, Some(e)),
        }
    }
    (pending, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE as u64;

    #[test]
    fn ownership_moves_with_device_work() {
        let mut m = Managed::default();
        // Nothing managed: no transfers, whatever runs.
        assert!(m.before_device_work().is_none());
        assert!(m.once_idle().is_none());
        m.add(0x10_0000, 2 * P);
        assert!(!m.on_device());
        let up = m.before_device_work().expect("an upload");
        assert_eq!(up.len(), 1);
        assert_eq!(up[0].len(), 1);
        assert!(m.on_device());
        // Once uploaded, more work needs nothing more.
        assert!(m.before_device_work().is_none());
        let down = m.once_idle().expect("a download");
        assert_eq!(down[0].len(), 1);
        assert!(!m.on_device());
        // Idle again without work in between: nothing to fetch.
        assert!(m.once_idle().is_none());
    }

    #[test]
    fn large_allocations_split_into_bounded_batches() {
        let mut m = Managed::default();
        m.add(0x1000_0000, 200 << 20);
        let up = m.before_device_work().unwrap();
        // 200 MiB in batches of at most 64 MiB.
        assert_eq!(up.len(), 4);
        let mut many = Managed::default();
        for i in 0..300 {
            many.add(0x1000_0000 + i * 2 * P, P);
        }
        let up = many.before_device_work().unwrap();
        assert!(up.iter().all(|b| b.len() <= BATCH_CMDS));
        assert_eq!(up.iter().map(|b| b.len()).sum::<usize>(), 300);
    }

    #[test]
    fn holding_finds_the_allocation_around_a_range() {
        let mut m = Managed::default();
        m.add(0x10_0000, 2 * P);
        m.add(0x20_0000, P);
        assert_eq!(m.holding(0x10_0000, 1), Some((0x10_0000, 2 * P)));
        assert_eq!(m.holding(0x10_0000 + P, P), Some((0x10_0000, 2 * P)));
        assert_eq!(m.holding(0x10_0000 + P, P + 1), None);
        assert_eq!(m.holding(0xf_ffff, 2), None);
        assert_eq!(m.holding(u64::MAX, 2), None);
        assert_eq!(m.remove(0x10_0000), Some(2 * P));
        assert_eq!(m.holding(0x10_0000, 1), None);
    }
}
