//! A launch's arguments as callers hand them over: the parameter block
//! read through their pointers, and CUDA's limits on the launch's shape.

use std::ffi::c_void;
use std::sync::Arc;

use vgpu_guest::vgpu_abi as abi;
use vgpu_guest::{sys, Dims, Function};

use crate::cu::{self, CuResult, Handle};
use crate::diag::log;
use crate::ffi;
use crate::state::{driver, Driver};

/// The parameter block of a launch: `params[i]` points at parameter `i`
/// (placed at its offset in the layout), or `extra` hands a packed buffer
/// (`CU_LAUNCH_PARAM_BUFFER_POINTER`/`_SIZE`).
///
/// # Safety
/// `params` is null or holds one valid pointer per kernel parameter;
/// `extra` is null or a `CU_LAUNCH_PARAM_END`-terminated key/value list.
pub unsafe fn param_block(
    d: &Driver,
    f: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<Vec<u8>> {
    let function = {
        let o = d.objects();
        Arc::clone(&o.modules().funcs.get(f)?.function)
    };
    let mut block = vec![0u8; function.info.params_size as usize];
    // SAFETY: forwarded.
    unsafe { fill_param_block(&function, params, extra, &mut block) }?;
    Ok(block)
}

/// [`param_block`] of `function` into `block`, which is its parameters'
/// size, zeroed.
///
/// # Safety
/// As [`param_block`].
pub unsafe fn fill_param_block(
    function: &Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    block: &mut [u8],
) -> CuResult {
    let layout = &function.params;
    if !params.is_null() {
        for (i, p) in layout.iter().enumerate() {
            // SAFETY: one pointer per parameter, each to `size` bytes.
            let src = unsafe {
                let ptr = ffi::get(params.add(i).cast_const())?;
                ffi::bytes(ptr.cast::<u8>(), p.size as usize)?
            };
            let at = p.offset as usize;
            block
                .get_mut(at..at + src.len())
                .ok_or(cu::ERROR_INVALID_IMAGE)?
                .copy_from_slice(src);
        }
        return Ok(());
    }
    if extra.is_null() {
        return if layout.is_empty() {
            Ok(())
        } else {
            Err(cu::ERROR_INVALID_VALUE)
        };
    }
    let (mut buf, mut len) = (std::ptr::null::<u8>(), None);
    for i in (0..64).step_by(2) {
        // SAFETY: a key/value list ending with CU_LAUNCH_PARAM_END, which
        // the bound of 32 pairs stops a list without one from overrunning
        // forever.
        let key = unsafe { ffi::get(extra.add(i).cast_const()) }? as usize;
        if key == cu::LAUNCH_PARAM_END {
            break;
        }
        // SAFETY: as above; every key but END has a value.
        let value = unsafe { ffi::get(extra.add(i + 1).cast_const()) }?;
        match key {
            cu::LAUNCH_PARAM_BUFFER_POINTER => buf = value.cast(),
            // SAFETY: the size's value points at a size_t.
            cu::LAUNCH_PARAM_BUFFER_SIZE => len = Some(unsafe { ffi::get(value.cast::<usize>()) }?),
            _ => return Err(cu::ERROR_INVALID_VALUE),
        }
    }
    let len = len.ok_or(cu::ERROR_INVALID_VALUE)?;
    // Shorter than the kernel's parameters, or longer than any kernel's.
    if len < block.len() || len > sys::MAX_PARAMS_BYTES as usize {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's packed buffer of `len` bytes.
    let src = unsafe { ffi::bytes(buf, len) }?;
    let n = block.len();
    block.copy_from_slice(&src[..n]);
    Ok(())
}

/// CUDA's launch limits, checked before the launch is queued: the device
/// would refuse it too, but together with the work queued beside it.
pub fn check_shape(d: &Dims, params: usize) -> CuResult {
    let [bx, by, bz] = d.block.map(u64::from);
    let ok = !d.grid.contains(&0)
        && !d.block.contains(&0)
        && bx * by * bz <= u64::from(abi::MAX_BLOCK_THREADS)
        && bz <= u64::from(abi::MAX_BLOCK_Z)
        && d.grid[1] <= abi::MAX_GRID_Y
        && d.grid[2] <= abi::MAX_GRID_Z
        && d.grid[0] <= abi::MAX_GRID_X
        && params <= sys::MAX_PARAMS_BYTES as usize;
    if ok {
        Ok(())
    } else {
        log(&format!(
            "launch shape {d:?} with {params} parameter bytes is outside CUDA's limits"
        ));
        Err(cu::ERROR_INVALID_VALUE)
    }
}

/// The work of a launch of `f` (no clusters) as a graph's kernel node
/// holds it, and its device.
///
/// # Safety
/// `params` and `extra` as `cuLaunchKernel` takes them.
pub unsafe fn kernel_work(
    f: Handle,
    dims: Dims,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<(cu::CUdevice, crate::work::Work)> {
    let d = driver()?;
    // A library's kernel runs on the current device.
    let f = match d.current_ctx() {
        Ok((_, dev)) => d.function_on(f as usize, dev)?,
        Err(_) => f as usize,
    };
    // SAFETY: the caller's parameter pointers.
    let block = unsafe { param_block(d, f, params, extra) }?;
    check_shape(&dims, block.len())?;
    d.launch_work(f, dims, ([1, 1, 1], false), &block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_up_to_cudas_limit_pass() {
        let dims = Dims {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
        };
        // CUDA 12.1 and later: 32,764 bytes of parameters.
        assert_eq!(check_shape(&dims, 32764), Ok(()));
        assert_eq!(check_shape(&dims, 32765), Err(cu::ERROR_INVALID_VALUE));
    }
}
