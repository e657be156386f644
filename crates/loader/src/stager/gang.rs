//! The threads that fill arena pieces with a parallel `memcpy`.

use super::*;

/// What gang threads take one at a time: small enough that a thread the scheduler delays (16
/// copy threads on 16 cores share them with the driver and the caller) holds the piece up by
/// little, large enough that taking one costs nothing beside copying it.
pub(super) const CHUNK: usize = 256 << 10;

/// One `memcpy` shared by the gang: its threads take chunks until none is left.
pub(super) struct Job {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    /// The next chunk to take.
    next: AtomicUsize,
    /// Chunks copied so far; `all_copied` is signalled when it reaches the count.
    copied: Mutex<usize>,
    all_copied: Condvar,
}

// SAFETY: the two ranges are disjoint, and the sender keeps them valid and touches them in no
// other way until every chunk is copied (`CopyGang::copy` waits for that); a thread that takes
// the job later finds no chunk left and dereferences neither pointer.
unsafe impl Send for Job {}
// SAFETY: as above; threads share only the atomic counter and the mutex, and each chunk index
// is taken by one thread alone.
unsafe impl Sync for Job {}

impl Job {
    pub(super) fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK)
    }

    /// Copies chunks until none is left to take.
    pub(super) fn work(&self) {
        let chunks = self.chunks();
        let mut mine = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks {
                break;
            }
            let at = i * CHUNK;
            let len = CHUNK.min(self.len - at);
            // SAFETY: chunk `i` lies inside both ranges, which stay valid until all chunks are
            // copied (see `Job`), and no other thread takes the same index.
            unsafe { std::ptr::copy_nonoverlapping(self.src.add(at), self.dst.add(at), len) };
            mine += 1;
        }
        if mine > 0 {
            // The lock also publishes this thread's writes to the caller that waits on it.
            let mut copied = self.copied.lock().unwrap_or_else(|p| p.into_inner());
            *copied += mine;
            if *copied == chunks {
                self.all_copied.notify_one();
            }
        }
    }
}

/// Threads that share each `memcpy` of an upload, chunk by chunk. Started with the stager and
/// parked on a channel between copies, so that an upload of a few MB (a prefetched batch) is
/// copied by as many threads as it has chunks without paying to start them.
pub(super) struct CopyGang {
    pub(super) helpers: Vec<mpsc::Sender<Arc<Job>>>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
}

impl CopyGang {
    /// Starts `helpers` threads (the caller of [`copy`](CopyGang::copy) is one more).
    pub(super) fn start(helpers: usize) -> Result<CopyGang> {
        let mut gang = CopyGang {
            helpers: Vec::with_capacity(helpers),
            threads: Vec::with_capacity(helpers),
        };
        for _ in 0..helpers {
            let (tx, rx) = mpsc::channel::<Arc<Job>>();
            let thread = std::thread::Builder::new()
                .name("pinfeed-copy".into())
                .spawn(move || {
                    for job in rx {
                        job.work();
                    }
                })
                .map_err(|source| LoaderError::Thread {
                    what: "arena copy",
                    source,
                })?;
            gang.helpers.push(tx);
            gang.threads.push(thread);
        }
        Ok(gang)
    }

    /// Copies `src` into the start of `dst`, shared by the gang (one thread for small copies).
    pub(super) fn copy(&self, dst: &mut [u8], src: &[u8]) {
        let dst = &mut dst[..src.len()];
        // No more helpers than chunks beyond the caller's first.
        let helpers = self
            .helpers
            .len()
            .min((src.len() / CHUNK).saturating_sub(1));
        if helpers == 0 {
            dst.copy_from_slice(src);
            return;
        }
        let job = Arc::new(Job {
            dst: dst.as_mut_ptr(),
            src: src.as_ptr(),
            len: src.len(),
            next: AtomicUsize::new(0),
            copied: Mutex::new(0),
            all_copied: Condvar::new(),
        });
        for helper in &self.helpers[..helpers] {
            // A helper that is gone (it cannot be: they stop only when the gang is dropped)
            // leaves its chunks to the others.
            let _ = helper.send(Arc::clone(&job));
        }
        job.work();
        let chunks = job.chunks();
        let mut copied = job.copied.lock().unwrap_or_else(|p| p.into_inner());
        while *copied < chunks {
            copied = job
                .all_copied
                .wait(copied)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for CopyGang {
    fn drop(&mut self) {
        // Closing the channels ends the helpers' loops.
        self.helpers.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
