//! Modules, libraries, functions and kernel launches.
//!
//! A `CUlibrary` is a module and a `CUkernel` the function of the same
//! name: the runtime launches kernels through either handle.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use vgpu_guest::vgpu_abi as abi;
use vgpu_guest::Dims;

use crate::cu::{self, CUdevice, CUresult, Handle};
use crate::diag::{check, log};
use crate::ffi::{self, entry, CuResult};
use crate::images::{load, load_jit};
use crate::launch_args::{check_shape, fill_param_block, param_block};
use crate::modules::{max_cluster_blocks, LoadAs, PORTABLE_CLUSTER_BLOCKS};
use crate::state::{driver, Driver};

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    entry(|| load(module, image))
}

/// JIT options are checked; the compiler's hints are let be (the
/// backend's driver compiles with its own), and the logs and wall time
/// asked for are written.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut Handle,
    image: *const c_void,
    n: u32,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's `n` options and values.
        let jit = unsafe { crate::state::jit_options("cuModuleLoadDataEx", n, options, values) }?;
        let d = driver()?;
        let (_, dev) = d.current_ctx()?;
        load_jit(d, module, image, LoadAs::Module(dev), &jit)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut Handle,
    image: *const c_void,
) -> CUresult {
    entry(|| load(module, image))
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    entry(|| driver()?.unload_module(module as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { ffi::cstr(name) }?;
        let h = driver()?.get_function(module as usize, name)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(f, h as Handle) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut u32, module: Handle) -> CUresult {
    entry(|| {
        let n = {
            let o = driver()?.objects();
            o.modules().modules.get(module as usize)?.kernels.len()
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(count, n as u32) }
    })
}

/// A module variable (`__device__` global): its device address and size,
/// which copies then reach.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut u64,
    bytes: *mut usize,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { put_global(driver()?, module as usize, name, dptr, bytes) })
}

/// Global `name` (the caller's C string) of `module`: its address and
/// size into the caller's out-parameters, each of which may be null.
///
/// # Safety
/// As `cuModuleGetGlobal` takes its arguments.
unsafe fn put_global(
    d: &Driver,
    module: usize,
    name: *const c_char,
    dptr: *mut u64,
    bytes: *mut usize,
) -> CuResult {
    // SAFETY: the caller's NUL-terminated name.
    let name = unsafe { ffi::cstr(name) }?;
    let (addr, size) = d.get_global(module, name)?;
    // SAFETY: the caller's out-parameters, each of which may be null.
    unsafe {
        ffi::put_opt(dptr, addr)?;
        ffi::put_opt(bytes, size as usize)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut u64,
    bytes: *mut usize,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        // A library's variables on the current device are its twin's.
        let d = driver()?;
        let library = match d.current_ctx() {
            Ok((_, dev)) => d.module_on(library as usize, dev)?,
            Err(_) => library as usize,
        };
        // SAFETY: the caller's arguments.
        unsafe { put_global(d, library, name, dptr, bytes) }
    })
}

/// `CU_MODULE_LAZY_LOADING` (2): the runtime loads a registered module
/// when a kernel of it first runs, not all of a library's at start.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut u32) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { ffi::put(mode, 2) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut Handle,
    code: *const c_void,
    jit_options: *mut u32,
    jit_values: *mut *mut c_void,
    n_jit: u32,
    lib_options: *mut u32,
    lib_values: *mut *mut c_void,
    n_lib: u32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's option arrays of the counts given.
        let jit = unsafe {
            crate::jit::check_library_options(n_lib, lib_options, lib_values)?;
            crate::state::jit_options("cuLibraryLoadData", n_jit, jit_options, jit_values)?
        };
        let d = driver()?;
        load_jit(d, library, code, LoadAs::Library, &jit)
    })
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(library: Handle) -> CUresult {
    cuModuleUnload(library)
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut Handle,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuModuleGetFunction(kernel, library, name) }
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut Handle, library: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.objects().modules().modules.get(library as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(module, library) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut Handle, kernel: Handle) -> CUresult {
    entry(|| {
        // The kernel's function in the current context.
        let d = driver()?;
        let (_, dev) = d.current_ctx()?;
        let func = d.function_on(kernel as usize, dev)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(f, func as Handle) }
    })
}

/// The value of function attribute `attr`.
fn func_attribute(d: &Driver, f: usize, attr: i32) -> CuResult<i32> {
    let o = d.objects();
    let f = o.modules().funcs.get(f)?;
    let i = &f.function.info;
    let cc = crate::devices::CC_MAJOR * 10 + crate::devices::CC_MINOR;
    let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    Ok(match attr {
        cu::FUNC_MAX_THREADS_PER_BLOCK => int(i.max_threads.min(abi::MAX_BLOCK_THREADS)),
        cu::FUNC_SHARED_SIZE_BYTES => int(i.shared_static),
        cu::FUNC_CONST_SIZE_BYTES => int(i.const_bytes),
        cu::FUNC_LOCAL_SIZE_BYTES => int(i.local_bytes),
        cu::FUNC_NUM_REGS => int(i.num_regs.min(255)),
        // The backend's own when it says (a GPU's driver does).
        cu::FUNC_PTX_VERSION if i.ptx_version != 0 => int(i.ptx_version),
        cu::FUNC_BINARY_VERSION if i.binary_version != 0 => int(i.binary_version),
        cu::FUNC_PTX_VERSION | cu::FUNC_BINARY_VERSION => cc,
        cu::FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES => int(f.max_dynamic_shared),
        a if f.hints.contains_key(&a) => f.hints[&a],
        a if (0..cu::FUNC_ATTR_END).contains(&a) => 0,
        _ => return Err(cu::ERROR_INVALID_VALUE),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(value: *mut i32, attr: i32, f: Handle) -> CUresult {
    entry(|| {
        let v = func_attribute(driver()?, f as usize, attr)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(value, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut i32,
    attr: i32,
    kernel: Handle,
    _dev: i32,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuFuncGetAttribute(value, attr, kernel) }
}

/// Only the dynamic shared memory limit is settable, within what the
/// device gives a block of this kernel; other attributes are hints.
#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attr: i32, value: i32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let mut o = d.objects();
        let func = o.modules_mut().funcs.get_mut(f as usize)?;
        match attr {
            cu::FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                let limit = func.function.info.max_dynamic_shared;
                match u32::try_from(value) {
                    Ok(v) if v <= limit => {
                        func.max_dynamic_shared = v;
                        Ok(())
                    }
                    _ => {
                        crate::diag::log(&format!(
                            "cuFuncSetAttribute({:?}): {value} bytes of dynamic shared memory, the kernel allows {limit}",
                            func.cname
                        ));
                        Err(cu::ERROR_INVALID_VALUE)
                    }
                }
            }
            // Kept so that reading them back gives what was set: the
            // shared memory carveout (a hint), and the cluster settings
            // (the host's driver is told when a launch needs them).
            cu::FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT
            | cu::FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            | cu::FUNC_CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
                func.hints.insert(attr, value);
                Ok(())
            }
            _ => {
                crate::diag::log(&format!(
                    "cuFuncSetAttribute({:?}, {attr}, {value}): not settable here",
                    func.cname
                ));
                Err(cu::ERROR_INVALID_VALUE)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn cuKernelSetAttribute(
    attr: i32,
    value: i32,
    kernel: Handle,
    _dev: i32,
) -> CUresult {
    cuFuncSetAttribute(kernel, attr, value)
}

/// Checks that `f` is a function (or kernel) loaded: a bad one is an
/// invalid handle.
fn known_function(d: &Driver, f: Handle) -> CuResult {
    d.objects().modules().funcs.get(f as usize).map(drop)
}

/// A cache preference is a hint the device may ignore (CUDA's words).
#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(f: Handle, _config: u32) -> CUresult {
    entry(|| known_function(driver()?, f))
}

/// The same hint for a kernel of a library on a device.
#[no_mangle]
pub extern "C" fn cuKernelSetCacheConfig(kernel: Handle, _config: u32, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        known_function(d, kernel)
    })
}

/// Shared memory bank sizes are fixed on the GPUs this reports (CUDA
/// ignores the setting there and succeeds).
#[no_mangle]
pub extern "C" fn cuFuncSetSharedMemConfig(f: Handle, config: u32) -> CUresult {
    entry(|| {
        if config > 2 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        known_function(driver()?, f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: Handle) -> CUresult {
    // SAFETY: forwarded arguments (a kernel is its function here).
    unsafe { cuFuncGetName(name, kernel) }
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuFuncGetParamInfo(kernel, index, offset, size) }
}

/// How many kernels a library has (a library is its module here).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut u32, library: Handle) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuModuleGetFunctionCount(count, library) }
}

/// The first `n` kernels of a library.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut Handle,
    n: u32,
    library: Handle,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuModuleEnumerateFunctions(kernels, n, library) }
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: Handle) -> CUresult {
    entry(|| {
        // The CString lives as long as the function handle.
        let p = {
            let o = driver()?.objects();
            o.modules().funcs.get(f as usize)?.cname.as_ptr()
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(name, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry(|| {
        let p = {
            let o = driver()?.objects();
            let func = o.modules().funcs.get(f as usize)?;
            *func
                .function
                .params
                .get(index)
                .ok_or(cu::ERROR_INVALID_VALUE)?
        };
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put(offset, p.offset as usize)?;
            ffi::put(size, p.size as usize)
        }
    })
}

/// Queues a launch of `f` in clusters of `cluster` blocks ([1, 1, 1]:
/// none) on `stream`, cooperative (every block resident at once) if
/// `cooperative`.
///
/// # Safety
/// `params` and `extra` as `cuLaunchKernel` takes them.
unsafe fn launch(
    f: Handle,
    dims: Dims,
    (cluster, cooperative): ([u32; 3], bool),
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let d = driver()?;
    // The stream must be valid; its work runs in order anyway (or is
    // recorded, if it is being captured).
    let (f, target) = d.launch_target(f as usize, stream as usize, dims.shared_mem)?;
    if cooperative {
        check_cooperative(d, f, &dims, cluster)?;
    }
    let Some((function, device)) = target else {
        // SAFETY: the caller's parameter pointers.
        let block = unsafe { param_block(d, f, params, extra) }?;
        check_shape(&dims, block.len())?;
        return d.launch(f, dims, (cluster, cooperative), &block, stream as usize);
    };
    // The common case, a launch loop's: the parameters packed on the
    // stack (most blocks are small) and straight into the device's open
    // batch.
    let size = function.info.params_size as usize;
    let (mut small, mut large) = ([0u8; SMALL_PARAMS], Vec::new());
    let block = if size <= SMALL_PARAMS {
        &mut small[..size]
    } else {
        large.resize(size, 0);
        &mut large[..]
    };
    // SAFETY: the caller's parameter pointers.
    unsafe { fill_param_block(&function, params, extra, block) }?;
    check_shape(&dims, size)?;
    let lane = d.stream_lane(stream as usize)?;
    d.gpu(device)?.lanes.queue(lane, |inflight, dev| {
        inflight.enqueue_launch(dev, &function, dims, (cluster, cooperative), block)
    })
}

/// Whether a cooperative launch of `f` on `dims` in clusters of
/// `cluster` can go: the device offers cooperative launches (else
/// NOT_SUPPORTED, as a GPU without them answers), and every cluster of
/// the grid is resident at once as the device counts them (else
/// COOPERATIVE_LAUNCH_TOO_LARGE).
fn check_cooperative(d: &Driver, f: usize, dims: &Dims, cluster: [u32; 3]) -> CuResult {
    let device = d.objects().modules().funcs.get(f)?.device;
    let g = d.gpu(device)?;
    if g.info.features & vgpu_guest::sys::FEATURE_COOPERATIVE == 0 {
        log("cooperative launches: the device does not offer them");
        return Err(cu::ERROR_NOT_SUPPORTED);
    }
    let blocks = |d: [u32; 3]| d.iter().map(|&x| u64::from(x)).product::<u64>();
    let clusters = blocks(dims.grid) / blocks(cluster).max(1);
    match resident(d, f, dims.block, dims.shared_mem, cluster)? {
        Some(n) if clusters <= u64::from(n) => Ok(()),
        Some(_) => Err(cu::ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
        // A device with cooperative launches answers OCCUPANCY.
        None => Err(cu::ERROR_NOT_SUPPORTED),
    }
}

/// Clusters of `cluster` blocks of `block` threads of `f` with
/// `shared_mem` bytes of dynamic shared memory each that are resident on
/// the device at once, as the device counts them (remembered per shape);
/// `None` where the device does not count them (no OCCUPANCY).
fn resident(
    d: &Driver,
    f: usize,
    block: [u32; 3],
    shared_mem: u32,
    cluster: [u32; 3],
) -> CuResult<Option<u32>> {
    let shape = (block, shared_mem, cluster);
    let (function, device, known) = {
        let o = d.objects();
        let func = o.modules().funcs.get(f)?;
        let known = func.clusters.get(&shape).copied();
        (Arc::clone(&func.function), func.device, known)
    };
    if let Some(v) = known {
        return Ok(Some(v));
    }
    let g = d.gpu(device)?;
    match g
        .dev
        .max_active_clusters(&function, block, shared_mem, cluster)
    {
        Err(vgpu_guest::Error::Unsupported) => Ok(None),
        r => {
            let v = check(r)?;
            if let Ok(func) = d.objects().modules_mut().funcs.get_mut(f) {
                if func.clusters.len() < crate::module_table::MAX_CLUSTER_ANSWERS {
                    func.clusters.insert(shape, v);
                }
            }
            Ok(Some(v))
        }
    }
}

/// Parameter blocks up to this size are packed on the stack.
const SMALL_PARAMS: usize = 512;

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let dims = Dims {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
        shared_mem: shared,
    };
    // SAFETY: the caller's parameter pointers.
    entry(|| unsafe { launch(f, dims, ([1, 1, 1], false), stream, params, extra) })
}

/// `cuLaunchCooperativeKernel`: every block of the grid resident at
/// once, so that it can synchronise (cooperative groups' `grid.sync()`).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    let dims = Dims {
        grid: [gx, gy, gz],
        block: [bx, by, bz],
        shared_mem: shared,
    };
    // SAFETY: the caller's parameter pointers.
    entry(|| unsafe {
        launch(
            f,
            dims,
            ([1, 1, 1], true),
            stream,
            params,
            std::ptr::null_mut(),
        )
    })
}

/// `cuLaunchKernelEx`: thread block clusters, and attributes the device
/// honours by ignoring them.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const cu::CUlaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's launch configuration.
        let (c, cluster, cooperative) = unsafe { config_of(config) }?;
        let dims = Dims {
            grid: [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
            block: [c.block_dim_x, c.block_dim_y, c.block_dim_z],
            shared_mem: c.shared_mem_bytes,
        };
        // SAFETY: forwarded arguments.
        unsafe { launch(f, dims, (cluster, cooperative), c.h_stream, params, extra) }
    })
}

/// The launch configuration at `config`, the cluster shape it asks for
/// and whether it is cooperative (see [`cluster_of`]).
///
/// # Safety
/// `config` is null or a valid configuration that outlives `'a`.
unsafe fn config_of<'a>(
    config: *const cu::CUlaunchConfig,
) -> CuResult<(&'a cu::CUlaunchConfig, [u32; 3], bool)> {
    if config.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid by the caller's contract.
    let c = unsafe { &*config };
    // SAFETY: as above: its attribute array.
    let (cluster, cooperative) = unsafe { cluster_of(c) }?;
    Ok((c, cluster, cooperative))
}

/// The cluster shape a launch configuration asks for ([1, 1, 1]: none)
/// and whether it is cooperative, after checking that every other
/// attribute is one the device may honour by ignoring it (stricter
/// ordering, a priority hint).
///
/// # Safety
/// `c.attrs` holds `c.num_attrs` attributes (or is null with none).
unsafe fn cluster_of(c: &cu::CUlaunchConfig) -> CuResult<([u32; 3], bool)> {
    let mut cluster = [1, 1, 1];
    let mut cooperative = false;
    if c.num_attrs == 0 {
        return Ok((cluster, cooperative));
    }
    if c.attrs.is_null() || c.num_attrs > 64 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    for i in 0..c.num_attrs as usize {
        // SAFETY: within the caller's array.
        let a = unsafe { ffi::get(c.attrs.cast::<cu::CUlaunchAttribute>().add(i)) }?;
        match a.id {
            cu::LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION => {
                cluster = [a.value[0], a.value[1], a.value[2]].map(|d| d.max(1));
            }
            // Programmatic dependent launch only allows overlap; running
            // each kernel after the previous one is always correct.
            cu::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            | cu::LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
            | cu::LAUNCH_ATTRIBUTE_PRIORITY
            | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
            | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN => {}
            cu::LAUNCH_ATTRIBUTE_COOPERATIVE => cooperative = a.value[0] != 0,
            cu::LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW => {
                crate::devices::check_access_policy_window(&a.value)?
            }
            id => {
                log(&format!("launch attribute {id} is not supported"));
                return Err(cu::ERROR_NOT_SUPPORTED);
            }
        }
    }
    Ok((cluster, cooperative))
}

/// Clusters of `f` that can be resident at once for a launch of
/// `config`, as the host's driver counts them: a cluster must fit within
/// one group of SMs, and libraries size persistent kernels and pick
/// cluster shapes by this answer. A device without the query gets the
/// SMs' room for the blocks in whole clusters (an upper bound).
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    n: *mut i32,
    f: Handle,
    config: *const cu::CUlaunchConfig,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's launch configuration.
        let (c, cluster, _) = unsafe { config_of(config) }?;
        let d = driver()?;
        let size = cluster.iter().map(|&d| u64::from(d)).product::<u64>();
        let launchable = max_cluster_blocks(d, f as usize)?;
        // Libraries probe sizes upwards until none fits, past what a
        // launch may use where the kernel allows non-portable sizes: the
        // answers tell them how the GPU groups its SMs.
        let askable = if launchable > PORTABLE_CLUSTER_BLOCKS {
            vgpu_guest::vgpu_abi::MAX_OCCUPANCY_CLUSTER_BLOCKS
        } else {
            launchable
        };
        if size > u64::from(askable) {
            // SAFETY: the caller's out-parameter.
            return unsafe { ffi::put(n, 0) };
        }
        let dims = [c.block_dim_x, c.block_dim_y, c.block_dim_z];
        if let Some(v) = resident(d, f as usize, dims, c.shared_mem_bytes, cluster)? {
            // SAFETY: the caller's out-parameter.
            return unsafe { ffi::put(n, i32::try_from(v).unwrap_or(i32::MAX)) };
        }
        let device = d.objects().modules().funcs.get(f as usize)?.device;
        let g = d.gpu(device)?;
        if size > u64::from(launchable) {
            // SAFETY: the caller's out-parameter.
            return unsafe { ffi::put(n, 0) };
        }
        let sms = crate::devices::attribute(g, cu::ATTR_MULTIPROCESSOR_COUNT)?;
        let block = (u64::from(c.block_dim_x) * u64::from(c.block_dim_y) * u64::from(c.block_dim_z))
            .min(1 << 20) as i32;
        let v = occupancy(d, f as usize, block, c.shared_mem_bytes as usize)? * sms / size as i32;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(n, v) }
    })
}

/// The largest cluster `f` may be launched in.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut i32,
    f: Handle,
    _config: *const cu::CUlaunchConfig,
) -> CUresult {
    entry(|| {
        let v = max_cluster_blocks(driver()?, f as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(size, v as i32) }
    })
}

/// Shared memory of one SM of a Hopper-class GPU, and what the hardware
/// keeps of it for each resident block.
const SM_SHARED: usize = 228 << 10;
const BLOCK_RESERVED_SHARED: usize = 1 << 10;

/// Blocks of `block` threads that fit on one SM of a Hopper-class GPU
/// at once, by threads, shared memory and registers (each warp's
/// registers allocated in units of 256).
fn occupancy(d: &Driver, f: usize, block: i32, dyn_shared: usize) -> CuResult<i32> {
    if block <= 0 || block > abi::MAX_BLOCK_THREADS as i32 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // The device's own count where it gives one, so that a cooperative
    // grid sized by this answer times the SMs is one the device runs.
    // A shape it refuses (too much shared memory) is left to the model.
    if let Ok(shared) = u32::try_from(dyn_shared) {
        if let Ok(Some(n)) = resident(d, f, [block as u32, 1, 1], shared, [1, 1, 1]) {
            let device = d.objects().modules().funcs.get(f)?.device;
            let sms = crate::devices::attribute(d.gpu(device)?, cu::ATTR_MULTIPROCESSOR_COUNT)?;
            let per_sm = i32::try_from(n).unwrap_or(i32::MAX) / sms.max(1);
            return Ok(if n > 0 { per_sm.max(1) } else { 0 });
        }
    }
    let (shared, regs) = {
        let o = d.objects();
        let i = &o.modules().funcs.get(f)?.function.info;
        (i.shared_static as usize + dyn_shared, i.num_regs as usize)
    };
    let by_threads = 2048 / block;
    let by_shared = SM_SHARED / (shared + BLOCK_RESERVED_SHARED);
    let warps = (block as usize).div_ceil(32);
    let per_block = (regs * 32).div_ceil(256) * 256 * warps;
    let by_regs = 65536usize.checked_div(per_block).unwrap_or(32);
    Ok(by_threads.min(by_shared as i32).min(by_regs as i32).min(32))
}

/// The most dynamic shared memory a block of `f` may ask for with
/// `blocks` blocks of `block` threads resident on one SM.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    f: Handle,
    blocks: i32,
    block: i32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (static_shared, limit) = {
            let o = d.objects();
            let i = &o.modules().funcs.get(f as usize)?.function.info;
            (i.shared_static as usize, i.max_dynamic_shared as usize)
        };
        let wanted = usize::try_from(blocks)
            .ok()
            .filter(|&b| b > 0)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        // Blocks that cannot be resident for their threads get none.
        let v = if (occupancy(d, f as usize, block, 0)? as usize) < wanted {
            0
        } else {
            (SM_SHARED / wanted)
                .saturating_sub(BLOCK_RESERVED_SHARED + static_shared)
                .min(limit)
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(size, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut i32,
    f: Handle,
    block: i32,
    dyn_shared: usize,
) -> CUresult {
    entry(|| {
        let v = occupancy(driver()?, f as usize, block, dyn_shared)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(n, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut i32,
    f: Handle,
    block: i32,
    dyn_shared: usize,
    _flags: u32,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, dyn_shared) }
}

/// `size_t (*)(int blockSize)`: dynamic shared memory for a block size.
pub type B2DSize = Option<extern "C" fn(i32) -> usize>;

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut i32,
    block_size: *mut i32,
    f: Handle,
    to_dyn: B2DSize,
    dyn_shared: usize,
    limit: i32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (_, g) = d.current_gpu()?;
        let sms = crate::devices::attribute(g, cu::ATTR_MULTIPROCESSOR_COUNT)?;
        let max = {
            let o = d.objects();
            let func = o.modules().funcs.get(f as usize)?;
            func.function
                .info
                .max_threads
                .clamp(1, abi::MAX_BLOCK_THREADS) as i32
        };
        let max = if limit > 0 { max.min(limit) } else { max };
        // The largest multiple of a warp with the most threads resident.
        let (mut best, mut best_threads) = (32.min(max), 0);
        for b in (32..=max).rev().step_by(32) {
            let shared = to_dyn.map_or(dyn_shared, |cb| cb(b));
            let threads = occupancy(d, f as usize, b, shared)? * b;
            if threads > best_threads {
                (best, best_threads) = (b, threads);
            }
        }
        let blocks = (best_threads / best.max(1)).max(1);
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put(min_grid, blocks * sms)?;
            ffi::put(block_size, best)
        }
    })
}

/// With flags: `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE` changes nothing
/// here (the device's answers are its driver's).
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut i32,
    block_size: *mut i32,
    f: Handle,
    to_dyn: B2DSize,
    dyn_shared: usize,
    limit: i32,
    flags: u32,
) -> CUresult {
    if flags > 1 {
        return cu::ERROR_INVALID_VALUE;
    }
    // SAFETY: forwarded arguments.
    unsafe { cuOccupancyMaxPotentialBlockSize(min_grid, block_size, f, to_dyn, dyn_shared, limit) }
}

/// The module's kernels (as many as `n`), in name order.
#[no_mangle]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    out: *mut Handle,
    n: u32,
    module: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let mut names: Vec<String> = d
            .objects()
            .modules()
            .modules
            .get(module as usize)?
            .kernels
            .iter()
            .cloned()
            .collect();
        names.sort_unstable();
        for (i, name) in names.iter().take(n as usize).enumerate() {
            let f = d.get_function(module as usize, name)?;
            // SAFETY: the caller's array of `n` handles.
            unsafe { ffi::put(out.add(i), f as Handle) }?;
        }
        Ok(())
    })
}

/// The module a function belongs to.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(module: *mut Handle, f: Handle) -> CUresult {
    entry(|| {
        let m = driver()?.objects().modules().funcs.get(f as usize)?.module;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(module, m as Handle) }
    })
}

/// A library and its module share one handle here.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(library: *mut Handle, kernel: Handle) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuFuncGetModule(library, kernel) }
}

/// Functions are loaded with their module (`CU_FUNCTION_LOADING_STATE_LOADED`).
#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut u32, f: Handle) -> CUresult {
    entry(|| {
        driver()?.objects().modules().funcs.get(f as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(state, 1) }
    })
}

#[no_mangle]
pub extern "C" fn cuFuncLoad(f: Handle) -> CUresult {
    entry(|| known_function(driver()?, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(id: u32, value: [u32; 3]) -> cu::CUlaunchAttribute {
        let mut v = [0u32; 16];
        v[..3].copy_from_slice(&value);
        cu::CUlaunchAttribute {
            id,
            pad: [0; 4],
            value: v,
        }
    }

    fn config(attrs: &mut [cu::CUlaunchAttribute]) -> cu::CUlaunchConfig {
        cu::CUlaunchConfig {
            grid_dim_x: 8,
            grid_dim_y: 1,
            grid_dim_z: 1,
            block_dim_x: 128,
            block_dim_y: 1,
            block_dim_z: 1,
            shared_mem_bytes: 0,
            h_stream: std::ptr::null_mut(),
            attrs: attrs.as_mut_ptr().cast(),
            num_attrs: attrs.len() as u32,
        }
    }

    fn cluster(attrs: &mut [cu::CUlaunchAttribute]) -> CuResult<[u32; 3]> {
        let c = config(attrs);
        // SAFETY: `c.attrs` holds `c.num_attrs` attributes.
        unsafe { config_of(&c) }.map(|(_, cluster, _)| cluster)
    }

    #[test]
    fn test_launch_attributes() {
        assert_eq!(cluster(&mut []), Ok([1, 1, 1]));
        let dims = attr(cu::LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, [4, 2, 0]);
        assert_eq!(cluster(&mut [dims]), Ok([4, 2, 1]));
        // Attributes that only allow overlap or give hints are honoured by
        // running in stream order.
        let pdl = attr(
            cu::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            [1, 0, 0],
        );
        let prio = attr(cu::LAUNCH_ATTRIBUTE_PRIORITY, [3, 0, 0]);
        assert_eq!(cluster(&mut [pdl, dims, prio]), Ok([4, 2, 1]));
        // Cooperative or not, with clusters or without.
        let coop = attr(cu::LAUNCH_ATTRIBUTE_COOPERATIVE, [1, 0, 0]);
        let off = attr(cu::LAUNCH_ATTRIBUTE_COOPERATIVE, [0, 0, 0]);
        let cooperative = |attrs: &mut [cu::CUlaunchAttribute]| {
            let c = config(attrs);
            // SAFETY: `c.attrs` holds `c.num_attrs` attributes.
            unsafe { config_of(&c) }.map(|(_, cluster, coop)| (cluster, coop))
        };
        assert_eq!(cooperative(&mut [coop]), Ok(([1, 1, 1], true)));
        assert_eq!(cooperative(&mut [dims, coop]), Ok(([4, 2, 1], true)));
        assert_eq!(cooperative(&mut [off]), Ok(([1, 1, 1], false)));
        assert_eq!(cooperative(&mut [pdl]), Ok(([1, 1, 1], false)));
        // An L2 access policy window is a hint, within the device's bound.
        let mut window = attr(cu::LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, [0, 0, 1 << 20]);
        window.value[4] = 0.5f32.to_bits();
        assert_eq!(cluster(&mut [window]), Ok([1, 1, 1]));
        window.value[3] = 1;
        assert_eq!(cluster(&mut [window]), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(
            cluster(&mut [attr(999, [0; 3])]),
            Err(cu::ERROR_NOT_SUPPORTED)
        );
        // A count without an array, and no configuration at all.
        let mut c = config(&mut []);
        c.attrs = std::ptr::null_mut();
        c.num_attrs = 2;
        // SAFETY: the array is null; the count is what is refused.
        let r = unsafe { config_of(&c) };
        assert_eq!(r.map(|(_, k, _)| k), Err(cu::ERROR_INVALID_VALUE));
        // SAFETY: a null configuration is refused before any read.
        assert!(unsafe { config_of(std::ptr::null()) }.is_err());
    }
}
