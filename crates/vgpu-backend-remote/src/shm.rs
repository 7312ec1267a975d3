//! The staging area: a sealed memfd mapped shared by the parent and its
//! partition host, through which uploads and downloads cross without
//! passing through the socket. Its first [`CONTROL_BYTES`] hold the
//! mailbox (see `mailbox.rs`); the data area follows.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::sync::Arc;

use vgpu_sys::mmap::SharedMapping;

/// Bytes before the data area, for the mailbox.
pub const CONTROL_BYTES: usize = 20 << 10;

/// A shared mapping of a memfd: the control area, then `len` data bytes.
#[derive(Debug)]
pub struct Staging {
    /// The mapping, which holds the memfd.
    region: SharedMapping,
    len: usize,
}

impl Staging {
    /// A new zeroed area of `len` data bytes whose size is sealed, so the
    /// other process cannot shrink it under our mapping (which would turn
    /// our accesses into SIGBUS).
    pub fn create(len: usize) -> io::Result<Staging> {
        let total = len
            .checked_add(CONTROL_BYTES)
            .filter(|_| len > 0)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        const NAME: &CStr = c"vgpu-staging";
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        let file = vgpu_sys::memfd::create_sealed(NAME, total as u64, seals)?;
        Staging::map(file, len)
    }

    /// Maps an area received from the parent; it must hold at least `len`
    /// data bytes.
    pub fn open(file: File, len: u64) -> io::Result<Staging> {
        let size = file.metadata()?.len();
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| {
                l > 0
                    && l.checked_add(CONTROL_BYTES)
                        .is_some_and(|t| size >= t as u64)
            })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("staging area of {size} bytes, {len} expected"),
                )
            })?;
        Staging::map(file, len)
    }

    fn map(file: File, len: usize) -> io::Result<Staging> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let region = vgpu_sys::mmap::map_shared(Arc::new(file), 0, CONTROL_BYTES + len, prot)?;
        Ok(Staging { region, len })
    }

    /// The memfd, to pass to the other process.
    pub fn file(&self) -> &File {
        self.region.file()
    }

    /// Data bytes.
    // (No `is_empty`: an area holds two halves, so it never is.)
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The control area's first byte (page-aligned, [`CONTROL_BYTES`]
    /// long, shared with the peer).
    pub fn control(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// The first `len` bytes (at most the area's length).
    ///
    /// The other process may write them at any time; the bytes are only
    /// ever copied as opaque data, never interpreted.
    pub fn bytes(&self, len: usize) -> &[u8] {
        let len = len.min(self.len);
        // SAFETY: `len` data bytes of our live mapping. The peer process
        // can change them concurrently; u8 has no invalid values and
        // nothing here decides anything from them.
        unsafe { std::slice::from_raw_parts(self.control().add(CONTROL_BYTES), len) }
    }

    /// The first `len` bytes, to write (at most the area's length).
    pub fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.len);
        // SAFETY: as for `bytes`; `&mut self` keeps this process's other
        // views out while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.control().add(CONTROL_BYTES), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_shared_between_two_mappings_and_sealed() {
        let mut a = Staging::create(8192).unwrap();
        let mut b = Staging::open(a.file().try_clone().unwrap(), 8192).unwrap();
        a.bytes_mut(4).copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b.bytes(4), &[1, 2, 3, 4]);
        b.bytes_mut(8192)[8191] = 9;
        assert_eq!(a.bytes(8192)[8191], 9);
        // Neither side can change the size any more.
        assert!(b.file().set_len(4096).is_err());
        assert!(b.file().set_len(1 << 20).is_err());
        // Asking for more than exists is refused.
        assert!(Staging::open(a.file().try_clone().unwrap(), 8193).is_err());
        assert!(Staging::open(a.file().try_clone().unwrap(), 0).is_err());
        assert!(Staging::create(0).is_err());
    }
}
