//! Anonymous shared memory (memfd) backing regions that a client maps
//! directly, such as memory BARs and doorbell pages.

use std::ffi::CStr;
use std::fs::File;
use std::io;

/// Creates a memfd of `size` zeroed bytes.
pub fn create(name: &CStr, size: u64) -> io::Result<File> {
    vgpu_sys::memfd::create(name, size)
}
