//! Diagnostics and the mapping of the guest library's errors onto
//! CUDA's: shared by every layer, importing none of them.

use std::sync::atomic::{AtomicU32, Ordering};

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
        // An ALLOC or FREE (errno only) in a context a fault ended.
        GuestError::ContextLost => cu::ERROR_CONTEXT_IS_DESTROYED,
        // The function was reset under the process (its device state lost
        // to another's fault where partitions share a GPU context): its
        // memory and modules are gone, which the error says.
        GuestError::Io => cu::ERROR_CONTEXT_IS_DESTROYED,
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
            // The device context is gone and this process saw no fault
            // that ended it; [`Sticky`] answers the fault where it did.
            sys::CMD_STATUS_CONTEXT_LOST => cu::ERROR_CONTEXT_IS_DESTROYED,
            _ => cu_error(source),
        },
        _ => cu::ERROR_UNKNOWN,
    }
}

/// Whether `e` leaves a context unusable, as NVIDIA's driver documents
/// for it ("the process must be terminated and relaunched"): every later
/// call in the context returns it again.
pub fn ends_context(e: CUresult) -> bool {
    matches!(
        e,
        cu::ERROR_ILLEGAL_ADDRESS
            | cu::ERROR_ASSERT
            | cu::ERROR_LAUNCH_FAILED
            | cu::ERROR_CONTEXT_IS_DESTROYED
    )
}

/// The sticky error of a device context: the first error that ended
/// it ([`ends_context`]), which every later call answers.
///
/// A process has one device context per vGPU, which all of its CUDA
/// contexts on that vGPU share, so this belongs to the vGPU. After a
/// kernel's fault the device answers the context's later commands with
/// CONTEXT_LOST (`CUDA_ERROR_CONTEXT_IS_DESTROYED`); where the fault
/// was seen first, they report the fault, as a GPU does.
#[derive(Debug, Default)]
pub struct Sticky(AtomicU32);

impl Sticky {
    /// `Err` with the sticky error once the context ended.
    pub fn get(&self) -> CuResult {
        match self.0.load(Ordering::Acquire) {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Passes `r` on; an error that ends the context becomes sticky (the
    /// first one wins) and is answered as the sticky error.
    pub fn keep<T>(&self, r: CuResult<T>) -> CuResult<T> {
        match r {
            Err(e) if ends_context(e) => {
                let first = match self
                    .0
                    .compare_exchange(0, e, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => e,
                    Err(kept) => kept,
                };
                if first == e {
                    log(&format!("the device context ended: error {e}"));
                }
                Err(first)
            }
            r => r,
        }
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
            assert_eq!(cu_error(&GuestError::Io), cu::ERROR_CONTEXT_IS_DESTROYED);
            assert_eq!(cu_error(&cmd(status)), want, "status {status}");
        }
        assert_eq!(cu_error(&GuestError::OutOfMemory), cu::ERROR_OUT_OF_MEMORY);
    }

    #[test]
    fn a_lost_context_is_destroyed_unless_a_fault_was_seen() {
        let lost = GuestError::Command {
            index: 3,
            status: sys::CMD_STATUS_CONTEXT_LOST,
            source: Box::new(GuestError::from_errno(libc::ENOTRECOVERABLE)),
        };
        assert_eq!(cu_error(&lost), cu::ERROR_CONTEXT_IS_DESTROYED);
        // ALLOC's answer: the errno alone.
        assert_eq!(
            cu_error(&GuestError::from_errno(libc::ENOTRECOVERABLE)),
            cu::ERROR_CONTEXT_IS_DESTROYED
        );

        // No fault seen: the loss is what every later call answers.
        let s = Sticky::default();
        assert_eq!(s.get(), Ok(()));
        assert_eq!(s.keep(check::<()>(Err(lost))), Err(709));
        assert_eq!(s.get(), Err(cu::ERROR_CONTEXT_IS_DESTROYED));
    }

    #[test]
    fn a_fault_stays_the_answer_of_every_later_call() {
        let fault = GuestError::Command {
            index: 0,
            status: sys::CMD_STATUS_KERNEL_FAULT,
            source: Box::new(GuestError::Io),
        };
        let s = Sticky::default();
        // Errors that leave the context usable are not kept.
        assert_eq!(s.keep::<()>(Err(cu::ERROR_INVALID_VALUE)), Err(1));
        assert_eq!(s.keep(Ok(5)), Ok(5));
        assert_eq!(s.get(), Ok(()));

        assert_eq!(s.keep::<()>(Err(cu_error(&fault))), Err(700));
        assert_eq!(s.get(), Err(cu::ERROR_ILLEGAL_ADDRESS));
        // The device's CONTEXT_LOST for the commands after it reads as
        // the fault.
        assert_eq!(s.keep::<()>(Err(cu::ERROR_CONTEXT_IS_DESTROYED)), Err(700));
        assert_eq!(s.keep::<()>(Err(cu::ERROR_ASSERT)), Err(700));
        assert_eq!(s.get(), Err(700));
        // Calls that never fail still succeed through keep; callers ask
        // get() first.
        assert_eq!(s.keep(Ok(())), Ok(()));
    }
}
