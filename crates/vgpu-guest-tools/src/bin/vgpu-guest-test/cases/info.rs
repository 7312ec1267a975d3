//! Probing the device and what it reports: identity, sizes and usage.

use std::path::Path;

use vgpu_guest::vgpu_abi;
use vgpu_guest::{sys, Device};

use crate::{Args, CaseResult};

use super::{mib, open, Ctx, KIB};

fn sysfs_hex(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

pub(super) fn probe(args: &Args) -> CaseResult {
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

pub(super) fn info(args: &Args) -> CaseResult {
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
        i.pad0 == 0 && i.pad1 == 0 && i.reserved == [0; 2],
        "reserved fields not zero"
    );
    ensure!(
        i.flags & sys::INFO_CONTEXTS != 0 || i.context_cost == 0,
        "a context cost of {} without contexts",
        i.context_cost
    );
    let known = sys::INFO_POLLED
        | sys::INFO_MSIX
        | sys::INFO_WINDOW
        | sys::INFO_FUNC_INFO
        | sys::INFO_OCCUPANCY
        | sys::INFO_CONSOLE
        | sys::INFO_CONTEXTS
        | sys::INFO_VMM;
    ensure!(i.flags & !known == 0, "unknown flags {:#x}", i.flags);
    // The driver says FUNC_INFO, OCCUPANCY, CONSOLE, CONTEXTS and VMM
    // exactly when the device does.
    for (flag, feature, name) in [
        (
            sys::INFO_FUNC_INFO,
            vgpu_abi::FEATURE_FUNC_INFO,
            "INFO_FUNC_INFO",
        ),
        (
            sys::INFO_OCCUPANCY,
            vgpu_abi::FEATURE_OCCUPANCY,
            "INFO_OCCUPANCY",
        ),
        (sys::INFO_CONSOLE, vgpu_abi::FEATURE_CONSOLE, "INFO_CONSOLE"),
        (
            sys::INFO_CONTEXTS,
            vgpu_abi::FEATURE_CONTEXTS,
            "INFO_CONTEXTS",
        ),
        (sys::INFO_VMM, vgpu_abi::FEATURE_VMM, "INFO_VMM"),
    ] {
        ensure!(
            (i.flags & flag != 0) == (i.features & feature != 0),
            "{name} {:#x} against device features {:#x}",
            i.flags,
            i.features
        );
    }
    Ok(format!(
        "ABI {}.{}, {} memory, {} CU, window {}, {} queue(s) x {}, {}{}, features {:#x}",
        i.abi_version >> 16,
        i.abi_version & 0xffff,
        mib(i.mem_size),
        i.compute_units,
        mib(i.window_size),
        i.queues,
        i.queue_size,
        i.irq_kind(),
        if i.polled() { ", polled" } else { "" },
        i.features
    ))
}

pub(super) fn usage(args: &Args) -> CaseResult {
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
    ensure!(u0.reserved == 0, "reserved field not zero");
    let mem = dev.cached_info().mem_size;
    // No resize yet: the size now is the size at probe.
    ensure!(
        u0.mem_size == mem,
        "usage says {} bytes, info {mem}",
        u0.mem_size
    );
    // A fresh file's context has not started: what it will hold of its
    // own shows as pending, not yet in the function's memory in use.
    let cost = dev.cached_info().context_cost;
    ensure!(
        u0.context_pending == cost,
        "a fresh file's pending context memory {}, the context cost {cost}",
        u0.context_pending
    );
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
    // The context started with the first command: its own memory moved
    // from pending into the function's memory in use.
    ensure!(
        u2.context_pending == 0 && u2.mem_used >= u0.mem_used + 64 * KIB + cost,
        "mem_used {} -> {}, pending {} -> {}, context cost {cost}",
        u0.mem_used,
        u2.mem_used,
        u0.context_pending,
        u2.context_pending
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
