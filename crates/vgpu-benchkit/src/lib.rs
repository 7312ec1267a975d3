//! Measurement helpers shared by the benchmarks. The machines these run on
//! are shared and noisy, so every benchmark compares variants measured
//! side by side: [`measure_rounds`] alternates them in rounds and rotates
//! which goes first, and results are read as ratios of percentiles.

#![warn(missing_docs)]

/// Bytes in a KiB.
pub const KIB: usize = 1024;
/// Bytes in a MiB.
pub const MIB: usize = 1024 * KIB;

/// Nearest-rank percentile (`p` in 0..=1) of sorted samples; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[idx]
}

/// Median and tail of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// 50th percentile.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Number of samples.
    pub n: usize,
}

/// Sorts `samples` and summarises them.
pub fn summarize(mut samples: Vec<u64>) -> Summary {
    samples.sort_unstable();
    Summary {
        p50: percentile(&samples, 0.50),
        p99: percentile(&samples, 0.99),
        n: samples.len(),
    }
}

/// How a figure compares with its target, as printed in result tables.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// "4 KiB", "16 MiB": a transfer size for tables.
pub fn size_label(size: usize) -> String {
    if size >= MIB {
        format!("{} MiB", size / MIB)
    } else {
        format!("{} KiB", size / KIB)
    }
}

/// Runs the variants alternately, rotating which goes first each round;
/// each call of a variant returns one sample (ns, or any unit). Every
/// variant is warmed up with `warmup` unrecorded calls at the start of each
/// of its turns, so machine noise lands on all of them alike.
pub fn measure_rounds(
    rounds: usize,
    batch: usize,
    warmup: usize,
    variants: &mut [&mut dyn FnMut() -> u64],
) -> Vec<Vec<u64>> {
    let n = variants.len();
    let mut samples = vec![Vec::with_capacity(rounds.saturating_mul(batch)); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let v = &mut *variants[i];
            for _ in 0..warmup {
                v();
            }
            let out = &mut samples[i];
            for _ in 0..batch {
                out.push(v());
            }
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_percentiles_and_summary() {
        let s = summarize((1..=100).rev().collect());
        assert_eq!((s.p50, s.p99, s.n), (51, 99, 100));
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 2.0), 7);
    }

    #[test]
    fn test_rounds_rotate_and_count() {
        let log = std::cell::RefCell::new(String::new());
        let mut a = || {
            log.borrow_mut().push('a');
            1
        };
        let mut b = || {
            log.borrow_mut().push('b');
            2
        };
        let out = measure_rounds(2, 3, 1, &mut [&mut a, &mut b]);
        assert_eq!(out, vec![vec![1; 6], vec![2; 6]]);
        assert_eq!(log.into_inner(), "aaaabbbbbbbbaaaa");
    }

    #[test]
    fn test_labels() {
        assert_eq!(size_label(4 * KIB), "4 KiB");
        assert_eq!(size_label(16 * MIB), "16 MiB");
        assert_eq!(verdict(true), "PASS");
    }
}
