//! The fillers blocked in [`Ring::acquire`](crate::Ring::acquire), each asleep on a condition
//! variable of its own, so that the ring can wake the one filler a freed slot belongs to rather
//! than whichever thread a shared condition variable picks.

use std::collections::VecDeque;

use crate::sync::{Arc, Condvar};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filler {
    /// Running: filling a slot, or in `acquire` holding the lock or waiting on a fence.
    Awake,
    /// Blocked on its condition variable, with nothing yet for it.
    Asleep,
    /// Signalled, and not yet back under the lock.
    Woken,
}

/// Every filler the ring has seen, by index. Only ever used under the ring's lock.
#[derive(Default)]
pub(crate) struct Fillers {
    states: Vec<Filler>,
    wakers: Vec<Arc<Condvar>>,
    /// The `Asleep` fillers, in the order they fell asleep: a wake with no filler in mind goes
    /// to the one asleep longest.
    queue: VecDeque<usize>,
}

impl Fillers {
    fn state(&self, filler: usize) -> Filler {
        self.states.get(filler).copied().unwrap_or(Filler::Awake)
    }

    /// `filler` is running under the lock (it entered `acquire`, or woke up).
    pub(crate) fn awake(&mut self, filler: usize) {
        if filler >= self.states.len() {
            self.states.resize(filler + 1, Filler::Awake);
            self.wakers
                .resize_with(filler + 1, || Arc::new(Condvar::new()));
        }
        if self.states[filler] == Filler::Asleep {
            // Woken by nobody (a spurious wake-up): no longer waiting for a turn.
            self.queue.retain(|&f| f != filler);
        }
        self.states[filler] = Filler::Awake;
    }

    /// `filler` (awake) is about to block: the condition variable to block on.
    pub(crate) fn sleep(&mut self, filler: usize) -> Arc<Condvar> {
        debug_assert_eq!(self.state(filler), Filler::Awake);
        self.states[filler] = Filler::Asleep;
        self.queue.push_back(filler);
        Arc::clone(&self.wakers[filler])
    }

    /// Whether `filler` is asleep, for the tests to wait until it is.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_asleep(&self, filler: usize) -> bool {
        self.state(filler) == Filler::Asleep
    }

    /// Whether a thread with index `filler` is in `acquire`, asleep or woken and not yet back.
    pub(crate) fn is_waiting(&self, filler: usize) -> bool {
        self.state(filler) != Filler::Awake
    }

    /// Whether `filler` was signalled and has not yet run: a slot kept for it stays kept.
    pub(crate) fn is_woken(&self, filler: usize) -> bool {
        self.state(filler) == Filler::Woken
    }

    /// The fillers signalled and not yet running.
    pub(crate) fn woken(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.states.len()).filter(|&f| self.states[f] == Filler::Woken)
    }

    /// Wakes `filler` if it is asleep; says whether it was.
    pub(crate) fn wake(&mut self, filler: usize) -> bool {
        if self.state(filler) != Filler::Asleep {
            return false;
        }
        self.queue.retain(|&f| f != filler);
        self.signal(filler);
        true
    }

    /// Wakes the filler asleep longest, if any; says whether there was one.
    pub(crate) fn wake_first(&mut self) -> bool {
        match self.queue.pop_front() {
            Some(filler) => {
                self.signal(filler);
                true
            }
            None => false,
        }
    }

    /// Wakes every filler asleep.
    pub(crate) fn wake_all(&mut self) {
        while self.wake_first() {}
    }

    fn signal(&mut self, filler: usize) {
        self.states[filler] = Filler::Woken;
        self.wakers[filler].notify_one();
    }
}
