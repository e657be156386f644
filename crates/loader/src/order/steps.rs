//! Several steps of an [`EpochOrder`] in one loader batch: [`StepGroups`].

use std::sync::Arc;

use pinfeed_source::{check_request, Layout, NetworkStats, Source};

use super::{BatchRecords, EpochOrder, OrderSpec};
use crate::error::{LoaderError, Result};

/// Another source's records renumbered so that each loader batch carries `steps` consecutive
/// steps of an epoch's [`EpochOrder`]: a consumer takes them in one slot, one copy and one
/// widening, and still gets, at every step and on every rank, exactly the records a loader of
/// one step a batch would give it.
///
/// The order is `spec`'s (at every rank of its world size) of one epoch, or the split of its
/// rest after `consumed` records ([`EpochOrder::remainder`], an elastic resume). A loader reads
/// the groups with batches of `steps × batch_size` records, in file order ([`Shuffle::None`]),
/// at the same world size: its batch `g` on rank `r` holds rank `r`'s steps
/// `g × steps .. (g + 1) × steps` of the order, step `k` of the group at records
/// `k × batch_size ..` of the batch. Every step but the last of the epoch holds `batch_size`
/// records; the last ([`step_len`](StepGroups::step_len)) may hold fewer, at the start of its
/// place. What no step holds (the rest of a short last step, and the steps past the end of the
/// epoch in the last group) reads as zeros, from nothing, so it adds to no source's counters.
///
/// A shuffled `spec` draws its global order once for each rank; a mixture's order is
/// [`Shuffle::None`] (the mixture orders each source's passes itself), which stores nothing.
///
/// [`Shuffle::None`]: super::Shuffle::None
#[derive(Debug)]
pub struct StepGroups {
    inner: Arc<dyn Source>,
    name: String,
    /// `orders[r]`: rank `r`'s order; every rank's has the same number of steps.
    orders: Vec<EpochOrder>,
    /// Steps a loader batch carries; at least 1.
    steps: u64,
    /// Records: whole groups of `steps × batch_size` records on every rank.
    len: u64,
}

impl StepGroups {
    /// The records of `inner` in `steps` steps a group, by the order of `spec` (its rank is
    /// left aside: the groups hold every rank's steps) in `epoch`, after `consumed` records of
    /// its global order. Errors when `spec` does not fit `inner` or has no step to give, or
    /// when `steps` is 0.
    pub fn new(
        inner: Arc<dyn Source>,
        spec: &OrderSpec,
        epoch: u64,
        consumed: u64,
        steps: u64,
    ) -> Result<StepGroups> {
        let fail = |message: String| Err(LoaderError::Config(message));
        if steps == 0 {
            return fail("a loader batch carries at least 1 step".into());
        }
        if spec.num_records != inner.num_records() {
            return fail(format!(
                "{}: the order is of {} records, the source has {}",
                inner.name(),
                spec.num_records,
                inner.num_records()
            ));
        }
        let orders = (0..spec.world_size.max(1))
            .map(|rank| {
                let at_rank = OrderSpec {
                    rank,
                    ..spec.clone()
                };
                EpochOrder::remainder(&at_rank, epoch, consumed)
            })
            .collect::<Result<Vec<_>>>()?;
        let groups = orders[0].num_batches().div_ceil(steps);
        let len = groups
            .checked_mul(steps)
            .and_then(|n| n.checked_mul(spec.batch_size))
            .and_then(|n| n.checked_mul(spec.world_size))
            .filter(|&n| n > 0);
        let Some(len) = len else {
            return fail(format!(
                "{}: {groups} groups of {steps} steps of {} records on {} ranks do not fit a \
                 64-bit record count",
                inner.name(),
                spec.batch_size,
                spec.world_size
            ));
        };
        Ok(StepGroups {
            name: inner.name().to_owned(),
            inner,
            orders,
            steps,
            len,
        })
    }

    /// The order of rank 0 (every rank's has the same steps and sizes).
    pub fn order(&self) -> &EpochOrder {
        &self.orders[0]
    }

    /// Steps of each rank in the epoch (in its split after `consumed`).
    pub fn num_steps(&self) -> u64 {
        self.orders[0].num_batches()
    }

    /// Records of step `i` on every rank: `batch_size` but in the last step, which may hold
    /// fewer; 0 past the last step.
    pub fn step_len(&self, i: u64) -> u64 {
        let order = &self.orders[0];
        let (steps, batch) = (order.num_batches(), order.spec().batch_size);
        match i.cmp(&steps.saturating_sub(1)) {
            std::cmp::Ordering::Less => batch,
            std::cmp::Ordering::Equal => order.num_records() - i * batch,
            std::cmp::Ordering::Greater => 0,
        }
    }

    /// Where the loader's records `first .. first + count` come from: `(record of the inner
    /// source, place from first)` of those a step holds, in increasing places. The places no
    /// step holds are zeroed in `dst` (those records, back to back).
    fn places(&self, first: u64, count: u64, dst: &mut [u8]) -> Vec<(u64, usize)> {
        let spec = self.orders[0].spec();
        let (batch, world) = (spec.batch_size, spec.world_size);
        let per_batch = self.steps * batch;
        let record_bytes = self.layout().record_bytes();
        let mut found = Vec::with_capacity(count as usize);
        let end = first + count;
        let mut u = first;
        while u < end {
            // Record `u` is row `j` of step `k` in loader batch `g` of rank `r`.
            let (q, within) = (u / per_batch, u % per_batch);
            let (g, r) = (q / world, (q % world) as usize);
            let (k, j) = (within / batch, within % batch);
            let run_end = end.min(u - j + batch);
            let i = g * self.steps + k;
            let held = self.step_len(i).min(j + (run_end - u));
            if j < held {
                let records = self.orders[r].batch(i);
                for row in j..held {
                    let record = match &records {
                        BatchRecords::Range { first, .. } => first + row,
                        BatchRecords::Indices(list) => list[row as usize],
                    };
                    found.push((record, (u - first + row - j) as usize));
                }
            }
            let empty = (u + held.saturating_sub(j) - first) as usize..(run_end - first) as usize;
            dst[empty.start * record_bytes..empty.end * record_bytes].fill(0);
            u = run_end;
        }
        found
    }
}

impl Source for StepGroups {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        self.inner.layout()
    }

    fn num_records(&self) -> u64 {
        self.len
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> pinfeed_source::Result<()> {
        let count = check_request(self, first, dst.len())?;
        let found = self.places(first, count, dst);
        self.inner.gather_at(&found, dst)
    }

    fn reader_description(&self) -> String {
        self.inner.reader_description()
    }

    fn network(&self) -> Option<NetworkStats> {
        self.inner.network()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Shuffle;
    use super::*;
    use pinfeed_source::{dtype::parse_user_dtype, HostBuffer};

    /// `n` records of 8 bytes, each its own index (little-endian).
    fn numbered(n: u64) -> Arc<dyn Source> {
        let (dtype, _) = parse_user_dtype("<u8").unwrap();
        let layout = Layout::new(dtype, vec![1]).unwrap();
        let bytes = (0..n).flat_map(|v| v.to_le_bytes()).collect();
        Arc::new(HostBuffer::from_vec(bytes, layout).unwrap())
    }

    fn read(source: &dyn Source, first: u64, count: u64) -> Vec<u64> {
        let mut dst = vec![0xffu8; count as usize * 8];
        source.read_records(first, &mut dst).unwrap();
        dst.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Each rank's steps as a loader of `steps × batch` records a batch reads them from the
    /// groups (rows a step does not hold left out, which must read as 0), against the batches
    /// of the order itself.
    #[test]
    fn each_step_holds_the_records_of_the_orders_step() {
        for (n, batch, drop_last, shuffle) in [
            (100, 3, false, Shuffle::None),
            (101, 4, false, Shuffle::None),
            (7, 3, false, Shuffle::None),
            (100, 3, true, Shuffle::None),
            (50, 2, false, Shuffle::Random),
        ] {
            for world in 1..=3u64 {
                for steps in [1, 2, 5, 16] {
                    for consumed in [0, 5] {
                        let spec = OrderSpec {
                            num_records: n,
                            batch_size: batch,
                            drop_last,
                            shuffle,
                            seed: 9,
                            rank: 0,
                            world_size: world,
                        };
                        let groups =
                            StepGroups::new(numbered(n), &spec, 2, consumed, steps).unwrap();
                        let per_batch = steps * batch;
                        assert_eq!(groups.num_records() % (per_batch * world), 0);
                        for rank in 0..world {
                            let order = EpochOrder::remainder(
                                &OrderSpec {
                                    rank,
                                    ..spec.clone()
                                },
                                2,
                                consumed,
                            )
                            .unwrap();
                            assert_eq!(groups.num_steps(), order.num_batches());
                            let loader_batches = groups.num_records() / (per_batch * world);
                            for g in 0..loader_batches {
                                let got = read(&groups, (g * world + rank) * per_batch, per_batch);
                                for (k, rows) in got.chunks(batch as usize).enumerate() {
                                    let i = g * steps + k as u64;
                                    let held = groups.step_len(i) as usize;
                                    let want =
                                        (i < order.num_batches()).then(|| order.batch(i).to_vec());
                                    let case = (n, batch, drop_last, world, steps, consumed, i);
                                    assert_eq!(want.as_ref().map_or(0, Vec::len), held, "{case:?}");
                                    assert_eq!(
                                        &rows[..held],
                                        want.as_deref().unwrap_or(&[]),
                                        "{case:?}"
                                    );
                                    assert!(rows[held..].iter().all(|&v| v == 0), "{case:?}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn any_range_reads_as_its_records_read_one_by_one() {
        let spec = OrderSpec {
            num_records: 23,
            batch_size: 4,
            drop_last: false,
            shuffle: Shuffle::None,
            seed: 0,
            rank: 0,
            world_size: 2,
        };
        let groups = StepGroups::new(numbered(23), &spec, 0, 0, 3).unwrap();
        let len = groups.num_records();
        let one_by_one: Vec<u64> = (0..len).flat_map(|u| read(&groups, u, 1)).collect();
        for first in 0..len {
            for count in 1..=(len - first).min(9) {
                let want = &one_by_one[first as usize..(first + count) as usize];
                assert_eq!(read(&groups, first, count), want, "{first} + {count}");
            }
        }
    }

    #[test]
    fn groups_that_cannot_be_made_say_why() {
        let spec = OrderSpec {
            num_records: 10,
            batch_size: 4,
            drop_last: true,
            shuffle: Shuffle::None,
            seed: 0,
            rank: 0,
            world_size: 3,
        };
        let err = |spec: &OrderSpec, n: u64, steps: u64| {
            StepGroups::new(numbered(n), spec, 0, 0, steps)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&spec, 10, 2).contains("cannot fill one batch"));
        let spec = OrderSpec {
            drop_last: false,
            ..spec
        };
        assert!(err(&spec, 11, 2).contains("the order is of 10 records, the source has 11"));
        assert!(err(&spec, 10, 0).contains("at least 1 step"));
    }
}
