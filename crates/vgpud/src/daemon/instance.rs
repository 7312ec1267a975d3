//! One vGPU instance: its partition, scheduler tenant and counters, and
//! while it runs, the device served on its socket.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::error;
use vfio_user_server::pci::PciIds;
use vfio_user_server::Endpoint;
use vgpu_api::DeviceEvents;
use vgpu_backend::SharedPartition;
use vgpu_device::{DeviceCounters, DrainHandle, MemoryHandle, VgpuDevice};
use vgpu_sched::{SchedGate, TenantId};
use vmm_sys_util::eventfd::EventFd;

use super::{DaemonError, InstanceInfo, ServingThreadHook};
use crate::config::VgpuConfig;

/// Whether an instance serves its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Its socket accepts a VMM.
    Running,
    /// Configured, with its partition reserved, but no socket: the
    /// function is powered off.
    Stopped,
    /// Its socket accepts a VMM, but its memory is out of the GPU and
    /// its guest's commands wait (`vgpuctl suspend`).
    Suspended,
}

impl InstanceState {
    /// `running`, `stopped` or `suspended`.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
            InstanceState::Suspended => "suspended",
        }
    }
}

/// A started instance's device, served on its socket by a thread.
pub(super) struct Serving {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    pub(super) drain: DrainHandle,
    pub(super) memory: Arc<MemoryHandle>,
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
                kernel_faults: d.kernel_faults + now(&c.kernel_faults),
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
    /// Kept across a stop and a start: each start's device works on it.
    pub(super) partition: SharedPartition,
    pub(super) gate: Arc<SchedGate>,
    pub(super) counters: Arc<DeviceCounters>,
    pub(super) carried: Carried,
    pub(super) serving: Option<Serving>,
    /// Why the daemon picked its GPU (`gpu = "auto"`).
    pub(super) placed: Option<String>,
    /// Its suspends and resumes (shared with the residency thread of an
    /// oversubscribed GPU).
    pub(super) moves: Arc<std::sync::Mutex<MemoryMoves>>,
    /// What its device calls when it is suspended and wanted, on an
    /// oversubscribed GPU.
    pub(super) wanted: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// What suspends and resumes of a vGPU moved, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryMoves {
    /// Suspends, the operator's and the daemon's.
    pub suspends: u64,
    /// Of those, the daemon's, to make room for another vGPU of an
    /// oversubscribed GPU.
    pub evictions: u64,
    /// What its latest suspend moved out, while it is suspended.
    pub evicted: u64,
    /// Time its resumes took, in all.
    pub restore: Duration,
    /// Other vGPUs moved out to make room for this one's work.
    pub caused: u64,
    /// What moving them out took, charged to this one.
    pub caused_time: Duration,
}

impl Instance {
    pub(super) fn state(&self) -> InstanceState {
        match &self.serving {
            Some(s) if s.memory.is_suspended() => InstanceState::Suspended,
            Some(_) => InstanceState::Running,
            None => InstanceState::Stopped,
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
        dc.on_wanted = self.wanted.clone();
        let device =
            VgpuDevice::new(dc, self.partition.clone()).map_err(|e| setup(e.to_string()))?;
        let counters = device.counters();
        let drain = device.drain_handle().map_err(|e| setup(e.to_string()))?;
        let memory = Arc::new(device.memory_handle().map_err(|e| setup(e.to_string()))?);
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
            memory,
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
        self.partition.lock().reset();
        self.carried = self.carried.with(&self.counters);
        self.counters = Arc::new(DeviceCounters::default());
    }

    pub(super) fn info(&self) -> InstanceInfo {
        InstanceInfo {
            config: self.config.clone(),
            socket: self.socket.clone(),
            state: self.state(),
            placed: self.placed.clone(),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.halt();
    }
}
