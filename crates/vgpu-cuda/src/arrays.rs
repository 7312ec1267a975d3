//! CUDA arrays, texture and surface objects: the device's own (ABI 1.6).
//! An array is named by a handle of this library, filed with its device
//! and the device's handle; texture and surface objects by the device's
//! handles, which kernels use as they are (on a GPU, the host driver's
//! own objects), filed per device. Copies into and out of arrays are the
//! device's ARRAY_COPY; host memory goes through a staging allocation.

use std::collections::HashMap;

use vgpu_guest::sys::{self, VgpuCmd};

use crate::allocs::range_device;
use crate::cu::{self, Array3dDescriptor, CUdevice, CuResult, Handle, ResourceDesc, TextureDesc};
use crate::diag::check;
use crate::graphs::Unsafe;
use crate::handles::Handles;
use crate::state::{Driver, Gpu};

/// An array: its device, the device's handle and how it was made.
pub struct ArrayObj {
    /// The device's ordinal.
    pub device: CUdevice,
    /// The device's handle.
    pub remote: u64,
    /// As the program described it.
    pub desc: Array3dDescriptor,
}

impl ArrayObj {
    /// Bytes of one element.
    pub fn elem_bytes(&self) -> usize {
        format_bytes(self.desc.format).unwrap_or(1) * self.desc.channels as usize
    }

    /// Bytes, rows and slices (or layers) of the whole array.
    pub fn extent(&self) -> [usize; 3] {
        [
            self.desc.width * self.elem_bytes(),
            self.desc.height.max(1),
            self.desc.depth.max(1),
        ]
    }
}

/// A texture or surface object as the program described it.
pub struct ObjectObj {
    /// A surface object (else a texture object).
    pub surface: bool,
    /// Its resource, as the program described it.
    pub res: ResourceDesc,
    /// A texture's sampling (zeros for a surface).
    pub tex: TextureDesc,
}

/// The arrays and objects of the process.
#[derive(Default)]
pub struct Arrays {
    /// Arrays by this library's handle.
    pub arrays: Handles<ArrayObj>,
    /// By device and the device's handle.
    pub objects: HashMap<(CUdevice, u64), ObjectObj>,
}

/// Bytes of one channel of a `CUarray_format`.
pub fn format_bytes(format: u32) -> Option<usize> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// The vGPU behind the current context and its ordinal, where it has
/// arrays; `name` says which call was refused where it has none.
fn current<'a>(d: &'a Driver, name: &'static str) -> CuResult<(CUdevice, &'a Gpu)> {
    let (ctx, g) = d.current_gpu()?;
    let device = d.ctx_device(ctx)?;
    if !g.dev.has_arrays() {
        return Err(d.not_supported_because(name, "this vGPU has no CUDA arrays"));
    }
    Ok((device, g))
}

/// Checks an array's descriptor as `cuArray3DCreate` does: the shape
/// CUDA allows, within the device's limits.
pub fn check_descriptor(d: &Driver, a: &Array3dDescriptor) -> CuResult {
    use vgpu_guest::vgpu_abi as abi;
    if format_bytes(a.format).is_none() || !matches!(a.channels, 1 | 2 | 4) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let known = cu::ARRAY3D_LAYERED | cu::ARRAY3D_SURFACE_LDST | cu::ARRAY3D_CUBEMAP;
    if a.flags & !known != 0 {
        // Texture gather, depth textures, sparse arrays.
        return Err(d.not_supported_because(
            "cuArray3DCreate",
            &format!("array flags {:#x}", a.flags & !known),
        ));
    }
    let (w, h, z) = (a.width as u64, a.height as u64, a.depth as u64);
    let layered = a.flags & cu::ARRAY3D_LAYERED != 0;
    let fits = match (layered, h, z) {
        _ if w == 0 => false,
        // Six square faces (a layer's worth each).
        _ if a.flags & cu::ARRAY3D_CUBEMAP != 0 => {
            w == h
                && w <= abi::MAX_ARRAY_CUBEMAP
                && if layered {
                    z > 0 && z % 6 == 0 && z <= abi::MAX_CUBEMAP_FACES
                } else {
                    z == 6
                }
        }
        (false, 0, 0) => w <= abi::MAX_ARRAY_1D,
        (false, _, 0) => w <= abi::MAX_ARRAY_2D && h <= abi::MAX_ARRAY_2D,
        (false, 0, _) | (true, _, 0) => false,
        (false, _, _) => [w, h, z].iter().all(|&x| x <= abi::MAX_ARRAY_3D),
        (true, 0, _) => w <= abi::MAX_ARRAY_1D && z <= abi::MAX_ARRAY_LAYERS,
        (true, _, _) => {
            w <= abi::MAX_ARRAY_3D && h <= abi::MAX_ARRAY_3D && z <= abi::MAX_ARRAY_LAYERS
        }
    };
    if fits {
        Ok(())
    } else {
        Err(cu::ERROR_INVALID_VALUE)
    }
}

/// Makes an array on the current context's device.
pub fn create(d: &Driver, a: &Array3dDescriptor) -> CuResult<usize> {
    let (device, g) = current(d, "cuArray3DCreate")?;
    check_descriptor(d, a)?;
    let mut flags = 0;
    if a.flags & cu::ARRAY3D_LAYERED != 0 {
        flags |= sys::CMD_ARRAY_LAYERED;
    }
    if a.flags & cu::ARRAY3D_SURFACE_LDST != 0 {
        flags |= sys::CMD_ARRAY_SURFACE;
    }
    if a.flags & cu::ARRAY3D_CUBEMAP != 0 {
        flags |= sys::CMD_ARRAY_CUBEMAP;
    }
    let remote = check(g.dev.resource(VgpuCmd::array(
        flags,
        sys::VgpuArrayArgs {
            format: a.format,
            channels: a.channels,
            width: a.width as u64,
            height: a.height as u64,
            depth: a.depth as u64,
        },
    )))?;
    let mut o = d.objects();
    let h = o.handle();
    o.arrays_mut().arrays.insert(
        h,
        ArrayObj {
            device,
            remote,
            desc: *a,
        },
    );
    Ok(h)
}

/// Destroys array `h` once the device's work that may read it is done.
pub fn destroy(d: &Driver, h: usize) -> CuResult {
    let (device, remote) = {
        let o = d.objects();
        let a = o.arrays().arrays.get(h)?;
        (a.device, a.remote)
    };
    let g = d.gpu(device)?;
    g.sync()?;
    d.objects().arrays_mut().arrays.remove(h)?;
    check(
        g.dev
            .resource(VgpuCmd::object_destroy(sys::OBJ_ARRAY, remote)),
    )
    .map(|_| ())
}

/// How array `h` was made.
pub fn descriptor(d: &Driver, h: usize) -> CuResult<Array3dDescriptor> {
    Ok(d.objects().arrays().arrays.get(h)?.desc)
}

/// One end of a copy that involves an array.
#[derive(Clone, Copy, Debug)]
pub enum End {
    /// Host memory.
    Host {
        /// The region's start.
        ptr: u64,
        /// Bytes per row.
        pitch: usize,
        /// Rows per slice.
        height: usize,
    },
    /// Device memory.
    Device {
        /// The region's start.
        ptr: u64,
        /// Bytes per row.
        pitch: usize,
        /// Rows per slice.
        height: usize,
    },
    /// An array of this library.
    Array(usize),
}

/// `CUmemorytype` of an array side of a 2D or 3D copy.
pub const MEMORYTYPE_ARRAY: u32 = 3;
/// `CUmemorytype` of a unified address.
const MEMORYTYPE_UNIFIED: u32 = 4;

/// One side of a `CUDA_MEMCPY2D` or `CUDA_MEMCPY3D` as an [`End`].
pub fn end_of(
    d: &Driver,
    kind: u32,
    (host, device, array): (u64, u64, Handle),
    pitch: usize,
    height: usize,
) -> CuResult<End> {
    Ok(match kind {
        cu::MEMORYTYPE_HOST => End::Host {
            ptr: host,
            pitch,
            height,
        },
        cu::MEMORYTYPE_DEVICE => End::Device {
            ptr: device,
            pitch,
            height,
        },
        MEMORYTYPE_ARRAY => End::Array(array as usize),
        // A unified address: the copy's pointer is in the device field.
        MEMORYTYPE_UNIFIED => match crate::copies::side(d, device, 1) {
            crate::copies::Side::Device => End::Device {
                ptr: device,
                pitch,
                height,
            },
            crate::copies::Side::Host => End::Host {
                ptr: device,
                pitch,
                height,
            },
        },
        _ => return Err(cu::ERROR_INVALID_VALUE),
    })
}

/// An end and where in it the box starts (byte, row, slice).
#[derive(Clone, Copy, Debug)]
pub struct Side {
    /// The memory or array.
    pub end: End,
    /// Byte, row and slice.
    pub pos: [usize; 3],
}

/// Where a memory side's box starts and the bytes it spans, checked:
/// rows of `extent[0]` bytes fit the pitch, slices their rows, nothing
/// overflows.
fn span(
    ptr: u64,
    pitch: usize,
    height: usize,
    pos: [usize; 3],
    extent: [usize; 3],
) -> CuResult<(u64, u64)> {
    let [w, h, z] = extent.map(|v| v as u64);
    let (pitch, height) = (pitch as u64, height as u64);
    let [x, y, sz] = pos.map(|v| v as u64);
    if (h > 1 || z > 1) && pitch < w || z > 1 && height < h {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let slice = pitch.checked_mul(height).ok_or(cu::ERROR_INVALID_VALUE)?;
    let start = slice
        .checked_mul(sz)
        .and_then(|o| o.checked_add(pitch.checked_mul(y)?))
        .and_then(|o| o.checked_add(x))
        .and_then(|o| o.checked_add(ptr))
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    let len = slice
        .checked_mul(z - 1)
        .and_then(|o| o.checked_add(pitch.checked_mul(h - 1)?))
        .and_then(|o| o.checked_add(w))
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    start.checked_add(len).ok_or(cu::ERROR_INVALID_VALUE)?;
    Ok((start, len))
}

/// An end as the device's ARRAY_COPY takes it: `(at, pitch, height,
/// is_array)`.
type Remote = (u64, u32, u32, bool);

/// Copies a box of `extent` (bytes, rows, slices) from `src` to `dst`,
/// one of which is an array; done by the time it returns, after the
/// device's earlier work (so a stream's order holds).
pub fn copy(d: &Driver, src: Side, dst: Side, extent: [usize; 3], stream: Handle) -> CuResult {
    if extent.contains(&0) {
        return Ok(());
    }
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    // The arrays' device, and each side's box checked against its array.
    let mut device = None;
    let mut resolve = |s: &Side| -> CuResult<Option<u64>> {
        let End::Array(h) = s.end else {
            return Ok(None);
        };
        let o = d.objects();
        let a = o.arrays().arrays.get(h)?;
        if device.is_some_and(|dv| dv != a.device) {
            return Err(d.not_supported_because("a copy between arrays", "of two vGPUs"));
        }
        device = Some(a.device);
        let limit = a.extent();
        let elem = a.elem_bytes();
        let fits = (0..3).all(|i| {
            s.pos[i]
                .checked_add(extent[i])
                .is_some_and(|e| e <= limit[i])
        });
        if !fits || !s.pos[0].is_multiple_of(elem) || !extent[0].is_multiple_of(elem) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        Ok(Some(a.remote))
    };
    let (src_array, dst_array) = (resolve(&src)?, resolve(&dst)?);
    let device = device.ok_or(cu::ERROR_INVALID_VALUE)?;
    let g = d.gpu(device)?;
    let narrow = |v: usize| u32::try_from(v).map_err(|_| cu::ERROR_INVALID_VALUE);
    for v in extent.iter().chain(&src.pos).chain(&dst.pos) {
        narrow(*v)?;
    }
    // The work queued before, which may write what is copied.
    g.sync()?;
    let remote = |s: &Side, array: Option<u64>| -> CuResult<Option<Remote>> {
        Ok(match (s.end, array) {
            (_, Some(a)) => Some((a, 0, 0, true)),
            (End::Device { ptr, pitch, height }, None) => {
                let (start, len) = span(ptr, pitch, height, s.pos, extent)?;
                if range_device(d, start, len as usize)? != device {
                    return Err(d.not_supported_because("a copy with an array", "of another vGPU"));
                }
                Some((ptr, narrow(pitch)?, narrow(height)?, false))
            }
            _ => None,
        })
    };
    let array_copy = |from: (Remote, [usize; 3]), to: (Remote, [usize; 3])| -> CuResult {
        let ((s, sp, sh, sa), (t, tp, th, ta)) = (from.0, to.0);
        let flags = if sa { sys::CMD_COPY_SRC_ARRAY } else { 0 }
            | if ta { sys::CMD_COPY_DST_ARRAY } else { 0 };
        let args = sys::VgpuArrayCopyArgs {
            src: s,
            dst: t,
            src_pitch: sp,
            src_height: sh,
            dst_pitch: tp,
            dst_height: th,
            src_pos: from.1.map(|v| v as u32),
            dst_pos: to.1.map(|v| v as u32),
            extent: extent.map(|v| v as u32),
            pad: 0,
        };
        check(g.dev.resource(VgpuCmd::array_copy(flags, args))).map(|_| ())
    };
    match (remote(&src, src_array)?, remote(&dst, dst_array)?) {
        (Some(s), Some(t)) => array_copy((s, src.pos), (t, dst.pos)),
        (None, Some(t)) => {
            let End::Host { ptr, pitch, height } = src.end else {
                return Err(cu::ERROR_INVALID_VALUE);
            };
            let (packed, staged) = stage(g, extent)?;
            let bytes = gather(ptr, pitch, height, src.pos, extent)?;
            check(g.dev.copy_to_device(&staged, 0, &bytes))?;
            array_copy((packed, [0; 3]), (t, dst.pos))
        }
        (Some(s), None) => {
            let End::Host { ptr, pitch, height } = dst.end else {
                return Err(cu::ERROR_INVALID_VALUE);
            };
            span(ptr, pitch, height, dst.pos, extent)?;
            let (packed, staged) = stage(g, extent)?;
            array_copy((s, src.pos), (packed, [0; 3]))?;
            let mut bytes = vec![0u8; staged.size() as usize];
            check(g.dev.copy_from_device(&staged, 0, &mut bytes))?;
            scatter(&bytes, ptr, pitch, height, dst.pos, extent);
            Ok(())
        }
        (None, None) => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// A staging allocation of the device holding a packed box of `extent`.
fn stage(g: &Gpu, extent: [usize; 3]) -> CuResult<(Remote, vgpu_guest::Buffer)> {
    let bytes = extent
        .iter()
        .try_fold(1u64, |a, &v| a.checked_mul(v as u64))
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    let buf = check(g.dev.alloc(bytes))?;
    let pitch = u32::try_from(extent[0]).map_err(|_| cu::ERROR_INVALID_VALUE)?;
    let rows = u32::try_from(extent[1]).map_err(|_| cu::ERROR_INVALID_VALUE)?;
    Ok(((buf.addr(), pitch, rows, false), buf))
}

/// The rows of a host box, packed.
fn gather(
    ptr: u64,
    pitch: usize,
    height: usize,
    pos: [usize; 3],
    extent: [usize; 3],
) -> CuResult<Vec<u8>> {
    let (start, _) = span(ptr, pitch, height, pos, extent)?;
    let [w, h, z] = extent;
    let mut out = Vec::new();
    out.try_reserve_exact(w * h * z)
        .map_err(|_| cu::ERROR_OUT_OF_MEMORY)?;
    for k in 0..z {
        for r in 0..h {
            let at = start as usize + k * pitch * height + r * pitch;
            // SAFETY: the row lies in the caller's source region, whose
            // span was checked not to overflow; the caller vouches for its
            // memory, as with every host pointer it passes.
            let row = unsafe { std::slice::from_raw_parts(at as *const u8, w) };
            out.extend_from_slice(row);
        }
    }
    Ok(out)
}

/// Writes packed rows into a host box (its span already checked).
fn scatter(
    bytes: &[u8],
    ptr: u64,
    pitch: usize,
    height: usize,
    pos: [usize; 3],
    extent: [usize; 3],
) {
    let [w, h, z] = extent;
    let start = ptr as usize + pos[2] * pitch * height + pos[1] * pitch + pos[0];
    for (i, row) in bytes.chunks_exact(w).take(h * z).enumerate() {
        let at = start + (i / h) * pitch * height + (i % h) * pitch;
        // SAFETY: as in `gather`, for the caller's destination region.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), at as *mut u8, w) };
    }
}

/// The element type and channels of a memory resource: `(format,
/// channels)` from a resource descriptor's union words.
fn memory_format(res: &ResourceDesc) -> (u32, u32) {
    (res.res[1] as u32, (res.res[1] >> 32) as u32)
}

/// Makes a texture object (`tex`) or a surface object (`None`) on the
/// current context's device; the handle is the device's.
pub fn object_create(d: &Driver, res: &ResourceDesc, tex: Option<&TextureDesc>) -> CuResult<u64> {
    let name = if tex.is_some() {
        "cuTexObjectCreate"
    } else {
        "cuSurfObjectCreate"
    };
    let (device, g) = current(d, name)?;
    if res.flags != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let mut args = sys::VgpuObjectArgs::default();
    match res.res_type {
        cu::RESOURCE_TYPE_ARRAY => {
            let o = d.objects();
            let a = o
                .arrays()
                .arrays
                .get(res.res[0] as usize)
                .map_err(|_| cu::ERROR_INVALID_VALUE)?;
            if a.device != device {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            args.resource = a.remote;
            args.res_type = 0;
        }
        cu::RESOURCE_TYPE_LINEAR | cu::RESOURCE_TYPE_PITCH2D if tex.is_some() => {
            let (format, channels) = memory_format(res);
            let elem = format_bytes(format).ok_or(cu::ERROR_INVALID_VALUE)? as u64;
            if !matches!(channels, 1 | 2 | 4) {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            let (size, len) = if res.res_type == cu::RESOURCE_TYPE_LINEAR {
                (res.res[2], res.res[2])
            } else {
                let (w, h, pitch) = (res.res[2], res.res[3], res.res[4]);
                args.width = u32::try_from(w).map_err(|_| cu::ERROR_INVALID_VALUE)?;
                args.height = u32::try_from(h).map_err(|_| cu::ERROR_INVALID_VALUE)?;
                let row = w * elem * u64::from(channels);
                if w == 0 || h == 0 || pitch < row {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
                (pitch, pitch * (h - 1) + row)
            };
            if range_device(d, res.res[0], len as usize)? != device {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            args.resource = res.res[0];
            args.size = size;
            args.res_type = if res.res_type == cu::RESOURCE_TYPE_LINEAR {
                1
            } else {
                2
            };
            args.format = format;
            args.channels = channels;
        }
        cu::RESOURCE_TYPE_MIPMAPPED_ARRAY => {
            return Err(d.not_supported_because(name, "mipmapped arrays"));
        }
        _ => return Err(cu::ERROR_INVALID_VALUE),
    }
    let kind = match tex {
        Some(t) => {
            if t.address_mode.iter().any(|&m| m > 3) || t.filter_mode > 1 {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            // What only mipmaps and cubemaps use changes nothing here.
            let flags =
                t.flags & !(cu::TRSF_DISABLE_TRILINEAR_OPTIMIZATION | cu::TRSF_SEAMLESS_CUBEMAP);
            if flags & cu::TRSF_SRGB != 0 {
                return Err(d.not_supported_because(name, "sRGB textures"));
            }
            if flags & !(cu::TRSF_READ_AS_INTEGER | cu::TRSF_NORMALIZED_COORDINATES) != 0 {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            args.address = t.address_mode[0] | t.address_mode[1] << 8 | t.address_mode[2] << 16;
            args.filter = t.filter_mode;
            args.tex_flags = flags;
            args.border = t.border_color.map(f32::to_bits);
            sys::OBJ_TEXTURE
        }
        None => sys::OBJ_SURFACE,
    };
    let h = check(g.dev.resource(VgpuCmd::object(kind, args)))?;
    d.objects().arrays_mut().objects.insert(
        (device, h),
        ObjectObj {
            surface: tex.is_none(),
            res: *res,
            tex: tex.copied().unwrap_or_default(),
        },
    );
    Ok(h)
}

/// The object `h` of the current context's device, of the kind asked.
fn object_key(d: &Driver, h: u64, surface: bool) -> CuResult<(CUdevice, u64)> {
    let (ctx, _) = d.current_gpu()?;
    let device = d.ctx_device(ctx)?;
    match d.objects().arrays().objects.get(&(device, h)) {
        Some(o) if o.surface == surface => Ok((device, h)),
        _ => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// Destroys a texture or surface object once the work that may use it
/// is done.
pub fn object_destroy(d: &Driver, h: u64, surface: bool) -> CuResult {
    let key = object_key(d, h, surface)?;
    let g = d.gpu(key.0)?;
    g.sync()?;
    d.objects().arrays_mut().objects.remove(&key);
    let kind = if surface {
        sys::OBJ_SURFACE
    } else {
        sys::OBJ_TEXTURE
    };
    check(g.dev.resource(VgpuCmd::object_destroy(kind, h))).map(|_| ())
}

/// What object `h` was made of.
pub fn object_desc(d: &Driver, h: u64, surface: bool) -> CuResult<(ResourceDesc, TextureDesc)> {
    let key = object_key(d, h, surface)?;
    let o = d.objects();
    let obj = &o.arrays().objects[&key];
    Ok((obj.res, obj.tex))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_checked() {
        assert_eq!(
            span(0x1000, 64, 4, [8, 1, 1], [16, 2, 2]),
            Ok((0x1000 + 256 + 64 + 8, 256 + 64 + 16))
        );
        assert_eq!(
            span(0, 8, 4, [0; 3], [16, 2, 1]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            span(0, 64, 1, [0; 3], [16, 2, 2]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        // One row needs no pitch.
        assert_eq!(span(0x10, 0, 0, [4, 0, 0], [16, 1, 1]), Ok((0x14, 16)));
        assert_eq!(
            span(u64::MAX - 8, 64, 4, [0; 3], [16, 1, 1]),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            span(0, usize::MAX, usize::MAX, [0, 0, 2], [1, 1, 1]),
            Err(cu::ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn boxes_gather_and_scatter_row_by_row() {
        // Two slices of three rows of 8 bytes, pitch 10, rows per slice 4.
        let src: Vec<u8> = (0..100).collect();
        let packed = gather(src.as_ptr() as u64, 10, 4, [1, 1, 0], [3, 2, 2]).unwrap();
        assert_eq!(packed, [11, 12, 13, 21, 22, 23, 51, 52, 53, 61, 62, 63]);
        let mut dst = vec![0u8; 100];
        scatter(
            &packed,
            dst.as_mut_ptr() as u64,
            10,
            4,
            [1, 1, 0],
            [3, 2, 2],
        );
        for (i, b) in dst.iter().enumerate() {
            let inside = [11, 12, 13, 21, 22, 23, 51, 52, 53, 61, 62, 63].contains(&i);
            assert_eq!(*b, if inside { i as u8 } else { 0 }, "byte {i}");
        }
    }

    #[test]
    fn formats_have_their_sizes() {
        assert_eq!(format_bytes(0x01), Some(1));
        assert_eq!(format_bytes(0x10), Some(2));
        assert_eq!(format_bytes(0x20), Some(4));
        assert_eq!(format_bytes(0x0b), None);
        assert_eq!(format_bytes(0xb0), None);
    }
}
