//! When a copy out of a slot has finished: a CUDA event or the host copy engine's flag.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use pinfeed_cuda::{CudaError, Event, Stream};

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
    pub(super) fn record(
        event: Event,
        stream: &Stream,
    ) -> std::result::Result<CudaFence, CudaError> {
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
    /// Blocks until the memory this copy writes may go back to its cache: on the host backend
    /// the copy thread writes into it until the flag is set; CUDA memory goes back to its
    /// device's cache at once, where it is reused in stream order (`DeviceBufferCache`).
    pub(crate) fn wait_before_reuse(&self) {
        if !matches!(self, CopyFence::Cuda(_)) {
            let _ = pinfeed_ring::Fence::wait(self);
        }
    }

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
    pub(super) fn set(&self) {
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
