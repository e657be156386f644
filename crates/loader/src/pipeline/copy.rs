//! The copy thread: takes filled slots in the order they were filled (within a window of
//! sequence numbers), hands each to the loader's [`Delivery`](super::delivery::Delivery) and
//! finished batches to the consumer in sequence order; or, with the register reader, copies
//! each batch straight from the windows of the mapped file it lies in.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Instant;

use super::delivery::{FilledPiece, Issued, OnDevice};
use super::plan::BatchSpec;
use super::{Batch, Shared, SlotContents, Staging, Target};
use crate::backend::{Backend, CopyFence, DeviceMemory, Landed};
use crate::error::{LoaderError, Result};
use crate::pool::PinnedPool;
use crate::register::MappedWindows;
use crate::stats::add;

pub(super) fn copy_loop(shared: &Arc<Shared>, batches: SyncSender<Result<Batch>>) {
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
    documents: Option<u64>,
    memory: DeviceMemory,
    ready: CopyFence,
) -> bool {
    let batch = Batch {
        seq,
        spec,
        len,
        documents,
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

/// A batch being assembled by the copy thread: its place, on each device its memory and the
/// fence of the last work issued into it, and how many of its pieces are still to be issued.
struct Assembling {
    spec: Arc<BatchSpec>,
    on: Vec<OnDevice>,
    pieces_left: u64,
    /// The documents of the pieces issued so far (`None` once one had no count).
    documents: Option<u64>,
}

/// Delivers filled slots in the order they were filled, within `Shared::copy_window` pieces of
/// the first batch not yet delivered, and hands batches over in sequence order as their last
/// piece's work is issued. A slot is then free again as soon as its own copy has finished,
/// instead of after every batch before it was read.
fn copy_slots(shared: &Arc<Shared>, pool: &PinnedPool, batches: &SyncSender<Result<Batch>>) {
    let pieces = shared.pieces;
    let units = shared.plan.total() * pieces.per_batch;
    let mut open: BTreeMap<u64, Assembling> = BTreeMap::new();
    // The first batch not yet delivered.
    let mut head = 0u64;
    // The first piece that will never be copied (its read, or its batch's device memory,
    // failed) and why: the batches before its batch are delivered first, then the error.
    let mut failed_at: Option<(u64, LoaderError)> = None;
    loop {
        while let Some(entry) = open.first_entry() {
            if *entry.key() != head || entry.get().pieces_left > 0 {
                break;
            }
            if !deliver_assembled(shared, batches, head, entry.remove()) {
                return;
            }
            head += 1;
        }
        let end = failed_at.as_ref().map_or(units, |(unit, _)| *unit);
        if head >= end / pieces.per_batch {
            break;
        }
        let first = head * pieces.per_batch;
        let window = first + shared.copy_window.max(pieces.per_batch);
        let Some((slot, unit)) = shared.ring.next_filled_in(first..window.min(end)) else {
            break;
        };
        let started = Instant::now();
        let contents = shared.slot_contents[slot]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("a filled slot has its contents recorded");
        let (seq, _) = pieces.split(unit);
        let opened = contents.and_then(|contents| {
            if let Entry::Vacant(v) = open.entry(seq) {
                v.insert(Assembling::new(shared, Arc::clone(&contents.spec))?);
            }
            Ok(contents)
        });
        let SlotContents {
            records,
            offset,
            documents,
            ..
        } = match opened {
            Ok(contents) => contents,
            // Nothing reads the slot, and no later piece is taken from the ring from now on.
            Err(e) => {
                if failed_at.as_ref().is_none_or(|(at, _)| unit < *at) {
                    failed_at = Some((unit, e));
                }
                continue;
            }
        };
        let batch = open.get_mut(&seq).expect("opened above");
        let issued = if records.is_empty() {
            // Nothing to copy: the slot is free as soon as the copies before it are done.
            match shared.backend().completed_fence() {
                Ok(fence) => Issued::done(fence),
                Err(e) => Issued::failed(None, e),
            }
        } else {
            // SAFETY: `next_filled_in` gave this thread the filled slot, which goes back to the
            // ring below with the fence the delivery returns; the reader left the piece's
            // records at `offset`, inside the slot.
            let piece = unsafe { FilledPiece::new(pool, slot, offset, records) };
            shared.delivery.issue(shared, piece, &mut batch.on)
        };
        // Copies already issued read the slot even when a later one failed: the ring must wait
        // for them before the pool can go.
        if let Some(fence) = issued.slot_free {
            shared.ring.copy_issued(slot, fence);
        }
        if let Some(e) = issued.failed {
            shared.fail(e);
            return;
        }
        batch.pieces_left -= 1;
        batch.documents = batch.documents.zip(documents).map(|(a, b)| a + b);
        add(&shared.counters.copy_issue_ns, started.elapsed());
    }
    if let Some((_, e)) = failed_at {
        shared.fail(e);
    }
}

impl Drop for Assembling {
    /// A batch dropped before delivery (a later piece's read or copy failed, or the consumer
    /// went away) may still be written by copies issued into it.
    fn drop(&mut self) {
        for on in &self.on {
            if let Some(fence) = &on.last {
                fence.wait_before_reuse();
            }
        }
    }
}

impl Assembling {
    /// A batch's first piece has come: its device memory, whole, on every device.
    fn new(shared: &Shared, spec: Arc<BatchSpec>) -> Result<Assembling> {
        let bytes = spec.count * shared.out_record_bytes;
        let on = shared
            .targets
            .iter()
            .map(|t| {
                Ok(OnDevice {
                    memory: t.backend.alloc(bytes, &t.budget)?,
                    last: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Assembling {
            spec,
            on,
            pieces_left: shared.pieces.per_batch,
            documents: Some(0),
        })
    }
}

/// Hands batch `seq`, whose every copy has been issued, to the consumer on each device in turn;
/// false when the consumer went away or a fence could not be made (the error recorded).
fn deliver_assembled(
    shared: &Shared,
    batches: &SyncSender<Result<Batch>>,
    seq: u64,
    mut batch: Assembling,
) -> bool {
    let len = batch.spec.count * shared.out_record_bytes;
    // Taken out one device at a time: what is left if one fails waits for its copies in drop.
    for target in 0..batch.on.len() {
        let OnDevice { memory, last } = batch.on.remove(0);
        // Copies to one device finish in the order they were issued (one stream; one host copy
        // thread), so the batch is complete there when the last copy issued into it is,
        // whichever of its pieces that was.
        let ready = match last {
            Some(fence) => fence,
            None => match shared.targets[target].backend.completed_fence() {
                Ok(fence) => fence,
                Err(e) => {
                    shared.fail(e);
                    return false;
                }
            },
        };
        let place = (seq, Arc::clone(&batch.spec), len);
        if !deliver(
            shared,
            batches,
            target,
            place,
            batch.documents,
            memory,
            ready,
        ) {
            return false;
        }
    }
    true
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
    let mut held = HeldWindows {
        shared,
        backend,
        held: VecDeque::new(),
        next: 0,
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
            let needed = epoch_base + pieces[0].0..=epoch_base + pieces[pieces.len() - 1].0;
            if !held.hold(&needed)? {
                return Ok(false);
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
            held.read_by(&needed, &fence);
            add(&shared.counters.copy_issue_ns, started.elapsed());
            windows.check_copied(&fence, a + len as u64)?;
            if !deliver(
                shared,
                batches,
                0,
                (seq, Arc::new(spec), len),
                None, // the registered file's records are not windows of documents
                memory,
                fence,
            ) {
                return Ok(false);
            }
        }
        Ok(true)
    })();
    // Release what is still held so that `drain` waits for it and the registrar can finish.
    held.release_all();
    if let Err(e) = outcome {
        shared.fail(e);
    }
}

/// The windows of the mapped file the copy thread holds, oldest first, and the next one to
/// take from the ring.
struct HeldWindows<'a> {
    shared: &'a Shared,
    backend: &'a Backend,
    /// (window seq, slot, fence of the last copy that read it).
    held: VecDeque<(u64, usize, Option<CopyFence>)>,
    next: u64,
}

impl HeldWindows<'_> {
    /// Gives a window's slot back to the ring once `fence` (or, with none, everything issued so
    /// far) completes.
    fn release(&self, slot: usize, fence: Option<CopyFence>) -> Result<()> {
        let fence = match fence {
            Some(fence) => fence,
            None => self.backend.completed_fence()?,
        };
        self.shared.ring.copy_issued(slot, fence);
        Ok(())
    }

    /// Gives back the windows before `needed` and takes from the ring every window up to its
    /// end; false when the ring shut down.
    fn hold(&mut self, needed: &std::ops::RangeInclusive<u64>) -> Result<bool> {
        while self.held.front().is_some_and(|h| h.0 < *needed.start()) {
            let (_, slot, fence) = self.held.pop_front().expect("checked");
            self.release(slot, fence)?;
        }
        while self.next <= *needed.end() {
            let Some(slot) = self.shared.ring.next_filled(self.next) else {
                return Ok(false);
            };
            if self.next < *needed.start() {
                // No batch reads it (a resumed epoch starts past it): give it straight back,
                // or the held windows could fill the ring and stall the registrar.
                self.release(slot, None)?;
            } else {
                self.held.push_back((self.next, slot, None));
            }
            self.next += 1;
        }
        Ok(true)
    }

    /// Records that the copy ending in `fence` read the windows `needed`.
    fn read_by(&mut self, needed: &std::ops::RangeInclusive<u64>, fence: &CopyFence) {
        for h in self.held.iter_mut().filter(|h| needed.contains(&h.0)) {
            h.2 = Some(fence.clone());
        }
    }

    /// Gives every window still held back to the ring.
    fn release_all(&mut self) {
        for (_, slot, fence) in std::mem::take(&mut self.held) {
            let _ = self.release(slot, fence);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use pinfeed_source::dtype::parse_user_dtype;
    use pinfeed_source::{Layout, RawFile};

    use crate::backend::{Backend, CopyGate};
    use crate::{DeviceSpec, Loader, LoaderOptions};

    /// Batch 0 is read in pieces of 10 records of a file cut to 25 records after it was
    /// opened, so its third piece fails. The copies of the first two are held back by a closed
    /// gate: the copy thread, dropping the batch, must wait for them before its memory goes
    /// back to the cache (where it could be freed while the host copy thread still writes into
    /// it), so the error reaches the consumer only once the gate has opened.
    #[test]
    fn a_batch_dropped_after_a_failed_piece_waits_for_its_copies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.bin");
        std::fs::write(&path, vec![7u8; 1000 * 16]).unwrap();
        let (dtype, _) = parse_user_dtype("u8").unwrap();
        let source = RawFile::open(&path, Layout::new(dtype, vec![16]).unwrap()).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(25 * 16).unwrap();
        let options = LoaderOptions {
            batch_size: 100,
            piece_bytes: Some(10 * 16),
            num_threads: Some(1),
            pinned_budget: 8 * 4096,
            device: DeviceSpec::Cpu,
            ..LoaderOptions::default()
        };
        let gate = CopyGate::closed();
        let held = Arc::clone(&gate);
        let mut loader = Loader::start(Arc::new(source), options, move || {
            Ok(vec![Arc::new(Backend::host_gated(held)?)])
        })
        .unwrap();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let opened = std::time::Instant::now();
            gate.open();
            opened
        });
        let first = loader.next().expect("an item");
        let received = std::time::Instant::now();
        let opened = opener.join().unwrap();
        let err = first.expect_err("batch 0 failed").to_string();
        assert!(err.contains("records.bin"), "{err}");
        assert!(
            received >= opened,
            "the error came before the batch's copies finished"
        );
    }
}
