//! Row-group-aware orders of a table's token or text column: the chunks (row groups, record
//! batches, JSON-lines files) in a shuffled order, taken a few at a time, and the windows or
//! documents of each few shuffled among themselves. A chunk is decoded whole whatever is read
//! of it, and the decoded ones share one cache ([`crate::table::cache_limit`]): read in a
//! global random order, a column larger than the cache decodes a chunk for nearly every
//! window, while in this order each chunk is decoded about once an epoch.

use crate::rng::{fisher_yates, hash2, SplitMix64};

/// Tags the keys of chunk orders.
const TAG: u64 = 0x6368_756e_6b73; // "chunks"
/// Mixed into an epoch's key: for the order of the chunks, for the shuffle of each group's
/// items, and for the shuffle of each group's windows of documents.
const CHUNKS: u64 = 1;
const ITEMS: u64 = 2;
const WINDOWS: u64 = 3;

/// Items (windows or documents) numbered chunk by chunk, in the row-group-aware order of
/// `(seed, epoch)`.
///
/// Chunk `c` holds `counts[c]` items, numbered on from those of chunk `c - 1`, and decodes to
/// `bytes[c]` bytes. The chunks are put in the order of a Fisher-Yates shuffle driven by
/// SplitMix64 from a key of the seed and the epoch; that order is cut into groups of
/// consecutive chunks whose bytes add up to at most `budget` (a larger chunk is a group of its
/// own); and each group's items are shuffled among themselves. So every item comes once, and
/// reading them in this order needs one group's chunks at a time: each chunk is decoded about
/// once, where a cache of twice the budget keeps the group being read and the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkOrder {
    /// The items in reading order: a permutation of `0 .. sum(counts)`.
    items: Vec<u64>,
    /// Group `g` is `items[groups[g] .. groups[g + 1]]`; 0 first, `items.len()` last.
    groups: Vec<usize>,
    /// The epoch's key.
    key: u64,
}

impl ChunkOrder {
    /// The order of `(seed, epoch)` of the items of chunks holding `counts` items and decoding
    /// to `bytes`, in groups of at most `budget` decoded bytes.
    ///
    /// # Panics
    /// If `counts` and `bytes` differ in length.
    pub fn new(seed: u64, epoch: u64, counts: &[u64], bytes: &[u64], budget: u64) -> ChunkOrder {
        assert_eq!(counts.len(), bytes.len(), "a count and a size a chunk");
        let key = hash2(hash2(TAG, seed), epoch);
        let mut chunks: Vec<usize> = (0..counts.len()).collect();
        fisher_yates(&mut chunks, &mut SplitMix64::new(hash2(key, CHUNKS)));
        let mut first = Vec::with_capacity(counts.len());
        let mut total = 0u64;
        for &n in counts {
            first.push(total);
            total += n;
        }
        let mut items = Vec::with_capacity(total as usize);
        let (mut groups, mut held, mut taken) = (vec![0], 0u64, 0usize);
        for c in chunks {
            if taken > 0 && held.saturating_add(bytes[c]) > budget {
                groups.push(items.len());
                (held, taken) = (0, 0);
            }
            items.extend(first[c]..first[c] + counts[c]);
            held = held.saturating_add(bytes[c]);
            taken += 1;
        }
        groups.push(items.len());
        shuffle_groups(&mut items, &groups, hash2(key, ITEMS));
        ChunkOrder { items, groups, key }
    }

    /// The items in reading order.
    pub fn items(&self) -> &[u64] {
        &self.items
    }

    /// Where each group starts in [`ChunkOrder::items`], and the number of items last.
    pub fn groups(&self) -> &[usize] {
        &self.groups
    }

    /// The items, in reading order.
    pub fn into_items(self) -> Vec<u64> {
        self.items
    }

    /// `0 .. bounds[last]` with each range `bounds[g] .. bounds[g + 1]` shuffled among itself,
    /// by this epoch's key: the windows cut from the documents of each group, where
    /// `bounds[g]` is the first window that starts in group `g`'s documents.
    pub fn windows_within(&self, bounds: &[u64]) -> Vec<u64> {
        let end = bounds.last().copied().unwrap_or(0);
        let mut windows: Vec<u64> = (0..end).collect();
        let bounds: Vec<usize> = bounds.iter().map(|&b| b as usize).collect();
        shuffle_groups(&mut windows, &bounds, hash2(self.key, WINDOWS));
        windows
    }
}

/// Shuffles each `items[bounds[g] .. bounds[g + 1]]` by SplitMix64 from `hash2(key, g)`.
fn shuffle_groups(items: &mut [u64], bounds: &[usize], key: u64) {
    for (g, pair) in bounds.windows(2).enumerate() {
        fisher_yates(
            &mut items[pair[0]..pair[1]],
            &mut SplitMix64::new(hash2(key, g as u64)),
        );
    }
}

/// How many of the `windows` windows (window `w` starting at token `w * stride`) start in
/// each chunk of `chunk_starts` (where each chunk starts, the number of tokens last).
pub(crate) fn windows_per_chunk(chunk_starts: &[u64], stride: u64, windows: u64) -> Vec<u64> {
    let first_at = |token: u64| token.div_ceil(stride).min(windows);
    chunk_starts
        .windows(2)
        .map(|c| first_at(c[1]) - first_at(c[0]))
        .collect()
}

/// How many of the documents starting at `document_starts` (their tokens' end last) start in
/// each chunk of `chunk_starts`; documents starting at the end of the tokens (empty ones) count
/// in the last chunk.
pub(crate) fn documents_per_chunk(chunk_starts: &[u64], document_starts: &[u64]) -> Vec<u64> {
    let starts = &document_starts[..document_starts.len().saturating_sub(1)];
    let chunks = chunk_starts.len().saturating_sub(1);
    let before = |c: usize| match c {
        c if c >= chunks => starts.len() as u64,
        c => starts.partition_point(|&s| s < chunk_starts[c]) as u64,
    };
    (0..chunks).map(|c| before(c + 1) - before(c)).collect()
}

/// The bytes each chunk of `chunk_starts` decodes to, at `width` bytes a token.
pub(crate) fn chunk_bytes(chunk_starts: &[u64], width: usize) -> Vec<u64> {
    chunk_starts
        .windows(2)
        .map(|c| (c[1] - c[0]).saturating_mul(width as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each chunk's items lie in one group, groups hold at most `budget` bytes (or one chunk),
    /// and every item comes once.
    fn check(order: &ChunkOrder, counts: &[u64], bytes: &[u64], budget: u64) {
        let total: u64 = counts.iter().sum();
        let mut seen: Vec<u64> = order.items().to_vec();
        seen.sort_unstable();
        assert_eq!(seen, (0..total).collect::<Vec<_>>());
        let chunk_of = |item: u64| {
            let mut c = 0;
            let mut end = counts[0];
            while item >= end {
                c += 1;
                end += counts[c];
            }
            c
        };
        let mut group_of = vec![None; counts.len()];
        for (g, pair) in order.groups().windows(2).enumerate() {
            let mut chunks: Vec<usize> = order.items()[pair[0]..pair[1]]
                .iter()
                .map(|&i| chunk_of(i))
                .collect();
            chunks.sort_unstable();
            chunks.dedup();
            let held: u64 = chunks.iter().map(|&c| bytes[c]).sum();
            assert!(
                held <= budget || chunks.len() == 1,
                "group {g}: {held} bytes"
            );
            for c in chunks {
                assert_eq!(group_of[c].replace(g), None, "chunk {c} in two groups");
            }
        }
    }

    #[test]
    fn every_item_once_in_groups_within_the_budget() {
        let counts = [5u64, 0, 7, 3, 9, 1, 4, 6, 2, 8];
        let bytes: Vec<u64> = counts.iter().map(|&n| 100 * n + 10).collect();
        for budget in [0u64, 300, 1000, 1 << 40] {
            for (seed, epoch) in [(0, 0), (1, 0), (1, 1), (9, 4)] {
                let order = ChunkOrder::new(seed, epoch, &counts, &bytes, budget);
                check(&order, &counts, &bytes, budget);
                assert_eq!(order, ChunkOrder::new(seed, epoch, &counts, &bytes, budget));
            }
        }
        // A budget that holds everything is one group: every item shuffled with every other.
        let all = ChunkOrder::new(3, 0, &counts, &bytes, 1 << 40);
        assert_eq!(all.groups(), &[0, 45]);
        // A budget of nothing is a chunk a group.
        let one = ChunkOrder::new(3, 0, &counts, &bytes, 0);
        assert_eq!(one.groups().len(), counts.len() + 1);
    }

    #[test]
    fn the_order_is_pure_in_seed_and_epoch() {
        let counts = [50u64; 20];
        let bytes = [1000u64; 20];
        let order = |seed, epoch| ChunkOrder::new(seed, epoch, &counts, &bytes, 4000).items;
        assert_eq!(order(1, 2), order(1, 2));
        assert_ne!(order(1, 2), order(1, 3));
        assert_ne!(order(1, 2), order(2, 2));
    }

    #[test]
    fn windows_within_groups_keep_their_groups() {
        let order = ChunkOrder::new(0, 0, &[3, 3], &[1, 1], 0);
        let bounds = [0u64, 4, 9, 9, 12];
        let windows = order.windows_within(&bounds);
        for pair in bounds.windows(2) {
            let mut part = windows[pair[0] as usize..pair[1] as usize].to_vec();
            part.sort_unstable();
            assert_eq!(part, (pair[0]..pair[1]).collect::<Vec<_>>());
        }
        assert_ne!(windows, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn windows_and_documents_are_counted_in_the_chunk_they_start_in() {
        // Chunks of tokens 0..10, 10..10 (empty), 10..25, 25..30.
        let chunks = [0u64, 10, 10, 25, 30];
        // Windows of 5 + 1 tokens every 5: 0, 5, .., 20 (24 is the last token a window reads).
        assert_eq!(windows_per_chunk(&chunks, 5, 5), vec![2, 0, 3, 0]);
        // Windows every 4 tokens, 7 of them: starts 0, 4, 8 | 12, 16, 20, 24.
        assert_eq!(windows_per_chunk(&chunks, 4, 7), vec![3, 0, 4, 0]);
        // Documents starting at 0, 4, 10, 10 (empty), 18, 25, 30 (empty, at the end).
        let docs = [0u64, 4, 10, 10, 18, 25, 30, 30];
        assert_eq!(documents_per_chunk(&chunks, &docs), vec![2, 0, 3, 2]);
        assert_eq!(chunk_bytes(&chunks, 4), vec![40, 0, 60, 20]);
    }
}
