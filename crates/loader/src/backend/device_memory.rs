//! Device memory for batches: the budget it is counted against, and the caches that recycle
//! it so that steady state asks the driver (or the allocator) for nothing.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use pinfeed_cuda::{CUstream, CudaError, DeviceBuffer, Event, EventPool};

use crate::error::{LoaderError, Result};

/// Counts device bytes held by batches and refuses to go past a budget.
#[derive(Debug)]
pub(crate) struct DeviceBudget {
    limit: Option<usize>,
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl DeviceBudget {
    pub(crate) fn new(limit: Option<usize>) -> Arc<Self> {
        Arc::new(DeviceBudget {
            limit,
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    pub(super) fn take(&self, bytes: usize) -> Result<()> {
        let held = self.held.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if let Some(limit) = self.limit {
            if held > limit {
                self.held.fetch_sub(bytes, Ordering::AcqRel);
                return Err(LoaderError::DeviceBudget {
                    budget: limit,
                    held: held - bytes,
                    wanted: bytes,
                });
            }
        }
        self.peak.fetch_max(held, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// Alignment of the host backend's "device" buffers: what a CUDA allocation guarantees at
/// least, and what consumers wrapping memory without a copy ask for (JAX's CPU client wants
/// 64 bytes, else it copies).
pub(crate) const HOST_ALIGN: usize = 64;

/// One host-backend "device" buffer: `HOST_ALIGN - 1` bytes more than it holds, so that its
/// bytes can start at an aligned address inside it.
#[derive(Debug)]
pub(crate) struct HostBuffer {
    bytes: Vec<u8>,
    /// Where the aligned bytes start in `bytes` (fixed: a Vec's heap buffer does not move).
    offset: usize,
}

impl HostBuffer {
    fn new(len: usize) -> HostBuffer {
        let bytes = vec![0; len + HOST_ALIGN - 1];
        let offset = bytes.as_ptr().align_offset(HOST_ALIGN);
        debug_assert!(offset < HOST_ALIGN);
        HostBuffer { bytes, offset }
    }

    /// Bytes it holds.
    fn len(&self) -> usize {
        self.bytes.len() + 1 - HOST_ALIGN
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[self.offset..self.offset + self.len()]
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        let (offset, len) = (self.offset, self.len());
        self.bytes[offset..offset + len].as_mut_ptr()
    }
}

/// Idle host-backend buffers the process keeps for reuse, at most (as a CUDA device's cache).
const HOST_CACHE_ENTRIES: usize = DEVICE_CACHE_ENTRIES;
/// Bytes of idle host-backend buffers the process keeps for reuse, at most.
const HOST_CACHE_BYTES: usize = DEVICE_CACHE_BYTES;

/// Recycles the host backend's "device" buffers so that steady state allocates nothing. One
/// cache serves every loader of the process ([`HostBufferCache::shared`]): a Python loader
/// starts a loader per epoch, and a buffer the allocator hands out afresh faults in each of
/// its pages on the host copy's first write (with a cache per loader, 7 of a pass's 64
/// batches of 4 MiB did, doubling what the host copy cost them). Keeps the most recently let
/// go, at most [`HOST_CACHE_ENTRIES`] buffers and [`HOST_CACHE_BYTES`]. A forked child neither
/// takes nor keeps its parent's buffers: a thread the child does not have may have held the
/// lock at the fork.
#[derive(Debug)]
pub(crate) struct HostBufferCache {
    /// The process the cache belongs to.
    pid: u32,
    /// Oldest first, and the bytes they hold.
    free: Mutex<(VecDeque<HostBuffer>, usize)>,
}

impl Default for HostBufferCache {
    fn default() -> HostBufferCache {
        HostBufferCache {
            pid: std::process::id(),
            free: Mutex::default(),
        }
    }
}

impl HostBufferCache {
    /// The process's cache.
    pub(super) fn shared() -> Arc<HostBufferCache> {
        static SHARED: OnceLock<Arc<HostBufferCache>> = OnceLock::new();
        Arc::clone(SHARED.get_or_init(Arc::default))
    }

    /// The idle buffers, unless this is a forked child of the process that made the cache.
    fn free(&self) -> Option<std::sync::MutexGuard<'_, (VecDeque<HostBuffer>, usize)>> {
        (std::process::id() == self.pid)
            .then(|| self.free.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn get(&self, len: usize) -> HostBuffer {
        let reused = self.free().and_then(|mut free| {
            let (buffers, bytes) = &mut *free;
            let i = buffers.iter().rposition(|b| b.len() == len)?;
            *bytes -= len;
            buffers.remove(i)
        });
        reused.unwrap_or_else(|| HostBuffer::new(len))
    }

    fn put(&self, buf: HostBuffer) {
        let Some(mut free) = self.free() else {
            return;
        };
        let (buffers, bytes) = &mut *free;
        *bytes += buf.len();
        buffers.push_back(buf);
        let mut evicted = Vec::new();
        while buffers.len() > HOST_CACHE_ENTRIES || *bytes > HOST_CACHE_BYTES {
            let Some(old) = buffers.pop_front() else {
                break;
            };
            *bytes -= old.len();
            evicted.push(old);
        }
        drop(free);
        // Freed after the lock is let go: unmapping large buffers takes a while.
        drop(evicted);
    }

    /// Idle buffers and the bytes they hold.
    #[cfg(test)]
    fn idle(&self) -> (usize, usize) {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        (free.0.len(), free.1)
    }
}

/// Recycles batch memory on a CUDA device. A batch's memory comes back here when the batch
/// is let go, with what its consumer's last use must wait for (see [`LastUse`]), and the copy
/// thread takes it for a later batch of the same size once that has completed (a host-side
/// query, as torch's caching allocator does for `record_stream`). Steady state then costs the
/// driver no allocation, no free, and no wait of the copy stream on the consumer's stream:
/// every driver call of a batch is paid on its path (the driver serialises calls on a
/// context), and a cross-stream wait in the copy stream puts a gap between copies.
///
/// Memory let go on the legacy default stream (torch's current stream unless the user set another)
/// gets no event of its own: while other threads call the driver, an event recorded on that stream
/// costs the consumer's thread several times what one on a stream of its own does, a large part of
/// a small batch's copy time (`examples/copy_path.rs` times it). The copy thread instead records
/// one event on the legacy stream for up to [`SEAL_AFTER`] such buffers at a time (`seal`): any
/// thread may queue work on the legacy stream, and an event recorded after a buffer was let go
/// completes after every use the consumer queued before.
///
/// Holds at most [`DEVICE_CACHE_BYTES`] and [`DEVICE_CACHE_ENTRIES`]; what does not fit is
/// freed in stream order on the copy stream after its last use (the behaviour without a cache).
#[derive(Debug)]
pub(crate) struct DeviceBufferCache {
    idle: Mutex<Idle>,
    /// Events for the legacy stream's seals.
    events: Arc<EventPool>,
}

#[derive(Debug, Default)]
struct Idle {
    /// Oldest first.
    buffers: VecDeque<IdleBuffer>,
    /// The number the next buffer to come back gets (see [`IdleBuffer::returned`]).
    next_returned: u64,
}

impl Idle {
    /// Buffers let go on the legacy stream that no seal covers yet.
    fn unsealed(&self) -> usize {
        self.buffers
            .iter()
            .filter(|e| matches!(e.used, LastUse::Legacy))
            .count()
    }
}

/// Memory let go: no one may use it before `used` has completed.
#[derive(Debug)]
struct IdleBuffer {
    buffer: DeviceBuffer,
    used: LastUse,
    /// The order in which memory came back to this cache (see [`DeviceBufferCache::seal`]).
    returned: u64,
}

/// What the last use of batch memory must have finished before the memory is used again.
#[derive(Debug, Default)]
pub(crate) enum LastUse {
    /// Only the copy stream used it, and work queued there later is ordered after it.
    #[default]
    CopyStream,
    /// The consumer's work queued before this event (shared by the buffers of one seal).
    Event(Arc<Event>),
    /// The consumer's work queued on the legacy default stream before the memory came back:
    /// waits for an event recorded on that stream later.
    Legacy,
}

/// Bytes of idle batch memory a device keeps for reuse, at most.
const DEVICE_CACHE_BYTES: usize = 256 << 20;
/// Idle buffers a device keeps for reuse, at most.
const DEVICE_CACHE_ENTRIES: usize = 32;
/// Buffers let go on the legacy stream that share one event, at most.
const SEAL_AFTER: usize = 4;

/// `CU_STREAM_LEGACY`.
const LEGACY_STREAM: CUstream = 1 as CUstream;

/// Whether a raw stream handle is the legacy default stream (the driver reads 0 as it too).
pub(super) fn is_legacy_stream(stream: u64) -> bool {
    stream == 0 || stream == 1
}

/// An event from `events` recorded on `stream` now: it completes after the work queued there
/// so far.
///
/// # Safety
/// `stream` is a live stream of the events' context, or one of the special handles 0, 1, 2.
pub(super) unsafe fn record_now(
    events: &Arc<EventPool>,
    stream: CUstream,
) -> std::result::Result<Event, CudaError> {
    let event = events.get()?;
    // SAFETY: forwarded from this function's contract.
    unsafe { event.record_raw(stream) }?;
    Ok(event)
}

impl DeviceBufferCache {
    pub(crate) fn new(events: Arc<EventPool>) -> DeviceBufferCache {
        DeviceBufferCache {
            idle: Mutex::default(),
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle buffer of exactly `len` bytes that nothing uses any more, or `None`. Seals the
    /// legacy stream's buffers once [`SEAL_AFTER`] have come back, or when the oldest match is
    /// one of them.
    pub(super) fn take(&self, len: usize) -> Option<DeviceBuffer> {
        let mut idle = self.lock();
        let i = idle.buffers.iter().position(|e| e.buffer.len() == len);
        let oldest_unsealed = i.is_some_and(|i| matches!(idle.buffers[i].used, LastUse::Legacy));
        if oldest_unsealed || idle.unsealed() >= SEAL_AFTER {
            drop(idle);
            // A seal that fails leaves the buffers unsealed: never handed out, and freed (or
            // leaked) with the cache.
            let _ = self.seal();
            idle = self.lock();
        }
        let i = idle.buffers.iter().position(|e| e.buffer.len() == len)?;
        // Events recorded later on the same stream complete later: querying the oldest match
        // is enough. A query that fails (or says not yet) leaves the buffer where it is.
        match &idle.buffers[i].used {
            LastUse::CopyStream => {}
            LastUse::Legacy => return None,
            LastUse::Event(used) => {
                if !matches!(used.query(), Ok(true)) {
                    return None;
                }
                // Every buffer of the same seal is free too: no need to ask again.
                let used = Arc::clone(used);
                for e in idle.buffers.iter_mut() {
                    if matches!(&e.used, LastUse::Event(u) if Arc::ptr_eq(u, &used)) {
                        e.used = LastUse::CopyStream;
                    }
                }
            }
        }
        idle.buffers.remove(i).map(|e| e.buffer)
    }

    /// Records one event on the legacy default stream for every buffer let go there before
    /// now. The driver call is made without the lock, so the consumer's thread letting a batch
    /// go never waits for it; buffers that come back meanwhile wait for the next seal.
    fn seal(&self) -> std::result::Result<(), CudaError> {
        // Every buffer numbered below `before` was in the list before the event is recorded.
        let before = self.lock().next_returned;
        let event = self.legacy_event()?;
        for e in self.lock().buffers.iter_mut() {
            if e.returned < before && matches!(e.used, LastUse::Legacy) {
                e.used = LastUse::Event(Arc::clone(&event));
            }
        }
        Ok(())
    }

    /// Keeps `buffer` for reuse once `used` has completed; frees the oldest buffers beyond the
    /// cache's bounds (this one, when it alone is larger).
    fn put(&self, buffer: DeviceBuffer, used: LastUse) {
        let mut evicted = Vec::new();
        {
            let mut idle = self.lock();
            let returned = idle.next_returned;
            idle.next_returned += 1;
            idle.buffers.push_back(IdleBuffer {
                buffer,
                used,
                returned,
            });
            // A few dozen entries at most: summing them is simpler than keeping a count in step.
            let bytes = |idle: &Idle| idle.buffers.iter().map(|e| e.buffer.len()).sum::<usize>();
            while idle.buffers.len() > DEVICE_CACHE_ENTRIES || bytes(&idle) > DEVICE_CACHE_BYTES {
                evicted.extend(idle.buffers.pop_front());
            }
        }
        self.free(evicted);
    }

    /// Frees `buffers` in stream order on the copy stream (where they were allocated), after
    /// their last use: the copy stream waits for the consumer's event first; the legacy
    /// stream's buffers get one event recorded now.
    fn free(&self, buffers: impl IntoIterator<Item = IdleBuffer>) {
        // One event for all the legacy stream's buffers, recorded at the first; `None` inside
        // when that failed.
        let mut legacy: Option<Option<Arc<Event>>> = None;
        for IdleBuffer { buffer, used, .. } in buffers {
            let after = match used {
                LastUse::CopyStream => {
                    drop(buffer);
                    continue;
                }
                LastUse::Event(event) => Some(event),
                LastUse::Legacy => legacy
                    .get_or_insert_with(|| self.legacy_event().ok())
                    .clone(),
            };
            match after {
                Some(event) if buffer.stream().wait_event(&event).is_ok() => drop(buffer),
                // The copy stream cannot be ordered after the consumer (a failing context, or
                // a forked child): leave the memory allocated rather than let it be handed out
                // under a reader.
                _ => std::mem::forget(buffer),
            }
        }
    }

    /// An event recorded on the legacy default stream now.
    fn legacy_event(&self) -> std::result::Result<Arc<Event>, CudaError> {
        // SAFETY: the legacy default stream of the events' context is always valid.
        unsafe { record_now(&self.events, LEGACY_STREAM) }.map(Arc::new)
    }
}

impl Drop for DeviceBufferCache {
    fn drop(&mut self) {
        let idle = std::mem::take(
            &mut self
                .idle
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .buffers,
        );
        self.free(idle);
    }
}

/// Device memory holding one batch. Returned to its backend's cache (or pool) when dropped.
pub struct DeviceMemory {
    pub(super) inner: Option<DeviceInner>,
    pub(super) len: usize,
    pub(super) budget: Arc<DeviceBudget>,
    /// What the consumer's last use must have finished before the memory is used again (see
    /// [`Landed::order_free_after`]).
    pub(super) used: LastUse,
}

/// The memory itself, and the cache it goes back to.
pub(super) enum DeviceInner {
    Host {
        buf: HostBuffer,
        cache: Arc<HostBufferCache>,
    },
    Cuda {
        buffer: DeviceBuffer,
        cache: Arc<DeviceBufferCache>,
    },
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("len", &self.len)
            .field("address", &format_args!("{:#x}", self.address()))
            .finish()
    }
}

impl DeviceMemory {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address: a CUDA device pointer, or a host pointer on the host backend.
    pub fn address(&self) -> u64 {
        match &self.inner {
            Some(DeviceInner::Host { buf, .. }) => buf.as_slice().as_ptr() as u64,
            Some(DeviceInner::Cuda { buffer, .. }) => buffer.ptr(),
            None => 0,
        }
    }

    /// The bytes, on the host backend (`None` for CUDA memory).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match &self.inner {
            Some(DeviceInner::Host { buf, .. }) => Some(buf.as_slice()),
            _ => None,
        }
    }

    /// Gives up the memory without returning it anywhere: for CUDA memory whose last use
    /// cannot be ordered before a reuse.
    pub(super) fn leak(&mut self) {
        if let Some(DeviceInner::Cuda { buffer, .. }) = self.inner.take() {
            std::mem::forget(buffer);
        }
    }

    /// The address to copy into: [`address`](DeviceMemory::address), but taken through
    /// `&mut` so that on the host backend writes through it are allowed.
    pub(crate) fn write_address(&mut self) -> u64 {
        match &mut self.inner {
            Some(DeviceInner::Host { buf, .. }) => buf.as_mut_ptr() as u64,
            Some(DeviceInner::Cuda { buffer, .. }) => buffer.ptr(),
            None => 0,
        }
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        match self.inner.take() {
            Some(DeviceInner::Host { buf, cache }) => cache.put(buf),
            // Reused once the consumer's last use has completed, or freed in stream order after
            // it (see `Batch::release_after`).
            Some(DeviceInner::Cuda { buffer, cache }) => {
                cache.put(buffer, std::mem::take(&mut self.used))
            }
            None => {}
        }
        self.budget.give(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinfeed_cuda::{memcpy_dtod_async, Context, DevicePool, ForeignStream, Stream};

    /// Host "device" buffers start at an aligned address and hold exactly the bytes asked
    /// for, recycled or new.
    #[test]
    fn host_buffers_are_aligned_and_exact() {
        let cache = HostBufferCache::default();
        for len in [0, 1, 63, 64, 65, 4097, 1 << 20] {
            let mut buf = cache.get(len);
            assert_eq!(buf.as_slice().len(), len);
            assert_eq!(buf.as_slice().as_ptr() as usize % HOST_ALIGN, 0);
            assert_eq!(buf.as_mut_ptr() as usize % HOST_ALIGN, 0);
            cache.put(buf);
            let again = cache.get(len);
            assert_eq!(again.as_slice().len(), len);
            assert_eq!(again.as_slice().as_ptr() as usize % HOST_ALIGN, 0);
        }
    }

    /// A buffer let go is handed out again for the same size only; the cache keeps the most
    /// recently let go within its bounds on buffers and bytes.
    #[test]
    fn host_buffers_are_reused_within_the_cache_bounds() {
        let cache = HostBufferCache::default();
        let buf = cache.get(4096);
        let at = buf.as_slice().as_ptr();
        cache.put(buf);
        assert_ne!(cache.get(4095).as_slice().as_ptr(), at, "another size");
        assert_eq!(cache.get(4096).as_slice().as_ptr(), at, "the same size");
        assert_eq!(cache.idle(), (0, 0));

        let many: Vec<HostBuffer> = (0..HOST_CACHE_ENTRIES + 3).map(|_| cache.get(64)).collect();
        let newest = many.last().unwrap().as_slice().as_ptr();
        for buf in many {
            cache.put(buf);
        }
        assert_eq!(cache.idle(), (HOST_CACHE_ENTRIES, HOST_CACHE_ENTRIES * 64));
        assert_eq!(cache.get(64).as_slice().as_ptr(), newest);

        let big = HOST_CACHE_BYTES / 2 + 1;
        let (a, b) = (cache.get(big), cache.get(big));
        let b_at = b.as_slice().as_ptr();
        cache.put(a);
        cache.put(b);
        // The oldest go first until the bytes fit: every small one, then the first big one.
        assert_eq!(cache.idle(), (1, big));
        assert_eq!(cache.get(big).as_slice().as_ptr(), b_at);
    }

    /// In a forked child (here: a cache whose process is another) nothing is kept or reused.
    #[test]
    fn a_forked_child_neither_keeps_nor_reuses_host_buffers() {
        let cache = HostBufferCache {
            pid: std::process::id().wrapping_add(1),
            free: Mutex::default(),
        };
        let buf = cache.get(4096);
        cache.put(buf);
        assert_eq!(cache.idle(), (0, 0));
    }

    /// Every host backend of the process shares one cache.
    #[test]
    fn host_backends_share_one_buffer_cache() {
        assert!(Arc::ptr_eq(
            &HostBufferCache::shared(),
            &HostBufferCache::shared()
        ));
    }

    /// Memory let go on the legacy default stream goes to a later batch only once an event
    /// recorded on that stream afterwards has completed: while the legacy stream is held back
    /// (it waits for copies on another stream), `take` refuses the memory; once the copies are
    /// done, the same memory comes back.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_memory_let_go_on_the_legacy_stream_waits_for_that_stream() {
        let ctx = Context::new(0).unwrap();
        let copy_stream = Stream::new(&ctx).unwrap();
        let side = Stream::new(&ctx).unwrap();
        let pool = DevicePool::new(&ctx).unwrap();
        let events = EventPool::new(&ctx);
        let cache = DeviceBufferCache::new(Arc::clone(&events));

        // Milliseconds of copies on `side`, and the legacy stream made to wait for them.
        let big = 256 << 20;
        let from = pool.alloc_async(big, &side).unwrap();
        let to = pool.alloc_async(big, &side).unwrap();
        for _ in 0..32 {
            // SAFETY: both buffers hold `big` bytes, do not overlap, and outlive the final
            // synchronisation of `side`.
            unsafe { memcpy_dtod_async(to.ptr(), from.ptr(), big, &side).unwrap() };
        }
        let held = events.get().unwrap();
        held.record(&side).unwrap();
        // SAFETY: 1 is the legacy default stream, always valid.
        unsafe { ForeignStream::from_raw(1) }
            .wait_event(&held, &ctx)
            .unwrap();

        let len = 1 << 20;
        let buffer = pool.alloc_async(len, &copy_stream).unwrap();
        let address = buffer.ptr();
        copy_stream.synchronize().unwrap();
        cache.put(buffer, LastUse::Legacy);
        assert!(
            cache.take(len).is_none(),
            "memory let go on the legacy stream was handed out while that stream was held back"
        );
        assert!(
            !held.query().unwrap(),
            "the copies holding the legacy stream back were done before the check: it proved nothing"
        );

        side.synchronize().unwrap();
        let again = (0..2000).find_map(|_| {
            let taken = cache.take(len);
            if taken.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            taken
        });
        assert_eq!(
            again.map(|b| b.ptr()),
            Some(address),
            "the memory never came back once the legacy stream had caught up"
        );
    }
}
