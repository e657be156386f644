//! Permutations drawn ahead. A random shuffle's global order is one permutation of every
//! record, drawn serially by Fisher–Yates (1.49 million records: 5-9 ms on the 2-core
//! development machine), and a pass cannot read its first batch before it is made. So when a
//! plan takes the order of an epoch, the permutation of the epoch after it is drawn on a thread
//! of its own while this one runs, and kept here, where the next epoch of the same plan, the
//! next pass (Python starts each iteration as a new loader), or another rank's loader of the
//! same dataset in this process (the permutation depends on the records, the seed and the
//! epoch only) finds it made.
//!
//! Bounded: [`KEPT`] permutations a process, and only tables of at most [`AHEAD_MAX_BYTES`];
//! larger ones are drawn when needed, by the plan that needs them.
//!
//! Never waited for across a `fork`: the kept permutations' lock is only tried (a lock held by
//! a thread that did not follow the fork into the child is passed by, and the permutation
//! drawn), and a child does not take its parent's (one may be half drawn by a thread the child
//! does not have).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use super::global::Table;
use super::random::{epoch_key, hash2, SplitMix64};
use super::{OrderSpec, Shuffle};
use crate::error::Result;

/// Permutations kept: the current and the next epoch's of two datasets at once (a training
/// and an evaluation loader, say).
const KEPT: usize = 4;

/// The largest permutation drawn ahead, in bytes of its table (4 bytes a record up to 2³²
/// records): 64 MiB, 16 Mi records.
pub(crate) const AHEAD_MAX_BYTES: u64 = 64 << 20;

/// A permutation being drawn or drawn: `None` inside where drawing it failed (drawn again by
/// the caller, for its error).
type Cell = Arc<OnceLock<Option<Arc<Table>>>>;

struct Kept {
    /// The process that kept it.
    pid: u32,
    num_records: u64,
    seed: u64,
    cell: Cell,
}

static KEPT_TABLES: Mutex<VecDeque<Kept>> = Mutex::new(VecDeque::new());

/// The seed of the random permutation of `epoch` under the loader's `seed`.
pub(super) fn table_seed(seed: u64, epoch: u64) -> u64 {
    hash2(epoch_key(seed, epoch), 1)
}

/// Whether permutations of `num_records` records are drawn ahead and kept.
pub(crate) fn kept_ahead(num_records: u64) -> bool {
    num_records.saturating_mul(4) <= AHEAD_MAX_BYTES
}

/// The kept permutations, or `None` if their lock stays taken (by a thread that did not
/// follow a `fork` into this process: every other holder lets go within a few instructions).
fn kept() -> Option<MutexGuard<'static, VecDeque<Kept>>> {
    for _ in 0..1000 {
        match KEPT_TABLES.try_lock() {
            Ok(kept) => return Some(kept),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// The cell of `(num_records, seed)`, made (and the oldest let go past [`KEPT`]) if new;
/// `None` where the kept permutations cannot be had ([`kept`]).
fn cell(num_records: u64, seed: u64) -> Option<Cell> {
    let mut kept = kept()?;
    let pid = std::process::id();
    kept.retain(|k| k.pid == pid);
    if let Some(k) = kept
        .iter()
        .find(|k| k.num_records == num_records && k.seed == seed)
    {
        return Some(Arc::clone(&k.cell));
    }
    let cell = Cell::default();
    kept.push_back(Kept {
        pid,
        num_records,
        seed,
        cell: Arc::clone(&cell),
    });
    while kept.len() > KEPT {
        kept.pop_front();
    }
    Some(cell)
}

fn draw(num_records: u64, seed: u64) -> Result<Arc<Table>> {
    Table::shuffled(num_records, &mut SplitMix64::new(seed)).map(Arc::new)
}

/// `0 .. num_records` shuffled by Fisher–Yates from `seed`: the one drawn ahead when there is
/// one (waiting for it if it is being drawn), else drawn now.
pub(super) fn table(num_records: u64, seed: u64) -> Result<Arc<Table>> {
    let Some(cell) = kept_ahead(num_records)
        .then(|| cell(num_records, seed))
        .flatten()
    else {
        return draw(num_records, seed);
    };
    match cell.get_or_init(|| draw(num_records, seed).ok()) {
        Some(table) => Ok(Arc::clone(table)),
        None => draw(num_records, seed),
    }
}

/// Starts drawing the permutation of `epoch` under `spec` on a thread of its own, where the
/// shuffle is random, [`kept_ahead`] and it is not kept already. Nothing waits for it: a plan
/// that needs it before it is made waits in [`table`], or draws it itself if the thread could
/// not start.
pub(crate) fn draw_ahead(spec: &OrderSpec, epoch: u64) {
    let n = spec.num_records;
    if spec.shuffle != Shuffle::Random {
        return;
    }
    let seed = table_seed(spec.seed, epoch);
    let Some(cell) = kept_ahead(n).then(|| cell(n, seed)).flatten() else {
        return;
    };
    if cell.get().is_some() {
        return;
    }
    // A thread that cannot start leaves the cell empty: `table` draws it then.
    let _ = std::thread::Builder::new()
        .name("pinfeed-order".into())
        .spawn(move || {
            cell.get_or_init(|| draw(n, seed).ok());
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::EpochOrder;

    fn spec(num_records: u64, seed: u64, rank: u64) -> OrderSpec {
        OrderSpec {
            num_records,
            batch_size: 7,
            drop_last: false,
            shuffle: Shuffle::Random,
            seed,
            rank,
            world_size: 3,
        }
    }

    fn entries(t: &Table, n: u64) -> Vec<u64> {
        (0..n).map(|i| t.get(i)).collect()
    }

    #[test]
    fn a_permutation_drawn_ahead_is_the_one_drawn_now_and_shared_by_the_ranks() {
        // A seed of this test only: the kept permutations are shared by the whole process.
        let (n, s) = (10_000, spec(10_000, 0xA11EAD, 1));
        draw_ahead(&s, 3);
        let seed = table_seed(s.seed, 3);
        let ahead = table(n, seed).unwrap();
        // Asked again (as another rank's order does), the same table is handed out.
        assert!(Arc::ptr_eq(&ahead, &table(n, seed).unwrap()));
        let now = Table::shuffled(n, &mut SplitMix64::new(seed)).unwrap();
        assert_eq!(entries(&ahead, n), entries(&now, n));
        // The ranks' orders split that permutation: step by step, rank 0's batch, rank 1's and
        // rank 2's are the next positions of P, padded past its end from its start.
        let ranks: Vec<EpochOrder> = (0..3)
            .map(|r| EpochOrder::new(&spec(n, s.seed, r), 3).unwrap())
            .collect();
        let mut records = Vec::new();
        for i in 0..ranks[0].num_batches() {
            for order in &ranks {
                records.extend(order.batch(i).to_vec());
            }
        }
        let want: Vec<u64> = (0..records.len() as u64).map(|g| now.get(g % n)).collect();
        assert_eq!(records.len(), 10_002);
        assert_eq!(records, want);
    }

    #[test]
    fn only_random_orders_within_the_bound_are_drawn_ahead() {
        let most = AHEAD_MAX_BYTES / 4;
        assert!(kept_ahead(most) && !kept_ahead(most + 1));
        // A block order is not drawn ahead: nothing is kept for it.
        let mut block = spec(1000, 0xB10C, 0);
        block.shuffle = Shuffle::Block {
            block: 10,
            window: 4,
        };
        draw_ahead(&block, 0);
        let seed = table_seed(block.seed, 0);
        let found = kept().unwrap().iter().any(|k| k.seed == seed);
        assert!(!found);
    }
}
