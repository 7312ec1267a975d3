//! Devices and their primary contexts. A device is a vGPU: its memory is
//! the partition's quota, its SM count the SMs its kernels run on (the
//! device's COMPUTE_UNITS register).

use std::ffi::c_char;

use crate::cu::{self, CUdevice, CUresult, CUuuid, Handle};
use crate::devices::{attribute, CC_MAJOR, CC_MINOR};
use crate::diag::check;
use crate::ffi::{self, entry};
use crate::state::driver;

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
        // The quota now: a live resize changes it.
        let total = check(g.dev.usage())?.total(&g.info);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(bytes, total as usize) }
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
        d.objects().ctxs_mut().retain_primary(dev);
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
        o.ctxs_mut().release_primary(dev)
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
        let (f, a) = d.objects().ctxs().primary_state(dev);
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
        d.objects().ctxs_mut().set_primary_flags(dev, flags);
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
            o.ctxs_mut().reset_primary(dev);
            let c = o.ctxs_mut().ctxs.get_mut(ctx)?;
            c.take_storage()
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
