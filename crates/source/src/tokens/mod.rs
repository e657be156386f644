//! Token streams for language-model training: windows of `seq_len + 1` tokens out of flat
//! token files and Megatron indexed datasets, and the rules that pick them.
//!
//! - [`TokenStream`]: the tokens of nanoGPT's `train.bin` (raw tokens of a dtype the user
//!   names), of a 1-D integer `.npy`, or of a directory or glob of such files read as one stream
//!   in sorted name order.
//! - [`IndexedDataset`]: a Megatron `.bin` + `.idx` pair, as megatron-core's
//!   `IndexedDatasetBuilder` writes it; its tokens, sequences and documents.
//! - [`TokenWindows`]: a [`Source`](crate::Source) whose records are windows of `seq_len + 1`
//!   tokens at their stored width, window `i` starting at token `i * stride`: stride 1 for
//!   random sampling, stride `seq_len` for consecutive windows that share one token (the last
//!   target of one is the first input of the next, as nanoGPT's evaluation and Megatron read).
//! - [`SampledWindows`]: a [`Source`](crate::Source) whose record `v` is the window at a
//!   uniformly random token offset drawn from `(seed, epoch, v)` ([`sampled_offset`]):
//!   nanoGPT's sampling, read in order by the loader, so that steps are deterministic, split
//!   across ranks and resumed by the loader's own position.
//! - [`DocumentPlan`] and [`DocumentWindows`]: [`Documents`] (of an indexed dataset, or a
//!   table's token or text column, one document a row) in a shuffled order
//!   ([`document_order`]), concatenated and cut into windows, with the documents each window holds
//!   ([`DocumentPlan::document_ids`], [`DocumentPlan::cu_seqlens`]) for document masking;
//!   [`DocumentWindows`] records carry each token's segment id after the tokens.
//! - [`ChunkOrder`]: the row-group-aware order of a table's column ([`TokenShuffle`]): its
//!   chunks (row groups) shuffled and taken a few at a time, the windows or documents of each
//!   few shuffled among themselves, so that a shuffled epoch decodes each chunk about once.
//! - [`open`]: any of these from a path and [`TokenOptions`], as the Python bindings and the
//!   command line open them.
//!
//! ```
//! use std::sync::Arc;
//! use pinfeed_source::tokens::{SampledWindows, TokenDType, TokenStream, TokenWindows};
//! use pinfeed_source::Source;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("train.bin"); // tokens 0 .. 100 as uint16
//! std::fs::write(&path, (0u16..100).flat_map(u16::to_le_bytes).collect::<Vec<u8>>()).unwrap();
//!
//! let stream = Arc::new(TokenStream::open(&path, Some(TokenDType::U16))?);
//! let windows = TokenWindows::new(stream, 8, 1)?; // seq_len 8: windows of 9 tokens
//! assert_eq!(windows.num_records(), 92); // nanoGPT's len(data) - block_size offsets
//!
//! // Random windows, 100 steps of 4: step 3's batch is records 12 .. 16, a (4, 9) uint16 array.
//! let sampled = SampledWindows::new(windows.stream().clone(), 8, 0, 0, 100 * 4)?;
//! let mut batch = vec![0u8; 4 * sampled.layout().record_bytes()];
//! sampled.read_records(3 * 4, &mut batch)?;
//! assert_eq!(u16::from_le_bytes([batch[0], batch[1]]) as u64, sampled.offset(12));
//! # Ok::<(), pinfeed_source::SourceError>(())
//! ```

mod chunks;
mod documents;
mod dtype;
mod megatron;
mod open;
mod sampled;
mod starts;
mod stream;
#[cfg(test)]
mod testing;
mod widen;
mod windows;

pub use chunks::ChunkOrder;
pub use documents::{document_order, DocumentPlan, DocumentWindows, Documents, Segment};
pub use dtype::TokenDType;
pub use megatron::IndexedDataset;
pub use open::{
    from_stream, is_indexed, open, order_fingerprint, Sample, TokenOptions, TokenShuffle,
    TokenSource,
};
pub use sampled::{sampled_offset, SampledWindows};
pub use starts::Boundaries;
pub use stream::TokenStream;
pub use widen::Widened;
pub use windows::TokenWindows;

use crate::SourceError;

/// A token dataset that cannot be used as asked: one line naming the file (or pattern) and
/// what is wrong.
pub(crate) fn invalid(name: impl std::fmt::Display, reason: impl Into<String>) -> SourceError {
    SourceError::Tokens {
        name: name.to_string(),
        reason: reason.into(),
    }
}
