//! Reading and writing through the pointers C callers pass, and the
//! wrapper every exported entry point runs its body in.

use std::ffi::{c_char, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result};
use crate::nvml::{self, nvmlReturn_t};

/// Runs an entry point's body, turning its result into an
/// `nvmlReturn_t`. A panic (a bug here) must not unwind into C: it
/// becomes `NVML_ERROR_UNKNOWN`.
pub fn entry(f: impl FnOnce() -> Result) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => nvml::SUCCESS,
        Ok(Err(e)) => {
            log::trace!("returning {e}");
            e.code()
        }
        Err(_) => nvml::ERROR_UNKNOWN,
    }
}

vgpu_guest::c_arg_access!(Result, Error::InvalidArgument);

/// Copies `s` and its NUL into the caller's buffer `out` of `len` bytes;
/// `NVML_ERROR_INSUFFICIENT_SIZE` (and nothing written) when it does not
/// fit, as NVML's string queries do.
///
/// # Safety
/// `out` is null or valid for writes of `len` bytes.
pub unsafe fn put_str(out: *mut c_char, len: c_uint, s: &str) -> Result {
    if out.is_null() {
        return Err(Error::InvalidArgument);
    }
    let len = len as usize;
    if len < s.len() + 1 {
        return Err(Error::InsufficientSize);
    }
    // SAFETY: writable for `len` bytes by the caller's contract, which
    // is at least `s.len() + 1`.
    let buf = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
    buf[..s.len()].copy_from_slice(s.as_bytes());
    buf[s.len()] = 0;
    Ok(())
}

/// `s` as a fixed C string field of a structure, NUL-padded (and
/// truncated to keep the last NUL).
pub fn c_field<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *o = b as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pointers_are_invalid_arguments_not_crashes() {
        // SAFETY: null is allowed by each helper's contract.
        unsafe {
            assert_eq!(
                put::<u32>(std::ptr::null_mut(), 1),
                Err(Error::InvalidArgument)
            );
            assert_eq!(get::<u32>(std::ptr::null()), Err(Error::InvalidArgument));
            assert_eq!(cstr(std::ptr::null()), Err(Error::InvalidArgument));
            assert_eq!(
                put_str(std::ptr::null_mut(), 8, "x"),
                Err(Error::InvalidArgument)
            );
        }
    }

    #[test]
    fn strings_that_do_not_fit_are_insufficient_size() {
        let mut buf = [0x55 as c_char; 8];
        // SAFETY: `buf` is writable for its length, and the lengths passed
        // are at most that.
        unsafe {
            assert_eq!(
                put_str(buf.as_mut_ptr(), 5, "vgpud"),
                Err(Error::InsufficientSize)
            );
            assert_eq!(buf[0], 0x55, "nothing written");
            put_str(buf.as_mut_ptr(), 6, "vgpud").unwrap();
        }
        let s: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        assert_eq!(&s[..7], b"vgpud\0\x55");
    }

    #[test]
    fn fields_are_nul_padded_and_keep_their_terminator() {
        let f: [c_char; 4] = c_field("ab");
        assert_eq!(f, [b'a' as c_char, b'b' as c_char, 0, 0]);
        let f: [c_char; 4] = c_field("abcdef");
        assert_eq!(f, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
    }

    #[test]
    fn a_panicking_body_is_an_error_code() {
        assert_eq!(entry(|| panic!("bug")), nvml::ERROR_UNKNOWN);
        assert_eq!(entry(|| Err(Error::NotFound)), nvml::ERROR_NOT_FOUND);
        assert_eq!(entry(|| Ok(())), nvml::SUCCESS);
    }
}
