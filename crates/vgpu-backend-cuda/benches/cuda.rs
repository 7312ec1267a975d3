//! Partition and vGPU paths against the same work done directly with the
//! driver API: guest memory <-> device copies (through a whole vGPU, and
//! through a partition, registered and staged), an empty kernel's launch
//! and wait, sgemm on half the SMs, time-slicing two isolated tenants
//! under the host scheduler, and a victim's sgemm next to a busy
//! neighbour. Prints markdown tables; prints "skipped: no CUDA driver" and
//! exits 0 without CUDA.
//!
//! `cargo bench -p vgpu-backend-cuda --bench cuda` (`-- copies`, `--
//! launches`, `-- sgemm`, `-- sharing` run one part).
//!
//! The smoke run, `cargo bench -p vgpu-backend-cuda --bench cuda --
//! --test` (or `cargo test -p vgpu-backend-cuda --bench cuda`, which
//! runs the binary without `--bench`), runs every part for a fraction
//! of a second and exits non-zero if one panics or measures nothing (a
//! ratio without a baseline); CI runs every benchmark so.

use std::ffi::c_void;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vgpu_abi::{self as abi, ByteValued, SgEntry};
use vgpu_backend::conformance::{self, builtin_launch};
use vgpu_backend::{
    Backend, HostMapping, HostSink, HostSlice, HostSource, OpError, Partition, PartitionSpec,
    SliceFn,
};
use vgpu_backend_cuda::{CudaBackend, CudaPartition, Mode};
use vgpu_benchkit::{Bench, Target};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_sched::{CommandGate, Policy, SchedConfig, SchedGate, Scheduler, TenantId, TenantParams};
use vgpu_testkit::{GuestOptions, Mode as QueueMode};

mod common;

use common::{
    ck, copy_cell, copy_reps, guest_copy, median_of, pct, print_percentiles, size_name, time,
    Native, NativeBuffers, NativeFunction, KIB, MIB,
};

/// Page-aligned host memory standing in for guest RAM (not pinned).
struct HostBuf {
    ptr: *mut u8,
    len: usize,
}

impl HostBuf {
    fn new(len: usize) -> HostBuf {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        HostBuf { ptr, len }
    }

    fn slice(&self, len: usize) -> &[u8] {
        assert!(len <= self.len);
        // SAFETY: `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                std::alloc::Layout::from_size_align(self.len, 4096).unwrap(),
            )
        }
    }
}

/// `len` bytes of a [`HostBuf`] as a source or sink.
struct Window<'a> {
    buf: &'a HostBuf,
    len: usize,
}

impl HostSource for Window<'_> {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), OpError> {
        let off = offset as usize;
        out.copy_from_slice(&self.buf.slice(self.len)[off..off + out.len()]);
        Ok(())
    }
}

impl HostSink for Window<'_> {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), OpError> {
        let off = offset as usize;
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds of the buffer (checked); nothing else reads
        // it during the call.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.ptr.add(off), data.len()) };
        Ok(())
    }
}

fn median(v: &mut [Duration]) -> Duration {
    pct(v, 0.5)
}

/// Guest RAM as a VMM shares it: a memfd mapped shared.
struct SharedRam {
    file: Arc<File>,
    ptr: *mut u8,
    len: usize,
}

impl SharedRam {
    fn new(len: usize) -> SharedRam {
        // SAFETY: valid NUL-terminated name; result checked.
        let fd = unsafe { libc::memfd_create(c"bench-ram".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is new and owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).unwrap();
        // SAFETY: a shared mapping of the whole file, checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        SharedRam {
            file: Arc::new(file),
            ptr: ptr.cast(),
            len,
        }
    }
}

impl Drop for SharedRam {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The first `len` bytes of a [`SharedRam`], offering its host slice.
struct RamRange<'a> {
    ram: &'a SharedRam,
    len: usize,
}

impl HostSource for RamRange<'_> {
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), OpError> {
        // SAFETY: in bounds of the mapping (offset + len <= self.len).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ram.ptr.add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
    fn with_slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        f(&[HostSlice {
            ptr: self.ram.ptr,
            len: self.len,
            mapping: 1,
        }])
    }
}

impl HostSink for RamRange<'_> {
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), OpError> {
        // SAFETY: in bounds of the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.ram.ptr.add(offset as usize),
                data.len(),
            )
        };
        Ok(())
    }
    fn with_slices_mut(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        f(&[HostSlice {
            ptr: self.ram.ptr,
            len: self.len,
            mapping: 1,
        }])
    }
}

/// Median time of `f` over a number of runs suited to `size`.
fn med(size: usize, f: impl FnMut()) -> Duration {
    median_of(copy_reps(size), f)
}

/// Guest memory <-> device copies: through a vGPU (the test kit playing
/// VMM and guest, guest RAM a registered memfd, a polled queue), through
/// the partition alone (registered, and staged from unpinned memory), and
/// native cuMemcpy from pinned memory.
fn copies(bench: &Bench, b: &CudaBackend) {
    let sizes: &[usize] = if bench.smoke() {
        &[64 * KIB, MIB]
    } else {
        &[64 * KIB, MIB, 16 * MIB, 256 * MIB, 1024 * MIB]
    };
    let max = sizes[sizes.len() - 1];

    // The vGPU: guest RAM of 1.5 GiB, its COPY commands on queue 0.
    let vp = b
        .create_cuda_partition(&PartitionSpec {
            name: "vgpu".into(),
            memory: 2 * max as u64,
            compute_units: 1,
        })
        .unwrap();
    let vreg = vp.host_registry().clone();
    let server = TestVgpu::start(test_config("bench", 1), Box::new(vp));
    let mut g = server.connect_with(GuestOptions {
        ram_size: (max + max / 2) as u64,
        ..GuestOptions::default()
    });
    let t = Instant::now();
    while vreg.registered() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "guest RAM not registered"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let registered_in = t.elapsed();
    g.setup_queue(0, 64, QueueMode::Polled);
    let vdev = g.device_alloc(0, max as u64);
    let guest_buf = g.alloc(max as u64, 4096);

    // The partition alone, with memory registered through its registry.
    let mut p = b
        .create_cuda_partition(&PartitionSpec {
            name: "bench".into(),
            memory: 2 * max as u64,
            compute_units: 1,
        })
        .unwrap();
    let dev = p.alloc(max as u64, 0).unwrap();
    let ram = SharedRam::new(max);
    let reg = p.host_registry().clone();
    vgpu_backend::HostMemory::mapped(
        &reg,
        HostMapping {
            id: 1,
            addr: ram.ptr as usize,
            len: max,
            readable: true,
            writable: true,
            file: ram.file.clone(),
            file_offset: 0,
        },
    );
    assert!(reg.wait_registered(1, Duration::from_secs(30)));
    let host = HostBuf::new(max);

    // The native side: the primary context, pinned memory, one stream.
    let native = Native::new();
    let pinned = NativeBuffers::new(&native, max);
    println!(
        "guest RAM of {} registered in {registered_in:?} (mapped notice to registration complete)\n",
        size_name(max + max / 2)
    );
    println!("| size | direction | vGPU COPY (guest RAM) | partition, registered | native pinned | vGPU / native | partition, staged |");
    println!("|---|---|---|---|---|---|---|");
    let cell = copy_cell;
    for &size in sizes {
        let sg = [SgEntry {
            addr: guest_buf,
            len: size as u64,
        }];
        let r = RamRange {
            ram: &ram,
            len: size,
        };
        let w = Window {
            buf: &host,
            len: size,
        };
        let v_up = med(size, || guest_copy(&mut g, true, vdev, &sg));
        let p_up = med(size, || {
            p.upload(dev, &r).unwrap();
            assert!(p.last_copy_was_direct());
        });
        let n_up = med(size, || pinned.copy(true, size));
        let s_up = med(size, || p.upload(dev, &w).unwrap());
        let v_down = med(size, || guest_copy(&mut g, false, vdev, &sg));
        let p_down = med(size, || {
            p.download(dev, &r).unwrap();
            assert!(p.last_copy_was_direct());
        });
        let n_down = med(size, || pinned.copy(false, size));
        let s_down = med(size, || p.download(dev, &w).unwrap());
        for (dir, v, pr, n, st) in [
            ("guest -> device", v_up, p_up, n_up, s_up),
            ("device -> guest", v_down, p_down, n_down, s_down),
        ] {
            let r = bench.ratio(
                &format!("COPY {} {dir}, native / vGPU", size_name(size)),
                n.as_secs_f64(),
                v.as_secs_f64(),
                Target::Reference,
            );
            println!(
                "| {} | {dir} | {} | {} | {} | {:.0}% {} | {} |",
                size_name(size),
                cell(size, v),
                cell(size, pr),
                cell(size, n),
                r.percent(),
                r.verdict,
                cell(size, st),
            );
        }
    }
    drop(pinned);
    drop(native);
    vgpu_backend::HostMemory::unmapped(&reg, 1);
    drop(g);
    drop(server);
}

/// An empty kernel: launch + wait, through the partition and directly.
fn launches(bench: &Bench, b: &CudaBackend) {
    let reps = if bench.smoke() { 50 } else { 5000 };
    let mut p = b
        .create_cuda_partition(&PartitionSpec {
            name: "launch".into(),
            memory: 64 << 20,
            compute_units: 1,
        })
        .unwrap();
    b.set_guest_ptx(true);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, b.builtin_ptx())
        .unwrap();
    let nop = common::nop(m);
    let mut part = time(reps, || p.launch(&nop).unwrap());
    let word = p.alloc(4, 0).unwrap();
    let fill = abi::FillParams {
        dst: word,
        count: 1,
        value: 1,
        reserved: 0,
    };
    let fill = builtin_launch("fill_u32", fill.as_slice());
    let mut builtin = time(reps, || p.launch(&fill).unwrap());

    let native_ctx = Native::new();
    let nop_fn = NativeFunction::load(b.builtin_ptx(), "nop");
    // SAFETY: `nop` takes no parameters; the stream is `native_ctx`'s.
    let mut native = time(reps, || unsafe {
        nop_fn.run([1; 3], [1; 3], native_ctx.stream, std::ptr::null_mut())
    });
    drop(nop_fn);
    drop(native_ctx);
    println!("| empty kernel, launch + wait ({reps} runs) | p50 | p99 |");
    println!("|---|---|---|");
    let mut rows = [
        ("partition, loaded PTX `nop`", &mut part),
        ("partition, built-in `fill_u32` of 1 word", &mut builtin),
        ("native cuLaunchKernel + cuStreamSynchronize", &mut native),
    ];
    print_percentiles(&mut rows, 0.99, "µs");
}

const S: u32 = 4096;

fn sgemm_params(c: u64, a: u64, b: u64) -> abi::SgemmParams {
    conformance::sgemm_params((c, a, b), (S, S, S), 1.0, 0.0)
}

/// sgemm through a partition: median wall time and device time.
fn partition_sgemm(p: &mut CudaPartition) -> (Duration, Duration) {
    let bytes = 4 * u64::from(S) * u64::from(S);
    let a = p.alloc(bytes, 0).unwrap();
    let b = p.alloc(bytes, 0).unwrap();
    let c = p.alloc(bytes, 0).unwrap();
    p.fill(a, bytes, 1.0f32.to_bits()).unwrap();
    p.fill(b, bytes, 0.5f32.to_bits()).unwrap();
    let params = sgemm_params(c, a, b);
    let l = builtin_launch("sgemm_f32", params.as_slice());
    let mut dev = Vec::new();
    let mut wall = time(5, || {
        p.launch(&l).unwrap();
        dev.push(p.last_device_time().unwrap());
    });
    (median(&mut wall), median(&mut dev))
}

/// sgemm launched directly in a green context of `sms` SMs.
fn native_green_sgemm(ptx: &[u8], sms: u32) -> (u32, Duration) {
    // SAFETY: driver calls with valid out pointers on
    // objects made here; every buffer is S*S floats, as the kernel's
    // m, n, k say; everything made is destroyed at the end, once.
    unsafe {
        let mut primary: sys::CUcontext = std::ptr::null_mut();
        ck(sys::cuDevicePrimaryCtxRetain(&mut primary, 0), "retain");
        let mut whole: sys::CUdevResource = std::mem::zeroed();
        ck(
            sys::cuDeviceGetDevResource(
                0,
                &mut whole,
                sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            ),
            "resource",
        );
        let mut n = 1u32;
        let mut group: sys::CUdevResource = std::mem::zeroed();
        let mut rest: sys::CUdevResource = std::mem::zeroed();
        ck(
            sys::cuDevSmResourceSplitByCount(&mut group, &mut n, &whole, &mut rest, 0, sms),
            "split",
        );
        let got = group.__bindgen_anon_1.sm.smCount;
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        ck(
            sys::cuDevResourceGenerateDesc(&mut desc, &mut group, 1),
            "desc",
        );
        let mut g: sys::CUgreenCtx = std::ptr::null_mut();
        ck(
            sys::cuGreenCtxCreate(
                &mut g,
                desc,
                0,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            ),
            "green ctx",
        );
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        ck(sys::cuCtxFromGreenCtx(&mut ctx, g), "ctx");
        ck(sys::cuCtxPushCurrent_v2(ctx), "push");
        let mut stream: sys::CUstream = std::ptr::null_mut();
        ck(
            sys::cuGreenCtxStreamCreate(
                &mut stream,
                g,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                0,
            ),
            "stream",
        );
        let bytes = 4 * S as usize * S as usize;
        let (mut a, mut b, mut c) = (0, 0, 0);
        for p in [&mut a, &mut b, &mut c] {
            ck(sys::cuMemAlloc_v2(p, bytes), "alloc");
        }
        ck(
            sys::cuMemsetD32_v2(a, 1.0f32.to_bits(), bytes / 4),
            "memset",
        );
        ck(
            sys::cuMemsetD32_v2(b, 0.5f32.to_bits(), bytes / 4),
            "memset",
        );
        let func = NativeFunction::load(ptx, "sgemm_f32");
        let (mut m, mut n, mut k) = (S, S, S);
        let (mut alpha, mut beta) = (1.0f32, 0.0f32);
        let mut args: [*mut c_void; 8] = [
            (&mut c as *mut u64).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut m as *mut u32).cast(),
            (&mut n as *mut u32).cast(),
            (&mut k as *mut u32).cast(),
            (&mut alpha as *mut f32).cast(),
            (&mut beta as *mut f32).cast(),
        ];
        let tiles = S.div_ceil(128);
        let mut wall = time(5, || {
            func.run([tiles, tiles, 1], [256, 1, 1], stream, args.as_mut_ptr())
        });
        drop(func);
        for p in [a, b, c] {
            ck(sys::cuMemFree_v2(p), "free");
        }
        ck(sys::cuStreamDestroy_v2(stream), "stream destroy");
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        ck(sys::cuCtxPopCurrent_v2(&mut popped), "pop");
        ck(sys::cuGreenCtxDestroy(g), "green destroy");
        ck(sys::cuDevicePrimaryCtxRelease_v2(0), "release");
        (got, median(&mut wall))
    }
}

fn tflops(t: Duration) -> f64 {
    2.0 * f64::from(S).powi(3) / t.as_secs_f64() / 1e12
}

fn sgemms() {
    let spatial = CudaBackend::new(0, Mode::Spatial).unwrap();
    let g = spatial.sm_granule();
    let half = spatial.device_sms() / 2 / g * g;
    let ptx = spatial.builtin_ptx().to_vec();
    let (wall, dev) = {
        let mut p = spatial
            .create_cuda_partition(&PartitionSpec {
                name: "half".into(),
                memory: 1 << 30,
                compute_units: half,
            })
            .unwrap();
        partition_sgemm(&mut p)
    };
    drop(spatial);
    let (got, native) = native_green_sgemm(&ptx, half);
    let iso = CudaBackend::new(0, Mode::Isolated).unwrap();
    let (whole_wall, whole_dev) = {
        let mut p = iso
            .create_cuda_partition(&PartitionSpec {
                name: "whole".into(),
                memory: 1 << 30,
                compute_units: 1,
            })
            .unwrap();
        partition_sgemm(&mut p)
    };
    println!(
        "| sgemm {S}^3 fp32 (built-in kernel, median of 5) | wall | device time | TFLOP/s (wall) |"
    );
    println!("|---|---|---|---|");
    let ms = |t: Duration| format!("{:.2} ms", t.as_secs_f64() * 1e3);
    println!(
        "| spatial partition, {half} SMs | {} | {} | {:.1} |",
        ms(wall),
        ms(dev),
        tflops(wall)
    );
    println!(
        "| native green context, {got} SMs | {} | – | {:.1} |",
        ms(native),
        tflops(native)
    );
    println!(
        "| isolated partition, all {} SMs | {} | {} | {:.1} |",
        iso.device_sms(),
        ms(whole_wall),
        ms(whole_dev),
        tflops(whole_wall)
    );
}

/// A loop of sgemm commands of `dim`^3 on a partition, each admitted by
/// the scheduler as vgpud's gate admits a command (when given); counts
/// commands and device time until `stop`.
struct Tenant {
    done: u64,
    device: Duration,
}

fn sgemm_loop(
    p: &Mutex<CudaPartition>,
    dim: u32,
    gate: Option<&SchedGate>,
    stop: &AtomicBool,
    start: &Barrier,
) -> Tenant {
    let bytes = 4 * u64::from(dim) * u64::from(dim);
    let (a, b, c) = {
        let mut p = p.lock().unwrap();
        let (a, b, c) = (
            p.alloc(bytes, 0).unwrap(),
            p.alloc(bytes, 0).unwrap(),
            p.alloc(bytes, 0).unwrap(),
        );
        p.fill(a, bytes, 1.0f32.to_bits()).unwrap();
        p.fill(b, bytes, 0.5f32.to_bits()).unwrap();
        (a, b, c)
    };
    let mut params = sgemm_params(c, a, b);
    (params.m, params.n, params.k) = (dim, dim, dim);
    let l = builtin_launch("sgemm_f32", params.as_slice());
    p.lock().unwrap().launch(&l).unwrap();
    start.wait();
    let mut t = Tenant {
        done: 0,
        device: Duration::ZERO,
    };
    // As a vGPU's worker: through vgpud's own gate, which keeps the GPU
    // for a turn of consecutive commands.
    let cancelled = || stop.load(Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        if gate.is_some_and(|g| !g.enter(&cancelled)) {
            break;
        }
        let d = {
            let mut p = p.lock().unwrap();
            p.launch(&l).unwrap();
            p.last_device_time().unwrap()
        };
        if let Some(g) = gate {
            g.leave(d, 0);
        }
        t.done += 1;
        t.device += d;
    }
    if let Some(g) = gate {
        g.idle();
    }
    let mut p = p.lock().unwrap();
    for x in [a, b, c] {
        p.free(x).unwrap();
    }
    t
}

/// Runs one sgemm loop per entry of `parts` (the same partition may be
/// given twice) for `secs`, concurrently; returns each tenant's count and
/// the wall time.
fn run_tenants(
    parts: &[&Mutex<CudaPartition>],
    dim: u32,
    sched: Option<Sched>,
    secs: f64,
) -> (Vec<Tenant>, Duration) {
    let gates: Vec<SchedGate> = sched.map_or_else(Vec::new, |sc| {
        let mut config = SchedConfig::new(sc.policy);
        config.turn = sc.turn;
        let s = Scheduler::new(config).unwrap();
        (1..=parts.len() as u32)
            .map(|i| {
                s.add_tenant(TenantId(i), TenantParams::default()).unwrap();
                SchedGate::new(s.clone(), TenantId(i))
            })
            .collect()
    });
    let stop = AtomicBool::new(false);
    let start = Barrier::new(parts.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let gate = gates.get(i);
                let (stop, start) = (&stop, &start);
                s.spawn(move || sgemm_loop(p, dim, gate, stop, start))
            })
            .collect();
        start.wait();
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let tenants = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (tenants, t.elapsed())
    })
}

/// A scheduler as vgpud builds one: a policy, and turns of consecutive
/// commands (`slice_us`) under fair share and priority.
#[derive(Clone, Copy)]
struct Sched {
    policy: Policy,
    turn: Duration,
}

/// How long tenants run for one figure (a smoke run: briefly).
fn run_secs(bench: &Bench) -> f64 {
    if bench.smoke() {
        0.1
    } else {
        2.0
    }
}

fn policy_name(s: Sched) -> String {
    match s.policy {
        Policy::FairShare => format!(
            "fair share (vgpud's default), {} ms turns",
            s.turn.as_millis()
        ),
        Policy::RoundRobin { slice } => format!("round robin, {} ms slices", slice.as_millis()),
        other => format!("{other:?}"),
    }
}

fn rate(t: &Tenant, wall: Duration) -> f64 {
    t.done as f64 / wall.as_secs_f64()
}

/// Two isolated tenants time-sliced by the host scheduler vs one alone,
/// and a victim next to a saturating neighbour in both modes.
fn sharing(bench: &Bench) {
    let run = run_secs(bench);
    let part = |b: &CudaBackend, name: &str, cu: u32| {
        Mutex::new(
            b.create_cuda_partition(&PartitionSpec {
                name: name.into(),
                memory: 1 << 30,
                compute_units: cu,
            })
            .unwrap(),
        )
    };
    let iso = CudaBackend::new(0, Mode::Isolated).unwrap();
    let a = part(&iso, "tenant-a", 1);
    let b = part(&iso, "tenant-b", 1);
    println!("| isolated tenants saturating, host scheduler | sgemm | commands/s, one tenant alone | commands/s, two tenants (a + b) | aggregate vs alone | GPU time lost | device busy, two tenants |");
    println!("|---|---|---|---|---|---|---|");
    let fair = |ms| Sched {
        policy: Policy::FairShare,
        turn: Duration::from_millis(ms),
    };
    let rr = |ms| Sched {
        policy: Policy::RoundRobin {
            slice: Duration::from_millis(ms),
        },
        turn: Duration::from_millis(ms),
    };
    let rows: [(u32, Sched, bool); 8] = [
        (4096, fair(2), false),
        (1024, fair(2), false),
        (1024, fair(2), true),
        (1024, fair(8), false),
        (4096, fair(8), false),
        (1024, rr(2), false),
        (1024, rr(8), false),
        (4096, rr(8), false),
    ];
    for (dim, policy, same) in rows {
        let (alone, w1) = run_tenants(&[&a], dim, Some(policy), run);
        let pair: [&Mutex<CudaPartition>; 2] = if same { [&a, &a] } else { [&a, &b] };
        let (two, w2) = run_tenants(&pair, dim, Some(policy), run);
        let r1 = rate(&alone[0], w1);
        let (ra, rb) = (rate(&two[0], w2), rate(&two[1], w2));
        let busy = (two[0].device + two[1].device).as_secs_f64() / w2.as_secs_f64();
        let what = if same {
            format!(
                "{}; control: both tenants in one context",
                policy_name(policy)
            )
        } else {
            format!("{}, own contexts", policy_name(policy))
        };
        let r = bench.ratio(
            &format!("{what}, {dim}^3, aggregate vs alone"),
            ra + rb,
            r1,
            Target::Reference,
        );
        println!(
            "| {what} | {dim}^3 | {r1:.1} | {:.1} ({ra:.1} + {rb:.1}) | {:.1}% {} | {:.1}% | {:.1}% |",
            ra + rb,
            r.percent(),
            r.verdict,
            100.0 * (1.0 - r.value),
            100.0 * busy
        );
    }
    // A victim next to a neighbour saturating its own partition.
    let mut victims = Vec::new();
    for policy in [fair(8), rr(8)] {
        let (alone, w1) = run_tenants(&[&a], 4096, Some(policy), run);
        let (both, w2) = run_tenants(&[&a, &b], 4096, Some(policy), run);
        victims.push((
            format!(
                "isolated: whole GPU each, host scheduler ({}, equal weights)",
                policy_name(policy)
            ),
            rate(&alone[0], w1),
            rate(&both[0], w2),
            rate(&both[1], w2),
        ));
    }
    drop((a, b));
    drop(iso);

    let sp = CudaBackend::new(0, Mode::Spatial).unwrap();
    let g = sp.sm_granule();
    let total = sp.capacity().compute_units;
    let half = total / 2 / g * g;
    let victim = part(&sp, "victim", half);
    let neighbour = part(&sp, "neighbour", total - half);
    let (alone, w1) = run_tenants(&[&victim], 4096, None, run);
    let (both, w2) = run_tenants(&[&victim, &neighbour], 4096, None, run);
    victims.insert(
        0,
        (
            format!(
                "spatial: victim {half} SMs, neighbour {} SMs, concurrent, no scheduler",
                total - half
            ),
            rate(&alone[0], w1),
            rate(&both[0], w2),
            rate(&both[1], w2),
        ),
    );
    println!();
    println!("| victim sgemm 4096^3, neighbour saturating its partition with the same | victim alone (cmd/s) | victim with neighbour (cmd/s) | neighbour (cmd/s) | victim with / alone |");
    println!("|---|---|---|---|---|");
    for (what, alone, with, other) in victims {
        let r = bench.ratio(
            &format!("{what}, victim with / alone"),
            with,
            alone,
            Target::Reference,
        );
        println!(
            "| {what} | {alone:.1} | {with:.1} | {other:.1} | {:.1}% {} |",
            r.percent(),
            r.verdict
        );
    }
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let Some(b) = common::cuda_backend() else {
        return bench.finish();
    };
    println!(
        "{} ({} SMs, {} GiB)\n",
        b.device_name(),
        b.device_sms(),
        b.capacity().memory >> 30
    );
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if run("copies") {
        copies(&bench, &b);
        println!();
    }
    if run("launches") {
        launches(&bench, &b);
        println!();
    }
    drop(b);
    if run("sgemm") {
        sgemms();
        println!();
    }
    if run("sharing") {
        sharing(&bench);
    }
    bench.finish()
}
