//! The seccomp filters: the thread roles and filter modes, and compiling
//! a role's filters to BPF and installing them. `rules` has the lists.

mod rules;

use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

pub use rules::allowed_syscalls;
use rules::{allow, rules_for};

use crate::{sys, ConfineError};

/// What a forbidden system call does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeccompMode {
    /// The kernel kills the whole process (SIGSYS). A call outside the list
    /// is either a bug that tests must find or an attacker running code in
    /// a process that maps every tenant's memory; neither should go on.
    #[default]
    Strict,
    /// The call is allowed and the kernel logs it (audit, `dmesg`):
    /// for bringing up a new host, driver or C library.
    Log,
    /// No filter (no new privileges is still set).
    Off,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strict" => Ok(SeccompMode::Strict),
            "log" => Ok(SeccompMode::Log),
            "off" => Ok(SeccompMode::Off),
            _ => Err(format!("{s:?} is not strict, log or off")),
        }
    }
}

/// The job of the threads a filter is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The whole daemon process on the software backend: vfio-user event
    /// loops, device workers, the management API (which creates vGPUs, so
    /// binds sockets and starts the threads that serve them). Installed on
    /// every thread at once.
    Daemon,
    /// A process that drives a GPU through a vendor driver (the CUDA
    /// backend): [`Role::Daemon`] plus opening files, any `ioctl`,
    /// executable mappings and the rest a driver does. Installed on every
    /// thread at once.
    GpuHost,
    /// A partition host process (`vgpu-partition-host`): serves one
    /// partition of an inner backend to the daemon over the socket and
    /// staging area it was handed, and nothing else: messages on that
    /// socket (with an fd: the staging area), mapping what it receives,
    /// its backend's worker threads; with `driver`, the GPU driver's
    /// calls. No socket, file, process or network of its own. Installed
    /// on every thread at once.
    PartitionHost {
        /// The host drives a GPU through a vendor driver.
        driver: bool,
    },
    /// The threads that serve one vGPU: its vfio-user event loop, which
    /// parses what the VMM sends, and the device worker and compute
    /// threads it starts. No socket, file or memfd is created there; with
    /// `driver`, the GPU driver's calls are allowed too (the device
    /// threads drive the GPU). Installed on the calling thread, on top of
    /// the process-wide role.
    Vgpu {
        /// The vGPU's GPU is driven through a vendor driver in process.
        driver: bool,
    },
    /// The metrics HTTP threads: accept on a bound TCP listener, read,
    /// write, start a thread per connection. Installed on the calling
    /// thread, on top of the process-wide role.
    Metrics,
    /// The thread that waits for SIGTERM/SIGINT and writes an eventfd.
    /// Installed on the calling thread, on top of the process-wide role.
    Signals,
}

impl Role {
    /// Whether the role is installed on every thread of the process (the
    /// others apply to the calling thread and the threads it starts).
    pub fn process_wide(self) -> bool {
        matches!(
            self,
            Role::Daemon | Role::GpuHost | Role::PartitionHost { .. }
        )
    }

    /// Whether the role allows a GPU driver's calls (opening files among
    /// them).
    fn drives_gpu(self) -> bool {
        matches!(
            self,
            Role::GpuHost | Role::Vgpu { driver: true } | Role::PartitionHost { driver: true }
        )
    }
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("{e:?}"))
}

/// Calls that fail with an error instead of being fatal: the C library
/// makes them on its own and copes with the failure. The allow-list lets
/// them through, and the stricter answer of these filters wins.
fn refusals(role: Role) -> Vec<(Vec<libc::c_long>, i32)> {
    // clone3 passes its flags in memory a filter cannot read: ENOSYS makes
    // the C library fall back to clone, whose flags the allow-list checks.
    let mut out = vec![(vec![libc::SYS_clone3], libc::ENOSYS)];
    // A panic's backtrace (RUST_BACKTRACE) asks for the working directory
    // and the executable's path, and prints what it has without them.
    let mut quiet = vec![libc::SYS_getcwd];
    if !role.drives_gpu() {
        // No file is opened after startup, but malloc reads
        // /sys/devices/system/cpu/online when it adds an arena for a new
        // thread, and a backtrace /proc/self/maps; both cope without.
        quiet.extend([libc::SYS_openat, libc::SYS_readlinkat]);
        #[cfg(target_arch = "x86_64")]
        quiet.extend([libc::SYS_open, libc::SYS_readlink]);
    }
    out.push((quiet, libc::EACCES));
    out
}

/// Compiles the filters of `role` under `mode`, in the order they are
/// installed: the refusals, then the allow-list.
fn programs(role: Role, mode: SeccompMode) -> Result<Vec<BpfProgram>, ConfineError> {
    let build = |message: String| ConfineError::Build { role, message };
    let arch = arch().map_err(build)?;
    let mismatch = match mode {
        SeccompMode::Strict => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Off => return Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for (calls, errno) in refusals(role) {
        let rules = calls.into_iter().map(|c| (c, Vec::new())).collect();
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        );
        out.push(
            filter
                .and_then(BpfProgram::try_from)
                .map_err(|e| build(e.to_string()))?,
        );
    }
    let mut rules = rules_for(role);
    for (calls, _) in refusals(role) {
        allow(&mut rules, &calls);
    }
    let allow = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .and_then(BpfProgram::try_from)
        .map_err(|e| build(e.to_string()))?;
    out.push(allow);
    Ok(out)
}

/// Installs the filter of `role` under `mode` (and sets no new
/// privileges, which a filter requires). A process-wide role is
/// installed on every thread of the process (TSYNC): call it before any
/// thread has installed a role of its own.
pub fn install(role: Role, mode: SeccompMode) -> Result<(), ConfineError> {
    set_no_new_privs()?;
    for prog in programs(role, mode)? {
        let applied = if role.process_wide() {
            seccompiler::apply_filter_all_threads(&prog)
        } else {
            seccompiler::apply_filter(&prog)
        };
        applied.map_err(|e| ConfineError::Install {
            role,
            message: e.to_string(),
        })?;
    }
    Ok(())
}

/// Sets no new privileges: no execve can ever grant more (setuid bits,
/// file capabilities). Inherited by every thread created afterwards;
/// [`install`] of a process-wide role sets it on all threads.
pub fn set_no_new_privs() -> Result<(), ConfineError> {
    // SAFETY: prctl with these arguments only changes a flag of the thread.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(sys("set no new privileges")(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a child ended: its exit code, or the signal that killed it.
    #[derive(Debug, PartialEq, Eq)]
    enum End {
        Exit(i32),
        Signal(i32),
    }

    /// Forks a child that installs the filters of `roles` in order, writes
    /// one byte to a pipe (an allowed call), then runs `f` and exits with
    /// its result. Returns whether the byte arrived and how the child
    /// ended. The filters are compiled here: the child only makes system
    /// calls (it is a fork of a multi-threaded process).
    fn in_child(roles: &[(Role, SeccompMode)], f: &dyn Fn() -> i32) -> (bool, End) {
        let progs: Vec<BpfProgram> = roles
            .iter()
            .flat_map(|&(r, m)| programs(r, m).unwrap())
            .collect();
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two fds pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child below only makes system calls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            for p in &progs {
                if seccompiler::apply_filter(p).is_err() {
                    // SAFETY: ends the child without running destructors.
                    unsafe { libc::_exit(100) };
                }
            }
            // SAFETY: writes one byte from a live buffer to our pipe.
            unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
            let code = f();
            // SAFETY: as above.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: closes our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut status = 0;
        // SAFETY: waits for the child started above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into `byte`, then closes the pipe.
        let got = unsafe {
            let n = libc::read(fds[0], (&mut byte as *mut u8).cast(), 1);
            libc::close(fds[0]);
            n == 1
        };
        let end = if libc::WIFSIGNALED(status) {
            End::Signal(libc::WTERMSIG(status))
        } else {
            End::Exit(libc::WEXITSTATUS(status))
        };
        (got, end)
    }

    fn errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// 0 when a system call failed with `want`, 1 when it succeeded, 2
    /// for another error.
    fn failed_with(rc: libc::c_long, want: i32) -> i32 {
        match rc {
            0.. => 1,
            _ if errno() == want => 0,
            _ => 2,
        }
    }

    const STRICT_DAEMON: &[(Role, SeccompMode)] = &[(Role::Daemon, SeccompMode::Strict)];

    #[test]
    fn test_forbidden_calls_kill_the_process() {
        let calls: [(&str, &dyn Fn() -> i32); 8] = [
            ("socket(AF_INET)", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe {
                    libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) as i32
                }
            }),
            ("execve", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe {
                    let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
                    libc::syscall(
                        libc::SYS_execve,
                        c"/bin/true".as_ptr(),
                        argv.as_ptr(),
                        std::ptr::null::<*const libc::c_char>(),
                    ) as i32
                }
            }),
            ("ptrace", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) as i32 }
            }),
            ("fork", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) as i32 }
            }),
            ("mmap(PROT_EXEC)", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe {
                    libc::syscall(
                        libc::SYS_mmap,
                        0,
                        4096,
                        libc::PROT_READ | libc::PROT_EXEC,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    ) as i32
                }
            }),
            ("setuid", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe { libc::syscall(libc::SYS_setuid, 0) as i32 }
            }),
            ("ioctl(TIOCSTI)", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe { libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSTI, c"x".as_ptr()) as i32 }
            }),
            ("setsockopt(SO_REUSEADDR)", &|| {
                // SAFETY: a raw system call with valid or null pointers;
                // the filter decides whether it runs.
                unsafe {
                    let one: libc::c_int = 1;
                    libc::syscall(
                        libc::SYS_setsockopt,
                        0,
                        libc::SOL_SOCKET,
                        libc::SO_REUSEADDR,
                        &one,
                        4,
                    ) as i32
                }
            }),
        ];
        for (name, f) in calls {
            let (allowed_ran, end) = in_child(STRICT_DAEMON, f);
            assert!(allowed_ran, "{name}: the allowed write did not happen");
            assert_eq!(end, End::Signal(libc::SIGSYS), "{name}");
        }
    }

    #[test]
    fn test_allowed_and_quietly_refused_calls() {
        let open = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe {
                let fd =
                    libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/etc/passwd".as_ptr(), 0);
                failed_with(fd, libc::EACCES)
            }
        };
        assert_eq!(in_child(STRICT_DAEMON, &open), (true, End::Exit(0)));
        let clone3 = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe { failed_with(libc::syscall(libc::SYS_clone3, 0, 0), libc::ENOSYS) }
        };
        assert_eq!(in_child(STRICT_DAEMON, &clone3), (true, End::Exit(0)));
        let unix_socket = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe {
                let fd = libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0);
                i32::from(fd < 0)
            }
        };
        assert_eq!(in_child(STRICT_DAEMON, &unix_socket), (true, End::Exit(0)));
        // Without a filter the call works: the tests above test the filter.
        assert_eq!(in_child(&[], &open), (true, End::Exit(1)));
        // Log mode lets everything through.
        let inet = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe {
                let fd = libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
                i32::from(fd < 0)
            }
        };
        let log = &[(Role::Daemon, SeccompMode::Log)];
        assert_eq!(in_child(log, &inet), (true, End::Exit(0)));
        assert_eq!(
            in_child(STRICT_DAEMON, &inet),
            (true, End::Signal(libc::SIGSYS))
        );
    }

    #[test]
    fn test_thread_roles_narrow_the_daemon_role() {
        let unix_socket = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe {
                let fd = libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0);
                i32::from(fd < 0)
            }
        };
        let bind = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe { failed_with(libc::syscall(libc::SYS_bind, -1, 0, 0), libc::EBADF) }
        };
        let signals = &[
            (Role::Daemon, SeccompMode::Strict),
            (Role::Signals, SeccompMode::Strict),
        ];
        let metrics = &[
            (Role::Daemon, SeccompMode::Strict),
            (Role::Metrics, SeccompMode::Strict),
        ];
        let vgpu = &[
            (Role::Daemon, SeccompMode::Strict),
            (Role::Vgpu { driver: false }, SeccompMode::Strict),
        ];
        let killed = (true, End::Signal(libc::SIGSYS));
        assert_eq!(in_child(signals, &unix_socket), killed);
        assert_eq!(in_child(metrics, &unix_socket), killed);
        assert_eq!(in_child(metrics, &bind), killed);
        assert_eq!(in_child(vgpu, &unix_socket), killed);
        assert_eq!(in_child(vgpu, &bind), killed);
        // What the daemon role alone allows.
        assert_eq!(in_child(STRICT_DAEMON, &bind), (true, End::Exit(0)));
    }

    /// Set in the process that [`test_a_panic_backtrace_does_not_kill`]
    /// starts to run itself confined.
    const PANIC_CHILD: &str = "VGPUD_TEST_CONFINED_PANIC";

    #[test]
    fn test_a_panic_backtrace_does_not_kill() {
        // What a backtrace asks for is refused quietly: a thread's panic
        // stays the thread's. This runs in a process of its own (this
        // test again, filtered), not a fork of the multi-threaded harness:
        // a panic takes locks that another thread may hold at a fork.
        if std::env::var_os(PANIC_CHILD).is_some() {
            install(Role::Daemon, SeccompMode::Strict).unwrap();
            let r = std::thread::spawn(|| panic!("expected panic under the filter")).join();
            assert!(r.is_err());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "seccomp::tests::test_a_panic_backtrace_does_not_kill",
            ])
            .args(["--nocapture", "--test-threads", "1"])
            .env(PANIC_CHILD, "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{:?}\n{stderr}", out.status);
        assert!(
            stderr.contains("expected panic under the filter"),
            "{stderr}"
        );
        assert!(stderr.contains("stack backtrace"), "{stderr}");
    }

    #[test]
    fn test_partition_host_role_allows_its_channel_only() {
        let host = &[(Role::PartitionHost { driver: false }, SeccompMode::Strict)];
        let killed = (true, End::Signal(libc::SIGSYS));
        let unix_socket = || {
            // SAFETY: a raw system call with valid or null pointers;
            // the filter decides whether it runs.
            unsafe {
                let fd = libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0);
                i32::from(fd < 0)
            }
        };
        let fork = || {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) as i32 }
        };
        let kill = || {
            // SAFETY: as above; signal 0 only checks that the process exists.
            unsafe { libc::syscall(libc::SYS_kill, 1, 0) as i32 }
        };
        let ioctl = || {
            // SAFETY: as above.
            unsafe {
                failed_with(
                    libc::syscall(libc::SYS_ioctl, -1, libc::FIONBIO, 0),
                    libc::EBADF,
                )
            }
        };
        let recvmsg = || {
            // SAFETY: as above.
            unsafe { failed_with(libc::syscall(libc::SYS_recvmsg, -1, 0, 0), libc::EBADF) }
        };
        // Its channel works, and its threads' polling loops (which yield
        // between looks); a new socket, a process, a signal to another
        // process and a device ioctl kill it.
        assert_eq!(in_child(host, &recvmsg), (true, End::Exit(0)));
        let yield_now = || {
            std::thread::yield_now();
            0
        };
        assert_eq!(in_child(host, &yield_now), (true, End::Exit(0)));
        assert_eq!(in_child(STRICT_DAEMON, &yield_now), (true, End::Exit(0)));
        for (name, f) in [
            ("socket", &unix_socket as &dyn Fn() -> i32),
            ("fork", &fork),
            ("kill", &kill),
            ("ioctl", &ioctl),
        ] {
            assert_eq!(in_child(host, f), killed, "{name}");
        }
        // With a driver, the driver's ioctls pass; still no process and no
        // signal to another process.
        let gpu_host = &[(Role::PartitionHost { driver: true }, SeccompMode::Strict)];
        assert_eq!(in_child(gpu_host, &ioctl), (true, End::Exit(0)));
        assert_eq!(in_child(gpu_host, &fork), killed);
        assert_eq!(in_child(gpu_host, &kill), killed);
    }

    #[test]
    fn test_every_role_compiles_in_every_mode() {
        for role in [
            Role::Daemon,
            Role::GpuHost,
            Role::PartitionHost { driver: false },
            Role::PartitionHost { driver: true },
            Role::Vgpu { driver: false },
            Role::Vgpu { driver: true },
            Role::Metrics,
            Role::Signals,
        ] {
            for mode in [SeccompMode::Strict, SeccompMode::Log] {
                let progs = programs(role, mode).unwrap();
                assert_eq!(progs.len(), refusals(role).len() + 1, "{role:?}");
                assert!(progs.iter().all(|p| !p.is_empty() && p.len() < 4096));
            }
            assert!(programs(role, SeccompMode::Off).unwrap().is_empty());
        }
    }

    #[test]
    fn test_roles_are_nested() {
        let daemon = allowed_syscalls(Role::Daemon);
        let gpu = allowed_syscalls(Role::GpuHost);
        assert!(daemon.iter().all(|c| gpu.contains(c)));
        for narrow in [Role::Vgpu { driver: false }, Role::Metrics, Role::Signals] {
            let n = allowed_syscalls(narrow);
            assert!(n.iter().all(|c| daemon.contains(c)), "{narrow:?}");
            assert!(n.len() < daemon.len());
        }
        // A host may do less than the daemon; driving a GPU, it gets the
        // GPU host's set (verified with CUDA contexts made under it) and
        // its channel, and still no process or signal calls.
        let host = allowed_syscalls(Role::PartitionHost { driver: false });
        let gpu_part = allowed_syscalls(Role::PartitionHost { driver: true });
        assert!(host.iter().all(|c| gpu_part.contains(c)));
        assert!(host.len() < daemon.len());
        assert!(gpu.iter().chain(&host).all(|c| gpu_part.contains(c)));
        assert!(gpu_part.iter().all(|c| gpu.contains(c) || host.contains(c)));
        for c in [
            libc::SYS_execve,
            libc::SYS_kill,
            libc::SYS_ptrace,
            libc::SYS_setresuid,
        ] {
            assert!(!gpu_part.contains(&c), "{c}");
        }
        let gpu_vgpu = allowed_syscalls(Role::Vgpu { driver: true });
        assert!(gpu_vgpu.iter().all(|c| gpu.contains(c)));
        let vgpu = allowed_syscalls(Role::Vgpu { driver: false });
        for c in [
            libc::SYS_socket,
            libc::SYS_bind,
            libc::SYS_connect,
            libc::SYS_memfd_create,
            libc::SYS_linkat,
        ] {
            assert!(!vgpu.contains(&c), "{c}");
        }
        for forbidden in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_setuid,
            libc::SYS_mount,
            libc::SYS_openat,
        ] {
            assert!(!daemon.contains(&forbidden), "{forbidden}");
        }
        let signals = allowed_syscalls(Role::Signals);
        assert!(!signals.contains(&libc::SYS_socket));
        assert!(!allowed_syscalls(Role::Metrics).contains(&libc::SYS_bind));
    }

    #[test]
    fn test_modes_parse() {
        assert_eq!("strict".parse(), Ok(SeccompMode::Strict));
        assert_eq!("log".parse(), Ok(SeccompMode::Log));
        assert_eq!("off".parse(), Ok(SeccompMode::Off));
        assert!("kill".parse::<SeccompMode>().is_err());
    }
}
