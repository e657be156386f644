//! The CPU's copy rates into a staging arena, plain `memcpy` against streaming stores
//! ([`pinfeed_source::streaming::copy`]), at several thread counts: the cap that CPU time puts on
//! `to_device` and on readers copying out of host memory. A probe, not a test; checks the bytes.
//!
//! `cargo run --release -p pinfeed-source --example copy_rates [THREADS ...]` (default 1 4 8 12 16)
//!
//! Threads take 256 KiB chunks of a 2 GiB pageable source in turn (the copy gang's shape) and
//! write them round the 64 MiB arena; each line gives the wall-clock rate and the rate per
//! CPU-second (the process's user + system time), best of three interleaved rounds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const SOURCE: usize = 2 << 30;
const ARENA: usize = 64 << 20;
const CHUNK: usize = 256 << 10;

fn cpu_seconds() -> f64 {
    // SAFETY: `usage` is a valid, writable rusage for getrusage to fill.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

/// Copies the source through the arena with `threads` threads, each writing round its own
/// share of it; returns (GB/s, GB/s per CPU-s).
fn run(threads: usize, streaming: bool, src: &[u8], arena: &mut [u8]) -> (f64, f64) {
    let next = AtomicUsize::new(0);
    let share = (ARENA / threads / CHUNK).max(1) * CHUNK;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let last: Vec<Option<(usize, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = arena
            .chunks_mut(share)
            .take(threads)
            .map(|mine| {
                let next = &next;
                s.spawn(move || {
                    // (chunk of the source, where in `mine`) of the last copy.
                    let (mut last, mut at) = (None, 0);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= SOURCE / CHUNK {
                            break last;
                        }
                        let (from, to) =
                            (&src[i * CHUNK..(i + 1) * CHUNK], &mut mine[at..at + CHUNK]);
                        if streaming {
                            pinfeed_source::streaming::copy(to, from);
                        } else {
                            to.copy_from_slice(from);
                        }
                        last = Some((i, at));
                        at = (at + CHUNK) % (mine.len() / CHUNK * CHUNK);
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    for (mine, last) in arena.chunks(share).zip(last) {
        if let Some((i, at)) = last {
            assert!(
                mine[at..at + CHUNK] == src[i * CHUNK..(i + 1) * CHUNK],
                "chunk {i} differs"
            );
        }
    }
    (SOURCE as f64 / wall / 1e9, SOURCE as f64 / cpu / 1e9)
}

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("thread counts are numbers"))
        .collect();
    let threads = if threads.is_empty() {
        vec![1, 4, 8, 12, 16]
    } else {
        threads
    };
    let src: Vec<u8> = (0..SOURCE)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut arena = vec![0u8; ARENA];
    println!("threads  plain GB/s  per CPU-s  streaming GB/s  per CPU-s");
    for &t in &threads {
        let mut best = [(0f64, 0f64); 2];
        for _ in 0..3 {
            for (k, streaming) in [false, true].into_iter().enumerate() {
                let (rate, per_cpu) = run(t, streaming, &src, &mut arena);
                best[k] = (best[k].0.max(rate), best[k].1.max(per_cpu));
            }
        }
        println!(
            "{t:7}  {:10.2}  {:9.2}  {:14.2}  {:9.2}",
            best[0].0, best[0].1, best[1].0, best[1].1
        );
    }
}
