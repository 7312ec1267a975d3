//! The partition host's side: serves one partition of an inner backend to
//! the parent over the socket until the parent closes it.

use std::cell::{Cell, RefCell};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use log::{debug, info, log_enabled, trace, Level};
use vgpu_backend::{
    Backend, HostSink, HostSource, OpError, Partition, PartitionSpec, QueuedDone, SliceMemory,
};

use crate::guest_mem::{self, Table};
use crate::mailbox::{Conn, Mailbox, Side};
use crate::proto::{self, Kind, Piece, Reply, Request, Value, MAX_REQUEST, REPLY};
use crate::queued::with_queued;
use crate::runner::{lock, Runner, Shared};
use crate::shm::Staging;
use crate::wire::{self, WireError};

/// How long the answer to a start waits for the started runs to finish:
/// a short run (a launch and a synchronisation) is then answered in the
/// one exchange, a long one goes on in flight.
const START_LINGER: Duration = Duration::from_micros(50);

/// Why the host stopped serving (other than the parent closing the socket).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The socket failed or the parent broke the protocol.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// A frame that is valid but not allowed here.
    #[error("unexpected request: {0}")]
    Unexpected(&'static str),
    /// The backend lost the device state of every partition of this
    /// process (see [`serve_until_lost`]).
    #[error("the device state of this process is lost")]
    Lost,
}

/// The link back to the parent during a transfer's callbacks. At most
/// one callback is outstanding at a time.
struct Chan<'a> {
    conn: &'a mut Conn,
    seq: u32,
    buf: Vec<u8>,
    broken: Option<WireError>,
}

impl<'a> Chan<'a> {
    fn new(conn: &'a mut Conn, seq: u32) -> Chan<'a> {
        Chan {
            conn,
            seq,
            buf: Vec::new(),
            broken: None,
        }
    }

    fn fail(&mut self, e: WireError) -> OpError {
        let msg = format!("link to the parent failed: {e}");
        self.broken = Some(e);
        OpError::Device(msg)
    }

    /// Sends a callback without waiting for its answer.
    fn send(&mut self, kind: Kind, piece: Piece) -> Result<(), OpError> {
        self.conn
            .send(kind as u16, self.seq, &piece.encode())
            .map_err(|e| self.fail(e))
    }

    /// Waits for the parent's answer to the callback sent last: `Ok(None)`
    /// done, `Ok(Some(off))` the guest memory faulted at `off`.
    fn answer(&mut self, kind: Kind) -> Result<Option<u64>, OpError> {
        let r = (|| {
            let h = self.conn.recv(16, &mut self.buf)?;
            if h.kind != REPLY | kind as u16 {
                return Err(proto::ProtoError::Kind(h.kind).into());
            }
            if h.seq != self.seq {
                return Err(proto::ProtoError::Sequence {
                    got: h.seq,
                    expected: self.seq,
                }
                .into());
            }
            Ok(proto::decode_answer(&self.buf)?)
        })();
        r.map_err(|e: WireError| self.fail(e))
    }
}

/// Upload source: the staging area's two halves, refilled by the parent
/// on demand; while the backend copies from one half the parent fills the
/// other with the next piece.
struct Source<'a> {
    len: u64,
    staging: &'a Staging,
    /// The piece the backend reads from now.
    window: Cell<Piece>,
    /// The next piece, asked for and not yet answered.
    ahead: Cell<Option<Piece>>,
    chan: RefCell<Chan<'a>>,
}

impl Source<'_> {
    fn half(&self) -> u64 {
        (self.staging.len() / 2) as u64
    }

    /// The piece at `offset` in the half that `w` does not use.
    fn after(&self, offset: u64, w: Piece) -> Piece {
        Piece {
            offset,
            len: (self.len - offset).min(self.half()),
            at: if w.at == 0 { self.half() } else { 0 },
        }
    }

    /// Asks for the piece after the window, unless asked already.
    fn read_ahead(&self) -> Result<(), OpError> {
        let w = self.window.get();
        if self.ahead.get().is_none() && w.end() < self.len {
            let next = self.after(w.end(), w);
            self.chan.borrow_mut().send(Kind::Need, next)?;
            self.ahead.set(Some(next));
        }
        Ok(())
    }

    /// Collects an outstanding answer, so that the stream is in step
    /// before the reply.
    fn finish(&self) {
        if self.ahead.take().is_some() {
            let _ = self.chan.borrow_mut().answer(Kind::Need);
        }
    }
}

impl HostSource for Source<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(OpError::Fault(offset));
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let w = self.window.get();
            if pos >= w.offset && pos < w.end() {
                self.read_ahead()?;
                let n = ((w.end() - pos) as usize).min(buf.len() - done);
                let s = (w.at + pos - w.offset) as usize;
                buf[done..done + n].copy_from_slice(&self.staging.bytes(s + n)[s..s + n]);
                done += n;
                continue;
            }
            let next = match self.ahead.take() {
                Some(a) => {
                    let fault = self.chan.borrow_mut().answer(Kind::Need)?;
                    if a.offset == pos {
                        if let Some(f) = fault {
                            return Err(OpError::Fault(f));
                        }
                        self.window.set(a);
                        continue;
                    }
                    // Read out of order: that piece is of no use.
                    self.after(pos, a)
                }
                None => self.after(pos, w),
            };
            let mut chan = self.chan.borrow_mut();
            chan.send(Kind::Need, next)?;
            if let Some(f) = chan.answer(Kind::Need)? {
                return Err(OpError::Fault(f));
            }
            self.window.set(next);
        }
        Ok(())
    }
}

/// Download sink: pieces go through the staging area's two halves; the
/// parent writes one to guest memory while the backend fills the other.
/// The last piece is left there for the reply to name.
struct Sink<'a> {
    len: u64,
    staging: RefCell<&'a mut Staging>,
    /// Copied into the staging area, not yet handed over.
    staged: Cell<Option<Piece>>,
    /// Handed over, its answer not yet read.
    sent: Cell<Option<Piece>>,
    chan: RefCell<Chan<'a>>,
}

impl Sink<'_> {
    /// Reads the answer for the piece handed over last.
    fn settle(&self) -> Result<(), OpError> {
        if self.sent.take().is_some() {
            if let Some(f) = self.chan.borrow_mut().answer(Kind::Out)? {
                return Err(OpError::Fault(f));
            }
        }
        Ok(())
    }
}

impl HostSink for Sink<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(OpError::Fault(offset));
        }
        let mut staging = self.staging.borrow_mut();
        let half = staging.len() / 2;
        for (i, piece) in buf.chunks(half).enumerate() {
            if let Some(s) = self.staged.take() {
                // One piece in flight: the one before must be written out.
                self.settle()?;
                self.chan.borrow_mut().send(Kind::Out, s)?;
                self.sent.set(Some(s));
            }
            let at = match self.sent.get() {
                Some(s) if s.at == 0 => half,
                _ => 0,
            };
            staging.bytes_mut(at + piece.len())[at..].copy_from_slice(piece);
            self.staged.set(Some(Piece {
                offset: offset + (i * half) as u64,
                len: piece.len() as u64,
                at: at as u64,
            }));
        }
        Ok(())
    }
}

/// The host's state.
struct Host<'a> {
    backend: &'a dyn Backend,
    partition: Option<Shared>,
    /// Runs started runs (created with the partition).
    runner: Option<Runner>,
    /// How long the host polls for a message before it sleeps.
    spin: Duration,
    /// The partition's memory in use after the last request that could
    /// change it: what a reply says while a run holds the partition.
    memory_used: u64,
    staging: Option<Staging>,
    /// Guest memory forwarded by the daemon (see `guest_mem.rs`).
    guest: Arc<Table>,
    /// The memory control socket, until the partition exists and its
    /// thread starts.
    control: Option<UnixStream>,
}

fn no_partition() -> OpError {
    OpError::Invalid("no partition created yet".into())
}

/// Serves requests on `stream` with a partition of `backend` until the
/// parent closes the socket (`Ok`) or breaks the protocol. `healthy` tells
/// whether the backend can still serve after a reset in this process (a
/// CUDA backend cannot once a kernel faulted). Before each read the host
/// polls for up to `spin` (see [`vgpu_backend_remote::RemoteConfig::spin`]).
pub fn serve(
    stream: UnixStream,
    backend: &dyn Backend,
    healthy: &dyn Fn() -> bool,
    spin: Duration,
) -> Result<(), HostError> {
    serve_inner(stream, backend, healthy, spin, false)
}

/// As [`serve`], for one of the partitions of a shared host: once
/// `healthy` says the process's device state is lost (after the reply
/// that tells it), returns [`HostError::Lost`], so that the host can end
/// and every partition of it learns at once.
pub fn serve_until_lost(
    stream: UnixStream,
    backend: &dyn Backend,
    healthy: &dyn Fn() -> bool,
    spin: Duration,
) -> Result<(), HostError> {
    serve_inner(stream, backend, healthy, spin, true)
}

fn serve_inner(
    stream: UnixStream,
    backend: &dyn Backend,
    healthy: &dyn Fn() -> bool,
    spin: Duration,
    until_lost: bool,
) -> Result<(), HostError> {
    let mut host = Host {
        backend,
        partition: None,
        runner: None,
        spin,
        memory_used: 0,
        staging: None,
        guest: Arc::new(Table::default()),
        control: None,
    };
    let mut buf = Vec::new();
    let mut next_mailbox = None;
    let mut conn = Conn {
        stream,
        mailbox: None,
        spin,
    };
    loop {
        let got = if conn.mailbox.is_some() {
            conn.recv(MAX_REQUEST, &mut buf).map(|h| (h, None))
        } else {
            wire::spin(&conn.stream, spin);
            wire::recv(&mut conn.stream, MAX_REQUEST, &mut buf, true)
        };
        let (h, fd) = match got {
            Ok(x) => x,
            Err(WireError::Closed) => {
                debug!("partition host: the parent closed the connection");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let req = Request::decode(h.kind, &buf).map_err(WireError::from)?;
        let kind = req.kind();
        let mut broken = None;
        if !matches!(kind, Kind::Start | Kind::Finish | Kind::SetMemory) {
            // Everything else sees the partition after the runs started
            // before it (a quota is only a figure: it need not wait).
            if let Some(r) = host.runner.as_mut() {
                r.settle();
            }
        }
        let result = match req {
            Request::Hello => Ok(Value::Hello {
                name: backend.name().to_string(),
                capacity: backend.capacity(),
            }),
            Request::Create(c) => {
                let Some(file) = fd else {
                    return Err(HostError::Unexpected("create without a staging area"));
                };
                let r = host.create(&c, file);
                if let (Ok(_), true, Some(st)) = (&r, c.mailbox, host.staging.as_ref()) {
                    // Set up before the reply (so no frame can come first),
                    // used after it (the reply itself goes on the socket).
                    // SAFETY: the control area of the staging mapping, which
                    // `host` keeps until this function returns, after `conn`
                    // (declared later) is gone.
                    next_mailbox = Some(unsafe { Mailbox::new(st.control(), Side::Host, spin) });
                }
                r
            }
            Request::Control => {
                let Some(file) = fd else {
                    return Err(HostError::Unexpected("control without a socket"));
                };
                host.control(file)
            }
            _ if fd.is_some() => return Err(HostError::Unexpected("an fd with this request")),
            Request::Map(_) | Request::Unmap { .. } => {
                return Err(HostError::Unexpected(
                    "a memory notice on the command socket",
                ))
            }
            Request::UploadMapped { dst, pieces } => host.mapped(dst, &pieces, false),
            Request::Queued(steps) => host
                .shared()
                .and_then(|p| run_steps(&mut **lock(&p), &host.guest, &steps))
                .map(Value::Queued),
            // The runner decodes its own copy of the frame.
            Request::Start { .. } => match host.runner.as_mut() {
                Some(r) => r.start(buf.clone()).map(|()| {
                    let (done, used) = r.take_done(START_LINGER);
                    if let Some(used) = used {
                        host.memory_used = used;
                    }
                    Value::Started(done)
                }),
                None => Err(no_partition()),
            },
            Request::Finish { within_us } => match host.runner.as_mut() {
                Some(r) => {
                    let within = (within_us > 0).then(|| Duration::from_micros(within_us.into()));
                    r.finish(within).map(|done| match done {
                        Some((f, used)) => {
                            host.memory_used = used;
                            Value::Finished(f)
                        }
                        None => Value::None,
                    })
                }
                None => Err(no_partition()),
            },
            Request::DownloadMapped { src, pieces } => host.mapped(src, &pieces, true),
            Request::Reset => match host.partition.as_ref() {
                Some(p) => {
                    if let Some(r) = host.runner.as_mut() {
                        r.clear();
                    }
                    lock(p).reset();
                    Ok(Value::Reset {
                        respawn: !healthy(),
                    })
                }
                None => Err(no_partition()),
            },
            Request::Upload {
                dst,
                len,
                prefilled,
            } => host.upload(
                Chan::new(&mut conn, h.seq),
                dst,
                len,
                prefilled,
                &mut broken,
            ),
            Request::Download { src, len } => {
                host.download(Chan::new(&mut conn, h.seq), src, len, &mut broken)
            }
            other => host.simple(other),
        };
        if let Some(e) = broken {
            return Err(e.into());
        }
        if !matches!(kind, Kind::Start | Kind::Finish) {
            // (A started run may hold the partition: the runner says
            // what it left.)
            host.memory_used = host.partition.as_ref().map_or(0, |p| lock(p).memory_used());
        }
        let reply = Reply {
            memory_used: host.memory_used,
            result,
        };
        conn.send(REPLY | kind as u16, h.seq, &reply.encode(kind))?;
        if until_lost && !healthy() {
            return Err(HostError::Lost);
        }
        if next_mailbox.is_some() {
            conn.mailbox = next_mailbox.take();
        }
    }
}

impl Host<'_> {
    /// Keeps the memory control socket the daemon sent, for the thread
    /// that [`Host::create`] starts.
    fn control(&mut self, file: std::fs::File) -> Result<Value, OpError> {
        if self.partition.is_some() || self.control.is_some() {
            return Err(OpError::Invalid(
                "the memory socket comes once, before the partition".into(),
            ));
        }
        self.control = Some(UnixStream::from(std::os::fd::OwnedFd::from(file)));
        Ok(Value::None)
    }

    /// Serves the memory control socket, if there is one, for partition `p`.
    fn start_control(&mut self, p: &dyn Partition) -> Result<(), OpError> {
        let Some(stream) = self.control.take() else {
            return Ok(());
        };
        let (table, inner) = (Arc::clone(&self.guest), p.host_memory());
        std::thread::Builder::new()
            .name("vgpu-host-memory".into())
            .spawn(move || {
                if let Err(e) = guest_mem::serve_control(stream, table, inner) {
                    vgpu_sys::error_limited!(
                        "partition host {}: memory socket: {e}",
                        std::process::id()
                    );
                }
            })
            .map_err(|e| OpError::Device(format!("memory thread: {e}")))?;
        Ok(())
    }

    /// An upload (`write` false) or download between device memory at
    /// `dev` and pieces of forwarded guest memory, all checked first; the
    /// mappings stay in place until the inner backend returns.
    fn mapped(
        &mut self,
        dev: u64,
        pieces: &[proto::MappedPiece],
        write: bool,
    ) -> Result<Value, OpError> {
        let p = self.shared()?;
        let mut p = lock(&p);
        let (guard, slices, _) = self.guest.resolve(pieces, write)?;
        // SAFETY: the slices were resolved under `guard`, which keeps
        // their mappings (writable ones for a download) until it is
        // dropped below, after the transfer.
        let s = unsafe { SliceMemory::new(&slices) };
        let r = if write {
            p.download(dev, &s)
        } else {
            p.upload(dev, &s)
        };
        drop(guard);
        r.map(|_| Value::None)
    }

    fn create(&mut self, c: &proto::Create<'_>, file: std::fs::File) -> Result<Value, OpError> {
        if self.partition.is_some() {
            return Err(OpError::Invalid("a partition exists already".into()));
        }
        if c.staging_len < 2 {
            return Err(OpError::Invalid("a staging area of two halves".into()));
        }
        let staging = Staging::open(file, c.staging_len)
            .map_err(|e| OpError::Device(format!("staging area: {e}")))?;
        let spec = PartitionSpec {
            name: c.name.to_string(),
            memory: c.memory,
            compute_units: c.compute_units,
        };
        let p = self
            .backend
            .create_partition(&spec)
            .map_err(|e| OpError::Device(e.to_string()))?;
        self.start_control(&*p)?;
        info!(
            "partition host {}: partition {:?} ({} bytes, {} compute units) on the {} backend",
            std::process::id(),
            c.name,
            c.memory,
            c.compute_units,
            self.backend.name()
        );
        let (units, cooperative, vmm, arrays) = (
            p.kernel_compute_units(),
            p.cooperative(),
            p.has_vmm(),
            p.arrays(),
        );
        let p: Shared = Arc::new(Mutex::new(p));
        self.runner = Some(
            Runner::new(Arc::clone(&p), Arc::clone(&self.guest), self.spin)
                .map_err(|e| OpError::Device(format!("runner thread: {e}")))?,
        );
        self.partition = Some(p);
        self.staging = Some(staging);
        Ok(Value::Created {
            units,
            cooperative,
            vmm,
            arrays,
        })
    }

    /// The partition, once created.
    fn shared(&self) -> Result<Shared, OpError> {
        self.partition.clone().ok_or_else(no_partition)
    }

    fn simple(&mut self, req: Request<'_>) -> Result<Value, OpError> {
        let p = self.shared()?;
        let mut p = lock(&p);
        match req {
            Request::Alloc { size, align } => p.alloc(size, align).map(Value::U64),
            Request::Free { addr } => p.free(addr).map(|_| Value::None),
            Request::SetMemory { memory } => p.set_memory(memory).map(|_| Value::None),
            Request::Suspend => p.suspend().map(Value::U64),
            Request::Resume => p.resume().map(Value::U64),
            Request::Vmm(op) => p.vmm(&op).map(Value::U64),
            Request::Copy { dst, src, size } => p.copy(dst, src, size).map(|_| Value::None),
            Request::Fill {
                addr,
                size,
                pattern,
            } => p.fill(addr, size, pattern).map(|_| Value::None),
            Request::ModuleLoad { format, image } => p.module_load(format, image).map(Value::U64),
            Request::ModuleUnload { module } => p.module_unload(module).map(|_| Value::None),
            Request::Console { module, max } => p.console(module, max as usize).map(Value::Console),
            Request::FunctionInfo { module, entry } => {
                p.function_info(module, entry).map(Value::Function)
            }
            Request::GlobalInfo { module, name } => p
                .global_info(module, name)
                .map(|(addr, size)| Value::Global(addr, size)),
            Request::Launch(l) => p.launch(&l).map(|_| Value::None),
            Request::Occupancy(l) => p.max_active_clusters(&l).map(|n| Value::U64(n.into())),
            Request::Resource(bytes) => vgpu_backend::arrays::Resource::from_bytes(&bytes)
                .and_then(|r| p.resource(&r))
                .map(Value::U64),
            _ => Err(OpError::Invalid("not a plain request".into())),
        }
    }

    /// The partition and the staging area a staged transfer goes through.
    fn staged_parts(&mut self) -> Result<(Shared, &mut Staging), OpError> {
        match (self.partition.clone(), self.staging.as_mut()) {
            (Some(p), Some(staging)) => Ok((p, staging)),
            _ => Err(no_partition()),
        }
    }

    fn upload(
        &mut self,
        chan: Chan<'_>,
        dst: u64,
        len: u64,
        prefilled: u64,
        broken: &mut Option<WireError>,
    ) -> Result<Value, OpError> {
        let (p, staging) = self.staged_parts()?;
        let mut p = lock(&p);
        let half = (staging.len() / 2) as u64;
        if prefilled > len || prefilled > half {
            return Err(OpError::Invalid(format!(
                "{prefilled} bytes staged for an upload of {len}"
            )));
        }
        let src = Source {
            len,
            staging,
            window: Cell::new(Piece {
                offset: 0,
                len: prefilled,
                at: 0,
            }),
            ahead: Cell::new(None),
            chan: RefCell::new(chan),
        };
        let r = p.upload(dst, &src).map(|_| Value::None);
        src.finish();
        *broken = src.chan.into_inner().broken;
        r
    }

    fn download(
        &mut self,
        chan: Chan<'_>,
        src: u64,
        len: u64,
        broken: &mut Option<WireError>,
    ) -> Result<Value, OpError> {
        let (p, staging) = self.staged_parts()?;
        let mut p = lock(&p);
        let sink = Sink {
            len,
            staging: RefCell::new(staging),
            staged: Cell::new(None),
            sent: Cell::new(None),
            chan: RefCell::new(chan),
        };
        let r = p.download(src, &sink);
        // The answer for the piece in flight comes before the reply.
        let settled = sink.settle();
        let last = sink.staged.get().unwrap_or(Piece {
            offset: 0,
            len: 0,
            at: 0,
        });
        *broken = sink.chan.into_inner().broken;
        r.and(settled).map(|_| Value::Download {
            offset: last.offset,
            len: last.len,
            at: last.at,
        })
    }
}

/// Runs a queued run of `p`. Its copies move guest memory one way, so
/// that one read lock of the table keeps all their pieces mapped until the
/// run is over.
pub(crate) fn run_steps(
    p: &mut dyn Partition,
    guest: &Table,
    steps: &[proto::Step<'_>],
) -> Result<Vec<QueuedDone>, OpError> {
    let began = log_enabled!(Level::Trace).then(std::time::Instant::now);
    let pinned = guest.pin();
    // The parent abandons a run by not waiting for it: it runs whole.
    let done = with_queued(&pinned, steps, |queued| p.run_queued(queued, &|| false))?;
    drop(pinned);
    if let Some(began) = began {
        trace!(
            "queued run of {} steps done after {} us",
            steps.len(),
            began.elapsed().as_micros()
        );
    }
    Ok(done)
}

/// Answers the parent's first request with `why` (the backend could not
/// be opened), so the daemon can say what is wrong, and returns.
pub fn refuse(mut stream: UnixStream, why: &str) -> Result<(), HostError> {
    let mut buf = Vec::new();
    let (h, _) = match wire::recv(&mut stream, MAX_REQUEST, &mut buf, true) {
        Ok(x) => x,
        Err(WireError::Closed) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let kind = Kind::from_raw(h.kind).ok_or(HostError::Unexpected("unknown request"))?;
    let reply = Reply {
        memory_used: 0,
        result: Err(OpError::Device(why.to_string())),
    };
    wire::send_reply(&stream, kind, h.seq, &reply)?;
    Ok(())
}
