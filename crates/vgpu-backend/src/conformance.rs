//! The behaviour every backend shares, as tests any backend can run: one
//! public function per behaviour, each given a factory of partitions
//! (`make`), and [`run_all`] for all of them. The software backend runs
//! them in its unit tests; the CUDA and remote backends in their
//! integration tests. Behaviour that only one backend has (its address
//! layout, its memory accounting, its own limits) stays in its own tests.
//!
//! The factory is handed the spec a test wants; it may adjust what the
//! backend needs (a CUDA partition's SMs, say) and must give a fresh
//! partition with at least the spec's memory quota, exactly that quota
//! where a test fills it. The functions panic on the first difference.

use std::cell::RefCell;

use vgpu_abi::{self as abi, ByteValued};

use crate::rules::DEFAULT_ALIGN;
use crate::{
    DeviceCopy, DeviceFill, HostSink, HostSlice, HostSource, Launch, OpError, Partition,
    PartitionSpec, Queued, SliceMemory, Started,
};

/// Makes a fresh partition for `spec`.
pub type Make<'a> = &'a dyn Fn(&PartitionSpec) -> Box<dyn Partition>;

/// A mebibyte.
pub const MIB: u64 = 1 << 20;

/// Runs every behaviour of this module against `make`'s partitions.
pub fn run_all(make: Make<'_>) {
    alloc_alignment_and_limits(make);
    quota_exhaustion_returns_no_memory_and_changes_nothing(make);
    a_live_resize_moves_the_quota_and_keeps_the_data(make);
    suspend_and_resume_keep_the_data_at_its_addresses(make);
    free_and_double_free(make);
    upload_download_round_trip(make);
    copy_within_and_between_allocations(make);
    fill(make);
    partitions_cannot_see_each_other(make);
    reset_frees_everything(make);
    module_errors(make);
    launch_validation(make);
    kernel_fill_u32(make);
    kernel_copy(make);
    kernel_vadd(make);
    kernel_vadd_aliasing(make);
    kernel_saxpy(make);
    kernel_sgemm(make);
    kernel_sgemm_beta_zero_ignores_c_and_aliasing_is_safe(make);
    kernel_reduce_sum(make);
    kernels_reject_out_of_range_pointers_before_writing(make);
    queued_steps_run_in_order(make);
    queued_copies_move_their_own_bytes(make);
    queued_fills_and_device_copies(make);
    queued_runs_in_flight_finish_in_order(make);
    queued_runs_on_lanes_finish_in_order_per_lane(make);
}

/// A deterministic source of test data (xorshift).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` floats in [-1, 1).
    pub fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 32) as u8).collect()
    }
}

/// Host memory to upload from.
pub struct VecSource(pub Vec<u8>);

impl HostSource for VecSource {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        self.0.read_at(offset, buf)
    }
}

/// Host memory to download to.
pub struct VecSink(pub RefCell<Vec<u8>>);

impl VecSink {
    /// `len` zero bytes.
    pub fn new(len: usize) -> VecSink {
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

/// A spec.
pub fn spec(name: &str, memory: u64, compute_units: u32) -> PartitionSpec {
    PartitionSpec {
        name: name.into(),
        memory,
        compute_units,
    }
}

/// Uploads `bytes` to `addr`; panics on failure.
pub fn upload(p: &mut dyn Partition, addr: u64, bytes: &[u8]) {
    p.upload(addr, &VecSource(bytes.to_vec())).unwrap();
}

/// Downloads `len` bytes from `addr`; panics on failure.
pub fn download(p: &mut dyn Partition, addr: u64, len: usize) -> Vec<u8> {
    let sink = VecSink::new(len);
    p.download(addr, &sink).unwrap();
    sink.0.into_inner()
}

/// Little-endian bytes of floats.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Floats of little-endian bytes.
pub fn to_floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Uploads floats to `addr`.
pub fn upload_floats(p: &mut dyn Partition, addr: u64, v: &[f32]) {
    upload(p, addr, &to_bytes(v));
}

/// Downloads `n` floats from `addr`.
pub fn download_floats(p: &mut dyn Partition, addr: u64, n: usize) -> Vec<f32> {
    to_floats(&download(p, addr, n * 4))
}

/// Launches built-in `entry` with `params` on one block of 64 threads.
pub fn launch<T: ByteValued>(p: &mut dyn Partition, entry: &str, params: T) -> Result<(), OpError> {
    p.launch(&Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module: abi::MODULE_BUILTIN,
        entry,
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        params: params.as_slice(),
    })
}

/// A launch of built-in `entry` with `params` on one thread.
pub fn builtin_launch<'a>(entry: &'a str, params: &'a [u8]) -> Launch<'a> {
    Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module: abi::MODULE_BUILTIN,
        entry,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params,
    }
}

/// Size 0 and bad alignments are refused; the default alignment and a
/// large one are honoured; new memory reads as zero; a range one byte
/// past an allocation is in none.
pub fn alloc_alignment_and_limits(make: Make<'_>) {
    let mut boxed = make(&spec("test", 16 * MIB, 1));
    let p = &mut *boxed;
    assert!(matches!(p.alloc(0, 0), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 3), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 48), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 1 << 31), Err(OpError::Invalid(_))));
    assert_eq!(p.memory_used(), 0);

    let a = p.alloc(100, 0).unwrap();
    assert_eq!(a % DEFAULT_ALIGN, 0);
    let b = p.alloc(4096, 0).unwrap();
    assert_eq!(b % DEFAULT_ALIGN, 0);
    assert_eq!(p.memory_used(), 100 + 4096);
    let c = p.alloc(4096, 1 << 20).unwrap();
    assert_eq!(c % (1 << 20), 0);

    // New memory reads as zero.
    assert_eq!(download(p, c, 4096), vec![0; 4096]);
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
    assert!(matches!(p.fill(0, 4, 1), Err(OpError::OutOfRange { .. })));
    assert_eq!(p.fill(a + 96, 4, 1), Ok(()));
    for addr in [a, b, c] {
        p.free(addr).unwrap();
    }
    assert_eq!(p.memory_used(), 0);
}

/// Module calls with nothing to find: an unknown format, the built-in
/// module (which cannot be unloaded), unknown handles.
pub fn module_errors(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    assert!(matches!(
        p.module_load(99, b""),
        Err(OpError::Unsupported(_))
    ));
    assert!(matches!(
        p.module_unload(abi::MODULE_BUILTIN),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(p.module_unload(1), Err(OpError::NotFound(_))));
    assert!(matches!(
        p.module_unload(u64::MAX),
        Err(OpError::NotFound(_))
    ));
}

/// An allocation past the quota is NoMemory with the exact numbers and
/// changes nothing; the rest of the quota is there to the byte.
pub fn quota_exhaustion_returns_no_memory_and_changes_nothing(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(MIB / 2, 0).unwrap();
    p.fill(a, MIB / 2, 0xdead_beef).unwrap();
    let before = download(p, a, (MIB / 2) as usize);
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
    assert_eq!(download(p, a, (MIB / 2) as usize), before);
    // The rest of the quota is still there, to the byte.
    let b = p.alloc(MIB / 2, 0).unwrap();
    assert_eq!(p.memory_used(), MIB);
    assert!(matches!(p.alloc(1, 0), Err(OpError::NoMemory { .. })));
    p.free(b).unwrap();
    p.alloc(MIB / 4, 0).unwrap();
}

/// A live resize: growing lets the partition allocate up to the new
/// quota at once, shrinking below what it holds is refused and changes
/// nothing, shrinking to what it holds leaves no room; the data stays.
pub fn a_live_resize_moves_the_quota_and_keeps_the_data(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(MIB, 0).unwrap();
    p.fill(a, MIB, 0x5eed_1234).unwrap();
    let before = download(p, a, MIB as usize);
    p.set_memory(2 * MIB).unwrap();
    assert_eq!(p.spec().memory, 2 * MIB);
    let b = p.alloc(MIB, 0).unwrap();
    assert!(matches!(p.alloc(1, 0), Err(OpError::NoMemory { .. })));
    assert!(matches!(p.set_memory(MIB), Err(OpError::Invalid(_))));
    assert_eq!(p.spec().memory, 2 * MIB, "a refusal changes nothing");
    p.free(b).unwrap();
    p.set_memory(MIB).unwrap();
    assert!(matches!(
        p.alloc(1, 0),
        Err(OpError::NoMemory { available: 0, .. })
    ));
    assert_eq!(download(p, a, MIB as usize), before);
    assert_eq!(p.memory_used(), MIB);
}

/// Suspended and resumed, a partition has every allocation at its
/// address with its bytes, twice in a row as once; a backend that cannot
/// suspend says so and changes nothing.
pub fn suspend_and_resume_keep_the_data_at_its_addresses(make: Make<'_>) {
    let mut boxed = make(&spec("test", 2 * MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(MIB, 0).unwrap();
    let b = p.alloc(MIB / 4, 0).unwrap();
    let mut rng = Rng(7);
    let data: Vec<u8> = (0..MIB).map(|_| rng.next() as u8).collect();
    upload(p, a, &data);
    p.fill(b, MIB / 4, 0x0bad_f00d).unwrap();
    let used = p.memory_used();
    match p.suspend() {
        Err(OpError::Unsupported(_)) => {}
        Err(e) => panic!("suspend: {e}"),
        Ok(out) => {
            assert!(out >= MIB + MIB / 4, "{out} bytes moved out");
            assert_eq!(
                p.suspend().unwrap(),
                out,
                "a second suspend moves nothing more"
            );
            assert_eq!(p.memory_used(), used, "the guest still holds it");
            p.resume().unwrap();
            p.resume().unwrap();
        }
    }
    assert_eq!(download(p, a, MIB as usize), data);
    assert!(download(p, b, (MIB / 4) as usize)
        .chunks_exact(4)
        .all(|w| w == 0x0bad_f00du32.to_le_bytes()));
    assert_eq!(p.memory_used(), used);
    let c = p.alloc(MIB / 2, 0).unwrap();
    p.free(c).unwrap();
    p.free(a).unwrap();
}

/// Only the start of a live allocation can be freed, once; its memory
/// goes back to the quota and its range to no allocation.
pub fn free_and_double_free(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(1000, 0).unwrap();
    let b = p.alloc(2000, 0).unwrap();
    assert!(matches!(p.free(a + 4), Err(OpError::NotFound(_))));
    assert!(matches!(p.free(0), Err(OpError::NotFound(_))));
    p.free(a).unwrap();
    assert_eq!(p.memory_used(), 2000);
    assert!(matches!(p.free(a), Err(OpError::NotFound(_))));
    assert!(matches!(p.fill(a, 4, 0), Err(OpError::OutOfRange { .. })));
    let c = p.alloc(1000, 0).unwrap();
    p.free(b).unwrap();
    p.free(c).unwrap();
    assert_eq!(p.memory_used(), 0);
}

/// Bytes go up and come back, whole or in part; ranges past the end are
/// refused; a host fault comes back as it is.
pub fn upload_download_round_trip(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 2));
    let p = &mut *boxed;
    let a = p.alloc(10_000, 0).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    upload(p, a, &data);
    assert_eq!(download(p, a, 10_000), data);
    // Into the middle, and back out of it.
    upload(p, a + 17, &[1, 2, 3]);
    assert_eq!(download(p, a + 16, 5), vec![data[16], 1, 2, 3, data[20]]);
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

/// Device copies between and within allocations, overlapping either way.
pub fn copy_within_and_between_allocations(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 2));
    let p = &mut *boxed;
    let a = p.alloc(64, 0).unwrap();
    let b = p.alloc(64, 0).unwrap();
    let data: Vec<u8> = (0..64).collect();
    upload(p, a, &data);
    p.copy(b, a, 64).unwrap();
    assert_eq!(download(p, b, 64), data);
    // Overlapping, forwards and backwards.
    p.copy(a + 8, a, 32).unwrap();
    let mut want = data.clone();
    want.copy_within(0..32, 8);
    assert_eq!(download(p, a, 64), want);
    p.copy(a, a + 8, 32).unwrap();
    want.copy_within(8..40, 0);
    assert_eq!(download(p, a, 64), want);
    assert!(matches!(
        p.copy(b, a + 1, 64),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(matches!(
        p.copy(b + 1, a, 64),
        Err(OpError::OutOfRange { .. })
    ));
    assert_eq!(download(p, b, 64), data);
}

/// Fills: whole words only, the pattern repeated from the first byte.
pub fn fill(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 3));
    let p = &mut *boxed;
    let a = p.alloc(1 << 16, 0).unwrap();
    assert!(matches!(p.fill(a, 6, 1), Err(OpError::Invalid(_))));
    p.fill(a + 4, 4 * 1001, 0x0403_0201).unwrap();
    let got = download(p, a, 4 * 1003);
    assert_eq!(&got[..4], &[0; 4]);
    for w in got[4..4 * 1002].chunks_exact(4) {
        assert_eq!(w, &[1, 2, 3, 4]);
    }
    assert_eq!(&got[4 * 1002..], &[0; 4]);
    p.fill(a, 1 << 16, 0x5555_5555).unwrap();
    assert!(download(p, a, 1 << 16).iter().all(|&b| b == 0x55));
}

/// A partition reaches none of another's allocations, by any command.
pub fn partitions_cannot_see_each_other(make: Make<'_>) {
    let mut boxed_a = make(&spec("a", 2 * MIB, 1));
    let mut boxed_b = make(&spec("b", 2 * MIB, 1));
    let (pa, pb) = (&mut *boxed_a, &mut *boxed_b);
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
    let oor = |r: Result<(), OpError>| matches!(r, Err(OpError::OutOfRange { .. }));
    assert!(oor(pb.upload(a2, &VecSource(vec![0; 4]))));
    assert!(oor(pb.copy(a2, b1, 4)));
    assert!(oor(pb.upload(b1 + 15, &VecSource(vec![0; 2]))));
    let fill = abi::FillParams {
        dst: a2,
        count: 1,
        value: 0,
        reserved: 0,
    };
    assert!(oor(launch(pb, "fill_u32", fill)));
    let copy = abi::CopyParams {
        dst: b1,
        src: a2,
        bytes: 16,
    };
    assert!(oor(launch(pb, "copy", copy)));
    let reduce = abi::ReduceSumParams {
        out: b1,
        input: a2,
        n: 4,
    };
    assert!(oor(launch(pb, "reduce_sum_f32", reduce)));
    // B's writes to its own memory do not show up in A.
    pb.fill(b1, 16, 0x3333_3333).unwrap();
    assert!(download(pa, a1, 4096).iter().all(|&b| b == 0x11));
    assert!(download(pa, a2, 4096).iter().all(|&b| b == 0x22));
    pb.reset();
    assert_eq!(pa.memory_used(), 8192);
}

/// Reset frees every allocation; the whole quota is there again, zeroed.
pub fn reset_frees_everything(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(1000, 0).unwrap();
    p.alloc(2000, 0).unwrap();
    p.reset();
    assert_eq!(p.memory_used(), 0);
    assert!(matches!(p.free(a), Err(OpError::NotFound(_))));
    let b = p.alloc(MIB, 0).unwrap();
    assert_eq!(download(p, b, 16), vec![0; 16]);
}

/// A launch names a known module and entry, a shape without a zero
/// dimension and a parameter block of the entry's size; a refused one
/// writes nothing.
pub fn launch_validation(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 1));
    let p = &mut *boxed;
    let a = p.alloc(64, 0).unwrap();
    let fill = abi::FillParams {
        dst: a,
        count: 16,
        value: 9,
        reserved: 0,
    };
    let base = builtin_launch("fill_u32", fill.as_slice());
    let long = [fill.as_slice(), &[0]].concat();
    // (what, the launch, whether it is refused as not found, else invalid)
    let refused = [
        (
            "unknown module",
            Launch {
                module: 5,
                ..base.clone()
            },
            true,
        ),
        (
            "unknown entry",
            Launch {
                entry: "nope",
                ..base.clone()
            },
            true,
        ),
        (
            "empty grid",
            Launch {
                grid: [1, 0, 1],
                ..base.clone()
            },
            false,
        ),
        (
            "empty block",
            Launch {
                block: [0, 1, 1],
                ..base.clone()
            },
            false,
        ),
        (
            "long parameters",
            Launch {
                params: &long,
                ..base.clone()
            },
            false,
        ),
        (
            "short parameters",
            Launch {
                params: &fill.as_slice()[1..],
                ..base.clone()
            },
            false,
        ),
    ];
    for (what, launch, not_found) in refused {
        let r = p.launch(&launch);
        if not_found {
            assert!(matches!(r, Err(OpError::NotFound(_))), "{what}: {r:?}");
        } else {
            assert!(matches!(r, Err(OpError::Invalid(_))), "{what}: {r:?}");
        }
    }
    assert_eq!(download(p, a, 64), vec![0; 64]);
    // Every built-in entry is dispatched (wrong size, not unknown).
    for entry in abi::BUILTIN_ENTRIES {
        assert!(
            matches!(
                p.launch(&Launch {
                    cluster: [1, 1, 1],
                    cooperative: false,
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
    assert_eq!(to_floats(&download(p, a, 64)).len(), 16);
    assert!(download(p, a, 64)
        .chunks_exact(4)
        .all(|w| w == [9, 0, 0, 0]));
}

/// A queued run: launches take effect in order (a copy sees the fill
/// before it), a refused launch fails alone, timestamps and ends never
/// go back, and a run past [`crate::MAX_QUEUED_STEPS`] refuses only the
/// steps beyond it.
pub fn queued_steps_run_in_order(make: Make<'_>) {
    let mut boxed = make(&spec("queued", MIB, 2));
    let p = &mut *boxed;
    assert!(p.run_queued(&[], &|| false).is_empty());
    let (a, b, c) = (
        p.alloc(4096, 0).unwrap(),
        p.alloc(4096, 0).unwrap(),
        p.alloc(4096, 0).unwrap(),
    );
    let fill = |dst, value| abi::FillParams {
        dst,
        count: 1024,
        value,
        reserved: 0,
    };
    let fill_a = fill(a, 0x1357_9bdf);
    let fill_c = fill(c, 0x2468_ace0);
    let copy_ab = abi::CopyParams {
        dst: b,
        src: a,
        bytes: 4096,
    };
    let overlap = abi::CopyParams {
        dst: a + 4,
        src: a,
        bytes: 64,
    };
    let steps = [
        Queued::Timestamp,
        Queued::Launch(builtin_launch("fill_u32", fill_a.as_slice())),
        Queued::Launch(builtin_launch("copy", copy_ab.as_slice())),
        Queued::Timestamp,
        Queued::Launch(builtin_launch("copy", overlap.as_slice())),
        Queued::Launch(builtin_launch("fill_u32", fill_c.as_slice())),
        Queued::Timestamp,
    ];
    let done = p.run_queued(&steps, &|| false);
    assert_eq!(done.len(), steps.len());
    for (i, d) in done.iter().enumerate() {
        if i == 4 {
            assert!(matches!(d.result, Err(OpError::Invalid(_))), "{d:?}");
        } else {
            assert_eq!(d.result, Ok(()), "step {i}");
        }
    }
    assert!(
        done.windows(2).all(|w| w[0].end_ns <= w[1].end_ns),
        "{done:?}"
    );
    let words = |v: u32| v.to_le_bytes().repeat(1024);
    assert_eq!(download(p, b, 4096), words(0x1357_9bdf));
    assert_eq!(download(p, c, 4096), words(0x2468_ace0));
    let many = vec![Queued::Timestamp; crate::MAX_QUEUED_STEPS + 2];
    let done = p.run_queued(&many, &|| false);
    assert_eq!(done.len(), many.len());
    assert!(done[..crate::MAX_QUEUED_STEPS]
        .iter()
        .all(|d| d.result.is_ok()));
    assert!(done[crate::MAX_QUEUED_STEPS..]
        .iter()
        .all(|d| matches!(d.result, Err(OpError::Invalid(_)))));
}

/// Copies between host memory and device memory queued as steps, in
/// pieces (as guest memory comes): each moves its own bytes in order
/// with the launches around it, and one with a bad device range fails
/// alone.
pub fn queued_copies_move_their_own_bytes(make: Make<'_>) {
    let mut boxed = make(&spec("queued-copies", MIB, 2));
    let p = &mut *boxed;
    let (a, b, c) = (
        p.alloc(8192, 0).unwrap(),
        p.alloc(8192, 0).unwrap(),
        p.alloc(8192, 0).unwrap(),
    );
    let mut rng = Rng(11);
    let mut one = rng.bytes(8192);
    let mut two = rng.bytes(8192);
    let mut back_one = vec![0u8; 8192];
    let mut back_two = vec![0u8; 8192];
    // Two pieces of one buffer, out of order in memory.
    let halves = |buf: &mut [u8]| {
        let (lo, hi) = buf.split_at_mut(4096);
        [
            HostSlice {
                ptr: hi.as_mut_ptr(),
                len: 4096,
                mapping: 0,
            },
            HostSlice {
                ptr: lo.as_mut_ptr(),
                len: 4096,
                mapping: 0,
            },
        ]
    };
    let (up1, up2) = (halves(&mut one), halves(&mut two));
    let (down1, down2) = (halves(&mut back_one), halves(&mut back_two));
    // SAFETY: the slices are halves of buffers that outlive the runs and
    // are not otherwise used until they return.
    let mem = |s| unsafe { SliceMemory::new(s) };
    let copy_ac = abi::CopyParams {
        dst: c,
        src: a,
        bytes: 8192,
    };
    let steps = [
        Queued::Upload {
            dst: a,
            src: mem(&up1),
        },
        // Back to back: the second must not disturb the first.
        Queued::Upload {
            dst: b,
            src: mem(&up2),
        },
        Queued::Launch(builtin_launch("copy", copy_ac.as_slice())),
        Queued::Upload {
            dst: b + 8192 * 64,
            src: mem(&up1),
        },
        Queued::Timestamp,
    ];
    let done = p.run_queued(&steps, &|| false);
    let results: Vec<_> = done.iter().map(|d| d.result.is_ok()).collect();
    assert_eq!(results, [true, true, true, false, true], "{done:?}");
    let downs = [
        Queued::Download {
            src: c,
            dst: mem(&down1),
        },
        Queued::Download {
            src: b,
            dst: mem(&down2),
        },
        Queued::Download {
            src: a + 8192 * 64,
            dst: mem(&down1),
        },
    ];
    let done = p.run_queued(&downs, &|| false);
    let results: Vec<_> = done.iter().map(|d| d.result.is_ok()).collect();
    assert_eq!(results, [true, true, false], "{done:?}");
    // Each was filled half by half in the same swapped order.
    assert_eq!(back_one, one);
    assert_eq!(back_two, two);
}

/// Fills and copies between device addresses queued with launches and
/// an upload run in order, each seeing the one before; one out of range
/// or of a size a fill refuses fails alone.
pub fn queued_fills_and_device_copies(make: Make<'_>) {
    let mut boxed = make(&spec("queued-fills", MIB, 2));
    let p = &mut *boxed;
    let (a, b) = (p.alloc(8192, 0).unwrap(), p.alloc(8192, 0).unwrap());
    let mut up = Rng(5).bytes(4096);
    let src = [HostSlice {
        ptr: up.as_mut_ptr(),
        len: up.len(),
        mapping: 0,
    }];
    // SAFETY: `up` outlives the run and is not otherwise used meanwhile.
    let mem = unsafe { SliceMemory::new(&src) };
    let fill_b = abi::FillParams {
        dst: b,
        count: 2048,
        value: 0x0707_0707,
        reserved: 0,
    };
    let steps = [
        Queued::Fill(DeviceFill {
            addr: a,
            size: 8192,
            pattern: 0xa5a5_a5a5,
        }),
        // The second half of `a` copied over the first: a's bytes 4096.. are
        // the fill's when the copy reads them.
        Queued::Copy(DeviceCopy {
            dst: a,
            src: a + 4096,
            size: 4096,
        }),
        Queued::Upload {
            dst: a + 4096,
            src: mem,
        },
        Queued::Launch(builtin_launch("fill_u32", fill_b.as_slice())),
        // Overlapping, within `b`: moves the launch's words up by 4.
        Queued::Copy(DeviceCopy {
            dst: b + 4,
            src: b,
            size: 4092,
        }),
        Queued::Fill(DeviceFill {
            addr: b + 4096,
            size: 6,
            pattern: 0,
        }),
        Queued::Fill(DeviceFill {
            addr: b + 8000,
            size: 256,
            pattern: 0,
        }),
        Queued::Copy(DeviceCopy {
            dst: b,
            src: a + 8000,
            size: 400,
        }),
        // The first word of `b`, after the fills and copies before it.
        Queued::Fill(DeviceFill {
            addr: b,
            size: 4,
            pattern: 0x1234_5678,
        }),
        Queued::Timestamp,
    ];
    let done = p.run_queued(&steps, &|| false);
    let results: Vec<_> = done.iter().map(|d| d.result.is_ok()).collect();
    assert_eq!(
        results,
        [true, true, true, true, true, false, false, false, true, true],
        "{done:?}"
    );
    let got_a = download(p, a, 8192);
    assert!(got_a[..4096].iter().all(|&x| x == 0xa5), "copied fill");
    assert_eq!(&got_a[4096..], &up[..], "upload after the copy");
    let got_b = download(p, b, 8192);
    assert_eq!(&got_b[..4], &0x1234_5678u32.to_le_bytes(), "last fill");
    assert!(
        got_b[4..4096].iter().all(|&x| x == 7),
        "moved launch's words"
    );
    assert!(got_b[4096..].iter().all(|&x| x == 7), "the refused fills");
}

/// Runs started as deep as the partition keeps them in flight finish in
/// the order started, each seeing the device as the runs before it left
/// it, with their copies' host memory in use until they are finished.
pub fn queued_runs_in_flight_finish_in_order(make: Make<'_>) {
    let mut boxed = make(&spec("in-flight", MIB, 2));
    let p = &mut *boxed;
    let depth = p.queue_depth();
    assert!((1..=4).contains(&depth), "queue depth {depth}");
    let a = p.alloc(64 << 10, 0).unwrap();
    let mut outs: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; 4096]).collect();
    // Run k fills `a` with k + 1 in each byte, then takes its first 4 KiB
    // out; a run that began before the one before it ended, or a result
    // given to the wrong run, shows.
    let slices: Vec<[HostSlice; 1]> = outs
        .iter_mut()
        .map(|o| {
            [HostSlice {
                ptr: o.as_mut_ptr(),
                len: o.len(),
                mapping: 0,
            }]
        })
        .collect();
    let mut started = Vec::new();
    for (k, s) in slices.iter().enumerate() {
        // SAFETY: `outs` outlives every run and is not otherwise touched
        // until they are finished.
        let mem = unsafe { SliceMemory::new(s) };
        let byte = k as u32 + 1;
        let steps = [
            Queued::Timestamp,
            Queued::Fill(DeviceFill {
                addr: a,
                size: 64 << 10,
                pattern: byte * 0x0101_0101,
            }),
            Queued::Download { src: a, dst: mem },
            Queued::Timestamp,
        ];
        started.push(p.start_queued(0, &steps, &|| false, true));
    }
    let mut results = Vec::new();
    for s in started {
        let done = match s {
            Started::Done(done) => done,
            Started::InFlight => {
                let (lane, f) = p.finish_queued().expect("a run in flight");
                assert_eq!(lane, 0, "the run's lane");
                f.done
            }
        };
        assert_eq!(done.len(), 4, "{done:?}");
        assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
        assert!(done.windows(2).all(|w| w[0].end_ns <= w[1].end_ns));
        results.push(done);
    }
    assert!(p.finish_queued().is_none(), "nothing left in flight");
    for (k, o) in outs.iter().enumerate() {
        assert!(o.iter().all(|&x| x == k as u8 + 1), "run {k}");
    }
    // And the partition is as before: a run waited for at once works.
    let done = p.run_queued(&[Queued::Timestamp], &|| false);
    assert!(done[0].result.is_ok());
    assert_eq!(download(p, a, 4), [depth as u8; 4]);
}

/// Runs started on every lane at once (as deep as each keeps them) finish
/// in the order started within their lane, each with its own results:
/// lanes are independent streams, each seeing only its own work in order.
pub fn queued_runs_on_lanes_finish_in_order_per_lane(make: Make<'_>) {
    let mut boxed = make(&spec("lanes", MIB, 2));
    let p = &mut *boxed;
    let (lanes, depth) = (p.lanes().clamp(1, 4), p.queue_depth());
    let bufs: Vec<u64> = (0..lanes).map(|_| p.alloc(64 << 10, 0).unwrap()).collect();
    let mut outs: Vec<Vec<u8>> = (0..lanes * depth).map(|_| vec![0u8; 4096]).collect();
    let slices: Vec<[HostSlice; 1]> = outs
        .iter_mut()
        .map(|o| {
            [HostSlice {
                ptr: o.as_mut_ptr(),
                len: o.len(),
                mapping: 0,
            }]
        })
        .collect();
    // Run k of lane l fills the lane's buffer with a byte of its own, then
    // takes 4 KiB out; the k loop goes round the lanes so that their runs
    // are started interleaved.
    let byte = |l: usize, k: usize| (l * depth + k + 1) as u32;
    let mut pending: Vec<std::collections::VecDeque<Started>> =
        (0..lanes).map(|_| Default::default()).collect();
    for k in 0..depth {
        for (l, buf) in bufs.iter().enumerate() {
            // SAFETY: `outs` outlives every run and is not otherwise
            // touched until they are finished.
            let mem = unsafe { SliceMemory::new(&slices[l * depth + k]) };
            let steps = [
                Queued::Fill(DeviceFill {
                    addr: *buf,
                    size: 64 << 10,
                    pattern: byte(l, k) * 0x0101_0101,
                }),
                Queued::Download {
                    src: *buf,
                    dst: mem,
                },
                Queued::Timestamp,
            ];
            pending[l].push_back(p.start_queued(l, &steps, &|| false, true));
        }
    }
    let mut seen = vec![0usize; lanes];
    let check = |done: &[crate::QueuedDone]| {
        assert_eq!(done.len(), 3, "{done:?}");
        assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
    };
    loop {
        // Runs the partition ran before returning are done in turn.
        for (l, q) in pending.iter_mut().enumerate() {
            while let Some(Started::Done(_)) = q.front() {
                let Some(Started::Done(done)) = q.pop_front() else {
                    unreachable!()
                };
                check(&done);
                seen[l] += 1;
            }
        }
        let Some((lane, f)) = p.finish_queued() else {
            break;
        };
        assert!(lane < lanes, "lane {lane} of {lanes}");
        assert!(
            matches!(pending[lane].pop_front(), Some(Started::InFlight)),
            "lane {lane} finished a run it did not have in flight"
        );
        check(&f.done);
        seen[lane] += 1;
    }
    assert!(pending.iter().all(|q| q.is_empty()), "runs left unfinished");
    assert_eq!(seen, vec![depth; lanes]);
    for l in 0..lanes {
        for k in 0..depth {
            let want = byte(l, k) as u8;
            assert!(
                outs[l * depth + k].iter().all(|&x| x == want),
                "lane {l} run {k}"
            );
        }
    }
    let done = p.run_queued(&[Queued::Timestamp], &|| false);
    assert!(done[0].result.is_ok());
}

/// `fill_u32` sets exactly its words.
pub fn kernel_fill_u32(make: Make<'_>) {
    for threads in [1, 3, 4] {
        let mut boxed = make(&spec("test", MIB, threads));
        let p = &mut *boxed;
        let a = p.alloc(4 * 1000 + 8, 0).unwrap();
        let fill = abi::FillParams {
            dst: a + 4,
            count: 1000,
            value: 0xa1b2_c3d4,
            reserved: 0,
        };
        launch(p, "fill_u32", fill).unwrap();
        let got = download(p, a, 4 * 1002);
        assert_eq!(&got[..4], &[0; 4]);
        assert!(got[4..4004]
            .chunks_exact(4)
            .all(|w| w == 0xa1b2_c3d4u32.to_le_bytes()));
        assert_eq!(&got[4004..], &[0; 4]);
    }
}

/// `copy` between and within allocations; overlap is refused.
pub fn kernel_copy(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 2));
    let p = &mut *boxed;
    let a = p.alloc(1000, 0).unwrap();
    let b = p.alloc(1000, 0).unwrap();
    let data: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
    upload(p, a, &data);
    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    launch(p, "copy", copy(b, a, 1000)).unwrap();
    assert_eq!(download(p, b, 1000), data);
    // Disjoint halves of one allocation.
    launch(p, "copy", copy(a, a + 500, 500)).unwrap();
    let mut want = data.clone();
    want.copy_within(500.., 0);
    assert_eq!(download(p, a, 1000), want);
    launch(p, "copy", copy(a + 600, a + 100, 400)).unwrap();
    want.copy_within(100..500, 600);
    assert_eq!(download(p, a, 1000), want);
    // Overlapping is refused.
    assert!(matches!(
        launch(p, "copy", copy(a + 1, a, 10)),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch(p, "copy", copy(a, a, 10)),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch(p, "copy", copy(b, a + 1, 1000)),
        Err(OpError::OutOfRange { .. })
    ));
    assert_eq!(download(p, a, 1000), want);
    assert_eq!(download(p, b, 1000), data);
}

/// `vadd_f32` against the host's sums.
pub fn kernel_vadd(make: Make<'_>) {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for threads in [1, 3, 4] {
        for n in [0usize, 1, 7, 1000, 4099] {
            let mut boxed = make(&spec("test", MIB, threads));
            let p = &mut *boxed;
            let a = rng.floats(n);
            let b = rng.floats(n);
            let pa = p.alloc(4 * n as u64 + 4, 0).unwrap();
            let pb = p.alloc(4 * n as u64 + 4, 0).unwrap();
            let pc = p.alloc(4 * n as u64 + 4, 0).unwrap();
            upload_floats(p, pa, &a);
            upload_floats(p, pb, &b);
            let params = abi::VaddParams {
                c: pc,
                a: pa,
                b: pb,
                n: n as u64,
            };
            launch(p, "vadd_f32", params).unwrap();
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(download_floats(p, pc, n), want, "n={n} t={threads}");
            assert_eq!(download_floats(p, pc + 4 * n as u64, 1), [0.0]);
        }
    }
}

/// `vadd_f32` with its operands aliasing or overlapping the output reads
/// every input as it was before the launch.
pub fn kernel_vadd_aliasing(make: Make<'_>) {
    let mut rng = Rng(77);
    let n = 1001;
    let mut boxed = make(&spec("test", MIB, 3));
    let p = &mut *boxed;
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
    upload_floats(p, buf, &data);
    launch(p, "vadd_f32", vadd(at(0), at(0), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[n + i]).collect();
    assert_eq!(download_floats(p, buf, n), want);

    // c == a == b.
    upload_floats(p, buf, &data);
    launch(p, "vadd_f32", vadd(at(n), at(n), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[n + i] + data[n + i]).collect();
    assert_eq!(download_floats(p, at(n), n), want);

    // Partial overlap: inputs read as they were before the launch.
    upload_floats(p, buf, &data);
    launch(p, "vadd_f32", vadd(at(1), at(0), at(2 * n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[2 * n + i]).collect();
    assert_eq!(download_floats(p, at(1), n), want);
    assert_eq!(download_floats(p, buf, 1), [data[0]]);

    upload_floats(p, buf, &data);
    launch(p, "vadd_f32", vadd(at(0), at(1), at(n + 5))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[1 + i] + data[n + 5 + i]).collect();
    assert_eq!(download_floats(p, buf, n), want);
}

/// `saxpy_f32`, with `x` apart from, equal to and overlapping `y`.
pub fn kernel_saxpy(make: Make<'_>) {
    let mut rng = Rng(99);
    for threads in [1, 2, 3, 5] {
        for n in [1usize, 13, 1024, 3001] {
            let mut boxed = make(&spec("test", MIB, threads));
            let p = &mut *boxed;
            let x = rng.floats(n);
            let y = rng.floats(n);
            let a = rng.f32() * 3.0;
            // x and y in one allocation, disjoint.
            let buf = p.alloc(8 * n as u64, 0).unwrap();
            upload_floats(p, buf, &[x.clone(), y.clone()].concat());
            let yp = buf + 4 * n as u64;
            let params = abi::SaxpyParams {
                y: yp,
                x: buf,
                n: n as u64,
                a,
                reserved: 0,
            };
            launch(p, "saxpy_f32", params).unwrap();
            let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
            assert_eq!(download_floats(p, yp, n), want);
            assert_eq!(download_floats(p, buf, n), x);
            // x == y.
            let params = abi::SaxpyParams { x: yp, ..params };
            launch(p, "saxpy_f32", params).unwrap();
            let want: Vec<f32> = want.iter().map(|y| a * y + y).collect();
            assert_eq!(download_floats(p, yp, n), want);
            // x overlaps y partly.
            if n > 1 {
                let before = download_floats(p, buf, 2 * n);
                let params = abi::SaxpyParams {
                    x: yp - 4,
                    ..params
                };
                launch(p, "saxpy_f32", params).unwrap();
                let want: Vec<f32> = (0..n)
                    .map(|i| a * before[n - 1 + i] + before[n + i])
                    .collect();
                assert_eq!(download_floats(p, yp, n), want);
            }
        }
    }
}

/// The parameters of `C = alpha * A * B + beta * C` for an `m` x `n` x
/// `k` shape.
pub fn sgemm_params(
    (c, a, b): (u64, u64, u64),
    (m, n, k): (u32, u32, u32),
    alpha: f32,
    beta: f32,
) -> abi::SgemmParams {
    abi::SgemmParams {
        c,
        a,
        b,
        m,
        n,
        k,
        reserved: 0,
        alpha,
        beta,
    }
}

/// Asserts that every float of `got` is within 1e-4 of `want`.
fn assert_near(got: &[f32], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{g} vs {w}");
    }
}

/// `alpha * A * B + beta * C` in f64, for an `m` x `n` x `k` shape.
pub fn sgemm_reference(
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

/// `sgemm_f32` against a double-precision reference, over shapes and scalars.
pub fn kernel_sgemm(make: Make<'_>) {
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
                let mut boxed = make(&spec("test", 16 * MIB, threads));
                let p = &mut *boxed;
                let a = rng.floats(m * k);
                let b = rng.floats(k * n);
                let c = rng.floats(m * n);
                let pa = p.alloc(4 * (m * k) as u64 + 1, 0).unwrap();
                let pb = p.alloc(4 * (k * n) as u64 + 1, 0).unwrap();
                let pc = p.alloc(4 * (m * n) as u64, 0).unwrap();
                upload_floats(p, pa, &a);
                upload_floats(p, pb, &b);
                upload_floats(p, pc, &c);
                let shape = (m as u32, n as u32, k as u32);
                let params = sgemm_params((pc, pa, pb), shape, alpha, beta);
                launch(p, "sgemm_f32", params).unwrap();
                let got = download_floats(p, pc, m * n);
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

/// `sgemm_f32` with `beta == 0` does not read C (NaNs there vanish), and
/// C may be A and B themselves.
pub fn kernel_sgemm_beta_zero_ignores_c_and_aliasing_is_safe(make: Make<'_>) {
    let (m, n, k) = (9, 11, 13);
    let mut rng = Rng(5);
    let mut boxed = make(&spec("test", MIB, 3));
    let p = &mut *boxed;
    let a = rng.floats(m * k);
    let b = rng.floats(k * n);
    let pc = p.alloc(4 * (m * n) as u64, 0).unwrap();
    p.fill(pc, 4 * (m * n) as u64, f32::NAN.to_bits()).unwrap();
    let pa = p.alloc(4 * (m * k) as u64, 0).unwrap();
    let pb = p.alloc(4 * (k * n) as u64, 0).unwrap();
    upload_floats(p, pa, &a);
    upload_floats(p, pb, &b);
    let shape = (m as u32, n as u32, k as u32);
    launch(p, "sgemm_f32", sgemm_params((pc, pa, pb), shape, 2.0, 0.0)).unwrap();
    let want = sgemm_reference((m, n, k), 2.0, &a, &b, 0.0, &[]);
    assert_near(&download_floats(p, pc, m * n), &want);

    // C = A * A' with C being A itself (square, in place): inputs are
    // read before C is written.
    let s = 8;
    let x = rng.floats(s * s);
    let px = p.alloc(4 * (s * s) as u64, 0).unwrap();
    upload_floats(p, px, &x);
    let shape = (s as u32, s as u32, s as u32);
    launch(p, "sgemm_f32", sgemm_params((px, px, px), shape, 1.0, 1.0)).unwrap();
    let want = sgemm_reference((s, s, s), 1.0, &x, &x, 1.0, &x);
    assert_near(&download_floats(p, px, s * s), &want);
}

/// `reduce_sum_f32` against the host's sum; its output may be in its input.
pub fn kernel_reduce_sum(make: Make<'_>) {
    let mut rng = Rng(0xabcdef);
    for threads in [1, 3, 4, 7] {
        for n in [0usize, 1, 2, 999, 10_007] {
            let mut boxed = make(&spec("test", MIB, threads));
            let p = &mut *boxed;
            let v = rng.floats(n);
            let buf = p.alloc(4 * n as u64 + 8, 0).unwrap();
            upload_floats(p, buf, &v);
            p.fill(buf + 4 * n as u64, 8, 0xffff_ffff).unwrap();
            let out = buf + 4 * n as u64 + 4;
            let params = abi::ReduceSumParams {
                out,
                input: buf,
                n: n as u64,
            };
            launch(p, "reduce_sum_f32", params).unwrap();
            let want: f64 = v.iter().map(|&x| f64::from(x)).sum();
            let got = download_floats(p, out, 1)[0];
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 * (n as f64 + 1.0),
                "n={n} t={threads}: {got} vs {want}"
            );
            // The output may be one of the inputs.
            if n > 0 {
                let params = abi::ReduceSumParams { out: buf, ..params };
                launch(p, "reduce_sum_f32", params).unwrap();
                let got = download_floats(p, buf, 1)[0];
                assert!((f64::from(got) - want).abs() <= 1e-6 * (n as f64 + 1.0));
            }
        }
    }
}

/// Every built-in refuses operands outside the allocations (overflowing
/// sizes included) before it writes anything.
pub fn kernels_reject_out_of_range_pointers_before_writing(make: Make<'_>) {
    let mut boxed = make(&spec("test", MIB, 2));
    let p = &mut *boxed;
    let a = p.alloc(400, 0).unwrap();
    let b = p.alloc(400, 0).unwrap();
    let c = p.alloc(400, 0).unwrap();
    let mut rng = Rng(3);
    for addr in [a, b, c] {
        upload_floats(p, addr, &rng.floats(100));
    }
    let snapshot = |p: &mut dyn Partition| [a, b, c].map(|addr| download(p, addr, 400));
    let before = snapshot(p);
    let huge = u64::MAX / 2; // n * 4 overflows
    let oor = |r: Result<(), OpError>| matches!(r, Err(OpError::OutOfRange { .. }));

    let fill = |dst, count| abi::FillParams {
        dst,
        count,
        value: 1,
        reserved: 0,
    };
    assert!(oor(launch(p, "fill_u32", fill(a, 101))));
    assert!(oor(launch(p, "fill_u32", fill(a + 4, 100))));
    assert!(oor(launch(p, "fill_u32", fill(a, huge))));
    assert!(oor(launch(p, "fill_u32", fill(a, 1 << 62))));
    assert!(oor(launch(p, "fill_u32", fill(0, 1))));

    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    assert!(oor(launch(p, "copy", copy(a, b, 401))));
    assert!(oor(launch(p, "copy", copy(a, b + 1, 400))));
    assert!(oor(launch(p, "copy", copy(a + 1, b, 400))));
    assert!(oor(launch(p, "copy", copy(a, b, u64::MAX))));

    let vadd = |c, a, b, n| abi::VaddParams { c, a, b, n };
    assert!(oor(launch(p, "vadd_f32", vadd(c, a, b, 101))));
    assert!(oor(launch(p, "vadd_f32", vadd(c, a, b + 4, 100))));
    assert!(oor(launch(p, "vadd_f32", vadd(c + 4, a, b, 100))));
    assert!(oor(launch(p, "vadd_f32", vadd(c, a, b, huge))));
    assert!(oor(launch(p, "vadd_f32", vadd(c, 0, b, 1))));

    let saxpy = |y, x, n| abi::SaxpyParams {
        y,
        x,
        n,
        a: 2.0,
        reserved: 0,
    };
    assert!(oor(launch(p, "saxpy_f32", saxpy(a, b + 4, 100))));
    assert!(oor(launch(p, "saxpy_f32", saxpy(a + 400, b, 1))));
    assert!(oor(launch(p, "saxpy_f32", saxpy(a, b, huge))));

    let sgemm = |c, a, b, m, n, k| sgemm_params((c, a, b), (m, n, k), 1.0, 1.0);
    assert!(oor(launch(p, "sgemm_f32", sgemm(c, a, b, 10, 10, 11))));
    assert!(oor(launch(p, "sgemm_f32", sgemm(c, a, b, 11, 10, 10))));
    assert!(oor(launch(p, "sgemm_f32", sgemm(c + 4, a, b, 10, 10, 10))));
    assert!(oor(launch(
        p,
        "sgemm_f32",
        sgemm(c, a, b, u32::MAX, u32::MAX, 1)
    )));
    assert!(oor(launch(p, "sgemm_f32", sgemm(c, a, b, 1, 1, u32::MAX))));

    let reduce = |out, input, n| abi::ReduceSumParams { out, input, n };
    assert!(oor(launch(p, "reduce_sum_f32", reduce(a + 400, b, 1))));
    assert!(oor(launch(p, "reduce_sum_f32", reduce(a + 397, b, 1))));
    assert!(oor(launch(p, "reduce_sum_f32", reduce(a, b, 101))));
    assert!(oor(launch(p, "reduce_sum_f32", reduce(a, b, huge))));

    assert_eq!(snapshot(p), before);
    // In range, the same kernels run.
    launch(p, "sgemm_f32", sgemm(c, a, b, 10, 10, 10)).unwrap();
    launch(p, "vadd_f32", vadd(c, a, b, 100)).unwrap();
}

// ---- modules a guest loads ----------------------------------------------

/// Kernels of the PTX corpus (`crates/vgpu-ptx/tests/corpus`, compiled by
/// nvcc), as the guest would load them.
pub mod corpus {
    /// `vector_add(a, b, c, n)`: `c[i] = a[i] + b[i]`.
    pub const VECTOR_ADD: &str = include_str!("../../vgpu-ptx/tests/corpus/vector_add.ptx");
    /// `histogram(data, bins, n)`: 256 bins of bytes, shared then global atomics.
    pub const HISTOGRAM: &str = include_str!("../../vgpu-ptx/tests/corpus/histogram.ptx");
    /// `matmul(A, B, C, n)`: 16x16 tiles in shared memory.
    pub const MATMUL: &str = include_str!("../../vgpu-ptx/tests/corpus/matmul.ptx");
    /// `bitonic(keys)`: sorts blocks of 512 ints in shared memory.
    pub const BITONIC: &str = include_str!("../../vgpu-ptx/tests/corpus/bitonic.ptx");
    /// `divergent(in, steps, g, f, q, n)`: divergent loops and called functions.
    pub const DIVERGENT: &str = include_str!("../../vgpu-ptx/tests/corpus/divergent.ptx");
    /// `reduce_atomic(in, sum, maxv, n)`: a shared-memory tree, then atomics.
    pub const REDUCE_ATOMIC: &str = include_str!("../../vgpu-ptx/tests/corpus/reduce_atomic.ptx");
    /// `reduce_shfl(in, out, n)`: warp shuffles, then a float atomic; and
    /// `warp_vote(in, ballot, all, any)`: votes and shuffles.
    pub const REDUCE_SHFL: &str = include_str!("../../vgpu-ptx/tests/corpus/reduce_shfl.ptx");
    /// `scan(in, out, n)`: a block scan in dynamic shared memory.
    pub const SCAN: &str = include_str!("../../vgpu-ptx/tests/corpus/scan.ptx");
    /// `stencil(in, out, n)`: doubles, fma, a `__constant__` table.
    pub const STENCIL: &str = include_str!("../../vgpu-ptx/tests/corpus/stencil.ptx");
    /// `vector_add` as a fatbinary with an LZ4-compressed PTX entry.
    pub const VECTOR_ADD_FATBIN_LZ4: &[u8] =
        include_bytes!("../../vgpu-ptx/tests/corpus/vector_add.lz4.fatbin");
}

/// A store through the pointer it is given: an illegal address when that
/// points at nothing.
pub const POKE_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry poke(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 7;
    st.global.u32 [%rd2], %r1;
    ret;
}
";

/// `say(int *out)`: each thread prints `thread T of N: 1.500000 ok` (a
/// `printf` as nvcc compiles it: the arguments in a local buffer, the
/// format and the string in global memory) and stores what `printf`
/// returned (4, the arguments it took) at `out[T]`.
pub const PRINTF_PTX: &str = include_str!("../../vgpu-ptx/tests/corpus/printf.ptx");

/// `grid_rotate(a, b, c)`: cooperative groups' `grid.sync()` twice;
/// `c[i]` is what thread `i + 2 * blockDim.x` (mod the grid) wrote, plus
/// 1000 (`grid_sync.cu`).
pub const GRID_SYNC_PTX: &str = include_str!("../../vgpu-ptx/tests/corpus/grid_sync.ptx");

/// `check(int v)`: `assert(v != 0)` (`check.cu`, line 12).
pub const ASSERT_PTX: &str = include_str!("../../vgpu-ptx/tests/corpus/assert.ptx");

/// `ptx` as PTX ISA 8.0: the corpus is compiled by a newer nvcc than some
/// drivers JIT (CUDA 13.0's takes ISA 9.0 at most), and these kernels use
/// nothing past 8.0.
pub fn portable(ptx: &str) -> Vec<u8> {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.lines() {
        if line.trim_start().starts_with(".version") {
            out.push_str(".version 8.0");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// A parameter block: each value at its natural alignment, as the CUDA
/// runtime packs kernel arguments.
#[derive(Default)]
pub struct Params(pub Vec<u8>);

impl Params {
    /// Appends a pointer (or any 64-bit value).
    pub fn u64(mut self, v: u64) -> Self {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a 32-bit value.
    pub fn u32(mut self, v: u32) -> Self {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// Launches `entry` of loaded module `module`.
pub fn launch_loaded(
    p: &mut dyn Partition,
    module: u64,
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    params: &Params,
) -> Result<(), OpError> {
    launch_loaded_shared(p, module, entry, [grid, block], 0, params)
}

/// [`launch_loaded`] with `shared_mem` bytes of dynamic shared memory.
pub fn launch_loaded_shared(
    p: &mut dyn Partition,
    module: u64,
    entry: &str,
    [grid, block]: [[u32; 3]; 2],
    shared_mem: u32,
    params: &Params,
) -> Result<(), OpError> {
    p.launch(&Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module,
        entry,
        grid,
        block,
        shared_mem,
        params: &params.0,
    })
}

/// Runs every behaviour of loaded modules against `make`'s partitions
/// (which must accept guest modules). The illegal-address one comes last:
/// on a GPU it ends the partition's context.
pub fn run_loaded_modules(make: Make<'_>) {
    module_vector_add(make);
    module_histogram(make);
    module_matmul(make);
    module_launch_errors_and_unload(make);
    module_function_info(make);
    module_cluster_occupancy(make);
    module_global(make);
    module_queued_launches_depend_in_order(make);
    module_printf(make);
    module_assert(make);
    module_textures_and_surfaces(make);
    module_illegal_address(make);
    module_cooperative_grid_sync(make);
}

/// Loads corpus module `ptx` and runs `entry(a, b, c, n)` over device
/// copies of `a` and `b` on `[grid, block]`; returns `c`, as many floats
/// as `a`.
fn run_float_pair(
    p: &mut dyn Partition,
    ptx: &str,
    entry: &str,
    (a, b): (&[f32], &[f32]),
    n: usize,
    [grid, block]: [[u32; 3]; 2],
) -> Vec<f32> {
    let bytes = a.len() as u64 * 4;
    let (da, db, dc) = (
        p.alloc(bytes, 0).unwrap(),
        p.alloc(bytes, 0).unwrap(),
        p.alloc(bytes, 0).unwrap(),
    );
    upload_floats(p, da, a);
    upload_floats(p, db, b);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(ptx))
        .unwrap();
    let params = Params::default().u64(da).u64(db).u64(dc).u32(n as u32);
    launch_loaded(p, m, entry, grid, block, &params).unwrap();
    download_floats(p, dc, a.len())
}

/// nvcc's vector add over 100,000 floats (a partial last block): exactly
/// the sums the CPU computes.
pub fn module_vector_add(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-vadd", 16 * MIB, 2));
    let p = &mut *boxed;
    let n = 100_000usize;
    let mut rng = Rng(0x5eed_0001);
    let a: Vec<f32> = (0..n).map(|_| (rng.next() % 20_000) as f32 / 7.0).collect();
    let b: Vec<f32> = (0..n).map(|_| (rng.next() % 20_000) as f32 / 3.0).collect();
    let grid = [n.div_ceil(256) as u32, 1, 1];
    let c = run_float_pair(
        p,
        corpus::VECTOR_ADD,
        "vector_add",
        (&a, &b),
        n,
        [grid, [256, 1, 1]],
    );
    for i in 0..n {
        assert_eq!(c[i].to_bits(), (a[i] + b[i]).to_bits(), "c[{i}]");
    }
}

/// Queued launches of a loaded kernel, each reading what the one before
/// wrote: c = a + b, then d = c + b, then c = d + d, in one run.
pub fn module_queued_launches_depend_in_order(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-queued", 16 * MIB, 2));
    let p = &mut *boxed;
    let n = 50_000usize;
    let mut rng = Rng(0x5eed_0007);
    let a: Vec<f32> = (0..n).map(|_| (rng.next() % 1000) as f32).collect();
    let b: Vec<f32> = (0..n).map(|_| (rng.next() % 1000) as f32).collect();
    let bytes = n as u64 * 4;
    let [da, db, dc, dd] = [0; 4].map(|_| p.alloc(bytes, 0).unwrap());
    upload_floats(p, da, &a);
    upload_floats(p, db, &b);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::VECTOR_ADD))
        .unwrap();
    let add = |x: u64, y: u64, out: u64| Params::default().u64(x).u64(y).u64(out).u32(n as u32);
    let params = [add(da, db, dc), add(dc, db, dd), add(dd, dd, dc)];
    let grid = [n.div_ceil(256) as u32, 1, 1];
    let steps: Vec<Queued<'_>> = params
        .iter()
        .flat_map(|p| {
            let l = Launch {
                cluster: [1, 1, 1],
                cooperative: false,
                module: m,
                entry: "vector_add",
                grid,
                block: [256, 1, 1],
                shared_mem: 0,
                params: &p.0,
            };
            [Queued::Launch(l), Queued::Timestamp]
        })
        .collect();
    let done = p.run_queued(&steps, &|| false);
    assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
    assert!(
        done.windows(2).all(|w| w[0].end_ns <= w[1].end_ns),
        "{done:?}"
    );
    let c = download_floats(p, dc, n);
    for i in 0..n {
        let d = (a[i] + b[i]) + b[i];
        assert_eq!(c[i].to_bits(), (d + d).to_bits(), "c[{i}]");
    }
}

/// nvcc's histogram (shared-memory atomics per block, then global ones)
/// over 1 MiB of bytes: exactly the CPU's counts.
pub fn module_histogram(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-hist", 16 * MIB, 2));
    let p = &mut *boxed;
    let n = 1usize << 20;
    let mut rng = Rng(0x5eed_0002);
    // Skewed, so that some bins see heavy contention.
    let data: Vec<u8> = (0..n)
        .map(|_| {
            let r = rng.next();
            if r.is_multiple_of(4) {
                7
            } else {
                (r >> 8) as u8
            }
        })
        .collect();
    let (dd, dbins) = (p.alloc(n as u64, 0).unwrap(), p.alloc(256 * 4, 0).unwrap());
    upload(p, dd, &data);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::HISTOGRAM))
        .unwrap();
    let params = Params::default().u64(dd).u64(dbins).u32(n as u32);
    launch_loaded(p, m, "histogram", [64, 1, 1], [256, 1, 1], &params).unwrap();
    let bins: Vec<u32> = download(p, dbins, 256 * 4)
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut want = [0u32; 256];
    for &b in &data {
        want[b as usize] += 1;
    }
    assert_eq!(bins, want.to_vec());
}

/// nvcc's tiled matrix multiply (n = 80: tiles that do not divide it)
/// against the CPU's, within float rounding of the summation order.
pub fn module_matmul(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-mm", 16 * MIB, 2));
    let p = &mut *boxed;
    let n = 80usize;
    let mut rng = Rng(0x5eed_0003);
    let mut rand = || ((rng.next() % 2001) as f32 - 1000.0) / 1000.0;
    let a: Vec<f32> = (0..n * n).map(|_| rand()).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rand()).collect();
    let tiles = n.div_ceil(16) as u32;
    let c = run_float_pair(
        p,
        corpus::MATMUL,
        "matmul",
        (&a, &b),
        n,
        [[tiles, tiles, 1], [16, 16, 1]],
    );
    for i in 0..n {
        for j in 0..n {
            let want: f64 = (0..n)
                .map(|k| f64::from(a[i * n + k]) * f64::from(b[k * n + j]))
                .sum();
            let got = f64::from(c[i * n + j]);
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "C[{i}][{j}] = {got}, want {want}"
            );
        }
    }
}

/// A loaded module's launches are checked like any: an unknown entry is
/// NotFound, a parameter block of the wrong size or a block that is too
/// large is Invalid; unloading makes the handle unknown, and PTX that
/// does not parse is Invalid.
pub fn module_launch_errors_and_unload(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-err", 4 * MIB, 1));
    let p = &mut *boxed;
    let d = p.alloc(4096, 0).unwrap();
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::VECTOR_ADD))
        .unwrap();
    assert_ne!(m, abi::MODULE_BUILTIN);
    let good = Params::default().u64(d).u64(d).u64(d).u32(16);
    assert!(matches!(
        launch_loaded(p, m, "no_such_kernel", [1, 1, 1], [16, 1, 1], &good),
        Err(OpError::NotFound(_))
    ));
    let short = Params::default().u64(d).u64(d);
    assert!(matches!(
        launch_loaded(p, m, "vector_add", [1, 1, 1], [16, 1, 1], &short),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch_loaded(p, m, "vector_add", [1, 1, 1], [2048, 1, 1], &good),
        Err(OpError::Invalid(_))
    ));
    launch_loaded(p, m, "vector_add", [1, 1, 1], [16, 1, 1], &good).unwrap();
    p.module_unload(m).unwrap();
    assert!(matches!(
        launch_loaded(p, m, "vector_add", [1, 1, 1], [16, 1, 1], &good),
        Err(OpError::NotFound(_))
    ));
    assert!(matches!(p.module_unload(m), Err(OpError::NotFound(_))));
    assert!(matches!(
        p.module_load(
            abi::MODULE_FORMAT_PTX,
            b".version 8.0\n.target sm_90\nthis is not ptx\n"
        ),
        Err(OpError::Invalid(_))
    ));
}

/// FUNC_INFO's view of a kernel: the parameter layout nvcc's vector add
/// declares (three pointers and an int), limits a launch can use, and
/// the built-in module's one parameter structure.
pub fn module_function_info(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-info", 4 * MIB, 1));
    let p = &mut *boxed;
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::VECTOR_ADD))
        .unwrap();
    let info = p.function_info(m, "vector_add").unwrap();
    let layout: Vec<(u32, u32)> = info.params.iter().map(|q| (q.offset, q.size)).collect();
    assert_eq!(layout, [(0, 8), (8, 8), (16, 8), (24, 4)]);
    assert_eq!(info.attrs.param_count, 4);
    assert_eq!(info.attrs.params_size, 28);
    assert!(
        (256..=1024).contains(&info.attrs.max_threads),
        "{:?}",
        info.attrs
    );
    assert!(matches!(
        p.function_info(m, "no_such_kernel"),
        Err(OpError::NotFound(_))
    ));
    assert!(matches!(
        p.function_info(m + 1000, "vector_add"),
        Err(OpError::NotFound(_))
    ));
    let fill = p.function_info(abi::MODULE_BUILTIN, "fill_u32").unwrap();
    assert_eq!(fill.params.len(), 1);
    assert_eq!(
        fill.attrs.params_size as usize,
        std::mem::size_of::<abi::FillParams>()
    );
    p.module_unload(m).unwrap();
    assert!(matches!(
        p.function_info(m, "vector_add"),
        Err(OpError::NotFound(_))
    ));
}

/// How many clusters of a launch shape fit at once: at least one block
/// of a small kernel alone, no more clusters of two than of one, none
/// of a shape the kernel refuses; and an unknown kernel is not found.
pub fn module_cluster_occupancy(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-occupancy", 4 * MIB, 1));
    let p = &mut *boxed;
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::VECTOR_ADD))
        .unwrap();
    let shape = |cluster: [u32; 3], block: [u32; 3], shared_mem: u32| Launch {
        module: m,
        entry: "vector_add",
        grid: cluster,
        block,
        shared_mem,
        cluster,
        cooperative: false,
        params: &[],
    };
    let alone = p
        .max_active_clusters(&shape([1, 1, 1], [256, 1, 1], 0))
        .unwrap();
    assert!(alone >= 1, "{alone} blocks of 256 threads fit");
    let pairs = p
        .max_active_clusters(&shape([2, 1, 1], [256, 1, 1], 0))
        .unwrap();
    assert!(pairs <= alone, "{pairs} pairs, {alone} blocks");
    let info = p.function_info(m, "vector_add").unwrap();
    let too_many = [info.attrs.max_threads + 1, 1, 1];
    assert!(matches!(
        p.max_active_clusters(&shape([1, 1, 1], too_many, 0)),
        Err(OpError::Invalid(_))
    ));
    let too_much_shared = info.attrs.max_dynamic_shared + 1;
    assert!(matches!(
        p.max_active_clusters(&shape([1, 1, 1], [256, 1, 1], too_much_shared)),
        Err(OpError::Invalid(_))
    ));
    let unknown = Launch {
        entry: "no_such_kernel",
        ..shape([1, 1, 1], [256, 1, 1], 0)
    };
    assert!(matches!(
        p.max_active_clusters(&unknown),
        Err(OpError::NotFound(_))
    ));
}

/// A module with a global array (what `__device__` variables compile to).
pub const GLOBAL_PTX: &str = include_str!("../../vgpu-ptx/tests/corpus/global.ptx");

/// What a module's kernels print waits in the partition for
/// [`Partition::console`]: every thread's line, once, in pieces as
/// asked, after a plain launch and after a queued run; an unloaded
/// module's output is gone.
pub fn module_printf(make: Make<'_>) {
    const THREADS: u32 = 40;
    let mut boxed = make(&spec("ptx-printf", 4 * MIB, 1));
    let p = &mut *boxed;
    assert!(crate::console::module_prints(PRINTF_PTX.as_bytes()));
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, PRINTF_PTX.as_bytes())
        .expect("the printing module loads");
    let out = p.alloc(u64::from(THREADS) * 4, 0).unwrap();
    let params = Params::default().u64(out);
    let say = |p: &mut dyn Partition| {
        launch_loaded(p, m, "say", [1, 1, 1], [THREADS, 1, 1], &params).expect("say runs")
    };
    let all = |p: &mut dyn Partition| p.console(m, abi::CONSOLE_BYTES as usize).unwrap();
    let mut want: Vec<String> = (0..THREADS)
        .map(|t| format!("thread {t} of {THREADS}: 1.500000 ok"))
        .collect();
    want.sort();
    let lines = |text: &[u8]| {
        let mut l: Vec<String> = String::from_utf8_lossy(text)
            .lines()
            .map(str::to_string)
            .collect();
        l.sort();
        l
    };
    say(p);
    let got = all(p);
    assert_eq!(lines(&got.text), want, "every thread's line, once");
    assert_eq!(got.dropped, 0);
    let rv = download(p, out, THREADS as usize * 4);
    assert!(
        rv.chunks_exact(4).all(|r| r == 4i32.to_le_bytes()),
        "printf returns the arguments it took"
    );
    assert!(all(p).text.is_empty(), "output comes once");
    // In pieces, as a guest with a small buffer takes it.
    say(p);
    let first = p.console(m, 10).unwrap();
    assert_eq!(first.text.len(), 10);
    let mut text = first.text;
    text.extend(all(p).text);
    assert_eq!(lines(&text), want);
    // After a queued run.
    let launch = Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module: m,
        entry: "say",
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        params: &params.0,
    };
    let done = p.run_queued(&[Queued::Launch(launch), Queued::Timestamp], &|| false);
    assert!(done.iter().all(|d| d.result.is_ok()), "{done:?}");
    assert_eq!(lines(&all(p).text), want);
    // Nothing of another module, nor of an unloaded one.
    assert!(p.console(m + 1000, 100).unwrap().text.is_empty());
    say(p);
    p.module_unload(m).unwrap();
    assert!(
        all(p).text.is_empty(),
        "an unloaded module's output is gone"
    );
}

/// A kernel whose `assert()` fails fails its launch with
/// [`OpError::KernelAssert`], and each failing thread's line, as a GPU
/// prints it, waits in the console; one whose asserts hold runs. A
/// backend whose device state goes with the assert says so, and a reset
/// brings it back.
pub fn module_assert(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-assert", 4 * MIB, 1));
    let p = &mut *boxed;
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, ASSERT_PTX.as_bytes())
        .expect("the asserting module loads");
    let check = |p: &mut dyn Partition, v: u32| {
        launch_loaded(
            p,
            m,
            "check",
            [2, 1, 1],
            [4, 1, 1],
            &Params::default().u32(v),
        )
    };
    check(p, 1).expect("an assert that holds");
    match check(p, 0) {
        Err(OpError::KernelAssert(_)) => {}
        other => panic!("a failed assert gave {other:?}"),
    }
    let text = p.console(m, abi::CONSOLE_BYTES as usize).unwrap().text;
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "no assertion message");
    for line in &lines {
        assert!(
            line.starts_with("check.cu:12: void check(int): block: [")
                && line.ends_with("] Assertion `v != 0` failed."),
            "assertion line {line:?}"
        );
    }
    if p.is_lost() {
        p.reset();
        let m = p
            .module_load(abi::MODULE_FORMAT_PTX, ASSERT_PTX.as_bytes())
            .unwrap();
        launch_loaded(
            p,
            m,
            "check",
            [1, 1, 1],
            [1, 1, 1],
            &Params::default().u32(1),
        )
        .expect("after a reset");
    } else {
        check(p, 1).expect("the next launch runs");
    }
}

/// A module global, where the backend places globals in device memory:
/// its address and size, copies to and from it (cudaMemcpyToSymbol),
/// `free` refusing it, and its range gone with the module. A backend
/// that does not place them says so.
pub fn module_global(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-global", 4 * MIB, 1));
    let p = &mut *boxed;
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, GLOBAL_PTX.as_bytes())
        .unwrap();
    let (addr, size) = match p.global_info(m, "table") {
        Err(OpError::Unsupported(_)) => return,
        r => r.unwrap(),
    };
    assert_eq!(size, 64);
    assert_eq!(p.global_info(m, "table").unwrap(), (addr, size));
    let data: Vec<u8> = (0..64).collect();
    upload(p, addr, &data);
    assert_eq!(download(p, addr, 64), data);
    assert!(matches!(p.free(addr), Err(OpError::Invalid(_))));
    assert!(matches!(
        p.global_info(m, "no_such_global"),
        Err(OpError::NotFound(_))
    ));
    p.module_unload(m).unwrap();
    assert!(matches!(
        p.upload(addr, &VecSource(data)),
        Err(OpError::OutOfRange { .. })
    ));
}

/// A kernel that stores through a pointer to nothing fails its launch
/// with a kernel fault (CUDA_ERROR_ILLEGAL_ADDRESS) and writes none of
/// the partition's memory.
pub fn module_illegal_address(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-oob", 4 * MIB, 1));
    let p = &mut *boxed;
    let d = p.alloc(4096, 0).unwrap();
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, POKE_PTX.as_bytes())
        .unwrap();
    // In range: the store lands.
    launch_loaded(
        p,
        m,
        "poke",
        [1, 1, 1],
        [1, 1, 1],
        &Params::default().u64(d),
    )
    .unwrap();
    assert_eq!(download(p, d, 4), 7u32.to_le_bytes());
    // Far past every allocation.
    let wild = d + (1 << 40);
    let r = launch_loaded(
        p,
        m,
        "poke",
        [1, 1, 1],
        [1, 1, 1],
        &Params::default().u64(wild),
    );
    assert!(matches!(r, Err(OpError::KernelFault(_))), "{r:?}");
}

/// One buffer of a corpus launch: its initial bytes, and how two
/// backends' final bytes must agree.
struct Buf {
    init: Vec<u8>,
    /// `None`: bit for bit; `Some(4 | 8)`: floats of that size, within a
    /// relative 1e-5 (their atomics add in any order).
    float: Option<usize>,
}

/// One launch of a corpus kernel.
struct Case {
    ptx: &'static str,
    entry: &'static str,
    grid: u32,
    block: u32,
    shared: u32,
    bufs: Vec<Buf>,
    /// 32-bit values after the pointers.
    scalars: Vec<u32>,
}

fn ints(rng: &mut Rng, n: usize, lo: i64, hi: i64) -> Vec<u8> {
    (0..n)
        .flat_map(|_| ((lo + (rng.next() % (hi - lo) as u64) as i64) as i32).to_le_bytes())
        .collect()
}

fn exact(init: Vec<u8>) -> Buf {
    Buf { init, float: None }
}

fn zeros(bytes: usize) -> Buf {
    exact(vec![0; bytes])
}

fn corpus_cases() -> Vec<Case> {
    let mut rng = Rng(0x5eed_00c0);
    let n = 100_000usize;
    let floats: Vec<u8> = (0..n)
        .flat_map(|_| (((rng.next() % 2001) as f32 - 1000.0) / 64.0).to_le_bytes())
        .collect();
    let doubles: Vec<u8> = (0..10_000)
        .flat_map(|_| ((rng.next() % 100_000) as f64 / 7.0).to_le_bytes())
        .collect();
    vec![
        Case {
            ptx: corpus::BITONIC,
            entry: "bitonic",
            grid: 4,
            block: 256,
            shared: 0,
            bufs: vec![exact(ints(&mut rng, 4 * 512, -1_000_000, 1_000_000))],
            scalars: vec![],
        },
        Case {
            ptx: corpus::DIVERGENT,
            entry: "divergent",
            grid: 8,
            block: 256,
            shared: 0,
            bufs: vec![
                exact(ints(&mut rng, 2048, -1000, 100_000)),
                zeros(2048 * 4),
                zeros(2048 * 4),
                Buf {
                    init: vec![0; 2048 * 4],
                    float: Some(4),
                },
                zeros(2048 * 8),
            ],
            scalars: vec![2048],
        },
        Case {
            ptx: corpus::REDUCE_ATOMIC,
            entry: "reduce_atomic",
            grid: n.div_ceil(256) as u32,
            block: 256,
            shared: 256 * 4,
            bufs: vec![
                exact(ints(&mut rng, n, -50_000, 50_000)),
                zeros(8),
                exact(i32::MIN.to_le_bytes().to_vec()),
            ],
            scalars: vec![n as u32],
        },
        Case {
            ptx: corpus::REDUCE_SHFL,
            entry: "reduce_shfl",
            grid: 64,
            block: 256,
            shared: 0,
            bufs: vec![
                exact(floats),
                Buf {
                    init: vec![0; 4],
                    float: Some(4),
                },
            ],
            scalars: vec![n as u32],
        },
        Case {
            ptx: corpus::REDUCE_SHFL,
            entry: "warp_vote",
            grid: 4,
            block: 256,
            shared: 0,
            bufs: vec![
                exact(ints(&mut rng, 1024, -20, 100)),
                zeros(2048 * 4),
                zeros(32 * 4),
                zeros(32 * 4),
            ],
            scalars: vec![],
        },
        Case {
            ptx: corpus::SCAN,
            entry: "scan",
            grid: 16,
            block: 256,
            shared: 2 * 256 * 4,
            bufs: vec![exact(ints(&mut rng, 4096, 0, 1000)), zeros(4096 * 4)],
            scalars: vec![4096],
        },
        Case {
            ptx: corpus::STENCIL,
            entry: "stencil",
            grid: 10_000u32.div_ceil(128),
            block: 128,
            shared: 0,
            bufs: vec![exact(doubles), zeros(10_000 * 8)],
            scalars: vec![10_000],
        },
    ]
}

/// Every buffer of `case` after the launch on a fresh partition of `make`.
fn run_case(make: Make<'_>, case: &Case) -> Vec<Vec<u8>> {
    let mut boxed = make(&spec(case.entry, 16 * MIB, 2));
    let p = &mut *boxed;
    let addrs: Vec<u64> = case
        .bufs
        .iter()
        .map(|b| {
            let a = p.alloc(b.init.len() as u64, 0).unwrap();
            upload(p, a, &b.init);
            a
        })
        .collect();
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(case.ptx))
        .unwrap_or_else(|e| panic!("{}: {e}", case.entry));
    let mut params = Params::default();
    for &a in &addrs {
        params = params.u64(a);
    }
    for &v in &case.scalars {
        params = params.u32(v);
    }
    let shape = [[case.grid, 1, 1], [case.block, 1, 1]];
    launch_loaded_shared(p, m, case.entry, shape, case.shared, &params)
        .unwrap_or_else(|e| panic!("{}: {e}", case.entry));
    addrs
        .iter()
        .zip(&case.bufs)
        .map(|(&a, b)| download(p, a, b.init.len()))
        .collect()
}

/// Equal within a relative 1e-5; two NaNs agree whatever their payload
/// (a GPU writes its canonical one).
fn float_close(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * a.abs().max(b.abs())
}

/// nvcc's corpus kernels (sorting, divergent loops and calls, shared and
/// global atomics, shuffles and votes, a scan in dynamic shared memory, a
/// double-precision stencil with a constant table) run on partitions of
/// `reference` and of `other` with the same inputs, and must leave the
/// same bytes: bit for bit, but for floats that atomics sum in any order.
/// On a GPU machine `reference` is the software backend's PTX executor and
/// `other` the GPU.
pub fn module_corpus_matches(reference: Make<'_>, other: Make<'_>) {
    for case in corpus_cases() {
        let want = run_case(reference, &case);
        let got = run_case(other, &case);
        for (i, ((w, g), b)) in want.iter().zip(&got).zip(&case.bufs).enumerate() {
            match b.float {
                None => assert!(w == g, "{}: buffer {i} differs", case.entry),
                Some(size) => {
                    for (k, (x, y)) in w.chunks(size).zip(g.chunks(size)).enumerate() {
                        let (x, y) = if size == 4 {
                            let f =
                                |c: &[u8]| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                            (f(x), f(y))
                        } else {
                            let f = |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap());
                            (f(x), f(y))
                        };
                        assert!(
                            float_close(x, y),
                            "{}: buffer {i}[{k}]: {x} vs {y}",
                            case.entry
                        );
                    }
                }
            }
        }
    }
}

/// A cooperative launch ([`Launch::cooperative`]) of a grid that
/// synchronises, on a partition that offers them, sized within what
/// [`Partition::max_active_clusters`] says is resident at once: every
/// block sees what the others wrote before each `grid.sync()`. Twice, as
/// a grid's sync state must not outlive its launch. A partition without
/// cooperative launches is not asked.
pub fn module_cooperative_grid_sync(make: Make<'_>) {
    let mut boxed = make(&spec("ptx-cooperative", 16 * MIB, 3));
    let p = &mut *boxed;
    if !p.cooperative() {
        return;
    }
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(GRID_SYNC_PTX))
        .unwrap();
    let threads = 64u32;
    let mut launch = Launch {
        module: m,
        entry: "grid_rotate",
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        shared_mem: 0,
        cluster: [1, 1, 1],
        cooperative: true,
        params: &[],
    };
    let resident = p.max_active_clusters(&launch).unwrap();
    let blocks = resident.min(3);
    assert!(blocks >= 1, "no block of grid_rotate fits");
    let n = (blocks * threads) as usize;
    let [a, b, c] = [(); 3].map(|_| p.alloc(n as u64 * 4, 0).unwrap());
    let params = Params::default().u64(a).u64(b).u64(c);
    launch.grid = [blocks, 1, 1];
    launch.params = &params.0;
    let used = p.memory_used();
    for _ in 0..2 {
        p.fill(c, n as u64 * 4, 0).unwrap();
        p.launch(&launch).unwrap();
        let got = download(p, c, n * 4);
        for i in 0..n {
            let v = i32::from_le_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
            let j = (i + 2 * threads as usize) % n;
            assert_eq!(v, (j * 3 + 1) as i32 + 1000, "thread {i} of {n}");
        }
    }
    // Whatever the grid's sync needed went with the launch.
    assert_eq!(p.memory_used(), used);
}

/// A virtual memory request that must succeed.
fn vmm_ok(p: &mut dyn Partition, op: crate::vmm::VmmOp) -> u64 {
    p.vmm(&op).unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

/// Whether `r` failed as an invalid request.
fn invalid<T: std::fmt::Debug>(r: Result<T, OpError>) -> bool {
    matches!(r, Err(OpError::Invalid(_)))
}

/// Virtual memory management (ABI 1.6): two physical allocations mapped
/// side by side in one reservation read and write as one range (copies
/// and a fill across the boundary, a kernel whose operand straddles it),
/// a third mapping of the first shows the same bytes both ways, only
/// physical allocations charge the quota, and misaligned, overlapping
/// and unmapped requests are refused without changing anything.
pub fn vmm_map_side_by_side_and_alias(make: Make<'_>) {
    use crate::vmm::VmmOp::*;
    const G: u64 = abi::VMM_GRANULARITY;
    let mut boxed = make(&spec("vmm", 8 * G, 2));
    let p = &mut *boxed;
    assert!(p.has_vmm());
    let used0 = p.memory_used();
    // A reservation far larger than the quota costs nothing.
    let big = vmm_ok(
        p,
        Reserve {
            size: 64 << 30,
            align: 0,
            addr: 0,
        },
    );
    assert_eq!(p.memory_used(), used0);
    vmm_ok(
        p,
        Free {
            addr: big,
            size: 64 << 30,
        },
    );
    let base = vmm_ok(
        p,
        Reserve {
            size: 8 * G,
            align: 0,
            addr: 0,
        },
    );
    assert_eq!(base % G, 0);
    let h1 = vmm_ok(p, Create { size: G });
    let h2 = vmm_ok(p, Create { size: G });
    assert_ne!(h1, h2);
    assert_eq!(p.memory_used(), used0 + 2 * G);
    assert!(matches!(
        p.vmm(&Create { size: 8 * G }),
        Err(OpError::NoMemory { .. })
    ));
    for (addr, h) in [(base, h1), (base + G, h2)] {
        vmm_ok(
            p,
            Map {
                addr,
                size: G,
                handle: h,
                offset: 0,
            },
        );
    }
    // Mapped, not yet accessible.
    assert!(p.upload(base, &VecSource(vec![1; 64])).is_err());
    vmm_ok(
        p,
        Access {
            addr: base,
            size: 2 * G,
            access: abi::MEM_ACCESS_READ_WRITE,
        },
    );
    let pattern = Rng(0x5eed_00a1).bytes(2 * G as usize);
    upload(p, base, &pattern);
    assert!(download(p, base, 2 * G as usize) == pattern);
    assert_eq!(
        download(p, base + G - 8, 16),
        pattern[G as usize - 8..G as usize + 8]
    );
    // A device copy and a fill across the boundary.
    let other = p.alloc(2 * G, 0).unwrap();
    p.copy(other, base, 2 * G).unwrap();
    assert!(download(p, other, 2 * G as usize) == pattern);
    p.fill(base + G - 4096, 8192, 0x0102_0304).unwrap();
    let filled = download(p, base + G - 4096, 8192);
    assert!(filled.chunks(4).all(|w| w == 0x0102_0304u32.to_le_bytes()));
    upload(p, base, &pattern);
    // A kernel reading an operand that straddles the two mappings.
    let n = 4096usize;
    let a_addr = base + G - 2048 * 4;
    let a = to_floats(&pattern[(G - 2048 * 4) as usize..][..n * 4]);
    let b = Rng(0x5eed_00a2).floats(n);
    let (db, dc) = (
        p.alloc(n as u64 * 4, 0).unwrap(),
        p.alloc(n as u64 * 4, 0).unwrap(),
    );
    upload_floats(p, db, &b);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &portable(corpus::VECTOR_ADD))
        .unwrap();
    let params = Params::default().u64(a_addr).u64(db).u64(dc).u32(n as u32);
    launch_loaded(p, m, "vector_add", [16, 1, 1], [256, 1, 1], &params).unwrap();
    let c = download_floats(p, dc, n);
    for i in 0..n {
        assert_eq!(c[i].to_bits(), (a[i] + b[i]).to_bits(), "c[{i}]");
    }
    // The first physical allocation again, elsewhere: the same bytes,
    // and a write through it shows through the first mapping.
    vmm_ok(
        p,
        Map {
            addr: base + 4 * G,
            size: G,
            handle: h1,
            offset: 0,
        },
    );
    vmm_ok(
        p,
        Access {
            addr: base + 4 * G,
            size: G,
            access: abi::MEM_ACCESS_READ_WRITE,
        },
    );
    assert!(download(p, base + 4 * G, G as usize) == pattern[..G as usize]);
    upload(p, base + 4 * G + 100, b"through the alias");
    assert_eq!(download(p, base + 100, 17), b"through the alias");
    p.copy(base + 4 * G, base + 4096, 4096).unwrap();
    assert!(download(p, base, 4096) == pattern[4096..8192]);
    // Refusals, which change nothing.
    let map = |addr, handle, offset| Map {
        addr,
        size: G,
        handle,
        offset,
    };
    assert!(invalid(p.vmm(&map(base + G, h1, 0))), "double map");
    assert!(
        invalid(p.vmm(&map(base + 2 * G + 4096, h1, 0))),
        "misaligned"
    );
    assert!(invalid(p.vmm(&Map {
        addr: base + 2 * G,
        size: G + 4096,
        handle: h1,
        offset: 0
    })));
    assert!(invalid(p.vmm(&map(base + 2 * G, h1, G))), "past the end");
    assert!(invalid(p.vmm(&map(base + 8 * G, h1, 0))), "outside");
    assert!(matches!(
        p.vmm(&map(base + 2 * G, 0x7777, 0)),
        Err(OpError::NotFound(_))
    ));
    assert!(invalid(p.vmm(&Unmap {
        addr: base,
        size: G / 2
    })));
    assert!(invalid(p.vmm(&Unmap {
        addr: base + 2 * G,
        size: G
    })));
    assert!(invalid(p.vmm(&Free {
        addr: base,
        size: 8 * G
    })));
    assert!(invalid(p.vmm(&Access {
        addr: base + 2 * G,
        size: G,
        access: abi::MEM_ACCESS_READ_WRITE
    })));
    assert!(p.free(base).is_err(), "mapped memory is not freed");
    assert!(download(p, base + G, 64) == pattern[G as usize..][..64]);
    // Unmapped, released: the quota comes back once nothing maps it.
    let before = p.memory_used();
    vmm_ok(
        p,
        Unmap {
            addr: base,
            size: 2 * G,
        },
    );
    assert!(p.upload(base, &VecSource(vec![1; 64])).is_err());
    vmm_ok(p, Release { handle: h2 });
    vmm_ok(p, Release { handle: h1 });
    assert!(matches!(
        p.vmm(&Release { handle: h1 }),
        Err(OpError::NotFound(_))
    ));
    assert_eq!(p.memory_used(), before - G, "h1 is still mapped");
    assert_eq!(
        download(p, base + 4 * G, 4096),
        pattern[4096..8192].to_vec()
    );
    vmm_ok(
        p,
        Unmap {
            addr: base + 4 * G,
            size: G,
        },
    );
    assert_eq!(p.memory_used(), before - 2 * G);
    vmm_ok(
        p,
        Free {
            addr: base,
            size: 8 * G,
        },
    );
}

/// What PyTorch's expandable segments do: one reservation larger than
/// the device, physical pages mapped into it one after another up to the
/// quota, each given access and used, then unmapped and released when
/// the cache is emptied; and a reset drops everything.
pub fn vmm_grow_and_shrink_a_segment(make: Make<'_>) {
    use crate::vmm::VmmOp::*;
    const G: u64 = abi::VMM_GRANULARITY;
    let mut boxed = make(&spec("vmm-grow", 8 * G, 2));
    let p = &mut *boxed;
    let used0 = p.memory_used();
    let size = 9 * 8 * G;
    let base = vmm_ok(
        p,
        Reserve {
            size,
            align: 0,
            addr: 0,
        },
    );
    let mut handles = Vec::new();
    loop {
        let h = match p.vmm(&Create { size: G }) {
            Ok(h) => h,
            Err(OpError::NoMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        };
        let addr = base + G * handles.len() as u64;
        vmm_ok(
            p,
            Map {
                addr,
                size: G,
                handle: h,
                offset: 0,
            },
        );
        vmm_ok(
            p,
            Access {
                addr,
                size: G,
                access: abi::MEM_ACCESS_READ_WRITE,
            },
        );
        p.fill(addr, G, handles.len() as u32).unwrap();
        handles.push(h);
    }
    let n = handles.len() as u64;
    assert!(n >= 4, "{n} pages fit a quota of 8");
    assert_eq!(p.memory_used(), used0 + n * G);
    // One copy over every page.
    let words = download(p, base, (n * G) as usize);
    for (i, page) in words.chunks(G as usize).enumerate() {
        assert!(
            page.chunks(4).all(|w| w == (i as u32).to_le_bytes()),
            "page {i}"
        );
    }
    for (i, h) in handles.iter().enumerate().rev() {
        vmm_ok(
            p,
            Unmap {
                addr: base + G * i as u64,
                size: G,
            },
        );
        vmm_ok(p, Release { handle: *h });
    }
    assert_eq!(p.memory_used(), used0);
    vmm_ok(p, Free { addr: base, size });
    // A reset drops reservations, mappings and physical memory.
    let base = vmm_ok(
        p,
        Reserve {
            size: 4 * G,
            align: 0,
            addr: 0,
        },
    );
    let h = vmm_ok(p, Create { size: 2 * G });
    vmm_ok(
        p,
        Map {
            addr: base,
            size: 2 * G,
            handle: h,
            offset: 0,
        },
    );
    p.reset();
    assert_eq!(p.memory_used(), 0);
    assert!(matches!(
        p.vmm(&Release { handle: h }),
        Err(OpError::NotFound(_))
    ));
    assert!(invalid(p.vmm(&Free {
        addr: base,
        size: 4 * G
    })));
}

/// An ARRAY_CREATE of `channels` f32 channels (or `format`).
pub fn array_cmd(format: u32, channels: u32, extent: [u64; 3], flags: u32) -> abi::ArrayCmd {
    abi::ArrayCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_ARRAY_CREATE,
            flags,
        },
        format,
        channels,
        width: extent[0],
        height: extent[1],
        depth: extent[2],
    }
}

/// An ARRAY_COPY of a box between `src` and `dst` (an array where its
/// pitch is `None`).
pub fn array_copy_cmd(
    (src, src_pitch, src_pos): (u64, Option<(u32, u32)>, [u32; 3]),
    (dst, dst_pitch, dst_pos): (u64, Option<(u32, u32)>, [u32; 3]),
    extent: [u32; 3],
) -> crate::arrays::Resource {
    let flags = (u32::from(src_pitch.is_none()) * abi::ARRAY_COPY_SRC_ARRAY)
        | (u32::from(dst_pitch.is_none()) * abi::ARRAY_COPY_DST_ARRAY);
    let (sp, sh) = src_pitch.unwrap_or_default();
    let (dp, dh) = dst_pitch.unwrap_or_default();
    crate::arrays::Resource::ArrayCopy(abi::ArrayCopyCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_ARRAY_COPY,
            flags,
        },
        src,
        dst,
        src_pitch: sp,
        src_height: sh,
        dst_pitch: dp,
        dst_height: dh,
        src_pos,
        dst_pos,
        extent,
        reserved: 0,
    })
}

/// A texture (or surface) object over array `array`.
pub fn object_cmd(kind: u32, array: u64) -> abi::ObjectCmd {
    abi::ObjectCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_OBJECT_CREATE,
            flags: kind,
        },
        resource: array,
        res_type: abi::RESOURCE_ARRAY,
        ..Default::default()
    }
}

fn destroy(p: &mut dyn Partition, kind: u32, handle: u64) -> Result<u64, OpError> {
    p.resource(&crate::arrays::Resource::Destroy(abi::ObjectDestroyCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_OBJECT_DESTROY,
            flags: kind,
        },
        handle,
    }))
}

/// Arrays of each shape: boxes copied in from device memory, between
/// arrays and back out land where they should; boxes outside an array,
/// unknown handles and malformed shapes are refused; a destroyed array
/// is gone.
pub fn arrays_copy_boxes(make: Make<'_>) {
    use crate::arrays::Resource;
    let mut boxed = make(&spec("arrays", 16 * MIB, 1));
    let p = &mut *boxed;
    assert!(p.arrays());
    let mut rng = Rng(0x5eed);
    // A 3D array of 2-channel floats, 7 x 5 x 3, and a layered 2D one.
    let (w, h, d) = (7u32, 5u32, 3u32);
    let elem = 8u32;
    let shapes = [(0, [w, h, d]), (abi::ARRAY_FLAG_LAYERED, [w, h, d])];
    for (flags, [w, h, d]) in shapes {
        let a = p
            .resource(&Resource::ArrayCreate(array_cmd(
                abi::FORMAT_F32,
                2,
                [w, h, d].map(u64::from),
                flags,
            )))
            .unwrap();
        let b = p
            .resource(&Resource::ArrayCreate(array_cmd(
                abi::FORMAT_F32,
                2,
                [w, h, d].map(u64::from),
                flags,
            )))
            .unwrap();
        // Device memory with a pitch of 96 bytes and 6 rows per slice.
        let (pitch, rows) = (96u32, 6u32);
        let total = (pitch * rows * d) as usize;
        let data = rng.bytes(total);
        let lin = p.alloc(total as u64, 0).unwrap();
        upload(p, lin, &data);
        // The whole array in, then a box of it to the other array at an
        // offset, then all of that array out.
        let all = [w * elem, h, d];
        p.resource(&array_copy_cmd(
            (lin, Some((pitch, rows)), [0; 3]),
            (a, None, [0; 3]),
            all,
        ))
        .unwrap();
        // (A new array's contents are undefined, as on a GPU.)
        p.resource(&array_copy_cmd(
            (lin, Some((pitch, rows)), [0; 3]),
            (b, None, [0; 3]),
            all,
        ))
        .unwrap();
        let sub = [3 * elem, 2, 2];
        p.resource(&array_copy_cmd(
            (a, None, [elem, 1, 0]),
            (b, None, [2 * elem, 3, 1]),
            sub,
        ))
        .unwrap();
        let out = p.alloc(total as u64, 0).unwrap();
        p.fill(out, total as u64, 0xdead_beef).unwrap();
        p.resource(&array_copy_cmd(
            (b, None, [0; 3]),
            (out, Some((pitch, rows)), [0; 3]),
            all,
        ))
        .unwrap();
        let got = download(p, out, total);
        for z in 0..d {
            for y in 0..h {
                for x in 0..w * elem {
                    let at = (z * pitch * rows + y * pitch + x) as usize;
                    let inside = (2 * elem..5 * elem).contains(&x)
                        && (3..5).contains(&y)
                        && (1..3).contains(&z);
                    let (sx, sy, sz) = if inside {
                        (x - elem, y - 2, z - 1)
                    } else {
                        (x, y, z)
                    };
                    let want = data[(sz * pitch * rows + sy * pitch + sx) as usize];
                    assert_eq!(got[at], want, "flags {flags} at ({x}, {y}, {z})");
                }
            }
        }
        // The pitch's padding was not written.
        assert_eq!(
            &got[(w * elem) as usize..pitch as usize],
            &[0xef, 0xbe, 0xad, 0xde].repeat(10)[..(pitch - w * elem) as usize]
        );
        // Outside the array, partial elements, unknown handles.
        let bad = [
            array_copy_cmd(
                (a, None, [elem, 0, 0]),
                (out, Some((pitch, rows)), [0; 3]),
                all,
            ),
            array_copy_cmd(
                (a, None, [0, 0, 1]),
                (out, Some((pitch, rows)), [0; 3]),
                all,
            ),
            array_copy_cmd(
                (a, None, [0; 3]),
                (out, Some((pitch, rows)), [0; 3]),
                [3, 1, 1],
            ),
            array_copy_cmd((a, None, [0; 3]), (out, Some((8, rows)), [0; 3]), all),
            array_copy_cmd(
                (out, Some((pitch, rows)), [0; 3]),
                (out, Some((pitch, rows)), [0; 3]),
                all,
            ),
        ];
        for c in bad {
            assert!(
                matches!(
                    p.resource(&c),
                    Err(OpError::Invalid(_) | OpError::OutOfRange { .. })
                ),
                "{c:?}"
            );
        }
        // Device memory too small for the box.
        let small = p.alloc(64, 0).unwrap();
        assert!(p
            .resource(&array_copy_cmd(
                (a, None, [0; 3]),
                (small, Some((pitch, rows)), [0; 3]),
                all
            ))
            .is_err());
        assert_eq!(destroy(p, abi::OBJECT_ARRAY, b), Ok(0));
        assert!(matches!(
            destroy(p, abi::OBJECT_ARRAY, b),
            Err(OpError::NotFound(_))
        ));
        assert!(p
            .resource(&array_copy_cmd((a, None, [0; 3]), (b, None, [0; 3]), all))
            .is_err());
        assert!(matches!(
            destroy(p, abi::OBJECT_TEXTURE, a),
            Err(OpError::NotFound(_))
        ));
        assert_eq!(destroy(p, abi::OBJECT_ARRAY, a), Ok(0));
        for x in [lin, out, small] {
            p.free(x).unwrap();
        }
    }
    // Shapes CUDA refuses.
    for (ch, ext, flags) in [
        (3, [4, 4, 0], 0),
        (1, [0, 4, 0], 0),
        (1, [4, 0, 4], 0),
        (1, [abi::MAX_ARRAY_3D + 1, 4, 4], 0),
        (1, [4, 4, 0], abi::ARRAY_FLAG_LAYERED),
    ] {
        let r = p.resource(&Resource::ArrayCreate(array_cmd(
            abi::FORMAT_F32,
            ch,
            ext,
            flags,
        )));
        assert!(
            matches!(r, Err(OpError::Invalid(_))),
            "{ch} {ext:?} {flags}: {r:?}"
        );
    }
    // An array larger than the quota (4 GiB) is NO_MEMORY.
    let r = p.resource(&Resource::ArrayCreate(array_cmd(
        abi::FORMAT_F32,
        4,
        [16384, 16384, 0],
        0,
    )));
    assert!(matches!(r, Err(OpError::NoMemory { .. })), "{r:?}");
    // A reset frees arrays.
    let a = p
        .resource(&Resource::ArrayCreate(array_cmd(
            abi::FORMAT_U8,
            1,
            [64, 0, 0],
            0,
        )))
        .unwrap();
    assert!(p.memory_used() >= 64);
    p.reset();
    assert_eq!(p.memory_used(), 0);
    assert!(matches!(
        destroy(p, abi::OBJECT_ARRAY, a),
        Err(OpError::NotFound(_))
    ));
}

/// Hand-written kernels of texture and surface objects: `sample2d`
/// samples a texture at `(x * step - 1, y * step - 1)` for each thread
/// `(x, y)` and stores the four channels; `surf_write` stores
/// `x + 1000 y` at element `(x, y)` of a surface of 32-bit elements.
pub const TEXTURE_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry sample2d(.param .u64 tex, .param .u64 out, .param .f32 step)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [tex];
    ld.param.u64 %rd2, [out];
    ld.param.f32 %f1, [step];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %tid.y;
    cvt.rn.f32.u32 %f2, %r2;
    cvt.rn.f32.u32 %f3, %r3;
    mul.f32 %f2, %f2, %f1;
    mul.f32 %f3, %f3, %f1;
    sub.f32 %f2, %f2, 0f3F800000;
    sub.f32 %f3, %f3, 0f3F800000;
    tex.2d.v4.f32.f32 {%f4, %f5, %f6, %f7}, [%rd1, {%f2, %f3}];
    mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    mul.wide.u32 %rd3, %r5, 16;
    add.s64 %rd4, %rd2, %rd3;
    st.global.v4.f32 [%rd4], {%f4, %f5, %f6, %f7};
    ret;
}
.visible .entry surf_write(.param .u64 surf)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [surf];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mad.lo.u32 %r3, %r2, 1000, %r1;
    shl.b32 %r4, %r1, 2;
    sust.b.2d.b32.trap [%rd1, {%r4, %r2}], {%r3};
    ret;
}
"#;

/// CUDA's texture fetch (the programming guide's "Texture Fetching"):
/// channel `c` of a 2D texture of 2-channel floats `texels` (`w` x `h`)
/// at unnormalised `(x, y)`, clamped, nearest or linear (weights in 8
/// fraction bits; `tolerance` covers the hardware rounding them).
fn fetch_reference(
    texels: &[f32],
    w: i64,
    h: i64,
    (x, y): (f32, f32),
    c: usize,
    linear: bool,
) -> f32 {
    let at =
        |i: i64, j: i64| texels[((j.clamp(0, h - 1) * w + i.clamp(0, w - 1)) * 2) as usize + c];
    if !linear {
        return at(x.floor() as i64, y.floor() as i64);
    }
    let (xb, yb) = (x - 0.5, y - 0.5);
    let (i, j) = (xb.floor() as i64, yb.floor() as i64);
    let a = ((xb - xb.floor()) * 256.0).round() / 256.0;
    let b = ((yb - yb.floor()) * 256.0).round() / 256.0;
    (1.0 - a) * (1.0 - b) * at(i, j)
        + a * (1.0 - b) * at(i + 1, j)
        + (1.0 - a) * b * at(i, j + 1)
        + a * b * at(i + 1, j + 1)
}

/// Texture objects over an array sample as CUDA documents (point and
/// linear filtering, clamped; the fourth channel of a 2-channel texture
/// reads 1), a surface object's stores land in its array, and objects
/// are destroyed by kind.
pub fn module_textures_and_surfaces(make: Make<'_>) {
    use crate::arrays::Resource;
    let mut boxed = make(&spec("textures", 16 * MIB, 1));
    let p = &mut *boxed;
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, TEXTURE_PTX.as_bytes())
        .unwrap();
    let (w, h) = (6u32, 5u32);
    let texels: Vec<f32> = (0..w * h * 2)
        .map(|i| ((i * 37) % 23) as f32 * 0.25 - 2.0)
        .collect();
    let a = p
        .resource(&Resource::ArrayCreate(array_cmd(
            abi::FORMAT_F32,
            2,
            [w.into(), h.into(), 0],
            0,
        )))
        .unwrap();
    let lin = p.alloc(u64::from(w * h * 8), 0).unwrap();
    upload_floats(p, lin, &texels);
    p.resource(&array_copy_cmd(
        (lin, Some((w * 8, h)), [0; 3]),
        (a, None, [0; 3]),
        [w * 8, h, 1],
    ))
    .unwrap();
    let (bx, by) = (14u32, 12u32);
    let out = p.alloc(u64::from(bx * by * 16), 0).unwrap();
    let step = 0.61f32;
    for linear in [false, true] {
        let mut cmd = object_cmd(abi::OBJECT_TEXTURE, a);
        cmd.address = abi::ADDRESS_CLAMP * 0x01_01_01;
        cmd.filter = u32::from(linear);
        let t = p.resource(&Resource::ObjectCreate(cmd)).unwrap();
        assert_ne!(t, 0);
        let params = Params::default().u64(t).u64(out).u32(step.to_bits());
        launch_loaded(p, m, "sample2d", [1, 1, 1], [bx, by, 1], &params).unwrap();
        let got = download_floats(p, out, (bx * by * 4) as usize);
        for y in 0..by {
            for x in 0..bx {
                let (fx, fy) = (x as f32 * step - 1.0, y as f32 * step - 1.0);
                let k = ((y * bx + x) * 4) as usize;
                for c in 0..2 {
                    let want = fetch_reference(&texels, w.into(), h.into(), (fx, fy), c, linear);
                    // The hardware keeps the weights in 8 fraction bits
                    // (and may truncate where the reference rounds: at
                    // most 1/256 of the texels' spread per dimension).
                    assert!(
                        (got[k + c] - want).abs() <= 0.05,
                        "linear {linear} at ({fx}, {fy}) channel {c}: {} != {want}",
                        got[k + c]
                    );
                }
                assert_eq!(got[k + 3], 1.0);
            }
        }
        assert!(matches!(
            destroy(p, abi::OBJECT_SURFACE, t),
            Err(OpError::NotFound(_))
        ));
        assert_eq!(destroy(p, abi::OBJECT_TEXTURE, t), Ok(0));
    }
    // A surface over an array made without the surface flag is made too,
    // as NVIDIA's driver makes it (an H100, driver 580).
    let plain = p
        .resource(&Resource::ObjectCreate(object_cmd(abi::OBJECT_SURFACE, a)))
        .unwrap();
    assert_eq!(destroy(p, abi::OBJECT_SURFACE, plain), Ok(0));
    let s_arr = p
        .resource(&Resource::ArrayCreate(array_cmd(
            abi::FORMAT_U32,
            1,
            [8, 4, 0],
            abi::ARRAY_FLAG_SURFACE,
        )))
        .unwrap();
    let s = p
        .resource(&Resource::ObjectCreate(object_cmd(
            abi::OBJECT_SURFACE,
            s_arr,
        )))
        .unwrap();
    launch_loaded(
        p,
        m,
        "surf_write",
        [1, 1, 1],
        [8, 4, 1],
        &Params::default().u64(s),
    )
    .unwrap();
    p.resource(&array_copy_cmd(
        (s_arr, None, [0; 3]),
        (out, Some((32, 4)), [0; 3]),
        [32, 4, 1],
    ))
    .unwrap();
    let got = download(p, out, 128);
    for y in 0..4u32 {
        for x in 0..8u32 {
            let k = ((y * 8 + x) * 4) as usize;
            assert_eq!(
                u32::from_le_bytes(got[k..k + 4].try_into().unwrap()),
                x + 1000 * y
            );
        }
    }
    // Objects of an unknown array, and unknown kinds.
    let r = p.resource(&Resource::ObjectCreate(object_cmd(
        abi::OBJECT_TEXTURE,
        0x1234,
    )));
    assert!(matches!(r, Err(OpError::NotFound(_))), "{r:?}");
    let r = p.resource(&Resource::ObjectCreate(object_cmd(7, s_arr)));
    assert!(matches!(r, Err(OpError::Invalid(_))), "{r:?}");
    assert_eq!(destroy(p, abi::OBJECT_SURFACE, s), Ok(0));
    assert_eq!(destroy(p, abi::OBJECT_ARRAY, s_arr), Ok(0));
    assert_eq!(destroy(p, abi::OBJECT_ARRAY, a), Ok(0));
}
