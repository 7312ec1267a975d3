//! vgpu-smi: state of the vgpu functions of this guest, in the manner of
//! nvidia-smi.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde_json::json;
use vgpu_guest::sys::{self, VgpuInfo, VgpuUsage};
use vgpu_guest::{vgpu_abi, Device};

/// Shows the vgpu functions of this guest: identity, memory, compute
/// units, utilization and the processes using them.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Repeat every N seconds (utilization is then measured over N s).
    #[arg(short = 'l', long = "loop", value_name = "N")]
    interval: Option<f64>,
    /// With --loop: stop after this many reports.
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Only device N (/dev/vgpuN); may be repeated.
    #[arg(short = 'i', long = "id", value_name = "N")]
    ids: Vec<u32>,
    /// Sampling interval for utilization of a single report, ms.
    #[arg(long, default_value_t = 200)]
    sample_ms: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// What one report shows of a device.
struct DevState {
    minor: u32,
    path: PathBuf,
    info: VgpuInfo,
    usage: VgpuUsage,
    /// Percent of the interval the device was busy (may exceed 100 with
    /// several compute units working at once).
    util: f64,
    /// Commands per second over the interval.
    rate: f64,
}

struct Sampler {
    dev: Device,
    last: VgpuUsage,
    at: Instant,
}

/// Processes with a vgpu device open: (minor, pid) -> (open files, name).
fn processes() -> BTreeMap<(u32, u32), (u32, String)> {
    let me = std::process::id();
    let mut out = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(minor) = target
                .to_str()
                .and_then(|t| t.strip_prefix("/dev/vgpu"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let e = out.entry((minor, pid)).or_insert_with(|| {
                let name = std::fs::read_to_string(p.path().join("comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into());
                (0, name)
            });
            e.0 += 1;
        }
    }
    out
}

/// "Sat Nov 30 09:20:11 2024" (UTC) for a Unix time.
fn date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MO: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {y}",
        WD[days.rem_euclid(7) as usize],
        MO[(m - 1) as usize],
        d,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn mib(b: u64) -> String {
    format!("{}MiB", b >> 20)
}

fn bdf(i: &VgpuInfo) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{}",
        i.pci_domain,
        i.pci_bus,
        i.pci_devfn >> 3,
        i.pci_devfn & 7
    )
}

fn driver_version() -> String {
    std::fs::read_to_string("/sys/module/vgpu/version")
        .or_else(|_| std::fs::read_to_string("/sys/module/vgpu/srcversion"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "-".into())
}

fn table(states: &[DevState], errors: &[String], procs: &BTreeMap<(u32, u32), (u32, String)>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!("{} (UTC)", date(now));
    let line = format!("+{}+", "-".repeat(77));
    let abi = states
        .first()
        .map(|s| {
            format!(
                "{}.{}",
                s.info.abi_version >> 16,
                s.info.abi_version & 0xffff
            )
        })
        .unwrap_or_else(|| "-".into());
    println!("{line}");
    println!(
        "| {:<75} |",
        format!(
            "VGPU-SMI {:<10} Driver {:<12} uAPI {:<4} Device ABI {abi}",
            env!("CARGO_PKG_VERSION"),
            driver_version(),
            sys::UAPI_VERSION
        )
    );
    println!("|{}+{}+{}|", "-".repeat(31), "-".repeat(22), "-".repeat(22));
    println!(
        "| {:<4} {:<10} {:<13} | {:>20} | {:>4} {:>5} {:>9} |",
        "VGPU", "PCI ID", "Bus-Id", "Memory-Usage", "CUs", "Util", "Commands"
    );
    println!(
        "| {:<4} {:<10} {:<13} | {:>20} | {:>5} {:>5} {:>8} |",
        "", "Queues", "IRQ", "Window", "Files", "Procs", "Errors"
    );
    println!("|{}+{}+{}|", "=".repeat(31), "=".repeat(22), "=".repeat(22));
    for s in states {
        let i = &s.info;
        let u = &s.usage;
        println!(
            "| {:>4} {:<10} {:<13} | {:>20} | {:>4} {:>4.0}% {:>9} |",
            s.minor,
            format!("{:04x}:{:04x}", i.vendor_id, i.device_id),
            bdf(i),
            format!("{} / {}", mib(u.mem_used), mib(u.total(i))),
            i.compute_units,
            s.util,
            u.commands
        );
        let irq = format!("{}{}", i.irq_kind(), if i.polled() { " poll" } else { "" });
        // This process's own open file is not counted.
        println!(
            "| {:>4} {:<10} {:<13} | {:>20} | {:>5} {:>5} {:>8} |",
            "",
            format!("{} x {}", i.queues, i.queue_size),
            irq,
            if i.window_size > 0 {
                mib(i.window_size)
            } else {
                "none".into()
            },
            u.open_files.saturating_sub(1),
            u.processes.saturating_sub(1),
            format!("{}/{}", u.device_errors, u.recoveries)
        );
        println!("|{}+{}+{}|", "-".repeat(31), "-".repeat(22), "-".repeat(22));
    }
    for e in errors {
        println!("| {:<75} |", e);
        println!("{line}");
    }
    println!();
    println!("{line}");
    println!("| {:<75} |", "Processes:");
    println!(
        "| {:>4} {:>9} {:>6}   {:<51} |",
        "VGPU", "PID", "Files", "Process name"
    );
    println!("|{}|", "=".repeat(77));
    if procs.is_empty() {
        println!("| {:<75} |", " No running processes found");
    }
    for ((minor, pid), (files, name)) in procs {
        println!("| {:>4} {:>9} {:>6}   {:<51} |", minor, pid, files, name);
    }
    println!("{line}");
}

fn json_out(states: &[DevState], errors: &[String], procs: &BTreeMap<(u32, u32), (u32, String)>) {
    let devs: Vec<_> = states
        .iter()
        .map(|s| {
            let (i, u) = (&s.info, &s.usage);
            json!({
                "index": s.minor,
                "path": s.path.display().to_string(),
                "pci": {
                    "vendor_id": format!("0x{:04x}", i.vendor_id),
                    "device_id": format!("0x{:04x}", i.device_id),
                    "subsystem_vendor_id": format!("0x{:04x}", i.subsystem_vendor_id),
                    "subsystem_id": format!("0x{:04x}", i.subsystem_id),
                    "revision": i.revision,
                    "bus_id": bdf(i),
                },
                "abi_version": format!("{}.{}", i.abi_version >> 16, i.abi_version & 0xffff),
                "features": i.features,
                "memory": { "total": u.total(i), "used": u.mem_used },
                // A device context per process: a fault ends its own.
                "contexts": {
                    "per_process": i.flags & sys::INFO_CONTEXTS != 0,
                    "max": i.max_contexts,
                    "now": u.contexts,
                },
                "window_size": i.window_size,
                "compute_units": i.compute_units,
                "queues": i.queues,
                "max_queues": i.max_queues,
                "queue_size": i.queue_size,
                "msix": i.flags & sys::INFO_MSIX != 0,
                "polled": i.polled(),
                "utilization_percent": s.util,
                "busy_ns": u.busy_ns,
                "commands": u.commands,
                "commands_per_second": s.rate,
                "open_files": u.open_files.saturating_sub(1),
                "processes": u.processes.saturating_sub(1),
                "device_errors": u.device_errors,
                "recoveries": u.recoveries,
                "process_list": procs
                    .iter()
                    .filter(|((m, _), _)| *m == s.minor)
                    .map(|((_, pid), (files, name))| json!({"pid": pid, "name": name, "files": files}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    let out = json!({
        "uapi_version": sys::UAPI_VERSION,
        "driver_version": driver_version(),
        "devices": devs,
        "errors": errors,
    });
    println!("{out}");
}

fn main() {
    let args = Args::parse();
    let mut list = Device::list();
    if !args.ids.is_empty() {
        list.retain(|(n, _)| args.ids.contains(n));
    }
    if list.is_empty() {
        eprintln!(
            "vgpu-smi: no vgpu devices found (/dev/vgpuN); is vgpu.ko loaded and a {:04x}:{:04x} function present?",
            vgpu_abi::PCI_VENDOR_ID,
            vgpu_abi::PCI_DEVICE_ID
        );
        std::process::exit(1);
    }
    let mut samplers = Vec::new();
    let mut open_errors = Vec::new();
    for (n, path) in &list {
        match Device::open(path).and_then(|d| Ok((d.usage()?, d))) {
            Ok((u, dev)) => samplers.push((
                *n,
                path.clone(),
                Sampler {
                    dev,
                    last: u,
                    at: Instant::now(),
                },
            )),
            Err(e) => open_errors.push(format!("{}: {e}", path.display())),
        }
    }
    let mut first = true;
    let mut reports = 0u64;
    let mut failed = !open_errors.is_empty();
    loop {
        let wait = match (args.interval, first) {
            (Some(s), false) => Duration::from_secs_f64(s.max(0.01)),
            _ => Duration::from_millis(args.sample_ms),
        };
        std::thread::sleep(wait);
        first = false;
        let mut states = Vec::new();
        let mut errors = open_errors.clone();
        for (minor, path, s) in &mut samplers {
            let (Ok(info), Ok(u)) = (s.dev.info(), s.dev.usage()) else {
                errors.push(format!("{}: the device stopped answering", path.display()));
                continue;
            };
            let now = Instant::now();
            let dt = now.duration_since(s.at).as_secs_f64().max(1e-9);
            let util = u.busy_ns.saturating_sub(s.last.busy_ns) as f64 / 1e9 / dt * 100.0;
            let rate = u.commands.saturating_sub(s.last.commands) as f64 / dt;
            s.last = u;
            s.at = now;
            states.push(DevState {
                minor: *minor,
                path: path.clone(),
                info,
                usage: u,
                util,
                rate,
            });
        }
        let procs = processes();
        if args.json {
            json_out(&states, &errors, &procs);
        } else {
            table(&states, &errors, &procs);
        }
        reports += 1;
        failed |= !errors.is_empty();
        if args.interval.is_none() || args.count.is_some_and(|c| reports >= c) {
            break;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_date() {
        assert_eq!(date(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(date(1_732_958_411), "Sat Nov 30 09:20:11 2024");
        assert_eq!(date(951_782_400), "Tue Feb 29 00:00:00 2000");
    }
}
