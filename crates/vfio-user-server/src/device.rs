//! What a device model implements to be served: a PCI function described by
//! its regions and interrupts. The engine validates every client value
//! (indexes, bounds, sizes, permissions) before calling the model.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::dma::{DmaSpace, Mapped, Unmapped};
use crate::irq::Interrupts;
// The interrupt types and their description are part of what a model
// answers; they stay reachable here.
pub use crate::irq::{IrqInfo, IRQ_ERR, IRQ_INTX, IRQ_MSI, IRQ_MSIX, IRQ_REQ, NUM_IRQ_TYPES};

/// Number of regions of a VFIO PCI device: BAR0-5, ROM, config space, VGA.
pub const NUM_REGIONS: u32 = 9;
/// Region index of BAR0; BARn is `BAR0_REGION + n`.
pub const BAR0_REGION: u32 = 0;
/// Region index of the expansion ROM.
pub const ROM_REGION: u32 = 6;
/// Region index of PCI configuration space.
pub const CONFIG_REGION: u32 = 7;
/// Region index of legacy VGA space.
pub const VGA_REGION: u32 = 8;

/// Part of a region the client may map directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapArea {
    /// Offset of the area in the region (page aligned).
    pub offset: u64,
    /// Size of the area (page multiple).
    pub size: u64,
}

/// How a region is offered for direct mapping.
#[derive(Clone, Debug)]
pub struct RegionMmap {
    /// The file backing the region.
    pub file: Arc<File>,
    /// Offset of the region's first byte in `file`.
    pub file_offset: u64,
    /// The mappable areas. Empty means the whole region.
    pub areas: Vec<MmapArea>,
}

/// One region as the client sees it.
#[derive(Clone, Debug, Default)]
pub struct RegionInfo {
    /// Size in bytes; 0 for an absent region.
    pub size: u64,
    /// The client may read it.
    pub readable: bool,
    /// The client may write it.
    pub writable: bool,
    /// Direct mapping, if offered.
    pub mmap: Option<RegionMmap>,
}

impl RegionInfo {
    /// A region reached only through REGION_READ / REGION_WRITE.
    pub fn trapped(size: u64) -> Self {
        RegionInfo {
            size,
            readable: true,
            writable: true,
            mmap: None,
        }
    }
}

/// A part of a region the device wants signalled through an ioeventfd
/// rather than a REGION_WRITE message (a doorbell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoEventSpec {
    /// Offset of the register in its region.
    pub offset: u64,
    /// Access size (1, 2, 4 or 8).
    pub size: u64,
    /// Value the write must carry to signal, if any; it is also the data
    /// the device sees when the eventfd fires.
    pub datamatch: Option<u64>,
}

/// An access the device model refused; each maps to an errno reply.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The access is not valid for this register (size, alignment, value).
    #[error("invalid access: {0}")]
    InvalidAccess(&'static str),
    /// The operation is not supported by this device.
    #[error("operation not supported")]
    Unsupported,
    /// The device cannot complete it now.
    #[error("device busy")]
    Busy,
}

impl DeviceError {
    /// The errno a reply carries.
    pub fn errno(&self) -> u32 {
        (match self {
            DeviceError::InvalidAccess(_) => libc::EINVAL,
            DeviceError::Unsupported => libc::ENOTSUP,
            DeviceError::Busy => libc::EBUSY,
        }) as u32
    }
}

/// What the engine hands a device model: the client memory it may reach and
/// the interrupts it may raise. Both outlive client connections; after a
/// disconnect the map table is empty and interrupts have no eventfds.
#[derive(Clone)]
pub struct DeviceContext {
    /// Client memory, checked like an IOMMU.
    pub dma: Arc<DmaSpace>,
    /// Interrupt delivery.
    pub irqs: Interrupts,
}

/// A PCI function served over vfio-user.
///
/// All calls come from the endpoint's event-loop thread, one at a time, in
/// the order the client sent its requests. A model must not block in these
/// calls waiting for its own worker threads to reach client memory (such an
/// access may need a DMA_READ reply that only this thread can receive).
pub trait PciDevice: Send {
    /// Called once, before any client connects.
    fn bind(&mut self, ctx: DeviceContext);

    /// Describes region `index` (< [`NUM_REGIONS`]).
    fn region_info(&self, index: u32) -> RegionInfo;

    /// Describes interrupt type `index` (< [`NUM_IRQ_TYPES`]).
    fn irq_info(&self, index: u32) -> IrqInfo;

    /// Reads `data.len()` bytes at `offset` of region `index`. The engine
    /// has checked that the region is readable and the range inside it.
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), DeviceError>;

    /// Writes `data` at `offset` of region `index`, checked as for reads.
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), DeviceError>;

    /// Returns the function to its power-on state (DEVICE_RESET, or the
    /// client going away). Mappings and interrupt eventfds are the engine's.
    fn reset(&mut self);

    /// Registers of region `index` to be signalled by ioeventfd.
    fn ioeventfds(&self, _index: u32) -> Vec<IoEventSpec> {
        Vec::new()
    }

    /// An eventfd the device itself waits on for doorbell `spec` of region
    /// `index`. The engine hands it to the client as that doorbell's
    /// ioeventfd and does not watch it, so a client (KVM) that signals it
    /// wakes the device without a trip through the event loop. `None`
    /// (the default) makes the engine create and watch its own eventfd and
    /// report writes as `region_write` calls.
    fn ioeventfd_direct(&self, _index: u32, _spec: &IoEventSpec) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The client shared memory by fd and the engine mapped it (fd-less
    /// mappings are not reported). A model may prepare the memory for
    /// direct access (e.g. register it with a driver) but must not block
    /// here on its worker threads (see the trait's docs).
    fn dma_mapped(&mut self, _map: &Mapped) {}

    /// Mappings were removed; the table no longer holds them and no access
    /// uses them. Memory of fd-backed ones is still mapped in this process
    /// during the call and unmapped right after it, so whatever the model
    /// built on its host address must be released before this returns.
    fn dma_unmapped(&mut self, _ranges: &[Unmapped]) {}

    /// The client changed the eventfds of interrupt type `index` (or
    /// raised it itself); MASK and UNMASK requests alone are not reported.
    fn irqs_changed(&mut self, _index: u32) {}
}
