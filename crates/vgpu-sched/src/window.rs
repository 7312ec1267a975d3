//! Device time consumed over a sliding window, in fixed memory, for caps.
//!
//! Time (nanoseconds since the scheduler's epoch) is cut into buckets of
//! `window / 64`; a ring of 65 buckets always covers the last `window`
//! entirely, plus at most one bucket. The usage reported is the sum of the
//! ring, so it errs on the strict side by at most 1/64 of the window. A
//! command's charge is spread evenly over the interval it ran in,
//! `[finish - charge, finish]`.

const BUCKETS: u64 = 64;
const SLOTS: u64 = BUCKETS + 1;

pub(crate) struct CapWindow {
    bucket_ns: u64,
    ring: [u64; SLOTS as usize],
    /// Absolute index of the newest bucket.
    newest: u64,
    /// Sum of `ring`.
    sum: u64,
}

impl CapWindow {
    pub(crate) fn new(window_ns: u64) -> Self {
        CapWindow {
            bucket_ns: (window_ns / BUCKETS).max(1),
            ring: [0; SLOTS as usize],
            newest: 0,
            sum: 0,
        }
    }

    fn slot(i: u64) -> usize {
        (i % SLOTS) as usize
    }

    /// Moves the ring forward to the bucket holding `now_ns`, forgetting
    /// buckets that fall out.
    fn advance(&mut self, now_ns: u64) {
        let idx = now_ns / self.bucket_ns;
        if idx <= self.newest {
            return;
        }
        let steps = (idx - self.newest).min(SLOTS);
        for k in 1..=steps {
            let s = Self::slot(self.newest + k);
            self.sum -= self.ring[s];
            self.ring[s] = 0;
        }
        self.newest = idx;
    }

    /// Charges `charge_ns` that ended at `now_ns`.
    pub(crate) fn record(&mut self, now_ns: u64, charge_ns: u64) {
        self.advance(now_ns);
        let start = now_ns.saturating_sub(charge_ns);
        let oldest = self.newest.saturating_sub(SLOTS - 1);
        let first = (start / self.bucket_ns).max(oldest);
        for i in first..=self.newest {
            let lo = start.max(i.saturating_mul(self.bucket_ns));
            let hi = now_ns.min(i.saturating_add(1).saturating_mul(self.bucket_ns));
            if hi > lo {
                let s = Self::slot(i);
                self.ring[s] = self.ring[s].saturating_add(hi - lo);
                self.sum = self.sum.saturating_add(hi - lo);
            }
        }
    }

    /// Device time within (at least) the last window.
    #[cfg(test)]
    pub(crate) fn usage(&mut self, now_ns: u64) -> u64 {
        self.advance(now_ns);
        self.sum
    }

    /// `None` if a command estimated at `est_ns` fits under `budget_ns`
    /// now; otherwise the first instant (ns) at which it will, as history
    /// leaves the window. `est_ns` must not exceed `budget_ns`.
    pub(crate) fn blocked_until(
        &mut self,
        now_ns: u64,
        budget_ns: u64,
        est_ns: u64,
    ) -> Option<u64> {
        self.advance(now_ns);
        if self.sum.saturating_add(est_ns) <= budget_ns {
            return None;
        }
        let mut remaining = self.sum;
        let oldest = self.newest.saturating_sub(SLOTS - 1);
        for i in oldest..=self.newest {
            remaining -= self.ring[Self::slot(i)];
            if remaining.saturating_add(est_ns) <= budget_ns {
                // Bucket i leaves the ring once the newest index reaches i + SLOTS.
                return Some(i.saturating_add(SLOTS).saturating_mul(self.bucket_ns));
            }
        }
        Some(
            self.newest
                .saturating_add(SLOTS)
                .saturating_mul(self.bucket_ns),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn usage_slides() {
        let mut w = CapWindow::new(64 * MS); // 1 ms buckets
        w.record(10 * MS, 4 * MS); // 6..10 ms
        assert_eq!(w.usage(10 * MS), 4 * MS);
        // Still inside (now - window, now] at 69.9 ms.
        assert_eq!(w.usage(69 * MS + 900_000), 4 * MS);
        // Buckets 6..10 leave one by one once the ring passes them.
        assert_eq!(w.usage(71 * MS), 3 * MS);
        assert_eq!(w.usage(74 * MS), 0);
        // A long jump clears everything.
        w.record(80 * MS, MS);
        assert_eq!(w.usage(10_000 * MS), 0);
    }

    #[test]
    fn charge_older_than_ring_is_dropped() {
        let mut w = CapWindow::new(64 * MS);
        w.record(200 * MS, 500 * MS);
        assert!(w.usage(200 * MS) <= 65 * MS);
        assert!(w.usage(200 * MS) >= 64 * MS);
        let mut w = CapWindow::new(64 * MS);
        w.record(0, 5 * MS); // before the epoch: clipped to [0, 0]
        assert_eq!(w.usage(0), 0);
    }

    #[test]
    fn blocked_until_is_when_enough_leaves() {
        let mut w = CapWindow::new(64 * MS);
        // 16 ms used at 0..16 ms, budget 16 ms, next command 1 ms.
        w.record(16 * MS, 16 * MS);
        assert_eq!(w.blocked_until(16 * MS, 17 * MS, MS), None);
        let at = w.blocked_until(16 * MS, 16 * MS, MS).unwrap();
        // Bucket 0 leaves when the newest bucket is 65: at 65 ms.
        assert_eq!(at, 65 * MS);
        assert!(w.blocked_until(at - 1, 16 * MS, MS).is_some());
        assert_eq!(w.blocked_until(at, 16 * MS, MS), None);
        // Zero budget: only an empty window is eligible.
        let mut w = CapWindow::new(64 * MS);
        assert_eq!(w.blocked_until(0, 0, 0), None);
        w.record(MS, 1);
        assert!(w.blocked_until(MS, 0, 0).is_some());
    }
}
