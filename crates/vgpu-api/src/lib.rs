//! The JSON documents of vgpud's management API (`docs/api.md`), declared
//! once for the daemon that writes them and the clients that read them.
//! Every field has a default, so a client reads a document from a newer or
//! older daemon without failing on a field it does not know or miss.

#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

/// A vGPU's configuration: the fields of a `[[vgpu]]` table, sizes in
/// bytes; what `PUT /api/v1/vgpus` takes back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VgpuConfig {
    /// Name.
    pub name: String,
    /// The GPU it is a partition of.
    pub gpu: String,
    /// Socket path as configured (relative to the runtime directory).
    pub socket: String,
    /// Memory quota, bytes.
    pub memory: u64,
    /// Compute units.
    pub compute_units: u32,
    /// Priority.
    pub priority: i32,
    /// Fair-share weight.
    pub weight: u32,
    /// Fixed-share cap (0..=1), if any.
    pub cap: Option<f64>,
    /// Queues.
    pub queues: u32,
    /// Host-visible window, bytes.
    pub window: u64,
    /// Polling before sleeping, microseconds.
    pub poll_us: u64,
    /// Contexts (guest processes with device state of their own) at once
    /// besides the vGPU's own.
    pub contexts: u32,
    /// PCI vendor id, if not the default.
    pub pci_vendor: Option<u16>,
    /// PCI device id, if not the default.
    pub pci_device: Option<u16>,
}

/// A vGPU's figures since it was created.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VgpuStats {
    /// Name.
    pub name: String,
    /// Its GPU.
    pub gpu: String,
    /// `running` or `stopped`.
    pub state: String,
    /// Memory quota, bytes.
    pub memory_quota_bytes: u64,
    /// Device memory allocated now, bytes.
    pub memory_used_bytes: u64,
    /// Contexts (guest processes with device state of their own) now.
    pub contexts: u32,
    /// Contexts that started a new partition (on a GPU, a host process and
    /// a CUDA context), since the vGPU was created.
    pub context_starts: u64,
    /// What those starts took in all, seconds.
    pub context_start_seconds: f64,
    /// Contexts that took the partition of one that had ended.
    pub context_reuses: u64,
    /// What its contexts hold of their own, bytes: a GPU context's own
    /// memory for each, counted in `memory_used_bytes` and the quota.
    #[serde(default)]
    pub context_memory_bytes: u64,
    /// Most device memory allocated at once, bytes.
    pub memory_peak_bytes: u64,
    /// Suspends since the vGPU was created.
    #[serde(default)]
    pub suspends: u64,
    /// What its latest suspend moved out of the GPU, while it is
    /// suspended; 0 while its memory is on the GPU.
    #[serde(default)]
    pub evicted_bytes: u64,
    /// What its resumes took, in all, seconds.
    #[serde(default)]
    pub restore_seconds: f64,
    /// Of its suspends, those the daemon made to give its room to another
    /// vGPU of an oversubscribed GPU.
    #[serde(default)]
    pub evictions: u64,
    /// Other vGPUs moved out to make room for this one's work, and what
    /// that took, seconds (charged to this one).
    #[serde(default)]
    pub caused_evictions: u64,
    /// See `caused_evictions`.
    #[serde(default)]
    pub caused_eviction_seconds: f64,
    /// Commands completed.
    pub commands: u64,
    /// GPU time the scheduler charged to this vGPU, seconds.
    pub busy_seconds: f64,
    /// Bytes copied between guest or window memory and device memory.
    pub bytes: u64,
    /// Median wait for the GPU per grant (a turn), seconds.
    pub queue_wait_p50_seconds: f64,
    /// 99th percentile wait for the GPU per grant (a turn), seconds.
    pub queue_wait_p99_seconds: f64,
    /// Times its cap delayed it.
    pub capped: u64,
    /// What went wrong on its device.
    #[serde(flatten)]
    pub device: DeviceEvents,
}

/// What went wrong on a vGPU's device since the vGPU was created: function
/// resets and restarts do not clear these counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceEvents {
    /// Guest memory faults (bad DMA addresses).
    pub faults: u64,
    /// Device errors logged.
    pub errors: u64,
    /// Function resets.
    pub resets: u64,
    /// Guest register reads that were not aligned 32/64-bit accesses,
    /// answered from the registers they overlap.
    pub odd_reads: u64,
    /// Guest writes the device dropped (narrow or unaligned register writes).
    pub dropped_writes: u64,
    /// Commands whose kernel faulted (an illegal address); each ended
    /// the context of the guest process that ran it.
    pub kernel_faults: u64,
}

/// A vGPU: where it listens, its configuration and, on request, figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Vgpu {
    /// Name.
    pub name: String,
    /// Its GPU.
    pub gpu: String,
    /// `running` or `stopped`.
    pub state: String,
    /// The socket a VMM connects to.
    pub socket_path: String,
    /// Its configuration.
    pub config: VgpuConfig,
    /// Why the daemon picked its GPU, where it was created with `"auto"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Its figures (`GET /api/v1/vgpus/{name}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<VgpuStats>,
}

/// A physical GPU's figures since the daemon started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuStats {
    /// Name.
    pub name: String,
    /// Backend (`software`, `cuda`).
    pub backend: String,
    /// GPU time used over wall time since the daemon started (0 to 1).
    pub utilization: f64,
    /// GPU time used over the last seconds (decaying over 10 s; 0 to 1):
    /// what placement weighs.
    pub recent_load: f64,
    /// GPU time used, seconds.
    pub busy_seconds: f64,
    /// Changes of the vGPU holding the GPU.
    pub switches: u64,
    /// Commands completed.
    pub commands: u64,
}

/// `GET /api/v1/stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Every GPU.
    pub gpus: Vec<GpuStats>,
    /// Every vGPU.
    pub vgpus: Vec<VgpuStats>,
}

/// A physical GPU: its scheduler, what it has and what is taken.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gpu {
    /// Name.
    pub name: String,
    /// Backend.
    pub backend: String,
    /// Scheduling policy (`round-robin`, `priority`, `fair`).
    pub policy: String,
    /// Time slice, microseconds.
    pub slice_us: u64,
    /// CUDA device ordinal (CUDA GPUs only).
    pub device: Option<u32>,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Memory given to vGPUs, bytes.
    pub memory_allocated_bytes: u64,
    /// Memory left, bytes.
    pub memory_free_bytes: u64,
    /// Compute units.
    pub compute_units: u32,
    /// Compute units given to vGPUs.
    pub compute_units_allocated: u32,
    /// Compute units left.
    pub compute_units_free: u32,
    /// Its vGPUs.
    pub vgpus: Vec<String>,
    /// Its figures.
    pub stats: Option<GpuStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_documents_round_trip_and_tolerate_other_versions() {
        let v = Vgpu {
            name: "a".into(),
            state: "running".into(),
            config: VgpuConfig {
                memory: 1 << 20,
                cap: Some(0.25),
                ..Default::default()
            },
            ..Default::default()
        };
        let text = serde_json::to_string(&v).unwrap();
        assert!(!text.contains("\"stats\""), "{text}");
        assert_eq!(serde_json::from_str::<Vgpu>(&text).unwrap(), v);
        // A field this version does not know, and fields it misses.
        let g: Gpu = serde_json::from_str(r#"{"name":"g","future":1}"#).unwrap();
        assert_eq!((g.name.as_str(), g.stats), ("g", None));
    }
}
