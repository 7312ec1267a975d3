//! `vgpu-partition-host`: serves one partition of a backend to `vgpud`
//! over the socket it inherits, and exits when that socket closes. Started
//! by the `remote` backend, not by hand.

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use log::error;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend_remote::{host, HostArgs, InnerBackend};

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

/// The one place where this process confines itself, after its backend
/// has opened the device and before it serves the first request: the
/// system-call filter for the GPU host role goes here. No filter is
/// installed yet.
fn confine() {}

fn main() -> ExitCode {
    let args = match HostArgs::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{}: {e}", vgpu_backend_remote::HOST_PROGRAM);
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
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    // SAFETY: the daemon handed this descriptor to us for this purpose and
    // nothing else in this process refers to it.
    let stream = unsafe { UnixStream::from_raw_fd(args.fd) };
    // SAFETY: plain fcntl on our own descriptor: whatever the driver
    // starts must not inherit it.
    unsafe { libc::fcntl(args.fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let r = match args.backend {
        InnerBackend::Software {
            memory,
            compute_units,
        } => {
            let b = SoftwareBackend::new(memory, compute_units);
            confine();
            host::serve(stream, &b, &|| true, args.spin)
        }
        InnerBackend::Cuda { device, guest_ptx } => {
            use vgpu_backend_cuda::{cuda_lost, CudaBackend, Mode};
            match CudaBackend::new(device, Mode::Isolated) {
                Ok(b) => {
                    b.set_guest_ptx(guest_ptx);
                    confine();
                    host::serve(stream, &b, &|| cuda_lost().is_none(), args.spin)
                }
                Err(e) => host::refuse(stream, &e.to_string()),
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
