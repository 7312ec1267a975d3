//! What a device file holds on the device, released on drop: memory
//! ([`Buffer`]) and loaded modules ([`Module`]).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::file::Inner;
use crate::sys::VgpuCmd;

/// Device memory allocated by [`Device::alloc`]; freed on drop.
///
/// [`Device::alloc`]: crate::Device::alloc
pub struct Buffer {
    pub(crate) dev: Arc<Inner>,
    pub(crate) addr: u64,
    pub(crate) size: u64,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .finish()
    }
}

impl Buffer {
    /// Device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Device address of `offset`, if `offset..offset + len` is inside.
    pub fn range(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.addr + offset),
            _ => Err(Error::Bounds {
                what: "buffer",
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Gives up ownership: the memory stays allocated until
    /// [`Device::free_raw`] or until the device file is closed.
    ///
    /// [`Device::free_raw`]: crate::Device::free_raw
    pub fn into_raw(self) -> u64 {
        let addr = self.addr;
        std::mem::forget(self);
        addr
    }

    /// Frees now, returning the driver's answer (drop ignores it).
    pub fn free(self) -> Result<()> {
        let r = self.dev.free(self.addr);
        std::mem::forget(self);
        r
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let _ = self.dev.free(self.addr);
    }
}

/// A module loaded by [`Device::module_load`]; unloaded on drop.
///
/// [`Device::module_load`]: crate::Device::module_load
pub struct Module {
    pub(crate) dev: Arc<Inner>,
    pub(crate) handle: u64,
    pub(crate) prints: bool,
}

impl Module {
    /// The driver's handle.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Whether its kernels may print (`printf` in device code), which
    /// then waits for [`Device::console`].
    ///
    /// [`Device::console`]: crate::Device::console
    pub fn prints(&self) -> bool {
        self.prints
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let mut cmd = [VgpuCmd::module_unload(self.handle)];
        // SAFETY: MODULE_UNLOAD has no user pointers.
        let _ = unsafe { self.dev.run(&mut cmd) };
    }
}
