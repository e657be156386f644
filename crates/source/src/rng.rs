//! The generator and the shuffle every random order of pinfeed is drawn with: the loader's
//! record orders and the token windows' draws. Written here, not taken from a crate, because
//! saved positions rely on their exact output; the loader's order tests pin it.

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, and every seed,
/// 0 included, is a good one.
pub struct SplitMix64 {
    state: u64,
}

/// SplitMix64's increment: the odd integer nearest 2^64 divided by the golden ratio.
pub const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// A generator whose first output is `mix64(seed + GOLDEN_GAMMA)`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A uniform draw from `0 .. n`, `n >= 1`, without modulo bias (Lemire 2019: the high
    /// half of a 128-bit product, rejecting the few low halves that would favour some values).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut product = u128::from(self.next_u64()) * u128::from(n);
        if (product as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (product as u64) < threshold {
                product = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (product >> 64) as u64
    }
}

/// SplitMix64's output function: a bijection of `u64` that mixes every input bit into every
/// output bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Mixes two words into one; a bijection in each argument when the other is fixed, so
/// distinct epochs of one seed (or seeds of one epoch) never share a key.
pub fn hash2(a: u64, b: u64) -> u64 {
    mix64(a ^ mix64(b ^ 0x243f_6a88_85a3_08d3))
}

/// The key of an epoch's random draws.
pub fn epoch_key(seed: u64, epoch: u64) -> u64 {
    hash2(hash2(0x6f72_6465_7221, seed), epoch)
}

/// Shuffles `items` in place, every permutation equally likely given a uniform generator
/// (Durstenfeld's form: the last unshuffled place swaps with a random earlier-or-same one).
pub fn fisher_yates<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_output() {
        // The first outputs of the reference implementation seeded with 0.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn draws_stay_below_their_bound() {
        let mut r = SplitMix64::new(0);
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(r.below(n) < n);
            }
        }
    }
}
