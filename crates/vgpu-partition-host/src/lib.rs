//! The partition host of vgpud's remote backend: serves one partition of
//! an inner backend (software or CUDA) to the daemon over a socket, in a
//! process of its own (see `vgpu-backend-remote` for why and how). The
//! program `vgpu-partition-host` runs [`host::serve`], or, as the shared
//! host of a spatial GPU, [`host::serve_until_lost`] for each partition.
//!
//! - `host.rs`: the command loop ([`host::serve`], [`host::refuse`]).
//! - `runner.rs`: runs the started queued runs on a thread of their own.
//! - `queued.rs`: a protocol run as the partition's queued steps, for
//!   both of them.
//! - `guest_mem.rs`: the guest memory the daemon forwards, mapped here.
//! - `launcher.rs`: the launcher process, which starts, kills and reaps
//!   hosts for the daemon ([`launcher::serve`]).

#![warn(missing_docs)]

mod guest_mem;
mod queued;
mod runner;

pub mod host;
pub mod launcher;

// The pieces the host shares with the daemon's side: the protocol, its
// framing on the socket and in the mailbox, and the staging area.
use vgpu_backend_remote::{mailbox, proto, shm, wire};
