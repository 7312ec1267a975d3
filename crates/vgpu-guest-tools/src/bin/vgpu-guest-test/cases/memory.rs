//! Device memory: allocation, quota, copies there and back, fills.

use std::time::{Duration, Instant};

use vgpu_guest::{errno_name, sys};

use crate::{Args, CaseResult};

use super::{expect_errno, mib, open, read_back, rng, same, words, Ctx, KIB, MIB};

pub(super) fn alloc_free(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let base = dev.usage().ctx("USAGE")?;
    let a = dev.alloc(4 * KIB).ctx("alloc 4 KiB")?;
    let b = dev.alloc(MIB).ctx("alloc 1 MiB")?;
    let c = dev
        .alloc_aligned(8 * KIB, 64 * KIB)
        .ctx("alloc 8 KiB aligned to 64 KiB")?;
    let d = dev.alloc(1).ctx("alloc 1 byte")?;
    ensure!(
        a.addr() % 256 == 0 && b.addr() % 256 == 0,
        "default alignment: {a:?} {b:?}"
    );
    ensure!(c.addr() % (64 * KIB) == 0, "64 KiB alignment: {c:?}");
    let bufs = [&a, &b, &c, &d];
    for (i, x) in bufs.iter().enumerate() {
        for y in &bufs[i + 1..] {
            ensure!(
                x.addr() + x.size() <= y.addr() || y.addr() + y.size() <= x.addr(),
                "{x:?} overlaps {y:?}"
            );
        }
    }
    let total = 4 * KIB + MIB + 8 * KIB + 1;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_mem_used == total && u.file_allocs == 4,
        "file usage {} bytes in {} allocations, expected {total} in 4",
        u.file_mem_used,
        u.file_allocs
    );
    ensure!(
        u.mem_held() >= base.mem_held() + total,
        "mem_used {} -> {}",
        base.mem_used,
        u.mem_used
    );
    // New memory reads as zero.
    let z = read_back(&dev, &b)?;
    ensure!(z.iter().all(|x| *x == 0), "a new allocation is not zeroed");
    let b_addr = b.addr();
    b.free().ctx("free")?;
    expect_errno(dev.free_raw(b_addr), libc::ENOENT, "second free")?;
    expect_errno(
        dev.free_raw(a.addr() + 256),
        libc::ENOENT,
        "free inside an allocation",
    )?;
    expect_errno(dev.free_raw(0), libc::ENOENT, "free of address 0")?;
    expect_errno(dev.alloc(0), libc::EINVAL, "alloc of 0 bytes")?;
    expect_errno(dev.alloc_aligned(64, 3), libc::EINVAL, "alignment 3")?;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_allocs == 3,
        "{} allocations after a free",
        u.file_allocs
    );
    drop((a, c, d));
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_allocs == 0 && u.file_mem_used == 0,
        "after freeing all: {} bytes in {} allocations",
        u.file_mem_used,
        u.file_allocs
    );
    ensure!(
        u.mem_held() == base.mem_held(),
        "memory held {} -> {}",
        base.mem_held(),
        u.mem_held()
    );
    Ok("alignment, zeroed memory, accounting, ENOENT/EINVAL".into())
}

pub(super) fn alloc_quota(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let mem = dev.cached_info().mem_size;
    let used0 = dev.usage().ctx("USAGE")?.mem_held();
    expect_errno(
        dev.alloc(mem + 4 * KIB),
        libc::ENOMEM,
        "alloc of more than the partition",
    )?;
    expect_errno(dev.alloc(1 << 50), libc::ENOMEM, "alloc of 1 PiB")?;
    let chunk = (mem / 16).clamp(4 * KIB, 32 * MIB);
    let mut held = Vec::new();
    let mut total = 0;
    let err = loop {
        match dev.alloc(chunk) {
            Ok(b) => {
                total += chunk;
                held.push(b);
                if held.len() > 1 << 16 {
                    return Err(format!("no ENOMEM after {} bytes", total));
                }
            }
            Err(e) => break e,
        }
    };
    ensure!(
        err.is_out_of_memory(),
        "quota exhaustion answered {err} ({}), expected ENOMEM",
        errno_name(err.errno())
    );
    let free = mem.saturating_sub(used0);
    ensure!(
        total <= free && total + chunk > free,
        "{total} bytes allocated in {} chunks before ENOMEM, {free} were free",
        held.len()
    );
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.mem_held() >= used0 + total && u.mem_used <= mem,
        "mem_used {} at exhaustion",
        u.mem_used
    );
    // The function still works when full.
    let data = rng(1).bytes(4096);
    dev.copy_to_device(&held[0], 0, &data)
        .ctx("copy while full")?;
    let mut back = vec![0u8; 4096];
    dev.copy_from_device(&held[0], 0, &mut back)
        .ctx("copy while full")?;
    same(&back, &data, "copy while full")?;
    let n = held.len();
    drop(held);
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.mem_held() == used0,
        "memory held {} after freeing, was {used0}",
        u.mem_held()
    );
    let again = dev
        .alloc(total)
        .ctx("one allocation of everything after freeing")?;
    drop(again);
    Ok(format!(
        "ENOMEM after {n} x {} = {} of {} (quota {})",
        mib(chunk),
        mib(total),
        mib(free),
        mib(mem)
    ))
}

/// Copies `size` random bytes there and back.
fn copy_round_trip(args: &Args, size: usize, tag: u64) -> CaseResult {
    let dev = open(args)?;
    let buf = dev.alloc(size as u64).ctx("alloc")?;
    let data = rng(tag).bytes(size);
    let t = Instant::now();
    dev.copy_to_device(&buf, 0, &data).ctx("copy to device")?;
    let up = t.elapsed();
    // Read into memory that holds something else, so a copy that wrote
    // nothing is caught.
    let mut back = vec![0xa5u8; size];
    let t = Instant::now();
    dev.copy_from_device(&buf, 0, &mut back)
        .ctx("copy from device")?;
    let down = t.elapsed();
    same(&back, &data, "data read back")?;
    // A range past the allocation's end is refused by the driver.
    expect_errno(
        dev.copy_to_device_addr(buf.addr() + size as u64 - 1, &[0, 0]),
        libc::ERANGE,
        "copy past the end",
    )?;
    let rate = |d: Duration| size as f64 / d.as_secs_f64().max(1e-9) / MIB as f64;
    Ok(format!(
        "{}: up {:.2} ms ({:.0} MiB/s), down {:.2} ms ({:.0} MiB/s)",
        mib(size as u64),
        up.as_secs_f64() * 1e3,
        rate(up),
        down.as_secs_f64() * 1e3,
        rate(down)
    ))
}

pub(super) fn copy_1b(args: &Args) -> CaseResult {
    copy_round_trip(args, 1, 11)
}

pub(super) fn copy_4k(args: &Args) -> CaseResult {
    copy_round_trip(args, 4096, 12)
}

pub(super) fn copy_1m(args: &Args) -> CaseResult {
    copy_round_trip(args, MIB as usize, 13)
}

/// Larger than one COPY command may be (64 MiB): split by the library.
pub(super) fn copy_large(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let size = (sys::MAX_COPY_BYTES + 3 * MIB + 5).min(dev.cached_info().mem_size / 2);
    copy_round_trip(args, size as usize, 14)
}

pub(super) fn copy_unaligned(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let size = 64 * KIB + 64;
    let buf = dev.alloc(size).ctx("alloc")?;
    let mut r = rng(15);
    // (device offset, host offset, length)
    let shapes = [
        (1u64, 3usize, 1usize),
        (3, 1, 4093),
        (4095, 7, 4097),
        (5, 0, 12345),
        (255, 13, 65536 - 300),
        (size - 1, 1, 1),
    ];
    for (dev_off, host_off, len) in shapes {
        let what = format!("device +{dev_off}, host +{host_off}, {len} bytes");
        dev.fill(&buf, 0, size, 0xa5a5_a5a5).ctx("fill")?;
        let mut host = vec![0u8; host_off + len + 8];
        r.fill_bytes(&mut host);
        let src = &host[host_off..host_off + len];
        dev.copy_to_device(&buf, dev_off, src).ctx(&what)?;
        let mut back = vec![0u8; host_off + len + 8];
        dev.copy_from_device(&buf, dev_off, &mut back[host_off..host_off + len])
            .ctx(&what)?;
        same(&back[host_off..host_off + len], src, &what)?;
        ensure!(
            back[..host_off]
                .iter()
                .chain(&back[host_off + len..])
                .all(|b| *b == 0),
            "{what}: the read wrote outside its host range"
        );
        let all = read_back(&dev, &buf)?;
        let outside = all[..dev_off as usize]
            .iter()
            .chain(&all[dev_off as usize + len..])
            .any(|b| *b != 0xa5);
        ensure!(
            !outside,
            "{what}: the write changed device bytes outside its range"
        );
    }
    Ok(format!("{} shapes, neighbours intact", shapes.len()))
}

pub(super) fn copy_device(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 300 * KIB + 3;
    let a = dev.alloc(n).ctx("alloc")?;
    let b = dev.alloc(n + 16).ctx("alloc")?;
    let data = rng(16).bytes(n as usize);
    dev.copy_to_device(&a, 0, &data).ctx("copy to device")?;
    dev.copy_device(&b, 7, &a, 0, n).ctx("device to device")?;
    let back = read_back(&dev, &b)?;
    same(&back[7..7 + n as usize], &data, "copied data")?;
    ensure!(
        back[..7]
            .iter()
            .chain(&back[7 + n as usize..])
            .all(|x| *x == 0),
        "bytes around the copy changed"
    );
    Ok(mib(n).to_string())
}

pub(super) fn fill(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let buf = dev.alloc(MIB).ctx("alloc")?;
    dev.fill(&buf, 0, MIB, 0xdead_beef).ctx("fill")?;
    let back = read_back(&dev, &buf)?;
    ensure!(
        words(&back).all(|w| w == 0xdead_beef),
        "FILL pattern not everywhere"
    );
    dev.fill(&buf, 8, 12, 0x0102_0304)
        .ctx("fill at an offset")?;
    let back = read_back(&dev, &buf)?;
    let w: Vec<u32> = words(&back[..32]).collect();
    ensure!(
        w == [
            0xdead_beef,
            0xdead_beef,
            0x0102_0304,
            0x0102_0304,
            0x0102_0304,
            0xdead_beef,
            0xdead_beef,
            0xdead_beef
        ],
        "partial fill: {w:x?}"
    );
    expect_errno(dev.fill(&buf, 0, 6, 0), libc::EINVAL, "FILL of 6 bytes")?;
    Ok("1 MiB, partial, size not a multiple of 4 refused".into())
}

/// An anonymous mapping of `len` bytes, unmapped on drop.
pub(super) struct Mapping {
    pub(super) ptr: *mut u8,
    len: usize,
}

impl Mapping {
    pub(super) fn new(len: usize) -> Result<Mapping, String> {
        // SAFETY: a fresh private anonymous mapping; nothing existing is
        // touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        ensure!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
        Ok(Mapping { ptr: p.cast(), len })
    }

    pub(super) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, and
        // borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// VGPU_IOCTL_PIN: copies inside a pinned range use its mapping (both
/// directions, at offsets inside it), copies reaching past it pin their
/// own pages; bad ranges, overlaps and unknown unpins are refused; after
/// UNPIN the memory still copies (pinned per copy again).
pub(super) fn pinned(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let len = 4 * MIB as usize;
    let mut host = Mapping::new(len + 2 * 4096)?;
    let base = host.ptr;
    rng(16).fill_bytes(host.bytes());
    let buf = dev.alloc(len as u64).ctx("alloc")?;

    expect_errno(dev.pin(base, 0), libc::EINVAL, "pin of 0 bytes")?;
    expect_errno(
        dev.pin(base.wrapping_add(1), 4096),
        libc::EINVAL,
        "pin of an unaligned address",
    )?;
    expect_errno(dev.pin(base, 4095), libc::EINVAL, "pin of a partial page")?;
    expect_errno(
        dev.pin(std::ptr::null(), 4096),
        libc::EFAULT,
        "pin of unmapped memory",
    )?;
    dev.pin(base, len).ctx("pin")?;
    expect_errno(
        dev.pin(base.wrapping_add(len - 4096), 8192),
        libc::EEXIST,
        "pin overlapping a pinned range",
    )?;

    // Inside the range, at odd offsets both ways.
    for (off, n) in [(0usize, len), (4096 + 3, 123_457), (len - 10, 10)] {
        let what = format!("pinned copy of {n} bytes at +{off}");
        let src = host.bytes()[off..off + n].to_vec();
        dev.copy_to_device(&buf, 0, &host.bytes()[off..off + n])
            .ctx(&what)?;
        host.bytes()[off..off + n].fill(0);
        dev.copy_from_device(&buf, 0, &mut host.bytes()[off..off + n])
            .ctx(&what)?;
        same(&host.bytes()[off..off + n], &src, &what)?;
    }
    // Reaching past the pinned range: pinned for the copy alone.
    let tail = 8192 + 100;
    let src = host.bytes()[len - 100..len - 100 + tail].to_vec();
    dev.copy_to_device(&buf, 0, &src)
        .ctx("copy past the range")?;
    let mut back = vec![0u8; tail];
    dev.copy_from_device(&buf, 0, &mut back)
        .ctx("copy past the range")?;
    same(&back, &src, "copy past the range")?;

    expect_errno(
        dev.unpin(base.wrapping_add(4096)),
        libc::ENOENT,
        "unpin of an address PIN was not given",
    )?;
    dev.unpin(base).ctx("unpin")?;
    expect_errno(dev.unpin(base), libc::ENOENT, "second unpin")?;
    let src = host.bytes()[..MIB as usize].to_vec();
    dev.copy_to_device(&buf, 0, &src).ctx("copy after unpin")?;
    let mut back = vec![0u8; MIB as usize];
    dev.copy_from_device(&buf, 0, &mut back)
        .ctx("copy after unpin")?;
    same(&back, &src, "copy after unpin")?;

    // Left pinned at close: the driver releases it with the file.
    dev.pin(base, len).ctx("pin again")?;
    drop(dev);
    Ok(format!(
        "{} MiB pinned once, copies in and past it",
        len >> 20
    ))
}
