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
//! when the daemon's end closes (the backend is dropped, or the daemon
//! died) it kills its hosts, reaps them and exits.
//!
//! Messages are fixed-size records on a `SOCK_SEQPACKET` pair, one
//! request and one reply at a time; the daemon checks every reply (kind,
//! process id, descriptors) and gives up on a launcher that breaks a rule
//! or stays silent past [`REPLY_TIMEOUT`]: no host can be started after
//! that.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use vgpu_confine::{Account, SeccompMode};

use crate::{lock, HostLink, Launcher, HOST_PROGRAM};

/// Longest wait for any answer of the launcher (it forks and answers; it
/// does not wait for the host to start).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait for a killed host to be reported dead.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Most hosts (running, or ended and not yet reported) one launcher keeps.
pub const MAX_HOSTS: usize = 1024;

const MSG_LEN: usize = 12;

// Requests.
const HELLO: u32 = 1;
const SPAWN: u32 = 2;
const KILL: u32 = 3;
const STATUS: u32 = 4;
const RELEASE: u32 = 5;
// Replies.
const READY: u32 = 0x81;
const SPAWNED: u32 = 0x82;
const DONE: u32 = 0x83;
const RUNNING: u32 = 0x84;
const EXITED: u32 = 0x85;
const FAILED: u32 = 0x86;

/// One record: what, which process, and a value (an errno, a wait status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Msg {
    op: u32,
    pid: i32,
    value: i32,
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

/// Whom hosts run as and how they are confined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// The hosts' system-call filter ([`vgpu_confine::Role::PartitionHost`]).
    pub seccomp: SeccompMode,
    /// The unprivileged account the launcher switches to at start, when
    /// started as root (the daemon's `user`). Without it the launcher and
    /// its hosts keep the daemon's ids, without capabilities.
    pub account: Option<Account>,
}

/// A `SOCK_SEQPACKET` pair, both ends close-on-exec.
fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
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

fn set_timeouts(fd: RawFd, t: Duration) -> io::Result<()> {
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

/// Sends one record, with `fd` attached when given.
fn send(sock: RawFd, m: Msg, fd: Option<RawFd>) -> io::Result<()> {
    let bytes = m.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: MSG_LEN,
    };
    // Room for one descriptor, aligned for a cmsghdr.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(raw) = fd {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer (32 bytes) holds one cmsghdr with one
        // descriptor (CMSG_SPACE of 4 bytes is 24 on 64-bit Linux).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), raw);
        }
    }
    // SAFETY: `msg` points at live buffers for the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != MSG_LEN {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// What [`recv`] got.
enum Got {
    /// The peer closed its end.
    Closed,
    /// A record and the descriptors that came with it (all of them, so
    /// that unexpected ones are closed, not leaked).
    Msg(Msg, Vec<OwnedFd>),
}

/// Receives one record; a record of another size, or cut descriptors,
/// is an error.
fn recv(sock: RawFd) -> io::Result<Got> {
    let mut bytes = [0u8; MSG_LEN + 1];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: `msg` points at live buffers for the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walks the control messages the kernel wrote into `cbuf`,
    // taking ownership of each descriptor it passed.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(Got::Closed);
    }
    if n != MSG_LEN || msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a record of {n} bytes (flags {:#x})", msg.msg_flags),
        ));
    }
    let mut b = [0u8; MSG_LEN];
    b.copy_from_slice(&bytes[..MSG_LEN]);
    Ok(Got::Msg(Msg::decode(&b), fds))
}

// ---- the daemon's side -------------------------------------------------

/// The daemon's link to its launcher; shared by the backend and every
/// host process handle, so the launcher lives as long as any of them.
#[derive(Debug)]
struct Client {
    state: Mutex<ClientState>,
    pid: u32,
}

#[derive(Debug)]
struct ClientState {
    sock: Option<OwnedFd>,
    process: Option<Child>,
    /// Why the launcher can no longer be used.
    broken: Option<String>,
}

impl Client {
    /// One request, one checked reply. Any failure (timeout, a record
    /// that breaks the rules, the launcher gone) ends the launcher's use.
    fn call(&self, req: Msg, accept: &[u32]) -> io::Result<(Msg, Option<OwnedFd>)> {
        let mut st = lock(&self.state);
        if let Some(why) = &st.broken {
            return Err(io::Error::other(format!(
                "the partition host launcher is unusable: {why}"
            )));
        }
        let Some(sock) = st.sock.as_ref().map(AsRawFd::as_raw_fd) else {
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
                error!(
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
                Ok(s) if !s.success() => warn!("partition host launcher {} ended: {s}", self.pid),
                Ok(_) => debug!("partition host launcher {} ended", self.pid),
                Err(e) => warn!("partition host launcher {}: {e}", self.pid),
            }
        }
    }
}

/// A partition host process, started, killed and reaped by the launcher.
#[derive(Debug)]
pub struct HostProcess {
    client: Arc<Client>,
    pid: u32,
    /// How it ended, once the launcher reported it (and forgot it).
    ended: Option<ExitStatus>,
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
        let client = Arc::new(Client {
            state: Mutex::new(ClientState {
                sock: Some(ours),
                process: Some(child),
                broken: None,
            }),
            pid,
        });
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
        Ok(HostLink {
            stream: UnixStream::from(fd),
            process: Some(HostProcess {
                client: Arc::clone(&self.client),
                pid: m.pid as u32,
                ended: None,
            }),
        })
    }
}

fn mode_name(m: SeccompMode) -> &'static str {
    match m {
        SeccompMode::Strict => "strict",
        SeccompMode::Log => "log",
        SeccompMode::Off => "off",
    }
}

// ---- the launcher's side -----------------------------------------------

/// The launcher's command line (after `--launcher`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherArgs {
    /// Its socket to the daemon.
    pub fd: RawFd,
    /// The hosts' filter mode.
    pub seccomp: SeccompMode,
    /// Ids to switch to: user, group, supplementary groups.
    pub ids: Option<(u32, u32, Vec<u32>)>,
    /// The hosts' arguments.
    pub host_args: Vec<OsString>,
}

impl LauncherArgs {
    /// Parses `--fd N --seccomp MODE [--uid U --gid G --groups A,B] -- HOST ARGS`.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<LauncherArgs, String> {
        let mut it = args.into_iter();
        let (mut fd, mut seccomp, mut uid, mut gid, mut groups) = (None, None, None, None, None);
        loop {
            let Some(a) = it.next() else {
                return Err("-- and the host's arguments are required".into());
            };
            let a = a.into_string().map_err(|a| format!("bad argument {a:?}"))?;
            if a == "--" {
                break;
            }
            let v = it
                .next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{a} needs a value"))?;
            let id = |v: &str| v.parse::<u32>().map_err(|_| format!("{a}: bad id {v:?}"));
            match a.as_str() {
                "--fd" => {
                    fd = Some(
                        v.parse::<RawFd>()
                            .ok()
                            .filter(|&f| f > 2)
                            .ok_or_else(|| format!("--fd: bad descriptor {v:?}"))?,
                    )
                }
                "--seccomp" => seccomp = Some(v.parse::<SeccompMode>()?),
                "--uid" => uid = Some(id(&v)?),
                "--gid" => gid = Some(id(&v)?),
                "--groups" => {
                    groups = Some(
                        v.split(',')
                            .filter(|g| !g.is_empty())
                            .map(id)
                            .collect::<Result<Vec<u32>, String>>()?,
                    )
                }
                _ => return Err(format!("unknown argument {a:?}")),
            }
        }
        let ids = match (uid, gid, groups) {
            (None, None, None) => None,
            (Some(u), Some(g), gs) => Some((u, g, gs.unwrap_or_default())),
            _ => return Err("--uid and --gid go together".into()),
        };
        Ok(LauncherArgs {
            fd: fd.ok_or("--fd is required")?,
            seccomp: seccomp.ok_or("--seccomp is required")?,
            ids,
            host_args: it.collect(),
        })
    }
}

/// Why the launcher stopped.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// Its privileges could not be dropped.
    #[error("{0}")]
    Confine(#[from] vgpu_confine::ConfineError),
    /// The daemon's socket failed.
    #[error("socket to the daemon: {0}")]
    Socket(io::Error),
}

/// A host the launcher started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    Running,
    /// Ended with this wait status, not yet reported.
    Ended(i32),
    /// Given up by the daemon: reaped without a report.
    Released,
}

/// Drops what the hosts must not inherit: root (switching to `ids`),
/// every capability; sets no new privileges.
pub fn drop_privileges(ids: Option<&(u32, u32, Vec<u32>)>) -> Result<(), LauncherError> {
    if let Some((uid, gid, groups)) = ids {
        let account = Account {
            name: format!("uid {uid}"),
            uid: *uid,
            gid: *gid,
            groups: groups.clone(),
        };
        if vgpu_confine::is_root() {
            vgpu_confine::drop_privileges(&account)?;
        } else {
            // SAFETY: getuid and getgid cannot fail.
            let (u, g) = unsafe { (libc::getuid(), libc::getgid()) };
            if (u, g) != (*uid, *gid) {
                return Err(vgpu_confine::ConfineError::Remains(format!(
                    "runs as uid {u} gid {g}, not as uid {uid} gid {gid}, and cannot switch"
                ))
                .into());
            }
        }
    }
    vgpu_confine::clear_capabilities()?;
    vgpu_confine::set_no_new_privs()?;
    Ok(())
}

/// The launcher: answers the daemon on `sock` until it closes its end,
/// then kills and reaps every host and returns. Call after
/// [`drop_privileges`], in a single-threaded process.
pub fn serve(sock: OwnedFd, args: &LauncherArgs) -> Result<(), LauncherError> {
    let fd = sock.as_raw_fd();
    let mut hosts: BTreeMap<i32, Host> = BTreeMap::new();
    let r = (|| loop {
        reap(&mut hosts);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. The timeout bounds how long ended
        // hosts stay unreaped while the daemon asks nothing.
        let n = unsafe { libc::poll(&mut pfd, 1, 200) };
        if n == 0 {
            continue;
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(LauncherError::Socket(e));
        }
        let req = match recv(fd) {
            Ok(Got::Closed) => return Ok(()),
            // Descriptors from the daemon are never expected: closed.
            Ok(Got::Msg(m, _)) => m,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                warn!("partition host launcher: {e}");
                let failed = Msg {
                    op: FAILED,
                    pid: 0,
                    value: libc::EINVAL,
                };
                send(fd, failed, None).map_err(LauncherError::Socket)?;
                continue;
            }
            Err(e) => return Err(LauncherError::Socket(e)),
        };
        reap(&mut hosts);
        let (reply, passed) = answer(req, &mut hosts, args);
        let r = send(fd, reply, passed.as_ref().map(AsRawFd::as_raw_fd));
        // Our end of the host's socket goes either way.
        drop(passed);
        r.map_err(LauncherError::Socket)?;
    })();
    // The daemon is gone (or the link broke): so are its hosts.
    for (&pid, h) in &hosts {
        if *h == Host::Running {
            // SAFETY: kill of a child of ours, not yet reaped (its pid
            // cannot have been reused).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for (&pid, h) in &hosts {
        if matches!(h, Host::Running | Host::Released) {
            let mut status = 0;
            // SAFETY: waits for our own child; `status` is a valid pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
    r
}

/// Collects every ended child.
fn reap(hosts: &mut BTreeMap<i32, Host>) {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid pointer; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        match hosts.get(&pid) {
            Some(Host::Running) => {
                hosts.insert(pid, Host::Ended(status));
            }
            Some(Host::Released) => {
                hosts.remove(&pid);
            }
            _ => {}
        }
    }
}

fn answer(
    req: Msg,
    hosts: &mut BTreeMap<i32, Host>,
    args: &LauncherArgs,
) -> (Msg, Option<OwnedFd>) {
    let reply = |op, value| Msg {
        op,
        pid: req.pid,
        value,
    };
    let failed = |e: i32| reply(FAILED, e);
    if ![HELLO, SPAWN, KILL, STATUS, RELEASE].contains(&req.op) {
        return (failed(libc::EINVAL), None);
    }
    if req.op != HELLO && req.op != SPAWN && !hosts.contains_key(&req.pid) {
        // Not one of ours (or already reported): nothing is done to it.
        return (failed(libc::ESRCH), None);
    }
    match req.op {
        HELLO => (
            Msg {
                op: READY,
                pid: std::process::id() as i32,
                value: 0,
            },
            None,
        ),
        SPAWN if hosts.len() >= MAX_HOSTS => (failed(libc::EAGAIN), None),
        SPAWN => match spawn_host(args) {
            Ok((pid, ours)) => {
                hosts.insert(pid, Host::Running);
                (
                    Msg {
                        op: SPAWNED,
                        pid,
                        value: 0,
                    },
                    Some(ours),
                )
            }
            Err(e) => {
                warn!("partition host launcher: cannot start a host: {e}");
                (failed(e.raw_os_error().unwrap_or(libc::EIO)), None)
            }
        },
        KILL | RELEASE => {
            let h = hosts[&req.pid];
            if h == Host::Running {
                // SAFETY: kill of a child of ours, not yet reaped.
                unsafe { libc::kill(req.pid, libc::SIGKILL) };
            }
            if req.op == RELEASE {
                if matches!(h, Host::Ended(_)) {
                    hosts.remove(&req.pid);
                } else {
                    hosts.insert(req.pid, Host::Released);
                }
            }
            (reply(DONE, 0), None)
        }
        STATUS => match hosts[&req.pid] {
            Host::Running => (reply(RUNNING, 0), None),
            Host::Ended(s) => {
                hosts.remove(&req.pid);
                (reply(EXITED, s), None)
            }
            Host::Released => (failed(libc::ESRCH), None),
        },
        _ => (failed(libc::EINVAL), None),
    }
}

/// Starts one host: this program again, with the hosts' arguments and
/// one end of a new socket pair; returns its pid and the other end.
fn spawn_host(args: &LauncherArgs) -> io::Result<(i32, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let parent = std::process::id();
    // This very program, even if the file was replaced since.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(HOST_PROGRAM)
        .arg("--seccomp")
        .arg(mode_name(args.seccomp))
        .args(&args.host_args)
        .arg("--fd")
        .arg(fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe system calls (prctl, getppid, fcntl), allocating
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Die with the launcher (single-threaded: the thread that
            // forks is the process).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Keep the host's socket across exec.
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let child = cmd.spawn()?;
    drop(theirs);
    // Reaped through waitpid in `reap`, not through `child`.
    Ok((child.id() as i32, OwnedFd::from(ours)))
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

    #[test]
    fn test_launcher_args() {
        let parse = |s: &str| LauncherArgs::parse(s.split_whitespace().map(OsString::from));
        let a = parse("--fd 5 --seccomp log --uid 7 --gid 8 --groups 8,9 -- --backend x").unwrap();
        assert_eq!(a.fd, 5);
        assert_eq!(a.seccomp, SeccompMode::Log);
        assert_eq!(a.ids, Some((7, 8, vec![8, 9])));
        assert_eq!(a.host_args, vec![OsString::from("--backend"), "x".into()]);
        assert_eq!(parse("--fd 5 --seccomp strict --").unwrap().ids, None);
        assert!(parse("--fd 5 --seccomp strict").is_err());
        assert!(parse("--fd 2 --seccomp strict --").is_err());
        assert!(parse("--fd 5 --seccomp kill --").is_err());
        assert!(parse("--fd 5 --seccomp strict --uid 1 --").is_err());
        assert!(parse("--fd 5 --seccomp strict --groups x --uid 1 --gid 1 --").is_err());
        assert!(parse("--seccomp strict --").is_err());
    }

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
            let client = Client {
                state: Mutex::new(ClientState {
                    sock: Some(ours),
                    process: None,
                    broken: None,
                }),
                pid: 1,
            };
            let peer = std::thread::spawn(move || {
                let Ok(Got::Msg(_, _)) = recv(theirs.as_raw_fd()) else {
                    panic!("no request");
                };
                let extra = std::fs::File::open("/dev/null").unwrap();
                let fd = with_fd.then(|| extra.as_raw_fd());
                send(theirs.as_raw_fd(), bad, fd).unwrap();
                // The client closes its end after a bad reply.
                assert!(matches!(recv(theirs.as_raw_fd()), Ok(Got::Closed)));
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

    /// The launcher's side acts only on its own children: asked to kill or
    /// report a pid it did not start, it refuses, and it stops when the
    /// daemon's end closes. (No host is started here: that runs this
    /// program again; the integration tests do.)
    #[test]
    fn test_the_launcher_touches_only_its_own_children() {
        let (ours, theirs) = seqpacket_pair().unwrap();
        set_timeouts(ours.as_raw_fd(), Duration::from_secs(5)).unwrap();
        let args = LauncherArgs {
            fd: theirs.as_raw_fd(),
            seccomp: SeccompMode::Strict,
            ids: None,
            host_args: Vec::new(),
        };
        let server = std::thread::spawn(move || serve(theirs, &args));
        let client = Arc::new(Client {
            state: Mutex::new(ClientState {
                sock: Some(ours),
                process: None,
                broken: None,
            }),
            pid: std::process::id(),
        });
        let hello = Msg {
            op: HELLO,
            pid: 0,
            value: 0,
        };
        let (m, fd) = client.call(hello, &[READY]).unwrap();
        assert_eq!((m.op, m.pid), (READY, std::process::id() as i32));
        assert!(fd.is_none());
        // pid 1 and this process: not its children.
        for pid in [1, std::process::id()] {
            let mut p = HostProcess {
                client: Arc::clone(&client),
                pid,
                ended: None,
            };
            for r in [p.kill().err(), p.try_wait().err()] {
                assert_eq!(r.and_then(|e| e.raw_os_error()), Some(libc::ESRCH));
            }
            // Dropping it asks to forget it: refused the same way.
        }
        // A request of an unknown kind is refused; the launcher goes on.
        let odd = Msg {
            op: 77,
            pid: 0,
            value: 0,
        };
        let (m, _) = client.call(odd, &[]).unwrap();
        assert_eq!((m.op, m.value), (FAILED, libc::EINVAL));
        assert!(client.call(hello, &[READY]).is_ok());
        drop(client);
        server.join().unwrap().unwrap();
    }

    #[test]
    fn test_silence_times_out() {
        let (ours, _theirs) = seqpacket_pair().unwrap();
        set_timeouts(ours.as_raw_fd(), Duration::from_millis(100)).unwrap();
        let client = Client {
            state: Mutex::new(ClientState {
                sock: Some(ours),
                process: None,
                broken: None,
            }),
            pid: 1,
        };
        let req = Msg {
            op: STATUS,
            pid: 7,
            value: 0,
        };
        let e = client.call(req, &[RUNNING]).unwrap_err().to_string();
        assert!(e.contains("no answer"), "{e}");
    }
}
