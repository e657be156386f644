//! The host backend's copy engine: a thread doing `memcpy` in submission order.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use super::fence::{CopyFence, HostFlag};
use crate::error::{LoaderError, Result};

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
    pub(super) fn start(gate: Option<Arc<CopyGate>>) -> Result<HostCopyEngine> {
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

impl HostCopyEngine {
    /// Queues a copy of `len` bytes from `src` to `dst` and returns the fence set once it is
    /// done.
    ///
    /// # Safety
    /// `src` and `dst` are valid for `len` bytes, do not overlap, and nothing else touches them
    /// until the fence completes.
    pub(super) unsafe fn submit(
        &self,
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) -> Result<CopyFence> {
        let done = Arc::new(HostFlag::default());
        let job = HostJob {
            src: SendPtr(src.cast_mut()),
            dst: SendPtr(dst),
            len,
            done: Arc::clone(&done),
        };
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or(LoaderError::Closed {
                what: "host copy engine",
            })?;
        Ok(CopyFence::Host(done))
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
