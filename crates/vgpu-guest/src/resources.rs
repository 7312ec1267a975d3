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
    /// Whether drop frees the memory: not after [`Buffer::free`] or
    /// [`Buffer::into_raw`], which still let go of the device file.
    pub(crate) owned: bool,
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
    pub fn into_raw(mut self) -> u64 {
        self.owned = false;
        self.addr
    }

    /// Frees now, returning the driver's answer (drop ignores it).
    pub fn free(mut self) -> Result<()> {
        self.owned = false;
        self.dev.free(self.addr)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.dev.free(self.addr);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is no vgpu device: its ioctls fail, which is enough.
    fn inner() -> Arc<Inner> {
        Arc::new(Inner {
            file: std::fs::File::open("/dev/null").unwrap(),
            path: "/dev/null".into(),
            info: Default::default(),
            owner: None,
        })
    }

    #[test]
    fn a_freed_or_given_up_buffer_lets_go_of_the_file() {
        let dev = inner();
        let buffer = |dev: &Arc<Inner>| Buffer {
            dev: dev.clone(),
            addr: 0x1000,
            size: 4096,
            owned: true,
        };
        // The driver's answer comes back (here: not a vgpu device).
        assert!(matches!(buffer(&dev).free(), Err(Error::NotVgpu)));
        assert_eq!(Arc::strong_count(&dev), 1);
        assert_eq!(buffer(&dev).into_raw(), 0x1000);
        assert_eq!(Arc::strong_count(&dev), 1);
        drop(buffer(&dev));
        assert_eq!(Arc::strong_count(&dev), 1);
    }
}
