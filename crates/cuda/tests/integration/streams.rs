use pinfeed_cuda::{
    memcpy_dtoh_async, memcpy_htod_async, DevicePool, Event, ForeignStream, PinMethod,
    PinnedMemory, Stream,
};

use crate::common::{ctx, pattern};

#[test]
#[ignore = "needs a CUDA device"]
fn foreign_stream_waits_on_our_event() {
    let ctx = ctx();
    let ours = Stream::new(&ctx).unwrap();
    let theirs = Stream::new(&ctx).unwrap();
    // SAFETY: `theirs` outlives `foreign`.
    let foreign = unsafe { ForeignStream::from_raw(theirs.raw_u64()) };
    assert_eq!(foreign.raw(), theirs.raw());
    let pool = DevicePool::new(&ctx).unwrap();
    let len = 64 << 20;
    let src = pattern(len, 9);
    let host = PinnedMemory::alloc(&ctx, len, PinMethod::Register).unwrap();
    let back = PinnedMemory::alloc(&ctx, len, PinMethod::HostAlloc).unwrap();
    // SAFETY: `host` holds `len` bytes; no copy uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), host.as_ptr(), len) };
    let dev = pool.alloc_async(len, &ours).unwrap();
    // SAFETY: ranges are `len` bytes and outlive the copies (synchronised below).
    unsafe { memcpy_htod_async(dev.ptr(), host.as_ptr(), len, &ours).unwrap() };
    let copied = Event::new(&ctx).unwrap();
    copied.record(&ours).unwrap();
    foreign.wait_event(&copied, &ctx).unwrap();
    // The read-back on the other stream must see the finished copy.
    // SAFETY: as above.
    unsafe { memcpy_dtoh_async(back.as_ptr(), dev.ptr(), len, &theirs).unwrap() };
    let read = Event::new(&ctx).unwrap();
    read.record_foreign(&foreign).unwrap();
    read.synchronize().unwrap();
    // SAFETY: the copy into `back` completed.
    let got = unsafe { std::slice::from_raw_parts(back.as_ptr(), len) };
    assert!(got == &src[..]);
    // The buffer is used by `theirs`; order its free after that.
    ours.wait_event(&read).unwrap();
    drop(dev);

    // The legacy default stream (handle 0) can wait too.
    // SAFETY: 0 is the legacy default stream, always valid.
    let legacy = unsafe { ForeignStream::from_raw(0) };
    legacy.wait_event(&copied, &ctx).unwrap();
    ours.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn streams_cross_threads() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let s2 = stream.clone();
    std::thread::spawn(move || s2.synchronize().unwrap())
        .join()
        .unwrap();
    stream.synchronize().unwrap();
}
