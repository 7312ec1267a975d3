//! The management API's HTTP request reader
//! (`vgpud::api::http::read_request`) on arbitrary bytes, delivered in
//! chunks of an input-chosen size, then the request it accepts routed to
//! the API's handler (`vgpud::api::handle`) and the metrics handler
//! (`vgpud::metrics::handle`) of a daemon with one running vGPU.
//!
//! Input: byte 0 picks the chunk size (0 = everything in one read); the
//! rest is what the client sends.
//!
//! The reader must refuse or return a request that keeps its promises
//! (method and path shapes, body of exactly Content-Length bytes); the
//! handler must answer with a well-formed response whose header section
//! nothing from the request can break.
//!
//! To keep every input independent of the ones before, requests that
//! would change what the daemon runs are not routed: DELETE or stop of the
//! running vGPU, and PUT bodies naming a socket outside the runtime
//! directory (the daemon's GPU is full, so every other PUT is refused
//! before anything is created).

#![no_main]

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vgpud::api::http::{self, Conn, RecvError, MAX_BODY, MAX_HEAD};
use vgpud::config::Config;
use vgpud::daemon::Daemon;
use vmm_sys_util::tempdir::TempDir;

/// A connection that hands out the input `chunk` bytes per read and
/// records what is written back.
struct Mock<'a> {
    data: &'a [u8],
    chunk: usize,
    written: Vec<u8>,
}

impl Read for Mock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.chunk).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl Write for Mock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Conn for Mock<'_> {
    fn set_read_limit(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Api {
    daemon: Mutex<Daemon>,
    api_path: PathBuf,
    _dir: TempDir,
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let dir = TempDir::new_with_prefix("/tmp/vgpud-api-fuzz-").expect("temporary directory");
        let text = format!(
            r#"
[daemon]
runtime_dir = "{}"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "software"
memory = "64MiB"
compute_units = 1

[[vgpu]]
name = "fz"
gpu = "gpu0"
socket = "fz.sock"
memory = "64MiB"
compute_units = 1
"#,
            dir.as_path().display()
        );
        let config = Config::parse(&text, "fuzz.toml").expect("fuzz configuration");
        let api_path = config.api_socket_path();
        let mut daemon = Daemon::new(config).expect("daemon");
        daemon.start_all().expect("vGPU fz starts");
        Api {
            daemon: Mutex::new(daemon),
            api_path,
            _dir: dir,
        }
    })
}

/// Whether routing `req` leaves the daemon as it was (see the top).
fn stateless(req: &http::Request) -> bool {
    match req.method.as_str() {
        "DELETE" => !req.path.trim_end_matches('/').ends_with("/fz"),
        "POST" => !req.path.ends_with("/fz/stop"),
        "PUT" => match serde_json::from_slice::<serde_json::Value>(&req.body) {
            Ok(v) => match v.get("socket").and_then(|s| s.as_str()) {
                Some(s) => !s.starts_with('/') && !s.split('/').any(|c| c == ".."),
                None => true,
            },
            Err(_) => true,
        },
        _ => true,
    }
}

fn check_request(req: &http::Request, mock: &Mock<'_>) {
    assert!(!req.method.is_empty() && req.method.len() <= 16, "{req:?}");
    assert!(req.path.starts_with('/'), "{req:?}");
    assert!(!req.path.contains(['#', '?', ' ']), "{req:?}");
    assert!(req.minor_version <= 1, "{req:?}");
    for (name, value) in &req.headers {
        assert!(!name.is_empty(), "{req:?}");
        assert_eq!(*name, name.to_ascii_lowercase(), "{req:?}");
        assert_eq!(value.trim_matches([' ', '\t']), value, "{req:?}");
        assert!(!value.contains(['\r', '\n']), "{req:?}");
    }
    let length = req.header("content-length").map(|v| v.parse::<usize>());
    match length {
        Some(Ok(n)) => assert_eq!(req.body.len(), n, "{req:?}"),
        Some(Err(e)) => panic!("accepted Content-Length that does not parse: {e}"),
        None => assert!(req.body.is_empty(), "{req:?}"),
    }
    assert!(req.body.len() <= MAX_BODY);
    if !mock.written.is_empty() {
        assert_eq!(mock.written, b"HTTP/1.1 100 Continue\r\n\r\n");
        assert!(
            req.header("expect").is_some(),
            "100 Continue without Expect"
        );
    }
}

fn check_response(resp: &http::Response) {
    assert!((100..=599).contains(&resp.status), "{resp:?}");
    let bytes = resp.to_bytes();
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head ends with a blank line");
    let head = std::str::from_utf8(&bytes[..end]).expect("response head is UTF-8");
    for (i, line) in head.split("\r\n").enumerate() {
        assert!(!line.is_empty(), "{head:?}");
        assert!(!line.contains(['\r', '\n']), "line break inside {line:?}");
        if i > 0 {
            assert!(line.contains(": "), "{head:?}");
        }
    }
    let body = &bytes[end + 4..];
    if resp.status != 204 {
        assert_eq!(body.len(), resp.body.len());
        if !body.is_empty() && resp.content_type == "application/json" {
            serde_json::from_slice::<serde_json::Value>(body).expect("JSON body");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (chunk, stream) = match data.split_first() {
        Some((0, rest)) => (usize::MAX, rest),
        Some((c, rest)) => (usize::from(*c), rest),
        None => return,
    };
    let mut mock = Mock {
        data: stream,
        chunk,
        written: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let req = match http::read_request(&mut mock, deadline) {
        Ok(req) => req,
        Err(RecvError::Bad(e)) => {
            assert!((400..=599).contains(&e.status), "{e:?}");
            check_response(&http::Response::error(e.status, e.message));
            return;
        }
        Err(RecvError::Closed) => {
            assert!(stream.is_empty(), "Closed after {} bytes", stream.len());
            return;
        }
        Err(e) => panic!("unexpected error from an in-memory stream: {e:?}"),
    };
    check_request(&req, &mock);
    // The head was at most MAX_HEAD bytes, so the request cannot be larger.
    assert!(req.path.len() + req.headers.len() <= MAX_HEAD);
    if stateless(&req) {
        let api = api();
        let resp = vgpud::api::handle(&api.daemon, &api.api_path, &req);
        check_response(&resp);
        // The metrics endpoint is served by the same reader.
        let resp = vgpud::metrics::handle(&api.daemon, &req);
        check_response(&resp);
    }
});
