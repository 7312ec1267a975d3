//! Tests of the software backend's own behaviour: its address-space
//! layout, host memory, thread split and pool. What every backend must do
//! is checked by the conformance suite (see `conformance` below).

use super::kernels::get;
use super::*;
use crate::rules::{
    ADDRESS_BASE, ADDRESS_END, DEFAULT_ALIGN, GUARD_GAP, MAX_ALIGN, MAX_ALLOCATIONS,
};
use vgpu_abi::ByteValued;

const MIB: u64 = 1 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

struct VecSource(Vec<u8>);

impl HostSource for VecSource {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let off = offset as usize;
        let src = self
            .0
            .get(off..off + buf.len())
            .ok_or(OpError::Fault(offset))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

struct VecSink(RefCell<Vec<u8>>);

impl VecSink {
    fn new(len: usize) -> VecSink {
        VecSink(RefCell::new(vec![0; len]))
    }
}

impl HostSink for VecSink {
    fn len(&self) -> u64 {
        self.0.borrow().len() as u64
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        let off = offset as usize;
        let mut v = self.0.borrow_mut();
        let dst = v
            .get_mut(off..off + buf.len())
            .ok_or(OpError::Fault(offset))?;
        dst.copy_from_slice(buf);
        Ok(())
    }
}

fn spec(name: &str, memory: u64, compute_units: u32) -> PartitionSpec {
    PartitionSpec {
        name: name.into(),
        memory,
        compute_units,
    }
}

/// A partition that splits even tiny kernels over its threads.
fn partition(memory: u64, compute_units: u32) -> SoftwarePartition {
    let backend = SoftwareBackend::new(memory, compute_units);
    let mut p = backend
        .create(&spec("test", memory, compute_units))
        .unwrap();
    p.grain = 1;
    p
}

fn upload(p: &mut SoftwarePartition, addr: u64, bytes: &[u8]) {
    p.upload(addr, &VecSource(bytes.to_vec())).unwrap();
}

fn download(p: &mut SoftwarePartition, addr: u64, len: usize) -> Vec<u8> {
    let sink = VecSink::new(len);
    p.download(addr, &sink).unwrap();
    sink.0.into_inner()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(get).collect()
}

fn upload_floats(p: &mut SoftwarePartition, addr: u64, v: &[f32]) {
    upload(p, addr, &to_bytes(v));
}

fn download_floats(p: &mut SoftwarePartition, addr: u64, n: usize) -> Vec<f32> {
    to_floats(&download(p, addr, n * 4))
}

fn launch<T: ByteValued>(p: &mut SoftwarePartition, entry: &str, params: T) -> Result<(), OpError> {
    p.launch(&Launch {
        module: abi::MODULE_BUILTIN,
        entry,
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        params: params.as_slice(),
    })
}

fn snapshot(p: &SoftwarePartition) -> Vec<(u64, Vec<u8>)> {
    p.allocs
        .iter()
        .map(|(a, e)| (a, e.data.borrow().to_vec()))
        .collect()
}

#[test]
fn test_backend_refuses_partitions_that_do_not_fit_and_gets_capacity_back() {
    let backend = SoftwareBackend::new(100 * MIB, 8);
    assert_eq!(backend.name(), "software");
    assert_eq!(
        backend.capacity(),
        Capacity {
            memory: 100 * MIB,
            compute_units: 8
        }
    );
    let a = backend.create_partition(&spec("a", 60 * MIB, 4)).unwrap();
    assert_eq!(a.spec().memory, 60 * MIB);
    let err = backend
        .create_partition(&spec("b", 50 * MIB, 2))
        .err()
        .unwrap();
    match &err {
        BackendError::DoesNotFit(why) => assert!(why.contains("memory"), "{why}"),
        other => panic!("{other:?}"),
    }
    let err = backend
        .create_partition(&spec("b", 10 * MIB, 5))
        .err()
        .unwrap();
    match &err {
        BackendError::DoesNotFit(why) => assert!(why.contains("compute units"), "{why}"),
        other => panic!("{other:?}"),
    }
    let b = backend.create_partition(&spec("b", 40 * MIB, 4)).unwrap();
    assert_eq!(
        backend.unclaimed(),
        Capacity {
            memory: 0,
            compute_units: 0
        }
    );
    assert!(backend.create_partition(&spec("c", 1, 0)).is_err());
    drop(a);
    assert_eq!(
        backend.unclaimed(),
        Capacity {
            memory: 60 * MIB,
            compute_units: 4
        }
    );
    let c = backend.create_partition(&spec("c", 60 * MIB, 4)).unwrap();
    drop(b);
    drop(c);
    assert_eq!(backend.unclaimed(), backend.capacity());
}

#[test]
fn test_alloc_alignment_size_and_gaps() {
    let mut p = partition(16 * MIB, 1);
    assert!(matches!(p.alloc(0, 0), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 3), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 48), Err(OpError::Invalid(_))));
    assert!(matches!(
        p.alloc(16, MAX_ALIGN * 2),
        Err(OpError::Invalid(_))
    ));
    assert_eq!(p.memory_used(), 0);

    let a = p.alloc(100, 0).unwrap();
    assert!(a >= ADDRESS_BASE);
    assert_eq!(a % DEFAULT_ALIGN, 0);
    let b = p.alloc(1, 1).unwrap();
    assert!(b >= a + 100 + GUARD_GAP);
    let c = p.alloc(4096, 1 << 20).unwrap();
    assert_eq!(c % (1 << 20), 0);
    assert!(c >= b + 1 + GUARD_GAP);
    let d = p.alloc(8, MAX_ALIGN).unwrap();
    assert_eq!(d % MAX_ALIGN, 0);
    assert_eq!(p.memory_used(), 100 + 1 + 4096 + 8);

    // New memory reads as zero.
    assert_eq!(download(&mut p, c, 4096), vec![0; 4096]);
    // One byte past the end is in no allocation.
    assert_eq!(
        p.fill(a + 100, 4, 1),
        Err(OpError::OutOfRange {
            addr: a + 100,
            len: 4
        })
    );
    assert!(matches!(
        p.fill(a + 98, 4, 1),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(matches!(
        p.fill(a - 4, 4, 1),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(matches!(p.fill(0, 4, 1), Err(OpError::OutOfRange { .. })));
    assert_eq!(p.fill(a + 96, 4, 1), Ok(()));
}

#[test]
fn test_quota_exhaustion_returns_no_memory_and_changes_nothing() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(MIB / 2, 0).unwrap();
    p.fill(a, MIB / 2, 0xdead_beef).unwrap();
    let before = snapshot(&p);
    assert_eq!(
        p.alloc(MIB / 2 + 1, 0),
        Err(OpError::NoMemory {
            requested: MIB / 2 + 1,
            available: MIB / 2
        })
    );
    assert!(matches!(
        p.alloc(u64::MAX, 0),
        Err(OpError::NoMemory { .. })
    ));
    assert_eq!(p.memory_used(), MIB / 2);
    assert_eq!(snapshot(&p), before);
    // The rest of the quota is still there, to the byte.
    let b = p.alloc(MIB / 2, 0).unwrap();
    assert_eq!(p.memory_used(), MIB);
    assert!(matches!(p.alloc(1, 0), Err(OpError::NoMemory { .. })));
    p.free(b).unwrap();
    p.alloc(MIB / 4, 0).unwrap();
}

#[test]
fn test_quota_larger_than_the_address_space_is_refused_cleanly() {
    let backend = SoftwareBackend::new(u64::MAX, 1);
    let mut p = backend.create(&spec("huge", u64::MAX, 1)).unwrap();
    assert!(matches!(
        p.alloc(ADDRESS_END, 0),
        Err(OpError::NoMemory { .. })
    ));
    assert_eq!(p.memory_used(), 0);
    assert!(p.allocs.is_empty());
    p.alloc(4096, 0).unwrap();
}

#[test]
fn test_allocation_count_is_bounded() {
    let mut p = partition(MAX_ALLOCATIONS as u64 + 16, 1);
    for _ in 0..MAX_ALLOCATIONS {
        p.alloc(1, 1).unwrap();
    }
    assert!(matches!(p.alloc(1, 1), Err(OpError::NoMemory { .. })));
    assert_eq!(p.memory_used(), MAX_ALLOCATIONS as u64);
    let first = p.allocs.iter().next().unwrap().0;
    p.free(first).unwrap();
    p.alloc(1, 1).unwrap();
}

#[test]
fn test_free_and_double_free() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(1000, 0).unwrap();
    let b = p.alloc(2000, 0).unwrap();
    assert!(matches!(p.free(a + 4), Err(OpError::NotFound(_))));
    assert!(matches!(p.free(0), Err(OpError::NotFound(_))));
    p.free(a).unwrap();
    assert_eq!(p.memory_used(), 2000);
    assert!(matches!(p.free(a), Err(OpError::NotFound(_))));
    assert!(matches!(p.fill(a, 4, 0), Err(OpError::OutOfRange { .. })));
    // A freed address is not handed out again straight away.
    let c = p.alloc(1000, 0).unwrap();
    assert_ne!(c, a);
    p.free(b).unwrap();
    p.free(c).unwrap();
    assert_eq!(p.memory_used(), 0);
}

#[test]
fn test_address_space_is_reused_after_wrapping() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(4096, 0).unwrap();
    let b = p.alloc(4096, 0).unwrap();
    assert_eq!(b, a + 4096 + GUARD_GAP);
    p.free(a).unwrap();
    // Nothing fits between the cursor and the end: the search wraps
    // and finds the hole in front of `b`, gaps included.
    p.space.cursor = ADDRESS_END - 16;
    assert_eq!(p.alloc(4096, 0), Ok(a));
    p.space.cursor = ADDRESS_END - 16;
    let c = p.alloc(4097, 0).unwrap();
    assert!(c > b);
}

#[test]
fn test_upload_download_round_trip() {
    let mut p = partition(MIB, 2);
    let a = p.alloc(10_000, 0).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    upload(&mut p, a, &data);
    assert_eq!(download(&mut p, a, 10_000), data);
    // Into the middle, and back out of it.
    upload(&mut p, a + 17, &[1, 2, 3]);
    assert_eq!(
        download(&mut p, a + 16, 5),
        vec![data[16], 1, 2, 3, data[20]]
    );
    // Past the end.
    assert!(matches!(
        p.upload(a + 9_999, &VecSource(vec![0; 2])),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(matches!(
        p.download(a + 1, &VecSink::new(10_000)),
        Err(OpError::OutOfRange { .. })
    ));
    // Host faults come back as they are.
    struct Faulty;
    impl HostSource for Faulty {
        fn len(&self) -> u64 {
            8
        }
        fn read_at(&self, offset: u64, _: &mut [u8]) -> Result<(), OpError> {
            Err(OpError::Fault(offset))
        }
    }
    assert_eq!(p.upload(a, &Faulty), Err(OpError::Fault(0)));
}

#[test]
fn test_copy_within_and_between_allocations() {
    let mut p = partition(MIB, 2);
    let a = p.alloc(64, 0).unwrap();
    let b = p.alloc(64, 0).unwrap();
    let data: Vec<u8> = (0..64).collect();
    upload(&mut p, a, &data);
    p.copy(b, a, 64).unwrap();
    assert_eq!(download(&mut p, b, 64), data);
    // Overlapping, forwards and backwards.
    p.copy(a + 8, a, 32).unwrap();
    let mut want = data.clone();
    want.copy_within(0..32, 8);
    assert_eq!(download(&mut p, a, 64), want);
    p.copy(a, a + 8, 32).unwrap();
    want.copy_within(8..40, 0);
    assert_eq!(download(&mut p, a, 64), want);
    assert!(matches!(
        p.copy(b, a + 1, 64),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(matches!(
        p.copy(b + 1, a, 64),
        Err(OpError::OutOfRange { .. })
    ));
    assert_eq!(download(&mut p, b, 64), data);
}

#[test]
fn test_fill() {
    let mut p = partition(MIB, 3);
    let a = p.alloc(1 << 16, 0).unwrap();
    assert!(matches!(p.fill(a, 6, 1), Err(OpError::Invalid(_))));
    p.fill(a + 4, 4 * 1001, 0x0403_0201).unwrap();
    let got = download(&mut p, a, 4 * 1003);
    assert_eq!(&got[..4], &[0; 4]);
    for w in got[4..4 * 1002].chunks_exact(4) {
        assert_eq!(w, &[1, 2, 3, 4]);
    }
    assert_eq!(&got[4 * 1002..], &[0; 4]);
    p.fill(a, 1 << 16, 0x5555_5555).unwrap();
    assert!(download(&mut p, a, 1 << 16).iter().all(|&b| b == 0x55));
}

#[test]
fn test_partitions_cannot_see_each_other() {
    let backend = SoftwareBackend::new(4 * MIB, 2);
    let mut pa = backend.create(&spec("a", 2 * MIB, 1)).unwrap();
    let mut pb = backend.create(&spec("b", 2 * MIB, 1)).unwrap();
    let a1 = pa.alloc(4096, 0).unwrap();
    let a2 = pa.alloc(4096, 0).unwrap();
    pa.fill(a1, 4096, 0x1111_1111).unwrap();
    pa.fill(a2, 4096, 0x2222_2222).unwrap();
    let b1 = pb.alloc(16, 0).unwrap();
    for addr in [a1 + 16, a2] {
        assert!(matches!(
            pb.fill(addr, 4, 7),
            Err(OpError::OutOfRange { .. })
        ));
        assert!(matches!(
            pb.download(addr, &VecSink::new(4)),
            Err(OpError::OutOfRange { .. })
        ));
    }
    assert!(matches!(pb.free(a2), Err(OpError::NotFound(_))));
    assert!(matches!(
        pb.copy(b1, a2, 16),
        Err(OpError::OutOfRange { .. })
    ));
    // B's writes to its own memory do not show up in A.
    pb.fill(b1, 16, 0x3333_3333).unwrap();
    assert!(download(&mut pa, a1, 4096).iter().all(|&b| b == 0x11));
    assert!(download(&mut pa, a2, 4096).iter().all(|&b| b == 0x22));
    pb.reset();
    assert_eq!(pa.memory_used(), 8192);
}

#[test]
fn test_reset_frees_everything() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(1000, 0).unwrap();
    p.alloc(2000, 0).unwrap();
    p.reset();
    assert_eq!(p.memory_used(), 0);
    assert!(matches!(p.free(a), Err(OpError::NotFound(_))));
    let b = p.alloc(MIB, 0).unwrap();
    assert_eq!(download(&mut p, b, 16), vec![0; 16]);
}

#[test]
fn test_modules() {
    let mut p = partition(MIB, 1);
    match p.module_load(abi::MODULE_FORMAT_PTX, b".version 7.0") {
        Err(OpError::Unsupported(why)) => {
            assert!(why.contains("built-in") && why.contains("PTX"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        p.module_load(99, b""),
        Err(OpError::Unsupported(_))
    ));
    assert!(matches!(
        p.module_unload(abi::MODULE_BUILTIN),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(p.module_unload(1), Err(OpError::NotFound(_))));
}

#[test]
fn test_launch_validation() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(64, 0).unwrap();
    let fill = abi::FillParams {
        dst: a,
        count: 16,
        value: 9,
        reserved: 0,
    };
    let base = Launch {
        module: abi::MODULE_BUILTIN,
        entry: "fill_u32",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: fill.as_slice(),
    };
    assert!(matches!(
        p.launch(&Launch {
            module: 5,
            ..base.clone()
        }),
        Err(OpError::NotFound(_))
    ));
    assert!(matches!(
        p.launch(&Launch {
            entry: "nope",
            ..base.clone()
        }),
        Err(OpError::NotFound(_))
    ));
    assert!(matches!(
        p.launch(&Launch {
            grid: [1, 0, 1],
            ..base.clone()
        }),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        p.launch(&Launch {
            block: [0, 1, 1],
            ..base.clone()
        }),
        Err(OpError::Invalid(_))
    ));
    let long = [fill.as_slice(), &[0]].concat();
    assert!(matches!(
        p.launch(&Launch {
            params: &long,
            ..base.clone()
        }),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        p.launch(&Launch {
            params: &fill.as_slice()[1..],
            ..base.clone()
        }),
        Err(OpError::Invalid(_))
    ));
    assert_eq!(download(&mut p, a, 64), vec![0; 64]);
    // Every built-in entry is dispatched (wrong size, not unknown).
    for entry in abi::BUILTIN_ENTRIES {
        assert!(
            matches!(
                p.launch(&Launch {
                    entry,
                    params: &[0; 3],
                    ..base.clone()
                }),
                Err(OpError::Invalid(_))
            ),
            "{entry}"
        );
    }
    p.launch(&base).unwrap();
    assert_eq!(to_floats(&download(&mut p, a, 64)).len(), 16);
    assert!(download(&mut p, a, 64)
        .chunks_exact(4)
        .all(|w| w == [9, 0, 0, 0]));
}

#[test]
fn test_kernel_fill_u32() {
    for threads in [1, 3, 4] {
        let mut p = partition(MIB, threads);
        let a = p.alloc(4 * 1000 + 8, 0).unwrap();
        let fill = abi::FillParams {
            dst: a + 4,
            count: 1000,
            value: 0xa1b2_c3d4,
            reserved: 0,
        };
        launch(&mut p, "fill_u32", fill).unwrap();
        let got = download(&mut p, a, 4 * 1002);
        assert_eq!(&got[..4], &[0; 4]);
        assert!(got[4..4004]
            .chunks_exact(4)
            .all(|w| w == 0xa1b2_c3d4u32.to_le_bytes()));
        assert_eq!(&got[4004..], &[0; 4]);
    }
}

#[test]
fn test_kernel_copy() {
    let mut p = partition(MIB, 2);
    let a = p.alloc(1000, 0).unwrap();
    let b = p.alloc(1000, 0).unwrap();
    let data: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
    upload(&mut p, a, &data);
    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    launch(&mut p, "copy", copy(b, a, 1000)).unwrap();
    assert_eq!(download(&mut p, b, 1000), data);
    // Disjoint halves of one allocation.
    launch(&mut p, "copy", copy(a, a + 500, 500)).unwrap();
    let mut want = data.clone();
    want.copy_within(500.., 0);
    assert_eq!(download(&mut p, a, 1000), want);
    launch(&mut p, "copy", copy(a + 600, a + 100, 400)).unwrap();
    want.copy_within(100..500, 600);
    assert_eq!(download(&mut p, a, 1000), want);
    // Overlapping is refused.
    assert!(matches!(
        launch(&mut p, "copy", copy(a + 1, a, 10)),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch(&mut p, "copy", copy(a, a, 10)),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch(&mut p, "copy", copy(b, a + 1, 1000)),
        Err(OpError::OutOfRange { .. })
    ));
    assert_eq!(download(&mut p, a, 1000), want);
    assert_eq!(download(&mut p, b, 1000), data);
}

#[test]
fn test_kernel_vadd() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for threads in [1, 3, 4] {
        for n in [0usize, 1, 7, 1000, 4099] {
            let mut p = partition(MIB, threads);
            let a = rng.floats(n);
            let b = rng.floats(n);
            let pa = p.alloc(4 * n as u64 + 4, 0).unwrap();
            let pb = p.alloc(4 * n as u64 + 4, 0).unwrap();
            let pc = p.alloc(4 * n as u64 + 4, 0).unwrap();
            upload_floats(&mut p, pa, &a);
            upload_floats(&mut p, pb, &b);
            let params = abi::VaddParams {
                c: pc,
                a: pa,
                b: pb,
                n: n as u64,
            };
            launch(&mut p, "vadd_f32", params).unwrap();
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(download_floats(&mut p, pc, n), want, "n={n} t={threads}");
            assert_eq!(download_floats(&mut p, pc + 4 * n as u64, 1), [0.0]);
        }
    }
}

#[test]
fn test_kernel_vadd_aliasing() {
    let mut rng = Rng(77);
    let n = 1001;
    let mut p = partition(MIB, 3);
    let buf = p.alloc(4 * 3 * n as u64, 0).unwrap();
    let at = |i: usize| buf + 4 * i as u64;
    let data = rng.floats(3 * n);
    let vadd = |c, a, b| abi::VaddParams {
        c,
        a,
        b,
        n: n as u64,
    };

    // In place: c == a, b elsewhere in the same allocation.
    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(0), at(0), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[n + i]).collect();
    assert_eq!(download_floats(&mut p, buf, n), want);

    // c == a == b.
    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(n), at(n), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[n + i] + data[n + i]).collect();
    assert_eq!(download_floats(&mut p, at(n), n), want);

    // Partial overlap: inputs read as they were before the launch.
    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(1), at(0), at(2 * n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[2 * n + i]).collect();
    assert_eq!(download_floats(&mut p, at(1), n), want);
    assert_eq!(download_floats(&mut p, buf, 1), [data[0]]);

    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(0), at(1), at(n + 5))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[1 + i] + data[n + 5 + i]).collect();
    assert_eq!(download_floats(&mut p, buf, n), want);
}

#[test]
fn test_kernel_saxpy() {
    let mut rng = Rng(99);
    for threads in [1, 2, 3, 5] {
        for n in [1usize, 13, 1024, 3001] {
            let mut p = partition(MIB, threads);
            let x = rng.floats(n);
            let y = rng.floats(n);
            let a = rng.f32() * 3.0;
            // x and y in one allocation, disjoint.
            let buf = p.alloc(8 * n as u64, 0).unwrap();
            upload_floats(&mut p, buf, &[x.clone(), y.clone()].concat());
            let yp = buf + 4 * n as u64;
            let params = abi::SaxpyParams {
                y: yp,
                x: buf,
                n: n as u64,
                a,
                reserved: 0,
            };
            launch(&mut p, "saxpy_f32", params).unwrap();
            let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
            assert_eq!(download_floats(&mut p, yp, n), want);
            assert_eq!(download_floats(&mut p, buf, n), x);
            // x == y.
            let params = abi::SaxpyParams { x: yp, ..params };
            launch(&mut p, "saxpy_f32", params).unwrap();
            let want: Vec<f32> = want.iter().map(|y| a * y + y).collect();
            assert_eq!(download_floats(&mut p, yp, n), want);
            // x overlaps y partly.
            if n > 1 {
                let before = download_floats(&mut p, buf, 2 * n);
                let params = abi::SaxpyParams {
                    x: yp - 4,
                    ..params
                };
                launch(&mut p, "saxpy_f32", params).unwrap();
                let want: Vec<f32> = (0..n)
                    .map(|i| a * before[n - 1 + i] + before[n + i])
                    .collect();
                assert_eq!(download_floats(&mut p, yp, n), want);
            }
        }
    }
}

/// `alpha * A * B + beta * C` in f64, for an `m` x `n` x `k` shape.
fn sgemm_reference(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &[f32],
) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let old = if beta == 0.0 {
                0.0
            } else {
                f64::from(beta) * f64::from(c[i * n + j])
            };
            out[i * n + j] = f64::from(alpha) * dot + old;
        }
    }
    out
}

#[test]
fn test_kernel_sgemm() {
    let mut rng = Rng(0xfeed);
    let shapes = [
        (1, 1, 1),
        (17, 33, 9),
        (64, 64, 64),
        (5, 300, 270),
        (33, 1, 517),
        (3, 7, 0),
    ];
    for threads in [1, 3, 4] {
        for &(m, n, k) in &shapes {
            for (alpha, beta) in [(1.5f32, -0.75f32), (1.0, 0.0), (0.0, 2.0), (-0.5, 1.0)] {
                let mut p = partition(16 * MIB, threads);
                let a = rng.floats(m * k);
                let b = rng.floats(k * n);
                let c = rng.floats(m * n);
                let pa = p.alloc(4 * (m * k) as u64 + 1, 0).unwrap();
                let pb = p.alloc(4 * (k * n) as u64 + 1, 0).unwrap();
                let pc = p.alloc(4 * (m * n) as u64, 0).unwrap();
                upload_floats(&mut p, pa, &a);
                upload_floats(&mut p, pb, &b);
                upload_floats(&mut p, pc, &c);
                let params = abi::SgemmParams {
                    c: pc,
                    a: pa,
                    b: pb,
                    m: m as u32,
                    n: n as u32,
                    k: k as u32,
                    reserved: 0,
                    alpha,
                    beta,
                };
                launch(&mut p, "sgemm_f32", params).unwrap();
                let got = download_floats(&mut p, pc, m * n);
                let want = sgemm_reference((m, n, k), alpha, &a, &b, beta, &c);
                let tol = 1e-5 * (k as f64 + 1.0) * (f64::from(alpha.abs()) + 1.0)
                    + 1e-6 * f64::from(beta.abs());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - w).abs() <= tol,
                        "{m}x{n}x{k} alpha={alpha} beta={beta} t={threads} [{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn test_kernel_sgemm_beta_zero_ignores_c_and_aliasing_is_safe() {
    let (m, n, k) = (9, 11, 13);
    let mut rng = Rng(5);
    let mut p = partition(MIB, 3);
    let a = rng.floats(m * k);
    let b = rng.floats(k * n);
    let pc = p.alloc(4 * (m * n) as u64, 0).unwrap();
    p.fill(pc, 4 * (m * n) as u64, f32::NAN.to_bits()).unwrap();
    let pa = p.alloc(4 * (m * k) as u64, 0).unwrap();
    let pb = p.alloc(4 * (k * n) as u64, 0).unwrap();
    upload_floats(&mut p, pa, &a);
    upload_floats(&mut p, pb, &b);
    let params = abi::SgemmParams {
        c: pc,
        a: pa,
        b: pb,
        m: m as u32,
        n: n as u32,
        k: k as u32,
        reserved: 0,
        alpha: 2.0,
        beta: 0.0,
    };
    launch(&mut p, "sgemm_f32", params).unwrap();
    let want = sgemm_reference((m, n, k), 2.0, &a, &b, 0.0, &[]);
    let got = download_floats(&mut p, pc, m * n);
    for (g, w) in got.iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{g} vs {w}");
    }

    // C = A * A' with C being A itself (square, in place): inputs are
    // read before C is written.
    let s = 8;
    let x = rng.floats(s * s);
    let px = p.alloc(4 * (s * s) as u64, 0).unwrap();
    upload_floats(&mut p, px, &x);
    let params = abi::SgemmParams {
        c: px,
        a: px,
        b: px,
        m: s as u32,
        n: s as u32,
        k: s as u32,
        reserved: 0,
        alpha: 1.0,
        beta: 1.0,
    };
    launch(&mut p, "sgemm_f32", params).unwrap();
    let want = sgemm_reference((s, s, s), 1.0, &x, &x, 1.0, &x);
    let got = download_floats(&mut p, px, s * s);
    for (g, w) in got.iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{g} vs {w}");
    }
}

#[test]
fn test_kernel_reduce_sum() {
    let mut rng = Rng(0xabcdef);
    for threads in [1, 3, 4, 7] {
        for n in [0usize, 1, 2, 999, 10_007] {
            let mut p = partition(MIB, threads);
            let v = rng.floats(n);
            let buf = p.alloc(4 * n as u64 + 8, 0).unwrap();
            upload_floats(&mut p, buf, &v);
            p.fill(buf + 4 * n as u64, 8, 0xffff_ffff).unwrap();
            let out = buf + 4 * n as u64 + 4;
            let params = abi::ReduceSumParams {
                out,
                input: buf,
                n: n as u64,
            };
            launch(&mut p, "reduce_sum_f32", params).unwrap();
            let want: f64 = v.iter().map(|&x| f64::from(x)).sum();
            let got = download_floats(&mut p, out, 1)[0];
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 * (n as f64 + 1.0),
                "n={n} t={threads}: {got} vs {want}"
            );
            // The output may be one of the inputs.
            if n > 0 {
                let params = abi::ReduceSumParams { out: buf, ..params };
                launch(&mut p, "reduce_sum_f32", params).unwrap();
                let got = download_floats(&mut p, buf, 1)[0];
                assert!((f64::from(got) - want).abs() <= 1e-6 * (n as f64 + 1.0));
            }
        }
    }
}

#[test]
fn test_kernels_reject_out_of_range_pointers_before_writing() {
    let mut p = partition(MIB, 2);
    let a = p.alloc(400, 0).unwrap();
    let b = p.alloc(400, 0).unwrap();
    let c = p.alloc(400, 0).unwrap();
    let mut rng = Rng(3);
    for addr in [a, b, c] {
        upload_floats(&mut p, addr, &rng.floats(100));
    }
    let before = snapshot(&p);
    let huge = u64::MAX / 2; // n * 4 overflows
    let oor = |r: Result<(), OpError>| matches!(r, Err(OpError::OutOfRange { .. }));

    let fill = |dst, count| abi::FillParams {
        dst,
        count,
        value: 1,
        reserved: 0,
    };
    assert!(oor(launch(&mut p, "fill_u32", fill(a, 101))));
    assert!(oor(launch(&mut p, "fill_u32", fill(a + 4, 100))));
    assert!(oor(launch(&mut p, "fill_u32", fill(a, huge))));
    assert!(oor(launch(&mut p, "fill_u32", fill(a, 1 << 62))));
    assert!(oor(launch(&mut p, "fill_u32", fill(0, 1))));

    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    assert!(oor(launch(&mut p, "copy", copy(a, b, 401))));
    assert!(oor(launch(&mut p, "copy", copy(a, b + 1, 400))));
    assert!(oor(launch(&mut p, "copy", copy(a + 1, b, 400))));
    assert!(oor(launch(&mut p, "copy", copy(a, b, u64::MAX))));

    let vadd = |c, a, b, n| abi::VaddParams { c, a, b, n };
    assert!(oor(launch(&mut p, "vadd_f32", vadd(c, a, b, 101))));
    assert!(oor(launch(&mut p, "vadd_f32", vadd(c, a, b + 4, 100))));
    assert!(oor(launch(&mut p, "vadd_f32", vadd(c + 4, a, b, 100))));
    assert!(oor(launch(&mut p, "vadd_f32", vadd(c, a, b, huge))));
    assert!(oor(launch(&mut p, "vadd_f32", vadd(c, 0, b, 1))));

    let saxpy = |y, x, n| abi::SaxpyParams {
        y,
        x,
        n,
        a: 2.0,
        reserved: 0,
    };
    assert!(oor(launch(&mut p, "saxpy_f32", saxpy(a, b + 4, 100))));
    assert!(oor(launch(&mut p, "saxpy_f32", saxpy(a + 400, b, 1))));
    assert!(oor(launch(&mut p, "saxpy_f32", saxpy(a, b, huge))));

    let sgemm = |c, a, b, m, n, k| abi::SgemmParams {
        c,
        a,
        b,
        m,
        n,
        k,
        reserved: 0,
        alpha: 1.0,
        beta: 1.0,
    };
    assert!(oor(launch(&mut p, "sgemm_f32", sgemm(c, a, b, 10, 10, 11))));
    assert!(oor(launch(&mut p, "sgemm_f32", sgemm(c, a, b, 11, 10, 10))));
    assert!(oor(launch(
        &mut p,
        "sgemm_f32",
        sgemm(c + 4, a, b, 10, 10, 10)
    )));
    assert!(oor(launch(
        &mut p,
        "sgemm_f32",
        sgemm(c, a, b, u32::MAX, u32::MAX, 1)
    )));
    assert!(oor(launch(
        &mut p,
        "sgemm_f32",
        sgemm(c, a, b, 1, 1, u32::MAX)
    )));

    let reduce = |out, input, n| abi::ReduceSumParams { out, input, n };
    assert!(oor(launch(&mut p, "reduce_sum_f32", reduce(a + 400, b, 1))));
    assert!(oor(launch(&mut p, "reduce_sum_f32", reduce(a + 397, b, 1))));
    assert!(oor(launch(&mut p, "reduce_sum_f32", reduce(a, b, 101))));
    assert!(oor(launch(&mut p, "reduce_sum_f32", reduce(a, b, huge))));

    assert_eq!(snapshot(&p), before);
    // In range, the same kernels run.
    launch(&mut p, "sgemm_f32", sgemm(c, a, b, 10, 10, 10)).unwrap();
    launch(&mut p, "vadd_f32", vadd(c, a, b, 100)).unwrap();
}
