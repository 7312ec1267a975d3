//! Diagnostics and the mapping of the guest library's errors onto
//! CUDA's: shared by every layer, importing none of them.

use vgpu_guest::{sys, Error as GuestError};

use crate::cu::{self, CUresult, CuResult};

/// Writes a diagnostic line when `VGPU_CUDA_LOG` is set: a library must
/// not write to a program's stderr unasked.
pub fn log(msg: &str) {
    if std::env::var_os("VGPU_CUDA_LOG").is_some() {
        eprintln!("vgpu-cuda: {msg}");
    }
}

/// Maps the guest library's errors onto CUDA's.
pub fn cu_error(e: &GuestError) -> CUresult {
    match e {
        GuestError::OutOfMemory => cu::ERROR_OUT_OF_MEMORY,
        GuestError::Invalid | GuestError::Usage(_) | GuestError::Bounds { .. } => {
            cu::ERROR_INVALID_VALUE
        }
        GuestError::Fault => cu::ERROR_INVALID_VALUE,
        GuestError::NotFound => cu::ERROR_NOT_FOUND,
        GuestError::OutOfRange => cu::ERROR_INVALID_VALUE,
        GuestError::TooBig => cu::ERROR_INVALID_VALUE,
        GuestError::Unsupported => cu::ERROR_NOT_SUPPORTED,
        GuestError::NoDevice => cu::ERROR_NO_DEVICE,
        GuestError::TimedOut => cu::ERROR_LAUNCH_TIMEOUT,
        GuestError::Rejected { source, .. } => cu_error(source),
        GuestError::Command { status, source, .. } => match *status {
            sys::CMD_STATUS_NO_MEMORY => cu::ERROR_OUT_OF_MEMORY,
            sys::CMD_STATUS_INVALID => cu::ERROR_INVALID_VALUE,
            sys::CMD_STATUS_UNSUPPORTED => cu::ERROR_NOT_SUPPORTED,
            sys::CMD_STATUS_NOT_FOUND => cu::ERROR_NOT_FOUND,
            sys::CMD_STATUS_OUT_OF_RANGE | sys::CMD_STATUS_FAULT | sys::CMD_STATUS_KERNEL_FAULT => {
                cu::ERROR_ILLEGAL_ADDRESS
            }
            sys::CMD_STATUS_KERNEL_ASSERT => cu::ERROR_ASSERT,
            sys::CMD_STATUS_DEVICE_ERROR | sys::CMD_STATUS_CANCELLED => cu::ERROR_LAUNCH_FAILED,
            _ => cu_error(source),
        },
        _ => cu::ERROR_UNKNOWN,
    }
}

/// `?`-friendly form of [`cu_error`].
pub fn check<T>(r: vgpu_guest::Result<T>) -> CuResult<T> {
    r.map_err(|e| {
        log(&format!("device: {e}"));
        cu_error(&e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_launches_map_to_cuda_errors() {
        let cmd = |status| GuestError::Command {
            index: 0,
            status,
            source: Box::new(GuestError::Io),
        };
        for (status, want) in [
            (sys::CMD_STATUS_NO_MEMORY, cu::ERROR_OUT_OF_MEMORY),
            (sys::CMD_STATUS_OUT_OF_RANGE, cu::ERROR_ILLEGAL_ADDRESS),
            (sys::CMD_STATUS_KERNEL_FAULT, cu::ERROR_ILLEGAL_ADDRESS),
            (sys::CMD_STATUS_KERNEL_ASSERT, cu::ERROR_ASSERT),
            (sys::CMD_STATUS_DEVICE_ERROR, cu::ERROR_LAUNCH_FAILED),
        ] {
            assert_eq!(cu_error(&cmd(status)), want, "status {status}");
        }
        assert_eq!(cu_error(&GuestError::OutOfMemory), cu::ERROR_OUT_OF_MEMORY);
    }
}
