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

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, flags: u32, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        let h = d
            .objects()
            .file(|o, h| o.ctxs_mut().ctxs.insert(h, Ctx::new(dev, flags)));
        d.push_current(h);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pctx, h as Handle) }
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

/// No L2 lines are set aside for persisting accesses here, so there is
/// nothing to reset.
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
