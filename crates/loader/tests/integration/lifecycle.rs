//! Stopping a loader from unusual places: its own transform, or while a transform never returns.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pinfeed::{Loader, LoaderOptions, Transform};

use crate::common::{host_options, random_source};

/// Copies its input, and on the first batch after `armed` drops the loader it runs in (which
/// the test put in `loader`), recording whether that panicked.
struct DropsItsLoader {
    loader: Arc<Mutex<Option<Loader>>>,
    armed: Mutex<Receiver<()>>,
    panicked: Sender<bool>,
}

impl Transform for DropsItsLoader {
    fn output_record_bytes(&self) -> usize {
        4
    }
    fn apply(&self, input: &[u8], _records: usize, output: &mut [u8]) -> Result<(), String> {
        output.copy_from_slice(input);
        let _ = self
            .armed
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10));
        if let Some(loader) = self.loader.lock().unwrap().take() {
            let dropped = catch_unwind(AssertUnwindSafe(|| drop(loader)));
            let _ = self.panicked.send(dropped.is_err());
        }
        Ok(())
    }
}

#[test]
fn a_transform_that_drops_its_own_loader_neither_panics_nor_hangs() {
    let (source, _) = random_source(1000, 4, 3);
    let (arm, armed) = mpsc::channel();
    let (panicked_tx, panicked) = mpsc::channel();
    let slot = Arc::new(Mutex::new(None));
    let transform = DropsItsLoader {
        loader: Arc::clone(&slot),
        armed: Mutex::new(armed),
        panicked: panicked_tx,
    };
    let options = LoaderOptions {
        transform: Some(Arc::new(transform)),
        num_threads: Some(1),
        ..host_options(10)
    };
    *slot.lock().unwrap() = Some(Loader::new(source, options).unwrap());
    arm.send(()).unwrap();
    // Joining its own thread made the drop panic ("Resource deadlock avoided").
    let outcome = panicked.recv_timeout(Duration::from_secs(20));
    assert_eq!(
        outcome,
        Ok(false),
        "the drop inside the transform panicked or hung"
    );
}

/// Blocks in its first batch until `release` (user code that does not return when asked),
/// then writes its output; says when it is dropped.
struct Blocks {
    entered: Sender<()>,
    release: Mutex<Receiver<()>>,
    dropped: Arc<AtomicBool>,
}

impl Transform for Blocks {
    fn output_record_bytes(&self) -> usize {
        4
    }
    fn apply(&self, input: &[u8], _records: usize, output: &mut [u8]) -> Result<(), String> {
        let _ = self.entered.send(());
        let _ = self.release.lock().unwrap().recv();
        // Writes into its pinned slot after the loader was dropped: the slot must still be there.
        output.copy_from_slice(input);
        Ok(())
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

#[test]
fn dropping_a_loader_waits_on_a_transform_that_never_returns_only_so_long() {
    let (source, _) = random_source(1000, 4, 4);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let dropped = Arc::new(AtomicBool::new(false));
    let options = LoaderOptions {
        transform: Some(Arc::new(Blocks {
            entered: entered_tx,
            release: Mutex::new(release_rx),
            dropped: Arc::clone(&dropped),
        })),
        num_threads: Some(1),
        ..host_options(10)
    };
    let loader = Loader::new(source, options).unwrap();
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    // Without a bound the drop below would wait for the transform for ever; the release after
    // 8 s ends the test either way.
    let late = release.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(8));
        let _ = late.send(());
    });
    let started = Instant::now();
    drop(loader);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "dropping the loader took {took:?}"
    );
    // The reader thread left behind still holds the loader's state, transform included.
    assert!(!dropped.load(Ordering::SeqCst));
    let _ = release.send(());
    let until = Instant::now() + Duration::from_secs(20);
    while !dropped.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the thread left behind never returned"
    );
}
