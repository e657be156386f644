//! Sequential windows: every window once an epoch, in order, split across ranks.

use super::invalid;
use crate::Result;

/// The windows of one batch: a run, or a list where the batch wraps past the last window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowBatch {
    /// Windows `first .. first + count`: one read.
    Range {
        /// The first window.
        first: u64,
        /// Windows in the batch.
        count: u64,
    },
    /// Windows in batch order.
    Indices(Vec<u64>),
}

impl WindowBatch {
    /// The windows as a list, in batch order.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            WindowBatch::Range { first, count } => (*first..*first + *count).collect(),
            WindowBatch::Indices(v) => v.clone(),
        }
    }
}

/// Consecutive windows in order, split across ranks by the loader's rule for records in file
/// order (`EpochOrder` with `Shuffle::None` in `crates/loader/src/order/`), with windows as
/// records:
///
/// - each rank gets `m` windows an epoch: `ceil(N / world_size)` without `drop_last` (the
///   `m × world_size − N` positions past the end repeat windows from the start), or
///   `floor(N / (world_size × batch_size)) × batch_size` with it (the rest left out);
/// - step `i` covers positions `i × world_size × batch_size ..` cut into `world_size` equal
///   contiguous batches, rank `r` taking the `r`-th; in the last step every rank's batch holds
///   `m − (num_batches − 1) × batch_size` windows.
///
/// The same in every epoch (the windows are in file order), so a position is the batch index
/// alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequentialPlan {
    num_windows: u64,
    batch_size: u64,
    rank: u64,
    world_size: u64,
    per_rank: u64,
    num_batches: u64,
    /// In `1 ..= batch_size`.
    last_batch: u64,
}

impl SequentialPlan {
    /// The plan of `rank` among `world_size` ranks; `name` is what errors call the dataset.
    pub fn new(
        name: &str,
        num_windows: u64,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        drop_last: bool,
    ) -> Result<SequentialPlan> {
        if batch_size == 0 || world_size == 0 || rank >= world_size || num_windows == 0 {
            return Err(invalid(
                name,
                format!(
                    "sequential windows need a batch size and world size of at least 1, a rank \
                     below the world size and at least one window (got batch size \
                     {batch_size}, rank {rank}, world size {world_size}, {num_windows} windows)"
                ),
            ));
        }
        let per_rank = if drop_last {
            let full_steps = num_windows / world_size.saturating_mul(batch_size);
            if full_steps == 0 {
                return Err(invalid(
                    name,
                    format!(
                        "{num_windows} windows cannot fill one batch of {batch_size} on each of \
                         {world_size} rank(s) and drop_last is set"
                    ),
                ));
            }
            full_steps * batch_size
        } else {
            num_windows.div_ceil(world_size)
        };
        per_rank
            .checked_mul(world_size)
            .ok_or_else(|| invalid(name, "windows padded for the ranks overflow 64 bits"))?;
        let num_batches = per_rank.div_ceil(batch_size);
        Ok(SequentialPlan {
            num_windows,
            batch_size,
            rank,
            world_size,
            per_rank,
            num_batches,
            last_batch: per_rank - (num_batches - 1) * batch_size,
        })
    }

    /// Batches of this rank an epoch; the same on every rank.
    pub fn num_batches(&self) -> u64 {
        self.num_batches
    }

    /// Windows of this rank an epoch, repeats included.
    pub fn windows_per_rank(&self) -> u64 {
        self.per_rank
    }

    /// The windows of batch `i` of this rank; `None` past the end of the epoch.
    pub fn batch(&self, i: u64) -> Option<WindowBatch> {
        if i >= self.num_batches {
            return None;
        }
        let count = if i + 1 == self.num_batches {
            self.last_batch
        } else {
            self.batch_size
        };
        let first = i * self.batch_size * self.world_size + self.rank * count;
        if first + count <= self.num_windows {
            return Some(WindowBatch::Range { first, count });
        }
        Some(WindowBatch::Indices(
            (first..first + count)
                .map(|g| g % self.num_windows)
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_once_across_ranks() {
        for n in [1u64, 2, 7, 24, 25, 100] {
            for batch in [1u64, 3, 4, 64] {
                for world in [1u64, 2, 3, 8] {
                    for drop_last in [false, true] {
                        let plans: Vec<_> = (0..world)
                            .map(|r| SequentialPlan::new("t", n, batch, r, world, drop_last))
                            .collect();
                        let Ok(plans) = plans.into_iter().collect::<Result<Vec<_>>>() else {
                            assert!(drop_last && n < batch * world);
                            continue;
                        };
                        let mut seen = vec![0u32; n as usize];
                        for p in &plans {
                            assert_eq!(p.num_batches(), plans[0].num_batches());
                            for i in 0..p.num_batches() {
                                for w in p.batch(i).unwrap().to_vec() {
                                    seen[w as usize] += 1;
                                }
                            }
                            assert_eq!(p.batch(p.num_batches()), None);
                        }
                        let total: u32 = seen.iter().sum();
                        assert_eq!(u64::from(total), plans[0].windows_per_rank() * world);
                        if drop_last {
                            assert!(seen.iter().all(|&c| c <= 1));
                            assert!(n - u64::from(total) < world * batch);
                        } else {
                            // Every window at least once; repeats only where padding is.
                            assert!(seen.iter().all(|&c| c >= 1), "{n} {batch} {world}");
                            assert!(u64::from(total) - n < world);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn batches_are_contiguous_runs_of_the_global_order() {
        let p0 = SequentialPlan::new("t", 10, 3, 0, 2, false).unwrap();
        let p1 = SequentialPlan::new("t", 10, 3, 1, 2, false).unwrap();
        assert_eq!(p0.num_batches(), 2);
        assert_eq!(p0.batch(0), Some(WindowBatch::Range { first: 0, count: 3 }));
        assert_eq!(p1.batch(0), Some(WindowBatch::Range { first: 3, count: 3 }));
        assert_eq!(p0.batch(1), Some(WindowBatch::Range { first: 6, count: 2 }));
        assert_eq!(p1.batch(1), Some(WindowBatch::Range { first: 8, count: 2 }));
        // 11 windows over 2 ranks: 6 each, the last position repeats window 0.
        let p1 = SequentialPlan::new("t", 11, 3, 1, 2, false).unwrap();
        assert_eq!(p1.batch(1), Some(WindowBatch::Indices(vec![9, 10, 0])));
        let e = SequentialPlan::new("data.bin", 5, 3, 0, 2, true).unwrap_err();
        assert!(e.to_string().starts_with("data.bin: 5 windows"), "{e}");
        assert!(SequentialPlan::new("t", 5, 3, 2, 2, false).is_err());
    }
}
