//! The order records are read in: shuffling, sharding across processes, and exact resume.
//!
//! [`EpochOrder`] gives the batches of one epoch on one rank, from an [`OrderSpec`]; a
//! [`Position`] is what a checkpoint keeps to resume mid-epoch; [`StepGroups`] carries several
//! of an order's batches (steps) in one loader batch. The rules are on [`EpochOrder`]
//! (this module is private; its types are re-exported at the crate root).
//!
//! **Stability.** The generator (SplitMix64), the bounded draw (Lemire's multiply-and-reject),
//! the Fisher–Yates shuffle and the way `(seed, epoch)` are mixed are written here, not taken
//! from a crate, because saved positions rely on them: changing any of them changes every
//! order. The tests pin their output.

pub(crate) mod ahead;
mod global;
mod random;
mod steps;
#[cfg(test)]
mod tests;

use crate::error::{LoaderError, Result};
use global::Global;
use random::hash2;
pub use steps::StepGroups;

/// How the global order of an epoch is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shuffle {
    /// Records in file order.
    None,
    /// A uniformly random permutation of the records, drawn anew each epoch (Fisher–Yates).
    Random,
    /// Quasi-random order for storage where random reads are slow (as in FFCV): the records
    /// are cut into blocks of `block` consecutive records (the last one may be shorter), the
    /// blocks are put in a random order, the block order is cut into windows of `window`
    /// blocks, and the records of each window are shuffled among themselves.
    ///
    /// The invariant: let a block sit at index `b` of the block order and let `q` be its
    /// position, the number of records in the blocks before it in that order (where its records
    /// would start were windows not shuffled). Every record of the block lies at a position `p`
    /// of the global order inside its window, `start(b / window) <= p < start(b / window + 1)`,
    /// as does `q`, and a window holds at most `window × block` records, so
    /// `|p − q| < window × block`. Reading a window's records touches `window` runs of `block`
    /// consecutive records.
    Block {
        /// Consecutive records in a block; at least 1.
        block: u64,
        /// Blocks whose records are shuffled together; at least 1.
        window: u64,
    },
}

/// Everything the order of an epoch depends on, apart from the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderSpec {
    /// Records in the dataset.
    pub num_records: u64,
    /// Records in a batch; at least 1.
    pub batch_size: u64,
    /// Give every rank only full batches, leaving out the end of the global order; otherwise
    /// pad with records from its start (see [`EpochOrder`]).
    pub drop_last: bool,
    /// How the global order is drawn.
    pub shuffle: Shuffle,
    /// Seed of the random orders; mixed with the epoch so each epoch differs.
    pub seed: u64,
    /// This process's rank, below `world_size`.
    pub rank: u64,
    /// Processes sharing the dataset; at least 1.
    pub world_size: u64,
}

impl OrderSpec {
    /// Checks the rank, world size, batch size and block shuffle; the error names the one out
    /// of range.
    pub fn validate(&self) -> Result<()> {
        let fail = |message: String| Err(LoaderError::Config(message));
        if self.world_size == 0 {
            return fail("world size must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return fail(format!(
                "rank {} is out of range for a world size of {} (ranks are 0 .. {})",
                self.rank,
                self.world_size,
                self.world_size - 1
            ));
        }
        if self.batch_size == 0 {
            return fail("batch size must be at least 1".into());
        }
        if let Shuffle::Block { block, window } = self.shuffle {
            if block == 0 || window == 0 {
                return fail(format!(
                    "block shuffle needs at least 1 record a block and 1 block a window, \
                     got block = {block}, window = {window}"
                ));
            }
        }
        Ok(())
    }

    /// `(records, batches)` of each rank in the split of `P[consumed ..]` (`consumed` 0: a
    /// whole epoch), as [`EpochOrder::remainder`] would give them, without drawing an order;
    /// its errors too.
    pub fn epoch_size(&self, consumed: u64) -> Result<(u64, u64)> {
        let split = Split::of(self, consumed)?;
        Ok((split.per_rank, split.num_batches))
    }

    /// A hash of everything but the rank that decides which records each batch holds. Keep it
    /// beside a saved [`Position`] and compare it on resume: a position means nothing under
    /// another seed, batch size, world size or shuffle.
    pub fn fingerprint(&self) -> u64 {
        let (tag, block, window) = match self.shuffle {
            Shuffle::None => (0, 0, 0),
            Shuffle::Random => (1, 0, 0),
            Shuffle::Block { block, window } => (2, block, window),
        };
        [
            self.num_records,
            self.batch_size,
            u64::from(self.drop_last),
            tag,
            block,
            window,
            self.seed,
            self.world_size,
        ]
        .into_iter()
        .fold(0x7069_6e66_6565_6421, hash2)
    }
}

/// The records of one batch, in the order they go into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchRecords {
    /// The records `first .. first + count`: one read.
    Range {
        /// The first record.
        first: u64,
        /// Records in the batch.
        count: u64,
    },
    /// Records in batch order; a reader may sort them to merge reads, but record `k` of the
    /// list goes to place `k` of the batch.
    Indices(Vec<u64>),
}

impl BatchRecords {
    /// Records in the batch.
    pub fn len(&self) -> u64 {
        match self {
            BatchRecords::Range { count, .. } => *count,
            BatchRecords::Indices(indices) => indices.len() as u64,
        }
    }

    /// Whether the batch holds no record (never, for a batch of an [`EpochOrder`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records as a list, in batch order.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            BatchRecords::Range { first, count } => (*first..*first + *count).collect(),
            BatchRecords::Indices(indices) => indices.clone(),
        }
    }
}

/// How far a rank got: `batches_done` batches of epoch `epoch` were delivered, counted from the
/// start of the current split, which began `consumed` records into the epoch's global order (0
/// unless the job was resumed at another world size: see [`Position::reshard`]). Plain
/// integers, so that checkpoints (the Python `state_dict`) can hold it; a checkpoint without
/// `consumed` means 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Position {
    /// The epoch, from 0.
    pub epoch: u64,
    /// Batches of the current split of that epoch already delivered to this rank.
    pub batches_done: u64,
    /// Records of the epoch's global order `P` consumed before the current split began: the
    /// split covers `P[consumed ..]` only ([`EpochOrder::remainder`]). 0 for an epoch run from
    /// its start, however often it was resumed at the same world size.
    pub consumed: u64,
}

impl Position {
    /// The position after the batch numbered `seq` in delivery order (the loader's
    /// [`Batch::seq`](crate::Batch::seq), counting across epochs from 0) was delivered, in a
    /// run whose epochs all start at their beginning (`consumed` 0); `None` when epochs have no
    /// batch.
    pub fn after_seq(seq: u64, batches_per_epoch: u64) -> Option<Position> {
        let done = seq.checked_add(1)?;
        Some(Position {
            epoch: done.checked_div(batches_per_epoch)?,
            batches_done: done % batches_per_epoch,
            consumed: 0,
        })
    }

    /// Records of the epoch's global order the job has consumed at this position, over all
    /// ranks, when every rank is here: the split's start plus `batches_done` steps of
    /// `world_size × batch_size` records (`spec`'s). The last step may hold padding, so past
    /// the end of an epoch this may exceed `num_records`. `None` on overflow.
    pub fn records_consumed(self, spec: &OrderSpec) -> Option<u64> {
        self.batches_done
            .checked_mul(spec.world_size)?
            .checked_mul(spec.batch_size)?
            .checked_add(self.consumed)
    }

    /// The position saved under `saved` (at its world size `W`), carried to `to`'s world size
    /// `W′`: an elastic resume, after a change of the number of ranks or the loss of a node.
    ///
    /// **What is consumed.** A step cuts `W × batch_size` records from the global order, so at
    /// this position the job has consumed the first
    /// `c = consumed + batches_done × W × batch_size` records of the epoch's global order `P`
    /// ([`records_consumed`](Position::records_consumed)). That holds when every rank saved at
    /// the same step; when ranks were at different steps, pass the position of the rank that
    /// got least far (the minimum `batches_done`): the records the faster ranks read past it
    /// come again, none is lost. Padding is never consumed: it sits in an epoch's last step
    /// only, and a position inside an epoch is before its last step, so `c < num_records`.
    ///
    /// **The result.** `(epoch, batches_done 0, consumed c)`: the rest of the epoch,
    /// `P[c ..]`, split over `W′` ranks by the usual rules ([`EpochOrder::remainder`]): every
    /// record of it once across ranks, with `drop_last = false` fewer than `W′` records of
    /// its start padding the last step, with `drop_last = true` fewer than `W′ × batch_size`
    /// records of its end left out. When nothing is left to deliver (the epoch was finished,
    /// or `drop_last` leaves no full step of the rest) it is the next epoch's start.
    /// With the world size unchanged the position is returned as it is: resumed as saved, it
    /// gives exactly the batches of the uninterrupted run.
    ///
    /// Errors (one line, naming what differs) when `saved` and `to` differ in anything but the
    /// rank and the world size, or when the position lies past the end of its epoch.
    pub fn reshard(self, saved: &OrderSpec, to: &OrderSpec) -> Result<Position> {
        saved.validate()?;
        to.validate()?;
        let same = OrderSpec {
            rank: 0,
            world_size: 1,
            ..saved.clone()
        } == OrderSpec {
            rank: 0,
            world_size: 1,
            ..to.clone()
        };
        if !same {
            return Err(LoaderError::Config(format!(
                "cannot carry a position to another world size when the order differs in more \
                 than the world size: saved with {saved:?}, resumed with {to:?}"
            )));
        }
        let split = Split::of(saved, self.consumed)?;
        split.check_done(self)?;
        if saved.world_size == to.world_size {
            return Ok(self);
        }
        let next_epoch = || {
            let epoch = self.epoch.checked_add(1).ok_or_else(|| {
                LoaderError::Config(format!("epoch {} has no next epoch", self.epoch))
            })?;
            Ok(Position {
                epoch,
                ..Position::default()
            })
        };
        if self.batches_done == split.num_batches {
            return next_epoch();
        }
        // Before the last step every step is full, so this is below `num_records`.
        let consumed = self.records_consumed(saved).ok_or_else(|| {
            LoaderError::Config(format!("{self:?} overflows a 64-bit record count"))
        })?;
        let left = to.num_records - consumed;
        if to.drop_last && left / to.world_size.saturating_mul(to.batch_size) == 0 {
            return next_epoch();
        }
        Split::of(to, consumed)?;
        Ok(Position {
            epoch: self.epoch,
            batches_done: 0,
            consumed,
        })
    }

    /// Batches delivered before this position, counting across epochs; `None` on overflow.
    pub fn seq(self, batches_per_epoch: u64) -> Option<u64> {
        self.epoch
            .checked_mul(batches_per_epoch)?
            .checked_add(self.batches_done)
    }

    /// The last epoch a run may reach with `batches_per_epoch` batches an epoch: every batch
    /// up to the end of it has a delivery number ([`seq`](Position::seq)) that fits in 64 bits.
    /// Past it the numbers would wrap and the run would deliver another epoch's batches.
    pub fn last_epoch_allowed(batches_per_epoch: u64) -> u64 {
        (u64::MAX / batches_per_epoch.max(1)).saturating_sub(1)
    }

    /// Checks that a run of `epochs` epochs from this position stays within
    /// [`last_epoch_allowed`](Position::last_epoch_allowed); the error names that epoch.
    pub fn check_epochs(self, epochs: u64, batches_per_epoch: u64) -> Result<()> {
        let allowed = Position::last_epoch_allowed(batches_per_epoch);
        let last = self.epoch.checked_add(epochs.saturating_sub(1));
        match last {
            Some(last) if last <= allowed => Ok(()),
            _ => Err(LoaderError::Config(format!(
                "epoch {} (+ {epochs} epoch(s)) is out of range: with {batches_per_epoch} \
                 batches an epoch the largest epoch allowed is {allowed}",
                self.epoch
            ))),
        }
    }
}

/// The record order of one epoch for one rank (one process of a distributed job), as batches.
///
/// [`batch`](EpochOrder::batch) gives batch `i` as a contiguous [`BatchRecords::Range`] or as
/// explicit [`BatchRecords::Indices`]. The order is a pure function of the [`OrderSpec`] and the
/// epoch, built in three steps:
///
/// 1. **The global order** `P`, a permutation of the `N = num_records` records. It depends on
///    `(seed, epoch, shuffle, num_records)` only — never on the batch size, the world size or
///    the rank — so every rank computes the same one, and a job restarted on another number of
///    processes walks the same records in the same order. [`Shuffle`] says how it is drawn.
/// 2. **The epoch's positions** `E[g] = P[g mod N]` for `g` in `0 .. T`, where every rank gets
///    the same number `m` of records and `T = m × world_size`:
///    - `drop_last = false`: `m = ceil(N / world_size)`. The `T − N` positions past the end
///      (fewer than `world_size`) repeat the global order from its start, as torch's
///      `DistributedSampler` pads: the records `P[0], P[1], …, P[T − N − 1]` are delivered twice in
///      that epoch, every other record once (when `N < T − N`, the repeats cycle through `P`
///      again, so a record may come more than twice). With
///      one rank `T = N`: nothing is repeated and the last batch may be partial, as the loader's
///      plan always did.
///    - `drop_last = true`: `m = floor(N / (world_size × batch_size)) × batch_size`, so every rank
///      has the same number of *full* batches. The last `N − T` records of the global order
///      (fewer than `world_size × batch_size`) are left out of that epoch — a different set each
///      epoch when shuffled. An epoch with no full batch is an error, as in the loader's plan.
/// 3. **The split**, round-robin by batch: step `i` of training covers the positions
///    `i × world_size × batch_size ..` and cuts them into `world_size` equal contiguous batches,
///    rank `r` taking the `r`-th. Batch `i` of rank `r` is
///    `E[i·W·B + r·s .. i·W·B + (r + 1)·s]` (`W` ranks, batch size `B`), where `s = B` except in
///    the last step, where `s = m − (num_batches − 1)·B` on every rank. Each position goes to
///    exactly one rank.
///
/// Why batches rather than records (torch's `g % world_size`) or contiguous shards go round the
/// ranks: as with torch, step `i` consumes exactly the positions `i·W·B .. (i + 1)·W·B`, so after
/// `k` steps the job has read a prefix of the global order whatever its world size (contiguous
/// shards would leave a ragged set behind); and each batch stays a contiguous run of the
/// global order, so with [`Shuffle::None`] every batch holding no padding is one `Range` (one
/// read) on any number of ranks, and with [`Shuffle::Block`] a batch touches few windows.
///
/// **Resume.** A [`Position`] (`epoch`, `batches_done`; plain integers, what the Python layer
/// puts in its `state_dict`) is all a restart needs: [`EpochOrder::resume`] rebuilds the epoch's
/// order and says which batches are left, and those batches hold exactly the records the
/// interrupted run would have read. Batches may be asked for in any order, from any thread.
///
/// **Elastic resume.** A position saved at world size `W` resumes at another world size `W′`
/// through [`Position::reshard`]: the job had consumed a prefix `P[.. c]` of the global order
/// (`c` = `batches_done × W × batch_size`, the minimum over ranks), and
/// [`EpochOrder::remainder`] splits the rest `P[c ..]` over `W′` ranks by the rules above, as
/// if it were the whole global order. The next epoch is an ordinary one at `W′`.
///
/// **Memory.** [`Shuffle::None`] stores nothing. [`Shuffle::Random`] stores the global order, 4
/// bytes a record up to 2³² records (8 beyond): 96 MB for 24 million records, built in about
/// 0.3 s on one core. [`Shuffle::Block`] stores only the block order (4 or 8 bytes a block) and
/// where each window starts; a window's shuffle is computed when a batch first needs it, and
/// the last 8 computed are kept (at most `window × block × 8` bytes each).
///
/// ```
/// use pinfeed::{BatchRecords, EpochOrder, OrderSpec, Position, Shuffle};
///
/// let spec = OrderSpec {
///     num_records: 10,
///     batch_size: 3,
///     drop_last: false,
///     shuffle: Shuffle::Random,
///     seed: 7,
///     rank: 1,
///     world_size: 2,
/// };
/// let order = EpochOrder::new(&spec, 0).unwrap();
/// assert_eq!(order.num_batches(), 2); // 5 records on each rank: a batch of 3, then one of 2
/// assert_eq!(order.batch(1).len(), 2);
///
/// // Restarting after one batch gives the same remaining records.
/// let (resumed, left) = EpochOrder::resume(&spec, Position { epoch: 0, batches_done: 1, consumed: 0 }).unwrap();
/// assert_eq!(left, 1..2);
/// assert_eq!(resumed.batch(1), order.batch(1));
///
/// // In file order on one rank, batches are the ranges the loader always read.
/// let plain = OrderSpec { shuffle: Shuffle::None, rank: 0, world_size: 1, ..spec };
/// let order = EpochOrder::new(&plain, 0).unwrap();
/// assert_eq!(order.batch(3), BatchRecords::Range { first: 9, count: 1 });
/// ```
pub struct EpochOrder {
    spec: OrderSpec,
    epoch: u64,
    global: Global,
    /// Records of the global order left out of the front of this split (see
    /// [`EpochOrder::remainder`]); its positions are those of `P[consumed ..]`.
    consumed: u64,
    split: Split,
}

/// How `R` records of a global order (all of them, or what is left after an elastic resume)
/// are split over the ranks: the sizes of steps 2 and 3 of [`EpochOrder`].
#[derive(Clone, Copy, Debug)]
struct Split {
    /// Records on each rank (`m`); all ranks read `m × world_size` positions.
    per_rank: u64,
    num_batches: u64,
    /// Records in each rank's last batch: in `1 ..= batch_size` when there are batches.
    last_batch: u64,
}

impl Split {
    /// The split of `P[consumed ..]` under `spec`, without drawing an order.
    fn of(spec: &OrderSpec, consumed: u64) -> Result<Split> {
        spec.validate()?;
        let (n, batch, world) = (spec.num_records, spec.batch_size, spec.world_size);
        if consumed > 0 && consumed >= n {
            return Err(LoaderError::Config(format!(
                "{consumed} records consumed is past the end of an epoch of {n} records"
            )));
        }
        let left = n - consumed;
        let per_rank = if spec.drop_last {
            // An overflowing step is larger than any dataset: no full step.
            let step = world.saturating_mul(batch);
            let full_steps = left / step;
            if full_steps == 0 {
                return Err(LoaderError::Config(format!(
                    "{left} records cannot fill one batch of {batch} on each of {world} rank(s) \
                     and drop_last is set, so there is no batch to deliver"
                )));
            }
            full_steps * batch
        } else {
            let per_rank = left.div_ceil(world);
            per_rank.checked_mul(world).ok_or_else(|| {
                LoaderError::Config(format!(
                    "{left} records padded for {world} ranks overflow a 64-bit count"
                ))
            })?;
            per_rank
        };
        let num_batches = per_rank.div_ceil(batch);
        let last_batch = per_rank - num_batches.saturating_sub(1) * batch;
        Ok(Split {
            per_rank,
            num_batches,
            last_batch,
        })
    }

    /// Checks that `at.batches_done` lies within this split (the end of it included).
    fn check_done(&self, at: Position) -> Result<()> {
        if at.batches_done > self.num_batches {
            return Err(LoaderError::Config(format!(
                "cannot resume after batch {} of epoch {}: the epoch has {} batches on each \
                 rank (was the dataset, batch size or world size changed?)",
                at.batches_done, at.epoch, self.num_batches
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for EpochOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochOrder")
            .field("spec", &self.spec)
            .field("epoch", &self.epoch)
            .field("consumed", &self.consumed)
            .field("num_batches", &self.split.num_batches)
            .field("records_per_rank", &self.split.per_rank)
            .finish()
    }
}

impl EpochOrder {
    /// The order of `epoch` for `spec.rank`. Errors name the option that is out of range.
    pub fn new(spec: &OrderSpec, epoch: u64) -> Result<EpochOrder> {
        EpochOrder::remainder(spec, epoch, 0)
    }

    /// The order of what is left of `epoch` once the first `consumed` records of its global
    /// order `P` were consumed (an elastic resume: [`Position::reshard`]): the rules of
    /// [`EpochOrder`] applied to `P[consumed ..]` as if it were the whole global order. Padding
    /// (`drop_last = false`) repeats records from the start of that rest, never a consumed
    /// one; `drop_last = true` leaves out fewer than `world_size × batch_size` records of its
    /// end. `consumed` 0 is [`EpochOrder::new`]; otherwise it must be below `num_records`.
    pub fn remainder(spec: &OrderSpec, epoch: u64, consumed: u64) -> Result<EpochOrder> {
        let split = Split::of(spec, consumed)?;
        let global = Global::new(spec, epoch)?;
        Ok(EpochOrder {
            spec: spec.clone(),
            epoch,
            global,
            consumed,
            split,
        })
    }

    /// The order of `at.epoch` (the rest after `at.consumed` records, see
    /// [`remainder`](EpochOrder::remainder)), and the batches of it still to deliver,
    /// `at.batches_done .. num_batches()` (empty when the epoch was finished: go on with the
    /// next one). Those batches hold exactly the records an uninterrupted run would have read.
    pub fn resume(spec: &OrderSpec, at: Position) -> Result<(EpochOrder, std::ops::Range<u64>)> {
        let order = EpochOrder::remainder(spec, at.epoch, at.consumed)?;
        order.split.check_done(at)?;
        let left = at.batches_done..order.split.num_batches;
        Ok((order, left))
    }

    /// The spec the order was built from.
    pub fn spec(&self) -> &OrderSpec {
        &self.spec
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Records of the global order left out of the front of this split: 0, or the `consumed`
    /// of [`remainder`](EpochOrder::remainder).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Batches of this rank in the epoch (in the split, after an elastic resume); the same on
    /// every rank.
    pub fn num_batches(&self) -> u64 {
        self.split.num_batches
    }

    /// Records of this rank in the epoch (in the split), padding included; the same on every
    /// rank.
    pub fn num_records(&self) -> u64 {
        self.split.per_rank
    }

    /// Records of the global order this split covers: `num_records − consumed`.
    fn left(&self) -> u64 {
        self.spec.num_records - self.consumed
    }

    /// Positions past the end of the global order, over all ranks: the repeats that pad the
    /// epoch (`drop_last = false`).
    pub fn num_padded(&self) -> u64 {
        (self.split.per_rank * self.spec.world_size).saturating_sub(self.left())
    }

    /// Records left out of the epoch, over all ranks (`drop_last = true`).
    pub fn num_dropped(&self) -> u64 {
        self.left()
            .saturating_sub(self.split.per_rank * self.spec.world_size)
    }

    /// The records of batch `i` of this rank, in batch order: a `Range` for
    /// [`Shuffle::None`] unless the batch holds padding, `Indices` otherwise. Every batch but
    /// the last holds `batch_size` records; the last holds the same number on every rank.
    ///
    /// # Panics
    /// If `i >= num_batches()`, like indexing past the end of a slice.
    pub fn batch(&self, i: u64) -> BatchRecords {
        let split = &self.split;
        assert!(
            i < split.num_batches,
            "batch {i} asked of an epoch of {} batches",
            split.num_batches
        );
        let count = if i + 1 == split.num_batches {
            split.last_batch
        } else {
            self.spec.batch_size
        };
        // `i × batch_size < per_rank`, so neither product passes `per_rank × world_size`, which
        // `Split::of` checked.
        let first = i * self.spec.batch_size * self.spec.world_size + self.spec.rank * count;
        let end = first + count;
        if matches!(self.global, Global::Identity) && end <= self.left() {
            return BatchRecords::Range {
                first: self.consumed + first,
                count,
            };
        }
        let mut records = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        self.push_positions(first, end, &mut records);
        BatchRecords::Indices(records)
    }

    /// Appends `E[from .. to]` of the split, `P[consumed + g mod (num_records − consumed)]`:
    /// past the end of the global order, padding wraps to the start of the split.
    fn push_positions(&self, from: u64, to: u64, out: &mut Vec<u64>) {
        let left = self.left();
        debug_assert!(left > 0, "an epoch with batches has records");
        let mut g = from;
        while g < to {
            let p = g % left;
            let run = (to - g).min(left - p);
            let first = self.consumed + p;
            self.global.push(first, first + run, out);
            g += run;
        }
    }
}
