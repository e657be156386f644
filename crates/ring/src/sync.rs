//! The synchronisation primitives the ring uses: std's, or loom's when built with `--cfg loom`
//! so that loom can explore every interleaving (crossbeam's `primitive` module does the same).

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
