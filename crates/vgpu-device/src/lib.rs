//! The virtual GPU PCI function: configuration space, BAR0 registers, the
//! doorbell page, the host-visible window, command queues in guest memory
//! (virtio split rings processed with `virtio-queue`), command validation
//! and dispatch to a backend [`Partition`](vgpu_backend::Partition).
//!
//! It knows nothing of CUDA or sockets: the vfio-user engine calls it
//! through [`PciDevice`], and it calls its partition with plain values.

#![warn(missing_docs)]

pub mod command;
#[cfg(feature = "test-utils")]
pub mod testing;
mod worker;

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::info;
use vfio_user_server::device::{
    IrqInfo, MmapArea, RegionInfo, RegionMmap, BAR0_REGION, CONFIG_REGION, IRQ_INTX, IRQ_MSIX,
};
use vfio_user_server::pci::{BarKind, ConfigSpace, PciIds, CAP_ID_EXP, PCIE_CONFIG_SPACE_SIZE};
use vfio_user_server::{DeviceContext, DeviceError, PciDevice};
use vgpu_abi as abi;
use vgpu_backend::{HostMapping, HostMemory, OpError, SharedPartition};
use vgpu_sched::CommandGate;
use vgpu_sys::warn_limited;
use virtio_queue::{Queue, QueueT};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemory, MmapRegion, Permissions, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;

/// Settings of one vGPU function.
#[derive(Clone)]
pub struct VgpuConfig {
    /// Name for logs.
    pub name: String,
    /// PCI identity.
    pub ids: PciIds,
    /// Queues offered (1..=[`abi::MAX_QUEUES`]).
    pub queues: u32,
    /// Size of the host-visible window (BAR2): a power of two, at least 4 KiB.
    pub window_size: u64,
    /// How long a poller keeps spinning after the last activity before it
    /// sleeps until a wake-up.
    pub poll_spin: Duration,
    /// The host scheduler's gate, when the GPU is shared under a policy.
    pub gate: Option<Arc<dyn CommandGate>>,
    /// Called while the function is suspended and its guest has work for
    /// it (a doorbell moved, or a command waits for the resume): an owner
    /// that suspends functions to share a GPU's memory in time resumes
    /// it. Called from the function's worker; must not block.
    pub on_wanted: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl VgpuConfig {
    /// The default identity and layout, named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        VgpuConfig {
            name: name.into(),
            ids: PciIds {
                vendor: abi::PCI_VENDOR_ID,
                device: abi::PCI_DEVICE_ID,
                subsystem_vendor: abi::PCI_SUBSYSTEM_VENDOR_ID,
                subsystem: abi::PCI_SUBSYSTEM_ID,
                class: abi::PCI_CLASS,
                revision: abi::PCI_REVISION,
            },
            queues: 4,
            window_size: 16 << 20,
            poll_spin: Duration::from_micros(50),
            gate: None,
            on_wanted: None,
        }
    }
}

/// Drains a function before the host goes away: commands the guest had
/// submitted when the drain began still run until a deadline; commands
/// submitted later, and those still waiting at the deadline, complete
/// with [`abi::STATUS_CANCELLED`] without running. Nothing the guest
/// submitted before the drain disappears without a completion while its
/// VMM stays connected.
pub struct DrainHandle {
    drain: Arc<Drain>,
    wake: EventFd,
}

impl DrainHandle {
    /// Starts draining; what has not run within `grace` is cancelled.
    /// A second call changes nothing.
    pub fn begin(&self, grace: Duration) {
        self.drain.begin(grace);
        // The worker may sleep until a wake-up.
        let _ = self.wake.write(1);
    }

    /// Whether the drain began and the worker has found no command left
    /// to run or cancel since.
    pub fn is_idle(&self) -> bool {
        self.drain.idle.load(Ordering::Acquire)
    }

    /// Commands completed since the drain began, and how many of them
    /// were cancelled.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.drain.completed.load(Ordering::Relaxed),
            self.drain.cancelled.load(Ordering::Relaxed),
        )
    }
}

/// A handle to the function's memory from another thread (the
/// daemon's): a live resize, and suspend and resume.
///
/// A resize changes the partition's quota (`Partition::set_memory`);
/// then REG_MEM_SIZE says the new figure and a driver that runs hears of
/// it (IRQ_CAUSE_CONFIG on the error vector).
///
/// A suspend stops the function at a command boundary: the worker starts
/// nothing more, finishes what is in flight and waits; the guest's
/// submissions wait in its rings, and nothing fails. Then the partition
/// moves its memory out (`Partition::suspend`). A resume puts it back
/// and lets the worker go on. A reset while suspended (the VMM's, the
/// driver's) resets the partition as ever; the function stays suspended.
pub struct MemoryHandle {
    /// One suspend or resume at a time: each sets the pause and moves the
    /// memory together.
    moving: Mutex<()>,
    partition: SharedPartition,
    mem_size: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    wake: EventFd,
    /// The function's state once a VMM bound it.
    bound: Arc<OnceLock<Weak<Shared>>>,
}

impl MemoryHandle {
    /// Makes the quota `bytes`, or says why not (and changes nothing).
    pub fn resize(&self, bytes: u64) -> Result<(), OpError> {
        // Held until the register says it too: an allocation after the
        // interrupt sees the new quota.
        let mut p = self.partition.lock();
        p.set_memory(bytes)?;
        if self.mem_size.swap(bytes, Ordering::AcqRel) == bytes {
            return Ok(());
        }
        drop(p);
        let Some(sh) = self.bound.get().and_then(Weak::upgrade) else {
            return Ok(());
        };
        // A driver that has not enabled the function reads the register
        // when it does.
        if lock(&sh.state).control & abi::CONTROL_ENABLE != 0 {
            sh.raise(abi::MSIX_ERROR_VECTOR, abi::IRQ_CAUSE_CONFIG);
        }
        Ok(())
    }

    /// Whether the function is suspended.
    pub fn is_suspended(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Stops the function at a command boundary and moves its memory out;
    /// returns the bytes moved. A refusal leaves it running.
    pub fn suspend(&self) -> Result<u64, OpError> {
        let _moving = lock(&self.moving);
        self.paused.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        let r = self.with_worker_stopped(|p| p.suspend());
        if r.is_err() {
            self.paused.store(false, Ordering::Release);
            let _ = self.wake.write(1);
        }
        r
    }

    /// Puts the memory back and lets the function go on; returns the
    /// bytes moved. A refusal (no room on the GPU) leaves it suspended.
    pub fn resume(&self) -> Result<u64, OpError> {
        let _moving = lock(&self.moving);
        let n = self.with_worker_stopped(|p| p.resume())?;
        self.paused.store(false, Ordering::Release);
        let _ = self.wake.write(1);
        Ok(n)
    }

    /// Runs `f` on the partition while the worker processes nothing: it
    /// holds `busy` while it does, and starts nothing while paused.
    fn with_worker_stopped<R>(&self, f: impl FnOnce(&mut dyn vgpu_backend::Partition) -> R) -> R {
        let sh = self.bound.get().and_then(Weak::upgrade);
        let _busy = sh.as_ref().map(|sh| lock(&sh.busy));
        let mut p = self.partition.lock();
        f(&mut **p)
    }
}

/// Drain state shared by a [`DrainHandle`] and the worker.
pub(crate) struct Drain {
    epoch: Instant,
    /// Set once by [`Drain::begin`].
    requested: AtomicBool,
    /// Nanoseconds after `epoch` when waiting work is cancelled.
    deadline_ns: AtomicU64,
    pub(crate) idle: AtomicBool,
    pub(crate) completed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
}

impl Drain {
    fn new() -> Self {
        Drain {
            epoch: Instant::now(),
            requested: AtomicBool::new(false),
            deadline_ns: AtomicU64::new(u64::MAX),
            idle: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    fn begin(&self, grace: Duration) {
        if self.requested.load(Ordering::Acquire) {
            return;
        }
        let at = self.epoch.elapsed().saturating_add(grace);
        let ns = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.deadline_ns.store(ns, Ordering::SeqCst);
        self.requested.store(true, Ordering::SeqCst);
    }

    /// Whether a drain began.
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Whether a drain began and its grace is over.
    pub(crate) fn expired(&self) -> bool {
        self.requested()
            && u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
                >= self.deadline_ns.load(Ordering::SeqCst)
    }
}

/// Counters an operator watches; shared with the host's monitoring.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    /// Device memory in use, bytes.
    pub mem_used: AtomicU64,
    /// Highest `mem_used` since the function was created.
    pub mem_peak: AtomicU64,
    /// Device time consumed since reset, ns.
    pub busy_ns: AtomicU64,
    /// Commands completed since reset.
    pub commands: AtomicU64,
    /// Commands that faulted on guest memory (STATUS_FAULT), since creation.
    pub faults: AtomicU64,
    /// Device errors logged (ring, register, queue errors), since creation.
    pub errors: AtomicU64,
    /// Resets, since creation.
    pub resets: AtomicU64,
    /// Guest reads of BAR0 that were not aligned 32/64-bit register reads
    /// (answered from the registers they overlap), since creation.
    pub odd_reads: AtomicU64,
    /// Guest writes the device dropped (narrow or unaligned register
    /// writes), since creation.
    pub dropped_writes: AtomicU64,
    /// Contexts besides context 0 the function has now (ABI 1.5).
    pub contexts: AtomicU32,
    /// Commands whose kernel faulted (KERNEL_FAULT), since creation: each
    /// ended a context, or the function's state where it has none.
    pub kernel_faults: AtomicU64,
    /// Contexts made with a new partition, since the partition was made.
    pub contexts_started: AtomicU64,
    /// What those took in all, ns.
    pub context_start_ns: AtomicU64,
    /// Contexts made with the partition of one that had ended.
    pub contexts_reused: AtomicU64,
    /// What the live contexts hold of their own (in `mem_used`), bytes.
    pub context_memory: AtomicU64,
}

/// Errors creating a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceSetupError {
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// Shared memory could not be created.
    #[error("cannot create shared memory")]
    Memory(#[source] std::io::Error),
}

const DOORBELL_FILE_SIZE: u64 = abi::DOORBELL_OFFSET + abi::DOORBELL_SIZE;

/// Per-queue register state.
#[derive(Default)]
pub(crate) struct QueueRegs {
    size: u32,
    control: u32,
    status: u32,
    error: u32,
    desc: u64,
    avail: u64,
    used: u64,
    vector: u32,
    /// The ring while enabled.
    ring: Option<Queue>,
    /// Bumped on every enable/disable so a worker drops stale state.
    generation: u64,
    /// While draining: the guest's avail index when the drain began (work
    /// before it is in flight, after it is new). `None` for a ring enabled
    /// after that: all of its work is new.
    drain_limit: Option<u16>,
}

/// Registers and queues, shared by the event loop and the worker.
pub(crate) struct State {
    control: u32,
    status: u32,
    irq_cause: u32,
    irq_mask: u32,
    error_count: u32,
    error_log: [abi::ErrorLogEntry; abi::ERROR_LOG_ENTRIES as usize],
    queues: Vec<QueueRegs>,
}

impl State {
    fn new(queues: u32) -> Self {
        State {
            control: 0,
            status: 0,
            irq_cause: 0,
            irq_mask: 0,
            error_count: 0,
            error_log: Default::default(),
            queues: (0..queues)
                .map(|q| QueueRegs {
                    vector: q + 1,
                    ..Default::default()
                })
                .collect(),
        }
    }
}

/// Device state shared with the worker thread.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) ctx: DeviceContext,
    pub(crate) state: Mutex<State>,
    pub(crate) partition: SharedPartition,
    /// How often the idle worker asks whether the partition was lost
    /// (`Partition::watch_interval`).
    pub(crate) watch: Option<Duration>,
    /// Locked after `partition`, only with it held.
    pub(crate) functions: Mutex<command::Functions>,
    pub(crate) doorbells: MmapRegion,
    pub(crate) window: MmapRegion,
    pub(crate) wake: EventFd,
    pub(crate) stop: AtomicBool,
    /// Suspended: the worker starts no command (see [`MemoryHandle`]).
    pub(crate) paused: Arc<AtomicBool>,
    /// A command was taken from a ring while suspended and waits.
    pub(crate) waits_for_resume: AtomicBool,
    /// See [`VgpuConfig::on_wanted`].
    pub(crate) on_wanted: Option<Arc<dyn Fn() + Send + Sync>>,
    pub(crate) log: Mutex<vgpu_sys::LogLimiter>,
    /// Some running queue is polled: the worker spins after activity.
    pub(crate) any_polled: AtomicBool,
    /// Device time of the last queued run the worker finished, ns: runs
    /// are kept in flight only after long ones (see `worker.rs`).
    pub(crate) last_run_ns: AtomicU64,
    /// Per lane of the partition, when its last run ended, on the device
    /// epoch's clock, ns: the next run of the lane begins no earlier.
    pub(crate) last_run_end: Box<[AtomicU64]>,
    /// Bumped by every queue enable/disable (see `QueueRegs::generation`).
    pub(crate) config_gen: AtomicU64,
    /// Bumped by reset: the worker stops writing completions of older work.
    pub(crate) epoch_gen: AtomicU64,
    /// Held by the worker while it processes, taken by reset to wait for it.
    pub(crate) busy: Mutex<()>,
    pub(crate) counters: Arc<DeviceCounters>,
    pub(crate) gate: Option<Arc<dyn CommandGate>>,
    pub(crate) drain: Arc<Drain>,
    pub(crate) epoch: Instant,
    pub(crate) poll_spin: Duration,
    pub(crate) num_queues: u32,
}

// State updates are single assignments; a panic elsewhere leaves it usable.
pub(crate) use vgpu_sys::lock;

impl Shared {
    /// The partition lost its state (a kernel fault ended its GPU
    /// context): STATUS.FATAL tells the driver to reset the function,
    /// which gives it a new one. Logged once until that reset.
    pub(crate) fn function_lost(&self, queue: u32) {
        {
            let mut st = lock(&self.state);
            if st.status & abi::STATUS_FATAL != 0 {
                return;
            }
            st.status |= abi::STATUS_FATAL;
        }
        self.log_error(abi::ERR_BACKEND, queue, 0);
    }

    /// Logs a device error, sets the error cause and raises the error vector.
    pub(crate) fn log_error(&self, code: u32, queue: u32, detail: u64) {
        {
            let mut st = lock(&self.state);
            let idx = (st.error_count % abi::ERROR_LOG_ENTRIES) as usize;
            st.error_log[idx] = abi::ErrorLogEntry {
                code,
                queue,
                detail,
            };
            st.error_count = st.error_count.wrapping_add(1);
            st.irq_cause |= abi::IRQ_CAUSE_ERROR;
        }
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        // The guest decides how many errors it causes: rate-limit the log.
        lock(&self.log).warn(
            &self.name,
            format_args!("device error {code} (queue {queue}, detail {detail:#x})"),
        );
        self.raise(abi::MSIX_ERROR_VECTOR, abi::IRQ_CAUSE_ERROR);
    }

    /// Puts a queue into the error state.
    pub(crate) fn queue_error(&self, q: u32, code: u32, detail: u64) {
        {
            let mut st = lock(&self.state);
            if let Some(qr) = st.queues.get_mut(q as usize) {
                qr.status |= abi::QSTATUS_ERROR;
                qr.error = code;
            }
        }
        self.log_error(code, q, detail);
    }

    /// Raises MSI-X `vector`, or INTx when MSI-X is not set up.
    pub(crate) fn raise(&self, vector: u32, cause: u32) {
        let masked = {
            let mut st = lock(&self.state);
            st.irq_cause |= cause;
            st.irq_mask & cause != 0
        };
        if vector == abi::MSIX_NO_VECTOR {
            return;
        }
        if self.ctx.irqs.is_enabled(IRQ_MSIX, vector) {
            self.ctx.irqs.trigger(IRQ_MSIX, vector);
        } else if !masked {
            self.ctx.irqs.trigger(IRQ_INTX, 0);
        }
    }

    /// Whether the function is suspended and its worker starts nothing
    /// (until a drain's deadline, after which what waits is cancelled
    /// without the partition).
    pub(crate) fn suspended(&self) -> bool {
        self.paused.load(Ordering::Acquire) && !self.drain.expired()
    }

    /// Recomputes [`Shared::any_polled`] from the queue registers.
    pub(crate) fn refresh_any_polled(&self, st: &State) {
        let any = st.queues.iter().any(|q| {
            q.control & (abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED)
                == (abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED)
        });
        self.any_polled.store(any, Ordering::Relaxed);
    }

    /// The generation of queue `q`'s configuration.
    pub(crate) fn queue_generation(&self, q: u32) -> Option<u64> {
        lock(&self.state)
            .queues
            .get(q as usize)
            .map(|qr| qr.generation)
    }

    /// Sets or clears the POLLING word of a queue's doorbell slot.
    pub(crate) fn set_polling(&self, q: u32, on: bool) {
        let off = (abi::DOORBELL_OFFSET + abi::doorbell(q, abi::DB_POLLING)) as usize;
        if let Ok(r) = self
            .doorbells
            .get_atomic_ref::<std::sync::atomic::AtomicU32>(off)
        {
            r.store(u32::from(on), Ordering::SeqCst);
        }
    }

    /// The guest's last doorbell value of a queue.
    pub(crate) fn doorbell(&self, q: u32) -> u32 {
        let off = (abi::DOORBELL_OFFSET + abi::doorbell(q, abi::DB_AVAIL_IDX)) as usize;
        self.doorbells
            .get_atomic_ref::<std::sync::atomic::AtomicU32>(off)
            .map(|r| r.load(Ordering::Acquire))
            .unwrap_or(0)
    }
}

/// The vGPU function.
pub struct VgpuDevice {
    config: VgpuConfig,
    pci: ConfigSpace,
    doorbell_file: Arc<File>,
    window_file: Arc<File>,
    /// REG_MEM_SIZE, which a [`MemoryHandle`] changes.
    mem_size: Arc<AtomicU64>,
    /// Set at `bind`, for the handles.
    bound: Arc<OnceLock<Weak<Shared>>>,
    /// Suspended: the worker starts nothing (see [`MemoryHandle`]).
    paused: Arc<AtomicBool>,
    compute_units: u32,
    /// Contexts besides context 0 the partition may have; `None`
    /// without contexts.
    max_contexts: Option<u32>,
    /// What each of those contexts holds of its own (REG_CONTEXT_COST).
    context_cost: u64,
    /// Whether the partition runs cooperative launches (FEATURES bit 9).
    cooperative: bool,
    /// How often an idle worker looks whether the partition was lost.
    watch: Option<Duration>,
    /// Whether the partition offers virtual memory management (FEATURES
    /// bit 10).
    vmm: bool,
    /// Whether the partition has CUDA arrays, texture and surface
    /// objects (FEATURES bit 11).
    arrays: bool,
    /// Until `bind`, the partition and memory wait here.
    pending: Option<(SharedPartition, MmapRegion, MmapRegion)>,
    /// The partition, for the handles.
    partition: SharedPartition,
    counters: Arc<DeviceCounters>,
    /// Signalled by the WAKE register (directly, when a VMM maps it as an
    /// ioeventfd); the worker sleeps on a duplicate of it.
    wake: EventFd,
    shared: Option<Arc<Shared>>,
    worker: Option<JoinHandle<()>>,
    /// The partition's registry of mapped guest memory, used without the
    /// partition's lock: the event loop must never wait for a command.
    host_memory: Option<Arc<dyn HostMemory>>,
    drain: Arc<Drain>,
}

fn map_file(file: &File, size: u64) -> Result<MmapRegion, DeviceSetupError> {
    let clone = file.try_clone().map_err(DeviceSetupError::Memory)?;
    MmapRegionBuilder::new(size as usize)
        .with_file_offset(FileOffset::new(clone, 0))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_SHARED)
        .build()
        .map_err(|e| DeviceSetupError::Memory(std::io::Error::other(e)))
}

fn pcie_capability() -> ([u8; 58], [u8; 58]) {
    // PCI Express capability, version 2, endpoint; no link. Device Control
    // bits are writable as on hardware.
    let mut body = [0u8; 58];
    body[0] = 0x02;
    let mut wmask = [0u8; 58];
    wmask[6] = 0xff;
    wmask[7] = 0x7f;
    (body, wmask)
}

impl VgpuDevice {
    /// A function in its power-on state, running on `partition` (a
    /// partition of its own, or one its owner shares).
    pub fn new(
        config: VgpuConfig,
        partition: impl Into<SharedPartition>,
    ) -> Result<Self, DeviceSetupError> {
        let partition = partition.into();
        if config.queues == 0 || config.queues > abi::MAX_QUEUES {
            return Err(DeviceSetupError::Config("queues must be 1..=16"));
        }
        if !config.window_size.is_power_of_two() || config.window_size < 4096 {
            return Err(DeviceSetupError::Config(
                "window size must be a power of two of at least 4 KiB",
            ));
        }
        let mut pci = ConfigSpace::new(config.ids);
        let layout = (|| {
            pci.set_bar(abi::BAR_REGS as usize, abi::BAR0_SIZE, BarKind::Mem32)?;
            pci.set_bar(
                abi::BAR_WINDOW as usize,
                config.window_size,
                BarKind::Mem64 { prefetchable: true },
            )?;
            pci.add_power_management()?;
            let (body, wmask) = pcie_capability();
            pci.add_capability(CAP_ID_EXP, &body, &wmask)?;
            pci.add_msix(
                abi::MSIX_VECTORS as u16,
                (abi::BAR_REGS as u8, abi::MSIX_TABLE_OFFSET as u32),
                (abi::BAR_REGS as u8, abi::MSIX_PBA_OFFSET as u32),
            )
        })();
        layout.map_err(|_| DeviceSetupError::Config("configuration space layout"))?;
        pci.set_interrupt_pin(1);
        let doorbell_file = vfio_user_server::memfd::create(c"vgpu-doorbells", DOORBELL_FILE_SIZE)
            .map_err(DeviceSetupError::Memory)?;
        let window_file = vfio_user_server::memfd::create(c"vgpu-window", config.window_size)
            .map_err(DeviceSetupError::Memory)?;
        let doorbells = map_file(&doorbell_file, DOORBELL_FILE_SIZE)?;
        let window = map_file(&window_file, config.window_size)?;
        let (spec, compute_units, host_memory, contexts, cooperative, watch, vmm, arrays) = {
            let p = partition.lock();
            (
                p.spec().clone(),
                p.kernel_compute_units(),
                p.host_memory(),
                p.contexts(),
                p.cooperative(),
                p.watch_interval(),
                p.has_vmm(),
                p.arrays(),
            )
        };
        let wake = EventFd::new(0).map_err(DeviceSetupError::Memory)?;
        Ok(VgpuDevice {
            wake,
            counters: Arc::new(DeviceCounters::default()),
            config,
            pci,
            doorbell_file: Arc::new(doorbell_file),
            window_file: Arc::new(window_file),
            mem_size: Arc::new(AtomicU64::new(spec.memory)),
            bound: Arc::default(),
            paused: Arc::default(),
            compute_units,
            max_contexts: contexts.as_ref().map(|n| n.max),
            context_cost: contexts.map_or(0, |n| n.cost),
            cooperative,
            watch,
            vmm,
            arrays,
            pending: Some((partition.clone(), doorbells, window)),
            partition,
            shared: None,
            worker: None,
            host_memory,
            drain: Arc::new(Drain::new()),
        })
    }

    /// The function's counters, for monitoring.
    pub fn counters(&self) -> Arc<DeviceCounters> {
        self.counters.clone()
    }

    /// A handle to resize, suspend and resume the function's memory from
    /// another thread.
    pub fn memory_handle(&self) -> std::io::Result<MemoryHandle> {
        Ok(MemoryHandle {
            moving: Mutex::new(()),
            partition: self.partition.clone(),
            mem_size: Arc::clone(&self.mem_size),
            paused: Arc::clone(&self.paused),
            wake: self.wake.try_clone()?,
            bound: Arc::clone(&self.bound),
        })
    }

    /// A handle to drain the function from another thread, e.g. while the
    /// host shuts down (the device itself is owned by its endpoint then).
    pub fn drain_handle(&self) -> std::io::Result<DrainHandle> {
        Ok(DrainHandle {
            drain: self.drain.clone(),
            wake: self.wake.try_clone()?,
        })
    }

    /// A duplicate of the eventfd the WAKE register signals: what a VMM
    /// with ioeventfd support receives for it through
    /// DEVICE_GET_REGION_IO_FDS, so that guest writes to WAKE reach the
    /// poller without passing through the vfio-user event loop.
    pub fn wake_eventfd(&self) -> std::io::Result<EventFd> {
        self.wake.try_clone()
    }

    /// Whether `[offset, offset + len)` is one aligned 32- or 64-bit
    /// access to the register block of BAR0.
    fn is_register_access(offset: u64, len: usize) -> bool {
        offset.is_multiple_of(4)
            && (len == 4 || len == 8)
            && offset + len as u64 <= abi::DOORBELL_OFFSET
    }

    /// `[offset, offset + len)` inside the doorbell page, as an offset in it.
    fn doorbell_range(offset: u64, len: usize) -> Option<usize> {
        let rel = offset.checked_sub(abi::DOORBELL_OFFSET)?;
        (rel + len as u64 <= abi::DOORBELL_SIZE).then_some(rel as usize)
    }

    /// Counts and logs (rate-limited) a guest access the device answered
    /// the way PCI hardware does rather than as the guest meant it.
    fn odd_access(&self, counter: &AtomicU64, what: std::fmt::Arguments<'_>) {
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(sh) = self.shared() {
            lock(&sh.log).warn(&sh.name, what);
        }
    }

    /// A read of BAR0. Aligned 32- and 64-bit register reads and reads
    /// inside the doorbell page are the normal case; any other read gets
    /// the bytes of the registers it overlaps (holes read as zero) and is
    /// counted. The MSI-X table is the VMM's; nothing is ever pending.
    fn bar0_read(&self, offset: u64, data: &mut [u8]) {
        if Self::is_register_access(offset, data.len()) {
            for (i, chunk) in data.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&self.read_reg(offset + 4 * i as u64).to_le_bytes());
            }
            return;
        }
        let shared = self.shared();
        if let (Some(sh), Some(rel)) = (shared, Self::doorbell_range(offset, data.len())) {
            if let Ok(slice) = sh.doorbells.get_slice(rel, data.len()) {
                slice.copy_to(data);
                return;
            }
        }
        if offset >= abi::MSIX_TABLE_OFFSET {
            data.fill(0);
            return;
        }
        let mut word = None;
        for (i, b) in data.iter_mut().enumerate() {
            let o = offset + i as u64;
            *b = if o < abi::DOORBELL_OFFSET {
                let reg = o & !3;
                let v = match word {
                    Some((r, v)) if r == reg => v,
                    _ => self.read_reg(reg),
                };
                word = Some((reg, v));
                v.to_le_bytes()[(o & 3) as usize]
            } else {
                let mut byte = [0u8];
                if let (Some(sh), Some(rel)) = (shared, Self::doorbell_range(o, 1)) {
                    if let Ok(s) = sh.doorbells.get_slice(rel, 1) {
                        s.copy_to(&mut byte);
                    }
                }
                byte[0]
            };
        }
        self.odd_access(
            &self.counters.odd_reads,
            format_args!(
                "BAR0 read of {} bytes at {offset:#x} is not an aligned 32/64-bit register \
                 read; answered from the registers it overlaps",
                data.len()
            ),
        );
    }

    /// A write to BAR0: aligned 32- and 64-bit register writes and writes
    /// inside the doorbell page take effect; any other write is dropped
    /// (registers have side effects that a partial write cannot mean) and
    /// counted. Writes to the MSI-X table and PBA are the VMM's business.
    fn bar0_write(&mut self, offset: u64, data: &[u8]) {
        if Self::is_register_access(offset, data.len()) {
            for (i, chunk) in data.chunks(4).enumerate() {
                let v = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                self.write_reg(offset + 4 * i as u64, v);
            }
            return;
        }
        if let (Some(sh), Some(rel)) = (self.shared(), Self::doorbell_range(offset, data.len())) {
            if let Ok(slice) = sh.doorbells.get_slice(rel, data.len()) {
                slice.copy_from(data);
                return;
            }
        }
        if offset >= abi::MSIX_TABLE_OFFSET {
            return;
        }
        self.odd_access(
            &self.counters.dropped_writes,
            format_args!(
                "BAR0 write of {} bytes at {offset:#x} is not an aligned 32/64-bit register \
                 write; dropped",
                data.len()
            ),
        );
    }

    /// The window (BAR2) is plain memory: any access the engine let
    /// through (it checks the range against the region) is served.
    fn window(&self, offset: u64, len: usize) -> Option<vm_memory::VolatileSlice<'_>> {
        let sh = self.shared()?;
        sh.window.get_slice(usize::try_from(offset).ok()?, len).ok()
    }

    fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.as_ref()
    }

    fn read_reg(&self, off: u64) -> u32 {
        let Some(sh) = self.shared() else { return 0 };
        let lo_hi = |v: u64, base: u64| {
            if off == base {
                v as u32
            } else {
                (v >> 32) as u32
            }
        };
        let features = abi::FEATURE_EVENT_IDX
            | abi::FEATURE_POLLED
            | abi::FEATURE_WINDOW
            | abi::FEATURE_TIMESTAMP
            | abi::FEATURE_FUNC_INFO
            | abi::FEATURE_OCCUPANCY
            | abi::FEATURE_CONSOLE
            | abi::FEATURE_VALUES
            | if self.max_contexts.is_some() {
                abi::FEATURE_CONTEXTS
            } else {
                0
            }
            | if self.cooperative {
                abi::FEATURE_COOPERATIVE
            } else {
                0
            }
            | if self.vmm { abi::FEATURE_VMM } else { 0 }
            | if self.arrays { abi::FEATURE_ARRAYS } else { 0 }
            | abi::FEATURE_RESIZE;
        match off {
            abi::REG_MAGIC => abi::ABI_MAGIC,
            abi::REG_VERSION => (abi::ABI_VERSION_MAJOR << 16) | abi::ABI_VERSION_MINOR,
            o if o == abi::REG_FEATURES || o == abi::REG_FEATURES + 4 => {
                lo_hi(features, abi::REG_FEATURES)
            }
            o if o == abi::REG_MEM_SIZE || o == abi::REG_MEM_SIZE + 4 => {
                lo_hi(self.mem_size.load(Ordering::Acquire), abi::REG_MEM_SIZE)
            }
            abi::REG_COMPUTE_UNITS => self.compute_units,
            abi::REG_MAX_QUEUES => self.config.queues,
            o if o == abi::REG_WINDOW_SIZE || o == abi::REG_WINDOW_SIZE + 4 => {
                lo_hi(self.config.window_size, abi::REG_WINDOW_SIZE)
            }
            abi::REG_MAX_QUEUE_SIZE => abi::MAX_QUEUE_SIZE,
            abi::REG_DOORBELL_OFFSET => abi::DOORBELL_OFFSET as u32,
            abi::REG_CONTROL => lock(&sh.state).control,
            abi::REG_STATUS => lock(&sh.state).status,
            abi::REG_IRQ_CAUSE => lock(&sh.state).irq_cause,
            abi::REG_IRQ_MASK => lock(&sh.state).irq_mask,
            abi::REG_ERROR_COUNT => lock(&sh.state).error_count,
            o if o == abi::REG_MEM_USED || o == abi::REG_MEM_USED + 4 => lo_hi(
                sh.counters.mem_used.load(Ordering::Relaxed),
                abi::REG_MEM_USED,
            ),
            o if o == abi::REG_BUSY_NS || o == abi::REG_BUSY_NS + 4 => lo_hi(
                sh.counters.busy_ns.load(Ordering::Relaxed),
                abi::REG_BUSY_NS,
            ),
            o if o == abi::REG_COMMANDS || o == abi::REG_COMMANDS + 4 => lo_hi(
                sh.counters.commands.load(Ordering::Relaxed),
                abi::REG_COMMANDS,
            ),
            abi::REG_MAX_CONTEXTS => self.max_contexts.unwrap_or(0),
            abi::REG_CONTEXTS => sh.counters.contexts.load(Ordering::Relaxed),
            o if o == abi::REG_CONTEXT_COST || o == abi::REG_CONTEXT_COST + 4 => {
                lo_hi(self.context_cost, abi::REG_CONTEXT_COST)
            }
            o if (abi::ERROR_LOG_OFFSET
                ..abi::ERROR_LOG_OFFSET + u64::from(abi::ERROR_LOG_ENTRIES) * 16)
                .contains(&o) =>
            {
                let rel = o - abi::ERROR_LOG_OFFSET;
                let e = lock(&sh.state).error_log[(rel / 16) as usize];
                match rel % 16 {
                    0 => e.code,
                    4 => e.queue,
                    8 => e.detail as u32,
                    _ => (e.detail >> 32) as u32,
                }
            }
            o if (abi::QUEUE_REGS_OFFSET..abi::DOORBELL_OFFSET).contains(&o) => {
                let q = ((o - abi::QUEUE_REGS_OFFSET) / abi::QUEUE_REGS_STRIDE) as usize;
                let reg = (o - abi::QUEUE_REGS_OFFSET) % abi::QUEUE_REGS_STRIDE;
                let st = lock(&sh.state);
                let Some(qr) = st.queues.get(q) else { return 0 };
                match reg {
                    abi::QREG_SIZE => qr.size,
                    abi::QREG_CONTROL => qr.control,
                    abi::QREG_STATUS => qr.status,
                    abi::QREG_ERROR => qr.error,
                    r if r == abi::QREG_DESC || r == abi::QREG_DESC + 4 => {
                        lo_hi(qr.desc, abi::QREG_DESC + (o - reg))
                    }
                    r if r == abi::QREG_AVAIL || r == abi::QREG_AVAIL + 4 => {
                        lo_hi(qr.avail, abi::QREG_AVAIL + (o - reg))
                    }
                    r if r == abi::QREG_USED || r == abi::QREG_USED + 4 => {
                        lo_hi(qr.used, abi::QREG_USED + (o - reg))
                    }
                    abi::QREG_MSIX_VECTOR => qr.vector,
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    fn write_reg(&mut self, off: u64, value: u32) {
        let Some(sh) = self.shared().cloned() else {
            return;
        };
        match off {
            abi::REG_CONTROL => {
                if value & abi::CONTROL_RESET != 0 {
                    // A register reset leaves PCI config space (BARs,
                    // command register, MSI-X) as the guest set it.
                    self.reset_function(false);
                    return;
                }
                {
                    let mut st = lock(&sh.state);
                    st.control = value & abi::CONTROL_ENABLE;
                    if value & abi::CONTROL_ENABLE != 0 {
                        st.status |= abi::STATUS_ENABLED;
                    } else {
                        st.status &= !abi::STATUS_ENABLED;
                    }
                }
                let _ = sh.wake.write(1);
            }
            abi::REG_IRQ_CAUSE => lock(&sh.state).irq_cause &= !value,
            abi::REG_IRQ_MASK => lock(&sh.state).irq_mask = value,
            abi::REG_WAKE => {
                let _ = sh.wake.write(1);
            }
            o if (abi::QUEUE_REGS_OFFSET..abi::DOORBELL_OFFSET).contains(&o) => {
                let q = ((o - abi::QUEUE_REGS_OFFSET) / abi::QUEUE_REGS_STRIDE) as u32;
                let reg = (o - abi::QUEUE_REGS_OFFSET) % abi::QUEUE_REGS_STRIDE;
                if q < self.config.queues {
                    self.write_queue_reg(&sh, q, reg, value);
                }
            }
            _ => {}
        }
    }

    fn write_queue_reg(&mut self, sh: &Arc<Shared>, q: u32, reg: u64, value: u32) {
        if reg == abi::QREG_CONTROL {
            return self.queue_control(sh, q, value);
        }
        let mut st = lock(&sh.state);
        let qr = &mut st.queues[q as usize];
        let enabled = qr.control & abi::QCONTROL_ENABLE != 0;
        let set_lo = |v: &mut u64| *v = (*v & !0xffff_ffff) | u64::from(value);
        let set_hi = |v: &mut u64| *v = (*v & 0xffff_ffff) | (u64::from(value) << 32);
        match reg {
            abi::QREG_MSIX_VECTOR if value < abi::MSIX_VECTORS || value == abi::MSIX_NO_VECTOR => {
                qr.vector = value
            }
            _ if enabled => {
                drop(st);
                // The ring layout cannot change under a running queue.
                sh.log_error(abi::ERR_REGISTER, q, reg);
            }
            abi::QREG_SIZE => qr.size = value,
            abi::QREG_DESC => set_lo(&mut qr.desc),
            r if r == abi::QREG_DESC + 4 => set_hi(&mut qr.desc),
            abi::QREG_AVAIL => set_lo(&mut qr.avail),
            r if r == abi::QREG_AVAIL + 4 => set_hi(&mut qr.avail),
            abi::QREG_USED => set_lo(&mut qr.used),
            r if r == abi::QREG_USED + 4 => set_hi(&mut qr.used),
            _ => {
                drop(st);
                sh.log_error(abi::ERR_REGISTER, q, reg);
            }
        }
    }

    fn queue_control(&mut self, sh: &Arc<Shared>, q: u32, value: u32) {
        let want = value & abi::QCONTROL_ENABLE != 0;
        {
            let mut st = lock(&sh.state);
            let qr = &mut st.queues[q as usize];
            if want && qr.control & abi::QCONTROL_ENABLE != 0 {
                // Already running: only the polled bit may change; the
                // ring keeps its position.
                qr.control = value & (abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED);
                let polled = qr.control & abi::QCONTROL_POLLED != 0;
                sh.refresh_any_polled(&st);
                drop(st);
                sh.set_polling(q, polled);
                let _ = sh.wake.write(1);
                return;
            }
            // Stop the worker from starting more of this queue's work.
            qr.generation += 1;
            qr.ring = None;
            sh.config_gen.fetch_add(1, Ordering::SeqCst);
        }
        // Wait for a command of this queue that is running to finish.
        let _busy = lock(&sh.busy);
        let mut st = lock(&sh.state);
        let qr = &mut st.queues[q as usize];
        qr.generation += 1;
        if !want {
            qr.control = 0;
            qr.status = 0;
            qr.error = 0;
            qr.ring = None;
            sh.refresh_any_polled(&st);
            drop(st);
            sh.set_polling(q, false);
            return;
        }
        qr.control = value & (abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED);
        // A ring enabled while draining holds only new work.
        qr.drain_limit = None;
        match build_ring(&sh.ctx, qr) {
            Ok(ring) => {
                qr.ring = Some(ring);
                qr.status = abi::QSTATUS_ENABLED;
                qr.error = 0;
                let polled = qr.control & abi::QCONTROL_POLLED != 0;
                sh.refresh_any_polled(&st);
                drop(st);
                sh.set_polling(q, polled);
                let _ = sh.wake.write(1);
            }
            Err(code) => {
                qr.ring = None;
                qr.status = abi::QSTATUS_ERROR;
                qr.error = code;
                drop(st);
                sh.log_error(code, q, 0);
            }
        }
    }

    /// Returns the function to its power-on state: queues stop, in-flight
    /// work is dropped, device memory is freed.
    fn reset_function(&mut self, config_space: bool) {
        if config_space {
            self.pci.reset();
        }
        let Some(sh) = self.shared().cloned() else {
            return;
        };
        // Odd while the reset runs: the worker starts nothing new.
        sh.epoch_gen.fetch_add(1, Ordering::SeqCst);
        let _ = sh.wake.write(1);
        let _busy = lock(&sh.busy);
        *lock(&sh.state) = State::new(self.config.queues);
        sh.any_polled.store(false, Ordering::Relaxed);
        {
            let mut part = sh.partition.lock();
            part.reset();
            lock(&sh.functions).clear();
        }
        sh.counters.mem_used.store(0, Ordering::Relaxed);
        sh.counters.contexts.store(0, Ordering::Relaxed);
        sh.counters.context_memory.store(0, Ordering::Relaxed);
        sh.counters.busy_ns.store(0, Ordering::Relaxed);
        sh.counters.commands.store(0, Ordering::Relaxed);
        sh.counters.resets.fetch_add(1, Ordering::Relaxed);
        zero(&sh.doorbells);
        zero(&sh.window);
        sh.epoch_gen.fetch_add(1, Ordering::SeqCst);
        info!("{}: function reset", sh.name);
    }
}

fn zero(region: &MmapRegion) {
    const CHUNK: usize = 1 << 16;
    let zeros = [0u8; CHUNK];
    let mut off = 0;
    while off < region.len() {
        let n = CHUNK.min(region.len() - off);
        if let Ok(s) = region.get_slice(off, n) {
            s.copy_from(&zeros[..n]);
        }
        off += n;
    }
}

/// Validates a queue's registers and builds its ring.
fn build_ring(ctx: &DeviceContext, qr: &QueueRegs) -> Result<Queue, u32> {
    let size = u16::try_from(qr.size).map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    if size == 0 || !size.is_power_of_two() || u32::from(size) > abi::MAX_QUEUE_SIZE {
        return Err(abi::ERR_QUEUE_CONFIG);
    }
    let mut ring = Queue::new(abi::MAX_QUEUE_SIZE as u16).map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    ring.try_set_size(size).map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    ring.try_set_desc_table_address(GuestAddress(qr.desc))
        .map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    ring.try_set_avail_ring_address(GuestAddress(qr.avail))
        .map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    ring.try_set_used_ring_address(GuestAddress(qr.used))
        .map_err(|_| abi::ERR_QUEUE_CONFIG)?;
    ring.set_event_idx(true);
    ring.set_ready(true);
    let n = usize::from(size);
    let view = ctx.dma.view();
    // Rings must sit in shared memory the device may read and write: they
    // are polled, so they cannot go through DMA_READ round trips.
    let ok = view.check_range(GuestAddress(qr.desc), 16 * n, Permissions::Read)
        && view.check_range(GuestAddress(qr.avail), 6 + 2 * n, Permissions::Read)
        && view.check_range(GuestAddress(qr.used), 6 + 8 * n, Permissions::ReadWrite);
    if !ok || !ring.is_valid(&view) {
        return Err(abi::ERR_RING_ADDRESS);
    }
    Ok(ring)
}

impl PciDevice for VgpuDevice {
    fn bind(&mut self, ctx: DeviceContext) {
        let Some((partition, doorbells, window)) = self.pending.take() else {
            return;
        };
        let lanes = partition.lock().lanes().clamp(1, abi::MAX_QUEUES as usize);
        let shared = Arc::new(Shared {
            name: self.config.name.clone(),
            ctx,
            state: Mutex::new(State::new(self.config.queues)),
            partition,
            watch: self.watch,
            functions: Mutex::new(command::Functions::default()),
            doorbells,
            window,
            wake: match self.wake.try_clone() {
                Ok(e) => e,
                Err(e) => {
                    warn_limited!("{}: cannot create wake event: {e}", self.config.name);
                    return;
                }
            },
            stop: AtomicBool::new(false),
            paused: Arc::clone(&self.paused),
            waits_for_resume: AtomicBool::new(false),
            on_wanted: self.config.on_wanted.clone(),
            log: Mutex::new(Default::default()),
            any_polled: AtomicBool::new(false),
            last_run_ns: AtomicU64::new(0),
            last_run_end: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
            config_gen: AtomicU64::new(0),
            epoch_gen: AtomicU64::new(0),
            busy: Mutex::new(()),
            counters: self.counters.clone(),
            gate: self.config.gate.clone(),
            drain: self.drain.clone(),
            epoch: Instant::now(),
            poll_spin: self.config.poll_spin,
            num_queues: self.config.queues,
        });
        let worker_shared = shared.clone();
        match std::thread::Builder::new()
            .name(format!("vgpu-{}", self.config.name))
            .spawn(move || worker::run(worker_shared))
        {
            Ok(h) => self.worker = Some(h),
            Err(e) => warn_limited!("{}: cannot start worker: {e}", self.config.name),
        }
        let _ = self.bound.set(Arc::downgrade(&shared));
        self.shared = Some(shared);
    }

    fn region_info(&self, index: u32) -> RegionInfo {
        match index {
            BAR0_REGION => RegionInfo {
                size: abi::BAR0_SIZE,
                readable: true,
                writable: true,
                mmap: Some(RegionMmap {
                    file: self.doorbell_file.clone(),
                    file_offset: 0,
                    areas: vec![MmapArea {
                        offset: abi::DOORBELL_OFFSET,
                        size: abi::DOORBELL_SIZE,
                    }],
                }),
            },
            i if i == abi::BAR_WINDOW => RegionInfo {
                size: self.config.window_size,
                readable: true,
                writable: true,
                mmap: Some(RegionMmap {
                    file: self.window_file.clone(),
                    file_offset: 0,
                    areas: Vec::new(),
                }),
            },
            CONFIG_REGION => RegionInfo::trapped(PCIE_CONFIG_SPACE_SIZE as u64),
            _ => RegionInfo::default(),
        }
    }

    fn irq_info(&self, index: u32) -> IrqInfo {
        IrqInfo::pci_function(index, abi::MSIX_VECTORS)
    }

    // A guest's own accesses never fail: a VMM may wait forever for a
    // reply it cannot use (see docs/guest-abi.md for what each returns).
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match index {
            BAR0_REGION => self.bar0_read(offset, data),
            i if i == abi::BAR_WINDOW => match self.window(offset, data.len()) {
                Some(slice) => {
                    slice.copy_to(data);
                }
                None => data.fill(0),
            },
            CONFIG_REGION => self.pci.read(offset, data),
            _ => return Err(DeviceError::Unsupported),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match index {
            BAR0_REGION => self.bar0_write(offset, data),
            i if i == abi::BAR_WINDOW => {
                if let Some(slice) = self.window(offset, data.len()) {
                    slice.copy_from(data);
                }
            }
            CONFIG_REGION => self.pci.write(offset, data),
            _ => return Err(DeviceError::Unsupported),
        }
        Ok(())
    }

    fn reset(&mut self) {
        // DEVICE_RESET or the client going away: a function-level reset.
        self.reset_function(true);
    }

    fn ioeventfd_direct(
        &self,
        index: u32,
        spec: &vfio_user_server::device::IoEventSpec,
    ) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::{AsRawFd, BorrowedFd};
        (index == BAR0_REGION && spec.offset == abi::REG_WAKE).then(|| {
            // SAFETY: the eventfd is owned by self and stays open for the
            // lifetime of the borrow of self.
            unsafe { BorrowedFd::borrow_raw(self.wake.as_raw_fd()) }
        })
    }

    fn dma_mapped(&mut self, m: &vfio_user_server::dma::Mapped) {
        let Some(hm) = &self.host_memory else {
            return;
        };
        let Ok(len) = usize::try_from(m.size) else {
            return;
        };
        hm.mapped(HostMapping {
            id: m.id,
            addr: m.host_addr,
            len,
            readable: m.readable,
            writable: m.writable,
            file: m.file.clone(),
            file_offset: m.file_offset,
        });
    }

    fn dma_unmapped(&mut self, ranges: &[vfio_user_server::dma::Unmapped]) {
        if let Some(hm) = &self.host_memory {
            for r in ranges {
                hm.unmapped(r.id);
            }
        }
    }

    fn ioeventfds(&self, index: u32) -> Vec<vfio_user_server::device::IoEventSpec> {
        if index == BAR0_REGION {
            vec![vfio_user_server::device::IoEventSpec {
                offset: abi::REG_WAKE,
                size: 4,
                datamatch: None,
            }]
        } else {
            Vec::new()
        }
    }
}

impl Drop for VgpuDevice {
    fn drop(&mut self) {
        if let Some(sh) = &self.shared {
            sh.stop.store(true, Ordering::SeqCst);
            let _ = sh.wake.write(1);
        }
        if let Some(h) = self.worker.take() {
            let _ = h.join();
        }
    }
}
