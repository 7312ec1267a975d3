//! Shared mappings of files, as `vm-memory` regions: the region unmaps
//! itself when dropped and keeps its file open while it lives.

use std::fs::File;
use std::io;
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, MmapRegion};

/// Maps `len` bytes of `file` from `offset` (page-aligned), shared
/// (`MAP_SHARED`), with protection `prot` (`PROT_*`).
pub fn map_shared(
    file: Arc<File>,
    offset: u64,
    len: usize,
    prot: libc::c_int,
) -> io::Result<MmapRegion> {
    MmapRegionBuilder::new(len)
        .with_file_offset(FileOffset::from_arc(file, offset))
        .with_mmap_prot(prot)
        .with_mmap_flags(libc::MAP_SHARED)
        .build()
        .map_err(|e| match e {
            vm_memory::mmap::MmapRegionError::Mmap(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
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
    use vm_memory::{Bytes, VolatileMemory};

    #[test]
    fn test_two_mappings_share_the_file() {
        let f = Arc::new(crate::memfd::create(c"t", 3 * page_size()).unwrap());
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let a = map_shared(Arc::clone(&f), page_size(), page_size() as usize, rw).unwrap();
        let b = map_shared(Arc::clone(&f), 0, 2 * page_size() as usize, libc::PROT_READ).unwrap();
        a.get_slice(8, 4)
            .unwrap()
            .write_slice(&[1, 2, 3, 4], 0)
            .unwrap();
        let mut got = [0u8; 4];
        b.get_slice(page_size() as usize + 8, 4)
            .unwrap()
            .read_slice(&mut got, 0)
            .unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        assert_eq!(Arc::strong_count(&f), 3, "each region keeps the file");
        drop((a, b));
        assert_eq!(Arc::strong_count(&f), 1);
        // Not page-aligned, or empty: refused by mmap.
        assert!(map_shared(Arc::clone(&f), 1, 16, rw).is_err());
        assert!(map_shared(f, 0, 0, rw).is_err());
    }
}
