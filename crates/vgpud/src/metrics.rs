//! Prometheus metrics: the text exposition format 0.0.4 served at
//! `GET /metrics` on a TCP address (`daemon.metrics_address`).

use std::fmt::Write as _;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, PoisonError};

use log::info;

use crate::api::http::{Request, Response, Server};
use crate::daemon::{
    Daemon, GpuInfo, GpuStats, InstanceInfo, InstanceState, InstanceStats, QueueWaitTotals,
};

/// Content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The figures one scrape exposes.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per-GPU scheduler figures.
    pub gpus: Vec<GpuStats>,
    /// Per-GPU capacity.
    pub gpu_info: Vec<GpuInfo>,
    /// Per-vGPU figures.
    pub vgpus: Vec<InstanceStats>,
    /// Per-vGPU queue wait totals.
    pub waits: Vec<QueueWaitTotals>,
    /// Per-vGPU configuration (its scheduling parameters).
    pub instances: Vec<InstanceInfo>,
}

impl Snapshot {
    /// Takes the daemon's figures.
    pub fn of(d: &Daemon) -> Snapshot {
        let (gpus, vgpus) = d.stats();
        Snapshot {
            gpus,
            gpu_info: d.gpus(),
            vgpus,
            waits: d.queue_wait_totals(),
            instances: d.list(),
        }
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value as Go's ParseFloat reads it.
fn value(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{x}")
    }
}

struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(val));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", value(v));
    }

    /// Declares each family of `table` and writes its sample of each of
    /// `items` that has one, labelled with `labels`.
    fn families<T, V: Into<Option<f64>>, const N: usize>(
        &mut self,
        table: &[Family<T, V>],
        items: &[T],
        labels: impl Fn(&T) -> [(&'static str, &str); N],
    ) {
        for (name, kind, help, get) in table {
            self.family(name, kind, help);
            for item in items {
                if let Some(v) = get(item).into() {
                    self.sample(name, &labels(item), v);
                }
            }
        }
    }
}

/// A family with a sample per item: name, type, help and the item's value
/// (an `Option` for a family that some items have no sample of).
type Family<T, V = f64> = (&'static str, &'static str, &'static str, fn(&T) -> V);

/// The vGPU families, but the queue wait summary.
const VGPU_FAMILIES: &[Family<InstanceStats>] = &[
    (
        "vgpud_vgpu_up",
        "gauge",
        "1 while the vGPU runs (its socket accepts a VMM), 0 while it is stopped.",
        |s| f64::from(u8::from(s.state == InstanceState::Running)),
    ),
    (
        "vgpud_vgpu_memory_used_bytes",
        "gauge",
        "Device memory the vGPU has allocated.",
        |s| s.memory_used as f64,
    ),
    (
        "vgpud_vgpu_memory_quota_bytes",
        "gauge",
        "Device memory quota of the vGPU.",
        |s| s.memory_quota as f64,
    ),
    (
        "vgpud_vgpu_contexts",
        "gauge",
        "Contexts of the vGPU now: guest processes with device state of their own.",
        |s| f64::from(s.contexts),
    ),
    (
        "vgpud_vgpu_context_memory_bytes",
        "gauge",
        "Device memory the vGPU's contexts hold of their own (in its memory in use).",
        |s| s.context_memory as f64,
    ),
    (
        "vgpud_vgpu_suspended",
        "gauge",
        "1 while the vGPU is suspended: its memory out of the GPU, its commands waiting.",
        |s| f64::from(u8::from(s.state == InstanceState::Suspended)),
    ),
    (
        "vgpud_vgpu_suspends_total",
        "counter",
        "Suspends of the vGPU.",
        |s| s.moves.suspends as f64,
    ),
    (
        "vgpud_vgpu_evicted_bytes",
        "gauge",
        "Device memory of the vGPU moved out of the GPU by its suspend, while it is suspended.",
        |s| s.moves.evicted as f64,
    ),
    (
        "vgpud_vgpu_restore_seconds_total",
        "counter",
        "Time the vGPU's resumes took to bring its memory back.",
        |s| s.moves.restore.as_secs_f64(),
    ),
    (
        "vgpud_vgpu_evictions_total",
        "counter",
        "Times the daemon moved the vGPU out to make room for another on an oversubscribed GPU.",
        |s| s.moves.evictions as f64,
    ),
    (
        "vgpud_vgpu_caused_evictions_total",
        "counter",
        "Other vGPUs moved out to make room for this one's work.",
        |s| s.moves.caused as f64,
    ),
    (
        "vgpud_vgpu_caused_eviction_seconds_total",
        "counter",
        "What moving those out took, charged to this vGPU.",
        |s| s.moves.caused_time.as_secs_f64(),
    ),
    (
        "vgpud_vgpu_context_starts_total",
        "counter",
        "Contexts that started a partition of their own (on a GPU, a host process and a CUDA context).",
        |s| s.context_starts as f64,
    ),
    (
        "vgpud_vgpu_context_start_seconds_total",
        "counter",
        "Time those context starts took, in all.",
        |s| s.context_start.as_secs_f64(),
    ),
    (
        "vgpud_vgpu_context_reuses_total",
        "counter",
        "Contexts that took the partition of a context that had ended.",
        |s| s.context_reuses as f64,
    ),
    (
        "vgpud_vgpu_kernel_faults_total",
        "counter",
        "Commands whose kernel faulted; each ended its guest process's context.",
        |s| s.device.kernel_faults as f64,
    ),
    (
        "vgpud_vgpu_memory_peak_bytes",
        "gauge",
        "Most device memory the vGPU has had allocated.",
        |s| s.memory_peak as f64,
    ),
    (
        "vgpud_vgpu_busy_seconds_total",
        "counter",
        "GPU time charged to the vGPU by the scheduler.",
        |s| s.busy.as_secs_f64(),
    ),
    (
        "vgpud_vgpu_commands_total",
        "counter",
        "Commands the vGPU completed since it was created (function resets and stops included).",
        |s| s.commands as f64,
    ),
    (
        "vgpud_vgpu_bytes_total",
        "counter",
        "Bytes copied between guest or window memory and device memory.",
        |s| s.bytes as f64,
    ),
    (
        "vgpud_vgpu_capped_total",
        "counter",
        "Times the vGPU's fixed-share cap delayed it.",
        |s| s.capped as f64,
    ),
    (
        "vgpud_vgpu_faults_total",
        "counter",
        "Guest memory faults of the vGPU.",
        |s| s.device.faults as f64,
    ),
    (
        "vgpud_vgpu_errors_total",
        "counter",
        "Device errors the vGPU logged.",
        |s| s.device.errors as f64,
    ),
    (
        "vgpud_vgpu_resets_total",
        "counter",
        "Resets of the vGPU function.",
        |s| s.device.resets as f64,
    ),
    (
        "vgpud_vgpu_odd_reads_total",
        "counter",
        "Guest register reads that were not aligned 32/64-bit accesses (answered from the registers they overlap).",
        |s| s.device.odd_reads as f64,
    ),
    (
        "vgpud_vgpu_dropped_writes_total",
        "counter",
        "Guest writes the vGPU dropped (narrow or unaligned register writes).",
        |s| s.device.dropped_writes as f64,
    ),
];

const GPU_FAMILIES: &[Family<GpuStats>] = &[
    (
        "vgpud_gpu_utilization_ratio",
        "gauge",
        "GPU time used over wall time since the GPU was started (0 to 1).",
        |g| g.utilization,
    ),
    (
        "vgpud_gpu_recent_load_ratio",
        "gauge",
        "GPU time used over the last seconds (decaying over 10 s; 0 to 1): what placement weighs.",
        |g| g.recent_load,
    ),
    (
        "vgpud_gpu_busy_seconds_total",
        "counter",
        "GPU time used by all vGPUs.",
        |g| g.busy.as_secs_f64(),
    ),
    (
        "vgpud_gpu_switches_total",
        "counter",
        "Switches of the GPU from one vGPU to another.",
        |g| g.switches as f64,
    ),
    (
        "vgpud_gpu_commands_total",
        "counter",
        "Commands run on the GPU.",
        |g| g.commands as f64,
    ),
];

/// What the scheduler was told, beside what it did: a share of GPU time
/// is read against the weight (or the cap) it should follow. A vGPU without
/// a cap has no sample of it.
const PARAM_FAMILIES: &[Family<InstanceInfo, Option<f64>>] = &[
    (
        "vgpud_vgpu_weight",
        "gauge",
        "Weight of the vGPU under the fair policy.",
        |i| Some(f64::from(i.config.weight)),
    ),
    (
        "vgpud_vgpu_priority",
        "gauge",
        "Priority of the vGPU under the priority policy.",
        |i| Some(f64::from(i.config.priority)),
    ),
    (
        "vgpud_vgpu_cap_ratio",
        "gauge",
        "Fixed share of GPU time the vGPU is capped at (only vGPUs with a cap).",
        |i| i.config.cap,
    ),
];

const GPU_INFO_FAMILIES: &[Family<GpuInfo>] = &[
    (
        "vgpud_gpu_memory_bytes",
        "gauge",
        "Device memory of the GPU.",
        |g| g.memory_total as f64,
    ),
    (
        "vgpud_gpu_memory_allocated_bytes",
        "gauge",
        "Device memory given to the GPU's vGPUs as quotas.",
        |g| g.memory_allocated as f64,
    ),
    (
        "vgpud_gpu_compute_units",
        "gauge",
        "Compute units of the GPU.",
        |g| f64::from(g.compute_units_total),
    ),
    (
        "vgpud_gpu_compute_units_allocated",
        "gauge",
        "Compute units given to the GPU's vGPUs.",
        |g| f64::from(g.compute_units_allocated),
    ),
    (
        "vgpud_gpu_vgpus",
        "gauge",
        "vGPUs running on the GPU.",
        |g| g.vgpus.len() as f64,
    ),
];

fn vgpu_labels(v: &InstanceStats) -> [(&'static str, &str); 2] {
    [("vgpu", &v.name), ("gpu", &v.gpu)]
}

/// Renders `s` in the text exposition format.
pub fn render(s: &Snapshot) -> String {
    let mut w = Writer { out: String::new() };
    w.families(VGPU_FAMILIES, &s.vgpus, vgpu_labels);
    let wait = "vgpud_vgpu_queue_wait_seconds";
    w.family(
        wait,
        "summary",
        "Time the vGPU's commands waited for the GPU.",
    );
    for v in &s.vgpus {
        let labels = vgpu_labels(v);
        for (q, d) in [("0.5", v.wait_p50), ("0.99", v.wait_p99)] {
            let mut l = labels.to_vec();
            l.push(("quantile", q));
            w.sample(wait, &l, d.as_secs_f64());
        }
        let totals = s.waits.iter().find(|t| t.name == v.name);
        let sum = totals.map(|t| t.sum.as_secs_f64()).unwrap_or(0.0);
        let count = totals.map(|t| t.count).unwrap_or(0);
        w.sample(&format!("{wait}_sum"), &labels, sum);
        w.sample(&format!("{wait}_count"), &labels, count as f64);
    }
    w.families(PARAM_FAMILIES, &s.instances, |i| {
        [
            ("vgpu", i.config.name.as_str()),
            ("gpu", i.config.gpu.as_str()),
        ]
    });
    w.families(GPU_FAMILIES, &s.gpus, |g| [("gpu", g.name.as_str())]);
    w.families(GPU_INFO_FAMILIES, &s.gpu_info, |g| {
        [("gpu", g.config.name.as_str())]
    });
    w.out
}

/// Answers a request to the metrics server.
pub fn handle(daemon: &Mutex<Daemon>, req: &Request) -> Response {
    if req.path != "/metrics" {
        return Response::error(404, format!("no endpoint {}; try /metrics", req.path));
    }
    if req.method != "GET" {
        return Response::error(405, format!("{} is not allowed on /metrics", req.method))
            .with_header("Allow", "GET");
    }
    let snapshot = Snapshot::of(&daemon.lock().unwrap_or_else(PoisonError::into_inner));
    Response::text(200, CONTENT_TYPE, render(&snapshot))
}

/// The metrics server: serves `GET /metrics` until stopped or dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    server: Server,
}

impl MetricsServer {
    /// Listens on `addr` (port 0 picks a free port) and serves the
    /// figures of `daemon`.
    pub fn start(addr: SocketAddr, daemon: Arc<Mutex<Daemon>>) -> io::Result<MetricsServer> {
        let listener = Self::bind(addr)?;
        Self::serve(listener, daemon)
    }

    /// Binds `addr` for [`MetricsServer::serve`]: a privileged port is
    /// bound before the daemon gives up root, the serving threads start
    /// after.
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
    }

    /// Serves the figures of `daemon` on a bound listener.
    pub fn serve(listener: TcpListener, daemon: Arc<Mutex<Daemon>>) -> io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        let handler = Arc::new(move |req: &Request| handle(&daemon, req));
        let server = Server::spawn("metrics", listener, handler)?;
        info!("metrics at http://{addr}/metrics");
        Ok(MetricsServer { addr, server })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and closes the listener.
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::time::Duration;
    use vgpu_api::DeviceEvents;

    fn snapshot() -> Snapshot {
        let vgpu = |name: &str, busy_ms: u64| InstanceStats {
            name: name.into(),
            gpu: "gpu0".into(),
            state: if name == "vm1" {
                InstanceState::Running
            } else {
                InstanceState::Stopped
            },
            memory_quota: 512 << 20,
            memory_used: 4096,
            memory_peak: 8192,
            moves: crate::daemon::MemoryMoves {
                suspends: 3,
                evictions: 2,
                evicted: 0,
                restore: Duration::from_millis(250),
                caused: 4,
                caused_time: Duration::from_millis(500),
            },
            contexts: 2,
            context_starts: 3,
            context_start: Duration::from_millis(900),
            context_reuses: 1,
            context_memory: 2 << 20,
            commands: 17,
            busy: Duration::from_millis(busy_ms),
            bytes: 1 << 20,
            wait_p50: Duration::from_micros(20),
            wait_p99: Duration::from_micros(900),
            capped: 3,
            device: DeviceEvents {
                faults: 1,
                errors: 2,
                resets: 0,
                odd_reads: 4,
                dropped_writes: 5,
                kernel_faults: 6,
            },
        };
        Snapshot {
            gpus: vec![GpuStats {
                name: "gpu0".into(),
                backend: "software".into(),
                utilization: 0.25,
                recent_load: 0.125,
                busy: Duration::from_millis(1500),
                switches: 9,
                commands: 34,
            }],
            gpu_info: Vec::new(),
            vgpus: vec![vgpu("vm1", 1000), vgpu("we\"ird\\name\n", 500)],
            waits: vec![QueueWaitTotals {
                name: "vm1".into(),
                count: 4,
                sum: Duration::from_millis(2),
            }],
            instances: {
                let c = crate::config::Config::builtin();
                c.vgpus
                    .iter()
                    .map(|v| InstanceInfo {
                        config: crate::config::VgpuConfig {
                            cap: Some(0.5),
                            ..v.clone()
                        },
                        socket: c.socket_path(v),
                        state: InstanceState::Running,
                        placed: None,
                    })
                    .collect()
            },
        }
    }

    /// Splits a sample line into its name, labels and value, checking the
    /// syntax of the format on the way.
    fn parse_sample(line: &str) -> (String, Vec<(String, String)>, f64) {
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name: {line}"
        );
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            rest = r;
            loop {
                let eq = rest.find('=').expect("label without =");
                let key = &rest[..eq];
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "bad label name in {line}"
                );
                rest = rest[eq + 1..]
                    .strip_prefix('"')
                    .expect("label value quoted");
                let mut val = String::new();
                let mut chars = rest.char_indices();
                let end = loop {
                    match chars.next().expect("unterminated label value") {
                        (_, '\\') => match chars.next().expect("dangling escape").1 {
                            'n' => val.push('\n'),
                            c @ ('\\' | '"') => val.push(c),
                            c => panic!("bad escape \\{c} in {line}"),
                        },
                        (i, '"') => break i,
                        (_, '\n') => panic!("raw newline in {line}"),
                        (_, c) => val.push(c),
                    }
                };
                labels.push((key.to_string(), val));
                rest = &rest[end + 1..];
                if let Some(r) = rest.strip_prefix(',') {
                    rest = r;
                } else {
                    rest = rest.strip_prefix('}').expect("labels end with }");
                    break;
                }
            }
        }
        let v = rest.strip_prefix(' ').expect("one space before the value");
        let value = match v {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        (name.to_string(), labels, value)
    }

    #[test]
    fn test_exposition_format() {
        let text = render(&snapshot());
        assert!(text.ends_with('\n'));
        let mut types: HashMap<String, String> = HashMap::new();
        let mut helps = HashSet::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("# HELP ") {
                let (name, help) = h.split_once(' ').unwrap();
                assert!(!help.is_empty());
                assert!(helps.insert(name.to_string()), "HELP twice for {name}");
            } else if let Some(t) = line.strip_prefix("# TYPE ") {
                let (name, kind) = t.split_once(' ').unwrap();
                assert!(["counter", "gauge", "summary"].contains(&kind), "{line}");
                assert!(helps.contains(name), "TYPE before HELP for {name}");
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "TYPE twice for {name}"
                );
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{name}");
                }
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
                let (name, labels, v) = parse_sample(line);
                // The sample belongs to the family declared last.
                let family = types
                    .keys()
                    .filter(|f| {
                        name == **f
                            || name
                                .strip_prefix(f.as_str())
                                .is_some_and(|s| s == "_sum" || s == "_count")
                    })
                    .max_by_key(|f| f.len())
                    .unwrap_or_else(|| panic!("sample {name} without TYPE"));
                if types[family] == "summary" && name == *family {
                    assert!(labels.iter().any(|(k, _)| k == "quantile"), "{line}");
                }
                samples.push((name, labels, v));
            }
        }
        let find = |name: &str, vgpu: &str, extra: Option<(&str, &str)>| {
            samples
                .iter()
                .find(|(n, l, _)| {
                    n == name
                        && l.iter().any(|(k, v)| k == "vgpu" && v == vgpu)
                        && l.iter().any(|(k, v)| k == "gpu" && v == "gpu0")
                        && extra.is_none_or(|(ek, ev)| l.iter().any(|(k, v)| k == ek && v == ev))
                })
                .map(|s| s.2)
        };
        assert_eq!(
            find("vgpud_vgpu_memory_quota_bytes", "vm1", None),
            Some(536870912.0)
        );
        assert_eq!(
            find("vgpud_vgpu_busy_seconds_total", "vm1", None),
            Some(1.0)
        );
        assert_eq!(
            find("vgpud_vgpu_busy_seconds_total", "we\"ird\\name\n", None),
            Some(0.5),
            "label values are escaped and read back"
        );
        assert_eq!(
            find(
                "vgpud_vgpu_queue_wait_seconds",
                "vm1",
                Some(("quantile", "0.99"))
            ),
            Some(0.0009)
        );
        assert_eq!(
            find("vgpud_vgpu_queue_wait_seconds_count", "vm1", None),
            Some(4.0)
        );
        assert_eq!(
            find("vgpud_vgpu_queue_wait_seconds_sum", "vm1", None),
            Some(0.002)
        );
        assert_eq!(find("vgpud_vgpu_up", "vm1", None), Some(1.0));
        assert_eq!(
            find("vgpud_vgpu_up", "we\"ird\\name\n", None),
            Some(0.0),
            "a stopped vGPU is down"
        );
        for name in [
            "vgpud_vgpu_memory_used_bytes",
            "vgpud_vgpu_memory_peak_bytes",
            "vgpud_vgpu_commands_total",
            "vgpud_vgpu_bytes_total",
            "vgpud_vgpu_capped_total",
            "vgpud_vgpu_faults_total",
            "vgpud_vgpu_errors_total",
            "vgpud_vgpu_resets_total",
            "vgpud_vgpu_odd_reads_total",
            "vgpud_vgpu_dropped_writes_total",
            "vgpud_vgpu_contexts",
            "vgpud_vgpu_kernel_faults_total",
            "vgpud_vgpu_context_starts_total",
            "vgpud_vgpu_context_start_seconds_total",
            "vgpud_vgpu_context_reuses_total",
            "vgpud_vgpu_context_memory_bytes",
            "vgpud_vgpu_suspended",
            "vgpud_vgpu_evicted_bytes",
        ] {
            assert!(find(name, "vm1", None).is_some(), "{name}");
        }
        assert_eq!(find("vgpud_vgpu_suspends_total", "vm1", None), Some(3.0));
        assert_eq!(find("vgpud_vgpu_evictions_total", "vm1", None), Some(2.0));
        assert_eq!(
            find("vgpud_vgpu_caused_evictions_total", "vm1", None),
            Some(4.0)
        );
        assert_eq!(
            find("vgpud_vgpu_caused_eviction_seconds_total", "vm1", None),
            Some(0.5)
        );
        assert_eq!(
            find("vgpud_vgpu_restore_seconds_total", "vm1", None),
            Some(0.25)
        );
        assert!(text.contains("\nvgpud_gpu_utilization_ratio{gpu=\"gpu0\"} 0.25\n"));
        assert!(text.contains("\nvgpud_gpu_busy_seconds_total{gpu=\"gpu0\"} 1.5\n"));
        assert!(text.contains("\nvgpud_gpu_switches_total{gpu=\"gpu0\"} 9\n"));
        assert!(text.contains("# TYPE vgpud_vgpu_queue_wait_seconds summary\n"));
    }

    #[test]
    fn test_empty_and_special_values() {
        // No vGPUs: the families are still declared.
        let text = render(&Snapshot::default());
        assert!(text.contains("# TYPE vgpud_vgpu_memory_used_bytes gauge\n"));
        assert!(!text.lines().any(|l| !l.starts_with('#')));
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(1e-9), "0.000000001");
        assert_eq!(value(3.0), "3");
    }

    /// Every `vgpud_*` series the shipped Grafana dashboard and alert rules
    /// query is a family this endpoint exports.
    #[test]
    fn test_dashboard_and_alerts_use_only_exported_metrics() {
        let text = render(&snapshot());
        let families: HashSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for (file, body) in [
            (
                "grafana/vgpud.json",
                include_str!("../../../resources/grafana/vgpud.json"),
            ),
            (
                "prometheus/vgpud-alerts.yml",
                include_str!("../../../resources/prometheus/vgpud-alerts.yml"),
            ),
        ] {
            let mut used = 0;
            for (at, _) in body.match_indices("vgpud_") {
                let name: String = body[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let family = ["_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(f)))
                    .unwrap_or(&name);
                assert!(
                    families.contains(family),
                    "{file} uses {name}, which is not exported"
                );
                used += 1;
            }
            assert!(used > 5, "{file} queries vgpud metrics");
        }
    }
}
