//! The reader threads: each claims a free slot, reads a piece of a batch into it, and hands
//! it to the copy thread; or, with the register reader, the one thread locking windows of the
//! mapped file.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use pinfeed_ring::Claim;
use pinfeed_source::{AlignedBuffer, Source};

use super::plan::BatchSpec;
use super::{Shared, SlotContents, Staging};
use crate::error::{panic_message, LoaderError, Result};
use crate::order::BatchRecords;
use crate::stats::add;

/// The loop of reader `index` (the ring hands it back the slots it filled itself first).
pub(super) fn read_loop(shared: &Shared, index: usize) {
    let mut scratch: Option<AlignedBuffer> = None;
    // The batch this reader read a piece of last: its next piece is usually of the same one.
    let mut last: Option<(u64, Arc<BatchSpec>)> = None;
    loop {
        let claim = match shared.ring.acquire(index) {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => return shared.fail(e.into()),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            fill(shared, index, &claim, &mut scratch, &mut last)
        }));
        let failed = match outcome {
            Ok(Ok(contents)) => Ok(contents),
            Ok(Err(e)) => Err(e),
            Err(panic) => Err(LoaderError::Worker {
                thread: "reader",
                message: panic_message(panic.as_ref()),
            }),
        };
        let stop = failed.is_err();
        // A failed read is handed on like a filled slot: the copy thread reports it when the
        // batch's turn comes, so the consumer gets every batch before it and then this error,
        // whichever reader failed first. This reader stops; the copy thread stops the rest.
        *shared.slot_contents[claim.slot()]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(failed);
        shared.ring.fill_done(claim);
        if stop {
            return;
        }
    }
}

/// Reads one piece of a batch (the whole batch, when it is one piece) into its claimed slot,
/// through the transform if there is one, and says what the slot now holds.
fn fill(
    shared: &Shared,
    index: usize,
    claim: &Claim,
    scratch: &mut Option<AlignedBuffer>,
    last: &mut Option<(u64, Arc<BatchSpec>)>,
) -> Result<SlotContents> {
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
    // SAFETY: the claim gives this thread the slot alone until `fill_done`.
    let slot = unsafe { pool.slot_mut(claim.slot(), pool.slot_bytes()) };
    let started = Instant::now();
    let (offset, documents) = match &shared.transform {
        None if count == 0 => (0, source.documents_in(&[])),
        None => {
            let at = read_batch(source, &spec.records, records.clone(), slot)?;
            (at, source.documents_in(&slot[at..at + raw_len]))
        }
        Some(transform) => {
            let span = source.aligned_span(shared.plan.largest_batch).max(raw_len);
            let buf = match scratch {
                Some(buf) if buf.len() >= span => buf,
                _ => scratch.insert(AlignedBuffer::new(span, source.alignment())),
            };
            // With a transform a batch is one piece: `records` is the whole batch.
            let at = read_batch(source, &spec.records, records.clone(), buf)?;
            let read_done = Instant::now();
            add(&shared.counters.read_ns, read_done - started);
            let out_len = count * shared.out_record_bytes;
            // User code: stopping the loader waits for it only so long (see `Loader::stop`).
            let user_code = shared.workers.user_code(index);
            let applied = transform.apply(&buf[at..at + raw_len], count, &mut slot[..out_len]);
            drop(user_code);
            applied.map_err(|message| LoaderError::Transform {
                seq: batch,
                message,
            })?;
            add(&shared.counters.transform_ns, read_done.elapsed());
            (0, source.documents_in(&buf[at..at + raw_len]))
        }
    };
    if shared.transform.is_none() {
        add(&shared.counters.read_ns, started.elapsed());
    }
    shared
        .counters
        .read_bytes
        .fetch_add(raw_len as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(SlotContents {
        spec,
        records,
        offset,
        documents,
    })
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

/// Locks windows of the mapped file in order, as the ring frees slots.
pub(super) fn register_loop(shared: &Shared, index: usize) {
    let Staging::Windows(windows) = &shared.staging else {
        unreachable!("the registrar runs only with mapped windows");
    };
    if let Some(ctx) = shared.backend().context() {
        if let Err(e) = ctx.bind() {
            return shared.fail(e.into());
        }
    }
    loop {
        let claim = match shared.ring.acquire(index) {
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
