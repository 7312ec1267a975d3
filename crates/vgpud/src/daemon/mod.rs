//! Physical GPUs and the vGPU instances running on them.
//!
//! [`Daemon`] owns them. Its parts: `sched` sets up each GPU's scheduler
//! and tenants from the configuration (each vGPU's commands are let onto
//! its GPU by a `vgpu_sched::SchedGate`), `backends` creates each GPU's
//! backend, and `instance` holds one vGPU and, while it runs, its device.

mod backends;
mod instance;
mod placement;
mod residency;
mod sched;

pub use instance::{InstanceState, MemoryMoves};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use vgpu_api::DeviceEvents;
use vgpu_backend::contexts::{ContextFactory, Contexts};
use vgpu_backend::{Backend, OpError, PartitionSpec, SharedPartition};
use vgpu_device::DeviceCounters;
use vgpu_sched::{SchedGate, Scheduler, TenantId};
use vgpu_sys::socket::{self, SocketPath};

use crate::config::{Config, GpuConfig, Size, VgpuConfig, AUTO_GPU};
use backends::make_backend;
use instance::{Carried, Instance, Serving};
use residency::Residency;
use sched::{sched_config, tenant_params};

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
    /// What a context costs on it besides what it allocates, bytes.
    context_memory: u64,
    /// With `oversubscribe`, how much the quotas of its vGPUs may add up
    /// to: its memory and the host budget.
    oversubscribed: Option<u64>,
}

/// [`crate::config::validate_vgpu`], a value out of range being an
/// [`DaemonError::Invalid`].
fn validate(v: &VgpuConfig) -> Result<(), DaemonError> {
    crate::config::validate_vgpu(v).map_err(|(field, message)| DaemonError::Invalid {
        name: v.name.clone(),
        field: field.to_string(),
        message: message.to_string(),
    })
}

/// Whether a socket can be bound at `path`: nothing there, or a socket no
/// one listens on. Otherwise says what is in the way.
fn socket_obstacle(path: &Path) -> Option<&'static str> {
    match socket::probe(path) {
        SocketPath::NotSocket => Some("a file that is not a socket is there"),
        SocketPath::Live => Some("another process listens on it"),
        SocketPath::Absent | SocketPath::Stale => None,
    }
}

/// Instance `name` of `instances`, which must be running (`running`) or
/// stopped, to be switched to the other state.
fn instance_in_state<'a>(
    instances: &'a mut BTreeMap<String, Instance>,
    name: &str,
    running: bool,
) -> Result<&'a mut Instance, DaemonError> {
    let inst = instances
        .get_mut(name)
        .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
    if inst.serving.is_some() != running {
        let message = if running {
            "is already stopped"
        } else {
            "is already running"
        };
        return Err(DaemonError::State {
            name: name.to_string(),
            message: message.into(),
        });
    }
    Ok(inst)
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
    /// Why the daemon picked its GPU, where its configuration said
    /// `"auto"`.
    pub placed: Option<String>,
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
    /// Contexts it has now.
    pub contexts: u32,
    /// Contexts made with a new partition, and what that took in all.
    pub context_starts: u64,
    /// See `context_starts`.
    pub context_start: Duration,
    /// Contexts made with the partition of one that had ended.
    pub context_reuses: u64,
    /// What its contexts hold of their own (in `memory_used`), bytes.
    pub context_memory: u64,
    /// Peak device memory, bytes.
    pub memory_peak: u64,
    /// Its suspends and resumes.
    pub moves: MemoryMoves,
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
    /// What went wrong on its device, in its current function and those
    /// before.
    pub device: DeviceEvents,
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
    /// The share of recent wall time it was busy (what placement weighs).
    pub recent_load: f64,
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
    /// Keeps the vGPUs of oversubscribed GPUs resident in turn.
    residency: Option<Residency>,
}

/// Runs first in each thread that serves a vGPU (its vfio-user event
/// loop, which starts the device's own threads), before it reads from
/// the socket; an error fails the vGPU's creation. The `vgpud` binary
/// narrows those threads' system calls with it.
pub type ServingThreadHook = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

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
                    sched,
                    next_tenant: 0,
                    context_memory: g.context_memory(),
                    oversubscribed: g.oversubscribe.then(|| {
                        let memory = backend.capacity().memory;
                        memory.saturating_add(g.host_memory.map_or(memory, |m| m.0))
                    }),
                    backend,
                },
            );
        }
        let residency = if gpus.values().any(|g| g.oversubscribed.is_some()) {
            Some(Residency::start().map_err(|e| DaemonError::Backend {
                gpu: String::new(),
                message: format!("cannot start the residency thread: {e}"),
            })?)
        } else {
            None
        };
        Ok(Daemon {
            config,
            gpus,
            instances: BTreeMap::new(),
            serving_hook: None,
            residency,
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

    /// Creates and starts an instance; one whose `gpu` is `"auto"` goes
    /// on the GPU the daemon's placement policy picks.
    pub fn create(&mut self, v: VgpuConfig) -> Result<(), DaemonError> {
        if self.instances.contains_key(&v.name) {
            return Err(DaemonError::Exists(v.name));
        }
        if v.gpu != AUTO_GPU {
            return self.create_on(v, None);
        }
        let (ranked, mut refused) =
            placement::rank(self.config.daemon.placement, &self.loads(), v.memory.0);
        for (gpu, why) in ranked {
            let w = VgpuConfig {
                gpu: gpu.clone(),
                ..v.clone()
            };
            match self.create_on(w, Some(why)) {
                Ok(()) => return Ok(()),
                Err(DaemonError::DoesNotFit { message, .. }) => {
                    refused.push(format!("{gpu}: {message}"))
                }
                Err(e) => return Err(e),
            }
        }
        Err(DaemonError::DoesNotFit {
            name: v.name,
            gpu: AUTO_GPU.into(),
            message: if refused.is_empty() {
                "there is no GPU".into()
            } else {
                format!("no GPU has room ({})", refused.join("; "))
            },
        })
    }

    /// What placement weighs of each GPU, in configuration order: what
    /// [`Daemon::gpus`] says of it, and its recent load.
    fn loads(&self) -> Vec<placement::GpuLoad> {
        self.gpus()
            .into_iter()
            .filter_map(|g| {
                let gpu = self.gpus.get(&g.config.name)?;
                Some(placement::GpuLoad {
                    recent_load: gpu.sched.stats().gpu.recent_load,
                    name: g.config.name,
                    memory_total: g.memory_total,
                    memory_given: g.memory_allocated,
                    vgpus: g.vgpus.len(),
                })
            })
            .collect()
    }

    /// Creates and starts an instance on its GPU; `placed` says why the
    /// daemon picked that GPU, where it did.
    fn create_on(&mut self, v: VgpuConfig, placed: Option<String>) -> Result<(), DaemonError> {
        let mut partition = self.make_partition(&v)?;
        let gpu = self
            .gpus
            .get_mut(&v.gpu)
            .ok_or_else(|| DaemonError::NoGpu(v.gpu.clone()))?;
        if v.contexts > 0 && gpu.backend.has_contexts() {
            // Each guest process's device state in a partition of its
            // own, made when it first needs one.
            let backend = Arc::clone(&gpu.backend);
            let make: ContextFactory = Box::new(move |spec| backend.create_context(spec));
            partition =
                Box::new(Contexts::new(partition, make, v.contexts).with_cost(gpu.context_memory));
        }
        let tenant = TenantId(gpu.next_tenant);
        gpu.sched
            .add_tenant(tenant, tenant_params(&v))
            .map_err(|e| DaemonError::Setup {
                name: v.name.clone(),
                message: e.to_string(),
            })?;
        gpu.next_tenant += 1;
        let sched = gpu.sched.clone();
        let wanted = gpu
            .oversubscribed
            .and(self.residency.as_ref())
            .map(|r| r.wanted_fn(&v.name));
        let mut inst = Instance {
            socket: self.config.socket_path(&v),
            tenant,
            partition: SharedPartition::new(partition),
            gate: Arc::new(SchedGate::new(sched.clone(), tenant)),
            counters: Arc::new(DeviceCounters::default()),
            carried: Carried::default(),
            serving: None,
            placed,
            moves: Arc::default(),
            wanted,
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
        if let Some(why) = &inst.placed {
            info!("vGPU {}: placed on GPU {} by {why}", v.name, v.gpu);
        }
        self.track(&inst);
        self.instances.insert(v.name.clone(), inst);
        Ok(())
    }

    /// `v`'s partition from its GPU's backend. On an oversubscribed GPU,
    /// within what its quotas may add up to, room is made by moving the
    /// least recently active vGPUs out (see `residency.rs`).
    fn make_partition(
        &self,
        v: &VgpuConfig,
    ) -> Result<Box<dyn vgpu_backend::Partition>, DaemonError> {
        let gpu = self
            .gpus
            .get(&v.gpu)
            .ok_or_else(|| DaemonError::NoGpu(v.gpu.clone()))?;
        let spec = PartitionSpec {
            name: v.name.clone(),
            memory: v.memory.0,
            compute_units: v.compute_units,
        };
        let does_not_fit = |message: String| DaemonError::DoesNotFit {
            name: v.name.clone(),
            gpu: v.gpu.clone(),
            message,
        };
        let room = match (gpu.oversubscribed, &self.residency) {
            (Some(limit), Some(r)) => {
                let mine = self.instances.values().filter(|i| i.config.gpu == v.gpu);
                let (quotas, units) = mine.fold((0u64, 0u64), |(m, u), i| {
                    (m + i.config.memory.0, u + u64::from(i.config.compute_units))
                });
                if quotas.saturating_add(v.memory.0) > limit {
                    return Err(does_not_fit(format!(
                        "its vGPUs' quotas would add up to {} bytes, more than the {limit}                          its memory and host budget allow",
                        quotas.saturating_add(v.memory.0)
                    )));
                }
                // Moving others out frees memory, not compute units.
                let units_left =
                    u64::from(gpu.backend.capacity().compute_units).saturating_sub(units);
                (u64::from(v.compute_units) <= units_left).then_some(r)
            }
            _ => None,
        };
        loop {
            match gpu.backend.create_partition(&spec) {
                Ok(p) => return Ok(p),
                Err(e) => match room {
                    Some(r) if r.evict_one(&v.gpu, &v.name) => continue,
                    _ => return Err(does_not_fit(e.to_string())),
                },
            }
        }
    }

    /// Has the residency thread keep `inst` in turn with the others of an
    /// oversubscribed GPU, while it runs.
    fn track(&self, inst: &Instance) {
        let (Some(r), Some(s)) = (&self.residency, &inst.serving) else {
            return;
        };
        if self
            .gpus
            .get(&inst.config.gpu)
            .is_some_and(|g| g.oversubscribed.is_some())
        {
            r.add(
                &inst.config.name,
                &inst.config.gpu,
                Arc::clone(&s.memory),
                Arc::clone(&inst.counters),
                Arc::clone(&inst.moves),
            );
        }
    }

    /// Powers an instance off: its client is disconnected, its device
    /// reset (device memory freed) and its socket removed; its
    /// configuration, partition reservation and scheduler figures stay.
    pub fn stop(&mut self, name: &str) -> Result<(), DaemonError> {
        let inst = instance_in_state(&mut self.instances, name, true)?;
        if inst.state() == InstanceState::Suspended {
            // Its memory is out of the GPU: a stop would throw it away
            // with the guest unaware.
            return Err(DaemonError::State {
                name: name.to_string(),
                message: "is suspended: resume it first".into(),
            });
        }
        inst.halt();
        if let Some(r) = &self.residency {
            r.remove(name);
        }
        info!("vGPU {name}: stopped; {} removed", inst.socket.display());
        Ok(())
    }

    /// Starts a stopped instance again, on the same socket and partition.
    pub fn start(&mut self, name: &str) -> Result<(), DaemonError> {
        let inst = instance_in_state(&mut self.instances, name, false)?;
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
        if let Some(inst) = self.instances.get(name) {
            self.track(inst);
        }
        Ok(())
    }

    /// Suspends running instance `name`: it stops at a command boundary
    /// (its guest's commands wait), its device memory moves out and its
    /// quota is free on the GPU until [`Daemon::resume`]. Returns the
    /// bytes moved out.
    pub fn suspend(&mut self, name: &str) -> Result<u64, DaemonError> {
        let inst = instance_in_state(&mut self.instances, name, true)?;
        let state = |message: &str| DaemonError::State {
            name: name.to_string(),
            message: message.into(),
        };
        let Some(s) = &inst.serving else {
            return Err(state("is stopped"));
        };
        if s.memory.is_suspended() {
            // One the daemon moved out of an oversubscribed GPU is now
            // held out by the operator, as a suspend of a resident one.
            if let Some(r) = self
                .residency
                .as_ref()
                .filter(|r| r.is_held(name) == Some(false))
            {
                r.hold(name, true);
                let bytes = vgpu_sys::lock(&inst.moves).evicted;
                info!("vGPU {name}: held out of the GPU, where the daemon had moved it");
                return Ok(bytes);
            }
            return Err(state("is already suspended"));
        }
        let t = Instant::now();
        let bytes = s.memory.suspend().map_err(|e| match e {
            OpError::Unsupported(what) => DaemonError::State {
                name: name.to_string(),
                message: format!("cannot be suspended: {what} is not supported"),
            },
            other => DaemonError::Setup {
                name: name.to_string(),
                message: format!("suspend: {other}"),
            },
        })?;
        {
            let mut m = vgpu_sys::lock(&inst.moves);
            m.suspends += 1;
            m.evicted = bytes;
        }
        if let Some(r) = &self.residency {
            r.hold(name, true);
        }
        info!(
            "vGPU {name}: suspended in {:.1?}; {bytes} bytes moved out, {} bytes of its GPU free",
            t.elapsed(),
            inst.config.memory.0
        );
        Ok(bytes)
    }

    /// Resumes suspended instance `name`: its memory comes back at the
    /// same device addresses and its guest's commands go on. Refused,
    /// leaving it suspended, when its GPU has not got its quota free.
    /// Returns the bytes moved in.
    pub fn resume(&mut self, name: &str) -> Result<u64, DaemonError> {
        let inst = instance_in_state(&mut self.instances, name, true)?;
        let Some(s) = inst.serving.as_ref().filter(|s| s.memory.is_suspended()) else {
            return Err(DaemonError::State {
                name: name.to_string(),
                message: "is not suspended".into(),
            });
        };
        let t = Instant::now();
        let bytes = s.memory.resume().map_err(|e| match e {
            OpError::NoMemory {
                requested,
                available,
            } => DaemonError::DoesNotFit {
                name: name.to_string(),
                gpu: inst.config.gpu.clone(),
                message: format!(
                    "resuming needs {requested} bytes, {available} are free; it stays suspended"
                ),
            },
            other => DaemonError::Setup {
                name: name.to_string(),
                message: format!("resume: {other}"),
            },
        })?;
        let took = t.elapsed();
        {
            let mut m = vgpu_sys::lock(&inst.moves);
            m.evicted = 0;
            m.restore += took;
        }
        if let Some(r) = &self.residency {
            r.hold(name, false);
        }
        info!("vGPU {name}: resumed in {took:.1?}; {bytes} bytes moved in");
        Ok(bytes)
    }

    /// Stops an instance if it runs, and frees its partition.
    pub fn destroy(&mut self, name: &str) -> Result<(), DaemonError> {
        let mut inst = self
            .instances
            .remove(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        if let Some(r) = &self.residency {
            r.remove(name);
        }
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
                recent_load: s.gpu.recent_load,
                busy: s.gpu.busy,
                switches: s.gpu.switches,
                commands: s.gpu.commands,
            });
            for inst in self.instances.values().filter(|i| &i.config.gpu == name) {
                let c = &inst.counters;
                let k = inst.carried.with(c);
                let t = s.tenant(inst.tenant);
                out.push(InstanceStats {
                    name: inst.config.name.clone(),
                    gpu: name.clone(),
                    state: inst.state(),
                    memory_quota: inst.config.memory.0,
                    memory_used: c.mem_used.load(Ordering::Relaxed),
                    contexts: c.contexts.load(Ordering::Relaxed),
                    context_starts: c.contexts_started.load(Ordering::Relaxed),
                    context_start: Duration::from_nanos(c.context_start_ns.load(Ordering::Relaxed)),
                    context_reuses: c.contexts_reused.load(Ordering::Relaxed),
                    context_memory: c.context_memory.load(Ordering::Relaxed),
                    moves: *vgpu_sys::lock(&inst.moves),
                    memory_peak: k.peak,
                    // The scheduler's count survives function resets.
                    commands: t.map(|t| t.commands).unwrap_or_default(),
                    busy: t.map(|t| t.busy).unwrap_or_default(),
                    bytes: t.map(|t| t.bytes).unwrap_or_default(),
                    wait_p50: t.map(|t| t.wait.p50).unwrap_or_default(),
                    wait_p99: t.map(|t| t.wait.p99).unwrap_or_default(),
                    capped: t.map(|t| t.capped).unwrap_or_default(),
                    device: k.device,
                });
            }
        }
        (gpus, out)
    }

    /// Changes instance `name`'s scheduling parameters (`None`: unchanged).
    /// A value out of range is an [`DaemonError::Invalid`] and changes
    /// nothing.
    pub fn update_params(
        &mut self,
        name: &str,
        weight: Option<u32>,
        priority: Option<i32>,
        cap: Option<Option<f64>>,
    ) -> Result<(), DaemonError> {
        let v = self.check_params(name, weight, priority, cap)?;
        let inst = self
            .instances
            .get_mut(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
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

    /// Instance `name`'s configuration with these scheduling parameters
    /// (`None`: unchanged), if they are acceptable; changes nothing.
    pub fn check_params(
        &self,
        name: &str,
        weight: Option<u32>,
        priority: Option<i32>,
        cap: Option<Option<f64>>,
    ) -> Result<VgpuConfig, DaemonError> {
        let inst = self
            .instances
            .get(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        let v = VgpuConfig {
            weight: weight.unwrap_or(inst.config.weight),
            priority: priority.unwrap_or(inst.config.priority),
            cap: cap.unwrap_or(inst.config.cap),
            ..inst.config.clone()
        };
        validate(&v)?;
        Ok(v)
    }

    /// Resizes instance `name`'s memory quota to `bytes`, running or
    /// stopped: growing takes from what its GPU has not given out, at
    /// once; shrinking below what its guest holds is refused. A running
    /// guest's driver hears of it (ABI 1.8). A refusal changes nothing.
    pub fn resize(&mut self, name: &str, bytes: u64) -> Result<(), DaemonError> {
        let inst = self
            .instances
            .get_mut(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        let v = VgpuConfig {
            memory: Size(bytes),
            ..inst.config.clone()
        };
        validate(&v)?;
        let old = inst.config.memory.0;
        let r = match &inst.serving {
            Some(s) => s.memory.resize(bytes),
            None => inst.partition.lock().set_memory(bytes),
        };
        r.map_err(|e| match e {
            OpError::NoMemory { available, .. } => DaemonError::DoesNotFit {
                name: name.to_string(),
                gpu: v.gpu.clone(),
                message: format!(
                    "{} bytes more requested, {available} left",
                    bytes.saturating_sub(old)
                ),
            },
            OpError::Invalid(why) => DaemonError::State {
                name: name.to_string(),
                message: format!("cannot shrink to {bytes} bytes: {why}"),
            },
            other => DaemonError::Setup {
                name: name.to_string(),
                message: other.to_string(),
            },
        })?;
        info!("vGPU {name}: memory {old} -> {bytes} bytes");
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
        validate(v)?;
        if self.instances.contains_key(&v.name) {
            return Err(DaemonError::Exists(v.name.clone()));
        }
        if v.gpu != AUTO_GPU && !self.gpus.contains_key(&v.gpu) {
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
                    // A suspended vGPU's quota is free on the GPU.
                    memory_allocated: mine
                        .iter()
                        .filter(|i| i.state() != InstanceState::Suspended)
                        .map(|i| i.config.memory.0)
                        .sum(),
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
        // Nothing is moved in or out from here on.
        drop(self.residency.take());
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
        d.update_params("vgpu0", Some(4), Some(2), Some(Some(0.5)))
            .unwrap();
        assert_eq!(d.list()[0].config.weight, 4);
        assert!(d.update_params("vgpu0", Some(0), None, None).is_err());
        assert!(d
            .update_params("vgpu0", None, None, Some(Some(2.0)))
            .is_err());
        assert_eq!(
            d.list()[0].config.weight,
            4,
            "a refused change changes nothing"
        );
        assert!(d.update_params("nope", Some(1), None, None).is_err());
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
