//! Initialisation, versions, error strings.

use std::ffi::c_char;

use crate::cu::{self, CUresult};
use crate::ffi::{self, entry};
use crate::state;

#[no_mangle]
pub extern "C" fn cuInit(flags: u32) -> CUresult {
    entry(|| {
        if flags != 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        state::init().map(drop)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut i32) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { ffi::put(version, cu::DRIVER_VERSION) })
}

fn error_entry(error: CUresult) -> Option<&'static (CUresult, &'static str, &'static str)> {
    cu::ERRORS.iter().find(|e| e.0 == error)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    entry(|| {
        let e = error_entry(error).ok_or(cu::ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-parameter; the text is static.
        unsafe { ffi::put(out, e.2.as_ptr().cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    entry(|| {
        let e = error_entry(error).ok_or(cu::ERROR_INVALID_VALUE)?;
        // SAFETY: as cuGetErrorString.
        unsafe { ffi::put(out, e.1.as_ptr().cast()) }
    })
}

/// Profiler control: nothing to start or stop; succeeding lets profiled
/// programs run.
#[no_mangle]
pub extern "C" fn cuProfilerStart() -> CUresult {
    cu::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuProfilerStop() -> CUresult {
    cu::SUCCESS
}
