//! Page-locked host memory (`cuMemHostAlloc`): where copies to and from
//! the device are fastest.
//!
//! A copy's host side reaches the device as the guest kernel driver's
//! scatter-gather list of the pages it pins, one piece per physically
//! contiguous run. Pages from the heap are scattered, so a 16 MiB copy
//! is thousands of 4 KiB pieces, each pinned, mapped and copied on its
//! own. Large allocations are therefore mapped on their own, aligned to
//! and advised for transparent huge pages and populated at once: each
//! 2 MiB huge page is one piece, 512 times fewer for the guest kernel to
//! pin and the device to copy. Where the guest kernel gives no huge pages
//! the memory still works, as ordinary pages.

use std::ffi::c_void;
use std::ptr;

/// A transparent huge page on x86-64 (and the alignment that lets the
/// kernel use one for every 2 MiB of a mapping).
const HUGE_PAGE: usize = 2 << 20;

/// Smallest allocation mapped on its own; smaller ones come from the heap
/// (as few pieces either way), page-aligned as pinned memory is.
const OWN_MAPPING_MIN: usize = HUGE_PAGE;

/// The page size, the unit the kernel driver pins.
pub(crate) const PAGE: usize = 4096;

fn heap_layout(size: usize) -> Option<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(size.max(1), PAGE).ok()
}

fn mapping_len(size: usize) -> Option<usize> {
    size.checked_add(HUGE_PAGE - 1)
        .map(|n| n & !(HUGE_PAGE - 1))
}

/// `size` bytes of host memory, page-aligned, at least 2 MiB-aligned and
/// populated when `size` is at least 2 MiB; `None` when out of memory.
/// Freed with [`free`] and the same `size`.
pub fn alloc(size: usize) -> Option<*mut u8> {
    if size < OWN_MAPPING_MIN {
        let layout = heap_layout(size)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        return (!p.is_null()).then_some(p);
    }
    let len = mapping_len(size)?;
    // Reserve one huge page more than needed, then trim to an aligned
    // window: mmap itself only promises 4 KiB alignment.
    let reserve = len.checked_add(HUGE_PAGE)?;
    // SAFETY: a fresh private anonymous mapping; no existing memory is
    // touched.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            reserve,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let start = (base as usize + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let head = start - base as usize;
    let tail = reserve - head - len;
    // SAFETY: both ranges lie inside the mapping just made and outside
    // the window kept; unmapping them cannot fail for valid ranges.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut c_void, tail);
        }
    }
    let window = start as *mut c_void;
    // SAFETY: advice for the window this function owns; best effort (a
    // kernel without huge pages refuses it, and ordinary pages serve).
    unsafe { libc::madvise(window, len, libc::MADV_HUGEPAGE) };
    // Populated now, as pinned memory is: running out of memory is this
    // call's error, not a fault at first touch. A kernel before 5.14
    // lacks the advice (EINVAL) and populates at first touch instead.
    // SAFETY: as above.
    if unsafe { libc::madvise(window, len, libc::MADV_POPULATE_WRITE) } != 0
        && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
    {
        // SAFETY: the window mapped above, not handed out.
        unsafe { libc::munmap(window, len) };
        return None;
    }
    Some(start as *mut u8)
}

/// Frees memory from [`alloc`].
///
/// # Safety
/// `p` came from `alloc(size)` with this `size` and is not used again.
pub unsafe fn free(p: *mut u8, size: usize) {
    if size < OWN_MAPPING_MIN {
        if let Some(layout) = heap_layout(size) {
            // SAFETY: allocated by `alloc` with this layout (the caller's
            // contract).
            unsafe { std::alloc::dealloc(p, layout) };
        }
        return;
    }
    if let Some(len) = mapping_len(size) {
        // SAFETY: the window `alloc` mapped for this size (the caller's
        // contract).
        unsafe { libc::munmap(p.cast(), len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_allocations_are_page_aligned_and_usable() {
        let p = alloc(100).unwrap();
        assert_eq!(p as usize % PAGE, 0);
        // SAFETY: 100 bytes were allocated.
        unsafe {
            p.write_bytes(0xa5, 100);
            assert_eq!(*p.add(99), 0xa5);
            free(p, 100);
        }
    }

    #[test]
    fn large_allocations_are_huge_page_aligned_and_whole() {
        for size in [HUGE_PAGE, HUGE_PAGE + 1, 5 * HUGE_PAGE - PAGE] {
            let p = alloc(size).unwrap();
            assert_eq!(p as usize % HUGE_PAGE, 0, "size {size}");
            // SAFETY: `size` bytes were allocated.
            unsafe {
                p.write_bytes(0x3c, size);
                assert_eq!(*p, 0x3c);
                assert_eq!(*p.add(size - 1), 0x3c);
                free(p, size);
            }
        }
    }

    #[test]
    fn impossible_sizes_fail_cleanly() {
        assert!(alloc(usize::MAX - 10).is_none());
        assert!(alloc(1 << 62).is_none());
    }
}
