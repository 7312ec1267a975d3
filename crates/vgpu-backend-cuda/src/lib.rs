//! The `cuda` backend: partitions of one NVIDIA GPU, driven through the
//! CUDA driver API (`cudarc`, loaded at run time, so building needs no
//! CUDA installation and a host without a driver gets a clean
//! [`BackendError::Unavailable`]).
//!
//! # Partition modes and what each isolates
//!
//! Measured on an H200 with driver 580 (see `docs/perf/cuda-tests.md`):
//!
//! | | [`Mode::Isolated`] | [`Mode::Spatial`] |
//! |---|---|---|
//! | CUDA object per partition | its own context (`cuCtxCreate`) | a green context (`cuGreenCtxCreate`) of the device's primary context |
//! | compute | the whole GPU, **time-sliced** between contexts by the driver | its own group of SMs (`cuDevSmResourceSplitByCount`), running **concurrently** with the others; a kernel's blocks ran on exactly 8, 16 and 64 distinct SMs in partitions of that size |
//! | `compute_units` | a share of the SMs for placement and scheduling only; not enforced | SMs, in multiples of [`CudaBackend::sm_granule`] (8 on an H200, where 120 of the 132 SMs can be handed out); enforced by the hardware |
//! | GPU address space | **shared** with every other partition of the process: a kernel in one context wrote another context's allocation without a fault | **shared**: green contexts use their primary context's address space |
//! | a kernel fault (illegal address) | **every** partition of the process fails from then on, and no context can be created again (`cuDevicePrimaryCtxReset` does not help): only a new process recovers | the same |
//! | copy engines, memory bandwidth, L2 | shared | shared |
//!
//! So inside one process neither mode separates tenants' memory from code
//! the backend did not write, and neither contains a fault. What keeps
//! tenants apart here is the backend itself:
//!
//! - every device range a partition is asked about (copy, fill, upload,
//!   download and every operand of a built-in kernel) must lie inside one
//!   of **its own** allocations, or the command fails with `OutOfRange`
//!   before any device work; device addresses are the real `CUdeviceptr`s;
//! - the built-in kernels only touch ranges checked that way, so they do
//!   not fault;
//! - guest PTX modules, which can dereference any address, are refused
//!   (`Unsupported`) unless [`CudaBackend::set_guest_ptx`] allows them,
//!   which is safe only for a backend serving one tenant (one partition
//!   per process) or tenants that trust each other;
//! - new allocations are zeroed, so no tenant reads what a previous owner
//!   of the memory left.
//!
//! After a fault the backend says so: every partition's commands fail with
//! `Device` ("CUDA is unusable in this process until it restarts"),
//! [`Partition::reset`] cannot bring a context back, [`CudaBackend::new`]
//! returns `Unavailable`, and [`cuda_lost`] tells why. Memory and fault
//! isolation for untrusted kernels needs a process per partition (separate
//! address spaces; contexts of different processes time-slice as the
//! contexts here do) or MIG; neither is implemented here. Without a fault,
//! `reset` destroys and recreates the partition's context.
//!
//! # Memory
//!
//! `alloc` is `cuMemAlloc` in the partition's context; the quota is the
//! partition's, with the same `NoMemory { requested, available }` as the
//! software backend. An alignment above 256 bytes is obtained by asking the
//! driver for `align - 256` more bytes, and that padding is charged to the
//! quota (`requested` then includes it). Each partition also holds, outside
//! its quota, two 8 MiB pinned host staging buffers and an 8 MiB device
//! scratch buffer, plus what the driver keeps per context (hundreds of MiB
//! for an own context in isolated mode).
//!
//! # Guest memory
//!
//! Guest RAM that the VMM shares by fd is announced to the partition's
//! [`HostRegistry`] ([`Partition::host_memory`]) when it is mapped, and
//! mappings of at least [`MIN_REGISTRATION`] bytes (at most
//! [`MAX_REGISTRATIONS`] mappings and [`CudaBackend::set_max_registered`]
//! bytes per partition) are registered with
//! `cuMemHostRegister` (`PORTABLE`, in the device's primary context, which
//! the registry retains, so that in isolated mode the process also holds
//! the primary context) on a thread of the registry, never on a command:
//! 0.8 s for 1.5 GiB of fresh memfd pages on the H200 machine, since the
//! pages are allocated as they are pinned. Registered guest memory stays
//! pinned (not swappable) until unmapped. An upload or download whose guest
//! pieces all lie in completed registrations, and average at least
//! [`DIRECT_MIN_SLICE`] bytes, is one `cuMemcpyHtoDAsync` /
//! `cuMemcpyDtoHAsync` per piece, straight between guest pages and device
//! memory on the copy engines, waited for while the guest memory is
//! guaranteed mapped (the DMA table's read lock: an unmap waits for it).
//! An unmap unregisters the memory before the engine unmaps it (waiting
//! for a registration under way).
//!
//! Other copies (memory not yet registered, memory reached through
//! DMA_READ/WRITE messages, the host-visible window, scattered small
//! pieces, a registration the driver refused) go through the pinned
//! staging buffers in 8 MiB chunks, double-buffered: the host copies one
//! chunk while the DMA engine moves the other, at the host copy's speed
//! (about 10 GB/s on the H200 machine).
//!
//! # Kernels
//!
//! The built-in module ([`BUILTIN_SOURCE`]) is compiled once by NVRTC when
//! the backend starts and loaded into every partition's context. A launch
//! of a built-in validates the guest's grid and block (no zero dimension)
//! but, like the software backend, picks its own launch shape from the
//! parameters. Float operands must be 4-byte aligned (the software backend
//! accepts any alignment); `fill_u32` and `copy` take any alignment.
//! Operands may alias as in the software backend: an input that is exactly
//! the output is read in place, one that overlaps it otherwise is read
//! from a temporary copy (charged to the quota while it lives).
//!
//! Loaded PTX (`MODULE_FORMAT_PTX`, where allowed) is JIT-compiled with
//! `cuModuleLoadDataEx` in the partition's context; a rejected image comes
//! back as `Invalid` with the JIT's error log. Its launches pass the
//! guest's parameter block as one packed buffer
//! (`CU_LAUNCH_PARAM_BUFFER_POINTER`), whose size must equal the kernel's
//! parameter list as the driver reports it.
//!
//! Every command runs to completion before it returns. The device time of
//! the last command (CUDA events around its device work) is
//! [`CudaPartition::last_device_time`]. A kernel that never ends blocks its
//! partition: there is no watchdog yet.

#![warn(missing_docs)]

mod device;
mod driver;
mod hostmem;
mod kernels;
mod partition;
mod printf;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use log::{error, info, warn};
use vgpu_backend::{Backend, BackendError, Capacity, Partition, PartitionSpec};

pub use device::DIRECT_MIN_SLICE;
use driver::{device_attribute, CuError, PrimaryContext, SmResource};
pub use hostmem::{HostRegistry, DEFAULT_MAX_REGISTERED, MAX_REGISTRATIONS, MIN_REGISTRATION};
pub use partition::CudaPartition;
pub use printf::OutputCapture;

/// CUDA C source of the built-in module.
pub const BUILTIN_SOURCE: &str = kernels::SOURCE;

/// SMs per spatial group unless the device asks for more.
pub const DEFAULT_SM_GRANULE: u32 = 8;

/// Set by the first sticky device error (a kernel fault) in this process.
static CUDA_LOST: OnceLock<String> = OnceLock::new();

/// Why CUDA is unusable in this process, if a kernel faulted: a sticky
/// error leaves every context of the process failing (seen on an H200 with
/// driver 580, as CUDA documents), so only a new process recovers.
pub fn cuda_lost() -> Option<&'static str> {
    CUDA_LOST.get().map(String::as_str)
}

pub(crate) fn mark_lost(why: &str) {
    if CUDA_LOST.set(why.to_string()).is_ok() {
        error!("cuda backend: {why}: CUDA is unusable in this process until it restarts");
    }
}

pub(crate) fn lost_message(why: &str) -> String {
    format!("device fault ({why}); CUDA is unusable in this process until it restarts")
}

/// Whether the CUDA driver and NVRTC libraries can be loaded here; the
/// error says which is missing. Nothing else in this crate calls into CUDA
/// before this has succeeded.
pub fn cuda_available() -> Result<(), String> {
    driver::libraries_present()
}

/// How partitions share the GPU (see the crate docs for what each isolates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One CUDA context per partition: the whole GPU, time-sliced between
    /// partitions (the process's GPU address space is still shared).
    Isolated,
    /// One green context per partition: disjoint SM groups running
    /// concurrently, one shared address space.
    Spatial,
}

/// A group of SMs from the backend's one split of the device.
#[derive(Clone, Copy)]
pub(crate) struct SmGroup {
    pub resource: SmResource,
    pub sms: u32,
}

/// What no partition holds.
#[derive(Debug)]
pub(crate) struct Pool {
    pub memory: u64,
    pub compute_units: u32,
    /// Indices into [`Shared::groups`] (spatial mode).
    pub free_groups: BTreeSet<usize>,
}

/// State shared by the backend and its partitions.
pub(crate) struct Shared {
    pub ordinal: i32,
    pub device: driver::CUdevice,
    pub name: String,
    pub mode: Mode,
    pub capacity: Capacity,
    pub device_sms: u32,
    pub sm_granule: u32,
    /// Shared memory a block may use when its kernel opts in.
    pub max_shared_optin: u32,
    /// Whether the device runs cooperative launches.
    pub cooperative: bool,
    /// Whether the device offers virtual memory management with mappings
    /// at the ABI's granularity (a multiple of its own).
    pub vmm: bool,
    /// The built-in module, NUL-terminated PTX.
    pub ptx: Vec<u8>,
    pub groups: Vec<SmGroup>,
    /// The device's primary context, retained in spatial mode (the green
    /// contexts belong to it). Released when the last holder of this goes:
    /// every partition holds an Arc of it, so no green context remains.
    pub _primary: Option<PrimaryContext>,
    pub pool: Mutex<Pool>,
    /// Whether guests may load PTX modules.
    pub guest_ptx: AtomicBool,
    /// Bytes of guest memory one partition keeps registered at most.
    pub max_registered: AtomicU64,
    /// The process's standard output and error, where the driver prints
    /// what kernels print, when this process took them over.
    pub printf: OnceLock<OutputCapture>,
}

// SAFETY: the raw handles (device, primary context, SM resources) are
// process-wide driver objects that may be used from any thread; the only
// mutable part, the pool, is behind a mutex.
unsafe impl Send for Shared {}
// SAFETY: as above; shared references only read the handles.
unsafe impl Sync for Shared {}

// Poison-tolerant: every update leaves the state usable.
pub(crate) use vgpu_sys::lock;

/// One NVIDIA GPU split into partitions.
pub struct CudaBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.shared.ordinal)
            .field("name", &self.shared.name)
            .field("mode", &self.shared.mode)
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

fn unavailable(what: &str, e: CuError) -> BackendError {
    BackendError::Unavailable(format!("{what}: {e}"))
}

fn lcm(a: u32, b: u32) -> u32 {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    if a == 0 || b == 0 {
        a.max(b)
    } else {
        a / gcd(a, b) * b
    }
}

/// Compiles the built-in module for compute capability `cc`, falling back
/// to NVRTC's default target (which the driver JIT-compiles forward).
fn compile_builtin(cc: (i32, i32)) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let for_arch = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = match compile_ptx_with_opts(kernels::SOURCE, for_arch) {
        Ok(p) => p,
        Err(e) => {
            warn!(
                "cuda backend: NVRTC cannot target compute_{}{}: {e}; using its default",
                cc.0, cc.1
            );
            compile_ptx_with_opts(kernels::SOURCE, CompileOptions::default())
                .map_err(|e| format!("the built-in module does not compile: {e}"))?
        }
    };
    let mut bytes = ptx
        .as_bytes()
        .ok_or("NVRTC returned no PTX image")?
        .to_vec();
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes.push(0);
    Ok(bytes)
}

impl CudaBackend {
    /// Opens GPU `device_index`. Fails with `Unavailable` on a host without
    /// the CUDA driver or NVRTC, without such a device, or when the
    /// built-in module does not compile.
    pub fn new(device_index: u32, mode: Mode) -> Result<CudaBackend, BackendError> {
        driver::libraries_present()
            .map_err(|why| BackendError::Unavailable(format!("no CUDA driver: {why}")))?;
        if let Some(why) = cuda_lost() {
            return Err(BackendError::Unavailable(lost_message(why)));
        }
        let ordinal = i32::try_from(device_index)
            .map_err(|_| BackendError::Unavailable(format!("no CUDA device {device_index}")))?;
        driver::init().map_err(|e| unavailable("cuInit", e))?;
        let device = driver::device_get(ordinal)
            .map_err(|e| unavailable(&format!("CUDA device {device_index}"), e))?;
        let name = driver::device_name(device).unwrap_or_else(|| "unknown".into());
        let attr = |a| device_attribute(device, a).map_err(|e| unavailable("device attribute", e));
        use driver::CUdevice_attribute as A;
        let device_sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_shared_optin =
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        let cooperative = attr(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0;
        let vmm = attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0
            && driver::mem_granularity(device)
                .is_ok_and(|g| g > 0 && (vgpu_abi::VMM_GRANULARITY as usize).is_multiple_of(g));
        let cc = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let memory =
            driver::device_total_mem(device).map_err(|e| unavailable("device memory size", e))?;
        let ptx = compile_builtin(cc).map_err(BackendError::Unavailable)?;

        let mut primary = None;
        let mut groups = Vec::new();
        let mut sm_granule = DEFAULT_SM_GRANULE;
        if mode == Mode::Spatial {
            let retained =
                PrimaryContext::retain(device).map_err(|e| unavailable("primary context", e))?;
            // If the split fails, dropping `retained` releases it.
            let (g, granule) = split_sms(device)?;
            groups = g;
            sm_granule = granule;
            primary = Some(retained);
        }
        let compute_units = match mode {
            Mode::Isolated => device_sms,
            Mode::Spatial => groups.iter().map(|g| g.sms).sum(),
        };
        let capacity = Capacity {
            memory: memory as u64,
            compute_units,
        };
        info!(
            "cuda backend: device {device_index} ({name}, sm_{}{}, {device_sms} SMs, {memory} bytes), {mode:?} mode, {} partitionable SMs",
            cc.0, cc.1, compute_units
        );
        Ok(CudaBackend {
            shared: Arc::new(Shared {
                ordinal,
                device,
                name,
                mode,
                capacity,
                device_sms,
                sm_granule,
                max_shared_optin,
                cooperative,
                vmm,
                ptx,
                pool: Mutex::new(Pool {
                    memory: memory as u64,
                    compute_units,
                    free_groups: (0..groups.len()).collect(),
                }),
                groups,
                _primary: primary,
                guest_ptx: AtomicBool::new(false),
                max_registered: AtomicU64::new(DEFAULT_MAX_REGISTERED),
                printf: OnceLock::new(),
            }),
        })
    }

    /// The device's name ("NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.shared.name
    }

    /// The partition mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode
    }

    /// SMs of the whole device.
    pub fn device_sms(&self) -> u32 {
        self.shared.device_sms
    }

    /// In spatial mode, partitions get SMs in multiples of this.
    pub fn sm_granule(&self) -> u32 {
        self.shared.sm_granule
    }

    /// Memory and compute that no partition holds.
    pub fn unclaimed(&self) -> Capacity {
        let pool = lock(&self.shared.pool);
        Capacity {
            memory: pool.memory,
            compute_units: pool.compute_units,
        }
    }

    /// The built-in module as compiled for this device (NUL-terminated PTX).
    pub fn builtin_ptx(&self) -> &[u8] {
        &self.shared.ptx
    }

    /// Allows (or again refuses) guest PTX modules. A loaded kernel can
    /// dereference any device address, and every partition of this process
    /// lives in one GPU address space (in both modes), so a loaded kernel
    /// can read and write every partition's memory: allow this only when
    /// the backend serves a single tenant (one partition per process) or
    /// tenants that trust each other.
    pub fn set_guest_ptx(&self, allow: bool) {
        self.shared.guest_ptx.store(allow, Ordering::Relaxed);
    }

    /// Gives the partitions what the driver prints to this process's
    /// standard output and error (kernels' `printf`, failed `assert()`s),
    /// taken over by `capture`: each partition's guest gets what it
    /// printed (CONSOLE). For a process of one partition, whose output is
    /// then that partition's alone.
    pub fn set_printf_capture(&self, capture: OutputCapture) {
        let _ = self.shared.printf.set(capture);
    }

    /// Sets how many bytes of guest memory one partition keeps registered
    /// with the driver at most (default [`DEFAULT_MAX_REGISTERED`]); copies
    /// of memory past it are staged. Registering pins, and so allocates,
    /// every page of a mapping: this bounds what a VMM's mappings make this
    /// process allocate and lock. Applies to mappings announced from now on.
    pub fn set_max_registered(&self, bytes: u64) {
        self.shared.max_registered.store(bytes, Ordering::Relaxed);
    }

    /// Carves out a partition, as its concrete type (which also tells the
    /// device time of each command).
    pub fn create_cuda_partition(
        &self,
        spec: &PartitionSpec,
    ) -> Result<CudaPartition, BackendError> {
        CudaPartition::create(Arc::clone(&self.shared), spec)
    }
}

/// Splits the device's SMs into groups of the granule; returns the groups
/// and the granule.
fn split_sms(device: driver::CUdevice) -> Result<(Vec<SmGroup>, u32), BackendError> {
    let whole = driver::device_sm_resource(device)
        .map_err(|e| unavailable("SM resource of the device", e))?;
    let granule = lcm(
        lcm(DEFAULT_SM_GRANULE, whole.min_partition_size()),
        whole.coscheduled_alignment(),
    );
    let count = (whole.sm_count() / granule).max(1);
    let (out, remaining) = driver::sm_split_by_count(&whole, count, granule)
        .map_err(|e| unavailable(&format!("splitting the SMs into groups of {granule}"), e))?;
    let groups: Vec<SmGroup> = out
        .into_iter()
        .map(|resource| SmGroup {
            sms: resource.sm_count(),
            resource,
        })
        .collect();
    let left = remaining.sm_count();
    info!(
        "cuda backend: {} SMs split into {} groups ({:?} SMs each), {left} left over",
        whole.sm_count(),
        groups.len(),
        groups.iter().map(|g| g.sms).collect::<BTreeSet<_>>()
    );
    if groups.is_empty() {
        return Err(BackendError::Unavailable(format!(
            "the device's {} SMs give no group of {granule}",
            whole.sm_count()
        )));
    }
    Ok((groups, granule))
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn capacity(&self) -> Capacity {
        self.shared.capacity
    }

    fn create_partition(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        Ok(Box::new(self.create_cuda_partition(spec)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_new_without_driver_is_unavailable() {
        let r = CudaBackend::new(0, Mode::Isolated);
        match cuda_available() {
            Err(why) => {
                let Err(BackendError::Unavailable(msg)) = r else {
                    panic!("expected Unavailable, got {r:?}");
                };
                assert!(msg.starts_with("no CUDA driver: "), "{msg}");
                assert!(msg.contains(&why), "{msg}");
                // Spatial mode takes the same path.
                assert!(matches!(
                    CudaBackend::new(0, Mode::Spatial),
                    Err(BackendError::Unavailable(_))
                ));
            }
            Ok(()) => {
                // A host with a driver but no GPU 4096 still fails cleanly.
                assert!(matches!(
                    CudaBackend::new(4096, Mode::Isolated),
                    Err(BackendError::Unavailable(_))
                ));
            }
        }
    }

    #[test]
    fn test_lcm() {
        assert_eq!(lcm(8, 0), 8);
        assert_eq!(lcm(8, 2), 8);
        assert_eq!(lcm(8, 6), 24);
        assert_eq!(lcm(0, 0), 0);
    }
}
