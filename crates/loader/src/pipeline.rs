//! The threads of a loader and what they share.
//!
//! ```text
//!   reader threads ──fill──▶ ring slots (pinned) ──copy stream──▶ device memory ──▶ consumer
//!        ▲  acquire()            Filling → Filled → Copying(event) → Free when the event completes
//!        └──────────────────────────────────────────────────────────┘
//! ```
//!
//! Readers own a slot from `acquire` to `fill_done`. The copy thread takes filled slots in
//! sequence order, allocates the batch's device memory, issues the copy and hands the batch to
//! the consumer through a bounded channel (`prefetch` deep). The consumer owns each [`Batch`]
//! and its device memory until it drops it.
//!
//! A loader may copy to several devices (targets): each slot is then copied to every one, each
//! copy on its own device's stream, and the slot's fence is [`CopyFence::All`] of those copies.
//! The batches of one step go through the channel one after the other, in target order.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pinfeed_ring::{Claim, Ring};
use pinfeed_source::{AlignedBuffer, Source};

use crate::backend::{Backend, CopyFence, DeviceBudget, DeviceMemory, DeviceSpec, Landed};
use crate::error::{LoaderError, Result};
use crate::order::{BatchRecords, EpochOrder, OrderSpec, Shuffle};
use crate::pool::{pinned_allocations, PinnedPool};
use crate::register::{MappedWindows, ReaderKind};
use crate::stats::{add, get, Counters, Delivered, DeviceStats, Stats};
use crate::{LoaderOptions, Position, Transform, MAX_SLOTS};

/// Which records each batch holds: the epochs' orders, from the resume position on.
///
/// Sequence number `seq` is global batch `first_global + seq`, that is batch
/// `(first_global + seq) % batches_per_epoch` of epoch `(first_global + seq) / batches_per_epoch`.
struct Plan {
    spec: OrderSpec,
    batches_per_epoch: u64,
    first_global: u64,
    total: u64,
    /// The orders of the epochs in use, newest last: readers may work on two epochs at once,
    /// and a shuffled order is worth computing once.
    orders: Mutex<VecDeque<Arc<EpochOrder>>>,
}

/// One batch's place in the plan.
#[derive(Clone, Debug)]
struct BatchSpec {
    epoch: u64,
    index: u64,
    records: BatchRecords,
    count: usize,
}

impl BatchSpec {
    fn first(&self) -> u64 {
        match &self.records {
            BatchRecords::Range { first, .. } => *first,
            BatchRecords::Indices(indices) => indices[0],
        }
    }
}

impl Plan {
    fn new(num_records: u64, options: &LoaderOptions, source_name: &str) -> Result<Plan> {
        if options.batch_size == 0 {
            return Err(LoaderError::Config("batch size must be at least 1".into()));
        }
        if options.epochs == 0 {
            return Err(LoaderError::Config("epochs must be at least 1".into()));
        }
        let spec = OrderSpec {
            num_records,
            batch_size: options.batch_size as u64,
            drop_last: options.drop_last,
            shuffle: options.shuffle,
            seed: options.seed,
            rank: options.rank,
            world_size: options.world_size,
        };
        let (first, remaining) = EpochOrder::resume(&spec, options.start).map_err(|e| match e {
            LoaderError::Config(m) => LoaderError::Config(format!("{source_name}: {m}")),
            other => other,
        })?;
        let batches_per_epoch = first.num_batches();
        if batches_per_epoch == 0 {
            return Err(LoaderError::Config(format!(
                "{source_name}: batch size {} leaves no batch to deliver from {num_records} records{}",
                options.batch_size,
                if options.drop_last { " with drop_last" } else { "" }
            )));
        }
        let total = batches_per_epoch
            .checked_mul(options.epochs)
            .map(|all| all - remaining.start)
            .ok_or_else(|| LoaderError::Config(format!("{} epochs is too many", options.epochs)))?;
        let first_global = options
            .start
            .epoch
            .checked_mul(batches_per_epoch)
            .and_then(|b| b.checked_add(remaining.start))
            .ok_or_else(|| {
                LoaderError::Config(format!(
                    "epoch {} is too large: its first batch has no index below 2^64",
                    options.start.epoch
                ))
            })?;
        Ok(Plan {
            spec,
            batches_per_epoch,
            first_global,
            total,
            orders: Mutex::new(VecDeque::from([Arc::new(first)])),
        })
    }

    fn total(&self) -> u64 {
        self.total
    }

    /// The epoch of the first batch this plan delivers.
    fn first_epoch(&self) -> u64 {
        self.first_global / self.batches_per_epoch
    }

    fn order(&self, epoch: u64) -> Result<Arc<EpochOrder>> {
        let mut orders = self.orders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(order) = orders.iter().find(|o| o.epoch() == epoch) {
            return Ok(Arc::clone(order));
        }
        // Computed under the lock: other readers need the same epoch and would only wait.
        let order = Arc::new(EpochOrder::new(&self.spec, epoch)?);
        orders.push_back(Arc::clone(&order));
        if orders.len() > 2 {
            orders.pop_front();
        }
        Ok(order)
    }

    fn batch(&self, seq: u64) -> Result<BatchSpec> {
        let global = self.first_global + seq;
        let (epoch, index) = (
            global / self.batches_per_epoch,
            global % self.batches_per_epoch,
        );
        let records = self.order(epoch)?.batch(index);
        let count = records.len() as usize;
        Ok(BatchSpec {
            epoch,
            index,
            records,
            count,
        })
    }
}

/// A filled slot: which piece of which batch, and the offset of its first byte in the slot.
struct SlotContents {
    /// The batch's place in the plan, recorded with its first piece only (the copy thread
    /// needs it once per batch).
    spec: Option<Arc<BatchSpec>>,
    /// The piece's records, `lo .. hi` of the batch (empty for a piece past a short batch's
    /// end).
    records: std::ops::Range<usize>,
    offset: usize,
}

/// How batches are cut into pieces, a slot each: unit `u` of the ring is piece
/// `u % per_batch` of batch `u / per_batch`, holding the batch's records
/// `piece × records .. (piece + 1) × records` (fewer, or none, in a short last batch).
#[derive(Clone, Copy, Debug)]
struct Pieces {
    per_batch: u64,
    records: usize,
}

impl Pieces {
    /// Pieces of at most `piece_bytes` (at least one record each) for batches of `batch_size`
    /// records of `record_bytes`; one piece a batch when `piece_bytes` is `None`.
    fn new(batch_size: usize, record_bytes: usize, piece_bytes: Option<usize>) -> Pieces {
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
    fn split(&self, unit: u64) -> (u64, u64) {
        (unit / self.per_batch, unit % self.per_batch)
    }

    /// Records `lo .. hi` of a batch of `count` records that piece `piece` holds.
    fn range(&self, piece: u64, count: usize) -> std::ops::Range<usize> {
        let lo = (piece as usize * self.records).min(count);
        lo..(lo + self.records).min(count)
    }
}

/// A device the loader copies batches to.
struct Target {
    /// Its context, copy stream and memory pool (or the host backend's copy engine).
    backend: Arc<Backend>,
    /// Device bytes held by this device's batches.
    budget: Arc<DeviceBudget>,
    /// What the consumer has received for this device.
    delivered: Delivered,
}

impl Target {
    fn new(backend: Arc<Backend>, device_budget: Option<usize>) -> Target {
        Target {
            backend,
            budget: DeviceBudget::new(device_budget),
            delivered: Delivered::default(),
        }
    }
}

/// What the loader's threads share.
struct Shared {
    // Field order is drop order: the ring is drained in `Drop` before the staging memory goes.
    ring: Ring<CopyFence>,
    staging: Staging,
    /// The devices every batch is copied to, at least one; the first one's context made the
    /// pinned pool (page-locked for every context: `CU_MEMHOSTALLOC_PORTABLE`).
    targets: Vec<Target>,
    source: Arc<dyn Source>,
    transform: Option<Arc<dyn Transform>>,
    plan: Plan,
    out_record_bytes: usize,
    error: Mutex<Option<LoaderError>>,
    counters: Counters,
    /// What each filled slot holds: the batch's place in the plan and where its bytes start in
    /// the slot (aligned reads may put them past the start). Set by the slot's reader before
    /// `fill_done` and taken by the copy thread after `next_filled`, which the ring orders; so
    /// the plan is worked out once per batch.
    slot_contents: Vec<Mutex<Option<SlotContents>>>,
    /// How batches are cut into slots (one piece a batch with a transform or register reader).
    pieces: Pieces,
    started: Instant,
    /// Time `Loader::new` took before the threads started (mostly page-locking the pool).
    startup: Duration,
    threads: usize,
    pinned_allocations_at_start: u64,
}

impl Shared {
    /// Keeps the first error and stops the ring.
    fn fail(&self, error: LoaderError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(error);
        drop(slot);
        self.ring.shutdown();
    }

    fn take_error(&self) -> Option<LoaderError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The first device's backend: the one that made the pinned pool.
    fn backend(&self) -> &Arc<Backend> {
        &self.targets[0].backend
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // No copy may read the pool once it is freed. An error here leaves nothing better to do
        // than to wait on the rest, which drain already did.
        let _ = self.ring.drain();
        if let Staging::Windows(windows) = &self.staging {
            windows.unlock_all();
        }
    }
}

/// What the ring's slots are.
enum Staging {
    /// Slots of one pinned allocation, filled by reader threads.
    Slots(PinnedPool),
    /// Registered windows of a mapped file, locked by one registrar thread.
    Windows(MappedWindows),
}

impl Staging {
    fn reader(&self) -> ReaderKind {
        match self {
            Staging::Slots(_) => ReaderKind::Pread,
            Staging::Windows(_) => ReaderKind::Register,
        }
    }
    fn slot_bytes(&self) -> usize {
        match self {
            Staging::Slots(pool) => pool.slot_bytes(),
            Staging::Windows(windows) => windows.window_bytes(),
        }
    }
    fn locked(&self) -> bool {
        match self {
            Staging::Slots(pool) => pool.locked(),
            Staging::Windows(_) => true,
        }
    }
    fn numa_placement(&self) -> String {
        match self {
            Staging::Slots(pool) => pool.numa_placement(),
            Staging::Windows(_) => {
                "not placed: the page cache holds the file's pages where it read them".to_string()
            }
        }
    }
}

/// A batch on the device: its memory, its place in the dataset, and the copy that fills it.
///
/// The memory stays valid while the `Batch` lives; the copy may still be running when the
/// consumer receives it, so read it only after [`wait_ready`](Batch::wait_ready) or, on CUDA,
/// on a stream made to wait with [`stream_wait`](Batch::stream_wait).
pub struct Batch {
    seq: u64,
    spec: Arc<BatchSpec>,
    len: usize,
    /// Which of the loader's devices it is on (0 for a loader of one device).
    target: usize,
    landed: Landed,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("seq", &self.seq)
            .field("epoch", &self.spec.epoch)
            .field("index", &self.spec.index)
            .field("records", &self.spec.count)
            .field("len", &self.len)
            .finish()
    }
}

impl Batch {
    /// Position in delivery order, counting across epochs from 0.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// The epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.spec.epoch
    }
    /// Index of this batch within its epoch.
    pub fn index(&self) -> u64 {
        self.spec.index
    }
    /// Index of the batch's first record in the dataset.
    pub fn first_record(&self) -> u64 {
        self.spec.first()
    }
    /// The records of this batch, in batch order.
    pub fn records(&self) -> &BatchRecords {
        &self.spec.records
    }
    /// Records in this batch.
    pub fn num_records(&self) -> usize {
        self.spec.count
    }
    /// Where to resume to continue after this batch: its epoch and the batches of that epoch
    /// delivered up to and including this one.
    pub fn position_after(&self) -> Position {
        Position {
            epoch: self.spec.epoch,
            batches_done: self.spec.index + 1,
        }
    }
    /// Bytes in this batch.
    pub fn len_bytes(&self) -> usize {
        self.len
    }
    /// The device address of the batch (a host address on the host backend).
    pub fn address(&self) -> u64 {
        self.landed.memory.address()
    }
    /// Which of the loader's devices it is on: its place in [`Loader::devices`] (0 for a loader
    /// of one device).
    pub fn target(&self) -> usize {
        self.target
    }
    /// The device the batch is on.
    pub fn device(&self) -> DeviceSpec {
        self.landed.backend.device()
    }
    /// The fence that completes when the batch's copy has finished.
    pub fn ready(&self) -> &CopyFence {
        &self.landed.ready
    }

    /// Blocks the calling thread until the batch's copy has finished.
    pub fn wait_ready(&self) -> Result<()> {
        self.landed.wait_ready()
    }

    /// The batch's bytes on the host backend, once its copy has finished (`None` on CUDA).
    pub fn host_bytes(&self) -> Result<Option<&[u8]>> {
        self.landed.host_bytes(self.len)
    }

    /// Copies what arrived on the device back into `dst` (exactly `len_bytes()` long), after
    /// the batch's copy finished: how `--verify` checks the device side.
    pub fn read_back(&self, dst: &mut [u8]) -> Result<()> {
        self.landed.read_back(dst, self.len)
    }

    /// Makes a CUDA stream of the caller's wait for the batch's copy without blocking the host
    /// (`cuStreamWaitEvent`). On the host backend this waits for the copy instead.
    ///
    /// # Safety
    /// `stream` is a live CUDA stream of the batch's device context (0 for the legacy default
    /// stream), or any value on the host backend.
    pub unsafe fn stream_wait(&self, stream: u64) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.landed.stream_wait(stream) }
    }

    /// Releases the batch once the work already queued on `stream` is done with it: an event
    /// is recorded on `stream` (on the legacy default stream, 0 or 1, the copy thread records
    /// one later for several batches), and the memory goes to a later batch (or is freed) only
    /// after it has completed, so a later batch never overwrites memory a queued kernel may
    /// still read.
    ///
    /// # Safety
    /// As for [`stream_wait`](Batch::stream_wait).
    pub unsafe fn release_after(mut self, stream: u64) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.landed.order_free_after(stream) }
    }
}

/// Streams a [`Source`] to a device through a bounded ring of pinned slots. Iterate it to get
/// [`Batch`]es in order; dropping it stops its threads and frees its pinned memory once every
/// copy out of it has finished.
pub struct Loader {
    shared: Arc<Shared>,
    batches: Option<Receiver<Result<Batch>>>,
    threads: Vec<JoinHandle<()>>,
    finished: bool,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("source", &self.shared.source.name())
            .field("devices", &self.devices())
            .field("batches", &self.shared.plan.total())
            .field("slots", &self.shared.ring.capacity())
            .finish()
    }
}

impl Loader {
    /// Starts a loader: checks the options against the source, makes the one pinned
    /// allocation, and starts the reader and copy threads.
    pub fn new(source: Arc<dyn Source>, options: LoaderOptions) -> Result<Loader> {
        let (device, pin_method) = (options.device, options.pin_method);
        Loader::start(source, options, move || {
            Ok(vec![Arc::new(Backend::new(device, pin_method)?)])
        })
    }

    /// Starts a loader that copies every batch to each backend `make_backends` returns (one or
    /// more; called once the options have been checked against the source, so that a bad option
    /// is reported before any device is opened). With several, the loader's iterator yields the
    /// batches of each step one after the other, in backend order (see `MultiLoader`).
    pub(crate) fn start(
        source: Arc<dyn Source>,
        options: LoaderOptions,
        make_backends: impl FnOnce() -> Result<Vec<Arc<Backend>>>,
    ) -> Result<Loader> {
        let begun = Instant::now();
        let name = source.name().to_string();
        let plan = Plan::new(source.num_records(), &options, &name)?;
        let record_bytes = source.layout().record_bytes();
        let out_record_bytes = options
            .transform
            .as_ref()
            .map_or(record_bytes, |t| t.output_record_bytes());
        if out_record_bytes == 0 {
            return Err(LoaderError::Config(
                "the transform's output records are 0 bytes long".into(),
            ));
        }
        let batch_bytes = out_record_bytes
            .checked_mul(options.batch_size)
            .ok_or_else(|| LoaderError::Config("batch size × record size overflows".into()))?;
        // Without a transform, readers read straight into the slot, so it holds what the
        // source's aligned reads need (O_DIRECT reads whole aligned blocks around the records).
        // Slots are page-aligned (and aligned as the source needs): what O_DIRECT reads need, and
        // what keeps copies aligned.
        let align = source.alignment().max(4096);
        // Large batches go in pieces, each its own slot (see `LoaderOptions::piece_bytes`).
        let pieces = if options.transform.is_some() || options.reader == ReaderKind::Register {
            Pieces::new(options.batch_size, out_record_bytes, None)
        } else {
            Pieces::new(options.batch_size, out_record_bytes, options.piece_bytes)
        };
        let read_span = if options.transform.is_some() {
            batch_bytes
        } else {
            source
                .aligned_span(pieces.records)
                .max(pieces.records * out_record_bytes)
        };
        let slot_bytes = read_span
            .checked_next_multiple_of(align)
            .ok_or_else(|| LoaderError::Config("batch too large".into()))?;
        let fits = options.pinned_budget / slot_bytes;
        if fits < 2 {
            return Err(LoaderError::BudgetTooSmall {
                budget: options.pinned_budget,
                slot_bytes,
                fits,
                batch_size: options.batch_size,
                record_bytes: out_record_bytes,
                needed: 2 * slot_bytes,
            });
        }
        let total = plan.total();
        let units = total
            .checked_mul(pieces.per_batch)
            .ok_or_else(|| LoaderError::Config(format!("{} epochs is too many", options.epochs)))?;
        let threads = options
            .num_threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(4, |n| n.get())
                    .min(8)
            })
            .max(1);
        // Enough slots for every reader to hold one, the copy engine a few and the rest queued;
        // more would only lock more memory (and take longer to lock at start-up).
        let slots = fits
            .min(MAX_SLOTS)
            .min(2 * threads + 6)
            .min(usize::try_from(units).unwrap_or(usize::MAX).max(2));
        if options.prefetch == 0 {
            return Err(LoaderError::Config("prefetch must be at least 1".into()));
        }

        let backends = make_backends()?;
        if backends.is_empty() {
            return Err(LoaderError::Config("no device given".into()));
        }
        debug_assert!(
            backends.len() == 1 || options.reader != ReaderKind::Register,
            "MultiLoader::replicated refuses the register reader"
        );
        // Prefetch counts steps: every device's batch of a step is in the channel at once.
        let depth = options
            .prefetch
            .checked_mul(backends.len())
            .ok_or_else(|| LoaderError::Config("prefetch × devices overflows".into()))?;
        let staging = choose_staging(
            &source,
            &options,
            &backends[0],
            batch_bytes,
            slot_bytes,
            slots,
        )?;
        let (ring_slots, ring_total) = match &staging {
            Staging::Slots(pool) => (pool.slots(), units),
            Staging::Windows(windows) => {
                (windows.slots(), windows.windows_per_epoch * options.epochs)
            }
        };
        let registrar = matches!(staging, Staging::Windows(_));
        let threads = if registrar { 1 } else { threads };
        let shared = Arc::new(Shared {
            ring: Ring::new(ring_slots, ring_total),
            staging,
            targets: backends
                .into_iter()
                .map(|backend| Target::new(backend, options.device_budget))
                .collect(),
            source,
            transform: options.transform.clone(),
            plan,
            out_record_bytes,
            error: Mutex::new(None),
            counters: Counters::default(),
            slot_contents: (0..ring_slots).map(|_| Mutex::new(None)).collect(),
            pieces,
            started: Instant::now(),
            startup: begun.elapsed(),
            threads,
            pinned_allocations_at_start: pinned_allocations(),
        });

        let (tx, rx) = mpsc::sync_channel(depth);
        let mut loader = Loader {
            shared: Arc::clone(&shared),
            batches: Some(rx),
            threads: Vec::with_capacity(threads + 1),
            finished: false,
        };
        for i in 0..threads {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("pinfeed-read-{i}"))
                .spawn(move || match shared.staging {
                    Staging::Slots(_) => read_loop(&shared),
                    Staging::Windows(_) => register_loop(&shared),
                })
                .map_err(|source| LoaderError::Thread {
                    what: "reader",
                    source,
                });
            match handle {
                Ok(h) => loader.threads.push(h),
                Err(e) => return Err(e), // Drop stops the threads already started.
            }
        }
        let copier = std::thread::Builder::new()
            .name("pinfeed-copy".into())
            .spawn(move || copy_loop(&shared, tx))
            .map_err(|source| LoaderError::Thread {
                what: "copy",
                source,
            })?;
        loader.threads.push(copier);
        Ok(loader)
    }

    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.shared.plan.batches_per_epoch
    }

    /// Batches over all epochs (for each device, for a loader copying to several).
    pub fn num_batches(&self) -> u64 {
        self.shared.plan.total()
    }

    /// Bytes of one output record.
    pub fn record_bytes(&self) -> usize {
        self.shared.out_record_bytes
    }

    /// The source being streamed.
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.shared.source
    }

    /// The device batches go to (the first one, for a loader copying to several).
    pub fn device(&self) -> DeviceSpec {
        self.shared.backend().device()
    }

    /// Every device batches go to, in order.
    pub fn devices(&self) -> Vec<DeviceSpec> {
        self.shared
            .targets
            .iter()
            .map(|t| t.backend.device())
            .collect()
    }

    /// A snapshot of the loader's counters.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        let c = &s.counters;
        let ring = s.ring.stats();
        let nanos = |counter| Duration::from_nanos(get(counter));
        let devices: Vec<DeviceStats> = s
            .targets
            .iter()
            .map(|t| DeviceStats {
                device: t.backend.device(),
                batches: get(&t.delivered.batches),
                records: get(&t.delivered.records),
                bytes: get(&t.delivered.bytes),
                device_bytes_peak: t.budget.peak(),
            })
            .collect();
        Stats {
            device: s.backend().device(),
            elapsed: s.started.elapsed(),
            startup: s.startup,
            batches: devices.iter().map(|d| d.batches).sum(),
            records: devices.iter().map(|d| d.records).sum(),
            bytes: devices.iter().map(|d| d.bytes).sum(),
            device_bytes_peak: devices
                .iter()
                .map(|d| d.device_bytes_peak)
                .max()
                .unwrap_or(0),
            devices,
            threads: s.threads,
            read_time: nanos(&c.read_ns),
            read_bytes: get(&c.read_bytes),
            transform_time: nanos(&c.transform_ns),
            wait_free_slot: ring.wait_free,
            wait_filled: ring.wait_filled,
            copy_issue_time: nanos(&c.copy_issue_ns),
            wait_consumer: nanos(&c.wait_consumer_ns),
            consumer_wait: nanos(&c.consumer_wait_ns),
            reader: s.staging.reader(),
            reader_description: match s.staging {
                Staging::Slots(_) => s.source.reader_description(),
                Staging::Windows(_) => "read-only mmap registered window by window".to_string(),
            },
            slots: ring.capacity,
            slot_bytes: s.staging.slot_bytes(),
            pinned_bytes: ring.capacity * s.staging.slot_bytes(),
            pinned_bytes_peak: ring.capacity * s.staging.slot_bytes(),
            pinned_locked: s.staging.locked(),
            pinned_numa: s.staging.numa_placement(),
            pinned_allocations_after_start: pinned_allocations()
                .saturating_sub(s.pinned_allocations_at_start),
            slots_recycled: ring.recycled,
            slot_waits: ring.claims_waited,
            slots_peak_in_use: ring.peak_in_use,
        }
    }

    /// Device bytes held now by batches not yet dropped (on all devices together).
    pub fn device_bytes_held(&self) -> usize {
        self.shared.targets.iter().map(|t| t.budget.held()).sum()
    }

    /// Stops the threads and waits for them. Batches already delivered stay valid.
    fn stop(&mut self) {
        self.shared.ring.shutdown();
        // Dropping the receiver unblocks a copy thread waiting to hand over a batch.
        drop(self.batches.take());
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

/// What [`Loader::next_within`] found.
#[derive(Debug)]
pub enum Waited<T> {
    /// What `next()` would have returned.
    Ready(T),
    /// Nothing arrived in time; ask again.
    TimedOut,
}

impl Loader {
    /// Like [`Iterator::next`], but returns [`Waited::TimedOut`] after `timeout` without a batch,
    /// so that a caller (the Python bindings) can check for Ctrl-C while it waits.
    pub fn next_within(&mut self, timeout: Duration) -> Waited<Option<Result<Batch>>> {
        if self.finished {
            return Waited::Ready(None);
        }
        let Some(batches) = self.batches.as_ref() else {
            return Waited::Ready(None);
        };
        let started = Instant::now();
        let received = batches.recv_timeout(timeout);
        add(&self.shared.counters.consumer_wait_ns, started.elapsed());
        match received {
            Ok(item) => Waited::Ready(self.received(Ok(item))),
            Err(mpsc::RecvTimeoutError::Timeout) => Waited::TimedOut,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Waited::Ready(self.received(Err(mpsc::RecvError)))
            }
        }
    }

    fn received(
        &mut self,
        received: std::result::Result<Result<Batch>, mpsc::RecvError>,
    ) -> Option<Result<Batch>> {
        match received {
            Ok(Ok(batch)) => {
                use std::sync::atomic::Ordering::Relaxed;
                let d = &self.shared.targets[batch.target].delivered;
                d.batches.fetch_add(1, Relaxed);
                d.bytes.fetch_add(batch.len as u64, Relaxed);
                d.records.fetch_add(batch.spec.count as u64, Relaxed);
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                self.finished = true;
                self.stop();
                Some(Err(e))
            }
            Err(mpsc::RecvError) => {
                self.finished = true;
                self.stop();
                // The copy thread ends the channel after the last batch, or after an error it
                // could not deliver because the error arrived while it was exiting.
                self.shared.take_error().map(Err)
            }
        }
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.finished {
            return None;
        }
        let started = Instant::now();
        let received = self.batches.as_ref()?.recv();
        add(&self.shared.counters.consumer_wait_ns, started.elapsed());
        self.received(received)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // A loader copying to several devices yields every device's batch of each step.
        let targets = &self.shared.targets;
        let delivered: u64 = targets.iter().map(|t| get(&t.delivered.batches)).sum();
        let left = self
            .num_batches()
            .saturating_mul(targets.len() as u64)
            .saturating_sub(delivered);
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        if self.finished {
            (0, Some(0))
        } else {
            (0, Some(left))
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_loop(shared: &Shared) {
    let mut scratch: Option<AlignedBuffer> = None;
    // The batch this reader read a piece of last: its next piece is usually of the same one.
    let mut last: Option<(u64, Arc<BatchSpec>)> = None;
    loop {
        let claim = match shared.ring.acquire() {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => return shared.fail(e.into()),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            fill(shared, &claim, &mut scratch, &mut last)
        }));
        match outcome {
            Ok(Ok(())) => shared.ring.fill_done(claim),
            Ok(Err(e)) => {
                shared.fail(e);
                shared.ring.fill_abandoned(claim);
                return;
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                shared.fail(LoaderError::ReaderPanicked(message));
                shared.ring.fill_abandoned(claim);
                return;
            }
        }
    }
}

/// Reads one piece of a batch (the whole batch, when it is one piece) into its claimed slot,
/// through the transform if there is one.
fn fill(
    shared: &Shared,
    claim: &Claim,
    scratch: &mut Option<AlignedBuffer>,
    last: &mut Option<(u64, Arc<BatchSpec>)>,
) -> Result<()> {
    let (batch, piece) = shared.pieces.split(claim.seq());
    let spec = match last {
        Some((seq, spec)) if *seq == batch => Arc::clone(spec),
        _ => Arc::clone(&last.insert((batch, Arc::new(shared.plan.batch(batch)?))).1),
    };
    let records = shared.pieces.range(piece, spec.count);
    let count = records.len();
    let source = shared.source.as_ref();
    let raw_len = count * source.layout().record_bytes();
    let Staging::Slots(pool) = &shared.staging else {
        unreachable!("readers run only with pinned slots");
    };
    // SAFETY: the claim gives this thread the slot alone until `fill_done`/`fill_abandoned`.
    let slot = unsafe { pool.slot_mut(claim.slot(), pool.slot_bytes()) };
    let started = Instant::now();
    let offset = match &shared.transform {
        None if count == 0 => 0,
        None => read_batch(source, &spec.records, records.clone(), slot)?,
        Some(transform) => {
            let span = source
                .aligned_span(shared.plan.spec.batch_size as usize)
                .max(raw_len);
            let buf = match scratch {
                Some(buf) if buf.len() >= span => buf,
                _ => scratch.insert(AlignedBuffer::new(span, source.alignment())),
            };
            // With a transform a batch is one piece: `records` is the whole batch.
            let at = read_batch(source, &spec.records, records.clone(), buf)?;
            let read_done = Instant::now();
            add(&shared.counters.read_ns, read_done - started);
            let out_len = count * shared.out_record_bytes;
            transform
                .apply(&buf[at..at + raw_len], count, &mut slot[..out_len])
                .map_err(|message| LoaderError::Transform {
                    seq: batch,
                    message,
                })?;
            add(&shared.counters.transform_ns, read_done.elapsed());
            0
        }
    };
    if shared.transform.is_none() {
        add(&shared.counters.read_ns, started.elapsed());
    }
    shared
        .counters
        .read_bytes
        .fetch_add(raw_len as u64, std::sync::atomic::Ordering::Relaxed);
    *shared.slot_contents[claim.slot()]
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(SlotContents {
        spec: (piece == 0).then(|| Arc::clone(&spec)),
        records,
        offset,
    });
    Ok(())
}

/// Reads records `part` of a batch into `buf` (aligned as the source needs, and at least
/// their aligned span long) and returns where they start in it: one aligned read for a range,
/// a gather for a shuffled batch.
fn read_batch(
    source: &dyn Source,
    records: &BatchRecords,
    part: std::ops::Range<usize>,
    buf: &mut [u8],
) -> Result<usize> {
    let count = part.len();
    Ok(match records {
        BatchRecords::Range { first, .. } => {
            source.read_records_aligned(first + part.start as u64, count, buf)?
        }
        BatchRecords::Indices(indices) => {
            source.gather(
                &indices[part],
                &mut buf[..count * source.layout().record_bytes()],
            )?;
            0
        }
    })
}

fn copy_loop(shared: &Arc<Shared>, batches: SyncSender<Result<Batch>>) {
    // Every call into the driver makes its device's context current itself; binding the first
    // saves the switch for the common case of one device.
    if let Some(ctx) = shared.backend().context() {
        if let Err(e) = ctx.bind() {
            shared.fail(e.into());
        }
    }
    match &shared.staging {
        Staging::Slots(pool) => copy_slots(shared, pool, &batches),
        Staging::Windows(windows) => copy_windows(shared, windows, &batches),
    }
    if let Some(e) = shared.take_error() {
        let _ = batches.send(Err(e));
    }
}

/// Hands a batch on device `target` whose copy was issued to the consumer; false when the
/// consumer went away.
fn deliver(
    shared: &Shared,
    batches: &SyncSender<Result<Batch>>,
    target: usize,
    (seq, spec, len): (u64, Arc<BatchSpec>, usize),
    memory: DeviceMemory,
    ready: CopyFence,
) -> bool {
    let batch = Batch {
        seq,
        spec,
        len,
        target,
        landed: Landed {
            ready,
            memory,
            backend: Arc::clone(&shared.targets[target].backend),
        },
    };
    let handed = Instant::now();
    if batches.send(Ok(batch)).is_err() {
        return false;
    }
    add(&shared.counters.wait_consumer_ns, handed.elapsed());
    true
}

/// A batch being assembled by the copy thread: its place, and on each device its memory and
/// the fence of the last copy issued into it.
struct Assembling {
    spec: Arc<BatchSpec>,
    on: Vec<(DeviceMemory, Option<CopyFence>)>,
}

fn copy_slots(shared: &Arc<Shared>, pool: &PinnedPool, batches: &SyncSender<Result<Batch>>) {
    let pieces = shared.pieces;
    let rb = shared.out_record_bytes;
    let mut current: Option<Assembling> = None;
    for unit in 0..shared.plan.total() * pieces.per_batch {
        let Some(slot) = shared.ring.next_filled(unit) else {
            break;
        };
        let started = Instant::now();
        let SlotContents {
            spec,
            records,
            offset,
        } = shared.slot_contents[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("a filled slot has its contents recorded");
        let (seq, piece) = pieces.split(unit);
        if let Some(spec) = spec {
            // The batch's first piece: its device memory, whole, on every device.
            let on = shared
                .targets
                .iter()
                .map(|t| Ok((t.backend.alloc(spec.count * rb, &t.budget)?, None)))
                .collect::<Result<Vec<_>>>();
            match on {
                Ok(on) => current = Some(Assembling { spec, on }),
                Err(e) => {
                    shared.fail(e);
                    break;
                }
            }
        }
        let batch = current
            .as_mut()
            .expect("the first piece of a batch comes before the others");
        let (fence, failed) = if records.is_empty() {
            // Nothing to copy: the slot is free as soon as the copies before it are done.
            match shared.backend().completed_fence() {
                Ok(fence) => (Some(fence), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            let src = pool.slot_ptr(slot).wrapping_add(offset);
            // SAFETY: the slot stays `Filled` (untouched by readers) until `copy_issued`, after
            // which the ring keeps it out of the free list until this fence, that of every copy
            // issued out of it, completes; each destination lies inside the batch's memory on
            // its device (records `lo .. hi` of its `count`), disjoint from every other piece's,
            // and the batch is not read before its last fence there; the reader left the piece
            // at `offset .. offset + len`, inside the slot.
            unsafe {
                copy_to_every_device(
                    shared,
                    src,
                    &mut batch.on,
                    records.start * rb,
                    records.len() * rb,
                )
            }
        };
        // Copies already issued read the slot even when a later one failed: the ring must wait
        // for them before the pool can go.
        if let Some(fence) = fence {
            shared.ring.copy_issued(slot, fence);
        }
        if let Some(e) = failed {
            shared.fail(e);
            break;
        }
        add(&shared.counters.copy_issue_ns, started.elapsed());
        if piece + 1 == pieces.per_batch {
            let Assembling { spec, on } = current.take().expect("assembled above");
            let len = spec.count * rb;
            for (target, (memory, last)) in on.into_iter().enumerate() {
                // Copies to one device finish in the order they were issued (one stream; one
                // host copy thread), so the batch is complete there when its last copy is.
                let ready = match last {
                    Some(fence) => fence,
                    None => match shared.targets[target].backend.completed_fence() {
                        Ok(fence) => fence,
                        Err(e) => {
                            shared.fail(e);
                            return;
                        }
                    },
                };
                let place = (seq, Arc::clone(&spec), len);
                if !deliver(shared, batches, target, place, memory, ready) {
                    return;
                }
            }
        }
    }
}

/// Issues the copy of `len` bytes at `src` to `offset` of the batch's memory on every device,
/// each on its own device's stream, and returns the fence of all the copies issued, and the
/// error that stopped the rest if one did.
///
/// # Safety
/// As for [`Backend::copy`], for every device: `src` stays unwritten until the fence returned
/// completes, and no device's memory is read before its copy's fence.
unsafe fn copy_to_every_device(
    shared: &Shared,
    src: *const u8,
    on: &mut [(DeviceMemory, Option<CopyFence>)],
    offset: usize,
    len: usize,
) -> (Option<CopyFence>, Option<LoaderError>) {
    let mut fences = Vec::with_capacity(on.len());
    for (target, (memory, last)) in shared.targets.iter().zip(on) {
        // SAFETY: forwarded from this function's contract.
        match unsafe { target.backend.copy(src, memory, offset, len) } {
            Ok(fence) => {
                *last = Some(fence.clone());
                fences.push(fence);
            }
            Err(e) => {
                return (
                    (!fences.is_empty()).then(|| CopyFence::all(fences)),
                    Some(e),
                )
            }
        }
    }
    (Some(CopyFence::all(fences)), None)
}

/// Locks windows of the mapped file in order, as the ring frees slots.
fn register_loop(shared: &Shared) {
    let Staging::Windows(windows) = &shared.staging else {
        unreachable!("the registrar runs only with mapped windows");
    };
    if let Some(ctx) = shared.backend().context() {
        if let Err(e) = ctx.bind() {
            return shared.fail(e.into());
        }
    }
    loop {
        let claim = match shared.ring.acquire() {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => return shared.fail(e.into()),
        };
        let started = Instant::now();
        match windows.lock(claim.slot(), claim.seq()) {
            Ok(bytes) => {
                add(&shared.counters.read_ns, started.elapsed());
                shared
                    .counters
                    .read_bytes
                    .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
                shared.ring.fill_done(claim);
            }
            Err(e) => {
                shared.fail(e);
                shared.ring.fill_abandoned(claim);
                return;
            }
        }
    }
}

/// Copies each batch straight from the windows of the mapped file it lies in, to the one device
/// (`MultiLoader::replicated` refuses the register reader).
fn copy_windows(
    shared: &Arc<Shared>,
    windows: &MappedWindows,
    batches: &SyncSender<Result<Batch>>,
) {
    let Target {
        backend, budget, ..
    } = &shared.targets[0];
    let record_bytes = shared.source.layout().record_bytes() as u64;
    // Windows held by the copy thread, oldest first: (window seq, slot, fence of the last copy
    // that read it).
    let mut held: std::collections::VecDeque<(u64, usize, Option<CopyFence>)> = Default::default();
    let mut next_window = 0u64;
    let release = |slot: usize, fence: Option<CopyFence>| -> Result<()> {
        let fence = match fence {
            Some(fence) => fence,
            None => backend.completed_fence()?,
        };
        shared.ring.copy_issued(slot, fence);
        Ok(())
    };
    let outcome = (|| -> Result<bool> {
        for seq in 0..shared.plan.total() {
            let started = Instant::now();
            let spec = shared.plan.batch(seq)?;
            let len = spec.count * shared.out_record_bytes;
            let a = spec.first() * record_bytes;
            let pieces = windows.pieces(a, a + len as u64);
            // Window sequence numbers count from the loader's first epoch, as the ring's do.
            let epoch_base = (spec.epoch - shared.plan.first_epoch()) * windows.windows_per_epoch;
            let first_needed = epoch_base + pieces[0].0;
            let last_needed = epoch_base + pieces[pieces.len() - 1].0;
            while held.front().is_some_and(|h| h.0 < first_needed) {
                let (_, slot, fence) = held.pop_front().expect("checked");
                release(slot, fence)?;
            }
            while next_window <= last_needed {
                let Some(slot) = shared.ring.next_filled(next_window) else {
                    return Ok(false);
                };
                if next_window < first_needed {
                    // No batch reads it (a resumed epoch starts past it): give it straight back,
                    // or the held windows could fill the ring and stall the registrar.
                    release(slot, None)?;
                } else {
                    held.push_back((next_window, slot, None));
                }
                next_window += 1;
            }
            let mut memory = backend.alloc(len, budget)?;
            let mut fence = None;
            for &(_, src, offset, piece_len) in &pieces {
                // SAFETY: the window holding `src .. src + piece_len` is locked and stays so
                // until the fence of this copy (or a later one) completes; the destination range
                // is inside `memory`, which nobody reads before the fence.
                fence = Some(unsafe { backend.copy(src, &mut memory, offset, piece_len) }?);
            }
            let fence = fence.expect("a batch has at least one piece");
            for h in held
                .iter_mut()
                .filter(|h| h.0 >= first_needed && h.0 <= last_needed)
            {
                h.2 = Some(fence.clone());
            }
            add(&shared.counters.copy_issue_ns, started.elapsed());
            if !deliver(
                shared,
                batches,
                0,
                (seq, Arc::new(spec), len),
                memory,
                fence,
            ) {
                return Ok(false);
            }
        }
        Ok(true)
    })();
    // Release what is still held so that `drain` waits for it and the registrar can finish.
    for (_, slot, fence) in held.drain(..) {
        let _ = release(slot, fence);
    }
    if let Err(e) = outcome {
        shared.fail(e);
    }
}

/// Pinned slots, or registered windows of the file with the register reader (`auto` never picks
/// it: measured slower than `pread` into slots, see `ReaderKind::Auto`).
fn choose_staging(
    source: &Arc<dyn Source>,
    options: &LoaderOptions,
    backend: &Backend,
    batch_bytes: usize,
    slot_bytes: usize,
    slots: usize,
) -> Result<Staging> {
    if options.reader != ReaderKind::Register {
        return Ok(Staging::Slots(backend.pinned_pool(slot_bytes, slots)?));
    }
    if options.shuffle != Shuffle::None || options.world_size != 1 {
        return Err(LoaderError::Config(
            "the register reader streams a file in order on one rank; shuffling or sharding needs --reader pread".into(),
        ));
    }
    if options.transform.is_some() {
        return Err(LoaderError::Config(
            "the register reader copies files as they are; a transform needs --reader pread".into(),
        ));
    }
    let Some(region) = source.file() else {
        return Err(LoaderError::Config(format!(
            "{}: the register reader needs a file source",
            source.name()
        )));
    };
    let ctx = backend.context().cloned();
    match MappedWindows::new(source.as_ref(), region, batch_bytes, options.pinned_budget, ctx)? {
        Some(windows) => Ok(Staging::Windows(windows)),
        None => Err(LoaderError::Config(format!(
            "pinned budget of {} bytes cannot hold two windows of a batch ({batch_bytes} bytes) for the register reader",
            options.pinned_budget
        ))),
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
    fn plan_keeps_or_drops_the_last_partial_batch() {
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
    fn plan_resumes_mid_epoch() {
        let mut o = options(4, false, 2);
        o.start = Position {
            epoch: 0,
            batches_done: 2,
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
    fn plan_rejects_impossible_batching() {
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
        };
        assert!(Plan::new(10, &past_end, "x").is_err());
    }
}
