//! Anonymous shared memory (memfd), optionally sealed.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

/// Creates a close-on-exec memfd of `size` zeroed bytes that cannot be
/// sealed.
pub fn create(name: &CStr, size: u64) -> io::Result<File> {
    let file = memfd(name, libc::MFD_CLOEXEC)?;
    file.set_len(size)?;
    Ok(file)
}

/// Creates a close-on-exec memfd of `size` zeroed bytes with `seals`
/// (`F_SEAL_*`) added once it has its size: with `F_SEAL_SHRINK`, no
/// process it is shared with can truncate it under another's mapping
/// (which would turn that one's accesses into SIGBUS).
pub fn create_sealed(name: &CStr, size: u64, seals: libc::c_int) -> io::Result<File> {
    let file = memfd(name, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)?;
    file.set_len(size)?;
    // SAFETY: fcntl on an fd we own; the result is checked.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

fn memfd(name: &CStr, flags: libc::c_uint) -> io::Result<File> {
    // SAFETY: name is a valid NUL-terminated string; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seals(f: &File) -> libc::c_int {
        // SAFETY: fcntl on an fd we own.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) }
    }

    #[test]
    fn test_sizes_and_seals() {
        let f = create(c"t", 8192).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8192);
        // Not sealable: F_SEAL_SEAL is reported.
        assert_eq!(seals(&f), libc::F_SEAL_SEAL);
        f.set_len(4096).unwrap();
        let s = create_sealed(c"t", 4096, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW).unwrap();
        assert_eq!(seals(&s), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        assert!(s.set_len(0).is_err());
        assert!(s.set_len(8192).is_err());
    }
}
