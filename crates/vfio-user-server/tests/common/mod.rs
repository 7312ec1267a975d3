//! Shared helpers for the integration tests: start an endpoint on a real
//! socket in a thread, and a raw client that frames messages by hand.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use vfio_user_server::proto::{Header, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY, HEADER_SIZE};
use vfio_user_server::sample::SampleDevice;
use vfio_user_server::{Endpoint, PciDevice};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vmm_sys_util::tempdir::TempDir;

/// A running endpoint; stopped and joined on drop.
pub struct TestServer {
    pub path: PathBuf,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl TestServer {
    pub fn start(device: Box<dyn PciDevice>) -> Self {
        let dir = TempDir::new_with_prefix("/tmp/vfio-user-test-").unwrap();
        let path = dir.as_path().join("dev.sock");
        let endpoint = Endpoint::new("test", &path, device).unwrap();
        let stop = endpoint.stop_handle().unwrap();
        let thread = std::thread::spawn(move || endpoint.run().unwrap());
        TestServer {
            path,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn sample() -> Self {
        Self::start(Box::new(SampleDevice::new().unwrap()))
    }

    /// Whether the server thread is still running.
    pub fn alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread panicked");
        }
    }
}

/// A message as the raw client sees it.
pub struct Reply {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<File>,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        self.header.flags & vfio_user_server::proto::FLAG_ERROR != 0
    }
}

/// A client that writes and reads raw protocol messages.
pub struct RawClient {
    pub stream: UnixStream,
    next_id: u16,
}

impl RawClient {
    pub fn connect(path: &std::path::Path) -> Self {
        let stream = UnixStream::connect(path).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawClient { stream, next_id: 1 }
    }

    /// Sends a command; returns its message id.
    pub fn send(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> u16 {
        self.send_flags(command, FLAG_TYPE_COMMAND, payload, fds)
    }

    pub fn send_flags(&mut self, command: u16, flags: u32, payload: &[u8], fds: &[RawFd]) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            msg_id: id,
            command,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags,
            error: 0,
        };
        let mut buf = header.encode().to_vec();
        buf.extend_from_slice(payload);
        self.send_raw(&buf, fds);
        id
    }

    pub fn send_raw(&mut self, bytes: &[u8], fds: &[RawFd]) {
        if fds.is_empty() {
            self.stream.write_all(bytes).unwrap();
        } else {
            let n = self.stream.send_with_fds(&[bytes], fds).unwrap();
            self.stream.write_all(&bytes[n..]).unwrap();
        }
    }

    /// Receives one message (with any fds).
    pub fn recv(&mut self) -> Reply {
        let mut hdr = [0u8; HEADER_SIZE];
        let mut fds = [-1; 8];
        // SAFETY: the iovec points at `hdr`, valid for writes of its length.
        let (n, nfds) = unsafe {
            self.stream.recv_with_fds(
                &mut [libc::iovec {
                    iov_base: hdr.as_mut_ptr().cast(),
                    iov_len: hdr.len(),
                }],
                &mut fds,
            )
        }
        .unwrap();
        assert!(n > 0, "server closed the connection");
        if n < HEADER_SIZE {
            self.stream.read_exact(&mut hdr[n..]).unwrap();
        }
        let header = Header::decode(&hdr);
        let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
        self.stream.read_exact(&mut payload).unwrap();
        let fds = fds[..nfds]
            .iter()
            // SAFETY: recv_with_fds returned these fds; we now own them.
            .map(|fd| unsafe { File::from_raw_fd(*fd) })
            .collect();
        Reply {
            header,
            payload,
            fds,
        }
    }

    /// Sends a command and returns its reply, checking the id.
    pub fn call(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        let id = self.send(command, payload, fds);
        let reply = self.recv();
        assert_eq!(reply.header.msg_id, id);
        assert_eq!(reply.header.flags & 0xf, FLAG_TYPE_REPLY);
        reply
    }

    /// VERSION 0.0 with the given JSON capabilities.
    pub fn negotiate_with(&mut self, json: &str) -> Reply {
        let mut p = vec![0, 0, 0, 0];
        p.extend_from_slice(json.as_bytes());
        p.push(0);
        self.call(1, &p, &[])
    }

    pub fn negotiate(&mut self) -> Reply {
        let r = self.negotiate_with(
            r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"write_multiple":true}}"#,
        );
        assert!(!r.is_error());
        r
    }

    /// Whether the server has closed the connection (EOF within a second).
    pub fn closed(&mut self) -> bool {
        self.stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0))
    }
}

/// A memfd of `size` bytes standing in for guest RAM shared by a VMM.
pub fn guest_ram(size: u64) -> File {
    vfio_user_server::memfd::create(c"guest-ram", size).unwrap()
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

pub fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

pub fn raw(f: &File) -> RawFd {
    f.as_raw_fd()
}

/// Reads one whole message, returning an error (never panicking) when the
/// server closes or resets the connection. fds that came with it are closed.
fn try_recv_message(stream: &mut UnixStream) -> std::io::Result<(Header, Vec<u8>)> {
    let mut hdr = [0u8; HEADER_SIZE];
    stream.read_exact(&mut hdr)?;
    let header = Header::decode(&hdr);
    let len = (header.msg_size as usize)
        .checked_sub(HEADER_SIZE)
        .ok_or_else(|| std::io::Error::other("reply shorter than a header"))?;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok((header, payload))
}

impl RawClient {
    /// VERSION 0.0 with the default capabilities, reporting a refused or
    /// closed connection as an error instead of panicking.
    pub fn try_negotiate(&mut self) -> std::io::Result<()> {
        let json = br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"write_multiple":true}}"#;
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            msg_id: id,
            command: 1,
            msg_size: (HEADER_SIZE + 4 + json.len() + 1) as u32,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        };
        let mut buf = header.encode().to_vec();
        buf.extend_from_slice(&[0, 0, 0, 0]);
        buf.extend_from_slice(json);
        buf.push(0);
        self.stream.write_all(&buf)?;
        let (reply, _) = try_recv_message(&mut self.stream)?;
        if reply.msg_id != id || reply.flags & vfio_user_server::proto::FLAG_ERROR != 0 {
            return Err(std::io::Error::other(format!("VERSION refused: {reply:?}")));
        }
        Ok(())
    }

    /// Connects and negotiates once, as a VMM does: while the server
    /// still holds a previous client, this one waits in its backlog.
    pub fn connect_negotiated(path: &std::path::Path) -> Self {
        let mut c = RawClient::connect(path);
        if let Err(e) = c.try_negotiate() {
            panic!("cannot connect and negotiate: {e}");
        }
        c
    }
}

/// Asserts that the server still serves: a new client negotiates and reads
/// the sample device's ID register, and the server thread is running.
pub fn assert_serves(server: &TestServer) {
    assert!(server.alive(), "server thread has exited");
    let mut c = RawClient::connect_negotiated(&server.path);
    let mut p = 0u64.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    let r = c.call(9, &p, &[]);
    assert!(!r.is_error(), "REGION_READ of BAR0 failed: {:?}", r.header);
    assert_eq!(
        r.payload.get(16..20),
        Some(&vfio_user_server::sample::SAMPLE_ID.to_le_bytes()[..])
    );
    assert!(server.alive(), "server thread has exited");
}
