//! The generator and the shuffle every order is drawn with: `pinfeed_source::rng`, shared with
//! the token windows, because saved positions rely on their exact output.

pub(super) use pinfeed_source::rng::{epoch_key, fisher_yates, hash2, SplitMix64};
