//! The allow-lists: which system calls, with which arguments, each
//! thread role may make.

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition, SeccompRule};

use super::Role;

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

pub(super) type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// The first real-time signal of the kernel (the C library reserves it
/// and the next one for itself; `libc::SIGRTMIN()` reports the first one
/// left to programs).
const SIGRTMIN_0: u64 = 32;

pub(super) fn allow(rules: &mut Rules, calls: &[libc::c_long]) {
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
            // Polling loops give their CPU away between looks.
            SYS_sched_yield,
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

/// Waiting on fds: `poll` (`ppoll` where the architecture has no `poll`).
fn poll_rules(rules: &mut Rules) {
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[libc::SYS_poll]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[libc::SYS_ppoll]);
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
    poll_rules(rules);
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

/// Serving a vGPU over vfio-user, in the daemon or on the vGPU's own
/// threads: messages with fds (guest memory, interrupts), the event loop,
/// the size of a guest memory file before it is mapped; and replacing a
/// failed partition host on a reset.
fn vfio_user_rules(rules: &mut Rules) {
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
    allow(rules, &[SYS_epoll_wait]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[SYS_epoll_pwait]);
    // As the serving threads, plus reading the seals of a guest RAM file
    // (only files sealed against shrinking go to a host) and sealing the
    // size of a partition host's staging area (a memfd) before the host
    // maps it.
    rules.insert(
        SYS_fcntl,
        any_of(
            1,
            &[
                F_GETFD as u64,
                F_DUPFD_CLOEXEC as u64,
                F_GET_SEALS as u64,
                F_ADD_SEALS as u64,
            ],
        ),
    );
    // A replacement host's memory socket is made on the thread that
    // resets.
    host_driver_rules(rules);
}

/// The rest of the daemon: the vfio-user engine, devices, the management
/// API creating and removing vGPUs, and shutdown.
fn daemon_rules(rules: &mut Rules) {
    use libc::*;
    vfio_user_rules(rules);
    allow(
        rules,
        &[
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
        &[SYS_mkdir, SYS_unlink, SYS_rmdir, SYS_chmod, SYS_lchown],
    );
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[SYS_mkdirat, SYS_unlinkat, SYS_fchmodat]);
    // UNIX sockets only: no network.
    rules.insert(SYS_socket, any_of(0, &[AF_UNIX as u64]));
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

/// A vGPU's serving threads: vfio-user, and the socket's removal when the
/// vGPU goes.
fn vgpu_rules(rules: &mut Rules, driver: bool) {
    vfio_user_rules(rules);
    #[cfg(target_arch = "x86_64")]
    allow(rules, &[libc::SYS_unlink]);
    #[cfg(not(target_arch = "x86_64"))]
    allow(rules, &[libc::SYS_unlinkat]);
    if driver {
        gpu_driver_rules(rules);
    }
}

/// A partition host: its channel to the daemon (messages on the one
/// socket it inherited, an fd among them, a wait for the next one; a
/// shared host's shutdown of its launcher's socket as it ends; the
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
            SYS_shutdown,
            SYS_statx,
        ],
    );
    poll_rules(rules);
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

pub(super) fn rules_for(role: Role) -> Rules {
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
