use pinfeed_cuda::{DevicePool, Event, Stream};

use crate::common::ctx;

#[test]
#[ignore = "needs a CUDA device"]
fn alloc_and_free_many_times_stays_cached() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    let sizes = [1usize, 4096, 11_800_000, 3 << 20, 64 << 20];
    for round in 0..200 {
        let bufs: Vec<_> = sizes
            .iter()
            .map(|&n| pool.alloc_async(n, &stream).unwrap())
            .collect();
        for (b, &n) in bufs.iter().zip(&sizes) {
            assert_eq!(b.len(), n);
            assert_ne!(b.ptr(), 0);
        }
        drop(bufs);
        if round == 0 {
            stream.synchronize().unwrap();
        }
    }
    stream.synchronize().unwrap();
    let reserved = pool.reserved_bytes().unwrap();
    assert_eq!(pool.used_bytes().unwrap(), 0);
    // Release threshold u64::MAX: freed blocks stay in the pool, and reuse keeps it bounded.
    let sum: usize = sizes.iter().sum();
    assert!(
        reserved > 0 && reserved < 4 * sum as u64,
        "reserved {reserved}"
    );
    pool.trim_to(0).unwrap();

    let empty = pool.alloc_async(0, &stream).unwrap();
    assert_eq!(empty.ptr(), 0);
    assert!(empty.is_empty());
}

#[test]
#[ignore = "needs a CUDA device"]
fn free_on_another_stream() {
    let ctx = ctx();
    let a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    for _ in 0..100 {
        let buf = pool.alloc_async(1 << 20, &a).unwrap();
        let ev = Event::new(&ctx).unwrap();
        ev.record(&a).unwrap();
        b.wait_event(&ev).unwrap();
        buf.free_on(&b).unwrap();
    }
    b.synchronize().unwrap();
    // A buffer may outlive the `Stream` value it was allocated on.
    let buf = {
        let c = Stream::new(&ctx).unwrap();
        pool.alloc_async(4096, &c).unwrap()
    };
    drop(buf);
}
