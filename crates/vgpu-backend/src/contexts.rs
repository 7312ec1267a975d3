//! The contexts of one partition (ABI 1.5): each guest process gets a
//! partition of its own, made by the backend on first use
//! ([`Backend::create_context`](crate::Backend::create_context)), so
//! that a kernel fault ends that process's device state only, as a GPU
//! ends only the faulting process's context.
//!
//! [`Contexts`] is itself a [`Partition`]: the device says which context
//! the next calls are for ([`Partition::set_context`]) and calls it as it
//! would one partition. Context 0 is the partition the vGPU was created
//! with; its loss is the whole function's, as before contexts. The
//! contexts share the quota (what they hold together stays within the
//! spec's memory), the lanes and the scheduler's share of that partition.
//!
//! Module handles of contexts other than 0 are the wrapper's own, so that
//! a handle names one context's module wherever it goes (function
//! handles, a launch by a stale handle): [`MODULE_TAG`], the context in
//! bits 32-47 and a number of the context's in the low 32 bits.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_abi as abi;

use crate::{
    console, BackendError, ContextCounts, Finished, Finishing, FunctionInfo, HostMapping,
    HostMemory, Launch, OpError, Partition, PartitionSpec, Queued, QueuedDone, Started,
};

/// Makes the partition of a new context, of the spec the partition has
/// now (its quota changes with a live resize).
pub type ContextFactory =
    Box<dyn Fn(&PartitionSpec) -> Result<Box<dyn Partition>, BackendError> + Send>;

/// Set in the module handles of contexts other than 0.
pub const MODULE_TAG: u64 = 1 << 63;

/// The key of the spare partition's registry of guest memory: no
/// context has it.
const SPARE: u32 = u32::MAX;

/// A context other than 0.
enum Slot {
    /// In use.
    Live(Box<Live>),
    /// Its partition was lost and dropped; the commands naming it are
    /// refused until it is ended. Keeps the module handles it had, which
    /// the caller forgets when it ends.
    Lost {
        /// What was lost, for the refusals.
        why: String,
        /// Its modules' handles (the wrapper's).
        modules: Vec<u64>,
        /// What its modules' kernels printed before the loss (an
        /// assertion's line, above all), still to be taken.
        consoles: console::Consoles,
    },
}

/// A context's partition and its module handles.
struct Live {
    part: Box<dyn Partition>,
    /// The wrapper's module handles to the partition's.
    modules: HashMap<u64, u64>,
    /// The number the next module gets.
    next_module: u32,
}

/// The contexts of a partition. See the module's documentation.
pub struct Contexts {
    /// Context 0.
    base: Box<dyn Partition>,
    make: ContextFactory,
    /// Most contexts besides 0 at once.
    max: u32,
    slots: BTreeMap<u32, Slot>,
    current: u32,
    /// Guest memory announced to every context's registry.
    host: Option<Arc<FanOut>>,
    /// Device memory each context besides 0 costs on its own.
    cost: u64,
    /// The partition of a context that ended cleanly, reset, kept for the
    /// next context (a GPU context and a host process ready at once); its
    /// registry of guest memory stays announced as [`SPARE`].
    spare: Option<Box<dyn Partition>>,
    /// For the log.
    name: String,
    /// Partitions made and reused, for [`ContextCounts`].
    started: u64,
    start_ns: u64,
    reused: u64,
}

impl Contexts {
    /// `base` as context 0, with up to `max` more made by `make`. Asks
    /// `base` for its registry of guest memory (see
    /// [`Partition::host_memory`]): every context made later gets the
    /// mappings announced to it too.
    pub fn new(base: Box<dyn Partition>, make: ContextFactory, max: u32) -> Contexts {
        let name = base.spec().name.clone();
        let host = base.host_memory().map(|reg| {
            let fan = FanOut::default();
            fan.add(0, reg);
            Arc::new(fan)
        });
        Contexts {
            base,
            make,
            max: max.min(abi::MAX_CONTEXT_ID),
            slots: BTreeMap::new(),
            current: 0,
            host,
            cost: 0,
            spare: None,
            name,
            started: 0,
            start_ns: 0,
            reused: 0,
        }
    }

    /// Counts `bytes` against the quota for each context besides 0 (what
    /// a GPU context holds of its own: a context per process costs that
    /// much, as a GPU counts it per process).
    pub fn with_cost(mut self, bytes: u64) -> Contexts {
        self.cost = bytes;
        self
    }

    /// The current context's partition, or why there is none.
    fn part(&mut self) -> Result<&mut dyn Partition, OpError> {
        if self.current == 0 {
            return Ok(&mut *self.base);
        }
        match self.slots.get_mut(&self.current) {
            Some(Slot::Live(l)) => Ok(&mut *l.part),
            Some(Slot::Lost { why, .. }) => Err(OpError::ContextLost(why.clone())),
            None => Err(OpError::ContextLost("the context was ended".into())),
        }
    }

    /// The current context's partition's handle of module `module`: a
    /// handle of another context's, or of none, is an unknown module.
    fn inner_module(&self, module: u64) -> Result<u64, OpError> {
        if self.current == 0 || module == abi::MODULE_BUILTIN {
            return Ok(module);
        }
        match self.slots.get(&self.current) {
            Some(Slot::Live(l)) => l
                .modules
                .get(&module)
                .copied()
                .ok_or_else(|| OpError::NotFound(format!("module {module:#x}"))),
            Some(Slot::Lost { why, .. }) => Err(OpError::ContextLost(why.clone())),
            None => Err(OpError::NotFound(format!("module {module:#x}"))),
        }
    }

    /// `steps` with their launches' modules as the current context's
    /// partition names them (an unknown one as a handle no partition
    /// has, so that the step fails there in its turn).
    fn inner_steps<'a>(&self, steps: &[Queued<'a>]) -> Option<Vec<Queued<'a>>> {
        if self.current == 0 {
            return None;
        }
        Some(
            steps
                .iter()
                .map(|s| {
                    s.clone().map(
                        |l| Launch {
                            module: self.inner_module(l.module).unwrap_or(u64::MAX),
                            ..l
                        },
                        |m, _| m,
                    )
                })
                .collect(),
        )
    }

    /// Memory every context holds, bytes, with what each costs.
    fn used(&self) -> u64 {
        let others: u64 = self
            .slots
            .values()
            .map(|s| match s {
                Slot::Live(l) => l.part.memory_used().saturating_add(self.cost),
                Slot::Lost { .. } => 0,
            })
            .sum();
        self.base.memory_used().saturating_add(others)
    }

    /// Ends the current context's partition if a call lost its device
    /// state, or `failed` (a kernel faulted or failed an assertion, which
    /// ends a context on a GPU whether or not this backend lost anything):
    /// its memory goes with it, and its later commands are refused. Other
    /// contexts go on.
    fn check_lost(&mut self, failed: bool) {
        let ctx = self.current;
        if ctx == 0 {
            return;
        }
        let lost =
            matches!(self.slots.get(&ctx), Some(Slot::Live(l)) if failed || l.part.is_lost());
        if !lost {
            return;
        }
        if let Some(Slot::Live(mut l)) = self.slots.remove(&ctx) {
            if let Some(host) = &self.host {
                host.remove(ctx);
            }
            let modules = l.modules.keys().copied().collect();
            // What the kernels printed before the fault still reaches the
            // guest, as a GPU's does.
            let mut consoles = console::Consoles::default();
            for (&outer, &inner) in &l.modules {
                if let Ok(text) = l.part.console(inner, abi::CONSOLE_BYTES as usize) {
                    consoles.push(outer, &text);
                }
            }
            // The partition goes here: its memory is freed, a host
            // process of its own ends.
            drop(l);
            vgpu_sys::warn_limited!(
                "{}: context {ctx} lost its device state; the other contexts go on",
                self.name
            );
            self.slots.insert(
                ctx,
                Slot::Lost {
                    why: format!("context {ctx} lost its device state to a fault"),
                    modules,
                    consoles,
                },
            );
        }
    }

    /// Runs `f` on the current context's partition, then notes a loss.
    fn with<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Partition) -> Result<R, OpError>,
    ) -> Result<R, OpError> {
        let out = f(self.part()?);
        self.check_lost(out.as_ref().is_err_and(OpError::is_lost));
        out
    }

    /// Makes context `ctx`.
    fn make(&mut self, ctx: u32) -> Result<(), OpError> {
        let live = self
            .slots
            .values()
            .filter(|s| matches!(s, Slot::Live(_)))
            .count();
        if self.slots.len() as u64 >= u64::from(self.max) {
            return Err(OpError::NoMemory {
                requested: 0,
                available: 0,
            })
            .inspect_err(|_| {
                vgpu_sys::warn_limited!(
                    "{}: context {ctx} refused: {} contexts in use ({live} live), at most {}",
                    self.name,
                    self.slots.len(),
                    self.max
                )
            });
        }
        let (used, quota) = (self.used(), self.base.spec().memory);
        if used.saturating_add(self.cost) > quota {
            vgpu_sys::warn_limited!(
                "{}: context {ctx} refused: it costs {} bytes, {} of the quota are left",
                self.name,
                self.cost,
                quota.saturating_sub(used)
            );
            return Err(OpError::NoMemory {
                requested: self.cost,
                available: quota.saturating_sub(used),
            });
        }
        let part = match self.spare.take() {
            Some(part) => {
                if let Some(host) = &self.host {
                    host.rekey(SPARE, ctx);
                }
                self.reused += 1;
                part
            }
            None => {
                let t = std::time::Instant::now();
                let part = self.fresh(ctx)?;
                self.started += 1;
                self.start_ns = self.start_ns.saturating_add(t.elapsed().as_nanos() as u64);
                part
            }
        };
        self.slots.insert(
            ctx,
            Slot::Live(Box::new(Live {
                part,
                modules: HashMap::new(),
                next_module: 1,
            })),
        );
        Ok(())
    }

    /// A new partition for context `ctx`, from the backend, announced the
    /// guest memory mapped so far.
    fn fresh(&mut self, ctx: u32) -> Result<Box<dyn Partition>, OpError> {
        let part = (self.make)(self.base.spec()).map_err(|e| {
            vgpu_sys::warn_limited!("{}: context {ctx} could not be made: {e}", self.name);
            match e {
                BackendError::DoesNotFit(_) => OpError::NoMemory {
                    requested: 0,
                    available: 0,
                },
                BackendError::Unavailable(why) => OpError::Device(why),
            }
        })?;
        if let Some(host) = &self.host {
            if let Some(reg) = part.host_memory() {
                host.add(ctx, reg);
            }
        }
        Ok(part)
    }

    /// The partitions besides context 0's, by context: every live
    /// context's, and the spare's as [`SPARE`].
    fn others<'a>(
        slots: &'a mut BTreeMap<u32, Slot>,
        spare: &'a mut Option<Box<dyn Partition>>,
    ) -> impl Iterator<Item = (u32, &'a mut Box<dyn Partition>)> {
        let live = slots.iter_mut().filter_map(|(&ctx, s)| match s {
            Slot::Live(l) => Some((ctx, &mut l.part)),
            Slot::Lost { .. } => None,
        });
        live.chain(spare.as_mut().map(|p| (SPARE, p)))
    }

    /// Runs `step` on context 0's partition, every live context's and the
    /// spare, summing what they return; on the first failure runs `undo`
    /// on those done and returns it.
    fn each_context(
        &mut self,
        step: impl Fn(&mut dyn Partition) -> Result<u64, OpError>,
        undo: impl Fn(&mut dyn Partition),
    ) -> Result<u64, OpError> {
        let mut parts: Vec<&mut Box<dyn Partition>> = vec![&mut self.base];
        parts.extend(Self::others(&mut self.slots, &mut self.spare).map(|(_, p)| p));
        let mut total = 0u64;
        for i in 0..parts.len() {
            match step(&mut **parts[i]) {
                Ok(n) => total = total.saturating_add(n),
                Err(e) => {
                    for p in &mut parts[..i] {
                        undo(&mut ***p);
                    }
                    return Err(e);
                }
            }
        }
        Ok(total)
    }

    /// Ends live context `ctx`'s partition: reset and kept as the spare
    /// when there is none and it lost nothing, else dropped.
    fn retire(&mut self, ctx: u32, mut part: Box<dyn Partition>) {
        if self.spare.is_none() && !part.is_lost() {
            part.reset();
            if !part.is_lost() {
                if let Some(host) = &self.host {
                    host.rekey(ctx, SPARE);
                }
                self.spare = Some(part);
                return;
            }
        }
        if let Some(host) = &self.host {
            host.remove(ctx);
        }
    }
}

impl Partition for Contexts {
    fn spec(&self) -> &PartitionSpec {
        self.base.spec()
    }

    fn kernel_compute_units(&self) -> u32 {
        self.base.kernel_compute_units()
    }

    // Every context's partition comes from the same backend as the base.
    fn cooperative(&self) -> bool {
        self.base.cooperative()
    }

    fn has_vmm(&self) -> bool {
        self.base.has_vmm()
    }

    /// Each context has its own reservations, physical allocations and
    /// mappings (a GPU's are per context), freed when it ends; physical
    /// allocations share the quota as allocations do.
    fn vmm(&mut self, op: &crate::vmm::VmmOp) -> Result<u64, OpError> {
        if let crate::vmm::VmmOp::Create { size } = *op {
            let used = self.used();
            let quota = self.base.spec().memory;
            if used.saturating_add(size) > quota {
                return Err(OpError::NoMemory {
                    requested: size,
                    available: quota.saturating_sub(used),
                });
            }
        }
        self.with(|p| p.vmm(op))
    }

    fn arrays(&self) -> bool {
        self.base.arrays()
    }

    fn resource(&mut self, req: &crate::arrays::Resource) -> Result<u64, OpError> {
        // An array's memory is the context's, within the shared quota.
        if let crate::arrays::Resource::ArrayCreate(c) = req {
            let size = crate::arrays::ArrayDesc::of(c)?.bytes();
            let used = self.used();
            let quota = self.base.spec().memory;
            if used.saturating_add(size) > quota {
                return Err(OpError::NoMemory {
                    requested: size,
                    available: quota.saturating_sub(used),
                });
            }
        }
        self.with(|p| p.resource(req))
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        // The contexts share the quota.
        let used = self.used();
        let quota = self.base.spec().memory;
        if used.saturating_add(size) > quota {
            return Err(OpError::NoMemory {
                requested: size,
                available: quota.saturating_sub(used),
            });
        }
        self.with(|p| p.alloc(size, align))
    }

    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.with(|p| p.free(addr))
    }

    fn upload(&mut self, dst: u64, src: &dyn crate::HostSource) -> Result<(), OpError> {
        self.with(|p| p.upload(dst, src))
    }

    fn download(&mut self, src: u64, dst: &dyn crate::HostSink) -> Result<(), OpError> {
        self.with(|p| p.download(src, dst))
    }

    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.with(|p| p.copy(dst, src, size))
    }

    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.with(|p| p.fill(addr, size, pattern))
    }

    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        let inner = self.with(|p| p.module_load(format, image))?;
        let ctx = self.current;
        match self.slots.get_mut(&ctx) {
            None => Ok(inner),
            Some(Slot::Live(l)) => {
                let handle = MODULE_TAG | u64::from(ctx) << 32 | u64::from(l.next_module);
                l.next_module = l.next_module.checked_add(1).unwrap_or(1);
                l.modules.insert(handle, inner);
                Ok(handle)
            }
            Some(Slot::Lost { why, .. }) => Err(OpError::ContextLost(why.clone())),
        }
    }

    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        let inner = self.inner_module(module)?;
        self.with(|p| p.module_unload(inner))?;
        if let Some(Slot::Live(l)) = self.slots.get_mut(&self.current) {
            l.modules.remove(&module);
        }
        Ok(())
    }

    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        let module = self.inner_module(launch.module)?;
        self.with(|p| {
            p.launch(&Launch {
                module,
                ..launch.clone()
            })
        })
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        let inner = self.inner_steps(steps);
        let steps = inner.as_deref().unwrap_or(steps);
        let done = match self.part() {
            Ok(p) => p.run_queued(steps, stop),
            Err(e) => QueuedDone::all_failed(steps.len(), &e),
        };
        self.check_lost(any_lost(&done));
        done
    }

    fn queue_depth(&self) -> usize {
        self.base.queue_depth()
    }

    fn lanes(&self) -> usize {
        self.base.lanes()
    }

    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        held: bool,
    ) -> Started {
        let inner = self.inner_steps(steps);
        let steps = inner.as_deref().unwrap_or(steps);
        let started = match self.part() {
            Ok(p) => p.start_queued(lane, steps, stop, held),
            Err(e) => Started::Done(QueuedDone::all_failed(steps.len(), &e)),
        };
        self.check_lost(matches!(&started, Started::Done(d) if any_lost(d)));
        started
    }

    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        let out = self.part().ok()?.finish_queued();
        self.check_lost(out.as_ref().is_some_and(|(_, f)| any_lost(&f.done)));
        out
    }

    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        let Ok(p) = self.part() else {
            return Finishing::Idle;
        };
        let out = p.finish_queued_within(within);
        self.check_lost(matches!(&out, Finishing::Done(_, f) if any_lost(&f.done)));
        out
    }

    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        let module = self.inner_module(launch.module)?;
        self.with(|p| {
            p.max_active_clusters(&Launch {
                module,
                ..launch.clone()
            })
        })
    }

    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        let inner = self.inner_module(module)?;
        self.with(|p| p.function_info(inner, entry))
    }

    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        let inner = self.inner_module(module)?;
        self.with(|p| p.global_info(inner, name))
    }

    fn memory_used(&self) -> u64 {
        self.used()
    }

    /// What the contexts hold together, their own costs with it, must
    /// fit; context 0 holds the reservation, and every other context's
    /// partition is held to the same quota (the sum is this wrapper's).
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        let used = self.used();
        if memory < used {
            return Err(OpError::Invalid(format!(
                "a quota of {memory} bytes is less than the {used} its contexts hold"
            )));
        }
        self.base.set_memory(memory)?;
        for (ctx, part) in Self::others(&mut self.slots, &mut self.spare) {
            if let Err(e) = part.set_memory(memory) {
                // Its own quota stays; this wrapper's sum still governs.
                vgpu_sys::warn_limited!("{}: context {ctx} kept its quota: {e}", self.name);
            }
        }
        Ok(())
    }

    /// Every context goes out and comes back together; one that cannot
    /// puts back those that went.
    fn suspend(&mut self) -> Result<u64, OpError> {
        self.each_context(
            |p| p.suspend(),
            |p| {
                let _ = p.resume();
            },
        )
    }

    fn resume(&mut self) -> Result<u64, OpError> {
        self.each_context(
            |p| p.resume(),
            |p| {
                let _ = p.suspend();
            },
        )
    }

    fn console(&mut self, module: u64, max: usize) -> Result<console::ConsoleText, OpError> {
        if let Some(Slot::Lost { consoles, .. }) = self.slots.get_mut(&self.current) {
            return Ok(consoles.take(module, max));
        }
        let inner = self.inner_module(module)?;
        self.with(|p| p.console(inner, max))
    }

    fn reset(&mut self) {
        for (ctx, slot) in std::mem::take(&mut self.slots) {
            match slot {
                Slot::Live(l) => self.retire(ctx, l.part),
                Slot::Lost { .. } => {
                    if let Some(host) = &self.host {
                        host.remove(ctx);
                    }
                }
            }
        }
        self.current = 0;
        self.base.reset();
    }

    fn is_lost(&self) -> bool {
        // Only context 0's loss is the function's.
        self.base.is_lost()
    }

    fn watch_interval(&self) -> Option<std::time::Duration> {
        self.base.watch_interval()
    }

    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        let host = self.host.as_ref()?;
        Some(Arc::clone(host) as Arc<dyn HostMemory>)
    }

    fn set_context(&mut self, ctx: u32) -> Result<(), OpError> {
        if ctx > abi::MAX_CONTEXT_ID {
            return Err(OpError::Invalid(format!("context {ctx}")));
        }
        if ctx != 0 && !self.slots.contains_key(&ctx) {
            self.make(ctx)?;
        }
        // A lost context is current too: its calls are refused one by
        // one, but what its kernels printed can still be taken.
        self.current = ctx;
        Ok(())
    }

    fn end_context(&mut self, ctx: u32) -> Result<Vec<u64>, OpError> {
        if ctx == 0 || ctx > abi::MAX_CONTEXT_ID {
            return Err(OpError::Invalid(format!("context {ctx} cannot be ended")));
        }
        if self.current == ctx {
            self.current = 0;
        }
        Ok(match self.slots.remove(&ctx) {
            None => Vec::new(),
            Some(Slot::Lost { modules, .. }) => {
                if let Some(host) = &self.host {
                    host.remove(ctx);
                }
                modules
            }
            Some(Slot::Live(l)) => {
                let modules = l.modules.keys().copied().collect();
                self.retire(ctx, l.part);
                modules
            }
        })
    }

    fn contexts(&self) -> Option<ContextCounts> {
        Some(ContextCounts {
            now: self.slots.len() as u32,
            max: self.max,
            started: self.started,
            start_ns: self.start_ns,
            reused: self.reused,
            cost: self.cost,
            memory: self.cost.saturating_mul(
                self.slots
                    .values()
                    .filter(|s| matches!(s, Slot::Live(_)))
                    .count() as u64,
            ),
        })
    }
}

/// Whether a step of a run failed in a way that ends a context.
fn any_lost(done: &[QueuedDone]) -> bool {
    done.iter()
        .any(|d| d.result.as_ref().is_err_and(OpError::is_lost))
}

/// Guest memory mapped into this process, announced to the registry of
/// every context that can use it, including those made after the
/// mapping.
#[derive(Default)]
struct FanOut {
    state: Mutex<FanState>,
}

#[derive(Default)]
struct FanState {
    /// The mappings now, by id.
    maps: BTreeMap<u64, HostMapping>,
    /// Each context's registry.
    regs: Vec<(u32, Arc<dyn HostMemory>)>,
}

impl FanOut {
    /// Adds context `ctx`'s registry and announces every mapping to it.
    fn add(&self, ctx: u32, reg: Arc<dyn HostMemory>) {
        let mut st = vgpu_sys::lock(&self.state);
        for m in st.maps.values() {
            reg.mapped(m.clone());
        }
        st.regs.push((ctx, reg));
    }

    /// Forgets context `ctx`'s registry.
    fn remove(&self, ctx: u32) {
        vgpu_sys::lock(&self.state).regs.retain(|(c, _)| *c != ctx);
    }

    /// Files context `from`'s registry under `to`.
    fn rekey(&self, from: u32, to: u32) {
        for (c, _) in vgpu_sys::lock(&self.state).regs.iter_mut() {
            if *c == from {
                *c = to;
            }
        }
    }
}

impl HostMemory for FanOut {
    fn mapped(&self, mapping: HostMapping) {
        let mut st = vgpu_sys::lock(&self.state);
        for (_, reg) in &st.regs {
            reg.mapped(mapping.clone());
        }
        st.maps.insert(mapping.id, mapping);
    }

    fn unmapped(&self, id: u64) {
        // Removed first, so a context made meanwhile never gets it; the
        // registries are told without the lock, since they may wait.
        let regs: Vec<Arc<dyn HostMemory>> = {
            let mut st = vgpu_sys::lock(&self.state);
            st.maps.remove(&id);
            st.regs.iter().map(|(_, r)| Arc::clone(r)).collect()
        };
        for reg in regs {
            reg.unmapped(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry that writes down what it is told.
    #[derive(Default)]
    struct Notes(Mutex<Vec<String>>);

    impl HostMemory for Notes {
        fn mapped(&self, m: HostMapping) {
            vgpu_sys::lock(&self.0).push(format!("map {}", m.id));
        }
        fn unmapped(&self, id: u64) {
            vgpu_sys::lock(&self.0).push(format!("unmap {id}"));
        }
    }

    fn mapping(id: u64) -> HostMapping {
        let file = vgpu_sys::memfd::create(c"contexts-test", 4096).expect("memfd");
        HostMapping {
            id,
            addr: 0x1000 * id as usize,
            len: 4096,
            readable: true,
            writable: true,
            file: Arc::new(file),
            file_offset: 0,
        }
    }

    fn notes(n: &Notes) -> Vec<String> {
        vgpu_sys::lock(&n.0).clone()
    }

    #[test]
    fn test_a_context_made_later_gets_the_mappings_of_before() {
        let fan = FanOut::default();
        let first = Arc::new(Notes::default());
        fan.add(0, first.clone());
        fan.mapped(mapping(1));
        fan.mapped(mapping(2));
        fan.unmapped(1);
        let later = Arc::new(Notes::default());
        fan.add(5, later.clone());
        assert_eq!(notes(&later), ["map 2"]);
        fan.unmapped(2);
        assert_eq!(notes(&first), ["map 1", "map 2", "unmap 1", "unmap 2"]);
        assert_eq!(notes(&later), ["map 2", "unmap 2"]);
        // An ended context hears nothing more.
        fan.remove(5);
        fan.mapped(mapping(3));
        assert_eq!(notes(&later), ["map 2", "unmap 2"]);
        assert_eq!(notes(&first).last().map(String::as_str), Some("map 3"));
    }

    /// Contexts of an 8 MiB software partition of a 16 MiB backend, at
    /// most `max`, and a count of the partitions the backend made for
    /// them; the backend too, to see what capacity is left.
    fn software_contexts(
        max: u32,
    ) -> (
        Contexts,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<crate::software::SoftwareBackend>,
    ) {
        let backend = Arc::new(crate::software::SoftwareBackend::new(16 << 20, 2));
        let spec = PartitionSpec {
            name: "contexts".into(),
            memory: 8 << 20,
            compute_units: 1,
        };
        let base = crate::Backend::create_partition(&*backend, &spec).expect("partition");
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (b, m) = (Arc::clone(&backend), Arc::clone(&made));
        let make: ContextFactory = Box::new(move |spec| {
            m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            crate::Backend::create_context(&*b, spec)
        });
        (Contexts::new(base, make, max), made, backend)
    }

    #[test]
    fn test_contexts_offer_and_run_cooperative_launches() {
        let make = |_: &PartitionSpec| -> Box<dyn Partition> {
            let (mut c, _, _) = software_contexts(2);
            assert!(c.cooperative());
            c.set_context(1).expect("context 1");
            Box::new(c)
        };
        crate::conformance::module_cooperative_grid_sync(&make);
    }

    #[test]
    fn test_contexts_share_the_quota_and_end_with_their_memory() {
        let (mut c, _, backend) = software_contexts(2);
        c.set_context(1).expect("context 1");
        c.alloc(6 << 20, 256).expect("6 MiB in context 1");
        c.set_context(2).expect("context 2");
        assert!(matches!(
            c.alloc(4 << 20, 256),
            Err(OpError::NoMemory { available, .. }) if available == 2 << 20
        ));
        c.alloc(2 << 20, 256).expect("what is left");
        assert_eq!(c.memory_used(), 8 << 20);
        assert_eq!(c.contexts().map(|n| (n.now, n.max)), Some((2, 2)));
        assert!(matches!(c.set_context(3), Err(OpError::NoMemory { .. })));
        assert_eq!(c.end_context(1), Ok(Vec::new()));
        assert_eq!(c.memory_used(), 2 << 20);
        c.reset();
        assert_eq!(c.memory_used(), 0);
        assert_eq!(c.contexts().map(|n| (n.now, n.max)), Some((0, 2)));
        // The partition's reservation covers its contexts: they took
        // nothing of the backend's capacity.
        c.set_context(1).expect("context 1 again");
        let other = PartitionSpec {
            name: "other".into(),
            memory: 8 << 20,
            compute_units: 1,
        };
        assert!(crate::Backend::create_partition(&*backend, &other).is_ok());
    }

    #[test]
    fn test_a_resize_holds_every_context_to_the_new_quota() {
        let (mut c, _, backend) = software_contexts(3);
        c.set_context(1).expect("context 1");
        c.alloc(6 << 20, 256).expect("6 MiB in context 1");
        c.end_context(1).expect("end: its partition is the spare");
        c.set_context(2).expect("context 2");
        c.alloc(6 << 20, 256).expect("6 MiB in context 2");
        assert!(matches!(c.set_memory(4 << 20), Err(OpError::Invalid(_))));
        assert_eq!(c.spec().memory, 8 << 20, "a refusal changes nothing");
        // 16 MiB, 8 of them the partition's: growing by 10 does not fit.
        assert!(matches!(
            c.set_memory(18 << 20),
            Err(OpError::NoMemory { available, .. }) if available == 8 << 20
        ));
        c.set_memory(14 << 20).expect("grow by 6 MiB");
        assert_eq!(backend.unclaimed().memory, 2 << 20);
        // Each context's partition, the spare and new ones too, may use
        // the new quota.
        c.alloc(7 << 20, 256).expect("13 MiB in context 2");
        c.set_context(1).expect("context 1, from the spare");
        assert!(matches!(
            c.alloc(2 << 20, 256),
            Err(OpError::NoMemory { .. })
        ));
        c.alloc(1 << 20, 256).expect("the last MiB");
        c.set_context(3).expect("context 3");
        c.end_context(1).expect("end");
        c.end_context(2).expect("end");
        c.set_context(3).expect("context 3");
        c.alloc(14 << 20, 256).expect("all of it in a new context");
        c.end_context(3).expect("end");
        c.set_memory(1 << 20).expect("shrink");
        assert_eq!(backend.unclaimed().memory, 15 << 20);
    }

    #[test]
    fn test_each_context_costs_its_share_of_the_quota() {
        let (c, _, _) = software_contexts(8);
        let mut c = c.with_cost(3 << 20);
        c.set_context(1).expect("context 1");
        assert_eq!(
            c.memory_used(),
            3 << 20,
            "a context costs before it allocates"
        );
        c.set_context(2).expect("context 2");
        assert!(matches!(
            c.alloc(3 << 20, 256),
            Err(OpError::NoMemory { .. })
        ));
        c.alloc(2 << 20, 256).expect("what is left");
        // No room for a third context's own memory.
        assert!(matches!(
            c.set_context(3),
            Err(OpError::NoMemory { requested, .. }) if requested == 3 << 20
        ));
        c.end_context(2).expect("end");
        c.set_context(3).expect("room again");
    }

    #[test]
    fn test_one_cleanly_ended_context_is_kept_for_the_next() {
        use std::sync::atomic::Ordering;
        let (mut c, made, _) = software_contexts(4);
        c.set_context(1).expect("context 1");
        c.alloc(1 << 20, 256).expect("alloc");
        c.end_context(1).expect("end");
        assert_eq!(c.memory_used(), 0);
        // The next context takes the ended one's partition, emptied.
        c.set_context(2).expect("context 2");
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert_eq!(c.memory_used(), 0);
        c.alloc(1 << 20, 256).expect("alloc");
        // One spare at most: a second ended context's partition goes.
        c.set_context(3).expect("context 3");
        assert_eq!(made.load(Ordering::SeqCst), 2);
        c.end_context(2).expect("end");
        c.end_context(3).expect("end");
        c.set_context(4).expect("context 4");
        c.set_context(5).expect("context 5");
        assert_eq!(made.load(Ordering::SeqCst), 3);
        let n = c.contexts().expect("contexts");
        assert_eq!((n.started, n.reused), (3, 2));
    }

    #[test]
    fn test_a_lost_context_refuses_its_calls_but_keeps_what_it_printed() {
        use crate::conformance::{launch_loaded, Params, ASSERT_PTX};
        let (mut c, _, _) = software_contexts(4);
        c.set_context(1).expect("context 1");
        let m = c
            .module_load(abi::MODULE_FORMAT_PTX, ASSERT_PTX.as_bytes())
            .expect("module");
        let failed = launch_loaded(
            &mut c,
            m,
            "check",
            [1, 1, 1],
            [2, 1, 1],
            &Params::default().u32(0),
        );
        assert!(
            matches!(failed, Err(OpError::KernelAssert(_))),
            "{failed:?}"
        );
        assert_eq!(c.memory_used(), 0, "its memory went with it");
        assert!(matches!(c.alloc(4096, 256), Err(OpError::ContextLost(_))));
        assert!(matches!(
            c.function_info(m, "check"),
            Err(OpError::ContextLost(_))
        ));
        // The assertion's lines are still there, once.
        let text = c.console(m, abi::CONSOLE_BYTES as usize).expect("console");
        let text = String::from_utf8_lossy(&text.text).into_owned();
        assert!(text.contains("Assertion `v != 0` failed."), "{text:?}");
        let again = c.console(m, abi::CONSOLE_BYTES as usize).expect("console");
        assert!(again.text.is_empty());
        // Other contexts go on; the ended one's number is free again.
        c.set_context(2).expect("context 2");
        c.alloc(4096, 256).expect("alloc in context 2");
        assert_eq!(c.end_context(1), Ok(vec![m]));
        c.set_context(1).expect("context 1 anew");
        c.alloc(4096, 256).expect("alloc in the new context 1");
    }
}
