//! Two vGPUs served at once from partitions of one software backend: each
//! sees only its own device memory, quota and registers.

mod common;

use common::{assert_status, Rng, MIB};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::Backend;
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_testkit::abi::{self, SgEntry};
use vgpu_testkit::{Guest, Mode};

struct Pair {
    _a: TestVgpu,
    _b: TestVgpu,
    ga: Guest,
    gb: Guest,
}

fn pair(backend: &SoftwareBackend) -> Pair {
    let a = TestVgpu::start(
        test_config("a", 2),
        software_partition(backend, "a", 8 * MIB, 1),
    );
    let b = TestVgpu::start(
        test_config("b", 2),
        software_partition(backend, "b", 4 * MIB, 2),
    );
    let mut ga = a.connect();
    let mut gb = b.connect();
    ga.setup_queue(0, 64, Mode::Interrupt);
    gb.setup_queue(0, 64, Mode::Polled);
    Pair {
        _a: a,
        _b: b,
        ga,
        gb,
    }
}

#[test]
fn test_partitions_claim_from_one_backend() {
    let backend = SoftwareBackend::new(16 * MIB, 4);
    let mut p = pair(&backend);
    let left = backend.unclaimed();
    assert_eq!((left.memory, left.compute_units), (4 * MIB, 1));
    assert_eq!(p.ga.read64(abi::REG_MEM_SIZE), 8 * MIB);
    assert_eq!(p.gb.read64(abi::REG_MEM_SIZE), 4 * MIB);
    assert_eq!(p.ga.read32(abi::REG_COMPUTE_UNITS), 1);
    assert_eq!(p.gb.read32(abi::REG_COMPUTE_UNITS), 2);
    // What is left does not make a third of the same size.
    let spec = vgpu_backend::PartitionSpec {
        name: "c".into(),
        memory: 8 * MIB,
        compute_units: 1,
    };
    assert!(backend.create_partition(&spec).is_err());
    drop(p);
    // Partitions go back to the pool when their vGPUs stop.
    let left = backend.unclaimed();
    assert_eq!((left.memory, left.compute_units), (16 * MIB, 4));
}

#[test]
fn test_device_addresses_are_private_to_a_partition() {
    let backend = SoftwareBackend::new(16 * MIB, 4);
    let mut p = pair(&backend);
    let data_a = Rng(31).bytes(8192);
    let a = p.ga.device_alloc(0, 8192);
    p.ga.upload(0, a, &data_a);

    // In the other vGPU the address means nothing.
    let g = &mut p.gb;
    assert_status(g.mem_free(0, a), abi::STATUS_NOT_FOUND);
    let sg = g.alloc_sg(&[64]);
    assert_status(g.copy_from_device(0, a, &sg), abi::STATUS_OUT_OF_RANGE);
    assert_status(g.copy_to_device(0, a, &sg), abi::STATUS_OUT_OF_RANGE);
    assert_status(g.fill(0, a, 64, 7), abi::STATUS_OUT_OF_RANGE);
    assert_status(
        g.copy_device_to_window(0, a, 0, 64),
        abi::STATUS_OUT_OF_RANGE,
    );
    let fill = abi::FillParams {
        dst: a,
        count: 16,
        value: 7,
        reserved: 0,
    };
    assert_status(g.launch(0, "fill_u32", &fill), abi::STATUS_OUT_OF_RANGE);
    assert_eq!(g.mem_used(), 0);

    // It may hand out the same address for its own memory; the bytes stay apart.
    let b = g.device_alloc(0, 8192);
    let data_b = Rng(32).bytes(8192);
    g.upload(0, b, &data_b);
    assert_status(g.fill(0, b, 4096, 0x0b0b_0b0b), abi::STATUS_OK);
    assert_eq!(p.ga.download(0, a, 8192), data_a);
    let mut want_b = vec![0x0b; 4096];
    want_b.extend_from_slice(&data_b[4096..]);
    assert_eq!(p.gb.download(0, b, 8192), want_b);

    // Freeing in one leaves the other's allocation alone.
    assert_status(p.gb.mem_free(0, b), abi::STATUS_OK);
    assert_eq!(p.ga.download(0, a, 8192), data_a);
    assert_eq!(p.ga.mem_used(), 8192);
    assert_eq!(p.gb.mem_used(), 0);
}

#[test]
fn test_quotas_are_separate() {
    let backend = SoftwareBackend::new(16 * MIB, 4);
    let mut p = pair(&backend);
    // B's quota is 4 MiB, whatever A has free.
    assert_status(p.gb.mem_alloc(0, 5 * MIB, 0), abi::STATUS_NO_MEMORY);
    let b = p.gb.device_alloc(0, 4 * MIB);
    assert_status(p.gb.mem_alloc(0, 1, 0), abi::STATUS_NO_MEMORY);
    // A is not affected by B being full.
    let a = p.ga.device_alloc(0, 8 * MIB);
    assert_eq!(p.ga.mem_used(), 8 * MIB);
    assert_eq!(p.gb.mem_used(), 4 * MIB);
    assert_status(p.ga.mem_free(0, a), abi::STATUS_OK);
    assert_status(p.gb.mem_free(0, b), abi::STATUS_OK);
}

#[test]
fn test_reset_of_one_leaves_the_other_alone() {
    let backend = SoftwareBackend::new(16 * MIB, 4);
    let mut p = pair(&backend);
    let data = Rng(33).bytes(4096);
    let a = p.ga.device_alloc(0, 4096);
    p.ga.upload(0, a, &data);
    let b = p.gb.device_alloc(0, 4096);
    p.gb.device_reset();
    assert_eq!(p.gb.mem_used(), 0);
    assert_eq!(p.ga.mem_used(), 4096);
    assert_eq!(p.ga.download(0, a, 4096), data);
    p.gb.enable_device();
    p.gb.setup_queue(0, 16, Mode::Interrupt);
    assert_status(p.gb.mem_free(0, b), abi::STATUS_NOT_FOUND);
}

/// One vGPU's driver loop: uploads a pattern of its own, runs kernels and
/// reads everything back, many times.
fn churn(g: &mut Guest, seed: u64, rounds: usize) {
    let mut rng = Rng(seed);
    let size = 64 << 10;
    let x = g.device_alloc(0, size);
    let y = g.device_alloc(0, size);
    for round in 0..rounds {
        let data = rng.bytes(size as usize);
        g.upload(0, x, &data);
        let p = abi::CopyParams {
            dst: y,
            src: x,
            bytes: size,
        };
        assert_status(g.launch(0, "copy", &p), abi::STATUS_OK);
        let value = (seed as u32) ^ round as u32;
        assert_status(g.fill(0, x, size / 2, value), abi::STATUS_OK);
        assert_eq!(
            g.download(0, y, size as usize),
            data,
            "seed {seed} round {round}"
        );
        let half = g.download(0, x, size as usize);
        assert!(half[..size as usize / 2]
            .chunks_exact(4)
            .all(|w| w == value.to_le_bytes()));
        assert_eq!(half[size as usize / 2..], data[size as usize / 2..]);
    }
    let sg = [SgEntry {
        addr: g.alloc(size, 64),
        len: size,
    }];
    assert_status(g.copy_from_device(0, y, &sg), abi::STATUS_OK);
}

#[test]
fn test_two_vgpus_work_concurrently_without_crossing_data() {
    let backend = SoftwareBackend::new(16 * MIB, 4);
    let Pair {
        _a,
        _b,
        mut ga,
        mut gb,
    } = pair(&backend);
    std::thread::scope(|s| {
        s.spawn(|| churn(&mut ga, 0x1111, 40));
        s.spawn(|| churn(&mut gb, 0x2222, 40));
    });
    assert_eq!(ga.mem_used(), 128 << 10);
    assert_eq!(gb.mem_used(), 128 << 10);
}
