//! The CPU-time floor of a staging copy: how fast the CPU copies pageable memory into a pinned
//! arena, per wall-clock second and per CPU-second, at several thread counts, with the bus idle
//! and while the copy engine reads pinned memory at full speed. `to_device` cannot spend less
//! CPU time than its bytes divided by the best rate per CPU-second found here.
//!
//! `cargo run --release --example copy_rates [--gather FILE | --read FILE] [--dma-arena]
//! [--ring] [THREADS ...]` on a GPU machine
//! (default 1 2 4 6 8 10 12 16). A probe: prints a table, asserts nothing about speed, checks the
//! copied bytes.
//!
//! Copy threads take 256 KiB chunks of a 2 GiB pageable source in turn (the copy gang's chunk)
//! and write them round their share of a 64 MiB page-locked arena (the stager's default). CPU
//! time is each copy thread's own (`RUSAGE_THREAD`), summed. Each line is the best of three
//! rounds, the bus-idle and bus-busy runs interleaved.
//!
//! With `--gather FILE` (a page-cached `.npy` or other record file), the threads instead take
//! batches of 1,024 records of one shuffled order in turn and gather them round their share of
//! an arena of as many batches as a `Loader` with that many readers has slots (within the
//! default pinned budget), pinned as its pool is (registered, in huge pages where the kernel
//! gives them), with the loader's own mapped gather (`Reader::Mmap`, the reader `auto` picks
//! for a page-cached file): the most a shuffled `Loader`'s readers can deliver at that thread
//! count, with no ring or consumer around them. A loader's slot holds a piece of a batch (4 MiB
//! by default), so the two arenas are alike where a batch fits in one piece, as the
//! benchmarks' 2.9 MB batches do.
//!
//! With `--read FILE` the threads take the file's batches of 1,024 records in order instead,
//! each read with the loader's range read (`pread` into the slot, as an in-order `Loader` over
//! a page-cached file reads it), into the same arena: the most an in-order `Loader`'s readers
//! can deliver at that thread count.
//!
//! `--dma-arena` makes the copy engine read the arena the threads write, as it reads a loader's
//! slots, instead of a buffer of its own. `--ring` has every thread write unit `i` into slot
//! `i` mod the arena's units, as a free list taken in turn hands slots to whichever reader
//! claims next, instead of each thread writing round a share of its own, as a loader's ring
//! has its readers do (it gives each reader back the slots it filled itself).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use pinfeed::tune::slots_for_readers;
use pinfeed::{DEFAULT_PINNED_BUDGET, MAX_SLOTS};
use pinfeed_cuda::{Context, DevicePool, PinMethod, PinnedMemory, Stream};
use pinfeed_source::{rng, ReadOptions, Reader, Source};

const SOURCE: usize = 2 << 30;
const ARENA: usize = 64 << 20;
const CHUNK: usize = 256 << 10;
/// The seed tensor's bytes (1024 x 655360 float32), to put the rates in `to_device`'s terms.
const SEED_BYTES: f64 = 2_684_354_560.0;
/// What the copy engine reads meanwhile: this much pinned memory, copied again and again.
const DMA_BYTES: usize = 256 << 20;

fn thread_cpu_seconds() -> f64 {
    // SAFETY: `usage` is a valid, writable rusage for getrusage to fill.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

/// A pinned address the copy engine's thread reads from.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: only handed to the driver as a copy's source; the allocation outlives the thread.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Records in one gathered batch (the benchmarks' batch size).
const GATHER_BATCH: usize = 1024;

/// What the threads copy into the arena.
enum Work {
    /// 256 KiB chunks of a pageable buffer.
    Bulk(Vec<u8>),
    /// Batches of records of `order`, gathered out of `source`.
    Gather {
        source: Box<dyn Source>,
        order: Vec<u64>,
    },
    /// The batches of `source` in order, each read as one range.
    Read(Box<dyn Source>),
}

impl Work {
    /// Bytes of the arena `threads` threads copy round, and how it is page-locked: the
    /// stager's 64 MiB for bulk copies; for gathers, a batch for each slot a loader with that
    /// many readers keeps, within the default pinned budget, registered as its pool is.
    fn arena(&self, threads: usize) -> (usize, PinMethod) {
        match self {
            Work::Bulk(_) => (ARENA, PinMethod::HostAlloc),
            Work::Gather { .. } | Work::Read(_) => (
                slots_for_readers(threads)
                    .min(MAX_SLOTS)
                    .min(DEFAULT_PINNED_BUDGET / self.units().1)
                    * self.units().1,
                PinMethod::Register,
            ),
        }
    }

    /// Units of the arena of `threads` threads ([`Work::arena`]).
    fn arena_units(&self, threads: usize) -> usize {
        self.arena(threads).0 / self.units().1
    }

    /// Units the threads take in turn, and bytes in each.
    fn units(&self) -> (usize, usize) {
        match self {
            Work::Bulk(src) => (src.len() / CHUNK, CHUNK),
            Work::Gather { source, order } => (
                order.len() / GATHER_BATCH,
                GATHER_BATCH * source.layout().record_bytes(),
            ),
            Work::Read(source) => (
                source.num_records() as usize / GATHER_BATCH,
                GATHER_BATCH * source.layout().record_bytes(),
            ),
        }
    }

    /// Copies unit `i` into `dst` (one unit's bytes).
    fn copy(&self, i: usize, dst: &mut [u8]) {
        match self {
            Work::Bulk(src) => dst.copy_from_slice(&src[i * CHUNK..(i + 1) * CHUNK]),
            Work::Gather { source, order } => {
                let batch = &order[i * GATHER_BATCH..(i + 1) * GATHER_BATCH];
                source.gather(batch, dst).expect("gather");
            }
            Work::Read(source) => source
                .read_records((i * GATHER_BATCH) as u64, dst)
                .expect("read"),
        }
    }

    /// Whether `got` holds unit `i`.
    fn holds(&self, i: usize, got: &[u8]) -> bool {
        let mut want = vec![0u8; got.len()];
        self.copy(i, &mut want);
        want == got
    }
}

/// Copies the work's units through the arena with `threads` threads, each taking the next
/// unit in turn; returns (GB/s, GB/s per CPU-second). Thread `k`'s `n`-th unit goes round a share
/// of the arena's slots of its own, or, with `ring`, unit `i` goes into slot `i` mod the slots,
/// as a free list taken in turn hands slots round whichever reader claims next. Each slot's
/// last unit is checked afterwards.
fn copy_units(threads: usize, work: &Work, arena: &mut [u8], ring: bool) -> (f64, f64) {
    let (units, unit) = work.units();
    let slots = arena.len() / unit;
    debug_assert!((1..=slots).contains(&threads), "checked in main");
    let share = slots / threads;
    let next = AtomicUsize::new(0);
    // A slot's lock (in ring order a thread `slots` units behind another can reach its slot at
    // once; in own shares it is never contended) and the unit it holds last.
    let busy: Vec<AtomicBool> = (0..slots).map(|_| AtomicBool::new(false)).collect();
    let holds: Vec<AtomicUsize> = (0..slots).map(|_| AtomicUsize::new(usize::MAX)).collect();
    let base = SendPtr(arena.as_mut_ptr());
    let t0 = Instant::now();
    let cpu: f64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let (next, busy, holds) = (&next, &busy, &holds);
                s.spawn(move || {
                    let c0 = thread_cpu_seconds();
                    for n in 0.. {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= units {
                            break;
                        }
                        let slot = if ring {
                            i % slots
                        } else {
                            k * share + n % share
                        };
                        while busy[slot].swap(true, Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        // SAFETY: slots are disjoint `unit`-byte pieces of the arena, which
                        // outlives this scope and is not touched through `arena` until it ends;
                        // this thread alone holds the slot's lock until the store below.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(base.get().add(slot * unit), unit)
                        };
                        work.copy(i, dst);
                        holds[slot].store(i, Ordering::Relaxed);
                        busy[slot].store(false, Ordering::Release);
                    }
                    thread_cpu_seconds() - c0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let wall = t0.elapsed().as_secs_f64();
    for (slot, i) in holds.iter().enumerate() {
        let i = i.load(Ordering::Relaxed);
        if i != usize::MAX {
            let got = &arena[slot * unit..(slot + 1) * unit];
            assert!(work.holds(i, got), "unit {i} differs");
        }
    }
    let bytes = (units * unit) as f64;
    (bytes / wall / 1e9, bytes / cpu / 1e9)
}

/// Options besides the work and the thread counts.
struct Flags {
    /// `--dma-arena`: the copy engine reads the arena the threads write, not a buffer of its own.
    dma_from_arena: bool,
    /// `--ring`: every thread writes round the whole arena in unit order ([`copy_units`]).
    ring: bool,
}

/// The work the arguments ask for, the thread counts and the flags.
fn parse_args() -> Result<(Work, Vec<usize>, Flags), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut flag = |name: &str| {
        let at = args.iter().position(|a| a == name);
        at.map(|at| args.remove(at)).is_some()
    };
    let flags = Flags {
        dma_from_arena: flag("--dma-arena"),
        ring: flag("--ring"),
    };
    let mode = args.iter().position(|a| a == "--gather" || a == "--read");
    let work = match mode {
        Some(at) => {
            let flag = args[at].clone();
            let path = args
                .get(at + 1)
                .ok_or(format!("{flag} needs a file"))?
                .clone();
            args.drain(at..at + 2);
            let options = ReadOptions {
                reader: Reader::Mmap,
                ..ReadOptions::default()
            };
            let source = pinfeed_source::open_with(&path, None, &options)?;
            if flag == "--read" {
                Work::Read(source)
            } else {
                let mut order: Vec<u64> = (0..source.num_records()).collect();
                rng::fisher_yates(&mut order, &mut rng::SplitMix64::new(1));
                Work::Gather { source, order }
            }
        }
        None => Work::Bulk(
            (0..SOURCE)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ),
    };
    let threads = match args {
        args if args.is_empty() => vec![1, 2, 4, 6, 8, 10, 12, 16],
        args => args
            .iter()
            .map(|a| a.parse().map_err(|_| format!("{a}: not a thread count")))
            .collect::<Result<_, _>>()?,
    };
    Ok((work, threads, flags))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (work, threads, flags) = parse_args()?;
    if threads.contains(&0) {
        return Err("0 threads: at least 1".into());
    }
    let unit = work.units().1;
    if let Some(&t) = threads.iter().find(|&&t| t > work.arena_units(t)) {
        return Err(format!(
            "{t} threads: more than the {} MiB arena's {} units of {unit} bytes",
            work.arena(t).0 >> 20,
            work.arena_units(t)
        )
        .into());
    }
    let ctx = Context::new(0)?;
    ctx.bind()?;
    let dma_src = PinnedMemory::alloc(&ctx, DMA_BYTES, PinMethod::HostAlloc)?;
    // SAFETY: `dma_src` is DMA_BYTES of page-locked memory this function alone uses.
    unsafe { std::ptr::write_bytes(dma_src.as_ptr(), 3, DMA_BYTES) };
    let stream = Stream::new(&ctx)?;
    let pool = DevicePool::new(&ctx)?;
    let dma_dst = pool.alloc_async(DMA_BYTES, &stream)?;
    stream.synchronize()?;

    let records = match &work {
        Work::Bulk(_) => None,
        Work::Gather { source, .. } => Some((source, "Shuffled batches", "gathered")),
        Work::Read(source) => Some((source, "Batches", "read in order, a range each,")),
    };
    match records {
        None => println!("CPU copies into a 64 MiB pinned arena; seed ms = CPU time the seed tensor's 2.68 GB would take"),
        Some((source, batches, how)) => println!(
            "{batches} of {GATHER_BATCH} records of {} ({} records of {} bytes) {how} into a pool laid out as a Loader's at each thread count (a batch a slot, registered; slots: {}) by {}",
            source.name(),
            source.num_records(),
            source.layout().record_bytes(),
            threads
                .iter()
                .map(|&t| format!("{} at {t} threads", work.arena_units(t)))
                .collect::<Vec<_>>()
                .join(", "),
            source.reader_description()
        ),
    }
    println!("threads |  bus idle: GB/s  per CPU-s  seed ms | copy engine reading: GB/s  per CPU-s  seed ms  DMA GB/s");
    for &t in &threads {
        let (arena_bytes, method) = work.arena(t);
        let arena_mem = PinnedMemory::alloc(&ctx, arena_bytes, method)?;
        // SAFETY: the allocation is arena_bytes, page-locked, used by nothing else; the slice
        // is dropped before it.
        let arena = unsafe { std::slice::from_raw_parts_mut(arena_mem.as_ptr(), arena_bytes) };
        let (mut idle, mut busy, mut dma_rate) = ((0f64, 0f64), (0f64, 0f64), 0f64);
        for _ in 0..3 {
            let r = copy_units(t, &work, arena, flags.ring);
            idle = (idle.0.max(r.0), idle.1.max(r.1));
            // The copy engine reads `dma_src` (or the arena) over and over while the CPU copies.
            let (from, len) = if flags.dma_from_arena {
                (arena_mem.as_ptr(), arena_bytes)
            } else {
                (dma_src.as_ptr(), DMA_BYTES)
            };
            let from = SendPtr(from);
            let stop = AtomicBool::new(false);
            let (r, moved, secs) = std::thread::scope(|s| -> Result<_, String> {
                let dma = s.spawn(|| -> Result<(usize, f64), String> {
                    ctx.bind().map_err(|e| e.to_string())?;
                    let (t0, mut moved) = (Instant::now(), 0);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..4 {
                            // SAFETY: both buffers hold `len` bytes and outlive the synchronise
                            // below; the device reads `from`, which the CPU may be writing
                            // (the arena): a probe's read, whose bytes nothing looks at.
                            unsafe {
                                pinfeed_cuda::memcpy_htod_async(
                                    dma_dst.ptr(),
                                    from.get(),
                                    len,
                                    &stream,
                                )
                            }
                            .map_err(|e| e.to_string())?;
                        }
                        stream.synchronize().map_err(|e| e.to_string())?;
                        moved += 4 * len;
                    }
                    Ok((moved, t0.elapsed().as_secs_f64()))
                });
                // Let the copy engine get going first.
                std::thread::sleep(std::time::Duration::from_millis(20));
                let r = copy_units(t, &work, arena, flags.ring);
                stop.store(true, Ordering::Relaxed);
                let (moved, secs) = dma.join().unwrap()?;
                Ok((r, moved, secs))
            })?;
            busy = (busy.0.max(r.0), busy.1.max(r.1));
            dma_rate = dma_rate.max(moved as f64 / secs / 1e9);
        }
        println!(
            "{t:7} | {:15.2}  {:9.2}  {:7.0} | {:25.2}  {:9.2}  {:7.0}  {:8.2}",
            idle.0,
            idle.1,
            SEED_BYTES / idle.1 / 1e6,
            busy.0,
            busy.1,
            SEED_BYTES / busy.1 / 1e6,
            dma_rate
        );
    }
    drop(dma_dst);
    stream.synchronize()?;
    Ok(())
}
