use std::sync::Arc;

use pinfeed_cuda::{
    memcpy_dtoh_async, memcpy_htod_async, Context, DevicePool, Event, PinMethod, PinnedMemory,
    Stream,
};

/// The context of device 0; panics with the error when there is none.
pub fn ctx() -> Arc<Context> {
    Context::new(0).unwrap_or_else(|e| panic!("Context::new(0): {e}"))
}

/// Bytes that differ from their neighbours and from zero, so a shifted or partial copy shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ seed)
        .collect()
}

/// Copies `len` bytes at `src` to the device and back into fresh pinned memory, and returns them.
///
/// # Safety
/// `src` must be valid for reading `len` bytes for the duration of the call.
pub unsafe fn roundtrip(ctx: &Arc<Context>, src: *const u8, len: usize) -> Vec<u8> {
    let stream = Stream::new(ctx).unwrap();
    let pool = DevicePool::new(ctx).unwrap();
    let dev = pool.alloc_async(len, &stream).unwrap();
    let back = PinnedMemory::alloc(ctx, len, PinMethod::HostAlloc).unwrap();
    // SAFETY: `src` is valid by this function's contract, `dev` and `back` are `len` bytes, and
    // the stream is synchronised below before any of them is released.
    unsafe {
        memcpy_htod_async(dev.ptr(), src, len, &stream).unwrap();
        memcpy_dtoh_async(back.as_ptr(), dev.ptr(), len, &stream).unwrap();
    }
    let done = Event::new(ctx).unwrap();
    done.record(&stream).unwrap();
    done.synchronize().unwrap();
    assert!(done.query().unwrap());
    // SAFETY: the copy into `back` has completed (event above) and `back` holds `len` bytes.
    unsafe { std::slice::from_raw_parts(back.as_ptr(), len) }.to_vec()
}
