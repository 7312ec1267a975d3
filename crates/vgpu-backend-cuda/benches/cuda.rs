//! Partition paths against the same work done directly with the driver
//! API: uploads and downloads, an empty kernel's launch and wait, and
//! sgemm on half the SMs. Prints markdown tables; prints
//! "skipped: no CUDA driver" and exits 0 without CUDA.
//!
//! `cargo bench -p vgpu-backend-cuda --bench cuda`

use std::ffi::{c_void, CString};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::{Backend, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec};
use vgpu_backend_cuda::{cuda_available, CudaBackend, CudaPartition, Mode};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn ck(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

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
    v.sort();
    v[v.len() / 2]
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn time<F: FnMut()>(reps: usize, mut f: F) -> Vec<Duration> {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn size_name(s: usize) -> String {
    if s >= MIB {
        format!("{} MiB", s / MIB)
    } else {
        format!("{} KiB", s / KIB)
    }
}

/// Host <-> device copies: partition vs cuMemcpy from pinned memory.
fn copies(b: &CudaBackend) {
    let sizes = [64 * KIB, MIB, 16 * MIB, 256 * MIB];
    let max = sizes[sizes.len() - 1];
    let mut p = b
        .create_cuda_partition(&PartitionSpec {
            name: "bench".into(),
            memory: 2 * max as u64,
            compute_units: 1,
        })
        .unwrap();
    let dev = p.alloc(max as u64, 0).unwrap();
    let host = HostBuf::new(max);

    // The native side: the primary context, pinned memory, one stream.
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut dptr: sys::CUdeviceptr = 0;
    let mut pinned: *mut c_void = std::ptr::null_mut();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: plain driver setup with valid out pointers; device 0 exists
    // (the backend opened it).
    unsafe {
        ck(sys::cuDevicePrimaryCtxRetain(&mut ctx, 0), "retain");
        ck(sys::cuCtxPushCurrent_v2(ctx), "push");
        ck(sys::cuMemAlloc_v2(&mut dptr, max), "alloc");
        ck(sys::cuMemAllocHost_v2(&mut pinned, max), "alloc host");
        ck(
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "stream",
        );
    }
    println!(
        "| size | partition upload | native HtoD (pinned) | partition download | native DtoH (pinned) | host memcpy to pinned |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in &sizes {
        let reps = (512 * MIB / size).clamp(5, 200);
        let w = Window {
            buf: &host,
            len: size,
        };
        let mut up = time(reps, || p.upload(dev, &w).unwrap());
        let mut down = time(reps, || p.download(dev, &w).unwrap());
        // SAFETY: `pinned` and `dptr` hold `max >= size` bytes; each copy
        // is waited for before the next.
        let mut htod = time(reps, || unsafe {
            ck(
                sys::cuMemcpyHtoDAsync_v2(dptr, pinned, size, stream),
                "htod",
            );
            ck(sys::cuStreamSynchronize(stream), "sync");
        });
        // SAFETY: as above.
        let mut dtoh = time(reps, || unsafe {
            ck(
                sys::cuMemcpyDtoHAsync_v2(pinned, dptr, size, stream),
                "dtoh",
            );
            ck(sys::cuStreamSynchronize(stream), "sync");
        });
        // SAFETY: both buffers hold `max >= size` bytes and do not overlap.
        let mut memcpy = time(reps, || unsafe {
            std::ptr::copy_nonoverlapping(host.ptr, pinned.cast::<u8>(), size)
        });
        let cell = |v: &mut Vec<Duration>| {
            let t = median(v);
            format!("{:.1} µs, {:.1} GB/s", t.as_secs_f64() * 1e6, gbps(size, t))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            size_name(size),
            cell(&mut up),
            cell(&mut htod),
            cell(&mut down),
            cell(&mut dtoh),
            cell(&mut memcpy)
        );
    }
    // SAFETY: frees what was made above, once, with the context current.
    unsafe {
        ck(sys::cuStreamDestroy_v2(stream), "stream destroy");
        ck(sys::cuMemFreeHost(pinned), "free host");
        ck(sys::cuMemFree_v2(dptr), "free");
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        ck(sys::cuCtxPopCurrent_v2(&mut popped), "pop");
        ck(sys::cuDevicePrimaryCtxRelease_v2(0), "release");
    }
}

/// A function of the built-in module loaded into the current context.
fn builtin_function(ptx: &[u8], name: &str) -> (sys::CUmodule, sys::CUfunction) {
    let mut m: sys::CUmodule = std::ptr::null_mut();
    let mut f: sys::CUfunction = std::ptr::null_mut();
    let cname = CString::new(name).unwrap();
    // SAFETY: `ptx` is NUL-terminated PTX; valid out pointers; a context
    // is current.
    unsafe {
        ck(sys::cuModuleLoadData(&mut m, ptx.as_ptr().cast()), "load");
        ck(
            sys::cuModuleGetFunction(&mut f, m, cname.as_ptr()),
            "function",
        );
    }
    (m, f)
}

/// An empty kernel: launch + wait, through the partition and directly.
fn launches(b: &CudaBackend) {
    let reps = 5000;
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
    let nop = Launch {
        module: m,
        entry: "nop",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: &[],
    };
    let mut part = time(reps, || p.launch(&nop).unwrap());
    let word = p.alloc(4, 0).unwrap();
    let fill = abi::FillParams {
        dst: word,
        count: 1,
        value: 1,
        reserved: 0,
    };
    let fill = Launch {
        module: abi::MODULE_BUILTIN,
        entry: "fill_u32",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: fill.as_slice(),
    };
    let mut builtin = time(reps, || p.launch(&fill).unwrap());

    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: driver setup with valid out pointers.
    unsafe {
        ck(sys::cuDevicePrimaryCtxRetain(&mut ctx, 0), "retain");
        ck(sys::cuCtxPushCurrent_v2(ctx), "push");
        ck(
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "stream",
        );
    }
    let (module, f) = builtin_function(b.builtin_ptx(), "nop");
    // SAFETY: `nop` takes no parameters.
    let mut native = time(reps, || unsafe {
        ck(
            sys::cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
            "launch",
        );
        ck(sys::cuStreamSynchronize(stream), "sync");
    });
    // SAFETY: frees what was made above, once.
    unsafe {
        ck(sys::cuModuleUnload(module), "unload");
        ck(sys::cuStreamDestroy_v2(stream), "stream destroy");
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        ck(sys::cuCtxPopCurrent_v2(&mut popped), "pop");
        ck(sys::cuDevicePrimaryCtxRelease_v2(0), "release");
    }
    println!("| empty kernel, launch + wait ({reps} runs) | p50 | p99 |");
    println!("|---|---|---|");
    for (name, v) in [
        ("partition, loaded PTX `nop`", &mut part),
        ("partition, built-in `fill_u32` of 1 word", &mut builtin),
        ("native cuLaunchKernel + cuStreamSynchronize", &mut native),
    ] {
        println!(
            "| {name} | {:.1} µs | {:.1} µs |",
            pct(v, 0.5).as_secs_f64() * 1e6,
            pct(v, 0.99).as_secs_f64() * 1e6
        );
    }
}

const S: u32 = 4096;

fn sgemm_params(c: u64, a: u64, b: u64) -> abi::SgemmParams {
    abi::SgemmParams {
        c,
        a,
        b,
        m: S,
        n: S,
        k: S,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    }
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
    let l = Launch {
        module: abi::MODULE_BUILTIN,
        entry: "sgemm_f32",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: params.as_slice(),
    };
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
        let (module, f) = builtin_function(ptx, "sgemm_f32");
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
            ck(
                sys::cuLaunchKernel(
                    f,
                    tiles,
                    tiles,
                    1,
                    256,
                    1,
                    1,
                    0,
                    stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                "launch",
            );
            ck(sys::cuStreamSynchronize(stream), "sync");
        });
        ck(sys::cuModuleUnload(module), "unload");
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

fn main() {
    if let Err(why) = cuda_available() {
        println!("skipped: no CUDA driver ({why})");
        return;
    }
    let b = match CudaBackend::new(0, Mode::Isolated) {
        Ok(b) => b,
        Err(e) => {
            println!("skipped: no usable CUDA device ({e})");
            return;
        }
    };
    println!(
        "{} ({} SMs, {} GiB)\n",
        b.device_name(),
        b.device_sms(),
        b.capacity().memory >> 30
    );
    copies(&b);
    println!();
    launches(&b);
    println!();
    drop(b);
    sgemms();
}
