//! One daemon, many vGPUs: the `vgpud` binary with 64 vGPUs on four
//! software GPUs (16 each, weights 1, 2, 3, 4 in turn), measured from
//! outside through `/proc` and the management API:
//!
//! 1. Idle: the daemon's threads, file descriptors, resident memory and
//!    CPU with every vGPU created and no guest, per vGPU.
//! 2. Busy: a guest (`vgpu-testkit`, in this process) on every vGPU
//!    keeping FILLs of 512 KiB queued; the daemon's CPU per busy vGPU
//!    beside the device time it ran (on the software backend the GPU's
//!    work is CPU work too, so the two are not a GPU's overhead), its
//!    threads, descriptors and memory, and
//!    each GPU's weighted shares over the run against the weights
//!    (target: within 2 points).
//!
//! ```text
//! cargo bench -p vgpud --bench scale
//! ```
//!
//! `BENCH_QUICK=1` runs briefly; the smoke run (`-- --test`, as CI runs
//! every benchmark) for a fraction of a second.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{Chain, Guest, GuestOptions, Mode};
use vmm_sys_util::tempdir::TempDir;

const GPUS: usize = 4;
const PER_GPU: usize = 16;
const VGPUS: usize = GPUS * PER_GPU;
const QUEUES: u32 = 2;
/// Commands a guest keeps queued on each queue.
const DEPTH: usize = 64;
const FILL: u64 = 512 << 10;

fn weight(i: usize) -> u32 {
    (i % 4) as u32 + 1
}

/// The daemon, killed when dropped.
struct Daemon {
    child: Child,
    dir: TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start() -> Daemon {
        let dir = TempDir::new_with_prefix("/tmp/vgpud-scale-").expect("temp dir");
        let mut text = format!(
            "[daemon]\nruntime_dir = \"{}\"\nmetrics_address = \"\"\nallow_root = true\n",
            dir.as_path().display()
        );
        for g in 0..GPUS {
            text += &format!(
                "\n[[gpu]]\nname = \"gpu{g}\"\nbackend = \"software\"\nmemory = \"1GiB\"\ncompute_units = {PER_GPU}\n"
            );
        }
        for i in 0..VGPUS {
            text += &format!(
                "\n[[vgpu]]\nname = \"v{i}\"\ngpu = \"gpu{}\"\nsocket = \"v{i}.sock\"\nmemory = \"32MiB\"\ncompute_units = 1\nweight = {}\nqueues = {QUEUES}\n",
                i / PER_GPU,
                weight(i)
            );
        }
        let config = dir.as_path().join("vgpud.toml");
        std::fs::write(&config, text).expect("config");
        let child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .args(["run", "--allow-root", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("vgpud");
        let d = Daemon { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(0..VGPUS).all(|i| d.socket(i).exists()) || !d.path("api.sock").exists() {
            assert!(
                Instant::now() < deadline,
                "vgpud did not create its sockets"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.as_path().join(name)
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.path(&format!("v{i}.sock"))
    }

    fn proc(&self, what: &str) -> PathBuf {
        Path::new("/proc")
            .join(self.child.id().to_string())
            .join(what)
    }

    /// Threads, file descriptors, resident bytes and CPU time so far.
    fn usage(&self) -> Usage {
        let status = std::fs::read_to_string(self.proc("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(self.proc("stat")).unwrap_or_default();
        // After the command name's closing parenthesis: state is field 3,
        // utime and stime fields 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |r| r.1);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // SAFETY: sysconf reads a constant of the system.
        let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let cpu = f
            .get(11)
            .zip(f.get(12))
            .map_or(0.0, |(u, s)| (u + s) as f64 / tick);
        Usage {
            threads: field("Threads:"),
            fds: std::fs::read_dir(self.proc("fd")).map_or(0, |d| d.count() as u64),
            rss: field("VmRSS:") << 10,
            cpu: Duration::from_secs_f64(cpu),
            at: Instant::now(),
        }
    }

    /// `GET /api/v1/stats`.
    fn stats(&self) -> Value {
        let mut s = UnixStream::connect(self.path("api.sock")).expect("API socket");
        s.write_all(b"GET /api/v1/stats HTTP/1.1\r\nHost: vgpud\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("response");
        let text = String::from_utf8_lossy(&out);
        let body = text.split_once("\r\n\r\n").map_or("", |b| b.1);
        serde_json::from_str(body).expect("stats JSON")
    }
}

#[derive(Clone, Copy)]
struct Usage {
    threads: u64,
    fds: u64,
    rss: u64,
    cpu: Duration,
    at: Instant,
}

/// Device time of each vGPU so far, seconds.
fn busy(stats: &Value) -> Vec<f64> {
    (0..VGPUS)
        .map(|i| {
            stats["vgpus"]
                .as_array()
                .and_then(|v| v.iter().find(|x| x["name"] == format!("v{i}")))
                .and_then(|x| x["busy_seconds"].as_f64())
                .unwrap_or(0.0)
        })
        .collect()
}

/// A guest keeping [`DEPTH`] FILLs queued on each queue until stopped.
fn load(socket: PathBuf, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> JoinHandle<()> {
    let mut g = Guest::connect(
        &socket,
        GuestOptions {
            ram_size: 8 << 20,
            ..GuestOptions::default()
        },
    );
    for q in 0..QUEUES {
        g.setup_queue(q, 256, Mode::Interrupt);
    }
    let addr = g.device_alloc(0, FILL);
    let fill = abi::FillCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_FILL,
            flags: 0,
        },
        addr,
        size: FILL,
        pattern: 0x5a5a_5a5a,
        reserved: 0,
    };
    std::thread::spawn(move || {
        let chain = Chain::new().bytes(fill.as_slice()).completion();
        for q in 0..QUEUES {
            for _ in 0..DEPTH {
                g.post(q, &chain);
            }
            g.kick(q);
        }
        let mut q = 0;
        while !stop.load(Ordering::Relaxed) {
            q = (q + 1) % QUEUES;
            let mut n = 0;
            while let Some(u) = g.poll_used(q) {
                assert_eq!(u.completion().status, abi::STATUS_OK);
                n += 1;
            }
            if n == 0 {
                if let Some(u) = g.wait_used(q, Duration::from_millis(50)) {
                    assert_eq!(u.completion().status, abi::STATUS_OK);
                    n = 1;
                }
            }
            for _ in 0..n {
                g.post(q, &chain);
            }
            if n > 0 {
                g.kick(q);
                done.fetch_add(n, Ordering::Relaxed);
            }
        }
    })
}

fn per_vgpu(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / VGPUS as f64
}

fn main() -> std::process::ExitCode {
    let bench = vgpu_benchkit::Bench::start();
    let (idle_for, busy_for) = bench.mode().pick(
        (Duration::from_secs(5), Duration::from_secs(20)),
        (Duration::from_secs(2), Duration::from_secs(5)),
        (Duration::from_millis(200), Duration::from_millis(500)),
    );
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "one daemon, {VGPUS} vGPUs on {GPUS} software GPUs ({PER_GPU} each, weights 1:2:3:4), {cpus} CPUs{}",
        match bench.mode() {
            vgpu_benchkit::Mode::Full => "",
            vgpu_benchkit::Mode::Quick => " (quick)",
            vgpu_benchkit::Mode::Smoke => " (smoke)",
        }
    );
    let t0 = Instant::now();
    let d = Daemon::start();
    println!("   started in {:.2} s", t0.elapsed().as_secs_f64());
    // Per vGPU below: the daemon's totals over the vGPUs (its fixed part,
    // a few threads and descriptors, included).
    std::thread::sleep(idle_for.min(Duration::from_millis(500)));
    let a = d.usage();
    std::thread::sleep(idle_for);
    let b = d.usage();
    let idle_cpu = (b.cpu - a.cpu).as_secs_f64() / (b.at - a.at).as_secs_f64();
    println!("\n1. idle, every vGPU created, no guest");
    println!(
        "   daemon: {} threads, {} descriptors, {:.1} MiB resident, {:.2}% of a core",
        b.threads,
        b.fds,
        b.rss as f64 / (1 << 20) as f64,
        100.0 * idle_cpu
    );
    println!(
        "   per vGPU (the daemon's totals over {VGPUS}): {:.2} threads, {:.2} descriptors, {:.0} KiB",
        b.threads as f64 / VGPUS as f64,
        b.fds as f64 / VGPUS as f64,
        b.rss as f64 / VGPUS as f64 / 1024.0
    );

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let guests: Vec<JoinHandle<()>> = (0..VGPUS)
        .map(|i| load(d.socket(i), stop.clone(), done.clone()))
        .collect();
    let connected = d.usage();
    std::thread::sleep(busy_for.min(Duration::from_secs(1)));
    let (u0, s0, c0) = (d.usage(), busy(&d.stats()), done.load(Ordering::Relaxed));
    std::thread::sleep(busy_for);
    let (u1, s1, c1) = (d.usage(), busy(&d.stats()), done.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    for g in guests {
        if g.join().is_err() {
            bench.fail("a guest thread panicked".into());
        }
    }
    let wall = (u1.at - u0.at).as_secs_f64();
    let cpu = (u1.cpu - u0.cpu).as_secs_f64();
    let dev: Vec<f64> = s1.iter().zip(&s0).map(|(x, y)| x - y).collect();
    let dev_total: f64 = dev.iter().sum();
    println!(
        "\n2. busy: a guest on every vGPU keeping FILLs of {} KiB queued, {:.1} s",
        FILL >> 10,
        wall
    );
    println!(
        "   connected: {} threads (+{:.2} per vGPU), {} descriptors (+{:.2} per vGPU), {:.1} MiB resident (+{:.0} KiB per vGPU)",
        connected.threads,
        per_vgpu(b.threads, connected.threads),
        connected.fds,
        per_vgpu(b.fds, connected.fds),
        connected.rss as f64 / (1 << 20) as f64,
        per_vgpu(b.rss, connected.rss) / 1024.0
    );
    println!(
        "   {} commands ({:.0}/s); daemon CPU {:.2} cores, {:.2}% of a core per busy vGPU; device time {:.2} GPUs' worth",
        c1 - c0,
        (c1 - c0) as f64 / wall,
        cpu / wall,
        100.0 * cpu / wall / VGPUS as f64,
        dev_total / wall
    );
    // On the software backend the GPU's work is the daemon's CPU work,
    // and device time is wall time of runs that share the cores: the
    // two do not subtract. Commands per CPU-second compare runs.
    println!(
        "   {:.0} commands per CPU-second of the daemon",
        (c1 - c0) as f64 / cpu.max(1e-9)
    );
    println!("   GPU   worst share deviation (of 16 tenants, weights 1:2:3:4)");
    let mut worst = 0.0f64;
    for g in 0..GPUS {
        let ids = g * PER_GPU..(g + 1) * PER_GPU;
        let sum: f64 = dev[ids.clone()].iter().sum();
        let wsum: u32 = ids.clone().map(weight).sum();
        let dev_g = ids
            .map(|i| (dev[i] / sum.max(1e-12) - f64::from(weight(i)) / f64::from(wsum)).abs())
            .fold(0.0, f64::max);
        println!("   gpu{g}  {:.2} pp", dev_g * 100.0);
        worst = worst.max(dev_g);
    }
    if dev_total <= 0.0 {
        bench.fail("no device time measured".into());
    }
    println!(
        "   worst: {:.2} pp (target 2 pp): {}",
        worst * 100.0,
        vgpu_benchkit::verdict(worst <= 0.02 && dev_total > 0.0)
    );
    bench.finish()
}
