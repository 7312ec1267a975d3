//! Backends: what a "physical GPU" is to vgpud. A backend is split into
//! partitions, one per vGPU; a partition owns device memory within its
//! quota, loaded modules and a share of compute.
//!
//! This crate knows nothing of sockets, PCI or rings: the device model
//! decodes and validates guest commands and calls a [`Partition`] with
//! plain values. Guest memory reaches a backend only as [`HostSource`] /
//! [`HostSink`], so a backend never sees guest addresses.

#![warn(missing_docs)]

pub mod arrays;
#[cfg(any(test, feature = "test-utils"))]
pub mod conformance;
pub mod console;
pub mod contexts;
pub mod rules;
pub mod software;
pub mod vmm;

use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vgpu_abi as abi;

/// Why an operation failed; each maps to a completion status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// Malformed arguments (zero size, bad alignment, bad launch shape...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The partition's memory quota would be exceeded.
    #[error("out of device memory: {requested} bytes requested, {available} available")]
    NoMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes left in the quota.
        available: u64,
    },
    /// Not supported by this backend (e.g. a module format).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Unknown device address, module or entry point.
    #[error("not found: {0}")]
    NotFound(String),
    /// A device memory range is not inside one allocation.
    #[error("device range {addr:#x}+{len:#x} is outside every allocation")]
    OutOfRange {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// Reading or writing guest (host-side) memory failed.
    #[error("guest memory fault at offset {0:#x}")]
    Fault(u64),
    /// The device failed.
    #[error("device error: {0}")]
    Device(String),
    /// The partition lost its device state (a kernel fault on a GPU ends
    /// its context): every later command fails until a reset.
    #[error("device state lost: {0}")]
    Lost(String),
    /// A kernel's memory access faulted on the device (an illegal
    /// address). On a GPU, as with [`OpError::Lost`], the partition's
    /// device state is gone (which [`Partition::is_lost`] says); a context
    /// of `contexts::Contexts` ends with it on every backend.
    #[error("kernel memory fault: {0}")]
    KernelFault(String),
    /// A kernel's `assert()` failed. On a GPU the partition's device state
    /// is gone with it, which [`Partition::is_lost`] says.
    #[error("device-side assertion failed: {0}")]
    KernelAssert(String),
    /// The context the call is for lost its device state to an earlier
    /// fault; nothing ran. The partition's other contexts are unharmed.
    #[error("context lost: {0}")]
    ContextLost(String),
}

impl OpError {
    /// The `STATUS_*` code a completion carries.
    pub fn status(&self) -> u32 {
        match self {
            OpError::Invalid(_) => abi::STATUS_INVALID,
            OpError::NoMemory { .. } => abi::STATUS_NO_MEMORY,
            OpError::Unsupported(_) => abi::STATUS_UNSUPPORTED,
            OpError::NotFound(_) => abi::STATUS_NOT_FOUND,
            OpError::OutOfRange { .. } => abi::STATUS_OUT_OF_RANGE,
            OpError::Fault(_) => abi::STATUS_FAULT,
            OpError::Device(_) | OpError::Lost(_) => abi::STATUS_DEVICE_ERROR,
            OpError::KernelFault(_) => abi::STATUS_KERNEL_FAULT,
            OpError::KernelAssert(_) => abi::STATUS_KERNEL_ASSERT,
            OpError::ContextLost(_) => abi::STATUS_CONTEXT_LOST,
        }
    }

    /// Whether the partition may have lost its device state with this
    /// error (every later command fails until a reset): what a caller that
    /// cannot ask the partition assumes. A failed assertion loses it on a
    /// GPU; a partition that keeps it says so through
    /// [`Partition::is_lost`].
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            OpError::Lost(_) | OpError::KernelFault(_) | OpError::KernelAssert(_)
        )
    }
}

/// Errors creating backends or partitions.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The request does not fit what is left.
    #[error("partition does not fit: {0}")]
    DoesNotFit(String),
    /// The backend cannot start (no driver, no device).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// A piece of host memory that a [`HostSource`] or [`HostSink`] exposes
/// for direct device access. Valid only during the call that hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSlice {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// The [`HostMapping`] it lies in.
    pub mapping: u64,
}

/// What a backend does with the slices of a whole transfer: `Ok(true)`
/// when it moved the bytes itself, `Ok(false)` to decline (the transfer
/// then goes through `read_at` / `write_at`).
pub type SliceFn<'a> = dyn FnMut(&[HostSlice]) -> Result<bool, OpError> + 'a;

/// Host memory handed over as slices, in order, that stay mapped (and,
/// for a sink, writable) while this lives: a transfer's guest memory
/// under the lock that keeps it mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceMemory<'a> {
    slices: &'a [HostSlice],
    len: u64,
}

impl<'a> SliceMemory<'a> {
    /// The memory of `slices`.
    ///
    /// # Safety
    /// Every slice must be mapped and readable, and writable where the
    /// value is used as a [`HostSink`], for `'a`; no slice may overlap
    /// memory Rust code holds a reference to.
    pub unsafe fn new(slices: &'a [HostSlice]) -> SliceMemory<'a> {
        let len = slices.iter().map(|s| s.len as u64).sum();
        SliceMemory { slices, len }
    }

    /// The slices.
    pub fn slices(&self) -> &'a [HostSlice] {
        self.slices
    }

    /// Calls `f(ptr, done, n)` for each piece of the `len` bytes from
    /// `offset`; false when they are not all inside.
    fn each(&self, offset: u64, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) -> bool {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return false;
        }
        let mut skip = offset;
        let mut done = 0usize;
        for s in self.slices {
            if done == len {
                break;
            }
            if skip >= s.len as u64 {
                skip -= s.len as u64;
                continue;
            }
            let at = skip as usize;
            skip = 0;
            let n = (s.len - at).min(len - done);
            // SAFETY: `at + n` <= the slice's length, and the slice is
            // mapped for `'a` (see `new`).
            f(unsafe { s.ptr.add(at) }, done, n);
            done += n;
        }
        done == len
    }
}

impl HostSource for SliceMemory<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let dst = buf.as_mut_ptr();
        let ok = self.each(offset, buf.len(), |p, done, n| {
            // SAFETY: `p` holds `n` readable bytes (see `each`); `dst +
            // done` has room for them; the slices never overlap `buf`.
            unsafe { std::ptr::copy_nonoverlapping(p, dst.add(done), n) }
        });
        ok.then_some(()).ok_or(OpError::Fault(offset))
    }

    fn with_slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        f(self.slices)
    }
}

impl HostSink for SliceMemory<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        let src = buf.as_ptr();
        let ok = self.each(offset, buf.len(), |p, done, n| {
            // SAFETY: `p` holds `n` writable bytes (see `each` and `new`);
            // `src + done` holds them; the slices never overlap `buf`.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), p, n) }
        });
        ok.then_some(()).ok_or(OpError::Fault(offset))
    }

    fn with_slices_mut(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        f(self.slices)
    }
}

/// Bytes the backend reads from host-side memory (guest RAM or the
/// host-visible window), chunk by chunk, without knowing where they live.
pub trait HostSource {
    /// Total bytes.
    fn len(&self) -> u64;
    /// Whether there is nothing to read.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies bytes `[offset, offset + buf.len())` into `buf`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError>;
    /// Hands `f` the whole source as host slices, in order, if it lies in
    /// memory announced through [`HostMemory::mapped`]; the slices stay
    /// valid, and their memory mapped, until `f` returns, so `f` must
    /// finish any device copy from them before it returns. Returns what
    /// `f` returned, or `Ok(false)` without calling it (the default).
    fn with_slices(&self, _f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        Ok(false)
    }
}

/// Bytes in this process's own memory.
impl HostSource for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|off| self.get(off..off.checked_add(buf.len())?))
            .ok_or(OpError::Fault(offset))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// Bytes the backend writes to host-side memory.
pub trait HostSink {
    /// Total bytes.
    fn len(&self) -> u64;
    /// Whether there is no room.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf` to `[offset, offset + buf.len())`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError>;
    /// As [`HostSource::with_slices`], for writable memory.
    fn with_slices_mut(&self, _f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        Ok(false)
    }
}

/// Guest memory shared with this process by file and mapped here,
/// announced to a partition so that it can prepare the memory for direct
/// device access (pin and register it). The file and offset let a
/// partition served by another process map the same memory there.
#[derive(Debug, Clone)]
pub struct HostMapping {
    /// Identifies the mapping until [`HostMemory::unmapped`]; the
    /// [`HostSlice::mapping`] of slices inside it.
    pub id: u64,
    /// Address of its first byte in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// The device may read it.
    pub readable: bool,
    /// The device may write it.
    pub writable: bool,
    /// The file backing it.
    pub file: Arc<File>,
    /// Offset of its first byte in `file`.
    pub file_offset: u64,
}

/// A partition's registry of guest memory mapped into this process.
///
/// Its methods are called from the thread that serves the guest's VMM,
/// never while the caller holds the partition: they must not wait for the
/// partition's commands (a command may itself be waiting for that thread).
pub trait HostMemory: Send + Sync {
    /// Memory was mapped. Returns at once: whatever takes time (pinning
    /// gigabytes) happens in the background, and until it is done the
    /// memory is reached by copies as before.
    fn mapped(&self, mapping: HostMapping);
    /// The mapping is going away; its memory stays mapped until this
    /// returns, and no transfer uses it any more. Returns once nothing of
    /// the partition refers to it (it may wait for a registration under
    /// way).
    fn unmapped(&self, id: u64);
}

/// A kernel launch, validated for shape by the device model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch<'a> {
    /// Module handle ([`abi::MODULE_BUILTIN`] for the built-in one).
    pub module: u64,
    /// Entry point.
    pub entry: &'a str,
    /// Grid dimensions (each at least 1).
    pub grid: [u32; 3],
    /// Block dimensions (each at least 1).
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_mem: u32,
    /// Blocks per thread block cluster in each dimension ([1, 1, 1]: no
    /// clusters); they divide the grid's.
    pub cluster: [u32; 3],
    /// A cooperative launch (ABI 1.5): every block of the grid resident
    /// at once, so that the grid can synchronise. Only for a partition
    /// whose [`Partition::cooperative`] says so, with a grid of at most
    /// [`Partition::max_active_clusters`] blocks (checked by the caller).
    pub cooperative: bool,
    /// Parameter block.
    pub params: &'a [u8],
}

/// Most steps of one [`Partition::run_queued`] call.
pub const MAX_QUEUED_STEPS: usize = 64;

/// One step of device work queued in order (see [`Partition::run_queued`]),
/// whoever holds it: a partition runs [`Queued`] steps; the device model
/// decodes guest commands into steps whose guest memory is still named by
/// guest address, and the remote backend's protocol carries steps whose
/// memory is named by pieces of forwarded mappings. `L` is how a launch
/// is held, `M` how a copy's host memory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<L, M> {
    /// A kernel launch.
    Launch(L),
    /// A point whose device time is wanted (an event record).
    Timestamp,
    /// [`Partition::upload`] of host memory that stays mapped until the
    /// run returns.
    Upload {
        /// Device address.
        dst: u64,
        /// The bytes.
        src: M,
    },
    /// [`Partition::download`] into host memory that stays mapped until
    /// the run returns.
    Download {
        /// Device address.
        src: u64,
        /// Where the bytes go.
        dst: M,
    },
    /// [`Partition::fill`].
    Fill(DeviceFill),
    /// [`Partition::copy`].
    Copy(DeviceCopy),
}

/// A step as a partition runs it.
pub type Queued<'a> = Step<Launch<'a>, SliceMemory<'a>>;

impl<L, M> Step<L, M> {
    /// The step with its launch and host memory borrowed.
    pub fn as_ref(&self) -> Step<&L, &M> {
        match self {
            Step::Launch(l) => Step::Launch(l),
            Step::Timestamp => Step::Timestamp,
            Step::Upload { dst, src } => Step::Upload { dst: *dst, src },
            Step::Download { src, dst } => Step::Download { src: *src, dst },
            Step::Fill(f) => Step::Fill(*f),
            Step::Copy(c) => Step::Copy(*c),
        }
    }

    /// The step with its launch made by `launch` and its host memory by
    /// `memory` (given whether the copy goes to the device).
    pub fn map<L2, M2>(
        self,
        launch: impl FnOnce(L) -> L2,
        memory: impl FnOnce(M, bool) -> M2,
    ) -> Step<L2, M2> {
        match self {
            Step::Launch(l) => Step::Launch(launch(l)),
            Step::Timestamp => Step::Timestamp,
            Step::Upload { dst, src } => Step::Upload {
                dst,
                src: memory(src, true),
            },
            Step::Download { src, dst } => Step::Download {
                src,
                dst: memory(dst, false),
            },
            Step::Fill(f) => Step::Fill(f),
            Step::Copy(c) => Step::Copy(c),
        }
    }

    /// A copy's host memory and whether it goes to the device; `None`
    /// for the other steps.
    pub fn host_memory(&self) -> Option<(&M, bool)> {
        match self {
            Step::Upload { src, .. } => Some((src, true)),
            Step::Download { dst, .. } => Some((dst, false)),
            _ => None,
        }
    }
}

/// A fill of device memory with a 32-bit pattern ([`Partition::fill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFill {
    /// Device address.
    pub addr: u64,
    /// Bytes, a multiple of 4.
    pub size: u64,
    /// The pattern.
    pub pattern: u32,
}

/// A copy between device addresses, which may overlap
/// ([`Partition::copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCopy {
    /// Destination.
    pub dst: u64,
    /// Source.
    pub src: u64,
    /// Bytes.
    pub size: u64,
}

/// What one queued step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedDone {
    /// Its result.
    pub result: Result<(), OpError>,
    /// When it completed, in nanoseconds of device time after the run
    /// began; never before the previous step's.
    pub end_ns: u64,
}

impl QueuedDone {
    /// The results of a run of `n` steps that failed as a whole with `e`.
    pub fn all_failed(n: usize, e: &OpError) -> Vec<QueuedDone> {
        (0..n)
            .map(|_| QueuedDone {
                result: Err(e.clone()),
                end_ns: 0,
            })
            .collect()
    }
}

/// What [`Partition::start_queued`] did with a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// It ran the steps to completion: their results.
    Done(Vec<QueuedDone>),
    /// The steps are in flight: [`Partition::finish_queued`] gives their
    /// results, in the order runs were started.
    InFlight,
}

/// What [`Partition::finish_queued_within`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finishing {
    /// A run of this lane finished: its results.
    Done(usize, Finished),
    /// Runs are in flight; none finished within the time.
    Pending,
    /// No run is in flight (or the partition lost them).
    Idle,
}

/// The results of a run that was in flight ([`Partition::finish_queued`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// How long the run waited, once started, for the runs before it:
    /// it began this long after [`Partition::start_queued`] returned,
    /// and its steps' `end_ns` count from then.
    pub waited_ns: u64,
    /// One result per step, as [`Partition::run_queued`] gives them.
    pub done: Vec<QueuedDone>,
}

/// [`Partition::run_queued`] one step after the other, each by `run`,
/// timed by the host's clock: for partitions whose work completes when
/// `run` returns. A step is refused without `run` once `stop` says so.
pub fn run_steps_in_order(
    steps: &[Queued<'_>],
    stop: &dyn Fn() -> bool,
    mut run: impl FnMut(&Queued<'_>) -> Result<(), OpError>,
) -> Vec<QueuedDone> {
    let start = std::time::Instant::now();
    let mut done: Vec<QueuedDone> = steps
        .iter()
        .take(MAX_QUEUED_STEPS)
        .map(|s| {
            let result = match s {
                _ if stop() => Err(OpError::Device("the run was abandoned".into())),
                Queued::Timestamp => Ok(()),
                s => run(s),
            };
            QueuedDone {
                result,
                end_ns: start.elapsed().as_nanos() as u64,
            }
        })
        .collect();
    refuse_past_limit(&mut done, steps.len());
    done
}

/// [`Partition::run_queued`] one step after the other with the
/// partition's own synchronous calls ([`run_steps_in_order`]): for a
/// wrapper whose `launch`, `copy` and `fill` are its own. One that keeps
/// their defaults, which run a queued run, must not use it.
pub fn run_queued_in_order<P: Partition + ?Sized>(
    p: &mut P,
    steps: &[Queued<'_>],
    stop: &dyn Fn() -> bool,
) -> Vec<QueuedDone> {
    run_steps_in_order(steps, stop, |s| match s {
        Queued::Launch(l) => p.launch(l),
        Queued::Timestamp => Ok(()),
        Queued::Upload { dst, src } => p.upload(*dst, src),
        Queued::Download { src, dst } => p.download(*src, dst),
        Queued::Fill(f) => p.fill(f.addr, f.size, f.pattern),
        Queued::Copy(c) => p.copy(c.dst, c.src, c.size),
    })
}

/// Runs `step` alone as a queued run of `p`: what the immediate
/// operations of [`Partition`] are by default.
fn run_one<P: Partition + ?Sized>(p: &mut P, step: Queued<'_>) -> Result<(), OpError> {
    p.run_queued(std::slice::from_ref(&step), &|| false)
        .pop()
        .map_or_else(
            || Err(OpError::Device("missing step result".into())),
            |d| d.result,
        )
}

/// Completes `done`, the results of the first [`MAX_QUEUED_STEPS`] of
/// `count` steps, with a refusal for each step past the limit.
pub fn refuse_past_limit(done: &mut Vec<QueuedDone>, count: usize) {
    let end_ns = done.last().map_or(0, |d| d.end_ns);
    let past = count.saturating_sub(done.len());
    done.extend((0..past).map(|_| QueuedDone {
        result: Err(OpError::Invalid(format!(
            "more than {MAX_QUEUED_STEPS} queued steps"
        ))),
        end_ns,
    }));
}

/// A kernel of a loaded module as its backend describes it: what
/// FUNC_INFO reports to the guest, whose CUDA library packs launch
/// parameters by it instead of guessing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionInfo {
    /// Attributes; `param_count` and `params_size` agree with `params`.
    pub attrs: abi::FuncInfo,
    /// Parameters in order.
    pub params: Vec<abi::FuncParam>,
}

impl FunctionInfo {
    /// Info for `params` (offset, size) in order; fills in the count and
    /// the size of the parameter block.
    pub fn new(params: impl IntoIterator<Item = (u32, u32)>, attrs: abi::FuncInfo) -> Self {
        let params: Vec<abi::FuncParam> = params
            .into_iter()
            .map(|(offset, size)| abi::FuncParam { offset, size })
            .collect();
        let end = params
            .iter()
            .map(|p| p.offset.saturating_add(p.size))
            .max()
            .unwrap_or(0);
        FunctionInfo {
            attrs: abi::FuncInfo {
                param_count: params.len() as u32,
                params_size: end,
                ..attrs
            },
            params,
        }
    }
}

/// What a partition is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec {
    /// Name for logs.
    pub name: String,
    /// Device memory quota, bytes.
    pub memory: u64,
    /// Compute units (software: worker threads; CUDA: SMs).
    pub compute_units: u32,
}

/// Totals of a backend, for placing partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Device memory, bytes.
    pub memory: u64,
    /// Compute units.
    pub compute_units: u32,
}

impl Capacity {
    /// Takes `spec`'s memory and compute units out of what is left, or
    /// takes nothing and says what is short.
    pub fn reserve(&mut self, spec: &PartitionSpec) -> Result<(), String> {
        let mut short = Vec::new();
        if spec.memory > self.memory {
            short.push(format!(
                "{} bytes of memory requested, {} left",
                spec.memory, self.memory
            ));
        }
        if spec.compute_units > self.compute_units {
            short.push(format!(
                "{} compute units requested, {} left",
                spec.compute_units, self.compute_units
            ));
        }
        if !short.is_empty() {
            return Err(format!("partition {:?}: {}", spec.name, short.join("; ")));
        }
        self.memory -= spec.memory;
        self.compute_units -= spec.compute_units;
        Ok(())
    }

    /// Gives back what [`Capacity::reserve`] took for `spec`.
    pub fn release(&mut self, spec: &PartitionSpec) {
        self.memory = self.memory.saturating_add(spec.memory);
        self.compute_units = self.compute_units.saturating_add(spec.compute_units);
    }
}

/// What [`Partition::contexts`] says of a partition's contexts besides
/// context 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextCounts {
    /// Contexts now (lost ones until they are ended).
    pub now: u32,
    /// Most at once.
    pub max: u32,
    /// Contexts made with a new partition from the backend.
    pub started: u64,
    /// Time those took, in all, ns.
    pub start_ns: u64,
    /// Contexts made with the partition of one that had ended.
    pub reused: u64,
    /// Device memory each context holds of its own while it lives.
    pub cost: u64,
    /// What the live contexts hold of their own now, bytes (in the
    /// partition's memory in use).
    pub memory: u64,
}

/// A physical GPU.
pub trait Backend: Send + Sync {
    /// Short name ("software", "cuda").
    fn name(&self) -> &str;
    /// Total memory and compute.
    fn capacity(&self) -> Capacity;
    /// Carves out a partition.
    fn create_partition(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError>;
    /// Whether [`Backend::create_context`] makes contexts that contain
    /// a kernel's fault (not where partitions share one GPU context).
    fn has_contexts(&self) -> bool {
        false
    }
    /// Another context of a partition made with `spec`: a partition of
    /// its own (its own memory, modules and faults; on a GPU a context of
    /// its own) that takes nothing more from the backend's capacity,
    /// since `contexts::Contexts` holds the contexts of one partition
    /// to its quota together.
    fn create_context(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        let _ = spec;
        Err(BackendError::Unavailable(format!(
            "the {} backend has no contexts",
            self.name()
        )))
    }
}

/// A partition as its owner and the device working on it share it: one
/// lock serialises every call. The owner keeps the partition (its
/// reservation on the GPU) across the devices it serves in turn.
#[derive(Clone)]
pub struct SharedPartition(Arc<Mutex<Box<dyn Partition>>>);

impl SharedPartition {
    /// Shares `partition`.
    pub fn new(partition: Box<dyn Partition>) -> Self {
        SharedPartition(Arc::new(Mutex::new(partition)))
    }

    /// The partition, locked; a call that panicked left it consistent
    /// (partition calls leave it so between calls), so a poisoned lock
    /// is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Partition>> {
        vgpu_sys::lock(&self.0)
    }

    /// The partition, if no one holds it now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Box<dyn Partition>>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl From<Box<dyn Partition>> for SharedPartition {
    fn from(partition: Box<dyn Partition>) -> Self {
        SharedPartition::new(partition)
    }
}

impl std::fmt::Debug for SharedPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPartition").finish_non_exhaustive()
    }
}

/// A vGPU's share of a physical GPU. Calls are serialised by the caller
/// (see [`SharedPartition`]).
pub trait Partition: Send {
    /// The spec it was created with.
    fn spec(&self) -> &PartitionSpec;
    /// Compute units a kernel of this partition runs on, which is what
    /// the guest is told it has: the spec's own where the partition owns
    /// them (a software partition's threads, an SM group), the whole
    /// device's where partitions take turns on all of it. Programs size
    /// persistent grids by it, so a smaller figure leaves the rest of the
    /// device idle during the partition's turn. No default: a wrapper
    /// that forgot to forward it would report its spec.
    fn kernel_compute_units(&self) -> u32;
    /// Allocates `size` bytes aligned to `align` (a power of two); returns
    /// the device address.
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError>;
    /// Frees the allocation starting at `addr`.
    fn free(&mut self, addr: u64) -> Result<(), OpError>;
    /// Copies `src.len()` bytes from host-side memory to device memory at `dst`.
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError>;
    /// Copies `dst.len()` bytes from device memory at `src` to host-side memory.
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError>;
    /// Copies `size` bytes between two device ranges (may be different
    /// allocations): a run of one [`Queued::Copy`].
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        run_one(self, Queued::Copy(DeviceCopy { dst, src, size }))
    }
    /// Fills `size` bytes (a multiple of 4) at `addr` with `pattern`: a
    /// run of one [`Queued::Fill`].
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        run_one(
            self,
            Queued::Fill(DeviceFill {
                addr,
                size,
                pattern,
            }),
        )
    }
    /// Loads a module image; returns its handle.
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError>;
    /// Unloads a module.
    fn module_unload(&mut self, module: u64) -> Result<(), OpError>;
    /// Runs a kernel to completion: a run of one [`Queued::Launch`].
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        run_one(self, Queued::Launch(launch.clone()))
    }
    /// Runs `steps` (at most [`MAX_QUEUED_STEPS`]) in order and waits for
    /// the last; returns one result per step. `stop` says the run was
    /// abandoned (its function is being reset, its queue changed): a
    /// partition that runs the steps one by one asks it before each and
    /// refuses the rest once it says so, so a reset does not wait for a
    /// run's worth of work; one that has them in flight may ignore it. A device may keep the steps
    /// in flight together and time them with its own clock, so a
    /// timestamp between two launches says when the device got there. A
    /// step that fails leaves the later ones to run, unless the
    /// partition's device state is lost. Copies' host memory may be used
    /// until this returns, and no longer: every copy is done by then. No
    /// default: it is the partition's one way to run device work (the
    /// immediate `copy`, `fill` and `launch` run through it).
    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone>;
    /// How many queued runs may be in flight at once on each lane
    /// ([`Partition::start_queued`]); 1 for a partition that runs each to
    /// completion. A wrapper forwards this, `lanes`, `start_queued` and
    /// `finish_queued` together, or none of them.
    fn queue_depth(&self) -> usize {
        1
    }
    /// How many lanes the partition has: ordered streams of queued runs
    /// that go to the device side by side (a stream each on a GPU), so
    /// that a run of one lane may overlap, and finish before, a run of
    /// another. Runs of one lane run and finish in the order started.
    fn lanes(&self) -> usize {
        1
    }
    /// Starts `steps` on `lane` (below [`Partition::lanes`]) as
    /// [`Partition::run_queued`] would, returning once they are in flight
    /// if the partition can keep them so. `held`: the caller keeps the
    /// copies' host memory mapped until the run is finished; if not, it
    /// may go once this returns, and a partition that would copy straight
    /// from or to it later runs such a run to completion here (one that
    /// maps the memory itself need not). Called only while fewer than
    /// [`Partition::queue_depth`] runs are in flight on `lane`, and
    /// nothing else but `memory_used` and `is_lost` is called on the
    /// partition until every run in flight is finished.
    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        held: bool,
    ) -> Started {
        let _ = (lane, held);
        Started::Done(self.run_queued(steps, stop))
    }
    /// Waits until a run in flight is finished: the oldest of its lane,
    /// whichever lane's is done first. Returns the lane and the run's
    /// results; `None` when no run is in flight (or the partition lost
    /// them: each of their steps failed).
    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        None
    }
    /// [`Partition::finish_queued`], waiting about `within` at most, so
    /// that the caller can look at other work meanwhile. The default
    /// waits as long as it takes (for partitions whose runs finish when
    /// they are started, at once).
    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        let _ = within;
        match self.finish_queued() {
            Some((lane, f)) => Finishing::Done(lane, f),
            None => Finishing::Idle,
        }
    }
    /// How many thread block clusters of `launch`'s shape (its block,
    /// dynamic shared memory and cluster; grid and parameters unused) of
    /// its kernel can be resident on the device at once, as the backend's
    /// driver counts them; 0 when none fits. No default: a wrapper that
    /// forgot to forward it would answer for the wrong device.
    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError>;
    /// Whether the partition runs cooperative launches
    /// ([`Launch::cooperative`]). A wrapper forwards it; one that forgot
    /// hides the feature rather than claiming it.
    fn cooperative(&self) -> bool {
        false
    }
    /// Describes entry point `entry` of `module` (parameter layout and
    /// attributes), as the backend's driver knows it.
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError>;

    /// Whether the partition has CUDA arrays and texture and surface
    /// objects (FEATURES bit 11): [`Partition::resource`] serves them.
    fn arrays(&self) -> bool {
        false
    }

    /// An array, texture or surface request (ABI 1.6); the result is the
    /// handle an ARRAY_CREATE or OBJECT_CREATE made, else 0. The
    /// partition's objects are its own, freed by a reset and counted
    /// against its quota.
    fn resource(&mut self, req: &arrays::Resource) -> Result<u64, OpError> {
        let _ = req;
        Err(OpError::Unsupported(
            "CUDA arrays, textures and surfaces".into(),
        ))
    }
    /// The device address and size of global variable `name` of
    /// `module`, made one of the partition's allocations (copies and
    /// fills reach it, [`Partition::free`] refuses it) until the module is
    /// unloaded.
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError>;
    /// Device memory in use, bytes.
    fn memory_used(&self) -> u64;
    /// Changes the memory quota to `memory` bytes while the partition
    /// lives (a live resize; [`Partition::spec`] says the new figure).
    /// Growing takes the difference from what the backend has not given
    /// out ([`OpError::NoMemory`] when it has not got it), shrinking gives
    /// it back; a quota below what the partition holds is refused
    /// ([`OpError::Invalid`]). Either way a refusal changes nothing. May
    /// be called while runs are in flight (as `memory_used` may). No
    /// default: a wrapper that forgot to forward it would let its inner
    /// partition enforce the old quota.
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError>;
    /// Frees the partition's device memory for others, keeping what it
    /// holds (allocations at their addresses with their contents,
    /// modules, arrays, mappings) in host memory, and gives its quota
    /// back to the backend; returns the bytes moved out. Called only with
    /// no run in flight; until [`Partition::resume`], nothing but
    /// `memory_used`, `is_lost`, `set_memory`, `reset` (which keeps it
    /// suspended, holding nothing) and `resume` is called. A refusal
    /// changes nothing. No default: a wrapper that forgot to forward it
    /// would leave its inner partition on the device.
    fn suspend(&mut self) -> Result<u64, OpError>;
    /// Takes the quota from the backend again and puts back what
    /// [`Partition::suspend`] moved out, at the same device addresses;
    /// returns the bytes moved in. [`OpError::NoMemory`] when the backend
    /// has not got the quota free: the partition stays suspended and
    /// nothing changes. Resuming one that is not suspended does nothing.
    fn resume(&mut self) -> Result<u64, OpError>;
    /// Takes up to `max` bytes of what the kernels of `module` printed,
    /// oldest first (see [`console::Consoles`]). A backend whose kernels
    /// cannot print answers nothing. No default: a wrapper that forgot
    /// to forward it would lose the output.
    fn console(&mut self, module: u64, max: usize) -> Result<console::ConsoleText, OpError>;
    /// Frees all memory and modules: the partition is as new.
    fn reset(&mut self);
    /// Whether the partition lost its device state ([`OpError::Lost`])
    /// and fails everything until [`Partition::reset`]. No default: a
    /// wrapper that forgot to forward it would hide the loss.
    fn is_lost(&self) -> bool;
    /// How often an idle function asks [`Partition::is_lost`], for a
    /// partition that can lose its state without a call (one of a shared
    /// host, which another partition's fault ends), so that its guest
    /// hears of it before its next command; `None`: never.
    fn watch_interval(&self) -> Option<std::time::Duration> {
        None
    }
    /// The registry to which guest memory mapped into this process is
    /// announced, if the partition can use such memory directly. Asked
    /// once, when the partition is put to use; the handle is used without
    /// the partition (see [`HostMemory`]).
    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        None
    }
    /// Makes `ctx` the context the following calls are for (ABI 1.5:
    /// context 0 is the partition's own, the others are made on first
    /// use, see `contexts::Contexts`). Called only while no run is in
    /// flight, unless `ctx` is already the current one. A partition
    /// without contexts has context 0 alone.
    fn set_context(&mut self, ctx: u32) -> Result<(), OpError> {
        if ctx == 0 {
            Ok(())
        } else {
            Err(OpError::Unsupported("contexts".into()))
        }
    }
    /// Ends context `ctx` (not 0): frees everything it holds. Returns the
    /// handles of the modules that went with it (the caller forgets
    /// their functions). Ending a context that does not exist succeeds.
    fn end_context(&mut self, ctx: u32) -> Result<Vec<u64>, OpError> {
        let _ = ctx;
        Err(OpError::Unsupported("contexts".into()))
    }
    /// Its contexts besides context 0; `None` without contexts.
    fn contexts(&self) -> Option<ContextCounts> {
        None
    }
    /// Whether the partition offers virtual memory management (ABI 1.6,
    /// [`Partition::vmm`]). A wrapper forwards it; one that forgot hides
    /// the feature rather than claiming it.
    fn has_vmm(&self) -> bool {
        false
    }
    /// Runs a virtual memory request (see [`vmm`]): a reservation's
    /// address, a physical allocation's handle, else 0. Physical
    /// allocations count in [`Partition::memory_used`]; mapped ranges
    /// with access are reached by copies, fills and kernels as
    /// allocations are. Everything goes with [`Partition::reset`] and
    /// the context's end.
    fn vmm(&mut self, op: &vmm::VmmOp) -> Result<u64, OpError> {
        let _ = op;
        Err(OpError::Unsupported("virtual memory management".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::software::SoftwareBackend;

    /// A registry that only says it exists.
    struct NoteMemory;
    impl HostMemory for NoteMemory {
        fn mapped(&self, _: HostMapping) {}
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
        fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
            self.0.module_load(format, image)
        }
        fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
            self.0.module_unload(module)
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
        fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
            self.0.set_memory(memory)
        }
        fn suspend(&mut self) -> Result<u64, OpError> {
            self.0.suspend()
        }
        fn resume(&mut self) -> Result<u64, OpError> {
            self.0.resume()
        }
        fn console(&mut self, module: u64, max: usize) -> Result<console::ConsoleText, OpError> {
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
        let plain = SharedPartition::new(inner);
        assert!(plain.lock().host_memory().is_none());
        let inner = SoftwareBackend::new(1 << 20, 1)
            .create_partition(&spec)
            .unwrap();
        let shared = SharedPartition::new(Box::new(WithRegistry(inner)));
        assert!(shared.lock().host_memory().is_some());
    }

    #[test]
    fn test_reserve_takes_all_or_nothing_and_release_gives_back() {
        let mut pool = Capacity {
            memory: 100,
            compute_units: 2,
        };
        let spec = |memory, compute_units| PartitionSpec {
            name: "p".into(),
            memory,
            compute_units,
        };
        pool.reserve(&spec(60, 1)).unwrap();
        let why = pool.reserve(&spec(60, 2)).unwrap_err();
        assert!(
            why.contains("60 bytes of memory requested, 40 left"),
            "{why}"
        );
        assert!(why.contains("2 compute units requested, 1 left"), "{why}");
        assert_eq!((pool.memory, pool.compute_units), (40, 1));
        pool.release(&spec(60, 1));
        assert_eq!((pool.memory, pool.compute_units), (100, 2));
    }
}
