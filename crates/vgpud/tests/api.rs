//! The management API and the metrics endpoint, driven over their real
//! sockets against a daemon on the software backend.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vgpu_testkit::{Guest, GuestOptions, Mode};
use vgpud::api::ApiServer;
use vgpud::config::Config;
use vgpud::daemon::Daemon;
use vgpud::metrics::MetricsServer;
use vmm_sys_util::tempdir::TempDir;

const MIB: u64 = 1 << 20;

struct Fixture {
    api: ApiServer,
    daemon: Arc<Mutex<Daemon>>,
    sock: PathBuf,
    dir: TempDir,
}

impl Fixture {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.as_path().join(name)
    }
}

/// A 1 GiB software GPU with 8 compute units; vgpu0 (256 MiB) and vgpu1
/// (512 MiB) leave 256 MiB free.
fn fixture() -> Fixture {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-api-").unwrap();
    let text = format!(
        r#"
[daemon]
runtime_dir = "{}"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "software"
memory = "1GiB"
compute_units = 8

[[vgpu]]
name = "vgpu0"
gpu = "gpu0"
socket = "vgpu0.sock"
memory = "256MiB"
compute_units = 1

[[vgpu]]
name = "vgpu1"
gpu = "gpu0"
socket = "vgpu1.sock"
memory = "512MiB"
compute_units = 1
"#,
        dir.as_path().display()
    );
    let config = Config::parse(&text, "test.toml").unwrap();
    let sock = config.api_socket_path();
    assert_eq!(sock, dir.as_path().join("api.sock"));
    let mut d = Daemon::new(config).unwrap();
    d.start_all().unwrap();
    let daemon = Arc::new(Mutex::new(d));
    let api = ApiServer::start(&sock, daemon.clone()).unwrap();
    Fixture {
        api,
        daemon,
        sock,
        dir,
    }
}

/// Sends raw bytes (then, with `close`, ends the stream) and reads the
/// whole response: status, head, body.
fn raw_opts(sock: &Path, bytes: &[u8], close: bool) -> (u16, String, Vec<u8>) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The server may answer and close before it has read everything.
    let _ = s.write_all(bytes);
    if close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&resp)));
    let head = String::from_utf8(resp[..end].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    assert!(head.contains("\r\nConnection: close"), "{head}");
    (status, head, resp[end + 4..].to_vec())
}

fn raw(sock: &Path, bytes: &[u8]) -> (u16, String, Vec<u8>) {
    raw_opts(sock, bytes, false)
}

fn request(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String, Value) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    if let Some(b) = body {
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or_default());
    let (status, head, body) = raw(sock, req.as_bytes());
    let value = if body.is_empty() {
        Value::Null
    } else {
        assert!(head.contains("Content-Type: application/json"), "{head}");
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)))
    };
    (status, head, value)
}

fn call(f: &Fixture, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, _, v) = request(&f.sock, method, path, body);
    (status, v)
}

/// Asserts a refusal: its status and a reason containing `needle`.
#[track_caller]
fn refused(f: &Fixture, method: &str, path: &str, body: Option<&str>, status: u16, needle: &str) {
    let (s, v) = call(f, method, path, body);
    assert_eq!(s, status, "{method} {path} {body:?}: {v}");
    let e = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {v}"));
    assert!(e.contains(needle), "{e:?} does not mention {needle:?}");
}

/// What the daemon runs and has allocated (without time-dependent figures).
fn state(f: &Fixture) -> Value {
    let (s, list) = call(f, "GET", "/api/v1/vgpus", None);
    assert_eq!(s, 200);
    let (s, mut gpus) = call(f, "GET", "/api/v1/gpus", None);
    assert_eq!(s, 200);
    for g in gpus.as_array_mut().unwrap() {
        g.as_object_mut().unwrap().remove("stats");
    }
    json!({"vgpus": list, "gpus": gpus})
}

fn vgpu_body(name: &str, memory: &str) -> String {
    json!({
        "name": name,
        "gpu": "gpu0",
        "socket": format!("{name}.sock"),
        "memory": memory,
        "compute_units": 1,
    })
    .to_string()
}

#[test]
fn test_read_endpoints() {
    let f = fixture();
    let (s, list) = call(&f, "GET", "/api/v1/vgpus", None);
    assert_eq!(s, 200);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["name"], "vgpu0");
    assert_eq!(list[0]["config"]["memory"], 256 * MIB);
    assert_eq!(list[0]["config"]["weight"], 1);
    assert_eq!(list[0]["config"]["cap"], Value::Null);
    assert_eq!(
        list[1]["socket_path"],
        f.path("vgpu1.sock").to_str().unwrap()
    );

    let (s, v) = call(&f, "GET", "/api/v1/vgpus/vgpu1", None);
    assert_eq!(s, 200);
    assert_eq!(v["config"]["memory"], 512 * MIB);
    assert_eq!(v["stats"]["memory_quota_bytes"], 512 * MIB);
    assert_eq!(v["stats"]["memory_used_bytes"], 0);
    assert_eq!(v["stats"]["commands"], 0);
    refused(
        &f,
        "GET",
        "/api/v1/vgpus/nope",
        None,
        404,
        "no vGPU named \"nope\"",
    );

    let (s, gpus) = call(&f, "GET", "/api/v1/gpus", None);
    assert_eq!(s, 200);
    let g = &gpus[0];
    assert_eq!(g["name"], "gpu0");
    assert_eq!(g["backend"], "software");
    assert_eq!(g["policy"], "fair");
    assert_eq!(g["memory_bytes"], 1024 * MIB);
    assert_eq!(g["memory_allocated_bytes"], 768 * MIB);
    assert_eq!(g["memory_free_bytes"], 256 * MIB);
    assert_eq!(g["compute_units_allocated"], 2);
    assert_eq!(g["vgpus"], json!(["vgpu0", "vgpu1"]));

    let (s, st) = call(&f, "GET", "/api/v1/stats", None);
    assert_eq!(s, 200);
    assert_eq!(st["gpus"][0]["name"], "gpu0");
    assert!(st["gpus"][0]["utilization"].is_number());
    let names: Vec<&str> = st["vgpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vgpu0", "vgpu1"]);
    for key in [
        "memory_used_bytes",
        "memory_peak_bytes",
        "busy_seconds",
        "bytes",
        "queue_wait_p50_seconds",
        "queue_wait_p99_seconds",
        "capped",
        "faults",
        "errors",
        "resets",
    ] {
        assert!(st["vgpus"][0][key].is_number(), "{key}");
    }
    // A query string does not change the route.
    assert_eq!(call(&f, "GET", "/api/v1/stats?x=1", None).0, 200);
}

#[test]
fn test_create_refusals_change_nothing() {
    let f = fixture();
    let before = state(&f);
    let put = |body: &str, status: u16, needle: &str| {
        refused(&f, "PUT", "/api/v1/vgpus", Some(body), status, needle);
        assert_eq!(
            state(&f),
            before,
            "a refused request changed something: {body}"
        );
    };
    // Does not fit: 512 MiB asked, 256 MiB left.
    put(&vgpu_body("big", "512MiB"), 409, "does not fit");
    assert!(!f.path("big.sock").exists());
    // Bad JSON, wrong types, unknown and missing fields.
    put("{", 400, "invalid request body");
    put("[]", 400, "invalid request body");
    put("", 400, "invalid request body");
    put("\"vgpu\"", 400, "invalid request body");
    let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
    v["colour"] = json!("red");
    put(&v.to_string(), 400, "unknown field `colour`");
    let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
    v.as_object_mut().unwrap().remove("compute_units");
    put(&v.to_string(), 400, "missing field `compute_units`");
    put(&vgpu_body("x", "lots"), 400, "invalid size");
    let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
    v["weight"] = json!(-1);
    put(&v.to_string(), 400, "invalid request body");
    // Values the configuration file would refuse.
    for (field, value, needle) in [
        ("weight", json!(0), "weight"),
        ("cap", json!(1.5), "cap"),
        ("cap", json!(0), "cap"),
        ("queues", json!(17), "queues"),
        ("window", json!(5000), "window"),
        ("compute_units", json!(0), "compute_units"),
        ("memory", json!(0), "memory"),
        ("name", json!("a/b"), "name"),
        ("name", json!(""), "name"),
    ] {
        let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
        v[field] = value;
        put(&v.to_string(), 400, needle);
    }
    let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
    v["gpu"] = json!("gpu9");
    put(&v.to_string(), 400, "no GPU named \"gpu9\"");
    // Conflicts: name, socket of another vGPU, the API socket, a file.
    put(&vgpu_body("vgpu0", "1MiB"), 409, "exists");
    let mut v: Value = serde_json::from_str(&vgpu_body("x", "1MiB")).unwrap();
    v["socket"] = json!("vgpu1.sock");
    put(&v.to_string(), 409, "vGPU \"vgpu1\" has it");
    v["socket"] = json!(f.path("vgpu1.sock"));
    put(&v.to_string(), 409, "vGPU \"vgpu1\" has it");
    v["socket"] = json!("api.sock");
    put(&v.to_string(), 409, "API socket");
    std::fs::write(f.path("file"), b"data").unwrap();
    v["socket"] = json!("file");
    put(&v.to_string(), 409, "not a socket");
    assert_eq!(std::fs::read(f.path("file")).unwrap(), b"data");
    let _other = UnixListener::bind(f.path("taken.sock")).unwrap();
    v["socket"] = json!("taken.sock");
    put(&v.to_string(), 409, "another process");
}

#[test]
fn test_create_and_destroy_frees_capacity() {
    let f = fixture();
    // 128 MiB fits (256 MiB free); 512 MiB does not.
    let (s, head, v) = request(
        &f.sock,
        "PUT",
        "/api/v1/vgpus",
        Some(&vgpu_body("small", "128MiB")),
    );
    assert_eq!(s, 201, "{v}");
    assert!(head.contains("\r\nLocation: /api/v1/vgpus/small"), "{head}");
    assert_eq!(v["config"]["memory"], 128 * MIB);
    let socket = f.path("small.sock");
    assert_eq!(v["socket_path"], socket.to_str().unwrap());
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(call(&f, "GET", "/api/v1/vgpus/small", None).0, 200);
    // A created vGPU serves a guest.
    {
        let mut g = Guest::connect(&socket, GuestOptions::default());
        g.setup_queue(0, 16, Mode::Interrupt);
        assert_eq!(g.nop(0).status, vgpu_testkit::abi::STATUS_OK);
    }

    let big = vgpu_body("big", "512MiB");
    refused(&f, "PUT", "/api/v1/vgpus", Some(&big), 409, "does not fit");
    refused(
        &f,
        "DELETE",
        "/api/v1/vgpus/nope",
        None,
        404,
        "no vGPU named",
    );
    let (s, v) = call(&f, "DELETE", "/api/v1/vgpus/vgpu1", None);
    assert_eq!((s, v), (204, Value::Null));
    assert!(!f.path("vgpu1.sock").exists());
    refused(&f, "GET", "/api/v1/vgpus/vgpu1", None, 404, "no vGPU");
    refused(&f, "DELETE", "/api/v1/vgpus/vgpu1", None, 404, "no vGPU");
    let (_, gpus) = call(&f, "GET", "/api/v1/gpus", None);
    assert_eq!(gpus[0]["memory_free_bytes"], 640 * MIB);
    // Now it fits.
    let (s, v) = call(&f, "PUT", "/api/v1/vgpus", Some(&big));
    assert_eq!(s, 201, "{v}");
    assert!(f.path("big.sock").exists());
    let (_, list) = call(&f, "GET", "/api/v1/vgpus", None);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["big", "small", "vgpu0"]);
    // A name can be used again once its vGPU is gone, and the JSON of a
    // vGPU's configuration is accepted back as it is.
    let (_, v0) = call(&f, "GET", "/api/v1/vgpus/vgpu0", None);
    assert_eq!(call(&f, "DELETE", "/api/v1/vgpus/vgpu0", None).0, 204);
    let (s, again) = call(&f, "PUT", "/api/v1/vgpus", Some(&v0["config"].to_string()));
    assert_eq!(s, 201, "{again}");
    assert_eq!(again["config"], v0["config"]);
}

#[test]
fn test_patch() {
    let f = fixture();
    let path = "/api/v1/vgpus/vgpu0";
    let (s, v) = call(
        &f,
        "PATCH",
        path,
        Some(r#"{"weight": 5, "priority": -2, "cap": 0.5}"#),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["config"]["weight"], 5);
    assert_eq!(v["config"]["priority"], -2);
    assert_eq!(v["config"]["cap"], 0.5);
    {
        let d = f.daemon.lock().unwrap();
        let c = d.instance("vgpu0").unwrap().config;
        assert_eq!((c.weight, c.priority, c.cap), (5, -2, Some(0.5)));
    }
    // Only what is given changes; null removes the cap.
    let (s, v) = call(&f, "PATCH", path, Some(r#"{"cap": null}"#));
    assert_eq!(s, 200);
    assert_eq!(v["config"]["cap"], Value::Null);
    assert_eq!(v["config"]["weight"], 5);
    let (_, v) = call(&f, "PATCH", path, Some(r#"{"priority": 3}"#));
    assert_eq!(
        (
            v["config"]["priority"].clone(),
            v["config"]["weight"].clone()
        ),
        (json!(3), json!(5))
    );

    let before = state(&f);
    for (body, needle) in [
        (r#"{"weight": 0}"#, "weight"),
        (r#"{"cap": 2}"#, "cap"),
        (r#"{"cap": -0.5}"#, "cap"),
        (r#"{"cap": 0.5, "weight": 0}"#, "weight"),
        (r#"{"bogus": 1}"#, "unknown field `bogus`"),
        (r#"{"memory": 0}"#, "memory"),
        (r#"{"memory": "1GiB", "weight": 0}"#, "weight"),
        (r#"{"memory": "lots"}"#, "invalid request body"),
        (r#"{"weight": "heavy"}"#, "invalid request body"),
        (r#"{"weight": 4294967296}"#, "invalid request body"),
        (r#"{}"#, "nothing to change"),
        ("{", "invalid request body"),
        ("", "invalid request body"),
        ("\u{1}", "invalid request body"),
    ] {
        refused(&f, "PATCH", path, Some(body), 400, needle);
        assert_eq!(state(&f), before, "{body} changed something");
    }
    // A resize the GPU has no room for, or below what the guest holds,
    // is a conflict, and changes nothing either.
    refused(
        &f,
        "PATCH",
        path,
        Some(r#"{"memory": "8GiB"}"#),
        409,
        "does not fit",
    );
    assert_eq!(state(&f), before);
    // Non-UTF-8 bodies are refused too.
    let mut req =
        b"PATCH /api/v1/vgpus/vgpu0 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n".to_vec();
    req.extend_from_slice(b"{\xff}\n");
    assert_eq!(raw(&f.sock, &req).0, 400);
    refused(
        &f,
        "PATCH",
        "/api/v1/vgpus/nope",
        Some(r#"{"weight": 2}"#),
        404,
        "no vGPU",
    );
    assert_eq!(state(&f), before);
}

#[test]
fn test_routes_and_methods() {
    let f = fixture();
    for path in [
        "/",
        "/api",
        "/api/v1",
        "/api/v1/",
        "/api/v2/vgpus",
        "/api/v1/vgpu",
        "/api/v1/vgpus/",
        "/api/v1/vgpus/vgpu0/stats",
        "/api/v1//vgpus",
        "/api/v1/stats/",
        "/api/v1x/vgpus",
    ] {
        refused(&f, "GET", path, None, 404, "no endpoint");
    }
    for (method, path, allow) in [
        ("POST", "/api/v1/vgpus", "GET, PUT"),
        ("DELETE", "/api/v1/vgpus", "GET, PUT"),
        ("PATCH", "/api/v1/vgpus", "GET, PUT"),
        ("PUT", "/api/v1/vgpus/vgpu0", "GET, DELETE, PATCH"),
        ("POST", "/api/v1/vgpus/vgpu0", "GET, DELETE, PATCH"),
        ("HEAD", "/api/v1/vgpus/vgpu0", "GET, DELETE, PATCH"),
        ("DELETE", "/api/v1/stats", "GET"),
        ("PUT", "/api/v1/gpus", "GET"),
        ("get", "/api/v1/gpus", "GET"),
    ] {
        let body = matches!(method, "POST" | "PUT" | "PATCH").then_some("{}");
        let (s, head, v) = request(&f.sock, method, path, body);
        assert_eq!(s, 405, "{method} {path}: {v}");
        assert!(head.contains(&format!("\r\nAllow: {allow}\r\n")), "{head}");
        assert!(v["error"].as_str().unwrap().contains("not allowed"));
    }
}

#[test]
fn test_malformed_http_over_the_socket() {
    let f = fixture();
    let before = state(&f);
    let status = |bytes: &[u8]| raw(&f.sock, bytes).0;
    let put = |extra: &str, body: &str| {
        format!("PUT /api/v1/vgpus HTTP/1.1\r\nHost: h\r\n{extra}\r\n{body}")
    };
    let body = vgpu_body("x", "1MiB");
    // A body over 64 KiB.
    let big = format!("{{\"name\": \"{}\"}}", "x".repeat(70_000));
    assert_eq!(
        status(put(&format!("Content-Length: {}\r\n", big.len()), &big).as_bytes()),
        413
    );
    // No Content-Length, chunked, or a bad one.
    assert_eq!(status(put("", &body).as_bytes()), 411);
    assert_eq!(
        status(
            put(
                "Transfer-Encoding: chunked\r\n",
                &format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len())
            )
            .as_bytes()
        ),
        501
    );
    assert_eq!(
        status(put("Content-Length: ten\r\n", &body).as_bytes()),
        400
    );
    assert_eq!(status(put("Content-Length: -5\r\n", &body).as_bytes()), 400);
    assert_eq!(
        status(put("Content-Length: 5\r\nContent-Length: 6\r\n", &body).as_bytes()),
        400
    );
    // A body shorter than announced, then the client stops sending.
    let short = put(&format!("Content-Length: {}\r\n", body.len() + 10), &body);
    let (s, _, b) = raw_opts(&f.sock, short.as_bytes(), true);
    assert_eq!(s, 400);
    assert!(String::from_utf8_lossy(&b).contains("body bytes"));
    // Broken request lines and heads.
    assert_eq!(status(b"hello\r\n\r\n"), 400);
    assert_eq!(status(b"GET /api/v1/vgpus\r\n\r\n"), 400);
    assert_eq!(status(b"GET /api/v1/vgpus HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status(b"GET /api/v1/vgpus HTTP/3\r\nHost: h\r\n\r\n"), 505);
    assert_eq!(
        status(b"GET /api/v1/vgpus HTTP/1.1\r\nHost: h\r\nBad Header: 1\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET /api/v1/vgpus/\xff\xfe HTTP/1.1\r\nHost: h\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET /api/v1/vgpus HTTP/1.1\r\nHost: h\r\nX: \xc3\xa9\r\n\r\n"),
        400
    );
    // The head stops in the middle.
    let (s, _, _) = raw_opts(&f.sock, b"GET /api/v1/vgpus HTTP/1.1\r\nHo", true);
    assert_eq!(s, 400);
    // Headers over 16 KiB.
    let long = format!(
        "GET /api/v1/vgpus HTTP/1.1\r\nHost: h\r\nX: {}\r\n\r\n",
        "a".repeat(17 * 1024)
    );
    assert_eq!(status(long.as_bytes()), 431);
    let target = format!(
        "GET /api/v1/vgpus/{} HTTP/1.1\r\nHost: h\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    assert_eq!(status(target.as_bytes()), 431);
    // The same vGPU, well formed, is created: the refusals were not about it.
    assert_eq!(state(&f), before);
    let ok = put(&format!("Content-Length: {}\r\n", body.len()), &body);
    assert_eq!(status(ok.as_bytes()), 201);
    // Expect: 100-continue is answered before the body is sent.
    let mut s = UnixStream::connect(&f.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let patch = r#"{"weight": 2}"#;
    write!(
        s,
        "PATCH /api/v1/vgpus/x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        patch.len()
    )
    .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(patch.as_bytes()).unwrap();
    let mut rest = String::new();
    s.read_to_string(&mut rest).unwrap();
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
}

#[test]
fn test_many_clients() {
    let f = fixture();
    // Idle clients do not hold up the others.
    let idle: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&f.sock).unwrap())
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let sock = f.sock.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let (s, _, v) = request(&sock, "GET", "/api/v1/stats", None);
                    assert_eq!(s, 200, "{v}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(idle);
    // Past the cap, a client waits until a connection ends.
    let mut idle: Vec<UnixStream> = (0..vgpud::api::http::MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&f.sock).unwrap())
        .collect();
    // Let the server take them all.
    std::thread::sleep(Duration::from_millis(100));
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        idle.pop();
        idle
    });
    let start = Instant::now();
    let (s, _, v) = request(&f.sock, "GET", "/api/v1/vgpus", None);
    assert_eq!(s, 200, "{v}");
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "{:?}",
        start.elapsed()
    );
    drop(closer.join().unwrap());
}

#[test]
fn test_socket_mode_stale_socket_and_stop() {
    let mut f = fixture();
    let mode = std::fs::metadata(&f.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(f.api.path(), f.sock);
    // No leftovers of the private directory the socket was bound in.
    let names: Vec<String> = std::fs::read_dir(f.dir.as_path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".api")), "{names:?}");
    // A live API socket is not taken over.
    let e = ApiServer::start(&f.sock, f.daemon.clone()).err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert_eq!(call(&f, "GET", "/api/v1/vgpus", None).0, 200);
    // Stopping answers a request still being sent with 503 (without
    // waiting for it) and removes the socket.
    let mut slow = UnixStream::connect(&f.sock).unwrap();
    slow.write_all(b"DELETE /api/v1/vgpus/vgpu0 HTTP/1.1\r\nHo")
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    f.api.stop();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let mut resp = String::new();
    slow.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 503 "), "{resp}");
    assert!(f.daemon.lock().unwrap().instance("vgpu0").is_some());
    assert!(!f.sock.exists());
    assert!(UnixStream::connect(&f.sock).is_err());
    // A stale socket (its server died) is replaced.
    drop(UnixListener::bind(&f.sock).unwrap());
    assert!(f.sock.exists());
    let api2 = ApiServer::start(&f.sock, f.daemon.clone()).unwrap();
    assert_eq!(call(&f, "GET", "/api/v1/vgpus", None).0, 200);
    drop(api2);
    assert!(!f.sock.exists());
    // Anything else is left alone.
    std::fs::write(&f.sock, b"x").unwrap();
    let e = ApiServer::start(&f.sock, f.daemon.clone()).err().unwrap();
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&f.sock).unwrap(), b"x");
    // A missing directory is created, private.
    let deep = f.path("sub/dir/api.sock");
    let api3 = ApiServer::start(&deep, f.daemon.clone()).unwrap();
    let mode = std::fs::metadata(f.path("sub/dir"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    drop(api3);
    assert!(!deep.exists());
}

fn http_get(addr: std::net::SocketAddr, req: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    (resp[9..12].parse().unwrap(), resp)
}

#[test]
fn test_stats_and_metrics_follow_a_guest() {
    let f = fixture();
    let socket = f.path("vgpu0.sock");
    let mut g = Guest::connect(&socket, GuestOptions::default());
    g.setup_queue(0, 64, Mode::Interrupt);
    let a = g.device_alloc(0, MIB);
    g.upload(0, a, &vec![7u8; 64 << 10]);
    for _ in 0..20 {
        assert_eq!(g.nop(0).status, vgpu_testkit::abi::STATUS_OK);
    }
    let (s, v) = call(&f, "GET", "/api/v1/vgpus/vgpu0", None);
    assert_eq!(s, 200);
    let st = &v["stats"];
    assert!(st["memory_used_bytes"].as_u64().unwrap() >= MIB, "{st}");
    assert!(st["memory_peak_bytes"].as_u64().unwrap() >= MIB, "{st}");
    assert!(st["commands"].as_u64().unwrap() >= 22, "{st}");
    assert!(st["bytes"].as_u64().unwrap() >= 64 << 10, "{st}");
    assert!(st["busy_seconds"].as_f64().unwrap() > 0.0, "{st}");

    let mut m = MetricsServer::start("127.0.0.1:0".parse().unwrap(), f.daemon.clone()).unwrap();
    let addr = m.local_addr();
    let (s, resp) = http_get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(s, 200, "{resp}");
    assert!(
        resp.contains("Content-Type: text/plain; version=0.0.4"),
        "{resp}"
    );
    let used = resp
        .lines()
        .find_map(|l| l.strip_prefix("vgpud_vgpu_memory_used_bytes{vgpu=\"vgpu0\",gpu=\"gpu0\"} "))
        .expect("memory used of vgpu0");
    assert!(used.parse::<f64>().unwrap() >= MIB as f64);
    assert!(
        resp.contains("\nvgpud_vgpu_memory_quota_bytes{vgpu=\"vgpu1\",gpu=\"gpu0\"} 536870912\n")
    );
    assert!(resp.contains(
        "\nvgpud_vgpu_queue_wait_seconds{vgpu=\"vgpu0\",gpu=\"gpu0\",quantile=\"0.99\"} "
    ));
    assert!(resp.contains("\nvgpud_gpu_memory_allocated_bytes{gpu=\"gpu0\"} 805306368\n"));
    let (s, _) = http_get(addr, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(s, 404);
    let (s, resp) = http_get(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(s, 405);
    assert!(resp.contains("Allow: GET"));
    let (s, _) = http_get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(s, 200);
    m.stop();
    assert!(TcpStream::connect(addr).is_err());

    // Destroying a vGPU frees its memory (its guest goes first).
    drop(g);
    assert_eq!(call(&f, "DELETE", "/api/v1/vgpus/vgpu0", None).0, 204);
    let (_, gpus) = call(&f, "GET", "/api/v1/gpus", None);
    assert_eq!(gpus[0]["memory_allocated_bytes"], 512 * MIB);
}

#[test]
fn test_sigterm_stops_api_metrics_and_vgpus() {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-term-").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .args(["run", "--runtime-dir"])
        .arg(dir.as_path())
        .args(["--metrics-address", "127.0.0.1:0"])
        // Tests may run as root; the flag does nothing otherwise.
        .arg("--allow-root")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let metrics: std::net::SocketAddr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("vgpud did not start: {log:#?}"));
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
        log.push(line);
    };
    let api = dir.as_path().join("api.sock");
    let (s, _, v) = request(&api, "GET", "/api/v1/vgpus", None);
    assert_eq!(s, 200);
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(
        http_get(metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").0,
        200
    );
    // SAFETY: kill only sends a signal to the child started above.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "vgpud did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let left: Vec<_> = std::fs::read_dir(dir.as_path()).unwrap().collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    assert!(TcpStream::connect(metrics).is_err());
}

/// `vgpud_vgpu_up` of `vgpu`, as a scrape shows it.
fn up(f: &Fixture, vgpu: &str) -> f64 {
    let text = {
        let d = f.daemon.lock().unwrap();
        vgpud::metrics::render(&vgpud::metrics::Snapshot::of(&d))
    };
    let prefix = format!("vgpud_vgpu_up{{vgpu=\"{vgpu}\",gpu=\"gpu0\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        .parse()
        .unwrap()
}

#[test]
fn test_stop_and_start() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let f = fixture();
    let sock0 = f.path("vgpu0.sock");
    // vgpu1 works throughout; stopping and starting vgpu0 must not disturb it.
    let stop_work = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let worker = common::busy_guest(
        f.path("vgpu1.sock"),
        256 << 10,
        stop_work.clone(),
        done.clone(),
    );
    let progress = |what: &str| {
        let before = done.load(Ordering::Relaxed);
        let until = Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::Relaxed) < before + 20 {
            assert!(Instant::now() < until, "vgpu1 stalled {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    progress("before");

    let mut g = Guest::connect(&sock0, GuestOptions::default());
    g.setup_queue(0, 64, Mode::Interrupt);
    let buf = g.device_alloc(0, 4 * MIB);
    let (_, v) = call(&f, "GET", "/api/v1/vgpus/vgpu0", None);
    assert_eq!(v["state"], "running");
    assert!(v["stats"]["memory_used_bytes"].as_u64().unwrap() >= 4 * MIB);
    assert_eq!(up(&f, "vgpu0"), 1.0);
    let before = state(&f);

    // vgpu0 is stopped in the middle of work (its worker holding the GPU
    // now and then); its guest just stops hearing back.
    let fill = vgpu_testkit::Chain::command(&vgpu_testkit::abi::FillCmd {
        hdr: vgpu_testkit::abi::CmdHeader {
            opcode: vgpu_testkit::abi::OP_FILL,
            flags: 0,
        },
        addr: buf,
        size: 4 * MIB,
        pattern: 1,
        reserved: 0,
    })
    .completion();
    let busy0 = std::thread::spawn(move || {
        let mut completed = 0u64;
        loop {
            while g.in_flight(0) < 16 {
                g.post(0, &fill);
            }
            // The function may stop between the last wait and this kick:
            // its socket, and the work, are gone then.
            let kicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.kick(0)));
            if kicked.is_err() {
                return completed;
            }
            match g.wait_used(0, Duration::from_millis(500)) {
                Some(_) => completed += 1,
                None => return completed,
            }
        }
    });
    let until = Instant::now() + Duration::from_secs(10);
    while f.daemon.lock().unwrap().stats().1[0].commands < 50 {
        assert!(Instant::now() < until, "vgpu0 does not work");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (s, v) = call(&f, "POST", "/api/v1/vgpus/vgpu0/stop", Some(""));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "stopped");
    progress("while vgpu0 stopped");
    assert!(busy0.join().unwrap() > 0);
    // Powered off: no socket, so a VMM gets a clear failure; memory freed;
    // the reservation and the configuration stay.
    assert!(!sock0.exists());
    let e = UnixStream::connect(&sock0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    let (_, v) = call(&f, "GET", "/api/v1/vgpus/vgpu0", None);
    assert_eq!(v["state"], "stopped");
    assert_eq!(v["stats"]["memory_used_bytes"], 0);
    assert_eq!(v["stats"]["state"], "stopped");
    assert_eq!(v["config"], before["vgpus"][0]["config"]);
    let (_, gpus) = call(&f, "GET", "/api/v1/gpus", None);
    assert_eq!(gpus[0]["memory_allocated_bytes"], 768 * MIB);
    assert_eq!(up(&f, "vgpu0"), 0.0);
    assert_eq!(up(&f, "vgpu1"), 1.0);
    let (_, list) = call(&f, "GET", "/api/v1/vgpus", None);
    assert_eq!(list[0]["state"], "stopped");
    assert_eq!(list[1]["state"], "running");

    // Refusals change nothing.
    let stopped = state(&f);
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/stop",
        Some(""),
        409,
        "already stopped",
    );
    refused(&f, "POST", "/api/v1/vgpus/nope/stop", Some(""), 404, "nope");
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/nope/start",
        Some(""),
        404,
        "nope",
    );
    refused(
        &f,
        "GET",
        "/api/v1/vgpus/vgpu0/start",
        None,
        405,
        "allowed: POST",
    );
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/start",
        Some("{\"x\":1}"),
        400,
        "unknown field",
    );
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/start",
        Some("[1"),
        400,
        "invalid request body",
    );
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/pause",
        Some(""),
        404,
        "no endpoint",
    );
    // A stopped vGPU keeps its socket path and its memory.
    let mut clash: Value = serde_json::from_str(&vgpu_body("other", "64MiB")).unwrap();
    clash["socket"] = json!("vgpu0.sock");
    refused(
        &f,
        "PUT",
        "/api/v1/vgpus",
        Some(&clash.to_string()),
        409,
        "vgpu0",
    );
    refused(
        &f,
        "PUT",
        "/api/v1/vgpus",
        Some(&vgpu_body("big", "512MiB")),
        409,
        "memory",
    );
    // Something else took the path meanwhile: start refuses.
    std::fs::write(&sock0, b"x").unwrap();
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/start",
        Some(""),
        409,
        "not a socket",
    );
    std::fs::remove_file(&sock0).unwrap();
    assert_eq!(state(&f), stopped);

    // Start: the same socket, a fresh function, the same reservation.
    let (s, v) = call(&f, "POST", "/api/v1/vgpus/vgpu0/start", Some("{}"));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "running");
    assert!(sock0.exists());
    refused(
        &f,
        "POST",
        "/api/v1/vgpus/vgpu0/start",
        Some(""),
        409,
        "already running",
    );
    let mut g = Guest::connect(&sock0, GuestOptions::default());
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_eq!(g.mem_used(), 0, "a started function is as new");
    let a = g.device_alloc(0, 200 * MIB);
    assert_eq!(g.fill(0, a, 4096, 5).status, vgpu_testkit::abi::STATUS_OK);
    assert_eq!(up(&f, "vgpu0"), 1.0);
    assert_eq!(state(&f), before);
    progress("after vgpu0 started");

    // A stopped vGPU can be destroyed, which frees its reservation.
    drop(g);
    assert_eq!(
        call(&f, "POST", "/api/v1/vgpus/vgpu0/stop", Some("")).0,
        200
    );
    assert_eq!(call(&f, "DELETE", "/api/v1/vgpus/vgpu0", None).0, 204);
    let (_, gpus) = call(&f, "GET", "/api/v1/gpus", None);
    assert_eq!(gpus[0]["memory_allocated_bytes"], 512 * MIB);

    stop_work.store(true, Ordering::Relaxed);
    worker.join().expect("vgpu1's guest saw no failure");
}

#[test]
fn test_create_with_the_gpu_picked() {
    let f = fixture();
    let mut body: Value = serde_json::from_str(&vgpu_body("picked", "128MiB")).unwrap();
    body["gpu"] = json!("auto");
    let (s, v) = call(&f, "PUT", "/api/v1/vgpus", Some(&body.to_string()));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["gpu"], "gpu0");
    let why = v["placement"].as_str().unwrap();
    assert!(why.starts_with("spread: recent load "), "{why}");
    // Past what is left anywhere: refused, saying why.
    let mut big: Value = serde_json::from_str(&vgpu_body("big", "512MiB")).unwrap();
    big["gpu"] = json!("auto");
    refused(
        &f,
        "PUT",
        "/api/v1/vgpus",
        Some(&big.to_string()),
        409,
        "no GPU has room (gpu0: ",
    );
    // The GPU's recent load is among its figures.
    let (_, stats) = call(&f, "GET", "/api/v1/stats", None);
    assert!(stats["gpus"][0]["recent_load"].is_number(), "{stats}");
}
