//! Stream capture and graphs. Work queued on a stream being captured is
//! recorded as the library would have queued it (launches, fills, small
//! writes, device copies), not run; launching the graph's executable
//! queues the recorded work again, in the recorded order. The device's
//! one in-order queue ([`crate::inflight`]) then keeps every dependency
//! the capture saw, the forks and joins of other streams through events
//! included, so a graph needs no edges.
//!
//! A capture starts on one stream (its origin); another stream joins it
//! by waiting on an event recorded in it, as CUDA's cross-stream capture
//! does, and the origin ends it for all of them.
//!
//! A graph can also be built node by node (`cuGraphAdd*Node`), each node
//! naming the nodes it depends on. Instantiating it puts the nodes in an
//! order that honours every dependency (the order they were added where
//! the dependencies allow), which the in-order queue then keeps.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use crate::cu::{self, CUdevice};
use crate::handles::Handles;
use crate::work::Work;

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub const MODE_GLOBAL: u32 = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const MODE_RELAXED: u32 = 2;

/// `CUstreamCaptureStatus`.
pub const STATUS_NONE: u32 = 0;
/// A capture in progress.
pub const STATUS_ACTIVE: u32 = 1;
/// A capture a call it could not record invalidated.
pub const STATUS_INVALIDATED: u32 = 2;

/// A capture in progress.
pub struct Capture {
    /// The stream it began on, the one that ends it.
    pub origin: usize,
    /// Its `CUstreamCaptureMode`.
    pub mode: u32,
    /// Its id (`cuStreamGetCaptureInfo`), unique in the process.
    pub id: u64,
    /// A call it could not record was made: ending it fails.
    pub invalidated: bool,
    /// Stream-ordered allocations made on its streams, not yet freed in
    /// it.
    pub allocs: HashSet<u64>,
    /// Those freed in it: the graph keeps them until it and its
    /// executables are gone (see [`Graph::owned`]).
    pub freed: Vec<u64>,
}

/// `CUgraphNodeType` of the nodes made here.
pub const NODE_KERNEL: u32 = 0;
/// `CU_GRAPH_NODE_TYPE_MEMCPY`.
pub const NODE_MEMCPY: u32 = 1;
/// `CU_GRAPH_NODE_TYPE_MEMSET`.
pub const NODE_MEMSET: u32 = 2;
/// `CU_GRAPH_NODE_TYPE_HOST`.
pub const NODE_HOST: u32 = 3;
/// `CU_GRAPH_NODE_TYPE_GRAPH`: a child graph.
pub const NODE_GRAPH: u32 = 4;
/// `CU_GRAPH_NODE_TYPE_EMPTY`.
pub const NODE_EMPTY: u32 = 5;
/// `CU_GRAPH_NODE_TYPE_WAIT_EVENT`.
pub const NODE_WAIT_EVENT: u32 = 6;
/// `CU_GRAPH_NODE_TYPE_EVENT_RECORD`.
pub const NODE_EVENT_RECORD: u32 = 7;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const NODE_MEM_ALLOC: u32 = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const NODE_MEM_FREE: u32 = 11;

/// What a removed node (`cuGraphDestroyNode`) becomes: no type CUDA
/// has, no work, no edges, its handle refused; the other nodes keep
/// their indices and so their handles.
pub const NODE_REMOVED: u32 = u32::MAX;

/// Most nodes of one graph (a node's handle holds its index).
pub const MAX_NODES: usize = (1 << 24) - 1;

/// A kernel node's parameter block as handed out, and each parameter's
/// address in it.
pub type HandedOut = (Box<[u8]>, Box<[usize]>);

/// One node of a graph: its work and the nodes (indices) it depends on.
pub struct Node {
    /// Its `CUgraphNodeType`.
    pub kind: u32,
    /// What it queues when its graph is launched.
    pub work: Vec<Work>,
    /// The indices of the nodes it depends on.
    pub deps: Vec<usize>,
    /// A kernel node's parameters as `cuGraphKernelNodeGetParams` gives
    /// them, once asked for: a copy of the block (writes through the
    /// pointers change no launch) and each parameter's address in it.
    pub param_ptrs: Option<HandedOut>,
    /// A memset or memcpy node's parameters as the program last gave
    /// them, which `cuGraph*NodeGetParams` answers.
    pub given: Option<Given>,
    /// A kernel node's launch attributes as set, read back as set
    /// (`cuGraphKernelNodeSetAttribute`; a cluster shape is its work's).
    pub attrs: HashMap<u32, cu::CUlaunchAttributeValue>,
    /// A child graph node's graph's topology when the node was made,
    /// which a graph replacing it in an executable must have.
    pub child: Option<Topology>,
}

/// A graph's topology: each node's type and dependencies (sorted), in
/// the order the nodes were added.
pub type Topology = Vec<(u32, Vec<usize>)>;

/// The parameters a memset or memcpy node was made or last set with.
#[derive(Clone, Copy)]
pub enum Given {
    /// A memset node's parameters.
    Memset(cu::MemsetNodeParams),
    /// A memcpy node's parameters.
    Memcpy(cu::Memcpy3d),
    /// An allocation node's allocation: its address and size.
    MemAlloc(u64, u64),
    /// A free node's address.
    MemFree(u64),
}

// SAFETY: the host addresses in a memcpy's parameters are the program's
// values, kept only to be handed back to it; nothing dereferences them
// through this copy.
unsafe impl Send for Given {}

impl Clone for Node {
    /// A copy without the parameters handed out: their addresses are the
    /// original's.
    fn clone(&self) -> Node {
        Node {
            kind: self.kind,
            work: self.work.clone(),
            deps: self.deps.clone(),
            param_ptrs: None,
            given: self.given,
            attrs: self.attrs.clone(),
            child: self.child.clone(),
        }
    }
}

impl Node {
    /// A node of one piece of work.
    pub fn of(work: &Work, deps: Vec<usize>) -> Node {
        let kind = match work {
            Work::Launch { .. } => NODE_KERNEL,
            Work::Copy { .. }
            | Work::Upload { .. }
            | Work::Download { .. }
            | Work::PageableUpload { .. }
            | Work::PageableDownload { .. } => NODE_MEMCPY,
            Work::Fill { .. } | Work::Write { .. } => NODE_MEMSET,
            Work::Host(_) => NODE_HOST,
            Work::Record(_) => NODE_EVENT_RECORD,
            Work::Wait(_) => NODE_WAIT_EVENT,
        };
        Node {
            kind,
            work: vec![work.clone()],
            deps,
            param_ptrs: None,
            given: None,
            attrs: HashMap::new(),
            child: None,
        }
    }
}

/// A graph: its nodes, in the order they were added (a capture adds one
/// per piece of work, each depending on the one before), and the capture
/// filling it.
pub struct Graph {
    /// The device its work runs on.
    pub device: CUdevice,
    /// Its nodes, by index.
    pub nodes: Vec<Node>,
    /// The capture filling it, while one does.
    pub capture: Option<Capture>,
    /// Device memory its work uses that a capture allocated and freed
    /// (`cuMemAllocAsync` ... `cuMemFreeAsync` on a captured stream):
    /// shared with its clones, its executables and the graphs it is a
    /// child of, and freed when the last of them goes.
    pub owned: Owned,
    /// The graph this one is a clone of (`cuGraphNodeFindInClone`).
    pub cloned_from: Option<usize>,
}

/// Device memory graphs own, shared among those that use it.
pub type Owned = Vec<Arc<Vec<u64>>>;

impl Graph {
    /// The work of every node, in an order that honours the
    /// dependencies: of the nodes whose dependencies are all placed, the
    /// one added first goes next. `None` when the dependencies loop.
    pub fn ordered_work(&self) -> Option<Vec<Work>> {
        self.ordered().map(|(work, _)| work)
    }

    /// [`Self::ordered_work`], with where each node's work lies in it
    /// (by node index).
    pub fn ordered(&self) -> Option<(Vec<Work>, Vec<Range<usize>>)> {
        let n = self.nodes.len();
        let mut waiting: Vec<usize> = self.nodes.iter().map(|x| x.deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            for &d in &node.deps {
                dependents[d].push(i);
            }
        }
        let mut ready: BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut work = Vec::with_capacity(n);
        let mut spans = vec![0..0; n];
        let mut placed = 0;
        while let Some(i) = ready.pop_first() {
            placed += 1;
            let at = work.len();
            work.extend(self.nodes[i].work.iter().cloned());
            spans[i] = at..work.len();
            for &j in &dependents[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.insert(j);
                }
            }
        }
        (placed == n).then_some((work, spans))
    }

    /// The addresses its allocation nodes allocate and those its free
    /// nodes free.
    pub fn mem_nodes(&self) -> (Vec<u64>, Vec<u64>) {
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        for n in &self.nodes {
            match n.given {
                Some(Given::MemAlloc(a, _)) => allocs.push(a),
                Some(Given::MemFree(a)) => frees.push(a),
                _ => {}
            }
        }
        (allocs, frees)
    }

    /// Whether it has allocation or free nodes, which CUDA lets no one
    /// clone, nest or instantiate twice, nor delete edges of.
    pub fn has_mem_nodes(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.kind, NODE_MEM_ALLOC | NODE_MEM_FREE))
    }

    /// The graph's node types and dependencies, without their work.
    pub fn shape(&self) -> Graph {
        let nodes = self
            .nodes
            .iter()
            .map(|n| Node {
                kind: n.kind,
                work: Vec::new(),
                deps: n.deps.clone(),
                param_ptrs: None,
                given: None,
                attrs: HashMap::new(),
                child: n.child.clone(),
            })
            .collect();
        Graph {
            device: self.device,
            nodes,
            capture: None,
            owned: Vec::new(),
            cloned_from: None,
        }
    }

    /// Its topology (see [`Topology`]).
    pub fn topology(&self) -> Topology {
        self.nodes
            .iter()
            .map(|n| {
                let mut d = n.deps.clone();
                d.sort_unstable();
                (n.kind, d)
            })
            .collect()
    }

    /// Whether `other` has this graph's topology: as many nodes, each of
    /// the same type with the same dependencies (what `cuGraphExecUpdate`
    /// needs); the first node that differs, if one does.
    pub fn same_topology(&self, other: &Graph) -> Result<(), Option<usize>> {
        if self.nodes.len() != other.nodes.len() {
            return Err(None);
        }
        for (i, (a, b)) in self.nodes.iter().zip(&other.nodes).enumerate() {
            let sorted = |d: &[usize]| {
                let mut d = d.to_vec();
                d.sort_unstable();
                d
            };
            if a.kind != b.kind || sorted(&a.deps) != sorted(&b.deps) {
                return Err(Some(i));
            }
        }
        Ok(())
    }
}

/// The handle of node `index` of graph `graph`.
pub fn node_handle(graph: usize, index: usize) -> usize {
    graph * (MAX_NODES + 1) + index + 1
}

/// The graph and index a node handle names (not checked against the
/// graph's nodes).
pub fn node_of(handle: usize) -> Option<(usize, usize)> {
    let index = (handle % (MAX_NODES + 1)).checked_sub(1)?;
    Some((handle / (MAX_NODES + 1), index))
}

/// Why `cuGraphExecUpdate` refuses a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateFailure {
    /// Nodes, their types or their dependencies differ (at this node of
    /// the new graph, where one node does).
    Topology(Option<usize>),
    /// Anything else (another device).
    Other,
}

/// An instantiated graph, sharing its work with every launch of it.
pub struct GraphExec {
    /// The device its work runs on.
    pub device: CUdevice,
    /// Its nodes' work, in an order that keeps every dependency.
    pub nodes: Arc<[Work]>,
    /// The graph it was instantiated from (whose node handles change its
    /// nodes), and the one it was last updated from (whose handles do too).
    pub graphs: [usize; 2],
    /// Where each node's work lies in `nodes`, by node index.
    pub spans: Vec<Range<usize>>,
    /// The source graph's node types and dependencies, which an update
    /// must keep.
    pub topology: Graph,
    /// The memory its work uses that graphs own (see [`Graph::owned`]).
    pub owned: Owned,
    /// The `CUgraphInstantiate_flags` it was made with.
    pub flags: u64,
    /// What its allocation nodes allocate and its free nodes free, at
    /// each launch (see [`GraphMem`]).
    pub mem: (Vec<u64>, Vec<u64>),
    /// The nodes disabled in it (`cuGraphNodeSetEnabled`), by index: a
    /// launch leaves their work out.
    pub disabled: BTreeSet<usize>,
}

impl GraphExec {
    /// The work a launch queues: every node's, but the disabled ones'.
    pub fn launch_work(&self) -> Arc<[Work]> {
        if self.disabled.is_empty() {
            return self.nodes.clone();
        }
        let mut skip = vec![false; self.nodes.len()];
        for &i in &self.disabled {
            if let Some(span) = self.spans.get(i) {
                for k in span.clone() {
                    skip[k] = true;
                }
            }
        }
        self.nodes
            .iter()
            .zip(skip)
            .filter(|(_, s)| !s)
            .map(|(w, _)| w.clone())
            .collect()
    }
}

/// `CUgraphMem_attribute`: memory graphs' allocation nodes use now.
pub const MEM_USED_CURRENT: u32 = 0;
/// The most they used since the mark was reset.
pub const MEM_USED_HIGH: u32 = 1;
/// Memory held for them now.
pub const MEM_RESERVED_CURRENT: u32 = 2;
/// The most held since the mark was reset.
pub const MEM_RESERVED_HIGH: u32 = 3;

/// The memory of graphs' allocation nodes. Each allocation is made when
/// its node is (its address is fixed from then on, as CUDA's is) and
/// held until no graph or executable has the node, or, where a launch
/// left it allocated, until the program frees it. A launch allocates
/// it (it is "live") and a free node or the program's free frees it.
#[derive(Default)]
pub struct GraphMem {
    /// Each allocation held: its size and device.
    held: HashMap<u64, (u64, CUdevice)>,
    /// Those a launch allocated that nothing freed since.
    live: HashSet<u64>,
    /// Live ones whose graphs are gone: the program's free frees them.
    detached: HashSet<u64>,
    /// Each device's high marks: used and reserved.
    high: HashMap<CUdevice, (u64, u64)>,
}

/// What a program's free of an address does (see [`GraphMem::program_free`]).
#[derive(Debug, PartialEq, Eq)]
pub enum ProgramFree {
    /// Not a graph's allocation: an ordinary free.
    NotGraphs,
    /// A graph's allocation, freed as the graph sees it; the memory
    /// stays the graph's.
    Kept,
    /// A graph's allocation whose graphs are gone: the memory goes now.
    Release,
    /// Not allocated now (never launched, or freed already).
    NotAllocated,
}

impl GraphMem {
    /// An allocation node's memory, now held.
    pub fn hold(&mut self, addr: u64, size: u64, device: CUdevice) {
        self.held.insert(addr, (size, device));
        self.mark(device);
    }

    /// Whether `addr` is an allocation node's.
    pub fn is_graphs(&self, addr: u64) -> bool {
        self.held.contains_key(&addr)
    }

    /// A launch allocating `allocs` and freeing `frees`. Refused (false)
    /// where one of `allocs` is still allocated, unless `auto_free`
    /// (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`) frees it first.
    pub fn launch(&mut self, allocs: &[u64], frees: &[u64], auto_free: bool) -> bool {
        if !auto_free && allocs.iter().any(|a| self.live.contains(a)) {
            return false;
        }
        self.live.extend(allocs.iter().copied());
        // The launch uses its allocations before it frees any of them.
        let devices: HashSet<CUdevice> = allocs
            .iter()
            .filter_map(|a| self.held.get(a).map(|h| h.1))
            .collect();
        for d in devices {
            self.mark(d);
        }
        for f in frees {
            self.live.remove(f);
        }
        true
    }

    /// The program frees `addr` (`cuMemFree`, `cuMemFreeAsync`).
    pub fn program_free(&mut self, addr: u64) -> ProgramFree {
        if !self.held.contains_key(&addr) {
            return ProgramFree::NotGraphs;
        }
        if !self.live.remove(&addr) {
            return ProgramFree::NotAllocated;
        }
        if self.detached.remove(&addr) {
            self.held.remove(&addr);
            return ProgramFree::Release;
        }
        ProgramFree::Kept
    }

    /// No graph or executable holds `addr` any more: whether its memory
    /// goes now (false: a launch left it allocated, and it goes with the
    /// program's free).
    pub fn released(&mut self, addr: u64) -> bool {
        if !self.held.contains_key(&addr) {
            return true;
        }
        if self.live.contains(&addr) {
            self.detached.insert(addr);
            return false;
        }
        self.held.remove(&addr);
        true
    }

    /// Bytes of `device`'s allocations that are allocated now (`used`)
    /// or held.
    fn current(&self, device: CUdevice) -> (u64, u64) {
        let mut used = 0;
        let mut reserved = 0;
        for (a, &(size, d)) in &self.held {
            if d == device {
                reserved += size;
                if self.live.contains(a) {
                    used += size;
                }
            }
        }
        (used, reserved)
    }

    /// Raises `device`'s high marks to what it uses and holds now.
    fn mark(&mut self, device: CUdevice) {
        let (used, reserved) = self.current(device);
        let h = self.high.entry(device).or_default();
        h.0 = h.0.max(used);
        h.1 = h.1.max(reserved);
    }

    /// `device`'s `CUgraphMem_attribute` `attr`; `None` for another.
    pub fn attribute(&self, device: CUdevice, attr: u32) -> Option<u64> {
        let (used, reserved) = self.current(device);
        let high = self.high.get(&device).copied().unwrap_or_default();
        match attr {
            MEM_USED_CURRENT => Some(used),
            MEM_USED_HIGH => Some(high.0),
            MEM_RESERVED_CURRENT => Some(reserved),
            MEM_RESERVED_HIGH => Some(high.1),
            _ => None,
        }
    }

    /// Resets high mark `attr` of `device` (to zero, the one value CUDA
    /// takes); false for an attribute that is not a high mark.
    pub fn reset_high(&mut self, device: CUdevice, attr: u32) -> bool {
        let h = self.high.entry(device).or_default();
        match attr {
            MEM_USED_HIGH => h.0 = 0,
            MEM_RESERVED_HIGH => h.1 = 0,
            _ => return false,
        }
        true
    }
}

/// The graphs, their executables and the captures in progress.
#[derive(Default)]
pub struct Graphs {
    /// Graphs, made by capture or node by node.
    pub graphs: Handles<Graph>,
    /// Executable graphs.
    pub execs: Handles<GraphExec>,
    /// Streams being captured, and the graph each one's capture fills.
    capturing: HashMap<usize, usize>,
    /// The last capture id given out (ids start at 1).
    capture_ids: u64,
    /// Device memory graphs owned and no longer use: freed by the entry
    /// point that let it go, once the objects are unlocked.
    to_free: Vec<u64>,
    /// The memory of allocation nodes.
    pub mem: GraphMem,
}

impl Graphs {
    /// The capture filling graph `g`, if `g` is a graph being captured.
    pub fn capture_mut(&mut self, g: usize) -> Option<&mut Capture> {
        self.graphs.get_mut(g).ok().and_then(|g| g.capture.as_mut())
    }

    /// How many graphs there are.
    pub fn graph_count(&self) -> usize {
        self.graphs.iter().count()
    }

    /// The graphs of device `dev`, to change.
    pub fn graphs_of_mut(&mut self, dev: CUdevice) -> impl Iterator<Item = &mut Graph> {
        self.graphs.values_mut().filter(move |g| g.device == dev)
    }

    /// The graph whose capture `stream` is in, if it is in one.
    pub fn capturing(&self, stream: usize) -> Option<usize> {
        self.capturing.get(&stream).copied()
    }

    /// Whether `stream` is in a capture.
    pub fn is_capturing(&self, stream: usize) -> bool {
        self.capturing.contains_key(&stream)
    }

    /// Whether any stream is in a capture.
    pub fn any_capturing(&self) -> bool {
        !self.capturing.is_empty()
    }

    /// Puts `stream` in the capture filling graph `g`.
    pub fn join_capture(&mut self, stream: usize, g: usize) {
        self.capturing.insert(stream, g);
    }

    /// Takes `stream` out of its capture; the capture's graph, if it was
    /// in one.
    pub fn leave_capture(&mut self, stream: usize) -> Option<usize> {
        self.capturing.remove(&stream)
    }

    /// Takes every stream out of the capture filling graph `g`.
    pub fn end_capture_of(&mut self, g: usize) {
        self.capturing.retain(|_, v| *v != g);
    }

    /// A fresh capture id.
    pub fn next_capture_id(&mut self) -> u64 {
        self.capture_ids += 1;
        self.capture_ids
    }

    /// Device memory at `addrs` is no longer used by any graph: it is
    /// freed by the entry point that let it go.
    /// An allocation node's memory a launch left allocated stays until
    /// the program frees it.
    pub fn free_later(&mut self, addrs: impl IntoIterator<Item = u64>) {
        let mem = &mut self.mem;
        self.to_free
            .extend(addrs.into_iter().filter(|&a| mem.released(a)));
    }

    /// The device memory waiting to be freed.
    pub fn to_free(&self) -> &[u64] {
        &self.to_free
    }

    /// Takes the device memory waiting to be freed.
    pub fn take_to_free(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.to_free)
    }
}

/// Calls that wait for a stream's work or need the host side of it,
/// which a capture cannot record.
pub enum Unsafe {
    /// Of one stream: a synchronisation, a query, a copy with a host side.
    Stream(usize),
    /// Of a whole device: a context synchronisation.
    Device(CUdevice),
}

thread_local! {
    /// The calling thread's capture mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
}

/// Sets the calling thread's capture mode; the previous one.
pub fn exchange_thread_mode(mode: u32) -> u32 {
    THREAD_MODE.with(|m| m.replace(mode))
}

/// Whether the calling thread asked for relaxed capture rules.
pub fn thread_relaxed() -> bool {
    THREAD_MODE.with(|m| m.get()) == MODE_RELAXED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_allocates_and_a_relaunch_waits_for_the_free() {
        let mut m = GraphMem::default();
        m.hold(0x1000, 64, 0);
        m.hold(0x2000, 32, 0);
        assert_eq!(m.attribute(0, MEM_RESERVED_CURRENT), Some(96));
        assert_eq!(m.attribute(0, MEM_USED_CURRENT), Some(0));
        // 0x2000 is freed in its own graph; 0x1000 outlives the launch.
        assert!(m.launch(&[0x1000, 0x2000], &[0x2000], false));
        assert_eq!(m.attribute(0, MEM_USED_CURRENT), Some(64));
        // Both were in use while it ran.
        assert_eq!(m.attribute(0, MEM_USED_HIGH), Some(96));
        assert!(!m.launch(&[0x1000, 0x2000], &[0x2000], false));
        // The graph's own free leaves nothing for the program to free.
        assert_eq!(m.program_free(0x2000), ProgramFree::NotAllocated);
        assert_eq!(m.program_free(0x1000), ProgramFree::Kept);
        assert_eq!(m.program_free(0x1000), ProgramFree::NotAllocated);
        assert_eq!(m.program_free(0x9000), ProgramFree::NotGraphs);
        assert!(m.launch(&[0x1000], &[], false));
        // Freeing on launch lets it launch again at once.
        assert!(m.launch(&[0x1000], &[], true));
        assert_eq!(m.attribute(0, MEM_USED_HIGH), Some(96));
        assert_eq!(m.attribute(1, MEM_USED_CURRENT), Some(0));
        assert_eq!(m.attribute(0, 7), None);
    }

    #[test]
    fn memory_a_launch_left_allocated_outlives_its_graph() {
        let mut m = GraphMem::default();
        m.hold(0x1000, 64, 0);
        m.hold(0x2000, 32, 0);
        assert!(m.launch(&[0x1000], &[], false));
        assert!(!m.released(0x1000), "still allocated");
        assert!(m.released(0x2000));
        assert!(m.released(0x5000), "no graph's");
        assert_eq!(m.attribute(0, MEM_RESERVED_CURRENT), Some(64));
        assert_eq!(m.program_free(0x1000), ProgramFree::Release);
        assert!(!m.is_graphs(0x1000));
        assert_eq!(m.attribute(0, MEM_RESERVED_CURRENT), Some(0));
        assert_eq!(m.attribute(0, MEM_RESERVED_HIGH), Some(96));
        assert!(m.reset_high(0, MEM_RESERVED_HIGH));
        assert!(!m.reset_high(0, MEM_USED_CURRENT));
        assert_eq!(m.attribute(0, MEM_RESERVED_HIGH), Some(0));
    }

    #[test]
    fn a_graph_lists_its_memory_nodes() {
        let node = |kind, given| {
            let mut n = Node::of(&Work::Record(1), Vec::new());
            n.kind = kind;
            n.work.clear();
            n.given = given;
            n
        };
        let g = Graph {
            device: 0,
            nodes: vec![
                node(NODE_MEM_ALLOC, Some(Given::MemAlloc(0x1000, 8))),
                node(NODE_MEM_FREE, Some(Given::MemFree(0x3000))),
            ],
            capture: None,
            owned: Vec::new(),
            cloned_from: None,
        };
        assert!(g.has_mem_nodes());
        assert_eq!(g.mem_nodes(), (vec![0x1000], vec![0x3000]));
        assert!(!g.shape().nodes.is_empty() && g.shape().has_mem_nodes());
    }
}
