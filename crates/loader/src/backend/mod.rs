//! Where batches go: a CUDA device, or the host backend that stands in for one.
//!
//! The host backend runs the same pipeline with host memory as "device" memory, a copy thread
//! doing `memcpy` as the copy engine (in order, like one CUDA stream) and a completion flag as
//! the event, so everything but the copy engine itself is exercised on machines without a GPU.

mod device_memory;
mod fence;
mod host;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use pinfeed_cuda::{CUstream, Context, DevicePool, EventPool, PinMethod, Stream};

pub(crate) use device_memory::DeviceBudget;
pub use device_memory::DeviceMemory;
use device_memory::{
    is_legacy_stream, record_now, DeviceBufferCache, DeviceInner, HostBufferCache, LastUse,
};
pub use fence::{CopyFence, CudaFence, HostFlag};
#[cfg(test)]
pub(crate) use host::CopyGate;
use host::HostCopyEngine;

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
                cache: HostBufferCache::shared(),
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
            cache: HostBufferCache::shared(),
        })
    }

    pub(crate) fn device(&self) -> DeviceSpec {
        match self {
            Backend::Host { .. } => DeviceSpec::Cpu,
            Backend::Cuda { ctx, .. } => DeviceSpec::Cuda(ctx.ordinal()),
        }
    }

    /// Bytes of memory the device has: the machine's on the host backend, where batches live
    /// in host memory; `None` where it cannot be told. Read once a process (or a context):
    /// every loader start asks, and a driver or `/proc` call there shows in short passes.
    pub(crate) fn memory_total(&self) -> Option<u64> {
        static HOST_TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
        match self {
            Backend::Host { .. } => *HOST_TOTAL.get_or_init(crate::system::mem_total),
            Backend::Cuda { ctx, .. } => ctx.total_memory().ok().map(|total| total as u64),
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

    /// What GPU image decoding runs on: the copy stream, the memory pool and the events of a
    /// CUDA device; `None` on the host backend.
    pub(crate) fn gpu_decode_parts(
        &self,
    ) -> Option<(&Arc<Stream>, &Arc<DevicePool>, &Arc<EventPool>)> {
        match self {
            Backend::Host { .. } => None,
            Backend::Cuda {
                copy_stream,
                pool,
                events,
                ..
            } => Some((copy_stream, pool, events)),
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
            // SAFETY: forwarded from this function's contract.
            Backend::Host { engine, .. } => unsafe { engine.submit(src, dst as *mut u8, len) },
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
        self.ready.wait_before_reuse();
    }
}
