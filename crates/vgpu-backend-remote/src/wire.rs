//! Frames on the socket: sending (with an optional fd) and receiving
//! (bounded, with fds only where the receiver asks for them).

use std::fs::File;
use std::io::{self, IoSlice, Read};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;

use vgpu_sys::{poll, scm};

use crate::proto::{Header, Kind, ProtoError, Reply, HEADER_LEN, REPLY};

/// Why a frame could not be exchanged.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the socket.
    #[error("connection closed")]
    Closed,
    /// No frame within the timeout.
    #[error("timed out")]
    Timeout,
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[source] io::Error),
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset => WireError::Closed,
            _ => WireError::Io(e),
        }
    }
}

/// Sends `reply` to the request of `kind` numbered `seq`.
pub fn send_reply(
    stream: &UnixStream,
    kind: Kind,
    seq: u32,
    reply: &Reply,
) -> Result<(), WireError> {
    send(stream, REPLY | kind as u16, seq, &reply.encode(kind), None)
}

/// Sends one frame; `fd` travels with its first byte. `MSG_NOSIGNAL`: a
/// dead peer is an error, not a SIGPIPE.
pub fn send(
    stream: &UnixStream,
    kind: u16,
    seq: u32,
    payload: &[u8],
    fd: Option<RawFd>,
) -> Result<(), WireError> {
    let len = u32::try_from(payload.len()).map_err(|_| ProtoError::TooLong {
        len: u32::MAX,
        max: u32::MAX,
    })?;
    let header = Header { kind, seq, len }.encode();
    let total = HEADER_LEN + payload.len();
    let mut sent = 0usize;
    let mut fd = fd;
    while sent < total {
        let head = &header[sent.min(HEADER_LEN)..];
        let body = &payload[sent.saturating_sub(HEADER_LEN)..];
        let mut iov = [IoSlice::new(&[]); 2];
        let mut n_iov = 0;
        for part in [head, body] {
            if !part.is_empty() {
                iov[n_iov] = IoSlice::new(part);
                n_iov += 1;
            }
        }
        let fds = fd.take();
        sent += scm::send_with_fds(stream, &iov[..n_iov], fds.as_slice())?;
    }
    Ok(())
}

/// Polls `stream` without sleeping for up to `spin` until a frame is
/// there to read: on an idle core this answers in about a microsecond,
/// where a blocking read costs a scheduler wake-up.
pub fn spin(stream: &UnixStream, spin: std::time::Duration) {
    if spin.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    // A zero timeout never blocks; an error ends the polling too.
    while matches!(poll::poll_readable(stream, 0), Ok(false)) && start.elapsed() < spin {
        std::hint::spin_loop();
    }
}

/// Receives one frame whose payload may be at most `max` bytes into
/// `buf`. With `want_fd`, one fd sent with the header is returned (closed
/// on exec); otherwise fds are not accepted (the kernel drops them).
/// `Closed` only at a frame boundary means a clean end.
pub fn recv(
    stream: &mut UnixStream,
    max: u32,
    buf: &mut Vec<u8>,
    want_fd: bool,
) -> Result<(Header, Option<File>), WireError> {
    let mut head = [0u8; HEADER_LEN];
    let mut file = None;
    let mut got = 0usize;
    if want_fd {
        let (n, f) = recv_with_fd(stream, &mut head)?;
        if n == 0 {
            return Err(WireError::Closed);
        }
        got = n;
        file = f;
    }
    stream.read_exact(&mut head[got..])?;
    let h = Header::decode(&head, max)?;
    buf.clear();
    buf.resize(h.len as usize, 0);
    stream.read_exact(buf)?;
    Ok((h, file))
}

/// Room for the fds of one frame: one is expected; a few more are
/// received and refused, and beyond that the kernel cuts them
/// (`MSG_CTRUNC`), which is refused too.
const FDS_ROOM: usize = 12;

fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> Result<(usize, Option<File>), WireError> {
    let mut got = scm::recv_with_fds(stream, buf, FDS_ROOM, 0)?;
    if got.fds.len() > 1 || got.fds_truncated() {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "more than one fd with a frame",
        )));
    }
    Ok((got.len, got.fds.pop().map(File::from)))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::proto::MAX_REPLY;

    #[test]
    fn test_frames_with_and_without_fd() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let f = File::open("/dev/null").unwrap();
        send(&a, 2, 1, b"hello", Some(f.as_raw_fd())).unwrap();
        send(&a, REPLY | 3, 2, &[], None).unwrap();
        let mut buf = Vec::new();
        let (h, fd) = recv(&mut b, MAX_REPLY, &mut buf, true).unwrap();
        assert_eq!((h.kind, h.seq, &buf[..]), (2, 1, &b"hello"[..]));
        assert!(fd.is_some());
        let (h, fd) = recv(&mut b, MAX_REPLY, &mut buf, true).unwrap();
        assert_eq!((h.kind, h.seq, buf.len()), (REPLY | 3, 2, 0));
        assert!(fd.is_none());
        drop(a);
        assert!(matches!(
            recv(&mut b, MAX_REPLY, &mut buf, false),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn test_oversized_frame_is_refused_before_reading_it() {
        let (a, mut b) = UnixStream::pair().unwrap();
        send(&a, REPLY | 3, 1, &vec![0; MAX_REPLY as usize + 1], None).unwrap();
        let mut buf = Vec::new();
        assert!(matches!(
            recv(&mut b, MAX_REPLY, &mut buf, false),
            Err(WireError::Proto(ProtoError::TooLong { .. }))
        ));
        assert!(buf.capacity() <= MAX_REPLY as usize);
    }
}
