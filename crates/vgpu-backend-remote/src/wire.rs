//! Frames on the socket: sending (with an optional fd) and receiving
//! (bounded, with fds only where the receiver asks for them).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::proto::{Header, ProtoError, HEADER_LEN};

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
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let mut n_iov = 0;
        if sent < HEADER_LEN {
            iov[0] = libc::iovec {
                iov_base: header[sent..].as_ptr() as *mut libc::c_void,
                iov_len: HEADER_LEN - sent,
            };
            n_iov = 1;
        }
        let p = sent.saturating_sub(HEADER_LEN);
        if p < payload.len() {
            iov[n_iov] = libc::iovec {
                iov_base: payload[p..].as_ptr() as *mut libc::c_void,
                iov_len: payload.len() - p,
            };
            n_iov += 1;
        }
        let mut cmsg_buf = [0u64; 4];
        // SAFETY: an all-zero msghdr is a valid empty message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n_iov;
        if let Some(raw) = fd.take() {
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            debug_assert!(space <= std::mem::size_of_val(&cmsg_buf));
            msg.msg_control = cmsg_buf.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: msg_control points at `space` zeroed, aligned bytes,
            // room for one header with one fd.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), raw);
            }
        }
        // SAFETY: msg points at live iovecs (and control data) of this frame.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        sent += n as usize;
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
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n != 0 || start.elapsed() >= spin {
            return;
        }
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

fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> Result<(usize, Option<File>), WireError> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg_buf = [0u64; 8];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg_buf);
    let n = loop {
        // SAFETY: msg points at `buf` and `cmsg_buf`, both live and writable.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    };
    let mut files = Vec::new();
    // SAFETY: walking the control data the kernel just wrote, within
    // msg_controllen, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    files.push(File::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if files.len() > 1 || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(WireError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "more than one fd with a frame",
        )));
    }
    Ok((n, files.pop()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{MAX_REPLY, REPLY};

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
