//! What kernels print. NVIDIA's driver writes a context's `printf`
//! output to the process's standard output when the context
//! synchronises, and a failed `assert()`'s line to its standard error. A
//! partition host, one partition to a process, takes both over with
//! [`OutputCapture`] (its own log goes elsewhere first) so that the output
//! goes to the partition's guest (CONSOLE) and not to the host's log.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use vgpu_abi as abi;
use vgpu_backend::console::ConsoleText;

use crate::lock;

#[derive(Debug)]
struct Inner {
    /// The pipe's read end (non-blocking); its write end is fd 1 and 2.
    read: OwnedFd,
    /// What was read from it and not yet taken.
    captured: Mutex<ConsoleText>,
}

impl Inner {
    /// Reads what the pipe holds. Called with `captured` locked, so that
    /// whoever holds the lock has seen every byte written before.
    fn drain(&self, c: &mut ConsoleText) {
        let mut buf = [0u8; 16 << 10];
        loop {
            // SAFETY: reads into a local buffer of that length from our
            // own descriptor.
            let n =
                unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                // Empty (EAGAIN), closed, or failed: nothing more now.
                return;
            }
            c.push(&buf[..n as usize]);
        }
    }
}

/// The process's standard output and error, replaced by one pipe this
/// process reads (one pipe keeps the order the driver wrote them in).
#[derive(Debug, Clone)]
pub struct OutputCapture {
    inner: Arc<Inner>,
}

impl OutputCapture {
    /// Replaces standard output and error by a pipe and starts the
    /// thread that empties it, so that a driver printing much never
    /// blocks on it. Once per process, before any other thread writes to
    /// either, and after the process's log has moved off standard error:
    /// whatever is written to them from now on goes to the guest.
    pub fn install() -> io::Result<OutputCapture> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are new and ours alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The writer (the driver) blocks, as it would on a terminal.
        // SAFETY: fcntl flag changes on our own descriptors.
        unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETFL, 0);
            // Room for a whole printf buffer's worth between reads where
            // the system allows it; the pipe's default otherwise.
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                abi::CONSOLE_BYTES as libc::c_int,
            );
        }
        for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
            // SAFETY: dup2 onto fd 1 and 2, which this process owns; the
            // pipe's write end stays open there after `write` is closed.
            if unsafe { libc::dup2(write.as_raw_fd(), fd) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        drop(write);
        let inner = Arc::new(Inner {
            read,
            captured: Mutex::new(ConsoleText::default()),
        });
        let reader = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("vgpu-stdout".into())
            .spawn(move || loop {
                let mut p = libc::pollfd {
                    fd: reader.read.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: polls one descriptor of ours.
                let r = unsafe { libc::poll(&mut p, 1, -1) };
                if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    return;
                }
                if p.revents & libc::POLLIN == 0
                    && p.revents & (libc::POLLERR | libc::POLLNVAL | libc::POLLHUP) != 0
                {
                    return;
                }
                if p.revents & libc::POLLIN != 0 {
                    let mut c = lock(&reader.captured);
                    reader.drain(&mut c);
                }
            })?;
        Ok(OutputCapture { inner })
    }

    /// Everything written to standard output and error since the last
    /// take (the C library's buffers flushed first), and the bytes
    /// dropped because more than a console's worth waited.
    pub fn take(&self) -> ConsoleText {
        // SAFETY: fflush(NULL) flushes every C stdio output stream.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let mut c = lock(&self.inner.captured);
        self.inner.drain(&mut c);
        std::mem::take(&mut *c)
    }
}
