//! The pinned budget holds; nothing is page-locked after start-up.

use std::sync::Arc;

use pinfeed::{Loader, LoaderError, LoaderOptions};

use crate::common::{host_options, random_source};

#[test]
fn pinned_memory_stays_within_the_budget() {
    let (source, _) = random_source(10_000, 100, 7);
    for (budget, batch_size) in [(1 << 20, 100), (300_000, 1000), (8192, 1), (64 << 20, 10)] {
        let options = LoaderOptions {
            pinned_budget: budget,
            ..host_options(batch_size)
        };
        let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
        for batch in loader.by_ref() {
            batch.unwrap();
        }
        let stats = loader.stats();
        assert!(
            stats.pinned_bytes_peak <= budget,
            "budget {budget}: {} bytes pinned",
            stats.pinned_bytes_peak
        );
        assert!(stats.slots >= 2 && stats.slots <= pinfeed::MAX_SLOTS);
        assert_eq!(stats.pinned_numa, "not placed: no GPU (host backend)");
        assert!(stats.slot_bytes >= batch_size * 100);
    }
}

#[test]
fn a_budget_below_two_slots_is_refused_with_advice() {
    let (source, _) = random_source(100, 1000, 8);
    let options = LoaderOptions {
        pinned_budget: 10_000,
        ..host_options(10)
    };
    let err = Loader::new(source, options).unwrap_err();
    assert!(
        matches!(err, LoaderError::BudgetTooSmall { fits: 0, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("at least 24576 bytes"), "{text}");
}

#[test]
fn device_budget_is_enforced() {
    let (source, _) = random_source(100, 1000, 10);
    let options = LoaderOptions {
        device_budget: Some(25_000),
        prefetch: 1,
        ..host_options(10)
    };
    let mut loader = Loader::new(source, options).unwrap();
    // Hold every batch: the third would pass the budget of 2.5 batches.
    let mut held = Vec::new();
    let mut error = None;
    for batch in loader.by_ref() {
        match batch {
            Ok(b) => held.push(b),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    assert_eq!(held.len(), 2);
    assert!(
        matches!(
            error,
            Some(LoaderError::DeviceBudget { budget: 25_000, .. })
        ),
        "{error:?}"
    );
    assert!(loader.device_bytes_held() <= 25_000);
}

/// A batch size far beyond the dataset gives one batch of every record, at once: slots are
/// sized for the records that exist, not for empty pieces of the batch asked for.
#[test]
fn a_batch_larger_than_the_dataset_holds_the_dataset_and_ends_at_once() {
    let (source, data) = random_source(10, 4, 12);
    for batch_size in [10_000_000_000_000usize, 11, usize::MAX] {
        let started = std::time::Instant::now();
        let options = LoaderOptions {
            epochs: 2,
            ..host_options(batch_size)
        };
        let loader = Loader::new(Arc::clone(&source), options).unwrap();
        assert_eq!(loader.num_batches(), 2);
        let (bytes, batches) = crate::common::collect(loader);
        assert_eq!(batches, vec![(0, 0, 10), (1, 0, 10)], "batch {batch_size}");
        assert_eq!(bytes, [data.clone(), data.clone()].concat());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "batch {batch_size} took {:?}",
            started.elapsed()
        );
    }
    // With a shuffle and two ranks: each rank's one batch holds its 5 records.
    let options = LoaderOptions {
        shuffle: pinfeed::Shuffle::Random,
        world_size: 2,
        rank: 1,
        ..host_options(1 << 40)
    };
    let (_, batches) = crate::common::collect(Loader::new(source, options).unwrap());
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].2, 5);
}

#[test]
fn a_piece_size_of_zero_is_refused() {
    let (source, _) = random_source(10, 4, 13);
    let options = LoaderOptions {
        piece_bytes: Some(0),
        ..host_options(4)
    };
    let err = Loader::new(source, options).unwrap_err();
    assert!(matches!(err, LoaderError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("piece size"), "{err}");
}

/// A resume position so far on that batch numbers from epoch 0 pass 64 bits is refused,
/// naming the largest epoch allowed, instead of wrapping round to another epoch's order.
#[test]
fn epochs_past_64_bit_batch_numbers_are_refused() {
    let (source, _) = random_source(10, 4, 14);
    let at = |epoch| LoaderOptions {
        start: pinfeed::Position {
            epoch,
            batches_done: 0,
            consumed: 0,
        },
        ..host_options(4)
    };
    // 3 batches an epoch.
    let allowed = pinfeed::Position::last_epoch_allowed(3);
    assert!(Loader::new(Arc::clone(&source), at(allowed)).is_ok());
    let err = Loader::new(source, at(allowed + 1)).unwrap_err();
    assert!(matches!(err, LoaderError::Config(_)), "{err:?}");
    assert!(err.to_string().contains(&allowed.to_string()), "{err}");
}

/// Random token windows are not bounded by the data, so a batch of 10^13 of them is 10^13
/// windows: refused, naming the bytes it would take, before anything is allocated for it (it
/// used to abort the process allocating the batch). The same rule refuses a record batch, but
/// records that exist already bound it.
#[test]
fn a_batch_larger_than_the_device_memory_is_refused_before_anything_is_allocated() {
    use pinfeed_source::tokens::{self, Sample, TokenDType, TokenOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    std::fs::write(&path, vec![1u8; 1000]).unwrap();
    let batch_size = 10_000_000_000_000u64;
    let windows = tokens::open(
        &path,
        &TokenOptions {
            dtype: Some(TokenDType::U16),
            seq_len: 8,
            sample: Sample::Random,
            seed: 0,
            epoch: 0,
            steps: None,
            batch_size,
            world_size: 1,
            steps_per_batch: 1,
            shuffle: Default::default(),
        },
    )
    .unwrap();
    let e = Loader::new(windows.source(), host_options(batch_size as usize)).unwrap_err();
    assert!(matches!(e, LoaderError::BatchTooLarge { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("train.bin")
            && text.contains("180000000000000 bytes")
            && text.contains("device cpu"),
        "{text}"
    );
    // A batch that fits is left alone.
    let (source, _) = random_source(10, 4, 1);
    Loader::new(source, host_options(10)).unwrap();
}
