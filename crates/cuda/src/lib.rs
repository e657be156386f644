//! The one pinfeed crate that talks to the CUDA driver.
//!
//! It wraps the few driver calls the loader needs, each failure a typed [`CudaError`] naming the
//! call:
//!
//! - [`probe`] and [`driver_version`]: is there a driver, how many devices. On a machine with no
//!   `libcuda.so.1` these return [`CudaError::NoDriver`] instead of panicking (cudarc panics when
//!   the library is missing, so every entry point checks first).
//! - [`Context`]: the retained primary context of one device, shared through `Arc`.
//! - [`Stream`] (ours, non-blocking) and [`ForeignStream`] (borrowed, such as torch's);
//!   [`Event`]s to order them and to learn when a copy is done.
//! - [`PinnedMemory`]: one page-locked allocation, made once ([`PinMethod`] picks
//!   `cuMemHostAlloc` or `mmap` + `cuMemHostRegister`, the latter bound to the GPU's NUMA node:
//!   [`numa`]); [`Registration`] pins existing memory in place.
//! - [`DevicePool`] and [`DeviceBuffer`]: stream-ordered device memory that stays cached.
//! - [`memcpy_htod_async`], [`memcpy_dtoh_async`], [`memcpy_dtod_async`].
//! - [`nvjpeg`]: batched JPEG decoding on the GPU (nvJPEG, loaded at run time) with a crop +
//!   resize + flip kernel into a fixed-size batch.
//!
//! Objects record the process that created them; used in a forked child they answer
//! [`CudaError::Forked`] without calling the driver, and their drops leave the driver alone.
//!
//! ```no_run
//! use pinfeed_cuda::{memcpy_htod_async, Context, DevicePool, Event, PinMethod, PinnedMemory, Stream};
//!
//! # fn main() -> pinfeed_cuda::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! let pool = DevicePool::new(&ctx)?;
//! let slot = PinnedMemory::alloc(&ctx, 1 << 20, PinMethod::Register)?;
//! // SAFETY: `slot` is ours and fully initialised (mmap zero-fills it).
//! unsafe { std::ptr::write_bytes(slot.as_ptr(), 7, slot.len()) };
//! let dst = pool.alloc_async(slot.len(), &stream)?;
//! // SAFETY: both ranges are `slot.len()` bytes and outlive the copy, which `done` tracks.
//! unsafe { memcpy_htod_async(dst.ptr(), slot.as_ptr(), slot.len(), &stream)? };
//! let done = Event::new(&ctx)?;
//! done.record(&stream)?;
//! done.synchronize()?; // the slot may be refilled now
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

mod context;
mod driver;
mod dynlib;
mod error;
mod memory;
pub mod numa;
pub mod nvjpeg;
mod pool;
mod stream;

pub use context::Context;
pub use driver::{driver_present, driver_version, probe};
pub use error::{CudaError, Result};
pub use memory::{
    is_page_locked, memcpy_dtod_async, memcpy_dtoh_async, memcpy_htod_async, PinMethod,
    PinnedMemory, Registration,
};
pub use numa::NumaPlacement;
pub use pool::{DeviceBuffer, DevicePool};
pub use stream::{Event, EventPool, ForeignStream, Stream};

/// Driver types that appear in this crate's API.
pub use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUstream,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Context>();
        assert_send_sync::<Stream>();
        assert_send_sync::<ForeignStream>();
        assert_send_sync::<Event>();
        assert_send_sync::<PinnedMemory>();
        assert_send_sync::<Registration>();
        assert_send_sync::<DevicePool>();
        assert_send_sync::<DeviceBuffer>();
        assert_send_sync::<CudaError>();
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if driver_present() {
            // A machine with a driver: the calls must still not panic.
            let _ = probe();
            let _ = driver_version();
            return;
        }
        assert!(
            matches!(probe(), Err(CudaError::NoDriver { .. })),
            "{:?}",
            probe()
        );
        assert!(matches!(Context::new(0), Err(CudaError::NoDriver { .. })));
        assert!(matches!(driver_version(), Err(CudaError::NoDriver { .. })));
        let msg = probe().unwrap_err().to_string();
        assert!(msg.contains("libcuda.so.1"), "{msg}");
    }

    #[test]
    fn fork_check_compares_pids() {
        let me = driver::current_pid();
        assert!(driver::check_pid(me).is_ok());
        assert!(matches!(
            driver::check_pid(me + 1),
            Err(CudaError::Forked { .. })
        ));
    }
}
