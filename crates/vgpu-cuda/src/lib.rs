//! A CUDA driver for vgpud virtual GPU functions: `libcuda.so.1` inside a
//! guest, over the `vgpu.ko` character devices `/dev/vgpuN`, the way
//! NVIDIA's libcuda sits over its kernel driver.
//!
//! The CUDA runtime (static or shared, CUDA 12 and 13), cuBLAS, CuPy and
//! PyTorch reach the driver only through `dlopen("libcuda.so.1")`,
//! [`cuGetProcAddress`](api::procs::cuGetProcAddress_v2) and
//! [`cuGetExportTable`](api::export::cuGetExportTable), so an unmodified
//! program runs on a vGPU once this library is first in the loader's
//! path (`LD_LIBRARY_PATH`, or `/etc/ld.so.conf.d`).
//!
//! * [`api`]: the exported entry points, by area: the outer layer, which
//!   checks the caller's pointers and arguments and calls down into the
//!   modules below; [`api::procs`] is the name and version table of
//!   `cuGetProcAddress`, [`api::export`] the runtime's private tables
//!   (with [`md2`] for the one that checks the driver).
//! * [`ffi`], [`images`], [`launch_args`]: what entry points read
//!   through the caller's pointers (out-parameters, module images, a
//!   launch's parameter block).
//! * The model, which never calls an entry point: [`modules`] (loading,
//!   functions, launches), [`streams`] (stream order, events),
//!   [`capture`] and [`graphs`] (stream capture, and the graphs it
//!   records), [`allocs`], [`copies`] and [`pitched`] (device memory and
//!   copies), [`devices`] (what a vGPU reports of itself).
//! * Below it: [`state`] (the devices, the context stack and the lock
//!   of [`objects`], every handle a program holds, in a table per kind:
//!   [`ctx_table`], [`module_table`], [`stream_table`], [`mem_table`],
//!   [`pool_table`], [`links`] (with [`ptx_link`]), the graphs' in [`graphs`], over
//!   [`handles`]); [`work`] (device
//!   work as queued), [`inflight`] and [`lanes`] (the work each device
//!   has queued); [`cu`] (`cuda.h`'s types) and [`diag`].
//!
//! Each device is one vGPU: its memory is the partition's quota, its SM
//! count the partition's compute units. Modules are fatbinaries or PTX,
//! loaded as they are on the device (the host's driver, or the software
//! backend's PTX executor, runs them); their PTX gives each kernel's
//! parameter layout. Launches, memsets, device copies and event records
//! are queued and return at once ([`inflight`]); what reads or writes
//! host memory waits for the work before it.

// The model and its helpers document every public item; the entry
// points and cuda.h's values are documented by cuda.h itself.
#![deny(missing_docs)]

pub mod allocs;
#[allow(missing_docs)]
pub mod api;
pub mod arrays;
pub mod capture;
pub mod console;
pub mod copies;
pub mod ctx_table;
#[allow(missing_docs)]
pub mod cu;
pub mod devices;
pub mod diag;
pub mod ffi;
pub mod graphs;
pub mod handles;
pub mod host_pages;
pub mod images;
pub mod inflight;
pub mod jit;
pub mod lanes;
pub mod launch_args;
pub mod links;
pub mod managed;
pub mod md2;
pub mod mem_table;
pub mod module_table;
pub mod modules;
pub mod objects;
pub mod pitched;
pub mod pool_table;
pub mod ptx_link;
pub mod reserve;
pub mod state;
pub mod stream_table;
pub mod streams;
pub mod vmm;
pub mod work;
