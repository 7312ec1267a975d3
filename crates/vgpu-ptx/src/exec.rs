//! Running a kernel on CPU threads.
//!
//! Blocks are shared out to `workers` threads. A block's warps run on one
//! thread, one at a time, each until it waits at a barrier or ends. A warp
//! executes one decoded instruction for all its active lanes at once; its
//! lanes each have a program counter and the warp always runs the group
//! of lanes at the lowest one, so lanes that diverge meet again where
//! their paths join (the lowest-PC rule reconverges structured code at
//! its join points and loops at their exits).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use crate::half::{self, bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::ir::*;
use crate::mem::{AtomicOp, GlobalMemory, VecMemory};
use crate::module::Module;
use crate::printf::{self, PrintSink};

/// The shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_dyn: u32,
    /// OS threads the blocks are spread over (at least one is used).
    pub workers: usize,
}

/// Bounds on one launch, and where its `printf` output goes.
#[derive(Clone, Copy)]
pub struct Limits<'a> {
    /// Shared memory per block (static and dynamic), bytes.
    pub max_shared: u32,
    /// Local memory per thread, bytes.
    pub max_local_per_thread: u32,
    /// Warp instructions the whole launch may execute.
    pub max_steps: Option<u64>,
    /// When the launch is stopped.
    pub deadline: Option<Instant>,
    /// Set by someone else to stop the launch.
    pub cancel: Option<&'a AtomicBool>,
    /// Receives the kernel's `printf` output (None: it is dropped).
    pub print: Option<&'a dyn PrintSink>,
    /// Where in `mem` the module's `.global` and `.const` variables live
    /// ([`Module::statics`] laid out from this address), so that they
    /// keep their values between launches and the host reaches them.
    /// None: each launch gets its own copy of their initial values.
    pub statics: Option<u64>,
    /// A cooperative launch: every block of the grid runs at once (the
    /// grid may have at most `workers` blocks), and `%envreg1:%envreg2`
    /// give the grid's workspace at this address in `mem`, 8 bytes the
    /// caller zeroes, where cooperative groups' `grid.sync()` counts the
    /// blocks that arrived. None: `%envreg*` read zero, and `grid.sync()`
    /// traps, as cooperative groups do outside a cooperative launch.
    pub grid_sync: Option<u64>,
}

impl std::fmt::Debug for Limits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("max_shared", &self.max_shared)
            .field("max_local_per_thread", &self.max_local_per_thread)
            .field("max_steps", &self.max_steps)
            .field("deadline", &self.deadline)
            .field("cancel", &self.cancel)
            .field("print", &self.print.is_some())
            .field("statics", &self.statics)
            .field("grid_sync", &self.grid_sync)
            .finish()
    }
}

impl Default for Limits<'_> {
    /// What an H100-class device allows, with no time limit.
    fn default() -> Self {
        Limits {
            max_shared: 227 << 10,
            max_local_per_thread: 512 << 10,
            max_steps: None,
            deadline: None,
            cancel: None,
            print: None,
            statics: None,
            grid_sync: None,
        }
    }
}

/// What a launch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Blocks run.
    pub blocks: u64,
    /// Instructions executed, counted once per warp.
    pub warp_instructions: u64,
    /// Instructions executed, counted once per active thread.
    pub thread_instructions: u64,
}

/// Why a launch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// No `.entry` of that name.
    #[error("no kernel named '{0}'")]
    NoKernel(String),
    /// Launch shape or parameters that cannot run.
    #[error("invalid launch: {0}")]
    BadLaunch(String),
    /// Static plus dynamic shared memory above the limit.
    #[error("{requested} bytes of shared memory per block, limit {max}")]
    SharedTooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The limit.
        max: u32,
    },
    /// Local memory per thread above the limit.
    #[error("{requested} bytes of local memory per thread, limit {max}")]
    LocalTooLarge {
        /// Bytes needed.
        requested: u32,
        /// The limit.
        max: u32,
    },
    /// An access outside mapped memory (device memory, shared, local or
    /// parameter space).
    #[error("illegal address {addr:#x} ({size} bytes) at PTX line {line}")]
    IllegalAddress {
        /// The address.
        addr: u64,
        /// Bytes accessed.
        size: u32,
        /// The instruction's source line.
        line: u32,
    },
    /// An access at an address that is not a multiple of its size (of
    /// the whole vector for `.v2`/`.v4`), which the hardware refuses.
    #[error("misaligned address {addr:#x} for a {size}-byte access at PTX line {line}")]
    MisalignedAddress {
        /// The address.
        addr: u64,
        /// The required alignment.
        size: u32,
        /// The instruction's source line.
        line: u32,
    },
    /// The step limit or deadline was reached.
    #[error("kernel stopped: time or step limit reached")]
    Timeout,
    /// The cancel flag was set.
    #[error("kernel cancelled")]
    Cancelled,
    /// The kernel executed `trap`.
    #[error("trap at PTX line {0}")]
    Trap(u32),
    /// A thread's `assert()` failed (a call of `__assertfail`).
    #[error("device-side assertion failed at PTX line {0}")]
    Assert(u32),
    /// The kernel may execute an instruction this executor does not run
    /// (the module loaded; this kernel cannot launch).
    #[error("PTX {0}")]
    Refused(Box<crate::ParseError>),
    /// Something this executor does not do (recursion, ...).
    #[error("unsupported at PTX line {line}: {what}")]
    Unsupported {
        /// What.
        what: &'static str,
        /// The instruction's source line.
        line: u32,
    },
}

const FULL: u32 = u32::MAX;
const MAX_CALL_DEPTH: usize = 64;
/// Warp steps between looks at the clock and the cancel flag.
const CHECK_EVERY: u64 = 4096;

/// Copies a register row. In two halves: a 128-byte copy is a few
/// inline vector moves on every x86-64, a 256-byte one a `memmove` call.
#[inline(always)]
fn copy_row(dst: &mut [u64; 32], src: &[u64; 32]) {
    let (d0, d1) = dst.split_at_mut(16);
    d0.copy_from_slice(&src[..16]);
    d1.copy_from_slice(&src[16..]);
}

/// The lanes set in `mask`, lowest first.
#[inline(always)]
fn lanes(mask: u32) -> impl Iterator<Item = usize> {
    let mut m = mask;
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            l
        })
    })
}

/// `d[l] = f(a[l])` for the 32 lanes.
#[inline(always)]
fn map1(d: &mut [u64; 32], a: &[u64; 32], f: impl Fn(u64) -> u64) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = f(x);
    }
}

/// `d[l] = f(a[l], b[l])` for the 32 lanes.
#[inline(always)]
fn map2(d: &mut [u64; 32], a: &[u64; 32], b: &[u64; 32], f: impl Fn(u64, u64) -> u64) {
    for (o, (&x, &y)) in d.iter_mut().zip(a.iter().zip(b)) {
        *o = f(x, y);
    }
}

/// `d[l] = f(a[l], b[l], c[l])` for the 32 lanes.
#[inline(always)]
fn map3(
    d: &mut [u64; 32],
    a: &[u64; 32],
    b: &[u64; 32],
    c: &[u64; 32],
    f: impl Fn(u64, u64, u64) -> u64,
) {
    for (o, ((&x, &y), &z)) in d.iter_mut().zip(a.iter().zip(b).zip(c)) {
        *o = f(x, y, z);
    }
}

/// The lanes whose predicate (bit 0 of `row`) is set, or clear if `neg`.
#[inline(always)]
fn ballot(row: &[u64; 32], neg: bool) -> u32 {
    let mut bits = 0u32;
    for (l, v) in row.iter().enumerate() {
        bits |= (((*v & 1) as u32) ^ neg as u32) << l;
    }
    bits
}

/// The error of an access to `addr` outside mapped memory.
#[inline(always)]
fn illegal(addr: u64, size: u32, line: u32) -> ExecError {
    ExecError::IllegalAddress { addr, size, line }
}

/// Whether `addr` is in the window of the module's variables.
#[inline(always)]
fn in_statics(addr: u64) -> bool {
    (STATIC_WINDOW..STATIC_WINDOW + WINDOW_SIZE).contains(&addr)
}

/// Where static-window address `a` lies in device memory when the
/// module's variables start at `base`.
#[inline(always)]
fn relocate(base: u64, a: u64) -> u64 {
    base.wrapping_add(a - STATIC_WINDOW)
}

/// The bytes `[a, a + n)` of slot `i` of `size` bytes (a lane's local or
/// parameter memory), if they lie within it.
#[inline(always)]
fn slot(i: usize, size: usize, a: u64, n: usize) -> Option<std::ops::Range<usize>> {
    let e = a.checked_add(n as u64)?;
    let base = i * size;
    (e <= size as u64).then_some(base + a as usize..base + e as usize)
}

/// Argument `at` (`size` bytes, at most 8) of lane `l`'s call, from its
/// parameter space of `ps` bytes.
fn call_arg(w: &Warp, l: usize, ps: usize, at: u32, size: usize) -> Option<u64> {
    let src = slot(l, ps, u64::from(at), size).and_then(|r| w.pmem.get(r))?;
    let mut b = [0u8; 8];
    b.get_mut(..size)?.copy_from_slice(src);
    Some(u64::from_le_bytes(b))
}

#[inline(always)]
fn mask_of(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[inline(always)]
fn sx(x: u64, bits: u32) -> i64 {
    if bits >= 64 {
        x as i64
    } else {
        let s = 64 - bits;
        ((x << s) as i64) >> s
    }
}

#[inline(always)]
fn f32v(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
#[inline(always)]
fn f32b(x: f32) -> u64 {
    x.to_bits() as u64
}
#[inline(always)]
fn f64v(x: u64) -> f64 {
    f64::from_bits(x)
}

/// Reads a float operand of type `ty` as f64 (f16/bf16/f32 exactly).
#[inline(always)]
fn fget(ty: Ty, x: u64) -> f64 {
    match ty {
        Ty::F64 => f64v(x),
        Ty::F16 => f16_to_f32(x as u16) as f64,
        Ty::Bf16 => bf16_to_f32(x as u16) as f64,
        _ => f32v(x) as f64,
    }
}

#[inline(always)]
fn fput(ty: Ty, v: f64) -> u64 {
    match ty {
        Ty::F64 => v.to_bits(),
        Ty::F16 => f32_to_f16(v as f32) as u64,
        Ty::Bf16 => f32_to_bf16(v as f32) as u64,
        _ => f32b(v as f32),
    }
}

struct Scratch {
    a: [u64; 32],
    b: [u64; 32],
    c: [u64; 32],
    d: [u64; 32],
    e: [u64; 32],
}

struct Frame {
    ret_pc: u32,
    func: u32,
}

/// A warp's lanes waiting at a `bar.red`: where the result goes and what
/// their predicates gave.
#[derive(Clone, Copy)]
struct RedWait {
    op: BarRedOp,
    d: u32,
    lanes: u32,
    /// Lanes whose predicate was true.
    set: u32,
}

struct Warp {
    regs: Vec<[u64; 32]>,
    pcs: [u32; 32],
    live: u32,
    waiting: u32,
    /// Lanes that reached a warp-collective instruction (`shfl.sync`,
    /// `vote.sync`, ...) and wait for the rest of the warp there.
    parked: u32,
    /// The parked lanes were let go without the others: the next
    /// collective runs with the lanes it has.
    released: bool,
    cur_pc: u32,
    cur: u32,
    other_min: u32,
    stacks: Vec<Vec<Frame>>,
    local: Vec<u8>,
    pmem: Vec<u8>,
    wid: u32,
    tid: [[u32; 32]; 3],
    /// Lanes waiting at a `bar.red`, if any.
    red: Option<RedWait>,
}

impl Warp {
    /// Gives every lane of the current group its PC explicitly.
    fn materialize(&mut self) {
        for l in lanes(self.cur) {
            self.pcs[l] = self.cur_pc;
        }
    }

    /// Picks the group at the lowest PC among the lanes that can run.
    fn resched(&mut self) {
        let run = self.live & !self.waiting & !self.parked;
        let min = lanes(run).map(|l| self.pcs[l]).min().unwrap_or(u32::MAX);
        let mut cur = 0;
        let mut other = u32::MAX;
        for l in lanes(run) {
            if self.pcs[l] == min {
                cur |= 1 << l;
            } else {
                other = other.min(self.pcs[l]);
            }
        }
        self.cur = cur;
        self.cur_pc = min;
        self.other_min = other;
    }

    #[inline(always)]
    fn row(&self, r: u32) -> &[u64; 32] {
        &self.regs[r as usize]
    }

    #[inline(always)]
    fn put(&mut self, d: u32, mask: u32, v: &[u64; 32]) {
        let row = &mut self.regs[d as usize];
        if mask == FULL {
            copy_row(row, v);
        } else {
            for l in lanes(mask) {
                row[l] = v[l];
            }
        }
    }
}

/// Reserved shared memory per block, bytes, as sm_80 and later keep 1 KiB
/// for the system: `%reserved_smem_offset_0` and `_1` each name half
/// (cooperative groups' multi-warp tiles need 288 bytes at `_1`).
const RESERVED_SMEM: u64 = 1024;

struct Launch<'a> {
    m: &'a Module,
    cfg: &'a LaunchConfig,
    params: &'a [u8],
    mem: &'a dyn GlobalMemory,
    statics: VecMemory,
    dyn_base: u64,
    /// End of the kernel's static shared variables.
    static_end: u64,
    /// The register ranges the kernel may use (sink and carry included).
    reg_ranges: Vec<(u32, u32)>,
    shared_len: usize,
    /// What the kernel's own shared memory spans (`%total_smem_size`).
    kernel_shared: u64,
    /// The shared address of the block's reserved shared memory.
    reserved: u64,
    nwarps: u32,
    limits: &'a Limits<'a>,
    steps: AtomicU64,
    start: Instant,
    /// `%envreg0..31`, the driver's values: a cooperative grid's
    /// workspace (high and low halves in 1 and 2), zero otherwise.
    envreg: [u64; 32],
}

enum Stop {
    Barrier,
    Done,
    /// Ran for a while: the block's other warps get their turn, so that
    /// a warp spinning on a flag another warp sets does not starve it.
    Yield,
}

/// Runs `kernel` of `module` over the grid, with `params` as its parameter
/// buffer (laid out as [`Module::kernel`] reports) and `mem` as device
/// memory.
pub fn launch(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    params: &[u8],
    mem: &dyn GlobalMemory,
    limits: &Limits<'_>,
) -> Result<LaunchStats, ExecError> {
    let fi = module
        .func_index(kernel)
        .ok_or_else(|| ExecError::NoKernel(kernel.to_string()))?;
    let info = module
        .kernel(kernel)
        .ok_or_else(|| ExecError::NoKernel(kernel.to_string()))?;
    if let Some(e) = module.refused(kernel) {
        return Err(ExecError::Refused(Box::new(e.clone())));
    }
    let threads = cfg
        .block
        .iter()
        .try_fold(1u64, |a, &b| Some(a * b as u64))
        .unwrap_or(0);
    if threads == 0 || threads > 1024 {
        return Err(ExecError::BadLaunch(format!(
            "{threads} threads per block (1..=1024)"
        )));
    }
    if let Some(max) = info.max_threads {
        if threads > max as u64 {
            return Err(ExecError::BadLaunch(format!(
                "{threads} threads per block, kernel allows {max}"
            )));
        }
    }
    let [gx, gy, gz] = cfg.grid;
    let nblocks = gx as u64 * gy as u64 * gz as u64;
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 || nblocks == 0 {
        return Err(ExecError::BadLaunch(format!("grid {:?}", cfg.grid)));
    }
    // Blocks of a cooperative grid wait for each other: each needs a
    // thread of its own.
    if limits.grid_sync.is_some() && nblocks > cfg.workers.max(1) as u64 {
        return Err(ExecError::BadLaunch(format!(
            "a cooperative grid of {nblocks} blocks, {} can run at once",
            cfg.workers.max(1)
        )));
    }
    if (params.len() as u64) < info.param_bytes as u64 {
        return Err(ExecError::BadLaunch(format!(
            "{} parameter bytes, kernel takes {}",
            params.len(),
            info.param_bytes
        )));
    }
    // The limit is a GPU's, over what the kernel's own variables take;
    // the block's memory follows the module's layout.
    let requested = (info.shared_static as u64).div_ceil(16) * 16 + cfg.shared_dyn as u64;
    if requested > limits.max_shared as u64 {
        return Err(ExecError::SharedTooLarge {
            requested,
            max: limits.max_shared,
        });
    }
    let dyn_base = (info.shared_layout as u64).div_ceil(16) * 16;
    let dyn_end = dyn_base + cfg.shared_dyn as u64;
    // The block's reserved shared memory (`%reserved_smem_offset_*`,
    // which cooperative groups use as scratch) follows the dynamic
    // memory, addressed as it is; a GPU's is outside the limit too.
    let reserved = dyn_end.div_ceil(16) * 16;
    let shared_len = reserved + RESERVED_SMEM;
    // Per-thread parameter space of calls is local memory on a GPU too.
    let local = module.local_size.saturating_add(module.param_size);
    if local > limits.max_local_per_thread {
        return Err(ExecError::LocalTooLarge {
            requested: local,
            max: limits.max_local_per_thread,
        });
    }
    let l = Launch {
        m: module,
        cfg,
        params,
        mem,
        // Variables in device memory need no copy of their own.
        statics: match limits.statics {
            Some(_) => VecMemory::new(STATIC_WINDOW, 0),
            None => VecMemory::from_bytes(STATIC_WINDOW, &module.statics),
        },
        dyn_base,
        static_end: info.shared_layout as u64,
        reg_ranges: std::iter::once((0, 2))
            .chain(module.funcs[fi].reach_regs.iter().copied())
            .collect(),
        shared_len: shared_len as usize,
        kernel_shared: dyn_end,
        reserved: EXTERN_SHARED as u64 + (reserved - dyn_base),
        nwarps: threads.div_ceil(32) as u32,
        limits,
        steps: AtomicU64::new(0),
        start: Instant::now(),
        envreg: std::array::from_fn(|n| match (limits.grid_sync, n) {
            (Some(a), 1) => a >> 32,
            (Some(a), 2) => a & 0xffff_ffff,
            _ => 0,
        }),
    };
    let start_pc = module.funcs[fi].start;
    let next = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let err: Mutex<Option<ExecError>> = Mutex::new(None);
    let totals = Mutex::new(LaunchStats::default());
    let workers = cfg.workers.max(1).min(nblocks.min(1024) as usize);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut stats = LaunchStats::default();
                let mut warps = l.new_warps();
                let mut shared = vec![0u8; l.shared_len];
                loop {
                    if abort.load(Ordering::Relaxed) {
                        break;
                    }
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= nblocks {
                        break;
                    }
                    let gx = cfg.grid[0] as u64;
                    let gy = cfg.grid[1] as u64;
                    let ctaid = [
                        (b % gx) as u32,
                        ((b / gx) % gy) as u32,
                        (b / (gx * gy)) as u32,
                    ];
                    if let Err(e) =
                        l.run_block(start_pc, ctaid, &mut warps, &mut shared, &mut stats, &abort)
                    {
                        let mut g = err.lock().unwrap_or_else(|p| p.into_inner());
                        if g.is_none() {
                            *g = Some(e);
                        }
                        abort.store(true, Ordering::Relaxed);
                        break;
                    }
                    stats.blocks += 1;
                }
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                t.blocks += stats.blocks;
                t.warp_instructions += stats.warp_instructions;
                t.thread_instructions += stats.thread_instructions;
            });
        }
    });
    if let Some(e) = err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(totals.into_inner().unwrap_or_else(|p| p.into_inner()))
}

impl Launch<'_> {
    fn new_warps(&self) -> Vec<Warp> {
        // Rows up to the last register the kernel may use: a kernel of a
        // large module does not reserve every other kernel's.
        let nregs = self.reg_ranges.iter().map(|r| r.1).max().unwrap_or(2) as usize;
        (0..self.nwarps)
            .map(|w| Warp {
                regs: vec![[0; 32]; nregs],
                pcs: [0; 32],
                live: 0,
                waiting: 0,
                parked: 0,
                released: false,
                cur_pc: 0,
                cur: 0,
                other_min: u32::MAX,
                stacks: (0..32).map(|_| Vec::new()).collect(),
                local: vec![0; self.m.local_size as usize * 32],
                pmem: vec![0; self.m.param_size as usize * 32],
                wid: w,
                tid: [[0; 32]; 3],
                red: None,
            })
            .collect()
    }

    fn run_block(
        &self,
        start_pc: u32,
        ctaid: [u32; 3],
        warps: &mut [Warp],
        shared: &mut [u8],
        stats: &mut LaunchStats,
        abort: &AtomicBool,
    ) -> Result<(), ExecError> {
        let [bx, by, bz] = self.cfg.block;
        let threads = bx * by * bz;
        shared.fill(0);
        for w in warps.iter_mut() {
            // Only the kernel's and its callees' registers: the rows of
            // other kernels of the module are never touched (nor made
            // resident: the allocation is zeroed pages).
            for &(lo, hi) in self.reg_ranges.iter() {
                if let Some(rows) = w.regs.get_mut(lo as usize..hi as usize) {
                    rows.fill([0; 32]);
                }
            }
            w.live = 0;
            for l in 0..32u32 {
                let t = w.wid * 32 + l;
                if t < threads {
                    w.live |= 1 << l;
                }
                w.tid[0][l as usize] = t % bx;
                w.tid[1][l as usize] = (t / bx) % by;
                w.tid[2][l as usize] = t / (bx * by);
                w.stacks[l as usize].clear();
            }
            w.pcs = [start_pc; 32];
            w.waiting = 0;
            w.parked = 0;
            w.released = false;
            w.red = None;
            w.resched();
        }
        loop {
            let mut any = false;
            for w in warps.iter_mut() {
                if w.live & !w.waiting != 0 {
                    any = true;
                    self.run_warp(w, ctaid, shared, stats, abort)?;
                }
            }
            // Everyone left waits at the barrier (or has ended).
            if !any && !release_barrier(warps) {
                return Ok(());
            }
        }
    }

    fn check_limits(&self, n: u64, abort: &AtomicBool) -> Result<(), ExecError> {
        let total = self.steps.fetch_add(n, Ordering::Relaxed) + n;
        if self.limits.max_steps.is_some_and(|m| total > m) {
            return Err(ExecError::Timeout);
        }
        if self.limits.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ExecError::Timeout);
        }
        if self
            .limits
            .cancel
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Err(ExecError::Cancelled);
        }
        if abort.load(Ordering::Relaxed) {
            // Another block failed: its error is the launch's.
            return Err(ExecError::Cancelled);
        }
        Ok(())
    }

    fn run_warp(
        &self,
        w: &mut Warp,
        ctaid: [u32; 3],
        shared: &mut [u8],
        stats: &mut LaunchStats,
        abort: &AtomicBool,
    ) -> Result<Stop, ExecError> {
        let code = &self.m.code;
        let mut since = 0u64;
        let mut scratch = Scratch {
            a: [0; 32],
            b: [0; 32],
            c: [0; 32],
            d: [0; 32],
            e: [0; 32],
        };
        loop {
            if w.cur == 0 && w.parked != 0 {
                // Nobody else can arrive: let the parked lanes go.
                w.parked = 0;
                w.released = true;
                w.resched();
                continue;
            }
            if w.cur == 0 {
                // The steps since the last check count toward the limit.
                self.steps.fetch_add(since, Ordering::Relaxed);
                return Ok(if w.live == 0 {
                    Stop::Done
                } else {
                    Stop::Barrier
                });
            }
            since += 1;
            if since >= CHECK_EVERY {
                self.check_limits(since, abort)?;
                return Ok(Stop::Yield);
            }
            let Some(inst) = code.get(w.cur_pc as usize) else {
                return Err(ExecError::Unsupported {
                    what: "execution ran past the code",
                    line: 0,
                });
            };
            let mut mask = w.cur;
            if let Some((p, neg)) = inst.guard {
                mask &= ballot(w.row(p), neg);
            }
            stats.warp_instructions += 1;
            stats.thread_instructions += mask.count_ones() as u64;
            match &inst.op {
                Op::Bra { target } => {
                    if mask == w.cur {
                        w.cur_pc = *target;
                        if w.cur_pc >= w.other_min {
                            w.materialize();
                            w.resched();
                        }
                    } else if mask == 0 {
                        self.advance(w);
                    } else {
                        w.cur_pc += 1;
                        w.materialize();
                        for l in lanes(mask) {
                            w.pcs[l] = *target;
                        }
                        w.resched();
                    }
                }
                Op::Exit | Op::Ret => {
                    w.cur_pc += 1;
                    w.materialize();
                    for l in lanes(mask) {
                        let frame = if matches!(inst.op, Op::Ret) {
                            w.stacks[l].pop()
                        } else {
                            None
                        };
                        match frame {
                            None => {
                                if matches!(inst.op, Op::Exit) {
                                    w.stacks[l].clear();
                                }
                                w.live &= !(1 << l);
                            }
                            Some(f) => {
                                w.pcs[l] = f.ret_pc;
                                self.copy_ret(w, l, &f, inst.line)?;
                            }
                        }
                    }
                    w.resched();
                }
                Op::Call { func, .. } if !self.m.funcs[*func as usize].defined => {
                    self.external_call(w, shared, inst, mask, ctaid)?;
                    self.advance(w);
                }
                Op::Call { func, args, .. } => {
                    let f = &self.m.funcs[*func as usize];
                    w.cur_pc += 1;
                    w.materialize();
                    for l in lanes(mask) {
                        if w.stacks[l].len() >= MAX_CALL_DEPTH
                            || w.stacks[l].iter().any(|fr| fr.func == *func)
                        {
                            return Err(ExecError::Unsupported {
                                what: "recursive calls",
                                line: inst.line,
                            });
                        }
                        if args.len() != f.params.len() {
                            return Err(ExecError::Unsupported {
                                what: "call with the wrong number of arguments",
                                line: inst.line,
                            });
                        }
                        let ps = self.m.param_size as usize;
                        let lane = &mut w.pmem[l * ps..(l + 1) * ps];
                        for (&src, (p, dst)) in args.iter().zip(&f.params) {
                            let (s, d, n) = (src as usize, *dst as usize, p.size as usize);
                            if s + n > ps || d + n > ps {
                                return Err(illegal(src as u64, p.size, inst.line));
                            }
                            lane.copy_within(s..s + n, d);
                        }
                        w.stacks[l].push(Frame {
                            ret_pc: w.cur_pc,
                            func: *func,
                        });
                        w.pcs[l] = f.start;
                    }
                    w.resched();
                }
                Op::Bar | Op::BarRed { .. } => {
                    if let &Op::BarRed { op, d, c, neg } = &inst.op {
                        self.bar_red_arrive(w, (op, d, c, neg), mask, ctaid, &mut scratch.a);
                    }
                    w.cur_pc += 1;
                    w.materialize();
                    w.waiting |= mask;
                    w.resched();
                    if w.cur == 0 {
                        self.check_limits(since, abort)?;
                        return Ok(Stop::Barrier);
                    }
                }
                Op::Shfl { .. }
                | Op::Vote { .. }
                | Op::Match { .. }
                | Op::Redux { .. }
                | Op::Elect { .. }
                    if w.cur != w.live & !w.waiting && !w.released =>
                {
                    // Lanes of the warp are elsewhere (a call in one arm
                    // of a branch placed above the other arm's code): wait
                    // for them here, as the hardware's .sync does.
                    w.materialize();
                    w.parked |= w.cur;
                    w.resched();
                }
                Op::Trap => {
                    if mask != 0 {
                        return Err(ExecError::Trap(inst.line));
                    }
                    self.advance(w);
                }
                _ => {
                    if matches!(
                        inst.op,
                        Op::Shfl { .. }
                            | Op::Vote { .. }
                            | Op::Match { .. }
                            | Op::Redux { .. }
                            | Op::Elect { .. }
                    ) {
                        w.released = false;
                    }
                    if mask != 0 {
                        self.exec(inst, w, mask, ctaid, shared, &mut scratch)?;
                    }
                    self.advance(w);
                }
            }
        }
    }

    #[inline(always)]
    fn advance(&self, w: &mut Warp) {
        w.cur_pc += 1;
        if w.cur_pc >= w.other_min {
            w.materialize();
            w.resched();
        }
    }

    /// A call of a function the module declares but does not define: the
    /// few the CUDA runtime provides.
    fn external_call(
        &self,
        w: &mut Warp,
        shared: &[u8],
        inst: &Inst,
        mask: u32,
        ctaid: [u32; 3],
    ) -> Result<(), ExecError> {
        let Op::Call { func, args, ret } = &inst.op else {
            return Ok(());
        };
        match self.m.funcs[*func as usize].name.as_str() {
            // printf: each lane formats and prints in lane order and
            // gets what CUDA's printf returns.
            "vprintf" => {
                let &[fmt, argv] = args.as_slice() else {
                    return Err(ExecError::Unsupported {
                        what: "call with the wrong number of arguments",
                        line: inst.line,
                    });
                };
                let ps = self.m.param_size as usize;
                let mut text = Vec::new();
                for l in lanes(mask) {
                    let param =
                        |at: u32| call_arg(w, l, ps, at, 8).ok_or(illegal(at as u64, 8, inst.line));
                    let (fmt, argv) = (param(fmt)?, param(argv)?);
                    let mut read = |a: u64, buf: &mut [u8]| {
                        self.read(w, shared, Space::Generic, l, a, buf, inst.line)
                            .is_ok()
                    };
                    let rv = printf::vprintf(fmt, argv, &mut read, &mut text);
                    if let Some(sink) = self.limits.print.filter(|_| rv >= 0) {
                        sink.print(&text);
                    }
                    let at = ret.and_then(|r| slot(l, ps, r as u64, 4));
                    if let Some(b) = at.and_then(|r| w.pmem.get_mut(r)) {
                        b.copy_from_slice(&rv.to_le_bytes());
                    }
                }
                Ok(())
            }
            // A guarded call whose lanes all skip it does not fail.
            "__assertfail" if mask == 0 => Ok(()),
            // assert(): each failing lane says so as a GPU does, and the
            // launch fails.
            "__assertfail" => {
                let ps = self.m.param_size as usize;
                for l in lanes(mask) {
                    let param = |i: usize, size| call_arg(w, l, ps, *args.get(i)?, size);
                    let failed = printf::Assertion {
                        message: param(0, 8).unwrap_or(0),
                        file: param(1, 8).unwrap_or(0),
                        line: param(2, 4).unwrap_or(0) as u32,
                        function: param(3, 8).unwrap_or(0),
                        block: ctaid,
                        thread: [w.tid[0][l], w.tid[1][l], w.tid[2][l]],
                    };
                    let mut read = |a: u64, buf: &mut [u8]| {
                        self.read(w, shared, Space::Generic, l, a, buf, inst.line)
                            .is_ok()
                    };
                    if let Some(sink) = self.limits.print {
                        sink.print(&failed.text(&mut read));
                    }
                }
                Err(ExecError::Assert(inst.line))
            }
            _ => Err(ExecError::Unsupported {
                what: "call of a function the module does not define",
                line: inst.line,
            }),
        }
    }

    fn copy_ret(&self, w: &mut Warp, l: usize, f: &Frame, line: u32) -> Result<(), ExecError> {
        let callee = &self.m.funcs[f.func as usize];
        let Some(call) = f
            .ret_pc
            .checked_sub(1)
            .and_then(|pc| self.m.code.get(pc as usize))
        else {
            return Ok(());
        };
        if let (Op::Call { ret: Some(dst), .. }, Some((src, size))) = (&call.op, callee.ret) {
            let ps = self.m.param_size as usize;
            let (s, d, n) = (src as usize, *dst as usize, size as usize);
            if s + n > ps || d + n > ps {
                return Err(illegal(s as u64, size, line));
            }
            w.pmem[l * ps..(l + 1) * ps].copy_within(s..s + n, d);
        }
        Ok(())
    }

    #[inline(always)]
    fn fetch(&self, w: &Warp, s: Src, ctaid: [u32; 3], out: &mut [u64; 32]) {
        match s {
            Src::Reg(r) => copy_row(out, w.row(r)),
            Src::Imm(v) => *out = [v; 32],
            Src::Sreg(sr) => match sr {
                Sreg::Tid(d) => {
                    for (o, &t) in out.iter_mut().zip(&w.tid[d as usize]) {
                        *o = t as u64;
                    }
                }
                Sreg::LaneId
                | Sreg::LaneMaskEq
                | Sreg::LaneMaskLt
                | Sreg::LaneMaskLe
                | Sreg::LaneMaskGt
                | Sreg::LaneMaskGe => {
                    for (l, o) in out.iter_mut().enumerate() {
                        *o = self.sreg(w, sr, l, ctaid);
                    }
                }
                // The same for every lane: computed once.
                _ => *out = [self.sreg(w, sr, 0, ctaid); 32],
            },
        }
    }

    /// An operand's 32 lanes: a register row in place, or `tmp` filled.
    #[inline(always)]
    fn opnd<'x>(
        &self,
        w: &'x Warp,
        s: Src,
        ctaid: [u32; 3],
        tmp: &'x mut [u64; 32],
    ) -> &'x [u64; 32] {
        match s {
            Src::Reg(r) => w.row(r),
            _ => {
                self.fetch(w, s, ctaid, tmp);
                tmp
            }
        }
    }

    fn sreg(&self, w: &Warp, s: Sreg, l: usize, ctaid: [u32; 3]) -> u64 {
        let lm = |f: fn(u32) -> u32| f(l as u32) as u64;
        match s {
            Sreg::Tid(d) => w.tid[d as usize][l] as u64,
            Sreg::Ntid(d) => self.cfg.block[d as usize] as u64,
            Sreg::Ctaid(d) => ctaid[d as usize] as u64,
            Sreg::Nctaid(d) => self.cfg.grid[d as usize] as u64,
            Sreg::LaneId => l as u64,
            Sreg::WarpId => w.wid as u64,
            Sreg::NWarpId => self.nwarps as u64,
            Sreg::SmId | Sreg::GridId => 0,
            Sreg::NSmId => self.cfg.workers.max(1) as u64,
            Sreg::Clock => self.start.elapsed().as_nanos() as u32 as u64,
            Sreg::Clock64 => self.start.elapsed().as_nanos() as u64,
            Sreg::GlobalTimer => SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            Sreg::LaneMaskEq => lm(|l| 1 << l),
            Sreg::LaneMaskLt => lm(|l| (1u32 << l) - 1),
            Sreg::LaneMaskLe => lm(|l| ((1u64 << (l + 1)) - 1) as u32),
            Sreg::LaneMaskGt => lm(|l| !(((1u64 << (l + 1)) - 1) as u32)),
            Sreg::LaneMaskGe => lm(|l| !((1u32 << l) - 1)),
            Sreg::DynSmem => self.cfg.shared_dyn as u64,
            Sreg::EnvReg(n) => self.envreg[n as usize & 31],
            Sreg::TotalSmem => self.kernel_shared,
            Sreg::ReservedBegin | Sreg::Reserved(0) => self.reserved,
            Sreg::Reserved(_) => self.reserved + RESERVED_SMEM / 2,
            Sreg::ReservedEnd => self.reserved + RESERVED_SMEM,
            Sreg::ReservedCap => RESERVED_SMEM,
        }
    }

    /// Offset in the block's shared memory of `[addr, addr+size)`.
    #[inline(always)]
    fn shared_off(&self, addr: u64, size: usize) -> Option<usize> {
        let off = if addr >= EXTERN_SHARED as u64 {
            (addr - EXTERN_SHARED as u64).checked_add(self.dyn_base)?
        } else if addr + size as u64 <= self.static_end {
            addr
        } else {
            return None;
        };
        (off.checked_add(size as u64)? <= self.shared_len as u64).then_some(off as usize)
    }

    /// Resolves a generic address to its space and the address within it.
    #[inline(always)]
    fn classify(addr: u64) -> (Space, u64) {
        if addr >= STATIC_WINDOW {
            let within = |base: u64| addr >= base && addr - base < WINDOW_SIZE;
            if within(SHARED_WINDOW) {
                return (Space::Shared, addr - SHARED_WINDOW);
            }
            if within(LOCAL_WINDOW) {
                return (Space::Local, addr - LOCAL_WINDOW);
            }
            if in_statics(addr) {
                return (Space::Const, addr);
            }
        }
        (Space::Global, addr)
    }

    /// Where an access of `size` bytes at `addr` in `space` goes: the
    /// space (a generic address resolved), the address within it and the
    /// error the access fails with.
    #[inline(always)]
    fn target(space: Space, addr: u64, size: usize, line: u32) -> (Space, u64, ExecError) {
        let ill = illegal(addr, size as u32, line);
        let (space, a) = if space == Space::Generic {
            Self::classify(addr)
        } else {
            (space, addr)
        };
        (space, a, ill)
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        w: &Warp,
        shared: &[u8],
        space: Space,
        l: usize,
        addr: u64,
        buf: &mut [u8],
        line: u32,
    ) -> Result<(), ExecError> {
        let n = buf.len();
        let (space, a, ill) = Self::target(space, addr, n, line);
        let (ls, ps) = (self.m.local_size as usize, self.m.param_size as usize);
        let src = match space {
            Space::Shared => self.shared_off(a, n).and_then(|o| shared.get(o..o + n)),
            Space::Local => slot(l, ls, a, n).and_then(|r| w.local.get(r)),
            Space::Param => slot(l, ps, a, n).and_then(|r| w.pmem.get(r)),
            Space::KParam => slot(0, self.params.len(), a, n).and_then(|r| self.params.get(r)),
            _ if in_statics(a) => {
                return match self.limits.statics {
                    Some(base) => self.mem.read(relocate(base, a), buf),
                    None => self.statics.read(a, buf),
                }
                .map_err(|_| ill)
            }
            Space::Const => None,
            _ => return self.mem.read(a, buf).map_err(|_| ill),
        };
        buf.copy_from_slice(src.ok_or(ill)?);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        w: &mut Warp,
        shared: &mut [u8],
        space: Space,
        l: usize,
        addr: u64,
        buf: &[u8],
        line: u32,
    ) -> Result<(), ExecError> {
        let n = buf.len();
        let (space, a, ill) = Self::target(space, addr, n, line);
        let (ls, ps) = (self.m.local_size as usize, self.m.param_size as usize);
        let dst = match space {
            Space::Shared => self.shared_off(a, n).and_then(|o| shared.get_mut(o..o + n)),
            Space::Local => slot(l, ls, a, n).and_then(|r| w.local.get_mut(r)),
            Space::Param => slot(l, ps, a, n).and_then(|r| w.pmem.get_mut(r)),
            // `st` has no `.const`: a generic address of the module's
            // variables (`.global` or `.const`) classifies as Const, and
            // is written like the device memory it is on a GPU.
            Space::KParam => None,
            _ if in_statics(a) => {
                return match self.limits.statics {
                    Some(base) => self.mem.write(relocate(base, a), buf),
                    None => self.statics.write(a, buf),
                }
                .map_err(|_| ill)
            }
            _ => return self.mem.write(a, buf).map_err(|_| ill),
        };
        dst.ok_or(ill)?.copy_from_slice(buf);
        Ok(())
    }

    /// `tex`, `suld`, `sust`, `txq` and `suq` of the lanes of `mask`:
    /// each lane's handle names a descriptor in device memory
    /// ([`crate::texture`]), read once per distinct handle. Not inlined:
    /// kept out of `exec`'s hot arms.
    #[inline(never)]
    fn texture(
        &self,
        op: &Op,
        w: &mut Warp,
        mask: u32,
        ctaid: [u32; 3],
        line: u32,
    ) -> Result<(), ExecError> {
        use crate::texture::{Descriptor, TexFault};
        let fault = |e: TexFault, at: u64| match e {
            TexFault::BadHandle(h) => illegal(h, crate::texture::DESCRIPTOR_BYTES as u32, line),
            TexFault::Memory(f) => illegal(f.addr, f.len as u32, line),
            TexFault::OutOfRange => illegal(at, 0, line),
        };
        let (handle, surface) = match *op {
            Op::Tex { handle, .. }
            | Op::Txq {
                handle,
                surface: false,
                ..
            } => (handle, false),
            Op::Suld { handle, .. } | Op::Sust { handle, .. } | Op::Txq { handle, .. } => {
                (handle, true)
            }
            _ => return Ok(()),
        };
        let mut h = [0u64; 32];
        self.fetch(w, handle, ctaid, &mut h);
        let coords = match *op {
            Op::Tex { c, .. } | Op::Suld { c, .. } | Op::Sust { c, .. } => c,
            _ => [Src::Imm(0); 4],
        };
        let mut c = [[0u64; 32]; 4];
        for (row, src) in c.iter_mut().zip(coords) {
            self.fetch(w, src, ctaid, row);
        }
        let mut vals = [[0u64; 32]; 4];
        if let Op::Sust { v, .. } = *op {
            for (row, src) in vals.iter_mut().zip(v) {
                self.fetch(w, src, ctaid, row);
            }
        }
        let mut out = [[0u64; 32]; 4];
        let mut cached: Option<(u64, Descriptor)> = None;
        for l in lanes(mask) {
            let d = match cached {
                Some((at, d)) if at == h[l] => d,
                _ => {
                    let d =
                        Descriptor::load(self.mem, h[l], surface).map_err(|e| fault(e, h[l]))?;
                    cached = Some((h[l], d));
                    d
                }
            };
            // The layer, if any, comes first; the coordinates follow.
            let split = |geom: Geom| -> (i32, [u64; 3]) {
                let k = usize::from(geom.layered());
                let layer = if geom.layered() {
                    c[0][l] as u32 as i32
                } else {
                    0
                };
                let mut xyz = [0u64; 3];
                for (i, x) in xyz.iter_mut().enumerate().take(geom.dims()) {
                    *x = c[k + i][l];
                }
                (layer, xyz)
            };
            match *op {
                Op::Tex {
                    geom, int_coords, ..
                } => {
                    let (layer, xyz) = split(geom);
                    let r = if geom.cube() {
                        d.sample_cube(self.mem, layer, xyz.map(|x| f32::from_bits(x as u32)))
                    } else if int_coords {
                        d.fetch(self.mem, geom.dims(), layer, xyz.map(|x| x as u32 as i32))
                    } else {
                        d.sample(
                            self.mem,
                            geom.dims(),
                            layer,
                            xyz.map(|x| f32::from_bits(x as u32)),
                        )
                    }
                    .map_err(|e| fault(e, h[l]))?;
                    for (o, v) in out.iter_mut().zip(r) {
                        o[l] = u64::from(v);
                    }
                }
                Op::Suld {
                    geom, ty, n, mode, ..
                }
                | Op::Sust {
                    geom, ty, n, mode, ..
                } => {
                    let (layer, xyz) = split(geom);
                    let mut at = xyz.map(|x| x as u32 as i32);
                    if geom.layered() {
                        at[2] = layer;
                    }
                    let size = u64::from(ty.bytes());
                    let total = size * u64::from(n);
                    let Some(addr) = d
                        .surface_at(geom.dims(), at, total, mode)
                        .map_err(|e| fault(e, d.addr.wrapping_add(xyz[0])))?
                    else {
                        // `.zero`: loads read zero, stores are dropped.
                        continue;
                    };
                    let ill = illegal(addr, total as u32, line);
                    let mut buf = [0u8; 32];
                    let bytes = &mut buf[..total as usize];
                    if matches!(op, Op::Suld { .. }) {
                        self.mem.read(addr, bytes).map_err(|_| ill)?;
                        for (k, o) in out.iter_mut().enumerate().take(n as usize) {
                            let mut word = [0u8; 8];
                            word[..size as usize].copy_from_slice(
                                &bytes[k * size as usize..(k + 1) * size as usize],
                            );
                            o[l] = u64::from_le_bytes(word);
                        }
                    } else {
                        for (k, v) in vals.iter().enumerate().take(n as usize) {
                            bytes[k * size as usize..(k + 1) * size as usize]
                                .copy_from_slice(&v[l].to_le_bytes()[..size as usize]);
                        }
                        self.mem.write(addr, bytes).map_err(|_| ill)?;
                    }
                }
                Op::Txq { query, .. } => out[0][l] = u64::from(d.query(query)),
                _ => {}
            }
        }
        match *op {
            Op::Tex { d, .. } => {
                for (dk, row) in d.iter().zip(&out) {
                    w.put(*dk, mask, row);
                }
            }
            Op::Suld { d, n, .. } => {
                for (dk, row) in d.iter().zip(&out).take(n as usize) {
                    w.put(*dk, mask, row);
                }
            }
            Op::Txq { d, .. } => w.put(d, mask, &out[0]),
            _ => {}
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &self,
        shared: &mut [u8],
        space: Space,
        addr: u64,
        op: AtomicOp,
        b: u64,
        c: u64,
        line: u32,
    ) -> Result<u64, ExecError> {
        let n = op.size();
        let (space, a, ill) = Self::target(space, addr, n, line);
        match space {
            Space::Shared => {
                let o = self.shared_off(a, n).filter(|o| o % n == 0).ok_or(ill)?;
                let mut w = [0u8; 8];
                w[..n].copy_from_slice(&shared[o..o + n]);
                let old = u64::from_le_bytes(w);
                let new = op.apply(old, b, c);
                shared[o..o + n].copy_from_slice(&new.to_le_bytes()[..n]);
                Ok(old)
            }
            Space::Global | Space::Const if in_statics(a) => match self.limits.statics {
                Some(base) => self.mem.atomic(relocate(base, a), op, b, c),
                None => self.statics.atomic(a, op, b, c),
            }
            .map_err(|_| ill),
            Space::Global | Space::Const => self.mem.atomic(a, op, b, c).map_err(|_| ill),
            _ => Err(ExecError::Unsupported {
                what: "atomics on local or parameter memory",
                line,
            }),
        }
    }

    /// A whole warp's 4-byte shared loads at `a[l] + koff`, the hot path
    /// of tiled kernels: one range check per lane; the address of the
    /// first one outside shared memory is the error. Not inlined: in
    /// `exec` the loop would share the registers of every other arm.
    #[inline(never)]
    #[allow(clippy::needless_range_loop)]
    fn ld_shared_warp(
        &self,
        shared: &[u8],
        a: &[u64; 32],
        koff: u64,
        out: &mut [u64; 32],
    ) -> Result<(), u64> {
        let lim = self.static_end.saturating_sub(4);
        for l in 0..32 {
            let at = a[l].wrapping_add(koff);
            let off = if at <= lim {
                at as usize
            } else {
                self.shared_off(at, 4).ok_or(at)?
            };
            let bytes = shared.get(off..off + 4).ok_or(at)?;
            out[l] = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as u64;
        }
        Ok(())
    }

    /// Each lane's base address of `addr` (its register, or zero) into
    /// `out`, failing on a lane whose address is not a multiple of `align`.
    #[inline(always)]
    fn bases(
        w: &Warp,
        addr: Addr,
        mask: u32,
        align: usize,
        line: u32,
        out: &mut [u64; 32],
    ) -> Result<(), ExecError> {
        match addr.base {
            Some(r) => copy_row(out, w.row(r)),
            None => *out = [0; 32],
        }
        check_align(out, addr.off as u64, mask, align, line)
    }

    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        inst: &Inst,
        w: &mut Warp,
        mask: u32,
        ctaid: [u32; 3],
        shared: &mut [u8],
        s: &mut Scratch,
    ) -> Result<(), ExecError> {
        // Operands that are not registers, and results, live in the
        // caller's scratch rows: no per-instruction zeroing of five arrays.
        let Scratch {
            a: ta,
            b: tb,
            c: tc,
            d: out,
            e: te,
        } = s;
        let line = inst.line;
        // Operands' rows, as `opnd` gives them: `opnds!(a => ta, ...)`.
        macro_rules! opnds {
            ($($src:ident => $tmp:ident),+) => {
                [$(self.opnd(w, $src, ctaid, $tmp)),+]
            };
        }
        match inst.op {
            Op::Un { op, ty, d, a } => {
                let a = self.opnd(w, a, ctaid, ta);
                un(op, ty, a, out);
                w.put(d, mask, out);
            }
            Op::Bin { op, ty, d, a, b } => {
                let [a, b] = opnds!(a => ta, b => tb);
                bin(op, ty, a, b, out);
                w.put(d, mask, out);
            }
            Op::Fx {
                op,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
                c,
            } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                fx(op, ty, rnd, ftz, sat, a, b, c, out);
                w.put(d, mask, out);
            }
            Op::MulWide { ty, d, a, b } => {
                let [a, b] = opnds!(a => ta, b => tb);
                let bits = ty.bits();
                let m2 = mask_of(bits * 2);
                if ty.signed() {
                    map2(out, a, b, |x, y| {
                        (sx(x, bits).wrapping_mul(sx(y, bits)) as u64) & m2
                    });
                } else {
                    let m = mask_of(bits);
                    map2(out, a, b, |x, y| ((x & m).wrapping_mul(y & m)) & m2);
                }
                w.put(d, mask, out);
            }
            Op::Mad { op, ty, d, a, b, c } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                let bits = ty.bits();
                let m = mask_of(bits);
                match op {
                    MadOp::Fma => match ty {
                        Ty::F32 => fma_f32(a, b, c, out),
                        Ty::F64 => fma_f64(a, b, c, out),
                        _ => map3(out, a, b, c, |x, y, z| {
                            fput(ty, fget(ty, x).mul_add(fget(ty, y), fget(ty, z)))
                        }),
                    },
                    MadOp::Lo => map3(out, a, b, c, |x, y, z| {
                        x.wrapping_mul(y).wrapping_add(z) & m
                    }),
                    MadOp::Hi => map3(out, a, b, c, |x, y, z| mul_hi(ty, x, y).wrapping_add(z) & m),
                    MadOp::Wide => {
                        let m2 = mask_of(bits * 2);
                        if ty.signed() {
                            map3(out, a, b, c, |x, y, z| {
                                (sx(x, bits).wrapping_mul(sx(y, bits)) as u64).wrapping_add(z) & m2
                            });
                        } else {
                            map3(out, a, b, c, |x, y, z| {
                                ((x & m).wrapping_mul(y & m)).wrapping_add(z) & m2
                            });
                        }
                    }
                    MadOp::Mad24Lo => {
                        map3(out, a, b, c, |x, y, z| mul24(ty, x, y).wrapping_add(z) & m)
                    }
                }
                w.put(d, mask, out);
            }
            Op::Setp {
                cmp,
                ty,
                d,
                d2,
                a,
                b,
                comb,
            } => {
                let [a, b] = opnds!(a => ta, b => tb);
                setp(cmp, ty, a, b, out);
                if let Some((bop, c, neg)) = comb {
                    let c = self.opnd(w, c, ctaid, tc);
                    let n = neg as u64;
                    let mut d2v = [0u64; 32];
                    for l in 0..32 {
                        let p = (c[l] & 1) ^ n;
                        let r = out[l];
                        let nr = r ^ 1;
                        let f = |v: u64| match bop {
                            BoolOp::And => v & p,
                            BoolOp::Or => v | p,
                            BoolOp::Xor => v ^ p,
                        };
                        out[l] = f(r);
                        d2v[l] = f(nr);
                    }
                    if let Some(r2) = d2 {
                        w.put(r2, mask, &d2v);
                    }
                } else if let Some(r2) = d2 {
                    let mut d2v = [0u64; 32];
                    map1(&mut d2v, out, |x| x ^ 1);
                    w.put(r2, mask, &d2v);
                }
                if let Some(r) = d {
                    w.put(r, mask, out);
                }
            }
            Op::Selp { ty, d, a, b, c } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                let m = mask_of(ty.bits());
                map3(
                    out,
                    a,
                    b,
                    c,
                    |x, y, p| if p & 1 != 0 { x & m } else { y & m },
                );
                w.put(d, mask, out);
            }
            Op::Cvt {
                dty,
                sty,
                rnd,
                sat,
                ftz,
                dbits,
                d,
                a,
            } => {
                let a = self.opnd(w, a, ctaid, ta);
                map1(out, a, |x| cvt(dty, sty, rnd, sat, ftz, dbits, x));
                w.put(d, mask, out);
            }
            Op::Cvta { to, space, d, a } => {
                let a = self.opnd(w, a, ctaid, ta);
                let win = match space {
                    Space::Shared => SHARED_WINDOW,
                    Space::Local => LOCAL_WINDOW,
                    _ => 0,
                };
                if to {
                    map1(out, a, |x| x.wrapping_sub(win));
                } else {
                    map1(out, a, |x| x.wrapping_add(win));
                }
                w.put(d, mask, out);
            }
            Op::Ld {
                space,
                ty,
                n,
                d,
                dbits,
                addr,
            } => {
                let size = ty.bytes() as usize;
                // A copy: a loaded register may be the address's base.
                Self::bases(w, addr, mask, size * n as usize, line, ta)?;
                let a = &*ta;
                for (k, &dk) in d.iter().enumerate().take(n as usize) {
                    let koff = addr.off.wrapping_add((k * size) as i64) as u64;
                    if addr.base.is_none() && matches!(space, Space::KParam | Space::Const) {
                        // A uniform address (a parameter, a constant): read once.
                        let l = mask.trailing_zeros() as usize;
                        let mut buf = [0u8; 8];
                        self.read(w, shared, space, l, koff, &mut buf[..size], line)?;
                        *out = [u64::from_le_bytes(buf); 32];
                    } else if space == Space::Shared && size == 4 && mask == FULL {
                        self.ld_shared_warp(shared, a, koff, out)
                            .map_err(|at| illegal(at, 4, line))?;
                    } else if space == Space::Shared && size == 4 {
                        for l in lanes(mask) {
                            let at = a[l].wrapping_add(koff);
                            let o = self.shared_off(at, 4).ok_or_else(|| illegal(at, 4, line))?;
                            let b = [shared[o], shared[o + 1], shared[o + 2], shared[o + 3]];
                            out[l] = u32::from_le_bytes(b) as u64;
                        }
                    } else {
                        for l in lanes(mask) {
                            let at = a[l].wrapping_add(koff);
                            let mut buf = [0u8; 8];
                            self.read(w, shared, space, l, at, &mut buf[..size], line)?;
                            out[l] = u64::from_le_bytes(buf);
                        }
                    }
                    let bits = size as u32 * 8;
                    if ty.signed() && bits < dbits {
                        // A narrow signed load sign-extends to the registers.
                        let dm = mask_of(dbits);
                        for l in lanes(mask) {
                            out[l] = (sx(out[l], bits) as u64) & dm;
                        }
                    }
                    w.put(dk, mask, out);
                }
            }
            Op::St {
                space,
                ty,
                n,
                v,
                addr,
            } => {
                let size = ty.bytes() as usize;
                Self::bases(w, addr, mask, size * n as usize, line, ta)?;
                for (k, &sv) in v.iter().enumerate().take(n as usize) {
                    // A copy: the writes need the warp.
                    self.fetch(w, sv, ctaid, tb);
                    let koff = addr.off.wrapping_add((k * size) as i64) as u64;
                    for l in lanes(mask) {
                        let at = ta[l].wrapping_add(koff);
                        if space == Space::Shared && size == 4 {
                            let o = self.shared_off(at, 4).ok_or_else(|| illegal(at, 4, line))?;
                            shared[o..o + 4].copy_from_slice(&(tb[l] as u32).to_le_bytes());
                        } else {
                            let bytes = &tb[l].to_le_bytes()[..size];
                            self.write(w, shared, space, l, at, bytes, line)?;
                        }
                    }
                }
            }
            Op::Atom {
                space,
                op,
                d,
                addr,
                b,
                c,
            } => {
                Self::bases(w, addr, mask, op.size(), line, ta)?;
                let [b, c] = opnds!(b => tb, c => tc);
                for l in lanes(mask) {
                    let at = ta[l].wrapping_add(addr.off as u64);
                    out[l] = self.atomic(shared, space, at, op, b[l], c[l], line)?;
                }
                if let Some(r) = d {
                    w.put(r, mask, out);
                }
            }
            Op::Shfl {
                mode,
                d,
                dp,
                a,
                b,
                c,
            } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                let mut p = [0u64; 32];
                for l in 0..32i32 {
                    let li = l as usize;
                    let bval = (b[li] & 0x1f) as i32;
                    let cval = (c[li] & 0x1f) as i32;
                    let seg = ((c[li] >> 8) & 0x1f) as i32;
                    let max_lane = (l & seg) | (cval & !seg);
                    let min_lane = l & seg;
                    let (j, ok) = match mode {
                        ShflMode::Up => (l - bval, l - bval >= max_lane),
                        ShflMode::Down => (l + bval, l + bval <= max_lane),
                        ShflMode::Bfly => (l ^ bval, (l ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !seg);
                            (j, j <= max_lane)
                        }
                    };
                    let j = if ok && (0..32).contains(&j) { j } else { l };
                    out[li] = a[j as usize] & 0xffff_ffff;
                    p[li] = ok as u64;
                }
                w.put(d, mask, out);
                if let Some(r) = dp {
                    w.put(r, mask, &p);
                }
            }
            Op::Vote { mode, d, a, neg } => {
                let bal = ballot(self.opnd(w, a, ctaid, ta), neg) & mask;
                let r = match mode {
                    VoteMode::Ballot => bal as u64,
                    VoteMode::All => (bal == mask) as u64,
                    VoteMode::Any => (bal != 0) as u64,
                    VoteMode::Uni => (bal == mask || bal == 0) as u64,
                };
                w.put(d, mask, &[r; 32]);
            }
            Op::Carry {
                op,
                ty,
                cin,
                cout,
                d,
                a,
                b,
                c,
            } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                let bits = ty.bits();
                let m = mask_of(bits) as u128;
                let cf = w.row(CARRY_REG);
                let mut co = [0u64; 32];
                for l in 0..32 {
                    let ci = if cin { (cf[l] & 1) as u128 } else { 0 };
                    let (x, y, z) = (a[l] as u128 & m, b[l] as u128 & m, c[l] as u128 & m);
                    let (r, carry) = match op {
                        CarryOp::Add => {
                            let s = x + y + ci;
                            (s & m, (s >> bits) & 1)
                        }
                        CarryOp::Sub => {
                            let borrow = (y + ci) > x;
                            (x.wrapping_sub(y + ci) & m, borrow as u128)
                        }
                        CarryOp::MadLo | CarryOp::MadHi => {
                            let p = x * y;
                            let p = if op == CarryOp::MadHi {
                                p >> bits
                            } else {
                                p & m
                            };
                            let s = p + z + ci;
                            (s & m, (s >> bits) & 1)
                        }
                    };
                    out[l] = r as u64;
                    co[l] = carry as u64;
                }
                w.put(d, mask, out);
                if cout {
                    w.put(CARRY_REG, mask, &co);
                }
            }
            Op::Redux { op, ty, d, a } => {
                let a = self.opnd(w, a, ctaid, ta);
                let mut active = lanes(mask);
                let first = active.next().map_or(0, |l| a[l]);
                let r = active.fold(first, |acc, l| int_bin(op, ty, acc, a[l]));
                w.put(d, mask, &[r; 32]);
            }
            Op::Match {
                all,
                bits,
                d,
                dp,
                a,
            } => {
                let a = self.opnd(w, a, ctaid, ta);
                let vm = mask_of(bits);
                let mut p = [0u64; 32];
                for l in 0..32 {
                    let same = lanes(mask)
                        .filter(|&k| a[k] & vm == a[l] & vm)
                        .fold(0u32, |s, k| s | 1 << k);
                    if all {
                        let ok = same == mask;
                        out[l] = if ok { mask as u64 } else { 0 };
                        p[l] = ok as u64;
                    } else {
                        out[l] = same as u64;
                    }
                }
                w.put(d, mask, out);
                if let Some(r) = dp {
                    w.put(r, mask, &p);
                }
            }
            Op::Elect { d, dp } => {
                let leader = mask.trailing_zeros() as usize;
                w.put(d, mask, &[leader as u64; 32]);
                if let Some(r) = dp {
                    let mut p = [0u64; 32];
                    p[leader.min(31)] = 1;
                    w.put(r, mask, &p);
                }
            }
            Op::Isspacep { space, d, a } => {
                let a = self.opnd(w, a, ctaid, ta);
                map1(out, a, |x| {
                    let (sp, _) = Self::classify(x);
                    (match space {
                        Space::Global => sp == Space::Global || sp == Space::Const,
                        Space::Shared => sp == Space::Shared,
                        Space::Local => sp == Space::Local,
                        Space::Const => sp == Space::Const,
                        _ => false,
                    }) as u64
                });
                w.put(d, mask, out);
            }
            Op::Activemask { d } => w.put(d, mask, &[mask as u64; 32]),
            Op::Bfe { ty, d, a, b, c } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                let bits = ty.bits();
                map3(out, a, b, c, |x, p, n| bfe(ty, bits, x, p & 0xff, n & 0xff));
                w.put(d, mask, out);
            }
            Op::Bfi { ty, d, a, b, c, e } => {
                let [a, b, c, e] = opnds!(a => ta, b => tb, c => tc, e => te);
                let bits = ty.bits() as u64;
                for l in 0..32 {
                    let pos = c[l] & 0xff;
                    let len = e[l] & 0xff;
                    out[l] = if len == 0 || pos >= bits {
                        b[l]
                    } else {
                        let len = len.min(bits - pos);
                        let fm = mask_of(len as u32) << pos;
                        ((b[l] & !fm) | ((a[l] << pos) & fm)) & mask_of(bits as u32)
                    };
                }
                w.put(d, mask, out);
            }
            Op::Prmt { d, a, b, c } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                map3(out, a, b, c, |x, y, s| {
                    let v = (x & 0xffff_ffff) | ((y & 0xffff_ffff) << 32);
                    let mut r = 0u64;
                    for i in 0..4 {
                        let sel = (s >> (4 * i)) & 0xf;
                        let byte = (v >> ((sel & 7) * 8)) & 0xff;
                        let byte = if sel & 8 != 0 {
                            if byte & 0x80 != 0 {
                                0xff
                            } else {
                                0
                            }
                        } else {
                            byte
                        };
                        r |= byte << (8 * i);
                    }
                    r
                });
                w.put(d, mask, out);
            }
            Op::Lop3 { d, a, b, c, lut } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                map3(out, a, b, c, |x, y, z| {
                    let mut r = 0u64;
                    for i in 0..8 {
                        if lut >> i & 1 != 0 {
                            r |= (if i & 4 != 0 { x } else { !x })
                                & (if i & 2 != 0 { y } else { !y })
                                & (if i & 1 != 0 { z } else { !z });
                        }
                    }
                    r & 0xffff_ffff
                });
                w.put(d, mask, out);
            }
            Op::Shf {
                left,
                wrap,
                d,
                a,
                b,
                c,
            } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                map3(out, a, b, c, |x, y, s| {
                    let n = if wrap {
                        s & 31
                    } else {
                        s.min(32) & 0xffff_ffff
                    };
                    let v = (x & 0xffff_ffff) | ((y & 0xffff_ffff) << 32);
                    if left {
                        ((v << n) >> 32) & 0xffff_ffff
                    } else {
                        (v >> n) & 0xffff_ffff
                    }
                });
                w.put(d, mask, out);
            }
            Op::Testp { op, ty, d, a } => {
                let a = self.opnd(w, a, ctaid, ta);
                map1(out, a, |x| {
                    let v = fget(ty, x);
                    let sub = if ty == Ty::F64 {
                        v.is_subnormal()
                    } else {
                        (v as f32).is_subnormal()
                    };
                    (match op {
                        TestOp::Finite => v.is_finite(),
                        TestOp::Infinite => v.is_infinite(),
                        TestOp::Number => !v.is_nan(),
                        TestOp::NotANumber => v.is_nan(),
                        TestOp::Normal => v.is_normal() && !sub,
                        TestOp::Subnormal => sub,
                    }) as u64
                });
                w.put(d, mask, out);
            }
            Op::Pack { bits, d, ref parts } => {
                let pm = mask_of(bits);
                *out = [0; 32];
                for (i, &p) in parts.iter().enumerate() {
                    let p = self.opnd(w, p, ctaid, ta);
                    for (o, &x) in out.iter_mut().zip(p) {
                        *o |= (x & pm) << (i as u32 * bits);
                    }
                }
                w.put(d, mask, out);
            }
            Op::Unpack { bits, ref d, a } => {
                // A copy: the parts' registers are written one by one.
                self.fetch(w, a, ctaid, ta);
                let pm = mask_of(bits);
                for (i, r) in d.iter().enumerate() {
                    if let Some(r) = r {
                        map1(out, ta, |x| (x >> (i as u32 * bits)) & pm);
                        w.put(*r, mask, out);
                    }
                }
            }
            // The rarer families run out of line: inlined here, their
            // loops would cost every other instruction registers.
            Op::Bmsk { clamp, d, a, b } => {
                let [a, b] = opnds!(a => ta, b => tb);
                bmsk_rows(clamp, a, b, out);
                w.put(d, mask, out);
            }
            Op::Half {
                op,
                ty,
                lanes,
                ftz,
                sat,
                relu,
                d,
                a,
                b,
                c,
            } => {
                let [a, b, c] = opnds!(a => ta, b => tb, c => tc);
                half_rows(op, ty, lanes, [ftz, sat, relu], [a, b, c], out);
                w.put(d, mask, out);
            }
            Op::Set {
                cmp,
                sty,
                dty,
                packed,
                comb,
                d,
                a,
                b,
            } => {
                let c = comb.map(|(bop, c, neg)| {
                    self.fetch(w, c, ctaid, tc);
                    (bop, neg)
                });
                let [a, b] = opnds!(a => ta, b => tb);
                set_rows(
                    cmp,
                    sty,
                    dty,
                    packed,
                    c.map(|(bop, neg)| (bop, neg, &*tc)),
                    a,
                    b,
                    out,
                );
                w.put(d, mask, out);
            }
            Op::CvtPack { ty, relu, d, a, b } => {
                let [a, b] = opnds!(a => ta, b => tb);
                cvt_pack_rows(ty, relu, a, b, out);
                w.put(d, mask, out);
            }
            Op::Tex { .. } | Op::Suld { .. } | Op::Sust { .. } | Op::Txq { .. } => {
                self.texture(&inst.op, w, mask, ctaid, line)?
            }
            Op::Nop => {}
            Op::Refused(i) => return Err(self.refused(i, line)),
            Op::Bra { .. }
            | Op::Call { .. }
            | Op::Ret
            | Op::Exit
            | Op::Bar
            | Op::BarRed { .. }
            | Op::Trap => {}
        }
        Ok(())
    }
}

/// Fused multiply-adds of 32 lanes, `lane` being one lane's. Without the
/// CPU's FMA instructions `mul_add` is a library call per lane; with them,
/// a few vector instructions: worth a run-time check.
#[inline(always)]
fn fma_rows(
    a: &[u64; 32],
    b: &[u64; 32],
    c: &[u64; 32],
    d: &mut [u64; 32],
    lane: impl Fn(u64, u64, u64) -> u64,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the only requirement of `fma_rows_x86` is the FMA
        // extension, which the CPU was just found to have.
        unsafe { fma_rows_x86(a, b, c, d, lane) };
        return;
    }
    map3(d, a, b, c, lane);
}

/// [`map3`] compiled for the FMA extension: `lane`, inlined here, gets
/// the fused instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn fma_rows_x86(
    a: &[u64; 32],
    b: &[u64; 32],
    c: &[u64; 32],
    d: &mut [u64; 32],
    lane: impl Fn(u64, u64, u64) -> u64,
) {
    map3(d, a, b, c, lane);
}

fn fma_f32(a: &[u64; 32], b: &[u64; 32], c: &[u64; 32], d: &mut [u64; 32]) {
    fma_rows(a, b, c, d, |x, y, z| {
        f32b(f32v(x).mul_add(f32v(y), f32v(z)))
    });
}

fn fma_f64(a: &[u64; 32], b: &[u64; 32], c: &[u64; 32], d: &mut [u64; 32]) {
    fma_rows(a, b, c, d, |x, y, z| {
        f64v(x).mul_add(f64v(y), f64v(z)).to_bits()
    });
}

/// Fails on the first active lane whose `base + off` is not a multiple of
/// `align` (a power of two).
#[inline(always)]
fn check_align(
    base: &[u64; 32],
    off: u64,
    mask: u32,
    align: usize,
    line: u32,
) -> Result<(), ExecError> {
    let low = align as u64 - 1;
    if low == 0 {
        return Ok(());
    }
    let mut bad = 0u64;
    for (l, &b) in base.iter().enumerate() {
        bad |= (b.wrapping_add(off) & low) * ((mask >> l) & 1) as u64;
    }
    if bad == 0 {
        return Ok(());
    }
    let lane = (0..32)
        .find(|&l| mask >> l & 1 != 0 && base[l].wrapping_add(off) & low != 0)
        .unwrap_or(0);
    Err(ExecError::MisalignedAddress {
        addr: base[lane].wrapping_add(off),
        size: align as u32,
        line,
    })
}

#[inline(always)]
fn mul_hi(ty: Ty, x: u64, y: u64) -> u64 {
    let bits = ty.bits();
    let m = mask_of(bits);
    if ty.signed() {
        (((sx(x, bits) as i128 * sx(y, bits) as i128) >> bits) as u64) & m
    } else {
        ((((x & m) as u128 * (y & m) as u128) >> bits) as u64) & m
    }
}

#[inline(always)]
fn mul24(ty: Ty, x: u64, y: u64) -> u64 {
    if ty.signed() {
        (sx(x, 24).wrapping_mul(sx(y, 24))) as u64
    } else {
        (x & 0xff_ffff).wrapping_mul(y & 0xff_ffff)
    }
}

fn un(op: UnOp, ty: Ty, a: &[u64; 32], d: &mut [u64; 32]) {
    let bits = ty.bits();
    let m = mask_of(bits);
    if ty.float()
        && !matches!(
            op,
            UnOp::Mov
                | UnOp::Not
                | UnOp::Popc
                | UnOp::Clz
                | UnOp::Brev
                | UnOp::Cnot
                | UnOp::Bfind
                | UnOp::BfindShift
        )
    {
        if ty == Ty::F32 {
            match op {
                UnOp::Neg => map1(d, a, |x| x ^ 0x8000_0000),
                UnOp::Abs => map1(d, a, |x| x & 0x7fff_ffff),
                UnOp::Sqrt => map1(d, a, |x| f32b(f32v(x).sqrt())),
                UnOp::Rcp => map1(d, a, |x| f32b(1.0 / f32v(x))),
                _ => map1(d, a, |x| fput(ty, fun(op, fget(ty, x)))),
            }
        } else {
            match op {
                UnOp::Neg => map1(d, a, |x| (x ^ (1 << (bits - 1))) & m),
                UnOp::Abs => map1(d, a, |x| x & (m >> 1)),
                _ => map1(d, a, |x| fput(ty, fun(op, fget(ty, x)))),
            }
        }
        return;
    }
    match op {
        UnOp::Mov => map1(d, a, |x| x & m),
        UnOp::Not => map1(d, a, |x| !x & m),
        UnOp::Cnot => map1(d, a, |x| (x & m == 0) as u64),
        UnOp::Neg => map1(d, a, |x| x.wrapping_neg() & m),
        UnOp::Abs => map1(d, a, |x| (sx(x, bits).wrapping_abs() as u64) & m),
        UnOp::Popc => map1(d, a, |x| (x & m).count_ones() as u64),
        UnOp::Clz => map1(d, a, |x| ((x & m).leading_zeros() - (64 - bits)) as u64),
        UnOp::Brev => map1(d, a, |x| (x & m).reverse_bits() >> (64 - bits)),
        UnOp::Bfind | UnOp::BfindShift => map1(d, a, |x| {
            // Signed values: the first bit that differs from the sign.
            let v = if ty.signed() && sx(x, bits) < 0 {
                !x & m
            } else {
                x & m
            };
            if v == 0 {
                0xffff_ffff
            } else {
                let pos = 63 - v.leading_zeros() as u64;
                if op == UnOp::BfindShift {
                    bits as u64 - 1 - pos
                } else {
                    pos
                }
            }
        }),
        _ => map1(d, a, |x| x & m),
    }
}

/// Float math: the `.approx` forms are computed exactly (within their
/// documented error by construction).
fn fun(op: UnOp, v: f64) -> f64 {
    match op {
        UnOp::Neg => -v,
        UnOp::Abs => v.abs(),
        UnOp::Rcp => 1.0 / v,
        UnOp::Sqrt => v.sqrt(),
        UnOp::Rsqrt => 1.0 / v.sqrt(),
        UnOp::Ex2 => v.exp2(),
        UnOp::Lg2 => v.log2(),
        UnOp::Sin => v.sin(),
        UnOp::Cos => v.cos(),
        UnOp::Tanh => v.tanh(),
        _ => v,
    }
}

fn bin(op: BinOp, ty: Ty, a: &[u64; 32], b: &[u64; 32], d: &mut [u64; 32]) {
    if ty == Ty::F32 {
        match op {
            BinOp::Add => map2(d, a, b, |x, y| f32b(f32v(x) + f32v(y))),
            BinOp::Sub => map2(d, a, b, |x, y| f32b(f32v(x) - f32v(y))),
            BinOp::MulLo => map2(d, a, b, |x, y| f32b(f32v(x) * f32v(y))),
            BinOp::Div => map2(d, a, b, |x, y| f32b(f32v(x) / f32v(y))),
            BinOp::Min => map2(d, a, b, |x, y| f32b(f32v(x).min(f32v(y)))),
            BinOp::Max => map2(d, a, b, |x, y| f32b(f32v(x).max(f32v(y)))),
            BinOp::Copysign => map2(d, a, b, |x, y| f32b(f32v(y).copysign(f32v(x)))),
            _ => map2(d, a, b, |x, y| int_bin(op, Ty::B32, x, y)),
        }
        return;
    }
    if ty.float() {
        if matches!(
            op,
            BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl | BinOp::Shr
        ) {
            map2(d, a, b, |x, y| {
                int_bin(op, Ty::B64, x, y) & mask_of(ty.bits())
            });
            return;
        }
        map2(d, a, b, |x, y| {
            let (u, v) = (fget(ty, x), fget(ty, y));
            let r = match op {
                BinOp::Add => u + v,
                BinOp::Sub => u - v,
                BinOp::MulLo => u * v,
                BinOp::Div => u / v,
                BinOp::Min => u.min(v),
                BinOp::Max => u.max(v),
                BinOp::Copysign => v.copysign(u),
                _ => u,
            };
            fput(ty, r)
        });
        return;
    }
    let bits = ty.bits();
    let m = mask_of(bits);
    match op {
        BinOp::Add => map2(d, a, b, |x, y| x.wrapping_add(y) & m),
        BinOp::Sub => map2(d, a, b, |x, y| x.wrapping_sub(y) & m),
        BinOp::MulLo => map2(d, a, b, |x, y| x.wrapping_mul(y) & m),
        BinOp::And => map2(d, a, b, |x, y| x & y & m),
        BinOp::Or => map2(d, a, b, |x, y| (x | y) & m),
        BinOp::Xor => map2(d, a, b, |x, y| (x ^ y) & m),
        BinOp::Shl => map2(d, a, b, |x, y| {
            if (y & 0xffff_ffff) >= bits as u64 {
                0
            } else {
                (x << y) & m
            }
        }),
        _ => map2(d, a, b, |x, y| int_bin(op, ty, x, y)),
    }
}

fn int_bin(op: BinOp, ty: Ty, x: u64, y: u64) -> u64 {
    let bits = ty.bits();
    let m = mask_of(bits);
    let s = ty.signed();
    let (xs, ys) = (sx(x, bits), sx(y, bits));
    let (xu, yu) = (x & m, y & m);
    let r = match op {
        BinOp::Add => xu.wrapping_add(yu),
        BinOp::Sub => xu.wrapping_sub(yu),
        BinOp::AddSat | BinOp::SubSat => {
            let (lo, hi) = if s {
                (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
            } else {
                (0, m as i128)
            };
            let (p, q) = if s {
                (xs as i128, ys as i128)
            } else {
                (xu as i128, yu as i128)
            };
            let v = if op == BinOp::AddSat { p + q } else { p - q };
            v.clamp(lo, hi) as u64
        }
        BinOp::MulLo => xu.wrapping_mul(yu),
        BinOp::MulHi => mul_hi(ty, x, y),
        BinOp::Mul24Lo => mul24(ty, x, y),
        BinOp::Mul24Hi => {
            let p = if s {
                (sx(x, 24) * sx(y, 24)) as u64
            } else {
                (x & 0xff_ffff) * (y & 0xff_ffff)
            };
            p >> 16
        }
        // Division by zero gives all ones and the remainder the dividend
        // (what the hardware returns); no trap.
        BinOp::Div => {
            if yu == 0 {
                m
            } else if s {
                xs.wrapping_div(ys) as u64
            } else {
                xu / yu
            }
        }
        BinOp::Rem => {
            if yu == 0 {
                xu
            } else if s {
                xs.wrapping_rem(ys) as u64
            } else {
                xu % yu
            }
        }
        BinOp::Min => {
            if s {
                xs.min(ys) as u64
            } else {
                xu.min(yu)
            }
        }
        BinOp::Max => {
            if s {
                xs.max(ys) as u64
            } else {
                xu.max(yu)
            }
        }
        BinOp::And => x & y,
        BinOp::Or => x | y,
        BinOp::Xor => x ^ y,
        BinOp::Shl => {
            let n = y & 0xffff_ffff;
            if n >= bits as u64 {
                0
            } else {
                x << n
            }
        }
        BinOp::Shr => {
            let n = y & 0xffff_ffff;
            if s {
                (xs >> n.min(63)) as u64
            } else if n >= bits as u64 {
                0
            } else {
                xu >> n
            }
        }
        BinOp::Copysign => x,
    };
    r & m
}

fn setp(cmp: Cmp, ty: Ty, a: &[u64; 32], b: &[u64; 32], d: &mut [u64; 32]) {
    // A comparison of each lane, as 0 or 1.
    #[inline(always)]
    fn map(d: &mut [u64; 32], a: &[u64; 32], b: &[u64; 32], f: impl Fn(u64, u64) -> bool) {
        map2(d, a, b, |x, y| f(x, y) as u64);
    }
    if ty.float() {
        map(d, a, b, |x, y| {
            let (u, v) = (fget(ty, x), fget(ty, y));
            let nan = u.is_nan() || v.is_nan();
            match cmp {
                Cmp::Eq => u == v,
                Cmp::Ne => !nan && u != v,
                Cmp::Lt | Cmp::Lo => u < v,
                Cmp::Le | Cmp::Ls => u <= v,
                Cmp::Gt | Cmp::Hi => u > v,
                Cmp::Ge | Cmp::Hs => u >= v,
                Cmp::Equ => nan || u == v,
                Cmp::Neu => nan || u != v,
                Cmp::Ltu => nan || u < v,
                Cmp::Leu => nan || u <= v,
                Cmp::Gtu => nan || u > v,
                Cmp::Geu => nan || u >= v,
                Cmp::Num => !nan,
                Cmp::Nan => nan,
            }
        });
        return;
    }
    let bits = ty.bits();
    let m = mask_of(bits);
    if ty.signed() {
        match cmp {
            Cmp::Lt => map(d, a, b, |x, y| sx(x, bits) < sx(y, bits)),
            Cmp::Le => map(d, a, b, |x, y| sx(x, bits) <= sx(y, bits)),
            Cmp::Gt => map(d, a, b, |x, y| sx(x, bits) > sx(y, bits)),
            Cmp::Ge => map(d, a, b, |x, y| sx(x, bits) >= sx(y, bits)),
            _ => map(d, a, b, |x, y| int_cmp(cmp, x & m, y & m)),
        }
    } else {
        map(d, a, b, |x, y| int_cmp(cmp, x & m, y & m));
    }
}

#[inline(always)]
fn int_cmp(cmp: Cmp, x: u64, y: u64) -> bool {
    match cmp {
        Cmp::Eq | Cmp::Equ => x == y,
        Cmp::Ne | Cmp::Neu => x != y,
        Cmp::Lt | Cmp::Lo | Cmp::Ltu => x < y,
        Cmp::Le | Cmp::Ls | Cmp::Leu => x <= y,
        Cmp::Gt | Cmp::Hi | Cmp::Gtu => x > y,
        Cmp::Ge | Cmp::Hs | Cmp::Geu => x >= y,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

fn bfe(ty: Ty, bits: u32, x: u64, pos: u64, len: u64) -> u64 {
    let m = mask_of(bits);
    let xu = x & m;
    if ty.signed() {
        let sbit = if len == 0 {
            0
        } else {
            (pos + len - 1).min(bits as u64 - 1)
        };
        let sign = if len == 0 { 0 } else { (xu >> sbit) & 1 };
        let mut r = 0u64;
        for i in 0..bits as u64 {
            let bit = if i < len && pos + i <= sbit {
                (xu >> (pos + i)) & 1
            } else {
                sign
            };
            r |= bit << i;
        }
        r & m
    } else if pos >= bits as u64 || len == 0 {
        0
    } else {
        (xu >> pos) & mask_of(len.min(64) as u32)
    }
}

fn flush(ty: Ty, v: f64) -> f64 {
    if ty == Ty::F32 && (v as f32).is_subnormal() {
        0.0f64.copysign(v)
    } else {
        v
    }
}

/// One lane of `cvt`.
fn cvt(dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool, dbits: u32, x: u64) -> u64 {
    let dm = mask_of(dty.bits());
    let extend = |v: u64| -> u64 {
        if dty.signed() && dbits > dty.bits() {
            (sx(v, dty.bits()) as u64) & mask_of(dbits)
        } else {
            v & dm
        }
    };
    let (lo, hi): (i128, i128) = if dty.signed() {
        (
            -(1i128 << (dty.bits() - 1)),
            (1i128 << (dty.bits() - 1)) - 1,
        )
    } else {
        (0, dm as i128)
    };
    match (sty.float(), dty.float()) {
        (false, false) => {
            let v: i128 = if sty.signed() {
                sx(x, sty.bits()) as i128
            } else {
                (x & mask_of(sty.bits())) as i128
            };
            let v = if sat { v.clamp(lo, hi) } else { v };
            extend(v as u64)
        }
        (true, false) => {
            let mut f = fget(sty, x);
            if ftz {
                f = flush(sty, f);
            }
            if f.is_nan() {
                return 0;
            }
            let r = match rnd {
                Rnd::Rni | Rnd::Rn => f.round_ties_even(),
                Rnd::Rmi | Rnd::Rm => f.floor(),
                Rnd::Rpi | Rnd::Rp => f.ceil(),
                _ => f.trunc(),
            };
            // Float to integer always saturates.
            let v = if r <= lo as f64 {
                lo
            } else if r >= hi as f64 {
                hi
            } else {
                r as i128
            };
            extend(v as u64)
        }
        (false, true) => {
            let v: i128 = if sty.signed() {
                sx(x, sty.bits()) as i128
            } else {
                (x & mask_of(sty.bits())) as i128
            };
            let directed = matches!(rnd, Rnd::Rz | Rnd::Rm | Rnd::Rp);
            let f = match dty {
                Ty::F64 if directed => {
                    let r = v as f64;
                    direct(r, (r as i128).cmp(&v), v < 0, rnd)
                }
                Ty::F64 => v as f64,
                Ty::F32 if directed => {
                    let r = v as f32;
                    direct(r, (r as i128).cmp(&v), v < 0, rnd) as f64
                }
                // Via f32 directly: one rounding from the integer.
                _ => (v as f32) as f64,
            };
            let f = if sat { sat01(f) } else { f };
            fput(dty, f)
        }
        (true, true) => {
            let mut f = fget(sty, x);
            if ftz {
                f = flush(sty, f);
            }
            let f = match rnd {
                Rnd::Rni => f.round_ties_even(),
                Rnd::Rzi => f.trunc(),
                Rnd::Rmi => f.floor(),
                Rnd::Rpi => f.ceil(),
                _ => f,
            };
            let f = if sat { sat01(f) } else { f };
            let r = if dty == Ty::F32
                && sty == Ty::F64
                && matches!(rnd, Rnd::Rz | Rnd::Rm | Rnd::Rp)
                && f.is_finite()
            {
                let r = f as f32;
                let cmp = (r as f64)
                    .partial_cmp(&f)
                    .unwrap_or(std::cmp::Ordering::Equal);
                f32b(direct(r, cmp, f < 0.0, rnd))
            } else {
                fput(dty, f)
            };
            if ftz && dty == Ty::F32 && f32v(r).is_subnormal() {
                return r & 0x8000_0000;
            }
            r
        }
    }
}

/// Moves a nearest-rounded `r` one step when the exact value lies on the
/// other side of it than the rounding direction allows. `cmp` is how `r`
/// compares with the exact value, `neg` whether the exact value is
/// negative.
fn direct<F: Neighbours>(r: F, cmp: std::cmp::Ordering, neg: bool, rnd: Rnd) -> F {
    use std::cmp::Ordering::*;
    match (rnd, cmp) {
        (Rnd::Rz | Rnd::Rzi, Greater) if !neg => r.down(),
        (Rnd::Rz | Rnd::Rzi, Less) if neg => r.up(),
        (Rnd::Rm | Rnd::Rmi, Greater) => r.down(),
        (Rnd::Rp | Rnd::Rpi, Less) => r.up(),
        _ => r,
    }
}

/// A float's neighbours, for [`direct`].
trait Neighbours: Copy {
    fn up(self) -> Self;
    fn down(self) -> Self;
}

macro_rules! neighbours {
    ($($t:ty),*) => {$(
        impl Neighbours for $t {
            fn up(self) -> Self {
                self.next_up()
            }
            fn down(self) -> Self {
                self.next_down()
            }
        }
    )*};
}
neighbours!(f32, f64);

fn sign_of(v: f64) -> std::cmp::Ordering {
    v.partial_cmp(&0.0).unwrap_or(std::cmp::Ordering::Equal)
}

/// `a + b` as `s + e` exactly (Knuth's two-sum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// One directed-rounded operation: the nearest result in the working
/// precision plus the sign of what it left out, then the step.
fn directed(op: FxOp, ty: Ty, rnd: Rnd, x: f64, y: f64, z: f64) -> u64 {
    use std::cmp::Ordering;
    // (s, sign of the exact value minus s)
    let (s, e): (f64, Ordering) = match op {
        FxOp::Bin(BinOp::Add) | FxOp::Bin(BinOp::Sub) => {
            let y = if op == FxOp::Bin(BinOp::Sub) { -y } else { y };
            let (s, e) = two_sum(x, y);
            if s == 0.0 && e == 0.0 && x != 0.0 && rnd == Rnd::Rm {
                // An exact zero sum of non-zero values is -0 rounding down.
                return fput(ty, -0.0);
            }
            (s, sign_of(e))
        }
        FxOp::Bin(BinOp::MulLo) => {
            let s = x * y;
            (s, sign_of(x.mul_add(y, -s)))
        }
        FxOp::Bin(BinOp::Div) | FxOp::Un(UnOp::Rcp) => {
            let (x, y) = if op == FxOp::Un(UnOp::Rcp) {
                (1.0, x)
            } else {
                (x, y)
            };
            let s = x / y;
            let rem = (-s).mul_add(y, x);
            (
                s,
                if sign_of(y) == Ordering::Less {
                    sign_of(rem).reverse()
                } else {
                    sign_of(rem)
                },
            )
        }
        FxOp::Un(UnOp::Sqrt) => {
            let s = x.sqrt();
            (s, sign_of((-s).mul_add(s, x)))
        }
        // Only f32 gets here: the product is exact in f64.
        FxOp::Fma => {
            let (s, e) = two_sum(x * y, z);
            (s, sign_of(e))
        }
        _ => return fput(ty, x),
    };
    let inputs_finite = x.is_finite() && y.is_finite() && z.is_finite();
    if !s.is_finite() || !inputs_finite || s.is_nan() {
        if s.is_infinite() && inputs_finite {
            // Overflow: the largest finite value unless rounding away.
            let away = match rnd {
                Rnd::Rm => s < 0.0,
                Rnd::Rp => s > 0.0,
                _ => false,
            };
            if !away {
                let max = if ty == Ty::F32 {
                    f32::MAX as f64
                } else {
                    f64::MAX
                };
                return fput(ty, max.copysign(s));
            }
        }
        return fput(ty, s);
    }
    let neg = s < 0.0 || (s == 0.0 && e == Ordering::Less);
    if ty == Ty::F32 {
        let r = s as f32;
        let cmp = match (r as f64).partial_cmp(&s) {
            Some(Ordering::Equal) | None => e.reverse(),
            Some(c) => c,
        };
        f32b(direct(r, cmp, neg, rnd))
    } else {
        direct(s, e.reverse(), neg, rnd).to_bits()
    }
}

#[allow(clippy::too_many_arguments)]
fn fx(
    op: FxOp,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    a: &[u64; 32],
    b: &[u64; 32],
    c: &[u64; 32],
    d: &mut [u64; 32],
) {
    let fl = |v: u64| -> u64 {
        if ftz && f32v(v).is_subnormal() {
            v & 0x8000_0000
        } else {
            v
        }
    };
    let (mut x, mut y, mut z) = (*a, *b, *c);
    if ftz {
        for l in 0..32 {
            x[l] = fl(x[l]);
            y[l] = fl(y[l]);
            z[l] = fl(z[l]);
        }
    }
    if rnd == Rnd::Rn {
        match op {
            FxOp::Bin(o) => bin(o, ty, &x, &y, d),
            FxOp::Un(o) => un(o, ty, &x, d),
            FxOp::Fma if ty == Ty::F32 => {
                for l in 0..32 {
                    d[l] = f32b(f32v(x[l]).mul_add(f32v(y[l]), f32v(z[l])));
                }
            }
            FxOp::Fma => {
                for l in 0..32 {
                    d[l] = fput(ty, fget(ty, x[l]).mul_add(fget(ty, y[l]), fget(ty, z[l])));
                }
            }
        }
    } else {
        for l in 0..32 {
            d[l] = directed(op, ty, rnd, fget(ty, x[l]), fget(ty, y[l]), fget(ty, z[l]));
        }
    }
    for v in d.iter_mut() {
        if sat {
            *v = fput(ty, sat01(fget(ty, *v)));
        }
        if ftz {
            *v = fl(*v);
        }
    }
}

impl Launch<'_> {
    /// Lanes `mask` arrive at a `bar.red`: their predicates join the
    /// warp's part of the reduction.
    #[inline(never)]
    fn bar_red_arrive(
        &self,
        w: &mut Warp,
        (op, d, c, neg): (BarRedOp, u32, Src, bool),
        mask: u32,
        ctaid: [u32; 3],
        tmp: &mut [u64; 32],
    ) {
        let set = ballot(self.opnd(w, c, ctaid, tmp), neg) & mask;
        let r = w.red.get_or_insert(RedWait {
            op,
            d,
            lanes: 0,
            set: 0,
        });
        r.lanes |= mask;
        r.set |= set;
    }

    /// The error of refused instruction `i` (kernels that reach one are
    /// refused before they start: this is never expected to run).
    #[cold]
    fn refused(&self, i: u32, line: u32) -> ExecError {
        match self.m.refused.get(i as usize) {
            Some(e) => ExecError::Refused(Box::new(e.clone())),
            None => ExecError::Unsupported {
                what: "an instruction this executor does not run",
                line,
            },
        }
    }
}

#[inline(never)]
fn bmsk_rows(clamp: bool, a: &[u64; 32], b: &[u64; 32], out: &mut [u64; 32]) {
    map2(out, a, b, |x, y| bmsk(clamp, x as u32, y as u32) as u64);
}

/// Half-precision arithmetic on `lanes` halves of each lane's operands.
#[inline(never)]
fn half_rows(
    op: HalfOp,
    ty: Ty,
    lanes: u8,
    [ftz, sat, relu]: [bool; 3],
    [a, b, c]: [&[u64; 32]; 3],
    out: &mut [u64; 32],
) {
    let half = if ty == Ty::Bf16 {
        half::Half::Bf16
    } else {
        half::Half::F16
    };
    for l in 0..32 {
        let mut r = 0u64;
        for k in 0..lanes as u32 {
            let part = |x: u64| (x >> (16 * k)) as u16;
            let h = half::half_arith(op, half, ftz, sat, relu, part(a[l]), part(b[l]), part(c[l]));
            r |= (h as u64) << (16 * k);
        }
        out[l] = r;
    }
}

/// `set`: 1.0 or all ones where the comparison (combined with the
/// predicate row `comb` gives) holds, per half of packed operands.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn set_rows(
    cmp: Cmp,
    sty: Ty,
    dty: Ty,
    packed: bool,
    comb: Option<(BoolOp, bool, &[u64; 32])>,
    a: &[u64; 32],
    b: &[u64; 32],
    out: &mut [u64; 32],
) {
    let (width, lanes) = if packed { (16, 2) } else { (dty.bits(), 1) };
    let yes = match dty {
        Ty::F32 => 0x3f80_0000,
        Ty::F64 => 1f64.to_bits(),
        Ty::F16 => 0x3c00,
        Ty::Bf16 => 0x3f80,
        _ => mask_of(width),
    };
    *out = [0; 32];
    let mut r = [0u64; 32];
    for k in 0..lanes {
        let part = |x: &[u64; 32]| x.map(|v| (v >> (16 * k)) & 0xffff);
        let (pa, pb) = if packed { (part(a), part(b)) } else { (*a, *b) };
        setp(cmp, sty, &pa, &pb, &mut r);
        if let Some((bop, neg, c)) = comb {
            for (v, p) in r.iter_mut().zip(c) {
                let p = (p & 1) ^ neg as u64;
                *v = match bop {
                    BoolOp::And => *v & p,
                    BoolOp::Or => *v | p,
                    BoolOp::Xor => *v ^ p,
                };
            }
        }
        for (o, &v) in out.iter_mut().zip(&r) {
            *o |= (v * yes) << (16 * k);
        }
    }
}

/// `cvt.rn{.relu}.f16x2.f32`: `a` to the upper half, `b` to the lower.
#[inline(never)]
fn cvt_pack_rows(ty: Ty, relu: bool, a: &[u64; 32], b: &[u64; 32], out: &mut [u64; 32]) {
    let one = |x: u64| -> u64 {
        let f = f32v(x);
        let h = if f.is_nan() {
            half::CANONICAL_NAN
        } else if relu && f < 0.0 {
            0
        } else if ty == Ty::Bf16 {
            f32_to_bf16(f)
        } else {
            f32_to_f16(f)
        };
        h as u64
    };
    map2(out, a, b, |x, y| (one(x) << 16) | one(y));
}

/// Lets the warps waiting at a barrier go on (with the result of a
/// `bar.red`); false when none is left. Out of line: once per barrier,
/// and kept out of the block's loop over its warps.
#[inline(never)]
fn release_barrier(warps: &mut [Warp]) -> bool {
    finish_bar_red(warps);
    let mut live = false;
    for w in warps.iter_mut() {
        if w.live != 0 {
            live = true;
            w.waiting = 0;
            w.resched();
        }
    }
    live
}

/// Releases a `bar.red` every thread reached (exited ones count as
/// arrived and add nothing): each waiting lane gets the reduction of all
/// the block's predicates.
fn finish_bar_red(warps: &mut [Warp]) {
    let (mut count, mut all, mut any) = (0u64, true, false);
    for r in warps.iter().filter_map(|w| w.red) {
        count += r.set.count_ones() as u64;
        all &= r.set == r.lanes;
        any |= r.set != 0;
    }
    for w in warps.iter_mut() {
        if let Some(r) = w.red.take() {
            let v = match r.op {
                BarRedOp::Popc => count,
                BarRedOp::And => all as u64,
                BarRedOp::Or => any as u64,
            };
            w.put(r.d, r.lanes, &[v; 32]);
        }
    }
}

/// `bmsk`: a mask of `b` bits from bit `a`, positions and widths past 31
/// clamped (`clamp`) or taken modulo 32 (the PTX ISA's definition).
fn bmsk(clamp: bool, a: u32, b: u32) -> u32 {
    let (a1, b1) = (a & 31, b & 31);
    let sum = a1 + b1;
    let mut mask0 = u32::MAX << a1;
    let mut overflow = sum >= 32;
    if clamp {
        if a >= 32 {
            overflow = true;
            mask0 = 0;
        }
        if b >= 32 {
            overflow = true;
        }
    }
    let mask1 = if overflow {
        0
    } else if b1 == 0 {
        u32::MAX
    } else {
        u32::MAX << sum
    };
    mask0 & !mask1
}

fn sat01(f: f64) -> f64 {
    if f.is_nan() {
        0.0
    } else {
        f.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod tests;
