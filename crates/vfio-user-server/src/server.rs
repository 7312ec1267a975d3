//! A listening endpoint that serves one device to one client at a time,
//! driven by an `event-manager` event loop: the listening socket, the
//! client socket, ioeventfds and a stop eventfd interleave without one
//! blocking the others.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use log::{debug, info};
use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_REGION_INFO_CAP_SPARSE_MMAP, VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vgpu_sys::socket::ClearError;
use vgpu_sys::{warn_limited, LogLimiter};
use vmm_sys_util::eventfd::EventFd;

use crate::conn::{ClientLink, Message, ReadError};
use crate::device::{DeviceContext, IoEventSpec, PciDevice, NUM_REGIONS};
use crate::dma::{ClientDma, DmaSpace, MapRequest};
use crate::irq::{self, Interrupts, IRQ_MSI, IRQ_MSIX, NUM_IRQ_TYPES};
use crate::proto::{
    self, Command, Header, PeerCaps, Reader, Writer, DMA_FLAG_READ, DMA_FLAG_WRITE,
    DMA_UNMAP_FLAG_ALL, DMA_UNMAP_FLAG_GET_DIRTY_BITMAP, MAX_DATA_XFER_SIZE,
};

/// Errors starting or running an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another server is listening on the path.
    #[error("socket {0} is in use by a running server")]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket")]
    NotSocket(PathBuf),
    /// Binding or setting up the socket failed.
    #[error("cannot listen on {path}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The event loop failed.
    #[error("event loop failed: {0}")]
    EventLoop(String),
}

const TOKEN_LISTENER: u32 = 1;
const TOKEN_CLIENT: u32 = 2;
const TOKEN_STOP: u32 = 3;
/// Unmask (resample) eventfds: `TOKEN_UNMASK_BASE + i` for the client's
/// `unmasks[i]`; below the ioeventfds' range.
const TOKEN_UNMASK_BASE: u32 = 0x800;
const TOKEN_IOEVENT_BASE: u32 = 0x1000;

const REGION_INFO_SIZE: u32 = 32;
// Sub-region IO FD info.
const IO_FD_TYPE_IOEVENTFD: u32 = 0;
const IO_FD_ENTRY_SIZE: u32 = 40;
const KVM_IOEVENTFD_FLAG_DATAMATCH: u32 = 1 << 0;
/// Most writes one REGION_WRITE_MULTI may carry.
const MAX_WRITE_MULTI: u64 = 1024;

/// Result of one command: a reply payload with fds, or an errno.
type Outcome = Result<(Vec<u8>, Vec<RawFd>), u32>;

fn einval<T>() -> Result<T, u32> {
    Err(libc::EINVAL as u32)
}

struct IoEvent {
    efd: EventFd,
    region: u32,
    spec: IoEventSpec,
}

struct Client {
    link: Arc<ClientLink>,
    negotiated: bool,
    caps: PeerCaps,
    ioevents: Vec<IoEvent>,
    /// Watched unmask eventfds: (interrupt type, vector, eventfd).
    unmasks: Vec<(u32, u32, EventFd)>,
    /// Close after the current reply (fatal protocol error).
    closing: bool,
}

/// Serves one device on one UNIX socket.
pub struct Endpoint {
    name: String,
    listener: UnixListener,
    path: PathBuf,
    device: Box<dyn PciDevice>,
    ctx: DeviceContext,
    client: Option<Client>,
    stop: EventFd,
    stopped: Arc<AtomicBool>,
    log: LogLimiter,
    /// The listening socket is in the event set (not while a client is
    /// served and another waits in the backlog).
    listening: bool,
}

/// Removes a stale socket left by a process that died; refuses to touch a
/// live one or anything that is not a socket.
fn clear_stale_socket(path: &Path) -> Result<(), ServerError> {
    vgpu_sys::socket::clear_stale(path).map_err(|e| match e {
        ClearError::InUse => ServerError::InUse(path.to_path_buf()),
        ClearError::NotSocket => ServerError::NotSocket(path.to_path_buf()),
        ClearError::Remove(source) => ServerError::Listen {
            path: path.to_path_buf(),
            source,
        },
    })
}

impl Endpoint {
    /// Binds `path` (mode 0600) and binds `device` to its DMA space and
    /// interrupts. `name` prefixes log lines.
    pub fn new(
        name: impl Into<String>,
        path: impl AsRef<Path>,
        mut device: Box<dyn PciDevice>,
    ) -> Result<Self, ServerError> {
        let path = path.as_ref().to_path_buf();
        clear_stale_socket(&path)?;
        let listen_err = |source| ServerError::Listen {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(listen_err)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(listen_err)?;
        listener.set_nonblocking(true).map_err(listen_err)?;
        let infos = std::array::from_fn(|i| device.irq_info(i as u32));
        let ctx = DeviceContext {
            dma: Arc::new(DmaSpace::new()),
            irqs: Interrupts::new(infos),
        };
        device.bind(ctx.clone());
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(listen_err)?;
        Ok(Endpoint {
            name: name.into(),
            listener,
            path,
            device,
            ctx,
            client: None,
            stop,
            stopped: Arc::new(AtomicBool::new(false)),
            log: LogLimiter::default(),
            listening: false,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The DMA space and interrupts given to the device.
    pub fn context(&self) -> &DeviceContext {
        &self.ctx
    }

    /// An eventfd that stops [`Endpoint::run`] when written.
    pub fn stop_handle(&self) -> io::Result<EventFd> {
        self.stop.try_clone()
    }

    /// Runs the endpoint's event loop on this thread until stopped.
    pub fn run(self) -> Result<(), ServerError> {
        let stopped = self.stopped.clone();
        let mut em = EventManager::<Endpoint>::new()
            .map_err(|e| ServerError::EventLoop(format!("{e:?}")))?;
        em.add_subscriber(self);
        while !stopped.load(Ordering::Acquire) {
            em.run()
                .map_err(|e| ServerError::EventLoop(format!("{e:?}")))?;
        }
        Ok(())
    }

    fn warn(&mut self, msg: std::fmt::Arguments<'_>) {
        self.log.warn(&self.name, msg);
    }

    /// Starts or stops watching the listening socket.
    fn watch_listener(&mut self, ops: &mut EventOps, on: bool) {
        if self.listening == on {
            return;
        }
        let res = if on {
            ops.add(Events::with_data(
                &self.listener,
                TOKEN_LISTENER,
                EventSet::IN,
            ))
        } else {
            ops.remove(Events::empty(&self.listener))
        };
        match res {
            Ok(()) => self.listening = on,
            Err(e) => self.warn(format_args!("cannot change the listener's watch: {e:?}")),
        }
    }

    fn accept(&mut self, ops: &mut EventOps) {
        if self.client.is_some() {
            // One client per device. A VMM that connects while another is
            // served (a rebooting VMM's new connection racing the teardown
            // of its old one) waits in the listen backlog and is accepted
            // as soon as the session before it is gone.
            self.watch_listener(ops, false);
            return;
        }
        let stream = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                self.warn(format_args!("accept failed: {e}"));
                return;
            }
        };
        let setup = stream
            .set_nonblocking(false)
            .and_then(|_| ClientLink::new(stream, std::thread::current().id()));
        let link = match setup {
            Ok(l) => Arc::new(l),
            Err(e) => {
                self.warn(format_args!("cannot set up client socket: {e}"));
                return;
            }
        };
        if let Err(e) = ops.add(Events::with_data_raw(
            link.raw_fd(),
            TOKEN_CLIENT,
            EventSet::IN | EventSet::READ_HANG_UP,
        )) {
            self.warn(format_args!("cannot watch client socket: {e:?}"));
            return;
        }
        info!("{}: client connected", self.name);
        self.client = Some(Client {
            link,
            negotiated: false,
            caps: PeerCaps::default(),
            ioevents: Vec::new(),
            unmasks: Vec::new(),
            closing: false,
        });
    }

    /// Drops everything the client set up and resets the device, so the
    /// next client (a restarted VMM) finds it as new.
    fn disconnect(&mut self, ops: &mut EventOps, why: &str) {
        let Some(client) = self.client.take() else {
            return;
        };
        let _ = ops.remove(Events::empty_raw(client.link.raw_fd()));
        for ev in &client.ioevents {
            let _ = ops.remove(Events::empty(&ev.efd));
        }
        for (_, _, efd) in &client.unmasks {
            let _ = ops.remove(Events::empty(efd));
        }
        client.link.shutdown();
        let removed = self.ctx.dma.unmap_all();
        if !removed.is_empty() {
            self.device.dma_unmapped(removed.ranges());
        }
        // The memory is unmapped only now, after the model released it.
        drop(removed);
        self.ctx.irqs.clear();
        self.device.reset();
        info!("{}: client disconnected ({why}); device reset", self.name);
        // A VMM waiting in the backlog is served next.
        self.watch_listener(ops, true);
    }

    fn client_readable(&mut self, ops: &mut EventOps) {
        let Some(link) = self.client.as_ref().map(|c| c.link.clone()) else {
            return;
        };
        let msg = match link.read_message() {
            Ok(Some(m)) => m,
            // A device thread read what woke us while we were busy.
            Ok(None) => return,
            Err(ReadError::Closed) => return self.disconnect(ops, "closed"),
            Err(ReadError::Size(size, header)) => {
                self.warn(format_args!("message size {size} out of range; closing"));
                if !header.is_reply() {
                    let _ = link.reply_error(&header, libc::EINVAL as u32);
                }
                return self.disconnect(ops, "protocol error");
            }
            Err(ReadError::Io(e)) => {
                let why = format!("socket error: {e}");
                return self.disconnect(ops, &why);
            }
        };
        self.handle_message(msg, ops);
    }

    /// Handles the requests read ahead while this thread was busy (by its
    /// own DMA waits or by device threads), then lets device threads know
    /// the loop is back to watching the socket.
    fn drain_deferred(&mut self, ops: &mut EventOps) {
        while let Some(link) = self.client.as_ref().map(|c| c.link.clone()) {
            match link.next_deferred_or_idle() {
                Some(m) => self.handle_message(m, ops),
                None => break,
            }
        }
        if self.client.as_ref().is_some_and(|c| c.closing) {
            self.disconnect(ops, "protocol error");
        }
    }

    fn handle_message(&mut self, msg: Message, ops: &mut EventOps) {
        let Some(link) = self.client.as_ref().map(|c| c.link.clone()) else {
            return;
        };
        let header = msg.header;
        if header.is_reply() {
            if !link.route_reply(msg) {
                self.warn(format_args!(
                    "ignoring a reply nobody asked for (id {}, command {})",
                    header.msg_id, header.command
                ));
            }
            return;
        }
        let outcome = if header.msg_type() != proto::FLAG_TYPE_COMMAND {
            self.warn(format_args!(
                "message type {} is unknown",
                header.msg_type()
            ));
            einval()
        } else if msg.fds_truncated {
            self.warn(format_args!(
                "message carried more fds than can be received"
            ));
            einval()
        } else {
            self.dispatch(&header, &msg.payload, msg.fds, ops)
        };
        link.recycle(msg.payload);
        if header.no_reply() {
            if let Err(errno) = outcome {
                debug!(
                    "{}: posted command {} failed: errno {errno}",
                    self.name, header.command
                );
            }
            return;
        }
        let sent = match &outcome {
            Ok((payload, fds)) => link.reply(&header, payload, fds),
            Err(errno) => link.reply_error(&header, *errno),
        };
        if let Err(e) = sent {
            let why = format!("cannot reply: {e}");
            self.disconnect(ops, &why);
        }
    }

    fn dispatch(
        &mut self,
        header: &Header,
        payload: &[u8],
        fds: Vec<File>,
        ops: &mut EventOps,
    ) -> Outcome {
        let Some(cmd) = Command::from_u16(header.command) else {
            self.warn(format_args!("unknown command {}", header.command));
            return einval();
        };
        let negotiated = self.client.as_ref().is_some_and(|c| c.negotiated);
        if cmd != Command::Version && !negotiated {
            self.warn(format_args!("{cmd:?} before version negotiation"));
            return einval();
        }
        let takes_fds = matches!(cmd, Command::DmaMap | Command::DeviceSetIrqs);
        if !takes_fds && !fds.is_empty() {
            self.warn(format_args!("{cmd:?} carried {} unexpected fds", fds.len()));
            return einval();
        }
        let result = match cmd {
            Command::Version => self.version(payload),
            Command::DmaMap => self.dma_map(payload, fds),
            Command::DmaUnmap => self.dma_unmap(payload),
            Command::DeviceGetInfo => self.device_info(payload),
            Command::DeviceGetRegionInfo => self.region_info(payload),
            Command::DeviceGetRegionIoFds => self.region_io_fds(payload, ops),
            Command::DeviceGetIrqInfo => self.irq_info(payload),
            Command::DeviceSetIrqs => self.set_irqs(payload, fds, ops),
            Command::RegionRead => self.region_read(payload),
            Command::RegionWrite => self.region_write(payload),
            Command::RegionWriteMulti => self.region_write_multi(payload),
            Command::DeviceReset => {
                self.device.reset();
                info!("{}: device reset by client", self.name);
                Ok((Vec::new(), Vec::new()))
            }
            Command::DmaRead | Command::DmaWrite => {
                self.warn(format_args!("{cmd:?} is a server-to-client command"));
                einval()
            }
            Command::DeviceFeature | Command::MigDataRead | Command::MigDataWrite => {
                Err(libc::ENOTSUP as u32)
            }
        };
        if let Err(errno) = result {
            debug!("{}: {cmd:?} failed with errno {errno}", self.name);
        }
        result
    }

    fn client_mut(&mut self) -> Result<&mut Client, u32> {
        self.client.as_mut().ok_or(libc::ENOTCONN as u32)
    }

    fn version(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(major), Ok(minor)) = (r.u16(), r.u16()) else {
            self.warn(format_args!("short VERSION"));
            return einval();
        };
        let data = r.rest();
        let client = self.client_mut()?;
        if client.negotiated {
            return einval();
        }
        if major != 0 {
            // The spec leaves no way to agree on another major: refuse and close.
            client.closing = true;
            self.warn(format_args!(
                "client proposes unsupported version {major}.{minor}"
            ));
            return Err(libc::ENOTSUP as u32);
        }
        let caps = match PeerCaps::parse(data) {
            Ok(c) => c,
            Err(e) => {
                self.warn(format_args!("bad VERSION capabilities: {e}"));
                return einval();
            }
        };
        if caps.pgsizes & proto::PAGE_SIZE == 0 {
            self.warn(format_args!(
                "client page sizes {:#x} lack 4 KiB",
                caps.pgsizes
            ));
            return einval();
        }
        let json = proto::reply_caps_json(&caps);
        self.ctx
            .dma
            .set_max_maps(caps.max_dma_maps.min(proto::DEFAULT_MAX_DMA_MAPS) as usize);
        let client = self.client_mut()?;
        client
            .link
            .set_max_transfer(caps.max_data_xfer_size.min(MAX_DATA_XFER_SIZE) as usize);
        client.caps = caps;
        client.negotiated = true;
        info!(
            "{}: negotiated version 0.0 (client proposed {major}.{minor})",
            self.name
        );
        let mut w = Writer::with_capacity(4 + json.len() + 1);
        w.u16(0).u16(0).bytes(json.as_bytes()).bytes(&[0]);
        Ok((w.into_inner(), Vec::new()))
    }

    fn dma_map(&mut self, payload: &[u8], mut fds: Vec<File>) -> Outcome {
        let mut r = Reader::new(payload);
        let fields =
            (|| Ok::<_, proto::Truncated>((r.u32()?, r.u32()?, r.u64()?, r.u64()?, r.u64()?)))();
        let Ok((argsz, flags, offset, iova, size)) = fields else {
            return einval();
        };
        if argsz < 32 || flags & !(DMA_FLAG_READ | DMA_FLAG_WRITE) != 0 || fds.len() > 1 {
            self.warn(format_args!(
                "bad DMA_MAP (flags {flags:#x}, {} fds)",
                fds.len()
            ));
            return einval();
        }
        let req = MapRequest {
            iova,
            size,
            readable: flags & DMA_FLAG_READ != 0,
            writable: flags & DMA_FLAG_WRITE != 0,
            offset,
        };
        let link: Arc<dyn ClientDma> = self.client_mut()?.link.clone();
        let fd = fds.pop();
        let has_fd = fd.is_some();
        match self.ctx.dma.map(&req, fd, link) {
            Ok(mapped) => {
                debug!(
                    "{}: DMA map {iova:#x}+{size:#x} flags {flags:#x} fd {has_fd}",
                    self.name
                );
                if let Some(m) = mapped {
                    self.device.dma_mapped(&m);
                }
                Ok((Vec::new(), Vec::new()))
            }
            Err(e) => {
                self.warn(format_args!("DMA_MAP {iova:#x}+{size:#x} refused: {e}"));
                Err(e.errno())
            }
        }
    }

    fn dma_unmap(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let fields = (|| Ok::<_, proto::Truncated>((r.u32()?, r.u32()?, r.u64()?, r.u64()?)))();
        let Ok((argsz, flags, iova, size)) = fields else {
            return einval();
        };
        if argsz < 24 {
            return einval();
        }
        let removed = if flags == DMA_UNMAP_FLAG_ALL {
            if iova != 0 || size != 0 {
                return einval();
            }
            self.ctx.dma.unmap_all()
        } else if flags & DMA_UNMAP_FLAG_GET_DIRTY_BITMAP != 0 {
            return Err(libc::ENOTSUP as u32);
        } else if flags != 0 {
            return einval();
        } else {
            match self.ctx.dma.unmap(iova, size) {
                Ok(v) => v,
                Err(e) => {
                    self.warn(format_args!("DMA_UNMAP {iova:#x}+{size:#x} refused: {e}"));
                    return Err(e.errno());
                }
            }
        };
        if !removed.is_empty() {
            debug!(
                "{}: DMA unmap removed {} mappings",
                self.name,
                removed.ranges().len()
            );
            self.device.dma_unmapped(removed.ranges());
        }
        // Unmapped from this process only after the model released it.
        drop(removed);
        Ok((payload[..24].to_vec(), Vec::new()))
    }

    fn device_info(&mut self, payload: &[u8]) -> Outcome {
        match Reader::new(payload).u32() {
            Ok(argsz) if argsz >= 16 => {}
            _ => return einval(),
        }
        let mut w = Writer::with_capacity(16);
        w.u32(16)
            .u32(VFIO_DEVICE_FLAGS_RESET | VFIO_DEVICE_FLAGS_PCI)
            .u32(NUM_REGIONS)
            .u32(NUM_IRQ_TYPES);
        Ok((w.into_inner(), Vec::new()))
    }

    fn region_info(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(argsz), Ok(_flags), Ok(index)) = (r.u32(), r.u32(), r.u32()) else {
            return einval();
        };
        if argsz < REGION_INFO_SIZE || index >= NUM_REGIONS {
            self.warn(format_args!(
                "bad DEVICE_GET_REGION_INFO (argsz {argsz}, index {index})"
            ));
            return einval();
        }
        let info = self.device.region_info(index);
        let mut flags = 0;
        if info.readable {
            flags |= VFIO_REGION_INFO_FLAG_READ;
        }
        if info.writable {
            flags |= VFIO_REGION_INFO_FLAG_WRITE;
        }
        let mut cap = Writer::default();
        let mut fds = Vec::new();
        let mut file_offset = 0;
        if let Some(mmap) = &info.mmap {
            flags |= VFIO_REGION_INFO_FLAG_MMAP;
            file_offset = mmap.file_offset;
            fds.push(mmap.file.as_raw_fd());
            if !mmap.areas.is_empty() {
                cap.u16(VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16)
                    .u16(1)
                    .u32(0)
                    .u32(mmap.areas.len() as u32)
                    .u32(0);
                for a in &mmap.areas {
                    cap.u64(a.offset).u64(a.size);
                }
            }
        }
        let cap = cap.into_inner();
        let needed = REGION_INFO_SIZE + cap.len() as u32;
        let fits = argsz >= needed && !cap.is_empty();
        // Only claim capabilities that are in this reply: QEMU refuses a
        // reply that sets the flag with cap_offset 0, even though it then
        // asks again with the size `needed` announces.
        if fits {
            flags |= VFIO_REGION_INFO_FLAG_CAPS;
        }
        let mut w = Writer::with_capacity(needed as usize);
        w.u32(needed)
            .u32(flags)
            .u32(index)
            .u32(if fits { REGION_INFO_SIZE } else { 0 })
            .u64(info.size)
            .u64(file_offset);
        if fits {
            w.bytes(&cap);
        }
        Ok((w.into_inner(), fds))
    }

    fn region_io_fds(&mut self, payload: &[u8], ops: &mut EventOps) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(argsz), Ok(flags), Ok(index)) = (r.u32(), r.u32(), r.u32()) else {
            return einval();
        };
        if argsz < 16 || flags != 0 || index >= NUM_REGIONS {
            return einval();
        }
        let specs = self.device.ioeventfds(index);
        let max_fds = self.client_mut()?.caps.max_msg_fds;
        if specs.len() > max_fds.min(proto::MAX_MSG_FDS) {
            self.warn(format_args!(
                "region {index} has more ioeventfds than the client takes"
            ));
            return Err(libc::ENOSPC as u32);
        }
        let needed = 16 + IO_FD_ENTRY_SIZE * specs.len() as u32;
        let mut w = Writer::with_capacity(needed as usize);
        w.u32(needed).u32(0).u32(index).u32(specs.len() as u32);
        if argsz < needed {
            return Ok((w.into_inner(), Vec::new()));
        }
        let mut fds = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let efd = match self.device.ioeventfd_direct(index, spec) {
                // Owned by the device, which outlives this reply.
                Some(fd) => fd.as_raw_fd(),
                None => self.ioevent_for(index, *spec, ops)?,
            };
            fds.push(efd);
            w.u64(spec.offset)
                .u64(spec.size)
                .u32(i as u32)
                .u32(IO_FD_TYPE_IOEVENTFD)
                .u32(if spec.datamatch.is_some() {
                    KVM_IOEVENTFD_FLAG_DATAMATCH
                } else {
                    0
                })
                .u32(0)
                .u64(spec.datamatch.unwrap_or(0));
        }
        Ok((w.into_inner(), fds))
    }

    /// The eventfd of one doorbell, created and watched on first request.
    fn ioevent_for(
        &mut self,
        region: u32,
        spec: IoEventSpec,
        ops: &mut EventOps,
    ) -> Result<RawFd, u32> {
        let client = self.client_mut()?;
        if let Some(ev) = client
            .ioevents
            .iter()
            .find(|e| e.region == region && e.spec == spec)
        {
            return Ok(ev.efd.as_raw_fd());
        }
        let efd = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO) as u32)?;
        let token = TOKEN_IOEVENT_BASE + client.ioevents.len() as u32;
        ops.add(Events::with_data(&efd, token, EventSet::IN))
            .map_err(|_| libc::ENOMEM as u32)?;
        let fd = efd.as_raw_fd();
        client.ioevents.push(IoEvent { efd, region, spec });
        Ok(fd)
    }

    /// Watches the unmask eventfds the interrupt table now holds (any
    /// SET_IRQS may have set, replaced or dropped some).
    fn watch_unmasks(&mut self, ops: &mut EventOps) {
        let wanted = self.ctx.irqs.unmask_eventfds();
        let Some(client) = self.client.as_mut() else {
            return;
        };
        for (_, _, efd) in client.unmasks.drain(..) {
            let _ = ops.remove(Events::empty(&efd));
        }
        for (index, vector, efd) in wanted {
            let token = TOKEN_UNMASK_BASE + client.unmasks.len() as u32;
            if token >= TOKEN_IOEVENT_BASE {
                break;
            }
            match ops.add(Events::with_data(&efd, token, EventSet::IN)) {
                Ok(()) => client.unmasks.push((index, vector, efd)),
                Err(e) => warn_limited!("{}: cannot watch an unmask eventfd: {e:?}", self.name),
            }
        }
    }

    fn unmask_fired(&mut self, idx: usize, ops: &mut EventOps) {
        let Some((index, vector, efd)) = self.client.as_ref().and_then(|c| c.unmasks.get(idx))
        else {
            return;
        };
        let (index, vector) = (*index, *vector);
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `count`, which outlives the call.
        let n = unsafe { libc::read(efd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        if n == 8 {
            self.ctx.irqs.unmask(index, vector);
            return;
        }
        if n < 0
            && matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
        {
            return;
        }
        // Not an eventfd (a pipe at end of file stays readable): stop
        // watching it rather than spin on it.
        let _ = ops.remove(Events::empty(efd));
        self.warn(format_args!(
            "unmask fd of interrupt {index}.{vector} is not an eventfd; ignored"
        ));
    }

    fn ioevent_fired(&mut self, idx: usize) {
        let Some(ev) = self.client.as_ref().and_then(|c| c.ioevents.get(idx)) else {
            return;
        };
        // Several kicks since the last wake-up are one doorbell write.
        if ev.efd.read().is_err() {
            return;
        }
        let (region, spec) = (ev.region, ev.spec);
        let bytes = spec.datamatch.unwrap_or(0).to_le_bytes();
        let len = (spec.size as usize).min(8);
        if let Err(e) = self.device.region_write(region, spec.offset, &bytes[..len]) {
            self.warn(format_args!("doorbell write refused: {e}"));
        }
    }

    fn irq_info(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(argsz), Ok(_flags), Ok(index)) = (r.u32(), r.u32(), r.u32()) else {
            return einval();
        };
        if argsz < 16 || index >= NUM_IRQ_TYPES {
            self.warn(format_args!(
                "bad DEVICE_GET_IRQ_INFO (argsz {argsz}, index {index})"
            ));
            return einval();
        }
        let info = self.device.irq_info(index);
        let mut flags = VFIO_IRQ_INFO_EVENTFD;
        if info.maskable {
            flags |= VFIO_IRQ_INFO_MASKABLE;
        }
        if info.automasked {
            flags |= VFIO_IRQ_INFO_AUTOMASKED;
        }
        if index == IRQ_MSI || index == IRQ_MSIX {
            flags |= VFIO_IRQ_INFO_NORESIZE;
        }
        let mut w = Writer::with_capacity(16);
        w.u32(16).u32(flags).u32(index).u32(info.count);
        Ok((w.into_inner(), Vec::new()))
    }

    fn set_irqs(&mut self, payload: &[u8], fds: Vec<File>, ops: &mut EventOps) -> Outcome {
        let mut r = Reader::new(payload);
        let fields =
            (|| Ok::<_, proto::Truncated>((r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?)))();
        let Ok((argsz, flags, index, start, count)) = fields else {
            return einval();
        };
        if argsz < 20 {
            return einval();
        }
        let nfds = fds.len();
        // MASK and UNMASK without eventfds change no eventfd: cloud-hypervisor
        // sends an INTx UNMASK after every trapped BAR access, so that path
        // logs nothing and rebuilds nothing.
        let masking = flags & (irq::SET_ACTION_MASK | irq::SET_ACTION_UNMASK) != 0
            && flags & irq::SET_DATA_EVENTFD == 0;
        match self.ctx.irqs.set(index, flags, start, count, r.rest(), fds) {
            Ok(()) if masking => Ok((Vec::new(), Vec::new())),
            Ok(()) => {
                debug!(
                    "{}: SET_IRQS index {index} flags {flags:#x} {start}+{count} ({nfds} fds)",
                    self.name
                );
                self.watch_unmasks(ops);
                self.device.irqs_changed(index);
                Ok((Vec::new(), Vec::new()))
            }
            Err(e) => {
                self.warn(format_args!("SET_IRQS refused: {e}"));
                Err(e.errno())
            }
        }
    }

    /// Checks a region access against the region's size and permissions.
    fn check_access(
        &mut self,
        region: u32,
        offset: u64,
        count: u64,
        write: bool,
    ) -> Result<(), u32> {
        if region >= NUM_REGIONS || count > u64::from(MAX_DATA_XFER_SIZE) {
            self.warn(format_args!(
                "region access to {region} of {count} bytes refused"
            ));
            return einval();
        }
        let info = self.device.region_info(region);
        let allowed = if write { info.writable } else { info.readable };
        let inside = offset
            .checked_add(count)
            .is_some_and(|end| end <= info.size);
        if !allowed || !inside {
            self.warn(format_args!(
                "region {region} {} at {offset:#x}+{count} outside or not permitted",
                if write { "write" } else { "read" }
            ));
            return einval();
        }
        Ok(())
    }

    fn region_read(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(offset), Ok(region), Ok(count)) = (r.u64(), r.u32(), r.u32()) else {
            return einval();
        };
        self.check_access(region, offset, u64::from(count), false)?;
        let mut w = Writer::with_capacity(16 + count as usize);
        w.u64(offset).u32(region).u32(count);
        let mut out = w.into_inner();
        out.resize(16 + count as usize, 0);
        self.device
            .region_read(region, offset, &mut out[16..])
            .map_err(|e| e.errno())?;
        Ok((out, Vec::new()))
    }

    fn region_write(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let (Ok(offset), Ok(region), Ok(count)) = (r.u64(), r.u32(), r.u32()) else {
            return einval();
        };
        let data = r.rest();
        if data.len() != count as usize {
            self.warn(format_args!(
                "REGION_WRITE count {count} but {} data bytes",
                data.len()
            ));
            return einval();
        }
        self.check_access(region, offset, u64::from(count), true)?;
        self.device
            .region_write(region, offset, data)
            .map_err(|e| e.errno())?;
        Ok((payload[..16].to_vec(), Vec::new()))
    }

    fn region_write_multi(&mut self, payload: &[u8]) -> Outcome {
        let mut r = Reader::new(payload);
        let Ok(wr_cnt) = r.u64() else {
            return einval();
        };
        let entries = r.rest();
        if wr_cnt > MAX_WRITE_MULTI || entries.len() as u64 != wr_cnt * 24 {
            self.warn(format_args!(
                "REGION_WRITE_MULTI of {wr_cnt} writes in {} bytes",
                entries.len()
            ));
            return einval();
        }
        for entry in entries.chunks_exact(24) {
            let mut e = Reader::new(entry);
            let (Ok(offset), Ok(region), Ok(count)) = (e.u64(), e.u32(), e.u32()) else {
                return einval();
            };
            if count > 8 {
                return einval();
            }
            self.check_access(region, offset, u64::from(count), true)?;
            let data = &e.rest()[..count as usize];
            self.device
                .region_write(region, offset, data)
                .map_err(|e| e.errno())?;
        }
        let mut w = Writer::with_capacity(8);
        w.u64(wr_cnt);
        Ok((w.into_inner(), Vec::new()))
    }
}

impl Endpoint {
    fn handle_event(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            TOKEN_LISTENER => self.accept(ops),
            TOKEN_CLIENT => {
                if events.event_set().contains(EventSet::IN) {
                    self.client_readable(ops);
                } else {
                    self.disconnect(ops, "hang-up");
                }
            }
            TOKEN_STOP => {
                let _ = self.stop.read();
                self.disconnect(ops, "server stopping");
                self.stopped.store(true, Ordering::Release);
            }
            t if t >= TOKEN_IOEVENT_BASE => self.ioevent_fired((t - TOKEN_IOEVENT_BASE) as usize),
            t if t >= TOKEN_UNMASK_BASE => self.unmask_fired((t - TOKEN_UNMASK_BASE) as usize, ops),
            t => warn_limited!("{}: event for unknown token {t}", self.name),
        }
    }
}

impl MutEventSubscriber for Endpoint {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if let Some(c) = &self.client {
            c.link.loop_busy();
        }
        self.handle_event(events, ops);
        self.drain_deferred(ops);
    }

    fn init(&mut self, ops: &mut EventOps) {
        self.watch_listener(ops, true);
        if let Err(e) = ops.add(Events::with_data(&self.stop, TOKEN_STOP, EventSet::IN)) {
            warn_limited!("{}: cannot watch stop event: {e:?}", self.name);
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Stopped with a client's mappings in place: the model releases
        // them while their memory is still mapped, as on a disconnect.
        let removed = self.ctx.dma.unmap_all();
        if !removed.is_empty() {
            self.device.dma_unmapped(removed.ranges());
        }
        drop(removed);
        let _ = fs::remove_file(&self.path);
    }
}
