//! The daemon's side of forwarded guest memory: the registry a
//! [`RemotePartition`](crate::RemotePartition) hands the device model.
//!
//! # Concurrency
//!
//! Memory notices come from the VMM's event-loop thread, which never holds
//! the partition; commands come from the partition's worker, which holds
//! it (and, during a transfer from guest memory, the DMA table's read
//! lock). The two must not wait for each other through the host, so each
//! host gets a second socket pair for memory notices (the *control*
//! socket, handed over with [`Kind::Control`] on the command socket when
//! the host starts), and its own thread serves it. The command socket
//! stays the worker's alone.
//!
//! The registry's state is one mutex, held by the event-loop thread for a
//! notice's round trip (bounded by the timeout) and by the worker only
//! briefly: to hand a new host its control socket and replay the
//! mappings, to resolve a transfer's slices, and to detach a host it
//! ends. The worker takes it while holding the partition; the event-loop
//! thread never takes the partition, so the order is fixed. The host's
//! control thread waits for a transfer in progress before it unmaps (see
//! `vgpu-partition-host`'s `guest_mem.rs`), and such a transfer needs nothing from the event-loop
//! thread, so an `Unmap` always completes, or times out.
//!
//! A host that does not answer a notice in time, or answers wrongly, is
//! killed (through a pidfd, so the signal cannot reach a reused pid) and
//! waited for until it is gone, so its mappings are gone too; the
//! partition sees the failure at its next call, fails like for any other
//! broken rule, and recovers on reset.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::info;
use vgpu_backend::{HostMapping, HostMemory, HostSlice};
use vgpu_sys::{error_limited, poll, warn_limited};

use crate::lock;
use crate::proto::{self, Kind, MappedPiece, Reply, Request, Value, MAX_PIECES, MAX_REPLY, REPLY};
use crate::wire;

/// Transfers of a partition by path, for tests and statistics.
#[derive(Debug, Default)]
pub struct TransferCounts {
    direct: AtomicU64,
    staged: AtomicU64,
    overlapped: AtomicU64,
}

impl TransferCounts {
    /// Uploads and downloads that named forwarded guest memory.
    pub fn direct(&self) -> u64 {
        self.direct.load(Ordering::Relaxed)
    }

    /// Uploads and downloads through the staging area.
    pub fn staged(&self) -> u64 {
        self.staged.load(Ordering::Relaxed)
    }

    /// Queued runs the host was given while the one before was still in
    /// flight.
    pub fn overlapped(&self) -> u64 {
        self.overlapped.load(Ordering::Relaxed)
    }

    pub(crate) fn count_overlapped(&self) {
        self.overlapped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count(&self, direct: bool) {
        let c = if direct { &self.direct } else { &self.staged };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The current host's control socket.
struct Control {
    stream: UnixStream,
    /// A clone of the command socket, shut down when the host is killed
    /// here, so a worker waiting on it wakes at once.
    command: UnixStream,
    /// The host process, if it is one.
    pidfd: Option<OwnedFd>,
    seq: u32,
    buf: Vec<u8>,
    /// Mappings the host acknowledged.
    forwarded: HashSet<u64>,
}

#[derive(Default)]
struct State {
    /// Every mapping announced and not yet gone, for replay to a new host.
    maps: HashMap<u64, HostMapping>,
    control: Option<Control>,
    /// Why the current host was killed here, until the partition notices.
    failed: Option<String>,
}

/// A partition's registry of guest memory, forwarded to its host.
pub(crate) struct Registry {
    name: String,
    timeout: Duration,
    state: Mutex<State>,
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a new descriptor owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Kills the process of `pidfd` and waits (at most `timeout`) until it is
/// gone, with its memory.
fn kill_and_wait(pidfd: &OwnedFd, timeout: Duration) -> bool {
    // SAFETY: pidfd_send_signal on our own pidfd, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // A pidfd is readable once the process has exited.
        let n = poll::poll_readable(pidfd, poll::timeout_ms(left));
        if n.as_ref().is_ok_and(|&ready| ready) {
            return true;
        }
        if matches!(n, Ok(false)) || Instant::now() >= deadline {
            return false;
        }
    }
}

/// Whether `file` is sealed against shrinking. The host gets the file
/// description itself, and could otherwise truncate it under the daemon's
/// (and the VMM's) mapping of guest RAM, turning the daemon's next access
/// into SIGBUS: a compromised host must not be able to take the daemon,
/// and with it every tenant, down. QEMU's memfd backend seals by default.
fn sealed(file: &std::fs::File) -> bool {
    // SAFETY: fcntl on a descriptor we hold; F_GET_SEALS reads flags.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

impl Control {
    /// One round trip on the control socket: `Ok(false)` when the host
    /// refused a mapping (it could not map it); anything else but a
    /// success breaks the rules.
    fn exchange(&mut self, req: &Request<'_>, fd: Option<i32>) -> Result<bool, String> {
        let kind = req.kind();
        self.seq = self.seq.wrapping_add(1);
        wire::send(&self.stream, kind as u16, self.seq, &req.encode(), fd)
            .map_err(|e| format!("memory socket: {e}"))?;
        let (h, _) = wire::recv(&mut self.stream, MAX_REPLY, &mut self.buf, false)
            .map_err(|e| format!("memory socket: {e}"))?;
        if h.kind != REPLY | kind as u16 || h.seq != self.seq {
            return Err(format!(
                "memory socket: frame {:#06x}/{} for {kind:?}/{}",
                h.kind, h.seq, self.seq
            ));
        }
        match Reply::decode(kind, &self.buf) {
            Ok(Reply {
                result: Ok(Value::None),
                memory_used: 0,
            }) => Ok(true),
            Ok(Reply {
                result: Err(e),
                memory_used: 0,
            }) if kind == Kind::Map => {
                warn_limited!("partition host refused guest memory: {e}");
                Ok(false)
            }
            Ok(r) => Err(format!("memory socket: answer {r:?} to {kind:?}")),
            Err(e) => Err(format!("memory socket: {e}")),
        }
    }

    /// Announces `m`; whether the host took it. Files not sealed against
    /// shrinking are not forwarded (see [`sealed`]).
    fn map(&mut self, m: &HostMapping) -> Result<bool, String> {
        if !sealed(&m.file) {
            info!(
                "guest memory {}: its file is not sealed against shrinking; \
                 reached through the staging area",
                m.id
            );
            return Ok(false);
        }
        let req = Request::Map(proto::Map {
            id: m.id,
            file_offset: m.file_offset,
            len: m.len as u64,
            readable: m.readable,
            writable: m.writable,
        });
        let took = self.exchange(&req, Some(m.file.as_raw_fd()))?;
        if took {
            self.forwarded.insert(m.id);
        }
        Ok(took)
    }
}

impl Registry {
    pub(crate) fn new(name: &str, timeout: Duration) -> Registry {
        Registry {
            name: name.to_string(),
            timeout,
            state: Mutex::new(State::default()),
        }
    }

    /// Installs a new host's control socket (the host has its other end)
    /// and announces every current mapping to it. A mapping the host
    /// refuses stays reached through the staging area; a host that breaks
    /// the rules is returned as an error (the caller kills it).
    pub(crate) fn attach(
        &self,
        stream: UnixStream,
        command: UnixStream,
        pid: Option<u32>,
    ) -> Result<(), String> {
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|_| stream.set_write_timeout(Some(self.timeout)))
            .map_err(|e| format!("memory socket: {e}"))?;
        // Guest memory goes only to a host that can be ended: without its
        // pidfd, an unmap the host does not answer could not be enforced.
        let pidfd = match pid {
            Some(p) => Some(pidfd_open(p).ok_or_else(|| {
                format!("cannot open a pidfd for partition host {p}: guest memory is not forwarded to it")
            })?),
            None => None,
        };
        let mut st = lock(&self.state);
        let mut c = Control {
            stream,
            command,
            pidfd,
            seq: 0,
            buf: Vec::new(),
            forwarded: HashSet::new(),
        };
        st.failed = None;
        let maps: Vec<HostMapping> = st.maps.values().cloned().collect();
        for m in &maps {
            c.map(m)?;
        }
        st.control = Some(c);
        Ok(())
    }

    /// Forgets the current host (it is being ended): closes its control
    /// socket and drops any failure recorded for it.
    pub(crate) fn detach(&self) {
        let mut st = lock(&self.state);
        st.control = None;
        st.failed = None;
    }

    /// Why the current host was killed by a memory notice, if it was.
    pub(crate) fn take_failure(&self) -> Option<String> {
        lock(&self.state).failed.take()
    }

    /// Whether any mapping is forwarded to the current host.
    pub(crate) fn any_forwarded(&self) -> bool {
        lock(&self.state)
            .control
            .as_ref()
            .is_some_and(|c| !c.forwarded.is_empty())
    }

    /// Pieces of forwarded mappings for `slices`, or `None` when any of
    /// them is not in one (the transfer then takes the staging area).
    /// `write`: the device writes them.
    pub(crate) fn resolve(&self, slices: &[HostSlice], write: bool) -> Option<Vec<MappedPiece>> {
        if slices.is_empty() || slices.len() > MAX_PIECES {
            return None;
        }
        let st = lock(&self.state);
        let c = st.control.as_ref()?;
        slices
            .iter()
            .map(|s| {
                if !c.forwarded.contains(&s.mapping) {
                    return None;
                }
                let m = st.maps.get(&s.mapping)?;
                if (write && !m.writable) || (!write && !m.readable) || s.len == 0 {
                    return None;
                }
                let offset = (s.ptr as usize).checked_sub(m.addr)?;
                (offset.checked_add(s.len)? <= m.len).then_some(MappedPiece {
                    mapping: s.mapping,
                    offset: offset as u64,
                    len: s.len as u64,
                })
            })
            .collect()
    }

    /// Kills the current host after a broken rule on the control socket,
    /// and waits until it is gone.
    fn fail(&self, st: &mut State, why: String) {
        error_limited!("partition {:?}: partition host: {why}; killed", self.name);
        if let Some(c) = st.control.take() {
            let _ = c.command.shutdown(std::net::Shutdown::Both);
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            if let Some(pidfd) = &c.pidfd {
                if !kill_and_wait(pidfd, self.timeout) {
                    error_limited!(
                        "partition {:?}: the killed partition host is still there after {:?}",
                        self.name,
                        self.timeout
                    );
                }
            }
        }
        st.failed = Some(why);
    }
}

impl HostMemory for Registry {
    fn mapped(&self, mapping: HostMapping) {
        let mut st = lock(&self.state);
        let id = mapping.id;
        if let Some(c) = st.control.as_mut() {
            if let Err(why) = c.map(&mapping) {
                self.fail(&mut st, why);
            }
        }
        st.maps.insert(id, mapping);
    }

    fn unmapped(&self, id: u64) {
        let mut st = lock(&self.state);
        st.maps.remove(&id);
        let Some(c) = st.control.as_mut() else {
            return;
        };
        if !c.forwarded.remove(&id) {
            return;
        }
        if let Err(why) = c.exchange(&Request::Unmap { id }, None) {
            self.fail(&mut st, why);
        }
    }
}
