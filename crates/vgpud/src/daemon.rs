//! Physical GPUs and the vGPU instances running on them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use vfio_user_server::pci::PciIds;
use vfio_user_server::Endpoint;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    Backend, HostMemory, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec,
};
use vgpu_device::{CommandGate, DeviceCounters, DrainHandle, VgpuDevice};
use vmm_sys_util::eventfd::EventFd;

use vgpu_sched::{Grant, Policy as SchedPolicy, SchedConfig, Scheduler, TenantId, TenantParams};

use crate::config::{
    BackendKind, Config, DaemonConfig, GpuConfig, Isolation, PartitionMode, Policy, VgpuConfig,
};

/// Why an operation on GPUs or instances failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No such GPU.
    #[error("no GPU named {0:?}")]
    NoGpu(String),
    /// No such instance.
    #[error("no vGPU named {0:?}")]
    NoInstance(String),
    /// The name is taken.
    #[error("a vGPU named {0:?} exists")]
    Exists(String),
    /// The backend cannot start.
    #[error("GPU {gpu:?}: {message}")]
    Backend {
        /// The GPU.
        gpu: String,
        /// What is wrong.
        message: String,
    },
    /// The partition does not fit.
    #[error("vGPU {name:?} does not fit on GPU {gpu:?}: {message}")]
    DoesNotFit {
        /// The instance.
        name: String,
        /// The GPU.
        gpu: String,
        /// What is short.
        message: String,
    },
    /// A value of the instance's configuration is not acceptable.
    #[error("vGPU {name:?}: {field}: {message}")]
    Invalid {
        /// The instance.
        name: String,
        /// The field, e.g. `memory`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The socket path is taken by another vGPU, the API or something else.
    #[error("vGPU {name:?}: socket {}: {message}", socket.display())]
    SocketInUse {
        /// The instance.
        name: String,
        /// The socket path.
        socket: PathBuf,
        /// Who has it.
        message: String,
    },
    /// The instance is not in a state that allows the operation (e.g.
    /// stopping one that is stopped).
    #[error("vGPU {name:?} {message}")]
    State {
        /// The instance.
        name: String,
        /// Why not, e.g. `is already stopped`.
        message: String,
    },
    /// The device or its socket could not be set up.
    #[error("vGPU {name:?}: {message}")]
    Setup {
        /// The instance.
        name: String,
        /// What failed.
        message: String,
    },
}

struct Gpu {
    backend: Arc<dyn Backend>,
    sched: Scheduler,
    next_tenant: u32,
}

/// Lets a vGPU's commands onto its GPU when the scheduler says so: what
/// the daemon gives every vGPU's device (public for benchmarks that build
/// vGPUs of their own).
pub struct SchedGate {
    sched: Scheduler,
    tenant: TenantId,
    grant: Mutex<Slot>,
}

/// Where a gate's tenant stands between commands.
enum Slot {
    /// Not queued and not holding the GPU.
    Free,
    /// Within a turn: the GPU is ours for the next command.
    Holding(Grant),
    /// The turn ended and the scheduler queued us for the next one.
    Queued,
}

impl SchedGate {
    /// The gate of `tenant`, already added to `sched`.
    pub fn new(sched: Scheduler, tenant: TenantId) -> Self {
        SchedGate {
            sched,
            tenant,
            grant: Mutex::new(Slot::Free),
        }
    }
}

impl CommandGate for SchedGate {
    fn enter(&self, cancelled: &dyn Fn() -> bool) -> bool {
        let mut slot = self.grant.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            // Within a turn the GPU is still ours.
            Slot::Holding(_) => return true,
            // Queued since our last turn ended, or not at all: either way
            // acquire_cancellable waits from our place. A reset of this
            // vGPU is noticed within 5 ms however long we wait.
            Slot::Queued | Slot::Free => {}
        }
        *slot = Slot::Free;
        drop(slot);
        match self
            .sched
            .acquire_cancellable(self.tenant, Duration::from_millis(5), cancelled)
        {
            Ok(Some(g)) => {
                *self.grant.lock().unwrap_or_else(|e| e.into_inner()) = Slot::Holding(g);
                true
            }
            Ok(None) => false,
            Err(e) => {
                // Removed or shut down: make sure nothing stays held.
                log::debug!("vGPU tenant {}: {e}", self.tenant.0);
                self.sched.dequeue(self.tenant);
                false
            }
        }
    }

    fn leave(&self, device_time: Duration, bytes: u64) {
        {
            let mut slot = self.grant.lock().unwrap_or_else(|e| e.into_inner());
            // Keeps the GPU for the next command while the turn lasts;
            // when it ends we are queued for the next turn at once (the
            // worker calls `idle` if there is no next command).
            if let Slot::Holding(g) = &mut *slot {
                if !g.renew_or_queue(device_time) {
                    *slot = Slot::Queued;
                }
            }
        }
        if bytes > 0 {
            let _ = self.sched.record_bytes(self.tenant, bytes);
        }
    }

    fn idle(&self) {
        let slot = std::mem::replace(
            &mut *self.grant.lock().unwrap_or_else(|e| e.into_inner()),
            Slot::Free,
        );
        match slot {
            Slot::Holding(g) => g.yield_turn(),
            Slot::Queued => self.sched.dequeue(self.tenant),
            Slot::Free => {}
        }
    }
}

/// The scheduler of a GPU: under every policy a tenant granted the GPU
/// keeps it for consecutive commands for up to one slice while others
/// wait (so a hand-over between tenants' threads is paid once per slice,
/// not once per command).
fn sched_config(g: &GpuConfig) -> SchedConfig {
    let mut c = sched_config_policy(g);
    c.turn = Duration::from_micros(g.slice_us());
    c
}

fn sched_config_policy(g: &GpuConfig) -> SchedConfig {
    SchedConfig::new(match g.policy {
        Policy::RoundRobin => SchedPolicy::RoundRobin {
            slice: Duration::from_micros(g.slice_us()),
        },
        Policy::Priority => SchedPolicy::Priority {
            aging: Duration::from_micros(g.slice_us() * 10),
        },
        Policy::Fair => SchedPolicy::FairShare,
    })
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Partition calls leave it consistent between calls.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The partition as a device sees it: the instance keeps the partition
/// itself (its reservation on the GPU) across a stop and a start, and
/// each start's device works on it through this.
struct SharedPartition {
    spec: PartitionSpec,
    inner: Arc<Mutex<Box<dyn Partition>>>,
}

impl Partition for SharedPartition {
    fn spec(&self) -> &PartitionSpec {
        &self.spec
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        lock(&self.inner).alloc(size, align)
    }
    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        lock(&self.inner).free(addr)
    }
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        lock(&self.inner).upload(dst, src)
    }
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        lock(&self.inner).download(src, dst)
    }
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        lock(&self.inner).copy(dst, src, size)
    }
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        lock(&self.inner).fill(addr, size, pattern)
    }
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        lock(&self.inner).module_load(format, image)
    }
    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        lock(&self.inner).module_unload(module)
    }
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        lock(&self.inner).launch(launch)
    }
    fn memory_used(&self) -> u64 {
        lock(&self.inner).memory_used()
    }
    fn reset(&mut self) {
        lock(&self.inner).reset()
    }
    // Without this the device would never announce guest memory to the
    // partition and every copy would take the staging path.
    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        lock(&self.inner).host_memory()
    }
}

/// Whether an instance serves its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Its socket accepts a VMM.
    Running,
    /// Configured, with its partition reserved, but no socket: the
    /// function is powered off.
    Stopped,
}

impl InstanceState {
    /// `running` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
        }
    }
}

/// A started instance's device, served on its socket by a thread.
struct Serving {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    drain: DrainHandle,
}

/// Device counters of functions an instance ran before its latest start,
/// so that counters an operator watches do not go back.
#[derive(Clone, Copy, Default)]
struct Carried {
    faults: u64,
    errors: u64,
    resets: u64,
    odd_reads: u64,
    dropped_writes: u64,
    peak: u64,
}

/// A vGPU: its configuration, partition and scheduler tenant, and while it
/// runs, its device.
struct Instance {
    config: VgpuConfig,
    socket: PathBuf,
    tenant: TenantId,
    partition: Arc<Mutex<Box<dyn Partition>>>,
    gate: Arc<SchedGate>,
    counters: Arc<DeviceCounters>,
    carried: Carried,
    serving: Option<Serving>,
}

impl Instance {
    fn state(&self) -> InstanceState {
        if self.serving.is_some() {
            InstanceState::Running
        } else {
            InstanceState::Stopped
        }
    }

    /// Builds a device on the partition and serves it on the socket.
    /// Builds the device and serves it on the socket: the socket goes to
    /// `socket_gid` when set, and `hook` runs first in the serving thread
    /// (it may refuse, and then nothing is served).
    fn serve(
        &mut self,
        socket_gid: Option<u32>,
        hook: Option<ServingThreadHook>,
    ) -> Result<(), DaemonError> {
        let v = &self.config;
        let setup = |message: String| DaemonError::Setup {
            name: v.name.clone(),
            message,
        };
        let mut dc = vgpu_device::VgpuConfig::new(v.name.clone());
        dc.ids = PciIds {
            vendor: v.pci_vendor.unwrap_or(dc.ids.vendor),
            device: v.pci_device.unwrap_or(dc.ids.device),
            ..dc.ids
        };
        dc.queues = v.queues;
        dc.window_size = v.window.0;
        dc.poll_spin = Duration::from_micros(v.poll_us);
        dc.gate = Some(self.gate.clone());
        let partition = SharedPartition {
            spec: lock(&self.partition).spec().clone(),
            inner: self.partition.clone(),
        };
        let device = VgpuDevice::new(dc, Box::new(partition)).map_err(|e| setup(e.to_string()))?;
        let counters = device.counters();
        let drain = device.drain_handle().map_err(|e| setup(e.to_string()))?;
        if let Some(dir) = self.socket.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| setup(format!("cannot create {}: {e}", dir.display())))?;
        }
        let endpoint =
            Endpoint::new(v.name.clone(), &self.socket, Box::new(device)).map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                setup(format!("{e}{cause}"))
            })?;
        if let Some(gid) = socket_gid {
            crate::confine::share_socket(&self.socket, gid).map_err(|e| setup(e.to_string()))?;
        }
        let stop = endpoint.stop_handle().map_err(|e| setup(e.to_string()))?;
        let name = v.name.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(format!("vfio-{name}"))
            .spawn(move || {
                let ready = hook.map_or(Ok(()), |h| h());
                let failed = ready.is_err();
                let _ = ready_tx.send(ready);
                if failed {
                    return;
                }
                if let Err(e) = endpoint.run() {
                    error!("vGPU {name}: {e}");
                }
            })
            .map_err(|e| setup(e.to_string()))?;
        if let Err(e) = ready_rx.recv().unwrap_or_else(|_| Err("it ended".into())) {
            let _ = thread.join();
            return Err(setup(format!("serving thread: {e}")));
        }
        self.counters = counters;
        self.serving = Some(Serving {
            stop,
            thread: Some(thread),
            drain,
        });
        Ok(())
    }

    /// Powers the function off: the client is disconnected, the device
    /// reset and dropped, its socket removed and its device memory freed.
    /// The partition (the reservation) stays.
    fn halt(&mut self) {
        let Some(mut serving) = self.serving.take() else {
            return;
        };
        let _ = serving.stop.write(1);
        if let Some(t) = serving.thread.take() {
            if t.join().is_err() {
                error!("vGPU {}: serving thread panicked", self.config.name);
            }
        }
        // The endpoint resets the device when a client leaves; without a
        // client nothing may have; either way nothing stays allocated.
        lock(&self.partition).reset();
        let c = &self.counters;
        self.carried = Carried {
            faults: self.carried.faults + c.faults.load(Ordering::Relaxed),
            errors: self.carried.errors + c.errors.load(Ordering::Relaxed),
            resets: self.carried.resets + c.resets.load(Ordering::Relaxed),
            odd_reads: self.carried.odd_reads + c.odd_reads.load(Ordering::Relaxed),
            dropped_writes: self.carried.dropped_writes + c.dropped_writes.load(Ordering::Relaxed),
            peak: self.carried.peak.max(c.mem_peak.load(Ordering::Relaxed)),
        };
        self.counters = Arc::new(DeviceCounters::default());
    }

    fn info(&self) -> InstanceInfo {
        InstanceInfo {
            config: self.config.clone(),
            socket: self.socket.clone(),
            state: self.state(),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Whether a socket can be bound at `path`: nothing there, or a socket no
/// one listens on. Otherwise says what is in the way.
fn socket_obstacle(path: &Path) -> Option<&'static str> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            Some("a file that is not a socket is there")
        }
        Ok(_) if std::os::unix::net::UnixStream::connect(path).is_ok() => {
            Some("another process listens on it")
        }
        _ => None,
    }
}

/// After the grace, how long a shutdown waits for cancellations: a command
/// that was running at the deadline must finish first.
const CANCEL_MARGIN: Duration = Duration::from_secs(2);

/// Summary of one instance.
#[derive(Clone, Debug)]
pub struct InstanceInfo {
    /// Its configuration.
    pub config: VgpuConfig,
    /// Its socket.
    pub socket: PathBuf,
    /// Running or stopped.
    pub state: InstanceState,
}

/// What an operator sees of one vGPU.
#[derive(Clone, Debug)]
pub struct InstanceStats {
    /// Instance name.
    pub name: String,
    /// Its GPU.
    pub gpu: String,
    /// Running or stopped.
    pub state: InstanceState,
    /// Device memory quota, bytes.
    pub memory_quota: u64,
    /// Device memory in use, bytes.
    pub memory_used: u64,
    /// Peak device memory, bytes.
    pub memory_peak: u64,
    /// Commands run since the vGPU was created.
    pub commands: u64,
    /// Device time consumed, as the scheduler charged it.
    pub busy: Duration,
    /// Bytes copied between guest/window memory and the device.
    pub bytes: u64,
    /// Queue wait before the GPU was granted, p50 and p99.
    pub wait_p50: Duration,
    /// See `wait_p50`.
    pub wait_p99: Duration,
    /// Times the fixed-share cap delayed it.
    pub capped: u64,
    /// Guest memory faults.
    pub faults: u64,
    /// Device errors logged.
    pub errors: u64,
    /// Function resets.
    pub resets: u64,
    /// Guest register reads answered from the registers they overlap.
    pub odd_reads: u64,
    /// Guest writes the device dropped.
    pub dropped_writes: u64,
}

/// What an operator sees of one GPU.
#[derive(Clone, Debug)]
pub struct GpuStats {
    /// GPU name.
    pub name: String,
    /// Backend name.
    pub backend: String,
    /// Device time used / wall time since start.
    pub utilization: f64,
    /// Device time used.
    pub busy: Duration,
    /// Switches between tenants.
    pub switches: u64,
    /// Commands run.
    pub commands: u64,
}

/// What an operator sees of one GPU's configuration and capacity.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    /// Its configuration.
    pub config: GpuConfig,
    /// Backend name.
    pub backend: String,
    /// Device memory of the GPU, bytes.
    pub memory_total: u64,
    /// Compute units of the GPU.
    pub compute_units_total: u32,
    /// Memory promised to its vGPUs (the sum of their quotas), bytes.
    pub memory_allocated: u64,
    /// Compute units given to its vGPUs.
    pub compute_units_allocated: u32,
    /// Its vGPUs, by name.
    pub vgpus: Vec<String>,
}

/// Totals of one vGPU's queue waits, for a summary with the quantiles of
/// [`InstanceStats`].
#[derive(Clone, Debug)]
pub struct QueueWaitTotals {
    /// Instance name.
    pub name: String,
    /// Waits recorded (one per grant of the GPU).
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
}

/// Owns the GPUs and instances.
pub struct Daemon {
    config: Config,
    gpus: BTreeMap<String, Gpu>,
    instances: BTreeMap<String, Instance>,
    serving_hook: Option<ServingThreadHook>,
}

/// Runs first in each thread that serves a vGPU (its vfio-user event
/// loop, which starts the device's own threads), before it reads from
/// the socket; an error fails the vGPU's creation. The `vgpud` binary
/// narrows those threads' system calls with it.
pub type ServingThreadHook = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

fn tenant_params(v: &VgpuConfig) -> TenantParams {
    TenantParams {
        weight: v.weight,
        priority: v.priority,
        cap: v.cap,
    }
}

fn make_backend(g: &GpuConfig, d: &DaemonConfig) -> Result<Arc<dyn Backend>, DaemonError> {
    if g.isolation() == Isolation::Process {
        return make_remote_backend(g, d);
    }
    match g.backend {
        BackendKind::Software => {
            let memory = g.memory.map(|m| m.0).unwrap_or(0);
            Ok(Arc::new(SoftwareBackend::new(memory, g.compute_units)))
        }
        BackendKind::Cuda => {
            let mode = match g.partition_mode {
                PartitionMode::Isolated => vgpu_backend_cuda::Mode::Isolated,
                PartitionMode::Spatial => vgpu_backend_cuda::Mode::Spatial,
            };
            vgpu_backend_cuda::CudaBackend::new(g.device, mode)
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
                .map_err(|e| DaemonError::Backend {
                    gpu: g.name.clone(),
                    message: e.to_string(),
                })
        }
    }
}

/// A backend whose partitions each run in a partition host process,
/// started by a launcher process started here: before the daemon drops
/// its privileges and confines itself. Hosts run as the account the
/// daemon switches to, under the daemon's filter mode.
fn make_remote_backend(g: &GpuConfig, d: &DaemonConfig) -> Result<Arc<dyn Backend>, DaemonError> {
    use vgpu_backend_remote::{
        HostOptions, HostPolicy, InnerBackend, ProcessLauncher, RemoteBackend, RemoteConfig,
    };
    let fail = |message: String| DaemonError::Backend {
        gpu: g.name.clone(),
        message,
    };
    let inner = match g.backend {
        BackendKind::Software => InnerBackend::Software {
            memory: g.memory.map(|m| m.0).unwrap_or(0),
            compute_units: g.compute_units,
        },
        BackendKind::Cuda => {
            // Said here, before any host starts, so the message is plain.
            vgpu_backend_cuda::cuda_available()
                .map_err(|why| fail(format!("backend unavailable: no CUDA driver: {why}")))?;
            InnerBackend::Cuda {
                device: g.device,
                guest_ptx: g.guest_ptx,
            }
        }
    };
    let program = match &g.partition_host {
        Some(p) => p.clone(),
        None => vgpu_backend_remote::default_host_program()
            .map_err(|e| fail(format!("cannot locate the partition host: {e}")))?,
    };
    // CUDA: both sides poll 50 µs for the next message, as a vGPU's worker
    // polls its queues (on an H200 this took 6 µs off each round trip).
    // The software backend keeps the CPUs it computes on.
    let spin = match g.backend {
        BackendKind::Cuda => Duration::from_micros(50),
        BackendKind::Software => Duration::ZERO,
    };
    let options = HostOptions {
        backend: inner,
        spin,
    };
    let policy = HostPolicy {
        seccomp: d.seccomp,
        account: d.account.clone(),
    };
    let launcher = ProcessLauncher::with_policy(program, options.to_args(), &policy)
        .map_err(|e| fail(format!("cannot start the partition host launcher: {e}")))?;
    let config = RemoteConfig {
        spin,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(Arc::new(launcher), config)
        .map(|b| Arc::new(b) as Arc<dyn Backend>)
        .map_err(|e| fail(e.to_string()))
}

impl Daemon {
    /// Starts the GPUs of `config` (no instances yet).
    pub fn new(config: Config) -> Result<Self, DaemonError> {
        let mut gpus = BTreeMap::new();
        for g in &config.gpus {
            let backend = make_backend(g, &config.daemon)?;
            let sched = Scheduler::new(sched_config(g)).map_err(|e| DaemonError::Backend {
                gpu: g.name.clone(),
                message: e.to_string(),
            })?;
            info!(
                "GPU {}: {} backend, {} compute units",
                g.name,
                backend.name(),
                backend.capacity().compute_units
            );
            gpus.insert(
                g.name.clone(),
                Gpu {
                    backend,
                    sched,
                    next_tenant: 0,
                },
            );
        }
        Ok(Daemon {
            config,
            gpus,
            instances: BTreeMap::new(),
            serving_hook: None,
        })
    }

    /// Sets the hook run first in every vGPU's serving thread created
    /// from now on.
    pub fn set_serving_thread_hook(&mut self, hook: ServingThreadHook) {
        self.serving_hook = Some(hook);
    }

    /// Creates and starts every instance of the configuration.
    pub fn start_all(&mut self) -> Result<(), DaemonError> {
        for v in self.config.vgpus.clone() {
            self.create(v)?;
        }
        Ok(())
    }

    /// Creates and starts an instance.
    pub fn create(&mut self, v: VgpuConfig) -> Result<(), DaemonError> {
        if self.instances.contains_key(&v.name) {
            return Err(DaemonError::Exists(v.name));
        }
        let gpu = self
            .gpus
            .get_mut(&v.gpu)
            .ok_or_else(|| DaemonError::NoGpu(v.gpu.clone()))?;
        let partition = gpu
            .backend
            .create_partition(&PartitionSpec {
                name: v.name.clone(),
                memory: v.memory.0,
                compute_units: v.compute_units,
            })
            .map_err(|e| DaemonError::DoesNotFit {
                name: v.name.clone(),
                gpu: v.gpu.clone(),
                message: e.to_string(),
            })?;
        let tenant = TenantId(gpu.next_tenant);
        gpu.sched
            .add_tenant(tenant, tenant_params(&v))
            .map_err(|e| DaemonError::Setup {
                name: v.name.clone(),
                message: e.to_string(),
            })?;
        gpu.next_tenant += 1;
        let sched = gpu.sched.clone();
        let mut inst = Instance {
            socket: self.config.socket_path(&v),
            tenant,
            partition: Arc::new(Mutex::new(partition)),
            gate: Arc::new(SchedGate::new(sched.clone(), tenant)),
            counters: Arc::new(DeviceCounters::default()),
            carried: Carried::default(),
            serving: None,
            config: v,
        };
        if let Err(e) = inst.serve(self.config.daemon.socket_gid, self.serving_hook.clone()) {
            let _ = sched.remove_tenant(tenant);
            return Err(e);
        }
        let v = &inst.config;
        info!(
            "vGPU {} on GPU {}: {} memory, {} compute units, listening on {}",
            v.name,
            v.gpu,
            v.memory,
            v.compute_units,
            inst.socket.display()
        );
        self.instances.insert(v.name.clone(), inst);
        Ok(())
    }

    /// Powers an instance off: its client is disconnected, its device
    /// reset (device memory freed) and its socket removed; its
    /// configuration, partition reservation and scheduler figures stay.
    pub fn stop(&mut self, name: &str) -> Result<(), DaemonError> {
        let inst = self
            .instances
            .get_mut(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        if inst.serving.is_none() {
            return Err(DaemonError::State {
                name: name.to_string(),
                message: "is already stopped".into(),
            });
        }
        inst.halt();
        info!("vGPU {name}: stopped; {} removed", inst.socket.display());
        Ok(())
    }

    /// Starts a stopped instance again, on the same socket and partition.
    pub fn start(&mut self, name: &str) -> Result<(), DaemonError> {
        let inst = self
            .instances
            .get_mut(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        if inst.serving.is_some() {
            return Err(DaemonError::State {
                name: name.to_string(),
                message: "is already running".into(),
            });
        }
        if let Some(why) = socket_obstacle(&inst.socket) {
            return Err(DaemonError::SocketInUse {
                name: name.to_string(),
                socket: inst.socket.clone(),
                message: why.into(),
            });
        }
        inst.serve(self.config.daemon.socket_gid, self.serving_hook.clone())?;
        info!(
            "vGPU {name}: started, listening on {}",
            inst.socket.display()
        );
        Ok(())
    }

    /// Stops an instance if it runs, and frees its partition.
    pub fn destroy(&mut self, name: &str) -> Result<(), DaemonError> {
        let mut inst = self
            .instances
            .remove(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        inst.halt();
        if let Some(gpu) = self.gpus.get(&inst.config.gpu) {
            let _ = gpu.sched.remove_tenant(inst.tenant);
        }
        drop(inst);
        info!("vGPU {name}: destroyed");
        Ok(())
    }

    /// The instances, running or stopped.
    pub fn list(&self) -> Vec<InstanceInfo> {
        self.instances.values().map(Instance::info).collect()
    }

    /// Per-vGPU and per-GPU figures.
    pub fn stats(&self) -> (Vec<GpuStats>, Vec<InstanceStats>) {
        let mut gpus = Vec::new();
        let mut out = Vec::new();
        for (name, gpu) in &self.gpus {
            let s = gpu.sched.stats();
            gpus.push(GpuStats {
                name: name.clone(),
                backend: gpu.backend.name().to_string(),
                utilization: s.gpu.utilization,
                busy: s.gpu.busy,
                switches: s.gpu.switches,
                commands: s.gpu.commands,
            });
            for inst in self.instances.values().filter(|i| &i.config.gpu == name) {
                let c = &inst.counters;
                let k = &inst.carried;
                let t = s.tenant(inst.tenant);
                out.push(InstanceStats {
                    name: inst.config.name.clone(),
                    gpu: name.clone(),
                    state: inst.state(),
                    memory_quota: inst.config.memory.0,
                    memory_used: c.mem_used.load(Ordering::Relaxed),
                    memory_peak: k.peak.max(c.mem_peak.load(Ordering::Relaxed)),
                    // The scheduler's count survives function resets.
                    commands: t.map(|t| t.commands).unwrap_or_default(),
                    busy: t.map(|t| t.busy).unwrap_or_default(),
                    bytes: t.map(|t| t.bytes).unwrap_or_default(),
                    wait_p50: t.map(|t| t.wait.p50).unwrap_or_default(),
                    wait_p99: t.map(|t| t.wait.p99).unwrap_or_default(),
                    capped: t.map(|t| t.capped).unwrap_or_default(),
                    faults: k.faults + c.faults.load(Ordering::Relaxed),
                    errors: k.errors + c.errors.load(Ordering::Relaxed),
                    resets: k.resets + c.resets.load(Ordering::Relaxed),
                    odd_reads: k.odd_reads + c.odd_reads.load(Ordering::Relaxed),
                    dropped_writes: k.dropped_writes + c.dropped_writes.load(Ordering::Relaxed),
                });
            }
        }
        (gpus, out)
    }

    /// Changes a running instance's weight, priority and cap.
    pub fn set_params(
        &mut self,
        name: &str,
        weight: Option<u32>,
        priority: Option<i32>,
        cap: Option<Option<f64>>,
    ) -> Result<(), DaemonError> {
        let inst = self
            .instances
            .get_mut(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        let mut v = inst.config.clone();
        if let Some(w) = weight {
            v.weight = w;
        }
        if let Some(p) = priority {
            v.priority = p;
        }
        if let Some(c) = cap {
            v.cap = c;
        }
        crate::config::validate_vgpu(&v).map_err(|(field, message)| DaemonError::Setup {
            name: name.to_string(),
            message: format!("{field}: {message}"),
        })?;
        let gpu = self
            .gpus
            .get(&v.gpu)
            .ok_or_else(|| DaemonError::NoGpu(v.gpu.clone()))?;
        gpu.sched
            .update_tenant(inst.tenant, tenant_params(&v))
            .map_err(|e| DaemonError::Setup {
                name: name.to_string(),
                message: e.to_string(),
            })?;
        info!(
            "vGPU {name}: weight {} priority {} cap {:?}",
            v.weight, v.priority, v.cap
        );
        inst.config = v;
        Ok(())
    }

    /// The configuration the daemon was started with (instances created or
    /// changed later are not in it; see [`Daemon::list`]).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The socket path `v` would listen on.
    pub fn socket_path(&self, v: &VgpuConfig) -> PathBuf {
        self.config.socket_path(v)
    }

    /// One instance, running or stopped.
    pub fn instance(&self, name: &str) -> Option<InstanceInfo> {
        self.instances.get(name).map(Instance::info)
    }

    /// Checks that `v` can be created now, as the configuration file is
    /// checked (values, unique name, known GPU, unique socket) and against
    /// the running instances, the API socket and the file system (the
    /// socket path must be free, or a stale socket). Whether its partition
    /// fits is known only when it is created.
    pub fn check_new(&self, v: &VgpuConfig) -> Result<(), DaemonError> {
        crate::config::validate_vgpu(v).map_err(|(field, message)| DaemonError::Invalid {
            name: v.name.clone(),
            field: field.to_string(),
            message: message.to_string(),
        })?;
        if self.instances.contains_key(&v.name) {
            return Err(DaemonError::Exists(v.name.clone()));
        }
        if !self.gpus.contains_key(&v.gpu) {
            return Err(DaemonError::NoGpu(v.gpu.clone()));
        }
        let socket = self.config.socket_path(v);
        let in_use = |message: String| DaemonError::SocketInUse {
            name: v.name.clone(),
            socket: socket.clone(),
            message,
        };
        if let Some(other) = self.instances.values().find(|i| i.socket == socket) {
            return Err(in_use(format!("vGPU {:?} has it", other.config.name)));
        }
        if socket == self.config.api_socket_path() {
            return Err(in_use("this is the API socket".into()));
        }
        match socket_obstacle(&socket) {
            Some(why) => Err(in_use(why.into())),
            None => Ok(()),
        }
    }

    /// [`Daemon::check_new`], then [`Daemon::create`]: what a request to
    /// create an instance at run time goes through.
    pub fn create_checked(&mut self, v: VgpuConfig) -> Result<(), DaemonError> {
        self.check_new(&v)?;
        self.create(v)
    }

    /// [`Daemon::set_params`] with the new values checked first: a value
    /// out of range is an [`DaemonError::Invalid`] and changes nothing.
    pub fn update_params(
        &mut self,
        name: &str,
        weight: Option<u32>,
        priority: Option<i32>,
        cap: Option<Option<f64>>,
    ) -> Result<(), DaemonError> {
        let inst = self
            .instances
            .get(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        let mut v = inst.config.clone();
        v.weight = weight.unwrap_or(v.weight);
        v.priority = priority.unwrap_or(v.priority);
        v.cap = cap.unwrap_or(v.cap);
        crate::config::validate_vgpu(&v).map_err(|(field, message)| DaemonError::Invalid {
            name: name.to_string(),
            field: field.to_string(),
            message: message.to_string(),
        })?;
        self.set_params(name, weight, priority, cap)
    }

    /// The GPUs, in configuration order, with their capacity and what
    /// their vGPUs were given.
    pub fn gpus(&self) -> Vec<GpuInfo> {
        self.config
            .gpus
            .iter()
            .filter_map(|g| {
                let gpu = self.gpus.get(&g.name)?;
                let cap = gpu.backend.capacity();
                let mine: Vec<&Instance> = self
                    .instances
                    .values()
                    .filter(|i| i.config.gpu == g.name)
                    .collect();
                Some(GpuInfo {
                    config: g.clone(),
                    backend: gpu.backend.name().to_string(),
                    memory_total: cap.memory,
                    compute_units_total: cap.compute_units,
                    memory_allocated: mine.iter().map(|i| i.config.memory.0).sum(),
                    compute_units_allocated: mine.iter().map(|i| i.config.compute_units).sum(),
                    vgpus: mine.iter().map(|i| i.config.name.clone()).collect(),
                })
            })
            .collect()
    }

    /// Count and sum of each instance's queue waits.
    pub fn queue_wait_totals(&self) -> Vec<QueueWaitTotals> {
        let mut out = Vec::new();
        for (name, gpu) in &self.gpus {
            let s = gpu.sched.stats();
            for inst in self.instances.values().filter(|i| &i.config.gpu == name) {
                let w = s.tenant(inst.tenant).map(|t| t.wait).unwrap_or_default();
                out.push(QueueWaitTotals {
                    name: inst.config.name.clone(),
                    count: w.samples,
                    sum: w
                        .mean
                        .saturating_mul(u32::try_from(w.samples).unwrap_or(u32::MAX)),
                });
            }
        }
        out
    }

    /// Stops every instance cleanly: new VMMs are refused (the sockets
    /// are removed first), commands the guests had submitted run for up to
    /// `daemon.shutdown_grace_ms`, what has not run by then and whatever is
    /// submitted meanwhile completes with `STATUS_CANCELLED`; then every
    /// client is disconnected and every instance destroyed.
    pub fn shutdown(&mut self) {
        let grace = Duration::from_millis(self.config.daemon.shutdown_grace_ms);
        let serving: Vec<(&String, &Instance, &Serving)> = self
            .instances
            .iter()
            .filter_map(|(n, i)| i.serving.as_ref().map(|s| (n, i, s)))
            .collect();
        if !serving.is_empty() {
            info!(
                "draining {} vGPU(s) for up to {} ms",
                serving.len(),
                grace.as_millis()
            );
        }
        for (_, inst, s) in &serving {
            // Connected VMMs keep their connection; no new one gets in.
            let _ = std::fs::remove_file(&inst.socket);
            s.drain.begin(grace);
        }
        let deadline = Instant::now() + grace + CANCEL_MARGIN;
        while !serving.iter().all(|(_, _, s)| s.drain.is_idle()) {
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for (name, _, s) in &serving {
            let (done, cancelled) = s.drain.counts();
            if s.drain.is_idle() {
                info!("vGPU {name}: drained: {done} command(s) completed, {cancelled} of them cancelled");
            } else {
                warn!(
                    "vGPU {name}: still busy after the grace: {done} command(s) completed, \
                     {cancelled} of them cancelled; the rest is dropped"
                );
            }
        }
        let names: Vec<String> = self.instances.keys().cloned().collect();
        for n in names {
            let _ = self.destroy(&n);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Size;

    fn config(dir: &std::path::Path) -> Config {
        let mut c = Config::builtin();
        c.daemon.runtime_dir = dir.to_path_buf();
        c
    }

    /// A registry that only says it exists.
    struct NoteMemory;
    impl HostMemory for NoteMemory {
        fn mapped(&self, _: vgpu_backend::HostMapping) {}
        fn unmapped(&self, _: u64) {}
    }

    /// A software partition that offers a guest memory registry.
    struct WithRegistry(Box<dyn Partition>);
    impl Partition for WithRegistry {
        fn spec(&self) -> &PartitionSpec {
            self.0.spec()
        }
        fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
            self.0.alloc(size, align)
        }
        fn free(&mut self, addr: u64) -> Result<(), OpError> {
            self.0.free(addr)
        }
        fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
            self.0.upload(dst, src)
        }
        fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
            self.0.download(src, dst)
        }
        fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
            self.0.copy(dst, src, size)
        }
        fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
            self.0.fill(addr, size, pattern)
        }
        fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
            self.0.module_load(format, image)
        }
        fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
            self.0.module_unload(module)
        }
        fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
            self.0.launch(launch)
        }
        fn memory_used(&self) -> u64 {
            self.0.memory_used()
        }
        fn reset(&mut self) {
            self.0.reset()
        }
        fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
            Some(Arc::new(NoteMemory))
        }
    }

    #[test]
    fn test_shared_partition_offers_the_inner_registry() {
        let spec = PartitionSpec {
            name: "p".into(),
            memory: 1 << 20,
            compute_units: 1,
        };
        let inner = SoftwareBackend::new(1 << 20, 1)
            .create_partition(&spec)
            .unwrap();
        let plain = SharedPartition {
            spec: spec.clone(),
            inner: Arc::new(Mutex::new(inner)),
        };
        assert!(plain.host_memory().is_none());
        let inner = SoftwareBackend::new(1 << 20, 1)
            .create_partition(&spec)
            .unwrap();
        let shared = SharedPartition {
            spec,
            inner: Arc::new(Mutex::new(Box::new(WithRegistry(inner)))),
        };
        assert!(shared.host_memory().is_some());
    }

    #[test]
    fn test_start_all_and_destroy_frees_capacity() {
        let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-test-").unwrap();
        let mut d = Daemon::new(config(dir.as_path())).unwrap();
        d.start_all().unwrap();
        assert_eq!(d.list().len(), 2);
        assert!(dir.as_path().join("vgpu0.sock").exists());
        // A third 1.5 GiB instance does not fit into 2 GiB with 1 GiB taken.
        let mut big = d.list()[0].config.clone();
        big.name = "big".into();
        big.socket = "big.sock".into();
        big.memory = Size(1536 << 20);
        let e = d.create(big.clone()).unwrap_err();
        assert!(matches!(e, DaemonError::DoesNotFit { .. }), "{e}");
        assert!(!dir.as_path().join("big.sock").exists());
        d.destroy("vgpu0").unwrap();
        assert!(!dir.as_path().join("vgpu0.sock").exists());
        d.destroy("vgpu1").unwrap();
        d.create(big).unwrap();
        assert!(matches!(d.destroy("nope"), Err(DaemonError::NoInstance(_))));
    }

    #[test]
    fn test_stats_and_live_params() {
        let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-test-").unwrap();
        let mut d = Daemon::new(config(dir.as_path())).unwrap();
        d.start_all().unwrap();
        let (gpus, insts) = d.stats();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].backend, "software");
        assert_eq!(insts.len(), 2);
        assert_eq!(insts[0].memory_quota, 512 << 20);
        assert_eq!(insts[0].memory_used, 0);
        d.set_params("vgpu0", Some(4), Some(2), Some(Some(0.5)))
            .unwrap();
        assert_eq!(d.list()[0].config.weight, 4);
        assert!(d.set_params("vgpu0", Some(0), None, None).is_err());
        assert!(d.set_params("vgpu0", None, None, Some(Some(2.0))).is_err());
        assert_eq!(
            d.list()[0].config.weight,
            4,
            "a refused change changes nothing"
        );
        assert!(d.set_params("nope", Some(1), None, None).is_err());
    }

    #[test]
    fn test_cuda_without_driver_fails_clearly() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return;
        }
        let text = "[[gpu]]\nname = \"g\"\nbackend = \"cuda\"\n";
        let c = Config::parse(text, "c.toml").unwrap();
        let e = Daemon::new(c).err().expect("no CUDA here").to_string();
        assert!(e.contains("no CUDA driver"), "{e}");
    }

    #[test]
    fn test_duplicate_and_unknown_gpu() {
        let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-test-").unwrap();
        let mut d = Daemon::new(config(dir.as_path())).unwrap();
        d.start_all().unwrap();
        let mut v = d.list()[0].config.clone();
        assert!(matches!(d.create(v.clone()), Err(DaemonError::Exists(_))));
        v.name = "other".into();
        v.gpu = "gpu9".into();
        assert!(matches!(d.create(v), Err(DaemonError::NoGpu(_))));
    }
}
