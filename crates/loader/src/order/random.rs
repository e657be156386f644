//! The generator and the shuffle every order is drawn with: `pinfeed_source::rng`, shared with
//! the token windows, because saved positions rely on their exact output.

pub(super) use pinfeed_source::rng::{epoch_key, fisher_yates, hash2, SplitMix64};

/// What each word drawn from an epoch's key (`hash2(epoch_key(seed, epoch), word)`) seeds.
/// Saved positions rely on the draws, so each number is fixed for good.
pub(super) mod words {
    /// The random permutation (`ahead::table_seed`).
    pub(in crate::order) const PERMUTATION: u64 = 1;
    /// The order of the blocks of a block shuffle.
    pub(in crate::order) const BLOCK_ORDER: u64 = 2;
    /// The key from which each window of a block shuffle is drawn.
    pub(in crate::order) const WINDOWS: u64 = 3;
}
