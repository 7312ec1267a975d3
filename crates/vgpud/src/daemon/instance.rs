//! One vGPU instance: its partition, scheduler tenant and counters, and
//! while it runs, the device served on its socket.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use log::error;
use vfio_user_server::pci::PciIds;
use vfio_user_server::Endpoint;
use vgpu_api::DeviceEvents;
use vgpu_backend::console::ConsoleText;
use vgpu_backend::{
    Finished, Finishing, FunctionInfo, HostMemory, HostSink, HostSource, Launch, OpError,
    Partition, PartitionSpec, Queued, QueuedDone, Started,
};
use vgpu_device::{DeviceCounters, DrainHandle, VgpuDevice};
use vgpu_sched::TenantId;
use vmm_sys_util::eventfd::EventFd;

use super::gate::SchedGate;
use super::{DaemonError, InstanceInfo, ServingThreadHook};
use crate::config::VgpuConfig;

// Partition calls leave it consistent between calls.
use vgpu_sys::lock;

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
    fn kernel_compute_units(&self) -> u32 {
        lock(&self.inner).kernel_compute_units()
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
    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        lock(&self.inner).run_queued(steps, stop)
    }
    fn queue_depth(&self) -> usize {
        lock(&self.inner).queue_depth()
    }
    fn lanes(&self) -> usize {
        lock(&self.inner).lanes()
    }
    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        held: bool,
    ) -> Started {
        lock(&self.inner).start_queued(lane, steps, stop, held)
    }
    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        lock(&self.inner).finish_queued_within(within)
    }
    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        lock(&self.inner).finish_queued()
    }
    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        lock(&self.inner).max_active_clusters(launch)
    }
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        lock(&self.inner).function_info(module, entry)
    }
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        lock(&self.inner).global_info(module, name)
    }
    fn memory_used(&self) -> u64 {
        lock(&self.inner).memory_used()
    }
    fn console(&mut self, module: u64, max: usize) -> Result<ConsoleText, OpError> {
        lock(&self.inner).console(module, max)
    }
    fn reset(&mut self) {
        lock(&self.inner).reset()
    }
    fn is_lost(&self) -> bool {
        lock(&self.inner).is_lost()
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
pub(super) struct Serving {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    pub(super) drain: DrainHandle,
}

/// Device counters of functions an instance ran before its latest start,
/// so that counters an operator watches do not go back.
#[derive(Clone, Copy, Default)]
pub(super) struct Carried {
    pub(super) device: DeviceEvents,
    pub(super) peak: u64,
}

impl Carried {
    /// These counts with those of function counters `c` added.
    pub(super) fn with(&self, c: &DeviceCounters) -> Carried {
        let now = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let d = &self.device;
        Carried {
            device: DeviceEvents {
                faults: d.faults + now(&c.faults),
                errors: d.errors + now(&c.errors),
                resets: d.resets + now(&c.resets),
                odd_reads: d.odd_reads + now(&c.odd_reads),
                dropped_writes: d.dropped_writes + now(&c.dropped_writes),
            },
            peak: self.peak.max(now(&c.mem_peak)),
        }
    }
}

/// A vGPU: its configuration, partition and scheduler tenant, and while it
/// runs, its device.
pub(super) struct Instance {
    pub(super) config: VgpuConfig,
    pub(super) socket: PathBuf,
    pub(super) tenant: TenantId,
    pub(super) partition: Arc<Mutex<Box<dyn Partition>>>,
    pub(super) gate: Arc<SchedGate>,
    pub(super) counters: Arc<DeviceCounters>,
    pub(super) carried: Carried,
    pub(super) serving: Option<Serving>,
}

impl Instance {
    pub(super) fn state(&self) -> InstanceState {
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
    pub(super) fn serve(
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
    pub(super) fn halt(&mut self) {
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
        self.carried = self.carried.with(&self.counters);
        self.counters = Arc::new(DeviceCounters::default());
    }

    pub(super) fn info(&self) -> InstanceInfo {
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

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_backend::software::SoftwareBackend;
    use vgpu_backend::Backend;

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
        fn kernel_compute_units(&self) -> u32 {
            self.0.kernel_compute_units()
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
        fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
            self.0.run_queued(steps, stop)
        }
        fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
            self.0.max_active_clusters(launch)
        }
        fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
            self.0.function_info(module, entry)
        }
        fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
            self.0.global_info(module, name)
        }
        fn memory_used(&self) -> u64 {
            self.0.memory_used()
        }
        fn console(&mut self, module: u64, max: usize) -> Result<ConsoleText, OpError> {
            self.0.console(module, max)
        }
        fn reset(&mut self) {
            self.0.reset()
        }
        fn is_lost(&self) -> bool {
            self.0.is_lost()
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
}
