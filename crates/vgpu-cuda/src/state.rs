//! The driver's state: the vGPUs found at `cuInit`, the table of the
//! objects a program created ([`crate::objects`]), and each thread's
//! stack of current contexts.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use vgpu_guest::{sys, Batch, Device};

use crate::console::Console;
use crate::ctx_table::Ctx;
use crate::cu::{self, CUdevice, CUresult, CuResult};
use crate::diag::{log, Sticky};
use crate::inflight::{EventMark, Inflight};
use crate::lanes::Lanes;
use crate::objects::Objects;

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
    /// The open `/dev/vgpuN`.
    pub dev: Arc<Device>,
    /// What the device reported of itself when it was opened.
    pub info: sys::VgpuInfo,
    /// The name `cuDeviceGetName` gives.
    pub name: String,
    /// The UUID `cuDeviceGetUuid` gives.
    pub uuid: [u8; 16],
    /// The primary context's handle.
    pub primary: usize,
    /// Its lanes, each with its queued work ([`crate::lanes`]).
    pub lanes: Lanes,
    /// Modules whose kernels may print.
    console: Mutex<Console>,
    /// The error that ended this process's device context on the vGPU
    /// (a kernel's fault), answered by every later call.
    pub lost: Sticky,
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
        self.lost.get()?;
        self.lost.keep(self.lanes.submit(0, batch, mark))
    }

    /// Queues `batch` on `lane` without waiting for it.
    pub fn submit_on(&self, lane: usize, batch: Batch, mark: Option<EventMark>) -> CuResult {
        self.lost.get()?;
        self.lost.keep(self.lanes.submit(lane, batch, mark))
    }

    /// Submits the work gathered so far without waiting for it.
    pub fn flush(&self) -> CuResult {
        self.lost.get()?;
        self.lost.keep(self.lanes.flush())
    }

    /// Waits for the device's queued work; the first failure in it.
    pub fn sync(&self) -> CuResult {
        self.lost.get()?;
        let r = self.lanes.sync();
        self.print();
        self.lost.keep(r)
    }

    /// Waits for the legacy default stream's queued work and the
    /// blocking streams' (a synchronous copy's wait); the first failure.
    pub fn sync_legacy(&self) -> CuResult {
        self.lost.get()?;
        let r = self.lanes.sync_legacy();
        self.print();
        self.lost.keep(r)
    }

    /// Waits for `lane`'s queued work (lane 0: all of the device's).
    pub fn sync_lane(&self, lane: usize) -> CuResult {
        self.lost.get()?;
        let r = self.lanes.sync_lane(lane);
        self.print();
        self.lost.keep(r)
    }

    /// Waits for the device's queued work, leaving a failure in it for the
    /// program's next synchronisation to report.
    pub fn wait_idle(&self) {
        self.lanes.drain();
        self.print();
    }

    /// The modules whose kernels may print, locked.
    pub fn console(&self) -> MutexGuard<'_, Console> {
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
        self.lost.get()?;
        self.lost.keep(self.lanes.idle(lane))
    }

    /// Whether record `record` of `event`, on `lane`, is done (with
    /// `wait`, after waiting for it).
    pub fn event_done(&self, lane: usize, event: usize, record: u64, wait: bool) -> CuResult<bool> {
        self.lost.get()?;
        let done = self.lost.keep(self.lanes.inflight(lane).event_done(
            self.lanes.dev(lane),
            event,
            record,
            wait,
        ))?;
        if wait {
            self.print();
        }
        Ok(done)
    }
}

/// The driver: the vGPUs and the objects.
pub struct Driver {
    /// The vGPUs, by ordinal.
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

/// JIT options read for entry point `name` (see [`crate::jit::read`]):
/// its refusal of an option the device cannot honour said once, as
/// [`unsupported_with`] says it.
///
/// # Safety
/// As [`crate::jit::read`] requires.
pub(crate) unsafe fn jit_options(
    name: &'static str,
    n: u32,
    options: *const u32,
    values: *mut *mut std::ffi::c_void,
) -> CuResult<crate::jit::JitOutputs> {
    // SAFETY: forwarded to the caller.
    unsafe { crate::jit::read(n, options, values) }.map_err(|e| {
        if e == cu::ERROR_NOT_SUPPORTED {
            unsupported_with(name, crate::jit::UNSUPPORTED)
        } else {
            e
        }
    })
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
                    objects
                        .ctxs_mut()
                        .ctxs
                        .insert(primary, Ctx::new(ordinal, 0));
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
                        lost: Sticky::default(),
                    });
                }
                Err(e) => log(&format!("{}: {e}", path.display())),
            }
        }
        if gpus.is_empty() {
            log("no usable /dev/vgpuN");
            return Err(cu::ERROR_NO_DEVICE);
        }
        objects.ctxs_mut().set_devices(gpus.len());
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

    /// The vGPU of ordinal `dev`, or `CUDA_ERROR_INVALID_DEVICE`.
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
        self.objects().ctxs().ctxs.get(ctx).map(|c| c.device())
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

    /// Pushes `ctx` onto the calling thread's stack (`cuCtxPushCurrent`).
    pub fn push_current(&self, ctx: usize) {
        CTX_STACK.with(|s| s.borrow_mut().push(ctx));
    }

    /// Pops the calling thread's current context (`cuCtxPopCurrent`).
    pub fn pop_current(&self) -> Option<usize> {
        CTX_STACK.with(|s| s.borrow_mut().pop())
    }

    /// The device behind the current context; its sticky error once a
    /// fault ended the process's device context there.
    pub fn current_gpu(&self) -> CuResult<(usize, &Gpu)> {
        let (ctx, dev) = self.current_ctx()?;
        let g = self.gpu(dev)?;
        g.lost.get()?;
        Ok((ctx, g))
    }
}
