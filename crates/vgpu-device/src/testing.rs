//! A vGPU served for tests and benchmarks (the `test-utils` feature): a
//! [`VgpuDevice`] on the test kit's socket endpoint, with a guest to drive
//! it from `vgpu_testkit`.

use std::path::Path;
use std::sync::Arc;

use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, Partition, PartitionSpec};
use vgpu_testkit::{Guest, GuestOptions, TestServer};
use vmm_sys_util::eventfd::EventFd;

use crate::{DeviceCounters, MemoryHandle, VgpuConfig, VgpuDevice};

/// A vGPU served on a socket in a temporary directory by a thread of its
/// own; stopped and joined on drop.
pub struct TestVgpu {
    server: TestServer,
    counters: Arc<DeviceCounters>,
    wake: EventFd,
    memory: MemoryHandle,
}

impl TestVgpu {
    /// Serves a vGPU made of `config` and `partition`.
    pub fn start(config: VgpuConfig, partition: Box<dyn Partition>) -> TestVgpu {
        let name = config.name.clone();
        let device = VgpuDevice::new(config, partition).expect("vGPU device");
        let wake = device.wake_eventfd().expect("wake eventfd");
        let counters = device.counters();
        let memory = device.memory_handle().expect("memory handle");
        let server = TestServer::start(&name, Box::new(device));
        TestVgpu {
            server,
            counters,
            wake,
            memory,
        }
    }

    /// Serves a vGPU on a partition of its own software backend with
    /// `memory` bytes of device memory and `compute_units` threads.
    pub fn software(config: VgpuConfig, memory: u64, compute_units: u32) -> TestVgpu {
        let backend = SoftwareBackend::new(memory, compute_units);
        let partition = software_partition(&backend, &config.name, memory, compute_units);
        TestVgpu::start(config, partition)
    }

    /// The function's counters.
    pub fn counters(&self) -> Arc<DeviceCounters> {
        self.counters.clone()
    }

    /// Resizes, suspends and resumes the function's memory as its owner
    /// would.
    pub fn memory(&self) -> &MemoryHandle {
        &self.memory
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        self.server.path()
    }

    /// Connects a guest with default options.
    pub fn connect(&self) -> Guest {
        self.server.connect()
    }

    /// Connects a guest with `opts`.
    pub fn connect_with(&self, opts: GuestOptions) -> Guest {
        self.server.connect_with(opts)
    }

    /// A duplicate of the eventfd behind the WAKE register: what a VMM with
    /// ioeventfd support gets through DEVICE_GET_REGION_IO_FDS (the
    /// vfio_user Client cannot ask for it). See [`Guest::use_wake_ioeventfd`].
    pub fn wake_ioeventfd(&self) -> EventFd {
        self.wake.try_clone().expect("duplicate wake eventfd")
    }

    /// Whether the endpoint thread still runs.
    pub fn alive(&self) -> bool {
        self.server.alive()
    }
}

/// Carves a partition named `name` out of `backend`.
pub fn software_partition(
    backend: &SoftwareBackend,
    name: &str,
    memory: u64,
    compute_units: u32,
) -> Box<dyn Partition> {
    backend
        .create_partition(&PartitionSpec {
            name: name.to_string(),
            memory,
            compute_units,
        })
        .expect("partition fits the backend")
}

/// A configuration named `name` that suits tests: `queues` queues, a
/// 1 MiB window and the default poll spin.
pub fn test_config(name: &str, queues: u32) -> VgpuConfig {
    let mut c = VgpuConfig::new(name);
    c.queues = queues;
    c.window_size = 1 << 20;
    c
}
