//! Records per second decoded from a table (a Parquet, Arrow or JSON-lines file of record
//! columns) on many threads, in file order, as a loader's readers take it: each thread reads
//! the next batch of records into a buffer of its own. Each pass opens the file anew, so that
//! no decoded chunk is kept from the pass before.
//!
//!     cargo run --release -p pinfeed-source --example decode_tables -- \
//!         records.parquet 1,2 [batch_records] [passes]
//!
//! Prints, for each thread count, GB/s of record bytes and CPU seconds a GB (the process's).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pinfeed_source::{open_with, ReadOptions};

/// CPU seconds this process has run, all threads.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `usage` is valid for one `rusage` to be written.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    // SAFETY: getrusage filled it.
    let u = unsafe { usage.assume_init() };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(u.ru_utime) + s(u.ru_stime)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: decode_tables FILE THREADS [BATCH] [PASSES]");
    let threads: Vec<usize> = args
        .get(2)
        .map_or("1", String::as_str)
        .split(',')
        .map(|t| t.parse().expect("thread counts as 1,2,4"))
        .collect();
    let batch: u64 = args
        .get(3)
        .map_or(16384, |b| b.parse().expect("records a batch"));
    let passes: usize = args.get(4).map_or(3, |p| p.parse().expect("passes"));
    for &n in &threads {
        let mut rates = Vec::new();
        for _ in 0..passes {
            let (w0, c0) = (Instant::now(), cpu_seconds());
            let source = open_with(path, None, &ReadOptions::default()).expect("open");
            let record_bytes = source.layout().record_bytes();
            let records = source.num_records();
            let next = AtomicU64::new(0);
            std::thread::scope(|scope| {
                for _ in 0..n {
                    scope.spawn(|| {
                        let mut dst = vec![0u8; batch as usize * record_bytes];
                        loop {
                            let first = next.fetch_add(batch, Ordering::Relaxed);
                            if first >= records {
                                break;
                            }
                            let count = batch.min(records - first) as usize;
                            source
                                .read_records(first, &mut dst[..count * record_bytes])
                                .expect("read");
                        }
                    });
                }
            });
            let gb = (records * record_bytes as u64) as f64 / 1e9;
            let (wall, cpu) = (w0.elapsed().as_secs_f64(), cpu_seconds() - c0);
            rates.push((gb / wall, cpu / gb));
        }
        let shown: Vec<String> = rates
            .iter()
            .map(|(r, c)| format!("{r:.2} GB/s at {c:.2} CPU s/GB"))
            .collect();
        println!("{n} threads: {}", shown.join(", "));
    }
}
