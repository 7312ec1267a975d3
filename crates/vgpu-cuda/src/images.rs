//! Module images as callers hand them over, by pointer: where one ends,
//! and loading one into the caller's out-parameter.

use std::ffi::c_void;
use std::time::Instant;

use vgpu_guest::sys;

use crate::cu::{self, CuResult, Handle};
use crate::diag::log;
use crate::ffi;
use crate::jit::JitOutputs;
use crate::modules::{load_image_why, LoadAs};
use crate::state::{driver, Driver};

const FATBIN_MAGIC: u32 = 0xba55_ed50;
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;
const ELF_MAGIC: u32 = 0x464c_457f;

/// The module image at `p`, whose length the image itself tells: a
/// fatbinary (or the wrapper the runtime registers around one), an ELF
/// cubin, or NUL-terminated PTX text. Images over the device's limit are
/// refused before anything is read past it.
///
/// # Safety
/// `p` is null or points to such an image, alive for `'a`.
pub unsafe fn image_at<'a>(p: *const u8) -> CuResult<&'a [u8]> {
    let max = sys::MAX_IMAGE_BYTES as usize;
    // SAFETY: every image starts with at least 4 bytes.
    let magic = unsafe { ffi::get(p.cast::<u32>()) }?;
    let len = match magic {
        FATBIN_WRAPPER_MAGIC => {
            // SAFETY: a wrapper is {magic, version, data pointer, ...}.
            let data = unsafe { ffi::get(p.add(8).cast::<*const u8>()) }?;
            // SAFETY: the wrapper's data is a fatbinary.
            return unsafe { image_at(data) };
        }
        FATBIN_MAGIC => {
            // SAFETY: a fatbinary header is 16 bytes: magic, u16
            // version, u16 header size, u64 size of what follows.
            let (hdr, body) = unsafe {
                (
                    ffi::get(p.add(6).cast::<u16>())?,
                    ffi::get(p.add(8).cast::<u64>())?,
                )
            };
            usize::from(hdr)
                .checked_add(usize::try_from(body).map_err(|_| cu::ERROR_INVALID_IMAGE)?)
                .ok_or(cu::ERROR_INVALID_IMAGE)?
        }
        ELF_MAGIC => {
            // A cubin: read in steps, each as far as the headers already
            // read say, until they are all inside what was read.
            let mut n = 0;
            loop {
                // SAFETY: an ELF image holds what its headers name.
                let have = unsafe { ffi::bytes(p, n) }?;
                match vgpu_ptx::cubin_len(have) {
                    Ok(need) if need <= n => break need,
                    Ok(need) if need <= max => n = need,
                    Ok(need) => {
                        log(&format!(
                            "cubin of {need} bytes is over the {max}-byte limit"
                        ));
                        return Err(cu::ERROR_INVALID_IMAGE);
                    }
                    Err(vgpu_ptx::FatbinError::NotAModule) => {
                        return Err(cu::ERROR_NO_BINARY_FOR_GPU)
                    }
                    Err(e) => {
                        log(&format!("module image: {e}"));
                        return Err(cu::ERROR_INVALID_IMAGE);
                    }
                }
            }
        }
        _ => {
            // PTX text: up to its NUL, which must come within the limit.
            let mut n = 0;
            // SAFETY: NUL-terminated text by the caller's contract; the
            // scan stops at the NUL.
            while unsafe { *p.add(n) } != 0 {
                n += 1;
                if n > max {
                    return Err(cu::ERROR_INVALID_IMAGE);
                }
            }
            n
        }
    };
    if len > max {
        log(&format!(
            "module image of {len} bytes is over the {max}-byte limit"
        ));
        return Err(cu::ERROR_INVALID_IMAGE);
    }
    // SAFETY: the image says it is `len` bytes long.
    unsafe { ffi::bytes(p, len) }
}

/// Loads the image at `image` (see [`image_at`]: the runtime's registered
/// wrappers too) into the current context; its handle goes to `module`.
pub(crate) fn load(module: *mut Handle, image: *const c_void) -> CuResult {
    let d = driver()?;
    let (_, dev) = d.current_ctx()?;
    load_on(d, module, image, LoadAs::Module(dev))
}

/// Loads the image at `image` as `what`.
pub(crate) fn load_on(
    d: &Driver,
    module: *mut Handle,
    image: *const c_void,
    what: LoadAs,
) -> CuResult {
    load_jit(d, module, image, what, &JitOutputs::default())
}

/// [`load_on`], writing the logs and wall time `jit` asks for: why the
/// image was refused goes to the error log.
pub(crate) fn load_jit(
    d: &Driver,
    module: *mut Handle,
    image: *const c_void,
    what: LoadAs,
    jit: &JitOutputs,
) -> CuResult {
    let start = Instant::now();
    // SAFETY: the caller's image.
    let r = match unsafe { image_at(image.cast()) } {
        Ok(image) => load_image_why(d, image, what),
        Err(e) => Err((e, "not a module image this driver reads".to_string())),
    };
    // SAFETY: the caller's option arrays and log buffers, alive for the
    // call.
    unsafe {
        jit.write(
            "",
            r.as_ref().err().map_or("", |(_, why)| why.as_str()),
            start.elapsed(),
        )
    };
    let h = r.map_err(|(e, _)| e)?;
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(module, h as Handle) }.inspect_err(|_| {
        let _ = d.unload_module(h);
    })
}
