//! A soak test: shuffled epochs through a small ring for a bounded time (PINFEED_SOAK_SECONDS,
//! default 120), every epoch checked for every record exactly once with intact bytes, and no
//! growth in resident memory, page-locked allocations or device memory held.
//!
//! Its own test binary: it reads the process's resident memory. The GPU soak
//! (`gpu_shuffled_epochs_for_a_bounded_time_leak_nothing`, marked ignored) runs on a CUDA machine
//! by itself: `soak --ignored --exact gpu_shuffled_epochs_for_a_bounded_time_leak_nothing`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pinfeed::{pinned_allocations, DeviceSpec, Loader, LoaderOptions, Shuffle};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{HostBuffer, Layout, Source};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// `PINFEED_SOAK_SECONDS`, or `default`.
fn soak_seconds(default: u64) -> u64 {
    std::env::var("PINFEED_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// `n` records of `record` bytes: record `i` is its index, then byte `j` (from 8 on) is
/// `byte(i, j)`.
fn numbered_records(n: u64, record: usize, byte: impl Fn(u64, usize) -> u8) -> Arc<dyn Source> {
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            let mut r = i.to_le_bytes().to_vec();
            r.extend((8..record).map(|j| byte(i, j)));
            r
        })
        .collect();
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    Arc::new(HostBuffer::from_vec(data, Layout::new(dtype, vec![record as u64]).unwrap()).unwrap())
}

#[test]
fn shuffled_epochs_for_a_bounded_time_leak_nothing() {
    let seconds = soak_seconds(120);
    let n = 5000u64;
    let record = 64usize;
    let source = numbered_records(n, record, |i, j| {
        (i as u8).wrapping_mul(31).wrapping_add((j - 8) as u8)
    });
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut epochs = 0u64;
    let mut baseline = None;
    let mut pinned_baseline = None;
    let shuffles = [
        Shuffle::Random,
        Shuffle::Block {
            block: 37,
            window: 5,
        },
        Shuffle::None,
    ];
    // At least 60 epochs whatever the time limit, so the growth check below always runs.
    while Instant::now() < deadline || epochs < 60 {
        let options = LoaderOptions {
            batch_size: 97,
            shuffle: shuffles[(epochs % 3) as usize],
            seed: epochs,
            epochs: 3,
            pinned_budget: 8 * 97 * 64 + 64 * 4096,
            num_threads: Some(3),
            device: DeviceSpec::Cpu,
            ..LoaderOptions::default()
        };
        let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
        let mut seen = vec![0u8; n as usize * 3];
        for batch in loader.by_ref() {
            let batch = batch.unwrap();
            let epoch = batch.epoch() as usize;
            for r in batch.host_bytes().unwrap().unwrap().chunks_exact(record) {
                let i = u64::from_le_bytes(r[..8].try_into().unwrap());
                assert!(i < n, "record index {i} out of range");
                for (k, &b) in r[8..].iter().enumerate() {
                    assert_eq!(
                        b,
                        (i as u8).wrapping_mul(31).wrapping_add(k as u8),
                        "record {i} corrupted"
                    );
                }
                seen[epoch * n as usize + i as usize] += 1;
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "an epoch missed or repeated a record (round {epochs})"
        );
        assert_eq!(loader.device_bytes_held(), 0);
        drop(loader);
        epochs += 3;
        if epochs == 30 {
            // After warm-up: allocator caches and thread stacks settled.
            baseline = Some(rss_bytes());
            pinned_baseline = Some(pinned_allocations());
        }
    }
    let base = baseline.expect("the baseline is taken at 30 epochs and at least 60 run");
    {
        let now = rss_bytes();
        assert!(
            now < base + (16 << 20),
            "resident memory grew from {base} to {now} bytes over {epochs} epochs"
        );
        // Each loader page-locks its pool once (when the lock limit allows) and nothing else.
        let per_loader = pinned_allocations() - pinned_baseline.unwrap();
        assert!(
            per_loader <= (epochs - 30) / 3,
            "{per_loader} page-locked allocations for {} loaders",
            (epochs - 30) / 3
        );
    }
    eprintln!("soak: {epochs} shuffled epochs, every record exactly once, no growth");
}

/// Record `i` of the GPU soak: its index, then bytes derived from it.
fn soak_record(i: u64, k: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(k as u8) ^ ((i >> 8) as u8)
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_shuffled_epochs_for_a_bounded_time_leak_nothing() {
    let seconds = soak_seconds(600);
    // Records of the seed's shape (3x31x31 bytes), 20,000 of them (58 MB an epoch).
    let n = 20_000u64;
    let record = 2883usize;
    let source = numbered_records(n, record, soak_record);
    let ctx = pinfeed_cuda::Context::new(0).unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let shuffles = [
        Shuffle::Random,
        Shuffle::Block {
            block: 64,
            window: 8,
        },
        Shuffle::Random,
        Shuffle::None,
    ];
    let rounds_per_loader = 25u64;
    let (mut epochs, mut rounds, mut batches, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut baseline: Option<(u64, u64, usize)> = None;
    let mut next_report = started;
    let mut back = Vec::new();
    while Instant::now() < deadline || rounds < 8 {
        let options = LoaderOptions {
            batch_size: 1000 + (rounds as usize % 7) * 131,
            shuffle: shuffles[(rounds % 4) as usize],
            seed: rounds,
            epochs: rounds_per_loader,
            pinned_budget: 32 << 20,
            num_threads: Some(4),
            device: DeviceSpec::Cuda(0),
            ..LoaderOptions::default()
        };
        let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
        let mut seen = vec![0u8; (n * rounds_per_loader) as usize];
        for batch in loader.by_ref() {
            let batch = batch.unwrap();
            let epoch = batch.epoch() as usize;
            back.resize(batch.len_bytes(), 0);
            batch.read_back(&mut back).unwrap();
            for r in back.chunks_exact(record) {
                let i = u64::from_le_bytes(r[..8].try_into().unwrap());
                assert!(i < n, "record index {i} out of range");
                let intact = r[8..]
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == soak_record(i, k + 8));
                assert!(intact, "record {i} corrupted on the GPU (round {rounds})");
                seen[epoch * n as usize + i as usize] += 1;
            }
            batches += 1;
            bytes += batch.len_bytes() as u64;
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "an epoch missed or repeated a record (round {rounds})"
        );
        assert_eq!(loader.device_bytes_held(), 0);
        drop(loader);
        epochs += rounds_per_loader;
        rounds += 1;
        let (free, _) = ctx.mem_info().unwrap();
        if rounds == 4 {
            // After warm-up: the pinned pool and device memory pool are cached, stacks settled.
            baseline = Some((rss_bytes(), pinned_allocations(), free));
        }
        if let Some((rss0, pinned0, free0)) = baseline {
            let rss = rss_bytes();
            assert!(
                rss < rss0 + (32 << 20),
                "resident memory grew from {rss0} to {rss} bytes after {epochs} epochs"
            );
            // Each loader page-locks its pool at most once (an idle pool as large or larger is
            // reused; batch sizes vary here, so sizes do too) and nothing per batch.
            let loaders = rounds - 4;
            assert!(
                pinned_allocations() - pinned0 <= loaders,
                "{} page-locked allocations for {loaders} loaders after warm-up",
                pinned_allocations() - pinned0
            );
            assert!(
                free + (256 << 20) >= free0,
                "free device memory fell from {free0} to {free} bytes after {epochs} epochs"
            );
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(60);
            eprintln!(
                "soak {:>5.0} s: {epochs} epochs, {batches} batches, {:.1} GB checked, rss {} MB, free device memory {} MB",
                started.elapsed().as_secs_f64(),
                bytes as f64 / 1e9,
                rss_bytes() >> 20,
                free >> 20
            );
        }
    }
    eprintln!(
        "gpu soak: {:.0} s, {epochs} shuffled epochs in {rounds} loaders, {batches} batches, {:.1} GB read back and checked: every record exactly once per epoch, no growth",
        started.elapsed().as_secs_f64(),
        bytes as f64 / 1e9
    );
}
