//! The direct path: batches copied to the device straight from a read-only mapping of a
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

/// How records reach the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReaderKind {
    /// `Pread`: on the H200 machine it streamed a page-cached file at about 43 GB/s with 8
    /// threads against about 16 GB/s for `Register`, whose registration runs at about 23 GB/s
    /// (docs/BENCHMARKS.md). `Register` costs far less CPU time, so it stays available.
    #[default]
    Auto,
    /// Readers copy records into pinned slots, reading files as the source was opened to
    /// read them (`pread`, the mapped gather of [`ReadMode::Mmap`](pinfeed_source::ReadMode),
    /// `O_DIRECT`, io_uring).
    Pread,
    /// Copies straight from a registered read-only mapping of the file.
    Register,
}

impl std::str::FromStr for ReaderKind {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(ReaderKind::Auto),
            // The mapped gather is the source's business: the loader's readers fill slots
            // either way.
            "pread" | "mmap" => Ok(ReaderKind::Pread),
            "register" => Ok(ReaderKind::Register),
            _ => Err(LoaderError::Config(format!(
                "unknown reader {s:?}: expected auto, pread, mmap or register"
            ))),
        }
    }
}

impl std::fmt::Display for ReaderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReaderKind::Auto => "auto",
            ReaderKind::Pread => "pread",
            ReaderKind::Register => "register",
        })
    }
}

/// Fraction of a file's pages in the page cache, sampled with `mincore` over its mapping.
pub(crate) fn cached_fraction(region: &FileRegion<'_>) -> Option<f64> {
    let len = region.file.metadata().ok()?.len() as usize;
    if len == 0 {
        return None;
    }
    // SAFETY: a read-only shared mapping we only pass to mincore; nothing reads through it.
    let map = unsafe { memmap2::Mmap::map(region.file) }.ok()?;
    let pages = len.div_ceil(PAGE);
    let mut resident = vec![0u8; pages];
    // SAFETY: `map` covers `len` bytes from a page-aligned address and `resident` has one byte
    // per page of it.
    let ok = unsafe { libc::mincore(map.as_ptr() as *mut _, len, resident.as_mut_ptr()) } == 0;
    ok.then(|| resident.iter().filter(|&&r| r & 1 == 1).count() as f64 / pages as f64)
}

/// How `--reader auto` reads a file, and why: through the page cache when the file is mostly in
/// it or fits comfortably in memory (the next epoch then reads from memory), with `pread` for
/// ranges and the mapped gather ([`ReadMode::Mmap`](pinfeed_source::ReadMode)) for shuffled
/// batches, which moved records 2.5 times faster than a `pread` per record when cached and
/// faster still when not (docs/BENCHMARKS.md); `O_DIRECT` when it is cold and larger than half
/// the memory available, where the page cache would only churn and copy twice.
pub fn auto_read_mode(path: &std::path::Path) -> (pinfeed_source::ReadMode, String) {
    use pinfeed_source::ReadMode;
    let Ok(file) = std::fs::File::open(path) else {
        return (ReadMode::Buffered, "not a single file".into());
    };
    let Ok(meta) = file.metadata() else {
        return (ReadMode::Buffered, "size unknown".into());
    };
    if !meta.is_file() {
        return (ReadMode::Buffered, "not a single file".into());
    }
    let region = FileRegion {
        file: &file,
        path,
        data_offset: 0,
    };
    let cached = cached_fraction(&region).unwrap_or(0.0);
    let available = meminfo("MemAvailable").unwrap_or(u64::MAX);
    if cached >= 0.5 {
        (
            ReadMode::Mmap,
            format!("{:.0}% page-cached", cached * 100.0),
        )
    } else if meta.len() > available / 2 {
        (
            ReadMode::Direct,
            format!(
                "{:.0}% page-cached and {:.1} GB against {:.1} GB of memory available",
                cached * 100.0,
                meta.len() as f64 / 1e9,
                available as f64 / 1e9
            ),
        )
    } else {
        (
            ReadMode::Mmap,
            format!("fits in memory ({:.0}% page-cached now)", cached * 100.0),
        )
    }
}

/// A `/proc/meminfo` figure in bytes (`"MemTotal"`, `"MemAvailable"`).
pub(crate) fn meminfo(key: &str) -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'))
        })?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

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
    map: memmap2::Mmap,
    path: PathBuf,
    ctx: Option<Arc<Context>>,
    window: usize,
    /// Index (in the whole-file grid) of the first window holding data.
    first_window: u64,
    pub(crate) windows_per_epoch: u64,
    data_offset: u64,
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
            return Err(LoaderError::Config(format!(
                "{}: the file is {} bytes, shorter than its {} bytes of records (did it shrink?)",
                region.path.display(),
                map.len(),
                data_end
            )));
        }
        let first_window = region.data_offset / window as u64;
        let last_window = (data_end - 1) / window as u64;
        let windows_per_epoch = last_window - first_window + 1;
        // No more slots than windows in an epoch: slots in flight then always hold distinct
        // windows, so the next epoch never registers a range that is still registered (the
        // driver refuses that).
        let slots = slots.min(usize::try_from(windows_per_epoch).unwrap_or(usize::MAX));
        let windows = MappedWindows {
            locks: (0..slots).map(|_| Mutex::new(None)).collect(),
            map,
            path: region.path.to_path_buf(),
            ctx,
            window,
            first_window,
            windows_per_epoch,
            data_offset: region.data_offset,
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
                let registration = unsafe { Registration::new(ctx, ptr, len, true) }.map_err(|e| {
                    LoaderError::Config(format!(
                        "{}: cannot register bytes {start}..{end} of the file for direct copies: {e}",
                        self.path.display()
                    ))
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

    /// Drops every lock; called once no copy may read any window.
    pub(crate) fn unlock_all(&self) {
        for lock in &self.locks {
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}
