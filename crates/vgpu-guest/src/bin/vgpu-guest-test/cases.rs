//! The checks.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_guest::reference::{self, bytes_f32, f32_bytes, Rng};
use vgpu_guest::vgpu_abi::{
    self, CopyParams, FillParams, ReduceSumParams, SaxpyParams, SgemmParams, VaddParams,
};
use vgpu_guest::{errno_name, sys, Batch, Buffer, ByteValued, Device, Dims, Error};

use crate::proc::{self, poll_until};
use crate::{Args, Case, CaseResult};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

pub fn all() -> Vec<Case> {
    macro_rules! case {
        ($name:literal, $quick:expr, $f:path) => {
            Case {
                name: $name,
                quick: $quick,
                run: $f,
            }
        };
    }
    vec![
        case!("probe", true, probe),
        case!("info", true, info),
        case!("usage", false, usage),
        case!("alloc-free", true, alloc_free),
        case!("alloc-quota", false, alloc_quota),
        case!("copy-1b", false, copy_1b),
        case!("copy-4k", true, copy_4k),
        case!("copy-1m", false, copy_1m),
        case!("copy-unaligned", true, copy_unaligned),
        case!("copy-large", false, copy_large),
        case!("copy-device", false, copy_device),
        case!("fill", false, fill),
        case!("kernel-fill_u32", false, kernel_fill),
        case!("kernel-copy", false, kernel_copy),
        case!("kernel-vadd_f32", false, kernel_vadd),
        case!("kernel-saxpy_f32", true, kernel_saxpy),
        case!("kernel-sgemm_f32", true, kernel_sgemm),
        case!("kernel-reduce_sum_f32", false, kernel_reduce),
        case!("kernel-checks", false, kernel_checks),
        case!("batch", true, batch),
        case!("batch-errors", false, batch_errors),
        case!("module", false, module),
        case!("window", true, window),
        case!("multiprocess", false, multiprocess),
        case!("fault-isolation", false, fault_isolation),
        case!("bad-ioctl", false, bad_ioctl),
        case!("process-exit", false, process_exit),
        case!("isolation-write", false, isolation_write),
        case!("isolation-check", false, isolation_check),
    ]
}

// ---- helpers -------------------------------------------------------------------

static SEED: AtomicU64 = AtomicU64::new(1);

pub fn set_seed(seed: u64) {
    SEED.store(seed, Ordering::Relaxed);
}

/// A generator for one use, derived from the run's seed.
fn rng(tag: u64) -> Rng {
    Rng::new(SEED.load(Ordering::Relaxed) ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Adds context and the errno name to a library error.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for vgpu_guest::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e} ({})", errno_name(e.errno())))
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        match $cond {
            true => {}
            false => return Err(format!($($fmt)*)),
        }
    };
}

/// `r` must fail with `errno`.
fn expect_errno<T>(r: vgpu_guest::Result<T>, errno: i32, what: &str) -> Result<(), String> {
    match r {
        Ok(_) => Err(format!("{what}: succeeded, expected {}", errno_name(errno))),
        Err(e) if e.errno() == errno => Ok(()),
        Err(e) => Err(format!(
            "{what}: {e} ({}), expected {}",
            errno_name(e.errno()),
            errno_name(errno)
        )),
    }
}

fn open(args: &Args) -> Result<Device, String> {
    open_path(&args.device)
}

fn open_path(path: &Path) -> Result<Device, String> {
    Device::open(path).map_err(|e| format!("open {}: {e}", path.display()))
}

/// The first difference between two byte strings.
fn same(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        return Err(format!(
            "{what}: {n} byte(s) differ, first at {i:#x}: {:#04x}, expected {:#04x}",
            got[i], want[i]
        ));
    }
    Ok(())
}

fn words(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

fn read_back(dev: &Device, buf: &Buffer) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; buf.size() as usize];
    dev.copy_from_device(buf, 0, &mut out)
        .ctx("copy from device")?;
    Ok(out)
}

fn upload_f32(dev: &Device, v: &[f32]) -> Result<Buffer, String> {
    let buf = dev.alloc(v.len() as u64 * 4).ctx("alloc")?;
    dev.copy_to_device(&buf, 0, &f32_bytes(v))
        .ctx("copy to device")?;
    Ok(buf)
}

fn download_f32(dev: &Device, buf: &Buffer) -> Result<Vec<f32>, String> {
    Ok(bytes_f32(&read_back(dev, buf)?))
}

fn mib(b: u64) -> String {
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{} KiB", b / KIB)
    } else {
        format!("{b} B")
    }
}

// ---- probe and info ------------------------------------------------------------

fn sysfs_hex(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

fn probe(args: &Args) -> CaseResult {
    let list = Device::list();
    let names: Vec<String> = list.iter().map(|(_, p)| p.display().to_string()).collect();
    if let Some(n) = args.expect_devices {
        ensure!(
            list.len() == n,
            "{} vgpu device(s) ({}), expected {n}",
            list.len(),
            names.join(" ")
        );
    }
    ensure!(
        list.iter().any(|(_, p)| p == &args.device),
        "{} is not among the vgpu devices [{}]",
        args.device.display(),
        names.join(" ")
    );
    let dev = open(args)?;
    let i = dev.info().ctx("INFO")?;
    ensure!(
        i.uapi_version == sys::UAPI_VERSION,
        "uapi version {}",
        i.uapi_version
    );
    let vendor = args.expect_vendor.unwrap_or(vgpu_abi::PCI_VENDOR_ID);
    let device = args.expect_device_id.unwrap_or(vgpu_abi::PCI_DEVICE_ID);
    ensure!(
        i.vendor_id == vendor && i.device_id == device,
        "PCI id {:04x}:{:04x}, expected {vendor:04x}:{device:04x}",
        i.vendor_id,
        i.device_id
    );
    let minor = args
        .device
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vgpu"))
        .and_then(|n| n.parse::<u32>().ok());
    ensure!(
        minor.is_none_or(|m| m == i.minor),
        "INFO minor {} for {}",
        i.minor,
        args.device.display()
    );
    let bdf = format!(
        "{:04x}:{:02x}:{:02x}.{}",
        i.pci_domain,
        i.pci_bus,
        i.pci_devfn >> 3,
        i.pci_devfn & 7
    );
    // The class device's parent is the PCI function INFO names.
    let sys_dev = Path::new("/sys/class/vgpu")
        .join(format!("vgpu{}", i.minor))
        .join("device");
    let mut sysfs = String::new();
    if sys_dev.exists() {
        let v = sysfs_hex(&sys_dev.join("vendor"));
        let d = sysfs_hex(&sys_dev.join("device"));
        ensure!(
            v == Some(u64::from(i.vendor_id)) && d == Some(u64::from(i.device_id)),
            "sysfs {} says {v:x?}:{d:x?}, INFO {:04x}:{:04x}",
            sys_dev.display(),
            i.vendor_id,
            i.device_id
        );
        let link = std::fs::read_link(&sys_dev).unwrap_or_default();
        let name = link.file_name().and_then(|n| n.to_str()).unwrap_or("");
        ensure!(name == bdf, "sysfs device {name:?}, INFO location {bdf}");
        sysfs = " (sysfs agrees)".into();
    }
    Ok(format!(
        "{} {:04x}:{:04x} at {bdf}{sysfs}, {} device(s)",
        args.device.display(),
        i.vendor_id,
        i.device_id,
        list.len()
    ))
}

fn info(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let i = dev.info().ctx("INFO")?;
    ensure!(
        i.abi_version >> 16 == vgpu_abi::ABI_VERSION_MAJOR,
        "device ABI {}.{}, expected major {}",
        i.abi_version >> 16,
        i.abi_version & 0xffff,
        vgpu_abi::ABI_VERSION_MAJOR
    );
    match args.expect_mem {
        Some(m) => ensure!(i.mem_size == m, "memory {} bytes, expected {m}", i.mem_size),
        None => ensure!(i.mem_size > 0, "no device memory"),
    }
    match args.expect_cu {
        Some(c) => ensure!(
            i.compute_units == c,
            "{} compute units, expected {c}",
            i.compute_units
        ),
        None => ensure!(i.compute_units > 0, "no compute units"),
    }
    if let Some(w) = args.expect_window {
        ensure!(
            i.window_size == w,
            "window {} bytes, expected {w}",
            i.window_size
        );
    }
    let has_window = i.flags & sys::INFO_WINDOW != 0;
    ensure!(
        has_window == (i.window_size > 0),
        "flags {:#x} but window size {}",
        i.flags,
        i.window_size
    );
    ensure!(
        !has_window || i.features & vgpu_abi::FEATURE_WINDOW != 0,
        "a window without the WINDOW feature ({:#x})",
        i.features
    );
    ensure!(
        (1..=i.max_queues.max(1)).contains(&i.queues) && i.max_queues <= vgpu_abi::MAX_QUEUES,
        "queues {} of {}",
        i.queues,
        i.max_queues
    );
    ensure!(
        i.queue_size.is_power_of_two() && i.queue_size <= vgpu_abi::MAX_QUEUE_SIZE,
        "queue size {}",
        i.queue_size
    );
    ensure!(
        i.pad0 == 0 && i.reserved == [0; 4],
        "reserved fields not zero"
    );
    ensure!(
        i.flags & !(sys::INFO_POLLED | sys::INFO_MSIX | sys::INFO_WINDOW) == 0,
        "unknown flags {:#x}",
        i.flags
    );
    Ok(format!(
        "ABI {}.{}, {} memory, {} CU, window {}, {} queue(s) x {}, {}{}, features {:#x}",
        i.abi_version >> 16,
        i.abi_version & 0xffff,
        mib(i.mem_size),
        i.compute_units,
        mib(i.window_size),
        i.queues,
        i.queue_size,
        if i.flags & sys::INFO_MSIX != 0 {
            "MSI-X"
        } else {
            "INTx"
        },
        if i.flags & sys::INFO_POLLED != 0 {
            ", polled"
        } else {
            ""
        },
        i.features
    ))
}

fn usage(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let u0 = dev.usage().ctx("USAGE")?;
    ensure!(
        u0.open_files >= 1 && u0.processes >= 1,
        "open files {} processes {}",
        u0.open_files,
        u0.processes
    );
    ensure!(
        u0.file_mem_used == 0
            && u0.file_allocs == 0
            && u0.file_uncollected == 0
            && u0.file_inflight == 0,
        "a fresh file reports {u0:?}"
    );
    ensure!(u0.reserved == [0; 4], "reserved fields not zero");
    let mem = dev.cached_info().mem_size;
    ensure!(
        u0.mem_used <= mem,
        "mem_used {} > memory {mem}",
        u0.mem_used
    );
    // A second open file of this process counts as a file, not a process.
    let dev2 = open(args)?;
    let u1 = dev2.usage().ctx("USAGE")?;
    ensure!(
        u1.open_files == u0.open_files + 1 && u1.processes == u0.processes,
        "second open: files {} -> {}, processes {} -> {}",
        u0.open_files,
        u1.open_files,
        u0.processes,
        u1.processes
    );
    drop(dev2);
    let buf = dev.alloc(64 * KIB).ctx("alloc")?;
    dev.fill(&buf, 0, 64 * KIB, 1).ctx("fill")?;
    dev.synchronize().ctx("synchronize")?;
    let u2 = dev.usage().ctx("USAGE")?;
    ensure!(
        u2.commands >= u0.commands + 3,
        "commands {} -> {} after alloc, fill and nop",
        u0.commands,
        u2.commands
    );
    ensure!(u2.busy_ns >= u0.busy_ns, "busy_ns went back");
    ensure!(
        u2.file_mem_used == 64 * KIB && u2.file_allocs == 1,
        "file usage {} bytes in {} allocation(s)",
        u2.file_mem_used,
        u2.file_allocs
    );
    ensure!(
        u2.mem_used >= u0.mem_used + 64 * KIB,
        "mem_used {} -> {}",
        u0.mem_used,
        u2.mem_used
    );
    Ok(format!(
        "commands {} -> {}, busy {} ns, {} file(s), {} process(es), errors {}, recoveries {}",
        u0.commands,
        u2.commands,
        u2.busy_ns,
        u0.open_files,
        u0.processes,
        u2.device_errors,
        u2.recoveries
    ))
}

// ---- memory --------------------------------------------------------------------

fn alloc_free(args: &Args) -> CaseResult {
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
        u.mem_used >= base.mem_used + total,
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
        u.mem_used == base.mem_used,
        "mem_used {} -> {}",
        base.mem_used,
        u.mem_used
    );
    Ok("alignment, zeroed memory, accounting, ENOENT/EINVAL".into())
}

fn alloc_quota(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let mem = dev.cached_info().mem_size;
    let used0 = dev.usage().ctx("USAGE")?.mem_used;
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
        u.mem_used >= used0 + total && u.mem_used <= mem,
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
        u.mem_used == used0,
        "mem_used {} after freeing, was {used0}",
        u.mem_used
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

fn copy_1b(args: &Args) -> CaseResult {
    copy_round_trip(args, 1, 11)
}

fn copy_4k(args: &Args) -> CaseResult {
    copy_round_trip(args, 4096, 12)
}

fn copy_1m(args: &Args) -> CaseResult {
    copy_round_trip(args, MIB as usize, 13)
}

/// Larger than one COPY command may be (64 MiB): split by the library.
fn copy_large(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let size = (sys::MAX_COPY_BYTES + 3 * MIB + 5).min(dev.cached_info().mem_size / 2);
    copy_round_trip(args, size as usize, 14)
}

fn copy_unaligned(args: &Args) -> CaseResult {
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

fn copy_device(args: &Args) -> CaseResult {
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

fn fill(args: &Args) -> CaseResult {
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

// ---- kernels ---------------------------------------------------------------------

fn kernel_fill(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 100_003u64;
    let buf = dev.alloc(n * 4).ctx("alloc")?;
    let p = FillParams {
        dst: buf.addr(),
        count: n - 3,
        value: 0x1234_5678,
        reserved: 0,
    };
    let r = dev.run_kernel(&p).ctx("fill_u32")?;
    let back = read_back(&dev, &buf)?;
    for (i, w) in words(&back).enumerate() {
        let want = if (i as u64) < n - 3 { 0x1234_5678 } else { 0 };
        ensure!(w == want, "word {i}: {w:#x}, expected {want:#x}");
    }
    Ok(format!("{} words, device {} us", n - 3, r.device_ns / 1000))
}

fn kernel_copy(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 262_147u64;
    let src = dev.alloc(n).ctx("alloc")?;
    let dst = dev.alloc(n + 5).ctx("alloc")?;
    let data = rng(21).bytes(n as usize);
    dev.copy_to_device(&src, 0, &data).ctx("copy to device")?;
    let r = dev
        .run_kernel(&CopyParams {
            dst: dst.addr(),
            src: src.addr(),
            bytes: n,
        })
        .ctx("copy")?;
    let back = read_back(&dev, &dst)?;
    same(&back[..n as usize], &data, "copied bytes")?;
    ensure!(
        back[n as usize..].iter().all(|b| *b == 0),
        "bytes past the copy changed"
    );
    Ok(format!("{n} bytes, device {} us", r.device_ns / 1000))
}

fn kernel_vadd(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 65_537usize;
    let mut r = rng(22);
    let (a, b) = (r.f32s(n), r.f32s(n));
    let da = upload_f32(&dev, &a)?;
    let db = upload_f32(&dev, &b)?;
    let dc = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let res = dev
        .run_kernel(&VaddParams {
            c: dc.addr(),
            a: da.addr(),
            b: db.addr(),
            n: n as u64,
        })
        .ctx("vadd_f32")?;
    let got = download_f32(&dev, &dc)?;
    let want = reference::vadd(&a, &b);
    let (bad, worst, at) = reference::compare(&got, &want, None, 1e-6, 1e-7);
    ensure!(bad == 0, "{bad} of {n} differ, worst {worst:e} at {at}");
    Ok(format!(
        "n={n}, max error {worst:e}, device {} us",
        res.device_ns / 1000
    ))
}

fn kernel_saxpy(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 65_537usize;
    let mut r = rng(23);
    let (x, mut y) = (r.f32s(n), r.f32s(n));
    let a = 1.75f32;
    let dx = upload_f32(&dev, &x)?;
    let dy = upload_f32(&dev, &y)?;
    let res = dev
        .run_kernel(&SaxpyParams {
            y: dy.addr(),
            x: dx.addr(),
            n: n as u64,
            a,
            reserved: 0,
        })
        .ctx("saxpy_f32")?;
    let got = download_f32(&dev, &dy)?;
    reference::saxpy(a, &x, &mut y);
    let (bad, worst, at) = reference::compare(&got, &y, None, 1e-6, 1e-6);
    ensure!(bad == 0, "{bad} of {n} differ, worst {worst:e} at {at}");
    Ok(format!(
        "n={n}, max error {worst:e}, device {} us",
        res.device_ns / 1000
    ))
}

fn sgemm_check(
    dev: &Device,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    tag: u64,
) -> Result<(f64, u64), String> {
    let mut r = rng(tag);
    let (a, b, c) = (r.f32s(m * k), r.f32s(k * n), r.f32s(m * n));
    let da = upload_f32(dev, &a)?;
    let db = upload_f32(dev, &b)?;
    let dc = upload_f32(dev, &c)?;
    let res = dev
        .run_kernel(&SgemmParams {
            c: dc.addr(),
            a: da.addr(),
            b: db.addr(),
            m: m as u32,
            n: n as u32,
            k: k as u32,
            reserved: 0,
            alpha,
            beta,
        })
        .ctx("sgemm_f32")?;
    let got = download_f32(dev, &dc)?;
    let (want, scale) = reference::sgemm(m, n, k, alpha, &a, &b, beta, &c);
    let (bad, worst, at) =
        reference::compare(&got, &want, Some(&scale), 1e-5 * (k as f64).max(8.0), 1e-30);
    ensure!(
        bad == 0,
        "{m}x{n}x{k} alpha {alpha} beta {beta}: {bad} of {} differ, worst {worst:e} at ({}, {})",
        m * n,
        at / n,
        at % n
    );
    Ok((worst, res.device_ns))
}

fn kernel_sgemm(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let (w1, ns1) = sgemm_check(&dev, 37, 53, 29, 1.5, -0.5, 24)?;
    let (w2, _) = sgemm_check(&dev, 64, 64, 64, 1.0, 0.0, 25)?;
    let (w3, _) = sgemm_check(&dev, 1, 1, 1, 2.0, 1.0, 26)?;
    // beta = 0: C is not read, so NaNs in it do not leak into the result.
    let (m, n, k) = (8usize, 8usize, 8usize);
    let a = dev.alloc((m * k * 4) as u64).ctx("alloc")?;
    let b = dev.alloc((k * n * 4) as u64).ctx("alloc")?;
    let c = dev.alloc((m * n * 4) as u64).ctx("alloc")?;
    dev.fill(&a, 0, a.size(), 1.0f32.to_bits()).ctx("fill")?;
    dev.fill(&b, 0, b.size(), 0.5f32.to_bits()).ctx("fill")?;
    dev.fill(&c, 0, c.size(), 0x7fc0_0000).ctx("fill NaN")?;
    dev.run_kernel(&SgemmParams {
        c: c.addr(),
        a: a.addr(),
        b: b.addr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    })
    .ctx("sgemm_f32 beta 0")?;
    let got = download_f32(&dev, &c)?;
    ensure!(
        got.iter().all(|v| *v == 4.0),
        "beta 0 over NaN: {:?}",
        &got[..4]
    );
    Ok(format!(
        "37x53x29, 64^3, 1^3, beta 0 over NaN; max error {:e}; device {} us",
        w1.max(w2).max(w3),
        ns1 / 1000
    ))
}

fn kernel_reduce(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 100_003usize;
    let v = rng(27).f32s(n);
    let d = upload_f32(&dev, &v)?;
    let out = dev.alloc(4).ctx("alloc")?;
    let res = dev
        .run_kernel(&ReduceSumParams {
            out: out.addr(),
            input: d.addr(),
            n: n as u64,
        })
        .ctx("reduce_sum_f32")?;
    let got = f64::from(download_f32(&dev, &out)?[0]);
    let want = reference::reduce_sum(&v);
    let abs: f64 = v.iter().map(|x| f64::from(x.abs())).sum();
    let tol = 1e-3 * abs;
    ensure!(
        (got - want).abs() <= tol,
        "sum {got}, expected {want} (tolerance {tol:e})"
    );
    Ok(format!(
        "n={n}, sum {got:.4} vs {want:.4}, error {:e}, device {} us",
        (got - want).abs(),
        res.device_ns / 1000
    ))
}

/// The driver's and device's checks of built-in launches.
fn kernel_checks(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let x = dev.alloc(4096).ctx("alloc")?;
    let y = dev.alloc(4096).ctx("alloc")?;
    let ok = SaxpyParams {
        y: y.addr(),
        x: x.addr(),
        n: 1024,
        a: 1.0,
        reserved: 0,
    };
    dev.run_kernel(&ok).ctx("valid saxpy")?;
    expect_errno(
        dev.launch_builtin("no_such_kernel", &ok),
        libc::ENOENT,
        "unknown entry point",
    )?;
    expect_errno(
        dev.launch_builtin_bytes("saxpy_f32", Dims::default(), &ok.as_slice()[..24]),
        libc::EINVAL,
        "short parameter block",
    )?;
    expect_errno(
        dev.run_kernel(&SaxpyParams { n: 1025, ..ok }),
        libc::ERANGE,
        "saxpy past the end of y",
    )?;
    expect_errno(
        dev.run_kernel(&SaxpyParams { x: 0x10, ..ok }),
        libc::ENOENT,
        "saxpy on an address not allocated",
    )?;
    let freed = dev.alloc(4096).ctx("alloc")?;
    let freed_addr = freed.addr();
    drop(freed);
    expect_errno(
        dev.run_kernel(&SaxpyParams {
            y: freed_addr,
            ..ok
        }),
        libc::ENOENT,
        "saxpy on freed memory",
    )?;
    expect_errno(
        dev.run_kernel(&SgemmParams {
            c: y.addr(),
            a: x.addr(),
            b: x.addr(),
            m: 1 << 20,
            n: 1 << 20,
            k: 1,
            ..Default::default()
        }),
        libc::ERANGE,
        "sgemm larger than its buffers",
    )?;
    // Launch shapes are checked by the device: the command fails.
    let bad_shapes = [
        Dims {
            grid: [0, 1, 1],
            ..Dims::default()
        },
        Dims {
            block: [2048, 1, 1],
            ..Dims::default()
        },
        Dims {
            grid: [1, 70_000, 1],
            ..Dims::default()
        },
    ];
    for d in bad_shapes {
        match dev.launch_builtin_dims("saxpy_f32", d, &ok) {
            Err(Error::Command { status, source, .. }) => ensure!(
                status == sys::CMD_STATUS_INVALID && source.errno() == libc::EINVAL,
                "shape {d:?}: status {status}, {source}"
            ),
            other => {
                return Err(format!(
                    "shape {d:?}: {other:?}, expected a failed command (INVALID)"
                ))
            }
        }
    }
    // An entry name without its NUL.
    let mut args_l = sys::VgpuLaunchArgs {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        ..Default::default()
    };
    args_l.entry = [b'a'; 32];
    let mut cmd = [sys::VgpuCmd::launch(args_l)];
    // SAFETY: the command has no user pointers (no parameter block).
    let r = unsafe { dev.run_raw(&mut cmd) };
    expect_errno(r, libc::EINVAL, "entry name without NUL")?;
    dev.run_kernel(&ok).ctx("saxpy after the failures")?;
    Ok("ENOENT entry/address, EINVAL params/name, ERANGE ranges, INVALID shapes".into())
}

// ---- batches -----------------------------------------------------------------

fn batch(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let has_ts = dev.cached_info().features & vgpu_abi::FEATURE_TIMESTAMP != 0;
    let n = 4096usize;
    let a = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let b = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let x = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let mut r = rng(31);
    let xs = r.f32s(n);
    let mut b1 = Batch::new();
    let t0 = if has_ts { Some(b1.timestamp()) } else { None };
    b1.fill(&a, 0, n as u64 * 4, 2.0f32.to_bits())
        .copy_to_device(&x, 0, &f32_bytes(&xs))
        .copy_device(&b, 0, &a, 0, n as u64 * 4)
        .run_kernel(&SaxpyParams {
            y: b.addr(),
            x: x.addr(),
            n: n as u64,
            a: 3.0,
            reserved: 0,
        })
        .nop()
        .fence(true);
    let slot = b1.copy_from_device(&b, 0, n * 4);
    let t1 = if has_ts { Some(b1.timestamp()) } else { None };
    let count = b1.len();
    let mut p = dev.submit(b1).ctx("submit")?;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected >= 1 || p.is_collected(),
        "submitted batch not counted as uncollected"
    );
    let done = p.wait(Some(Duration::from_secs(30))).ctx("wait")?;
    done.check().ctx("batch")?;
    let got = bytes_f32(done.read(slot));
    for (i, (g, xv)) in got.iter().zip(&xs).enumerate() {
        let want = 3.0 * xv + 2.0;
        ensure!(
            (g - want).abs() <= 1e-6 * want.abs().max(1.0),
            "element {i}: {g}, expected {want}"
        );
    }
    let mut ts = String::new();
    if let (Some(i0), Some(i1)) = (t0, t1) {
        let (c0, c1) = (
            done.result(i0).unwrap_or_default().result,
            done.result(i1).unwrap_or_default().result,
        );
        ensure!(c1 >= c0, "TIMESTAMP went back: {c0} then {c1}");
        ts = format!(", timestamps {} ns apart", c1 - c0);
    }
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected == 0,
        "{} uncollected after wait",
        u.file_uncollected
    );

    // Several batches in flight, collected in reverse order.
    let mut pend = Vec::new();
    for i in 0..8u32 {
        let mut bt = Batch::new();
        bt.fill(&a, u64::from(i) * 16, 16, i);
        pend.push(dev.submit(bt).ctx("submit")?);
    }
    let fences: Vec<u64> = pend.iter().map(|p| p.fence()).collect();
    ensure!(
        fences.windows(2).all(|w| w[1] == w[0] + 1),
        "fences {fences:?}"
    );
    for p in pend.iter_mut().rev() {
        p.wait(Some(Duration::from_secs(30)))
            .ctx("wait")?
            .check()
            .ctx("batch")?;
    }
    let back = read_back(&dev, &a)?;
    for i in 0..8u32 {
        let w: Vec<u32> = words(&back[i as usize * 16..i as usize * 16 + 16]).collect();
        ensure!(w == [i; 4], "batch {i} wrote {w:?}");
    }
    // Polling: a zero timeout either collects or times out, never blocks.
    let big = 256u32;
    let ma = dev.alloc(u64::from(big * big) * 4).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.run_kernel(&SgemmParams {
        c: ma.addr(),
        a: ma.addr(),
        b: ma.addr(),
        m: big,
        n: big,
        k: big,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    });
    let mut p = dev.submit(bt).ctx("submit")?;
    let polled = match p.wait(Some(Duration::ZERO)) {
        Ok(d) => {
            d.check().ctx("sgemm")?;
            "done at once"
        }
        Err(Error::TimedOut) => {
            p.wait(None).ctx("wait")?.check().ctx("sgemm")?;
            "timed out, then done"
        }
        Err(e) => return Err(format!("poll: {e}")),
    };
    // A dropped Pending waits for its batch.
    let mut bt = Batch::new();
    let s2 = bt.copy_from_device(&b, 0, 16);
    let _ = s2;
    drop(dev.submit(bt).ctx("submit")?);
    dev.synchronize().ctx("synchronize")?;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected == 0 && u.file_inflight == 0,
        "left over: {u:?}"
    );
    Ok(format!(
        "{count} commands in one batch{ts}; 8 in flight collected in reverse; poll: {polled}"
    ))
}

fn batch_errors(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let a = dev.alloc(4096).ctx("alloc")?;
    let b = dev.alloc(4096).ctx("alloc")?;
    // A failing command in the middle does not stop the ones after it.
    let mut bt = Batch::new();
    bt.fill(&a, 0, 4096, 7)
        .launch_builtin_dims(
            "fill_u32",
            Dims {
                grid: [0, 1, 1],
                ..Dims::default()
            },
            &FillParams {
                dst: a.addr(),
                count: 1,
                value: 0,
                reserved: 0,
            },
        )
        .fill(&b, 0, 4096, 9);
    let mut p = dev.submit(bt).ctx("submit")?;
    let done = p.wait(None).ctx("wait")?;
    let res = done.results();
    ensure!(
        res[0].status == 0
            && res[1].status == sys::CMD_STATUS_INVALID
            && res[1].error == -libc::EINVAL
            && res[2].status == 0,
        "results {res:?}"
    );
    match done.check() {
        Err(Error::Command { index: 1, .. }) => {}
        other => return Err(format!("check: {other:?}, expected command 1 failed")),
    }
    ensure!(
        words(&read_back(&dev, &b)?).all(|w| w == 9),
        "the command after the failure did not run"
    );
    // A refused batch queues nothing.
    let c = dev.alloc(4096).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.fill(&c, 0, 4096, 5)
        .nop()
        .copy_device_addr(a.addr(), 0x40, 16);
    match dev.submit(bt) {
        Err(Error::Rejected { index: 2, source }) if source.errno() == libc::ENOENT => {}
        other => {
            return Err(format!(
                "refused batch: {other:?}, expected command 2 refused with ENOENT"
            ))
        }
    }
    ensure!(
        read_back(&dev, &c)?.iter().all(|x| *x == 0),
        "a refused batch ran its first command"
    );
    // A builder error is reported at submit.
    let mut bt = Batch::new();
    bt.fill(&c, 4000, 200, 1);
    expect_errno(dev.submit(bt), libc::ERANGE, "fill outside the buffer")?;
    // Wait on a collected batch.
    let mut bt = Batch::new();
    bt.nop();
    let mut p = dev.submit(bt).ctx("submit")?;
    p.wait(None).ctx("wait")?;
    ensure!(
        p.wait(None).is_err(),
        "second wait on a collected batch succeeded"
    );
    // A full batch of 256 commands.
    let mut bt = Batch::new();
    for i in 0..sys::MAX_BATCH_CMDS {
        bt.fill(&c, u64::from(i % 1024) * 4, 4, i);
    }
    dev.run(bt).ctx("256 commands")?;
    Ok("failed command does not stop the batch; refused batch queues nothing; 256 commands".into())
}

fn module(args: &Args) -> CaseResult {
    const PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\n.visible .entry vgpu_nop()\n{\n\tret;\n}\n";
    let dev = open(args)?;
    expect_errno(
        {
            let mut cmd = [sys::VgpuCmd::module_unload(0x1234)];
            // SAFETY: MODULE_UNLOAD has no user pointers.
            unsafe { dev.run_raw(&mut cmd) }
        },
        libc::ENOENT,
        "unload of a module never loaded",
    )?;
    expect_errno(
        {
            let mut cmd = [sys::VgpuCmd::module_unload(sys::MODULE_BUILTIN_ID)];
            // SAFETY: MODULE_UNLOAD has no user pointers.
            unsafe { dev.run_raw(&mut cmd) }
        },
        libc::EINVAL,
        "unload of the built-in module",
    )?;
    let launch_unknown = {
        let mut cmd = [sys::VgpuCmd::launch(sys::VgpuLaunchArgs {
            module: 777,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            entry: sys::entry_name("vgpu_nop").unwrap_or_default(),
            ..Default::default()
        })];
        // SAFETY: no parameter block, no user pointers.
        unsafe { dev.run_raw(&mut cmd) }
    };
    expect_errno(
        launch_unknown,
        libc::ENOENT,
        "launch of a module never loaded",
    )?;
    match dev.module_load(PTX.as_bytes()) {
        Ok(m) => {
            let u = dev.usage().ctx("USAGE")?;
            ensure!(
                u.file_modules == 1,
                "{} modules after a load",
                u.file_modules
            );
            dev.launch(&m, "vgpu_nop", Dims::default(), &[])
                .ctx("launch of the loaded module")?;
            let h = m.handle();
            drop(m);
            let u = dev.usage().ctx("USAGE")?;
            ensure!(
                u.file_modules == 0,
                "{} modules after unload",
                u.file_modules
            );
            Ok(format!("loaded (handle {h:#x}), launched, unloaded"))
        }
        Err(e) if e.errno() == libc::EOPNOTSUPP => Ok(
            "this backend does not run loaded modules (EOPNOTSUPP); unknown handles refused".into(),
        ),
        Err(e) => Err(format!("MODULE_LOAD: {e} ({})", errno_name(e.errno()))),
    }
}

// ---- window ------------------------------------------------------------------

fn window(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let wsize = dev.cached_info().window_size;
    if wsize == 0 {
        ensure!(
            args.expect_window.unwrap_or(0) == 0,
            "no window, expected one"
        );
        expect_errno(
            dev.map_window_range(0, 4096),
            libc::ENODEV,
            "mmap without a window",
        )?;
        return Ok("no window; mmap refused with ENODEV".into());
    }
    let w = dev.map_window().ctx("mmap")?;
    ensure!(w.len() as u64 == wsize, "mapped {} of {wsize}", w.len());
    let n = (64 * KIB).min(wsize) as usize;
    let pattern = rng(41).bytes(n);
    w.write(0, &pattern).ctx("write")?;
    let mut back = vec![0u8; n];
    w.read(0, &mut back).ctx("read")?;
    same(&back, &pattern, "window read back")?;
    // Last word of the window.
    let last = wsize as usize - 4;
    w.write_u32(last, 0xfeed_f00d).ctx("write")?;
    ensure!(w.read_u32(last).ctx("read")? == 0xfeed_f00d, "last word");
    // A second mapping of one page aliases the first.
    if wsize >= 8192 {
        let w2 = dev.map_window_range(4096, 4096).ctx("mmap of page 1")?;
        let mut p1 = vec![0u8; 4096];
        w2.read(0, &mut p1).ctx("read")?;
        same(&p1, &pattern[4096..8192.min(n)], "second mapping")?;
    }
    // window -> device -> host.
    let buf = dev.alloc(n as u64 + 4096).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.copy_window_to_device(&buf, 4096, 0, n as u64);
    let slot = bt.copy_from_device(&buf, 4096, n);
    let done = dev.run(bt).ctx("window to device")?;
    same(done.read(slot), &pattern, "window copied to the device")?;
    // device -> window, seen through the mapping.
    let other = rng(42).bytes(4096);
    dev.copy_to_device(&buf, 0, &other).ctx("copy")?;
    let off = if wsize >= 3 * 4096 { 8192 } else { 0 };
    let mut bt = Batch::new();
    bt.copy_device_to_window(off as u64, &buf, 0, 4096);
    dev.run(bt).ctx("device to window")?;
    let mut seen = vec![0u8; 4096];
    w.read(off, &mut seen).ctx("read")?;
    same(&seen, &other, "device data in the window")?;
    // Another process sees the same window.
    let dev_path = args.device.clone();
    let mut child = proc::spawn(move |link| {
        let d = open_path(&dev_path)?;
        let cw = d.map_window().ctx("child mmap")?;
        let word = cw.read_u32(last).ctx("child read")?;
        cw.write_u32(last, !word).ctx("child write")?;
        link.send(&format!("{word:#x}"))?;
        Ok(String::new())
    })?;
    let seen_by_child = child.link().expect()?;
    child.join()?;
    ensure!(seen_by_child == "0xfeedf00d", "child read {seen_by_child}");
    ensure!(
        w.read_u32(last).ctx("read")? == !0xfeed_f00d,
        "child's write not seen"
    );
    // Refusals.
    expect_errno(
        dev.map_window_range(wsize, 4096),
        libc::EINVAL,
        "mmap past the window",
    )?;
    expect_errno(
        dev.map_window_range(0, wsize + 4096),
        libc::EINVAL,
        "mmap larger than the window",
    )?;
    // SAFETY: a new private mapping request chosen by the kernel; it is
    // expected to fail, and unmapped below if it does not.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            dev.as_raw_fd(),
            0,
        )
    };
    if p != libc::MAP_FAILED {
        // SAFETY: the mapping just created, 4096 bytes.
        unsafe { libc::munmap(p, 4096) };
        return Err("MAP_PRIVATE mapping accepted".into());
    }
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    ensure!(
        e == libc::EINVAL,
        "MAP_PRIVATE: {}, expected EINVAL",
        errno_name(e)
    );
    let mut bt = Batch::new();
    bt.copy_device_to_window(wsize - 4, &buf, 0, 8);
    expect_errno(dev.submit(bt), libc::ERANGE, "copy past the window")?;
    // Leave the window as it was found (zeroed).
    w.write(0, &vec![0u8; n]).ctx("clear")?;
    w.write(off, &[0u8; 4096]).ctx("clear")?;
    w.write_u32(last, 0).ctx("clear")?;
    Ok(format!(
        "{} window: mmap read/write, aliasing, window<->device copies, shared with a child, refusals",
        mib(wsize)
    ))
}

// ---- processes ---------------------------------------------------------------

/// Copies and kernels on a fresh file, checked against the CPU; returns
/// the number of checks done.
fn worker_round(dev: &Device, r: &mut Rng, n: usize) -> Result<(), String> {
    let x = r.f32s(n);
    let mut y = r.f32s(n);
    let a = r.next_f32() * 4.0;
    let dx = upload_f32(dev, &x)?;
    let dy = upload_f32(dev, &y)?;
    let dz = dev.alloc(n as u64 * 4).ctx("alloc")?;
    dev.run_kernel(&VaddParams {
        c: dz.addr(),
        a: dx.addr(),
        b: dy.addr(),
        n: n as u64,
    })
    .ctx("vadd")?;
    dev.run_kernel(&SaxpyParams {
        y: dy.addr(),
        x: dx.addr(),
        n: n as u64,
        a,
        reserved: 0,
    })
    .ctx("saxpy")?;
    let z = download_f32(dev, &dz)?;
    let (bad, worst, _) = reference::compare(&z, &reference::vadd(&x, &y), None, 1e-6, 1e-7);
    ensure!(bad == 0, "vadd: {bad} differ (worst {worst:e})");
    reference::saxpy(a, &x, &mut y);
    let got = download_f32(dev, &dy)?;
    let (bad, worst, _) = reference::compare(&got, &y, None, 1e-6, 1e-6);
    ensure!(bad == 0, "saxpy: {bad} differ (worst {worst:e})");
    let bytes = r.bytes(n * 4 + 3);
    let raw = dev.alloc(bytes.len() as u64).ctx("alloc")?;
    dev.copy_to_device(&raw, 0, &bytes).ctx("copy")?;
    same(&read_back(dev, &raw)?, &bytes, "copy")?;
    Ok(())
}

fn multiprocess(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let base = dev.usage().ctx("USAGE")?;
    let procs = args.procs.max(1);
    let rounds = 3;
    let mut kids = Vec::new();
    for i in 0..procs {
        let path = args.device.clone();
        kids.push(proc::spawn(move |link| {
            let d = open_path(&path)?;
            link.send("ready")?;
            ensure!(link.expect()? == "go", "no go");
            let mut r = rng(100 + i as u64);
            for round in 0..rounds {
                worker_round(&d, &mut r, 16_384 + i * 1000 + round)
                    .map_err(|e| format!("round {round}: {e}"))?;
            }
            Ok(String::new())
        })?);
    }
    for k in &mut kids {
        let m = k.link().expect()?;
        ensure!(m == "ready", "child said {m:?}");
    }
    let u = dev.usage().ctx("USAGE")?;
    let files = u.open_files;
    let seen = u.processes;
    for k in &mut kids {
        k.link().send("go")?;
    }
    let mut errors = Vec::new();
    for (i, k) in kids.into_iter().enumerate() {
        if let Err(e) = k.join() {
            errors.push(format!("child {i}: {e}"));
        }
    }
    ensure!(errors.is_empty(), "{}", errors.join("; "));
    ensure!(
        seen == base.processes + procs as u32 && files == base.open_files + procs as u32,
        "with {procs} children open: {seen} processes and {files} files (before: {} and {})",
        base.processes,
        base.open_files
    );
    let u = poll_until(Duration::from_secs(10), || {
        let u = dev.usage().ok()?;
        (u.open_files == base.open_files && u.mem_used == base.mem_used).then_some(u)
    });
    ensure!(u.is_some(), "files or memory of the children not released");
    Ok(format!(
        "{procs} processes x {rounds} rounds of copies, vadd and saxpy; {seen} processes seen"
    ))
}

/// One process's commands that fail (refused, or failed by the device)
/// leave another process, working at the same time, unharmed.
fn fault_isolation(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let before = dev.usage().ctx("USAGE")?;
    let path = args.device.clone();
    let mut victim = proc::spawn(move |link| {
        let d = open_path(&path)?;
        let secret = d.alloc(MIB).ctx("alloc")?;
        let pattern = rng(51).bytes(MIB as usize);
        d.copy_to_device(&secret, 0, &pattern).ctx("copy")?;
        link.send(&format!("{:#x}", secret.addr()))?;
        let mut r = rng(52);
        let mut rounds = 0;
        // Work until the parent is done misbehaving.
        loop {
            worker_round(&d, &mut r, 8192).map_err(|e| format!("round {rounds}: {e}"))?;
            rounds += 1;
            if link.ready() {
                break;
            }
        }
        ensure!(link.expect()? == "stop", "unexpected message");
        same(&read_back(&d, &secret)?, &pattern, "victim's memory")?;
        Ok(format!("{rounds}"))
    })?;
    let addr_s = victim.link().expect()?;
    let vaddr = u64::from_str_radix(addr_s.trim_start_matches("0x"), 16)
        .map_err(|e| format!("{addr_s:?}: {e}"))?;
    let own = dev.alloc(MIB).ctx("alloc")?;
    let junk = vec![0x5au8; 4096];
    let mut out = vec![0u8; 4096];
    let mut checks = Vec::new();
    let mut check = |r: vgpu_guest::Result<()>, errno: i32, what: &str| -> Result<(), String> {
        checks.push(what.to_string());
        expect_errno(r, errno, what)
    };
    check(
        dev.copy_to_device_addr(vaddr, &junk),
        libc::ENOENT,
        "copy into another process's memory",
    )?;
    check(
        dev.copy_from_device_addr(vaddr, &mut out),
        libc::ENOENT,
        "copy from another process's memory",
    )?;
    let mut bt = Batch::new();
    bt.fill_addr(vaddr, 4096, 0);
    check(
        dev.submit(bt).map(drop),
        libc::ENOENT,
        "fill of another process's memory",
    )?;
    check(
        dev.run_kernel(&FillParams {
            dst: vaddr,
            count: 16,
            value: 0,
            reserved: 0,
        })
        .map(drop),
        libc::ENOENT,
        "fill_u32 on another process's memory",
    )?;
    check(
        dev.run_kernel(&CopyParams {
            dst: own.addr(),
            src: vaddr,
            bytes: 4096,
        })
        .map(drop),
        libc::ENOENT,
        "copy kernel reading another process's memory",
    )?;
    let mut bt = Batch::new();
    bt.copy_device_addr(own.addr(), vaddr, 16);
    check(
        dev.submit(bt).map(drop),
        libc::ENOENT,
        "device copy from another process's memory",
    )?;
    // A user address that is not mapped: the driver cannot pin it.
    let mut cmd = [sys::VgpuCmd::copy(sys::VgpuCopyArgs {
        src_kind: sys::MEM_USER,
        dst_kind: sys::MEM_DEVICE,
        src: 0x1000,
        dst: own.addr(),
        size: 4096,
    })];
    // SAFETY: the user side is an unmapped address the driver cannot pin;
    // nothing of this process is read or written.
    let r = unsafe { dev.run_raw(&mut cmd) };
    check(r, libc::EFAULT, "copy from an unmapped user address")?;
    // Commands the device fails.
    for shape in [[0u32, 1, 1], [1, 1, 0]] {
        let r = dev.launch_builtin_dims(
            "fill_u32",
            Dims {
                grid: shape,
                ..Dims::default()
            },
            &FillParams {
                dst: own.addr(),
                count: 16,
                value: 1,
                reserved: 0,
            },
        );
        check(r.map(drop), libc::EINVAL, "launch with a zero dimension")?;
    }
    // This process still works too.
    let data = rng(53).bytes(4096);
    dev.copy_to_device(&own, 0, &data)
        .ctx("copy after the faults")?;
    dev.copy_from_device(&own, 0, &mut out)
        .ctx("copy after the faults")?;
    same(&out, &data, "own data after the faults")?;
    victim.link().send("stop")?;
    let rounds = victim.join().map_err(|e| format!("victim: {e}"))?;
    let after = dev.usage().ctx("USAGE")?;
    ensure!(
        after.recoveries == before.recoveries,
        "the driver recovered {} time(s)",
        after.recoveries - before.recoveries
    );
    Ok(format!(
        "{} refusals/failures; victim did {rounds} round(s) meanwhile and kept its data; no recovery needed",
        checks.len()
    ))
}

/// A pointer to `x` for an ioctl argument.
fn ptr<T>(x: &mut T) -> *mut libc::c_void {
    x as *mut T as *mut libc::c_void
}

/// Driver ioctl argument checks.
fn bad_ioctl(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let mut big = vec![0u64; 64];
    let bigp = big.as_mut_ptr() as *mut libc::c_void;
    let bad_ptr = 8usize as *mut libc::c_void;
    let magic = sys::IOCTL_MAGIC;
    let ioc = sys::ioc;
    let raw = |req: u64, p: *mut libc::c_void| {
        // SAFETY: used only in this function, where the argument is
        // `big` (512 writable bytes, more than any size these requests
        // encode), a live local structure of the request's type whose
        // pointers are valid or rejected before use, NULL, or an unmapped
        // address in the first page, which the kernel's uaccess helpers
        // reject without touching this process's memory.
        unsafe { dev.ioctl_raw(req, p) }
    };
    let mut n = 0;
    let mut check = |r: vgpu_guest::Result<()>, errno: i32, what: &str| {
        n += 1;
        expect_errno(r, errno, what)
    };
    check(
        raw(ioc(sys::IOC_READ, magic, 0xbf, 8), bigp),
        libc::ENOTTY,
        "unknown number",
    )?;
    check(
        raw(ioc(sys::IOC_READ, magic, 0x01, 8), bigp),
        libc::ENOTTY,
        "number below ours",
    )?;
    check(
        raw(ioc(sys::IOC_READ, b'W', 0xa0, 104), bigp),
        libc::ENOTTY,
        "other magic",
    )?;
    check(raw(0, bigp), libc::ENOTTY, "ioctl 0")?;
    check(
        raw(ioc(sys::IOC_READ, magic, 0xa0, 8), bigp),
        libc::EINVAL,
        "INFO with the wrong size",
    )?;
    check(
        raw(ioc(sys::IOC_WRITE, magic, 0xa0, 104), bigp),
        libc::EINVAL,
        "INFO with the wrong direction",
    )?;
    check(
        raw(ioc(sys::IOC_READ | sys::IOC_WRITE, magic, 0xa3, 48), bigp),
        libc::EINVAL,
        "SUBMIT with the wrong size",
    )?;
    check(
        raw(sys::IOCTL_INFO, bad_ptr),
        libc::EFAULT,
        "INFO to a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_USAGE, std::ptr::null_mut()),
        libc::EFAULT,
        "USAGE to NULL",
    )?;
    check(
        raw(sys::IOCTL_ALLOC, bad_ptr),
        libc::EFAULT,
        "ALLOC from a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_SUBMIT, bad_ptr),
        libc::EFAULT,
        "SUBMIT from a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_WAIT, bad_ptr),
        libc::EFAULT,
        "WAIT from a bad pointer",
    )?;
    // Structures with bad fields.
    let mut alloc = sys::VgpuAlloc {
        size: 4096,
        flags: 1,
        ..Default::default()
    };
    check(
        raw(sys::IOCTL_ALLOC, ptr(&mut alloc)),
        libc::EINVAL,
        "ALLOC with flags",
    )?;
    alloc.flags = 0;
    alloc.pad = 1;
    check(
        raw(sys::IOCTL_ALLOC, ptr(&mut alloc)),
        libc::EINVAL,
        "ALLOC with padding set",
    )?;
    let mut cmds = [sys::VgpuCmd::bare(sys::CMD_NOP, 0); 2];
    let mut submit = sys::VgpuSubmit {
        cmds: cmds.as_mut_ptr() as u64,
        count: 0,
        ..Default::default()
    };
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EINVAL,
        "SUBMIT of 0 commands",
    )?;
    submit.count = sys::MAX_BATCH_CMDS + 1;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::E2BIG,
        "SUBMIT of 257 commands",
    )?;
    submit.count = 1;
    submit.flags = 0x80;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EINVAL,
        "SUBMIT with unknown flags",
    )?;
    submit.flags = 0;
    submit.cmds = 0x10;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EFAULT,
        "SUBMIT of an unreadable command array",
    )?;
    let mut bad_cmd = |cmd: sys::VgpuCmd, errno: i32, what: &str| {
        let mut c = [cmd];
        // SAFETY: none of these commands has user pointers.
        check(unsafe { dev.run_raw(&mut c) }, errno, what)
    };
    let mut nop = sys::VgpuCmd::bare(sys::CMD_NOP, 0);
    nop.args.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    bad_cmd(nop, libc::EINVAL, "NOP with argument bytes set")?;
    bad_cmd(
        sys::VgpuCmd::bare(sys::CMD_NOP, 1),
        libc::EINVAL,
        "NOP with flags",
    )?;
    bad_cmd(
        sys::VgpuCmd::bare(2, 0),
        libc::EINVAL,
        "opcode 2 (MEM_ALLOC) in a batch",
    )?;
    bad_cmd(sys::VgpuCmd::bare(99, 0), libc::EINVAL, "opcode 99")?;
    bad_cmd(
        sys::VgpuCmd::bare(sys::CMD_FENCE, 2),
        libc::EINVAL,
        "FENCE with an unknown flag",
    )?;
    bad_cmd(
        sys::VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: sys::MEM_USER,
            dst_kind: sys::MEM_USER,
            src: 0,
            dst: 0,
            size: 4,
        }),
        libc::EINVAL,
        "COPY user to user",
    )?;
    bad_cmd(
        sys::VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: 7,
            dst_kind: sys::MEM_DEVICE,
            src: 0,
            dst: 0,
            size: 4,
        }),
        libc::EINVAL,
        "COPY of an unknown memory kind",
    )?;
    // WAIT checks.
    let mut wait = sys::VgpuWait::default();
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT of fence 0",
    )?;
    wait.fence = 1 << 40;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT of a fence never issued",
    )?;
    wait.fence = 1;
    wait.count = 1;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT with a count and no array",
    )?;
    wait.count = 0;
    wait.flags = 4;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT with unknown flags",
    )?;
    // Still fine afterwards.
    dev.synchronize().ctx("synchronize after the bad calls")?;
    let _ = &mut big;
    Ok(format!(
        "{n} bad calls refused (ENOTTY, EINVAL, EFAULT, E2BIG)"
    ))
}

/// Memory of a process that exits, or is killed with work queued, is
/// freed by the driver.
fn process_exit(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let base = dev.usage().ctx("USAGE")?;
    let size = (dev.cached_info().mem_size / 8).clamp(4 * KIB, 64 * MIB);
    // Exits without freeing.
    let path = args.device.clone();
    let child = proc::spawn(move |_| {
        let d = open_path(&path)?;
        let b = d.alloc(size).ctx("alloc")?;
        d.fill(&b, 0, size, 0x1111_1111).ctx("fill")?;
        let _ = b.into_raw();
        Ok(String::new())
    })?;
    child.join()?;
    let freed = poll_until(Duration::from_secs(10), || {
        let u = dev.usage().ok()?;
        (u.mem_used == base.mem_used && u.open_files == base.open_files).then_some(())
    });
    ensure!(freed.is_some(), "memory of an exited process not freed");
    // Killed with work queued.
    let path = args.device.clone();
    let mut child = proc::spawn(move |link| {
        let d = open_path(&path)?;
        let b = d.alloc(size).ctx("alloc")?;
        let m = 512u32;
        let mat = d.alloc(u64::from(m * m) * 4).ctx("alloc")?;
        let mut pend = Vec::new();
        for _ in 0..4 {
            let mut bt = Batch::new();
            bt.fill(&b, 0, size, 0x2222_2222).run_kernel(&SgemmParams {
                c: mat.addr(),
                a: mat.addr(),
                b: mat.addr(),
                m,
                n: m,
                k: m,
                reserved: 0,
                alpha: 1.0,
                beta: 0.0,
            });
            pend.push(d.submit(bt).ctx("submit")?);
        }
        link.send("queued")?;
        std::thread::sleep(Duration::from_secs(60));
        std::mem::forget(pend);
        Ok(String::new())
    })?;
    ensure!(
        child.link().expect()? == "queued",
        "child did not queue work"
    );
    let during = dev.usage().ctx("USAGE")?;
    child.kill();
    let status = child.reap_killed()?;
    ensure!(
        libc::WIFSIGNALED(status),
        "child not killed (status {status:#x})"
    );
    let freed = poll_until(Duration::from_secs(30), || {
        let u = dev.usage().ok()?;
        (u.mem_used == base.mem_used && u.open_files == base.open_files).then_some(u)
    });
    ensure!(
        freed.is_some(),
        "memory of a killed process not freed (mem_used {} -> {})",
        base.mem_used,
        dev.usage().map(|u| u.mem_used).unwrap_or(0)
    );
    // The function still works.
    let b = dev.alloc(size).ctx("alloc after the kill")?;
    let head = read_back(&dev, &b)?;
    ensure!(
        head.iter().all(|x| *x == 0),
        "memory of the killed process reached a new allocation"
    );
    Ok(format!(
        "{} freed after exit; {} and queued work freed after SIGKILL ({} in use while it lived)",
        mib(size),
        mib(size),
        mib(during.mem_used.saturating_sub(base.mem_used))
    ))
}

// ---- isolation between guests ----------------------------------------------------

fn isolation_write(args: &Args) -> CaseResult {
    let magic = args.isolation_write.unwrap_or(0x5a5a_5a5a);
    let dev = open(args)?;
    let info = *dev.cached_info();
    let want = args.isolation_bytes.unwrap_or(info.mem_size / 2);
    let chunk = (16 * MIB).min(want.max(4 * KIB));
    let mut held = Vec::new();
    let mut total = 0;
    while total < want {
        let n = chunk.min(want - total).max(4) & !3;
        match dev.alloc(n) {
            Ok(b) => {
                dev.fill(&b, 0, n, magic).ctx("fill")?;
                total += n;
                held.push(b);
            }
            Err(e) if e.is_out_of_memory() => break,
            Err(e) => return Err(format!("alloc: {e}")),
        }
    }
    ensure!(!held.is_empty(), "could not allocate any memory");
    // Also through a copy from this process, and read some of it back.
    let first = &held[0];
    let host: Vec<u8> = std::iter::repeat_n(
        magic.to_le_bytes(),
        (first.size() / 4).min(MIB / 4) as usize,
    )
    .flatten()
    .collect();
    dev.copy_to_device(first, 0, &host).ctx("copy")?;
    for b in &held {
        let mut head = vec![0u8; 4096.min(b.size() as usize)];
        dev.copy_from_device(b, b.size() - head.len() as u64, &mut head)
            .ctx("read back")?;
        ensure!(
            words(&head).all(|w| w == magic),
            "pattern not in device memory"
        );
    }
    let mut wdetail = "no window".to_string();
    if info.window_size > 0 {
        let w = dev.map_window().ctx("mmap")?;
        let page: Vec<u8> = std::iter::repeat_n(magic.to_le_bytes(), 1024)
            .flatten()
            .collect();
        for off in (0..w.len()).step_by(4096) {
            let n = 4096.min(w.len() - off);
            w.write(off, &page[..n]).ctx("window write")?;
        }
        ensure!(
            w.read_u32(w.len() - 4).ctx("read")? == magic,
            "window write not seen"
        );
        wdetail = format!("{} of window", mib(w.len() as u64));
        // The mapping goes; the data stays in the window.
    }
    // The point another guest may start its check: the pattern is in
    // place and stays (allocated) for `hold` seconds.
    println!(
        "VGPU-ISOLATION WRITTEN magic={magic:#010x} device_bytes={total} window_bytes={} hold={}",
        info.window_size, args.hold
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    if args.hold > 0 {
        std::thread::sleep(Duration::from_secs(args.hold));
    }
    Ok(format!(
        "magic {magic:#010x} in {} of device memory and {wdetail}",
        mib(total)
    ))
}

fn isolation_check(args: &Args) -> CaseResult {
    let magic = args.isolation_check.unwrap_or(0x5a5a_5a5a);
    let dev = open(args)?;
    let info = *dev.cached_info();
    let used_before = dev.usage().ctx("USAGE")?.mem_used;
    // Take everything: big chunks, then smaller ones for the rest.
    let mut held = Vec::new();
    let mut total = 0u64;
    let mut chunk = 16 * MIB;
    while chunk >= 4 * KIB {
        match dev.alloc(chunk) {
            Ok(b) => {
                total += chunk;
                held.push(b);
            }
            Err(e) if e.is_out_of_memory() => chunk /= 4,
            Err(e) => return Err(format!("alloc: {e}")),
        }
    }
    let free = info.mem_size.saturating_sub(used_before);
    ensure!(
        total + 16 * KIB > free,
        "only {total} of {free} free bytes could be allocated"
    );
    let mut host = vec![0u8; 16 * MIB as usize];
    let (mut nonzero, mut found) = (0u64, 0u64);
    let mut first_bad = None;
    for b in &held {
        let n = b.size() as usize;
        dev.copy_from_device(b, 0, &mut host[..n])
            .ctx("read back")?;
        for (i, w) in words(&host[..n]).enumerate() {
            if w != 0 {
                nonzero += 1;
                if w == magic {
                    found += 1;
                }
                first_bad.get_or_insert((b.addr() + 4 * i as u64, w));
            }
        }
    }
    let mut wdetail = "no window".to_string();
    let (mut wfound, mut wnonzero) = (0u64, 0u64);
    if info.window_size > 0 {
        let w = dev.map_window().ctx("mmap")?;
        let mut page = vec![0u8; 64 * KIB as usize];
        for off in (0..w.len()).step_by(page.len()) {
            let n = page.len().min(w.len() - off);
            w.read(off, &mut page[..n]).ctx("window read")?;
            for x in words(&page[..n]) {
                wfound += u64::from(x == magic);
                wnonzero += u64::from(x != 0);
            }
        }
        wdetail = format!(
            "{} of window: {wfound} magic, {wnonzero} non-zero word(s)",
            mib(w.len() as u64)
        );
    }
    ensure!(
        found == 0 && wfound == 0,
        "MAGIC {magic:#010x} seen: {found} word(s) in device memory, {wfound} in the window"
    );
    ensure!(
        nonzero == 0,
        "{nonzero} non-zero word(s) in fresh device memory, first {:x?}",
        first_bad
    );
    Ok(format!(
        "{} of device memory ({} allocations) all zero; {wdetail}",
        mib(total),
        held.len()
    ))
}
