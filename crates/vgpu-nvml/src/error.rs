//! The library's errors, each one `nvmlReturn_t`.

use std::ffi::CStr;

use crate::nvml::{self, nvmlReturn_t};

/// Why an entry point failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("NVML is not initialized")]
    Uninitialized,
    #[error("an argument is invalid")]
    InvalidArgument,
    #[error("not supported by a vGPU")]
    NotSupported,
    #[error("no permission to open the vGPU")]
    NoPermission,
    #[error("no such device")]
    NotFound,
    #[error("the buffer is too small")]
    InsufficientSize,
    #[error("the vgpu kernel module is not loaded")]
    DriverNotLoaded,
    #[error("the structure's version is not one this library knows")]
    ArgumentVersionMismatch,
    #[error("the vGPU stopped answering")]
    GpuIsLost,
    #[error("an unexpected failure")]
    Unknown,
}

/// An entry point's result.
pub type Result<T = ()> = std::result::Result<T, Error>;

impl Error {
    /// The `nvmlReturn_t` of the error.
    pub fn code(self) -> nvmlReturn_t {
        match self {
            Error::Uninitialized => nvml::ERROR_UNINITIALIZED,
            Error::InvalidArgument => nvml::ERROR_INVALID_ARGUMENT,
            Error::NotSupported => nvml::ERROR_NOT_SUPPORTED,
            Error::NoPermission => nvml::ERROR_NO_PERMISSION,
            Error::NotFound => nvml::ERROR_NOT_FOUND,
            Error::InsufficientSize => nvml::ERROR_INSUFFICIENT_SIZE,
            Error::DriverNotLoaded => nvml::ERROR_DRIVER_NOT_LOADED,
            Error::ArgumentVersionMismatch => nvml::ERROR_ARGUMENT_VERSION_MISMATCH,
            Error::GpuIsLost => nvml::ERROR_GPU_IS_LOST,
            Error::Unknown => nvml::ERROR_UNKNOWN,
        }
    }
}

impl From<&vgpu_guest::Error> for Error {
    fn from(e: &vgpu_guest::Error) -> Error {
        use vgpu_guest::Error as G;
        match e {
            G::Open { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
                Error::NoPermission
            }
            G::Open { .. } => Error::NotFound,
            G::Invalid | G::Usage(_) => Error::InvalidArgument,
            G::Unsupported => Error::NotSupported,
            G::NoDevice | G::Io | G::TimedOut => Error::GpuIsLost,
            _ => Error::Unknown,
        }
    }
}

/// `nvmlErrorString`: a static description of `code`.
pub fn describe(code: nvmlReturn_t) -> &'static CStr {
    match code {
        nvml::SUCCESS => c"Success",
        nvml::ERROR_UNINITIALIZED => c"Uninitialized",
        nvml::ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nvml::ERROR_NOT_SUPPORTED => c"Not Supported",
        nvml::ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nvml::ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        nvml::ERROR_NOT_FOUND => c"Not Found",
        nvml::ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        nvml::ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        nvml::ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        nvml::ERROR_TIMEOUT => c"Timeout",
        nvml::ERROR_IRQ_ISSUE => c"Interrupt request issue",
        nvml::ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        nvml::ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        nvml::ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        nvml::ERROR_GPU_IS_LOST => c"GPU is lost",
        nvml::ERROR_RESET_REQUIRED => c"GPU requires reset",
        nvml::ERROR_OPERATING_SYSTEM => c"GPU access blocked by the operating system",
        nvml::ERROR_LIB_RM_VERSION_MISMATCH => c"Driver/library version mismatch",
        nvml::ERROR_IN_USE => c"In use by another client",
        nvml::ERROR_MEMORY => c"Insufficient Memory",
        nvml::ERROR_NO_DATA => c"No data",
        nvml::ERROR_VGPU_ECC_NOT_SUPPORTED => c"vGPU ECC not supported",
        nvml::ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        nvml::ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        nvml::ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        nvml::ERROR_DEPRECATED => c"Deprecated",
        nvml::ERROR_NOT_READY => c"Not ready",
        nvml::ERROR_GPU_NOT_FOUND => c"GPU not found",
        nvml::ERROR_INVALID_STATE => c"Invalid state",
        nvml::ERROR_RESET_TYPE_NOT_SUPPORTED => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_own_code_and_a_description() {
        let all = [
            Error::Uninitialized,
            Error::InvalidArgument,
            Error::NotSupported,
            Error::NoPermission,
            Error::NotFound,
            Error::InsufficientSize,
            Error::DriverNotLoaded,
            Error::ArgumentVersionMismatch,
            Error::GpuIsLost,
            Error::Unknown,
        ];
        let mut codes: Vec<_> = all.iter().map(|e| e.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert_eq!(Error::NotSupported.code(), 3);
        for e in &all[..all.len() - 1] {
            assert_ne!(describe(e.code()), c"Unknown Error", "{e:?}");
        }
        assert_eq!(describe(12345), c"Unknown Error");
    }

    #[test]
    fn an_unreadable_device_is_a_permission_error() {
        let e = vgpu_guest::Error::Open {
            path: "/dev/vgpu0".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        };
        assert_eq!(Error::from(&e), Error::NoPermission);
    }
}
