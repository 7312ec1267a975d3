//! One client connection: framing of messages on the UNIX socket (with fds
//! in SCM_RIGHTS), replies, and server-to-client DMA_READ / DMA_WRITE
//! requests interleaved with the client's own requests.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, TryLockError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use vgpu_sys::scm::{self, SCM_MAX_FD};
use vgpu_sys::{lock, poll, warn_limited};

use crate::dma::{ClientDma, DmaError};
use crate::proto::{
    Command, Header, Reader, Writer, FLAG_ERROR, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY, HEADER_SIZE,
    MAX_MESSAGE_SIZE,
};

/// How long a peer may take to finish a message it started, to take a
/// message we send, or to answer a DMA request.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a device thread waits for the event loop to route its DMA
/// reply before checking whether it should read the socket itself.
const REPLY_POLL: Duration = Duration::from_millis(2);

/// A complete message with the fds it carried.
pub struct Message {
    /// Its header.
    pub header: Header,
    /// Everything after the header.
    pub payload: Vec<u8>,
    /// fds received with it; closed when dropped.
    pub fds: Vec<File>,
    /// The sender attached more fds than the kernel could pass.
    pub fds_truncated: bool,
}

/// Why reading a message failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Orderly close between messages.
    #[error("peer closed the connection")]
    Closed,
    /// Socket error or close in the middle of a message.
    #[error("socket error")]
    Io(#[source] io::Error),
    /// The header's size cannot be trusted, so the stream cannot be
    /// resynchronised.
    #[error("message size {0} outside {HEADER_SIZE}..={MAX_MESSAGE_SIZE}")]
    Size(u32, Header),
}

/// The shared half of a connection: used by the event loop and, for DMA to
/// memory the client did not share by fd, by device threads.
pub struct ClientLink {
    stream: UnixStream,
    write_lock: Mutex<()>,
    /// Serialises reads; holds client requests read while waiting for a
    /// DMA reply on the event-loop thread, to be handled in order later.
    deferred: Mutex<VecDeque<Message>>,
    waiters: Mutex<HashMap<u16, mpsc::SyncSender<Message>>>,
    next_id: AtomicU16,
    loop_thread: ThreadId,
    max_transfer: AtomicUsize,
    alive: AtomicBool,
    /// The event loop is handling events rather than waiting for the
    /// socket, so it may be blocked in a device call that waits for a
    /// device thread; that thread then reads its DMA reply itself. Changed
    /// only with `deferred` held, so a reader that checks it under the lock
    /// never strands a request the event loop will not look at.
    loop_busy: AtomicBool,
    /// A payload buffer handed back after its message was handled, reused
    /// for the next one so that a steady stream of small requests (INTx
    /// unmasks after every trapped access) does not allocate.
    spare: Mutex<Vec<u8>>,
}

/// Largest payload buffer kept for reuse.
const SPARE_CAPACITY: usize = 64 << 10;

/// Largest message [`ClientLink::send`] frames on the stack.
const SMALL_MESSAGE: usize = 128;

impl ClientLink {
    /// Wraps an accepted stream; `loop_thread` is the thread that runs the
    /// endpoint's event loop.
    pub fn new(stream: UnixStream, loop_thread: ThreadId) -> io::Result<Self> {
        stream.set_read_timeout(Some(PEER_TIMEOUT))?;
        stream.set_write_timeout(Some(PEER_TIMEOUT))?;
        Ok(ClientLink {
            stream,
            write_lock: Mutex::new(()),
            deferred: Mutex::new(VecDeque::new()),
            waiters: Mutex::new(HashMap::new()),
            next_id: AtomicU16::new(0),
            loop_thread,
            max_transfer: AtomicUsize::new(crate::proto::MAX_DATA_XFER_SIZE as usize),
            alive: AtomicBool::new(true),
            loop_busy: AtomicBool::new(false),
            spare: Mutex::new(Vec::new()),
        })
    }

    /// The socket, for registration with the event loop.
    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Sets the largest DMA transfer the client accepts.
    pub fn set_max_transfer(&self, bytes: usize) {
        self.max_transfer.store(bytes, Ordering::Relaxed);
    }

    /// Marks the link dead and wakes every thread waiting for a reply.
    pub fn shutdown(&self) {
        self.alive.store(false, Ordering::Release);
        lock(&self.waiters).clear();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// The event loop starts handling an event: until
    /// [`ClientLink::next_deferred_or_idle`] finds nothing left, device
    /// threads waiting for DMA replies may read the socket themselves.
    pub fn loop_busy(&self) {
        let _guard = lock(&self.deferred);
        self.loop_busy.store(true, Ordering::Release);
    }

    /// Takes the next request read ahead while the event loop was busy; when
    /// there is none, marks the loop idle in the same critical section.
    pub fn next_deferred_or_idle(&self) -> Option<Message> {
        let mut deferred = lock(&self.deferred);
        let next = deferred.pop_front();
        if next.is_none() {
            self.loop_busy.store(false, Ordering::Release);
        }
        next
    }

    /// The next message for the event loop: one read ahead by a DMA wait
    /// first (they came earlier), else one from the socket, else `None`
    /// when a device thread already consumed what woke the loop.
    pub fn read_message(&self) -> Result<Option<Message>, ReadError> {
        let mut deferred = lock(&self.deferred);
        if let Some(m) = deferred.pop_front() {
            return Ok(Some(m));
        }
        self.read_locked_nowait()
    }

    fn read_locked(&self) -> Result<Message, ReadError> {
        self.read_locked_from(0)?
            .ok_or(ReadError::Io(io::ErrorKind::WouldBlock.into()))
    }

    /// Like `read_locked`, but `None` when no message has started arriving.
    fn read_locked_nowait(&self) -> Result<Option<Message>, ReadError> {
        self.read_locked_from(libc::MSG_DONTWAIT)
    }

    fn read_locked_from(&self, flags: libc::c_int) -> Result<Option<Message>, ReadError> {
        let mut hdr = [0u8; HEADER_SIZE];
        // Room for every fd the kernel passes in one message, so excess
        // fds are always seen, counted and closed.
        let got = match scm::recv_with_fds(&self.stream, &mut hdr, SCM_MAX_FD, flags) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && flags != 0 => return Ok(None),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let n = got.len;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        if n < HEADER_SIZE {
            (&self.stream)
                .read_exact(&mut hdr[n..])
                .map_err(ReadError::Io)?;
        }
        let header = Header::decode(&hdr);
        if (header.msg_size as usize) < HEADER_SIZE || header.msg_size > MAX_MESSAGE_SIZE {
            return Err(ReadError::Size(header.msg_size, header));
        }
        let mut payload = std::mem::take(&mut *lock(&self.spare));
        payload.clear();
        payload.resize(header.msg_size as usize - HEADER_SIZE, 0);
        (&self.stream)
            .read_exact(&mut payload)
            .map_err(ReadError::Io)?;
        Ok(Some(Message {
            header,
            payload,
            fds_truncated: got.fds_truncated(),
            fds: got.fds.into_iter().map(File::from).collect(),
        }))
    }

    /// Gives back the payload of a handled message for reuse.
    pub fn recycle(&self, buf: Vec<u8>) {
        if buf.capacity() <= SPARE_CAPACITY {
            let mut spare = lock(&self.spare);
            if spare.capacity() < buf.capacity() {
                *spare = buf;
            }
        }
    }

    /// Sends a message: header fields are completed from `payload`.
    pub fn send(&self, mut header: Header, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let size = HEADER_SIZE + payload.len();
        header.msg_size =
            u32::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Replies are mostly small: frame those on the stack.
        let mut small = [0u8; SMALL_MESSAGE];
        let mut large = Vec::new();
        let buf: &[u8] = if size <= SMALL_MESSAGE {
            small[..HEADER_SIZE].copy_from_slice(&header.encode());
            small[HEADER_SIZE..size].copy_from_slice(payload);
            &small[..size]
        } else {
            large.reserve_exact(size);
            large.extend_from_slice(&header.encode());
            large.extend_from_slice(payload);
            &large
        };
        let _guard = lock(&self.write_lock);
        let mut sent = 0;
        if !fds.is_empty() {
            sent = scm::send_with_fds(&self.stream, &[IoSlice::new(buf)], fds)?;
        }
        (&self.stream).write_all(&buf[sent..])
    }

    /// Replies to `req` with a payload.
    pub fn reply(&self, req: &Header, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let header = Header {
            msg_id: req.msg_id,
            command: req.command,
            msg_size: 0,
            flags: FLAG_TYPE_REPLY,
            error: 0,
        };
        self.send(header, payload, fds)
    }

    /// Replies to `req` with an error.
    pub fn reply_error(&self, req: &Header, errno: u32) -> io::Result<()> {
        let header = Header {
            msg_id: req.msg_id,
            command: req.command,
            msg_size: 0,
            flags: FLAG_TYPE_REPLY | FLAG_ERROR,
            error: errno,
        };
        self.send(header, &[], &[])
    }

    /// Hands a reply to the device thread waiting for it. Returns false for
    /// a reply nobody asked for.
    pub fn route_reply(&self, msg: Message) -> bool {
        match lock(&self.waiters).remove(&msg.header.msg_id) {
            Some(tx) => tx.send(msg).is_ok(),
            None => false,
        }
    }

    /// Sends a server-to-client request and waits for its reply.
    fn request(&self, command: Command, payload: &[u8]) -> Result<Message, DmaError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(DmaError::Disconnected);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let header = Header {
            msg_id: id,
            command: command as u16,
            msg_size: 0,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        };
        if std::thread::current().id() == self.loop_thread {
            // Read until our reply arrives, keeping client requests for the
            // event loop, in order. The read lock is taken before sending so
            // no device thread can take the reply off the socket first.
            let mut deferred = lock(&self.deferred);
            self.send(header, payload, &[])
                .map_err(|_| DmaError::Disconnected)?;
            loop {
                // A broken stream cannot be resynchronised: shut it so the
                // event loop sees the disconnect.
                let msg = self.read_locked().map_err(|_| {
                    self.shutdown();
                    DmaError::Disconnected
                })?;
                if !msg.header.is_reply() {
                    deferred.push_back(msg);
                } else if msg.header.msg_id == id {
                    return Ok(msg);
                } else if !self.route_reply(msg) {
                    warn_limited!("dropping a reply nobody asked for");
                }
            }
        }
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.waiters).insert(id, tx);
        if self.send(header, payload, &[]).is_err() {
            lock(&self.waiters).remove(&id);
            return Err(DmaError::Disconnected);
        }
        let deadline = Instant::now() + PEER_TIMEOUT;
        loop {
            match rx.recv_timeout(REPLY_POLL) {
                Ok(msg) => return Ok(msg),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(DmaError::Disconnected),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= deadline || !self.alive.load(Ordering::Acquire) {
                lock(&self.waiters).remove(&id);
                return Err(DmaError::Disconnected);
            }
            if let Some(msg) = self.read_for_busy_loop()? {
                if msg.header.msg_id == id {
                    lock(&self.waiters).remove(&id);
                    return Ok(msg);
                }
                if !self.route_reply(msg) {
                    warn_limited!("dropping a reply nobody asked for");
                }
            }
        }
    }

    /// Reads one message on a device thread while the event loop is busy
    /// (perhaps in a device call waiting for this very thread). Client
    /// requests go to the deferred queue the loop drains before it goes
    /// idle; a reply is returned to the caller to route.
    fn read_for_busy_loop(&self) -> Result<Option<Message>, DmaError> {
        let mut deferred = match self.deferred.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Someone else is reading and will route our reply.
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        if !self.loop_busy.load(Ordering::Acquire) {
            return Ok(None);
        }
        match poll::poll_readable(&self.stream, REPLY_POLL.as_millis() as i32) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(_) => {
                self.shutdown();
                return Err(DmaError::Disconnected);
            }
        }
        let msg = self.read_locked().map_err(|_| {
            self.shutdown();
            DmaError::Disconnected
        })?;
        if msg.header.is_reply() {
            return Ok(Some(msg));
        }
        deferred.push_back(msg);
        Ok(None)
    }
}

fn check_dma_reply(msg: &Message, command: Command, iova: u64, len: usize) -> Result<(), DmaError> {
    if msg.header.command != command as u16 {
        return Err(DmaError::Client {
            iova,
            errno: libc::EPROTO as u32,
        });
    }
    if msg.header.flags & FLAG_ERROR != 0 {
        return Err(DmaError::Client {
            iova,
            errno: msg.header.error,
        });
    }
    let mut r = Reader::new(&msg.payload);
    let addr = r.u64();
    let count = r.u64();
    if addr != Ok(iova) || count != Ok(len as u64) {
        return Err(DmaError::Client {
            iova,
            errno: libc::EPROTO as u32,
        });
    }
    Ok(())
}

impl ClientDma for ClientLink {
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let mut w = Writer::with_capacity(16);
        w.u64(iova).u64(buf.len() as u64);
        let msg = self.request(Command::DmaRead, &w.into_inner())?;
        check_dma_reply(&msg, Command::DmaRead, iova, buf.len())?;
        let data = msg.payload.get(16..).unwrap_or_default();
        if data.len() != buf.len() {
            return Err(DmaError::Client {
                iova,
                errno: libc::EPROTO as u32,
            });
        }
        buf.copy_from_slice(data);
        Ok(())
    }

    fn dma_write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let mut w = Writer::with_capacity(16 + buf.len());
        w.u64(iova).u64(buf.len() as u64).bytes(buf);
        let msg = self.request(Command::DmaWrite, &w.into_inner())?;
        if msg.header.flags & FLAG_ERROR != 0 || msg.header.command != Command::DmaWrite as u16 {
            return Err(DmaError::Client {
                iova,
                errno: msg.header.error,
            });
        }
        Ok(())
    }

    fn max_transfer(&self) -> usize {
        self.max_transfer.load(Ordering::Relaxed)
    }
}
