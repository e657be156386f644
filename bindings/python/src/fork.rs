//! Values that must not be dropped in a forked child.
//!
//! A forked child inherits the parent's memory but none of its threads, and the CUDA driver's
//! state does not survive a fork. Dropping a loader there would join threads that do not exist
//! (undefined behaviour or a hang) and call the driver (a hang); dropping a batch would wait on
//! a fence no thread will ever set. So in a child these values are leaked instead: the child's
//! copy of the memory goes away with the child.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

/// The calling process's id.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// `T`, dropped only by the process that made it.
pub(crate) struct ForkSafe<T> {
    /// The process that made `inner`.
    pid: u32,
    inner: ManuallyDrop<T>,
}

impl<T> ForkSafe<T> {
    pub(crate) fn new(inner: T) -> ForkSafe<T> {
        ForkSafe {
            pid: pid(),
            inner: ManuallyDrop::new(inner),
        }
    }

    /// The process that made the value.
    pub(crate) fn owner_pid(&self) -> u32 {
        self.pid
    }

    /// Whether this is the process that made the value.
    pub(crate) fn is_owner(&self) -> bool {
        self.pid == pid()
    }

    /// The value, if this is the process that made it; otherwise it is leaked and `None`.
    pub(crate) fn into_inner(self) -> Option<T> {
        let mut this = ManuallyDrop::new(self);
        if this.is_owner() {
            // SAFETY: `this` is never used again (nor dropped: it is in a ManuallyDrop), so the
            // value is taken exactly once.
            Some(unsafe { ManuallyDrop::take(&mut this.inner) })
        } else {
            None
        }
    }
}

impl<T> Deref for ForkSafe<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for ForkSafe<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if self.is_owner() {
            // SAFETY: dropped once, here; `inner` is not used after.
            unsafe { ManuallyDrop::drop(&mut self.inner) };
        }
        // In a forked child the value is leaked on purpose (see the module docs).
    }
}
