//! The daemon's configuration: physical GPUs and the vGPU instances carved
//! out of them, read from TOML. Errors name the file, line and field.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

mod render;

/// A byte size written as a number or as "512MiB", "4GiB", "64K"...
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    /// Parses "123", "64K", "64KiB", "512MiB", "4G", "1TiB" (binary units).
    pub fn parse(s: &str) -> Option<Size> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num.parse().ok()?;
        let shift = match unit.trim() {
            "" | "B" => 0,
            "K" | "KiB" => 10,
            "M" | "MiB" => 20,
            "G" | "GiB" => 30,
            "T" | "TiB" => 40,
            _ => return None,
        };
        n.checked_mul(1u64 << shift).map(Size)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        for (shift, name) in units {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{}{}", self.0 >> shift, name);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Size(n)),
            Raw::Str(s) => Size::parse(&s).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid size {s:?} (use bytes or a number with K/KiB, M/MiB, G/GiB, T/TiB)"
                ))
            }),
        }
    }
}

/// Which hardware a GPU entry drives.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Host memory and CPU threads.
    Software,
    /// An NVIDIA GPU through the CUDA driver API.
    Cuda,
}

/// How a CUDA GPU is split between vGPUs.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionMode {
    /// A CUDA context per vGPU, time-sliced by the scheduler.
    #[default]
    Isolated,
    /// A green context per vGPU with its own SMs, running concurrently.
    Spatial,
}

/// Where a GPU's partitions run.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Every partition in the daemon's own process.
    Thread,
    /// Every partition in its own partition host process: its own GPU
    /// address space, and a fault or crash ends only that vGPU's host
    /// (restarted by a reset of the function).
    Process,
}

/// How the daemon picks the GPU of a vGPU whose `gpu` is [`AUTO_GPU`].
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// The GPU with the least recent load and memory given out, so that
    /// tenants spread over the host's GPUs.
    #[default]
    Spread,
    /// The first GPU, in configuration order, it fits on: GPUs fill one
    /// after another, and the last ones stay free for large vGPUs.
    Pack,
}

/// The `gpu` of a vGPU whose GPU the daemon picks ([`Placement`]).
pub const AUTO_GPU: &str = "auto";

/// Scheduling policy of a GPU.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Time-slice round-robin.
    RoundRobin,
    /// Strict priority with aging.
    Priority,
    /// Weighted fair share of device time.
    #[default]
    Fair,
}

/// Daemon-wide settings.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Directory for sockets given as relative paths.
    #[serde(default = "default_runtime_dir")]
    pub runtime_dir: PathBuf,
    /// Management API socket; relative paths are under `runtime_dir`;
    /// `runtime_dir/api.sock` when not set.
    #[serde(default)]
    pub api_socket: Option<PathBuf>,
    /// TCP address of the Prometheus endpoint; `""` disables it.
    #[serde(default = "default_metrics_address")]
    pub metrics_address: String,
    /// User to switch to when started as root (after opening what needs
    /// root); its primary and supplementary groups come with it.
    #[serde(default)]
    pub user: Option<String>,
    /// Keep running as root when started as root without `user`.
    #[serde(default)]
    pub allow_root: bool,
    /// What a system call outside the daemon's list does.
    #[serde(default)]
    pub seccomp: crate::confine::SeccompMode,
    /// Group given the vGPU sockets, with mode 0660, so that VMMs in it
    /// can connect (the API socket stays 0600). The daemon's user must be
    /// in it.
    #[serde(default)]
    pub socket_group: Option<String>,
    /// `socket_group`'s id, looked up at start (not read from the file).
    #[serde(skip)]
    pub socket_gid: Option<u32>,
    /// The account `user` names, looked up at start when the daemon is to
    /// switch to it (not read from the file): partition hosts run as it.
    #[serde(skip)]
    pub account: Option<crate::confine::Account>,
    /// On shutdown, how long commands the guests had submitted may still
    /// run before what remains is cancelled (milliseconds).
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// How the GPU of a vGPU with `gpu = "auto"` is picked.
    #[serde(default)]
    pub placement: Placement,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            runtime_dir: default_runtime_dir(),
            api_socket: None,
            metrics_address: default_metrics_address(),
            user: None,
            allow_root: false,
            seccomp: Default::default(),
            socket_group: None,
            socket_gid: None,
            account: None,
            shutdown_grace_ms: default_shutdown_grace_ms(),
            placement: Placement::default(),
        }
    }
}

/// The metrics address used when the configuration names none.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9464";

fn default_metrics_address() -> String {
    DEFAULT_METRICS_ADDRESS.to_string()
}

/// Longest accepted `daemon.shutdown_grace_ms`: a stuck shutdown is worse
/// than cancelled work.
pub const MAX_SHUTDOWN_GRACE_MS: u64 = 600_000;

fn default_shutdown_grace_ms() -> u64 {
    5000
}

fn default_runtime_dir() -> PathBuf {
    PathBuf::from("/run/vgpud")
}

fn default_compute_units() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// The slice when none is configured: a context switch on a real GPU
/// costs about 165 us (H200), so 8 ms turns keep the time lost to
/// switching between isolated tenants under 3 %, where 2 ms lost 8 %;
/// the software backend switches for the price of a thread hand-over.
fn default_slice_us(backend: BackendKind) -> u64 {
    match backend {
        BackendKind::Cuda => 8000,
        _ => 2000,
    }
}

/// A physical GPU.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Unique name.
    pub name: String,
    /// Backend driving it.
    pub backend: BackendKind,
    /// Device memory (software backend: the host memory it may use).
    #[serde(default)]
    pub memory: Option<Size>,
    /// Compute units (software: worker threads).
    #[serde(default = "default_compute_units")]
    pub compute_units: u32,
    /// CUDA device index.
    #[serde(default)]
    pub device: u32,
    /// CUDA partition mode.
    #[serde(default)]
    pub partition_mode: PartitionMode,
    /// Where partitions run; see [`GpuConfig::isolation`] for the default.
    #[serde(default, rename = "isolation")]
    pub isolation_setting: Option<Isolation>,
    /// Whether guests may load their own PTX modules (CUDA with process
    /// isolation only: then a loaded kernel reaches only its own
    /// tenant's memory; in spatial mode every tenant's of the GPU, so
    /// there only with `trusted_tenants`).
    #[serde(default)]
    pub guest_ptx: bool,
    /// The tenants of this GPU trust each other: in spatial mode their
    /// partitions share one GPU address space and one fate, and guest PTX
    /// may run there (as MPS clients share a server).
    #[serde(default)]
    pub trusted_tenants: bool,
    /// The partition host program; by default `vgpu-partition-host` next
    /// to the daemon's executable.
    #[serde(default)]
    pub partition_host: Option<PathBuf>,
    /// Scheduling policy.
    #[serde(default)]
    pub policy: Policy,
    /// Time slice (a turn under every policy), microseconds, as
    /// configured; see [`GpuConfig::slice_us`].
    #[serde(default, rename = "slice_us")]
    pub slice_us_setting: Option<u64>,
    /// Software backend: how long a kernel a guest loaded may run before
    /// its launch is stopped (a device error), milliseconds.
    #[serde(default = "default_kernel_timeout_ms")]
    pub kernel_timeout_ms: u64,
    /// Device memory one context costs on this GPU besides what it
    /// allocates (a GPU context's own memory), counted against its vGPU's
    /// quota for each context, as a GPU counts it per process; see
    /// [`GpuConfig::context_memory`] for the default.
    #[serde(default, rename = "context_memory")]
    pub context_memory_setting: Option<Size>,
    /// The quotas of its vGPUs may add up to more than its memory: the
    /// daemon suspends the least recently active vGPU when another needs
    /// room (its creation, or work while its own memory is out) and
    /// resumes it when it has work again.
    #[serde(default)]
    pub oversubscribe: bool,
    /// With `oversubscribe`, how much more than the GPU's memory the
    /// quotas may add up to: the host memory suspended vGPUs may hold.
    /// Default: as much as the GPU's memory.
    #[serde(default)]
    pub host_memory: Option<Size>,
}

/// What a context's own memory costs by default on a CUDA GPU: a partition
/// host process with its context, measured with `nvidia-smi` at 480 MiB
/// (median of 22) on an H100 with driver 580 (`docs/perf/gpu-vm-cuda.md`),
/// rounded up.
pub const CUDA_CONTEXT_MEMORY: u64 = 512 << 20;

fn default_kernel_timeout_ms() -> u64 {
    vgpu_backend::software::DEFAULT_KERNEL_TIMEOUT.as_millis() as u64
}

impl GpuConfig {
    /// The time slice in microseconds: as configured, else 8000 for CUDA
    /// and 2000 for the software backend.
    pub fn slice_us(&self) -> u64 {
        self.slice_us_setting
            .unwrap_or_else(|| default_slice_us(self.backend))
    }

    /// What each context costs its vGPU's quota: as configured, else
    /// [`CUDA_CONTEXT_MEMORY`] for a CUDA GPU in `isolated` mode with
    /// process isolation (each context is a host process with a GPU
    /// context of its own, memory the GPU gives no tenant) and 0
    /// otherwise (contexts share their partition's GPU context, or the
    /// software backend's own memory is host memory).
    pub fn context_memory(&self) -> u64 {
        self.context_memory_setting.map_or_else(
            || match (self.backend, self.partition_mode, self.isolation()) {
                (BackendKind::Cuda, PartitionMode::Isolated, Isolation::Process) => {
                    CUDA_CONTEXT_MEMORY
                }
                _ => 0,
            },
            |s| s.0,
        )
    }

    /// Where partitions run: as configured, else `process` for CUDA (in
    /// isolated mode a process per partition, as one tenant's faulting
    /// kernel would otherwise end every tenant's CUDA; in spatial mode
    /// one shared process for all, whose SM groups they are, which the
    /// daemon replaces when a fault ends it) and `thread` for the
    /// software backend (it runs no guest code).
    pub fn isolation(&self) -> Isolation {
        self.isolation_setting.unwrap_or(match self.backend {
            BackendKind::Cuda => Isolation::Process,
            BackendKind::Software => Isolation::Thread,
        })
    }
}

fn default_queues() -> u32 {
    4
}

fn default_window() -> Size {
    Size(16 << 20)
}

fn default_weight() -> u32 {
    1
}

fn default_poll_us() -> u64 {
    50
}

fn default_contexts() -> u32 {
    16
}

/// A vGPU instance.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VgpuConfig {
    /// Unique name.
    pub name: String,
    /// The GPU it is carved from.
    pub gpu: String,
    /// vfio-user socket; relative paths are under `daemon.runtime_dir`.
    pub socket: PathBuf,
    /// Device memory quota.
    pub memory: Size,
    /// Compute units.
    pub compute_units: u32,
    /// Priority (higher runs first under the priority policy).
    #[serde(default)]
    pub priority: i32,
    /// Weight under the fair policy.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Fixed share of GPU time (0 < cap <= 1), enforced even when idle.
    #[serde(default)]
    pub cap: Option<f64>,
    /// Queues offered to the guest.
    #[serde(default = "default_queues")]
    pub queues: u32,
    /// Host-visible window size.
    #[serde(default = "default_window")]
    pub window: Size,
    /// How long the poller spins after activity, microseconds.
    #[serde(default = "default_poll_us")]
    pub poll_us: u64,
    /// Contexts (one per guest process using the vGPU, each with its own
    /// device memory and faults) it may have at once besides its own; 0
    /// for none, where every process shares one context.
    #[serde(default = "default_contexts")]
    pub contexts: u32,
    /// PCI vendor id override.
    #[serde(default)]
    pub pci_vendor: Option<u16>,
    /// PCI device id override.
    #[serde(default)]
    pub pci_device: Option<u16>,
}

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Daemon settings.
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// Physical GPUs.
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<GpuConfig>,
    /// vGPU instances.
    #[serde(default, rename = "vgpu")]
    pub vgpus: Vec<VgpuConfig>,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax or a field of the wrong type.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong, with the field.
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Which field, e.g. `vgpu "vm1".memory`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The configuration used when none is given: two vGPUs on the software
/// backend.
pub const DEFAULT_CONFIG: &str = r#"# vgpud built-in configuration: one software GPU, two vGPUs.
[daemon]
runtime_dir = "/tmp/vgpud"
# api_socket = "api.sock"             # management API, under runtime_dir, mode 0600
# metrics_address = "127.0.0.1:9464"  # Prometheus endpoint; "" disables it
# user = "vgpud"                      # started as root: switch to this user
# allow_root = false                  # started as root without user: refuse
# seccomp = "strict"                  # "strict" (kill), "log" or "off"
# socket_group = "kvm"                # vGPU sockets 0660 for this group's VMMs

[[gpu]]
name = "gpu0"
backend = "software"
memory = "2GiB"
compute_units = 2
policy = "fair"

[[vgpu]]
name = "vgpu0"
gpu = "gpu0"
socket = "vgpu0.sock"
memory = "512MiB"
compute_units = 1
weight = 1

[[vgpu]]
name = "vgpu1"
gpu = "gpu0"
socket = "vgpu1.sock"
memory = "512MiB"
compute_units = 1
weight = 1
"#;

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}

impl Config {
    /// Parses and validates `text`; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            ConfigError::Parse {
                file: file.to_string(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        config.validate(file)?;
        Ok(config)
    }

    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The built-in configuration.
    pub fn builtin() -> Config {
        // The built-in text is tested to parse.
        Self::parse(DEFAULT_CONFIG, "<built-in>").unwrap_or_else(|_| Config {
            daemon: DaemonConfig::default(),
            gpus: Vec::new(),
            vgpus: Vec::new(),
        })
    }

    /// The socket path of a vGPU.
    pub fn socket_path(&self, v: &VgpuConfig) -> PathBuf {
        if v.socket.is_absolute() {
            v.socket.clone()
        } else {
            self.daemon.runtime_dir.join(&v.socket)
        }
    }

    /// The management API socket: `daemon.api_socket`, relative to
    /// `daemon.runtime_dir`, or `runtime_dir/api.sock`.
    pub fn api_socket_path(&self) -> PathBuf {
        match &self.daemon.api_socket {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => self.daemon.runtime_dir.join(p),
            None => self.daemon.runtime_dir.join("api.sock"),
        }
    }

    /// The metrics listen address, or `None` when metrics are disabled.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, String> {
        let a = self.daemon.metrics_address.trim();
        if a.is_empty() {
            return Ok(None);
        }
        a.parse().map(Some).map_err(|_| {
            format!("{a:?} is not an IP address and port (e.g. \"127.0.0.1:9464\", \"[::1]:9464\")")
        })
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |field: String, message: &str| ConfigError::Invalid {
            file: file.to_string(),
            field,
            message: message.to_string(),
        };
        if let Err(m) = self.metrics_addr() {
            return Err(invalid("daemon.metrics_address".into(), &m));
        }
        if self.daemon.user.as_ref().is_some_and(|u| u.is_empty()) {
            return Err(invalid("daemon.user".into(), "must not be empty"));
        }
        if self
            .daemon
            .socket_group
            .as_ref()
            .is_some_and(|g| g.is_empty())
        {
            return Err(invalid("daemon.socket_group".into(), "must not be empty"));
        }
        if self
            .daemon
            .api_socket
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(invalid("daemon.api_socket".into(), "must not be empty"));
        }
        if self.daemon.shutdown_grace_ms > MAX_SHUTDOWN_GRACE_MS {
            return Err(invalid(
                "daemon.shutdown_grace_ms".into(),
                "must be at most 600000 (10 minutes)",
            ));
        }
        let mut gpu_names = HashSet::new();
        for g in &self.gpus {
            let field = |f: &str| format!("gpu {:?}.{f}", g.name);
            if g.name.is_empty() || !gpu_names.insert(g.name.as_str()) {
                return Err(invalid(field("name"), "names must be unique and not empty"));
            }
            if g.name == AUTO_GPU {
                return Err(invalid(
                    field("name"),
                    "\"auto\" is what a vGPU names to have its GPU picked",
                ));
            }
            if g.compute_units == 0 {
                return Err(invalid(field("compute_units"), "must be at least 1"));
            }
            if g.backend == BackendKind::Software && g.memory.is_none() {
                return Err(invalid(
                    field("memory"),
                    "the software backend needs a memory size",
                ));
            }
            if g.guest_ptx
                && (g.backend != BackendKind::Cuda || g.isolation() != Isolation::Process)
            {
                return Err(invalid(
                    field("guest_ptx"),
                    "guest PTX needs backend \"cuda\" with isolation \"process\"",
                ));
            }
            if g.guest_ptx && g.partition_mode == PartitionMode::Spatial && !g.trusted_tenants {
                return Err(invalid(
                    field("guest_ptx"),
                    "spatial partitions share one GPU address space: guest PTX there needs \
                     trusted_tenants = true",
                ));
            }
            if g.oversubscribe && g.backend == BackendKind::Cuda {
                return Err(invalid(
                    field("oversubscribe"),
                    "needs vGPUs that can be suspended, which the cuda backend does not offer yet",
                ));
            }
            if g.host_memory.is_some() && !g.oversubscribe {
                return Err(invalid(
                    field("host_memory"),
                    "is the budget of oversubscribe = true",
                ));
            }
            if g.slice_us() == 0 || g.slice_us() > 1_000_000 {
                return Err(invalid(field("slice_us"), "must be 1..=1000000 (1 s)"));
            }
            if g.kernel_timeout_ms == 0 || g.kernel_timeout_ms > 3_600_000 {
                return Err(invalid(
                    field("kernel_timeout_ms"),
                    "must be 1..=3600000 (an hour)",
                ));
            }
        }
        let mut names = HashSet::new();
        let mut sockets = HashSet::new();
        for v in &self.vgpus {
            let field = |f: &str| format!("vgpu {:?}.{f}", v.name);
            validate_vgpu(v).map_err(|(f, m)| invalid(field(f), m))?;
            if !names.insert(v.name.as_str()) {
                return Err(invalid(field("name"), "names must be unique"));
            }
            if v.gpu != AUTO_GPU && !gpu_names.contains(v.gpu.as_str()) {
                return Err(invalid(
                    field("gpu"),
                    "no [[gpu]] has this name (\"auto\" lets the daemon pick)",
                ));
            }
            if !sockets.insert(self.socket_path(v)) {
                return Err(invalid(field("socket"), "another vGPU uses this socket"));
            }
            if self.socket_path(v) == self.api_socket_path() {
                return Err(invalid(field("socket"), "this is the API socket"));
            }
        }
        Ok(())
    }
}

/// Checks one vGPU's values on their own; returns the bad field and why.
pub fn validate_vgpu(v: &VgpuConfig) -> Result<(), (&'static str, &'static str)> {
    if v.name.is_empty()
        || v.name.len() > 64
        || !v
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(("name", "use 1-64 letters, digits, '-' or '_'"));
    }
    if v.memory.0 == 0 {
        return Err(("memory", "must be more than 0"));
    }
    if v.compute_units == 0 {
        return Err(("compute_units", "must be at least 1"));
    }
    if v.weight == 0 {
        return Err(("weight", "must be at least 1"));
    }
    if let Some(cap) = v.cap {
        if !(cap > 0.0 && cap <= 1.0) {
            return Err(("cap", "must be a fraction in (0, 1]"));
        }
    }
    if v.queues == 0 || v.queues > vgpu_abi::MAX_QUEUES {
        return Err(("queues", "must be 1..=16"));
    }
    if !v.window.0.is_power_of_two() || v.window.0 < 4096 {
        return Err(("window", "must be a power of two of at least 4KiB"));
    }
    if v.poll_us > 10_000_000 {
        return Err(("poll_us", "must be at most 10 s"));
    }
    if v.contexts > vgpu_abi::MAX_CONTEXT_ID {
        return Err(("contexts", "must be at most 65535"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_builtin_config_parses() {
        let c = Config::parse(DEFAULT_CONFIG, "<built-in>").unwrap();
        assert_eq!(c.gpus.len(), 1);
        assert_eq!(c.vgpus.len(), 2);
        assert_eq!(c.vgpus[0].memory, Size(512 << 20));
        assert_eq!(
            c.socket_path(&c.vgpus[1]),
            PathBuf::from("/tmp/vgpud/vgpu1.sock")
        );
    }

    #[test]
    fn test_slice_defaults_by_backend_and_bounds() {
        let gpu = |extra: &str| {
            Config::parse(&format!("[[gpu]]\nname = \"g\"\n{extra}"), "x.toml")
                .map(|c| c.gpus[0].slice_us())
        };
        assert_eq!(
            gpu("backend = \"software\"\nmemory = \"1G\"\n").unwrap(),
            2000
        );
        assert_eq!(gpu("backend = \"cuda\"\n").unwrap(), 8000);
        assert_eq!(gpu("backend = \"cuda\"\nslice_us = 500\n").unwrap(), 500);
        for bad in ["slice_us = 0\n", "slice_us = 1000001\n"] {
            let bad = format!("backend = \"software\"\nmemory = \"1G\"\n{bad}");
            let bad = bad.as_str();
            let e = gpu(bad).unwrap_err().to_string();
            assert!(e.starts_with("x.toml:") && e.contains("slice_us"), "{e}");
        }
    }

    #[test]
    fn test_api_socket_and_metrics_address() {
        let c = Config::builtin();
        assert_eq!(c.api_socket_path(), PathBuf::from("/tmp/vgpud/api.sock"));
        assert_eq!(
            c.metrics_addr().unwrap(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let c = Config::parse(
            "[daemon]\nruntime_dir = \"/r\"\napi_socket = \"ctl/api\"\nmetrics_address = \"\"\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(c.api_socket_path(), PathBuf::from("/r/ctl/api"));
        assert_eq!(c.metrics_addr().unwrap(), None);
        assert_eq!(c.daemon.seccomp, crate::confine::SeccompMode::Strict);
        assert_eq!(
            (c.daemon.user.as_deref(), c.daemon.allow_root),
            (None, false)
        );
        let c = Config::parse(
            "[daemon]\nuser = \"vgpud\"\nallow_root = true\nseccomp = \"log\"\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(c.daemon.user.as_deref(), Some("vgpud"));
        assert!(c.daemon.allow_root);
        assert_eq!(c.daemon.seccomp, crate::confine::SeccompMode::Log);
        for bad in ["seccomp = \"kill\"", "user = \"\"", "socket_group = \"\""] {
            let e = Config::parse(&format!("[daemon]\n{bad}\n"), "x.toml").unwrap_err();
            assert!(e.to_string().starts_with("x.toml:"), "{e}");
        }
        let c = Config::parse(
            "[daemon]\napi_socket = \"/abs/api.sock\"\nmetrics_address = \"[::1]:9000\"\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(c.api_socket_path(), PathBuf::from("/abs/api.sock"));
        assert_eq!(c.metrics_addr().unwrap().unwrap().port(), 9000);
        for bad in ["localhost:9464", "127.0.0.1", "1.2.3.4:99999"] {
            let text = format!("[daemon]\nmetrics_address = \"{bad}\"\n");
            let e = Config::parse(&text, "x.toml").unwrap_err().to_string();
            assert!(e.starts_with("x.toml: daemon.metrics_address:"), "{e}");
        }
        let e = Config::parse("[daemon]\napi_socket = \"\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("daemon.api_socket"), "{e}");
        let text = DEFAULT_CONFIG.replace("\"vgpu1.sock\"", "\"api.sock\"");
        let e = Config::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(
            e.contains("vgpu \"vgpu1\".socket: this is the API socket"),
            "{e}"
        );
    }

    #[test]
    fn test_shutdown_grace() {
        assert_eq!(Config::builtin().daemon.shutdown_grace_ms, 5000);
        let c = Config::parse("[daemon]\nshutdown_grace_ms = 0\n", "x.toml").unwrap();
        assert_eq!(c.daemon.shutdown_grace_ms, 0);
        let e = Config::parse("[daemon]\nshutdown_grace_ms = 600001\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml: daemon.shutdown_grace_ms:"), "{e}");
        let e = Config::parse("[daemon]\nshutdown_grace_ms = -1\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("x.toml:2:") || e.contains("shutdown_grace_ms"),
            "{e}"
        );
    }

    #[test]
    fn test_sizes() {
        assert_eq!(Size::parse("4GiB"), Some(Size(4 << 30)));
        assert_eq!(Size::parse("64K"), Some(Size(64 << 10)));
        assert_eq!(Size::parse("12"), Some(Size(12)));
        assert_eq!(Size::parse("1XB"), None);
        assert_eq!(Size::parse("99999999999999999999GiB"), None);
        assert_eq!(Size::parse("20000000000TiB"), None);
        assert_eq!(Size(3 << 30).to_string(), "3GiB");
    }

    #[test]
    fn test_errors_name_line_and_field() {
        let text = "[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"1GiB\"\n\n[[vgpu]]\nname = \"a\"\ngpu = \"g\"\nsocket = \"a.sock\"\nmemory = \"lots\"\ncompute_units = 1\n";
        let e = Config::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("x.toml:10:"), "{e}");
        assert!(e.contains("invalid size"), "{e}");

        let text = "[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"1GiB\"\nbogus = 1\n";
        let e = Config::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("x.toml:5:") && e.contains("bogus"), "{e}");

        let text = "[[gpu]]\nname = \"g\"\nbackend = \"quantum\"\n";
        let e = Config::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("x.toml:3:"), "{e}");
    }

    #[test]
    fn test_semantic_errors() {
        let base = "[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"1GiB\"\n";
        let vgpu = |extra: &str| {
            format!("{base}[[vgpu]]\nname = \"a\"\ngpu = \"g\"\nsocket = \"a.sock\"\nmemory = \"1MiB\"\ncompute_units = 1\n{extra}")
        };
        let cases = [
            (vgpu("weight = 0\n"), "vgpu \"a\".weight"),
            (vgpu("cap = 1.5\n"), "vgpu \"a\".cap"),
            (vgpu("queues = 17\n"), "vgpu \"a\".queues"),
            (vgpu("window = 5000\n"), "vgpu \"a\".window"),
            (vgpu("").replace("gpu = \"g\"\nsocket", "gpu = \"h\"\nsocket"), "vgpu \"a\".gpu"),
            (
                format!("{}{}", vgpu(""), "[[vgpu]]\nname = \"b\"\ngpu = \"g\"\nsocket = \"a.sock\"\nmemory = 1\ncompute_units = 1\n"),
                "vgpu \"b\".socket",
            ),
            (format!("{base}{base}"), "gpu \"g\".name"),
            (base.replace("name = \"g\"", "name = \"auto\""), "gpu \"auto\".name"),
        ];
        for (text, field) in cases {
            let e = Config::parse(&text, "c.toml").unwrap_err().to_string();
            assert!(e.starts_with(&format!("c.toml: {field}:")), "{e}");
        }
    }

    #[test]
    fn test_placement_and_auto_gpus() {
        let text = "[daemon]\nplacement = \"pack\"\n[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"1GiB\"\n\
                    [[vgpu]]\nname = \"a\"\ngpu = \"auto\"\nsocket = \"a.sock\"\nmemory = \"1MiB\"\ncompute_units = 1\n";
        let c = Config::parse(text, "c.toml").unwrap();
        assert_eq!(c.daemon.placement, Placement::Pack);
        assert_eq!(c.vgpus[0].gpu, AUTO_GPU);
        assert_eq!(Config::builtin().daemon.placement, Placement::Spread);
        let bad = text.replace("\"pack\"", "\"random\"");
        assert!(Config::parse(&bad, "c.toml").is_err());
    }

    #[test]
    fn test_isolation_defaults_and_refusals() {
        let gpu = |extra: &str| {
            let text = format!("[[gpu]]\nname = \"g\"\nmemory = \"1GiB\"\n{extra}");
            Config::parse(&text, "c.toml").map(|c| c.gpus[0].clone())
        };
        let iso = |extra: &str| gpu(extra).unwrap().isolation();
        assert_eq!(iso("backend = \"software\"\n"), Isolation::Thread);
        assert_eq!(iso("backend = \"cuda\"\n"), Isolation::Process);
        assert_eq!(
            iso("backend = \"cuda\"\npartition_mode = \"spatial\"\n"),
            Isolation::Process
        );
        assert_eq!(
            iso("backend = \"software\"\nisolation = \"process\"\n"),
            Isolation::Process
        );
        assert_eq!(
            iso("backend = \"cuda\"\nisolation = \"thread\"\n"),
            Isolation::Thread
        );
        let g = gpu("backend = \"cuda\"\nguest_ptx = true\npartition_host = \"/opt/h\"\n").unwrap();
        assert!(g.guest_ptx);
        assert_eq!(g.partition_host.as_deref(), Some(Path::new("/opt/h")));
        for (extra, field) in [
            (
                "backend = \"cuda\"\npartition_mode = \"spatial\"\nguest_ptx = true\n",
                "guest_ptx",
            ),
            (
                "backend = \"cuda\"\nisolation = \"thread\"\nguest_ptx = true\n",
                "guest_ptx",
            ),
            (
                "backend = \"software\"\nisolation = \"process\"\nguest_ptx = true\n",
                "guest_ptx",
            ),
        ] {
            let e = gpu(extra).unwrap_err().to_string();
            assert!(e.starts_with(&format!("c.toml: gpu \"g\".{field}:")), "{e}");
        }
        assert!(gpu("backend = \"software\"\nisolation = \"vm\"\n").is_err());
        // A context's own memory counts where it is a host process's.
        let cost = |extra: &str| gpu(extra).unwrap().context_memory();
        assert_eq!(cost("backend = \"cuda\"\n"), CUDA_CONTEXT_MEMORY);
        assert_eq!(
            cost("backend = \"cuda\"\npartition_mode = \"spatial\"\n"),
            0
        );
        assert_eq!(cost("backend = \"cuda\"\nisolation = \"thread\"\n"), 0);
        assert_eq!(cost("backend = \"software\"\n"), 0);
        assert_eq!(cost("backend = \"cuda\"\ncontext_memory = \"0\"\n"), 0);
        assert_eq!(
            cost("backend = \"software\"\ncontext_memory = \"1MiB\"\n"),
            1 << 20
        );
        let trusted = "partition_mode = \"spatial\"\nguest_ptx = true\ntrusted_tenants = true\n";
        assert!(gpu(&format!("backend = \"cuda\"\n{trusted}")).is_ok());
    }

    #[test]
    fn test_oversubscription_settings() {
        let gpu = |extra: &str| {
            let text = format!("[[gpu]]\nname = \"g\"\nmemory = \"1GiB\"\n{extra}");
            Config::parse(&text, "c.toml").map(|c| c.gpus[0].clone())
        };
        let g =
            gpu("backend = \"software\"\noversubscribe = true\nhost_memory = \"2GiB\"\n").unwrap();
        assert!(g.oversubscribe);
        assert_eq!(g.host_memory, Some(Size(2 << 30)));
        assert!(!gpu("backend = \"software\"\n").unwrap().oversubscribe);
        for (extra, field) in [
            (
                "backend = \"cuda\"\noversubscribe = true\n",
                "oversubscribe",
            ),
            (
                "backend = \"software\"\nhost_memory = \"1GiB\"\n",
                "host_memory",
            ),
        ] {
            let e = gpu(extra).unwrap_err().to_string();
            assert!(e.starts_with(&format!("c.toml: gpu \"g\".{field}:")), "{e}");
        }
    }
}
