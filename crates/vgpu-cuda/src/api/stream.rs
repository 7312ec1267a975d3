//! Streams, stream capture and events. A stream's work goes to its
//! device's queue ([`crate::inflight`]), or into its capture's graph
//! ([`crate::graphs`]); an event is a TIMESTAMP in that queue, so its time
//! is the device clock when the work before it finished.

use std::ffi::c_void;

use crate::cu::{self, CUresult, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::graphs::{self, Unsafe};
use vgpu_guest::Batch;

use crate::state::{driver, Driver};
use crate::stream_table::{Event, Stream};
use crate::streams::{event_done, event_record, record_on, stream_field, stream_id, wait_across};

fn create_stream(pstream: *mut Handle, flags: u32, priority: i32) -> CuResult {
    let d = driver()?;
    let (ctx, device) = d.current_ctx()?;
    let stream = Stream {
        ctx,
        lane: d.gpu(device)?.lanes.pick(flags & STREAM_NON_BLOCKING == 0),
        flags,
        priority: priority.clamp(-5, 0),
        attrs: Default::default(),
    };
    let h = d
        .objects()
        .file(|o, h| o.streams_mut().streams.insert(h, stream));
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(pstream, h as Handle) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(pstream: *mut Handle, flags: u32) -> CUresult {
    entry(|| create_stream(pstream, flags, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    pstream: *mut Handle,
    flags: u32,
    priority: i32,
) -> CUresult {
    entry(|| create_stream(pstream, flags, priority))
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        {
            let mut o = d.objects();
            o.streams_mut().streams.remove(stream as usize)?;
            o.forget_stream_capture(stream as usize);
        }
        crate::allocs::free_released(d);
        Ok(())
    })
}

fn sync_stream(d: &Driver, stream: Handle) -> CuResult {
    let g = d.stream_gpu(stream as usize)?;
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    g.sync_lane(d.stream_lane(stream as usize)?)
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    entry(|| sync_stream(driver()?, stream))
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let g = d.stream_gpu(stream as usize)?;
        d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
        if g.idle(d.stream_lane(stream as usize)?)? {
            Ok(())
        } else {
            Err(cu::ERROR_NOT_READY)
        }
    })
}

/// `CUstreamCallback`.
pub type StreamCallback = unsafe extern "C" fn(stream: Handle, status: CUresult, user: *mut c_void);

/// Runs a host function at its place in `stream`: once the work queued
/// before it is done, before any queued after it. The call waits for the
/// device to be idle (every lane) and runs the function on the caller's
/// thread before returning, which keeps both orders (more strictly than
/// CUDA needs; the function may not call CUDA, as CUDA requires).
/// Returns the failure of earlier work, left for the next
/// synchronisation to report as well.
fn run_host_fn(stream: Handle, f: impl FnOnce(CUresult)) -> CuResult {
    let d = driver()?;
    let g = d.stream_gpu(stream as usize)?;
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    g.wait_idle();
    f(g.lanes.pending_error().unwrap_or(cu::SUCCESS));
    Ok(())
}

/// Queued as work of its own ([`Driver::queue`] runs it in order): on a
/// stream being captured it becomes a host node of the graph.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: Handle,
    f: Option<cu::HostFn>,
    user: *mut c_void,
) -> CUresult {
    entry(|| {
        let f = f.ok_or(cu::ERROR_INVALID_VALUE)?;
        let d = driver()?;
        let device = d.stream_device(stream as usize)?;
        let call = crate::work::HostCall {
            f,
            user: user as usize,
        };
        d.queue(stream as usize, device, &[crate::work::Work::Host(call)])
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: Handle,
    f: Option<StreamCallback>,
    user: *mut c_void,
    flags: u32,
) -> CUresult {
    entry(|| {
        let f = f.ok_or(cu::ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        run_host_fn(stream, |status| {
            // SAFETY: as in `cuLaunchHostFunc`; the status is the stream's.
            unsafe { f(stream, status, user) }
        })
    })
}

/// On the device a wait across lanes joins the record's lane (see
/// [`crate::lanes`]); a stream that waits on an event recorded in a
/// capture joins that capture.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: Handle, event: Handle, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let device = d.stream_device(stream as usize)?;
        let captured = d.objects().graphs().is_capturing(stream as usize);
        if captured && flags & cu::EVENT_WAIT_EXTERNAL != 0 {
            // An event wait node of the capture's graph.
            d.objects().streams().events.get(event as usize)?;
            return d.queue(
                stream as usize,
                device,
                &[crate::work::Work::Wait(event as usize)],
            );
        }
        d.objects().wait_event(stream as usize, event as usize)?;
        if !captured {
            wait_across(d, device, d.stream_lane(stream as usize)?, event)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(stream: Handle, flags: *mut u32) -> CUresult {
    entry(|| {
        let v = stream_field(stream, 0, |s| s.flags)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(flags, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(stream: Handle, priority: *mut i32) -> CUresult {
    entry(|| {
        let v = stream_field(stream, 0, |s| s.priority)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(priority, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(stream: Handle, pctx: *mut Handle) -> CUresult {
    entry(|| {
        let current = driver()?.current().unwrap_or(0);
        let v = stream_field(stream, current, |s| s.ctx)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pctx, v as Handle) }
    })
}

/// The CUDA 12.5 form, which also names the stream's green context:
/// there are none here.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    stream: Handle,
    pctx: *mut Handle,
    pgreen: *mut Handle,
) -> CUresult {
    entry(|| {
        let current = driver()?.current().unwrap_or(0);
        let v = stream_field(stream, current, |s| s.ctx)?;
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put(pctx, v as Handle)?;
            ffi::put(pgreen, std::ptr::null_mut())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(stream: Handle, id: *mut u64) -> CUresult {
    entry(|| {
        let v = stream_id(stream)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(id, v) }
    })
}

/// Starts capturing `stream` in `mode` (`CUstreamCaptureMode`).
fn begin_capture(stream: Handle, mode: u32) -> CuResult {
    let d = driver()?;
    let device = d.stream_device(stream as usize)?;
    d.objects()
        .begin_capture(stream as usize, device, mode)
        .map(drop)
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(stream: Handle, mode: u32) -> CUresult {
    entry(|| begin_capture(stream, mode))
}

/// The CUDA 10.0 form, before capture modes: global mode.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture(stream: Handle) -> CUresult {
    entry(|| begin_capture(stream, graphs::MODE_GLOBAL))
}

/// Ends the capture `stream` began; its graph, or null (and
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) if the capture was broken.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, pgraph: *mut Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.stream_gpu(stream as usize)?;
        if pgraph.is_null() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let r = d.objects().end_capture(stream as usize);
        crate::allocs::free_released(d);
        match r {
            // SAFETY: the caller's out-parameter, checked non-null.
            Ok(g) => unsafe { ffi::put(pgraph, g as Handle) },
            Err(e @ cu::ERROR_STREAM_CAPTURE_INVALIDATED) => {
                // SAFETY: as above.
                unsafe { ffi::put(pgraph, std::ptr::null_mut()) }?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Handle, status: *mut u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        stream_field(stream, (), |_| ())?;
        let (s, _, _) = d.objects().capture_info(stream as usize);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(status, s) }
    })
}

/// The stream's capture status, and the optional outputs: the capture
/// id and graph; no dependencies are reported (a graph here has no
/// edges: its work replays in the order it was recorded).
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: Handle,
    status: *mut u32,
    id: *mut u64,
    graph: *mut Handle,
    deps: *mut *const Handle,
    edges: *mut *const c_void,
    ndeps: *mut usize,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        stream_field(stream, (), |_| ())?;
        let (s, capture, g) = d.objects().capture_info(stream as usize);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(status, s) }?;
        // SAFETY: optional out-parameters, null when not wanted.
        unsafe {
            ffi::put_opt(id, capture)?;
            ffi::put_opt(graph, g as Handle)?;
            ffi::put_opt(deps, std::ptr::null())?;
            ffi::put_opt(edges, std::ptr::null())?;
            ffi::put_opt(ndeps, 0)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: Handle,
    status: *mut u32,
    id: *mut u64,
) -> CUresult {
    let none = std::ptr::null_mut();
    // SAFETY: the caller's pointers.
    unsafe {
        cuStreamGetCaptureInfo_v3(
            stream,
            status,
            id,
            none,
            none.cast(),
            none.cast(),
            none.cast(),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: Handle,
    status: *mut u32,
    id: *mut u64,
    graph: *mut Handle,
    deps: *mut *const Handle,
    ndeps: *mut usize,
) -> CUresult {
    // SAFETY: the caller's pointers.
    unsafe {
        cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, std::ptr::null_mut(), ndeps)
    }
}

/// The calling thread's capture mode, which decides whether it may
/// synchronise a context while another stream is captured.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    entry(|| {
        // SAFETY: the caller's in/out parameter.
        let new = unsafe { ffi::get(mode.cast_const()) }?;
        if new > graphs::MODE_RELAXED {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let old = graphs::exchange_thread_mode(new);
        // SAFETY: as above.
        unsafe { ffi::put(mode, old) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(pevent: *mut Handle, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.current_ctx()?;
        let event = Event {
            flags,
            records: 0,
            device: 0,
            lane: 0,
            captured: None,
        };
        let h = d
            .objects()
            .file(|o, h| o.streams_mut().events.insert(h, event));
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pevent, h as Handle) }
    })
}

fn record(event: Handle, stream: Handle) -> CuResult {
    let d = driver()?;
    record_on(d, d.stream_gpu(stream as usize)?, event, stream)
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    entry(|| record(event, stream))
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(event: Handle, stream: Handle, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        if flags & cu::EVENT_RECORD_EXTERNAL != 0
            && d.objects().graphs().is_capturing(stream as usize)
        {
            // An event record node of the capture's graph.
            d.objects().streams().events.get(event as usize)?;
            let device = d.stream_device(stream as usize)?;
            return d.queue(
                stream as usize,
                device,
                &[crate::work::Work::Record(event as usize)],
            );
        }
        record(event, stream)
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    entry(|| event_done(event, true).map(drop))
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    entry(|| {
        if event_done(event, false)? {
            Ok(())
        } else {
            Err(cu::ERROR_NOT_READY)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let stamp = |e: Handle| -> CuResult<u64> {
            let (record, device, lane, flags) = event_record(d, e)?;
            if record == 0 || flags & cu::EVENT_DISABLE_TIMING != 0 {
                return Err(cu::ERROR_INVALID_HANDLE);
            }
            let g = d.gpu(device)?;
            if !g.event_done(lane, e as usize, record, false)? {
                return Err(cu::ERROR_NOT_READY);
            }
            g.lanes
                .inflight(lane)
                .stamp(e as usize, record)
                .ok_or(cu::ERROR_INVALID_HANDLE)
        };
        let (a, b) = (stamp(start)?, stamp(end)?);
        let v = (b as f64 - a as f64) / 1e6;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(ms, v as f32) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuEventElapsedTime_v2(ms, start, end) }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let e = d.objects().streams_mut().events.remove(event as usize)?;
        d.gpu(e.device)?
            .lanes
            .inflight(e.lane)
            .forget(event as usize);
        Ok(())
    })
}

/// The device a stream's work runs on.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(stream: Handle, dev: *mut i32) -> CUresult {
    entry(|| {
        let d = driver()?.stream_device(stream as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(dev, d) }
    })
}

/// Launch attributes a stream may carry: hints (an L2 access policy, a
/// synchronisation policy, memory synchronisation domains) the device
/// honours by ignoring them, and the priority.
fn stream_attr_ok(attr: u32) -> bool {
    matches!(
        attr,
        cu::LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
            | cu::LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY
            | cu::LAUNCH_ATTRIBUTE_PRIORITY
            | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
            | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN
    )
}

/// Applies `f` to stream `stream`'s object; the default streams have
/// none, and carry no attributes.
fn with_stream<T>(stream: Handle, f: impl FnOnce(&mut Stream) -> CuResult<T>) -> CuResult<T> {
    let d = driver()?;
    d.stream_device(stream as usize)?;
    let mut o = d.objects();
    f(o.streams_mut().streams.get_mut(stream as usize)?)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetAttribute(
    stream: Handle,
    attr: u32,
    out: *mut cu::CUlaunchAttributeValue,
) -> CUresult {
    entry(|| {
        if !stream_attr_ok(attr) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let v = with_stream(stream, |s| {
            let mut v = s.attrs.get(&attr).copied().unwrap_or_default();
            if attr == cu::LAUNCH_ATTRIBUTE_PRIORITY {
                v[0] = s.priority as u32;
            }
            Ok(v)
        })?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSetAttribute(
    stream: Handle,
    attr: u32,
    value: *const cu::CUlaunchAttributeValue,
) -> CUresult {
    entry(|| {
        if !stream_attr_ok(attr) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's value (null is refused).
        let v = unsafe { ffi::get(value) }?;
        if attr == cu::LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW {
            crate::devices::check_access_policy_window(&v)?;
        }
        with_stream(stream, |s| {
            if attr == cu::LAUNCH_ATTRIBUTE_PRIORITY {
                s.priority = (v[0] as i32).clamp(-5, 0);
            } else {
                s.attrs.insert(attr, v);
            }
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cuStreamCopyAttributes(dst: Handle, src: Handle) -> CUresult {
    entry(|| {
        let (attrs, priority) = with_stream(src, |s| Ok((s.attrs.clone(), s.priority)))?;
        with_stream(dst, |s| {
            s.attrs = attrs;
            s.priority = priority;
            Ok(())
        })
    })
}

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the
/// legacy default stream.
const STREAM_NON_BLOCKING: u32 = 0x1;

/// `CU_STREAM_WAIT_VALUE_FLUSH`: a GPU's flush of remote writes before
/// the wait; the device's reads of guest memory need none.
const WAIT_VALUE_FLUSH: u32 = 1 << 30;
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`: the device's write follows
/// the stream's earlier work either way.
const WRITE_VALUE_NO_MEMORY_BARRIER: u32 = 1;
/// The most operations of one `cuStreamBatchMemOp`, as CUDA allows.
const MAX_BATCH_MEM_OPS: u32 = 256;

/// One stream memory operation on a word of page-locked host memory.
#[derive(Clone, Copy)]
enum MemOp {
    Wait {
        addr: u64,
        value: u64,
        wide: bool,
        flags: u32,
    },
    Write {
        addr: u64,
        value: u64,
        wide: bool,
        flags: u32,
    },
    /// A memory barrier or a flush of remote writes: the device's queue
    /// keeps its commands' order and reads guest memory afresh, so none
    /// is needed.
    Order,
}

/// Stream memory operations: the device writes, or holds the stream
/// until, 32- or 64-bit words of this process's page-locked host memory
/// that the device reaches (`cuMemHostAlloc`, `cuMemHostRegister`), as
/// WRITE_VALUE and WAIT_VALUE, queued together. Device memory words are
/// not offered (the device waits on guest memory only).
fn stream_mem_ops(name: &'static str, stream: Handle, ops: &[MemOp]) -> CuResult {
    let d = driver()?;
    let device = d.stream_device(stream as usize)?;
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    let g = d.gpu(device)?;
    let lane = d.stream_lane(stream as usize)?;
    let mut b = Batch::new();
    for &op in ops {
        let (addr, wide) = match op {
            MemOp::Wait { addr, wide, .. } | MemOp::Write { addr, wide, .. } => (addr, wide),
            MemOp::Order => continue,
        };
        let len = if wide { 8 } else { 4 };
        if addr == 0 || !addr.is_multiple_of(len as u64) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        match op {
            MemOp::Wait { value, flags, .. } => {
                if flags & !(3 | WAIT_VALUE_FLUSH) != 0 {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
                // A created stream that shares the default streams' queue
                // (one lane, or managed memory) would hold them too: a
                // program waiting on its CPU behind a synchronous copy
                // would never go on. Refused rather than hung.
                if stream as usize > 2 && g.lanes.route(lane) == 0 {
                    return Err(crate::state::unsupported_with(
                        name,
                        "the stream shares the default stream's queue (one lane, or managed memory)",
                    ));
                }
                // GEQ, EQ, AND, NOR: the device's conditions, in its bits 1-2.
                b.wait_value(addr as *const u8, value, (flags & 3) << 1, wide);
            }
            MemOp::Write { value, flags, .. } => {
                if flags & !WRITE_VALUE_NO_MEMORY_BARRIER != 0 {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
                b.write_value(addr as *const u8, value, wide);
            }
            MemOp::Order => {}
        }
        if !crate::copies::pinned_now(d, addr as usize, len, device) {
            return Err(crate::state::unsupported_with(
                name,
                "the word is not in page-locked host memory of this process",
            ));
        }
    }
    if b.is_empty() {
        return Ok(());
    }
    g.submit_on(lane, b, None)?;
    // On a GPU the operations are on their way at once: a program may wait
    // for a word from its CPU.
    g.flush()
}

/// `cuStreamBatchMemOp`'s operations (`CUstreamBatchMemOpParams`, 48
/// bytes each: the operation, then its address, value and flags).
fn batch_mem_ops(params: *const u8, count: u32, flags: u32) -> CuResult<Vec<MemOp>> {
    const SIZE: usize = 48;
    if flags != 0 || count > MAX_BATCH_MEM_OPS {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `count` unions.
    let raw = unsafe { ffi::bytes(params, count as usize * SIZE) }?;
    raw.chunks_exact(SIZE).map(mem_op).collect()
}

/// One `CUstreamBatchMemOpParams`: the operation (32 bits; a barrier's
/// or flush's flags follow it), then a wait's or write's address, value
/// and flags in the next three 64-bit words.
fn mem_op(u: &[u8]) -> CuResult<MemOp> {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&u[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let (operation, order_flags) = (word(0) as u32, (word(0) >> 32) as u32);
    let (addr, value, flags) = (word(1), word(2), word(3) as u32);
    Ok(match operation {
        1 => MemOp::Wait {
            addr,
            value: value & 0xffff_ffff,
            wide: false,
            flags,
        },
        4 => MemOp::Wait {
            addr,
            value,
            wide: true,
            flags,
        },
        2 => MemOp::Write {
            addr,
            value: value & 0xffff_ffff,
            wide: false,
            flags,
        },
        5 => MemOp::Write {
            addr,
            value,
            wide: true,
            flags,
        },
        // FLUSH_REMOTE_WRITES (flags 0) and BARRIER (SYS or GPU).
        3 if order_flags == 0 => MemOp::Order,
        6 if order_flags <= 1 => MemOp::Order,
        _ => return Err(cu::ERROR_INVALID_VALUE),
    })
}

#[no_mangle]
pub extern "C" fn cuStreamBatchMemOp(
    stream: Handle,
    count: u32,
    params: *const u8,
    flags: u32,
) -> CUresult {
    entry(|| {
        let ops = batch_mem_ops(params, count, flags)?;
        stream_mem_ops("cuStreamBatchMemOp", stream, &ops)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamBatchMemOp_v2(
    stream: Handle,
    count: u32,
    params: *const u8,
    flags: u32,
) -> CUresult {
    cuStreamBatchMemOp(stream, count, params, flags)
}

/// A stream memory operation's value as the device takes it.
fn value64(v: impl Into<u64>) -> u64 {
    v.into()
}

/// The single-operation entry points, each with its `_v2` name.
macro_rules! mem_op_entry_points {
    ($($name:ident, $v2:ident: $value:ty, $kind:ident, $wide:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(stream: Handle, addr: u64, value: $value, flags: u32) -> CUresult {
            entry(|| {
                let op = MemOp::$kind {
                    addr,
                    value: value64(value),
                    wide: $wide,
                    flags,
                };
                stream_mem_ops(stringify!($name), stream, &[op])
            })
        }

        #[no_mangle]
        pub extern "C" fn $v2(stream: Handle, addr: u64, value: $value, flags: u32) -> CUresult {
            $name(stream, addr, value, flags)
        }
    )*};
}

mem_op_entry_points! {
    cuStreamWaitValue32, cuStreamWaitValue32_v2: u32, Wait, false;
    cuStreamWaitValue64, cuStreamWaitValue64_v2: u64, Wait, true;
    cuStreamWriteValue32, cuStreamWriteValue32_v2: u32, Write, false;
    cuStreamWriteValue64, cuStreamWriteValue64_v2: u64, Write, true;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(ops: &[[u64; 4]]) -> Vec<u8> {
        let mut raw = Vec::new();
        for op in ops {
            for w in op.iter().chain(&[0, 0]) {
                raw.extend_from_slice(&w.to_ne_bytes());
            }
        }
        raw
    }

    #[test]
    fn batch_mem_ops_are_read_as_cuda_lays_them_out() {
        let raw = params(&[
            [1, 0x1000, 0xdead_0000_0007, 2],
            [5, 0x2008, u64::MAX, 0],
            [6 | 1 << 32, 0, 0, 0],
            [3, 0, 0, 0],
        ]);
        let ops = batch_mem_ops(raw.as_ptr(), 4, 0).unwrap();
        assert!(matches!(
            ops[0],
            MemOp::Wait {
                addr: 0x1000,
                value: 7,
                wide: false,
                flags: 2
            }
        ));
        assert!(matches!(
            ops[1],
            MemOp::Write {
                addr: 0x2008,
                value: u64::MAX,
                wide: true,
                flags: 0
            }
        ));
        assert!(matches!(ops[2], MemOp::Order));
        assert!(matches!(ops[3], MemOp::Order));
    }

    #[test]
    fn bad_batch_mem_ops_are_refused() {
        let good = params(&[[2, 0x1000, 1, 0]]);
        assert_eq!(
            batch_mem_ops(good.as_ptr(), 1, 1).err(),
            Some(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            batch_mem_ops(good.as_ptr(), MAX_BATCH_MEM_OPS + 1, 0).err(),
            Some(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            batch_mem_ops(std::ptr::null(), 1, 0).err(),
            Some(cu::ERROR_INVALID_VALUE)
        );
        assert!(batch_mem_ops(std::ptr::null(), 0, 0).unwrap().is_empty());
        for bad in [
            [0, 0, 0, 0],
            [7, 0, 0, 0],
            [3 | 1 << 32, 0, 0, 0],
            [6 | 2 << 32, 0, 0, 0],
        ] {
            let raw = params(&[bad]);
            assert_eq!(
                batch_mem_ops(raw.as_ptr(), 1, 0).err(),
                Some(cu::ERROR_INVALID_VALUE)
            );
        }
    }
}
