//! Integration tests of pinfeed-cuda, one module per area.
//!
//! Everything that needs a GPU is `#[ignore = "needs a CUDA device"]`; run it on a GPU machine
//! with `cargo test -p pinfeed-cuda -- --ignored`.

mod common;
mod device;
mod events;
mod kernel_cpu;
mod nodriver;
mod nvjpeg;
mod pinned;
mod pool;
mod register;
mod streams;
