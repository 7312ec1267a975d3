//! JIT links in progress: their inputs, and the one image each hands on
//! to be loaded.

use crate::cu::{self, CUresult};
use crate::handles::Handles;
use crate::jit::JitOutputs;

/// `CUjitInputType`s a link takes.
pub const INPUT_CUBIN: u32 = 0;
/// PTX text.
pub const INPUT_PTX: u32 = 1;
/// A fatbinary, as `nvcc -fatbin` writes it.
pub const INPUT_FATBINARY: u32 = 2;

/// Inputs one link may have: more than programs link (a kernel file
/// and its device libraries).
pub const MAX_INPUTS: usize = 256;

/// Why a link failed: CUDA's error and what its error log says.
pub type LinkFailure = (CUresult, String);

/// A link in progress: its inputs, then its output.
#[derive(Debug, Default)]
pub struct Link {
    inputs: Vec<(u32, Vec<u8>)>,
    /// What `cuLinkComplete` handed out (a PTX image NUL-terminated),
    /// valid until the link is destroyed.
    output: Option<Box<[u8]>>,
    /// Where its logs and wall time go (`cuLinkCreate`'s options).
    pub outputs: JitOutputs,
}

impl Link {
    /// A link whose logs go where `outputs` says.
    pub fn new(outputs: JitOutputs) -> Link {
        Link {
            outputs,
            ..Link::default()
        }
    }

    /// Takes `image`, of input type `kind`, as the link's next input;
    /// refused once the link is complete or full, or when all its inputs
    /// together would be larger than `max` bytes.
    pub fn add(&mut self, kind: u32, image: Vec<u8>, max: usize) -> Result<(), LinkFailure> {
        if self.output.is_some() {
            return Err((cu::ERROR_INVALID_VALUE, "the link is complete".to_string()));
        }
        let total: usize = self.inputs.iter().map(|(_, i)| i.len()).sum();
        if self.inputs.len() >= MAX_INPUTS || total + image.len() > max {
            return Err((
                cu::ERROR_INVALID_VALUE,
                format!("a link takes up to {MAX_INPUTS} inputs of {max} bytes in all"),
            ));
        }
        self.inputs.push((kind, image));
        Ok(())
    }

    /// The linked image, made once and kept with the link until it is
    /// destroyed: one input as it is (PTX NUL-terminated, so that
    /// `cuModuleLoadData` reads it as it reads any PTX), several PTX
    /// inputs (or fatbinaries' PTX) joined into one module
    /// ([`crate::ptx_link`]). Machine code cannot be linked with other
    /// inputs here.
    pub fn complete(&mut self) -> Result<&mut [u8], LinkFailure> {
        if self.output.is_none() {
            let mut image = match self.inputs.len() {
                // Nothing added: a module without functions, as
                // NVIDIA's driver links one.
                0 => format!(
                    ".version 8.0\n.target sm_{}{}\n.address_size 64\n",
                    cu::CC_MAJOR,
                    cu::CC_MINOR
                )
                .into_bytes(),
                1 => self.inputs[0].1.clone(),
                _ => {
                    let texts = self
                        .inputs
                        .iter()
                        .enumerate()
                        .map(|(n, (kind, image))| input_ptx(n, *kind, image))
                        .collect::<Result<Vec<_>, _>>()?;
                    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                    let linked = crate::ptx_link::link(&refs).map_err(|e| {
                        let code = match e {
                            crate::ptx_link::PtxLinkError::Duplicate(_) => cu::ERROR_INVALID_IMAGE,
                            _ => cu::ERROR_INVALID_PTX,
                        };
                        (code, format!("link error: {e}"))
                    })?;
                    linked.into_bytes()
                }
            };
            if vgpu_ptx::fatbin::is_ptx_text(&image) {
                if let Some(end) = image.iter().position(|&b| b == 0) {
                    image.truncate(end);
                }
                image.push(0);
            }
            self.inputs.clear();
            self.output = Some(image.into_boxed_slice());
        }
        Ok(self.output.as_mut().expect("set above"))
    }
}

/// The PTX text of input `n` of a link of several: PTX itself, or the
/// PTX a fatbinary carries for the highest architecture this device
/// runs.
fn input_ptx(n: usize, kind: u32, image: &[u8]) -> Result<String, LinkFailure> {
    // NOT_SUPPORTED, which the entry point says once.
    let machine_code = || {
        (
            cu::ERROR_NOT_SUPPORTED,
            format!("input {n}: machine code cannot be linked with other inputs here"),
        )
    };
    match kind {
        INPUT_PTX => {
            let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
            String::from_utf8(image[..end].to_vec()).map_err(|_| {
                (
                    cu::ERROR_INVALID_PTX,
                    format!("input {n}: PTX is not UTF-8"),
                )
            })
        }
        INPUT_FATBINARY => {
            let texts = vgpu_ptx::extract_ptx(image).map_err(|_| machine_code())?;
            let cc = (cu::CC_MAJOR * 10 + cu::CC_MINOR) as u32;
            texts
                .into_iter()
                .filter(|t| ptx_arch(t) <= cc)
                .max_by_key(|t| ptx_arch(t))
                .ok_or_else(machine_code)
        }
        _ => Err(machine_code()),
    }
}

/// The architecture number of a PTX text's `.target` (`sm_90a`: 90).
fn ptx_arch(text: &str) -> u32 {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(".target"))
        .and_then(|t| t.trim_start().strip_prefix("sm_"))
        .map(|t| {
            t.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}

/// The links in progress, by handle.
pub type Links = Handles<Link>;

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b".version 8.0\n.target sm_80\n.address_size 64\n\
        .extern .func (.param .b32 r) f(.param .b32 x);\n\
        .visible .entry k()\n{\n ret;\n}\n";
    const B: &[u8] = b".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .func (.param .b32 r) f(.param .b32 x)\n{\n ret;\n}\n\0";

    #[test]
    fn one_input_is_handed_on_and_several_ptx_inputs_are_joined() {
        let mut one = Link::default();
        one.add(INPUT_PTX, A.to_vec(), 1 << 20).unwrap();
        let out = one.complete().unwrap();
        assert_eq!(&out[..out.len() - 1], A);
        assert_eq!(out.last(), Some(&0));

        let mut two = Link::default();
        two.add(INPUT_PTX, A.to_vec(), 1 << 20).unwrap();
        two.add(INPUT_PTX, B.to_vec(), 1 << 20).unwrap();
        let out = two.complete().unwrap().to_vec();
        assert_eq!(out.iter().filter(|&&b| b == 0).count(), 1);
        let text = std::str::from_utf8(&out[..out.len() - 1]).unwrap();
        vgpu_ptx::Module::parse(text).unwrap();
        // Complete: no more inputs.
        assert!(two.add(INPUT_PTX, A.to_vec(), 1 << 20).is_err());
    }

    #[test]
    fn links_are_bounded_and_machine_code_is_not_linked_with_others() {
        let mut l = Link::default();
        assert!(l.add(INPUT_PTX, vec![b'x'; 100], 150).is_ok());
        assert!(l.add(INPUT_PTX, vec![b'x'; 100], 150).is_err());
        let mut empty = Link::default();
        let text = String::from_utf8(empty.complete().unwrap().to_vec()).unwrap();
        let m = vgpu_ptx::Module::parse(text.trim_end_matches('\0')).unwrap();
        assert!(m.kernels().is_empty());
        let mut cubin = Link::default();
        cubin.add(INPUT_PTX, A.to_vec(), 1 << 20).unwrap();
        cubin
            .add(INPUT_CUBIN, b"\x7fELF".to_vec(), 1 << 20)
            .unwrap();
        assert_eq!(
            cubin.complete().map(|_| ()).map_err(|e| e.0),
            Err(cu::ERROR_NOT_SUPPORTED)
        );
    }

    #[test]
    fn targets_are_read() {
        assert_eq!(ptx_arch(".version 8.0\n.target sm_90a\n"), 90);
        assert_eq!(ptx_arch(".version 8.0\n"), 0);
    }
}
