//! The pinned pool: one page-locked allocation made at start-up and carved into slots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pinfeed_cuda::{Context, PinMethod, PinnedMemory};

use crate::error::{LoaderError, Result};

/// Page-locked allocations made by this process (pools, and per-batch allocations in the
/// benchmark's deliberately naive variant). A loader that has started makes none: tests and
/// `pinfeed stream --json` check that this does not move after start-up.
static PINNED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Page-locked allocations this process has made so far.
pub fn pinned_allocations() -> u64 {
    PINNED_ALLOCATIONS.load(Ordering::Relaxed)
}

pub(crate) fn count_pinned_allocation() {
    PINNED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

/// Host memory that the host backend uses as its "pinned" pool: an anonymous mapping,
/// page-locked with `mlock` when the memory-lock limit allows it.
pub(crate) struct HostMapping {
    /// Unmapped (and so unlocked) on drop; the pool is dropped only after the ring drained, so
    /// no copy reads it any more.
    _map: memmap2::MmapMut,
    /// The mapping's first byte, taken once through `&mut` so that slots may be written
    /// through it; valid while `map` lives (moving `map` does not move the mapping).
    ptr: *mut u8,
    locked: bool,
}

// SAFETY: the mapping is plain memory owned by this value; access to its bytes is coordinated by
// the ring (one claimant per slot), not by this type.
unsafe impl Send for HostMapping {}
// SAFETY: as above; `&HostMapping` only exposes the pointer and length.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    /// Maps `len` bytes (populated, so no page fault lands on the hot path) and tries to lock
    /// them; `lock` false skips the attempt.
    pub(crate) fn new(len: usize, lock: bool) -> Result<HostMapping> {
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .populate()
            .map_anon()
            .map_err(|source| LoaderError::HostMemory { bytes: len, source })?;
        let locked = lock && map.lock().is_ok();
        if locked {
            count_pinned_allocation();
        }
        let ptr = map.as_mut_ptr();
        Ok(HostMapping {
            _map: map,
            ptr,
            locked,
        })
    }
}

enum Memory {
    Host(HostMapping),
    Cuda(PinnedMemory),
}

/// What a pool is: the loader that needs one can reuse an idle pool that [`serves`] it.
///
/// [`serves`]: PoolKey::serves
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PoolKey {
    /// The process that made the pool: a forked child must not reuse its parent's (the CUDA
    /// state does not survive fork, and locks on pages are not inherited).
    pid: u32,
    /// CUDA device ordinal, or `None` for the host backend.
    device: Option<usize>,
    bytes: usize,
    method: Option<PinMethod>,
}

impl PoolKey {
    /// Whether a pool of this key can hold the slots of a loader that wants `want`: the same
    /// process, device and method, and at least as many bytes (the loader uses the first
    /// `want.bytes`).
    fn serves(&self, want: &PoolKey) -> bool {
        (self.pid, self.device, self.method) == (want.pid, want.device, want.method)
            && self.bytes >= want.bytes
    }
}

/// The pool of the last loader that finished (or an earlier one's, when that one serves the
/// last's loaders too), kept for the next loader it can serve (one of the same size or
/// smaller): a Python loader starts a loader per epoch, and page-locking a pool again each
/// epoch would cost as much as a good part of the epoch. A smaller loader takes the
/// larger pool, so a training and an evaluation loader used in turn share one pool rather than
/// each freeing the other's. At most one pool is kept, and it is freed as soon as a loader
/// needs a larger one, so the pinned memory held never exceeds what the live loaders asked for
/// plus one finished loader's budget. [`release_idle_pinned_memory`] frees it.
static IDLE_POOL: Mutex<Option<(PoolKey, Memory)>> = Mutex::new(None);

/// Frees the pinned pool kept from the last finished loader, if any.
pub fn release_idle_pinned_memory() {
    let idle = IDLE_POOL.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(idle);
}

/// The idle pool and its key if it serves `want`; an idle pool that does not is freed (after
/// the lock is let go: freeing pinned memory takes the driver milliseconds).
fn take_idle(want: PoolKey) -> Option<(PoolKey, Memory)> {
    let idle = IDLE_POOL.lock().unwrap_or_else(|p| p.into_inner()).take();
    idle.filter(|(key, _)| key.serves(&want))
}

/// A fixed number of equal slots in one page-locked allocation.
pub(crate) struct PinnedPool {
    /// `Some` until `Drop` hands it to the idle cache.
    memory: Option<Memory>,
    /// The memory's own key: its bytes may be more than the slots use (a reused larger pool).
    key: PoolKey,
    slot_bytes: usize,
    slots: usize,
}

// SAFETY: the pool is plain memory owned by this value (CUDA pinned memory is Send + Sync; the
// host mapping is declared so above); access to slots is coordinated by the ring.
unsafe impl Send for Memory {}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        // The loader drained its ring before dropping the pool: no copy reads it any more.
        if let Some(memory) = self.memory.take() {
            let mut idle = IDLE_POOL.lock().unwrap_or_else(|p| p.into_inner());
            let (keep, freed) = match idle.take() {
                // A kept pool that serves this one's loaders serves more: it stays.
                Some(kept) if kept.0.serves(&self.key) => (kept, Some((self.key, memory))),
                previous => ((self.key, memory), previous),
            };
            *idle = Some(keep);
            drop(idle);
            drop(freed);
        }
    }
}

impl PinnedPool {
    pub(crate) fn host(slot_bytes: usize, slots: usize) -> Result<PinnedPool> {
        PinnedPool::take_or_make(None, None, slot_bytes, slots, |bytes| {
            Ok(Memory::Host(HostMapping::new(bytes, true)?))
        })
    }

    pub(crate) fn cuda(
        ctx: &Arc<Context>,
        slot_bytes: usize,
        slots: usize,
        method: PinMethod,
    ) -> Result<PinnedPool> {
        let device = Some(ctx.ordinal());
        PinnedPool::take_or_make(device, Some(method), slot_bytes, slots, |bytes| {
            let memory = PinnedMemory::alloc(ctx, bytes, method)?;
            count_pinned_allocation();
            Ok(Memory::Cuda(memory))
        })
    }

    /// `slots` slots of `slot_bytes` in the idle pool when it serves them (same process,
    /// `device` and `method`), else in memory `make` allocates (given the bytes).
    fn take_or_make(
        device: Option<usize>,
        method: Option<PinMethod>,
        slot_bytes: usize,
        slots: usize,
        make: impl FnOnce(usize) -> Result<Memory>,
    ) -> Result<PinnedPool> {
        let want = PoolKey {
            pid: std::process::id(),
            device,
            bytes: slot_bytes * slots,
            method,
        };
        let (key, memory) = match take_idle(want) {
            Some(idle) => idle,
            None => (want, make(want.bytes)?),
        };
        Ok(PinnedPool {
            memory: Some(memory),
            key,
            slot_bytes,
            slots,
        })
    }

    fn memory(&self) -> &Memory {
        self.memory
            .as_ref()
            .expect("the memory leaves the pool only in Drop")
    }

    fn base(&self) -> *mut u8 {
        match self.memory() {
            Memory::Host(m) => m.ptr,
            Memory::Cuda(m) => m.as_ptr(),
        }
    }

    /// Bytes of the slots, page-locked (or, on the host backend where the lock limit refused,
    /// reserved). The memory taken may be larger: an idle pool of a larger loader, reused.
    pub(crate) fn bytes(&self) -> usize {
        self.slot_bytes * self.slots
    }

    /// Which NUMA node the pool's pages were put on, in words (see [`crate::Stats::pinned_numa`]).
    pub(crate) fn numa_placement(&self) -> String {
        match self.memory() {
            Memory::Host(_) => "not placed: no GPU (host backend)".to_string(),
            Memory::Cuda(m) => m.numa_placement().to_string(),
        }
    }

    /// Whether the memory is really page-locked.
    pub(crate) fn locked(&self) -> bool {
        match self.memory() {
            Memory::Host(m) => m.locked,
            Memory::Cuda(_) => true,
        }
    }

    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// The start of slot `slot`.
    pub(crate) fn slot_ptr(&self, slot: usize) -> *mut u8 {
        assert!(slot < self.slots, "slot {slot} out of {}", self.slots);
        // SAFETY: `slot < slots`, so the offset stays inside the allocation of `slots * slot_bytes`.
        unsafe { self.base().add(slot * self.slot_bytes) }
    }

    /// `len` bytes at `offset` from the start of the pool, for writing.
    ///
    /// # Safety
    /// The caller has reserved the range (no one else reads or writes it, no copy out of it is
    /// in flight), and `offset + len <= bytes()`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(
            offset + len <= self.bytes(),
            "range past the end of the pool"
        );
        // SAFETY: in bounds by the assertion; exclusive by the caller's reservation.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(offset), len) }
    }

    /// The first `len` bytes of slot `slot`, for writing.
    ///
    /// # Safety
    /// The caller holds the ring's claim on `slot` (no one else reads or writes it, and no copy
    /// out of it is in flight), and `len <= slot_bytes`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot_mut(&self, slot: usize, len: usize) -> &mut [u8] {
        debug_assert!(len <= self.slot_bytes);
        // SAFETY: in bounds by `slot_ptr` and `len <= slot_bytes`; exclusive by the claim.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(slot), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_pool_serves_loaders_of_its_process_device_and_method_up_to_its_size() {
        let idle = PoolKey {
            pid: 7,
            device: Some(0),
            bytes: 1 << 20,
            method: Some(PinMethod::Register),
        };
        assert!(idle.serves(&idle));
        assert!(idle.serves(&PoolKey {
            bytes: 1 << 19,
            ..idle
        }));
        assert!(!idle.serves(&PoolKey {
            bytes: (1 << 20) + 1,
            ..idle
        }));
        assert!(!idle.serves(&PoolKey { pid: 8, ..idle }));
        assert!(!idle.serves(&PoolKey {
            device: Some(1),
            ..idle
        }));
        assert!(!idle.serves(&PoolKey {
            device: None,
            method: None,
            ..idle
        }));
        assert!(!idle.serves(&PoolKey {
            method: Some(PinMethod::HostAlloc),
            ..idle
        }));
    }
}
