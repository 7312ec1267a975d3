//! Virtual memory management through the driver (VGPU_IOCTL_VMM): a
//! file's mappings take copies across their boundary once accessible,
//! another file names none of its reservations, handles or mappings, and
//! closing the file gives its physical memory back.

use std::time::{Duration, Instant};

use vgpu_guest::{sys, vgpu_abi};

use super::*;
use crate::{Args, CaseResult};

/// MEM_USED, polled until it is at most `want` (frees on close run after
/// the file's last command), or what it is after `limit`.
fn mem_used_settles(d: &Device, want: u64, limit: Duration) -> Result<u64, String> {
    let end = Instant::now() + limit;
    loop {
        let used = d.usage().ctx("USAGE")?.mem_used;
        if used <= want || Instant::now() >= end {
            return Ok(used);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn vmm(args: &Args) -> CaseResult {
    let watch = open(args)?;
    let info = watch.cached_info();
    let has = watch.has_vmm();
    if !has {
        ensure!(
            info.features & vgpu_abi::FEATURE_VMM == 0,
            "FEATURES offers VMM ({:#x}) but INFO does not",
            info.features
        );
        expect_errno(
            watch.vmm_reserve(2 * MIB, 0, 0),
            libc::EOPNOTSUPP,
            "VMM without it",
        )?;
        return Ok("skipped: the device offers no virtual memory management".into());
    }
    let g = sys::VMM_GRANULE;
    let base = watch.usage().ctx("USAGE")?.mem_used;

    let a = open(args)?;
    let va = a.vmm_reserve(4 * g, 0, 0).ctx("reserve")?;
    ensure!(va != 0 && va % g == 0, "reservation at {va:#x}");
    let after_reserve = a.usage().ctx("USAGE")?.mem_used;
    let h0 = a.vmm_create(g).ctx("create")?;
    let h1 = a.vmm_create(g).ctx("create")?;
    let used = a.usage().ctx("USAGE")?.mem_used;
    ensure!(
        used - after_reserve == 2 * g,
        "two physical allocations cost {} bytes of MEM_USED, not {}",
        used - after_reserve,
        2 * g
    );
    a.vmm_map(va, g, h0, 0).ctx("map")?;
    a.vmm_map(va + g, g, h1, 0).ctx("map")?;
    expect_errno(
        a.vmm_map(va, g, h1, 0),
        libc::EINVAL,
        "a map over a mapping",
    )?;
    ensure!(
        a.copy_to_device_addr(va, &[1u8; 16]).is_err(),
        "a copy into a mapping without access succeeded"
    );
    a.vmm_access(va, 2 * g, sys::VMM_ACCESS_RW).ctx("access")?;

    // Across the boundary of the two mappings, and back.
    let data = rng(0x7a11).bytes(64 * KIB as usize);
    let at = va + g - 32 * KIB;
    a.copy_to_device_addr(at, &data)
        .ctx("copy in across mappings")?;
    let mut back = vec![0u8; data.len()];
    a.copy_from_device_addr(at, &mut back)
        .ctx("copy out across mappings")?;
    same(&back, &data, "across mappings")?;
    a.fill_addr(va + 2 * g - 4 * KIB, 4 * KIB, 0x5a5a_5a5a)
        .ctx("fill at the end")?;
    expect_errno(a.free_raw(va), libc::EINVAL, "FREE of a mapped address")?;
    expect_errno(
        a.copy_to_device_addr(va + 2 * g - 8, &[0u8; 16]),
        libc::ERANGE,
        "a copy past the last mapping",
    )?;

    // Another file names none of it.
    let b = open(args)?;
    let mut one = [0u8; 16];
    expect_errno(
        b.copy_from_device_addr(va, &mut one),
        libc::ENOENT,
        "B reads A's mapping",
    )?;
    expect_errno(b.vmm_unmap(va, g), libc::EINVAL, "B unmaps A's mapping")?;
    expect_errno(
        b.vmm_access(va, g, sys::VMM_ACCESS_READ),
        libc::EINVAL,
        "B sets A's access",
    )?;
    expect_errno(b.vmm_release(h0), libc::ENOENT, "B releases A's handle")?;
    expect_errno(
        b.vmm_free(va, 4 * g),
        libc::ENOENT,
        "B frees A's reservation",
    )?;
    let vb = b.vmm_reserve(2 * g, 0, 0).ctx("B's reservation")?;
    expect_errno(b.vmm_map(vb, g, h0, 0), libc::ENOENT, "B maps A's handle")?;
    let hb = b.vmm_create(g).ctx("B's allocation")?;
    expect_errno(
        b.vmm_map(va + 2 * g, g, hb, 0),
        libc::EINVAL,
        "B maps into A's reservation",
    )?;
    b.vmm_release(hb).ctx("B's release")?;
    b.vmm_free(vb, 2 * g).ctx("B's free")?;
    drop(b);

    // The second chunk moves: the same bytes at its new address.
    expect_errno(
        a.vmm_unmap(va, 3 * g),
        libc::EINVAL,
        "an unmap past the mappings",
    )?;
    a.vmm_unmap(va + g, g).ctx("unmap")?;
    a.vmm_map(va + 3 * g, g, h1, 0).ctx("map again")?;
    a.vmm_access(va + 3 * g, g, sys::VMM_ACCESS_READ)
        .ctx("read access")?;
    let mut moved = vec![0u8; 32 * KIB as usize];
    a.copy_from_device_addr(va + 3 * g, &mut moved)
        .ctx("copy out of the moved chunk")?;
    same(&moved, &data[32 * KIB as usize..], "the moved chunk")?;
    ensure!(
        a.copy_to_device_addr(va + 3 * g, &[0u8; 16]).is_err(),
        "a copy into a read-only mapping succeeded"
    );
    // A released allocation stays while mapped.
    a.vmm_release(h0).ctx("release while mapped")?;
    let mut kept = vec![0u8; 32 * KIB as usize];
    a.copy_from_device_addr(va + g - 32 * KIB, &mut kept)
        .ctx("copy after release")?;
    same(
        &kept,
        &data[..32 * KIB as usize],
        "a released, still mapped chunk",
    )?;

    // Closed with everything still there: the memory comes back.
    drop(a);
    let left = mem_used_settles(&watch, base, Duration::from_secs(5))?;
    ensure!(
        left <= base,
        "MEM_USED {left} after the file closed, {base} before it"
    );
    Ok(format!("reservation at {va:#x}, granule {g:#x}"))
}
