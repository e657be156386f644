//! Which records each batch holds, and how a batch is cut into slots.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::error::{LoaderError, Result};
use crate::order::{ahead, BatchRecords, EpochOrder, OrderSpec};
use pinfeed_source::Source;

use crate::register::Reader;
use crate::{LoaderOptions, Position, MAX_SLOTS};

/// Which records each batch holds: the epochs' orders, from the resume position on.
///
/// Sequence number `seq` is batch `start.batches_done + seq` of epoch `start.epoch` while that
/// epoch lasts (`first_len` batches: after an elastic resume its split has fewer batches than
/// an epoch), then batch `(seq - first_len) % batches_per_epoch` of epoch
/// `start.epoch + 1 + (seq - first_len) / batches_per_epoch`.
pub(super) struct Plan {
    pub(super) spec: OrderSpec,
    pub(super) batches_per_epoch: u64,
    start: Position,
    /// Batches of the first epoch still to deliver.
    first_len: u64,
    pub(super) total: u64,
    /// Records in the largest batch: the batch size, or one rank's records of an epoch when
    /// those are fewer.
    pub(super) largest_batch: usize,
    /// The orders of the epochs in use, newest last: readers may work on two epochs at once,
    /// and a shuffled order is worth computing once.
    pub(super) orders: Mutex<VecDeque<Arc<EpochOrder>>>,
}

/// One batch's place in the plan.
#[derive(Clone, Debug)]
pub(super) struct BatchSpec {
    pub(super) epoch: u64,
    pub(super) index: u64,
    /// The `consumed` of the split the batch belongs to (see [`Position`]).
    pub(super) consumed: u64,
    pub(super) records: BatchRecords,
    pub(super) count: usize,
}

impl BatchSpec {
    pub(super) fn first(&self) -> u64 {
        match &self.records {
            BatchRecords::Range { first, .. } => *first,
            BatchRecords::Indices(indices) => indices[0],
        }
    }
}

impl Plan {
    pub(super) fn new(
        num_records: u64,
        options: &LoaderOptions,
        source_name: &str,
    ) -> Result<Plan> {
        options.validate()?;
        let named = |e| match e {
            LoaderError::Config(m) => LoaderError::Config(format!("{source_name}: {m}")),
            other => other,
        };
        let spec = options.order_spec(num_records);
        let start = options.start;
        let (first, remaining) = EpochOrder::resume(&spec, start).map_err(named)?;
        let (per_rank, batches_per_epoch) = spec.epoch_size(0).map_err(named)?;
        if batches_per_epoch == 0 {
            return Err(LoaderError::Config(format!(
                "{source_name}: batch size {} leaves no batch to deliver from {num_records} records{}",
                options.batch_size,
                if options.drop_last { " with drop_last" } else { "" }
            )));
        }
        start
            .check_epochs(options.epochs, batches_per_epoch)
            .map_err(named)?;
        if let Some(next) = start.epoch.checked_add(1) {
            ahead::draw_ahead(&spec, next);
        }
        let first_len = remaining.end - remaining.start;
        // Checked above: every batch of the run has a 64-bit number counted from epoch 0.
        let total = first_len + batches_per_epoch * (options.epochs - 1);
        // A batch never holds more than one rank's records of an epoch, whatever the batch
        // size asked: slots are sized for this, not for `batch_size`.
        let largest_batch = usize::try_from(per_rank.max(first.num_records()))
            .unwrap_or(usize::MAX)
            .min(options.batch_size);
        Ok(Plan {
            spec,
            batches_per_epoch,
            start,
            first_len,
            total,
            largest_batch,
            orders: Mutex::new(VecDeque::from([Arc::new(first)])),
        })
    }

    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// The epoch of the first batch this plan delivers.
    pub(super) fn first_epoch(&self) -> u64 {
        self.start.epoch
    }

    /// The records of `epoch` this plan splits: the rest after the start's `consumed` in the
    /// first epoch, every record in the others.
    fn consumed(&self, epoch: u64) -> u64 {
        if epoch == self.start.epoch {
            self.start.consumed
        } else {
            0
        }
    }

    pub(super) fn order(&self, epoch: u64) -> Result<Arc<EpochOrder>> {
        let mut orders = self.orders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(order) = orders.iter().find(|o| o.epoch() == epoch) {
            return Ok(Arc::clone(order));
        }
        // Taken (or drawn) under the lock: other readers need the same epoch and would only
        // wait. The next epoch's is drawn meanwhile, for it or for the next pass.
        let order = Arc::new(EpochOrder::remainder(
            &self.spec,
            epoch,
            self.consumed(epoch),
        )?);
        if let Some(next) = epoch.checked_add(1) {
            ahead::draw_ahead(&self.spec, next);
        }
        orders.push_back(Arc::clone(&order));
        if orders.len() > 2 {
            orders.pop_front();
        }
        Ok(order)
    }

    pub(super) fn batch(&self, seq: u64) -> Result<BatchSpec> {
        let (epoch, index) = if seq < self.first_len {
            (self.start.epoch, self.start.batches_done + seq)
        } else {
            let later = seq - self.first_len;
            (
                self.start.epoch + 1 + later / self.batches_per_epoch,
                later % self.batches_per_epoch,
            )
        };
        let records = self.order(epoch)?.batch(index);
        let count = records.len() as usize;
        Ok(BatchSpec {
            epoch,
            index,
            consumed: self.consumed(epoch),
            records,
            count,
        })
    }
}

/// How batches are cut into pieces, a slot each: unit `u` of the ring is piece
/// `u % per_batch` of batch `u / per_batch`, holding the batch's records
/// `piece × records .. (piece + 1) × records` (fewer, or none, in a short last batch).
#[derive(Clone, Copy, Debug)]
pub(super) struct Pieces {
    pub(super) per_batch: u64,
    pub(super) records: usize,
}

impl Pieces {
    /// Pieces of at most `piece_bytes` (at least one record each) for batches of `batch_size`
    /// records of `record_bytes`; one piece a batch when `piece_bytes` is `None`.
    pub(super) fn new(
        batch_size: usize,
        record_bytes: usize,
        piece_bytes: Option<usize>,
    ) -> Pieces {
        let records = match piece_bytes {
            Some(bytes) => (bytes / record_bytes.max(1)).clamp(1, batch_size),
            None => batch_size,
        };
        Pieces {
            per_batch: batch_size.div_ceil(records) as u64,
            records,
        }
    }

    /// The batch a unit belongs to, and which piece of it the unit is.
    pub(super) fn split(&self, unit: u64) -> (u64, u64) {
        (unit / self.per_batch, unit % self.per_batch)
    }

    /// Records `lo .. hi` of a batch of `count` records that piece `piece` holds.
    pub(super) fn range(&self, piece: u64, count: usize) -> std::ops::Range<usize> {
        let lo = (piece as usize * self.records).min(count);
        lo..(lo + self.records).min(count)
    }
}

/// How the pinned memory is cut: the size of a slot, how many, and how batches map onto them.
pub(super) struct SlotLayout {
    /// Bytes of one record as delivered (after the transform).
    pub(super) out_record_bytes: usize,
    /// With GPU image decoding, where in a slot the copy thread gathers the batch's labels.
    pub(super) labels_at: Option<usize>,
    /// Bytes of the largest batch as delivered.
    pub(super) batch_bytes: usize,
    pub(super) pieces: Pieces,
    pub(super) slot_bytes: usize,
    pub(super) slots: usize,
    /// Slots that fit in the pinned budget.
    fits: usize,
    /// Slots' worth of work over the run: pieces of every batch.
    pub(super) units: u64,
    /// Reader threads.
    pub(super) threads: usize,
}

/// A GPU image decoder's source is the loader's, read through pinned slots.
fn check_gpu_images(
    g: &crate::GpuImageDecode,
    source: &dyn Source,
    options: &LoaderOptions,
) -> Result<()> {
    let mine = g.source().as_ref() as &dyn Source;
    if mine.name() != source.name()
        || mine.layout().record_bytes() != source.layout().record_bytes()
        || mine.num_records() != source.num_records()
    {
        return Err(LoaderError::Config(format!(
            "GPU image decoding of {} given another source, {}",
            mine.name(),
            source.name()
        )));
    }
    if options.reader == Reader::Register {
        return Err(LoaderError::Config(
            "GPU image decoding reads through pinned slots, not the register reader".into(),
        ));
    }
    Ok(())
}

impl SlotLayout {
    /// Refuses a batch that `backend`'s device could never hold, before anything is
    /// allocated: a batch lives whole in device memory (host memory on the host backend),
    /// however the source is read, so one larger than the device's memory would abort the
    /// process when allocated. The one rule for every loader, records and tokens alike: a
    /// record batch is bounded by the records that exist, but random token windows are not.
    pub(super) fn check_fits(&self, backend: &crate::backend::Backend, name: &str) -> Result<()> {
        match backend.memory_total() {
            Some(total) if self.batch_bytes as u64 > total => Err(LoaderError::BatchTooLarge {
                name: name.to_owned(),
                records: self.batch_bytes / self.out_record_bytes.max(1),
                record_bytes: self.out_record_bytes,
                bytes: self.batch_bytes,
                total,
                device: backend.device().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Sizes the slots for `plan`'s batches of `source` within the options' pinned budget.
    pub(super) fn new(
        source: &dyn Source,
        options: &LoaderOptions,
        plan: &Plan,
    ) -> Result<SlotLayout> {
        let batch_size = plan.largest_batch;
        let record_bytes = source.layout().record_bytes();
        let out_record_bytes = match (&options.transform, &options.gpu_images) {
            (Some(_), Some(_)) => {
                return Err(LoaderError::Config(
                    "GPU image decoding takes no transform".into(),
                ))
            }
            (Some(t), None) => t.output_record_bytes(),
            (None, Some(g)) => {
                check_gpu_images(g, source, options)?;
                g.output_record_bytes()
            }
            (None, None) => record_bytes,
        };
        if out_record_bytes == 0 {
            return Err(LoaderError::Config(
                "the transform's output records are 0 bytes long".into(),
            ));
        }
        let batch_bytes = out_record_bytes
            .checked_mul(batch_size)
            .ok_or_else(|| LoaderError::Config("batch size × record size overflows".into()))?;
        // Without a transform, readers read straight into the slot, so it holds what the
        // source's aligned reads need (O_DIRECT reads whole aligned blocks around the records).
        // Slots are page-aligned (and aligned as the source needs): what O_DIRECT reads need, and
        // what keeps copies aligned.
        let align = source.alignment().max(4096);
        // Large batches go in pieces, each its own slot (see `LoaderOptions::piece_bytes`).
        // GPU decoding wants a whole batch per call, as a transform does.
        let whole_batches = options.transform.is_some() || options.gpu_images.is_some();
        let pieces = if whole_batches || options.reader == Reader::Register {
            Pieces::new(batch_size, out_record_bytes, None)
        } else {
            Pieces::new(batch_size, out_record_bytes, options.piece_bytes)
        };
        let read_span = if options.transform.is_some() {
            batch_bytes
        } else {
            source
                .aligned_span(pieces.records)
                .max(pieces.records * out_record_bytes)
        };
        // GPU decoding gathers a batch's labels after its records, in the slot.
        let labels_at = options.gpu_images.as_ref().map(|_| read_span);
        let slot_bytes = (read_span + labels_at.map_or(0, |_| 8 * batch_size))
            .checked_next_multiple_of(align)
            .ok_or_else(|| LoaderError::Config("batch too large".into()))?;
        let fits = options.pinned_budget / slot_bytes;
        if fits < 2 {
            return Err(LoaderError::BudgetTooSmall {
                budget: options.pinned_budget,
                slot_bytes,
                fits,
                batch_size,
                record_bytes: out_record_bytes,
                needed: 2 * slot_bytes,
            });
        }
        let units = plan
            .total()
            .checked_mul(pieces.per_batch)
            .ok_or_else(|| LoaderError::Config(format!("{} epochs is too many", options.epochs)))?;
        let threads = options
            .num_threads
            .unwrap_or_else(|| crate::tune::threads_for(None, crate::tune::cores()).threads);
        Ok(SlotLayout {
            out_record_bytes,
            labels_at,
            batch_bytes,
            pieces,
            slot_bytes,
            slots: 0,
            fits,
            units,
            threads: 0,
        }
        .with_threads(threads))
    }

    /// The layout for `threads` readers: [`crate::tune::slots_for_readers`], within what fits.
    pub(super) fn with_threads(mut self, threads: usize) -> SlotLayout {
        self.threads = threads;
        self.slots = self
            .fits
            .min(MAX_SLOTS)
            .min(crate::tune::slots_for_readers(threads))
            .min(usize::try_from(self.units).unwrap_or(usize::MAX).max(2));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(batch_size: usize, drop_last: bool, epochs: u64) -> LoaderOptions {
        LoaderOptions {
            batch_size,
            drop_last,
            epochs,
            ..LoaderOptions::default()
        }
    }

    #[test]
    pub(super) fn plan_keeps_or_drops_the_last_partial_batch() {
        let keep = Plan::new(10, &options(4, false, 2), "x").unwrap();
        assert_eq!(keep.total(), 6);
        let last = keep.batch(2).unwrap();
        assert_eq!(
            (last.epoch, last.index, last.first(), last.count),
            (0, 2, 8, 2)
        );
        let second_epoch = keep.batch(3).unwrap();
        assert_eq!((second_epoch.epoch, second_epoch.first()), (1, 0));
        let drop = Plan::new(10, &options(4, true, 1), "x").unwrap();
        assert_eq!(drop.total(), 2);
        assert_eq!(drop.batch(1).unwrap().count, 4);
    }

    #[test]
    pub(super) fn plan_resumes_mid_epoch() {
        let mut o = options(4, false, 2);
        o.start = Position {
            epoch: 0,
            batches_done: 2,
            consumed: 0,
        };
        let plan = Plan::new(10, &o, "x").unwrap();
        assert_eq!(
            plan.total(),
            4,
            "one batch left of epoch 0, three of epoch 1"
        );
        let b = plan.batch(0).unwrap();
        assert_eq!((b.epoch, b.index, b.first()), (0, 2, 8));
        assert_eq!(plan.batch(1).unwrap().epoch, 1);
    }

    #[test]
    pub(super) fn plan_runs_the_rest_of_an_elastic_epoch_then_whole_epochs() {
        let mut o = options(4, false, 2);
        o.start = Position {
            epoch: 3,
            batches_done: 0,
            consumed: 7,
        };
        let plan = Plan::new(10, &o, "x").unwrap();
        assert_eq!(
            plan.total(),
            1 + 3,
            "3 records left of epoch 3, then epoch 4"
        );
        let b = plan.batch(0).unwrap();
        assert_eq!(
            (b.epoch, b.index, b.consumed, b.first(), b.count),
            (3, 0, 7, 7, 3)
        );
        let b = plan.batch(1).unwrap();
        assert_eq!((b.epoch, b.index, b.consumed, b.first()), (4, 0, 0, 0));
    }

    #[test]
    pub(super) fn plan_rejects_impossible_batching() {
        assert!(Plan::new(10, &options(0, false, 1), "x").is_err());
        assert!(Plan::new(10, &options(4, false, 0), "x").is_err());
        let Err(err) = Plan::new(3, &options(4, true, 1), "data.npy") else {
            panic!("a batch larger than the dataset with drop_last was accepted");
        };
        assert!(err.to_string().contains("data.npy"), "{err}");
        assert!(Plan::new(10, &options(11, false, 1), "x").is_ok());
        let mut past_end = options(4, false, 1);
        past_end.start = Position {
            epoch: 0,
            batches_done: 4,
            consumed: 0,
        };
        assert!(Plan::new(10, &past_end, "x").is_err());
    }
}
