//! A randomized stress test of the ring with real memory behind the slots: many fillers write a
//! batch's sequence number into every byte of their slot, a copier issues "copies" that a mock
//! copy engine performs later on its own thread, and the engine checks that every byte it reads
//! still belongs to the batch it was asked to copy. A slot reused while its copy was in flight,
//! a batch delivered out of order, twice or never, all make the test fail.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pinfeed_ring::{Fence, Ring};
use rand::{Rng, SeedableRng};

#[derive(Default)]
struct FlagInner {
    done: Mutex<bool>,
    cv: Condvar,
}

#[derive(Clone, Default)]
struct Flag(Arc<FlagInner>);

impl Fence for Flag {
    type Error = std::convert::Infallible;
    fn is_complete(&self) -> Result<bool, Self::Error> {
        Ok(*self.0.done.lock().unwrap())
    }
    fn wait(&self) -> Result<(), Self::Error> {
        let mut done = self.0.done.lock().unwrap();
        while !*done {
            done = self.0.cv.wait(done).unwrap();
        }
        Ok(())
    }
}

const SLOT_BYTES: usize = 256;

fn run(capacity: usize, total: u64, fillers: usize, seed: u64) {
    let ring = Arc::new(Ring::<Flag>::new(capacity, total));
    let memory: Arc<Vec<AtomicU8>> = Arc::new(
        (0..capacity * SLOT_BYTES)
            .map(|_| AtomicU8::new(0))
            .collect(),
    );
    let (engine_tx, engine_rx) = mpsc::channel::<(usize, u64, Flag)>();

    let engine = {
        let memory = memory.clone();
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xE);
            let mut copied = Vec::new();
            for (slot, seq, flag) in engine_rx {
                if rng.random_bool(0.3) {
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..200)));
                }
                for i in 0..SLOT_BYTES {
                    let got = memory[slot * SLOT_BYTES + i].load(Ordering::SeqCst);
                    assert_eq!(
                        got, seq as u8,
                        "slot {slot} overwritten while copying batch {seq}"
                    );
                    if i == SLOT_BYTES / 2 && rng.random_bool(0.05) {
                        std::thread::yield_now();
                    }
                }
                copied.push(seq);
                *flag.0.done.lock().unwrap() = true;
                flag.0.cv.notify_all();
            }
            copied
        })
    };

    let filler_handles: Vec<_> = (0..fillers)
        .map(|f| {
            let (ring, memory) = (ring.clone(), memory.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + f as u64);
                while let Some(claim) = ring.acquire(f).unwrap() {
                    let base = claim.slot() * SLOT_BYTES;
                    for i in 0..SLOT_BYTES {
                        memory[base + i].store(claim.seq() as u8, Ordering::SeqCst);
                    }
                    if rng.random_bool(0.2) {
                        std::thread::sleep(Duration::from_micros(rng.random_range(0..100)));
                    }
                    ring.fill_done(claim);
                }
            })
        })
        .collect();

    for seq in 0..total {
        let slot = ring.next_filled(seq).expect("ring shut down unexpectedly");
        let flag = Flag::default();
        ring.copy_issued(slot, flag.clone());
        engine_tx.send((slot, seq, flag)).unwrap();
    }
    drop(engine_tx);
    for handle in filler_handles {
        handle.join().unwrap();
    }
    let copied = engine.join().unwrap();
    assert_eq!(
        copied,
        (0..total).collect::<Vec<_>>(),
        "every batch exactly once, in order"
    );
    ring.drain().unwrap();
    let stats = ring.stats();
    assert_eq!(stats.claims, total);
    assert!(stats.peak_in_use <= capacity);
    assert!(ring.slot_sequences().iter().all(Option::is_none));
}

#[test]
fn many_fillers_small_ring() {
    for seed in 0..20 {
        run(2, 300, 8, seed);
    }
}

#[test]
fn one_slot_ring() {
    for seed in 0..5 {
        run(1, 200, 4, seed);
    }
}

#[test]
fn more_slots_than_fillers() {
    for seed in 0..10 {
        run(16, 2000, 3, seed);
    }
}
