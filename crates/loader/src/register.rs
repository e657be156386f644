//! The register reader: batches copied to the device straight from a read-only mapping of a
//! page-cached file, with no CPU copy.
//!
//! The file is mapped once. Its data is cut into windows of `window` bytes; a registrar thread
//! page-locks windows in order (`cuMemHostRegister` with the read-only flag; `mlock` on the host
//! backend) as ring slots, so at most `slots × window` bytes are locked at once: the pinned
//! budget. The copy thread copies each batch from the windows it lies in, and releases a window
//! with the fence of the last batch that read it; the registrar unregisters it only once that
//! fence has completed and then locks the next window in its place.
//!
//! Registering pages that are not in the page cache reads them from disk inside the driver, one
//! thread at a time, so `auto` picks this path only for files that are (mostly) cached.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pinfeed_cuda::{Context, Registration};
use pinfeed_source::{FileRegion, Source};

use crate::error::{LoaderError, Result};

/// Page size the windows are aligned to.
const PAGE: usize = 4096;

/// The largest window: big enough that registration costs little per byte, small enough that
/// several fit in a modest budget.
pub(crate) const MAX_WINDOW: usize = 64 << 20;

/// How records reach the device: the source crate's one reader type. The loader branches on
/// [`Reader::Register`] for this module's path and hands every other reader to the source;
/// `Auto` reads into slots.
pub use pinfeed_source::{Reader, UnknownReader};

/// A page-locked window, unlocked on drop.
enum WindowLock {
    Cuda(#[allow(dead_code)] Registration),
    Host { ptr: *mut u8, len: usize },
}

// SAFETY: the lock only remembers a range to unlock; it never touches the memory.
unsafe impl Send for WindowLock {}

impl Drop for WindowLock {
    fn drop(&mut self) {
        if let WindowLock::Host { ptr, len } = *self {
            // SAFETY: unlocking a range of our mapping that we locked.
            unsafe { libc::munlock(ptr.cast(), len) };
        }
    }
}

/// The mapped file, its windows, and the lock each ring slot holds.
pub(crate) struct MappedWindows {
    // Field order is drop order: locks are released before the mapping goes.
    locks: Vec<Mutex<Option<WindowLock>>>,
    /// Turns the `SIGBUS` of a copy from a page past a shrunk file's end into a page of zeroes
    /// and a count, which `lock` checks; released before the mapping goes.
    guard: pinfeed_source::MappingGuard,
    map: memmap2::Mmap,
    /// The file, for checking at each window that it still holds every byte of it.
    file: std::fs::File,
    path: PathBuf,
    ctx: Option<Arc<Context>>,
    window: usize,
    /// Index (in the whole-file grid) of the first window holding data.
    first_window: u64,
    pub(crate) windows_per_epoch: u64,
    data_offset: u64,
    /// Bytes of records from `data_offset`.
    data_len: u64,
}

impl MappedWindows {
    /// Maps the source's file and plans windows of at least `min_window` bytes, as many slots of
    /// them as fit in `budget` (see [`slots`](MappedWindows::slots)). `None` when the budget
    /// cannot hold two windows.
    pub(crate) fn new(
        source: &dyn Source,
        region: FileRegion<'_>,
        min_window: usize,
        budget: usize,
        ctx: Option<Arc<Context>>,
    ) -> Result<Option<MappedWindows>> {
        let window = (budget / 4)
            .min(MAX_WINDOW)
            .max(min_window + PAGE)
            .next_multiple_of(PAGE);
        let slots = (budget / window).min(16);
        if slots < 2 {
            return Ok(None);
        }
        // (Checked before the cap below, which may leave one slot for a one-window dataset.)
        // SAFETY: a read-only shared mapping. The CPU reads it only on the host backend; on
        // CUDA only the copy engine does, from pages registered (and so held) first. A file
        // truncated under the mapping makes registration fail with an error.
        let map = unsafe { memmap2::Mmap::map(region.file) }.map_err(|e| {
            LoaderError::Source(pinfeed_source::SourceError::Open {
                path: region.path.to_path_buf(),
                source: e,
            })
        })?;
        let data_end =
            region.data_offset + source.num_records() * source.layout().record_bytes() as u64;
        if (map.len() as u64) < data_end {
            return Err(LoaderError::Source(
                pinfeed_source::SourceError::Truncated {
                    path: region.path.to_path_buf(),
                    offset: 0,
                    expected: data_end,
                    found: map.len() as u64,
                },
            ));
        }
        let shrank = |e: String| LoaderError::Io {
            path: region.path.to_path_buf(),
            source: std::io::Error::other(format!(
                "cannot guard the mapping against the file shrinking: {e}"
            )),
        };
        // SAFETY: our own shared mapping of the file, which the guard (a field dropped before
        // `map`) never outlives; copies from it are checked at each window (`lock`).
        let guard =
            unsafe { pinfeed_source::guard_mapping(map.as_ptr(), map.len()) }.map_err(shrank)?;
        let file = region.file.try_clone().map_err(|e| {
            LoaderError::Source(pinfeed_source::SourceError::Open {
                path: region.path.to_path_buf(),
                source: e,
            })
        })?;
        let first_window = region.data_offset / window as u64;
        let last_window = (data_end - 1) / window as u64;
        let windows_per_epoch = last_window - first_window + 1;
        // No more slots than windows in an epoch: slots in flight then always hold distinct
        // windows, so the next epoch never registers a range that is still registered (the
        // driver refuses that).
        let slots = slots.min(usize::try_from(windows_per_epoch).unwrap_or(usize::MAX));
        let windows = MappedWindows {
            locks: (0..slots).map(|_| Mutex::new(None)).collect(),
            guard,
            map,
            file,
            path: region.path.to_path_buf(),
            ctx,
            window,
            first_window,
            windows_per_epoch,
            data_offset: region.data_offset,
            data_len: data_end - region.data_offset,
        };
        Ok(Some(windows))
    }

    pub(crate) fn slots(&self) -> usize {
        self.locks.len()
    }

    pub(crate) fn window_bytes(&self) -> usize {
        self.window
    }

    /// The mapping range `[start, end)` of window `seq` (counted across epochs).
    fn range(&self, seq: u64) -> (usize, usize) {
        let index = self.first_window + seq % self.windows_per_epoch;
        let start = index as usize * self.window;
        let end = (start + self.window).min(self.map.len().next_multiple_of(PAGE));
        (start, end)
    }

    /// Unlocks whatever slot `slot` held and locks window `seq` in it. Returns the bytes locked.
    ///
    /// The caller holds the ring's claim on `slot`, so no copy reads the old window any more.
    pub(crate) fn lock(&self, slot: usize, seq: u64) -> Result<usize> {
        let (start, end) = self.range(seq);
        self.check_size(end)?;
        let mut held = self.locks[slot].lock().unwrap_or_else(|p| p.into_inner());
        *held = None;
        // The mapping is page-aligned and `start` a multiple of the page size; the range ends at
        // most at the mapping's last page.
        let ptr = self.map.as_ptr().wrapping_add(start).cast_mut();
        let len = end - start;
        *held = Some(match &self.ctx {
            Some(ctx) => {
                // SAFETY: the range lies inside our mapping, which outlives the lock (field
                // order); registration is read-only as the mapping is.
                let registration =
                    unsafe { Registration::new(ctx, ptr, len, true) }.map_err(|e| {
                        LoaderError::Io {
                            path: self.path.clone(),
                            source: std::io::Error::other(format!(
                                "cannot register bytes {start}..{end} for direct copies: {e}"
                            )),
                        }
                    })?;
                WindowLock::Cuda(registration)
            }
            None => {
                // Best effort: the host backend copies with the CPU either way, and the lock
                // limit of small machines may refuse it.
                // SAFETY: the range lies inside our mapping.
                unsafe { libc::mlock(ptr.cast(), len) };
                WindowLock::Host { ptr, len }
            }
        });
        Ok(len)
    }

    /// The pieces of batch bytes `[a, b)` (offsets from record 0) in each window they touch:
    /// `(window seq offset from the epoch's first, source pointer, offset in the batch, length)`.
    pub(crate) fn pieces(&self, a: u64, b: u64) -> Vec<(u64, *const u8, usize, usize)> {
        let (a, b) = (a + self.data_offset, b + self.data_offset);
        let w = self.window as u64;
        let mut out = Vec::with_capacity(2);
        let mut at = a;
        while at < b {
            let index = at / w;
            let end = ((index + 1) * w).min(b);
            out.push((
                index - self.first_window,
                self.map.as_ptr().wrapping_add(at as usize),
                (at - a) as usize,
                (end - at) as usize,
            ));
            at = end;
        }
        out
    }

    /// Checks, before a batch is delivered, that the bytes `[.., end)` (offsets from record 0)
    /// it was copied from were the file's. On the host backend the CPU copies from the mapping,
    /// and a page past the end of a file that shrank reads as zeroes (the guard's page), so the
    /// copy is waited for and then the file's size and the guard's faults are checked. On CUDA
    /// the copy engine reads registered pages, which the driver holds and which never fault;
    /// the size is checked without waiting.
    pub(crate) fn check_copied(&self, fence: &crate::backend::CopyFence, end: u64) -> Result<()> {
        if self.ctx.is_none() {
            pinfeed_ring::Fence::wait(fence)?;
        }
        let end = usize::try_from(self.data_offset + end).unwrap_or(usize::MAX);
        self.check_size(end)
    }

    /// Checks that the file still holds the data up to byte `end` of the mapping and that no
    /// copy from the mapping has faulted: a file truncated while streaming is an error naming
    /// it, as with the other readers, and not a `SIGBUS` (locking or copying pages past the
    /// end of the file faults).
    fn check_size(&self, end: usize) -> Result<()> {
        let need = (end as u64).min(self.data_offset + self.data_len);
        // A failed fstat is an I/O fault of its own, not a file of length 0.
        let size = self
            .file
            .metadata()
            .map_err(|source| LoaderError::Io {
                path: self.path.clone(),
                source,
            })?
            .len();
        if size < need || self.guard.faults() != 0 {
            return Err(LoaderError::Source(
                pinfeed_source::SourceError::Truncated {
                    path: self.path.clone(),
                    offset: size.min(need),
                    expected: need,
                    found: size,
                },
            ));
        }
        Ok(())
    }

    /// Drops every lock; called once no copy may read any window.
    pub(crate) fn unlock_all(&self) {
        for lock in &self.locks {
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_truncated_while_streaming_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data\x1b[31m.bin");
        std::fs::write(&path, vec![7u8; 4 * PAGE]).unwrap();
        let layout = pinfeed_source::Layout::new(pinfeed_source::DType::uint8(), vec![64]).unwrap();
        let source = pinfeed_source::open_path(&path, Some(layout)).unwrap();
        let region = source.file().unwrap();
        let windows = MappedWindows::new(source.as_ref(), region, PAGE, 4 * PAGE, None)
            .unwrap()
            .unwrap();
        windows.lock(0, 0).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(10)
            .unwrap();
        let e = windows.lock(1, 1).unwrap_err().to_string();
        assert!(e.contains("data\\u{1b}[31m.bin"), "{e}");
        windows.unlock_all();
    }
}
