//! The low-level pieces the other crates share, in one place: the role
//! crosvm's `base` and rust-vmm's `vmm-sys-util` play for their projects.
//! Every raw system call of the data path that the standard library,
//! `vmm-sys-util` or `vm-memory` do not wrap well enough is made here,
//! once, in an `unsafe` block with its `// SAFETY:` reasoning.
//!
//! - [`scm`]: sending and receiving fds with `SCM_RIGHTS`.
//! - [`poll`](mod@poll): `poll(2)`, retried on `EINTR`.
//! - [`memfd`]: anonymous shared memory, optionally sealed.
//! - [`mmap`]: shared mappings of files.
//! - [`socket`]: stale UNIX socket paths.
//! - [`sync`]: a mutex lock that survives a panicked holder.
//! - [`log`](mod@log): logging that a peer cannot turn into a flood.
//! - [`rng`]: a small deterministic generator for tests and benches.

#![warn(missing_docs)]

pub mod log;
pub mod memfd;
pub mod mmap;
pub mod poll;
pub mod rng;
pub mod scm;
pub mod socket;
pub mod sync;

pub use log::LogLimiter;
pub use sync::lock;

#[doc(hidden)]
pub use ::log as __log;
