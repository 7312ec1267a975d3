//! cloud-hypervisor as a vfio-user client, message for message: its device
//! creation (`vmm/src/device_manager.rs` `add_vfio_user_device`), its PCI
//! glue (`pci/src/vfio.rs` `VfioCommon`, `pci/src/vfio_user.rs`) and its
//! removal, on top of the `vfio_user` crate at the version it pins.
//!
//! What it does that a generic client does not, and that the server must
//! survive:
//! - it never looks at a reply's error flag: an error reply to a command
//!   whose reply carries a payload (REGION_READ, REGION_WRITE,
//!   GET_IRQ_INFO, DMA_UNMAP) leaves it waiting for bytes that never come;
//! - it reads the extended capability list at 0x100 when it finds both a
//!   PCI Express and a power-management capability;
//! - it passes the guest's config accesses (any offset below 4 KiB) and
//!   BAR accesses (any size, any alignment) through as they are;
//! - it turns INTx on at once and sends an INTx UNMASK after every trapped
//!   BAR access while INTx is on; enabling MSI-X turns INTx off and sends
//!   the MSI-X eventfds in batches of 16;
//! - it resets the device only when the device does NOT advertise reset
//!   (the check in `vfio_user::Client` is inverted), and maps every guest
//!   RAM region READ|WRITE with an fd.
//!
//! Every call blocks like the real VMM; [`Vmm`] runs them on a thread of
//! their own behind a watchdog so that a hang fails a test instead of
//! stalling it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use vfio_user::Client;
use vm_memory::{MmapRegion, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;

use crate::guest::sealed_ram;
use crate::ring::Ram;

// Wire values come from vfio-bindings, as cloud-hypervisor takes them,
// rather than from the server under test.
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER as SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_ACTION_UNMASK as SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD as SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE as SET_DATA_NONE, VFIO_PCI_CONFIG_REGION_INDEX as CONFIG_REGION,
    VFIO_PCI_INTX_IRQ_INDEX as IRQ_INTX, VFIO_PCI_MSIX_IRQ_INDEX as IRQ_MSIX,
    VFIO_PCI_MSI_IRQ_INDEX as IRQ_MSI, VFIO_PCI_ROM_REGION_INDEX as ROM_REGION,
    VFIO_REGION_INFO_FLAG_MMAP as REGION_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ as REGION_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE as REGION_FLAG_WRITE,
};
const CAP_PTR_MASK: u8 = 0xfc;
const CAP_ID_PM: u8 = 0x01;
const CAP_ID_MSI: u8 = 0x05;
const CAP_ID_EXP: u8 = 0x10;
const CAP_ID_MSIX: u8 = 0x11;
/// Dword index of the first BAR and of the expansion ROM BAR.
const BAR0_REG: usize = 4;
const ROM_REG: usize = 12;
const HEADER_TYPE_REG: usize = 3;
/// cloud-hypervisor sends at most this many eventfds per SET_IRQS.
const FDS_PER_SET_IRQS: usize = 16;
/// Where it places 32- and 64-bit BARs (any free guest addresses do).
const MMIO32_BASE: u64 = 0xc000_0000;
const MMIO64_BASE: u64 = 0x80_0000_0000;

/// Guest RAM as cloud-hypervisor makes it with `--memory ...,shared=on`:
/// one shared memfd, in regions at guest addresses.
pub struct GuestRam {
    file: File,
    regions: Vec<RamRegion>,
}

struct RamRegion {
    gpa: u64,
    size: u64,
    file_offset: u64,
}

impl GuestRam {
    /// RAM of the given `(guest address, size)` regions, laid out one
    /// after another in one memfd.
    pub fn new(layout: &[(u64, u64)]) -> GuestRam {
        let total = layout.iter().map(|r| r.1).sum();
        let file = sealed_ram(total).expect("memfd for guest RAM");
        let mut file_offset = 0;
        let regions = layout
            .iter()
            .map(|&(gpa, size)| {
                let r = RamRegion {
                    gpa,
                    size,
                    file_offset,
                };
                file_offset += size;
                r
            })
            .collect();
        GuestRam { file, regions }
    }

    /// The guest's view of region `i` (what its driver writes rings into).
    pub fn region(&self, i: usize) -> Ram {
        let r = &self.regions[i];
        Ram::new(
            crate::guest::map_shared(&self.file, r.file_offset, r.size),
            r.gpa,
        )
    }

    /// The same RAM (a duplicate of its fd), for another thread.
    pub fn share(&self) -> GuestRam {
        GuestRam {
            file: self.file.try_clone().expect("dup of the RAM memfd"),
            regions: self.regions.iter().map(|r| RamRegion { ..*r }).collect(),
        }
    }
}

/// A BAR as cloud-hypervisor tracks it.
struct MmioRegion {
    index: u32,
    start: u64,
    length: u64,
    /// The areas it mapped into the guest: (offset in the BAR, mapping).
    maps: Vec<(u64, MmapRegion)>,
}

/// The MSI-X capability as cloud-hypervisor caches it.
struct Msix {
    cap_offset: u32,
    msg_ctl: u16,
    table: u32,
    pba: u32,
    /// Its emulation of the table the guest programs.
    table_entries: Vec<[u32; 4]>,
}

impl Msix {
    fn enabled(&self) -> bool {
        self.msg_ctl & (1 << 15) != 0
    }
    fn table_size(&self) -> u64 {
        u64::from(self.msg_ctl & 0x7ff) + 1
    }
    fn table_accessed(&self, index: u32, offset: u64) -> bool {
        let start = u64::from(self.table & !7);
        index == self.table & 7 && offset >= start && offset < start + self.table_size() * 16
    }
}

/// Messages the replay sent, by kind, for the tests' figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    /// REGION_READ of config space.
    pub config_reads: u64,
    /// REGION_READ or REGION_WRITE of a BAR.
    pub bar_accesses: u64,
    /// SET_IRQS(INTx, UNMASK).
    pub intx_unmasks: u64,
}

/// One vfio-user device as cloud-hypervisor holds it.
pub struct ChDevice {
    client: Client,
    ram: GuestRam,
    bars: Vec<MmioRegion>,
    /// Its own copy of the BAR registers (BAR0-5, ROM): guests see these,
    /// never the device's.
    shadow_bars: [u32; 7],
    bar_sizes: [u64; 7],
    msix: Option<Msix>,
    intx: Option<(EventFd, bool)>,
    msix_fds: Vec<EventFd>,
    /// Patches it applies to config dwords (extended capabilities it hides).
    patches: Vec<(usize, u32, u32)>,
    /// Figures.
    pub sent: Sent,
}

/// Errors the replay reports where cloud-hypervisor fails device creation.
pub type ChError = String;

impl ChDevice {
    /// `add_vfio_user_device`: connects, creates the PCI glue, maps guest
    /// RAM, sizes and places the BARs and maps their mmap areas.
    pub fn create(socket: &Path, ram: &GuestRam) -> Result<ChDevice, ChError> {
        let mut client = Client::new(socket).map_err(|e| format!("Client::new: {e}"))?;
        // VfioUserPciDevice::new
        if client.resettable() {
            client.reset().map_err(|e| format!("reset: {e}"))?;
        }
        let mut dev = ChDevice {
            client,
            ram: ram.share(),
            bars: Vec::new(),
            shadow_bars: [0; 7],
            bar_sizes: [0; 7],
            msix: None,
            intx: None,
            msix_fds: Vec::new(),
            patches: Vec::new(),
            sent: Sent::default(),
        };
        // VfioCommon::new: a vfio-user device reports no migration.
        dev.parse_capabilities();
        dev.initialize_legacy_interrupt()?;
        // add_vfio_user_device: every RAM region, with its fd.
        for r in &ram.regions {
            dev.client
                .dma_map(r.file_offset, r.gpa, r.size, ram.file.as_raw_fd())
                .map_err(|e| format!("dma_map: {e}"))?;
        }
        dev.allocate_bars();
        dev.map_mmio_regions()?;
        Ok(dev)
    }

    fn read_config(&mut self, offset: u32, data: &mut [u8]) {
        self.sent.config_reads += 1;
        let _ = self.client.region_read(CONFIG_REGION, offset.into(), data);
    }

    fn read_config_byte(&mut self, offset: u32) -> u8 {
        let mut b = [0u8; 1];
        self.read_config(offset, &mut b);
        b[0]
    }

    fn read_config_word(&mut self, offset: u32) -> u16 {
        let mut b = [0u8; 2];
        self.read_config(offset, &mut b);
        u16::from_le_bytes(b)
    }

    fn read_config_dword(&mut self, offset: u32) -> u32 {
        let mut b = [0u8; 4];
        self.read_config(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn write_config(&mut self, offset: u32, data: &[u8]) {
        let _ = self.client.region_write(CONFIG_REGION, offset.into(), data);
    }

    fn get_irq_info_count(&mut self, index: u32) -> Option<u32> {
        self.client.get_irq_info(index).ok().map(|i| i.count)
    }

    fn has_capabilities(&mut self) -> bool {
        self.read_config_word(0x06) & (1 << 4) != 0
    }

    fn parse_capabilities(&mut self) {
        if !self.has_capabilities() {
            return;
        }
        let mut cap_iter = self.read_config_byte(0x34) & CAP_PTR_MASK;
        let (mut express, mut power) = (false, false);
        while cap_iter != 0 {
            let cap_id = self.read_config_byte(cap_iter.into());
            match cap_id {
                CAP_ID_MSI if self.get_irq_info_count(IRQ_MSI).is_some_and(|c| c > 0) => {
                    self.read_config_word(u32::from(cap_iter) + 2);
                }
                CAP_ID_MSIX if self.get_irq_info_count(IRQ_MSIX).is_some_and(|c| c > 0) => {
                    let off = u32::from(cap_iter);
                    let msg_ctl = self.read_config_word(off + 2);
                    let table = self.read_config_dword(off + 4);
                    let pba = self.read_config_dword(off + 8);
                    let entries = usize::from(msg_ctl & 0x7ff) + 1;
                    self.msix = Some(Msix {
                        cap_offset: off,
                        msg_ctl,
                        table,
                        pba,
                        // Each entry starts masked.
                        table_entries: vec![[0, 0, 0, 1]; entries],
                    });
                }
                CAP_ID_EXP => express = true,
                CAP_ID_PM => power = true,
                _ => {}
            }
            let cap_next = self.read_config_byte(u32::from(cap_iter) + 1) & CAP_PTR_MASK;
            if cap_next == 0 || cap_next == cap_iter {
                break;
            }
            cap_iter = cap_next;
        }
        if express && power {
            self.parse_extended_capabilities();
        }
    }

    fn parse_extended_capabilities(&mut self) {
        let mut offset = 0x100;
        // cloud-hypervisor follows the list without a bound; the replay
        // stops after a page's worth so that a looping list fails a test
        // rather than spinning it.
        for _ in 0..1024 {
            let hdr = self.read_config_dword(offset);
            let id = hdr & 0xffff;
            let next = (hdr >> 20) & 0xfff;
            // ARI, resizable BAR and SR-IOV are hidden from the guest.
            if matches!(id, 0x0e | 0x15 | 0x10) {
                self.patches.push(((offset / 4) as usize, 0xffff, 0));
            }
            if next == 0 {
                return;
            }
            offset = next;
        }
    }

    fn initialize_legacy_interrupt(&mut self) -> Result<(), ChError> {
        if self.get_irq_info_count(IRQ_INTX) == Some(0) {
            return Ok(());
        }
        let efd = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
        self.intx = Some((efd, false));
        self.enable_intx()
    }

    fn enable_intx(&mut self) -> Result<(), ChError> {
        let Some((efd, enabled)) = &self.intx else {
            return Ok(());
        };
        if *enabled {
            return Ok(());
        }
        let fd = efd.as_raw_fd();
        self.client
            .set_irqs(IRQ_INTX, SET_DATA_EVENTFD | SET_ACTION_TRIGGER, 0, 1, &[fd])
            .map_err(|e| format!("enable INTx: {e}"))?;
        if let Some((_, enabled)) = &mut self.intx {
            *enabled = true;
        }
        Ok(())
    }

    fn disable_intx(&mut self) {
        if self.intx_in_use() {
            let ok = self
                .client
                .set_irqs(IRQ_INTX, SET_DATA_NONE | SET_ACTION_TRIGGER, 0, 0, &[])
                .is_ok();
            if let (true, Some((_, enabled))) = (ok, &mut self.intx) {
                *enabled = false;
            }
        }
    }

    /// Whether INTx is on (until the guest enables MSI-X).
    pub fn intx_in_use(&self) -> bool {
        self.intx.as_ref().is_some_and(|i| i.1)
    }

    fn enable_msix(&mut self) -> Result<(), ChError> {
        let Some(msix) = &self.msix else {
            return Ok(());
        };
        let n = msix.table_entries.len();
        if self.msix_fds.len() != n {
            self.msix_fds = (0..n)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"))
                .collect();
        }
        let fds: Vec<i32> = self.msix_fds.iter().map(|e| e.as_raw_fd()).collect();
        for (i, chunk) in fds.chunks(FDS_PER_SET_IRQS).enumerate() {
            self.client
                .set_irqs(
                    IRQ_MSIX,
                    SET_DATA_EVENTFD | SET_ACTION_TRIGGER,
                    (i * FDS_PER_SET_IRQS) as u32,
                    chunk.len() as u32,
                    chunk,
                )
                .map_err(|e| format!("enable MSI-X: {e}"))?;
        }
        Ok(())
    }

    fn disable_msix(&mut self) {
        let _ = self
            .client
            .set_irqs(IRQ_MSIX, SET_DATA_NONE | SET_ACTION_TRIGGER, 0, 0, &[]);
    }

    fn allocate_bars(&mut self) {
        let (mut next32, mut next64) = (MMIO32_BASE, MMIO64_BASE);
        let mut bar_id = 0u32;
        while bar_id < CONFIG_REGION {
            let bar_offset = if bar_id == ROM_REGION {
                (ROM_REG * 4) as u32
            } else {
                0x10 + bar_id * 4
            };
            let flags = self.read_config_dword(bar_offset);
            let rom = bar_id == ROM_REGION;
            let io_bar = !rom && flags & 0x1 == 0x1;
            let is_64bit = !rom && flags & 0x4 == 0x4;
            self.write_config(bar_offset, &0xffff_ffffu32.to_le_bytes());
            let mut lower = self.read_config_dword(bar_offset);
            let size = if io_bar {
                lower &= !0b11;
                if lower == 0 {
                    bar_id += 1;
                    continue;
                }
                u64::from((!lower).wrapping_add(1))
            } else if is_64bit {
                let upper_offset = 0x10 + (bar_id + 1) * 4;
                self.write_config(upper_offset, &0xffff_ffffu32.to_le_bytes());
                let upper = self.read_config_dword(upper_offset);
                let combined = ((u64::from(upper) << 32) | u64::from(lower)) & !0b1111;
                if combined == 0 {
                    bar_id += 1;
                    continue;
                }
                (!combined).wrapping_add(1)
            } else {
                lower &= !0b1111;
                if lower == 0 {
                    bar_id += 1;
                    continue;
                }
                u64::from((!lower).wrapping_add(1))
            };
            // Naturally aligned, as its allocators place them.
            let next = if is_64bit { &mut next64 } else { &mut next32 };
            let start = next.next_multiple_of(size.max(4096));
            *next = start + size;
            let slot = if rom { 6 } else { bar_id as usize };
            self.shadow_bars[slot] = (start as u32) | (flags & 0xf);
            self.bar_sizes[slot] = size;
            if is_64bit {
                self.shadow_bars[slot + 1] = (start >> 32) as u32;
            }
            self.bars.push(MmioRegion {
                index: bar_id,
                start,
                length: size,
                maps: Vec::new(),
            });
            bar_id += if is_64bit { 2 } else { 1 };
        }
    }

    fn map_mmio_regions(&mut self) -> Result<(), ChError> {
        for bar in &mut self.bars {
            let Some(region) = self.client.region(bar.index) else {
                continue;
            };
            if region.flags & REGION_FLAG_MMAP == 0 {
                continue;
            }
            let mut prot = 0;
            if region.flags & REGION_FLAG_READ != 0 {
                prot |= libc::PROT_READ;
            }
            if region.flags & REGION_FLAG_WRITE != 0 {
                prot |= libc::PROT_WRITE;
            }
            let areas: Vec<(u64, u64)> = if region.sparse_areas.is_empty() {
                vec![(0, bar.length)]
            } else {
                region
                    .sparse_areas
                    .iter()
                    .map(|a| (a.offset, a.size))
                    .collect()
            };
            let fo = region
                .file_offset
                .as_ref()
                .ok_or_else(|| format!("region {} is mmappable without an fd", bar.index))?;
            for (offset, size) in areas {
                let map = vm_memory::mmap::MmapRegionBuilder::new(size as usize)
                    .with_file_offset(vm_memory::FileOffset::new(
                        fo.file().try_clone().map_err(|e| e.to_string())?,
                        fo.start() + offset,
                    ))
                    .with_mmap_prot(prot)
                    .with_mmap_flags(libc::MAP_SHARED)
                    .build()
                    .map_err(|e| {
                        format!("Could not mmap sparse area {offset:#x}+{size:#x}: {e}")
                    })?;
                bar.maps.push((offset, map));
            }
        }
        Ok(())
    }

    // ---- what a guest's accesses become ----

    fn msix_cap_idx(&mut self) -> Option<usize> {
        if !self.has_capabilities() {
            return None;
        }
        let mut next = self.read_config_byte(0x34) & CAP_PTR_MASK;
        while next != 0 {
            if self.read_config_byte(next.into()) == CAP_ID_MSIX {
                return Some(next.into());
            }
            let ptr = self.read_config_byte(u32::from(next) + 1) & CAP_PTR_MASK;
            if ptr == next {
                break;
            }
            next = ptr;
        }
        None
    }

    /// A guest's config read of dword `reg_idx` (ECAM reaches any of the
    /// 1024 dwords of a PCI Express function).
    pub fn read_config_register(&mut self, reg_idx: usize) -> u32 {
        if (BAR0_REG..BAR0_REG + 6).contains(&reg_idx) {
            return self.shadow_bar_read(reg_idx - BAR0_REG);
        }
        if reg_idx == ROM_REG {
            return self.shadow_bar_read(6);
        }
        if let Some(id) = self.msix_cap_idx() {
            if let Some(m) = &self.msix {
                if reg_idx * 4 == id + 4 {
                    return m.table;
                } else if reg_idx * 4 == id + 8 {
                    return m.pba;
                }
            }
        }
        let mask = if reg_idx == HEADER_TYPE_REG {
            0xff7f_ffff
        } else {
            0xffff_ffff
        };
        let mut value = self.read_config_dword((reg_idx * 4) as u32) & mask;
        for &(r, m, p) in &self.patches {
            if r == reg_idx {
                value = (value & !m) | p;
            }
        }
        value
    }

    fn shadow_bar_read(&self, slot: usize) -> u32 {
        self.shadow_bars[slot]
    }

    /// A guest's config write of `data` at byte `offset` of dword `reg_idx`.
    pub fn write_config_register(
        &mut self,
        reg_idx: usize,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ChError> {
        let slot = match reg_idx {
            r if (BAR0_REG..BAR0_REG + 6).contains(&r) => Some(r - BAR0_REG),
            ROM_REG => Some(6),
            _ => None,
        };
        if let Some(slot) = slot {
            // BARs live in its own configuration; sizing reads back the mask.
            if data.len() == 4 {
                let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                let size = self.bar_sizes[slot];
                self.shadow_bars[slot] = if size == 0 {
                    0
                } else {
                    (v & !((size as u32).wrapping_sub(1))) | (self.shadow_bars[slot] & 0xf)
                };
            }
            return Ok(());
        }
        let reg = (reg_idx * 4) as u64;
        let toggle = match &mut self.msix {
            Some(m) if reg == u64::from(m.cap_offset) => {
                let before = m.enabled();
                if offset == 2 && data.len() == 2 {
                    m.msg_ctl = u16::from_le_bytes([data[0], data[1]]);
                } else if offset == 0 && data.len() == 4 {
                    m.msg_ctl =
                        (u32::from_le_bytes([data[0], data[1], data[2], data[3]]) >> 16) as u16;
                }
                match (before, m.enabled()) {
                    (false, true) => Some(true),
                    (true, false) => Some(false),
                    _ => None,
                }
            }
            _ => None,
        };
        match toggle {
            Some(true) => {
                self.disable_intx();
                self.enable_msix()?;
            }
            Some(false) => {
                self.disable_msix();
                self.enable_intx()?;
            }
            None => {}
        }
        self.write_config((reg + offset) as u32, data);
        Ok(())
    }

    fn find_bar(&self, addr: u64) -> Option<(u32, u64)> {
        self.bars
            .iter()
            .find(|b| addr >= b.start && addr < b.start + b.length)
            .map(|b| (b.index, addr - b.start))
    }

    /// Sends the INTx UNMASK that follows every trapped BAR access while
    /// INTx is on ("INTx EOI").
    fn intx_eoi(&mut self) {
        if self.intx_in_use() {
            self.sent.intx_unmasks += 1;
            let _ = self
                .client
                .set_irqs(IRQ_INTX, SET_DATA_NONE | SET_ACTION_UNMASK, 0, 1, &[]);
        }
    }

    /// A guest's trapped read at guest physical address `addr`.
    pub fn read_bar(&mut self, addr: u64, data: &mut [u8]) {
        if let Some((index, offset)) = self.find_bar(addr) {
            match &self.msix {
                Some(m) if m.table_accessed(index, offset) => {
                    let rel = offset - u64::from(m.table & !7);
                    let e = m.table_entries[(rel / 16) as usize];
                    let word = e[((rel % 16) / 4) as usize].to_le_bytes();
                    for (i, b) in data.iter_mut().enumerate() {
                        *b = word.get((rel % 4) as usize + i).copied().unwrap_or(0);
                    }
                }
                _ => {
                    self.sent.bar_accesses += 1;
                    let _ = self.client.region_read(index, offset, data);
                }
            }
        }
        self.intx_eoi();
    }

    /// A guest's trapped write at guest physical address `addr`.
    pub fn write_bar(&mut self, addr: u64, data: &[u8]) {
        if let Some((index, offset)) = self.find_bar(addr) {
            match &mut self.msix {
                Some(m) if m.table_accessed(index, offset) => {
                    let rel = offset - u64::from(m.table & !7);
                    if data.len() == 4 && rel % 4 == 0 {
                        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                        m.table_entries[(rel / 16) as usize][((rel % 16) / 4) as usize] = v;
                    }
                }
                _ => {
                    self.sent.bar_accesses += 1;
                    let _ = self.client.region_write(index, offset, data);
                }
            }
        }
        self.intx_eoi();
    }

    /// The guest address BAR `index` was placed at.
    pub fn bar_base(&self, index: u32) -> Option<u64> {
        self.bars.iter().find(|b| b.index == index).map(|b| b.start)
    }

    /// The guest's direct mapping of BAR `index` at `offset` (an mmap area
    /// placed in a KVM memslot: guest accesses there never trap).
    pub fn mapped(&self, index: u32, offset: u64) -> Option<&MmapRegion> {
        self.bars
            .iter()
            .find(|b| b.index == index)?
            .maps
            .iter()
            .find(|(o, m)| offset >= *o && offset < o + m.len() as u64)
            .map(|(_, m)| m)
    }

    /// The INTx eventfd (KVM's irqfd of the device's pin).
    pub fn intx_eventfd(&self) -> Option<&EventFd> {
        self.intx.as_ref().map(|i| &i.0)
    }

    /// The eventfd of MSI-X vector `v`, once the guest enabled MSI-X.
    pub fn msix_eventfd(&self, v: usize) -> Option<&EventFd> {
        self.msix_fds.get(v)
    }

    /// The MSI-X capability's offset, if it found one.
    pub fn msix_cap_offset(&self) -> Option<u32> {
        self.msix.as_ref().map(|m| m.cap_offset)
    }

    /// `ch-remote remove-device`: DMA_UNMAP of every RAM region, then the
    /// device is dropped.
    pub fn eject(mut self) {
        let regions: Vec<(u64, u64)> = self.ram.regions.iter().map(|r| (r.gpa, r.size)).collect();
        for (gpa, size) in regions {
            let _ = self.client.dma_unmap(gpa, size);
        }
    }
}

impl Drop for ChDevice {
    /// `VfioUserPciDevice::drop`: its BAR mappings go, MSI-X and INTx are
    /// turned off if on, and the socket is shut.
    fn drop(&mut self) {
        for bar in &mut self.bars {
            bar.maps.clear();
        }
        if self.msix.as_ref().is_some_and(|m| m.enabled()) {
            self.disable_msix();
        }
        self.disable_intx();
        let _ = self.client.shutdown();
    }
}

/// Whether `efd` fires within `timeout`; consumes the count.
pub fn wait_eventfd(efd: &EventFd, timeout: Duration) -> bool {
    let mut pfd = [libc::pollfd {
        fd: efd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = vgpu_sys::poll::timeout_ms(timeout);
    vgpu_sys::poll::poll(&mut pfd, ms).is_ok_and(|n| n > 0) && efd.read().is_ok()
}

/// Reads one byte of the guest's direct mapping.
pub fn mapped_u32(m: &MmapRegion, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    if let Ok(s) = m.get_slice(offset as usize, 4) {
        s.copy_to(&mut b);
    }
    u32::from_le_bytes(b)
}

type Job = Box<dyn FnOnce(&mut Option<ChDevice>) + Send>;

/// The VMM's thread: runs each step on the device it holds, and fails the
/// calling test when a step does not finish within the watchdog.
pub struct Vmm {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    watchdog: Duration,
}

impl Vmm {
    /// A VMM thread with no device yet.
    pub fn new(watchdog: Duration) -> Vmm {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("cloud-hypervisor".into())
            .spawn(move || {
                let mut dev = None;
                for job in rx {
                    job(&mut dev);
                }
            })
            .expect("VMM thread");
        Vmm {
            jobs: Some(tx),
            thread: Some(thread),
            watchdog,
        }
    }

    /// Runs `f` on the VMM thread; panics when it takes longer than the
    /// watchdog (cloud-hypervisor would wait forever) or panics itself.
    pub fn step<R: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Option<ChDevice>) -> R + Send + 'static,
    ) -> R {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |d| {
            let _ = tx.send(f(d));
        });
        self.jobs
            .as_ref()
            .expect("VMM thread")
            .send(job)
            .unwrap_or_else(|_| panic!("{what}: the VMM thread is gone"));
        match rx.recv_timeout(self.watchdog) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "{what}: no answer within {:?}; cloud-hypervisor would wait forever",
                self.watchdog
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the step failed"),
        }
    }

    /// Like [`Vmm::step`] on the device, which must exist.
    pub fn on<R: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&mut ChDevice) -> R + Send + 'static,
    ) -> R {
        let what_owned = what.to_string();
        self.step(what, move |d| {
            f(d.as_mut()
                .unwrap_or_else(|| panic!("{what_owned}: no device")))
        })
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        drop(self.jobs.take());
        // A thread stuck in a hung step is left behind (its test failed).
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// A guest's driver on a device cloud-hypervisor created: its register
/// accesses trap through the VMM (each one an INTx EOI while INTx is on),
/// its doorbells go straight to the mapped page, and its rings sit in
/// guest RAM the device reached by DMA_MAP with an fd.
pub struct ChGuest {
    ram: Ram,
    next: u64,
    queues: Vec<Option<crate::ring::DriverQueue>>,
}

impl ChGuest {
    /// A driver whose rings and buffers live in region `region` of `ram`.
    pub fn new(ram: &GuestRam, region: usize) -> ChGuest {
        let ram = ram.region(region);
        let next = ram.iova() + 4096;
        ChGuest {
            ram,
            next,
            queues: (0..vgpu_abi::MAX_QUEUES).map(|_| None).collect(),
        }
    }

    /// Guest RAM of the driver.
    pub fn ram(&self) -> &Ram {
        &self.ram
    }

    /// Takes `size` bytes of guest RAM aligned to `align`, zeroed as a
    /// driver's coherent DMA allocation is (a rebooted guest's RAM still
    /// holds the last boot's rings).
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let at = self.next.next_multiple_of(align);
        assert!(self.ram.contains(at, size), "guest RAM exhausted");
        self.ram.zero(at, size);
        self.next = at + size;
        at
    }

    fn bar0(d: &ChDevice) -> u64 {
        d.bar_base(vgpu_abi::BAR_REGS).expect("BAR0 placed")
    }

    /// A 32-bit register read, trapped.
    pub fn read32(&self, d: &mut ChDevice, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read_bar(Self::bar0(d) + off, &mut b);
        u32::from_le_bytes(b)
    }

    /// A 32-bit register write, trapped.
    pub fn write32(&self, d: &mut ChDevice, off: u64, v: u32) {
        d.write_bar(Self::bar0(d) + off, &v.to_le_bytes());
    }

    /// Programs queue `q` (ring of `size`, MSI-X `vector`) and enables it;
    /// returns QREG_STATUS.
    pub fn setup_queue(&mut self, d: &mut ChDevice, q: u32, size: u16, vector: u32) -> u32 {
        let n = u64::from(size);
        let layout = crate::ring::RingLayout {
            size,
            desc: self.alloc(crate::ring::DESC_SIZE * n, 4096),
            avail: self.alloc(6 + 2 * n, 64),
            used: self.alloc(6 + 8 * n, 64),
            slots: self.alloc(crate::ring::SLOT_SIZE * n, 64),
        };
        let reg = |r| vgpu_abi::queue_reg(q, r);
        self.write32(d, reg(vgpu_abi::QREG_MSIX_VECTOR), vector);
        self.write32(d, reg(vgpu_abi::QREG_SIZE), size.into());
        for (r, v) in [
            (vgpu_abi::QREG_DESC, layout.desc),
            (vgpu_abi::QREG_AVAIL, layout.avail),
            (vgpu_abi::QREG_USED, layout.used),
        ] {
            self.write32(d, reg(r), v as u32);
            self.write32(d, reg(r) + 4, (v >> 32) as u32);
        }
        self.write32(d, reg(vgpu_abi::QREG_CONTROL), vgpu_abi::QCONTROL_ENABLE);
        let status = self.read32(d, reg(vgpu_abi::QREG_STATUS));
        self.queues[q as usize] = (status & vgpu_abi::QSTATUS_ENABLED != 0)
            .then(|| crate::ring::DriverQueue::new(layout, crate::ring::Mode::Interrupt));
        status
    }

    /// Submits a FENCE on queue `q` that writes `value` into guest RAM
    /// (and raises the queue's interrupt when `irq`), rings the mapped
    /// doorbell and, since the device does not poll an interrupt queue,
    /// writes REG_WAKE. Returns the address the fence writes.
    pub fn fence(&mut self, d: &mut ChDevice, q: u32, value: u64, irq: bool) -> u64 {
        let addr = self.alloc(8, 8);
        let cmd = vgpu_abi::FenceCmd {
            hdr: vgpu_abi::CmdHeader {
                opcode: vgpu_abi::OP_FENCE,
                flags: if irq { vgpu_abi::FENCE_FLAG_IRQ } else { 0 },
            },
            addr,
            value,
        };
        let chain = crate::ring::Chain::command(&cmd).completion();
        let ChGuest { ram, queues, .. } = self;
        let dq = queues[q as usize].as_mut().expect("queue set up");
        dq.add(ram, &chain, &mut |_| {
            panic!("a fence fits a descriptor slot")
        })
        .expect("room in the ring");
        dq.publish(ram);
        let avail = dq.published;
        let page = d
            .mapped(vgpu_abi::BAR_REGS, vgpu_abi::DOORBELL_OFFSET)
            .expect("doorbell page mapped");
        let slot = vgpu_abi::doorbell(q, vgpu_abi::DB_AVAIL_IDX) as usize;
        page.get_atomic_ref::<std::sync::atomic::AtomicU32>(slot)
            .expect("doorbell slot")
            .store(u32::from(avail), std::sync::atomic::Ordering::SeqCst);
        self.write32(d, vgpu_abi::REG_WAKE, q);
        addr
    }

    /// The next completion of queue `q`, waiting up to `timeout`.
    pub fn wait_used(&mut self, q: u32, timeout: Duration) -> Option<crate::ring::Used> {
        let deadline = std::time::Instant::now() + timeout;
        let ChGuest { ram, queues, .. } = self;
        let dq = queues[q as usize].as_mut().expect("queue set up");
        loop {
            if let Some(u) = dq.poll_used(ram) {
                return Some(u);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
