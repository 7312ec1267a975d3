//! A vfio-user server engine: serves a PCI function, described by the
//! [`PciDevice`] trait, to a VMM over a UNIX socket as the vfio-user
//! protocol specifies. It knows nothing of what the device does.
//!
//! - [`proto`]: wire format.
//! - [`conn`]: one client connection, including server-to-client DMA.
//! - [`dma`]: the DMA map table through which every device access to client
//!   memory goes.
//! - [`irq`]: interrupt eventfds, masks and triggering.
//! - [`memfd`]: anonymous shared memory for regions a client maps.
//! - [`pci`]: an emulated configuration space for models to use.
//! - [`server`]: the listening endpoint and its event loop.
//! - [`sample`]: a small device for tests and demos.

#![warn(missing_docs)]

pub mod conn;
pub mod device;
pub mod dma;
pub mod irq;
pub mod memfd;
pub mod pci;
pub mod proto;
pub mod sample;
pub mod server;

pub use device::{DeviceContext, DeviceError, PciDevice};
pub use dma::{DmaError, DmaSpace};
pub use irq::Interrupts;
pub use server::{Endpoint, ServerError};
