//! JIT options (`CUjit_option`) as `cuModuleLoadDataEx`, `cuLinkCreate`
//! and the library loads take them: checked, the compiler's hints let
//! be (the backend compiles with its own driver), and the outputs
//! written as NVIDIA's driver writes them: the info and error logs into
//! the caller's buffers, NUL-terminated, with the log's length put back
//! in the size options' value slots (the buffer's size where the log was
//! cut), and the wall time in its slot.

use std::ffi::c_void;
use std::time::Duration;

use crate::cu::{self, CuResult};

/// What about JIT options is not supported, for the entry point to say.
pub const UNSUPPORTED: &str = "JIT options for host symbol addresses or link-time optimisation";

/// `CU_JIT_WALL_TIME` and the log options.
const WALL_TIME: u32 = 2;
const INFO_LOG_BUFFER: u32 = 3;
const INFO_LOG_BUFFER_SIZE_BYTES: u32 = 4;
const ERROR_LOG_BUFFER: u32 = 5;
const ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;
/// External symbols resolved to host-given addresses, which a module
/// the device compiles cannot take.
const GLOBAL_SYMBOL_COUNT: u32 = 19;
/// Link-time optimisation of NVVM inputs (deprecated by CUDA 12).
const LTO: u32 = 20;
/// `CU_JIT_NUM_OPTIONS`: options are below it.
const NUM_OPTIONS: u32 = 35;
/// More options than there are kinds, each several times: a count past
/// this is not an array of options.
const MAX_OPTIONS: u32 = 1024;

/// A log buffer of the caller's: its address and size, and the value
/// slot its size came in (written back with the bytes written).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Log {
    buf: usize,
    cap: usize,
    slot: usize,
}

/// The outputs a list of JIT options asks for, by address (the caller
/// keeps the arrays alive for the call, or a link's for its life, as
/// CUDA requires).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JitOutputs {
    info: Log,
    error: Log,
    /// The value slot the wall time (a `float` of milliseconds) goes to.
    wall_time: usize,
}

/// Reads `n` options at `options` with their values at `values`:
/// unknown options and a count without arrays are
/// `CUDA_ERROR_INVALID_VALUE`; options asking what the device cannot do
/// (host addresses for external symbols, link-time optimisation) are
/// `CUDA_ERROR_NOT_SUPPORTED` (which the entry point says once, see
/// [`UNSUPPORTED`]).
///
/// # Safety
/// `options` and `values` are null or hold `n` entries each, valid (with
/// what the log options point at) as long as the outputs are written.
pub unsafe fn read(n: u32, options: *const u32, values: *mut *mut c_void) -> CuResult<JitOutputs> {
    let mut out = JitOutputs::default();
    if n == 0 {
        return Ok(out);
    }
    if options.is_null() || values.is_null() || n > MAX_OPTIONS {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: within the caller's arrays of `n`.
        let (option, value) = unsafe {
            (
                options.add(i).read_unaligned(),
                values.add(i).read_unaligned(),
            )
        };
        // SAFETY: as above.
        let slot = unsafe { values.add(i) } as usize;
        match option {
            WALL_TIME => out.wall_time = slot,
            INFO_LOG_BUFFER => out.info.buf = value as usize,
            INFO_LOG_BUFFER_SIZE_BYTES => {
                out.info.cap = value as usize;
                out.info.slot = slot;
            }
            ERROR_LOG_BUFFER => out.error.buf = value as usize,
            ERROR_LOG_BUFFER_SIZE_BYTES => {
                out.error.cap = value as usize;
                out.error.slot = slot;
            }
            GLOBAL_SYMBOL_COUNT | LTO if !value.is_null() => {
                // The entry point says it once.
                return Err(cu::ERROR_NOT_SUPPORTED);
            }
            o if o < NUM_OPTIONS => {}
            _ => return Err(cu::ERROR_INVALID_VALUE),
        }
    }
    Ok(out)
}

impl JitOutputs {
    /// Writes the outputs: `info` and `error` into their logs (cut to
    /// fit, NUL-terminated; a log asked for without anything to say is
    /// emptied), and `elapsed` as the wall time.
    ///
    /// # Safety
    /// As [`read`] requires of the arrays and buffers.
    pub unsafe fn write(&self, info: &str, error: &str, elapsed: Duration) {
        for (log, text) in [(self.info, info), (self.error, error)] {
            if log.buf == 0 || log.cap == 0 {
                continue;
            }
            let n = text.len().min(log.cap - 1);
            // SAFETY: the caller's buffer of `cap` bytes, and its size
            // option's value slot.
            unsafe {
                let buf = log.buf as *mut u8;
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n);
                *buf.add(n) = 0;
                if log.slot != 0 {
                    // The log's length, or the whole buffer where it was
                    // cut, as NVIDIA's driver counts it.
                    *(log.slot as *mut usize) = text.len().min(log.cap);
                }
            }
        }
        if self.wall_time != 0 {
            let ms = elapsed.as_secs_f32() * 1000.0;
            // SAFETY: the caller's value slot, which takes a float in its
            // first bytes (the rest zeroed, as a `void *` it is).
            unsafe {
                let slot = self.wall_time as *mut usize;
                *slot = ms.to_bits() as usize;
            }
        }
    }
}

/// `CU_LIBRARY_NUM_OPTIONS`: a library's options (the runtime's table
/// of host functions, whether the image stays the caller's) are below
/// it. Both are hints here (a library keeps a copy of its image where it
/// needs one).
const LIBRARY_NUM_OPTIONS: u32 = 2;

/// Checks `n` library options at `options`, with values at `values`.
///
/// # Safety
/// Each array is null or holds `n` entries.
pub unsafe fn check_library_options(
    n: u32,
    options: *const u32,
    values: *const *mut c_void,
) -> CuResult {
    if n == 0 {
        return Ok(());
    }
    if options.is_null() || values.is_null() || n > 64 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: within the caller's array of `n`.
        if unsafe { options.add(i).read_unaligned() } >= LIBRARY_NUM_OPTIONS {
            return Err(cu::ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &mut [(u32, *mut c_void)]) -> (Vec<u32>, Vec<*mut c_void>) {
        pairs.iter().copied().unzip()
    }

    #[test]
    fn logs_are_filled_and_their_sizes_written_back() {
        let (mut info, mut err) = ([b'x'; 16], [b'y'; 8]);
        let (o, mut v) = opts(&mut [
            (INFO_LOG_BUFFER, info.as_mut_ptr().cast()),
            (INFO_LOG_BUFFER_SIZE_BYTES, 16 as *mut c_void),
            (ERROR_LOG_BUFFER, err.as_mut_ptr().cast()),
            (ERROR_LOG_BUFFER_SIZE_BYTES, 8 as *mut c_void),
            (WALL_TIME, std::ptr::null_mut()),
            (7, 4 as *mut c_void),
        ]);
        // SAFETY: six options and values; the buffers outlive the write.
        let out = unsafe { read(6, o.as_ptr(), v.as_mut_ptr()) }.unwrap();
        // SAFETY: as above.
        unsafe { out.write("", "bad instruction", Duration::from_millis(3)) };
        assert_eq!((info[0], v[1] as usize), (0, 0));
        // Cut to the buffer, NUL-terminated; the whole buffer counted.
        assert_eq!(&err, b"bad ins\0");
        assert_eq!(v[3] as usize, 8);
        // A log that fits: its length, without the NUL.
        let mut v2 = v.clone();
        v2[3] = 8 as *mut c_void;
        // SAFETY: as above.
        let out = unsafe { read(6, o.as_ptr(), v2.as_mut_ptr()) }.unwrap();
        // SAFETY: as above.
        unsafe { out.write("", "short", Duration::ZERO) };
        assert_eq!((&err[..6], v2[3] as usize), (&b"short\0"[..], 5));
        assert_eq!(f32::from_bits(v[4] as usize as u32), 3.0);
    }

    #[test]
    fn options_are_checked() {
        let (o, mut v) = opts(&mut [(NUM_OPTIONS, std::ptr::null_mut())]);
        // SAFETY: one option and value.
        let r = unsafe { read(1, o.as_ptr(), v.as_mut_ptr()) };
        assert_eq!(r, Err(cu::ERROR_INVALID_VALUE));
        // SAFETY: null arrays are refused before any read.
        let r = unsafe { read(1, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(r, Err(cu::ERROR_INVALID_VALUE));
        // SAFETY: no options, nothing read.
        let r = unsafe { read(0, std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(r, Ok(JitOutputs::default()));
        let (o, mut v) = opts(&mut [(GLOBAL_SYMBOL_COUNT, 2 as *mut c_void)]);
        // SAFETY: one option and value.
        let r = unsafe { read(1, o.as_ptr(), v.as_mut_ptr()) };
        assert_eq!(r, Err(cu::ERROR_NOT_SUPPORTED));
    }
}
