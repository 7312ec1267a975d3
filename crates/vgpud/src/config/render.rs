//! The configuration as understood, written back as TOML: every setting
//! with the value in force, those the file left out marked `# default`,
//! and unset optional ones as comments. `vgpud check-config` prints it.

use std::fmt::Write;
use std::path::Path;

use toml::{Table, Value};

use super::{
    BackendKind, Config, DaemonConfig, GpuConfig, Isolation, PartitionMode, Placement, Policy,
    Size, VgpuConfig,
};
use crate::confine::SeccompMode;

/// One line of a table: a key and its value, or a commented-out key.
enum Entry {
    Set(&'static str, Value),
    Unset(&'static str, &'static str),
}

fn s(v: impl Into<String>) -> Value {
    Value::String(v.into())
}

fn n(v: impl Into<i64>) -> Value {
    Value::Integer(v.into())
}

/// Integers above i64::MAX cannot be TOML integers; sizes that big are
/// written as strings with a unit anyway.
fn big(v: u64) -> Value {
    i64::try_from(v)
        .map(Value::Integer)
        .unwrap_or_else(|_| s(v.to_string()))
}

fn path(p: impl AsRef<Path>) -> Value {
    s(p.as_ref().display().to_string())
}

/// `key` set to `v`, or commented out with `why` it is not set.
fn opt(key: &'static str, v: Option<Value>, why: &'static str) -> Entry {
    match v {
        Some(v) => Entry::Set(key, v),
        None => Entry::Unset(key, why),
    }
}

fn seccomp(m: SeccompMode) -> &'static str {
    match m {
        SeccompMode::Strict => "strict",
        SeccompMode::Log => "log",
        SeccompMode::Off => "off",
    }
}

fn daemon_entries(d: &DaemonConfig) -> Vec<Entry> {
    vec![
        Entry::Set("runtime_dir", path(&d.runtime_dir)),
        opt(
            "api_socket",
            d.api_socket.as_ref().map(path),
            "the API socket is <runtime_dir>/api.sock",
        ),
        Entry::Set("metrics_address", s(d.metrics_address.clone())),
        opt(
            "user",
            d.user.clone().map(s),
            "vgpud keeps the user it was started as",
        ),
        Entry::Set("allow_root", Value::Boolean(d.allow_root)),
        Entry::Set("seccomp", s(seccomp(d.seccomp))),
        opt(
            "socket_group",
            d.socket_group.clone().map(s),
            "vGPU sockets are 0600",
        ),
        Entry::Set("shutdown_grace_ms", big(d.shutdown_grace_ms)),
        Entry::Set(
            "placement",
            s(match d.placement {
                Placement::Spread => "spread".to_string(),
                Placement::Pack => "pack".to_string(),
            }),
        ),
    ]
}

fn gpu_entries(g: &GpuConfig) -> Vec<Entry> {
    let backend = match g.backend {
        BackendKind::Software => "software",
        BackendKind::Cuda => "cuda",
    };
    let mode = match g.partition_mode {
        PartitionMode::Isolated => "isolated",
        PartitionMode::Spatial => "spatial",
    };
    let isolation = match g.isolation() {
        Isolation::Thread => "thread",
        Isolation::Process => "process",
    };
    let policy = match g.policy {
        Policy::RoundRobin => "round-robin",
        Policy::Priority => "priority",
        Policy::Fair => "fair",
    };
    vec![
        Entry::Set("name", s(g.name.clone())),
        Entry::Set("backend", s(backend)),
        opt(
            "memory",
            g.memory.map(|m| s(m.to_string())),
            "the whole device",
        ),
        Entry::Set("compute_units", n(g.compute_units)),
        Entry::Set("device", n(g.device)),
        Entry::Set("partition_mode", s(mode)),
        Entry::Set("isolation", s(isolation)),
        Entry::Set("guest_ptx", Value::Boolean(g.guest_ptx)),
        Entry::Set("trusted_tenants", Value::Boolean(g.trusted_tenants)),
        opt(
            "partition_host",
            g.partition_host.as_ref().map(path),
            "vgpu-partition-host next to vgpud",
        ),
        Entry::Set("policy", s(policy)),
        Entry::Set("slice_us", big(g.slice_us())),
        Entry::Set("kernel_timeout_ms", big(g.kernel_timeout_ms)),
        Entry::Set("context_memory", s(Size(g.context_memory()).to_string())),
        Entry::Set("oversubscribe", Value::Boolean(g.oversubscribe)),
        opt(
            "host_memory",
            g.host_memory.map(|m| s(m.to_string())),
            "as much as the GPU's memory, with oversubscribe",
        ),
    ]
}

fn vgpu_entries(v: &VgpuConfig) -> Vec<Entry> {
    vec![
        Entry::Set("name", s(v.name.clone())),
        Entry::Set("gpu", s(v.gpu.clone())),
        Entry::Set("socket", path(&v.socket)),
        Entry::Set("memory", s(v.memory.to_string())),
        Entry::Set("compute_units", n(v.compute_units)),
        Entry::Set("priority", n(v.priority)),
        Entry::Set("weight", n(v.weight)),
        opt("cap", v.cap.map(Value::Float), "no fixed share"),
        Entry::Set("queues", n(v.queues)),
        Entry::Set("window", s(v.window.to_string())),
        Entry::Set("poll_us", big(v.poll_us)),
        Entry::Set("contexts", n(v.contexts)),
        opt(
            "pci_vendor",
            v.pci_vendor.map(n),
            "the vGPU ABI's vendor id",
        ),
        opt(
            "pci_device",
            v.pci_device.map(n),
            "the vGPU ABI's device id",
        ),
    ]
}

fn table(out: &mut String, header: &str, entries: &[Entry], given: Option<&Table>) {
    let _ = writeln!(out, "{header}");
    for e in entries {
        match e {
            Entry::Set(key, value) => {
                let mark = if given.is_some_and(|t| t.contains_key(*key)) {
                    ""
                } else {
                    "  # default"
                };
                let _ = writeln!(out, "{key} = {value}{mark}");
            }
            Entry::Unset(key, why) => {
                let _ = writeln!(out, "# {key} is not set: {why}");
            }
        }
    }
    out.push('\n');
}

impl Config {
    /// This configuration as TOML; `source` is the text it was parsed
    /// from, to tell the settings it gave from the defaults.
    pub fn to_annotated_toml(&self, source: &str) -> String {
        let raw: Table = source.parse().unwrap_or_default();
        let nth = |key: &str, i: usize| raw.get(key)?.as_array()?.get(i)?.as_table();
        let mut out = String::from(
            "# The configuration as vgpud understands it: every setting with the\n\
             # value in force; \"# default\" marks those the file left out.\n\n",
        );
        let daemon = raw.get("daemon").and_then(Value::as_table);
        table(&mut out, "[daemon]", &daemon_entries(&self.daemon), daemon);
        for (i, g) in self.gpus.iter().enumerate() {
            table(&mut out, "[[gpu]]", &gpu_entries(g), nth("gpu", i));
        }
        for (i, v) in self.vgpus.iter().enumerate() {
            table(&mut out, "[[vgpu]]", &vgpu_entries(v), nth("vgpu", i));
        }
        out.truncate(out.trim_end().len() + 1);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = r#"
[daemon]
runtime_dir = "/run/x"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "cuda"
policy = "priority"

[[vgpu]]
name = "a"
gpu = "gpu0"
socket = "a.sock"
memory = "1GiB"
compute_units = 16
cap = 0.25
"#;

    #[test]
    fn test_renders_values_in_force_and_marks_defaults() {
        let c = Config::parse(GIVEN, "t.toml").unwrap();
        let text = c.to_annotated_toml(GIVEN);
        // What the file gave is unmarked; what it left out says so.
        assert!(text.contains("runtime_dir = \"/run/x\"\n"), "{text}");
        assert!(text.contains("policy = \"priority\"\n"), "{text}");
        assert!(text.contains("cap = 0.25\n"), "{text}");
        assert!(text.contains("seccomp = \"strict\"  # default\n"), "{text}");
        // Defaults that depend on other settings come out resolved.
        assert!(
            text.contains("isolation = \"process\"  # default\n"),
            "{text}"
        );
        assert!(text.contains("slice_us = 8000  # default\n"), "{text}");
        assert!(text.contains("# api_socket is not set"), "{text}");
        assert!(text.contains("memory = \"1GiB\"\n"), "{text}");
        // It is a configuration that means the same.
        let again = Config::parse(&text, "rendered.toml").unwrap();
        assert_eq!(again.daemon, c.daemon);
        assert_eq!(again.vgpus, c.vgpus);
        assert_eq!(again.gpus[0].isolation(), c.gpus[0].isolation());
        assert_eq!(again.gpus[0].slice_us(), c.gpus[0].slice_us());
        // And rendering it again marks nothing as default any more.
        let twice = again.to_annotated_toml(&text);
        assert!(!twice.contains("# default\n"), "{twice}");
    }

    #[test]
    fn test_builtin_configuration_renders_and_reparses() {
        let c = Config::builtin();
        let text = c.to_annotated_toml(super::super::DEFAULT_CONFIG);
        let again = Config::parse(&text, "rendered.toml").unwrap();
        assert_eq!(again.vgpus, c.vgpus);
        assert_eq!(again.gpus.len(), c.gpus.len());
    }
}
