//! The loader's threads as [`Loader::stop`](super::Loader) sees them: running pinfeed's own
//! code, running user code (a transform), or returned.
//!
//! Stopping waits for every thread, but for a thread inside a transform only
//! [`USER_CODE_WAIT`]: user code may never return (a Python transform blocked on a lock, a
//! sleep, a socket), and a process that cannot exit until it does is worse than a thread left
//! behind. A thread left behind still holds the loader's shared state (`Arc<Shared>`, taken
//! when it was spawned), so the pinned slot it writes into, the source it reads and the
//! transform it runs stay alive until it returns; only then is the last reference dropped and
//! the pool freed (after its copies, as always).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long stopping waits for a thread that is inside a transform before leaving it behind.
pub(crate) const USER_CODE_WAIT: Duration = Duration::from_secs(1);

/// In pinfeed's own code: stopping waits for it (it returns soon after the ring shuts down).
const RUNNING: u8 = 0;
/// Inside a transform: stopping waits at most [`USER_CODE_WAIT`].
const USER_CODE: u8 = 1;
/// Returned (or unwound): joining it does not block beyond the thread's last drops.
const RETURNED: u8 = 2;

/// The state of each of a loader's threads, by the index it was spawned with.
pub(super) struct Workers {
    /// One of `RUNNING`, `USER_CODE`, `RETURNED` per thread.
    states: Vec<AtomicU8>,
    /// Taken around the change to `RETURNED`, so that a waiter cannot miss the wake-up.
    lock: Mutex<()>,
    returned: Condvar,
}

impl Workers {
    pub(super) fn new(threads: usize) -> Workers {
        Workers {
            states: (0..threads).map(|_| AtomicU8::new(RUNNING)).collect(),
            lock: Mutex::new(()),
            returned: Condvar::new(),
        }
    }

    /// Marks thread `index` returned when the guard drops, as its closure ends or unwinds.
    pub(super) fn on_return(&self, index: usize) -> OnReturn<'_> {
        OnReturn {
            workers: self,
            index,
        }
    }

    /// Marks thread `index` as running user code until the guard drops.
    pub(super) fn user_code(&self, index: usize) -> UserCode<'_> {
        self.states[index].store(USER_CODE, Ordering::Release);
        UserCode {
            workers: self,
            index,
        }
    }

    /// Waits until every thread of `0 .. started` but `except` (the calling thread, when it is
    /// one of them) has returned, or `bound` has passed and each one that has not is inside
    /// user code. Says, by index, which of them returned: those may be joined without waiting
    /// on user code.
    pub(super) fn wait(&self, started: usize, except: Option<usize>, bound: Duration) -> Vec<bool> {
        let deadline = Instant::now() + bound;
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let states: Vec<u8> = self.states[..started]
                .iter()
                .map(|s| s.load(Ordering::Acquire))
                .collect();
            let waiting = |i: usize, s: u8| Some(i) != except && s != RETURNED;
            let mut pending = states.iter().enumerate().filter(|&(i, &s)| waiting(i, s));
            let now = Instant::now();
            let done = if now < deadline {
                pending.next().is_none()
            } else {
                pending.all(|(_, &s)| s == USER_CODE)
            };
            if done {
                return states.into_iter().map(|s| s == RETURNED).collect();
            }
            // A return wakes the wait; leaving user code does not, so past the deadline the
            // states are looked at again every few milliseconds.
            let slice = deadline
                .checked_duration_since(now)
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_millis(5));
            guard = self
                .returned
                .wait_timeout(guard, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// See [`Workers::on_return`].
pub(super) struct OnReturn<'a> {
    workers: &'a Workers,
    index: usize,
}

impl Drop for OnReturn<'_> {
    fn drop(&mut self) {
        let _guard = self.workers.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.workers.states[self.index].store(RETURNED, Ordering::Release);
        self.workers.returned.notify_all();
    }
}

/// See [`Workers::user_code`].
pub(super) struct UserCode<'a> {
    workers: &'a Workers,
    index: usize,
}

impl Drop for UserCode<'_> {
    fn drop(&mut self) {
        self.workers.states[self.index].store(RUNNING, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_for_returns_but_not_past_the_bound_for_user_code() {
        let workers = Arc::new(Workers::new(3));
        let _user = workers.user_code(1); // never leaves user code
        drop(workers.on_return(0));
        let w = Arc::clone(&workers);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(w.on_return(2));
        });
        let started = Instant::now();
        let returned = workers.wait(3, None, Duration::from_millis(100));
        // Thread 2 is in pinfeed's code: waited for past the bound; thread 1 is not.
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(returned, [true, false, true]);
        late.join().unwrap();
    }

    #[test]
    fn the_calling_thread_is_not_waited_for() {
        let workers = Workers::new(2);
        drop(workers.on_return(1));
        let started = Instant::now();
        assert_eq!(
            workers.wait(2, Some(0), Duration::from_secs(30)),
            [false, true]
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
