//! Memory pools ([`crate::pool_table`]): the entry points of `cudaMallocAsync`'s
//! pools, CUDA 11.2's device-ordinal forms and CUDA 13's location forms.

use std::ffi::c_void;

use crate::allocs::{alloc_async, free};
use crate::cu::{self, CUdevice, CUdeviceptr, CUresult, Handle, MemLocation};
use crate::ffi::{self, entry, CuResult};
use crate::pool_table::{self, Value};
use crate::state::{driver, Driver};

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location: MemLocation,
    pub win32_security: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ALLOCATION_PINNED: u32 = 1;
const LOCATION_DEVICE: i32 = 1;
const ACCESS_READWRITE: u32 = 3;

/// A device ordinal, checked.
fn device(d: &Driver, dev: CUdevice) -> CuResult<CUdevice> {
    d.gpu(dev).map(|_| dev)
}

/// The device a CUDA 13 location names for pinned memory pools.
///
/// # Safety
/// `loc` is null or the caller's location.
unsafe fn located(d: &Driver, loc: *const MemLocation, kind: u32) -> CuResult<CUdevice> {
    // SAFETY: the caller's location (null is refused).
    let l = unsafe { ffi::get(loc) }?;
    if kind != ALLOCATION_PINNED || l.kind != LOCATION_DEVICE {
        return Err(d.not_supported_because("memory pools", "only pools of device memory"));
    }
    device(d, l.id)
}

/// Writes device `dev`'s default (`current`: current) pool to `out`.
///
/// # Safety
/// `out` is the caller's out-parameter.
unsafe fn put_pool(d: &Driver, dev: CUdevice, current: bool, out: *mut Handle) -> CuResult {
    let pool = {
        let mut o = d.objects();
        let mut handle = o.handle();
        let h = || std::mem::take(&mut handle);
        if current {
            o.pools_mut().current(dev, h)
        } else {
            o.pools_mut().default_pool(dev, h)
        }
    };
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(out, pool as Handle) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(out: *mut Handle, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's out-parameter.
        unsafe { put_pool(d, device(d, dev)?, false, out) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(out: *mut Handle, dev: CUdevice) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's out-parameter.
        unsafe { put_pool(d, device(d, dev)?, true, out) }
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let dev = device(d, dev)?;
        let mut o = d.objects();
        let handle = o.handle();
        o.pools_mut().set_current(dev, pool as usize, || handle)
    })
}

/// CUDA 13's form of [`cuDeviceGetDefaultMemPool`].
#[no_mangle]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    out: *mut Handle,
    loc: *const MemLocation,
    kind: u32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's arguments.
        unsafe { put_pool(d, located(d, loc, kind)?, false, out) }
    })
}

/// CUDA 13's form of [`cuDeviceGetMemPool`].
#[no_mangle]
pub unsafe extern "C" fn cuMemGetMemPool(
    out: *mut Handle,
    loc: *const MemLocation,
    kind: u32,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's arguments.
        unsafe { put_pool(d, located(d, loc, kind)?, true, out) }
    })
}

/// CUDA 13's form of [`cuDeviceSetMemPool`].
#[no_mangle]
pub unsafe extern "C" fn cuMemSetMemPool(
    loc: *const MemLocation,
    kind: u32,
    pool: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's location.
        let dev = unsafe { located(d, loc, kind) }?;
        let mut o = d.objects();
        let handle = o.handle();
        o.pools_mut().set_current(dev, pool as usize, || handle)
    })
}

/// A pool of one device's memory; pools that export handles (for IPC)
/// are not offered.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(out: *mut Handle, props: *const PoolProps) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's properties (null is refused).
        let p = unsafe { ffi::get(props) }?;
        if p.alloc_type != ALLOCATION_PINNED || p.location.kind != LOCATION_DEVICE {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        if p.handle_types != 0 {
            return Err(d.not_supported_because("cuMemPoolCreate", "shareable handles (IPC)"));
        }
        let dev = device(d, p.location.id)?;
        // SAFETY: the caller's out-parameter, checked before the pool is made.
        unsafe { ffi::put(out, std::ptr::null_mut()) }?;
        let h = {
            let mut o = d.objects();
            let h = o.handle();
            o.pools_mut().create(dev, h);
            h
        };
        // SAFETY: as above.
        unsafe { ffi::put(out, h as Handle) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    entry(|| driver()?.objects().pools_mut().destroy(pool as usize))
}

/// Nothing is kept aside to trim.
#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: Handle, _keep: usize) -> CUresult {
    entry(|| driver()?.objects().pools().get(pool as usize).map(drop))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Handle,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    entry(|| {
        let v = driver()?.objects().pools().attribute(pool as usize, attr)?;
        // SAFETY: the caller's value of the attribute's type.
        unsafe {
            match v {
                Value::Int(x) => ffi::put(value.cast::<i32>(), x),
                Value::U64(x) => ffi::put(value.cast::<u64>(), x),
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's value of the attribute's type.
        let v = unsafe {
            if pool_table::is_int(attr) {
                Value::Int(ffi::get(value.cast::<i32>().cast_const())?)
            } else {
                Value::U64(ffi::get(value.cast::<u64>().cast_const())?)
            }
        };
        driver()?
            .objects()
            .pools_mut()
            .set_attribute(pool as usize, attr, v)
    })
}

/// Access from the pool's own device is read-write, as it always is;
/// other devices cannot be given any (no peer access).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: Handle,
    map: *const AccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let dev = d.objects().pools().get(pool as usize)?.device;
        if count > 64 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: the caller's array of `count` descriptors.
            let a = unsafe { ffi::get(map.add(i)) }?;
            let own = a.location.kind == LOCATION_DEVICE && a.location.id == dev;
            if !own || a.flags != ACCESS_READWRITE {
                return Err(cu::ERROR_INVALID_DEVICE);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut u32,
    pool: Handle,
    loc: *const MemLocation,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let dev = d.objects().pools().get(pool as usize)?.device;
        // SAFETY: the caller's location (null is refused).
        let l = unsafe { ffi::get(loc) }?;
        let own = l.kind == LOCATION_DEVICE && l.id == dev;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(flags, if own { ACCESS_READWRITE } else { 0 }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        // SAFETY: the caller's out-parameter, checked before allocating.
        unsafe { ffi::put(dptr, 0) }?;
        let addr = alloc_async(d, Some(pool as usize), size, stream)?;
        // SAFETY: as above.
        unsafe { ffi::put(dptr, addr) }.inspect_err(|_| {
            let _ = free(addr);
        })
    })
}
