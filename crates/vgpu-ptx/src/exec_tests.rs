//! Instruction families against reference values, on small hand-written
//! kernels: each writes its results to `out` as 64-bit values.

use super::*;

const OUT: u64 = 0x10_0000;

fn module(body: &str, regs: &str) -> Module {
    let text = format!(
        ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 out)\n{{\n\
         .reg .pred %p<8>;\n.reg .b16 %h<8>;\n.reg .b32 %r<32>;\n.reg .b64 %rd<32>;\n.reg .f32 %f<16>;\n.reg .f64 %fd<8>;\n{regs}\n\
         ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nmul.wide.u32 %rd1, %r0, 8;\nadd.s64 %rd2, %rd0, %rd1;\n{body}\nret;\n}}\n"
    );
    Module::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Runs `body` on `threads` threads of `blocks` blocks; `%rd2` points at
/// the thread's slot of `out`, `%r0` is `%tid.x`.
fn run_on(body: &str, blocks: u32, threads: u32, slots: usize) -> Result<Vec<u64>, ExecError> {
    let m = module(body, "");
    let mem = VecMemory::new(OUT, slots * 8);
    let cfg = LaunchConfig {
        grid: [blocks, 1, 1],
        block: [threads, 1, 1],
        shared_dyn: 0,
        workers: 4,
    };
    let limits = Limits {
        max_steps: Some(10_000_000),
        ..Limits::default()
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &limits)?;
    let b = mem.to_bytes();
    Ok(b.chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// Thread 0 evaluates each `(instructions, result register)`; results in order.
fn eval(cases: &[(&str, &str)]) -> Vec<u64> {
    let mut body = String::new();
    for (i, (code, reg)) in cases.iter().enumerate() {
        let w = if reg.starts_with("%rd") || reg.starts_with("%fd") {
            "b64"
        } else if reg.starts_with("%h") {
            "b16"
        } else if reg.starts_with("%p") {
            "pred"
        } else {
            "b32"
        };
        body.push_str(code);
        body.push('\n');
        match w {
            "b64" => body.push_str(&format!("st.global.b64 [%rd0+{}], {reg};\n", i * 8)),
            "b16" => body.push_str(&format!("st.global.b16 [%rd0+{}], {reg};\n", i * 8)),
            "pred" => body.push_str(&format!(
                "selp.u32 %r31, 1, 0, {reg};\nst.global.b32 [%rd0+{}], %r31;\n",
                i * 8
            )),
            _ => body.push_str(&format!("st.global.b32 [%rd0+{}], {reg};\n", i * 8)),
        }
    }
    run_on(&body, 1, 1, cases.len()).unwrap()
}

fn f32c(v: f32) -> String {
    format!("0f{:08X}", v.to_bits())
}

#[test]
fn integer_arithmetic() {
    let r = eval(&[
        ("mov.u32 %r1, 0xffffffff; add.u32 %r2, %r1, 2;", "%r2"),
        ("mov.u32 %r1, 0x80000000; sub.s32 %r2, %r1, 1;", "%r2"),
        ("mov.u32 %r1, 0x10000; mul.lo.u32 %r2, %r1, %r1;", "%r2"),
        ("mov.u32 %r1, -3; mul.hi.s32 %r2, %r1, 0x40000000;", "%r2"),
        ("mov.u32 %r1, 0xffffffff; mul.hi.u32 %r2, %r1, %r1;", "%r2"),
        ("mov.u32 %r1, -7; mul.wide.s32 %rd3, %r1, 100000;", "%rd3"),
        (
            "mov.u32 %r1, 0xffffffff; mul.wide.u32 %rd3, %r1, %r1;",
            "%rd3",
        ),
        (
            "mov.u32 %r1, 0xffffffff; mov.u64 %rd4, 5; mad.wide.u32 %rd3, %r1, 2, %rd4;",
            "%rd3",
        ),
        ("mov.u32 %r1, 7; mad.lo.s32 %r2, %r1, -3, 100;", "%r2"),
        (
            "mov.u32 %r1, 7; mov.u32 %r3, 0; div.u32 %r2, %r1, %r3;",
            "%r2",
        ),
        (
            "mov.u32 %r1, 7; mov.u32 %r3, 0; rem.u32 %r2, %r1, %r3;",
            "%r2",
        ),
        ("mov.u32 %r1, 0x80000000; div.s32 %r2, %r1, -1;", "%r2"),
        ("mov.u32 %r1, -7; div.s32 %r2, %r1, 2;", "%r2"),
        ("mov.u32 %r1, -7; rem.s32 %r2, %r1, 2;", "%r2"),
        (
            "mov.u32 %r1, 0x7ffffff0; add.sat.s32 %r2, %r1, 0x100;",
            "%r2",
        ),
        ("mov.u32 %r1, -5; min.s32 %r2, %r1, 3;", "%r2"),
        ("mov.u32 %r1, -5; min.u32 %r2, %r1, 3;", "%r2"),
        ("mov.u32 %r1, -5; max.s32 %r2, %r1, 3;", "%r2"),
        (
            "mov.u32 %r1, 1; mov.u32 %r3, 40; shl.b32 %r2, %r1, %r3;",
            "%r2",
        ),
        ("mov.u32 %r1, -16; shr.s32 %r2, %r1, 2;", "%r2"),
        (
            "mov.u32 %r1, -16; mov.u32 %r3, 99; shr.s32 %r2, %r1, %r3;",
            "%r2",
        ),
        ("mov.u32 %r1, -16; shr.u32 %r2, %r1, 2;", "%r2"),
        ("mov.u32 %r1, -9; abs.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 9; neg.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0xf0f0; not.b32 %r2, %r1;", "%r2"),
        ("mov.u64 %rd4, 0x123456789; shl.b64 %rd3, %rd4, 30;", "%rd3"),
        ("mov.u32 %r1, 0x00ffffff; mul24.lo.u32 %r2, %r1, 2;", "%r2"),
        (
            "mov.u32 %r1, 0x01000003; mad24.lo.u32 %r2, %r1, 2, 1;",
            "%r2",
        ),
        ("mov.b16 %h1, 0xfffe; add.u16 %h2, %h1, 3;", "%h2"),
        (
            "mov.u64 %rd4, -1; mov.u64 %rd5, 0; div.s64 %rd3, %rd4, %rd5;",
            "%rd3",
        ),
    ]);
    let want: Vec<u64> = vec![
        1,
        0x7fff_ffff,
        0,
        ((-3i64 * 0x4000_0000) >> 32) as u32 as u64,
        0xffff_fffe,
        (-700_000i64) as u64,
        0xffff_fffe_0000_0001,
        0x1_ffff_fffe + 5,
        79,
        0xffff_ffff,
        7,
        0x8000_0000,
        (-3i32) as u32 as u64,
        (-1i32) as u32 as u64,
        0x7fff_ffff,
        (-5i32) as u32 as u64,
        3,
        3,
        0,
        (-4i32) as u32 as u64,
        0xffff_ffff,
        0x3fff_fffc,
        9,
        (-9i32) as u32 as u64,
        0xffff_0f0f,
        0x1_2345_6789u64 << 30,
        0x01ff_fffe,
        7,
        1,
        u64::MAX,
    ];
    for (i, (g, w)) in r.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "case {i}: {g:#x} != {w:#x}");
    }
}

#[test]
fn bit_manipulation() {
    let r = eval(&[
        ("mov.u32 %r1, 0xf00f0001; popc.b32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0x00010000; clz.b32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0; clz.b32 %r2, %r1;", "%r2"),
        ("mov.u64 %rd4, 1; clz.b64 %r2, %rd4;", "%r2"),
        ("mov.u32 %r1, 1; brev.b32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0xabcd1234; bfe.u32 %r2, %r1, 8, 12;", "%r2"),
        ("mov.u32 %r1, 0x00008000; bfe.s32 %r2, %r1, 12, 4;", "%r2"),
        ("mov.u32 %r1, 0x12345678; bfe.u32 %r2, %r1, 40, 4;", "%r2"),
        ("mov.u32 %r1, 0xffffffff; mov.u32 %r3, 0; bfi.b32 %r2, %r1, %r3, 4, 8;", "%r2"),
        ("mov.u32 %r1, 0x44332211; mov.u32 %r3, 0x88776655; prmt.b32 %r2, %r1, %r3, 0x7531;", "%r2"),
        ("mov.u32 %r1, 0x44332281; prmt.b32 %r2, %r1, 0, 0x8880;", "%r2"),
        ("mov.u32 %r1, 0xff00ff00; mov.u32 %r3, 0xf0f0f0f0; lop3.b32 %r2, %r1, %r3, 0xcccccccc, 0x96;", "%r2"),
        ("mov.u32 %r1, 0x80000001; shf.l.wrap.b32 %r2, %r1, %r1, 1;", "%r2"),
        ("mov.u32 %r1, 0x12345678; mov.u32 %r3, 0x9abcdef0; shf.r.clamp.b32 %r2, %r1, %r3, 8;", "%r2"),
        ("mov.b64 %rd3, {%r0, %r0}; mov.u32 %r1, 5; mov.u32 %r3, 7; mov.b64 %rd3, {%r1, %r3};", "%rd3"),
        ("mov.u64 %rd4, 0x0000000700000005; mov.b64 {%r1, %r3}, %rd4; sub.s32 %r2, %r3, %r1;", "%r2"),
    ]);
    let want: Vec<u64> = vec![
        9,
        15,
        32,
        63,
        0x8000_0000,
        0xd12,
        0xffff_fff8,
        0,
        0xff0,
        0x8866_4422,
        0xffff_ff81,
        (0xff00ff00u32 ^ 0xf0f0f0f0 ^ 0xcccccccc) as u64,
        3,
        0xf012_3456,
        0x7_0000_0005,
        2,
    ];
    for (i, (g, w)) in r.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "case {i}: {g:#x} != {w:#x}");
    }
}

#[test]
fn float_and_conversions() {
    let nan = "0f7FC00000";
    let r = eval(&[
        (&format!("mov.f32 %f1, {}; cvt.rni.s32.f32 %r2, %f1;", f32c(2.5)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rni.s32.f32 %r2, %f1;", f32c(3.5)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rmi.s32.f32 %r2, %f1;", f32c(-1.5)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rpi.s32.f32 %r2, %f1;", f32c(1.1)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rzi.s32.f32 %r2, %f1;", f32c(-1.9)), "%r2"),
        (&format!("mov.f32 %f1, {nan}; cvt.rzi.s32.f32 %r2, %f1;"), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rzi.s32.f32 %r2, %f1;", f32c(1e10)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rzi.u32.f32 %r2, %f1;", f32c(-5.0)), "%r2"),
        ("mov.u32 %r1, 300; cvt.sat.u8.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, -300; cvt.sat.s8.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0x1ff; cvt.s8.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, -2; cvt.s64.s32 %rd3, %r1;", "%rd3"),
        ("mov.u32 %r1, -2; cvt.u64.u32 %rd3, %r1;", "%rd3"),
        ("mov.u32 %r1, 16777217; cvt.rn.f32.u32 %f2, %r1; mov.b32 %r2, %f2;", "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rn.f16.f32 %h2, %f1;", f32c(1.0 / 3.0)), "%h2"),
        (&format!("mov.f32 %f1, {}; cvt.rn.f16.f32 %h2, %f1;", f32c(70000.0)), "%h2"),
        ("mov.b16 %h1, 0x3555; cvt.f32.f16 %f2, %h1; mov.b32 %r2, %f2;", "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rn.bf16.f32 %h2, %f1;", f32c(1.0 / 3.0)), "%h2"),
        ("mov.f64 %fd1, 0d3FF0000000000001; cvt.rn.f32.f64 %f2, %fd1; mov.b32 %r2, %f2;", "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.sat.f32.f32 %f2, %f1; mov.b32 %r2, %f2;", f32c(1.5)), "%r2"),
        (&format!("mov.f32 %f1, {}; cvt.rmi.f32.f32 %f2, %f1; mov.b32 %r2, %f2;", f32c(-0.5)), "%r2"),
        (&format!("mov.f32 %f1, {}; mov.f32 %f3, {}; fma.rn.f32 %f2, %f1, %f1, %f3; mov.b32 %r2, %f2;", f32c(1.0 + f32::EPSILON), f32c(-1.0)), "%r2"),
        (&format!("mov.f32 %f1, {}; sqrt.rn.f32 %f2, %f1; mov.b32 %r2, %f2;", f32c(2.0)), "%r2"),
        (&format!("mov.f32 %f1, {}; rcp.rn.f32 %f2, %f1; mov.b32 %r2, %f2;", f32c(3.0)), "%r2"),
        (&format!("mov.f32 %f1, {}; div.rn.f32 %f2, %f1, 0f00000000; mov.b32 %r2, %f2;", f32c(1.0)), "%r2"),
        (&format!("mov.f32 %f1, {}; mov.f32 %f3, {}; copysign.f32 %f2, %f1, %f3; mov.b32 %r2, %f2;", f32c(-1.0), f32c(2.0)), "%r2"),
        (&format!("mov.f32 %f1, {nan}; min.f32 %f2, %f1, 0f3F800000; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("mov.f32 %f1, {nan}; testp.notanumber.f32 %p1, %f1;"), "%p1"),
        ("mov.f64 %fd1, 0d4000000000000000; mul.f64 %fd2, %fd1, %fd1; fma.rn.f64 %fd3, %fd2, %fd1, %fd1;", "%fd3"),
        ("mov.u64 %rd4, -3; cvt.rn.f64.s64 %fd2, %rd4;", "%fd2"),
    ]);
    let want: Vec<u64> = vec![
        2,
        4,
        (-2i32) as u32 as u64,
        2,
        (-1i32) as u32 as u64,
        0,
        0x7fff_ffff,
        0,
        255,
        0xffff_ff80,
        0xffff_ffff,
        (-2i64) as u64,
        0xffff_fffe,
        16777216f32.to_bits() as u64,
        0x3555,
        0x7c00,
        0.333_251_95f32.to_bits() as u64,
        0x3eab,
        1.0f32.to_bits() as u64,
        1.0f32.to_bits() as u64,
        (-1.0f32).to_bits() as u64,
        (1.0f32 + f32::EPSILON)
            .mul_add(1.0 + f32::EPSILON, -1.0)
            .to_bits() as u64,
        2f32.sqrt().to_bits() as u64,
        (1.0f32 / 3.0).to_bits() as u64,
        f32::INFINITY.to_bits() as u64,
        (-2.0f32).to_bits() as u64,
        1.0f32.to_bits() as u64,
        1,
        10.0f64.to_bits(),
        (-3.0f64).to_bits(),
    ];
    for (i, (g, w)) in r.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "case {i}: {g:#x} != {w:#x}");
    }
}

#[test]
fn comparisons_and_select() {
    let nan = "0f7FC00000";
    let one = "0f3F800000";
    let r = eval(&[
        (&format!("mov.f32 %f1, {nan}; setp.lt.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {nan}; setp.ltu.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {nan}; setp.ne.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {nan}; setp.neu.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {nan}; setp.nan.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {one}; setp.num.f32 %p1, %f1, {one};"), "%p1"),
        (&format!("mov.f32 %f1, {one}; setp.geu.f32 %p1, %f1, {one};"), "%p1"),
        ("mov.u32 %r1, -1; setp.lt.s32 %p1, %r1, 1;", "%p1"),
        ("mov.u32 %r1, -1; setp.lo.u32 %p1, %r1, 1;", "%p1"),
        ("mov.u32 %r1, -1; setp.hs.u32 %p1, %r1, 1;", "%p1"),
        ("mov.u32 %r1, 3; setp.eq.s32 %p2, %r1, 3; setp.gt.and.s32 %p1, %r1, 5, %p2;", "%p1"),
        ("mov.u32 %r1, 3; setp.eq.s32 %p2, %r1, 3; setp.gt.or.s32 %p1, %r1, 5, %p2;", "%p1"),
        ("mov.u32 %r1, 3; setp.eq.s32 %p2, %r1, 3; setp.gt.and.s32 %p3|%p1, %r1, 5, !%p2;", "%p1"),
        ("mov.u32 %r1, 3; setp.eq.s32 %p2, %r1, 3; setp.gt.and.s32 %p3|%p1, %r1, 5, %p2;", "%p1"),
        ("mov.u32 %r1, 3; setp.ne.s32 %p2, %r1, 3; selp.b32 %r2, 10, 20, %p2;", "%r2"),
        ("mov.u32 %r1, 3; setp.eq.s32 %p2, %r1, 3; not.pred %p1, %p2; or.pred %p3, %p1, %p2; xor.pred %p1, %p3, %p2;", "%p1"),
        ("mov.u32 %r1, 7; setp.eq.s32 %p2, %r1, 7; @%p2 mov.u32 %r2, 1; @!%p2 mov.u32 %r2, 2;", "%r2"),
    ]);
    assert_eq!(r, vec![0, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 20, 0, 1]);
}

#[test]
fn divergence_reconverges() {
    // Odd lanes loop tid times, even lanes take an if/else; all meet at the
    // shuffle, which sees every lane's value.
    let body = "
        and.b32 %r1, %r0, 1;
        setp.eq.s32 %p1, %r1, 0;
        mov.u32 %r2, 0;
        @%p1 bra EVEN;
        mov.u32 %r3, 0;
    LOOP:
        add.u32 %r2, %r2, 3;
        add.u32 %r3, %r3, 1;
        setp.lt.u32 %p2, %r3, %r0;
        @%p2 bra LOOP;
        bra JOIN;
    EVEN:
        setp.lt.u32 %p3, %r0, 16;
        @%p3 bra LOW;
        mov.u32 %r2, 1000;
        bra JOIN;
    LOW:
        mov.u32 %r2, 500;
    JOIN:
        shfl.sync.bfly.b32 %r4, %r2, 1, 31, -1;
        vote.sync.ballot.b32 %r5, %p1, -1;
        add.u32 %r6, %r2, %r4;
        cvt.u64.u32 %rd3, %r6;
        shl.b64 %rd3, %rd3, 32;
        cvt.u64.u32 %rd4, %r5;
        or.b64 %rd3, %rd3, %rd4;
        st.global.u64 [%rd2], %rd3;";
    let r = run_on(body, 1, 64, 64).unwrap();
    let val = |t: u64| {
        if t & 1 == 1 {
            3 * t.max(1)
        } else if t < 16 {
            500
        } else {
            1000
        }
    };
    for (t, got) in r.iter().enumerate() {
        let t = t as u64;
        let want = ((val(t) + val(t ^ 1)) << 32) | 0x5555_5555;
        assert_eq!(*got, want, "thread {t}");
    }
}

#[test]
fn shuffles_with_segments() {
    // Width 8 (c = ((32-8)<<8) | 31): lanes see only their segment.
    let body = "
        shfl.sync.down.b32 %r1|%p1, %r0, 3, 0x181f, -1;
        shfl.sync.up.b32 %r2|%p2, %r0, 2, 0x1800, -1;
        shfl.sync.idx.b32 %r3, %r0, 5, 0x181f, -1;
        shfl.sync.bfly.b32 %r4, %r0, 4, 0x181f, -1;
        selp.u32 %r5, 1, 0, %p1;
        selp.u32 %r6, 1, 0, %p2;
        shl.b32 %r5, %r5, 1;
        or.b32 %r5, %r5, %r6;
        shl.b32 %r1, %r1, 24;
        shl.b32 %r2, %r2, 16;
        shl.b32 %r3, %r3, 8;
        or.b32 %r1, %r1, %r2;
        or.b32 %r1, %r1, %r3;
        or.b32 %r1, %r1, %r4;
        cvt.u64.u32 %rd3, %r1;
        cvt.u64.u32 %rd4, %r5;
        shl.b64 %rd4, %rd4, 32;
        or.b64 %rd3, %rd3, %rd4;
        st.global.u64 [%rd2], %rd3;";
    let r = run_on(body, 1, 32, 32).unwrap();
    for l in 0..32u64 {
        let seg = l & !7;
        let (down, pd) = if (l % 8) + 3 <= 7 { (l + 3, 1) } else { (l, 0) };
        let (up, pu) = if l % 8 >= 2 { (l - 2, 1) } else { (l, 0) };
        let idx = seg + 5;
        let bfly = l ^ 4;
        let want = ((pd << 1 | pu) << 32) | (down << 24) | (up << 16) | (idx << 8) | bfly;
        assert_eq!(r[l as usize], want, "lane {l}");
    }
}

#[test]
fn atomics_under_contention() {
    // 64 blocks of 256 threads on 4 workers hammer slot 0..7.
    let body = "
        atom.global.add.u32 %r1, [%rd0], 1;
        atom.global.add.u64 %rd3, [%rd0+8], 3;
        atom.global.max.s32 %r2, [%rd0+16], %r0;
        atom.global.inc.u32 %r2, [%rd0+24], 99;
        add.s64 %rd5, %rd0, 32;
        atom.global.add.f32 %f1, [%rd5], 0f3F000000;
        red.global.or.b32 [%rd0+40], 1;
        atom.global.exch.b32 %r2, [%rd0+44], 7;
    CAS:
        ld.volatile.global.u32 %r3, [%rd0+48];
        add.u32 %r4, %r3, 2;
        atom.global.cas.b32 %r5, [%rd0+48], %r3, %r4;
        setp.ne.s32 %p1, %r5, %r3;
        @%p1 bra CAS;";
    let m = module(body, "");
    let mem = VecMemory::new(OUT, 64);
    let cfg = LaunchConfig {
        grid: [64, 1, 1],
        block: [256, 1, 1],
        shared_dyn: 0,
        workers: 4,
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
    let n = 64 * 256u64;
    let b = mem.to_bytes();
    let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64;
    assert_eq!(u32at(0), n);
    assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 3 * n);
    assert_eq!(u32at(16), 255);
    assert_eq!(u32at(24), n % 100);
    assert_eq!(f32::from_bits(u32at(32) as u32), n as f32 * 0.5);
    assert_eq!(u32at(40), 1);
    assert_eq!(u32at(44), 7);
    assert_eq!(u32at(48), 2 * n);
}

#[test]
fn shared_memory_atomics_and_barriers() {
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n.shared .align 4 .b8 cnt[8];\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n.reg .pred %p<2>;\n\
        ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nmov.u32 %r1, cnt;\n\
        atom.shared.add.u32 %r2, [%r1], %r0;\natom.shared.min.s32 %r2, [cnt+4], %r0;\nbar.sync 0;\n\
        setp.ne.s32 %p1, %r0, 0;\n@%p1 bra END;\nld.shared.u32 %r3, [cnt];\nld.shared.u32 %r4, [cnt+4];\n\
        mov.u32 %r5, %ctaid.x;\nmul.wide.u32 %rd1, %r5, 8;\nadd.s64 %rd2, %rd0, %rd1;\nst.global.v2.u32 [%rd2], {%r3, %r4};\nEND:\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8 * 8);
    let cfg = LaunchConfig {
        grid: [8, 1, 1],
        block: [200, 1, 1],
        shared_dyn: 0,
        workers: 3,
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
    let b = mem.to_bytes();
    for blk in 0..8 {
        let s = u32::from_le_bytes(b[blk * 8..blk * 8 + 4].try_into().unwrap());
        let mn = u32::from_le_bytes(b[blk * 8 + 4..blk * 8 + 8].try_into().unwrap());
        assert_eq!(s, 199 * 200 / 2);
        assert_eq!(mn, 0);
    }
}

#[test]
fn never_ending_kernels_are_stopped() {
    let body = "LOOP:\nadd.u32 %r1, %r1, 1;\nbra.uni LOOP;";
    let m = module(body, "");
    let mem = VecMemory::new(OUT, 8);
    let cfg = LaunchConfig {
        grid: [4, 1, 1],
        block: [64, 1, 1],
        shared_dyn: 0,
        workers: 2,
    };
    let l = Limits {
        max_steps: Some(100_000),
        ..Limits::default()
    };
    assert_eq!(
        launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l),
        Err(ExecError::Timeout)
    );
    let l = Limits {
        deadline: Some(Instant::now() + std::time::Duration::from_millis(50)),
        ..Limits::default()
    };
    let t = Instant::now();
    assert_eq!(
        launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l),
        Err(ExecError::Timeout)
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    let flag = AtomicBool::new(true);
    let l = Limits {
        cancel: Some(&flag),
        ..Limits::default()
    };
    assert_eq!(
        launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l),
        Err(ExecError::Cancelled)
    );
}

#[test]
fn bad_accesses_fault() {
    let r = run_on("mov.u64 %rd3, 0x10; ld.global.u32 %r1, [%rd3];", 1, 1, 1);
    assert_eq!(
        r,
        Err(ExecError::IllegalAddress {
            addr: 0x10,
            size: 4,
            line: 17
        })
    );
    let r = run_on("mov.u32 %r1, 4096; ld.shared.u32 %r2, [%r1];", 1, 1, 1);
    assert!(
        matches!(r, Err(ExecError::IllegalAddress { addr: 4096, .. })),
        "{r:?}"
    );
    let r = run_on("st.global.u32 [%rd2+8], %r0;", 1, 1, 1);
    assert!(matches!(r, Err(ExecError::IllegalAddress { .. })), "{r:?}");
    let r = run_on("ld.param.u32 %r1, [out+8];", 1, 1, 1);
    assert!(matches!(r, Err(ExecError::IllegalAddress { .. })), "{r:?}");
    let r = run_on("trap;", 1, 1, 1);
    assert_eq!(r, Err(ExecError::Trap(17)));
}

#[test]
fn local_memory_and_calls() {
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .func (.param .b32 ret) sq(.param .b32 x)\n{\n.reg .b32 %r<3>;\n.local .align 4 .b8 tmp[8];\n\
        ld.param.u32 %r1, [x];\nmul.lo.s32 %r2, %r1, %r1;\nst.local.u32 [tmp+4], %r2;\nld.local.u32 %r2, [tmp+4];\nst.param.b32 [ret], %r2;\nret;\n}\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<6>;\n.reg .b64 %rd<8>;\n.local .align 8 .b8 depot[128];\n\
        ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nmov.u64 %rd4, depot;\ncvta.local.u64 %rd5, %rd4;\n\
        and.b32 %r4, %r0, 31;\nmul.wide.u32 %rd1, %r4, 4;\nadd.s64 %rd6, %rd5, %rd1;\nst.u32 [%rd6], %r0;\n\
        { .param .b32 a; st.param.b32 [a], %r0; .param .b32 r; call.uni (r), sq, (a); ld.param.b32 %r1, [r]; }\n\
        ld.u32 %r2, [%rd6];\nadd.u32 %r3, %r1, %r2;\nmul.wide.u32 %rd1, %r0, 8;\nadd.s64 %rd2, %rd0, %rd1;\nst.global.u32 [%rd2], %r3;\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    assert_eq!(m.kernel("k").unwrap().local_per_thread, 8 + 128);
    let mem = VecMemory::new(OUT, 8 * 96);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [96, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
    let b = mem.to_bytes();
    for t in 0..96usize {
        assert_eq!(
            u32::from_le_bytes(b[t * 8..t * 8 + 4].try_into().unwrap()) as usize,
            t * t + t
        );
    }
    let l = Limits {
        max_local_per_thread: 64,
        ..Limits::default()
    };
    assert!(matches!(
        launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l),
        Err(ExecError::LocalTooLarge { .. })
    ));
}

#[test]
fn recursion_is_refused() {
    let text =
        ".version 8.5\n.target sm_90\n.address_size 64\n.func f()\n{\ncall.uni f, ();\nret;\n}\n\
        .visible .entry k()\n{\ncall.uni f, ();\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    assert!(matches!(
        launch(&m, "k", &cfg, &[], &mem, &Limits::default()),
        Err(ExecError::Unsupported { .. })
    ));
}

#[test]
fn special_registers() {
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n\
        ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nmov.u32 %r1, %tid.y;\nmov.u32 %r2, %ntid.x;\nmad.lo.s32 %r3, %r1, %r2, %r0;\n\
        mov.u32 %r4, %ctaid.y;\nmov.u32 %r5, %nctaid.x;\nmov.u32 %r6, %ctaid.x;\nmad.lo.s32 %r7, %r4, %r5, %r6;\n\
        mov.u32 %r8, %laneid;\nmov.u32 %r9, %warpid;\nmov.u32 %r10, %lanemask_lt;\n\
        shl.b32 %r7, %r7, 6;\nadd.s32 %r11, %r7, %r3;\nmul.wide.u32 %rd1, %r11, 8;\nadd.s64 %rd2, %rd0, %rd1;\n\
        shl.b32 %r9, %r9, 8;\nor.b32 %r8, %r8, %r9;\nst.global.v2.u32 [%rd2], {%r8, %r10};\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8 * 64 * 6);
    let cfg = LaunchConfig {
        grid: [3, 2, 1],
        block: [8, 8, 1],
        shared_dyn: 0,
        workers: 2,
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
    let b = mem.to_bytes();
    for i in 0..64 * 6 {
        let t = (i % 64) as u32;
        let lane = u32::from_le_bytes(b[i * 8..i * 8 + 4].try_into().unwrap());
        let lt = u32::from_le_bytes(b[i * 8 + 4..i * 8 + 8].try_into().unwrap());
        assert_eq!(lane, (t % 32) | (t / 32) << 8, "{i}");
        assert_eq!(lt, (1u32 << (t % 32)) - 1, "{i}");
    }
}

#[test]
fn directed_rounding_ftz_and_sat() {
    let third = "0f3EAAAAAB"; // nearest f32 to 1/3, above it
    let one = "0f3F800000";
    let three = "0f40400000";
    let tiny = "0f00000001"; // smallest subnormal
    let big = "0f7F7FFFFF";
    let r = eval(&[
        (&format!("div.rz.f32 %f2, {one}, {three}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("div.rp.f32 %f2, {one}, {three}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("div.rm.f32 %f2, {one}, {three}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("add.rp.f32 %f2, {one}, {tiny}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("add.rm.f32 %f2, {one}, {tiny}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("sub.rz.f32 %f2, {one}, {tiny}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("mul.rz.f32 %f2, {big}, {three}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("mul.rn.f32 %f2, {big}, {three}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("mov.f32 %f1, {third}; fma.rz.f32 %f2, %f1, {three}, 0fBF800000; mov.b32 %r2, %f2;"), "%r2"),
        ("sqrt.rp.f32 %f2, 0f40000000; mov.b32 %r2, %f2;", "%r2"),
        ("sqrt.rm.f32 %f2, 0f40000000; mov.b32 %r2, %f2;", "%r2"),
        (&format!("add.ftz.f32 %f2, {tiny}, {tiny}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("add.f32 %f2, {tiny}, {tiny}; mov.b32 %r2, %f2;"), "%r2"),
        (&format!("add.sat.f32 %f2, {one}, {one}; mov.b32 %r2, %f2;"), "%r2"),
        ("mov.f32 %f1, 0fBF800000; mul.sat.f32 %f2, %f1, %f1; neg.f32 %f2, %f2; max.sat.f32 %f3, %f2, 0fC0000000; mov.b32 %r2, %f3;", "%r2"),
        ("mov.f64 %fd1, 0d3FF0000000000000; div.rz.f64 %fd2, %fd1, 0d4008000000000000;", "%fd2"),
        ("mov.f64 %fd1, 0d3FF0000000000000; div.rp.f64 %fd2, %fd1, 0d4008000000000000;", "%fd2"),
        ("mov.u32 %r1, 16777217; cvt.rp.f32.u32 %f2, %r1; mov.b32 %r2, %f2;", "%r2"),
        ("mov.u32 %r1, 16777217; cvt.rz.f32.u32 %f2, %r1; mov.b32 %r2, %f2;", "%r2"),
        ("mov.u32 %r1, -16777217; cvt.rm.f32.s32 %f2, %r1; mov.b32 %r2, %f2;", "%r2"),
        ("mov.f64 %fd1, 0d3FD5555555555555; cvt.rp.f32.f64 %f2, %fd1; mov.b32 %r2, %f2;", "%r2"),
        ("mov.f64 %fd1, 0d3FD5555555555555; cvt.rz.f32.f64 %f2, %fd1; mov.b32 %r2, %f2;", "%r2"),
        ("mov.f64 %fd1, 0d3FD5555555555555; cvt.rn.f32.f64 %f2, %fd1; mov.b32 %r2, %f2;", "%r2"),
        (&format!("sub.rm.f32 %f2, {one}, {one}; mov.b32 %r2, %f2;"), "%r2"),
    ]);
    let t = (1.0f32 / 3.0).to_bits() as u64;
    let want: Vec<u64> = vec![
        t - 1,
        t,
        t - 1,
        1.0f32.next_up().to_bits() as u64,
        1.0f32.to_bits() as u64,
        1.0f32.next_down().to_bits() as u64,
        f32::MAX.to_bits() as u64,
        f32::INFINITY.to_bits() as u64,
        // 3 * 0x3EAAAAAB = 1 + 2^-25 exactly: minus one is 2^-25.
        (2.0f32).powi(-25).to_bits() as u64,
        // The nearest f32 to sqrt(2) lies below it.
        2f32.sqrt().next_up().to_bits() as u64,
        2f32.sqrt().to_bits() as u64,
        0,
        2,
        1.0f32.to_bits() as u64,
        0,
        // The nearest f64 to 1/3 lies below it (the f32 one above).
        (1.0f64 / 3.0).to_bits(),
        (1.0f64 / 3.0).to_bits() + 1,
        16777218f32.to_bits() as u64,
        16777216f32.to_bits() as u64,
        (-16777218f32).to_bits() as u64,
        t,
        t - 1,
        t,
        (-0.0f32).to_bits() as u64,
    ];
    for (i, (g, w)) in r.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "case {i}: {g:#x} != {w:#x}");
    }
    let bad = Module::parse(".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n.reg .f64 %fd<3>;\nfma.rz.f64 %fd1, %fd1, %fd1, %fd1;\n}\n");
    let bad = bad.unwrap();
    assert!(bad.refused("k").unwrap().msg.contains("rounding mode"));
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    let e = launch(
        &bad,
        "k",
        &cfg,
        &[],
        &VecMemory::new(0, 0),
        &Limits::default(),
    );
    assert!(
        matches!(&e, Err(ExecError::Refused(p)) if p.line == 7),
        "{e:?}"
    );
}

#[test]
fn carry_chains_and_bit_search() {
    let r = eval(&[
        // (2^64 - 1) + 1 over two 64-bit words: low 0, high 1.
        ("mov.u64 %rd4, -1; add.cc.u64 %rd5, %rd4, 1; addc.u64 %rd3, 0, 0; add.u64 %rd3, %rd3, %rd5;", "%rd3"),
        ("mov.u32 %r1, 0; sub.cc.u32 %r2, %r1, 1; subc.u32 %r3, 5, 0; mov.u32 %r2, %r3;", "%r2"),
        ("mov.u32 %r1, 0xffffffff; mad.lo.cc.u32 %r2, %r1, %r1, %r1; madc.hi.u32 %r3, %r1, %r1, 0; mov.u32 %r2, %r3;", "%r2"),
        ("mov.u32 %r1, 0x00012345; bfind.u32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0; bfind.u32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, -2; bfind.s32 %r2, %r1;", "%r2"),
        ("mov.u32 %r1, 0x00012345; bfind.shiftamt.u32 %r2, %r1;", "%r2"),
    ]);
    assert_eq!(r, vec![1, 4, 0xffff_ffff, 16, 0xffff_ffff, 0, 15]);
}

#[test]
fn warp_collectives() {
    // Lanes 0..24 active (the others exit first).
    let body = "
        setp.ge.u32 %p1, %r0, 24;
        @%p1 bra DONE;
        redux.sync.add.u32 %r1, %r0, 0xffffff;
        redux.sync.max.s32 %r2, %r0, 0xffffff;
        and.b32 %r3, %r0, 3;
        match.any.sync.b32 %r4, %r3, 0xffffff;
        elect.sync %r5|%p2, 0xffffff;
        selp.u32 %r6, 1, 0, %p2;
        mov.u64 %rd5, %rd2;
        isspacep.global %p3, %rd5;
        selp.u32 %r7, 2, 0, %p3;
        or.b32 %r6, %r6, %r7;
        mov.b64 %rd3, {%r1, %r2};
        st.global.u64 [%rd2], %rd3;
        mov.b64 %rd3, {%r4, %r6};
        st.global.u64 [%rd2+256], %rd3;
    DONE:";
    let r = run_on(body, 1, 32, 64).unwrap();
    for l in 0..24u64 {
        assert_eq!(r[l as usize], (23 << 32) | (23 * 24 / 2), "lane {l}");
        let same = (0..24u64)
            .filter(|k| k & 3 == l & 3)
            .fold(0, |m, k| m | 1 << k);
        assert_eq!(
            r[32 + l as usize],
            ((2 | (l == 0) as u64) << 32) | same,
            "lane {l}"
        );
    }
}

#[test]
fn runtime_functions() {
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);\n\
        .extern .func __assertfail(.param .b64 a, .param .b64 b, .param .b32 c, .param .b64 d, .param .b64 e);\n\
        .global .align 1 .b8 $str[3] = {104, 105, 0};\n\
        .visible .entry k(.param .u32 fail)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<2>;\n.reg .pred %p;\n\
        mov.u64 %rd1, $str;\n{ .param .b64 p0; st.param.b64 [p0], %rd1; .param .b64 p1; st.param.b64 [p1], 0;\n\
        .param .b32 rv; call.uni (rv), vprintf, (p0, p1); ld.param.b32 %r1, [rv]; }\n\
        ld.param.u32 %r2, [fail];\nsetp.eq.s32 %p, %r2, 0;\n@%p bra OK;\n\
        { .param .b64 a; st.param.b64 [a], %rd1; .param .b64 b; st.param.b64 [b], %rd1;\n\
        .param .b32 c; st.param.b32 [c], 7; .param .b64 d; st.param.b64 [d], %rd1; .param .b64 e;\n\
        call.uni __assertfail, (a, b, c, d, e); }\nOK:\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    let sink = Collect::default();
    let l = Limits {
        print: Some(&sink),
        ..Limits::default()
    };
    launch(&m, "k", &cfg, &0u32.to_le_bytes(), &mem, &l).unwrap();
    assert_eq!(sink.0.into_inner().unwrap(), vec!["hi".to_string(); 32]);
    let e = launch(&m, "k", &cfg, &1u32.to_le_bytes(), &mem, &Limits::default()).unwrap_err();
    assert!(matches!(e, ExecError::Assert(_)), "{e}");
    // A failed assert() says where, as a GPU does, for each thread.
    let sink = Collect::default();
    let l = Limits {
        print: Some(&sink),
        ..Limits::default()
    };
    let e = launch(&m, "k", &cfg, &1u32.to_le_bytes(), &mem, &l).unwrap_err();
    assert!(matches!(e, ExecError::Assert(_)), "{e}");
    let got = sink.0.into_inner().unwrap();
    assert_eq!(got.len(), 64, "32 lines of printf, 32 of the assertion");
    for t in 0..32 {
        let want = format!("hi:7: hi: block: [0,0,0], thread: [{t},0,0] Assertion `hi` failed.\n");
        assert!(got.contains(&want), "no {want:?} in {got:?}");
    }
}

/// Collects `printf` output.
#[derive(Default)]
struct Collect(std::sync::Mutex<Vec<String>>);

impl PrintSink for Collect {
    fn print(&self, text: &[u8]) {
        let mut v = self.0.lock().unwrap();
        v.push(String::from_utf8_lossy(text).into_owned());
    }
}

#[test]
fn printf_as_nvcc_emits_it() {
    // printf("thread %d of %d: %f %s\n", threadIdx.x, blockDim.x, 1.5, "ok")
    // as nvcc 12 compiles it, then the return value to out[tid]; then
    // printf(NULL), whose return value goes to out[tid] + 4.
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .extern .func  (.param .b32 func_retval0) vprintf\n(\n\t.param .b64 vprintf_param_0,\n\t.param .b64 vprintf_param_1\n)\n;\n\
        .global .align 1 .b8 $str[24] = {116, 104, 114, 101, 97, 100, 32, 37, 100, 32, 111, 102, 32, 37, 100, 58, 32, 37, 102, 32, 37, 115, 10, 0};\n\
        .global .align 1 .b8 $str$1[3] = {111, 107, 0};\n\n\
        .visible .entry _Z1kPi(\n\t.param .u64 _Z1kPi_param_0\n)\n{\n\
        \t.local .align 8 .b8 \t__local_depot0[24];\n\t.reg .b64 \t%SP;\n\t.reg .b64 \t%SPL;\n\
        \t.reg .b32 \t%r<6>;\n\t.reg .b64 \t%rd<12>;\n\n\
        \tmov.u64 \t%SPL, __local_depot0;\n\tcvta.local.u64 \t%SP, %SPL;\n\
        \tld.param.u64 \t%rd8, [_Z1kPi_param_0];\n\
        \tadd.u64 \t%rd1, %SP, 0;\n\tadd.u64 \t%rd2, %SPL, 0;\n\
        \tmov.u32 \t%r1, %tid.x;\n\tmov.u32 \t%r2, %ntid.x;\n\
        \tst.local.v2.u32 \t[%rd2], {%r1, %r2};\n\
        \tmov.b64 \t%rd3, 4609434218613702656;\n\tst.local.u64 \t[%rd2+8], %rd3;\n\
        \tmov.u64 \t%rd4, $str$1;\n\tcvta.global.u64 \t%rd5, %rd4;\n\tst.local.u64 \t[%rd2+16], %rd5;\n\
        \tmov.u64 \t%rd6, $str;\n\tcvta.global.u64 \t%rd7, %rd6;\n\
        \t{ // callseq 0, 0\n\t.reg .b32 temp_param_reg;\n\t.param .b64 param0;\n\tst.param.b64 \t[param0+0], %rd7;\n\
        \t.param .b64 param1;\n\tst.param.b64 \t[param1+0], %rd1;\n\t.param .b32 retval0;\n\
        \tcall.uni (retval0),\n\tvprintf,\n\t(\n\tparam0,\n\tparam1\n\t);\n\
        \tld.param.b32 \t%r3, [retval0+0];\n\t} // callseq 0\n\
        \tmul.wide.u32 \t%rd9, %r1, 8;\n\tadd.s64 \t%rd10, %rd8, %rd9;\n\tst.global.u32 \t[%rd10], %r3;\n\
        \t{\n\t.param .b64 param0;\n\tst.param.b64 \t[param0+0], 0;\n\t.param .b64 param1;\n\tst.param.b64 \t[param1+0], 0;\n\
        \t.param .b32 retval0;\n\tcall.uni (retval0), vprintf, (param0, param1);\n\tld.param.b32 \t%r4, [retval0+0];\n\t}\n\
        \tst.global.u32 \t[%rd10+4], %r4;\n\tret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8 * 40);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [40, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    let sink = Collect::default();
    let l = Limits {
        print: Some(&sink),
        ..Limits::default()
    };
    launch(&m, "_Z1kPi", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    let mut got = sink.0.into_inner().unwrap();
    // Lanes print in order; warps in any order.
    got.sort_by_key(|t| {
        t.split(' ')
            .nth(1)
            .and_then(|n| n.parse::<u32>().ok())
            .map(|t| t / 32)
    });
    let want: Vec<String> = (0..40)
        .map(|t| format!("thread {t} of 40: 1.500000 ok\n"))
        .collect();
    assert_eq!(got, want);
    let b = mem.to_bytes();
    for t in 0..40 {
        let rv = |at: usize| i32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!((rv(8 * t), rv(8 * t + 4)), (4, -1), "thread {t}");
    }
    // Without a sink the output is dropped; return values are the same.
    let mem = VecMemory::new(OUT, 8 * 40);
    launch(
        &m,
        "_Z1kPi",
        &cfg,
        &OUT.to_le_bytes(),
        &mem,
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(mem.to_bytes()[..8], [4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
}

#[test]
fn collectives_wait_for_lanes_in_calls() {
    // Odd lanes call g, defined after the kernel (higher PCs than the
    // shuffle); the shuffle must still see the values g returned.
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .func (.param .b32 r) g(.param .b32 x);\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n.reg .pred %p<2>;\n\
        ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nmov.u32 %r1, %r0;\nand.b32 %r2, %r0, 1;\nsetp.eq.s32 %p1, %r2, 0;\n@%p1 bra JOIN;\n\
        { .param .b32 a; st.param.b32 [a], %r0; .param .b32 rv; call.uni (rv), g, (a); ld.param.b32 %r1, [rv]; }\n\
        JOIN:\nshfl.sync.bfly.b32 %r3, %r1, 1, 31, -1;\nvote.sync.ballot.b32 %r4, %p1, -1;\n\
        mul.wide.u32 %rd1, %r0, 8;\nadd.s64 %rd2, %rd0, %rd1;\nmov.b64 %rd3, {%r3, %r4};\nst.global.u64 [%rd2], %rd3;\nret;\n}\n\
        .func (.param .b32 r) g(.param .b32 x)\n{\n.reg .b32 %r<3>;\nld.param.u32 %r1, [x];\nmul.lo.s32 %r2, %r1, 100;\nst.param.b32 [r], %r2;\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 8 * 32);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
    let b = mem.to_bytes();
    for l in 0..32u64 {
        let v = u64::from_le_bytes(b[l as usize * 8..][..8].try_into().unwrap());
        let partner = l ^ 1;
        let pv = if partner & 1 == 1 {
            partner * 100
        } else {
            partner
        };
        assert_eq!(v, (0x5555_5555 << 32) | pv, "lane {l}");
    }
}

#[test]
fn misaligned_accesses_fault() {
    let r = run_on("add.s64 %rd3, %rd2, 2; ld.global.u32 %r1, [%rd3];", 1, 1, 2);
    assert_eq!(
        r,
        Err(ExecError::MisalignedAddress {
            addr: OUT + 2,
            size: 4,
            line: 17
        })
    );
    let r = run_on("st.global.v2.u32 [%rd2+4], {%r0, %r0};", 1, 1, 2);
    assert_eq!(
        r,
        Err(ExecError::MisalignedAddress {
            addr: OUT + 4,
            size: 8,
            line: 17
        })
    );
    let r = run_on("atom.global.add.u64 %rd3, [%rd2+4], 1;", 1, 1, 2);
    assert!(
        matches!(r, Err(ExecError::MisalignedAddress { size: 8, .. })),
        "{r:?}"
    );
    // Bytes need no alignment.
    assert!(run_on("st.global.u8 [%rd2+3], %r0;", 1, 1, 1).is_ok());
}

#[test]
fn warps_spinning_on_each_other_progress() {
    // Warp 0 (run first) waits for a flag warp 1 sets after a long loop.
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n.shared .align 4 .b8 flag[4];\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<6>;\n.reg .b64 %rd<4>;\n.reg .pred %p<3>;\n\
        ld.param.u64 %rd0, [out];\nmov.u32 %r0, %tid.x;\nsetp.lt.u32 %p1, %r0, 32;\n@%p1 bra WAIT;\n\
        mov.u32 %r1, 0;\nLOOP:\nadd.u32 %r1, %r1, 1;\nsetp.lt.u32 %p2, %r1, 5000;\n@%p2 bra LOOP;\n\
        st.volatile.shared.u32 [flag], %r1;\nbra END;\n\
        WAIT:\nld.volatile.shared.u32 %r2, [flag];\nsetp.eq.u32 %p2, %r2, 0;\n@%p2 bra WAIT;\n\
        mul.wide.u32 %rd1, %r0, 4;\nadd.s64 %rd2, %rd0, %rd1;\nst.global.u32 [%rd2], %r2;\nEND:\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    let mem = VecMemory::new(OUT, 64 * 4);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    let l = Limits {
        max_steps: Some(1_000_000),
        ..Limits::default()
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    let b = mem.to_bytes();
    for t in 0..32 {
        assert_eq!(
            u32::from_le_bytes(b[t * 4..t * 4 + 4].try_into().unwrap()),
            5000
        );
    }
}

#[test]
fn bit_masks() {
    let r = eval(&[
        // The PTX ISA's example: 2 bits from bit 1.
        ("bmsk.wrap.b32 %r1, 1, 2;", "%r1"),
        ("bmsk.clamp.b32 %r1, 4, 40;", "%r1"),
        ("bmsk.clamp.b32 %r1, 40, 1;", "%r1"),
        ("bmsk.clamp.b32 %r1, 0, 32;", "%r1"),
        ("bmsk.clamp.b32 %r1, 0, 0;", "%r1"),
        // Modulo 32: from bit 4, 2 bits.
        (
            "mov.u32 %r2, 36; mov.u32 %r3, 34; bmsk.wrap.b32 %r1, %r2, %r3;",
            "%r1",
        ),
        // A width of 32 wraps to none.
        ("bmsk.wrap.b32 %r1, 0, 32;", "%r1"),
        // Past bit 31: the bits up to 31.
        ("bmsk.wrap.b32 %r1, 30, 4;", "%r1"),
        ("bmsk.clamp.b32 %r1, 30, 4;", "%r1"),
        ("bmsk.clamp.b32 %r1, 8, 8;", "%r1"),
    ]);
    assert_eq!(
        r,
        vec![
            6,
            0xffff_fff0,
            0,
            0xffff_ffff,
            0,
            0x30,
            0,
            0xc000_0000,
            0xc000_0000,
            0xff00
        ]
    );
}

#[test]
fn environment_registers_read_zero() {
    let r = eval(&[
        ("mov.u32 %r1, 5; mov.u32 %r1, %envreg0;", "%r1"),
        ("mov.u32 %r1, 5; mov.u32 %r1, %envreg31;", "%r1"),
    ]);
    assert_eq!(r, vec![0, 0]);
    for bad in ["%envreg32", "%envreg07", "%envreg"] {
        let text = format!(
            ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{{\n.reg .b32 %r1;\nmov.u32 %r1, {bad};\nret;\n}}\n"
        );
        assert!(Module::parse(&text).is_err(), "{bad}");
    }
}

/// The block's reserved shared memory, as cooperative groups use it for
/// tiles of several warps: 1 KiB, `_0` and `_1` halves of it; each of 4
/// warps writes its number at `_1` through a generic address, and after
/// the barrier every thread reads the sum of all four.
#[test]
fn reserved_shared_memory_is_the_blocks_own() {
    let r = eval(&[
        (
            "mov.u32 %r1, %reserved_smem_offset_end; mov.u32 %r2, %reserved_smem_offset_begin; sub.u32 %r1, %r1, %r2;",
            "%r1",
        ),
        ("mov.u32 %r1, %reserved_smem_offset_cap;", "%r1"),
        (
            "mov.u32 %r1, %reserved_smem_offset_1; mov.u32 %r2, %reserved_smem_offset_0; sub.u32 %r1, %r1, %r2;",
            "%r1",
        ),
    ]);
    assert_eq!(r, vec![1024, 1024, 512]);
    let body = "mov.u32 %r1, %reserved_smem_offset_1;\ncvt.u64.u32 %rd3, %r1;\ncvta.shared.u64 %rd3, %rd3;\n\
                shr.u32 %r2, %r0, 5;\nand.b32 %r3, %r0, 31;\nsetp.eq.u32 %p1, %r3, 0;\n\
                mul.wide.u32 %rd4, %r2, 8;\nadd.s64 %rd5, %rd3, %rd4;\ncvt.u64.u32 %rd6, %r2;\n\
                @%p1 st.u64 [%rd5], %rd6;\nbar.sync 0;\n\
                ld.u64 %rd7, [%rd3];\nld.u64 %rd8, [%rd3+8];\nadd.s64 %rd7, %rd7, %rd8;\n\
                ld.u64 %rd8, [%rd3+16];\nadd.s64 %rd7, %rd7, %rd8;\nld.u64 %rd8, [%rd3+24];\nadd.s64 %rd7, %rd7, %rd8;\n\
                st.global.u64 [%rd2], %rd7;";
    let out = run_on(body, 2, 128, 128).unwrap();
    assert!(out.iter().all(|&v| v == 6), "{out:?}");
}

/// `h(x)` is `x` as an f16 bit pattern, `hb` as a bfloat16 one.
fn h(x: f32) -> u64 {
    crate::half::f32_to_f16(x) as u64
}
fn hb(x: f32) -> u64 {
    crate::half::f32_to_bf16(x) as u64
}
fn pair(lo: u64, hi: u64) -> u64 {
    lo | hi << 16
}

#[test]
fn packed_half_arithmetic() {
    let p = |lo: f32, hi: f32| format!("{:#x}", pair(h(lo), h(hi)));
    let b = |lo: f32, hi: f32| format!("{:#x}", pair(hb(lo), hb(hi)));
    let r = eval(&[
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; add.f16x2 %r3, %r1, %r2;", p(1.0, 2.0), p(0.5, 0.25)), "%r3"),
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; sub.rn.f16x2 %r3, %r1, %r2;", p(1.0, 2.0), p(0.5, 0.25)), "%r3"),
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; mul.f16x2 %r3, %r1, %r2;", p(3.0, -2.0), p(0.5, 0.25)), "%r3"),
        // fma with relu: the negative lane is zero.
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; mov.b32 %r4, {}; fma.rn.relu.f16x2 %r3, %r1, %r2, %r4;", p(3.0, -2.0), p(0.5, 4.0), p(1.0, 1.0)), "%r3"),
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; add.rn.sat.f16x2 %r3, %r1, %r2;", p(0.75, -1.0), p(0.5, 0.25)), "%r3"),
        (&format!("mov.b32 %r1, {}; neg.f16x2 %r3, %r1;", p(1.0, -2.0)), "%r3"),
        (&format!("mov.b32 %r1, {}; abs.f16x2 %r3, %r1;", p(-1.0, 2.0)), "%r3"),
        // min/max lane by lane; a NaN lane gives the other operand.
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; min.f16x2 %r3, %r1, %r2;", p(1.0, 5.0), p(2.0, -3.0)), "%r3"),
        (&format!("mov.b32 %r1, 0x7fff3c00; mov.b32 %r2, {}; max.f16x2 %r3, %r1, %r2;", p(2.0, -3.0)), "%r3"),
        // bfloat16 pairs, as nvcc emits them for compute_80.
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; mov.b32 %r4, 0x3f803f80; fma.rn.bf16x2 %r3, %r1, %r4, %r2;", b(1.5, 2.0), b(0.5, -4.0)), "%r3"),
        (&format!("mov.b32 %r1, {}; neg.bf16x2 %r3, %r1;", b(1.0, -2.0)), "%r3"),
        (&format!("mov.b32 %r1, {}; mov.b32 %r2, {}; max.bf16x2 %r3, %r1, %r2;", b(1.0, -2.0), b(0.5, -1.0)), "%r3"),
        // Floats packed: a to the upper half, b to the lower.
        (&format!("mov.f32 %f1, {}; mov.f32 %f2, {}; cvt.rn.f16x2.f32 %r3, %f1, %f2;", f32c(1.0), f32c(2.0)), "%r3"),
        (&format!("mov.f32 %f1, {}; mov.f32 %f2, {}; cvt.rn.relu.bf16x2.f32 %r3, %f1, %f2;", f32c(-1.0), f32c(3.0)), "%r3"),
        // Halves in and out of pairs, scalar half arithmetic.
        (&format!("mov.b32 %r1, {}; mov.b32 {{%h1, %h2}}, %r1; fma.rn.relu.f16 %h3, %h1, %h2, %h1; mov.b32 %r3, {{%h3, %h2}};", p(-1.0, 3.0)), "%r3"),
        (&format!("mov.b16 %h1, {:#x}; mov.b16 %h2, {:#x}; add.bf16 %h3, %h1, %h2;", hb(1.0), hb(0.5)), "%h3"),
    ]);
    let want = vec![
        pair(h(1.5), h(2.25)),
        pair(h(0.5), h(1.75)),
        pair(h(1.5), h(-0.5)),
        pair(h(2.5), 0),
        pair(h(1.0), 0),
        pair(h(-1.0), h(2.0)),
        pair(h(1.0), h(2.0)),
        pair(h(1.0), h(-3.0)),
        pair(h(2.0), h(-3.0)),
        pair(hb(2.0), hb(-2.0)),
        pair(hb(-1.0), hb(2.0)),
        pair(hb(1.0), hb(-1.0)),
        pair(h(2.0), h(1.0)),
        pair(hb(3.0), 0),
        pair(0, h(3.0)),
        hb(1.5),
    ];
    for (i, (g, w)) in r.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "case {i}: {g:#x} != {w:#x}");
    }
}

#[test]
fn barrier_reductions() {
    // Threads 90..100 exit first (they count as arrived and add nothing);
    // the others reduce predicates over the block, each getting the result.
    let body = "
        setp.ge.u32 %p1, %r0, 90;
        @%p1 bra DONE;
        rem.u32 %r1, %r0, 3;
        setp.eq.u32 %p2, %r1, 0;
        bar.red.popc.u32 %r2, 0, %p2;
        setp.lt.u32 %p3, %r0, 1000;
        bar.red.and.pred %p4, 1, %p3;
        setp.ne.u32 %p3, %r0, 77;
        barrier.cta.red.and.aligned.pred %p5, 2, %p3;
        setp.eq.u32 %p3, %r0, 77;
        bar.red.or.pred %p6, 3, 64, %p3;
        bar.red.or.pred %p7, 0, !%p3;
        barrier.red.popc.u32 %r3, 0, !%p2;
        selp.u32 %r4, 1, 0, %p4;
        selp.u32 %r5, 2, 0, %p5;
        selp.u32 %r6, 4, 0, %p6;
        selp.u32 %r7, 8, 0, %p7;
        add.u32 %r4, %r4, %r5;
        add.u32 %r4, %r4, %r6;
        add.u32 %r4, %r4, %r7;
        shl.b32 %r3, %r3, 8;
        or.b32 %r2, %r2, %r3;
        shl.b32 %r4, %r4, 16;
        or.b32 %r2, %r2, %r4;
        st.global.u32 [%rd2], %r2;
        DONE:
    ";
    let r = run_on(body, 3, 100, 100).unwrap();
    // 0, 3, ..., 87: 30 of 90 threads.
    let want = 30 | 60 << 8 | (1 | 4 | 8) << 16;
    for (t, v) in r.iter().enumerate() {
        let w = if t < 90 { want } else { 0 };
        assert_eq!(*v, w, "thread {t}: {v:#x}");
    }
}

#[test]
fn module_variables_in_device_memory() {
    let text = ".version 8.5\n.target sm_90\n.address_size 64\n\
        .global .align 4 .u32 counter = 5;\n.const .align 4 .u32 step[2] = {3, 4};\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n\
        ld.param.u64 %rd0, [out];\nld.const.u32 %r1, [step+4];\natom.global.add.u32 %r2, [counter], %r1;\n\
        ld.global.u32 %r3, [counter];\nst.global.u32 [%rd0], %r3;\nmov.u64 %rd1, counter;\nst.global.u64 [%rd0+8], %rd1;\nret;\n}\n";
    let m = Module::parse(text).unwrap();
    assert_eq!(m.variable("counter"), Some((0, 4)));
    assert_eq!(m.variable("step"), Some((4, 8)));
    assert_eq!(m.variable("out"), None);
    assert_eq!(m.statics(), &[5, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_dyn: 0,
        workers: 1,
    };
    // Without a home in device memory, each launch starts afresh.
    let mem = VecMemory::new(OUT, 16);
    for _ in 0..2 {
        launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).unwrap();
        assert_eq!(mem.to_bytes()[..4], 9u32.to_le_bytes());
    }
    // In device memory (after `out`): values persist and the host sees
    // and sets them; the kernel's own address for them still works.
    let home = OUT + 16;
    let mem = VecMemory::new(OUT, 16 + 12);
    mem.write(home, m.statics()).unwrap();
    let l = Limits {
        statics: Some(home),
        ..Limits::default()
    };
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    let b = mem.to_bytes();
    assert_eq!(b[..4], 13u32.to_le_bytes());
    assert_eq!(b[16..20], 13u32.to_le_bytes());
    mem.write(home + 8, &10u32.to_le_bytes()).unwrap();
    launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    assert_eq!(mem.to_bytes()[..4], 23u32.to_le_bytes());
    // A store through the variable's generic address (`int *p =
    // &counter; *p = v;`) lands in it.
    let m2 = Module::parse(&text.replace(
        "mov.u64 %rd1, counter;",
        "mov.u64 %rd1, counter;\ncvta.global.u64 %rd3, %rd1;\nst.u32 [%rd3], 1000;",
    ))
    .unwrap();
    launch(&m2, "k", &cfg, &OUT.to_le_bytes(), &mem, &l).unwrap();
    assert_eq!(mem.to_bytes()[16..20], 1000u32.to_le_bytes());
    // A home outside device memory faults.
    let l = Limits {
        statics: Some(OUT + 4096),
        ..Limits::default()
    };
    let e = launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &l);
    assert!(matches!(e, Err(ExecError::IllegalAddress { .. })), "{e:?}");
}

#[test]
fn set_writes_ones_or_all_ones() {
    let p = |lo: f32, hi: f32| format!("{:#x}", pair(h(lo), h(hi)));
    let r = eval(&[
        (
            &format!(
                "mov.b32 %r1, {}; mov.b32 %r2, {}; set.eq.f16x2.f16x2 %r3, %r1, %r2;",
                p(1.0, 2.0),
                p(1.0, 3.0)
            ),
            "%r3",
        ),
        (
            &format!(
                "mov.b32 %r1, {}; mov.b32 %r2, {}; set.gt.u32.f16x2 %r3, %r1, %r2;",
                p(2.0, 1.0),
                p(1.0, 1.0)
            ),
            "%r3",
        ),
        (
            &format!(
                "mov.b32 %r1, {}; mov.b32 %r2, {}; set.ge.ftz.f16x2.f16x2 %r3, %r1, %r2;",
                p(-1.0, 1.0),
                p(-1.0, 0.5)
            ),
            "%r3",
        ),
        (
            &format!(
                "mov.b16 %h1, {:#x}; mov.b16 %h2, {:#x}; set.eq.f16.f16 %h3, %h1, %h2;",
                h(1.5),
                h(1.5)
            ),
            "%h3",
        ),
        (
            &format!(
                "mov.b16 %h1, {:#x}; mov.b16 %h2, {:#x}; set.ltu.f16.f16 %h3, %h1, %h2;",
                h(1.5),
                h(1.0)
            ),
            "%h3",
        ),
        ("set.lt.u32.s32 %r3, -1, 0;", "%r3"),
        ("set.lt.u32.u32 %r3, -1, 0;", "%r3"),
        (
            &format!(
                "mov.f32 %f1, {}; set.gt.f32.f32 %r3, %f1, 0f00000000;",
                f32c(2.0)
            ),
            "%r3",
        ),
        (
            "setp.eq.u32 %p1, %r0, 0; set.lt.and.u32.s32 %r3, 1, 2, !%p1;",
            "%r3",
        ),
        (
            "setp.eq.u32 %p1, %r0, 0; set.lt.or.u32.s32 %r3, 3, 2, %p1;",
            "%r3",
        ),
    ]);
    assert_eq!(
        r,
        vec![
            pair(h(1.0), 0),
            0xffff,
            pair(h(1.0), h(1.0)),
            h(1.0),
            0,
            0xffff_ffff,
            0,
            0x3f80_0000,
            0,
            0xffff_ffff
        ]
    );
}

#[test]
fn packed_half_atomics() {
    // 64 threads add (1.0, 0.5) to one pair, and (0.25, 2.0) to a
    // bfloat16 pair: exact sums.
    let body = format!(
        "atom.global.add.noftz.f16x2 %r1, [%rd0], {:#x};\nred.global.add.noftz.bf16x2 [%rd0+8], {:#x};",
        pair(h(1.0), h(0.5)),
        pair(hb(0.25), hb(2.0))
    );
    let r = run_on(&body, 1, 64, 2).unwrap();
    assert_eq!(r[0], pair(h(64.0), h(32.0)));
    assert_eq!(r[1], pair(hb(16.0), hb(128.0)));
}

/// Texture and surface instructions over descriptors in device memory.
mod textures {
    use super::*;
    use crate::texture::{Descriptor, Format, ADDRESS_BORDER, ADDRESS_CLAMP};

    const IMG: u64 = OUT + 0x1000;
    const TEX: u64 = OUT + 0x2000;
    const SURF: u64 = OUT + 0x2100;
    const LIN: u64 = OUT + 0x2200;
    const W: u32 = 5;
    const H: u32 = 4;

    fn desc(surface: bool, linear: bool, mode: u8) -> Descriptor {
        Descriptor {
            surface,
            format: Format::F32,
            channels: 1,
            normalized: false,
            read_integer: false,
            linear_filter: linear,
            linear_memory: false,
            layered: false,
            cubemap: false,
            addr: IMG,
            extent: [W, H, 1],
            pitch: u64::from(W) * 4,
            slice: u64::from(W * H) * 4,
            address: [mode; 3],
            border: [0.5; 4],
        }
    }

    fn run(body: &str, threads: u32, tex: Descriptor) -> (Result<(), ExecError>, VecMemory) {
        let m = module(body, "");
        let mem = VecMemory::new(OUT, 0x3000);
        for i in 0..W * H {
            let v = (i * i % 11) as f32 * 0.5;
            mem.write(IMG + u64::from(i) * 4, &v.to_le_bytes()).unwrap();
        }
        mem.write(TEX, &tex.encode()).unwrap();
        mem.write(SURF, &desc(true, false, ADDRESS_CLAMP).encode())
            .unwrap();
        let mut lin = desc(false, false, ADDRESS_CLAMP);
        lin.linear_memory = true;
        lin.extent = [W * H, 1, 1];
        mem.write(LIN, &lin.encode()).unwrap();
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [threads, 1, 1],
            shared_dyn: 0,
            workers: 1,
        };
        let r = launch(&m, "k", &cfg, &OUT.to_le_bytes(), &mem, &Limits::default()).map(|_| ());
        (r, mem)
    }

    fn f32_at(mem: &VecMemory, addr: u64) -> f32 {
        let mut b = [0u8; 4];
        mem.read(addr, &mut b).unwrap();
        f32::from_le_bytes(b)
    }

    fn texel(i: i64, j: i64) -> f32 {
        let (i, j) = (i.clamp(0, W as i64 - 1), j.clamp(0, H as i64 - 1));
        let k = (j * W as i64 + i) as u32;
        (k * k % 11) as f32 * 0.5
    }

    #[test]
    fn tex_2d_linear_filtering_matches_the_formula() {
        // Thread t samples at x = t * 0.29 - 0.7, y = t * 0.13 - 0.4.
        let body = format!(
            "cvt.rn.f32.u32 %f1, %r0;\n\
             mul.f32 %f2, %f1, 0f3E947AE1;\nsub.f32 %f2, %f2, 0f3F333333;\n\
             mul.f32 %f3, %f1, 0f3E051EB8;\nsub.f32 %f3, %f3, 0f3ECCCCCD;\n\
             mov.u64 %rd5, {TEX};\n\
             tex.2d.v4.f32.f32 {{%f4, %f5, %f6, %f7}}, [%rd5, {{%f2, %f3}}];\n\
             st.global.f32 [%rd2], %f4;\nst.global.f32 [%rd2+4], %f7;"
        );
        let (r, mem) = run(&body, 48, desc(false, true, ADDRESS_CLAMP));
        r.unwrap();
        for t in 0..48u32 {
            let x = t as f32 * f32::from_bits(0x3E94_7AE1) - f32::from_bits(0x3F33_3333);
            let y = t as f32 * f32::from_bits(0x3E05_1EB8) - f32::from_bits(0x3ECC_CCCD);
            let (xb, yb) = (x - 0.5, y - 0.5);
            let (i, j) = (xb.floor() as i64, yb.floor() as i64);
            let a = ((xb - xb.floor()) * 256.0).round() / 256.0;
            let b = ((yb - yb.floor()) * 256.0).round() / 256.0;
            let want = (1.0 - a) * (1.0 - b) * texel(i, j)
                + a * (1.0 - b) * texel(i + 1, j)
                + (1.0 - a) * b * texel(i, j + 1)
                + a * b * texel(i + 1, j + 1);
            let got = f32_at(&mem, OUT + u64::from(t) * 8);
            assert!(
                (got - want).abs() < 1e-5,
                "thread {t} at ({x}, {y}): {got} != {want}"
            );
            // One channel: the fourth reads 1.
            assert_eq!(f32_at(&mem, OUT + u64::from(t) * 8 + 4), 1.0);
        }
    }

    #[test]
    fn tex_point_border_and_integer_fetch() {
        let body = format!(
            "cvt.rn.f32.u32 %f1, %r0;\nsub.f32 %f1, %f1, 0f3F800000;\n\
             mov.f32 %f2, 0f3FC00000;\nmov.u64 %rd5, {TEX};\n\
             tex.2d.v4.f32.f32 {{%f4, %f5, %f6, %f7}}, [%rd5, {{%f1, %f2}}];\n\
             st.global.f32 [%rd2], %f4;\n\
             sub.s32 %r1, %r0, 2;\nmov.u64 %rd6, {LIN};\n\
             tex.1d.v4.f32.s32 {{%f8, %f9, %f10, %f11}}, [%rd6, {{%r1}}];\n\
             st.global.f32 [%rd2+4], %f8;"
        );
        let (r, mem) = run(&body, 8, desc(false, false, ADDRESS_BORDER));
        r.unwrap();
        for t in 0..8i64 {
            let x = t - 1;
            let want = if (0..W as i64).contains(&x) {
                texel(x, 1)
            } else {
                0.5
            };
            assert_eq!(f32_at(&mem, OUT + t as u64 * 8), want, "thread {t}");
            let k = t - 2;
            let want = if (0..(W * H) as i64).contains(&k) {
                texel(k % W as i64, k / W as i64)
            } else {
                0.0
            };
            assert_eq!(f32_at(&mem, OUT + t as u64 * 8 + 4), want, "thread {t}");
        }
    }

    #[test]
    fn surfaces_store_load_and_query() {
        // Thread t writes t + 100 at element (t % W, t / W), then reads
        // back the element of the thread before it (after a barrier).
        let body = format!(
            "mov.u64 %rd5, {SURF};\n\
             rem.u32 %r1, %r0, {W};\ndiv.u32 %r2, %r0, {W};\nshl.b32 %r3, %r1, 2;\n\
             add.u32 %r4, %r0, 100;\n\
             sust.b.2d.b32.trap [%rd5, {{%r3, %r2}}], {{%r4}};\nbar.sync 0;\n\
             suld.b.2d.b32.clamp {{%r5}}, [%rd5, {{%r3, %r2}}];\n\
             st.global.u32 [%rd2], %r5;\n\
             suq.width.b32 %r6, [%rd5];\ntxq.height.b32 %r7, [%rd5];"
        );
        // txq of a surface object is a bad handle: the launch faults.
        let (r, _) = run(&body, W * H, desc(false, false, ADDRESS_CLAMP));
        assert!(
            matches!(r, Err(ExecError::IllegalAddress { addr, .. }) if addr == SURF),
            "{r:?}"
        );
        let body = body.replace(
            "txq.height.b32 %r7, [%rd5];",
            "st.global.u32 [%rd2+4], %r6;",
        );
        let (r, mem) = run(&body, W * H, desc(false, false, ADDRESS_CLAMP));
        r.unwrap();
        for t in 0..W * H {
            let mut b = [0u8; 8];
            mem.read(OUT + u64::from(t) * 8, &mut b).unwrap();
            assert_eq!(u32::from_le_bytes(b[..4].try_into().unwrap()), t + 100);
            assert_eq!(u32::from_le_bytes(b[4..].try_into().unwrap()), W);
        }
        // Out of range under .trap faults.
        let body = format!(
            "mov.u64 %rd5, {SURF};\nmov.u32 %r1, {};\nmov.u32 %r2, 0;\n\
             sust.b.2d.b32.trap [%rd5, {{%r1, %r2}}], {{%r0}};",
            W * 4
        );
        let (r, _) = run(&body, 1, desc(false, false, ADDRESS_CLAMP));
        assert!(matches!(r, Err(ExecError::IllegalAddress { .. })), "{r:?}");
    }

    #[test]
    fn bogus_handles_fault() {
        for handle in ["0", "0x12345678", &IMG.to_string()] {
            let body = format!(
                "mov.u64 %rd5, {handle};\nmov.f32 %f1, 0f00000000;\n\
                 tex.2d.v4.f32.f32 {{%f4, %f5, %f6, %f7}}, [%rd5, {{%f1, %f1}}];"
            );
            let (r, _) = run(&body, 1, desc(false, false, ADDRESS_CLAMP));
            assert!(
                matches!(r, Err(ExecError::IllegalAddress { .. })),
                "{handle}: {r:?}"
            );
        }
    }
}
