//! Physical GPUs and the vGPU instances running on them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{error, info};
use vfio_user_server::pci::PciIds;
use vfio_user_server::Endpoint;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, PartitionSpec};
use vgpu_device::VgpuDevice;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{BackendKind, Config, GpuConfig, VgpuConfig};

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
}

/// A running vGPU.
struct Instance {
    config: VgpuConfig,
    socket: PathBuf,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl Instance {
    fn stop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                error!("vGPU {}: serving thread panicked", self.config.name);
            }
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Summary of one instance.
#[derive(Clone, Debug)]
pub struct InstanceInfo {
    /// Its configuration.
    pub config: VgpuConfig,
    /// Its socket.
    pub socket: PathBuf,
}

/// Owns the GPUs and instances.
pub struct Daemon {
    config: Config,
    gpus: BTreeMap<String, Gpu>,
    instances: BTreeMap<String, Instance>,
}

fn make_backend(g: &GpuConfig) -> Result<Arc<dyn Backend>, DaemonError> {
    match g.backend {
        BackendKind::Software => {
            let memory = g.memory.map(|m| m.0).unwrap_or(0);
            Ok(Arc::new(SoftwareBackend::new(memory, g.compute_units)))
        }
        BackendKind::Cuda => Err(DaemonError::Backend {
            gpu: g.name.clone(),
            message: "this build has no CUDA backend".into(),
        }),
    }
}

impl Daemon {
    /// Starts the GPUs of `config` (no instances yet).
    pub fn new(config: Config) -> Result<Self, DaemonError> {
        let mut gpus = BTreeMap::new();
        for g in &config.gpus {
            let backend = make_backend(g)?;
            info!(
                "GPU {}: {} backend, {} compute units",
                g.name,
                backend.name(),
                backend.capacity().compute_units
            );
            gpus.insert(g.name.clone(), Gpu { backend });
        }
        Ok(Daemon {
            config,
            gpus,
            instances: BTreeMap::new(),
        })
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
            .get(&v.gpu)
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
        let device = VgpuDevice::new(dc, partition).map_err(|e| setup(e.to_string()))?;
        let socket = self.config.socket_path(&v);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| setup(format!("cannot create {}: {e}", dir.display())))?;
        }
        let endpoint = Endpoint::new(v.name.clone(), &socket, Box::new(device)).map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            setup(format!("{e}{cause}"))
        })?;
        let stop = endpoint.stop_handle().map_err(|e| setup(e.to_string()))?;
        let name = v.name.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vfio-{name}"))
            .spawn(move || {
                if let Err(e) = endpoint.run() {
                    error!("vGPU {name}: {e}");
                }
            })
            .map_err(|e| setup(e.to_string()))?;
        info!(
            "vGPU {} on GPU {}: {} memory, {} compute units, listening on {}",
            v.name,
            v.gpu,
            v.memory,
            v.compute_units,
            socket.display()
        );
        self.instances.insert(
            v.name.clone(),
            Instance {
                config: v,
                socket,
                stop,
                thread: Some(thread),
            },
        );
        Ok(())
    }

    /// Stops an instance and frees its memory.
    pub fn destroy(&mut self, name: &str) -> Result<(), DaemonError> {
        let mut inst = self
            .instances
            .remove(name)
            .ok_or_else(|| DaemonError::NoInstance(name.to_string()))?;
        inst.stop();
        info!("vGPU {name}: destroyed");
        Ok(())
    }

    /// The running instances.
    pub fn list(&self) -> Vec<InstanceInfo> {
        self.instances
            .values()
            .map(|i| InstanceInfo {
                config: i.config.clone(),
                socket: i.socket.clone(),
            })
            .collect()
    }

    /// Stops every instance.
    pub fn shutdown(&mut self) {
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
