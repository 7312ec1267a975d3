//! The queue worker: an adaptive poller. While work arrives it watches the
//! doorbell page (local memory, no exits); after `poll_spin` without
//! activity it re-enables notifications (event index), tells the guest it
//! sleeps (POLLING = 0) and blocks on the wake eventfd, which the trapped
//! WAKE register (or its ioeventfd) signals.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Instant;

use log::{debug, log_enabled, trace, Level};
use vfio_user_server::dma::DmaView;
use vgpu_abi as abi;
use vgpu_backend::{Queued, SliceMemory};
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

fn run_batch(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    gens: Generations,
    vector: u32,
    drain: DrainLimit,
) -> bool {
    // Pop descriptor chains under a short view of guest memory.
    let mut chains: Vec<(u16, Vec<Desc>)> = Vec::new();
    let first = ring.next_avail();
    let failure = {
        let view = sh.ctx.dma.view();
        let (table, size) = (ring.desc_table(), ring.size());
        // What is published now; the iterator sees at least this much.
        let published = ring
            .avail_idx(&view, Ordering::Acquire)
            .map(|idx| idx.0.wrapping_sub(ring.next_avail()))
            .unwrap_or(0);
        let expected = usize::from(published).min(BATCH);
        match ring.iter(&view) {
            Err(virtio_queue::Error::InvalidAvailRingIndex) => Some(abi::ERR_RING_CORRUPT),
            Err(_) => Some(abi::ERR_RING_ADDRESS),
            Ok(iter) => {
                let mut failure = None;
                for chain in iter.take(BATCH) {
                    let head = chain.head_index();
                    match walk_chain(&view, table, size, head) {
                        Ok(descs) => chains.push((head, descs)),
                        Err(code) => {
                            failure = Some(code);
                            break;
                        }
                    }
                }
                // An entry the iterator could not read ends it early.
                if failure.is_none() && chains.len() < expected {
                    failure = Some(abi::ERR_RING_ADDRESS);
                }
                failure
            }
        }
    };
    if let Some(code) = failure {
        // Commands popped before the bad one still run and complete below;
        // the queue stops after them.
        debug!("{}: queue {q}: ring error {code}", sh.name);
        let done = run_chains(sh, q, ring, gens, vector, (first, drain), &chains);
        sh.queue_error(q, code, 0);
        return done || !chains.is_empty();
    }
    run_chains(sh, q, ring, gens, vector, (first, drain), &chains)
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
/// Consecutive launches and timestamps run as one queued run of the
/// partition, so the device has them in flight together; every other
/// command runs alone.
fn run_chains(
    sh: &Shared,
    q: u32,
    ring: &mut Queue,
    (epoch, config_gen, generation): Generations,
    vector: u32,
    (first, drain): (u16, DrainLimit),
    chains: &[(u16, Vec<Desc>)],
) -> bool {
    if chains.is_empty() {
        return false;
    }
    let mut notify = false;
    // Any queue reconfiguration bumps `config_gen`; only then is the
    // (locked) per-queue generation worth a look.
    let stale = || {
        sh.epoch_gen.load(Ordering::SeqCst) != epoch
            || (sh.config_gen.load(Ordering::SeqCst) != config_gen
                && sh.queue_generation(q) != Some(generation))
    };
    let mut i = 0;
    while i < chains.len() {
        if stale() {
            // Reset or queue reconfiguration: queued work is dropped and
            // nothing more is written to the old ring.
            return true;
        }
        // While draining, work the guest submitted after the drain began is
        // refused, and what is still waiting at the deadline is cancelled;
        // either way the guest gets a completion. Commands then run one
        // at a time, so each is judged on its own.
        let position = first.wrapping_add(i as u16);
        // (A batch popped before the worker saw the drain is all in flight.)
        let mut cancel = sh.drain.expired()
            || drain.is_some_and(|limit| limit.is_none_or(|l| position.wrapping_sub(l) < 0x8000));
        let (steps, kind) = if cancel || drain.is_some() || sh.drain.requested() {
            (0, Group::One)
        } else {
            group_at(sh, &chains[i..])
        };
        if !cancel {
            if let Some(gate) = &sh.gate {
                let give_up = || stale() || sh.drain.expired();
                if !gate.enter(&give_up) {
                    if stale() {
                        return true;
                    }
                    cancel = true;
                }
            }
        }
        let group = &chains[i..i + steps.max(1)];
        let began = log_enabled!(Level::Trace).then(|| sh.epoch.elapsed());
        let outcomes = if cancel {
            vec![command::Outcome::status(abi::STATUS_CANCELLED)]
        } else {
            run_group(sh, q, group, kind, &stale)
        };
        if let Some(began) = began {
            // Where a queue's time goes between and inside its runs.
            trace!(
                "{}: queue {q}: {kind:?} of {} (opcode {:?} first, of {} popped) ran {}..{} us",
                sh.name,
                group.len(),
                command::opcode(&sh.ctx.dma, &group[0].1),
                chains.len(),
                began.as_micros(),
                sh.epoch.elapsed().as_micros()
            );
        }
        if !cancel {
            if let Some(gate) = &sh.gate {
                let device_ns = outcomes.iter().map(|o| o.device_ns).sum();
                let bytes = outcomes.iter().map(|o| o.bytes).sum();
                gate.leave(std::time::Duration::from_nanos(device_ns), bytes);
            }
        }
        for ((head, descs), outcome) in group.iter().zip(outcomes) {
            if stale() {
                // The queue went away while its group ran on the device:
                // nothing more is written to the old ring.
                return true;
            }
            i += 1;
            match complete(sh, q, ring, (*head, descs), outcome, cancel) {
                Ok(irq) => notify |= irq,
                Err(()) => return true,
            }
            if i == chains.len() {
                let view = sh.ctx.dma.view();
                notify |= ring.needs_notification(&view).unwrap_or(true);
            }
        }
    }
    if notify {
        sh.raise(vector, abi::IRQ_CAUSE_QUEUE);
    }
    true
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
/// run (at most a run's worth of steps), or else that the first command
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
        .take(vgpu_backend::MAX_QUEUED_STEPS)
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

/// Runs `group` on the partition: one command, or a queued run (`kind`),
/// which `stop` abandons (a reset or queue change meanwhile). Returns
/// each command's outcome.
fn run_group(
    sh: &Shared,
    q: u32,
    group: &[(u16, Vec<Desc>)],
    kind: Group,
    stop: &dyn Fn() -> bool,
) -> Vec<command::Outcome> {
    let mut part = lock(&sh.partition);
    let mut functions = lock(&sh.functions);
    let mut ctx = command::Ctx {
        dma: &sh.ctx.dma,
        partition: &mut **part,
        functions: &mut functions,
        window: &sh.window,
        epoch: sh.epoch,
    };
    let out = match kind {
        Group::Run => run_steps(&mut ctx, group, stop),
        Group::One => group
            .iter()
            .map(|(_, descs)| command::execute(&mut ctx, descs))
            .collect(),
    };
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

/// Decodes the steps of `group` and runs them as one queued run, the
/// guest memory of its copies held mapped (the DMA table's read lock)
/// until the run is over, so the device keeps them in flight back to
/// back. A timestamp's result is its step's end on the device's clock,
/// counted from the device epoch; each command is charged the device
/// time since the previous step ended. Where some guest memory has no
/// host address, each command runs on its own path instead, which says
/// where it failed. Once `stop` says so, a partition running the steps
/// one by one refuses the rest (their completions are not written).
fn run_steps(
    ctx: &mut command::Ctx<'_>,
    group: &[(u16, Vec<Desc>)],
    stop: &dyn Fn() -> bool,
) -> Vec<command::Outcome> {
    let mut decoded: Vec<Result<command::Step, u32>> = group
        .iter()
        .map(|(_, descs)| command::step(ctx, descs))
        .collect();
    // The run's guest memory is resolved for one direction and stays
    // locked until the run ends: a command the guest rewrote since it was
    // grouped, to go the other way or to launch a kernel beside guest
    // copies, is refused.
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
    let start = ctx.epoch.elapsed().as_nanos() as u64;
    let steps: Vec<&command::Step> = decoded.iter().flatten().collect();
    let done = if ranges.is_empty() {
        // No guest memory: the run needs no lock on the DMA table. (A
        // guest copy has ranges, so this closure is never called.)
        // SAFETY: no slices.
        let none = || unsafe { SliceMemory::new(&[]) };
        let queued: Vec<Queued<'_>> = steps.iter().filter_map(|s| s.queued(|_| none())).collect();
        Ok(ctx.partition.run_queued(&queued, stop))
    } else {
        let partition = &mut *ctx.partition;
        ctx.dma.with_host_slices(&ranges, !to_device, |slices| {
            let slices = command::host_slices(slices);
            // Each copy's ranges add up to its size, and no slice spans
            // two ranges: the slices divide between the copies by their
            // sizes.
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
                        // downloads, which is what was asked for) until
                        // this closure returns, after the run; guest
                        // memory is no Rust object's.
                        unsafe { SliceMemory::new(&slices[first..at]) }
                    })
                })
                .collect();
            partition.run_queued(&queued, stop)
        })
    };
    let Ok(done) = done else {
        return group
            .iter()
            .map(|(_, descs)| command::execute(ctx, descs))
            .collect();
    };
    outcomes(&decoded, done, |step, end| command::Outcome {
        status: abi::STATUS_OK,
        result: match step {
            command::Step::Timestamp => start.saturating_add(end),
            _ => 0,
        },
        bytes: step.guest().map_or(0, |c| c.size),
        ..Default::default()
    })
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
