//! Partition hosts on an NVIDIA GPU (CUDA, isolated mode, guest PTX
//! allowed): a tenant whose loaded kernel writes through a wild pointer
//! loses only its own host, while another tenant's sgemm keeps running
//! and stays correct; a reset gives the faulted tenant a fresh host;
//! guest COPYs reach the host as forwarded guest memory; what guest
//! kernels print reaches their console.
//!
//! Without a CUDA driver each test prints "skipped: no CUDA driver" and
//! returns; with `VGPU_REQUIRE_GPU=1` that fails instead.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_abi::{self as abi, ByteValued};
use vgpu_backend::{Backend, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec};
use vgpu_backend_remote::{
    HostOptions, InnerBackend, ProcessLauncher, RemoteBackend, RemoteConfig, RemotePartition,
};

const MIB: u64 = 1 << 20;

fn required() -> bool {
    std::env::var_os("VGPU_REQUIRE_GPU").is_some_and(|v| v == "1")
}

fn gpu() -> bool {
    match vgpu_backend_cuda::cuda_available() {
        Ok(()) => true,
        Err(why) => {
            assert!(!required(), "VGPU_REQUIRE_GPU=1 but {why}");
            vgpu_testkit::skip(&format!("no CUDA driver ({why})"));
            false
        }
    }
}

fn host_program() -> PathBuf {
    std::env::var_os("VGPU_PARTITION_HOST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vgpu-partition-host")))
}

/// Hosts with guest PTX allowed, both ends polling for `spin` (frames
/// through the mailbox when it is not zero).
fn backend_with(spin: Duration) -> RemoteBackend {
    let args = HostOptions {
        backend: InnerBackend::Cuda {
            device: 0,
            guest_ptx: true,
            spatial: false,
        },
        spin,
    }
    .to_args();
    let launcher = Arc::new(ProcessLauncher::new(host_program(), args).unwrap());
    let config = RemoteConfig {
        spin,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(launcher, config).unwrap()
}

fn backend() -> RemoteBackend {
    backend_with(Duration::ZERO)
}

const POLL: Duration = Duration::from_micros(50);

fn partition(b: &RemoteBackend, name: &str) -> RemotePartition {
    b.create_remote_partition(&PartitionSpec {
        name: name.into(),
        memory: 256 * MIB,
        compute_units: 1,
    })
    .unwrap()
}

struct Src(Vec<u8>);

impl HostSource for Src {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let o = offset as usize;
        buf.copy_from_slice(&self.0[o..o + buf.len()]);
        Ok(())
    }
}

struct Sink(RefCell<Vec<u8>>);

impl HostSink for Sink {
    fn len(&self) -> u64 {
        self.0.borrow().len() as u64
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        let o = offset as usize;
        self.0.borrow_mut()[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
}

fn download(p: &mut dyn Partition, addr: u64, len: usize) -> Result<Vec<u8>, OpError> {
    let sink = Sink(RefCell::new(vec![0; len]));
    p.download(addr, &sink)?;
    Ok(sink.0.into_inner())
}

fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// A tenant repeating sgemm (n x n) and checking each result against a
/// host reference.
struct Sgemm {
    c: u64,
    params: abi::SgemmParams,
    want: Vec<f64>,
    n: usize,
}

impl Sgemm {
    fn new(p: &mut dyn Partition, n: usize) -> Sgemm {
        let (a, b) = (floats(1, n * n), floats(2, n * n));
        let bytes_len = 4 * (n * n) as u64;
        let da = p.alloc(bytes_len, 0).unwrap();
        let db = p.alloc(bytes_len, 0).unwrap();
        let c = p.alloc(bytes_len, 0).unwrap();
        p.upload(da, &Src(bytes(&a))).unwrap();
        p.upload(db, &Src(bytes(&b))).unwrap();
        let mut want = vec![0f64; n * n];
        for i in 0..n {
            for k in 0..n {
                let aik = f64::from(a[i * n + k]);
                for j in 0..n {
                    want[i * n + j] += aik * f64::from(b[k * n + j]);
                }
            }
        }
        let params = abi::SgemmParams {
            c,
            a: da,
            b: db,
            m: n as u32,
            n: n as u32,
            k: n as u32,
            reserved: 0,
            alpha: 1.0,
            beta: 0.0,
        };
        Sgemm { c, params, want, n }
    }

    fn run(&self, p: &mut dyn Partition) -> Result<(), String> {
        p.fill(self.c, 4 * (self.n * self.n) as u64, 0)
            .map_err(|e| e.to_string())?;
        p.launch(&Launch {
            cluster: [1, 1, 1],
            cooperative: false,
            module: abi::MODULE_BUILTIN,
            entry: "sgemm_f32",
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            params: self.params.as_slice(),
        })
        .map_err(|e| e.to_string())?;
        let got = download(p, self.c, 4 * self.n * self.n).map_err(|e| e.to_string())?;
        for (i, w) in got.chunks_exact(4).enumerate() {
            let g = f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            if (g - self.want[i]).abs() > 1e-3 * (1.0 + self.want[i].abs()) {
                return Err(format!("element {i}: {g} != {}", self.want[i]));
            }
        }
        Ok(())
    }
}

/// `*p = v`, and a kernel that writes through whatever pointer it is given.
const POKE: &str = r#"
extern "C" __global__ void poke(unsigned int *p, unsigned int v) { *p = v; }
"#;

fn poke(p: &mut dyn Partition, module: u64, addr: u64, v: u32) -> Result<(), OpError> {
    let mut params = addr.to_le_bytes().to_vec();
    params.extend_from_slice(&v.to_le_bytes());
    p.launch(&Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module,
        entry: "poke",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: &params,
    })
}

fn poke_ptx() -> Vec<u8> {
    let mut v = cudarc::nvrtc::compile_ptx(POKE)
        .expect("test kernel compiles")
        .to_src()
        .into_bytes();
    v.push(0);
    v
}

#[test]
fn a_faulting_tenant_loses_only_its_own_host() {
    if !gpu() {
        return;
    }
    faulting_tenant(backend());
}

#[test]
fn a_faulting_polling_tenant_loses_only_its_own_host() {
    if !gpu() {
        return;
    }
    faulting_tenant(backend_with(POLL));
}

fn faulting_tenant(b: RemoteBackend) {
    let mut victim = partition(&b, "victim");
    let mut faulty = partition(&b, "faulty");
    let victim_pid = victim.host_pid().unwrap();
    let faulty_pid = faulty.host_pid().unwrap();
    println!("probe: hosts: victim {victim_pid}, faulty {faulty_pid}");

    let sgemm = Sgemm::new(&mut victim, 512);
    sgemm.run(&mut victim).unwrap();
    let marker = victim.alloc(4096, 0).unwrap();
    victim.upload(marker, &Src(vec![0x5a; 4096])).unwrap();

    // The victim keeps running sgemm in its own thread meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let runner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut runs = 0u32;
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) || runs < 20 {
                if let Err(e) = sgemm.run(&mut victim) {
                    return (victim, runs, Err(e));
                }
                runs += 1;
                if start.elapsed() > Duration::from_secs(60) {
                    break;
                }
            }
            (victim, runs, Ok(()))
        })
    };

    let m = faulty
        .module_load(abi::MODULE_FORMAT_PTX, &poke_ptx())
        .unwrap();
    let own = faulty.alloc(4096, 0).unwrap();
    poke(&mut faulty, m, own, 0xdead_beef).unwrap();
    assert_eq!(
        download(&mut faulty, own, 4).unwrap(),
        0xdead_beefu32.to_le_bytes()
    );
    // The victim's allocation, named directly: another process's address
    // space, so this either faults or lands in the faulty tenant's own
    // memory; the victim's bytes are checked below either way.
    let r = poke(&mut faulty, m, marker, 0x0707_0707);
    println!("probe: a loaded kernel writing the other tenant's address: {r:?}");
    let m = if r.is_err() {
        faulty.reset();
        faulty
            .module_load(abi::MODULE_FORMAT_PTX, &poke_ptx())
            .unwrap()
    } else {
        m
    };
    // A wild pointer.
    let t = Instant::now();
    let r = poke(&mut faulty, m, 0x1000, 1);
    println!(
        "probe: a loaded kernel writing a wild address: {r:?} after {:?}",
        t.elapsed()
    );
    // The kernel's own command reports the fault as such (a guest's
    // CUDA_ERROR_ILLEGAL_ADDRESS).
    let Err(OpError::KernelFault(msg)) = r else {
        panic!("expected a kernel fault, got {r:?}");
    };
    assert!(!msg.is_empty());
    // Later calls fail until reset: the device state is gone.
    let r = faulty.alloc(4096, 0);
    println!("probe: the faulty tenant's next call: {r:?}");
    assert!(
        matches!(r, Err(OpError::Device(_) | OpError::Lost(_))),
        "{r:?}"
    );

    stop.store(true, Ordering::Relaxed);
    let (mut victim, runs, outcome) = runner.join().unwrap();
    println!("probe: the victim ran sgemm 512^3 {runs} times meanwhile: {outcome:?}");
    outcome.unwrap();
    assert_eq!(
        victim.host_pid(),
        Some(victim_pid),
        "the victim's host lives on"
    );
    assert_eq!(
        download(&mut victim, marker, 4096).unwrap(),
        vec![0x5a; 4096]
    );

    // Reset: a fresh host, usable at once.
    let t = Instant::now();
    faulty.reset();
    println!(
        "probe: reset of the faulted tenant (new host) took {:?}; failure now {:?}",
        t.elapsed(),
        faulty.failure()
    );
    assert!(faulty.failure().is_none());
    assert_ne!(faulty.host_pid(), Some(faulty_pid));
    assert_eq!(faulty.memory_used(), 0);
    let m = faulty
        .module_load(abi::MODULE_FORMAT_PTX, &poke_ptx())
        .unwrap();
    let own = faulty.alloc(4096, 0).unwrap();
    poke(&mut faulty, m, own, 0x1234_5678).unwrap();
    assert_eq!(
        download(&mut faulty, own, 4).unwrap(),
        0x1234_5678u32.to_le_bytes()
    );
    let again = Sgemm::new(&mut faulty, 256);
    again.run(&mut faulty).unwrap();
    // And the victim still computes correctly.
    let sgemm = Sgemm::new(&mut victim, 256);
    sgemm.run(&mut victim).unwrap();
}

/// Spatial mode: green contexts of one shared host. A fault in one
/// partition loses the process's CUDA state, so the host ends and every
/// partition of it reports its state lost; a reset of each gets a fresh
/// shared host within a second, where all compute again.
#[test]
fn spatial_partitions_recover_from_a_fault_in_a_fresh_host() {
    use vgpu_backend_remote::HostPolicy;
    if !gpu() {
        return;
    }
    let args = HostOptions {
        backend: InnerBackend::Cuda {
            device: 0,
            guest_ptx: true,
            spatial: true,
        },
        spin: Duration::ZERO,
    }
    .to_args();
    let policy = HostPolicy {
        shared: true,
        ..HostPolicy::default()
    };
    let launcher = ProcessLauncher::with_policy(host_program(), args, &policy).unwrap();
    let config = RemoteConfig {
        shared: true,
        ..RemoteConfig::default()
    };
    let b = RemoteBackend::new(Arc::new(launcher), config).unwrap();
    // SM groups come in granules of 8 on Hopper.
    let spec = |name: &str| PartitionSpec {
        name: name.into(),
        memory: 256 * MIB,
        compute_units: 16,
    };
    let mut bystander = b.create_remote_partition(&spec("bystander")).unwrap();
    let mut faulty = b.create_remote_partition(&spec("faulty")).unwrap();
    let host = bystander.host_pid().unwrap();
    assert_eq!(faulty.host_pid(), Some(host), "one shared host");
    let sgemm = Sgemm::new(&mut bystander, 512);
    sgemm.run(&mut bystander).unwrap();
    let m = faulty
        .module_load(abi::MODULE_FORMAT_PTX, &poke_ptx())
        .unwrap();
    let t = Instant::now();
    let r = poke(&mut faulty, m, 0x1000, 1);
    let Err(OpError::KernelFault(_)) = r else {
        panic!("expected a kernel fault, got {r:?}");
    };
    // The bystander shares the process's fate: its state is lost too.
    while !bystander.is_lost() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the host did not end"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = sgemm.run(&mut bystander);
    assert!(r.is_err(), "{r:?}");
    let ended = t.elapsed();
    bystander.reset();
    faulty.reset();
    let recovered = t.elapsed();
    println!("probe: spatial fault: host ended after {ended:?}; both partitions reset after {recovered:?}");
    assert!(!bystander.is_lost() && !faulty.is_lost());
    let fresh = bystander.host_pid().unwrap();
    assert_ne!(fresh, host);
    assert_eq!(faulty.host_pid(), Some(fresh));
    let sgemm = Sgemm::new(&mut bystander, 512);
    sgemm.run(&mut bystander).unwrap();
    let m = faulty
        .module_load(abi::MODULE_FORMAT_PTX, &poke_ptx())
        .unwrap();
    let own = faulty.alloc(4096, 0).unwrap();
    poke(&mut faulty, m, own, 0x1234_5678).unwrap();
    assert_eq!(
        download(&mut faulty, own, 4).unwrap(),
        0x1234_5678u32.to_le_bytes()
    );
}

#[test]
fn healthy_reset_stays_in_place() {
    if !gpu() {
        return;
    }
    let b = backend();
    let mut p = partition(&b, "reset");
    // Time-shared partitions run kernels on the whole device, and the
    // guest is told so (persistent kernels size their grids by it).
    let device_sms = b.capacity().compute_units;
    assert_eq!(p.kernel_compute_units(), device_sms);
    let pid = p.host_pid().unwrap();
    let a = p.alloc(MIB, 0).unwrap();
    p.fill(a, MIB, 0x0303_0303).unwrap();
    assert_eq!(p.memory_used(), MIB);
    p.reset();
    assert_eq!(p.host_pid(), Some(pid), "a healthy host resets in place");
    assert_eq!(p.memory_used(), 0);
    let a = p.alloc(MIB, 0).unwrap();
    assert_eq!(download(&mut p, a, 64).unwrap(), vec![0; 64]);
}

/// What guest kernels print on the GPU, which NVIDIA's driver writes to
/// the partition host's standard output, reaches the partition's
/// console: every thread's line, once, after launches and queued runs.
#[test]
fn printf_of_guest_kernels_reaches_the_console() {
    if !gpu() {
        return;
    }
    let b = backend();
    let make = |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(&b, &s.name)) };
    vgpu_backend::conformance::module_printf(&make);
    vgpu_backend::conformance::module_assert(&make);
}

/// CUDA arrays, texture and surface objects of the host's driver,
/// through the protocol: copies, sampling and surface stores as the
/// software backend does them, and the kernels use the driver's object
/// handles as they are.
#[test]
fn arrays_textures_and_surfaces_are_the_hosts() {
    if !gpu() {
        return;
    }
    let b = backend();
    let make = |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(&b, &s.name)) };
    assert!(make(&vgpu_backend::conformance::spec("arrays", 16 * MIB, 1)).arrays());
    vgpu_backend::conformance::arrays_copy_boxes(&make);
    vgpu_backend::conformance::module_textures_and_surfaces(&make);
}

#[test]
fn transfers_across_many_pieces_roundtrip() {
    if !gpu() {
        return;
    }
    for b in [backend(), backend_with(POLL)] {
        transfers(b);
    }
}

fn transfers(b: RemoteBackend) {
    let mut p = partition(&b, "xfer");
    // 40 MiB and a bit: ten 4 MiB pieces and a tail, through both halves.
    let len = 40 * MIB as usize + 12_345;
    let data: Vec<u8> = floats(9, len / 4 + 1)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .take(len)
        .collect();
    let a = p.alloc(len as u64, 0).unwrap();
    p.upload(a, &Src(data.clone())).unwrap();
    assert!(download(&mut p, a, len).unwrap() == data);
    // An unaligned window inside it.
    let part = download(&mut p, a + 4_000_001, 9_000_000).unwrap();
    assert!(part[..] == data[4_000_001..13_000_001]);
}

#[test]
fn guest_copies_through_a_host_use_forwarded_guest_memory() {
    use vgpu_device::testing::{test_config, TestVgpu};
    use vgpu_testkit::{GuestOptions, Mode};
    if !gpu() {
        return;
    }
    let b = backend();
    let p = partition(&b, "guest");
    let counts = p.transfer_counts();
    let server = TestVgpu::start(test_config("guest", 1), Box::new(p));
    let mut g = server.connect_with(GuestOptions {
        ram_size: 256 * MIB,
        ..GuestOptions::default()
    });
    g.setup_queue(0, 32, Mode::Interrupt);
    // Scattered buffers both ways, before and after the host has
    // registered guest RAM with the driver (in the background).
    let lens = [3 * MIB + 5, 4096, 17 * MIB, 1];
    let total: u64 = lens.iter().sum();
    let dev = g.device_alloc(0, total);
    let src = g.alloc_sg(&lens);
    let back = g.alloc_sg(&[total - 3, 3]);
    let t = Instant::now();
    let mut round = 0u64;
    while round < 3 || t.elapsed() < Duration::from_secs(2) {
        let data: Vec<u8> = (0..total)
            .map(|i| (i * 13 + round + i / 4099) as u8)
            .collect();
        g.write_sg(&src, &data);
        assert_eq!(g.copy_to_device(0, dev, &src).status, abi::STATUS_OK);
        assert_eq!(g.copy_from_device(0, dev, &back).status, abi::STATUS_OK);
        assert!(g.read_sg(&back) == data, "round {round}");
        round += 1;
    }
    assert_eq!(counts.staged(), 0);
    assert_eq!(counts.direct(), 2 * round);
}
