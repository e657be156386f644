use pinfeed_cuda::{memcpy_htod_async, DevicePool, Event, PinMethod, PinnedMemory, Stream};

use crate::common::ctx;

#[test]
#[ignore = "needs a CUDA device"]
fn events_complete_and_time() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    let fresh = Event::new(&ctx).unwrap();
    assert!(
        fresh.query().unwrap(),
        "an event never recorded counts as complete"
    );

    let len = 256 << 20;
    let host = PinnedMemory::alloc(&ctx, len, PinMethod::Register).unwrap();
    let dev = pool.alloc_async(len, &stream).unwrap();
    let start = Event::new_timing(&ctx).unwrap();
    let end = Event::new_timing(&ctx).unwrap();
    start.record(&stream).unwrap();
    for _ in 0..4 {
        // SAFETY: both ranges are `len` bytes and outlive the copy (end.synchronize below).
        unsafe { memcpy_htod_async(dev.ptr(), host.as_ptr(), len, &stream).unwrap() };
    }
    end.record(&stream).unwrap();
    let done = Event::new(&ctx).unwrap();
    done.record(&stream).unwrap();
    end.synchronize().unwrap();
    done.synchronize().unwrap();
    assert!(end.query().unwrap());
    assert!(done.query().unwrap());
    let ms = Event::elapsed_ms(&start, &end).unwrap();
    assert!(ms > 0.0, "{ms} ms");
    eprintln!(
        "1 GiB host to device in {ms:.2} ms: {:.1} GB/s",
        (4 * len) as f64 / ms as f64 / 1e6
    );
    // Timing on events made without timing is a driver error, not a panic.
    assert!(Event::elapsed_ms(&done, &done).is_err());
}

#[test]
#[ignore = "needs a CUDA device"]
fn events_usable_from_other_threads() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let ev = std::sync::Arc::new(Event::new(&ctx).unwrap());
    ev.record(&stream).unwrap();
    let ev2 = std::sync::Arc::clone(&ev);
    std::thread::spawn(move || ev2.synchronize().unwrap())
        .join()
        .unwrap();
    assert!(ev.query().unwrap());
}

/// A pooled event comes back on drop and is handed out again; a stream told to wait on its
/// earlier record keeps waiting for that record, not a later one.
#[test]
#[ignore = "needs a CUDA device"]
fn pooled_events_are_reused_and_waits_keep_their_record() {
    use pinfeed_cuda::{memcpy_dtoh_async, EventPool};
    let ctx = ctx();
    let events = EventPool::new(&ctx);
    let copies = Stream::new(&ctx).unwrap();
    let waiter = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    let len = 256 << 20;
    let host = PinnedMemory::alloc(&ctx, len, PinMethod::HostAlloc).unwrap();
    // SAFETY: the allocation holds `len` bytes, written before any copy reads it.
    unsafe { std::ptr::write_bytes(host.as_ptr(), 9, len) };
    let dev = pool.alloc_async(len, &copies).unwrap();
    copies.synchronize().unwrap();

    let first = events.get().unwrap();
    let raw = first.raw();
    // SAFETY: both ranges are `len` bytes and outlive the copy (synchronised below).
    unsafe { memcpy_htod_async(dev.ptr(), host.as_ptr(), len, &copies).unwrap() };
    first.record(&copies).unwrap();
    waiter.wait_event(&first).unwrap();
    drop(first);
    assert_eq!(events.idle(), 1, "the dropped event went back to the pool");
    let again = events.get().unwrap();
    assert_eq!(again.raw(), raw, "the pool hands the same event out again");
    assert_eq!(events.idle(), 0);
    // Recorded anew on an idle stream: complete at once, yet `waiter` still waits for the copy.
    let idle = Stream::new(&ctx).unwrap();
    again.record(&idle).unwrap();
    let mut back = vec![0u8; len];
    // SAFETY: `back` holds `len` bytes and lives through the synchronisation; `dev` is read
    // after the copy into it, which `waiter` waits for.
    unsafe { memcpy_dtoh_async(back.as_mut_ptr(), dev.ptr(), len, &waiter).unwrap() };
    waiter.synchronize().unwrap();
    assert!(
        back.iter().all(|&b| b == 9),
        "read before the copy it waited for"
    );
}
