//! The measurements: copy rates to the GPU from pinned and pageable memory, what page-locking a
//! batch costs, host memcpy and `mlock`, and a file's read rates from disk and the page cache.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use memmap2::{MmapMut, MmapOptions};
use pinfeed::PinMethod;
use pinfeed_cuda::{Context, CudaError, DevicePool, Event, PinnedMemory, Registration, Stream};

use super::probe::link_state;
use super::{
    BatchCost, FileReport, GpuCopies, GpuFacts, HostCopies, Rate, ReadRate, BATCH_BYTES, BIG,
    BUFFERED_LIMIT, COPY_SIZES, DIRECT_LIMIT, READ_TIME_CAP,
};

struct CopyTimer {
    start: Event,
    end: Event,
    events: bool,
}

impl CopyTimer {
    fn new(ctx: &Arc<Context>) -> Result<CopyTimer> {
        Ok(CopyTimer {
            start: Event::new_timing(ctx)?,
            end: Event::new_timing(ctx)?,
            events: true,
        })
    }

    /// Milliseconds one copy of `len` bytes from `src` to `dst` takes.
    ///
    /// # Safety
    /// `src` must be readable and `dst` a device allocation writable for `len` bytes.
    unsafe fn once(
        &mut self,
        stream: &Stream,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<f64> {
        if self.events {
            self.start.record(stream)?;
            // SAFETY: valid ranges by this function's contract; the copy completes before we
            // return (the end event is waited for).
            unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, len, stream)? };
            self.end.record(stream)?;
            self.end.synchronize()?;
            match Event::elapsed_ms(&self.start, &self.end) {
                Ok(ms) => return Ok(f64::from(ms)),
                // An older driver: time on the wall clock from now on.
                Err(CudaError::Unsupported { .. }) => self.events = false,
                Err(e) => return Err(e.into()),
            }
        }
        let t = Instant::now();
        // SAFETY: as above; the stream is synchronised before we return.
        unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, len, stream)? };
        stream.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// The median of `reps` copies, after one that warms up.
    ///
    /// # Safety
    /// As [`CopyTimer::once`].
    unsafe fn median(
        &mut self,
        stream: &Stream,
        dst: u64,
        src: *const u8,
        len: usize,
        reps: usize,
    ) -> Result<f64> {
        // SAFETY: forwarded contract.
        unsafe { self.once(stream, dst, src, len)? };
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            // SAFETY: forwarded contract.
            times.push(unsafe { self.once(stream, dst, src, len)? });
        }
        Ok(median(times))
    }
}

fn reps_for(bytes: usize) -> usize {
    if bytes >= BIG {
        5
    } else if bytes >= 16 << 20 {
        10
    } else {
        20
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The median milliseconds of `reps` runs of `f`.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                ms_since(t)
            })
            .collect(),
    )
}

/// The copy rates and the page-locking costs; about a second on a PCIe Gen5 GPU. Also reads the
/// link state while copies run (into `facts`).
pub(super) fn measure_gpu(ctx: &Arc<Context>, facts: &mut GpuFacts) -> Result<GpuCopies> {
    let stream = Stream::new(ctx)?;
    let pool = DevicePool::new(ctx)?;
    let dst = pool.alloc_async(BIG, &stream)?;
    stream.synchronize()?;

    let t = Instant::now();
    let pinned = PinnedMemory::alloc(ctx, BIG, PinMethod::HostAlloc)?;
    let host_alloc_256mib_ms = ms_since(t);
    // SAFETY: `pinned` holds BIG bytes and nothing else uses it yet.
    unsafe { std::ptr::write_bytes(pinned.as_ptr(), 1, BIG) };
    // Filled, so its pages are real and not the shared zero page.
    let pageable = vec![1u8; BIG];

    let buffers = Buffers {
        stream: &stream,
        dst: dst.ptr(),
        pinned: pinned.as_ptr(),
        pageable: pageable.as_ptr(),
    };
    let result = measure_copies(ctx, &buffers, facts, host_alloc_256mib_ms);
    // A failure may leave copies queued that still read the buffers: wait before they drop.
    let _ = stream.synchronize();
    result
}

/// The three buffers of [`measure_gpu`], each BIG bytes, and the stream that copies between them.
struct Buffers<'a> {
    stream: &'a Stream,
    dst: u64,
    pinned: *const u8,
    pageable: *const u8,
}

fn measure_copies(
    ctx: &Arc<Context>,
    b: &Buffers<'_>,
    facts: &mut GpuFacts,
    host_alloc_256mib_ms: f64,
) -> Result<GpuCopies> {
    let stream = b.stream;
    let mut timer = CopyTimer::new(ctx)?;
    let mut rates = |src: *const u8| -> Result<Vec<Rate>> {
        COPY_SIZES
            .iter()
            .map(|&len| {
                // SAFETY: `src` and `b.dst` hold BIG bytes each and outlive this function
                // (`Buffers`); `len <= BIG`; each copy is waited for.
                let ms = unsafe { timer.median(stream, b.dst, src, len, reps_for(len))? };
                Ok(Rate::new(len, ms))
            })
            .collect()
    };
    let pinned_rates = rates(b.pinned)?;
    let pageable_rates = rates(b.pageable)?;

    // The link state under load: queue a few hundred milliseconds of copies at most, read sysfs
    // while they run.
    if let Some(dir) = facts.link.sysfs.clone() {
        for _ in 0..8 {
            // SAFETY: both buffers hold BIG bytes and outlive the copies (`measure_gpu`
            // synchronises the stream before they drop).
            unsafe { pinfeed_cuda::memcpy_htod_async(b.dst, b.pinned, BIG, stream)? };
        }
        std::thread::sleep(Duration::from_millis(5));
        facts.link.under_load = Some(link_state(Path::new(&dir), "current"));
        stream.synchronize()?;
    }

    let batch = measure_batch(ctx, b, &mut timer)?;
    Ok(GpuCopies {
        timing: if timer.events { "events" } else { "wall" },
        pinned: pinned_rates,
        pageable: pageable_rates,
        host_alloc_256mib_ms,
        batch,
    })
}

/// One batch: fresh page-locked memory (what pin_memory() does for each batch) against
/// registering memory that already exists, against copying it.
fn measure_batch(ctx: &Arc<Context>, b: &Buffers<'_>, timer: &mut CopyTimer) -> Result<BatchCost> {
    let stream = b.stream;
    let mut alloc = Vec::new();
    let mut free = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let memory = PinnedMemory::alloc(ctx, BATCH_BYTES, PinMethod::HostAlloc)?;
        alloc.push(ms_since(t));
        let t = Instant::now();
        drop(memory);
        free.push(ms_since(t));
    }
    let mut buffer = MmapMut::map_anon(BATCH_BYTES).context("mmap of a batch buffer")?;
    buffer[..].fill(1);
    let mut register = Vec::new();
    let mut unregister = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        // SAFETY: the mapping is ours, read-write, and outlives the registration, which no copy
        // uses.
        let registration =
            unsafe { Registration::new(ctx, buffer[..].as_mut_ptr(), BATCH_BYTES, false)? };
        register.push(ms_since(t));
        let t = Instant::now();
        drop(registration);
        unregister.push(ms_since(t));
    }
    // SAFETY: as for the rates above; BATCH_BYTES <= BIG.
    let pinned_copy_ms = unsafe { timer.median(stream, b.dst, b.pinned, BATCH_BYTES, 20)? };
    // SAFETY: as above.
    let pageable_copy_ms = unsafe { timer.median(stream, b.dst, b.pageable, BATCH_BYTES, 20)? };

    Ok(BatchCost {
        bytes: BATCH_BYTES,
        host_alloc_ms: median(alloc),
        free_host_ms: median(free),
        register_ms: median(register),
        unregister_ms: median(unregister),
        pinned_copy_ms,
        pageable_copy_ms,
    })
}

/// An anonymous private mapping: page-aligned, as O_DIRECT and `mlock` want it.
/// Fresh mapping + `mlock` of `len` bytes, then `munlock` + `munmap`: `(lock ms, unlock ms)`.
fn mlock_once(len: usize) -> io::Result<(f64, f64)> {
    let t = Instant::now();
    let mapping = MmapMut::map_anon(len)?;
    mapping.lock()?;
    let lock = ms_since(t);
    let t = Instant::now();
    mapping.unlock()?;
    drop(mapping);
    Ok((lock, ms_since(t)))
}

/// memcpy rates on one and on all cores, a batch's memcpy and `mlock` costs; well under a second.
pub(super) fn measure_host(available: Option<u64>) -> HostCopies {
    // Source and destination must fit with room to spare.
    let mut bytes = BIG;
    if let Some(available) = available {
        while bytes > (1 << 20) && (bytes as u64) * 4 > available {
            bytes /= 2;
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let src = vec![1u8; bytes];
    let mut dst = vec![2u8; bytes];

    let one = median_ms(3, || dst.copy_from_slice(&src));
    let chunk = bytes.div_ceil(threads);
    let all = median_ms(3, || {
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        })
    });
    let batch = BATCH_BYTES.min(bytes);
    let batch_memcpy_ms = median_ms(21, || dst[..batch].copy_from_slice(&src[..batch]));

    let mut report = HostCopies {
        bytes,
        threads,
        memcpy_1_thread_gbps: Rate::new(bytes, one).gbps,
        memcpy_all_threads_gbps: Rate::new(bytes, all).gbps,
        batch_bytes: batch,
        batch_memcpy_ms,
        ..HostCopies::default()
    };
    let mut lock = Vec::new();
    let mut unlock = Vec::new();
    for _ in 0..5 {
        match mlock_once(BATCH_BYTES) {
            Ok((l, u)) => {
                lock.push(l);
                unlock.push(u);
            }
            Err(e) => {
                report.mlock_error = Some(e.to_string());
                return report;
            }
        }
    }
    report.batch_mlock_ms = Some(median(lock));
    report.batch_munlock_ms = Some(median(unlock));
    report
}

/// The fraction of `offset .. offset + len` of `file` in the page cache (`mincore` over a
/// read-only mapping, 1 GiB at a time).
fn cached_fraction(file: &File, offset: u64, len: u64) -> io::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let start = offset / page * page;
    let end = offset + len;
    if end <= start {
        return Ok(1.0);
    }
    const WINDOW: u64 = 1 << 30;
    let mut vec = vec![0u8; (WINDOW / page) as usize];
    let (mut resident, mut total) = (0u64, 0u64);
    let mut at = start;
    while at < end {
        let window = (end - at).min(WINDOW) as usize;
        // SAFETY: another process may change the file under a shared mapping, which would break
        // a `&[u8]` over it; this one is never read, only passed to mincore, so nothing observes
        // such a change. memmap2 unmaps it when dropped.
        let mapping = unsafe { MmapOptions::new().offset(at).len(window).map(file)? };
        let ptr = mapping.as_ptr().cast_mut().cast::<libc::c_void>();
        let pages = window.div_ceil(page as usize);
        // SAFETY: `ptr .. ptr + window` is the mapping just made (page-aligned); `vec` holds at
        // least one byte for each of its pages.
        let status = unsafe { libc::mincore(ptr, window, vec.as_mut_ptr()) };
        let error = io::Error::last_os_error();
        drop(mapping);
        if status != 0 {
            return Err(error);
        }
        resident += vec[..pages].iter().filter(|&&b| b & 1 != 0).count() as u64;
        total += pages as u64;
        at += window as u64;
    }
    Ok(resident as f64 / total.max(1) as f64)
}

/// Sequential `pread`s of `buf.len()` bytes from offset 0, up to `limit` bytes or
/// [`READ_TIME_CAP`].
fn read_pass(
    file: &File,
    buf: &mut [u8],
    limit: u64,
    cached_before: Option<f64>,
) -> io::Result<ReadRate> {
    let t = Instant::now();
    let mut offset = 0u64;
    while offset < limit && t.elapsed() < READ_TIME_CAP {
        let n = file.read_at(buf, offset)?;
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(ReadRate {
        bytes: offset,
        seconds,
        gbps: offset as f64 / seconds.max(1e-9) / 1e9,
        cached_before,
    })
}

/// Size, page-cache residency, the disk's rate (O_DIRECT, which the cache does not serve) and the
/// buffered rate, cold as found and again once cached. At most three passes of [`READ_TIME_CAP`].
pub(super) fn measure_file(path: &Path, file: &File) -> Result<FileReport> {
    let size = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut report = FileReport {
        path: path.display().to_string(),
        size_bytes: size,
        ..FileReport::default()
    };
    if size == 0 {
        return Ok(report);
    }
    report.cached_fraction = cached_fraction(file, 0, size).ok();

    // O_DIRECT first: it neither fills nor empties the page cache, so the buffered pass after
    // still sees the cache as it was.
    let direct_len = size.min(DIRECT_LIMIT);
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Err(e) => report.direct_refused = Some(format!("O_DIRECT open refused: {e}")),
        Ok(direct) => {
            let mut buf = MmapMut::map_anon(4 << 20).context("mmap of a read buffer")?;
            match read_pass(&direct, &mut buf[..], direct_len, None) {
                Ok(rate) => report.direct = Some(rate),
                Err(e) => report.direct_refused = Some(format!("O_DIRECT read refused: {e}")),
            }
        }
    }

    let buffered_len = size.min(BUFFERED_LIMIT);
    let mut buf = vec![0u8; 8 << 20];
    let before = cached_fraction(file, 0, buffered_len).ok();
    let first = read_pass(file, &mut buf, buffered_len, before)
        .with_context(|| format!("cannot read {}", path.display()))?;
    report.buffered = Some(first);
    let after = cached_fraction(file, 0, first.bytes).unwrap_or(0.0);
    if before.is_some_and(|b| b >= 0.99) {
        report.buffered_again_skipped = Some("already cached before the first pass".into());
    } else if after < 0.9 {
        report.buffered_again_skipped = Some(format!(
            "the page cache kept only {:.0}% of what was read",
            after * 100.0
        ));
    } else {
        report.buffered_again = Some(
            read_pass(file, &mut buf, first.bytes, Some(after))
                .with_context(|| format!("cannot read {}", path.display()))?,
        );
    }
    Ok(report)
}

// ------------------------------------------------------------------------------------------
// Advice
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_cache_residency_of_a_file_just_written() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 1 << 20]).unwrap();
        let fraction = cached_fraction(file.as_file(), 0, 1 << 20).unwrap();
        assert!((0.0..=1.0).contains(&fraction), "{fraction}");
        let report = measure_file(file.path(), file.as_file()).unwrap();
        assert_eq!(report.size_bytes, 1 << 20);
        assert_eq!(report.buffered.unwrap().bytes, 1 << 20);
    }
}
