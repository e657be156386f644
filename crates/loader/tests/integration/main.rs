//! Integration tests of the loader, on the host backend (CI) and, where marked, on a GPU.

mod common;
mod delivery;
mod documents;
mod faults;
mod gpu;
mod gpu_formula;
mod gpu_images;
mod lifecycle;
mod limits;
mod mapped;
mod pieces;
mod register;
mod replicate;
mod shuffle;
