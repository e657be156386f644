//! Integration tests of the loader, on the host backend (CI) and, where marked, on a GPU.

mod common;
mod delivery;
mod direct;
mod faults;
mod gpu;
mod limits;
mod mapped;
mod pieces;
mod replicate;
mod shuffle;
