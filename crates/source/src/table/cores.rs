//! Threads that work on one chunk beside its reader (tokenizing its rows), taken only from
//! cores no such thread is busy on: chunks worked on together do not multiply the threads
//! past the cores.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads busy on chunks now, in every table of the process.
static BUSY: AtomicUsize = AtomicUsize::new(0);

/// The calling thread and the helpers it was given, counted in [`BUSY`] until dropped.
pub(crate) struct Busy(usize);

impl Busy {
    /// The caller, and up to `wanted` helpers: as many as the cores no thread is busy on.
    pub(crate) fn take(wanted: usize) -> Busy {
        let cores = crate::system::cores();
        let mut busy = BUSY.fetch_add(1, Ordering::Relaxed) + 1;
        loop {
            let take = wanted.min(cores.saturating_sub(busy));
            if take == 0 {
                return Busy(1);
            }
            match BUSY.compare_exchange_weak(
                busy,
                busy + take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Busy(1 + take),
                Err(now) => busy = now,
            }
        }
    }

    /// Threads to split the work among: the caller's and its helpers.
    pub(crate) fn threads(&self) -> usize {
        self.0
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.fetch_sub(self.0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_gets_at_most_the_helpers_it_wants_and_the_cores() {
        // Other tests may hold cores meanwhile: only bounds that hold whatever they do.
        let cores = crate::system::cores();
        assert_eq!(Busy::take(0).threads(), 1);
        let all = Busy::take(usize::MAX);
        assert!(all.threads() >= 1 && all.threads() <= cores.max(1));
        assert!(Busy::take(2).threads() <= 3);
    }
}
