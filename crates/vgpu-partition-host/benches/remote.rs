//! What a partition in its own process costs per call: the same
//! operations on an in-process partition and on a partition host, in
//! alternating rounds of one run, for the software backend and (when a
//! CUDA driver is present) the CUDA backend, with native CUDA beside.
//! Prints markdown tables. With a CUDA driver it also times COPY
//! commands between guest RAM (a memfd, as a VMM shares it) and device
//! memory through a vGPU whose partition is in a partition host (guest
//! memory forwarded to it), through a vGPU with its partition in process
//! (guest memory registered), and native cuMemcpy from pinned memory.
//!
//! `cargo bench -p vgpu-partition-host --bench remote [-- --cuda-only | --copies-only]`
//!
//! The partition host is `VGPU_PARTITION_HOST`, or `vgpu-partition-host`
//! next to this binary or one directory up (where cargo puts it).
//!
//! The smoke run, `cargo bench -p vgpu-partition-host --bench remote --
//! --test` (or `cargo test -p vgpu-partition-host --bench remote`,
//! which runs the binary without `--bench`), runs every part for a
//! fraction of a second and exits non-zero if one panics or measures
//! nothing (a ratio without a baseline); CI runs every benchmark so.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::conformance::builtin_launch;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, HostSink, HostSource, OpError, Partition, PartitionSpec};
use vgpu_backend_remote::{
    default_host_program, HostOptions, InnerBackend, ProcessLauncher, RemoteBackend, RemoteConfig,
};
use vgpu_benchkit::{Bench, Target};

// The CUDA bench's fixtures: timing, guest COPYs, the native baseline.
#[path = "../../vgpu-backend-cuda/benches/common/mod.rs"]
mod common;

use common::{pct, size_name, KIB, MIB};

struct Buf(Vec<u8>);

impl HostSource for Buf {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), OpError> {
        let o = offset as usize;
        out.copy_from_slice(&self.0[o..o + out.len()]);
        Ok(())
    }
}

struct Sink(std::cell::UnsafeCell<Vec<u8>>);

impl HostSink for Sink {
    fn len(&self) -> u64 {
        // SAFETY: single-threaded; no reference into the vector is live.
        unsafe { (*self.0.get()).len() as u64 }
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), OpError> {
        let o = offset as usize;
        // SAFETY: as above.
        unsafe { (&mut *self.0.get())[o..o + data.len()].copy_from_slice(data) };
        Ok(())
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One operation timed on each variant: `rounds` rounds, each running
/// every variant `reps` times in turn, so load changes hit all alike.
struct Case<'a> {
    name: String,
    variants: Vec<Variant<'a>>,
}

/// A named way of doing a case's operation once.
type Variant<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// An operation on a partition and the address of its test allocation.
type Op = Box<dyn Fn(&mut dyn Partition, u64)>;

fn run_cases(bench: &Bench, title: &str, cases: &mut [Case<'_>], rounds: usize, reps: usize) {
    // A smoke run: one short round.
    let (rounds, reps) = if bench.smoke() {
        (1, reps.min(5))
    } else {
        (rounds, reps)
    };
    println!("| {title} | {} | vs the first |", {
        let names: Vec<String> = cases[0]
            .variants
            .iter()
            .map(|(n, _)| format!("{n} p50 (p99)"))
            .collect();
        names.join(" | ")
    });
    println!("|---|{}---|", "---|".repeat(cases[0].variants.len()));
    for case in cases.iter_mut() {
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); case.variants.len()];
        for (_, f) in case.variants.iter_mut() {
            f(); // warm up
        }
        for _ in 0..rounds {
            for (i, (_, f)) in case.variants.iter_mut().enumerate() {
                for _ in 0..reps {
                    let t = Instant::now();
                    f();
                    samples[i].push(t.elapsed());
                }
            }
        }
        let p50: Vec<Duration> = samples.iter_mut().map(|s| pct(s, 0.5)).collect();
        let cells: Vec<String> = samples
            .iter_mut()
            .zip(&p50)
            .map(|(s, m)| format!("{:.1} µs ({:.1})", us(*m), us(pct(s, 0.99))))
            .collect();
        let ratios: Vec<String> = p50[1..]
            .iter()
            .zip(&case.variants[1..])
            .map(|(m, (variant, _))| {
                let what = format!("{}, {variant} vs {}", case.name, case.variants[0].0);
                let r = bench.ratio(&what, us(*m), us(p50[0]), Target::Reference);
                format!(
                    "{:.2}x ({:+.1} µs) {}",
                    r.value,
                    us(*m) - us(p50[0]),
                    r.verdict
                )
                .trim_end()
                .to_string()
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            case.name,
            cells.join(" | "),
            ratios.join(", ")
        );
    }
}

fn spec(name: &str, memory: usize, units: u32) -> PartitionSpec {
    PartitionSpec {
        name: name.into(),
        memory: memory as u64,
        compute_units: units,
    }
}

/// The per-call cases shared by both backends: a tiny fill, a one-word
/// built-in kernel, and uploads/downloads of several sizes, on every
/// partition of `parts`.
fn cases<'a>(parts: Vec<(&'static str, &'a mut dyn Partition)>, sizes: &[usize]) -> Vec<Case<'a>> {
    let max = *sizes.iter().max().unwrap();
    type Shared<'a> = std::rc::Rc<std::cell::RefCell<&'a mut dyn Partition>>;
    let parts: Vec<(&'static str, Shared<'a>, u64)> = parts
        .into_iter()
        .map(|(name, p)| {
            let a = p.alloc(max as u64, 0).unwrap();
            (name, std::rc::Rc::new(std::cell::RefCell::new(p)), a)
        })
        .collect();
    let mut out = Vec::new();
    let mut case = |name: String, f: Op| {
        let f = std::rc::Rc::new(f);
        let variants = parts
            .iter()
            .map(|(n, p, a)| {
                let (p, f, a) = (p.clone(), f.clone(), *a);
                (
                    *n,
                    Box::new(move || f(&mut **p.borrow_mut(), a)) as Box<dyn FnMut()>,
                )
            })
            .collect();
        out.push(Case { name, variants });
    };
    case(
        "FILL 4 bytes (tiny op)".into(),
        Box::new(|p, a| p.fill(a, 4, 1).unwrap()),
    );
    case(
        "LAUNCH built-in fill_u32 of 1 word".into(),
        Box::new(|p, a| {
            let params = abi::FillParams {
                dst: a,
                count: 1,
                value: 1,
                reserved: 0,
            };
            p.launch(&builtin_launch("fill_u32", params.as_slice()))
                .unwrap()
        }),
    );
    for &s in sizes {
        let name = size_name(s);
        let src = std::rc::Rc::new(Buf(vec![0x5a; s]));
        case(
            format!("upload {name}"),
            Box::new(move |p, a| p.upload(a, &*src).unwrap()),
        );
        let sink = std::rc::Rc::new(Sink(std::cell::UnsafeCell::new(vec![0; s])));
        case(
            format!("download {name}"),
            Box::new(move |p, a| p.download(a, &*sink).unwrap()),
        );
    }
    out
}

/// Polling time of the polling variants (the default per-vGPU poll time).
const SPIN: Duration = Duration::from_micros(50);

/// A remote backend over `inner`, its hosts polling for `spin`.
fn remote_backend(inner: InnerBackend, spin: Duration) -> RemoteBackend {
    let program = default_host_program().expect("partition host program");
    let args = HostOptions {
        backend: inner,
        spin,
    }
    .to_args();
    let launcher = Arc::new(ProcessLauncher::new(program, args).expect("launcher"));
    let config = RemoteConfig {
        spin,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(launcher, config).unwrap()
}

/// The floor: a bare request/reply of the same sizes (16 + 8 bytes out,
/// 16 + 9 back) over a socket pair to an echo thread, sleeping or polling
/// like the partition host.
fn ping_pong(spin: Duration) -> Box<dyn FnMut()> {
    use std::io::{Read, Write};
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let poll = move |s: &std::os::unix::net::UnixStream| {
        let t = Instant::now();
        while matches!(vgpu_sys::poll::poll_readable(s, 0), Ok(false)) && t.elapsed() < spin {}
    };
    std::thread::spawn(move || {
        let mut req = [0u8; 24];
        loop {
            poll(&b);
            if b.read_exact(&mut req).is_err() {
                return;
            }
            if b.write_all(&[0u8; 25]).is_err() {
                return;
            }
        }
    });
    Box::new(move || {
        a.write_all(&[0u8; 24]).unwrap();
        poll(&a);
        let mut rep = [0u8; 25];
        a.read_exact(&mut rep).unwrap();
    })
}

fn floor(bench: &Bench) {
    let mut case = [Case {
        name: "bare socket round trip, echo thread".into(),
        variants: vec![
            ("sleeping", ping_pong(Duration::ZERO)),
            ("polling 50 µs", ping_pong(SPIN)),
        ],
    }];
    run_cases(bench, "floor", &mut case, 10, 500);
    println!();
}

fn software(bench: &Bench) {
    let memory = 256 * MIB;
    let local = SoftwareBackend::new(memory as u64, 2);
    let mut lp = local.create_partition(&spec("local", memory, 2)).unwrap();
    let inner = InnerBackend::Software {
        memory: memory as u64,
        compute_units: 2,
    };
    let sleeping = remote_backend(inner, Duration::ZERO);
    let polling = remote_backend(inner, SPIN);
    let mut rp = sleeping
        .create_remote_partition(&spec("remote", memory, 2))
        .unwrap();
    let mut pp = polling
        .create_remote_partition(&spec("polling", memory, 2))
        .unwrap();
    let parts: Vec<(&'static str, &mut dyn Partition)> = vec![
        ("in process", &mut *lp),
        ("partition host", &mut rp),
        ("partition host, polling 50 µs", &mut pp),
    ];
    let mut cases = cases(parts, &[4 * KIB, MIB, 16 * MIB]);
    println!("software backend\n");
    let (small, big) = cases.split_at_mut(4);
    run_cases(bench, "software, per call", small, 10, 500);
    let (mid, big) = big.split_at_mut(2);
    run_cases(bench, "software, per call", mid, 10, 100);
    run_cases(bench, "software, per call", big, 5, 10);
}

mod cuda {
    use super::common::{
        copy_cell, copy_reps, cuda_backend, guest_copy, median_of, print_percentiles, Native,
        NativeBuffers, NativeFunction,
    };
    use super::*;
    use vgpu_abi::SgEntry;
    use vgpu_backend_cuda::CudaBackend;
    use vgpu_device::testing::{test_config, TestVgpu};
    use vgpu_testkit::{Guest, GuestOptions, Mode as QueueMode};

    /// Partition host start (context, built-in module) and an in-place
    /// reset, timed.
    fn lifecycle(remote: &RemoteBackend) {
        let mut starts = Vec::new();
        let mut resets = Vec::new();
        let mut respawns = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let mut p = remote
                .create_remote_partition(&spec("life", 64 * MIB, 1))
                .unwrap();
            starts.push(t.elapsed());
            let t = Instant::now();
            p.reset();
            resets.push(t.elapsed());
            let pid = p.host_pid().unwrap();
            // SAFETY: kill(2) of the host this benchmark started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = p.alloc(16, 0);
            let t = Instant::now();
            p.reset();
            respawns.push(t.elapsed());
            assert!(p.failure().is_none());
        }
        println!("| partition host lifecycle (5 runs) | p50 | max |");
        println!("|---|---|---|");
        let mut rows = [
            (
                "start (process, CUDA context, built-in module)",
                &mut starts,
            ),
            ("reset in place (healthy host)", &mut resets),
            ("reset of a dead host (new process)", &mut respawns),
        ];
        print_percentiles(&mut rows, 1.0, "ms");
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    /// A vGPU on `p` with guest RAM of `ram` bytes, polled queue 0, a
    /// device buffer and a guest buffer of `max` bytes.
    fn vgpu(p: Box<dyn Partition>, ram: usize, max: usize) -> (TestVgpu, Guest, u64, u64) {
        let server = TestVgpu::start(test_config("bench", 1), p);
        let mut g = server.connect_with(GuestOptions {
            ram_size: ram as u64,
            ..GuestOptions::default()
        });
        g.setup_queue(0, 64, QueueMode::Polled);
        let dev = g.device_alloc(0, max as u64);
        let buf = g.alloc(max as u64, 4096);
        (server, g, dev, buf)
    }

    /// Guest RAM <-> device COPYs through a vGPU on a partition host
    /// (sleeping, and polling for 50 µs at both ends as vgpud does for
    /// CUDA), on an in-process partition, and native from pinned memory.
    fn guest_copies(
        bench: &Bench,
        b: &CudaBackend,
        sleeping: &RemoteBackend,
        polling: &RemoteBackend,
    ) {
        let sizes: &[usize] = if bench.smoke() {
            &[64 * KIB, MIB]
        } else {
            &[64 * KIB, MIB, 16 * MIB, 256 * MIB, 1024 * MIB]
        };
        let max = sizes[sizes.len() - 1];
        let ram = max + max / 2;
        let pspec = spec("copies", 2 * max, 1);

        let lp = b.create_cuda_partition(&pspec).unwrap();
        let reg = lp.host_registry().clone();
        let (_ls, mut lg, ldev, lbuf) = vgpu(Box::new(lp), ram, max);
        let t = Instant::now();
        while reg.registered() == 0 {
            assert!(t.elapsed() < Duration::from_secs(30), "not registered");
            std::thread::sleep(Duration::from_millis(1));
        }
        let local_reg = t.elapsed();
        let whole = |buf: u64| {
            [SgEntry {
                addr: buf,
                len: max as u64,
            }]
        };
        let target = median_of(3, || guest_copy(&mut lg, true, ldev, &whole(lbuf)));

        let mut hosts = Vec::new();
        for remote in [sleeping, polling] {
            let rp = remote.create_remote_partition(&pspec).unwrap();
            let counts = rp.transfer_counts();
            let t = Instant::now();
            let (server, mut rg, rdev, rbuf) = vgpu(Box::new(rp), ram, max);
            // The host registers guest RAM in the background; until then
            // its copies bounce. Wait until a 1 GiB COPY runs within 5% of
            // the in-process one (or give up after 30 s and measure anyway).
            let reached = loop {
                let d = median_of(1, || guest_copy(&mut rg, true, rdev, &whole(rbuf)));
                if d.as_secs_f64() <= 1.05 * target.as_secs_f64() {
                    break Some(t.elapsed());
                }
                if t.elapsed() > Duration::from_secs(30) {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            hosts.push((server, rg, rdev, rbuf, counts, reached));
        }

        let native = Native::new();
        let pinned = NativeBuffers::new(&native, max);
        let when = |r: Option<Duration>| {
            r.map_or("not within 30 s".into(), |d| format!("{:.0} ms", ms(d)))
        };
        println!(
            "guest RAM of {} MiB per vGPU; registered in process in {:.0} ms; \
             partition hosts at in-process speed {} (sleeping) and {} (polling) \
             after their guest connected\n",
            ram / MIB,
            ms(local_reg),
            when(hosts[0].5),
            when(hosts[1].5),
        );
        println!(
            "| size | direction | vGPU COPY, partition host | partition host, polling 50 µs | \
             vGPU COPY, in process | native pinned | host / native | polling host / native | \
             polling host / in process |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let cell = copy_cell;
        for &size in sizes {
            let reps = copy_reps(size);
            let sg = |buf: u64| {
                [SgEntry {
                    addr: buf,
                    len: size as u64,
                }]
            };
            for up in [true, false] {
                // Rounds alternate the four, so load changes hit all alike.
                let mut t: [Vec<Duration>; 4] = Default::default();
                for _ in 0..3 {
                    for (i, h) in hosts.iter_mut().enumerate() {
                        let (g, dev, buf) = (&mut h.1, h.2, h.3);
                        t[i].push(median_of(reps, || guest_copy(g, up, dev, &sg(buf))));
                    }
                    t[2].push(median_of(reps, || guest_copy(&mut lg, up, ldev, &sg(lbuf))));
                    t[3].push(median_of(reps, || pinned.copy(up, size)));
                }
                let [r, q, l, n] = t.map(|mut v| pct(&mut v, 0.5));
                let dir = if up { "up" } else { "down" };
                let ratio = |what: &str, a: Duration, b: Duration| {
                    let what = format!("COPY {} {dir}, {what}", size_name(size));
                    let r = bench.ratio(&what, a.as_secs_f64(), b.as_secs_f64(), Target::Reference);
                    format!("{:.0}% {}", r.percent(), r.verdict)
                        .trim_end()
                        .to_string()
                };
                println!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    size_name(size),
                    if up {
                        "guest -> device"
                    } else {
                        "device -> guest"
                    },
                    cell(size, r),
                    cell(size, q),
                    cell(size, l),
                    cell(size, n),
                    ratio("native / host", n, r),
                    ratio("native / polling host", n, q),
                    ratio("in process / polling host", l, q),
                );
            }
        }
        for (name, h) in ["partition host", "polling partition host"]
            .iter()
            .zip(&hosts)
        {
            println!(
                "\n{name}: {} transfers named guest memory, {} were staged",
                h.4.direct(),
                h.4.staged()
            );
        }
        drop(pinned);
        drop(native);
    }

    pub fn run(bench: &Bench, copies_only: bool) {
        let Some(b) = cuda_backend() else {
            return;
        };
        b.set_guest_ptx(true);
        println!("{} ({} SMs)\n", b.device_name(), b.device_sms());
        let inner = InnerBackend::Cuda {
            device: 0,
            guest_ptx: true,
            spatial: false,
        };
        let remote = remote_backend(inner, Duration::ZERO);
        let polling = remote_backend(inner, SPIN);
        if copies_only {
            guest_copies(bench, &b, &remote, &polling);
            return;
        }
        let mut lp = b.create_partition(&spec("local", 512 * MIB, 1)).unwrap();
        let mut rp = remote
            .create_remote_partition(&spec("remote", 512 * MIB, 1))
            .unwrap();
        let mut pp = polling
            .create_remote_partition(&spec("polling", 512 * MIB, 1))
            .unwrap();
        // The built-in module's `nop` entry, loaded as guest PTX: an empty kernel.
        let ptx = b.builtin_ptx().to_vec();
        let lm = lp.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
        let rm = rp.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
        let pm = pp.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
        let nop = super::common::nop;

        // Native: the same kernel in the device's primary context.
        let native = Native::new();
        let nop_fn = NativeFunction::load(&ptx, "nop");
        {
            let mut l = || lp.launch(&nop(lm)).unwrap();
            let mut r = || rp.launch(&nop(rm)).unwrap();
            let mut q = || pp.launch(&nop(pm)).unwrap();
            // SAFETY: `nop` takes no parameters; the stream is `native`'s.
            let mut n =
                || unsafe { nop_fn.run([1; 3], [1; 3], native.stream, std::ptr::null_mut()) };
            let mut case = [Case {
                name: "empty kernel, launch + wait".into(),
                variants: vec![
                    ("in process", Box::new(&mut l) as Box<dyn FnMut()>),
                    ("partition host", Box::new(&mut r)),
                    ("partition host, polling 50 µs", Box::new(&mut q)),
                    ("native", Box::new(&mut n)),
                ],
            }];
            run_cases(bench, "CUDA, per call", &mut case, 10, 500);
        }
        drop(nop_fn);
        drop(native);
        println!();
        let parts: Vec<(&'static str, &mut dyn Partition)> = vec![
            ("in process", &mut *lp),
            ("partition host", &mut rp),
            ("partition host, polling 50 µs", &mut pp),
        ];
        let mut cases = cases(parts, &[4 * KIB, MIB, 16 * MIB, 256 * MIB]);
        let (small, big) = cases.split_at_mut(6);
        run_cases(bench, "CUDA, per call", small, 10, 200);
        run_cases(bench, "CUDA, per call", big, 5, 4);
        drop(cases);
        println!();
        drop((lp, rp, pp));
        lifecycle(&remote);
        println!();
        guest_copies(bench, &b, &remote, &polling);
    }
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let copies_only = std::env::args().any(|a| a == "--copies-only");
    if copies_only || std::env::args().any(|a| a == "--cuda-only") {
        cuda::run(&bench, copies_only);
        return bench.finish();
    }
    floor(&bench);
    software(&bench);
    println!();
    cuda::run(&bench, false);
    bench.finish()
}
