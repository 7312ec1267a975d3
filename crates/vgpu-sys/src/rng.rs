//! A small deterministic generator (xorshift64) for tests and benches:
//! the same seed gives the same data on every run.

/// xorshift64; the seed must not be zero.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` bytes, the low byte of one value each.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_sequence_is_fixed_by_the_seed() {
        let mut a = Rng(7);
        let mut b = Rng(7);
        assert_eq!(a.bytes(64), b.bytes(64));
        assert_ne!(Rng(7).next_u64(), Rng(8).next_u64());
        // The first value of seed 1, by hand: 1 ^ 1<<13, then >>7, then <<17.
        let mut x = 1u64;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_eq!(Rng(1).next_u64(), x);
    }
}
