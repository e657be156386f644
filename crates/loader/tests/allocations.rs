//! No page-locked allocation after start-up, counted process-wide.
//!
//! This is its own test binary, with one test, because the counter is global to the process:
//! loaders started by tests running in parallel would move it.

use std::sync::Arc;

use pinfeed::{pinned_allocations, DeviceSpec, Loader, LoaderOptions, MultiLoader};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{HostBuffer, Layout};

#[test]
fn no_page_locked_allocation_after_start() {
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    let layout = Layout::new(dtype, vec![64]).unwrap();
    let source: Arc<dyn pinfeed_source::Source> =
        Arc::new(HostBuffer::from_vec(vec![7u8; 5_000 * 64], layout).unwrap());
    let options = LoaderOptions {
        batch_size: 50,
        epochs: 5,
        // Small enough for the 8 MiB memory-lock limit of CI machines, so the pool is locked
        // and counted.
        pinned_budget: 1 << 20,
        device: DeviceSpec::Cpu,
        ..LoaderOptions::default()
    };
    let before = pinned_allocations();
    let mut loader = Loader::new(Arc::clone(&source), options.clone()).unwrap();
    let at_start = pinned_allocations();
    let stats = loader.stats();
    assert_eq!(
        at_start - before,
        u64::from(stats.pinned_locked),
        "the pool is the one page-locked allocation"
    );
    let mut batches = 0;
    for batch in loader.by_ref() {
        batch.unwrap();
        batches += 1;
    }
    assert_eq!(batches, 500);
    assert_eq!(
        pinned_allocations(),
        at_start,
        "page-locked memory allocated after start"
    );
    assert_eq!(loader.stats().pinned_allocations_after_start, 0);
    drop(loader);

    // Several devices: split (a loader, and a pool, per device) and replicated (one pool).
    let devices = [DeviceSpec::Cpu, DeviceSpec::Cpu];
    for replicate in [false, true] {
        let (source, options) = (Arc::clone(&source), options.clone());
        let mut multi = if replicate {
            MultiLoader::replicated(source, options, &devices)
        } else {
            MultiLoader::new(source, options, &devices)
        }
        .unwrap();
        let at_start = pinned_allocations();
        let stats = multi.stats();
        assert!(
            stats.pinned_locked,
            "the pools were not locked: nothing was counted"
        );
        assert_eq!(
            stats.pinned_allocations_after_start, 0,
            "replicate={replicate}: counted at start"
        );
        let mut steps = 0;
        for step in multi.by_ref() {
            step.unwrap();
            steps += 1;
        }
        assert_eq!(steps, if replicate { 500 } else { 250 });
        assert_eq!(pinned_allocations(), at_start, "replicate={replicate}");
        assert_eq!(multi.stats().pinned_allocations_after_start, 0);
        for loader in multi.loaders() {
            assert_eq!(loader.stats().pinned_allocations_after_start, 0);
        }
    }

    // A training and an evaluation loader of different pool sizes used in turn: the smaller
    // takes the larger's idle pool, so after the larger's first pass nothing is page-locked.
    let loader = |pinned_budget: usize| {
        let options = LoaderOptions {
            batch_size: 200,
            epochs: 1,
            pinned_budget,
            ..options.clone()
        };
        Loader::new(Arc::clone(&source), options).unwrap()
    };
    let pass = |pinned_budget: usize| {
        let mut loader = loader(pinned_budget);
        assert_eq!(loader.by_ref().map(Result::unwrap).count(), 25);
        loader.stats().pinned_bytes
    };
    let train = pass(256 << 10);
    let after_first = pinned_allocations();
    for _ in 0..3 {
        let eval = pass(128 << 10);
        assert!(
            eval < train,
            "the two loaders' pools are {eval} and {train} bytes"
        );
        assert_eq!(pass(256 << 10), train);
    }
    assert_eq!(
        pinned_allocations(),
        after_first,
        "a pool was page-locked again for a loader the idle one could serve"
    );

    // The evaluation loader made while a training pass runs has a pool of its own; when it
    // finishes after the training loader, the larger idle pool stays and its own is freed.
    let (train_loader, eval_loader) = (loader(256 << 10), loader(128 << 10));
    for mut finished in [train_loader, eval_loader] {
        assert_eq!(finished.by_ref().map(Result::unwrap).count(), 25);
    }
    let before = pinned_allocations();
    assert_eq!(pass(256 << 10), train);
    pass(128 << 10);
    assert_eq!(
        pinned_allocations(),
        before,
        "the smaller pool, returned last, displaced the larger"
    );
}
