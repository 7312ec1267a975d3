//! Contexts and the per-thread context stack.

use crate::ctx_table::Ctx;
use crate::cu::{self, CUdevice, CUresult, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::graphs::Unsafe;
use crate::state::{driver, Driver};

/// The context a call names: `ctx`, or the current one when null.
fn named_ctx(d: &Driver, ctx: Handle) -> CuResult<usize> {
    let ctx = if ctx.is_null() {
        d.current().ok_or(cu::ERROR_INVALID_CONTEXT)?
    } else {
        ctx as usize
    };
    d.ctx_device(ctx)?;
    Ok(ctx)
}

/// Waits for all work of the device behind `ctx`: refused while a
/// global-mode capture on it is in progress, which it would break.
fn synchronize(d: &Driver, ctx: usize) -> CuResult {
    let device = d.ctx_device(ctx)?;
    let g = d.gpu(device)?;
    d.refuse_in_capture(Unsafe::Device(device))?;
    g.sync()
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    entry(|| {
        let c = driver()?.current().unwrap_or(0);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pctx, c as Handle) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        if ctx.is_null() {
            d.set_current(None);
        } else {
            d.ctx_device(ctx as usize)?;
            d.set_current(Some(ctx as usize));
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.ctx_device(ctx as usize)?;
        d.push_current(ctx as usize);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    entry(|| {
        let c = driver()?.pop_current().ok_or(cu::ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { ffi::put(pctx, c as Handle) }?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    entry(|| {
        let (_, dev) = driver()?.current_ctx()?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(device, dev) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let dev = d.ctx_device(named_ctx(d, ctx)?)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(device, dev) }
    })
}

/// Peer access from the current context to `peer`'s memory: vGPUs have
/// none (`cuDeviceCanAccessPeer` says 0); copies between them are staged
/// through host memory without it.
#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (_, dev) = d.current_ctx()?;
        let other = d.ctx_device(peer as usize)?;
        if flags != 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        Err(if other == dev {
            cu::ERROR_INVALID_DEVICE
        } else {
            cu::ERROR_PEER_ACCESS_UNSUPPORTED
        })
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.current_ctx()?;
        d.ctx_device(peer as usize)?;
        Err(cu::ERROR_PEER_ACCESS_NOT_ENABLED)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        synchronize(d, ctx)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize_v2(ctx: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        synchronize(d, named_ctx(d, ctx)?)
    })
}

/// `CUctx_flags` a context may be created with (`CU_CTX_FLAGS_MASK`),
/// and the scheduling part of them, of which one at most may be set.
const CTX_FLAGS_MASK: u32 = 0xff;
const CTX_SCHED_MASK: u32 = 0x07;

/// `CU_EXEC_AFFINITY_TYPE_SM_COUNT`, the one execution affinity type.
const EXEC_AFFINITY_SM_COUNT: u32 = 0;

/// `CUexecAffinityParam`: a type and its value (a union of one `u32`).
#[repr(C)]
#[derive(Clone, Copy)]
struct ExecAffinityParam {
    kind: u32,
    value: u32,
}

/// `CUctxCreateParams` (CUDA 12.5): execution affinity, or a context
/// shared with a graphics API (CIG); both null is an ordinary context.
#[repr(C)]
#[derive(Clone, Copy)]
struct CtxCreateParams {
    exec_affinity: *const ExecAffinityParam,
    num_exec_affinity: i32,
    cig: *const std::ffi::c_void,
}

/// Checks context creation flags: known ones, one scheduling flag at
/// most.
fn check_flags(flags: u32) -> CuResult {
    if flags & !CTX_FLAGS_MASK != 0 || (flags & CTX_SCHED_MASK).count_ones() > 1 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Creates a context of `dev` with `flags`, pushed onto the calling
/// thread's stack; its handle to `pctx`. It shares the process's device
/// context with the primary one, as a process's contexts share its
/// address space.
///
/// # Safety
/// `pctx` is the caller's out-parameter.
unsafe fn create_ctx(pctx: *mut Handle, flags: u32, dev: CUdevice) -> CuResult {
    let d = driver()?;
    d.gpu(dev)?;
    check_flags(flags)?;
    // SAFETY: the caller's out-parameter, checked before the context
    // is made.
    unsafe { ffi::put(pctx, std::ptr::null_mut()) }?;
    let h = d
        .objects()
        .file(|o, h| o.ctxs_mut().ctxs.insert(h, Ctx::new(dev, flags)));
    d.push_current(h);
    // SAFETY: as above.
    unsafe { ffi::put(pctx, h as Handle) }
}

/// Checks execution affinity parameters (`count` of them at `params`):
/// none (a count of 0 or less) is an ordinary context; any is
/// `CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY`, as NVIDIA's driver answers
/// without MPS (a vGPU's contexts cannot be limited to some of its SMs),
/// whatever the parameters say.
fn check_exec_affinity(params: *const ExecAffinityParam, count: i32) -> CuResult {
    if count <= 0 {
        return Ok(());
    }
    if params.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    crate::diag::log("execution affinity (SM counts) needs MPS, which a vGPU does not offer");
    Err(cu::ERROR_UNSUPPORTED_EXEC_AFFINITY)
}

/// CIG's shared data types: a D3D12 command queue, NVIDIA's blob.
const CIG_DATA_TYPES: [u32; 2] = [1, 2];

/// `CUctxCigParam`: what a graphics API shares with the context.
#[repr(C)]
#[derive(Clone, Copy)]
struct CigParam {
    kind: u32,
    data: *const std::ffi::c_void,
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, flags: u32, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { create_ctx(pctx, flags, dev) })
}

/// CUDA 11.4's form, with execution affinity parameters (none: an
/// ordinary context).
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    params: *const std::ffi::c_void,
    count: i32,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        driver()?.gpu(dev)?;
        check_exec_affinity(params.cast(), count)?;
        // SAFETY: the caller's out-parameter.
        unsafe { create_ctx(pctx, flags, dev) }
    })
}

/// CUDA 12.5's form, `cuCtxCreate` of CUDA 13's `cuda.h`: null
/// parameters, or parameters with neither execution affinity nor CIG,
/// make an ordinary context. A vGPU shares nothing with a graphics API
/// (`CU_DEVICE_ATTRIBUTE_*_CIG_SUPPORTED` read 0), so a CIG context is
/// `CUDA_ERROR_NOT_SUPPORTED`, as NVIDIA documents for a device without
/// it.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Handle,
    params: *const std::ffi::c_void,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        if !params.is_null() {
            // SAFETY: the caller's parameters.
            let p = unsafe { ffi::get(params.cast::<CtxCreateParams>()) }?;
            match (p.exec_affinity.is_null(), p.cig.is_null()) {
                (true, true) => {}
                (false, false) => return Err(cu::ERROR_INVALID_VALUE),
                (false, true) => check_exec_affinity(p.exec_affinity, p.num_exec_affinity)?,
                (true, false) => {
                    // SAFETY: the caller's CIG parameters.
                    let cig = unsafe { ffi::get(p.cig.cast::<CigParam>()) }?;
                    if cig.data.is_null() || !CIG_DATA_TYPES.contains(&cig.kind) {
                        return Err(cu::ERROR_INVALID_VALUE);
                    }
                    return Err(d.not_supported_because(
                        "cuCtxCreate",
                        "contexts shared with a graphics API (CIG)",
                    ));
                }
            }
        }
        // SAFETY: the caller's out-parameter.
        unsafe { create_ctx(pctx, flags, dev) }
    })
}

/// Whether contexts of `dev` may be limited by execution affinity of
/// `kind`: not on a vGPU (see [`check_exec_affinity`]), of any type, as
/// NVIDIA's driver answers without MPS.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut i32,
    _kind: u32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        driver()?.gpu(dev)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pi, 0) }
    })
}

/// The current context's execution affinity of `kind`: a context that
/// could not be limited has all its device's SMs; other types are
/// `CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY`, as NVIDIA's driver answers.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetExecAffinity(
    affinity: *mut std::ffi::c_void,
    kind: u32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (_, g) = d.current_gpu()?;
        if kind != EXEC_AFFINITY_SM_COUNT {
            return Err(cu::ERROR_UNSUPPORTED_EXEC_AFFINITY);
        }
        let sms = crate::devices::attribute(g, cu::ATTR_MULTIPROCESSOR_COUNT)?;
        let value = ExecAffinityParam {
            kind,
            value: sms as u32,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(affinity.cast::<ExecAffinityParam>(), value) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let ctx = ctx as usize;
        if d.gpus.iter().any(|g| g.primary == ctx) {
            // Primary contexts are released, not destroyed.
            return Err(cu::ERROR_INVALID_CONTEXT);
        }
        let device = d.objects().ctxs_mut().ctxs.remove(ctx)?.device();
        // Its work ends first, and what its kernels printed comes out.
        d.gpu(device)?.wait_idle();
        if d.current() == Some(ctx) {
            d.pop_current();
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        let f = d.objects().ctxs().ctxs.get(ctx).map_or(0, |c| c.flags());
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(flags, f) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetFlags(flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        if let Ok(c) = d.objects().ctxs_mut().ctxs.get_mut(ctx) {
            c.set_flags(flags);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        let v = {
            let o = d.objects();
            o.ctxs().ctxs.get(ctx)?.limit(limit)?
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(value, v) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: u32, value: usize) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (ctx, _) = d.current_ctx()?;
        if crate::ctx_table::READ_ONLY_LIMITS.contains(&limit) {
            return Err(cu::ERROR_UNSUPPORTED_LIMIT);
        }
        if limit == cu::LIMIT_PERSISTING_L2_CACHE_SIZE
            && value > crate::devices::MAX_PERSISTING_L2_BYTES
        {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let mut o = d.objects();
        o.ctxs_mut().ctxs.get_mut(ctx)?.set_limit(limit, value)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: Handle, version: *mut u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        named_ctx(d, ctx)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(version, 3020) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut i32,
    greatest: *mut i32,
) -> CUresult {
    entry(|| {
        driver()?.current_ctx()?;
        // SAFETY: the caller's out-parameters, either may be null.
        unsafe {
            ffi::put_opt(least, 0)?;
            ffi::put_opt(greatest, -5)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: Handle, id: *mut u64) -> CUresult {
    entry(|| {
        let d = driver()?;
        let c = named_ctx(d, ctx)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(id, c as u64) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut u32) -> CUresult {
    entry(|| {
        driver()?.current_ctx()?;
        // SAFETY: the caller's out-parameter: CU_FUNC_CACHE_PREFER_NONE.
        unsafe { ffi::put(config, 0) }
    })
}

/// A cache preference is a hint; a device without a configurable L1
/// accepts and ignores it, as CUDA documents.
#[no_mangle]
pub extern "C" fn cuCtxSetCacheConfig(_config: u32) -> CUresult {
    entry(|| driver()?.current_ctx().map(drop))
}

/// Bank sizes are fixed on the GPUs this reports: the setting is
/// accepted and ignored, as CUDA does there.
#[no_mangle]
pub extern "C" fn cuCtxSetSharedMemConfig(config: u32) -> CUresult {
    entry(|| {
        if config > 2 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        driver()?.current_ctx().map(drop)
    })
}

/// Persisting accesses are hints the device honours by ignoring them,
/// so no L2 lines are held to reset.
#[no_mangle]
pub extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    entry(|| driver()?.current_ctx().map(drop))
}

/// Records `event` after all the work of context `ctx` so far: a device
/// runs a process's work in order, so a record on its queue is that.
#[no_mangle]
pub extern "C" fn cuCtxRecordEvent(ctx: Handle, event: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let device = d.ctx_device(ctx as usize)?;
        if d.objects().graphs().any_capturing() {
            return Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        crate::streams::record_on(d, d.gpu(device)?, event, std::ptr::null_mut())
    })
}

/// Makes later work of context `ctx` wait for `event`: work of the same
/// device already follows it in the device's queue; a record on another
/// device is waited for here.
#[no_mangle]
pub extern "C" fn cuCtxWaitEvent(ctx: Handle, event: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let device = d.ctx_device(ctx as usize)?;
        let (records, on) = {
            let o = d.objects();
            let e = o.streams().events.get(event as usize)?;
            (e.records, e.device)
        };
        if records > 0 && on != device {
            crate::streams::event_done(event, true)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut u32) -> CUresult {
    entry(|| {
        driver()?.current_ctx()?;
        // SAFETY: the caller's out-parameter: 4-byte banks.
        unsafe { ffi::put(config, 1) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_flags_are_checked() {
        for ok in [0, 1, 2, 4, 0x08 | 0x04, 0x80 | 0x01, 0xf8] {
            assert_eq!(check_flags(ok), Ok(()), "{ok:#x}");
        }
        for bad in [3, 5, 6, 7, 0x100, 0x8000_0000] {
            assert_eq!(check_flags(bad), Err(cu::ERROR_INVALID_VALUE), "{bad:#x}");
        }
    }

    #[test]
    fn execution_affinity_is_refused_as_without_mps() {
        let sm = |value| ExecAffinityParam {
            kind: EXEC_AFFINITY_SM_COUNT,
            value,
        };
        // Any parameters, as NVIDIA's driver answers without MPS.
        for p in [
            [sm(4), sm(132)],
            [sm(0), ExecAffinityParam { kind: 7, value: 4 }],
        ] {
            assert_eq!(
                check_exec_affinity(p.as_ptr(), 2),
                Err(cu::ERROR_UNSUPPORTED_EXEC_AFFINITY)
            );
        }
        // None: an ordinary context, the array unread.
        assert_eq!(check_exec_affinity(std::ptr::null(), 0), Ok(()));
        assert_eq!(check_exec_affinity([sm(4)].as_ptr(), -1), Ok(()));
        // A count without an array.
        assert_eq!(
            check_exec_affinity(std::ptr::null(), 1),
            Err(cu::ERROR_INVALID_VALUE)
        );
    }
}
