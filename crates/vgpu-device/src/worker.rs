//! The queue worker: an adaptive poller. While work arrives it watches the
//! doorbell page (local memory, no exits); after `poll_spin` without
//! activity it re-enables notifications (event index), tells the guest it
//! sleeps (POLLING = 0) and blocks on the wake eventfd, which the trapped
//! WAKE register (or its ioeventfd) signals.

use std::collections::VecDeque;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, log_enabled, trace, Level};
use vfio_user_server::dma::DmaView;
use vgpu_abi as abi;
use vgpu_backend::{Finishing, Queued, QueuedDone, SliceMemory, Started};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::ByteValued;
use vm_memory::{Bytes, GuestAddress};

use crate::command::{self, Desc};
use crate::{lock, Shared};

/// Most commands taken from one queue before looking at the others, so one
/// busy queue cannot starve its neighbours.
const BATCH: usize = 32;

pub(crate) fn run(sh: Arc<Shared>) {
    let mut last_doorbell = vec![u32::MAX; sh.num_queues as usize];
    let mut last_activity = Instant::now();
    let mut force_scan = true;
    let mut spins: u32 = 0;
    // Whether this thread has seen the drain begin and marked what was
    // in flight then.
    let mut draining = false;
    // Whether commands ran since the gate was last told we are idle.
    let mut gated = false;
    // Whether a queue waits on a WAIT_VALUE (as of the last scan of it).
    let mut waiting = false;
    let idle = |gated: &mut bool| {
        if std::mem::take(gated) {
            if let Some(gate) = &sh.gate {
                gate.idle();
            }
        }
    };
    while !sh.stop.load(Ordering::Acquire) {
        if sh.epoch_gen.load(Ordering::SeqCst) & 1 == 1 {
            idle(&mut gated);
            // A reset is in progress: let it take `busy`.
            std::thread::sleep(std::time::Duration::from_micros(50));
            force_scan = true;
            continue;
        }
        if sh.suspended() {
            // The guest's submissions wait in its rings.
            idle(&mut gated);
            let mut moved = sh.waits_for_resume.swap(false, Ordering::AcqRel);
            for q in 0..sh.num_queues {
                let db = sh.doorbell(q);
                moved |= db != last_doorbell[q as usize];
                last_doorbell[q as usize] = db;
            }
            if moved {
                if let Some(wanted) = &sh.on_wanted {
                    wanted();
                }
            }
            wait_wake(&sh, PAUSED_RECHECK);
            force_scan = true;
            continue;
        }
        if !draining && sh.drain.requested() {
            mark_in_flight(&sh);
            draining = true;
            force_scan = true;
        }
        // Lock-free look at the doorbell page first: a spinning poller
        // touches nothing but that page until a doorbell moves.
        let dirty =
            force_scan || (0..sh.num_queues).any(|q| sh.doorbell(q) != last_doorbell[q as usize]);
        let mut progressed = false;
        let full_scan = force_scan;
        if dirty {
            let _busy = lock(&sh.busy);
            if sh.suspended() {
                // A suspend came between the look above and `busy`.
                continue;
            }
            let qs: Vec<u32> = (0..sh.num_queues)
                .filter(|&q| {
                    let db = sh.doorbell(q);
                    let moved = force_scan || db != last_doorbell[q as usize];
                    last_doorbell[q as usize] = db;
                    moved
                })
                .collect();
            let (moved, parked) = process_queues(&sh, &qs, draining, &mut last_doorbell);
            progressed = moved;
            waiting = parked || (waiting && !full_scan);
            force_scan = false;
        }
        if draining {
            // A full scan that found nothing: everything in flight when the
            // drain began has completed (or was cancelled).
            if progressed || waiting {
                sh.drain.idle.store(false, Ordering::Release);
            } else if full_scan {
                sh.drain.idle.store(true, Ordering::Release);
            }
        }
        if !progressed {
            // Nothing left to run: the GPU goes back to the scheduler.
            idle(&mut gated);
        }
        if progressed {
            gated = true;
            last_activity = Instant::now();
            spins = 0;
            // More may have arrived without a doorbell change (interrupt mode).
            force_scan = true;
            continue;
        }
        if sh.any_polled.load(Ordering::Relaxed) {
            spins = spins.wrapping_add(1);
            // Reading the clock costs more than a doorbell check.
            if !spins.is_multiple_of(64) || last_activity.elapsed() < sh.poll_spin {
                std::hint::spin_loop();
                continue;
            }
        }
        if waiting {
            // A WAIT_VALUE's word may change with no doorbell (the
            // guest's CPU, another function's queue): look again soon.
            wait_wake(&sh, WAIT_RECHECK);
            force_scan = true;
            continue;
        }
        // Going to sleep: ask for notifications, then look once more so a
        // submission racing with this cannot be missed.
        if !arm_notifications(&sh) {
            force_scan = true;
            continue;
        }
        // Blocks until WAKE, a queue change, a reset or stop; for a
        // partition that can be lost without a call, wakes now and then
        // to look.
        match sh.watch {
            None => {
                let _ = sh.wake.read();
            }
            Some(every) => watch_while_idle(&sh, every),
        }
        set_polling_all(&sh);
        force_scan = true;
        last_activity = Instant::now();
    }
    idle(&mut gated);
}

/// Leaves visit `v`'s commands from the next on in its ring, taken again
/// after the resume, and notes that work waits for it.
fn park_for_resume(sh: &Shared, v: &mut Visit) {
    v.parked = true;
    sh.waits_for_resume.store(true, Ordering::Release);
}

/// How often a suspended worker looks whether it was resumed, besides
/// the wake-up a resume sends.
const PAUSED_RECHECK: Duration = Duration::from_millis(100);

/// How often a queue stopped at a WAIT_VALUE looks at its word again
/// when nothing else happens.
const WAIT_RECHECK: Duration = Duration::from_millis(1);

/// Sleeps until the wake eventfd is signalled (taking the signal) or
/// `timeout` (whole milliseconds) passes.
fn wait_wake(sh: &Shared, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd: sh.wake.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for the call's duration. (`poll`, which
    // the daemon's seccomp filter allows its workers.)
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n > 0 {
        let _ = sh.wake.read();
    }
}

/// Sleeps until the wake eventfd is signalled, looking every `every`
/// whether the partition lost its state meanwhile (a shared host ended
/// by another partition's fault): then STATUS.FATAL tells the guest now,
/// not at its next command, so its next process starts on a fresh one.
fn watch_while_idle(sh: &Shared, every: Duration) {
    loop {
        let mut pfd = libc::pollfd {
            fd: sh.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = every.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd for the call's duration.
        if unsafe { libc::poll(&mut pfd, 1, ms) } != 0 {
            let _ = sh.wake.read();
            return;
        }
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let enabled = lock(&sh.state).status & abi::STATUS_ENABLED != 0;
        // A partition in use is not idle: whoever uses it learns.
        let lost = enabled && sh.partition.try_lock().is_some_and(|p| p.is_lost());
        if lost {
            sh.function_lost(0);
            return;
        }
    }
}

/// Records, per running queue, the guest's avail index now: commands
/// before it were in flight when the drain began.
fn mark_in_flight(sh: &Shared) {
    let _busy = lock(&sh.busy);
    let view = sh.ctx.dma.view();
    let mut st = lock(&sh.state);
    for qr in st.queues.iter_mut() {
        qr.drain_limit = qr
            .ring
            .as_ref()
            .and_then(|r| r.avail_idx(&view, Ordering::Acquire).ok())
            .map(|w| w.0);
    }
}

fn set_polling_all(sh: &Shared) {
    let st = lock(&sh.state);
    for (q, qr) in st.queues.iter().enumerate() {
        if qr.ring.is_some() && qr.control & abi::QCONTROL_POLLED != 0 {
            sh.set_polling(q as u32, true);
        }
    }
}

/// Enables notifications on every running queue. Returns false when work
/// is already pending (do not sleep).
fn arm_notifications(sh: &Shared) -> bool {
    let _busy = lock(&sh.busy);
    for q in 0..sh.num_queues {
        sh.set_polling(q, false);
    }
    fence(Ordering::SeqCst);
    let mut st = lock(&sh.state);
    if st.status & abi::STATUS_ENABLED == 0 {
        // Nothing runs until the function is enabled, which wakes us.
        return true;
    }
    let view = sh.ctx.dma.view();
    let mut idle = true;
    for qr in st.queues.iter_mut() {
        if qr.status & abi::QSTATUS_ERROR != 0 {
            continue;
        }
        if let Some(ring) = qr.ring.as_mut() {
            // Ok(true): more buffers arrived meanwhile.
            if !matches!(ring.enable_notification(&view), Ok(false)) {
                idle = false;
            }
        }
    }
    idle
}

/// (reset epoch, device config generation, queue generation) when a
/// visit started.
type Generations = (u64, u64, u64);

/// While draining: the queue's avail index when the drain began, if the
/// ring ran then (see `QueueRegs::drain_limit`).
type DrainLimit = Option<Option<u16>>;

/// Device time of a queued run from which the next run of its lane is
/// kept in flight behind it. Starting a run ahead costs the partition a
/// second exchange (start, then finish) where running it costs one;
/// behind a run this long that exchange is hidden, and the device is kept
/// busy between runs. Behind a shorter one (launches trickling in one by
/// one) it would only halve how many runs a second the worker gets
/// through.
const KEEP_AFTER: Duration = Duration::from_micros(50);

/// Most commands taken from one queue in one visit while runs are kept
/// in flight: a visit goes on taking what the guest submits meanwhile, up
/// to this.
const VISIT: usize = 4 * BATCH;

/// One queue's part of a scan: its ring (taken out of the queue's state
/// meanwhile), the commands popped from it and what became of them.
struct Visit {
    q: u32,
    /// The partition's lane its runs go to.
    lane: usize,
    ring: Queue,
    gens: Generations,
    vector: u32,
    /// The ring position of `chains[0]`.
    first: u16,
    drain: DrainLimit,
    chains: Vec<(u16, Vec<Desc>)>,
    /// The ring error that ended the popping early, if any.
    failure: Option<u32>,
    /// The next chain to run.
    next: usize,
    /// Runs started and not completed, oldest first.
    flights: VecDeque<Flight>,
    /// A completion asked for an interrupt regardless of suppression.
    notify: bool,
    /// The queue went away (reset, reconfiguration) or its ring broke:
    /// nothing more is run or written; runs in flight are still waited
    /// for, so that the partition is idle afterwards.
    closed: bool,
    /// A WAIT_VALUE whose condition does not hold yet stops the queue at
    /// `next`: what was popped from there goes back to the ring.
    parked: bool,
    /// Whether any command completed.
    completed: bool,
}

impl Visit {
    /// Whether a reset or a reconfiguration of the queue happened since
    /// the visit began. Any queue reconfiguration bumps `config_gen`; only
    /// then is the (locked) per-queue generation worth a look.
    fn stale(&self, sh: &Shared) -> bool {
        stale(sh, self.q, self.gens)
    }

    /// Whether commands are left to run.
    fn pending(&self) -> bool {
        !self.closed && !self.parked && self.next < self.chains.len()
    }
}

/// Whether a reset or a reconfiguration of queue `q` happened since
/// `gens` were taken.
fn stale(sh: &Shared, q: u32, (epoch, config_gen, generation): Generations) -> bool {
    sh.epoch_gen.load(Ordering::SeqCst) != epoch
        || (sh.config_gen.load(Ordering::SeqCst) != config_gen
            && sh.queue_generation(q) != Some(generation))
}

/// Takes queue `q`'s ring and up to [`BATCH`] of its commands for a visit.
fn begin_visit(sh: &Shared, q: u32, lanes: usize, draining: bool) -> Option<Visit> {
    let epoch = sh.epoch_gen.load(Ordering::SeqCst);
    if epoch & 1 == 1 {
        return None;
    }
    // Taken before the ring: a reconfiguration from here on is seen.
    let config_gen = sh.config_gen.load(Ordering::SeqCst);
    let (mut ring, generation, vector, limit) = {
        let mut st = lock(&sh.state);
        if st.status & abi::STATUS_ENABLED == 0 {
            return None;
        }
        let qr = st.queues.get_mut(q as usize)?;
        if qr.status & abi::QSTATUS_ERROR != 0 {
            return None;
        }
        // Every other user of the ring holds `busy`, as this thread does
        // now, so taking it out while working is invisible to them.
        let ring = qr.ring.take()?;
        (ring, qr.generation, qr.vector, qr.drain_limit)
    };
    let first = ring.next_avail();
    let mut chains = Vec::new();
    let failure = pop_chains(sh, &mut ring, BATCH, &mut chains);
    Some(Visit {
        q,
        lane: q as usize % lanes,
        ring,
        gens: (epoch, config_gen, generation),
        vector,
        first,
        drain: draining.then_some(limit),
        chains,
        failure,
        next: 0,
        flights: VecDeque::new(),
        notify: false,
        closed: false,
        parked: false,
        completed: false,
    })
}

/// Ends a visit: a ring error stops the queue (after the commands popped
/// before it), the guest hears of the completions, and the ring goes
/// back to the queue unless the queue was reconfigured meanwhile; a
/// parked queue's ring goes back to its WAIT_VALUE. Returns whether the
/// visit did anything, and whether it is parked.
fn end_visit(sh: &Shared, mut v: Visit) -> (bool, bool) {
    let q = v.q;
    let parked = v.parked && !v.closed;
    if parked {
        // The commands from the wait on are taken again next time (a ring
        // error past it too, once the queue gets there).
        v.ring.set_next_avail(v.first.wrapping_add(v.next as u16));
        v.failure = None;
    }
    let progressed = v.completed || v.failure.is_some();
    if !v.closed {
        if let Some(code) = v.failure {
            debug!("{}: queue {q}: ring error {code}", sh.name);
            sh.queue_error(q, code, 0);
        } else if v.completed && wants_irq(sh, &mut v.ring, v.notify) {
            sh.raise(v.vector, abi::IRQ_CAUSE_QUEUE);
        }
    }
    let mut st = lock(&sh.state);
    if let Some(qr) = st.queues.get_mut(q as usize) {
        // A queue reconfigured meanwhile keeps its new state.
        if qr.generation == v.gens.2 && qr.ring.is_none() {
            qr.ring = Some(v.ring);
        }
    }
    (progressed, parked)
}

/// Serves queues `qs` together: takes up to [`BATCH`] commands from each,
/// runs and completes them. Consecutive launches, timestamps, fills,
/// copies and NOPs of a queue run as one queued run of the partition, so
/// the device has them in flight together; every other command runs
/// alone, once nothing is in flight. Each queue's runs go to a lane of
/// the partition, so that where it has several, runs of different queues
/// overlap on the device; within a lane the next run is started before
/// the previous one is finished, where the partition keeps runs in
/// flight, and a visit then takes what its guest submits meanwhile (up to
/// [`VISIT`] commands, not past a ring error). Completions of a queue are
/// written in order. Returns whether any work was done, and whether a
/// queue waits on a WAIT_VALUE.
fn process_queues(
    sh: &Shared,
    qs: &[u32],
    draining: bool,
    last_doorbell: &mut [u32],
) -> (bool, bool) {
    let (depth, lanes) = {
        let p = sh.partition.lock();
        (p.queue_depth().max(1), p.lanes().max(1))
    };
    // Commands run one at a time while draining, each judged on its own.
    let depth = if draining { 1 } else { depth };
    let mut visits: Vec<Visit> = qs
        .iter()
        .filter_map(|&q| begin_visit(sh, q, lanes, draining))
        .collect();
    if visits.is_empty() {
        return (false, false);
    }
    let mut s = Scan {
        depth,
        lanes: (0..lanes).map(|_| VecDeque::new()).collect(),
        context: 0,
    };
    loop {
        let mut moved = false;
        // One start per queue a round, so that queues take turns.
        for vi in 0..visits.len() {
            moved |= start_next(sh, &mut visits, vi, &mut s);
        }
        // What is done is completed at once, not after what follows it.
        let idle = s.in_partition() == 0;
        for v in visits.iter_mut() {
            while v.flights.front().is_some_and(|f| f.ready(idle)) {
                let flight = v.flights.pop_front().expect("a run");
                complete_run(sh, v, flight, None);
                moved = true;
            }
        }
        if moved {
            continue;
        }
        match finish_next(sh, &mut visits, &mut s) {
            Next::Finished => {}
            Next::Idle => break,
            Next::Pending => {
                // While runs are in flight, work that arrived on other
                // queues goes to the device beside them, and waits are
                // looked at again.
                for v in visits.iter_mut() {
                    v.parked = false;
                    if !v.closed && v.next >= v.chains.len() {
                        pop_more(sh, v);
                    }
                }
                for q in 0..sh.num_queues {
                    let db = sh.doorbell(q);
                    if db == last_doorbell[q as usize] || visits.iter().any(|v| v.q == q) {
                        continue;
                    }
                    last_doorbell[q as usize] = db;
                    if let Some(v) = begin_visit(sh, q, lanes, draining) {
                        visits.push(v);
                    }
                }
            }
        }
    }
    visits.into_iter().fold((false, false), |(p, w), v| {
        let (progressed, parked) = end_visit(sh, v);
        (p | progressed, w | parked)
    })
}

/// What a scan has in flight on the partition.
struct Scan {
    /// Runs in flight at once on one lane.
    depth: usize,
    /// Per lane, the visits whose runs are in flight there, in the order
    /// started (as the partition finishes them).
    lanes: Vec<VecDeque<usize>>,
    /// The context of the runs in flight: runs of one context only are in
    /// flight at once, so that the partition switches contexts while it
    /// is idle (see `Partition::set_context`).
    context: u32,
}

impl Scan {
    fn in_partition(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum()
    }
}

/// Starts (or runs) visit `vi`'s next command or run, where it may go
/// now. Returns whether it did.
fn start_next(sh: &Shared, visits: &mut [Visit], vi: usize, s: &mut Scan) -> bool {
    if visits[vi].closed {
        return false;
    }
    if visits[vi].stale(sh) {
        // Reset or queue reconfiguration: queued work is dropped and
        // nothing more is written to the old ring (what is in flight is
        // still waited for, so the partition is idle for the reset).
        visits[vi].closed = true;
        return false;
    }
    let in_partition = s.in_partition();
    // Another queue's commands wait to go to another lane: a run started
    // now is kept in flight, so that they go to the device beside it.
    let others_waiting = s.lanes.len() > 1
        && visits
            .iter()
            .enumerate()
            .any(|(i, w)| i != vi && w.lane != visits[vi].lane && w.pending());
    let v = &mut visits[vi];
    if v.parked {
        return false;
    }
    if v.next >= v.chains.len() {
        if !v.flights.is_empty() && s.lanes[v.lane].len() < s.depth {
            // Keeps the device fed with what the guest submitted while the
            // runs in flight went on.
            pop_more(sh, v);
        }
        if v.next >= v.chains.len() {
            return false;
        }
    }
    if sh.suspended() {
        // Suspending: what is in flight finishes, nothing more starts.
        park_for_resume(sh, v);
        return false;
    }
    let holding = || sh.gate.as_ref().is_none_or(|g| g.holding());
    let long = sh.last_run_ns.load(Ordering::Relaxed) >= KEEP_AFTER.as_nanos() as u64;
    let lane_len = s.lanes[v.lane].len();
    let may_start = if v.flights.is_empty() {
        in_partition == 0 || (lane_len < s.depth && (lane_len == 0 || long) && holding())
    } else {
        long && lane_len < s.depth && !v.flights.back().is_some_and(Flight::barrier) && holding()
    };
    if !may_start {
        return false;
    }
    // While draining, work the guest submitted after the drain began is
    // refused, and what is still waiting at the deadline is cancelled;
    // either way the guest gets a completion.
    let position = v.first.wrapping_add(v.next as u16);
    // (A batch popped before the worker saw the drain is all in flight.)
    let mut cancel = sh.drain.expired()
        || v.drain
            .is_some_and(|limit| limit.is_none_or(|l| position.wrapping_sub(l) < 0x8000));
    // Each command is read once: to group it, and to run it (alone, or
    // decoded as a step of its run).
    let first = command::Command::read(&sh.ctx.dma, &v.chains[v.next].1);
    let (read, kind) = if cancel || v.drain.is_some() || sh.drain.requested() {
        (Vec::new(), Group::One)
    } else {
        group_at(sh, &first, &v.chains[v.next..])
    };
    if (cancel || kind == Group::One) && !v.flights.is_empty() {
        // It runs after what is in flight.
        return false;
    }
    let context = first
        .as_ref()
        .ok()
        .and_then(command::Command::device_context);
    if !cancel && in_partition > 0 && context.is_some_and(|c| c != s.context) {
        // Another context's runs are in flight: it goes once they are done.
        return false;
    }
    if !cancel && kind == Group::One {
        if in_partition > 0 && !first.as_ref().is_ok_and(command::Command::partition_free) {
            // Nothing else runs on the partition while runs are in flight.
            return false;
        }
        let wait = first.as_ref().ok().and_then(|c| c.wait_value(&sh.ctx.dma));
        if wait == Some(Ok(false)) {
            // Later commands of the queue wait for it; its condition is
            // looked at again on the next scan.
            v.parked = true;
            return false;
        }
    }
    if !cancel {
        if let Some(gate) = &sh.gate {
            let give_up = || v.stale(sh) || sh.drain.expired() || sh.suspended();
            if !gate.enter(&give_up) {
                if v.stale(sh) {
                    v.closed = true;
                    return false;
                }
                if sh.suspended() {
                    park_for_resume(sh, v);
                    return false;
                }
                if !v.flights.is_empty() || in_partition > 0 {
                    // Completions go in order, and the partition is busy:
                    // what is in flight first.
                    return false;
                }
                cancel = true;
            }
        }
    }
    // A cancelled command goes alone: the next is judged anew.
    let range = v.next..v.next + if cancel { 1 } else { read.len().max(1) };
    v.next = range.end;
    if !cancel && kind == Group::Run {
        if s.depth > 1 && range.end == v.chains.len() {
            pop_more(sh, v);
        }
        // Where the partition has lanes, every run is kept in flight, so
        // that work on other queues goes beside it while it runs (the
        // partition answers a short one at once all the same). Else a
        // run with nothing in flight before it goes in one exchange with
        // the partition, unless it follows a long run and more follows
        // it.
        let lanes = s.lanes.len() > 1;
        let keep = (s.depth > 1 || lanes)
            && (in_partition > 0
                || others_waiting
                || lanes
                || (long && range.end < v.chains.len()));
        let group = &v.chains[range.clone()];
        let stop = || v.stale(sh);
        let context = context.unwrap_or(0);
        let flight = start_run(sh, (v.q, v.lane), group, read, range, keep, &stop);
        if matches!(flight.state, FlightState::InFlight) {
            s.lanes[v.lane].push_back(vi);
            s.context = context;
        }
        v.flights.push_back(flight);
        return true;
    }
    let group = &v.chains[range];
    let began = sh.epoch.elapsed();
    let outcomes = if cancel {
        vec![command::Outcome::status(abi::STATUS_CANCELLED)]
    } else {
        run_one(sh, v.q, group, vec![first])
    };
    trace_run(sh, v.q, "One", group, began, v.chains.len());
    let (q, gens) = (v.q, v.gens);
    v.completed = true;
    match complete_group(sh, q, &mut v.ring, group, outcomes, cancel, &|| {
        stale(sh, q, gens)
    }) {
        Ok(irq) => v.notify |= irq,
        Err(()) => v.closed = true,
    }
    true
}

/// How long the worker waits for a run in flight to finish before it
/// looks at the queues again.
const FINISH_LOOK: Duration = Duration::from_micros(200);

/// What [`finish_next`] did.
enum Next {
    /// Completed a run.
    Finished,
    /// Runs are in flight; none finished within [`FINISH_LOOK`].
    Pending,
    /// Nothing is in flight.
    Idle,
}

/// Waits a while for the partition to finish a run in flight and
/// completes it.
fn finish_next(sh: &Shared, visits: &mut [Visit], s: &mut Scan) -> Next {
    let Some(busy) = s.lanes.iter().position(|l| !l.is_empty()) else {
        return Next::Idle;
    };
    let q = visits[s.lanes[busy][0]].q;
    let finished =
        match with_partition(sh, q, |ctx| ctx.partition.finish_queued_within(FINISH_LOOK)) {
            Finishing::Done(lane, f) => Some((lane, f)),
            Finishing::Pending => return Next::Pending,
            Finishing::Idle => None,
        };
    // Lost (each step of what was in flight fails): the oldest run of
    // the first busy lane takes it.
    let lane = match &finished {
        Some((lane, _)) if s.lanes.get(*lane).is_some_and(|l| !l.is_empty()) => *lane,
        Some((lane, _)) => {
            debug!(
                "{}: the partition finished a run on idle lane {lane}",
                sh.name
            );
            busy
        }
        None => busy,
    };
    let vi = s.lanes[lane].pop_front().expect("a busy lane");
    let v = &mut visits[vi];
    let flight = v.flights.pop_front().expect("its run");
    complete_run(sh, v, flight, Some(finished.map(|(_, f)| f)));
    Next::Finished
}

/// Completes `flight`, the oldest run of visit `v`, with what the
/// partition gave for it if it was in flight (see [`finish_run`]).
fn complete_run(
    sh: &Shared,
    v: &mut Visit,
    flight: Flight,
    finished: Option<Option<vgpu_backend::Finished>>,
) {
    if v.closed {
        // Nothing of it is run or written for a queue that went away.
        return;
    }
    let group = &v.chains[flight.chains.clone()];
    let began = flight.start;
    let outcomes = finish_run(sh, (v.q, v.lane), flight, group, finished);
    trace_run(sh, v.q, "Run", group, began, v.chains.len());
    let (q, gens) = (v.q, v.gens);
    v.completed = true;
    match complete_group(sh, q, &mut v.ring, group, outcomes, false, &|| {
        stale(sh, q, gens)
    }) {
        Ok(irq) => v.notify |= irq,
        Err(()) => {
            v.closed = true;
            return;
        }
    }
    if !v.flights.is_empty() {
        // The guest hears of this run while the next is in flight.
        if wants_irq(sh, &mut v.ring, v.notify) {
            sh.raise(v.vector, abi::IRQ_CAUSE_QUEUE);
        }
        v.notify = false;
    }
}

/// Takes what the guest submitted since the visit's chains were popped,
/// up to [`VISIT`] in all, unless the ring failed or a drain began.
fn pop_more(sh: &Shared, v: &mut Visit) {
    if v.failure.is_none() && v.chains.len() < VISIT && !sh.drain.requested() {
        v.failure = pop_chains(sh, &mut v.ring, VISIT - v.chains.len(), &mut v.chains);
    }
}

/// Pops up to `max` descriptor chains into `chains`, under a short view of
/// guest memory. Returns the ring error that ended it early, if any.
fn pop_chains(
    sh: &Shared,
    ring: &mut Queue,
    max: usize,
    chains: &mut Vec<(u16, Vec<Desc>)>,
) -> Option<u32> {
    let view = sh.ctx.dma.view();
    let (table, size) = (ring.desc_table(), ring.size());
    // What is published now; the iterator sees at least this much.
    let published = ring
        .avail_idx(&view, Ordering::Acquire)
        .map(|idx| idx.0.wrapping_sub(ring.next_avail()))
        .unwrap_or(0);
    let expected = usize::from(published).min(max);
    let before = chains.len();
    match ring.iter(&view) {
        Err(virtio_queue::Error::InvalidAvailRingIndex) => Some(abi::ERR_RING_CORRUPT),
        Err(_) => Some(abi::ERR_RING_ADDRESS),
        Ok(iter) => {
            for chain in iter.take(max) {
                let head = chain.head_index();
                match walk_chain(&view, table, size, head) {
                    Ok(descs) => chains.push((head, descs)),
                    Err(code) => return Some(code),
                }
            }
            // An entry the iterator could not read ends it early.
            (chains.len() - before < expected).then_some(abi::ERR_RING_ADDRESS)
        }
    }
}

/// Reads the chain starting at `head` from the descriptor table, refusing
/// anything the device did not offer or a driver could not mean: an index
/// past the table, a loop (so at most `size` descriptors), an indirect
/// table.
fn walk_chain(view: &DmaView<'_>, table: u64, size: u16, head: u16) -> Result<Vec<Desc>, u32> {
    const F_NEXT: u16 = 1;
    const F_WRITE: u16 = 2;
    const F_INDIRECT: u16 = 4;
    if head >= size {
        return Err(abi::ERR_RING_CORRUPT);
    }
    // One bit per descriptor of the largest ring, on the stack.
    let mut seen = [0u64; abi::MAX_QUEUE_SIZE as usize / 64];
    let mut out = Vec::with_capacity(4);
    let mut idx = head;
    loop {
        let (word, bit) = (usize::from(idx) / 64, 1u64 << (idx % 64));
        if seen[word] & bit != 0 {
            return Err(abi::ERR_RING_CORRUPT);
        }
        seen[word] |= bit;
        let mut raw = [0u8; 16];
        view.read_slice(&mut raw, GuestAddress(table + 16 * u64::from(idx)))
            .map_err(|_| abi::ERR_RING_ADDRESS)?;
        let addr = u64::from_le_bytes([
            raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
        ]);
        let len = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
        let flags = u16::from_le_bytes([raw[12], raw[13]]);
        let next = u16::from_le_bytes([raw[14], raw[15]]);
        if flags & F_INDIRECT != 0 {
            return Err(abi::ERR_RING_CORRUPT);
        }
        out.push(Desc {
            addr,
            len,
            writable: flags & F_WRITE != 0,
        });
        if flags & F_NEXT == 0 {
            return Ok(out);
        }
        if next >= size {
            return Err(abi::ERR_RING_CORRUPT);
        }
        idx = next;
    }
}

/// Where a queue's time goes between and inside its runs.
fn trace_run(
    sh: &Shared,
    q: u32,
    kind: &str,
    group: &[(u16, Vec<Desc>)],
    began: Duration,
    popped: usize,
) {
    if log_enabled!(Level::Trace) {
        trace!(
            "{}: queue {q}: {kind} of {} (opcode {:?} first, of {} popped) ran {}..{} us",
            sh.name,
            group.len(),
            command::opcode(&sh.ctx.dma, &group[0].1),
            popped,
            began.as_micros(),
            sh.epoch.elapsed().as_micros()
        );
    }
}

/// Charges `outcomes` to the gate (unless cancelled) and completes the
/// commands of `group` with them. Returns whether one asks for an
/// interrupt regardless of suppression; Err when nothing more may be
/// written to the ring (it broke, or the queue went away meanwhile).
fn complete_group(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    group: &[(u16, Vec<Desc>)],
    outcomes: Vec<command::Outcome>,
    cancel: bool,
    stale: &dyn Fn() -> bool,
) -> Result<bool, ()> {
    if !cancel {
        if let Some(gate) = &sh.gate {
            let device_ns = outcomes.iter().map(|o| o.device_ns).sum();
            let bytes = outcomes.iter().map(|o| o.bytes).sum();
            gate.leave(Duration::from_nanos(device_ns), bytes);
        }
    }
    let mut notify = false;
    for ((head, descs), outcome) in group.iter().zip(outcomes) {
        if stale() {
            // The queue went away while its group ran on the device:
            // nothing more is written to the old ring.
            return Err(());
        }
        notify |= complete(sh, q, ring, (*head, descs), outcome, cancel)?;
    }
    Ok(notify)
}

/// Whether the guest asked to hear of the completions written so far
/// (event index), or a command asked for an interrupt regardless.
fn wants_irq(sh: &Shared, ring: &mut Queue, forced: bool) -> bool {
    let view = sh.ctx.dma.view();
    // Asked even when forced: it moves the ring's notification point.
    ring.needs_notification(&view).unwrap_or(true) || forced
}

/// How the chains of a group run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// One command, on its own.
    One,
    /// A queued run of steps: launches, timestamps, fills, device
    /// copies, and copies between guest and device memory all one way.
    Run,
}

/// How many chains from the start of `chains` run together as one queued
/// run (at most [`BATCH`], which bounds how long a run holds the GPU), as
/// their commands read (once: the run decodes these; the first is
/// `first`, already read), or else that the first command runs alone (no
/// commands). A run's guest memory stays
/// locked until the run is over, so a run with guest copies holds no
/// launch (a kernel may run long, and a DMA_UNMAP would wait for it) and
/// moves guest memory one way; NOPs, timestamps, fills and device copies
/// go with either kind.
fn group_at(
    sh: &Shared,
    first: &Result<command::Command, u32>,
    chains: &[(u16, Vec<Desc>)],
) -> (Vec<command::Command>, Group) {
    let dma = &sh.ctx.dma;
    // The run's guest copies' direction, or that it has a launch.
    let mut class: Option<Option<bool>> = None;
    let mut read = Vec::new();
    for (i, (_, descs)) in chains.iter().enumerate().take(BATCH) {
        let cmd = if i == 0 {
            first.clone()
        } else {
            command::Command::read(dma, descs)
        };
        let Ok(cmd) = cmd else {
            break;
        };
        if read
            .first()
            .is_some_and(|f: &command::Command| f.context() != cmd.context())
        {
            // A run is one context's.
            break;
        }
        let this = match cmd.step_kind() {
            None => break,
            Some(command::StepKind::Device { launch: false }) => None,
            Some(command::StepKind::Device { launch: true }) => Some(None),
            Some(command::StepKind::Guest(to_device)) => Some(Some(to_device)),
        };
        if let Some(this) = this {
            if *class.get_or_insert(this) != this {
                break;
            }
        }
        read.push(cmd);
    }
    if read.is_empty() {
        (read, Group::One)
    } else {
        (read, Group::Run)
    }
}

/// A command of a run as decoded: its step (`None`: a NOP), or the
/// status it completes with.
type Decoded = Result<Option<command::Step>, u32>;

/// A group of commands started as one queued run of the partition.
struct Flight {
    /// Its commands: which of the visit's chains.
    chains: Range<usize>,
    /// Each command as read.
    read: Vec<command::Command>,
    /// Each command as decoded, or the status it completes with.
    decoded: Vec<Decoded>,
    /// When it was started, on the device epoch's clock.
    start: Duration,
    state: FlightState,
}

enum FlightState {
    /// The partition ran it before it returned.
    Done(Vec<QueuedDone>),
    /// In flight: [`Partition::finish_queued`] gives its results.
    InFlight,
    /// Some of its guest memory has no host address: its commands run
    /// one by one on their own paths (which say where each failed), once
    /// what was started before them is finished.
    Alone,
}

impl Flight {
    /// Whether it can be completed without waiting for the partition: it
    /// ran when started, or its commands run one by one and the partition
    /// is `idle`.
    fn ready(&self, idle: bool) -> bool {
        match self.state {
            FlightState::Done(_) => true,
            FlightState::Alone => idle,
            FlightState::InFlight => false,
        }
    }

    /// Whether nothing may start after it until it is finished.
    fn barrier(&self) -> bool {
        matches!(self.state, FlightState::Alone)
    }
}

/// Calls `f` with the partition (locked), then notes its memory in use
/// and whether it lost its device state.
fn with_partition<R>(sh: &Shared, q: u32, f: impl FnOnce(&mut command::Ctx<'_>) -> R) -> R {
    let mut part = sh.partition.lock();
    let mut functions = lock(&sh.functions);
    let mut ctx = command::Ctx {
        dma: &sh.ctx.dma,
        partition: &mut **part,
        functions: &mut functions,
        window: &sh.window,
        epoch: sh.epoch,
    };
    let out = f(&mut ctx);
    drop(functions);
    let used = part.memory_used();
    sh.counters.mem_used.store(used, Ordering::Relaxed);
    if let Some(n) = part.contexts() {
        let c = &sh.counters;
        c.contexts.store(n.now, Ordering::Relaxed);
        c.contexts_started.store(n.started, Ordering::Relaxed);
        c.context_start_ns.store(n.start_ns, Ordering::Relaxed);
        c.contexts_reused.store(n.reused, Ordering::Relaxed);
        c.context_memory.store(n.memory, Ordering::Relaxed);
    }
    sh.counters.mem_peak.fetch_max(used, Ordering::Relaxed);
    let lost = part.is_lost();
    drop(part);
    if lost {
        sh.function_lost(q);
    }
    out
}

/// Runs the commands of `group`, as `read`, one by one; returns each
/// one's outcome.
fn run_one(
    sh: &Shared,
    q: u32,
    group: &[(u16, Vec<Desc>)],
    read: Vec<Result<command::Command, u32>>,
) -> Vec<command::Outcome> {
    with_partition(sh, q, |ctx| {
        group
            .iter()
            .zip(&read)
            .map(|((_, descs), cmd)| {
                let context = cmd.as_ref().ok().and_then(command::Command::device_context);
                match context.map(|c| ctx.partition.set_context(c)) {
                    Some(Err(e)) => command::Outcome::status(e.status()),
                    _ => command::execute(ctx, cmd, descs),
                }
            })
            .collect()
    })
}

/// Decodes the steps of `group` (the visit's chains `range`, whose
/// commands are `read`) and starts them as one queued run on queue `q`'s
/// lane `lane`, left in flight if `keep` and the partition
/// can. The guest memory of its copies is held mapped
/// (the DMA table's read lock) while the partition takes them: until the
/// run is over, or, for a partition that keeps runs in flight, until it
/// holds the memory itself. Once `stop` says so, a partition running the
/// steps one by one refuses the rest (their completions are not written).
fn start_run(
    sh: &Shared,
    (q, lane): (u32, usize),
    group: &[(u16, Vec<Desc>)],
    read: Vec<command::Command>,
    range: Range<usize>,
    keep: bool,
    stop: &dyn Fn() -> bool,
) -> Flight {
    // `keep`: leave it in flight if the partition can.
    let go = |p: &mut dyn vgpu_backend::Partition, queued: &[Queued<'_>]| {
        if keep {
            // The DMA table's lock goes when this returns.
            p.start_queued(lane, queued, stop, false)
        } else {
            Started::Done(p.run_queued(queued, stop))
        }
    };
    with_partition(sh, q, |ctx| {
        // A run is one context's (see `group_at`).
        let context = read.first().map_or(0, command::Command::context);
        if let Err(e) = ctx.partition.set_context(context) {
            return Flight {
                chains: range,
                decoded: read.iter().map(|_| Err(e.status())).collect(),
                read,
                start: ctx.epoch.elapsed(),
                state: FlightState::Done(Vec::new()),
            };
        }
        // Decoded from the bytes the run was grouped by: its guest copies
        // all go one way, and none goes beside a launch.
        let decoded: Vec<Decoded> = group
            .iter()
            .zip(&read)
            .map(|((_, descs), cmd)| command::step(ctx, cmd, descs))
            .collect();
        // The run's guest memory is resolved for that one direction.
        let to_device = decoded
            .iter()
            .flatten()
            .flatten()
            .find_map(|s| s.host_memory().map(|(_, up)| up))
            .unwrap_or(true);
        let ranges: Vec<(u64, u64)> = decoded
            .iter()
            .flatten()
            .flatten()
            .filter_map(|s| s.host_memory())
            .flat_map(|(c, _)| c.ranges.iter().copied())
            .collect();
        let start = ctx.epoch.elapsed();
        // NOPs are no steps: they complete in order with the run.
        let steps: Vec<&command::Step> = decoded.iter().flatten().flatten().collect();
        let started = if ranges.is_empty() {
            // No guest memory: the run needs no lock on the DMA table. (A
            // guest copy has ranges, so this closure is never called.)
            // SAFETY: no slices.
            let none = || unsafe { SliceMemory::new(&[]) };
            let queued: Vec<Queued<'_>> = steps
                .iter()
                .map(|s| s.as_ref().map(command::OwnedLaunch::launch, |_, _| none()))
                .collect();
            Ok(go(&mut *ctx.partition, &queued))
        } else {
            let partition = &mut *ctx.partition;
            ctx.dma.with_host_slices(&ranges, !to_device, |slices| {
                let slices = command::host_slices(slices);
                // Each copy's ranges add up to its size, and no slice
                // spans two ranges: the slices divide between the copies
                // by their sizes.
                let mut at = 0;
                let queued: Vec<Queued<'_>> = steps
                    .iter()
                    .map(|s| {
                        s.as_ref().map(command::OwnedLaunch::launch, |c, _| {
                            let first = at;
                            let mut bytes = 0u64;
                            while bytes < c.size && at < slices.len() {
                                bytes += slices[at].len as u64;
                                at += 1;
                            }
                            // SAFETY: the DMA table stays read-locked, so
                            // every slice stays mapped (writable ones for
                            // downloads, which is what was asked for)
                            // until this closure returns, which is as
                            // long as the partition may use them (see
                            // `Partition::start_queued`); guest memory is
                            // no Rust object's.
                            unsafe { SliceMemory::new(&slices[first..at]) }
                        })
                    })
                    .collect();
                go(partition, &queued)
            })
        };
        let state = match started {
            Ok(Started::Done(done)) => FlightState::Done(done),
            Ok(Started::InFlight) => FlightState::InFlight,
            Err(_) => FlightState::Alone,
        };
        Flight {
            chains: range,
            read,
            decoded,
            start,
            state,
        }
    })
}

/// The outcome of each command of `flight` (whose commands are
/// `group`): `finished` is what the partition gave for a run that was in
/// flight (`None` inside: it lost it, and each step fails). A
/// timestamp's result is its step's end on the device's clock, counted
/// from the device epoch; each command is charged the device time since
/// the previous step ended.
fn finish_run(
    sh: &Shared,
    (q, lane): (u32, usize),
    flight: Flight,
    group: &[(u16, Vec<Desc>)],
    finished: Option<Option<vgpu_backend::Finished>>,
) -> Vec<command::Outcome> {
    let start = flight.start.as_nanos() as u64;
    let (done, began) = match (flight.state, finished) {
        (FlightState::Done(done), _) => (done, start),
        (FlightState::InFlight, Some(Some(f))) => (f.done, start.saturating_add(f.waited_ns)),
        (FlightState::InFlight, _) => (Vec::new(), start),
        (FlightState::Alone, _) => {
            return run_one(sh, q, group, flight.read.into_iter().map(Ok).collect())
        }
    };
    // Runs of a lane go one after the other: where the times a run's
    // start is reckoned from (the daemon's clock when it was sent, how
    // long the host says it waited) put it before the previous run's
    // end, it began at that end.
    let last_end = &sh.last_run_end[lane % sh.last_run_end.len()];
    let began = began.max(last_end.load(Ordering::Relaxed));
    let mut shared = 0;
    if let Some(last) = done.last() {
        // The device was busy with this vGPU's runs until the latest end
        // of any lane's (this lane's own ends no later than `began`).
        let busy = sh
            .last_run_end
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        shared = busy.saturating_sub(began).min(last.end_ns);
        sh.last_run_ns.store(last.end_ns, Ordering::Relaxed);
        last_end.store(began.saturating_add(last.end_ns), Ordering::Relaxed);
    }
    let mut out = outcomes(&flight.decoded, done, |step, end| command::Outcome {
        status: abi::STATUS_OK,
        result: match step {
            command::Step::Timestamp => began.saturating_add(end),
            _ => 0,
        },
        bytes: step.host_memory().map_or(0, |(c, _)| c.size),
        ..Default::default()
    });
    charge_once(&mut out, shared);
    out
}

/// Takes `shared` ns off the device time of a run's first commands: the
/// part of the run that overlapped runs of other lanes already charged.
/// A tenant's streams that overlap occupy the device for the union of
/// their times, which is what the scheduler and the busy counters see.
fn charge_once(outcomes: &mut [command::Outcome], mut shared: u64) {
    for o in outcomes {
        if shared == 0 {
            break;
        }
        let cut = o.device_ns.min(shared);
        o.device_ns -= cut;
        shared -= cut;
    }
}

/// Each command's outcome in a queued run: one that did not decode
/// completes with its status, a NOP succeeds, the others take the run's
/// results in order, each charged the device time since the previous
/// step ended. `ok` says what a step that succeeded returns, given its
/// end.
fn outcomes(
    decoded: &[Decoded],
    done: Vec<vgpu_backend::QueuedDone>,
    ok: impl Fn(&command::Step, u64) -> command::Outcome,
) -> Vec<command::Outcome> {
    let mut done = done.into_iter();
    let mut last_end = 0;
    decoded
        .iter()
        .map(|d| {
            let step = match d {
                Ok(None) => return command::Outcome::status(abi::STATUS_OK),
                Ok(Some(step)) => step,
                Err(status) => return command::Outcome::status(*status),
            };
            let Some(r) = done.next() else {
                return command::Outcome::status(abi::STATUS_DEVICE_ERROR);
            };
            let end = r.end_ns.max(last_end);
            let device_ns = end - last_end;
            last_end = end;
            match r.result {
                Ok(()) => command::Outcome {
                    device_ns,
                    ..ok(step, end)
                },
                Err(e) => command::Outcome {
                    device_ns,
                    ..command::Outcome::status(command::op_status(e))
                },
            }
        })
        .collect()
}

/// Counts and completes one command: its completion record, its used
/// entry. Returns whether it asks for an interrupt; Err when the ring
/// broke (the queue is stopped).
fn complete(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    (head, descs): (u16, &[Desc]),
    outcome: command::Outcome,
    cancel: bool,
) -> Result<bool, ()> {
    if sh.drain.requested() {
        sh.drain.completed.fetch_add(1, Ordering::Relaxed);
        if cancel {
            sh.drain.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
    let c = &sh.counters;
    c.busy_ns.fetch_add(outcome.device_ns, Ordering::Relaxed);
    if !cancel {
        c.commands.fetch_add(1, Ordering::Relaxed);
    }
    if outcome.status == abi::STATUS_FAULT {
        c.faults.fetch_add(1, Ordering::Relaxed);
    }
    if outcome.status == abi::STATUS_KERNEL_FAULT {
        c.kernel_faults.fetch_add(1, Ordering::Relaxed);
    }
    let completion = abi::Completion {
        status: outcome.status,
        reserved: 0,
        result: outcome.result,
        device_ns: outcome.device_ns,
        result2: outcome.result2,
    };
    let size = std::mem::size_of::<abi::Completion>();
    let written = descs
        .iter()
        .rev()
        .find(|d| d.writable)
        .filter(|d| d.len as usize >= size)
        .is_some_and(|d| sh.ctx.dma.write(d.addr, completion.as_slice()).is_ok());
    if !written {
        debug!(
            "{}: queue {q}: command {head} has no usable completion buffer",
            sh.name
        );
    }
    let view = sh.ctx.dma.view();
    if ring
        .add_used(&view, head, if written { size as u32 } else { 0 })
        .is_err()
    {
        drop(view);
        sh.queue_error(q, abi::ERR_RING_ADDRESS, 0);
        return Err(());
    }
    Ok(outcome.force_irq)
}
