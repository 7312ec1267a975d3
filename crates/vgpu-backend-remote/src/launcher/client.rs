//! The daemon's side of the launcher: starts it, asks it for hosts and
//! checks every answer.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::debug;
use vgpu_confine::{Account, SeccompMode};
use vgpu_sys::{error_limited, lock, warn_limited};

use super::{
    mode_name, recv, send, seqpacket_pair, set_timeouts, Got, Msg, DONE, EXITED, FAILED, HELLO,
    KILL, READY, RELEASE, REPLY_TIMEOUT, RUNNING, SHARED_HOST, SPAWN, SPAWNED, STATUS, WAIT_LIMIT,
};
use crate::{HostLink, Launcher};

/// Whom hosts run as and how they are confined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// The hosts' system-call filter ([`vgpu_confine::Role::PartitionHost`]).
    pub seccomp: SeccompMode,
    /// The unprivileged account the launcher switches to at start, when
    /// started as root (the daemon's `user`). Without it the launcher and
    /// its hosts keep the daemon's ids, without capabilities.
    pub account: Option<Account>,
    /// One host serves every partition (spatial mode): each new
    /// partition's socket goes to the running host, or to a fresh one
    /// when it has ended.
    pub shared: bool,
}

/// The daemon's link to its launcher; shared by the backend and every
/// host process handle, so the launcher lives as long as any of them.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) state: Mutex<ClientState>,
    pub(super) pid: u32,
}

#[derive(Debug)]
pub(super) struct ClientState {
    pub(super) sock: Option<OwnedFd>,
    pub(super) process: Option<Child>,
    /// Why the launcher can no longer be used.
    pub(super) broken: Option<String>,
}

impl Client {
    /// A usable link over `sock` to the launcher `pid` (its process when
    /// the daemon started it).
    pub(super) fn new(sock: OwnedFd, process: Option<Child>, pid: u32) -> Client {
        Client {
            state: Mutex::new(ClientState {
                sock: Some(sock),
                process,
                broken: None,
            }),
            pid,
        }
    }

    /// One request, one checked reply. Any failure (timeout, a record
    /// that breaks the rules, the launcher gone) ends the launcher's use.
    pub(super) fn call(&self, req: Msg, accept: &[u32]) -> io::Result<(Msg, Option<OwnedFd>)> {
        let mut st = lock(&self.state);
        if let Some(why) = &st.broken {
            return Err(io::Error::other(format!(
                "the partition host launcher is unusable: {why}"
            )));
        }
        let Some(sock) = st.sock.as_ref().map(AsFd::as_fd) else {
            return Err(io::Error::other("the partition host launcher is closed"));
        };
        let r = (|| {
            send(sock, req, None).map_err(|e| format!("cannot send: {e}"))?;
            let (m, mut fds) = match recv(sock) {
                Ok(Got::Msg(m, fds)) => (m, fds),
                Ok(Got::Closed) => return Err("it exited".to_string()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(format!("no answer within {REPLY_TIMEOUT:?}"))
                }
                Err(e) => return Err(format!("cannot receive: {e}")),
            };
            if !accept.contains(&m.op) && m.op != FAILED {
                return Err(format!("answer {:#x} to request {}", m.op, req.op));
            }
            let fd = match (m.op, fds.len()) {
                (SPAWNED, 1) => fds.pop(),
                (SPAWNED, n) => return Err(format!("a new host with {n} descriptors")),
                (_, 0) => None,
                (op, n) => return Err(format!("answer {op:#x} with {n} descriptors")),
            };
            match m.op {
                SPAWNED if m.pid <= 0 => return Err(format!("a new host with pid {}", m.pid)),
                READY | SPAWNED => {}
                _ if m.pid != req.pid => {
                    return Err(format!("answer about pid {} for pid {}", m.pid, req.pid))
                }
                _ => {}
            }
            if let Some(f) = &fd {
                check_unix_socket(f.as_raw_fd())
                    .map_err(|e| format!("the new host's descriptor: {e}"))?;
            }
            Ok((m, fd))
        })();
        match r {
            Ok(x) => Ok(x),
            Err(why) => {
                error_limited!(
                    "partition host launcher {}: {why}; no more hosts can start",
                    self.pid
                );
                st.broken = Some(why.clone());
                // Closing our end makes it kill its hosts and exit.
                st.sock = None;
                Err(io::Error::other(format!("partition host launcher: {why}")))
            }
        }
    }
}

/// Whether `fd` is a UNIX socket (the daemon's filter allows
/// `getsockname`, not `fstat`).
fn check_unix_socket(fd: RawFd) -> io::Result<()> {
    // SAFETY: sockaddr_storage is plain data.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr` has room for `len` bytes.
    let rc = unsafe {
        libc::getsockname(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if i32::from(addr.ss_family) != libc::AF_UNIX {
        return Err(io::Error::other(format!(
            "address family {}",
            addr.ss_family
        )));
    }
    Ok(())
}

impl Drop for Client {
    /// Closes the launcher's socket (it kills its hosts and exits) and
    /// reaps it.
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.sock = None;
        if let Some(mut child) = st.process.take() {
            match child.wait() {
                Ok(s) if !s.success() => {
                    warn_limited!("partition host launcher {} ended: {s}", self.pid)
                }
                Ok(_) => debug!("partition host launcher {} ended", self.pid),
                Err(e) => warn_limited!("partition host launcher {}: {e}", self.pid),
            }
        }
    }
}

/// A partition host process, started, killed and reaped by the launcher.
#[derive(Debug)]
pub struct HostProcess {
    pub(super) client: Arc<Client>,
    pub(super) pid: u32,
    /// How it ended, once the launcher reported it (and forgot it).
    pub(super) ended: Option<ExitStatus>,
}

impl HostProcess {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.pid
    }

    fn call(&self, op: u32, accept: &[u32]) -> io::Result<Msg> {
        let req = Msg {
            op,
            pid: self.pid as i32,
            value: 0,
        };
        let (m, _) = self.client.call(req, accept)?;
        if m.op == FAILED {
            return Err(io::Error::from_raw_os_error(m.value));
        }
        Ok(m)
    }

    /// Kills it (SIGKILL); it stays to be reaped by [`HostProcess::wait`].
    pub fn kill(&mut self) -> io::Result<()> {
        if self.ended.is_some() {
            return Ok(());
        }
        self.call(KILL, &[DONE]).map(|_| ())
    }

    /// How it ended, if it has.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.ended.is_none() {
            let m = self.call(STATUS, &[RUNNING, EXITED])?;
            if m.op == EXITED {
                self.ended = Some(ExitStatus::from_raw(m.value));
            }
        }
        Ok(self.ended)
    }

    /// Waits until it has ended (at most [`WAIT_LIMIT`]).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        let deadline = Instant::now() + WAIT_LIMIT;
        let mut pause = Duration::from_micros(100);
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("partition host {} still runs", self.pid),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

impl Drop for HostProcess {
    /// A host not reaped through this handle is killed and left to the
    /// launcher to reap.
    fn drop(&mut self) {
        if self.ended.is_none() {
            let _ = self.call(RELEASE, &[DONE]);
        }
    }
}

/// Starts partition hosts through a launcher process.
#[derive(Debug)]
pub struct ProcessLauncher {
    client: Arc<Client>,
    program: PathBuf,
    args: Vec<OsString>,
}

impl ProcessLauncher {
    /// Starts `program --launcher` for hosts run with `args` (see
    /// [`crate::HostArgs`]; `--fd` is added) under the strict filter, with
    /// the caller's ids.
    pub fn new(program: PathBuf, args: Vec<OsString>) -> io::Result<ProcessLauncher> {
        ProcessLauncher::with_policy(program, args, &HostPolicy::default())
    }

    /// As [`ProcessLauncher::new`], hosts confined by `policy`. Call it
    /// before the process confines itself: it creates a process.
    pub fn with_policy(
        program: PathBuf,
        args: Vec<OsString>,
        policy: &HostPolicy,
    ) -> io::Result<ProcessLauncher> {
        let (ours, theirs) = seqpacket_pair()?;
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(&program);
        cmd.arg("--launcher")
            .arg("--fd")
            .arg(fd.to_string())
            .arg("--seccomp")
            .arg(mode_name(policy.seccomp));
        if policy.shared {
            cmd.arg("--hosts").arg("shared");
        }
        if let Some(a) = &policy.account {
            let groups: Vec<String> = a.groups.iter().map(u32::to_string).collect();
            cmd.arg("--uid")
                .arg(a.uid.to_string())
                .arg("--gid")
                .arg(a.gid.to_string())
                .arg("--groups")
                .arg(groups.join(","));
        }
        cmd.arg("--")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: the closure runs between fork and exec and makes one
        // async-signal-safe call (fcntl), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // Keep the launcher's socket across exec.
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let child = cmd.spawn()?;
        drop(theirs);
        let pid = child.id();
        set_timeouts(ours.as_raw_fd(), REPLY_TIMEOUT)?;
        let client = Arc::new(Client::new(ours, Some(child), pid));
        // It answers once it has dropped what it must not pass on.
        let hello = Msg {
            op: HELLO,
            pid: 0,
            value: 0,
        };
        let r = match client.call(hello, &[READY]) {
            Ok((m, _)) if m.op == READY && m.pid == pid as i32 => Ok(()),
            Ok((m, _)) => Err(io::Error::other(format!(
                "the partition host launcher answered {m:?}"
            ))),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            // Not a launcher, or a broken one: it may not exit on its own,
            // and reaping it (when `client` goes) must not wait forever.
            if let Some(c) = lock(&client.state).process.as_mut() {
                let _ = c.kill();
            }
            return Err(e);
        }
        debug!("partition host launcher {pid} started");
        Ok(ProcessLauncher {
            client,
            program,
            args,
        })
    }

    /// The program it runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The hosts' arguments (without `--fd`).
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// The launcher's process id.
    pub fn pid(&self) -> u32 {
        self.client.pid
    }
}

impl Launcher for ProcessLauncher {
    fn launch(&self) -> io::Result<HostLink> {
        let req = Msg {
            op: SPAWN,
            pid: 0,
            value: 0,
        };
        let (m, fd) = self.client.call(req, &[SPAWNED])?;
        let fd = match (m.op, fd) {
            (SPAWNED, Some(fd)) => fd,
            (FAILED, _) => return Err(io::Error::from_raw_os_error(m.value)),
            _ => return Err(io::Error::other("no descriptor for the new host")),
        };
        if m.value == SHARED_HOST {
            // Not this partition's alone: closing the socket is all.
            return Ok(HostLink {
                stream: UnixStream::from(fd),
                process: None,
                shared_pid: Some(m.pid as u32),
            });
        }
        Ok(HostLink {
            stream: UnixStream::from(fd),
            process: Some(HostProcess {
                client: Arc::clone(&self.client),
                pid: m.pid as u32,
                ended: None,
            }),
            shared_pid: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply that breaks a rule makes the launcher unusable, and every
    /// descriptor that came with it is closed.
    #[test]
    fn test_bad_replies_are_refused() {
        let cases: [(Msg, bool); 4] = [
            // Another pid than asked about.
            (
                Msg {
                    op: DONE,
                    pid: 99,
                    value: 0,
                },
                false,
            ),
            // A kind that does not answer the request.
            (
                Msg {
                    op: RUNNING,
                    pid: 7,
                    value: 0,
                },
                false,
            ),
            // A descriptor with a plain answer.
            (
                Msg {
                    op: DONE,
                    pid: 7,
                    value: 0,
                },
                true,
            ),
            // A new host without a descriptor (asked as a kill: wrong kind too).
            (
                Msg {
                    op: SPAWNED,
                    pid: 7,
                    value: 0,
                },
                false,
            ),
        ];
        for (bad, with_fd) in cases {
            let (ours, theirs) = seqpacket_pair().unwrap();
            set_timeouts(ours.as_raw_fd(), Duration::from_secs(2)).unwrap();
            let client = Client::new(ours, None, 1);
            let peer = std::thread::spawn(move || {
                let Ok(Got::Msg(_, _)) = recv(theirs.as_fd()) else {
                    panic!("no request");
                };
                let extra = std::fs::File::open("/dev/null").unwrap();
                let fd = with_fd.then(|| extra.as_raw_fd());
                send(theirs.as_fd(), bad, fd).unwrap();
                // The client closes its end after a bad reply.
                assert!(matches!(recv(theirs.as_fd()), Ok(Got::Closed)));
            });
            let req = Msg {
                op: KILL,
                pid: 7,
                value: 0,
            };
            assert!(client.call(req, &[DONE]).is_err(), "{bad:?}");
            assert!(client.call(req, &[DONE]).is_err(), "unusable after {bad:?}");
            peer.join().unwrap();
        }
    }

    #[test]
    fn test_silence_times_out() {
        let (ours, _theirs) = seqpacket_pair().unwrap();
        set_timeouts(ours.as_raw_fd(), Duration::from_millis(100)).unwrap();
        let client = Client::new(ours, None, 1);
        let req = Msg {
            op: STATUS,
            pid: 7,
            value: 0,
        };
        let e = client.call(req, &[RUNNING]).unwrap_err().to_string();
        assert!(e.contains("no answer"), "{e}");
    }
}
