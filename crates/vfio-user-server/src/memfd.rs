//! Anonymous shared memory (memfd) backing regions that a client maps
//! directly, such as memory BARs and doorbell pages.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

/// Creates a memfd of `size` zeroed bytes.
pub fn create(name: &CStr, size: u64) -> io::Result<File> {
    // SAFETY: name is a valid NUL-terminated string; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}
