//! Data mixtures: weighted blends of several sources whose records agree in layout, each
//! sample's source and place a pure function of the seed, the epoch and its index.
//!
//! - [`BlendSpec`] and [`Blend`]: the schedule. In [`BlendMode::Exact`] every step (the global
//!   batch of `step` samples) holds each source's share, rounded so that the counts add up
//!   ([`rounded_counts`]), in the order of Megatron's error-minimising rule
//!   ([`exhaustive_order`]); in [`BlendMode::Sampled`] each sample's source is drawn from
//!   `(seed, epoch, i)`. A curriculum changes the weights from given steps on; [`Exhausted`]
//!   says what a source does when a pass of it runs out.
//! - [`EpochBlend`]: one epoch of it: sample `i`'s source and ordinal ([`EpochBlend::locate`])
//!   and each source's count before `i` ([`EpochBlend::given_before`]), whatever the ranks,
//!   batching or resume, since the loader reads the epoch's samples by index.
//! - [`Mixture`]: the blend as a [`Source`](crate::Source): its record `i` is read from the
//!   source the blend picks, at the ordinal's place in that source's pass ([`Permutation`]
//!   orders the passes), so the loader's ring, order, sharding and resume carry a mixture as
//!   they carry one source.
//!
//! ```
//! use pinfeed_source::mixture::{Blend, BlendMode, BlendSpec, Exhausted};
//!
//! let names = ["web".to_string(), "code".into(), "math".into()];
//! let spec = BlendSpec {
//!     pass_len: vec![1000, 600, 400],
//!     exhausted: vec![Exhausted::Stop, Exhausted::Cycle, Exhausted::Cycle],
//!     mode: BlendMode::Exact,
//!     seed: 0,
//!     step: 10,
//!     curriculum: vec![(0, vec![0.5, 0.3, 0.2])],
//!     samples_per_epoch: None,
//! };
//! let epoch = Blend::new(spec, &names)?.epoch(0)?;
//! assert_eq!(epoch.len(), 2000); // "web" stops after its 1000 samples, half of each step
//! let step: Vec<u16> = epoch.locate(10, 10).iter().map(|&(s, _)| s).collect();
//! assert_eq!(step, [0, 1, 2, 0, 1, 0, 2, 0, 1, 0]); // 5, 3 and 2 of each step
//! assert_eq!(epoch.given_before(20), [10, 6, 4]);
//! # Ok::<(), pinfeed_source::SourceError>(())
//! ```

mod permute;
mod rule;
mod schedule;
mod source;
#[cfg(test)]
mod tests;

pub use permute::Permutation;
pub use rule::{exhaustive_order, rounded_counts};
pub use schedule::{Blend, BlendMode, BlendSpec, EpochBlend, Exhausted};
pub use source::{holding_back, source_key, Mixture, SourceStats};

use crate::SourceError;

/// A mixture that cannot be made as asked, in one line.
pub(crate) fn mixture_error(reason: impl Into<String>) -> SourceError {
    SourceError::Mixture {
        reason: reason.into(),
    }
}
