//! Stream order: the device and lane of a stream, work queued on a
//! stream (into its capture, or onto its device's lane in batches), and
//! events recorded on a stream and waited for across lanes and devices.

use vgpu_guest::Batch;

use crate::cu::{self, CUdevice, CuResult, Handle};
use crate::graphs::{self, Unsafe};
use crate::state::{driver, Driver, Gpu};
use crate::stream_table::Stream;
use crate::work::Work;

impl Driver {
    /// The device a stream's work runs on: the stream's context's, or for
    /// the default streams (0, 1 = legacy, 2 = per-thread) the current
    /// context's.
    pub fn stream_gpu(&self, stream: usize) -> CuResult<&Gpu> {
        self.gpu(self.stream_device(stream)?)
    }

    /// The lane of its device a stream's work goes to (the default
    /// streams: 0).
    pub fn stream_lane(&self, stream: usize) -> CuResult<usize> {
        if stream <= 2 {
            return Ok(0);
        }
        let o = self.objects();
        Ok(o.streams().streams.get(stream)?.lane)
    }

    /// The ordinal of [`Driver::stream_gpu`]'s device.
    pub fn stream_device(&self, stream: usize) -> CuResult<CUdevice> {
        if stream <= 2 {
            return Ok(self.current_ctx()?.1);
        }
        let ctx = self.objects().streams().streams.get(stream)?.ctx;
        self.ctx_device(ctx)
    }

    /// Refuses a call that a capture in progress cannot record,
    /// invalidating the capture (see
    /// [`Objects::refuse_in_capture`](crate::objects::Objects::refuse_in_capture)).
    pub fn refuse_in_capture(&self, call: Unsafe) -> CuResult {
        let relaxed = graphs::thread_relaxed();
        self.objects().refuse_in_capture(call, relaxed)
    }

    /// Queues `work` for `device` on `stream`: into the stream's capture
    /// if it is being captured, else on the device's queue in batches of
    /// at most [`crate::inflight::FLUSH_AT`] commands.
    pub fn queue(&self, stream: usize, device: CUdevice, work: &[Work]) -> CuResult {
        let gpu = self.gpu(device)?;
        let captured = self.objects().capture_work(stream, device, work)?;
        if captured {
            return Ok(());
        }
        let lane = self.stream_lane(stream)?;
        // A host function runs once the work before it is done, and the
        // work after it goes to the device once it has returned; an event
        // is recorded, or waited for, between the work around it.
        for part in work.split_inclusive(Work::between_batches) {
            let (device_work, between) = match part.split_last() {
                Some((w, rest)) if w.between_batches() => (rest, Some(w)),
                _ => (part, None),
            };
            crate::work::in_batches(device_work, |batch| gpu.submit_on(lane, batch, None))?;
            match between {
                Some(Work::Host(h)) => {
                    gpu.wait_idle();
                    // SAFETY: the program's host function and argument,
                    // which it keeps valid while it may be called.
                    unsafe { h.call() };
                }
                Some(Work::Record(event)) => {
                    record_on(self, gpu, *event as _, stream as _)?;
                }
                Some(Work::Wait(event)) => {
                    wait_across(self, device, lane, *event as _)?;
                }
                Some(&Work::PageableUpload { dst, src, len }) => {
                    gpu.wait_idle();
                    // SAFETY: the program's pageable source, which CUDA
                    // requires it to keep valid while the graph runs.
                    let data = unsafe { crate::ffi::bytes(src as *const u8, len as usize) }?;
                    crate::diag::check(gpu.dev.copy_to_device_addr(dst, data))?;
                }
                Some(&Work::PageableDownload { dst, src, len }) => {
                    gpu.wait_idle();
                    // SAFETY: as for an upload, for the destination.
                    let out = unsafe { crate::ffi::bytes_mut(dst as *mut u8, len as usize) }?;
                    crate::diag::check(gpu.dev.copy_from_device_addr(src, out))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Makes later work of lane `lane` of `device` wait for `event`'s last
/// record: a record on the same lane is behind it already; one on
/// another lane of the device is waited for on the device (the waiting
/// lane joins that lane's work so far, the record and what followed it:
/// more than needed, never a wait on work queued later);
/// one on another vGPU is waited for here, before the work after it is
/// queued.
pub fn wait_across(d: &Driver, device: cu::CUdevice, lane: usize, event: Handle) -> CuResult {
    let (records, on, on_lane) = {
        let o = d.objects();
        let e = o.streams().events.get(event as usize)?;
        (e.records, e.device, e.lane)
    };
    if records == 0 {
        return Ok(());
    }
    if on != device {
        event_done(event, true)?;
    } else {
        d.gpu(device)?.lanes.join(lane, on_lane)?;
    }
    Ok(())
}

/// A stream's field, or the default stream's value for 0, 1 and 2.
pub fn stream_field<T>(stream: Handle, default: T, f: impl Fn(&Stream) -> T) -> CuResult<T> {
    let d = driver()?;
    if (stream as usize) <= 2 {
        d.current_ctx()?;
        return Ok(default);
    }
    let o = d.objects();
    o.streams().streams.get(stream as usize).map(f)
}

/// The id of `stream` (0 for the legacy stream), if it exists.
pub fn stream_id(stream: Handle) -> CuResult<u64> {
    stream_field(stream, stream as u64, |_| stream as u64)
}

/// Records `event` on `stream` of device `g`: after the work queued
/// before it on the stream's lane.
pub fn record_on(d: &Driver, g: &Gpu, event: Handle, stream: Handle) -> CuResult {
    let device = d.gpus.iter().position(|x| std::ptr::eq(x, g)).unwrap_or(0) as i32;
    let lane = g.lanes.route(d.stream_lane(stream as usize)?);
    let (record, timing) = {
        let mut o = d.objects();
        let captured = o.graphs().capturing(stream as usize);
        let e = o.streams_mut().events.get_mut(event as usize)?;
        e.captured = captured;
        if captured.is_some() {
            // In a capture a record only marks a point other streams
            // may join at, as in CUDA: no command, and what waiting on
            // the event waits for is unchanged.
            return Ok(());
        }
        e.records += 1;
        e.device = device;
        e.lane = lane;
        (e.records, e.flags & cu::EVENT_DISABLE_TIMING == 0)
    };
    let mut batch = Batch::new();
    if timing {
        batch.timestamp();
    } else {
        batch.nop();
    }
    g.submit_on(lane, batch, Some((event as usize, record)))
}

/// The event's last record, device, lane and flags (record 0: never
/// recorded).
pub fn event_record(d: &Driver, event: Handle) -> CuResult<(u64, i32, usize, u32)> {
    let o = d.objects();
    let e = o.streams().events.get(event as usize)?;
    Ok((e.records, e.device, e.lane, e.flags))
}

/// Whether the event's last record has completed, waiting with `wait`.
pub fn event_done(event: Handle, wait: bool) -> CuResult<bool> {
    let d = driver()?;
    let (record, device, lane, _) = event_record(d, event)?;
    if record == 0 {
        return Ok(true);
    }
    d.gpu(device)?
        .event_done(lane, event as usize, record, wait)
}
