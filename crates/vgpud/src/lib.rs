//! The vgpud daemon as a library: its configuration and the GPUs and vGPU
//! instances it runs. The `vgpud` binary wires this to the command line
//! and signals.

#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod metrics;

/// Confinement (seccomp filters per role, privilege drop), shared with
/// the partition hosts.
pub use vgpu_confine as confine;
