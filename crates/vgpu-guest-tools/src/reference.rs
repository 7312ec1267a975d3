//! CPU references of the built-in kernels and a small deterministic
//! random generator, for the samples and the guest test suite.

/// xorshift64* generator: deterministic, seedable, no dependencies.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so small seeds give good states.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// A seed from the clock and the process id.
    pub fn seed_from_time() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (u64::from(std::process::id()) << 32)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Fills `buf` with random bytes.
    pub fn fill_bytes(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let w = self.next_u64().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&w[..n]);
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill_bytes(&mut v);
        v
    }

    /// `n` floats uniform in [-1, 1).
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// Little-endian bytes of floats (the device's layout).
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Floats from little-endian bytes (a trailing partial float is dropped).
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `y = a * x + y`.
pub fn saxpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `c = a + b`.
pub fn vadd(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// Sum in f64.
pub fn reduce_sum(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x)).sum()
}

/// `C = alpha * A * B + beta * C` (row major; A is m x k, B is k x n),
/// accumulated in f64. Returns C and, per element, the error scale
/// `|alpha| * sum |a||b| + |beta * c|` for tolerances.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &[f32],
) -> (Vec<f32>, Vec<f64>) {
    let mut out = vec![0f32; m * n];
    let mut scale = vec![0f64; m * n];
    let mut acc = vec![0f64; n];
    let mut mag = vec![0f64; n];
    for i in 0..m {
        acc.iter_mut().for_each(|v| *v = 0.0);
        mag.iter_mut().for_each(|v| *v = 0.0);
        for (p, av) in a[i * k..(i + 1) * k].iter().enumerate() {
            let av = f64::from(*av);
            let brow = &b[p * n..(p + 1) * n];
            for ((s, m), bv) in acc.iter_mut().zip(mag.iter_mut()).zip(brow) {
                let prod = av * f64::from(*bv);
                *s += prod;
                *m += prod.abs();
            }
        }
        let row = i * n..(i + 1) * n;
        let outs = out[row.clone()]
            .iter_mut()
            .zip(scale[row.clone()].iter_mut());
        for (((o, sc), cv), (s, m)) in outs.zip(&c[row]).zip(acc.iter().zip(&mag)) {
            let beta_c = if beta == 0.0 {
                0.0
            } else {
                f64::from(beta) * f64::from(*cv)
            };
            *o = (f64::from(alpha) * s + beta_c) as f32;
            *sc = f64::from(alpha).abs() * m + beta_c.abs();
        }
    }
    (out, scale)
}

/// Compares `got` with `want`: element `i` passes when
/// `|got - want| <= atol + rtol * scale[i]` (`scale` defaults to
/// `|want|`). Returns the number of mismatches, the worst error and its
/// index.
pub fn compare(
    got: &[f32],
    want: &[f32],
    scale: Option<&[f64]>,
    rtol: f64,
    atol: f64,
) -> (usize, f64, usize) {
    let mut bad = 0;
    let mut worst = (0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(*g) - f64::from(*w)).abs();
        let s = scale.map_or(f64::from(*w).abs(), |s| s[i]);
        // NaN errors fail too.
        if err.is_nan() || err > atol + rtol * s {
            bad += 1;
        }
        if err > worst.0 || err.is_nan() {
            worst = (err, i);
        }
    }
    if got.len() != want.len() {
        bad += got.len().abs_diff(want.len());
    }
    (bad, worst.0, worst.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rng_is_deterministic_and_spread() {
        let a = Rng::new(1).bytes(33);
        let b = Rng::new(1).bytes(33);
        assert_eq!(a, b);
        assert_ne!(Rng::new(2).bytes(33), a);
        let v = Rng::new(7).f32s(10_000);
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean: f32 = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05);
    }

    #[test]
    fn test_sgemm_reference() {
        // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]
        let (c, s) = sgemm(
            2,
            2,
            2,
            1.0,
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0, 7.0, 8.0],
            0.5,
            &[2.0, 0.0, 0.0, 2.0],
        );
        assert_eq!(c, vec![20.0, 22.0, 43.0, 51.0]);
        assert_eq!(s[0], 19.0 + 1.0);
        let (bad, _, _) = compare(&c, &[20.0, 22.0, 43.0, 51.0001], Some(&s), 1e-5, 0.0);
        assert_eq!(bad, 0);
        let (bad, _, idx) = compare(&c, &[20.0, 22.0, 43.0, 52.0], Some(&s), 1e-5, 0.0);
        assert_eq!((bad, idx), (1, 3));
    }

    #[test]
    fn test_compare_flags_nan() {
        let (bad, _, _) = compare(&[f32::NAN], &[1.0], None, 1e-3, 1e-3);
        assert_eq!(bad, 1);
    }

    #[test]
    fn test_float_bytes_round_trip() {
        let v = vec![1.5f32, -2.25, 0.0];
        assert_eq!(bytes_f32(&f32_bytes(&v)), v);
    }
}
