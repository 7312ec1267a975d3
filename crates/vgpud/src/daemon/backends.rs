//! Creating the backend of each configured GPU: in process, or in
//! partition host processes.

use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::Backend;

use super::DaemonError;
use crate::config::{BackendKind, DaemonConfig, GpuConfig, Isolation, PartitionMode};

pub(super) fn make_backend(
    g: &GpuConfig,
    d: &DaemonConfig,
) -> Result<Arc<dyn Backend>, DaemonError> {
    if g.isolation() == Isolation::Process {
        return make_remote_backend(g, d);
    }
    match g.backend {
        BackendKind::Software => {
            let memory = g.memory.map(|m| m.0).unwrap_or(0);
            let timeout = Duration::from_millis(g.kernel_timeout_ms);
            Ok(Arc::new(
                SoftwareBackend::new(memory, g.compute_units).with_kernel_timeout(timeout),
            ))
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
    // Spatial partitions are SM groups of one process: one shared host
    // serves them all (on the software backend, one whose kernel faults
    // lose every partition, as on a GPU).
    let spatial = g.partition_mode == PartitionMode::Spatial;
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
                spatial,
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
        shared: spatial,
    };
    let launcher = ProcessLauncher::with_policy(program, options.to_args(), &policy)
        .map_err(|e| fail(format!("cannot start the partition host launcher: {e}")))?;
    let config = RemoteConfig {
        spin,
        shared: spatial,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(Arc::new(launcher), config)
        .map(|b| Arc::new(b) as Arc<dyn Backend>)
        .map_err(|e| fail(e.to_string()))
}
