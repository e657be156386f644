//! The global order `P` of an epoch: the identity, a stored permutation, or a block order
//! whose windows are shuffled when first needed.

use std::sync::{Arc, Mutex};

use super::random::{epoch_key, fisher_yates, hash2, words, SplitMix64};
use super::{ahead, OrderSpec, Shuffle};
use crate::error::{LoaderError, Result};

/// Windows of a block order whose shuffles are kept: enough for the batches in flight across
/// a loader's reader threads to find theirs computed.
pub(super) const WINDOWS_KEPT: usize = 8;

/// The global order `P` of an epoch.
pub(super) enum Global {
    /// `P[p] = p`.
    Identity,
    /// `P` itself, shared with every order of the same records, seed and epoch
    /// ([`super::ahead`]).
    Random(Arc<Table>),
    /// `P` as a block order and lazily shuffled windows.
    Block(Blocks),
}

impl Global {
    pub(super) fn new(spec: &OrderSpec, epoch: u64) -> Result<Global> {
        let key = epoch_key(spec.seed, epoch);
        let n = spec.num_records;
        Ok(match spec.shuffle {
            Shuffle::None => Global::Identity,
            Shuffle::Random => {
                Global::Random(ahead::table(n, ahead::table_seed(spec.seed, epoch))?)
            }
            Shuffle::Block { block, window } => Global::Block(Blocks::new(n, block, window, key)?),
        })
    }

    /// Appends `P[from .. to]`, `from < to <= num_records`.
    pub(super) fn push(&self, from: u64, to: u64, out: &mut Vec<u64>) {
        match self {
            Global::Identity => out.extend(from..to),
            Global::Random(table) => table.push(from, to, out),
            Global::Block(blocks) => blocks.push(from, to, out),
        }
    }
}

/// A permutation of `0 .. len`, held in 32 bits an entry where that suffices.
pub(super) enum Table {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Table {
    /// `0 .. n` shuffled by Fisher–Yates. Both widths make the same permutation: the draws
    /// depend on the length only.
    pub(super) fn shuffled(n: u64, rng: &mut SplitMix64) -> Result<Table> {
        Table::shuffled_with_width(n, rng, n <= u64::from(u32::MAX) + 1)
    }

    pub(super) fn shuffled_with_width(n: u64, rng: &mut SplitMix64, narrow: bool) -> Result<Table> {
        fn identity<T>(n: u64, entry: fn(u64) -> T) -> Result<Vec<T>> {
            let too_big = || {
                LoaderError::Config(format!(
                    "cannot hold a shuffled order of {n} records ({} bytes); \
                     use block shuffling, which keeps only the order of the blocks",
                    n.saturating_mul(std::mem::size_of::<T>() as u64)
                ))
            };
            let len = usize::try_from(n).map_err(|_| too_big())?;
            let mut v = Vec::new();
            v.try_reserve_exact(len).map_err(|_| too_big())?;
            v.extend((0..n).map(entry));
            Ok(v)
        }
        Ok(if narrow {
            // `narrow` only while every entry is below 2³².
            let mut v = identity(n, |i| i as u32)?;
            fisher_yates(&mut v, rng);
            Table::Narrow(v)
        } else {
            let mut v = identity(n, |i| i)?;
            fisher_yates(&mut v, rng);
            Table::Wide(v)
        })
    }

    pub(super) fn get(&self, i: u64) -> u64 {
        match self {
            Table::Narrow(v) => u64::from(v[i as usize]),
            Table::Wide(v) => v[i as usize],
        }
    }

    pub(super) fn push(&self, from: u64, to: u64, out: &mut Vec<u64>) {
        let (from, to) = (from as usize, to as usize);
        match self {
            Table::Narrow(v) => out.extend(v[from..to].iter().map(|&x| u64::from(x))),
            Table::Wide(v) => out.extend_from_slice(&v[from..to]),
        }
    }
}

/// The global order of [`Shuffle::Block`].
pub(super) struct Blocks {
    num_records: u64,
    block: u64,
    window: u64,
    /// Block ids in reading order (block `k` holds records `k × block ..`): a permutation of
    /// `0 .. ceil(num_records / block)`.
    pub(super) order: Table,
    /// `starts[w]` is the position in `P` of window `w`'s first record, and the last entry is
    /// `num_records`; strictly increasing, `starts[w + 1] - starts[w] <= window × block`.
    pub(super) starts: Vec<u64>,
    /// Seeds window `w`'s shuffle, with `w`.
    window_key: u64,
    /// Recently shuffled windows `(w, records)`, the most recent last; at most
    /// [`WINDOWS_KEPT`].
    kept: Mutex<Vec<(u64, Arc<[u64]>)>>,
}

impl Blocks {
    pub(super) fn new(num_records: u64, block: u64, window: u64, key: u64) -> Result<Blocks> {
        let num_blocks = num_records.div_ceil(block);
        let order = Table::shuffled(
            num_blocks,
            &mut SplitMix64::new(hash2(key, words::BLOCK_ORDER)),
        )?;
        let num_windows = num_blocks.div_ceil(window);
        let mut starts = Vec::new();
        usize::try_from(num_windows + 1)
            .ok()
            .and_then(|len| starts.try_reserve_exact(len).ok())
            .ok_or_else(|| {
                LoaderError::Config(format!(
                    "cannot hold where the {num_windows} windows of a block order start;                      use larger blocks or windows"
                ))
            })?;
        let mut position = 0;
        for w in 0..num_windows {
            starts.push(position);
            for b in w * window..num_blocks.min((w + 1).saturating_mul(window)) {
                let first = order.get(b) * block;
                position += block.min(num_records - first);
            }
        }
        starts.push(position);
        debug_assert_eq!(position, num_records);
        Ok(Blocks {
            num_records,
            block,
            window,
            order,
            starts,
            window_key: hash2(key, words::WINDOWS),
            kept: Mutex::new(Vec::with_capacity(WINDOWS_KEPT + 1)),
        })
    }

    pub(super) fn push(&self, from: u64, to: u64, out: &mut Vec<u64>) {
        let mut p = from;
        while p < to {
            let w = self.starts.partition_point(|&s| s <= p) - 1;
            let (start, end) = (self.starts[w], self.starts[w + 1]);
            let upto = to.min(end);
            let records = self.window(w as u64);
            out.extend_from_slice(&records[(p - start) as usize..(upto - start) as usize]);
            p = upto;
        }
    }

    /// Window `w`'s records in their shuffled order.
    pub(super) fn window(&self, w: u64) -> Arc<[u64]> {
        let kept = |kept: &Vec<(u64, Arc<[u64]>)>| {
            kept.iter()
                .find(|(k, _)| *k == w)
                .map(|(_, r)| Arc::clone(r))
        };
        if let Some(records) = kept(&self.kept.lock().unwrap_or_else(|p| p.into_inner())) {
            return records;
        }
        // Shuffled outside the lock so readers needing other windows do not wait; two threads
        // may both shuffle one window, with the same result.
        let num_blocks = self.num_records.div_ceil(self.block);
        let mut records = Vec::new();
        for b in w * self.window..num_blocks.min((w + 1).saturating_mul(self.window)) {
            let first = self.order.get(b) * self.block;
            records.extend(first..self.num_records.min(first + self.block));
        }
        fisher_yates(
            &mut records,
            &mut SplitMix64::new(hash2(self.window_key, w)),
        );
        let records: Arc<[u64]> = records.into();
        let mut kept_now = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept(&kept_now).is_none() {
            kept_now.push((w, Arc::clone(&records)));
            if kept_now.len() > WINDOWS_KEPT {
                kept_now.remove(0);
            }
        }
        records
    }
}
