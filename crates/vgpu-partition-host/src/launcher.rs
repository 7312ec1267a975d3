//! The launcher process: answers the daemon, starting, killing and
//! reaping hosts, until the daemon's end closes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use vgpu_confine::{Account, SeccompMode};
use vgpu_sys::{poll, warn_limited};

use vgpu_backend_remote::launcher::{
    mode_name, recv, send, seqpacket_pair, set_timeouts, Got, Msg, DONE, EXITED, FAILED, HELLO,
    KILL, MAX_HOSTS, READY, RELEASE, RUNNING, SHARED_HOST, SPAWN, SPAWNED, STATUS,
};
use vgpu_backend_remote::HOST_PROGRAM;

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
    /// One shared host serves every partition (`--hosts shared`).
    pub shared: bool,
}

impl LauncherArgs {
    /// Parses `--fd N --seccomp MODE [--hosts own|shared] [--uid U --gid G
    /// --groups A,B] -- HOST ARGS`.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<LauncherArgs, String> {
        let mut it = args.into_iter();
        let (mut fd, mut seccomp, mut uid, mut gid, mut groups) = (None, None, None, None, None);
        let mut shared = false;
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
                "--hosts" => {
                    shared = match v.as_str() {
                        "own" => false,
                        "shared" => true,
                        _ => return Err(format!("--hosts: {v:?} is not own or shared")),
                    }
                }
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
            shared,
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

/// The running shared host (`--hosts shared`): its pid and the socket on
/// which it takes each new partition's socket. Not in the hosts' table:
/// the daemon neither kills nor asks after it.
struct SharedHost {
    pid: i32,
    control: OwnedFd,
}

/// Longest the launcher waits to hand a shared host a socket: a host that
/// takes none for this long is stuck, and the partition is refused.
const HAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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
    let fd = sock.as_fd();
    let mut hosts: BTreeMap<i32, Host> = BTreeMap::new();
    let mut shared: Option<SharedHost> = None;
    let r = (|| loop {
        reap(&mut hosts, &mut shared);
        // The timeout bounds how long ended hosts stay unreaped while the
        // daemon asks nothing.
        match poll::poll_readable(&fd, 200) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return Err(LauncherError::Socket(e)),
        }
        let req = match recv(fd) {
            Ok(Got::Closed) => return Ok(()),
            // Descriptors from the daemon are never expected: closed.
            Ok(Got::Msg(m, _)) => m,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                warn_limited!("partition host launcher: {e}");
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
        reap(&mut hosts, &mut shared);
        let (reply, passed) = answer(req, &mut hosts, &mut shared, args);
        let r = send(fd, reply, passed.as_ref().map(AsRawFd::as_raw_fd));
        // Our end of the host's socket goes either way.
        drop(passed);
        r.map_err(LauncherError::Socket)?;
    })();
    // The daemon is gone (or the link broke): so are its hosts.
    if let Some(h) = shared.take() {
        // SAFETY: kill of a child of ours, not yet reaped.
        unsafe { libc::kill(h.pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid pointer.
        unsafe { libc::waitpid(h.pid, &mut status, 0) };
    }
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
fn reap(hosts: &mut BTreeMap<i32, Host>, shared: &mut Option<SharedHost>) {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid pointer; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if shared.as_ref().is_some_and(|h| h.pid == pid) {
            *shared = None;
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
    shared: &mut Option<SharedHost>,
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
        SPAWN if args.shared => match connect_shared(shared, args) {
            Ok((pid, ours)) => (
                Msg {
                    op: SPAWNED,
                    pid,
                    value: SHARED_HOST,
                },
                Some(ours),
            ),
            Err(e) => {
                warn_limited!("partition host launcher: cannot reach the shared host: {e}");
                (failed(e.raw_os_error().unwrap_or(libc::EIO)), None)
            }
        },
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
                warn_limited!("partition host launcher: cannot start a host: {e}");
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

/// A new partition's socket to the shared host, started first when none
/// runs (or the one running no longer takes sockets: it is ending).
/// Returns the host's pid and the daemon's end.
fn connect_shared(
    shared: &mut Option<SharedHost>,
    args: &LauncherArgs,
) -> io::Result<(i32, OwnedFd)> {
    for _ in 0..2 {
        if shared.is_none() {
            let (pid, control) = start_host(args, true)?;
            set_timeouts(control.as_raw_fd(), HAND_TIMEOUT)?;
            *shared = Some(SharedHost { pid, control });
        }
        let Some(h) = shared.as_ref() else {
            continue;
        };
        let (ours, theirs) = UnixStream::pair()?;
        let hand = Msg {
            op: SPAWN,
            pid: h.pid,
            value: 0,
        };
        match send(h.control.as_fd(), hand, Some(theirs.as_raw_fd())) {
            Ok(()) => return Ok((h.pid, OwnedFd::from(ours))),
            Err(e) => {
                // It is exiting (its partitions were lost: the peer is
                // gone) or stuck (it took no socket in HAND_TIMEOUT):
                // either way it is given up, killed so that it holds
                // no SM group, reaped later; a fresh one takes this
                // partition.
                warn_limited!(
                    "partition host launcher: the shared host {} takes no partition ({e}); starting another",
                    h.pid
                );
                // SAFETY: kill of a child of ours, not yet reaped (reap
                // clears `shared` when it reaps it).
                unsafe { libc::kill(h.pid, libc::SIGKILL) };
                *shared = None;
            }
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Starts one host of its own: this program again, with the hosts'
/// arguments and one end of a new socket pair; returns its pid and the
/// other end.
fn spawn_host(args: &LauncherArgs) -> io::Result<(i32, OwnedFd)> {
    start_host(args, false)
}

/// Starts a host: of its own (a stream socket to the daemon), or the
/// shared host (`shared`: a record socket on which the launcher hands it
/// the daemon's sockets). Returns its pid and our end.
fn start_host(args: &LauncherArgs, shared: bool) -> io::Result<(i32, OwnedFd)> {
    let (ours, theirs) = if shared {
        seqpacket_pair()?
    } else {
        let (a, b) = UnixStream::pair()?;
        (OwnedFd::from(a), OwnedFd::from(b))
    };
    let fd = theirs.as_raw_fd();
    let parent = std::process::id();
    // This very program, even if the file was replaced since.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(HOST_PROGRAM)
        .arg("--seccomp")
        .arg(mode_name(args.seccomp))
        .args(&args.host_args)
        .args(shared.then_some("--shared"))
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
    Ok((child.id() as i32, ours))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vgpu_backend_remote::launcher::{seqpacket_pair, set_timeouts};

    use super::*;

    #[test]
    fn test_launcher_args() {
        let parse = |s: &str| LauncherArgs::parse(s.split_whitespace().map(OsString::from));
        let a = parse("--fd 5 --seccomp log --uid 7 --gid 8 --groups 8,9 -- --backend x").unwrap();
        assert_eq!(a.fd, 5);
        assert_eq!(a.seccomp, SeccompMode::Log);
        assert_eq!(a.ids, Some((7, 8, vec![8, 9])));
        assert_eq!(a.host_args, vec![OsString::from("--backend"), "x".into()]);
        assert_eq!(parse("--fd 5 --seccomp strict --").unwrap().ids, None);
        for bad in [
            "--fd 5 --seccomp strict",
            "--fd 2 --seccomp strict --",
            "--fd 5 --seccomp kill --",
            "--fd 5 --seccomp strict --uid 1 --",
            "--fd 5 --seccomp strict --groups x --uid 1 --gid 1 --",
            "--seccomp strict --",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
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
            shared: false,
        };
        let server = std::thread::spawn(move || serve(theirs, &args));
        // One request, its reply (as the daemon's client sends them).
        let call = |op, pid| {
            send(ours.as_fd(), Msg { op, pid, value: 0 }, None).unwrap();
            match recv(ours.as_fd()).unwrap() {
                Got::Msg(m, fds) => (m, fds),
                Got::Closed => panic!("the launcher closed its end"),
            }
        };
        let (m, fds) = call(HELLO, 0);
        assert_eq!((m.op, m.pid), (READY, std::process::id() as i32));
        assert!(fds.is_empty());
        // pid 1 and this process: not its children. Killing, asking how
        // it is, and forgetting it are all refused.
        for pid in [1, std::process::id() as i32] {
            for op in [KILL, STATUS, RELEASE] {
                let (m, _) = call(op, pid);
                assert_eq!((m.op, m.pid, m.value), (FAILED, pid, libc::ESRCH));
            }
        }
        // A request of an unknown kind is refused; the launcher goes on.
        let (m, _) = call(77, 0);
        assert_eq!((m.op, m.value), (FAILED, libc::EINVAL));
        assert_eq!(call(HELLO, 0).0.op, READY);
        drop(ours);
        server.join().unwrap().unwrap();
    }
}
