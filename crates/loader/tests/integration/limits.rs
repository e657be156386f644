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
