//! vgpuctl, the built binary, against a daemon running in this process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use vgpu_testkit::{Guest, GuestOptions, Mode};
use vgpud::api::ApiServer;
use vgpud::config::Config;
use vgpud::daemon::Daemon;
use vmm_sys_util::tempdir::TempDir;

struct Fixture {
    _api: ApiServer,
    daemon: Arc<Mutex<Daemon>>,
    sock: PathBuf,
    dir: TempDir,
}

/// The built-in configuration (two vGPUs) in a temporary runtime directory.
fn fixture() -> Fixture {
    let dir = TempDir::new_with_prefix("/tmp/vgpuctl-test-").unwrap();
    let mut config = Config::builtin();
    config.daemon.runtime_dir = dir.as_path().to_path_buf();
    let sock = config.api_socket_path();
    let mut d = Daemon::new(config).unwrap();
    d.start_all().unwrap();
    let daemon = Arc::new(Mutex::new(d));
    let api = ApiServer::start(&sock, daemon.clone()).unwrap();
    Fixture {
        _api: api,
        daemon,
        sock,
        dir,
    }
}

fn vgpuctl(api: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .arg("--api")
        .arg(api)
        .args(args)
        .output()
        .unwrap()
}

/// Runs vgpuctl, asserts it succeeded and returns its standard output.
#[track_caller]
fn ok(f: &Fixture, args: &[&str]) -> String {
    let out = vgpuctl(&f.sock, args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "vgpuctl {args:?}: {stderr}\n{stdout}");
    stdout
}

/// Runs vgpuctl, asserts it failed with exit code 1, returns its error.
#[track_caller]
fn fails(f: &Fixture, args: &[&str]) -> String {
    let out = vgpuctl(&f.sock, args);
    assert_eq!(out.status.code(), Some(1), "vgpuctl {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn test_list() {
    let f = fixture();
    let out = ok(&f, &["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("SOCKET"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("vgpu0 ") && lines[1].contains("512MiB"),
        "{out}"
    );
    assert!(lines[2].contains(&*f.dir.as_path().join("vgpu1.sock").to_string_lossy()));
    let json: Value = serde_json::from_str(&ok(&f, &["--json", "list"])).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2);
    assert_eq!(json[1]["config"]["memory"], 512u64 << 20);
    // Without a daemon.
    let out = vgpuctl(&f.dir.as_path().join("none.sock"), &["list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn test_set() {
    let f = fixture();
    let out = ok(
        &f,
        &[
            "set",
            "vgpu0",
            "--weight",
            "3",
            "--priority",
            "-2",
            "--cap",
            "0.5",
        ],
    );
    assert_eq!(
        out,
        "vgpu0: memory 512MiB, weight 3, priority -2, cap 0.5\n"
    );
    let config = |name: &str| f.daemon.lock().unwrap().instance(name).unwrap().config;
    let c = config("vgpu0");
    assert_eq!((c.weight, c.priority, c.cap), (3, -2, Some(0.5)));
    ok(&f, &["set", "vgpu0", "--cap", "none"]);
    assert_eq!(config("vgpu0").cap, None);
    assert_eq!(config("vgpu0").weight, 3);
    // Refusals name the reason and change nothing.
    let e = fails(&f, &["set", "vgpu0", "--weight", "0"]);
    assert!(e.contains("weight") && e.contains("HTTP 400"), "{e}");
    let e = fails(&f, &["set", "vgpu0", "--cap", "1.5"]);
    assert!(e.contains("cap"), "{e}");
    assert_eq!(config("vgpu0").weight, 3);
    assert_eq!(config("vgpu0").cap, None);
    let e = fails(&f, &["set", "nope", "--weight", "2"]);
    assert!(
        e.contains("no vGPU named \"nope\"") && e.contains("404"),
        "{e}"
    );
    // Nothing to set is a usage error.
    assert_eq!(vgpuctl(&f.sock, &["set", "vgpu0"]).status.code(), Some(2));
}

#[test]
fn test_suspend_and_resume_with_a_guest_waiting() {
    let f = fixture();
    let abi = vgpu_testkit::abi::STATUS_OK;
    let socket = f.dir.as_path().join("vgpu0.sock");
    let mut g = Guest::connect(&socket, GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    let a = g.device_alloc(0, 4 << 20);
    assert_eq!(g.fill(0, a, 4 << 20, 0x600d_cafe).status, abi);
    let out = ok(&f, &["suspend", "vgpu0"]);
    assert_eq!(out, "vgpu0: suspended\n");
    let e = fails(&f, &["suspend", "vgpu0"]);
    assert!(e.contains("already suspended") && e.contains("409"), "{e}");
    let e = fails(&f, &["stop", "vgpu0"]);
    assert!(e.contains("resume it first") && e.contains("409"), "{e}");
    // The guest's work waits.
    g.post(0, &vgpu_testkit::fill_chain(a, 4 << 20, 0x0dd_ba11));
    g.kick(0);
    assert!(g
        .wait_used(0, std::time::Duration::from_millis(200))
        .is_none());
    // Its 512 MiB are free on the GPU: another vGPU may grow into them,
    // and the resume waits for room.
    ok(&f, &["set", "vgpu1", "--memory", "1792MiB"]);
    let e = fails(&f, &["resume", "vgpu0"]);
    assert!(e.contains("stays suspended") && e.contains("409"), "{e}");
    let v: Value = serde_json::from_str(&ok(&f, &["--json", "show", "vgpu0"])).unwrap();
    assert_eq!(v["state"], "suspended");
    assert_eq!(v["stats"]["suspends"], 1);
    assert_eq!(v["stats"]["evicted_bytes"], 4 << 20);
    ok(&f, &["set", "vgpu1", "--memory", "512MiB"]);
    assert_eq!(ok(&f, &["resume", "vgpu0"]), "vgpu0: running\n");
    let used = g
        .wait_used(0, std::time::Duration::from_secs(30))
        .expect("the waiting fill ran");
    assert_eq!(used.completion().status, abi);
    let sg = g.alloc_sg(&[4 << 20]);
    assert_eq!(g.copy_from_device(0, a, &sg).status, abi);
    assert!(g
        .read_sg(&sg)
        .chunks_exact(4)
        .all(|w| w == 0x0dd_ba11u32.to_le_bytes()));
    let e = fails(&f, &["resume", "vgpu0"]);
    assert!(e.contains("is not suspended"), "{e}");
    // Destroying a suspended vGPU frees it, as any.
    ok(&f, &["suspend", "vgpu1"]);
    ok(&f, &["destroy", "vgpu1"]);
    let gpus: Value = serde_json::from_str(&ok(&f, &["--json", "gpus"])).unwrap();
    assert_eq!(gpus[0]["memory_allocated_bytes"], 512 << 20, "{gpus}");
}

#[test]
fn test_set_memory_resizes_a_running_vgpu() {
    let f = fixture();
    let config = |name: &str| f.daemon.lock().unwrap().instance(name).unwrap().config;
    let socket = f.dir.as_path().join("vgpu0.sock");
    let mut g = Guest::connect(&socket, GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    let abi = vgpu_testkit::abi::REG_MEM_SIZE;
    let a = g.device_alloc(0, 400 << 20);
    // The built-in GPU has 2 GiB, two vGPUs of 512 MiB.
    let out = ok(&f, &["set", "vgpu0", "--memory", "1GiB"]);
    assert!(out.starts_with("vgpu0: memory 1GiB,"), "{out}");
    assert_eq!(g.read64(abi), 1 << 30);
    let b = g.device_alloc(0, 600 << 20);
    let e = fails(&f, &["set", "vgpu0", "--memory", "2GiB"]);
    assert!(e.contains("does not fit") && e.contains("HTTP 409"), "{e}");
    let e = fails(&f, &["set", "vgpu0", "--memory", "512MiB"]);
    assert!(e.contains("cannot shrink") && e.contains("HTTP 409"), "{e}");
    // A refusal of one change refuses the others with it.
    let e = fails(&f, &["set", "vgpu0", "--memory", "768MiB", "--weight", "0"]);
    assert!(e.contains("weight") && e.contains("HTTP 400"), "{e}");
    let e = fails(&f, &["set", "vgpu0", "--memory", "0"]);
    assert!(e.contains("memory") && e.contains("HTTP 400"), "{e}");
    assert_eq!(config("vgpu0").memory.0, 1 << 30);
    assert_eq!(g.read64(abi), 1 << 30);
    assert_eq!(g.mem_free(0, b).status, vgpu_testkit::abi::STATUS_OK);
    ok(&f, &["set", "vgpu0", "--memory", "400MiB"]);
    assert_eq!(g.read64(abi), 400 << 20);
    assert_eq!(
        g.mem_alloc(0, 4096, 0).status,
        vgpu_testkit::abi::STATUS_NO_MEMORY
    );
    // What it gave back is there for the other vGPU; a stopped one
    // resizes too, and starts with its new size.
    ok(&f, &["stop", "vgpu1"]);
    ok(&f, &["set", "vgpu1", "--memory", "1636MiB"]);
    ok(&f, &["start", "vgpu1"]);
    let mut g1 = Guest::connect(&f.dir.as_path().join("vgpu1.sock"), GuestOptions::default());
    assert_eq!(g1.read64(abi), 1636 << 20);
    let gpus = ok(&f, &["gpus"]);
    assert!(gpus.contains("2GiB"), "{gpus}");
    assert_eq!(g.mem_free(0, a).status, vgpu_testkit::abi::STATUS_OK);
    // And the rest of the life cycle.
    let e = fails(
        &f,
        &[
            "create",
            "--name",
            "v2",
            "--gpu",
            "gpu0",
            "--socket",
            "v2.sock",
            "--memory",
            "256MiB",
            "--compute-units",
            "1",
        ],
    );
    assert!(e.contains("does not fit"), "{e}");
    ok(&f, &["destroy", "vgpu1"]);
    let out = ok(
        &f,
        &[
            "create",
            "--name",
            "v2",
            "--gpu",
            "gpu0",
            "--socket",
            "v2.sock",
            "--memory",
            "256MiB",
            "--compute-units",
            "1",
            "--weight",
            "2",
            "--priority",
            "-1",
            "--queues",
            "2",
        ],
    );
    assert!(out.contains("created v2"), "{out}");
    let c = config("v2");
    assert_eq!(
        (c.memory.0, c.weight, c.priority, c.queues),
        (256 << 20, 2, -1, 2)
    );
    let show = ok(&f, &["show", "v2"]);
    assert!(show.contains("memory:        256MiB"), "{show}");
    assert!(show.contains("memory used:   0B of 256MiB"), "{show}");
}

#[test]
fn test_stats() {
    let f = fixture();
    let out = ok(&f, &["stats"]);
    assert!(out.starts_with("GPU "), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("gpu0 ") && l.contains("software")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("VGPU ") && l.contains("WAIT P99")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("vgpu1 ") && l.contains("512MiB")),
        "{out}"
    );
    let json: Value = serde_json::from_str(&ok(&f, &["stats", "--json"])).unwrap();
    assert_eq!(json["vgpus"].as_array().unwrap().len(), 2);
    assert_eq!(json["gpus"][0]["backend"], "software");
    let gpus = ok(&f, &["gpus"]);
    assert!(
        gpus.lines()
            .any(|l| l.starts_with("gpu0 ") && l.contains("vgpu0,vgpu1")),
        "{gpus}"
    );
}

#[test]
fn test_top_once() {
    let f = fixture();
    // A guest keeps vgpu0 busy while top measures.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let load = {
        let socket = f.dir.as_path().join("vgpu0.sock");
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut g = Guest::connect(&socket, GuestOptions::default());
            g.setup_queue(0, 64, Mode::Interrupt);
            let a = g.device_alloc(0, 1 << 20);
            ready_tx.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                g.fill(0, a, 1 << 20, 0xabcd);
            }
        })
    };
    ready_rx.recv().unwrap();
    let out = ok(&f, &["top", "--once", "--interval", "0.3"]);
    assert!(!out.contains('\x1b'), "--once does not clear the screen");
    assert!(
        out.lines()
            .any(|l| l.starts_with("VGPU ") && l.contains("UTIL")),
        "{out}"
    );
    let line = out.lines().find(|l| l.starts_with("vgpu0 ")).expect(&out);
    assert!(line.contains("1MiB") && line.contains("512MiB"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("vgpu1 ")), "{out}");
    let json: Value =
        serde_json::from_str(&ok(&f, &["--json", "top", "--once", "--interval", "0.3"])).unwrap();
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let v0 = &json["vgpus"][0];
    assert_eq!(v0["name"], "vgpu0");
    assert!(v0["commands_per_second"].as_f64().unwrap() > 0.0, "{json}");
    assert!(v0["utilization"].as_f64().unwrap() > 0.0, "{json}");
    assert_eq!(v0["memory_used_bytes"], 1 << 20);
    assert_eq!(json["vgpus"][1]["commands_per_second"], 0.0);
    assert!(
        json["gpus"][0]["utilization"].as_f64().unwrap() > 0.0,
        "{json}"
    );
}

#[test]
fn test_stop_and_start() {
    let f = fixture();
    let socket = f.dir.as_path().join("vgpu0.sock");
    assert_eq!(ok(&f, &["stop", "vgpu0"]), "vgpu0: stopped\n");
    assert!(!socket.exists());
    let list = ok(&f, &["list"]);
    assert!(list.lines().next().unwrap().contains("STATE"), "{list}");
    let line = |name: &str| {
        list.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{list}"))
            .split_whitespace()
            .nth(2)
            .unwrap()
            .to_string()
    };
    assert_eq!(line("vgpu0 "), "stopped");
    assert_eq!(line("vgpu1 "), "running");
    assert!(ok(&f, &["show", "vgpu0"]).contains("state:         stopped"));
    let stats = ok(&f, &["stats"]);
    assert!(
        stats
            .lines()
            .any(|l| l.starts_with("vgpu0 ") && l.contains(" stopped ")),
        "{stats}"
    );
    let e = fails(&f, &["stop", "vgpu0"]);
    assert!(
        e.contains("already stopped") && e.contains("HTTP 409"),
        "{e}"
    );
    let e = fails(&f, &["start", "nope"]);
    assert!(
        e.contains("no vGPU named \"nope\"") && e.contains("404"),
        "{e}"
    );
    let json: Value = serde_json::from_str(&ok(&f, &["--json", "start", "vgpu0"])).unwrap();
    assert_eq!(json["state"], "running");
    assert!(socket.exists());
    let e = fails(&f, &["start", "vgpu0"]);
    assert!(
        e.contains("already running") && e.contains("HTTP 409"),
        "{e}"
    );
    // The started function works.
    let mut g = Guest::connect(&socket, GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_eq!(g.nop(0).status, vgpu_testkit::abi::STATUS_OK);
}
