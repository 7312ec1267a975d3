//! Devices and their primary contexts. A device is a vGPU: its memory is
//! the partition's quota, its SM count the SMs its kernels run on (the
//! device's COMPUTE_UNITS register).

use std::ffi::c_char;

use crate::cu::{self, CUdevice, CUresult, CUuuid, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::state::{driver, Gpu};

/// The compute capability reported: the PTX the device runs is compiled
/// for it, and programs pick kernels by it.
pub const CC_MAJOR: i32 = 9;
pub const CC_MINOR: i32 = 0;

/// The value of device attribute `attr`, as a GPU of this capability
/// reports it; features a vGPU lacks (concurrent managed access, peer access,
/// textures, ...) read 0, as on a GPU without them.
pub fn attribute(g: &Gpu, attr: i32) -> CuResult<i32> {
    let sms = i32::try_from(g.info.compute_units.max(1)).unwrap_or(i32::MAX);
    Ok(match attr {
        cu::ATTR_MAX_THREADS_PER_BLOCK => 1024,
        cu::ATTR_MAX_BLOCK_DIM_X | cu::ATTR_MAX_BLOCK_DIM_Y => 1024,
        cu::ATTR_MAX_BLOCK_DIM_Z => 64,
        cu::ATTR_MAX_GRID_DIM_X => i32::MAX,
        cu::ATTR_MAX_GRID_DIM_Y | cu::ATTR_MAX_GRID_DIM_Z => 65535,
        cu::ATTR_MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        // What a kernel may opt in to (cuFuncSetAttribute), as on a
        // Hopper GPU; the host's driver enforces its own limit again.
        cu::ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        cu::ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        cu::ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK => 1 << 10,
        cu::ATTR_TOTAL_CONSTANT_MEMORY => 64 << 10,
        cu::ATTR_WARP_SIZE => 32,
        cu::ATTR_MAX_PITCH => i32::MAX,
        cu::ATTR_MAX_REGISTERS_PER_BLOCK | cu::ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        cu::ATTR_CLOCK_RATE => 1_755_000,
        cu::ATTR_MEMORY_CLOCK_RATE => 2_619_000,
        cu::ATTR_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        cu::ATTR_L2_CACHE_SIZE => 50 << 20,
        cu::ATTR_TEXTURE_ALIGNMENT | cu::ATTR_SURFACE_ALIGNMENT => 512,
        cu::ATTR_TEXTURE_PITCH_ALIGNMENT => 32,
        cu::ATTR_GPU_OVERLAP | cu::ATTR_CONCURRENT_KERNELS => 1,
        cu::ATTR_ASYNC_ENGINE_COUNT => 1,
        cu::ATTR_MULTIPROCESSOR_COUNT => sms,
        cu::ATTR_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        cu::ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        cu::ATTR_CAN_MAP_HOST_MEMORY => 0,
        cu::ATTR_UNIFIED_ADDRESSING => 1,
        // Managed memory without concurrent access (crate::managed): the
        // host uses it while the device is idle.
        cu::ATTR_MANAGED_MEMORY => 1,
        // Stream-ordered allocations and their pools (crate::pools);
        // none exports handles (MEMPOOL_SUPPORTED_HANDLE_TYPES 0).
        cu::ATTR_MEMORY_POOLS_SUPPORTED => 1,
        cu::ATTR_PCI_DOMAIN_ID => g.info.pci_domain as i32,
        cu::ATTR_PCI_BUS_ID => i32::from(g.info.pci_bus),
        cu::ATTR_PCI_DEVICE_ID => i32::from(g.info.pci_devfn >> 3),
        cu::ATTR_GPU_PCI_SUBSYSTEM_ID => {
            (i32::from(g.info.subsystem_id) << 16) | i32::from(g.info.subsystem_vendor_id)
        }
        cu::ATTR_COMPUTE_CAPABILITY_MAJOR => CC_MAJOR,
        cu::ATTR_COMPUTE_CAPABILITY_MINOR => CC_MINOR,
        cu::ATTR_STREAM_PRIORITIES_SUPPORTED => 1,
        cu::ATTR_GLOBAL_L1_CACHE_SUPPORTED | cu::ATTR_LOCAL_L1_CACHE_SUPPORTED => 1,
        cu::ATTR_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        cu::ATTR_COMPUTE_PREEMPTION_SUPPORTED => 1,
        cu::ATTR_CLUSTER_LAUNCH => 1,
        // cuMemHostRegister works on any host range (copies read it in
        // place).
        cu::ATTR_HOST_REGISTER_SUPPORTED => 1,
        // Stream memory operations, 64-bit words and NOR included, on
        // page-locked host memory (api::stream).
        cu::ATTR_CAN_USE_STREAM_MEM_OPS_V1
        | cu::ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS_V1
        | cu::ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR_V1
        | cu::ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS
        | cu::ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR => 1,
        cu::ATTR_NUMA_ID | cu::ATTR_HOST_NUMA_ID => -1,
        a if (1..cu::ATTR_END).contains(&a) => 0,
        _ => return Err(cu::ERROR_INVALID_VALUE),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> CUresult {
    entry(|| {
        let n = driver()?.gpus.len() as i32;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) -> CUresult {
    entry(|| {
        driver()?.gpu(ordinal)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(device, ordinal) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) -> CUresult {
    entry(|| {
        let g = driver()?.gpu(dev)?;
        // SAFETY: `name` is writable for `len` bytes.
        unsafe { ffi::put_str(name, len, &g.name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry(|| {
        let g = driver()?.gpu(dev)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(uuid, CUuuid { bytes: g.uuid }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry(|| {
        let g = driver()?.gpu(dev)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(bytes, g.info.mem_size as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut i32,
    attr: i32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let v = attribute(driver()?.gpu(dev)?, attr)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(value, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut i32,
    minor: *mut i32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        driver()?.gpu(dev)?;
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put(major, CC_MAJOR)?;
            ffi::put(minor, CC_MINOR)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    out: *mut c_char,
    len: i32,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let g = driver()?.gpu(dev)?;
        let id = format!(
            "{:08x}:{:02x}:{:02x}.{:x}",
            g.info.pci_domain,
            g.info.pci_bus,
            g.info.pci_devfn >> 3,
            g.info.pci_devfn & 7
        );
        // SAFETY: `out` is writable for `len` bytes.
        unsafe { ffi::put_str(out, len, &id) }
    })
}

/// The device of a PCI bus id as `cuDeviceGetPCIBusId` writes it
/// (`domain:bus:device.function`, the domain optional, hexadecimal in
/// either case).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult {
    entry(|| {
        // SAFETY: the caller's NUL-terminated id.
        let id = unsafe { ffi::cstr(id) }?;
        let (domain, bus, slot, func) = parse_bus_id(id).ok_or(cu::ERROR_INVALID_VALUE)?;
        let n = driver()?
            .gpus
            .iter()
            .position(|g| {
                g.info.pci_domain == domain
                    && u32::from(g.info.pci_bus) == bus
                    && u32::from(g.info.pci_devfn) == (slot << 3 | func)
            })
            .ok_or(cu::ERROR_INVALID_DEVICE)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(dev, n as CUdevice) }
    })
}

/// `[domain:]bus:device.function` in hexadecimal.
fn parse_bus_id(id: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |s: &str| {
        (!s.is_empty() && s.len() <= 8)
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (head, func) = id.trim().rsplit_once('.')?;
    let mut parts: Vec<&str> = head.split(':').collect();
    let slot = hex(parts.pop()?)?;
    let bus = hex(parts.pop()?)?;
    let domain = match parts.as_slice() {
        [] => 0,
        [d] => hex(d)?,
        _ => return None,
    };
    let func = hex(func)?;
    (bus <= 0xff && slot <= 0x1f && func <= 7).then_some((domain, bus, slot, func))
}

/// What two vGPUs can do to each other's memory: nothing (no peer
/// access between them).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut i32,
    attrib: u32,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(src)?;
        d.gpu(dst)?;
        // Performance rank, access, native atomics, array access.
        if src == dst || !(1..=4).contains(&attrib) {
            return Err(if src == dst {
                cu::ERROR_INVALID_DEVICE
            } else {
                cu::ERROR_INVALID_VALUE
            });
        }
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(value, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut i32,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        d.gpu(peer)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(can, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        let ctx = d.gpu(dev)?.primary;
        d.objects().primary_refs[dev as usize] += 1;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pctx, ctx as Handle) }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        let mut o = d.objects();
        let refs = &mut o.primary_refs[dev as usize];
        *refs = refs.checked_sub(1).ok_or(cu::ERROR_INVALID_CONTEXT)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut u32,
    active: *mut i32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        let (f, a) = {
            let o = d.objects();
            (
                o.primary_flags[dev as usize],
                o.primary_refs[dev as usize] > 0,
            )
        };
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put(flags, f)?;
            ffi::put(active, i32::from(a))
        }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(dev)?;
        d.objects().primary_flags[dev as usize] = flags;
        Ok(())
    })
}

/// Destroys what the primary context holds: runs the context-local
/// storage destructors (the runtime's own state lives there).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        let gpu = d.gpu(dev)?;
        // As a context's destruction does: its work ends first, and what
        // its kernels printed comes out (programs end with
        // cudaDeviceReset and rely on that).
        gpu.wait_idle();
        let ctx = gpu.primary;
        let storage = {
            let mut o = d.objects();
            o.primary_refs[dev as usize] = 0;
            let c = o.ctxs.get_mut(&ctx).ok_or(cu::ERROR_INVALID_CONTEXT)?;
            std::mem::take(&mut c.storage)
        };
        // Outside the lock: a destructor may call back into the driver.
        for (key, (value, dtor)) in storage {
            if let Some(f) = dtor {
                f(ctx as Handle, key as *mut _, value as *mut _);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_bus_id;

    #[test]
    fn bus_ids_parse_as_cuda_writes_and_reads_them() {
        assert_eq!(parse_bus_id("00000000:00:02.0"), Some((0, 0, 2, 0)));
        assert_eq!(parse_bus_id("0000:3B:1f.7"), Some((0, 0x3b, 0x1f, 7)));
        assert_eq!(parse_bus_id("00:02.0"), Some((0, 0, 2, 0)));
        for bad in [
            "",
            "00:02",
            "0:0:0:02.0",
            "00:20.0",
            "00:02.8",
            "100:00.0",
            "zz:02.0",
            "000000000:00:02.0",
        ] {
            assert_eq!(parse_bus_id(bad), None, "{bad:?}");
        }
    }
}
