//! The generator and the shuffle every order is drawn with. Written here, not taken from a
//! crate, because saved positions rely on their exact output (see the module above).

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, and every seed,
/// 0 included, is a good one.
pub(super) struct SplitMix64 {
    state: u64,
}

pub(super) const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A uniform draw from `0 .. n`, `n >= 1`, without modulo bias (Lemire 2019: the high
    /// half of a 128-bit product, rejecting the few low halves that would favour some values).
    pub(super) fn below(&mut self, n: u64) -> u64 {
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
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Mixes two words into one; a bijection in each argument when the other is fixed, so
/// distinct epochs of one seed (or seeds of one epoch) never share a key.
pub(super) fn hash2(a: u64, b: u64) -> u64 {
    mix64(a ^ mix64(b ^ 0x243f_6a88_85a3_08d3))
}

/// The key of an epoch's random draws.
pub(super) fn epoch_key(seed: u64, epoch: u64) -> u64 {
    hash2(hash2(0x6f72_6465_7221, seed), epoch)
}

/// Shuffles `items` in place, every permutation equally likely given a uniform generator
/// (Durstenfeld's form: the last unshuffled place swaps with a random earlier-or-same one).
pub(super) fn fisher_yates<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}
