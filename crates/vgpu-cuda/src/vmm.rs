//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess` and the rest) over the device's
//! VA_RESERVE, MEM_CREATE, MEM_MAP and MEM_ACCESS (the kernel driver's
//! `VGPU_IOCTL_VMM`).
//!
//! A reservation's pages are held in this process's address space as an
//! allocation's are ([`crate::reserve`]), so no host memory lands there;
//! each mapping is filed among the device allocations
//! ([`crate::mem_table::Alloc::mapping`]), so copies, memsets, pointer
//! queries and kernel arguments reach it as they reach `cuMemAlloc`
//! memory, across mappings side by side too. A physical allocation lives
//! on the device while its handle has references (`cuMemCreate`,
//! `cuMemRetainAllocationHandle`, an import) or a mapping uses it, as on
//! a GPU: its memory (charged to the quota, which `cuMemGetInfo` reads)
//! is released with the last of both.
//!
//! Device rules the driver is looser about: a reservation lives on the
//! device of the context current when it was made, and only that device's
//! physical allocations map into it (`CUDA_ERROR_INVALID_DEVICE`, as a
//! GPU without peer access answers); `cuMemSetAccess` takes whole
//! mappings (a part of one is `CUDA_ERROR_INVALID_VALUE`); access for
//! another device is refused as peer access is. POSIX file descriptors
//! ([`VmmTable::export_token`]) name an allocation within this process
//! only: another process's is `CUDA_ERROR_NOT_SUPPORTED` on import.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};

use vgpu_guest::sys;

use crate::cu::{self, CUdevice, CuResult, MemLocation};
use crate::diag::{check, log};
use crate::mem_table::{Alloc, Mapping};
use crate::state::{driver, Driver, Gpu};

/// What addresses, sizes and offsets are multiples of: a GPU's 2 MiB
/// pages, the device's granule.
pub const GRANULARITY: u64 = sys::VMM_GRANULE;

/// Reservations tried before one not over host memory of this process is
/// found.
const RESERVE_TRIES: usize = 8;

/// `CUmemAllocationProp`, as `cuda.h` lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationProp {
    /// `CUmemAllocationType`.
    pub kind: i32,
    /// `CUmemAllocationHandleType` bits.
    pub requested_handle_types: i32,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only; null elsewhere.
    pub win32_handle_meta_data: usize,
    /// `compressionType`.
    pub compression_type: u8,
    /// `gpuDirectRDMACapable`.
    pub gpu_direct_rdma_capable: u8,
    /// `usage` (`CU_MEM_CREATE_USAGE_*`).
    pub usage: u16,
    /// Zero.
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessDesc {
    /// The device the access is for.
    pub location: MemLocation,
    /// `CU_MEM_ACCESS_FLAGS_PROT_*`.
    pub flags: i32,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_TYPE_PINNED: i32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_TYPE_DEVICE: i32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST`.
pub const LOCATION_TYPE_HOST: i32 = 2;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT`, the last host kind.
pub const LOCATION_TYPE_HOST_NUMA_CURRENT: i32 = 4;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: i32 = 0x1;
/// `CU_MEM_HANDLE_TYPE_WIN32` and `_WIN32_KMT`: not on Linux.
pub const HANDLE_TYPE_WIN32_ANY: i32 = 0x2 | 0x4;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
pub const HANDLE_TYPE_FABRIC: i32 = 0x8;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
pub const PROT_NONE: u32 = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const PROT_READ: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const PROT_READWRITE: u32 = 3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const GRANULARITY_MINIMUM: i32 = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const GRANULARITY_RECOMMENDED: i32 = 1;

/// A range of device addresses `cuMemAddressReserve` gave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Its size as asked (what `cuMemAddressFree` must name).
    pub size: u64,
    /// Its size on the device: whole granules.
    pub device_size: u64,
    /// The device it is a range of.
    pub device: CUdevice,
}

/// A physical allocation (`CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Physical {
    /// The device's handle for it.
    pub device_handle: u64,
    /// Its device.
    pub device: CUdevice,
    /// Bytes.
    pub size: u64,
    /// Its properties, as `cuMemGetAllocationPropertiesFromHandle` gives
    /// them back.
    pub prop: AllocationProp,
    /// References to the handle not yet released.
    pub refs: u32,
    /// Mappings of it.
    pub maps: u32,
}

/// The reservations and physical allocations of the process.
pub struct VmmTable {
    /// Reservations by first address.
    reservations: BTreeMap<u64, Reservation>,
    /// Physical allocations by handle.
    physical: HashMap<u64, Physical>,
    /// Written into exported file descriptors beside the handle: tells
    /// this process's from another's.
    token: u64,
}

impl Default for VmmTable {
    fn default() -> Self {
        VmmTable {
            reservations: BTreeMap::new(),
            physical: HashMap::new(),
            token: RandomState::new().build_hasher().finish() | 1,
        }
    }
}

impl VmmTable {
    /// The reservation containing `[addr, addr + len)`.
    pub fn reservation_at(&self, addr: u64, len: u64) -> Option<(u64, &Reservation)> {
        let (&start, r) = self.reservations.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= start.checked_add(r.size)? && addr < start + r.size).then_some((start, r))
    }

    /// Files a reservation.
    pub fn add_reservation(&mut self, addr: u64, r: Reservation) {
        self.reservations.insert(addr, r);
    }

    /// The reservation that starts at `addr` and is `size` bytes, which
    /// `cuMemAddressFree` may free.
    pub fn reservation_exact(&self, addr: u64, size: u64) -> Option<Reservation> {
        self.reservations
            .get(&addr)
            .filter(|r| r.size == size)
            .copied()
    }

    /// Forgets the reservation at `addr`.
    pub fn remove_reservation(&mut self, addr: u64) -> Option<Reservation> {
        self.reservations.remove(&addr)
    }

    /// Files physical allocation `p` under `handle`.
    pub fn add_physical(&mut self, handle: u64, p: Physical) {
        self.physical.insert(handle, p);
    }

    /// The physical allocation `handle` names, while its handle has
    /// references.
    pub fn live(&self, handle: u64) -> Option<&Physical> {
        self.physical.get(&handle).filter(|p| p.refs > 0)
    }

    /// The physical allocation `handle`, to change.
    pub fn physical_mut(&mut self, handle: u64) -> Option<&mut Physical> {
        self.physical.get_mut(&handle)
    }

    /// Takes physical allocation `handle` out once nothing refers to it
    /// any more: no reference, no mapping. The caller releases it on the
    /// device.
    pub fn collect(&mut self, handle: u64) -> Option<Physical> {
        match self.physical.get(&handle) {
            Some(p) if p.refs == 0 && p.maps == 0 => self.physical.remove(&handle),
            _ => None,
        }
    }

    /// What an exported file descriptor holds for `handle`: this table's
    /// token, then the handle, little-endian.
    pub fn export_token(&self, handle: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..].copy_from_slice(&handle.to_le_bytes());
        b
    }

    /// The live handle an exported file descriptor's bytes name, if this
    /// process exported it; `None` for another process's.
    pub fn import_token(&self, b: &[u8; 16]) -> Option<u64> {
        let (token, handle) = b.split_at(8);
        let token = u64::from_le_bytes(token.try_into().ok()?);
        let handle = u64::from_le_bytes(handle.try_into().ok()?);
        (token == self.token && self.live(handle).is_some()).then_some(handle)
    }
}

/// The vGPU of ordinal `dev`, if it offers virtual memory management:
/// `CUDA_ERROR_NOT_SUPPORTED` (said once) where it does not, as a GPU
/// without it answers.
fn vmm_gpu<'a>(d: &'a Driver, name: &'static str, dev: CUdevice) -> CuResult<&'a Gpu> {
    let g = d.gpu(dev)?;
    if !g.dev.has_vmm() {
        return Err(d.not_supported_because(name, "the vGPU offers no virtual memory management"));
    }
    g.lost.get()?;
    Ok(g)
}

/// The device a `CUmemLocation` of kind device names.
fn location_device(d: &Driver, l: &MemLocation) -> CuResult<CUdevice> {
    match l.kind {
        LOCATION_TYPE_DEVICE => {
            d.gpu(l.id)?;
            Ok(l.id)
        }
        LOCATION_TYPE_HOST..=LOCATION_TYPE_HOST_NUMA_CURRENT => Err(cu::ERROR_NOT_SUPPORTED),
        _ => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// `cuMemGetAllocationGranularity`: the device's granule, minimum and
/// recommended alike (a GPU's 2 MiB page is both there too).
pub fn granularity(prop: &AllocationProp, option: i32) -> CuResult<u64> {
    let d = driver()?;
    if option != GRANULARITY_MINIMUM && option != GRANULARITY_RECOMMENDED {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    if prop.kind != ALLOCATION_TYPE_PINNED {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let dev = location_device(d, &prop.location)?;
    vmm_gpu(d, "cuMemGetAllocationGranularity", dev)?;
    Ok(GRANULARITY)
}

/// `cuMemAddressReserve`: `size` bytes of addresses on the current
/// context's device, aligned to `align`, at `hint` if it is free there.
pub fn reserve(size: u64, align: u64, hint: u64, flags: u64) -> CuResult<u64> {
    let d = driver()?;
    let page = crate::host_pages::PAGE as u64;
    if flags != 0
        || size == 0
        || !size.is_multiple_of(page)
        || !align.is_power_of_two() && align != 0
    {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let (_, dev) = d.current_ctx()?;
    let g = vmm_gpu(d, "cuMemAddressReserve", dev)?;
    let device_size = size
        .checked_next_multiple_of(GRANULARITY)
        .ok_or(cu::ERROR_OUT_OF_MEMORY)?;
    if device_size > vgpu_guest::vgpu_abi::VMM_MAX_RESERVATION {
        // More addresses than the device gives one reservation: a GPU
        // answers what it cannot reserve so.
        return Err(cu::ERROR_OUT_OF_MEMORY);
    }
    let device_align = if align > GRANULARITY { align } else { 0 };
    // As with allocations (crate::allocs): a range over host memory of
    // this process is kept aside, so the device hands out another.
    let mut aside = Vec::new();
    let mut found = Ok(None);
    let mut want = hint;
    for _ in 0..RESERVE_TRIES {
        let addr = match check(g.dev.vmm_reserve(device_size, device_align, want)) {
            Ok(a) => a,
            Err(e) => {
                found = Err(e);
                break;
            }
        };
        if d.objects().allocs_mut().reserve(addr, device_size) {
            found = Ok(Some(addr));
            break;
        }
        log(&format!(
            "reservation at {addr:#x} ({device_size:#x} bytes) lies over host memory of this process; asking again"
        ));
        aside.push(addr);
        want = 0;
    }
    for a in aside {
        let _ = g.dev.vmm_free(a, device_size);
    }
    let addr = found?.ok_or(cu::ERROR_OUT_OF_MEMORY)?;
    d.objects().vmm_mut().add_reservation(
        addr,
        Reservation {
            size,
            device_size,
            device: dev,
        },
    );
    Ok(addr)
}

/// `cuMemAddressFree`: the reservation `cuMemAddressReserve` gave, with
/// nothing mapped in it any more.
pub fn address_free(addr: u64, size: u64) -> CuResult {
    let d = driver()?;
    let r = {
        let o = d.objects();
        let r = o
            .vmm()
            .reservation_exact(addr, size)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        if o.allocs().overlaps(addr, r.device_size) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        r
    };
    let g = d.gpu(r.device)?;
    check(g.dev.vmm_free(addr, r.device_size))?;
    let mut o = d.objects();
    o.vmm_mut().remove_reservation(addr);
    o.allocs_mut().release(addr, r.device_size);
    Ok(())
}

/// `cuMemCreate`: a physical allocation of `size` bytes on the device
/// `prop` names.
pub fn create(size: u64, prop: &AllocationProp, flags: u64) -> CuResult<u64> {
    let d = driver()?;
    if flags != 0 || prop.kind != ALLOCATION_TYPE_PINNED || prop.win32_handle_meta_data != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let types = prop.requested_handle_types;
    if types & HANDLE_TYPE_WIN32_ANY != 0
        || types & !(HANDLE_TYPE_POSIX_FD | HANDLE_TYPE_FABRIC | HANDLE_TYPE_WIN32_ANY) != 0
    {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let dev = location_device(d, &prop.location)?;
    let g = vmm_gpu(d, "cuMemCreate", dev)?;
    if types & HANDLE_TYPE_FABRIC != 0 {
        // HANDLE_TYPE_FABRIC_SUPPORTED reads 0.
        return Err(d.not_supported_because("cuMemCreate", "fabric handles"));
    }
    if size == 0 || !size.is_multiple_of(GRANULARITY) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let device_handle = check(g.dev.vmm_create(size))?;
    // What the allocation is: no compression and no GPUDirect RDMA (their
    // attributes read 0), as a GPU without them gives back.
    let kept = AllocationProp {
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        ..*prop
    };
    let mut o = d.objects();
    let handle = o.handle() as u64;
    o.vmm_mut().add_physical(
        handle,
        Physical {
            device_handle,
            device: dev,
            size,
            prop: kept,
            refs: 1,
            maps: 0,
        },
    );
    Ok(handle)
}

/// Releases `p` on the device, once nothing refers to it.
fn release_on_device(d: &Driver, p: &Physical) -> CuResult {
    check(d.gpu(p.device)?.dev.vmm_release(p.device_handle))
}

/// `cuMemRelease`: one reference to `handle` fewer; its memory goes with
/// the last reference and mapping.
pub fn release(handle: u64) -> CuResult {
    let d = driver()?;
    let gone = {
        let mut o = d.objects();
        let v = o.vmm_mut();
        let p = v
            .physical_mut(handle)
            .filter(|p| p.refs > 0)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        p.refs -= 1;
        v.collect(handle)
    };
    match gone {
        Some(p) => release_on_device(d, &p),
        None => Ok(()),
    }
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with a
/// reference more.
pub fn retain(addr: u64) -> CuResult<u64> {
    let d = driver()?;
    let mut o = d.objects();
    let handle = o
        .allocs()
        .alloc_at(addr, 0)
        .and_then(|(_, a)| a.mapping)
        .map(|m| m.handle)
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    let p = o
        .vmm_mut()
        .physical_mut(handle)
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    p.refs = p.refs.checked_add(1).ok_or(cu::ERROR_INVALID_VALUE)?;
    Ok(handle)
}

/// `cuMemGetAllocationPropertiesFromHandle`.
pub fn properties(handle: u64) -> CuResult<AllocationProp> {
    let d = driver()?;
    let o = d.objects();
    o.vmm()
        .live(handle)
        .map(|p| p.prop)
        .ok_or(cu::ERROR_INVALID_VALUE)
}

/// `cuMemMap`: `size` bytes of `handle` from `offset` at `addr`, inside
/// one reservation where nothing is mapped yet.
pub fn map(addr: u64, size: u64, offset: u64, handle: u64, flags: u64) -> CuResult {
    let d = driver()?;
    if flags != 0
        || size == 0
        || !addr.is_multiple_of(GRANULARITY)
        || !size.is_multiple_of(GRANULARITY)
        || !offset.is_multiple_of(GRANULARITY)
    {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let (p, ctx) = {
        let o = d.objects();
        let p = *o.vmm().live(handle).ok_or(cu::ERROR_INVALID_VALUE)?;
        if offset.checked_add(size).is_none_or(|end| end > p.size) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let (_, r) = o
            .vmm()
            .reservation_at(addr, size)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        if r.device != p.device {
            return Err(cu::ERROR_INVALID_DEVICE);
        }
        if o.allocs().overlaps(addr, size) {
            // Mapped already.
            return Err(cu::ERROR_INVALID_VALUE);
        }
        drop(o);
        let ctx = d.current().unwrap_or(0);
        (p, ctx)
    };
    let g = vmm_gpu(d, "cuMemMap", p.device)?;
    check(g.dev.vmm_map(addr, size, p.device_handle, offset))?;
    let mut o = d.objects();
    let (allocs, vmm) = o.allocs_and_vmm();
    if let Some(p) = vmm.physical_mut(handle) {
        p.maps += 1;
    }
    allocs.map(
        addr,
        Alloc {
            size,
            device: p.device,
            ctx,
            module: None,
            managed: false,
            mapping: Some(Mapping {
                handle,
                offset,
                access: PROT_NONE,
            }),
        },
    );
    Ok(())
}

/// `cuMemUnmap`: the whole mappings of `[addr, addr + size)`, once the
/// work that may use them is done.
pub fn unmap(addr: u64, size: u64) -> CuResult {
    let d = driver()?;
    let device = {
        let o = d.objects();
        let starts = o
            .allocs()
            .whole_mappings(addr, size)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        let devices: Vec<CUdevice> = starts
            .iter()
            .filter_map(|s| o.allocs().alloc_at(*s, 0).map(|(_, a)| a.device))
            .collect();
        match devices.split_first() {
            Some((&dv, rest)) if rest.iter().all(|&x| x == dv) => dv,
            _ => return Err(cu::ERROR_INVALID_VALUE),
        }
    };
    let g = d.gpu(device)?;
    // Synchronous, as on a GPU: queued work may still use the range.
    g.sync()?;
    check(g.dev.vmm_unmap(addr, size))?;
    let freed = {
        let mut o = d.objects();
        let (allocs, vmm) = o.allocs_and_vmm();
        let mut freed = Vec::new();
        for s in allocs.whole_mappings(addr, size).unwrap_or_default() {
            let Some(m) = allocs.unmap(s).and_then(|a| a.mapping) else {
                continue;
            };
            if let Some(p) = vmm.physical_mut(m.handle) {
                p.maps = p.maps.saturating_sub(1);
            }
            freed.extend(vmm.collect(m.handle));
        }
        freed
    };
    for p in freed {
        release_on_device(d, &p)?;
    }
    Ok(())
}

/// `cuMemSetAccess`: what each device in `desc` may do to the whole
/// mappings of `[addr, addr + size)`.
pub fn set_access(addr: u64, size: u64, desc: &[AccessDesc]) -> CuResult {
    let d = driver()?;
    if desc.is_empty() {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let (starts, device) = {
        let o = d.objects();
        let starts = o
            .allocs()
            .whole_mappings(addr, size)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        let device = o
            .allocs()
            .alloc_at(addr, 0)
            .map(|(_, a)| a.device)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        if starts
            .iter()
            .any(|s| o.allocs().alloc_at(*s, 0).map(|(_, a)| a.device) != Some(device))
        {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        (starts, device)
    };
    let mut access = None;
    for a in desc {
        let flags = u32::try_from(a.flags).map_err(|_| cu::ERROR_INVALID_VALUE)?;
        if !matches!(flags, PROT_NONE | PROT_READ | PROT_READWRITE) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        if a.location.kind != LOCATION_TYPE_DEVICE {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        d.gpu(a.location.id)?;
        if a.location.id == device {
            access = Some(flags);
        } else if flags != PROT_NONE {
            // Another vGPU cannot reach this one's memory (no peer
            // access).
            return Err(cu::ERROR_INVALID_DEVICE);
        }
    }
    let Some(access) = access else {
        return Ok(());
    };
    let g = vmm_gpu(d, "cuMemSetAccess", device)?;
    check(g.dev.vmm_access(addr, size, access))?;
    let mut o = d.objects();
    for s in starts {
        if let Some(m) = o
            .allocs_mut()
            .mapping_mut(s)
            .and_then(|a| a.mapping.as_mut())
        {
            m.access = access;
        }
    }
    Ok(())
}

/// `cuMemGetAccess`: what device `location` may do at `addr`.
pub fn get_access(location: &MemLocation, addr: u64) -> CuResult<u32> {
    let d = driver()?;
    if location.kind != LOCATION_TYPE_DEVICE {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    d.gpu(location.id)?;
    let o = d.objects();
    let (_, a) = o
        .allocs()
        .alloc_at(addr, 0)
        .filter(|(_, a)| a.mapping.is_some())
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    Ok(match a.mapping {
        Some(m) if a.device == location.id => m.access,
        _ => PROT_NONE,
    })
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor: a memory
/// file holding [`VmmTable::export_token`].
pub fn export_fd(handle: u64, kind: i32, flags: u64) -> CuResult<i32> {
    let d = driver()?;
    if flags != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let bytes = {
        let o = d.objects();
        let p = o.vmm().live(handle).ok_or(cu::ERROR_INVALID_VALUE)?;
        if kind != HANDLE_TYPE_POSIX_FD || p.prop.requested_handle_types & kind == 0 {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        o.vmm().export_token(handle)
    };
    // SAFETY: a fresh anonymous memory file; the name is NUL-terminated.
    let fd = unsafe { libc::memfd_create(c"vgpu-cuda-memory".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(cu::ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `fd` is the file just made; `bytes` is readable.
    let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // SAFETY: ours, used by nothing else.
        unsafe { libc::close(fd) };
        return Err(cu::ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor: the
/// allocation this process exported as `fd`, with a reference more.
pub fn import_fd(fd: i32, kind: i32) -> CuResult<u64> {
    let d = driver()?;
    if kind != HANDLE_TYPE_POSIX_FD {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let mut bytes = [0u8; 16];
    // SAFETY: reads at most 16 bytes into `bytes` from the caller's
    // descriptor; a bad one fails.
    let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n < 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let mut o = d.objects();
    let handle = if n == bytes.len() as isize {
        o.vmm().import_token(&bytes)
    } else {
        None
    };
    let Some(handle) = handle else {
        // Another process's memory, or not an export of this driver.
        drop(o);
        return Err(d.not_supported_because(
            "cuMemImportFromShareableHandle",
            "only allocations of this process can be imported",
        ));
    };
    if let Some(p) = o.vmm_mut().physical_mut(handle) {
        p.refs = p.refs.checked_add(1).ok_or(cu::ERROR_INVALID_VALUE)?;
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn physical(refs: u32, maps: u32) -> Physical {
        Physical {
            device_handle: 7,
            device: 0,
            size: 4 << 20,
            prop: AllocationProp {
                kind: ALLOCATION_TYPE_PINNED,
                requested_handle_types: HANDLE_TYPE_POSIX_FD,
                location: MemLocation {
                    kind: LOCATION_TYPE_DEVICE,
                    id: 0,
                },
                win32_handle_meta_data: 0,
                compression_type: 0,
                gpu_direct_rdma_capable: 0,
                usage: 0,
                reserved: [0; 4],
            },
            refs,
            maps,
        }
    }

    #[test]
    fn the_property_structures_have_cudas_layout() {
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(AllocationProp, location), 8);
        assert_eq!(
            std::mem::offset_of!(AllocationProp, win32_handle_meta_data),
            16
        );
        assert_eq!(std::mem::offset_of!(AllocationProp, compression_type), 24);
        assert_eq!(std::mem::offset_of!(AllocationProp, usage), 26);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
    }

    #[test]
    fn a_physical_allocation_lives_while_referenced_or_mapped() {
        let mut v = VmmTable::default();
        v.add_physical(0x100, physical(1, 1));
        // Referenced and mapped: stays.
        assert!(v.collect(0x100).is_none());
        v.physical_mut(0x100).unwrap().refs = 0;
        // Released but still mapped: stays, though its handle is dead.
        assert!(v.collect(0x100).is_none());
        assert!(v.live(0x100).is_none());
        v.physical_mut(0x100).unwrap().maps = 0;
        assert_eq!(v.collect(0x100).map(|p| p.device_handle), Some(7));
        assert!(v.physical_mut(0x100).is_none());
    }

    #[test]
    fn reservations_are_found_by_any_range_inside_them() {
        let mut v = VmmTable::default();
        let r = Reservation {
            size: 8 << 20,
            device_size: 8 << 20,
            device: 0,
        };
        v.add_reservation(0x4000_0000, r);
        assert!(v.reservation_at(0x4000_0000, 8 << 20).is_some());
        assert!(v.reservation_at(0x4020_0000, 2 << 20).is_some());
        assert!(v.reservation_at(0x4060_0000, 4 << 20).is_none());
        assert!(v.reservation_at(0x3fe0_0000, 4 << 20).is_none());
        assert!(v.reservation_at(u64::MAX - 1, 4).is_none());
        assert_eq!(v.reservation_exact(0x4000_0000, 8 << 20), Some(r));
        assert_eq!(v.reservation_exact(0x4000_0000, 2 << 20), None);
        assert_eq!(v.reservation_exact(0x4020_0000, 6 << 20), None);
    }

    #[test]
    fn an_export_names_a_live_handle_of_this_process_only() {
        let mut v = VmmTable::default();
        v.add_physical(0x200, physical(1, 0));
        let t = v.export_token(0x200);
        assert_eq!(v.import_token(&t), Some(0x200));
        // Another process's table has another token.
        let other = VmmTable::default();
        assert_eq!(other.import_token(&t), None);
        // A released handle is gone.
        v.physical_mut(0x200).unwrap().refs = 0;
        assert_eq!(v.import_token(&t), None);
    }
}
