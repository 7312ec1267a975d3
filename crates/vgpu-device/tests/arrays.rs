//! CUDA arrays, texture and surface objects (ABI 1.6): offered by the
//! software partition, each context's own, and malformed requests
//! refused with a status.

mod common;

use common::*;
use vgpu_backend::conformance::{self, array_cmd, object_cmd};
use vgpu_testkit::abi;
use vgpu_testkit::Guest;

fn destroy(g: &mut Guest, kind: u32, handle: u64) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::ObjectDestroyCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_OBJECT_DESTROY,
                flags: kind,
            },
            handle,
        },
    )
}

fn copy(g: &mut Guest, c: vgpu_backend::arrays::Resource) -> abi::Completion {
    let vgpu_backend::arrays::Resource::ArrayCopy(cmd) = c else {
        unreachable!()
    };
    g.run_cmd(0, &cmd)
}

#[test]
fn a_texture_over_an_array_is_sampled_by_a_kernel() {
    let (_s, mut g) = vgpu_ready();
    assert_ne!(g.read64(abi::REG_FEATURES) & abi::FEATURE_ARRAYS, 0);
    assert!(
        g.read32(abi::REG_VERSION) & 0xffff >= 6,
        "arrays came with ABI 1.6"
    );
    // A 4 x 3 array of 2-channel floats, element (x, y) = (x + 10 y, -x).
    let (w, h) = (4u32, 3u32);
    let a = g.run_cmd(
        0,
        &array_cmd(abi::FORMAT_F32, 2, [w.into(), h.into(), 0], 0),
    );
    assert_status(a, abi::STATUS_OK);
    let a = a.result;
    let texels: Vec<f32> = (0..w * h)
        .flat_map(|i| [(i % w + 10 * (i / w)) as f32, -((i % w) as f32)])
        .collect();
    let lin = g.device_alloc(0, u64::from(w * h * 8));
    g.upload(0, lin, &conformance::to_bytes(&texels));
    let c = conformance::array_copy_cmd(
        (lin, Some((w * 8, h)), [0; 3]),
        (a, None, [0; 3]),
        [w * 8, h, 1],
    );
    assert_status(copy(&mut g, c), abi::STATUS_OK);
    let t = g.run_cmd(0, &object_cmd(abi::OBJECT_TEXTURE, a));
    assert_status(t, abi::STATUS_OK);
    let m = g.module_load(
        0,
        abi::MODULE_FORMAT_PTX,
        conformance::TEXTURE_PTX.as_bytes(),
    );
    assert_status(m, abi::STATUS_OK);
    // step 1: thread (x, y) samples at (x - 1, y - 1), clamped.
    let (bx, by) = (6u32, 5u32);
    let out = g.device_alloc(0, u64::from(bx * by * 16));
    let params = conformance::Params::default()
        .u64(t.result)
        .u64(out)
        .u32(1f32.to_bits());
    let mut launch = vgpu_testkit::launch_cmd("sample2d", [1, 1, 1], [bx, by, 1], 20);
    launch.module = m.result;
    assert_status(g.launch_raw(0, &launch, &params.0), abi::STATUS_OK);
    let got = conformance::to_floats(&g.download(0, out, (bx * by * 16) as usize));
    for y in 0..by {
        for x in 0..bx {
            let (tx, ty) = (
                (x as i64 - 1).clamp(0, 3) as u32,
                (y as i64 - 1).clamp(0, 2) as u32,
            );
            let k = ((y * bx + x) * 4) as usize;
            assert_eq!(
                got[k..k + 4],
                [(tx + 10 * ty) as f32, -(tx as f32), 0.0, 1.0],
                "thread ({x}, {y})"
            );
        }
    }
    // A bogus handle faults the launch alone.
    let bogus = conformance::Params::default().u64(lin).u64(out).u32(0);
    assert_status(g.launch_raw(0, &launch, &bogus.0), abi::STATUS_KERNEL_FAULT);
    // The array and the object are freed by kind, not by MEM_FREE.
    assert_status(g.mem_free(0, a), abi::STATUS_INVALID);
    assert_status(g.mem_free(0, t.result), abi::STATUS_INVALID);
    assert_status(
        destroy(&mut g, abi::OBJECT_SURFACE, t.result),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(
        destroy(&mut g, abi::OBJECT_TEXTURE, t.result),
        abi::STATUS_OK,
    );
    assert_status(destroy(&mut g, abi::OBJECT_ARRAY, a), abi::STATUS_OK);
    assert_status(destroy(&mut g, abi::OBJECT_ARRAY, a), abi::STATUS_NOT_FOUND);
}

#[test]
fn malformed_requests_are_refused_and_arrays_count_against_the_quota() {
    let (_s, mut g) = vgpu_ready();
    let used = g.read64(abi::REG_MEM_USED);
    let a = g.run_cmd(0, &array_cmd(abi::FORMAT_U16, 4, [100, 10, 0], 0));
    assert_status(a, abi::STATUS_OK);
    assert!(g.read64(abi::REG_MEM_USED) >= used + 8000);
    for bad in [
        array_cmd(0x42, 1, [4, 4, 0], 0),
        array_cmd(abi::FORMAT_F32, 3, [4, 4, 0], 0),
        array_cmd(abi::FORMAT_F32, 1, [0, 4, 0], 0),
        array_cmd(abi::FORMAT_F32, 1, [u64::MAX, u64::MAX, u64::MAX], 0),
        array_cmd(abi::FORMAT_F32, 1, [4, 4, 0], abi::ARRAY_FLAG_LAYERED),
    ] {
        assert_status(g.run_cmd(0, &bad), abi::STATUS_INVALID);
    }
    // Larger than the quota: NO_MEMORY.
    let huge = array_cmd(abi::FORMAT_F32, 4, [16384, 16384, 0], 0);
    assert_status(g.run_cmd(0, &huge), abi::STATUS_NO_MEMORY);
    // A command cut short.
    let short = abi::CmdHeader {
        opcode: abi::OP_ARRAY_CREATE,
        flags: 0,
    };
    assert_status(g.run_cmd(0, &short), abi::STATUS_INVALID);
    // A copy whose box leaves the array, or names no array.
    let lin = g.device_alloc(0, 1 << 16);
    let c = conformance::array_copy_cmd(
        (lin, Some((800, 10)), [0; 3]),
        (a.result, None, [8, 0, 0]),
        [800, 10, 1],
    );
    assert_status(copy(&mut g, c), abi::STATUS_INVALID);
    let c = conformance::array_copy_cmd(
        (lin, Some((800, 10)), [0; 3]),
        (0x77, None, [0; 3]),
        [800, 10, 1],
    );
    assert_status(copy(&mut g, c), abi::STATUS_NOT_FOUND);
    assert_status(destroy(&mut g, 9, a.result), abi::STATUS_INVALID);
    assert_status(destroy(&mut g, abi::OBJECT_ARRAY, a.result), abi::STATUS_OK);
    assert_eq!(g.read64(abi::REG_MEM_USED), used + (1 << 16));
}

#[test]
fn arrays_are_their_contexts_own() {
    use std::sync::Arc;
    use vgpu_backend::contexts::{ContextFactory, Contexts};
    use vgpu_backend::software::SoftwareBackend;
    use vgpu_backend::{Backend, Partition};
    use vgpu_device::testing::{software_partition, test_config, TestVgpu};
    let backend = Arc::new(SoftwareBackend::new(16 * MIB, 2));
    let base = software_partition(&backend, "ctx", 16 * MIB, 2);
    let make: ContextFactory = Box::new(move |spec| {
        backend
            .create_context(spec)
            .map(|p| p as Box<dyn Partition>)
    });
    let server = TestVgpu::start(
        test_config("ctx", 2),
        Box::new(Contexts::new(base, make, 4)),
    );
    let mut g = server.connect();
    g.setup_queue(0, 64, vgpu_testkit::Mode::Interrupt);
    g.set_context(1);
    let a = g.run_cmd(0, &array_cmd(abi::FORMAT_U8, 1, [64, 0, 0], 0));
    assert_status(a, abi::STATUS_OK);
    g.set_context(2);
    assert_status(
        g.run_cmd(0, &object_cmd(abi::OBJECT_TEXTURE, a.result)),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(
        destroy(&mut g, abi::OBJECT_ARRAY, a.result),
        abi::STATUS_NOT_FOUND,
    );
    g.set_context(1);
    assert_status(
        g.run_cmd(0, &object_cmd(abi::OBJECT_TEXTURE, a.result)),
        abi::STATUS_OK,
    );
    // Ending the context frees what it held.
    assert_status(
        g.run(0, &vgpu_testkit::bare_chain(abi::OP_CTX_DESTROY)),
        abi::STATUS_OK,
    );
    g.set_context(0);
    assert_eq!(g.read64(abi::REG_MEM_USED), 0);
}
