//! The staging ring of pinfeed: a fixed set of slots cycled between reader threads and a copy engine.
//!
//! The ring owns no memory and knows nothing about CUDA. It hands out slot *indices* and sequence
//! numbers, and it guarantees the properties that make the data path safe:
//!
//! - a slot is held by one filler at a time ([`Claim`]);
//! - the copy engine takes batches in sequence order ([`Ring::next_filled`]), whatever order the
//!   fillers finish in, or the lowest filled one within a range of sequence numbers it names
//!   ([`Ring::next_filled_in`]);
//! - a slot whose copy was issued returns to the free list only after that copy's [`Fence`]
//!   reports completion, so a slot is never overwritten while a copy may still read it.
//!
//! Each slot goes `Free → Filling → Filled → Copying → Free`. Fillers block (without spinning)
//! while every slot is busy or kept for another filler ([`Ring::acquire`]), and the copy engine
//! blocks while the next batch is not yet filled: back-pressure both ways. [`Ring::shutdown`]
//! wakes everyone, and [`Ring::drain`] waits for every outstanding fence so that the memory
//! behind the slots can be freed.
//!
//! The ring is generic over the fence, so the same code runs with a CUDA event, with the host
//! backend's completion flag, and under loom with a mock fence (`RUSTFLAGS="--cfg loom"`).
//!
//! ```
//! use pinfeed_ring::{Fence, Ring};
//!
//! #[derive(Debug)]
//! struct Done;
//! impl Fence for Done {
//!     type Error = std::convert::Infallible;
//!     fn is_complete(&self) -> Result<bool, Self::Error> { Ok(true) }
//!     fn wait(&self) -> Result<(), Self::Error> { Ok(()) }
//! }
//!
//! let ring = Ring::<Done>::new(2, 3);
//! let mut delivered = Vec::new();
//! for _ in 0..3 {
//!     let claim = ring.acquire(0).unwrap().expect("batches remain");
//!     ring.fill_done(claim);
//!     let seq = delivered.len() as u64;
//!     let slot = ring.next_filled(seq).expect("filled");
//!     ring.copy_issued(slot, Done);
//!     delivered.push(seq);
//! }
//! assert!(ring.acquire(0).unwrap().is_none(), "all batches were handed out");
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

mod fillers;
mod sync;

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use fillers::Fillers;
use sync::{Arc, Condvar, Mutex, MutexGuard};

/// Completion of an asynchronous copy out of a slot: a CUDA event, or a flag on the host backend.
pub trait Fence: Send + Sync {
    /// Why waiting on the fence failed (a CUDA error, say).
    type Error: std::error::Error + Send + Sync + 'static;
    /// Whether the copy has finished, without blocking.
    fn is_complete(&self) -> Result<bool, Self::Error>;
    /// Blocks the calling thread until the copy has finished. Must not spin.
    fn wait(&self) -> Result<(), Self::Error>;
}

/// A slot handed to one filler, with the sequence number of the batch it must hold.
///
/// Holding a `Claim` is what gives a filler the right to write into the slot's memory: the ring
/// hands out each slot to one claimant at a time and takes it back only through
/// [`Ring::fill_done`] or [`Ring::fill_abandoned`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a claimed slot must be filled or abandoned"]
pub struct Claim {
    slot: usize,
    seq: u64,
}

impl Claim {
    /// The slot index, in `0 .. capacity`.
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// The sequence number of the batch this slot must be filled with.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// Where the time went, from the ring's point of view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Slots in the ring.
    pub capacity: usize,
    /// Claims handed to fillers.
    pub claims: u64,
    /// Claims that had to wait because no slot was free.
    pub claims_waited: u64,
    /// Claims that got back a slot the same filler had filled last ([`Ring::acquire`]).
    pub claims_own: u64,
    /// Total time fillers spent waiting for a free slot (the copy engine or the consumer was behind).
    pub wait_free: Duration,
    /// Of `wait_free`, the time no copy was in flight (none issued and not yet taken back):
    /// every slot was being filled, or filled and waiting for its turn (behind a batch still
    /// being filled, or a consumer that was behind). Summed over fillers, as `wait_free` is.
    pub wait_free_no_copy: Duration,
    /// Total time the copy engine spent waiting for the next batch to be filled (the readers were behind).
    pub wait_filled: Duration,
    /// Of `wait_filled`, the time a later sequence number was filled already, beyond the range
    /// the copy engine asked for ([`Ring::next_filled_in`]): one still being filled held back
    /// those filled after it.
    pub wait_filled_behind: Duration,
    /// Slots returned to the free list after their fence completed.
    pub recycled: u64,
    /// Most slots out of the free list at once.
    pub peak_in_use: usize,
}

enum SlotState<F> {
    Free,
    Filling {
        seq: u64,
    },
    Filled {
        seq: u64,
    },
    /// The copy out of this slot was issued; `fence` completes when it has finished reading.
    Copying {
        seq: u64,
        fence: Arc<F>,
    },
}

impl<F> fmt::Debug for SlotState<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotState::Free => write!(f, "Free"),
            SlotState::Filling { seq } => write!(f, "Filling({seq})"),
            SlotState::Filled { seq } => write!(f, "Filled({seq})"),
            SlotState::Copying { seq, .. } => write!(f, "Copying({seq})"),
        }
    }
}

struct State<F> {
    slots: Vec<SlotState<F>>,
    /// Indices of `Free` slots in the order they were freed (a stack: `take_free` looks from
    /// the top). Every index appears at most once, and only for `Free` slots.
    free: Vec<usize>,
    /// The filler that claimed each slot last (`None` before its first claim).
    filled_by: Vec<Option<usize>>,
    /// Which fillers are asleep in `acquire`, and how to wake each one.
    fillers: Fillers,
    /// Indices of `Copying` slots in the order their copies were issued (the order they finish in
    /// on one stream, so the oldest is the one worth waiting for).
    copying: VecDeque<usize>,
    /// Whether some thread is blocked in `Fence::wait` on the oldest copying slot; others then
    /// sleep, each on its own condition variable ([`Fillers`]), rather than on the same fence.
    fence_waiter: bool,
    /// How long `copying` has been empty, all told: a filler's wait with no copy in flight is
    /// the growth of [`NoCopyClock::now`] over it, however often the queue filled and emptied.
    no_copy: NoCopyClock,
    /// The next sequence number to hand out; always `<= total`.
    next_seq: u64,
    /// Sequence numbers at or beyond this are never handed out.
    total: u64,
    shutdown: bool,
    stats: RingStats,
}

impl<F> State<F> {
    fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether free `slot` is kept for the filler that filled it last: that filler has been
    /// woken and has not run yet (woken to take this slot back, or for other work before it
    /// came free), so it will take the slot as its own.
    fn kept(&self, slot: usize) -> bool {
        self.filled_by[slot].is_some_and(|owner| self.fillers.is_woken(owner))
    }

    /// Wakes as many sleeping fillers as the ring has work for, besides those woken already:
    /// one for each free slot not kept for its filler, and one to wait on the oldest copy when
    /// nobody does. Once no batch is left (or the ring shut down), every one, to leave.
    fn wake_fillers(&mut self) {
        if self.shutdown || self.next_seq >= self.total {
            self.fillers.wake_all();
            return;
        }
        let spare = self.free.iter().filter(|&&slot| !self.kept(slot)).count();
        let wanted = spare + usize::from(!self.copying.is_empty() && !self.fence_waiter);
        // Fillers woken with no slot kept for them are on their way to the spare work already.
        let mut coming = self
            .fillers
            .woken()
            .filter(|&f| {
                !self
                    .free
                    .iter()
                    .any(|&slot| self.filled_by[slot] == Some(f))
            })
            .count();
        while coming < wanted && self.fillers.wake_first() {
            coming += 1;
        }
    }
}

/// A clock that runs while no copy is in flight.
struct NoCopyClock {
    /// Time counted up to `since`.
    total: Duration,
    /// When the copying queue last became empty, while it is empty.
    since: Option<Instant>,
}

impl NoCopyClock {
    /// The time counted so far.
    fn now(&self) -> Duration {
        self.total + self.since.map_or(Duration::ZERO, |t| t.elapsed())
    }
    /// The copying queue got its first copy: stop.
    fn stop(&mut self) {
        if let Some(t) = self.since.take() {
            self.total += t.elapsed();
        }
    }
    /// The copying queue became empty: run.
    fn start(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }
}

/// A fixed set of slots, cycled between fillers and a copy engine. See the crate documentation.
pub struct Ring<F: Fence> {
    /// Fillers waiting for a slot sleep on condition variables of their own, in the state
    /// ([`Fillers`]).
    state: Mutex<State<F>>,
    /// Signalled when a slot becomes filled, or the ring shuts down.
    slot_filled: Condvar,
}

impl<F: Fence> fmt::Debug for Ring<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Ring")
            .field("slots", &state.slots)
            .field("next_seq", &state.next_seq)
            .field("total", &state.total)
            .field("shutdown", &state.shutdown)
            .finish()
    }
}

impl<F: Fence> Ring<F> {
    /// A ring of `capacity` slots that will hand out sequence numbers `0 .. total`.
    ///
    /// # Panics
    /// If `capacity` is zero: a ring with no slot can never move a batch.
    pub fn new(capacity: usize, total: u64) -> Self {
        assert!(capacity > 0, "a ring needs at least one slot");
        let state = State {
            slots: (0..capacity).map(|_| SlotState::Free).collect(),
            free: (0..capacity).rev().collect(),
            filled_by: vec![None; capacity],
            fillers: Fillers::default(),
            copying: VecDeque::with_capacity(capacity),
            fence_waiter: false,
            no_copy: NoCopyClock {
                total: Duration::ZERO,
                since: Some(Instant::now()),
            },
            next_seq: 0,
            total,
            shutdown: false,
            stats: RingStats {
                capacity,
                ..RingStats::default()
            },
        };
        Ring {
            state: Mutex::new(state),
            slot_filled: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<F>> {
        // A panic while holding this lock can only come from a broken invariant (a debug_assert);
        // the state is still consistent enough to shut down, so poisoning is ignored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.lock().slots.len()
    }

    /// Claims a free slot for the next batch in sequence for filler `filler` (a reader thread's
    /// index), blocking while none is free.
    ///
    /// Each index is one thread's: two threads in `acquire` with the same index at once could
    /// leave one asleep for good. Indices are small (the ring keeps a condition variable for
    /// each up to the largest).
    ///
    /// Returns `Ok(None)` once every sequence number has been handed out or the ring was shut
    /// down. The sequence number is assigned together with the slot, so every outstanding
    /// sequence number owns a slot and the copy engine can never wait for a batch that has none.
    ///
    /// The caller first takes back the slots whose copies have finished; if still none is free,
    /// one caller blocks on the oldest copy's fence (the others sleep, each on a condition
    /// variable of its own).
    ///
    /// Of the free slots, a filler takes the one it filled last itself; when none of its own is
    /// free, one nobody has claimed yet, and only then the slot freed last that is not kept for
    /// another filler (below). So a reader writes round slots of its own whenever one is free,
    /// which copies faster than writing each slot in turn, the order a plain free list hands
    /// slots out in (`examples/copy_rates.rs --ring` in the loader crate compares the two).
    ///
    /// A slot that comes free while the filler that filled it last is asleep here goes back to
    /// that filler: it is woken, and the slot is kept for it. Otherwise a filler waiting on the
    /// oldest copy takes whatever slot that copy freed: without this, readers that often wait
    /// for a slot (small batches from memory) would seldom get their own back.
    pub fn acquire(&self, filler: usize) -> Result<Option<Claim>, F::Error> {
        let mut state = self.lock();
        let mut waited_since: Option<Instant> = None;
        let mut no_copy = Duration::ZERO; // of this claim's wait
        debug_assert!(
            !state.fillers.is_waiting(filler),
            "filler {filler} is waiting in acquire on another thread"
        );
        loop {
            state.fillers.awake(filler);
            if state.shutdown || state.next_seq >= state.total {
                // Others asleep here are done too: wake them to leave.
                state.fillers.wake_all();
                return Ok(None);
            }
            // Slots whose copies have finished go back first, so that a filler finds its own
            // slot free again as soon as its copy is done (see `take_free`).
            if let Err(e) = Self::reclaim_completed(&mut state) {
                state.fillers.wake_all();
                return Err(e);
            }
            if let Some((slot, own)) = Self::take_free(&mut state, filler) {
                debug_assert!(matches!(state.slots[slot], SlotState::Free));
                state.stats.claims_own += u64::from(own);
                let seq = state.next_seq;
                state.next_seq += 1;
                state.slots[slot] = SlotState::Filling { seq };
                state.stats.claims += 1;
                let in_use = state.in_use();
                state.stats.peak_in_use = state.stats.peak_in_use.max(in_use);
                if let Some(since) = waited_since {
                    state.stats.claims_waited += 1;
                    state.stats.wait_free += since.elapsed();
                    state.stats.wait_free_no_copy += no_copy;
                }
                // Wake the next waiter only while there is work for it: waking every reader for
                // each freed slot had a dozen threads query the driver per copy, slowing it.
                state.wake_fillers();
                return Ok(Some(Claim { slot, seq }));
            }
            waited_since.get_or_insert_with(Instant::now);
            let before = state.no_copy.now();
            match state.copying.front() {
                Some(&oldest) if !state.fence_waiter => {
                    let SlotState::Copying { fence, .. } = &state.slots[oldest] else {
                        unreachable!("slot {oldest} is in the copying queue but not Copying");
                    };
                    let fence = Arc::clone(fence);
                    state.fence_waiter = true;
                    drop(state);
                    let waited = fence.wait();
                    state = self.lock();
                    state.fence_waiter = false;
                    if waited.is_err() {
                        state.fillers.wake_all();
                    }
                    // On success this thread goes round again: it takes a slot the copy freed
                    // (unless that one is kept for its filler) or waits again, on the next copy
                    // or asleep.
                    waited?;
                }
                _ => {
                    // Nothing here for another sleeper either: `take_free` left no free slot
                    // but kept ones, whose fillers were woken as they came free.
                    let waker = state.fillers.sleep(filler);
                    state = waker
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            }
            no_copy += state.no_copy.now().saturating_sub(before);
        }
    }

    /// Takes the free slot `filler` filled last, else one no filler has claimed yet, else the
    /// slot freed last that is not kept for another filler; and says whether it was one of
    /// `filler`'s own.
    fn take_free(state: &mut State<F>, filler: usize) -> Option<(usize, bool)> {
        let last_of = |owner: Option<usize>| {
            state
                .free
                .iter()
                .rposition(|&slot| state.filled_by[slot] == owner)
        };
        let at = last_of(Some(filler))
            .or_else(|| last_of(None))
            .or_else(|| state.free.iter().rposition(|&slot| !state.kept(slot)))?;
        let slot = state.free.remove(at);
        let own = state.filled_by[slot].replace(filler) == Some(filler);
        Some((slot, own))
    }

    /// Moves every copying slot whose fence has completed back to the free list, oldest first,
    /// stopping at the first one still in flight (copies on one stream finish in order). A
    /// freed slot's filler, if asleep in `acquire`, is woken to take it back.
    fn reclaim_completed(state: &mut State<F>) -> Result<(), F::Error> {
        while let Some(&slot) = state.copying.front() {
            let SlotState::Copying { fence, .. } = &state.slots[slot] else {
                unreachable!("slot {slot} is in the copying queue but not Copying");
            };
            if !fence.is_complete()? {
                break;
            }
            state.copying.pop_front();
            if state.copying.is_empty() {
                state.no_copy.start();
            }
            state.slots[slot] = SlotState::Free;
            state.free.push(slot);
            state.stats.recycled += 1;
            if let Some(owner) = state.filled_by[slot] {
                state.fillers.wake(owner);
            }
        }
        Ok(())
    }

    /// Marks a claimed slot as filled with its batch: `Filling → Filled`.
    pub fn fill_done(&self, claim: Claim) {
        let mut state = self.lock();
        debug_assert!(
            matches!(state.slots[claim.slot], SlotState::Filling { seq } if seq == claim.seq),
            "fill_done for slot {} seq {}, but it is {:?}",
            claim.slot,
            claim.seq,
            state.slots[claim.slot]
        );
        state.slots[claim.slot] = SlotState::Filled { seq: claim.seq };
        drop(state);
        self.slot_filled.notify_all();
    }

    /// Gives up a claim without filling it (the read failed). The ring shuts down: a batch that
    /// will never be filled would otherwise block the copy engine forever.
    pub fn fill_abandoned(&self, claim: Claim) {
        let mut state = self.lock();
        debug_assert!(matches!(state.slots[claim.slot], SlotState::Filling { .. }));
        state.slots[claim.slot] = SlotState::Free;
        state.free.push(claim.slot);
        state.shutdown = true;
        self.notify_everyone(state);
    }

    /// Blocks until the batch with sequence number `seq` is filled and returns its slot, which
    /// stays `Filled` until [`Ring::copy_issued`]. Returns `None` if the ring shut down first or
    /// `seq` is past the last batch.
    pub fn next_filled(&self, seq: u64) -> Option<usize> {
        self.next_filled_in(seq..seq + 1).map(|(slot, _)| slot)
    }

    /// Blocks until some batch with a sequence number in `seqs` is filled and returns the slot
    /// and sequence number of the lowest such, which stays `Filled` until
    /// [`Ring::copy_issued`]. Returns `None` if the ring shut down first or `seqs` starts past
    /// the last batch.
    ///
    /// With a range of one this is [`Ring::next_filled`]: batches in sequence order. A wider
    /// range lets the copy engine take batches in the order they were filled, within it.
    pub fn next_filled_in(&self, seqs: std::ops::Range<u64>) -> Option<(usize, u64)> {
        let mut state = self.lock();
        let started = Instant::now();
        let mut waited = false;
        let mut behind = Duration::ZERO; // of this wait
        loop {
            if seqs.start >= state.total {
                return None;
            }
            let found = state
                .slots
                .iter()
                .enumerate()
                .filter_map(|(slot, s)| match s {
                    SlotState::Filled { seq } if seqs.contains(seq) => Some((slot, *seq)),
                    _ => None,
                })
                .min_by_key(|&(_, seq)| seq);
            if let Some(found) = found {
                if waited {
                    state.stats.wait_filled += started.elapsed();
                    state.stats.wait_filled_behind += behind;
                }
                return Some(found);
            }
            if state.shutdown {
                return None;
            }
            waited = true;
            // Whether a later one is filled already, held back by the range.
            let later_filled = state
                .slots
                .iter()
                .any(|s| matches!(s, SlotState::Filled { seq } if *seq >= seqs.end))
                .then(Instant::now);
            state = self
                .slot_filled
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(since) = later_filled {
                behind += since.elapsed();
            }
        }
    }

    /// Records that the copy out of a filled slot was issued: `Filled → Copying`. The slot
    /// returns to the free list once `fence` completes.
    pub fn copy_issued(&self, slot: usize, fence: F) {
        let mut state = self.lock();
        let SlotState::Filled { seq } = state.slots[slot] else {
            panic!(
                "copy_issued for slot {slot}, which is {:?}, not Filled",
                state.slots[slot]
            );
        };
        state.slots[slot] = SlotState::Copying {
            seq,
            fence: Arc::new(fence),
        };
        state.copying.push_back(slot);
        state.no_copy.stop();
        // A reader asleep because nothing was in flight must now wait on this copy; with a fence
        // waiter already there, nobody needs waking.
        state.wake_fillers();
    }

    /// Stops the ring: blocked and future [`acquire`](Ring::acquire) and
    /// [`next_filled`](Ring::next_filled) calls return `None`. Slots being copied stay tracked
    /// so that [`drain`](Ring::drain) can wait for them.
    pub fn shutdown(&self) {
        let mut state = self.lock();
        state.shutdown = true;
        self.notify_everyone(state);
    }

    /// Whether [`shutdown`](Ring::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.lock().shutdown
    }

    fn notify_everyone(&self, mut state: MutexGuard<'_, State<F>>) {
        state.fillers.wake_all();
        drop(state);
        self.slot_filled.notify_all();
    }

    /// Waits until no copy may still read any slot, so that the slots' memory can be freed.
    /// Every fence is waited on even if one fails; the first error, of a wait or of taking the
    /// slots back after them, is returned.
    pub fn drain(&self) -> Result<(), F::Error> {
        let fences: Vec<Arc<F>> = {
            let state = self.lock();
            state
                .copying
                .iter()
                .map(|&slot| match &state.slots[slot] {
                    SlotState::Copying { fence, .. } => Arc::clone(fence),
                    other => unreachable!("slot {slot} in the copying queue is {other:?}"),
                })
                .collect()
        };
        let mut first_error = None;
        for fence in fences {
            if let Err(e) = fence.wait() {
                first_error.get_or_insert(e);
            }
        }
        let mut state = self.lock();
        if let Err(e) = Self::reclaim_completed(&mut state) {
            first_error.get_or_insert(e);
        }
        state.wake_fillers();
        drop(state);
        first_error.map_or(Ok(()), Err)
    }

    /// A snapshot of the ring's counters.
    pub fn stats(&self) -> RingStats {
        self.lock().stats.clone()
    }

    /// The sequence number of the batch each slot holds or is being filled with, for tests and
    /// diagnostics (`None` for a free slot).
    pub fn slot_sequences(&self) -> Vec<Option<u64>> {
        self.lock()
            .slots
            .iter()
            .map(|s| match s {
                SlotState::Free => None,
                SlotState::Filling { seq } | SlotState::Filled { seq } => Some(*seq),
                SlotState::Copying { seq, .. } => Some(*seq),
            })
            .collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
