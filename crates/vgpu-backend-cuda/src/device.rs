//! What a partition holds on the device: its context (or green
//! context), stream, events, staging and scratch buffers, the built-in
//! module and the guest's modules, and the device work of every command
//! on them. [`CudaPartition`](crate::CudaPartition) decides what runs;
//! this runs it.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CString};
use std::mem::ManuallyDrop;
use std::time::Duration;

use vgpu_abi as abi;
use vgpu_backend::arrays::ArrayDesc;
use vgpu_backend::rules::{self, words, Builtin};
use vgpu_backend::{FunctionInfo, HostSink, HostSlice, HostSource, OpError, SliceMemory};

use crate::driver::{
    self, CUcontext, CUfunction, Context, CuError, Current, DeviceMem, Event, GreenContext,
    PinnedHost, ResourceDesc, Stream,
};
use crate::hostmem::HostRegistry;
use crate::kernels::{self, BLOCK, REDUCE_BLOCKS, SGEMM_MAX_GRID_Y, SGEMM_TILE};
use crate::{Mode, Shared};

/// Bytes of each of the two pinned staging buffers (the chunk of an
/// upload or download).
pub const STAGING_BYTES: usize = 8 << 20;
/// Bytes of the device scratch buffer (overlapping copies, reduction
/// partial sums).
pub const SCRATCH_BYTES: usize = 8 << 20;
/// Smallest average piece of a guest transfer copied straight from or to
/// registered guest memory; a list of smaller pieces costs more in copy
/// calls than the staging path's host copy.
pub const DIRECT_MIN_SLICE: usize = 16 << 10;
/// Blocks per SM of the element-wise kernels' grids.
const BLOCKS_PER_SM: u64 = 8;

/// The built-in kernels, indices into [`kernels::NAMES`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum K {
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
pub(crate) enum Fail {
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

pub(crate) trait At<T> {
    /// Names the driver call that failed.
    fn at(self, what: &str) -> Result<T, Fail>;
}

impl<T> At<T> for Result<T, CuError> {
    fn at(self, what: &str) -> Result<T, Fail> {
        self.map_err(|e| Fail::Cuda(what.to_string(), e))
    }
}

pub(crate) fn describe(f: &Fail) -> String {
    match f {
        Fail::Op(e) => e.to_string(),
        Fail::Cuda(what, e) | Fail::Refused(what, e) => format!("{what}: {e}"),
    }
}

/// A pointer to a kernel argument, as cuLaunchKernel wants it.
pub(crate) fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// The partition's context, destroyed when this is dropped.
pub(crate) enum Owner {
    /// Created by cuCtxCreate.
    Own(Context),
    /// A green context of the primary context, and its context's handle.
    Green(GreenContext, CUcontext),
}

impl Owner {
    /// The context, to make current.
    pub(crate) fn ctx(&self) -> CUcontext {
        match self {
            Owner::Own(c) => c.handle(),
            Owner::Green(_, ctx) => *ctx,
        }
    }
}

/// A loaded guest module and the kernels looked up in it so far.
pub(crate) struct Module {
    pub(crate) module: driver::Module,
    pub(crate) kernels: HashMap<String, Kernel>,
}

/// A kernel of a loaded module, looked up once.
#[derive(Debug, Clone)]
pub(crate) struct Kernel {
    pub(crate) f: CUfunction,
    pub(crate) info: FunctionInfo,
    /// The dynamic shared memory its launches may use now (the driver's
    /// attribute, raised on demand up to `info`'s limit).
    pub(crate) dynamic_shared: u32,
    /// Whether clusters past 8 blocks were allowed.
    pub(crate) non_portable_clusters: bool,
}

impl Module {
    /// Kernel `entry`, described by the driver the first time.
    pub(crate) fn kernel(
        &mut self,
        entry: &str,
        max_shared_optin: u32,
    ) -> Result<&mut Kernel, Fail> {
        if !self.kernels.contains_key(entry) {
            let name = CString::new(entry)
                .map_err(|_| OpError::Invalid(format!("entry point {entry:?} contains a NUL")))?;
            let f = driver::module_function(&self.module, &name)
                .at("looking up a kernel")?
                .ok_or_else(|| OpError::NotFound(format!("entry point {entry:?} in the module")))?;
            let k = describe_kernel(entry, f, max_shared_optin)?;
            if self.kernels.len() >= abi::MAX_FUNCTIONS as usize {
                return Err(Fail::Op(OpError::Invalid(format!(
                    "{} kernels of one module looked up",
                    abi::MAX_FUNCTIONS
                ))));
            }
            self.kernels.insert(entry.to_string(), k);
        }
        self.kernels
            .get_mut(entry)
            .ok_or_else(|| Fail::Op(OpError::NotFound(format!("entry point {entry:?}"))))
    }
}

/// What the driver says of kernel `f`.
fn describe_kernel(entry: &str, f: CUfunction, max_shared_optin: u32) -> Result<Kernel, Fail> {
    use driver::CUfunction_attribute as F;
    let attr = |a| {
        driver::function_attribute(f, a)
            .at("kernel attributes")
            .map(|v| v.max(0) as u32)
    };
    let params = driver::function_params(f, abi::MAX_FUNC_PARAMS as usize).ok_or_else(|| {
        OpError::Unsupported(format!(
            "{entry}: the driver does not describe the kernel's parameters (cuFuncGetParamInfo needs CUDA 12.4)"
        ))
    })?;
    let shared_static = attr(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
    let attrs = abi::FuncInfo {
        max_threads: attr(F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        shared_static,
        max_dynamic_shared: max_shared_optin.saturating_sub(shared_static),
        const_bytes: attr(F::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
        local_bytes: attr(F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        num_regs: attr(F::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        ptx_version: attr(F::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
        binary_version: attr(F::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        ..Default::default()
    };
    let params = params.into_iter().map(|(o, s)| (o as u32, s as u32));
    let info = rules::checked_function_info(entry, FunctionInfo::new(params, attrs))?;
    Ok(Kernel {
        f,
        info,
        dynamic_shared: attr(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
        non_portable_clusters: false,
    })
}

/// `slices` as runs: neighbours that continue each other in the same
/// mapping become one. Each run is a DMA of its own, and the copy engine
/// pays for each (2 MiB pieces of a 16 MiB copy reach 94% of one copy's
/// rate on an H200, 256 KiB pieces 65%); a guest's pages that are
/// contiguous in its physical memory are contiguous here.
pub(crate) fn coalesced(slices: &[HostSlice]) -> Vec<(*mut u8, usize)> {
    let mut runs: Vec<(*mut u8, usize, u64)> = Vec::with_capacity(slices.len());
    for s in slices {
        if let Some((ptr, len, mapping)) = runs.last_mut() {
            if *mapping == s.mapping && (*ptr as usize).checked_add(*len) == Some(s.ptr as usize) {
                *len += s.len;
                continue;
            }
        }
        runs.push((s.ptr, s.len, s.mapping));
    }
    runs.into_iter().map(|(p, l, _)| (p, l)).collect()
}

/// Device temporaries freed on drop (with the context current, after the
/// work using them completed).
pub(crate) struct Temps(Vec<u64>);

impl Temps {
    pub(crate) fn alloc(&mut self, bytes: u64, available: u64) -> Result<u64, Fail> {
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
pub(crate) struct DeviceState {
    pub(crate) owner: Owner,
    /// What was made in the context; dropped (with the context current)
    /// in `drop`, before `owner` destroys the context.
    pub(crate) res: ManuallyDrop<InContext>,
    pub(crate) next_module: u64,
    /// SMs the partition's kernels run on (for grid sizes).
    pub(crate) sms: u32,
}

/// What a partition made in its context. Dropping it destroys it all in
/// the order of the fields (texture and surface objects, then the arrays
/// they read, guest modules in handle order, the built-in module, the
/// scratch buffer, the staging buffers, the events, the stream), so the
/// context must be current.
pub(crate) struct InContext {
    /// Texture objects by the driver's handle, which kernels use.
    pub(crate) textures: BTreeMap<u64, driver::TexObject>,
    /// Surface objects by the driver's handle.
    pub(crate) surfaces: BTreeMap<u64, driver::SurfObject>,
    /// Arrays by the handle the guest was given (a number of ours: the
    /// driver's is a host address).
    pub(crate) arrays: BTreeMap<u64, (driver::Array, ArrayDesc)>,
    /// The handle the next array gets.
    pub(crate) next_array: u64,
    pub(crate) modules: BTreeMap<u64, Module>,
    /// The built-in module, held for `funcs`.
    pub(crate) _builtin: driver::Module,
    /// Kernels of the built-in module, in [`kernels::NAMES`] order.
    pub(crate) funcs: [CUfunction; kernels::NAMES.len()],
    pub(crate) scratch: DeviceMem,
    pub(crate) staging: [PinnedHost; 2],
    pub(crate) start: Event,
    pub(crate) end: Event,
    pub(crate) staged: [Event; 2],
    /// Timing events of queued steps, made as runs need them.
    pub(crate) marks: Vec<Event>,
    /// The stream work goes to: lane 0's, except while another lane's
    /// is swapped in ([`DeviceState::on_lane`]).
    pub(crate) stream: Stream,
    /// Lanes 1 and up, made as runs need them.
    pub(crate) lanes: Vec<Lane>,
}

/// A lane's own stream and scratch buffer (lane 0's are the partition's).
pub(crate) struct Lane {
    scratch: DeviceMem,
    stream: Stream,
}

impl InContext {
    /// Loaded module `module`.
    pub(crate) fn module_mut(&mut self, module: u64) -> Result<&mut Module, Fail> {
        self.modules
            .get_mut(&module)
            .ok_or_else(|| Fail::Op(OpError::NotFound(format!("module {module:#x}"))))
    }

    /// The stream, events, buffers and the built-in module, made in the
    /// current context (`owner`'s). On failure, what was made is destroyed
    /// (the context still current).
    fn create(shared: &Shared, owner: &Owner) -> Result<InContext, Fail> {
        let stream = match owner {
            Owner::Own(_) => Stream::create(),
            Owner::Green(g, _) => Stream::create_in(g),
        }
        .at("creating a stream")?;
        let start = Event::create(true).at("creating an event")?;
        let end = Event::create(true).at("creating an event")?;
        let staged0 = Event::create(false).at("creating an event")?;
        let staging0 = PinnedHost::alloc(STAGING_BYTES).at("allocating pinned staging memory")?;
        let staged1 = Event::create(false).at("creating an event")?;
        let staging1 = PinnedHost::alloc(STAGING_BYTES).at("allocating pinned staging memory")?;
        let scratch = DeviceMem::alloc(SCRATCH_BYTES).at("allocating the scratch buffer")?;
        let builtin = driver::module_load(&driver::ModuleImage::ptx(
            shared.ptx.strip_suffix(&[0]).unwrap_or(&shared.ptx),
        ))
        .map_err(|(e, log)| Fail::Cuda(format!("loading the built-in module ({log})"), e))?;
        let mut funcs = [std::ptr::null_mut(); kernels::NAMES.len()];
        for (i, name) in kernels::NAMES.iter().enumerate() {
            let cname = CString::new(*name).expect("kernel names have no NUL");
            funcs[i] = driver::module_function(&builtin, &cname)
                .at("looking up a built-in kernel")?
                .ok_or_else(|| {
                    Fail::Op(OpError::Device(format!(
                        "built-in kernel {name} is missing"
                    )))
                })?;
        }
        Ok(InContext {
            textures: BTreeMap::new(),
            surfaces: BTreeMap::new(),
            arrays: BTreeMap::new(),
            next_array: 1,
            modules: BTreeMap::new(),
            _builtin: builtin,
            funcs,
            scratch,
            staging: [staging0, staging1],
            start,
            end,
            staged: [staged0, staged1],
            marks: Vec::new(),
            stream,
            lanes: Vec::new(),
        })
    }
}

impl DeviceState {
    /// A new context (isolated) or green context (spatial, from `desc`)
    /// with its stream, events, buffers and the built-in module.
    pub(crate) fn create(
        shared: &Shared,
        desc: Option<ResourceDesc>,
        sms: u32,
    ) -> Result<Self, Fail> {
        let owner = match shared.mode {
            Mode::Isolated => Owner::Own(Context::create(shared.device).at("creating a context")?),
            Mode::Spatial => {
                // Every spatial partition has its descriptor before its
                // first context.
                let desc = desc
                    .ok_or_else(|| Fail::Op(OpError::Device("no SM resource descriptor".into())))?;
                let g = GreenContext::create(desc, shared.device).at("creating a green context")?;
                // On failure `g` is dropped, which destroys it.
                let ctx = g
                    .context()
                    .map_err(|e| Fail::Cuda("context of the green context".into(), e))?;
                Owner::Green(g, ctx)
            }
        };
        // On failure `owner` is dropped, which destroys the context, after
        // `cur` (and what was made in it).
        let cur = Current::push(owner.ctx()).at("making the context current")?;
        let res = InContext::create(shared, &owner)?;
        drop(cur);
        Ok(DeviceState {
            owner,
            res: ManuallyDrop::new(res),
            next_module: abi::MODULE_BUILTIN + 1,
            sms: sms.max(1),
        })
    }

    /// Waits for the work of every lane's stream (errors are left for
    /// the next operation to meet).
    pub(crate) fn sync_all(&self) {
        let _ = driver::stream_sync(&self.res.stream);
        for l in &self.res.lanes {
            let _ = driver::stream_sync(&l.stream);
        }
    }

    /// Runs `f` with lane `lane`'s stream and scratch buffer in place of
    /// lane 0's, so that its work is ordered only after that lane's and
    /// its built-in kernels' temporaries do not meet another lane's. A
    /// lane's stream and buffer are made on its first use.
    pub(crate) fn on_lane<T>(
        &mut self,
        lane: usize,
        f: impl FnOnce(&mut Self) -> Result<T, Fail>,
    ) -> Result<T, Fail> {
        if lane == 0 {
            return f(self);
        }
        while self.res.lanes.len() < lane {
            let stream = match &self.owner {
                Owner::Own(_) => Stream::create(),
                Owner::Green(g, _) => Stream::create_in(g),
            }
            .at("creating a lane's stream")?;
            let scratch =
                DeviceMem::alloc(SCRATCH_BYTES).at("allocating a lane's scratch buffer")?;
            self.res.lanes.push(Lane { scratch, stream });
        }
        let swap = |res: &mut InContext| {
            let l = &mut res.lanes[lane - 1];
            std::mem::swap(&mut res.stream, &mut l.stream);
            std::mem::swap(&mut res.scratch, &mut l.scratch);
        };
        swap(&mut self.res);
        let r = f(self);
        swap(&mut self.res);
        r
    }

    /// Runs `f`'s device work between the timing events and waits for it;
    /// returns the time between the events. On failure the stream is
    /// drained too, so no buffer is still in use when this returns.
    pub(crate) fn timed(
        &self,
        what: &str,
        f: impl FnOnce(&Self) -> Result<(), Fail>,
    ) -> Result<Duration, Fail> {
        let r = &self.res;
        driver::event_record(&r.start, &r.stream).at(what)?;
        if let Err(e) = f(self) {
            let _ = driver::stream_sync(&r.stream);
            return Err(e);
        }
        driver::event_record(&r.end, &r.stream).at(what)?;
        driver::event_sync(&r.end).map_err(|e| Fail::Cuda(format!("{what}: device work"), e))?;
        driver::event_elapsed(&r.start, &r.end).at(what)
    }

    /// [`Self::launch`] on enough blocks for `n` items, one a thread.
    ///
    /// # Safety
    /// As for [`Self::launch`].
    unsafe fn launch_n(&self, k: K, n: u64, args: &mut [*mut c_void]) -> Result<(), Fail> {
        // SAFETY: forwarded to the caller.
        unsafe { self.launch(k, [self.grid_for(n), 1, 1], args) }
    }

    pub(crate) fn grid_for(&self, n: u64) -> u32 {
        n.div_ceil(u64::from(BLOCK))
            .clamp(1, u64::from(self.sms) * BLOCKS_PER_SM) as u32
    }

    /// Launches built-in kernel `k` on `grid` blocks of `BLOCK` threads.
    ///
    /// # Safety
    /// `args` must match `k`'s parameter list in [`kernels::SOURCE`], and
    /// every range the kernel touches must have been checked against the
    /// partition's allocations (or be its scratch buffer or temporaries).
    pub(crate) unsafe fn launch(
        &self,
        k: K,
        grid: [u32; 3],
        args: &mut [*mut c_void],
    ) -> Result<(), Fail> {
        // SAFETY: forwarded to the caller.
        unsafe {
            driver::launch(
                self.res.funcs[k as usize],
                grid,
                [BLOCK, 1, 1],
                0,
                &self.res.stream,
                args,
            )
        }
        .at(kernels::NAMES[k as usize])
    }

    pub(crate) fn k_fill_u32(
        &self,
        mut dst: u64,
        mut count: u64,
        mut value: u32,
    ) -> Result<(), Fail> {
        // SAFETY: fill_u32(u32*, u64, u32); `count` words at `dst` were
        // checked by the caller.
        unsafe {
            self.launch_n(
                K::FillU32,
                count,
                &mut [arg(&mut dst), arg(&mut count), arg(&mut value)],
            )
        }
    }

    pub(crate) fn k_fill_pattern(
        &self,
        mut dst: u64,
        mut bytes: u64,
        mut pattern: u32,
    ) -> Result<(), Fail> {
        // SAFETY: fill_pattern_u8(u8*, u64, u32); `bytes` at `dst` checked.
        unsafe {
            self.launch_n(
                K::FillPatternU8,
                bytes,
                &mut [arg(&mut dst), arg(&mut bytes), arg(&mut pattern)],
            )
        }
    }

    pub(crate) fn k_copy(&self, mut dst: u64, mut src: u64, bytes: u64) -> Result<(), Fail> {
        if (dst | src | bytes).is_multiple_of(16) {
            let mut count = bytes / 16;
            // SAFETY: copy_u128(uint4*, const uint4*, u64); both ranges
            // checked, 16-byte aligned, not overlapping.
            return unsafe {
                self.launch_n(
                    K::CopyU128,
                    count,
                    &mut [arg(&mut dst), arg(&mut src), arg(&mut count)],
                )
            };
        }
        let mut bytes = bytes;
        // SAFETY: copy_bytes(u8*, const u8*, u64); both ranges checked,
        // not overlapping.
        unsafe {
            self.launch_n(
                K::CopyBytes,
                bytes,
                &mut [arg(&mut dst), arg(&mut src), arg(&mut bytes)],
            )
        }
    }

    pub(crate) fn k_vadd(
        &self,
        mut c: u64,
        mut a: u64,
        mut b: u64,
        mut n: u64,
    ) -> Result<(), Fail> {
        // SAFETY: vadd_f32(float*, const float*, const float*, u64); `n`
        // floats at each checked (or a temporary of that size).
        unsafe {
            self.launch_n(
                K::Vadd,
                n,
                &mut [arg(&mut c), arg(&mut a), arg(&mut b), arg(&mut n)],
            )
        }
    }

    pub(crate) fn k_saxpy(
        &self,
        mut y: u64,
        mut x: u64,
        mut n: u64,
        mut a: f32,
    ) -> Result<(), Fail> {
        // SAFETY: saxpy_f32(float*, const float*, u64, float); `n` floats
        // at each checked (or a temporary).
        unsafe {
            self.launch_n(
                K::Saxpy,
                n,
                &mut [arg(&mut y), arg(&mut x), arg(&mut n), arg(&mut a)],
            )
        }
    }

    pub(crate) fn k_scale(&self, mut c: u64, mut count: u64, mut beta: f32) -> Result<(), Fail> {
        // SAFETY: scale_f32(float*, u64, float); `count` floats checked.
        unsafe {
            self.launch_n(
                K::Scale,
                count,
                &mut [arg(&mut c), arg(&mut count), arg(&mut beta)],
            )
        }
    }

    pub(crate) fn k_sgemm(&self, p: abi::SgemmParams, a: u64, b: u64) -> Result<(), Fail> {
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

    pub(crate) fn k_reduce(&self, mut out: u64, mut input: u64, mut n: u64) -> Result<(), Fail> {
        let blocks = self.grid_for(n).min(REDUCE_BLOCKS);
        let mut partials = self.res.scratch.ptr();
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

    /// Queues setting `size` bytes (whole words) at `addr` to `pattern`.
    pub(crate) fn fill(&self, addr: u64, size: u64, pattern: u32) -> Result<(), Fail> {
        if size == 0 {
            return Ok(());
        }
        if addr.is_multiple_of(4) {
            driver::memset_async(
                addr,
                driver::Fill::Word(pattern),
                (size / 4) as usize,
                &self.res.stream,
            )
            .at("fill")
        } else {
            self.k_fill_pattern(addr, size, pattern)
        }
    }

    /// Queues a copy of `size` bytes from `src` to `dst` (checked ranges
    /// that may overlap).
    pub(crate) fn memmove(&self, dst: u64, src: u64, size: u64) -> Result<(), Fail> {
        if size == 0 || dst == src {
            return Ok(());
        }
        if !rules::overlaps(dst, size, src, size) {
            return driver::memcpy_dtod_async(dst, src, size as usize, &self.res.stream).at("copy");
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
            let scratch = self.res.scratch.ptr();
            driver::memcpy_dtod_async(scratch, src + off, n, &self.res.stream).at("copy")?;
            driver::memcpy_dtod_async(dst + off, scratch, n, &self.res.stream).at("copy")?;
        }
        Ok(())
    }

    /// The pinned staging buffer `i`, `len` bytes of it.
    ///
    /// # Safety
    /// No copy may be using the buffer (its `staged` event has completed,
    /// or nothing was queued on it since the stream was last drained).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn staging(&self, i: usize, len: usize) -> &mut [u8] {
        debug_assert!(len <= STAGING_BYTES);
        // SAFETY: STAGING_BYTES of pinned memory owned by this state for
        // its whole life; the caller guarantees no DMA uses it, and each
        // call site holds at most one slice of each buffer at a time.
        unsafe { std::slice::from_raw_parts_mut(self.res.staging[i].ptr(), len) }
    }

    /// Copies between registered guest memory and `dev` piece by piece,
    /// when `slices` qualify, and waits for the copies before returning
    /// (the slices are valid only until then). `Ok(false)` when they do not
    /// qualify; a driver error is left in `failed`.
    pub(crate) fn direct(
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
        // SAFETY: the slices stay mapped (and, for downloads, writable)
        // until this function returns, which it does only after the
        // stream has drained; the caller checked the device range.
        let r = unsafe { self.enqueue_runs(dev, slices, to_device) };
        // Always drain: no copy may outlive the slices.
        let synced = driver::stream_sync(&self.res.stream);
        if let Err(e) = r.and(synced) {
            *failed = Some(Fail::Cuda(what.into(), e));
        }
        true
    }

    /// Puts the copies of `slices` (contiguous runs merged) to or from
    /// device memory at `dev` on the stream, without waiting.
    ///
    /// # Safety
    /// Each slice must be host memory registered with the driver, mapped
    /// (and, for downloads, writable) until the stream has drained past
    /// these copies; `[dev, dev + total)` must lie in the partition's
    /// memory.
    unsafe fn enqueue_runs(
        &self,
        dev: u64,
        slices: &[HostSlice],
        to_device: bool,
    ) -> Result<(), CuError> {
        let mut off = 0u64;
        for (ptr, len) in coalesced(slices) {
            // SAFETY: forwarded to the caller, run by run.
            unsafe {
                if to_device {
                    driver::memcpy_htod_async(dev + off, ptr, len, &self.res.stream)
                } else {
                    driver::memcpy_dtoh_async(ptr, dev + off, len, &self.res.stream)
                }
            }?;
            off += len as u64;
        }
        Ok(())
    }

    /// Queues a copy between device memory at `dev` and `mem` (a step of
    /// a queued run): straight from or to registered host memory without
    /// waiting, else through the staging buffers, in stream order. The
    /// caller has checked the device range and drains the stream before
    /// `mem` may go.
    pub(crate) fn enqueue_copy(
        &self,
        dev: u64,
        mem: &SliceMemory<'_>,
        host: &HostRegistry,
        to_device: bool,
    ) -> Result<(), Fail> {
        let slices = mem.slices();
        let total = HostSource::len(mem);
        if total == 0 {
            return Ok(());
        }
        if total / slices.len() as u64 >= DIRECT_MIN_SLICE as u64 && host.covers(slices) {
            let what = if to_device { "upload" } else { "download" };
            // SAFETY: `mem`'s slices stay mapped while it lives (its
            // contract) and the caller drains the stream before it goes;
            // `covers` found them registered; the range was checked.
            return unsafe { self.enqueue_runs(dev, slices, to_device) }
                .map_err(|e| Fail::Cuda(what.into(), e));
        }
        let staged = if to_device {
            self.upload(dev, mem)
        } else {
            self.download(dev, mem)
        };
        // The staging buffers are free for the next step only once their
        // copies are done (each transfer starts with the first buffer).
        staged.and_then(|()| driver::stream_sync(&self.res.stream).at("staged copy"))
    }

    /// Host -> device straight from registered guest memory; `Ok(false)`
    /// when the source does not qualify (nothing was copied).
    pub(crate) fn upload_direct(
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
    pub(crate) fn download_direct(
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
    pub(crate) fn upload(&self, dst: u64, src: &dyn HostSource) -> Result<(), Fail> {
        let len = src.len();
        let mut off = 0u64;
        let mut i = 0usize;
        while off < len {
            let n = (len - off).min(STAGING_BYTES as u64) as usize;
            let b = i % 2;
            if i >= 2 {
                // The copy out of this buffer two chunks ago must be done.
                driver::event_sync(&self.res.staged[b]).at("upload")?;
            }
            // SAFETY: buffer `b` is idle (first use, or its event completed).
            let buf = unsafe { self.staging(b, n) };
            src.read_at(off, buf)?;
            // SAFETY: the buffer stays untouched until its event (recorded
            // next) completes; `n` bytes at `dst + off` were checked.
            unsafe { driver::memcpy_htod_async(dst + off, buf.as_ptr(), n, &self.res.stream) }
                .at("upload")?;
            driver::event_record(&self.res.staged[b], &self.res.stream).at("upload")?;
            off += n as u64;
            i += 1;
        }
        Ok(())
    }

    /// Device -> host through the staging buffers: the DMA engine fills
    /// one while the host empties the other.
    pub(crate) fn download(&self, src: u64, dst: &dyn HostSink) -> Result<(), Fail> {
        let len = dst.len();
        let mut pending: Option<(usize, u64, usize)> = None;
        let mut off = 0u64;
        let mut i = 0usize;
        let drain = |(b, off, n): (usize, u64, usize)| -> Result<(), Fail> {
            driver::event_sync(&self.res.staged[b]).at("download")?;
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
            unsafe { driver::memcpy_dtoh_async(buf.as_mut_ptr(), src + off, n, &self.res.stream) }
                .at("download")?;
            driver::event_record(&self.res.staged[b], &self.res.stream).at("download")?;
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
    pub(crate) fn run_builtin(&self, call: Builtin, available: u64) -> Result<Duration, Fail> {
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
                        driver::memcpy_dtod_async(ta, a, len as usize, &s.res.stream)
                            .at("vadd_f32")?;
                    }
                    if b_copy && !shared {
                        driver::memcpy_dtod_async(tb, b, len as usize, &s.res.stream)
                            .at("vadd_f32")?;
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
                        driver::memcpy_dtod_async(tx, x, len as usize, &s.res.stream)
                            .at("saxpy_f32")?;
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
                        driver::memcpy_dtod_async(ta, p.a, alen as usize, &s.res.stream)
                            .at("sgemm_f32")?;
                    }
                    if b_copy && !shared {
                        driver::memcpy_dtod_async(tb, p.b, blen as usize, &s.res.stream)
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
        if let Ok(_cur) = Current::push(self.owner.ctx()) {
            let _ = driver::stream_sync(&self.res.stream);
            // SAFETY: `res` is dropped once, here, and not used after.
            unsafe { ManuallyDrop::drop(&mut self.res) };
        }
        // Without the context current, what is in it is left to go with
        // the context, which `owner` (a field, dropped after this)
        // destroys.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(addr: usize, len: usize, mapping: u64) -> HostSlice {
        HostSlice {
            ptr: addr as *mut u8,
            len,
            mapping,
        }
    }

    #[test]
    fn test_neighbours_in_one_mapping_become_one_run() {
        let runs = coalesced(&[
            slice(0x1000, 0x1000, 1),
            slice(0x2000, 0x2000, 1),
            // A gap.
            slice(0x8000, 0x1000, 1),
            // Continues it, but in another mapping.
            slice(0x9000, 0x1000, 2),
            slice(0xa000, 0x1000, 2),
            // Before it: not a continuation.
            slice(0x4000, 0x1000, 2),
        ]);
        let runs: Vec<(usize, usize)> = runs.iter().map(|&(p, l)| (p as usize, l)).collect();
        assert_eq!(
            runs,
            [
                (0x1000, 0x3000),
                (0x8000, 0x1000),
                (0x9000, 0x2000),
                (0x4000, 0x1000)
            ]
        );
        assert!(coalesced(&[]).is_empty());
    }
}
