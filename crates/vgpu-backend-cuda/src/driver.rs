//! The one home of raw CUDA driver calls (the bindings of `cudarc`):
//! error codes, the current-context guard, device queries, and small
//! owning types for what the driver creates, each destroying it on drop.
//! The rest of the crate reaches the driver only through this module.
//!
//! Every function here expects the driver library to be loadable: callers
//! check [`libraries_present`] before the first call (cudarc panics when a
//! symbol cannot be loaded).

use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use cudarc::driver::sys;

/// Raw handles and enums of the bindings that the rest of the crate
/// passes around (it never calls the driver with them directly).
pub use sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUfunction, CUfunction_attribute,
};

/// Whether libcuda and libnvrtc can be loaded; the error names what is missing.
pub fn libraries_present() -> Result<(), String> {
    // SAFETY: only tries to dlopen the candidate library names and closes
    // what it opened; no symbol is called.
    let cuda = unsafe { sys::is_culib_present() };
    // SAFETY: as above, for the NVRTC library names.
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    match (cuda, nvrtc) {
        (true, true) => Ok(()),
        (false, _) => Err("libcuda (the NVIDIA driver library) cannot be loaded".into()),
        (true, false) => Err("libnvrtc (the CUDA runtime compiler) cannot be loaded".into()),
    }
}

/// A failed driver call: its `CUresult`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CuError(pub sys::CUresult);

impl CuError {
    /// The numeric `CUresult`.
    pub fn code(self) -> u32 {
        self.0 as u32
    }

    /// The driver's name for the code (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn name(self) -> String {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or
        // leaves it alone and fails); `p` is a valid place for it.
        let r = unsafe { sys::cuGetErrorName(self.0, &mut p) };
        if r != sys::CUresult::CUDA_SUCCESS || p.is_null() {
            return format!("{:?}", self.0);
        }
        // SAFETY: on success `p` points to a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// A kernel's memory access faulted: an illegal address, a
    /// misaligned one, or one in the wrong address space (all sticky).
    pub fn is_memory_fault(self) -> bool {
        matches!(self.code(), 700 | 716 | 717)
    }

    /// A kernel's `assert()` failed (sticky).
    pub fn is_assert(self) -> bool {
        self.code() == 710
    }

    /// Whether the error leaves the context unusable ("sticky" errors: a
    /// kernel faulted). Every later call in that context fails the same
    /// way until the context is destroyed.
    pub fn is_sticky(self) -> bool {
        matches!(
            self.code(),
            // ECC uncorrectable, context destroyed, device unavailable
            214 | 709 | 46
            // illegal address, launch timeout, device assert
            | 700 | 702 | 710
            // stack error, illegal instruction, misaligned address,
            // invalid address space, invalid PC, launch failed
            | 714
                ..=719
            // NVLink uncorrectable, unknown
            | 220 | 999
        )
    }

    /// Whether the device ran out of memory.
    pub fn is_out_of_memory(self) -> bool {
        self.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl fmt::Debug for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `Ok` for `CUDA_SUCCESS`.
pub fn ok(r: sys::CUresult) -> Result<(), CuError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError(r))
    }
}

/// Makes a context current on this thread for the guard's life, restoring
/// the previous one after.
pub struct Current {
    /// The context stack is per thread: the guard must not move.
    _not_send: PhantomData<*const ()>,
}

impl Current {
    /// Pushes `ctx` on this thread's context stack.
    pub fn push(ctx: sys::CUcontext) -> Result<Current, CuError> {
        // SAFETY: `ctx` is a live context handle owned by the caller, which
        // keeps it alive for the guard's life.
        ok(unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Current {
            _not_send: PhantomData,
        })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context this guard pushed on this thread.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// Initialises the driver (`cuInit(0)`).
pub fn init() -> Result<(), CuError> {
    // SAFETY: plain driver initialisation; the library is loadable.
    ok(unsafe { sys::cuInit(0) })
}

/// The device of ordinal `ordinal`.
pub fn device_get(ordinal: i32) -> Result<CUdevice, CuError> {
    let mut device: sys::CUdevice = 0;
    // SAFETY: `device` is a valid out pointer.
    ok(unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
    Ok(device)
}

/// The device's name (`cuDeviceGetName`, through cudarc), if the driver
/// tells it.
pub fn device_name(dev: CUdevice) -> Option<String> {
    cudarc::driver::result::device::get_name(dev).ok()
}

/// Bytes of memory of the device.
pub fn device_total_mem(dev: CUdevice) -> Result<usize, CuError> {
    let mut memory = 0usize;
    // SAFETY: `dev` came from cuDeviceGet; `memory` is a valid out pointer.
    ok(unsafe { sys::cuDeviceTotalMem_v2(&mut memory, dev) })?;
    Ok(memory)
}

/// An SM resource: all the SMs of a device ([`device_sm_resource`]) or a
/// group of them ([`sm_split_by_count`]). Only the driver fills one.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct SmResource(sys::CUdevResource);

impl SmResource {
    fn sm(&self) -> sys::CUdevSmResource {
        // SAFETY: every SmResource is an SM resource the driver filled
        // (cuDeviceGetDevResource of type SM, or a split of one), so `sm`
        // is the live field of the union.
        unsafe { self.0.__bindgen_anon_1.sm }
    }

    /// SMs in the resource.
    pub fn sm_count(&self) -> u32 {
        self.sm().smCount
    }

    /// The smallest group a split of it can make.
    pub fn min_partition_size(&self) -> u32 {
        self.sm().minSmPartitionSize
    }

    /// The multiple of SMs a split's groups come in.
    pub fn coscheduled_alignment(&self) -> u32 {
        self.sm().smCoscheduledAlignment
    }
}

/// All the SMs of the device.
pub fn device_sm_resource(dev: CUdevice) -> Result<SmResource, CuError> {
    // SAFETY: CUdevResource is a plain C struct (integers, byte arrays and
    // a union of such) for which all-zero bytes are a valid value.
    let mut whole: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: `whole` is a valid out pointer for one resource.
    ok(unsafe {
        sys::cuDeviceGetDevResource(
            dev,
            &mut whole,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    })?;
    Ok(SmResource(whole))
}

/// Splits `whole` into at most `count` groups of at least `min_count` SMs
/// (`cuDevSmResourceSplitByCount`, no flags); returns the groups made and
/// the SMs left over.
pub fn sm_split_by_count(
    whole: &SmResource,
    count: u32,
    min_count: u32,
) -> Result<(Vec<SmResource>, SmResource), CuError> {
    let mut count = count;
    // SAFETY: as in `device_sm_resource`, all-zero resources are valid
    // placeholders.
    let mut out: Vec<sys::CUdevResource> = vec![unsafe { std::mem::zeroed() }; count as usize];
    // SAFETY: as above.
    let mut remaining: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: `out` has room for `count` resources, as `count` says;
    // `whole` is an SM resource from cuDeviceGetDevResource.
    ok(unsafe {
        sys::cuDevSmResourceSplitByCount(
            out.as_mut_ptr(),
            &mut count,
            &whole.0,
            &mut remaining,
            0,
            min_count,
        )
    })?;
    out.truncate(count as usize);
    Ok((
        out.into_iter().map(SmResource).collect(),
        SmResource(remaining),
    ))
}

/// A resource descriptor (`cuDevResourceGenerateDesc`), to create a green
/// context from. The driver has no call to destroy one: it stays valid for
/// the process.
#[derive(Clone, Copy)]
pub struct ResourceDesc(sys::CUdevResourceDesc);

/// The resource descriptor of `groups`, SM groups of one split of the
/// device.
pub fn resource_desc(groups: &[SmResource]) -> Result<ResourceDesc, CuError> {
    let mut res: Vec<sys::CUdevResource> = groups.iter().map(|g| g.0).collect();
    let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
    // SAFETY: `res` holds `res.len()` SM resources, as the count says (the
    // driver refuses resources that cannot be combined); valid out pointer.
    ok(unsafe { sys::cuDevResourceGenerateDesc(&mut desc, res.as_mut_ptr(), res.len() as u32) })?;
    Ok(ResourceDesc(desc))
}

/// Declares `$name`, owning a raw driver handle that `$destroy` destroys
/// on drop; the conditions that destroy call needs are in the type's doc.
macro_rules! owned_handle {
    ($(#[$doc:meta])* $name:ident($raw:ty), $destroy:path) => {
        $(#[$doc])*
        pub struct $name($raw);

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: `self.0` is the live handle this type's constructor
                // made; only this drop destroys it, once, as its doc says.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    };
}

owned_handle! {
    /// A context of its own (`cuCtxCreate`), destroyed on drop, when it is
    /// current nowhere (every user pops it when done).
    Context(sys::CUcontext),
    sys::cuCtxDestroy_v2
}

impl Context {
    /// Creates a context on `device`, with no special parameters, and
    /// takes it off this thread's context stack, where cuCtxCreate leaves
    /// it (users push it when they need it).
    pub fn create(device: CUdevice) -> Result<Context, CuError> {
        let mut params = sys::CUctxCreateParams {
            execAffinityParams: std::ptr::null_mut(),
            numExecAffinityParams: 0,
            cigParams: std::ptr::null_mut(),
        };
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer and a params struct asking for nothing
        // special; `device` came from cuDeviceGet.
        ok(unsafe { sys::cuCtxCreate_v4(&mut ctx, &mut params, 0, device) })?;
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context just pushed by cuCtxCreate.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        Ok(Context(ctx))
    }

    /// The context, to make current; valid while this lives.
    pub fn handle(&self) -> CUcontext {
        self.0
    }
}

owned_handle! {
    /// A green context (`cuGreenCtxCreate`) of the device's primary context,
    /// destroyed on drop.
    GreenContext(sys::CUgreenCtx),
    sys::cuGreenCtxDestroy
}

impl GreenContext {
    /// Creates a green context on `device` from `desc`, with the
    /// `DEFAULT_STREAM` flag the API requires.
    pub fn create(desc: ResourceDesc, device: CUdevice) -> Result<GreenContext, CuError> {
        let mut g: sys::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: `desc` came from cuDevResourceGenerateDesc (the only way
        // to make a ResourceDesc) with SM groups of this device; valid out
        // pointer.
        ok(unsafe {
            sys::cuGreenCtxCreate(
                &mut g,
                desc.0,
                device,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        })?;
        Ok(GreenContext(g))
    }

    /// Its context (`cuCtxFromGreenCtx`), to make current; valid while
    /// this lives.
    pub fn context(&self) -> Result<CUcontext, CuError> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `self.0` is a live green context; valid out pointer.
        ok(unsafe { sys::cuCtxFromGreenCtx(&mut ctx, self.0) })?;
        Ok(ctx)
    }
}

owned_handle! {
    /// A non-blocking stream, destroyed on drop (queued work still
    /// completes); its owner drops it with the stream's context current.
    Stream(sys::CUstream),
    sys::cuStreamDestroy_v2
}

impl Stream {
    /// A stream of the current context (`cuStreamCreate`).
    pub fn create() -> Result<Stream, CuError> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out pointer; a context is current (callers hold a
        // `Current`).
        ok(unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream(s))
    }

    /// A stream of green context `g` (`cuGreenCtxStreamCreate`, priority 0).
    pub fn create_in(g: &GreenContext) -> Result<Stream, CuError> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `g` is a live green context; valid out pointer;
        // NON_BLOCKING is the flag the API requires.
        ok(unsafe {
            sys::cuGreenCtxStreamCreate(
                &mut s,
                g.0,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                0,
            )
        })?;
        Ok(Stream(s))
    }
}

owned_handle! {
    /// An event (`cuEventCreate`), destroyed on drop.
    Event(sys::CUevent),
    sys::cuEventDestroy_v2
}

impl Event {
    /// A timing event, or one without timing (cheaper to record), in the
    /// current context.
    pub fn create(timing: bool) -> Result<Event, CuError> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `e` is a valid out pointer; a context is current.
        ok(unsafe { sys::cuEventCreate(&mut e, flags) })?;
        Ok(Event(e))
    }
}

/// Device memory (`cuMemAlloc`) freed on drop, with its context current.
pub struct DeviceMem(sys::CUdeviceptr);

impl DeviceMem {
    /// Allocates `size` bytes in the current context.
    pub fn alloc(size: usize) -> Result<DeviceMem, CuError> {
        mem_alloc(size).map(DeviceMem)
    }

    /// Its device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.0
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        let _ = mem_free(self.0);
    }
}

/// Page-locked host memory (`cuMemAllocHost`) freed on drop.
pub struct PinnedHost(*mut u8);

impl PinnedHost {
    /// Allocates `size` bytes in the current context.
    pub fn alloc(size: usize) -> Result<PinnedHost, CuError> {
        mem_alloc_host(size).map(PinnedHost)
    }

    /// Its first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.0
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let _ = mem_free_host(self.0);
    }
}

/// The device's primary context, retained (`cuDevicePrimaryCtxRetain`)
/// while this lives and released on drop.
pub struct PrimaryContext {
    device: CUdevice,
    ctx: CUcontext,
}

impl PrimaryContext {
    /// Retains the primary context of `device`.
    pub fn retain(device: CUdevice) -> Result<PrimaryContext, CuError> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer; `device` came from cuDeviceGet.
        ok(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
        Ok(PrimaryContext { device, ctx })
    }

    /// The context, to make current; valid while this lives.
    pub fn handle(&self) -> CUcontext {
        self.ctx
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: retained once in `retain`, released once here. Owners
        // drop it only after what they made in it (green contexts, host
        // registrations) is gone.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Host memory registered with the driver (`cuMemHostRegister`) in a
/// context; unregistered on drop, or by [`HostRegistration::unregister`],
/// which tells how that went.
#[derive(Debug)]
pub struct HostRegistration {
    ctx: CUcontext,
    addr: usize,
}

impl HostRegistration {
    /// Registers `len` bytes at `addr`, `PORTABLE` (and `READ_ONLY` unless
    /// `writable`), with `ctx` current for the call.
    ///
    /// # Safety
    /// `len` bytes at `addr` must be a mapping of this process that stays
    /// mapped until the registration is dropped or unregistered, and `ctx`
    /// must stay alive until then too.
    pub unsafe fn register(
        ctx: CUcontext,
        addr: usize,
        len: usize,
        writable: bool,
    ) -> Result<HostRegistration, CuError> {
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if !writable {
            flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        let _cur = Current::push(ctx)?;
        // SAFETY: forwarded to the caller.
        ok(unsafe { sys::cuMemHostRegister_v2(addr as *mut _, len, flags) })?;
        Ok(HostRegistration { ctx, addr })
    }

    /// Unregisters the memory now.
    pub fn unregister(self) -> Result<(), CuError> {
        let r = self.release();
        // Released above: the drop must not unregister it again.
        std::mem::forget(self);
        r
    }

    fn release(&self) -> Result<(), CuError> {
        let _cur = Current::push(self.ctx)?;
        // SAFETY: `addr` was registered by `register` and is unregistered
        // once: `unregister` consumes the registration without dropping it.
        ok(unsafe { sys::cuMemHostUnregister(self.addr as *mut _) })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// A device attribute.
pub fn device_attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, CuError> {
    let mut v = 0;
    // SAFETY: `dev` came from cuDeviceGet; `v` is a valid out pointer.
    ok(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) })?;
    Ok(v)
}

/// Allocates `size` bytes of device memory in the current context.
pub fn mem_alloc(size: usize) -> Result<sys::CUdeviceptr, CuError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; a context is current (callers
    // hold a `Current`).
    ok(unsafe { sys::cuMemAlloc_v2(&mut p, size) })?;
    Ok(p)
}

/// Frees device memory from [`mem_alloc`].
pub fn mem_free(p: sys::CUdeviceptr) -> Result<(), CuError> {
    // SAFETY: `p` came from cuMemAlloc in the current context and is freed
    // once (callers remove it from their tables first).
    ok(unsafe { sys::cuMemFree_v2(p) })
}

/// Allocates `size` bytes of page-locked host memory in the current context.
pub fn mem_alloc_host(size: usize) -> Result<*mut u8, CuError> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out pointer; a context is current.
    ok(unsafe { sys::cuMemAllocHost_v2(&mut p, size) })?;
    Ok(p.cast())
}

/// Frees memory from [`mem_alloc_host`].
pub fn mem_free_host(p: *mut u8) -> Result<(), CuError> {
    // SAFETY: `p` came from cuMemAllocHost and is freed once.
    ok(unsafe { sys::cuMemFreeHost(p.cast()) })
}

/// Records `e` on `s`.
pub fn event_record(e: &Event, s: &Stream) -> Result<(), CuError> {
    // SAFETY: both handles are live and belong to the current context.
    ok(unsafe { sys::cuEventRecord(e.0, s.0) })
}

/// Waits for `e`.
pub fn event_sync(e: &Event) -> Result<(), CuError> {
    // SAFETY: `e` is a live event.
    ok(unsafe { sys::cuEventSynchronize(e.0) })
}

/// Whether the work before `e` is done; an error of that work is
/// returned as it is.
pub fn event_query(e: &Event) -> Result<bool, CuError> {
    // SAFETY: `e` is a live event.
    match ok(unsafe { sys::cuEventQuery(e.0) }) {
        Ok(()) => Ok(true),
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        Err(e) => Err(e),
    }
}

/// Time between two completed timing events.
pub fn event_elapsed(start: &Event, end: &Event) -> Result<Duration, CuError> {
    let mut ms = 0f32;
    // SAFETY: both are live timing events that have completed.
    ok(unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.0, end.0) })?;
    Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
}

/// Waits for all work on `s`.
pub fn stream_sync(s: &Stream) -> Result<(), CuError> {
    // SAFETY: `s` is a live stream.
    ok(unsafe { sys::cuStreamSynchronize(s.0) })
}

/// Copies `len` bytes host -> device, asynchronously on `s`.
///
/// # Safety
/// `src` must stay valid and unchanged until the copy completes; `dst`
/// must be `len` bytes of device memory.
pub unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const u8,
    len: usize,
    s: &Stream,
) -> Result<(), CuError> {
    // SAFETY: forwarded to the caller.
    ok(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, s.0) })
}

/// Copies `len` bytes device -> host, asynchronously on `s`.
///
/// # Safety
/// `dst` must stay valid and unused until the copy completes; `src` must
/// be `len` bytes of device memory.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: sys::CUdeviceptr,
    len: usize,
    s: &Stream,
) -> Result<(), CuError> {
    // SAFETY: forwarded to the caller.
    ok(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, s.0) })
}

/// Copies `len` bytes device -> device, asynchronously on `s`.
pub fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
    s: &Stream,
) -> Result<(), CuError> {
    // SAFETY: device-to-device copies touch only device memory; callers
    // have checked both ranges against their allocation tables (a bad
    // range is reported by the driver, not undefined behaviour here).
    ok(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, s.0) })
}

/// What [`memset_async`] repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// A byte.
    Byte(u8),
    /// A 32-bit word; the destination is 4-byte aligned.
    Word(u32),
}

/// Sets `count` bytes or words (as `fill` says) at `dst` to the value of
/// `fill`, on `s`.
pub fn memset_async(
    dst: sys::CUdeviceptr,
    fill: Fill,
    count: usize,
    s: &Stream,
) -> Result<(), CuError> {
    // SAFETY: touches only device memory the caller checked.
    ok(unsafe {
        match fill {
            Fill::Byte(v) => sys::cuMemsetD8Async(dst, v, count, s.0),
            Fill::Word(v) => sys::cuMemsetD32Async(dst, v, count, s.0),
        }
    })
}

/// Looks up a kernel of a loaded module; `None` when it has no such entry.
pub fn module_function(module: &Module, name: &CStr) -> Result<Option<sys::CUfunction>, CuError> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `module` is a live module of the current context; `name` is
    // NUL-terminated; `f` is a valid out pointer.
    let r = unsafe { sys::cuModuleGetFunction(&mut f, module.0, name.as_ptr()) };
    if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
        return Ok(None);
    }
    ok(r)?;
    Ok(Some(f))
}

/// The device address and size of global `name` of `module`, or `None`
/// if it has none of that name.
pub fn module_global(module: &Module, name: &CStr) -> Result<Option<(u64, usize)>, CuError> {
    let (mut dptr, mut bytes) = (0, 0usize);
    // SAFETY: `module` is a live module of the current context; `name` is
    // NUL-terminated; both out pointers are valid.
    let r = unsafe { sys::cuModuleGetGlobal_v2(&mut dptr, &mut bytes, module.0, name.as_ptr()) };
    if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
        return Ok(None);
    }
    ok(r)?;
    Ok(Some((dptr, bytes)))
}

/// A function attribute.
pub fn function_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> Result<i32, CuError> {
    let mut v = 0;
    // SAFETY: `f` is a live function handle; `v` a valid out pointer.
    ok(unsafe { sys::cuFuncGetAttribute(&mut v, attr, f) })?;
    Ok(v)
}

/// Sets a function attribute (the dynamic shared memory a launch may
/// use, above the default 48 KiB).
pub fn set_function_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: i32,
) -> Result<(), CuError> {
    // SAFETY: `f` is a live function handle.
    ok(unsafe { sys::cuFuncSetAttribute(f, attr, value) })
}

/// `f`'s parameters in order, (offset, size) each, or `None` if the
/// driver cannot tell (`cuFuncGetParamInfo` needs a 12.4 driver).
pub fn function_params(f: sys::CUfunction, max: usize) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    for index in 0..=max {
        let (mut off, mut size) = (0usize, 0usize);
        // SAFETY: `f` is a live function handle; both out pointers are valid.
        let r = unsafe { sys::cuFuncGetParamInfo(f, index, &mut off, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS if index < max => out.push((off, size)),
            // Past the last parameter.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Some(out),
            _ => return None,
        }
    }
    None
}

/// Launches `f` with an array of pointers to its arguments.
///
/// # Safety
/// `args` must point to one value of each of `f`'s parameter types, in
/// order, and every device pointer among them must be valid for what the
/// kernel does with it.
pub unsafe fn launch(
    f: sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    s: &Stream,
    args: &mut [*mut c_void],
) -> Result<(), CuError> {
    let params = if args.is_empty() {
        std::ptr::null_mut()
    } else {
        args.as_mut_ptr()
    };
    // SAFETY: forwarded to the caller.
    unsafe {
        launch_kernel(
            f,
            [grid, block],
            shared_mem,
            s,
            params,
            std::ptr::null_mut(),
        )
    }
}

/// `cuLaunchKernel` of `f` on `s`, its parameters given one of the two
/// ways the driver takes them: `params`, an array of pointers to each, or
/// `extra`, the END-terminated list naming one packed buffer. The other
/// is null (both are for a kernel without parameters).
///
/// # Safety
/// As [`launch`] for `params`, as [`launch_packed`] for `extra`; what
/// either points to outlives the call.
unsafe fn launch_kernel(
    f: sys::CUfunction,
    [grid, block]: [[u32; 3]; 2],
    shared_mem: u32,
    s: &Stream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CuError> {
    // SAFETY: forwarded to the caller.
    ok(unsafe {
        sys::cuLaunchKernel(
            f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_mem, s.0, params,
            extra,
        )
    })
}

/// Launches `f` with its parameter block packed in `buf` (as a guest
/// hands it over), in clusters of `cluster` blocks unless that is
/// [1, 1, 1], as a cooperative launch (every block resident at once,
/// `cuLaunchCooperativeKernel`'s) if `cooperative`.
///
/// # Safety
/// `buf` must hold `f`'s parameters in its parameter layout; any device
/// pointer in it is used by the kernel as is (the context's address space
/// is what confines it).
pub unsafe fn launch_packed(
    f: sys::CUfunction,
    [grid, block]: [[u32; 3]; 2],
    (cluster, cooperative): ([u32; 3], bool),
    shared_mem: u32,
    s: &Stream,
    buf: &[u8],
) -> Result<(), CuError> {
    // The driver reads the buffer during the call; keep it 8-byte aligned.
    let mut aligned = vec![0u64; buf.len().div_ceil(8).max(1)];
    // SAFETY: `aligned` has at least `buf.len()` bytes; u64 has no invalid
    // bit patterns.
    unsafe {
        std::ptr::copy_nonoverlapping(buf.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), buf.len())
    };
    let mut size = buf.len();
    let mut extra: [*mut c_void; 5] = [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
        aligned.as_mut_ptr().cast(),
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
        (&mut size as *mut usize).cast(),
        sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
    ];
    // A kernel without parameters takes no buffer.
    let extra_ptr = if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        extra.as_mut_ptr()
    };
    if cluster == [1, 1, 1] && !cooperative {
        // SAFETY: `extra` is the documented END-terminated list; the
        // buffer and its size outlive the call; the rest is forwarded to
        // the caller.
        return unsafe {
            launch_kernel(
                f,
                [grid, block],
                shared_mem,
                s,
                std::ptr::null_mut(),
                extra_ptr,
            )
        };
    }
    let mut attrs = Vec::with_capacity(2);
    if cluster != [1, 1, 1] {
        attrs.push(cluster_attribute(cluster));
    }
    if cooperative {
        attrs.push(cooperative_attribute());
    }
    let config = launch_config([grid, block], shared_mem, s, &mut attrs);
    // SAFETY: as above; `config` and its attributes outlive the call.
    ok(unsafe { sys::cuLaunchKernelEx(&config, f, std::ptr::null_mut(), extra_ptr) })
}

/// The launch attribute that makes a launch cooperative.
fn cooperative_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: the value union holds plain integers only; all zeros is
    // valid for each member.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.cooperative = 1;
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        pad: [0; 4],
        value,
    }
}

/// The launch attribute that asks for clusters of `cluster` blocks.
fn cluster_attribute(cluster: [u32; 3]) -> sys::CUlaunchAttribute {
    // SAFETY: the value union holds plain integers only; all zeros is
    // valid for each member.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster[0],
        y: cluster[1],
        z: cluster[2],
    };
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value,
    }
}

/// A launch configuration with attributes `attrs`, which must outlive
/// its use.
fn launch_config(
    [grid, block]: [[u32; 3]; 2],
    shared_mem: u32,
    s: &Stream,
    attrs: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared_mem,
        hStream: s.0,
        attrs: attrs.as_mut_ptr(),
        // At most two attributes.
        numAttrs: attrs.len() as u32,
    }
}

/// How many clusters of `cluster` blocks of `block` threads, each block
/// with `shared_mem` bytes of dynamic shared memory, of kernel `f` can be
/// resident on the device at once (`cuOccupancyMaxActiveClusters`).
pub fn max_active_clusters(
    f: sys::CUfunction,
    block: [u32; 3],
    cluster: [u32; 3],
    shared_mem: u32,
    s: &Stream,
) -> Result<i32, CuError> {
    let mut attr = [cluster_attribute(cluster)];
    // One cluster's grid: the driver wants the grid to be whole clusters.
    let config = launch_config([cluster, block], shared_mem, s, &mut attr);
    let mut n = 0;
    // SAFETY: `f` is a live kernel of the current context; `config` and
    // its attribute outlive the call, which only reads them.
    ok(unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &config) })?;
    Ok(n)
}

/// A module image as the driver reads it from a bare pointer: PTX with
/// its NUL, or a fatbinary, in 8-byte aligned memory.
pub struct ModuleImage(Vec<u64>);

impl ModuleImage {
    /// PTX text (without NUL).
    pub fn ptx(text: &[u8]) -> ModuleImage {
        let mut bytes = text.to_vec();
        bytes.push(0);
        ModuleImage::aligned(&bytes)
    }

    /// A fatbinary or cubin whose headers were checked to lie inside
    /// `image`.
    pub fn binary(image: &[u8]) -> ModuleImage {
        ModuleImage::aligned(image)
    }

    fn aligned(bytes: &[u8]) -> ModuleImage {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_ne_bytes(b);
        }
        ModuleImage(words)
    }

    fn as_ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// Loads a module image in the current context. On failure the JIT's
/// error log comes back with the error.
pub fn module_load(image: &ModuleImage) -> Result<Module, (CuError, String)> {
    const LOG: usize = 16 << 10;
    let mut error_log = vec![0u8; LOG];
    let mut opts = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut vals: [*mut c_void; 2] = [error_log.as_mut_ptr().cast(), LOG as *mut c_void];
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is NUL-terminated PTX or a fatbinary whose headers
    // were checked to lie inside it, aligned, and outlives the call; the option
    // arrays have the same length, passed as the count; the log buffer is
    // LOG bytes as its size option says.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut m,
            image.as_ptr().cast(),
            opts.len() as u32,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    };
    match ok(r) {
        Ok(()) => Ok(Module(m)),
        Err(e) => {
            let end = error_log.iter().position(|&b| b == 0).unwrap_or(LOG);
            let log = String::from_utf8_lossy(&error_log[..end])
                .trim()
                .to_string();
            Err((e, log))
        }
    }
}

/// A loaded module (from [`module_load_ptx`]), unloaded on drop, with
/// its context current.
pub struct Module(sys::CUmodule);

impl Module {
    /// Unloads the module now, telling how that went.
    pub fn unload(self) -> Result<(), CuError> {
        let r = self.release();
        // Unloaded above: the drop must not unload it again.
        std::mem::forget(self);
        r
    }

    /// Forgets the module without unloading it: its context is about to
    /// be destroyed, which unloads it.
    pub fn forget(self) {
        std::mem::forget(self);
    }

    fn release(&self) -> Result<(), CuError> {
        // SAFETY: `self.0` is a live module, unloaded once: `unload` and
        // `forget` consume the module without dropping it.
        ok(unsafe { sys::cuModuleUnload(self.0) })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Virtual memory management: the allocation properties of pinned
/// device memory on `device`, no shareable handle.
fn vmm_prop(device: CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all zeros is its documented default
    // (no handle types, no flags).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

/// The smallest granularity of virtual memory mappings on `device`
/// (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`).
pub fn mem_granularity(device: CUdevice) -> Result<usize, CuError> {
    let prop = vmm_prop(device);
    let mut g = 0usize;
    // SAFETY: valid out pointer and properties.
    ok(unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(g)
}

/// Reserves `size` bytes of device addresses aligned to `align`, at
/// `addr` if the driver can (0: anywhere).
pub fn mem_address_reserve(size: usize, align: usize, addr: u64) -> Result<u64, CuError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; the driver checks the values.
    ok(unsafe { sys::cuMemAddressReserve(&mut p, size, align, addr, 0) })?;
    Ok(p)
}

/// Frees a reservation.
pub fn mem_address_free(addr: u64, size: usize) -> Result<(), CuError> {
    // SAFETY: plain values the driver checks.
    ok(unsafe { sys::cuMemAddressFree(addr, size) })
}

/// Makes a physical allocation of `size` bytes on `device`.
pub fn mem_create(size: usize, device: CUdevice) -> Result<u64, CuError> {
    let prop = vmm_prop(device);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer and properties.
    ok(unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) })?;
    Ok(h)
}

/// Releases a physical allocation.
pub fn mem_release(handle: u64) -> Result<(), CuError> {
    // SAFETY: a handle `mem_create` returned, released once.
    ok(unsafe { sys::cuMemRelease(handle) })
}

/// Maps `size` bytes of `handle` from `offset` at `addr`.
pub fn mem_map(addr: u64, size: usize, offset: usize, handle: u64) -> Result<(), CuError> {
    // SAFETY: plain values the driver checks.
    ok(unsafe { sys::cuMemMap(addr, size, offset, handle, 0) })
}

/// Unmaps `[addr, addr + size)`.
pub fn mem_unmap(addr: u64, size: usize) -> Result<(), CuError> {
    // SAFETY: plain values the driver checks; no work of the context
    // uses the range any more (the caller drained its streams).
    ok(unsafe { sys::cuMemUnmap(addr, size) })
}

/// Sets `device`'s access to `[addr, addr + size)`: `abi`'s
/// `MEM_ACCESS_*`, which are CUDA's `CU_MEM_ACCESS_FLAGS_PROT_*`.
pub fn mem_set_access(
    addr: u64,
    size: usize,
    device: CUdevice,
    access: u32,
) -> Result<(), CuError> {
    use sys::CUmemAccess_flags as F;
    let flags = match access {
        1 => F::CU_MEM_ACCESS_FLAGS_PROT_READ,
        3 => F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        _ => F::CU_MEM_ACCESS_FLAGS_PROT_NONE,
    };
    let desc = sys::CUmemAccessDesc {
        location: vmm_prop(device).location,
        flags,
    };
    // SAFETY: one valid descriptor.
    ok(unsafe { sys::cuMemSetAccess(addr, size, &desc, 1) })
}

pub use sys::{CUaddress_mode, CUarray_format, CUfilter_mode};

owned_handle! {
    /// A CUDA array (`cuArray3DCreate`), destroyed on drop: dropped with
    /// its context current.
    Array(sys::CUarray),
    sys::cuArrayDestroy
}

owned_handle! {
    /// A texture object (`cuTexObjectCreate`), destroyed on drop, with its
    /// context current.
    TexObject(sys::CUtexObject),
    sys::cuTexObjectDestroy
}

owned_handle! {
    /// A surface object (`cuSurfObjectCreate`), destroyed on drop, with
    /// its context current.
    SurfObject(sys::CUsurfObject),
    sys::cuSurfObjectDestroy
}

/// The shape of an array to make.
#[derive(Debug, Clone, Copy)]
pub struct ArrayShape {
    /// Elements along x, y (0: 1D) and z or layers (0: 1D or 2D).
    pub extent: [usize; 3],
    /// Element type.
    pub format: CUarray_format,
    /// Channels: 1, 2 or 4.
    pub channels: u32,
    /// `CUDA_ARRAY3D_*` flags.
    pub flags: u32,
}

/// `CUDA_ARRAY3D_LAYERED`.
pub const ARRAY_LAYERED: u32 = sys::CUDA_ARRAY3D_LAYERED;
/// `CUDA_ARRAY3D_SURFACE_LDST`.
pub const ARRAY_SURFACE_LDST: u32 = sys::CUDA_ARRAY3D_SURFACE_LDST;
/// `CUDA_ARRAY3D_CUBEMAP`.
pub const ARRAY_CUBEMAP: u32 = sys::CUDA_ARRAY3D_CUBEMAP;

impl Array {
    /// Makes an array in the current context.
    pub fn create(shape: &ArrayShape) -> Result<Array, CuError> {
        let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: shape.extent[0],
            Height: shape.extent[1],
            Depth: shape.extent[2],
            Format: shape.format,
            NumChannels: shape.channels,
            Flags: shape.flags,
        };
        let mut a: sys::CUarray = std::ptr::null_mut();
        // SAFETY: `a` and `desc` are valid for the call; a context is
        // current.
        ok(unsafe { sys::cuArray3DCreate_v2(&mut a, &desc) })?;
        Ok(Array(a))
    }

    /// The driver's handle.
    pub fn handle(&self) -> sys::CUarray {
        self.0
    }
}

/// One end of an array copy.
#[derive(Debug, Clone, Copy)]
pub enum CopyEnd {
    /// Device memory: address of the box's first byte's row 0 and slice
    /// 0, pitch and rows per slice.
    Device {
        /// Base address.
        ptr: CUdeviceptr,
        /// Bytes per row.
        pitch: usize,
        /// Rows per slice.
        height: usize,
    },
    /// An array.
    Array(sys::CUarray),
}

/// `cuMemcpy3DAsync` of a box of `extent` (bytes, rows, slices) from
/// `src` at `src_pos` to `dst` at `dst_pos` on `s`.
pub fn memcpy3d_async(
    (src, src_pos): (CopyEnd, [usize; 3]),
    (dst, dst_pos): (CopyEnd, [usize; 3]),
    extent: [usize; 3],
    s: &Stream,
) -> Result<(), CuError> {
    let mut p = sys::CUDA_MEMCPY3D {
        srcXInBytes: src_pos[0],
        srcY: src_pos[1],
        srcZ: src_pos[2],
        srcLOD: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: dst_pos[0],
        dstY: dst_pos[1],
        dstZ: dst_pos[2],
        dstLOD: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: extent[0],
        Height: extent[1],
        Depth: extent[2],
    };
    match src {
        CopyEnd::Device { ptr, pitch, height } => {
            p.srcDevice = ptr;
            p.srcPitch = pitch;
            p.srcHeight = height;
        }
        CopyEnd::Array(a) => {
            p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_ARRAY;
            p.srcArray = a;
        }
    }
    match dst {
        CopyEnd::Device { ptr, pitch, height } => {
            p.dstDevice = ptr;
            p.dstPitch = pitch;
            p.dstHeight = height;
        }
        CopyEnd::Array(a) => {
            p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_ARRAY;
            p.dstArray = a;
        }
    }
    // SAFETY: `p` names device memory and arrays of the current context,
    // checked by the caller to hold the box; no host memory.
    ok(unsafe { sys::cuMemcpy3DAsync_v2(&p, s.0) })
}

/// What a texture or surface object reads.
#[derive(Debug, Clone, Copy)]
pub enum TexResource {
    /// An array.
    Array(sys::CUarray),
    /// Linear device memory.
    Linear {
        /// Address.
        ptr: CUdeviceptr,
        /// Element type.
        format: CUarray_format,
        /// Channels.
        channels: u32,
        /// Bytes.
        size: usize,
    },
    /// Pitched device memory.
    Pitch2D {
        /// Address.
        ptr: CUdeviceptr,
        /// Element type.
        format: CUarray_format,
        /// Channels.
        channels: u32,
        /// Elements per row.
        width: usize,
        /// Rows.
        height: usize,
        /// Bytes per row.
        pitch: usize,
    },
}

impl TexResource {
    fn desc(&self) -> sys::CUDA_RESOURCE_DESC {
        // SAFETY: an all-zero CUDA_RESOURCE_DESC is the valid "nothing"
        // value (null handles, zero sizes) of a plain C struct.
        let mut d: sys::CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
        match *self {
            TexResource::Array(a) => {
                d.resType = sys::CUresourcetype::CU_RESOURCE_TYPE_ARRAY;
                d.res.array.hArray = a;
            }
            TexResource::Linear {
                ptr,
                format,
                channels,
                size,
            } => {
                d.resType = sys::CUresourcetype::CU_RESOURCE_TYPE_LINEAR;
                d.res.linear = sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_3 {
                    devPtr: ptr,
                    format,
                    numChannels: channels,
                    sizeInBytes: size,
                };
            }
            TexResource::Pitch2D {
                ptr,
                format,
                channels,
                width,
                height,
                pitch,
            } => {
                d.resType = sys::CUresourcetype::CU_RESOURCE_TYPE_PITCH2D;
                d.res.pitch2D = sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_4 {
                    devPtr: ptr,
                    format,
                    numChannels: channels,
                    width,
                    height,
                    pitchInBytes: pitch,
                };
            }
        }
        d
    }
}

/// How a texture samples.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    /// Address modes of x, y and z.
    pub address: [CUaddress_mode; 3],
    /// Filter.
    pub filter: CUfilter_mode,
    /// `CU_TRSF_*` flags.
    pub flags: u32,
    /// Border colour.
    pub border: [f32; 4],
}

impl TexObject {
    /// Makes a texture object in the current context.
    pub fn create(res: &TexResource, s: &Sampling) -> Result<TexObject, CuError> {
        let rd = res.desc();
        let td = sys::CUDA_TEXTURE_DESC {
            addressMode: s.address,
            filterMode: s.filter,
            flags: s.flags,
            maxAnisotropy: 0,
            mipmapFilterMode: sys::CUfilter_mode::CU_TR_FILTER_MODE_POINT,
            mipmapLevelBias: 0.0,
            minMipmapLevelClamp: 0.0,
            maxMipmapLevelClamp: 0.0,
            borderColor: s.border,
            reserved: [0; 12],
        };
        let mut t: sys::CUtexObject = 0;
        // SAFETY: the descriptors and `t` are valid for the call; the
        // resource was checked by the caller to be the context's own.
        ok(unsafe { sys::cuTexObjectCreate(&mut t, &rd, &td, std::ptr::null()) })?;
        Ok(TexObject(t))
    }

    /// The handle kernels use.
    pub fn handle(&self) -> u64 {
        self.0
    }
}

impl SurfObject {
    /// Makes a surface object over `array` in the current context.
    pub fn create(array: sys::CUarray) -> Result<SurfObject, CuError> {
        let rd = TexResource::Array(array).desc();
        let mut s: sys::CUsurfObject = 0;
        // SAFETY: `rd` and `s` are valid for the call.
        ok(unsafe { sys::cuSurfObjectCreate(&mut s, &rd) })?;
        Ok(SurfObject(s))
    }

    /// The handle kernels use.
    pub fn handle(&self) -> u64 {
        self.0
    }
}
