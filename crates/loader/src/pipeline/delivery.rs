//! What a filled slot becomes on the devices: one [`Delivery`], chosen by [`choose`] when the
//! loader starts, so that the copy thread hands every piece to it without asking what kind of
//! loader it serves.
//!
//! - [`CopyToOne`]: the piece's bytes copied into their place in the batch on one device.
//! - [`CopyToEvery`]: the same copy to each of several devices (`MultiLoader::replicated`),
//!   each on its own device's stream; the slot is free once every copy is.
//! - [`DecodeImages`]: a batch of compressed images decoded with nvJPEG on the copy stream
//!   (`decode="gpu"`, see [`GpuImageDecode`]).
//!
//! The register reader's windows are not slots: a batch may straddle two and a window serves
//! several batches, so the copy thread takes them in a loop of its own (`copy::copy_windows`),
//! chosen with the staging. What it issues is the plain copy to one device: GPU decoding and
//! replication refuse the register reader.

use std::ops::Range;
use std::sync::Arc;

use pinfeed_cuda::{DevicePool, EventPool, Stream};

use super::plan::SlotLayout;
use super::Shared;
use crate::backend::{Backend, CopyFence, DeviceMemory};
use crate::error::{LoaderError, Result};
use crate::pool::PinnedPool;
use crate::{GpuImageDecode, LoaderOptions};

/// What the copy thread makes of each filled piece on the devices.
pub(super) trait Delivery: Send + Sync {
    /// Issues the work that puts `piece` into its batch on every device: `on` holds, in target
    /// order, the batch's memory there and the fence of the last work issued into it, which
    /// this updates for each device it issues to.
    fn issue(&self, shared: &Shared, piece: FilledPiece<'_>, on: &mut [OnDevice]) -> Issued;

    /// Whether batches must be copied in sequence order rather than as their pieces are
    /// filled (see `copy_window`): a batch copied early holds its device memory until the
    /// batches before it are delivered.
    fn in_sequence_order(&self) -> bool {
        false
    }
}

/// A batch's memory on one device, and the fence of the last work issued into it: the batch
/// is complete there once that fence is (one stream a device; work finishes in issue order).
pub(super) struct OnDevice {
    pub(super) memory: DeviceMemory,
    pub(super) last: Option<CopyFence>,
}

/// What [`Delivery::issue`] issued.
#[must_use]
pub(super) struct Issued {
    /// The fence of everything issued that reads the slot: the slot may be reused once it
    /// completes. `None` when nothing was issued.
    pub(super) slot_free: Option<CopyFence>,
    /// The error that stopped the rest of the work, if one did.
    pub(super) failed: Option<LoaderError>,
}

impl Issued {
    pub(super) fn done(fence: CopyFence) -> Issued {
        Issued {
            slot_free: Some(fence),
            failed: None,
        }
    }

    pub(super) fn failed(slot_free: Option<CopyFence>, error: LoaderError) -> Issued {
        Issued {
            slot_free,
            failed: Some(error),
        }
    }
}

/// A filled piece as the copy thread hands it to the delivery: the slot's bytes are the copy
/// thread's until the fence [`Issued::slot_free`] completes, and the piece's records lie at
/// `offset` in the slot, `records.len()` of them, in their output form.
pub(super) struct FilledPiece<'a> {
    pool: &'a PinnedPool,
    slot: usize,
    offset: usize,
    /// The piece's records `lo .. hi` of its batch; never empty.
    records: Range<usize>,
}

impl<'a> FilledPiece<'a> {
    /// # Safety
    /// The ring handed `slot` of `pool` to the caller as filled (`next_filled_in`), and the
    /// caller gives it back (`copy_issued`) only with the fence the delivery returns, which
    /// keeps it out of the readers' hands until that fence completes. The reader left the
    /// piece's `records` (not empty) at `offset` in the slot, inside it.
    pub(super) unsafe fn new(
        pool: &'a PinnedPool,
        slot: usize,
        offset: usize,
        records: Range<usize>,
    ) -> FilledPiece<'a> {
        debug_assert!(!records.is_empty(), "an empty piece has nothing to deliver");
        FilledPiece {
            pool,
            slot,
            offset,
            records,
        }
    }

    /// The piece's first byte.
    fn src(&self) -> *const u8 {
        self.pool.slot_ptr(self.slot).wrapping_add(self.offset)
    }

    /// The slot from the piece's first byte to its end, to write into.
    fn slot_from_piece(&mut self) -> &mut [u8] {
        // SAFETY: the slot is the copy thread's alone while the piece lives and until the
        // fence of the work issued out of it completes (`new`'s contract); `&mut self` lends it
        // once at a time.
        let slot = unsafe { self.pool.slot_mut(self.slot, self.pool.slot_bytes()) };
        &mut slot[self.offset..]
    }
}

/// The delivery for `options` onto `backends` (the loader's devices, in order), with slots cut
/// as `layout` says; refuses GPU decoding unless there is one CUDA device.
pub(super) fn choose(
    source_name: &str,
    options: &LoaderOptions,
    layout: &SlotLayout,
    backends: &[Arc<Backend>],
) -> Result<Box<dyn Delivery>> {
    debug_assert_eq!(options.gpu_images.is_some(), layout.labels_at.is_some());
    let Some((decode, labels_at)) = options.gpu_images.clone().zip(layout.labels_at) else {
        return Ok(match backends {
            [_] => Box::new(CopyToOne),
            _ => Box::new(CopyToEvery),
        });
    };
    let parts = match backends {
        [one] => one.gpu_decode_parts(),
        _ => None,
    };
    let Some((stream, pool, events)) = parts else {
        return Err(LoaderError::Config(format!(
            "{source_name}: decode='gpu' needs one CUDA device (nvJPEG decodes there); the {} \
             backend has none: use decode='cpu'",
            backends[0].device()
        )));
    };
    Ok(Box::new(DecodeImages {
        decode,
        labels_at,
        stream: Arc::clone(stream),
        pool: Arc::clone(pool),
        events: Arc::clone(events),
    }))
}

/// The plain copy to the loader's one device.
struct CopyToOne;

impl Delivery for CopyToOne {
    fn issue(&self, shared: &Shared, piece: FilledPiece<'_>, on: &mut [OnDevice]) -> Issued {
        let (dst, src) = (&mut on[0], piece.src());
        let (offset, len) = place(&piece.records, shared.out_record_bytes);
        // SAFETY: the slot stays the copy thread's until this copy's fence completes
        // (`FilledPiece`), and the piece lies at `src .. src + len` in it; the destination,
        // records `lo .. hi` of the batch, lies inside its memory, disjoint from every other
        // piece's, and nothing reads the batch before its last fence.
        let copied = unsafe { shared.backend().copy(src, &mut dst.memory, offset, len) };
        match copied {
            Ok(fence) => {
                dst.last = Some(fence.clone());
                Issued::done(fence)
            }
            Err(e) => Issued::failed(None, e),
        }
    }
}

/// The plain copy to each of the loader's devices, on each one's own stream.
struct CopyToEvery;

impl Delivery for CopyToEvery {
    fn issue(&self, shared: &Shared, piece: FilledPiece<'_>, on: &mut [OnDevice]) -> Issued {
        let (offset, len) = place(&piece.records, shared.out_record_bytes);
        let src = piece.src();
        let mut fences = Vec::with_capacity(on.len());
        for (target, dst) in shared.targets.iter().zip(on) {
            // SAFETY: as for `CopyToOne`, on every device: the slot waits for the fence of all
            // the copies issued out of it.
            let copied = unsafe { target.backend.copy(src, &mut dst.memory, offset, len) };
            match copied {
                Ok(fence) => {
                    dst.last = Some(fence.clone());
                    fences.push(fence);
                }
                Err(e) => {
                    // Copies already issued read the slot: it waits for them.
                    let issued = (!fences.is_empty()).then(|| CopyFence::all(fences));
                    return Issued::failed(issued, e);
                }
            }
        }
        Issued::done(CopyFence::all(fences))
    }
}

/// Where records `lo .. hi` of a batch go in its memory, at `record_bytes` a record (the same in
/// the slot and on the device without GPU decoding): (offset, length) in bytes.
fn place(records: &Range<usize>, record_bytes: usize) -> (usize, usize) {
    (records.start * record_bytes, records.len() * record_bytes)
}

/// GPU decoding of a batch of compressed images on the one device's copy stream: a batch is one
/// piece, a slot with room for its labels after the records (`labels_at`).
struct DecodeImages {
    decode: Arc<GpuImageDecode>,
    /// Where in a slot the batch's labels are gathered, past its records.
    labels_at: usize,
    /// The copy stream, memory pool and events of the device: what nvJPEG runs on.
    stream: Arc<Stream>,
    pool: Arc<DevicePool>,
    events: Arc<EventPool>,
}

impl Delivery for DecodeImages {
    fn issue(&self, shared: &Shared, mut piece: FilledPiece<'_>, on: &mut [OnDevice]) -> Issued {
        let dst = &mut on[0];
        let count = piece.records.len();
        assert!(count * self.decode.output_record_bytes() <= dst.memory.len());
        let labels_at = self.labels_at - piece.offset;
        let out = dst.memory.write_address();
        // SAFETY: the slot is page-locked memory of this context, the copy thread's until the
        // fence recorded below, after the decode, completes (`FilledPiece`), and `labels_at`
        // (past the records) lies inside it; `out` holds the batch (asserted), which nothing
        // reads before that fence.
        let issued = unsafe {
            self.decode.issue(
                &self.stream,
                &self.pool,
                &self.events,
                piece.slot_from_piece(),
                count,
                labels_at,
                out,
            )
        };
        // One fence after all of it: the decoder, the CPU-decoded pixels' copies and the labels'.
        match issued.and_then(|()| shared.backend().completed_fence()) {
            Ok(fence) => {
                dst.last = Some(fence.clone());
                Issued::done(fence)
            }
            // Work may be queued that reads the slot: it waits for the whole stream.
            Err(e) => Issued::failed(shared.backend().completed_fence().ok(), e),
        }
    }

    /// A decoded batch is larger than its slot: copied early, batches would hold more device
    /// memory than the readers' window accounts for.
    fn in_sequence_order(&self) -> bool {
        true
    }
}
