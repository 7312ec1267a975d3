//! Host memory standing in for device memory.

use std::sync::atomic::AtomicU64;

/// Device memory of one allocation: zeroed, page-aligned host memory,
/// rounded up to whole 64-bit words (so that a loaded kernel can see it
/// as atomic words; the bytes past `len` are never handed out).
///
/// Page alignment matters for speed, not correctness: guest buffers are
/// page-aligned, and copies between buffers whose addresses differ by a
/// small amount modulo 4 KiB run many times slower on some CPUs (a `Vec`
/// starts 16 bytes past a page).
pub struct DeviceBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Bytes allocated: `len` rounded up to a multiple of 8.
    cap: usize,
    /// It owns its memory (else it is a view of a physical allocation's,
    /// which outlives it).
    owned: bool,
    /// Kernels and copies may only read it (a mapping given read access).
    read_only: bool,
}

const DEVICE_BUF_ALIGN: usize = 4096;

impl DeviceBuf {
    /// `len` zeroed bytes, or `None` when the host has no memory for them.
    pub(super) fn zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let cap = len.checked_next_multiple_of(8)?;
        let layout = std::alloc::Layout::from_size_align(cap, DEVICE_BUF_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        std::ptr::NonNull::new(ptr).map(|ptr| DeviceBuf {
            ptr,
            len,
            cap,
            owned: true,
            read_only: false,
        })
    }

    /// A view of `len` bytes (a multiple of 8) of `of` from `offset`: a
    /// mapping of a physical allocation.
    ///
    /// # Safety
    /// `of` must outlive the view and stay where it is (its memory is
    /// on the heap, so moving `of` is fine); views of the same bytes are
    /// never borrowed as plain slices at once (see `SoftwarePartition`'s
    /// copies, which copy a source that may alias first).
    pub(super) unsafe fn view(of: &DeviceBuf, offset: usize, len: usize, read_only: bool) -> Self {
        assert!(offset + len <= of.cap && len.is_multiple_of(8) && len > 0);
        // SAFETY: inside `of`'s allocation (asserted), so not null.
        let ptr = unsafe { std::ptr::NonNull::new_unchecked(of.ptr.as_ptr().add(offset)) };
        DeviceBuf {
            ptr,
            len,
            cap: len,
            owned: false,
            read_only,
        }
    }

    /// Whether kernels and copies may only read it.
    pub(super) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Where its bytes are in this process: two views alias when these
    /// overlap.
    pub(super) fn host_range(&self) -> std::ops::Range<usize> {
        let start = self.ptr.as_ptr() as usize;
        start..start + self.cap
    }

    /// The memory as 64-bit atomic words, for a loaded kernel whose
    /// threads read and write it concurrently; `&mut self` keeps every
    /// other view away meanwhile.
    pub(super) fn words(&mut self) -> &[AtomicU64] {
        // SAFETY: ptr is 4096-aligned (more than AtomicU64 needs) and
        // points to `cap` initialised bytes, a multiple of 8, owned by
        // self; AtomicU64 has the size and alignment of u64 and any bit
        // pattern is valid. The exclusive borrow of self means no plain
        // reference to the bytes exists while the atomic view lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>(), self.cap / 8) }
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
        if !self.owned {
            return;
        }
        // SAFETY: allocated in `zeroed` with this very layout (which was
        // valid then, so from_size_align cannot fail now).
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                std::alloc::Layout::from_size_align_unchecked(self.cap, DEVICE_BUF_ALIGN),
            )
        }
    }
}

// SAFETY: DeviceBuf owns its memory exclusively, like a Box<[u8]>.
unsafe impl Send for DeviceBuf {}
