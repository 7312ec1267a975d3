//! Engine benchmarks, printed as a table:
//!
//! 1. REGION_WRITE round trip: a client writes 4 bytes to the sample
//!    device's BAR0 SCRATCH register through a real [`Endpoint`] on a real
//!    UNIX socket and waits for the reply, against a bare blocking
//!    ping-pong between two threads with the same message sizes (36-byte
//!    request, 32-byte reply) and the same client code.
//! 2. DMA read throughput: [`DmaSpace::read`] from a memfd mapped into the
//!    DMA table, against `copy_from_slice` from a plain mapping of the same
//!    memfd into the same destination buffer.
//!
//! Variants run alternately in rounds, so that machine noise hits each
//! alike. Run with
//!
//! ```text
//! cargo bench -p vfio-user-server --bench engine
//! ```
//!
//! `BENCH_QUICK=1` runs every part briefly. The smoke run, `cargo bench
//! -p vfio-user-server --bench engine -- --test` (or `cargo test -p
//! vfio-user-server --bench engine`, which runs the binary without
//! `--bench`), runs every part for a fraction of a second and exits
//! non-zero if one panics or measures nothing (a ratio without a
//! baseline); CI runs every benchmark so.

use std::fs::File;
use std::hint::black_box;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfio_user_server::device::BAR0_REGION;
use vfio_user_server::dma::{ClientDma, DmaError, DmaSpace, MapRequest};
use vfio_user_server::proto::{
    Command, Header, FLAG_ERROR, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY, HEADER_SIZE,
};
use vfio_user_server::sample::{regs, SampleDevice};
use vfio_user_server::Endpoint;
use vgpu_benchkit::{measure_rounds, ratio, summarize, Bench, Mode, Summary, Target, KIB, MIB};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;

/// REGION_WRITE of 4 bytes: header, offset, region, count, data.
const REQ_SIZE: usize = HEADER_SIZE + 16 + 4;
/// Its reply: header, then offset, region and count echoed.
const REPLY_SIZE: usize = HEADER_SIZE + 16;

const DMA_SIZES: [usize; 4] = [4 * KIB, 64 * KIB, MIB, 16 * MIB];
const DMA_IOVA: u64 = 0x1_0000_0000;
const PAGE: usize = 4096;

const TARGET_RTT_RATIO: f64 = 1.5;
const TARGET_DMA_RATIO: f64 = 0.90;

struct Config {
    rtt_rounds: usize,
    rtt_batch: usize,
    rtt_warmup: usize,
    dma_rounds: usize,
    /// Bytes each variant copies per size per round (at least `dma_min_samples` samples).
    dma_bytes_per_round: usize,
    dma_min_samples: usize,
}

impl Config {
    fn new(mode: Mode) -> Self {
        match mode {
            Mode::Full => Config {
                rtt_rounds: 40,
                rtt_batch: 2500,
                rtt_warmup: 5000,
                dma_rounds: 40,
                dma_bytes_per_round: 32 * MIB,
                dma_min_samples: 4,
            },
            Mode::Quick => Config {
                rtt_rounds: 4,
                rtt_batch: 250,
                rtt_warmup: 200,
                dma_rounds: 3,
                dma_bytes_per_round: 2 * MIB,
                dma_min_samples: 2,
            },
            Mode::Smoke => Config {
                rtt_rounds: 2,
                rtt_batch: 50,
                rtt_warmup: 20,
                dma_rounds: 1,
                dma_bytes_per_round: 256 * KIB,
                dma_min_samples: 1,
            },
        }
    }
}

// ---------------------------------------------------------------------------
// Round trip

/// An endpoint serving the sample device in a thread; stopped on drop.
struct Server {
    path: PathBuf,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = TempDir::new_with_prefix("/tmp/vfio-user-bench-").expect("temp dir");
        let path = dir.as_path().join("dev.sock");
        let device = SampleDevice::new().expect("sample device");
        let endpoint = Endpoint::new("bench", &path, Box::new(device)).expect("endpoint");
        let stop = endpoint.stop_handle().expect("stop handle");
        let thread = std::thread::spawn(move || endpoint.run().expect("event loop"));
        Server {
            path,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request/reply exchange, the unit the round-trip table measures.
trait RoundTrip {
    fn once(&mut self);
}

/// A client that frames REGION_WRITE requests by hand: one `write` of the
/// whole request, one `read_exact` of the whole reply. Used unchanged
/// against the engine and against the bare echo thread.
struct FramedClient {
    stream: UnixStream,
    req: [u8; REQ_SIZE],
    reply: [u8; REPLY_SIZE],
    id: u16,
}

impl FramedClient {
    fn new(stream: UnixStream) -> Self {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let header = Header {
            msg_id: 0,
            command: Command::RegionWrite as u16,
            msg_size: REQ_SIZE as u32,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        };
        let mut req = [0u8; REQ_SIZE];
        req[..HEADER_SIZE].copy_from_slice(&header.encode());
        req[16..24].copy_from_slice(&regs::SCRATCH.to_le_bytes());
        req[24..28].copy_from_slice(&BAR0_REGION.to_le_bytes());
        req[28..32].copy_from_slice(&4u32.to_le_bytes());
        req[32..36].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        FramedClient {
            stream,
            req,
            reply: [0; REPLY_SIZE],
            id: 0,
        }
    }

    fn connect(path: &Path) -> Self {
        let mut c = Self::new(UnixStream::connect(path).expect("connect"));
        c.negotiate();
        c
    }

    /// Sends a command and reads its whole reply, whatever its size.
    fn call(&mut self, command: Command, payload: &[u8]) -> (Header, Vec<u8>) {
        self.id = self.id.wrapping_add(1);
        let header = Header {
            msg_id: self.id,
            command: command as u16,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        };
        let mut msg = header.encode().to_vec();
        msg.extend_from_slice(payload);
        self.stream.write_all(&msg).expect("send");
        let mut hdr = [0u8; HEADER_SIZE];
        self.stream.read_exact(&mut hdr).expect("reply header");
        let reply = Header::decode(&hdr);
        let mut body = vec![0u8; reply.msg_size as usize - HEADER_SIZE];
        self.stream.read_exact(&mut body).expect("reply payload");
        assert_eq!(reply.msg_id, self.id, "reply id");
        assert_eq!(
            reply.flags & (FLAG_ERROR | 0xf),
            FLAG_TYPE_REPLY,
            "{command:?} failed with errno {}",
            reply.error
        );
        (reply, body)
    }

    fn negotiate(&mut self) {
        let mut p = vec![0, 0, 0, 0];
        p.extend_from_slice(br#"{"capabilities":{"max_msg_fds":16,"pgsizes":4096}}"#);
        p.push(0);
        self.call(Command::Version, &p);
    }

    fn read_scratch(&mut self) -> u32 {
        let mut p = Vec::with_capacity(16);
        p.extend_from_slice(&regs::SCRATCH.to_le_bytes());
        p.extend_from_slice(&BAR0_REGION.to_le_bytes());
        p.extend_from_slice(&4u32.to_le_bytes());
        let (_, body) = self.call(Command::RegionRead, &p);
        u32::from_le_bytes(body[16..20].try_into().expect("4 bytes"))
    }
}

impl RoundTrip for FramedClient {
    fn once(&mut self) {
        self.id = self.id.wrapping_add(1);
        self.req[..2].copy_from_slice(&self.id.to_le_bytes());
        self.stream.write_all(&self.req).expect("send");
        self.stream.read_exact(&mut self.reply).expect("reply");
        let id = u16::from_le_bytes([self.reply[0], self.reply[1]]);
        let flags = u32::from_le_bytes(self.reply[8..12].try_into().expect("4 bytes"));
        assert!(
            id == self.id && flags & (FLAG_ERROR | 0xf) == FLAG_TYPE_REPLY,
            "bad reply"
        );
    }
}

/// The far end of the bare ping-pong: reads a whole request, answers with a
/// reply of the engine's size. Returns when the client hangs up.
fn echo_thread(mut stream: UnixStream) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let header = Header {
            msg_id: 0,
            command: Command::RegionWrite as u16,
            msg_size: REPLY_SIZE as u32,
            flags: FLAG_TYPE_REPLY,
            error: 0,
        };
        let mut req = [0u8; REQ_SIZE];
        let mut reply = [0u8; REPLY_SIZE];
        reply[..HEADER_SIZE].copy_from_slice(&header.encode());
        while stream.read_exact(&mut req).is_ok() {
            reply[..2].copy_from_slice(&req[..2]);
            reply[HEADER_SIZE..].copy_from_slice(&req[HEADER_SIZE..HEADER_SIZE + 16]);
            if stream.write_all(&reply).is_err() {
                break;
            }
        }
    })
}

/// The `vfio_user` crate's client, for reference.
struct LibClient(vfio_user::Client);

impl RoundTrip for LibClient {
    fn once(&mut self) {
        self.0
            .region_write(BAR0_REGION, regs::SCRATCH, &0x1234_5678u32.to_le_bytes())
            .expect("region_write");
    }
}

/// Runs the variants alternately in rounds (see `measure_rounds`) after a
/// warm-up; returns per-exchange latencies in ns for each.
fn round_trip_rounds(cfg: &Config, variants: &mut [&mut dyn RoundTrip]) -> Vec<Vec<u64>> {
    for v in variants.iter_mut() {
        for _ in 0..cfg.rtt_warmup {
            v.once();
        }
    }
    let mut timed: Vec<Box<dyn FnMut() -> u64 + '_>> = variants
        .iter_mut()
        .map(|v| {
            Box::new(move || {
                let t = Instant::now();
                v.once();
                t.elapsed().as_nanos() as u64
            }) as Box<dyn FnMut() -> u64>
        })
        .collect();
    let mut refs: Vec<&mut dyn FnMut() -> u64> = timed.iter_mut().map(|b| &mut **b as _).collect();
    measure_rounds(cfg.rtt_rounds, cfg.rtt_batch, 0, &mut refs)
}

fn bench_round_trip(bench: &Bench, cfg: &Config) {
    let engine = Server::start();
    let mut raw = FramedClient::connect(&engine.path);

    let (near, far) = UnixStream::pair().expect("socketpair");
    let echo = echo_thread(far);
    let mut bare = FramedClient::new(near);

    // A second endpoint: one client per device at a time.
    let lib_server = Server::start();
    let mut lib = match vfio_user::Client::new(&lib_server.path) {
        Ok(c) => Some(LibClient(c)),
        Err(e) => {
            println!("(vfio_user::Client unavailable: {e}; its row is skipped)");
            None
        }
    };

    let mut names = vec!["bare UNIX socket ping-pong", "engine, raw framed client"];
    let samples = {
        let mut variants: Vec<&mut dyn RoundTrip> = vec![&mut bare, &mut raw];
        if let Some(l) = lib.as_mut() {
            variants.push(l);
            names.push("engine, vfio_user::Client");
        }
        round_trip_rounds(cfg, &mut variants)
    };
    assert_eq!(raw.read_scratch(), 0x1234_5678, "SCRATCH not written");

    let stats: Vec<Summary> = samples.into_iter().map(summarize).collect();
    let base = stats[0].p50 as f64;
    println!(
        "REGION_WRITE round trip, 4 B to BAR0 SCRATCH (request {REQ_SIZE} B, reply {REPLY_SIZE} B)"
    );
    println!(
        "  {:<28} {:>9} {:>10} {:>10} {:>12}  target",
        "variant", "samples", "p50 (us)", "p99 (us)", "p50 / bare"
    );
    for (i, (name, s)) in names.iter().zip(&stats).enumerate() {
        let goal = if i == 1 {
            Target::AtMost(TARGET_RTT_RATIO)
        } else {
            Target::Reference
        };
        // The baseline's own row notes nothing: the rows against it do.
        let r = if i == 0 {
            ratio(s.p50 as f64, Some(base), goal)
        } else {
            bench.ratio(name, s.p50 as f64, base, goal)
        };
        let target = match i {
            0 => format!("(baseline) {}", r.verdict),
            1 => format!("<= {TARGET_RTT_RATIO:.2}x {}", r.verdict),
            _ => format!("(reference) {}", r.verdict),
        };
        let ratio = r.value;
        println!(
            "  {:<28} {:>9} {:>10.2} {:>10.2} {:>11.2}x  {target}",
            name,
            s.n,
            s.p50 as f64 / 1e3,
            s.p99 as f64 / 1e3,
            ratio
        );
    }

    drop(bare);
    let _ = echo.join();
    drop(raw);
    drop(lib);
}

// ---------------------------------------------------------------------------
// DMA read

/// Fd-less mappings are not used here; every access would fail.
struct NoClient;

impl ClientDma for NoClient {
    fn dma_read(&self, iova: u64, _buf: &mut [u8]) -> Result<(), DmaError> {
        Err(DmaError::NotMapped { iova })
    }
    fn dma_write(&self, iova: u64, _buf: &[u8]) -> Result<(), DmaError> {
        Err(DmaError::NotMapped { iova })
    }
    fn max_transfer(&self) -> usize {
        4096
    }
}

/// A memfd standing in for guest RAM.
fn guest_ram(size: usize) -> io::Result<File> {
    vfio_user_server::memfd::create(c"bench-guest-ram", size as u64)
}

/// A plain read-only shared mapping of a file, for the memcpy baseline.
struct PlainMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl PlainMap {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a new mapping chosen by the kernel; it aliases no Rust
        // object, and the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(PlainMap { ptr, len })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, alive until drop, and
        // nothing in this process writes to it while the slice is borrowed
        // (the DMA side only reads too).
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for PlainMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no slice of it
        // outlives `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn bench_dma_read(bench: &Bench, cfg: &Config) {
    let max = *DMA_SIZES.iter().max().expect("sizes");
    let ram = guest_ram(max).expect("memfd");
    // Fill (and so allocate) every page of guest RAM.
    let pattern: Vec<u8> = (0..max).map(|i| (i * 7 + 3) as u8).collect();
    ram.write_all_at(&pattern, 0).expect("fill guest RAM");

    let dma = DmaSpace::new();
    let req = MapRequest {
        iova: DMA_IOVA,
        size: max as u64,
        readable: true,
        writable: true,
        offset: 0,
    };
    let no_client: Arc<dyn ClientDma> = Arc::new(NoClient);
    dma.map(&req, Some(ram.try_clone().expect("dup memfd")), no_client)
        .expect("DMA map");
    let plain = PlainMap::new(&ram, max).expect("mmap");
    let src = plain.as_slice();

    // The destination starts on a page boundary, like the source. (A large
    // Vec starts 16 bytes past one, and with some CPU and libc pairs memcpy
    // between buffers that close modulo 4 KiB runs many times slower, for
    // both variants alike, which would hide what is measured here.)
    let mut backing = vec![0x5au8; max + PAGE];
    let start = backing.as_ptr().align_offset(PAGE);
    let dst = &mut backing[start..start + max];
    // Touch the destination and fault in both source mappings.
    dma.read(DMA_IOVA, dst).expect("DMA read");
    assert!(*dst == pattern[..], "DMA read returned wrong data");
    dst.fill(0);
    dst.copy_from_slice(src);
    assert!(*dst == pattern[..], "plain mapping returned wrong data");
    drop(pattern);

    println!();
    println!("DMA read: DmaSpace::read from a mapped memfd vs copy_from_slice from a plain mapping of it");
    println!("  (GB/s = 1e9 bytes/s; p99 is the throughput of the 99th-percentile slowest sample)");
    println!(
        "  {:>7} {:>8} {:>14} {:>14} {:>14} {:>14} {:>11}  target",
        "size", "samples", "memcpy p50", "memcpy p99", "DMA p50", "DMA p99", "DMA/memcpy"
    );
    for &size in &DMA_SIZES {
        // Time several copies per sample for small sizes, so the clock's
        // own cost stays negligible.
        let reps = (256 * KIB / size).max(1);
        let per_round = (cfg.dma_bytes_per_round / (size * reps)).max(cfg.dma_min_samples);
        let mut memcpy_ns = Vec::with_capacity(cfg.dma_rounds * per_round);
        let mut dma_ns = Vec::with_capacity(cfg.dma_rounds * per_round);
        let buf = &mut dst[..size];
        for round in 0..cfg.dma_rounds {
            for k in 0..2 {
                let use_dma = (round + k) % 2 == 1;
                for _ in 0..per_round {
                    let t = Instant::now();
                    for _ in 0..reps {
                        if use_dma {
                            dma.read(DMA_IOVA, buf).expect("DMA read");
                        } else {
                            buf.copy_from_slice(&src[..size]);
                        }
                        black_box(&mut *buf);
                    }
                    let ns = t.elapsed().as_nanos() as u64;
                    if use_dma {
                        dma_ns.push(ns);
                    } else {
                        memcpy_ns.push(ns);
                    }
                }
            }
        }
        let bytes = (size * reps) as f64;
        // No sample (or a clock that read 0) is no throughput: infinite.
        let gbps = |ns: u64| bytes / ns as f64;
        let m = summarize(memcpy_ns);
        let d = summarize(dma_ns);
        let label = if size >= MIB {
            format!("{} MiB", size / MIB)
        } else {
            format!("{} KiB", size / KIB)
        };
        let r = bench.ratio(
            &format!("DMA read {label}"),
            gbps(d.p50),
            gbps(m.p50),
            Target::AtLeast(TARGET_DMA_RATIO),
        );
        println!(
            "  {:>7} {:>8} {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>10.1}%  >= {:.0}% {}",
            label,
            m.n,
            gbps(m.p50),
            gbps(m.p99),
            gbps(d.p50),
            gbps(d.p99),
            r.percent(),
            TARGET_DMA_RATIO * 100.0,
            r.verdict
        );
    }
}

fn main() -> ExitCode {
    let bench = Bench::start();
    let cfg = Config::new(bench.mode());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "vfio-user-server engine benchmark ({} mode, {cpus} CPUs{})",
        bench.mode().name(),
        if cfg!(debug_assertions) {
            ", DEBUG BUILD: figures are not meaningful"
        } else {
            ""
        }
    );
    println!();
    bench_round_trip(&bench, &cfg);
    bench_dma_read(&bench, &cfg);
    bench.finish()
}
