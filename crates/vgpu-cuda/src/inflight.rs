//! Work a program queued on a device and has not waited for: kernel
//! launches, memsets, device-to-device copies and event records return
//! once queued, as on a GPU.
//!
//! Queued commands gather in an open batch that goes to the device in one
//! submission (one doorbell) when a call must wait for it, or when it
//! holds [`FLUSH_AT`] commands: a guest system call costs far more than a
//! command on the device, so a launch loop costs one call per batch, and
//! an event pair around a kernel measures the device, not the guest.
//! One `Inflight` is one lane's ([`crate::lanes`]): its submissions go to
//! one device queue, which runs them in order.
//!
//! A failure of queued work is reported by the next call that waits
//! (`cuCtxSynchronize`, `cuStreamSynchronize`, a synchronous copy), as
//! CUDA reports asynchronous errors.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use vgpu_guest::{Batch, Device, Dims, Error as GuestError, Function, Pending};

use crate::managed::{self, Managed};

use crate::cu::CUresult;
use crate::cu::CuResult;
use crate::diag::{check, cu_error, log};

/// Commands gathered before the open batch is submitted.
pub const FLUSH_AT: usize = 64;

/// Batches in flight per device before a submission waits for the
/// oldest: the guest driver allows 1024 uncollected per open file, and
/// the bound keeps a runaway loop of launches from queueing without end.
pub const MAX_INFLIGHT: usize = 256;

/// An event record: which event, and which of its records.
pub type EventMark = (usize, u64);

/// Event records of a batch: the index of each one's command.
type Marks = Vec<(usize, EventMark)>;

/// The device's queued work: the open batch, then what was submitted,
/// oldest first.
#[derive(Default)]
pub struct Inflight {
    open: Batch,
    open_marks: Marks,
    queue: VecDeque<(Pending, Marks)>,
    /// The first failure of queued work not yet reported.
    error: Option<CUresult>,
    /// Device clocks of completed event records: event → (record, ns).
    stamps: HashMap<usize, (u64, u64)>,
    /// The device's managed allocations, whose copies follow its work.
    pub managed: Managed,
}

impl Inflight {
    /// Queues `batch`; `mark` names the event its first command records.
    /// A batch that cannot be built is refused here, alone.
    pub fn enqueue(&mut self, dev: &Device, batch: Batch, mark: Option<EventMark>) -> CuResult {
        if self.open.len() + batch.len() > FLUSH_AT {
            self.flush(dev)?;
        }
        let at = self.open.len();
        check(self.open.append(batch))?;
        if let Some(m) = mark {
            self.open_marks.push((at, m));
        }
        if self.open.len() >= FLUSH_AT {
            self.flush(dev)?;
        }
        Ok(())
    }

    /// Queues a launch straight into the open batch: a launch loop's
    /// path, with no batch of its own per launch. A launch that cannot be
    /// built is refused here, alone.
    pub fn enqueue_launch(
        &mut self,
        dev: &Device,
        f: &Function,
        dims: Dims,
        (cluster, cooperative): ([u32; 3], bool),
        params: &[u8],
    ) -> CuResult {
        if self.open.len() >= FLUSH_AT {
            self.flush(dev)?;
        }
        check(if cooperative {
            self.open
                .try_launch_function_cooperative(f, dims, cluster, params)
        } else {
            self.open
                .try_launch_function_in_clusters(f, dims, cluster, params)
        })?;
        if self.open.len() >= FLUSH_AT {
            self.flush(dev)?;
        }
        Ok(())
    }

    /// Submits the open batch.
    pub fn flush(&mut self, dev: &Device) -> CuResult {
        if self.open.is_empty() {
            return Ok(());
        }
        // Managed memory the host had goes to the device first.
        if let Some(up) = self.managed.before_device_work() {
            self.submit_transfer(dev, up)?;
        }
        let batch = std::mem::take(&mut self.open);
        let marks = std::mem::take(&mut self.open_marks);
        let pending = check(dev.submit(batch))?;
        self.queue.push_back((pending, marks));
        while self.queue.len() > MAX_INFLIGHT {
            self.collect_front(None);
        }
        Ok(())
    }

    /// Collects the oldest submitted batch, waiting up to `timeout`
    /// (`None`: until it completes). False if it is still running.
    fn collect_front(&mut self, timeout: Option<Duration>) -> bool {
        let Some((pending, _)) = self.queue.front_mut() else {
            return false;
        };
        let done = loop {
            match pending.wait(timeout) {
                Err(GuestError::Interrupted) if timeout.is_none() => continue,
                Err(GuestError::TimedOut | GuestError::Interrupted) => return false,
                r => break r,
            }
        };
        let (_, marks) = self.queue.pop_front().expect("front exists");
        match done {
            Ok(d) => {
                for (at, (event, record)) in marks {
                    if let Some(r) = d.result(at).filter(|r| r.check(at).is_ok()) {
                        self.stamps.insert(event, (record, r.result));
                    }
                }
                if let Err(e) = d.check() {
                    log(&format!("queued work failed: {e}"));
                    self.error.get_or_insert(cu_error(&e));
                }
            }
            Err(e) => {
                log(&format!("queued work failed: {e}"));
                self.error.get_or_insert(cu_error(&e));
            }
        }
        true
    }

    /// The failure of queued work not yet reported, left for the next
    /// [`Self::sync`] to report.
    pub fn pending_error(&self) -> Option<CUresult> {
        self.error
    }

    /// Queues a transfer of managed memory, without event marks.
    fn submit_transfer(&mut self, dev: &Device, batches: Vec<Batch>) -> CuResult {
        let (pending, failed) = managed::submit_all(dev, batches);
        self.queue
            .extend(pending.into_iter().map(|p| (p, Vec::new())));
        match failed {
            Some(e) => {
                log(&format!("managed memory not transferred: {e}"));
                Err(cu_error(&e))
            }
            None => Ok(()),
        }
    }

    /// Once nothing is queued: managed memory the device had comes back
    /// to the host, waited for (the program reads it next).
    fn settle(&mut self, dev: &Device) {
        if !self.queue.is_empty() || !self.open.is_empty() {
            return;
        }
        if let Some(down) = self.managed.once_idle() {
            if let Err(e) = self.submit_transfer(dev, down) {
                self.error.get_or_insert(e);
            }
            while !self.queue.is_empty() {
                self.collect_front(None);
            }
        }
    }

    /// Waits for everything queued and reports the first failure.
    pub fn sync(&mut self, dev: &Device) -> CuResult {
        self.flush(dev)?;
        while !self.queue.is_empty() {
            self.collect_front(None);
        }
        self.settle(dev);
        self.error.take().map_or(Ok(()), Err)
    }

    /// Waits for everything queued, keeping the first failure for the
    /// next [`Self::sync`] (a failure to submit the open batch too).
    pub fn drain(&mut self, dev: &Device) {
        if let Err(e) = self.flush(dev) {
            self.error.get_or_insert(e);
        }
        while !self.queue.is_empty() {
            self.collect_front(None);
        }
        self.settle(dev);
    }

    /// Submits what is open and collects what has completed without
    /// waiting; true if nothing is left in flight.
    pub fn poll(&mut self, dev: &Device) -> CuResult<bool> {
        self.flush(dev)?;
        while self.collect_front(Some(Duration::ZERO)) {}
        self.settle(dev);
        Ok(self.queue.is_empty())
    }

    /// Whether record `record` of `event` has completed, collecting what
    /// is done (and, with `wait`, waiting for it).
    pub fn event_done(
        &mut self,
        dev: &Device,
        event: usize,
        record: u64,
        wait: bool,
    ) -> CuResult<bool> {
        if self.open_marks.iter().any(|(_, m)| m.0 == event) {
            self.flush(dev)?;
        }
        loop {
            let queued = self
                .queue
                .iter()
                .any(|(_, marks)| marks.iter().any(|(_, m)| m.0 == event));
            if !queued || self.stamps.get(&event).is_some_and(|s| s.0 >= record) {
                // (Not queued, with no time: its batch failed.) Where that
                // left the device idle, managed memory is the host's.
                self.settle(dev);
                return Ok(true);
            }
            if !self.collect_front(if wait { None } else { Some(Duration::ZERO) }) {
                return Ok(false);
            }
        }
    }

    /// The device clock of `event`'s record `record`, once completed.
    pub fn stamp(&self, event: usize, record: u64) -> Option<u64> {
        self.stamps
            .get(&event)
            .filter(|s| s.0 == record)
            .map(|s| s.1)
    }

    /// Forgets a destroyed event: its time, and the marks of its records
    /// still queued (so nothing is kept for it later).
    pub fn forget(&mut self, event: usize) {
        self.stamps.remove(&event);
        self.open_marks.retain(|(_, m)| m.0 != event);
        for (_, marks) in &mut self.queue {
            marks.retain(|(_, m)| m.0 != event);
        }
    }
}
