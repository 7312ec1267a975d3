//! Tests of the device's rules (no device needed).

use super::*;

const A: u64 = 0x7f00_0000_0000;
const B: u64 = 0x7f00_0010_0000;
const C: u64 = 0x7f00_0020_0000;

fn table() -> Allocations<u64> {
    let mut t = Allocations::default();
    for addr in [A, B, C] {
        t.insert(addr, 400, 400, addr);
    }
    t
}

fn plan<T: ByteValued>(t: &Allocations<u64>, entry: &str, p: T) -> Result<Builtin, OpError> {
    plan_builtin(
        entry,
        [1, 1, 1],
        [64, 1, 1],
        p.as_slice(),
        t,
        FloatOperands::Aligned,
    )
}

fn oor(r: Result<Builtin, OpError>) -> bool {
    matches!(r, Err(OpError::OutOfRange { .. }))
}

fn invalid(r: Result<Builtin, OpError>) -> bool {
    matches!(r, Err(OpError::Invalid(_)))
}

#[test]
fn test_table_check_and_accounting() {
    let mut t = table();
    assert_eq!(t.used(), 1200);
    assert_eq!(t.len(), 3);
    assert!(t.check(A, 400).is_ok());
    assert!(t.check(A + 400, 0).is_ok());
    assert!(t.check(A + 399, 1).is_ok());
    assert_eq!(
        t.check(A + 399, 2),
        Err(OpError::OutOfRange {
            addr: A + 399,
            len: 2
        })
    );
    assert!(t.check(A + 401, 0).is_err());
    assert!(t.check(A - 1, 1).is_err());
    assert!(t.check(0, 0).is_err());
    assert!(t.check(A, u64::MAX).is_err());
    assert!(t.check(u64::MAX, 1).is_err());
    assert_eq!(t.free(B).map(|a| a.size), Ok(400));
    assert!(matches!(t.free(B), Err(OpError::NotFound(_))));
    assert!(t.check(B, 1).is_err());
    assert_eq!(t.used(), 800);
    assert_eq!(t.drain().len(), 2);
    assert_eq!(t.used(), 0);
    assert!(t.check(A, 1).is_err());
}

#[test]
fn test_unknown_entry_bad_shape_and_size() {
    let t = table();
    assert!(matches!(
        plan_builtin(
            "nope",
            [1, 1, 1],
            [1, 1, 1],
            &[],
            &t,
            FloatOperands::Aligned
        ),
        Err(OpError::NotFound(_))
    ));
    let p = abi::FillParams {
        dst: A,
        count: 1,
        value: 0,
        reserved: 0,
    };
    assert!(invalid(plan_builtin(
        "fill_u32",
        [0, 1, 1],
        [1, 1, 1],
        p.as_slice(),
        &t,
        FloatOperands::Aligned,
    )));
    assert!(invalid(plan_builtin(
        "fill_u32",
        [1, 1, 1],
        [1, 0, 1],
        p.as_slice(),
        &t,
        FloatOperands::Aligned,
    )));
    assert!(invalid(plan_builtin(
        "fill_u32",
        [1, 1, 1],
        [1, 1, 1],
        &p.as_slice()[..20],
        &t,
        FloatOperands::Aligned,
    )));
    // Any grid the guest gives is accepted: built-ins pick their own.
    assert!(plan_builtin(
        "fill_u32",
        [7, 3, 2],
        [1, 1, 1],
        p.as_slice(),
        &t,
        FloatOperands::Aligned
    )
    .is_ok());
}

#[test]
fn test_out_of_range_operands_are_refused() {
    let t = table();
    let huge = u64::MAX / 2; // n * 4 overflows
    let fill = |dst, count| abi::FillParams {
        dst,
        count,
        value: 1,
        reserved: 0,
    };
    assert!(oor(plan(&t, "fill_u32", fill(A, 101))));
    assert!(oor(plan(&t, "fill_u32", fill(A + 4, 100))));
    assert!(oor(plan(&t, "fill_u32", fill(A, huge))));
    assert!(oor(plan(&t, "fill_u32", fill(0, 1))));
    // Another partition's allocation is just an unknown address here.
    assert!(oor(plan(&t, "fill_u32", fill(A + 0x1000, 1))));

    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    assert!(oor(plan(&t, "copy", copy(A, B, 401))));
    assert!(oor(plan(&t, "copy", copy(A, B + 1, 400))));
    assert!(oor(plan(&t, "copy", copy(A + 1, B, 400))));
    assert!(oor(plan(&t, "copy", copy(A, B, u64::MAX))));

    let vadd = |c, a, b, n| abi::VaddParams { c, a, b, n };
    assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B, 101))));
    assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B + 4, 100))));
    assert!(oor(plan(&t, "vadd_f32", vadd(C + 4, A, B, 100))));
    assert!(oor(plan(&t, "vadd_f32", vadd(C, A, B, huge))));
    assert!(oor(plan(&t, "vadd_f32", vadd(C, 0, B, 1))));

    let saxpy = |y, x, n| abi::SaxpyParams {
        y,
        x,
        n,
        a: 2.0,
        reserved: 0,
    };
    assert!(oor(plan(&t, "saxpy_f32", saxpy(A, B + 4, 100))));
    assert!(oor(plan(&t, "saxpy_f32", saxpy(A + 400, B, 1))));
    assert!(oor(plan(&t, "saxpy_f32", saxpy(A, B, huge))));

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
    assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 10, 10, 11))));
    assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 11, 10, 10))));
    assert!(oor(plan(&t, "sgemm_f32", sgemm(C + 4, A, B, 10, 10, 10))));
    assert!(oor(plan(
        &t,
        "sgemm_f32",
        sgemm(C, A, B, u32::MAX, u32::MAX, 1)
    )));
    assert!(oor(plan(&t, "sgemm_f32", sgemm(C, A, B, 1, 1, u32::MAX))));
    // Empty shapes still need their pointers inside allocations.
    assert!(oor(plan(&t, "sgemm_f32", sgemm(0, A, B, 0, 0, 0))));

    let reduce = |out, input, n| abi::ReduceSumParams { out, input, n };
    assert!(oor(plan(&t, "reduce_sum_f32", reduce(A + 400, B, 1))));
    assert!(oor(plan(&t, "reduce_sum_f32", reduce(A + 397, B, 1))));
    assert!(oor(plan(&t, "reduce_sum_f32", reduce(A, B, 101))));
    assert!(oor(plan(&t, "reduce_sum_f32", reduce(A, B, huge))));

    // In range, the same calls pass.
    assert!(plan(&t, "sgemm_f32", sgemm(C, A, B, 10, 10, 10)).is_ok());
    assert!(plan(&t, "vadd_f32", vadd(C, A, B, 100)).is_ok());
}

#[test]
fn test_float_operands_must_be_aligned_but_fill_and_copy_need_not() {
    let t = table();
    let vadd = abi::VaddParams {
        c: C,
        a: A + 2,
        b: B,
        n: 10,
    };
    assert!(invalid(plan(&t, "vadd_f32", vadd)));
    let reduce = abi::ReduceSumParams {
        out: A + 1,
        input: B,
        n: 1,
    };
    assert!(invalid(plan(&t, "reduce_sum_f32", reduce)));
    let fill = abi::FillParams {
        dst: A + 1,
        count: 99,
        value: 7,
        reserved: 0,
    };
    assert_eq!(
        plan(&t, "fill_u32", fill),
        Ok(Builtin::Fill {
            dst: A + 1,
            count: 99,
            value: 7
        })
    );
    let copy = abi::CopyParams {
        dst: A + 3,
        src: B + 1,
        bytes: 300,
    };
    assert!(plan(&t, "copy", copy).is_ok());
}

#[test]
fn test_aliasing_decisions() {
    let t = table();
    // copy refuses overlap.
    let copy = abi::CopyParams {
        dst: A,
        src: A + 8,
        bytes: 16,
    };
    assert!(invalid(plan(&t, "copy", copy)));
    // vadd: exact aliasing is read in place, partial overlap copied.
    let v = |c, a, b| abi::VaddParams { c, a, b, n: 50 };
    assert_eq!(
        plan(&t, "vadd_f32", v(A, A, A)),
        Ok(Builtin::Vadd {
            c: A,
            a: A,
            b: A,
            n: 50,
            a_copy: false,
            b_copy: false
        })
    );
    assert_eq!(
        plan(&t, "vadd_f32", v(A + 4, A, B)),
        Ok(Builtin::Vadd {
            c: A + 4,
            a: A,
            b: B,
            n: 50,
            a_copy: true,
            b_copy: false
        })
    );
    // saxpy: x partly over y.
    let s = abi::SaxpyParams {
        y: A + 200,
        x: A + 196,
        n: 50,
        a: 1.0,
        reserved: 0,
    };
    assert!(matches!(
        plan(&t, "saxpy_f32", s),
        Ok(Builtin::Saxpy { x_copy: true, .. })
    ));
    // sgemm: any overlap of C with A or B.
    let g = abi::SgemmParams {
        c: A,
        a: A,
        b: B,
        m: 5,
        n: 5,
        k: 5,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    };
    assert!(matches!(
        plan(&t, "sgemm_f32", g),
        Ok(Builtin::Sgemm {
            a_copy: true,
            b_copy: false,
            ..
        })
    ));
    // k == 0 or alpha == 0 only scales C; m == 0 does nothing.
    assert_eq!(
        plan(&t, "sgemm_f32", abi::SgemmParams { k: 0, ..g }),
        Ok(Builtin::Scale {
            c: A,
            count: 25,
            beta: 0.0
        })
    );
    assert_eq!(
        plan(&t, "sgemm_f32", abi::SgemmParams { alpha: 0.0, ..g }),
        Ok(Builtin::Scale {
            c: A,
            count: 25,
            beta: 0.0
        })
    );
    assert_eq!(
        plan(&t, "sgemm_f32", abi::SgemmParams { m: 0, ..g }),
        Ok(Builtin::Nothing)
    );
    // reduce: out inside the input is fine (two passes).
    let r = abi::ReduceSumParams {
        out: A,
        input: A,
        n: 100,
    };
    assert!(plan(&t, "reduce_sum_f32", r).is_ok());
}

#[test]
fn test_module_launch_checks() {
    let limits = KernelLimits {
        param_bytes: Some(16),
        max_threads: 1024,
        max_dynamic_shared: 48 << 10,
    };
    let p = [0u8; 16];
    let ok = |g, b, s, p: &[u8]| check_module_launch("k", g, b, s, p, &limits);
    assert!(ok([1, 1, 1], [256, 1, 1], 0, &p).is_ok());
    assert!(ok([0, 1, 1], [256, 1, 1], 0, &p).is_err());
    assert!(ok([1, 1, 1], [32, 32, 2], 0, &p).is_err());
    assert!(ok([1, 1, 1], [32, 32, 1], 48 << 10, &p).is_ok());
    assert!(ok([1, 1, 1], [32, 32, 1], (48 << 10) + 1, &p).is_err());
    assert!(ok([1, 1, 1], [1, 1, 1], 0, &p[..15]).is_err());
    assert!(ok([1, 1, 1], [1, 1, 1], 0, &[0u8; 17]).is_err());
    let unknown = KernelLimits {
        param_bytes: None,
        ..limits
    };
    assert!(check_module_launch("k", [1; 3], [1; 3], 0, &[0u8; 40], &unknown).is_ok());
    // CUDA 12.1's 32,764 bytes of parameters, and no more.
    let most = vec![0u8; abi::MAX_PARAMS_SIZE as usize];
    assert_eq!(most.len(), 32764);
    assert!(check_module_launch("k", [1; 3], [1; 3], 0, &most, &unknown).is_ok());
    let over = vec![0u8; abi::MAX_PARAMS_SIZE as usize + 1];
    assert!(check_module_launch("k", [1; 3], [1; 3], 0, &over, &unknown).is_err());
}

#[test]
fn test_alloc_align_defaults_and_limits() {
    assert!(matches!(alloc_align(0, 0), Err(OpError::Invalid(_))));
    assert_eq!(alloc_align(1, 0), Ok(DEFAULT_ALIGN));
    assert_eq!(alloc_align(1, 1), Ok(1));
    assert!(matches!(alloc_align(16, 3), Err(OpError::Invalid(_))));
    assert!(matches!(alloc_align(16, 48), Err(OpError::Invalid(_))));
    assert_eq!(alloc_align(16, MAX_ALIGN), Ok(MAX_ALIGN));
    assert!(matches!(
        alloc_align(16, MAX_ALIGN * 2),
        Err(OpError::Invalid(_))
    ));
}

#[test]
fn test_admit_checks_quota_and_count() {
    let mut t = Allocations::default();
    assert_eq!(t.admit(10, 10), Ok(()));
    assert_eq!(
        t.admit(11, 10),
        Err(OpError::NoMemory {
            requested: 11,
            available: 10
        })
    );
    for i in 0..MAX_ALLOCATIONS as u64 {
        t.insert(i * 2, 1, 1, ());
    }
    assert!(matches!(t.admit(1, 10), Err(OpError::NoMemory { .. })));
}

#[test]
fn test_unaligned_float_operands_are_allowed_where_the_backend_says_so() {
    let t = table();
    let vadd = abi::VaddParams {
        c: C + 1,
        a: A + 2,
        b: B + 3,
        n: 10,
    };
    let raw = vadd.as_slice();
    let run = |f| plan_builtin("vadd_f32", [1; 3], [1; 3], raw, &t, f);
    assert!(matches!(
        run(FloatOperands::Aligned),
        Err(OpError::Invalid(_))
    ));
    assert!(run(FloatOperands::Unaligned).is_ok());
}

#[test]
fn a_cubin_must_hold_what_its_headers_name() {
    // An ELF header for EM_CUDA with one 64-byte section header at 64,
    // naming 16 bytes at offset 128.
    let mut e = vec![0u8; 128];
    e[..6].copy_from_slice(b"\x7fELF\x02\x01");
    e[18] = 190;
    e[0x28] = 64;
    e[0x3a] = 64;
    e[0x3c] = 1;
    e[64 + 4] = 1;
    e[64 + 0x18] = 128;
    e[64 + 0x20] = 16;
    assert!(matches!(cubin_image(&e), Err(OpError::Invalid(_))));
    e.resize(150, 0);
    assert_eq!(cubin_image(&e).map(<[u8]>::len), Ok(144));
    assert!(matches!(
        cubin_image(b"not an ELF"),
        Err(OpError::Invalid(_))
    ));
}

#[test]
fn test_requota_draws_on_and_gives_back_to_what_is_left() {
    let mut left = 100;
    requota(Some(&mut left), 10, 50, 120).unwrap();
    assert_eq!(left, 30);
    assert_eq!(
        requota(Some(&mut left), 10, 120, 200),
        Err(OpError::NoMemory {
            requested: 80,
            available: 30
        })
    );
    assert_eq!(left, 30);
    requota(Some(&mut left), 10, 120, 10).unwrap();
    assert_eq!(left, 140);
    let below = requota(Some(&mut left), 10, 10, 9).unwrap_err();
    assert!(matches!(below, OpError::Invalid(_)), "{below:?}");
    assert_eq!(left, 140);
    // A context draws on nothing, but is held to what it uses.
    requota(None, 10, 10, 1 << 40).unwrap();
    assert!(requota(None, 10, 10, 5).is_err());
}
