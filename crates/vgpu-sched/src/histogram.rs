//! A fixed-size log-linear histogram of durations (nanoseconds).
//!
//! Values below 16 ns have a bucket each; above, every power of two is
//! split into 16 equal buckets, so a bucket is at most 1/16 of its value
//! wide and a quantile reported at the bucket's middle is within 3.2% of
//! a sample in it. 976 buckets cover all of `u64`.

use std::time::Duration;

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

pub(crate) struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// Lowest value and width of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let octave = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    ((SUB as u64 + sub) << octave, 1u64 << octave)
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }

    pub(crate) fn record(&mut self, d: Duration) {
        let v = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let c = &mut self.counts[index(v)];
        *c = c.saturating_add(1);
        self.count = self.count.saturating_add(1);
        self.sum_ns = self.sum_ns.saturating_add(u128::from(v));
        self.max_ns = self.max_ns.max(v);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    pub(crate) fn mean(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let ns = self.sum_ns / u128::from(self.count);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The `q` quantile (0..=1): the middle of the bucket holding the
    /// sample of that rank, never above the largest sample (which the
    /// top rank returns exactly).
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        // Rank of the sample, 1-based: ceil(q * count), at least 1.
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == self.count {
            return self.max();
        }
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= rank {
                let (low, width) = bounds(i);
                let mid = low.saturating_add((width - 1) / 2);
                return Duration::from_nanos(mid.min(self.max_ns));
            }
        }
        self.max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_bounds_agree() {
        for v in (0..5000u64).chain([u64::MAX, u64::MAX / 3, 1 << 40, (1 << 40) - 1]) {
            let i = index(v);
            assert!(i < BUCKETS);
            let (low, width) = bounds(i);
            assert!(
                low <= v && v - low < width,
                "v={v} i={i} low={low} width={width}"
            );
            assert!(width == 1 || width <= low / 16, "bucket too wide at {v}");
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_close() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), Duration::ZERO);
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let near = |got: Duration, want_us: f64| {
            let got = got.as_secs_f64() * 1e6;
            assert!(
                (got - want_us).abs() <= want_us * 0.04,
                "got {got} want {want_us}"
            );
        };
        near(h.quantile(0.5), 500.0);
        near(h.quantile(0.99), 990.0);
        near(h.quantile(0.0), 1.0);
        assert_eq!(h.quantile(1.0), Duration::from_micros(1000));
        assert_eq!(h.max(), Duration::from_micros(1000));
        near(h.mean(), 500.5);
        assert_eq!(h.count(), 1000);
        // Nonsense input does not panic.
        let _ = h.quantile(f64::NAN);
        let _ = h.quantile(-3.0);
        h.record(Duration::MAX);
        assert_eq!(h.max(), Duration::from_nanos(u64::MAX));
    }
}
