//! Guest memory forwarded to partition hosts: notices reach the host (its
//! mappings are visible in `/proc/<pid>/maps`), transfers that name
//! forwarded memory move the same bytes as the staging area, an unmap
//! returns only once the host has let go, a host that does not answer or
//! dies is failed until reset, and a host refuses pieces that are not in
//! its table.

use std::ffi::CStr;
use std::fs::File;
use std::io::{IoSlice, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    HostMapping, HostSink, HostSlice, HostSource, OpError, Partition, PartitionSpec, SliceFn,
};
use vgpu_backend_remote::proto::{
    self, Create, Header, Kind, Map, MappedPiece, Reply, Request, Step, Value, HEADER_LEN,
    MAX_REQUEST, REPLY,
};
use vgpu_backend_remote::{
    HostOptions, InnerBackend, ProcessLauncher, RemoteBackend, RemoteConfig, RemotePartition,
};
use vgpu_partition_host::host;

const MIB: u64 = 1 << 20;

fn backend(op_timeout: Duration) -> RemoteBackend {
    let options = HostOptions {
        backend: InnerBackend::Software {
            memory: 64 * MIB,
            compute_units: 2,
        },
        spin: Duration::ZERO,
    };
    let launcher = ProcessLauncher::new(
        PathBuf::from(env!("CARGO_BIN_EXE_vgpu-partition-host")),
        options.to_args(),
    )
    .unwrap();
    let config = RemoteConfig {
        staging_bytes: 64 * 1024,
        op_timeout,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(Arc::new(launcher), config).unwrap()
}

fn partition(b: &RemoteBackend) -> RemotePartition {
    let spec = PartitionSpec {
        name: "p".into(),
        memory: 32 * MIB,
        compute_units: 1,
    };
    b.create_remote_partition(&spec).unwrap()
}

/// Guest RAM: a memfd mapped here, as the daemon maps a VMM's.
struct Ram {
    file: Arc<File>,
    map: vgpu_sys::mmap::SharedMapping,
    len: usize,
}

impl Ram {
    /// Sealed against shrinking and growing, as QEMU's memfd backend does.
    fn new(name: &CStr, len: usize) -> Ram {
        Ram::with_seals(name, len, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
    }

    fn with_seals(name: &CStr, len: usize, seals: i32) -> Ram {
        let file = Arc::new(vgpu_sys::memfd::create_sealed(name, len as u64, seals).unwrap());
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let map = vgpu_sys::mmap::map_shared(Arc::clone(&file), 0, len, rw).unwrap();
        Ram { file, map, len }
    }

    /// Address of byte `off`, with `len` bytes after it.
    fn at(&self, off: usize, len: usize) -> *mut u8 {
        assert!(off + len <= self.len);
        // SAFETY: in bounds of our live mapping (checked).
        unsafe { self.map.as_ptr().add(off) }
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: `len` bytes in bounds of our mapping, into `v`.
        unsafe { std::ptr::copy_nonoverlapping(self.at(off, len), v.as_mut_ptr(), len) };
        v
    }

    fn write(&self, off: usize, b: &[u8]) {
        // SAFETY: `b.len()` bytes in bounds of our mapping, from `b`.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.at(off, b.len()), b.len()) };
    }

    /// The notice the device model would send for `[off, off + len)`.
    fn mapping(&self, id: u64, off: usize, len: usize, writable: bool) -> HostMapping {
        HostMapping {
            id,
            // SAFETY: in bounds (the tests pass ranges of the file).
            addr: unsafe { self.map.as_ptr().add(off) } as usize,
            len,
            readable: true,
            writable,
            file: Arc::clone(&self.file),
            file_offset: off as u64,
        }
    }
}

/// A transfer over pieces of guest RAM (offsets in the file) that offers
/// them as slices of mapping `id`, whose first byte is at `base` of the
/// file; or only by copy when `slices` is false.
struct Guest<'a> {
    ram: &'a Ram,
    id: u64,
    base: usize,
    pieces: Vec<(usize, usize)>,
    slices: bool,
}

impl Guest<'_> {
    fn total(&self) -> u64 {
        self.pieces.iter().map(|p| p.1 as u64).sum()
    }

    /// Calls `f(file offset, bytes, done)` for the pieces of
    /// `[offset, offset + len)` of the transfer.
    fn each(&self, offset: u64, len: usize, mut f: impl FnMut(usize, usize, usize)) {
        let (mut at, mut done) = (offset as usize, 0usize);
        for &(off, n) in &self.pieces {
            if done == len {
                break;
            }
            if at >= n {
                at -= n;
                continue;
            }
            let k = (n - at).min(len - done);
            f(off + at, k, done);
            done += k;
            at = 0;
        }
    }

    fn slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        if !self.slices {
            return Ok(false);
        }
        let v: Vec<HostSlice> = self
            .pieces
            .iter()
            .map(|&(off, len)| HostSlice {
                ptr: self.ram.at(off, len),
                len,
                mapping: self.id,
            })
            .collect();
        assert!(self.pieces.iter().all(|p| p.0 >= self.base));
        f(&v)
    }
}

impl HostSource for Guest<'_> {
    fn len(&self) -> u64 {
        self.total()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let n = buf.len();
        self.each(offset, n, |off, k, done| {
            buf[done..done + k].copy_from_slice(&self.ram.read(off, k))
        });
        Ok(())
    }
    fn with_slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        self.slices(f)
    }
}

impl HostSink for Guest<'_> {
    fn len(&self) -> u64 {
        self.total()
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        self.each(offset, buf.len(), |off, k, done| {
            self.ram.write(off, &buf[done..done + k])
        });
        Ok(())
    }
    fn with_slices_mut(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        self.slices(f)
    }
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn host_maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}

/// Waits until `pid` has died (a zombie not yet reaped, or gone).
fn wait_dead(pid: u32) {
    let t = Instant::now();
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(s)
                if s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z')) =>
            {
                return
            }
            Ok(_) => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "host {pid} did not die"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until every thread of `pid` is stopped by a signal. A stop
/// signal stops a process asynchronously: kill(2) returns before the
/// threads have stopped, and until they have, the host still answers.
fn wait_stopped(pid: u32) {
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        let mut any = false;
        for task in tasks {
            let Ok(task) = task else { return false };
            let Ok(s) = std::fs::read_to_string(task.path().join("stat")) else {
                return false;
            };
            if !s
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
            {
                return false;
            }
            any = true;
        }
        any
    };
    let t = Instant::now();
    while !stopped() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "host {pid} did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn transfers_through_forwarded_memory_match_staging() {
    let b = backend(Duration::from_secs(10));
    let mut p = partition(&b);
    let counts = p.transfer_counts();
    let hm = p.host_memory().unwrap();
    let pid = p.host_pid().unwrap();
    let ram = Ram::new(c"vgpu-hostmem-a", 8 << 20);
    // Mapping 7 covers the file from 1 MiB on.
    hm.mapped(ram.mapping(7, 1 << 20, 7 << 20, true));
    assert!(
        host_maps(pid).contains("vgpu-hostmem-a"),
        "the host mapped it"
    );

    let n = 3 << 20;
    let data = pattern(n, 5);
    // Two pieces, out of order in guest RAM, neither page aligned.
    let pieces = vec![(5 << 20 | 123, 1 << 20), ((1 << 20) + 7, n - (1 << 20))];
    let src = Guest {
        ram: &ram,
        id: 7,
        base: 1 << 20,
        pieces: pieces.clone(),
        slices: true,
    };
    src.write_at(0, &data).unwrap();
    let dev = p.alloc(n as u64, 0).unwrap();
    p.upload(dev, &src).unwrap();
    assert_eq!((counts.direct(), counts.staged()), (1, 0));

    // Back through staging, and through forwarded memory elsewhere.
    let staged = Guest {
        ram: &ram,
        id: 7,
        base: 1 << 20,
        pieces: vec![(0, n)],
        slices: false,
    };
    p.download(dev, &staged).unwrap();
    assert_eq!(ram.read(0, n), data, "upload by pieces, staged back");
    let direct = Guest {
        ram: &ram,
        id: 7,
        base: 1 << 20,
        pieces: vec![((6 << 20) + 200, 1000), ((3 << 20) + 100, n - 1000)],
        slices: true,
    };
    p.download(dev, &direct).unwrap();
    assert_eq!((counts.direct(), counts.staged()), (2, 1));
    let mut got = vec![0u8; n];
    direct.read_at(0, &mut got).unwrap();
    assert_eq!(got, data, "download by pieces");

    // Slices outside any forwarded mapping take the staging area.
    let (mut other, unknown) = (pattern(4096, 9), Ram::new(c"vgpu-hostmem-b", 1 << 20));
    let elsewhere = Guest {
        ram: &unknown,
        id: 99,
        base: 0,
        pieces: vec![(0, 4096)],
        slices: true,
    };
    elsewhere.write_at(0, &other).unwrap();
    p.upload(dev, &elsewhere).unwrap();
    // Memory before mapping 7's start, though in its file, is outside it.
    let before = Guest {
        ram: &ram,
        id: 7,
        base: 0,
        pieces: vec![(4096, 4096)],
        slices: true,
    };
    p.download(dev, &before).unwrap();
    assert_eq!((counts.direct(), counts.staged()), (2, 3));
    before.read_at(0, &mut other[..]).unwrap();
    assert_eq!(other, pattern(4096, 9));
    // A read-only mapping is not written by a download.
    hm.mapped(ram.mapping(8, 0, 1 << 20, false));
    let ro = Guest {
        ram: &ram,
        id: 8,
        base: 0,
        pieces: vec![(8192, 4096)],
        slices: true,
    };
    p.download(dev, &ro).unwrap();
    p.upload(dev, &ro).unwrap();
    assert_eq!((counts.direct(), counts.staged()), (3, 4));

    // When an unmap returns, the host has let go of the memory.
    let mapped = || host_maps(pid).matches("vgpu-hostmem-a").count();
    assert_eq!(mapped(), 2);
    hm.unmapped(7);
    assert_eq!(mapped(), 1, "{}", host_maps(pid));
    p.upload(dev, &src).unwrap();
    assert_eq!((counts.direct(), counts.staged()), (3, 5));
    hm.unmapped(8);
    assert_eq!(mapped(), 0, "{}", host_maps(pid));
    assert!(p.alloc(16, 0).is_ok());
}

#[test]
fn files_a_host_could_shrink_are_not_forwarded() {
    let b = backend(Duration::from_secs(10));
    let mut p = partition(&b);
    let counts = p.transfer_counts();
    let hm = p.host_memory().unwrap();
    let ram = Ram::with_seals(c"vgpu-hostmem-f", 1 << 20, libc::F_SEAL_GROW);
    hm.mapped(ram.mapping(1, 0, 1 << 20, true));
    assert!(!host_maps(p.host_pid().unwrap()).contains("vgpu-hostmem-f"));
    let g = Guest {
        ram: &ram,
        id: 1,
        base: 0,
        pieces: vec![(0, 8192)],
        slices: true,
    };
    g.write_at(0, &pattern(8192, 4)).unwrap();
    let dev = p.alloc(8192, 0).unwrap();
    p.upload(dev, &g).unwrap();
    let back = Guest {
        ram: &ram,
        id: 1,
        base: 0,
        pieces: vec![(65536, 8192)],
        slices: true,
    };
    p.download(dev, &back).unwrap();
    assert_eq!(ram.read(65536, 8192), pattern(8192, 4));
    assert_eq!((counts.direct(), counts.staged()), (0, 2));
    hm.unmapped(1);
}

#[test]
fn mappings_follow_the_partition_to_a_new_host() {
    let b = backend(Duration::from_secs(10));
    let mut p = partition(&b);
    let counts = p.transfer_counts();
    let hm = p.host_memory().unwrap();
    let ram = Ram::new(c"vgpu-hostmem-c", 1 << 20);
    hm.mapped(ram.mapping(1, 0, 1 << 20, true));
    let first = p.host_pid().unwrap();
    // SAFETY: plain kill(2) of the host this test started.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGKILL) }, 0);
    wait_dead(first);
    assert!(matches!(p.alloc(16, 0), Err(OpError::Device(_))));
    p.reset();
    let second = p.host_pid().unwrap();
    assert!(host_maps(second).contains("vgpu-hostmem-c"), "replayed");
    let g = Guest {
        ram: &ram,
        id: 1,
        base: 0,
        pieces: vec![(0, 65536)],
        slices: true,
    };
    g.write_at(0, &pattern(65536, 3)).unwrap();
    let dev = p.alloc(65536, 0).unwrap();
    p.upload(dev, &g).unwrap();
    assert_eq!(counts.direct(), 1);
    hm.unmapped(1);
    assert!(!host_maps(second).contains("vgpu-hostmem-c"));
}

#[test]
fn a_host_that_does_not_answer_an_unmap_is_killed() {
    let b = backend(Duration::from_millis(500));
    let mut p = partition(&b);
    let hm = p.host_memory().unwrap();
    let ram = Ram::new(c"vgpu-hostmem-d", 1 << 20);
    hm.mapped(ram.mapping(1, 0, 1 << 20, true));
    hm.mapped(ram.mapping(2, 0, 4096, true));
    let pid = p.host_pid().unwrap();
    let mapped = || host_maps(pid).matches("vgpu-hostmem-d").count();
    assert_eq!(mapped(), 2, "the host holds both mappings");
    // SAFETY: plain kill(2) of the host this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    wait_stopped(pid);
    assert_eq!(mapped(), 2, "the host still holds both mappings");
    let t = Instant::now();
    hm.unmapped(1);
    // (Socket timeouts count in scheduler ticks: allow one.)
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(480), "it waited {waited:?}");
    // The host is dead by the time the unmap returns.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty()
            || stat
                .rsplit_once(')')
                .unwrap()
                .1
                .trim_start()
                .starts_with('Z'),
        "{stat}"
    );
    match p.alloc(16, 0) {
        Err(OpError::Device(m)) => assert!(m.contains("memory socket"), "{m}"),
        other => panic!("expected a device error, got {other:?}"),
    }
    assert!(
        matches!(p.alloc(16, 0), Err(OpError::Device(_))),
        "until reset"
    );
    p.reset();
    let fresh = p.host_pid().unwrap();
    assert!(p.alloc(16, 0).is_ok());
    let maps = host_maps(fresh);
    assert!(maps.contains("vgpu-hostmem-d"), "mapping 2 replayed");
    hm.unmapped(2);
    assert!(!host_maps(fresh).contains("vgpu-hostmem-d"));
}

fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_host_killed_holding_memory_leaks_no_descriptor() {
    // Descriptors are counted per process: this runs alone in a child
    // process of the test binary.
    const ALONE: &str = "VGPU_HOSTMEM_LEAK_TEST";
    if std::env::var_os(ALONE).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_host_killed_holding_memory_leaks_no_descriptor",
                "--test-threads=1",
            ])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let b = backend(Duration::from_secs(10));
    let ram = Ram::new(c"vgpu-hostmem-e", 1 << 20);
    drop(partition(&b));
    let fds = count_fds();
    for i in 0..10 {
        let mut p = partition(&b);
        let hm = p.host_memory().unwrap();
        hm.mapped(ram.mapping(i, 0, 1 << 20, true));
        let pid = p.host_pid().unwrap();
        assert!(host_maps(pid).contains("vgpu-hostmem-e"));
        // SAFETY: plain kill(2) of the host this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        wait_dead(pid);
        assert!(matches!(p.alloc(16, 0), Err(OpError::Device(_))));
        if i % 2 == 0 {
            p.reset();
            assert!(p.alloc(16, 0).is_ok());
            hm.unmapped(i);
        }
    }
    assert_eq!(count_fds(), fds, "descriptors leaked");
}

// ---- a host played against by hand ---------------------------------------

/// Sends a frame with an optional descriptor.
fn send(s: &UnixStream, kind: Kind, seq: u32, payload: &[u8], fd: Option<i32>) {
    let h = Header {
        kind: kind as u16,
        seq,
        len: payload.len() as u32,
    }
    .encode();
    let mut frame = h.to_vec();
    frame.extend_from_slice(payload);
    let n = vgpu_sys::scm::send_with_fds(s, &[IoSlice::new(&frame)], fd.as_slice()).unwrap();
    assert_eq!(n as usize, frame.len());
}

fn answer(s: &mut UnixStream, kind: Kind, seq: u32) -> Result<Value, OpError> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = Header::decode(&h, MAX_REQUEST).unwrap();
    assert_eq!((h.kind, h.seq), (REPLY | kind as u16, seq));
    let mut p = vec![0; h.len as usize];
    s.read_exact(&mut p).unwrap();
    Reply::decode(kind, &p).unwrap().result
}

fn call(
    s: &mut UnixStream,
    seq: u32,
    req: &Request<'_>,
    fd: Option<i32>,
) -> Result<Value, OpError> {
    send(s, req.kind(), seq, &req.encode(), fd);
    answer(s, req.kind(), seq)
}

/// A host on a software backend served in a thread, its partition
/// created (requests 1 to 3 of the command socket), played by hand.
struct RawHost {
    cmd: UnixStream,
    ctl: UnixStream,
    host: std::thread::JoinHandle<Result<(), host::HostError>>,
    _staging: Ram,
}

fn raw_host() -> RawHost {
    let (mut cmd, theirs) = UnixStream::pair().unwrap();
    let host = std::thread::spawn(move || {
        let b = SoftwareBackend::new(16 * MIB, 1);
        host::serve(theirs, &b, &|| true, Duration::ZERO)
    });
    let (ctl, ctl_theirs) = UnixStream::pair().unwrap();
    assert!(call(&mut cmd, 1, &Request::Hello, None).is_ok());
    call(&mut cmd, 2, &Request::Control, Some(ctl_theirs.as_raw_fd())).unwrap();
    drop(ctl_theirs);
    let staging = Ram::new(c"staging", 1 << 20);
    let create = Request::Create(Create {
        name: "t",
        memory: 8 * MIB,
        compute_units: 1,
        staging_len: 64 * 1024,
        mailbox: false,
    });
    call(&mut cmd, 3, &create, Some(staging.file.as_raw_fd())).unwrap();
    RawHost {
        cmd,
        ctl,
        host,
        _staging: staging,
    }
}

#[test]
fn a_host_refuses_pieces_outside_its_mappings() {
    let RawHost {
        mut cmd,
        mut ctl,
        host,
        _staging,
    } = raw_host();
    let ram = Ram::new(c"guest", 1 << 20);
    let fd = Some(ram.file.as_raw_fd());
    let map = |id, file_offset, len, writable| {
        Request::Map(Map {
            id,
            file_offset,
            len,
            readable: true,
            writable,
        })
    };
    // Mappings the file cannot hold are refused; the host goes on.
    assert!(call(&mut ctl, 1, &map(1, 4096, 1 << 20, true), fd).is_err());
    assert!(call(&mut ctl, 2, &map(1, u64::MAX - 1, 4, true), fd).is_err());
    assert!(call(&mut ctl, 3, &map(1, 0, 0, true), fd).is_err());
    call(&mut ctl, 4, &map(1, 0, 1 << 20, true), fd).unwrap();
    call(&mut ctl, 5, &map(2, 0, 4096, false), fd).unwrap();
    assert!(
        call(&mut ctl, 6, &map(2, 0, 4096, false), fd).is_err(),
        "same id"
    );
    assert!(matches!(
        call(&mut ctl, 7, &Request::Unmap { id: 9 }, None),
        Err(OpError::NotFound(_))
    ));

    let alloc = Request::Alloc {
        size: 8192,
        align: 0,
    };
    let Ok(Value::U64(dev)) = call(&mut cmd, 4, &alloc, None) else {
        panic!("alloc");
    };
    let piece = |mapping, offset, len| MappedPiece {
        mapping,
        offset,
        len,
    };
    let bad = [
        vec![piece(3, 0, 16)],
        vec![piece(1, (1 << 20) - 8, 16)],
        vec![piece(1, u64::MAX, 2)],
        vec![piece(1, 0, 0)],
        vec![piece(1, 0, 4096), piece(1, 0, u64::MAX)],
        vec![piece(1, 0, 8192), piece(1, 0, 1)],
    ];
    let mut seq = 5;
    for pieces in bad {
        let up = Request::UploadMapped {
            dst: dev,
            pieces: pieces.clone(),
        };
        let r = call(&mut cmd, seq, &up, None);
        assert!(r.is_err(), "{pieces:?}: {r:?}");
        seq += 1;
    }
    // A download into a read-only mapping.
    let down = Request::DownloadMapped {
        src: dev,
        pieces: vec![piece(2, 0, 16)],
    };
    assert!(call(&mut cmd, seq, &down, None).is_err());
    seq += 1;
    // Good pieces still work: bytes go to the device and back.
    ram.write(100, b"0123456789abcdef");
    let up = Request::UploadMapped {
        dst: dev,
        pieces: vec![piece(2, 100, 8), piece(1, 108, 8)],
    };
    call(&mut cmd, seq, &up, None).unwrap();
    let down = Request::DownloadMapped {
        src: dev,
        pieces: vec![piece(1, 5000, 16)],
    };
    call(&mut cmd, seq + 1, &down, None).unwrap();
    assert_eq!(ram.read(5000, 16), b"0123456789abcdef");

    // Queued runs: copies go one way, into their own pieces, which are
    // checked as a transfer's are.
    let queued = |steps| Request::Queued(steps);
    let both_ways = queued(vec![
        Step::Upload {
            dst: dev,
            src: vec![piece(1, 100, 16)],
        },
        Step::Download {
            src: dev,
            dst: vec![piece(1, 6000, 16)],
        },
    ]);
    assert!(matches!(
        call(&mut cmd, seq + 2, &both_ways, None),
        Err(OpError::Invalid(_))
    ));
    let outside = queued(vec![Step::Upload {
        dst: dev,
        src: vec![piece(1, (1 << 20) - 8, 16)],
    }]);
    assert!(call(&mut cmd, seq + 3, &outside, None).is_err());
    let read_only = queued(vec![Step::Download {
        src: dev,
        dst: vec![piece(2, 0, 16)],
    }]);
    assert!(call(&mut cmd, seq + 4, &read_only, None).is_err());
    ram.write(200, b"fedcba9876543210");
    let ups = queued(vec![
        Step::Upload {
            dst: dev,
            src: vec![piece(1, 208, 8)],
        },
        Step::Timestamp,
        Step::Upload {
            dst: dev + 8,
            src: vec![piece(2, 200, 8)],
        },
        Step::Upload {
            dst: dev + (1 << 30),
            src: vec![piece(1, 200, 8)],
        },
    ]);
    let Ok(Value::Queued(done)) = call(&mut cmd, seq + 5, &ups, None) else {
        panic!("queued uploads");
    };
    let ok: Vec<bool> = done.iter().map(|d| d.result.is_ok()).collect();
    assert_eq!(ok, [true, true, true, false]);
    let downs = queued(vec![Step::Download {
        src: dev,
        dst: vec![piece(1, 7000, 10), piece(1, 7100, 6)],
    }]);
    let Ok(Value::Queued(done)) = call(&mut cmd, seq + 6, &downs, None) else {
        panic!("queued download");
    };
    assert!(done[0].result.is_ok());
    assert_eq!(ram.read(7000, 10), b"76543210fe");
    assert_eq!(ram.read(7100, 6), b"dcba98");
    let seq = seq + 5;

    call(&mut ctl, 8, &Request::Unmap { id: 1 }, None).unwrap();
    let up = Request::UploadMapped {
        dst: dev,
        pieces: vec![piece(1, 0, 8)],
    };
    assert!(call(&mut cmd, seq + 2, &up, None).is_err(), "unmapped");
    // Memory notices on the command socket end the host.
    send(
        &cmd,
        Kind::Unmap,
        seq + 3,
        &Request::Unmap { id: 2 }.encode(),
        None,
    );
    assert!(host.join().unwrap().is_err());
}

#[test]
fn started_runs_finish_in_order_and_are_bounded() {
    let RawHost {
        mut cmd,
        mut ctl,
        host,
        _staging,
    } = raw_host();
    let ram = Ram::new(c"guest", 1 << 20);
    let map = Request::Map(Map {
        id: 1,
        file_offset: 0,
        len: 1 << 20,
        readable: true,
        writable: true,
    });
    call(&mut ctl, 1, &map, Some(ram.file.as_raw_fd())).unwrap();
    let alloc = Request::Alloc {
        size: 8192,
        align: 0,
    };
    let Ok(Value::U64(dev)) = call(&mut cmd, 4, &alloc, None) else {
        panic!("alloc");
    };
    let piece = |offset, len| MappedPiece {
        mapping: 1,
        offset,
        len,
    };
    let finish =
        |cmd: &mut UnixStream, seq| call(cmd, seq, &Request::Finish { within_us: 0 }, None);
    assert!(
        matches!(finish(&mut cmd, 5), Err(OpError::Invalid(_))),
        "nothing started"
    );

    ram.write(100, b"started runs go in order");
    let mut runs = vec![
        vec![Step::Upload {
            dst: dev,
            src: vec![piece(100, 24)],
        }],
        vec![
            Step::Timestamp,
            Step::Download {
                src: dev,
                dst: vec![piece(4000, 12), piece(5000, 12)],
            },
        ],
        // Refused as a whole when it runs: each step fails.
        vec![
            Step::Upload {
                dst: dev,
                src: vec![piece(100, 8)],
            },
            Step::Download {
                src: dev,
                dst: vec![piece(6000, 8)],
            },
        ],
        vec![Step::Fill(vgpu_backend::DeviceFill {
            addr: dev,
            size: 8,
            pattern: 0x2121_2121,
        })],
    ];
    // As many as may be started at once.
    while runs.len() < proto::MAX_STARTED {
        runs.push(vec![Step::Timestamp]);
    }
    let mut seq = 6;
    // A start's answer carries the runs done by then, oldest first (all
    // on one lane).
    let mut finished = Vec::new();
    for steps in &runs {
        let start = Request::Start {
            lane: 0,
            steps: steps.clone(),
        };
        let r = call(&mut cmd, seq, &start, None);
        let Ok(Value::Started(done)) = r else {
            panic!("{r:?}");
        };
        finished.extend(done);
        seq += 1;
    }
    // At most MAX_STARTED whose results the parent does not have yet.
    let fifth = vec![Step::Timestamp];
    let start = Request::Start {
        lane: 0,
        steps: fifth.clone(),
    };
    match call(&mut cmd, seq, &start, None) {
        Err(OpError::Invalid(_)) => assert!(finished.is_empty(), "refused with room"),
        Ok(Value::Started(done)) => {
            assert!(!finished.is_empty(), "a fifth run in flight");
            finished.extend(done);
            runs.push(fifth);
        }
        r => panic!("{r:?}"),
    }
    seq += 1;
    while finished.len() < runs.len() {
        let Ok(Value::Finished(f)) = finish(&mut cmd, seq) else {
            panic!("finish");
        };
        finished.push(f);
        seq += 1;
    }
    let mut results = Vec::new();
    for (f, steps) in finished.iter().zip(&runs) {
        assert_eq!(f.lane, 0);
        assert_eq!(f.run.done.len(), steps.len());
        results.push(
            f.run
                .done
                .iter()
                .map(|d| d.result.is_ok())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        results[..4],
        [vec![true], vec![true, true], vec![false, false], vec![true]]
    );
    assert_eq!(ram.read(4000, 12), b"started runs");
    assert_eq!(ram.read(5000, 12), b" go in order");
    assert!(matches!(finish(&mut cmd, seq), Err(OpError::Invalid(_))));

    // Any other request waits for what was started; its results stay
    // for the finish.
    let run = Request::Start {
        lane: 1,
        steps: vec![Step::Download {
            src: dev,
            dst: vec![piece(7000, 8)],
        }],
    };
    let Ok(Value::Started(early)) = call(&mut cmd, seq + 1, &run, None) else {
        panic!("start");
    };
    let down = Request::DownloadMapped {
        src: dev,
        pieces: vec![piece(7100, 8)],
    };
    call(&mut cmd, seq + 2, &down, None).unwrap();
    assert_eq!(ram.read(7100, 8), b"!!!!!!!!");
    if early.is_empty() {
        assert!(matches!(finish(&mut cmd, seq + 3), Ok(Value::Finished(_))));
    }
    assert_eq!(ram.read(7000, 8), b"!!!!!!!!");
    // A reset forgets them.
    call(&mut cmd, seq + 4, &run, None).unwrap();
    call(&mut cmd, seq + 5, &Request::Reset, None).unwrap();
    assert!(matches!(
        finish(&mut cmd, seq + 6),
        Err(OpError::Invalid(_))
    ));
    drop((cmd, ctl));
    host.join().unwrap().unwrap();
}
