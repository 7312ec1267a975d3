//! Child processes for the multi-process checks: fork, talk over a
//! socket pair (one line per message), collect the outcome.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The child's end: messages to and from the parent.
pub struct Link {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Link {
    fn new(s: UnixStream) -> std::io::Result<Link> {
        Ok(Link {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
        })
    }

    /// Sends one line.
    pub fn send(&mut self, msg: &str) -> Result<(), String> {
        writeln!(self.writer, "{msg}").map_err(|e| format!("send: {e}"))
    }

    /// Receives one line (without its newline); `None` at end of stream.
    pub fn recv(&mut self) -> Result<Option<String>, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line.trim_end().to_string())),
            Err(e) => Err(format!("receive: {e}")),
        }
    }

    /// Receives one line, failing at end of stream.
    pub fn expect(&mut self) -> Result<String, String> {
        self.recv()?
            .ok_or_else(|| "the other side went away".to_string())
    }

    /// Whether a line is waiting (without blocking).
    pub fn ready(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let _ = self.reader.get_ref().set_nonblocking(true);
        let r = self
            .reader
            .fill_buf()
            .map(|b| !b.is_empty())
            .unwrap_or(false);
        let _ = self.reader.get_ref().set_nonblocking(false);
        r
    }
}

/// A forked child.
pub struct Child {
    pid: libc::pid_t,
    link: Link,
    reaped: bool,
}

/// Forks a child that runs `f` and exits; its `Ok` detail or `Err`
/// reason comes back through [`Child::join`].
///
/// The child inherits this process's open files, including device files
/// with their allocations, so `f` must only use what it opens itself; it
/// leaves with `_exit`, which runs no destructors of the parent's values.
pub fn spawn(f: impl FnOnce(&mut Link) -> Result<String, String>) -> Result<Child, String> {
    let (a, b) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: the suite is single-threaded when it forks (it starts no
    // threads), so the child can run any code; it never returns from
    // this function (it ends in _exit below).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(a);
        let code = match Link::new(b) {
            Ok(mut link) => {
                let r = catch_unwind(AssertUnwindSafe(|| f(&mut link)))
                    .unwrap_or_else(|_| Err("panicked".to_string()));
                let (code, line) = match r {
                    Ok(d) => (0, format!("OK {d}")),
                    Err(e) => (1, format!("ERR {e}")),
                };
                let _ = link.send(&line.replace('\n', " | "));
                code
            }
            Err(_) => 3,
        };
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the child at once, without running destructors or
        // atexit handlers that belong to the parent's state.
        unsafe { libc::_exit(code) };
    }
    drop(b);
    let link = Link::new(a).map_err(|e| format!("socket: {e}"))?;
    Ok(Child {
        pid,
        link,
        reaped: false,
    })
}

impl Child {
    /// The parent's end of the link.
    pub fn link(&mut self) -> &mut Link {
        &mut self.link
    }

    /// Sends SIGKILL.
    pub fn kill(&self) {
        // SAFETY: signals our own child, which is not reaped yet (so the
        // pid cannot have been reused).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }

    fn reap(&mut self) -> Result<libc::c_int, String> {
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child; `status` is a valid out
            // pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.reaped = true;
                return Ok(status);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                self.reaped = true;
                return Err(format!("waitpid {}: {e}", self.pid));
            }
        }
    }

    /// Waits for the child; its detail, or why it failed.
    pub fn join(mut self) -> Result<String, String> {
        let mut last = None;
        while let Ok(Some(line)) = self.link.recv() {
            last = Some(line);
        }
        let status = self.reap()?;
        let outcome = match last.as_deref() {
            Some(l) if l.starts_with("OK") => Ok(l[2..].trim().to_string()),
            Some(l) if l.starts_with("ERR") => Err(l[3..].trim().to_string()),
            Some(l) => Err(format!("unexpected last message {l:?}")),
            None => Err("no report".to_string()),
        };
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            outcome
        } else if libc::WIFSIGNALED(status) {
            Err(format!(
                "child {} killed by signal {} ({})",
                self.pid,
                libc::WTERMSIG(status),
                outcome.err().unwrap_or_default()
            ))
        } else {
            Err(format!(
                "child {} exited with {}: {}",
                self.pid,
                libc::WEXITSTATUS(status),
                outcome.err().unwrap_or_default()
            ))
        }
    }

    /// Waits for a child that was killed; returns its wait status.
    pub fn reap_killed(mut self) -> Result<libc::c_int, String> {
        self.reap()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
            let _ = self.reap();
        }
    }
}

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
