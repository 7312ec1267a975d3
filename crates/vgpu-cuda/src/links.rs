//! JIT links in progress: each hands one image on to be loaded.

use crate::cu::{self, CuResult};
use crate::handles::Handles;

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
pub type Links = Handles<Link>;
