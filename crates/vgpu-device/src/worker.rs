//! The queue worker: an adaptive poller. While work arrives it watches the
//! doorbell page (local memory, no exits); after `poll_spin` without
//! activity it re-enables notifications (event index), tells the guest it
//! sleeps (POLLING = 0) and blocks on the wake eventfd, which the trapped
//! WAKE register (or its ioeventfd) signals.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, log_enabled, trace, Level};
use vfio_user_server::dma::DmaView;
use vgpu_abi as abi;
use vgpu_backend::{Queued, QueuedDone, SliceMemory, Started};
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
            for q in 0..sh.num_queues {
                let db = sh.doorbell(q);
                if force_scan || db != last_doorbell[q as usize] {
                    last_doorbell[q as usize] = db;
                    progressed |= process_queue(&sh, q, draining);
                }
            }
            force_scan = false;
        }
        if draining {
            // A full scan that found nothing: everything in flight when the
            // drain began has completed (or was cancelled).
            if progressed {
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
        // Going to sleep: ask for notifications, then look once more so a
        // submission racing with this cannot be missed.
        if !arm_notifications(&sh) {
            force_scan = true;
            continue;
        }
        // Blocks until WAKE, a queue change, a reset or stop.
        let _ = sh.wake.read();
        set_polling_all(&sh);
        force_scan = true;
        last_activity = Instant::now();
    }
    idle(&mut gated);
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

/// Takes up to [`BATCH`] commands from queue `q`, runs them and completes
/// them. Returns whether any work was done.
fn process_queue(sh: &Shared, q: u32, draining: bool) -> bool {
    let epoch = sh.epoch_gen.load(Ordering::SeqCst);
    if epoch & 1 == 1 {
        return false;
    }
    // Taken before the ring: a reconfiguration from here on is seen.
    let config_gen = sh.config_gen.load(Ordering::SeqCst);
    let (mut ring, generation, vector, limit) = {
        let mut st = lock(&sh.state);
        if st.status & abi::STATUS_ENABLED == 0 {
            return false;
        }
        let Some(qr) = st.queues.get_mut(q as usize) else {
            return false;
        };
        if qr.status & abi::QSTATUS_ERROR != 0 {
            return false;
        }
        // Every other user of the ring holds `busy`, as this thread does
        // now, so taking it out while working is invisible to them.
        let Some(ring) = qr.ring.take() else {
            return false;
        };
        (ring, qr.generation, qr.vector, qr.drain_limit)
    };
    let drain = draining.then_some(limit);
    let progressed = run_batch(
        sh,
        q,
        &mut ring,
        (epoch, config_gen, generation),
        vector,
        drain,
    );
    let mut st = lock(&sh.state);
    if let Some(qr) = st.queues.get_mut(q as usize) {
        // A queue reconfigured meanwhile keeps its new state.
        if qr.generation == generation && qr.ring.is_none() {
            qr.ring = Some(ring);
        }
    }
    progressed
}

/// (reset epoch, device config generation, queue generation) when a
/// batch started.
type Generations = (u64, u64, u64);

/// While draining: the queue's avail index when the drain began, if the
/// ring ran then (see `QueueRegs::drain_limit`).
type DrainLimit = Option<Option<u16>>;

/// Device time of a queued run from which the next is kept in flight
/// behind it. Starting a run ahead costs the partition a second exchange
/// (start, then finish) where running it costs one; behind a run this
/// long that exchange is hidden, and the device is kept busy between
/// runs. Behind a shorter one (launches trickling in one by one) it
/// would only halve how many runs a second the worker gets through.
const KEEP_AFTER: Duration = Duration::from_micros(50);

/// Most commands taken from one queue in one visit while runs are kept
/// in flight: a visit goes on taking what the guest submits meanwhile, up
/// to this, before the other queues get their turn.
const VISIT: usize = 4 * BATCH;

fn run_batch(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    gens: Generations,
    vector: u32,
    drain: DrainLimit,
) -> bool {
    let first = ring.next_avail();
    let mut chains = Vec::new();
    let mut failure = pop_chains(sh, ring, BATCH, &mut chains);
    let done = run_chains(
        sh,
        q,
        ring,
        gens,
        vector,
        (first, drain),
        &mut chains,
        &mut failure,
    );
    if let Some(code) = failure {
        // Commands popped before the bad one ran and completed; the queue
        // stops after them.
        debug!("{}: queue {q}: ring error {code}", sh.name);
        sh.queue_error(q, code, 0);
        return done || !chains.is_empty();
    }
    done
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

/// Runs popped chains in order and completes them. Returns whether any ran.
/// Consecutive launches, timestamps, fills, copies and NOPs run as one
/// queued run of the partition, so the device has them in flight
/// together; every other command runs alone. Where the partition keeps
/// several runs in flight, the next run is started before the previous
/// one is waited for, and the visit takes what the guest submits
/// meanwhile (up to [`VISIT`] commands, and not past a ring error, which
/// is left in `failure`).
#[allow(clippy::too_many_arguments)]
fn run_chains(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    (epoch, config_gen, generation): Generations,
    vector: u32,
    (first, drain): (u16, DrainLimit),
    chains: &mut Vec<(u16, Vec<Desc>)>,
    failure: &mut Option<u32>,
) -> bool {
    if chains.is_empty() {
        return false;
    }
    // Any queue reconfiguration bumps `config_gen`; only then is the
    // (locked) per-queue generation worth a look.
    let stale = || {
        sh.epoch_gen.load(Ordering::SeqCst) != epoch
            || (sh.config_gen.load(Ordering::SeqCst) != config_gen
                && sh.queue_generation(q) != Some(generation))
    };
    // Commands run one at a time while draining, each judged on its own.
    let depth = if drain.is_some() {
        1
    } else {
        lock(&sh.partition).queue_depth().max(1)
    };
    let mut notify = false;
    let mut flights: VecDeque<Flight> = VecDeque::new();
    let mut i = 0;
    'visit: loop {
        if stale() {
            // Reset or queue reconfiguration: queued work is dropped and
            // nothing more is written to the old ring (what is in flight
            // is waited for, so the partition is idle for the reset).
            settle(sh, q, flights);
            return true;
        }
        let holding = || sh.gate.as_ref().is_none_or(|g| g.holding());
        let long = sh.last_run_ns.load(Ordering::Relaxed) >= KEEP_AFTER.as_nanos() as u64;
        let may_start = flights.is_empty()
            || (long
                && flights.len() < depth
                && !flights.back().is_some_and(Flight::barrier)
                && holding());
        'start: {
            if i >= chains.len() || !may_start {
                break 'start;
            }
            // While draining, work the guest submitted after the drain
            // began is refused, and what is still waiting at the deadline
            // is cancelled; either way the guest gets a completion.
            let position = first.wrapping_add(i as u16);
            // (A batch popped before the worker saw the drain is all in flight.)
            let mut cancel = sh.drain.expired()
                || drain
                    .is_some_and(|limit| limit.is_none_or(|l| position.wrapping_sub(l) < 0x8000));
            let (steps, kind) = if cancel || drain.is_some() || sh.drain.requested() {
                (0, Group::One)
            } else {
                group_at(sh, &chains[i..])
            };
            if (cancel || kind == Group::One) && !flights.is_empty() {
                // It runs after what is in flight.
                break 'start;
            }
            if !cancel {
                if let Some(gate) = &sh.gate {
                    let give_up = || stale() || sh.drain.expired();
                    if !gate.enter(&give_up) {
                        if stale() {
                            settle(sh, q, flights);
                            return true;
                        }
                        if !flights.is_empty() {
                            // Completions go in order: what is in
                            // flight first.
                            break 'start;
                        }
                        cancel = true;
                    }
                }
            }
            // A cancelled command goes alone: the next is judged anew.
            let range = i..i + if cancel { 1 } else { steps.max(1) };
            i = range.end;
            if !cancel && kind == Group::Run {
                if depth > 1 && range.end == chains.len() {
                    pop_more(sh, ring, chains, failure);
                }
                // A run with nothing in flight before it and nothing to
                // follow it, or after a short run, goes in one exchange
                // with the partition.
                let keep = depth > 1 && long && (!flights.is_empty() || range.end < chains.len());
                let group = &chains[range.clone()];
                flights.push_back(start_run(sh, q, group, range, keep, &stale));
                continue 'visit;
            }
            let group = &chains[range];
            let began = sh.epoch.elapsed();
            let outcomes = if cancel {
                vec![command::Outcome::status(abi::STATUS_CANCELLED)]
            } else {
                run_one(sh, q, group)
            };
            trace_run(sh, q, "One", group, began, chains.len());
            match complete_group(sh, q, ring, group, outcomes, cancel, &stale) {
                Ok(irq) => notify |= irq,
                Err(()) => return true,
            }
            continue 'visit;
        }
        if i == chains.len() && !flights.is_empty() && flights.len() < depth {
            // Keeps the device fed with what the guest submitted while
            // the runs in flight went on.
            pop_more(sh, ring, chains, failure);
            if i < chains.len() {
                continue;
            }
        }
        let Some(flight) = flights.pop_front() else {
            break;
        };
        let group = &chains[flight.chains.clone()];
        let began = flight.start;
        let outcomes = finish_run(sh, q, flight, group);
        trace_run(sh, q, "Run", group, began, chains.len());
        match complete_group(sh, q, ring, group, outcomes, false, &stale) {
            Ok(irq) => notify |= irq,
            Err(()) => {
                settle(sh, q, flights);
                return true;
            }
        }
        if !flights.is_empty() {
            // The guest hears of this run while the next is in flight.
            if wants_irq(sh, ring, notify) {
                sh.raise(vector, abi::IRQ_CAUSE_QUEUE);
            }
            notify = false;
        }
    }
    if wants_irq(sh, ring, notify) {
        sh.raise(vector, abi::IRQ_CAUSE_QUEUE);
    }
    true
}

/// Takes what the guest submitted since the visit's chains were popped,
/// up to [`VISIT`] in all, unless the ring failed or a drain began.
fn pop_more(
    sh: &Shared,
    ring: &mut Queue,
    chains: &mut Vec<(u16, Vec<Desc>)>,
    failure: &mut Option<u32>,
) {
    if failure.is_none() && chains.len() < VISIT && !sh.drain.requested() {
        *failure = pop_chains(sh, ring, VISIT - chains.len(), chains);
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
/// run (at most [`BATCH`], which bounds how long a run holds the GPU), or else that the first command
/// runs alone. A run's guest memory stays locked until the run is over,
/// so a run with guest copies holds no launch (a kernel may run long,
/// and a DMA_UNMAP would wait for it) and moves guest memory one way;
/// NOPs, timestamps, fills and device copies go with either kind.
fn group_at(sh: &Shared, chains: &[(u16, Vec<Desc>)]) -> (usize, Group) {
    let dma = &sh.ctx.dma;
    // The run's guest copies' direction, or that it has a launch.
    let mut class: Option<Option<bool>> = None;
    let steps = chains
        .iter()
        .take(BATCH)
        .take_while(|(_, descs)| {
            let this = match command::step_kind(dma, descs) {
                None => return false,
                Some(command::StepKind::Device { launch: false }) => return true,
                Some(command::StepKind::Device { launch: true }) => None,
                Some(command::StepKind::Guest(to_device)) => Some(to_device),
            };
            *class.get_or_insert(this) == this
        })
        .count();
    if steps > 0 {
        (steps, Group::Run)
    } else {
        (0, Group::One)
    }
}

/// A group of commands started as one queued run of the partition.
struct Flight {
    /// Its commands: which of the visit's chains.
    chains: Range<usize>,
    /// Each command as decoded, or the status it completes with.
    decoded: Vec<Result<command::Step, u32>>,
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
    /// Whether nothing may start after it until it is finished.
    fn barrier(&self) -> bool {
        matches!(self.state, FlightState::Alone)
    }
}

/// Calls `f` with the partition (locked), then notes its memory in use
/// and whether it lost its device state.
fn with_partition<R>(sh: &Shared, q: u32, f: impl FnOnce(&mut command::Ctx<'_>) -> R) -> R {
    let mut part = lock(&sh.partition);
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
    sh.counters.mem_peak.fetch_max(used, Ordering::Relaxed);
    let lost = part.is_lost();
    drop(part);
    if lost {
        sh.function_lost(q);
    }
    out
}

/// Runs the commands of `group` one by one; returns each one's outcome.
fn run_one(sh: &Shared, q: u32, group: &[(u16, Vec<Desc>)]) -> Vec<command::Outcome> {
    with_partition(sh, q, |ctx| {
        group
            .iter()
            .map(|(_, descs)| command::execute(ctx, descs))
            .collect()
    })
}

/// Decodes the steps of `group` (the visit's chains `range`) and starts
/// them as one queued run, left in flight if `keep` and the partition
/// can. The guest memory of its copies is held mapped
/// (the DMA table's read lock) while the partition takes them: until the
/// run is over, or, for a partition that keeps runs in flight, until it
/// holds the memory itself. Once `stop` says so, a partition running the
/// steps one by one refuses the rest (their completions are not written).
fn start_run(
    sh: &Shared,
    q: u32,
    group: &[(u16, Vec<Desc>)],
    range: Range<usize>,
    keep: bool,
    stop: &dyn Fn() -> bool,
) -> Flight {
    // `keep`: leave it in flight if the partition can.
    let go = |p: &mut dyn vgpu_backend::Partition, queued: &[Queued<'_>]| {
        if keep {
            // The DMA table's lock goes when this returns.
            p.start_queued(queued, stop, false)
        } else {
            Started::Done(p.run_queued(queued, stop))
        }
    };
    with_partition(sh, q, |ctx| {
        let mut decoded: Vec<Result<command::Step, u32>> = group
            .iter()
            .map(|(_, descs)| command::step(ctx, descs))
            .collect();
        // The run's guest memory is resolved for one direction: a
        // command the guest rewrote since it was grouped, to go the other
        // way or to launch a kernel beside guest copies, is refused.
        let to_device = decoded
            .iter()
            .flatten()
            .find_map(|s| s.guest().map(|c| c.to_device));
        for d in &mut decoded {
            let refused = d.as_ref().is_ok_and(|s| match (s, to_device) {
                (command::Step::Launch(_), Some(_)) => true,
                (s, Some(way)) => s.guest().is_some_and(|c| c.to_device != way),
                (_, None) => false,
            });
            if refused {
                *d = Err(abi::STATUS_INVALID);
            }
        }
        let to_device = to_device.unwrap_or(true);
        let ranges: Vec<(u64, u64)> = decoded
            .iter()
            .flatten()
            .filter_map(command::Step::guest)
            .flat_map(|c| c.ranges.iter().copied())
            .collect();
        let start = ctx.epoch.elapsed();
        let steps: Vec<&command::Step> = decoded.iter().flatten().collect();
        let started = if ranges.is_empty() {
            // No guest memory: the run needs no lock on the DMA table. (A
            // guest copy has ranges, so this closure is never called.)
            // SAFETY: no slices.
            let none = || unsafe { SliceMemory::new(&[]) };
            let queued: Vec<Queued<'_>> =
                steps.iter().filter_map(|s| s.queued(|_| none())).collect();
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
                    .filter_map(|s| {
                        s.queued(|c| {
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
            decoded,
            start,
            state,
        }
    })
}

/// Waits for `flight` (whose commands are `group`) and returns each
/// command's outcome. A timestamp's result is its step's end on the
/// device's clock, counted from the device epoch; each command is charged
/// the device time since the previous step ended.
fn finish_run(
    sh: &Shared,
    q: u32,
    flight: Flight,
    group: &[(u16, Vec<Desc>)],
) -> Vec<command::Outcome> {
    let start = flight.start.as_nanos() as u64;
    let (done, began) = match flight.state {
        FlightState::Done(done) => (done, start),
        FlightState::InFlight => match with_partition(sh, q, |ctx| ctx.partition.finish_queued()) {
            Some(f) => (f.done, start.saturating_add(f.waited_ns)),
            // Lost: each step fails.
            None => (Vec::new(), start),
        },
        FlightState::Alone => return run_one(sh, q, group),
    };
    // Runs of the partition go one after the other: where the times a
    // run's start is reckoned from (the daemon's clock when it was sent,
    // how long the host says it waited) put it before the previous run's
    // end, it began at that end.
    let began = began.max(sh.last_run_end.load(Ordering::Relaxed));
    if let Some(last) = done.last() {
        sh.last_run_ns.store(last.end_ns, Ordering::Relaxed);
        sh.last_run_end
            .store(began.saturating_add(last.end_ns), Ordering::Relaxed);
    }
    outcomes(&flight.decoded, done, |step, end| command::Outcome {
        status: abi::STATUS_OK,
        result: match step {
            command::Step::Timestamp => began.saturating_add(end),
            _ => 0,
        },
        bytes: step.guest().map_or(0, |c| c.size),
        ..Default::default()
    })
}

/// Waits for every run in `flights` and drops their results: the queue
/// went away, and the partition must be idle before anything else.
fn settle(sh: &Shared, q: u32, flights: VecDeque<Flight>) {
    for f in flights {
        if matches!(f.state, FlightState::InFlight) {
            with_partition(sh, q, |ctx| ctx.partition.finish_queued());
        }
    }
}

/// Each command's outcome in a queued run: one that did not decode
/// completes with its status, a NOP succeeds, the others take the run's
/// results in order, each charged the device time since the previous
/// step ended. `ok` says what a step that succeeded returns, given its
/// end.
fn outcomes(
    decoded: &[Result<command::Step, u32>],
    done: Vec<vgpu_backend::QueuedDone>,
    ok: impl Fn(&command::Step, u64) -> command::Outcome,
) -> Vec<command::Outcome> {
    let mut done = done.into_iter();
    let mut last_end = 0;
    decoded
        .iter()
        .map(|d| {
            let step = match d {
                Ok(command::Step::Nop) => return command::Outcome::status(abi::STATUS_OK),
                Ok(step) => step,
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
