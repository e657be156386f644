//! The same checks through a real GPU. Run on a CUDA machine with `--ignored`.

use std::sync::Arc;

use pinfeed::{pinned_allocations, DeviceSpec, Loader, LoaderOptions, PinMethod};

use crate::common::random_source;

fn cuda_options(batch_size: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size,
        device: DeviceSpec::Cuda(0),
        ..LoaderOptions::default()
    }
}

/// The CRC-32 of every byte the loader delivers, read back from the GPU in delivery order.
fn delivered_crc(loader: &mut Loader) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    for batch in loader.by_ref() {
        let batch = batch.unwrap();
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        crc.update(&back);
    }
    crc.finalize()
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_byte_exact_for_several_batch_sizes_and_pin_methods() {
    let (source, data) = random_source(20_000, 2883, 21);
    for method in [PinMethod::Register, PinMethod::HostAlloc] {
        for batch_size in [1, 1000, 1024, 7777, 20_000] {
            let options = LoaderOptions {
                pin_method: method,
                epochs: 2,
                ..cuda_options(batch_size)
            };
            let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
            let want = crc32fast::hash(&data.repeat(2));
            assert_eq!(
                delivered_crc(&mut loader),
                want,
                "{method:?}, batch size {batch_size}"
            );
            let stats = loader.stats();
            assert_eq!(stats.pinned_allocations_after_start, 0);
            // Placed on the GPU's node, or nothing to place; never a failed mbind.
            let numa = &stats.pinned_numa;
            match method {
                PinMethod::Register => assert!(!numa.contains("mbind"), "{numa}"),
                _ => assert!(
                    numa == "no NUMA (one node)" || numa.starts_with("not placed"),
                    "{numa}"
                ),
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_held_batches_stay_intact_while_the_ring_cycles() {
    let (source, data) = random_source(4096, 4096, 22);
    let options = LoaderOptions {
        pinned_budget: 4 * 16 * 4096,
        ..cuda_options(16)
    };
    let before = pinned_allocations();
    let loader = Loader::new(source, options).unwrap();
    let held: Vec<_> = loader.map(|b| b.unwrap()).collect();
    assert_eq!(
        pinned_allocations() - before,
        1,
        "one pool allocation, nothing else"
    );
    for batch in &held {
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        let start = batch.first_record() as usize * 4096;
        assert_eq!(back, data[start..start + back.len()]);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_register_reader_is_byte_exact() {
    use pinfeed::Reader;

    let dir = tempfile::tempdir().unwrap();
    let (source, data) = crate::register::npy_file(&dir, 50_000, vec![3, 31, 31], 23);
    for (batch_size, budget) in [(1024, 256 << 20), (777, 8 << 20), (50_000, 1 << 30)] {
        let options = LoaderOptions {
            reader: Reader::Register,
            pinned_budget: budget,
            epochs: 2,
            ..cuda_options(batch_size)
        };
        let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
        assert_eq!(loader.stats().reader, Reader::Register);
        assert_eq!(
            delivered_crc(&mut loader),
            crc32fast::hash(&data.repeat(2)),
            "batch {batch_size}"
        );
        assert!(loader.stats().pinned_bytes_peak <= budget);
    }
}

/// Several rings on one GPU in one process (what a process driving several GPUs does, on the one
/// GPU a machine may have): shards in step, every record delivered once.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_several_rings_in_one_process() {
    use pinfeed::{MultiLoader, Shuffle};
    let (source, data) = random_source(9000, 2883, 24);
    let options = LoaderOptions {
        shuffle: Shuffle::Random,
        seed: 4,
        ..cuda_options(500)
    };
    let multi =
        MultiLoader::new(source, options, &[DeviceSpec::Cuda(0), DeviceSpec::Cuda(0)]).unwrap();
    let mut seen = vec![0u32; 9000];
    for step in multi {
        for batch in step.unwrap() {
            let mut back = vec![0u8; batch.len_bytes()];
            batch.read_back(&mut back).unwrap();
            for (k, &r) in batch.records().to_vec().iter().enumerate() {
                assert_eq!(
                    back[k * 2883..(k + 1) * 2883],
                    data[r as usize * 2883..(r as usize + 1) * 2883]
                );
                seen[r as usize] += 1;
            }
        }
    }
    assert!(seen.iter().all(|&c| c == 1));
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_uploads_are_byte_exact_by_every_method_and_from_pinned_sources() {
    use pinfeed::{DeviceData, PinnedRegion, Stager, StagerOptions, UploadMethod};
    let mut backing: Vec<u8> = (0..(200usize << 20) + 3 * 4096)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
        .collect();
    for method in [
        UploadMethod::Both,
        UploadMethod::Stage,
        UploadMethod::Register,
    ] {
        let stager = Stager::new(StagerOptions {
            device: DeviceSpec::Cuda(0),
            pinned_budget: 64 << 20,
            method,
            ..StagerOptions::default()
        })
        .unwrap();
        for (start, len) in [
            (0, 200 << 20),
            (1, (150 << 20) - 5),
            (4095, 9 << 20),
            (77, 4099),
        ] {
            let src = &backing[start..start + len];
            let array = stager.upload(src).unwrap();
            let mut back = vec![0u8; len];
            array.read_back(&mut back).unwrap();
            assert!(back == src, "{method} from offset {start}, {len} bytes");
        }
        let c = stager.counters();
        assert_eq!(c.register_error, None, "{method}");
        assert_eq!(
            c.registered_bytes > 0,
            method != UploadMethod::Stage,
            "{method}: {c:?}"
        );
    }
    // A source that is page-locked already is copied straight from, with no lane.
    let stager = Stager::new(StagerOptions {
        device: DeviceSpec::Cuda(0),
        ..StagerOptions::default()
    })
    .unwrap();
    let len = 100 << 20;
    // SAFETY: `backing` outlives the region, and every copy from it is waited for by `upload`.
    let region =
        unsafe { PinnedRegion::new(DeviceSpec::Cuda(0), backing.as_mut_ptr(), len) }.unwrap();
    let array = stager.upload(&backing[..len]).unwrap();
    drop(region);
    let mut back = vec![0u8; len];
    array.read_back(&mut back).unwrap();
    assert!(back == backing[..len]);
    let c = stager.counters();
    assert_eq!(
        (c.direct_bytes, c.staged_bytes, c.registered_bytes),
        (len as u64, 0, 0)
    );
}

/// Memory a consumer let go with `release_after` goes to a later batch only after the work its
/// stream had queued by then: the consumer's stream is kept busy ahead of each read, so a
/// reuse that did not wait would overwrite a batch before the stream copied it out.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_released_memory_is_reused_only_after_the_consumers_stream() {
    use pinfeed_cuda::{memcpy_dtod_async, memcpy_dtoh_async, Context, DevicePool, Stream};
    let (record, n, epochs) = (4096, 4096, 4);
    let (source, data) = random_source(n, record, 25);
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx).unwrap();
    let busy_len = 64 << 20;
    let busy = [
        pool.alloc_async(busy_len, &stream).unwrap(),
        pool.alloc_async(busy_len, &stream).unwrap(),
    ];
    let captured = pool.alloc_async(n * record * epochs, &stream).unwrap();
    let options = LoaderOptions {
        epochs: epochs as u64,
        ..cuda_options(64)
    };
    let mut offset = 0;
    for batch in Loader::new(source, options).unwrap() {
        let batch = batch.unwrap();
        // SAFETY: every range lies inside its allocation, all of which outlive the final
        // synchronisation; the batch is read on `stream` after `stream_wait` and released after.
        unsafe {
            batch.stream_wait(stream.raw_u64()).unwrap();
            for _ in 0..4 {
                memcpy_dtod_async(busy[1].ptr(), busy[0].ptr(), busy_len, &stream).unwrap();
            }
            let at = captured.ptr() + offset as u64;
            memcpy_dtod_async(at, batch.address(), batch.len_bytes(), &stream).unwrap();
            offset += batch.len_bytes();
            batch.release_after(stream.raw_u64()).unwrap();
        }
    }
    assert_eq!(offset, n * record * epochs);
    let mut back = vec![0u8; offset];
    // SAFETY: `back` holds `offset` bytes and lives through the synchronisation.
    unsafe { memcpy_dtoh_async(back.as_mut_ptr(), captured.ptr(), offset, &stream).unwrap() };
    stream.synchronize().unwrap();
    assert!(
        back == data.repeat(epochs),
        "a batch was overwritten before its consumer read it"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn default_threads_come_from_the_measured_machine() {
    let (source, data) = random_source(4_000, 2883, 22);
    let mut loader = Loader::new(Arc::clone(&source), cuda_options(1000)).unwrap();
    assert_eq!(delivered_crc(&mut loader), crc32fast::hash(&data));
    let stats = loader.stats();
    let rates = stats
        .machine
        .expect("the machine's rates, measured or cached");
    assert!(
        rates.copy_gbps > 0.5 && rates.copy_gbps < 500.0,
        "{rates:?}"
    );
    assert!(rates.bus_gbps > 1.0 && rates.bus_gbps < 1000.0, "{rates:?}");
    let rule = pinfeed::tune::threads_for(Some(rates), pinfeed::tune::cores());
    assert_eq!(stats.threads, rule.threads, "{}", stats.threads_reason);
    assert_eq!(stats.threads_reason, rule.reason);
    // A count given is kept, and no rates are claimed for it.
    let asked = LoaderOptions {
        num_threads: Some(3),
        ..cuda_options(1000)
    };
    let mut loader = Loader::new(source, asked).unwrap();
    assert_eq!(delivered_crc(&mut loader), crc32fast::hash(&data));
    let stats = loader.stats();
    assert_eq!((stats.threads, stats.machine), (3, None));
}
