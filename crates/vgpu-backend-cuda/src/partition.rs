//! A partition of a [`CudaBackend`](crate::CudaBackend): its share of the
//! device, its allocation table and the checks of the device's rules
//! ([`vgpu_backend::rules`]) before any device work, which
//! [`DeviceState`] does.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use log::{debug, info, log_enabled, trace, warn, Level};
use vgpu_abi as abi;
use vgpu_backend::arrays::{ArrayCopy, ArrayDesc, CopySide, ObjectDesc, Resource};
use vgpu_backend::console::{self, ConsoleText, Consoles};
use vgpu_backend::rules::{
    self, align_up, Allocations, Builtin, FloatOperands, KernelLimits, PartitionName, DEFAULT_ALIGN,
};
use vgpu_backend::vmm::{Vmm, VmmOp};
use vgpu_backend::{
    BackendError, DeviceCopy, DeviceFill, Finished, Finishing, FunctionInfo, HostMemory, HostSink,
    HostSource, Launch, OpError, Partition, PartitionSpec, Queued, QueuedDone, SliceMemory,
    Started, MAX_QUEUED_STEPS,
};

use crate::device::{describe, At, DeviceState, Fail, Module, Owner};
use crate::driver::{self, Current, ResourceDesc, SmResource};
use crate::hostmem::HostRegistry;
use crate::{lock, Mode, Shared};

/// A vGPU's share of a CUDA device.
pub struct CudaPartition {
    spec: PartitionSpec,
    shared: Arc<Shared>,
    /// SM groups held (spatial mode).
    groups: Vec<usize>,
    /// Their resource descriptor (spatial mode).
    desc: Option<ResourceDesc>,
    /// SMs its kernels run on.
    sms: u32,
    /// Allocations, each with what cuMemAlloc returned for it (what gets
    /// freed; the allocation starts at the first aligned address in it).
    allocs: Allocations<Backing>,
    /// Virtual memory: reservations, mappings and physical allocations
    /// (the driver's handles), all the driver's own; ranges are reached
    /// where mapped with access.
    vmm: Vmm<u64>,
    dev: Option<DeviceState>,
    /// Why the partition cannot run commands until reset: its context hit
    /// a sticky error, or could not be created.
    lost: Option<String>,
    last_device_time: Option<Duration>,
    /// Guest memory registered for direct copies.
    host: HostRegistry,
    /// Whether the last upload or download went straight from or to
    /// registered memory.
    last_direct: bool,
    /// Loaded modules whose kernels may print.
    printing: HashSet<u64>,
    /// What they printed.
    consoles: Consoles,
    /// Per lane, queued runs on its stream, not yet waited for, oldest
    /// first, each with its number of steps.
    in_flight: [VecDeque<(OnStream, usize)>; LANES],
    /// Sets of events no run holds.
    free_slots: Vec<usize>,
    /// Bytes of the arrays in the context, charged to the quota.
    array_bytes: u64,
}

// SAFETY: the driver handles in a partition may be used from any thread;
// every operation makes the partition's context current on the calling
// thread for its duration (and pops it), and `&mut self` serialises them.
unsafe impl Send for CudaPartition {}

impl std::fmt::Debug for CudaPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPartition")
            .field("spec", &self.spec)
            .field("sms", &self.sms)
            .field("memory_used", &self.allocs.used())
            .field("lost", &self.lost)
            .finish()
    }
}

impl CudaPartition {
    pub(crate) fn create(
        shared: Arc<Shared>,
        spec: &PartitionSpec,
    ) -> Result<CudaPartition, BackendError> {
        let mut pool = lock(&shared.pool);
        let mut short = Vec::new();
        if spec.memory > pool.memory {
            short.push(format!(
                "{} bytes of memory requested, {} left",
                spec.memory, pool.memory
            ));
        }
        let mut groups = Vec::new();
        match shared.mode {
            Mode::Isolated => {
                if spec.compute_units > pool.compute_units {
                    short.push(format!(
                        "{} compute units requested, {} left",
                        spec.compute_units, pool.compute_units
                    ));
                }
            }
            Mode::Spatial => {
                let granule = shared.sm_granule;
                if spec.compute_units == 0 || !spec.compute_units.is_multiple_of(granule) {
                    short.push(format!(
                        "spatial partitions take SMs in multiples of {granule}, {} requested",
                        spec.compute_units
                    ));
                } else {
                    let mut got = 0;
                    for &i in &pool.free_groups {
                        if got >= spec.compute_units {
                            break;
                        }
                        if got + shared.groups[i].sms <= spec.compute_units {
                            got += shared.groups[i].sms;
                            groups.push(i);
                        }
                    }
                    if got != spec.compute_units {
                        short.push(format!(
                            "{} SMs requested, {} left",
                            spec.compute_units, pool.compute_units
                        ));
                        groups.clear();
                    }
                }
            }
        }
        if !short.is_empty() {
            let why = format!("partition {:?}: {}", spec.name, short.join("; "));
            warn!("cuda backend: {why}");
            return Err(BackendError::DoesNotFit(why));
        }
        pool.memory -= spec.memory;
        pool.compute_units -= spec.compute_units;
        for i in &groups {
            pool.free_groups.remove(i);
        }
        drop(pool);

        let sms = match shared.mode {
            Mode::Isolated => shared.device_sms,
            Mode::Spatial => spec.compute_units,
        };
        // From here on, dropping the partition gives its share back.
        let host = HostRegistry::new(shared.clone(), &spec.name);
        let mut p = CudaPartition {
            spec: spec.clone(),
            host,
            last_direct: false,
            printing: HashSet::new(),
            consoles: Consoles::default(),
            in_flight: Default::default(),
            free_slots: (0..MARK_SLOTS).collect(),
            array_bytes: 0,
            shared,
            groups,
            desc: None,
            sms,
            allocs: Allocations::default(),
            vmm: Vmm::default(),
            dev: None,
            lost: None,
            last_device_time: None,
        };
        if p.shared.mode == Mode::Spatial {
            // SM groups of the backend's one split of this device (the
            // API's condition for combining them).
            let res: Vec<SmResource> = p
                .groups
                .iter()
                .map(|&i| p.shared.groups[i].resource)
                .collect();
            let desc = driver::resource_desc(&res).map_err(|e| {
                BackendError::Unavailable(format!("SM resource descriptor for {sms} SMs: {e}"))
            })?;
            p.desc = Some(desc);
        }
        let dev = p.create_state().map_err(|f| {
            BackendError::Unavailable(format!("partition {:?}: {}", spec.name, describe(&f)))
        })?;
        p.dev = Some(dev);
        info!(
            "cuda backend: partition {:?} created ({} bytes, {} {})",
            p.spec.name,
            p.spec.memory,
            p.spec.compute_units,
            match p.shared.mode {
                Mode::Isolated => "SM share, own context",
                Mode::Spatial => "SMs, green context",
            }
        );
        Ok(p)
    }

    /// Device time of the last command, as CUDA events around its device
    /// work saw it; `None` after a command with no device work (alloc,
    /// free, module load, an empty copy) or a failed one.
    pub fn last_device_time(&self) -> Option<Duration> {
        self.last_device_time
    }

    /// The partition's registry of guest memory (what
    /// [`Partition::host_memory`] hands out).
    pub fn host_registry(&self) -> &HostRegistry {
        &self.host
    }

    /// Whether the last upload or download went straight from or to
    /// registered guest memory (rather than through the staging buffers).
    pub fn last_copy_was_direct(&self) -> bool {
        self.last_direct
    }

    /// SMs the partition's kernels run on (the whole device in isolated
    /// mode, its own group in spatial mode).
    pub fn sm_count(&self) -> u32 {
        self.sms
    }

    /// Why the partition refuses commands until reset, if it does.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    fn available(&self) -> u64 {
        self.spec.memory.saturating_sub(self.memory_used())
    }

    /// Checks `len` bytes at `addr` lie inside one allocation, or in
    /// mappings side by side that the device may read (and, with
    /// `write`, write).
    fn check_range(&self, addr: u64, len: u64, write: bool) -> Result<(), OpError> {
        self.allocs
            .check(addr, len)
            .or_else(|e| match self.vmm.accessible(addr, len, write) {
                true => Ok(()),
                false => Err(e),
            })
    }

    /// Gives the driver back what virtual memory the partition holds:
    /// mappings, physical allocations and reservations (the process's,
    /// which no context's end frees). Its context is current.
    fn release_vmm(&mut self) {
        for (&addr, m) in self.vmm.mappings() {
            let _ = driver::mem_unmap(addr, m.size as usize);
        }
        let reservations: Vec<(u64, u64)> = self
            .vmm
            .reservations()
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect();
        for p in self.vmm.drain() {
            let _ = driver::mem_release(p.data);
        }
        for (addr, size) in reservations {
            let _ = driver::mem_address_free(addr, size as usize);
        }
    }

    /// A new context for this partition.
    fn create_state(&self) -> Result<DeviceState, Fail> {
        if let Some(why) = crate::cuda_lost() {
            return Err(Fail::Op(OpError::Lost(crate::lost_message(why))));
        }
        DeviceState::create(&self.shared, self.desc, self.sms)
    }

    /// Runs `f` with the partition's context current. A partition left
    /// without a context by a reset tries to get one first.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut DeviceState) -> Result<T, Fail>,
    ) -> Result<T, OpError> {
        if let Some(why) = crate::cuda_lost() {
            return Err(OpError::Lost(format!(
                "partition {:?}: {}",
                self.spec.name,
                crate::lost_message(why)
            )));
        }
        if self.dev.is_none() {
            if let Ok(dev) = self.create_state() {
                info!(
                    "cuda backend: partition {:?}: context recreated",
                    self.spec.name
                );
                self.dev = Some(dev);
                self.lost = None;
            }
        }
        let r = match (&self.lost, self.dev.as_mut()) {
            (None, Some(dev)) => match Current::push(dev.owner.ctx()) {
                Ok(cur) => {
                    let r = f(dev);
                    drop(cur);
                    r
                }
                Err(e) => Err(Fail::Cuda("making the context current".into(), e)),
            },
            (Some(why), _) => {
                return Err(OpError::Lost(format!(
                    "partition {:?}: {why}; reset required",
                    self.spec.name
                )))
            }
            (None, None) => {
                return Err(OpError::Device(format!(
                    "partition {:?} has no CUDA context",
                    self.spec.name
                )))
            }
        };
        r.map_err(|f| self.failed(f))
    }

    fn failed(&mut self, f: Fail) -> OpError {
        match f {
            Fail::Op(e) => e,
            Fail::Cuda(what, e) | Fail::Refused(what, e) if e.is_sticky() => {
                // A sticky error is the process's, not the context's: every
                // context of the process fails from now on.
                let why = format!("partition {:?}: {what}: {e}", self.spec.name);
                crate::mark_lost(&why);
                self.lost = Some(why.clone());
                if e.is_memory_fault() {
                    OpError::KernelFault(crate::lost_message(&why))
                } else if e.is_assert() {
                    OpError::KernelAssert(crate::lost_message(&why))
                } else {
                    OpError::Lost(crate::lost_message(&why))
                }
            }
            Fail::Cuda(what, e) => OpError::Device(format!("{what}: {e}")),
            Fail::Refused(what, e) => OpError::Invalid(format!("{what}: {e}")),
        }
    }

    /// Frees the allocations and destroys the context.
    fn teardown(&mut self) {
        self.printing.clear();
        self.consoles.clear();
        // Their events go with the context.
        self.in_flight = Default::default();
        self.free_slots = (0..MARK_SLOTS).collect();
        let allocs = self.allocs.drain();
        if !self.vmm.is_empty() {
            match self.dev.as_ref().map(|d| Current::push(d.owner.ctx())) {
                Some(Ok(_cur)) => {
                    if let Some(d) = &self.dev {
                        d.sync_all();
                    }
                    self.release_vmm();
                }
                // Without a context the process's CUDA is gone with it.
                _ => {
                    self.vmm.drain();
                }
            }
        }
        // Arrays go with the context (or its InContext, below).
        self.array_bytes = 0;
        if let Some(dev) = self.dev.take() {
            // An own context frees its memory when destroyed; a green
            // context's memory belongs to the primary context.
            if matches!(dev.owner, Owner::Green(..)) {
                if let Ok(_cur) = Current::push(dev.owner.ctx()) {
                    dev.sync_all();
                    for a in &allocs {
                        if let Backing::Alloc(base) = a.data {
                            let _ = driver::mem_free(base);
                        }
                    }
                }
            }
            drop(dev);
        }
    }

    /// Keeps what the driver printed since the last look for `module`,
    /// the printing module whose kernels ran last: the driver prints at
    /// the synchronisation that ends a launch or a run, and says nothing
    /// of which kernel printed what, so a run of several printing modules
    /// gives all its output to the last.
    fn collect_printed(&mut self, module: Option<u64>) {
        let (Some(module), Some(capture)) = (module, self.shared.printf.get()) else {
            return;
        };
        self.consoles.push(module, &capture.take());
    }

    /// The module of the last launch of a printing module among `launches`.
    fn printer<'l>(
        &self,
        launches: impl DoubleEndedIterator<Item = &'l Launch<'l>>,
    ) -> Option<u64> {
        launches
            .rev()
            .map(|l| l.module)
            .find(|m| self.printing.contains(m))
    }

    /// [`Partition::run_queued`]: the steps go onto the stream back to
    /// back, an event after each, and one wait for the last; the events
    /// give each step's end on the device's clock.
    fn queue_steps(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
    ) -> Result<Vec<QueuedDone>, OpError> {
        let run = self.enqueue_steps(lane, steps)?;
        self.wait_steps(run)
    }

    /// Puts `steps` on lane `lane`'s stream, each ended by an event of a
    /// set of marks of its own (so that runs in flight together keep
    /// theirs).
    fn enqueue_steps(&mut self, lane: usize, steps: &[Queued<'_>]) -> Result<OnStream, OpError> {
        let slot = self
            .free_slots
            .pop()
            .ok_or_else(|| OpError::Invalid("more queued runs in flight than allowed".into()))?;
        let run = self.enqueue_in_slot(lane, slot, steps);
        if run.is_err() {
            self.free_slots.push(slot);
        }
        run
    }

    fn enqueue_in_slot(
        &mut self,
        lane: usize,
        slot: usize,
        steps: &[Queued<'_>],
    ) -> Result<OnStream, OpError> {
        self.last_device_time = None;
        let base = slot * MARKS_PER_RUN;
        // Built-in launches are planned against the allocation table
        // before the context is entered.
        let plans: Vec<Option<Result<Builtin, OpError>>> = steps
            .iter()
            .map(|s| match s {
                Queued::Launch(l) if l.module == abi::MODULE_BUILTIN => Some(
                    rules::plan_builtin_launch(l, &self.allocs, FloatOperands::Aligned),
                ),
                _ => None,
            })
            .collect();
        // Copies' and fills' device ranges are checked the same way.
        let ranges: Vec<Result<(), OpError>> = steps
            .iter()
            .map(|s| match s {
                Queued::Upload { dst: a, src: m } => self.check_range(*a, HostSource::len(m), true),
                Queued::Download { src: a, dst: m } => {
                    self.check_range(*a, HostSource::len(m), false)
                }
                Queued::Fill(f) => {
                    fill_size(f.size).and_then(|()| self.check_range(f.addr, f.size, true))
                }
                Queued::Copy(c) => self
                    .check_range(c.dst, c.size, true)
                    .and_then(|()| self.check_range(c.src, c.size, false)),
                _ => Ok(()),
            })
            .collect();
        let available = self.available();
        let optin = self.shared.max_shared_optin;
        let host = self.host.clone();
        let began = log_enabled!(Level::Trace).then(std::time::Instant::now);
        let printer = self.printer(steps.iter().filter_map(|s| match s {
            Queued::Launch(l) => Some(l),
            _ => None,
        }));
        let (ran, mark_of, used) = self.run(|dev| {
            dev.on_lane(lane, |dev| {
                while dev.res.marks.len() <= base + steps.len() {
                    let e = driver::Event::create(true).at("creating an event")?;
                    dev.res.marks.push(e);
                }
                // Kernels are looked up and checked first, so that the steps
                // reach the stream back to back.
                let ready: Vec<Ready<'_, '_>> = steps
                    .iter()
                    .zip(plans)
                    .zip(ranges)
                    .map(|((s, plan), range)| match (s, plan) {
                        (Queued::Timestamp, _) => Ready::Stamp,
                        (Queued::Launch(_), Some(Ok(call))) => Ready::Builtin(call),
                        (Queued::Launch(_), Some(Err(e))) => Ready::Failed(Fail::Op(e)),
                        (Queued::Launch(l), None) => match prepare_loaded(dev, l, optin) {
                            Ok(f) => Ready::Kernel(f, l),
                            Err(e) => Ready::Failed(e),
                        },
                        (Queued::Upload { dst, src }, _) => match range {
                            Ok(()) => Ready::Upload(*dst, src),
                            Err(e) => Ready::Failed(Fail::Op(e)),
                        },
                        (Queued::Download { src, dst }, _) => match range {
                            Ok(()) => Ready::Download(*src, dst),
                            Err(e) => Ready::Failed(Fail::Op(e)),
                        },
                        (Queued::Fill(f), _) => match range {
                            Ok(()) => Ready::Fill(*f),
                            Err(e) => Ready::Failed(Fail::Op(e)),
                        },
                        (Queued::Copy(c), _) => match range {
                            Ok(()) => Ready::Copy(*c),
                            Err(e) => Ready::Failed(Fail::Op(e)),
                        },
                    })
                    .collect();
                driver::event_record(&dev.res.marks[base], &dev.res.stream).at("queued work")?;
                // An event ends each step, except that a launch followed by a
                // timestamp ends with the timestamp's event: the stream then
                // holds what the guest's own event pair around it would.
                let mut ran = Vec::with_capacity(steps.len());
                let mut mark_of = Vec::with_capacity(steps.len());
                let mut next = 1;
                for (i, r) in ready.into_iter().enumerate() {
                    let launch = !matches!(r, Ready::Stamp);
                    ran.push(match r {
                        Ready::Stamp => Ok(()),
                        Ready::Builtin(call) => dev.run_builtin(call, available).map(|_| ()),
                        Ready::Kernel(f, l) => enqueue_loaded(dev, f, l),
                        Ready::Upload(a, m) => dev.enqueue_copy(a, m, &host, true),
                        Ready::Download(a, m) => dev.enqueue_copy(a, m, &host, false),
                        Ready::Fill(f) => dev.fill(f.addr, f.size, f.pattern),
                        Ready::Copy(c) => dev.memmove(c.dst, c.src, c.size),
                        Ready::Failed(e) => Err(e),
                    });
                    mark_of.push(next);
                    if !(launch && matches!(steps.get(i + 1), Some(Queued::Timestamp))) {
                        let mark = &dev.res.marks[base + next];
                        if let Err(e) = driver::event_record(mark, &dev.res.stream) {
                            // Copies queued so far may not outlive their host
                            // memory, which the caller keeps only until this
                            // returns.
                            let _ = driver::stream_sync(&dev.res.stream);
                            return Err(Fail::Cuda("queued work".into(), e));
                        }
                        next += 1;
                    }
                }
                if let Some(began) = began {
                    trace!(
                        "queued {} steps in {} us",
                        steps.len(),
                        began.elapsed().as_micros()
                    );
                }
                Ok((ran, mark_of, next))
            })
        })?;
        Ok(OnStream {
            ran,
            mark_of,
            lane,
            slot,
            used,
            printer,
        })
    }

    /// Waits for lane `lane`'s oldest run in flight; its results.
    fn finish_lane(&mut self, lane: usize) -> Option<(usize, Finished)> {
        let (run, count) = self.in_flight[lane].pop_front()?;
        let n = run.ran.len();
        let mut done = self
            .wait_steps(run)
            .unwrap_or_else(|e| QueuedDone::all_failed(n, &e));
        vgpu_backend::refuse_past_limit(&mut done, count);
        // A run begins where the one before it on its lane ended: the
        // caller reckons that from its own clock.
        Some((lane, Finished { waited_ns: 0, done }))
    }

    /// The lane whose oldest run in flight is finished first: the first
    /// whose run the device is found done with (or failed), polling while
    /// they go on (a spin, then short sleeps), for `within` at most
    /// (`None`: as long as it takes; with one lane busy, that lane at
    /// once). `Err(())` when none finished within the time; `Ok(None)`
    /// when nothing is in flight.
    fn first_finished(&mut self, within: Option<Duration>) -> Result<Option<usize>, ()> {
        let busy: Vec<usize> = (0..LANES)
            .filter(|&l| !self.in_flight[l].is_empty())
            .collect();
        if busy.is_empty() || (busy.len() == 1 && within.is_none()) {
            return Ok(busy.first().copied());
        }
        let since = std::time::Instant::now();
        loop {
            for &l in &busy {
                let (run, _) = &self.in_flight[l][0];
                let last = run.slot * MARKS_PER_RUN + run.used - 1;
                let done = self.run(|dev| {
                    // An error of the work is the wait's to report.
                    Ok(driver::event_query(&dev.res.marks[last]).unwrap_or(true))
                });
                if done.unwrap_or(true) {
                    return Ok(Some(l));
                }
            }
            if within.is_some_and(|w| since.elapsed() >= w) {
                return Err(());
            }
            if since.elapsed() < POLL_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }

    /// Waits for a run [`Self::enqueue_steps`] put on the stream; its
    /// marks give each step's end on the device's clock.
    fn wait_steps(&mut self, run: OnStream) -> Result<Vec<QueuedDone>, OpError> {
        let OnStream {
            ran,
            mark_of,
            lane,
            slot,
            used,
            printer,
        } = run;
        let base = slot * MARKS_PER_RUN;
        let waited = self.run(|dev| {
            dev.on_lane(lane, |dev| {
                let marks = &dev.res.marks[base..base + used];
                if let Err(e) = driver::event_sync(&marks[used - 1]) {
                    let _ = driver::stream_sync(&dev.res.stream);
                    return Err(Fail::Cuda("queued work: device work".into(), e));
                }
                let times = (1..used)
                    .map(|j| driver::event_elapsed(&marks[0], &marks[j]))
                    .collect::<Result<Vec<_>, _>>()
                    .at("timing queued work")?;
                Ok(mark_of.iter().map(|&j| times[j - 1]).collect::<Vec<_>>())
            })
        });
        // The set is free again; a context lost meanwhile took its events
        // with it, and the slots were reset then.
        if !self.free_slots.contains(&slot) && self.free_slots.len() < MARK_SLOTS {
            self.free_slots.push(slot);
        }
        self.collect_printed(printer);
        let ends = waited?;
        self.last_device_time = ends.last().copied();
        let mut end_ns = 0;
        Ok(ran
            .into_iter()
            .zip(ends)
            .map(|(r, end)| {
                // Events of one stream complete in order; the clamp only
                // guards against the timer's rounding.
                end_ns = (end.as_nanos() as u64).max(end_ns);
                QueuedDone {
                    result: r.map_err(|f| self.failed(f)),
                    end_ns,
                }
            })
            .collect())
    }

    /// Moves `len` bytes at device address `addr`, timed as `what`:
    /// `copy` moves them (straight from or to registered guest memory
    /// where it can) and says whether it went directly.
    fn transfer(
        &mut self,
        what: &str,
        addr: u64,
        len: u64,
        write: bool,
        copy: impl FnOnce(&DeviceState, &HostRegistry) -> Result<bool, Fail>,
    ) -> Result<(), OpError> {
        self.last_device_time = None;
        self.check_range(addr, len, write)?;
        if len == 0 {
            return Ok(());
        }
        self.last_direct = false;
        let host = self.host.clone();
        let mut direct = false;
        let t = self.run(|dev| {
            dev.timed(what, |s| {
                direct = copy(s, &host)?;
                Ok(())
            })
        })?;
        self.last_direct = direct;
        self.last_device_time = Some(t);
        Ok(())
    }
}

/// How long finishing a run polls lanes without sleeping, and how long
/// it then sleeps between looks.
const POLL_SPIN: Duration = Duration::from_micros(50);
const POLL_SLEEP: Duration = Duration::from_micros(20);
/// Lanes of a partition: streams of queued runs side by side.
const LANES: usize = 4;
/// Queued runs in flight on one lane.
const DEPTH: usize = 2;
/// Sets of events a partition keeps for queued runs: one per run in flight
/// and one for a run waited for at once.
const MARK_SLOTS: usize = LANES * DEPTH + 1;
/// Events in a set: one before a run's first step, one after each.
const MARKS_PER_RUN: usize = MAX_QUEUED_STEPS + 1;

/// A queued run on the stream, not yet waited for.
struct OnStream {
    /// Each step's result of going onto the stream.
    ran: Vec<Result<(), Fail>>,
    /// The event (of the run's set) that ends each step.
    mark_of: Vec<usize>,
    /// The lane whose stream it is on.
    lane: usize,
    /// The run's set of events, and how many of them it recorded.
    slot: usize,
    used: usize,
    /// The printing module that ran last, which gets what was printed.
    printer: Option<u64>,
}

/// A queued step made ready to go onto the stream.
enum Ready<'s, 'l> {
    Stamp,
    Builtin(Builtin),
    Kernel(driver::CUfunction, &'s Launch<'l>),
    Upload(u64, &'s SliceMemory<'l>),
    Download(u64, &'s SliceMemory<'l>),
    Fill(DeviceFill),
    Copy(DeviceCopy),
    Failed(Fail),
}

/// Refuses a fill whose size is not whole 32-bit words.
fn fill_size(size: u64) -> Result<(), OpError> {
    if size.is_multiple_of(4) {
        Ok(())
    } else {
        Err(OpError::Invalid(format!(
            "fill of {size} bytes: not a multiple of 4"
        )))
    }
}

/// Looks up `l`'s kernel, checks the launch against it and raises the
/// kernel's attributes as the launch needs; returns the kernel.
fn prepare_loaded(
    dev: &mut DeviceState,
    l: &Launch<'_>,
    optin: u32,
) -> Result<driver::CUfunction, Fail> {
    prepare_kernel(dev, l, optin, Some(l.params))
}

/// [`prepare_loaded`], checking the parameter block only when given one
/// (an occupancy query has none).
fn prepare_kernel(
    dev: &mut DeviceState,
    l: &Launch<'_>,
    optin: u32,
    params: Option<&[u8]>,
) -> Result<driver::CUfunction, Fail> {
    let entry = l.entry;
    let m = dev.res.module_mut(l.module)?;
    let k = m.kernel(entry, optin)?;
    let limits = KernelLimits::of(&k.info);
    match params {
        Some(p) => rules::check_module_launch(entry, l.grid, l.block, l.shared_mem, p, &limits)?,
        None => rules::check_module_shape(entry, l.grid, l.block, l.shared_mem, &limits)?,
    }
    if l.shared_mem > k.dynamic_shared {
        // Kernels that need more than the default 48 KiB opt in
        // (cudaFuncSetAttribute in the guest); the check above keeps it
        // within what the device allows.
        driver::set_function_attribute(
            k.f,
            driver::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            l.shared_mem as i32,
        )
        .at("raising a kernel's dynamic shared memory")?;
        k.dynamic_shared = l.shared_mem;
    }
    let blocks: u32 = l.cluster.iter().product();
    if blocks > 8 && !k.non_portable_clusters {
        // Clusters past the portable 8 blocks need the kernel's consent
        // (cudaFuncSetAttribute in the guest).
        driver::set_function_attribute(
            k.f,
            driver::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
        )
        .at("allowing non-portable cluster sizes")?;
        k.non_portable_clusters = true;
    }
    Ok(k.f)
}

/// Queues launch `l` of kernel `f` (from [`prepare_loaded`]) on the
/// partition's stream.
fn enqueue_loaded(dev: &DeviceState, f: driver::CUfunction, l: &Launch<'_>) -> Result<(), Fail> {
    // SAFETY: `prepare_loaded` checked that the parameter block has the
    // size of the kernel's parameter list. Pointers in it are the guest's
    // and are used on the GPU only: loaded modules exist only where the
    // operator allowed guest PTX (set_guest_ptx), and an unmapped address
    // faults the GPU context, not this process.
    unsafe {
        driver::launch_packed(
            f,
            [l.grid, l.block],
            (l.cluster, l.cooperative),
            l.shared_mem,
            &dev.res.stream,
            l.params,
        )
    }
    .map_err(|e| Fail::Refused(format!("launching {}", l.entry), e))
}

impl Drop for CudaPartition {
    fn drop(&mut self) {
        self.teardown();
        let mut pool = lock(&self.shared.pool);
        pool.memory += self.spec.memory;
        pool.compute_units += self.spec.compute_units;
        for &i in &self.groups {
            pool.free_groups.insert(i);
        }
        info!(
            "cuda backend: partition {:?} released ({} bytes, {} compute units)",
            self.spec.name, self.spec.memory, self.spec.compute_units
        );
    }
}

/// What stands behind an entry of the allocation table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// Memory of `cuMemAlloc` from this base (aligned up for the guest).
    Alloc(u64),
    /// A global of this module, which owns its memory.
    Global(u64),
}

/// CUDA arrays, texture and surface objects: the driver's own, in the
/// partition's context. Kernels use texture and surface objects by the
/// driver's handles; arrays, which only commands name, by numbers of
/// ours (the driver's handle is a host address).
impl CudaPartition {
    /// A box side of an array copy as the driver takes it; an array is
    /// checked to hold the box here (device memory was checked before).
    fn copy_end(
        dev: &DeviceState,
        side: &CopySide,
        extent: [u64; 3],
    ) -> Result<(driver::CopyEnd, [usize; 3]), Fail> {
        let pos = side.pos.map(|v| v as usize);
        if side.array {
            let (a, desc) = dev
                .res
                .arrays
                .get(&side.at)
                .ok_or_else(|| OpError::NotFound(format!("array {:#x}", side.at)))?;
            side.check_array(desc, extent)?;
            return Ok((driver::CopyEnd::Array(a.handle()), pos));
        }
        Ok((
            driver::CopyEnd::Device {
                ptr: side.at,
                pitch: side.pitch as usize,
                height: side.height as usize,
            },
            pos,
        ))
    }

    fn format(f: vgpu_backend::arrays::Format) -> driver::CUarray_format {
        use driver::CUarray_format as F;
        use vgpu_backend::arrays::Format;
        match f {
            Format::U8 => F::CU_AD_FORMAT_UNSIGNED_INT8,
            Format::U16 => F::CU_AD_FORMAT_UNSIGNED_INT16,
            Format::U32 => F::CU_AD_FORMAT_UNSIGNED_INT32,
            Format::S8 => F::CU_AD_FORMAT_SIGNED_INT8,
            Format::S16 => F::CU_AD_FORMAT_SIGNED_INT16,
            Format::S32 => F::CU_AD_FORMAT_SIGNED_INT32,
            Format::F16 => F::CU_AD_FORMAT_HALF,
            Format::F32 => F::CU_AD_FORMAT_FLOAT,
        }
    }

    fn array_create(&mut self, desc: ArrayDesc) -> Result<u64, OpError> {
        let bytes = desc.bytes();
        let available = self.available();
        if bytes > available {
            return Err(OpError::NoMemory {
                requested: bytes,
                available,
            });
        }
        let shape = driver::ArrayShape {
            extent: [desc.width, desc.height, desc.depth].map(|v| v as usize),
            format: Self::format(desc.format),
            channels: desc.channels,
            flags: [
                (desc.layered, driver::ARRAY_LAYERED),
                (desc.surface, driver::ARRAY_SURFACE_LDST),
                (desc.cubemap, driver::ARRAY_CUBEMAP),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .fold(0, |f, (_, bit)| f | bit),
        };
        let handle = self.run(|dev| {
            if dev.res.arrays.len() + dev.res.textures.len() + dev.res.surfaces.len()
                >= abi::MAX_OBJECTS as usize
            {
                return Err(Fail::Op(OpError::NoMemory {
                    requested: 0,
                    available: 0,
                }));
            }
            let a = match driver::Array::create(&shape) {
                Ok(a) => a,
                Err(e) if e.is_out_of_memory() => {
                    return Err(Fail::Op(OpError::NoMemory {
                        requested: bytes,
                        available,
                    }))
                }
                Err(e) => return Err(Fail::Refused("cuArray3DCreate".into(), e)),
            };
            let h = dev.res.next_array;
            dev.res.next_array += 1;
            dev.res.arrays.insert(h, (a, desc));
            Ok(h)
        })?;
        self.array_bytes += bytes;
        Ok(handle)
    }

    fn array_copy(&mut self, c: ArrayCopy) -> Result<(), OpError> {
        for side in [&c.src, &c.dst].into_iter().filter(|s| !s.array) {
            let (start, len) = side.span(c.extent)?;
            self.allocs.check(start, len)?;
        }
        self.run(|dev| {
            let src = Self::copy_end(dev, &c.src, c.extent)?;
            let dst = Self::copy_end(dev, &c.dst, c.extent)?;
            let extent = c.extent.map(|v| v as usize);
            driver::memcpy3d_async(src, dst, extent, &dev.res.stream)
                .map_err(|e| Fail::Refused("cuMemcpy3DAsync".into(), e))?;
            driver::stream_sync(&dev.res.stream).at("cuStreamSynchronize")
        })
    }

    fn object_create(&mut self, o: ObjectDesc) -> Result<u64, OpError> {
        if let Some((start, len)) = o.memory_span() {
            self.allocs.check(start, len)?;
        }
        let mode = |m: u8| match m {
            0 => driver::CUaddress_mode::CU_TR_ADDRESS_MODE_WRAP,
            1 => driver::CUaddress_mode::CU_TR_ADDRESS_MODE_CLAMP,
            2 => driver::CUaddress_mode::CU_TR_ADDRESS_MODE_MIRROR,
            _ => driver::CUaddress_mode::CU_TR_ADDRESS_MODE_BORDER,
        };
        let sampling = driver::Sampling {
            address: o.address.map(mode),
            filter: if o.linear_filter {
                driver::CUfilter_mode::CU_TR_FILTER_MODE_LINEAR
            } else {
                driver::CUfilter_mode::CU_TR_FILTER_MODE_POINT
            },
            flags: o.tex_flags,
            border: o.border,
        };
        self.run(|dev| {
            if dev.res.arrays.len() + dev.res.textures.len() + dev.res.surfaces.len()
                >= abi::MAX_OBJECTS as usize
            {
                return Err(Fail::Op(OpError::NoMemory {
                    requested: 0,
                    available: 0,
                }));
            }
            let res = match o.element {
                None => {
                    let (a, desc) = dev
                        .res
                        .arrays
                        .get(&o.resource)
                        .ok_or_else(|| OpError::NotFound(format!("array {:#x}", o.resource)))?;
                    // The driver decides: it makes a surface over an
                    // array without the surface flag too.
                    let _ = desc;
                    driver::TexResource::Array(a.handle())
                }
                Some((f, channels)) if o.res_type == abi::RESOURCE_LINEAR => {
                    driver::TexResource::Linear {
                        ptr: o.resource,
                        format: Self::format(f),
                        channels,
                        size: o.size as usize,
                    }
                }
                Some((f, channels)) => driver::TexResource::Pitch2D {
                    ptr: o.resource,
                    format: Self::format(f),
                    channels,
                    width: o.width as usize,
                    height: o.height as usize,
                    pitch: o.size as usize,
                },
            };
            if o.surface {
                let driver::TexResource::Array(a) = res else {
                    return Err(Fail::Op(OpError::Invalid(
                        "surfaces are made over arrays".into(),
                    )));
                };
                let s = driver::SurfObject::create(a)
                    .map_err(|e| Fail::Refused("cuSurfObjectCreate".into(), e))?;
                let h = s.handle();
                dev.res.surfaces.insert(h, s);
                Ok(h)
            } else {
                let t = driver::TexObject::create(&res, &sampling)
                    .map_err(|e| Fail::Refused("cuTexObjectCreate".into(), e))?;
                let h = t.handle();
                dev.res.textures.insert(h, t);
                Ok(h)
            }
        })
    }

    fn object_destroy(&mut self, kind: u32, handle: u64) -> Result<(), OpError> {
        let not_found = || OpError::NotFound(format!("object {handle:#x}"));
        let freed = self.run(|dev| {
            // Work queued before may still read it.
            driver::stream_sync(&dev.res.stream).at("cuStreamSynchronize")?;
            match kind {
                abi::OBJECT_ARRAY => {
                    let (a, desc) = dev.res.arrays.remove(&handle).ok_or_else(not_found)?;
                    drop(a);
                    Ok(desc.bytes())
                }
                abi::OBJECT_TEXTURE => dev
                    .res
                    .textures
                    .remove(&handle)
                    .map(|_| 0)
                    .ok_or_else(|| Fail::Op(not_found())),
                abi::OBJECT_SURFACE => dev
                    .res
                    .surfaces
                    .remove(&handle)
                    .map(|_| 0)
                    .ok_or_else(|| Fail::Op(not_found())),
                k => Err(Fail::Op(OpError::Invalid(format!("object kind {k}")))),
            }
        })?;
        self.array_bytes = self.array_bytes.saturating_sub(freed);
        Ok(())
    }
}

impl Partition for CudaPartition {
    fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    fn kernel_compute_units(&self) -> u32 {
        self.sms
    }

    fn cooperative(&self) -> bool {
        self.shared.cooperative
    }

    /// Where guest kernels run: arrays without kernels to read them
    /// would be of no use.
    fn arrays(&self) -> bool {
        self.shared.guest_ptx.load(Ordering::Relaxed)
    }

    fn resource(&mut self, req: &Resource) -> Result<u64, OpError> {
        self.last_device_time = None;
        if !self.arrays() {
            return Err(OpError::Unsupported(
                "CUDA arrays: guest kernels are refused on this partition".into(),
            ));
        }
        match req {
            Resource::ArrayCreate(c) => self.array_create(ArrayDesc::of(c)?),
            Resource::ArrayCopy(c) => self.array_copy(ArrayCopy::of(c)?).map(|()| 0),
            Resource::ObjectCreate(c) => self.object_create(ObjectDesc::of(c)?),
            Resource::Destroy(c) => self
                .object_destroy(c.hdr.flags & !abi::CMD_CTX_MASK, c.handle)
                .map(|()| 0),
        }
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.last_device_time = None;
        // cuMemAlloc gives DEFAULT_ALIGN: a larger alignment is padding,
        // charged to the quota.
        let align = rules::alloc_align(size, align)?;
        let available = self.available();
        let pad = align.saturating_sub(DEFAULT_ALIGN);
        let charged = size.saturating_add(pad);
        let no_memory = OpError::NoMemory {
            requested: charged,
            available,
        };
        self.allocs
            .admit_logged(PartitionName::of("cuda", &self.spec), charged, available)?;
        let bytes = usize::try_from(charged).map_err(|_| no_memory.clone())?;
        let base = self.run(|dev| {
            let base = match driver::mem_alloc(bytes) {
                Ok(p) => p,
                Err(e) if e.is_out_of_memory() => return Err(Fail::Op(no_memory.clone())),
                Err(e) => return Err(Fail::Cuda("cuMemAlloc".into(), e)),
            };
            // Zeroed like the software backend's, so that no tenant reads
            // what a previous owner of the memory left there.
            let zeroed = driver::memset_async(base, driver::Fill::Byte(0), bytes, &dev.res.stream)
                .and_then(|()| driver::stream_sync(&dev.res.stream));
            if let Err(e) = zeroed {
                let _ = driver::mem_free(base);
                return Err(Fail::Cuda("zeroing new memory".into(), e));
            }
            Ok(base)
        })?;
        let addr = align_up(base, align).filter(|&a| a - base <= pad);
        let Some(addr) = addr else {
            let _ = self.run(|_| driver::mem_free(base).at("cuMemFree"));
            return Err(OpError::Device(format!(
                "cuMemAlloc returned {base:#x}, not {DEFAULT_ALIGN}-byte aligned"
            )));
        };
        self.allocs.insert_logged(
            PartitionName::of("cuda", &self.spec),
            addr,
            size,
            charged,
            Backing::Alloc(base),
        );
        Ok(addr)
    }

    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.last_device_time = None;
        if let Some(e) = self.allocs.get(addr) {
            if let Backing::Global(module) = e.data {
                return Err(OpError::Invalid(format!(
                    "{addr:#x} is a global of module {module:#x}, not an allocation"
                )));
            }
        }
        let a = self
            .allocs
            .free_logged(PartitionName::of("cuda", &self.spec), addr)?;
        let Backing::Alloc(base) = a.data else {
            return Ok(());
        };
        if self.lost.is_some() || self.dev.is_none() {
            // Reset destroys the context, and its memory with it.
            return Ok(());
        }
        // Every command drains its stream before returning, so no queued
        // work can still use the memory.
        self.run(|_| driver::mem_free(base).at("cuMemFree"))
    }

    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        self.transfer("upload", dst, src.len(), true, |s, host| {
            if s.upload_direct(dst, src, host)? {
                return Ok(true);
            }
            s.upload(dst, src).map(|()| false)
        })
    }

    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        self.transfer("download", src, dst.len(), false, |s, host| {
            if s.download_direct(src, dst, host)? {
                return Ok(true);
            }
            s.download(src, dst).map(|()| false)
        })
    }

    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.last_device_time = None;
        if ![
            abi::MODULE_FORMAT_PTX,
            abi::MODULE_FORMAT_FATBIN,
            abi::MODULE_FORMAT_CUBIN,
        ]
        .contains(&format)
        {
            return Err(OpError::Unsupported(format!(
                "module format {format}: the cuda backend loads PTX (format {}), fatbinaries ({}) and cubins ({})",
                abi::MODULE_FORMAT_PTX,
                abi::MODULE_FORMAT_FATBIN,
                abi::MODULE_FORMAT_CUBIN
            )));
        }
        if !self.shared.guest_ptx.load(Ordering::Relaxed) {
            return Err(OpError::Unsupported(
                "guest PTX modules are refused: partitions share one GPU address space, so a loaded kernel could reach other tenants' memory"
                    .into(),
            ));
        }
        // The driver reads PTX to its NUL and a fatbinary as far as its
        // headers say, from an 8-byte aligned copy.
        let text = match format {
            abi::MODULE_FORMAT_PTX => driver::ModuleImage::ptx(rules::ptx_text(image)?),
            abi::MODULE_FORMAT_CUBIN => driver::ModuleImage::binary(rules::cubin_image(image)?),
            _ => driver::ModuleImage::binary(rules::fatbin_image(image)?),
        };
        let name = self.spec.name.clone();
        self.run(|dev| {
            if dev.res.modules.len() >= rules::MAX_MODULES {
                return Err(Fail::Op(OpError::Invalid(format!(
                    "{} modules already loaded",
                    rules::MAX_MODULES
                ))));
            }
            let module = match driver::module_load(&text) {
                Ok(m) => m,
                Err((e, log)) if e.is_sticky() => {
                    return Err(Fail::Cuda(format!("loading a module ({log})"), e))
                }
                Err((e, log)) => {
                    return Err(Fail::Op(OpError::Invalid(format!(
                        "PTX rejected by the JIT compiler ({e}): {log}"
                    ))))
                }
            };
            let handle = dev.next_module;
            dev.next_module += 1;
            dev.res.modules.insert(
                handle,
                Module {
                    module,
                    kernels: HashMap::new(),
                },
            );
            debug!("cuda backend: partition {name:?}: module {handle:#x} loaded");
            Ok(handle)
        })
        .inspect(|&handle| {
            if console::module_prints(image) {
                self.printing.insert(handle);
            }
        })
    }

    fn console(&mut self, module: u64, max: usize) -> Result<ConsoleText, OpError> {
        Ok(self.consoles.take(module, max))
    }

    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.last_device_time = None;
        if module == abi::MODULE_BUILTIN {
            return Err(OpError::Invalid(
                "the built-in module cannot be unloaded".into(),
            ));
        }
        let not_found = || OpError::NotFound(format!("module {module:#x}"));
        self.printing.remove(&module);
        self.consoles.forget(module);
        // Its globals go with it, whatever the unload's outcome.
        self.allocs.remove_where(|b| *b == Backing::Global(module));
        if self.lost.is_some() {
            // The context goes at reset, and the module with it; only
            // forget the handle.
            let dev = self.dev.as_mut().ok_or_else(not_found)?;
            return dev
                .res
                .modules
                .remove(&module)
                .map(|m| m.module.forget())
                .ok_or_else(not_found);
        }
        self.run(|dev| {
            let m = dev
                .res
                .modules
                .remove(&module)
                .ok_or_else(|| Fail::Op(not_found()))?;
            m.module.unload().at("cuModuleUnload")
        })
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], _stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        // The steps go to the GPU together; the device bounds the wait
        // (a kernel that runs too long meets the watchdog).
        self.last_device_time = None;
        let now = &steps[..steps.len().min(MAX_QUEUED_STEPS)];
        let mut done = if now.is_empty() {
            Vec::new()
        } else {
            self.queue_steps(0, now)
                .unwrap_or_else(|e| QueuedDone::all_failed(now.len(), &e))
        };
        vgpu_backend::refuse_past_limit(&mut done, steps.len());
        done
    }

    fn queue_depth(&self) -> usize {
        DEPTH
    }

    fn lanes(&self) -> usize {
        LANES
    }

    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        held: bool,
    ) -> Started {
        let now = &steps[..steps.len().min(MAX_QUEUED_STEPS)];
        let refuse = |why: &str| {
            let mut done = QueuedDone::all_failed(now.len(), &OpError::Invalid(why.into()));
            vgpu_backend::refuse_past_limit(&mut done, steps.len());
            Started::Done(done)
        };
        if lane >= LANES {
            return refuse("no such lane");
        }
        let copies = steps
            .iter()
            .any(|s| matches!(s, Queued::Upload { .. } | Queued::Download { .. }));
        if copies && !held {
            // The GPU would copy from or to host memory the caller is
            // about to let go of: the run is over before this returns
            // (after the lane's runs before it, on the same stream).
            let _ = stop;
            self.last_device_time = None;
            let mut done = if now.is_empty() {
                Vec::new()
            } else {
                self.queue_steps(lane, now)
                    .unwrap_or_else(|e| QueuedDone::all_failed(now.len(), &e))
            };
            vgpu_backend::refuse_past_limit(&mut done, steps.len());
            return Started::Done(done);
        }
        if now.is_empty() || self.in_flight[lane].len() >= DEPTH {
            return refuse("more queued runs in flight than allowed");
        }
        match self.enqueue_steps(lane, now) {
            Ok(run) => {
                self.in_flight[lane].push_back((run, steps.len()));
                Started::InFlight
            }
            Err(e) => {
                let mut done = QueuedDone::all_failed(now.len(), &e);
                vgpu_backend::refuse_past_limit(&mut done, steps.len());
                Started::Done(done)
            }
        }
    }

    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        let lane = self.first_finished(None).ok()??;
        self.finish_lane(lane)
    }

    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        match self.first_finished(Some(within)) {
            Err(()) => Finishing::Pending,
            Ok(None) => Finishing::Idle,
            Ok(Some(lane)) => match self.finish_lane(lane) {
                Some((lane, f)) => Finishing::Done(lane, f),
                None => Finishing::Idle,
            },
        }
    }

    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        self.last_device_time = None;
        if launch.module == abi::MODULE_BUILTIN {
            return Err(OpError::Invalid(
                "occupancy of the built-in kernels is not asked".into(),
            ));
        }
        let optin = self.shared.max_shared_optin;
        let shape = Launch {
            grid: launch.cluster,
            ..launch.clone()
        };
        let n = self.run(|dev| {
            let f = prepare_kernel(dev, &shape, optin, None)?;
            driver::max_active_clusters(
                f,
                shape.block,
                shape.cluster,
                shape.shared_mem,
                &dev.res.stream,
            )
            .map_err(|e| Fail::Refused(format!("counting clusters of {}", shape.entry), e))
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        self.last_device_time = None;
        if module == abi::MODULE_BUILTIN {
            return rules::builtin_function_info(entry);
        }
        let optin = self.shared.max_shared_optin;
        self.run(|dev| {
            let m = dev.res.module_mut(module)?;
            Ok(m.kernel(entry, optin)?.info.clone())
        })
    }

    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        self.last_device_time = None;
        let cname = CString::new(name)
            .map_err(|_| OpError::Invalid(format!("global {name:?} contains a NUL")))?;
        let (addr, size) = self.run(|dev| {
            let m = dev.res.module_mut(module)?;
            driver::module_global(&m.module, &cname)
                .at("cuModuleGetGlobal")?
                .ok_or_else(|| {
                    Fail::Op(OpError::NotFound(format!(
                        "global {name:?} in module {module:#x}"
                    )))
                })
        })?;
        let size = size as u64;
        match self.allocs.get(addr) {
            Some(e) if e.data == Backing::Global(module) && e.size == size => {}
            Some(_) => {
                return Err(OpError::Device(format!(
                    "global {name:?} at {addr:#x} overlaps an allocation"
                )))
            }
            None => {
                if self.allocs.check(addr, size.max(1)).is_ok() {
                    return Err(OpError::Device(format!(
                        "global {name:?} at {addr:#x} overlaps an allocation"
                    )));
                }
                // The module's memory is the driver's, charged to nobody.
                self.allocs.admit(0, self.available())?;
                self.allocs.insert(addr, size, 0, Backing::Global(module));
            }
        }
        Ok((addr, size))
    }

    fn memory_used(&self) -> u64 {
        self.allocs
            .used()
            .saturating_add(self.array_bytes)
            .saturating_add(self.vmm.physical_bytes())
    }

    /// Device memory here is the driver's allocations at addresses it
    /// picks: putting it back at the same addresses needs it mapped
    /// through the virtual memory management API, which this partition
    /// does not do yet.
    fn suspend(&mut self) -> Result<u64, OpError> {
        Err(OpError::Unsupported(
            "suspending a partition of the cuda backend".into(),
        ))
    }

    fn resume(&mut self) -> Result<u64, OpError> {
        Ok(self.memory_used())
    }

    /// The quota is the partition's own count: the driver allocates as
    /// the guest asks.
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        let used = self.memory_used();
        let mut pool = lock(&self.shared.pool);
        rules::requota(Some(&mut pool.memory), used, self.spec.memory, memory)?;
        self.spec.memory = memory;
        Ok(())
    }

    fn has_vmm(&self) -> bool {
        self.shared.vmm
    }

    /// The driver's own calls in the partition's context, each checked
    /// first against what the partition holds, so that a guest's request
    /// fails as on the software backend and never reaches the driver
    /// malformed. New physical memory is zeroed, as allocations are.
    fn vmm(&mut self, op: &VmmOp) -> Result<u64, OpError> {
        self.last_device_time = None;
        if !self.shared.vmm {
            return Err(OpError::Unsupported("virtual memory management".into()));
        }
        let device = self.shared.device;
        match *op {
            VmmOp::Reserve { size, align, addr } => {
                let align = self.vmm.check_reserve(size, align)?;
                let at = self.run(|_| {
                    driver::mem_address_reserve(size as usize, align as usize, addr).map_err(|e| {
                        match e.is_out_of_memory() {
                            true => Fail::Op(OpError::NoMemory {
                                requested: size,
                                available: 0,
                            }),
                            false => Fail::Refused("cuMemAddressReserve".into(), e),
                        }
                    })
                })?;
                if self.vmm.reserved_overlaps(at, size) || self.allocs.check(at, 1).is_ok() {
                    let _ = self.run(|_| driver::mem_address_free(at, size as usize).at("free"));
                    return Err(OpError::Device(format!(
                        "cuMemAddressReserve returned {at:#x}, which is in use"
                    )));
                }
                self.vmm.reserved(at, size);
                Ok(at)
            }
            VmmOp::Free { addr, size } => {
                self.vmm.free(addr, size)?;
                self.run(|_| driver::mem_address_free(addr, size as usize).at("cuMemAddressFree"))
                    .map(|_| 0)
            }
            VmmOp::Create { size } => {
                self.vmm.check_create(size, self.available())?;
                let no_memory = OpError::NoMemory {
                    requested: size,
                    available: self.available(),
                };
                let h = self.run(|dev| {
                    let h = match driver::mem_create(size as usize, device) {
                        Ok(h) => h,
                        Err(e) if e.is_out_of_memory() => return Err(Fail::Op(no_memory)),
                        Err(e) => return Err(Fail::Cuda("cuMemCreate".into(), e)),
                    };
                    zero_physical(dev, h, size as usize, device).inspect_err(|_| {
                        let _ = driver::mem_release(h);
                    })?;
                    Ok(h)
                })?;
                Ok(self.vmm.created(size, h))
            }
            VmmOp::Release { handle } => {
                if let Some(p) = self.vmm.release(handle)? {
                    self.run(|_| driver::mem_release(p.data).at("cuMemRelease"))?;
                }
                Ok(0)
            }
            VmmOp::Map {
                addr,
                size,
                handle,
                offset,
            } => {
                self.vmm.check_map(addr, size, handle, offset)?;
                let h = self.vmm.physical(handle).map(|p| p.data).unwrap_or(0);
                self.run(|_| {
                    driver::mem_map(addr, size as usize, offset as usize, h).at("cuMemMap")
                })?;
                self.vmm.mapped(addr, size, handle, offset);
                Ok(0)
            }
            VmmOp::Unmap { addr, size } => {
                let starts = self.vmm.whole_mappings(addr, size)?;
                let sizes: Vec<(u64, u64)> = starts
                    .iter()
                    .filter_map(|a| self.vmm.mappings().get(a).map(|m| (*a, m.size)))
                    .collect();
                // Every command drains its stream first: no work uses
                // the range any more.
                self.run(|_| {
                    for &(a, s) in &sizes {
                        driver::mem_unmap(a, s as usize).at("cuMemUnmap")?;
                    }
                    Ok(())
                })?;
                let (_, freed) = self.vmm.unmap(addr, size)?;
                for p in freed {
                    self.run(|_| driver::mem_release(p.data).at("cuMemRelease"))?;
                }
                Ok(0)
            }
            VmmOp::Access { addr, size, access } => {
                let starts = self.vmm.check_access(addr, size, access)?;
                let sizes: Vec<(u64, u64)> = starts
                    .iter()
                    .filter_map(|a| self.vmm.mappings().get(a).map(|m| (*a, m.size)))
                    .collect();
                self.run(|_| {
                    for &(a, s) in &sizes {
                        driver::mem_set_access(a, s as usize, device, access)
                            .map_err(|e| Fail::Refused("cuMemSetAccess".into(), e))?;
                    }
                    Ok(())
                })?;
                for a in starts {
                    self.vmm.set_access(a, access);
                }
                Ok(0)
            }
        }
    }

    /// This partition's own loss only: when another partition of this
    /// process faulted, CUDA is gone for all of them, and a reset here
    /// cannot bring it back (a partition host is replaced instead, which
    /// its daemon side decides from the errors it gets).
    fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        Some(Arc::new(self.host.clone()))
    }

    fn reset(&mut self) {
        debug!(
            "cuda backend: partition {:?}: reset, {} allocations ({} bytes) freed",
            self.spec.name,
            self.allocs.len(),
            self.allocs.used()
        );
        self.teardown();
        self.lost = None;
        self.last_device_time = None;
        match self.create_state() {
            Ok(dev) => self.dev = Some(dev),
            Err(f) => {
                let why = format!("no CUDA context ({})", describe(&f));
                warn!("cuda backend: partition {:?}: {why}", self.spec.name);
                self.lost = Some(why);
            }
        }
    }
}

/// Zeroes physical allocation `h` of `size` bytes (so that no tenant
/// reads what a previous owner of the memory left there), through a
/// mapping of its own made for the purpose. The context is current.
fn zero_physical(
    dev: &DeviceState,
    h: u64,
    size: usize,
    device: driver::CUdevice,
) -> Result<(), Fail> {
    let g = abi::VMM_GRANULARITY as usize;
    let va = driver::mem_address_reserve(size, g, 0).at("cuMemAddressReserve")?;
    let zeroed = driver::mem_map(va, size, 0, h)
        .at("cuMemMap")
        .and_then(|()| {
            let r = driver::mem_set_access(va, size, device, abi::MEM_ACCESS_READ_WRITE)
                .at("cuMemSetAccess")
                .and_then(|()| {
                    driver::memset_async(va, driver::Fill::Byte(0), size, &dev.res.stream)
                        .and_then(|()| driver::stream_sync(&dev.res.stream))
                        .at("zeroing new memory")
                });
            let _ = driver::mem_unmap(va, size);
            r
        });
    let _ = driver::mem_address_free(va, size);
    zeroed
}
