//! Graphs made by stream capture ([`crate::graph`]): created, counted,
//! instantiated and launched. A graph's work replays in the order it was
//! recorded; nodes are not kept as handles, so graphs are not built or
//! edited node by node here.

use std::ffi::c_char;

use crate::cu::{self, CUresult, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::graph::Graph;
use crate::state::{by_handle, driver};

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: Handle,
    pub err_node_out: Handle,
    pub result_out: u32,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: launching from kernels.
const INSTANTIATE_DEVICE_LAUNCH: u64 = 4;
/// Every `CUgraphInstantiate_flags` bit CUDA 13.0 defines.
const INSTANTIATE_FLAGS: u64 = 0xf;

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(pgraph: *mut Handle, flags: u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (_, device) = d.current_ctx()?;
        if flags != 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let graph = Graph {
            device,
            nodes: Vec::new(),
            capture: None,
        };
        let h = d.objects().add(|o| &mut o.graphs, graph);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pgraph, h as Handle) }.inspect_err(|_| {
            d.objects().graphs.remove(&h);
        })
    })
}

/// The node count only: nodes have no handles here.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    entry(|| {
        let n = by_handle(&driver()?.objects().graphs, graph as usize)?
            .nodes
            .len();
        if !nodes.is_null() {
            return Err(crate::procs::unsupported(
                "cuGraphGetNodes with a node array",
            ));
        }
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(count, n) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    entry(|| driver()?.objects().destroy_graph(graph as usize))
}

/// Instantiates `graph` into `*pexec`.
///
/// # Safety
/// `pexec` is null or writable.
unsafe fn instantiate(pexec: *mut Handle, graph: Handle, flags: u64) -> CuResult {
    let d = driver()?;
    if flags & !INSTANTIATE_FLAGS != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
        return Err(crate::procs::unsupported(
            "cuGraphInstantiate for launches from the device",
        ));
    }
    if pexec.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // Automatic frees, uploads and node priorities need nothing here:
    // graphs allocate nothing, replay from the host, and run in order.
    let h = d.objects().instantiate(graph as usize)?;
    // SAFETY: the caller's out-parameter, checked non-null.
    unsafe { ffi::put(pexec, h as Handle) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pexec: *mut Handle,
    graph: Handle,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { instantiate(pexec, graph, flags) })
}

/// The CUDA 10 and 11 form (`cuGraphInstantiate` is the same): no node
/// fails to instantiate, and there is nothing to log.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pexec: *mut Handle,
    graph: Handle,
    err_node: *mut Handle,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's optional outputs.
        unsafe {
            ffi::put_opt(err_node, std::ptr::null_mut())?;
            if log_size > 0 {
                ffi::put_opt(log, 0)?;
            }
            instantiate(pexec, graph, 0)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pexec: *mut Handle,
    graph: Handle,
    params: *mut InstantiateParams,
) -> CUresult {
    entry(|| {
        if params.is_null() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's parameters, not null.
        let flags = unsafe { (*params).flags };
        // SAFETY: the caller's out-parameter.
        unsafe { instantiate(pexec, graph, flags) }?;
        // SAFETY: the caller's parameters, not null.
        unsafe {
            ffi::put(
                std::ptr::addr_of_mut!((*params).err_node_out),
                std::ptr::null_mut(),
            )?;
            // CUDA_GRAPH_INSTANTIATE_SUCCESS.
            ffi::put(std::ptr::addr_of_mut!((*params).result_out), 0)
        }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    entry(|| {
        driver()?
            .objects()
            .execs
            .remove(&(exec as usize))
            .map(drop)
            .ok_or(cu::ERROR_INVALID_HANDLE)
    })
}

/// Nothing to upload: a launch queues the recorded work from the host.
#[no_mangle]
pub extern "C" fn cuGraphUpload(exec: Handle, stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.stream_gpu(stream as usize)?;
        by_handle(&d.objects().execs, exec as usize).map(drop)
    })
}

/// Queues the graph's work on `stream`, as it was recorded (or records
/// it, if `stream` is being captured).
#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.stream_gpu(stream as usize)?;
        let (device, nodes) = {
            let o = d.objects();
            let e = by_handle(&o.execs, exec as usize)?;
            (e.device, e.nodes.clone())
        };
        d.queue(stream as usize, device, &nodes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instantiate_params_have_cuda_h_layout() {
        assert_eq!(std::mem::offset_of!(InstantiateParams, upload_stream), 8);
        assert_eq!(std::mem::offset_of!(InstantiateParams, err_node_out), 16);
        assert_eq!(std::mem::offset_of!(InstantiateParams, result_out), 24);
        assert_eq!(std::mem::size_of::<InstantiateParams>(), 32);
    }
}
