//! Permutations drawn ahead. A random shuffle's global order is one permutation of every record,
//! drawn serially by Fisher–Yates (milliseconds a million records), and a pass cannot read its
//! first batch before it is made. So when a plan takes the order of an epoch, the permutation of
//! the epoch after it is drawn on a thread of its own while this one runs, and kept here, where the
//! next epoch of the same plan, the next pass (Python starts each iteration as a new loader), or
//! another rank's order of the same dataset in this process (the permutation depends on the
//! records, the seed and the epoch only) finds it made.
//!
//! Bounded: [`KEPT`] permutations a process, the least recently used let go first, and only
//! tables of at most [`AHEAD_MAX_BYTES`] (larger ones are drawn when needed, by the plan that
//! needs them). What is kept stays until something replaces it: at most 4 × 64 MiB for the
//! life of the process, besides the tables of the orders in use.
//!
//! Never waited for across a `fork`: a child does not take what its parent kept (a table may
//! be half drawn by a thread the child does not have), and only tries the lock its parent may
//! have held.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock, TryLockError};

use super::global::Table;
use super::random::{epoch_key, hash2, words, SplitMix64};
use super::{OrderSpec, Shuffle};
use crate::error::Result;

/// Permutations kept: the current and the next epoch's of two datasets at once (a training
/// and an evaluation loader, say).
const KEPT: usize = 4;

/// The largest permutation drawn ahead, in bytes of its table (4 bytes a record up to 2³²
/// records): 64 MiB, 16 Mi records.
const AHEAD_MAX_BYTES: u64 = 64 << 20;

/// A permutation being drawn or drawn: `None` inside where drawing it failed (drawn again by
/// the caller, for its error).
type Cell = Arc<OnceLock<Option<Arc<Table>>>>;

struct Entry {
    /// The [`forks`] count of the process that kept it.
    forks: u64,
    num_records: u64,
    seed: u64,
    cell: Cell,
}

/// The kept permutations, least recently used first.
#[derive(Default)]
struct Tables {
    entries: VecDeque<Entry>,
}

impl Tables {
    /// The cell of `(num_records, seed)` in the process of `forks` forks, made if new and
    /// moved to the back; with the entries let go (another process's, and the least recently
    /// used past [`KEPT`]), for the caller to drop outside the lock (dropping a table frees up
    /// to 64 MiB, milliseconds).
    fn cell(&mut self, num_records: u64, seed: u64, forks: u64) -> (Cell, Vec<Entry>) {
        let mut gone = Vec::new();
        let mut kept = VecDeque::with_capacity(KEPT + 1);
        let mut found = None;
        for e in self.entries.drain(..) {
            if e.forks != forks {
                gone.push(e);
            } else if e.num_records == num_records && e.seed == seed {
                found = Some(e);
            } else {
                kept.push_back(e);
            }
        }
        let entry = found.unwrap_or_else(|| Entry {
            forks,
            num_records,
            seed,
            cell: Cell::default(),
        });
        let cell = Arc::clone(&entry.cell);
        kept.push_back(entry);
        while kept.len() > KEPT {
            gone.extend(kept.pop_front());
        }
        self.entries = kept;
        (cell, gone)
    }
}

static TABLES: Mutex<Tables> = Mutex::new(Tables {
    entries: VecDeque::new(),
});

static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Forks between the first process that kept a permutation and this one: 0 in that process.
fn forks() -> u64 {
    static COUNTING: Once = Once::new();
    // SAFETY: `forked` is async-signal-safe (one atomic add) and lives as long as the process.
    COUNTING.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forked));
    });
    FORKS.load(Ordering::Relaxed)
}

/// The permutations kept in `kept` ([`TABLES`], the process's, except in tests): waited for in
/// the process that kept them; in a forked child only tried for a while (its parent's lock may
/// be held by a thread the child does not have), and `None` if it stays taken.
fn tables(kept: &Mutex<Tables>) -> Option<MutexGuard<'_, Tables>> {
    if forks() == 0 {
        return Some(kept.lock().unwrap_or_else(|p| p.into_inner()));
    }
    for _ in 0..1000 {
        match kept.try_lock() {
            Ok(tables) => return Some(tables),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// The cell of `(num_records, seed)` in `kept`: `None` for a permutation not [`kept_ahead`],
/// or where [`tables`] gives none.
fn cell(kept: &Mutex<Tables>, num_records: u64, seed: u64) -> Option<Cell> {
    if !kept_ahead(num_records) {
        return None;
    }
    let forks = forks();
    let (cell, gone) = tables(kept)?.cell(num_records, seed, forks);
    drop(gone);
    Some(cell)
}

/// The seed of the random permutation of `epoch` under the loader's `seed`.
pub(super) fn table_seed(seed: u64, epoch: u64) -> u64 {
    hash2(epoch_key(seed, epoch), words::PERMUTATION)
}

/// Whether permutations of `num_records` records are drawn ahead and kept.
fn kept_ahead(num_records: u64) -> bool {
    num_records.saturating_mul(4) <= AHEAD_MAX_BYTES
}

fn draw(num_records: u64, seed: u64) -> Result<Arc<Table>> {
    Table::shuffled(num_records, &mut SplitMix64::new(seed)).map(Arc::new)
}

/// `0 .. num_records` shuffled by Fisher–Yates from `seed`: the one drawn ahead when there is
/// one (waiting for it if it is being drawn), else drawn now.
pub(super) fn table(num_records: u64, seed: u64) -> Result<Arc<Table>> {
    table_of(&TABLES, num_records, seed)
}

/// [`table`], with the permutations kept in `kept`.
fn table_of(kept: &Mutex<Tables>, num_records: u64, seed: u64) -> Result<Arc<Table>> {
    let Some(cell) = cell(kept, num_records, seed) else {
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
    draw_ahead_into(&TABLES, spec, epoch);
}

/// [`draw_ahead`], keeping the permutation in `kept`.
fn draw_ahead_into(kept: &Mutex<Tables>, spec: &OrderSpec, epoch: u64) {
    let n = spec.num_records;
    if spec.shuffle != Shuffle::Random {
        return;
    }
    let seed = table_seed(spec.seed, epoch);
    let Some(cell) = cell(kept, n, seed) else {
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
    use std::time::{Duration, Instant};

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
        // Kept apart from the process's permutations, which the tests running beside this one
        // may let go at any time by keeping their own.
        let kept = Mutex::default();
        let (n, s) = (10_000, spec(10_000, 0xA11EAD, 1));
        let seed = table_seed(s.seed, 3);
        draw_ahead_into(&kept, &s, 3);
        // Drawn on its own thread, without anyone asking for it.
        let cell = cell(&kept, n, seed).unwrap();
        let start = Instant::now();
        while cell.get().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "never drawn");
            std::thread::sleep(Duration::from_millis(1));
        }
        let ahead = table_of(&kept, n, seed).unwrap();
        let drawn = cell.get().unwrap().as_ref().unwrap();
        assert!(Arc::ptr_eq(&ahead, drawn), "the kept table is handed out");
        let now = Table::shuffled(n, &mut SplitMix64::new(seed)).unwrap();
        assert_eq!(entries(&ahead, n), entries(&now, n));
        // The ranks' orders (through the process's permutations) split that permutation: step
        // by step, rank 0's batch, rank 1's and rank 2's are the next positions of P, padded
        // past its end from its start.
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
    fn the_least_recently_used_go_first_and_another_process_s_are_never_taken() {
        let mut tables = Tables::default();
        let (a, gone) = tables.cell(10, 1, 0);
        assert!(gone.is_empty());
        for seed in 2..=4 {
            tables.cell(10, seed, 0);
        }
        // Asking for seed 1 again finds it and makes it the most recent; a fifth table then
        // lets seed 2 go, the least recently used.
        assert!(Arc::ptr_eq(&a, &tables.cell(10, 1, 0).0));
        let (_, gone) = tables.cell(10, 5, 0);
        assert_eq!(gone.iter().map(|e| e.seed).collect::<Vec<_>>(), [2]);
        let seeds: Vec<u64> = tables.entries.iter().map(|e| e.seed).collect();
        assert_eq!(seeds, [3, 4, 1, 5]);
        // Another record count is another table.
        assert!(!Arc::ptr_eq(&a, &tables.cell(11, 1, 0).0));
        // After a fork, the parent's entries are let go, not handed out.
        let (child, gone) = tables.cell(10, 1, 1);
        assert!(!Arc::ptr_eq(&a, &child));
        assert_eq!(gone.len(), 4);
        assert_eq!(tables.entries.len(), 1);
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
        let kept = Mutex::default();
        draw_ahead_into(&kept, &block, 0);
        assert!(tables(&kept).unwrap().entries.is_empty());
    }
}
