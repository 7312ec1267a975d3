//! The driver's state: the vGPUs found at `cuInit`, and every object a
//! program created (contexts, modules, functions, streams, events,
//! allocations), each behind a handle number this library checks on
//! every use, so a stale or forged handle is an error, never a crash.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vgpu_guest::{sys, Batch, Device, Dims, Error as GuestError, Function};

use crate::console::Console;
use crate::cu::{self, CUdevice, CUresult, CuResult};
use crate::diag::{check, log};
use crate::graph::{self, Unsafe, Work};
use crate::inflight::{EventMark, Inflight};
use crate::lanes::Lanes;
use crate::objects::{by_handle, Ctx, Func, Library, ModuleObj, Objects, DEFAULT_DYNAMIC_SHARED};

/// The process's driver. CUDA's C API is process-global (any thread may
/// call any entry point with handles made by another), so its state is
/// one value reached from everywhere; it is created once by `cuInit`.
static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

/// Initialises the driver (idempotent, as `cuInit` is).
pub fn init() -> CuResult<&'static Driver> {
    DRIVER.get_or_init(Driver::open).as_ref().map_err(|e| *e)
}

/// The driver, once `cuInit` succeeded.
pub fn driver() -> CuResult<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(*e),
        None => Err(cu::ERROR_NOT_INITIALIZED),
    }
}

/// Lanes wanted per device: `VGPU_CUDA_LANES` (1 keeps every stream on
/// one queue), else as many as the device and [`crate::lanes::MAX_LANES`]
/// allow.
fn lanes_wanted() -> usize {
    std::env::var("VGPU_CUDA_LANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::lanes::MAX_LANES)
        .max(1)
}

/// One vGPU, `/dev/vgpuN`.
pub struct Gpu {
    pub dev: Arc<Device>,
    pub info: sys::VgpuInfo,
    pub name: String,
    pub uuid: [u8; 16],
    /// The primary context's handle.
    pub primary: usize,
    /// Its lanes, each with its queued work ([`crate::lanes`]).
    pub lanes: Lanes,
    /// Modules whose kernels may print.
    console: Mutex<Console>,
}

impl Gpu {
    /// Lane 0's queued work, locked (see [`Driver::objects`] on
    /// poisoning): the default streams', with the managed memory.
    pub fn inflight(&self) -> MutexGuard<'_, Inflight> {
        self.lanes.inflight(0)
    }

    /// Queues `batch` on the legacy default stream without waiting for
    /// it.
    pub fn submit(&self, batch: Batch, mark: Option<EventMark>) -> CuResult {
        self.lanes.submit(0, batch, mark)
    }

    /// Queues `batch` on `lane` without waiting for it.
    pub fn submit_on(&self, lane: usize, batch: Batch, mark: Option<EventMark>) -> CuResult {
        self.lanes.submit(lane, batch, mark)
    }

    /// Submits the work gathered so far without waiting for it.
    pub fn flush(&self) -> CuResult {
        self.lanes.flush()
    }

    /// Waits for the device's queued work; the first failure in it.
    pub fn sync(&self) -> CuResult {
        let r = self.lanes.sync();
        self.print();
        r
    }

    /// Waits for the legacy default stream's queued work and the
    /// blocking streams' (a synchronous copy's wait); the first failure.
    pub fn sync_legacy(&self) -> CuResult {
        let r = self.lanes.sync_legacy();
        self.print();
        r
    }

    /// Waits for `lane`'s queued work (lane 0: all of the device's).
    pub fn sync_lane(&self, lane: usize) -> CuResult {
        let r = self.lanes.sync_lane(lane);
        self.print();
        r
    }

    /// Waits for the device's queued work, leaving a failure in it for the
    /// program's next synchronisation to report.
    pub fn wait_idle(&self) {
        self.lanes.drain();
        self.print();
    }

    fn console(&self) -> MutexGuard<'_, Console> {
        self.console.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes what kernels printed to the program's `stdout`: where
    /// CUDA's driver flushes its printf buffer.
    pub fn print(&self) {
        let mut c = self.console();
        if !c.is_empty() {
            c.print(&self.dev);
        }
    }

    /// Whether `lane`'s queued work (lane 0: the device's) is done,
    /// without waiting.
    pub fn idle(&self, lane: usize) -> CuResult<bool> {
        self.lanes.idle(lane)
    }

    /// Whether record `record` of `event`, on `lane`, is done (with
    /// `wait`, after waiting for it).
    pub fn event_done(&self, lane: usize, event: usize, record: u64, wait: bool) -> CuResult<bool> {
        let done =
            self.lanes
                .inflight(lane)
                .event_done(self.lanes.dev(lane), event, record, wait)?;
        if wait {
            self.print();
        }
        Ok(done)
    }
}

/// What a launch needs of its function: its description and device
/// (`None`: the stream is captured, and the launch recorded).
pub type Target = Option<(Arc<Function>, CUdevice)>;

/// Where a launch's function is ([`Driver::launch_target`]).
enum Look {
    /// On the stream's device.
    Here(Target),
    /// On another device than the stream's, this one.
    Elsewhere(CUdevice),
}

/// The driver: the vGPUs and the objects.
pub struct Driver {
    pub gpus: Vec<Gpu>,
    objects: Mutex<Objects>,
    /// Entry points already reported as not supported.
    unsupported: Mutex<HashSet<&'static str>>,
    /// What `VGPU_CUDA_LOG` asks for: 0 nothing, 1 failures, 2 also
    /// every entry point called, 3 every call.
    logging: u32,
    /// Failures already traced: (entry point's source line, error).
    traced: Mutex<HashSet<(&'static str, u32, CUresult)>>,
}

/// Traces a call (see [`crate::ffi::entry`]) that returned `r`: which
/// entry point and what it returned, the first time, when diagnostics
/// ask for failures (and, at level 2, for every entry point called).
pub fn trace_call(at: &'static std::panic::Location<'static>, r: CUresult) {
    let Some(Ok(d)) = DRIVER.get() else {
        return;
    };
    if d.logging == 0 || (r == cu::SUCCESS && d.logging < 2) {
        return;
    }
    if d.logging >= 3 {
        eprintln!("vgpu-cuda: {}:{} returned {r}", at.file(), at.line());
        return;
    }
    let first =
        d.traced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((at.file(), at.line(), r));
    if first {
        eprintln!("vgpu-cuda: {}:{} returned {r}", at.file(), at.line());
    }
}

/// What an unimplemented entry point does.
pub(crate) fn unsupported(name: &'static str) -> CUresult {
    unsupported_with(name, "")
}

/// [`unsupported`], with what about the call is not supported.
pub(crate) fn unsupported_with(name: &'static str, detail: &str) -> CUresult {
    match driver() {
        Ok(d) => d.not_supported_because(name, detail),
        Err(_) => cu::ERROR_NOT_SUPPORTED,
    }
}

thread_local! {
    /// The calling thread's context stack (top last).
    static CTX_STACK: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Driver {
    fn open() -> Result<Driver, CUresult> {
        let mut gpus = Vec::new();
        let mut objects = Objects::default();
        for (n, path) in Device::list() {
            match Device::open(&path) {
                Ok(dev) => {
                    let info = *dev.cached_info();
                    let primary = objects.handle();
                    let ordinal = gpus.len() as CUdevice;
                    objects.ctxs.insert(primary, Ctx::new(ordinal, 0));
                    let dev = Arc::new(dev);
                    let lanes = Lanes::open(&dev, lanes_wanted());
                    gpus.push(Gpu {
                        dev,
                        lanes,
                        name: format!("vgpud vGPU {n}"),
                        uuid: info.uuid(),
                        info,
                        primary,
                        console: Mutex::new(Console::default()),
                    });
                }
                Err(e) => log(&format!("{}: {e}", path.display())),
            }
        }
        if gpus.is_empty() {
            log("no usable /dev/vgpuN");
            return Err(cu::ERROR_NO_DEVICE);
        }
        objects.primary_refs = vec![0; gpus.len()];
        objects.primary_flags = vec![0; gpus.len()];
        Ok(Driver {
            gpus,
            objects: Mutex::new(objects),
            unsupported: Mutex::new(HashSet::new()),
            logging: match std::env::var("VGPU_CUDA_LOG") {
                Ok(v) => v.parse().unwrap_or(1),
                Err(_) => 0,
            },
            traced: Mutex::new(HashSet::new()),
        })
    }

    /// The objects, locked. A panic while holding the lock (a bug) must
    /// not make every later call fail: the data stays consistent because
    /// each update is a single insert or remove.
    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn gpu(&self, dev: CUdevice) -> CuResult<&Gpu> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.gpus.get(i))
            .ok_or(cu::ERROR_INVALID_DEVICE)
    }

    /// Logs, once per name, that a program called an entry point this
    /// driver does not implement.
    pub fn not_supported(&self, name: &'static str) -> CUresult {
        self.not_supported_because(name, "")
    }

    /// [`Driver::not_supported`], saying what about the call was not.
    pub fn not_supported_because(&self, name: &'static str, detail: &str) -> CUresult {
        let mut seen = self.unsupported.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(name) {
            let sep = if detail.is_empty() { "" } else { ": " };
            eprintln!("vgpu-cuda: {name} is not supported by this driver{sep}{detail}");
        }
        cu::ERROR_NOT_SUPPORTED
    }

    /// The calling thread's current context, if any.
    pub fn current(&self) -> Option<usize> {
        CTX_STACK.with(|s| s.borrow().last().copied())
    }

    /// The current context, or `CUDA_ERROR_INVALID_CONTEXT`.
    pub fn current_ctx(&self) -> CuResult<(usize, CUdevice)> {
        let ctx = self.current().ok_or(cu::ERROR_INVALID_CONTEXT)?;
        let dev = self.ctx_device(ctx)?;
        Ok((ctx, dev))
    }

    /// The device of context `ctx`.
    pub fn ctx_device(&self, ctx: usize) -> CuResult<CUdevice> {
        self.objects()
            .ctxs
            .get(&ctx)
            .map(|c| c.device)
            .ok_or(cu::ERROR_INVALID_CONTEXT)
    }

    /// Replaces the top of the calling thread's stack (`cuCtxSetCurrent`).
    pub fn set_current(&self, ctx: Option<usize>) {
        CTX_STACK.with(|s| {
            let mut s = s.borrow_mut();
            s.pop();
            if let Some(c) = ctx {
                s.push(c);
            }
        });
    }

    pub fn push_current(&self, ctx: usize) {
        CTX_STACK.with(|s| s.borrow_mut().push(ctx));
    }

    pub fn pop_current(&self) -> Option<usize> {
        CTX_STACK.with(|s| s.borrow_mut().pop())
    }

    /// The device behind the current context.
    pub fn current_gpu(&self) -> CuResult<(usize, &Gpu)> {
        let (ctx, dev) = self.current_ctx()?;
        Ok((ctx, self.gpu(dev)?))
    }

    /// The device a stream's work runs on: the stream's context's, or for
    /// the default streams (0, 1 = legacy, 2 = per-thread) the current
    /// context's.
    pub fn stream_gpu(&self, stream: usize) -> CuResult<&Gpu> {
        self.gpu(self.stream_device(stream)?)
    }

    /// The lane of its device a stream's work goes to (the default
    /// streams: 0).
    pub fn stream_lane(&self, stream: usize) -> CuResult<usize> {
        if stream <= 2 {
            return Ok(0);
        }
        let o = self.objects();
        Ok(by_handle(&o.streams, stream)?.lane)
    }

    /// The ordinal of [`Driver::stream_gpu`]'s device.
    pub fn stream_device(&self, stream: usize) -> CuResult<CUdevice> {
        if stream <= 2 {
            return Ok(self.current_ctx()?.1);
        }
        let ctx = by_handle(&self.objects().streams, stream)?.ctx;
        self.ctx_device(ctx)
    }

    /// Refuses a call that a capture in progress cannot record,
    /// invalidating the capture (see [`Objects::refuse_in_capture`]).
    pub fn refuse_in_capture(&self, call: Unsafe) -> CuResult {
        let relaxed = graph::thread_relaxed();
        self.objects().refuse_in_capture(call, relaxed)
    }

    /// Loads a module image (a fatbinary or PTX text) on `dev` and
    /// records its entry points.
    pub fn load_module(&self, dev: CUdevice, image: &[u8]) -> CuResult<usize> {
        let gpu = self.gpu(dev)?;
        let (format, ptx) = module_ptx(image)?;
        let mut kernels = HashSet::new();
        for text in &ptx {
            // The names only; the device's driver compiles the module.
            if let Ok(m) = vgpu_ptx::Module::parse(text) {
                kernels.extend(m.kernels().into_iter().map(|k| k.name));
            }
        }
        // Cubins name their functions in section names; a library that
        // asks the driver to enumerate a module's functions needs them.
        let cubin_functions = if format == sys::MODULE_PTX {
            Vec::new()
        } else {
            vgpu_ptx::function_names(image).unwrap_or_default()
        };
        let module = Arc::new(check(gpu.dev.module_load_format(format, image))?);
        gpu.console().watch(&module);
        let m = ModuleObj {
            device: dev,
            module,
            kernels,
            cubin_functions,
            globals: HashMap::new(),
            library: None,
        };
        Ok(self.objects().add(|o| &mut o.modules, m))
    }

    /// [`Driver::load_module`] of a library: where the process has
    /// several devices, the image is kept to load it on the others.
    pub fn load_library(&self, dev: CUdevice, image: &[u8]) -> CuResult<usize> {
        let h = self.load_module(dev, image)?;
        if self.gpus.len() > 1 {
            if let Some(m) = self.objects().modules.get_mut(&h) {
                m.library = Some(Library {
                    image: image.into(),
                    twins: HashMap::new(),
                });
            }
        }
        Ok(h)
    }

    /// `module` as loaded on device `dev`: itself, or a library's twin
    /// there (loaded now if it is not yet). A module of another device's
    /// context is `CUDA_ERROR_INVALID_HANDLE` there, as in CUDA.
    pub fn module_on(&self, module: usize, dev: CUdevice) -> CuResult<usize> {
        let image = {
            let o = self.objects();
            let m = by_handle(&o.modules, module)?;
            if m.device == dev {
                return Ok(module);
            }
            let lib = m.library.as_ref().ok_or(cu::ERROR_INVALID_HANDLE)?;
            if let Some(&t) = lib.twins.get(&dev) {
                return Ok(t);
            }
            Arc::clone(&lib.image)
        };
        let twin = self.load_module(dev, &image)?;
        let mut o = self.objects();
        let kept = match o.modules.get_mut(&module).and_then(|m| m.library.as_mut()) {
            Some(lib) => Ok(*lib.twins.entry(dev).or_insert(twin)),
            None => Err(cu::ERROR_INVALID_HANDLE),
        };
        drop(o);
        if kept != Ok(twin) {
            // Unloaded, or loaded there by another thread, meanwhile.
            let _ = self.unload_module(twin);
        }
        kept
    }

    /// Function `func` as it runs on device `dev`: itself, or its
    /// library's kernel of the same name on that device.
    pub fn function_on(&self, func: usize, dev: CUdevice) -> CuResult<usize> {
        let (module, name) = {
            let o = self.objects();
            let f = by_handle(&o.funcs, func)?;
            if f.device == dev {
                return Ok(func);
            }
            (f.module, f.cname.clone())
        };
        let twin = self.module_on(module, dev)?;
        self.get_function(twin, name.to_str().map_err(|_| cu::ERROR_INVALID_VALUE)?)
    }

    /// Global `name` of module `module`: its device address and size.
    pub fn get_global(&self, module: usize, name: &str) -> CuResult<(u64, u64)> {
        let (m, device) = {
            let o = self.objects();
            let m = by_handle(&o.modules, module)?;
            if let Some(&g) = m.globals.get(name) {
                return Ok(g);
            }
            (m.module.clone(), m.device)
        };
        let g = match self.gpu(device)?.dev.global(&m, name) {
            Err(GuestError::NotFound) => return Err(cu::ERROR_NOT_FOUND),
            r => check(r)?,
        };
        let ctx = self.current().unwrap_or(0);
        let mut o = self.objects();
        if let Some(m) = o.modules.get_mut(&module) {
            m.globals.insert(name.to_string(), g);
            // cudaMemcpyToSymbol copies to what cuModuleGetGlobal gave.
            o.add_global(module, g.0, g.1, device, ctx);
        }
        Ok(g)
    }

    /// The function `name` of module `module`, as the device describes it.
    pub fn get_function(&self, module: usize, name: &str) -> CuResult<usize> {
        let (m, device) = {
            let o = self.objects();
            let m = by_handle(&o.modules, module)?;
            // One handle per (module, name), as CUDA returns the same
            // CUfunction for repeated look-ups.
            if let Some((&h, _)) = o
                .funcs
                .iter()
                .find(|(_, f)| f.module == module && f.cname.as_bytes() == name.as_bytes())
            {
                return Ok(h);
            }
            (m.module.clone(), m.device)
        };
        let gpu = self.gpu(device)?;
        let function = match gpu.dev.function(&m, name) {
            Err(GuestError::NotFound) => return Err(cu::ERROR_NOT_FOUND),
            r => check(r)?,
        };
        let max_dynamic_shared = DEFAULT_DYNAMIC_SHARED
            .saturating_sub(function.info.shared_static)
            .min(function.info.max_dynamic_shared);
        let cname = std::ffi::CString::new(name).map_err(|_| cu::ERROR_INVALID_VALUE)?;
        let mut o = self.objects();
        if !o.modules.contains_key(&module) {
            // Unloaded by another thread meanwhile.
            return Err(cu::ERROR_INVALID_HANDLE);
        }
        let h = o.handle();
        o.funcs.insert(
            h,
            Func {
                module,
                device,
                function: Arc::new(function),
                cname,
                max_dynamic_shared,
                hints: HashMap::new(),
                clusters: HashMap::new(),
            },
        );
        Ok(h)
    }

    /// Unloads a module and forgets its functions.
    pub fn unload_module(&self, module: usize) -> CuResult {
        let m = {
            let mut o = self.objects();
            o.remove_module(module).ok_or(cu::ERROR_INVALID_HANDLE)?
        };
        // A library's twins on other devices go with it.
        for &twin in m.library.iter().flat_map(|l| l.twins.values()) {
            let _ = self.unload_module(twin);
        }
        // What its kernels printed comes out first, as CUDA's driver
        // flushes its printf buffer at an unload.
        if m.module.prints() {
            if let Ok(gpu) = self.gpu(m.device) {
                gpu.wait_idle();
            }
        }
        // The device unloads it when the last user (a launch in flight
        // on another thread) lets go.
        drop(m);
        Ok(())
    }

    /// What a launch of `func` on `stream` needs to know: the function
    /// that runs (`func`, or its library's twin on the stream's device)
    /// and, from one look at the objects, its description and device
    /// (checked against its dynamic shared memory limit for
    /// `shared_mem`), or `None` where the stream is being captured (the
    /// launch is then recorded, the slower way). The stream must exist.
    pub fn launch_target(
        &self,
        func: usize,
        stream: usize,
        shared_mem: u32,
    ) -> CuResult<(usize, Target)> {
        match self.launch_look(func, stream, shared_mem)? {
            Look::Here(target) => Ok((func, target)),
            Look::Elsewhere(dev) => {
                let twin = self.function_on(func, dev)?;
                match self.launch_look(twin, stream, shared_mem)? {
                    Look::Here(target) => Ok((twin, target)),
                    Look::Elsewhere(_) => Err(cu::ERROR_INVALID_HANDLE),
                }
            }
        }
    }

    /// [`Driver::launch_target`] for `func` as it is.
    fn launch_look(&self, func: usize, stream: usize, shared_mem: u32) -> CuResult<Look> {
        let current = if stream <= 2 {
            Some(self.current().ok_or(cu::ERROR_INVALID_CONTEXT)?)
        } else {
            None
        };
        let o = self.objects();
        let ctx = match current {
            Some(c) => c,
            None => by_handle(&o.streams, stream)?.ctx,
        };
        let dev = o.ctxs.get(&ctx).ok_or(cu::ERROR_INVALID_CONTEXT)?.device;
        let f = by_handle(&o.funcs, func)?;
        if f.device != dev {
            return Ok(Look::Elsewhere(dev));
        }
        if o.capturing.contains_key(&stream) {
            return Ok(Look::Here(None));
        }
        if shared_mem > f.max_dynamic_shared {
            log(&format!(
                "{:?}: {} bytes of dynamic shared memory, the function allows {} (cuFuncSetAttribute raises it)",
                f.cname, shared_mem, f.max_dynamic_shared
            ));
            return Err(cu::ERROR_INVALID_VALUE);
        }
        Ok(Look::Here(Some((Arc::clone(&f.function), f.device))))
    }

    /// Launches `func` on `stream` with its parameters packed as its
    /// layout says.
    pub fn launch(
        &self,
        func: usize,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
        stream: usize,
    ) -> CuResult {
        let (device, work) = self.launch_work(func, dims, cluster, params)?;
        self.queue(stream, device, &[work])
    }

    /// The work of a launch of `func` (checked against its dynamic shared
    /// memory limit), and the device it runs on.
    pub fn launch_work(
        &self,
        func: usize,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
    ) -> CuResult<(CUdevice, Work)> {
        let (function, device) = {
            let o = self.objects();
            let f = by_handle(&o.funcs, func)?;
            if dims.shared_mem > f.max_dynamic_shared {
                log(&format!(
                    "{:?}: {} bytes of dynamic shared memory, the function allows {} (cuFuncSetAttribute raises it)",
                    f.cname, dims.shared_mem, f.max_dynamic_shared
                ));
                return Err(cu::ERROR_INVALID_VALUE);
            }
            (Arc::clone(&f.function), f.device)
        };
        let work = Work::Launch {
            func,
            function,
            dims,
            cluster,
            params: params.into(),
        };
        Ok((device, work))
    }
}

/// The module format and the PTX texts of an image: a fatbinary (as
/// `nvcc` embeds it, starting with its header) or PTX text.
fn module_ptx(image: &[u8]) -> CuResult<(u32, Vec<String>)> {
    let format = if vgpu_ptx::fatbin::is_ptx_text(image) {
        sys::MODULE_PTX
    } else if vgpu_ptx::is_cubin(image) {
        // Machine code for one GPU, no PTX: the device's driver runs it.
        return Ok((sys::MODULE_CUBIN, Vec::new()));
    } else {
        sys::MODULE_FATBIN
    };
    // A fatbinary of cubins alone has no PTX: the device's driver picks
    // the cubin for its GPU.
    let ptx = match vgpu_ptx::extract_ptx(image) {
        Ok(ptx) => ptx,
        Err(vgpu_ptx::FatbinError::NoPtx) => Vec::new(),
        Err(e) => {
            log(&format!("module image: {e}"));
            return Err(cu::ERROR_INVALID_IMAGE);
        }
    };
    Ok((format, ptx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_classified_by_content() {
        let ptx = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n";
        let (format, texts) = module_ptx(ptx).unwrap();
        assert_eq!(format, sys::MODULE_PTX);
        assert_eq!(texts.len(), 1);
        assert_eq!(
            module_ptx(b"\x7fELF....").err(),
            Some(cu::ERROR_INVALID_IMAGE)
        );
        let mut cubin = b"\x7fELF\x02\x01".to_vec();
        cubin.resize(64, 0);
        cubin[18] = 190;
        assert_eq!(module_ptx(&cubin), Ok((sys::MODULE_CUBIN, Vec::new())));
    }
}
