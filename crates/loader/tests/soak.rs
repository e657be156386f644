//! A soak test: shuffled epochs through a small ring for a bounded time (PINFEED_SOAK_SECONDS,
//! default 120), every epoch checked for every record exactly once with intact bytes, and no
//! growth in resident memory, page-locked allocations or device memory held.
//!
//! Its own test binary (one test): it reads the process's resident memory.

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

#[test]
fn shuffled_epochs_for_a_bounded_time_leak_nothing() {
    let seconds: u64 = std::env::var("PINFEED_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let n = 5000u64;
    let record = 64usize;
    // Record i: its index, then bytes derived from it.
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            let mut r = i.to_le_bytes().to_vec();
            r.extend((0..record - 8).map(|k| (i as u8).wrapping_mul(31).wrapping_add(k as u8)));
            r
        })
        .collect();
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    let source: Arc<dyn Source> = Arc::new(
        HostBuffer::from_vec(data, Layout::new(dtype, vec![record as u64]).unwrap()).unwrap(),
    );
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
