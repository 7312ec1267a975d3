//! Every other function NVIDIA's libcuda exports by name (the API of
//! CUDA 13.0's `cuda.h`: legacy, versioned and per-thread-stream
//! symbols). Libraries such as cuFFT open `libcuda.so.1` and look each
//! one up with `dlsym`, failing to start if one is missing, where the
//! CUDA runtime asks `cuGetProcAddress`. Per-thread-stream and legacy
//! names of implemented functions with the same arguments jump to them
//! (each command completes in its stream's order either way); the rest
//! answer `CUDA_ERROR_NOT_SUPPORTED`, said once. The unimplemented names
//! of the `cuGetProcAddress` table are exported by that table's own
//! stubs (`procs.rs`); these are the others.

use std::ffi::c_void;

/// A function address in a table row.
#[derive(Clone, Copy)]
pub struct Sym(pub(crate) *const c_void);

impl Sym {
    pub(crate) const fn of(f: *const c_void) -> Self {
        Sym(f)
    }
}

// SAFETY: function addresses, never written through.
unsafe impl Sync for Sym {}

/// Exported names that jump to an implemented function, arguments
/// untouched.
macro_rules! aliases {
    ($($name:ident => $target:path,)*) => {
        $(
            #[unsafe(naked)]
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!("jmp {}", sym $target);
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("b {}", sym $target);
            }
        )*
    };
}

/// Exported names this driver does not implement; callers may pass any
/// arguments, which the C calling convention lets a callee ignore. They
/// are in [`UNSUPPORTED`] too, for `cuGetProcAddress`.
macro_rules! unsupported {
    ($($name:ident,)*) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() -> crate::cu::CUresult {
                crate::state::unsupported(stringify!($name))
            }
        )*

        /// Each unimplemented exported name and its stub: a caller that
        /// asks `cuGetProcAddress` for one gets what `dlsym` would give
        /// it, as with NVIDIA's driver, where every exported name can be
        /// found both ways (PyTorch asks for optional ones, such as the
        /// multicast functions, and a name not found is an error the
        /// runtime keeps for the next call to report).
        pub(crate) static UNSUPPORTED: &[(&str, crate::api::symbols::Sym)] = &[
            $((stringify!($name), crate::api::symbols::Sym::of($name as *const std::ffi::c_void)),)*
        ];
    };
}

use crate::api::{
    array::*, context::*, device::*, graph::*, link::*, memory::*, module::*, pool::*, stream::*,
    strided::*,
};

aliases! {
    cuCtxDestroy => cuCtxDestroy_v2,
    cuGraphInstantiate => cuGraphInstantiate_v2,
    cuCtxPopCurrent => cuCtxPopCurrent_v2,
    cuCtxPushCurrent => cuCtxPushCurrent_v2,
    cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxSetFlags => cuDevicePrimaryCtxSetFlags_v2,
    cuEventDestroy => cuEventDestroy_v2,
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags,
    cuEventRecord_ptsz => cuEventRecord,
    cuGraphInstantiateWithParams_ptsz => cuGraphInstantiateWithParams,
    cuGraphLaunch_ptsz => cuGraphLaunch,
    cuGraphUpload_ptsz => cuGraphUpload,
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel,
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx,
    cuLaunchKernel_ptsz => cuLaunchKernel,
    cuMemAllocAsync_ptsz => cuMemAllocAsync,
    cuMemFreeAsync_ptsz => cuMemFreeAsync,
    cuMemcpyAsync_ptsz => cuMemcpyAsync,
    cuMemcpyBatchAsync_ptsz => cuMemcpyBatchAsync,
    cuMemcpyBatchAsync_v2_ptsz => cuMemcpyBatchAsync_v2,
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2,
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2,
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2,
    cuMemcpy_ptds => cuMemcpy,
    cuMemsetD16Async_ptsz => cuMemsetD16Async,
    cuMemsetD16_v2_ptds => cuMemsetD16_v2,
    cuMemsetD32Async_ptsz => cuMemsetD32Async,
    cuMemsetD32_v2_ptds => cuMemsetD32_v2,
    cuMemsetD8Async_ptsz => cuMemsetD8Async,
    cuMemsetD8_v2_ptds => cuMemsetD8_v2,
    cuStreamBeginCapture_ptsz => cuStreamBeginCapture,
    cuStreamBeginCapture_v2_ptsz => cuStreamBeginCapture_v2,
    cuStreamDestroy => cuStreamDestroy_v2,
    cuStreamEndCapture_ptsz => cuStreamEndCapture,
    cuStreamGetCtx_ptsz => cuStreamGetCtx,
    cuStreamGetCtx_v2_ptsz => cuStreamGetCtx_v2,
    cuStreamGetFlags_ptsz => cuStreamGetFlags,
    cuStreamGetId_ptsz => cuStreamGetId,
    cuStreamGetPriority_ptsz => cuStreamGetPriority,
    cuStreamIsCapturing_ptsz => cuStreamIsCapturing,
    cuStreamGetCaptureInfo_ptsz => cuStreamGetCaptureInfo,
    cuStreamGetCaptureInfo_v2_ptsz => cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v3_ptsz => cuStreamGetCaptureInfo_v3,
    cuStreamQuery_ptsz => cuStreamQuery,
    cuStreamSynchronize_ptsz => cuStreamSynchronize,
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent,
    cuStreamBatchMemOp_ptsz => cuStreamBatchMemOp,
    cuStreamBatchMemOp_v2_ptsz => cuStreamBatchMemOp,
    cuStreamWaitValue32_ptsz => cuStreamWaitValue32,
    cuStreamWaitValue32_v2_ptsz => cuStreamWaitValue32,
    cuStreamWaitValue64_ptsz => cuStreamWaitValue64,
    cuStreamWaitValue64_v2_ptsz => cuStreamWaitValue64,
    cuStreamWriteValue32_ptsz => cuStreamWriteValue32,
    cuStreamWriteValue32_v2_ptsz => cuStreamWriteValue32,
    cuStreamWriteValue64_ptsz => cuStreamWriteValue64,
    cuStreamWriteValue64_v2_ptsz => cuStreamWriteValue64,
    cuMemcpy2DAsync_v2_ptsz => cuMemcpy2DAsync_v2,
    cuMemcpy2DUnaligned_v2_ptds => cuMemcpy2DUnaligned_v2,
    cuMemcpy2D_v2_ptds => cuMemcpy2D_v2,
    cuMemcpy3DAsync_v2_ptsz => cuMemcpy3DAsync_v2,
    cuMemcpy3D_v2_ptds => cuMemcpy3D_v2,
    cuMemcpy3DPeerAsync_ptsz => cuMemcpy3DPeerAsync,
    cuMemcpy3DPeer_ptds => cuMemcpy3DPeer,
    cuMemsetD2D16Async_ptsz => cuMemsetD2D16Async,
    cuMemsetD2D16_v2_ptds => cuMemsetD2D16_v2,
    cuMemsetD2D32Async_ptsz => cuMemsetD2D32Async,
    cuMemsetD2D32_v2_ptds => cuMemsetD2D32_v2,
    cuMemsetD2D8Async_ptsz => cuMemsetD2D8Async,
    cuMemsetD2D8_v2_ptds => cuMemsetD2D8_v2,
    cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync,
    cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync_v2,
    cuStreamAttachMemAsync_ptsz => cuStreamAttachMemAsync,
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc,
    cuStreamAddCallback_ptsz => cuStreamAddCallback,
    cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync,
    cuMemcpyPeerAsync_ptsz => cuMemcpyPeerAsync,
    cuMemcpyPeer_ptds => cuMemcpyPeer,
    cuStreamCopyAttributes_ptsz => cuStreamCopyAttributes,
    cuStreamGetAttribute_ptsz => cuStreamGetAttribute,
    cuStreamGetDevice_ptsz => cuStreamGetDevice,
    cuStreamSetAttribute_ptsz => cuStreamSetAttribute,
    cuLinkAddData => cuLinkAddData_v2,
    cuLinkAddFile => cuLinkAddFile_v2,
    cuLinkCreate => cuLinkCreate_v2,
    cuMemcpyAtoA_v2_ptds => cuMemcpyAtoA_v2,
    cuMemcpyAtoD_v2_ptds => cuMemcpyAtoD_v2,
    cuMemcpyAtoHAsync_v2_ptsz => cuMemcpyAtoHAsync_v2,
    cuMemcpyAtoH_v2_ptds => cuMemcpyAtoH_v2,
    cuMemcpyDtoA_v2_ptds => cuMemcpyDtoA_v2,
    cuMemcpyHtoAAsync_v2_ptsz => cuMemcpyHtoAAsync_v2,
    cuMemcpyHtoA_v2_ptds => cuMemcpyHtoA_v2,
}

unsupported! {
    cuArray3DCreate,
    cuArray3DGetDescriptor,
    cuArrayCreate,
    cuArrayGetDescriptor,
    cuCheckpointProcessCheckpoint,
    cuCheckpointProcessGetRestoreThreadId,
    cuCheckpointProcessGetState,
    cuCheckpointProcessLock,
    cuCheckpointProcessRestore,
    cuCheckpointProcessUnlock,
    cuCoredumpGetAttribute,
    cuCoredumpGetAttributeGlobal,
    cuCoredumpSetAttribute,
    cuCoredumpSetAttributeGlobal,
    cuCtxAttach,
    cuCtxCreate,
    cuDeviceGetLuid,
    cuDeviceGetProperties,
    cuDeviceTotalMem,
    cuFuncSetBlockShape,
    cuFuncSetSharedSize,
    cuGraphAddBatchMemOpNode,
    cuGraphBatchMemOpNodeGetParams,
    cuGraphBatchMemOpNodeSetParams,
    cuGraphExecBatchMemOpNodeSetParams,
    cuGraphicsMapResources_ptsz,
    cuGraphicsResourceGetMappedPointer_v2,
    cuGraphicsResourceSetMapFlags_v2,
    cuGraphicsUnmapResources_ptsz,
    cuIpcOpenMemHandle_v2,
    cuLaunch,
    cuLaunchGrid,
    cuLaunchGridAsync,
    cuMemAlloc,
    cuMemAllocHost,
    cuMemAllocPitch,
    cuMemBatchDecompressAsync,
    cuMemBatchDecompressAsync_ptsz,
    cuMemDiscardAndPrefetchBatchAsync_ptsz,
    cuMemDiscardBatchAsync_ptsz,
    cuMemFree,
    cuMemGetAddressRange,
    cuMemGetInfo,
    cuMemHostGetDevicePointer_v2,
    cuMemHostRegister,
    cuMemMapArrayAsync_ptsz,
    cuMemPrefetchBatchAsync_ptsz,
    cuMemcpy2D,
    cuMemcpy2DAsync,
    cuMemcpy2DUnaligned,
    cuMemcpy3D,
    cuMemcpy3DAsync,
    cuMemcpy3DBatchAsync_ptsz,
    cuMemcpy3DBatchAsync_v2,
    cuMemcpy3DBatchAsync_v2_ptsz,
    cuMemcpyAtoA,
    cuMemcpyAtoD,
    cuMemcpyAtoH,
    cuMemcpyAtoHAsync,
    cuMemcpyDtoA,
    cuMemcpyDtoD,
    cuMemcpyDtoDAsync,
    cuMemcpyDtoH,
    cuMemcpyDtoHAsync,
    cuMemcpyHtoA,
    cuMemcpyHtoAAsync,
    cuMemcpyHtoD,
    cuMemcpyHtoDAsync,
    cuMemsetD16,
    cuMemsetD2D16,
    cuMemsetD2D32,
    cuMemsetD2D8,
    cuMemsetD32,
    cuMemsetD8,
    cuModuleGetGlobal,
    cuMulticastAddDevice,
    cuMulticastBindAddr,
    cuMulticastBindMem,
    cuMulticastCreate,
    cuMulticastGetGranularity,
    cuMulticastUnbind,
    cuParamSetSize,
    cuParamSetTexRef,
    cuParamSetf,
    cuParamSeti,
    cuParamSetv,
    cuSignalExternalSemaphoresAsync_ptsz,
    cuStreamBeginCaptureToGraph_ptsz,
    cuStreamGetGreenCtx,
    cuStreamUpdateCaptureDependencies_ptsz,
    cuStreamUpdateCaptureDependencies_v2,
    cuStreamUpdateCaptureDependencies_v2_ptsz,
    cuSurfRefGetArray,
    cuSurfRefSetArray,
    cuTensorMapEncodeIm2col,
    cuTensorMapEncodeIm2colWide,
    cuTensorMapEncodeTiled,
    cuTensorMapReplaceAddress,
    cuTexRefCreate,
    cuTexRefDestroy,
    cuTexRefGetAddress,
    cuTexRefGetAddressMode,
    cuTexRefGetAddress_v2,
    cuTexRefGetArray,
    cuTexRefGetBorderColor,
    cuTexRefGetFilterMode,
    cuTexRefGetFlags,
    cuTexRefGetFormat,
    cuTexRefGetMaxAnisotropy,
    cuTexRefGetMipmapFilterMode,
    cuTexRefGetMipmapLevelBias,
    cuTexRefGetMipmapLevelClamp,
    cuTexRefGetMipmappedArray,
    cuTexRefSetAddress,
    cuTexRefSetAddress2D,
    cuTexRefSetAddress2D_v2,
    cuTexRefSetAddress2D_v3,
    cuTexRefSetAddressMode,
    cuTexRefSetAddress_v2,
    cuTexRefSetArray,
    cuTexRefSetBorderColor,
    cuTexRefSetFilterMode,
    cuTexRefSetFlags,
    cuTexRefSetFormat,
    cuTexRefSetMaxAnisotropy,
    cuTexRefSetMipmapFilterMode,
    cuTexRefSetMipmapLevelBias,
    cuTexRefSetMipmapLevelClamp,
    cuTexRefSetMipmappedArray,
    cuWaitExternalSemaphoresAsync_ptsz,
}
