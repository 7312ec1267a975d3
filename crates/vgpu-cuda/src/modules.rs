//! Modules and libraries as the driver loads them, and the JIT links
//! that hand an image on to be loaded.

use std::collections::HashMap;

use crate::cu::{self, CUdevice, CuResult};
use crate::state::{by_handle, Driver};

/// What an image is loaded as.
#[derive(Clone, Copy)]
pub enum LoadAs {
    /// A module of a context of this device.
    Module(CUdevice),
    /// A library, of no context ([`crate::state::Library`]).
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

/// A link in progress: its one input, then its output.
#[derive(Debug, Default)]
pub struct Link {
    input: Option<Vec<u8>>,
    /// What `cuLinkComplete` handed out (a PTX image NUL-terminated),
    /// valid until the link is destroyed.
    output: Option<Box<[u8]>>,
}

impl Link {
    /// Takes `image` as the link's one input; false (and the image
    /// dropped) where it has had one already.
    pub fn add(&mut self, image: Vec<u8>) -> bool {
        if self.input.is_some() || self.output.is_some() {
            return false;
        }
        self.input = Some(image);
        true
    }

    /// The linked image: the one input, PTX NUL-terminated so that
    /// `cuModuleLoadData` reads it as it reads any PTX; made once, and
    /// kept with the link until it is destroyed.
    pub fn complete(&mut self) -> CuResult<&mut [u8]> {
        if self.output.is_none() {
            let mut image = self.input.take().ok_or(cu::ERROR_INVALID_VALUE)?;
            if vgpu_ptx::fatbin::is_ptx_text(&image) {
                image.push(0);
            }
            self.output = Some(image.into_boxed_slice());
        }
        Ok(self.output.as_mut().expect("set above"))
    }
}

/// The links in progress, by handle.
pub type Links = HashMap<usize, Link>;

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
