//! `cuGetProcAddress`: how the CUDA runtime, cuBLAS, CuPy and PyTorch
//! find every driver function. A name has one row per ABI variant, with
//! the CUDA version that introduced it; a caller built for version `v`
//! gets the newest variant not newer than `v`. The per-thread default
//! stream flavour (flags 2) maps onto the same functions: each command
//! completes before its call returns, so the two stream semantics agree.
//!
//! Every name the runtimes ask for at initialisation (CUDA 13's, and the
//! one more CUDA 12's asks for) has a row, because
//! they resolve their whole table eagerly and fail to start on a missing
//! one: what is not implemented answers `CUDA_ERROR_NOT_SUPPORTED` when
//! called, and says so once on stderr.
//!
//! Being the table of every entry point, this file (with `symbols.rs`,
//! the names exported beside it) is the one that names the other entry
//! point files; `cuGetProcAddress` itself lives here, beside its table.

use std::ffi::{c_char, c_void};

use crate::api::symbols::Sym;
use crate::api::{
    array::*, context::*, device::*, export::*, graph::*, init::*, link::*, memory::*, module::*,
    pool::*, stream::*, strided::*, vmm::*,
};
use crate::cu::{self, CUresult};
use crate::ffi::{self, entry};

/// One row: a name, the version of this variant, its function.
pub struct Entry {
    pub name: &'static str,
    pub version: i32,
    pub sym: Sym,
}

/// The answer to a look-up.
pub enum Lookup {
    Found(*mut c_void),
    /// The name exists, but only in variants newer than the caller.
    VersionTooLow,
    Unknown,
}

/// Resolves `name` for a caller built against CUDA `version`.
pub fn lookup(name: &str, version: i32) -> Lookup {
    let mut known = false;
    let mut best: Option<&Entry> = None;
    for e in ENTRIES.iter().filter(|e| e.name == name) {
        known = true;
        if e.version <= version && best.is_none_or(|b| e.version > b.version) {
            best = Some(e);
        }
    }
    match best {
        Some(e) => Lookup::Found(e.sym.0.cast_mut()),
        None if known => Lookup::VersionTooLow,
        None => match crate::api::symbols::UNSUPPORTED
            .iter()
            .find(|(n, _)| *n == name)
        {
            Some((_, sym)) => Lookup::Found(sym.0.cast_mut()),
            None => Lookup::Unknown,
        },
    }
}

/// Resolves `symbol` for a caller built against CUDA `version`, with
/// `flags` choosing the default-stream flavour (0 default, 1 legacy, 2
/// per-thread).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller passes a NUL-terminated name.
        let name = unsafe { ffi::cstr(symbol) }?;
        if pfn.is_null() || flags > 2 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let (f, st) = match lookup(name, version) {
            Lookup::Found(f) => (f, cu::PROC_SUCCESS),
            Lookup::VersionTooLow => (std::ptr::null_mut(), cu::PROC_VERSION_NOT_SUFFICIENT),
            Lookup::Unknown => (std::ptr::null_mut(), cu::PROC_SYMBOL_NOT_FOUND),
        };
        // SAFETY: the caller's out-parameters (`status` may be null).
        unsafe {
            ffi::put(pfn, f)?;
            ffi::put_opt(status, st)?;
        }
        if f.is_null() && !name.is_empty() {
            crate::diag::log(&format!(
                "cuGetProcAddress: no {name:?} for version {version}"
            ));
            Err(cu::ERROR_NOT_FOUND)
        } else {
            // The runtime probes with an empty name at start; NVIDIA's
            // driver answers that with success and no function.
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded arguments.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

macro_rules! tables {
    (
        implemented { $($name:ident $ver:literal => $sym:ident,)* }
        unsupported { $($uname:ident $uver:literal,)* }
    ) => {
        /// Entry points a caller asks for that this driver does not
        /// implement, exported by name too (as NVIDIA's are). Called with
        /// whatever arguments the caller passes, which the C calling
        /// convention lets them ignore.
        #[allow(non_snake_case)]
        mod stubs {
            $(
                #[no_mangle]
                pub extern "C" fn $uname() -> crate::cu::CUresult {
                    crate::state::unsupported(stringify!($uname))
                }
            )*
        }

        static ENTRIES: &[Entry] = &[
            $(Entry { name: stringify!($name), version: $ver, sym: Sym($sym as *const c_void) },)*
            $(Entry { name: stringify!($uname), version: $uver, sym: Sym(stubs::$uname as *const c_void) },)*
        ];
    };
}

tables! {
    // Implemented: (name, first CUDA version of this variant, symbol).
implemented {
    cuCtxCreate 3020 => cuCtxCreate_v2,
    cuCtxCreate 11040 => cuCtxCreate_v3,
    cuCtxCreate 12050 => cuCtxCreate_v4,
    cuCtxDestroy 4000 => cuCtxDestroy_v2,
    cuCtxDisablePeerAccess 4000 => cuCtxDisablePeerAccess,
    cuCtxEnablePeerAccess 4000 => cuCtxEnablePeerAccess,
    cuCtxGetApiVersion 3020 => cuCtxGetApiVersion,
    cuCtxGetCacheConfig 3020 => cuCtxGetCacheConfig,
    cuCtxGetCurrent 4000 => cuCtxGetCurrent,
    cuCtxGetDevice 2000 => cuCtxGetDevice,
    cuCtxGetExecAffinity 11040 => cuCtxGetExecAffinity,
    cuCtxGetDevice 13000 => cuCtxGetDevice_v2,
    cuCtxGetFlags 7000 => cuCtxGetFlags,
    cuCtxGetId 12000 => cuCtxGetId,
    cuCtxGetLimit 3010 => cuCtxGetLimit,
    cuCtxGetSharedMemConfig 4020 => cuCtxGetSharedMemConfig,
    cuCtxGetStreamPriorityRange 5050 => cuCtxGetStreamPriorityRange,
    cuCtxPopCurrent 4000 => cuCtxPopCurrent_v2,
    cuCtxPushCurrent 4000 => cuCtxPushCurrent_v2,
    cuCtxRecordEvent 12050 => cuCtxRecordEvent,
    cuCtxResetPersistingL2Cache 11000 => cuCtxResetPersistingL2Cache,
    cuCtxSetCacheConfig 3020 => cuCtxSetCacheConfig,
    cuCtxSetCurrent 4000 => cuCtxSetCurrent,
    cuCtxSetFlags 12010 => cuCtxSetFlags,
    cuCtxSetLimit 3010 => cuCtxSetLimit,
    cuCtxSetSharedMemConfig 4020 => cuCtxSetSharedMemConfig,
    cuCtxSynchronize 2000 => cuCtxSynchronize,
    cuCtxSynchronize 13000 => cuCtxSynchronize_v2,
    cuCtxWaitEvent 12050 => cuCtxWaitEvent,
    cuDeviceCanAccessPeer 4000 => cuDeviceCanAccessPeer,
    cuDeviceComputeCapability 2000 => cuDeviceComputeCapability,
    cuDeviceGet 2000 => cuDeviceGet,
    cuDeviceGetAttribute 2000 => cuDeviceGetAttribute,
    cuDeviceGetByPCIBusId 4010 => cuDeviceGetByPCIBusId,
    cuDeviceGetCount 2000 => cuDeviceGetCount,
    cuDeviceGetExecAffinitySupport 11040 => cuDeviceGetExecAffinitySupport,
    cuDeviceGetName 2000 => cuDeviceGetName,
    cuDeviceGetPCIBusId 4010 => cuDeviceGetPCIBusId,
    cuDeviceGetUuid 9020 => cuDeviceGetUuid,
    cuDeviceGetUuid 11040 => cuDeviceGetUuid_v2,
    cuDevicePrimaryCtxGetState 7000 => cuDevicePrimaryCtxGetState,
    cuDevicePrimaryCtxRelease 7000 => cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset 7000 => cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxRetain 7000 => cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxSetFlags 11000 => cuDevicePrimaryCtxSetFlags_v2,
    cuDeviceTotalMem 3020 => cuDeviceTotalMem_v2,
    cuDriverGetVersion 2020 => cuDriverGetVersion,
    cuEventCreate 2000 => cuEventCreate,
    cuEventDestroy 4000 => cuEventDestroy_v2,
    cuEventElapsedTime 2000 => cuEventElapsedTime,
    cuEventElapsedTime 12080 => cuEventElapsedTime_v2,
    cuEventQuery 2000 => cuEventQuery,
    cuEventRecord 2000 => cuEventRecord,
    cuEventRecordWithFlags 11010 => cuEventRecordWithFlags,
    cuEventSynchronize 2000 => cuEventSynchronize,
    cuFuncGetAttribute 2020 => cuFuncGetAttribute,
    cuFuncGetName 12030 => cuFuncGetName,
    cuFuncGetParamInfo 12040 => cuFuncGetParamInfo,
    cuFuncSetAttribute 9000 => cuFuncSetAttribute,
    cuFuncSetCacheConfig 3000 => cuFuncSetCacheConfig,
    cuGraphAddChildGraphNode 10000 => cuGraphAddChildGraphNode,
    cuGraphAddDependencies 10000 => cuGraphAddDependencies,
    cuGraphAddDependencies 12030 => cuGraphAddDependencies_v2,
    cuGraphAddEmptyNode 10000 => cuGraphAddEmptyNode,
    cuGraphKernelNodeCopyAttributes 11000 => cuGraphKernelNodeCopyAttributes,
    cuGraphKernelNodeGetAttribute 11000 => cuGraphKernelNodeGetAttribute,
    cuGraphKernelNodeSetAttribute 11000 => cuGraphKernelNodeSetAttribute,
    cuGraphDebugDotPrint 11030 => cuGraphDebugDotPrint,
    cuGraphGetEdges 10000 => cuGraphGetEdges,
    cuGraphGetEdges 12030 => cuGraphGetEdges_v2,
    cuGraphNodeFindInClone 10000 => cuGraphNodeFindInClone,
    cuGraphAddNode 12020 => cuGraphAddNode,
    cuGraphAddNode 12030 => cuGraphAddNode_v2,
    cuGraphExecNodeSetParams 12020 => cuGraphExecNodeSetParams,
    cuGraphNodeSetParams 12020 => cuGraphNodeSetParams,
    cuGraphAddEventRecordNode 11010 => cuGraphAddEventRecordNode,
    cuGraphAddEventWaitNode 11010 => cuGraphAddEventWaitNode,
    cuGraphAddKernelNode 10000 => cuGraphAddKernelNode,
    cuGraphAddKernelNode 12000 => cuGraphAddKernelNode_v2,
    cuGraphAddMemcpyNode 10000 => cuGraphAddMemcpyNode,
    cuGraphAddMemAllocNode 11040 => cuGraphAddMemAllocNode,
    cuGraphDestroyNode 10000 => cuGraphDestroyNode,
    cuGraphExecChildGraphNodeSetParams 11010 => cuGraphExecChildGraphNodeSetParams,
    cuGraphNodeGetEnabled 11060 => cuGraphNodeGetEnabled,
    cuGraphNodeSetEnabled 11060 => cuGraphNodeSetEnabled,
    cuGraphAddMemFreeNode 11040 => cuGraphAddMemFreeNode,
    cuGraphMemAllocNodeGetParams 11040 => cuGraphMemAllocNodeGetParams,
    cuGraphMemFreeNodeGetParams 11040 => cuGraphMemFreeNodeGetParams,
    cuDeviceGetGraphMemAttribute 11040 => cuDeviceGetGraphMemAttribute,
    cuDeviceSetGraphMemAttribute 11040 => cuDeviceSetGraphMemAttribute,
    cuDeviceGraphMemTrim 11040 => cuDeviceGraphMemTrim,
    cuGraphAddMemsetNode 10000 => cuGraphAddMemsetNode,
    cuGraphClone 10000 => cuGraphClone,
    cuGraphCreate 10000 => cuGraphCreate,
    cuGraphDestroy 10000 => cuGraphDestroy,
    cuGraphEventRecordNodeGetEvent 11010 => cuGraphEventRecordNodeGetEvent,
    cuGraphEventRecordNodeSetEvent 11010 => cuGraphEventRecordNodeSetEvent,
    cuGraphEventWaitNodeGetEvent 11010 => cuGraphEventWaitNodeGetEvent,
    cuGraphEventWaitNodeSetEvent 11010 => cuGraphEventWaitNodeSetEvent,
    cuGraphExecEventRecordNodeSetEvent 11010 => cuGraphExecEventRecordNodeSetEvent,
    cuGraphExecEventWaitNodeSetEvent 11010 => cuGraphExecEventWaitNodeSetEvent,
    cuGraphAddHostNode 10000 => cuGraphAddHostNode,
    cuGraphExecDestroy 10000 => cuGraphExecDestroy,
    cuGraphExecHostNodeSetParams 10020 => cuGraphExecHostNodeSetParams,
    cuGraphExecMemcpyNodeSetParams 10020 => cuGraphExecMemcpyNodeSetParams,
    cuGraphExecMemsetNodeSetParams 10020 => cuGraphExecMemsetNodeSetParams,
    cuGraphHostNodeGetParams 10000 => cuGraphHostNodeGetParams,
    cuGraphHostNodeSetParams 10000 => cuGraphHostNodeSetParams,
    cuGraphMemcpyNodeGetParams 10000 => cuGraphMemcpyNodeGetParams,
    cuGraphMemcpyNodeSetParams 10000 => cuGraphMemcpyNodeSetParams,
    cuGraphMemsetNodeGetParams 10000 => cuGraphMemsetNodeGetParams,
    cuGraphMemsetNodeSetParams 10000 => cuGraphMemsetNodeSetParams,
    cuGraphExecKernelNodeSetParams 10010 => cuGraphExecKernelNodeSetParams,
    cuGraphExecKernelNodeSetParams 12000 => cuGraphExecKernelNodeSetParams_v2,
    cuGraphExecUpdate 10020 => cuGraphExecUpdate,
    cuGraphExecUpdate 12000 => cuGraphExecUpdate_v2,
    cuGraphKernelNodeGetParams 10000 => cuGraphKernelNodeGetParams,
    cuGraphKernelNodeGetParams 12000 => cuGraphKernelNodeGetParams_v2,
    cuGraphKernelNodeSetParams 10000 => cuGraphKernelNodeSetParams,
    cuGraphKernelNodeSetParams 12000 => cuGraphKernelNodeSetParams_v2,
    cuGraphGetNodes 10000 => cuGraphGetNodes,
    cuGraphGetRootNodes 10000 => cuGraphGetRootNodes,
    cuGraphInstantiate 10000 => cuGraphInstantiate_v2,
    // CUDA 12's cuda.h maps cuGraphInstantiate onto WithFlags.
    cuGraphInstantiate 12000 => cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithFlags 11040 => cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams 12000 => cuGraphInstantiateWithParams,
    cuGraphLaunch 10000 => cuGraphLaunch,
    cuGraphNodeGetDependencies 10000 => cuGraphNodeGetDependencies,
    cuGraphNodeGetDependencies 12030 => cuGraphNodeGetDependencies_v2,
    cuGraphNodeGetDependentNodes 10000 => cuGraphNodeGetDependentNodes,
    cuGraphNodeGetDependentNodes 12030 => cuGraphNodeGetDependentNodes_v2,
    cuGraphRemoveDependencies 10000 => cuGraphRemoveDependencies,
    cuGraphRemoveDependencies 12030 => cuGraphRemoveDependencies_v2,
    cuGraphNodeGetType 10000 => cuGraphNodeGetType,
    cuGraphUpload 11010 => cuGraphUpload,
    cuGetErrorName 6000 => cuGetErrorName,
    cuGetErrorString 6000 => cuGetErrorString,
    cuGetExportTable 3000 => cuGetExportTable,
    cuGetProcAddress 11030 => cuGetProcAddress,
    cuGetProcAddress 12000 => cuGetProcAddress_v2,
    cuInit 2000 => cuInit,
    cuKernelGetAttribute 12000 => cuKernelGetAttribute,
    cuKernelGetFunction 12000 => cuKernelGetFunction,
    cuKernelSetAttribute 12000 => cuKernelSetAttribute,
    cuLaunchCooperativeKernel 9000 => cuLaunchCooperativeKernel,
    cuLaunchKernel 4000 => cuLaunchKernel,
    cuLaunchKernelEx 11060 => cuLaunchKernelEx,
    cuLibraryGetKernel 12000 => cuLibraryGetKernel,
    cuLibraryGetModule 12000 => cuLibraryGetModule,
    cuLibraryLoadData 12000 => cuLibraryLoadData,
    cuLibraryUnload 12000 => cuLibraryUnload,
    cuMemAlloc 3020 => cuMemAlloc_v2,
    cuMemAllocAsync 11020 => cuMemAllocAsync,
    cuMemAllocHost 3020 => cuMemAllocHost_v2,
    cuMemFree 3020 => cuMemFree_v2,
    cuMemFreeAsync 11020 => cuMemFreeAsync,
    cuMemFreeHost 2000 => cuMemFreeHost,
    cuMemGetAddressRange 3020 => cuMemGetAddressRange_v2,
    cuMemAddressFree 10020 => cuMemAddressFree,
    cuMemAddressReserve 10020 => cuMemAddressReserve,
    cuMemCreate 10020 => cuMemCreate,
    cuMemExportToShareableHandle 10020 => cuMemExportToShareableHandle,
    cuMemGetAccess 10020 => cuMemGetAccess,
    cuMemGetAllocationGranularity 10020 => cuMemGetAllocationGranularity,
    cuMemGetAllocationPropertiesFromHandle 10020 => cuMemGetAllocationPropertiesFromHandle,
    cuMemImportFromShareableHandle 10020 => cuMemImportFromShareableHandle,
    cuMemMap 10020 => cuMemMap,
    cuMemRelease 10020 => cuMemRelease,
    cuMemRetainAllocationHandle 11000 => cuMemRetainAllocationHandle,
    cuMemSetAccess 10020 => cuMemSetAccess,
    cuMemUnmap 10020 => cuMemUnmap,
    cuMemGetInfo 3020 => cuMemGetInfo_v2,
    cuMemHostAlloc 2020 => cuMemHostAlloc,
    cuMemHostRegister 6050 => cuMemHostRegister_v2,
    cuMemHostUnregister 4000 => cuMemHostUnregister,
    cuMemcpy 4000 => cuMemcpy,
    cuMemcpy3DPeer 4000 => cuMemcpy3DPeer,
    cuMemcpy3DPeerAsync 4000 => cuMemcpy3DPeerAsync,
    cuMemcpyAsync 4000 => cuMemcpyAsync,
    cuMemcpyBatchAsync 12080 => cuMemcpyBatchAsync,
    cuMemcpyBatchAsync 13000 => cuMemcpyBatchAsync_v2,
    cuMemcpyDtoD 3020 => cuMemcpyDtoD_v2,
    cuMemcpyDtoDAsync 3020 => cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoH 3020 => cuMemcpyDtoH_v2,
    cuMemcpyDtoHAsync 3020 => cuMemcpyDtoHAsync_v2,
    cuMemcpyHtoD 3020 => cuMemcpyHtoD_v2,
    cuMemcpyHtoDAsync 3020 => cuMemcpyHtoDAsync_v2,
    cuLaunchHostFunc 10000 => cuLaunchHostFunc,
    cuDeviceGetDefaultMemPool 11020 => cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool 11020 => cuDeviceGetMemPool,
    cuDeviceGetP2PAttribute 8000 => cuDeviceGetP2PAttribute,
    cuDeviceSetMemPool 11020 => cuDeviceSetMemPool,
    cuFuncSetSharedMemConfig 4020 => cuFuncSetSharedMemConfig,
    cuGraphExecGetFlags 12000 => cuGraphExecGetFlags,
    cuKernelGetName 12030 => cuKernelGetName,
    cuKernelGetParamInfo 12040 => cuKernelGetParamInfo,
    cuKernelSetCacheConfig 12000 => cuKernelSetCacheConfig,
    cuLibraryEnumerateKernels 12040 => cuLibraryEnumerateKernels,
    cuMemGetDefaultMemPool 13000 => cuMemGetDefaultMemPool,
    cuMemGetMemPool 13000 => cuMemGetMemPool,
    cuMemPoolCreate 11020 => cuMemPoolCreate,
    cuMemPoolDestroy 11020 => cuMemPoolDestroy,
    cuMemPoolGetAccess 11020 => cuMemPoolGetAccess,
    cuMemPoolGetAttribute 11020 => cuMemPoolGetAttribute,
    cuMemPoolSetAccess 11020 => cuMemPoolSetAccess,
    cuMemPoolSetAttribute 11020 => cuMemPoolSetAttribute,
    cuMemPoolTrimTo 11020 => cuMemPoolTrimTo,
    cuMemSetMemPool 13000 => cuMemSetMemPool,
    cuMemAllocFromPoolAsync 11020 => cuMemAllocFromPoolAsync,
    cuMemHostGetFlags 2030 => cuMemHostGetFlags,
    cuMemcpyPeer 4000 => cuMemcpyPeer,
    cuMemcpyPeerAsync 4000 => cuMemcpyPeerAsync,
    cuStreamCopyAttributes 11000 => cuStreamCopyAttributes,
    cuStreamGetAttribute 11000 => cuStreamGetAttribute,
    cuStreamGetDevice 12080 => cuStreamGetDevice,
    cuStreamSetAttribute 11000 => cuStreamSetAttribute,
    cuLibraryLoadFromFile 12000 => cuLibraryLoadFromFile,
    // The 5.5 and 6.5 forms take the same arguments.
    cuLinkAddData 5050 => cuLinkAddData_v2,
    cuLinkAddData 6050 => cuLinkAddData_v2,
    cuLinkAddFile 5050 => cuLinkAddFile_v2,
    cuLinkAddFile 6050 => cuLinkAddFile_v2,
    cuLinkComplete 5050 => cuLinkComplete,
    cuLinkCreate 5050 => cuLinkCreate_v2,
    cuLinkCreate 6050 => cuLinkCreate_v2,
    cuLinkDestroy 5050 => cuLinkDestroy,
    cuModuleLoad 2000 => cuModuleLoad,
    cuMemAdvise 8000 => cuMemAdvise,
    cuMemAdvise 12020 => cuMemAdvise_v2,
    cuMemAllocManaged 6000 => cuMemAllocManaged,
    cuMemAllocPitch 3020 => cuMemAllocPitch_v2,
    cuMemPrefetchAsync 8000 => cuMemPrefetchAsync,
    cuMemPrefetchAsync 12020 => cuMemPrefetchAsync_v2,
    cuStreamAddCallback 5000 => cuStreamAddCallback,
    cuStreamAttachMemAsync 6000 => cuStreamAttachMemAsync,
    cuMemcpy2D 3020 => cuMemcpy2D_v2,
    cuMemcpy2DAsync 3020 => cuMemcpy2DAsync_v2,
    cuMemcpy2DUnaligned 3020 => cuMemcpy2DUnaligned_v2,
    cuMemcpy3D 3020 => cuMemcpy3D_v2,
    cuMemcpy3DAsync 3020 => cuMemcpy3DAsync_v2,
    cuMemsetD2D8 3020 => cuMemsetD2D8_v2,
    cuMemsetD2D8Async 3020 => cuMemsetD2D8Async,
    cuMemsetD2D16 3020 => cuMemsetD2D16_v2,
    cuMemsetD2D16Async 3020 => cuMemsetD2D16Async,
    cuMemsetD2D32 3020 => cuMemsetD2D32_v2,
    cuMemsetD2D32Async 3020 => cuMemsetD2D32Async,
    cuMemsetD16 3020 => cuMemsetD16_v2,
    cuMemsetD16Async 3020 => cuMemsetD16Async,
    cuMemsetD32 3020 => cuMemsetD32_v2,
    cuMemsetD32Async 3020 => cuMemsetD32Async,
    cuMemsetD8 3020 => cuMemsetD8_v2,
    cuMemsetD8Async 3020 => cuMemsetD8Async,
    cuModuleGetFunction 2000 => cuModuleGetFunction,
    cuModuleGetFunctionCount 12040 => cuModuleGetFunctionCount,
    cuModuleGetGlobal 3020 => cuModuleGetGlobal_v2,
    cuLibraryGetGlobal 12000 => cuLibraryGetGlobal,
    cuLibraryGetKernelCount 12040 => cuLibraryGetKernelCount,
    cuModuleGetLoadingMode 11070 => cuModuleGetLoadingMode,
    cuModuleLoadData 2000 => cuModuleLoadData,
    cuModuleLoadDataEx 2010 => cuModuleLoadDataEx,
    cuModuleLoadFatBinary 2000 => cuModuleLoadFatBinary,
    cuModuleUnload 2000 => cuModuleUnload,
    cuOccupancyAvailableDynamicSMemPerBlock 10020 => cuOccupancyAvailableDynamicSMemPerBlock,
    cuOccupancyMaxActiveClusters 11070 => cuOccupancyMaxActiveClusters,
    cuOccupancyMaxPotentialClusterSize 11070 => cuOccupancyMaxPotentialClusterSize,
    cuOccupancyMaxActiveBlocksPerMultiprocessor 6050 => cuOccupancyMaxActiveBlocksPerMultiprocessor,
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags 7000 => cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    cuOccupancyMaxPotentialBlockSize 6050 => cuOccupancyMaxPotentialBlockSize,
    cuPointerGetAttribute 4000 => cuPointerGetAttribute,
    cuPointerGetAttributes 7000 => cuPointerGetAttributes,
    cuProfilerStart 4000 => cuProfilerStart,
    cuProfilerStop 4000 => cuProfilerStop,
    cuStreamBeginCapture 10000 => cuStreamBeginCapture,
    cuStreamBeginCapture 10010 => cuStreamBeginCapture_v2,
    cuStreamCreate 2000 => cuStreamCreate,
    cuStreamCreateWithPriority 5050 => cuStreamCreateWithPriority,
    cuStreamDestroy 4000 => cuStreamDestroy_v2,
    cuStreamEndCapture 10000 => cuStreamEndCapture,
    cuStreamGetCtx 9020 => cuStreamGetCtx,
    cuStreamGetCtx 12050 => cuStreamGetCtx_v2,
    cuStreamGetFlags 5050 => cuStreamGetFlags,
    cuStreamGetId 12000 => cuStreamGetId,
    cuStreamGetPriority 5050 => cuStreamGetPriority,
    cuStreamIsCapturing 10000 => cuStreamIsCapturing,
    cuStreamGetCaptureInfo 10010 => cuStreamGetCaptureInfo,
    cuStreamGetCaptureInfo 11030 => cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo 12030 => cuStreamGetCaptureInfo_v3,
    cuStreamQuery 2000 => cuStreamQuery,
    cuStreamSynchronize 2000 => cuStreamSynchronize,
    cuStreamWaitEvent 3020 => cuStreamWaitEvent,
    cuStreamBatchMemOp 8000 => cuStreamBatchMemOp,
    cuStreamBatchMemOp 11070 => cuStreamBatchMemOp_v2,
    cuStreamWaitValue32 8000 => cuStreamWaitValue32,
    cuStreamWaitValue32 11070 => cuStreamWaitValue32_v2,
    cuStreamWaitValue64 9000 => cuStreamWaitValue64,
    cuStreamWaitValue64 11070 => cuStreamWaitValue64_v2,
    cuStreamWriteValue32 8000 => cuStreamWriteValue32,
    cuStreamWriteValue32 11070 => cuStreamWriteValue32_v2,
    cuStreamWriteValue64 9000 => cuStreamWriteValue64,
    cuStreamWriteValue64 11070 => cuStreamWriteValue64_v2,
    cuThreadExchangeStreamCaptureMode 10010 => cuThreadExchangeStreamCaptureMode,
    cuArrayCreate 3020 => cuArrayCreate_v2,
    cuArray3DCreate 3020 => cuArray3DCreate_v2,
    cuArrayDestroy 2000 => cuArrayDestroy,
    cuArrayGetDescriptor 3020 => cuArrayGetDescriptor_v2,
    cuArray3DGetDescriptor 3020 => cuArray3DGetDescriptor_v2,
    cuMemcpyHtoA 3020 => cuMemcpyHtoA_v2,
    cuMemcpyHtoAAsync 3020 => cuMemcpyHtoAAsync_v2,
    cuMemcpyAtoH 3020 => cuMemcpyAtoH_v2,
    cuMemcpyAtoHAsync 3020 => cuMemcpyAtoHAsync_v2,
    cuMemcpyDtoA 3020 => cuMemcpyDtoA_v2,
    cuMemcpyAtoD 3020 => cuMemcpyAtoD_v2,
    cuMemcpyAtoA 3020 => cuMemcpyAtoA_v2,
    cuTexObjectCreate 5000 => cuTexObjectCreate,
    cuTexObjectDestroy 5000 => cuTexObjectDestroy,
    cuTexObjectGetResourceDesc 5000 => cuTexObjectGetResourceDesc,
    cuTexObjectGetTextureDesc 5000 => cuTexObjectGetTextureDesc,
    cuTexObjectGetResourceViewDesc 5000 => cuTexObjectGetResourceViewDesc,
    cuSurfObjectCreate 5000 => cuSurfObjectCreate,
    cuSurfObjectDestroy 5000 => cuSurfObjectDestroy,
    cuSurfObjectGetResourceDesc 5000 => cuSurfObjectGetResourceDesc,
}

// Asked for by the CUDA 13 runtime (static and shared), cuBLAS, CuPy or
// PyTorch at initialisation, and not implemented: each answers
// CUDA_ERROR_NOT_SUPPORTED and says so once. (name, first version asked.)
unsupported {
    cuArrayGetMemoryRequirements 11060,
    cuArrayGetPlane 11020,
    cuArrayGetSparseProperties 11010,
    cuCtxDetach 2000,
    cuCtxFromGreenCtx 12040,
    cuCtxGetDevResource 12040,
    cuDestroyExternalMemory 10000,
    cuDestroyExternalSemaphore 10000,
    cuDevResourceGenerateDesc 12040,
    cuDevSmResourceSplitByCount 12040,
    cuDeviceGetDevResource 12040,
    cuDeviceGetHostAtomicCapabilities 13000,
    cuDeviceGetNvSciSyncAttributes 10020,
    cuDeviceGetP2PAtomicCapabilities 13000,
    cuDeviceGetTexture1DLinearMaxWidth 11010,
    cuDeviceRegisterAsyncNotification 12040,
    cuDeviceUnregisterAsyncNotification 12040,
    cuEGLStreamConsumerAcquireFrame 7000,
    cuEGLStreamConsumerConnect 7000,
    cuEGLStreamConsumerConnectWithFlags 8000,
    cuEGLStreamConsumerDisconnect 7000,
    cuEGLStreamConsumerReleaseFrame 7000,
    cuEGLStreamProducerConnect 7000,
    cuEGLStreamProducerDisconnect 7000,
    cuEGLStreamProducerPresentFrame 7000,
    cuEGLStreamProducerReturnFrame 7000,
    cuExternalMemoryGetMappedBuffer 10000,
    cuExternalMemoryGetMappedMipmappedArray 10000,
    cuFlushGPUDirectRDMAWrites 11030,
    cuGLCtxCreate 3020,
    cuGLGetDevices 4010,
    cuGLInit 2000,
    cuGLMapBufferObject 3020,
    cuGLMapBufferObjectAsync 3020,
    cuGLRegisterBufferObject 2000,
    cuGLSetBufferObjectMapFlags 2030,
    cuGLUnmapBufferObject 2000,
    cuGLUnmapBufferObjectAsync 2030,
    cuGLUnregisterBufferObject 2000,
    cuGraphAddExternalSemaphoresSignalNode 11020,
    cuGraphAddExternalSemaphoresWaitNode 11020,
    cuGraphChildGraphNodeGetGraph 10000,
    cuGraphConditionalHandleCreate 12030,
    cuGraphExecExternalSemaphoresSignalNodeSetParams 11020,
    cuGraphExecExternalSemaphoresWaitNodeSetParams 11020,
    cuGraphExternalSemaphoresSignalNodeGetParams 11020,
    cuGraphExternalSemaphoresSignalNodeSetParams 11020,
    cuGraphExternalSemaphoresWaitNodeGetParams 11020,
    cuGraphExternalSemaphoresWaitNodeSetParams 11020,
    cuGraphReleaseUserObject 11030,
    cuGraphRetainUserObject 11030,
    cuGraphicsEGLRegisterImage 7000,
    cuGraphicsGLRegisterBuffer 3000,
    cuGraphicsGLRegisterImage 3000,
    cuGraphicsMapResources 3000,
    cuGraphicsResourceGetMappedEglFrame 7000,
    cuGraphicsResourceGetMappedMipmappedArray 5000,
    cuGraphicsResourceGetMappedPointer 3020,
    cuGraphicsResourceSetMapFlags 6050,
    cuGraphicsSubResourceGetMappedArray 3000,
    cuGraphicsUnmapResources 3000,
    cuGraphicsUnregisterResource 3000,
    cuGraphicsVDPAURegisterOutputSurface 3010,
    cuGraphicsVDPAURegisterVideoSurface 3010,
    cuGreenCtxCreate 12040,
    cuGreenCtxDestroy 12040,
    cuGreenCtxGetDevResource 12040,
    cuGreenCtxGetId 12090,
    cuGreenCtxRecordEvent 12040,
    cuGreenCtxStreamCreate 12050,
    cuGreenCtxWaitEvent 12040,
    cuImportExternalMemory 10000,
    cuImportExternalSemaphore 10000,
    cuIpcCloseMemHandle 4010,
    cuIpcGetEventHandle 4010,
    cuIpcGetMemHandle 4010,
    cuIpcOpenEventHandle 4010,
    cuIpcOpenMemHandle 4010,
    // Asked for by the CUDA 12 runtime only (gone from CUDA 13).
    cuLaunchCooperativeKernelMultiDevice 9000,
    cuLibraryGetManaged 12000,
    cuLibraryGetUnifiedFunction 12000,
    cuLogsCurrent 12090,
    cuLogsDumpToFile 12090,
    cuLogsDumpToMemory 12090,
    cuLogsRegisterCallback 12090,
    cuLogsUnregisterCallback 12090,
    cuMemDiscardAndPrefetchBatchAsync 13000,
    cuMemDiscardBatchAsync 13000,
    cuMemHostGetDevicePointer 3020,
    cuMemPoolExportPointer 11020,
    cuMemPoolExportToShareableHandle 11020,
    cuMemGetHandleForAddressRange 11070,
    cuMemMapArrayAsync 11010,
    cuMemPoolImportFromShareableHandle 11020,
    cuMemPoolImportPointer 11020,
    cuMemPrefetchBatchAsync 13000,
    cuMemRangeGetAttribute 8000,
    cuMemRangeGetAttributes 8000,
    cuMemcpy3DBatchAsync 12080,
    cuMipmappedArrayCreate 5000,
    cuMipmappedArrayDestroy 5000,
    cuMipmappedArrayGetLevel 5000,
    cuMipmappedArrayGetMemoryRequirements 11060,
    cuMipmappedArrayGetSparseProperties 11010,
    cuModuleGetSurfRef 3000,
    cuModuleGetTexRef 2000,
    cuProfilerInitialize 4000,
    cuSignalExternalSemaphoresAsync 10000,
    cuStreamBeginCaptureToGraph 12030,
    cuStreamUpdateCaptureDependencies 11030,
    cuUserObjectCreate 11030,
    cuUserObjectRelease 11030,
    cuUserObjectRetain 11030,
    cuVDPAUCtxCreate 3020,
    cuVDPAUGetDevice 3010,
    cuWaitExternalSemaphoresAsync 10000,
}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(name: &str, v: i32) -> *mut c_void {
        match lookup(name, v) {
            Lookup::Found(f) => f,
            _ => panic!("{name} {v} not found"),
        }
    }

    #[test]
    fn the_newest_variant_not_newer_than_the_caller_is_chosen() {
        assert_eq!(
            found("cuCtxSynchronize", 12090),
            cuCtxSynchronize as *mut c_void
        );
        assert_eq!(
            found("cuCtxSynchronize", 13000),
            cuCtxSynchronize_v2 as *mut c_void
        );
        assert_eq!(found("cuMemAlloc", 13000), cuMemAlloc_v2 as *mut c_void);
        assert!(matches!(lookup("cuMemAlloc", 2000), Lookup::VersionTooLow));
        assert!(matches!(lookup("cuNoSuchThing", 13000), Lookup::Unknown));
    }

    #[test]
    fn every_exported_name_is_found_too() {
        // Optional functions PyTorch resolves (multicast, tensor maps):
        // exported by name, so findable by cuGetProcAddress as well.
        for name in [
            "cuMulticastCreate",
            "cuMulticastBindMem",
            "cuTensorMapEncodeTiled",
        ] {
            assert_eq!(
                found(name, 12030),
                crate::api::symbols::UNSUPPORTED
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, s)| s.0.cast_mut())
                    .unwrap()
            );
        }
    }

    #[test]
    fn capture_and_graph_names_resolve_to_each_versions_form() {
        assert_eq!(
            found("cuStreamBeginCapture", 10000),
            cuStreamBeginCapture as *mut c_void
        );
        assert_eq!(
            found("cuStreamBeginCapture", 13000),
            cuStreamBeginCapture_v2 as *mut c_void
        );
        // cuGraphInstantiate: the CUDA 10 and 11 forms take an error node
        // and a log; CUDA 12's cuda.h names WithFlags so.
        assert_eq!(
            found("cuGraphInstantiate", 10020),
            cuGraphInstantiate_v2 as *mut c_void
        );
        assert_eq!(
            found("cuGraphInstantiate", 11080),
            cuGraphInstantiate_v2 as *mut c_void
        );
        assert_eq!(
            found("cuGraphInstantiate", 12000),
            cuGraphInstantiateWithFlags as *mut c_void
        );
        assert_eq!(found("cuGraphLaunch", 13000), cuGraphLaunch as *mut c_void);
        assert_eq!(
            found("cuStreamEndCapture", 13000),
            cuStreamEndCapture as *mut c_void
        );
    }

    #[test]
    fn cu_ctx_create_resolves_to_the_form_of_the_callers_cuda_h() {
        // CUDA 3.2's (flags, device), 11.4's with execution affinity,
        // and 12.5's with CUctxCreateParams, which CUDA 13's cuda.h
        // calls cuCtxCreate.
        assert_eq!(found("cuCtxCreate", 3020), cuCtxCreate_v2 as *mut c_void);
        assert_eq!(found("cuCtxCreate", 11030), cuCtxCreate_v2 as *mut c_void);
        assert_eq!(found("cuCtxCreate", 11040), cuCtxCreate_v3 as *mut c_void);
        assert_eq!(found("cuCtxCreate", 12040), cuCtxCreate_v3 as *mut c_void);
        assert_eq!(found("cuCtxCreate", 12050), cuCtxCreate_v4 as *mut c_void);
        assert_eq!(found("cuCtxCreate", 13000), cuCtxCreate_v4 as *mut c_void);
    }

    #[test]
    fn every_name_appears_once_per_version() {
        let mut seen = std::collections::HashSet::new();
        for e in ENTRIES {
            assert!(
                seen.insert((e.name, e.version)),
                "{} {} twice",
                e.name,
                e.version
            );
            assert!(e.name.starts_with("cu"));
        }
        assert!(ENTRIES.len() > 350);
    }

    #[test]
    fn an_unimplemented_entry_point_is_callable_and_says_not_supported() {
        let f = found("cuGraphConditionalHandleCreate", 13000);
        // SAFETY: every stub is `extern "C" fn() -> CUresult`.
        let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(f) };
        assert_eq!(f(), cu::ERROR_NOT_SUPPORTED);
    }

    fn get(name: &std::ffi::CStr) -> (CUresult, *mut c_void, i32) {
        let (mut f, mut st) = (std::ptr::dangling_mut::<c_void>(), -1);
        // SAFETY: a NUL-terminated name and live out-parameters.
        let r = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut f, 13000, 0, &mut st) };
        (r, f, st)
    }

    #[test]
    fn an_empty_name_succeeds_with_no_function_and_an_unknown_one_fails() {
        assert_eq!(
            get(c""),
            (cu::SUCCESS, std::ptr::null_mut(), cu::PROC_SYMBOL_NOT_FOUND)
        );
        assert_eq!(
            get(c"cuNoSuchThing"),
            (
                cu::ERROR_NOT_FOUND,
                std::ptr::null_mut(),
                cu::PROC_SYMBOL_NOT_FOUND
            )
        );
        let (r, f, st) = get(c"cuMemAlloc");
        assert_eq!((r, st), (cu::SUCCESS, cu::PROC_SUCCESS));
        assert!(!f.is_null());
    }
}
