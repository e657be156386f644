//! Where batches go: a CUDA device, or the host backend that stands in for one.
//!
//! The host backend runs the same pipeline with host memory as "device" memory, a copy thread
//! doing `memcpy` as the copy engine (in order, like one CUDA stream) and a completion flag as
//! the event, so everything but the copy engine itself is exercised on machines without a GPU.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use pinfeed_cuda::{
    CUstream, Context, CudaError, DeviceBuffer, DevicePool, Event, EventPool, PinMethod, Stream,
};

use crate::error::{LoaderError, Result};

/// Which device batches are delivered to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The first CUDA device when a driver and a device are present, else the host backend.
    #[default]
    Auto,
    /// The host backend.
    Cpu,
    /// CUDA device number `n`.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" | "host" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| {
                    LoaderError::Config(format!(
                        "unknown device {s:?}: expected auto, cpu, cuda or cuda:N"
                    ))
                }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => write!(f, "auto"),
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// Resolves `Auto` to a CUDA device when one is usable, else to `Cpu`.
    pub fn resolve(self) -> DeviceSpec {
        match self {
            DeviceSpec::Auto => match pinfeed_cuda::probe() {
                Ok(count) if count > 0 => DeviceSpec::Cuda(0),
                _ => DeviceSpec::Cpu,
            },
            other => other,
        }
    }
}

/// Completion of one copy out of a slot: a CUDA event or the host engine's flag; or of the
/// copies of one slot to several devices.
#[derive(Clone)]
pub enum CopyFence {
    /// Set by the host copy thread after its `memcpy`.
    Host(Arc<HostFlag>),
    /// Recorded on the copy stream after the copy.
    Cuda(Arc<CudaFence>),
    /// Complete when every one of these is: the copies of one slot to each device of a
    /// replicated loader, each on its own device's stream, in no set order among them. The
    /// slot may be reused only when the last of them has finished reading it.
    All(Vec<CopyFence>),
}

/// An event recorded once on a copy stream, and whether it has been seen complete: the ring's
/// readers, the consumer's hand-over and a read-back all ask about one copy, and every thread
/// calling the driver slows the others (it serialises the calls of threads sharing a context),
/// so a completion seen once is not asked about again. Sound because the event is recorded
/// once, when the fence is made, and never again while the fence lives.
pub struct CudaFence {
    event: Event,
    done: AtomicBool,
}

impl CudaFence {
    /// Records `event` on `stream` after the work queued there so far.
    fn record(event: Event, stream: &Stream) -> std::result::Result<CudaFence, CudaError> {
        event.record(stream)?;
        Ok(CudaFence {
            event,
            done: AtomicBool::new(false),
        })
    }

    /// The event, to make a stream wait for it.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Whether the copy has finished; asks the driver only until it has once said yes.
    pub fn query(&self) -> std::result::Result<bool, CudaError> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let done = self.event.query()?;
        if done {
            self.done.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// Blocks until the copy has finished.
    pub fn synchronize(&self) -> std::result::Result<(), CudaError> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.event.synchronize()?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }
}

impl CopyFence {
    /// The fence of all of `fences`: the one itself when there is one.
    pub(crate) fn all(mut fences: Vec<CopyFence>) -> CopyFence {
        debug_assert!(!fences.is_empty(), "a fence of no copy");
        if fences.len() == 1 {
            fences.pop().expect("one fence")
        } else {
            CopyFence::All(fences)
        }
    }
}

impl fmt::Debug for CopyFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyFence::Host(flag) => write!(f, "HostFence(done={})", flag.is_set()),
            CopyFence::Cuda(_) => write!(f, "CudaEvent"),
            CopyFence::All(fences) => f.debug_tuple("All").field(fences).finish(),
        }
    }
}

impl pinfeed_ring::Fence for CopyFence {
    type Error = CudaError;
    fn is_complete(&self) -> std::result::Result<bool, CudaError> {
        match self {
            CopyFence::Host(flag) => Ok(flag.is_set()),
            CopyFence::Cuda(event) => event.query(),
            CopyFence::All(fences) => {
                for fence in fences {
                    if !fence.is_complete()? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
    fn wait(&self) -> std::result::Result<(), CudaError> {
        match self {
            CopyFence::Host(flag) => {
                flag.wait();
                Ok(())
            }
            CopyFence::Cuda(event) => event.synchronize(),
            CopyFence::All(fences) => {
                // Every copy is waited for even if one fails: the slot must not be freed while
                // any of them may still read it.
                let mut first_error = None;
                for fence in fences {
                    if let Err(e) = fence.wait() {
                        first_error.get_or_insert(e);
                    }
                }
                first_error.map_or(Ok(()), Err)
            }
        }
    }
}

/// A one-shot completion flag that can be waited on without spinning.
#[derive(Debug, Default)]
pub struct HostFlag {
    done: Mutex<bool>,
    cv: Condvar,
}

impl HostFlag {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }
    fn is_set(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

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

    fn take(&self, bytes: usize) -> Result<()> {
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

    fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// Recycles the host backend's "device" buffers so that steady state allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct HostBufferCache {
    free: Mutex<Vec<Vec<u8>>>,
}

impl HostBufferCache {
    fn get(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        match free.iter().position(|b| b.len() == len) {
            Some(i) => free.swap_remove(i),
            None => vec![0; len],
        }
    }
    fn put(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // A handful is enough: the ring has a bounded number of batches in flight.
        if free.len() < 64 {
            free.push(buf);
        }
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
/// Memory let go on the legacy default stream (torch's current stream unless the user set
/// another) gets no event of its own: an event recorded on that stream cost the consumer's
/// thread 4-6 µs while other threads called the driver (1-2 µs on a stream of its own), which
/// a 1 MiB batch, copied in 22 µs, cannot spare (`docs/BENCHMARKS.md`). The copy thread
/// instead records one event on the legacy stream for up to [`SEAL_AFTER`] such buffers at a
/// time (`seal`): any thread may queue work on the legacy stream, and an event recorded after
/// a buffer was let go completes after every use the consumer queued before.
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
fn is_legacy_stream(stream: u64) -> bool {
    stream == 0 || stream == 1
}

/// An event from `events` recorded on `stream` now: it completes after the work queued there
/// so far.
///
/// # Safety
/// `stream` is a live stream of the events' context, or one of the special handles 0, 1, 2.
unsafe fn record_now(
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
    fn take(&self, len: usize) -> Option<DeviceBuffer> {
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
    inner: Option<DeviceInner>,
    len: usize,
    budget: Arc<DeviceBudget>,
    /// What the consumer's last use must have finished before the memory is used again (see
    /// [`Landed::order_free_after`]).
    used: LastUse,
}

enum DeviceInner {
    Host {
        buf: Vec<u8>,
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
            Some(DeviceInner::Host { buf, .. }) => buf.as_ptr() as u64,
            Some(DeviceInner::Cuda { buffer, .. }) => buffer.ptr(),
            None => 0,
        }
    }

    /// The bytes, on the host backend (`None` for CUDA memory).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match &self.inner {
            Some(DeviceInner::Host { buf, .. }) => Some(buf),
            _ => None,
        }
    }

    /// Gives up the memory without returning it anywhere: for CUDA memory whose last use
    /// cannot be ordered before a reuse.
    fn leak(&mut self) {
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

/// A raw pointer moved to the host copy thread.
struct SendPtr<T>(*mut T);
// SAFETY: the pointer is only dereferenced by the copy thread while the ring guarantees the
// source slot is not written (it is `Copying` until the flag is set) and the destination
// buffer is owned by a batch that waits on the same flag before anyone reads it.
unsafe impl<T> Send for SendPtr<T> {}

struct HostJob {
    src: SendPtr<u8>,
    dst: SendPtr<u8>,
    len: usize,
    done: Arc<HostFlag>,
}

/// The host backend's copy engine: one thread copying in submission order, like a stream.
pub(crate) struct HostCopyEngine {
    jobs: Option<mpsc::Sender<HostJob>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Holds the host copy engine's copies back while closed: how tests make one device's copies
/// slower than another's, deterministically.
#[derive(Debug, Default)]
pub(crate) struct CopyGate {
    closed: Mutex<bool>,
    cv: Condvar,
}

impl CopyGate {
    /// A gate, closed.
    #[cfg(test)]
    pub(crate) fn closed() -> Arc<CopyGate> {
        Arc::new(CopyGate {
            closed: Mutex::new(true),
            cv: Condvar::new(),
        })
    }

    /// Lets every copy held back, and all later ones, through.
    #[cfg(test)]
    pub(crate) fn open(&self) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        while *closed {
            closed = self.cv.wait(closed).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl HostCopyEngine {
    fn start(gate: Option<Arc<CopyGate>>) -> Result<HostCopyEngine> {
        let (tx, rx) = mpsc::channel::<HostJob>();
        let thread = std::thread::Builder::new()
            .name("pinfeed-hostcopy".into())
            .spawn(move || {
                for job in rx {
                    if let Some(gate) = &gate {
                        gate.pass();
                    }
                    // SAFETY: see `SendPtr`: both ranges are valid for `len` bytes and nobody
                    // else touches them until `done` is set.
                    unsafe { std::ptr::copy_nonoverlapping(job.src.0, job.dst.0, job.len) };
                    job.done.set();
                }
            })
            .map_err(|source| LoaderError::Thread {
                what: "host copy",
                source,
            })?;
        Ok(HostCopyEngine {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for HostCopyEngine {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The device end of the pipeline.
pub(crate) enum Backend {
    Host {
        engine: HostCopyEngine,
        cache: Arc<HostBufferCache>,
    },
    Cuda {
        ctx: Arc<Context>,
        copy_stream: Arc<Stream>,
        /// Used by readbacks (verification), so they never queue behind the copy stream.
        readback_stream: Stream,
        pool: Arc<DevicePool>,
        /// Batch memory let go, for reuse.
        cache: Arc<DeviceBufferCache>,
        /// The events recorded per copy and per release, reused.
        events: Arc<EventPool>,
        pin_method: PinMethod,
    },
}

impl Backend {
    pub(crate) fn new(device: DeviceSpec, pin_method: PinMethod) -> Result<Backend> {
        match device.resolve() {
            DeviceSpec::Cpu | DeviceSpec::Auto => Ok(Backend::Host {
                engine: HostCopyEngine::start(None)?,
                cache: Arc::default(),
            }),
            DeviceSpec::Cuda(ordinal) => {
                let ctx = Context::new(ordinal)?;
                let copy_stream = Arc::new(Stream::new(&ctx)?);
                let readback_stream = Stream::new(&ctx)?;
                let pool = DevicePool::new(&ctx)?;
                let events = EventPool::new(&ctx);
                Ok(Backend::Cuda {
                    ctx,
                    copy_stream,
                    readback_stream,
                    pool,
                    cache: Arc::new(DeviceBufferCache::new(Arc::clone(&events))),
                    events,
                    pin_method,
                })
            }
        }
    }

    /// A host backend whose copies wait for `gate` to open.
    #[cfg(test)]
    pub(crate) fn host_gated(gate: Arc<CopyGate>) -> Result<Backend> {
        Ok(Backend::Host {
            engine: HostCopyEngine::start(Some(gate))?,
            cache: Arc::default(),
        })
    }

    pub(crate) fn device(&self) -> DeviceSpec {
        match self {
            Backend::Host { .. } => DeviceSpec::Cpu,
            Backend::Cuda { ctx, .. } => DeviceSpec::Cuda(ctx.ordinal()),
        }
    }

    pub(crate) fn context(&self) -> Option<&Arc<Context>> {
        match self {
            Backend::Cuda { ctx, .. } => Some(ctx),
            Backend::Host { .. } => None,
        }
    }

    pub(crate) fn pinned_pool(
        &self,
        slot_bytes: usize,
        slots: usize,
    ) -> Result<crate::pool::PinnedPool> {
        match self {
            Backend::Host { .. } => crate::pool::PinnedPool::host(slot_bytes, slots),
            Backend::Cuda {
                ctx, pin_method, ..
            } => crate::pool::PinnedPool::cuda(ctx, slot_bytes, slots, *pin_method),
        }
    }

    /// Device memory for one batch, counted against `budget`.
    pub(crate) fn alloc(&self, len: usize, budget: &Arc<DeviceBudget>) -> Result<DeviceMemory> {
        budget.take(len)?;
        let inner = match self {
            Backend::Host { cache, .. } => DeviceInner::Host {
                buf: cache.get(len),
                cache: Arc::clone(cache),
            },
            Backend::Cuda {
                copy_stream,
                pool,
                cache,
                ..
            } => {
                let buffer = match cache.take(len) {
                    Some(buffer) => buffer,
                    None => match pool.alloc_async(len, copy_stream) {
                        Ok(buffer) => buffer,
                        Err(e) => {
                            budget.give(len);
                            return Err(e.into());
                        }
                    },
                };
                DeviceInner::Cuda {
                    buffer,
                    cache: Arc::clone(cache),
                }
            }
        };
        Ok(DeviceMemory {
            inner: Some(inner),
            len,
            budget: Arc::clone(budget),
            used: LastUse::CopyStream,
        })
    }

    /// Starts copying `len` bytes from `src` into `dst` and returns the fence that completes
    /// when the copy has finished reading `src`.
    ///
    /// # Safety
    /// `src` is valid for `len` bytes and not written until the fence completes; `dst` holds
    /// at least `len` bytes and is not read until the fence completes.
    pub(crate) unsafe fn copy(
        &self,
        src: *const u8,
        dst: &mut DeviceMemory,
        dst_offset: usize,
        len: usize,
    ) -> Result<CopyFence> {
        assert!(
            dst_offset + len <= dst.len(),
            "copy past the end of device memory"
        );
        let at = dst.write_address() + dst_offset as u64;
        // SAFETY: `at .. at + len` lies inside `dst` (asserted), which the caller does not read
        // until the fence; the rest is forwarded from this function's contract.
        unsafe { self.copy_to(src, at, len) }
    }

    /// [`copy`](Backend::copy) to a raw destination: a device address on CUDA, a host pointer
    /// on the host backend (from [`DeviceMemory::write_address`]). Several threads may copy
    /// into disjoint parts of one allocation this way.
    ///
    /// # Safety
    /// As for `copy`; and `dst .. dst + len` lies inside live memory of this backend that
    /// nothing else writes or reads until the fence completes.
    pub(crate) unsafe fn copy_to(&self, src: *const u8, dst: u64, len: usize) -> Result<CopyFence> {
        match self {
            Backend::Host { engine, .. } => {
                let done = Arc::new(HostFlag::default());
                let job = HostJob {
                    src: SendPtr(src.cast_mut()),
                    dst: SendPtr(dst as *mut u8),
                    len,
                    done: Arc::clone(&done),
                };
                engine
                    .jobs
                    .as_ref()
                    .and_then(|jobs| jobs.send(job).ok())
                    .ok_or_else(|| {
                        LoaderError::Config("the host copy engine has stopped".into())
                    })?;
                Ok(CopyFence::Host(done))
            }
            Backend::Cuda {
                copy_stream,
                events,
                ..
            } => {
                // SAFETY: forwarded from this function's contract.
                unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, len, copy_stream)? };
                let fence = CudaFence::record(events.get()?, copy_stream)?;
                Ok(CopyFence::Cuda(Arc::new(fence)))
            }
        }
    }

    /// A fence that is complete once everything issued on the copy stream so far is: for data
    /// that needed no copy.
    pub(crate) fn completed_fence(&self) -> Result<CopyFence> {
        match self {
            Backend::Host { .. } => {
                let flag = Arc::new(HostFlag::default());
                flag.set();
                Ok(CopyFence::Host(flag))
            }
            Backend::Cuda {
                copy_stream,
                events,
                ..
            } => {
                let fence = CudaFence::record(events.get()?, copy_stream)?;
                Ok(CopyFence::Cuda(Arc::new(fence)))
            }
        }
    }

    /// Copies a delivered batch back to host memory, after its copy finished. Used to verify
    /// what arrived on the device.
    pub(crate) fn read_back(
        &self,
        src: &DeviceMemory,
        ready: &CopyFence,
        dst: &mut [u8],
    ) -> Result<()> {
        assert!(dst.len() <= src.len(), "read-back larger than the batch");
        match (self, ready) {
            (Backend::Host { .. }, fence) => {
                pinfeed_ring::Fence::wait(fence)?;
                let bytes = src.host_bytes().expect("host backend holds host memory");
                dst.copy_from_slice(&bytes[..dst.len()]);
                Ok(())
            }
            (
                Backend::Cuda {
                    readback_stream, ..
                },
                fence,
            ) => {
                match fence {
                    CopyFence::Cuda(fence) => readback_stream.wait_event(fence.event())?,
                    // Not one event of this device (a fence of several devices' copies): wait
                    // on the host.
                    other => pinfeed_ring::Fence::wait(other)?,
                }
                // SAFETY: `dst` is borrowed mutably for the whole call and we synchronise the
                // stream before returning; `src` outlives the call.
                unsafe {
                    pinfeed_cuda::memcpy_dtoh_async(
                        dst.as_mut_ptr(),
                        src.address(),
                        dst.len(),
                        readback_stream,
                    )?;
                }
                readback_stream.synchronize()?;
                Ok(())
            }
        }
    }
}

/// Device memory, the fence of the copy that fills it, and the backend it belongs to: what
/// every kind of delivered data shares.
pub(crate) struct Landed {
    pub(crate) ready: CopyFence,
    pub(crate) memory: DeviceMemory,
    pub(crate) backend: Arc<Backend>,
}

impl Landed {
    pub(crate) fn wait_ready(&self) -> Result<()> {
        pinfeed_ring::Fence::wait(&self.ready).map_err(LoaderError::from)
    }

    pub(crate) fn host_bytes(&self, len: usize) -> Result<Option<&[u8]>> {
        self.wait_ready()?;
        Ok(self.memory.host_bytes().map(|b| &b[..len]))
    }

    pub(crate) fn read_back(&self, dst: &mut [u8], len: usize) -> Result<()> {
        if dst.len() != len {
            return Err(LoaderError::Config(format!(
                "read-back buffer holds {} bytes, the data {len}",
                dst.len()
            )));
        }
        self.backend.read_back(&self.memory, &self.ready, dst)
    }

    /// # Safety
    /// `stream` is a live CUDA stream of the data's context (0 for the legacy default stream),
    /// or any value on the host backend.
    pub(crate) unsafe fn stream_wait(&self, stream: u64) -> Result<()> {
        match (&self.ready, self.backend.context()) {
            // A copy that has finished needs no wait: work queued on `stream` from now on
            // sees its bytes. A consumer slower than the copy engine (the case that counts:
            // small batches) mostly gets batches whose copy is done, and a query costs the
            // driver less than a wait, which also puts a semaphore acquire in the stream.
            (CopyFence::Cuda(fence), Some(_)) if fence.query()? => Ok(()),
            (CopyFence::Cuda(fence), Some(ctx)) => {
                // SAFETY: forwarded from this function's contract.
                let foreign = unsafe { pinfeed_cuda::ForeignStream::from_raw(stream) };
                foreign.wait_event(fence.event(), ctx)?;
                Ok(())
            }
            _ => self.wait_ready(),
        }
    }

    /// Records that the work queued on `stream` so far uses the memory: once the data is
    /// dropped, the memory is reused for another batch (or freed) only after that work has
    /// completed (see [`DeviceBufferCache`]). On the legacy default stream that is left to one
    /// event the copy thread records later for several batches; on any other stream an event
    /// is recorded now. If the event cannot be recorded the memory is never handed out again
    /// (leaked), since nothing would then order its reuse.
    ///
    /// # Safety
    /// As for [`stream_wait`](Landed::stream_wait).
    pub(crate) unsafe fn order_free_after(&mut self, stream: u64) -> Result<()> {
        let Backend::Cuda { events, .. } = &*self.backend else {
            return Ok(());
        };
        if is_legacy_stream(stream) {
            self.memory.used = LastUse::Legacy;
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract.
        match unsafe { record_now(events, stream as CUstream) } {
            Ok(used) => {
                self.memory.used = LastUse::Event(Arc::new(used));
                Ok(())
            }
            Err(e) => {
                self.memory.leak();
                Err(e.into())
            }
        }
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        // On the host backend the copy thread writes into this memory until the flag is set;
        // it must not go back to the cache before. CUDA memory goes back to its device's cache,
        // where it is reused in stream order (`DeviceBufferCache`).
        if !matches!(self.ready, CopyFence::Cuda(_)) {
            let _ = pinfeed_ring::Fence::wait(&self.ready);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinfeed_cuda::{memcpy_dtod_async, ForeignStream};

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
