//! Modules from files (`cuModuleLoad`, `cuLibraryLoadFromFile`), and the
//! JIT linker's entry points (`cuLinkCreate` ... `cuLinkComplete`):
//! the "linked" image handed on to `cuModuleLoadData` is one PTX, cubin
//! or fatbinary input as it is, or several PTX inputs (fatbinaries'
//! PTX among them) joined into one PTX module ([`crate::ptx_link`]),
//! which the backend's driver compiles when the module is loaded.
//! Machine code linked with other inputs, host objects, archives and
//! NVVM IR are not supported.

use std::ffi::{c_char, c_void};
use std::io::Read;
use std::time::{Duration, Instant};

use vgpu_guest::sys;

use crate::cu::{self, CUresult, Handle};
use crate::ffi::{self, entry, CuResult};
use crate::jit::JitOutputs;
use crate::links::{Link, INPUT_CUBIN, INPUT_FATBINARY, INPUT_PTX};
use crate::modules::{load_image_why, LoadAs};
use crate::state::{driver, Driver};

const FATBIN_MAGIC: u32 = 0xba55_ed50;
const ELF_MAGIC: u32 = 0x464c_457f;

/// The module image at the start of `buf` (a file's bytes): a
/// fatbinary, an ELF cubin, or PTX text up to its first NUL; refused
/// where its headers say it is longer than `buf`.
pub fn image_in(buf: &[u8]) -> CuResult<&[u8]> {
    let magic = buf
        .get(..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
    let len = match magic {
        Some(FATBIN_MAGIC) => {
            let hdr = buf.get(6..8).ok_or(cu::ERROR_INVALID_IMAGE)?;
            let body = buf.get(8..16).ok_or(cu::ERROR_INVALID_IMAGE)?;
            let hdr = u64::from(u16::from_le_bytes([hdr[0], hdr[1]]));
            let body = u64::from_le_bytes(body.try_into().expect("8 bytes"));
            hdr.checked_add(body).ok_or(cu::ERROR_INVALID_IMAGE)?
        }
        Some(ELF_MAGIC) => vgpu_ptx::cubin_len(buf).map_err(|_| cu::ERROR_INVALID_IMAGE)? as u64,
        _ => buf.iter().position(|&b| b == 0).unwrap_or(buf.len()) as u64,
    };
    let len = usize::try_from(len).map_err(|_| cu::ERROR_INVALID_IMAGE)?;
    if len == 0 {
        return Err(cu::ERROR_INVALID_IMAGE);
    }
    buf.get(..len).ok_or(cu::ERROR_INVALID_IMAGE)
}

/// The bytes of file `path` (a C string), at most a module image's limit.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn read_image_file(path: *const c_char) -> CuResult<Vec<u8>> {
    // SAFETY: the caller's string (null is refused).
    let path = unsafe { ffi::cstr(path) }?;
    let max = sys::MAX_IMAGE_BYTES;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut buf))
        .map_err(|e| {
            crate::diag::log(&format!("module file {path:?}: {e}"));
            cu::ERROR_FILE_NOT_FOUND
        })?;
    if buf.len() as u64 > max {
        return Err(cu::ERROR_INVALID_IMAGE);
    }
    Ok(buf)
}

/// Loads the module in file `path` as `what`; its handle to `out`, and
/// the logs `jit` asks for written.
///
/// # Safety
/// As [`read_image_file`]; `out` is the caller's out-parameter.
unsafe fn load_file(
    d: &Driver,
    out: *mut Handle,
    path: *const c_char,
    what: LoadAs,
    jit: &JitOutputs,
) -> CuResult {
    let start = Instant::now();
    // SAFETY: forwarded.
    let buf = unsafe { read_image_file(path) }?;
    let r = match image_in(&buf) {
        Ok(image) => load_image_why(d, image, what),
        Err(e) => Err((e, "not a module image this driver reads".to_string())),
    };
    // SAFETY: the caller's option arrays and log buffers.
    unsafe {
        jit.write(
            "",
            r.as_ref().err().map_or("", |(_, why)| why.as_str()),
            start.elapsed(),
        )
    };
    let h = r.map_err(|(e, _)| e)?;
    // SAFETY: the caller's out-parameter.
    unsafe { ffi::put(out, h as Handle) }.inspect_err(|_| {
        let _ = d.unload_module(h);
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut Handle, path: *const c_char) -> CUresult {
    entry(|| {
        let d = driver()?;
        let (_, dev) = d.current_ctx()?;
        // SAFETY: the caller's arguments.
        unsafe { load_file(d, module, path, LoadAs::Module(dev), &JitOutputs::default()) }
    })
}

/// As `cuLibraryLoadData`: on the current context's device, else the
/// first.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut Handle,
    path: *const c_char,
    jit_options: *mut u32,
    jit_values: *mut *mut c_void,
    n_jit: u32,
    lib_options: *mut u32,
    lib_values: *mut *mut c_void,
    n_lib: u32,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's option arrays of the counts given.
        let jit = unsafe {
            crate::jit::check_library_options(n_lib, lib_options, lib_values)?;
            crate::state::jit_options("cuLibraryLoadFromFile", n_jit, jit_options, jit_values)?
        };
        let d = driver()?;
        // SAFETY: the caller's arguments.
        unsafe { load_file(d, library, path, LoadAs::Library, &jit) }
    })
}

/// A link whose logs and wall time go where `options` say (the
/// caller keeps them until the link is destroyed, as CUDA requires);
/// the compiler's hints are let be.
#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    n: u32,
    options: *mut u32,
    values: *mut *mut c_void,
    state: *mut Handle,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's `n` options and values.
        let jit = unsafe { crate::state::jit_options("cuLinkCreate", n, options, values) }?;
        let d = driver()?;
        // SAFETY: the caller's out-parameter, checked before the link is made.
        unsafe { ffi::put(state, std::ptr::null_mut()) }?;
        let h = d
            .objects()
            .file(|o, h| o.links_mut().insert(h, Link::new(jit)));
        // SAFETY: as above.
        unsafe { ffi::put(state, h as Handle) }
    })
}

/// Adds input `data` of `kind` to link `state`; why one is refused goes
/// to the link's error log.
fn add_input(state: Handle, kind: u32, data: &[u8]) -> CuResult {
    let d = driver()?;
    let outputs = d.objects().links_mut().get_mut(state as usize)?.outputs;
    let image = match kind {
        INPUT_PTX | INPUT_CUBIN | INPUT_FATBINARY => image_in(data).map(<[u8]>::to_vec),
        // Host objects and archives with device code in them, and NVVM
        // IR for link-time optimisation, need NVIDIA's linker.
        3..=5 => Err(d.not_supported_because(
            "cuLinkAddData",
            "inputs other than PTX, cubins and fatbinaries",
        )),
        _ => Err(cu::ERROR_INVALID_VALUE),
    };
    let r = image.map_err(|e| (e, "an input this linker does not take".to_string()));
    let r = r.and_then(|image| {
        let mut o = d.objects();
        let link = o
            .links_mut()
            .get_mut(state as usize)
            .map_err(|e| (e, "no such link".to_string()))?;
        link.add(kind, image, sys::MAX_IMAGE_BYTES as usize)
    });
    r.map_err(|(e, why)| {
        // SAFETY: the link's option arrays and log buffers, which the
        // caller keeps for the link's life.
        unsafe { outputs.write("", &why, Duration::ZERO) };
        e
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddData_v2(
    state: Handle,
    kind: u32,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    n: u32,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's `n` options and values.
        unsafe { crate::state::jit_options("cuLinkAddData", n, options, values) }?;
        if size as u64 > sys::MAX_IMAGE_BYTES {
            return Err(cu::ERROR_INVALID_IMAGE);
        }
        // SAFETY: the caller's `size` bytes.
        let bytes = unsafe { ffi::bytes(data.cast::<u8>(), size) }?;
        add_input(state, kind, bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: Handle,
    kind: u32,
    path: *const c_char,
    n: u32,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's `n` options and values.
        unsafe { crate::state::jit_options("cuLinkAddFile", n, options, values) }?;
        // SAFETY: the caller's path.
        let buf = unsafe { read_image_file(path) }?;
        add_input(state, kind, &buf)
    })
}

/// The linked image ([`Link::complete`]), with the link's logs and wall
/// time written.
#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    state: Handle,
    out: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    entry(|| {
        let start = Instant::now();
        let d = driver()?;
        let (r, outputs) = {
            let mut o = d.objects();
            let link = o.links_mut().get_mut(state as usize)?;
            let r = link.complete().map(|out| (out.as_mut_ptr(), out.len()));
            (r, link.outputs)
        };
        // SAFETY: the link's option arrays and log buffers.
        unsafe {
            outputs.write(
                "",
                r.as_ref().err().map_or("", |(_, why)| why.as_str()),
                start.elapsed(),
            )
        };
        let (p, n) = r.map_err(|(e, why)| {
            if e == cu::ERROR_NOT_SUPPORTED {
                return crate::state::unsupported_with("cuLinkComplete", &why);
            }
            crate::diag::log(&format!("cuLinkComplete: {why}"));
            e
        })?;
        // SAFETY: the caller's out-parameters; the image stays with the
        // link until cuLinkDestroy.
        unsafe {
            ffi::put(out, p.cast::<c_void>())?;
            ffi::put_opt(size, n)
        }
    })
}

#[no_mangle]
pub extern "C" fn cuLinkDestroy(state: Handle) -> CUresult {
    entry(|| {
        driver()?
            .objects()
            .links_mut()
            .remove(state as usize)
            .map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_in_files_end_where_they_say() {
        // PTX ends at its NUL, or with the file.
        assert_eq!(image_in(b".version 8.0\0junk"), Ok(&b".version 8.0"[..]));
        assert_eq!(image_in(b".version 8.0\n"), Ok(&b".version 8.0\n"[..]));
        assert_eq!(image_in(b""), Err(cu::ERROR_INVALID_IMAGE));
        assert_eq!(image_in(b"\0"), Err(cu::ERROR_INVALID_IMAGE));
        // A fatbinary header that claims more than the file holds.
        let mut fat = Vec::new();
        fat.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat.extend_from_slice(&1u16.to_le_bytes());
        fat.extend_from_slice(&16u16.to_le_bytes());
        fat.extend_from_slice(&100u64.to_le_bytes());
        fat.extend_from_slice(&[0; 50]);
        assert_eq!(image_in(&fat), Err(cu::ERROR_INVALID_IMAGE));
        fat.extend_from_slice(&[0; 60]);
        assert_eq!(image_in(&fat).map(<[u8]>::len), Ok(116));
        // Nor can a header overflow.
        fat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(image_in(&fat), Err(cu::ERROR_INVALID_IMAGE));
        // A truncated ELF header.
        assert_eq!(
            image_in(&ELF_MAGIC.to_le_bytes()),
            Err(cu::ERROR_INVALID_IMAGE)
        );
    }
}
