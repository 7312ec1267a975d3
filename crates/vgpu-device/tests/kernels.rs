//! LAUNCH of every built-in kernel, checked against references computed
//! here, and the ways a launch is refused.

mod common;

use common::{assert_close, assert_status, vgpu_ready, Rng};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{bytes_to_f32s, f32s_to_bytes, launch_cmd, Chain, Guest};

fn upload_f32s(g: &mut Guest, v: &[f32]) -> u64 {
    let dev = g.device_alloc(0, 4 * v.len() as u64);
    g.upload(0, dev, &f32s_to_bytes(v));
    dev
}

fn download_f32s(g: &mut Guest, dev: u64, n: usize) -> Vec<f32> {
    bytes_to_f32s(&g.download(0, dev, 4 * n))
}

#[test]
fn test_launch_fill_u32() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4000);
    let p = abi::FillParams {
        dst: dev + 40,
        count: 900,
        value: 0x1234_5678,
        reserved: 0,
    };
    assert_status(g.launch(0, "fill_u32", &p), abi::STATUS_OK);
    let got = g.download(0, dev, 4000);
    let mut want = vec![0u8; 4000];
    for w in want[40..3640].chunks_exact_mut(4) {
        w.copy_from_slice(&0x1234_5678u32.to_le_bytes());
    }
    assert_eq!(got, want);
}

#[test]
fn test_launch_copy() {
    let (_s, mut g) = vgpu_ready();
    let data = Rng(11).bytes(100_000);
    let src = g.device_alloc(0, 100_000);
    let dst = g.device_alloc(0, 100_000);
    g.upload(0, src, &data);
    let p = abi::CopyParams {
        dst: dst + 1,
        src: src + 3,
        bytes: 99_990,
    };
    assert_status(g.launch(0, "copy", &p), abi::STATUS_OK);
    let got = g.download(0, dst, 100_000);
    assert_eq!(got[0], 0);
    assert_eq!(got[1..99_991], data[3..99_993]);
    assert!(got[99_991..].iter().all(|b| *b == 0));
}

#[test]
fn test_launch_vadd_f32() {
    let (_s, mut g) = vgpu_ready();
    let n = 70_001;
    let mut rng = Rng(12);
    let (a, b) = (rng.f32s(n), rng.f32s(n));
    let (da, db) = (upload_f32s(&mut g, &a), upload_f32s(&mut g, &b));
    let dc = g.device_alloc(0, 4 * n as u64);
    let p = abi::VaddParams {
        c: dc,
        a: da,
        b: db,
        n: n as u64,
    };
    assert_status(g.launch(0, "vadd_f32", &p), abi::STATUS_OK);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(download_f32s(&mut g, dc, n), want);
}

#[test]
fn test_launch_saxpy_f32() {
    let (_s, mut g) = vgpu_ready();
    let n = 33_333;
    let mut rng = Rng(13);
    let (x, y) = (rng.f32s(n), rng.f32s(n));
    let (dx, dy) = (upload_f32s(&mut g, &x), upload_f32s(&mut g, &y));
    let p = abi::SaxpyParams {
        y: dy,
        x: dx,
        n: n as u64,
        a: -2.5,
        reserved: 0,
    };
    assert_status(g.launch(0, "saxpy_f32", &p), abi::STATUS_OK);
    let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| -2.5 * x + y).collect();
    assert_eq!(download_f32s(&mut g, dy, n), want);
    assert_eq!(download_f32s(&mut g, dx, n), x, "x is only read");
}

#[test]
fn test_launch_sgemm_f32() {
    let (_s, mut g) = vgpu_ready();
    let (m, n, k) = (37usize, 45usize, 61usize);
    let mut rng = Rng(14);
    let (a, b, c0) = (rng.f32s(m * k), rng.f32s(k * n), rng.f32s(m * n));
    let (da, db, dc) = (
        upload_f32s(&mut g, &a),
        upload_f32s(&mut g, &b),
        upload_f32s(&mut g, &c0),
    );
    let (alpha, beta) = (1.5f32, -0.75f32);
    let p = abi::SgemmParams {
        c: dc,
        a: da,
        b: db,
        m: m as u32,
        n: n as u32,
        k: k as u32,
        reserved: 0,
        alpha,
        beta,
    };
    assert_status(g.launch(0, "sgemm_f32", &p), abi::STATUS_OK);
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            want[i * n + j] =
                (f64::from(alpha) * dot + f64::from(beta) * f64::from(c0[i * n + j])) as f32;
        }
    }
    assert_close(&download_f32s(&mut g, dc, m * n), &want, 1e-4);
    assert!(g.read64(abi::REG_BUSY_NS) > 0, "device time is accounted");
}

#[test]
fn test_launch_reduce_sum_f32() {
    let (_s, mut g) = vgpu_ready();
    let n = 100_003;
    let input = Rng(15).f32s(n);
    let din = upload_f32s(&mut g, &input);
    let out = g.device_alloc(0, 4);
    let p = abi::ReduceSumParams {
        out,
        input: din,
        n: n as u64,
    };
    assert_status(g.launch(0, "reduce_sum_f32", &p), abi::STATUS_OK);
    let want = input.iter().map(|x| f64::from(*x)).sum::<f64>() as f32;
    assert_close(&download_f32s(&mut g, out, 1), &[want], 1e-3);
}

#[test]
fn test_launch_unknown_entry_or_module_is_not_found() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64);
    let p = abi::FillParams {
        dst: dev,
        count: 1,
        value: 1,
        reserved: 0,
    };
    assert_status(g.launch(0, "no_such_kernel", &p), abi::STATUS_NOT_FOUND);
    assert_status(g.launch(0, "", &p), abi::STATUS_NOT_FOUND);
    let mut cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], 24);
    cmd.module = 9;
    assert_status(g.launch_raw(0, &cmd, p.as_slice()), abi::STATUS_NOT_FOUND);
    assert_eq!(g.download(0, dev, 4), [0; 4]);
}

#[test]
fn test_launch_bad_params_size_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64);
    let p = abi::FillParams {
        dst: dev,
        count: 4,
        value: 9,
        reserved: 0,
    };
    let size = std::mem::size_of::<abi::FillParams>() as u32;
    let bytes = p.as_slice();
    // Shorter and longer blocks than the kernel takes.
    for n in [0, size - 4, size + 8] {
        let mut padded = bytes.to_vec();
        padded.resize(n as usize, 0);
        let cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], n);
        assert_status(g.launch_raw(0, &cmd, &padded), abi::STATUS_INVALID);
    }
    // More than the ABI allows.
    let big = vec![0u8; abi::MAX_PARAMS_SIZE as usize + 1];
    let cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], abi::MAX_PARAMS_SIZE + 1);
    assert_status(g.launch_raw(0, &cmd, &big), abi::STATUS_INVALID);
    // params_size larger than the descriptors hold.
    let cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], size);
    assert_status(g.launch_raw(0, &cmd, &bytes[..16]), abi::STATUS_INVALID);
    // No parameter descriptor at all.
    let c = g.run(0, &Chain::command(&cmd).completion());
    assert_status(c, abi::STATUS_INVALID);
    assert_eq!(g.download(0, dev, 16), [0; 16], "no kernel ran");
    // The block may be split over several descriptors.
    let c = g.run(
        0,
        &Chain::command(&cmd)
            .bytes(&bytes[..5])
            .bytes(&bytes[5..])
            .completion(),
    );
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.download(0, dev, 16), [9, 0, 0, 0].repeat(4));
}

/// A kernel taking a pointer and a 32,756-byte array by value: the
/// 32,764 bytes of parameters CUDA allows since 12.1. It copies the
/// array out.
const COPY_PARAMS_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\
    .visible .entry copy_params(.param .u64 out, .param .align 1 .b8 blob[32756])\n{\n\
    .reg .pred %p<2>;\n.reg .b16 %rs<2>;\n.reg .b32 %r<6>;\n.reg .b64 %rd<6>;\n\
    ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd1, %rd1;\nmov.b64 %rd2, blob;\n\
    mov.u32 %r1, %ctaid.x;\nmov.u32 %r2, %ntid.x;\nmov.u32 %r3, %tid.x;\n\
    mad.lo.s32 %r4, %r1, %r2, %r3;\nmov.u32 %r5, %nctaid.x;\nmul.lo.s32 %r5, %r5, %r2;\n\
    LOOP:\nsetp.ge.s32 %p1, %r4, 32756;\n@%p1 bra DONE;\ncvt.s64.s32 %rd3, %r4;\n\
    add.s64 %rd4, %rd2, %rd3;\nld.param.u8 %rs1, [%rd4];\nadd.s64 %rd5, %rd1, %rd3;\n\
    st.global.u8 [%rd5], %rs1;\nadd.s32 %r4, %r4, %r5;\nbra LOOP;\nDONE:\nret;\n}\n";

/// The largest parameter block the ABI allows reaches the kernel whole,
/// split over descriptors as a driver may split it; one byte more is
/// refused.
#[test]
fn test_launch_with_the_largest_parameter_block() {
    let (_s, mut g) = vgpu_ready();
    let module = g.module_load(0, abi::MODULE_FORMAT_PTX, COPY_PARAMS_PTX.as_bytes());
    assert_status(module, abi::STATUS_OK);
    let blob_len = abi::MAX_PARAMS_SIZE as usize - 8;
    let out = g.device_alloc(0, blob_len as u64);
    let blob = Rng(0x5eed).bytes(blob_len);
    let mut params = out.to_le_bytes().to_vec();
    params.extend_from_slice(&blob);
    assert_eq!(params.len(), 32764);
    let mut cmd = launch_cmd("copy_params", [8, 1, 1], [128, 1, 1], abi::MAX_PARAMS_SIZE);
    cmd.module = module.result;
    let (a, b) = params.split_at(10_000);
    let c = g.run(0, &Chain::command(&cmd).bytes(a).bytes(b).completion());
    assert_status(c, abi::STATUS_OK);
    assert!(
        g.download(0, out, blob_len) == blob,
        "the kernel saw other bytes"
    );
    params.push(0);
    cmd.params_size = abi::MAX_PARAMS_SIZE + 1;
    assert_status(g.launch_raw(0, &cmd, &params), abi::STATUS_INVALID);
}

#[test]
fn test_launch_bad_shape_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64);
    let p = abi::FillParams {
        dst: dev,
        count: 1,
        value: 3,
        reserved: 0,
    };
    let bad: [([u32; 3], [u32; 3]); 9] = [
        ([0, 1, 1], [1, 1, 1]),
        ([1, 0, 1], [1, 1, 1]),
        ([1, 1, 0], [1, 1, 1]),
        ([1, 1, 1], [0, 1, 1]),
        ([1, 1, 1], [1025, 1, 1]),
        ([1, 1, 1], [32, 32, 2]),
        ([1, 1, 1], [1, 1, 65]),
        ([1, 65536, 1], [1, 1, 1]),
        ([u32::MAX, 1, 1], [1, 1, 1]),
    ];
    for (grid, block) in bad {
        let cmd = launch_cmd("fill_u32", grid, block, 24);
        let c = g.launch_raw(0, &cmd, p.as_slice());
        assert_eq!(
            c.status,
            abi::STATUS_INVALID,
            "grid {grid:?} block {block:?}"
        );
    }
    assert_eq!(g.download(0, dev, 4), [0; 4]);
    // The largest legal shapes run.
    for (grid, block) in [
        ([65536, 2, 3], [32, 32, 1]),
        ([1, 65535, 65535], [1, 1, 64]),
    ] {
        let cmd = launch_cmd("fill_u32", grid, block, 24);
        assert_status(g.launch_raw(0, &cmd, p.as_slice()), abi::STATUS_OK);
    }
    assert_eq!(g.download(0, dev, 4), [3, 0, 0, 0]);
}

#[test]
fn test_launch_block_whose_thread_count_overflows_is_invalid() {
    // Block dimensions whose product does not fit in 64 bits (2^96 and
    // 2^66 threads) are refused like any other bad shape, and the queue
    // carries on.
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64);
    let p = abi::FillParams {
        dst: dev,
        count: 1,
        value: 3,
        reserved: 0,
    };
    for block in [[u32::MAX; 3], [1 << 22; 3]] {
        let cmd = launch_cmd("fill_u32", [1, 1, 1], block, 24);
        let c = g.launch_raw(0, &cmd, p.as_slice());
        assert_eq!(c.status, abi::STATUS_INVALID, "block {block:?}");
    }
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_eq!(g.download(0, dev, 4), [0; 4]);
}

#[test]
fn test_launch_bad_entry_name_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let p = abi::FillParams::default();
    let mut cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], 24);
    cmd.entry = [b'a'; 32];
    assert_status(g.launch_raw(0, &cmd, p.as_slice()), abi::STATUS_INVALID);
    cmd.entry = [0; 32];
    cmd.entry[..3].copy_from_slice(&[0xff, 0xfe, 0x80]);
    assert_status(g.launch_raw(0, &cmd, p.as_slice()), abi::STATUS_INVALID);
}

#[test]
fn test_launch_outside_allocations_is_out_of_range() {
    let (_s, mut g) = vgpu_ready();
    let n = 100u64;
    let a = g.device_alloc(0, 4 * n);
    let b = g.device_alloc(0, 4 * n);
    let c = g.device_alloc(0, 4 * n);
    let vadd = |c, a, b, n| abi::VaddParams { c, a, b, n };
    for p in [
        vadd(c, a, b, n + 1),
        vadd(c + 4, a, b, n),
        vadd(c, a, 0x10, n),
        vadd(c, a, b, u64::MAX / 2),
    ] {
        assert_status(g.launch(0, "vadd_f32", &p), abi::STATUS_OUT_OF_RANGE);
    }
    let fill = abi::FillParams {
        dst: a,
        count: n + 1,
        value: 1,
        reserved: 0,
    };
    assert_status(g.launch(0, "fill_u32", &fill), abi::STATUS_OUT_OF_RANGE);
    let sum = abi::ReduceSumParams {
        out: a + 4 * n,
        input: b,
        n,
    };
    assert_status(
        g.launch(0, "reduce_sum_f32", &sum),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_eq!(g.download(0, c, 4 * n as usize), vec![0; 4 * n as usize]);
}
