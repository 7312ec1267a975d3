//! `vgpu-partition-host`: serves one partition of a backend to `vgpud`
//! over the socket it inherits, and exits when that socket closes. With
//! `--launcher` first, it is the remote backend's launcher instead, which
//! starts, kills and reaps hosts (this program again) for the daemon.
//! Started by the `remote` backend, not by hand.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use log::{error, warn};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::Backend;
use vgpu_backend_remote::launcher as launcher_proto;
use vgpu_backend_remote::{HostArgs, InnerBackend, HOST_PROGRAM};
use vgpu_confine::{Role, SeccompMode};
use vgpu_partition_host::host::{self, HostError};
use vgpu_partition_host::launcher::{self, LauncherArgs};

/// Closes every descriptor above stdio except `keep`: the daemon's other
/// descriptors (guest memory, other tenants' sockets) must not reach a
/// process that runs guest kernels.
fn close_other_fds(keep: i32) -> std::io::Result<()> {
    let keep = keep as libc::c_uint;
    for (lo, hi) in [(3, keep.saturating_sub(1)), (keep + 1, libc::c_uint::MAX)] {
        if lo > hi {
            continue;
        }
        // SAFETY: close_range only closes descriptors; nothing in this
        // process uses any in these ranges yet.
        let r = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0 as libc::c_uint) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The one place where a host confines itself, after its backend has
/// opened the device and before it serves the first request. Its ids
/// and capabilities were dropped by the launcher, before it started.
fn confine(mode: SeccompMode, driver: bool) -> Result<(), String> {
    vgpu_confine::install(Role::PartitionHost { driver }, mode).map_err(|e| e.to_string())
}

/// The launcher: drops privileges, then serves the daemon until it
/// closes its end.
fn run_launcher(args: Vec<OsString>) -> ExitCode {
    let args = match LauncherArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{HOST_PROGRAM} --launcher: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = close_other_fds(args.fd) {
        eprintln!("{HOST_PROGRAM} --launcher: cannot close inherited descriptors: {e}");
        return ExitCode::FAILURE;
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    // Told apart from the hosts in `ps` and `top`.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"vgpu-launcher".as_ptr()) };
    // SAFETY: the daemon handed this descriptor to us for this purpose and
    // nothing else in this process refers to it.
    let sock = unsafe { OwnedFd::from_raw_fd(args.fd) };
    // SAFETY: plain fcntl on our own descriptor: hosts must not inherit it.
    unsafe { libc::fcntl(args.fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let r =
        launcher::drop_privileges(args.ids.as_ref()).and_then(|()| launcher::serve(sock, &args));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("partition host launcher {}: {e}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

/// Serves the daemon: one partition on `fd`, or, in a shared host, each
/// partition socket the launcher hands over on `fd`.
fn run(
    fd: OwnedFd,
    backend: &dyn Backend,
    healthy: &(dyn Fn() -> bool + Sync),
    args: &HostArgs,
) -> Result<(), HostError> {
    if !args.shared {
        return host::serve(UnixStream::from(fd), backend, healthy, args.spin);
    }
    serve_shared(fd, backend, healthy, args.spin);
    Ok(())
}

/// A shared host: a thread per partition socket the launcher sends on
/// `control`. When the device state of the process is lost (a fault in
/// any partition on a GPU, where green contexts share one context), the
/// process ends at once, so that every partition's daemon side learns it
/// and the next partition gets a fresh host; it ends too when the
/// launcher closes `control`.
fn serve_shared(
    control: OwnedFd,
    backend: &dyn Backend,
    healthy: &(dyn Fn() -> bool + Sync),
    spin: std::time::Duration,
) {
    let launcher = control.as_raw_fd();
    std::thread::scope(|scope| loop {
        let (m, mut fds) = match launcher_proto::recv(control.as_fd()) {
            Ok(launcher_proto::Got::Msg(m, fds)) => (m, fds),
            Ok(launcher_proto::Got::Closed) => end_shared(0, "the launcher closed its socket"),
            Err(e) => end_shared(1, &format!("the launcher's socket: {e}")),
        };
        if m.op != launcher_proto::SPAWN || fds.len() != 1 {
            warn!(
                "shared partition host: unexpected record {m:?} with {} descriptors",
                fds.len()
            );
            continue;
        }
        let Some(sock) = fds.pop() else { continue };
        let spawned = std::thread::Builder::new()
            .name("vgpu-partition".into())
            .spawn_scoped(scope, move || {
                let r = host::serve_until_lost(UnixStream::from(sock), backend, healthy, spin);
                if !healthy() {
                    end_lost(launcher);
                }
                if let Err(e) = r {
                    error!(
                        "shared partition host {}: a partition: {e}",
                        std::process::id()
                    );
                }
            });
        if let Err(e) = spawned {
            // The socket went with the closure: its partition is refused.
            error!("shared partition host: cannot start a partition thread: {e}");
        }
    })
}

/// Ends a shared host whose device state is lost. Said first (the
/// launcher may kill it once told), then the launcher must hand it no
/// partition more: its exit can take a while (a GPU context's teardown)
/// before its sockets close by themselves.
fn end_lost(launcher: std::os::fd::RawFd) -> ! {
    error!(
        "shared partition host {} ends: the device state of its partitions is lost",
        std::process::id()
    );
    // SAFETY: shutdown of the launcher's socket, which the caller keeps
    // open until the process ends.
    unsafe { libc::shutdown(launcher, libc::SHUT_RDWR) };
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(3) }
}

/// Ends a shared host at once: its partitions' threads may be inside the
/// driver, and every socket must close now.
fn end_shared(code: i32, why: &str) -> ! {
    if code == 0 {
        log::info!("shared partition host {} ends: {why}", std::process::id());
    } else {
        error!("shared partition host {} ends: {why}", std::process::id());
    }
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(code) }
}

/// Tells the daemon (or, in a shared host, the launcher by ending) that
/// the host cannot serve.
fn refuse(fd: OwnedFd, why: &str, args: &HostArgs) -> Result<(), HostError> {
    if !args.shared {
        return host::refuse(UnixStream::from(fd), why);
    }
    // Each partition handed over hears why, until the launcher closes.
    loop {
        match launcher_proto::recv(fd.as_fd()) {
            Ok(launcher_proto::Got::Msg(_, fds)) => {
                for sock in fds {
                    if let Err(e) = host::refuse(UnixStream::from(sock), why) {
                        warn!("shared partition host: {e}");
                    }
                }
            }
            Ok(launcher_proto::Got::Closed) => return Ok(()),
            Err(e) => end_shared(1, &format!("the launcher's socket: {e}")),
        }
    }
}

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    if argv.first().is_some_and(|a| a == "--launcher") {
        return run_launcher(argv.split_off(1));
    }
    // The launcher puts the filter mode first; hosts started otherwise
    // are strict.
    let mut mode = SeccompMode::Strict;
    if argv.first().is_some_and(|a| a == "--seccomp") && argv.len() >= 2 {
        let m = argv[1].to_string_lossy().parse::<SeccompMode>();
        match m {
            Ok(m) => mode = m,
            Err(e) => {
                eprintln!("{HOST_PROGRAM}: --seccomp: {e}");
                return ExitCode::from(2);
            }
        }
        argv.drain(..2);
    }
    let argv: Result<Vec<String>, _> = argv.into_iter().map(OsString::into_string).collect();
    let args = match argv
        .map_err(|a| format!("bad argument {a:?}"))
        .and_then(HostArgs::parse)
    {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{HOST_PROGRAM}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = close_other_fds(args.fd) {
        eprintln!(
            "{}: cannot close inherited descriptors: {e}",
            vgpu_backend_remote::HOST_PROGRAM
        );
        return ExitCode::FAILURE;
    }
    // A host that runs guest kernels on a GPU hands its standard output
    // and error to the guest (what the driver prints for its kernels): its
    // log, and a panic's message, go to a copy of standard error first.
    let captures = matches!(
        args.backend,
        InnerBackend::Cuda {
            guest_ptx: true,
            ..
        }
    );
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if captures {
        match std::io::stderr().as_fd().try_clone_to_owned() {
            Ok(fd) => {
                logger.target(env_logger::Target::Pipe(Box::new(std::fs::File::from(fd))));
                std::panic::set_hook(Box::new(|p| error!("{p}")));
            }
            Err(e) => {
                eprintln!("{HOST_PROGRAM}: cannot keep a log apart from the guest's output: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    logger.init();
    // SAFETY: the launcher or the daemon handed this descriptor to us for
    // this purpose and nothing else in this process refers to it.
    let fd = unsafe { OwnedFd::from_raw_fd(args.fd) };
    // SAFETY: plain fcntl on our own descriptor: whatever the driver
    // starts must not inherit it.
    unsafe { libc::fcntl(args.fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let r = match args.backend {
        InnerBackend::Software {
            memory,
            compute_units,
        } => {
            let mut b = SoftwareBackend::new(memory, compute_units);
            if args.shared {
                b = b.with_shared_fate();
            }
            match confine(mode, false) {
                Ok(()) => run(fd, &b, &|| !b.lost(), &args),
                Err(e) => refuse(fd, &e, &args),
            }
        }
        InnerBackend::Cuda {
            device,
            guest_ptx,
            spatial,
        } => {
            use vgpu_backend_cuda::{cuda_lost, CudaBackend, Mode, OutputCapture};
            let mode_cuda = if spatial {
                Mode::Spatial
            } else {
                Mode::Isolated
            };
            match CudaBackend::new(device, mode_cuda) {
                Ok(b) => {
                    b.set_guest_ptx(guest_ptx);
                    // The driver prints what guest kernels print to this
                    // process's standard output and error: it goes to
                    // the guest (the log moved off them above).
                    if captures && !args.shared {
                        match OutputCapture::install() {
                            Ok(c) => b.set_printf_capture(c),
                            Err(e) => warn!("kernels' printf output stays here: {e}"),
                        }
                    }
                    match confine(mode, true) {
                        Ok(()) => run(fd, &b, &|| cuda_lost().is_none(), &args),
                        Err(e) => refuse(fd, &e, &args),
                    }
                }
                Err(e) => refuse(fd, &e.to_string(), &args),
            }
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("partition host {}: {e}", std::process::id());
            ExitCode::FAILURE
        }
    }
}
