//! The VMM and guest driver of one vGPU, over one vfio-user connection.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vfio_user::Client;
use vgpu_abi::{self as abi, ByteValued, ErrorLogEntry, SgEntry};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, MmapRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::ring::{vring_need_event, Chain, Doorbells, DriverQueue, Mode, Ram, RingLayout, Used};
use crate::ring::{DESC_SIZE, SLOT_SIZE};

pub use vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX as IRQ_MSIX;
use vfio_bindings::bindings::vfio::{VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD};
/// Most fds the engine takes with one message.
const FDS_PER_MESSAGE: usize = 16;
/// Staging area for inline buffers larger than a descriptor slot.
const STAGING_SIZE: u64 = 8 << 20;
/// Largest REGION_READ / REGION_WRITE the kit sends at once.
const REGION_CHUNK: usize = 64 << 10;

/// When the driver writes REG_WAKE after ringing a doorbell the device
/// does not poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakePolicy {
    /// When `vring_need_event(avail_event, new, old)` says so.
    EventIdx,
    /// Whenever the queue's DB_POLLING word is 0.
    Always,
    /// Never (the doorbell page alone).
    Never,
}

/// How the guest is built.
#[derive(Clone, Debug)]
pub struct GuestOptions {
    /// Bytes of guest RAM (a memfd).
    pub ram_size: u64,
    /// Guest address (IOVA) where RAM is DMA-mapped.
    pub ram_iova: u64,
    /// Longest wait for a completion before a convenience call panics.
    pub timeout: Duration,
}

impl Default for GuestOptions {
    fn default() -> Self {
        GuestOptions {
            ram_size: crate::DEFAULT_RAM_SIZE,
            ram_iova: crate::DEFAULT_RAM_IOVA,
            timeout: crate::DEFAULT_TIMEOUT,
        }
    }
}

/// A bump allocator that can be rewound as a whole.
struct Arena {
    base: u64,
    size: u64,
    next: u64,
}

impl Arena {
    fn take(&mut self, size: u64, align: u64) -> Option<u64> {
        let start = self.next.checked_add(align - 1)? & !(align - 1);
        let end = start.checked_add(size)?;
        (end <= self.base + self.size).then(|| {
            self.next = end;
            start
        })
    }
}

/// A connected VMM with a guest driver: guest RAM, interrupts, BAR0 and
/// the doorbell page, queues and rings. Convenience calls panic with a
/// description when the device does not answer in time.
pub struct Guest {
    client: Client,
    ram_file: File,
    ram: Ram,
    heap: Arena,
    staging: Option<Arena>,
    doorbells: Doorbells,
    msix: Vec<EventFd>,
    irqs: Vec<u64>,
    epoll: Epoll,
    queues: Vec<Option<DriverQueue>>,
    timeout: Duration,
    wake_policy: WakePolicy,
    wakes: u64,
    wake_ioeventfd: Option<EventFd>,
    /// The context every command is stamped with (ABI 1.5).
    context: u32,
}

/// Connects once, as a VMM does: a server still tearing down a previous
/// client holds this one in its backlog until it can serve it.
fn connect(path: &Path) -> Client {
    Client::new(path).unwrap_or_else(|e| panic!("cannot connect to {}: {e}", path.display()))
}

pub(crate) fn map_shared(file: &File, offset: u64, size: u64) -> MmapRegion {
    let clone = file.try_clone().expect("dup of a mappable fd");
    MmapRegionBuilder::new(size as usize)
        .with_file_offset(FileOffset::new(clone, offset))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_SHARED)
        .build()
        .expect("mmap of a shared file")
}

/// Guest RAM as QEMU's memfd backend makes it: sealed against shrinking
/// and growing, so that no process it is shared with can truncate it under
/// another's mapping.
pub(crate) fn sealed_ram(size: u64) -> std::io::Result<File> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    vgpu_sys::memfd::create_sealed(c"vgpu-testkit-ram", size, seals)
}

impl Guest {
    /// Connects to the vGPU at `path` as a VMM does: maps guest RAM for
    /// DMA, wires every MSI-X vector to an eventfd, maps the doorbell page
    /// and sets CONTROL_ENABLE.
    pub fn connect(path: &Path, opts: GuestOptions) -> Guest {
        assert!(opts.ram_iova != 0, "guest RAM must sit at a non-zero IOVA");
        let mut client = connect(path);

        let ram_file = sealed_ram(opts.ram_size).expect("memfd for guest RAM");
        client
            .dma_map(0, opts.ram_iova, opts.ram_size, ram_file.as_raw_fd())
            .expect("DMA_MAP of guest RAM");
        let ram = Ram::new(map_shared(&ram_file, 0, opts.ram_size), opts.ram_iova);

        // The doorbell page: the sparse mmap area of BAR0.
        let bar0 = client.region(abi::BAR_REGS).expect("BAR0");
        let fo = bar0.file_offset.as_ref().expect("BAR0 offers an fd");
        let area = bar0
            .sparse_areas
            .iter()
            .find(|a| a.offset == abi::DOORBELL_OFFSET)
            .expect("BAR0 offers the doorbell page for mmap");
        assert!(area.size >= abi::DOORBELL_SIZE);
        let doorbells = Doorbells::new(map_shared(
            fo.file(),
            fo.start() + area.offset,
            abi::DOORBELL_SIZE,
        ));

        let count = client.get_irq_info(IRQ_MSIX).expect("MSI-X info").count;
        assert_eq!(count, abi::MSIX_VECTORS, "MSI-X vectors");
        let msix: Vec<EventFd> = (0..count)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"))
            .collect();
        let epoll = Epoll::new().expect("epoll");
        for (v, e) in msix.iter().enumerate() {
            epoll
                .ctl(
                    ControlOperation::Add,
                    e.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, v as u64),
                )
                .expect("epoll add");
        }
        for (i, chunk) in msix.chunks(FDS_PER_MESSAGE).enumerate() {
            let fds: Vec<i32> = chunk.iter().map(|e| e.as_raw_fd()).collect();
            client
                .set_irqs(
                    IRQ_MSIX,
                    VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                    (i * FDS_PER_MESSAGE) as u32,
                    fds.len() as u32,
                    &fds,
                )
                .expect("SET_IRQS");
        }

        let num_queues = {
            let mut b = [0u8; 4];
            client
                .region_read(abi::BAR_REGS, abi::REG_MAX_QUEUES, &mut b)
                .expect("REG_MAX_QUEUES");
            u32::from_le_bytes(b)
        };
        let mut guest = Guest {
            client,
            ram_file,
            heap: Arena {
                base: opts.ram_iova,
                size: opts.ram_size,
                // The first page stays unused.
                next: opts.ram_iova + 4096,
            },
            ram,
            staging: None,
            context: 0,
            doorbells,
            irqs: vec![0; count as usize],
            msix,
            epoll,
            queues: (0..num_queues).map(|_| None).collect(),
            timeout: opts.timeout,
            wake_policy: WakePolicy::EventIdx,
            wakes: 0,
            wake_ioeventfd: None,
        };
        assert_eq!(guest.read32(abi::REG_MAGIC), abi::ABI_MAGIC, "REG_MAGIC");
        guest.enable_device();
        guest
    }

    /// The vfio-user client (for requests the kit does not wrap).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Guest RAM.
    pub fn ram(&self) -> &Ram {
        &self.ram
    }

    /// The doorbell page.
    pub fn doorbells(&self) -> &Doorbells {
        &self.doorbells
    }

    /// A mapping of the doorbell page of its own, for another thread (a
    /// second vCPU) to write while this guest keeps driving its queues.
    pub fn map_doorbells(&self) -> Doorbells {
        let bar0 = self.client.region(abi::BAR_REGS).expect("BAR0");
        let fo = bar0.file_offset.as_ref().expect("BAR0 offers an fd");
        Doorbells::new(map_shared(
            fo.file(),
            fo.start() + abi::DOORBELL_OFFSET,
            abi::DOORBELL_SIZE,
        ))
    }

    /// Longest wait of the convenience calls.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the longest wait of the convenience calls.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// When REG_WAKE is written after a doorbell.
    pub fn set_wake_policy(&mut self, policy: WakePolicy) {
        self.wake_policy = policy;
    }

    /// From now on, REG_WAKE writes signal `efd` (the register's
    /// ioeventfd, see `vgpu_device::testing::TestVgpu::wake_ioeventfd`)
    /// instead of going through the socket, as with a VMM that maps the
    /// register as an ioeventfd.
    pub fn use_wake_ioeventfd(&mut self, efd: EventFd) {
        self.wake_ioeventfd = Some(efd);
    }

    /// REG_WAKE writes sent so far.
    pub fn wakes(&self) -> u64 {
        self.wakes
    }

    /// Queues the device offers.
    pub fn num_queues(&self) -> u32 {
        self.queues.len() as u32
    }

    // ---- guest memory ----

    /// Allocates `size` bytes of guest RAM aligned to `align` (never freed).
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        self.heap
            .take(size.max(1), align)
            .unwrap_or_else(|| panic!("guest RAM exhausted allocating {size} bytes"))
    }

    /// Allocates guest RAM holding `data`.
    pub fn alloc_bytes(&mut self, data: &[u8]) -> u64 {
        let addr = self.alloc(data.len() as u64, 64);
        self.ram.write(addr, data);
        addr
    }

    /// Copies `data` to guest address `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) {
        self.ram.write(addr, data);
    }

    /// Reads `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        self.ram.read(addr, len)
    }

    /// Writes a plain structure at `addr`.
    pub fn write_obj<T: ByteValued>(&self, addr: u64, v: &T) {
        self.ram.write_obj(addr, v);
    }

    /// Reads a plain structure at `addr`.
    pub fn read_obj<T: ByteValued + Default>(&self, addr: u64) -> T {
        self.ram.read_obj(addr)
    }

    /// Removes the DMA mapping of guest RAM (as a VMM does when the guest
    /// reconfigures its IOMMU); the test's own view of RAM stays.
    pub fn unmap_ram(&mut self) {
        let (iova, size) = (self.ram.iova(), self.ram.size());
        self.client.dma_unmap(iova, size).expect("DMA_UNMAP");
    }

    /// DMA-maps guest RAM again after [`Guest::unmap_ram`].
    pub fn map_ram(&mut self) {
        let (iova, size) = (self.ram.iova(), self.ram.size());
        self.client
            .dma_map(0, iova, size, self.ram_file.as_raw_fd())
            .expect("DMA_MAP");
    }

    /// A guest address that no DMA mapping covers.
    pub fn unmapped_addr(&self) -> u64 {
        self.ram.iova() + self.ram.size() + (1 << 20)
    }

    /// Allocates a scatter-gather list of segments of the given lengths,
    /// each separated from the next by an unused gap.
    pub fn alloc_sg(&mut self, lens: &[u64]) -> Vec<SgEntry> {
        lens.iter()
            .map(|&len| {
                let addr = self.alloc(len + 64, 8);
                SgEntry { addr, len }
            })
            .collect()
    }

    /// Scatters `data` over `sg` (whose total must be `data.len()`).
    pub fn write_sg(&self, sg: &[SgEntry], data: &[u8]) {
        let total: u64 = sg.iter().map(|e| e.len).sum();
        assert_eq!(total, data.len() as u64, "SG total vs data");
        let mut off = 0usize;
        for e in sg {
            self.ram.write(e.addr, &data[off..off + e.len as usize]);
            off += e.len as usize;
        }
    }

    /// Gathers the bytes of `sg`.
    pub fn read_sg(&self, sg: &[SgEntry]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in sg {
            out.extend(self.ram.read(e.addr, e.len as usize));
        }
        out
    }

    /// Guest memory for an inline buffer that outlives its submission call
    /// only until every queue is idle again.
    pub(crate) fn stage(&mut self, data: &[u8]) -> u64 {
        self.begin_staging();
        self.stage_more(data)
    }

    /// Like [`Guest::stage`], `len` bytes left as they are.
    pub(crate) fn stage_len(&mut self, len: u64) -> u64 {
        self.begin_staging();
        self.take_staging(len)
    }

    /// Starts the staging of one submission: the area is reused from its
    /// start once nothing the device may still read from it is in flight.
    fn begin_staging(&mut self) {
        let idle = self.queues.iter().flatten().all(|q| q.in_flight() == 0);
        if self.staging.is_none() {
            let base = self.alloc(STAGING_SIZE, 4096);
            self.staging = Some(Arena {
                base,
                size: STAGING_SIZE,
                next: base,
            });
        }
        if let (true, Some(staging)) = (idle, self.staging.as_mut()) {
            staging.next = staging.base;
        }
    }

    /// Stages `data` after what this submission staged already.
    fn stage_more(&mut self, data: &[u8]) -> u64 {
        let addr = self.take_staging(data.len() as u64);
        self.ram.write(addr, data);
        addr
    }

    fn take_staging(&mut self, len: u64) -> u64 {
        match self.staging.as_mut().and_then(|s| s.take(len.max(1), 64)) {
            Some(a) => a,
            None => self.alloc(len, 64),
        }
    }

    // ---- registers ----

    /// Reads `N` bytes of BAR0 with one access.
    fn read_bar0<const N: usize>(&mut self, off: u64) -> [u8; N] {
        let mut b = [0u8; N];
        self.client
            .region_read(abi::BAR_REGS, off, &mut b)
            .expect("BAR0 read");
        b
    }

    /// Reads a 32-bit register of BAR0.
    pub fn read32(&mut self, off: u64) -> u32 {
        u32::from_le_bytes(self.read_bar0(off))
    }

    /// Reads a 64-bit register of BAR0 with one 8-byte access.
    pub fn read64(&mut self, off: u64) -> u64 {
        u64::from_le_bytes(self.read_bar0(off))
    }

    /// Writes a 32-bit register of BAR0.
    pub fn write32(&mut self, off: u64, v: u32) {
        self.client
            .region_write(abi::BAR_REGS, off, &v.to_le_bytes())
            .expect("BAR0 write");
    }

    /// Writes a 64-bit register of BAR0 as two 32-bit writes, low half first.
    pub fn write64(&mut self, off: u64, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// Reads register `reg` of queue `q`.
    pub fn qread32(&mut self, q: u32, reg: u64) -> u32 {
        self.read32(abi::queue_reg(q, reg))
    }

    /// Writes register `reg` of queue `q`.
    pub fn qwrite32(&mut self, q: u32, reg: u64, v: u32) {
        self.write32(abi::queue_reg(q, reg), v);
    }

    /// Writes 64-bit register `reg` of queue `q`.
    pub fn qwrite64(&mut self, q: u32, reg: u64, v: u64) {
        self.write64(abi::queue_reg(q, reg), v);
    }

    /// QREG_STATUS of queue `q`.
    pub fn queue_status(&mut self, q: u32) -> u32 {
        self.qread32(q, abi::QREG_STATUS)
    }

    /// QREG_ERROR of queue `q`.
    pub fn queue_error(&mut self, q: u32) -> u32 {
        self.qread32(q, abi::QREG_ERROR)
    }

    /// REG_MEM_USED.
    pub fn mem_used(&mut self) -> u64 {
        self.read64(abi::REG_MEM_USED)
    }

    /// REG_COMMANDS.
    pub fn commands(&mut self) -> u64 {
        self.read64(abi::REG_COMMANDS)
    }

    /// REG_ERROR_COUNT.
    pub fn error_count(&mut self) -> u32 {
        self.read32(abi::REG_ERROR_COUNT)
    }

    /// Error log entry `n` (the `n`-th error since reset, modulo the log size).
    pub fn error_entry(&mut self, n: u32) -> ErrorLogEntry {
        let base = abi::ERROR_LOG_OFFSET + u64::from(n % abi::ERROR_LOG_ENTRIES) * 16;
        ErrorLogEntry {
            code: self.read32(base),
            queue: self.read32(base + 4),
            detail: self.read64(base + 8),
        }
    }

    /// Errors logged after the first `since`, oldest first (at most the log size).
    pub fn errors_since(&mut self, since: u32) -> Vec<ErrorLogEntry> {
        let count = self.error_count();
        let first = since.max(count.saturating_sub(abi::ERROR_LOG_ENTRIES));
        (first..count).map(|n| self.error_entry(n)).collect()
    }

    /// Sets CONTROL_ENABLE.
    pub fn enable_device(&mut self) {
        self.write32(abi::REG_CONTROL, abi::CONTROL_ENABLE);
    }

    /// Resets the function through REG_CONTROL (CONTROL_RESET). The kit
    /// forgets its queues; set them up again, after [`Guest::enable_device`].
    pub fn control_reset(&mut self) {
        self.write32(abi::REG_CONTROL, abi::CONTROL_RESET);
        self.forget_queues();
    }

    /// Resets the function through the vfio-user DEVICE_RESET request, as
    /// a VMM does on a guest's FLR. The kit forgets its queues.
    pub fn device_reset(&mut self) {
        self.client.reset().expect("DEVICE_RESET");
        self.forget_queues();
    }

    /// Drops the driver state of every queue (the device was reset).
    pub fn forget_queues(&mut self) {
        self.queues.iter_mut().for_each(|q| *q = None);
    }

    // ---- the host-visible window (BAR2) ----

    /// Writes `data` at `off` of the window through REGION_WRITE.
    pub fn window_write(&mut self, off: u64, data: &[u8]) {
        for (i, chunk) in data.chunks(REGION_CHUNK).enumerate() {
            self.client
                .region_write(abi::BAR_WINDOW, off + (i * REGION_CHUNK) as u64, chunk)
                .expect("window write");
        }
    }

    /// Reads `len` bytes at `off` of the window through REGION_READ.
    pub fn window_read(&mut self, off: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        for (i, chunk) in out.chunks_mut(REGION_CHUNK).enumerate() {
            self.client
                .region_read(abi::BAR_WINDOW, off + (i * REGION_CHUNK) as u64, chunk)
                .expect("window read");
        }
        out
    }

    // ---- interrupts ----

    fn drain_irqs(&mut self) {
        for (v, e) in self.msix.iter().enumerate() {
            if let Ok(n) = e.read() {
                self.irqs[v] += n;
            }
        }
    }

    /// Interrupts seen on MSI-X `vector` since the last [`Guest::clear_irqs`].
    pub fn irqs(&mut self, vector: u32) -> u64 {
        self.drain_irqs();
        self.irqs[vector as usize]
    }

    /// The (non-blocking) eventfd wired to MSI-X `vector`, for waiting on
    /// one vector directly. Counts read from it here are not seen by
    /// [`Guest::irqs`].
    pub fn msix_eventfd(&self, vector: u32) -> &EventFd {
        &self.msix[vector as usize]
    }

    /// Forgets the interrupts seen so far.
    pub fn clear_irqs(&mut self) {
        self.drain_irqs();
        self.irqs.iter_mut().for_each(|n| *n = 0);
    }

    /// Waits up to `timeout` for an interrupt on any vector; returns
    /// whether one arrived.
    fn wait_any_irq(&mut self, timeout: Duration) -> bool {
        let mut events = [EpollEvent::default(); 32];
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        match self.epoll.wait(ms, &mut events) {
            Ok(n) if n > 0 => {
                self.drain_irqs();
                true
            }
            _ => false,
        }
    }

    /// Waits up to `timeout` until `vector` has fired at least once since
    /// the last [`Guest::clear_irqs`].
    pub fn wait_irq(&mut self, vector: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.irqs(vector) > 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.wait_any_irq((deadline - now).min(Duration::from_millis(20)));
        }
    }

    // ---- queues ----

    /// Sets up queue `q` with a ring of `size` entries in guest RAM and the
    /// default vector (`q + 1`), and asserts that the device enabled it.
    pub fn setup_queue(&mut self, q: u32, size: u16, mode: Mode) {
        let status = self.try_setup_queue(q, size, mode, q + 1);
        assert_eq!(
            status & (abi::QSTATUS_ENABLED | abi::QSTATUS_ERROR),
            abi::QSTATUS_ENABLED,
            "queue {q} did not come up (error {})",
            self.queue_error(q)
        );
    }

    /// Sets up queue `q` (which must be disabled) with its MSI-X `vector`;
    /// returns QREG_STATUS.
    pub fn try_setup_queue(&mut self, q: u32, size: u16, mode: Mode, vector: u32) -> u32 {
        assert!(size > 0, "queue size 0");
        let n = u64::from(size);
        let layout = RingLayout {
            size,
            desc: self.alloc(DESC_SIZE * n, 4096),
            avail: self.alloc(6 + 2 * n, 64),
            used: self.alloc(6 + 8 * n, 64),
            slots: self.alloc(SLOT_SIZE * n, 64),
        };
        let control = abi::QCONTROL_ENABLE
            | match mode {
                Mode::Polled => abi::QCONTROL_POLLED,
                Mode::Interrupt => 0,
            };
        self.qwrite32(q, abi::QREG_MSIX_VECTOR, vector);
        let status = self.enable_queue_raw(
            q,
            size.into(),
            layout.desc,
            layout.avail,
            layout.used,
            control,
        );
        if let Some(slot) = self.queues.get_mut(q as usize) {
            *slot = (status & abi::QSTATUS_ENABLED != 0).then(|| DriverQueue::new(layout, mode));
        }
        status
    }

    /// Programs queue `q` with arbitrary values and writes QREG_CONTROL;
    /// returns QREG_STATUS. The kit keeps no driver state for it.
    pub fn enable_queue_raw(
        &mut self,
        q: u32,
        size: u32,
        desc: u64,
        avail: u64,
        used: u64,
        control: u32,
    ) -> u32 {
        self.qwrite32(q, abi::QREG_SIZE, size);
        self.qwrite64(q, abi::QREG_DESC, desc);
        self.qwrite64(q, abi::QREG_AVAIL, avail);
        self.qwrite64(q, abi::QREG_USED, used);
        self.qwrite32(q, abi::QREG_CONTROL, control);
        self.queue_status(q)
    }

    /// Disables queue `q` and drops its driver state.
    pub fn disable_queue(&mut self, q: u32) {
        self.qwrite32(q, abi::QREG_CONTROL, 0);
        if let Some(slot) = self.queues.get_mut(q as usize) {
            *slot = None;
        }
    }

    fn queue(&mut self, q: u32) -> &mut DriverQueue {
        self.queues
            .get_mut(q as usize)
            .and_then(Option::as_mut)
            .unwrap_or_else(|| panic!("queue {q} is not set up"))
    }

    /// Where queue `q`'s rings are.
    pub fn layout(&mut self, q: u32) -> RingLayout {
        self.queue(q).layout
    }

    /// Chains of queue `q` the device has not returned.
    pub fn in_flight(&mut self, q: u32) -> usize {
        self.queue(q).in_flight()
    }

    /// Adds `chain` to queue `q` and publishes it, without notifying.
    /// Returns the head descriptor; panics when the ring is full.
    pub fn post(&mut self, q: u32, chain: &Chain) -> u16 {
        let head = self
            .add(q, chain)
            .unwrap_or_else(|| panic!("queue {q} is full"));
        let Guest { queues, ram, .. } = self;
        queues[q as usize].as_mut().expect("set up").publish(ram);
        head
    }

    /// Names context `ctx` in every command posted from now on, as a
    /// driver with contexts does (0: the function's own).
    pub fn set_context(&mut self, ctx: u32) {
        self.context = ctx;
    }

    fn add(&mut self, q: u32, chain: &Chain) -> Option<u16> {
        let stamped;
        let chain = if self.context != 0 {
            stamped = chain.clone().in_context(self.context);
            &stamped
        } else {
            chain
        };
        if self.queue(q).free_descs() < chain.len() {
            return None;
        }
        // Inline buffers larger than a descriptor slot are staged first.
        // Every large piece of one chain in its own part of the area.
        let large: Vec<&[u8]> = chain
            .inline_buffers()
            .into_iter()
            .filter(|d| d.len() as u64 > SLOT_SIZE)
            .collect();
        if !large.is_empty() {
            self.begin_staging();
        }
        let mut staged: VecDeque<u64> = large.into_iter().map(|d| self.stage_more(d)).collect();
        let Guest { queues, ram, .. } = self;
        let dq = queues[q as usize].as_mut().expect("set up");
        dq.add(ram, chain, &mut |_| {
            staged.pop_front().expect("staged in order")
        })
    }

    /// Rings queue `q`'s doorbell for everything published: writes the
    /// doorbell slot and, when the device does not poll the queue, writes
    /// REG_WAKE as the wake policy says.
    pub fn kick(&mut self, q: u32) {
        let (new, old, layout) = {
            let dq = self.queue(q);
            let r = (dq.published, dq.notified, dq.layout);
            dq.notified = dq.published;
            r
        };
        self.doorbells.set_avail_idx(q, u32::from(new));
        // Pairs with the device's fence between clearing POLLING (and
        // writing avail_event) and reading the available index.
        fence(Ordering::SeqCst);
        if self.doorbells.polling(q) != 0 {
            return;
        }
        let wake = match self.wake_policy {
            WakePolicy::Always => true,
            WakePolicy::Never => false,
            WakePolicy::EventIdx => {
                let event = self.ram.load_u16(layout.avail_event(), Ordering::Acquire);
                vring_need_event(event, new, old)
            }
        };
        if wake {
            match &self.wake_ioeventfd {
                // What KVM does for a guest write to an ioeventfd register.
                Some(efd) => {
                    let _ = efd.write(1);
                }
                None => self.write32(abi::REG_WAKE, q),
            }
            self.wakes += 1;
        }
    }

    /// Takes the next used entry of queue `q` if there is one.
    pub fn poll_used(&mut self, q: u32) -> Option<Used> {
        let Guest { queues, ram, .. } = self;
        queues
            .get_mut(q as usize)
            .and_then(Option::as_mut)
            .unwrap_or_else(|| panic!("queue {q} is not set up"))
            .poll_used(ram)
    }

    /// Waits up to `timeout` for the next used entry of queue `q`.
    pub fn wait_used(&mut self, q: u32, timeout: Duration) -> Option<Used> {
        let deadline = Instant::now() + timeout;
        let mode = self.queue(q).mode;
        let mut rounds = 0u32;
        loop {
            if let Some(u) = self.poll_used(q) {
                return Some(u);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            match mode {
                Mode::Interrupt => {
                    // Ask for an interrupt, then look once more before
                    // sleeping so a completion racing with it is not missed.
                    {
                        let Guest { queues, ram, .. } = &mut *self;
                        queues[q as usize].as_mut().expect("set up").arm_irq(ram);
                    }
                    fence(Ordering::SeqCst);
                    if let Some(u) = self.poll_used(q) {
                        return Some(u);
                    }
                    self.wait_any_irq((deadline - now).min(Duration::from_millis(2)));
                }
                Mode::Polled => {
                    rounds += 1;
                    if rounds < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
            }
        }
    }

    /// Submits `chain` on queue `q` (add, publish, notify) and waits for it.
    pub fn submit(&mut self, q: u32, chain: &Chain) -> Used {
        let head = self.post(q, chain);
        self.kick(q);
        let timeout = self.timeout;
        let used = self
            .wait_used(q, timeout)
            .unwrap_or_else(|| panic!("queue {q}: no completion within {timeout:?}"));
        assert_eq!(
            used.id,
            u32::from(head),
            "queue {q}: completions out of order"
        );
        used
    }

    /// [`Guest::submit_batch`], then each command's completion status, in
    /// order.
    pub fn batch_statuses(&mut self, q: u32, chains: &[Chain]) -> Vec<u32> {
        self.submit_batch(q, chains)
            .iter()
            .map(|u| u.completion().status)
            .collect()
    }

    /// Submits many chains on queue `q`, as many as fit before one
    /// notification, refilling as completions arrive; returns the used
    /// entries in submission order.
    pub fn submit_batch(&mut self, q: u32, chains: &[Chain]) -> Vec<Used> {
        let mut results: Vec<Option<Used>> = vec![None; chains.len()];
        let mut heads = HashMap::new();
        let mut next = 0;
        let mut done = 0;
        let timeout = self.timeout;
        while done < chains.len() {
            let mut added = false;
            while next < chains.len() {
                match self.add(q, &chains[next]) {
                    Some(head) => {
                        heads.insert(head, next);
                        next += 1;
                        added = true;
                    }
                    None => break,
                }
            }
            if added {
                let Guest { queues, ram, .. } = &mut *self;
                queues[q as usize].as_mut().expect("set up").publish(ram);
                self.kick(q);
            }
            let first = self
                .wait_used(q, timeout)
                .unwrap_or_else(|| panic!("queue {q}: batch stalled after {done} completions"));
            let mut got = vec![first];
            while let Some(u) = self.poll_used(q) {
                got.push(u);
            }
            for u in got {
                let i = u16::try_from(u.id)
                    .ok()
                    .and_then(|h| heads.remove(&h))
                    .unwrap_or_else(|| panic!("queue {q}: unexpected used id {}", u.id));
                results[i] = Some(u);
                done += 1;
            }
        }
        results
            .into_iter()
            .map(|u| u.expect("all completed"))
            .collect()
    }

    /// Submits a hand-made chain: descriptors `(addr, len, device-writable)`
    /// linked in order, nothing copied or read back by the kit. Returns the
    /// used entry, or None when the device does not return it in time.
    pub fn submit_raw(&mut self, q: u32, descs: &[(u64, u32, bool)]) -> Option<Used> {
        let mut chain = Chain::new();
        for &(addr, len, write) in descs {
            chain = if write {
                chain.write(addr, len)
            } else {
                chain.read(addr, len)
            };
        }
        self.post(q, &chain);
        self.kick(q);
        let timeout = self.timeout;
        self.wait_used(q, timeout)
    }

    // ---- raw ring access, for corrupt-ring tests ----

    /// Writes descriptor table entry `index` of queue `q` as given.
    pub fn ring_write_desc(&mut self, q: u32, index: u16, desc: crate::ring::VirtqDesc) {
        let at = self.queue(q).layout.desc_entry(index);
        self.ram.write(at, &desc.to_bytes());
    }

    /// Appends `head` to queue `q`'s available ring and publishes it.
    pub fn ring_push_head(&mut self, q: u32, head: u16) {
        let Guest { queues, ram, .. } = self;
        let dq = queues[q as usize].as_mut().expect("set up");
        dq.add_head(ram, head);
        dq.publish(ram);
    }

    /// Writes queue `q`'s available index as given.
    pub fn ring_set_avail_idx(&mut self, q: u32, idx: u16) {
        let Guest { queues, ram, .. } = self;
        queues[q as usize]
            .as_mut()
            .expect("set up")
            .force_avail_idx(ram, idx);
    }

    /// Queue `q`'s available index as published.
    pub fn ring_avail_idx(&mut self, q: u32) -> u16 {
        self.queue(q).published
    }

    /// Queue `q`'s used index as the device wrote it.
    pub fn ring_used_idx(&mut self, q: u32) -> u16 {
        let at = self.queue(q).layout.used_idx();
        self.ram.load_u16(at, Ordering::Acquire)
    }

    /// Sets queue `q`'s `used_event`. With `each`, the kit moves it to the
    /// next completion whenever it publishes or waits (the default in
    /// interrupt mode); without, it stays where it is put (interrupts
    /// suppressed until the device passes it).
    pub fn set_used_event(&mut self, q: u32, event: u16, each: bool) {
        let Guest { queues, ram, .. } = self;
        queues[q as usize]
            .as_mut()
            .expect("set up")
            .set_used_event(ram, event, each);
    }

    /// Suppresses completion interrupts of queue `q` (used_event half the
    /// index space away) or restores one interrupt per completion.
    pub fn suppress_irqs(&mut self, q: u32, suppress: bool) {
        let last = self.queue(q).last_used;
        if suppress {
            self.set_used_event(q, last.wrapping_add(0x8000), false);
        } else {
            self.set_used_event(q, last, true);
        }
    }
}
