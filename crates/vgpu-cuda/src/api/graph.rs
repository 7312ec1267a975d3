//! Graphs ([`crate::graphs`]), made by stream capture or node by node
//! (kernel, memset, memcpy, host, event, child graph, empty, memory
//! allocation and free nodes, and the dependencies between them):
//! created, cloned, listed, instantiated, launched, and changed (nodes'
//! parameters, in a graph or an executable, nodes removed, disabled in
//! an executable, child graphs replaced, and whole executables updated
//! from a graph of the same topology). A graph's work replays in an order that honours
//! its dependencies.

use std::ffi::{c_char, c_void};

use vgpu_guest::Dims;

use crate::allocs::free_released;
use crate::copies::{in_page_locked, memset_work};
use crate::cu::{self, CUdevice, CUresult, Handle, Memcpy3d, MemsetNodeParams};
use crate::diag::log;
use crate::ffi::{self, entry, CuResult};
use crate::graphs::{self as g, Graph};
use crate::launch_args::kernel_work;
use crate::pitched::Copy3D;
use crate::state::driver;
use crate::work::Work;

/// `CUDA_KERNEL_NODE_PARAMS` (v1, CUDA 10 and 11).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`: v1, then a `CUkernel` that names the
/// kernel where `func` is null, and a context.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParamsV2 {
    pub v1: KernelNodeParams,
    pub kern: Handle,
    pub ctx: Handle,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: Handle,
    pub err_node_out: Handle,
    pub result_out: u32,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
const INSTANTIATE_AUTO_FREE_ON_LAUNCH: u64 = 1;
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
            owned: Vec::new(),
            cloned_from: None,
        };
        let h = d
            .objects()
            .file(|o, h| o.graphs_mut().graphs.insert(h, graph));
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pgraph, h as Handle) }.inspect_err(|_| {
            let _ = d.objects().graphs_mut().graphs.remove(h);
        })
    })
}

/// The handles `p` points at (`n` of them).
///
/// # Safety
/// `p` is null (with `n` 0) or valid for `n` handles.
unsafe fn handles(p: *const Handle, n: usize) -> CuResult<Vec<usize>> {
    if n > g::MAX_NODES {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `n` handles.
    (0..n)
        .map(|i| unsafe { ffi::get(p.add(i)) }.map(|h| h as usize))
        .collect()
}

/// Writes `found` to the caller's `nodes` array of `*count` entries (null:
/// the count only), nulls past them, and the number found to `*count`.
///
/// # Safety
/// `count` is writable; `nodes` is null or valid for `*count` handles.
unsafe fn put_nodes(found: &[usize], nodes: *mut Handle, count: *mut usize) -> CuResult {
    if !nodes.is_null() {
        // SAFETY: the caller's in-out count.
        let room = unsafe { ffi::get(count.cast_const()) }?;
        for i in 0..room {
            let h = found.get(i).map_or(std::ptr::null_mut(), |&h| h as Handle);
            // SAFETY: the caller's array of `room` handles.
            unsafe { ffi::put(nodes.add(i), h) }?;
        }
        // SAFETY: the caller's in-out count.
        return unsafe { ffi::put(count, found.len().min(room)) };
    }
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(count, found.len()) }
}

/// The graph's nodes, in the order they were added.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    entry(|| {
        let found: Vec<usize> = driver()?
            .objects()
            .graphs()
            .graphs
            .get(graph as usize)?
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.kind != g::NODE_REMOVED)
            .map(|(i, _)| g::node_handle(graph as usize, i))
            .collect();
        // SAFETY: the caller's array and count.
        unsafe { put_nodes(&found, nodes, count) }
    })
}

/// The graph's nodes that depend on none.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    graph: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    entry(|| {
        let found: Vec<usize> = driver()?
            .objects()
            .graphs()
            .graphs
            .get(graph as usize)?
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.deps.is_empty() && n.kind != g::NODE_REMOVED)
            .map(|(i, _)| g::node_handle(graph as usize, i))
            .collect();
        // SAFETY: the caller's array and count.
        unsafe { put_nodes(&found, nodes, count) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(out: *mut Handle, graph: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let h = d.objects().clone_graph(graph as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, h as Handle) }.inspect_err(|_| {
            let _ = d.objects().graphs_mut().graphs.remove(h);
        })
    })
}

/// The nodes `node` depends on, or (`dependents`) that depend on it;
/// edge data, where asked for, is the default edge's (zeros).
///
/// # Safety
/// As the node query's arguments.
unsafe fn node_edges(
    node: Handle,
    nodes: *mut Handle,
    edges: *mut [u8; 8],
    count: *mut usize,
    dependents: bool,
) -> CuResult {
    let found = driver()?.objects().node_edges(node as usize, dependents)?;
    if !nodes.is_null() && !edges.is_null() {
        // SAFETY: the caller's in-out count.
        let room = unsafe { ffi::get(count.cast_const()) }?;
        for i in 0..room {
            // SAFETY: the caller's array of `room` edge data.
            unsafe { ffi::put(edges.add(i), [0; 8]) }?;
        }
    }
    // SAFETY: the caller's array and count.
    unsafe { put_nodes(&found, nodes, count) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { node_edges(node, nodes, std::ptr::null_mut(), count, false) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: Handle,
    nodes: *mut Handle,
    edges: *mut [u8; 8],
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { node_edges(node, nodes, edges, count, false) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { node_edges(node, nodes, std::ptr::null_mut(), count, true) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: Handle,
    nodes: *mut Handle,
    edges: *mut [u8; 8],
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { node_edges(node, nodes, edges, count, true) })
}

/// A node that runs a copy of graph `child`'s work, as it is now.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    child: Handle,
) -> CUresult {
    entry(|| {
        if child == graph {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let d = driver()?;
        let work = d.objects().graph_work(child as usize)?;
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_GRAPH, work) }?;
        // SAFETY: `add_node` wrote the handle.
        let node = unsafe { *out } as usize;
        let mut o = d.objects();
        o.keep_child_topology(node, child as usize)?;
        // The child's work may use memory the child owns.
        o.adopt_owned(graph as usize, child as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(node: Handle, kind: *mut u32) -> CUresult {
    entry(|| {
        let d = driver()?;
        let o = d.objects();
        let (graph, i) = o.node(node as usize)?;
        let t = o.graphs().graphs.at(graph).nodes[i].kind;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(kind, t) }
    })
}

/// Adds a node of `kind` doing `work` on `device` to `graph`, after the
/// `n` nodes at `deps`; its handle goes to `*out`.
///
/// # Safety
/// `out` is writable; `deps` is valid for `n` handles (or null with 0).
unsafe fn add_node(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    kind: u32,
    (device, work): (CUdevice, Vec<Work>),
) -> CuResult {
    let d = driver()?;
    // SAFETY: the caller's dependencies.
    let deps = unsafe { handles(deps, n) }?;
    if out.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    if o.graphs().graphs.get(graph as usize)?.device != device {
        // A graph runs on the one device it was made for.
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let h = o.add_node(graph as usize, &deps, kind, work)?;
    // SAFETY: the caller's out-parameter, not null.
    unsafe { ffi::put(out, h as Handle) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let device = d.objects().graphs().graphs.get(graph as usize)?.device;
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_EMPTY, (device, Vec::new())) }
    })
}

/// An event record or wait node (`kind`) of `event`.
///
/// # Safety
/// As `cuGraphAddEventRecordNode`'s arguments.
unsafe fn add_event_node(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    event: Handle,
    kind: u32,
) -> CuResult {
    let device = {
        let d = driver()?;
        let o = d.objects();
        o.streams().events.get(event as usize)?;
        o.graphs().graphs.get(graph as usize)?.device
    };
    let work = event_work(kind, event);
    // SAFETY: the caller's pointers.
    unsafe { add_node(out, graph, deps, n, kind, (device, vec![work])) }
}

/// The work of an event node of type `kind`.
fn event_work(kind: u32, event: Handle) -> Work {
    if kind == g::NODE_EVENT_RECORD {
        Work::Record(event as usize)
    } else {
        Work::Wait(event as usize)
    }
}

/// An event record node: records `event` once the nodes it depends on
/// are done.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEventRecordNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    event: Handle,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { add_event_node(out, graph, deps, n, event, g::NODE_EVENT_RECORD) })
}

/// An event wait node: the nodes that depend on it run after `event`'s
/// last record.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEventWaitNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    event: Handle,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { add_event_node(out, graph, deps, n, event, g::NODE_WAIT_EVENT) })
}

/// The event of an event node of type `kind`.
///
/// # Safety
/// `out` is the caller's out-parameter.
unsafe fn node_event(node: Handle, kind: u32, out: *mut Handle) -> CuResult {
    let e = driver()?.objects().event_of(node as usize, kind)?;
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(out, e as Handle) }
}

/// Gives an event node of type `kind` another event.
fn set_node_event(node: Handle, kind: u32, event: Handle) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    o.streams().events.get(event as usize)?;
    let (g, _) = o.node(node as usize)?;
    let device = o.graphs().graphs.at(g).device;
    o.set_node(node as usize, kind, device, event_work(kind, event))
}

/// Gives an event node of type `kind` of an executable another event.
fn set_exec_node_event(exec: Handle, node: Handle, kind: u32, event: Handle) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    o.streams().events.get(event as usize)?;
    let device = o.graphs().execs.get(exec as usize)?.device;
    o.set_exec_node(
        exec as usize,
        node as usize,
        kind,
        device,
        event_work(kind, event),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphEventRecordNodeGetEvent(
    node: Handle,
    out: *mut Handle,
) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { node_event(node, g::NODE_EVENT_RECORD, out) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphEventWaitNodeGetEvent(node: Handle, out: *mut Handle) -> CUresult {
    // SAFETY: the caller's out-parameter.
    entry(|| unsafe { node_event(node, g::NODE_WAIT_EVENT, out) })
}

#[no_mangle]
pub extern "C" fn cuGraphEventRecordNodeSetEvent(node: Handle, event: Handle) -> CUresult {
    entry(|| set_node_event(node, g::NODE_EVENT_RECORD, event))
}

#[no_mangle]
pub extern "C" fn cuGraphEventWaitNodeSetEvent(node: Handle, event: Handle) -> CUresult {
    entry(|| set_node_event(node, g::NODE_WAIT_EVENT, event))
}

#[no_mangle]
pub extern "C" fn cuGraphExecEventRecordNodeSetEvent(
    exec: Handle,
    node: Handle,
    event: Handle,
) -> CUresult {
    entry(|| set_exec_node_event(exec, node, g::NODE_EVENT_RECORD, event))
}

#[no_mangle]
pub extern "C" fn cuGraphExecEventWaitNodeSetEvent(
    exec: Handle,
    node: Handle,
    event: Handle,
) -> CUresult {
    entry(|| set_exec_node_event(exec, node, g::NODE_WAIT_EVENT, event))
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostNodeParams {
    pub f: Option<cu::HostFn>,
    pub user: *mut c_void,
}

/// The host call `p` describes.
///
/// # Safety
/// `p` is null or the caller's parameters.
unsafe fn host_call(p: *const HostNodeParams) -> CuResult<crate::work::HostCall> {
    // SAFETY: the caller's parameters (null is refused).
    let p = unsafe { ffi::get(p) }?;
    Ok(crate::work::HostCall {
        f: p.f.ok_or(cu::ERROR_INVALID_VALUE)?,
        user: p.user as usize,
    })
}

/// A host node: its function runs once the nodes it depends on are done,
/// before those that depend on it.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddHostNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const HostNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let call = unsafe { host_call(params) }?;
        let d = driver()?;
        let device = d.objects().graphs().graphs.get(graph as usize)?.device;
        let work = vec![Work::Host(call)];
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_HOST, (device, work)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphHostNodeGetParams(
    node: Handle,
    out: *mut HostNodeParams,
) -> CUresult {
    entry(|| {
        let h = driver()?.objects().host_of(node as usize)?;
        let p = HostNodeParams {
            f: Some(h.f),
            user: h.user as *mut c_void,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphHostNodeSetParams(
    node: Handle,
    params: *const HostNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let call = unsafe { host_call(params) }?;
        let d = driver()?;
        let mut o = d.objects();
        let (g, _) = o.node(node as usize)?;
        let device = o.graphs().graphs.at(g).device;
        o.set_node(node as usize, g::NODE_HOST, device, Work::Host(call))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecHostNodeSetParams(
    exec: Handle,
    node: Handle,
    params: *const HostNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let call = unsafe { host_call(params) }?;
        let d = driver()?;
        let mut o = d.objects();
        let device = o.graphs().execs.get(exec as usize)?.device;
        o.set_exec_node(
            exec as usize,
            node as usize,
            g::NODE_HOST,
            device,
            Work::Host(call),
        )
    })
}

/// A kernel node of kernel `f` (`p.func`, or the v2 form's `kern`).
///
/// # Safety
/// As `cuGraphAddKernelNode`'s arguments.
unsafe fn add_kernel_node(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    f: Handle,
    p: KernelNodeParams,
) -> CuResult {
    let dims = Dims {
        grid: p.grid,
        block: p.block,
        shared_mem: p.shared_mem,
    };
    // SAFETY: the caller's kernel parameters.
    let (device, work) = unsafe { kernel_work(f, dims, p.kernel_params, p.extra) }?;
    // SAFETY: the caller's pointers.
    unsafe { add_node(out, graph, deps, n, g::NODE_KERNEL, (device, vec![work])) }
}

/// The CUDA 10 and 11 form.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        // SAFETY: the caller's arguments.
        unsafe { add_kernel_node(out, graph, deps, n, p.func, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let f = if p.v1.func.is_null() {
            p.kern
        } else {
            p.v1.func
        };
        // SAFETY: the caller's arguments.
        unsafe { add_kernel_node(out, graph, deps, n, f, p.v1) }
    })
}

/// A memset node: `height` rows of `width` elements, `pitch` bytes apart.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const MemsetNodeParams,
    _ctx: Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let (device, work) = memset_node_work(&p)?;
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_MEMSET, (device, work)) }?;
        // SAFETY: written just now.
        let node = unsafe { ffi::get(out) }?;
        driver()?
            .objects()
            .keep_given(node as usize, g::Given::Memset(p))
    })
}

/// A memset node's work: one fill (and tail) per row, on the device of
/// the memory.
fn memset_node_work(p: &MemsetNodeParams) -> CuResult<(cu::CUdevice, Vec<Work>)> {
    let d = driver()?;
    let width = p.element_size as usize;
    let row = p.width.checked_mul(width).ok_or(cu::ERROR_INVALID_VALUE)?;
    if ![1, 2, 4].contains(&width)
        || p.width == 0
        || p.height == 0
        || (p.height > 1 && p.pitch < row)
    {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // One fill (and tail) per row, each on the graph's device.
    let mut work = Vec::new();
    let mut device = None;
    for r in 0..p.height {
        let at = (r as u64)
            .checked_mul(p.pitch as u64)
            .and_then(|off| p.dst.checked_add(off))
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        if let Some((dev, w)) = memset_work(d, at, p.value, width, p.width)? {
            if device.is_some_and(|x| x != dev) {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            device = Some(dev);
            work.extend(w);
        }
        if work.len() > g::MAX_NODES {
            return Err(cu::ERROR_INVALID_VALUE);
        }
    }
    let device = device.ok_or(cu::ERROR_INVALID_VALUE)?;
    Ok((device, work))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemsetNodeGetParams(
    node: Handle,
    out: *mut MemsetNodeParams,
) -> CUresult {
    entry(|| {
        match driver()?
            .objects()
            .given_of(node as usize, g::NODE_MEMSET)?
        {
            // SAFETY: the caller's out-parameter.
            g::Given::Memset(p) => unsafe { ffi::put(out, p) },
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemsetNodeSetParams(
    node: Handle,
    params: *const MemsetNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let (device, work) = memset_node_work(&p)?;
        driver()?.objects().set_node_given(
            node as usize,
            g::NODE_MEMSET,
            device,
            work,
            g::Given::Memset(p),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecMemsetNodeSetParams(
    exec: Handle,
    node: Handle,
    params: *const MemsetNodeParams,
    _ctx: Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let (device, work) = memset_node_work(&p)?;
        driver()?.objects().set_exec_works(
            exec as usize,
            node as usize,
            g::NODE_MEMSET,
            device,
            work,
        )
    })
}

/// A memcpy node: rows (in slices) between device memory, or between
/// device memory and host memory (page-locked, or pageable: copied when
/// the graph runs, after the work before it), as `cuMemcpy3D` copies
/// them.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const Memcpy3d,
    _ctx: Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let d = driver()?;
        let (device, works) = Copy3D::of(d, &p)?.works(d)?;
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_MEMCPY, (device, works)) }?;
        // SAFETY: written just now.
        let node = unsafe { ffi::get(out) }?;
        d.objects().keep_given(node as usize, g::Given::Memcpy(p))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemcpyNodeGetParams(node: Handle, out: *mut Memcpy3d) -> CUresult {
    entry(|| {
        match driver()?
            .objects()
            .given_of(node as usize, g::NODE_MEMCPY)?
        {
            // SAFETY: the caller's out-parameter.
            g::Given::Memcpy(p) => unsafe { ffi::put(out, p) },
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemcpyNodeSetParams(
    node: Handle,
    params: *const Memcpy3d,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let d = driver()?;
        let (device, works) = Copy3D::of(d, &p)?.works(d)?;
        d.objects().set_node_given(
            node as usize,
            g::NODE_MEMCPY,
            device,
            works,
            g::Given::Memcpy(p),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecMemcpyNodeSetParams(
    exec: Handle,
    node: Handle,
    params: *const Memcpy3d,
    _ctx: Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        let d = driver()?;
        let (device, works) = Copy3D::of(d, &p)?.works(d)?;
        d.objects()
            .set_exec_works(exec as usize, node as usize, g::NODE_MEMCPY, device, works)
    })
}

/// Makes each of the `n` nodes at `to` depend on the one at `from` beside
/// it.
///
/// # Safety
/// `from` and `to` are valid for `n` handles each.
unsafe fn add_dependencies(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    n: usize,
) -> CuResult {
    // SAFETY: the caller's arrays.
    let (from, to) = unsafe { (handles(from, n)?, handles(to, n)?) };
    driver()?
        .objects()
        .add_dependencies(graph as usize, &from, &to)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddDependencies(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's arrays.
    entry(|| unsafe { add_dependencies(graph, from, to, n) })
}

/// The CUDA 12.3 form, with data on each edge: only the default edge
/// (all zeros, or none given) is supported.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    edges: *const [u8; 8],
    n: usize,
) -> CUresult {
    entry(|| {
        if !edges.is_null() {
            for i in 0..n.min(g::MAX_NODES) {
                // SAFETY: the caller's array of `n` edge data.
                if unsafe { ffi::get(edges.add(i)) }? != [0; 8] {
                    return Err(crate::state::unsupported_with(
                        "cuGraphAddDependencies",
                        "edges other than the default",
                    ));
                }
            }
        }
        // SAFETY: the caller's arrays.
        unsafe { add_dependencies(graph, from, to, n) }
    })
}

/// Removes the edge from each node of `from` to the node of `to` beside
/// it.
///
/// # Safety
/// `from` and `to` are valid for `n` handles each.
unsafe fn remove_dependencies(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    n: usize,
) -> CuResult {
    // SAFETY: the caller's arrays.
    let (from, to) = unsafe { (handles(from, n)?, handles(to, n)?) };
    driver()?
        .objects()
        .remove_dependencies(graph as usize, &from, &to)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphRemoveDependencies(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's arrays.
    entry(|| unsafe { remove_dependencies(graph, from, to, n) })
}

/// The CUDA 12.3 form: only default edges exist here.
#[no_mangle]
pub unsafe extern "C" fn cuGraphRemoveDependencies_v2(
    graph: Handle,
    from: *const Handle,
    to: *const Handle,
    edges: *const [u8; 8],
    n: usize,
) -> CUresult {
    entry(|| {
        if !edges.is_null() {
            for i in 0..n.min(g::MAX_NODES) {
                // SAFETY: the caller's array of `n` edge data.
                if unsafe { ffi::get(edges.add(i)) }? != [0; 8] {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
            }
        }
        // SAFETY: the caller's arrays.
        unsafe { remove_dependencies(graph, from, to, n) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        let r = d.objects().destroy_graph(graph as usize);
        free_released(d);
        r
    })
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
        return Err(crate::state::unsupported(
            "cuGraphInstantiate for launches from the device",
        ));
    }
    if pexec.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // Uploads and node priorities need nothing here: graphs replay from
    // the host and run in order. Automatic frees are the launch's.
    let h = d.objects().instantiate(graph as usize, flags)?;
    // SAFETY: the caller's out-parameter, checked non-null.
    unsafe { ffi::put(pexec, h as Handle) }
}

/// The flags an executable was instantiated with.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecGetFlags(exec: Handle, flags: *mut u64) -> CUresult {
    entry(|| {
        let f = driver()?.objects().graphs().execs.get(exec as usize)?.flags;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(flags, f) }
    })
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
        let d = driver()?;
        let r = d.objects().destroy_exec(exec as usize);
        free_released(d);
        r
    })
}

/// Nothing to upload: a launch queues the recorded work from the host.
#[no_mangle]
pub extern "C" fn cuGraphUpload(exec: Handle, stream: Handle) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.stream_gpu(stream as usize)?;
        d.objects().graphs().execs.get(exec as usize).map(drop)
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
            let mut o = d.objects();
            let e = o.graphs().execs.get(exec as usize)?;
            let (device, nodes, flags) = (e.device, e.launch_work(), e.flags);
            let (allocs, frees) = e.mem.clone();
            let auto_free = flags & INSTANTIATE_AUTO_FREE_ON_LAUNCH != 0;
            if !o.graphs_mut().mem.launch(&allocs, &frees, auto_free) {
                // CUDA relaunches no graph whose allocation is still
                // allocated, unless it frees them on launch.
                log("a graph launched again before its allocations were freed");
                return Err(cu::ERROR_INVALID_VALUE);
            }
            (device, nodes)
        };
        // Copies with a host side reach host memory only while it is
        // still page-locked (not freed or unregistered since).
        let gone = nodes
            .iter()
            .filter_map(Work::host_range)
            .any(|(p, len)| !in_page_locked(d, p as usize, len as usize));
        if gone {
            log("a graph copies to or from host memory that is no longer page-locked");
            return Err(cu::ERROR_INVALID_VALUE);
        }
        d.queue(stream as usize, device, &nodes)
    })
}

/// Writes kernel node `node`'s parameters to `out` (the v1 part of
/// either form).
///
/// # Safety
/// `out` is the caller's structure, valid for a write.
unsafe fn kernel_node_params(node: Handle, out: *mut KernelNodeParams) -> CuResult {
    let d = driver()?;
    let (launch, ptrs) = d.objects().kernel_of(node as usize)?;
    let Work::Launch { func, dims, .. } = launch else {
        return Err(cu::ERROR_INVALID_VALUE);
    };
    let p = KernelNodeParams {
        func: func as Handle,
        grid: dims.grid,
        block: dims.block,
        shared_mem: dims.shared_mem,
        kernel_params: ptrs,
        extra: std::ptr::null_mut(),
    };
    // SAFETY: the caller's structure.
    unsafe { ffi::put(out, p) }
}

/// The CUDA 10 and 11 form.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: Handle,
    out: *mut KernelNodeParams,
) -> CUresult {
    // SAFETY: the caller's structure.
    entry(|| unsafe { kernel_node_params(node, out) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: Handle,
    out: *mut KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        if out.is_null() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's structure, not null; v1 is its start.
        unsafe {
            kernel_node_params(node, std::ptr::addr_of_mut!((*out).v1))?;
            // A kernel and its function share one handle here
            // (`cuKernelGetFunction`); the runtime maps the kernel back
            // to the program's entry point.
            let f = (*out).v1.func;
            ffi::put(std::ptr::addr_of_mut!((*out).kern), f)?;
            ffi::put(std::ptr::addr_of_mut!((*out).ctx), std::ptr::null_mut())
        }
    })
}

/// The launch `p` describes (of `f`), and its device.
///
/// # Safety
/// As `cuGraphKernelNodeSetParams`'s parameters.
unsafe fn launch_of(f: Handle, p: &KernelNodeParams) -> CuResult<(CUdevice, Work)> {
    let dims = Dims {
        grid: p.grid,
        block: p.block,
        shared_mem: p.shared_mem,
    };
    // SAFETY: the caller's kernel parameters.
    let (device, work) = unsafe { kernel_work(f, dims, p.kernel_params, p.extra) }?;
    work.check()?;
    Ok((device, work))
}

/// The function a v2 structure names: `func`, or `kern` where it is null.
fn v2_function(p: &KernelNodeParamsV2) -> Handle {
    if p.v1.func.is_null() {
        p.kern
    } else {
        p.v1.func
    }
}

/// The CUDA 10 and 11 form.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams(
    node: Handle,
    params: *const KernelNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        // SAFETY: as above.
        let (device, work) = unsafe { launch_of(p.func, &p) }?;
        driver()?.objects().set_kernel(node as usize, device, work)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams_v2(
    node: Handle,
    params: *const KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        // SAFETY: as above.
        let (device, work) = unsafe { launch_of(v2_function(&p), &p.v1) }?;
        driver()?.objects().set_kernel(node as usize, device, work)
    })
}

/// The CUDA 10 and 11 form.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    exec: Handle,
    node: Handle,
    params: *const KernelNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        // SAFETY: as above.
        let (device, work) = unsafe { launch_of(p.func, &p) }?;
        driver()?
            .objects()
            .set_exec_kernel(exec as usize, node as usize, device, work)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    exec: Handle,
    node: Handle,
    params: *const KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters (null is refused).
        let p = unsafe { ffi::get(params) }?;
        // SAFETY: as above.
        let (device, work) = unsafe { launch_of(v2_function(&p), &p.v1) }?;
        driver()?
            .objects()
            .set_exec_kernel(exec as usize, node as usize, device, work)
    })
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExecUpdateResultInfo {
    pub result: u32,
    pub error_node: Handle,
    pub error_from_node: Handle,
}

/// `CUgraphExecUpdateResult` values given here.
const UPDATE_SUCCESS: u32 = 0;
const UPDATE_ERROR: u32 = 1;
const UPDATE_TOPOLOGY_CHANGED: u32 = 2;

/// Updates `exec` from `graph`: the result code and the node at fault.
fn exec_update(exec: Handle, graph: Handle) -> CuResult<(u32, Handle)> {
    let d = driver()?;
    let r = d.objects().update_exec(exec as usize, graph as usize);
    free_released(d);
    match r {
        Ok(()) => Ok((UPDATE_SUCCESS, std::ptr::null_mut())),
        Err(Ok(g::UpdateFailure::Topology(node))) => Ok((
            UPDATE_TOPOLOGY_CHANGED,
            node.map_or(std::ptr::null_mut(), |n| n as Handle),
        )),
        Err(Ok(g::UpdateFailure::Other)) => Ok((UPDATE_ERROR, std::ptr::null_mut())),
        Err(Err(e)) => Err(e),
    }
}

/// The CUDA 10.2 to 11 form.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate(
    exec: Handle,
    graph: Handle,
    error_node: *mut Handle,
    result: *mut u32,
) -> CUresult {
    entry(|| {
        let (code, node) = exec_update(exec, graph)?;
        // SAFETY: the caller's out-parameters.
        unsafe {
            ffi::put_opt(error_node, node)?;
            ffi::put_opt(result, code)?;
        }
        if code == UPDATE_SUCCESS {
            Ok(())
        } else {
            Err(cu::ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

/// Updates an executable from a graph of the same topology (as many
/// nodes, each of the same type after the same ones); a node's work may
/// differ in anything.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec: Handle,
    graph: Handle,
    info: *mut ExecUpdateResultInfo,
) -> CUresult {
    entry(|| {
        let (code, node) = exec_update(exec, graph)?;
        let out = ExecUpdateResultInfo {
            result: code,
            error_node: node,
            error_from_node: std::ptr::null_mut(),
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put_opt(info, out) }?;
        if code == UPDATE_SUCCESS {
            Ok(())
        } else {
            Err(cu::ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

/// `CUgraphNodeParams` (CUDA 12.2): a node's type, then its parameters as
/// the type's own structure, in 232 bytes; the reserved words must be 0.
#[repr(C)]
pub struct NodeParams {
    kind: u32,
    reserved0: [i32; 3],
    params: [u64; 29],
    reserved2: i64,
}

const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);

/// `CUDA_MEMCPY_NODE_PARAMS`: the copy and the context it runs in.
#[repr(C)]
struct MemcpyNodeParams {
    flags: i32,
    reserved: i32,
    ctx: Handle,
    copy: Memcpy3d,
}

/// `CUDA_MEMSET_NODE_PARAMS_v2`: the memset and its context.
#[repr(C)]
struct MemsetNodeParamsV2 {
    memset: MemsetNodeParams,
    ctx: Handle,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`: the graph and how the node holds it
/// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE`, 0, the only one offered).
#[repr(C)]
struct ChildGraphNodeParams {
    graph: Handle,
    ownership: u32,
}

/// The node types the generic functions take (`CUgraphNodeType`).
const NODE_TYPES: &[(u32, &str)] = &[
    (g::NODE_KERNEL, "kernel"),
    (g::NODE_MEMCPY, "memcpy"),
    (g::NODE_MEMSET, "memset"),
    (g::NODE_HOST, "host"),
    (g::NODE_GRAPH, "child graph"),
    (g::NODE_EMPTY, "empty"),
    (g::NODE_WAIT_EVENT, "event wait"),
    (g::NODE_EVENT_RECORD, "event record"),
    (g::NODE_MEM_ALLOC, "memory allocation"),
    (g::NODE_MEM_FREE, "memory free"),
];

/// The parameters at `p`, checked: readable, reserved words zero, and a
/// type the generic functions take (others are logged as unsupported).
///
/// # Safety
/// `p` is the caller's `CUgraphNodeParams`, or null.
unsafe fn node_params<'a>(name: &'static str, p: *const NodeParams) -> CuResult<&'a NodeParams> {
    if p.is_null() || !p.is_aligned() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's structure, not null and aligned.
    let np = unsafe { &*p };
    if np.reserved0 != [0; 3] || np.reserved2 != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    if !NODE_TYPES.iter().any(|&(k, _)| k == np.kind) {
        return Err(crate::state::unsupported_with(
            name,
            "graph nodes of this type (conditional, external semaphores, memory operations)",
        ));
    }
    Ok(np)
}

/// The type's own parameters, at the start of the union.
fn union_of<T>(np: &NodeParams) -> *const T {
    np.params.as_ptr().cast()
}

/// `cuGraphAddNode`: a node of any type the per-type functions make,
/// made by them.
///
/// # Safety
/// As `cuGraphAddNode` takes its arguments.
unsafe fn add_any_node(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    p: *const NodeParams,
) -> CUresult {
    // SAFETY: the caller's structure.
    let np = match unsafe { node_params("cuGraphAddNode", p) } {
        Ok(np) => np,
        Err(e) => return e,
    };
    // SAFETY: (each arm) the union holds the type's own structure, which
    // the per-type function reads; the caller's other arguments go on.
    unsafe {
        match np.kind {
            g::NODE_KERNEL => cuGraphAddKernelNode_v2(out, graph, deps, n, union_of(np)),
            g::NODE_MEMCPY => {
                let m: &MemcpyNodeParams = &*union_of(np);
                if m.flags != 0 || m.reserved != 0 {
                    return cu::ERROR_INVALID_VALUE;
                }
                cuGraphAddMemcpyNode(out, graph, deps, n, &m.copy, m.ctx)
            }
            g::NODE_MEMSET => {
                let m: &MemsetNodeParamsV2 = &*union_of(np);
                cuGraphAddMemsetNode(out, graph, deps, n, &m.memset, m.ctx)
            }
            g::NODE_HOST => cuGraphAddHostNode(out, graph, deps, n, union_of(np)),
            g::NODE_GRAPH => {
                let c: &ChildGraphNodeParams = &*union_of(np);
                if c.ownership != 0 {
                    return crate::state::unsupported_with(
                        "cuGraphAddNode",
                        "child graphs moved into their node",
                    );
                }
                cuGraphAddChildGraphNode(out, graph, deps, n, c.graph)
            }
            g::NODE_EMPTY => cuGraphAddEmptyNode(out, graph, deps, n),
            g::NODE_WAIT_EVENT => cuGraphAddEventWaitNode(out, graph, deps, n, *union_of(np)),
            // The allocation's address goes back into the caller's
            // parameters (`cuGraphAddNode` takes them mutable).
            g::NODE_MEM_ALLOC => cuGraphAddMemAllocNode(
                out,
                graph,
                deps,
                n,
                union_of::<MemAllocNodeParams>(np).cast_mut(),
            ),
            g::NODE_MEM_FREE => cuGraphAddMemFreeNode(out, graph, deps, n, *union_of(np)),
            _ => cuGraphAddEventRecordNode(out, graph, deps, n, *union_of(np)),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *const NodeParams,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { add_any_node(out, graph, deps, n, params) }
}

/// The CUDA 12.3 form, with data on each edge: only the default edge.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    edges: *const [u8; 8],
    n: usize,
    params: *const NodeParams,
) -> CUresult {
    if !edges.is_null() {
        for i in 0..n.min(g::MAX_NODES) {
            // SAFETY: the caller's array of `n` edge data.
            match unsafe { ffi::get(edges.add(i)) } {
                Ok(e) if e == [0; 8] => {}
                Ok(_) => {
                    return crate::state::unsupported_with(
                        "cuGraphAddNode",
                        "edges other than the default",
                    )
                }
                Err(e) => return e,
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { add_any_node(out, graph, deps, n, params) }
}

/// The type of node `node` (of a graph).
fn type_of(node: Handle) -> CuResult<u32> {
    let d = driver()?;
    let o = d.objects();
    let (graph, i) = o.node(node as usize)?;
    Ok(o.graphs().graphs.at(graph).nodes[i].kind)
}

/// `cuGraphNodeSetParams` (`exec`: none) or `cuGraphExecNodeSetParams`:
/// the per-type function for the node's type, which must be the
/// parameters' type. A child graph node's graph is not changed here.
///
/// # Safety
/// `p` is the caller's `CUgraphNodeParams`.
unsafe fn set_any_node(
    name: &'static str,
    exec: Option<Handle>,
    node: Handle,
    p: *const NodeParams,
) -> CUresult {
    // SAFETY: the caller's structure.
    let np = match unsafe { node_params(name, p) } {
        Ok(np) => np,
        Err(e) => return e,
    };
    match type_of(node) {
        Ok(t) if t == np.kind => {}
        Ok(_) => return cu::ERROR_INVALID_VALUE,
        Err(e) => return e,
    }
    // SAFETY: (each arm) as in `add_any_node`.
    unsafe {
        match (np.kind, exec) {
            (g::NODE_KERNEL, None) => cuGraphKernelNodeSetParams_v2(node, union_of(np)),
            (g::NODE_KERNEL, Some(x)) => cuGraphExecKernelNodeSetParams_v2(x, node, union_of(np)),
            (g::NODE_MEMCPY, _) => {
                let m: &MemcpyNodeParams = &*union_of(np);
                if m.flags != 0 || m.reserved != 0 {
                    return cu::ERROR_INVALID_VALUE;
                }
                match exec {
                    None => cuGraphMemcpyNodeSetParams(node, &m.copy),
                    Some(x) => cuGraphExecMemcpyNodeSetParams(x, node, &m.copy, m.ctx),
                }
            }
            (g::NODE_MEMSET, _) => {
                let m: &MemsetNodeParamsV2 = &*union_of(np);
                match exec {
                    None => cuGraphMemsetNodeSetParams(node, &m.memset),
                    Some(x) => cuGraphExecMemsetNodeSetParams(x, node, &m.memset, m.ctx),
                }
            }
            (g::NODE_HOST, None) => cuGraphHostNodeSetParams(node, union_of(np)),
            (g::NODE_HOST, Some(x)) => cuGraphExecHostNodeSetParams(x, node, union_of(np)),
            (g::NODE_WAIT_EVENT, None) => cuGraphEventWaitNodeSetEvent(node, *union_of(np)),
            (g::NODE_WAIT_EVENT, Some(x)) => {
                cuGraphExecEventWaitNodeSetEvent(x, node, *union_of(np))
            }
            (g::NODE_EVENT_RECORD, None) => cuGraphEventRecordNodeSetEvent(node, *union_of(np)),
            (g::NODE_EVENT_RECORD, Some(x)) => {
                cuGraphExecEventRecordNodeSetEvent(x, node, *union_of(np))
            }
            (g::NODE_GRAPH, Some(x)) => {
                let c: &ChildGraphNodeParams = &*union_of(np);
                cuGraphExecChildGraphNodeSetParams(x, node, c.graph)
            }
            // An empty node has nothing to set.
            (g::NODE_EMPTY, _) => cu::SUCCESS,
            // CUDA changes no memory node.
            (g::NODE_MEM_ALLOC | g::NODE_MEM_FREE, _) => cu::ERROR_INVALID_VALUE,
            _ => crate::state::unsupported_with(name, "changing a child graph node"),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeSetParams(node: Handle, params: *const NodeParams) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { set_any_node("cuGraphNodeSetParams", None, node, params) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    exec: Handle,
    node: Handle,
    params: *const NodeParams,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { set_any_node("cuGraphExecNodeSetParams", Some(exec), node, params) }
}

/// Every edge of `graph`, as (from, to) node handles, in the order of
/// the nodes they go to.
fn edges_of(graph: Handle) -> CuResult<Vec<(usize, usize)>> {
    let d = driver()?;
    let o = d.objects();
    let gr = o.graphs().graphs.get(graph as usize)?;
    let h = |i| g::node_handle(graph as usize, i);
    Ok(gr
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(to, n)| n.deps.iter().map(move |&from| (h(from), h(to))))
        .collect())
}

/// `cuGraphGetEdges`: with `from` and `to` null, the number of edges;
/// else up to `*count` of them (the rest of the room nulled), and how
/// many were given. Edge data, where asked for, is the default edge's.
///
/// # Safety
/// As `cuGraphGetEdges_v2` takes its arguments.
unsafe fn get_edges(
    graph: Handle,
    from: *mut Handle,
    to: *mut Handle,
    data: *mut [u8; 8],
    count: *mut usize,
) -> CuResult {
    let edges = edges_of(graph)?;
    if from.is_null() != to.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    if from.is_null() {
        // SAFETY: the caller's out-parameter.
        return unsafe { ffi::put(count, edges.len()) };
    }
    // SAFETY: the caller's in-out count.
    let room = unsafe { ffi::get(count.cast_const()) }?;
    for i in 0..room {
        let (f, t) = edges.get(i).map_or((0, 0), |&e| e);
        // SAFETY: the caller's arrays of `room` entries.
        unsafe {
            ffi::put(from.add(i), f as Handle)?;
            ffi::put(to.add(i), t as Handle)?;
            if !data.is_null() {
                ffi::put(data.add(i), [0; 8])?;
            }
        }
    }
    // SAFETY: the caller's in-out count.
    unsafe { ffi::put(count, edges.len().min(room)) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges(
    graph: Handle,
    from: *mut Handle,
    to: *mut Handle,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { get_edges(graph, from, to, std::ptr::null_mut(), count) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    graph: Handle,
    from: *mut Handle,
    to: *mut Handle,
    data: *mut [u8; 8],
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arguments.
    entry(|| unsafe { get_edges(graph, from, to, data, count) })
}

/// The node of `clone` (a `cuGraphClone` of the node's graph) that
/// `original` became: a clone keeps its nodes' indices.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    out: *mut Handle,
    original: Handle,
    clone: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let found = {
            let o = d.objects();
            let (graph, i) = o.node(original as usize)?;
            let c = o.graphs().graphs.get(clone as usize)?;
            let kept = c.nodes.get(i).is_some_and(|n| n.kind != g::NODE_REMOVED);
            if c.cloned_from != Some(graph) || !kept {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            g::node_handle(clone as usize, i)
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, found as Handle) }
    })
}

/// `cuGraphDebugDotPrint`: the graph's nodes (index and type) and edges
/// in Graphviz's DOT language, written to `path`; the verbosity flags
/// add nothing.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDebugDotPrint(
    graph: Handle,
    path: *const c_char,
    _flags: u32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's NUL-terminated path.
        let path = unsafe { ffi::cstr(path) }?;
        let kinds: Vec<u32> = {
            let d = driver()?;
            let o = d.objects();
            let gr = o.graphs().graphs.get(graph as usize)?;
            gr.nodes.iter().map(|n| n.kind).collect()
        };
        let mut dot = String::from("digraph graph_0 {\n");
        for (i, k) in kinds.iter().enumerate() {
            if *k == g::NODE_REMOVED {
                continue;
            }
            let name = NODE_TYPES
                .iter()
                .find(|&&(t, _)| t == *k)
                .map_or("node", |&(_, n)| n);
            dot += &format!("  n{i} [label=\"{i}: {name}\"];\n");
        }
        for (from, to) in edges_of(graph)? {
            let (Some((_, f)), Some((_, t))) = (g::node_of(from), g::node_of(to)) else {
                continue;
            };
            dot += &format!("  n{f} -> n{t};\n");
        }
        dot += "}\n";
        std::fs::write(path, dot).map_err(|_| cu::ERROR_OPERATING_SYSTEM)
    })
}

/// A kernel node's attribute: whether it is one a node takes, and how.
enum NodeAttr {
    /// Kept and read back as set; the device honours it by ignoring it
    /// (an L2 access window, a priority, memory synchronisation domains,
    /// a scheduling preference, a shared memory carve-out, a
    /// cooperative launch turned off).
    Kept,
    /// The node's clusters: its launch's.
    Cluster,
}

/// `CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
const LAUNCH_ATTRIBUTE_CARVEOUT: u32 = 14;

fn node_attr(
    name: &'static str,
    id: u32,
    value: &cu::CUlaunchAttributeValue,
) -> CuResult<NodeAttr> {
    Ok(match id {
        cu::LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION => NodeAttr::Cluster,
        cu::LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
        | cu::LAUNCH_ATTRIBUTE_PRIORITY
        | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
        | cu::LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN
        | cu::LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | LAUNCH_ATTRIBUTE_CARVEOUT => NodeAttr::Kept,
        cu::LAUNCH_ATTRIBUTE_COOPERATIVE if value[0] == 0 => NodeAttr::Kept,
        _ => {
            return Err(crate::state::unsupported_with(
                name,
                "this kernel node attribute (cooperative launches among them)",
            ))
        }
    })
}

/// Applies `f` to kernel node `node` (of a graph).
fn with_kernel_node<T>(node: Handle, f: impl FnOnce(&mut g::Node) -> CuResult<T>) -> CuResult<T> {
    let d = driver()?;
    let mut o = d.objects();
    let (graph, i) = o.node(node as usize)?;
    let n = o
        .graphs_mut()
        .graphs
        .get_mut(graph)
        .ok()
        .and_then(|gr| gr.nodes.get_mut(i))
        .ok_or(cu::ERROR_INVALID_HANDLE)?;
    if n.kind != g::NODE_KERNEL {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    f(n)
}

/// The launch of a kernel node's work: its function, grid and clusters.
fn node_launch(n: &mut g::Node) -> CuResult<(&mut usize, [u32; 3], &mut [u32; 3])> {
    match n.work.first_mut() {
        Some(Work::Launch {
            func,
            dims,
            cluster,
            ..
        }) => Ok((func, dims.grid, cluster)),
        _ => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// Kernel node `node` launches in clusters of `cluster` blocks (0 as 1),
/// which must divide its grid and fit its kernel.
fn set_cluster(node: Handle, cluster: [u32; 3]) -> CuResult {
    let cluster = cluster.map(|c| c.max(1));
    let func = with_kernel_node(node, |n| Ok(*node_launch(n)?.0))?;
    let most = crate::modules::max_cluster_blocks(driver()?, func)?;
    let blocks = cluster.iter().map(|&c| u64::from(c)).product::<u64>();
    with_kernel_node(node, |n| {
        let (_, grid, shape) = node_launch(n)?;
        if blocks > u64::from(most) || grid.iter().zip(cluster).any(|(g, c)| g % c != 0) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        *shape = cluster;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: Handle,
    attr: u32,
    value: *const cu::CUlaunchAttributeValue,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's value (null is refused).
        let v = unsafe { ffi::get(value) }?;
        match node_attr("cuGraphKernelNodeSetAttribute", attr, &v)? {
            NodeAttr::Kept => with_kernel_node(node, |n| {
                n.attrs.insert(attr, v);
                Ok(())
            }),
            NodeAttr::Cluster => set_cluster(node, [v[0], v[1], v[2]]),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: Handle,
    attr: u32,
    out: *mut cu::CUlaunchAttributeValue,
) -> CUresult {
    entry(|| {
        let zero = [0; 16];
        let v = match node_attr("cuGraphKernelNodeGetAttribute", attr, &zero)? {
            NodeAttr::Kept => {
                with_kernel_node(node, |n| Ok(n.attrs.get(&attr).copied().unwrap_or(zero)))?
            }
            NodeAttr::Cluster => with_kernel_node(node, |n| {
                let (_, _, c) = node_launch(n)?;
                let mut v = zero;
                v[..3].copy_from_slice(&c[..]);
                Ok(v)
            })?,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, v) }
    })
}

/// The attributes (kept ones and the cluster shape) of kernel node `src`
/// given to kernel node `dst`.
#[no_mangle]
pub extern "C" fn cuGraphKernelNodeCopyAttributes(dst: Handle, src: Handle) -> CUresult {
    entry(|| {
        let (attrs, cluster) = with_kernel_node(src, |n| {
            let c = *node_launch(n)?.2;
            Ok((n.attrs.clone(), c))
        })?;
        // The cluster shape must fit the destination's grid and kernel.
        set_cluster(dst, cluster)?;
        with_kernel_node(dst, |n| {
            n.attrs = attrs;
            Ok(())
        })
    })
}

/// Gives a child graph node of an executable the work of `child`, a
/// graph of the node's graph's topology.
#[no_mangle]
pub extern "C" fn cuGraphExecChildGraphNodeSetParams(
    exec: Handle,
    node: Handle,
    child: Handle,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let r = d
            .objects()
            .set_exec_child(exec as usize, node as usize, child as usize);
        free_released(d);
        r
    })
}

/// Removes a node and the edges to and from it.
#[no_mangle]
pub extern "C" fn cuGraphDestroyNode(node: Handle) -> CUresult {
    entry(|| driver()?.objects().destroy_node(node as usize))
}

/// Enables or disables a kernel, memcpy or memset node in an executable:
/// its launches leave a disabled node's work out, its parameters kept.
#[no_mangle]
pub extern "C" fn cuGraphNodeSetEnabled(exec: Handle, node: Handle, enabled: u32) -> CUresult {
    entry(|| {
        driver()?
            .objects()
            .set_enabled(exec as usize, node as usize, enabled != 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetEnabled(
    exec: Handle,
    node: Handle,
    enabled: *mut u32,
) -> CUresult {
    entry(|| {
        let on = driver()?.objects().enabled(exec as usize, node as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(enabled, u32::from(on)) }
    })
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: the pool's properties, peer access,
/// the size, and the address the node allocates (returned).
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool: crate::api::pool::PoolProps,
    pub access: *const crate::api::pool::AccessDesc,
    pub access_count: usize,
    pub bytesize: usize,
    pub dptr: cu::CUdeviceptr,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ALLOCATION_PINNED: u32 = 1;
const LOCATION_DEVICE: i32 = 1;
const ACCESS_READWRITE: u32 = 3;

/// An allocation node: device memory of the graph's device, allocated
/// now so that its address is fixed (`params.dptr`), and held by the
/// graph and its executable (see [`g::GraphMem`]).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        if params.is_null() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's parameters, not null.
        let p = unsafe { &*params };
        let device = d.objects().graphs().graphs.get(graph as usize)?.device;
        let loc = p.pool.location;
        if p.pool.alloc_type != ALLOCATION_PINNED
            || loc.kind != LOCATION_DEVICE
            || loc.id != device
            || p.bytesize == 0
        {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's access descriptors.
        let access = unsafe { ffi::slice(p.access, p.access_count) }?;
        for a in access {
            if a.location.kind != LOCATION_DEVICE || a.location.id != device {
                // A vGPU has no peers to share the allocation with.
                return Err(cu::ERROR_INVALID_DEVICE);
            }
            if a.flags != ACCESS_READWRITE {
                return Err(cu::ERROR_INVALID_VALUE);
            }
        }
        if d.current_ctx()?.1 != device {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let addr = crate::allocs::alloc(p.bytesize)?;
        let added = (|| {
            // SAFETY: the caller's pointers.
            unsafe { add_node(out, graph, deps, n, g::NODE_MEM_ALLOC, (device, Vec::new())) }?;
            // SAFETY: the caller's out-parameter, checked non-null above.
            let node = unsafe { *out } as usize;
            let mut o = d.objects();
            o.keep_given(node, g::Given::MemAlloc(addr, p.bytesize as u64))?;
            o.graphs_mut().mem.hold(addr, p.bytesize as u64, device);
            o.graphs_mut()
                .graphs
                .get_mut(graph as usize)?
                .owned
                .push(std::sync::Arc::new(vec![addr]));
            Ok(())
        })();
        if let Err(e) = added {
            let _ = crate::allocs::free(addr);
            return Err(e);
        }
        // SAFETY: the caller's parameters, not null.
        unsafe { ffi::put(std::ptr::addr_of_mut!((*params).dptr), addr) }
    })
}

/// A free node of memory an allocation node (of any graph) allocated,
/// at most one per allocation in a graph.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    out: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    n: usize,
    dptr: cu::CUdeviceptr,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let device = {
            let o = d.objects();
            let gr = o.graphs().graphs.get(graph as usize)?;
            let twice = gr
                .nodes
                .iter()
                .any(|x| matches!(x.given, Some(g::Given::MemFree(a)) if a == dptr));
            if twice || !o.graphs().mem.is_graphs(dptr) {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            gr.device
        };
        // SAFETY: the caller's pointers.
        unsafe { add_node(out, graph, deps, n, g::NODE_MEM_FREE, (device, Vec::new())) }?;
        // SAFETY: `add_node` wrote the handle.
        let node = unsafe { *out } as usize;
        d.objects().keep_given(node, g::Given::MemFree(dptr))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: Handle,
    out: *mut MemAllocNodeParams,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        let given = d.objects().given_of(node as usize, g::NODE_MEM_ALLOC)?;
        let (g::Given::MemAlloc(addr, size), false) = (given, out.is_null()) else {
            return Err(cu::ERROR_INVALID_VALUE);
        };
        let (graph, _) = d.objects().node(node as usize)?;
        let device = d.objects().graphs().graphs.at(graph).device;
        // SAFETY: all-zero bytes are valid pool properties.
        let mut pool: crate::api::pool::PoolProps = unsafe { std::mem::zeroed() };
        pool.alloc_type = ALLOCATION_PINNED;
        pool.location = cu::MemLocation {
            kind: LOCATION_DEVICE,
            id: device,
        };
        let p = MemAllocNodeParams {
            pool,
            access: std::ptr::null(),
            access_count: 0,
            bytesize: size as usize,
            dptr: addr,
        };
        // SAFETY: the caller's out-parameter, not null.
        unsafe { std::ptr::write_unaligned(out, p) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: Handle,
    out: *mut cu::CUdeviceptr,
) -> CUresult {
    entry(|| {
        let given = driver()?
            .objects()
            .given_of(node as usize, g::NODE_MEM_FREE)?;
        let g::Given::MemFree(addr) = given else {
            return Err(cu::ERROR_INVALID_VALUE);
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, addr) }
    })
}

/// What graphs' allocation nodes use and hold on `device`, and the high
/// marks of both.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attr: u32,
    value: *mut c_void,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(device)?;
        let v = d
            .objects()
            .graphs()
            .mem
            .attribute(device, attr)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-parameter, a `cuuint64_t`.
        unsafe { ffi::put(value.cast::<u64>(), v) }
    })
}

/// Resets a high mark (to zero, the only value CUDA takes).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: CUdevice,
    attr: u32,
    value: *mut c_void,
) -> CUresult {
    entry(|| {
        let d = driver()?;
        d.gpu(device)?;
        // SAFETY: the caller's value, a `cuuint64_t`.
        let v = unsafe { ffi::get(value.cast::<u64>().cast_const()) }?;
        if v != 0 || !d.objects().graphs_mut().mem.reset_high(device, attr) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

/// Nothing to give back: an allocation node's memory is held only while
/// a graph, an executable or an allocation left by a launch needs it.
#[no_mangle]
pub extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    entry(|| driver()?.gpu(device).map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cu::Memcpy3dSide;

    #[test]
    fn node_params_have_cuda_h_layout() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(KernelNodeParams, shared_mem), 32);
        assert_eq!(offset_of!(KernelNodeParams, kernel_params), 40);
        assert_eq!(size_of::<KernelNodeParams>(), 56);
        assert_eq!(offset_of!(KernelNodeParamsV2, kern), 56);
        assert_eq!(size_of::<KernelNodeParamsV2>(), 72);
        assert_eq!(offset_of!(MemsetNodeParams, value), 16);
        assert_eq!(offset_of!(MemsetNodeParams, width), 24);
        assert_eq!(size_of::<MemsetNodeParams>(), 40);
        assert_eq!(offset_of!(Memcpy3dSide, memory_type), 32);
        assert_eq!(offset_of!(Memcpy3dSide, device), 48);
        assert_eq!(size_of::<Memcpy3dSide>(), 88);
        assert_eq!(offset_of!(Memcpy3d, dst), 88);
        assert_eq!(offset_of!(Memcpy3d, width_bytes), 176);
        assert_eq!(size_of::<Memcpy3d>(), 200);
    }

    #[test]
    fn mem_alloc_node_params_have_cuda_h_layout() {
        assert_eq!(std::mem::size_of::<MemAllocNodeParams>(), 120);
        assert_eq!(std::mem::offset_of!(MemAllocNodeParams, access), 88);
        assert_eq!(std::mem::offset_of!(MemAllocNodeParams, bytesize), 104);
        assert_eq!(std::mem::offset_of!(MemAllocNodeParams, dptr), 112);
    }

    #[test]
    fn instantiate_params_have_cuda_h_layout() {
        assert_eq!(std::mem::offset_of!(InstantiateParams, upload_stream), 8);
        assert_eq!(std::mem::offset_of!(InstantiateParams, err_node_out), 16);
        assert_eq!(std::mem::offset_of!(InstantiateParams, result_out), 24);
        assert_eq!(std::mem::size_of::<InstantiateParams>(), 32);
    }
}
