//! Streams (ours and borrowed ones) and events.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUstream};

use crate::context::Context;
use crate::driver::{check, has_symbol, named};
use crate::error::{CudaError, Result};

/// The stream handle and what keeps it valid; shared by [`Stream`] clones and the
/// [`DeviceBuffer`](crate::DeviceBuffer)s allocated on it, so that a buffer's stream-ordered
/// free never names a destroyed stream.
#[derive(Debug)]
pub(crate) struct StreamInner {
    pub(crate) ctx: Arc<Context>,
    /// Invariant: created by `cuStreamCreate` in `ctx`, destroyed only in `Drop`.
    pub(crate) raw: CUstream,
}

// SAFETY: a CUstream is a driver handle usable from any thread; the driver API is thread-safe
// and serialises work submitted to one stream itself.
unsafe impl Send for StreamInner {}
// SAFETY: shared access only passes the handle to thread-safe driver calls.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        let Ok(_current) = self.ctx.enter() else {
            return;
        };
        // SAFETY: `raw` is a live stream of the current context (field invariant); this is the
        // last owner. Synchronising first means host memory the stream still reads is not
        // freed under it by whoever drops next.
        unsafe {
            let _ = result::stream::synchronize(self.raw);
            let _ = result::stream::destroy(self.raw);
        }
    }
}

/// A non-blocking stream (`CU_STREAM_NON_BLOCKING`: no implicit ordering with the legacy default
/// stream) of one context.
///
/// Cloning is cheap and yields a handle to the same stream. The stream is destroyed, after a
/// `cuStreamSynchronize`, when the last clone and the last [`DeviceBuffer`](crate::DeviceBuffer)
/// allocated on it are gone.
#[derive(Debug, Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

impl Stream {
    /// Creates a non-blocking stream in `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        let _current = ctx.enter()?;
        // Our context is current (guard).
        let raw = named(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                ctx: Arc::clone(ctx),
                raw,
            }),
        })
    }

    /// The raw handle. Valid while this `Stream` (or a clone) lives.
    pub fn raw(&self) -> CUstream {
        self.inner.raw
    }

    /// The raw handle as an integer, the form torch and DLPack use.
    pub fn raw_u64(&self) -> u64 {
        self.inner.raw as usize as u64
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.inner.ctx
    }

    /// Makes later work on this stream wait until `ev` completes (`cuStreamWaitEvent`); does not
    /// block the host. The event may belong to another context.
    pub fn wait_event(&self, ev: &Event) -> Result<()> {
        let _current = self.inner.ctx.enter()?;
        // SAFETY: both handles are live (owned by `self` and `ev`); flags 0 is the only defined
        // value.
        named("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(self.inner.raw, ev.raw, CU_EVENT_WAIT_DEFAULT)
        })
    }

    /// Blocks until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        let _current = self.inner.ctx.enter()?;
        // SAFETY: `raw` is a live stream (field invariant).
        named("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.inner.raw)
        })
    }
}

/// A stream that is not ours, such as torch's current stream handed over as an integer.
/// Borrowed: never synchronised or destroyed by this crate.
#[derive(Debug, Clone, Copy)]
pub struct ForeignStream(CUstream);

// SAFETY: the handle is only passed to thread-safe driver calls; `from_raw`'s contract makes the
// owner responsible for keeping it alive, whichever thread uses it.
unsafe impl Send for ForeignStream {}
// SAFETY: as for Send; no interior state.
unsafe impl Sync for ForeignStream {}

impl ForeignStream {
    /// Wraps a raw stream handle (0 is the legacy default stream, 2 the per-thread one).
    ///
    /// # Safety
    /// `raw` must be a stream handle of this process (or one of the special values 0, 1 or 2)
    /// that stays valid (not destroyed) for as long as the returned value is used.
    pub unsafe fn from_raw(raw: u64) -> Self {
        ForeignStream(raw as usize as CUstream)
    }

    /// The raw handle.
    pub fn raw(&self) -> CUstream {
        self.0
    }

    /// The raw handle as an integer.
    pub fn raw_u64(&self) -> u64 {
        self.0 as usize as u64
    }

    /// Makes later work on this stream wait until `ev` completes (`cuStreamWaitEvent`).
    ///
    /// `ctx` is made current for the call: for the special handles (0, 1, 2) it picks which
    /// context's default stream is meant, so it should be the context of the foreign stream.
    pub fn wait_event(&self, ev: &Event, ctx: &Context) -> Result<()> {
        let _current = ctx.enter()?;
        // SAFETY: the stream handle is valid by `from_raw`'s contract; the event is live (owned by
        // `ev`).
        named("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(self.0, ev.raw, CU_EVENT_WAIT_DEFAULT)
        })
    }
}

/// A CUDA event of one context.
///
/// Created with `CU_EVENT_BLOCKING_SYNC`, so [`Event::synchronize`] sleeps instead of spinning a
/// core, and (except from [`Event::new_timing`]) `CU_EVENT_DISABLE_TIMING`, the cheapest kind.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    /// Invariant: created by `cuEventCreate` in `ctx`, destroyed only in `Drop` (or in the
    /// pool's, when it came from one and went back).
    raw: CUevent,
    /// Where `Drop` returns the handle instead of destroying it ([`EventPool::get`]).
    pool: Option<Arc<EventPool>>,
}

// SAFETY: a CUevent is a driver handle usable from any thread; the driver API is thread-safe.
unsafe impl Send for Event {}
// SAFETY: shared access only passes the handle to thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    fn with_flags(ctx: &Arc<Context>, flags: u32) -> Result<Event> {
        let _current = ctx.enter()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // Not `result::event::create`: it takes one flag, these are several or-ed together.
        // SAFETY: our context is current (guard); `raw` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw,
            pool: None,
        })
    }

    /// An event without timing (`CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC`).
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        Self::with_flags(
            ctx,
            CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
                | CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32,
        )
    }

    /// An event that records time (`CU_EVENT_BLOCKING_SYNC`), for [`Event::elapsed_ms`].
    pub fn new_timing(ctx: &Arc<Context>) -> Result<Event> {
        Self::with_flags(ctx, CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32)
    }

    /// The raw handle. Valid while this `Event` lives.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// Captures the work queued on `stream` so far (`cuEventRecord`).
    ///
    /// The stream must belong to the same device as the event.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if stream.context().ordinal() != self.ctx.ordinal() {
            return Err(CudaError::InvalidArgument {
                call: "Event::record",
                detail: format!(
                    "event of cuda:{} recorded on a stream of cuda:{}",
                    self.ctx.ordinal(),
                    stream.context().ordinal()
                ),
            });
        }
        // SAFETY: the stream is live (borrowed for the call) and of this event's device.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// Captures the work queued on a borrowed stream, such as torch's.
    pub fn record_foreign(&self, stream: &ForeignStream) -> Result<()> {
        // SAFETY: `ForeignStream::from_raw`'s contract keeps the handle valid.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// Captures the work queued on a raw stream handle.
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context, or one of the special handles
    /// 0, 1 or 2 (which then mean that context's default streams).
    pub unsafe fn record_raw(&self, stream: CUstream) -> Result<()> {
        let _current = self.ctx.enter()?;
        // SAFETY: the event is live (field invariant); the stream is valid by this function's
        // contract.
        named("cuEventRecord", unsafe {
            result::event::record(self.raw, stream)
        })
    }

    /// `true` once the captured work has completed (`cuEventQuery`); never blocks. An event never
    /// recorded counts as complete.
    pub fn query(&self) -> Result<bool> {
        self.ctx.check_fork()?;
        // SAFETY: the event is live (field invariant); the call needs no current context.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(other) => named("cuEventQuery", Err(other)),
        }
    }

    /// Blocks (sleeping, not spinning) until the captured work has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.check_fork()?;
        // SAFETY: the event is live (field invariant).
        named("cuEventSynchronize", unsafe {
            result::event::synchronize(self.raw)
        })
    }

    /// Milliseconds between two completed timing events (`cuEventElapsedTime`). Both must come
    /// from [`Event::new_timing`] and have been recorded and completed.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        start.ctx.check_fork()?;
        static HAS_V2: OnceLock<bool> = OnceLock::new();
        // cudarc's CUDA 13 bindings only expose the _v2 entry point (drivers >= 12.8); calling it
        // on an older driver would panic inside cudarc.
        if !*HAS_V2.get_or_init(|| has_symbol("cuEventElapsedTime_v2")) {
            return Err(CudaError::Unsupported {
                detail: "cuEventElapsedTime_v2 is missing; event timing needs a driver for CUDA 12.8 or newer"
                    .into(),
            });
        }
        let _current = start.ctx.enter()?;
        let mut ms = 0f32;
        // Not `result::event::elapsed`: it calls the older `cuEventElapsedTime` symbol.
        // SAFETY: both events are live (field invariant); `ms` is a valid out-pointer.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        if let Some(pool) = self.pool.take() {
            if pool.put(self.raw) {
                return;
            }
        }
        // SAFETY: the event is live and owned (field invariant). Destroying an event whose work is
        // still pending is allowed: the driver releases it once that work completes.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// Events of one context ([`Event::new`]'s kind) kept for reuse, so that work recording an
/// event per batch costs one `cuEventRecord`, not a `cuEventCreate` and a `cuEventDestroy` too:
/// every driver call of a batch is paid on its path (the driver serialises the calls of
/// threads sharing a context).
///
/// An event goes back to the pool when the [`Event`] from [`EventPool::get`] is dropped; its
/// handle has no other owner then, and re-recording it does not disturb the
/// `cuStreamWaitEvent`s already made on it (a stream waits for the record current when it was
/// told to wait).
#[derive(Debug)]
pub struct EventPool {
    ctx: Arc<Context>,
    /// Handles created by `cuEventCreate` in `ctx`, owned by the pool (no [`Event`] holds them).
    free: Mutex<Vec<CUevent>>,
}

// SAFETY: the pool holds driver handles, usable from any thread, behind a mutex.
unsafe impl Send for EventPool {}
// SAFETY: as for Send.
unsafe impl Sync for EventPool {}

/// Events the pool keeps at most; more are destroyed as they come back.
const EVENT_POOL_KEEP: usize = 1024;

impl EventPool {
    /// An empty pool of events of `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Arc<EventPool> {
        Arc::new(EventPool {
            ctx: Arc::clone(ctx),
            free: Mutex::new(Vec::new()),
        })
    }

    /// An event as [`Event::new`] makes, from the pool when it has one; dropping it gives it
    /// back.
    pub fn get(self: &Arc<Self>) -> Result<Event> {
        self.ctx.check_fork()?;
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut event = match reused {
            Some(raw) => Event {
                ctx: Arc::clone(&self.ctx),
                raw,
                pool: None,
            },
            None => Event::new(&self.ctx)?,
        };
        event.pool = Some(Arc::clone(self));
        Ok(event)
    }

    /// Events waiting in the pool.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Takes `raw` back; false when the pool is full (the caller destroys it).
    fn put(&self, raw: CUevent) -> bool {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() >= EVENT_POOL_KEEP {
            return false;
        }
        free.push(raw);
        true
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        for raw in self
            .free
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            // SAFETY: the pool owns the handle (field invariant); nothing else can use it.
            let _ = unsafe { result::event::destroy(raw) };
        }
    }
}
