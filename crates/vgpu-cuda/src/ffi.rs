//! Reading and writing through the pointers C callers pass, and the
//! wrapper every exported entry point runs its body in.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::cu::{self, CUresult};

pub use crate::cu::CuResult;

/// Runs an entry point's body, turning its result into a `CUresult`. A
/// panic (a bug here) must not unwind into C: it becomes
/// `CUDA_ERROR_UNKNOWN`. Calls are traced (with `VGPU_CUDA_LOG`, once
/// per entry point and result) by the entry point's source location.
#[track_caller]
pub fn entry(f: impl FnOnce() -> CuResult) -> CUresult {
    let at = std::panic::Location::caller();
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => cu::SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => cu::ERROR_UNKNOWN,
    };
    crate::state::trace_call(at, r);
    r
}

vgpu_guest::c_arg_access!(CuResult, cu::ERROR_INVALID_VALUE);

/// [`put`] for an out-parameter the caller may pass as null, to skip it.
///
/// # Safety
/// As for [`put`].
pub unsafe fn put_opt<T>(p: *mut T, v: T) -> CuResult {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded to the caller.
    unsafe { put(p, v) }
}

/// `len` bytes of host memory at `p`.
///
/// # Safety
/// `p` is valid for reads of `len` bytes for `'a` (or `len` is 0).
pub unsafe fn bytes<'a>(p: *const u8, len: usize) -> CuResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: readable for `len` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The `len` values of an array of the caller's at `p`.
///
/// # Safety
/// `p` is valid for reads of `len` values of `T` for `'a` (or `len` is
/// 0).
pub unsafe fn slice<'a, T>(p: *const T, len: usize) -> CuResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    let fits = len
        .checked_mul(std::mem::size_of::<T>())
        .is_some_and(|b| b <= isize::MAX as usize);
    if p.is_null() || !p.is_aligned() || !fits {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: readable for `len` values by the caller's contract; not
    // null, aligned, and within isize::MAX bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `len` writable bytes of host memory at `p`.
///
/// # Safety
/// `p` is valid for writes of `len` bytes for `'a`, and nothing else
/// accesses them meanwhile (or `len` is 0).
pub unsafe fn bytes_mut<'a>(p: *mut u8, len: usize) -> CuResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: writable for `len` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Copies `s` into the caller's buffer `out` of `len` bytes, truncated
/// and always NUL-terminated (as `cuDeviceGetName` does).
///
/// # Safety
/// `out` is null or valid for writes of `len` bytes.
pub unsafe fn put_str(out: *mut c_char, len: i32, s: &str) -> CuResult {
    let len = usize::try_from(len).map_err(|_| cu::ERROR_INVALID_VALUE)?;
    if len == 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: forwarded contract.
    let buf = unsafe { bytes_mut(out.cast(), len) }?;
    let n = s.len().min(len - 1);
    buf[..n].copy_from_slice(&s.as_bytes()[..n]);
    buf[n] = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pointers_are_invalid_values_not_crashes() {
        // SAFETY: null is allowed by each helper's contract.
        unsafe {
            assert_eq!(
                put::<u32>(std::ptr::null_mut(), 1),
                Err(cu::ERROR_INVALID_VALUE)
            );
            assert_eq!(get::<u32>(std::ptr::null()), Err(cu::ERROR_INVALID_VALUE));
            assert_eq!(cstr(std::ptr::null()), Err(cu::ERROR_INVALID_VALUE));
            assert_eq!(bytes(std::ptr::null(), 4), Err(cu::ERROR_INVALID_VALUE));
            assert_eq!(bytes(std::ptr::null(), 0), Ok(&[][..]));
        }
    }

    #[test]
    fn put_str_truncates_and_terminates() {
        let mut buf = [0x55 as c_char; 6];
        // SAFETY: `buf` is writable for its length.
        unsafe { put_str(buf.as_mut_ptr(), 6, "vgpud vGPU") }.unwrap();
        let s: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        assert_eq!(&s, b"vgpud\0");
        // SAFETY: as above.
        let r = unsafe { put_str(buf.as_mut_ptr(), 0, "x") };
        assert_eq!(r, Err(cu::ERROR_INVALID_VALUE));
    }

    #[test]
    fn a_panicking_body_is_an_error_code() {
        assert_eq!(entry(|| panic!("bug")), cu::ERROR_UNKNOWN);
        assert_eq!(entry(|| Err(cu::ERROR_NOT_FOUND)), cu::ERROR_NOT_FOUND);
        assert_eq!(entry(|| Ok(())), cu::SUCCESS);
    }
}
