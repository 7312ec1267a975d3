//! How copies reach memory: which side of unified addressing a pointer
//! is on, host memory pinned for a device, asynchronous copies handed to
//! the device, copies between two vGPUs staged through host memory, and
//! the work of a memset.

use std::sync::Arc;

use vgpu_guest::Batch;

use crate::allocs::range_device;
use crate::cu::{self, CUdevice, CUdeviceptr, CuResult, Handle};
use crate::diag::check;
use crate::ffi;
use crate::graphs::Unsafe;
use crate::host_pages;
use crate::state::{driver, Driver, Gpu};
use crate::work::Work;

/// Smallest host range worth pinning once for the device: below it the
/// driver's per-copy pinning costs little.
const PIN_MIN: usize = 64 << 10;

/// Pins the whole pages of `[p, p + size)` with the current device's
/// kernel driver, so its copies skip pinning them each time; `None` when
/// too small or refused (copies then pin as they go, as before).
pub fn pin_pages(d: &Driver, p: usize, size: usize) -> Option<(CUdevice, usize)> {
    pin_pages_from(d, p, size, PIN_MIN)
}

/// [`pin_pages`], for ranges of at least `min` whole pages' bytes.
pub fn pin_pages_from(d: &Driver, p: usize, size: usize, min: usize) -> Option<(CUdevice, usize)> {
    const PAGE: usize = host_pages::PAGE;
    let first = p.checked_add(PAGE - 1)? & !(PAGE - 1);
    let end = p.checked_add(size)? & !(PAGE - 1);
    if end <= first || end - first < min.max(1) {
        return None;
    }
    let (_, dev) = d.current_ctx().ok()?;
    let g = d.gpu(dev).ok()?;
    match g.dev.pin(first as *const u8, end - first) {
        Ok(()) => Some((dev, first)),
        Err(e) => {
            crate::diag::log(&format!(
                "host memory at {p:#x} not pinned for the device: {e}"
            ));
            None
        }
    }
}

/// Undoes what [`pin_pages`] gave, once the device's queued work (which
/// may hold asynchronous copies of the range) is done.
pub fn unpin_pages(d: &Driver, pinned: Option<(CUdevice, usize)>) {
    if let Some((dev, first)) = pinned {
        if let Ok(g) = d.gpu(dev) {
            g.wait_idle();
            let _ = g.dev.unpin(first as *const u8);
        }
    }
}

/// Where a unified-addressing pointer lives.
pub enum Side {
    /// In a device allocation of this process.
    Device,
    /// Anything else: host memory.
    Host,
}

/// Which side of unified addressing `[p, p + len)` lies on.
pub fn side(d: &Driver, p: u64, len: usize) -> Side {
    if d.objects().allocs().alloc_at(p, len as u64).is_some() {
        Side::Device
    } else {
        Side::Host
    }
}

/// Whether a copy call returns only once the copy is done, or may
/// return once it is queued (the `*Async` entry points).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Done when the call returns.
    Sync,
    /// Queued; done in its stream's order.
    Async,
}

/// Whether `[p, p + len)` lies in page-locked host memory pinned for
/// device `dev`, pinning the allocation holding it now if it is not yet
/// (small ones are pinned only when asked for like this).
pub fn pinned_now(d: &Driver, p: usize, len: usize, dev: CUdevice) -> bool {
    if in_pinned(d, p, len, dev) {
        return true;
    }
    let Some((start, size)) = ({
        let o = d.objects();
        o.host()
            .host_at(p, len)
            .filter(|(_, h)| h.pinned.is_none())
            .map(|(start, h)| (start, h.size))
    }) else {
        return false;
    };
    if d.current_ctx().map(|(_, cur)| cur) != Ok(dev) {
        return false;
    }
    let Some(pinned) = pin_pages_from(d, start, size, 0) else {
        return false;
    };
    let raced = {
        let mut o = d.objects();
        match o.host_mut().get_mut(start) {
            Some(h) if h.pinned.is_none() => {
                h.pinned = Some(pinned);
                false
            }
            _ => true,
        }
    };
    if raced {
        // Freed or pinned by another thread meanwhile.
        unpin_pages(d, Some(pinned));
    }
    in_pinned(d, p, len, dev)
}

/// Whether `[p, p + len)` lies in the whole pages of host memory pinned
/// for device `dev` (page-locked memory CUDA lets copies use after the
/// call returns).
pub fn in_pinned(d: &Driver, p: usize, len: usize, dev: CUdevice) -> bool {
    let o = d.objects();
    let Some((start, h)) = o.host().host_at(p, len) else {
        return false;
    };
    let end = (start + h.size) & !(host_pages::PAGE - 1);
    matches!(h.pinned, Some((pd, first)) if pd == dev && p >= first && p + len <= end)
}

/// Whether `[p, p + len)` lies in page-locked host memory of this
/// process (`cuMemHostAlloc`, `cuMemHostRegister`), which stays mapped
/// until it is freed or unregistered: what a graph may copy to or from.
/// (Whether the kernel driver holds it pinned as well is
/// [`in_pinned`]'s question.)
pub fn in_page_locked(d: &Driver, p: usize, len: usize) -> bool {
    len > 0 && d.objects().host().host_at(p, len).is_some()
}

/// Asynchronous copies of at least this many bytes go to the device at
/// once instead of waiting in the open batch: the device takes longer to
/// move one than the guest takes to submit it, so the next is submitted
/// while it moves.
const SUBMIT_COPY_AT: usize = 1 << 20;

/// Queues an asynchronous copy of `n` bytes on `lane`.
pub fn submit_copy(g: &Gpu, lane: usize, b: Batch, n: usize) -> CuResult {
    g.submit_on(lane, b, None)?;
    if n >= SUBMIT_COPY_AT {
        g.flush()?;
    }
    Ok(())
}

/// The most bytes a copy between two devices holds in host memory at a
/// time.
const ACROSS_CHUNK: usize = 4 << 20;

/// A copy between two devices' memory (there is no peer access between
/// vGPUs) of several pieces (source, destination, length; the rows of a
/// strided copy), from device `from`'s memory to device `to`'s: staged
/// through host memory a piece at a time, after the work queued before
/// it on both devices' default streams and on `stream`, and done when
/// this returns.
pub fn copy_across(
    to: CUdevice,
    from: CUdevice,
    pieces: impl IntoIterator<Item = (u64, u64, u64)>,
    stream: Handle,
) -> CuResult {
    let d = driver()?;
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    let (gs, gd) = (d.gpu(from)?, d.gpu(to)?);
    gs.sync_legacy()?;
    gd.sync_legacy()?;
    if stream as usize > 2 {
        d.gpu(d.stream_device(stream as usize)?)?
            .sync_lane(d.stream_lane(stream as usize)?)?;
    }
    let mut buf = Vec::new();
    for (src, dst, n) in pieces {
        let n = usize::try_from(n).map_err(|_| cu::ERROR_INVALID_VALUE)?;
        let managed_src = gs.inflight().managed.holding(src, n as u64).is_some();
        let managed_dst = gd.inflight().managed.holding(dst, n as u64).is_some();
        buf.resize(n.min(ACROSS_CHUNK), 0);
        let mut done = 0;
        while done < n {
            let len = (n - done).min(ACROSS_CHUNK);
            let (s, t) = (src + done as u64, dst + done as u64);
            let piece = &mut buf[..len];
            if managed_src {
                // SAFETY: `s .. s + len` lies in a managed allocation, host
                // memory of this process, and its device is idle.
                piece.copy_from_slice(unsafe { ffi::bytes(s as *const u8, len) }?);
            } else {
                check(gs.dev.copy_from_device_addr(s, piece))?;
            }
            if managed_dst {
                // SAFETY: as for the source; `buf` is not managed memory.
                unsafe { ffi::bytes_mut(t as *mut u8, len) }?.copy_from_slice(piece);
            } else {
                check(gd.dev.copy_to_device_addr(t, piece))?;
            }
            done += len;
        }
    }
    Ok(())
}

/// The work of a memset (the device's FILL for whole 32-bit words, a
/// small copy for the 1 to 3 bytes after them) and its device; `None` when it
/// sets nothing.
pub fn memset_work(
    d: &Driver,
    dst: CUdeviceptr,
    value: u32,
    width: usize,
    count: usize,
) -> CuResult<Option<(CUdevice, Vec<Work>)>> {
    let n = count.checked_mul(width).ok_or(cu::ERROR_INVALID_VALUE)?;
    if n == 0 {
        return Ok(None);
    }
    if !dst.is_multiple_of(width as u64) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let device = range_device(d, dst, n)?;
    let pattern = match width {
        1 => (value & 0xff) * 0x0101_0101,
        2 => (value & 0xffff) * 0x0001_0001,
        _ => value,
    };
    let body = n & !3;
    let mut work = Vec::with_capacity(2);
    if body > 0 {
        work.push(Work::Fill {
            addr: dst,
            len: body as u64,
            pattern,
        });
    }
    if body < n {
        work.push(Work::Write {
            addr: dst + body as u64,
            bytes: Arc::from(&pattern.to_le_bytes()[..n - body]),
        });
    }
    Ok(Some((device, work)))
}
