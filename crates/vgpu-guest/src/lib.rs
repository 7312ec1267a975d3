//! User space of a vgpud virtual GPU function inside a Linux guest, over
//! the `vgpu.ko` character device `/dev/vgpuN`.
//!
//! ```no_run
//! use vgpu_guest::{Device, vgpu_abi::SaxpyParams};
//!
//! let dev = Device::open_index(0)?;
//! let n = 1024u64;
//! let x = dev.alloc(n * 4)?;
//! let y = dev.alloc(n * 4)?;
//! dev.copy_to_device(&x, 0, &vec![0u8; n as usize * 4])?;
//! dev.run_kernel(&SaxpyParams { y: y.addr(), x: x.addr(), n, a: 2.0, reserved: 0 })?;
//! let mut out = vec![0u8; n as usize * 4];
//! dev.copy_from_device(&y, 0, &mut out)?;
//! # Ok::<(), vgpu_guest::Error>(())
//! ```
//!
//! * [`Device`]: an open file of the device. Synchronous operations
//!   ([`Device::copy_to_device`], [`Device::fill`],
//!   [`Device::launch_builtin`], ...) wait for their command.
//! * [`Buffer`]: device memory, freed on drop.
//! * [`Batch`] / [`Pending`] / [`Completed`]: several commands submitted
//!   at once, waited for later with a timeout.
//! * [`Window`]: the host-visible window (BAR2) mapped with `mmap`.
//! * [`ffi`]: the C interface of `include/vgpu_guest.h`.
//! * [`sys`]: the driver's ioctl structures, checked against
//!   `guest-driver/include/uapi/vgpu.h`.
//!
//! The driver's semantics are documented in `guest-driver/README.md`.

#![warn(missing_docs)]

mod batch;
mod c_args;
mod device;
mod error;
pub mod ffi;
mod file;
mod launch;
mod resources;
pub mod sys;

/// Runs a C compiler command of a test; panics with its messages, after
/// `what`, unless it succeeds.
#[cfg(test)]
fn compile_c(cmd: &mut std::process::Command, what: &str) {
    let out = cmd.output().expect("gcc is needed for this test");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub use batch::{Batch, CmdResult, Completed, Pending, ReadSlot};
pub use device::{Device, Window};
pub use error::{errno_name, Error, Result};
pub use launch::{BuiltinKernel, Dims, Function};
pub use resources::{Buffer, Module};
pub use vgpu_abi::{self, ByteValued};
