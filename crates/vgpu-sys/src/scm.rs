//! Passing fds over UNIX sockets with `SCM_RIGHTS`.
//!
//! Why not `vmm_sys_util::sock_ctrl_msg::ScmSocket`: it receives without
//! `MSG_CMSG_CLOEXEC`, so an fd a peer passes is inherited by whatever
//! this process starts before it marks the fd close-on-exec itself, and
//! it does not say whether the kernel cut the control data
//! (`MSG_CTRUNC`), so a peer that sends more fds than were asked for goes
//! unnoticed. [`recv_with_fds`] does both, and takes ownership of every
//! fd that arrived, so that unexpected ones are closed, never leaked.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most fds the kernel passes in one message (`SCM_MAX_FD`).
pub const SCM_MAX_FD: usize = 253;

/// Bytes of one fd in control data.
const FD_BYTES: usize = std::mem::size_of::<RawFd>();

/// Control data for [`SCM_MAX_FD`] fds, in u64 words so that the buffer is
/// aligned for `cmsghdr`.
const CMSG_WORDS: usize = (SCM_MAX_FD * FD_BYTES + 64) / 8;

/// `CMSG_SPACE` for `fds` fds.
fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds * FD_BYTES) as u32) as usize }
}

/// Sends `bufs` on `sock` with `fds` attached (none when empty), with
/// `MSG_NOSIGNAL` (a closed peer is an error, not a SIGPIPE), retrying on
/// `EINTR`. Returns the bytes sent, which may be fewer than `bufs` hold:
/// the fds travel with the first byte, so the caller sends the rest
/// without them.
pub fn send_with_fds(sock: &impl AsFd, bufs: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > SCM_MAX_FD {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut cmsg_buf = [0u64; CMSG_WORDS];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI compatible with iovec; sendmsg only reads through it.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    if !fds.is_empty() {
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(fds.len()) as _;
        // SAFETY: msg_control points at msg_controllen zeroed, aligned
        // bytes (at most the buffer's size: fds.len() <= SCM_MAX_FD), room
        // for one header with fds.len() fds after it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * FD_BYTES) as u32) as _;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, &fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd);
            }
        }
    }
    loop {
        // SAFETY: msg points at live iovecs (from `bufs`) and control data
        // of the lengths given, for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_fd().as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What [`recv_with_fds`] got.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer (0: the peer closed, on a stream).
    pub len: usize,
    /// Every fd that came with them, owned (closed when dropped).
    pub fds: Vec<OwnedFd>,
    /// The message flags the kernel returned (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub flags: libc::c_int,
}

impl Received {
    /// The peer sent more fds than there was room for; the kernel closed
    /// the rest.
    pub fn fds_truncated(&self) -> bool {
        self.flags & libc::MSG_CTRUNC != 0
    }

    /// A datagram or record was longer than the buffer (the rest is lost).
    pub fn data_truncated(&self) -> bool {
        self.flags & libc::MSG_TRUNC != 0
    }
}

/// `recvmsg` on `sock` into `buf`, with `flags` added to
/// `MSG_CMSG_CLOEXEC` (every fd arrives close-on-exec), retrying on
/// `EINTR`, with room for `max_fds` fds (at most [`SCM_MAX_FD`]; the
/// room is rounded up to the control data's alignment, so on 64-bit
/// Linux an odd `max_fds` fits one more). Fds beyond the room are closed
/// by the kernel and reported by [`Received::fds_truncated`].
pub fn recv_with_fds(
    sock: &impl AsFd,
    buf: &mut [u8],
    max_fds: usize,
    flags: libc::c_int,
) -> io::Result<Received> {
    let mut cmsg_buf = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if max_fds > 0 {
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(max_fds.min(SCM_MAX_FD)) as _;
    }
    let len = loop {
        // SAFETY: msg points at live, writable buffers (iov -> buf,
        // control -> cmsg_buf) of the stated lengths for the call.
        let n = unsafe {
            libc::recvmsg(
                sock.as_fd().as_raw_fd(),
                &mut msg,
                libc::MSG_CMSG_CLOEXEC | flags,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR walk only the
    // control bytes the kernel reported in msg_controllen (none when it is
    // zero).
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: c is non-null and points at a header in cmsg_buf.
        let hdr = unsafe { &*c };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA of a valid header; CMSG_LEN(0) is a pure
            // size computation (the header's own length).
            let (data, header_len) = unsafe { (libc::CMSG_DATA(c), libc::CMSG_LEN(0) as usize) };
            let count = (hdr.cmsg_len as usize).saturating_sub(header_len) / FD_BYTES;
            for i in 0..count {
                // SAFETY: the kernel wrote `count` fds after the header;
                // read unaligned, as CMSG_DATA's alignment is not promised.
                let fd = unsafe { std::ptr::read_unaligned(data.cast::<RawFd>().add(i)) };
                // SAFETY: the kernel just installed this fd for us; we own it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok(Received {
        len,
        fds,
        flags: msg.msg_flags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::net::{UnixDatagram, UnixStream};

    fn is_cloexec(fd: &OwnedFd) -> bool {
        // SAFETY: F_GETFD on an fd we own.
        let f = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        f >= 0 && f & libc::FD_CLOEXEC != 0
    }

    #[test]
    fn test_fds_arrive_close_on_exec_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = File::open("/dev/null").unwrap();
        let g = File::open("/dev/zero").unwrap();
        let n = send_with_fds(
            &a,
            &[IoSlice::new(b"he"), IoSlice::new(b"llo")],
            &[f.as_raw_fd(), g.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let r = recv_with_fds(&b, &mut buf, 4, 0).unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert_eq!(r.fds.len(), 2);
        assert!(r.fds.iter().all(is_cloexec));
        assert!(!r.fds_truncated() && !r.data_truncated());
    }

    #[test]
    fn test_excess_fds_are_cut_and_reported() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<File> = (0..5).map(|_| File::open("/dev/null").unwrap()).collect();
        let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
        send_with_fds(&a, &[IoSlice::new(b"x")], &raw).unwrap();
        let mut buf = [0u8; 1];
        let r = recv_with_fds(&b, &mut buf, 1, 0).unwrap();
        // Room for one, rounded up to the control data's alignment.
        assert!((1..=2).contains(&r.fds.len()), "{}", r.fds.len());
        assert!(r.fds_truncated());
        // No room at all: every fd is cut.
        send_with_fds(&a, &[IoSlice::new(b"y")], &raw[..1]).unwrap();
        let r = recv_with_fds(&b, &mut buf, 0, 0).unwrap();
        assert!(r.fds.is_empty() && r.fds_truncated());
        assert!(send_with_fds(&a, &[IoSlice::new(b"z")], &[raw[0]; SCM_MAX_FD + 1]).is_err());
    }

    #[test]
    fn test_long_records_and_flags() {
        let (a, b) = UnixDatagram::pair().unwrap();
        send_with_fds(&a, &[IoSlice::new(b"abcdef")], &[]).unwrap();
        let mut buf = [0u8; 4];
        let r = recv_with_fds(&b, &mut buf, 0, 0).unwrap();
        assert_eq!(r.len, 4);
        assert!(r.data_truncated());
        let e = recv_with_fds(&b, &mut buf, 0, libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf, 1, 0).unwrap().len, 0);
    }
}
