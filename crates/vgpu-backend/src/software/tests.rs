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

/// The conformance suite's factory: a partition of exactly the spec's
/// size, of a backend of its own with room for it to grow.
fn make(spec: &PartitionSpec) -> Box<dyn Partition> {
    let backend = SoftwareBackend::new(4 * spec.memory, spec.compute_units);
    let mut p = backend.create(spec).unwrap();
    p.grain = 1;
    Box::new(p)
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
    a_live_resize_moves_the_quota_and_keeps_the_data,
    suspend_and_resume_keep_the_data_at_its_addresses,
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
    queued_steps_run_in_order,
    queued_copies_move_their_own_bytes,
    queued_fills_and_device_copies,
    queued_runs_in_flight_finish_in_order,
    module_vector_add,
    module_histogram,
    module_matmul,
    module_launch_errors_and_unload,
    module_queued_launches_depend_in_order,
    module_printf,
    module_assert,
    module_global,
    module_illegal_address,
    module_cooperative_grid_sync,
    vmm_map_side_by_side_and_alias,
    vmm_grow_and_shrink_a_segment,
    arrays_copy_boxes,
    module_textures_and_surfaces,
);

fn load_fatbin(p: &mut SoftwarePartition, image: &[u8]) -> Result<u64, OpError> {
    p.module_load(abi::MODULE_FORMAT_FATBIN, image)
}

#[test]
fn test_fatbinaries_load_their_ptx_and_refuse_cubins_only() {
    let mut p = partition(4 * MIB, 1);
    let m = load_fatbin(&mut p, conformance::corpus::VECTOR_ADD_FATBIN_LZ4).unwrap();
    let d = p.alloc(64, 0).unwrap();
    conformance::upload(&mut p, d, &[0x3f80_0000u32.to_le_bytes(); 16].concat());
    let params = conformance::Params::default().u64(d).u64(d).u64(d).u32(16);
    conformance::launch_loaded(&mut p, m, "vector_add", [1, 1, 1], [16, 1, 1], &params).unwrap();
    assert_eq!(
        conformance::download_floats(&mut p, d, 16),
        vec![2.0f32; 16],
        "1 + 1 through the fatbinary's PTX"
    );
    let cubin_only = include_bytes!("../../../vgpu-ptx/tests/corpus/vector_add.cubin-only.fatbin");
    assert!(matches!(
        load_fatbin(&mut p, cubin_only),
        Err(OpError::Unsupported(_))
    ));
    assert!(matches!(
        load_fatbin(&mut p, b"\x50\xed\x55\xba junk"),
        Err(OpError::Invalid(_))
    ));
    // PTX text is not a PTX image with a NUL inside.
    assert!(matches!(
        p.module_load(abi::MODULE_FORMAT_PTX, b".version 8.0\0.target sm_90"),
        Err(OpError::Invalid(_))
    ));
}

#[test]
fn test_a_kernel_that_never_ends_is_stopped_by_the_watchdog() {
    let backend = SoftwareBackend::new(MIB, 1).with_kernel_timeout(Duration::from_millis(200));
    let mut p = backend.create(&spec("spin", MIB, 1)).unwrap();
    let spin = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin()
{
$top:
    bra.uni $top;
}
";
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, spin.as_bytes())
        .unwrap();
    let begun = std::time::Instant::now();
    let r = conformance::launch_loaded(
        &mut p,
        m,
        "spin",
        [4, 1, 1],
        [64, 1, 1],
        &conformance::Params::default(),
    );
    assert!(
        matches!(&r, Err(OpError::Device(why)) if why.contains("watchdog")),
        "{r:?}"
    );
    assert!(begun.elapsed() >= Duration::from_millis(200));
    // The partition still works.
    let d = p.alloc(64, 0).unwrap();
    p.fill(d, 64, 1).unwrap();
}

#[test]
fn test_reset_unloads_modules_and_handles_are_not_reused() {
    let mut p = partition(MIB, 1);
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    let first = p.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
    p.reset();
    assert!(matches!(p.module_unload(first), Err(OpError::NotFound(_))));
    let second = p.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
    assert_ne!(
        first, second,
        "a handle from before the reset finds nothing"
    );
    for _ in 1..rules::MAX_MODULES {
        p.module_load(abi::MODULE_FORMAT_PTX, &ptx).unwrap();
    }
    assert!(matches!(
        p.module_load(abi::MODULE_FORMAT_PTX, &ptx),
        Err(OpError::Invalid(_))
    ));
}

#[test]
fn test_freed_addresses_are_not_handed_out_again_at_once() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(1000, 0).unwrap();
    p.free(a).unwrap();
    let c = p.alloc(1000, 0).unwrap();
    assert_ne!(c, a);
}

#[test]
fn test_a_suspended_partition_gives_its_memory_back_until_it_resumes() {
    let backend = SoftwareBackend::new(100 * MIB, 4);
    let mut a = backend.create_partition(&spec("a", 60 * MIB, 2)).unwrap();
    let addr = a.alloc(MIB, 0).unwrap();
    a.fill(addr, MIB, 0x1234_5678).unwrap();
    assert_eq!(a.suspend().unwrap(), MIB);
    assert_eq!(backend.unclaimed().memory, 100 * MIB);
    assert_eq!(
        backend.unclaimed().compute_units,
        2,
        "its threads stay taken"
    );
    // Another takes the memory: the first cannot come back until it goes.
    let b = backend.create_partition(&spec("b", 50 * MIB, 2)).unwrap();
    assert_eq!(
        a.resume(),
        Err(OpError::NoMemory {
            requested: 60 * MIB,
            available: 50 * MIB
        })
    );
    // A resize while suspended takes nothing now; resume takes it all.
    a.set_memory(40 * MIB).unwrap();
    assert_eq!(backend.unclaimed().memory, 50 * MIB);
    a.resume().unwrap();
    assert_eq!(backend.unclaimed().memory, 10 * MIB);
    assert!(download(&mut *a, addr, MIB as usize)
        .chunks_exact(4)
        .all(|w| w == 0x1234_5678u32.to_le_bytes()));
    drop(b);
    a.suspend().unwrap();
    drop(a);
    assert_eq!(
        backend.unclaimed(),
        Capacity {
            memory: 100 * MIB,
            compute_units: 4
        },
        "a suspended partition gives back what it still held"
    );
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
    // A module without kernels loads; nothing in it can be launched.
    let empty = p
        .module_load(abi::MODULE_FORMAT_PTX, b".version 7.0\n.target sm_80\n")
        .unwrap();
    let params = conformance::Params::default();
    assert!(matches!(
        conformance::launch_loaded(&mut p, empty, "k", [1, 1, 1], [1, 1, 1], &params),
        Err(OpError::NotFound(_))
    ));
    // Bad PTX is refused with the line and what is wrong.
    match p.module_load(
        abi::MODULE_FORMAT_PTX,
        b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n  add.u32 %r1;\n}\n",
    ) {
        Err(OpError::Invalid(why)) => assert!(why.contains("line 6"), "names line 6: {why}"),
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
    p.module_unload(empty).unwrap();
    assert!(matches!(p.module_unload(empty), Err(OpError::NotFound(_))));
}

#[test]
fn test_cluster_occupancy_is_one_block_per_thread_and_no_clusters() {
    let make = |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(s.memory, 3)) };
    conformance::module_cluster_occupancy(&make);
    let mut p = partition(4 * MIB, 3);
    let m = p
        .module_load(
            abi::MODULE_FORMAT_PTX,
            &conformance::portable(conformance::corpus::VECTOR_ADD),
        )
        .unwrap();
    let shape = |cluster| Launch {
        module: m,
        entry: "vector_add",
        grid: cluster,
        block: [128, 1, 1],
        shared_mem: 0,
        cluster,
        cooperative: false,
        params: &[],
    };
    assert_eq!(p.max_active_clusters(&shape([1, 1, 1])).unwrap(), 3);
    // The PTX executor runs blocks alone: no cluster of two fits.
    assert_eq!(p.max_active_clusters(&shape([2, 1, 1])).unwrap(), 0);
}

#[test]
fn test_corpus_gives_the_same_bytes_on_one_thread_and_on_several() {
    let one = |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(s.memory, 1)) };
    let four = |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(s.memory, 4)) };
    conformance::module_corpus_matches(&one, &four);
}

/// A run abandoned midway refuses its remaining steps without running
/// them: a reset does not wait for a run's worth of work.
#[test]
fn abandoned_run_refuses_the_steps_left() {
    let mut p = partition(MIB, 1);
    let a = p.alloc(4096, 0).unwrap();
    let fill = |pattern| {
        Queued::Fill(crate::DeviceFill {
            addr: a,
            size: 4096,
            pattern,
        })
    };
    let asked = std::cell::Cell::new(0);
    let stop = || {
        asked.set(asked.get() + 1);
        asked.get() > 1
    };
    let done = p.run_queued(
        &[fill(0x0101_0101), fill(0x0202_0202), fill(0x0303_0303)],
        &stop,
    );
    let ok: Vec<bool> = done.iter().map(|d| d.result.is_ok()).collect();
    assert_eq!(ok, [true, false, false]);
    assert!(download(&mut p, a, 4096).iter().all(|&b| b == 1));
    // Not abandoned, the same run runs whole.
    let done = p.run_queued(&[fill(0x0404_0404)], &|| false);
    assert!(done[0].result.is_ok());
    assert!(download(&mut p, a, 4096).iter().all(|&b| b == 4));
}

#[test]
fn test_a_kernel_the_executor_cannot_run_is_refused_alone_with_its_line() {
    let mut p = partition(MIB, 1);
    let ptx = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry poke(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
.visible .entry sample(.param .u64 p)
{
    .reg .f32 %f<5>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    tld4.r.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f1, %f1}];
    ret;
}
";
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, ptx.as_bytes())
        .unwrap();
    let d = p.alloc(64, 0).unwrap();
    let params = conformance::Params::default().u64(d);
    conformance::launch_loaded(&mut p, m, "poke", [1, 1, 1], [1, 1, 1], &params).unwrap();
    assert_eq!(download(&mut p, d, 4), 7u32.to_le_bytes());
    // Its FUNC_INFO is answered; its launch fails naming the instruction.
    p.function_info(m, "sample").unwrap();
    let r = conformance::launch_loaded(&mut p, m, "sample", [1, 1, 1], [1, 1, 1], &params);
    assert!(
        matches!(&r, Err(OpError::Unsupported(why)) if why.contains("line 19") && why.contains("tld4.r.2d.v4.f32.f32")),
        "{r:?}"
    );
}

#[test]
fn test_a_refused_module_is_described_with_its_source_line() {
    let text = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n  add.s32 %r1, \"\x1b\";\n}\n";
    let e = vgpu_ptx::Module::parse(text).unwrap_err();
    let why = ptx::described(&e, text);
    // The guest's text is quoted escaped, with the line and the reason.
    assert!(
        why.starts_with("line 6 \"add.s32 %r1, \\\"\\u{1b}\\\";\": "),
        "{why}"
    );
    let long = format!("{}\n", "x".repeat(1000));
    let e = vgpu_ptx::ParseError {
        line: 1,
        msg: "m".into(),
        unsupported: false,
    };
    assert!(ptx::described(&e, &long).len() < 200);
    assert!(matches!(
        p_load(text),
        Err(OpError::Invalid(why)) if why.contains("line 6")
    ));
}

fn p_load(text: &str) -> Result<u64, OpError> {
    partition(MIB, 1).module_load(abi::MODULE_FORMAT_PTX, text.as_bytes())
}

/// A kernel that stores 7 at its one parameter.
const POKE_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry poke(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

/// With a shared fate (a spatial GPU's partitions, one process), one
/// partition's kernel fault loses every partition; without it, none
/// but the launch.
#[test]
fn test_a_shared_fate_loses_every_partition_to_one_fault() {
    for shared in [false, true] {
        let mut backend = SoftwareBackend::new(4 * MIB, 2);
        if shared {
            backend = backend.with_shared_fate();
        }
        let mut a = backend.create(&spec("a", MIB, 1)).unwrap();
        let b = backend.create(&spec("b", MIB, 1)).unwrap();
        let m = a
            .module_load(abi::MODULE_FORMAT_PTX, POKE_PTX.as_bytes())
            .unwrap();
        let d = a.alloc(4096, 0).unwrap();
        let params = conformance::Params::default().u64(d);
        conformance::launch_loaded(&mut a, m, "poke", [1, 1, 1], [1, 1, 1], &params).unwrap();
        assert!(!backend.lost() && !b.is_lost());
        let params = conformance::Params::default().u64(d + 4096);
        let r = conformance::launch_loaded(&mut a, m, "poke", [1, 1, 1], [1, 1, 1], &params);
        assert!(matches!(&r, Err(OpError::KernelFault(_))), "{r:?}");
        assert_eq!(backend.lost(), shared);
        assert_eq!(a.is_lost(), shared);
        assert_eq!(b.is_lost(), shared, "the other partition");
    }
}

#[test]
fn test_a_kernel_fault_fails_its_launch_alone() {
    let mut p = partition(MIB, 2);
    let d = p.alloc(4096, 0).unwrap();
    conformance::upload(&mut p, d, &[0x5a; 4096]);
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, POKE_PTX.as_bytes())
        .unwrap();
    let poke = |p: &mut SoftwarePartition, at: u64| {
        let params = conformance::Params::default().u64(at);
        conformance::launch_loaded(p, m, "poke", [1, 1, 1], [1, 1, 1], &params)
    };
    // Past the allocation, and misaligned inside it: KERNEL_FAULT, which
    // the guest's CUDA reports as CUDA_ERROR_ILLEGAL_ADDRESS.
    for at in [d + 4096, d + 2] {
        let r = poke(&mut p, at);
        assert!(matches!(&r, Err(OpError::KernelFault(_))), "{r:?}");
        assert_eq!(r.unwrap_err().status(), abi::STATUS_KERNEL_FAULT);
    }
    // Nothing was written and nothing is lost: the partition goes on.
    assert!(!p.is_lost());
    assert_eq!(download(&mut p, d, 4096), vec![0x5a; 4096]);
    poke(&mut p, d).unwrap();
    assert_eq!(download(&mut p, d, 4), 7u32.to_le_bytes());
}

#[test]
fn test_module_variables_live_in_device_memory() {
    let mut p = partition(MIB, 2);
    let ptx = "
.version 8.0
.target sm_80
.address_size 64
.visible .global .align 4 .u32 counter = 5;
.visible .const .align 4 .u32 step = 2;
.visible .entry bump(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.const.u32 %r1, [step];
    atom.global.add.u32 %r2, [counter], %r1;
    st.global.u32 [%rd1], %r2;
    ret;
}
";
    let used = p.memory_used();
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, ptx.as_bytes())
        .unwrap();
    // The variables are charged as device memory.
    assert!(p.memory_used() > used);
    let (counter, size) = p.global_info(m, "counter").unwrap();
    assert_eq!(size, 4);
    let (step, _) = p.global_info(m, "step").unwrap();
    // Initialised from the module, as cudaMemcpyFromSymbol reads them.
    assert_eq!(download(&mut p, counter, 4), 5u32.to_le_bytes());
    let out = p.alloc(4, 0).unwrap();
    let bump = |p: &mut SoftwarePartition| {
        let params = conformance::Params::default().u64(out);
        conformance::launch_loaded(p, m, "bump", [1, 1, 1], [3, 1, 1], &params).unwrap();
    };
    bump(&mut p);
    // Three threads added 2 each; the value persists into the next launch.
    assert_eq!(download(&mut p, counter, 4), 11u32.to_le_bytes());
    // cudaMemcpyToSymbol: the kernel sees what the host wrote.
    conformance::upload(&mut p, counter, &100u32.to_le_bytes());
    conformance::upload(&mut p, step, &10u32.to_le_bytes());
    bump(&mut p);
    assert_eq!(download(&mut p, counter, 4), 130u32.to_le_bytes());
    assert!(matches!(p.free(counter), Err(OpError::Invalid(_))));
    assert!(matches!(
        p.global_info(m, "bump"),
        Err(OpError::NotFound(_))
    ));
    // A second load has variables of its own.
    let m2 = p
        .module_load(abi::MODULE_FORMAT_PTX, ptx.as_bytes())
        .unwrap();
    let (counter2, _) = p.global_info(m2, "counter").unwrap();
    assert_ne!(counter2, counter);
    assert_eq!(download(&mut p, counter2, 4), 5u32.to_le_bytes());
    p.module_unload(m).unwrap();
    p.module_unload(m2).unwrap();
    assert_eq!(p.memory_used(), used + 4);
}

#[test]
fn test_the_ptx_version_is_the_target_architecture() {
    for (target, want) in [
        ("sm_80", 80),
        ("sm_90a", 90),
        ("sm_100f, debug", 100),
        ("compute_75", 75),
        ("texmode_unified", 0),
        ("", 0),
    ] {
        assert_eq!(ptx::target_version(target), want, "{target}");
    }
    let mut p = partition(MIB, 1);
    let ptx = ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n";
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, ptx.as_bytes())
        .unwrap();
    // Not the ISA's 9.0: CUB compiled for compute_80 checks for 80.
    assert_eq!(p.function_info(m, "k").unwrap().attrs.ptx_version, 80);
}

#[test]
fn test_register_counts_let_every_block_size_be_resident() {
    // 300 virtual registers, as library kernels declare: reported as what
    // a block of the kernel's most threads could have.
    let regs = |bounds: &str| {
        let ptx = format!(
            ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k() {bounds}\n{{\n.reg .b32 %r<300>;\nret;\n}}\n.visible .entry small()\n{{\n.reg .b32 %r<9>;\nret;\n}}\n"
        );
        let mut p = partition(MIB, 1);
        let m = p
            .module_load(abi::MODULE_FORMAT_PTX, ptx.as_bytes())
            .unwrap();
        let big = p.function_info(m, "k").unwrap().attrs;
        let small = p.function_info(m, "small").unwrap().attrs;
        assert_eq!(small.num_regs, 9);
        (big.num_regs, big.max_threads)
    };
    assert_eq!(regs(""), (64, 1024));
    assert_eq!(regs(".maxntid 256, 1, 1"), (255, 256));
    assert_eq!(regs(".maxntid 512, 1, 1"), (128, 512));
}

#[test]
fn test_a_cooperative_grid_larger_than_the_threads_is_refused() {
    let (blocks, threads) = (3u32, 64u32);
    let n = (blocks * threads) as usize;
    let mut p = partition(MIB, blocks);
    assert!(p.cooperative());
    let m = p
        .module_load(
            abi::MODULE_FORMAT_PTX,
            conformance::GRID_SYNC_PTX.as_bytes(),
        )
        .unwrap();
    let [a, b, c] = [(); 3].map(|_| p.alloc(n as u64 * 4 * 2, 0).unwrap());
    let params = conformance::Params::default().u64(a).u64(b).u64(c);
    let used = p.memory_used();
    let launch = |grid: u32, cooperative: bool| Launch {
        module: m,
        entry: "grid_rotate",
        grid: [grid, 1, 1],
        block: [threads, 1, 1],
        shared_mem: 0,
        cluster: [1, 1, 1],
        cooperative,
        params: &params.0,
    };
    assert_eq!(p.max_active_clusters(&launch(1, true)).unwrap(), blocks);
    p.launch(&launch(blocks, true)).unwrap();
    // One block more than can be resident: refused, not a deadlock, and
    // the grid's workspace is freed.
    let r = p.launch(&launch(blocks + 1, true));
    assert!(matches!(r, Err(OpError::Invalid(_))), "{r:?}");
    assert_eq!(p.memory_used(), used);
    // Without the flag the grid has no workspace: grid.sync() traps, as
    // cooperative groups do outside a cooperative launch.
    let r = p.launch(&launch(blocks, false));
    assert!(r.is_err(), "{r:?}");
    assert!(!p.is_lost());
    // The built-in kernels are not launched cooperatively.
    let builtin = Launch {
        cooperative: true,
        ..conformance::builtin_launch("fill_u32", &[0; 16])
    };
    let r = p.launch(&builtin);
    assert!(matches!(r, Err(OpError::Invalid(_))), "{r:?}");
}

#[test]
fn test_a_mapping_with_read_access_is_read_but_not_written() {
    use crate::vmm::VmmOp::*;
    const G: u64 = abi::VMM_GRANULARITY;
    let mut p = partition(8 * G, 2);
    let base = p
        .vmm(&Reserve {
            size: 2 * G,
            align: 0,
            addr: 0,
        })
        .unwrap();
    let h = p.vmm(&Create { size: G }).unwrap();
    let access = |p: &mut SoftwarePartition, addr, access| {
        p.vmm(&Access {
            addr,
            size: G,
            access,
        })
        .unwrap()
    };
    for addr in [base, base + G] {
        p.vmm(&Map {
            addr,
            size: G,
            handle: h,
            offset: 0,
        })
        .unwrap();
    }
    access(&mut p, base, abi::MEM_ACCESS_READ_WRITE);
    access(&mut p, base + G, abi::MEM_ACCESS_READ);
    conformance::upload(&mut p, base, &[7; 64]);
    assert_eq!(download(&mut p, base + G, 64), vec![7; 64]);
    let other = p.alloc(64, 0).unwrap();
    p.copy(other, base + G, 64).unwrap();
    assert!(matches!(
        p.copy(base + G, other, 64),
        Err(OpError::OutOfRange { .. })
    ));
    assert!(p.fill(base + G, 64, 1).is_err());
    // A kernel writing it faults; one writing the other mapping does not.
    let m = p_load_into(&mut p);
    let params = |dst: u64| {
        conformance::Params::default()
            .u64(dst)
            .u64(other)
            .u64(dst)
            .u32(16)
    };
    let launch = |p: &mut SoftwarePartition, dst| {
        conformance::launch_loaded(p, m, "vector_add", [1, 1, 1], [16, 1, 1], &params(dst))
    };
    assert!(matches!(
        launch(&mut p, base + G),
        Err(OpError::KernelFault(_))
    ));
    launch(&mut p, base).unwrap();
    // Taken away again: nothing reaches it.
    access(&mut p, base, abi::MEM_ACCESS_NONE);
    assert!(p.download(base, &conformance::VecSink::new(4)).is_err());
    assert_eq!(p.memory_used(), G + 64);
}

fn p_load_into(p: &mut SoftwarePartition) -> u64 {
    p.module_load(
        abi::MODULE_FORMAT_PTX,
        &conformance::portable(conformance::corpus::VECTOR_ADD),
    )
    .unwrap()
}
