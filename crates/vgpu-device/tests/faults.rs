//! Fault injection. Every test serves a victim vGPU and, on the same
//! software backend, a bystander vGPU whose guest works for the whole test
//! (copies and kernels, results checked); no bystander command may take
//! longer than [`STALL`]. The victim's VMM goes away at every point of a
//! session, guest memory is unmapped under running copies, the function is
//! reset under load and its driver misbehaves; afterwards the victim's
//! device memory is freed and a new VMM finds it working.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{assert_status, eventually, thread_cpu, Rng, MIB, QUIET};
use vfio_user_server::proto::{Command, Header, FLAG_ERROR, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY};
use vfio_user_server::proto::{DMA_FLAG_READ, DMA_FLAG_WRITE, HEADER_SIZE};
use vgpu_backend::software::SoftwareBackend;
use vgpu_device::testing::TestVgpu;
use vgpu_device::testing::{software_partition, test_config};
use vgpu_testkit::abi::{self, ByteValued, CmdHeader, SgEntry};
use vgpu_testkit::{bytes_to_f32s, f32s_to_bytes, launch_cmd};
use vgpu_testkit::{fill_chain, Chain, Guest, Mode, WakePolicy};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vmm_sys_util::tempdir::TempDir;

/// Longest any bystander command may take.
const STALL: Duration = Duration::from_secs(1);
/// Longest a reset, a DMA_UNMAP or a queue change may take under load.
const PROMPT: Duration = Duration::from_secs(1);
/// Longest from a VMM going away to a new one finding the function ready.
const RECONNECT: Duration = Duration::from_secs(2);
/// Device memory of the victim.
const VICTIM_MEMORY: u64 = 32 * MIB;
/// Device memory of the bystander.
const BYSTANDER_MEMORY: u64 = 8 * MIB;
/// Queues of the victim.
const VICTIM_QUEUES: u32 = 4;
/// Side of the square matrices of the long commands (about 50 ms each in
/// a debug build, several times that with other tests beside them).
const DIM: u32 = 192;

// ---- the bystander ---------------------------------------------------------

#[derive(Debug, Default)]
struct BystanderStats {
    rounds: u64,
    commands: u64,
    slowest: Duration,
}

/// A second vGPU on the victim's backend, driven by a thread of its own:
/// uploads, kernels and downloads with every result checked, each command
/// timed.
struct Bystander {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<BystanderStats>>,
    _server: TestVgpu,
}

impl Bystander {
    fn start(backend: &SoftwareBackend) -> Bystander {
        let server = TestVgpu::start(
            test_config("bystander", 1),
            software_partition(backend, "bystander", BYSTANDER_MEMORY, 1),
        );
        let mut g = server.connect();
        g.set_timeout(5 * STALL);
        g.setup_queue(0, 64, Mode::Interrupt);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bystander-guest".into())
            .spawn(move || bystander_loop(g, &flag))
            .expect("bystander thread");
        Bystander {
            stop,
            thread: Some(thread),
            _server: server,
        }
    }

    /// Stops the bystander and checks it was never stalled.
    fn finish(mut self) -> BystanderStats {
        self.stop.store(true, Ordering::Relaxed);
        let stats = match self.thread.take().expect("running").join() {
            Ok(s) => s,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        assert!(stats.rounds > 0, "the bystander made no progress");
        assert!(
            stats.slowest < STALL,
            "a bystander command took {:?} ({stats:?})",
            stats.slowest
        );
        stats
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn timed<T>(stats: &mut BystanderStats, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    stats.commands += 1;
    stats.slowest = stats.slowest.max(t.elapsed());
    r
}

fn bystander_loop(mut g: Guest, stop: &AtomicBool) -> BystanderStats {
    const N: usize = 16 << 10;
    let bytes = (N * 4) as u64;
    let mut stats = BystanderStats::default();
    let mut rng = Rng(0xb157_a4de);
    let x = g.device_alloc(0, bytes);
    let y = g.device_alloc(0, bytes);
    let sum = g.device_alloc(0, 4);
    while !stop.load(Ordering::Relaxed) {
        let xs = rng.f32s(N);
        let ys = rng.f32s(N);
        timed(&mut stats, || g.upload(0, x, &f32s_to_bytes(&xs)));
        timed(&mut stats, || g.upload(0, y, &f32s_to_bytes(&ys)));
        let a = 0.75f32;
        let p = abi::SaxpyParams {
            y,
            x,
            n: N as u64,
            a,
            reserved: 0,
        };
        assert_status(
            timed(&mut stats, || g.launch(0, "saxpy_f32", &p)),
            abi::STATUS_OK,
        );
        let r = abi::ReduceSumParams {
            out: sum,
            input: x,
            n: N as u64,
        };
        assert_status(
            timed(&mut stats, || g.launch(0, "reduce_sum_f32", &r)),
            abi::STATUS_OK,
        );
        let got = bytes_to_f32s(&timed(&mut stats, || g.download(0, y, bytes as usize)));
        let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect();
        assert!(got == want, "bystander saxpy result is wrong");
        let got = bytes_to_f32s(&timed(&mut stats, || g.download(0, sum, 4)));
        // The inputs are multiples of 2^-23 below 1: their sum is exact in f64.
        let want = xs.iter().map(|v| f64::from(*v)).sum::<f64>() as f32;
        assert_eq!(got, [want], "bystander reduction result is wrong");
        stats.rounds += 1;
    }
    stats
}

// ---- the host ----------------------------------------------------------------

/// A software backend serving the victim and the bystander.
struct Host {
    victim: TestVgpu,
    /// Thread name of the victim's queue worker.
    worker: String,
    bystander: Bystander,
    _backend: SoftwareBackend,
}

impl Host {
    /// `name` (at most 10 bytes) tells the victim's threads from those of
    /// other tests.
    fn new(name: &str) -> Host {
        let backend = SoftwareBackend::new(VICTIM_MEMORY + BYSTANDER_MEMORY, 3);
        let victim = TestVgpu::start(
            test_config(name, VICTIM_QUEUES),
            software_partition(&backend, name, VICTIM_MEMORY, 2),
        );
        let bystander = Bystander::start(&backend);
        Host {
            victim,
            worker: format!("vgpu-{name}"),
            bystander,
            _backend: backend,
        }
    }

    fn path(&self) -> &Path {
        self.victim.path()
    }

    /// What a restarted VMM finds once the previous one went away: the
    /// function as new, its tenant's device memory freed, and working.
    fn reconnect(&self) -> Guest {
        let mut g = self.victim.connect();
        assert_fresh(&mut g);
        assert_works(&mut g);
        g
    }

    /// CPU time the victim's worker uses in `window`, after a quiet moment.
    fn idle_cpu(&self, window: Duration) -> Duration {
        std::thread::sleep(QUIET);
        let before = thread_cpu(&self.worker);
        std::thread::sleep(window);
        thread_cpu(&self.worker).saturating_sub(before)
    }

    fn finish(self) {
        assert!(self.victim.alive(), "the victim's endpoint has stopped");
        let stats = self.bystander.finish();
        eprintln!("bystander: {stats:?}");
    }
}

/// The function is in its power-on state (the kit has enabled it).
#[track_caller]
fn assert_fresh(g: &mut Guest) {
    assert_eq!(
        g.mem_used(),
        0,
        "device memory of the previous tenant freed"
    );
    assert_eq!(g.commands(), 0);
    assert_eq!(g.error_count(), 0);
    for q in 0..g.num_queues() {
        assert_eq!(g.queue_status(q), 0, "queue {q} stopped");
    }
}

/// Queue 0 runs a little of everything with results checked; it is left
/// disabled and the device memory freed.
#[track_caller]
fn assert_works(g: &mut Guest) {
    g.setup_queue(0, 64, Mode::Interrupt);
    let mut rng = Rng(0x3017);
    let data = rng.bytes(256 << 10);
    let len = data.len() as u64;
    let a = g.device_alloc(0, len);
    let b = g.device_alloc(0, len);
    g.upload(0, a, &data);
    assert_status(g.copy_device_to_device(0, b, a, len), abi::STATUS_OK);
    assert_status(g.fill(0, a, len / 2, 0x5a5a_0101), abi::STATUS_OK);
    assert_eq!(g.download(0, b, data.len()), data);
    let half = g.download(0, a, data.len());
    assert!(half[..data.len() / 2]
        .chunks_exact(4)
        .all(|w| w == 0x5a5a_0101u32.to_le_bytes()));
    assert_eq!(half[data.len() / 2..], data[data.len() / 2..]);
    assert_status(g.mem_free(0, a), abi::STATUS_OK);
    assert_status(g.mem_free(0, b), abi::STATUS_OK);
    assert_eq!(g.mem_used(), 0);
    g.disable_queue(0);
}

// ---- load ----------------------------------------------------------------------

fn sgemm_chain(c: u64, a: u64, b: u64, dim: u32) -> Chain {
    let p = abi::SgemmParams {
        c,
        a,
        b,
        m: dim,
        n: dim,
        k: dim,
        reserved: 0,
        alpha: 1.0,
        beta: 0.5,
    };
    let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
    Chain::command(&cmd).bytes(p.as_slice()).completion()
}

fn copy_chain(src_kind: u32, dst_kind: u32, src: u64, dst: u64, sg: &[SgEntry]) -> Chain {
    let cmd = abi::CopyCmd {
        hdr: CmdHeader {
            opcode: abi::OP_COPY,
            flags: 0,
        },
        src_kind,
        dst_kind,
        src,
        dst,
        size: sg.iter().map(|e| e.len).sum(),
        sg_count: sg.len() as u32,
        reserved: 0,
    };
    let list: Vec<u8> = sg.iter().flat_map(|e| e.as_slice().to_vec()).collect();
    Chain::command(&cmd).bytes(&list).completion()
}

fn nop_chain() -> Chain {
    Chain::command(&CmdHeader::default()).completion()
}

/// Gives the guest's function device memory and every queue a long list of
/// long commands: matrix products (queue 0), 4 MiB uploads (1, polled),
/// 4 MiB fills (2) and 4 MiB downloads (3, polled). Returns once queue
/// `until` has completed its first command, with more products queued
/// behind the rest.
fn load(g: &mut Guest, until: u32) {
    assert_eq!(g.num_queues(), 4);
    g.setup_queue(0, 256, Mode::Interrupt);
    g.setup_queue(1, 256, Mode::Polled);
    g.setup_queue(2, 128, Mode::Interrupt);
    g.setup_queue(3, 256, Mode::Polled);
    let mut rng = Rng(0x10ad);
    let side = u64::from(DIM * DIM * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(0, side)).collect();
    for &x in &m[..2] {
        g.upload(0, x, &f32s_to_bytes(&rng.f32s((DIM * DIM) as usize)));
    }
    let big = 4 * MIB;
    let up = g.device_alloc(0, big);
    let down = g.device_alloc(0, big);
    let fill = g.device_alloc(0, big);
    let buf = g.alloc_bytes(&rng.bytes(big as usize));
    let sg = [SgEntry {
        addr: buf,
        len: big,
    }];
    let product = sgemm_chain(m[2], m[0], m[1], DIM);
    let upload = copy_chain(abi::COPY_GUEST, abi::COPY_DEVICE, 0, up, &sg);
    let download = copy_chain(abi::COPY_DEVICE, abi::COPY_GUEST, down, 0, &sg);
    for _ in 0..3 {
        g.post(0, &product);
    }
    for _ in 0..40 {
        g.post(1, &upload);
    }
    for i in 0..60 {
        g.post(2, &fill_chain(fill, big, i));
    }
    for _ in 0..40 {
        g.post(3, &download);
    }
    for q in 0..4 {
        g.kick(q);
    }
    let t = Instant::now();
    let first = g
        .wait_used(until, Duration::from_secs(10))
        .expect("first completion");
    assert_status(first.completion(), abi::STATUS_OK);
    eprintln!("queue {until} completed a command after {:?}", t.elapsed());
    for _ in 0..40 {
        g.post(0, &product);
    }
    g.kick(0);
    assert!(g.mem_used() >= 3 * side + 3 * big);
}

/// Used indices of every set-up queue.
fn used_indices(g: &mut Guest, queues: u32) -> Vec<u16> {
    (0..queues).map(|q| g.ring_used_idx(q)).collect()
}

// ---- a VMM of hand-framed messages ---------------------------------------

/// Capabilities with room for 16 fds, `max_xfer`-byte transfers and 4 KiB pages.
fn caps(max_xfer: u32) -> String {
    format!(
        r#"{{"capabilities":{{"max_msg_fds":16,"max_data_xfer_size":{max_xfer},"pgsizes":4096}}}}"#
    )
}

/// The bytes of a message with id `id`.
fn message(id: u16, command: Command, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        msg_id: id,
        command: command as u16,
        msg_size: (HEADER_SIZE + payload.len()) as u32,
        flags: FLAG_TYPE_COMMAND,
        error: 0,
    };
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

fn version_payload(max_xfer: u32) -> Vec<u8> {
    let mut p = vec![0, 0, 0, 0];
    p.extend_from_slice(caps(max_xfer).as_bytes());
    p.push(0);
    p
}

fn dma_map_payload(iova: u64, size: u64) -> Vec<u8> {
    let mut p = 32u32.to_le_bytes().to_vec();
    p.extend_from_slice(&(DMA_FLAG_READ | DMA_FLAG_WRITE).to_le_bytes());
    for v in [0, iova, size] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

fn region_access(region: u32, offset: u64, data: &[u8], count: u32) -> Vec<u8> {
    let mut p = offset.to_le_bytes().to_vec();
    p.extend_from_slice(&region.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p.extend_from_slice(data);
    p
}

/// Guest memory the VMM shares without an fd: the device reaches it
/// through DMA_READ / DMA_WRITE requests, which the VMM answers while it
/// waits for its own replies.
struct ClientMem {
    iova: u64,
    bytes: Vec<u8>,
    served: usize,
}

/// A VMM that frames vfio-user messages by hand, so it can stop anywhere.
struct RawVmm {
    stream: UnixStream,
    next_id: u16,
    mem: Option<ClientMem>,
}

impl RawVmm {
    /// Connects as the server's client once, as a VMM does (while the
    /// server still releases a previous client, this one waits in its
    /// backlog), and says nothing yet.
    fn connect(path: &Path) -> RawVmm {
        let stream = UnixStream::connect(path).expect("connect to the victim");
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("read timeout");
        RawVmm {
            stream,
            next_id: 1,
            mem: None,
        }
    }

    /// Connects and negotiates with `max_xfer`-byte transfers.
    fn negotiated(path: &Path, max_xfer: u32) -> RawVmm {
        let mut vmm = RawVmm::connect(path);
        vmm.call(Command::Version, &version_payload(max_xfer), &[]);
        vmm
    }

    fn id(&mut self) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Sends raw bytes, with `fds` attached to the first of them.
    fn send(&mut self, bytes: &[u8], fds: &[RawFd]) {
        let mut sent = 0;
        if !fds.is_empty() {
            sent = self
                .stream
                .send_with_fds(&[bytes], fds)
                .expect("sendmsg with fds");
        }
        self.stream.write_all(&bytes[sent..]).expect("send");
    }

    /// Sends a request; returns its id.
    fn request(&mut self, command: Command, payload: &[u8], fds: &[RawFd]) -> u16 {
        let id = self.id();
        self.send(&message(id, command, payload), fds);
        id
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        let mut hdr = [0u8; HEADER_SIZE];
        self.stream.read_exact(&mut hdr).expect("message header");
        let header = Header::decode(&hdr);
        let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
        self.stream
            .read_exact(&mut payload)
            .expect("message payload");
        (header, payload)
    }

    /// Answers a DMA_READ or DMA_WRITE of the server from [`ClientMem`].
    fn serve(&mut self, header: Header, payload: &[u8]) {
        let mem = self
            .mem
            .as_mut()
            .expect("DMA request without client memory");
        let addr = u64::from_le_bytes(payload[0..8].try_into().expect("8 bytes"));
        let count = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
        let off = (addr - mem.iova) as usize;
        let range = off..off + count as usize;
        let mut reply = payload[..16].to_vec();
        if header.command == Command::DmaRead as u16 {
            reply.extend_from_slice(&mem.bytes[range]);
        } else {
            assert_eq!(header.command, Command::DmaWrite as u16);
            mem.bytes[range].copy_from_slice(&payload[16..]);
        }
        mem.served += 1;
        let h = Header {
            msg_id: header.msg_id,
            command: header.command,
            msg_size: (HEADER_SIZE + reply.len()) as u32,
            flags: FLAG_TYPE_REPLY,
            error: 0,
        };
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&reply);
        self.send(&bytes, &[]);
    }

    /// Waits for the reply to `id`, answering the server's requests meanwhile.
    fn wait_reply(&mut self, id: u16) -> (Header, Vec<u8>) {
        loop {
            let (header, payload) = self.recv();
            if header.flags & 0xf == FLAG_TYPE_COMMAND {
                self.serve(header, &payload);
            } else if header.msg_id == id {
                return (header, payload);
            }
        }
    }

    /// Answers server requests until `n` more have been served.
    fn serve_requests(&mut self, n: usize) {
        let target = self.mem.as_ref().expect("client memory").served + n;
        while self.mem.as_ref().expect("client memory").served < target {
            let (header, payload) = self.recv();
            assert_eq!(header.flags & 0xf, FLAG_TYPE_COMMAND, "unexpected reply");
            self.serve(header, &payload);
        }
    }

    /// Sends a request and returns its reply's payload; panics on an error reply.
    fn call(&mut self, command: Command, payload: &[u8], fds: &[RawFd]) -> Vec<u8> {
        let id = self.request(command, payload, fds);
        let (header, reply) = self.wait_reply(id);
        assert_eq!(
            header.flags & FLAG_ERROR,
            0,
            "{command:?} failed: errno {}",
            header.error
        );
        reply
    }

    fn dma_map(&mut self, iova: u64, size: u64, fd: Option<RawFd>) {
        let fds: Vec<RawFd> = fd.into_iter().collect();
        self.call(Command::DmaMap, &dma_map_payload(iova, size), &fds);
    }

    fn reg_write_payload(off: u64, v: u32) -> Vec<u8> {
        region_access(abi::BAR_REGS, off, &v.to_le_bytes(), 4)
    }

    fn write_reg(&mut self, off: u64, v: u32) {
        self.call(Command::RegionWrite, &Self::reg_write_payload(off, v), &[]);
    }

    fn read_reg64(&mut self, off: u64) -> u64 {
        let reply = self.call(Command::RegionRead, &region_access(0, off, &[], 8), &[]);
        u64::from_le_bytes(reply[16..24].try_into().expect("8 bytes"))
    }
}

/// Whether this process still holds the memfd named `name`, open or mapped.
fn holds_memfd(name: &str) -> bool {
    let tag = format!("/memfd:{name} (deleted)");
    let open = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| target.to_string_lossy() == tag);
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    open || maps.lines().any(|l| l.ends_with(&tag))
}

/// Waits until the memfd named `name` is neither open nor mapped.
#[track_caller]
fn assert_released(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while holds_memfd(name) {
        assert!(
            Instant::now() < deadline,
            "the server still holds the memfd {name}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn memfd(name: &std::ffi::CStr, size: u64) -> File {
    vfio_user_server::memfd::create(name, size).expect("memfd")
}

// ---- a relay that can tear a connection ----------------------------------

/// Forwards bytes and fds from `from` to `to` until either side closes,
/// then shuts both.
fn relay(from: &UnixStream, to: &UnixStream) {
    let mut buf = vec![0u8; 64 << 10];
    let mut fds = [-1; 64];
    loop {
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: the iovec points at `buf`, valid for writes of its length.
        let Ok((n, nfds)) = (unsafe { from.recv_with_fds(&mut iov, &mut fds) }) else {
            break;
        };
        // SAFETY: recvmsg installed these fds for us; we own them now.
        let files: Vec<File> = fds[..nfds]
            .iter()
            .map(|&fd| unsafe { File::from_raw_fd(fd) })
            .collect();
        if n == 0 {
            break;
        }
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        let mut sent = 0;
        if !raw.is_empty() {
            match to.send_with_fds(&[&buf[..n]], &raw) {
                Ok(s) => sent = s,
                Err(_) => break,
            }
        }
        if (&*to).write_all(&buf[sent..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Stands between a kit guest and the victim, forwarding everything both
/// ways, until told to end the connection the way a VMM dying in the
/// middle of a message does.
struct Proxy {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// Guest side and server side of the latest connection.
    live: Arc<Mutex<Option<(UnixStream, UnixStream)>>>,
    thread: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Proxy {
    fn start(server: &Path) -> Proxy {
        let dir = TempDir::new_with_prefix("/tmp/vgpu-proxy-").expect("temporary directory");
        let path = dir.as_path().join("proxy.sock");
        let listener = UnixListener::bind(&path).expect("proxy socket");
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(None));
        let (server, flag, slot) = (server.to_path_buf(), stop.clone(), live.clone());
        let thread = std::thread::spawn(move || {
            let mut relays = Vec::new();
            // The kit reconnects while the server refuses it; each attempt
            // is a connection of its own.
            for conn in listener.incoming() {
                if flag.load(Ordering::Acquire) {
                    break;
                }
                let Ok(guest) = conn else { continue };
                let Ok(upstream) = UnixStream::connect(&server) else {
                    continue;
                };
                let clones = (
                    guest.try_clone().expect("dup"),
                    upstream.try_clone().expect("dup"),
                );
                let back = (
                    guest.try_clone().expect("dup"),
                    upstream.try_clone().expect("dup"),
                );
                *slot.lock().expect("proxy state") = Some(clones);
                relays.push(std::thread::spawn(move || relay(&guest, &upstream)));
                relays.push(std::thread::spawn(move || relay(&back.1, &back.0)));
            }
            for r in relays {
                let _ = r.join();
            }
        });
        Proxy {
            path,
            stop,
            live,
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn connect(&self) -> Guest {
        Guest::connect(&self.path, Default::default())
    }

    /// Sends `torn` (with `fds`) to the server in the guest's place and
    /// ends the connection once the server waits for the rest.
    fn cut(&self, torn: &[u8], fds: &[RawFd]) {
        let (guest, server) = self
            .live
            .lock()
            .expect("proxy state")
            .take()
            .expect("a live connection");
        let mut sent = 0;
        if !fds.is_empty() {
            sent = server.send_with_fds(&[torn], fds).expect("sendmsg");
        }
        (&server).write_all(&torn[sent..]).expect("torn message");
        std::thread::sleep(Duration::from_millis(20));
        let _ = server.shutdown(Shutdown::Both);
        let _ = guest.shutdown(Shutdown::Both);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Ok(mut live) = self.live.lock() {
            if let Some((g, s)) = live.take() {
                let _ = g.shutdown(Shutdown::Both);
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wakes the accept loop.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- the VMM going away ------------------------------------------------------

#[test]
fn test_vmm_gone_before_version() {
    let h = Host::new("v-version");
    let version = message(1, Command::Version, &version_payload(1 << 20));
    let torn: [&[u8]; 3] = [
        // Connected, then gone without a word.
        &[],
        // Half a header.
        &version[..HEADER_SIZE / 2],
        // A header and half its capabilities.
        &version[..HEADER_SIZE + 20],
    ];
    for bytes in torn {
        let mut vmm = RawVmm::connect(h.path());
        vmm.send(bytes, &[]);
        drop(vmm);
        drop(h.reconnect());
    }
    h.finish();
}

#[test]
fn test_vmm_gone_after_version() {
    let h = Host::new("v-versd");
    let read = message(7, Command::RegionRead, &region_access(0, 0, &[], 4));
    let write = message(
        8,
        Command::RegionWrite,
        &RawVmm::reg_write_payload(abi::REG_CONTROL, abi::CONTROL_ENABLE),
    );
    let torn: [&[u8]; 3] = [
        &[],
        &read[..HEADER_SIZE - 1],
        &write[..HEADER_SIZE + write.len() / 3],
    ];
    for bytes in torn {
        let mut vmm = RawVmm::negotiated(h.path(), 1 << 20);
        vmm.send(bytes, &[]);
        drop(vmm);
        drop(h.reconnect());
    }
    h.finish();
}

#[test]
fn test_vmm_gone_after_dma_maps() {
    let h = Host::new("v-maps");
    // Memory shared by fd and memory without, the function enabled.
    let ram = memfd(c"vgpu-fault-mapped", 4 * MIB);
    let mut vmm = RawVmm::negotiated(h.path(), 1 << 20);
    vmm.dma_map(1 << 32, 4 * MIB, Some(ram.as_raw_fd()));
    vmm.dma_map(2 << 32, 4 * MIB, None);
    vmm.write_reg(abi::REG_CONTROL, abi::CONTROL_ENABLE);
    drop(ram);
    assert!(holds_memfd("vgpu-fault-mapped"), "the server maps it");
    drop(vmm);
    assert_released("vgpu-fault-mapped");
    drop(h.reconnect());

    // A DMA_MAP torn after its header, its fd attached.
    let torn = memfd(c"vgpu-fault-torn-map", 4 * MIB);
    let mut vmm = RawVmm::negotiated(h.path(), 1 << 20);
    vmm.dma_map(1 << 32, 4 * MIB, None);
    let map = message(9, Command::DmaMap, &dma_map_payload(2 << 32, 4 * MIB));
    vmm.send(&map[..HEADER_SIZE + 8], &[torn.as_raw_fd()]);
    drop(torn);
    drop(vmm);
    assert_released("vgpu-fault-torn-map");
    drop(h.reconnect());
    h.finish();
}

#[test]
fn test_vmm_gone_mid_message_with_work_running() {
    let h = Host::new("v-torn");
    let read = message(0x77, Command::RegionRead, &region_access(0, 0, &[], 4));
    let write = message(
        0x78,
        Command::RegionWrite,
        &RawVmm::reg_write_payload(abi::REG_WAKE, 0),
    );
    let map = message(0x79, Command::DmaMap, &dma_map_payload(8 << 32, MIB));
    for round in 0..3 {
        let proxy = Proxy::start(h.path());
        let mut g = proxy.connect();
        load(&mut g, round);
        let t = Instant::now();
        match round {
            0 => proxy.cut(&read[..5], &[]),
            1 => proxy.cut(&write[..HEADER_SIZE + 10], &[]),
            _ => {
                let f = memfd(c"vgpu-fault-torn-proxied", MIB);
                proxy.cut(&map[..HEADER_SIZE + 12], &[f.as_raw_fd()]);
            }
        }
        drop(g);
        drop(h.reconnect());
        let took = t.elapsed();
        eprintln!("round {round}: ready again {took:?} after the cut");
        assert!(took < RECONNECT, "round {round}: {took:?} to recover");
        drop(proxy);
    }
    assert_released("vgpu-fault-torn-proxied");
    h.finish();
}

#[test]
fn test_vmm_gone_with_commands_in_flight() {
    let h = Host::new("v-flight");
    for round in 0..3 {
        let mut g = h.victim.connect();
        load(&mut g, [0, 1, 3][round]);
        let before = used_indices(&mut g, VICTIM_QUEUES);
        let t = Instant::now();
        if round == 1 {
            // Gone without closing: the socket is shut under it.
            g.client().shutdown().expect("shutdown");
        }
        drop(g);
        drop(h.reconnect());
        let took = t.elapsed();
        eprintln!("round {round}: used {before:?} at the drop, ready again after {took:?}");
        assert!(took < RECONNECT, "round {round}: {took:?} to recover");
    }
    h.finish();
}

/// A raw VMM with a ring in memory shared by fd and 1 MiB of memory shared
/// without, that has started a COPY of that memory to the device and
/// answered a few of the device's DMA_READs (4 KiB each). The COPY waits
/// for the next answer.
fn copy_waiting_on_vmm_dma(h: &Host) -> RawVmm {
    const RINGS: u64 = 1 << 32;
    const MEM: u64 = 2 << 32;
    const SIZE: u64 = MIB;
    let rings = memfd(c"vgpu-fault-dma-rings", 64 << 10);
    let mut vmm = RawVmm::negotiated(h.path(), 4096);
    vmm.mem = Some(ClientMem {
        iova: MEM,
        bytes: Rng(0xd4a).bytes(SIZE as usize),
        served: 0,
    });
    vmm.dma_map(RINGS, 64 << 10, Some(rings.as_raw_fd()));
    vmm.dma_map(MEM, SIZE, None);
    vmm.write_reg(abi::REG_CONTROL, abi::CONTROL_ENABLE);
    let (desc, avail, used) = (RINGS, RINGS + 0x1000, RINGS + 0x2000);
    for (reg, v) in [
        (abi::QREG_SIZE, 16),
        (abi::QREG_DESC, desc as u32),
        (abi::QREG_DESC + 4, (desc >> 32) as u32),
        (abi::QREG_AVAIL, avail as u32),
        (abi::QREG_AVAIL + 4, (avail >> 32) as u32),
        (abi::QREG_USED, used as u32),
        (abi::QREG_USED + 4, (used >> 32) as u32),
        (abi::QREG_CONTROL, abi::QCONTROL_ENABLE),
    ] {
        vmm.write_reg(abi::queue_reg(0, reg), v);
    }
    let put =
        |addr: u64, bytes: &[u8]| rings.write_all_at(bytes, addr - RINGS).expect("ring write");
    let desc_entry = |i: u16, addr: u64, len: u32, flags: u16, next: u16| {
        let d = vgpu_testkit::VirtqDesc {
            addr,
            len,
            flags,
            next,
        };
        put(desc + 16 * u64::from(i), &d.to_bytes());
    };
    use vgpu_testkit::ring::{VRING_DESC_F_NEXT as NEXT, VRING_DESC_F_WRITE as WRITE};
    let publish = |vmm: &mut RawVmm, n: u16, head: u16| {
        put(avail + 4 + 2 * u64::from(n - 1), &head.to_le_bytes());
        put(avail + 2, &n.to_le_bytes());
        vmm.write_reg(abi::REG_WAKE, 0);
    };
    let used_idx = || {
        let mut b = [0u8; 2];
        rings
            .read_exact_at(&mut b, used + 2 - RINGS)
            .expect("ring read");
        u16::from_le_bytes(b)
    };

    // MEM_ALLOC of the copy's destination.
    let alloc = abi::MemAllocCmd {
        hdr: CmdHeader {
            opcode: abi::OP_MEM_ALLOC,
            flags: 0,
        },
        size: SIZE,
        align: 0,
    };
    put(RINGS + 0x3000, alloc.as_slice());
    desc_entry(0, RINGS + 0x3000, alloc.as_slice().len() as u32, NEXT, 1);
    desc_entry(1, RINGS + 0x4000, 32, WRITE, 0);
    publish(&mut vmm, 1, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while used_idx() != 1 {
        assert!(Instant::now() < deadline, "MEM_ALLOC did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut c = abi::Completion::default();
    rings
        .read_exact_at(c.as_mut_slice(), 0x4000)
        .expect("completion");
    assert_status(c, abi::STATUS_OK);

    // COPY guest -> device of the memory shared without an fd.
    let copy = abi::CopyCmd {
        hdr: CmdHeader {
            opcode: abi::OP_COPY,
            flags: 0,
        },
        src_kind: abi::COPY_GUEST,
        dst_kind: abi::COPY_DEVICE,
        src: 0,
        dst: c.result,
        size: SIZE,
        sg_count: 1,
        reserved: 0,
    };
    let sg = SgEntry {
        addr: MEM,
        len: SIZE,
    };
    put(RINGS + 0x3100, copy.as_slice());
    put(RINGS + 0x3200, sg.as_slice());
    desc_entry(2, RINGS + 0x3100, copy.as_slice().len() as u32, NEXT, 3);
    desc_entry(3, RINGS + 0x3200, 16, NEXT, 4);
    desc_entry(4, RINGS + 0x4100, 32, WRITE, 0);
    publish(&mut vmm, 2, 2);
    vmm.serve_requests(8);
    assert_eq!(used_idx(), 1, "the copy is still running");
    vmm
}

#[test]
fn test_vmm_gone_while_a_copy_waits_on_its_dma() {
    let h = Host::new("v-dmagone");
    let vmm = copy_waiting_on_vmm_dma(&h);
    let t = Instant::now();
    drop(vmm);
    drop(h.reconnect());
    let took = t.elapsed();
    assert!(took < RECONNECT, "{took:?} to recover");
    h.finish();
}

/// Sends `reg = value` while a copy waits for a DMA_READ answer, answers
/// the device's requests until the write's reply arrives and returns how
/// long that took.
fn write_while_a_copy_waits_on_dma(h: &Host, reg: u64, value: u32) -> Duration {
    let mut vmm = copy_waiting_on_vmm_dma(h);
    let t = Instant::now();
    let id = vmm.request(
        Command::RegionWrite,
        &RawVmm::reg_write_payload(reg, value),
        &[],
    );
    let (header, _) = vmm.wait_reply(id);
    let took = t.elapsed();
    assert_eq!(header.flags & FLAG_ERROR, 0);
    if reg == abi::REG_CONTROL {
        assert_eq!(vmm.read_reg64(abi::REG_MEM_USED), 0);
    }
    took
}

#[test]
fn test_reset_while_a_copy_waits_on_vmm_dma() {
    let h = Host::new("v-dmarst");
    let took = write_while_a_copy_waits_on_dma(&h, abi::REG_CONTROL, abi::CONTROL_RESET);
    assert!(took < PROMPT, "CONTROL_RESET took {took:?}");
    h.finish();
}

#[test]
fn test_queue_disable_while_a_copy_waits_on_vmm_dma() {
    let h = Host::new("v-dmaqdis");
    let took = write_while_a_copy_waits_on_dma(&h, abi::queue_reg(0, abi::QREG_CONTROL), 0);
    assert!(took < PROMPT, "disabling the queue took {took:?}");
    h.finish();
}

// ---- memory unmapped under running commands ------------------------------

/// Guest address of the extra mapping of the unmap tests.
const DATA_IOVA: u64 = 0x40_0000_0000;
/// Its size.
const DATA_SIZE: u64 = 16 * MIB;
/// Bytes of one download.
const SLICE: u64 = 512 << 10;

#[test]
fn test_unmap_of_guest_memory_under_running_copies_faults_them() {
    let h = Host::new("v-unmap");
    let mut g = h.victim.connect();
    g.setup_queue(0, 256, Mode::Interrupt);
    let data = memfd(c"vgpu-fault-data", DATA_SIZE);
    g.client()
        .dma_map(0, DATA_IOVA, DATA_SIZE, data.as_raw_fd())
        .expect("DMA_MAP");
    let content = Rng(0xda7a).bytes(SLICE as usize);
    let dev = g.device_alloc(0, SLICE);
    g.upload(0, dev, &content);
    let dim = 128;
    let side = u64::from(dim * dim * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(0, side)).collect();
    // Downloads into slices of the extra mapping, a matrix product after each.
    let n = DATA_SIZE / SLICE;
    let product = sgemm_chain(m[2], m[0], m[1], dim);
    for i in 0..n {
        let sg = [SgEntry {
            addr: DATA_IOVA + i * SLICE,
            len: SLICE,
        }];
        g.post(
            0,
            &copy_chain(abi::COPY_DEVICE, abi::COPY_GUEST, dev, 0, &sg),
        );
        g.post(0, &product);
    }
    g.kick(0);
    let first = g.wait_used(0, Duration::from_secs(10)).expect("first copy");
    assert_status(first.completion(), abi::STATUS_OK);
    let t = Instant::now();
    g.client()
        .dma_unmap(DATA_IOVA, DATA_SIZE)
        .expect("DMA_UNMAP");
    let took = t.elapsed();
    assert!(took < PROMPT, "DMA_UNMAP took {took:?}");

    // Every command completes, in order: copies that ran before the unmap
    // with their data, those after it with FAULT; the products all run.
    let mut statuses = vec![first.completion().status];
    for i in 1..2 * n {
        let u = g
            .wait_used(0, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("command {i} did not complete"));
        let c = u.completion();
        if i % 2 == 1 {
            assert_status(c, abi::STATUS_OK);
        } else {
            statuses.push(c.status);
        }
    }
    let ok = statuses
        .iter()
        .take_while(|s| **s == abi::STATUS_OK)
        .count();
    eprintln!("{ok} of {n} copies ran before the unmap landed");
    assert!(ok < statuses.len(), "no copy ran after the unmap");
    assert!(
        statuses[ok..].iter().all(|s| *s == abi::STATUS_FAULT),
        "copies after the unmap: {statuses:?}"
    );
    for i in 0..ok as u64 {
        let mut got = vec![0u8; SLICE as usize];
        data.read_exact_at(&mut got, i * SLICE).expect("read");
        assert!(got == content, "copy {i} wrote wrong data");
    }
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED, "the queue runs on");
    assert_eq!(g.error_count(), 0);

    // Mapped again, the same copy works.
    g.client()
        .dma_map(0, DATA_IOVA, DATA_SIZE, data.as_raw_fd())
        .expect("DMA_MAP");
    let sg = [SgEntry {
        addr: DATA_IOVA + DATA_SIZE - SLICE,
        len: SLICE,
    }];
    assert_status(g.copy_from_device(0, dev, &sg), abi::STATUS_OK);
    let mut got = vec![0u8; SLICE as usize];
    data.read_exact_at(&mut got, DATA_SIZE - SLICE)
        .expect("read");
    assert!(got == content);
    h.finish();
}

#[test]
fn test_unmap_of_the_rings_under_running_copies_stops_the_queue() {
    let h = Host::new("v-unrings");
    let mut g = h.victim.connect();
    g.setup_queue(0, 256, Mode::Interrupt);
    let content = Rng(0xf00d).bytes(SLICE as usize);
    let dev = g.device_alloc(0, SLICE);
    g.upload(0, dev, &content);
    let dim = 128;
    let side = u64::from(dim * dim * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(0, side)).collect();
    let buf = g.alloc(SLICE, 4096);
    let sg = [SgEntry {
        addr: buf,
        len: SLICE,
    }];
    let download = copy_chain(abi::COPY_DEVICE, abi::COPY_GUEST, dev, 0, &sg);
    let product = sgemm_chain(m[2], m[0], m[1], dim);
    for _ in 0..32 {
        g.post(0, &download);
        g.post(0, &product);
    }
    g.kick(0);
    let first = g.wait_used(0, Duration::from_secs(10)).expect("first copy");
    assert_status(first.completion(), abi::STATUS_OK);
    g.clear_irqs();
    let t = Instant::now();
    g.unmap_ram();
    let took = t.elapsed();
    assert!(took < PROMPT, "DMA_UNMAP took {took:?}");

    // The device can reach neither the commands nor the used ring: the
    // queue stops with ERR_RING_ADDRESS and nothing more is completed.
    assert!(
        eventually(&mut g, |g| g.queue_status(0) & abi::QSTATUS_ERROR != 0),
        "the queue did not stop"
    );
    assert_eq!(g.queue_error(0), abi::ERR_RING_ADDRESS);
    let log = g.errors_since(0);
    assert!(
        log.iter()
            .any(|e| (e.code, e.queue) == (abi::ERR_RING_ADDRESS, 0)),
        "{log:?}"
    );
    assert!(g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(5)));
    let used = g.ring_used_idx(0);
    std::thread::sleep(QUIET);
    assert_eq!(g.ring_used_idx(0), used, "completions after the unmap");
    assert!(h.victim.alive());

    // Mapped again and the queue set up anew, the function works, and
    // device memory was not touched.
    g.map_ram();
    g.disable_queue(0);
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_eq!(g.download(0, dev, SLICE as usize), content);
    h.finish();
}

// ---- resets under load -------------------------------------------------------

fn reset_under_load(name: &str, reset: fn(&mut Guest)) {
    let h = Host::new(name);
    let mut g = h.victim.connect();
    for round in 0..2 {
        load(&mut g, 2 * round);
        let t = Instant::now();
        reset(&mut g);
        let took = t.elapsed();
        eprintln!("round {round}: reset took {took:?}");
        assert!(took < PROMPT, "round {round}: reset took {took:?}");
        assert_eq!(g.mem_used(), 0, "device memory freed");
        assert_eq!(g.read32(abi::REG_STATUS), 0);
        for q in 0..VICTIM_QUEUES {
            assert_eq!(g.queue_status(q), 0, "queue {q} stopped");
        }
        g.enable_device();
        assert_fresh(&mut g);
        assert_works(&mut g);
    }
    h.finish();
}

#[test]
fn test_control_reset_under_load() {
    reset_under_load("v-creset", |g| g.control_reset());
}

#[test]
fn test_device_reset_under_load() {
    reset_under_load("v-dreset", |g| g.device_reset());
}

#[test]
fn test_queue_disable_under_load() {
    let h = Host::new("v-qdis");
    let mut g = h.victim.connect();
    load(&mut g, 1);
    for q in 0..VICTIM_QUEUES {
        let t = Instant::now();
        g.disable_queue(q);
        let took = t.elapsed();
        assert!(took < PROMPT, "disabling queue {q} took {took:?}");
        assert_eq!(g.queue_status(q), 0);
    }
    // The memory stays; the queues come back.
    assert!(g.mem_used() > 0);
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
    h.finish();
}

#[test]
fn test_queue_disable_as_the_worker_takes_a_batch() {
    let h = Host::new("v-qtake");
    let mut g = h.victim.connect();
    g.setup_queue(1, 64, Mode::Interrupt);
    let dim = 96;
    let side = u64::from(dim * dim * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(1, side)).collect();
    // Products whose chains carry 29 descriptors the command ignores: 32
    // of them fill a ring of 1024 and take the worker a while to pop.
    let pad = g.alloc(64, 64);
    let product = {
        let p = abi::SgemmParams {
            c: m[2],
            a: m[0],
            b: m[1],
            m: dim,
            n: dim,
            k: dim,
            reserved: 0,
            alpha: 1.0,
            beta: 0.5,
        };
        let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
        let mut chain = Chain::command(&cmd).bytes(p.as_slice());
        for _ in 0..29 {
            chain = chain.read(pad, 4);
        }
        chain.completion()
    };
    // The disable comes at a different moment after the kick each round,
    // some of them while the worker takes the batch from the ring. The
    // command running when it lands may complete; nothing after it.
    let mut ran = Vec::new();
    for round in 0..24 {
        g.setup_queue(0, 1024, Mode::Interrupt);
        let ring = g.layout(0);
        for _ in 0..32 {
            g.post(0, &product);
        }
        g.kick(0);
        std::thread::sleep(Duration::from_micros(25 * round));
        g.disable_queue(0);
        ran.push(g.ram().load_u16(ring.used_idx(), Ordering::Acquire));
    }
    eprintln!("products completed per round: {ran:?}");
    assert!(
        ran.iter().all(|&n| n <= 2),
        "commands kept running after their queue was disabled: {ran:?}"
    );
    assert_status(g.nop(1), abi::STATUS_OK);
    h.finish();
}

// ---- misbehaving drivers -------------------------------------------------------

#[test]
fn test_doorbell_storm_without_work() {
    let h = Host::new("v-storm");
    let mut g = h.victim.connect();
    g.setup_queue(0, 64, Mode::Polled);
    g.setup_queue(1, 64, Mode::Interrupt);
    let doorbells = g.map_doorbells();
    let wake = h.victim.wake_ioeventfd();
    let stop = AtomicBool::new(false);
    let mut rng = Rng(0x5707);
    let dev = g.device_alloc(0, 64 << 10);
    let mut slowest = Duration::ZERO;
    let mut commands = 1;
    let storms = std::thread::scope(|s| {
        // Another vCPU rings every doorbell with made-up indices and
        // signals the WAKE ioeventfd, in a tight loop, posting nothing.
        let storm = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for q in 0..abi::MAX_QUEUES {
                    doorbells.set_avail_idx(q, n as u32 ^ q);
                }
                let _ = wake.write(1);
                n += 1;
            }
            n
        });
        // Meanwhile the driver's own work goes on, on both queues.
        for i in 0..60 {
            let q = i % 2;
            let data = rng.bytes(64 << 10);
            let t = Instant::now();
            g.upload(q, dev, &data);
            assert_eq!(g.download(q, dev, data.len()), data);
            assert_status(g.nop(q), abi::STATUS_OK);
            slowest = slowest.max(t.elapsed() / 3);
            commands += 3;
        }
        // Trapped WAKE writes through the socket, too.
        for _ in 0..2000 {
            g.write32(abi::REG_WAKE, 0);
        }
        assert_status(g.nop(1), abi::STATUS_OK);
        commands += 1;
        stop.store(true, Ordering::Relaxed);
        storm.join().expect("storm thread")
    });
    eprintln!("{storms} doorbell rounds; slowest command {slowest:?}");
    assert!(slowest < STALL);
    assert_eq!(g.commands(), commands, "no command made up");
    assert_eq!(g.error_count(), 0);
    for q in 0..2 {
        assert_eq!(g.queue_status(q), abi::QSTATUS_ENABLED);
    }
    // Once the storm is over the function goes idle.
    let spent = h.idle_cpu(Duration::from_millis(400));
    assert!(
        spent < Duration::from_millis(100),
        "idle worker used {spent:?}"
    );
    h.finish();
}

#[test]
fn test_guest_that_never_reads_its_completions() {
    let h = Host::new("v-noread");
    let mut g = h.victim.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    g.setup_queue(1, 16, Mode::Interrupt);
    g.set_wake_policy(WakePolicy::Always);
    // NOPs of one descriptor (no completion buffer): 16 fill the ring.
    let nop = Chain::command(&CmdHeader::default());
    let heads: Vec<u16> = (0..16).map(|_| g.post(0, &nop)).collect();
    g.kick(0);
    assert!(eventually(&mut g, |g| g.ring_used_idx(0) == 16));

    // The used ring is full of completions nobody reads; the driver keeps
    // kicking.
    for _ in 0..500 {
        g.kick(0);
    }
    std::thread::sleep(QUIET);
    assert_eq!(g.ring_used_idx(0), 16);
    assert_eq!(g.commands(), 16);
    assert_eq!(g.error_count(), 0);

    // It posts the same chains again and again without reading what came
    // back, never more than the ring holds ahead of the device: the used
    // ring wraps over unread entries, and that is the driver's business.
    let reposts = 2000u16;
    let mut posted = 16u16;
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..reposts {
        while posted.wrapping_sub(g.ring_used_idx(0)) >= 16 {
            assert!(Instant::now() < deadline, "the device stopped consuming");
            std::thread::yield_now();
        }
        g.ring_push_head(0, heads[usize::from(i) % 16]);
        posted = posted.wrapping_add(1);
        g.kick(0);
    }
    assert!(eventually(&mut g, |g| g.ring_used_idx(0) == posted));
    assert_eq!(g.commands(), 16 + u64::from(reposts));
    assert_eq!(g.error_count(), 0);
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
    assert_status(g.nop(1), abi::STATUS_OK);

    // Then more than the ring holds: that queue stops, the other does not.
    g.ring_set_avail_idx(0, posted.wrapping_add(17));
    g.kick(0);
    assert!(eventually(&mut g, |g| g.queue_status(0)
        & abi::QSTATUS_ERROR
        != 0));
    assert_eq!(g.queue_error(0), abi::ERR_RING_CORRUPT);
    assert_status(g.nop(1), abi::STATUS_OK);
    assert_eq!(g.ring_used_idx(0), posted, "nothing of the bad batch ran");
    h.finish();
}

#[test]
fn test_queue_in_memory_that_goes_away() {
    const RINGS: u64 = 0x50_0000_0000;
    let h = Host::new("v-qgone");
    let mut g = h.victim.connect();
    g.setup_queue(1, 16, Mode::Interrupt);
    g.set_wake_policy(WakePolicy::Always);
    let doorbells = g.map_doorbells();

    // Rings outside every mapping: refused when enabled; kicks at the
    // queue change nothing.
    let nowhere = g.unmapped_addr();
    let status = g.enable_queue_raw(
        0,
        16,
        nowhere,
        nowhere + 0x1000,
        nowhere + 0x2000,
        abi::QCONTROL_ENABLE,
    );
    assert_eq!(
        status & (abi::QSTATUS_ENABLED | abi::QSTATUS_ERROR),
        abi::QSTATUS_ERROR
    );
    assert_eq!(g.queue_error(0), abi::ERR_RING_ADDRESS);
    assert_eq!(g.error_count(), 1);
    for i in 0..300 {
        doorbells.set_avail_idx(0, i);
        g.write32(abi::REG_WAKE, 0);
    }
    assert_eq!(g.error_count(), 1, "kicks at a stopped queue log nothing");
    assert_status(g.nop(1), abi::STATUS_OK);
    g.disable_queue(0);

    // Rings in a mapping of their own, which the VMM removes under the
    // running (polled) queue: one error, however much the driver kicks.
    let rings = memfd(c"vgpu-fault-rings", 64 << 10);
    g.client()
        .dma_map(0, RINGS, 64 << 10, rings.as_raw_fd())
        .expect("DMA_MAP");
    let control = abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED;
    let status = g.enable_queue_raw(0, 16, RINGS, RINGS + 0x1000, RINGS + 0x2000, control);
    assert_eq!(status, abi::QSTATUS_ENABLED);
    g.client().dma_unmap(RINGS, 64 << 10).expect("DMA_UNMAP");
    for i in 0..300 {
        doorbells.set_avail_idx(0, i);
        g.write32(abi::REG_WAKE, 0);
    }
    assert!(eventually(&mut g, |g| g.queue_status(0)
        & abi::QSTATUS_ERROR
        != 0));
    assert_eq!(g.queue_error(0), abi::ERR_RING_ADDRESS);
    assert_eq!(g.error_count(), 2, "{:?}", g.errors_since(0));
    assert_status(g.nop(1), abi::STATUS_OK);
    let spent = h.idle_cpu(Duration::from_millis(400));
    assert!(
        spent < Duration::from_millis(100),
        "idle worker used {spent:?}"
    );

    // Mapped again, the queue comes back.
    g.disable_queue(0);
    g.client()
        .dma_map(0, RINGS, 64 << 10, rings.as_raw_fd())
        .expect("DMA_MAP");
    let status = g.enable_queue_raw(0, 16, RINGS, RINGS + 0x1000, RINGS + 0x2000, control);
    assert_eq!(status, abi::QSTATUS_ENABLED);
    g.disable_queue(0);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
    h.finish();
}

#[test]
fn test_disabled_function_with_queued_work_sleeps() {
    let h = Host::new("v-disabled");
    let mut g = h.victim.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    g.set_wake_policy(WakePolicy::Always);
    assert_status(g.nop(0), abi::STATUS_OK);
    // The driver clears enable with a command queued behind it.
    g.write32(abi::REG_CONTROL, 0);
    g.post(0, &nop_chain());
    g.kick(0);
    // A spinning worker gets its share of a core even beside other
    // tests; a sleeping one uses nothing.
    let spent = h.idle_cpu(Duration::from_secs(1));
    assert_eq!(g.ring_used_idx(0), 1, "nothing runs while disabled");
    // Enabled again, the queued command runs.
    g.enable_device();
    let used = g.wait_used(0, Duration::from_secs(5)).expect("completion");
    assert_status(used.completion(), abi::STATUS_OK);
    assert!(
        spent < Duration::from_millis(50),
        "a disabled function's worker used {spent:?} of CPU in 1 s"
    );
    h.finish();
}

/// Counts warnings of the device named `LOG_VICTIM`.
struct CountingLogger;

const LOG_VICTIM: &str = "v-logs";
static WARNINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl log::Log for CountingLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn && r.args().to_string().starts_with(LOG_VICTIM) {
            WARNINGS.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn flush(&self) {}
}

#[test]
fn test_register_abuse_does_not_flood_the_host_log() {
    static LOGGER: CountingLogger = CountingLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let h = Host::new(LOG_VICTIM);
    let mut g = h.victim.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    // Ring registers of a running queue are read-only: each write is an
    // ERR_REGISTER, counted in BAR0.
    let t = Instant::now();
    for _ in 0..2000 {
        g.qwrite32(0, abi::QREG_SIZE, 16);
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(g.error_count(), 2000);
    let lines = WARNINGS.load(Ordering::Relaxed);
    // The engine's budget: 20 lines a second per device, and a line on
    // what it suppressed.
    let budget = 20 * (secs.ceil() as u64 + 1) + 2;
    assert!(
        lines <= budget,
        "{lines} host log warnings in {secs:.2} s (budget {budget})"
    );
    h.finish();
}

// ---- quotas ----------------------------------------------------------------------

/// Allocates until NO_MEMORY, then exactly what is left, twice over, with
/// each allocation written and read back; then frees everything and uses
/// the whole quota at once.
fn exhaust(server: &TestVgpu, quota: u64, seed: u64) {
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let mut rng = Rng(seed);
    for round in 0..2 {
        let mut live: Vec<(u64, u64)> = Vec::new();
        loop {
            let size = (64 << 10) + (rng.next_u64() % MIB) / 4 * 4;
            let c = g.mem_alloc(0, size, 0);
            match c.status {
                abi::STATUS_OK => live.push((c.result, size)),
                abi::STATUS_NO_MEMORY => {
                    assert!(quota - g.mem_used() < size);
                    break;
                }
                s => panic!("MEM_ALLOC: status {s}"),
            }
        }
        let used: u64 = live.iter().map(|(_, s)| s).sum();
        assert_eq!(g.mem_used(), used, "seed {seed} round {round}");
        if used < quota {
            let rest = quota - used;
            let c = g.mem_alloc(0, rest, 4);
            assert_status(c, abi::STATUS_OK);
            live.push((c.result, rest));
        }
        assert_eq!(g.mem_used(), quota);
        assert_status(g.mem_alloc(0, 1, 0), abi::STATUS_NO_MEMORY);
        for (i, &(addr, size)) in live.iter().enumerate() {
            let tag = (seed as u32) << 16 | i as u32;
            assert_status(g.fill(0, addr, size / 4 * 4, tag), abi::STATUS_OK);
        }
        for (i, &(addr, size)) in live.iter().enumerate() {
            let tag = ((seed as u32) << 16 | i as u32).to_le_bytes();
            let tail = g.download(0, addr + size / 4 * 4 - 4, 4);
            assert_eq!(tail, tag, "allocation {i} of tenant {seed}");
        }
        for &(addr, _) in &live {
            assert_status(g.mem_free(0, addr), abi::STATUS_OK);
        }
        assert_eq!(g.mem_used(), 0);
    }
    let all = g.device_alloc(0, quota);
    let data = rng.bytes(256 << 10);
    g.upload(0, all + quota - data.len() as u64, &data);
    assert_eq!(
        g.download(0, all + quota - data.len() as u64, data.len()),
        data
    );
    assert_status(g.mem_free(0, all), abi::STATUS_OK);
}

#[test]
fn test_every_tenant_exhausts_its_quota_at_once() {
    const TENANTS: u64 = 4;
    const QUOTA: u64 = 8 * MIB;
    let backend = SoftwareBackend::new(TENANTS * QUOTA + BYSTANDER_MEMORY, 1 + TENANTS as u32);
    let bystander = Bystander::start(&backend);
    let servers: Vec<TestVgpu> = (0..TENANTS)
        .map(|i| {
            let name = format!("quota{i}");
            TestVgpu::start(
                test_config(&name, 1),
                software_partition(&backend, &name, QUOTA, 1),
            )
        })
        .collect();
    std::thread::scope(|s| {
        for (i, server) in servers.iter().enumerate() {
            s.spawn(move || exhaust(server, QUOTA, 1 + i as u64));
        }
    });
    assert_eq!(backend.unclaimed().memory, 0);
    let stats = bystander.finish();
    eprintln!("bystander: {stats:?}");
}
