//! Model-checks the ring with loom: `RUSTFLAGS="--cfg loom" cargo test -p pinfeed-ring --test loom --release`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use pinfeed_ring::{Fence, Ring};

#[derive(Clone, Default)]
struct Flag(Arc<(Mutex<bool>, Condvar)>);

impl Fence for Flag {
    type Error = std::convert::Infallible;
    fn is_complete(&self) -> Result<bool, Self::Error> {
        Ok(*self.0 .0.lock().unwrap())
    }
    fn wait(&self) -> Result<(), Self::Error> {
        let mut done = self.0 .0.lock().unwrap();
        while !*done {
            done = self.0 .1.wait(done).unwrap();
        }
        Ok(())
    }
}

impl Flag {
    fn complete(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

/// Two fillers, one copier completing fences itself, one slot of contention: every batch is
/// delivered once, in order, and a slot is never claimed while its fence is incomplete.
#[test]
fn two_fillers_one_copier() {
    loom::model(|| {
        let ring = Arc::new(Ring::<Flag>::new(1, 3));
        let in_flight = Arc::new(AtomicBool::new(false));
        let fillers: Vec<_> = (0..2)
            .map(|filler| {
                let (ring, in_flight) = (ring.clone(), in_flight.clone());
                loom::thread::spawn(move || {
                    while let Some(claim) = ring.acquire(filler).unwrap() {
                        assert!(
                            !in_flight.load(Ordering::SeqCst),
                            "slot claimed during a copy"
                        );
                        ring.fill_done(claim);
                    }
                })
            })
            .collect();
        for seq in 0..3 {
            let slot = ring.next_filled(seq).unwrap();
            let flag = Flag::default();
            in_flight.store(true, Ordering::SeqCst);
            ring.copy_issued(slot, flag.clone());
            in_flight.store(false, Ordering::SeqCst);
            flag.complete();
        }
        for f in fillers {
            f.join().unwrap();
        }
    });
}

/// Shutdown while a filler waits on a fence and the copier waits for a batch: nobody hangs.
#[test]
fn shutdown_releases_everyone() {
    loom::model(|| {
        let ring = Arc::new(Ring::<Flag>::new(1, 5));
        let claim = ring.acquire(0).unwrap().unwrap();
        ring.fill_done(claim);
        let slot = ring.next_filled(0).unwrap();
        let flag = Flag::default();
        ring.copy_issued(slot, flag.clone());
        let filler = {
            let ring = ring.clone();
            loom::thread::spawn(move || ring.acquire(0).unwrap().map(|c| c.seq()))
        };
        let copier = {
            let ring = ring.clone();
            loom::thread::spawn(move || ring.next_filled(1))
        };
        ring.shutdown();
        flag.complete();
        let got = filler.join().unwrap();
        assert!(got.is_none() || got == Some(1));
        assert_eq!(copier.join().unwrap(), None);
    });
}

/// Two fillers, two slots, copies completed by the copier after the next batch is issued, so
/// that a slot can come free while its filler sleeps and is kept for it: every batch is
/// delivered once, in order, a slot is never claimed while its copy is in flight, and nobody
/// hangs.
#[test]
fn slots_kept_for_their_fillers() {
    loom::model(|| {
        let ring = Arc::new(Ring::<Flag>::new(2, 3));
        let in_flight = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let fillers: Vec<_> = (0..2)
            .map(|filler| {
                let (ring, in_flight) = (ring.clone(), in_flight.clone());
                loom::thread::spawn(move || {
                    let mut claimed = 0;
                    while let Some(claim) = ring.acquire(filler).unwrap() {
                        assert!(
                            !in_flight[claim.slot()].load(Ordering::SeqCst),
                            "slot claimed during its copy"
                        );
                        ring.fill_done(claim);
                        claimed += 1;
                    }
                    claimed
                })
            })
            .collect();
        let mut previous: Option<(usize, Flag)> = None;
        let finish = |(slot, flag): (usize, Flag)| {
            in_flight[slot].store(false, Ordering::SeqCst);
            flag.complete();
        };
        for seq in 0..3 {
            let slot = ring.next_filled(seq).unwrap();
            let flag = Flag::default();
            in_flight[slot].store(true, Ordering::SeqCst);
            ring.copy_issued(slot, flag.clone());
            if let Some(done) = previous.replace((slot, flag)) {
                finish(done);
            }
        }
        finish(previous.unwrap());
        let claimed: usize = fillers.into_iter().map(|f| f.join().unwrap()).sum();
        assert_eq!(claimed, 3);
    });
}
