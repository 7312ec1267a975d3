//! Fixtures of the CUDA bench, shared with vgpu-partition-host's remote
//! bench (which includes this file): timing, COPY commands of a polling
//! guest, and the native driver calls both compare their paths with.

use std::ffi::{c_void, CString};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vgpu_abi::{self as abi, ByteValued, SgEntry};
use vgpu_backend::Launch;
use vgpu_backend_cuda::{cuda_available, CudaBackend, Mode};
use vgpu_testkit::{Chain, Guest};

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

pub fn ck(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// The `p` percentile (0..=1) of `v`, nearest rank.
pub fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `reps` timed runs of `f`, after one to warm up.
pub fn time<F: FnMut()>(reps: usize, mut f: F) -> Vec<Duration> {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

/// Median time of `f` over `reps` runs, after one to warm up.
pub fn median_of(reps: usize, f: impl FnMut()) -> Duration {
    pct(&mut time(reps, f), 0.5)
}

/// Prints a table row `| name | p50 | p<hi> |` for each of `rows`, in
/// `unit` ("µs" or "ms").
pub fn print_percentiles(rows: &mut [(&str, &mut Vec<Duration>)], hi: f64, unit: &str) {
    let scale = if unit == "ms" { 1e3 } else { 1e6 };
    for (name, v) in rows {
        println!(
            "| {name} | {:.1} {unit} | {:.1} {unit} |",
            pct(v, 0.5).as_secs_f64() * scale,
            pct(v, hi).as_secs_f64() * scale
        );
    }
}

/// Runs worth timing for a copy of `size` bytes.
pub fn copy_reps(size: usize) -> usize {
    (1024 * MIB / size).clamp(5, 100)
}

pub fn size_name(s: usize) -> String {
    if s >= MIB {
        format!("{} MiB", s / MIB)
    } else {
        format!("{} KiB", s / KIB)
    }
}

/// A table cell for `size` bytes moved in `t`: time and rate.
pub fn copy_cell(size: usize, t: Duration) -> String {
    format!(
        "{:.1} µs, {:.1} GB/s",
        t.as_secs_f64() * 1e6,
        size as f64 / t.as_secs_f64() / 1e9
    )
}

/// The CUDA backend of device 0 in isolated mode, or `None` (having said
/// why the bench skips) without a driver or a usable device.
pub fn cuda_backend() -> Option<CudaBackend> {
    if let Err(why) = cuda_available() {
        println!("skipped: no CUDA driver ({why})");
        return None;
    }
    match CudaBackend::new(0, Mode::Isolated) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("skipped: no usable CUDA device ({e})");
            None
        }
    }
}

/// The `nop` entry of the built-in module's PTX, loaded as `module`: an
/// empty kernel on one thread.
pub fn nop(module: u64) -> Launch<'static> {
    Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module,
        entry: "nop",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: &[],
    }
}

/// One COPY between guest memory `sg` and device address `dev`, submitted
/// on polled queue 0 and waited for by spinning on the used ring, as a
/// polling guest driver does.
pub fn guest_copy(g: &mut Guest, to_device: bool, dev: u64, sg: &[SgEntry]) {
    let (src_kind, dst_kind, src, dst) = if to_device {
        (abi::COPY_GUEST, abi::COPY_DEVICE, 0, dev)
    } else {
        (abi::COPY_DEVICE, abi::COPY_GUEST, dev, 0)
    };
    let cmd = abi::CopyCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_COPY,
            flags: 0,
        },
        src_kind,
        dst_kind,
        src,
        dst,
        size: sg.iter().map(|e| e.len).sum(),
        sg_count: sg.len() as u32,
        reserved: 0,
    };
    let list: Vec<u8> = sg.iter().flat_map(|e| e.as_slice().to_vec()).collect();
    g.post(0, &Chain::command(&cmd).bytes(&list).completion());
    g.kick(0);
    let used = loop {
        if let Some(u) = g.poll_used(0) {
            break u;
        }
        std::hint::spin_loop();
    };
    assert_eq!(used.completion().status, abi::STATUS_OK);
}

/// The native side: device 0's primary context, current on this thread
/// while this lives, and one non-blocking stream in it.
pub struct Native {
    pub stream: sys::CUstream,
}

impl Native {
    pub fn new() -> Native {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: plain driver setup with valid out pointers; device 0
        // exists (the caller's backend opened it).
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
        Native { stream }
    }

    /// Waits for the stream.
    pub fn sync(&self) {
        // SAFETY: the live stream made in `new`.
        ck(unsafe { sys::cuStreamSynchronize(self.stream) }, "sync");
    }
}

impl Drop for Native {
    fn drop(&mut self) {
        // SAFETY: destroys what `new` made, once, with the context still
        // current (what was made in it is borrowed from it, so gone).
        unsafe {
            ck(sys::cuStreamDestroy_v2(self.stream), "stream destroy");
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            ck(sys::cuCtxPopCurrent_v2(&mut popped), "pop");
            ck(sys::cuDevicePrimaryCtxRelease_v2(0), "release");
        }
    }
}

/// `len` bytes of device memory and of pinned host memory in a [`Native`]
/// context, for native copies.
pub struct NativeBuffers<'a> {
    native: &'a Native,
    dptr: sys::CUdeviceptr,
    pinned: *mut c_void,
    len: usize,
}

impl<'a> NativeBuffers<'a> {
    pub fn new(native: &'a Native, len: usize) -> NativeBuffers<'a> {
        let mut dptr: sys::CUdeviceptr = 0;
        let mut pinned: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointers; `native`'s context is current.
        unsafe {
            ck(sys::cuMemAlloc_v2(&mut dptr, len), "alloc");
            ck(sys::cuMemAllocHost_v2(&mut pinned, len), "alloc host");
        }
        NativeBuffers {
            native,
            dptr,
            pinned,
            len,
        }
    }

    /// Copies `size` bytes from pinned memory to the device or back, and
    /// waits for the copy.
    pub fn copy(&self, to_device: bool, size: usize) {
        assert!(size <= self.len);
        let stream = self.native.stream;
        // SAFETY: both buffers hold `len >= size` bytes; the copy is
        // waited for before either can be freed.
        unsafe {
            if to_device {
                ck(
                    sys::cuMemcpyHtoDAsync_v2(self.dptr, self.pinned, size, stream),
                    "htod",
                );
            } else {
                ck(
                    sys::cuMemcpyDtoHAsync_v2(self.pinned, self.dptr, size, stream),
                    "dtoh",
                );
            }
        }
        self.native.sync();
    }
}

impl Drop for NativeBuffers<'_> {
    fn drop(&mut self) {
        // SAFETY: frees what `new` made, once, with its context current.
        unsafe {
            ck(sys::cuMemFreeHost(self.pinned), "free host");
            ck(sys::cuMemFree_v2(self.dptr), "free");
        }
    }
}

/// A function of a module loaded into the current context; the module is
/// unloaded on drop, which must come while that context is current.
pub struct NativeFunction {
    module: sys::CUmodule,
    f: sys::CUfunction,
}

impl NativeFunction {
    /// Function `name` of `ptx` (NUL-terminated PTX).
    pub fn load(ptx: &[u8], name: &str) -> NativeFunction {
        assert_eq!(ptx.last(), Some(&0), "PTX must be NUL-terminated");
        let mut module: sys::CUmodule = std::ptr::null_mut();
        let mut f: sys::CUfunction = std::ptr::null_mut();
        let cname = CString::new(name).unwrap();
        // SAFETY: `ptx` is NUL-terminated (checked); valid out pointers;
        // a context is current.
        unsafe {
            ck(
                sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()),
                "load",
            );
            ck(
                sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()),
                "function",
            );
        }
        NativeFunction { module, f }
    }

    /// Launches it on `stream` and waits for it.
    ///
    /// # Safety
    /// `args` is what `cuLaunchKernel` takes for this function's
    /// parameters (null for none), pointing at live values; `stream` is a
    /// live stream of the module's context.
    pub unsafe fn run(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        stream: sys::CUstream,
        args: *mut *mut c_void,
    ) {
        // SAFETY: as the caller promises.
        unsafe {
            ck(
                sys::cuLaunchKernel(
                    self.f,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    0,
                    stream,
                    args,
                    std::ptr::null_mut(),
                ),
                "launch",
            );
            ck(sys::cuStreamSynchronize(stream), "sync");
        }
    }
}

impl Drop for NativeFunction {
    fn drop(&mut self) {
        // SAFETY: the module `load` made, unloaded once, with its context
        // current (the owner's duty, see the type).
        unsafe { ck(sys::cuModuleUnload(self.module), "unload") };
    }
}
