//! Confinement: seccomp filters per thread role, no new privileges, and
//! the switch from root to an unprivileged user. `docs/security-model.md`
//! says what each layer stops and why the lists are what they are.
//!
//! Order in a process: open what needs privileges, [`drop_privileges`],
//! then [`install`] the process-wide role ([`Role::Daemon`],
//! [`Role::GpuHost`], or [`Role::PartitionHost`] in a partition host),
//! then let threads with a narrower job install their
//! own role on top ([`Role::Metrics`], [`Role::Signals`]). Filters stack:
//! a thread is held to every filter it or its creator installed, and a
//! thread inherits its creator's filters.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

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

/// Why confinement could not be set up. The daemon does not run
/// unconfined when asked to be confined: every error stops it.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The filter could not be built (a bug in the lists).
    #[error("cannot build the seccomp filter for {role:?}: {message}")]
    Build {
        /// The role.
        role: Role,
        /// What seccompiler said.
        message: String,
    },
    /// The kernel refused the filter.
    #[error("cannot install the seccomp filter for {role:?}: {message}")]
    Install {
        /// The role.
        role: Role,
        /// What the kernel said.
        message: String,
    },
    /// No such user, or its entry cannot be read.
    #[error("user {name:?}: {message}")]
    User {
        /// The name asked for.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A system call of the privilege drop failed.
    #[error("cannot {what}")]
    Sys {
        /// The step.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The drop seemed to work but the process still holds privileges.
    #[error("privileges remain after the switch: {0}")]
    Remains(String),
}

fn sys(what: impl Into<String>) -> impl FnOnce(io::Error) -> ConfineError {
    let what = what.into();
    move |source| ConfineError::Sys { what, source }
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> SeccompCondition {
    // Only fails for an argument index above 5; the indexes below are 0-3.
    SeccompCondition::new(arg, len, op, value).expect("argument index below 6")
}

/// A rule that matches when argument `arg` (32 bits) equals one of `values`.
fn any_of(arg: u8, values: &[u64]) -> Vec<SeccompRule> {
    values
        .iter()
        .map(|&v| SeccompRule::new(vec![cond(arg, Len::Dword, Op::Eq, v)]).expect("one condition"))
        .collect()
}

/// A rule that matches when none of `bits` is set in argument `arg`.
fn without_bits(arg: u8, bits: u64) -> Vec<SeccompRule> {
    vec![
        SeccompRule::new(vec![cond(arg, Len::Qword, Op::MaskedEq(bits), 0)])
            .expect("one condition"),
    ]
}

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// The first real-time signal of the kernel (the C library reserves it
/// and the next one for itself; `libc::SIGRTMIN()` reports the first one
/// left to programs).
const SIGRTMIN_0: u64 = 32;

fn allow(rules: &mut Rules, calls: &[libc::c_long]) {
    for &c in calls {
        rules.insert(c, Vec::new());
    }
}

/// What every thread of vgpud does once it runs: memory, threads, time,
/// locks, logging to stderr, and the fds it already holds.
fn common_rules(rules: &mut Rules) {
    use libc::*;
    allow(
        rules,
        &[
            // Sockets, eventfds, stderr.
            SYS_read,
            SYS_write,
            SYS_close,
            // Heap (malloc grows and shrinks with brk, mremap, madvise)
            // and thread stacks (munmap at thread exit).
            SYS_brk,
            SYS_munmap,
            SYS_madvise,
            SYS_mremap,
            // Locks, condition variables, channels, sleeps; the clock is
            // read through the vDSO, but some hosts' clock sources need
            // the system call.
            SYS_futex,
            SYS_clock_nanosleep,
            SYS_clock_gettime,
            SYS_exit,
            SYS_exit_group,
            SYS_gettid,
            SYS_getpid,
            SYS_rt_sigprocmask,
            SYS_rt_sigreturn,
            // Thread start (C library and Rust runtime): robust futex list,
            // restartable sequences, the stack-overflow signal stack, the
            // number of CPUs; HashMap seeds.
            SYS_set_robust_list,
            SYS_rseq,
            SYS_sigaltstack,
            SYS_sched_getaffinity,
            SYS_getrandom,
        ],
    );
    // Stacks and heap, never executable memory: no new code can be mapped.
    rules.insert(SYS_mmap, without_bits(2, PROT_EXEC as u64));
    rules.insert(SYS_mprotect, without_bits(2, PROT_EXEC as u64));
    // Threads only: a clone without CLONE_THREAD (a new process) is refused.
    rules.insert(
        SYS_clone,
        vec![SeccompRule::new(vec![cond(
            0,
            Len::Qword,
            Op::MaskedEq(CLONE_THREAD as u64),
            CLONE_THREAD as u64,
        )])
        .expect("one condition")],
    );
    // Thread names; no new privileges and seccomp itself, so that a
    // thread can narrow itself further (a filter only ever takes away).
    rules.insert(
        SYS_prctl,
        any_of(0, &[PR_SET_NAME as u64, PR_SET_NO_NEW_PRIVS as u64]),
    );
    rules.insert(SYS_seccomp, any_of(0, &[SECCOMP_SET_MODE_FILTER as u64]));
    // The C library installs its handlers for thread cancellation and
    // set*id broadcasts when the first thread starts.
    rules.insert(SYS_rt_sigaction, any_of(0, &[SIGRTMIN_0, SIGRTMIN_0 + 1]));
    // abort() (a panic while panicking) raises SIGABRT on itself.
    rules.insert(SYS_tgkill, any_of(2, &[SIGABRT as u64]));
    // Debug builds check that an fd is open before closing it.
    rules.insert(SYS_fcntl, any_of(1, &[F_GETFD as u64]));
}

/// A rule for `setsockopt`/`getsockopt` of one option: option numbers
/// mean different things at different levels.
fn socket_option(level: libc::c_int, name: libc::c_int) -> SeccompRule {
    SeccompRule::new(vec![
        cond(1, Len::Dword, Op::Eq, level as u64),
        cond(2, Len::Dword, Op::Eq, name as u64),
    ])
    .expect("two conditions")
}

/// What both HTTP servers (API, metrics) and the vfio-user engine do with
/// their sockets once bound: accept, read and write, time out, wait.
fn serving_rules(rules: &mut Rules) {
    use libc::*;
    allow(
        rules,
        &[
            SYS_accept4,
            SYS_recvfrom,
            SYS_sendto,
            SYS_shutdown,
            SYS_eventfd2,
            SYS_getsockname,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[SYS_poll]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[SYS_ppoll]);
    rules.insert(
        SYS_setsockopt,
        vec![
            socket_option(SOL_SOCKET, SO_RCVTIMEO),
            socket_option(SOL_SOCKET, SO_SNDTIMEO),
            socket_option(IPPROTO_TCP, TCP_NODELAY),
        ],
    );
    // Non-blocking mode; no device ioctls.
    rules.insert(SYS_ioctl, any_of(1, &[FIONBIO as _]));
    // Duplicating eventfds; the debug builds' check before close.
    rules.insert(
        SYS_fcntl,
        any_of(1, &[F_GETFD as u64, F_DUPFD_CLOEXEC as u64]),
    );
}

/// Driving partition hosts (process-isolated partitions): a memory socket
/// pair handed to a new or replacement host, the seal check before a
/// guest RAM file is passed to one, and ending a host that stopped
/// answering through a pidfd (which never signals a reused pid), SIGKILL
/// only. Threads that create hosts (the API) or replace them on a reset
/// (a vGPU's threads) need these.
fn host_driver_rules(rules: &mut Rules) {
    use libc::*;
    rules.insert(SYS_socketpair, any_of(0, &[AF_UNIX as u64]));
    rules.insert(SYS_pidfd_open, Vec::new());
    rules.insert(SYS_pidfd_send_signal, any_of(1, &[SIGKILL as u64]));
}

/// The fcntl commands of the serving threads plus reading the seals of a
/// guest RAM file (only files sealed against shrinking go to a host).
fn fcntl_commands(extra: &[u64]) -> Vec<SeccompRule> {
    use libc::*;
    let mut cmds = vec![F_GETFD as u64, F_DUPFD_CLOEXEC as u64, F_GET_SEALS as u64];
    cmds.extend_from_slice(extra);
    any_of(1, &cmds)
}

/// The rest of the daemon: the vfio-user engine, devices, the management
/// API creating and removing vGPUs, and shutdown.
fn daemon_rules(rules: &mut Rules) {
    use libc::*;
    common_rules(rules);
    serving_rules(rules);
    allow(
        rules,
        &[
            // vfio-user: messages with fds (guest memory, interrupts),
            // the event loop.
            SYS_recvmsg,
            SYS_sendmsg,
            SYS_epoll_create1,
            SYS_epoll_ctl,
            // The size of a guest memory file before it is mapped.
            SYS_statx,
            // Doorbell page and window shared with the VMM.
            SYS_memfd_create,
            SYS_ftruncate,
            // Sockets of vGPUs created and removed at run time (bound in a
            // private directory, restricted, linked into place), and the
            // check that a socket path is not in use.
            SYS_bind,
            SYS_listen,
            SYS_connect,
            SYS_linkat,
            // A vGPU socket given to `daemon.socket_group`.
            SYS_fchownat,
            // The signal thread (narrowed further by its own role).
            SYS_rt_sigtimedwait,
            // Reaping a partition host launcher (a child) when its backend
            // goes; the launcher, not the daemon, starts and kills hosts.
            SYS_wait4,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    allow(
        rules,
        &[
            SYS_epoll_wait,
            SYS_mkdir,
            SYS_unlink,
            SYS_rmdir,
            SYS_chmod,
            SYS_lchown,
        ],
    );
    #[cfg(not(target_arch = "x86_64"))]
    allow(
        rules,
        &[SYS_epoll_pwait, SYS_mkdirat, SYS_unlinkat, SYS_fchmodat],
    );
    // UNIX sockets only: no network.
    rules.insert(SYS_socket, any_of(0, &[AF_UNIX as u64]));
    // As the serving threads, and sealing the size of a partition host's
    // staging area (a memfd) before the host maps it.
    rules.insert(SYS_fcntl, fcntl_commands(&[F_ADD_SEALS as u64]));
    host_driver_rules(rules);
}

/// The daemon driving a GPU in its own process (the CUDA backend): its
/// calls and the driver's.
fn gpu_host_rules(rules: &mut Rules) {
    daemon_rules(rules);
    gpu_driver_rules(rules);
}

/// What the CUDA driver does after startup, seen on an H200 (driver 580)
/// when a vGPU's context is made and used: it opens /dev/nvidiactl and
/// /dev/nvidia0 for every context and speaks its private `ioctl`
/// protocol on them, loads its JIT compiler library (an executable
/// mapping) for the first module, reads its compute cache and names its
/// threads through /proc. The calls it made only at initialisation
/// (before the filter) are kept where it may make them again for a later
/// context: file status, links, directory listing, system information,
/// NUMA policy, ids. Kept apart from the daemon's calls so that a process
/// that only drives the GPU can be given these and its own.
fn gpu_driver_rules(rules: &mut Rules) {
    use libc::*;
    allow(
        rules,
        &[
            // Device nodes, libraries, the compute cache, /proc.
            SYS_openat,
            SYS_ioctl,
            SYS_mmap,
            SYS_mprotect,
            SYS_fstat,
            SYS_newfstatat,
            SYS_lseek,
            SYS_pread64,
            SYS_readlinkat,
            SYS_faccessat,
            SYS_faccessat2,
            SYS_getdents64,
            // Its own event fds and pipes between its threads (it sets
            // their fd and status flags).
            SYS_fcntl,
            SYS_dup,
            SYS_pipe2,
            SYS_sched_get_priority_max,
            SYS_sched_get_priority_min,
            SYS_uname,
            SYS_sysinfo,
            SYS_get_mempolicy,
            SYS_getuid,
            SYS_geteuid,
            SYS_getgid,
            SYS_getegid,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[SYS_open, SYS_stat, SYS_readlink, SYS_access]);
}

/// A vGPU's serving threads: messages with fds, the event loop, guest
/// memory checks; the socket's removal when the vGPU goes.
fn vgpu_rules(rules: &mut Rules, driver: bool) {
    use libc::*;
    common_rules(rules);
    serving_rules(rules);
    allow(
        rules,
        &[
            SYS_recvmsg,
            SYS_sendmsg,
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_statx,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[SYS_epoll_wait, SYS_unlink]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[SYS_epoll_pwait, SYS_unlinkat]);
    // A reset replaces a failed partition host: its staging area is
    // sealed and its memory socket made on this thread.
    rules.insert(SYS_fcntl, fcntl_commands(&[F_ADD_SEALS as u64]));
    host_driver_rules(rules);
    if driver {
        gpu_driver_rules(rules);
    }
}

/// A partition host: its channel to the daemon (messages on the one
/// socket it inherited, an fd among them, a wait for the next one; the
/// staging area's size before it is mapped, shared and never
/// executable), its backend's worker threads, and with `driver` the GPU
/// driver's calls.
fn partition_host_rules(rules: &mut Rules, driver: bool) {
    use libc::*;
    common_rules(rules);
    allow(
        rules,
        &[
            SYS_recvmsg,
            SYS_sendmsg,
            SYS_recvfrom,
            SYS_sendto,
            SYS_statx,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[SYS_poll]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[SYS_ppoll]);
    if driver {
        // The driver's list was traced as what it needed beyond the
        // daemon's, in a daemon that made its contexts under the filter;
        // a host makes its context, compiles the built-in module and pins
        // guest memory under its own, so it gets that whole verified set
        // (still no process creation, execve, network or id changes).
        daemon_rules(rules);
        gpu_driver_rules(rules);
    }
}

/// The metrics HTTP server: its listener is bound before the filter.
fn metrics_rules(rules: &mut Rules) {
    common_rules(rules);
    serving_rules(rules);
}

/// The signal thread: wait, write the stop eventfd, log, exit.
fn signals_rules(rules: &mut Rules) {
    common_rules(rules);
    allow(rules, &[libc::SYS_rt_sigtimedwait]);
}

fn rules_for(role: Role) -> Rules {
    let mut rules = Rules::new();
    match role {
        Role::Daemon => daemon_rules(&mut rules),
        Role::GpuHost => gpu_host_rules(&mut rules),
        Role::Vgpu { driver } => vgpu_rules(&mut rules, driver),
        Role::PartitionHost { driver } => partition_host_rules(&mut rules, driver),
        Role::Metrics => metrics_rules(&mut rules),
        Role::Signals => signals_rules(&mut rules),
    }
    rules
}

/// The system calls a role allows, by number (some with argument checks).
pub fn allowed_syscalls(role: Role) -> Vec<i64> {
    rules_for(role).into_keys().collect()
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

/// An account to run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Every group it is in, the primary one included.
    pub groups: Vec<u32>,
}

/// Looks `name` up in the user database (before any filter: this may
/// read files and talk to NSS services).
pub fn lookup_user(name: &str) -> Result<Account, ConfineError> {
    let err = |message: String| ConfineError::User {
        name: name.to_string(),
        message,
    };
    let cname = CString::new(name).map_err(|_| err("contains a NUL byte".into()))?;
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: passwd is plain data that getpwnam_r fills in.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the use
    // of the strings in `pw`, which point into it.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(err(io::Error::from_raw_os_error(rc).to_string()));
    }
    if found.is_null() {
        return Err(err("no such user".into()));
    }
    let (uid, gid) = (pw.pw_uid, pw.pw_gid);
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` has room for `n` entries; the call writes at
        // most `n` and sets `n` to the number it needs.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        let n = usize::try_from(n).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(n);
            break;
        }
        if n <= groups.len() || n > 65536 {
            return Err(err("cannot list its groups".into()));
        }
        groups.resize(n, 0);
    }
    Ok(Account {
        name: name.to_string(),
        uid,
        gid,
        groups,
    })
}

/// The real, effective and saved user ids.
fn resuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: the pointers are valid for the call.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// Whether the process runs as root (any of its user ids is 0).
pub fn is_root() -> bool {
    let (r, e, s) = resuid();
    r == 0 || e == 0 || s == 0
}

/// Switches every thread to `account` for good: supplementary groups,
/// then group ids, then user ids (in that order: the group calls need
/// root), which empties the permitted and effective capability sets.
/// Then checks that root cannot be regained and that no thread holds a
/// capability. The C library applies each call to all threads.
pub fn drop_privileges(account: &Account) -> Result<(), ConfineError> {
    let check = |rc: libc::c_int, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            Err(sys(what.to_string())(io::Error::last_os_error()))
        }
    };
    let (uid, gid) = (account.uid, account.gid);
    // SAFETY: the pointer and length describe `account.groups`.
    let rc = unsafe { libc::setgroups(account.groups.len(), account.groups.as_ptr()) };
    check(rc, "set supplementary groups")?;
    // SAFETY: plain system calls on ids.
    check(unsafe { libc::setresgid(gid, gid, gid) }, "set group ids")?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) }, "set user ids")?;
    clear_capabilities()?;
    if uid != 0 {
        // SAFETY: as above; expected to fail.
        if unsafe { libc::setresuid(0, 0, 0) } == 0 {
            return Err(ConfineError::Remains("root could be regained".into()));
        }
    }
    verify_dropped(uid, gid)
}

/// Empties the calling thread's capability sets (permitted, effective,
/// inheritable, ambient). A process that is not root may still have been
/// given some (file capabilities, a service manager).
pub fn clear_capabilities() -> Result<(), ConfineError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data are the layouts capset(2) takes (version 3:
    // two data entries); the kernel only reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(sys("clear capabilities")(io::Error::last_os_error()));
    }
    // SAFETY: prctl with these arguments only changes the ambient set.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // EINVAL: a kernel without ambient capabilities has none to clear.
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(sys("clear ambient capabilities")(io::Error::last_os_error()));
    }
    Ok(())
}

/// Reads every thread's ids and capability sets from /proc and checks
/// that all are `uid`/`gid` and empty.
fn verify_dropped(uid: u32, gid: u32) -> Result<(), ConfineError> {
    let tasks = fs::read_dir("/proc/self/task").map_err(sys("list threads"))?;
    for t in tasks {
        let t = t.map_err(sys("list threads"))?;
        let path = t.path().join("status");
        let status = match fs::read_to_string(&path) {
            Ok(s) => s,
            // A thread that ended meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(sys(format!("read {}", path.display()))(e)),
        };
        let problem = status_problem(&status, uid, gid);
        if let Some(p) = problem {
            return Err(ConfineError::Remains(format!(
                "thread {}: {p}",
                t.file_name().to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// What in a /proc status text says privileges remain, if anything.
fn status_problem(status: &str, uid: u32, gid: u32) -> Option<String> {
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Uid" | "Gid" => {
                let want = if key == "Uid" { uid } else { gid };
                if value.split_whitespace().any(|v| v.parse() != Ok(want)) {
                    return Some(format!("{key} is {value}"));
                }
            }
            "CapPrm" | "CapEff" | "CapAmb" if u64::from_str_radix(value, 16) != Ok(0) => {
                return Some(format!("{key} is {value}"));
            }
            _ => {}
        }
    }
    None
}

/// Creates the runtime directory for `account` when it is missing: mode
/// 0755 (VMMs must reach the sockets in it; the sockets themselves are
/// 0600), owned by the account so that it can bind sockets there after
/// the switch. An existing directory is left as it is; binding in it then
/// fails clearly if the account may not write there.
pub fn prepare_runtime_dir(dir: &Path, account: &Account) -> Result<(), ConfineError> {
    match fs::symlink_metadata(dir) {
        Ok(m) => {
            if m.uid() != account.uid {
                log::warn!(
                    "runtime directory {} belongs to uid {}, not to {} ({}); \
                     sockets there need it to be writable by {}",
                    dir.display(),
                    m.uid(),
                    account.name,
                    account.uid,
                    account.name
                );
            }
            Ok(())
        }
        Err(_) => {
            let what = || format!("create {}", dir.display());
            // Missing parents as `mkdir -p` would make them under umask
            // 022 (the daemon's own umask is stricter): the user and the
            // VMMs must be able to pass through them.
            let missing: Vec<&Path> = dir
                .ancestors()
                .skip(1)
                .take_while(|p| !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err())
                .collect();
            for p in missing.into_iter().rev() {
                fs::DirBuilder::new().create(p).map_err(sys(what()))?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o755)).map_err(sys(what()))?;
            }
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(sys(what()))?;
            let c = CString::new(dir.as_os_str().as_encoded_bytes())
                .map_err(|e| sys(what())(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            lchown(&c, account.uid, account.gid).map_err(sys(format!(
                "give {} to {}",
                dir.display(),
                account.name
            )))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(sys(what()))
        }
    }
}

/// Looks a group up by name (before any filter, as [`lookup_user`]).
pub fn lookup_group(name: &str) -> Result<u32, ConfineError> {
    let err = |message: String| ConfineError::User {
        name: name.to_string(),
        message,
    };
    let cname = CString::new(name).map_err(|_| err("contains a NUL byte".into()))?;
    let mut buf = vec![0 as libc::c_char; 64 << 10];
    // SAFETY: group is plain data that getgrnam_r fills in.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` holds the strings
    // `gr` points to and outlives the call.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut gr,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(err(io::Error::from_raw_os_error(rc).to_string()));
    }
    if found.is_null() {
        return Err(err("no such group".into()));
    }
    Ok(gr.gr_gid)
}

/// Whether the process may give files to group `gid` (it is one of its
/// groups), so that [`share_socket`] will work after the switch.
pub fn in_group(gid: u32, account: Option<&Account>) -> bool {
    if let Some(a) = account {
        return a.gid == gid || a.groups.contains(&gid);
    }
    // SAFETY: getegid cannot fail.
    if unsafe { libc::getegid() } == gid {
        return true;
    }
    // SAFETY: with a size of 0, getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `groups` has room for `n` entries.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(n).unwrap_or(0));
    groups.contains(&gid)
}

/// Gives a vGPU socket to group `gid` with mode 0660, so that VMMs in
/// the group can connect. Its owner keeps it; the mode is set last, so
/// the group never reaches a socket with other permissions than these.
pub fn share_socket(path: &Path, gid: u32) -> Result<(), ConfineError> {
    let what = || format!("give {} to group {gid}", path.display());
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| sys(what())(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    lchown(&c, u32::MAX, gid).map_err(sys(what()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660)).map_err(sys(what()))
}

fn lchown(path: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    if unsafe { libc::lchown(path.as_ptr(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
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
            .args(["--exact", "tests::test_a_panic_backtrace_does_not_kill"])
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
        // Its channel works; a new socket, a process, a signal to another
        // process and a device ioctl kill it.
        assert_eq!(in_child(host, &recvmsg), (true, End::Exit(0)));
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

    #[test]
    fn test_status_problems() {
        let ok = "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                  CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                  CapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        assert_eq!(status_problem(ok, 65534, 65534), None);
        let root = ok.replace("Uid:\t65534\t65534\t65534", "Uid:\t65534\t0\t65534");
        assert!(status_problem(&root, 65534, 65534).unwrap().contains("Uid"));
        let caps = ok.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000000400");
        assert!(status_problem(&caps, 65534, 65534)
            .unwrap()
            .contains("CapEff"));
        assert!(status_problem(ok, 1, 65534).is_some());
    }

    #[test]
    fn test_runtime_dir_is_made_for_the_user() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            vgpu_testkit::skip("not root (giving a directory to another user needs root)");
            return;
        }
        let nobody = lookup_user("nobody").unwrap();
        let tmp = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-rundir-").unwrap();
        let dir = tmp.as_path().join("a/b/run");
        // SAFETY: umask only sets the process's file creation mask.
        let old = unsafe { libc::umask(0o077) };
        let made = prepare_runtime_dir(&dir, &nobody);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        made.unwrap();
        let m = fs::metadata(&dir).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o777),
            (nobody.uid, nobody.gid, 0o755)
        );
        for p in [tmp.as_path().join("a"), tmp.as_path().join("a/b")] {
            let m = fs::metadata(&p).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o755), "{}", p.display());
        }
        // An existing directory is left as it is.
        prepare_runtime_dir(tmp.as_path(), &nobody).unwrap();
        assert_eq!(fs::metadata(tmp.as_path()).unwrap().uid(), 0);
    }

    #[test]
    fn test_lookup_user() {
        let root = lookup_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        let e = lookup_user("no-such-user-vgpud").unwrap_err().to_string();
        assert!(e.contains("no such user"), "{e}");
        assert!(lookup_user("a\0b").is_err());
    }
}
