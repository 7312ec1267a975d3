//! A vGPU function whose partition lives in a partition host process,
//! driven by the test kit as a guest would: commands work as in process,
//! a host killed under it fails that function's commands with a device
//! error, and a function reset brings it back. COPYs of guest RAM reach
//! the host as pieces of guest memory it maps itself.

use std::path::PathBuf;
use std::sync::Arc;

use vgpu_backend::PartitionSpec;
use vgpu_backend_remote::{
    HostPolicy, InnerBackend, ProcessLauncher, RemoteBackend, RemoteConfig, RemotePartition,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::{bytes_to_f32s, f32s_to_bytes, guest_copy_chain, Mode};

const MIB: u64 = 1 << 20;

/// A backend whose partitions are a software backend's, each in a
/// partition host process.
fn remote_backend(config: RemoteConfig) -> RemoteBackend {
    let inner = InnerBackend::Software {
        memory: 64 * MIB,
        compute_units: 2,
    };
    let launcher = ProcessLauncher::new(
        PathBuf::from(env!("CARGO_BIN_EXE_vgpu-partition-host")),
        inner.to_args(),
    )
    .unwrap();
    RemoteBackend::new(Arc::new(launcher), config).unwrap()
}

/// The spec of a 32 MiB partition.
fn spec(name: &str) -> PartitionSpec {
    PartitionSpec {
        name: name.into(),
        memory: 32 * MIB,
        compute_units: 2,
    }
}

/// A 32 MiB partition of a software backend in a partition host process.
fn remote_partition(name: &str, config: RemoteConfig) -> RemotePartition {
    remote_backend(config)
        .create_remote_partition(&spec(name))
        .unwrap()
}

#[test]
fn vgpu_on_a_remote_partition_survives_its_host() {
    let partition = remote_partition("remote", RemoteConfig::default());
    let pid = partition.host_pid().unwrap();
    let server = TestVgpu::start(test_config("remote", 2), Box::new(partition));
    let mut g = server.connect();
    g.setup_queue(0, 32, Mode::Interrupt);

    let n = 50_000;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let vadd = |g: &mut vgpu_testkit::Guest| {
        let da = g.device_alloc(0, 4 * n as u64);
        let db = g.device_alloc(0, 4 * n as u64);
        let dc = g.device_alloc(0, 4 * n as u64);
        g.upload(0, da, &f32s_to_bytes(&a));
        g.upload(0, db, &f32s_to_bytes(&b));
        let p = abi::VaddParams {
            c: dc,
            a: da,
            b: db,
            n: n as u64,
        };
        assert_eq!(g.launch(0, "vadd_f32", &p).status, abi::STATUS_OK);
        let got = bytes_to_f32s(&g.download(0, dc, 4 * n));
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(got, want);
        assert_eq!(g.mem_used(), 12 * n as u64);
    };
    vadd(&mut g);

    // SAFETY: plain kill(2) of the host process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    // Until it has died, the host could still answer.
    let t = std::time::Instant::now();
    while !ended(pid) {
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let c = g.mem_alloc(0, 4096, 0);
    assert_eq!(c.status, abi::STATUS_DEVICE_ERROR, "{c:?}");
    assert_eq!(
        g.nop(0).status,
        abi::STATUS_OK,
        "commands without the GPU still run"
    );
    assert_eq!(
        g.mem_alloc(0, 4096, 0).status,
        abi::STATUS_DEVICE_ERROR,
        "until reset"
    );

    g.device_reset();
    g.enable_device();
    g.setup_queue(0, 32, Mode::Interrupt);
    assert_eq!(g.mem_used(), 0);
    vadd(&mut g);
}

#[test]
fn guest_copies_name_guest_memory_mapped_by_the_host() {
    let config = RemoteConfig {
        staging_bytes: 64 * 1024,
        ..RemoteConfig::default()
    };
    let partition = remote_partition("direct", config);
    let pid = partition.host_pid().unwrap();
    let counts = partition.transfer_counts();
    let server = TestVgpu::start(test_config("direct", 1), Box::new(partition));
    let mut g = server.connect();
    g.setup_queue(0, 32, Mode::Interrupt);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains("vgpu-testkit-ram"),
        "guest RAM is mapped in the host"
    );

    // Scattered guest buffers, larger than the staging area, both ways.
    let lens = [200_000u64, 4096, 333_333, 1];
    let total: u64 = lens.iter().sum();
    let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
    let src = g.alloc_sg(&lens);
    g.write_sg(&src, &data);
    let dev = g.device_alloc(0, total);
    assert_eq!(g.copy_to_device(0, dev, &src).status, abi::STATUS_OK);
    let back = g.alloc_sg(&[total - 5, 5]);
    assert_eq!(g.copy_from_device(0, dev, &back).status, abi::STATUS_OK);
    assert_eq!(g.read_sg(&back), data);
    // And a kernel sees what the pieces carried.
    let n = 1000u64;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (da, dc) = (g.device_alloc(0, 4 * n), g.device_alloc(0, 4 * n));
    g.upload(0, da, &f32s_to_bytes(&a));
    let p = abi::VaddParams {
        c: dc,
        a: da,
        b: da,
        n,
    };
    assert_eq!(g.launch(0, "vadd_f32", &p).status, abi::STATUS_OK);
    let want: Vec<f32> = a.iter().map(|x| 2.0 * x).collect();
    assert_eq!(bytes_to_f32s(&g.download(0, dc, 4 * n as usize)), want);

    // Copies submitted together go to the host as one queued run, still
    // naming guest memory; a bad device range fails alone.
    let before = counts.direct();
    let halves = [g.alloc_sg(&[100_000, 7]), g.alloc_sg(&[150_000])];
    let half = |i: usize| &data[i * 100_007..(i * 100_007 + [100_007, 150_000][i])];
    g.write_sg(&halves[0], half(0));
    g.write_sg(&halves[1], half(1));
    let ups = [
        guest_copy_chain(true, dev, &halves[0]),
        guest_copy_chain(true, dev + 100_007, &halves[1]),
        guest_copy_chain(true, dev + total, &halves[1]),
    ];
    let statuses = g.batch_statuses(0, &ups);
    assert_eq!(
        statuses,
        [abi::STATUS_OK, abi::STATUS_OK, abi::STATUS_OUT_OF_RANGE]
    );
    let outs = [g.alloc_sg(&[100_007]), g.alloc_sg(&[50_000, 100_000])];
    let downs = [
        guest_copy_chain(false, dev, &outs[0]),
        guest_copy_chain(false, dev + 100_007, &outs[1]),
    ];
    for u in g.submit_batch(0, &downs) {
        assert_eq!(u.completion().status, abi::STATUS_OK);
    }
    assert_eq!(g.read_sg(&outs[0]), half(0));
    assert_eq!(g.read_sg(&outs[1]), half(1));
    assert!(counts.direct() >= before + 5, "direct {}", counts.direct());
    assert!(counts.direct() >= 4, "direct {}", counts.direct());
    assert_eq!(counts.staged(), 0);
}

/// Commands submitted together go to the host as queued runs, the next
/// started before the last is finished; each round's result depends on
/// the one before, so a run out of order, or a result given to the wrong
/// command, would show.
#[test]
fn queued_runs_overlap_in_order_on_a_remote_partition() {
    let partition = remote_partition("overlap", RemoteConfig::default());
    let counts = partition.transfer_counts();
    let server = TestVgpu::start(test_config("overlap", 1), Box::new(partition));
    let mut g = server.connect();
    g.setup_queue(0, 256, Mode::Interrupt);

    // Rounds long enough that the worker keeps runs in flight behind
    // them (see the worker's KEEP_AFTER), however fast the machine.
    let (n, rounds) = (64u64 << 10, 60u64);
    let x = g.device_alloc(0, 4 * n);
    let ones = g.device_alloc(0, 4 * n);
    let out = g.device_alloc(0, 4 * n * rounds);
    assert_eq!(g.fill(0, x, 4 * n, 0).status, abi::STATUS_OK);
    assert_eq!(
        g.fill(0, ones, 4 * n, 1f32.to_bits()).status,
        abi::STATUS_OK
    );
    let params = abi::VaddParams {
        c: x,
        a: x,
        b: ones,
        n,
    };
    let add = {
        let cmd = vgpu_testkit::launch_cmd(
            "vadd_f32",
            [1, 1, 1],
            [256, 1, 1],
            std::mem::size_of::<abi::VaddParams>() as u32,
        );
        vgpu_testkit::Chain::command(&cmd)
            .bytes(abi::ByteValued::as_slice(&params))
            .completion()
    };
    let mut chains = Vec::new();
    for k in 0..rounds {
        chains.push(add.clone());
        let copy = vgpu_testkit::copy_cmd(
            abi::COPY_DEVICE,
            abi::COPY_DEVICE,
            x,
            out + 4 * n * k,
            4 * n,
            0,
        );
        chains.push(vgpu_testkit::Chain::command(&copy).completion());
        chains.push(vgpu_testkit::bare_chain(abi::OP_TIMESTAMP));
    }
    let used = g.submit_batch(0, &chains);
    let mut last = 0;
    for (i, u) in used.iter().enumerate() {
        let c = u.completion();
        assert_eq!(c.status, abi::STATUS_OK, "command {i}: {c:?}");
        if i % 3 == 2 {
            assert!(
                c.result >= last,
                "timestamps go forward: {c:?} after {last}"
            );
            last = c.result;
        }
    }
    let got = bytes_to_f32s(&g.download(0, out, (4 * n * rounds) as usize));
    for k in 0..rounds as usize {
        let round = &got[k * n as usize..(k + 1) * n as usize];
        assert!(
            round.iter().all(|&v| v == (k + 1) as f32),
            "round {k}: {:?}",
            &round[..4]
        );
    }
    let overlapped = counts.overlapped();
    assert!(overlapped > 0, "no run was started in flight");

    // Copies from guest memory too: the host maps each run's pieces
    // itself, so they stay in flight after the device let go of them.
    let (piece, copies) = (64usize << 10, 100usize);
    let data: Vec<u8> = (0..piece * copies)
        .map(|i| (i * 13 + i / 997) as u8)
        .collect();
    let dev = g.device_alloc(0, data.len() as u64);
    let ups: Vec<_> = (0..copies)
        .map(|k| {
            let sg = g.alloc_sg(&[1000, (piece - 1000) as u64]);
            g.write_sg(&sg, &data[k * piece..(k + 1) * piece]);
            vgpu_testkit::guest_copy_chain(true, dev + (k * piece) as u64, &sg)
        })
        .collect();
    for (k, st) in g.batch_statuses(0, &ups).into_iter().enumerate() {
        assert_eq!(st, abi::STATUS_OK, "copy {k}");
    }
    assert_eq!(g.download(0, dev, data.len()), data);
    assert!(counts.overlapped() > overlapped, "no copy run overlapped");
    assert_eq!(counts.staged(), 0);
}

/// Two queues, each its own lane of the remote partition: one adds and
/// copies out rounds of device work, the other uploads guest memory
/// meanwhile; both keep their order, and every result lands.
#[test]
fn queues_on_lanes_of_a_remote_partition_keep_their_order() {
    let partition = remote_partition("lanes", RemoteConfig::default());
    let server = TestVgpu::start(test_config("lanes", 2), Box::new(partition));
    let mut g = server.connect();
    g.setup_queue(0, 256, Mode::Interrupt);
    g.setup_queue(1, 256, Mode::Interrupt);
    let (n, rounds) = (16u64 << 10, 40u64);
    let x = g.device_alloc(0, 4 * n);
    let ones = g.device_alloc(0, 4 * n);
    let out = g.device_alloc(0, 4 * n * rounds);
    assert_eq!(g.fill(0, x, 4 * n, 0).status, abi::STATUS_OK);
    assert_eq!(
        g.fill(0, ones, 4 * n, 1f32.to_bits()).status,
        abi::STATUS_OK
    );
    let params = abi::VaddParams {
        c: x,
        a: x,
        b: ones,
        n,
    };
    let cmd = vgpu_testkit::launch_cmd(
        "vadd_f32",
        [1, 1, 1],
        [256, 1, 1],
        std::mem::size_of::<abi::VaddParams>() as u32,
    );
    let add = vgpu_testkit::Chain::command(&cmd)
        .bytes(abi::ByteValued::as_slice(&params))
        .completion();
    let mut heads0 = Vec::new();
    for k in 0..rounds {
        heads0.push(g.post(0, &add));
        let copy = vgpu_testkit::copy_cmd(
            abi::COPY_DEVICE,
            abi::COPY_DEVICE,
            x,
            out + 4 * n * k,
            4 * n,
            0,
        );
        heads0.push(g.post(0, &vgpu_testkit::Chain::command(&copy).completion()));
    }
    let (piece, copies) = (32usize << 10, 60usize);
    let data: Vec<u8> = (0..piece * copies)
        .map(|i| (i * 7 + i / 501) as u8)
        .collect();
    let dev = g.device_alloc(1, data.len() as u64);
    let mut heads1 = Vec::new();
    for k in 0..copies {
        let sg = g.alloc_sg(&[(piece / 2) as u64, (piece / 2) as u64]);
        g.write_sg(&sg, &data[k * piece..(k + 1) * piece]);
        heads1.push(g.post(1, &guest_copy_chain(true, dev + (k * piece) as u64, &sg)));
    }
    g.kick(0);
    g.kick(1);
    for (q, heads) in [(0, &heads0), (1, &heads1)] {
        for (i, head) in heads.iter().enumerate() {
            let u = g
                .wait_used(q, std::time::Duration::from_secs(30))
                .unwrap_or_else(|| panic!("queue {q}: command {i} did not complete"));
            assert_eq!(u.id, u32::from(*head), "queue {q} completes in order");
            assert_eq!(u.completion().status, abi::STATUS_OK, "queue {q}: {i}");
        }
    }
    let got = bytes_to_f32s(&g.download(0, out, (4 * n * rounds) as usize));
    for k in 0..rounds as usize {
        let round = &got[k * n as usize..(k + 1) * n as usize];
        assert!(round.iter().all(|&v| v == (k + 1) as f32), "round {k}");
    }
    assert_eq!(g.download(1, dev, data.len()), data);
}

/// The live partition host processes the launcher of `host` started.
fn sibling_hosts(host: u32) -> Vec<u32> {
    // State and parent, after the command's name.
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
        let state = rest.next()?;
        (state != "Z").then_some(())?;
        rest.next()?.parse().ok()
    };
    let launcher = parent(host).expect("the host's launcher");
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| parent(pid) == Some(launcher))
        .collect();
    pids.sort_unstable();
    pids
}

/// Contexts (ABI 1.5) on a remote backend: each guest context is a host
/// process of its own, which gets the guest's RAM mapped as the first
/// one did; a context whose host dies ends alone (no STATUS.FATAL), the
/// others go on, and once ended its number makes a fresh host.
#[test]
fn each_context_runs_in_a_host_of_its_own() {
    use vgpu_backend::contexts::{ContextFactory, Contexts};
    use vgpu_backend::{Backend, Partition};

    let backend = Arc::new(remote_backend(RemoteConfig::default()));
    let spec = spec("contexts");
    let base = backend.create_remote_partition(&spec).unwrap();
    let first = base.host_pid().unwrap();
    let b = Arc::clone(&backend);
    let make: ContextFactory = Box::new(move |spec| b.create_context(spec));
    let p: Box<dyn Partition> = Box::new(Contexts::new(Box::new(base), make, 4));
    let server = TestVgpu::start(test_config("contexts", 1), p);
    let mut g = server.connect();
    g.setup_queue(0, 32, Mode::Interrupt);

    let n = 10_000u64;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let vadd = |g: &mut vgpu_testkit::Guest| {
        let (da, dc) = (g.device_alloc(0, 4 * n), g.device_alloc(0, 4 * n));
        g.upload(0, da, &f32s_to_bytes(&a));
        let p = abi::VaddParams {
            c: dc,
            a: da,
            b: da,
            n,
        };
        assert_eq!(g.launch(0, "vadd_f32", &p).status, abi::STATUS_OK);
        let got = bytes_to_f32s(&g.download(0, dc, 4 * n as usize));
        let want: Vec<f32> = a.iter().map(|x| x + x).collect();
        assert_eq!(got, want);
    };
    g.set_context(1);
    vadd(&mut g);
    let with_one = sibling_hosts(first);
    g.set_context(2);
    vadd(&mut g);
    let hosts = sibling_hosts(first);
    assert_eq!(hosts.len(), 3, "context 0's host and one per context");
    assert_eq!(g.read32(abi::REG_CONTEXTS), 2);
    let h1 = *with_one.iter().find(|&&h| h != first).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{h1}/maps")).unwrap();
    assert!(
        maps.contains("vgpu-testkit-ram"),
        "guest RAM mapped there too"
    );

    // Context 1's host dies: that context ends, and it alone.
    // SAFETY: plain kill(2) of a host process this test started.
    assert_eq!(unsafe { libc::kill(h1 as i32, libc::SIGKILL) }, 0);
    g.set_context(1);
    let t = std::time::Instant::now();
    loop {
        let c = g.mem_alloc(0, 4096, 0);
        if c.status == abi::STATUS_CONTEXT_LOST {
            break;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "{c:?}");
    }
    assert_eq!(g.read32(abi::REG_STATUS) & abi::STATUS_FATAL, 0);
    g.set_context(2);
    vadd(&mut g);
    // Ended, the number makes a fresh host.
    g.set_context(1);
    let destroy = g.run(0, &vgpu_testkit::bare_chain(abi::OP_CTX_DESTROY));
    assert_eq!(destroy.status, abi::STATUS_OK);
    vadd(&mut g);
    let t = std::time::Instant::now();
    while sibling_hosts(first).len() != 3 {
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether process `pid` has ended (gone, or a zombie not yet reaped).
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

/// A backend whose partitions share one host process over the software
/// backend with one fate for all of them (64 MiB, 4 threads).
fn shared_software_backend() -> RemoteBackend {
    let inner = InnerBackend::Software {
        memory: 64 * MIB,
        compute_units: 4,
    };
    let policy = HostPolicy {
        shared: true,
        ..HostPolicy::default()
    };
    let launcher = ProcessLauncher::with_policy(
        PathBuf::from(env!("CARGO_BIN_EXE_vgpu-partition-host")),
        inner.to_args(),
        &policy,
    )
    .unwrap();
    let config = RemoteConfig {
        shared: true,
        ..RemoteConfig::default()
    };
    RemoteBackend::new(Arc::new(launcher), config).unwrap()
}

/// Spatial mode's shared host (here over the software backend with one
/// fate for all partitions, as green contexts of one CUDA context have):
/// every partition of the backend lives in one host process; a kernel
/// fault in one ends that process, so every partition reports its state
/// lost (the vGPU's STATUS.FATAL, and the guest driver resets the
/// function); each reset joins a fresh shared host, where all run again
/// with nothing of the old state left.
#[test]
fn spatial_partitions_share_one_host_and_recover_together() {
    use vgpu_backend::{conformance, Backend, Partition};

    let backend = shared_software_backend();
    assert!(!backend.has_contexts(), "a shared host contains no fault");
    let spec = |name: &str| PartitionSpec {
        name: name.into(),
        memory: 16 * MIB,
        compute_units: 1,
    };
    let mut a = backend.create_remote_partition(&spec("a")).unwrap();
    let b = backend.create_remote_partition(&spec("b")).unwrap();
    let host = a.host_pid().unwrap();
    assert_eq!(b.host_pid(), Some(host), "one host for both");

    // b computes on a vGPU; a's kernel then writes past its allocation.
    let server = TestVgpu::start(test_config("b", 2), Box::new(b));
    let mut g = server.connect();
    g.setup_queue(0, 32, Mode::Interrupt);
    let n = 4096u64;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let vadd = |g: &mut vgpu_testkit::Guest| {
        let (dx, dy) = (g.device_alloc(0, 4 * n), g.device_alloc(0, 4 * n));
        g.upload(0, dx, &f32s_to_bytes(&x));
        let p = abi::VaddParams {
            c: dy,
            a: dx,
            b: dx,
            n,
        };
        assert_eq!(g.launch(0, "vadd_f32", &p).status, abi::STATUS_OK);
        let got = bytes_to_f32s(&g.download(0, dy, 4 * n as usize));
        assert!(got.iter().zip(&x).all(|(y, x)| *y == x + x));
    };
    vadd(&mut g);
    let poke = ".version 8.0\n.target sm_90\n.address_size 64\n\
        .visible .entry poke(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [p];\nmov.u32 %r1, 7;\nst.global.u32 [%rd1], %r1;\nret;\n}\n";
    let m = a
        .module_load(abi::MODULE_FORMAT_PTX, poke.as_bytes())
        .unwrap();
    let d = a.alloc(4096, 0).unwrap();
    let params = conformance::Params::default().u64(d + 4096);
    let r = conformance::launch_loaded(&mut a, m, "poke", [1, 1, 1], [1, 1, 1], &params);
    assert_eq!(r.unwrap_err().status(), abi::STATUS_KERNEL_FAULT);
    assert!(a.is_lost());
    let faulted = std::time::Instant::now();
    while !ended(host) {
        assert!(faulted.elapsed() < std::time::Duration::from_secs(5));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    // The idle bystander is told without a command (STATUS.FATAL, for
    // its driver to reset the function); until then it fails.
    while g.read32(abi::REG_STATUS) & abi::STATUS_FATAL == 0 {
        assert!(faulted.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let c = g.mem_alloc(0, 4096, 0);
    assert_eq!(c.status, abi::STATUS_DEVICE_ERROR, "{c:?}");
    g.device_reset();
    g.enable_device();
    g.setup_queue(0, 32, Mode::Interrupt);
    assert_eq!(g.mem_used(), 0, "nothing of the old state");
    vadd(&mut g);
    let recovered = faulted.elapsed();
    a.reset();
    assert!(!a.is_lost());
    let fresh = a.host_pid().unwrap();
    assert_ne!(fresh, host);
    assert_eq!(a.memory_used(), 0);
    let d = a.alloc(4096, 0).unwrap();
    conformance::upload(&mut a, d, &[3; 4096]);
    assert_eq!(conformance::download(&mut a, d, 4096), vec![3; 4096]);
    assert!(
        a.module_load(abi::MODULE_FORMAT_PTX, poke.as_bytes())
            .is_ok(),
        "modules load in the fresh host"
    );
    eprintln!("from the fault to the bystander's next result: {recovered:?}");
}

/// As above, but every partition of the shared host is reset the moment
/// the fault is seen, while the faulted host may still be on its way out:
/// each joins one fresh host, none is handed the ending one.
#[test]
fn spatial_partitions_reset_at_once_after_a_fault_join_one_fresh_host() {
    use vgpu_backend::{conformance, Partition};

    let backend = shared_software_backend();
    let spec = |name: &str| PartitionSpec {
        name: name.into(),
        memory: 16 * MIB,
        compute_units: 1,
    };
    let poke = ".version 8.0\n.target sm_90\n.address_size 64\n\
        .visible .entry poke(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [p];\nmov.u32 %r1, 7;\nst.global.u32 [%rd1], %r1;\nret;\n}\n";
    let mut a = backend.create_remote_partition(&spec("a")).unwrap();
    let mut b = backend.create_remote_partition(&spec("b")).unwrap();
    for round in 0..5 {
        let host = a.host_pid().unwrap();
        assert_eq!(b.host_pid(), Some(host), "round {round}: one host");
        let m = a
            .module_load(abi::MODULE_FORMAT_PTX, poke.as_bytes())
            .unwrap();
        let d = a.alloc(4096, 0).unwrap();
        let params = conformance::Params::default().u64(d + 4096);
        let r = conformance::launch_loaded(&mut a, m, "poke", [1, 1, 1], [1, 1, 1], &params);
        assert_eq!(r.unwrap_err().status(), abi::STATUS_KERNEL_FAULT);
        // The bystander first, as soon as it can tell.
        let t = std::time::Instant::now();
        while !b.is_lost() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        b.reset();
        a.reset();
        assert!(
            !a.is_lost() && !b.is_lost(),
            "round {round}: both recovered"
        );
        let fresh = b.host_pid().unwrap();
        assert_ne!(fresh, host);
        assert_eq!(a.host_pid(), Some(fresh), "round {round}: one fresh host");
        for p in [&mut a, &mut b] {
            let d = p.alloc(4096, 0).unwrap();
            conformance::upload(p, d, &[5; 4096]);
            assert_eq!(conformance::download(p, d, 4096), vec![5; 4096]);
            p.free(d).unwrap();
        }
    }
}
