//! Device memory a program allocates: placed away from host memory of
//! this process (unified addressing tells the two apart by address),
//! from a pool where asked, and freed once the work that may use it is
//! done.

use crate::cu::{self, CUdevice, CUdeviceptr, CuResult, Handle};
use crate::diag::{check, log};
use crate::host_pages;
use crate::mem_table::Alloc;
use crate::state::{driver, Driver};

/// The device holding `[addr, addr + len)`, which must lie in one
/// allocation this process made.
/// The ordinal of the device whose allocation holds `[addr, addr + len)`.
pub fn range_device(d: &Driver, addr: CUdeviceptr, len: usize) -> CuResult<CUdevice> {
    d.objects()
        .allocs()
        .alloc_at(addr, len as u64)
        .map(|(_, a)| a.device)
        .ok_or(cu::ERROR_INVALID_VALUE)
}

/// Device allocations tried before one not over host memory of this
/// process is found.
const ALLOC_TRIES: usize = 8;

/// What kind of memory an allocation is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Memory of the device alone (`cuMemAlloc`).
    Device,
    /// Managed: whole pages, host memory of the process at the same
    /// address too ([`crate::managed`]).
    Managed,
}

/// Allocates `size` bytes of device memory on the current context's device.
pub fn alloc(size: usize) -> CuResult<CUdeviceptr> {
    alloc_kind(size, Kind::Device)
}

/// Allocates `size` bytes of `kind` on the current context's device, away
/// from host memory of this process.
pub fn alloc_kind(size: usize, kind: Kind) -> CuResult<CUdeviceptr> {
    let d = driver()?;
    let (ctx, g) = d.current_gpu()?;
    if size == 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let (size, align) = match kind {
        Kind::Device => (size, 0),
        Kind::Managed => (
            size.checked_next_multiple_of(host_pages::PAGE)
                .ok_or(cu::ERROR_OUT_OF_MEMORY)?,
            host_pages::PAGE as u64,
        ),
    };
    let device = d.ctx_device(ctx)?;
    // Device addresses must not be host addresses of this process
    // (unified addressing tells them apart by address): an allocation
    // whose pages host memory holds is kept aside, so that the device
    // hands out another, and freed once one fits.
    let mut aside = Vec::new();
    let mut found = Ok(None);
    for _ in 0..ALLOC_TRIES {
        let addr = match check(g.dev.alloc_aligned(size as u64, align)) {
            Ok(p) => p.into_raw(),
            Err(e) => {
                found = Err(e);
                break;
            }
        };
        if d.objects().allocs_mut().reserve(addr, size as u64) {
            found = Ok(Some(addr));
            break;
        }
        log(&format!(
            "device allocation at {addr:#x} ({size} bytes) lies over host memory of this process; asking again"
        ));
        // Where the pages are another device's allocation (vGPUs hand out
        // addresses independently), one allocation reaching past it keeps
        // the next try beyond it, however small this one is.
        let past = d.objects().allocs().allocations_end(addr, size as u64);
        match past.map(|end| end.saturating_sub(addr)) {
            Some(reach) if reach > size as u64 => {
                let _ = g.dev.free_raw(addr);
                if let Ok(filler) = check(g.dev.alloc_aligned(reach, 0)) {
                    aside.push(filler.into_raw());
                }
            }
            _ => aside.push(addr),
        }
    }
    for a in aside {
        let _ = g.dev.free_raw(a);
    }
    let addr = found?.ok_or_else(|| {
        log(&format!(
            "{ALLOC_TRIES} device allocations of {size} bytes each lay over host memory of this process"
        ));
        cu::ERROR_OUT_OF_MEMORY
    })?;
    let managed = kind == Kind::Managed;
    let mut o = d.objects();
    if managed && !o.allocs_mut().make_host_memory(addr, size as u64) {
        // The device's address is not one the process can map.
        o.allocs_mut().release(addr, size as u64);
        drop(o);
        let _ = g.dev.free_raw(addr);
        log(&format!(
            "managed allocation at {addr:#x} ({size} bytes): the process cannot map that address"
        ));
        return Err(cu::ERROR_NOT_SUPPORTED);
    }
    o.allocs_mut().insert(
        addr,
        Alloc {
            size: size as u64,
            device,
            ctx,
            module: None,
            managed,
            mapping: None,
        },
    );
    drop(o);
    if managed {
        g.inflight().managed.add(addr, size as u64);
    }
    Ok(addr)
}

/// Frees device memory at `addr`, once the work that may use it is done.
pub fn free(addr: CUdeviceptr) -> CuResult {
    let d = driver()?;
    let device = d
        .objects()
        .allocs()
        .freeable(addr)
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    let g = d.gpu(device)?;
    // cuMemFree waits for work that may still use the memory.
    g.sync()?;
    // Managed memory stops moving before its pages go.
    g.inflight().managed.remove(addr);
    {
        let mut o = d.objects();
        o.allocs_mut().free(addr);
        o.pools_mut().freed(addr);
    }
    check(g.dev.free_raw(addr))
}

/// An allocation from `pool` (of the current context's device), recorded
/// as the pool's.
pub fn alloc_from(d: &Driver, pool: Option<usize>, size: usize) -> CuResult<CUdeviceptr> {
    let (_, dev) = d.current_ctx()?;
    let pool = {
        let mut o = d.objects();
        match pool {
            Some(p) => {
                if o.pools().get(p)?.device != dev {
                    return Err(cu::ERROR_INVALID_VALUE);
                }
                p
            }
            None => {
                let h = o.handle();
                o.pools_mut().current(dev, || h)
            }
        }
    };
    let addr = alloc(size)?;
    d.objects().pools_mut().allocated(pool, addr, size as u64);
    Ok(addr)
}

/// A stream-ordered allocation on `stream`: one its capture (if it is
/// capturing) may free again ([`crate::graphs`]'s owned memory).
pub fn alloc_async(
    d: &Driver,
    pool: Option<usize>,
    size: usize,
    stream: Handle,
) -> CuResult<CUdeviceptr> {
    let addr = alloc_from(d, pool, size)?;
    d.objects().captured_alloc(stream as usize, addr);
    Ok(addr)
}

/// Frees the device memory graphs let go of (see `Graphs::take_to_free`).
pub fn free_released(d: &Driver) {
    let addrs = d.objects().graphs_mut().take_to_free();
    for a in addrs {
        if let Err(e) = free(a) {
            log(&format!("memory a graph owned at {a:#x} not freed: {e}"));
        }
    }
}
