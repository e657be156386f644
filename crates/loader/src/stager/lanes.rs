//! The two ways an upload's chunks reach the device besides the arena's own: the split of
//! the source between the lanes, and the register lane.

use super::*;

/// How an upload's source is split between the lanes: the partial page at either end goes
/// through the arena; the whole pages between are cut into chunks that the arena lane takes
/// from the front and the register lane from the back, until they meet.
pub(super) struct LanePlan {
    /// End of the leading partial page (the first page-aligned offset of the source).
    pub(super) head: usize,
    /// Start of the trailing partial page.
    pub(super) tail: usize,
    pub(super) chunk: usize,
    /// Chunks between `head` and `tail`; 0 when there is no register lane.
    pub(super) chunks: usize,
    /// Whether the arena lane takes chunks too ([`UploadMethod::Both`]).
    pub(super) front_lane: bool,
    /// The next chunk the front lane takes, and one past the next the back lane takes.
    pub(super) claims: Mutex<(usize, usize)>,
}

impl LanePlan {
    pub(super) fn new(src: &[u8], stager: &Stager) -> LanePlan {
        let addr = src.as_ptr() as usize;
        let head = (addr.next_multiple_of(PAGE) - addr).min(src.len());
        let tail = ((addr + src.len()) / PAGE * PAGE)
            .saturating_sub(addr)
            .max(head);
        let chunk = stager.register_chunk.max(PAGE);
        let whole = (tail - head).div_ceil(chunk);
        // Both lanes: worth it from two whole chunks on; registration alone: from one chunk.
        let enough = match stager.method {
            UploadMethod::Both => tail - head >= 2 * chunk,
            UploadMethod::Register => whole >= 1,
            UploadMethod::Stage => false,
        };
        let chunks = if stager.register_budget > 0 && enough {
            whole
        } else {
            0
        };
        let (head, tail) = if chunks == 0 {
            // The arena takes everything, as one range.
            (src.len(), src.len())
        } else {
            (head, tail)
        };
        LanePlan {
            head,
            tail,
            chunk,
            chunks,
            front_lane: stager.method == UploadMethod::Both,
            claims: Mutex::new((0, chunks)),
        }
    }

    /// `[start, end)` of chunk `i`, as offsets into the source.
    pub(super) fn chunk(&self, i: usize) -> (usize, usize) {
        let start = self.head + i * self.chunk;
        (start, (start + self.chunk).min(self.tail))
    }

    pub(super) fn take_front(&self) -> Option<usize> {
        if !self.front_lane {
            return None;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        (claims.0 < claims.1).then(|| {
            claims.0 += 1;
            claims.0 - 1
        })
    }

    pub(super) fn take_back(&self) -> Option<usize> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        (claims.0 < claims.1).then(|| {
            claims.1 -= 1;
            claims.1
        })
    }

    /// Leaves the chunks nobody has taken yet: the upload failed.
    pub(super) fn abandon(&self) {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        claims.0 = claims.1;
    }
}

/// A page-locked chunk of the source, or `None` where no lock is needed: the host backend, or
/// memory the driver had page-locked already.
pub(super) fn lock_in_place(
    backend: &Backend,
    ptr: *const u8,
    len: usize,
) -> Result<Option<Registration>> {
    let Some(ctx) = backend.context() else {
        return Ok(None);
    };
    // SAFETY: the chunk is part of a source slice borrowed for the whole upload, so it stays
    // mapped; the register lane drops the registration only after the copy reading it is done.
    // Read-only: the source may be a read-only file mapping (a numpy memmap).
    match unsafe { Registration::new(ctx, ptr.cast_mut(), len, true) } {
        Ok(registration) => Ok(Some(registration)),
        Err(e) if e.is_already_registered() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The arena lane of one upload.
pub(super) struct StageLane<'a> {
    pub(super) stager: &'a Stager,
    pub(super) gang: &'a CopyGang,
    pub(super) src: &'a [u8],
    pub(super) dst: u64,
    /// The fence of the last copy this lane issued.
    pub(super) last: Option<CopyFence>,
}

impl StageLane<'_> {
    /// Copies `src[start..end]` through the arena to the same offsets of the destination.
    pub(super) fn range(&mut self, start: usize, end: usize) -> Result<()> {
        let shared = &self.stager.shared;
        let mut offset = start;
        for piece in self.src[start..end].chunks(self.stager.piece) {
            let len = piece.len();
            let at = self.stager.reserve(len.next_multiple_of(ALIGN))?;
            // SAFETY: `reserve` returned `at .. at + len` free: no copy reads it and no other
            // upload runs (the upload lock); only this lane reserves.
            let staging = unsafe { shared.pool.bytes_mut(at, len) };
            self.gang.copy(staging, piece);
            // SAFETY: the staging piece stays reserved (in the arena's list) until this fence
            // completes; the destination range lies inside the upload's allocation, disjoint
            // from every other piece and chunk, and nobody reads it before the upload's fence.
            let fence = unsafe {
                shared
                    .backend
                    .copy_to(staging.as_ptr(), self.dst + offset as u64, len)
            }?;
            shared
                .arena
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pieces
                .push_back((at, at + len.next_multiple_of(ALIGN), fence.clone()));
            shared
                .counters
                .staged
                .fetch_add(len as u64, Ordering::Relaxed);
            self.last = Some(fence);
            offset += len;
        }
        Ok(())
    }
}
