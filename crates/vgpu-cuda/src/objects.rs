//! The objects a program creates (contexts, modules, functions, streams,
//! events, allocations, graphs, pools, links), each behind a handle
//! number this library checks on every use, so a stale or forged handle
//! is an error, never a crash.

use std::collections::{BTreeMap, HashMap};

use crate::ctx_table::Contexts;
use crate::cu::{self, CUdevice, CuResult};
use crate::diag::log;
use crate::graphs::{Graph, GraphExec};
use crate::links::Links;
use crate::module_table::{ModuleObj, Modules};
use crate::pool_table::Pools;
use crate::stream_table::Streams;

/// The object filed under handle `h` in `table`; CUDA calls an unknown
/// one an invalid handle.
pub fn by_handle<T>(table: &HashMap<usize, T>, h: usize) -> CuResult<&T> {
    table.get(&h).ok_or(cu::ERROR_INVALID_HANDLE)
}

/// Device memory a program allocated.
pub struct Alloc {
    /// Its size in bytes.
    pub size: u64,
    /// The device it is memory of.
    pub device: CUdevice,
    /// The context it was allocated in.
    pub ctx: usize,
    /// The module whose global this is (copies reach it, `cuMemFree`
    /// does not free it, it goes with its module); `None` for memory of
    /// `cuMemAlloc`.
    pub module: Option<usize>,
    /// Managed memory (`cuMemAllocManaged`): host memory of the process
    /// at the same address too (see [`crate::managed`]).
    pub managed: bool,
}

/// Host memory from `cuMemHostAlloc`/`cuMemAllocHost`, or registered.
pub struct HostMem {
    /// Its size in bytes.
    pub size: usize,
    /// The context it was allocated or registered in.
    pub ctx: usize,
    /// Allocated here (freed by `cuMemFreeHost`), or the caller's
    /// (registered with `cuMemHostRegister`).
    pub owned: bool,
    /// The whole pages of it pinned for copies by this device's kernel
    /// driver (VGPU_IOCTL_PIN): (device, first page).
    pub pinned: Option<(CUdevice, usize)>,
    /// The flags it was allocated or registered with (`cuMemHostGetFlags`).
    pub flags: u32,
}

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
    /// Device allocations by start address.
    pub allocs: BTreeMap<u64, Alloc>,
    /// The pages of device allocations, held in this process's address
    /// space so no host memory of it ever shares an address with them.
    pub reserved: crate::reserve::Reservations,
    /// Module globals whose pages `reserved` holds.
    pub globals_reserved: std::collections::HashSet<u64>,
    /// Host allocations by start address.
    pub host: BTreeMap<usize, HostMem>,
    /// Streams being captured, and the graph each one's capture fills.
    pub capturing: HashMap<usize, usize>,
    /// Graphs, made by capture or node by node.
    pub graphs: HashMap<usize, Graph>,
    /// Executable graphs.
    pub execs: HashMap<usize, GraphExec>,
    /// The last capture id given out (ids start at 1).
    pub capture_ids: u64,
    /// Memory pools, and which allocations came from them.
    pools: Pools,
    /// JIT links in progress.
    links: Links,
    /// Device memory graphs owned and no longer use: freed by the entry
    /// point that let it go, once the objects are unlocked.
    pub to_free: Vec<u64>,
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

    /// The memory pools.
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// The memory pools, to change.
    pub fn pools_mut(&mut self) -> &mut Pools {
        &mut self.pools
    }

    /// The JIT links in progress, to change.
    pub fn links_mut(&mut self) -> &mut Links {
        &mut self.links
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

    /// Files `value` under a fresh handle in the table `table` picks.
    pub fn add<T>(&mut self, table: fn(&mut Objects) -> &mut HashMap<usize, T>, value: T) -> usize {
        let h = self.handle();
        table(self).insert(h, value);
        h
    }

    /// Files global `addr` (`size` bytes) of `module` among the device
    /// allocations: copies and pointer queries reach it, `cuMemFree`
    /// does not ([`Objects::freeable`]), and it goes with its module.
    pub fn add_global(
        &mut self,
        module: usize,
        addr: u64,
        size: u64,
        device: CUdevice,
        ctx: usize,
    ) {
        if size > 0 {
            let a = Alloc {
                size,
                device,
                ctx,
                module: Some(module),
                managed: false,
            };
            // Its place in the module is the device's: held like an
            // allocation's where it can be (once, however often it is
            // asked for), and said where host memory of this process is
            // there already.
            if !self.globals_reserved.contains(&addr) {
                if self.reserved.reserve(addr, size).is_ok() {
                    self.globals_reserved.insert(addr);
                } else {
                    log(&format!(
                        "global at {addr:#x} ({size} bytes) lies over host memory of this process"
                    ));
                }
            }
            self.allocs.insert(addr, a);
        }
    }

    /// Forgets module `module` with its functions and globals; the
    /// module, if it was filed.
    pub fn remove_module(&mut self, module: usize) -> Option<ModuleObj> {
        self.modules.forget_functions_of(module);
        let (reserved, globals) = (&mut self.reserved, &mut self.globals_reserved);
        self.allocs.retain(|&addr, a| {
            let keep = a.module != Some(module);
            if !keep && globals.remove(&addr) {
                reserved.release(addr, a.size);
            }
            keep
        });
        self.modules.remove_module(module).ok()
    }

    /// The device of the `cuMemAlloc` memory starting at `addr`, which
    /// `cuMemFree` may free (not a module's global).
    pub fn freeable(&self, addr: u64) -> Option<CUdevice> {
        self.allocs
            .get(&addr)
            .filter(|a| a.module.is_none())
            .map(|a| a.device)
    }

    /// The allocation containing `[addr, addr + len)`.
    pub fn alloc_at(&self, addr: u64, len: u64) -> Option<(u64, &Alloc)> {
        let (&start, a) = self.allocs.range(..=addr).next_back()?;
        let end = start.checked_add(a.size)?;
        (addr.checked_add(len)? <= end && addr < end.max(start + 1)).then_some((start, a))
    }

    /// The end of the last device allocation that overlaps `[addr, addr +
    /// len)`, if one does.
    pub fn allocations_end(&self, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        // Allocations do not overlap one another: the last one to start
        // before `end` ends last.
        let (&start, a) = self.allocs.range(..end).next_back()?;
        let last = start.saturating_add(a.size);
        (last > addr).then_some(last)
    }

    /// The host allocation containing `[p, p + len)`.
    pub fn host_at(&self, p: usize, len: usize) -> Option<(usize, &HostMem)> {
        let (&start, h) = self.host.range(..=p).next_back()?;
        (p.checked_add(len)? <= start + h.size && p < start + h.size.max(1)).then_some((start, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_the_allocations_in_the_way() {
        let mut o = Objects::default();
        for (start, size) in [(0x1000, 0x1000), (0x3000, 0x2000)] {
            let a = Alloc {
                size,
                device: 0,
                ctx: 0,
                module: None,
                managed: false,
            };
            o.allocs.insert(start, a);
        }
        // Over the first, over both, in the gap, past both.
        assert_eq!(o.allocations_end(0x1800, 0x10), Some(0x2000));
        assert_eq!(o.allocations_end(0x1800, 0x2000), Some(0x5000));
        assert_eq!(o.allocations_end(0x2000, 0x800), None);
        assert_eq!(o.allocations_end(0x5000, 0x1000), None);
        assert_eq!(o.allocations_end(0x2800, 0x1000), Some(0x5000));
    }

    #[test]
    fn allocation_lookup_needs_the_whole_range_inside_one_allocation() {
        let mut o = Objects::default();
        for (a, s) in [(0x1000u64, 0x100u64), (0x2000, 0x10)] {
            o.allocs.insert(
                a,
                Alloc {
                    size: s,
                    device: 0,
                    ctx: 1,
                    module: None,
                    managed: false,
                },
            );
        }
        assert_eq!(o.alloc_at(0x1000, 0x100).map(|a| a.0), Some(0x1000));
        assert_eq!(o.alloc_at(0x10ff, 1).map(|a| a.0), Some(0x1000));
        assert!(o.alloc_at(0x10ff, 2).is_none());
        assert!(o.alloc_at(0x1100, 1).is_none());
        assert!(o.alloc_at(0xfff, 1).is_none());
        assert!(o.alloc_at(u64::MAX, 2).is_none());
        assert_eq!(o.alloc_at(0x2008, 0).map(|a| a.0), Some(0x2000));
    }

    #[test]
    fn a_global_is_device_memory_until_its_module_goes_but_never_freeable() {
        let mut o = Objects::default();
        o.allocs.insert(
            0x1000,
            Alloc {
                size: 0x100,
                device: 0,
                ctx: 1,
                module: None,
                managed: false,
            },
        );
        o.add_global(7, 0x8000, 64, 0, 1);
        o.add_global(7, 0x9000, 0, 0, 1);
        assert_eq!(o.alloc_at(0x8010, 16).map(|a| a.0), Some(0x8000));
        assert!(o.alloc_at(0x8030, 32).is_none(), "past the global's end");
        assert!(
            o.alloc_at(0x9000, 1).is_none(),
            "an empty global is no memory"
        );
        assert_eq!(o.freeable(0x8000), None);
        assert_eq!(o.freeable(0x1000), Some(0));
        o.add_global(8, 0xa000, 64, 0, 1);
        o.remove_module(7);
        assert!(o.alloc_at(0x8000, 1).is_none(), "gone with its module");
        assert!(o.alloc_at(0xa000, 1).is_some(), "another module's stays");
        assert!(o.alloc_at(0x1000, 1).is_some(), "cuMemAlloc memory stays");
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
