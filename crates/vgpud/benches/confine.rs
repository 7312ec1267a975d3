//! What the seccomp filter costs a guest: the real `vgpud` binary is
//! started twice, `--seccomp strict` and `--seccomp off`, each with one
//! software vGPU, and a testkit guest on each runs NOP commands one at a
//! time (submit, wait for the completion) in interrupt mode and in polled
//! mode. Every command crosses the doorbell, the device worker, the
//! scheduler and the completion path, and so every system call they make.
//! The two daemons are measured alternately in rounds, so that machine
//! noise hits each alike; the table gives p50 and p99 per command and the
//! strict/off ratio of the p50s. Run with
//!
//! ```text
//! cargo bench -p vgpud --bench confine
//! ```
//!
//! `BENCH_QUICK=1` runs every part briefly. The smoke run, `cargo bench
//! -p vgpud --bench confine -- --test` (or `cargo test -p vgpud --bench
//! confine`, which runs the binary without `--bench`), runs every part
//! for a fraction of a second and exits non-zero if one panics or
//! measures nothing (a ratio without a baseline); CI runs every
//! benchmark so.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use vgpu_benchkit::{Bench, Mode as BenchMode, Target};
use vgpu_testkit::{Guest, GuestOptions, Mode};
use vmm_sys_util::tempdir::TempDir;

struct Config {
    rounds: usize,
    batch: usize,
    warmup: usize,
}

impl Config {
    fn new(mode: BenchMode) -> Self {
        match mode {
            BenchMode::Full => Config {
                rounds: 30,
                batch: 2000,
                warmup: 3000,
            },
            BenchMode::Quick => Config {
                rounds: 4,
                batch: 100,
                warmup: 100,
            },
            BenchMode::Smoke => Config {
                rounds: 1,
                batch: 20,
                warmup: 10,
            },
        }
    }
}

/// A daemon with one vGPU, stopped and removed on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: TempDir,
}

impl Daemon {
    fn start(seccomp: &str) -> Daemon {
        let dir = TempDir::new_with_prefix("/tmp/vgpud-bench-").unwrap();
        let config = dir.as_path().join("vgpud.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\nruntime_dir = \"{}\"\nmetrics_address = \"\"\n\n\
                 [[gpu]]\nname = \"gpu0\"\nbackend = \"software\"\nmemory = \"256MiB\"\n\
                 compute_units = 1\n\n\
                 [[vgpu]]\nname = \"v\"\ngpu = \"gpu0\"\nsocket = \"v.sock\"\n\
                 memory = \"64MiB\"\ncompute_units = 1\n",
                dir.as_path().display()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .args(["run", "--allow-root", "--seccomp", seccomp, "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("vgpud: {line}");
            }
        });
        let socket = dir.as_path().join("v.sock");
        let api = dir.as_path().join("api.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !api.exists() {
            assert!(Instant::now() < deadline, "vgpud did not start");
            assert!(child.try_wait().unwrap().is_none(), "vgpud exited");
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            child,
            socket,
            _dir: dir,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Runs `n` NOPs one at a time and returns their latencies in ns.
fn nops(g: &mut Guest, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let c = g.nop(0);
            let ns = t.elapsed().as_nanos() as u64;
            assert_eq!(c.status, vgpu_testkit::abi::STATUS_OK);
            ns
        })
        .collect()
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let cfg = Config::new(bench.mode());
    let strict = Daemon::start("strict");
    let off = Daemon::start("off");
    println!(
        "{:<10} {:<8} {:>10} {:>10} {:>10}",
        "mode", "seccomp", "p50 us", "p99 us", "samples"
    );
    for (name, mode) in [("interrupt", Mode::Interrupt), ("polled", Mode::Polled)] {
        let mut guests: Vec<Guest> = [&strict, &off]
            .iter()
            .map(|d| {
                let mut g = Guest::connect(&d.socket, GuestOptions::default());
                g.setup_queue(0, 64, mode);
                g
            })
            .collect();
        for g in &mut guests {
            nops(g, cfg.warmup);
        }
        let mut samples = [Vec::new(), Vec::new()];
        for _ in 0..cfg.rounds {
            for (g, s) in guests.iter_mut().zip(samples.iter_mut()) {
                s.extend(nops(g, cfg.batch));
            }
        }
        let mut p50 = [0u64; 2];
        for (i, label) in ["strict", "off"].iter().enumerate() {
            let s = &mut samples[i];
            s.sort_unstable();
            p50[i] = percentile(s, 0.5);
            println!(
                "{:<10} {:<8} {:>10.1} {:>10.1} {:>10}",
                name,
                label,
                p50[i] as f64 / 1e3,
                percentile(s, 0.99) as f64 / 1e3,
                s.len()
            );
        }
        let r = bench.ratio(
            &format!("{name}, strict / off"),
            p50[0] as f64,
            p50[1] as f64,
            Target::Reference,
        );
        println!(
            "{:<10} strict/off p50 ratio {:.3} {}",
            name, r.value, r.verdict
        );
    }
    bench.finish()
}
