//! Times each step of the CUDA copy path on its own, to find where a slow stream loses time:
//! `cargo run --release --example copy_path` on a GPU machine. Prints a table; asserts nothing
//! about speed (speed belongs in benchmarks), but checks the bytes that arrive.

use std::sync::Arc;
use std::time::Instant;

use pinfeed_cuda::{Context, DevicePool, Event, PinMethod, PinnedMemory, Stream};

const BATCH: usize = 1024 * 2883;
const BATCHES: usize = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    ctx.bind()?;
    let stream = Stream::new(&ctx)?;
    let pool = DevicePool::new(&ctx)?;
    let gb = (BATCH * BATCHES) as f64 / 1e9;
    for method in [PinMethod::Register, PinMethod::HostAlloc] {
        let t = Instant::now();
        let pinned = PinnedMemory::alloc(&ctx, BATCH * 16, method)?;
        let alloc_ms = t.elapsed().as_secs_f64() * 1e3;
        // SAFETY: the allocation holds 16 batches; nothing else uses it.
        unsafe { std::ptr::write_bytes(pinned.as_ptr(), 7, BATCH * 16) };
        let dst = pool.alloc_async(BATCH * 16, &stream)?;
        stream.synchronize()?;
        let rate =
            |label: &str, secs: f64| println!("{method:?} {label:<58} {:7.2} GB/s", gb / secs);
        println!(
            "{method:?}: page-locking {} MB took {alloc_ms:.1} ms",
            BATCH * 16 / 1_000_000
        );

        // 1. Copies only, one synchronisation at the end.
        let t = Instant::now();
        for i in 0..BATCHES {
            let k = i % 16;
            // SAFETY: both ranges are inside their allocations, which outlive the synchronisation.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    dst.ptr() + (k * BATCH) as u64,
                    pinned.as_ptr().add(k * BATCH),
                    BATCH,
                    &stream,
                )?
            };
        }
        stream.synchronize()?;
        rate("copies only", t.elapsed().as_secs_f64());

        // 2. Plus an event created and recorded per copy.
        let t = Instant::now();
        let mut events = Vec::with_capacity(BATCHES);
        for i in 0..BATCHES {
            let k = i % 16;
            // SAFETY: as above.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    dst.ptr() + (k * BATCH) as u64,
                    pinned.as_ptr().add(k * BATCH),
                    BATCH,
                    &stream,
                )?
            };
            let e = Event::new(&ctx)?;
            e.record(&stream)?;
            events.push(e);
        }
        stream.synchronize()?;
        rate("+ event per copy", t.elapsed().as_secs_f64());
        drop(events);

        // 3. Plus a stream-ordered device allocation and free per copy.
        let t = Instant::now();
        for i in 0..BATCHES {
            let k = i % 16;
            let buf = pool.alloc_async(BATCH, &stream)?;
            // SAFETY: as above; `buf` is freed in stream order after the copy.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    buf.ptr(),
                    pinned.as_ptr().add(k * BATCH),
                    BATCH,
                    &stream,
                )?
            };
            let e = Event::new(&ctx)?;
            e.record(&stream)?;
            drop(buf);
        }
        stream.synchronize()?;
        rate("+ device alloc/free per copy", t.elapsed().as_secs_f64());

        // 4. Plus a consumer that waits on each event, 4 batches behind.
        let t = Instant::now();
        let mut pending = std::collections::VecDeque::new();
        for i in 0..BATCHES {
            let k = i % 16;
            let buf = pool.alloc_async(BATCH, &stream)?;
            // SAFETY: as above.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    buf.ptr(),
                    pinned.as_ptr().add(k * BATCH),
                    BATCH,
                    &stream,
                )?
            };
            let e = Event::new(&ctx)?;
            e.record(&stream)?;
            pending.push_back((e, buf));
            if pending.len() > 4 {
                let (e, buf) = pending.pop_front().unwrap();
                e.synchronize()?;
                drop(buf);
            }
        }
        for (e, _) in pending.drain(..) {
            e.synchronize()?;
        }
        rate(
            "+ consumer waits on each event (4 behind)",
            t.elapsed().as_secs_f64(),
        );

        // 5. Same with events polled (query) instead of blocking waits.
        let t = Instant::now();
        let mut pending = std::collections::VecDeque::new();
        for i in 0..BATCHES {
            let k = i % 16;
            let buf = pool.alloc_async(BATCH, &stream)?;
            // SAFETY: as above.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    buf.ptr(),
                    pinned.as_ptr().add(k * BATCH),
                    BATCH,
                    &stream,
                )?
            };
            let e = Event::new(&ctx)?;
            e.record(&stream)?;
            pending.push_back((e, buf));
            if pending.len() > 4 {
                let (e, buf) = pending.pop_front().unwrap();
                while !e.query()? {
                    std::hint::spin_loop();
                }
                drop(buf);
            }
        }
        stream.synchronize()?;
        rate(
            "+ consumer polls each event (4 behind)",
            t.elapsed().as_secs_f64(),
        );

        // 6. The bytes arrived.
        let mut back = vec![0u8; BATCH];
        // SAFETY: `back` holds BATCH bytes and lives through the synchronisation.
        unsafe { pinfeed_cuda::memcpy_dtoh_async(back.as_mut_ptr(), dst.ptr(), BATCH, &stream)? };
        stream.synchronize()?;
        assert!(back.iter().all(|&b| b == 7), "copied bytes differ");
        let _ = Arc::strong_count(&ctx);
    }
    Ok(())
}
