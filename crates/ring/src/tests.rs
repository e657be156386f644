use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex as StdMutex;

/// A fence completed by hand.
#[derive(Debug, Default)]
struct Flag {
    done: StdMutex<bool>,
    cv: std::sync::Condvar,
}

impl Flag {
    fn complete(&self) {
        *self.done.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

#[derive(Debug, Clone, Default)]
struct SharedFlag(std::sync::Arc<Flag>);

impl Fence for SharedFlag {
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

#[test]
fn sequences_follow_claims_and_stop_at_total() {
    let ring = Ring::<SharedFlag>::new(3, 2);
    let a = ring.acquire(0).unwrap().unwrap();
    let b = ring.acquire(0).unwrap().unwrap();
    assert_eq!((a.seq(), b.seq()), (0, 1));
    assert_ne!(a.slot(), b.slot());
    assert!(ring.acquire(0).unwrap().is_none());
    ring.fill_done(a);
    ring.fill_done(b);
}

#[test]
fn delivers_in_sequence_order_whatever_the_fill_order() {
    let ring = Ring::<SharedFlag>::new(3, 3);
    let claims: Vec<Claim> = (0..3).map(|_| ring.acquire(0).unwrap().unwrap()).collect();
    let slots: Vec<usize> = claims.iter().map(Claim::slot).collect();
    for claim in claims.into_iter().rev() {
        ring.fill_done(claim);
    }
    for seq in 0..3 {
        assert_eq!(ring.next_filled(seq), Some(slots[seq as usize]));
        ring.copy_issued(slots[seq as usize], SharedFlag::default());
    }
    assert_eq!(ring.next_filled(3), None);
}

#[test]
fn a_range_gives_the_lowest_filled_batch_in_it_and_none_outside() {
    let ring = Ring::<SharedFlag>::new(4, 4);
    let claims: Vec<Claim> = (0..4).map(|_| ring.acquire(0).unwrap().unwrap()).collect();
    let slots: Vec<usize> = claims.iter().map(Claim::slot).collect();
    let mut claims = claims.into_iter().map(Some).collect::<Vec<_>>();
    for seq in [3, 2] {
        ring.fill_done(claims[seq].take().unwrap());
    }
    // 0 and 1 are still being filled: the lowest filled of 0..4 is 2, and 0..3 holds it too.
    assert_eq!(ring.next_filled_in(0..4), Some((slots[2], 2)));
    assert_eq!(ring.next_filled_in(0..3), Some((slots[2], 2)));
    ring.copy_issued(slots[2], SharedFlag::default());
    assert_eq!(ring.next_filled_in(0..4), Some((slots[3], 3)));
    ring.copy_issued(slots[3], SharedFlag::default());
    // Nothing filled in 0..2 yet: the copy engine waits until 1 is, though 0 is not.
    let ring = std::sync::Arc::new(ring);
    let second = claims[1].take().unwrap();
    let filler = after(DELAY, {
        let ring = ring.clone();
        move || ring.fill_done(second)
    });
    assert_eq!(ring.next_filled_in(0..2), Some((slots[1], 1)));
    filler.join().unwrap();
    ring.copy_issued(slots[1], SharedFlag::default());
    ring.fill_done(claims[0].take().unwrap());
    assert_eq!(ring.next_filled_in(0..1), Some((slots[0], 0)));
    assert_eq!(ring.next_filled_in(4..8), None, "past the last batch");
}

#[test]
fn slot_is_not_reused_before_its_fence_completes() {
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(1, 2));
    let claim = ring.acquire(0).unwrap().unwrap();
    let slot = claim.slot();
    ring.fill_done(claim);
    assert_eq!(ring.next_filled(0), Some(slot));
    let fence = SharedFlag::default();
    ring.copy_issued(slot, fence.clone());

    let got_second = std::sync::Arc::new(AtomicBool::new(false));
    let filler = {
        let ring = ring.clone();
        let got_second = got_second.clone();
        std::thread::spawn(move || {
            let claim = ring.acquire(0).unwrap().unwrap();
            got_second.store(true, Ordering::SeqCst);
            claim
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !got_second.load(Ordering::SeqCst),
        "the slot was handed out while its copy was in flight"
    );
    fence.0.complete();
    let claim = filler.join().unwrap();
    assert_eq!((claim.slot(), claim.seq()), (slot, 1));
    ring.fill_done(claim);
    let stats = ring.stats();
    assert_eq!(stats.recycled, 1);
    assert_eq!(stats.claims_waited, 1);
}

#[test]
fn shutdown_wakes_blocked_fillers_and_copier() {
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(1, 10));
    let held = ring.acquire(0).unwrap().unwrap();
    let filler = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.acquire(0).unwrap())
    };
    let copier = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.next_filled(0))
    };
    std::thread::sleep(Duration::from_millis(20));
    ring.shutdown();
    assert_eq!(filler.join().unwrap(), None);
    assert_eq!(copier.join().unwrap(), None);
    ring.fill_abandoned(held);
    assert!(ring.is_shut_down());
}

#[test]
fn abandoning_a_claim_shuts_the_ring_down() {
    let ring = Ring::<SharedFlag>::new(2, 4);
    let claim = ring.acquire(0).unwrap().unwrap();
    ring.fill_abandoned(claim);
    assert!(ring.acquire(0).unwrap().is_none());
    assert_eq!(ring.next_filled(0), None);
}

#[test]
fn drain_waits_for_every_fence() {
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(2, 2));
    let fences = [SharedFlag::default(), SharedFlag::default()];
    for fence in &fences {
        let claim = ring.acquire(0).unwrap().unwrap();
        let (slot, seq) = (claim.slot(), claim.seq());
        ring.fill_done(claim);
        assert_eq!(ring.next_filled(seq), Some(slot));
        ring.copy_issued(slot, fence.clone());
    }
    let drained = std::sync::Arc::new(AtomicBool::new(false));
    let drainer = {
        let (ring, drained) = (ring.clone(), drained.clone());
        std::thread::spawn(move || {
            ring.drain().unwrap();
            drained.store(true, Ordering::SeqCst);
        })
    };
    fences[1].0.complete();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !drained.load(Ordering::SeqCst),
        "drain returned with a copy in flight"
    );
    fences[0].0.complete();
    drainer.join().unwrap();
    assert_eq!(ring.slot_sequences(), vec![None, None]);
}

/// A fence whose wait returns but whose query fails: a driver error between the two calls.
#[derive(Debug)]
struct QueryFails;

#[derive(Debug)]
struct QueryError;

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("query failed")
    }
}

impl std::error::Error for QueryError {}

impl Fence for QueryFails {
    type Error = QueryError;
    fn is_complete(&self) -> Result<bool, Self::Error> {
        Err(QueryError)
    }
    fn wait(&self) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[test]
fn drain_reports_a_failed_reclaim() {
    let ring = Ring::<QueryFails>::new(1, 1);
    let claim = ring.acquire(0).unwrap().unwrap();
    let (slot, seq) = (claim.slot(), claim.seq());
    ring.fill_done(claim);
    assert_eq!(ring.next_filled(seq), Some(slot));
    ring.copy_issued(slot, QueryFails);
    assert!(
        ring.drain().is_err(),
        "drain said every copy was done though the ring could not take its slot back"
    );
}

#[test]
#[should_panic(expected = "not Filled")]
fn issuing_a_copy_of_an_unfilled_slot_is_a_bug() {
    let ring = Ring::<SharedFlag>::new(1, 1);
    ring.copy_issued(0, SharedFlag::default());
}

/// A fence already completed.
fn finished() -> SharedFlag {
    let fence = SharedFlag::default();
    fence.0.complete();
    fence
}

/// Takes batch `seq` through the ring for `filler`: claims a slot, fills it and issues its copy
/// with `fence`. Returns the slot.
fn pass(ring: &Ring<SharedFlag>, filler: usize, seq: u64, fence: &SharedFlag) -> usize {
    let claim = ring.acquire(filler).unwrap().unwrap();
    assert_eq!(claim.seq(), seq);
    let slot = claim.slot();
    ring.fill_done(claim);
    assert_eq!(ring.next_filled(seq), Some(slot));
    ring.copy_issued(slot, fence.clone());
    slot
}

/// Claims a slot for `filler` on a thread of its own, blocking there as long as the ring makes
/// it, and fills it. The thread returns the claim's slot and sequence number.
fn claim_on_thread(
    ring: &std::sync::Arc<Ring<SharedFlag>>,
    filler: usize,
) -> std::thread::JoinHandle<(usize, u64)> {
    let ring = ring.clone();
    std::thread::spawn(move || {
        let claim = ring.acquire(filler).unwrap().unwrap();
        let taken = (claim.slot(), claim.seq());
        ring.fill_done(claim);
        taken
    })
}

#[test]
fn a_pass_cycles_the_fewest_slots_the_slot_freed_last_first() {
    // Eight slots, one batch in flight at a time: every batch reuses the slot its predecessor
    // freed, and the other seven are never touched.
    let ring = Ring::<SharedFlag>::new(8, 20);
    let used: Vec<usize> = (0..20)
        .map(|seq| pass(&ring, 0, seq, &finished()))
        .collect();
    assert!(used.iter().all(|&s| s == used[0]), "slots used: {used:?}");

    // With two copies unfinished, the next claim takes a third slot, and once they finish the
    // slot freed last (the second copy's) comes back first.
    let ring = Ring::<SharedFlag>::new(4, 4);
    let fences = [SharedFlag::default(), SharedFlag::default()];
    let slots: Vec<usize> = (0..2)
        .map(|seq| pass(&ring, 0, seq, &fences[seq as usize]))
        .collect();
    let third = ring.acquire(0).unwrap().unwrap();
    assert!(!slots.contains(&third.slot()));
    fences.iter().for_each(|f| f.0.complete());
    let fourth = ring.acquire(0).unwrap().unwrap();
    assert_eq!(fourth.slot(), slots[1]);
    ring.fill_done(third);
    ring.fill_done(fourth);
}

#[test]
fn a_filler_takes_back_the_slot_it_filled_itself() {
    // Two fillers, four slots: once both own a slot, each claims its own again, though the other
    // filler's slot was freed later (and would be on top of the stack).
    let ring = Ring::<SharedFlag>::new(4, 8);
    let mut own: [Option<usize>; 2] = [None; 2];
    for seq in 0..8u64 {
        let filler = (seq % 2) as usize;
        let slot = pass(&ring, filler, seq, &finished());
        assert_eq!(*own[filler].get_or_insert(slot), slot, "batch {seq}");
    }
    assert_ne!(own[0], own[1]);
    assert_eq!(
        ring.stats().claims_own,
        6,
        "every claim but each filler's first"
    );

    // A filler none of whose slots is free, with every slot claimed before, takes the slot
    // freed last.
    let ring = Ring::<SharedFlag>::new(2, 3);
    let freed = [
        pass(&ring, 0, 0, &finished()),
        pass(&ring, 1, 1, &finished()),
    ];
    let third = ring.acquire(2).unwrap().unwrap();
    assert_eq!(third.slot(), freed[1]);
    ring.fill_done(third);

    // With its own slot still being copied, a filler takes another free slot rather than wait.
    let ring = Ring::<SharedFlag>::new(2, 2);
    let slot = pass(&ring, 0, 0, &SharedFlag::default());
    let second = ring.acquire(0).unwrap().unwrap();
    assert_ne!(second.slot(), slot);
    ring.fill_done(second);
}

#[test]
fn a_slot_freed_while_its_filler_sleeps_goes_back_to_it() {
    // Two slots, both being copied: filler 1 waits on the oldest copy (filler 0's slot) and
    // filler 0 waits asleep. When that copy finishes, filler 1 leaves the slot to filler 0 and
    // waits on the next copy, which frees its own.
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(2, 4));
    let fences = [SharedFlag::default(), SharedFlag::default()];
    let slots = [pass(&ring, 0, 0, &fences[0]), pass(&ring, 1, 1, &fences[1])];
    let until = |what: &str, done: &dyn Fn(&State<SharedFlag>) -> bool| {
        let started = Instant::now();
        while !done(&ring.lock()) {
            assert!(started.elapsed() < Duration::from_secs(10), "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let second = claim_on_thread(&ring, 1);
    until("filler 1 waits on a fence", &|s| s.fence_waiter);
    let first = claim_on_thread(&ring, 0);
    until("filler 0 sleeps", &|s| s.fillers.is_asleep(0));

    fences[0].0.complete();
    until("the freed slot is claimed again", &|s| {
        matches!(
            s.slots[slots[0]],
            SlotState::Filling { .. } | SlotState::Filled { .. }
        )
    });
    assert_eq!(
        ring.lock().filled_by[slots[0]],
        Some(0),
        "claimed by the wrong filler"
    );
    fences[1].0.complete();
    assert_eq!(first.join().unwrap().0, slots[0]);
    assert_eq!(second.join().unwrap().0, slots[1]);
    let stats = ring.stats();
    assert_eq!((stats.claims, stats.claims_own), (4, 2), "{stats:?}");
}

/// Runs `then` on a thread of its own after `delay`, while the caller goes on to wait in the
/// ring. The caller's wait lasts about `delay`, less by however long the caller was kept from
/// starting it, which is why the tests below ask for a quarter of it.
fn after(delay: Duration, then: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        then();
    })
}

const DELAY: Duration = Duration::from_millis(100);

#[test]
fn the_copy_engine_waiting_behind_an_unfilled_batch_is_counted_apart() {
    // Batch 1 is filled before batch 0: the copy engine's wait for batch 0 is a wait behind it.
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(2, 3));
    let first = ring.acquire(0).unwrap().unwrap();
    let second = ring.acquire(1).unwrap().unwrap();
    ring.fill_done(second);
    let slot = first.slot();
    let filler = after(DELAY, {
        let ring = ring.clone();
        move || ring.fill_done(first)
    });
    assert_eq!(ring.next_filled(0), Some(slot));
    filler.join().unwrap();
    let stats = ring.stats();
    assert!(stats.wait_filled_behind >= DELAY / 4, "{stats:?}");
    assert!(stats.wait_filled >= stats.wait_filled_behind, "{stats:?}");

    // With nothing filled after it, waiting for batch 2 is no wait behind another.
    ring.copy_issued(slot, finished());
    assert!(ring.next_filled(1).is_some());
    let before = ring.stats();
    let third = ring.acquire(0).unwrap().unwrap();
    let filler = after(DELAY, {
        let ring = ring.clone();
        move || ring.fill_done(third)
    });
    assert!(ring.next_filled(2).is_some());
    filler.join().unwrap();
    let stats = ring.stats();
    assert!(
        stats.wait_filled >= before.wait_filled + DELAY / 4,
        "{stats:?}"
    );
    assert_eq!(
        stats.wait_filled_behind, before.wait_filled_behind,
        "{stats:?}"
    );
}

#[test]
fn a_wait_behind_counts_batches_filled_past_the_range_only() {
    // 1 is filled; waiting for something in 0..2 is no wait behind, as 1 is in the range (and
    // is handed out at once); waiting in 2..3 while 3 is filled is one.
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(4, 4));
    let claims: Vec<Claim> = (0..4).map(|_| ring.acquire(0).unwrap().unwrap()).collect();
    let [zero, one, two, three] = claims.try_into().unwrap();
    let slot = one.slot();
    ring.fill_done(one);
    assert_eq!(ring.next_filled_in(0..2), Some((slot, 1)));
    assert_eq!(ring.stats().wait_filled, Duration::ZERO);
    ring.fill_done(three);
    let filler = after(DELAY, {
        let ring = ring.clone();
        move || ring.fill_done(two)
    });
    assert!(ring.next_filled_in(2..3).is_some());
    filler.join().unwrap();
    let stats = ring.stats();
    assert!(stats.wait_filled_behind >= DELAY / 4, "{stats:?}");
    assert!(stats.wait_filled >= stats.wait_filled_behind, "{stats:?}");
    ring.fill_done(zero);
}

#[test]
fn a_wait_cut_short_by_shutdown_counts_in_neither_whole_nor_part() {
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(2, 4));
    let first = ring.acquire(0).unwrap().unwrap();
    let second = ring.acquire(1).unwrap().unwrap();
    ring.fill_done(second);
    let stop = after(DELAY / 4, {
        let ring = ring.clone();
        move || ring.shutdown()
    });
    // The copy engine waits behind batch 0, and a filler with no copy in flight; both end so.
    let filler = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.acquire(2).unwrap())
    };
    assert_eq!(ring.next_filled(0), None);
    assert_eq!(filler.join().unwrap(), None);
    stop.join().unwrap();
    ring.fill_abandoned(first);
    let stats = ring.stats();
    assert_eq!(
        (stats.wait_filled, stats.wait_filled_behind),
        (Duration::ZERO, Duration::ZERO)
    );
    assert_eq!(
        (stats.wait_free, stats.wait_free_no_copy),
        (Duration::ZERO, Duration::ZERO)
    );
}

#[test]
fn a_filler_waiting_with_no_copy_in_flight_is_counted_apart() {
    // One slot, being filled: the second claim waits with no copy in flight until the first
    // batch's copy is issued.
    let ring = std::sync::Arc::new(Ring::<SharedFlag>::new(1, 5));
    let first = ring.acquire(0).unwrap().unwrap();
    let slot = first.slot();
    let copier = after(DELAY, {
        let ring = ring.clone();
        move || {
            ring.fill_done(first);
            assert_eq!(ring.next_filled(0), Some(slot));
            ring.copy_issued(slot, finished());
        }
    });
    let second = ring.acquire(1).unwrap().unwrap();
    copier.join().unwrap();
    let stats = ring.stats();
    assert!(stats.wait_free_no_copy >= DELAY / 4, "{stats:?}");
    assert!(stats.wait_free >= stats.wait_free_no_copy, "{stats:?}");

    // A filler asleep while a copy is issued and runs counts only the time before it: here
    // two wait, one on the copy's fence, the other beside it for the whole copy.
    let before = ring.stats();
    let waiters: Vec<_> = (2..4)
        .map(|filler| claim_on_thread(&ring, filler))
        .collect();
    std::thread::sleep(DELAY / 4); // both asleep, with no copy in flight
    ring.fill_done(second);
    assert_eq!(ring.next_filled(1), Some(slot));
    let fence = SharedFlag::default();
    ring.copy_issued(slot, fence.clone());
    std::thread::sleep(DELAY);
    fence.0.complete();
    for seq in 2..4 {
        assert_eq!(ring.next_filled(seq), Some(slot));
        ring.copy_issued(slot, finished());
    }
    let mut seqs: Vec<u64> = waiters.into_iter().map(|w| w.join().unwrap().1).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [2, 3]);
    let stats = ring.stats();
    let waited = stats.wait_free - before.wait_free;
    let no_copy = stats.wait_free_no_copy - before.wait_free_no_copy;
    // Each waited through the copy (DELAY), with a copy in flight all along.
    assert!(waited >= 2 * DELAY, "{stats:?}");
    assert!(no_copy + DELAY * 3 / 2 <= waited, "{stats:?}");
}
