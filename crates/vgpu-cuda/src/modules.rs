//! Modules and libraries as the driver loads them, and the JIT links
//! that hand an image on to be loaded.

use crate::cu::{self, CUdevice, CuResult};
use crate::objects::by_handle;
use crate::state::Driver;

/// What an image is loaded as.
#[derive(Clone, Copy)]
pub enum LoadAs {
    /// A module of a context of this device.
    Module(CUdevice),
    /// A library, of no context ([`crate::objects::Library`]).
    Library,
}

/// Loads `image` as `what`; its handle.
pub fn load_image(d: &Driver, image: &[u8], what: LoadAs) -> CuResult<usize> {
    match what {
        LoadAs::Module(dev) => d.load_module(dev, image),
        LoadAs::Library => d.load_library(library_device(d), image),
    }
}

/// The device a library is loaded on. A library belongs to no context:
/// a thread with none current (such as PyTorch's autograd thread, whose
/// first kernel loads its library lazily) may load one. It goes to the
/// current context's device, else to the first device.
pub fn library_device(d: &Driver) -> CUdevice {
    d.current_ctx().map_or(0, |(_, dev)| dev)
}

/// The most blocks one cluster of `f` may have: Hopper's portable 8, or
/// 16 where the kernel allowed non-portable sizes.
pub fn max_cluster_blocks(d: &Driver, f: usize) -> CuResult<u32> {
    let o = d.objects();
    let func = by_handle(&o.funcs, f)?;
    let non_portable = func
        .hints
        .get(&cu::FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)
        .is_some_and(|&v| v != 0);
    Ok(if non_portable {
        vgpu_guest::vgpu_abi::MAX_CLUSTER_BLOCKS
    } else {
        PORTABLE_CLUSTER_BLOCKS
    })
}

/// Blocks of a cluster every kernel may be launched in.
pub const PORTABLE_CLUSTER_BLOCKS: u32 = 8;
