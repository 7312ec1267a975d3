//! The `remote` backend: every partition of an inner backend (software or
//! CUDA) lives in its own child process, a *partition host*
//! (`vgpu-partition-host`), and the daemon forwards each [`Partition`]
//! call to it over a UNIX socket pair.
//!
//! # Why
//!
//! On an H200 (see `docs/perf/cuda-tests.md`; this crate's figures are in
//! `docs/perf/cuda-process.md`), CUDA contexts of one
//! process share one GPU address space, and one illegal access makes every
//! context of the process unusable. A process per partition gives each
//! tenant its own GPU address space and confines a fault, or a crash of
//! the driver's user-space library, to that tenant's host. It also keeps
//! the GPU driver (which needs broad `open`/`ioctl`/`mmap`) out of the
//! daemon, so the daemon's protocol and device-model threads can run
//! under a tight system-call filter while hosts run under a looser one
//! (see `docs/security-model.md`, "GPU work out of process").
//!
//! # How
//!
//! - The protocol ([`proto`]) is a small, versioned, length-prefixed
//!   binary request/reply stream, one request at a time. The daemon checks
//!   every frame and every value a host returns (lengths, kinds, sequence
//!   numbers, memory in use against the quota, transfer pieces against the
//!   transfer, faults against the ones the daemon itself reported); a host
//!   that breaks a rule, dies (end of file) or stays silent past its
//!   timeout is killed and reaped, and every later call on that partition
//!   fails with [`OpError::Device`](vgpu_backend::OpError::Device) until [`Partition::reset`] starts a
//!   fresh host. Other partitions are not involved.
//! - Bulk data (upload, download) crosses through a staging area: a
//!   sealed memfd mapped by both processes (passed with `SCM_RIGHTS`), in
//!   pieces of half its size. The daemon fills it from guest memory (the
//!   one CPU copy of the in-process path) and the host's backend reads it;
//!   the host asks for the next piece before it copies the current one,
//!   and hands a download piece over while it fills the other half. The
//!   first piece travels with the request and the last one with the
//!   reply, so a small transfer takes one round trip. Module images and
//!   launch parameters travel inline, bounded by the guest ABI.
//! - Guest RAM that the daemon maps from the VMM's files, when they are
//!   sealed against shrinking, is forwarded:
//!   [`RemotePartition`]'s [`HostMemory`](vgpu_backend::HostMemory)
//!   registry passes each mapping's file (with `SCM_RIGHTS`), offset, size
//!   and protection to the host on a second socket, the host maps it and
//!   tells its inner partition's registry (CUDA registers it with the
//!   driver). A transfer whose guest memory lies wholly in forwarded
//!   mappings names (mapping, offset, length) pieces instead of staging
//!   bytes, and the host's backend copies straight from guest pages; the
//!   host checks every piece against its own table. An unmap returns only
//!   once the host has unmapped (or, silent past its timeout, was killed
//!   and is gone). See `forward.rs` here and `vgpu-partition-host`'s
//!   `guest_mem.rs` for the threads and locks involved.
//! - With a polling time ([`RemoteConfig::spin`], the host's `--spin-us`),
//!   small frames go through a mailbox in the staging memfd instead of the
//!   socket: each side polls a sequence word, so a round trip costs no
//!   system call while both poll; a side that stops polling sleeps on the
//!   socket and is woken there. Frames read from the mailbox are copied
//!   out and checked like socket frames.
//! - A reset of a healthy host resets its partition in place; a host whose
//!   backend cannot recover in its process (CUDA after a kernel fault)
//!   asks to be replaced, and is.
//! - Hosts are started, killed and reaped by a launcher process
//!   ([`ProcessLauncher`]), started with the backend before the daemon
//!   confines itself (its filter forbids creating processes): the daemon
//!   asks it over a socket and receives each host's socket with
//!   `SCM_RIGHTS`. Hosts run as the daemon's unprivileged user, without
//!   capabilities, with no new privileges, under their own system-call
//!   filter ([`vgpu_confine::Role::PartitionHost`]), with
//!   `PR_SET_PDEATHSIG(SIGKILL)` (from the single-threaded launcher),
//!   only their socket inherited, and every other descriptor closed first
//!   thing. A host exits when its socket closes; the daemon waits
//!   [`EXIT_GRACE_MS`] for it, then has it killed, and reaped either way.
//!
//! The backend's placement (memory and compute units left) is kept here in
//! the daemon: each host opens its inner backend whole and carves the one
//! partition it is asked for.
//!
//! This crate is the daemon's side and what both sides share: the
//! protocol ([`proto`]), its framing ([`wire`], [`mailbox`]), the staging
//! area ([`shm`]), the hosts' command line ([`HostArgs`]) and the
//! launcher's records ([`launcher`]). The host's side (its command loop,
//! its runner, forwarded guest memory, the launcher process) is
//! `vgpu-partition-host`'s library.

#![warn(missing_docs)]

mod forward;
mod host_cmd;
mod partition;

pub mod launcher;
pub mod mailbox;
pub mod proto;
pub mod shm;
pub mod wire;

use std::fmt;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use log::info;
use vgpu_backend::{Backend, BackendError, Capacity, Partition, PartitionSpec};
use vgpu_sys::warn_limited;

pub use forward::TransferCounts;
pub use host_cmd::{HostArgs, HostOptions, InnerBackend, HOST_PROGRAM};
pub use launcher::{HostPolicy, HostProcess, ProcessLauncher};
pub use partition::RemotePartition;

/// How long (ms) a closed partition host gets to exit before it is killed.
pub const EXIT_GRACE_MS: u64 = 1000;

pub(crate) use vgpu_sys::lock;

/// Sizes and timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Bytes of each partition's staging area; uploads and downloads move
    /// in pieces of half of it, one half filled while the other drains.
    pub staging_bytes: usize,
    /// Longest wait for any answer of a running host (a kernel running
    /// longer is treated as hung: its host is killed).
    pub op_timeout: Duration,
    /// Longest wait for a host to start and create its partition (a CUDA
    /// host compiles its built-in module then).
    pub start_timeout: Duration,
    /// Longest wait for an in-place reset.
    pub reset_timeout: Duration,
    /// How long the daemon polls for an answer before it sleeps on the
    /// socket (the host's own polling is its `--spin-us`). Polling saves a
    /// scheduler wake-up per message at the price of a busy core while it
    /// lasts.
    pub spin: Duration,
    /// Queued runs a partition keeps in flight at once (1 to 4): with
    /// two, the host has the next run on its way to the device while the
    /// device works on this one.
    pub queue_depth: usize,
    /// Lanes a partition offers (see `Partition::lanes`): each an ordered
    /// stream of runs, side by side on the host's device when its
    /// partition has lanes of its own. At most as many as keep every lane
    /// `queue_depth` deep within [`proto::MAX_STARTED`] runs.
    pub lanes: usize,
    /// The partitions share one host process (spatial mode): a fault
    /// that loses it loses them all, so each vGPU has one context (a
    /// context per guest process would not contain anything).
    pub shared: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            staging_bytes: 8 << 20,
            op_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(30),
            reset_timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
            queue_depth: 2,
            lanes: 4,
            shared: false,
        }
    }
}

/// A started partition host: its socket and, when it is a process, the
/// process (reaped by the partition, through the launcher).
#[derive(Debug)]
pub struct HostLink {
    /// The daemon's end of the socket pair.
    pub stream: UnixStream,
    /// The host process, when it is this partition's own.
    pub process: Option<HostProcess>,
    /// The process id of a shared host (spatial mode), which serves
    /// other partitions too: the partition neither kills nor reaps it.
    pub shared_pid: Option<u32>,
}

/// Starts partition hosts.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// Starts one.
    fn launch(&self) -> io::Result<HostLink>;
}

/// The partition host program installed next to the current executable
/// (`vgpud`), or `VGPU_PARTITION_HOST` when set.
pub fn default_host_program() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("VGPU_PARTITION_HOST") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("the executable has no directory"))?;
    // Test and bench binaries live one level below the built programs.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(HOST_PROGRAM);
        if p.is_file() {
            return Ok(p);
        }
    }
    Ok(dir.join(HOST_PROGRAM))
}

/// A backend whose partitions each run in their own partition host.
#[derive(Debug)]
pub struct RemoteBackend {
    launcher: Arc<dyn Launcher>,
    config: RemoteConfig,
    name: String,
    capacity: Capacity,
    pool: Arc<Mutex<Capacity>>,
}

impl RemoteBackend {
    /// Starts one host to learn the inner backend's name and capacity (and
    /// that hosts start at all), then closes it.
    pub fn new(
        launcher: Arc<dyn Launcher>,
        config: RemoteConfig,
    ) -> Result<RemoteBackend, BackendError> {
        if config.staging_bytes < 2 {
            return Err(BackendError::Unavailable(
                "the staging area needs at least two bytes (two halves)".into(),
            ));
        }
        let (link, name, capacity) =
            partition::Link::open(&*launcher, config.start_timeout, config.spin)
                .map_err(|why| BackendError::Unavailable(format!("partition host: {why}")))?;
        drop(link);
        info!(
            "remote backend: {name} partitions in their own processes, {} bytes, {} compute units",
            capacity.memory, capacity.compute_units
        );
        Ok(RemoteBackend {
            launcher,
            config,
            name,
            capacity,
            pool: Arc::new(Mutex::new(capacity)),
        })
    }

    /// Memory and compute that no partition holds.
    pub fn unclaimed(&self) -> Capacity {
        *lock(&self.pool)
    }

    /// Carves out a partition, as its concrete type.
    pub fn create_remote_partition(
        &self,
        spec: &PartitionSpec,
    ) -> Result<RemotePartition, BackendError> {
        {
            if let Err(why) = lock(&self.pool).reserve(spec) {
                warn_limited!("remote backend: {why}");
                return Err(BackendError::DoesNotFit(why));
            }
        }
        // From here the partition gives it back, even if it fails to start.
        RemotePartition::create(
            spec,
            Arc::clone(&self.launcher),
            self.config.clone(),
            Some(Arc::clone(&self.pool)),
        )
        .map_err(|why| BackendError::Unavailable(format!("partition {:?}: {why}", spec.name)))
    }
}

impl Backend for RemoteBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn create_partition(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        Ok(Box::new(self.create_remote_partition(spec)?))
    }

    fn has_contexts(&self) -> bool {
        // A host process, with a GPU context of its own, per context;
        // a shared host (spatial mode) would contain no fault per context.
        !self.config.shared
    }

    fn create_context(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        // The partition whose context it is holds the reservation.
        RemotePartition::create(spec, Arc::clone(&self.launcher), self.config.clone(), None)
            .map(|p| Box::new(p) as Box<dyn Partition>)
            .map_err(|why| BackendError::Unavailable(format!("context of {:?}: {why}", spec.name)))
    }
}
