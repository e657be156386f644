use pinfeed_cuda::{
    memcpy_dtod_async, memcpy_htod_async, DevicePool, Event, PinMethod, PinnedMemory, Stream,
};

use crate::common::{ctx, pattern, roundtrip};

fn roundtrip_with(method: PinMethod) {
    let ctx = ctx();
    // An odd size, so nothing relies on page multiples.
    let len = (8 << 20) + 13;
    let mem = PinnedMemory::alloc(&ctx, len, method).unwrap();
    assert_eq!(mem.len(), len);
    assert_eq!(mem.method(), method);
    let src = pattern(len, 0x5a);
    // SAFETY: `mem` holds `len` bytes and no copy uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), mem.as_ptr(), len) };
    // SAFETY: `mem` is valid for `len` bytes during the call.
    let back = unsafe { roundtrip(&ctx, mem.as_ptr(), len) };
    assert!(
        back == src,
        "roundtrip through {method:?} memory changed the bytes"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn host_alloc_roundtrip() {
    roundtrip_with(PinMethod::HostAlloc);
}

#[test]
#[ignore = "needs a CUDA device"]
fn register_roundtrip() {
    roundtrip_with(PinMethod::Register);
}

#[test]
#[ignore = "needs a CUDA device"]
fn zero_bytes_is_refused() {
    let ctx = ctx();
    assert!(PinnedMemory::alloc(&ctx, 0, PinMethod::Register).is_err());
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_to_device_copy() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    let len = 1 << 20;
    let src = pattern(len, 3);
    let host = PinnedMemory::alloc(&ctx, len, PinMethod::Register).unwrap();
    // SAFETY: `host` holds `len` bytes; no copy uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), host.as_ptr(), len) };
    let a = pool.alloc_async(len, &stream).unwrap();
    let b = pool.alloc_async(len, &stream).unwrap();
    // SAFETY: all three ranges are `len` bytes and outlive the copies (stream synchronised below).
    unsafe {
        memcpy_htod_async(a.ptr(), host.as_ptr(), len, &stream).unwrap();
        memcpy_dtod_async(b.ptr(), a.ptr(), len, &stream).unwrap();
        pinfeed_cuda::memcpy_dtoh_async(host.as_ptr(), b.ptr(), len, &stream).unwrap();
    }
    let ev = Event::new(&ctx).unwrap();
    ev.record(&stream).unwrap();
    ev.synchronize().unwrap();
    // SAFETY: the copies into `host` completed (event above).
    let got = unsafe { std::slice::from_raw_parts(host.as_ptr(), len) };
    assert!(got == &src[..]);
}
