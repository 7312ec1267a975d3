//! What the guest's programs share: CPU references of the built-in
//! kernels with a seedable generator ([`reference`]), and the timed
//! steps and verdict of the samples ([`sample`]).
//!
//! The programs, over the `vgpu-guest` library:
//! * `vgpu-smi`: devices, memory, compute units, utilization, processes;
//! * `vgpu-saxpy`, `vgpu-sgemm`: samples checked against the CPU;
//! * `vgpu-guest-test`: the guest test suite.

#![warn(missing_docs)]

pub mod reference;
pub mod sample;
