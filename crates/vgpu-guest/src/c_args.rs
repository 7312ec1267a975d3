//! Access to the pointers C callers pass, shared by the C libraries built
//! on this crate; each names its own result type and null-argument error.

/// Defines `put`, `get` and `cstr` for C arguments, failing with `$err`
/// (of result type `$res`) where a pointer is null or a string not UTF-8.
#[macro_export]
macro_rules! c_arg_access {
    ($res:ident, $err:expr) => {
        /// Writes `v` to the caller's out-parameter `p`.
        ///
        /// # Safety
        /// `p` is null or valid for a write of a `T` (the API contract of
        /// every out-parameter).
        pub unsafe fn put<T>(p: *mut T, v: T) -> $res<()> {
            if p.is_null() {
                return Err($err);
            }
            // SAFETY: non-null, and valid for writes by the caller's
            // contract; `write_unaligned` because C callers may pack
            // structures.
            unsafe { p.write_unaligned(v) };
            Ok(())
        }

        /// Reads the caller's in-parameter `p`.
        ///
        /// # Safety
        /// `p` is null or valid for a read of a `T`.
        pub unsafe fn get<T: Copy>(p: *const T) -> $res<T> {
            if p.is_null() {
                return Err($err);
            }
            // SAFETY: non-null and readable by the caller's contract.
            Ok(unsafe { p.read_unaligned() })
        }

        /// The NUL-terminated string at `p`.
        ///
        /// # Safety
        /// `p` is null or points to a NUL-terminated string that outlives
        /// `'a`.
        pub unsafe fn cstr<'a>(p: *const ::std::ffi::c_char) -> $res<&'a str> {
            if p.is_null() {
                return Err($err);
            }
            // SAFETY: a NUL-terminated string by the caller's contract.
            let s = unsafe { ::std::ffi::CStr::from_ptr(p) };
            s.to_str().map_err(|_| $err)
        }
    };
}
