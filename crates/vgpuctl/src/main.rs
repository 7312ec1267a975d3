//! `vgpuctl`: manage a running vgpud through its API socket.

mod client;
mod format;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use vgpu_api::{Gpu, GpuStats, Stats, Vgpu, VgpuStats};

use format::Table;
use vgpuctl::cli::{Cap, Cli, Cmd};

struct Api {
    path: PathBuf,
}

impl Api {
    /// Sends a request; a 4xx/5xx answer becomes its `error` text.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Vec<u8>, String> {
        let body = body.map(|b| b.to_string().into_bytes());
        let reply = client::request(
            &self.path,
            method,
            &format!("/api/v1{path}"),
            body.as_deref(),
        )?;
        if reply.status >= 400 {
            let reason = serde_json::from_slice::<Value>(&reply.body)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&reply.body).trim().to_string());
            return Err(format!("{reason} (HTTP {})", reply.status));
        }
        Ok(reply.body)
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<(T, Vec<u8>), String> {
        let raw = self.call("GET", path, None)?;
        let v = serde_json::from_slice(&raw)
            .map_err(|e| format!("unexpected answer from the daemon: {e}"))?;
        Ok((v, raw))
    }

    /// [`Api::get`] for a command that prints what it got: with `json`
    /// the answer is printed as sent here and `None` returned.
    fn get_or_print<T: DeserializeOwned>(
        &self,
        path: &str,
        json: bool,
    ) -> Result<Option<T>, String> {
        let (v, raw) = self.get(path)?;
        if json {
            print_raw(&raw);
            return Ok(None);
        }
        Ok(Some(v))
    }
}

/// A vGPU name as a path segment: anything but letters, digits, '-', '_'
/// and '.' percent-encoded.
fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn print_raw(raw: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(raw);
    if !raw.ends_with(b"\n") {
        let _ = out.write_all(b"\n");
    }
}

/// Prints the vGPU an answer describes: as sent with `json`, else the line
/// `text` makes of it.
fn print_vgpu(raw: &[u8], json: bool, text: impl FnOnce(&Vgpu) -> String) {
    if json {
        print_raw(raw);
    } else {
        let v: Vgpu = serde_json::from_slice(raw).unwrap_or_default();
        println!("{}", text(&v));
    }
}

/// Sets `key` of a request body to `value`, if there is one.
fn insert_some(body: &mut Map<String, Value>, key: &str, value: Option<impl Serialize>) {
    if let Some(v) = value {
        body.insert(key.into(), json!(v));
    }
}

fn cap_text(cap: Option<f64>) -> String {
    cap.map(|c| format!("{c}")).unwrap_or_else(|| "-".into())
}

fn list(api: &Api, json: bool) -> Result<(), String> {
    let Some(vgpus): Option<Vec<Vgpu>> = api.get_or_print("/vgpus", json)? else {
        return Ok(());
    };
    let mut t = Table::new(&[
        "NAME", "GPU", "STATE", "MEMORY", "CU", "WEIGHT", "PRIORITY", "CAP", "QUEUES", "SOCKET",
    ]);
    for v in &vgpus {
        let c = &v.config;
        t.row(vec![
            v.name.clone(),
            v.gpu.clone(),
            v.state.clone(),
            format::bytes(c.memory),
            c.compute_units.to_string(),
            c.weight.to_string(),
            c.priority.to_string(),
            cap_text(c.cap),
            c.queues.to_string(),
            v.socket_path.clone(),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

fn show(api: &Api, name: &str, json: bool) -> Result<(), String> {
    let Some(v): Option<Vgpu> = api.get_or_print(&format!("/vgpus/{}", segment(name)), json)?
    else {
        return Ok(());
    };
    let c = &v.config;
    let hex = |x: Option<u16>| {
        x.map(|x| format!("{x:#06x}"))
            .unwrap_or_else(|| "default".into())
    };
    let mut lines = vec![
        ("name", v.name.clone()),
        ("gpu", v.gpu.clone()),
        ("state", v.state.clone()),
        ("socket", v.socket_path.clone()),
        ("memory", format::bytes(c.memory)),
        ("compute units", c.compute_units.to_string()),
        ("weight", c.weight.to_string()),
        ("priority", c.priority.to_string()),
        ("cap", cap_text(c.cap)),
        ("queues", c.queues.to_string()),
        ("window", format::bytes(c.window)),
        ("poll", format!("{} µs", c.poll_us)),
        ("contexts", c.contexts.to_string()),
        ("pci vendor", hex(c.pci_vendor)),
        ("pci device", hex(c.pci_device)),
    ];
    if let Some(why) = &v.placement {
        lines.push(("placed by", why.clone()));
    }
    if let Some(s) = &v.stats {
        lines.extend([
            (
                "memory used",
                format!(
                    "{} of {} (peak {})",
                    format::bytes(s.memory_used_bytes),
                    format::bytes(s.memory_quota_bytes),
                    format::bytes(s.memory_peak_bytes)
                ),
            ),
            (
                "suspends",
                format!(
                    "{} ({} by the daemon; {} out of the GPU now, resumes took {})",
                    s.suspends,
                    s.evictions,
                    format::bytes(s.evicted_bytes),
                    format::secs(s.restore_seconds)
                ),
            ),
            (
                "made room",
                format!(
                    "{} times, taking {}",
                    s.caused_evictions,
                    format::secs(s.caused_eviction_seconds)
                ),
            ),
            ("commands", s.commands.to_string()),
            ("busy", format::secs(s.busy_seconds)),
            ("bytes copied", format::bytes(s.bytes)),
            (
                "queue wait",
                format!(
                    "p50 {}, p99 {}",
                    format::secs(s.queue_wait_p50_seconds),
                    format::secs(s.queue_wait_p99_seconds)
                ),
            ),
            ("capped", s.capped.to_string()),
            ("faults", s.device.faults.to_string()),
            ("errors", s.device.errors.to_string()),
            ("resets", s.device.resets.to_string()),
            ("odd reads", s.device.odd_reads.to_string()),
            ("dropped writes", s.device.dropped_writes.to_string()),
            (
                "contexts now",
                format!(
                    "{} (holding {} of their own)",
                    s.contexts,
                    format::bytes(s.context_memory_bytes)
                ),
            ),
            (
                "context starts",
                format!(
                    "{} (mean {}), {} reused",
                    s.context_starts,
                    format::secs(if s.context_starts > 0 {
                        s.context_start_seconds / s.context_starts as f64
                    } else {
                        0.0
                    }),
                    s.context_reuses
                ),
            ),
            ("kernel faults", s.device.kernel_faults.to_string()),
        ]);
    }
    for (k, val) in lines {
        println!("{:<15}{val}", format!("{k}:"));
    }
    Ok(())
}

fn gpus(api: &Api, json: bool) -> Result<(), String> {
    let Some(gpus): Option<Vec<Gpu>> = api.get_or_print("/gpus", json)? else {
        return Ok(());
    };
    let mut t = Table::new(&[
        "NAME",
        "BACKEND",
        "POLICY",
        "MEMORY",
        "ALLOCATED",
        "FREE",
        "CU",
        "CU USED",
        "UTIL",
        "LOAD",
        "VGPUS",
    ]);
    for g in &gpus {
        t.row(vec![
            g.name.clone(),
            g.backend.clone(),
            g.policy.clone(),
            format::bytes(g.memory_bytes),
            format::bytes(g.memory_allocated_bytes),
            format::bytes(g.memory_free_bytes),
            g.compute_units.to_string(),
            g.compute_units_allocated.to_string(),
            g.stats
                .as_ref()
                .map(|s| format::percent(s.utilization))
                .unwrap_or_else(|| "-".into()),
            g.stats
                .as_ref()
                .map(|s| format::percent(s.recent_load))
                .unwrap_or_else(|| "-".into()),
            g.vgpus.join(","),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

fn stats(api: &Api, json: bool) -> Result<(), String> {
    let Some(s): Option<Stats> = api.get_or_print("/stats", json)? else {
        return Ok(());
    };
    let mut t = Table::new(&["GPU", "BACKEND", "UTIL", "BUSY", "SWITCHES", "COMMANDS"]);
    for g in &s.gpus {
        t.row(vec![
            g.name.clone(),
            g.backend.clone(),
            format::percent(g.utilization),
            format::secs(g.busy_seconds),
            g.switches.to_string(),
            g.commands.to_string(),
        ]);
    }
    print!("{}", t.render());
    println!();
    let mut t = Table::new(&[
        "VGPU", "GPU", "STATE", "MEM USED", "QUOTA", "PEAK", "COMMANDS", "BUSY", "BYTES",
        "WAIT P50", "WAIT P99", "CAPPED", "FAULTS", "ERRORS", "RESETS",
    ]);
    for v in &s.vgpus {
        t.row(vec![
            v.name.clone(),
            v.gpu.clone(),
            v.state.clone(),
            format::bytes(v.memory_used_bytes),
            format::bytes(v.memory_quota_bytes),
            format::bytes(v.memory_peak_bytes),
            v.commands.to_string(),
            format::secs(v.busy_seconds),
            format::bytes(v.bytes),
            format::secs(v.queue_wait_p50_seconds),
            format::secs(v.queue_wait_p99_seconds),
            v.capped.to_string(),
            v.device.faults.to_string(),
            v.device.errors.to_string(),
            v.device.resets.to_string(),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

/// One vGPU's line of `top`: rates over the last interval.
#[derive(Serialize)]
struct TopVgpu {
    name: String,
    gpu: String,
    utilization: f64,
    commands_per_second: f64,
    bytes_per_second: f64,
    memory_used_bytes: u64,
    memory_quota_bytes: u64,
    queue_wait_p50_seconds: f64,
    queue_wait_p99_seconds: f64,
}

#[derive(Serialize)]
struct TopGpu {
    name: String,
    utilization: f64,
    commands_per_second: f64,
    switches_per_second: f64,
}

#[derive(Serialize)]
struct TopFrame {
    interval_seconds: f64,
    gpus: Vec<TopGpu>,
    vgpus: Vec<TopVgpu>,
}

/// Rates between two samples `dt` seconds apart. A vGPU new in `cur` is
/// measured from zero; a counter that went back (a reset) from its new value.
fn frame(prev: &Stats, cur: &Stats, dt: f64) -> TopFrame {
    let per_s = |now: f64, before: f64| {
        let d = if now >= before { now - before } else { now };
        d / dt
    };
    let old_v: HashMap<&str, &VgpuStats> =
        prev.vgpus.iter().map(|v| (v.name.as_str(), v)).collect();
    let old_g: HashMap<&str, &GpuStats> = prev.gpus.iter().map(|g| (g.name.as_str(), g)).collect();
    let zero_v = VgpuStats::default();
    let zero_g = GpuStats::default();
    TopFrame {
        interval_seconds: dt,
        gpus: cur
            .gpus
            .iter()
            .map(|g| {
                let o = old_g.get(g.name.as_str()).copied().unwrap_or(&zero_g);
                TopGpu {
                    name: g.name.clone(),
                    utilization: per_s(g.busy_seconds, o.busy_seconds),
                    commands_per_second: per_s(g.commands as f64, o.commands as f64),
                    switches_per_second: per_s(g.switches as f64, o.switches as f64),
                }
            })
            .collect(),
        vgpus: cur
            .vgpus
            .iter()
            .map(|v| {
                let o = old_v.get(v.name.as_str()).copied().unwrap_or(&zero_v);
                TopVgpu {
                    name: v.name.clone(),
                    gpu: v.gpu.clone(),
                    utilization: per_s(v.busy_seconds, o.busy_seconds),
                    commands_per_second: per_s(v.commands as f64, o.commands as f64),
                    bytes_per_second: per_s(v.bytes as f64, o.bytes as f64),
                    memory_used_bytes: v.memory_used_bytes,
                    memory_quota_bytes: v.memory_quota_bytes,
                    queue_wait_p50_seconds: v.queue_wait_p50_seconds,
                    queue_wait_p99_seconds: v.queue_wait_p99_seconds,
                }
            })
            .collect(),
    }
}

fn render_frame(f: &TopFrame) -> String {
    let mut out = format!(
        "vgpud: {} GPU(s), {} vGPU(s); rates over {:.1} s\n\n",
        f.gpus.len(),
        f.vgpus.len(),
        f.interval_seconds
    );
    let mut t = Table::new(&["GPU", "UTIL", "COMMANDS", "SWITCHES"]);
    for g in &f.gpus {
        t.row(vec![
            g.name.clone(),
            format::percent(g.utilization),
            format::rate(g.commands_per_second),
            format::rate(g.switches_per_second),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = Table::new(&[
        "VGPU", "GPU", "UTIL", "MEM USED", "QUOTA", "WAIT P50", "WAIT P99", "COMMANDS", "COPIED",
    ]);
    for v in &f.vgpus {
        t.row(vec![
            v.name.clone(),
            v.gpu.clone(),
            format::percent(v.utilization),
            format::bytes(v.memory_used_bytes),
            format::bytes(v.memory_quota_bytes),
            format::secs(v.queue_wait_p50_seconds),
            format::secs(v.queue_wait_p99_seconds),
            format::rate(v.commands_per_second),
            format!("{}/s", format::bytes(v.bytes_per_second as u64)),
        ]);
    }
    out.push_str(&t.render());
    out
}

fn top(api: &Api, once: bool, interval: f64, json: bool) -> Result<(), String> {
    let interval = Duration::from_secs_f64(interval);
    let mut prev: Stats = api.get("/stats")?.0;
    let mut at = Instant::now();
    loop {
        std::thread::sleep(interval);
        let cur: Stats = api.get("/stats")?.0;
        let now = Instant::now();
        let f = frame(&prev, &cur, now.duration_since(at).as_secs_f64().max(1e-6));
        let text = if json {
            serde_json::to_string(&f).map_err(|e| e.to_string())? + "\n"
        } else {
            render_frame(&f)
        };
        let mut out = std::io::stdout().lock();
        if !once && !json {
            // Home the cursor and clear the screen.
            let _ = out.write_all(b"\x1b[H\x1b[2J");
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        if once {
            return Ok(());
        }
        prev = cur;
        at = now;
    }
}

/// `vgpuctl stop` and `vgpuctl start`.
fn power(api: &Api, name: &str, action: &str, json: bool) -> Result<(), String> {
    let raw = api.call(
        "POST",
        &format!("/vgpus/{}/{action}", segment(name)),
        Some(&json!({})),
    )?;
    print_vgpu(&raw, json, |v| format!("{name}: {}", v.state));
    Ok(())
}

fn run(cli: Cli) -> Result<(), String> {
    let api = Api { path: cli.api };
    let json = cli.json;
    match cli.command {
        Cmd::List => list(&api, json),
        Cmd::Show { name } => show(&api, &name, json),
        Cmd::Gpus => gpus(&api, json),
        Cmd::Stats => stats(&api, json),
        Cmd::Top { once, interval } => top(&api, once, interval, json),
        Cmd::Create {
            name,
            gpu,
            socket,
            memory,
            compute_units,
            weight,
            priority,
            cap,
            queues,
        } => {
            let mut body = Map::new();
            body.insert("name".into(), json!(name));
            body.insert("gpu".into(), json!(gpu));
            body.insert("socket".into(), json!(socket.to_string_lossy()));
            body.insert("memory".into(), size_value(&memory));
            body.insert("compute_units".into(), json!(compute_units));
            insert_some(&mut body, "weight", weight);
            insert_some(&mut body, "priority", priority);
            insert_some(&mut body, "cap", cap);
            insert_some(&mut body, "queues", queues);
            let raw = api.call("PUT", "/vgpus", Some(&Value::Object(body)))?;
            print_vgpu(&raw, json, |v| {
                format!("created {name}: listening on {}", v.socket_path)
            });
            Ok(())
        }
        Cmd::Destroy { name } => {
            api.call("DELETE", &format!("/vgpus/{}", segment(&name)), None)?;
            if !json {
                println!("destroyed {name}");
            }
            Ok(())
        }
        Cmd::Stop { name } => power(&api, &name, "stop", json),
        Cmd::Start { name } => power(&api, &name, "start", json),
        Cmd::Suspend { name } => power(&api, &name, "suspend", json),
        Cmd::Resume { name } => power(&api, &name, "resume", json),
        Cmd::Set {
            name,
            memory,
            weight,
            priority,
            cap,
        } => {
            let mut body = Map::new();
            if let Some(memory) = memory {
                body.insert("memory".into(), size_value(&memory));
            }
            insert_some(&mut body, "weight", weight);
            insert_some(&mut body, "priority", priority);
            // `--cap none` sends null: the cap is removed.
            insert_some(&mut body, "cap", cap.map(|Cap(c)| c));
            let raw = api.call(
                "PATCH",
                &format!("/vgpus/{}", segment(&name)),
                Some(&Value::Object(body)),
            )?;
            print_vgpu(&raw, json, |v| {
                format!(
                    "{name}: memory {}, weight {}, priority {}, cap {}",
                    format::bytes(v.config.memory),
                    v.config.weight,
                    v.config.priority,
                    cap_text(v.config.cap)
                )
            });
            Ok(())
        }
    }
}

/// A size as the API takes it: bytes as a number; one with a unit as
/// written, which the daemon parses.
fn size_value(size: &str) -> Value {
    match size.parse::<u64>() {
        Ok(n) => json!(n),
        Err(_) => json!(size),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpuctl: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frame_rates() {
        let v = |busy: f64, commands: u64| VgpuStats {
            name: "a".into(),
            gpu: "g".into(),
            busy_seconds: busy,
            commands,
            ..Default::default()
        };
        let prev = Stats {
            gpus: vec![],
            vgpus: vec![v(1.0, 100)],
        };
        let cur = Stats {
            gpus: vec![],
            vgpus: vec![v(1.5, 300)],
        };
        let f = frame(&prev, &cur, 2.0);
        assert_eq!(f.vgpus[0].utilization, 0.25);
        assert_eq!(f.vgpus[0].commands_per_second, 100.0);
        // A counter reset counts from zero.
        let f = frame(&cur, &prev, 2.0);
        assert_eq!(f.vgpus[0].commands_per_second, 50.0);
        assert!(render_frame(&f).contains("VGPU"));
    }

    #[test]
    fn test_cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["vgpuctl", "set", "a", "--priority", "-3", "--cap", "none"])
            .unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Set {
                priority: Some(-3),
                cap: Some(Cap(None)),
                ..
            }
        ));
        let cli = Cli::try_parse_from(["vgpuctl", "set", "a", "--memory", "8GiB"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Set { memory: Some(m), weight: None, .. } if m == "8GiB"
        ));
        assert_eq!(size_value("4096"), json!(4096));
        assert_eq!(size_value("1GiB"), json!("1GiB"));
        assert!(Cli::try_parse_from(["vgpuctl", "set", "a"]).is_err());
        assert!(Cli::try_parse_from(["vgpuctl", "set", "a", "--cap", "lots"]).is_err());
    }
}
