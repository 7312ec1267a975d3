//! Work a program queued on a device and has not waited for: kernel
//! launches, memsets, device-to-device copies and event records return
//! once submitted, as on a GPU. Every submission of a process goes to its
//! open file's one device queue, which runs in order, so CUDA's stream
//! order holds across all streams (more strictly than CUDA requires).
//!
//! A failure of queued work is reported by the next call that waits
//! (`cuCtxSynchronize`, `cuStreamSynchronize`, a synchronous copy), as
//! CUDA reports asynchronous errors.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use vgpu_guest::{Batch, Device, Error as GuestError, Pending};

use crate::cu::CUresult;
use crate::ffi::CuResult;
use crate::state::{check, cu_error, log};

/// Batches in flight per device before a submission waits for the
/// oldest: the guest driver allows 1024 uncollected per open file, and
/// the bound keeps a runaway loop of launches from queueing without end.
pub const MAX_INFLIGHT: usize = 512;

/// An event record: which event, and which of its records.
pub type EventMark = (usize, u64);

/// The device's queued work, oldest first.
#[derive(Default)]
pub struct Inflight {
    queue: VecDeque<(Pending, Option<EventMark>)>,
    /// The first failure of queued work not yet reported.
    error: Option<CUresult>,
    /// Device clocks of completed event records: event → (record, ns).
    stamps: HashMap<usize, (u64, u64)>,
}

impl Inflight {
    /// Queues `batch`; `mark` names the event the batch records.
    pub fn submit(&mut self, dev: &Device, batch: Batch, mark: Option<EventMark>) -> CuResult {
        let pending = check(dev.submit(batch))?;
        self.queue.push_back((pending, mark));
        while self.queue.len() > MAX_INFLIGHT {
            self.collect_front(None);
        }
        Ok(())
    }

    /// Collects the oldest batch, waiting up to `timeout` (`None`: until
    /// it completes). False if it is still running.
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
        let (_, mark) = self.queue.pop_front().expect("front exists");
        match done.and_then(|d| d.check().map(|()| d)) {
            Ok(d) => {
                if let Some((event, record)) = mark {
                    let ns = d.result(0).map_or(0, |r| r.result);
                    self.stamps.insert(event, (record, ns));
                }
            }
            Err(e) => {
                log(&format!("queued work failed: {e}"));
                self.error.get_or_insert(cu_error(&e));
            }
        }
        true
    }

    /// Waits for everything queued and reports the first failure.
    pub fn sync(&mut self) -> CuResult {
        while !self.queue.is_empty() {
            self.collect_front(None);
        }
        self.error.take().map_or(Ok(()), Err)
    }

    /// Collects what has completed without waiting; true if nothing is
    /// left in flight.
    pub fn poll(&mut self) -> bool {
        while self.collect_front(Some(Duration::ZERO)) {}
        self.queue.is_empty()
    }

    /// Whether record `record` of `event` has completed, collecting what
    /// is done (and, with `wait`, waiting for it).
    pub fn event_done(&mut self, event: usize, record: u64, wait: bool) -> bool {
        loop {
            if self.stamps.get(&event).is_some_and(|s| s.0 >= record) {
                return true;
            }
            let pending = self
                .queue
                .iter()
                .any(|(_, m)| m.is_some_and(|m| m.0 == event));
            if !pending {
                // Dropped with a failed batch: complete, with no stamp.
                return true;
            }
            if !self.collect_front(if wait { None } else { Some(Duration::ZERO) }) {
                return false;
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

    /// Forgets a destroyed event: its stamp, and the marks of its records
    /// still queued (so nothing is kept for it later).
    pub fn forget(&mut self, event: usize) {
        self.stamps.remove(&event);
        for (_, mark) in &mut self.queue {
            if mark.is_some_and(|m| m.0 == event) {
                *mark = None;
            }
        }
    }
}
