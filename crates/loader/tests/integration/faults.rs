//! Errors and panics in readers reach the consumer; stopping early frees everything.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinfeed::{Loader, LoaderError, LoaderOptions};
use pinfeed_source::{Layout, Source};

use crate::common::{host_options, random_source, slow_first_batch, Fault, Faulty};

fn run_faulty(panic: bool) -> (usize, LoaderError) {
    run_faulty_with(panic, host_options(10))
}

fn run_faulty_with(panic: bool, options: LoaderOptions) -> (usize, LoaderError) {
    let (inner, _) = random_source(1000, 16, 11);
    let source = Arc::new(Faulty {
        inner,
        bad_record: 555,
        fault: if panic { Fault::Panic } else { Fault::Error },
    });
    let loader = Loader::new(source, options).unwrap();
    let mut good = 0;
    for batch in loader {
        match batch {
            Ok(_) => good += 1,
            Err(e) => return (good, e),
        }
    }
    panic!("the loader ended without reporting the fault");
}

#[test]
fn an_io_error_reaches_the_consumer_after_the_good_batches() {
    let (good, err) = run_faulty(false);
    assert_eq!(good, 55, "every batch before the fault, and none after it");
    assert!(matches!(err, LoaderError::Source(_)), "{err:?}");
    assert!(err.to_string().contains("injected I/O error"), "{err}");
}

#[test]
fn a_fault_in_one_piece_of_a_batch_fails_the_batch() {
    // Batches of 100 records in pieces of 3: record 555 is in piece 18 of batch 5.
    for panic in [false, true] {
        let options = LoaderOptions {
            piece_bytes: Some(3 * 16),
            num_threads: Some(3),
            ..host_options(100)
        };
        let (good, err) = run_faulty_with(panic, options);
        assert_eq!(good, 5, "every batch before the fault, and none after it");
        let text = err.to_string();
        assert!(
            text.contains("injected I/O error") || text.contains("injected panic at record 555"),
            "{err:?}"
        );
    }
}

#[test]
fn a_panicking_reader_becomes_an_error() {
    let (_, err) = run_faulty(true);
    match err {
        LoaderError::Worker { thread, message } => {
            assert_eq!(thread, "reader");
            assert!(
                message.contains("injected panic at record 555"),
                "{message}"
            )
        }
        other => panic!("expected a Worker error, got {other:?}"),
    }
}

#[test]
fn dropping_the_loader_mid_epoch_stops_promptly_and_keeps_held_batches_valid() {
    let (source, data) = random_source(100_000, 64, 12);
    let options = LoaderOptions {
        num_threads: Some(4),
        ..host_options(100)
    };
    let mut loader = Loader::new(source, options).unwrap();
    let first = loader.next().unwrap().unwrap();
    let second = loader.next().unwrap().unwrap();
    let started = Instant::now();
    drop(loader);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        started.elapsed()
    );
    assert_eq!(first.host_bytes().unwrap().unwrap(), &data[..6400]);
    assert_eq!(second.host_bytes().unwrap().unwrap(), &data[6400..12800]);
}

/// Fails at two records: slowly at the first, at once at the second.
#[derive(Debug)]
struct TwoFaults {
    inner: Arc<dyn Source>,
}

impl Source for TwoFaults {
    fn name(&self) -> &str {
        "two faults"
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }
    fn read_records(&self, first: u64, dst: &mut [u8]) -> pinfeed_source::Result<()> {
        let n = (dst.len() / self.layout().record_bytes()) as u64;
        for (bad, delay) in [(25, 300), (35, 0)] {
            if (first..first + n).contains(&bad) {
                std::thread::sleep(Duration::from_millis(delay));
                return Err(pinfeed_source::SourceError::Read {
                    path: "two faults".into(),
                    offset: bad,
                    len: dst.len(),
                    source: std::io::Error::other(format!("bad record {bad}")),
                });
            }
        }
        self.inner.read_records(first, dst)
    }
}

#[test]
fn faults_reach_the_consumer_in_batch_order_whichever_reader_failed_first() {
    // Batch 3's read fails while batch 2's is still failing: the consumer gets batches 0 and 1,
    // then batch 2's error, as it would reading in order.
    let (inner, _) = random_source(100, 16, 14);
    let options = LoaderOptions {
        num_threads: Some(4),
        ..host_options(10)
    };
    let loader = Loader::new(Arc::new(TwoFaults { inner }), options).unwrap();
    let got: Vec<_> = loader.collect();
    assert_eq!(got.len(), 3, "two batches and one error");
    assert!(got[..2].iter().all(|b| b.is_ok()));
    let err = got[2].as_ref().unwrap_err().to_string();
    assert!(err.contains("bad record 25"), "{err}");
}

#[test]
fn a_fault_copied_early_waits_for_the_batches_before_it() {
    // Batch 0 is slow; batch 3 fails at once and reaches the copy thread first. The consumer
    // still gets batches 0, 1 and 2, every byte equal, then batch 3's error.
    let (slow, data) = slow_first_batch(Duration::from_millis(100));
    let source = Faulty {
        inner: slow,
        bad_record: 35,
        fault: Fault::Error,
    };
    let options = LoaderOptions {
        num_threads: Some(3),
        ..host_options(10)
    };
    let loader = Loader::new(Arc::new(source), options).unwrap();
    let got: Vec<_> = loader.collect();
    assert_eq!(got.len(), 4, "three batches and one error");
    let bytes: Vec<u8> = got[..3]
        .iter()
        .flat_map(|b| b.as_ref().unwrap().host_bytes().unwrap().unwrap().to_vec())
        .collect();
    assert_eq!(bytes, data[..3 * 10 * 16]);
    let err = got[3].as_ref().unwrap_err().to_string();
    assert!(err.contains("injected I/O error"), "{err}");
}

/// A source that counts reads in flight, to show no reader is left running after drop.
#[derive(Debug)]
struct Slow {
    inner: Arc<dyn Source>,
    active: Arc<AtomicUsize>,
}

impl Source for Slow {
    fn name(&self) -> &str {
        "slow source"
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }
    fn read_records(&self, first: u64, dst: &mut [u8]) -> pinfeed_source::Result<()> {
        self.active.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        let r = self.inner.read_records(first, dst);
        self.active.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

#[test]
fn drop_joins_every_thread() {
    let (inner, _) = random_source(10_000, 8, 13);
    let active = Arc::new(AtomicUsize::new(0));
    let source = Arc::new(Slow {
        inner,
        active: Arc::clone(&active),
    });
    let mut loader = Loader::new(source.clone(), host_options(10)).unwrap();
    loader.next().unwrap().unwrap();
    drop(loader);
    assert_eq!(
        active.load(Ordering::SeqCst),
        0,
        "a reader was still reading after drop"
    );
    assert_eq!(
        Arc::strong_count(&source),
        1,
        "a thread still holds the source"
    );
}

#[test]
fn next_within_times_out_while_readers_are_slow_and_then_delivers() {
    let (inner, _) = random_source(100, 8, 14);
    let source = Arc::new(Slow {
        inner,
        active: Arc::new(AtomicUsize::new(0)),
    });
    let mut loader = Loader::new(
        source,
        LoaderOptions {
            num_threads: Some(1),
            ..host_options(10)
        },
    )
    .unwrap();
    let mut timeouts = 0;
    let mut batches = 0;
    loop {
        match loader.next_within(Duration::from_micros(200)) {
            pinfeed::Waited::TimedOut => timeouts += 1,
            pinfeed::Waited::Ready(Some(batch)) => {
                batch.unwrap();
                batches += 1;
            }
            pinfeed::Waited::Ready(None) => break,
        }
    }
    assert_eq!(batches, 10);
    assert!(timeouts > 0, "2 ms reads never outlasted a 0.2 ms wait");
}
