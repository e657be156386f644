//! Times each step of the CUDA copy path on its own, to find where a slow stream loses time:
//! `cargo run --release --example copy_path [MiB ...]` on a GPU machine (default: batches of 1
//! and 4 MiB). Prints a table; asserts nothing about speed (speed belongs in benchmarks), but
//! checks the bytes that arrive.
//!
//! The first steps add one piece of the copy thread's per-batch work at a time on one thread.
//! The two-thread steps are the loader's shape: a copy thread allocates, copies and records an
//! event per batch, never reusing a pinned slot before its copy's event, and hands batches over
//! a bounded channel to a consumer, which lets go of each in one of the ways a consumer does.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use pinfeed_cuda::{
    Context, DeviceBuffer, DevicePool, Event, ForeignStream, PinMethod, PinnedMemory, Stream,
};

/// Pinned slots the copy thread cycles through (the ring).
const SLOTS: usize = 16;
/// Bytes moved per step.
const BYTES_PER_STEP: usize = 4 << 30;

/// How the consumer of the two-thread steps lets go of a batch.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// Drops it: freed on the copy stream (what `pinfeed stream` does).
    Drop,
    /// Makes its stream wait for the copy, then orders the free after its own work: an event
    /// on its stream, the copy stream waits for it, the memory is freed on the copy stream
    /// (what the DLPack export does when torch lets go of a tensor).
    Ordered,
    /// Makes its stream wait for the copy, records an event on its stream, and frees the memory
    /// on the copy stream only once that event has completed, polled on the host (as torch's
    /// caching allocator does for `record_stream`): the copy stream never waits for it.
    Deferred,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes: Vec<usize> = match std::env::args().skip(1).collect::<Vec<_>>() {
        args if args.is_empty() => vec![1, 4],
        args => args.iter().map(|a| a.parse()).collect::<Result<_, _>>()?,
    };
    let ctx = Context::new(0)?;
    ctx.bind()?;
    let stream = Stream::new(&ctx)?;
    let pool = DevicePool::new(&ctx)?;
    for mib in sizes {
        let batch = mib << 20;
        let batches = (BYTES_PER_STEP / batch).max(64);
        let gb = (batch * batches) as f64 / 1e9;
        let pinned = PinnedMemory::alloc(&ctx, batch * SLOTS, PinMethod::HostAlloc)?;
        // SAFETY: the allocation holds SLOTS batches; nothing else uses it.
        unsafe { std::ptr::write_bytes(pinned.as_ptr(), 7, batch * SLOTS) };
        let dst = pool.alloc_async(batch * SLOTS, &stream)?;
        stream.synchronize()?;
        let slot = |i: usize| pinned.as_ptr().wrapping_add((i % SLOTS) * batch) as *const u8;
        let rate = |label: &str, secs: f64| {
            println!(
                "{mib:>3} MiB  {label:<66} {:7.2} GB/s {:7.1} us/batch",
                gb / secs,
                secs / batches as f64 * 1e6
            )
        };

        // Copies alone (the pinned copy rate), then with an event recorded after every copy and
        // after every eighth (without the allocations): a later event on the stream covers the
        // copies before it.
        for every in [None, Some(1), Some(8)] {
            let events: Vec<Event> = (0..every.map_or(0, |_| SLOTS))
                .map(|_| Event::new(&ctx))
                .collect::<Result<_, _>>()?;
            let t = Instant::now();
            for i in 0..batches {
                // SAFETY: both ranges lie inside their allocations, which outlive the
                // synchronise.
                unsafe {
                    pinfeed_cuda::memcpy_htod_async(
                        dst.ptr() + ((i % SLOTS) * batch) as u64,
                        slot(i),
                        batch,
                        &stream,
                    )?
                };
                if let Some(every) = every.filter(|every| i % every == 0) {
                    events[(i / every) % SLOTS].record(&stream)?;
                }
            }
            stream.synchronize()?;
            let label = match every {
                None => "copies only (the pinned copy rate)".to_string(),
                Some(every) => format!("+ an event every {every} copies (no allocations)"),
            };
            rate(&label, t.elapsed().as_secs_f64());
        }

        let t = Instant::now();
        let mut held = VecDeque::new();
        for i in 0..batches {
            let buf = pool.alloc_async(batch, &stream)?;
            // SAFETY: as above; the buffer is freed in stream order after its copy.
            unsafe { pinfeed_cuda::memcpy_htod_async(buf.ptr(), slot(i), batch, &stream)? };
            let e = Event::new(&ctx)?;
            e.record(&stream)?;
            held.push_back(e);
            if held.len() > SLOTS {
                drop(held.pop_front());
            }
        }
        stream.synchronize()?;
        rate(
            "+ device alloc/free and an event per copy",
            t.elapsed().as_secs_f64(),
        );

        for release in [Release::Drop, Release::Ordered, Release::Deferred] {
            let secs = two_threads(&ctx, &pool, &stream, batch, batches, &slot, release)?;
            rate(
                &format!("two threads, the consumer lets go: {release:?}"),
                secs,
            );
        }

        let mut back = vec![0u8; batch];
        // SAFETY: `back` holds `batch` bytes and lives through the synchronisation.
        unsafe { pinfeed_cuda::memcpy_dtoh_async(back.as_mut_ptr(), dst.ptr(), batch, &stream)? };
        stream.synchronize()?;
        assert!(back.iter().all(|&b| b == 7), "copied bytes differ");
    }
    Ok(())
}

/// The loader's shape on two threads; returns the seconds until every copy and every use of
/// the consumer's stream has completed.
fn two_threads(
    ctx: &Arc<Context>,
    pool: &Arc<DevicePool>,
    copy_stream: &Stream,
    batch: usize,
    batches: usize,
    slot: &(dyn Fn(usize) -> *const u8 + Sync),
    release: Release,
) -> Result<f64, Box<dyn std::error::Error>> {
    // torch's current stream unless told otherwise: the legacy default stream.
    // SAFETY: the legacy default stream handle is always valid.
    let consumer = unsafe { ForeignStream::from_raw(1) };
    let (tx, rx) = mpsc::sync_channel::<(DeviceBuffer, Arc<Event>)>(4);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        let producer = s.spawn(move || -> Result<(), String> {
            let mut in_flight: VecDeque<Arc<Event>> = VecDeque::new();
            for i in 0..batches {
                if in_flight.len() == SLOTS {
                    // The slot's previous copy must be done before it is refilled.
                    let e = in_flight.pop_front().expect("SLOTS in flight");
                    while !e.query().map_err(|e| e.to_string())? {
                        std::thread::yield_now();
                    }
                }
                let buf = pool
                    .alloc_async(batch, copy_stream)
                    .map_err(|e| e.to_string())?;
                // SAFETY: the slot is not written (the source is constant); the buffer holds
                // `batch` bytes and is not read before the event.
                unsafe { pinfeed_cuda::memcpy_htod_async(buf.ptr(), slot(i), batch, copy_stream) }
                    .map_err(|e| e.to_string())?;
                let e = Arc::new(Event::new(ctx).map_err(|e| e.to_string())?);
                e.record(copy_stream).map_err(|e| e.to_string())?;
                in_flight.push_back(Arc::clone(&e));
                if tx.send((buf, e)).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let mut deferred: VecDeque<(Event, DeviceBuffer)> = VecDeque::new();
        for (buf, copied) in rx {
            if matches!(release, Release::Drop) {
                continue;
            }
            consumer.wait_event(&copied, ctx)?;
            let used = Event::new(ctx)?;
            used.record_foreign(&consumer)?;
            match release {
                Release::Ordered => {
                    copy_stream.wait_event(&used)?;
                    drop(buf);
                }
                Release::Deferred => {
                    deferred.push_back((used, buf));
                    while let Some((e, _)) = deferred.front() {
                        if !e.query()? {
                            break;
                        }
                        deferred.pop_front();
                    }
                }
                Release::Drop => unreachable!(),
            }
        }
        for (e, buf) in deferred {
            e.synchronize()?;
            drop(buf);
        }
        producer.join().expect("producer panicked")?;
        Ok(())
    })?;
    copy_stream.synchronize()?;
    let end = Event::new(ctx)?;
    end.record_foreign(&consumer)?;
    end.synchronize()?;
    Ok(t.elapsed().as_secs_f64())
}
