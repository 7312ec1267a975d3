//! Virtual memory management: address reservations, physical
//! allocations, their mappings and access ([`crate::vmm`]).

use std::ffi::c_void;

use crate::cu::{CUdeviceptr, CUresult, MemLocation};
use crate::ffi::{self, entry};
use crate::vmm::{self, AccessDesc, AllocationProp};

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    option: i32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's property structure.
        let p = unsafe { ffi::get(prop) }?;
        let g = vmm::granularity(&p, option)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(granularity, g as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's out-parameter, checked before reserving.
        unsafe { ffi::put(ptr, 0) }?;
        let a = vmm::reserve(size as u64, alignment as u64, addr, flags)?;
        // SAFETY: as above.
        unsafe { ffi::put(ptr, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| vmm::address_free(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: u64,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's property structure and out-parameter.
        let p = unsafe { ffi::get(prop) }?;
        // SAFETY: as above.
        unsafe { ffi::put(handle, 0) }?;
        let h = vmm::create(size as u64, &p, flags)?;
        // SAFETY: as above.
        unsafe { ffi::put(handle, h) }.inspect_err(|_| {
            let _ = vmm::release(h);
        })
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    entry(|| vmm::release(handle))
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    entry(|| vmm::map(ptr, size as u64, offset as u64, handle, flags))
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| vmm::unmap(ptr, size as u64))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        // SAFETY: `count` descriptors at `desc`.
        let d = unsafe { ffi::slice(desc, count) }?;
        vmm::set_access(ptr, size as u64, d)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const MemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's location and out-parameter.
        let l = unsafe { ffi::get(location) }?;
        let a = vmm::get_access(&l, ptr)?;
        // SAFETY: as above.
        unsafe { ffi::put(flags, u64::from(a)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's out-parameter, checked before retaining.
        unsafe { ffi::put(handle, 0) }?;
        let h = vmm::retain(addr as u64)?;
        // SAFETY: as above.
        unsafe { ffi::put(handle, h) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut AllocationProp,
    handle: u64,
) -> CUresult {
    entry(|| {
        let p = vmm::properties(handle)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(prop, p) }
    })
}

/// POSIX file descriptors only, naming allocations of this process
/// ([`crate::vmm`]).
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: i32,
    flags: u64,
) -> CUresult {
    entry(|| {
        if shareable.is_null() {
            return Err(crate::cu::ERROR_INVALID_VALUE);
        }
        let fd = vmm::export_fd(handle, kind, flags)?;
        // SAFETY: an `int` for a POSIX file descriptor, by cuda.h.
        unsafe { ffi::put(shareable.cast::<i32>(), fd) }.inspect_err(|_| {
            // SAFETY: the descriptor just made, given to no one.
            unsafe { libc::close(fd) };
        })
    })
}

/// For a POSIX file descriptor, `os_handle` is the descriptor itself
/// (cast to a pointer), as `cuda.h` documents.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: i32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's out-parameter, checked before importing.
        unsafe { ffi::put(handle, 0) }?;
        let fd = i32::try_from(os_handle as usize).map_err(|_| crate::cu::ERROR_INVALID_VALUE)?;
        let h = vmm::import_fd(fd, kind)?;
        // SAFETY: as above.
        unsafe { ffi::put(handle, h) }
    })
}
