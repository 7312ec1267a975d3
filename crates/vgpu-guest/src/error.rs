//! Errors of the vgpu guest library.

use std::path::PathBuf;

/// A failed operation on a vgpu device.
///
/// The driver answers with an errno; the common ones have their own
/// variant (see [`Error::from_errno`]), the rest are [`Error::Os`].
/// [`Error::errno`] gives the errno back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device file cannot be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The device file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is a vgpu device of an incompatible driver version.
    #[error("{path}: driver uapi version {found}, this library speaks {expected}")]
    Version {
        /// The device file.
        path: PathBuf,
        /// Version reported by the driver.
        found: u32,
        /// [`crate::sys::UAPI_VERSION`].
        expected: u32,
    },
    /// ENOMEM: the partition's device memory (quota) is exhausted, or the
    /// guest kernel is out of memory.
    #[error("out of device memory")]
    OutOfMemory,
    /// EINVAL: a malformed request (sizes, flags, alignment, launch shape).
    #[error("invalid argument")]
    Invalid,
    /// EFAULT: a buffer the driver or device could not access.
    #[error("bad address")]
    Fault,
    /// ENOENT: an address, module or entry point this file does not own
    /// or that does not exist.
    #[error("no such device allocation, module or entry point")]
    NotFound,
    /// ERANGE: a range that runs past the end of its allocation or of
    /// the window.
    #[error("range outside its allocation or the window")]
    OutOfRange,
    /// E2BIG: a batch, copy, image or parameter block over the driver's
    /// limits.
    #[error("request too large for the driver")]
    TooBig,
    /// EOPNOTSUPP: not supported by this device or backend.
    #[error("not supported by the device")]
    Unsupported,
    /// EBUSY: too many uncollected fences on this file.
    #[error("too many uncollected fences")]
    Busy,
    /// ETIMEDOUT: the wait timed out; the work is still queued.
    #[error("timed out")]
    TimedOut,
    /// EINTR: interrupted by a signal.
    #[error("interrupted by a signal")]
    Interrupted,
    /// ENODEV: the function was removed.
    #[error("the device was removed")]
    NoDevice,
    /// EIO: the device failed, or a queue or function reset cancelled the
    /// work.
    #[error("device error or reset")]
    Io,
    /// ENOTRECOVERABLE (status CONTEXT_LOST): a kernel's fault ended this
    /// file's device context earlier; its memory and modules are gone
    /// and nothing more runs in it. Other files of the function go on.
    #[error("the device context was lost to an earlier fault")]
    ContextLost,
    /// ENOTTY: not a vgpu device, or an ioctl it does not know.
    #[error("not a vgpu device or unknown ioctl")]
    NotVgpu,
    /// Another errno.
    #[error("{0}")]
    Os(std::io::Error),
    /// SUBMIT refused the batch because of one command; nothing was
    /// queued.
    #[error("command {index} refused: {source}")]
    Rejected {
        /// Index of the command in its batch.
        index: usize,
        /// The driver's answer.
        #[source]
        source: Box<Error>,
    },
    /// A command ran (or was cancelled) and failed.
    #[error("command {index} failed with device status {status}: {source}")]
    Command {
        /// Index of the command in its batch.
        index: usize,
        /// Device completion status (`CMD_STATUS_*`).
        status: u32,
        /// The matching errno.
        #[source]
        source: Box<Error>,
    },
    /// A range outside a [`crate::Buffer`] or [`crate::Window`], caught
    /// before anything reached the driver.
    #[error("range {offset:#x}+{len:#x} is outside the {size:#x}-byte {what}")]
    Bounds {
        /// "buffer" or "window".
        what: &'static str,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Size of the buffer or window.
        size: u64,
    },
    /// A bad argument caught before anything reached the driver.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// The error for errno `errno` (positive).
    pub fn from_errno(errno: i32) -> Error {
        match errno {
            libc::ENOMEM => Error::OutOfMemory,
            libc::EINVAL => Error::Invalid,
            libc::EFAULT => Error::Fault,
            libc::ENOENT => Error::NotFound,
            libc::ERANGE => Error::OutOfRange,
            libc::E2BIG => Error::TooBig,
            libc::EOPNOTSUPP => Error::Unsupported,
            libc::EBUSY => Error::Busy,
            libc::ETIMEDOUT => Error::TimedOut,
            libc::EINTR => Error::Interrupted,
            libc::ENODEV => Error::NoDevice,
            libc::EIO => Error::Io,
            libc::ENOTRECOVERABLE => Error::ContextLost,
            libc::ENOTTY => Error::NotVgpu,
            e => Error::Os(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// The error of the last failed system call.
    pub(crate) fn last_os_error() -> Error {
        Error::from_errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// The errno this error stands for (positive), looking through
    /// [`Error::Rejected`] and [`Error::Command`].
    pub fn errno(&self) -> i32 {
        match self {
            Error::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Version { .. } => libc::EPROTO,
            Error::OutOfMemory => libc::ENOMEM,
            Error::Invalid => libc::EINVAL,
            Error::Fault => libc::EFAULT,
            Error::NotFound => libc::ENOENT,
            Error::OutOfRange => libc::ERANGE,
            Error::TooBig => libc::E2BIG,
            Error::Unsupported => libc::EOPNOTSUPP,
            Error::Busy => libc::EBUSY,
            Error::TimedOut => libc::ETIMEDOUT,
            Error::Interrupted => libc::EINTR,
            Error::NoDevice => libc::ENODEV,
            Error::Io => libc::EIO,
            Error::ContextLost => libc::ENOTRECOVERABLE,
            Error::NotVgpu => libc::ENOTTY,
            Error::Os(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Rejected { source, .. } | Error::Command { source, .. } => source.errno(),
            Error::Bounds { .. } => libc::ERANGE,
            Error::Usage(_) => libc::EINVAL,
        }
    }

    /// Whether this is (or wraps) the loss of the device context: a
    /// command that completed with CONTEXT_LOST, or an ioctl answered
    /// ENOTRECOVERABLE.
    pub fn is_context_lost(&self) -> bool {
        self.errno() == libc::ENOTRECOVERABLE
    }

    /// Whether this is (or wraps) an out-of-memory error.
    pub fn is_out_of_memory(&self) -> bool {
        self.errno() == libc::ENOMEM
    }
}

/// Result of the vgpu guest library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Symbolic name of an errno, for messages ("ENOENT").
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        0 => "0",
        libc::ENOMEM => "ENOMEM",
        libc::EINVAL => "EINVAL",
        libc::EFAULT => "EFAULT",
        libc::ENOENT => "ENOENT",
        libc::ERANGE => "ERANGE",
        libc::E2BIG => "E2BIG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EINTR => "EINTR",
        libc::ENODEV => "ENODEV",
        libc::EIO => "EIO",
        libc::ENOTTY => "ENOTTY",
        libc::ENOTRECOVERABLE => "ENOTRECOVERABLE",
        libc::EPROTO => "EPROTO",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        _ => "errno",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errno_round_trip() {
        for e in [
            libc::ENOMEM,
            libc::EINVAL,
            libc::EFAULT,
            libc::ENOENT,
            libc::ERANGE,
            libc::E2BIG,
            libc::EOPNOTSUPP,
            libc::EBUSY,
            libc::ETIMEDOUT,
            libc::EINTR,
            libc::ENODEV,
            libc::EIO,
            libc::ENOTTY,
            libc::ENOTRECOVERABLE,
            libc::EXDEV,
        ] {
            assert_eq!(Error::from_errno(e).errno(), e);
        }
        assert!(matches!(
            Error::from_errno(libc::ENOMEM),
            Error::OutOfMemory
        ));
        assert_eq!(Error::OutOfMemory.to_string(), "out of device memory");
    }

    #[test]
    fn test_wrapped_errors_keep_their_errno() {
        let e = Error::Command {
            index: 2,
            status: crate::sys::CMD_STATUS_NO_MEMORY,
            source: Box::new(Error::OutOfMemory),
        };
        assert!(e.is_out_of_memory());
        assert_eq!(
            e.to_string(),
            "command 2 failed with device status 3: out of device memory"
        );
        let r = Error::Rejected {
            index: 0,
            source: Box::new(Error::NotFound),
        };
        assert_eq!(r.errno(), libc::ENOENT);
    }

    #[test]
    fn test_a_lost_context_is_its_own_error() {
        // What the driver writes for a command of a context a fault ended.
        let e = Error::Command {
            index: 1,
            status: crate::sys::CMD_STATUS_CONTEXT_LOST,
            source: Box::new(Error::from_errno(libc::ENOTRECOVERABLE)),
        };
        assert!(e.is_context_lost());
        assert!(!e.is_out_of_memory());
        assert_eq!(
            e.to_string(),
            "command 1 failed with device status 11: the device context was lost to an earlier fault"
        );
        // ALLOC and FREE answer with the errno alone.
        assert!(matches!(
            Error::from_errno(libc::ENOTRECOVERABLE),
            Error::ContextLost
        ));
        assert!(!Error::Io.is_context_lost());
        assert_eq!(errno_name(libc::ENOTRECOVERABLE), "ENOTRECOVERABLE");
    }
}
