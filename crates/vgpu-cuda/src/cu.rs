//! The C types and constants of the CUDA driver API (`cuda.h`) this
//! library uses, by value: the ABI is what matters, not the names.

#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// `CUresult`.
pub type CUresult = u32;
/// What a call returns: `Err` carries the CUDA error.
pub type CuResult<T = ()> = Result<T, CUresult>;
/// `CUdevice`: an ordinal.
pub type CUdevice = i32;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// Opaque handles (`CUcontext`, `CUmodule`, `CUfunction`, ...): this
/// library's handle numbers, never dereferenced by callers.
pub type Handle = *mut c_void;

pub const SUCCESS: CUresult = 0;
pub const ERROR_INVALID_VALUE: CUresult = 1;
pub const ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const ERROR_NOT_INITIALIZED: CUresult = 3;
pub const ERROR_DEINITIALIZED: CUresult = 4;
pub const ERROR_NO_DEVICE: CUresult = 100;
pub const ERROR_INVALID_DEVICE: CUresult = 101;
pub const ERROR_INVALID_IMAGE: CUresult = 200;
pub const ERROR_INVALID_CONTEXT: CUresult = 201;
pub const ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const ERROR_INVALID_PTX: CUresult = 218;
pub const ERROR_UNSUPPORTED_EXEC_AFFINITY: CUresult = 224;
pub const ERROR_INVALID_SOURCE: CUresult = 300;
pub const ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const ERROR_OPERATING_SYSTEM: CUresult = 304;
pub const ERROR_INVALID_HANDLE: CUresult = 400;
pub const ERROR_ILLEGAL_STATE: CUresult = 401;
pub const ERROR_NOT_FOUND: CUresult = 500;
pub const ERROR_NOT_READY: CUresult = 600;
pub const ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const ERROR_LAUNCH_TIMEOUT: CUresult = 702;
pub const ERROR_ASSERT: CUresult = 710;
pub const ERROR_UNSUPPORTED_LIMIT: CUresult = 215;
pub const ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const ERROR_LAUNCH_FAILED: CUresult = 719;
pub const ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
pub const ERROR_NOT_SUPPORTED: CUresult = 801;
pub const ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const ERROR_STREAM_CAPTURE_UNMATCHED: CUresult = 903;
pub const ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;
pub const ERROR_UNKNOWN: CUresult = 999;

/// Every error code this library returns, with its `cuGetErrorName`
/// name and `cuGetErrorString` text (NUL-terminated for C).
pub const ERRORS: &[(CUresult, &str, &str)] = &[
    (SUCCESS, "CUDA_SUCCESS\0", "no error\0"),
    (
        ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE\0",
        "invalid argument\0",
    ),
    (
        ERROR_OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY\0",
        "out of memory\0",
    ),
    (
        ERROR_NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED\0",
        "initialization error\0",
    ),
    (
        ERROR_DEINITIALIZED,
        "CUDA_ERROR_DEINITIALIZED\0",
        "driver shutting down\0",
    ),
    (
        ERROR_NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        ERROR_INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        ERROR_INVALID_IMAGE,
        "CUDA_ERROR_INVALID_IMAGE\0",
        "device kernel image is invalid\0",
    ),
    (
        ERROR_UNSUPPORTED_LIMIT,
        "CUDA_ERROR_UNSUPPORTED_LIMIT\0",
        "limit is not supported on this architecture\0",
    ),
    (
        ERROR_INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        ERROR_NO_BINARY_FOR_GPU,
        "CUDA_ERROR_NO_BINARY_FOR_GPU\0",
        "no kernel image is available for execution on the device\0",
    ),
    (
        ERROR_INVALID_PTX,
        "CUDA_ERROR_INVALID_PTX\0",
        "a PTX JIT compilation failed\0",
    ),
    (
        ERROR_UNSUPPORTED_EXEC_AFFINITY,
        "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY\0",
        "the provided execution affinity is not supported\0",
    ),
    (
        ERROR_PEER_ACCESS_UNSUPPORTED,
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED\0",
        "peer access is not supported between these two devices\0",
    ),
    (
        ERROR_PEER_ACCESS_NOT_ENABLED,
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0",
        "peer access has not been enabled\0",
    ),
    (
        ERROR_INVALID_SOURCE,
        "CUDA_ERROR_INVALID_SOURCE\0",
        "device kernel image is invalid\0",
    ),
    (
        ERROR_OPERATING_SYSTEM,
        "CUDA_ERROR_OPERATING_SYSTEM\0",
        "OS call failed or operation not supported on this OS\0",
    ),
    (
        ERROR_FILE_NOT_FOUND,
        "CUDA_ERROR_FILE_NOT_FOUND\0",
        "file not found\0",
    ),
    (
        ERROR_INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        ERROR_ILLEGAL_STATE,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (
        ERROR_NOT_FOUND,
        "CUDA_ERROR_NOT_FOUND\0",
        "named symbol not found\0",
    ),
    (
        ERROR_NOT_READY,
        "CUDA_ERROR_NOT_READY\0",
        "device not ready\0",
    ),
    (
        ERROR_ILLEGAL_ADDRESS,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        ERROR_LAUNCH_OUT_OF_RESOURCES,
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0",
        "too many resources requested for launch\0",
    ),
    (
        ERROR_LAUNCH_TIMEOUT,
        "CUDA_ERROR_LAUNCH_TIMEOUT\0",
        "the launch timed out and was terminated\0",
    ),
    (
        ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED\0",
        "part or all of the requested memory range is already mapped\0",
    ),
    (
        ERROR_HOST_MEMORY_NOT_REGISTERED,
        "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED\0",
        "pointer does not correspond to a registered memory region\0",
    ),
    (
        ERROR_CONTEXT_IS_DESTROYED,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED\0",
        "context is destroyed\0",
    ),
    (
        ERROR_ASSERT,
        "CUDA_ERROR_ASSERT\0",
        "device-side assert triggered\0",
    ),
    (
        ERROR_LAUNCH_FAILED,
        "CUDA_ERROR_LAUNCH_FAILED\0",
        "unspecified launch failure\0",
    ),
    (
        ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE\0",
        "too many blocks in cooperative launch\0",
    ),
    (
        ERROR_NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        ERROR_STREAM_CAPTURE_UNSUPPORTED,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
        "operation not permitted when stream is capturing\0",
    ),
    (
        ERROR_STREAM_CAPTURE_INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0",
        "operation failed due to a previous error during capture\0",
    ),
    (
        ERROR_STREAM_CAPTURE_UNMATCHED,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0",
        "capture was not initiated in this stream\0",
    ),
    (ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

/// The driver API version this library implements (`cuDriverGetVersion`):
/// CUDA 13.0, so runtimes of CUDA 12 and 13.0 accept it.
pub const DRIVER_VERSION: i32 = 13000;

// CUdevice_attribute values this library answers with more than 0.
pub const ATTR_MAX_THREADS_PER_BLOCK: i32 = 1;
pub const ATTR_MAX_BLOCK_DIM_X: i32 = 2;
pub const ATTR_MAX_BLOCK_DIM_Y: i32 = 3;
pub const ATTR_MAX_BLOCK_DIM_Z: i32 = 4;
pub const ATTR_MAX_GRID_DIM_X: i32 = 5;
pub const ATTR_MAX_GRID_DIM_Y: i32 = 6;
pub const ATTR_MAX_GRID_DIM_Z: i32 = 7;
pub const ATTR_MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
pub const ATTR_TOTAL_CONSTANT_MEMORY: i32 = 9;
pub const ATTR_WARP_SIZE: i32 = 10;
pub const ATTR_MAX_PITCH: i32 = 11;
pub const ATTR_MAX_REGISTERS_PER_BLOCK: i32 = 12;
pub const ATTR_CLOCK_RATE: i32 = 13;
pub const ATTR_TEXTURE_ALIGNMENT: i32 = 14;
pub const ATTR_GPU_OVERLAP: i32 = 15;
pub const ATTR_MULTIPROCESSOR_COUNT: i32 = 16;
pub const ATTR_CAN_MAP_HOST_MEMORY: i32 = 19;
pub const ATTR_SURFACE_ALIGNMENT: i32 = 30;
pub const ATTR_CONCURRENT_KERNELS: i32 = 31;
pub const ATTR_PCI_BUS_ID: i32 = 33;
pub const ATTR_PCI_DEVICE_ID: i32 = 34;
pub const ATTR_MEMORY_CLOCK_RATE: i32 = 36;
pub const ATTR_GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
pub const ATTR_L2_CACHE_SIZE: i32 = 38;
pub const ATTR_MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
pub const ATTR_ASYNC_ENGINE_COUNT: i32 = 40;
pub const ATTR_UNIFIED_ADDRESSING: i32 = 41;
pub const ATTR_PCI_DOMAIN_ID: i32 = 50;
pub const ATTR_TEXTURE_PITCH_ALIGNMENT: i32 = 51;
pub const ATTR_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
pub const ATTR_COMPUTE_CAPABILITY_MINOR: i32 = 76;
pub const ATTR_STREAM_PRIORITIES_SUPPORTED: i32 = 78;
pub const ATTR_GLOBAL_L1_CACHE_SUPPORTED: i32 = 79;
pub const ATTR_LOCAL_L1_CACHE_SUPPORTED: i32 = 80;
pub const ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
pub const ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
pub const ATTR_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: i32 = 87;
pub const ATTR_COMPUTE_PREEMPTION_SUPPORTED: i32 = 90;
pub const ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
pub const ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
pub const ATTR_MAX_PERSISTING_L2_CACHE_SIZE: i32 = 108;
pub const ATTR_MAX_ACCESS_POLICY_WINDOW_SIZE: i32 = 109;
pub const ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;
pub const ATTR_NUMA_ID: i32 = 131;
pub const ATTR_HOST_NUMA_ID: i32 = 134;
pub const ATTR_GPU_PCI_SUBSYSTEM_ID: i32 = 140;
/// One past the last attribute CUDA 13.0 defines.
pub const ATTR_END: i32 = 148;
pub const ATTR_MANAGED_MEMORY: i32 = 83;
pub const ATTR_MEMORY_POOLS_SUPPORTED: i32 = 115;
pub const ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
pub const ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: i32 = 103;
pub const ATTR_GENERIC_COMPRESSION_SUPPORTED: i32 = 107;
pub const ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: i32 = 110;

// CUmemAttach_flags.
pub const MEM_ATTACH_GLOBAL: u32 = 1;
pub const MEM_ATTACH_HOST: u32 = 2;
pub const MEM_ATTACH_SINGLE: u32 = 4;
pub const ATTR_CLUSTER_LAUNCH: i32 = 120;
pub const ATTR_COOPERATIVE_LAUNCH: i32 = 95;
pub const ATTR_HOST_REGISTER_SUPPORTED: i32 = 99;
pub const ATTR_CAN_USE_STREAM_MEM_OPS_V1: i32 = 92;
pub const ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: i32 = 93;
pub const ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: i32 = 94;
pub const ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS: i32 = 122;
pub const ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR: i32 = 123;

// CUfunction_attribute.
pub const FUNC_MAX_THREADS_PER_BLOCK: i32 = 0;
pub const FUNC_SHARED_SIZE_BYTES: i32 = 1;
pub const FUNC_CONST_SIZE_BYTES: i32 = 2;
pub const FUNC_LOCAL_SIZE_BYTES: i32 = 3;
pub const FUNC_NUM_REGS: i32 = 4;
pub const FUNC_PTX_VERSION: i32 = 5;
pub const FUNC_BINARY_VERSION: i32 = 6;
pub const FUNC_CACHE_MODE_CA: i32 = 7;
pub const FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
pub const FUNC_PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 9;
pub const FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;
pub const FUNC_CLUSTER_SCHEDULING_POLICY_PREFERENCE: i32 = 15;
/// One past the last function attribute CUDA 13.0 defines.
pub const FUNC_ATTR_END: i32 = 17;

// CUpointer_attribute.
pub const POINTER_CONTEXT: i32 = 1;
pub const POINTER_MEMORY_TYPE: i32 = 2;
pub const POINTER_DEVICE_POINTER: i32 = 3;
pub const POINTER_HOST_POINTER: i32 = 4;
pub const POINTER_SYNC_MEMOPS: i32 = 6;
pub const POINTER_BUFFER_ID: i32 = 7;
pub const POINTER_IS_MANAGED: i32 = 8;
pub const POINTER_DEVICE_ORDINAL: i32 = 9;
pub const POINTER_RANGE_START_ADDR: i32 = 11;
pub const POINTER_RANGE_SIZE: i32 = 12;
pub const POINTER_MAPPED: i32 = 13;
pub const POINTER_ACCESS_FLAGS: i32 = 16;
pub const POINTER_MEMPOOL_HANDLE: i32 = 17;
pub const POINTER_MAPPING_SIZE: i32 = 18;
pub const POINTER_MAPPING_BASE_ADDR: i32 = 19;

// CUmemorytype.
pub const MEMORYTYPE_HOST: u32 = 1;
pub const MEMORYTYPE_DEVICE: u32 = 2;

// CUlimit.
pub const LIMIT_STACK_SIZE: u32 = 0;
pub const LIMIT_PRINTF_FIFO_SIZE: u32 = 1;
pub const LIMIT_MALLOC_HEAP_SIZE: u32 = 2;
pub const LIMIT_DEV_RUNTIME_SYNC_DEPTH: u32 = 3;
pub const LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: u32 = 4;
pub const LIMIT_MAX_L2_FETCH_GRANULARITY: u32 = 5;
pub const LIMIT_PERSISTING_L2_CACHE_SIZE: u32 = 6;

// `extra` of cuLaunchKernel.
pub const LAUNCH_PARAM_END: usize = 0;
pub const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

// CUdriverProcAddressQueryResult.
pub const PROC_SUCCESS: i32 = 0;
pub const PROC_SYMBOL_NOT_FOUND: i32 = 1;
pub const PROC_VERSION_NOT_SUFFICIENT: i32 = 2;

/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_RECORD_EXTERNAL`: a record in a capture becomes an event
/// record node.
pub const EVENT_RECORD_EXTERNAL: u32 = 0x1;
/// `CU_EVENT_WAIT_EXTERNAL`: a wait in a capture becomes an event wait
/// node.
pub const EVENT_WAIT_EXTERNAL: u32 = 0x1;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUlaunchConfig` (the fields this library reads; attributes are
/// checked to be none it must honour).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim_x: u32,
    pub grid_dim_y: u32,
    pub grid_dim_z: u32,
    pub block_dim_x: u32,
    pub block_dim_y: u32,
    pub block_dim_z: u32,
    pub shared_mem_bytes: u32,
    pub h_stream: Handle,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}

/// `CUlaunchAttribute`: an id and a 64-byte value union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u32; 16],
}

/// `CUlaunchAttributeValue` (`CUstreamAttrValue`): 64 bytes.
pub type CUlaunchAttributeValue = [u32; 16];

pub const LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: u32 = 1;
pub const LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY: u32 = 3;
pub const LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
pub const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
pub const LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
pub const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
pub const LAUNCH_ATTRIBUTE_PRIORITY: u32 = 8;
pub const LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: u32 = 9;
pub const LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN: u32 = 10;

/// A context-local-storage destructor: called with the context, the key
/// and the value when the context is reset.
pub type ClsDtor = extern "C" fn(Handle, *mut c_void, *mut c_void);

/// `CUhostFn`.
pub type HostFn = unsafe extern "C" fn(user: *mut c_void);

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemsetNodeParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy2D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: Handle,
    pub src_pitch: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: Handle,
    pub dst_pitch: usize,
    pub width: usize,
    pub height: usize,
}

/// One side of a `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3dSide {
    pub x_bytes: usize,
    pub y: usize,
    pub z: usize,
    pub lod: usize,
    pub memory_type: u32,
    pub host: *const c_void,
    pub device: u64,
    pub array: Handle,
    pub reserved: *mut c_void,
    pub pitch: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3d {
    pub src: Memcpy3dSide,
    pub dst: Memcpy3dSide,
    pub width_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLocation {
    pub kind: i32,
    pub id: i32,
}

/// The compute capability a vGPU reports: the PTX the device runs is
/// compiled for it, and programs pick kernels by it.
pub const CC_MAJOR: i32 = 9;
/// The minor half of [`CC_MAJOR`]'s compute capability.
pub const CC_MINOR: i32 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_table_has_each_code_once_and_nul_terminated_texts() {
        let mut codes: Vec<_> = ERRORS.iter().map(|e| e.0).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ERRORS.len());
        for (_, name, text) in ERRORS {
            assert!(name.ends_with('\0') && text.ends_with('\0'));
            assert_eq!(name.matches('\0').count(), 1);
        }
    }

    #[test]
    fn launch_config_has_cuda_h_layout() {
        // grid[3], block[3], shared: 28 bytes; stream at 32 (aligned).
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, h_stream), 32);
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, num_attrs), 48);
        assert_eq!(std::mem::size_of::<CUlaunchConfig>(), 56);
        assert_eq!(std::mem::size_of::<CUlaunchAttribute>(), 72);
    }
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// `CUDA_ARRAY3D_LAYERED`.
pub const ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_SURFACE_LDST`.
pub const ARRAY3D_SURFACE_LDST: u32 = 0x02;
/// `CUDA_ARRAY3D_CUBEMAP`.
pub const ARRAY3D_CUBEMAP: u32 = 0x04;

/// `CUDA_RESOURCE_DESC`: the type, its union as words, the flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceDesc {
    pub res_type: u32,
    pub res: [u64; 16],
    pub flags: u32,
}

/// `CU_RESOURCE_TYPE_ARRAY`.
pub const RESOURCE_TYPE_ARRAY: u32 = 0;
/// `CU_RESOURCE_TYPE_MIPMAPPED_ARRAY`.
pub const RESOURCE_TYPE_MIPMAPPED_ARRAY: u32 = 1;
/// `CU_RESOURCE_TYPE_LINEAR`.
pub const RESOURCE_TYPE_LINEAR: u32 = 2;
/// `CU_RESOURCE_TYPE_PITCH2D`.
pub const RESOURCE_TYPE_PITCH2D: u32 = 3;

/// `CUDA_TEXTURE_DESC`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [i32; 12],
}

/// `CU_TRSF_READ_AS_INTEGER`.
pub const TRSF_READ_AS_INTEGER: u32 = 0x01;
/// `CU_TRSF_NORMALIZED_COORDINATES`.
pub const TRSF_NORMALIZED_COORDINATES: u32 = 0x02;
/// `CU_TRSF_SRGB`.
pub const TRSF_SRGB: u32 = 0x10;
/// `CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION`: mipmaps only.
pub const TRSF_DISABLE_TRILINEAR_OPTIMIZATION: u32 = 0x20;
/// `CU_TRSF_SEAMLESS_CUBEMAP`: cubemaps only.
pub const TRSF_SEAMLESS_CUBEMAP: u32 = 0x40;

pub const ATTR_MAXIMUM_TEXTURE1D_WIDTH: i32 = 21;
pub const ATTR_MAXIMUM_TEXTURE2D_WIDTH: i32 = 22;
pub const ATTR_MAXIMUM_TEXTURE2D_HEIGHT: i32 = 23;
pub const ATTR_MAXIMUM_TEXTURE3D_WIDTH: i32 = 24;
pub const ATTR_MAXIMUM_TEXTURE3D_HEIGHT: i32 = 25;
pub const ATTR_MAXIMUM_TEXTURE3D_DEPTH: i32 = 26;
pub const ATTR_MAXIMUM_TEXTURE2D_LAYERED_WIDTH: i32 = 27;
pub const ATTR_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: i32 = 28;
pub const ATTR_MAXIMUM_TEXTURE2D_LAYERED_LAYERS: i32 = 29;
pub const ATTR_MAXIMUM_TEXTURE1D_LAYERED_WIDTH: i32 = 42;
pub const ATTR_MAXIMUM_TEXTURE1D_LAYERED_LAYERS: i32 = 43;
pub const ATTR_MAXIMUM_TEXTURECUBEMAP_WIDTH: i32 = 52;
pub const ATTR_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: i32 = 53;
pub const ATTR_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: i32 = 54;
pub const ATTR_MAXIMUM_SURFACE1D_WIDTH: i32 = 55;
pub const ATTR_MAXIMUM_SURFACE2D_WIDTH: i32 = 56;
pub const ATTR_MAXIMUM_SURFACE2D_HEIGHT: i32 = 57;
pub const ATTR_MAXIMUM_SURFACE3D_WIDTH: i32 = 58;
pub const ATTR_MAXIMUM_SURFACE3D_HEIGHT: i32 = 59;
pub const ATTR_MAXIMUM_SURFACE3D_DEPTH: i32 = 60;
pub const ATTR_MAXIMUM_SURFACE1D_LAYERED_WIDTH: i32 = 61;
pub const ATTR_MAXIMUM_SURFACE1D_LAYERED_LAYERS: i32 = 62;
pub const ATTR_MAXIMUM_SURFACE2D_LAYERED_WIDTH: i32 = 63;
pub const ATTR_MAXIMUM_SURFACE2D_LAYERED_HEIGHT: i32 = 64;
pub const ATTR_MAXIMUM_SURFACE2D_LAYERED_LAYERS: i32 = 65;
pub const ATTR_MAXIMUM_SURFACECUBEMAP_WIDTH: i32 = 66;
pub const ATTR_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: i32 = 67;
pub const ATTR_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: i32 = 68;
pub const ATTR_MAXIMUM_TEXTURE1D_LINEAR_WIDTH: i32 = 69;
pub const ATTR_MAXIMUM_TEXTURE2D_LINEAR_WIDTH: i32 = 70;
pub const ATTR_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: i32 = 71;
pub const ATTR_MAXIMUM_TEXTURE2D_LINEAR_PITCH: i32 = 72;
