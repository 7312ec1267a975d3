//! Tests of the software backend: the behaviour every backend shares, as
//! the conformance suite checks it, and what is the software backend's
//! own (its address-space layout, host memory and pool).

use super::*;
use crate::conformance::{self, download, spec, MIB};
use crate::rules::{
    ADDRESS_BASE, ADDRESS_END, DEFAULT_ALIGN, GUARD_GAP, MAX_ALIGN, MAX_ALLOCATIONS,
};

/// A partition that splits even tiny kernels over its threads.
fn partition(memory: u64, compute_units: u32) -> SoftwarePartition {
    let backend = SoftwareBackend::new(memory, compute_units);
    let mut p = backend
        .create(&spec("test", memory, compute_units))
        .unwrap();
    p.grain = 1;
    p
}

/// The conformance suite's factory: a partition of its own backend, of
/// exactly the spec's size.
fn make(spec: &PartitionSpec) -> Box<dyn Partition> {
    Box::new(partition(spec.memory, spec.compute_units))
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                conformance::$name(&make);
            }
        )*
    };
}

conformance!(
    alloc_alignment_and_limits,
    quota_exhaustion_returns_no_memory_and_changes_nothing,
    free_and_double_free,
    upload_download_round_trip,
    copy_within_and_between_allocations,
    fill,
    partitions_cannot_see_each_other,
    reset_frees_everything,
    module_errors,
    launch_validation,
    kernel_fill_u32,
    kernel_copy,
    kernel_vadd,
    kernel_vadd_aliasing,
    kernel_saxpy,
    kernel_sgemm,
    kernel_sgemm_beta_zero_ignores_c_and_aliasing_is_safe,
    kernel_reduce_sum,
    kernels_reject_out_of_range_pointers_before_writing,
);

#[test]
fn test_freed_addresses_are_not_handed_out_again_at_once() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(1000, 0).unwrap();
    p.free(a).unwrap();
    let c = p.alloc(1000, 0).unwrap();
    assert_ne!(c, a);
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
