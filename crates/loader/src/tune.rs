//! How many CPU threads copy into pinned memory, chosen from the machine rather than fixed.
//!
//! Every byte a reader or a stager copy thread moves into a pinned slot passes through one CPU
//! `memcpy` (or the kernel's copy of a `pread`), and the copy engine drains the slots at the
//! bus's rate. Enough threads keep the bus busy; each thread more makes every thread's copy
//! dearer. How many are enough differs even between hosts of one kind, where one thread copies
//! more slowly on some than on others, so no fixed count suits them all (docs/BENCHMARKS.md,
//! "What limits each path").
//!
//! So the count comes from two rates measured once per boot of the machine (a fresh start of a
//! cloud machine may be another host): one thread's copy rate from pageable into pinned memory,
//! and the bus's rate from pinned memory to the device. The threads are the fewest whose
//! summed copy rate is [`HEADROOM`] times the bus, at most one per core. The measurement (two
//! passes over 512 MiB of pageable memory, and 24 copies of 32 MiB; its time is not recorded)
//! is kept in a file per boot (see [`cache_dir`]) and in the process, so later loaders and
//! processes on the machine read it instead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use pinfeed_cuda::{Context, DevicePool, PinMethod, PinnedMemory, Stream};

use crate::Result;

/// The cores this process may run on: the one rule, the source crate's.
pub use pinfeed_source::system::cores;

/// How much faster than the bus the copy threads together must be. Pieces are filled while the
/// copy engine drains others, and a thread the scheduler delays holds its piece up, so threads
/// whose rates only add up to the bus's leave it idle part of the time; this margin is the one
/// that kept it busy where thread counts were swept.
pub const HEADROOM: f64 = 1.6;

/// Threads used when the bus's rate is unknown (the host backend, or a measurement that
/// failed): one per core, at most this many.
pub const FALLBACK_MAX_THREADS: usize = 8;

/// The most threads a loader or stager is asked to start: more than any machine has cores,
/// and few enough that their stacks never exhaust the process's address space or the
/// system's thread limit (100 000 of them would).
pub const MAX_THREADS: usize = 1024;

/// The one rule for an asked-for thread count, for every entry point: `1 ..= MAX_THREADS`.
pub fn check_threads(threads: usize) -> crate::Result<()> {
    if (1..=MAX_THREADS).contains(&threads) {
        return Ok(());
    }
    Err(crate::LoaderError::Config(format!(
        "threads must be between 1 and {MAX_THREADS} (or None for pinfeed's choice), not \
         {threads}"
    )))
}

/// A machine's rates, as measured at start-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineRates {
    /// GB/s one CPU thread copies from pageable into pinned memory while others do the same
    /// (four threads, a source larger than the last-level cache, in 256 KiB pieces, as the
    /// stager's copy threads take them).
    pub copy_gbps: f64,
    /// GB/s the copy engine moves from pinned memory to the device.
    pub bus_gbps: f64,
}

/// How many threads, and why, in words for stats.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadChoice {
    /// The thread count.
    pub threads: usize,
    /// The rates it was chosen from, where known.
    pub rates: Option<MachineRates>,
    /// Why this count, in words.
    pub reason: String,
}

/// The rule: the fewest threads whose summed copy rate is [`HEADROOM`] times the bus, at least
/// one and at most `cores`; [`FALLBACK_MAX_THREADS`] (or `cores`, if fewer) without rates.
pub fn threads_for(rates: Option<MachineRates>, cores: usize) -> ThreadChoice {
    let cores = cores.max(1);
    let Some(r) = rates.filter(|r| r.copy_gbps > 0.0 && r.bus_gbps > 0.0) else {
        let threads = cores.min(FALLBACK_MAX_THREADS);
        return ThreadChoice {
            threads,
            rates: None,
            reason: format!(
                "{threads}: one per core up to {FALLBACK_MAX_THREADS} (bus rate unknown)"
            ),
        };
    };
    let wanted = (HEADROOM * r.bus_gbps / r.copy_gbps).ceil().max(1.0) as usize;
    let threads = wanted.min(cores);
    let capped = if wanted > cores {
        format!(", capped at {cores} cores")
    } else {
        String::new()
    };
    ThreadChoice {
        threads,
        rates: Some(r),
        reason: format!(
            "{threads}: {HEADROOM} × the bus ({:.1} GB/s) over one thread's copy rate ({:.1} GB/s){capped}",
            r.bus_gbps, r.copy_gbps
        ),
    }
}

/// Slots a loader with `threads` readers keeps, before its pinned budget, [`crate::MAX_SLOTS`]
/// and the pieces of its whole run cap them: one for every reader, a few for the copy engine
/// and the rest queued; more would only lock more memory (and take longer to lock at start-up).
pub const fn slots_for_readers(threads: usize) -> usize {
    2 * threads + 6
}

/// Readers per core of a source that reads over the network (object storage) when
/// `num_threads` is not given, up to [`NETWORK_MAX_READERS`]: each reader spends most of its
/// time waiting for a reply rather than copying, so the copy-rate rule's count leaves the
/// server idle (docs/BENCHMARKS.md, "Object storage").
pub const NETWORK_READERS_PER_CORE: usize = 4;

/// The most readers [`for_network`] asks for.
pub const NETWORK_MAX_READERS: usize = 16;

/// `choice` for a source that reads over the network on `cores` cores: raised to
/// [`NETWORK_READERS_PER_CORE`] per core, at most [`NETWORK_MAX_READERS`].
pub fn for_network(choice: ThreadChoice, cores: usize) -> ThreadChoice {
    let wanted = (NETWORK_READERS_PER_CORE * cores.max(1)).min(NETWORK_MAX_READERS);
    if choice.threads >= wanted {
        return choice;
    }
    ThreadChoice {
        threads: wanted,
        rates: choice.rates,
        reason: format!(
            "{wanted}: readers of object storage wait on the network, \
             {NETWORK_READERS_PER_CORE} a core up to {NETWORK_MAX_READERS} (the copy rates \
             alone gave {})",
            choice.reason
        ),
    }
}

/// The thread count for copies to device `ctx` (measured, or read from the cache), or the
/// fallback where there is no device or the measurement fails (the reason says which).
/// `pinned_budget` is what the caller may page-lock: a measurement needs [`PROBE_PINNED`] of
/// it (before the caller's own pool exists), so a smaller budget only reads known rates.
pub(crate) fn choose(ctx: Option<&Arc<Context>>, pinned_budget: usize) -> ThreadChoice {
    match ctx {
        Some(ctx) => choose_within(ctx, pinned_budget >= PROBE_PINNED),
        None => threads_for(None, cores()),
    }
}

/// `choose` for a device: what a loader or stager on `ctx` starts unless told otherwise.
pub fn choose_for(ctx: &Arc<Context>) -> ThreadChoice {
    choose_within(ctx, true)
}

fn choose_within(ctx: &Arc<Context>, may_measure: bool) -> ThreadChoice {
    match machine_rates(ctx, may_measure) {
        Ok(Some(rates)) => threads_for(Some(rates), cores()),
        Ok(None) => {
            let mut choice = threads_for(None, cores());
            choice.reason = format!(
                "{}; the pinned budget is below the {} MiB measuring the machine needs",
                choice.reason,
                PROBE_PINNED >> 20
            );
            choice
        }
        Err(e) => {
            let mut choice = threads_for(None, cores());
            choice.reason = format!("{}; measuring the machine failed: {e}", choice.reason);
            choice
        }
    }
}

static RATES: OnceLock<Mutex<HashMap<usize, MachineRates>>> = OnceLock::new();

/// This machine's rates for device `ctx`: from this process's memory, the boot's cache file,
/// or (where `may_measure`) a fresh measurement, then written to both; `None` where they are
/// not known and may not be measured.
pub fn machine_rates(ctx: &Arc<Context>, may_measure: bool) -> Result<Option<MachineRates>> {
    let ordinal = ctx.ordinal();
    let known = RATES.get_or_init(Mutex::default);
    // Held across the measurement, so that loaders started at once measure once.
    let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = known.get(&ordinal) {
        return Ok(Some(*r));
    }
    let path = cache_file(ordinal);
    let rates = match path.as_ref().and_then(|p| read_cache(p)) {
        Some(r) => r,
        None if !may_measure => return Ok(None),
        None => {
            let r = measure(ctx)?;
            if let Some(p) = &path {
                write_cache(p, r); // best effort: a read-only home only costs a re-measure
            }
            r
        }
    };
    known.insert(ordinal, rates);
    Ok(Some(rates))
}

/// Where the per-boot file lives: [`pinfeed_source::system::cache_dir`].
pub fn cache_dir() -> Option<PathBuf> {
    pinfeed_source::system::cache_dir()
}

/// The file for device `ordinal` in this boot.
fn cache_file(ordinal: usize) -> Option<PathBuf> {
    let boot = boot_id()?;
    Some(cache_dir()?.join(format!("machine-{boot}-cuda{ordinal}.txt")))
}

/// The kernel's id of this boot, which names the per-boot cache files.
pub(crate) fn boot_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    if boot.is_empty() || !boot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return None;
    }
    Some(boot.to_owned())
}

/// `copy_gbps X` and `bus_gbps Y` lines; anything else (a partial or foreign file) is no cache.
pub(crate) fn parse_cache(text: &str) -> Option<MachineRates> {
    let mut copy = None;
    let mut bus = None;
    for line in text.lines() {
        let (key, value) = line.split_once(' ')?;
        let value: f64 = value.trim().parse().ok()?;
        if !(value.is_finite() && value > 0.0) {
            return None;
        }
        match key {
            "copy_gbps" => copy = Some(value),
            "bus_gbps" => bus = Some(value),
            _ => return None,
        }
    }
    Some(MachineRates {
        copy_gbps: copy?,
        bus_gbps: bus?,
    })
}

fn read_cache(path: &std::path::Path) -> Option<MachineRates> {
    parse_cache(&std::fs::read_to_string(path).ok()?)
}

/// Writes through a file of this process's own and a rename, so that a reader sees a whole
/// file or none, whatever other processes of the boot do at once.
fn write_cache(path: &std::path::Path, r: MachineRates) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".machine-{}.tmp", std::process::id()));
    let text = format!("copy_gbps {:.3}\nbus_gbps {:.3}\n", r.copy_gbps, r.bus_gbps);
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// A pageable source larger than the last-level caches seen on GPU hosts (up to 300 MiB), so
/// the copy reads memory, not cache.
const PROBE_SOURCE: usize = 512 << 20;
/// The pinned destination, written round and round (the stager's arena is 64 MiB).
const PROBE_PINNED: usize = 32 << 20;
const PROBE_CHUNK: usize = 256 << 10;
/// Threads the copy rate is measured with, each on its own quarter: one thread alone copies
/// faster than each of several sharing the memory bus, and the loader runs several.
const PROBE_THREADS: usize = 4;

fn measure(ctx: &Arc<Context>) -> Result<MachineRates> {
    ctx.bind()?;
    let pinned = PinnedMemory::alloc(ctx, PROBE_PINNED, PinMethod::HostAlloc)?;
    // SAFETY: the allocation holds PROBE_PINNED bytes, page-locked, used by nothing else; the
    // slice is dropped before it.
    let dst = unsafe { std::slice::from_raw_parts_mut(pinned.as_ptr(), PROBE_PINNED) };
    let src: Vec<u8> = (0..PROBE_SOURCE).map(|i| (i >> 12) as u8).collect();
    let mut best = f64::MAX;
    for _ in 0..2 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let quarters = src.chunks(PROBE_SOURCE / PROBE_THREADS);
            for (from, to) in quarters.zip(dst.chunks_mut(PROBE_PINNED / PROBE_THREADS)) {
                s.spawn(move || {
                    for (i, piece) in from.chunks(PROBE_CHUNK).enumerate() {
                        let at = i * PROBE_CHUNK % to.len();
                        to[at..at + piece.len()].copy_from_slice(piece);
                    }
                });
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let copy_gbps = PROBE_SOURCE as f64 / best / 1e9 / PROBE_THREADS as f64;
    drop(src);

    let stream = Stream::new(ctx)?;
    let pool = DevicePool::new(ctx)?;
    let device = pool.alloc_async(PROBE_PINNED, &stream)?;
    let copies = 8;
    let mut best = f64::MAX;
    for round in 0..3 {
        stream.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..copies {
            // SAFETY: both sides hold PROBE_PINNED bytes and outlive the synchronise below;
            // nothing writes the pinned memory meanwhile.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    device.ptr(),
                    pinned.as_ptr(),
                    PROBE_PINNED,
                    &stream,
                )?
            };
        }
        stream.synchronize()?;
        if round > 0 {
            best = best.min(t0.elapsed().as_secs_f64()); // the first round warms the path up
        }
    }
    let bus_gbps = (copies * PROBE_PINNED) as f64 / best / 1e9;
    Ok(MachineRates {
        copy_gbps,
        bus_gbps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_sources_get_readers_by_core() {
        let two = for_network(threads_for(None, 2), 2);
        assert_eq!(two.threads, 8);
        assert!(two.reason.contains("wait on the network"), "{}", two.reason);
        assert!(two.reason.contains("2: one per core"), "{}", two.reason);
        assert_eq!(
            for_network(threads_for(rates(7.6, 55.0), 16), 16).threads,
            16
        );
        let many = for_network(threads_for(rates(2.0, 55.0), 32), 32);
        assert_eq!(many.threads, 32);
        assert!(!many.reason.contains("network"));
    }

    fn rates(copy_gbps: f64, bus_gbps: f64) -> Option<MachineRates> {
        Some(MachineRates {
            copy_gbps,
            bus_gbps,
        })
    }

    #[test]
    fn threads_cover_the_bus_with_headroom_within_the_cores() {
        // 1.6 × 55 / 7.6 = 11.6: twelve threads.
        assert_eq!(threads_for(rates(7.6, 55.0), 16).threads, 12);
        // A host where a thread copies half as fast wants 20: every core.
        let slow = threads_for(rates(4.4, 55.0), 16);
        assert_eq!(slow.threads, 16);
        assert!(
            slow.reason.contains("capped at 16 cores"),
            "{}",
            slow.reason
        );
        // A fast CPU on a slow link needs few.
        assert_eq!(threads_for(rates(10.0, 12.0), 16).threads, 2);
        assert_eq!(threads_for(rates(100.0, 1.0), 16).threads, 1);
    }

    #[test]
    fn without_rates_one_thread_per_core_up_to_the_fallback() {
        assert_eq!(threads_for(None, 16).threads, FALLBACK_MAX_THREADS);
        assert_eq!(threads_for(None, 3).threads, 3);
        assert_eq!(threads_for(None, 0).threads, 1);
        assert_eq!(
            threads_for(rates(0.0, 55.0), 16).threads,
            FALLBACK_MAX_THREADS
        );
        assert!(threads_for(None, 16).reason.contains("bus rate unknown"));
        assert_eq!(
            choose(None, 1 << 30).threads,
            cores().min(FALLBACK_MAX_THREADS)
        );
    }

    #[test]
    fn the_cache_file_reads_back_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("pinfeed-tune-{}", std::process::id()));
        let path = dir.join("machine-test.txt");
        write_cache(&path, rates(7.912, 55.25).unwrap());
        assert_eq!(read_cache(&path), rates(7.912, 55.25));
        assert_eq!(parse_cache("copy_gbps 7.9\n"), None, "no bus");
        assert_eq!(parse_cache("copy_gbps 7.9\nbus_gbps x\n"), None);
        assert_eq!(parse_cache("copy_gbps 7.9\nbus_gbps -1\n"), None);
        assert_eq!(parse_cache("copy_gbps 7.9\nbus_gbps 55\nother 1\n"), None);
        assert_eq!(parse_cache(""), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
