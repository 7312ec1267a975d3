//! The scheduler end to end: real vGPUs on the software backend, each
//! driven by a guest (`vgpu-testkit`) over its vfio-user socket, their
//! commands let onto the GPU by the daemon's `SchedGate`. Printed as
//! tables with targets:
//!
//! 1. Weighted fair share: three saturating tenants, weights 1:2:4, FILLs
//!    of 512 KiB; each tenant's share of device time in every 1 s window
//!    (sliding by 10 ms) against its configured share.
//! 2. Priority latency: a high-priority tenant submitting a 64 KiB FILL
//!    every 2-4 ms, alone and next to a saturating low-priority tenant;
//!    its submit-to-completion p99 against its idle p99 plus one slice.
//! 3. Fixed share: a tenant capped at 25% saturating while the others
//!    idle; its share of wall time in every 1 s window (sliding by 10 ms).
//! 4. Overhead: 16 saturating tenants, commands per second through the
//!    scheduler against the same vGPUs and guests with the scheduler
//!    bypassed: by a bare exclusive lock (the GPU still one vGPU's at a
//!    time, as the scheduler's model has it, while its runs are in
//!    flight), and by nothing at all (the software partitions then run
//!    side by side on the host's CPUs); with NOPs (pure overhead) and
//!    with FILLs of 512 KiB; variants alternate in rounds and the best
//!    round counts.
//!
//! The scheduler is configured as the daemon configures it: turns of one
//! slice (2 ms, `slice_us`'s default); priority aging ten slices. Guests
//! keep 500 commands queued (interrupt-driven queues of 1024 entries).
//! Device time per tenant is the scheduler's charge (what the backend
//! measured), sampled every 10 ms. `BENCH_ONLY=1,3` runs only the parts
//! listed. Run with
//!
//! ```text
//! cargo bench -p vgpud --bench sched_e2e
//! ```
//!
//! `BENCH_QUICK=1` runs every part briefly. The smoke run, `cargo bench
//! -p vgpud --bench sched_e2e -- --test` (or `cargo test -p vgpud
//! --bench sched_e2e`, which runs the binary without `--bench`), runs
//! every part for a fraction of a second and exits non-zero if one
//! panics or measures nothing (a ratio without a baseline); CI runs
//! every benchmark so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_backend::software::SoftwareBackend;
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_sched::{
    CommandGate, Policy, SchedConfig, SchedGate, Scheduler, TenantId, TenantParams, TenantPhase,
};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{Chain, Guest, GuestOptions, Mode};

const MS: Duration = Duration::from_millis(1);
/// The daemon's default slice (`slice_us`).
const SLICE: Duration = Duration::from_millis(2);
/// Device memory per vGPU.
const MEMORY: u64 = 64 << 20;
/// Queues of every vGPU.
const QUEUES: u32 = 8;
/// Commands a saturating guest keeps queued on each queue (two
/// descriptors each, in rings of 1024).
const DEPTH: usize = 500;
/// Bytes of a saturating FILL.
const FILL: u64 = 512 << 10;
/// Bytes of the latency-sensitive tenant's FILL.
const SMALL_FILL: u64 = 64 << 10;

struct Params {
    /// Rounds of each variant in part 4.
    rounds: usize,
    fair: Duration,
    latency: Duration,
    cap: Duration,
    overhead: Duration,
}

impl Params {
    fn new(mode: vgpu_benchkit::Mode) -> Self {
        match mode {
            vgpu_benchkit::Mode::Full => Params {
                rounds: 5,
                fair: Duration::from_secs(10),
                latency: Duration::from_secs(5),
                cap: Duration::from_secs(5),
                overhead: Duration::from_secs(2),
            },
            vgpu_benchkit::Mode::Quick => Params {
                rounds: 1,
                fair: Duration::from_secs(2),
                latency: Duration::from_millis(500),
                cap: Duration::from_secs(2),
                overhead: Duration::from_millis(300),
            },
            vgpu_benchkit::Mode::Smoke => Params {
                rounds: 1,
                fair: Duration::from_millis(300),
                latency: Duration::from_millis(100),
                cap: Duration::from_millis(300),
                overhead: Duration::from_millis(100),
            },
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The scheduler configuration the daemon would use with the default slice.
fn sched_config(policy: Policy) -> SchedConfig {
    let mut c = SchedConfig::new(policy);
    c.turn = SLICE;
    c
}

/// The simplest exclusive arbiter: one vGPU on the GPU at a time, whoever
/// asks first, no policy and no accounting. What the scheduler's cost is
/// measured against, as the GPU it models is one tenant's at a time too.
///
/// It follows the worker's protocol as the scheduler's gate does: a
/// worker calls `enter` for each run it starts and `leave` as each
/// finishes, and starts several before the first finishes (one per queue
/// in a round, and runs kept in flight on its lanes), so `enter` lets a
/// vGPU that holds the GPU through at once. A vGPU holds it while any run
/// it started is unfinished, and until its worker goes idle; then the
/// first one waiting gets it, and only its worker is woken.
#[derive(Default)]
struct Exclusive {
    state: Mutex<Holder>,
}

/// Who has the GPU, and who waits for it.
#[derive(Default)]
struct Holder {
    /// The vGPU on the GPU, and how many of its runs are unfinished.
    owner: Option<(usize, u64)>,
    /// vGPUs waiting, first come first, and how to wake each.
    waiting: std::collections::VecDeque<(usize, Arc<Condvar>)>,
}

impl Exclusive {
    fn lock(&self) -> std::sync::MutexGuard<'_, Holder> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Holder {
    /// Gives the GPU to the first vGPU waiting, if any.
    fn release(&mut self) {
        self.owner = self.waiting.pop_front().map(|(next, handed)| {
            handed.notify_one();
            (next, 1)
        });
    }
}

/// A vGPU's way through [`Exclusive`].
struct ExclusiveGate {
    lock: Arc<Exclusive>,
    id: usize,
    /// Signalled when the GPU is handed to this vGPU.
    handed: Arc<Condvar>,
}

impl CommandGate for ExclusiveGate {
    fn enter(&self, cancelled: &dyn Fn() -> bool) -> bool {
        let mut h = self.lock.lock();
        let free = h.waiting.is_empty();
        match &mut h.owner {
            // Another run of a vGPU already on the GPU.
            Some((owner, runs)) if *owner == self.id => {
                *runs += 1;
                return true;
            }
            None if free => {
                h.owner = Some((self.id, 1));
                return true;
            }
            _ => {}
        }
        h.waiting.push_back((self.id, self.handed.clone()));
        loop {
            h = self
                .handed
                .wait_timeout(h, 5 * MS)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            // Handed over by `release`, run counted.
            if h.owner.is_some_and(|(owner, _)| owner == self.id) {
                return true;
            }
            if cancelled() {
                h.waiting.retain(|(w, _)| *w != self.id);
                return false;
            }
        }
    }

    fn leave(&self, _: Duration, _: u64) {
        let mut h = self.lock.lock();
        // A run that finishes after the GPU went back (its worker went
        // idle meanwhile) has nothing left to give back: no accounting.
        if let Some((owner, runs)) = &mut h.owner {
            if *owner == self.id {
                *runs = runs.saturating_sub(1);
                if *runs == 0 {
                    h.release();
                }
            }
        }
    }

    fn holding(&self) -> bool {
        self.lock
            .lock()
            .owner
            .is_some_and(|(owner, _)| owner == self.id)
    }

    fn idle(&self) {
        let mut h = self.lock.lock();
        if h.owner.is_some_and(|(owner, _)| owner == self.id) {
            h.release();
        }
    }
}

/// What stands between the vGPUs' commands and the GPU.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arbiter {
    /// The daemon's scheduler, through its `SchedGate`.
    Sched(SchedConfig),
    /// [`Exclusive`]: the scheduler bypassed, the GPU still exclusive.
    Exclusive,
    /// Nothing: the software partitions run side by side on the CPUs.
    None,
}

/// vGPUs on one software GPU, each served on its own socket, with an
/// [`Arbiter`] between them and the GPU.
struct Rig {
    sched: Option<Scheduler>,
    vgpus: Vec<TestVgpu>,
}

impl Rig {
    fn new(arbiter: Arbiter, tenants: &[TenantParams]) -> Rig {
        let n = tenants.len() as u32;
        let backend = SoftwareBackend::new(MEMORY * u64::from(n), n);
        let sched = match arbiter {
            Arbiter::Sched(c) => Some(Scheduler::new(c).expect("scheduler config")),
            _ => None,
        };
        let exclusive = Arc::new(Exclusive::default());
        let vgpus = tenants
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let name = format!("t{i}");
                let mut dc = test_config(&name, QUEUES);
                dc.gate = match (&sched, arbiter) {
                    (Some(s), _) => {
                        let id = TenantId(i as u32);
                        s.add_tenant(id, *p).expect("tenant");
                        Some(Arc::new(SchedGate::new(s.clone(), id)) as Arc<dyn CommandGate>)
                    }
                    (None, Arbiter::Exclusive) => Some(Arc::new(ExclusiveGate {
                        lock: exclusive.clone(),
                        id: i,
                        handed: Arc::default(),
                    })
                        as Arc<dyn CommandGate>),
                    _ => None,
                };
                TestVgpu::start(dc, software_partition(&backend, &name, MEMORY, 1))
            })
            .collect();
        Rig { sched, vgpus }
    }

    fn connect(&self, i: usize) -> Guest {
        let mut g = self.vgpus[i].connect_with(GuestOptions {
            ram_size: 32 << 20,
            ..GuestOptions::default()
        });
        for q in 0..QUEUES {
            g.setup_queue(q, 1024, Mode::Interrupt);
        }
        g
    }

    /// Device time charged to each tenant so far.
    /// Device time charged to each tenant so far, and whether every
    /// tenant has a command waiting for or holding the GPU now.
    fn busy(&self) -> (Vec<Duration>, bool) {
        let s = self.sched.as_ref().expect("a scheduled rig").stats();
        let ids = (0..self.vgpus.len()).map(|i| TenantId(i as u32));
        let busy = ids
            .clone()
            .map(|id| s.tenant(id).map(|t| t.busy).unwrap_or_default())
            .collect();
        let backlogged = ids
            .map(|id| s.tenant(id).map(|t| t.phase))
            .all(|p| matches!(p, Some(TenantPhase::Waiting | TenantPhase::Holding)));
        (busy, backlogged)
    }
}

#[derive(Clone, Copy)]
enum Cmd {
    Nop,
    Fill(u64),
}

fn chain(g: &mut Guest, cmd: Cmd) -> Chain {
    match cmd {
        Cmd::Nop => Chain::command(&abi::CmdHeader {
            opcode: abi::OP_NOP,
            flags: 0,
        })
        .completion(),
        Cmd::Fill(size) => {
            let addr = g.device_alloc(0, size);
            let fill = abi::FillCmd {
                hdr: abi::CmdHeader {
                    opcode: abi::OP_FILL,
                    flags: 0,
                },
                addr,
                size,
                pattern: 0x5a5a_5a5a,
                reserved: 0,
            };
            Chain::new().bytes(fill.as_slice()).completion()
        }
    }
}

/// A guest keeping [`DEPTH`] commands queued until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    fn start(mut g: Guest, cmd: Cmd) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let (s, d) = (stop.clone(), done.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let chain = chain(&mut g, cmd);
            ready_tx.send(()).unwrap();
            for q in 0..QUEUES {
                for _ in 0..DEPTH {
                    g.post(q, &chain);
                }
                g.kick(q);
            }
            let mut quiet = 0;
            while !s.load(Ordering::Relaxed) {
                // Refill every queue that completed something.
                let mut total = 0;
                for q in 0..QUEUES {
                    let mut n = 0;
                    while let Some(u) = g.poll_used(q) {
                        assert_eq!(u.completion().status, abi::STATUS_OK);
                        n += 1;
                    }
                    for _ in 0..n {
                        g.post(q, &chain);
                    }
                    if n > 0 {
                        g.kick(q);
                    }
                    total += n;
                }
                d.fetch_add(total, Ordering::Relaxed);
                if total == 0 {
                    // Sleep until a completion interrupt (of any queue).
                    quiet = (quiet + 1) % QUEUES;
                    if let Some(u) = g.wait_used(quiet, 50 * MS) {
                        assert_eq!(u.completion().status, abi::STATUS_OK);
                        d.fetch_add(1, Ordering::Relaxed);
                        g.post(quiet, &chain);
                        g.kick(quiet);
                    }
                }
            }
        });
        ready_rx.recv().expect("guest set up");
        Load {
            stop,
            done,
            thread: Some(thread),
        }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("guest thread");
        }
    }
}

/// Samples every tenant's device time every 10 ms for `duration`.
fn sample(rig: &Rig, duration: Duration) -> Vec<Sample> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut next = start;
    while next.duration_since(start) <= duration {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let (busy, backlogged) = rig.busy();
        out.push(Sample {
            at: Instant::now(),
            busy,
            backlogged,
        });
        next += 10 * MS;
    }
    out
}

/// One look at the scheduler.
struct Sample {
    at: Instant,
    busy: Vec<Duration>,
    backlogged: bool,
}

/// A 1 s window of samples.
struct Window {
    wall: Duration,
    /// Device time per tenant.
    busy: Vec<Duration>,
    /// Every look in it found every tenant with a command waiting for or
    /// holding the GPU.
    backlogged: bool,
}

/// Every 1 s window of the samples, sliding by one sample.
fn windows(samples: &[Sample]) -> Vec<Window> {
    let mut out = Vec::new();
    let mut j = 0;
    for (i, a) in samples.iter().enumerate() {
        j = j.max(i);
        while j < samples.len() && samples[j].at.duration_since(a.at) < Duration::from_secs(1) {
            j += 1;
        }
        let Some(b) = samples.get(j) else {
            break;
        };
        out.push(Window {
            wall: b.at.duration_since(a.at),
            busy: b
                .busy
                .iter()
                .zip(&a.busy)
                .map(|(x, y)| x.saturating_sub(*y))
                .collect(),
            backlogged: samples[i..=j].iter().all(|s| s.backlogged),
        });
    }
    out
}

fn fair_share(p: &Params) {
    let weights = [1u32, 2, 4];
    let params: Vec<TenantParams> = weights
        .iter()
        .map(|&weight| TenantParams {
            weight,
            ..TenantParams::default()
        })
        .collect();
    let rig = Rig::new(Arbiter::Sched(sched_config(Policy::FairShare)), &params);
    let loads: Vec<Load> = (0..3)
        .map(|i| Load::start(rig.connect(i), Cmd::Fill(FILL)))
        .collect();
    std::thread::sleep(200 * MS);
    let samples = sample(&rig, p.fair);
    let done: u64 = loads.iter().map(Load::done).sum();
    drop(loads);
    let total_w: u32 = weights.iter().sum();
    let wins = windows(&samples);
    let backlogged = samples.iter().filter(|s| s.backlogged).count();
    println!(
        "\n1. weighted fair share, weights 1:2:4, FILL {} KiB, {} s, {} windows of 1 s",
        FILL >> 10,
        p.fair.as_secs(),
        wins.len(),
    );
    let full: Vec<&Window> = wins.iter().filter(|w| w.backlogged).collect();
    println!("   tenant  weight  target   min      max      worst dev   (windows with every look backlogged: min max dev)");
    let (mut worst_all, mut worst_full) = (0.0f64, 0.0f64);
    for (i, &w) in weights.iter().enumerate() {
        let target = f64::from(w) / f64::from(total_w);
        let range = |ws: &mut dyn Iterator<Item = &Window>| {
            ws.map(|w| {
                let sum: f64 = w.busy.iter().map(Duration::as_secs_f64).sum();
                w.busy[i].as_secs_f64() / sum.max(1e-12)
            })
            .fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)))
        };
        let dev = |(lo, hi): (f64, f64)| (lo - target).abs().max((hi - target).abs());
        let (min, max) = range(&mut wins.iter());
        worst_all = worst_all.max(dev((min, max)));
        let (fmin, fmax) = range(&mut full.iter().copied());
        let fdev = if full.is_empty() {
            0.0
        } else {
            dev((fmin, fmax))
        };
        worst_full = worst_full.max(fdev);
        println!(
            "   t{i}      {w}       {:5.2}%  {:5.2}%  {:5.2}%  {:5.2} pp     {:5.2}% {:5.2}% {:5.2} pp",
            target * 100.0,
            min * 100.0,
            max * 100.0,
            dev((min, max)) * 100.0,
            fmin * 100.0,
            fmax * 100.0,
            fdev * 100.0
        );
    }
    let (first, last) = (&samples[0], &samples[samples.len() - 1]);
    let busy: Duration = last
        .busy
        .iter()
        .zip(&first.busy)
        .map(|(a, b)| *a - *b)
        .sum();
    let wall = last.at - first.at;
    println!(
        "   GPU busy {:.1}% of wall time; {} commands; every tenant waiting or running at {:.0}% of the looks",
        100.0 * busy.as_secs_f64() / wall.as_secs_f64(),
        done,
        100.0 * backlogged as f64 / samples.len() as f64
    );
    println!(
        "   worst deviation, all windows: {:.2} pp (target 2 pp): {}",
        worst_all * 100.0,
        vgpu_benchkit::verdict(worst_all <= 0.02 && !wins.is_empty())
    );
    println!(
        "   worst deviation, the {} windows with every tenant backlogged at every look: {:.2} pp: {}",
        full.len(),
        worst_full * 100.0,
        vgpu_benchkit::verdict(worst_full <= 0.02 && !full.is_empty())
    );
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The high-priority tenant's submit-to-completion latencies over
/// `duration`, next to a saturating low-priority tenant if `loaded`,
/// through the scheduler or (`scheduled` false) with no arbiter at all.
fn latency_run(duration: Duration, loaded: bool, scheduled: bool) -> Vec<Duration> {
    let params = [
        TenantParams {
            priority: 10,
            ..TenantParams::default()
        },
        TenantParams::default(),
    ];
    // The daemon's aging for the priority policy: ten slices.
    let config = sched_config(Policy::Priority { aging: 10 * SLICE });
    let arbiter = if scheduled {
        Arbiter::Sched(config)
    } else {
        Arbiter::None
    };
    let rig = Rig::new(arbiter, &params);
    let mut g = rig.connect(0);
    let _load = loaded.then(|| Load::start(rig.connect(1), Cmd::Fill(FILL)));
    let chain = chain(&mut g, Cmd::Fill(SMALL_FILL));
    std::thread::sleep(100 * MS);
    let mut lat = Vec::new();
    let start = Instant::now();
    let mut x: u32 = 12345;
    while start.elapsed() < duration {
        // 2-4 ms apart.
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        std::thread::sleep(Duration::from_micros(2000 + u64::from(x >> 16) % 2000));
        let t = Instant::now();
        g.post(0, &chain);
        g.kick(0);
        let u = g
            .wait_used(0, Duration::from_secs(5))
            .expect("completion of the high-priority command");
        lat.push(t.elapsed());
        assert_eq!(u.completion().status, abi::STATUS_OK);
    }
    lat.sort();
    lat
}

fn priority_latency(bench: &vgpu_benchkit::Bench, p: &Params) {
    let idle = latency_run(p.latency, false, true);
    let loaded = latency_run(p.latency, true, true);
    let unscheduled = latency_run(p.latency, true, false);
    let (i50, i99) = (percentile(&idle, 0.5), percentile(&idle, 0.99));
    let (l50, l99) = (percentile(&loaded, 0.5), percentile(&loaded, 0.99));
    println!(
        "\n2. priority latency: FILL {} KiB every 2-4 ms at priority 10, {} s per run",
        SMALL_FILL >> 10,
        p.latency.as_secs_f64()
    );
    println!(
        "   alone:                              p50 {:.3} ms  p99 {:.3} ms  ({} samples)",
        ms(i50),
        ms(i99),
        idle.len()
    );
    println!(
        "   next to saturating FILL {} KiB:    p50 {:.3} ms  p99 {:.3} ms  ({} samples)",
        FILL >> 10,
        ms(l50),
        ms(l99),
        loaded.len()
    );
    println!(
        "   same load, no arbiter (both at once): p50 {:.3} ms  p99 {:.3} ms  ({} samples)",
        ms(percentile(&unscheduled, 0.5)),
        ms(percentile(&unscheduled, 0.99)),
        unscheduled.len()
    );
    let bound = i99 + SLICE;
    // Without samples alone there is nothing to hold the loaded p99 to.
    let r = bench.ratio(
        "priority latency",
        l99.as_secs_f64(),
        (!idle.is_empty()).then_some(bound.as_secs_f64()),
        vgpu_benchkit::Target::AtMost(1.0),
    );
    println!(
        "   target: loaded p99 <= idle p99 + one slice = {:.3} ms: {}",
        ms(bound),
        r.verdict
    );
}

fn fixed_share(p: &Params) {
    let params = [
        TenantParams {
            cap: Some(0.25),
            ..TenantParams::default()
        },
        TenantParams::default(),
        TenantParams::default(),
    ];
    let rig = Rig::new(Arbiter::Sched(sched_config(Policy::FairShare)), &params);
    let load = Load::start(rig.connect(0), Cmd::Fill(FILL));
    std::thread::sleep(300 * MS);
    let samples = sample(&rig, p.cap);
    drop(load);
    let wins = windows(&samples);
    let shares: Vec<f64> = wins
        .iter()
        .map(|w| w.busy[0].as_secs_f64() / w.wall.as_secs_f64())
        .collect();
    let max = shares.iter().copied().fold(0.0, f64::max);
    let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    println!(
        "\n3. fixed share: cap 25%, FILL {} KiB, others idle, {} s, {} windows of 1 s",
        FILL >> 10,
        p.cap.as_secs(),
        wins.len()
    );
    println!(
        "   share of wall time: mean {:.2}%, max {:.2}% (target max 27%): {}",
        mean * 100.0,
        max * 100.0,
        vgpu_benchkit::verdict(max <= 0.27 && !wins.is_empty())
    );
}

const TENANTS: usize = 16;

/// CPU time of this process so far: every thread, guests and endpoints
/// as well as the vGPUs' workers.
fn process_cpu() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer it is given; a
    // zeroed one is a valid rusage should it fail.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Commands per second of [`TENANTS`] saturating guests over `duration`,
/// and per CPU-second this process got meanwhile: on a machine shared
/// with other work, the second says what the arbiter costs whatever
/// share of the cores the others left.
fn throughput(arbiter: Arbiter, cmd: Cmd, duration: Duration) -> (f64, f64) {
    let params = vec![TenantParams::default(); TENANTS];
    let rig = Rig::new(arbiter, &params);
    let loads: Vec<Load> = (0..TENANTS)
        .map(|i| Load::start(rig.connect(i), cmd))
        .collect();
    std::thread::sleep(100 * MS);
    let count = || loads.iter().map(Load::done).sum::<u64>();
    let (c0, t0, u0) = (count(), Instant::now(), process_cpu());
    std::thread::sleep(duration);
    let (c1, t1, u1) = (count(), Instant::now(), process_cpu());
    let done = (c1 - c0) as f64;
    (
        done / (t1 - t0).as_secs_f64(),
        done / (u1 - u0).as_secs_f64(),
    )
}

fn overhead(bench: &vgpu_benchkit::Bench, p: &Params) {
    println!(
        "\n4. overhead: {TENANTS} saturating tenants, fair share vs no scheduler, {} s per round",
        p.overhead.as_secs_f64()
    );
    println!(
        "   bypassed: the scheduler replaced by a bare exclusive lock (same one-at-a-time GPU),"
    );
    println!(
        "   and by nothing at all (the software partitions then run side by side on the CPUs)"
    );
    let rounds = p.rounds;
    let variants = [
        Arbiter::Sched(sched_config(Policy::FairShare)),
        Arbiter::Exclusive,
        Arbiter::None,
    ];
    for (label, cmd) in [("NOP", Cmd::Nop), ("FILL 512 KiB", Cmd::Fill(FILL))] {
        let n = variants.len();
        let (mut rates, mut per_cpu) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        for round in 0..rounds {
            // Which goes first rotates, so that no variant always follows
            // the same one.
            for k in 0..n {
                let i = (round + k) % n;
                let (wall, cpu) = throughput(variants[i], cmd, p.overhead);
                rates[i].push(wall);
                per_cpu[i].push(cpu);
            }
        }
        let best_of = |rates: &[Vec<f64>]| -> Vec<f64> {
            rates
                .iter()
                .map(|v| v.iter().copied().fold(0.0, f64::max))
                .collect()
        };
        let (best, best_cpu) = (best_of(&rates), best_of(&per_cpu));
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "   {label:<13} scheduled {:>9.0}/s  exclusive lock {:>9.0}/s  nothing {:>9.0}/s",
            best[0], best[1], best[2]
        );
        let lock = bench.ratio(
            &format!("{label}, scheduled / exclusive lock"),
            best[0],
            best[1],
            vgpu_benchkit::Target::AtLeast(0.9),
        );
        let nothing = bench.ratio(
            &format!("{label}, scheduled / nothing"),
            best[0],
            best[2],
            vgpu_benchkit::Target::Reference,
        );
        println!(
            "   {:<13} scheduled / exclusive lock {:5.1}% (target 90%): {};  scheduled / nothing {:5.1}% {}",
            "",
            lock.percent(),
            lock.verdict,
            nothing.percent(),
            nothing.verdict
        );
        println!(
            "   {:<13} rounds: scheduled [{}], exclusive [{}], nothing [{}]",
            "",
            fmt(&rates[0]),
            fmt(&rates[1]),
            fmt(&rates[2])
        );
        let cpu = bench.ratio(
            &format!("{label}, per CPU-second, scheduled / exclusive lock"),
            best_cpu[0],
            best_cpu[1],
            vgpu_benchkit::Target::Reference,
        );
        println!(
            "   {:<13} per CPU-second of the benchmark: scheduled {:.0}, exclusive lock {:.0}, nothing {:.0}; scheduled / exclusive lock {:5.1}% {}",
            "",
            best_cpu[0],
            best_cpu[1],
            best_cpu[2],
            cpu.percent(),
            cpu.verdict
        );
    }
}

fn main() -> std::process::ExitCode {
    let bench = vgpu_benchkit::Bench::start();
    let p = Params::new(bench.mode());
    println!(
        "scheduler end to end: software backend, vGPUs driven over vfio-user; load average {} on {} CPUs{}",
        load_average(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        match bench.mode() {
            vgpu_benchkit::Mode::Full => "",
            vgpu_benchkit::Mode::Quick => " (quick)",
            vgpu_benchkit::Mode::Smoke => " (smoke)",
        }
    );
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |n: &str| only.is_empty() || only.split(',').any(|x| x == n);
    if run("1") {
        fair_share(&p);
    }
    if run("2") {
        priority_latency(&bench, &p);
    }
    if run("3") {
        fixed_share(&p);
    }
    if run("4") {
        overhead(&bench, &p);
    }
    bench.finish()
}
