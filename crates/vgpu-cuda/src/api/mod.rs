//! The exported driver API, by area. Each entry point checks its handles
//! and pointers, then runs in [`crate::ffi::entry`].
//!
//! Names follow `cuda.h`'s current ABI: where `cuda.h` maps a name onto a
//! versioned symbol (`cuMemAlloc` → `cuMemAlloc_v2`), the versioned one is
//! exported; `cuGetProcAddress` maps names and versions onto them.

//!
//! # Safety
//! Every pointer argument must be what `cuda.h` documents for it (null
//! where allowed, else valid for the access it names); these functions
//! are C's to call, and their contract is CUDA's, not repeated on each.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod array;
pub mod context;
pub mod device;
pub mod export;
pub mod graph;
pub mod init;
pub mod link;
pub mod memory;
pub mod module;
pub mod pool;
pub mod procs;
pub mod stream;
pub mod strided;
pub mod symbols;
pub mod vmm;
