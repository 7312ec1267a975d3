//! CUDA arrays and the copies into and out of them by offset
//! (`cudaMallocArray`, `cudaMemcpyToArray`), texture and surface objects
//! (`cudaCreateTextureObject`, `cudaCreateSurfaceObject`), over
//! [`crate::arrays`].

use std::ffi::c_void;

use crate::arrays::{self, End, Side};
use crate::cu::{
    self, Array3dDescriptor, ArrayDescriptor, CUdeviceptr, CUresult, Handle, ResourceDesc,
    TextureDesc,
};
use crate::ffi::{self, entry, CuResult};
use crate::state::driver;

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let a = unsafe { ffi::get(desc) }?;
        let d3 = Array3dDescriptor {
            width: a.width,
            height: a.height,
            depth: 0,
            format: a.format,
            channels: a.channels,
            flags: 0,
        };
        // SAFETY: the caller's out-parameter, checked before the array is
        // made so a bad one leaks nothing.
        unsafe { ffi::put(array, std::ptr::null_mut()) }?;
        let h = arrays::create(driver()?, &d3)?;
        // SAFETY: as above.
        unsafe { ffi::put(array, h as Handle) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let a = unsafe { ffi::get(desc) }?;
        // SAFETY: the caller's out-parameter, checked before the array is
        // made.
        unsafe { ffi::put(array, std::ptr::null_mut()) }?;
        let h = arrays::create(driver()?, &a)?;
        // SAFETY: as above.
        unsafe { ffi::put(array, h as Handle) }
    })
}

#[no_mangle]
pub extern "C" fn cuArrayDestroy(array: Handle) -> CUresult {
    entry(|| arrays::destroy(driver()?, array as usize))
}

/// A 1D or 2D array's descriptor; a 3D or layered one is refused, as it
/// needs `cuArray3DGetDescriptor`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    out: *mut ArrayDescriptor,
    array: Handle,
) -> CUresult {
    entry(|| {
        let a = arrays::descriptor(driver()?, array as usize)?;
        if a.depth != 0 || a.flags != 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let d = ArrayDescriptor {
            width: a.width,
            height: a.height,
            format: a.format,
            channels: a.channels,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, d) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    out: *mut Array3dDescriptor,
    array: Handle,
) -> CUresult {
    entry(|| {
        let a = arrays::descriptor(driver()?, array as usize)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, a) }
    })
}

/// A box of an array: its position, its extent, and where its bytes
/// start in a linear range.
type LinearBox = ([usize; 3], [usize; 3], usize);

/// A byte range of an array (its elements row by row, slice by slice)
/// as boxes.
fn linear_boxes(array: usize, offset: usize, bytes: usize) -> CuResult<Vec<LinearBox>> {
    let ext = {
        let d = driver()?;
        let o = d.objects();
        o.arrays().arrays.get(array)?.extent()
    };
    boxes(ext, offset, bytes)
}

/// The boxes of `bytes` at byte `offset` of an array of `ext` (bytes,
/// rows, slices): a partial row, whole rows of a slice, and so on.
fn boxes(ext: [usize; 3], offset: usize, bytes: usize) -> CuResult<Vec<LinearBox>> {
    let [row, rows, slices] = ext;
    let total = row * rows * slices;
    if offset.checked_add(bytes).is_none_or(|e| e > total) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let mut out = Vec::new();
    let mut done = 0;
    while done < bytes {
        let at = offset + done;
        let (x, y, z) = (at % row, (at / row) % rows, at / (row * rows));
        let left = bytes - done;
        let (extent, n) = if x != 0 || left < row {
            let n = (row - x).min(left);
            ([n, 1, 1], n)
        } else {
            let k = (left / row).min(rows - y);
            ([row, k, 1], row * k)
        };
        out.push(([x, y, z], extent, done));
        done += n;
    }
    Ok(out)
}

/// Copies `bytes` at byte `offset` of `array` to or from linear memory
/// `other` (`End::Host` or `End::Device` at its start).
fn linear(
    array: usize,
    offset: usize,
    other: End,
    bytes: usize,
    to_array: bool,
    stream: Handle,
) -> CuResult {
    let d = driver()?;
    for (pos, extent, off) in linear_boxes(array, offset, bytes)? {
        let lin = match other {
            End::Host { ptr, .. } => End::Host {
                ptr: ptr + off as u64,
                pitch: extent[0],
                height: extent[1],
            },
            End::Device { ptr, .. } => End::Device {
                ptr: ptr + off as u64,
                pitch: extent[0],
                height: extent[1],
            },
            End::Array(_) => return Err(cu::ERROR_INVALID_VALUE),
        };
        let a = Side {
            end: End::Array(array),
            pos,
        };
        let m = Side {
            end: lin,
            pos: [0; 3],
        };
        if to_array {
            arrays::copy(d, m, a, extent, stream)?;
        } else {
            arrays::copy(d, a, m, extent, stream)?;
        }
    }
    Ok(())
}

fn host(p: *const c_void) -> CuResult<End> {
    if p.is_null() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    Ok(End::Host {
        ptr: p as u64,
        pitch: 0,
        height: 0,
    })
}

fn device(p: CUdeviceptr) -> End {
    End::Device {
        ptr: p,
        pitch: 0,
        height: 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoA_v2(
    dst: Handle,
    offset: usize,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    entry(|| {
        linear(
            dst as usize,
            offset,
            host(src)?,
            bytes,
            true,
            std::ptr::null_mut(),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2(
    dst: Handle,
    offset: usize,
    src: *const c_void,
    bytes: usize,
    s: Handle,
) -> CUresult {
    entry(|| linear(dst as usize, offset, host(src)?, bytes, true, s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoH_v2(
    dst: *mut c_void,
    src: Handle,
    offset: usize,
    bytes: usize,
) -> CUresult {
    entry(|| {
        linear(
            src as usize,
            offset,
            host(dst)?,
            bytes,
            false,
            std::ptr::null_mut(),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2(
    dst: *mut c_void,
    src: Handle,
    offset: usize,
    bytes: usize,
    s: Handle,
) -> CUresult {
    entry(|| linear(src as usize, offset, host(dst)?, bytes, false, s))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoA_v2(
    dst: Handle,
    offset: usize,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    entry(|| {
        linear(
            dst as usize,
            offset,
            device(src),
            bytes,
            true,
            std::ptr::null_mut(),
        )
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyAtoD_v2(
    dst: CUdeviceptr,
    src: Handle,
    offset: usize,
    bytes: usize,
) -> CUresult {
    entry(|| {
        linear(
            src as usize,
            offset,
            device(dst),
            bytes,
            false,
            std::ptr::null_mut(),
        )
    })
}

/// Array to array, by byte ranges: staged through host memory, as the
/// two arrays' rows need not line up.
#[no_mangle]
pub extern "C" fn cuMemcpyAtoA_v2(
    dst: Handle,
    dst_offset: usize,
    src: Handle,
    src_offset: usize,
    bytes: usize,
) -> CUresult {
    entry(|| {
        let mut buf = Vec::new();
        buf.try_reserve_exact(bytes)
            .map_err(|_| cu::ERROR_OUT_OF_MEMORY)?;
        buf.resize(bytes, 0u8);
        let staged = End::Host {
            ptr: buf.as_mut_ptr() as u64,
            pitch: 0,
            height: 0,
        };
        let none = std::ptr::null_mut();
        linear(src as usize, src_offset, staged, bytes, false, none)?;
        linear(dst as usize, dst_offset, staged, bytes, true, none)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectCreate(
    out: *mut u64,
    res: *const ResourceDesc,
    tex: *const TextureDesc,
    view: *const c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptors and out-parameter.
        let (r, t) = unsafe { (ffi::get(res)?, ffi::get(tex)?) };
        let d = driver()?;
        // A view of all zeros (CU_RES_VIEW_FORMAT_NONE, no sizes) is
        // none.
        if !view.is_null() {
            // SAFETY: the caller's CUDA_RESOURCE_VIEW_DESC (112 bytes).
            let v = unsafe { ffi::get(view.cast::<[u64; 14]>()) }?;
            if v.iter().any(|&w| w != 0) {
                return Err(d.not_supported_because("cuTexObjectCreate", "resource views"));
            }
        }
        // SAFETY: as above, checked before the object is made.
        unsafe { ffi::put(out, 0) }?;
        let h = arrays::object_create(d, &r, Some(&t))?;
        // SAFETY: as above.
        unsafe { ffi::put(out, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuTexObjectDestroy(tex: u64) -> CUresult {
    entry(|| arrays::object_destroy(driver()?, tex, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(out: *mut ResourceDesc, tex: u64) -> CUresult {
    entry(|| {
        let (r, _) = arrays::object_desc(driver()?, tex, false)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, r) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(out: *mut TextureDesc, tex: u64) -> CUresult {
    entry(|| {
        let (_, t) = arrays::object_desc(driver()?, tex, false)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, t) }
    })
}

/// No texture object here has a resource view.
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceViewDesc(_out: *mut c_void, tex: u64) -> CUresult {
    entry(|| {
        let d = driver()?;
        arrays::object_desc(d, tex, false)?;
        Err(d.not_supported_because("cuTexObjectGetResourceViewDesc", "resource views"))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectCreate(out: *mut u64, res: *const ResourceDesc) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let r = unsafe { ffi::get(res) }?;
        // SAFETY: the caller's out-parameter, checked before the object
        // is made.
        unsafe { ffi::put(out, 0) }?;
        let h = arrays::object_create(driver()?, &r, None)?;
        // SAFETY: as above.
        unsafe { ffi::put(out, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuSurfObjectDestroy(surf: u64) -> CUresult {
    entry(|| arrays::object_destroy(driver()?, surf, true))
}

#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(
    out: *mut ResourceDesc,
    surf: u64,
) -> CUresult {
    entry(|| {
        let (r, _) = arrays::object_desc(driver()?, surf, true)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, r) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_become_boxes_within_rows_and_slices() {
        // Rows of 16 bytes, 3 rows a slice, 2 slices.
        let ext = [16, 3, 2];
        assert_eq!(
            boxes(ext, 0, 96),
            Ok(vec![
                ([0, 0, 0], [16, 3, 1], 0),
                ([0, 0, 1], [16, 3, 1], 48)
            ])
        );
        assert_eq!(
            boxes(ext, 4, 40),
            Ok(vec![
                ([4, 0, 0], [12, 1, 1], 0),
                ([0, 1, 0], [16, 1, 1], 12),
                ([0, 2, 0], [12, 1, 1], 28),
            ])
        );
        // Whole rows go together, but not across a slice.
        assert_eq!(
            boxes(ext, 16, 64),
            Ok(vec![
                ([0, 1, 0], [16, 2, 1], 0),
                ([0, 0, 1], [16, 2, 1], 32)
            ])
        );
        assert_eq!(boxes(ext, 90, 7), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(boxes(ext, usize::MAX, 2), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(boxes(ext, 10, 0), Ok(Vec::new()));
    }
}
