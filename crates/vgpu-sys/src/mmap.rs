//! Shared mappings of files: a mapping unmaps itself when dropped and
//! keeps its file open while it lives.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// `len` bytes of a file mapped shared (`MAP_SHARED`); unmapped on drop.
pub struct SharedMapping {
    addr: *mut u8,
    size: usize,
    file: Arc<File>,
}

// SAFETY: the mapping is memory this value owns until it is dropped; it
// hands out only a raw pointer, through which every access is the
// caller's own unsafe code, so moving or sharing the value across threads
// adds nothing that a single thread could not do.
unsafe impl Send for SharedMapping {}
// SAFETY: as for `Send`: `&SharedMapping` gives the pointer, the size and
// the file, none of which allows an unsynchronised access by itself.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// The first mapped byte (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The mapped file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl std::fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMapping")
            .field("addr", &self.addr)
            .field("size", &self.size)
            .field("fd", &self.file.as_raw_fd())
            .finish()
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map_shared` created, which
        // this value owns; nothing uses it after the drop.
        unsafe { libc::munmap(self.addr.cast(), self.size) };
    }
}

/// Maps `len` bytes of `file` from `offset` (page-aligned), shared
/// (`MAP_SHARED`), with protection `prot` (`PROT_*`).
pub fn map_shared(
    file: Arc<File>,
    offset: u64,
    len: usize,
    prot: libc::c_int,
) -> io::Result<SharedMapping> {
    // SAFETY: a fresh mapping at an address the kernel picks (no hint, no
    // MAP_FIXED), so it replaces nothing; the result is checked below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(SharedMapping {
        addr: addr.cast(),
        size: len,
        file,
    })
}

/// The system's page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_two_mappings_share_the_file() {
        let f = Arc::new(crate::memfd::create(c"t", 3 * page_size()).unwrap());
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let a = map_shared(Arc::clone(&f), page_size(), page_size() as usize, rw).unwrap();
        let b = map_shared(Arc::clone(&f), 0, 2 * page_size() as usize, libc::PROT_READ).unwrap();
        // SAFETY: 4 bytes at offset 8 of `a`'s writable page.
        unsafe { std::ptr::copy_nonoverlapping([1u8, 2, 3, 4].as_ptr(), a.as_ptr().add(8), 4) };
        let mut got = [0u8; 4];
        // SAFETY: 4 bytes inside `b`'s two readable pages.
        unsafe {
            std::ptr::copy_nonoverlapping(
                b.as_ptr().add(page_size() as usize + 8),
                got.as_mut_ptr(),
                4,
            )
        };
        assert_eq!(got, [1, 2, 3, 4]);
        assert_eq!(Arc::strong_count(&f), 3, "each region keeps the file");
        drop((a, b));
        assert_eq!(Arc::strong_count(&f), 1);
        // Not page-aligned, or empty: refused by mmap.
        assert!(map_shared(Arc::clone(&f), 1, 16, rw).is_err());
        assert!(map_shared(f, 0, 0, rw).is_err());
    }
}
