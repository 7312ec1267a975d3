//! Decoding, validation and execution of one command (a descriptor chain).
//! Every value comes from the guest: sizes, counts, addresses and names are
//! checked before use, and a bad one becomes a completion status, never a
//! panic or an unbounded allocation.

use std::collections::HashMap;
use std::time::Instant;

use vfio_user_server::DmaSpace;
use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::vmm::VmmOp;
use vgpu_backend::{
    DeviceCopy, DeviceFill, HostSink, HostSlice, HostSource, Launch, OpError, Partition, SliceFn,
};
use vm_memory::{MmapRegion, VolatileMemory};

/// One descriptor of a chain, as popped from the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Guest address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

/// What a command produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// `STATUS_*`.
    pub status: u32,
    /// Command result.
    pub result: u64,
    /// Second result (the size of a global FUNC_INFO described).
    pub result2: u64,
    /// Device time consumed.
    pub device_ns: u64,
    /// The command asks for an interrupt regardless of suppression.
    pub force_irq: bool,
    /// Bytes moved between guest or window memory and the device.
    pub bytes: u64,
}

impl Outcome {
    /// Completes with `status` and nothing else.
    pub fn status(status: u32) -> Self {
        Outcome {
            status,
            ..Default::default()
        }
    }
}

/// The function handles FUNC_INFO handed out, each naming an entry point
/// of a loaded module; bounded, and gone with their module or a reset.
#[derive(Debug, Default)]
pub struct Functions {
    by_handle: HashMap<u64, (u64, Box<str>)>,
    by_name: HashMap<(u64, Box<str>), u64>,
    /// Never reused: a handle from before an unload or reset finds nothing.
    last: u64,
}

impl Functions {
    /// The handle of `entry` of `module`, made on first use.
    fn handle(&mut self, module: u64, entry: &str) -> Result<u64> {
        let key = (module, Box::<str>::from(entry));
        if let Some(&h) = self.by_name.get(&key) {
            return Ok(h);
        }
        if self.by_handle.len() >= abi::MAX_FUNCTIONS as usize {
            return Err(abi::STATUS_NO_MEMORY);
        }
        self.last += 1;
        self.by_handle.insert(self.last, key.clone());
        self.by_name.insert(key, self.last);
        Ok(self.last)
    }

    /// The entry point `handle` names, if it belongs to `module`.
    fn entry(&self, module: u64, handle: u64) -> Option<&str> {
        match self.by_handle.get(&handle) {
            Some((m, name)) if *m == module => Some(name),
            _ => None,
        }
    }

    /// Forgets the handles of an unloaded module.
    fn unloaded(&mut self, module: u64) {
        self.by_handle.retain(|_, (m, _)| *m != module);
        self.by_name.retain(|(m, _), _| *m != module);
    }

    /// Forgets every handle (the partition was reset).
    pub fn clear(&mut self) {
        self.by_handle.clear();
        self.by_name.clear();
    }
}

/// Everything a command may touch.
pub struct Ctx<'a> {
    /// Guest memory, through the DMA map table.
    pub dma: &'a DmaSpace,
    /// The partition doing the work.
    pub partition: &'a mut dyn Partition,
    /// Function handles of the partition's modules.
    pub functions: &'a mut Functions,
    /// The host-visible window (BAR2).
    pub window: &'a MmapRegion,
    /// Start of device time.
    pub epoch: Instant,
}

type Result<T> = std::result::Result<T, u32>;

/// The completion status of `e`.
pub fn op_status(e: OpError) -> u32 {
    // The guest sees only the status: the reason is for whoever debugs
    // its program (debug level, which is off unless asked for; a guest
    // may fail commands as often as it likes).
    if log::log_enabled!(log::Level::Debug) {
        vgpu_sys::debug_limited!("command failed: {e}");
    }
    e.status()
}

/// The largest command structure.
const MAX_CMD: usize = std::mem::size_of::<abi::LaunchCmd>();
const _: () = assert!(std::mem::size_of::<abi::ArrayCopyCmd>() <= MAX_CMD);
const _: () = assert!(std::mem::size_of::<abi::ObjectCmd>() <= MAX_CMD);

/// A command structure decoded from the bytes of its descriptor.
fn parse<T: ByteValued + Default>(raw: &[u8]) -> Result<T> {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    v.as_mut_slice()
        .copy_from_slice(raw.get(..n).ok_or(abi::STATUS_INVALID)?);
    Ok(v)
}

/// Reads the `len` bytes of a command's payload, spread over the readable
/// descriptors after the command's own (the first of `reads`).
fn read_payload(dma: &DmaSpace, reads: &[Desc], len: usize) -> Result<Vec<u8>> {
    let descs = reads.get(1..).unwrap_or_default();
    let available: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
    if (len as u64) > available {
        return Err(abi::STATUS_INVALID);
    }
    let mut out = vec![0u8; len];
    let mut done = 0;
    for d in descs {
        if done == len {
            break;
        }
        let n = (d.len as usize).min(len - done);
        dma.read(d.addr, &mut out[done..done + n])
            .map_err(|_| abi::STATUS_FAULT)?;
        done += n;
    }
    Ok(out)
}

/// Guest memory described by a scatter-gather list.
struct GuestSg<'a> {
    dma: &'a DmaSpace,
    entries: Vec<abi::SgEntry>,
    total: u64,
}

impl GuestSg<'_> {
    /// Calls `f(guest_addr, range_in_buf)` for each piece of `[offset, offset + len)`.
    fn walk(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> std::result::Result<(), OpError>,
    ) -> std::result::Result<(), OpError> {
        let mut pos = 0u64; // start of the current entry in the flattened list
        let mut done = 0usize;
        for e in &self.entries {
            if done == len {
                break;
            }
            let want = offset + done as u64;
            if want >= pos + e.len {
                pos += e.len;
                continue;
            }
            let skip = want - pos;
            let n = ((e.len - skip) as usize).min(len - done);
            f(e.addr + skip, done..done + n)?;
            done += n;
            pos += e.len;
        }
        if done != len {
            return Err(OpError::Fault(offset + done as u64));
        }
        Ok(())
    }
}

impl GuestSg<'_> {
    /// Hands `f` the host slices of the whole list, under the DMA table's
    /// read lock (so an unmap waits for `f`); `Ok(false)` when some part
    /// has no host address or is not mapped for this direction (the
    /// chunked path then reports the fault where it is).
    fn slices(&self, write: bool, f: &mut SliceFn<'_>) -> std::result::Result<bool, OpError> {
        let ranges: Vec<(u64, u64)> = self.entries.iter().map(|e| (e.addr, e.len)).collect();
        let r = self
            .dma
            .with_host_slices(&ranges, write, |slices| f(&host_slices(slices)));
        r.unwrap_or(Ok(false))
    }
}

/// The DMA table's slices as a partition takes them.
pub fn host_slices(slices: &[vfio_user_server::dma::HostSlice]) -> Vec<HostSlice> {
    slices
        .iter()
        .map(|s| HostSlice {
            ptr: s.ptr,
            len: s.len,
            mapping: s.mapping,
        })
        .collect()
}

impl HostSource for GuestSg<'_> {
    fn len(&self) -> u64 {
        self.total
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), OpError> {
        let len = buf.len();
        self.walk(offset, len, |addr, r| {
            self.dma
                .read(addr, &mut buf[r.clone()])
                .map_err(|_| OpError::Fault(offset + r.start as u64))
        })
    }
    fn with_slices(&self, f: &mut SliceFn<'_>) -> std::result::Result<bool, OpError> {
        self.slices(false, f)
    }
}

impl HostSink for GuestSg<'_> {
    fn len(&self) -> u64 {
        self.total
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::result::Result<(), OpError> {
        self.walk(offset, buf.len(), |addr, r| {
            self.dma
                .write(addr, &buf[r.clone()])
                .map_err(|_| OpError::Fault(offset + r.start as u64))
        })
    }
    fn with_slices_mut(&self, f: &mut SliceFn<'_>) -> std::result::Result<bool, OpError> {
        self.slices(true, f)
    }
}

/// A range of the host-visible window.
struct WindowRange<'a> {
    window: &'a MmapRegion,
    start: u64,
    len: u64,
}

impl WindowRange<'_> {
    fn slice(
        &self,
        offset: u64,
        n: usize,
    ) -> std::result::Result<vm_memory::VolatileSlice<'_>, OpError> {
        let end = offset
            .checked_add(n as u64)
            .filter(|e| *e <= self.len)
            .ok_or(OpError::Fault(offset))?;
        let _ = end;
        self.window
            .get_slice((self.start + offset) as usize, n)
            .map_err(|_| OpError::Fault(offset))
    }
}

impl HostSource for WindowRange<'_> {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), OpError> {
        self.slice(offset, buf.len())?.copy_to(buf);
        Ok(())
    }
}

impl HostSink for WindowRange<'_> {
    fn len(&self) -> u64 {
        self.len
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::result::Result<(), OpError> {
        self.slice(offset, buf.len())?.copy_from(buf);
        Ok(())
    }
}

fn window_range<'a>(window: &'a MmapRegion, start: u64, len: u64) -> Result<WindowRange<'a>> {
    let end = start.checked_add(len).ok_or(abi::STATUS_INVALID)?;
    if end > window.len() as u64 {
        return Err(abi::STATUS_INVALID);
    }
    Ok(WindowRange { window, start, len })
}

fn guest_sg<'a>(dma: &'a DmaSpace, cmd: &abi::CopyCmd, reads: &[Desc]) -> Result<GuestSg<'a>> {
    guest_list(dma, cmd.sg_count, cmd.size, reads)
}

/// The guest memory of `sg_count` scatter-gather entries in the
/// command's second readable descriptor, which must add up to `size`.
fn guest_list<'a>(
    dma: &'a DmaSpace,
    sg_count: u32,
    size: u64,
    reads: &[Desc],
) -> Result<GuestSg<'a>> {
    if sg_count == 0 || sg_count > abi::MAX_SG_ENTRIES {
        return Err(abi::STATUS_INVALID);
    }
    let desc = reads.get(1).ok_or(abi::STATUS_INVALID)?;
    let bytes = sg_count as usize * std::mem::size_of::<abi::SgEntry>();
    if (desc.len as usize) < bytes {
        return Err(abi::STATUS_INVALID);
    }
    let mut raw = vec![0u8; bytes];
    dma.read(desc.addr, &mut raw)
        .map_err(|_| abi::STATUS_FAULT)?;
    let mut entries = Vec::with_capacity(sg_count as usize);
    let mut total = 0u64;
    for chunk in raw.chunks_exact(std::mem::size_of::<abi::SgEntry>()) {
        let mut e = abi::SgEntry::default();
        e.as_mut_slice().copy_from_slice(chunk);
        if e.len == 0 || e.addr.checked_add(e.len).is_none() {
            return Err(abi::STATUS_INVALID);
        }
        total = total.checked_add(e.len).ok_or(abi::STATUS_INVALID)?;
        entries.push(e);
    }
    if total != size {
        return Err(abi::STATUS_INVALID);
    }
    Ok(GuestSg {
        dma,
        entries,
        total,
    })
}

fn copy(ctx: &mut Ctx<'_>, cmd: &abi::CopyCmd, reads: &[Desc]) -> Result<u64> {
    if cmd.size == 0 || cmd.reserved != 0 {
        return Err(abi::STATUS_INVALID);
    }
    let p = &mut *ctx.partition;
    match (cmd.src_kind, cmd.dst_kind) {
        (abi::COPY_GUEST, abi::COPY_DEVICE) => {
            let src = guest_sg(ctx.dma, cmd, reads)?;
            p.upload(cmd.dst, &src).map_err(op_status)?;
        }
        (abi::COPY_DEVICE, abi::COPY_GUEST) => {
            let dst = guest_sg(ctx.dma, cmd, reads)?;
            p.download(cmd.src, &dst).map_err(op_status)?;
        }
        (abi::COPY_WINDOW, abi::COPY_DEVICE) => {
            let src = window_range(ctx.window, cmd.src, cmd.size)?;
            p.upload(cmd.dst, &src).map_err(op_status)?;
        }
        (abi::COPY_DEVICE, abi::COPY_WINDOW) => {
            let dst = window_range(ctx.window, cmd.dst, cmd.size)?;
            p.download(cmd.src, &dst).map_err(op_status)?;
        }
        (abi::COPY_DEVICE, abi::COPY_DEVICE) => {
            p.copy(cmd.dst, cmd.src, cmd.size).map_err(op_status)?;
        }
        _ => return Err(abi::STATUS_INVALID),
    }
    Ok(0)
}

/// The guest side of a COPY between guest memory and device memory,
/// decoded and checked: the host memory of a step of a queued run, still
/// named by guest address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRanges {
    /// (address, length) in order.
    pub ranges: Vec<(u64, u64)>,
    /// Bytes.
    pub size: u64,
}

/// The direction (true: to the device) and device address of a COPY
/// between guest memory and device memory; `None` for other copies.
fn guest_side(cmd: &abi::CopyCmd) -> Option<(bool, u64)> {
    match (cmd.src_kind, cmd.dst_kind) {
        (abi::COPY_GUEST, abi::COPY_DEVICE) => Some((true, cmd.dst)),
        (abi::COPY_DEVICE, abi::COPY_GUEST) => Some((false, cmd.src)),
        _ => None,
    }
}

/// Checks a launch shape the way CUDA limits it.
fn valid_shape(grid: [u32; 3], block: [u32; 3]) -> bool {
    // Saturates for dimensions far out of range, which fail below anyway.
    let threads = u64::from(block[0])
        .saturating_mul(u64::from(block[1]))
        .saturating_mul(u64::from(block[2]));
    grid.iter().chain(block.iter()).all(|d| *d > 0)
        && grid[0] <= abi::MAX_GRID_X
        && grid[1] <= abi::MAX_GRID_Y
        && grid[2] <= abi::MAX_GRID_Z
        && block[0] <= abi::MAX_BLOCK_X
        && block[1] <= abi::MAX_BLOCK_Y
        && block[2] <= abi::MAX_BLOCK_Z
        && threads <= u64::from(abi::MAX_BLOCK_THREADS)
}

/// Checks a cluster shape: at most [`abi::MAX_CLUSTER_BLOCKS`] blocks,
/// each dimension dividing the grid's.
fn valid_cluster(grid: [u32; 3], cluster: [u32; 3]) -> bool {
    let blocks = cluster.iter().map(|&d| u64::from(d)).product::<u64>();
    blocks <= u64::from(abi::MAX_CLUSTER_BLOCKS)
        && grid
            .iter()
            .zip(cluster)
            .all(|(&g, c)| c > 0 && g.is_multiple_of(c))
}

/// A command decoded and checked as a step of queued device work
/// ([`Partition::run_queued`]): the steps of a stream that run back to
/// back on the device. A copy's guest memory is named by guest address
/// until the run resolves it ([`Step::as_ref`] and [`Step::map`] make
/// the partition's [`vgpu_backend::Queued`] step of it); an OP_NOP is no step (`None`
/// where [`step`] decodes one): it completes in order with the run.
pub type Step = vgpu_backend::Step<OwnedLaunch, GuestRanges>;

/// A launch's values, read out of guest memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedLaunch {
    module: u64,
    entry: Box<str>,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    cluster: [u32; 3],
    cooperative: bool,
    params: Vec<u8>,
}

impl OwnedLaunch {
    /// The launch as a partition takes it.
    pub fn launch(&self) -> Launch<'_> {
        Launch {
            cluster: self.cluster,
            cooperative: self.cooperative,
            module: self.module,
            entry: &self.entry,
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared_mem,
            params: &self.params,
        }
    }
}

/// How a command runs in a queued run of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// On the device alone: a launch, or a timestamp, no-op, fill or copy
    /// between device addresses.
    Device {
        /// Whether it is a launch.
        launch: bool,
    },
    /// A copy between guest memory and device memory (true: to the
    /// device); a run moves guest memory one way.
    Guest(bool),
}

/// A command's own descriptor, header and body, read once from guest
/// memory: what grouping a run and decoding its steps both look at, so
/// that a guest rewriting it meanwhile cannot make them disagree.
#[derive(Clone)]
pub struct Command {
    buf: [u8; MAX_CMD],
    len: usize,
    /// The context its flags named (ABI 1.5), taken out of them so that
    /// each opcode checks its own flags alone.
    context: u32,
}

impl Command {
    /// Reads the command in `descs` (its first readable descriptor, as
    /// much as the largest command structure takes).
    pub fn read(dma: &DmaSpace, descs: &[Desc]) -> Result<Command> {
        let first = descs
            .iter()
            .find(|d| !d.writable)
            .ok_or(abi::STATUS_INVALID)?;
        let mut buf = [0u8; MAX_CMD];
        let len = (first.len as usize).min(MAX_CMD);
        dma.read(first.addr, &mut buf[..len])
            .map_err(|_| abi::STATUS_FAULT)?;
        // The flags are the header's second word.
        let mut context = 0;
        if len >= std::mem::size_of::<abi::CmdHeader>() {
            let flags = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
            context = (flags & abi::CMD_CTX_MASK) >> abi::CMD_CTX_SHIFT;
            buf[4..8].copy_from_slice(&(flags & !abi::CMD_CTX_MASK).to_le_bytes());
        }
        Ok(Command { buf, len, context })
    }

    /// The context it is for (0: the function's own).
    pub fn context(&self) -> u32 {
        self.context
    }

    fn raw(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Its opcode, if its header is whole.
    pub fn opcode(&self) -> Option<u32> {
        parse::<abi::CmdHeader>(self.raw()).ok().map(|h| h.opcode)
    }

    /// Whether it touches guest memory only, never the partition (FENCE,
    /// WRITE_VALUE, WAIT_VALUE): it may run while runs of other queues
    /// are in flight.
    pub fn partition_free(&self) -> bool {
        matches!(
            self.opcode(),
            Some(abi::OP_FENCE | abi::OP_WRITE_VALUE | abi::OP_WAIT_VALUE)
        )
    }

    /// The context whose device state it needs, which
    /// [`Partition::set_context`] makes current (and, on first use,
    /// makes) before it runs; `None` for commands that need none (those
    /// that touch guest memory only, CTX_DESTROY, unknown opcodes).
    pub fn device_context(&self) -> Option<u32> {
        match self.opcode()? {
            abi::OP_NOP
            | abi::OP_MEM_ALLOC
            | abi::OP_MEM_FREE
            | abi::OP_COPY
            | abi::OP_FILL
            | abi::OP_MODULE_LOAD
            | abi::OP_MODULE_UNLOAD
            | abi::OP_LAUNCH
            | abi::OP_TIMESTAMP
            | abi::OP_FUNC_INFO
            | abi::OP_OCCUPANCY
            | abi::OP_CONSOLE
            | abi::OP_VA_RESERVE
            | abi::OP_MEM_CREATE
            | abi::OP_MEM_MAP
            | abi::OP_MEM_ACCESS
            | abi::OP_ARRAY_CREATE
            | abi::OP_ARRAY_COPY
            | abi::OP_OBJECT_CREATE
            | abi::OP_OBJECT_DESTROY => Some(self.context),
            _ => None,
        }
    }

    /// Whether it is a WAIT_VALUE, and if so whether its condition holds
    /// now: `Some(Ok(false))` keeps the queue waiting; `Some(Err(status))`
    /// is a WAIT_VALUE that completes with that status (malformed, or its
    /// word out of reach).
    pub fn wait_value(&self, dma: &DmaSpace) -> Option<Result<bool>> {
        (self.opcode()? == abi::OP_WAIT_VALUE).then(|| wait_holds(dma, self.raw()))
    }

    /// How it runs as a step of queued device work; `None` for a command
    /// that runs alone, or whose header is cut short.
    pub fn step_kind(&self) -> Option<StepKind> {
        let raw = self.raw();
        match parse::<abi::CmdHeader>(raw).ok()?.opcode {
            // A cooperative launch runs alone: what the device checks
            // first asks the partition, which may not be asked while runs
            // are in flight.
            abi::OP_LAUNCH => {
                let c: abi::LaunchCmd = parse(raw).ok()?;
                (c.hdr.flags & abi::LAUNCH_FLAG_COOPERATIVE == 0)
                    .then_some(StepKind::Device { launch: true })
            }
            abi::OP_NOP | abi::OP_TIMESTAMP | abi::OP_FILL => {
                Some(StepKind::Device { launch: false })
            }
            abi::OP_COPY => {
                let c: abi::CopyCmd = parse(raw).ok()?;
                match (c.src_kind, c.dst_kind) {
                    (abi::COPY_DEVICE, abi::COPY_DEVICE) => {
                        Some(StepKind::Device { launch: false })
                    }
                    _ => guest_side(&c).map(|(to_device, _)| StepKind::Guest(to_device)),
                }
            }
            _ => None,
        }
    }
}

/// The first bytes of the command in `descs` (as many as `buf` holds,
/// or its descriptor's length if shorter), read once.
fn peek<'b>(dma: &DmaSpace, descs: &[Desc], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let first = descs.iter().find(|d| !d.writable)?;
    let n = buf.len().min(first.len as usize);
    dma.read(first.addr, &mut buf[..n]).ok()?;
    Some(&buf[..n])
}

/// The opcode of the command in `descs`, if its header can be read.
pub fn opcode(dma: &DmaSpace, descs: &[Desc]) -> Option<u32> {
    let mut buf = [0u8; std::mem::size_of::<abi::CmdHeader>()];
    let head = peek(dma, descs, &mut buf)?;
    parse::<abi::CmdHeader>(head).ok().map(|h| h.opcode)
}

/// Decodes `cmd`, the command in `descs` as read, into its step, or the
/// status it completes with: the checks [`execute`] makes before running
/// it.
pub fn step(ctx: &Ctx<'_>, cmd: &Command, descs: &[Desc]) -> Result<Option<Step>> {
    let reads: Vec<Desc> = descs.iter().copied().filter(|d| !d.writable).collect();
    let raw = cmd.raw();
    let hdr: abi::CmdHeader = parse(raw)?;
    match hdr.opcode {
        abi::OP_NOP => Ok(None),
        abi::OP_TIMESTAMP => Ok(Some(Step::Timestamp)),
        abi::OP_LAUNCH => match decode_launch(ctx, &parse(raw)?, &reads)? {
            // Never queued (see `Command::step_kind`).
            l if l.cooperative => Err(abi::STATUS_INVALID),
            l => Ok(Some(Step::Launch(l))),
        },
        abi::OP_FILL => {
            let c: abi::FillCmd = parse(raw)?;
            check_fill(&c)?;
            Ok(Some(Step::Fill(DeviceFill {
                addr: c.addr,
                size: c.size,
                pattern: c.pattern,
            })))
        }
        abi::OP_COPY => {
            let c: abi::CopyCmd = parse(raw)?;
            if c.size == 0 || c.reserved != 0 {
                return Err(abi::STATUS_INVALID);
            }
            if (c.src_kind, c.dst_kind) == (abi::COPY_DEVICE, abi::COPY_DEVICE) {
                return Ok(Some(Step::Copy(DeviceCopy {
                    dst: c.dst,
                    src: c.src,
                    size: c.size,
                })));
            }
            let (to_device, device) = guest_side(&c).ok_or(abi::STATUS_INVALID)?;
            let sg = guest_sg(ctx.dma, &c, &reads)?;
            let guest = GuestRanges {
                ranges: sg.entries.iter().map(|e| (e.addr, e.len)).collect(),
                size: sg.total,
            };
            Ok(Some(if to_device {
                Step::Upload {
                    dst: device,
                    src: guest,
                }
            } else {
                Step::Download {
                    src: device,
                    dst: guest,
                }
            }))
        }
        _ => Err(abi::STATUS_INVALID),
    }
}

/// Refuses a FILL the device does not run: empty, not whole words, or
/// with reserved bits set.
fn check_fill(c: &abi::FillCmd) -> Result<()> {
    if c.size == 0 || !c.size.is_multiple_of(4) || c.reserved != 0 {
        return Err(abi::STATUS_INVALID);
    }
    Ok(())
}

fn launch(ctx: &mut Ctx<'_>, cmd: &abi::LaunchCmd, reads: &[Desc]) -> Result<u64> {
    let l = decode_launch(ctx, cmd, reads)?;
    if l.cooperative {
        check_cooperative(ctx, &l.launch())?;
    }
    ctx.partition.launch(&l.launch()).map_err(op_status)?;
    Ok(0)
}

/// A cooperative launch runs where the partition offers them
/// (UNSUPPORTED elsewhere, as FEATURES says), with no more clusters
/// than OCCUPANCY says are resident at once (INVALID).
fn check_cooperative(ctx: &mut Ctx<'_>, l: &Launch<'_>) -> Result<()> {
    if !ctx.partition.cooperative() {
        return Err(abi::STATUS_UNSUPPORTED);
    }
    let shape = Launch {
        grid: l.cluster,
        params: &[],
        ..l.clone()
    };
    let resident = ctx
        .partition
        .max_active_clusters(&shape)
        .map_err(op_status)?;
    let blocks = |d: [u32; 3]| d.iter().map(|&x| u64::from(x)).product::<u64>();
    // The shape was checked: the grid is whole clusters.
    if blocks(l.grid) / blocks(l.cluster) > u64::from(resident) {
        return Err(abi::STATUS_INVALID);
    }
    Ok(())
}

fn decode_launch(ctx: &Ctx<'_>, cmd: &abi::LaunchCmd, reads: &[Desc]) -> Result<OwnedLaunch> {
    let known = abi::LAUNCH_FLAG_FUNCTION | abi::LAUNCH_FLAG_COOPERATIVE;
    if cmd.hdr.flags & !known != 0 {
        return Err(abi::STATUS_INVALID);
    }
    let by_handle = cmd.hdr.flags & abi::LAUNCH_FLAG_FUNCTION != 0;
    let cooperative = cmd.hdr.flags & abi::LAUNCH_FLAG_COOPERATIVE != 0;
    let (entry, cluster) = if by_handle {
        let (handle, cluster) = abi::parse_entry_function(&cmd.entry).ok_or(abi::STATUS_INVALID)?;
        let entry = ctx
            .functions
            .entry(cmd.module, handle)
            .ok_or(abi::STATUS_NOT_FOUND)?;
        (entry, cluster)
    } else {
        let entry = abi::parse_entry_name(&cmd.entry).ok_or(abi::STATUS_INVALID)?;
        (entry, [1, 1, 1])
    };
    if !valid_shape(cmd.grid, cmd.block)
        || !valid_cluster(cmd.grid, cluster)
        || cmd.params_size > abi::MAX_PARAMS_SIZE
    {
        return Err(abi::STATUS_INVALID);
    }
    let params = read_payload(ctx.dma, reads, cmd.params_size as usize)?;
    Ok(OwnedLaunch {
        module: cmd.module,
        entry: entry.into(),
        grid: cmd.grid,
        block: cmd.block,
        shared_mem: cmd.shared_mem,
        cluster,
        cooperative,
        params,
    })
}

/// FUNC_INFO: describes a kernel (or, with [`abi::FUNC_INFO_FLAG_GLOBAL`],
/// a global) into device memory; returns the kernel's handle (the
/// global's address and size).
fn func_info(ctx: &mut Ctx<'_>, cmd: &abi::FuncInfoCmd, reads: &[Desc]) -> Result<(u64, u64)> {
    let global = match cmd.hdr.flags {
        0 => false,
        abi::FUNC_INFO_FLAG_GLOBAL => true,
        _ => return Err(abi::STATUS_INVALID),
    };
    let header = if global {
        std::mem::size_of::<abi::GlobalInfo>()
    } else {
        std::mem::size_of::<abi::FuncInfo>()
    };
    if cmd.name_len == 0 || cmd.name_len > abi::MAX_ENTRY_NAME || (cmd.out_size as usize) < header {
        return Err(abi::STATUS_INVALID);
    }
    let name = read_payload(ctx.dma, reads, cmd.name_len as usize)?;
    let name = std::str::from_utf8(&name).map_err(|_| abi::STATUS_INVALID)?;
    if name.contains('\0') {
        return Err(abi::STATUS_INVALID);
    }
    if global {
        let (addr, size) = ctx
            .partition
            .global_info(cmd.module, name)
            .map_err(op_status)?;
        let out = abi::GlobalInfo { addr, size }.as_slice().to_vec();
        ctx.partition.upload(cmd.out, &out).map_err(op_status)?;
        return Ok((addr, size));
    }
    let info = ctx
        .partition
        .function_info(cmd.module, name)
        .map_err(op_status)?;
    // The header says how many parameters there are; as many as fit follow.
    let room = (cmd.out_size as usize - header) / std::mem::size_of::<abi::FuncParam>();
    let mut out = info.attrs.as_slice().to_vec();
    for p in info.params.iter().take(room) {
        out.extend_from_slice(p.as_slice());
    }
    ctx.partition.upload(cmd.out, &out).map_err(op_status)?;
    Ok((ctx.functions.handle(cmd.module, name)?, 0))
}

/// OCCUPANCY: how many clusters of a launch shape of a function FUNC_INFO
/// described can be resident at once, as the partition's driver counts.
fn occupancy(ctx: &mut Ctx<'_>, cmd: &abi::OccupancyCmd) -> Result<u64> {
    if cmd.hdr.flags != 0 || cmd.reserved != 0 {
        return Err(abi::STATUS_INVALID);
    }
    let entry = ctx
        .functions
        .entry(cmd.module, cmd.function)
        .ok_or(abi::STATUS_NOT_FOUND)?;
    // One cluster's worth of grid: the shape is all that is asked about.
    let blocks = cmd.cluster.iter().map(|&d| u64::from(d)).product::<u64>();
    if !valid_shape([1, 1, 1], cmd.block)
        || cmd.cluster.contains(&0)
        || blocks > u64::from(abi::MAX_OCCUPANCY_CLUSTER_BLOCKS)
    {
        return Err(abi::STATUS_INVALID);
    }
    let shape = Launch {
        cluster: cmd.cluster,
        cooperative: false,
        module: cmd.module,
        entry,
        grid: cmd.cluster,
        block: cmd.block,
        shared_mem: cmd.shared_mem,
        params: &[],
    };
    ctx.partition
        .max_active_clusters(&shape)
        .map(u64::from)
        .map_err(op_status)
}

/// CONSOLE: moves what the kernels of a module printed into guest
/// memory; returns the bytes written and those dropped since the last
/// CONSOLE. Output the guest memory could not take is lost with the
/// fault (the guest named memory the VMM did not map).
fn console(ctx: &mut Ctx<'_>, cmd: &abi::ConsoleCmd, reads: &[Desc]) -> Result<(u64, u64)> {
    if cmd.hdr.flags != 0
        || cmd.out_size == 0
        || cmd.out_size > abi::CONSOLE_BYTES
        || cmd.module == abi::MODULE_BUILTIN
    {
        return Err(abi::STATUS_INVALID);
    }
    let dst = guest_list(ctx.dma, cmd.sg_count, u64::from(cmd.out_size), reads)?;
    let out = ctx
        .partition
        .console(cmd.module, cmd.out_size as usize)
        .map_err(op_status)?;
    if !out.text.is_empty() {
        dst.write_at(0, &out.text).map_err(op_status)?;
    }
    Ok((out.text.len() as u64, out.dropped))
}

/// Checks a WRITE_VALUE's or WAIT_VALUE's flags (besides `extra`) and
/// alignment: whether the word is 64 bits, and its condition's bits.
fn value_word(c: &abi::ValueCmd, extra: u32) -> Result<(bool, u32)> {
    let flags = c.hdr.flags;
    let wide = flags & abi::VALUE_FLAG_32 == 0;
    let align = if wide { 8 } else { 4 };
    if flags & !(abi::VALUE_FLAG_32 | extra) != 0 || !c.addr.is_multiple_of(align) {
        return Err(abi::STATUS_INVALID);
    }
    Ok((wide, flags & extra))
}

/// Whether the WAIT_VALUE in `raw` has its condition met now.
fn wait_holds(dma: &DmaSpace, raw: &[u8]) -> Result<bool> {
    let c: abi::ValueCmd = parse(raw)?;
    let (wide, cond) = value_word(&c, abi::WAIT_COND_MASK)?;
    let mut word = [0u8; 8];
    let n = if wide { 8 } else { 4 };
    dma.read(c.addr, &mut word[..n])
        .map_err(|_| abi::STATUS_FAULT)?;
    let (word, value) = if wide {
        (u64::from_le_bytes(word), c.value)
    } else {
        (
            u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]])),
            c.value & 0xffff_ffff,
        )
    };
    Ok(match cond {
        abi::WAIT_EQ => word == value,
        abi::WAIT_AND => word & value != 0,
        abi::WAIT_NOR => {
            let nor = !(word | value);
            (if wide { nor } else { nor & 0xffff_ffff }) != 0
        }
        // GEQ: a counter that wraps still goes forward.
        _ if wide => (word.wrapping_sub(value) as i64) >= 0,
        _ => (word.wrapping_sub(value) as u32 as i32) >= 0,
    })
}

/// A virtual memory command (ABI 1.6) decoded: its flags and the
/// fields its form does not use checked (INVALID otherwise); the values
/// themselves are the partition's to check.
fn vmm_op(raw: &[u8], hdr: abi::CmdHeader) -> Result<VmmOp> {
    let one_flag = |flag: u32| -> Result<bool> {
        match hdr.flags & !flag {
            0 => Ok(hdr.flags & flag != 0),
            _ => Err(abi::STATUS_INVALID),
        }
    };
    let zero = |v: u64| {
        if v == 0 {
            Ok(())
        } else {
            Err(abi::STATUS_INVALID)
        }
    };
    Ok(match hdr.opcode {
        abi::OP_VA_RESERVE => {
            let c: abi::VaCmd = parse(raw)?;
            if one_flag(abi::VA_FLAG_FREE)? {
                zero(c.align)?;
                VmmOp::Free {
                    addr: c.addr,
                    size: c.size,
                }
            } else {
                VmmOp::Reserve {
                    size: c.size,
                    align: c.align,
                    addr: c.addr,
                }
            }
        }
        abi::OP_MEM_CREATE => {
            let c: abi::MemCreateCmd = parse(raw)?;
            if one_flag(abi::MEM_CREATE_FLAG_RELEASE)? {
                zero(c.size)?;
                VmmOp::Release { handle: c.handle }
            } else {
                zero(c.handle)?;
                VmmOp::Create { size: c.size }
            }
        }
        abi::OP_MEM_MAP => {
            let c: abi::MemMapCmd = parse(raw)?;
            if one_flag(abi::MEM_MAP_FLAG_UNMAP)? {
                zero(c.handle | c.offset)?;
                VmmOp::Unmap {
                    addr: c.addr,
                    size: c.size,
                }
            } else {
                VmmOp::Map {
                    addr: c.addr,
                    size: c.size,
                    handle: c.handle,
                    offset: c.offset,
                }
            }
        }
        _ => {
            let c: abi::MemAccessCmd = parse(raw)?;
            one_flag(0)?;
            zero(u64::from(c.reserved))?;
            VmmOp::Access {
                addr: c.addr,
                size: c.size,
                access: c.access,
            }
        }
    })
}

/// Runs `cmd`, the command in `descs` (readable descriptors first, then
/// writable) as read, or completes with the status its read failed with.
pub fn execute(ctx: &mut Ctx<'_>, cmd: &Result<Command>, descs: &[Desc]) -> Outcome {
    let reads: Vec<Desc> = descs.iter().copied().filter(|d| !d.writable).collect();
    // One read of the command descriptor serves the header and the body.
    let raw = match cmd {
        Ok(cmd) => cmd.raw(),
        Err(s) => return Outcome::status(*s),
    };
    let hdr: abi::CmdHeader = match parse(raw) {
        Ok(h) => h,
        Err(s) => return Outcome::status(s),
    };
    let start = Instant::now();
    let mut force_irq = false;
    let mut bytes = 0;
    let mut result2 = 0;
    let result: Result<u64> = (|| match hdr.opcode {
        abi::OP_NOP => Ok(0),
        abi::OP_TIMESTAMP => Ok(ctx.epoch.elapsed().as_nanos() as u64),
        abi::OP_FENCE => {
            let c: abi::FenceCmd = parse(raw)?;
            if !c.addr.is_multiple_of(8) || c.hdr.flags & !abi::FENCE_FLAG_IRQ != 0 {
                return Err(abi::STATUS_INVALID);
            }
            ctx.dma
                .write(c.addr, &c.value.to_le_bytes())
                .map_err(|_| abi::STATUS_FAULT)?;
            force_irq = c.hdr.flags & abi::FENCE_FLAG_IRQ != 0;
            Ok(0)
        }
        abi::OP_WRITE_VALUE => {
            let c: abi::ValueCmd = parse(raw)?;
            let (wide, _) = value_word(&c, 0)?;
            let bytes = c.value.to_le_bytes();
            ctx.dma
                .write(c.addr, if wide { &bytes } else { &bytes[..4] })
                .map_err(|_| abi::STATUS_FAULT)?;
            Ok(0)
        }
        // The worker runs it once its condition held: what is left to
        // say is whether the command itself is sound.
        abi::OP_WAIT_VALUE => wait_holds(ctx.dma, raw).map(|_| 0),
        abi::OP_MEM_ALLOC => {
            let c: abi::MemAllocCmd = parse(raw)?;
            let align = if c.align == 0 { 256 } else { c.align };
            if c.size == 0 || !align.is_power_of_two() {
                return Err(abi::STATUS_INVALID);
            }
            ctx.partition.alloc(c.size, align).map_err(op_status)
        }
        abi::OP_MEM_FREE => {
            let c: abi::MemFreeCmd = parse(raw)?;
            ctx.partition.free(c.addr).map_err(op_status).map(|_| 0)
        }
        abi::OP_COPY => {
            let c: abi::CopyCmd = parse(raw)?;
            copy(ctx, &c, &reads)?;
            if c.src_kind != abi::COPY_DEVICE || c.dst_kind != abi::COPY_DEVICE {
                bytes = c.size;
            }
            Ok(0)
        }
        abi::OP_FILL => {
            let c: abi::FillCmd = parse(raw)?;
            check_fill(&c)?;
            ctx.partition
                .fill(c.addr, c.size, c.pattern)
                .map_err(op_status)
                .map(|_| 0)
        }
        abi::OP_MODULE_LOAD => {
            let c: abi::ModuleLoadCmd = parse(raw)?;
            if c.image_size == 0 || c.image_size > abi::MAX_MODULE_SIZE {
                return Err(abi::STATUS_INVALID);
            }
            let image = read_payload(ctx.dma, &reads, c.image_size as usize)?;
            let handle = ctx
                .partition
                .module_load(c.format, &image)
                .map_err(op_status)?;
            if vgpu_backend::console::module_prints(&image) {
                result2 = abi::MODULE_FLAG_PRINTS;
            }
            Ok(handle)
        }
        abi::OP_MODULE_UNLOAD => {
            let c: abi::ModuleUnloadCmd = parse(raw)?;
            ctx.partition.module_unload(c.module).map_err(op_status)?;
            ctx.functions.unloaded(c.module);
            Ok(0)
        }
        abi::OP_FUNC_INFO => {
            let c: abi::FuncInfoCmd = parse(raw)?;
            let (value, second) = func_info(ctx, &c, &reads)?;
            result2 = second;
            Ok(value)
        }
        abi::OP_LAUNCH => {
            let c: abi::LaunchCmd = parse(raw)?;
            launch(ctx, &c, &reads)
        }
        abi::OP_OCCUPANCY => occupancy(ctx, &parse(raw)?),
        abi::OP_CONSOLE => {
            let (written, dropped) = console(ctx, &parse(raw)?, &reads)?;
            result2 = dropped;
            Ok(written)
        }
        abi::OP_VA_RESERVE | abi::OP_MEM_CREATE | abi::OP_MEM_MAP | abi::OP_MEM_ACCESS => {
            let op = vmm_op(raw, hdr)?;
            if !ctx.partition.has_vmm() {
                return Err(abi::STATUS_UNSUPPORTED);
            }
            ctx.partition.vmm(&op).map_err(op_status)
        }
        abi::OP_ARRAY_CREATE
        | abi::OP_ARRAY_COPY
        | abi::OP_OBJECT_CREATE
        | abi::OP_OBJECT_DESTROY => {
            let req = vgpu_backend::arrays::Resource::from_bytes(raw).map_err(op_status)?;
            ctx.partition.resource(&req).map_err(op_status)
        }
        abi::OP_CTX_DESTROY => {
            let context = cmd.as_ref().map_or(0, Command::context);
            if hdr.flags != 0 {
                return Err(abi::STATUS_INVALID);
            }
            let modules = ctx.partition.end_context(context).map_err(op_status)?;
            for m in modules {
                ctx.functions.unloaded(m);
            }
            Ok(0)
        }
        _ => Err(abi::STATUS_INVALID),
    })();
    let device_ns = start.elapsed().as_nanos() as u64;
    match result {
        Ok(value) => Outcome {
            status: abi::STATUS_OK,
            result: value,
            result2,
            device_ns,
            force_irq,
            bytes,
        },
        Err(status) => Outcome {
            status,
            result: 0,
            result2: 0,
            device_ns,
            force_irq,
            bytes: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_launch_shape_limits() {
        assert!(valid_shape([1, 1, 1], [1, 1, 1]));
        assert!(valid_shape([65536, 2, 3], [32, 32, 1]));
        assert!(!valid_shape([0, 1, 1], [1, 1, 1]));
        assert!(!valid_shape([1, 1, 1], [1024, 2, 1]));
        assert!(!valid_shape([1, 65536, 1], [1, 1, 1]));
        assert!(!valid_shape([u32::MAX, 1, 1], [1, 1, 1]));
    }

    #[test]
    fn test_cluster_shape_limits() {
        assert!(valid_cluster([8, 2, 1], [1, 1, 1]));
        assert!(valid_cluster([8, 2, 1], [4, 2, 1]));
        assert!(valid_cluster([16, 1, 1], [16, 1, 1]));
        assert!(!valid_cluster([32, 1, 1], [32, 1, 1]));
        assert!(!valid_cluster([6, 1, 1], [4, 1, 1]));
        assert!(!valid_cluster([8, 8, 1], [4, 4, 2]));
    }

    #[test]
    fn test_launch_shape_thread_count_overflow_is_invalid() {
        assert!(!valid_shape([1, 1, 1], [u32::MAX, u32::MAX, u32::MAX]));
        assert!(!valid_shape([1, 1, 1], [1 << 22, 1 << 22, 1 << 22]));
    }
}
