//! The real `vgpud` binary under its strict seccomp filter (and, when the
//! tests run as root, switched to `nobody`) serving guests, the
//! management API and metrics: the filter allows every path the daemon
//! takes, and the daemon is confined while it does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use vgpu_testkit::abi;
use vgpu_testkit::{Guest, GuestOptions, Mode};
use vmm_sys_util::tempdir::TempDir;

const MIB: u64 = 1 << 20;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A running daemon, its log lines and its directory.
struct Daemon {
    child: Child,
    log: Receiver<String>,
    lines: Vec<String>,
    run: PathBuf,
    _dir: TempDir,
}

impl Daemon {
    /// Starts `vgpud run` with `daemon` (more `[daemon]` lines), `gpu` (a
    /// `[[gpu]]` table named gpu0) and two vGPUs on it, metrics on a free
    /// loopback port, and `args`.
    fn start(daemon: &str, gpu: &str, args: &[&str]) -> Daemon {
        let dir = TempDir::new_with_prefix("/tmp/vgpud-confine-").unwrap();
        // A user the daemon switches to must reach the runtime directory.
        std::fs::set_permissions(dir.as_path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let run = dir.as_path().join("run");
        let config = dir.as_path().join("vgpud.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[daemon]
runtime_dir = "{}"
metrics_address = "127.0.0.1:0"
{daemon}

{gpu}

[[vgpu]]
name = "vgpu0"
gpu = "gpu0"
socket = "vgpu0.sock"
memory = "256MiB"
compute_units = 2

[[vgpu]]
name = "vgpu1"
gpu = "gpu0"
socket = "vgpu1.sock"
memory = "256MiB"
compute_units = 1
"#,
                run.display(),
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("vgpud: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Daemon {
            child,
            log,
            lines: Vec::new(),
            run,
            _dir: dir,
        }
    }

    /// Waits for a log line containing `what` and returns it; panics with
    /// the log if the daemon exits or the line does not come.
    fn wait_log(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        if let Some(l) = self.lines.iter().find(|l| l.contains(what)) {
            return l.clone();
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.lines.push(line.clone());
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        // The log ends when the daemon dies: give it a moment to be reaped
        // so that the message says how it ended (SIGSYS: a call the
        // filter refused).
        let mut status = None;
        for _ in 0..50 {
            status = self.child.try_wait().unwrap();
            if status.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "no log line with {what:?} (exit: {status:?}):\n{}",
            self.lines.join("\n")
        );
    }

    /// Collects the rest of the log after the daemon exited.
    fn drain_log(&mut self) {
        while let Ok(line) = self.log.recv_timeout(Duration::from_secs(5)) {
            self.lines.push(line);
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.run.join(name)
    }

    fn status(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap()
    }

    /// Sends SIGTERM and waits for the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill sends a signal to the child we started and have
        // not reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.drain_log();
                return s;
            }
            assert!(Instant::now() < deadline, "vgpud ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
}

/// Each thread of process `pid`: its name and how many seccomp filters
/// it carries.
fn thread_filters(pid: u32) -> Vec<(String, u32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| {
            let t = t.ok()?.path();
            let name = std::fs::read_to_string(t.join("comm")).ok()?;
            let status = std::fs::read_to_string(t.join("status")).ok()?;
            let filters = status_field(&status, "Seccomp_filters").parse().ok()?;
            Some((name.trim().to_string(), filters))
        })
        .collect()
}

/// One HTTP request on the API socket: status and body.
fn api(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = body.unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let json = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim())
        .filter(|b| !b.is_empty())
        .map(|b| serde_json::from_str(b).unwrap())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

fn metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    resp
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn ok(c: abi::Completion) {
    assert_eq!(c.status, abi::STATUS_OK, "{c:?}");
}

/// Everything a guest does through its VMM: queues in both modes,
/// allocations, copies each way, fills, built-in kernels (on the
/// software backend's threads), the window, DMA unmap and map with an
/// fd, resets, a second client held back, disconnect and reconnect.
fn exercise_guest(socket: &Path, seed: u64) {
    let mut rng = Rng(seed);
    let mut g = Guest::connect(socket, GuestOptions::default());
    g.setup_queue(0, 64, Mode::Interrupt);
    g.setup_queue(1, 64, Mode::Polled);
    // A second VMM on the same socket waits (neither answered nor
    // closed) while the first carries on.
    {
        let mut other = UnixStream::connect(socket).unwrap();
        other
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 1];
        let held = other.read(&mut b);
        assert!(
            matches!(&held, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
            "a second VMM must wait: {held:?}"
        );
    }
    let size = 1 << 20;
    let n = size / 4;
    let x = g.device_alloc(0, size);
    let y = g.device_alloc(1, size);
    let data = rng.bytes(size as usize);
    g.upload(0, x, &data);
    assert_eq!(g.download(1, x, size as usize), data);
    ok(g.fill(0, y, size, 0x3f80_0000)); // 1.0f32 everywhere
    let p = abi::SaxpyParams {
        y,
        x: g.device_alloc(0, size),
        n,
        a: 2.0,
        reserved: 0,
    };
    ok(g.fill(0, p.x, size, 0x4000_0000)); // 2.0f32
    ok(g.launch(0, "saxpy_f32", &p));
    let out = g.download(0, y, size as usize);
    assert!(out
        .chunks(4)
        .all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 5.0));
    let c = abi::CopyParams {
        dst: y,
        src: x,
        bytes: size,
    };
    ok(g.launch(1, "copy", &c));
    ok(g.copy_device_to_device(0, p.x, y, size));
    assert_eq!(g.download(0, p.x, size as usize), data);
    g.window_write(0, &data[..64 << 10]);
    ok(g.copy_window_to_device(0, 0, x, 64 << 10));
    ok(g.copy_device_to_window(0, x, 128 << 10, 64 << 10));
    assert_eq!(g.window_read(128 << 10, 64 << 10), data[..64 << 10]);
    // DMA unmap and map again (with the RAM's fd), then use it.
    g.unmap_ram();
    g.map_ram();
    g.forget_queues();
    g.control_reset();
    g.enable_device();
    g.setup_queue(0, 16, Mode::Interrupt);
    ok(g.nop(0));
    g.device_reset();
    g.enable_device();
    g.setup_queue(0, 16, Mode::Interrupt);
    ok(g.nop(0));
    drop(g);
    // The next VMM finds the device as new.
    let mut g = Guest::connect(socket, GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    ok(g.nop(0));
    assert_eq!(g.mem_used(), 0);
}

/// The management API through its socket: list, create a vGPU (a new
/// socket and serving threads), use it, remove it.
fn exercise_api(d: &Daemon, socket_gid: Option<u32>) {
    let sock = d.path("api.sock");
    let (s, list) = api(&sock, "GET", "/api/v1/vgpus", None);
    assert_eq!(s, 200, "{list}");
    assert_eq!(list.as_array().unwrap().len(), 2);
    let body = serde_json::json!({
        "name": "extra", "gpu": "gpu0", "socket": "extra.sock",
        "memory": 64 * MIB, "compute_units": 1,
    })
    .to_string();
    let (s, v) = api(&sock, "PUT", "/api/v1/vgpus", Some(&body));
    assert_eq!(s, 201, "{v}");
    let extra = d.path("extra.sock");
    if let Some(gid) = socket_gid {
        let m = std::fs::metadata(&extra).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o777), (gid, 0o660));
    }
    {
        let mut g = Guest::connect(&extra, GuestOptions::default());
        g.setup_queue(0, 16, Mode::Interrupt);
        let a = g.device_alloc(0, MIB);
        ok(g.fill(0, a, MIB, 7));
        ok(g.nop(0));
    }
    let (s, v) = api(&sock, "GET", "/api/v1/vgpus/extra", None);
    assert_eq!(s, 200, "{v}");
    assert!(v["stats"]["commands"].as_u64().unwrap() >= 2, "{v}");
    let (s, _) = api(&sock, "DELETE", "/api/v1/vgpus/extra", None);
    assert_eq!(s, 204);
    assert!(!extra.exists());
    let (s, v) = api(
        &sock,
        "PATCH",
        "/api/v1/vgpus/vgpu1",
        Some(r#"{"weight": 3}"#),
    );
    assert_eq!(s, 200, "{v}");
    let (s, gpus) = api(&sock, "GET", "/api/v1/gpus", None);
    assert_eq!(s, 200, "{gpus}");
    let (s, _) = api(&sock, "GET", "/api/v1/nothing", None);
    assert_eq!(s, 404);
}

/// Runs the whole scenario against a daemon started with `args`, then
/// stops it with SIGTERM: it must exit 0, remove its sockets and log no
/// error.
/// Who the daemon should run as once started, and which group its vGPU
/// sockets should have (`None`: the sockets are private to the user).
struct Expect {
    uid: u32,
    socket_gid: Option<u32>,
}

fn serve_everything(daemon: &str, gpu: &str, args: &[&str], expect: Option<Expect>) {
    let mut d = Daemon::start(daemon, gpu, args);
    let line = d.wait_log("metrics at http://");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap()
        .to_string();
    d.wait_log("API listening on");

    let status = d.status();
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    assert_eq!(status_field(&status, "Seccomp"), "2", "filter mode");
    // The process-wide filter pair on every thread.
    assert!(
        status_field(&status, "Seccomp_filters")
            .parse::<u32>()
            .unwrap()
            >= 2
    );
    assert_eq!(status_field(&status, "CapEff"), "0000000000000000");
    assert_eq!(status_field(&status, "CapPrm"), "0000000000000000");
    if let Some(e) = &expect {
        let uid = e.uid;
        let want = format!("{uid}\t{uid}\t{uid}\t{uid}");
        assert_eq!(status_field(&status, "Uid"), want);
        let api = std::fs::metadata(d.path("api.sock")).unwrap();
        assert_eq!((api.uid(), api.mode() & 0o777), (uid, 0o600));
        let vgpu = std::fs::metadata(d.path("vgpu0.sock")).unwrap();
        let got = (vgpu.uid(), vgpu.mode() & 0o777);
        match e.socket_gid {
            Some(gid) => assert_eq!((got, vgpu.gid()), ((uid, 0o660), gid)),
            None => assert_eq!(got, (uid, 0o600)),
        }
        assert_eq!(std::fs::metadata(&d.run).unwrap().uid(), uid);
    }

    let (a, b) = (d.path("vgpu0.sock"), d.path("vgpu1.sock"));
    let t = std::thread::spawn(move || exercise_guest(&b, 2));
    exercise_guest(&a, 1);
    t.join().unwrap();
    exercise_api(&d, expect.as_ref().and_then(|e| e.socket_gid));
    let m = metrics(&addr);
    assert!(
        m.contains("vgpud_vgpu_commands_total{vgpu=\"vgpu0\",gpu=\"gpu0\"}"),
        "{m}"
    );
    assert!(d.child.try_wait().unwrap().is_none(), "vgpud died");
    // Threads with a narrower job carry more filters than the process.
    let base: u32 = status_field(&d.status(), "Seccomp_filters")
        .parse()
        .unwrap();
    for (thread, filters) in thread_filters(d.child.id()) {
        let narrowed =
            thread.starts_with("vfio-") || thread.starts_with("metrics") || thread == "signals";
        if narrowed {
            assert!(
                filters > base,
                "{thread}: {filters} filters, process {base}"
            );
        }
    }
    let names: Vec<String> = thread_filters(d.child.id())
        .into_iter()
        .map(|t| t.0)
        .collect();
    for t in ["vfio-vgpu0", "vfio-vgpu1", "metrics", "signals"] {
        assert!(names.iter().any(|n| n == t), "no thread {t} in {names:?}");
    }

    let code = d.terminate();
    assert!(code.success(), "{code:?}\n{}", d.lines.join("\n"));
    for s in ["api.sock", "vgpu0.sock", "vgpu1.sock"] {
        assert!(!d.path(s).exists(), "{s} left behind");
    }
    let log = d.lines.join("\n");
    assert!(log.contains("stopped"), "{log}");
    assert!(
        !log.contains("panicked") && !log.contains(" ERROR "),
        "{log}"
    );
}

const SOFTWARE_GPU: &str = r#"
[[gpu]]
name = "gpu0"
backend = "software"
memory = "1GiB"
compute_units = 4
"#;

#[test]
fn test_strict_filter_serves_guests_api_and_metrics() {
    if is_root() {
        // Root must say what it wants; this run keeps root (without
        // capabilities) and the strict filter.
        let root = Expect {
            uid: 0,
            socket_gid: None,
        };
        let args = ["--seccomp", "strict", "--allow-root"];
        serve_everything("", SOFTWARE_GPU, &args, Some(root));
    } else {
        serve_everything("", SOFTWARE_GPU, &["--seccomp", "strict"], None);
    }
}

#[test]
fn test_root_drops_to_an_unprivileged_user() {
    if !is_root() {
        vgpu_testkit::skip("not root (the switch to another user needs root)");
        return;
    }
    // Its primary group gets the vGPU sockets, as a VMMs' group would.
    let nobody = vgpud::confine::lookup_user("nobody").expect("a user named nobody");
    let group = group_name(nobody.gid);
    let expect = Expect {
        uid: nobody.uid,
        socket_gid: Some(nobody.gid),
    };
    serve_everything(
        &format!("socket_group = \"{group}\""),
        SOFTWARE_GPU,
        &["--user", "nobody"],
        Some(expect),
    );
}

/// The name of group `gid`, from /etc/group.
fn group_name(gid: u32) -> String {
    let groups = std::fs::read_to_string("/etc/group").unwrap();
    groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == gid.to_string()).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| panic!("no group {gid} in /etc/group"))
}

/// The CUDA backend under its looser filter (the driver opens device
/// nodes and maps the JIT compiler when a vGPU's context is made, which
/// happens after the filter is in place), switched to `nobody` when run
/// as root.
#[test]
fn test_strict_gpu_host_filter_serves_a_cuda_guest() {
    if let Err(why) = vgpu_backend_cuda::cuda_available() {
        assert!(
            std::env::var_os("VGPU_REQUIRE_GPU").is_none_or(|v| v != "1"),
            "VGPU_REQUIRE_GPU=1 but {why}"
        );
        vgpu_testkit::skip(&format!("no CUDA driver ({why})"));
        return;
    }
    let gpu = "[[gpu]]\nname = \"gpu0\"\nbackend = \"cuda\"\n";
    if is_root() {
        let nobody = vgpud::confine::lookup_user("nobody").expect("a user named nobody");
        let expect = Expect {
            uid: nobody.uid,
            socket_gid: None,
        };
        serve_everything("", gpu, &["--user", "nobody"], Some(expect));
    } else {
        serve_everything("", gpu, &["--seccomp", "strict"], None);
    }
}

#[test]
fn test_start_as_root_or_another_user_needs_consent() {
    let mut d = Daemon::start("", SOFTWARE_GPU, &["--seccomp", "strict"]);
    if is_root() {
        let e = d.wait_log("refusing to run as root");
        assert!(e.contains("--user") && e.contains("--allow-root"), "{e}");
    } else {
        drop(d);
        d = Daemon::start("", SOFTWARE_GPU, &["--user", "root"]);
        d.wait_log("cannot become user root");
    }
    let s = d.child.wait().unwrap();
    assert!(!s.success());
    assert!(!d.path("api.sock").exists());
}

/// (pid, parent pid, command line) of every process.
fn processes() -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok())
        else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        out.push((pid, ppid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
    }
    out
}

/// The daemon's partition host launchers and the hosts they run
/// (zombies included), by pid.
fn launcher_and_hosts(daemon: u32) -> (Vec<u32>, Vec<u32>) {
    let all = processes();
    let launchers: Vec<u32> = all
        .iter()
        .filter(|p| p.1 == daemon && p.2.contains(" --launcher "))
        .map(|p| p.0)
        .collect();
    let hosts = all
        .iter()
        .filter(|p| launchers.contains(&p.1))
        .map(|p| p.0)
        .collect();
    (launchers, hosts)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

/// Waits until the daemon's launcher runs `n` hosts, and returns them.
fn wait_hosts(d: &Daemon, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, hosts) = launcher_and_hosts(d.child.id());
        let live: Vec<u32> = hosts.into_iter().filter(|&p| alive(p)).collect();
        if live.len() == n {
            return live;
        }
        assert!(
            Instant::now() < deadline,
            "{} hosts, {n} expected: {live:?}",
            live.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A launcher or host runs as `uid`, with no capability and no new
/// privileges; a host under its filter.
fn check_confined(pid: u32, uid: u32, host: bool) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let want = format!("{uid}\t{uid}\t{uid}\t{uid}");
    assert_eq!(status_field(&status, "Uid"), want, "{pid}");
    for cap in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
        assert_eq!(status_field(&status, cap), "0000000000000000", "{pid}");
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{pid}");
    if host {
        assert_eq!(status_field(&status, "Seccomp"), "2", "{pid}: filter mode");
    }
}

/// `isolation = "process"` under the strict filter: the daemon cannot
/// create processes, so its launcher starts hosts for the vGPUs of the
/// configuration, for one created through the API, and again after a
/// host was killed and the guest reset the function. The daemon survives
/// all of it and leaves no process behind. As root, the daemon and its
/// hosts switch to nobody.
#[test]
fn test_strict_filter_with_process_isolated_partitions() {
    if is_root() {
        let nobody = vgpud::confine::lookup_user("nobody").expect("a user named nobody");
        process_isolated(&["--seccomp", "strict", "--user", "nobody"], nobody.uid);
    } else {
        // SAFETY: getuid cannot fail.
        process_isolated(&["--seccomp", "strict"], unsafe { libc::getuid() });
    }
}

/// Root kept on purpose: hosts keep root's ids, without capabilities.
#[test]
fn test_hosts_of_a_root_daemon_have_no_capabilities() {
    if !is_root() {
        vgpu_testkit::skip("not root");
        return;
    }
    process_isolated(&["--seccomp", "strict", "--allow-root"], 0);
}

fn process_isolated(args: &[&str], uid: u32) {
    let vgpud = PathBuf::from(env!("CARGO_BIN_EXE_vgpud"));
    let host = vgpud.with_file_name("vgpu-partition-host");
    assert!(
        host.is_file(),
        "{} is missing: build it (cargo build -p vgpu-partition-host)",
        host.display()
    );
    let gpu = format!(
        "{SOFTWARE_GPU}isolation = \"process\"\npartition_host = \"{}\"\n",
        host.display()
    );
    let mut d = Daemon::start("", &gpu, args);
    d.wait_log("API listening on");
    let status = d.status();
    assert_eq!(status_field(&status, "Seccomp"), "2", "filter mode");
    let (launchers, _) = launcher_and_hosts(d.child.id());
    assert_eq!(launchers.len(), 1, "one launcher per GPU");
    check_confined(launchers[0], uid, false);
    let first = wait_hosts(&d, 2);
    for &h in &first {
        check_confined(h, uid, true);
    }

    // Guests on the configured vGPUs.
    let (a, b) = (d.path("vgpu0.sock"), d.path("vgpu1.sock"));
    let t = std::thread::spawn(move || exercise_guest(&b, 2));
    exercise_guest(&a, 1);
    t.join().unwrap();

    // A vGPU created at run time gets a host of its own.
    let sock = d.path("api.sock");
    let body = serde_json::json!({
        "name": "extra", "gpu": "gpu0", "socket": "extra.sock",
        "memory": 64 * MIB, "compute_units": 1,
    })
    .to_string();
    let (s, v) = api(&sock, "PUT", "/api/v1/vgpus", Some(&body));
    assert_eq!(s, 201, "{v}");
    let now = wait_hosts(&d, 3);
    let extra_host: Vec<u32> = now.iter().copied().filter(|p| !first.contains(p)).collect();
    assert_eq!(extra_host.len(), 1, "{now:?} after {first:?}");
    let extra_host = extra_host[0];
    check_confined(extra_host, uid, true);
    let mut g = Guest::connect(&d.path("extra.sock"), GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    let x = g.device_alloc(0, MIB);
    ok(g.fill(0, x, MIB, 7));
    assert!(g
        .download(0, x, 4096)
        .chunks(4)
        .all(|w| w == 7u32.to_le_bytes()));

    // Its host killed: that vGPU reports a device error, the others and
    // the daemon carry on.
    // SAFETY: kill(2) of a process of this test's daemon.
    assert_eq!(unsafe { libc::kill(extra_host as i32, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    while alive(extra_host) {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = g.mem_alloc(0, 4096, 0);
    assert_eq!(c.status, abi::STATUS_DEVICE_ERROR, "{c:?}");
    ok(g.nop(0));
    // A reset starts a new host, and the vGPU works again.
    g.device_reset();
    g.enable_device();
    g.setup_queue(0, 16, Mode::Interrupt);
    let x = g.device_alloc(0, MIB);
    ok(g.fill(0, x, MIB, 9));
    assert!(g
        .download(0, x, 4096)
        .chunks(4)
        .all(|w| w == 9u32.to_le_bytes()));
    let after = wait_hosts(&d, 3);
    let respawned: Vec<u32> = after.iter().copied().filter(|p| !now.contains(p)).collect();
    assert_eq!(respawned.len(), 1, "{after:?} after {now:?}");
    check_confined(respawned[0], uid, true);
    drop(g);
    {
        let mut g = Guest::connect(&d.path("vgpu0.sock"), GuestOptions::default());
        g.setup_queue(0, 16, Mode::Interrupt);
        let x = g.device_alloc(0, MIB);
        ok(g.fill(0, x, MIB, 3));
    }
    let (s, _) = api(&sock, "DELETE", "/api/v1/vgpus/extra", None);
    assert_eq!(s, 204);
    wait_hosts(&d, 2);
    assert!(d.child.try_wait().unwrap().is_none(), "vgpud died");

    let (launchers, hosts) = launcher_and_hosts(d.child.id());
    let code = d.terminate();
    assert!(code.success(), "{code:?}\n{}", d.lines.join("\n"));
    for p in launchers.iter().chain(&hosts) {
        assert!(!alive(*p), "process {p} left behind");
    }
    let log = d.lines.join("\n");
    assert!(log.contains("stopped"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
