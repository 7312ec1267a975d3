//! The objects a program creates (contexts, modules, functions, streams,
//! events, allocations, graphs, pools, links, arrays), each behind a handle
//! number this library checks on every use, so a stale or forged handle
//! is an error, never a crash.

use crate::arrays::Arrays;
use crate::ctx_table::Contexts;
use crate::graphs::Graphs;
use crate::links::Links;
use crate::mem_table::{Allocs, HostAllocs};
use crate::module_table::{ModuleObj, Modules};
use crate::pool_table::Pools;
use crate::stream_table::Streams;
use crate::vmm::VmmTable;

/// Handle-addressed objects.
#[derive(Default)]
pub struct Objects {
    next: usize,
    /// Contexts, primary ones included, and the primary ones' reference
    /// counts and flags.
    ctxs: Contexts,
    /// Modules and libraries, and their functions and kernels.
    modules: Modules,
    /// Streams (the default streams 0, 1 and 2 are not filed) and
    /// events.
    streams: Streams,
    /// Device allocations and module globals by start address.
    allocs: Allocs,
    /// Host allocations by start address.
    host: HostAllocs,
    /// Graphs, executables and the captures in progress.
    graphs: Graphs,
    /// Memory pools, and which allocations came from them.
    pools: Pools,
    /// JIT links in progress.
    links: Links,
    /// Reservations and physical allocations of virtual memory
    /// management (their mappings are in `allocs`).
    vmm: VmmTable,
    /// CUDA arrays, texture and surface objects.
    arrays: Arrays,
}

impl Objects {
    /// A fresh handle number: non-null, distinct from every live one
    /// (and from small integers a program might pass by mistake).
    pub fn handle(&mut self) -> usize {
        self.next += 0x10;
        0x10_0000 + self.next
    }

    /// The contexts.
    pub fn ctxs(&self) -> &Contexts {
        &self.ctxs
    }

    /// The contexts, to change.
    pub fn ctxs_mut(&mut self) -> &mut Contexts {
        &mut self.ctxs
    }

    /// The modules and functions.
    pub fn modules(&self) -> &Modules {
        &self.modules
    }

    /// The modules and functions, to change.
    pub fn modules_mut(&mut self) -> &mut Modules {
        &mut self.modules
    }

    /// The device allocations.
    pub fn allocs(&self) -> &Allocs {
        &self.allocs
    }

    /// The device allocations, to change.
    pub fn allocs_mut(&mut self) -> &mut Allocs {
        &mut self.allocs
    }

    /// The host allocations.
    pub fn host(&self) -> &HostAllocs {
        &self.host
    }

    /// The host allocations, to change.
    pub fn host_mut(&mut self) -> &mut HostAllocs {
        &mut self.host
    }

    /// The graphs, executables and captures.
    pub fn graphs(&self) -> &Graphs {
        &self.graphs
    }

    /// The graphs, executables and captures, to change.
    pub fn graphs_mut(&mut self) -> &mut Graphs {
        &mut self.graphs
    }

    /// The memory pools.
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// The memory pools, to change.
    pub fn pools_mut(&mut self) -> &mut Pools {
        &mut self.pools
    }

    /// The arrays, texture and surface objects.
    pub fn arrays(&self) -> &Arrays {
        &self.arrays
    }

    /// The arrays, texture and surface objects, to change.
    pub fn arrays_mut(&mut self) -> &mut Arrays {
        &mut self.arrays
    }

    /// The JIT links in progress, to change.
    pub fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    /// Reservations and physical allocations.
    pub fn vmm(&self) -> &VmmTable {
        &self.vmm
    }

    /// Reservations and physical allocations, to change.
    pub fn vmm_mut(&mut self) -> &mut VmmTable {
        &mut self.vmm
    }

    /// The device allocations (mappings among them) and the virtual
    /// memory tables, both to change.
    pub fn allocs_and_vmm(&mut self) -> (&mut Allocs, &mut VmmTable) {
        (&mut self.allocs, &mut self.vmm)
    }

    /// The streams and events.
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    /// The streams and events, to change.
    pub fn streams_mut(&mut self) -> &mut Streams {
        &mut self.streams
    }

    /// A fresh handle, which `put` files an object under in its table.
    pub fn file(&mut self, put: impl FnOnce(&mut Objects, usize)) -> usize {
        let h = self.handle();
        put(self, h);
        h
    }

    /// Forgets module `module` with its functions and globals; the
    /// module, if it was filed.
    pub fn remove_module(&mut self, module: usize) -> Option<ModuleObj> {
        self.modules.forget_functions_of(module);
        self.allocs.forget_globals_of(module);
        self.modules.modules.remove(module).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem_table::Alloc;

    #[test]
    fn a_global_is_device_memory_until_its_module_goes_but_never_freeable() {
        let mut o = Objects::default();
        o.allocs_mut().insert(
            0x1000,
            Alloc {
                size: 0x100,
                device: 0,
                ctx: 1,
                module: None,
                managed: false,
                mapping: None,
            },
        );
        o.allocs_mut().add_global(7, 0x8000, 64, 0, 1);
        o.allocs_mut().add_global(7, 0x9000, 0, 0, 1);
        assert_eq!(o.allocs().alloc_at(0x8010, 16).map(|a| a.0), Some(0x8000));
        assert!(
            o.allocs().alloc_at(0x8030, 32).is_none(),
            "past the global's end"
        );
        assert!(
            o.allocs().alloc_at(0x9000, 1).is_none(),
            "an empty global is no memory"
        );
        assert_eq!(o.allocs().freeable(0x8000), None);
        assert_eq!(o.allocs().freeable(0x1000), Some(0));
        o.allocs_mut().add_global(8, 0xa000, 64, 0, 1);
        o.remove_module(7);
        assert!(
            o.allocs().alloc_at(0x8000, 1).is_none(),
            "gone with its module"
        );
        assert!(
            o.allocs().alloc_at(0xa000, 1).is_some(),
            "another module's stays"
        );
        assert!(
            o.allocs().alloc_at(0x1000, 1).is_some(),
            "cuMemAlloc memory stays"
        );
    }

    #[test]
    fn handles_are_distinct_and_never_small() {
        let mut o = Objects::default();
        let a = o.handle();
        let b = o.handle();
        assert_ne!(a, b);
        assert!(a > 0x1000 && b > 0x1000);
    }
}
