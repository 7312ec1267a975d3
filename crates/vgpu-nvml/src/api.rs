//! The entry points NVML programs call, answered from the vGPUs.
//!
//! Every function checks, in order: that the library is initialised
//! (`NVML_ERROR_UNINITIALIZED`), that the handle is one it handed out
//! and that each out-pointer is non-null (`NVML_ERROR_INVALID_ARGUMENT`),
//! and that buffers are large enough (`NVML_ERROR_INSUFFICIENT_SIZE`).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::Path;

use crate::error::{self, Error, Result};
use crate::ffi::{self, c_field, entry, put, put_str};
use crate::format::PciAddr;
use crate::nvml::{self, *};
use crate::state::{self, Gpu};
use crate::{procs, state::Gpus};

/// The CUDA driver API version libcuda (`vgpu-cuda`) implements,
/// `cuDriverGetVersion`'s.
pub const CUDA_DRIVER_VERSION: c_int = 13000;
/// The compute capability libcuda reports.
pub const CC: (c_int, c_int) = (9, 0);
/// The driver version: the NVIDIA driver branch of CUDA 13.0 (tools
/// compare its major number), then this library's own version.
pub const DRIVER_VERSION: &str = concat!("580.0.0+vgpud.", env!("CARGO_PKG_VERSION"));
/// NVML's version: the CUDA major version, then the driver's.
pub const NVML_VERSION: &str = "13.580.0";
/// Overrides the driver version reported: NVIDIA's `nvidia-smi` runs only
/// beside the NVML of its own driver release, so a guest image that
/// ships it names that release (e.g. `580.159.04`) here.
pub const DRIVER_VERSION_ENV: &str = "VGPU_NVML_DRIVER_VERSION";

/// The driver and NVML versions reported: [`DRIVER_VERSION_ENV`]'s
/// release if set (printable ASCII, 32 bytes at most), else ours.
fn versions() -> (String, String) {
    match std::env::var(DRIVER_VERSION_ENV) {
        Ok(v) if !v.is_empty() && v.len() <= 32 && v.bytes().all(|b| b.is_ascii_graphic()) => {
            let nvml = format!("13.{v}");
            (v, nvml)
        }
        _ => (DRIVER_VERSION.to_string(), NVML_VERSION.to_string()),
    }
}

/// Runs `f` on the device behind `device`.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&Gpu) -> Result) -> nvmlReturn_t {
    entry(|| {
        let gpus = state::gpus()?;
        f(state::gpu(&gpus, device)?)
    })
}

// --- initialisation -------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    crate::init_logging();
    entry(|| state::init(0))
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    crate::init_logging();
    entry(|| state::init(flags))
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    entry(state::shutdown)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    error::describe(result).as_ptr()
}

/// NVIDIA's tools reach private tables through this (see [`crate::export`]).
#[no_mangle]
pub unsafe extern "C" fn nvmlInternalGetExportTable(
    table: *mut *const c_void,
    id: *const c_void,
) -> nvmlReturn_t {
    entry(|| {
        if table.is_null() || id.is_null() {
            return Err(crate::Error::InvalidArgument);
        }
        // SAFETY: the caller's 16-byte table id.
        let id = unsafe { *id.cast::<[u8; 16]>() };
        let found = crate::export::table(&id);
        // SAFETY: a non-null out-parameter of the caller's.
        unsafe { put(table, found.unwrap_or(std::ptr::null()))? };
        match found {
            Some(_) => Ok(()),
            None => state::not_supported("nvmlInternalGetExportTable"),
        }
    })
}

// --- system -----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        state::gpus()?;
        // SAFETY: `version` is writable for `length` bytes.
        unsafe { put_str(version, length, &versions().0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        state::gpus()?;
        // SAFETY: `version` is writable for `length` bytes.
        unsafe { put_str(version, length, &versions().1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    entry(|| {
        state::gpus()?;
        // SAFETY: the caller's out-parameter.
        unsafe { put(version, CUDA_DRIVER_VERSION) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded arguments.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        state::gpus()?;
        let n = procs::name(Path::new("/proc"), pid).ok_or(Error::NotFound)?;
        // SAFETY: `name` is writable for `length` bytes.
        unsafe { put_str(name, length, &n) }
    })
}

// --- finding devices ----------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    entry(|| {
        let gpus = state::gpus()?;
        // SAFETY: the caller's out-parameter.
        unsafe { put(count, gpus.len() as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded arguments.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// Writes the handle of the first device `pick` accepts, or fails with
/// `missing`.
///
/// # Safety
/// `device` is null or valid for a write of a handle.
unsafe fn find(
    device: *mut nvmlDevice_t,
    missing: Error,
    pick: impl Fn(&Gpu) -> bool,
) -> nvmlReturn_t {
    entry(|| {
        let gpus: Gpus = state::gpus()?;
        if device.is_null() {
            return Err(Error::InvalidArgument);
        }
        let g = gpus.iter().find(|g| pick(g)).ok_or(missing)?;
        // SAFETY: the caller's out-parameter.
        unsafe { put(device, state::handle(g)) }
    })
}

/// [`find`] by a key parsed from the caller's string `text`: a null or
/// unparsable one is an invalid argument (once NVML is initialized).
///
/// # Safety
/// `text` is null or a NUL-terminated string; `device` as for [`find`].
unsafe fn find_by<K>(
    text: *const c_char,
    device: *mut nvmlDevice_t,
    parse: impl FnOnce(&str) -> Option<K>,
    matches: impl Fn(&Gpu, &K) -> bool,
) -> nvmlReturn_t {
    let key = if text.is_null() {
        None
    } else {
        // SAFETY: a NUL-terminated string by the caller's contract.
        unsafe { ffi::cstr(text) }.ok().and_then(parse)
    };
    let Some(key) = key else {
        return entry(|| {
            state::gpus()?;
            Err(Error::InvalidArgument)
        });
    };
    // SAFETY: the caller's out-parameter.
    unsafe { find(device, Error::NotFound, |g| matches(g, &key)) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's out-parameter.
    unsafe { find(device, Error::InvalidArgument, |g| g.index == index) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded arguments.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's string and out-parameter.
    unsafe {
        find_by(
            uuid,
            device,
            |s| Some(s.to_owned()),
            |g, text| g.uuid.eq_ignore_ascii_case(text),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's string and out-parameter.
    unsafe { find_by(bus_id, device, PciAddr::parse, |g, addr| g.pci == *addr) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded arguments.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

// --- identity -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `name` is writable for `length` bytes.
    with_gpu(device, |g| unsafe { put_str(name, length, &g.name) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `uuid` is writable for `length` bytes.
    with_gpu(device, |g| unsafe { put_str(uuid, length, &g.uuid) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's out-parameter.
    with_gpu(device, |g| unsafe { put(index, g.index) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's out-parameter.
    with_gpu(device, |g| unsafe { put(minor, g.info.minor) })
}

/// The device's `nvmlPciInfo_t`.
fn pci_info(g: &Gpu) -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: c_field(&g.pci.bus_id_legacy()),
        domain: g.pci.domain,
        bus: g.pci.bus.into(),
        device: g.pci.device.into(),
        pciDeviceId: u32::from(g.info.device_id) << 16 | u32::from(g.info.vendor_id),
        pciSubSystemId: u32::from(g.info.subsystem_id) << 16
            | u32::from(g.info.subsystem_vendor_id),
        busId: c_field(&g.pci.bus_id()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's out-parameter.
    with_gpu(device, |g| unsafe { put(pci, pci_info(g)) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded arguments.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_v1_t,
) -> nvmlReturn_t {
    with_gpu(device, |g| {
        let p = pci_info(g);
        let v1 = nvmlPciInfo_v1_t {
            busId: p.busIdLegacy,
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pciDeviceId: p.pciDeviceId,
            pciSubSystemId: p.pciSubSystemId,
            reserved: [0; 4],
        };
        // SAFETY: the caller's out-parameter.
        unsafe { put(pci, v1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    with_gpu(device, |_| {
        if major.is_null() || minor.is_null() {
            return Err(Error::InvalidArgument);
        }
        // SAFETY: the caller's out-parameters, both non-null.
        unsafe {
            put(major, CC.0)?;
            put(minor, CC.1)
        }
    })
}

// --- memory and load ------------------------------------------------------------------------

/// Total (the partition's quota), used (by every file of the function)
/// and free device memory.
fn memory(g: &Gpu) -> Result<(u64, u64, u64)> {
    let usage = g.usage()?;
    let total = usage.total(&g.info);
    let used = usage.mem_used.min(total);
    Ok((total, used, total - used))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory_out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_gpu(device, |g| {
        if memory_out.is_null() {
            return Err(Error::InvalidArgument);
        }
        let (total, used, free) = memory(g)?;
        // SAFETY: the caller's out-parameter.
        unsafe { put(memory_out, nvmlMemory_t { total, free, used }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory_out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_gpu(device, |g| {
        // SAFETY: the caller's structure, of which the version is read.
        let version = unsafe { ffi::get(memory_out.cast::<c_uint>()) }?;
        if version != MEMORY_V2 {
            return Err(Error::ArgumentVersionMismatch);
        }
        let (total, used, free) = memory(g)?;
        let m = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free,
            used,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { put(memory_out, m) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    device: nvmlDevice_t,
    bar1: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    // The host-visible window (BAR2 of the function) plays BAR1's part;
    // what programs map of it is not counted.
    with_gpu(device, |g| {
        let m = nvmlBAR1Memory_t {
            bar1Total: g.info.window_size,
            bar1Free: g.info.window_size,
            bar1Used: 0,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { put(bar1, m) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_gpu(device, |g| {
        if utilization.is_null() {
            return Err(Error::InvalidArgument);
        }
        // Memory traffic is not measured apart from device time: 0.
        let u = nvmlUtilization_t {
            gpu: g.utilization()?,
            memory: 0,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { put(utilization, u) }
    })
}

// --- processes --------------------------------------------------------------------------------

/// Fills a process list as NVML does: `*count` in is the room in
/// `infos`, out the number of processes; too little room is
/// `NVML_ERROR_INSUFFICIENT_SIZE` with the number needed, and `infos` may
/// be null when no room is given.
///
/// # Safety
/// `count` is null or valid for reads and writes; `infos` is null or
/// valid for writes of `*count` entries.
unsafe fn put_processes<T>(
    count: *mut c_uint,
    infos: *mut T,
    pids: &[u32],
    entry_of: impl Fn(u32) -> T,
) -> Result {
    // SAFETY: the caller's in-out parameter.
    let room = unsafe { ffi::get(count) }? as usize;
    let n = pids.len();
    // SAFETY: as above.
    unsafe { put(count, n as c_uint) }?;
    if room < n {
        return Err(Error::InsufficientSize);
    }
    if n == 0 {
        return Ok(());
    }
    if infos.is_null() {
        return Err(Error::InvalidArgument);
    }
    for (i, &pid) in pids.iter().enumerate() {
        // SAFETY: `i < n <= room`, the entries `infos` has room for.
        unsafe { infos.add(i).write_unaligned(entry_of(pid)) };
    }
    Ok(())
}

fn v2_entry(pid: u32) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        // The driver counts memory per function and per file, not per
        // process of another file.
        usedGpuMemory: VALUE_NOT_AVAILABLE_U64,
        gpuInstanceId: NO_INSTANCE,
        computeInstanceId: NO_INSTANCE,
    }
}

fn v1_entry(pid: u32) -> nvmlProcessInfo_v1_t {
    nvmlProcessInfo_v1_t {
        pid,
        usedGpuMemory: VALUE_NOT_AVAILABLE_U64,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_gpu(device, |g| unsafe {
        put_processes(count, infos, &g.processes(), v2_entry)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded arguments (v2 entries are v3's).
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_gpu(device, |g| unsafe {
        put_processes(count, infos, &g.processes(), v1_entry)
    })
}

/// Graphics and MPS processes: a vGPU has none.
macro_rules! no_processes {
    ($($name:ident: $entry:ty,)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut $entry,
        ) -> nvmlReturn_t {
            // SAFETY: forwarded contract.
            with_gpu(device, |_| unsafe { put_processes(count, infos, &[], v2_entry) })
        }
    )*};
}

no_processes! {
    nvmlDeviceGetGraphicsRunningProcesses: nvmlProcessInfo_t,
    nvmlDeviceGetGraphicsRunningProcesses_v2: nvmlProcessInfo_t,
    nvmlDeviceGetGraphicsRunningProcesses_v3: nvmlProcessInfo_t,
    nvmlDeviceGetMPSComputeRunningProcesses: nvmlProcessInfo_t,
    nvmlDeviceGetMPSComputeRunningProcesses_v2: nvmlProcessInfo_t,
    nvmlDeviceGetMPSComputeRunningProcesses_v3: nvmlProcessInfo_t,
}

// --- modes ------------------------------------------------------------------------------------

/// A mode query answered with one value.
macro_rules! fixed_mode {
    ($($name:ident => $value:expr,)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, mode: *mut c_uint) -> nvmlReturn_t {
            // SAFETY: the caller's out-parameter.
            with_gpu(device, |_| unsafe { put(mode, $value) })
        }
    )*};
}

fixed_mode! {
    // The driver keeps the function set up with no program using it.
    nvmlDeviceGetPersistenceMode => nvml::FEATURE_ENABLED,
    nvmlDeviceGetComputeMode => nvml::COMPUTEMODE_DEFAULT,
    nvmlDeviceGetDisplayMode => nvml::FEATURE_DISABLED,
    nvmlDeviceGetDisplayActive => nvml::FEATURE_DISABLED,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_lists_report_the_room_needed() {
        let pids = [10, 20, 30];
        let mut count: c_uint = 0;
        // SAFETY: `count` is live; no room is given, so `infos` is unused.
        let r = unsafe { put_processes(&mut count, std::ptr::null_mut(), &pids, v2_entry) };
        assert_eq!((r, count), (Err(Error::InsufficientSize), 3));

        let mut infos = [v2_entry(0); 4];
        count = 4;
        // SAFETY: `infos` has room for `count` entries.
        unsafe { put_processes(&mut count, infos.as_mut_ptr(), &pids, v2_entry) }.unwrap();
        assert_eq!(count, 3);
        assert_eq!(infos.map(|i| i.pid), [10, 20, 30, 0]);
        assert_eq!(infos[0].usedGpuMemory, VALUE_NOT_AVAILABLE_U64);

        count = 0;
        // SAFETY: no processes, nothing written.
        unsafe { put_processes(&mut count, std::ptr::null_mut(), &[], v1_entry) }.unwrap();
        assert_eq!(count, 0);
        count = 2;
        // SAFETY: a null `infos` with room claimed is refused before use.
        let r = unsafe { put_processes(&mut count, std::ptr::null_mut(), &pids[..1], v1_entry) };
        assert_eq!(r, Err(Error::InvalidArgument));
        // SAFETY: a null count is refused before use.
        let r = unsafe { put_processes(std::ptr::null_mut(), infos.as_mut_ptr(), &pids, v2_entry) };
        assert_eq!(r, Err(Error::InvalidArgument));
    }

    #[test]
    fn entry_points_before_init_are_uninitialized() {
        let _g = state::tests::SERIAL
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut n: c_uint = 0;
        let mut h: nvmlDevice_t = std::ptr::null();
        let mut buf = [0 as c_char; 96];
        // SAFETY: every pointer is live and the lengths are the buffers'.
        unsafe {
            assert_eq!(nvmlDeviceGetCount_v2(&mut n), ERROR_UNINITIALIZED);
            assert_eq!(
                nvmlDeviceGetHandleByIndex_v2(0, &mut h),
                ERROR_UNINITIALIZED
            );
            assert_eq!(
                nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 96),
                ERROR_UNINITIALIZED
            );
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"0000:00:03.0".as_ptr(), &mut h),
                ERROR_UNINITIALIZED
            );
            assert_eq!(
                nvmlDeviceGetName(h, buf.as_mut_ptr(), 96),
                ERROR_UNINITIALIZED
            );
        }
        assert_eq!(nvmlShutdown(), ERROR_UNINITIALIZED);
    }

    #[test]
    fn bad_handles_and_pointers_are_invalid_arguments() {
        let _g = state::tests::SERIAL
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !vgpu_guest::Device::list().is_empty() {
            return;
        }
        assert_eq!(nvmlInitWithFlags(INIT_FLAG_NO_GPUS), SUCCESS);
        let mut n: c_uint = 7;
        let mut h: nvmlDevice_t = std::ptr::null();
        let mut buf = [0 as c_char; 96];
        let mut mem = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: every pointer is live or null, and the lengths are the
        // buffers'.
        unsafe {
            assert_eq!(nvmlDeviceGetCount_v2(&mut n), SUCCESS);
            assert_eq!(n, 0);
            assert_eq!(
                nvmlDeviceGetCount_v2(std::ptr::null_mut()),
                ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetHandleByIndex_v2(0, &mut h),
                ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"0000:00:03.0".as_ptr(), &mut h),
                ERROR_NOT_FOUND
            );
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"nonsense".as_ptr(), &mut h),
                ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetHandleByUUID(std::ptr::null(), &mut h),
                ERROR_INVALID_ARGUMENT
            );
            let forged = 0x1000 as nvmlDevice_t;
            assert_eq!(
                nvmlDeviceGetName(forged, buf.as_mut_ptr(), 96),
                ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetMemoryInfo(forged, &mut mem),
                ERROR_INVALID_ARGUMENT
            );
            assert_eq!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 96), SUCCESS);
            assert_eq!(
                nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 4),
                ERROR_INSUFFICIENT_SIZE
            );
            let mut v: c_int = 0;
            assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut v), SUCCESS);
            assert_eq!(v, 13000);
        }
        assert_eq!(nvmlShutdown(), SUCCESS);
    }

    #[test]
    fn versions_and_capability_are_libcuda_s() {
        assert_eq!(CUDA_DRIVER_VERSION, cuda::cu::DRIVER_VERSION);
        assert_eq!(CC, (cuda::devices::CC_MAJOR, cuda::devices::CC_MINOR));
    }

    #[test]
    fn error_strings_are_static_c_strings() {
        // SAFETY: nvmlErrorString returns NUL-terminated static strings.
        let s = unsafe { std::ffi::CStr::from_ptr(nvmlErrorString(ERROR_NOT_SUPPORTED)) };
        assert_eq!(s.to_str().unwrap(), "Not Supported");
    }
}
