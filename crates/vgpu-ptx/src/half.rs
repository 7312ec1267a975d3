//! IEEE half (`f16`) and bfloat16 (`bf16`) conversions, for the parser's
//! immediates and the executor's arithmetic, and the half-precision
//! arithmetic itself.

use std::cmp::Ordering;

/// Half-precision arithmetic (`.f16`, `.bf16` and their packed `x2`
/// forms).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfOp {
    Add,
    Sub,
    Mul,
    Fma,
    Min,
    Max,
    Neg,
    Abs,
}

/// The two half-precision formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// IEEE binary16 (`.f16`).
    F16,
    /// bfloat16 (`.bf16`).
    Bf16,
}

/// f32 to IEEE half, round to nearest even.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign
            | 0x7c00
            | if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// IEEE half to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let lz = m.leading_zeros() - 21;
            let m = (m << lz) & 0x3ff;
            sign | ((127 - 15 + 1 - lz) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to bfloat16, round to nearest even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// bfloat16 to f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The canonical NaN of both 16-bit float types.
pub const CANONICAL_NAN: u16 = 0x7fff;

/// `a + b` as `s + e` exactly (Knuth's two-sum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// The exact value `s + e` rounded to an f32 by rounding to odd (toward
/// zero, then the last bit set if anything was dropped). Rounding that to
/// a type of at most 22 bits of precision gives the exact value's nearest
/// in one rounding, as the hardware's half-precision units do.
fn round_to_odd_f32(s: f64, e: f64) -> f32 {
    let r = s as f32;
    if !r.is_finite() {
        return r;
    }
    let rd = r as f64;
    // How `r` compares with the exact value: `rd - s` is exact, and
    // larger than `e` whenever it is not zero.
    let cmp = if rd != s {
        rd.partial_cmp(&s)
    } else {
        0.0.partial_cmp(&e)
    }
    .unwrap_or(Ordering::Equal);
    if cmp == Ordering::Equal {
        return r;
    }
    // `r` lies farther from zero than the exact value: one step back
    // (it is not zero then).
    let t = if (cmp == Ordering::Greater) == (s > 0.0) {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(t.to_bits() | 1)
}

/// `h` as an f64 (exact).
fn value(ty: Half, h: u16) -> f64 {
    if ty == Half::Bf16 {
        bf16_to_f32(h) as f64
    } else {
        f16_to_f32(h) as f64
    }
}

/// Whether `h` is a NaN of `ty`.
fn is_nan(ty: Half, h: u16) -> bool {
    let exp = if ty == Half::Bf16 { 0x7f80 } else { 0x7c00 };
    h & exp == exp && h & !(exp | 0x8000) != 0
}

/// Whether `h` is a subnormal of `ty`.
fn is_subnormal(ty: Half, h: u16) -> bool {
    let exp = if ty == Half::Bf16 { 0x7f80 } else { 0x7c00 };
    h & exp == 0 && h & 0x7fff != 0
}

/// Whether `h` is below zero (not -0).
fn is_negative(ty: Half, h: u16) -> bool {
    h & 0x8000 != 0 && h & 0x7fff != 0 && !is_nan(ty, h)
}

/// One lane of half-precision arithmetic as PTX defines it: `a op b`
/// (`a * b + c` for `fma`) rounded once to nearest even; `ftz` flushes
/// subnormal inputs and results to zero of the same sign, `sat` clamps
/// the result to [0, 1] (NaN to +0), `relu` clamps negative results to
/// +0; NaN results are the canonical NaN. `min`/`max` give the other
/// operand when one is NaN, and order -0 below +0.
#[allow(clippy::too_many_arguments)]
pub fn half_arith(
    op: HalfOp,
    ty: Half,
    ftz: bool,
    sat: bool,
    relu: bool,
    a: u16,
    b: u16,
    c: u16,
) -> u16 {
    let one = if ty == Half::Bf16 { 0x3f80 } else { 0x3c00 };
    let flush = |h: u16| {
        if ftz && is_subnormal(ty, h) {
            h & 0x8000
        } else {
            h
        }
    };
    let (a, b, c) = (flush(a), flush(b), flush(c));
    let r = match op {
        HalfOp::Neg => return a ^ 0x8000,
        HalfOp::Abs => return a & 0x7fff,
        HalfOp::Min | HalfOp::Max => match (is_nan(ty, a), is_nan(ty, b)) {
            (true, true) => CANONICAL_NAN,
            (true, false) => b,
            (false, true) => a,
            _ => {
                let (x, y) = (value(ty, a), value(ty, b));
                let a_first = if x == y {
                    // Only zeros compare equal with different bits.
                    a & 0x8000 != 0
                } else {
                    x < y
                };
                if a_first == (op == HalfOp::Min) {
                    a
                } else {
                    b
                }
            }
        },
        _ => {
            let (x, y, z) = (value(ty, a), value(ty, b), value(ty, c));
            // Products of two 16-bit floats are exact in f64.
            let (s, e) = match op {
                HalfOp::Add => two_sum(x, y),
                HalfOp::Sub => two_sum(x, -y),
                HalfOp::Mul => (x * y, 0.0),
                _ => two_sum(x * y, z),
            };
            if s.is_nan() {
                CANONICAL_NAN
            } else {
                let t = round_to_odd_f32(s, e);
                let h = if ty == Half::Bf16 {
                    f32_to_bf16(t)
                } else {
                    f32_to_f16(t)
                };
                flush(h)
            }
        }
    };
    if sat {
        if is_nan(ty, r) || r & 0x8000 != 0 {
            0
        } else if value(ty, r) > 1.0 {
            one
        } else {
            r
        }
    } else if relu && is_nan(ty, r) {
        CANONICAL_NAN
    } else if relu && is_negative(ty, r) {
        0
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#x}");
        }
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 1);
        assert_eq!(f32_to_f16(2.98e-8), 0);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    /// `h` times `2^shift`, an integer for the operands the tests use.
    fn scaled(ty: Half, h: u16, shift: i32) -> i128 {
        (value(ty, h) * 2f64.powi(shift)) as i128
    }

    /// The nearest `ty` to `n / 2^48` (exact integers throughout) among
    /// the neighbours of a naive rounding, ties to the even pattern: the
    /// reference for the arithmetic.
    fn nearest(ty: Half, n: i128) -> u16 {
        let v = n as f64 / 2f64.powi(48);
        let naive = if ty == Half::Bf16 {
            f32_to_bf16(v as f32)
        } else {
            f32_to_f16(v as f32)
        };
        let mut best = naive;
        let mut err = i128::MAX;
        for k in -3i32..=3 {
            let h = (naive as i32 + k) as u16;
            if !value(ty, h).is_finite() || (h ^ naive) & 0x8000 != 0 {
                continue;
            }
            let d = (scaled(ty, h, 48) - n).abs();
            if d < err || (d == err && h & 1 == 0) {
                best = h;
                err = d;
            }
        }
        best
    }

    #[test]
    fn half_arithmetic_rounds_once() {
        use HalfOp::*;
        let f = |v: f32| f32_to_f16(v);
        let h = |op, a, b, c| half_arith(op, Half::F16, false, false, false, a, b, c);
        assert_eq!(h(Add, f(1.0), f(2.0), 0), f(3.0));
        assert_eq!(h(Mul, f(1.5), f(-2.0), 0), f(-3.0));
        // 2049 is halfway between 2048 and 2050: ties to even, 2048.
        assert_eq!(h(Add, f(2048.0), f(1.0), 0), f(2048.0));
        assert_eq!(h(Add, f(2050.0), f(1.0), 0), f(2052.0));
        // fma rounds once: 2048 + 1 + 2^-14 is just above the tie.
        let tiny = 0x0400; // 2^-14
        assert_eq!(h(Fma, f(1.0), f(1.0), f(2048.0)), f(2048.0));
        assert_eq!(h(Fma, tiny, f(1.0), h(Add, f(2048.0), 0, 0)), f(2048.0));
        let above = h(Fma, f(1.0), f(1.0), f(2048.0));
        assert_eq!(above, f(2048.0));
        // a*b + c where a*b = 1 + 2^-11 + 2^-20 (just above a tie of
        // 1 + 2^-11 between 1 and 1 + 2^-10): one rounding goes up; rounding
        // the product to f16 first would go down to 1, then 1 + 2^-11 ties.
        let a = f(1.0 + 2f32.powi(-10));
        let b = f(1.0 + 2f32.powi(-10));
        // (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20
        assert_eq!(h(Fma, a, b, 0), f(1.0 + 2f32.powi(-9)));
        assert_eq!(h(Fma, a, b, f(-2f32.powi(-10))), 0x3c01);
        // Overflow to infinity, NaN to the canonical NaN.
        assert_eq!(h(Mul, f(65504.0), f(2.0), 0), 0x7c00);
        assert_eq!(h(Add, 0x7c00, 0xfc00, 0), CANONICAL_NAN);
        // Modifiers.
        let m = |op, ftz, sat, relu, a, b, c| half_arith(op, Half::F16, ftz, sat, relu, a, b, c);
        assert_eq!(m(Add, false, true, false, f(0.75), f(0.5), 0), f(1.0));
        assert_eq!(m(Sub, false, true, false, f(0.25), f(0.5), 0), 0);
        assert_eq!(m(Add, false, true, false, CANONICAL_NAN, f(1.0), 0), 0);
        assert_eq!(m(Fma, false, false, true, f(-1.0), f(2.0), f(0.5)), 0);
        assert_eq!(m(Fma, false, false, true, f(1.0), f(2.0), f(0.5)), f(2.5));
        assert_eq!(m(Add, true, false, false, 0x0001, 0x0001, 0), 0);
        assert_eq!(m(Add, false, false, false, 0x0001, 0x0001, 0), 0x0002);
        assert_eq!(m(Neg, true, false, false, 0x0001, 0, 0), 0x8000);
        // min/max: NaN gives the other, -0 below +0.
        assert_eq!(h(Min, CANONICAL_NAN, f(3.0), 0), f(3.0));
        assert_eq!(h(Max, f(3.0), 0x7e00, 0), f(3.0));
        assert_eq!(h(Min, 0x7e00, 0x7e00, 0), CANONICAL_NAN);
        assert_eq!(h(Min, 0x0000, 0x8000, 0), 0x8000);
        assert_eq!(h(Max, 0x8000, 0x0000, 0), 0x0000);
        assert_eq!(h(Max, f(-1.0), f(-2.0), 0), f(-1.0));
        assert_eq!(h(Abs, 0xbc00, 0, 0), 0x3c00);
        assert_eq!(h(Neg, 0x3c00, 0, 0), 0xbc00);
    }

    #[test]
    fn half_arithmetic_matches_a_search_for_the_nearest() {
        // Pseudo-random operands (f16 over its whole range): the result
        // is the nearest value to the exact one.
        let mut s = 1u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 16) as u16
        };
        for ty in [Half::F16, Half::Bf16] {
            for i in 0..3000 {
                let (mut a, mut b, mut c) = (next(), next(), next());
                if ty == Half::Bf16 {
                    // bfloat16 near 1, where the exact values below are
                    // integers.
                    a = (a & 0x807f) | 0x3f00;
                    b = (b & 0x807f) | 0x3f80;
                    c = (c & 0x807f) | 0x3e00;
                }
                if [a, b, c].iter().any(|&x| !value(ty, x).is_finite()) {
                    continue;
                }
                // Exact values times 2^48: f16 operands are multiples of
                // 2^-24, these bfloat16 ones of 2^-10.
                let sc = |h| scaled(ty, h, 24);
                let (sa, sb) = (sc(a), sc(b));
                let sum = scaled(ty, a, 48) + scaled(ty, b, 48);
                let fma = sa * sb + scaled(ty, c, 48);
                for (op, exact) in [
                    (HalfOp::Add, sum),
                    (HalfOp::Mul, sa * sb),
                    (HalfOp::Fma, fma),
                ] {
                    let v = exact as f64 / 2f64.powi(48);
                    let lim = if ty == Half::F16 { 65504.0 } else { 1e30 };
                    if v.abs() > lim || exact == 0 {
                        continue;
                    }
                    let got = half_arith(op, ty, false, false, false, a, b, c);
                    let want = nearest(ty, exact);
                    assert_eq!(
                        got, want,
                        "{ty:?} {op:?} case {i}: {a:#06x} {b:#06x} {c:#06x}"
                    );
                }
            }
        }
    }
}
