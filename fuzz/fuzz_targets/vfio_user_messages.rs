//! A stream of vfio-user messages from a hostile client, sent to a real
//! `Endpoint` serving the sample device over a UNIX socket.
//!
//! Input layout:
//!
//! | bytes | meaning |
//! |---|---|
//! | 0 | number of fds to send, `% 21` (0..=20) |
//! | 1 | kind of each fd: bit `i % 8` set = memfd of 64 KiB, clear = eventfd |
//! | 2 | which message of the stream carries the fds (0 = the first) |
//! | 3.. | the byte stream, sent as is |
//!
//! One endpoint runs for the whole process, on a thread of its own. Each
//! input is one connection, written from a thread of its own: the fds go
//! (SCM_RIGHTS) with the first bytes of the chosen message, found by
//! following the headers' sizes as the server does; then the write side is
//! then shut, and replies are read until the server closes the connection.
//! The target fails when the server thread has ended (panic or event loop
//! error), when it does not close the connection in time (a hang), or when
//! it keeps fds from finished connections.

#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vfio_user_server::proto::HEADER_SIZE;
use vfio_user_server::sample::SampleDevice;
use vfio_user_server::{Endpoint, ServerError};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vmm_sys_util::tempdir::TempDir;

/// Most fds one input sends.
const MAX_FDS: usize = 20;
/// Size of every memfd sent: enough for DMA_MAP to accept a mapping.
const MEMFD_SIZE: u64 = 64 * 1024;
/// Longest the server may take to close a connection whose client has
/// sent everything and shut its write side. Its own peer timeout is 10 s;
/// nothing it does for one connection should come near that.
const CLOSE_DEADLINE: Duration = Duration::from_secs(15);
/// fds the process may hold between inputs before it counts as a leak.
const FD_LIMIT: usize = 512;

struct Server {
    path: PathBuf,
    thread: Mutex<Option<JoinHandle<Result<(), ServerError>>>>,
    _dir: TempDir,
}

impl Server {
    fn start() -> Server {
        // libFuzzer's main, not Rust's, starts the process: writes to a
        // socket the peer closed must fail with EPIPE, not kill it, as they
        // do in the daemon.
        // SAFETY: setting a signal to SIG_IGN is always sound.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = TempDir::new_with_prefix("/tmp/vfio-user-fuzz-").expect("temporary directory");
        let path = dir.as_path().join("sample.sock");
        let device = SampleDevice::new().expect("sample device");
        let endpoint = Endpoint::new("fuzz", &path, Box::new(device)).expect("endpoint");
        let thread = std::thread::Builder::new()
            .name("endpoint".into())
            .spawn(move || endpoint.run())
            .expect("endpoint thread");
        Server {
            path,
            thread: Mutex::new(Some(thread)),
            _dir: dir,
        }
    }

    /// Panics with the reason when the event loop has ended.
    fn check_alive(&self) {
        let mut guard = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_some_and(|t| t.is_finished()) {
            let outcome = guard.take().map(|t| t.join());
            match outcome {
                Some(Ok(Ok(()))) => panic!("endpoint event loop returned"),
                Some(Ok(Err(e))) => panic!("endpoint event loop failed: {e}"),
                Some(Err(_)) => panic!("endpoint thread panicked"),
                None => unreachable!(),
            }
        }
        assert!(guard.is_some(), "endpoint thread is gone");
    }
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(Server::start)
}

fn make_fds(count: usize, kinds: u8) -> Vec<OwnedFd> {
    (0..count)
        .map(|i| {
            if kinds >> (i % 8) & 1 == 1 {
                let f = vfio_user_server::memfd::create(c"fuzz-ram", MEMFD_SIZE).expect("memfd");
                OwnedFd::from(f)
            } else {
                // SAFETY: plain syscall; the result is checked below.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
                // SAFETY: fd was just created and nobody else owns it.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
        })
        .collect()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Where message `index` of `stream` starts, following each header's
/// `msg_size` as the server frames messages; `None` past the end.
fn message_offset(stream: &[u8], index: u8) -> Option<usize> {
    let mut off = 0usize;
    for _ in 0..index {
        let size = stream.get(off + 4..off + 8)?;
        let size = u32::from_le_bytes(size.try_into().ok()?) as usize;
        off = off.checked_add(size.max(HEADER_SIZE))?;
    }
    (off < stream.len()).then_some(off)
}

/// Sends `stream` with `fds` on the first bytes of message `fd_message`,
/// then shuts the write side.
fn send_all(mut sock: UnixStream, stream: Vec<u8>, fds: Vec<OwnedFd>, fd_message: u8) {
    let gone =
        |e: &std::io::Error| matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset);
    let mut sent = 0;
    if let Some(at) = message_offset(&stream, fd_message).filter(|_| !fds.is_empty()) {
        if let Err(e) = sock.write_all(&stream[..at]) {
            assert!(gone(&e), "write failed: {e}");
            return;
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let end = stream.len().min(at + HEADER_SIZE);
        match sock.send_with_fds(&[&stream[at..end]], &raw) {
            Ok(n) => sent = at + n,
            // The server may close at once; anything else is the harness's.
            Err(e) if matches!(e.errno(), libc::EPIPE | libc::ECONNRESET) => return,
            Err(e) => panic!("sendmsg with {} fds failed: {e}", raw.len()),
        }
    }
    drop(fds);
    if let Err(e) = sock.write_all(&stream[sent..]) {
        assert!(gone(&e), "write failed: {e}");
    }
    let _ = sock.shutdown(Shutdown::Write);
}

static RUNS: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let srv = server();
    srv.check_alive();
    let (nfds, kinds, fd_message, stream) = match data {
        [n, k, m, rest @ ..] => (usize::from(*n) % (MAX_FDS + 1), *k, *m, rest),
        _ => return,
    };
    let fds = make_fds(nfds, kinds);

    let sock = UnixStream::connect(&srv.path).expect("connect to the endpoint");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let writer_sock = sock.try_clone().expect("dup socket");
    let stream = stream.to_vec();
    let writer = std::thread::spawn(move || send_all(writer_sock, stream, fds, fd_message));

    // Drain replies (the server must not block on a full socket) until it
    // closes the connection.
    let deadline = Instant::now() + CLOSE_DEADLINE;
    let mut reader = &sock;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                srv.check_alive();
                assert!(
                    Instant::now() < deadline,
                    "the server did not close the connection within {CLOSE_DEADLINE:?}"
                );
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading replies failed: {e}"),
        }
    }
    writer.join().expect("writer thread");
    drop(sock);
    srv.check_alive();

    // Every fd of a finished connection must be released.
    if RUNS.fetch_add(1, Ordering::Relaxed) % 256 == 255 {
        let n = open_fds();
        assert!(
            n < FD_LIMIT,
            "{n} fds open: the server keeps fds of closed connections"
        );
    }
});
