//! Initialisation, versions, entry-point and table look-up, error strings.

use std::ffi::{c_char, c_void};

use crate::cu::{self, CUresult, CUuuid};
use crate::ffi::{self, entry};
use crate::{export, procs, state};

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

/// Resolves `symbol` for a caller built against CUDA `version`, with
/// `flags` choosing the default-stream flavour (0 default, 1 legacy, 2
/// per-thread).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller passes a NUL-terminated name.
        let name = unsafe { ffi::cstr(symbol) }?;
        if pfn.is_null() || flags > 2 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let (f, st) = match procs::lookup(name, version) {
            procs::Lookup::Found(f) => (f, cu::PROC_SUCCESS),
            procs::Lookup::VersionTooLow => (std::ptr::null_mut(), cu::PROC_VERSION_NOT_SUFFICIENT),
            procs::Lookup::Unknown => (std::ptr::null_mut(), cu::PROC_SYMBOL_NOT_FOUND),
        };
        // SAFETY: the caller's out-parameters (`status` may be null).
        unsafe {
            ffi::put(pfn, f)?;
            ffi::put_opt(status, st)?;
        }
        if f.is_null() && !name.is_empty() {
            crate::diag::log(&format!(
                "cuGetProcAddress: no {name:?} for version {version}"
            ));
            Err(cu::ERROR_NOT_FOUND)
        } else {
            // The runtime probes with an empty name at start; NVIDIA's
            // driver answers that with success and no function.
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's in- and out-parameters.
        let id = unsafe { ffi::get(id) }?;
        match export::table(&id) {
            // SAFETY: as above.
            Some(t) => unsafe { ffi::put(table, t) },
            None => {
                crate::diag::log(&format!("cuGetExportTable: no table {:02x?}", id.bytes));
                // What the runtime expects of a table a driver lacks (it
                // asks for some only to take a faster path).
                Err(cu::ERROR_NOT_FOUND)
            }
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn get(name: &std::ffi::CStr) -> (CUresult, *mut c_void, i32) {
        let (mut f, mut st) = (std::ptr::dangling_mut::<c_void>(), -1);
        // SAFETY: a NUL-terminated name and live out-parameters.
        let r = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut f, 13000, 0, &mut st) };
        (r, f, st)
    }

    #[test]
    fn an_empty_name_succeeds_with_no_function_and_an_unknown_one_fails() {
        assert_eq!(
            get(c""),
            (cu::SUCCESS, std::ptr::null_mut(), cu::PROC_SYMBOL_NOT_FOUND)
        );
        assert_eq!(
            get(c"cuNoSuchThing"),
            (
                cu::ERROR_NOT_FOUND,
                std::ptr::null_mut(),
                cu::PROC_SYMBOL_NOT_FOUND
            )
        );
        let (r, f, st) = get(c"cuMemAlloc");
        assert_eq!((r, st), (cu::SUCCESS, cu::PROC_SUCCESS));
        assert!(!f.is_null());
    }
}
