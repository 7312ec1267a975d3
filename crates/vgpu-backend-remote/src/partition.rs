//! The parent's side of a partition: forwards each call to the partition
//! host and checks every answer.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::info;
use vgpu_backend::console::ConsoleText;
use vgpu_backend::{
    Capacity, Finished, Finishing, FunctionInfo, HostMemory, HostSink, HostSource, Launch, OpError,
    Partition, PartitionSpec, Queued, QueuedDone, SliceFn, Started, MAX_QUEUED_STEPS,
};
use vgpu_sys::{error_limited, warn_limited};

use crate::forward::{Registry, TransferCounts};
use crate::mailbox::{self, Mailbox, Side};
use crate::proto::{self, Kind, Piece, ProtoError, Reply, Request, Step, Value, MAX_REPLY, REPLY};
use crate::shm::Staging;
use crate::wire::{self, WireError};
use crate::{lock, HostLink, HostProcess, Launcher, RemoteConfig};

/// How often an idle function of a shared host looks whether it ended.
const SHARED_WATCH: Duration = Duration::from_millis(200);

/// How long a closed host gets to exit on its own before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(crate::EXIT_GRACE_MS);

/// A running partition host.
pub(crate) struct Link {
    stream: UnixStream,
    /// Frames through shared memory, once the host has the staging area.
    mailbox: Option<Mailbox>,
    spin: Duration,
    /// The socket's current read and write timeout.
    timeout: Option<Duration>,
    process: Option<HostProcess>,
    /// A shared host's process id (not ours to kill or reap).
    shared_pid: Option<u32>,
    seq: u32,
    buf: Vec<u8>,
}

/// What a request moves besides its frame.
enum Xfer<'a> {
    None,
    Up(&'a dyn HostSource),
    Down(&'a dyn HostSink),
}

/// The guest memory fault the parent reported to the host, with the error
/// the source or sink returned: a host may only pass back this one.
type Reported = Option<(u64, OpError)>;

fn broken(why: impl std::fmt::Display) -> String {
    why.to_string()
}

impl Link {
    /// Starts a host and checks that it speaks our protocol; returns it
    /// with its backend's name and capacity.
    pub(crate) fn open(
        launcher: &dyn Launcher,
        timeout: Duration,
        spin: Duration,
    ) -> Result<(Link, String, Capacity), String> {
        let HostLink {
            stream,
            process,
            shared_pid,
        } = launcher
            .launch()
            .map_err(|e| format!("cannot start a partition host: {e}"))?;
        let mut link = Link {
            stream,
            mailbox: None,
            spin,
            timeout: None,
            process,
            shared_pid,
            seq: 0,
            buf: Vec::with_capacity(MAX_REPLY as usize),
        };
        match link.exchange(&Request::Hello, None, timeout, Xfer::None, None, 0) {
            Ok(Reply {
                result: Ok(Value::Hello { name, capacity }),
                ..
            }) => Ok((link, name, capacity)),
            r => Err(link.refused(r, "hello", "serve")),
        }
    }

    /// Why a host did not give the expected answer `r` to the start-up
    /// request `req` (a refusal: it cannot `act`); the host is killed.
    fn refused(self, r: Result<Reply, String>, req: &str, act: &str) -> String {
        self.kill();
        match r {
            Ok(Reply { result: Err(e), .. }) => format!("the partition host cannot {act}: {e}"),
            Ok(other) => format!("unexpected answer to {req}: {other:?}"),
            Err(why) => why,
        }
    }

    /// The host's process id, if it is a process.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process
            .as_ref()
            .map(HostProcess::id)
            .or(self.shared_pid)
    }

    /// Sends `req` and reads until its reply, serving the host's staging
    /// callbacks of `xfer`. Any broken rule ends the exchange with why.
    fn exchange(
        &mut self,
        req: &Request<'_>,
        fd: Option<i32>,
        timeout: Duration,
        xfer: Xfer<'_>,
        mut staging: Option<&mut Staging>,
        quota: u64,
    ) -> Result<Reply, String> {
        let kind = req.kind();
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        if self.timeout != Some(timeout) {
            // Two system calls: only when the timeout changes.
            self.stream
                .set_read_timeout(Some(timeout))
                .and_then(|_| self.stream.set_write_timeout(Some(timeout)))
                .map_err(broken)?;
            self.timeout = Some(timeout);
        }
        let wire_err = |e: WireError| match e {
            WireError::Timeout => format!("no answer within {timeout:?}"),
            WireError::Closed => "the partition host exited".to_string(),
            e => e.to_string(),
        };
        let mut payload = req.encode();
        let mut reported: Reported = None;
        let total = match req {
            Request::Upload { len, .. } | Request::Download { len, .. } => *len,
            _ => 0,
        };
        let room = staging.as_ref().map_or(0, |s| s.len() as u64);
        // Downloads arrive in order: the next offset expected.
        let mut next = 0u64;
        // Pieces are half the staging area: one is filled or drained while
        // the host works on the other.
        let half = room / 2;
        // Uploads: each piece is asked for once, give or take a retry.
        let mut needs_left = 2 * total.div_ceil(half.max(1)) + 4;
        if let (Request::Upload { dst, len, .. }, Xfer::Up(src), Some(st)) =
            (req, &xfer, staging.as_deref_mut())
        {
            // The first piece goes with the request, saving a round trip.
            let n = (*len).min(half) as usize;
            let prefilled = match src.read_at(0, st.bytes_mut(n)) {
                Ok(()) => n as u64,
                Err(_) => 0,
            };
            payload = Request::Upload {
                dst: *dst,
                len: *len,
                prefilled,
            }
            .encode();
        }
        self.send(kind as u16, seq, &payload, fd)
            .map_err(wire_err)?;
        loop {
            let h = self.recv().map_err(wire_err)?;
            if h.seq != seq {
                return Err(ProtoError::Sequence {
                    got: h.seq,
                    expected: seq,
                }
                .to_string());
            }
            if h.kind == REPLY | kind as u16 {
                let mut reply = Reply::decode(kind, &self.buf).map_err(broken)?;
                check_reply(kind, &mut reply, quota, &mut reported)?;
                if let (Ok(Value::Download { offset, len, at }), Xfer::Down(sink), Some(st)) =
                    (&reply.result, &xfer, staging.as_deref())
                {
                    if *len > 0 {
                        let piece = Piece {
                            offset: *offset,
                            len: *len,
                            at: *at,
                        };
                        check_piece(piece, next, total, room)?;
                        next += len;
                        if let Err(e) = sink.write_at(*offset, staged(st, piece)) {
                            reply.result = Err(e);
                            return Ok(reply);
                        }
                    }
                    if next != total {
                        return Err(format!("download ended at {next} of {total} bytes"));
                    }
                    reply.result = Ok(Value::None);
                }
                return Ok(reply);
            }
            let callback = Kind::from_raw(h.kind);
            match (callback, &xfer) {
                (Some(Kind::Need), Xfer::Up(_)) | (Some(Kind::Out), Xfer::Down(_)) => {}
                _ => return Err(ProtoError::Kind(h.kind).to_string()),
            }
            let piece = Piece::decode(&self.buf).map_err(broken)?;
            let Piece { offset, len, at } = piece;
            let st = staging
                .as_deref_mut()
                .ok_or("callback without a transfer")?;
            let outcome = match (callback, &xfer) {
                (Some(Kind::Need), Xfer::Up(src)) => {
                    if needs_left == 0 {
                        return Err("too many requests for upload data".into());
                    }
                    needs_left -= 1;
                    if len == 0
                        || at.checked_add(len).is_none_or(|e| e > room)
                        || offset.checked_add(len).is_none_or(|e| e > total)
                    {
                        return Err(format!(
                            "asked for {len} bytes at {offset} of a {total}-byte upload, at {at} of the staging area"
                        ));
                    }
                    let end = (at + len) as usize;
                    src.read_at(offset, &mut st.bytes_mut(end)[at as usize..])
                }
                (Some(Kind::Out), Xfer::Down(sink)) => {
                    check_piece(piece, next, total, room)?;
                    next += len;
                    sink.write_at(offset, staged(st, piece))
                }
                _ => return Err(ProtoError::Kind(h.kind).to_string()),
            };
            let fault = match outcome {
                Ok(()) => None,
                Err(e) => {
                    let at = match e {
                        OpError::Fault(f) => f,
                        _ => offset,
                    };
                    reported = Some((at, e));
                    Some(at)
                }
            };
            self.send(h.kind | REPLY, seq, &proto::encode_answer(fault), None)
                .map_err(wire_err)?;
        }
    }

    /// Sends a frame: with an fd always on the socket, else through the
    /// mailbox when there is one.
    fn send(
        &mut self,
        kind: u16,
        seq: u32,
        payload: &[u8],
        fd: Option<i32>,
    ) -> Result<(), WireError> {
        match (&mut self.mailbox, fd) {
            (Some(m), None) => m.send(&self.stream, kind, seq, payload),
            _ => wire::send(&self.stream, kind, seq, payload, fd),
        }
    }

    /// Receives a frame from the host.
    fn recv(&mut self) -> Result<proto::Header, WireError> {
        match &mut self.mailbox {
            Some(m) => m.recv(&mut self.stream, MAX_REPLY, &mut self.buf),
            None => {
                wire::spin(&self.stream, self.spin);
                wire::recv(&mut self.stream, MAX_REPLY, &mut self.buf, false).map(|(h, _)| h)
            }
        }
    }

    /// Whether the host closed its end (it ended), without reading.
    fn closed(&self) -> bool {
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into `byte`; MSG_DONTWAIT never blocks
        // and MSG_PEEK leaves any data for the exchange that reads it.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }

    /// Kills the host at once and reaps it.
    pub(crate) fn kill(mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Link {
    /// Closing the socket tells the host to exit; it is killed if it has
    /// not within [`EXIT_GRACE`], and reaped either way.
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let Some(mut child) = self.process.take() else {
            return;
        };
        let deadline = Instant::now() + EXIT_GRACE;
        let mut pause = Duration::from_micros(100);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                _ => {
                    warn_limited!(
                        "partition host {} did not exit when closed; killing it",
                        child.id()
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }
}

/// One piece of a download must continue where the last one ended and
/// lie inside the staging area.
fn check_piece(p: Piece, next: u64, total: u64, room: u64) -> Result<(), String> {
    if p.offset != next
        || p.len == 0
        || p.at.checked_add(p.len).is_none_or(|e| e > room)
        || p.offset.checked_add(p.len).is_none_or(|e| e > total)
    {
        return Err(format!(
            "download piece {p:?}; expected one at {next} of {total} in {room} bytes of staging"
        ));
    }
    Ok(())
}

/// The bytes of a checked piece in the staging area.
fn staged(st: &Staging, p: Piece) -> &[u8] {
    &st.bytes((p.at + p.len) as usize)[p.at as usize..]
}

/// Checks a reply's values against the request and the partition. A
/// guest memory fault the host passes back becomes the error the source
/// or sink gave.
fn check_reply(
    kind: Kind,
    reply: &mut Reply,
    quota: u64,
    reported: &mut Reported,
) -> Result<(), String> {
    if kind != Kind::Hello && reply.memory_used > quota {
        return Err(format!(
            "claims {} bytes in use, over the quota of {quota}",
            reply.memory_used
        ));
    }
    match &reply.result {
        Err(OpError::NoMemory { available, .. }) if *available > quota => Err(format!(
            "claims {available} bytes available, over the quota of {quota}"
        )),
        Err(OpError::Fault(f)) => match (kind, reported.take()) {
            (Kind::Upload | Kind::Download, Some((at, e))) if at == *f => {
                reply.result = Err(e);
                Ok(())
            }
            _ => Err(format!(
                "reports a guest memory fault at {f} that did not happen"
            )),
        },
        _ => Ok(()),
    }
}

/// A partition served by a partition host process.
///
/// When the host dies, stops answering or breaks the protocol, it is
/// killed and reaped, and every call fails with [`OpError::Device`] until
/// [`Partition::reset`] starts a fresh host.
pub struct RemotePartition {
    spec: PartitionSpec,
    launcher: Arc<dyn Launcher>,
    config: RemoteConfig,
    /// What the backend has not given out, where this partition holds a
    /// reservation of it (not another context of one that does).
    pool: Option<Arc<Mutex<Capacity>>>,
    /// Suspended: the host's partition holds nothing on the device, and
    /// `pool` has its memory back.
    suspended: bool,
    /// Declared before `staging`, so dropped before it: a link's mailbox
    /// points into the staging area.
    link: Option<Link>,
    staging: Staging,
    failed: Option<String>,
    /// The host's backend lost its device state: a reset replaces it.
    lost: bool,
    memory_used: u64,
    /// What the host's partition reports of its kernels' compute units.
    kernel_units: u32,
    /// Whether the host's partition runs cooperative launches.
    cooperative: bool,
    /// Whether the host's partition offers virtual memory management.
    vmm: bool,
    /// Whether the host's partition has arrays, textures and surfaces.
    arrays: bool,
    /// Guest memory forwarded to the host (see `forward.rs`).
    registry: Arc<Registry>,
    counts: Arc<TransferCounts>,
    /// Runs the host has started, oldest first.
    started: VecDeque<StartedRun>,
}

impl std::fmt::Debug for RemotePartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePartition")
            .field("spec", &self.spec)
            .field("host_pid", &self.host_pid())
            .field("failed", &self.failed)
            .finish()
    }
}

impl RemotePartition {
    /// Starts the host and creates the partition in it. `pool`, if any,
    /// is charged already and gets the spec back when this is dropped.
    pub(crate) fn create(
        spec: &PartitionSpec,
        launcher: Arc<dyn Launcher>,
        config: RemoteConfig,
        pool: Option<Arc<Mutex<Capacity>>>,
    ) -> Result<RemotePartition, String> {
        let staging = match Staging::create(config.staging_bytes) {
            Ok(s) => s,
            Err(e) => {
                if let Some(pool) = &pool {
                    lock(pool).release(spec);
                }
                return Err(format!("cannot create the staging area: {e}"));
            }
        };
        let op_timeout = config.op_timeout;
        let mut p = RemotePartition {
            spec: spec.clone(),
            launcher,
            config,
            pool,
            suspended: false,
            staging,
            link: None,
            failed: None,
            lost: false,
            memory_used: 0,
            kernel_units: spec.compute_units,
            cooperative: false,
            vmm: false,
            arrays: false,
            registry: Arc::new(Registry::new(&spec.name, op_timeout)),
            counts: Arc::default(),
            started: VecDeque::new(),
        };
        // On failure `p` is dropped, which gives the pool back.
        p.link = Some(p.start()?);
        Ok(p)
    }

    /// Changes what this partition holds of the backend's pool from
    /// `held` to `bytes`, where it holds a reservation.
    fn draw(&self, held: u64, bytes: u64) -> Result<(), OpError> {
        match &self.pool {
            Some(pool) => {
                vgpu_backend::rules::requota(Some(&mut lock(pool).memory), 0, held, bytes)
            }
            None => Ok(()),
        }
    }

    fn start(&mut self) -> Result<Link, String> {
        let (mut link, _, _) =
            Link::open(&*self.launcher, self.config.start_timeout, self.config.spin)?;
        // Polling ends talk through the mailbox; nothing a previous host
        // left in it is kept.
        let mailbox = !self.config.spin.is_zero();
        // SAFETY: the staging area's control area; no host uses it now
        // (any previous one was killed and reaped).
        unsafe { mailbox::clear(self.staging.control()) };
        let req = Request::Create(proto::Create {
            name: &self.spec.name,
            memory: self.spec.memory,
            compute_units: self.spec.compute_units,
            staging_len: self.staging.len() as u64,
            mailbox,
        });
        // The memory control socket goes first: frames with an fd travel
        // on the socket, and after `Create` frames may use the mailbox.
        let control = match self.hand_control(&mut link) {
            Ok(c) => c,
            Err(why) => {
                link.kill();
                return Err(why);
            }
        };
        let fd = self.staging.file().as_raw_fd();
        let r = link.exchange(
            &req,
            Some(fd),
            self.config.start_timeout,
            Xfer::None,
            None,
            self.spec.memory,
        );
        match r {
            Ok(Reply {
                result:
                    Ok(Value::Created {
                        units,
                        cooperative,
                        vmm,
                        arrays,
                    }),
                memory_used: 0,
            }) if units >= 1 => {
                self.kernel_units = units;
                self.cooperative = cooperative;
                self.vmm = vmm;
                self.arrays = arrays;
                // Guest memory mapped so far goes to the new host before
                // any transfer can name it.
                let attached = link
                    .stream
                    .try_clone()
                    .map_err(broken)
                    .and_then(|command| self.registry.attach(control, command, link.pid()));
                if let Err(why) = attached {
                    link.kill();
                    self.registry.detach();
                    return Err(why);
                }
                if mailbox {
                    // SAFETY: the control area of `self.staging`, which
                    // outlives every link of this partition (the link
                    // field is dropped first).
                    link.mailbox = Some(unsafe {
                        Mailbox::new(self.staging.control(), Side::Parent, self.config.spin)
                    });
                }
                info!(
                    "partition {:?}: partition host {} started",
                    self.spec.name,
                    link.pid().map_or("(thread)".into(), |p| p.to_string())
                );
                Ok(link)
            }
            r => Err(link.refused(r, "create", "create it")),
        }
    }

    /// Gives a starting host the other end of a new memory control socket
    /// (see `forward.rs`); returns ours.
    fn hand_control(&self, link: &mut Link) -> Result<UnixStream, String> {
        let (ours, theirs) = UnixStream::pair().map_err(broken)?;
        let r = link.exchange(
            &Request::Control,
            Some(theirs.as_raw_fd()),
            self.config.start_timeout,
            Xfer::None,
            None,
            self.spec.memory,
        )?;
        match r.result {
            Ok(Value::None) => Ok(ours),
            other => Err(format!("unexpected answer to control: {other:?}")),
        }
    }

    /// The host's process id (`None` when it failed, or is not a process).
    pub fn host_pid(&self) -> Option<u32> {
        self.link.as_ref().and_then(Link::pid)
    }

    /// Why the host failed, until the next reset.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn dead(&self) -> OpError {
        OpError::Device(format!(
            "partition host failed ({}); reset the function to restart it",
            self.failed.as_deref().unwrap_or("not running")
        ))
    }

    /// How many transfers took which path, and how many runs overlapped.
    pub fn transfer_counts(&self) -> Arc<TransferCounts> {
        Arc::clone(&self.counts)
    }

    /// Ends the current host, then its memory socket: until the host is
    /// gone, an unmap still waits for it (a notice it cannot answer
    /// fails at once, or kills it if it is stuck), so none returns while
    /// the host may still touch guest memory.
    fn end_link(&mut self) {
        if let Some(link) = self.link.take() {
            link.kill();
        }
        self.registry.detach();
    }

    /// Ends the host after a broken rule: from now on calls fail.
    fn fail(&mut self, why: String) -> OpError {
        error_limited!(
            "partition {:?}: partition host {}: {why}; killed",
            self.spec.name,
            self.host_pid().map_or("?".into(), |p| p.to_string())
        );
        self.end_link();
        self.failed = Some(why);
        self.memory_used = 0;
        self.dead()
    }

    fn call(&mut self, req: &Request<'_>, xfer: Xfer<'_>) -> Result<Value, OpError> {
        if self.failed.is_some() {
            return Err(self.dead());
        }
        if let Some(why) = self.registry.take_failure() {
            return Err(self.fail(why));
        }
        let Some(link) = self.link.as_mut() else {
            return Err(self.dead());
        };
        let staging = match xfer {
            Xfer::None => None,
            _ => Some(&mut self.staging),
        };
        match link.exchange(
            req,
            None,
            self.config.op_timeout,
            xfer,
            staging,
            self.spec.memory,
        ) {
            Ok(reply) => {
                self.memory_used = reply.memory_used;
                if reply.result.as_ref().is_err_and(OpError::is_lost) {
                    self.lost = true;
                }
                reply.result
            }
            Err(why) => Err(self.fail(why)),
        }
    }

    fn call_none(&mut self, req: &Request<'_>) -> Result<(), OpError> {
        self.call_none_with(req, Xfer::None)
    }

    fn call_none_with(&mut self, req: &Request<'_>, xfer: Xfer<'_>) -> Result<(), OpError> {
        match self.call(req, xfer)? {
            Value::None => Ok(()),
            v => Err(self.fail(format!("unexpected result {v:?}"))),
        }
    }

    /// Runs `steps` on the host; checks that it answered each, in
    /// order of completion.
    fn call_queued(&mut self, steps: Vec<Step<'_>>) -> Result<Vec<QueuedDone>, OpError> {
        let n = steps.len();
        match self.call(&Request::Queued(steps), Xfer::None)? {
            Value::Queued(done) if self.check_done(&done, n) => Ok(done),
            v => Err(self.fail(format!("unexpected result of {n} queued steps: {v:?}"))),
        }
    }

    /// Whether `done` answers `n` steps, in order of completion; notes a
    /// loss of the device state among them.
    fn check_done(&mut self, done: &[QueuedDone], n: usize) -> bool {
        if done.len() != n || done.windows(2).any(|w| w[0].end_ns > w[1].end_ns) {
            return false;
        }
        if done
            .iter()
            .any(|d| d.result.as_ref().is_err_and(OpError::is_lost))
        {
            self.lost = true;
        }
        true
    }

    /// [`Partition::finish_queued`], waiting `within_us` µs at most for
    /// the host (0: as long as it takes).
    fn finish_within(&mut self, within_us: u32) -> Finishing {
        if self.started.is_empty() {
            return Finishing::Idle;
        }
        // A host that broke a rule since is believed no more.
        let answer = if self.failed.is_some() {
            Err(self.dead())
        } else if self.started.iter().any(|r| r.finished.is_some()) {
            Ok(())
        } else {
            match self.call(&Request::Finish { within_us }, Xfer::None) {
                Ok(Value::Finished(f)) => self.take_finished(f).map_err(|why| self.fail(why)),
                Ok(Value::None) if within_us > 0 => return Finishing::Pending,
                Ok(v) => Err(self.fail(format!("unexpected answer to a finish: {v:?}"))),
                Err(e) => Err(e),
            }
        };
        let at = match answer {
            // The oldest run with results is the oldest of its lane.
            Ok(()) => self.started.iter().position(|r| r.finished.is_some()),
            Err(_) => Some(0),
        };
        let Some(mut run) = at.and_then(|at| self.started.remove(at)) else {
            return Finishing::Idle;
        };
        let remote = match (answer, run.finished.take()) {
            (Ok(()), Some(f)) => Ok(f),
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(self.dead()),
        };
        // The host's word on how long the run waited, within what the
        // clock here allows.
        let waited_ns = remote.as_ref().map_or(0, |f| {
            f.waited_ns
                .min(run.at.elapsed().as_nanos().try_into().unwrap_or(u64::MAX))
        });
        Finishing::Done(
            run.lane as usize,
            Finished {
                waited_ns,
                done: merge_run(run.local, remote.map(|f| f.done), run.count),
            },
        )
    }

    /// Keeps the results the host gave for a run of lane `f.lane`: the
    /// oldest of that lane it has not given yet. Err (why) when it has
    /// none there or the results do not fit the run.
    fn take_finished(&mut self, f: proto::LaneRun) -> Result<(), String> {
        let Some(at) = self
            .started
            .iter()
            .position(|r| r.lane == f.lane && r.finished.is_none())
        else {
            return Err(format!(
                "a finished run on lane {} it was not given",
                f.lane
            ));
        };
        let sent = self.started[at].sent;
        if !self.check_done(&f.run.done, sent) {
            return Err(format!("unexpected result of {sent} started steps: {f:?}"));
        }
        self.started[at].finished = Some(f.run);
        Ok(())
    }

    /// The steps of a run as the protocol carries them, and which were
    /// refused here (`Some`) rather than sent; `None` when the run cannot
    /// go to the host in one request (see [`Self::copy_pieces`]): it
    /// then runs step by step, each copy on its own path.
    fn prepare_run<'s>(&mut self, steps: &'s [Queued<'_>]) -> Option<Prepared<'s>> {
        let mut pieces = self.copy_pieces(steps)?.into_iter();
        let mut local = Vec::with_capacity(steps.len());
        let mut sent = Vec::with_capacity(steps.len());
        for s in steps.iter().take(MAX_QUEUED_STEPS) {
            let checked = match s {
                Queued::Launch(l) => check_launch(l),
                _ => Ok(()),
            };
            // A copy's memory goes as the pieces of its forwarded mappings.
            let step = checked.map(|()| {
                s.as_ref()
                    .map(|l| l.clone(), |_, _| pieces.next().unwrap_or_default())
            });
            local.push(match step {
                Ok(step) => {
                    sent.push(step);
                    None
                }
                Err(e) => Some(e),
            });
        }
        Some((local, sent))
    }

    fn call_u64(&mut self, req: &Request<'_>) -> Result<u64, OpError> {
        match self.call(req, Xfer::None)? {
            Value::U64(x) => Ok(x),
            v => Err(self.fail(format!("unexpected result {v:?}"))),
        }
    }
}

/// A run's steps refused here (`Some`, in their places) and those that go
/// to the host.
type Prepared<'s> = (Vec<Option<OpError>>, Vec<Step<'s>>);

/// A run the host has started: which of its steps were refused here,
/// how many went, of how many, when, and its results if the host gave
/// them already.
#[derive(Debug)]
struct StartedRun {
    lane: u32,
    local: Vec<Option<OpError>>,
    sent: usize,
    count: usize,
    at: Instant,
    finished: Option<Finished>,
}

/// One result per step of a run of `count` steps: the refusals made here
/// in their places, the host's results (or its failure) for the others.
fn merge_run(
    local: Vec<Option<OpError>>,
    mut remote: Result<Vec<QueuedDone>, OpError>,
    count: usize,
) -> Vec<QueuedDone> {
    let mut out = Vec::with_capacity(count);
    let mut end_ns = 0;
    let mut from_host = remote.as_mut().map(|v| v.drain(..));
    for refused in local {
        let result = match (refused, &mut from_host) {
            (Some(e), _) => Err(e),
            (None, Ok(done)) => match done.next() {
                Some(d) => {
                    end_ns = d.end_ns;
                    d.result
                }
                None => Err(OpError::Device("missing step result".into())),
            },
            (None, Err(e)) => Err(e.clone()),
        };
        out.push(QueuedDone { result, end_ns });
    }
    vgpu_backend::refuse_past_limit(&mut out, count);
    out
}

type WithSlices<'a> = dyn FnMut(&mut SliceFn<'_>) -> Result<bool, OpError> + 'a;

impl RemotePartition {
    /// Moves a transfer between device memory at `dev` and guest memory
    /// the host has mapped, naming the pieces instead of staging bytes.
    /// `with` hands over the source's or sink's slices and keeps them
    /// (the DMA table's read lock) until the host has replied, so no copy
    /// outlives an unmap. `Ok(false)`: not all of it lies in forwarded
    /// mappings; the caller stages it.
    fn direct(
        &mut self,
        dev: u64,
        download: bool,
        with: &mut WithSlices<'_>,
    ) -> Result<bool, OpError> {
        if self.failed.is_some() || !self.registry.any_forwarded() {
            return Ok(false);
        }
        let done = with(&mut |slices| {
            let Some(pieces) = self.registry.resolve(slices, download) else {
                return Ok(false);
            };
            let req = if download {
                Request::DownloadMapped { src: dev, pieces }
            } else {
                Request::UploadMapped { dst: dev, pieces }
            };
            self.call_none(&req).map(|()| true)
        })?;
        if done {
            self.counts.count(true);
        }
        Ok(done)
    }

    /// The pieces of forwarded guest memory of each copy of `steps`, in
    /// order; `None` when some copy's memory is not all forwarded or
    /// takes too many pieces, or when copies go both ways (the host keeps
    /// one run's memory mapped with one lock, for one direction).
    fn copy_pieces(&mut self, steps: &[Queued<'_>]) -> Option<Vec<Vec<proto::MappedPiece>>> {
        let copies: Vec<(&[vgpu_backend::HostSlice], bool)> = steps
            .iter()
            .take(MAX_QUEUED_STEPS)
            .filter_map(|s| match s {
                Queued::Upload { src, .. } => Some((src.slices(), false)),
                Queued::Download { dst, .. } => Some((dst.slices(), true)),
                _ => None,
            })
            .collect();
        if copies.is_empty() {
            return Some(Vec::new());
        }
        if self.failed.is_some()
            || !self.registry.any_forwarded()
            || copies.iter().any(|&(_, down)| down != copies[0].1)
        {
            return None;
        }
        let pieces: Option<Vec<_>> = copies
            .iter()
            .map(|&(slices, down)| {
                self.registry
                    .resolve(slices, down)
                    .filter(|p| !p.is_empty() && p.len() <= proto::MAX_PIECES)
            })
            .collect();
        if let Some(p) = &pieces {
            for _ in p {
                self.counts.count(true);
            }
        }
        pieces
    }

    /// Moves an upload or download (`xfer`) between device memory at
    /// `dev` and guest memory: through forwarded mappings if it can (see
    /// [`RemotePartition::direct`]), else as `req` through the staging
    /// area.
    fn transfer(
        &mut self,
        dev: u64,
        with: &mut WithSlices<'_>,
        req: &Request<'_>,
        xfer: Xfer<'_>,
    ) -> Result<(), OpError> {
        if self.direct(dev, matches!(xfer, Xfer::Down(_)), with)? {
            return Ok(());
        }
        self.counts.count(false);
        self.call_none_with(req, xfer)
    }
}

/// Refuses a launch the protocol cannot carry.
fn check_launch(launch: &Launch<'_>) -> Result<(), OpError> {
    if launch.params.len() > vgpu_abi::MAX_PARAMS_SIZE as usize
        || launch.entry.len() > proto::MAX_ENTRY
    {
        return Err(OpError::Invalid(format!(
            "{}: parameter block of {} bytes or entry name too long",
            launch.entry,
            launch.params.len()
        )));
    }
    Ok(())
}

impl Partition for RemotePartition {
    fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    fn kernel_compute_units(&self) -> u32 {
        self.kernel_units
    }

    fn cooperative(&self) -> bool {
        self.cooperative
    }

    fn has_vmm(&self) -> bool {
        self.vmm
    }

    /// The host checks and runs it; a reservation's address and a
    /// handle come back as they are (the device's, not the daemon's).
    fn vmm(&mut self, op: &vgpu_backend::vmm::VmmOp) -> Result<u64, OpError> {
        if !self.vmm {
            return Err(OpError::Unsupported("virtual memory management".into()));
        }
        self.call_u64(&Request::Vmm(*op))
    }

    fn arrays(&self) -> bool {
        self.arrays
    }

    fn resource(&mut self, req: &vgpu_backend::arrays::Resource) -> Result<u64, OpError> {
        self.call_u64(&Request::Resource(req.bytes()))
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.call_u64(&Request::Alloc { size, align })
    }

    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.call_none(&Request::Free { addr })
    }

    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        let req = Request::Upload {
            dst,
            len: src.len(),
            prefilled: 0,
        };
        self.transfer(dst, &mut |f| src.with_slices(f), &req, Xfer::Up(src))
    }

    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        let req = Request::Download {
            src,
            len: dst.len(),
        };
        self.transfer(src, &mut |f| dst.with_slices_mut(f), &req, Xfer::Down(dst))
    }

    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        if image.len() as u64 > vgpu_abi::MAX_MODULE_SIZE {
            return Err(OpError::Invalid(format!(
                "module image of {} bytes exceeds {}",
                image.len(),
                vgpu_abi::MAX_MODULE_SIZE
            )));
        }
        self.call_u64(&Request::ModuleLoad { format, image })
    }

    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.call_none(&Request::ModuleUnload { module })
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        let Some((local, sent)) = self.prepare_run(steps) else {
            return vgpu_backend::run_queued_in_order(self, steps, stop);
        };
        let remote = if sent.is_empty() {
            Ok(Vec::new())
        } else {
            self.call_queued(sent)
        };
        merge_run(local, remote, steps.len())
    }

    fn queue_depth(&self) -> usize {
        self.config.queue_depth.clamp(1, proto::MAX_STARTED)
    }

    fn lanes(&self) -> usize {
        self.config
            .lanes
            .clamp(1, proto::MAX_STARTED / self.queue_depth())
    }

    /// The host maps the copies' memory itself: `held` does not matter.
    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        _held: bool,
    ) -> Started {
        let Some((local, sent)) = self.prepare_run(steps) else {
            return Started::Done(vgpu_backend::run_queued_in_order(self, steps, stop));
        };
        if sent.is_empty() {
            return Started::Done(merge_run(local, Ok(Vec::new()), steps.len()));
        }
        let run = StartedRun {
            lane: lane.min(proto::MAX_LANES as usize - 1) as u32,
            sent: sent.len(),
            count: steps.len(),
            local,
            at: Instant::now(),
            finished: None,
        };
        // The host maps the copies' pieces itself: once it has the run,
        // the caller's hold on guest memory may go (an unmap waits for
        // the host's, which lasts until the run is over).
        let request = Request::Start {
            lane: run.lane,
            steps: sent,
        };
        match self.call(&request, Xfer::None) {
            Ok(Value::Started(done)) => {
                if !self.started.is_empty() {
                    self.counts.count_overlapped();
                }
                self.started.push_back(run);
                // Runs the host finished meanwhile: their results wait
                // here for `finish_queued`.
                for f in done {
                    if let Err(why) = self.take_finished(f) {
                        self.fail(why);
                        break;
                    }
                }
                Started::InFlight
            }
            Ok(v) => {
                let e = self.fail(format!("unexpected answer to a start: {v:?}"));
                Started::Done(merge_run(run.local, Err(e), run.count))
            }
            Err(e) => Started::Done(merge_run(run.local, Err(e), run.count)),
        }
    }

    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        match self.finish_within(0) {
            Finishing::Done(lane, f) => Some((lane, f)),
            Finishing::Pending | Finishing::Idle => None,
        }
    }

    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        let us = within.as_micros().clamp(1, u128::from(u32::MAX)) as u32;
        self.finish_within(us)
    }

    fn console(&mut self, module: u64, max: usize) -> Result<ConsoleText, OpError> {
        // A reply carries a bounded piece: ask until the host has no more
        // or `max` is reached.
        let mut out = ConsoleText::default();
        while out.text.len() < max {
            let want = (max - out.text.len()).min(proto::MAX_CONSOLE);
            let piece = match self.call(
                &Request::Console {
                    module,
                    max: want as u32,
                },
                Xfer::None,
            )? {
                Value::Console(c) if c.text.len() <= want => c,
                v => return Err(self.fail(format!("unexpected result {v:?}"))),
            };
            out.dropped = out.dropped.saturating_add(piece.dropped);
            let last = piece.text.len() < want;
            out.text.extend_from_slice(&piece.text);
            if last {
                break;
            }
        }
        Ok(out)
    }

    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        let shape = Launch {
            params: &[],
            ..launch.clone()
        };
        check_launch(&shape)?;
        match self.call(&Request::Occupancy(shape), Xfer::None)? {
            Value::U64(n) => u32::try_from(n)
                .map_err(|_| self.fail(format!("{n} active clusters is not a count"))),
            v => Err(self.fail(format!("unexpected result {v:?}"))),
        }
    }

    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        if entry.len() > proto::MAX_ENTRY {
            return Err(OpError::Invalid(format!(
                "entry name of {} bytes is too long",
                entry.len()
            )));
        }
        match self.call(&Request::FunctionInfo { module, entry }, Xfer::None)? {
            Value::Function(f) => Ok(f),
            v => Err(self.fail(format!("unexpected result {v:?}"))),
        }
    }

    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        if name.len() > proto::MAX_ENTRY {
            return Err(OpError::Invalid(format!(
                "global name of {} bytes is too long",
                name.len()
            )));
        }
        match self.call(&Request::GlobalInfo { module, name }, Xfer::None)? {
            Value::Global(addr, size) => Ok((addr, size)),
            v => Err(self.fail(format!("unexpected result {v:?}"))),
        }
    }

    fn memory_used(&self) -> u64 {
        self.memory_used
    }

    fn suspend(&mut self) -> Result<u64, OpError> {
        if self.suspended {
            return Ok(self.memory_used);
        }
        let n = self.call_u64(&Request::Suspend)?;
        self.draw(self.spec.memory, 0)?;
        self.suspended = true;
        Ok(n)
    }

    /// The quota is taken here first: the host's backend has the whole
    /// GPU, this pool what the daemon has not given out.
    fn resume(&mut self) -> Result<u64, OpError> {
        if !self.suspended {
            return Ok(self.memory_used);
        }
        self.draw(0, self.spec.memory)?;
        let r = self.call_u64(&Request::Resume);
        match r {
            Ok(_) => self.suspended = false,
            Err(_) => self.draw(self.spec.memory, 0)?,
        }
        r
    }

    /// Drawn from the backend's pool here, the host's partition held to
    /// it there (a host started later gets it with its spec).
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        let old = self.spec.memory;
        // A suspended partition holds none of the pool: resume takes the
        // new quota.
        let suspended = self.suspended;
        let held = |m: u64| if suspended { 0 } else { m };
        self.draw(held(old), held(memory))?;
        let r = if self.link.is_some() && self.failed.is_none() {
            self.call_none(&Request::SetMemory { memory })
        } else {
            // No host now: the next one is made with the new spec.
            Ok(())
        };
        match r {
            Ok(()) => self.spec.memory = memory,
            Err(_) => self.draw(held(memory), held(old))?,
        }
        r
    }

    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        Some(Arc::clone(&self.registry) as Arc<dyn HostMemory>)
    }

    /// Resets in place when the host is healthy; otherwise (it failed, or
    /// its backend cannot recover in its process) replaces it with a fresh
    /// host.
    fn is_lost(&self) -> bool {
        self.lost
            || self.failed.is_some()
            || (self.config.shared && self.link.as_ref().is_some_and(Link::closed))
    }

    /// A shared host ends when any of its partitions loses the process's
    /// device state: a function idle then hears of it within this long.
    fn watch_interval(&self) -> Option<Duration> {
        self.config.shared.then_some(SHARED_WATCH)
    }

    fn reset(&mut self) {
        self.lost = false;
        // The host forgets what it had started.
        self.started.clear();
        if self.failed.is_none() {
            if let Some(link) = self.link.as_mut() {
                let r = link.exchange(
                    &Request::Reset,
                    None,
                    self.config.reset_timeout,
                    Xfer::None,
                    None,
                    self.spec.memory,
                );
                let why = match r {
                    Ok(Reply {
                        result: Ok(Value::Reset { respawn: false }),
                        memory_used: 0,
                    }) => {
                        self.memory_used = 0;
                        return;
                    }
                    Ok(Reply {
                        result: Ok(Value::Reset { respawn: true }),
                        ..
                    }) => "its backend cannot recover in its process".to_string(),
                    Ok(other) => format!("unexpected answer to reset: {other:?}"),
                    Err(why) => why,
                };
                warn_limited!(
                    "partition {:?}: replacing partition host {}: {why}",
                    self.spec.name,
                    link.pid().map_or("?".into(), |p| p.to_string())
                );
            }
        }
        self.end_link();
        self.memory_used = 0;
        match self.start() {
            Ok(link) => {
                self.link = Some(link);
                self.failed = None;
                // A fresh host's partition is on the device: a suspended
                // one's must not be.
                if self.suspended {
                    if let Err(e) = self.call_u64(&Request::Suspend) {
                        let _ = self.fail(format!("cannot suspend the new host: {e}"));
                    }
                }
            }
            Err(why) => {
                error_limited!(
                    "partition {:?}: cannot restart its partition host: {why}",
                    self.spec.name
                );
                self.failed = Some(format!("restart failed: {why}"));
            }
        }
    }
}

impl Drop for RemotePartition {
    fn drop(&mut self) {
        // Link's drop closes the socket and reaps the host; the memory
        // socket goes after it (see `end_link`).
        self.link.take();
        self.registry.detach();
        if let Some(pool) = &self.pool {
            let held = PartitionSpec {
                memory: if self.suspended { 0 } else { self.spec.memory },
                ..self.spec.clone()
            };
            lock(pool).release(&held);
        }
    }
}
