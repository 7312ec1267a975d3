//! `poll(2)`, retried on `EINTR`.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Polls `fds` for up to `timeout_ms` (negative: no limit; zero: never
/// blocks), retrying on `EINTR` with the same timeout. Returns how many
/// have events in `revents`.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: `fds` is a live slice of pollfds of the length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether `fd` is readable (or hung up, or in error) within `timeout_ms`.
pub fn poll_readable(fd: &impl AsFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = [libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    Ok(poll(&mut pfd, timeout_ms)? > 0)
}

/// A timeout for [`poll`]: milliseconds, rounded down, at most `i32::MAX`.
pub fn timeout_ms(t: std::time::Duration) -> i32 {
    t.as_millis().min(i32::MAX as u128) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn test_readable_once_written_or_closed() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert!(!poll_readable(&b, 0).unwrap());
        assert!(!poll_readable(&b, 10).unwrap());
        a.write_all(b"x").unwrap();
        assert!(poll_readable(&b, 0).unwrap());
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(poll_readable(&b, -1).unwrap());
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
        assert_eq!(timeout_ms(Duration::from_micros(1500)), 1);
    }
}
