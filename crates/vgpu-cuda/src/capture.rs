//! Stream capture and graph editing, over the driver's objects: a
//! capture's streams, the graphs it fills, and the executables
//! instantiated from them (see [`crate::graphs`] for what a graph holds).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::cu::{self, CUdevice, CUresult, CuResult};
use crate::diag::log;
use crate::graphs::{
    node_handle, node_of, Capture, Given, Graph, GraphExec, Node, Owned, Unsafe, UpdateFailure,
    MAX_NODES, MODE_GLOBAL, MODE_RELAXED, NODE_GRAPH, NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET,
    NODE_REMOVED, STATUS_ACTIVE, STATUS_INVALIDATED, STATUS_NONE,
};
use crate::objects::Objects;
use crate::work::{HostCall, Work};

impl Objects {
    /// Starts capturing `stream` (on `device`) into a new graph; the
    /// graph's handle.
    pub fn begin_capture(&mut self, stream: usize, device: CUdevice, mode: u32) -> CuResult<usize> {
        if mode > MODE_RELAXED {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        // The legacy stream synchronises with every other: CUDA cannot
        // capture it. The per-thread one (2) can.
        if stream <= 1 {
            return Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if stream > 2 && !self.streams().streams.contains(stream) {
            return Err(cu::ERROR_INVALID_HANDLE);
        }
        if self.graphs().is_capturing(stream) {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        let id = self.graphs_mut().next_capture_id();
        let graph = Graph {
            device,
            nodes: Vec::new(),
            capture: Some(Capture {
                origin: stream,
                mode,
                id,
                invalidated: false,
                allocs: HashSet::new(),
                freed: Vec::new(),
            }),
            owned: Vec::new(),
            cloned_from: None,
        };
        let g = self.file(|o, h| o.graphs_mut().graphs.insert(h, graph));
        self.graphs_mut().join_capture(stream, g);
        Ok(g)
    }

    /// The capture `stream` is in, with its graph.
    fn capture_of(&self, stream: usize) -> Option<(usize, &Capture)> {
        let g = self.graphs().capturing(stream)?;
        Some((g, self.graphs().graphs.get(g).ok()?.capture.as_ref()?))
    }

    /// `stream`'s capture status, capture id and graph (0 when none).
    pub fn capture_info(&self, stream: usize) -> (u32, u64, usize) {
        match self.capture_of(stream) {
            None => (STATUS_NONE, 0, 0),
            Some((g, c)) if c.invalidated => (STATUS_INVALIDATED, c.id, g),
            Some((g, c)) => (STATUS_ACTIVE, c.id, g),
        }
    }

    /// Ends the capture `stream` began, for every stream in it; the graph.
    /// An invalidated capture's graph is destroyed.
    pub fn end_capture(&mut self, stream: usize) -> CuResult<usize> {
        let (g, c) = self.capture_of(stream).ok_or(cu::ERROR_ILLEGAL_STATE)?;
        if c.origin != stream {
            return Err(cu::ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        let invalidated = c.invalidated;
        self.graphs_mut().end_capture_of(g);
        if invalidated {
            self.remove_graph(g);
            return Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        if let Ok(graph) = self.graphs_mut().graphs.get_mut(g) {
            if let Some(c) = graph.capture.take() {
                if !c.freed.is_empty() {
                    graph.owned.push(Arc::new(c.freed));
                }
            }
        }
        Ok(g)
    }

    /// Removes graph `g`, its capture's memory and what it alone owned
    /// going to [`Graphs::take_to_free`](crate::graphs::Graphs::take_to_free).
    fn remove_graph(&mut self, g: usize) {
        if let Ok(graph) = self.graphs_mut().graphs.remove(g) {
            if let Some(c) = graph.capture {
                self.graphs_mut().free_later(c.freed);
            }
            self.release(graph.owned);
        }
    }

    /// Lets go of `owned`: memory no graph or executable holds any more
    /// goes to [`Graphs::take_to_free`](crate::graphs::Graphs::take_to_free).
    pub fn release(&mut self, owned: Owned) {
        for mem in owned {
            if let Some(addrs) = Arc::into_inner(mem) {
                self.graphs_mut().free_later(addrs);
            }
        }
    }

    /// A stream-ordered allocation made on `stream`: if it is capturing,
    /// its capture may free it again.
    pub fn captured_alloc(&mut self, stream: usize, addr: u64) {
        let Some(g) = self.graphs().capturing(stream) else {
            return;
        };
        if let Some(c) = self.graphs_mut().capture_mut(g) {
            c.allocs.insert(addr);
        }
    }

    /// `cuMemFreeAsync` on `stream`: true when its capture takes the
    /// free (memory allocated in the same capture, kept for the graph),
    /// false when the stream is not capturing. Other memory cannot be
    /// freed by a graph here: the capture is invalidated.
    pub fn captured_free(&mut self, stream: usize, addr: u64) -> CuResult<bool> {
        let Some(g) = self.graphs().capturing(stream) else {
            return Ok(false);
        };
        let Some(c) = self.graphs_mut().capture_mut(g) else {
            return Ok(false);
        };
        if c.invalidated {
            return Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        if c.allocs.remove(&addr) {
            c.freed.push(addr);
            return Ok(true);
        }
        c.invalidated = true;
        Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
    }

    /// Records `work` for `device` in `stream`'s capture; false if the
    /// stream is not capturing (the work is the caller's to queue).
    pub fn capture_work(
        &mut self,
        stream: usize,
        device: CUdevice,
        work: &[Work],
    ) -> CuResult<bool> {
        let Some(g) = self.graphs().capturing(stream) else {
            return Ok(false);
        };
        let graph = self
            .graphs_mut()
            .graphs
            .get_mut(g)
            .map_err(|_| cu::ERROR_ILLEGAL_STATE)?;
        let Some(c) = graph.capture.as_mut() else {
            return Ok(false);
        };
        if c.invalidated {
            return Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        if graph.device != device {
            // A graph replays on the one device it was captured on.
            log("work for another device in a capture");
            c.invalidated = true;
            return Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        for w in work {
            w.check()?;
        }
        if graph.nodes.len() + work.len() > MAX_NODES {
            c.invalidated = true;
            return Err(cu::ERROR_OUT_OF_MEMORY);
        }
        for w in work {
            let deps = graph.nodes.len().checked_sub(1).into_iter().collect();
            graph.nodes.push(Node::of(w, deps));
        }
        Ok(true)
    }

    /// Refuses a call a capture cannot record (see [`Unsafe`]), and
    /// invalidates the capture it would have broken: a stream's own, or,
    /// for a device, each global-mode capture on it unless the calling
    /// thread is relaxed (`thread_relaxed`).
    pub fn refuse_in_capture(&mut self, call: Unsafe, thread_relaxed: bool) -> CuResult {
        let mut refused = false;
        match call {
            Unsafe::Stream(s) => {
                if let Some(g) = self.graphs().capturing(s) {
                    if let Some(c) = self.graphs_mut().capture_mut(g) {
                        c.invalidated = true;
                        refused = true;
                    }
                }
            }
            Unsafe::Device(dev) if !thread_relaxed => {
                for graph in self.graphs_mut().graphs_of_mut(dev) {
                    if let Some(c) = graph.capture.as_mut().filter(|c| c.mode == MODE_GLOBAL) {
                        c.invalidated = true;
                        refused = true;
                    }
                }
            }
            Unsafe::Device(_) => {}
        }
        if refused {
            Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    /// `cuStreamWaitEvent`: a stream not capturing that waits on an event
    /// last recorded in a capture still in progress joins that capture.
    pub fn wait_event(&mut self, stream: usize, event: usize) -> CuResult {
        let captured = self.streams().events.get(event)?.captured;
        let Some(g) = captured else {
            return Ok(());
        };
        let active = self
            .graphs()
            .graphs
            .get(g)
            .ok()
            .is_some_and(|g| g.capture.is_some());
        if active && stream > 1 && !self.graphs().is_capturing(stream) {
            self.graphs_mut().join_capture(stream, g);
        }
        Ok(())
    }

    /// A stream is destroyed: it leaves its capture. A stream that
    /// joined the capture leaves what it recorded in the graph, as
    /// NVIDIA's driver lets a forked stream go once the origin waited on
    /// its work; the capture's origin takes the capture with it: without
    /// it no one can end it.
    pub fn forget_stream_capture(&mut self, stream: usize) {
        let Some(g) = self.graphs_mut().leave_capture(stream) else {
            return;
        };
        let Some(c) = self.graphs_mut().capture_mut(g) else {
            return;
        };
        if c.origin == stream {
            c.invalidated = true;
            self.graphs_mut().end_capture_of(g);
            self.remove_graph(g);
        }
    }

    /// Instantiates graph `g` with `flags`; the executable's handle.
    pub fn instantiate(&mut self, g: usize, flags: u64) -> CuResult<usize> {
        let graph = self.graphs().graphs.get(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        let (work, spans) = graph.ordered().ok_or_else(|| {
            log("graph dependencies loop");
            cu::ERROR_INVALID_VALUE
        })?;
        // A graph with memory nodes has one executable at a time.
        if graph.has_mem_nodes() && self.graphs().execs.iter().any(|(_, e)| e.graphs[0] == g) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let mem = graph.mem_nodes();
        let exec = GraphExec {
            mem,
            disabled: Default::default(),
            device: graph.device,
            nodes: work.into(),
            graphs: [g, g],
            spans,
            topology: graph.shape(),
            owned: graph.owned.clone(),
            flags,
        };
        Ok(self.file(|o, h| o.graphs_mut().execs.insert(h, exec)))
    }

    /// Gives executable `exec` the work of graph `g`, which must have the
    /// topology of the graph it was made from. `Err(Ok(failure))`: the
    /// update is refused; `Err(Err(e))`: the call itself is wrong.
    pub fn update_exec(
        &mut self,
        exec: usize,
        g: usize,
    ) -> Result<(), Result<UpdateFailure, CUresult>> {
        let graph = self.graphs().graphs.get(g).map_err(Err)?;
        let e = self.graphs().execs.get(exec).map_err(Err)?;
        if graph.capture.is_some() {
            return Err(Err(cu::ERROR_ILLEGAL_STATE));
        }
        if graph.device != e.device {
            return Err(Ok(UpdateFailure::Other));
        }
        e.topology
            .same_topology(graph)
            .map_err(|i| Ok(UpdateFailure::Topology(i.map(|i| node_handle(g, i)))))?;
        if graph.has_mem_nodes() || e.topology.has_mem_nodes() {
            // Memory nodes' allocations are fixed at instantiation.
            return Err(Ok(UpdateFailure::Other));
        }
        let (work, spans) = graph.ordered().ok_or(Ok(UpdateFailure::Other))?;
        let owned = graph.owned.clone();
        let e = self.graphs_mut().execs.get_mut(exec).map_err(Err)?;
        e.nodes = work.into();
        e.spans = spans;
        e.graphs[1] = g;
        let old = std::mem::replace(&mut e.owned, owned);
        self.release(old);
        Ok(())
    }

    /// Replaces the work of kernel node `node` (a handle of the graph
    /// `exec` was made from, or last updated from) in `exec` with
    /// `launch`, for the launches of `exec` from now on.
    pub fn set_exec_kernel(
        &mut self,
        exec: usize,
        node: usize,
        device: CUdevice,
        launch: Work,
    ) -> CuResult {
        self.set_exec_node(exec, node, NODE_KERNEL, device, launch)
    }

    /// Keeps the parameters node `node` was made with (see
    /// [`Node::given`]).
    pub fn keep_given(&mut self, node: usize, given: Given) -> CuResult {
        let (g, i) = self.node(node)?;
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        graph.nodes[i].given = Some(given);
        Ok(())
    }

    /// The parameters memset or memcpy node `node` (of type `kind`) was
    /// last given.
    pub fn given_of(&self, node: usize, kind: u32) -> CuResult<Given> {
        let (g, i) = self.node(node)?;
        let n = &self.graphs().graphs.at(g).nodes[i];
        match (n.given, n.kind == kind) {
            (Some(given), true) => Ok(given),
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    }

    /// Replaces the work of node `node` (of type `kind`) of a graph with
    /// `work`, made from `given`.
    pub fn set_node_given(
        &mut self,
        node: usize,
        kind: u32,
        device: CUdevice,
        work: Vec<Work>,
        given: Given,
    ) -> CuResult {
        for w in &work {
            w.check()?;
        }
        let (g, i) = self.node(node)?;
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        let n = &mut graph.nodes[i];
        if n.kind != kind || device != graph.device || n.given.is_none() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        n.work = work;
        n.given = Some(given);
        Ok(())
    }

    /// Replaces the work of node `node` (of type `kind`) in `exec` with
    /// `work`, however many pieces either has; the graph keeps its own.
    pub fn set_exec_works(
        &mut self,
        exec: usize,
        node: usize,
        kind: u32,
        device: CUdevice,
        work: Vec<Work>,
    ) -> CuResult {
        for w in &work {
            w.check()?;
        }
        let (g, i) = node_of(node).ok_or(cu::ERROR_INVALID_HANDLE)?;
        let e = self.graphs_mut().execs.get_mut(exec)?;
        if !e.graphs.contains(&g) || device != e.device {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let span = e.spans.get(i).cloned().ok_or(cu::ERROR_INVALID_HANDLE)?;
        if e.topology.nodes.get(i).is_none_or(|n| n.kind != kind) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let (old, new) = (span.len(), work.len());
        let mut nodes = Vec::with_capacity(e.nodes.len() - old + new);
        nodes.extend_from_slice(&e.nodes[..span.start]);
        nodes.extend(work);
        nodes.extend_from_slice(&e.nodes[span.end..]);
        e.nodes = nodes.into();
        // The nodes placed after it move by the difference.
        for s in &mut e.spans {
            if s.start >= span.end && !(s.start == span.start && s.end == span.end) {
                *s = s.start + new - old..s.end + new - old;
            }
        }
        e.spans[i] = span.start..span.start + new;
        Ok(())
    }

    /// Replaces the one piece of work of node `node` (of type `kind`) in
    /// `exec`, as [`Self::set_exec_kernel`] does a kernel's.
    pub fn set_exec_node(
        &mut self,
        exec: usize,
        node: usize,
        kind: u32,
        device: CUdevice,
        work: Work,
    ) -> CuResult {
        let (g, i) = node_of(node).ok_or(cu::ERROR_INVALID_HANDLE)?;
        let e = self.graphs_mut().execs.get_mut(exec)?;
        if !e.graphs.contains(&g) || device != e.device {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let span = e.spans.get(i).cloned().ok_or(cu::ERROR_INVALID_HANDLE)?;
        let same_kind = e.topology.nodes.get(i).is_some_and(|n| n.kind == kind);
        if !same_kind || span.len() != 1 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let mut nodes = e.nodes.to_vec();
        nodes[span.start] = work;
        e.nodes = nodes.into();
        Ok(())
    }

    /// Enables or disables node `node` (a handle of the graph `exec` was
    /// made or last updated from) in `exec`: kernel, memcpy and memset
    /// nodes only, as CUDA has it.
    pub fn set_enabled(&mut self, exec: usize, node: usize, enabled: bool) -> CuResult {
        let e = self.graphs_mut().execs.get_mut(exec)?;
        let i = switchable(e, node)?;
        if enabled {
            e.disabled.remove(&i);
        } else {
            e.disabled.insert(i);
        }
        Ok(())
    }

    /// Whether node `node` is enabled in `exec` (see [`Self::set_enabled`]).
    pub fn enabled(&self, exec: usize, node: usize) -> CuResult<bool> {
        let e = self.graphs().execs.get(exec)?;
        let i = switchable(e, node)?;
        Ok(!e.disabled.contains(&i))
    }

    /// Replaces the work of kernel node `node` (a graph's) with `launch`.
    pub fn set_kernel(&mut self, node: usize, device: CUdevice, launch: Work) -> CuResult {
        self.set_node(node, NODE_KERNEL, device, launch)
    }

    /// Replaces the work of node `node` (of type `kind`) of a graph with
    /// `work`.
    pub fn set_node(&mut self, node: usize, kind: u32, device: CUdevice, work: Work) -> CuResult {
        let (g, i) = self.node(node)?;
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        let n = &mut graph.nodes[i];
        if n.kind != kind || device != graph.device {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        n.work = vec![work];
        n.param_ptrs = None;
        Ok(())
    }

    /// The event of event record or wait node `node` (`kind`).
    pub fn event_of(&self, node: usize, kind: u32) -> CuResult<usize> {
        let (g, i) = self.node(node)?;
        let n = &self.graphs().graphs.at(g).nodes[i];
        match (n.kind == kind, n.work.as_slice()) {
            (true, [Work::Record(e) | Work::Wait(e)]) => Ok(*e),
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    }

    /// The host function of host node `node`.
    pub fn host_of(&self, node: usize) -> CuResult<HostCall> {
        let (g, i) = self.node(node)?;
        match self.graphs().graphs.at(g).nodes[i].work.as_slice() {
            [Work::Host(h)] => Ok(*h),
            _ => Err(cu::ERROR_INVALID_VALUE),
        }
    }

    /// The launch of kernel node `node`, and the addresses of its
    /// parameters in it (kept with the node, as CUDA keeps them, until
    /// the node changes or goes).
    pub fn kernel_of(&mut self, node: usize) -> CuResult<(Work, *mut *mut std::ffi::c_void)> {
        let (g, i) = self.node(node)?;
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        let n = &mut graph.nodes[i];
        let launch = match (n.kind, n.work.as_slice()) {
            (NODE_KERNEL, [w @ Work::Launch { .. }]) => w.clone(),
            _ => return Err(cu::ERROR_INVALID_VALUE),
        };
        let Work::Launch {
            function, params, ..
        } = &launch
        else {
            unreachable!("matched above")
        };
        let (_, ptrs) = n.param_ptrs.get_or_insert_with(|| {
            let copy: Box<[u8]> = params.as_ref().into();
            let base = copy.as_ptr() as usize;
            let ptrs = function
                .params
                .iter()
                .map(|p| base + p.offset as usize)
                .collect();
            (copy, ptrs)
        });
        Ok((launch, ptrs.as_mut_ptr().cast()))
    }

    /// The graph `node` belongs to and its index there, checked.
    pub fn node(&self, node: usize) -> CuResult<(usize, usize)> {
        let (g, i) = node_of(node).ok_or(cu::ERROR_INVALID_HANDLE)?;
        let graph = self.graphs().graphs.get(g)?;
        if graph.nodes.get(i).is_some_and(|n| n.kind != NODE_REMOVED) {
            Ok((g, i))
        } else {
            Err(cu::ERROR_INVALID_HANDLE)
        }
    }

    /// Adds a node of `kind` doing `work` to graph `g`, after the nodes
    /// `deps` (handles, of `g`); its handle.
    pub fn add_node(
        &mut self,
        g: usize,
        deps: &[usize],
        kind: u32,
        work: Vec<Work>,
    ) -> CuResult<usize> {
        let mut indices = Vec::with_capacity(deps.len());
        for &d in deps {
            let (dg, i) = self.node(d)?;
            if dg != g {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            // CUDA refuses a dependency named twice.
            if indices.contains(&i) {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            indices.push(i);
        }
        for w in &work {
            w.check()?;
        }
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        if graph.nodes.len() >= MAX_NODES {
            return Err(cu::ERROR_OUT_OF_MEMORY);
        }
        graph.nodes.push(Node {
            kind,
            work,
            deps: indices,
            param_ptrs: None,
            given: None,
            attrs: HashMap::new(),
            child: None,
        });
        Ok(node_handle(g, graph.nodes.len() - 1))
    }

    /// A copy of graph `g` (not one being captured), under a new handle.
    pub fn clone_graph(&mut self, g: usize) -> CuResult<usize> {
        let graph = self.graphs().graphs.get(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        if graph.has_mem_nodes() {
            // CUDA clones no graph with memory nodes.
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let copy = Graph {
            device: graph.device,
            nodes: graph.nodes.clone(),
            capture: None,
            owned: graph.owned.clone(),
            cloned_from: Some(g),
        };
        Ok(self.file(|o, h| o.graphs_mut().graphs.insert(h, copy)))
    }

    /// Makes graph `parent` hold the memory graph `child` owns, whose
    /// work a child graph node of `parent` copied.
    pub fn adopt_owned(&mut self, parent: usize, child: usize) -> CuResult {
        let owned = self.graphs().graphs.get(child)?.owned.clone();
        let p = self.graphs_mut().graphs.get_mut(parent)?;
        p.owned.extend(owned);
        Ok(())
    }

    /// Records the topology of graph `child` with child graph node
    /// `node`, which an executable's replacement of it must keep.
    pub fn keep_child_topology(&mut self, node: usize, child: usize) -> CuResult {
        let topology = self.graphs().graphs.get(child)?.topology();
        let (g, i) = self.node(node)?;
        self.graphs_mut().graphs.get_mut(g)?.nodes[i].child = Some(topology);
        Ok(())
    }

    /// Gives child graph node `node` of executable `exec` the work of
    /// graph `child`, which must have the topology of the node's own
    /// graph (`cuGraphExecChildGraphNodeSetParams`).
    pub fn set_exec_child(&mut self, exec: usize, node: usize, child: usize) -> CuResult {
        let (g, i) = node_of(node).ok_or(cu::ERROR_INVALID_HANDLE)?;
        let (device, work) = self.graph_work(child)?;
        let topology = self.graphs().graphs.get(child)?.topology();
        let e = self.graphs().execs.get(exec)?;
        let n = e.topology.nodes.get(i).ok_or(cu::ERROR_INVALID_HANDLE)?;
        if !e.graphs.contains(&g) || n.kind != NODE_GRAPH || n.child.as_ref() != Some(&topology) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        self.set_exec_works(exec, node, NODE_GRAPH, device, work)?;
        // The child's work may use memory the child owns.
        let owned = self.graphs().graphs.get(child)?.owned.clone();
        self.graphs_mut().execs.get_mut(exec)?.owned.extend(owned);
        Ok(())
    }

    /// The work of graph `g` (not one being captured) in the order it
    /// replays: what a child graph node of it holds.
    pub fn graph_work(&self, g: usize) -> CuResult<(CUdevice, Vec<Work>)> {
        let graph = self.graphs().graphs.get(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        if graph.has_mem_nodes() {
            // CUDA nests no graph with memory nodes.
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let work = graph.ordered_work().ok_or(cu::ERROR_INVALID_VALUE)?;
        Ok((graph.device, work))
    }

    /// The nodes `node` depends on (`dependents`: the nodes that depend
    /// on it), as handles, in the order they were added.
    pub fn node_edges(&self, node: usize, dependents: bool) -> CuResult<Vec<usize>> {
        let (g, i) = self.node(node)?;
        let nodes = &self.graphs().graphs.at(g).nodes;
        let found: Vec<usize> = if dependents {
            (0..nodes.len())
                .filter(|&j| nodes[j].deps.contains(&i))
                .collect()
        } else {
            let mut deps = nodes[i].deps.clone();
            deps.sort_unstable();
            deps
        };
        Ok(found.into_iter().map(|j| node_handle(g, j)).collect())
    }

    /// Makes each of `to` depend on the node of `from` beside it (handles
    /// of graph `g`); an edge already there, or from a node to itself, is
    /// refused, as CUDA does.
    pub fn add_dependencies(&mut self, g: usize, from: &[usize], to: &[usize]) -> CuResult {
        let (graph, edges) = self.edges(g, from, to, false)?;
        for (fi, ti) in edges {
            graph.nodes[ti].deps.push(fi);
        }
        Ok(())
    }

    /// Graph `g` (not being captured) and the edges from each node of
    /// `from` to the one of `to` beside it, as node indices: each named
    /// once, within `g`, and there already (`present`) or not yet.
    fn edges(
        &mut self,
        g: usize,
        from: &[usize],
        to: &[usize],
        present: bool,
    ) -> CuResult<(&mut Graph, Vec<(usize, usize)>)> {
        let mut edges = Vec::with_capacity(from.len());
        for (&f, &t) in from.iter().zip(to) {
            let (fg, fi) = self.node(f)?;
            let (tg, ti) = self.node(t)?;
            if fg != g || tg != g || fi == ti {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            edges.push((fi, ti));
        }
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        let mut seen = std::collections::HashSet::with_capacity(edges.len());
        for &(fi, ti) in &edges {
            if graph.nodes[ti].deps.contains(&fi) != present || !seen.insert((fi, ti)) {
                return Err(cu::ERROR_INVALID_VALUE);
            }
        }
        Ok((graph, edges))
    }

    /// Removes the edges from each of `from` to the node of `to` beside
    /// it; all or none: an edge that is not there refuses them all.
    pub fn remove_dependencies(&mut self, g: usize, from: &[usize], to: &[usize]) -> CuResult {
        let (graph, edges) = self.edges(g, from, to, true)?;
        if graph.has_mem_nodes() {
            // CUDA deletes no edge of a graph with memory nodes.
            return Err(cu::ERROR_INVALID_VALUE);
        }
        for (fi, ti) in edges {
            graph.nodes[ti].deps.retain(|&d| d != fi);
        }
        Ok(())
    }

    /// Removes node `node` and its edges from its graph (not one being
    /// captured, nor one with memory nodes, whose nodes CUDA keeps).
    pub fn destroy_node(&mut self, node: usize) -> CuResult {
        let (g, i) = self.node(node)?;
        let graph = self.graphs_mut().graphs.get_mut(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        if graph.has_mem_nodes() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        graph.nodes[i] = Node {
            kind: NODE_REMOVED,
            work: Vec::new(),
            deps: Vec::new(),
            param_ptrs: None,
            given: None,
            attrs: HashMap::new(),
            child: None,
        };
        for n in &mut graph.nodes {
            n.deps.retain(|&d| d != i);
        }
        Ok(())
    }

    /// Destroys graph `g`, unless a capture is filling it.
    pub fn destroy_graph(&mut self, g: usize) -> CuResult {
        let graph = self.graphs().graphs.get(g)?;
        if graph.capture.is_some() {
            return Err(cu::ERROR_ILLEGAL_STATE);
        }
        self.remove_graph(g);
        Ok(())
    }

    /// Destroys executable `e`.
    pub fn destroy_exec(&mut self, e: usize) -> CuResult {
        let exec = self.graphs_mut().execs.remove(e)?;
        self.release(exec.owned);
        Ok(())
    }
}

/// The index in `e` of node `node`: a handle of a graph `e` was made or
/// last updated from, of a kind CUDA lets be disabled (kernel, memcpy,
/// memset).
fn switchable(e: &GraphExec, node: usize) -> CuResult<usize> {
    let (g, i) = node_of(node).ok_or(cu::ERROR_INVALID_HANDLE)?;
    if !e.graphs.contains(&g) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let kind = e
        .topology
        .nodes
        .get(i)
        .ok_or(cu::ERROR_INVALID_HANDLE)?
        .kind;
    if !matches!(kind, NODE_KERNEL | NODE_MEMCPY | NODE_MEMSET) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graphs::*;
    use crate::inflight::FLUSH_AT;
    use crate::stream_table::{Event, Stream};
    use crate::work::*;

    fn fill(n: u64) -> Work {
        Work::Fill {
            addr: 0x1000 * n,
            len: 4,
            pattern: n as u32,
        }
    }

    fn objects_with_streams(n: usize) -> (Objects, Vec<usize>) {
        let mut o = Objects::default();
        let streams = (0..n)
            .map(|_| {
                o.file(|o, h| {
                    let stream = Stream {
                        ctx: 1,
                        lane: 0,
                        flags: 1,
                        priority: 0,
                        attrs: Default::default(),
                    };
                    o.streams_mut().streams.insert(h, stream);
                })
            })
            .collect();
        (o, streams)
    }

    fn event(o: &mut Objects) -> usize {
        let event = Event {
            flags: 0,
            records: 0,
            device: 0,
            lane: 0,
            captured: None,
        };
        o.file(|o, h| o.streams_mut().events.insert(h, event))
    }

    #[test]
    fn work_goes_in_batches_of_at_most_flush_at_commands_in_order() {
        let work: Vec<Work> = (0..FLUSH_AT as u64 * 2 + 5).map(fill).collect();
        let mut sizes = Vec::new();
        in_batches(&work, |b| {
            sizes.push(b.len());
            Ok(())
        })
        .unwrap();
        assert_eq!(sizes, [FLUSH_AT, FLUSH_AT, 5]);
        // A memset's tail write counts as one command like the rest.
        let tail = Work::Write {
            addr: 0x10,
            bytes: Arc::from(&[1u8, 2][..]),
        };
        let mut work: Vec<Work> = (0..FLUSH_AT as u64 - 1).map(fill).collect();
        work.push(tail);
        work.push(fill(99));
        let mut sizes = Vec::new();
        in_batches(&work, |b| {
            sizes.push(b.len());
            Ok(())
        })
        .unwrap();
        assert_eq!(sizes, [FLUSH_AT, 1]);
        let mut calls = 0;
        in_batches(&[], |_| {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 0);
    }

    #[test]
    fn a_failed_submission_stops_the_rest() {
        let work: Vec<Work> = (0..FLUSH_AT as u64 * 3).map(fill).collect();
        let mut calls = 0;
        let r = in_batches(&work, |_| {
            calls += 1;
            Err(cu::ERROR_LAUNCH_FAILED)
        });
        assert_eq!(r, Err(cu::ERROR_LAUNCH_FAILED));
        assert_eq!(calls, 1);
    }

    #[test]
    fn capture_records_work_until_its_origin_ends_it() {
        let (mut o, s) = objects_with_streams(2);
        assert_eq!(o.capture_info(s[0]), (STATUS_NONE, 0, 0));
        assert_eq!(o.capture_work(s[0], 0, &[fill(1)]), Ok(false));
        let g = o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        let (status, id, graph) = o.capture_info(s[0]);
        assert_eq!((status, graph), (STATUS_ACTIVE, g));
        assert_ne!(id, 0);
        assert_eq!(
            o.begin_capture(s[0], 0, MODE_GLOBAL),
            Err(cu::ERROR_ILLEGAL_STATE)
        );
        assert_eq!(o.capture_work(s[0], 0, &[fill(1), fill(2)]), Ok(true));
        // Another stream's work is not captured.
        assert_eq!(o.capture_work(s[1], 0, &[fill(3)]), Ok(false));
        // A graph being captured is neither instantiated nor destroyed.
        assert_eq!(o.instantiate(g, 0), Err(cu::ERROR_ILLEGAL_STATE));
        assert_eq!(o.destroy_graph(g), Err(cu::ERROR_ILLEGAL_STATE));
        assert_eq!(o.end_capture(s[1]), Err(cu::ERROR_ILLEGAL_STATE));
        assert_eq!(o.end_capture(s[0]), Ok(g));
        assert_eq!(o.capture_info(s[0]), (STATUS_NONE, 0, 0));
        assert_eq!(o.graphs().graphs.at(g).nodes.len(), 2);
        let e = o.instantiate(g, 0).unwrap();
        assert_eq!(o.graphs().execs.at(e).nodes.len(), 2);
        o.destroy_graph(g).unwrap();
        assert_eq!(o.graphs().execs.at(e).nodes.len(), 2);
        // The next capture has another id.
        o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        assert_ne!(o.capture_info(s[0]).1, id);
    }

    /// The fills' patterns in the order a graph's work replays.
    fn order(o: &Objects, g: usize) -> Option<Vec<u32>> {
        let work = o.graphs().graphs.at(g).ordered_work()?;
        Some(
            work.iter()
                .map(|w| match w {
                    Work::Fill { pattern, .. } => *pattern,
                    _ => u32::MAX,
                })
                .collect(),
        )
    }

    #[test]
    fn nodes_replay_in_an_order_that_honours_their_dependencies() {
        let mut o = Objects::default();
        let g = empty_graph(&mut o);
        let add = |o: &mut Objects, deps: &[usize], n: u64| {
            o.add_node(g, deps, NODE_MEMSET, vec![fill(n)]).unwrap()
        };
        let a = add(&mut o, &[], 1);
        let b = add(&mut o, &[a], 2);
        let c = add(&mut o, &[b], 3);
        let d = add(&mut o, &[], 4);
        assert_eq!(o.node(c), Ok((g, 2)));
        // Added first, placed first, where the dependencies allow.
        assert_eq!(order(&o, g), Some(vec![1, 2, 3, 4]));
        // An edge added later moves a node after the one it waits for.
        o.add_dependencies(g, &[d], &[b]).unwrap();
        assert_eq!(order(&o, g), Some(vec![1, 4, 2, 3]));
        // The same edge twice, an edge to itself, a node of nothing.
        assert_eq!(
            o.add_dependencies(g, &[d], &[b]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            o.add_dependencies(g, &[a], &[a]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(o.node(node_handle(g, 9)), Err(cu::ERROR_INVALID_HANDLE));
        assert_eq!(o.node(0), Err(cu::ERROR_INVALID_HANDLE));
        assert_eq!(
            o.add_node(g, &[a, a], NODE_EMPTY, Vec::new()),
            Err(cu::ERROR_INVALID_VALUE)
        );
        // A loop cannot be ordered: instantiating refuses it.
        o.add_dependencies(g, &[c], &[a]).unwrap();
        assert_eq!(order(&o, g), None);
        assert_eq!(o.instantiate(g, 0), Err(cu::ERROR_INVALID_VALUE));
        // Until the edge goes again; an edge that is not there refuses
        // the whole call.
        assert_eq!(
            o.remove_dependencies(g, &[c, b], &[a, a]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(order(&o, g), None);
        o.remove_dependencies(g, &[c], &[a]).unwrap();
        assert_eq!(order(&o, g), Some(vec![1, 4, 2, 3]));
        o.remove_dependencies(g, &[d], &[b]).unwrap();
        assert_eq!(order(&o, g), Some(vec![1, 2, 3, 4]));
    }

    #[test]
    fn an_executables_node_takes_more_or_less_work_and_the_rest_moves() {
        let mut o = Objects::default();
        let g = empty_graph(&mut o);
        let a = o
            .add_node(g, &[], NODE_MEMSET, vec![fill(1), fill(2)])
            .unwrap();
        let b = o.add_node(g, &[a], NODE_MEMCPY, vec![fill(3)]).unwrap();
        let _empty = o.add_node(g, &[b], NODE_EMPTY, Vec::new()).unwrap();
        let c = o.add_node(g, &[b], NODE_MEMSET, vec![fill(4)]).unwrap();
        let e = o.instantiate(g, 0).unwrap();
        assert_eq!(patterns(&o, e), [1, 2, 3, 4]);
        o.set_exec_works(e, a, NODE_MEMSET, 0, vec![fill(5), fill(6), fill(7)])
            .unwrap();
        assert_eq!(patterns(&o, e), [5, 6, 7, 3, 4]);
        o.set_exec_works(e, c, NODE_MEMSET, 0, vec![fill(8), fill(9)])
            .unwrap();
        o.set_exec_works(e, a, NODE_MEMSET, 0, vec![fill(10)])
            .unwrap();
        assert_eq!(patterns(&o, e), [10, 3, 8, 9]);
        o.set_exec_works(e, b, NODE_MEMCPY, 0, vec![fill(11), fill(12)])
            .unwrap();
        assert_eq!(patterns(&o, e), [10, 11, 12, 8, 9]);
        // The graph's nodes keep their work; a node of another type, or
        // of another device, is refused.
        assert_eq!(order(&o, g), Some(vec![1, 2, 3, 4]));
        assert_eq!(
            o.set_exec_works(e, b, NODE_MEMSET, 0, vec![fill(1)]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            o.set_exec_works(e, a, NODE_MEMSET, 1, vec![fill(1)]),
            Err(cu::ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn legacy_and_unknown_streams_are_not_captured() {
        let (mut o, _) = objects_with_streams(0);
        for s in [0, 1] {
            assert_eq!(
                o.begin_capture(s, 0, MODE_GLOBAL),
                Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
            );
        }
        assert_eq!(
            o.begin_capture(0x1234_5678, 0, MODE_GLOBAL),
            Err(cu::ERROR_INVALID_HANDLE)
        );
        assert_eq!(o.begin_capture(2, 0, 3), Err(cu::ERROR_INVALID_VALUE));
        assert!(o.begin_capture(2, 0, MODE_RELAXED).is_ok());
    }

    #[test]
    fn a_stream_joins_through_an_event_recorded_in_the_capture() {
        let (mut o, s) = objects_with_streams(3);
        let g = o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        let e = event(&mut o);
        // Recorded outside the capture: waiting joins nothing.
        o.wait_event(s[1], e).unwrap();
        assert_eq!(o.capture_info(s[1]).0, STATUS_NONE);
        o.streams_mut().events.get_mut(e).unwrap().captured = Some(g);
        o.wait_event(s[1], e).unwrap();
        assert_eq!(o.capture_info(s[1]), o.capture_info(s[0]));
        assert_eq!(o.capture_work(s[1], 0, &[fill(1)]), Ok(true));
        // Only the origin ends it, and then for every stream in it.
        assert_eq!(o.end_capture(s[1]), Err(cu::ERROR_STREAM_CAPTURE_UNMATCHED));
        assert_eq!(o.end_capture(s[0]), Ok(g));
        assert_eq!(o.capture_info(s[1]).0, STATUS_NONE);
        // The event's capture is over: waiting on it joins nothing.
        o.wait_event(s[2], e).unwrap();
        assert_eq!(o.capture_info(s[2]).0, STATUS_NONE);
        assert_eq!(o.wait_event(s[2], 0x999), Err(cu::ERROR_INVALID_HANDLE));
    }

    #[test]
    fn an_unrecordable_call_invalidates_the_capture() {
        let (mut o, s) = objects_with_streams(2);
        o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        assert_eq!(o.refuse_in_capture(Unsafe::Stream(s[1]), false), Ok(()));
        assert_eq!(
            o.refuse_in_capture(Unsafe::Stream(s[0]), false),
            Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        assert_eq!(o.capture_info(s[0]).0, STATUS_INVALIDATED);
        assert_eq!(
            o.capture_work(s[0], 0, &[fill(1)]),
            Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED)
        );
        let before = o.graphs().graph_count();
        assert_eq!(
            o.end_capture(s[0]),
            Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED)
        );
        assert_eq!(o.graphs().graph_count(), before - 1);
        assert_eq!(o.capture_info(s[0]).0, STATUS_NONE);
    }

    #[test]
    fn a_context_synchronisation_breaks_only_global_captures_of_its_device() {
        let (mut o, s) = objects_with_streams(3);
        o.begin_capture(s[0], 0, MODE_RELAXED).unwrap();
        o.begin_capture(s[1], 1, MODE_GLOBAL).unwrap();
        assert_eq!(o.refuse_in_capture(Unsafe::Device(0), false), Ok(()));
        // A relaxed thread may synchronise.
        assert_eq!(o.refuse_in_capture(Unsafe::Device(1), true), Ok(()));
        assert_eq!(o.capture_info(s[1]).0, STATUS_ACTIVE);
        o.begin_capture(s[2], 0, MODE_GLOBAL).unwrap();
        assert_eq!(
            o.refuse_in_capture(Unsafe::Device(0), false),
            Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        assert_eq!(o.capture_info(s[0]).0, STATUS_ACTIVE);
        assert_eq!(o.capture_info(s[1]).0, STATUS_ACTIVE);
        assert_eq!(o.capture_info(s[2]).0, STATUS_INVALIDATED);
    }

    #[test]
    fn work_for_another_device_invalidates_the_capture() {
        let (mut o, s) = objects_with_streams(1);
        o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        assert_eq!(
            o.capture_work(s[0], 1, &[fill(1)]),
            Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        assert_eq!(o.capture_info(s[0]).0, STATUS_INVALIDATED);
    }

    #[test]
    fn destroying_a_capturing_stream_ends_its_capture() {
        let (mut o, s) = objects_with_streams(2);
        let g = o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        let e = event(&mut o);
        o.streams_mut().events.get_mut(e).unwrap().captured = Some(g);
        o.wait_event(s[1], e).unwrap();
        // A joined stream leaves the capture, which goes on (what it
        // recorded stays in the graph).
        o.forget_stream_capture(s[1]);
        assert_eq!(o.capture_info(s[1]).0, STATUS_NONE);
        assert_eq!(o.capture_info(s[0]).0, STATUS_ACTIVE);
        // The origin takes the capture and its graph with it.
        o.forget_stream_capture(s[0]);
        assert!(!o.graphs().any_capturing());
        assert!(o.graphs().graphs.get(g).is_err());
    }

    /// A new graph of device 0, with no nodes.
    fn empty_graph(o: &mut Objects) -> usize {
        let graph = Graph {
            device: 0,
            nodes: Vec::new(),
            capture: None,
            owned: Vec::new(),
            cloned_from: None,
        };
        o.file(|o, h| o.graphs_mut().graphs.insert(h, graph))
    }

    /// A graph of memset nodes in a chain, one per value.
    fn chain(o: &mut Objects, values: &[u64]) -> (usize, Vec<usize>) {
        let g = empty_graph(o);
        let mut nodes: Vec<usize> = Vec::new();
        for &v in values {
            let deps: Vec<usize> = nodes.last().copied().into_iter().collect();
            nodes.push(o.add_node(g, &deps, NODE_MEMSET, vec![fill(v)]).unwrap());
        }
        (g, nodes)
    }

    fn patterns(o: &Objects, e: usize) -> Vec<u32> {
        o.graphs()
            .execs
            .at(e)
            .nodes
            .iter()
            .map(|w| match w {
                Work::Fill { pattern, .. } => *pattern,
                _ => panic!("not a fill"),
            })
            .collect()
    }

    #[test]
    fn an_executable_takes_the_work_of_a_graph_of_its_topology_only() {
        let mut o = Objects::default();
        let (g1, _) = chain(&mut o, &[1, 2, 3]);
        let e = o.instantiate(g1, 0).unwrap();
        let (g2, _) = chain(&mut o, &[4, 5, 6]);
        assert_eq!(o.update_exec(e, g2), Ok(()));
        assert_eq!(patterns(&o, e), [4, 5, 6]);
        // Fewer nodes: refused, with no node to blame; the work stays.
        let (g3, _) = chain(&mut o, &[7, 8]);
        assert_eq!(o.update_exec(e, g3), Err(Ok(UpdateFailure::Topology(None))));
        assert_eq!(patterns(&o, e), [4, 5, 6]);
        // As many nodes, one dependency elsewhere: refused at that node.
        let (g4, n4) = chain(&mut o, &[9]);
        let a = o.add_node(g4, &[], NODE_MEMSET, vec![fill(10)]).unwrap();
        o.add_node(g4, &[n4[0]], NODE_MEMSET, vec![fill(11)])
            .unwrap();
        assert_eq!(
            o.update_exec(e, g4),
            Err(Ok(UpdateFailure::Topology(Some(a))))
        );
        // Not an executable, not a graph.
        assert_eq!(o.update_exec(e, 9999), Err(Err(cu::ERROR_INVALID_HANDLE)));
        assert_eq!(o.update_exec(9999, g2), Err(Err(cu::ERROR_INVALID_HANDLE)));
    }

    #[test]
    fn kernel_parameters_are_only_set_on_kernel_nodes() {
        let mut o = Objects::default();
        let (g, nodes) = chain(&mut o, &[1, 2]);
        let e = o.instantiate(g, 0).unwrap();
        assert_eq!(
            o.set_kernel(nodes[0], 0, fill(5)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            o.set_exec_kernel(e, nodes[1], 0, fill(5)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert!(o.kernel_of(nodes[0]).is_err());
        // A node of a graph the executable was not made from.
        let (other, on) = chain(&mut o, &[3]);
        assert_ne!(other, g);
        assert_eq!(
            o.set_exec_kernel(e, on[0], 0, fill(5)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(patterns(&o, e), [1, 2]);
    }

    #[test]
    fn a_graph_with_memory_nodes_is_instantiated_once_and_never_copied() {
        let mut o = Objects::default();
        let g = empty_graph(&mut o);
        let a = o.add_node(g, &[], NODE_MEM_ALLOC, Vec::new()).unwrap();
        o.keep_given(a, Given::MemAlloc(0x1000, 64)).unwrap();
        let f = o.add_node(g, &[a], NODE_MEM_FREE, Vec::new()).unwrap();
        o.keep_given(f, Given::MemFree(0x1000)).unwrap();
        let e = o.instantiate(g, 0).unwrap();
        assert_eq!(o.graphs().execs.at(e).mem, (vec![0x1000], vec![0x1000]));
        assert_eq!(o.instantiate(g, 0), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(o.clone_graph(g), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(o.graph_work(g).map(drop), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(
            o.remove_dependencies(g, &[a], &[f]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        o.destroy_exec(e).unwrap();
        assert!(o.instantiate(g, 0).is_ok(), "once the first is gone");
        // A graph without them is instantiated as often as asked.
        let (plain, _) = chain(&mut o, &[1]);
        assert!(o.instantiate(plain, 0).is_ok());
        assert!(o.instantiate(plain, 0).is_ok());
    }

    #[test]
    fn a_disabled_node_is_left_out_of_launches_until_enabled() {
        let mut o = Objects::default();
        let (g, nodes) = chain(&mut o, &[1, 2, 3]);
        let empty = o.add_node(g, &[nodes[2]], NODE_EMPTY, Vec::new()).unwrap();
        let e = o.instantiate(g, 0).unwrap();
        let work = |o: &Objects| -> Vec<u32> {
            o.graphs()
                .execs
                .at(e)
                .launch_work()
                .iter()
                .map(|w| match w {
                    Work::Fill { pattern, .. } => *pattern,
                    _ => 0,
                })
                .collect()
        };
        o.set_enabled(e, nodes[1], false).unwrap();
        assert_eq!(o.enabled(e, nodes[1]), Ok(false));
        assert_eq!(o.enabled(e, nodes[0]), Ok(true));
        assert_eq!(work(&o), [1, 3]);
        // Changing a disabled node's work keeps it disabled.
        o.set_exec_works(e, nodes[1], NODE_MEMSET, 0, vec![fill(7)])
            .unwrap();
        assert_eq!(work(&o), [1, 3]);
        o.set_enabled(e, nodes[1], true).unwrap();
        assert_eq!(work(&o), [1, 7, 3]);
        // Only kernel, memcpy and memset nodes.
        assert_eq!(o.set_enabled(e, empty, false), Err(cu::ERROR_INVALID_VALUE));
        let (other, on) = chain(&mut o, &[4]);
        assert_ne!(other, g);
        assert_eq!(o.set_enabled(e, on[0], false), Err(cu::ERROR_INVALID_VALUE));
    }

    #[test]
    fn a_removed_node_takes_its_edges_and_work_with_it() {
        let mut o = Objects::default();
        let (g, nodes) = chain(&mut o, &[1, 2, 3]);
        o.destroy_node(nodes[1]).unwrap();
        assert_eq!(o.node(nodes[1]), Err(cu::ERROR_INVALID_HANDLE));
        assert_eq!(o.destroy_node(nodes[1]), Err(cu::ERROR_INVALID_HANDLE));
        // The last node depended on the removed one only: now on none.
        assert_eq!(o.node_edges(nodes[2], false), Ok(Vec::new()));
        assert_eq!(o.node_edges(nodes[0], true), Ok(Vec::new()));
        let e = o.instantiate(g, 0).unwrap();
        let patterns: Vec<u32> = o
            .graphs()
            .execs
            .at(e)
            .nodes
            .iter()
            .map(|w| match w {
                Work::Fill { pattern, .. } => *pattern,
                _ => 0,
            })
            .collect();
        assert_eq!(patterns, [1, 3]);
        // The other handles still name their nodes.
        assert_eq!(o.node(nodes[2]), Ok((g, 2)));
        o.add_dependencies(g, &[nodes[2]], &[nodes[0]]).unwrap();
        assert_eq!(o.node_edges(nodes[0], false), Ok(vec![nodes[2]]));
    }

    #[test]
    fn an_executables_child_graph_takes_a_graph_of_the_same_topology() {
        let mut o = Objects::default();
        let (child, _) = chain(&mut o, &[1, 2]);
        let parent = empty_graph(&mut o);
        let (_, work) = o.graph_work(child).unwrap();
        let node = o.add_node(parent, &[], NODE_GRAPH, work).unwrap();
        o.keep_child_topology(node, child).unwrap();
        let e = o.instantiate(parent, 0).unwrap();
        let (same, _) = chain(&mut o, &[5, 6]);
        o.set_exec_child(e, node, same).unwrap();
        assert_eq!(patterns(&o, e), [5, 6]);
        // Another topology, or a node that is no child graph node.
        let (longer, ln) = chain(&mut o, &[7, 8, 9]);
        assert_eq!(
            o.set_exec_child(e, node, longer),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            o.set_exec_child(e, ln[0], same),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(patterns(&o, e), [5, 6]);
    }

    #[test]
    fn memory_a_capture_allocates_and_frees_lives_as_long_as_its_graphs() {
        let (mut o, s) = objects_with_streams(2);
        let g = o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        o.captured_alloc(s[0], 0x1000);
        // Not capturing: the free is the caller's.
        assert_eq!(o.captured_free(s[1], 0x1000), Ok(false));
        assert_eq!(o.captured_free(s[0], 0x1000), Ok(true));
        assert_eq!(o.end_capture(s[0]), Ok(g));
        assert_eq!(o.graphs().graphs.at(g).owned.len(), 1);
        let e = o.instantiate(g, 0).unwrap();
        let copy = o.clone_graph(g).unwrap();
        // A parent of a child graph node holds the child's memory too.
        let parent = empty_graph(&mut o);
        o.adopt_owned(parent, g).unwrap();
        o.destroy_graph(g).unwrap();
        o.destroy_exec(e).unwrap();
        o.destroy_graph(copy).unwrap();
        assert!(o.graphs().to_free().is_empty(), "the parent still holds it");
        o.destroy_graph(parent).unwrap();
        assert_eq!(o.graphs_mut().take_to_free(), [0x1000]);
        assert_eq!(o.destroy_exec(e), Err(cu::ERROR_INVALID_HANDLE));
    }

    #[test]
    fn a_capture_cannot_free_what_it_did_not_allocate() {
        let (mut o, s) = objects_with_streams(1);
        o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
        o.captured_alloc(s[0], 0x1000);
        assert_eq!(o.captured_free(s[0], 0x1000), Ok(true));
        assert_eq!(
            o.captured_free(s[0], 0x2000),
            Err(cu::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        assert_eq!(
            o.captured_free(s[0], 0x3000),
            Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED)
        );
        // The failed capture's graph goes, and with it the memory it kept.
        assert_eq!(
            o.end_capture(s[0]),
            Err(cu::ERROR_STREAM_CAPTURE_INVALIDATED)
        );
        assert_eq!(o.graphs().to_free(), [0x1000]);
    }

    #[test]
    fn an_update_swaps_the_memory_an_executable_holds() {
        let (mut o, s) = objects_with_streams(1);
        let capture = |o: &mut Objects, addr: u64| {
            let g = o.begin_capture(s[0], 0, MODE_GLOBAL).unwrap();
            o.capture_work(s[0], 0, &[fill(1)]).unwrap();
            o.captured_alloc(s[0], addr);
            o.captured_free(s[0], addr).unwrap();
            o.end_capture(s[0]).unwrap();
            g
        };
        let g1 = capture(&mut o, 0x1000);
        let g2 = capture(&mut o, 0x2000);
        let e = o.instantiate(g1, 0).unwrap();
        o.destroy_graph(g1).unwrap();
        assert_eq!(o.update_exec(e, g2), Ok(()));
        assert_eq!(o.graphs_mut().take_to_free(), [0x1000]);
        o.destroy_graph(g2).unwrap();
        o.destroy_exec(e).unwrap();
        assert_eq!(o.graphs().to_free(), [0x2000]);
    }
}
