//! Tests that need an NVIDIA GPU. Each starts with `gpu()`, which prints
//! "skipped: no CUDA driver" and returns early when libcuda or libnvrtc
//! cannot be loaded, so on a machine without CUDA they all pass by
//! skipping. With `VGPU_REQUIRE_GPU=1` a missing driver or device fails
//! the test instead.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;
use vgpu_abi as abi;
use vgpu_backend::conformance::{
    self, download, download_floats, launch, sgemm_reference, spec, upload, upload_floats, Rng,
    VecSink, VecSource, MIB,
};
use vgpu_backend::{
    Backend, BackendError, DeviceFill, HostMapping, HostSink, HostSlice, HostSource, Launch,
    OpError, Partition, PartitionSpec, Queued, SliceFn, Started,
};
use vgpu_backend_cuda::{cuda_available, CudaBackend, CudaPartition, Mode};

fn required() -> bool {
    std::env::var_os("VGPU_REQUIRE_GPU").is_some_and(|v| v == "1")
}

/// Whether CUDA is here; prints why not otherwise.
fn gpu() -> bool {
    match cuda_available() {
        Ok(()) => true,
        Err(why) => {
            assert!(!required(), "VGPU_REQUIRE_GPU=1 but {why}");
            vgpu_testkit::skip(&format!("no CUDA driver ({why})"));
            false
        }
    }
}

/// GPU 0 in `mode`, or `None` (printed) when a driver is there but no
/// usable device.
fn backend(mode: Mode) -> Option<CudaBackend> {
    match CudaBackend::new(0, mode) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(!required(), "VGPU_REQUIRE_GPU=1 but {e}");
            vgpu_testkit::skip(&format!("no usable CUDA device ({e})"));
            None
        }
    }
}

/// A partition of `memory` bytes: the whole GPU's SM share (isolated) or
/// one group of SMs (spatial).
fn partition(b: &CudaBackend, name: &str, memory: u64) -> CudaPartition {
    let cu = match b.mode() {
        Mode::Isolated => 1,
        Mode::Spatial => 2 * b.sm_granule(),
    };
    b.create_cuda_partition(&spec(name, memory, cu)).unwrap()
}

fn launch_module(
    p: &mut dyn Partition,
    module: u64,
    entry: &str,
    grid: u32,
    block: u32,
    params: &[u8],
) -> Result<(), OpError> {
    p.launch(&Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module,
        entry,
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        shared_mem: 0,
        params,
    })
}

/// PTX text of CUDA C `src`.
fn ptx(src: &str) -> Vec<u8> {
    cudarc::nvrtc::compile_ptx(src)
        .expect("test kernel compiles")
        .to_src()
        .into_bytes()
}

const TEST_KERNELS: &str = r#"
extern "C" __global__ void scale_u32(unsigned int *p, unsigned long long n, unsigned int mul) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= mul;
}
extern "C" __global__ void poke(unsigned int *p, unsigned int v) { *p = v; }
extern "C" __global__ void wait_flag(volatile unsigned int *flag, unsigned int *out, long long limit) {
    long long t0 = clock64();
    while (*flag == 0 && clock64() - t0 < limit) {}
    *out = *flag != 0 ? 1 : 2;
}
extern "C" __global__ void smids(unsigned int *out, long long spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}
"#;

fn poke_params(addr: u64, v: u32) -> Vec<u8> {
    let mut p = addr.to_le_bytes().to_vec();
    p.extend_from_slice(&v.to_le_bytes());
    p
}

#[test]
fn isolated_capacity_and_placement() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let cap = b.capacity();
    println!(
        "{}: {} bytes, {} SMs",
        b.device_name(),
        cap.memory,
        cap.compute_units
    );
    assert_eq!(b.name(), "cuda");
    assert_eq!(cap.compute_units, b.device_sms());
    assert!(cap.memory > 0);
    assert!(matches!(
        b.create_partition(&spec("big", cap.memory + 1, 1)),
        Err(BackendError::DoesNotFit(_))
    ));
    assert!(matches!(
        b.create_partition(&spec("wide", MIB, cap.compute_units + 1)),
        Err(BackendError::DoesNotFit(_))
    ));
    let p = b
        .create_partition(&spec("half", MIB, cap.compute_units / 2))
        .unwrap();
    assert_eq!(
        b.unclaimed().compute_units,
        cap.compute_units - cap.compute_units / 2
    );
    drop(p);
    assert_eq!(b.unclaimed(), cap);
}

#[test]
fn spatial_capacity_and_placement() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Spatial) else {
        return;
    };
    let cap = b.capacity();
    let g = b.sm_granule();
    println!(
        "{}: {} SMs, {} partitionable in groups of {g}",
        b.device_name(),
        b.device_sms(),
        cap.compute_units
    );
    assert!(g >= 8);
    assert_eq!(cap.compute_units % g, 0);
    assert!(cap.compute_units <= b.device_sms());
    for bad in [0, g + g / 2, cap.compute_units + g] {
        assert!(
            matches!(
                b.create_partition(&spec("bad", MIB, bad)),
                Err(BackendError::DoesNotFit(_))
            ),
            "{bad} SMs"
        );
    }
    let all = b
        .create_cuda_partition(&spec("all", MIB, cap.compute_units))
        .unwrap();
    assert_eq!(all.sm_count(), cap.compute_units);
    assert!(matches!(
        b.create_partition(&spec("more", MIB, g)),
        Err(BackendError::DoesNotFit(_))
    ));
    drop(all);
    let a = b.create_partition(&spec("a", MIB, g)).unwrap();
    let c = b
        .create_partition(&spec("c", MIB, cap.compute_units - g))
        .unwrap();
    assert_eq!(b.unclaimed().compute_units, 0);
    drop((a, c));
    assert_eq!(b.unclaimed(), cap);
}

#[test]
fn upload_download_roundtrip_across_chunks() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "io", 64 * MIB);
    let size = 20 * MIB + 100;
    let addr = p.alloc(size, 0).unwrap();
    let mut rng = Rng(0x5eed);
    for len in [1usize, 4097, 8 << 20, (8 << 20) + 3, (20 << 20) + 7] {
        for off in [0u64, 13] {
            if off + len as u64 > size {
                continue;
            }
            let data = rng.bytes(len);
            upload(&mut p, addr + off, &data);
            assert!(p.last_device_time().is_some());
            assert_eq!(
                download(&mut p, addr + off, len),
                data,
                "len {len} off {off}"
            );
            assert!(p.last_device_time().is_some());
        }
    }
    // Empty transfers are fine and do nothing.
    upload(&mut p, addr + size, &[]);
    assert_eq!(download(&mut p, addr + size, 0), Vec::<u8>::new());
    // A host-side fault part way is reported as such.
    struct Faulty;
    impl HostSource for Faulty {
        fn len(&self) -> u64 {
            12 << 20
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
            if offset > 0 {
                return Err(OpError::Fault(offset));
            }
            buf.fill(1);
            Ok(())
        }
    }
    assert_eq!(p.upload(addr, &Faulty), Err(OpError::Fault(8 << 20)));
    // The partition is still fine.
    upload(&mut p, addr, &[9; 16]);
    assert_eq!(download(&mut p, addr, 16), vec![9; 16]);
}

#[test]
fn alloc_quota_alignment_and_free() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "mem", 4 * MIB);
    let a = p.alloc(3 * MIB, 0).unwrap();
    assert_eq!(a % 256, 0);
    assert_eq!(p.memory_used(), 3 * MIB);
    assert_eq!(
        p.alloc(2 * MIB, 0),
        Err(OpError::NoMemory {
            requested: 2 * MIB,
            available: MIB
        })
    );
    assert!(matches!(p.alloc(0, 0), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 3), Err(OpError::Invalid(_))));
    assert!(matches!(p.alloc(16, 1 << 31), Err(OpError::Invalid(_))));
    p.free(a).unwrap();
    assert!(matches!(p.free(a), Err(OpError::NotFound(_))));
    assert_eq!(p.memory_used(), 0);
    // Large alignments are honoured, and their padding is charged.
    let x = p.alloc(1000, 1 << 20).unwrap();
    assert_eq!(x % (1 << 20), 0);
    assert_eq!(p.memory_used(), 1000 + (1 << 20) - 256);
    upload(&mut p, x, &[7; 1000]);
    assert_eq!(download(&mut p, x, 1000), vec![7; 1000]);
    p.free(x).unwrap();
    assert_eq!(p.memory_used(), 0);
    // Many small allocations, then reset frees them all.
    let addrs: Vec<u64> = (0..100).map(|_| p.alloc(4096, 0).unwrap()).collect();
    assert_eq!(addrs.iter().collect::<BTreeSet<_>>().len(), 100);
    p.reset();
    assert_eq!(p.memory_used(), 0);
    assert!(matches!(
        p.upload(addrs[0], &VecSource(vec![1])),
        Err(OpError::OutOfRange { .. })
    ));
    let y = p.alloc(4 * MIB, 0).unwrap();
    upload(&mut p, y + 4 * MIB - 4, &[1, 2, 3, 4]);
}

/// The behaviour every backend shares (see `vgpu_backend::conformance`).
fn conformance_in(mode: Mode) {
    if !gpu() {
        return;
    }
    let Some(b) = backend(mode) else {
        return;
    };
    let make =
        |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(&b, &s.name, s.memory)) };
    conformance::run_all(&make);
}

#[test]
fn conformance_isolated() {
    conformance_in(Mode::Isolated);
}

/// Guest modules (nvcc's corpus) on the GPU, checked against the same CPU
/// references the software backend's PTX executor meets. In process with
/// guest PTX allowed for the test; the daemon allows guest PTX only with
/// process isolation, so the illegal-address case (which ends the
/// process's context) is left to partition hosts.
fn conformance_loaded_in(mode: Mode) {
    if !gpu() {
        return;
    }
    let Some(b) = backend(mode) else {
        return;
    };
    b.set_guest_ptx(true);
    let make =
        |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(&b, &s.name, s.memory)) };
    conformance::module_vector_add(&make);
    conformance::module_histogram(&make);
    conformance::module_matmul(&make);
    conformance::module_launch_errors_and_unload(&make);
    conformance::module_function_info(&make);
    conformance::module_cluster_occupancy(&make);
    conformance::module_global(&make);
    conformance::module_queued_launches_depend_in_order(&make);
    // Virtual memory management: the driver's own calls, a kernel on
    // mapped memory.
    conformance::vmm_map_side_by_side_and_alias(&make);
    conformance::vmm_grow_and_shrink_a_segment(&make);
    // Arrays, texture and surface objects are the driver's.
    conformance::arrays_copy_boxes(&make);
    conformance::module_textures_and_surfaces(&make);
    // Every GPU from Pascal on runs cooperative launches.
    let spec = PartitionSpec {
        name: "cooperative".into(),
        memory: 16 << 20,
        compute_units: 1,
    };
    assert!(make(&spec).cooperative());
    conformance::module_cooperative_grid_sync(&make);
}

/// nvcc's corpus leaves the same bytes on the GPU as on the software
/// backend's PTX executor.
#[test]
fn corpus_matches_the_software_executor() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    b.set_guest_ptx(true);
    let software = vgpu_backend::software::SoftwareBackend::new(1 << 30, 4);
    let cpu = |s: &PartitionSpec| -> Box<dyn Partition> {
        use vgpu_backend::Backend;
        software.create_partition(s).unwrap()
    };
    let gpu_make =
        |s: &PartitionSpec| -> Box<dyn Partition> { Box::new(partition(&b, &s.name, s.memory)) };
    conformance::module_corpus_matches(&cpu, &gpu_make);
}

#[test]
fn conformance_loaded_modules_isolated() {
    conformance_loaded_in(Mode::Isolated);
}

#[test]
fn conformance_loaded_modules_spatial() {
    conformance_loaded_in(Mode::Spatial);
}

#[test]
fn conformance_spatial() {
    conformance_in(Mode::Spatial);
}

fn check_builtins(p: &mut CudaPartition) {
    let mut rng = Rng(0x1234_5678_9abc_def1);

    // fill_u32, aligned and not.
    let buf = p.alloc(4096, 0).unwrap();
    upload(p, buf, &[0xee; 4096]);
    let fill = |dst, count, value| abi::FillParams {
        dst,
        count,
        value,
        reserved: 0,
    };
    launch(p, "fill_u32", fill(buf + 4, 100, 0x1122_3344)).unwrap();
    launch(p, "fill_u32", fill(buf + 1001, 10, 0xa1b2_c3d4)).unwrap();
    let got = download(p, buf, 4096);
    let mut want = vec![0xee; 4096];
    for i in 0..400 {
        want[4 + i] = 0x1122_3344u32.to_le_bytes()[i % 4];
    }
    for i in 0..40 {
        want[1001 + i] = 0xa1b2_c3d4u32.to_le_bytes()[i % 4];
    }
    assert_eq!(got, want);

    // copy, 16-byte aligned and not.
    let src = p.alloc(1 << 20, 0).unwrap();
    let dst = p.alloc(1 << 20, 0).unwrap();
    let data = rng.bytes(1 << 20);
    upload(p, src, &data);
    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    launch(p, "copy", copy(dst, src, 1 << 20)).unwrap();
    assert_eq!(download(p, dst, 1 << 20), data);
    launch(p, "copy", copy(dst + 3, src + 1, 1000)).unwrap();
    assert_eq!(download(p, dst + 3, 1000), data[1..1001]);
    assert!(matches!(
        launch(p, "copy", copy(src + 8, src, 16)),
        Err(OpError::Invalid(_))
    ));

    // vadd, saxpy.
    for n in [0usize, 1, 7, 1000, 4099, 1 << 20] {
        let a = rng.floats(n);
        let bv = rng.floats(n);
        let pa = p.alloc(4 * n as u64 + 4, 0).unwrap();
        let pb = p.alloc(4 * n as u64 + 4, 0).unwrap();
        let pc = p.alloc(4 * n as u64 + 4, 0).unwrap();
        upload_floats(p, pa, &a);
        upload_floats(p, pb, &bv);
        let params = abi::VaddParams {
            c: pc,
            a: pa,
            b: pb,
            n: n as u64,
        };
        launch(p, "vadd_f32", params).unwrap();
        let want: Vec<f32> = a.iter().zip(&bv).map(|(x, y)| x + y).collect();
        assert_eq!(download_floats(p, pc, n), want, "vadd n={n}");
        assert_eq!(download_floats(p, pc + 4 * n as u64, 1), [0.0]);

        let s = 1.75f32;
        let params = abi::SaxpyParams {
            y: pb,
            x: pa,
            n: n as u64,
            a: s,
            reserved: 0,
        };
        launch(p, "saxpy_f32", params).unwrap();
        let want: Vec<f32> = a.iter().zip(&bv).map(|(x, y)| s * x + y).collect();
        assert_eq!(download_floats(p, pb, n), want, "saxpy n={n}");
        for addr in [pa, pb, pc] {
            p.free(addr).unwrap();
        }
    }

    // sgemm.
    let shapes = [
        (1, 1, 1),
        (17, 33, 9),
        (64, 64, 64),
        (5, 300, 270),
        (33, 1, 517),
        (3, 7, 0),
        (130, 129, 131),
        (257, 1000, 300),
    ];
    for &(m, n, k) in &shapes {
        for (alpha, beta) in [(1.5f32, -0.75f32), (1.0, 0.0), (0.0, 2.0), (-0.5, 1.0)] {
            let a = rng.floats(m * k);
            let bm = rng.floats(k * n);
            let c = rng.floats(m * n);
            let pa = p.alloc(4 * (m * k) as u64 + 4, 0).unwrap();
            let pb = p.alloc(4 * (k * n) as u64 + 4, 0).unwrap();
            let pc = p.alloc(4 * (m * n) as u64, 0).unwrap();
            upload_floats(p, pa, &a);
            upload_floats(p, pb, &bm);
            upload_floats(p, pc, &c);
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
            launch(p, "sgemm_f32", params).unwrap();
            let got = download_floats(p, pc, m * n);
            let want = sgemm_reference((m, n, k), alpha, &a, &bm, beta, &c);
            let tol = 1e-5 * (k as f64 + 1.0) * (f64::from(alpha.abs()) + 1.0)
                + 1e-6 * f64::from(beta.abs());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= tol,
                    "{m}x{n}x{k} alpha={alpha} beta={beta} [{i}]: {g} vs {w}"
                );
            }
            for addr in [pa, pb, pc] {
                p.free(addr).unwrap();
            }
        }
    }

    // reduce_sum.
    for n in [0usize, 1, 2, 999, 10_007, (1 << 20) + 3] {
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
            "n={n}: {got} vs {want}"
        );
        if n > 0 {
            let params = abi::ReduceSumParams { out: buf, ..params };
            launch(p, "reduce_sum_f32", params).unwrap();
            let got = download_floats(p, buf, 1)[0];
            assert!((f64::from(got) - want).abs() <= 1e-6 * (n as f64 + 1.0));
        }
        p.free(buf).unwrap();
    }
}

#[test]
fn builtin_kernels_match_reference_isolated() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "kernels", 256 * MIB);
    check_builtins(&mut p);
}

#[test]
fn builtin_kernels_match_reference_spatial() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Spatial) else {
        return;
    };
    let mut p = partition(&b, "kernels", 256 * MIB);
    check_builtins(&mut p);
}

#[test]
fn builtin_aliasing_reads_inputs_as_before() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "alias", 64 * MIB);
    let mut rng = Rng(77);
    let n = 100_001;
    let buf = p.alloc(4 * 3 * n as u64, 0).unwrap();
    let at = |i: usize| buf + 4 * i as u64;
    let data = rng.floats(3 * n);
    let vadd = |c, a, b| abi::VaddParams {
        c,
        a,
        b,
        n: n as u64,
    };

    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(0), at(0), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[n + i]).collect();
    assert_eq!(download_floats(&mut p, buf, n), want);

    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(n), at(n), at(n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[n + i] + data[n + i]).collect();
    assert_eq!(download_floats(&mut p, at(n), n), want);

    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(1), at(0), at(2 * n))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[i] + data[2 * n + i]).collect();
    assert_eq!(download_floats(&mut p, at(1), n), want);
    assert_eq!(download_floats(&mut p, buf, 1), [data[0]]);

    upload_floats(&mut p, buf, &data);
    launch(&mut p, "vadd_f32", vadd(at(0), at(1), at(1))).unwrap();
    let want: Vec<f32> = (0..n).map(|i| data[1 + i] + data[1 + i]).collect();
    assert_eq!(download_floats(&mut p, buf, n), want);

    // saxpy with x one element before y.
    upload_floats(&mut p, buf, &data);
    let s = abi::SaxpyParams {
        y: at(n),
        x: at(n - 1),
        n: n as u64,
        a: 0.5,
        reserved: 0,
    };
    launch(&mut p, "saxpy_f32", s).unwrap();
    let want: Vec<f32> = (0..n)
        .map(|i| 0.5 * data[n - 1 + i] + data[n + i])
        .collect();
    assert_eq!(download_floats(&mut p, at(n), n), want);

    // sgemm in place: C = A * A + C with C, A and B all the same matrix.
    let s = 200;
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
        assert!((f64::from(*g) - w).abs() < 1e-3, "{g} vs {w}");
    }
    // The temporary copies come out of the quota while they live.
    let mut small = partition(&b, "small", 3 * MIB);
    let q = small.alloc(2 * MIB + 8, 0).unwrap();
    let v = abi::VaddParams {
        c: q + 4,
        a: q,
        b: q,
        n: MIB / 4,
    };
    assert_eq!(
        launch(&mut small, "vadd_f32", v),
        Err(OpError::NoMemory {
            requested: MIB,
            available: MIB - 8
        })
    );
    // With room for the one shared copy it runs.
    small.free(q).unwrap();
    let q = small.alloc(2 * MIB, 0).unwrap();
    upload_floats(&mut small, q, &vec![1.0; (MIB / 4) as usize + 1]);
    launch(
        &mut small,
        "vadd_f32",
        abi::VaddParams {
            c: q + 4,
            a: q,
            b: q,
            n: MIB / 4,
        },
    )
    .unwrap();
    assert_eq!(download_floats(&mut small, q, 3), [1.0, 2.0, 2.0]);
}

#[test]
fn copy_and_fill_overlapping_and_unaligned() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "move", 64 * MIB);
    let size = 24 << 20;
    let buf = p.alloc(size as u64, 0).unwrap();
    let mut rng = Rng(11);
    let data = rng.bytes(size);
    for (dst, src, len) in [
        ((1 << 20) + 4, 0usize, 20 << 20),
        (0, (1 << 20) + 4, 20 << 20),
        (3, 0, (17 << 20) + 1),
        (0, 3, (17 << 20) + 1),
        (100, 200, 1000),
    ] {
        upload(&mut p, buf, &data);
        p.copy(buf + dst as u64, buf + src as u64, len as u64)
            .unwrap();
        let mut want = data.clone();
        want.copy_within(src..src + len, dst);
        assert!(
            download(&mut p, buf, size) == want,
            "copy {src} -> {dst}, {len} bytes"
        );
    }
    // fill at an unaligned address repeats the pattern from there.
    upload(&mut p, buf, &[0; 64]);
    p.fill(buf + 3, 40, 0x1122_3344).unwrap();
    let got = download(&mut p, buf, 64);
    for (i, &g) in got.iter().enumerate() {
        let want = if (3..43).contains(&i) {
            0x1122_3344u32.to_le_bytes()[(i - 3) % 4]
        } else {
            0
        };
        assert_eq!(g, want, "byte {i}");
    }
    assert!(matches!(p.fill(buf, 3, 0), Err(OpError::Invalid(_))));
}

/// A kernel on lane 0 waits for a flag that a fill on lane 1 sets: it
/// sees it only if the lanes' streams run side by side (were the fill
/// queued behind the kernel, the kernel would give up after its limit).
#[test]
fn lanes_run_side_by_side() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    b.set_guest_ptx(true);
    let mut p = partition(&b, "lanes", 16 * MIB);
    assert!(p.lanes() >= 2, "lanes: {}", p.lanes());
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &ptx(TEST_KERNELS))
        .unwrap();
    let flag = p.alloc(4, 0).unwrap();
    let out = p.alloc(4, 0).unwrap();
    p.fill(flag, 4, 0).unwrap();
    p.fill(out, 4, 0).unwrap();
    let mut params = flag.to_le_bytes().to_vec();
    params.extend_from_slice(&out.to_le_bytes());
    // About two seconds of the GPU's clock.
    params.extend_from_slice(&4_000_000_000i64.to_le_bytes());
    let wait = [Queued::Launch(Launch {
        cluster: [1, 1, 1],
        cooperative: false,
        module: m,
        entry: "wait_flag",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: &params,
    })];
    let set = [Queued::Fill(DeviceFill {
        addr: flag,
        size: 4,
        pattern: 1,
    })];
    assert_eq!(p.start_queued(0, &wait, &|| false, true), Started::InFlight);
    assert_eq!(p.start_queued(1, &set, &|| false, true), Started::InFlight);
    let mut lanes = Vec::new();
    while let Some((lane, f)) = p.finish_queued() {
        assert!(f.done.iter().all(|d| d.result.is_ok()), "{f:?}");
        lanes.push(lane);
    }
    lanes.sort();
    assert_eq!(lanes, [0, 1]);
    assert_eq!(
        download(&mut p, out, 4),
        1u32.to_le_bytes(),
        "the kernel on lane 0 saw lane 1's fill"
    );
}

#[test]
fn ptx_module_load_and_launch() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    b.set_guest_ptx(true);
    let mut p = partition(&b, "ptx", 16 * MIB);
    let image = ptx(TEST_KERNELS);
    let m = p.module_load(abi::MODULE_FORMAT_PTX, &image).unwrap();
    assert_ne!(m, abi::MODULE_BUILTIN);
    let n = 10_000u64;
    let buf = p.alloc(4 * n, 0).unwrap();
    let v: Vec<u8> = (0..n as u32).flat_map(|i| i.to_le_bytes()).collect();
    upload(&mut p, buf, &v);
    let mut params = buf.to_le_bytes().to_vec();
    params.extend_from_slice(&n.to_le_bytes());
    params.extend_from_slice(&3u32.to_le_bytes());
    launch_module(&mut p, m, "scale_u32", n.div_ceil(256) as u32, 256, &params).unwrap();
    assert!(p.last_device_time().is_some());
    let got = download(&mut p, buf, 4 * n as usize);
    let want: Vec<u8> = (0..n as u32).flat_map(|i| (3 * i).to_le_bytes()).collect();
    assert_eq!(got, want);

    // Parameter block sizes are checked against the kernel.
    let mut long = params.clone();
    long.extend_from_slice(&[0; 4]);
    assert!(matches!(
        launch_module(&mut p, m, "scale_u32", 1, 1, &long),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch_module(&mut p, m, "scale_u32", 1, 1, &params[..16]),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch_module(&mut p, m, "scale_u32", 1, 2048, &params),
        Err(OpError::Invalid(_))
    ));
    assert!(matches!(
        launch_module(&mut p, m, "nope", 1, 1, &params),
        Err(OpError::NotFound(_))
    ));
    assert!(matches!(
        launch_module(&mut p, m + 100, "scale_u32", 1, 1, &params),
        Err(OpError::NotFound(_))
    ));
    // Still fine after the refusals.
    launch_module(&mut p, m, "scale_u32", 1, 32, &params).unwrap();

    assert!(matches!(
        p.module_load(77, &image),
        Err(OpError::Unsupported(_))
    ));
    assert!(matches!(
        p.module_load(abi::MODULE_FORMAT_PTX, &[]),
        Err(OpError::Invalid(_))
    ));
    let bad =
        b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry broken( { bogus; }\n";
    match p.module_load(abi::MODULE_FORMAT_PTX, bad) {
        Err(OpError::Invalid(msg)) => {
            println!("JIT refusal: {msg}");
            assert!(msg.contains("JIT"), "{msg}");
        }
        other => panic!("bad PTX: {other:?}"),
    }
    assert!(matches!(
        p.module_unload(abi::MODULE_BUILTIN),
        Err(OpError::Invalid(_))
    ));
    p.module_unload(m).unwrap();
    assert!(matches!(p.module_unload(m), Err(OpError::NotFound(_))));
    assert!(matches!(
        launch_module(&mut p, m, "scale_u32", 1, 1, &params),
        Err(OpError::NotFound(_))
    ));
}

#[test]
fn guest_ptx_is_refused_unless_allowed() {
    if !gpu() {
        return;
    }
    for mode in [Mode::Isolated, Mode::Spatial] {
        let Some(b) = backend(mode) else {
            return;
        };
        let mut p = partition(&b, "ptx", 16 * MIB);
        let image = ptx(TEST_KERNELS);
        assert!(matches!(
            p.module_load(abi::MODULE_FORMAT_PTX, &image),
            Err(OpError::Unsupported(_))
        ));
        b.set_guest_ptx(true);
        let m = p.module_load(abi::MODULE_FORMAT_PTX, &image).unwrap();
        p.module_unload(m).unwrap();
        b.set_guest_ptx(false);
        assert!(matches!(
            p.module_load(abi::MODULE_FORMAT_PTX, &image),
            Err(OpError::Unsupported(_))
        ));
    }
}

/// Distinct SMs that `blocks` spinning blocks ran on in `p`.
fn sms_used(p: &mut CudaPartition, blocks: u32) -> usize {
    let m = p
        .module_load(abi::MODULE_FORMAT_PTX, &ptx(TEST_KERNELS))
        .unwrap();
    let out = p.alloc(4 * u64::from(blocks), 0).unwrap();
    let mut params = out.to_le_bytes().to_vec();
    params.extend_from_slice(&20_000i64.to_le_bytes());
    launch_module(p, m, "smids", blocks, 128, &params).unwrap();
    let ids = download(p, out, 4 * blocks as usize);
    p.free(out).unwrap();
    p.module_unload(m).unwrap();
    ids.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect::<BTreeSet<_>>()
        .len()
}

#[test]
fn spatial_partitions_run_on_their_own_sms() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Spatial) else {
        return;
    };
    b.set_guest_ptx(true);
    let g = b.sm_granule();
    let cap = b.capacity().compute_units;
    let mut sizes = vec![g, 2 * g];
    if cap >= 8 * g + 2 * g {
        sizes.push(8 * g);
    }
    let mut parts: Vec<CudaPartition> = sizes
        .iter()
        .map(|&s| b.create_cuda_partition(&spec("sms", 16 * MIB, s)).unwrap())
        .collect();
    for (p, &s) in parts.iter_mut().zip(&sizes) {
        let used = sms_used(p, 4096);
        println!("spatial partition of {s} SMs: blocks ran on {used} distinct SMs");
        assert!(used <= s as usize, "{used} SMs used by a {s}-SM partition");
        assert!(used >= s as usize / 2, "only {used} of {s} SMs used");
    }
    let Some(iso) = backend(Mode::Isolated) else {
        return;
    };
    iso.set_guest_ptx(true);
    let mut whole = partition(&iso, "whole", 16 * MIB);
    let used = sms_used(&mut whole, 4096);
    println!("isolated partition: blocks ran on {used} distinct SMs");
    assert!(used > sizes[sizes.len() - 1] as usize);
}

#[test]
fn device_time_is_reported() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "time", 64 * MIB);
    let s = 1024u32;
    let bytes = 4 * u64::from(s * s);
    let (a, bm, c) = (
        p.alloc(bytes, 0).unwrap(),
        p.alloc(bytes, 0).unwrap(),
        p.alloc(bytes, 0).unwrap(),
    );
    assert_eq!(p.last_device_time(), None);
    p.fill(a, bytes, 1.0f32.to_bits()).unwrap();
    p.fill(bm, bytes, 1.0f32.to_bits()).unwrap();
    let params = abi::SgemmParams {
        c,
        a,
        b: bm,
        m: s,
        n: s,
        k: s,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    };
    launch(&mut p, "sgemm_f32", params).unwrap();
    let t = p.last_device_time().unwrap();
    let flops = 2.0 * f64::from(s).powi(3);
    println!(
        "sgemm {s}^3: {t:?} of device time, {:.1} TFLOP/s",
        flops / t.as_secs_f64() / 1e12
    );
    assert!(t > Duration::ZERO && t < Duration::from_secs(1));
    assert_eq!(download_floats(&mut p, c, 1), [s as f32]);
    p.free(a).unwrap();
    assert_eq!(p.last_device_time(), None);
}

#[test]
fn spatial_reset_recreates_the_green_context() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Spatial) else {
        return;
    };
    let mut p = partition(&b, "reset", 16 * MIB);
    let sms = p.sm_count();
    let a = p.alloc(MIB, 0).unwrap();
    upload(&mut p, a, &[3; 64]);
    p.reset();
    assert!(p.lost().is_none());
    assert_eq!(p.memory_used(), 0);
    assert_eq!(p.sm_count(), sms);
    let a = p.alloc(MIB, 0).unwrap();
    let fill = abi::FillParams {
        dst: a,
        count: 16,
        value: 0x0404_0404,
        reserved: 0,
    };
    launch(&mut p, "fill_u32", fill).unwrap();
    assert_eq!(download(&mut p, a, 64), vec![4; 64]);
}

const CHILD_ENV: &str = "VGPU_CUDA_FAULT_CHILD";

/// Runs `body` in a child process: a kernel fault makes CUDA unusable in
/// the process that saw it, so the test binary runs itself again with only
/// `test` selected. Lines the child prints with "probe:" are passed on.
fn in_child(test: &str, body: fn()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        body();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().filter_map(|l| l.split_once("probe:")) {
        println!("probe:{}", line.1);
    }
    assert!(
        out.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Raw driver calls after a fault: can the process get a context again?
fn recovery_probe() {
    use cudarc::driver::sys;
    let mut params = sys::CUctxCreateParams {
        execAffinityParams: std::ptr::null_mut(),
        numExecAffinityParams: 0,
        cigParams: std::ptr::null_mut(),
    };
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointers; device 0 exists (a backend opened it).
    let created = unsafe { sys::cuCtxCreate_v4(&mut ctx, &mut params, 0, 0) };
    println!("probe: raw cuCtxCreate after the fault: {created:?}");
    // SAFETY: plain driver call on device 0; nothing of this test uses the
    // primary context afterwards except the probes below.
    let reset = unsafe { sys::cuDevicePrimaryCtxReset_v2(0) };
    println!("probe: raw cuDevicePrimaryCtxReset: {reset:?}");
    let mut primary: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let retained = unsafe { sys::cuDevicePrimaryCtxRetain(&mut primary, 0) };
    println!("probe: raw cuDevicePrimaryCtxRetain after that: {retained:?}");
    // SAFETY: as for the first create.
    let again = unsafe { sys::cuCtxCreate_v4(&mut ctx, &mut params, 0, 0) };
    println!("probe: raw cuCtxCreate after that: {again:?}");
}

/// What one partition's kernel can do to another in the same process, and
/// what a fault does: shared here in one place for both modes.
fn fault_child(mode: Mode) {
    let b = backend(mode).unwrap();
    b.set_guest_ptx(true);
    let mut pa = partition(&b, "faulty", 16 * MIB);
    let mut pb = partition(&b, "bystander", 16 * MIB);
    let theirs = pb.alloc(4096, 0).unwrap();
    upload(&mut pb, theirs, &[0x5a; 4096]);
    let m = pa
        .module_load(abi::MODULE_FORMAT_PTX, &ptx(TEST_KERNELS))
        .unwrap();
    let own = pa.alloc(4096, 0).unwrap();
    launch_module(&mut pa, m, "poke", 1, 1, &poke_params(own, 0xdead_beef)).unwrap();
    assert_eq!(download(&mut pa, own, 4), 0xdead_beefu32.to_le_bytes());
    // Another partition's allocation named directly by a loaded kernel.
    let r = launch_module(&mut pa, m, "poke", 1, 1, &poke_params(theirs, 0x0707_0707));
    let seen = download(&mut pb, theirs, 4);
    println!(
        "probe: {mode:?}: a loaded kernel writing another partition's allocation: {r:?}; it now reads {seen:02x?}"
    );
    assert!(r.is_ok(), "{r:?}");
    // A wild address.
    let r = launch_module(&mut pa, m, "poke", 1, 1, &poke_params(0x1000, 1));
    println!("probe: {mode:?}: a loaded kernel writing a wild address: {r:?}");
    // Its own fault: the partition lost its state (the device resets it).
    assert!(matches!(r, Err(OpError::KernelFault(_))), "{r:?}");
    assert!(pa.lost().is_some());
    assert!(vgpu_backend_cuda::cuda_lost().is_some());
    // Every partition of the process fails from now on, cleanly: the
    // bystander's state is lost with the process's CUDA (not a kernel
    // fault of its own).
    let sink = VecSink(RefCell::new(vec![0; 4]));
    let rb = pb.download(theirs, &sink);
    println!("probe: {mode:?}: the bystander's next download: {rb:?}");
    assert!(matches!(rb, Err(OpError::Lost(_))), "{rb:?}");
    let ra = pa.alloc(16, 0);
    assert!(matches!(ra, Err(OpError::Lost(_))), "{ra:?}");
    pa.reset();
    println!(
        "probe: {mode:?}: the faulty partition after reset: {:?}",
        pa.lost()
    );
    assert!(pa.lost().is_some());
    assert!(matches!(
        CudaBackend::new(0, mode),
        Err(BackendError::Unavailable(_))
    ));
    drop((pa, pb, b));
    recovery_probe();
}

#[test]
fn isolated_fault_probe() {
    if !gpu() {
        return;
    }
    in_child("isolated_fault_probe", || fault_child(Mode::Isolated));
}

#[test]
fn spatial_fault_probe() {
    if !gpu() {
        return;
    }
    in_child("spatial_fault_probe", || fault_child(Mode::Spatial));
}

/// Guest RAM as a VMM shares it: a memfd, mapped shared in this process.
struct SharedRam {
    file: Arc<File>,
    ptr: *mut u8,
    len: usize,
}

impl SharedRam {
    fn new(len: usize) -> SharedRam {
        // SAFETY: valid NUL-terminated name; result checked.
        let fd = unsafe { libc::memfd_create(c"gpu-test-ram".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: `fd` is new and owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).unwrap();
        // SAFETY: a shared read-write mapping of the whole file, checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap");
        SharedRam {
            file: Arc::new(file),
            ptr: ptr.cast(),
            len,
        }
    }

    fn mapping(&self, id: u64) -> HostMapping {
        HostMapping {
            id,
            addr: self.ptr as usize,
            len: self.len,
            readable: true,
            writable: true,
            file: self.file.clone(),
            file_offset: 0,
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped for the life of self; tests touch them
        // only between copies.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SharedRam {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Pieces (offset, length) of a [`SharedRam`] as one transfer that offers
/// its host slices, as the device model does for guest memory.
struct Pieces<'a> {
    ram: &'a SharedRam,
    id: u64,
    pieces: Vec<(usize, usize)>,
}

impl Pieces<'_> {
    fn total(&self) -> u64 {
        self.pieces.iter().map(|p| p.1 as u64).sum()
    }

    fn walk(&self, offset: u64, n: usize, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
        let (mut pos, mut done) = (0u64, 0usize);
        for &(off, len) in &self.pieces {
            let want = offset + done as u64;
            if done == n || want >= pos + len as u64 {
                pos += len as u64;
                continue;
            }
            let skip = (want - pos) as usize;
            let k = (len - skip).min(n - done);
            f(off + skip, done..done + k);
            done += k;
            pos += len as u64;
        }
        assert_eq!(done, n);
    }

    fn slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        let s: Vec<HostSlice> = self
            .pieces
            .iter()
            .map(|&(off, len)| HostSlice {
                ptr: self.ram.ptr.wrapping_add(off),
                len,
                mapping: self.id,
            })
            .collect();
        f(&s)
    }

    fn gather(&self) -> Vec<u8> {
        let ram = self.ram.bytes();
        self.pieces
            .iter()
            .flat_map(|&(o, l)| ram[o..o + l].to_vec())
            .collect()
    }

    fn scatter(&self, data: &[u8]) {
        let ram = self.ram.bytes();
        self.walk(0, data.len(), |o, r| {
            ram[o..o + r.len()].copy_from_slice(&data[r])
        });
    }
}

impl HostSource for Pieces<'_> {
    fn len(&self) -> u64 {
        self.total()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let ram = self.ram.bytes();
        let n = buf.len();
        self.walk(offset, n, |o, r| {
            buf[r.clone()].copy_from_slice(&ram[o..o + r.len()])
        });
        Ok(())
    }
    fn with_slices(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        self.slices(f)
    }
}

impl HostSink for Pieces<'_> {
    fn len(&self) -> u64 {
        self.total()
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), OpError> {
        let ram = self.ram.bytes();
        self.walk(offset, buf.len(), |o, r| {
            ram[o..o + r.len()].copy_from_slice(&buf[r])
        });
        Ok(())
    }
    fn with_slices_mut(&self, f: &mut SliceFn<'_>) -> Result<bool, OpError> {
        self.slices(f)
    }
}

fn check_registered_copies(mode: Mode) {
    let Some(b) = backend(mode) else {
        return;
    };
    let mut p = partition(&b, "zero-copy", 256 * MIB);
    let reg = p.host_registry().clone();
    let hm = p
        .host_memory()
        .expect("the cuda backend takes guest memory");
    let ram = SharedRam::new(128 << 20);
    hm.mapped(ram.mapping(7));
    assert!(reg.wait_registered(7, Duration::from_secs(10)));
    assert_eq!(reg.registered(), 1);
    let dev = p.alloc(48 * MIB, 0).unwrap();
    let mut rng = Rng(0x2e40);

    // Two large pieces, one at an odd address: straight from guest pages.
    let src = Pieces {
        ram: &ram,
        id: 7,
        pieces: vec![(4097, 20 << 20), (24 << 20, (20 << 20) + 5)],
    };
    let data = rng.bytes(src.total() as usize);
    src.scatter(&data);
    p.upload(dev, &src).unwrap();
    assert!(p.last_copy_was_direct());
    assert!(p.last_device_time().is_some());
    assert_eq!(download(&mut p, dev, data.len()), data, "uploaded bytes");
    assert!(!p.last_copy_was_direct(), "a plain Vec is staged");
    // And back into other guest pages.
    let dst = Pieces {
        ram: &ram,
        id: 7,
        pieces: vec![
            (48 << 20, 8 << 20),
            ((56 << 20) + 3, (data.len()) - (8 << 20)),
        ],
    };
    assert!(dst.pieces[1].0 + dst.pieces[1].1 <= ram.len, "fits the ram");
    p.download(dev, &dst).unwrap();
    assert!(p.last_copy_was_direct());
    assert_eq!(dst.gather(), data, "downloaded bytes");

    // Small scattered pieces, and pieces of a mapping the partition does
    // not know, go through the staging buffers, as correctly.
    let small = Pieces {
        ram: &ram,
        id: 7,
        pieces: (0..64).map(|i| (i * 8192 + 1, 4096)).collect(),
    };
    let data = rng.bytes(small.total() as usize);
    upload(&mut p, dev, &data);
    p.download(dev, &small).unwrap();
    assert!(!p.last_copy_was_direct());
    assert_eq!(small.gather(), data);
    let unknown = Pieces {
        ram: &ram,
        id: 8,
        pieces: vec![(0, 16 << 20)],
    };
    let data = rng.bytes(16 << 20);
    unknown.scatter(&data);
    p.upload(dev, &unknown).unwrap();
    assert!(!p.last_copy_was_direct());
    assert_eq!(download(&mut p, dev, data.len()), data);
    // A range past the registration is not taken as registered.
    let past = Pieces {
        ram: &ram,
        id: 7,
        pieces: vec![(ram.len - (16 << 20), 16 << 20)],
    };
    let mut wider = past.ram.mapping(7);
    wider.len -= 4096;
    hm.unmapped(7);
    hm.mapped(wider);
    assert!(reg.wait_registered(7, Duration::from_secs(10)));
    p.upload(dev, &past).unwrap();
    assert!(!p.last_copy_was_direct());
    hm.unmapped(7);
    assert_eq!(reg.registered(), 0);
}

#[test]
fn registered_copies_isolated() {
    if gpu() {
        check_registered_copies(Mode::Isolated);
    }
}

#[test]
fn registered_copies_spatial() {
    if gpu() {
        check_registered_copies(Mode::Spatial);
    }
}

/// Whether the driver takes `len` bytes at `ptr` as a new registration
/// (it refuses memory that is registered already).
fn registrable(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: plain driver calls with valid out pointers; the memory is a
    // live mapping of `len` bytes; a registration made here is undone here.
    unsafe {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        assert_eq!(
            sys::cuDevicePrimaryCtxRetain(&mut ctx, 0),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(sys::cuCtxPushCurrent_v2(ctx), sys::CUresult::CUDA_SUCCESS);
        let r = sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE);
        if r == sys::CUresult::CUDA_SUCCESS {
            assert_eq!(
                sys::cuMemHostUnregister(ptr.cast()),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped);
        sys::cuDevicePrimaryCtxRelease_v2(0);
        r == sys::CUresult::CUDA_SUCCESS
    }
}

#[test]
fn unmap_unregisters_even_during_registration() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let mut p = partition(&b, "unmap", 64 * MIB);
    let reg = p.host_registry().clone();
    let hm = p.host_memory().unwrap();
    let dev = p.alloc(MIB, 0).unwrap();

    // Registered, then unmapped: the driver no longer holds the memory,
    // and copies of it are staged.
    let ram = SharedRam::new(64 << 20);
    hm.mapped(ram.mapping(1));
    assert!(reg.wait_registered(1, Duration::from_secs(10)));
    assert!(
        !registrable(ram.ptr, ram.len),
        "registered by the partition"
    );
    let whole = Pieces {
        ram: &ram,
        id: 1,
        pieces: vec![(0, MIB as usize)],
    };
    p.upload(dev, &whole).unwrap();
    assert!(p.last_copy_was_direct());
    hm.unmapped(1);
    assert_eq!(reg.registered(), 0);
    assert!(
        registrable(ram.ptr, ram.len),
        "still registered after unmap"
    );
    p.upload(dev, &whole).unwrap();
    assert!(!p.last_copy_was_direct());
    drop(ram);

    // Unmapped while the registration of 2 GiB is under way: the notice
    // returns only once nothing is registered, so the memory can go.
    let big = SharedRam::new(2 << 30);
    let t = std::time::Instant::now();
    hm.mapped(big.mapping(2));
    let queued = t.elapsed();
    // Long enough for the registration to start, not to end.
    std::thread::sleep(Duration::from_millis(30));
    hm.unmapped(2);
    println!(
        "2 GiB: mapped notice returned in {queued:?}, unmapped after {:?}",
        t.elapsed()
    );
    assert!(queued < Duration::from_millis(50), "mapped() blocked");
    assert_eq!(reg.registered(), 0);
    assert!(registrable(big.ptr, big.len), "left registered");
    drop(big);

    // Unknown ids, and a partition dropped with memory registered.
    hm.unmapped(99);
    let ram = SharedRam::new(8 << 20);
    hm.mapped(ram.mapping(3));
    assert!(reg.wait_registered(3, Duration::from_secs(10)));
    drop(p);
    drop(hm);
    drop(reg);
    // The registration thread may still hold the registry for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !registrable(ram.ptr, ram.len) {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped partition's registration is left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn vgpu_copies_go_straight_to_guest_ram() {
    use vgpu_device::testing::{test_config, TestVgpu};
    use vgpu_testkit::{GuestOptions, Mode as QueueMode};
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    let p = partition(&b, "vgpu", 256 * MIB);
    let reg = p.host_registry().clone();
    let server = TestVgpu::start(test_config("vgpu", 1), Box::new(p));
    let mut g = server.connect_with(GuestOptions {
        ram_size: 256 << 20,
        ..GuestOptions::default()
    });
    // The mapping of guest RAM is registered in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reg.registered() == 0 {
        assert!(std::time::Instant::now() < deadline, "RAM not registered");
        std::thread::sleep(Duration::from_millis(5));
    }
    g.setup_queue(0, 64, QueueMode::Polled);
    let dev = g.device_alloc(0, 64 * MIB);
    let sg = g.alloc_sg(&[(24 << 20) + 3, (40 << 20) - 3]);
    let total: u64 = sg.iter().map(|e| e.len).sum();
    let data = Rng(0x76).bytes(total as usize);
    g.write_sg(&sg, &data);
    let c = g.copy_to_device(0, dev, &sg);
    assert_eq!(c.status, abi::STATUS_OK);
    let back = g.alloc_sg(&[total]);
    let c = g.copy_from_device(0, dev, &back);
    assert_eq!(c.status, abi::STATUS_OK);
    assert_eq!(g.read_sg(&back), data);
    // Unmapping guest RAM unregisters it.
    g.unmap_ram();
    assert_eq!(reg.registered(), 0);
    g.map_ram();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reg.registered() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "RAM not registered again"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(g);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reg.registered() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the VMM went away, RAM still registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(server);
}

#[test]
fn registration_is_bounded() {
    if !gpu() {
        return;
    }
    let Some(b) = backend(Mode::Isolated) else {
        return;
    };
    b.set_max_registered(48 << 20);
    let mut p = partition(&b, "bounded", 64 * MIB);
    let reg = p.host_registry().clone();
    let hm = p.host_memory().unwrap();
    let (one, two) = (SharedRam::new(32 << 20), SharedRam::new(32 << 20));
    hm.mapped(one.mapping(1));
    assert!(reg.wait_registered(1, Duration::from_secs(10)));
    // Past the limit: not registered, and copies of it are staged.
    hm.mapped(two.mapping(2));
    assert!(!reg.wait_registered(2, Duration::from_secs(1)));
    assert_eq!(reg.registered(), 1);
    let dev = p.alloc(MIB, 0).unwrap();
    let src = Pieces {
        ram: &two,
        id: 2,
        pieces: vec![(0, MIB as usize)],
    };
    p.upload(dev, &src).unwrap();
    assert!(!p.last_copy_was_direct());
    // Too small to be worth registering.
    let small = SharedRam::new(64 << 10);
    hm.mapped(small.mapping(3));
    assert!(!reg.wait_registered(3, Duration::from_secs(1)));
    // Unmapping what was never registered is fine; space comes back.
    hm.unmapped(2);
    hm.unmapped(3);
    hm.unmapped(1);
    hm.mapped(two.mapping(4));
    assert!(reg.wait_registered(4, Duration::from_secs(10)));
    hm.unmapped(4);
    assert_eq!(reg.registered(), 0);
}
