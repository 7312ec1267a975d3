//! The `software` backend: a "physical GPU" made of host memory and worker
//! threads. It runs everywhere and is the default.
//!
//! The backend's device memory is a pool of a configured size that
//! partitions claim quotas from; host memory is only allocated when a
//! partition allocates device memory, one zeroed host buffer per
//! allocation. Compute units are worker threads: a kernel is split over
//! at most the partition's `compute_units` threads.
//!
//! Each partition has its own device address space (an
//! [`AddressSpace`]) and its own table of allocations, so an address is
//! meaningful only in the partition that allocated it. Allocations are
//! separated by at least [`GUARD_GAP`](crate::rules::GUARD_GAP) unmapped
//! bytes, and every device range must lie inside one allocation, so
//! running off the end of a buffer is reported instead of landing in a
//! neighbour. The rules are [`crate::rules`]'s, as for every backend.
//!
//! The built-in module's kernels derive their work split from their
//! parameters, not from the launch grid. Modules a guest loads (PTX, or
//! the PTX of a fatbinary) run on the PTX executor of `vgpu-ptx`: grids
//! of blocks spread over the partition's worker threads, every global
//! access checked against the partition's allocations, a kernel that
//! runs longer than the kernel watchdog stopped ([`ptx`]).

use std::cell::{Ref, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use log::{debug, info, warn};
use vgpu_abi as abi;

use crate::arrays::{ArrayCopy, ArrayDesc, CopySide, ObjectDesc, Resource};
use crate::console::{ConsoleText, Consoles};

mod buf;
mod kernels;
mod ptx;
#[cfg(test)]
mod tests;

pub use buf::DeviceBuf;
use kernels::{fill_pattern, get, par_chunks, run_parallel, saxpy, scale, sgemm_rows, vadd};
pub use ptx::DEFAULT_KERNEL_TIMEOUT;

use crate::rules::{
    self, words, AddressSpace, Allocations, Builtin, FloatOperands, KernelLimits, Loc,
    PartitionName,
};
use crate::vmm::{Vmm, VmmOp};
use crate::{
    Backend, BackendError, Capacity, DeviceCopy, DeviceFill, FunctionInfo, HostSink, HostSource,
    Launch, OpError, Partition, PartitionSpec, Queued, QueuedDone,
};

/// Fewest elements of work worth a thread of its own.
const DEFAULT_GRAIN: u64 = 1 << 16;

/// What no partition has claimed yet.
/// What is left to give to partitions.
type Pool = Capacity;

use vgpu_sys::{lock, warn_limited};

/// A physical GPU made of host memory and threads.
#[derive(Debug)]
pub struct SoftwareBackend {
    capacity: Capacity,
    pool: Arc<Mutex<Pool>>,
    kernel_timeout: Duration,
    /// Set by any partition's kernel fault when the partitions share one
    /// fate (see [`SoftwareBackend::with_shared_fate`]).
    fate: Option<Arc<AtomicBool>>,
}

impl SoftwareBackend {
    /// A backend of `memory` bytes of device memory and `compute_units`
    /// worker threads, all unclaimed.
    pub fn new(memory: u64, compute_units: u32) -> SoftwareBackend {
        info!("software backend: {memory} bytes of device memory, {compute_units} compute units");
        SoftwareBackend {
            capacity: Capacity {
                memory,
                compute_units,
            },
            pool: Arc::new(Mutex::new(Pool {
                memory,
                compute_units,
            })),
            kernel_timeout: DEFAULT_KERNEL_TIMEOUT,
            fate: None,
        }
    }

    /// Makes the partitions share one fate, as the partitions of one
    /// process on a GPU do (green contexts of one primary context): a
    /// kernel fault or failed assertion in any of them loses every one
    /// ([`Partition::is_lost`]). What tests of a spatial GPU's recovery
    /// run without a GPU.
    pub fn with_shared_fate(mut self) -> SoftwareBackend {
        self.fate = Some(Arc::default());
        self
    }

    /// Whether a kernel fault lost the partitions' shared fate.
    pub fn lost(&self) -> bool {
        self.fate
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Acquire))
    }

    /// Stops a loaded kernel that runs longer than `timeout` (a device
    /// error for its launch; [`DEFAULT_KERNEL_TIMEOUT`] unless set).
    pub fn with_kernel_timeout(mut self, timeout: Duration) -> SoftwareBackend {
        self.kernel_timeout = timeout;
        self
    }

    /// Memory and compute that no partition holds.
    pub fn unclaimed(&self) -> Capacity {
        let pool = lock(&self.pool);
        Capacity {
            memory: pool.memory,
            compute_units: pool.compute_units,
        }
    }

    // Partitions are made by the host's configuration, not by a guest.
    #[allow(clippy::disallowed_macros)]
    fn create(&self, spec: &PartitionSpec) -> Result<SoftwarePartition, BackendError> {
        let mut pool = lock(&self.pool);
        if let Err(why) = pool.reserve(spec) {
            warn!("software backend: {why}");
            return Err(BackendError::DoesNotFit(why));
        }
        info!(
            "software backend: partition {:?} created ({} bytes, {} compute units); {} bytes and {} compute units left",
            spec.name, spec.memory, spec.compute_units, pool.memory, pool.compute_units
        );
        drop(pool);
        Ok(self.partition(spec, true))
    }

    /// A partition of `spec`; `reserved`: it holds its reservation of the
    /// pool (else it is another context of a partition that does).
    fn partition(&self, spec: &PartitionSpec, reserved: bool) -> SoftwarePartition {
        SoftwarePartition {
            spec: spec.clone(),
            reserved,
            suspended: false,
            pool: Arc::clone(&self.pool),
            allocs: Allocations::default(),
            vmm: Vmm::default(),
            space: AddressSpace::default(),
            grain: DEFAULT_GRAIN,
            modules: BTreeMap::new(),
            module_vars: BTreeMap::new(),
            next_module: FIRST_MODULE,
            kernel_timeout: self.kernel_timeout,
            consoles: Consoles::default(),
            fate: self.fate.clone(),
            arrays: BTreeMap::new(),
            objects: BTreeMap::new(),
        }
    }
}

impl Backend for SoftwareBackend {
    fn name(&self) -> &str {
        "software"
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn create_partition(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        Ok(Box::new(self.create(spec)?))
    }

    fn has_contexts(&self) -> bool {
        true
    }

    fn create_context(&self, spec: &PartitionSpec) -> Result<Box<dyn Partition>, BackendError> {
        // Host memory of its own: a kernel's fault is this context's
        // alone.
        Ok(Box::new(self.partition(spec, false)))
    }
}

/// A partition of a [`SoftwareBackend`]: a memory quota, an address space
/// of its own and a number of worker threads.
pub struct SoftwarePartition {
    spec: PartitionSpec,
    /// It holds `spec`'s reservation of the pool (a context made by
    /// `create_context` shares its partition's).
    reserved: bool,
    /// Suspended: its reservation's memory is back in the pool (its
    /// compute units stay taken); what it holds stays in host memory,
    /// which is where a software partition keeps it anyway.
    suspended: bool,
    pool: Arc<Mutex<Pool>>,
    /// Allocations by device address. The cells let a kernel write one
    /// allocation while reading others; calls never overlap (`&mut self`).
    allocs: Allocations<RefCell<DeviceBuf>>,
    /// Virtual memory: reservations, physical allocations (host memory
    /// of their own) and mappings. A mapping given access is also an
    /// entry of `allocs` (charging nothing) whose buffer is a view of its
    /// physical allocation's memory, so copies, fills and kernels reach
    /// it as any allocation, and every mapping of the same memory sees
    /// the same bytes.
    vmm: Vmm<DeviceBuf>,
    /// The partition's address space.
    space: AddressSpace,
    /// Fewest elements of work per thread.
    grain: u64,
    /// Modules the guest loaded, by handle.
    modules: BTreeMap<u64, Arc<vgpu_ptx::Module>>,
    /// Where each loaded module's `.global` and `.const` variables live:
    /// one allocation of the partition per module that has any (address
    /// and size), freed with the module.
    module_vars: BTreeMap<u64, (u64, u64)>,
    /// The handle the next module gets.
    next_module: u64,
    /// Longest a loaded kernel may run.
    kernel_timeout: Duration,
    /// What loaded kernels printed.
    consoles: Consoles,
    /// The backend's shared fate, when its partitions share one.
    fate: Option<Arc<AtomicBool>>,
    /// CUDA arrays by handle: each is an allocation (its address is the
    /// handle) holding the elements row by row, slice by slice.
    arrays: BTreeMap<u64, ArrayDesc>,
    /// Texture (false) and surface (true) objects by handle: each is an
    /// allocation holding the descriptor the PTX executor reads
    /// (`vgpu_ptx::texture`), whose address kernels use as the handle.
    objects: BTreeMap<u64, bool>,
}

/// Handles of loaded modules start here (0 is the built-in module).
const FIRST_MODULE: u64 = 1;

impl Drop for SoftwarePartition {
    fn drop(&mut self) {
        if !self.reserved {
            return;
        }
        let held = PartitionSpec {
            memory: if self.suspended { 0 } else { self.spec.memory },
            ..self.spec.clone()
        };
        lock(&self.pool).release(&held);
        info!(
            "software backend: partition {:?} released ({} bytes, {} compute units)",
            self.spec.name, self.spec.memory, self.spec.compute_units
        );
    }
}

impl SoftwarePartition {
    fn available(&self) -> u64 {
        self.spec
            .memory
            .saturating_sub(self.allocs.used() + self.vmm.physical_bytes())
    }

    /// Makes what the partition holds of the pool `bytes` (its quota
    /// while resident, 0 while suspended), where it holds a reservation.
    fn held_quota(&self, bytes: u64) -> Result<(), OpError> {
        if !self.reserved {
            return Ok(());
        }
        let held = if self.suspended { 0 } else { self.spec.memory };
        rules::requota(Some(&mut lock(&self.pool).memory), 0, held, bytes)
    }

    fn threads(&self) -> usize {
        self.spec.compute_units.max(1) as usize
    }

    /// Threads worth using for `work` elements.
    fn threads_for(&self, work: u64) -> usize {
        let by_work = (work / self.grain.max(1)).max(1);
        by_work.min(self.threads() as u64) as usize
    }

    fn no_host_memory(&self, requested: u64) -> OpError {
        warn_limited!(
            "software backend: partition {:?}: host memory exhausted allocating {requested} bytes",
            self.spec.name
        );
        OpError::NoMemory {
            requested,
            available: self.available(),
        }
    }

    /// Resolves `len` bytes at `addr`, which must lie inside one allocation.
    fn locate(&self, addr: u64, len: u64) -> Result<Loc, OpError> {
        self.allocs.locate(addr, len)
    }

    /// Resolves `len` bytes at `addr` that are to be written: inside one
    /// allocation, not a mapping given read access alone.
    fn locate_mut(&self, addr: u64, len: u64) -> Result<Loc, OpError> {
        let loc = self.allocs.locate(addr, len)?;
        if self.buf(&loc).borrow().read_only() {
            return Err(OpError::OutOfRange { addr, len });
        }
        Ok(loc)
    }

    /// Whether the bytes of `a`'s and `b`'s allocations, different ones,
    /// are the same memory (two mappings of one physical allocation).
    fn aliases(&self, a: &Loc, b: &Loc) -> bool {
        if a.start == b.start {
            return false;
        }
        let ra = self.buf(a).borrow().host_range();
        let rb = self.buf(b).borrow().host_range();
        ra.start < rb.end && rb.start < ra.end
    }

    /// The bytes of the allocation `loc` lies in.
    fn buf(&self, loc: &Loc) -> &RefCell<DeviceBuf> {
        self.allocs.data(loc.start)
    }

    /// A copy of `loc`'s bytes, or NoMemory if the host has no room.
    fn copy_out(&self, loc: &Loc) -> Result<Vec<u8>, OpError> {
        let buf = self.buf(loc).borrow();
        let mut v = Vec::new();
        v.try_reserve_exact(loc.len)
            .map_err(|_| self.no_host_memory(loc.len as u64))?;
        v.extend_from_slice(&buf[loc.range()]);
        Ok(v)
    }

    /// The bytes of `loc` as floats, or NoMemory if the host has no room.
    fn floats(&self, loc: &Loc) -> Result<Vec<f32>, OpError> {
        let buf = self.buf(loc).borrow();
        let mut v = Vec::new();
        v.try_reserve_exact(loc.len / 4)
            .map_err(|_| self.no_host_memory(loc.len as u64))?;
        v.extend(buf[loc.range()].chunks_exact(4).map(get));
        Ok(v)
    }

    /// Calls `f` with the bytes of `out`, writable, and of each input.
    /// An input that is exactly the output range is passed as `None` (read
    /// it from the output); one that partly overlaps the output is copied
    /// first, so every input reads as it was before the kernel started.
    fn with_io<const N: usize, R>(
        &self,
        out: Loc,
        ins: [Loc; N],
        f: impl FnOnce(&mut [u8], [Option<&[u8]>; N]) -> R,
    ) -> Result<R, OpError> {
        let same = |l: &Loc| l.off == out.off && l.len == out.len;
        let mut copies: [Option<Vec<u8>>; N] = std::array::from_fn(|_| None);
        for (copy, inp) in copies.iter_mut().zip(&ins) {
            // Another mapping of the output's memory is read before the
            // output is written, as a partial overlap is.
            if (inp.start == out.start && inp.overlaps(&out) && !same(inp))
                || self.aliases(inp, &out)
            {
                *copy = Some(self.copy_out(inp)?);
            }
        }
        let others: [Option<Ref<'_, DeviceBuf>>; N] = std::array::from_fn(|i| {
            (ins[i].start != out.start && copies[i].is_none())
                .then(|| self.allocs.data(ins[i].start).borrow())
        });
        let mut out_buf = self.buf(&out).borrow_mut();
        let (lo, rest) = out_buf.split_at_mut(out.off);
        let (dst, hi) = rest.split_at_mut(out.len);
        let (lo, hi): (&[u8], &[u8]) = (lo, hi);
        let srcs = std::array::from_fn(|i| {
            let inp = &ins[i];
            if let Some(c) = &copies[i] {
                Some(c.as_slice())
            } else if let Some(buf) = &others[i] {
                Some(&buf[inp.range()])
            } else if same(inp) {
                None
            } else if inp.off + inp.len <= out.off {
                Some(&lo[inp.range()])
            } else {
                let s = inp.off - out.off - out.len;
                Some(&hi[s..s + inp.len])
            }
        });
        Ok(f(dst, srcs))
    }

    fn fill_bytes(&self, out: Loc, pattern: u32, threads: usize) {
        let mut buf = self.buf(&out).borrow_mut();
        par_chunks(threads, 4, &mut buf[out.range()], |_, c| {
            fill_pattern(c, pattern)
        });
    }

    /// Runs a built-in call the rules validated: every range in it lies
    /// inside one allocation.
    fn run_builtin(&mut self, call: Builtin) -> Result<(), OpError> {
        match call {
            Builtin::Nothing => Ok(()),
            Builtin::Fill { dst, count, value } => {
                let out = self.locate_mut(dst, words(count))?;
                self.fill_bytes(out, value, self.threads_for(count));
                Ok(())
            }
            Builtin::Copy { dst, src, bytes } => {
                let dst = self.locate_mut(dst, bytes)?;
                let src = self.locate(src, bytes)?;
                self.with_io(dst, [src], |d, [s]| {
                    if let Some(s) = s {
                        d.copy_from_slice(s);
                    }
                })
            }
            Builtin::Vadd { c, a, b, n, .. } => self.kernel_vadd(c, a, b, n),
            Builtin::Saxpy { y, x, n, a, .. } => self.kernel_saxpy(y, x, n, a),
            Builtin::Sgemm { p, .. } => self.kernel_sgemm(p),
            Builtin::Scale { c, count, beta } => {
                // C = beta * C; A and B are not read.
                let c = self.locate_mut(c, words(count))?;
                let threads = self.threads_for(count);
                let mut buf = self.buf(&c).borrow_mut();
                par_chunks(threads, 4, &mut buf[c.range()], |_, c| scale(c, beta));
                Ok(())
            }
            Builtin::Reduce { out, input, n } => self.kernel_reduce_sum(out, input, n),
        }
    }

    fn kernel_vadd(&mut self, c: u64, a: u64, b: u64, n: u64) -> Result<(), OpError> {
        let c = self.locate_mut(c, words(n))?;
        let a = self.locate(a, words(n))?;
        let b = self.locate(b, words(n))?;
        let threads = self.threads_for(n);
        self.with_io(c, [a, b], |c, [a, b]| {
            par_chunks(threads, 4, c, |off, c| {
                let a = a.map(|s| &s[off..off + c.len()]);
                let b = b.map(|s| &s[off..off + c.len()]);
                vadd(c, a, b);
            })
        })
    }

    fn kernel_saxpy(&mut self, y: u64, x: u64, n: u64, a: f32) -> Result<(), OpError> {
        let y = self.locate_mut(y, words(n))?;
        let x = self.locate(x, words(n))?;
        let threads = self.threads_for(n);
        self.with_io(y, [x], |y, [x]| {
            par_chunks(threads, 4, y, |off, y| {
                saxpy(y, x.map(|s| &s[off..off + y.len()]), a);
            })
        })
    }

    /// `C = alpha * A * B + beta * C` with `m, n, k > 0` and `alpha != 0`.
    fn kernel_sgemm(&mut self, p: abi::SgemmParams) -> Result<(), OpError> {
        let (m, n, k) = (u64::from(p.m), u64::from(p.n), u64::from(p.k));
        let c = self.locate_mut(p.c, words(m * n))?;
        let a = self.locate(p.a, words(m * k))?;
        let b = self.locate(p.b, words(k * n))?;
        let (alpha, beta) = (p.alpha, p.beta);
        // A and B are read into float copies first, so they may share an
        // allocation (and bytes) with C.
        let a = self.floats(&a)?;
        let b = self.floats(&b)?;
        let threads = self.threads_for(m.saturating_mul(n).saturating_mul(k));
        let (n, k) = (n as usize, k as usize);
        let mut buf = self.buf(&c).borrow_mut();
        par_chunks(threads, n * 4, &mut buf[c.range()], |off, rows| {
            let row0 = off / (n * 4);
            let nrows = rows.len() / (n * 4);
            let a = &a[row0 * k..(row0 + nrows) * k];
            sgemm_rows(rows, a, &b, n, k, alpha, beta);
        });
        Ok(())
    }

    fn kernel_reduce_sum(&mut self, out: u64, input: u64, n: u64) -> Result<(), OpError> {
        let out = self.locate_mut(out, 4)?;
        let input = self.locate(input, words(n))?;
        let threads = self.threads_for(n);
        let sum = {
            let buf = self.buf(&input).borrow();
            let bytes = &buf[input.range()];
            let per = (n as usize).div_ceil(threads).max(1) * 4;
            let partial = run_parallel(threads, bytes.chunks(per), |c| {
                c.chunks_exact(4).map(|x| f64::from(get(x))).sum::<f64>()
            });
            partial.into_iter().sum::<f64>()
        };
        let mut buf = self.buf(&out).borrow_mut();
        buf[out.range()].copy_from_slice(&(sum as f32).to_le_bytes());
        Ok(())
    }
}

/// Arrays and texture objects.
impl SoftwarePartition {
    fn room_for_object(&self) -> Result<(), OpError> {
        if (self.arrays.len() + self.objects.len()) as u64 >= abi::MAX_OBJECTS {
            return Err(OpError::NoMemory {
                requested: 0,
                available: 0,
            });
        }
        Ok(())
    }

    /// A side of an array copy as device memory: where its box starts,
    /// its pitch and rows per slice, checked against its array or
    /// allocation.
    fn copy_side(&self, side: &CopySide, extent: [u64; 3]) -> Result<CopySide, OpError> {
        if !side.array {
            let (start, len) = side.span(extent)?;
            self.locate(start, len)?;
            return Ok(*side);
        }
        let a = self
            .arrays
            .get(&side.at)
            .ok_or_else(|| OpError::NotFound(format!("array {:#x}", side.at)))?;
        side.check_array(a, extent)?;
        Ok(CopySide {
            at: side.at,
            array: false,
            pitch: a.row_bytes(),
            height: a.rows(),
            pos: side.pos,
        })
    }

    fn array_copy(&mut self, c: &ArrayCopy) -> Result<(), OpError> {
        let src = self.copy_side(&c.src, c.extent)?;
        let dst = self.copy_side(&c.dst, c.extent)?;
        let [w, h, d] = c.extent;
        // Both boxes are inside their allocations: no offset overflows.
        let at = |s: &CopySide, y: u64, z: u64| {
            s.at + (s.pos[2] + z) * s.pitch * s.height + (s.pos[1] + y) * s.pitch + s.pos[0]
        };
        for z in 0..d {
            for y in 0..h {
                self.copy_now(&DeviceCopy {
                    dst: at(&dst, y, z),
                    src: at(&src, y, z),
                    size: w,
                })?;
            }
        }
        Ok(())
    }
}

/// The steps of a queued run ([`Partition::run_queued`]).
impl SoftwarePartition {
    /// `len` bytes at `addr` as pieces that each lie inside one
    /// allocation: the range itself, or, across mappings next to each
    /// other (as on a GPU, a copy may run over the end of one mapping
    /// into the next), one piece per mapping. Every piece must be
    /// reachable; `OutOfRange` otherwise.
    fn spans(&self, addr: u64, len: u64) -> Result<Vec<(u64, u64)>, OpError> {
        let whole = self.allocs.locate(addr, len);
        if whole.is_ok() || self.vmm.mapping_at(addr).is_none() {
            return whole.map(|_| vec![(addr, len)]);
        }
        let out = OpError::OutOfRange { addr, len };
        let end = addr.checked_add(len).ok_or(out.clone())?;
        let mut at = addr;
        let mut pieces = Vec::new();
        while at < end {
            // Bounded: each piece is a whole mapping but the first and
            // the last, and mappings are bounded (VMM_MAX_OBJECTS).
            let (start, m) = self.vmm.mapping_at(at).ok_or(out.clone())?;
            let n = (start + m.size).min(end) - at;
            self.allocs.locate(at, n).map_err(|_| out.clone())?;
            pieces.push((at, n));
            at += n;
        }
        Ok(pieces)
    }

    fn copy_now(&mut self, c: &DeviceCopy) -> Result<(), OpError> {
        let DeviceCopy { dst, src, size } = *c;
        let (ds, ss) = (self.spans(dst, size)?, self.spans(src, size)?);
        if ds.len() == 1 && ss.len() == 1 {
            return self.copy_one(dst, src, size);
        }
        // Pieces that each lie in one allocation on both sides.
        let (mut di, mut si, mut done) = (0, 0, 0u64);
        let (mut doff, mut soff) = (0u64, 0u64);
        while done < size {
            let n = (ds[di].1 - doff).min(ss[si].1 - soff);
            self.copy_one(ds[di].0 + doff, ss[si].0 + soff, n)?;
            done += n;
            doff += n;
            soff += n;
            if doff == ds[di].1 {
                (di, doff) = (di + 1, 0);
            }
            if soff == ss[si].1 {
                (si, soff) = (si + 1, 0);
            }
        }
        Ok(())
    }

    fn copy_one(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        let d = self.locate_mut(dst, size)?;
        let s = self.locate(src, size)?;
        if d.start == s.start {
            let mut buf = self.buf(&d).borrow_mut();
            buf.copy_within(s.range(), d.off);
            return Ok(());
        }
        self.with_io(d, [s], |d, [s]| {
            if let Some(s) = s {
                d.copy_from_slice(s);
            }
        })
    }

    fn fill_now(&mut self, f: &DeviceFill) -> Result<(), OpError> {
        let DeviceFill {
            addr,
            size,
            pattern,
        } = *f;
        if !size.is_multiple_of(4) {
            return Err(OpError::Invalid(format!(
                "fill of {size} bytes: not a multiple of 4"
            )));
        }
        // Mappings are whole granules: every piece keeps the pattern's
        // phase.
        for (at, n) in self.spans(addr, size)? {
            let loc = self.locate_mut(at, n)?;
            self.fill_bytes(loc, pattern, self.threads_for(n / 4));
        }
        Ok(())
    }

    fn launch_now(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        if launch.module != abi::MODULE_BUILTIN {
            // The built-in kernels refuse clusters in the shared plan.
            if launch.cluster != [1, 1, 1] {
                return Err(OpError::Unsupported(format!(
                    "{}: thread block clusters of {:?}: the PTX executor runs blocks alone",
                    launch.entry, launch.cluster
                )));
            }
            if !self.modules.contains_key(&launch.module) {
                return Err(OpError::NotFound(format!("module {:#x}", launch.module)));
            }
            // A cooperative grid's blocks wait for each other: the
            // executor gives each a worker (a grid larger than the
            // partition's threads is refused), and grid.sync() counts
            // arrivals in a zeroed workspace of device memory.
            let grid_sync = match launch.cooperative {
                true => Some(self.alloc(8, 8)?),
                false => None,
            };
            let module = &self.modules[&launch.module];
            let printed = ptx::Printed::default();
            let run = ptx::Run {
                module,
                statics: self.module_vars.get(&launch.module).map(|v| v.0),
                entry: launch.entry,
                grid: launch.grid,
                block: launch.block,
                shared_mem: launch.shared_mem,
                params: launch.params,
                workers: self.threads(),
                grid_sync,
                timeout: self.kernel_timeout,
                print: &printed,
            };
            let result = ptx::launch(&run, &self.allocs);
            if let (Err(e), Some(fate)) = (&result, &self.fate) {
                if e.is_lost() {
                    fate.store(true, Ordering::Release);
                }
            }
            if let Some(ws) = grid_sync {
                // Its own allocation, just made: freeing it cannot fail.
                let _ = self.free(ws);
            }
            // What a kernel printed before it failed is kept, as on a GPU.
            self.consoles.push(launch.module, &printed.into_inner());
            return result;
        }
        // Floats are read and written byte by byte here: any operand
        // address will do.
        let call = rules::plan_builtin_launch(launch, &self.allocs, FloatOperands::Unaligned)?;
        self.run_builtin(call)
    }
}

impl Partition for SoftwarePartition {
    fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    fn kernel_compute_units(&self) -> u32 {
        self.spec.compute_units
    }

    /// A cooperative grid of at most [`Partition::max_active_clusters`]
    /// blocks, one partition thread each, runs with grid-wide sync.
    fn cooperative(&self) -> bool {
        true
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        let align = rules::alloc_align(size, align)?;
        let available = self.available();
        self.allocs
            .admit_logged(PartitionName::of("software", &self.spec), size, available)?;
        let no_memory = OpError::NoMemory {
            requested: size,
            available,
        };
        let Some(addr) = self
            .space
            .place(&self.allocs, self.vmm.reservations(), size, align)
        else {
            debug!(
                "software backend: partition {:?}: no address space for {size} bytes aligned to {align:#x}",
                self.spec.name
            );
            return Err(no_memory);
        };
        let len = usize::try_from(size).map_err(|_| no_memory.clone())?;
        let buf = DeviceBuf::zeroed(len).ok_or_else(|| self.no_host_memory(size))?;
        self.allocs.insert_logged(
            PartitionName::of("software", &self.spec),
            addr,
            size,
            size,
            RefCell::new(buf),
        );
        self.space.placed(addr, size);
        Ok(addr)
    }

    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        if self.vmm.mapping_at(addr).is_some() {
            return Err(OpError::Invalid(format!(
                "{addr:#x} is mapped memory: it is unmapped, not freed"
            )));
        }
        if self
            .module_vars
            .values()
            .any(|&(a, size)| (a..a + size).contains(&addr))
        {
            return Err(OpError::Invalid(format!(
                "{addr:#x} holds a module's variables: they go with the module"
            )));
        }
        if self.arrays.contains_key(&addr) || self.objects.contains_key(&addr) {
            return Err(OpError::Invalid(format!(
                "{addr:#x} is an array or texture object: OBJECT_DESTROY frees it"
            )));
        }
        self.allocs
            .free_logged(PartitionName::of("software", &self.spec), addr)?;
        Ok(())
    }

    fn arrays(&self) -> bool {
        true
    }

    fn resource(&mut self, req: &Resource) -> Result<u64, OpError> {
        match req {
            Resource::ArrayCreate(c) => {
                let desc = ArrayDesc::of(c)?;
                self.room_for_object()?;
                let addr = self.alloc(desc.bytes(), 0)?;
                self.arrays.insert(addr, desc);
                Ok(addr)
            }
            Resource::ArrayCopy(c) => self.array_copy(&ArrayCopy::of(c)?).map(|_| 0),
            Resource::ObjectCreate(c) => {
                let o = ObjectDesc::of(c)?;
                let desc = match o.element {
                    None => {
                        let a = self
                            .arrays
                            .get(&o.resource)
                            .ok_or_else(|| OpError::NotFound(format!("array {:#x}", o.resource)))?;
                        // NVIDIA's driver makes a surface over any array
                        // (seen on an H100, driver 580), the surface flag
                        // or not.
                        o.descriptor(Some((a, o.resource)))
                    }
                    Some(_) => {
                        let (addr, len) = o.memory_span().unwrap_or_default();
                        self.locate(addr, len)?;
                        o.descriptor(None)
                    }
                };
                self.room_for_object()?;
                let bytes = desc.encode();
                let addr = self.alloc(bytes.len() as u64, 0)?;
                let loc = self.locate(addr, bytes.len() as u64)?;
                self.buf(&loc).borrow_mut()[loc.range()].copy_from_slice(&bytes);
                self.objects.insert(addr, o.surface);
                Ok(addr)
            }
            Resource::Destroy(c) => {
                let kind = c.hdr.flags & !abi::CMD_CTX_MASK;
                let found = match kind {
                    abi::OBJECT_ARRAY => self.arrays.remove(&c.handle).is_some(),
                    abi::OBJECT_TEXTURE | abi::OBJECT_SURFACE => {
                        let surface = kind == abi::OBJECT_SURFACE;
                        match self.objects.get(&c.handle) {
                            Some(&s) if s == surface => self.objects.remove(&c.handle).is_some(),
                            _ => false,
                        }
                    }
                    k => return Err(OpError::Invalid(format!("object kind {k}"))),
                };
                if !found {
                    return Err(OpError::NotFound(format!("object {:#x}", c.handle)));
                }
                self.allocs
                    .free_logged(PartitionName::of("software", &self.spec), c.handle)?;
                Ok(0)
            }
        }
    }

    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        for (at, n) in self.spans(dst, src.len())? {
            let loc = self.locate_mut(at, n)?;
            let mut buf = self.buf(&loc).borrow_mut();
            src.read_at(at - dst, &mut buf[loc.range()])?;
        }
        Ok(())
    }

    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        for (at, n) in self.spans(src, dst.len())? {
            let loc = self.locate(at, n)?;
            let buf = self.buf(&loc).borrow();
            dst.write_at(at - src, &buf[loc.range()])?;
        }
        Ok(())
    }

    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        if self.modules.len() >= rules::MAX_MODULES {
            return Err(OpError::Invalid(format!(
                "{} modules already loaded",
                rules::MAX_MODULES
            )));
        }
        let module = ptx::load(&self.spec.name, format, image)?;
        // The module's variables live in device memory, as on a GPU: the
        // host reaches them (FUNC_INFO of a global) and they keep their
        // values from launch to launch.
        let vars = match module.statics().len() as u64 {
            0 => None,
            size => {
                let addr = self.alloc(size, 0)?;
                let loc = self.locate(addr, size)?;
                self.buf(&loc).borrow_mut()[loc.range()].copy_from_slice(module.statics());
                Some((addr, size))
            }
        };
        let handle = self.next_module;
        self.next_module += 1;
        if let Some(v) = vars {
            self.module_vars.insert(handle, v);
        }
        debug!(
            "software backend: partition {:?}: module {handle:#x} loaded ({} kernels)",
            self.spec.name,
            module.kernels().len()
        );
        self.modules.insert(handle, Arc::new(module));
        Ok(handle)
    }

    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        if module == abi::MODULE_BUILTIN {
            return Err(OpError::Invalid(
                "the built-in module cannot be unloaded".into(),
            ));
        }
        self.consoles.forget(module);
        self.modules
            .remove(&module)
            .ok_or_else(|| OpError::NotFound(format!("module {module:#x}")))?;
        if let Some((addr, _)) = self.module_vars.remove(&module) {
            self.allocs
                .free_logged(PartitionName::of("software", &self.spec), addr)?;
        }
        Ok(())
    }

    fn console(&mut self, module: u64, max: usize) -> Result<ConsoleText, OpError> {
        Ok(self.consoles.take(module, max))
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        // Launches run on the CPU and complete when they return.
        crate::run_steps_in_order(steps, stop, |s| match s {
            Queued::Launch(l) => self.launch_now(l),
            Queued::Fill(f) => self.fill_now(f),
            Queued::Copy(c) => self.copy_now(c),
            Queued::Upload { dst, src } => self.upload(*dst, src),
            Queued::Download { src, dst } => self.download(*src, dst),
            Queued::Timestamp => Ok(()),
        })
    }

    /// Each of the partition's threads runs one block at a time, and the
    /// PTX executor runs blocks alone: clusters of more than one block
    /// never fit.
    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        if launch.module == abi::MODULE_BUILTIN {
            return Err(OpError::Invalid(
                "occupancy of the built-in kernels is not asked".into(),
            ));
        }
        let info = self.function_info(launch.module, launch.entry)?;
        rules::check_module_shape(
            launch.entry,
            launch.cluster,
            launch.block,
            launch.shared_mem,
            &KernelLimits::of(&info),
        )?;
        Ok(if launch.cluster == [1, 1, 1] {
            self.threads() as u32
        } else {
            0
        })
    }

    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        if module == abi::MODULE_BUILTIN {
            return rules::builtin_function_info(entry);
        }
        let m = self
            .modules
            .get(&module)
            .ok_or_else(|| OpError::NotFound(format!("module {module:#x}")))?;
        ptx::function_info(m, entry)
    }

    /// A module's variables share one allocation, made when it loaded.
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        let m = self
            .modules
            .get(&module)
            .ok_or_else(|| OpError::NotFound(format!("module {module:#x}")))?;
        let not_found = || OpError::NotFound(format!("global {name:?} in module {module:#x}"));
        let (off, size) = m.variable(name).ok_or_else(not_found)?;
        let &(base, _) = self.module_vars.get(&module).ok_or_else(not_found)?;
        Ok((base + u64::from(off), u64::from(size)))
    }

    fn memory_used(&self) -> u64 {
        self.allocs.used() + self.vmm.physical_bytes()
    }

    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        let used = self.memory_used();
        let mut pool = lock(&self.pool);
        // A suspended partition holds none of the pool: resume takes the
        // new quota.
        let left = (self.reserved && !self.suspended).then_some(&mut pool.memory);
        rules::requota(left, used, self.spec.memory, memory)?;
        self.spec.memory = memory;
        Ok(())
    }

    fn suspend(&mut self) -> Result<u64, OpError> {
        if !self.suspended {
            self.held_quota(0)?;
            self.suspended = true;
        }
        Ok(self.memory_used())
    }

    fn resume(&mut self) -> Result<u64, OpError> {
        if self.suspended {
            self.held_quota(self.spec.memory)?;
            self.suspended = false;
        }
        Ok(self.memory_used())
    }

    fn has_vmm(&self) -> bool {
        true
    }

    fn vmm(&mut self, op: &VmmOp) -> Result<u64, OpError> {
        match *op {
            VmmOp::Reserve { size, align, addr } => {
                let align = self.vmm.check_reserve(size, align)?;
                let reserved = self.vmm.reservations();
                let wanted = addr != 0
                    && addr.is_multiple_of(align)
                    && AddressSpace::is_free(&self.allocs, reserved, addr, size);
                let at = match wanted {
                    true => addr,
                    false => self
                        .space
                        .place(&self.allocs, reserved, size, align)
                        .ok_or(OpError::NoMemory {
                            requested: size,
                            available: self.available(),
                        })?,
                };
                self.vmm.reserved(at, size);
                self.space.placed(at, size);
                Ok(at)
            }
            VmmOp::Free { addr, size } => self.vmm.free(addr, size).map(|_| 0),
            VmmOp::Create { size } => {
                self.vmm.check_create(size, self.available())?;
                let buf = usize::try_from(size)
                    .ok()
                    .and_then(DeviceBuf::zeroed)
                    .ok_or_else(|| self.no_host_memory(size))?;
                Ok(self.vmm.created(size, buf))
            }
            // Freed here (dropped) if nothing maps it.
            VmmOp::Release { handle } => self.vmm.release(handle).map(|_| 0),
            VmmOp::Map {
                addr,
                size,
                handle,
                offset,
            } => {
                self.vmm.check_map(addr, size, handle, offset)?;
                self.vmm.mapped(addr, size, handle, offset);
                Ok(0)
            }
            VmmOp::Unmap { addr, size } => {
                // The views go first: the physical memory they show may
                // go with the unmap.
                for a in self.vmm.whole_mappings(addr, size)? {
                    if self.allocs.get(a).is_some() {
                        self.allocs.free(a)?;
                    }
                }
                self.vmm.unmap(addr, size).map(|_| 0)
            }
            VmmOp::Access { addr, size, access } => {
                let starts = self.vmm.check_access(addr, size, access)?;
                if access == abi::MEM_ACCESS_NONE {
                    for a in starts {
                        if self.allocs.get(a).is_some() {
                            self.allocs.free(a)?;
                        }
                        self.vmm.set_access(a, access);
                    }
                    return Ok(0);
                }
                let adding = starts
                    .iter()
                    .filter(|a| self.allocs.get(**a).is_none())
                    .count();
                if self.allocs.len() + adding > rules::MAX_ALLOCATIONS {
                    return Err(OpError::NoMemory {
                        requested: 0,
                        available: self.available(),
                    });
                }
                for a in starts {
                    if self.allocs.get(a).is_some() {
                        self.allocs.free(a)?;
                    }
                    self.vmm.set_access(a, access);
                    let Some(m) = self.vmm.mappings().get(&a).copied() else {
                        continue;
                    };
                    let Some(p) = self.vmm.physical(m.handle) else {
                        continue;
                    };
                    // Both fit a usize: the physical allocation's host
                    // memory holds them (checked when it was mapped).
                    let (off, len) = (m.offset as usize, m.size as usize);
                    // SAFETY: the physical allocation outlives the view:
                    // it is freed only once unmapped, and an unmap (or a
                    // reset) removes the view from `allocs` first; copies
                    // between views of one memory go through a copy
                    // (`with_io`, `copy_now`).
                    let view = unsafe {
                        DeviceBuf::view(&p.data, off, len, access == abi::MEM_ACCESS_READ)
                    };
                    self.allocs.insert(a, m.size, 0, RefCell::new(view));
                }
                Ok(0)
            }
        }
    }

    /// A faulting kernel fails alone here: its accesses are checked, and
    /// nothing else is lost, unless the partitions share one fate.
    fn is_lost(&self) -> bool {
        self.fate
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Acquire))
    }

    fn reset(&mut self) {
        debug!(
            "software backend: partition {:?}: reset, {} allocations ({} bytes) freed",
            self.spec.name,
            self.allocs.len(),
            self.allocs.used()
        );
        // Views of physical allocations first, then what they show.
        self.allocs.drain();
        self.vmm.drain();
        self.space.reset();
        // Handles keep counting: one from before the reset finds nothing.
        self.modules.clear();
        self.module_vars.clear();
        self.consoles.clear();
        self.arrays.clear();
        self.objects.clear();
    }
}
