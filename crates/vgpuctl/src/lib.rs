//! `vgpuctl` as a library: its command-line definitions.

#![warn(missing_docs)]

pub mod cli;
