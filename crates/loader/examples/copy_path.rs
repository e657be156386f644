//! Times each step of the CUDA copy path on its own, to find where a slow stream loses time:
//! `cargo run --release --example copy_path` on a GPU machine. Prints a table; asserts nothing
//! about speed (speed belongs in benchmarks), but checks the bytes that arrive.

use std::time::Instant;

use pinfeed_cuda::{Context, DevicePool, Event, PinMethod, PinnedMemory, Stream};

const BATCH: usize = 1024 * 2883;
const BATCHES: usize = 1000;

/// How a consumer waits for a batch's event.
#[derive(Clone, Copy)]
enum Wait {
    Block,
    Poll,
}

/// Which parts of the per-batch path a timing step includes.
#[derive(Clone, Copy, Default)]
struct Step {
    event: bool,
    alloc: bool,
    consumer: Option<Wait>,
}

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

        // Each step adds one piece of pinfeed's per-batch path to the bare copies.
        let steps: [(&str, Step); 5] = [
            ("copies only", Step::default()),
            (
                "+ event per copy",
                Step {
                    event: true,
                    ..Step::default()
                },
            ),
            (
                "+ device alloc/free per copy",
                Step {
                    event: true,
                    alloc: true,
                    ..Step::default()
                },
            ),
            (
                "+ consumer waits on each event (4 behind)",
                Step {
                    event: true,
                    alloc: true,
                    consumer: Some(Wait::Block),
                },
            ),
            (
                "+ consumer polls each event (4 behind)",
                Step {
                    event: true,
                    alloc: true,
                    consumer: Some(Wait::Poll),
                },
            ),
        ];
        for (label, step) in steps {
            let t = Instant::now();
            let mut pending = std::collections::VecDeque::new();
            for i in 0..BATCHES {
                let src = pinned.as_ptr().wrapping_add((i % 16) * BATCH);
                let buf = if step.alloc {
                    Some(pool.alloc_async(BATCH, &stream)?)
                } else {
                    None
                };
                let dst = buf
                    .as_ref()
                    .map_or(dst.ptr() + ((i % 16) * BATCH) as u64, |b| b.ptr());
                // SAFETY: both ranges are inside their allocations, which outlive the final
                // synchronisation (a per-copy buffer is freed in stream order after its copy).
                unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, BATCH, &stream)? };
                let event = if step.event {
                    let e = Event::new(&ctx)?;
                    e.record(&stream)?;
                    Some(e)
                } else {
                    None
                };
                if let (Some(wait), Some(e)) = (step.consumer, event) {
                    pending.push_back((e, buf));
                    if pending.len() > 4 {
                        let (e, buf) = pending.pop_front().expect("more than four pending");
                        match wait {
                            Wait::Block => e.synchronize()?,
                            Wait::Poll => {
                                while !e.query()? {
                                    std::hint::spin_loop();
                                }
                            }
                        }
                        drop(buf);
                    }
                }
            }
            stream.synchronize()?;
            drop(pending);
            rate(label, t.elapsed().as_secs_f64());
        }

        // 6. The bytes arrived.
        let mut back = vec![0u8; BATCH];
        // SAFETY: `back` holds BATCH bytes and lives through the synchronisation.
        unsafe { pinfeed_cuda::memcpy_dtoh_async(back.as_mut_ptr(), dst.ptr(), BATCH, &stream)? };
        stream.synchronize()?;
        assert!(back.iter().all(|&b| b == 7), "copied bytes differ");
    }
    Ok(())
}
