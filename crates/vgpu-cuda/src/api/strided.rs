//! Copies and memsets of 2D and 3D regions (`cudaMemcpy2D`,
//! `cudaMemcpy3D`, `cudaMemset2D`, cuBLAS's `cublasSetMatrix`), and
//! pitched allocations (`cudaMallocPitch`), over [`crate::pitched`].

use crate::allocs::alloc;
use crate::arrays::{self, Side};
use crate::copies::Call;
use crate::cu::{self, CUdeviceptr, CUresult, Handle, Memcpy2D, Memcpy3d};
use crate::ffi::{self, entry, CuResult};
use crate::pitched::{memset_2d, Copy3D};
use crate::state::driver;

/// Pitch alignment of `cuMemAllocPitch`, as NVIDIA's driver gives on
/// current GPUs.
const PITCH_ALIGN: usize = 512;

fn copy_2d(p: *const Memcpy2D, stream: Handle, call: Call) -> CuResult {
    // SAFETY: the caller's descriptor.
    let c = unsafe { ffi::get(p) }?;
    let d = driver()?;
    if c.src_type == arrays::MEMORYTYPE_ARRAY || c.dst_type == arrays::MEMORYTYPE_ARRAY {
        // Done by the time it returns, which an asynchronous call allows.
        let src = Side {
            end: arrays::end_of(
                d,
                c.src_type,
                (c.src_host as u64, c.src_device, c.src_array),
                c.src_pitch,
                0,
            )?,
            pos: [c.src_x, c.src_y, 0],
        };
        let dst = Side {
            end: arrays::end_of(
                d,
                c.dst_type,
                (c.dst_host as u64, c.dst_device, c.dst_array),
                c.dst_pitch,
                0,
            )?,
            pos: [c.dst_x, c.dst_y, 0],
        };
        return arrays::copy(d, src, dst, [c.width, c.height, 1], stream);
    }
    Copy3D::of_2d(d, &c)?.run(stream, call)
}

fn copy_3d(p: *const Memcpy3d, stream: Handle, call: Call) -> CuResult {
    // SAFETY: the caller's descriptor.
    let c = unsafe { ffi::get(p) }?;
    let d = driver()?;
    if c.src.memory_type == arrays::MEMORYTYPE_ARRAY
        || c.dst.memory_type == arrays::MEMORYTYPE_ARRAY
    {
        let side = |s: &cu::Memcpy3dSide| -> CuResult<Side> {
            if s.lod != 0 {
                return Err(cu::ERROR_INVALID_VALUE);
            }
            Ok(Side {
                end: arrays::end_of(
                    d,
                    s.memory_type,
                    (s.host as u64, s.device, s.array),
                    s.pitch,
                    s.height,
                )?,
                pos: [s.x_bytes, s.y, s.z],
            })
        };
        let extent = [c.width_bytes, c.height, c.depth];
        return arrays::copy(d, side(&c.src)?, side(&c.dst)?, extent, stream);
    }
    Copy3D::of(d, &c)?.run(stream, call)
}

/// `cuMemcpy3DPeer`: a `CUDA_MEMCPY3D_PEER`, laid out as a
/// `CUDA_MEMCPY3D` whose reserved words name each side's context. The
/// contexts given must be live; the addresses say which devices, and a
/// copy between two of them is staged through host memory.
fn copy_3d_peer(p: *const Memcpy3d, stream: Handle, call: Call) -> CuResult {
    // SAFETY: the caller's descriptor.
    let mut c = unsafe { ffi::get(p) }?;
    let d = driver()?;
    for side in [&mut c.src, &mut c.dst] {
        if !side.reserved.is_null() {
            d.ctx_device(side.reserved as usize)?;
        }
        side.reserved = std::ptr::null_mut();
    }
    Copy3D::of(d, &c)?.run(stream, call)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeer(p: *const Memcpy3d) -> CUresult {
    entry(|| copy_3d_peer(p, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeerAsync(p: *const Memcpy3d, s: Handle) -> CUresult {
    entry(|| copy_3d_peer(p, s, Call::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const Memcpy2D) -> CUresult {
    entry(|| copy_2d(p, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) -> CUresult {
    entry(|| copy_2d(p, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, s: Handle) -> CUresult {
    entry(|| copy_2d(p, s, Call::Async))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(p: *const Memcpy3d) -> CUresult {
    entry(|| copy_3d(p, std::ptr::null_mut(), Call::Sync))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(p: *const Memcpy3d, s: Handle) -> CUresult {
    entry(|| copy_3d(p, s, Call::Async))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v.into(), 1, (w, h), std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v.into(), 2, (w, h), std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v, 4, (w, h), std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
    s: Handle,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v.into(), 1, (w, h), s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
    s: Handle,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v.into(), 2, (w, h), s))
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: u32,
    w: usize,
    h: usize,
    s: Handle,
) -> CUresult {
    entry(|| memset_2d(dst, pitch, v, 4, (w, h), s))
}

/// `cuMemAllocPitch`: rows of `width` bytes padded to [`PITCH_ALIGN`].
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    entry(|| {
        if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let p = width
            .checked_next_multiple_of(PITCH_ALIGN)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        let size = p.checked_mul(height).ok_or(cu::ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-parameters, checked before allocating
        // so a bad one leaks nothing.
        unsafe {
            ffi::put(pitch, p)?;
            ffi::put(dptr, 0)?;
        }
        let addr = alloc(size)?;
        // SAFETY: as above.
        unsafe { ffi::put(dptr, addr) }
    })
}
