//! vGPU function benchmarks on the software backend, printed as tables.
//! Every figure goes through a real vfio-user endpoint on a UNIX socket,
//! with the test kit playing VMM and guest driver.
//!
//! 1. NOP latency, polled queue: from the doorbell store to the used entry
//!    being seen by a submitter spinning on the used ring, against an
//!    `AtomicU64` bounced between two spinning threads.
//! 2. NOP latency, interrupt queue: doorbell store plus the trapped WAKE
//!    register write, completion seen as the queue's MSI-X eventfd firing,
//!    against two threads bouncing blocking eventfd reads. A trapped
//!    register write that wakes nothing is timed alongside, to show what
//!    WAKE costs on its own.
//! 3. COPY guest RAM -> device memory bandwidth (polled queue, one command
//!    at a time, one scatter-gather entry) against `copy_from_slice` from a
//!    mapping of another memfd into a page-aligned, prefaulted heap buffer.
//! 4. NOP throughput with 1, 4 and 16 polled queues: one submitter filling
//!    every ring, one doorbell per queue per pass, round robin.
//! 5. CPU time of an idle vGPU's worker thread once its poller sleeps.
//!
//! Variants of a table run alternately in rounds, so that machine noise
//! hits each alike. Run with
//!
//! ```text
//! cargo bench -p vgpu-device --bench device
//! ```
//!
//! `BENCH_QUICK=1` runs every part briefly. The smoke run, `cargo bench
//! -p vgpu-device --bench device -- --test` (or `cargo test -p
//! vgpu-device --bench device`, which runs the binary without
//! `--bench`), runs every part for a fraction of a second and exits
//! non-zero if one panics or measures nothing (a ratio without a
//! baseline); CI runs every benchmark so.

use std::fs::File;
use std::hint::black_box;
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_abi::{self as abi, ByteValued, CmdHeader, CopyCmd, SgEntry};
use vgpu_benchkit::{
    measure_rounds, ratio, size_label, summarize, verdict, Bench, Mode as BenchMode, Summary,
    Target, KIB, MIB,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::{Chain, Guest, GuestOptions, Mode, Used};
use vmm_sys_util::eventfd::EventFd;

const PAGE: usize = 4096;
const COPY_SIZES: [usize; 5] = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB];
const QUEUE_COUNTS: [u32; 3] = [1, 4, 16];
/// Ring entries of every queue set up here.
const RING: u16 = 256;
/// Longest wait for anything before the benchmark gives up.
const STALL: Duration = Duration::from_secs(10);

const TARGET_POLLED_RATIO: f64 = 5.0;
const TARGET_IRQ_RATIO: f64 = 1.5;
const TARGET_COPY_RATIO: f64 = 0.80;
const TARGET_IDLE_PERCENT: f64 = 1.0;

struct Config {
    lat_rounds: usize,
    lat_batch: usize,
    /// Unrecorded samples at the start of each turn of a latency variant.
    lat_warmup: usize,
    irq_rounds: usize,
    irq_batch: usize,
    irq_warmup: usize,
    copy_rounds: usize,
    /// Bytes each variant copies per size per round (at least
    /// `copy_min_samples` samples).
    copy_bytes_per_round: usize,
    copy_min_samples: usize,
    /// The largest COPY timed.
    copy_max: usize,
    tput_rounds: usize,
    tput_window: Duration,
    idle_window: Duration,
}

impl Config {
    fn new(mode: BenchMode) -> Self {
        match mode {
            BenchMode::Full => Config {
                lat_rounds: 40,
                lat_batch: 2500,
                lat_warmup: 125,
                irq_rounds: 40,
                irq_batch: 500,
                irq_warmup: 12,
                copy_rounds: 40,
                copy_bytes_per_round: 32 * MIB,
                copy_min_samples: 4,
                copy_max: 64 * MIB,
                tput_rounds: 6,
                tput_window: Duration::from_millis(300),
                idle_window: Duration::from_secs(2),
            },
            BenchMode::Quick => Config {
                lat_rounds: 4,
                lat_batch: 250,
                lat_warmup: 50,
                irq_rounds: 4,
                irq_batch: 100,
                irq_warmup: 5,
                copy_rounds: 3,
                copy_bytes_per_round: 2 * MIB,
                copy_min_samples: 2,
                copy_max: 64 * MIB,
                tput_rounds: 2,
                tput_window: Duration::from_millis(50),
                idle_window: Duration::from_millis(500),
            },
            BenchMode::Smoke => Config {
                lat_rounds: 2,
                lat_batch: 20,
                lat_warmup: 5,
                irq_rounds: 2,
                irq_batch: 10,
                irq_warmup: 2,
                copy_rounds: 1,
                copy_bytes_per_round: 0,
                copy_min_samples: 1,
                copy_max: MIB,
                tput_rounds: 1,
                tput_window: Duration::from_millis(20),
                idle_window: Duration::from_millis(100),
            },
        }
    }
}

/// Prints each variant's latency and its p50 against the first's (the
/// baseline), judged by its target: `(target, label)` per row.
fn print_latency_table(
    bench: &Bench,
    title: &str,
    names: &[&str],
    stats: &[Summary],
    targets: &[(Target, &str)],
) {
    println!("{title}");
    println!(
        "  {:<44} {:>8} {:>10} {:>10} {:>10}  target",
        "variant", "samples", "p50 (us)", "p99 (us)", "p50 ratio"
    );
    let base = stats[0].p50 as f64;
    for (i, ((name, s), (target, label))) in names.iter().zip(stats).zip(targets).enumerate() {
        // The baseline's own row notes nothing: the rows against it do.
        let r = if i == 0 {
            ratio(s.p50 as f64, Some(base), *target)
        } else {
            bench.ratio(name.trim(), s.p50 as f64, base, *target)
        };
        println!(
            "  {:<44} {:>8} {:>10.3} {:>10.3} {:>9.2}x  {label} {}",
            name,
            s.n,
            s.p50 as f64 / 1e3,
            s.p99 as f64 / 1e3,
            r.value,
            r.verdict
        );
    }
}

// ---------------------------------------------------------------------------
// Guest-side helpers

fn nop_chain() -> Chain {
    Chain::command(&CmdHeader {
        opcode: abi::OP_NOP,
        flags: 0,
    })
    .completion()
}

fn check_ok(q: u32, used: &Used) {
    let c = used.completion();
    assert_eq!(c.status, abi::STATUS_OK, "queue {q}: command failed: {c:?}");
}

/// Spins on queue `q`'s used ring until the next entry appears.
fn spin_used(g: &mut Guest, q: u32) -> Used {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(u) = g.poll_used(q) {
            return u;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 16) && start.elapsed() > STALL {
            panic!("queue {q}: no completion within {STALL:?}");
        }
        std::hint::spin_loop();
    }
}

/// Submits `chain` on polled queue `q` and spins until it is used; returns
/// the ns from the doorbell store to the used entry being seen.
fn polled_once(g: &mut Guest, q: u32, chain: &Chain) -> u64 {
    polled_timed(g, q, chain).0
}

/// Like [`polled_once`], also returning the completion's `device_ns`
/// (the time the command itself took inside the device).
fn polled_timed(g: &mut Guest, q: u32, chain: &Chain) -> (u64, u64) {
    g.post(q, chain);
    let t = Instant::now();
    g.kick(q);
    let used = spin_used(g, q);
    let ns = t.elapsed().as_nanos() as u64;
    check_ok(q, &used);
    (ns, used.completion().device_ns)
}

/// Blocks until `efd` (non-blocking) has fired and consumes it.
fn wait_eventfd(efd: &EventFd) {
    loop {
        match efd.read() {
            Ok(_) => return,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("eventfd read: {e}"),
        }
        let mut pfd = libc::pollfd {
            fd: efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, borrowed for the call only.
        let n = unsafe { libc::poll(&mut pfd, 1, STALL.as_millis() as i32) };
        if n == 0 {
            panic!("no interrupt within {STALL:?}");
        }
        if n < 0 && io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            panic!("poll: {}", io::Error::last_os_error());
        }
    }
}

/// Submits `chain` on interrupt-mode queue `q` (doorbell, then WAKE when
/// the event index asks for it) and blocks on the queue's MSI-X eventfd;
/// returns the ns from the doorbell store to the interrupt, and to the
/// return of the kick (the WAKE write's reply).
fn interrupt_once(g: &mut Guest, q: u32, chain: &Chain) -> (u64, u64) {
    g.post(q, chain);
    let t = Instant::now();
    g.kick(q);
    let kicked = t.elapsed().as_nanos() as u64;
    let used = loop {
        wait_eventfd(g.msix_eventfd(q + 1));
        if let Some(u) = g.poll_used(q) {
            break u;
        }
    };
    let ns = t.elapsed().as_nanos() as u64;
    check_ok(q, &used);
    (ns, kicked)
}

// ---------------------------------------------------------------------------
// Baselines

/// A thread answering every odd value of a shared `AtomicU64` with the next
/// even one, spinning in between.
struct SpinPartner {
    cell: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    next: u64,
}

impl SpinPartner {
    fn start() -> Self {
        let cell = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cell.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("spin-partner".into())
            .spawn(move || {
                let mut last = 0;
                while !s.load(Ordering::Relaxed) {
                    let v = c.load(Ordering::Acquire);
                    if v != last && v % 2 == 1 {
                        c.store(v + 1, Ordering::Release);
                        last = v + 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
            .expect("spin partner thread");
        SpinPartner {
            cell,
            stop,
            thread: Some(thread),
            next: 1,
        }
    }

    /// One round trip in ns.
    fn once(&mut self) -> u64 {
        let send = self.next;
        self.next += 2;
        let t = Instant::now();
        self.cell.store(send, Ordering::Release);
        while self.cell.load(Ordering::Acquire) != send + 1 {
            std::hint::spin_loop();
        }
        t.elapsed().as_nanos() as u64
    }
}

impl Drop for SpinPartner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A thread that blocks reading one eventfd and signals another.
struct EventPartner {
    ping: Arc<EventFd>,
    pong: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventPartner {
    fn start() -> Self {
        let ping = Arc::new(EventFd::new(0).expect("eventfd"));
        let pong = Arc::new(EventFd::new(0).expect("eventfd"));
        let stop = Arc::new(AtomicBool::new(false));
        let (pi, po, s) = (ping.clone(), pong.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("eventfd-partner".into())
            .spawn(move || loop {
                if pi.read().is_err() || s.load(Ordering::Relaxed) {
                    return;
                }
                if po.write(1).is_err() {
                    return;
                }
            })
            .expect("eventfd partner thread");
        EventPartner {
            ping,
            pong,
            stop,
            thread: Some(thread),
        }
    }

    /// One round trip in ns (both sides blocking reads).
    fn once(&mut self) -> u64 {
        let t = Instant::now();
        self.ping.write(1).expect("eventfd write");
        self.pong.read().expect("eventfd read");
        t.elapsed().as_nanos() as u64
    }
}

impl Drop for EventPartner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.ping.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A read-only shared mapping of a file, for the memcpy baseline.
struct PlainMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl PlainMap {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a new mapping chosen by the kernel; it aliases no Rust
        // object, and the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(PlainMap { ptr, len })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, alive until drop,
        // and nothing writes to the file while the slice is borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for PlainMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no slice of it
        // outlives `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn pattern_byte(i: usize) -> u8 {
    (i.wrapping_mul(7) + 3) as u8
}

fn fill_pattern(len: usize) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

// ---------------------------------------------------------------------------
// 1 and 2: NOP latency

fn bench_nop_polled(bench: &Bench, cfg: &Config) {
    let vgpu = TestVgpu::software(test_config("nop-poll", 1), 1 << 20, 1);
    let mut g = vgpu.connect();
    g.setup_queue(0, RING, Mode::Polled);
    let chain = nop_chain();
    let mut spin = SpinPartner::start();

    let wakes_before = g.wakes();
    let samples = {
        let mut nop = || polled_once(&mut g, 0, &chain);
        let mut pingpong = || spin.once();
        measure_rounds(
            cfg.lat_rounds,
            cfg.lat_batch,
            cfg.lat_warmup,
            &mut [&mut pingpong, &mut nop],
        )
    };
    let wakes = g.wakes() - wakes_before;
    let stats: Vec<Summary> = samples.into_iter().map(summarize).collect();
    let polled_target = format!("p50 <= {TARGET_POLLED_RATIO:.1}x");
    print_latency_table(
        bench,
        "1. NOP latency, POLLED mode: queue polled by the device, submitter spins on the used ring",
        &[
            "spin ping-pong (AtomicU64, 2 spinning threads)",
            "NOP, polled queue (doorbell -> used entry)",
        ],
        &stats,
        &[
            (Target::Reference, "(baseline)"),
            (Target::AtMost(TARGET_POLLED_RATIO), &polled_target),
        ],
    );
    println!(
        "  WAKE register writes during the polled runs (warm-up included): {wakes} \
         (a round starts after the poller may have gone to sleep)"
    );
}

fn bench_nop_interrupt(bench: &Bench, cfg: &Config) {
    // Only interrupt-mode queues: the worker sleeps between commands.
    let vgpu = TestVgpu::software(test_config("nop-irq", 1), 1 << 20, 1);
    let g = &mut vgpu.connect();
    g.setup_queue(0, RING, Mode::Interrupt);
    let chain = nop_chain();
    let mut event = EventPartner::start();
    // A second function whose WAKE register is an ioeventfd, as a VMM with
    // KVM ioeventfd support would map it.
    let vgpu_io = TestVgpu::software(test_config("nop-ioev", 1), 1 << 20, 1);
    let gio = &mut vgpu_io.connect();
    gio.use_wake_ioeventfd(vgpu_io.wake_ioeventfd());
    gio.setup_queue(0, RING, Mode::Interrupt);

    let wakes_before = g.wakes();
    let nops_before = g.commands();
    let mut kicks = Vec::new();
    let mut samples = {
        let g = std::cell::RefCell::new(&mut *g);
        let mut nop = || {
            let (ns, kicked) = interrupt_once(&mut g.borrow_mut(), 0, &chain);
            kicks.push(kicked);
            ns
        };
        let mut reg = || {
            let mut g = g.borrow_mut();
            let t = Instant::now();
            g.write32(abi::REG_IRQ_MASK, 0);
            t.elapsed().as_nanos() as u64
        };
        let mut pingpong = || event.once();
        let mut nop_io = || interrupt_once(gio, 0, &chain).0;
        measure_rounds(
            cfg.irq_rounds,
            cfg.irq_batch,
            cfg.irq_warmup,
            &mut [&mut pingpong, &mut nop, &mut reg, &mut nop_io],
        )
    };
    // Warm-up samples are not kept: keep the kicks of the recorded ones.
    let kicks: Vec<u64> = kicks
        .chunks(cfg.irq_warmup + cfg.irq_batch)
        .flat_map(|c| c[c.len() - cfg.irq_batch..].to_vec())
        .collect();
    samples.insert(2, kicks);
    let wakes = g.wakes() - wakes_before;
    let nops = g.commands() - nops_before;
    let stats: Vec<Summary> = samples.into_iter().map(summarize).collect();
    let irq_target = format!("p50 <= {TARGET_IRQ_RATIO:.1}x");
    println!();
    print_latency_table(
        bench,
        "2. NOP latency, INTERRUPT mode: doorbell + trapped WAKE write, submitter blocks on the MSI-X eventfd",
        &[
            "eventfd ping-pong (2 threads, blocking reads)",
            "NOP, WAKE trapped over the socket",
            "  of which: doorbell + WAKE write until reply",
            "trapped register write alone (IRQ_MASK)",
            "NOP, WAKE as ioeventfd (as with KVM)",
        ],
        &stats,
        &[
            (Target::Reference, "(baseline)"),
            (Target::AtMost(TARGET_IRQ_RATIO), &irq_target),
            (Target::Reference, "(breakdown)"),
            (Target::Reference, "(reference)"),
            (Target::AtMost(TARGET_IRQ_RATIO), &irq_target),
        ],
    );
    println!(
        "  WAKE writes per NOP: {:.2} ({wakes} for {nops} NOPs). Each is a REGION_WRITE the \
         vfio_user Client sends over the socket and waits for the reply to; a VMM with KVM \
         would take an MMIO exit (or an ioeventfd) instead.",
        wakes as f64 / nops.max(1) as f64
    );
}

// ---------------------------------------------------------------------------
// 3: COPY bandwidth

fn bench_copy(bench: &Bench, cfg: &Config) {
    let sizes: Vec<usize> = COPY_SIZES
        .into_iter()
        .filter(|&s| s <= cfg.copy_max)
        .collect();
    let max = *sizes.iter().max().expect("sizes");
    let vgpu = TestVgpu::software(test_config("copy", 1), (max + 16 * MIB) as u64, 1);
    let mut g = vgpu.connect_with(GuestOptions {
        // The source, rings, slots and the kit's staging area.
        ram_size: (max + 32 * MIB) as u64,
        ..GuestOptions::default()
    });
    g.setup_queue(0, RING, Mode::Polled);

    // Source in guest RAM, written (so allocated) in full.
    let pattern = fill_pattern(max);
    let src = g.alloc(max as u64, PAGE as u64);
    for (i, chunk) in pattern.chunks(4 * MIB).enumerate() {
        g.write(src + (i * 4 * MIB) as u64, chunk);
    }
    let dev = g.device_alloc(0, max as u64);

    // The baseline: another memfd of the same kind, mapped the same way,
    // into a page-aligned heap buffer; both touched before timing.
    let file = vfio_user_server::memfd::create(c"bench-memcpy-src", max as u64).expect("memfd");
    {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&pattern, 0).expect("fill memfd");
    }
    let plain = PlainMap::new(&file, max).expect("mmap");
    let plain_src = plain.as_slice();
    let mut backing = vec![0x5au8; max + PAGE];
    let start = backing.as_ptr().align_offset(PAGE);
    let dst = &mut backing[start..start + max];
    dst.copy_from_slice(plain_src);
    assert!(*dst == pattern[..], "plain mapping returned wrong data");

    let chains: Vec<Chain> = sizes
        .iter()
        .map(|&size| {
            let cmd = CopyCmd {
                hdr: CmdHeader {
                    opcode: abi::OP_COPY,
                    flags: 0,
                },
                src_kind: abi::COPY_GUEST,
                dst_kind: abi::COPY_DEVICE,
                src: 0,
                dst: dev,
                size: size as u64,
                sg_count: 1,
                reserved: 0,
            };
            let sg = SgEntry {
                addr: src,
                len: size as u64,
            };
            Chain::command(&cmd).bytes(sg.as_slice()).completion()
        })
        .collect();
    // One full copy before timing: device pages are touched at allocation,
    // this also warms the path.
    polled_once(&mut g, 0, chains.last().expect("sizes"));

    println!();
    println!(
        "3. COPY guest RAM -> device memory, POLLED mode, one command at a time (doorbell -> used entry), \
         vs memcpy from a memfd mapping"
    );
    println!(
        "  (GB/s = 1e9 bytes/s; p99 is the throughput of the 99th-percentile slowest sample; \
         in-device is the command's own device_ns from its completion)"
    );
    println!(
        "  {:>7} {:>8} {:>14} {:>14} {:>14} {:>14} {:>14} {:>11}  target",
        "size",
        "samples",
        "memcpy p50",
        "memcpy p99",
        "COPY p50",
        "COPY p99",
        "in-device p50",
        "COPY/memcpy"
    );
    for (&size, chain) in sizes.iter().zip(&chains) {
        // Several copies per sample for small sizes, so the clock's own
        // cost stays negligible.
        let reps = (256 * KIB / size).max(1);
        let per_round = (cfg.copy_bytes_per_round / (size * reps)).max(cfg.copy_min_samples);
        let mut inside = Vec::new();
        let samples = {
            let buf = &mut dst[..size];
            let from = &plain_src[..size];
            let mut memcpy = || {
                let t = Instant::now();
                for _ in 0..reps {
                    buf.copy_from_slice(from);
                    black_box(&mut *buf);
                }
                t.elapsed().as_nanos() as u64
            };
            let mut copy = || {
                let (mut ns, mut dev) = (0, 0);
                for _ in 0..reps {
                    let (n, d) = polled_timed(&mut g, 0, chain);
                    ns += n;
                    dev += d;
                }
                inside.push(dev);
                ns
            };
            measure_rounds(cfg.copy_rounds, per_round, 0, &mut [&mut memcpy, &mut copy])
        };
        let inside = summarize(std::mem::take(&mut inside));
        let bytes = (size * reps) as f64;
        // No sample (or a clock that read 0) is no throughput: infinite.
        let gbps = |ns: u64| bytes / ns as f64;
        let mut it = samples.into_iter().map(summarize);
        let (m, d) = (it.next().expect("memcpy"), it.next().expect("COPY"));
        let goal = if size >= MIB {
            Target::AtLeast(TARGET_COPY_RATIO)
        } else {
            Target::Reference
        };
        let what = format!("COPY {}", size_label(size));
        let r = bench.ratio(&what, gbps(d.p50), gbps(m.p50), goal);
        let target = if size >= MIB {
            format!(">= {:.0}% {}", TARGET_COPY_RATIO * 100.0, r.verdict)
        } else {
            format!("(none) {}", r.verdict)
        };
        println!(
            "  {:>7} {:>8} {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>10.1}%  {target}",
            size_label(size),
            d.n,
            gbps(m.p50),
            gbps(m.p99),
            gbps(d.p50),
            gbps(d.p99),
            gbps(inside.p50),
            r.percent()
        );
    }

    // The device holds what was sent: both ends of the largest copy.
    for off in [0, max - PAGE] {
        let got = g.download(0, dev + off as u64, PAGE);
        assert!(
            got[..] == pattern[off..off + PAGE],
            "device memory at {off:#x} differs from the source"
        );
    }
}

// ---------------------------------------------------------------------------
// 4 and 5: throughput and idle CPU

/// One window of NOPs over queues `0..queues`: returns commands per second.
fn throughput_window(g: &mut Guest, queues: u32, chain: &Chain, window: Duration) -> f64 {
    // Chains that fit a ring: each takes one descriptor per buffer.
    let depth = RING as usize / chain.len();
    let mut inflight = vec![0usize; queues as usize];
    let mut done = 0u64;
    let start = Instant::now();
    let elapsed = loop {
        for q in 0..queues {
            let mut added = false;
            while inflight[q as usize] < depth {
                g.post(q, chain);
                inflight[q as usize] += 1;
                added = true;
            }
            if added {
                g.kick(q);
            }
        }
        for q in 0..queues {
            while let Some(u) = g.poll_used(q) {
                check_ok(q, &u);
                inflight[q as usize] -= 1;
                done += 1;
            }
        }
        let e = start.elapsed();
        if e >= window {
            break e;
        }
        if e > STALL {
            panic!("throughput window stalled");
        }
    };
    for q in 0..queues {
        while inflight[q as usize] > 0 {
            check_ok(q, &spin_used(g, q));
            inflight[q as usize] -= 1;
        }
    }
    done as f64 / elapsed.as_secs_f64()
}

fn bench_throughput(cfg: &Config, g: &mut Guest) {
    let chain = nop_chain();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); QUEUE_COUNTS.len()];
    // Warm-up.
    throughput_window(g, 16, &chain, cfg.tput_window / 4);
    for round in 0..cfg.tput_rounds {
        for k in 0..QUEUE_COUNTS.len() {
            let i = (round + k) % QUEUE_COUNTS.len();
            rates[i].push(throughput_window(
                g,
                QUEUE_COUNTS[i],
                &chain,
                cfg.tput_window,
            ));
        }
    }
    println!();
    println!(
        "4. NOP throughput, POLLED mode: one submitter thread round-robin over the queues \
         (the kit's Guest is one connection), every ring ({RING} descriptors, {} NOPs) kept full, \
         one doorbell per queue per pass",
        RING as usize / chain.len()
    );
    println!(
        "  {:>6} {:>7} {:>14} {:>14} {:>14}",
        "queues", "windows", "median cmd/s", "min cmd/s", "max cmd/s"
    );
    for (n, mut r) in QUEUE_COUNTS.iter().zip(rates) {
        r.sort_by(f64::total_cmp);
        println!(
            "  {:>6} {:>7} {:>14.0} {:>14.0} {:>14.0}",
            n,
            r.len(),
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        );
    }
}

/// The thread of this process whose name is `name`.
fn find_thread(name: &str) -> Option<u32> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .filter_map(|e| e.ok())
        .find_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (comm.trim_end() == name)
                .then(|| e.file_name().to_str()?.parse().ok())
                .flatten()
        })
}

/// A thread's state letter, utime + stime in clock ticks and on-CPU ns.
fn thread_cpu(tid: u32) -> (char, u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
    // Fields after the command name, which ends with the last ')': state
    // is field 3 of the file, utime 14 and stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f[0].chars().next().unwrap_or('?');
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    let sched = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (state, ticks, sched)
}

fn bench_idle(cfg: &Config, g: &mut Guest, name: &str, queues: u32, spin: Duration) {
    let thread = format!("vgpu-{name}");
    let tid = find_thread(&thread).unwrap_or_else(|| panic!("no thread named {thread}"));
    // Last activity: one NOP on every queue. Then wait for the poller to
    // clear POLLING on every queue (it sleeps right after).
    let chain = nop_chain();
    for q in 0..queues {
        polled_once(g, q, &chain);
    }
    let start = Instant::now();
    while (0..queues).any(|q| g.doorbells().polling(q) != 0) {
        assert!(start.elapsed() < STALL, "the poller never went to sleep");
        std::thread::sleep(Duration::from_micros(100));
    }
    let asleep_after = start.elapsed();
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (_, ticks0, ns0) = thread_cpu(tid);
    let t = Instant::now();
    std::thread::sleep(cfg.idle_window);
    let (state, ticks1, ns1) = thread_cpu(tid);
    let wall = t.elapsed().as_secs_f64();
    let pct_ticks = (ticks1 - ticks0) as f64 / hz / wall * 100.0;
    let pct_sched = (ns1 - ns0) as f64 / 1e9 / wall * 100.0;
    println!();
    println!(
        "5. Idle vGPU, {queues} POLLED queues, after the throughput run and one NOP per queue: \
         worker thread {thread:?} \
         (tid {tid}) over {wall:.2} s"
    );
    println!(
        "  poller seen asleep {:.0} us after the last completion was consumed (poll_spin {} us); \
         thread state now {state:?}",
        asleep_after.as_secs_f64() * 1e6,
        spin.as_micros()
    );
    println!(
        "  CPU, utime+stime ({hz:.0} Hz ticks): {:>7.3}% of one core  target < {TARGET_IDLE_PERCENT:.0}% {}",
        pct_ticks,
        verdict(pct_ticks < TARGET_IDLE_PERCENT)
    );
    println!(
        "  CPU, schedstat run time (ns):       {:>7.3}% of one core  (cross-check)",
        pct_sched
    );
}

fn bench_throughput_and_idle(cfg: &Config) {
    let name = "tput";
    let config = test_config(name, 16);
    let spin = config.poll_spin;
    let vgpu = TestVgpu::software(config, 1 << 20, 1);
    let mut g = vgpu.connect();
    for q in 0..16 {
        g.setup_queue(q, RING, Mode::Polled);
    }
    bench_throughput(cfg, &mut g);
    bench_idle(cfg, &mut g, name, 16, spin);
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let cfg = Config::new(bench.mode());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "vgpu-device benchmark, software backend ({} mode, {cpus} CPUs{})",
        bench.mode().name(),
        if cfg!(debug_assertions) {
            ", DEBUG BUILD: figures are not meaningful"
        } else {
            ""
        }
    );
    println!();
    bench_nop_polled(&bench, &cfg);
    bench_nop_interrupt(&bench, &cfg);
    bench_copy(&bench, &cfg);
    bench_throughput_and_idle(&cfg);
    bench.finish()
}
