//! A pseudo-random permutation of `0 .. n` evaluated one place at a time: the order of one
//! pass of a source, with no table held however many samples it has.

use crate::rng::{hash2, mix64};

/// Feistel rounds: four make a balanced Feistel network a pseudo-random permutation (Luby and
/// Rackoff); two more for good measure with a cheap round function.
const ROUNDS: u64 = 6;

/// A bijection of `0 .. n` drawn from `key`: a balanced Feistel network over the smallest
/// power of four at least `n`, cycle-walked back into `0 .. n` (fewer than four steps on
/// average, since that power is below `4 n`). Saved positions rely on this exact rule.
#[derive(Clone, Copy, Debug)]
pub struct Permutation {
    n: u64,
    /// Bits of each half of the network's domain.
    half_bits: u32,
    key: u64,
}

impl Permutation {
    /// The permutation of `0 .. n` drawn from `key`.
    pub fn new(n: u64, key: u64) -> Permutation {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        Permutation {
            n,
            half_bits: bits.div_ceil(2).max(1),
            key,
        }
    }

    /// The place `i` (below `n`) is sent to.
    pub fn get(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.network(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn network(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for round in 0..ROUNDS {
            let f = mix64(hash2(self.key, round) ^ right) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_is_taken_once() {
        for n in [1u64, 2, 3, 5, 16, 17, 1000, 4097] {
            for key in 0..4 {
                let p = Permutation::new(n, key);
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let j = p.get(i) as usize;
                    assert!(!seen[j], "n {n} key {key}: {j} twice");
                    seen[j] = true;
                }
            }
        }
    }

    #[test]
    fn keys_give_different_orders() {
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        let same = (0..1000).filter(|&i| a.get(i) == b.get(i)).count();
        assert!(same < 20, "{same} places agree");
        // Not the identity either.
        assert!((0..1000).filter(|&i| a.get(i) == i).count() < 20);
    }

    #[test]
    fn output_is_pinned() {
        // Saved positions rely on the rule: a change here changes every saved mixture.
        let p = Permutation::new(10, 7);
        let got: Vec<u64> = (0..10).map(|i| p.get(i)).collect();
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_eq!(got, PINNED);
    }

    const PINNED: [u64; 10] = [0, 9, 6, 4, 8, 1, 2, 5, 3, 7];
}
