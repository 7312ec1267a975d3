//! A small PCI function used to test the engine end to end: a trapped
//! register BAR, a directly mappable memory BAR, MSI-X and a doorbell that
//! can be signalled by ioeventfd. It also copies between client memory and
//! its memory BAR on request, exercising the DMA path.
//!
//! BAR0 registers (32-bit):
//!
//! | offset | name | access |
//! |---|---|---|
//! | 0x00 | ID = 0x76677064 | RO |
//! | 0x04 | VERSION = 1 | RO |
//! | 0x08 | SCRATCH | RW |
//! | 0x0c | SCRATCH_INV (bitwise not of SCRATCH) | RO |
//! | 0x10 | WRITE_COUNT (BAR0 writes seen) | RO |
//! | 0x14 | DOORBELL (any write counts) | WO |
//! | 0x18 | IRQ: write n to raise MSI-X vector n (INTx if MSI-X is off) | WO |
//! | 0x1c | BAR2_SUM: wrapping sum of the first 4 KiB of BAR2 as u32 words | RO |
//! | 0x20 | DOORBELL_COUNT | RO |
//! | 0x24/0x28 | DMA_ADDR low/high | RW |
//! | 0x2c | DMA_LEN (bytes, at most the BAR2 size) | RW |
//! | 0x30 | DMA_CMD: 1 = client memory -> BAR2, 2 = BAR2 -> client memory | WO |
//! | 0x34 | DMA_STATUS: 0 ok, else an errno (EFAULT for a DMA fault) | RO |
//!
//! The MSI-X table sits at 0x800 and the PBA at 0xc00 of BAR0.

use std::fs::File;
use std::sync::Arc;

use log::info;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, MmapRegion, VolatileMemory, VolatileSlice};

use crate::device::{
    DeviceContext, DeviceError, IoEventSpec, IrqInfo, MmapArea, PciDevice, RegionInfo, RegionMmap,
    BAR0_REGION, CONFIG_REGION, IRQ_INTX, IRQ_MSIX,
};
use crate::pci::{BarKind, ConfigSpace, PciIds, CONFIG_SPACE_SIZE, MSIX_ENABLE};

/// PCI identity of the sample device.
pub const SAMPLE_IDS: PciIds = PciIds {
    vendor: 0x1ee7,
    device: 0x0001,
    subsystem_vendor: 0x1ee7,
    subsystem: 0x0001,
    class: 0xff0000,
    revision: 1,
};
/// Value of the ID register.
pub const SAMPLE_ID: u32 = 0x7667_7064;
/// Size of BAR0.
pub const BAR0_SIZE: u64 = 4096;
/// Size of BAR2.
pub const BAR2_SIZE: u64 = 64 * 1024;
/// Number of MSI-X vectors.
pub const MSIX_VECTORS: u16 = 2;

/// Register offsets in BAR0.
#[allow(missing_docs)]
pub mod regs {
    pub const ID: u64 = 0x00;
    pub const VERSION: u64 = 0x04;
    pub const SCRATCH: u64 = 0x08;
    pub const SCRATCH_INV: u64 = 0x0c;
    pub const WRITE_COUNT: u64 = 0x10;
    pub const DOORBELL: u64 = 0x14;
    pub const IRQ: u64 = 0x18;
    pub const BAR2_SUM: u64 = 0x1c;
    pub const DOORBELL_COUNT: u64 = 0x20;
    pub const DMA_ADDR_LO: u64 = 0x24;
    pub const DMA_ADDR_HI: u64 = 0x28;
    pub const DMA_LEN: u64 = 0x2c;
    pub const DMA_CMD: u64 = 0x30;
    pub const DMA_STATUS: u64 = 0x34;
    pub const MSIX_TABLE: u64 = 0x800;
    pub const MSIX_PBA: u64 = 0xc00;
}

/// The sample device.
pub struct SampleDevice {
    config: ConfigSpace,
    ctx: Option<DeviceContext>,
    mem_file: Arc<File>,
    mem: MmapRegion,
    scratch: u32,
    write_count: u32,
    doorbells: u32,
    dma_addr: u64,
    dma_len: u32,
    dma_status: u32,
}

/// Creating the sample device failed.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// memfd or mapping failed.
    #[error("cannot create BAR2 memory")]
    Memory(#[source] std::io::Error),
}

impl SampleDevice {
    /// A device in its power-on state.
    pub fn new() -> Result<Self, SampleError> {
        let mut config = ConfigSpace::new(SAMPLE_IDS);
        // Layout constants are valid by construction; a failure here is a bug
        // caught by the unit tests.
        let _ = config.set_bar(0, BAR0_SIZE, BarKind::Mem32);
        let _ = config.set_bar(2, BAR2_SIZE, BarKind::Mem64 { prefetchable: true });
        let _ = config.add_power_management();
        let _ = config.add_msix(
            MSIX_VECTORS,
            (0, regs::MSIX_TABLE as u32),
            (0, regs::MSIX_PBA as u32),
        );
        config.set_interrupt_pin(1);
        let file = crate::memfd::create(c"vfio-user-sample-bar2", BAR2_SIZE)
            .map_err(SampleError::Memory)?;
        let mem = MmapRegionBuilder::new(BAR2_SIZE as usize)
            .with_file_offset(FileOffset::new(
                file.try_clone().map_err(SampleError::Memory)?,
                0,
            ))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_SHARED)
            .build()
            .map_err(|e| SampleError::Memory(std::io::Error::other(e)))?;
        Ok(SampleDevice {
            config,
            ctx: None,
            mem_file: Arc::new(file),
            mem,
            scratch: 0,
            write_count: 0,
            doorbells: 0,
            dma_addr: 0,
            dma_len: 0,
            dma_status: 0,
        })
    }

    fn bar2_sum(&self) -> u32 {
        let mut buf = [0u8; 4096];
        if let Ok(s) = self.mem.get_slice(0, buf.len()) {
            s.copy_to(&mut buf[..]);
        }
        buf.chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0u32, |a, b| a.wrapping_add(b))
    }

    /// `len` bytes of BAR2 at `offset`.
    fn bar2(&self, offset: u64, len: usize) -> Result<VolatileSlice<'_>, DeviceError> {
        self.mem
            .get_slice(offset as usize, len)
            .map_err(|_| DeviceError::InvalidAccess("outside BAR2"))
    }

    fn raise(&self, vector: u32) {
        let Some(ctx) = &self.ctx else { return };
        let msix_on = self
            .config
            .msix_control()
            .is_some_and(|c| c & MSIX_ENABLE != 0);
        if msix_on || ctx.irqs.is_enabled(IRQ_MSIX, vector) {
            ctx.irqs.trigger(IRQ_MSIX, vector);
        } else {
            ctx.irqs.trigger(IRQ_INTX, 0);
        }
    }

    fn run_dma(&mut self, cmd: u32) -> u32 {
        let Some(ctx) = &self.ctx else {
            return libc::EIO as u32;
        };
        let len = self.dma_len as usize;
        if len as u64 > BAR2_SIZE || !(1..=2).contains(&cmd) {
            return libc::EINVAL as u32;
        }
        let mut buf = vec![0u8; len];
        let result = if cmd == 1 {
            ctx.dma.read(self.dma_addr, &mut buf).map(|_| {
                if let Ok(s) = self.mem.get_slice(0, len) {
                    s.copy_from(&buf[..]);
                }
            })
        } else {
            if let Ok(s) = self.mem.get_slice(0, len) {
                s.copy_to(&mut buf[..]);
            }
            ctx.dma.write(self.dma_addr, &buf)
        };
        match result {
            Ok(()) => 0,
            Err(e) => {
                info!("sample: DMA fault: {e}");
                libc::EFAULT as u32
            }
        }
    }

    fn bar0_read(&self, offset: u64) -> u32 {
        match offset {
            regs::ID => SAMPLE_ID,
            regs::VERSION => 1,
            regs::SCRATCH => self.scratch,
            regs::SCRATCH_INV => !self.scratch,
            regs::WRITE_COUNT => self.write_count,
            regs::BAR2_SUM => self.bar2_sum(),
            regs::DOORBELL_COUNT => self.doorbells,
            regs::DMA_ADDR_LO => self.dma_addr as u32,
            regs::DMA_ADDR_HI => (self.dma_addr >> 32) as u32,
            regs::DMA_LEN => self.dma_len,
            regs::DMA_STATUS => self.dma_status,
            _ => 0,
        }
    }

    fn bar0_write(&mut self, offset: u64, value: u32) {
        self.write_count = self.write_count.wrapping_add(1);
        info!("testdev: BAR0 write offset={offset:#x} value={value:#x}");
        match offset {
            regs::SCRATCH => self.scratch = value,
            regs::DOORBELL => self.doorbells = self.doorbells.wrapping_add(1),
            regs::IRQ => self.raise(value),
            regs::DMA_ADDR_LO => self.dma_addr = (self.dma_addr & !0xffff_ffff) | u64::from(value),
            regs::DMA_ADDR_HI => {
                self.dma_addr = (self.dma_addr & 0xffff_ffff) | (u64::from(value) << 32)
            }
            regs::DMA_LEN => self.dma_len = value,
            regs::DMA_CMD => self.dma_status = self.run_dma(value),
            _ => {}
        }
    }
}

impl PciDevice for SampleDevice {
    fn bind(&mut self, ctx: DeviceContext) {
        self.ctx = Some(ctx);
    }

    fn region_info(&self, index: u32) -> RegionInfo {
        match index {
            BAR0_REGION => RegionInfo::trapped(BAR0_SIZE),
            2 => RegionInfo {
                size: BAR2_SIZE,
                readable: true,
                writable: true,
                mmap: Some(RegionMmap {
                    file: self.mem_file.clone(),
                    file_offset: 0,
                    areas: vec![MmapArea {
                        offset: 0,
                        size: BAR2_SIZE,
                    }],
                }),
            },
            CONFIG_REGION => RegionInfo::trapped(CONFIG_SPACE_SIZE as u64),
            _ => RegionInfo::default(),
        }
    }

    fn irq_info(&self, index: u32) -> IrqInfo {
        IrqInfo::pci_function(index, u32::from(MSIX_VECTORS))
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError> {
        match index {
            // The client emulates the MSI-X table; nothing pending here.
            BAR0_REGION if offset >= regs::MSIX_TABLE => data.fill(0),
            BAR0_REGION => {
                let value = self.bar0_read(offset & !3).to_le_bytes();
                let shift = (offset & 3) as usize;
                for (i, b) in data.iter_mut().enumerate() {
                    *b = value.get(shift + i).copied().unwrap_or(0);
                }
            }
            2 => {
                self.bar2(offset, data.len())?.copy_to(data);
            }
            CONFIG_REGION => self.config.read(offset, data),
            _ => return Err(DeviceError::Unsupported),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        match index {
            BAR0_REGION if offset >= regs::MSIX_TABLE => {}
            BAR0_REGION => match <[u8; 4]>::try_from(data) {
                Ok(v) if offset.is_multiple_of(4) => self.bar0_write(offset, u32::from_le_bytes(v)),
                _ => {
                    return Err(DeviceError::InvalidAccess(
                        "BAR0 registers take aligned 32-bit writes",
                    ))
                }
            },
            2 => {
                self.bar2(offset, data.len())?.copy_from(data);
            }
            CONFIG_REGION => self.config.write(offset, data),
            _ => return Err(DeviceError::Unsupported),
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.config.reset();
        self.scratch = 0;
        self.write_count = 0;
        self.doorbells = 0;
        self.dma_addr = 0;
        self.dma_len = 0;
        self.dma_status = 0;
        if let Ok(s) = self.mem.get_slice(0, BAR2_SIZE as usize) {
            s.copy_from(&vec![0u8; BAR2_SIZE as usize][..]);
        }
    }

    fn ioeventfds(&self, index: u32) -> Vec<IoEventSpec> {
        if index == BAR0_REGION {
            vec![IoEventSpec {
                offset: regs::DOORBELL,
                size: 4,
                datamatch: None,
            }]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read32(d: &mut SampleDevice, region: u32, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.region_read(region, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    #[test]
    fn test_scratch_and_inverse() {
        let mut d = SampleDevice::new().unwrap();
        assert_eq!(read32(&mut d, 0, regs::ID), SAMPLE_ID);
        d.region_write(0, regs::SCRATCH, &0xdead_beefu32.to_le_bytes())
            .unwrap();
        assert_eq!(read32(&mut d, 0, regs::SCRATCH), 0xdead_beef);
        assert_eq!(read32(&mut d, 0, regs::SCRATCH_INV), 0x2152_4110);
        assert_eq!(read32(&mut d, 0, regs::WRITE_COUNT), 1);
        assert!(d.region_write(0, regs::SCRATCH, &[1, 2]).is_err());
        d.reset();
        assert_eq!(read32(&mut d, 0, regs::SCRATCH), 0);
    }

    #[test]
    fn test_bar2_sum_and_config() {
        let mut d = SampleDevice::new().unwrap();
        d.region_write(2, 0, &0x1111_1111u32.to_le_bytes()).unwrap();
        d.region_write(2, 4, &0x2222_2222u32.to_le_bytes()).unwrap();
        assert_eq!(read32(&mut d, 0, regs::BAR2_SUM), 0x3333_3333);
        assert_eq!(read32(&mut d, CONFIG_REGION, 0), 0x0001_1ee7);
        assert_eq!(read32(&mut d, CONFIG_REGION, 8) >> 8, 0xff0000);
    }

    #[test]
    fn test_dma_without_mappings_faults() {
        let mut d = SampleDevice::new().unwrap();
        d.bind(DeviceContext {
            dma: Arc::new(crate::dma::DmaSpace::new()),
            irqs: crate::irq::Interrupts::default(),
        });
        d.region_write(0, regs::DMA_LEN, &16u32.to_le_bytes())
            .unwrap();
        d.region_write(0, regs::DMA_CMD, &1u32.to_le_bytes())
            .unwrap();
        assert_eq!(read32(&mut d, 0, regs::DMA_STATUS), libc::EFAULT as u32);
    }
}
