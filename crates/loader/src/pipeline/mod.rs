//! The threads of a loader and what they share.
//!
//! ```text
//!   reader threads ──fill──▶ ring slots (pinned) ──copy stream──▶ device memory ──▶ consumer
//!        ▲  acquire()            Filling → Filled → Copying(event) → Free when the event completes
//!        └──────────────────────────────────────────────────────────┘
//! ```
//!
//! Readers own a slot from `acquire` to `fill_done`. The copy thread takes filled slots in the
//! order they were filled, within a window of sequence numbers (`copy_window`), allocates each
//! batch's device memory when its first piece comes, hands each piece to the loader's
//! `Delivery` (a copy to one device or to several, or GPU decoding: chosen when the loader
//! starts, in `delivery`) and hands batches to the consumer in sequence order through a
//! bounded channel (`prefetch` deep). The consumer owns each [`Batch`] and its device memory
//! until it drops it.
//!
//! A loader may copy to several devices (targets): each slot is then copied to every one, each
//! copy on its own device's stream, and the slot's fence is [`CopyFence::All`] of those copies.
//! The batches of one step go through the channel one after the other, in target order.

mod batch;
mod copy;
mod delivery;
mod plan;
mod reader;
mod workers;

pub use batch::Batch;
use delivery::Delivery;
use plan::{BatchSpec, Pieces, Plan, SlotLayout};
use workers::{Workers, USER_CODE_WAIT};

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pinfeed_ring::Ring;
use pinfeed_source::Source;

use crate::backend::{Backend, CopyFence, DeviceBudget, DeviceSpec};
use crate::error::{LoaderError, Result};
use crate::order::{OrderSpec, Shuffle};
use crate::pool::{pinned_allocations, PinnedPool};
use crate::register::{MappedWindows, Reader};
use crate::stats::{add, get, Counters, Delivered, DeviceStats, Stats};
use crate::{LoaderOptions, Transform};

/// A filled slot: which piece of which batch, and the offset of its first byte in the slot.
struct SlotContents {
    /// The batch's place in the plan (the copy thread opens the batch with whichever of its
    /// pieces comes first).
    spec: Arc<BatchSpec>,
    /// The piece's records, `lo .. hi` of the batch (empty for a piece past a short batch's
    /// end).
    records: std::ops::Range<usize>,
    offset: usize,
    /// The documents the piece's records pack ([`Source::documents_in`]), `None` for records
    /// that are not windows of documents.
    ///
    /// [`Source::documents_in`]: pinfeed_source::Source::documents_in
    documents: Option<u64>,
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
    /// What each filled slot becomes on the devices, chosen when the loader starts. (The
    /// register reader's windows are not slots: their own loop copies them plainly.)
    delivery: Box<dyn Delivery>,
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
    /// the slot (aligned reads may put them past the start), or why its read failed. Set by the
    /// slot's reader before `fill_done` and taken by the copy thread after `next_filled_in`,
    /// which the ring orders; so the plan is worked out once per batch, and a failed read
    /// reaches the consumer in batch order, after every batch before it.
    slot_contents: Vec<Mutex<Option<Result<SlotContents>>>>,
    /// How batches are cut into slots (one piece a batch with a transform or register reader).
    pieces: Pieces,
    /// How many pieces past the first of the oldest batch not yet delivered the copy thread may
    /// copy, in the order they were filled (see [`copy_window`]).
    copy_window: u64,
    started: Instant,
    /// Time `Loader::new` took before the threads started (mostly page-locking the pool).
    startup: Duration,
    threads: usize,
    /// How the reader count was chosen (`tune`).
    thread_choice: crate::tune::ThreadChoice,
    /// The process's page-locked allocations when the loader finished starting.
    pinned_allocations_at_start: AtomicU64,
    /// The source's network counters when the loader started: `Stats::network` counts from
    /// here, so a pass reports what it fetched.
    network_at_start: Option<pinfeed_source::NetworkStats>,
    /// The state of each thread (readers `0 .. threads`, then the copy thread), for `stop`.
    workers: Workers,
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

/// How many pieces ahead of the oldest batch not yet delivered the copy thread may copy (at
/// least the pieces of that batch): the pieces the readers work on at once (one each; they
/// claim in sequence order), so that one read finishing late holds back none of the others.
/// Copied early, a batch holds its device memory until the batches before it are delivered; a
/// window of the readers keeps those batches, with the prefetched ones, within the device's
/// cache of idle buffers. With a device budget (it fails rather than waits), or a delivery that
/// asks for it ([`Delivery::in_sequence_order`]), it is one batch: batches are copied in
/// sequence order, each holding device memory only once its turn has come.
fn copy_window(options: &LoaderOptions, delivery: &dyn Delivery, readers: usize) -> u64 {
    if options.device_budget.is_some() || delivery.in_sequence_order() {
        1
    } else {
        readers as u64
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
    fn reader(&self) -> Reader {
        match self {
            Staging::Slots(_) => Reader::Pread,
            Staging::Windows(_) => Reader::Register,
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
        let plan = Plan::new(source.num_records(), &options, source.name())?;
        let layout = SlotLayout::new(source.as_ref(), &options, &plan)?;
        let backends = make_backends()?;
        if backends.is_empty() {
            return Err(LoaderError::Config("no device given".into()));
        }
        for backend in &backends {
            layout.check_fits(backend, source.name())?;
        }
        let delivery = delivery::choose(source.name(), &options, &layout, &backends)?;
        let choice = match options.num_threads {
            Some(n) => crate::tune::ThreadChoice {
                threads: n,
                rates: None,
                reason: format!("{n}: as asked"),
            },
            None if source.network().is_some() => crate::tune::for_network(
                crate::tune::choose(backends[0].context(), options.pinned_budget),
                crate::tune::cores(),
            ),
            None => crate::tune::choose(backends[0].context(), options.pinned_budget),
        };
        let layout = layout.with_threads(choice.threads);
        debug_assert!(
            backends.len() == 1 || options.reader != Reader::Register,
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
            layout.batch_bytes,
            layout.slot_bytes,
            layout.slots,
        )?;
        let (ring_slots, ring_total) = match &staging {
            Staging::Slots(pool) => (pool.slots(), layout.units),
            Staging::Windows(windows) => {
                (windows.slots(), windows.windows_per_epoch * options.epochs)
            }
        };
        let registrar = matches!(staging, Staging::Windows(_));
        let (threads, choice) = if registrar {
            let reason = "1: the register reader's one registrar thread".to_string();
            (
                1,
                crate::tune::ThreadChoice {
                    threads: 1,
                    reason,
                    ..choice
                },
            )
        } else {
            (layout.threads, choice)
        };
        let network_at_start = source.network();
        let copy_window = copy_window(&options, delivery.as_ref(), threads.min(ring_slots));
        let shared = Arc::new(Shared {
            ring: Ring::new(ring_slots, ring_total),
            staging,
            delivery,
            targets: backends
                .into_iter()
                .map(|backend| Target::new(backend, options.device_budget))
                .collect(),
            source,
            transform: options.transform.clone(),
            plan,
            out_record_bytes: layout.out_record_bytes,
            error: Mutex::new(None),
            counters: Counters::default(),
            slot_contents: (0..ring_slots).map(|_| Mutex::new(None)).collect(),
            copy_window,
            pieces: layout.pieces,
            started: Instant::now(),
            startup: begun.elapsed(),
            threads,
            thread_choice: choice,
            pinned_allocations_at_start: AtomicU64::new(pinned_allocations()),
            network_at_start,
            workers: Workers::new(threads + 1),
        });
        Loader::spawn(shared, depth)
    }

    /// Starts the reader (or registrar) threads and the copy thread of `shared`, handing batches
    /// over through a channel `depth` deep.
    fn spawn(shared: Arc<Shared>, depth: usize) -> Result<Loader> {
        let (tx, rx) = mpsc::sync_channel(depth);
        let mut loader = Loader {
            shared: Arc::clone(&shared),
            batches: Some(rx),
            threads: Vec::with_capacity(shared.threads + 1),
            finished: false,
        };
        for i in 0..shared.threads {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("pinfeed-read-{i}"))
                .spawn(move || {
                    let _returned = shared.workers.on_return(i);
                    match shared.staging {
                        Staging::Slots(_) => reader::read_loop(&shared, i),
                        Staging::Windows(_) => reader::register_loop(&shared, i),
                    }
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
            .spawn(move || {
                let _returned = shared.workers.on_return(shared.threads);
                copy::copy_loop(&shared, tx)
            })
            .map_err(|source| LoaderError::Thread {
                what: "copy",
                source,
            })?;
        loader.threads.push(copier);
        Ok(loader)
    }

    /// Counts page-locked allocations from now on, not from this loader's start: for loaders
    /// started together (one per device), whose pools are all made before any of them runs.
    pub(crate) fn count_allocations_from_now(&self) {
        self.shared
            .pinned_allocations_at_start
            .store(pinned_allocations(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The order this loader's batches follow ([`OrderSpec::fingerprint`] to check a saved
    /// position against).
    pub fn order_spec(&self) -> &OrderSpec {
        &self.shared.plan.spec
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
            threads_reason: s.thread_choice.reason.clone(),
            machine: s.thread_choice.rates,
            read_time: nanos(&c.read_ns),
            read_bytes: get(&c.read_bytes),
            transform_time: nanos(&c.transform_ns),
            wait_free_slot: ring.wait_free,
            wait_free_slot_no_copy: ring.wait_free_no_copy,
            wait_filled: ring.wait_filled,
            wait_filled_behind: ring.wait_filled_behind,
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
            pinned_allocations_after_start: pinned_allocations().saturating_sub(
                s.pinned_allocations_at_start
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
            slots_recycled: ring.recycled,
            slot_waits: ring.claims_waited,
            slot_claims: ring.claims,
            slot_claims_own: ring.claims_own,
            slots_peak_in_use: ring.peak_in_use,
            network: s
                .source
                .network()
                .map(|now| now.since(&s.network_at_start.clone().unwrap_or_default())),
        }
    }

    /// Device bytes held now by batches not yet dropped (on all devices together).
    pub fn device_bytes_held(&self) -> usize {
        self.shared.targets.iter().map(|t| t.budget.held()).sum()
    }

    /// Stops the threads and waits for them. Batches already delivered stay valid.
    ///
    /// Two threads are not waited for: the calling thread, when it is one of the loader's own
    /// (a transform that drops the loader it runs in: joining itself would fail), and a thread
    /// still inside a transform after [`USER_CODE_WAIT`] (user code, which may never return).
    /// Both are left to return on their own; each holds `Arc<Shared>`, so the slot it writes
    /// into and the rest of the pool stay allocated until it has.
    fn stop(&mut self) {
        self.shared.ring.shutdown();
        // Dropping the receiver unblocks a copy thread waiting to hand over a batch.
        drop(self.batches.take());
        if self.threads.is_empty() {
            return;
        }
        let me = std::thread::current().id();
        let own = self.threads.iter().position(|h| h.thread().id() == me);
        // Threads are pushed in the order of their indices (readers, then the copy thread), and
        // the spawning stops at the first that fails.
        let started = self.threads.len();
        let returned = self.shared.workers.wait(started, own, USER_CODE_WAIT);
        for (handle, returned) in self.threads.drain(..).zip(returned) {
            if returned {
                let _ = handle.join();
            }
            // Otherwise the handle is dropped: the thread runs on, detached (see above).
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

/// Pinned slots, or registered windows of the file with the register reader (`auto` never picks
/// it: measured slower than `pread` into slots, see `Reader::Auto`).
fn choose_staging(
    source: &Arc<dyn Source>,
    options: &LoaderOptions,
    backend: &Backend,
    batch_bytes: usize,
    slot_bytes: usize,
    slots: usize,
) -> Result<Staging> {
    if options.reader != Reader::Register {
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
