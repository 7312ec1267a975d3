//! The remote backend against real partition host processes (software
//! backend inside), and against fake hosts that break the protocol.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::conformance;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    Backend, BackendError, Finished, HostSink, HostSource, Launch, OpError, Partition,
    PartitionSpec, Queued, QueuedDone, Started,
};
use vgpu_backend_remote::proto::{self, Header, Kind, LaneRun, Reply, Value, HEADER_LEN, REPLY};
use vgpu_backend_remote::{
    HostLink, HostOptions, InnerBackend, Launcher, ProcessLauncher, RemoteBackend, RemoteConfig,
};
use vgpu_sys::rng::Rng;

const MIB: u64 = 1 << 20;
const MEMORY: u64 = 64 * MIB;

fn host_program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vgpu-partition-host"))
}

fn launcher(memory: u64, units: u32, spin: Duration) -> Arc<ProcessLauncher> {
    let options = HostOptions {
        backend: InnerBackend::Software {
            memory,
            compute_units: units,
        },
        spin,
    };
    Arc::new(ProcessLauncher::new(host_program(), options.to_args()).unwrap())
}

/// A small staging area, so transfers take several pieces.
fn config() -> RemoteConfig {
    RemoteConfig {
        staging_bytes: 64 * 1024,
        ..RemoteConfig::default()
    }
}

fn backend(memory: u64, units: u32) -> RemoteBackend {
    RemoteBackend::new(launcher(memory, units, Duration::ZERO), config()).unwrap()
}

/// Hosts and daemon polling (frames through the mailbox).
fn polling_backend(memory: u64, units: u32) -> RemoteBackend {
    let spin = Duration::from_micros(200);
    let config = RemoteConfig { spin, ..config() };
    RemoteBackend::new(launcher(memory, units, spin), config).unwrap()
}

fn spec(name: &str, memory: u64, compute_units: u32) -> PartitionSpec {
    PartitionSpec {
        name: name.into(),
        memory,
        compute_units,
    }
}

/// `n` floats in [-0.5, 0.5), as bytes.
fn floats(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| (((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) - 0.5).to_le_bytes())
        .collect()
}

/// Guest memory that faults from `fault_at` on.
struct Src {
    data: Vec<u8>,
    fault_at: Option<u64>,
}

impl HostSource for Src {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let end = offset + buf.len() as u64;
        if let Some(f) = self.fault_at.filter(|&f| f < end) {
            return Err(OpError::Fault(f.max(offset)));
        }
        buf.copy_from_slice(&self.data[offset as usize..end as usize]);
        Ok(())
    }
}

struct Sink {
    data: RefCell<Vec<u8>>,
    fault_at: Option<u64>,
}

impl Sink {
    fn new(len: usize, fault_at: Option<u64>) -> Sink {
        Sink {
            data: RefCell::new(vec![0xee; len]),
            fault_at,
        }
    }
}

impl HostSink for Sink {
    fn len(&self) -> u64 {
        self.data.borrow().len() as u64
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        let end = offset + buf.len() as u64;
        if let Some(f) = self.fault_at.filter(|&f| f < end) {
            return Err(OpError::Fault(f.max(offset)));
        }
        self.data.borrow_mut()[offset as usize..end as usize].copy_from_slice(buf);
        Ok(())
    }
}

fn launch(p: &mut dyn Partition, entry: &str, params: &[u8]) -> Result<(), OpError> {
    p.launch(&Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module: abi::MODULE_BUILTIN,
        entry,
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        params,
    })
}

/// Runs one script of calls on a partition; returns every result as text
/// (and the bytes read back), so that two partitions can be compared.
fn script(p: &mut dyn Partition) -> Vec<String> {
    let mut out = Vec::new();
    let mut log = |s: String| out.push(s);
    let mut rng = Rng(7);
    let big = rng.bytes(300_000); // several staging pieces
    let a = p.alloc(300_000, 0);
    log(format!("alloc {a:?}"));
    let a = a.unwrap();
    let b = p.alloc(300_000, 4096).unwrap();
    log(format!("used {}", p.memory_used()));
    let src = Src {
        data: big.clone(),
        fault_at: None,
    };
    log(format!("upload {:?}", p.upload(a, &src)));
    let sink = Sink::new(300_000, None);
    log(format!("download {:?}", p.download(a, &sink)));
    assert_eq!(*sink.data.borrow(), big);
    log(format!("{:?}", p.copy(b + 8, a + 16, 100_000)));
    log(format!("{:?}", p.fill(b, 64, 0x0102_0304)));
    log(format!("{:?}", p.fill(b, 63, 1)));
    log(format!("{:?}", p.copy(b, a, 400_000)));
    log(format!(
        "{:?}",
        p.upload(
            a + 299_999,
            &Src {
                data: vec![1; 2],
                fault_at: None
            }
        )
    ));
    // Guest memory faults part way, in the first piece and in a later one.
    for f in [10, 200_000] {
        let src = Src {
            data: big.clone(),
            fault_at: Some(f),
        };
        log(format!("faulty upload {:?}", p.upload(a, &src)));
        let sink = Sink::new(300_000, Some(f));
        log(format!("faulty download {:?}", p.download(b, &sink)));
    }
    let sink = Sink::new(300_000, None);
    log(format!("download {:?}", p.download(b, &sink)));
    log(format!("bytes {:x}", fnv(&sink.data.borrow())));
    // Built-in kernels.
    let n = 20_000u64;
    let x = p.alloc(4 * n, 0).unwrap();
    let y = p.alloc(4 * n, 0).unwrap();
    let z = p.alloc(4 * n, 0).unwrap();
    let fx = floats(&mut rng, n as usize);
    let fy = floats(&mut rng, n as usize);
    p.upload(
        x,
        &Src {
            data: fx,
            fault_at: None,
        },
    )
    .unwrap();
    p.upload(
        y,
        &Src {
            data: fy,
            fault_at: None,
        },
    )
    .unwrap();
    let vadd = abi::VaddParams {
        c: z,
        a: x,
        b: y,
        n,
    };
    log(format!("vadd {:?}", launch(p, "vadd_f32", vadd.as_slice())));
    let saxpy = abi::SaxpyParams {
        y,
        x,
        n,
        a: 1.5,
        reserved: 0,
    };
    log(format!(
        "saxpy {:?}",
        launch(p, "saxpy_f32", saxpy.as_slice())
    ));
    let reduce = abi::ReduceSumParams {
        out: z,
        input: y,
        n,
    };
    log(format!(
        "reduce {:?}",
        launch(p, "reduce_sum_f32", reduce.as_slice())
    ));
    let sgemm = abi::SgemmParams {
        c: z,
        a: x,
        b: y,
        m: 64,
        n: 64,
        k: 64,
        alpha: 0.5,
        beta: 0.25,
        reserved: 0,
    };
    log(format!(
        "sgemm {:?}",
        launch(p, "sgemm_f32", sgemm.as_slice())
    ));
    log(format!("bad entry {:?}", launch(p, "nope", &[])));
    log(format!("bad params {:?}", launch(p, "vadd_f32", &[0; 3])));
    for d in [x, y, z] {
        let sink = Sink::new(4 * n as usize, None);
        p.download(d, &sink).unwrap();
        log(format!("result {:x}", fnv(&sink.data.borrow())));
    }
    log(format!(
        "module {:?}",
        p.module_load(abi::MODULE_FORMAT_PTX, b"// ptx")
    ));
    log(format!("unload {:?}", p.module_unload(5)));
    log(format!(
        "unload builtin {:?}",
        p.module_unload(abi::MODULE_BUILTIN)
    ));
    log(format!("too much {:?}", p.alloc(MEMORY, 0)));
    log(format!("bad align {:?}", p.alloc(16, 3)));
    log(format!("free {:?}", p.free(a)));
    log(format!("free again {:?}", p.free(a)));
    log(format!("used {}", p.memory_used()));
    p.reset();
    log(format!("after reset {} {:?}", p.memory_used(), p.free(b)));
    log(format!("alloc {:?}", p.alloc(4096, 0)));
    out
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn every_call_matches_the_in_process_backend() {
    every_call_matches(backend(MEMORY, 2));
}

#[test]
fn every_call_matches_the_in_process_backend_through_the_mailbox() {
    every_call_matches(polling_backend(MEMORY, 2));
}

fn every_call_matches(remote: RemoteBackend) {
    let local = SoftwareBackend::new(MEMORY, 2);
    let mut lp = local.create_partition(&spec("p", MEMORY, 2)).unwrap();
    assert_eq!(remote.name(), "software");
    assert_eq!(remote.capacity(), local.capacity());
    let mut rp = remote
        .create_remote_partition(&spec("p", MEMORY, 2))
        .unwrap();
    assert!(rp.host_pid().is_some());
    // What the host's partition offers comes over with it.
    assert_eq!(rp.kernel_compute_units(), lp.kernel_compute_units());
    assert!(rp.cooperative() && lp.cooperative());
    let want = script(&mut *lp);
    let got = script(&mut rp);
    assert_eq!(got, want);
    // The script reached the paths it is meant to compare.
    for line in [
        "faulty upload Err(Fault(10))",
        "faulty download Err(Fault(200000))",
        "vadd Ok(())",
        "sgemm Ok(())",
    ] {
        assert!(want.iter().any(|l| l == line), "{line} not in {want:#?}");
    }
    assert!(rp.failure().is_none());
}

/// The behaviour every backend shares (see `vgpu_backend::conformance`),
/// through partition hosts running the software backend.
fn conformance_through(remote: RemoteBackend) {
    let make = |s: &PartitionSpec| remote.create_partition(s).unwrap();
    conformance::run_all(&make);
    conformance::arrays_copy_boxes(&make);
    // Guest modules: images and parameter blocks through the protocol,
    // kernels on the host's PTX executor.
    conformance::run_loaded_modules(&make);
    // Virtual memory requests through the protocol, run by the host.
    conformance::vmm_map_side_by_side_and_alias(&make);
    conformance::vmm_grow_and_shrink_a_segment(&make);
}

#[test]
fn conformance_through_partition_hosts() {
    conformance_through(backend(MEMORY, 8));
}

#[test]
fn conformance_through_partition_hosts_and_the_mailbox() {
    conformance_through(polling_backend(MEMORY, 8));
}

#[test]
fn placement_is_kept_by_the_daemon() {
    let b = backend(MEMORY, 4);
    let p1 = b.create_partition(&spec("a", 48 * MIB, 3)).unwrap();
    // A software partition's kernels run on its own threads.
    assert_eq!(p1.kernel_compute_units(), 3);
    match b.create_partition(&spec("b", 32 * MIB, 2)) {
        Err(BackendError::DoesNotFit(m)) => assert!(m.contains("bytes of memory"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a partition over the capacity was created"),
    }
    assert_eq!(b.unclaimed().memory, 16 * MIB);
    drop(p1);
    assert_eq!(b.unclaimed().memory, MEMORY);
    assert_eq!(b.unclaimed().compute_units, 4);
    let _p2 = b.create_partition(&spec("b", 32 * MIB, 2)).unwrap();
}

/// sgemm 512^3 `reps` times: long work for a software partition.
fn long_sgemm(p: &mut dyn Partition, reps: u32) -> Result<(), OpError> {
    let n = 512u64;
    let a = p.alloc(4 * n * n, 0)?;
    let c = p.alloc(4 * n * n, 0)?;
    let params = abi::SgemmParams {
        c,
        a,
        b: a,
        m: n as u32,
        n: n as u32,
        k: n as u32,
        alpha: 1.0,
        beta: 0.0,
        reserved: 0,
    };
    for _ in 0..reps {
        launch(p, "sgemm_f32", params.as_slice())?;
    }
    Ok(())
}

fn kill(pid: u32) {
    // SAFETY: plain kill(2) of a child process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// Waits until `pid` has died (a zombie not yet reaped, or gone).
fn wait_dead(pid: u32) {
    for _ in 0..5000 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(stat)
                if stat
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z')) =>
            {
                return
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    panic!("host {pid} did not die");
}

#[test]
fn a_killed_host_fails_only_its_partition_until_reset() {
    killed_host(backend(MEMORY, 2));
}

#[test]
fn a_killed_polling_host_fails_only_its_partition_until_reset() {
    killed_host(polling_backend(MEMORY, 2));
}

fn killed_host(b: RemoteBackend) {
    let mut victim = b
        .create_remote_partition(&spec("victim", 32 * MIB, 1))
        .unwrap();
    let mut other = b
        .create_remote_partition(&spec("other", 32 * MIB, 1))
        .unwrap();
    let pid = victim.host_pid().unwrap();
    let keep = other.alloc(4096, 0).unwrap();
    other
        .upload(
            keep,
            &Src {
                data: vec![0x5a; 4096],
                fault_at: None,
            },
        )
        .unwrap();
    // Killed in the middle of a long command.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        kill(pid);
    });
    let r = long_sgemm(&mut victim, 1000);
    killer.join().unwrap();
    match r {
        Err(OpError::Device(m)) => assert!(m.contains("partition host"), "{m}"),
        other => panic!("expected a device error, got {other:?}"),
    }
    assert!(victim.failure().is_some());
    assert!(victim.host_pid().is_none(), "the dead host was reaped");
    assert_eq!(victim.memory_used(), 0);
    // Every later call fails the same way...
    assert!(matches!(victim.alloc(16, 0), Err(OpError::Device(_))));
    assert!(matches!(victim.fill(0, 4, 0), Err(OpError::Device(_))));
    // ...while the other partition keeps working.
    let sink = Sink::new(4096, None);
    other.download(keep, &sink).unwrap();
    assert_eq!(*sink.data.borrow(), vec![0x5a; 4096]);
    long_sgemm(&mut other, 1).unwrap();
    // Reset starts a fresh host, and the partition works again.
    victim.reset();
    assert!(victim.failure().is_none());
    let new_pid = victim.host_pid().unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(victim.memory_used(), 0);
    let a = victim.alloc(4096, 0).unwrap();
    victim.fill(a, 4096, 0x0707_0707).unwrap();
    let sink = Sink::new(4096, None);
    victim.download(a, &sink).unwrap();
    assert_eq!(*sink.data.borrow(), vec![7; 4096]);
    // A host killed while idle is noticed at the next call.
    kill(new_pid);
    wait_dead(new_pid);
    assert!(matches!(victim.alloc(16, 0), Err(OpError::Device(_))));
    victim.reset();
    assert!(victim.alloc(16, 0).is_ok());
}

fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Processes whose parent or grandparent is this one (zombies included):
/// launchers and the hosts they started.
fn children() -> Vec<u32> {
    let mut parent = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent.push((pid, ppid));
        }
    }
    let me = std::process::id();
    let kids: Vec<u32> = parent.iter().filter(|p| p.1 == me).map(|p| p.0).collect();
    let grandkids = parent.iter().filter(|p| kids.contains(&p.1)).map(|p| p.0);
    let mut out = kids.clone();
    out.extend(grandkids);
    out
}

#[test]
fn no_descriptor_or_process_leaks_over_many_cycles() {
    // Descriptors and children are counted per process: other tests
    // running beside this one would change both, so it runs alone in a
    // child process of the test binary.
    const ALONE: &str = "VGPU_REMOTE_LEAK_TEST";
    if std::env::var_os(ALONE).is_some() {
        leak_cycles(backend(MEMORY, 2));
        leak_cycles(polling_backend(MEMORY, 2));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "no_descriptor_or_process_leaks_over_many_cycles",
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
}

fn leak_cycles(b: RemoteBackend) {
    // Warm up: the launcher and the first host's descriptors.
    drop(b.create_partition(&spec("w", MIB, 1)).unwrap());
    let fds = count_fds();
    let kids = children().len();
    for i in 0..40 {
        let mut p = b.create_remote_partition(&spec("c", 4 * MIB, 1)).unwrap();
        let a = p.alloc(4096, 0).unwrap();
        p.upload(
            a,
            &Src {
                data: vec![1; 4096],
                fault_at: None,
            },
        )
        .unwrap();
        if i % 4 == 0 {
            kill(p.host_pid().unwrap());
            let _ = p.fill(a, 4, 0);
        }
        if i % 2 == 0 {
            p.reset();
            assert!(p.alloc(16, 0).is_ok());
        }
    }
    assert_eq!(count_fds(), fds, "descriptors leaked");
    assert_eq!(
        children().len(),
        kids,
        "hosts left behind: {:?}",
        children()
    );
    assert_eq!(b.unclaimed().memory, MEMORY);
}

#[test]
fn a_host_that_cannot_start_is_reported() {
    let bad = Arc::new(
        ProcessLauncher::new(host_program(), vec!["--backend".into(), "nope".into()]).unwrap(),
    );
    match RemoteBackend::new(bad, config()) {
        Err(BackendError::Unavailable(m)) => assert!(m.contains("partition host"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The launcher is the same program: a missing one is refused at once.
    let missing = ProcessLauncher::new("/nonexistent/host".into(), vec![]);
    assert_eq!(
        missing.unwrap_err().kind(),
        std::io::ErrorKind::NotFound,
        "a launcher from a missing program"
    );
    // A program that is not a launcher never answers as one, whether it
    // exits or stays silent (it is killed then).
    let e = ProcessLauncher::new("/bin/false".into(), vec![]).unwrap_err();
    assert!(e.to_string().contains("launcher"), "{e}");
    let dir = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpu-remote-").unwrap();
    let silent = dir.as_path().join("silent");
    std::fs::write(&silent, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&silent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let t = std::time::Instant::now();
    let e = ProcessLauncher::new(silent, vec![]).unwrap_err();
    assert!(e.to_string().contains("no answer"), "{e}");
    assert!(t.elapsed() < vgpu_backend_remote::launcher::REPLY_TIMEOUT * 2);
}

// ---- fake hosts -------------------------------------------------------

/// What a fake host does after answering hello and create properly.
type Script = fn(&mut UnixStream, Header);

#[derive(Debug)]
struct FakeLauncher {
    script: Script,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

fn read_frame(s: &mut UnixStream) -> Option<(Header, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).ok()?;
    let h = Header::decode(&h, proto::MAX_REQUEST).unwrap();
    let mut p = vec![0; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, p))
}

fn write_frame(s: &mut UnixStream, kind: u16, seq: u32, payload: &[u8]) {
    let h = Header {
        kind,
        seq,
        len: payload.len() as u32,
    };
    let _ = s.write_all(&h.encode());
    let _ = s.write_all(payload);
}

fn reply(s: &mut UnixStream, h: Header, kind: Kind, r: Reply) {
    write_frame(s, REPLY | kind as u16, h.seq, &r.encode(kind));
}

fn ok(memory_used: u64, v: Value) -> Reply {
    Reply {
        memory_used,
        result: Ok(v),
    }
}

impl Launcher for FakeLauncher {
    fn launch(&self) -> std::io::Result<HostLink> {
        let (ours, mut theirs) = UnixStream::pair()?;
        let script = self.script;
        let t = std::thread::spawn(move || {
            let s = &mut theirs;
            let Some((h, _)) = read_frame(s) else { return };
            let hello = Value::Hello {
                name: "fake".into(),
                capacity: vgpu_backend::Capacity {
                    memory: MEMORY,
                    compute_units: 2,
                },
            };
            reply(s, h, Kind::Hello, ok(0, hello));
            let Some((h, _)) = read_frame(s) else { return };
            if h.kind != Kind::Control as u16 {
                return;
            }
            reply(s, h, Kind::Control, ok(0, Value::None));
            let Some((h, _)) = read_frame(s) else { return };
            if h.kind != Kind::Create as u16 {
                return;
            }
            let created = Value::Created {
                units: 2,
                cooperative: false,
                vmm: false,
                arrays: false,
            };
            reply(s, h, Kind::Create, ok(0, created));
            let Some((h, _)) = read_frame(s) else { return };
            script(s, h);
            // Stay until the parent hangs up.
            while read_frame(s).is_some() {}
        });
        self.threads.lock().unwrap().push(t);
        Ok(HostLink {
            stream: ours,
            process: None,
            shared_pid: None,
        })
    }
}

/// Runs one call against a fake host playing `script`; the call must fail
/// with a device error, and so must the next.
fn against_fake(script: Script, call: fn(&mut dyn Partition) -> Result<(), OpError>) -> String {
    let fake = Arc::new(FakeLauncher {
        script,
        threads: Mutex::new(Vec::new()),
    });
    let cfg = RemoteConfig {
        op_timeout: Duration::from_millis(300),
        ..config()
    };
    let b = RemoteBackend::new(fake.clone(), cfg).unwrap();
    let mut p = b.create_remote_partition(&spec("f", MIB, 1)).unwrap();
    let r = call(&mut p);
    let Err(OpError::Device(m)) = r else {
        panic!("expected a device error, got {r:?}");
    };
    assert!(matches!(p.alloc(16, 0), Err(OpError::Device(_))));
    let why = p.failure().unwrap().to_string();
    drop(p);
    for t in fake.threads.lock().unwrap().drain(..) {
        t.join().unwrap();
    }
    assert!(m.contains(&why), "{m} / {why}");
    why
}

fn alloc_call(p: &mut dyn Partition) -> Result<(), OpError> {
    p.alloc(4096, 0).map(|_| ())
}

#[test]
fn fake_host_bad_replies_are_refused() {
    // A header over the reply bound.
    let why = against_fake(
        |s, h| {
            let head = Header {
                kind: REPLY | Kind::Alloc as u16,
                seq: h.seq,
                len: proto::MAX_REPLY + 1,
            };
            let _ = s.write_all(&head.encode());
        },
        alloc_call,
    );
    assert!(why.contains("exceeds"), "{why}");
    // Wrong magic.
    let why = against_fake(
        |s, _| {
            let _ = s.write_all(&[0xff; HEADER_LEN]);
        },
        alloc_call,
    );
    assert!(why.contains("magic"), "{why}");
    // A stale sequence number.
    let why = against_fake(
        |s, h| {
            let h2 = Header {
                seq: h.seq + 5,
                ..h
            };
            reply(s, h2, Kind::Alloc, ok(0, Value::U64(1)));
        },
        alloc_call,
    );
    assert!(why.contains("sequence"), "{why}");
    // The reply of another kind.
    let why = against_fake(
        |s, h| reply(s, h, Kind::Free, ok(0, Value::None)),
        alloc_call,
    );
    assert!(why.contains("kind"), "{why}");
    // Memory in use over the quota.
    let why = against_fake(
        |s, h| reply(s, h, Kind::Alloc, ok(2 * MIB, Value::U64(1))),
        alloc_call,
    );
    assert!(why.contains("quota"), "{why}");
    // A trailing byte.
    let why = against_fake(
        |s, h| {
            let mut p = ok(0, Value::U64(1)).encode(Kind::Alloc);
            p.push(0);
            write_frame(s, REPLY | Kind::Alloc as u16, h.seq, &p);
        },
        alloc_call,
    );
    assert!(why.contains("trailing"), "{why}");
    // Silence.
    let why = against_fake(
        |_, _| std::thread::sleep(Duration::from_millis(600)),
        alloc_call,
    );
    assert!(why.contains("no answer"), "{why}");
    // Hanging up.
    let why = against_fake(
        |s, _| drop(s.shutdown(std::net::Shutdown::Both)),
        alloc_call,
    );
    assert!(why.contains("exited"), "{why}");
}

fn piece(offset: u64, len: u64, at: u64) -> Vec<u8> {
    proto::Piece { offset, len, at }.encode()
}

fn upload_call(p: &mut dyn Partition) -> Result<(), OpError> {
    let src = Src {
        data: vec![1; 200_000],
        fault_at: None,
    };
    p.upload(0x1000, &src)
}

fn download_call(p: &mut dyn Partition) -> Result<(), OpError> {
    let sink = Sink::new(200_000, None);
    p.download(0x1000, &sink)
}

#[test]
fn fake_host_bad_transfers_are_refused() {
    // A guest memory fault that never happened.
    let why = against_fake(
        |s, h| {
            let r = Reply {
                memory_used: 0,
                result: Err(OpError::Fault(3)),
            };
            reply(s, h, Kind::Upload, r)
        },
        upload_call,
    );
    assert!(why.contains("did not happen"), "{why}");
    // Asking for bytes past the transfer.
    let why = against_fake(
        |s, h| write_frame(s, Kind::Need as u16, h.seq, &piece(199_999, 2, 0)),
        upload_call,
    );
    assert!(why.contains("asked for"), "{why}");
    // More than the staging area.
    let why = against_fake(
        |s, h| write_frame(s, Kind::Need as u16, h.seq, &piece(0, 1 << 20, 0)),
        upload_call,
    );
    assert!(why.contains("asked for"), "{why}");
    // A piece that would cross the end of the staging area.
    let why = against_fake(
        |s, h| write_frame(s, Kind::Need as u16, h.seq, &piece(0, 16, 64 * 1024 - 8)),
        upload_call,
    );
    assert!(why.contains("asked for"), "{why}");
    let why = against_fake(
        |s, h| write_frame(s, Kind::Out as u16, h.seq, &piece(0, 16, u64::MAX - 4)),
        download_call,
    );
    assert!(why.contains("download piece"), "{why}");
    // A callback that does not belong to this request.
    let why = against_fake(
        |s, h| write_frame(s, Kind::Out as u16, h.seq, &piece(0, 1, 0)),
        upload_call,
    );
    assert!(why.contains("kind"), "{why}");
    // Asking for the same piece over and over.
    let why = against_fake(
        |s, h| loop {
            write_frame(s, Kind::Need as u16, h.seq, &piece(0, 16, 0));
            if read_frame(s).is_none() {
                break;
            }
        },
        upload_call,
    );
    assert!(why.contains("too many"), "{why}");
    // Download pieces out of order.
    let why = against_fake(
        |s, h| write_frame(s, Kind::Out as u16, h.seq, &piece(16, 16, 0)),
        download_call,
    );
    assert!(why.contains("download piece"), "{why}");
    // A download that ends short.
    let why = against_fake(
        |s, h| {
            let v = Value::Download {
                offset: 0,
                len: 1000,
                at: 0,
            };
            reply(s, h, Kind::Download, ok(0, v))
        },
        download_call,
    );
    assert!(why.contains("ended at"), "{why}");
}

/// Starts a run of one timestamp and finishes it.
fn started_call(p: &mut dyn Partition) -> Result<(), OpError> {
    match p.start_queued(0, &[Queued::Timestamp], &|| false, false) {
        Started::InFlight => {}
        Started::Done(done) => return done[0].result.clone(),
    }
    let (_, f) = p.finish_queued().expect("the run in flight");
    assert_eq!(f.done.len(), 1);
    f.done[0].result.clone()
}

#[test]
fn fake_host_bad_run_results_are_refused() {
    // A start answered with the results of a run of two steps.
    let why = against_fake(
        |s, h| {
            let done = vec![LaneRun {
                lane: 0,
                run: Finished {
                    waited_ns: 0,
                    done: vec![
                        QueuedDone {
                            result: Ok(()),
                            end_ns: 0,
                        };
                        2
                    ],
                },
            }];
            reply(s, h, Kind::Start, ok(0, Value::Started(done)));
        },
        started_call,
    );
    assert!(
        why.contains("unexpected result of 1 started steps"),
        "{why}"
    );
    // Results of more runs than were started.
    let why = against_fake(
        |s, h| {
            let one = LaneRun {
                lane: 0,
                run: Finished {
                    waited_ns: 0,
                    done: vec![QueuedDone {
                        result: Ok(()),
                        end_ns: 0,
                    }],
                },
            };
            reply(
                s,
                h,
                Kind::Start,
                ok(0, Value::Started(vec![one.clone(), one])),
            );
        },
        started_call,
    );
    assert!(why.contains("on lane 0 it was not given"), "{why}");
    // The result of a run on a lane that has none.
    let why = against_fake(
        |s, h| {
            let other = LaneRun {
                lane: 3,
                run: Finished {
                    waited_ns: 0,
                    done: vec![QueuedDone {
                        result: Ok(()),
                        end_ns: 0,
                    }],
                },
            };
            reply(s, h, Kind::Start, ok(0, Value::Started(vec![other])));
        },
        started_call,
    );
    assert!(why.contains("on lane 3 it was not given"), "{why}");
    // A finish answered with three results for one step.
    let why = against_fake(
        |s, h| {
            reply(s, h, Kind::Start, ok(0, Value::Started(Vec::new())));
            let Some((h, _)) = read_frame(s) else { return };
            let three = LaneRun {
                lane: 0,
                run: Finished {
                    waited_ns: 0,
                    done: vec![
                        QueuedDone {
                            result: Ok(()),
                            end_ns: 0,
                        };
                        3
                    ],
                },
            };
            reply(s, h, Kind::Finish, ok(0, Value::Finished(three)));
        },
        started_call,
    );
    assert!(
        why.contains("unexpected result of 1 started steps"),
        "{why}"
    );
}
