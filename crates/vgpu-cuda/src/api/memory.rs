//! Device and host memory, copies, memsets and pointer attributes.
//!
//! Memsets and device-to-device copies are queued ([`crate::inflight`])
//! or, on a stream being captured, recorded ([`crate::graphs`]); copies
//! with a host side wait for the work before them and complete before
//! they return (the `*Async` forms too: host memory is the caller's again
//! when the call returns, which CUDA allows), so a capture cannot record
//! them.

use std::ffi::c_void;

use crate::cu::{self, CUdevice, CUdeviceptr, CUresult, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::graphs::Unsafe;
use crate::work::Work;

use crate::allocs::{alloc, alloc_async, alloc_kind, free, range_device, Kind};
use crate::copies::{
    copy_across, in_page_locked, in_pinned, memset_work, pin_pages, side, submit_copy, unpin_pages,
    Call, Side,
};
use crate::cu::MemLocation;
use crate::diag::check;
use crate::host_pages;
use crate::mem_table::HostMem;
use crate::state::{driver, Driver};
use vgpu_guest::Batch;

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        let a = alloc(size)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(dptr, a) }.inspect_err(|_| {
            let _ = free(a);
        })
    })
}

/// From the device's current pool ([`crate::pool_table`]).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's out-parameter, checked before allocating.
        unsafe { ffi::put(dptr, 0) }?;
        let a = alloc_async(driver()?, None, size, stream)?;
        // SAFETY: as above.
        unsafe { ffi::put(dptr, a) }.inspect_err(|_| {
            let _ = free(a);
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry(|| {
        if dptr == 0 || !graph_free(dptr)? {
            return Ok(());
        }
        free(dptr)
    })
}

/// A free of an allocation node's memory frees it as the graph sees it
/// ([`crate::graphs::GraphMem`]); true where the memory itself goes now
/// or `dptr` is no graph's.
fn graph_free(dptr: CUdeviceptr) -> CuResult<bool> {
    use crate::graphs::ProgramFree as F;
    match driver()?.objects().graphs_mut().mem.program_free(dptr) {
        F::NotGraphs | F::Release => Ok(true),
        F::Kept => Ok(false),
        F::NotAllocated => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// Frees at once (after the work queued before it). In a capture, memory
/// the same capture allocated is kept for the graph, which frees it when
/// it and its executables are gone (`Graph::owned`); freeing other
/// memory there would free what the graph uses, so it invalidates the
/// capture.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        if dptr == 0 || d.objects().captured_free(stream as usize, dptr)? {
            return Ok(());
        }
        if !graph_free(dptr)? {
            return Ok(());
        }
        free(dptr)
    })
}

/// Free and total memory of the current device: the partition's quota
/// and what is left of it.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry(|| {
        let (_, g) = driver()?.current_gpu()?;
        let usage = check(g.dev.usage())?;
        let size = usage.total(&g.info);
        // SAFETY: the caller's out-parameters.
        unsafe {
            // What the context will hold of its own once it starts is
            // not free to allocate, as natively the context holds it.
            let used = usage.mem_used.saturating_add(usage.context_pending);
            ffi::put(free, size.saturating_sub(used) as usize)?;
            ffi::put(total, size as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        let (start, len) = {
            let o = driver()?.objects();
            let (s, a) = o.allocs().alloc_at(dptr, 0).ok_or(cu::ERROR_NOT_FOUND)?;
            (s, a.size)
        };
        // SAFETY: the caller's out-parameters, either may be null.
        unsafe {
            ffi::put_opt(base, start)?;
            ffi::put_opt(size, len as usize)?;
        }
        Ok(())
    })
}

fn host_alloc(size: usize, flags: u32) -> CuResult<*mut c_void> {
    let d = driver()?;
    let (ctx, _) = d.current_ctx()?;
    let p = host_pages::alloc(size).ok_or(cu::ERROR_OUT_OF_MEMORY)?;
    let pinned = pin_pages(d, p as usize, size);
    d.objects().host_mut().insert(
        p as usize,
        HostMem {
            size,
            ctx,
            owned: true,
            pinned,
            flags,
        },
    );
    Ok(p.cast())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: u32) -> CUresult {
    entry(|| {
        let p = host_alloc(size, flags)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pp, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuMemHostAlloc(pp, size, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry(|| {
        let d = driver()?;
        let h = {
            let mut o = d.objects();
            o.host_mut().remove_if_owned(p as usize, true)
        }
        .ok_or(cu::ERROR_INVALID_VALUE)?;
        // Unpinned before it is unmapped: a pinned range must stay mapped.
        unpin_pages(d, h.pinned);
        // SAFETY: `p` was allocated by `host_pages::alloc` with this size
        // and is removed from the table, so it is freed once.
        unsafe { host_pages::free(p.cast(), h.size) };
        Ok(())
    })
}

/// Registers host memory: recorded so pointer queries know it, and its
/// whole pages pinned for the current device's copies (as allocations
/// are) until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        if p.is_null() || size == 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        {
            let mut o = d.objects();
            if o.host().host_at(p as usize, 1).is_some() {
                return Err(cu::ERROR_HOST_MEMORY_ALREADY_REGISTERED);
            }
            o.host_mut().insert(
                p as usize,
                HostMem {
                    size,
                    ctx,
                    owned: false,
                    pinned: None,
                    flags,
                },
            );
        }
        // Pinned outside the table's lock (it may take long); recorded
        // only if the registration is still there, else undone.
        let pinned = pin_pages(d, p as usize, size);
        if pinned.is_some() {
            let mut o = d.objects();
            match o.host_mut().get_mut(p as usize) {
                Some(h) if !h.owned && h.pinned.is_none() => h.pinned = pinned,
                _ => {
                    drop(o);
                    unpin_pages(d, pinned);
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry(|| {
        let d = driver()?;
        let h = {
            let mut o = d.objects();
            o.host_mut().remove_if_owned(p as usize, false)
        }
        .ok_or(cu::ERROR_HOST_MEMORY_NOT_REGISTERED)?;
        unpin_pages(d, h.pinned);
        Ok(())
    })
}

/// An asynchronous copy with a host side on a stream being captured:
/// recorded when the host side is page-locked (a graph replays it without
/// waiting), else refused as CUDA refuses it.
fn capture_host_copy(
    d: &Driver,
    stream: Handle,
    device: CUdevice,
    host: usize,
    n: usize,
    work: Work,
) -> CuResult<bool> {
    if !d.objects().graphs().is_capturing(stream as usize) {
        return Ok(false);
    }
    if n == 0 {
        // Nothing to record.
        return Ok(true);
    }
    // A copy with pageable memory is recorded as one made between
    // batches when the graph runs, as CUDA's driver records it.
    let work = if in_page_locked(d, host, n) {
        work
    } else {
        work.pageable()
    };
    d.queue(stream as usize, device, &[work]).map(|()| true)
}

/// Waits for what a copy between device memory and pageable host memory
/// comes after, before it is made on the spot: a synchronous copy after
/// the legacy stream's work (and what that follows), an asynchronous one
/// after its stream's work, as the stream order wants it, whatever lane
/// that stream is on.
fn wait_before_host_copy(
    d: &Driver,
    g: &crate::state::Gpu,
    stream: Handle,
    call: Call,
) -> CuResult {
    match call {
        Call::Async => g.sync_lane(d.stream_lane(stream as usize)?),
        _ => g.sync_legacy(),
    }
}

fn htod(dst: CUdeviceptr, src: *const c_void, n: usize, stream: Handle, call: Call) -> CuResult {
    let d = driver()?;
    let device = range_device(d, dst, n)?;
    let upload = Work::Upload {
        dst,
        src: src as u64,
        len: n as u64,
    };
    if call == Call::Async && capture_host_copy(d, stream, device, src as usize, n, upload)? {
        return Ok(());
    }
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    let g = d.gpu(device)?;
    if call == Call::Async && n > 0 && in_pinned(d, src as usize, n, device) {
        // Queued in order with the device's other work; the program may
        // not change the source until the stream has synchronised.
        let mut b = Batch::new();
        // SAFETY: the source lies in page-locked memory of this process
        // that stays mapped until cuMemFreeHost or cuMemHostUnregister,
        // which wait for the device's queued work first.
        unsafe { b.copy_user_to_device_addr(dst, src.cast(), n as u64) };
        return submit_copy(g, d.stream_lane(stream as usize)?, b, n);
    }
    // SAFETY: the caller's source buffer of `n` bytes.
    let data = unsafe { ffi::bytes(src.cast(), n) }?;
    wait_before_host_copy(d, g, stream, call)?;
    if g.inflight().managed.holding(dst, n as u64).is_some() {
        // Idle device: managed memory is the host's; written in place.
        // SAFETY: `dst .. dst + n` lies in a managed allocation, host
        // memory of this process; `copy` allows the caller's overlap.
        unsafe { std::ptr::copy(data.as_ptr(), dst as *mut u8, n) };
        return Ok(());
    }
    check(g.dev.copy_to_device_addr(dst, data))
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: Handle, call: Call) -> CuResult {
    let d = driver()?;
    let device = range_device(d, src, n)?;
    let download = Work::Download {
        dst: dst as u64,
        src,
        len: n as u64,
    };
    if call == Call::Async && capture_host_copy(d, stream, device, dst as usize, n, download)? {
        return Ok(());
    }
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    let g = d.gpu(device)?;
    if call == Call::Async && n > 0 && in_pinned(d, dst as usize, n, device) {
        let mut b = Batch::new();
        // SAFETY: as in `htod`; the program reads the destination only
        // after the stream has synchronised.
        unsafe { b.copy_device_addr_to_user(dst.cast(), src, n as u64) };
        return submit_copy(g, d.stream_lane(stream as usize)?, b, n);
    }
    // SAFETY: the caller's destination buffer of `n` bytes.
    let out = unsafe { ffi::bytes_mut(dst.cast(), n) }?;
    wait_before_host_copy(d, g, stream, call)?;
    if g.inflight().managed.holding(src, n as u64).is_some() {
        // SAFETY: as in `htod`, the other way.
        unsafe { std::ptr::copy(src as *const u8, out.as_mut_ptr(), n) };
        return Ok(());
    }
    check(g.dev.copy_from_device_addr(src, out))
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle) -> CuResult {
    let d = driver()?;
    let device = range_device(d, dst, n)?;
    let from = range_device(d, src, n)?;
    if from != device {
        return dtod_across((dst, device), (src, from), n, stream);
    }
    if n == 0 {
        return Ok(());
    }
    let work = Work::Copy {
        dst,
        src,
        len: n as u64,
    };
    d.queue(stream as usize, device, &[work])
}

/// A copy from one device's memory to another's (there is no peer access
/// between vGPUs): staged through host memory a piece at a time, after
/// the work queued before it on both devices' default streams and on
/// `stream`, and done when this returns, as CUDA's copies between
/// devices without peer access are.
fn dtod_across(
    (dst, to): (CUdeviceptr, CUdevice),
    (src, from): (CUdeviceptr, CUdevice),
    n: usize,
    stream: Handle,
) -> CuResult {
    copy_across(to, from, std::iter::once((src, dst, n as u64)), stream)
}

/// `cuMemcpy`: either side may be host or device memory.
fn copy_any(dst: u64, src: u64, n: usize, stream: Handle, call: Call) -> CuResult {
    let d = driver()?;
    match (side(d, dst, n), side(d, src, n)) {
        (Side::Device, Side::Device) => dtod(dst, src, n, stream),
        (Side::Device, Side::Host) => htod(dst, src as *const c_void, n, stream, call),
        (Side::Host, Side::Device) => dtoh(dst as *mut c_void, src, n, stream, call),
        (Side::Host, Side::Host) => {
            d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
            if n > 0 {
                // SAFETY: both are the caller's host buffers of `n` bytes
                // (unified addressing says so: neither is device memory);
                // `copy` allows overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
            }
            Ok(())
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    entry(|| htod(dst, src, n, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: Handle,
) -> CUresult {
    entry(|| htod(dst, src, n, s, Call::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| dtoh(dst, src, n, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: Handle,
) -> CUresult {
    entry(|| dtoh(dst, src, n, s, Call::Async))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| dtod(dst, src, n, std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: Handle,
) -> CUresult {
    entry(|| dtod(dst, src, n, s))
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| copy_any(dst, src, n, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: Handle,
) -> CUresult {
    entry(|| copy_any(dst, src, n, s, Call::Async))
}

/// `CUmemcpyAttributes`: how the copies of a batch from one index on may
/// reach their sources.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcpyAttributes {
    src_access_order: u32,
    /// `CUmemLocation` hints (type, id) for managed memory: ignored, as
    /// the device has no placement to steer.
    src_loc_hint: [u32; 2],
    dst_loc_hint: [u32; 2],
    flags: u32,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_*`: in stream order, during the call, any.
const SRC_ACCESS_STREAM: u32 = 1;
const SRC_ACCESS_DURING_API_CALL: u32 = 2;
const SRC_ACCESS_ANY: u32 = 3;
/// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`: a hint.
const MEMCPY_FLAG_PREFER_OVERLAP: u32 = 1;

/// `cuMemcpyBatchAsync`: `count` copies, each in any direction, queued on
/// `stream` in turn; copies from index `attr_idxs[k]` on take
/// `attrs[k]`. A source to be read during the call (a stack variable)
/// is copied before it returns. On a failure, `fail_idx` (where given)
/// says which copy failed, or `usize::MAX` when none did.
///
/// # Safety
/// The arrays hold `count` (`n_attrs`) entries, as `cuMemcpyBatchAsync`
/// takes them.
#[allow(clippy::too_many_arguments)]
unsafe fn memcpy_batch(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    n_attrs: usize,
    fail_idx: *mut usize,
    stream: Handle,
) -> CuResult {
    let mut failed_at = usize::MAX;
    let r = (|| {
        if count == 0 || n_attrs == 0 || n_attrs > count {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's arrays of `count` and `n_attrs` entries.
        let (dsts, srcs, sizes, attrs, idxs) = unsafe {
            (
                ffi::slice(dsts, count)?,
                ffi::slice(srcs, count)?,
                ffi::slice(sizes, count)?,
                ffi::slice(attrs, n_attrs)?,
                ffi::slice(attr_idxs, n_attrs)?,
            )
        };
        // The first attributes start at copy 0; each later set further on.
        let ordered = idxs.first() == Some(&0)
            && idxs.windows(2).all(|w| w[0] < w[1])
            && idxs.last().is_some_and(|&i| i < count);
        let known = attrs.iter().all(|a| {
            (SRC_ACCESS_STREAM..=SRC_ACCESS_ANY).contains(&a.src_access_order)
                && a.flags & !MEMCPY_FLAG_PREFER_OVERLAP == 0
        });
        if !ordered || !known {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let mut k = 0;
        for i in 0..count {
            while k + 1 < n_attrs && idxs[k + 1] <= i {
                k += 1;
            }
            let call = if attrs[k].src_access_order == SRC_ACCESS_DURING_API_CALL {
                Call::Sync
            } else {
                Call::Async
            };
            copy_any(dsts[i], srcs[i], sizes[i], stream, call).inspect_err(|_| failed_at = i)?;
        }
        Ok(())
    })();
    if r.is_err() && !fail_idx.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(fail_idx, failed_at) }?;
    }
    r
}

/// `cuMemcpyBatchAsync` as CUDA 12.8 has it, with the failed copy's index.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuMemcpyBatchAsync(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    n_attrs: usize,
    fail_idx: *mut usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded.
    entry(|| unsafe {
        memcpy_batch(
            dsts, srcs, sizes, count, attrs, attr_idxs, n_attrs, fail_idx, stream,
        )
    })
}

/// `cuMemcpyBatchAsync` as CUDA 13 has it.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuMemcpyBatchAsync_v2(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    n_attrs: usize,
    stream: Handle,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded.
    entry(|| unsafe {
        memcpy_batch(
            dsts,
            srcs,
            sizes,
            count,
            attrs,
            attr_idxs,
            n_attrs,
            std::ptr::null_mut(),
            stream,
        )
    })
}

/// Sets `count` elements of `width` bytes (1, 2 or 4) at `dst` to
/// `value`, queued: the device's FILL for whole 32-bit words, a small
/// copy for the 1 to 3 bytes after them. The pattern repeats every
/// element and `dst` is element-aligned, so its phase is the same at any
/// element.
fn memset(dst: CUdeviceptr, value: u32, width: usize, count: usize, stream: Handle) -> CuResult {
    let d = driver()?;
    let Some((device, work)) = memset_work(d, dst, value, width, count)? else {
        return Ok(());
    };
    d.queue(stream as usize, device, &work)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    entry(|| memset(dst, v.into(), 1, n, std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CUresult {
    entry(|| memset(dst, v.into(), 2, n, std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: u32, n: usize) -> CUresult {
    entry(|| memset(dst, v, 4, n, std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: Handle) -> CUresult {
    entry(|| memset(dst, v.into(), 1, n, s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: Handle) -> CUresult {
    entry(|| memset(dst, v.into(), 2, n, s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(dst: CUdeviceptr, v: u32, n: usize, s: Handle) -> CUresult {
    entry(|| memset(dst, v, 4, n, s))
}

/// Writes one pointer attribute of `p` to `data`.
///
/// # Safety
/// `data` is valid for a write of the attribute's type.
unsafe fn pointer_attribute(d: &Driver, attr: i32, data: *mut c_void, p: u64) -> CuResult {
    let o = d.objects();
    let dev = o
        .allocs()
        .alloc_at(p, 0)
        .map(|(s, a)| (s, a.size, a.ctx, a.device));
    // A mapping's access for its device (cuMemSetAccess); other device
    // memory is read-write.
    let access = o
        .allocs()
        .alloc_at(p, 0)
        .map(|(_, a)| a.mapping.map_or(crate::vmm::PROT_READWRITE, |m| m.access));
    let managed = o.allocs().alloc_at(p, 0).is_some_and(|(_, a)| a.managed);
    let host = o
        .host()
        .host_at(p as usize, 0)
        .map(|(s, h)| (s as u64, h.size as u64, h.ctx));
    drop(o);
    let (start, size, ctx, mem_type, ordinal) = match (dev, host) {
        (Some((s, z, c, dv)), _) => (s, z, c, cu::MEMORYTYPE_DEVICE, dv),
        (None, Some((s, z, c))) => (s, z, c, cu::MEMORYTYPE_HOST, d.ctx_device(c).unwrap_or(0)),
        // Memory this driver knows nothing of: CUDA answers "invalid
        // value" for everything but the memory type and context.
        (None, None) => match attr {
            cu::POINTER_MEMORY_TYPE => {
                // SAFETY: a `CUmemorytype` (u32) by the caller's contract;
                // 0 is "not CUDA memory".
                return unsafe { ffi::put(data.cast::<u32>(), 0) };
            }
            _ => return Err(cu::ERROR_INVALID_VALUE),
        },
    };
    // SAFETY: in every arm, `data` has the attribute's type by the
    // caller's contract.
    unsafe {
        match attr {
            cu::POINTER_CONTEXT => ffi::put(data.cast::<Handle>(), ctx as Handle),
            cu::POINTER_MEMORY_TYPE => ffi::put(data.cast::<u32>(), mem_type),
            cu::POINTER_DEVICE_POINTER | cu::POINTER_HOST_POINTER => {
                // Managed memory has one address on both sides.
                let ok = managed
                    || (attr == cu::POINTER_DEVICE_POINTER) == (mem_type == cu::MEMORYTYPE_DEVICE);
                if !ok {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
                ffi::put(data.cast::<u64>(), p)
            }
            cu::POINTER_SYNC_MEMOPS => ffi::put(data.cast::<i32>(), 1),
            cu::POINTER_BUFFER_ID => ffi::put(data.cast::<u64>(), start),
            cu::POINTER_IS_MANAGED => ffi::put(data.cast::<i32>(), i32::from(managed)),
            cu::POINTER_DEVICE_ORDINAL => ffi::put(data.cast::<i32>(), ordinal),
            cu::POINTER_RANGE_START_ADDR => ffi::put(data.cast::<u64>(), start),
            cu::POINTER_RANGE_SIZE => ffi::put(data.cast::<usize>(), size as usize),
            cu::POINTER_MAPPED => ffi::put(data.cast::<i32>(), 1),
            cu::POINTER_MAPPING_BASE_ADDR if mem_type == cu::MEMORYTYPE_DEVICE => {
                ffi::put(data.cast::<u64>(), start)
            }
            cu::POINTER_MAPPING_SIZE if mem_type == cu::MEMORYTYPE_DEVICE => {
                ffi::put(data.cast::<usize>(), size as usize)
            }
            cu::POINTER_ACCESS_FLAGS if mem_type == cu::MEMORYTYPE_DEVICE => {
                ffi::put(data.cast::<u32>(), access.unwrap_or(0))
            }
            cu::POINTER_MEMPOOL_HANDLE => {
                let pool = d.objects().pools().pool_of(start).unwrap_or(0);
                ffi::put(data.cast::<Handle>(), pool as Handle)
            }
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: i32,
    p: CUdeviceptr,
) -> CUresult {
    // SAFETY: `data` has the attribute's type by the caller's contract.
    entry(|| unsafe { pointer_attribute(driver()?, attr, data, p) })
}

/// Like `cuPointerGetAttribute` for several attributes; an attribute that
/// does not apply leaves its slot alone, as CUDA does.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: u32,
    attrs: *const i32,
    data: *mut *mut c_void,
    p: CUdeviceptr,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        for i in 0..n as usize {
            // SAFETY: `attrs` and `data` hold `n` entries.
            let (attr, slot) =
                unsafe { (ffi::get(attrs.add(i))?, ffi::get(data.add(i).cast_const())?) };
            // SAFETY: each slot has its attribute's type.
            let _ = unsafe { pointer_attribute(d, attr, slot, p) };
        }
        Ok(())
    })
}

/// `cuMemAllocManaged`: memory that one pointer reaches from the host and
/// the device ([`crate::managed`]). Attaching to one stream
/// (`CU_MEM_ATTACH_SINGLE`) is not offered: a device without concurrent
/// managed access has no use for it here: while a process has managed
/// memory, all its streams run in order on one lane.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: u32,
) -> CUresult {
    entry(|| {
        if flags != cu::MEM_ATTACH_GLOBAL && flags != cu::MEM_ATTACH_HOST {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's out-parameter, checked before allocating.
        unsafe { ffi::put(dptr, 0) }?;
        let addr = alloc_kind(size, Kind::Managed)?;
        // SAFETY: as above.
        unsafe { ffi::put(dptr, addr) }
    })
}

/// Checks that `[p, p + n)` is managed memory, which is all a prefetch or
/// an advice needs here: the memory moves with the device's work anyway.
fn managed_range(p: CUdeviceptr, n: usize) -> CuResult {
    let d = driver()?;
    let o = d.objects();
    match o.allocs().alloc_at(p, n as u64) {
        Some((_, a)) if a.managed && n > 0 => Ok(()),
        _ => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// `cuMemPrefetchAsync` (CUDA 8 to 12: a device ordinal).
#[no_mangle]
pub extern "C" fn cuMemPrefetchAsync(
    p: CUdeviceptr,
    n: usize,
    _device: i32,
    _s: Handle,
) -> CUresult {
    entry(|| managed_range(p, n))
}

/// `cuMemPrefetchAsync_v2` (CUDA 12.2 on; CUDA 13's `cuMemPrefetchAsync`).
#[no_mangle]
pub extern "C" fn cuMemPrefetchAsync_v2(
    p: CUdeviceptr,
    n: usize,
    _to: MemLocation,
    _flags: u32,
    _s: Handle,
) -> CUresult {
    entry(|| managed_range(p, n))
}

/// `cuMemAdvise`: advice has nothing to steer here.
#[no_mangle]
pub extern "C" fn cuMemAdvise(p: CUdeviceptr, n: usize, _advice: i32, _device: i32) -> CUresult {
    entry(|| managed_range(p, n))
}

/// `cuMemAdvise_v2` (CUDA 12.2 on; CUDA 13's `cuMemAdvise`).
#[no_mangle]
pub extern "C" fn cuMemAdvise_v2(
    p: CUdeviceptr,
    n: usize,
    _advice: i32,
    _to: MemLocation,
) -> CUresult {
    entry(|| managed_range(p, n))
}

/// `cuStreamAttachMemAsync`: every stream sees managed memory here, so
/// attaching changes nothing; single-stream attachment is refused as in
/// [`cuMemAllocManaged`].
#[no_mangle]
pub extern "C" fn cuStreamAttachMemAsync(
    _s: Handle,
    p: CUdeviceptr,
    n: usize,
    flags: u32,
) -> CUresult {
    entry(|| {
        if flags != cu::MEM_ATTACH_GLOBAL && flags != cu::MEM_ATTACH_HOST {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // A length of 0 means the whole allocation.
        let d = driver()?;
        let o = d.objects();
        match o.allocs().alloc_at(p, n as u64) {
            Some((start, a)) if a.managed && (n > 0 || start == p) => Ok(()),
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    })
}

/// The flags host memory was allocated (or registered) with.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) -> CUresult {
    entry(|| {
        let d = driver()?;
        let f = d
            .objects()
            .host()
            .host_at(p as usize, 1)
            .map(|(_, h)| h.flags)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(flags, f) }
    })
}

/// Only `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` can be set, and every copy of
/// device memory is synchronous with the work before it here already.
#[no_mangle]
pub unsafe extern "C" fn cuPointerSetAttribute(
    value: *const c_void,
    attr: i32,
    p: CUdeviceptr,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        if attr != cu::POINTER_SYNC_MEMOPS || value.is_null() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        range_device(d, p, 1).map(drop)
    })
}

/// A copy between the memory of two contexts: a device-to-device copy,
/// staged through host memory between two devices.
fn copy_peer(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
    stream: Handle,
) -> CuResult {
    let d = driver()?;
    // The contexts must be live; the addresses say which devices.
    d.ctx_device(dst_ctx as usize)?;
    d.ctx_device(src_ctx as usize)?;
    dtod(dst, src, n, stream)
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
) -> CUresult {
    entry(|| {
        copy_peer(dst, dst_ctx, src, src_ctx, n, std::ptr::null_mut())?;
        // The synchronous form returns once the copy is done.
        let d = driver()?;
        d.gpu(d.ctx_device(dst_ctx as usize)?)?.sync()
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
    s: Handle,
) -> CUresult {
    entry(|| copy_peer(dst, dst_ctx, src, src_ctx, n, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(order: u32) -> MemcpyAttributes {
        MemcpyAttributes {
            src_access_order: order,
            src_loc_hint: [0; 2],
            dst_loc_hint: [0; 2],
            flags: 0,
        }
    }

    /// A batch of `count` copies with `sets` attribute sets starting at
    /// `idxs`: what the call says, and the failed index it gives back.
    fn batch(count: usize, sets: &[MemcpyAttributes], idxs: &[usize]) -> (CuResult, usize) {
        let (dsts, srcs, sizes) = (vec![0u64; count], vec![0u64; count], vec![0usize; count]);
        let mut fail = 7;
        // SAFETY: arrays of the lengths given, a valid out-parameter.
        let r = unsafe {
            memcpy_batch(
                dsts.as_ptr(),
                srcs.as_ptr(),
                sizes.as_ptr(),
                count,
                sets.as_ptr(),
                idxs.as_ptr(),
                sets.len(),
                &mut fail,
                std::ptr::null_mut(),
            )
        };
        (r, fail)
    }

    #[test]
    fn malformed_copy_batches_are_refused_before_any_copy() {
        let stream = attrs(SRC_ACCESS_STREAM);
        let bad = cu::ERROR_INVALID_VALUE;
        // No copies; no attributes; more sets than copies.
        assert_eq!(batch(0, &[stream], &[0]), (Err(bad), usize::MAX));
        assert_eq!(batch(2, &[], &[]), (Err(bad), usize::MAX));
        assert_eq!(batch(1, &[stream, stream], &[0, 1]), (Err(bad), usize::MAX));
        // Sets not from copy 0, not increasing, past the last copy.
        assert_eq!(batch(3, &[stream], &[1]), (Err(bad), usize::MAX));
        assert_eq!(batch(3, &[stream, stream], &[0, 0]), (Err(bad), usize::MAX));
        assert_eq!(batch(3, &[stream, stream], &[0, 3]), (Err(bad), usize::MAX));
        // Unknown access orders and flags.
        assert_eq!(batch(1, &[attrs(0)], &[0]), (Err(bad), usize::MAX));
        assert_eq!(batch(1, &[attrs(4)], &[0]), (Err(bad), usize::MAX));
        let mut flagged = stream;
        flagged.flags = 2;
        assert_eq!(batch(1, &[flagged], &[0]), (Err(bad), usize::MAX));
    }
}
