//! A delivered batch.

use std::sync::Arc;

use super::plan::BatchSpec;
use crate::backend::{CopyFence, DeviceSpec, Landed};
use crate::error::Result;
use crate::order::BatchRecords;
use crate::Position;

/// A batch on the device: its memory, its place in the dataset, and the copy that fills it.
///
/// The memory stays valid while the `Batch` lives; the copy may still be running when the
/// consumer receives it, so read it only after [`wait_ready`](Batch::wait_ready) or, on CUDA,
/// on a stream made to wait with [`stream_wait`](Batch::stream_wait).
pub struct Batch {
    pub(super) seq: u64,
    pub(super) spec: Arc<BatchSpec>,
    pub(super) len: usize,
    /// The documents its records pack, where the source counts them.
    pub(super) documents: Option<u64>,
    /// Which of the loader's devices it is on (0 for a loader of one device).
    pub(super) target: usize,
    pub(super) landed: Landed,
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
    /// Index of this batch within its epoch (within its split, after an elastic resume:
    /// [`Position::reshard`]).
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
    /// delivered up to and including this one (of its split, after an elastic resume).
    pub fn position_after(&self) -> Position {
        Position {
            epoch: self.spec.epoch,
            batches_done: self.spec.index + 1,
            consumed: self.spec.consumed,
        }
    }
    /// Documents packed into the batch's windows, as [`Source::documents_in`] counts them off
    /// the pinned slots on the reader threads; `None` for records that are not windows of
    /// documents. Known on the host while the copy may still run: a consumer sizes what it cuts
    /// at document bounds by it without waiting for the device.
    ///
    /// [`Source::documents_in`]: pinfeed_source::Source::documents_in
    pub fn documents(&self) -> Option<u64> {
        self.documents
    }
    /// Bytes in this batch.
    pub fn len_bytes(&self) -> usize {
        self.len
    }
    /// The device address of the batch (a host address on the host backend).
    pub fn address(&self) -> u64 {
        self.landed.memory.address()
    }
    /// Which of the loader's devices it is on: its place in
    /// [`Loader::devices`](crate::Loader::devices) (0 for a loader of one device).
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
