//! A partition of a [`CudaBackend`](crate::CudaBackend): a context (or
//! green context), its stream, staging buffers, the built-in module, the
//! guest's modules and its allocation table.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CString};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;
use log::{debug, info, warn};
use vgpu_abi as abi;
use vgpu_backend::rules::{
    self, align_up, words, Allocations, Builtin, FloatOperands, KernelLimits, DEFAULT_ALIGN,
};
use vgpu_backend::{
    BackendError, HostMemory, HostSink, HostSlice, HostSource, Launch, OpError, Partition,
    PartitionSpec,
};

use crate::driver::{self, CuError, Current};
use crate::hostmem::HostRegistry;
use crate::kernels::{self, BLOCK, REDUCE_BLOCKS, SGEMM_MAX_GRID_Y, SGEMM_TILE};
use crate::{lock, Mode, Shared};

/// Bytes of each of the two pinned staging buffers (the chunk of an
/// upload or download).
pub const STAGING_BYTES: usize = 8 << 20;
/// Bytes of the device scratch buffer (overlapping copies, reduction
/// partial sums).
pub const SCRATCH_BYTES: usize = 8 << 20;
/// Most modules one partition may have loaded.
pub const MAX_MODULES: usize = 64;
/// Smallest average piece of a guest transfer copied straight from or to
/// registered guest memory; a list of smaller pieces costs more in copy
/// calls than the staging path's host copy.
pub const DIRECT_MIN_SLICE: usize = 16 << 10;
/// Blocks per SM of the element-wise kernels' grids.
const BLOCKS_PER_SM: u64 = 8;

/// The built-in kernels, indices into [`kernels::NAMES`].
#[derive(Debug, Clone, Copy)]
enum K {
    FillU32 = 0,
    FillPatternU8,
    CopyBytes,
    CopyU128,
    Vadd,
    Saxpy,
    Sgemm,
    Scale,
    ReducePartial,
    ReduceFinal,
}

/// Why an operation failed, before it becomes an [`OpError`].
enum Fail {
    /// Already the answer.
    Op(OpError),
    /// A driver call failed.
    Cuda(String, CuError),
    /// The driver refused what the guest asked for (a loaded kernel's
    /// launch shape or resources): `Invalid` unless the error is sticky.
    Refused(String, CuError),
}

impl From<OpError> for Fail {
    fn from(e: OpError) -> Fail {
        Fail::Op(e)
    }
}

trait At<T> {
    /// Names the driver call that failed.
    fn at(self, what: &str) -> Result<T, Fail>;
}

impl<T> At<T> for Result<T, CuError> {
    fn at(self, what: &str) -> Result<T, Fail> {
        self.map_err(|e| Fail::Cuda(what.to_string(), e))
    }
}

fn describe(f: &Fail) -> String {
    match f {
        Fail::Op(e) => e.to_string(),
        Fail::Cuda(what, e) | Fail::Refused(what, e) => format!("{what}: {e}"),
    }
}

/// A pointer to a kernel argument, as cuLaunchKernel wants it.
fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// Who owns the context.
enum Owner {
    /// Created by cuCtxCreate; destroyed with cuCtxDestroy.
    Own,
    /// A green context of the primary context.
    Green(sys::CUgreenCtx),
}

/// A loaded guest module and the kernels looked up in it so far.
struct Module {
    module: sys::CUmodule,
    kernels: HashMap<String, (sys::CUfunction, KernelLimits)>,
}

/// Device temporaries freed on drop (with the context current, after the
/// work using them completed).
struct Temps(Vec<u64>);

impl Temps {
    fn alloc(&mut self, bytes: u64, available: u64) -> Result<u64, Fail> {
        let no_memory = || {
            Fail::Op(OpError::NoMemory {
                requested: bytes,
                available,
            })
        };
        let size = usize::try_from(bytes.max(1)).map_err(|_| no_memory())?;
        match driver::mem_alloc(size) {
            Ok(p) => {
                self.0.push(p);
                Ok(p)
            }
            Err(e) if e.is_out_of_memory() => Err(no_memory()),
            Err(e) => Err(Fail::Cuda("allocating a temporary".into(), e)),
        }
    }
}

impl Drop for Temps {
    fn drop(&mut self) {
        for &p in &self.0 {
            let _ = driver::mem_free(p);
        }
    }
}

/// What a partition holds on the device. Dropping it destroys the
/// context and everything in it.
struct DeviceState {
    ctx: sys::CUcontext,
    owner: Owner,
    stream: sys::CUstream,
    start: sys::CUevent,
    end: sys::CUevent,
    staged: [sys::CUevent; 2],
    staging: [*mut u8; 2],
    scratch: sys::CUdeviceptr,
    builtin: sys::CUmodule,
    funcs: [sys::CUfunction; kernels::NAMES.len()],
    modules: BTreeMap<u64, Module>,
    next_module: u64,
    /// SMs the partition's kernels run on (for grid sizes).
    sms: u32,
}

impl DeviceState {
    /// A new context (isolated) or green context (spatial) with its
    /// stream, events, buffers and the built-in module.
    fn create(shared: &Shared, desc: sys::CUdevResourceDesc, sms: u32) -> Result<Self, Fail> {
        let (ctx, owner) = match shared.mode {
            Mode::Isolated => {
                let mut params = sys::CUctxCreateParams {
                    execAffinityParams: std::ptr::null_mut(),
                    numExecAffinityParams: 0,
                    cigParams: std::ptr::null_mut(),
                };
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out pointer and a params struct asking for
                // nothing special; `device` came from cuDeviceGet.
                driver::ok(unsafe { sys::cuCtxCreate_v4(&mut ctx, &mut params, 0, shared.device) })
                    .at("creating a context")?;
                // cuCtxCreate leaves the new context current: take it off
                // this thread's stack (ops push it when they need it).
                let mut popped: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: pops the context just pushed by cuCtxCreate.
                let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
                (ctx, Owner::Own)
            }
            Mode::Spatial => {
                let mut g: sys::CUgreenCtx = std::ptr::null_mut();
                // SAFETY: `desc` was generated from SM groups of this
                // device; valid out pointer; DEFAULT_STREAM is the flag
                // the API requires.
                driver::ok(unsafe {
                    sys::cuGreenCtxCreate(
                        &mut g,
                        desc,
                        shared.device,
                        sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
                    )
                })
                .at("creating a green context")?;
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: `g` is the live green context just created.
                if let Err(e) = driver::ok(unsafe { sys::cuCtxFromGreenCtx(&mut ctx, g) }) {
                    // SAFETY: destroys what was created above, once.
                    let _ = unsafe { sys::cuGreenCtxDestroy(g) };
                    return Err(Fail::Cuda("context of the green context".into(), e));
                }
                (ctx, Owner::Green(g))
            }
        };
        let mut st = DeviceState {
            ctx,
            owner,
            stream: std::ptr::null_mut(),
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            staged: [std::ptr::null_mut(); 2],
            staging: [std::ptr::null_mut(); 2],
            scratch: 0,
            builtin: std::ptr::null_mut(),
            funcs: [std::ptr::null_mut(); kernels::NAMES.len()],
            modules: BTreeMap::new(),
            next_module: abi::MODULE_BUILTIN + 1,
            sms: sms.max(1),
        };
        // On failure `st` is dropped, which releases what was made.
        let cur = Current::push(ctx).at("making the context current")?;
        st.init(shared)?;
        drop(cur);
        Ok(st)
    }

    fn init(&mut self, shared: &Shared) -> Result<(), Fail> {
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let mut s: sys::CUstream = std::ptr::null_mut();
        match self.owner {
            // SAFETY: valid out pointer; this context is current.
            Owner::Own => driver::ok(unsafe { sys::cuStreamCreate(&mut s, flags) }),
            Owner::Green(g) => {
                // SAFETY: `g` is this state's live green context; valid
                // out pointer; NON_BLOCKING is the flag the API requires.
                driver::ok(unsafe { sys::cuGreenCtxStreamCreate(&mut s, g, flags, 0) })
            }
        }
        .at("creating a stream")?;
        self.stream = s;
        self.start = driver::event_create(true).at("creating an event")?;
        self.end = driver::event_create(true).at("creating an event")?;
        for i in 0..2 {
            self.staged[i] = driver::event_create(false).at("creating an event")?;
            self.staging[i] =
                driver::mem_alloc_host(STAGING_BYTES).at("allocating pinned staging memory")?;
        }
        self.scratch = driver::mem_alloc(SCRATCH_BYTES).at("allocating the scratch buffer")?;
        self.builtin = driver::module_load_ptx(&shared.ptx)
            .map_err(|(e, log)| Fail::Cuda(format!("loading the built-in module ({log})"), e))?;
        for (i, name) in kernels::NAMES.iter().enumerate() {
            let cname = CString::new(*name).expect("kernel names have no NUL");
            self.funcs[i] = driver::module_function(self.builtin, &cname)
                .at("looking up a built-in kernel")?
                .ok_or_else(|| {
                    Fail::Op(OpError::Device(format!(
                        "built-in kernel {name} is missing"
                    )))
                })?;
        }
        Ok(())
    }

    /// Runs `f`'s device work between the timing events and waits for it;
    /// returns the time between the events. On failure the stream is
    /// drained too, so no buffer is still in use when this returns.
    fn timed(
        &self,
        what: &str,
        f: impl FnOnce(&Self) -> Result<(), Fail>,
    ) -> Result<Duration, Fail> {
        driver::event_record(self.start, self.stream).at(what)?;
        if let Err(e) = f(self) {
            let _ = driver::stream_sync(self.stream);
            return Err(e);
        }
        driver::event_record(self.end, self.stream).at(what)?;
        driver::event_sync(self.end).map_err(|e| Fail::Cuda(format!("{what}: device work"), e))?;
        driver::event_elapsed(self.start, self.end).at(what)
    }

    fn grid_for(&self, n: u64) -> u32 {
        n.div_ceil(u64::from(BLOCK))
            .clamp(1, u64::from(self.sms) * BLOCKS_PER_SM) as u32
    }

    /// Launches built-in kernel `k` on `grid` blocks of `BLOCK` threads.
    ///
    /// # Safety
    /// `args` must match `k`'s parameter list in [`kernels::SOURCE`], and
    /// every range the kernel touches must have been checked against the
    /// partition's allocations (or be its scratch buffer or temporaries).
    unsafe fn launch(&self, k: K, grid: [u32; 3], args: &mut [*mut c_void]) -> Result<(), Fail> {
        // SAFETY: forwarded to the caller.
        unsafe {
            driver::launch(
                self.funcs[k as usize],
                grid,
                [BLOCK, 1, 1],
                0,
                self.stream,
                args,
            )
        }
        .at(kernels::NAMES[k as usize])
    }

    fn k_fill_u32(&self, mut dst: u64, mut count: u64, mut value: u32) -> Result<(), Fail> {
        let grid = [self.grid_for(count), 1, 1];
        // SAFETY: fill_u32(u32*, u64, u32); `count` words at `dst` were
        // checked by the caller.
        unsafe {
            self.launch(
                K::FillU32,
                grid,
                &mut [arg(&mut dst), arg(&mut count), arg(&mut value)],
            )
        }
    }

    fn k_fill_pattern(&self, mut dst: u64, mut bytes: u64, mut pattern: u32) -> Result<(), Fail> {
        let grid = [self.grid_for(bytes), 1, 1];
        // SAFETY: fill_pattern_u8(u8*, u64, u32); `bytes` at `dst` checked.
        unsafe {
            self.launch(
                K::FillPatternU8,
                grid,
                &mut [arg(&mut dst), arg(&mut bytes), arg(&mut pattern)],
            )
        }
    }

    fn k_copy(&self, mut dst: u64, mut src: u64, bytes: u64) -> Result<(), Fail> {
        if (dst | src | bytes).is_multiple_of(16) {
            let mut count = bytes / 16;
            let grid = [self.grid_for(count), 1, 1];
            // SAFETY: copy_u128(uint4*, const uint4*, u64); both ranges
            // checked, 16-byte aligned, not overlapping.
            return unsafe {
                self.launch(
                    K::CopyU128,
                    grid,
                    &mut [arg(&mut dst), arg(&mut src), arg(&mut count)],
                )
            };
        }
        let mut bytes = bytes;
        let grid = [self.grid_for(bytes), 1, 1];
        // SAFETY: copy_bytes(u8*, const u8*, u64); both ranges checked,
        // not overlapping.
        unsafe {
            self.launch(
                K::CopyBytes,
                grid,
                &mut [arg(&mut dst), arg(&mut src), arg(&mut bytes)],
            )
        }
    }

    fn k_vadd(&self, mut c: u64, mut a: u64, mut b: u64, mut n: u64) -> Result<(), Fail> {
        let grid = [self.grid_for(n), 1, 1];
        // SAFETY: vadd_f32(float*, const float*, const float*, u64); `n`
        // floats at each checked (or a temporary of that size).
        unsafe {
            self.launch(
                K::Vadd,
                grid,
                &mut [arg(&mut c), arg(&mut a), arg(&mut b), arg(&mut n)],
            )
        }
    }

    fn k_saxpy(&self, mut y: u64, mut x: u64, mut n: u64, mut a: f32) -> Result<(), Fail> {
        let grid = [self.grid_for(n), 1, 1];
        // SAFETY: saxpy_f32(float*, const float*, u64, float); `n` floats
        // at each checked (or a temporary).
        unsafe {
            self.launch(
                K::Saxpy,
                grid,
                &mut [arg(&mut y), arg(&mut x), arg(&mut n), arg(&mut a)],
            )
        }
    }

    fn k_scale(&self, mut c: u64, mut count: u64, mut beta: f32) -> Result<(), Fail> {
        let grid = [self.grid_for(count), 1, 1];
        // SAFETY: scale_f32(float*, u64, float); `count` floats checked.
        unsafe {
            self.launch(
                K::Scale,
                grid,
                &mut [arg(&mut c), arg(&mut count), arg(&mut beta)],
            )
        }
    }

    fn k_sgemm(&self, p: abi::SgemmParams, a: u64, b: u64) -> Result<(), Fail> {
        let grid_x = p.n.div_ceil(SGEMM_TILE);
        let grid_y = p.m.div_ceil(SGEMM_TILE).min(SGEMM_MAX_GRID_Y);
        let (mut c, mut a, mut b) = (p.c, a, b);
        let (mut m, mut n, mut k) = (p.m, p.n, p.k);
        let (mut alpha, mut beta) = (p.alpha, p.beta);
        // SAFETY: sgemm_f32(float*, const float*, const float*, u32, u32,
        // u32, float, float); C (m x n), A (m x k) and B (k x n) checked
        // (A and B may be temporaries of those sizes); C overlaps neither.
        unsafe {
            self.launch(
                K::Sgemm,
                [grid_x, grid_y, 1],
                &mut [
                    arg(&mut c),
                    arg(&mut a),
                    arg(&mut b),
                    arg(&mut m),
                    arg(&mut n),
                    arg(&mut k),
                    arg(&mut alpha),
                    arg(&mut beta),
                ],
            )
        }
    }

    fn k_reduce(&self, mut out: u64, mut input: u64, mut n: u64) -> Result<(), Fail> {
        let blocks = self.grid_for(n).min(REDUCE_BLOCKS);
        let mut partials = self.scratch;
        // SAFETY: reduce_partial_f32(const float*, u64, double*); `n`
        // floats at `input` checked; `blocks` doubles fit the scratch.
        unsafe {
            self.launch(
                K::ReducePartial,
                [blocks, 1, 1],
                &mut [arg(&mut input), arg(&mut n), arg(&mut partials)],
            )
        }?;
        let mut count = blocks;
        // SAFETY: reduce_final_f32(const double*, u32, float*); reads the
        // partials just written, writes one checked float at `out`.
        unsafe {
            self.launch(
                K::ReduceFinal,
                [1, 1, 1],
                &mut [arg(&mut partials), arg(&mut count), arg(&mut out)],
            )
        }
    }

    /// `size` bytes from `src` to `dst` (checked ranges that may overlap).
    fn memmove(&self, dst: u64, src: u64, size: u64) -> Result<(), Fail> {
        if !rules::overlaps(dst, size, src, size) {
            return driver::memcpy_dtod_async(dst, src, size as usize, self.stream).at("copy");
        }
        // Through the scratch buffer, chunk by chunk, in the order that
        // reads every source byte before it is overwritten.
        let chunk = SCRATCH_BYTES as u64;
        let mut offs: Vec<u64> = (0..size).step_by(SCRATCH_BYTES).collect();
        if dst > src {
            offs.reverse();
        }
        for off in offs {
            let n = chunk.min(size - off) as usize;
            driver::memcpy_dtod_async(self.scratch, src + off, n, self.stream).at("copy")?;
            driver::memcpy_dtod_async(dst + off, self.scratch, n, self.stream).at("copy")?;
        }
        Ok(())
    }

    /// The pinned staging buffer `i`, `len` bytes of it.
    ///
    /// # Safety
    /// No copy may be using the buffer (its `staged` event has completed,
    /// or nothing was queued on it since the stream was last drained).
    #[allow(clippy::mut_from_ref)]
    unsafe fn staging(&self, i: usize, len: usize) -> &mut [u8] {
        debug_assert!(len <= STAGING_BYTES);
        // SAFETY: STAGING_BYTES of pinned memory owned by this state for
        // its whole life; the caller guarantees no DMA uses it, and each
        // call site holds at most one slice of each buffer at a time.
        unsafe { std::slice::from_raw_parts_mut(self.staging[i], len) }
    }

    /// Copies between registered guest memory and `dev` piece by piece,
    /// when `slices` qualify, and waits for the copies before returning
    /// (the slices are valid only until then). `Ok(false)` when they do not
    /// qualify; a driver error is left in `failed`.
    fn direct(
        &self,
        dev: u64,
        slices: &[HostSlice],
        total: u64,
        host: &HostRegistry,
        to_device: bool,
        failed: &mut Option<Fail>,
    ) -> bool {
        let sum = slices
            .iter()
            .try_fold(0u64, |a, s| a.checked_add(s.len as u64));
        if sum != Some(total)
            || slices.is_empty()
            || (total / slices.len() as u64) < DIRECT_MIN_SLICE as u64
            || !host.covers(slices)
        {
            return false;
        }
        let what = if to_device { "upload" } else { "download" };
        let mut off = 0u64;
        let mut r = Ok(());
        for s in slices {
            // SAFETY: each slice is host memory registered with the driver
            // and mapped (and, for downloads, writable) until this function
            // returns, which it does only after the stream has drained; `s.len`
            // bytes at `dev + off` lie in the range the caller checked.
            r = unsafe {
                if to_device {
                    driver::memcpy_htod_async(dev + off, s.ptr, s.len, self.stream)
                } else {
                    driver::memcpy_dtoh_async(s.ptr, dev + off, s.len, self.stream)
                }
            };
            if r.is_err() {
                break;
            }
            off += s.len as u64;
        }
        // Always drain: no copy may outlive the slices.
        let synced = driver::stream_sync(self.stream);
        if let Err(e) = r.and(synced) {
            *failed = Some(Fail::Cuda(what.into(), e));
        }
        true
    }

    /// Host -> device straight from registered guest memory; `Ok(false)`
    /// when the source does not qualify (nothing was copied).
    fn upload_direct(
        &self,
        dst: u64,
        src: &dyn HostSource,
        host: &HostRegistry,
    ) -> Result<bool, Fail> {
        let total = src.len();
        let mut failed = None;
        let done = src.with_slices(&mut |slices| {
            Ok(self.direct(dst, slices, total, host, true, &mut failed))
        })?;
        match failed {
            Some(f) => Err(f),
            None => Ok(done),
        }
    }

    /// Device -> host straight into registered guest memory.
    fn download_direct(
        &self,
        src: u64,
        dst: &dyn HostSink,
        host: &HostRegistry,
    ) -> Result<bool, Fail> {
        let total = dst.len();
        let mut failed = None;
        let done = dst.with_slices_mut(&mut |slices| {
            Ok(self.direct(src, slices, total, host, false, &mut failed))
        })?;
        match failed {
            Some(f) => Err(f),
            None => Ok(done),
        }
    }

    /// Host -> device through the staging buffers: the host fills one
    /// while the DMA engine drains the other.
    fn upload(&self, dst: u64, src: &dyn HostSource) -> Result<(), Fail> {
        let len = src.len();
        let mut off = 0u64;
        let mut i = 0usize;
        while off < len {
            let n = (len - off).min(STAGING_BYTES as u64) as usize;
            let b = i % 2;
            if i >= 2 {
                // The copy out of this buffer two chunks ago must be done.
                driver::event_sync(self.staged[b]).at("upload")?;
            }
            // SAFETY: buffer `b` is idle (first use, or its event completed).
            let buf = unsafe { self.staging(b, n) };
            src.read_at(off, buf)?;
            // SAFETY: the buffer stays untouched until its event (recorded
            // next) completes; `n` bytes at `dst + off` were checked.
            unsafe { driver::memcpy_htod_async(dst + off, buf.as_ptr(), n, self.stream) }
                .at("upload")?;
            driver::event_record(self.staged[b], self.stream).at("upload")?;
            off += n as u64;
            i += 1;
        }
        Ok(())
    }

    /// Device -> host through the staging buffers: the DMA engine fills
    /// one while the host empties the other.
    fn download(&self, src: u64, dst: &dyn HostSink) -> Result<(), Fail> {
        let len = dst.len();
        let mut pending: Option<(usize, u64, usize)> = None;
        let mut off = 0u64;
        let mut i = 0usize;
        let drain = |(b, off, n): (usize, u64, usize)| -> Result<(), Fail> {
            driver::event_sync(self.staged[b]).at("download")?;
            // SAFETY: the copy into buffer `b` has completed and nothing
            // else is queued on it.
            let buf = unsafe { self.staging(b, n) };
            dst.write_at(off, buf)?;
            Ok(())
        };
        while off < len {
            let n = (len - off).min(STAGING_BYTES as u64) as usize;
            let b = i % 2;
            // Buffer `b` was emptied by the previous iteration's drain.
            // SAFETY: no copy uses buffer `b` (see above).
            let buf = unsafe { self.staging(b, n) };
            // SAFETY: the buffer is not read until its event completes;
            // `n` bytes at `src + off` were checked.
            unsafe { driver::memcpy_dtoh_async(buf.as_mut_ptr(), src + off, n, self.stream) }
                .at("download")?;
            driver::event_record(self.staged[b], self.stream).at("download")?;
            if let Some(p) = pending.take() {
                drain(p)?;
            }
            pending = Some((b, off, n));
            off += n as u64;
            i += 1;
        }
        if let Some(p) = pending {
            drain(p)?;
        }
        Ok(())
    }

    /// Runs a validated built-in call; `available` bounds its temporaries.
    fn run_builtin(&self, call: Builtin, available: u64) -> Result<Duration, Fail> {
        let mut temps = Temps(Vec::new());
        match call {
            Builtin::Nothing => Ok(Duration::ZERO),
            Builtin::Fill { dst, count, value } => self.timed("fill_u32", |s| {
                if dst.is_multiple_of(4) {
                    s.k_fill_u32(dst, count, value)
                } else {
                    s.k_fill_pattern(dst, words(count), value)
                }
            }),
            Builtin::Copy { dst, src, bytes } => self.timed("copy", |s| s.k_copy(dst, src, bytes)),
            Builtin::Vadd {
                c,
                a,
                b,
                n,
                a_copy,
                b_copy,
            } => {
                let len = words(n);
                let shared = a_copy && b_copy && a == b;
                let need = len * (u64::from(a_copy) + u64::from(b_copy && !shared));
                if need > available {
                    return Err(Fail::Op(OpError::NoMemory {
                        requested: need,
                        available,
                    }));
                }
                let ta = if a_copy {
                    temps.alloc(len, available)?
                } else {
                    a
                };
                let tb = match (b_copy, shared) {
                    (true, true) => ta,
                    (true, false) => temps.alloc(len, available)?,
                    (false, _) => b,
                };
                self.timed("vadd_f32", |s| {
                    if a_copy {
                        driver::memcpy_dtod_async(ta, a, len as usize, s.stream).at("vadd_f32")?;
                    }
                    if b_copy && !shared {
                        driver::memcpy_dtod_async(tb, b, len as usize, s.stream).at("vadd_f32")?;
                    }
                    s.k_vadd(c, ta, tb, n)
                })
            }
            Builtin::Saxpy { y, x, n, a, x_copy } => {
                let len = words(n);
                if x_copy && len > available {
                    return Err(Fail::Op(OpError::NoMemory {
                        requested: len,
                        available,
                    }));
                }
                let tx = if x_copy {
                    temps.alloc(len, available)?
                } else {
                    x
                };
                self.timed("saxpy_f32", |s| {
                    if x_copy {
                        driver::memcpy_dtod_async(tx, x, len as usize, s.stream).at("saxpy_f32")?;
                    }
                    s.k_saxpy(y, tx, n, a)
                })
            }
            Builtin::Sgemm { p, a_copy, b_copy } => {
                let (m, n, k) = (u64::from(p.m), u64::from(p.n), u64::from(p.k));
                let (alen, blen) = (words(m * k), words(k * n));
                let shared = a_copy && b_copy && p.a == p.b && alen == blen;
                let need = u64::from(a_copy) * alen + u64::from(b_copy && !shared) * blen;
                if need > available {
                    return Err(Fail::Op(OpError::NoMemory {
                        requested: need,
                        available,
                    }));
                }
                let ta = if a_copy {
                    temps.alloc(alen, available)?
                } else {
                    p.a
                };
                let tb = match (b_copy, shared) {
                    (true, true) => ta,
                    (true, false) => temps.alloc(blen, available)?,
                    (false, _) => p.b,
                };
                self.timed("sgemm_f32", |s| {
                    if a_copy {
                        driver::memcpy_dtod_async(ta, p.a, alen as usize, s.stream)
                            .at("sgemm_f32")?;
                    }
                    if b_copy && !shared {
                        driver::memcpy_dtod_async(tb, p.b, blen as usize, s.stream)
                            .at("sgemm_f32")?;
                    }
                    s.k_sgemm(p, ta, tb)
                })
            }
            Builtin::Scale { c, count, beta } => {
                self.timed("sgemm_f32", |s| s.k_scale(c, count, beta))
            }
            Builtin::Reduce { out, input, n } => {
                self.timed("reduce_sum_f32", |s| s.k_reduce(out, input, n))
            }
        }
    }
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        if let Ok(_cur) = Current::push(self.ctx) {
            if !self.stream.is_null() {
                let _ = driver::stream_sync(self.stream);
            }
            for m in self.modules.values() {
                let _ = driver::module_unload(m.module);
            }
            if !self.builtin.is_null() {
                let _ = driver::module_unload(self.builtin);
            }
            if self.scratch != 0 {
                let _ = driver::mem_free(self.scratch);
            }
            for p in self.staging {
                if !p.is_null() {
                    let _ = driver::mem_free_host(p);
                }
            }
            for e in [self.start, self.end, self.staged[0], self.staged[1]] {
                if !e.is_null() {
                    // SAFETY: an event of this state, destroyed once.
                    let _ = unsafe { sys::cuEventDestroy_v2(e) };
                }
            }
            if !self.stream.is_null() {
                // SAFETY: this state's stream, drained above, destroyed once.
                let _ = unsafe { sys::cuStreamDestroy_v2(self.stream) };
            }
        }
        match self.owner {
            // SAFETY: the context this state created, destroyed once; it
            // is no longer current anywhere (ops pop it when they end).
            Owner::Own => drop(unsafe { sys::cuCtxDestroy_v2(self.ctx) }),
            // SAFETY: the green context this state created, destroyed once.
            Owner::Green(g) => drop(unsafe { sys::cuGreenCtxDestroy(g) }),
        }
    }
}

/// A vGPU's share of a CUDA device.
pub struct CudaPartition {
    spec: PartitionSpec,
    shared: Arc<Shared>,
    /// SM groups held (spatial mode).
    groups: Vec<usize>,
    /// Their resource descriptor (spatial mode; null otherwise).
    desc: sys::CUdevResourceDesc,
    /// SMs its kernels run on.
    sms: u32,
    /// Allocations, each with what cuMemAlloc returned for it (what gets
    /// freed; the allocation starts at the first aligned address in it).
    allocs: Allocations<u64>,
    dev: Option<DeviceState>,
    /// Why the partition cannot run commands until reset: its context hit
    /// a sticky error, or could not be created.
    lost: Option<String>,
    last_device_time: Option<Duration>,
    /// Guest memory registered for direct copies.
    host: HostRegistry,
    /// Whether the last upload or download went straight from or to
    /// registered memory.
    last_direct: bool,
}

// SAFETY: the driver handles in a partition may be used from any thread;
// every operation makes the partition's context current on the calling
// thread for its duration (and pops it), and `&mut self` serialises them.
unsafe impl Send for CudaPartition {}

impl std::fmt::Debug for CudaPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPartition")
            .field("spec", &self.spec)
            .field("sms", &self.sms)
            .field("memory_used", &self.allocs.used())
            .field("lost", &self.lost)
            .finish()
    }
}

impl CudaPartition {
    pub(crate) fn create(
        shared: Arc<Shared>,
        spec: &PartitionSpec,
    ) -> Result<CudaPartition, BackendError> {
        let mut pool = lock(&shared.pool);
        let mut short = Vec::new();
        if spec.memory > pool.memory {
            short.push(format!(
                "{} bytes of memory requested, {} left",
                spec.memory, pool.memory
            ));
        }
        let mut groups = Vec::new();
        match shared.mode {
            Mode::Isolated => {
                if spec.compute_units > pool.compute_units {
                    short.push(format!(
                        "{} compute units requested, {} left",
                        spec.compute_units, pool.compute_units
                    ));
                }
            }
            Mode::Spatial => {
                let granule = shared.sm_granule;
                if spec.compute_units == 0 || !spec.compute_units.is_multiple_of(granule) {
                    short.push(format!(
                        "spatial partitions take SMs in multiples of {granule}, {} requested",
                        spec.compute_units
                    ));
                } else {
                    let mut got = 0;
                    for &i in &pool.free_groups {
                        if got >= spec.compute_units {
                            break;
                        }
                        if got + shared.groups[i].sms <= spec.compute_units {
                            got += shared.groups[i].sms;
                            groups.push(i);
                        }
                    }
                    if got != spec.compute_units {
                        short.push(format!(
                            "{} SMs requested, {} left",
                            spec.compute_units, pool.compute_units
                        ));
                        groups.clear();
                    }
                }
            }
        }
        if !short.is_empty() {
            let why = format!("partition {:?}: {}", spec.name, short.join("; "));
            warn!("cuda backend: {why}");
            return Err(BackendError::DoesNotFit(why));
        }
        pool.memory -= spec.memory;
        pool.compute_units -= spec.compute_units;
        for i in &groups {
            pool.free_groups.remove(i);
        }
        drop(pool);

        let sms = match shared.mode {
            Mode::Isolated => shared.device_sms,
            Mode::Spatial => spec.compute_units,
        };
        // From here on, dropping the partition gives its share back.
        let host = HostRegistry::new(shared.clone(), &spec.name);
        let mut p = CudaPartition {
            spec: spec.clone(),
            host,
            last_direct: false,
            shared,
            groups,
            desc: std::ptr::null_mut(),
            sms,
            allocs: Allocations::default(),
            dev: None,
            lost: None,
            last_device_time: None,
        };
        if p.shared.mode == Mode::Spatial {
            let mut res: Vec<sys::CUdevResource> = p
                .groups
                .iter()
                .map(|&i| p.shared.groups[i].resource)
                .collect();
            let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
            // SAFETY: `res` holds `res.len()` SM resources from one split of
            // this device (the API's condition for combining them); valid
            // out pointer. The descriptor stays valid for the process.
            driver::ok(unsafe {
                sys::cuDevResourceGenerateDesc(&mut desc, res.as_mut_ptr(), res.len() as u32)
            })
            .map_err(|e| {
                BackendError::Unavailable(format!("SM resource descriptor for {sms} SMs: {e}"))
            })?;
            p.desc = desc;
        }
        let dev = p.create_state().map_err(|f| {
            BackendError::Unavailable(format!("partition {:?}: {}", spec.name, describe(&f)))
        })?;
        p.dev = Some(dev);
        info!(
            "cuda backend: partition {:?} created ({} bytes, {} {})",
            p.spec.name,
            p.spec.memory,
            p.spec.compute_units,
            match p.shared.mode {
                Mode::Isolated => "SM share, own context",
                Mode::Spatial => "SMs, green context",
            }
        );
        Ok(p)
    }

    /// Device time of the last command, as CUDA events around its device
    /// work saw it; `None` after a command with no device work (alloc,
    /// free, module load, an empty copy) or a failed one.
    pub fn last_device_time(&self) -> Option<Duration> {
        self.last_device_time
    }

    /// The partition's registry of guest memory (what
    /// [`Partition::host_memory`] hands out).
    pub fn host_registry(&self) -> &HostRegistry {
        &self.host
    }

    /// Whether the last upload or download went straight from or to
    /// registered guest memory (rather than through the staging buffers).
    pub fn last_copy_was_direct(&self) -> bool {
        self.last_direct
    }

    /// SMs the partition's kernels run on (the whole device in isolated
    /// mode, its own group in spatial mode).
    pub fn sm_count(&self) -> u32 {
        self.sms
    }

    /// Why the partition refuses commands until reset, if it does.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    fn available(&self) -> u64 {
        self.spec.memory.saturating_sub(self.allocs.used())
    }

    /// A new context for this partition.
    fn create_state(&self) -> Result<DeviceState, Fail> {
        if let Some(why) = crate::cuda_lost() {
            return Err(Fail::Op(OpError::Device(crate::lost_message(why))));
        }
        DeviceState::create(&self.shared, self.desc, self.sms)
    }

    /// Runs `f` with the partition's context current. A partition left
    /// without a context by a reset tries to get one first.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut DeviceState) -> Result<T, Fail>,
    ) -> Result<T, OpError> {
        if let Some(why) = crate::cuda_lost() {
            return Err(OpError::Device(format!(
                "partition {:?}: {}",
                self.spec.name,
                crate::lost_message(why)
            )));
        }
        if self.dev.is_none() {
            if let Ok(dev) = self.create_state() {
                info!(
                    "cuda backend: partition {:?}: context recreated",
                    self.spec.name
                );
                self.dev = Some(dev);
                self.lost = None;
            }
        }
        let r = match (&self.lost, self.dev.as_mut()) {
            (None, Some(dev)) => match Current::push(dev.ctx) {
                Ok(cur) => {
                    let r = f(dev);
                    drop(cur);
                    r
                }
                Err(e) => Err(Fail::Cuda("making the context current".into(), e)),
            },
            (Some(why), _) => {
                return Err(OpError::Device(format!(
                    "partition {:?}: {why}; reset required",
                    self.spec.name
                )))
            }
            (None, None) => {
                return Err(OpError::Device(format!(
                    "partition {:?} has no CUDA context",
                    self.spec.name
                )))
            }
        };
        r.map_err(|f| self.failed(f))
    }

    fn failed(&mut self, f: Fail) -> OpError {
        match f {
            Fail::Op(e) => e,
            Fail::Cuda(what, e) | Fail::Refused(what, e) if e.is_sticky() => {
                // A sticky error is the process's, not the context's: every
                // context of the process fails from now on.
                let why = format!("partition {:?}: {what}: {e}", self.spec.name);
                crate::mark_lost(&why);
                self.lost = Some(why.clone());
                OpError::Device(crate::lost_message(&why))
            }
            Fail::Cuda(what, e) => OpError::Device(format!("{what}: {e}")),
            Fail::Refused(what, e) => OpError::Invalid(format!("{what}: {e}")),
        }
    }

    /// Frees the allocations and destroys the context.
    fn teardown(&mut self) {
        let allocs = self.allocs.drain();
        if let Some(dev) = self.dev.take() {
            // An own context frees its memory when destroyed; a green
            // context's memory belongs to the primary context.
            if matches!(dev.owner, Owner::Green(_)) {
                if let Ok(_cur) = Current::push(dev.ctx) {
                    let _ = driver::stream_sync(dev.stream);
                    for a in &allocs {
                        let _ = driver::mem_free(a.data);
                    }
                }
            }
            drop(dev);
        }
    }

    fn launch_loaded(&mut self, l: &Launch<'_>) -> Result<Duration, OpError> {
        let module = l.module;
        let entry = l.entry;
        let cname = CString::new(entry)
            .map_err(|_| OpError::Invalid(format!("entry point {entry:?} contains a NUL")))?;
        self.run(|dev| {
            let m = dev
                .modules
                .get_mut(&module)
                .ok_or_else(|| Fail::Op(OpError::NotFound(format!("module {module:#x}"))))?;
            let (f, limits) = match m.kernels.get(entry) {
                Some(&k) => k,
                None => {
                    let f = driver::module_function(m.module, &cname)
                        .at("looking up a kernel")?
                        .ok_or_else(|| {
                            Fail::Op(OpError::NotFound(format!(
                                "entry point {entry:?} in module {module:#x}"
                            )))
                        })?;
                    use sys::CUfunction_attribute as F;
                    let limits = KernelLimits {
                        param_bytes: driver::function_param_bytes(f),
                        max_threads: driver::function_attribute(
                            f,
                            F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                        )
                        .at("kernel attributes")? as u32,
                        max_dynamic_shared: driver::function_attribute(
                            f,
                            F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        )
                        .at("kernel attributes")?
                            as u32,
                    };
                    m.kernels.insert(entry.to_string(), (f, limits));
                    (f, limits)
                }
            };
            rules::check_module_launch(entry, l.grid, l.block, l.shared_mem, l.params, &limits)?;
            dev.timed(entry, |s| {
                // SAFETY: the parameter block has the size of the kernel's
                // parameter list (checked above whenever the driver can
                // tell). Pointers in it are the guest's and are used on the
                // GPU only: loaded modules exist only where the operator
                // allowed guest PTX (set_guest_ptx), and an unmapped
                // address faults the GPU context, not this process.
                unsafe {
                    driver::launch_packed(f, l.grid, l.block, l.shared_mem, s.stream, l.params)
                }
                .map_err(|e| Fail::Refused(format!("launching {entry}"), e))
            })
        })
    }
}

impl Drop for CudaPartition {
    fn drop(&mut self) {
        self.teardown();
        let mut pool = lock(&self.shared.pool);
        pool.memory += self.spec.memory;
        pool.compute_units += self.spec.compute_units;
        for &i in &self.groups {
            pool.free_groups.insert(i);
        }
        info!(
            "cuda backend: partition {:?} released ({} bytes, {} compute units)",
            self.spec.name, self.spec.memory, self.spec.compute_units
        );
    }
}

impl Partition for CudaPartition {
    fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.last_device_time = None;
        // cuMemAlloc gives DEFAULT_ALIGN: a larger alignment is padding,
        // charged to the quota.
        let align = rules::alloc_align(size, align)?;
        let available = self.available();
        let pad = align.saturating_sub(DEFAULT_ALIGN);
        let charged = size.saturating_add(pad);
        let no_memory = OpError::NoMemory {
            requested: charged,
            available,
        };
        if let Err(e) = self.allocs.admit(charged, available) {
            debug!(
                "cuda backend: partition {:?}: {charged} bytes requested, {available} available, {} allocations",
                self.spec.name,
                self.allocs.len()
            );
            return Err(e);
        }
        let bytes = usize::try_from(charged).map_err(|_| no_memory.clone())?;
        let base = self.run(|dev| {
            let base = match driver::mem_alloc(bytes) {
                Ok(p) => p,
                Err(e) if e.is_out_of_memory() => return Err(Fail::Op(no_memory.clone())),
                Err(e) => return Err(Fail::Cuda("cuMemAlloc".into(), e)),
            };
            // Zeroed like the software backend's, so that no tenant reads
            // what a previous owner of the memory left there.
            let zeroed = driver::memset_d8_async(base, 0, bytes, dev.stream)
                .and_then(|()| driver::stream_sync(dev.stream));
            if let Err(e) = zeroed {
                let _ = driver::mem_free(base);
                return Err(Fail::Cuda("zeroing new memory".into(), e));
            }
            Ok(base)
        })?;
        let addr = align_up(base, align).filter(|&a| a - base <= pad);
        let Some(addr) = addr else {
            let _ = self.run(|_| driver::mem_free(base).at("cuMemFree"));
            return Err(OpError::Device(format!(
                "cuMemAlloc returned {base:#x}, not {DEFAULT_ALIGN}-byte aligned"
            )));
        };
        self.allocs.insert(addr, size, charged, base);
        debug!(
            "cuda backend: partition {:?}: allocated {size} bytes at {addr:#x} ({} in use)",
            self.spec.name,
            self.allocs.used()
        );
        Ok(addr)
    }

    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.last_device_time = None;
        let a = self.allocs.free(addr)?;
        debug!(
            "cuda backend: partition {:?}: freed {} bytes at {addr:#x} ({} in use)",
            self.spec.name,
            a.size,
            self.allocs.used()
        );
        if self.lost.is_some() || self.dev.is_none() {
            // Reset destroys the context, and its memory with it.
            return Ok(());
        }
        // Every command drains its stream before returning, so no queued
        // work can still use the memory.
        self.run(|_| driver::mem_free(a.data).at("cuMemFree"))
    }

    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        self.last_device_time = None;
        self.allocs.check(dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.last_direct = false;
        let host = self.host.clone();
        let mut direct = false;
        let t = self.run(|dev| {
            dev.timed("upload", |s| {
                direct = s.upload_direct(dst, src, &host)?;
                if direct {
                    return Ok(());
                }
                s.upload(dst, src)
            })
        })?;
        self.last_direct = direct;
        self.last_device_time = Some(t);
        Ok(())
    }

    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        self.last_device_time = None;
        self.allocs.check(src, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.last_direct = false;
        let host = self.host.clone();
        let mut direct = false;
        let t = self.run(|dev| {
            dev.timed("download", |s| {
                direct = s.download_direct(src, dst, &host)?;
                if direct {
                    return Ok(());
                }
                s.download(src, dst)
            })
        })?;
        self.last_direct = direct;
        self.last_device_time = Some(t);
        Ok(())
    }

    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.last_device_time = None;
        self.allocs.check(dst, size)?;
        self.allocs.check(src, size)?;
        if size == 0 || dst == src {
            return Ok(());
        }
        let t = self.run(|dev| dev.timed("copy", |s| s.memmove(dst, src, size)))?;
        self.last_device_time = Some(t);
        Ok(())
    }

    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.last_device_time = None;
        if !size.is_multiple_of(4) {
            return Err(OpError::Invalid(format!(
                "fill of {size} bytes: not a multiple of 4"
            )));
        }
        self.allocs.check(addr, size)?;
        if size == 0 {
            return Ok(());
        }
        let t = self.run(|dev| {
            dev.timed("fill", |s| {
                if addr.is_multiple_of(4) {
                    driver::memset_d32_async(addr, pattern, (size / 4) as usize, s.stream)
                        .at("fill")
                } else {
                    s.k_fill_pattern(addr, size, pattern)
                }
            })
        })?;
        self.last_device_time = Some(t);
        Ok(())
    }

    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.last_device_time = None;
        if format != abi::MODULE_FORMAT_PTX {
            return Err(OpError::Unsupported(format!(
                "module format {format}: the cuda backend loads PTX (format {})",
                abi::MODULE_FORMAT_PTX
            )));
        }
        if !self.shared.guest_ptx.load(Ordering::Relaxed) {
            return Err(OpError::Unsupported(
                "guest PTX modules are refused: partitions share one GPU address space, so a loaded kernel could reach other tenants' memory"
                    .into(),
            ));
        }
        if image.is_empty() {
            return Err(OpError::Invalid("empty module image".into()));
        }
        if image.len() as u64 > abi::MAX_MODULE_SIZE {
            return Err(OpError::Invalid(format!(
                "module image of {} bytes is larger than {}",
                image.len(),
                abi::MAX_MODULE_SIZE
            )));
        }
        let text_len = image.len() - image.iter().rev().take_while(|&&b| b == 0).count();
        if let Some(at) = image[..text_len].iter().position(|&b| b == 0) {
            return Err(OpError::Invalid(format!(
                "PTX image has a NUL byte at offset {at}"
            )));
        }
        let mut text = Vec::with_capacity(text_len + 1);
        text.extend_from_slice(&image[..text_len]);
        text.push(0);
        let name = self.spec.name.clone();
        self.run(|dev| {
            if dev.modules.len() >= MAX_MODULES {
                return Err(Fail::Op(OpError::Invalid(format!(
                    "{MAX_MODULES} modules already loaded"
                ))));
            }
            let module = match driver::module_load_ptx(&text) {
                Ok(m) => m,
                Err((e, log)) if e.is_sticky() => {
                    return Err(Fail::Cuda(format!("loading a module ({log})"), e))
                }
                Err((e, log)) => {
                    return Err(Fail::Op(OpError::Invalid(format!(
                        "PTX rejected by the JIT compiler ({e}): {log}"
                    ))))
                }
            };
            let handle = dev.next_module;
            dev.next_module += 1;
            dev.modules.insert(
                handle,
                Module {
                    module,
                    kernels: HashMap::new(),
                },
            );
            debug!("cuda backend: partition {name:?}: module {handle:#x} loaded");
            Ok(handle)
        })
    }

    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.last_device_time = None;
        if module == abi::MODULE_BUILTIN {
            return Err(OpError::Invalid(
                "the built-in module cannot be unloaded".into(),
            ));
        }
        let not_found = || OpError::NotFound(format!("module {module:#x}"));
        if self.lost.is_some() {
            // The context goes at reset; only forget the handle.
            let dev = self.dev.as_mut().ok_or_else(not_found)?;
            return dev.modules.remove(&module).map(drop).ok_or_else(not_found);
        }
        self.run(|dev| {
            let m = dev
                .modules
                .remove(&module)
                .ok_or_else(|| Fail::Op(not_found()))?;
            driver::module_unload(m.module).at("cuModuleUnload")
        })
    }

    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        self.last_device_time = None;
        let t = if launch.module == abi::MODULE_BUILTIN {
            let call = rules::plan_builtin(
                launch.entry,
                launch.grid,
                launch.block,
                launch.params,
                &self.allocs,
                FloatOperands::Aligned,
            )?;
            let available = self.available();
            self.run(|dev| dev.run_builtin(call, available))?
        } else {
            self.launch_loaded(launch)?
        };
        self.last_device_time = Some(t);
        Ok(())
    }

    fn memory_used(&self) -> u64 {
        self.allocs.used()
    }

    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        Some(Arc::new(self.host.clone()))
    }

    fn reset(&mut self) {
        debug!(
            "cuda backend: partition {:?}: reset, {} allocations ({} bytes) freed",
            self.spec.name,
            self.allocs.len(),
            self.allocs.used()
        );
        self.teardown();
        self.lost = None;
        self.last_device_time = None;
        match self.create_state() {
            Ok(dev) => self.dev = Some(dev),
            Err(f) => {
                let why = format!("no CUDA context ({})", describe(&f));
                warn!("cuda backend: partition {:?}: {why}", self.spec.name);
                self.lost = Some(why);
            }
        }
    }
}
