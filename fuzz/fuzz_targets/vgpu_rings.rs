//! The vGPU device model under a hostile guest: arbitrary guest memory
//! contents, register writes in any order (queue registers, doorbells,
//! WAKE, resets), descriptor chains pointing anywhere, DMA mappings that
//! go away under running queues, all while the device's worker thread
//! processes the rings.
//!
//! The harness plays the vfio-user engine: it drives a fresh
//! `VgpuDevice` (software partition) through the `PciDevice` trait, with
//! the same bounds and permission checks the engine makes before calling
//! a model, and a `DeviceContext` whose map table holds
//!
//! | IOVA | size | backing |
//! |---|---|---|
//! | `RAM_IOVA` | 1 MiB | memfd, read-write: guest RAM the input fills |
//! | `ROM_IOVA` | 64 KiB | memfd, read-only |
//! | `REMOTE_IOVA` | 64 KiB | no fd: reached through `ClientDma` (a buffer here) |
//!
//! and MSI-X eventfds on every vector (or none, so interrupts go to INTx).
//!
//! The input is a flags byte then a sequence of operations, each an opcode
//! byte followed by its arguments (see `Op`); a short input ends the
//! sequence. Afterwards the device must still answer REG_MAGIC, and it must
//! stop (its worker joins) when dropped.

#![no_main]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use vfio_user_server::device::{BAR0_REGION, CONFIG_REGION, IRQ_INTX, IRQ_MSIX, NUM_REGIONS};
use vfio_user_server::dma::{ClientDma, MapRequest};
use vfio_user_server::irq::{SET_ACTION_TRIGGER, SET_DATA_EVENTFD};
use vfio_user_server::proto::MAX_DATA_XFER_SIZE;
use vfio_user_server::{DeviceContext, DmaError, DmaSpace, Interrupts, PciDevice};
use vgpu_abi as abi;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, PartitionSpec};
use vgpu_device::{VgpuConfig, VgpuDevice};

const RAM_IOVA: u64 = 0x10_0000;
const RAM_SIZE: u64 = 1 << 20;
const ROM_IOVA: u64 = 0x40_0000;
const ROM_SIZE: u64 = 64 << 10;
const REMOTE_IOVA: u64 = 0x50_0000;
const REMOTE_SIZE: u64 = 64 << 10;
/// Queues the function offers; queue numbers up to 16 are still written.
const QUEUES: u32 = 4;
const WINDOW_SIZE: u64 = 64 << 10;
/// Small, so that a kernel launched on it stays quick.
const PARTITION_MEMORY: u64 = 1 << 20;
/// Operations run per input at most.
const MAX_OPS: usize = 512;
/// Total sleeping per input at most.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// Client memory without an fd: what a VMM serves through DMA_READ and
/// DMA_WRITE messages.
struct RemoteMemory(Mutex<Vec<u8>>);

impl ClientDma for RemoteMemory {
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let mem = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let start = iova
            .checked_sub(REMOTE_IOVA)
            .ok_or(DmaError::NotMapped { iova })? as usize;
        let src = mem
            .get(start..start + buf.len())
            .ok_or(DmaError::NotMapped { iova })?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn dma_write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let mut mem = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let start = iova
            .checked_sub(REMOTE_IOVA)
            .ok_or(DmaError::NotMapped { iova })? as usize;
        let dst = mem
            .get_mut(start..start + buf.len())
            .ok_or(DmaError::NotMapped { iova })?;
        dst.copy_from_slice(buf);
        Ok(())
    }

    fn max_transfer(&self) -> usize {
        4096
    }
}

/// Reads the input front to back; zeros once it runs out.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// A guest address: the top 4 bits pick RAM, the read-only memory,
    /// the remote memory, or nothing mapped; the low 20 bits the offset.
    fn addr(&mut self) -> u64 {
        let sel = self.u32();
        let off = u64::from(sel & 0xf_ffff);
        match sel >> 28 {
            1 => ROM_IOVA + off % ROM_SIZE,
            2 => REMOTE_IOVA + off % REMOTE_SIZE,
            3 => off,
            4 => u64::MAX - off,
            _ => RAM_IOVA + off,
        }
    }
}

/// Where the harness put a queue's rings, to write chains into them.
#[derive(Clone, Copy)]
struct Ring {
    size: u16,
    desc: u64,
    avail: u64,
    next_desc: u16,
    avail_idx: u16,
}

struct Harness {
    dev: VgpuDevice,
    ctx: DeviceContext,
    ram: File,
    rom: File,
    remote: Arc<RemoteMemory>,
    doorbells: Arc<File>,
    rings: [Option<Ring>; QUEUES as usize],
    ram_mapped: bool,
    waited: Duration,
}

fn memfd(name: &std::ffi::CStr, size: u64) -> File {
    vfio_user_server::memfd::create(name, size).expect("memfd")
}

fn map(
    dma: &DmaSpace,
    iova: u64,
    size: u64,
    writable: bool,
    fd: Option<&File>,
    client: Arc<dyn ClientDma>,
) -> Option<vfio_user_server::dma::Mapped> {
    let req = MapRequest {
        iova,
        size,
        readable: true,
        writable,
        offset: 0,
    };
    let fd = fd.map(|f| f.try_clone().expect("dup memfd"));
    dma.map(&req, fd, client).expect("DMA map")
}

impl Harness {
    fn new(msix: bool) -> Harness {
        let backend = SoftwareBackend::new(PARTITION_MEMORY, 2);
        let partition = backend
            .create_partition(&PartitionSpec {
                name: "fuzz".into(),
                memory: PARTITION_MEMORY,
                compute_units: 2,
            })
            .expect("partition");
        let mut config = VgpuConfig::new("fuzz");
        config.queues = QUEUES;
        config.window_size = WINDOW_SIZE;
        config.poll_spin = Duration::from_micros(20);
        let mut dev = VgpuDevice::new(config, partition).expect("device");

        let infos = std::array::from_fn(|i| dev.irq_info(i as u32));
        let ctx = DeviceContext {
            dma: Arc::new(DmaSpace::new()),
            irqs: Interrupts::new(infos),
        };
        let ram = memfd(c"fuzz-ram", RAM_SIZE);
        let rom = memfd(c"fuzz-rom", ROM_SIZE);
        let remote = Arc::new(RemoteMemory(Mutex::new(vec![0; REMOTE_SIZE as usize])));
        let client: Arc<dyn ClientDma> = remote.clone();
        map(
            &ctx.dma,
            RAM_IOVA,
            RAM_SIZE,
            true,
            Some(&ram),
            client.clone(),
        );
        map(
            &ctx.dma,
            ROM_IOVA,
            ROM_SIZE,
            false,
            Some(&rom),
            client.clone(),
        );
        map(&ctx.dma, REMOTE_IOVA, REMOTE_SIZE, true, None, client);
        if msix {
            let count = dev.irq_info(IRQ_MSIX).count;
            let fds = (0..count).map(|_| eventfd()).collect();
            ctx.irqs
                .set(
                    IRQ_MSIX,
                    SET_DATA_EVENTFD | SET_ACTION_TRIGGER,
                    0,
                    count,
                    &[],
                    fds,
                )
                .expect("MSI-X eventfds");
        }
        ctx.irqs
            .set(
                IRQ_INTX,
                SET_DATA_EVENTFD | SET_ACTION_TRIGGER,
                0,
                1,
                &[],
                vec![eventfd()],
            )
            .expect("INTx eventfd");
        dev.bind(ctx.clone());
        let doorbells = dev
            .region_info(BAR0_REGION)
            .mmap
            .expect("BAR0 is mappable")
            .file;
        Harness {
            dev,
            ctx,
            ram,
            rom,
            remote,
            doorbells,
            rings: [None; QUEUES as usize],
            ram_mapped: true,
            waited: Duration::ZERO,
        }
    }

    /// A region write as the engine passes it on: only inside the region,
    /// of a permitted kind and size.
    fn write(&mut self, region: u32, offset: u64, data: &[u8]) {
        if self.access_ok(region, offset, data.len(), true) {
            let _ = self.dev.region_write(region, offset, data);
        }
    }

    fn read(&mut self, region: u32, offset: u64, len: usize) -> Option<Vec<u8>> {
        if !self.access_ok(region, offset, len, false) {
            return None;
        }
        let mut buf = vec![0; len];
        self.dev
            .region_read(region, offset, &mut buf)
            .ok()
            .map(|()| buf)
    }

    /// The checks of the engine's `check_access`.
    fn access_ok(&self, region: u32, offset: u64, len: usize, write: bool) -> bool {
        if region >= NUM_REGIONS || len as u64 > u64::from(MAX_DATA_XFER_SIZE) {
            return false;
        }
        let info = self.dev.region_info(region);
        let allowed = if write { info.writable } else { info.readable };
        allowed
            && offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= info.size)
    }

    fn reg_write(&mut self, offset: u64, value: u32) {
        self.write(BAR0_REGION, offset, &value.to_le_bytes());
    }

    fn ram_write(&self, addr: u64, data: &[u8]) {
        if let Some(off) = addr.checked_sub(RAM_IOVA).filter(|o| *o < RAM_SIZE) {
            let n = data.len().min((RAM_SIZE - off) as usize);
            self.ram
                .write_all_at(&data[..n], off)
                .expect("write guest RAM");
        } else if let Some(off) = addr.checked_sub(ROM_IOVA).filter(|o| *o < ROM_SIZE) {
            let n = data.len().min((ROM_SIZE - off) as usize);
            self.rom
                .write_all_at(&data[..n], off)
                .expect("write guest ROM");
        } else if let Some(off) = addr.checked_sub(REMOTE_IOVA).filter(|o| *o < REMOTE_SIZE) {
            let mut mem = self.remote.0.lock().unwrap_or_else(|e| e.into_inner());
            let off = off as usize;
            let n = data.len().min(mem.len() - off);
            mem[off..off + n].copy_from_slice(&data[..n]);
        }
    }

    /// The guest's store to a doorbell, straight into the mapped page.
    fn doorbell_store(&self, offset: u64, data: &[u8]) {
        if offset < abi::DOORBELL_SIZE {
            let n = data.len().min((abi::DOORBELL_SIZE - offset) as usize);
            self.doorbells
                .write_all_at(&data[..n], abi::DOORBELL_OFFSET + offset)
                .expect("doorbell store");
        }
    }

    fn wait(&mut self, micros: u64) {
        let d = Duration::from_micros(micros).min(MAX_WAIT.saturating_sub(self.waited));
        if !d.is_zero() {
            std::thread::sleep(d);
            self.waited += d;
        }
    }

    /// Sets queue `q` up the way the guest driver does, with its rings in
    /// 64 KiB slot `slot` of RAM.
    fn setup_queue(&mut self, q: u32, size_log: u32, slot: u64, control: u32) {
        let size = 1u32 << size_log;
        let base = RAM_IOVA + slot * (64 << 10);
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
        let reg = |r| abi::queue_reg(q, r);
        self.reg_write(reg(abi::QREG_CONTROL), 0);
        self.reg_write(reg(abi::QREG_SIZE), size);
        for (r, a) in [
            (abi::QREG_DESC, desc),
            (abi::QREG_AVAIL, avail),
            (abi::QREG_USED, used),
        ] {
            self.reg_write(reg(r), a as u32);
            self.reg_write(reg(r + 4), (a >> 32) as u32);
        }
        if let Some(slot) = self.rings.get_mut(q as usize) {
            *slot = Some(Ring {
                size: size as u16,
                desc,
                avail,
                next_desc: 0,
                avail_idx: 0,
            });
        }
        self.reg_write(reg(abi::QREG_CONTROL), control);
    }

    /// Writes a descriptor chain into queue `q`'s rings and publishes it.
    fn submit(&mut self, q: usize, descs: &[(u64, u32, u16)], kick: u8) {
        let Some(Some(mut ring)) = self.rings.get(q).copied() else {
            return;
        };
        let head = ring.next_desc;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = ring.next_desc;
            ring.next_desc = (ring.next_desc + 1) % ring.size;
            let next = if i + 1 < descs.len() {
                ring.next_desc
            } else {
                0
            };
            let flags = if i + 1 < descs.len() {
                flags | 1
            } else {
                flags & !1
            };
            let mut raw = [0u8; 16];
            raw[0..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&flags.to_le_bytes());
            raw[14..16].copy_from_slice(&next.to_le_bytes());
            self.ram_write(ring.desc + 16 * u64::from(idx), &raw);
        }
        let slot = u64::from(ring.avail_idx % ring.size);
        self.ram_write(ring.avail + 4 + 2 * slot, &head.to_le_bytes());
        ring.avail_idx = ring.avail_idx.wrapping_add(1);
        self.ram_write(ring.avail + 2, &ring.avail_idx.to_le_bytes());
        self.rings[q] = Some(ring);
        if kick & 1 != 0 {
            let db = abi::doorbell(q as u32, abi::DB_AVAIL_IDX);
            self.doorbell_store(db, &u32::from(ring.avail_idx).to_le_bytes());
        }
        if kick & 2 != 0 {
            self.reg_write(abi::REG_WAKE, 1);
        }
    }

    fn toggle_ram_mapping(&mut self) {
        if self.ram_mapped {
            let removed = self
                .ctx
                .dma
                .unmap(RAM_IOVA, RAM_SIZE)
                .expect("unmap guest RAM");
            self.dev.dma_unmapped(removed.ranges());
        } else {
            let client: Arc<dyn ClientDma> = self.remote.clone();
            if let Some(m) = map(
                &self.ctx.dma,
                RAM_IOVA,
                RAM_SIZE,
                true,
                Some(&self.ram),
                client,
            ) {
                self.dev.dma_mapped(&m);
            }
        }
        self.ram_mapped = !self.ram_mapped;
    }

    fn run(&mut self, input: &mut Input<'_>) {
        for _ in 0..MAX_OPS {
            if input.is_empty() {
                break;
            }
            match input.u8() % 16 {
                // Guest memory: address, length, bytes.
                0 => {
                    let addr = input.addr();
                    let len = usize::from(input.u8());
                    let data = input.bytes(len).to_vec();
                    self.ram_write(addr, &data);
                }
                // A 32-bit BAR0 access anywhere, aligned or not.
                1 => {
                    let off = u64::from(input.u16() & 0x3fff);
                    let v = input.u32();
                    self.reg_write(off, v);
                }
                // A 64-bit BAR0 access.
                2 => {
                    let off = u64::from(input.u16() & 0x3fff);
                    let v = input.u64();
                    self.write(BAR0_REGION, off, &v.to_le_bytes());
                }
                // A queue register, queues 0..=16.
                3 => {
                    const REGS: [u64; 12] = [
                        abi::QREG_SIZE,
                        abi::QREG_CONTROL,
                        abi::QREG_STATUS,
                        abi::QREG_ERROR,
                        abi::QREG_DESC,
                        abi::QREG_DESC + 4,
                        abi::QREG_AVAIL,
                        abi::QREG_AVAIL + 4,
                        abi::QREG_USED,
                        abi::QREG_USED + 4,
                        abi::QREG_MSIX_VECTOR,
                        0x2c,
                    ];
                    let q = u32::from(input.u8()) % (abi::MAX_QUEUES + 1);
                    let r = REGS[usize::from(input.u8()) % REGS.len()];
                    let v = input.u32();
                    if abi::queue_reg(q, r) < abi::DOORBELL_OFFSET {
                        self.reg_write(abi::queue_reg(q, r), v);
                    }
                }
                // Queue setup as a driver does it.
                4 => {
                    let q = u32::from(input.u8()) % QUEUES;
                    let size_log = u32::from(input.u8()) % 11;
                    let slot = u64::from(input.u8() % 16);
                    let control = u32::from(input.u8() & 3);
                    self.setup_queue(q, size_log, slot, control);
                }
                // Device control: enable, reset, or anything.
                5 => {
                    let v = match input.u8() % 3 {
                        0 => abi::CONTROL_ENABLE,
                        1 => abi::CONTROL_RESET,
                        _ => input.u32(),
                    };
                    self.reg_write(abi::REG_CONTROL, v);
                }
                // A chain of 1..=4 descriptors, published and kicked.
                6 => {
                    let q = usize::from(input.u8()) % QUEUES as usize;
                    let n = usize::from(input.u8() % 4) + 1;
                    let descs: Vec<(u64, u32, u16)> = (0..n)
                        .map(|_| {
                            let addr = input.addr();
                            let len = u32::from(input.u16());
                            let flags = u16::from(input.u8());
                            (addr, len, flags)
                        })
                        .collect();
                    let kick = input.u8();
                    self.submit(q, &descs, kick);
                }
                // Doorbell: the guest's direct store, or a trapped write.
                7 => {
                    let q = u32::from(input.u8()) % (abi::MAX_QUEUES + 1);
                    let field = if input.u8() & 1 == 0 {
                        abi::DB_AVAIL_IDX
                    } else {
                        abi::DB_POLLING
                    };
                    let v = u32::from(input.u16());
                    let off = abi::doorbell(q, field);
                    if input.u8() & 1 == 0 {
                        self.doorbell_store(off, &v.to_le_bytes());
                    } else {
                        self.write(BAR0_REGION, abi::DOORBELL_OFFSET + off, &v.to_le_bytes());
                    }
                }
                8 => self.reg_write(abi::REG_WAKE, input.u32()),
                // Let the worker run.
                9 => {
                    let micros = u64::from(input.u8()) * 4;
                    self.wait(micros);
                }
                // Reads: any register, the error log, the doorbell page.
                10 => {
                    let off = u64::from(input.u16() & 0x3fff);
                    let len = [4, 8, 1, 2][usize::from(input.u8() % 4)];
                    let _ = self.read(BAR0_REGION, off, len);
                }
                // Configuration space.
                11 => {
                    let off = u64::from(input.u16() & 0xfff);
                    let len = [1, 2, 4][usize::from(input.u8() % 3)];
                    let v = input.u32().to_le_bytes();
                    self.write(CONFIG_REGION, off, &v[..len]);
                    let _ = self.read(CONFIG_REGION, off, len);
                }
                // The window (BAR2).
                12 => {
                    let off = u64::from(input.u32()) % (WINDOW_SIZE + 16);
                    let len = usize::from(input.u8());
                    let data = input.bytes(len).to_vec();
                    self.write(abi::BAR_WINDOW, off, &data);
                    let _ = self.read(abi::BAR_WINDOW, off, len);
                }
                // Function-level reset (DEVICE_RESET or the client leaving).
                13 => self.dev.reset(),
                // Guest RAM unmapped under the queues, or mapped again.
                14 => self.toggle_ram_mapping(),
                // Interrupt cause and mask.
                _ => {
                    let r = if input.u8() & 1 == 0 {
                        abi::REG_IRQ_CAUSE
                    } else {
                        abi::REG_IRQ_MASK
                    };
                    let v = input.u32();
                    self.reg_write(r, v);
                }
            }
        }
    }
}

fn eventfd() -> File {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just created and nobody else owns it.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data };
    let flags = input.u8();
    let mut h = Harness::new(flags & 1 == 0);
    h.run(&mut input);

    let magic = h
        .read(BAR0_REGION, abi::REG_MAGIC, 4)
        .expect("REG_MAGIC reads");
    assert_eq!(
        u32::from_le_bytes(magic.try_into().expect("4 bytes")),
        abi::ABI_MAGIC,
        "the device no longer answers REG_MAGIC"
    );
    // Dropping the device stops and joins its worker: a worker stuck on
    // something shows as a libFuzzer timeout here.
    drop(h);
});
