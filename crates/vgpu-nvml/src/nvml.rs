//! The C types, constants and structure layouts of NVIDIA's `nvml.h`
//! that this library's entry points take or return.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_uint, c_ulonglong};

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;

pub const SUCCESS: nvmlReturn_t = 0;
pub const ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
pub const ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const ERROR_INSUFFICIENT_POWER: nvmlReturn_t = 8;
pub const ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const ERROR_IRQ_ISSUE: nvmlReturn_t = 11;
pub const ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const ERROR_CORRUPTED_INFOROM: nvmlReturn_t = 14;
pub const ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const ERROR_OPERATING_SYSTEM: nvmlReturn_t = 17;
pub const ERROR_LIB_RM_VERSION_MISMATCH: nvmlReturn_t = 18;
pub const ERROR_IN_USE: nvmlReturn_t = 19;
pub const ERROR_MEMORY: nvmlReturn_t = 20;
pub const ERROR_NO_DATA: nvmlReturn_t = 21;
pub const ERROR_VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t = 22;
pub const ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
pub const ERROR_FREQ_NOT_SUPPORTED: nvmlReturn_t = 24;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const ERROR_DEPRECATED: nvmlReturn_t = 26;
pub const ERROR_NOT_READY: nvmlReturn_t = 27;
pub const ERROR_GPU_NOT_FOUND: nvmlReturn_t = 28;
pub const ERROR_INVALID_STATE: nvmlReturn_t = 29;
pub const ERROR_RESET_TYPE_NOT_SUPPORTED: nvmlReturn_t = 30;
pub const ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `NVML_INIT_FLAG_NO_GPUS`: initialisation succeeds without GPUs.
pub const INIT_FLAG_NO_GPUS: c_uint = 1;

/// `nvmlEnableState_t`.
pub const FEATURE_DISABLED: c_uint = 0;
pub const FEATURE_ENABLED: c_uint = 1;
/// `NVML_COMPUTEMODE_DEFAULT`: several contexts per device.
pub const COMPUTEMODE_DEFAULT: c_uint = 0;

/// `NVML_VALUE_NOT_AVAILABLE`, in an unsigned 64-bit field.
pub const VALUE_NOT_AVAILABLE_U64: c_ulonglong = u64::MAX;
/// A process's GPU or compute instance outside MIG.
pub const NO_INSTANCE: c_uint = 0xffff_ffff;

pub const DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
/// `NVML_DEVICE_UUID_ASCII_LEN`: `GPU-` and 36 characters, and the NUL.
pub const DEVICE_UUID_ASCII_LEN: usize = 41;

/// `struct nvmlDevice_st`: never read through; a handle is the address
/// of one of this library's device records.
#[repr(C)]
pub struct nvmlDevice_st {
    _opaque: [u8; 0],
}

/// `nvmlDevice_t`: an opaque pointer this library hands out.
pub type nvmlDevice_t = *const nvmlDevice_st;

/// `NVML_STRUCT_VERSION(name, ver)`: the size, and the version in the top
/// byte.
pub const fn struct_version(size: usize, ver: u32) -> c_uint {
    size as c_uint | (ver << 24)
}

/// `nvmlPciInfo_t`, as `nvmlDeviceGetPciInfo_v2` and `_v3` fill it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

/// The first `nvmlPciInfo_t`, which `nvmlDeviceGetPciInfo` (v1) fills:
/// a 16-byte bus id first, and reserved words last.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlPciInfo_v1_t {
    pub busId: [c_char; DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub reserved: [c_uint; 4],
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`.
pub const MEMORY_V2: c_uint = struct_version(std::mem::size_of::<nvmlMemory_v2_t>(), 2);

/// `nvmlBAR1Memory_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: c_ulonglong,
    pub bar1Free: c_ulonglong,
    pub bar1Used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` of the `_v3` calls.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_are_nvml_h_s() {
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(size_of::<nvmlPciInfo_v1_t>(), 52);
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(MEMORY_V2, 40 | 2 << 24);
        assert_eq!(size_of::<nvmlBAR1Memory_t>(), 24);
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessInfo_t, gpuInstanceId), 16);
    }
}
