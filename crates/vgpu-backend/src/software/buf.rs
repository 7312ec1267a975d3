//! Host memory standing in for device memory.

/// Device memory of one allocation: zeroed, page-aligned host memory.
///
/// Page alignment matters for speed, not correctness: guest buffers are
/// page-aligned, and copies between buffers whose addresses differ by a
/// small amount modulo 4 KiB run many times slower on some CPUs (a `Vec`
/// starts 16 bytes past a page).
pub struct DeviceBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

const DEVICE_BUF_ALIGN: usize = 4096;

impl DeviceBuf {
    /// `len` zeroed bytes, or `None` when the host has no memory for them.
    pub(super) fn zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let layout = std::alloc::Layout::from_size_align(len, DEVICE_BUF_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        std::ptr::NonNull::new(ptr).map(|ptr| DeviceBuf { ptr, len })
    }
}

impl std::ops::Deref for DeviceBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to `len` initialised (zeroed) bytes owned by
        // self for its whole life; the borrow of self bounds the slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for DeviceBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout (which was
        // valid then, so from_size_align cannot fail now).
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                std::alloc::Layout::from_size_align_unchecked(self.len, DEVICE_BUF_ALIGN),
            )
        }
    }
}

// SAFETY: DeviceBuf owns its memory exclusively, like a Box<[u8]>.
unsafe impl Send for DeviceBuf {}
