//! The partition host launcher: one small process per remote backend,
//! started when the backend is created (before the daemon confines
//! itself), which starts and kills partition hosts for it. Once the
//! daemon's system-call filter is on, the daemon can no longer create
//! processes; it asks the launcher instead, over a socket pair.
//!
//! The launcher is `vgpu-partition-host --launcher`: single-threaded; it
//! closes every inherited descriptor but its socket, switches to the
//! daemon's unprivileged user (when started as root), empties its
//! capabilities and sets no new privileges before it answers, so every
//! host it starts inherits all of that. A host is the same program,
//! executed through `/proc/self/exe`, with one end of a fresh socket pair;
//! the other end goes back to the daemon with `SCM_RIGHTS`. The launcher
//! kills only its own children, reaps them and reports how they ended;
//! a launcher of shared hosts (`--hosts shared`, spatial partitions) keeps
//! one host for all partitions and hands it each new partition's socket;
//! when the daemon's end closes (the backend is dropped, or the daemon
//! died) it kills its hosts, reaps them and exits.
//!
//! Messages are fixed-size records on a `SOCK_SEQPACKET` pair, one
//! request and one reply at a time; the daemon checks every reply (kind,
//! process id, descriptors) and gives up on a launcher that breaks a rule
//! or stays silent past [`REPLY_TIMEOUT`]: no host can be started after
//! that.
//!
//! - `client.rs`: the daemon's side ([`ProcessLauncher`], [`HostProcess`]).
//! - this file: the records both sides exchange, and their socket; the
//!   launcher process that answers them is `vgpu-partition-host`'s.

mod client;

use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use vgpu_confine::SeccompMode;
use vgpu_sys::scm;

pub use client::{HostPolicy, HostProcess, ProcessLauncher};

/// Longest wait for any answer of the launcher (it forks and answers; it
/// does not wait for the host to start).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait for a killed host to be reported dead.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Most hosts (running, or ended and not yet reported) one launcher keeps.
pub const MAX_HOSTS: usize = 1024;

const MSG_LEN: usize = 12;

/// Request: the launcher's pid ([`READY`]).
pub const HELLO: u32 = 1;
/// Request: start a host ([`SPAWNED`], with the daemon's end of its socket).
pub const SPAWN: u32 = 2;
/// Request: kill a host ([`DONE`]).
pub const KILL: u32 = 3;
/// Request: how a host is ([`RUNNING`], or [`EXITED`] once, then forgotten).
pub const STATUS: u32 = 4;
/// Request: kill a host and reap it without a report ([`DONE`]).
pub const RELEASE: u32 = 5;
/// Reply to [`HELLO`].
pub const READY: u32 = 0x81;
/// Reply to [`SPAWN`].
pub const SPAWNED: u32 = 0x82;
/// Reply to [`KILL`] and [`RELEASE`].
pub const DONE: u32 = 0x83;
/// Reply to [`STATUS`]: the host runs.
pub const RUNNING: u32 = 0x84;
/// Reply to [`STATUS`]: the host ended, with the wait status as value.
pub const EXITED: u32 = 0x85;
/// Reply to any request that was refused, with an errno as value.
pub const FAILED: u32 = 0x86;

/// [`SPAWNED`]'s value for a connection to a shared host (the launcher's
/// hosts are shared: `--hosts shared`): the host serves other partitions
/// too, so the daemon neither kills nor reaps it; it exits when its
/// partitions' state is lost, and the next [`SPAWN`] starts a fresh one.
pub const SHARED_HOST: i32 = 1;

/// One record: what, which process, and a value (an errno, a wait status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    /// A request or reply kind.
    pub op: u32,
    /// The process it is about.
    pub pid: i32,
    /// An errno, a wait status, or 0.
    pub value: i32,
}

impl Msg {
    fn encode(self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(&self.op.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    fn decode(b: &[u8; MSG_LEN]) -> Msg {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        Msg {
            op: u32::from_le_bytes(word(0)),
            pid: i32::from_le_bytes(word(4)),
            value: i32::from_le_bytes(word(8)),
        }
    }
}

/// A `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Bounds every send and receive on `fd` to `t`.
pub fn set_timeouts(fd: RawFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: `tv` is a valid timeval of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Room for the fds of one record: one is expected with a new host; a
/// peer that attaches a few more has them received (and refused with
/// their record), and beyond that the kernel cuts them (`MSG_CTRUNC`),
/// which is refused too.
const FDS_ROOM: usize = 12;

/// Sends one record, with `fd` attached when given.
pub fn send(sock: BorrowedFd<'_>, m: Msg, fd: Option<RawFd>) -> io::Result<()> {
    let bytes = m.encode();
    let fds = fd.as_slice();
    let n = scm::send_with_fds(&sock, &[IoSlice::new(&bytes)], fds)?;
    if n != MSG_LEN {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// What [`recv`] got.
pub enum Got {
    /// The peer closed its end.
    Closed,
    /// A record and the descriptors that came with it (all of them, so
    /// that unexpected ones are closed, not leaked).
    Msg(Msg, Vec<OwnedFd>),
}

/// Receives one record; a record of another size, or cut descriptors,
/// is an error.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Got> {
    let mut bytes = [0u8; MSG_LEN + 1];
    let got = scm::recv_with_fds(&sock, &mut bytes, FDS_ROOM, 0)?;
    let n = got.len;
    if n == 0 && got.fds.is_empty() {
        return Ok(Got::Closed);
    }
    if n != MSG_LEN || got.data_truncated() || got.fds_truncated() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a record of {n} bytes (flags {:#x})", got.flags),
        ));
    }
    let mut b = [0u8; MSG_LEN];
    b.copy_from_slice(&bytes[..MSG_LEN]);
    Ok(Got::Msg(Msg::decode(&b), got.fds))
}

/// `m` as the launcher's and the hosts' `--seccomp` takes it.
pub fn mode_name(m: SeccompMode) -> &'static str {
    match m {
        SeccompMode::Strict => "strict",
        SeccompMode::Log => "log",
        SeccompMode::Off => "off",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_records_roundtrip() {
        let m = Msg {
            op: SPAWNED,
            pid: 1234,
            value: -5,
        };
        assert_eq!(Msg::decode(&m.encode()), m);
    }
}
