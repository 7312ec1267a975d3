//! Device addresses held in the process's own address space.
//!
//! Unified addressing (`cudaMemcpyDefault`, `cuPointerGetAttributes`)
//! tells host memory from device memory by the address alone, so a device
//! allocation must never share addresses with host memory of the
//! process. The device hands out its addresses without knowing the
//! process's mappings; each allocation's pages are therefore reserved
//! here (inaccessible, no memory behind them), so no later host mapping
//! can land there, and an allocation whose pages a host mapping already
//! holds is detected and not used.

use std::collections::BTreeMap;
use std::ffi::c_void;

use crate::host_pages::PAGE;

/// A page of the allocation is already host memory of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collision;

/// A page two allocations may share (one's last, the next one's first):
/// how many use it, and whether this module mapped it (pages the process
/// cannot map, past its address space, need no reservation).
#[derive(Debug, Clone, Copy)]
struct Shared {
    users: u32,
    mapped: bool,
}

/// The pages reserved for device allocations: the whole pages of each
/// (one run, its own), and the pages at their ends, which neighbours may
/// share. Two entries per allocation at most, whatever its size.
#[derive(Debug, Default)]
pub struct Reservations {
    /// First page of a run of whole pages → (its length, whether mapped).
    whole: BTreeMap<u64, (u64, bool)>,
    /// Page address → its users.
    shared: BTreeMap<u64, Shared>,
}

/// How `[addr, addr + len)` covers pages: the run of pages it covers
/// whole (start, end; empty when start == end) and the pages it covers in
/// part (none, one or two).
fn layout(addr: u64, len: u64) -> Option<((u64, u64), Vec<u64>)> {
    let page = PAGE as u64;
    let end = addr.checked_add(len.max(1))?;
    let down = |x: u64| x & !(page - 1);
    let up = |x: u64| x.checked_add(page - 1).map(down);
    let (ws, we) = (up(addr)?, down(end));
    let mut partial = Vec::with_capacity(2);
    if ws > we {
        // Inside one page.
        partial.push(down(addr));
        return Some(((ws, ws), partial));
    }
    if addr != ws {
        partial.push(down(addr));
    }
    if end != we {
        partial.push(we);
    }
    Some(((ws, we), partial))
}

/// What reserving one run of pages found.
enum Mapped {
    /// Reserved: this module mapped it.
    Yes,
    /// Nothing there can be mapped by the process (outside its address
    /// space): nothing to reserve.
    Unmappable,
    /// Host memory of the process is there.
    Taken,
}

/// Maps `[addr, addr + len)` inaccessible, where nothing is mapped yet.
fn map_run(addr: u64, len: u64) -> Mapped {
    let Ok(n) = usize::try_from(len) else {
        return Mapped::Unmappable;
    };
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: it
    // maps fresh inaccessible pages only where nothing is, or fails.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            n,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EEXIST) => Mapped::Taken,
            _ => Mapped::Unmappable,
        };
    }
    if p as u64 != addr {
        // A kernel before 4.17 takes the flag as a hint and mapped
        // elsewhere: that mapping is not ours to keep, and nothing can
        // be told about the address asked for.
        // SAFETY: the mapping just made, used by nothing.
        unsafe { libc::munmap(p, n) };
        return Mapped::Unmappable;
    }
    Mapped::Yes
}

/// Unmaps `[addr, addr + len)`, pages this module reserved.
fn unmap_run(addr: u64, len: u64) {
    if let Ok(n) = usize::try_from(len) {
        // SAFETY: pages this module mapped inaccessible for a device
        // allocation, which no longer uses them; nothing else maps there
        // (MAP_FIXED_NOREPLACE kept others out).
        unsafe { libc::munmap(addr as *mut c_void, n) };
    }
}

impl Reservations {
    /// Reserves the pages of device allocation `[addr, addr + len)`;
    /// `Err(Collision)` (and nothing reserved) where a page of it is host
    /// memory of the process.
    pub fn reserve(&mut self, addr: u64, len: u64) -> Result<(), Collision> {
        let ((ws, we), partial) = layout(addr, len).ok_or(Collision)?;
        let page = PAGE as u64;
        // What this call mapped, undone if a page is taken.
        let mut made: Vec<(u64, u64)> = Vec::new();
        let outcome = |at: u64, n: u64, made: &mut Vec<(u64, u64)>| match map_run(at, n) {
            Mapped::Yes => {
                made.push((at, n));
                Ok(true)
            }
            Mapped::Unmappable => Ok(false),
            Mapped::Taken => Err(Collision),
        };
        let result = (|| {
            let whole = if we > ws {
                Some(outcome(ws, we - ws, &mut made)?)
            } else {
                None
            };
            let mut fresh = Vec::with_capacity(2);
            for &p in &partial {
                if !self.shared.contains_key(&p) {
                    fresh.push((p, outcome(p, page, &mut made)?));
                }
            }
            Ok((whole, fresh))
        })();
        let (whole, fresh) = match result {
            Ok(r) => r,
            Err(c) => {
                for (at, n) in made {
                    unmap_run(at, n);
                }
                return Err(c);
            }
        };
        if let Some(mapped) = whole {
            self.whole.insert(ws, (we - ws, mapped));
        }
        for (p, mapped) in fresh {
            self.shared.insert(p, Shared { users: 0, mapped });
        }
        for p in partial {
            if let Some(s) = self.shared.get_mut(&p) {
                s.users += 1;
            }
        }
        Ok(())
    }

    /// Releases the pages of a device allocation [`Self::reserve`]d:
    /// those no other allocation uses are unmapped.
    pub fn release(&mut self, addr: u64, len: u64) {
        let Some(((ws, _), partial)) = layout(addr, len) else {
            return;
        };
        if let Some((n, mapped)) = self.whole.remove(&ws) {
            if mapped {
                unmap_run(ws, n);
            }
        }
        for p in partial {
            let Some(s) = self.shared.get_mut(&p) else {
                continue;
            };
            s.users = s.users.saturating_sub(1);
            if s.users == 0 {
                let mapped = s.mapped;
                self.shared.remove(&p);
                if mapped {
                    unmap_run(p, PAGE as u64);
                }
            }
        }
    }

    /// Turns the reserved pages of allocation `[addr, addr + len)`, a run
    /// of whole pages, into zeroed host memory of the process (managed
    /// memory). False, changing nothing, unless this module holds exactly
    /// that run mapped: only its own reservation is ever replaced.
    pub fn make_host_memory(&mut self, addr: u64, len: u64) -> bool {
        let page = PAGE as u64;
        if !addr.is_multiple_of(page) || !len.is_multiple_of(page) {
            return false;
        }
        if self.whole.get(&addr) != Some(&(len, true)) {
            return false;
        }
        let Ok(n) = usize::try_from(len) else {
            return false;
        };
        // SAFETY: MAP_FIXED replaces exactly the inaccessible pages this
        // module mapped for the allocation (checked above), which nothing
        // else uses; the reservation's bookkeeping stays as it is, so
        // `release` unmaps these pages as it would have the reserved ones.
        let p = unsafe {
            libc::mmap(
                addr as *mut c_void,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        p != libc::MAP_FAILED
    }

    /// Whether no page is reserved.
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.shared.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address range of `len` bytes nothing maps (mapped, then
    /// unmapped).
    /// A free range of `len` bytes the kernel will not hand to other
    /// threads' mappings meanwhile: a terabyte below where it places them
    /// (top down), since tests run in parallel and their allocators map
    /// memory at the top.
    fn free_range(len: usize) -> u64 {
        // SAFETY: a fresh anonymous mapping, unmapped at once.
        let top = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, len);
            p as u64
        };
        let low = top - (1 << 40);
        match map_run(low, len as u64) {
            Mapped::Yes => {
                unmap_run(low, len as u64);
                low
            }
            _ => top,
        }
    }

    /// Whether a host mapping of one page at `addr` can be made now.
    fn host_can_map(addr: u64) -> bool {
        match map_run(addr, PAGE as u64) {
            Mapped::Yes => {
                unmap_run(addr, PAGE as u64);
                true
            }
            _ => false,
        }
    }

    #[test]
    fn reserved_pages_keep_host_mappings_out_until_released() {
        let base = free_range(16 * PAGE);
        let page = PAGE as u64;
        let mut r = Reservations::default();
        // Two allocations sharing a page, as small device allocations do.
        r.reserve(base + 256, 2 * page).unwrap();
        r.reserve(base + 2 * page + 512, 1024).unwrap();
        for i in 0..3 {
            assert!(!host_can_map(base + i * page), "page {i} reserved");
        }
        r.release(base + 256, 2 * page);
        assert!(host_can_map(base) && host_can_map(base + page));
        assert!(!host_can_map(base + 2 * page), "still used by the second");
        r.release(base + 2 * page + 512, 1024);
        assert!(r.is_empty());
        assert!(host_can_map(base + 2 * page));
    }

    #[test]
    fn an_allocation_over_host_memory_collides_and_reserves_nothing() {
        let base = free_range(8 * PAGE);
        let page = PAGE as u64;
        // Host memory of the process at the fourth page.
        assert!(matches!(map_run(base + 3 * page, page), Mapped::Yes));
        let mut r = Reservations::default();
        assert_eq!(r.reserve(base, 6 * page), Err(Collision));
        assert!(r.is_empty());
        // The pages before it were not left reserved.
        assert!(host_can_map(base) && host_can_map(base + 2 * page));
        r.reserve(base + 4 * page, 2 * page).unwrap();
        unmap_run(base + 3 * page, page);
        r.release(base + 4 * page, 2 * page);
        assert!(r.is_empty());
    }

    #[test]
    fn addresses_the_process_cannot_map_need_no_reservation() {
        let mut r = Reservations::default();
        // Past the user address space of x86-64 and arm64 (47/48 bits).
        let high = 1u64 << 60;
        r.reserve(high, 4096).unwrap();
        r.release(high, 4096);
        assert!(r.is_empty());
        assert_eq!(r.reserve(u64::MAX - 10, 100), Err(Collision));
    }
}
