//! vgpu-guest-test: the guest-side test suite of a vgpu function.
//!
//! Runs checks against `/dev/vgpuN` and prints one marker line per check:
//!
//! ```text
//! VGPU-TEST PASS <name> [detail]
//! VGPU-TEST FAIL <name>: <reason>
//! VGPU-TEST DONE
//! ```
//!
//! Exit status 0 when every check passed. `--list` shows the checks.

mod cases;
mod proc;

use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

/// Parses decimal, 0x-hex, or a size with a K/M/G suffix (binary units).
fn parse_num(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).map_err(|e| format!("{s:?}: {e}"));
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let mult = match t[split..].to_ascii_lowercase().as_str() {
        "" => 1u64,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("{s:?}: unknown unit {other:?}")),
    };
    let v: u64 = t[..split].parse().map_err(|e| format!("{s:?}: {e}"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} overflows"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_num(s)?).map_err(|_| format!("{s:?} does not fit 32 bits"))
}

fn parse_u16(s: &str) -> Result<u16, String> {
    u16::try_from(parse_num(s)?).map_err(|_| format!("{s:?} does not fit 16 bits"))
}

/// The guest test suite of a vgpu function.
#[derive(Parser, Debug, Clone)]
#[command(version)]
pub struct Args {
    /// Device file to test.
    #[arg(long, default_value = "/dev/vgpu0")]
    pub device: PathBuf,
    /// Expected device memory of the partition, bytes (e.g. 536870912 or 512M).
    #[arg(long, value_parser = parse_num)]
    pub expect_mem: Option<u64>,
    /// Expected compute units.
    #[arg(long, value_parser = parse_u32)]
    pub expect_cu: Option<u32>,
    /// Expected window size, bytes.
    #[arg(long, value_parser = parse_num)]
    pub expect_window: Option<u64>,
    /// Expected PCI vendor id (default 0x1ee7).
    #[arg(long, value_parser = parse_u16)]
    pub expect_vendor: Option<u16>,
    /// Expected PCI device id (default 0x0100).
    #[arg(long, value_parser = parse_u16)]
    pub expect_device_id: Option<u16>,
    /// Expected number of /dev/vgpuN devices.
    #[arg(long)]
    pub expect_devices: Option<usize>,
    /// Processes of the multi-process checks.
    #[arg(long, default_value_t = 4)]
    pub procs: usize,
    /// A short smoke subset (e.g. after reloading the module).
    #[arg(long)]
    pub quick: bool,
    /// Prefix for check names (e.g. "reload-" for a second run).
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Only: write MAGIC (a 32-bit word) over device memory and the
    /// window, for another guest's --isolation-check. Prints
    /// "VGPU-ISOLATION WRITTEN ..." once the pattern is in place, then
    /// keeps it allocated for --hold seconds.
    #[arg(long, value_name = "MAGIC", value_parser = parse_u32)]
    pub isolation_write: Option<u32>,
    /// Only: allocate all device memory and check it is zeroed and holds
    /// no MAGIC word, and that the window holds no MAGIC word.
    #[arg(long, value_name = "MAGIC", value_parser = parse_u32)]
    pub isolation_check: Option<u32>,
    /// Device memory --isolation-write fills (default: half the partition).
    #[arg(long, value_parser = parse_num)]
    pub isolation_bytes: Option<u64>,
    /// After --isolation-write, keep the memory allocated this many seconds.
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
    /// Run only these checks (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip these checks (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// List the checks and exit.
    #[arg(long)]
    pub list: bool,
    /// Do not print the final "VGPU-TEST DONE" (when a script prints it).
    #[arg(long)]
    pub no_done: bool,
    /// Seed of the random data (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// What a check returns: a detail for the PASS line, or the reason for
/// the FAIL line.
pub type CaseResult = Result<String, String>;

/// A check.
pub struct Case {
    pub name: &'static str,
    /// Part of --quick.
    pub quick: bool,
    pub run: fn(&Args) -> CaseResult,
}

/// One line, as the marker format needs.
fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn main() {
    let args = Args::parse();
    let cases = cases::all();
    if args.list {
        for c in &cases {
            println!("{}{}", c.name, if c.quick { " (quick)" } else { "" });
        }
        return;
    }
    let selected: Vec<&Case> = if let Some(_m) = args.isolation_write {
        cases
            .iter()
            .filter(|c| c.name == "isolation-write")
            .collect()
    } else if args.isolation_check.is_some() {
        cases
            .iter()
            .filter(|c| c.name == "isolation-check")
            .collect()
    } else if !args.only.is_empty() {
        let unknown: Vec<_> = args
            .only
            .iter()
            .filter(|n| !cases.iter().any(|c| c.name == n.as_str()))
            .collect();
        if !unknown.is_empty() {
            eprintln!("vgpu-guest-test: unknown check(s) {unknown:?}; see --list");
            std::process::exit(2);
        }
        cases
            .iter()
            .filter(|c| args.only.iter().any(|n| n == c.name))
            .collect()
    } else {
        cases
            .iter()
            .filter(|c| !c.name.starts_with("isolation-w") && c.name != "isolation-check")
            .filter(|c| !args.quick || c.quick)
            .collect()
    };
    let selected: Vec<&Case> = selected
        .into_iter()
        .filter(|c| !args.skip.iter().any(|n| n == c.name))
        .collect();

    let seed = args
        .seed
        .unwrap_or_else(vgpu_guest_tools::reference::Rng::seed_from_time);
    cases::set_seed(seed);
    println!(
        "vgpu-guest-test: {} check(s) on {} (seed {seed})",
        selected.len(),
        args.device.display()
    );
    let (mut passed, mut failed) = (0, 0);
    let t_all = Instant::now();
    for c in selected {
        let name = format!("{}{}", args.prefix, c.name);
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| (c.run)(&args))).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {msg}"))
        });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(detail) => {
                passed += 1;
                let detail = one_line(&detail);
                let sep = if detail.is_empty() { "" } else { " " };
                println!("VGPU-TEST PASS {name}{sep}{detail} [{ms:.0} ms]");
            }
            Err(reason) => {
                failed += 1;
                println!("VGPU-TEST FAIL {name}: {} [{ms:.0} ms]", one_line(&reason));
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!(
        "vgpu-guest-test: {passed} passed, {failed} failed in {:.1} s",
        t_all.elapsed().as_secs_f64()
    );
    if !args.no_done {
        println!("VGPU-TEST DONE");
    }
    let _ = std::io::stdout().flush();
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_num() {
        assert_eq!(parse_num("536870912"), Ok(536870912));
        assert_eq!(parse_num("512M"), Ok(512 << 20));
        assert_eq!(parse_num("16MiB"), Ok(16 << 20));
        assert_eq!(parse_num("0x1ee7"), Ok(0x1ee7));
        assert_eq!(parse_num("0xABCDEF12"), Ok(0xabcd_ef12));
        assert!(parse_num("12Q").is_err());
        assert!(parse_u16("0x10000").is_err());
    }

    #[test]
    fn test_one_line() {
        assert_eq!(one_line("a\nb\r\n\nc "), "a | b | c");
    }

    #[test]
    fn test_case_names_are_unique() {
        let all = cases::all();
        let mut names: Vec<_> = all.iter().map(|c| c.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
