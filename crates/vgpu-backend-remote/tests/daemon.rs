//! vgpud with `isolation = "process"`: each vGPU gets its own partition
//! host, guests use it through the vfio-user socket, and destroying the
//! vGPU ends its host.

use vgpu_testkit::{abi, Guest, GuestOptions, Mode};
use vgpud::config::{Config, Isolation};
use vgpud::daemon::Daemon;

/// Partition host processes whose parent is this test process.
fn hosts() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            head.contains("(vgpu-partition") && rest.split_whitespace().nth(1) == Some(me.as_str())
        })
        .count()
}

#[test]
fn process_isolation_through_the_daemon() {
    let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-remote-").unwrap();
    let text = format!(
        r#"
[daemon]
runtime_dir = "{dir}"
metrics_address = ""

[[gpu]]
name = "g"
backend = "software"
memory = "256MiB"
compute_units = 2
isolation = "process"
partition_host = "{host}"

[[vgpu]]
name = "a"
gpu = "g"
socket = "a.sock"
memory = "64MiB"
compute_units = 1

[[vgpu]]
name = "b"
gpu = "g"
socket = "b.sock"
memory = "64MiB"
compute_units = 1
"#,
        dir = dir.as_path().display(),
        host = env!("CARGO_BIN_EXE_vgpu-partition-host"),
    );
    let config = Config::parse(&text, "c.toml").unwrap();
    assert_eq!(config.gpus[0].isolation(), Isolation::Process);
    let before = hosts();
    let mut d = Daemon::new(config).unwrap();
    d.start_all().unwrap();
    assert_eq!(hosts(), before + 2, "one host per vGPU");
    assert_eq!(d.gpus()[0].backend, "software");

    let mut g = Guest::connect(&dir.as_path().join("a.sock"), GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    let dev = g.device_alloc(0, 8192);
    assert_eq!(g.fill(0, dev, 8192, 0x0a0b_0c0d).status, abi::STATUS_OK);
    let got = g.download(0, dev, 8192);
    assert!(got.chunks(4).all(|w| w == 0x0a0b_0c0du32.to_le_bytes()));
    assert_eq!(d.stats().1[0].memory_used, 8192);
    drop(g);

    d.destroy("a").unwrap();
    assert_eq!(hosts(), before + 1);
    d.shutdown();
    assert_eq!(hosts(), before);
}
