//! vgpud with `isolation = "process"`: each vGPU gets its own partition
//! host, guests use it through the vfio-user socket, and destroying the
//! vGPU ends its host.

use vgpu_testkit::{abi, Guest, GuestOptions, Mode};
use vgpud::config::{Config, Isolation};
use vgpud::daemon::Daemon;

/// (pid, parent pid, command line) of every process.
fn processes() -> Vec<(String, String, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid = rest.split_whitespace().nth(1)?.to_string();
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            Some((e.file_name().to_string_lossy().into_owned(), ppid, cmd))
        })
        .collect()
}

/// Partition host processes started by a launcher that this test
/// process started.
fn hosts() -> usize {
    let me = std::process::id().to_string();
    let all = processes();
    let launchers: Vec<&String> = all
        .iter()
        .filter(|(_, ppid, cmd)| *ppid == me && cmd.contains(" --launcher "))
        .map(|(pid, _, _)| pid)
        .collect();
    all.iter()
        .filter(|(_, ppid, cmd)| launchers.contains(&ppid) && cmd.contains(" --fd "))
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
