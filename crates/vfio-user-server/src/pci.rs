//! Emulated PCI configuration space: identity, BARs with sizing, a
//! capability list (MSI-X among them) and per-byte write masks, so a device
//! model only declares what its function looks like.

/// Standard (conventional) configuration space size.
pub const CONFIG_SPACE_SIZE: usize = 256;
/// PCI Express configuration space size. A function with a PCI Express
/// capability offers this much: guests and VMMs (cloud-hypervisor reads
/// 0x100 when it finds PCI Express and power management capabilities)
/// read the extended capability list there, and bytes past the
/// conventional header read as zero: an empty list.
pub const PCIE_CONFIG_SPACE_SIZE: usize = 4096;

const VENDOR_ID: usize = 0x00;
const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const REVISION: usize = 0x08;
const CLASS_PROG: usize = 0x09;
const HEADER_TYPE: usize = 0x0e;
const BAR0: usize = 0x10;
const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
const CAPABILITIES_PTR: usize = 0x34;
const INTERRUPT_LINE: usize = 0x3c;
const INTERRUPT_PIN: usize = 0x3d;
const STATUS_CAP_LIST: u16 = 1 << 4;
const FIRST_CAP: usize = 0x40;

/// Command register bits the guest may change: I/O, memory, bus master,
/// SERR, INTx disable.
const COMMAND_WMASK: u16 = 0x0001 | 0x0002 | 0x0004 | 0x0100 | 0x0400;

/// Capability id of MSI-X.
pub const CAP_ID_MSIX: u8 = 0x11;
/// Capability id of power management.
pub const CAP_ID_PM: u8 = 0x01;
/// Capability id of PCI Express.
pub const CAP_ID_EXP: u8 = 0x10;
/// MSI-X message control: enable.
pub const MSIX_ENABLE: u16 = 1 << 15;
/// MSI-X message control: function mask.
pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;

/// Identity of a PCI function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Subsystem vendor id.
    pub subsystem_vendor: u16,
    /// Subsystem id.
    pub subsystem: u16,
    /// Class code (base class, subclass, programming interface).
    pub class: u32,
    /// Revision.
    pub revision: u8,
}

/// Kind of a memory BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit, non-prefetchable.
    Mem32,
    /// 64-bit (takes two BAR slots).
    Mem64 {
        /// Prefetchable.
        prefetchable: bool,
    },
}

/// Configuration-space layout errors (programming errors of a model).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// BAR index or size invalid.
    #[error("invalid BAR {0}")]
    Bar(usize),
    /// No room left for a capability.
    #[error("no room for a capability of {0} bytes")]
    NoRoom(usize),
}

/// A function's configuration space.
#[derive(Clone)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SPACE_SIZE],
    wmask: [u8; CONFIG_SPACE_SIZE],
    next_cap: usize,
    last_cap: Option<usize>,
    msix_cap: Option<usize>,
}

impl ConfigSpace {
    /// A type-0 header with the given identity and no BARs or capabilities.
    pub fn new(ids: PciIds) -> Self {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SPACE_SIZE],
            wmask: [0; CONFIG_SPACE_SIZE],
            next_cap: FIRST_CAP,
            last_cap: None,
            msix_cap: None,
        };
        c.put16(VENDOR_ID, ids.vendor);
        c.put16(VENDOR_ID + 2, ids.device);
        c.bytes[REVISION] = ids.revision;
        c.bytes[CLASS_PROG] = ids.class as u8;
        c.bytes[CLASS_PROG + 1] = (ids.class >> 8) as u8;
        c.bytes[CLASS_PROG + 2] = (ids.class >> 16) as u8;
        c.bytes[HEADER_TYPE] = 0;
        c.put16(SUBSYSTEM_VENDOR_ID, ids.subsystem_vendor);
        c.put16(SUBSYSTEM_VENDOR_ID + 2, ids.subsystem);
        c.set_wmask16(COMMAND, COMMAND_WMASK);
        c.wmask[INTERRUPT_LINE] = 0xff;
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, off: usize, v: u32) {
        self.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn set_wmask16(&mut self, off: usize, v: u16) {
        self.wmask[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn set_wmask32(&mut self, off: usize, v: u32) {
        self.wmask[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn get16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.bytes[off], self.bytes[off + 1]])
    }

    /// Declares memory BAR `index` of `size` bytes (a power of two, at
    /// least 4 KiB so it can be mapped). Writes then behave as on hardware:
    /// writing all ones and reading back yields the size mask.
    pub fn set_bar(&mut self, index: usize, size: u64, kind: BarKind) -> Result<(), ConfigError> {
        let slots = if matches!(kind, BarKind::Mem64 { .. }) {
            2
        } else {
            1
        };
        if index + slots > 6 || !size.is_power_of_two() || size < 4096 {
            return Err(ConfigError::Bar(index));
        }
        if kind == BarKind::Mem32 && size > 1 << 31 {
            return Err(ConfigError::Bar(index));
        }
        let off = BAR0 + index * 4;
        let mask = !(size - 1);
        let flags: u32 = match kind {
            BarKind::Mem32 => 0,
            BarKind::Mem64 { prefetchable } => 0x4 | if prefetchable { 0x8 } else { 0 },
        };
        self.put32(off, flags);
        self.set_wmask32(off, (mask as u32) & !0xf);
        if slots == 2 {
            self.put32(off + 4, 0);
            self.set_wmask32(off + 4, (mask >> 32) as u32);
        }
        Ok(())
    }

    /// Sets the interrupt pin (1 = INTA).
    pub fn set_interrupt_pin(&mut self, pin: u8) {
        self.bytes[INTERRUPT_PIN] = pin;
    }

    /// Appends a capability: `body` is everything after the id and next
    /// pointer; `wmask` (same length) says which of its bits the guest may
    /// write. Returns the capability's offset.
    pub fn add_capability(
        &mut self,
        id: u8,
        body: &[u8],
        wmask: &[u8],
    ) -> Result<usize, ConfigError> {
        let len = 2 + body.len();
        // Dword-align every capability.
        let off = self.next_cap;
        let end = off + len;
        if end > CONFIG_SPACE_SIZE || wmask.len() != body.len() {
            return Err(ConfigError::NoRoom(len));
        }
        self.bytes[off] = id;
        self.bytes[off + 1] = 0;
        self.bytes[off + 2..end].copy_from_slice(body);
        self.wmask[off + 2..end].copy_from_slice(wmask);
        match self.last_cap {
            Some(prev) => self.bytes[prev + 1] = off as u8,
            None => {
                self.bytes[CAPABILITIES_PTR] = off as u8;
                let status = self.get16(STATUS) | STATUS_CAP_LIST;
                self.put16(STATUS, status);
            }
        }
        self.last_cap = Some(off);
        self.next_cap = (end + 3) & !3;
        Ok(off)
    }

    /// Adds an MSI-X capability with `vectors` entries whose table and PBA
    /// live in the given BARs at the given (8-byte aligned) offsets.
    pub fn add_msix(
        &mut self,
        vectors: u16,
        table: (u8, u32),
        pba: (u8, u32),
    ) -> Result<usize, ConfigError> {
        let mut body = [0u8; 10];
        body[0..2].copy_from_slice(&(vectors.saturating_sub(1) & 0x7ff).to_le_bytes());
        body[2..6].copy_from_slice(&(table.1 | u32::from(table.0 & 7)).to_le_bytes());
        body[6..10].copy_from_slice(&(pba.1 | u32::from(pba.0 & 7)).to_le_bytes());
        let mut wmask = [0u8; 10];
        wmask[0..2].copy_from_slice(&(MSIX_ENABLE | MSIX_FUNCTION_MASK).to_le_bytes());
        let off = self.add_capability(CAP_ID_MSIX, &body, &wmask)?;
        self.msix_cap = Some(off);
        Ok(off)
    }

    /// Adds a power-management capability (D0 only, no PME).
    pub fn add_power_management(&mut self) -> Result<usize, ConfigError> {
        // PMC: version 3. PMCSR: power state bits writable.
        let body = [0x03, 0x00, 0x00, 0x00, 0x00, 0x00];
        let wmask = [0x00, 0x00, 0x03, 0x00, 0x00, 0x00];
        self.add_capability(CAP_ID_PM, &body, &wmask)
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.get16(COMMAND)
    }

    /// Whether memory decoding is on.
    pub fn memory_enabled(&self) -> bool {
        self.command() & 0x2 != 0
    }

    /// The MSI-X message control word, if the function has MSI-X.
    pub fn msix_control(&self) -> Option<u16> {
        self.msix_cap.map(|off| self.get16(off + 2))
    }

    /// Reads `data.len()` bytes at `offset`; bytes past the conventional
    /// 256 (the extended space, which holds no capabilities) read as 0.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| self.bytes.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// Writes `data` at `offset` through the write masks; read-only bits
    /// and bytes past the end are ignored, as on hardware.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            let Some(o) = usize::try_from(offset).ok().and_then(|o| o.checked_add(i)) else {
                return;
            };
            if o >= CONFIG_SPACE_SIZE {
                return;
            }
            let m = self.wmask[o];
            self.bytes[o] = (self.bytes[o] & !m) | (b & m);
        }
    }

    /// Back to the power-on values of every writable bit.
    pub fn reset(&mut self) {
        for (b, m) in self.bytes.iter_mut().zip(self.wmask.iter()) {
            *b &= !m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> PciIds {
        PciIds {
            vendor: 0x1ee7,
            device: 0x0001,
            subsystem_vendor: 0x1ee7,
            subsystem: 0x0002,
            class: 0x030200,
            revision: 1,
        }
    }

    fn read32(c: &ConfigSpace, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn test_identity() {
        let c = ConfigSpace::new(ids());
        assert_eq!(read32(&c, 0), 0x0001_1ee7);
        assert_eq!(read32(&c, 8), 0x0302_0001);
        assert_eq!(read32(&c, 0x2c), 0x0002_1ee7);
    }

    #[test]
    fn test_bar_sizing() {
        let mut c = ConfigSpace::new(ids());
        c.set_bar(0, 4096, BarKind::Mem32).unwrap();
        c.set_bar(2, 1 << 33, BarKind::Mem64 { prefetchable: true })
            .unwrap();
        c.write(0x10, &[0xff; 4]);
        assert_eq!(read32(&c, 0x10), 0xffff_f000);
        c.write(0x18, &[0xff; 4]);
        c.write(0x1c, &[0xff; 4]);
        assert_eq!(read32(&c, 0x18), 0x0000_000c);
        assert_eq!(read32(&c, 0x1c), 0xffff_fffe);
        assert_eq!(
            c.set_bar(
                5,
                4096,
                BarKind::Mem64 {
                    prefetchable: false
                }
            ),
            Err(ConfigError::Bar(5))
        );
        assert_eq!(c.set_bar(1, 100, BarKind::Mem32), Err(ConfigError::Bar(1)));
    }

    #[test]
    fn test_capabilities_and_msix() {
        let mut c = ConfigSpace::new(ids());
        let pm = c.add_power_management().unwrap();
        let msix = c.add_msix(3, (0, 0x800), (0, 0xc00)).unwrap();
        assert_eq!(c.bytes[CAPABILITIES_PTR] as usize, pm);
        assert_eq!(c.bytes[pm + 1] as usize, msix);
        assert_ne!(c.get16(STATUS) & STATUS_CAP_LIST, 0);
        assert_eq!(c.msix_control(), Some(2));
        c.write(msix as u64 + 2, &[0xff, 0xff]);
        assert_eq!(c.msix_control(), Some(2 | MSIX_ENABLE | MSIX_FUNCTION_MASK));
        c.reset();
        assert_eq!(c.msix_control(), Some(2));
    }

    #[test]
    fn test_readonly_and_out_of_range() {
        let mut c = ConfigSpace::new(ids());
        c.write(0, &[0, 0, 0, 0]);
        assert_eq!(read32(&c, 0), 0x0001_1ee7);
        c.write(0xfe, &[1, 2, 3, 4]);
        c.write(u64::MAX, &[1]);
        let mut b = [9u8; 4];
        c.read(0xfe, &mut b);
        assert_eq!(b, [0, 0, 0, 0]);
        // The extended space reads as an empty capability list, and
        // writes there change nothing.
        c.write(0x100, &[0xff; 4]);
        c.write(PCIE_CONFIG_SPACE_SIZE as u64 - 4, &[0xff; 4]);
        assert_eq!(read32(&c, 0x100), 0);
        assert_eq!(read32(&c, PCIE_CONFIG_SPACE_SIZE as u64 - 4), 0);
        c.write(4, &[0xff, 0xff]);
        assert_eq!(c.command(), COMMAND_WMASK);
    }
}
