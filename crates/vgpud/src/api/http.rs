//! A small, strict HTTP/1.1 server for the management API and the metrics
//! endpoint: one request per connection, bodies sized by Content-Length,
//! hard limits on every length and a deadline on every request.
//!
//! Anything outside the small subset it accepts is refused with a 4xx (or
//! 501/505) status and a reason, never guessed at.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use vgpu_sys::poll;
use vmm_sys_util::eventfd::EventFd;

/// Longest request line plus headers, with the blank line ending them.
pub const MAX_HEAD: usize = 16 * 1024;
/// Longest request body.
pub const MAX_BODY: usize = 64 * 1024;
/// Most header fields in a request.
pub const MAX_HEADERS: usize = 64;
/// Time a client has to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Time a client has to take our response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once by one server; more wait in the listen
/// backlog until one ends.
pub const MAX_CONNECTIONS: usize = 16;
/// After refusing a request, how long its unread rest is read and dropped
/// before closing (closing with unread data would reset the connection
/// and the client could lose the response).
pub const LINGER: Duration = Duration::from_secs(1);
/// Most bytes read and dropped after a refusal.
const LINGER_BYTES: usize = 1 << 20;

/// A request refused before it reached a handler: the status to answer
/// with and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// Status code.
    pub status: u16,
    /// Reason, for the client.
    pub message: String,
}

impl HttpError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
        }
    }
}

/// Why no request was read.
#[derive(Debug)]
pub enum RecvError {
    /// The client closed the connection before sending a byte.
    Closed,
    /// The client was too slow (deadline passed).
    Timeout,
    /// The server is stopping.
    Cancelled,
    /// The connection failed.
    Io(io::Error),
    /// The request is malformed or exceeds a limit.
    Bad(HttpError),
}

impl From<HttpError> for RecvError {
    fn from(e: HttpError) -> Self {
        RecvError::Bad(e)
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method, as sent (methods are case-sensitive).
    pub method: String,
    /// The target's path, without the query.
    pub path: String,
    /// The target's query, after `?`.
    pub query: Option<String>,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header fields, names lower-cased, values without surrounding blanks.
    pub headers: Vec<(String, String)>,
    /// Body (Content-Length bytes).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A request line and headers, before the body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The request, its body still empty.
    pub request: Request,
    /// The body's length, from Content-Length.
    pub content_length: Option<usize>,
    /// The client sent `Expect: 100-continue`.
    pub expect_continue: bool,
}

/// `tchar` of RFC 9110: the characters of methods and header names.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a request head: the bytes before the blank line, without it.
pub fn parse_head(head: &[u8]) -> Result<Head, HttpError> {
    let bad = |m: &str| HttpError::new(400, m);
    if let Some(b) = head.iter().find(|&&b| b >= 0x80) {
        return Err(bad(&format!(
            "byte 0x{b:02x} in the request head: only ASCII is accepted"
        )));
    }
    // Only ASCII from here, so the text is valid UTF-8.
    let text = std::str::from_utf8(head).map_err(|_| bad("request head is not ASCII"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    if request_line
        .bytes()
        .any(|b| b.is_ascii_control() || b == b'\r' || b == b'\n')
    {
        return Err(bad("control character in the request line"));
    }
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(bad(
            "the request line must be METHOD SP TARGET SP HTTP-VERSION",
        ));
    };
    if method.is_empty() || method.len() > 16 || !method.bytes().all(is_tchar) {
        return Err(bad("invalid method"));
    }
    if !target.starts_with('/') || target.contains('#') {
        return Err(bad("the target must be an absolute path (\"/...\")"));
    }
    let minor_version = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        v if v.starts_with("HTTP/") => {
            return Err(HttpError::new(505, "only HTTP/1.1 and HTTP/1.0 are served"))
        }
        _ => return Err(bad("invalid HTTP version")),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };

    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.is_empty() {
            return Err(bad("empty line inside the header section"));
        }
        if headers.len() == MAX_HEADERS {
            return Err(HttpError::new(
                431,
                format!("more than {MAX_HEADERS} header fields"),
            ));
        }
        if line.starts_with([' ', '\t']) {
            return Err(bad("folded header lines are not accepted"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad("header field without ':'"));
        };
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(bad("invalid header field name"));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| b != b'\t' && b.is_ascii_control()) {
            return Err(bad(&format!("control character in header field {name:?}")));
        }
        headers.push((name.to_ascii_lowercase(), value.to_string()));
    }

    fn all<'a>(headers: &'a [(String, String)], n: &'a str) -> impl Iterator<Item = &'a String> {
        headers.iter().filter(move |(h, _)| h == n).map(|(_, v)| v)
    }
    if minor_version == 1 && all(&headers, "host").count() != 1 {
        return Err(bad(
            "an HTTP/1.1 request needs exactly one Host header field",
        ));
    }
    if all(&headers, "transfer-encoding").next().is_some() {
        return Err(HttpError::new(
            501,
            "Transfer-Encoding is not supported: send the body with Content-Length",
        ));
    }
    let mut content_length = None;
    for v in all(&headers, "content-length") {
        if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("invalid Content-Length"));
        }
        let n: u64 = v.parse().map_err(|_| bad("invalid Content-Length"))?;
        if content_length.is_some_and(|c| c != n) {
            return Err(bad("conflicting Content-Length fields"));
        }
        content_length = Some(n);
    }
    let content_length = match content_length {
        Some(n) if n > MAX_BODY as u64 => {
            return Err(HttpError::new(
                413,
                format!("the body may be at most {MAX_BODY} bytes"),
            ))
        }
        // At most MAX_BODY, so it fits.
        Some(n) => Some(n as usize),
        None => None,
    };
    let mut expect_continue = false;
    for v in all(&headers, "expect") {
        if v.eq_ignore_ascii_case("100-continue") {
            expect_continue = true;
        } else {
            return Err(HttpError::new(
                417,
                "only \"Expect: 100-continue\" is understood",
            ));
        }
    }
    if content_length.is_none() && matches!(method, "PUT" | "POST" | "PATCH") {
        return Err(HttpError::new(
            411,
            "a request with a body needs Content-Length",
        ));
    }
    Ok(Head {
        request: Request {
            method: method.to_string(),
            path,
            query,
            minor_version,
            headers,
            body: Vec::new(),
        },
        content_length,
        expect_continue,
    })
}

/// A connection: a byte stream with a settable read timeout.
pub trait Conn: Read + Write {
    /// Makes reads fail with `WouldBlock`/`TimedOut` after `timeout`.
    fn set_read_limit(&mut self, timeout: Duration) -> io::Result<()>;
    /// Ends our direction of the stream (the client sees end of file).
    fn shutdown_write(&mut self) -> io::Result<()>;
}

/// [`Conn`] for stream types with the inherent `set_read_timeout` and
/// `shutdown` of the standard library's sockets.
macro_rules! impl_conn {
    ($($stream:ty),*) => {$(
        impl Conn for $stream {
            fn set_read_limit(&mut self, timeout: Duration) -> io::Result<()> {
                self.set_read_timeout(Some(timeout))
            }
            fn shutdown_write(&mut self) -> io::Result<()> {
                self.shutdown(std::net::Shutdown::Write)
            }
        }
    )*};
}

impl_conn!(UnixStream, TcpStream);

/// How often a blocked read checks whether it is cancelled.
const CANCEL_CHECK: Duration = Duration::from_millis(100);

/// Reads into `buf` (appending at most `max` bytes) before `deadline`
/// unless `cancel` says to stop; returns how many were read, 0 at end of
/// stream.
fn read_some<C: Conn>(
    c: &mut C,
    buf: &mut Vec<u8>,
    max: usize,
    deadline: Instant,
    cancel: &dyn Fn() -> bool,
) -> Result<usize, RecvError> {
    let mut chunk = [0u8; 4096];
    let want = max.min(chunk.len());
    loop {
        if cancel() {
            return Err(RecvError::Cancelled);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RecvError::Timeout);
        }
        c.set_read_limit(left.min(CANCEL_CHECK))
            .map_err(RecvError::Io)?;
        match c.read(&mut chunk[..want]) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(RecvError::Io(e)),
        }
    }
}

fn find_blank_line(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    buf.get(start..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| start + i)
}

fn head_too_large() -> RecvError {
    HttpError::new(
        431,
        format!("the request line and headers may be at most {MAX_HEAD} bytes"),
    )
    .into()
}

/// Reads one request from `c` before `deadline`. Answers
/// `Expect: 100-continue` itself.
pub fn read_request<C: Conn>(c: &mut C, deadline: Instant) -> Result<Request, RecvError> {
    read_request_or_cancel(c, deadline, &|| false)
}

/// [`read_request`], giving up with [`RecvError::Cancelled`] soon after
/// `cancel` returns true.
pub fn read_request_or_cancel<C: Conn>(
    c: &mut C,
    deadline: Instant,
    cancel: &dyn Fn() -> bool,
) -> Result<Request, RecvError> {
    let mut buf = Vec::with_capacity(1024);
    let end = loop {
        let before = buf.len();
        // Never read past what a head may be (plus a little of the body).
        let n = read_some(c, &mut buf, MAX_HEAD + 4096 - before, deadline, cancel)?;
        if let Some(end) = find_blank_line(&buf, before) {
            break end;
        }
        if n == 0 {
            return Err(if buf.is_empty() {
                RecvError::Closed
            } else {
                HttpError::new(400, "the connection ended inside the request head").into()
            });
        }
        if buf.len() >= MAX_HEAD {
            return Err(head_too_large());
        }
    };
    if end + 4 > MAX_HEAD {
        return Err(head_too_large());
    }
    let head = parse_head(&buf[..end])?;
    let len = head.content_length.unwrap_or(0);
    let mut body: Vec<u8> = buf[end + 4..].to_vec();
    // A second request after this one is not served: drop its bytes.
    body.truncate(len);
    if head.expect_continue && body.len() < len {
        c.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(RecvError::Io)?;
    }
    while body.len() < len {
        let want = len - body.len();
        if read_some(c, &mut body, want, deadline, cancel)? == 0 {
            return Err(HttpError::new(
                400,
                format!(
                    "the connection ended after {} of {len} body bytes",
                    body.len()
                ),
            )
            .into());
        }
    }
    Ok(Request {
        body,
        ..head.request
    })
}

/// A response; always sent with Content-Length and `Connection: close`.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Content-Type of the body (ignored without a body).
    pub content_type: &'static str,
    /// Further header fields.
    pub headers: Vec<(&'static str, String)>,
    /// Body.
    pub body: Vec<u8>,
}

/// The reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

impl Response {
    /// `body` as `content_type`, without further header fields.
    fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// A JSON body.
    pub fn json<T: serde::Serialize + ?Sized>(status: u16, value: &T) -> Response {
        match serde_json::to_vec_pretty(value) {
            Ok(mut body) => {
                body.push(b'\n');
                Response::new(status, "application/json", body)
            }
            Err(e) => Response::error(500, format!("cannot encode the response: {e}")),
        }
    }

    /// `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        #[derive(serde::Serialize)]
        struct Body {
            error: String,
        }
        let body = Body {
            error: message.into(),
        };
        let mut bytes = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        bytes.push(b'\n');
        Response::new(status, "application/json", bytes)
    }

    /// No body.
    pub fn empty(status: u16) -> Response {
        Response::new(status, "application/json", Vec::new())
    }

    /// Plain text.
    pub fn text(status: u16, content_type: &'static str, body: String) -> Response {
        Response::new(status, content_type, body.into_bytes())
    }

    /// Adds a header field.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        if !self.body.is_empty() {
            out.push_str(&format!("Content-Type: {}\r\n", self.content_type));
        }
        if self.status != 204 {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("Connection: close\r\n\r\n");
        let mut bytes = out.into_bytes();
        if self.status != 204 {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

/// Answers one request.
pub type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A listening socket the server accepts connections from.
pub trait Listener: AsRawFd + Send + 'static {
    /// An accepted connection.
    type Stream: Conn + Send + 'static;
    /// Accepts one connection (the listener is non-blocking).
    fn accept_one(&self) -> io::Result<Self::Stream>;
    /// Sets a write timeout on an accepted connection.
    fn prepare(stream: &Self::Stream) -> io::Result<()>;
    /// Makes `accept_one` return `WouldBlock` instead of waiting.
    fn make_nonblocking(&self) -> io::Result<()>;
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    fn accept_one(&self) -> io::Result<UnixStream> {
        self.accept().map(|(s, _)| s)
    }
    fn prepare(s: &UnixStream) -> io::Result<()> {
        s.set_nonblocking(false)?;
        s.set_write_timeout(Some(WRITE_TIMEOUT))
    }
    fn make_nonblocking(&self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn accept_one(&self) -> io::Result<TcpStream> {
        self.accept().map(|(s, _)| s)
    }
    fn prepare(s: &TcpStream) -> io::Result<()> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_write_timeout(Some(WRITE_TIMEOUT))
    }
    fn make_nonblocking(&self) -> io::Result<()> {
        self.set_nonblocking(true)
    }
}

/// Serves requests on a thread per connection (at most
/// [`MAX_CONNECTIONS`] at once) until stopped or dropped.
pub struct Server {
    name: String,
    stopping: Arc<AtomicBool>,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    active: Arc<AtomicUsize>,
}

/// Decrements the number of active connections when a connection ends,
/// even by a panic.
struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A pollfd waiting for `fd` to be readable.
fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits until `fd` is readable or `stop` is written; true when stopped.
fn wait_readable(fd: RawFd, stop: &EventFd) -> bool {
    let mut fds = [pollin(fd), pollin(stop.as_raw_fd())];
    loop {
        match poll::poll(&mut fds, -1) {
            Ok(_) => return fds[1].revents != 0,
            // Should not happen with valid fds; do not spin.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Waits up to `timeout` for `stop`; true when stopped.
fn wait_stop(stop: &EventFd, timeout: Duration) -> bool {
    let mut fds = [pollin(stop.as_raw_fd())];
    poll::poll(&mut fds, poll::timeout_ms(timeout)).is_ok_and(|n| n > 0)
}

fn serve_conn<S: Conn>(mut stream: S, handler: &Handler, stopping: &AtomicBool) {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let stopped = || stopping.load(Ordering::Acquire);
    let response = match read_request_or_cancel(&mut stream, deadline, &stopped) {
        // Once the server stops, requests no longer reach the handler
        // (which may act on a daemon that is shutting down).
        Ok(_) if stopped() => Response::error(503, "the daemon is shutting down"),
        Err(RecvError::Cancelled) => Response::error(503, "the daemon is shutting down"),
        Ok(req) => {
            let resp = handler(&req);
            debug!("{} {} -> {}", req.method, req.path, resp.status);
            resp
        }
        Err(RecvError::Closed) => return,
        Err(RecvError::Io(e)) => {
            debug!("connection failed: {e}");
            return;
        }
        Err(RecvError::Timeout) => Response::error(
            408,
            format!(
                "the request was not complete within {} s",
                REQUEST_DEADLINE.as_secs()
            ),
        ),
        Err(RecvError::Bad(e)) => {
            debug!("refused request: {} {}", e.status, e.message);
            Response::error(e.status, e.message)
        }
    };
    if let Err(e) = stream.write_all(&response.to_bytes()) {
        debug!("cannot send the response: {e}");
        return;
    }
    let _ = stream.flush();
    if response.status >= 400 && !stopped() {
        // Part of the request may be unread: let the client see the
        // response and end of file, and drop what it still sends.
        let _ = stream.shutdown_write();
        let deadline = Instant::now() + LINGER;
        let mut sink = Vec::new();
        let mut dropped = 0;
        while dropped < LINGER_BYTES {
            sink.clear();
            match read_some(&mut stream, &mut sink, 4096, deadline, &|| false) {
                Ok(n) if n > 0 => dropped += n,
                _ => break,
            }
        }
    }
}

impl Server {
    /// Serves `listener` (made non-blocking here) with `handler`.
    pub fn spawn<L: Listener>(
        name: &str,
        listener: L,
        handler: Arc<Handler>,
    ) -> io::Result<Server> {
        listener.make_nonblocking()?;
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let stop2 = stop.try_clone()?;
        let active = Arc::new(AtomicUsize::new(0));
        let active2 = active.clone();
        let stopping = Arc::new(AtomicBool::new(false));
        let stopping2 = stopping.clone();
        let tname = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                Self::accept_loop(&tname, listener, &stop2, &active2, &stopping2, handler)
            })?;
        Ok(Server {
            name: name.to_string(),
            stopping,
            stop,
            thread: Some(thread),
            active,
        })
    }

    fn accept_loop<L: Listener>(
        name: &str,
        listener: L,
        stop: &EventFd,
        active: &Arc<AtomicUsize>,
        stopping: &Arc<AtomicBool>,
        handler: Arc<Handler>,
    ) {
        loop {
            // At the cap, leave new clients in the backlog until a
            // connection ends.
            while active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                if wait_stop(stop, Duration::from_millis(10)) {
                    return;
                }
            }
            if wait_readable(listener.as_raw_fd(), stop) {
                return;
            }
            let stream = match listener.accept_one() {
                Ok(s) => s,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    // Out of fds, for instance: wait instead of spinning.
                    warn!("{name}: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if let Err(e) = L::prepare(&stream) {
                debug!("{name}: cannot set up a connection: {e}");
                continue;
            }
            active.fetch_add(1, Ordering::AcqRel);
            let guard = ActiveGuard(active.clone());
            let handler = handler.clone();
            let stopping = stopping.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-conn"))
                .spawn(move || {
                    let _guard = guard;
                    serve_conn(stream, &*handler, &stopping);
                });
            if let Err(e) = spawned {
                error!("{name}: cannot start a connection thread: {e}");
            }
        }
    }

    /// Stops accepting and closes the listener; requests still being
    /// read are answered 503, and those being handled are waited for, so
    /// that no handler runs once this returns.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stopping.store(true, Ordering::Release);
        let _ = self.stop.write(1);
        if thread.join().is_err() {
            error!("{}: accept thread panicked", self.name);
        }
        // Handlers end promptly; what remains is sending responses to
        // clients that may be slow to read them.
        let until = Instant::now() + WRITE_TIMEOUT + LINGER + CANCEL_CHECK * 2;
        while self.active.load(Ordering::Acquire) > 0 {
            if Instant::now() >= until {
                warn!(
                    "{}: {} connections still open at stop",
                    self.name,
                    self.active.load(Ordering::Acquire)
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Connections being served now.
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection fed from a script of reads; writes are recorded.
    struct Mock {
        reads: Vec<io::Result<Vec<u8>>>,
        written: Vec<u8>,
    }

    impl Mock {
        fn new(chunks: &[&[u8]]) -> Mock {
            Mock {
                reads: chunks.iter().rev().map(|c| Ok(c.to_vec())).collect(),
                written: Vec::new(),
            }
        }
    }

    impl Read for Mock {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.reads.pop() {
                None => Ok(0),
                Some(Err(e)) => Err(e),
                Some(Ok(mut chunk)) => {
                    let n = chunk.len().min(buf.len());
                    buf[..n].copy_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        self.reads.push(Ok(chunk.split_off(n)));
                    }
                    Ok(n)
                }
            }
        }
    }

    impl Write for Mock {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Conn for Mock {
        fn set_read_limit(&mut self, _: Duration) -> io::Result<()> {
            Ok(())
        }
        fn shutdown_write(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn read(chunks: &[&[u8]]) -> Result<Request, RecvError> {
        read_request(
            &mut Mock::new(chunks),
            Instant::now() + Duration::from_secs(5),
        )
    }

    fn status(chunks: &[&[u8]]) -> u16 {
        match read(chunks) {
            Err(RecvError::Bad(e)) => e.status,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Each request, in one chunk, is refused with its status.
    fn assert_statuses(cases: &[(&[u8], u16)]) {
        for (req, want) in cases {
            assert_eq!(status(&[req]), *want, "{}", String::from_utf8_lossy(req));
        }
    }

    const GET: &[u8] = b"GET /api/v1/vgpus HTTP/1.1\r\nHost: localhost\r\n\r\n";

    #[test]
    fn test_simple_get() {
        let r = read(&[GET]).unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/api/v1/vgpus");
        assert_eq!(r.query, None);
        assert_eq!(r.minor_version, 1);
        assert_eq!(r.header("host"), Some("localhost"));
        assert!(r.body.is_empty());
    }

    #[test]
    fn test_body_and_byte_by_byte() {
        let req = b"PUT /x?a=b HTTP/1.1\r\nHOST:  h \r\nContent-Length: 5\r\n\r\nhello";
        let r = read(&[req]).unwrap();
        assert_eq!(r.body, b"hello");
        assert_eq!(r.query.as_deref(), Some("a=b"));
        assert_eq!(r.header("host"), Some("h"));
        // The same request one byte per read.
        let chunks: Vec<&[u8]> = req.chunks(1).collect();
        assert_eq!(read(&chunks).unwrap(), r);
        // Bytes after the body (a pipelined request) are not part of it.
        let mut more = req.to_vec();
        more.extend_from_slice(GET);
        assert_eq!(read(&[&more]).unwrap().body, b"hello");
    }

    #[test]
    fn test_http10_needs_no_host() {
        let r = read(&[b"GET /metrics HTTP/1.0\r\n\r\n"]).unwrap();
        assert_eq!(r.minor_version, 0);
    }

    #[test]
    fn test_expect_continue() {
        let mut m = Mock::new(&[
            b"PATCH /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
            b"{}",
        ]);
        let r = read_request(&mut m, Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(r.body, b"{}");
        assert_eq!(m.written, b"HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn test_closed_and_truncated() {
        assert!(matches!(read(&[]), Err(RecvError::Closed)));
        assert_eq!(status(&[b"GET / HTTP/1.1\r\nHost: h\r\n"]), 400);
        assert_eq!(
            status(&[b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"]),
            400
        );
    }

    #[test]
    fn test_timeouts_and_cancel() {
        // A read timing out is retried until the deadline.
        let mut m = Mock::new(&[b"GET / HTTP/1.1\r\nHost: h\r\n", b"\r\n"]);
        m.reads.insert(1, Err(io::ErrorKind::WouldBlock.into()));
        m.reads.insert(1, Err(io::ErrorKind::TimedOut.into()));
        let r = read_request(&mut m, Instant::now() + Duration::from_secs(5));
        assert!(r.is_ok(), "{r:?}");
        let r = read_request(&mut Mock::new(&[GET]), Instant::now());
        assert!(matches!(r, Err(RecvError::Timeout)), "{r:?}");
        let mut m = Mock::new(&[b"GET / HT"]);
        let r = read_request_or_cancel(&mut m, Instant::now() + Duration::from_secs(5), &|| true);
        assert!(matches!(r, Err(RecvError::Cancelled)), "{r:?}");
    }

    #[test]
    fn test_oversize() {
        // Headers without an end.
        let big = vec![b'a'; 64 * 1024];
        let mut head = b"GET / HTTP/1.1\r\nHost: h\r\nX: ".to_vec();
        head.extend_from_slice(&big);
        assert_eq!(status(&[&head]), 431);
        // A complete head over the limit.
        let mut head = b"GET / HTTP/1.1\r\nHost: h\r\nX: ".to_vec();
        head.extend_from_slice(&big[..MAX_HEAD]);
        head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(status(&[&head]), 431);
        // Too many fields.
        let mut head = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for i in 0..MAX_HEADERS {
            head.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert_eq!(status(&[&head]), 431);
        // A body over the limit is refused before it is read.
        let req = format!(
            "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(status(&[req.as_bytes()]), 413);
        let req = "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n";
        assert_eq!(status(&[req.as_bytes()]), 400);
        // Exactly at the limit is fine.
        let body = vec![b'x'; MAX_BODY];
        let mut req =
            format!("PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: {MAX_BODY}\r\n\r\n").into_bytes();
        req.extend_from_slice(&body);
        assert_eq!(read(&[&req]).unwrap().body.len(), MAX_BODY);
    }

    #[test]
    fn test_bad_request_lines() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET\r\nHost: h\r\n\r\n", 400),
            (b"GET /\r\nHost: h\r\n\r\n", 400),
            (b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400),
            (b"GET / HTTP/1.1 extra\r\nHost: h\r\n\r\n", 400),
            (b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /a#b HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
            (b"GET / FTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET / http/1.1\r\nHost: h\r\n\r\n", 400),
            (b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /\t HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /\x00 HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET / HTTP/1.1\nHost: h\r\n\r\n", 400),
        ];
        assert_statuses(cases);
    }

    #[test]
    fn test_bad_headers() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET / HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost h\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\n: h\r\nHost: h\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: h\x01\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: \xe9\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n", 417),
        ];
        assert_statuses(cases);
    }

    #[test]
    fn test_bad_content_length() {
        let with = |cl: &str| format!("PUT / HTTP/1.1\r\nHost: h\r\n{cl}\r\n\r\n");
        for cl in [
            "Content-Length: -1",
            "Content-Length: +1",
            "Content-Length: 1x",
            "Content-Length: 0x10",
            "Content-Length: 1 2",
            "Content-Length:",
            "Content-Length: 1\r\nContent-Length: 2",
        ] {
            assert_eq!(status(&[with(cl).as_bytes()]), 400, "{cl}");
        }
        // Agreeing duplicates are one length.
        let req = with("Content-Length: 0\r\nContent-Length: 0");
        assert!(read(&[req.as_bytes()]).is_ok());
        // Bodies need a length; chunked is not served.
        assert_eq!(status(&[with("X: y").as_bytes()]), 411);
        let te = with("Transfer-Encoding: chunked");
        assert_eq!(status(&[te.as_bytes()]), 501);
        let both = with("Transfer-Encoding: chunked\r\nContent-Length: 3");
        assert_eq!(status(&[both.as_bytes()]), 501);
    }

    #[test]
    fn test_arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: random heads and mutations of a
        // valid one must give a request or a refusal, never a panic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = b"PATCH /api/v1/vgpus/a HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}";
        for _ in 0..5000 {
            let mut req = valid.to_vec();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % req.len();
                match next() % 3 {
                    0 => req[i] = next() as u8,
                    1 => {
                        req.remove(i);
                    }
                    _ => req.insert(i, b"\r\n: 0"[(next() % 5) as usize]),
                }
            }
            let _ = read(&[&req]);
            let _ = parse_head(&req);
        }
    }

    #[test]
    fn test_response_bytes() {
        let r = Response::error(404, "no \"x\"").to_bytes();
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
        assert!(text.contains("Content-Type: application/json\r\n"));
        assert!(text.contains("Connection: close\r\n\r\n"));
        assert!(text.ends_with("{\"error\":\"no \\\"x\\\"\"}\n"), "{text}");
        let r = String::from_utf8(Response::empty(204).to_bytes()).unwrap();
        assert_eq!(r, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    }
}
