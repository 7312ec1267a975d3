//! A device's lanes: the process's open file of the vGPU and, where the
//! function has more queues, lane files on the others
//! ([`Device::lane`]), so that streams of a program run side by side on
//! the device: a copy on one stream moves while a kernel of another runs.
//! Each created stream is given a lane; the default streams use lane 0.
//!
//! Lanes order their work among themselves on the device, with a word per
//! lane in a pinned page: a lane *signals* by queueing a WRITE_VALUE of a
//! counter to its word after its work, another *joins* it by queueing a
//! WAIT_VALUE for that count. CUDA's orders become joins:
//! - work on the legacy default stream (lane 0) comes after all work
//!   queued before it on blocking streams: lane 0 joins every lane of
//!   blocking streams with work it has not joined yet (a stream's lane is
//!   one of blocking streams or of non-blocking ones, never both while
//!   there are lanes enough; a lane both share counts as blocking);
//! - work on another stream comes after the legacy stream's work queued
//!   before it: its lane joins lane 0;
//! - `cuStreamWaitEvent` on another lane joins the lane of the event's
//!   record (its work so far: the record, and what followed it).
//!
//! CUDA exempts non-blocking streams from the legacy stream's order both
//! ways; here they keep half of it: their work comes after the legacy
//! stream's work queued before it. Programs commonly count on a
//! `cudaMemset` of the default stream being done before a non-blocking
//! stream's kernel reads the memory (on a GPU it runs at once and is done
//! in microseconds), while work queued here may wait in a batch until the
//! next synchronisation. The legacy stream does not wait for theirs: a
//! non-blocking stream may wait for a word the CPU writes only after a
//! synchronous copy (`cuStreamWaitValue32`). Streams a program creates
//! still run side by side.
//!
//! A lane's signal is submitted before a join on it is, so a wait on the
//! device is always for work already on its way. While the process has
//! managed memory, whose current copy follows lane 0's work
//! ([`crate::managed`]), all work goes to lane 0.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_guest::{sys, Batch, Device};

use crate::cu::CUresult;
use crate::cu::CuResult;
use crate::diag::log;
use crate::inflight::Inflight;

/// Most lanes a device uses.
pub const MAX_LANES: usize = 4;

struct Lane {
    dev: Arc<Device>,
    inflight: Mutex<Inflight>,
}

/// The order kept between lanes.
#[derive(Default)]
struct Order {
    /// Submissions to each lane so far.
    work: Vec<u64>,
    /// `joined[a][b]`: `work[b]` when lane `a` last joined lane `b`.
    joined: Vec<Vec<u64>>,
    /// The count lane `b` last signalled, and `work[b]` then.
    signalled: Vec<(u64, u64)>,
}

/// One page of this process, pinned for the device: lane `l`'s word is
/// at `8 * l`.
struct Words {
    page: *mut u8,
}

// SAFETY: the page is plain memory the device writes and the process
// never reads through a reference; the pointer moves between threads.
unsafe impl Send for Words {}
// SAFETY: as above; only its address is shared.
unsafe impl Sync for Words {}

impl Words {
    fn new(dev: &Device) -> Option<Words> {
        // SAFETY: a fresh private anonymous mapping of one page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let words = Words { page: p.cast() };
        dev.pin(words.page, 4096).ok()?;
        Some(words)
    }

    fn word(&self, lane: usize) -> *const u8 {
        self.page.wrapping_add(8 * lane)
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // The device file that pinned it may still be open: the pages stay
        // pinned until it is closed, then go.
        // SAFETY: the page this mapped, no longer used.
        unsafe { libc::munmap(self.page.cast(), 4096) };
    }
}

/// The lanes of one device.
pub struct Lanes {
    lanes: Vec<Lane>,
    words: Option<Words>,
    order: Mutex<Order>,
    /// The lane the next created stream gets.
    next: AtomicUsize,
    /// Per lane, whether blocking streams use it (`None`: no stream yet).
    blocking: Mutex<Vec<Option<bool>>>,
}

impl Lanes {
    /// Lane 0 on `dev`, and up to `max - 1` more where the driver and the
    /// device have them (`VGPU_CUDA_LANES` sets `max`; 1 turns lanes
    /// off).
    pub fn open(dev: &Arc<Device>, max: usize) -> Lanes {
        let mut lanes = vec![Lane {
            dev: Arc::clone(dev),
            inflight: Mutex::new(Inflight::default()),
        }];
        let info = dev.cached_info();
        let max = max.min(info.queues as usize).min(MAX_LANES);
        let words = (max > 1 && info.features & sys::FEATURE_VALUES != 0)
            .then(|| Words::new(dev))
            .flatten();
        if words.is_some() {
            while lanes.len() < max {
                match dev.lane() {
                    Ok((lane, _queue)) => lanes.push(Lane {
                        dev: Arc::new(lane),
                        inflight: Mutex::new(Inflight::default()),
                    }),
                    Err(e) => {
                        log(&format!("{}: no lane: {e}", dev.path().display()));
                        break;
                    }
                }
            }
        }
        let n = lanes.len();
        Lanes {
            lanes,
            words: if n > 1 { words } else { None },
            order: Mutex::new(Order {
                work: vec![0; n],
                joined: vec![vec![0; n]; n],
                signalled: vec![(0, 0); n],
            }),
            next: AtomicUsize::new(0),
            blocking: Mutex::new(vec![None; n]),
        }
    }

    /// The lane for a new stream (`blocking`: it follows the legacy
    /// stream both ways): the lanes past 0 in turn, passing over lanes of
    /// the other kind while one of its own kind, or one unused, is left.
    pub fn pick(&self, blocking: bool) -> usize {
        let n = self.lanes.len();
        if n <= 1 {
            return 0;
        }
        let mut kinds = self.blocking.lock().unwrap_or_else(|p| p.into_inner());
        pick_lane(
            &mut kinds,
            self.next.fetch_add(1, Ordering::Relaxed),
            blocking,
        )
    }

    /// Whether the legacy stream's work waits for lane `lane`'s.
    fn joined_by_legacy(&self, lane: usize) -> bool {
        let kinds = self.blocking.lock().unwrap_or_else(|p| p.into_inner());
        kinds.get(lane).copied().flatten() != Some(false)
    }

    /// The lanes whose work the legacy stream's waits for: its own and
    /// those of blocking streams.
    fn legacy_lanes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.lanes.len()).filter(|&l| l == 0 || self.joined_by_legacy(l))
    }

    fn order(&self) -> MutexGuard<'_, Order> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lane `lane`'s queued work, locked.
    pub fn inflight(&self, lane: usize) -> MutexGuard<'_, Inflight> {
        let l = &self.lanes[lane.min(self.lanes.len() - 1)];
        l.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lane `lane`'s device file.
    pub fn dev(&self, lane: usize) -> &Device {
        &self.lanes[lane.min(self.lanes.len() - 1)].dev
    }

    /// The lane work meant for `lane` goes to: 0 while the process has
    /// managed memory.
    pub fn route(&self, lane: usize) -> usize {
        if lane == 0 || lane >= self.lanes.len() || !self.inflight(0).managed.is_empty() {
            0
        } else {
            lane
        }
    }

    /// Queues work on `lane` (see [`Lanes::route`]) with `f`, given the
    /// lane's queued work and file, after what it must follow: on lane 0
    /// the work so far of every lane of blocking streams, on another lane
    /// lane 0's.
    pub fn queue(
        &self,
        lane: usize,
        f: impl FnOnce(&mut Inflight, &Device) -> CuResult,
    ) -> CuResult {
        let lane = self.route(lane);
        if self.lanes.len() == 1 {
            return f(&mut self.inflight(0), self.dev(0));
        }
        let mut o = self.order();
        if lane == 0 {
            for b in 1..self.lanes.len() {
                if o.work[b] > o.joined[0][b] && self.joined_by_legacy(b) {
                    self.join_locked(&mut o, 0, b)?;
                }
            }
        } else if o.work[0] > o.joined[lane][0] {
            self.join_locked(&mut o, lane, 0)?;
        }
        f(&mut self.inflight(lane), self.dev(lane))?;
        o.work[lane] += 1;
        Ok(())
    }

    /// Queues `batch` on `lane` as [`Lanes::queue`] does.
    pub fn submit(
        &self,
        lane: usize,
        batch: Batch,
        mark: Option<crate::inflight::EventMark>,
    ) -> CuResult {
        self.queue(lane, |inflight, dev| inflight.enqueue(dev, batch, mark))
    }

    /// Makes `lane`'s work so far signal (unless it has since the last
    /// signal); the count a join waits for.
    fn signal_locked(&self, o: &mut Order, lane: usize) -> CuResult<u64> {
        let (count, at) = o.signalled[lane];
        if at == o.work[lane] {
            return Ok(count);
        }
        let words = self.words.as_ref().ok_or(crate::cu::ERROR_NOT_SUPPORTED)?;
        let mut b = Batch::new();
        b.write_value(words.word(lane), count + 1, true);
        self.inflight(lane).enqueue(self.dev(lane), b, None)?;
        o.signalled[lane] = (count + 1, o.work[lane]);
        Ok(count + 1)
    }

    /// Makes lane `into`'s later work wait on the device for lane
    /// `from`'s work so far.
    pub fn join(&self, into: usize, from: usize) -> CuResult {
        let (into, from) = (self.route(into), self.route(from));
        if into == from || self.lanes.len() == 1 {
            return Ok(());
        }
        let mut o = self.order();
        if o.work[from] > o.joined[into][from] {
            self.join_locked(&mut o, into, from)?;
        }
        Ok(())
    }

    /// Makes lane `into`'s later work wait on the device for lane `from`'s
    /// signal `count`, which goes to the device now.
    fn wait_locked(&self, into: usize, from: usize, count: u64) -> CuResult {
        let words = self.words.as_ref().ok_or(crate::cu::ERROR_NOT_SUPPORTED)?;
        self.inflight(from).flush(self.dev(from))?;
        let mut b = Batch::new();
        b.wait_value(words.word(from), count, sys::CMD_WAIT_GEQ, true);
        self.inflight(into).enqueue(self.dev(into), b, None)
    }

    /// Lane `into`'s later work waits for lane `from`'s work so far.
    fn join_locked(&self, o: &mut Order, into: usize, from: usize) -> CuResult {
        let count = self.signal_locked(o, from)?;
        self.wait_locked(into, from, count)?;
        o.joined[into][from] = o.work[from];
        Ok(())
    }

    /// Submits every lane's open work.
    pub fn flush(&self) -> CuResult {
        let _o = self.order();
        self.each(|inflight, dev| inflight.flush(dev))
    }

    /// Waits for every lane's queued work; the first failure in it.
    pub fn sync(&self) -> CuResult {
        let _o = self.order();
        // Every lane's signals reach the device before any lane is waited
        // for.
        let flushed = self.each(|inflight, dev| inflight.flush(dev));
        let synced = self.each(|inflight, dev| inflight.sync(dev));
        flushed.and(synced)
    }

    /// Waits for the legacy default stream's queued work and what it
    /// follows (the lanes of blocking streams), as a synchronous copy
    /// does; non-blocking streams' work may go on.
    pub fn sync_legacy(&self) -> CuResult {
        let _o = self.order();
        // Every lane's signals reach the device before any is waited for.
        let mut first = self.each(|inflight, dev| inflight.flush(dev));
        for l in self.legacy_lanes() {
            let r = self.inflight(l).sync(self.dev(l));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Waits for `lane`'s queued work (lane 0: the legacy stream's, see
    /// [`Lanes::sync_legacy`]).
    pub fn sync_lane(&self, lane: usize) -> CuResult {
        let lane = self.route(lane);
        if lane == 0 {
            return self.sync_legacy();
        }
        let _o = self.order();
        self.inflight(lane).sync(self.dev(lane))
    }

    /// Waits for every lane's queued work, keeping a failure for the next
    /// [`Lanes::sync`].
    pub fn drain(&self) {
        let _o = self.order();
        let _ = self.each(|inflight, dev| inflight.flush(dev));
        let _ = self.each(|inflight, dev| {
            inflight.drain(dev);
            Ok(())
        });
    }

    /// Whether `lane`'s queued work (lane 0: the legacy stream's and what
    /// it follows) is done, without waiting.
    pub fn idle(&self, lane: usize) -> CuResult<bool> {
        let lane = self.route(lane);
        let _o = self.order();
        if lane != 0 {
            return self.inflight(lane).poll(self.dev(lane));
        }
        let _ = self.each(|inflight, dev| inflight.flush(dev));
        let mut idle = true;
        for l in self.legacy_lanes() {
            idle &= self.inflight(l).poll(self.dev(l))?;
        }
        Ok(idle)
    }

    /// The first failure of queued work not reported yet, of any lane.
    pub fn pending_error(&self) -> Option<CUresult> {
        (0..self.lanes.len()).find_map(|l| self.inflight(l).pending_error())
    }

    /// Runs `f` on every lane in turn; the first failure, after all ran.
    fn each(&self, mut f: impl FnMut(&mut Inflight, &Device) -> CuResult) -> CuResult {
        let mut first = Ok(());
        for l in 0..self.lanes.len() {
            let r = f(&mut self.inflight(l), self.dev(l));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// [`Lanes::pick`]'s choice among `kinds` (per lane, whether blocking
/// streams use it; lane 0 is the default streams'), starting the turn at
/// `start`; records the kind of the lane picked.
fn pick_lane(kinds: &mut [Option<bool>], start: usize, blocking: bool) -> usize {
    let n = kinds.len();
    if n <= 1 {
        return 0;
    }
    let lane = (0..n - 1)
        .map(|k| 1 + (start + k) % (n - 1))
        .find(|&l| kinds[l].is_none_or(|b| b == blocking))
        .unwrap_or(1 + start % (n - 1));
    // A lane both kinds share counts as blocking.
    kinds[lane] = Some(kinds[lane].unwrap_or(false) || blocking);
    lane
}

#[cfg(test)]
mod tests {
    use super::pick_lane;

    fn picks(n: usize, blocking: &[bool]) -> (Vec<usize>, Vec<Option<bool>>) {
        let mut kinds = vec![None; n];
        let got = (0..blocking.len())
            .map(|i| pick_lane(&mut kinds, i, blocking[i]))
            .collect();
        (got, kinds)
    }

    #[test]
    fn one_lane_takes_every_stream() {
        assert_eq!(picks(1, &[true, false, true]).0, vec![0, 0, 0]);
    }

    #[test]
    fn streams_of_one_kind_go_round_the_lanes_past_0() {
        let (got, kinds) = picks(4, &[true; 7]);
        assert_eq!(got, vec![1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(kinds, vec![None, Some(true), Some(true), Some(true)]);
    }

    #[test]
    fn kinds_keep_apart_while_lanes_allow() {
        // Blocking, non-blocking, blocking, non-blocking: lanes 1 and 3
        // for blocking streams, lane 2 for non-blocking ones.
        let (got, kinds) = picks(4, &[true, false, true, false, false]);
        assert_eq!(got, vec![1, 2, 3, 2, 2]);
        assert_eq!(kinds, vec![None, Some(true), Some(false), Some(true)]);
    }

    #[test]
    fn a_shared_lane_counts_as_blocking() {
        // Two lanes past 0, both taken by non-blocking streams: a blocking
        // stream must share one, which the legacy stream then joins.
        let (got, kinds) = picks(3, &[false, false, true]);
        assert_eq!(got, vec![1, 2, 1]);
        assert_eq!(kinds, vec![None, Some(true), Some(false)]);
    }
}
