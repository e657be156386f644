//! One reader, several devices (`MultiLoader::replicated`): every device gets every batch, the
//! same bytes and records in the same order as a loader of one device, read once.

use std::sync::Arc;
use std::time::Duration;

use pinfeed::{
    DeviceSpec, Loader, LoaderError, LoaderOptions, MultiLoader, Reader, Shuffle, Waited,
};
use pinfeed_source::Source;

use crate::common::{host_options, random_source, Fault, Faulty};

/// What one device received: its bytes, read back, and each batch's (epoch, index, records).
#[derive(Debug, Default, PartialEq)]
struct Received {
    bytes: Vec<u8>,
    batches: Vec<(u64, u64, Vec<u64>)>,
}

fn receive(batches: impl IntoIterator<Item = pinfeed::Batch>, into: &mut [Received]) {
    let mut n = 0;
    for (device, batch) in batches.into_iter().enumerate() {
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        into[device].bytes.extend_from_slice(&back);
        into[device]
            .batches
            .push((batch.epoch(), batch.index(), batch.records().to_vec()));
        n += 1;
    }
    assert_eq!(n, into.len(), "a step holds one batch per device");
}

/// What a loader of one device delivers.
fn single(source: &Arc<dyn Source>, options: LoaderOptions) -> Received {
    let mut got = [Received::default()];
    for batch in Loader::new(Arc::clone(source), options).unwrap() {
        receive([batch.unwrap()], &mut got);
    }
    let [got] = got;
    got
}

/// What each device of a replicated loader receives, and its final counters.
fn replicated(
    source: &Arc<dyn Source>,
    options: LoaderOptions,
    devices: usize,
) -> (Vec<Received>, pinfeed::Stats) {
    let mut multi =
        MultiLoader::replicated(Arc::clone(source), options, &vec![DeviceSpec::Cpu; devices])
            .unwrap();
    assert!(multi.is_replicated());
    assert_eq!(multi.devices(), vec![DeviceSpec::Cpu; devices]);
    let mut got: Vec<Received> = (0..devices).map(|_| Received::default()).collect();
    let mut steps = 0;
    for step in multi.by_ref() {
        receive(step.unwrap(), &mut got);
        steps += 1;
    }
    assert_eq!(steps, multi.num_batches());
    (got, multi.stats())
}

#[test]
fn every_device_gets_what_one_device_would_in_every_order() {
    let (source, data) = random_source(1000, 37, 31);
    let epochs = 2;
    for shuffle in [
        Shuffle::None,
        Shuffle::Random,
        Shuffle::Block {
            block: 16,
            window: 4,
        },
    ] {
        // Dividing the 1000 records and not; one batch of all of them.
        for batch_size in [1, 7, 100, 333, 1000] {
            // Whole batches, and pieces of two records and a bit (a batch of 333 is 167
            // pieces, copied to every device).
            for piece_bytes in [None, Some(2 * 37 + 5)] {
                let options = LoaderOptions {
                    shuffle,
                    seed: 9,
                    epochs,
                    piece_bytes,
                    pinned_budget: 1 << 20,
                    num_threads: Some(3),
                    ..host_options(batch_size)
                };
                let want = single(&source, options.clone());
                if shuffle == Shuffle::None {
                    assert!(want.bytes == data.repeat(2));
                }
                for devices in [2, 3] {
                    let what = format!(
                        "{shuffle:?}, batch {batch_size}, pieces {piece_bytes:?}, {devices} devices"
                    );
                    let (got, stats) = replicated(&source, options.clone(), devices);
                    for (device, received) in got.iter().enumerate() {
                        assert!(*received == want, "{what}: device {device} differs");
                        // Every record once per epoch on this device.
                        let mut seen = vec![0u32; 1000];
                        for (_, _, records) in &received.batches {
                            records.iter().for_each(|&r| seen[r as usize] += 1);
                        }
                        assert!(seen.iter().all(|&c| c == epochs as u32), "{what}");
                    }
                    let dataset = (data.len() * epochs as usize) as u64;
                    assert_eq!(stats.read_bytes, dataset, "{what}: read once");
                    assert_eq!(stats.bytes, devices as u64 * dataset, "{what}");
                    assert_eq!(stats.devices.len(), devices);
                    for d in &stats.devices {
                        assert_eq!((d.bytes, d.records), (dataset, 1000 * epochs), "{what}");
                    }
                    assert!(stats.pinned_bytes_peak <= 1 << 20, "{what}");
                }
            }
        }
    }
}

#[test]
fn replicated_ranks_match_single_device_ranks() {
    let (source, _) = random_source(1001, 8, 32);
    for rank in 0..3 {
        let options = LoaderOptions {
            shuffle: Shuffle::Random,
            seed: 3,
            rank,
            world_size: 3,
            drop_last: rank == 1,
            ..host_options(40)
        };
        let want = single(&source, options.clone());
        let (got, _) = replicated(&source, options, 2);
        assert!(got.iter().all(|g| *g == want), "rank {rank}");
    }
}

#[test]
fn one_pool_within_the_budget_for_all_devices() {
    let (source, data) = random_source(5000, 100, 33);
    for (budget, batch_size, piece_bytes) in [
        (8192, 1, None),
        (300_000, 1000, None),
        (64 << 10, 1000, Some(4096)),
        (64 << 20, 10, None),
    ] {
        let options = LoaderOptions {
            pinned_budget: budget,
            piece_bytes,
            ..host_options(batch_size)
        };
        let one = Loader::new(Arc::clone(&source), options.clone()).unwrap();
        let one_pool = one.stats().pinned_bytes;
        drop(one);
        let (got, stats) = replicated(&source, options, 3);
        assert!(got.iter().all(|g| g.bytes == data));
        assert!(
            stats.pinned_bytes_peak <= budget,
            "budget {budget}: {} bytes pinned",
            stats.pinned_bytes_peak
        );
        assert_eq!(
            stats.pinned_bytes, one_pool,
            "budget {budget}: one pool, as for one device"
        );
    }
}

#[test]
fn replicated_stats_say_the_data_was_read_once() {
    let (source, data) = random_source(3000, 64, 34);
    let devices = [DeviceSpec::Cpu; 2];
    let options = host_options(100);
    let replicated =
        MultiLoader::replicated(Arc::clone(&source), options.clone(), &devices).unwrap();
    let split = MultiLoader::new(source, options, &devices).unwrap();
    for multi in [replicated, split] {
        let is_replicated = multi.is_replicated();
        let mut multi = multi;
        for step in multi.by_ref() {
            step.unwrap();
        }
        let stats = multi.stats();
        let n = data.len() as u64;
        if is_replicated {
            assert_eq!((stats.read_bytes, stats.bytes), (n, 2 * n));
            assert_eq!(stats.batches, 2 * 30);
        } else {
            assert_eq!((stats.read_bytes, stats.bytes), (n, n));
            assert_eq!(stats.batches, 30);
        }
        assert_eq!(stats.devices.len(), 2);
        assert_eq!(
            stats.devices.iter().map(|d| d.bytes).sum::<u64>(),
            stats.bytes
        );
        assert_eq!(multi.device_bytes_held(), 0);
    }
}

/// The loader under a replicated `MultiLoader` yields every device's batch of each step: its
/// size hint must count them all, part way through a step too.
#[test]
fn a_replicated_loaders_size_hint_counts_every_devices_batches() {
    let (source, _) = random_source(100, 8, 41);
    let devices = [DeviceSpec::Cpu; 3];
    let mut loader = Loader::replicated(source, host_options(10), &devices).unwrap();
    let mut left = 3 * loader.num_batches() as usize;
    assert_eq!(left, 30);
    loop {
        let (_, most) = loader.size_hint();
        assert!(
            most.is_some_and(|most| most >= left),
            "{most:?} < {left} left"
        );
        match loader.next() {
            Some(batch) => {
                batch.unwrap();
                left -= 1;
            }
            None => break,
        }
    }
    assert_eq!(left, 0);
    assert_eq!(loader.size_hint(), (0, Some(0)));
}

#[test]
fn held_batches_stay_valid_after_the_loader_is_dropped() {
    let (source, data) = random_source(2000, 50, 35);
    let options = LoaderOptions {
        pinned_budget: 4 * 4096,
        ..host_options(20)
    };
    let mut multi = MultiLoader::replicated(source, options, &[DeviceSpec::Cpu; 2]).unwrap();
    let held: Vec<Vec<pinfeed::Batch>> = multi.by_ref().take(30).map(|s| s.unwrap()).collect();
    drop(multi);
    for (i, step) in held.iter().enumerate() {
        for batch in step {
            assert_eq!(
                batch.host_bytes().unwrap().unwrap(),
                &data[i * 1000..(i + 1) * 1000]
            );
        }
    }
}

#[test]
fn next_within_keeps_a_step_whole() {
    let (source, data) = random_source(500, 10, 36);
    let mut multi =
        MultiLoader::replicated(source, host_options(50), &[DeviceSpec::Cpu; 3]).unwrap();
    let mut bytes = vec![Vec::new(); 3];
    loop {
        match multi.next_within(Duration::from_micros(50)) {
            Waited::TimedOut => continue,
            Waited::Ready(None) => break,
            Waited::Ready(Some(step)) => {
                let step = step.unwrap();
                assert_eq!(step.len(), 3);
                assert!(step.iter().all(|b| b.index() == step[0].index()));
                for (device, batch) in step.iter().enumerate() {
                    bytes[device].extend_from_slice(batch.host_bytes().unwrap().unwrap());
                }
            }
        }
    }
    assert!(bytes.iter().all(|b| *b == data));
    assert!(multi.next().is_none());
}

#[test]
fn bad_replication_options_are_errors_not_panics() {
    let (source, _) = random_source(100, 1000, 37);
    let devices = [DeviceSpec::Cpu; 2];
    let register = LoaderOptions {
        reader: Reader::Register,
        ..host_options(10)
    };
    let err = MultiLoader::replicated(Arc::clone(&source), register, &devices).unwrap_err();
    assert!(matches!(err, LoaderError::Config(_)), "{err}");
    let small = LoaderOptions {
        pinned_budget: 1000,
        ..host_options(10)
    };
    let err = MultiLoader::replicated(Arc::clone(&source), small, &devices).unwrap_err();
    assert!(matches!(err, LoaderError::BudgetTooSmall { .. }), "{err}");
    let err = MultiLoader::replicated(Arc::clone(&source), host_options(10), &[]).unwrap_err();
    assert!(matches!(err, LoaderError::Config(_)), "{err}");
    let zero = LoaderOptions {
        prefetch: 0,
        ..host_options(10)
    };
    assert!(MultiLoader::replicated(source, zero, &devices).is_err());
}

/// The CRC-32 of what each device received.
fn crcs(multi: MultiLoader) -> Vec<u32> {
    let mut crcs: Vec<crc32fast::Hasher> = Vec::new();
    for step in multi {
        let step = step.unwrap();
        crcs.resize_with(step.len(), crc32fast::Hasher::new);
        for (crc, batch) in crcs.iter_mut().zip(step) {
            let mut back = vec![0u8; batch.len_bytes()];
            batch.read_back(&mut back).unwrap();
            crc.update(&back);
        }
    }
    crcs.into_iter().map(|c| c.finalize()).collect()
}

/// Two backends on one GPU (two copy streams, two pools), as two GPUs would have: every batch
/// copied to both, byte-exact, read once; pieces and shuffles too.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_replicated_twice_to_one_gpu_is_byte_exact() {
    let (source, data) = random_source(20_000, 2883, 38);
    let devices = [DeviceSpec::Cuda(0), DeviceSpec::Cuda(0)];
    for (batch_size, piece_bytes) in [(1000, None), (7777, Some(4 << 20)), (20_000, Some(1 << 20))]
    {
        let options = LoaderOptions {
            batch_size,
            piece_bytes,
            epochs: 2,
            device: DeviceSpec::Cuda(0),
            ..LoaderOptions::default()
        };
        let multi = MultiLoader::replicated(Arc::clone(&source), options, &devices).unwrap();
        let want = crc32fast::hash(&data.repeat(2));
        let mut multi = multi;
        let mut crc = [crc32fast::Hasher::new(), crc32fast::Hasher::new()];
        for step in multi.by_ref() {
            for (c, batch) in crc.iter_mut().zip(step.unwrap()) {
                assert_eq!(batch.device(), DeviceSpec::Cuda(0));
                let mut back = vec![0u8; batch.len_bytes()];
                batch.read_back(&mut back).unwrap();
                c.update(&back);
            }
        }
        for c in crc {
            assert_eq!(
                c.finalize(),
                want,
                "batch {batch_size}, pieces {piece_bytes:?}"
            );
        }
        let stats = multi.stats();
        assert_eq!(stats.read_bytes, 2 * data.len() as u64);
        assert_eq!(stats.bytes, 4 * data.len() as u64);
        assert!(stats.pinned_bytes_peak <= pinfeed::DEFAULT_PINNED_BUDGET);
        assert_eq!(stats.pinned_allocations_after_start, 0);
    }
}

/// Shuffled, held batches, a small ring: both devices' copies of every record intact after the
/// ring has cycled many times.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_replicated_shuffled_batches_stay_intact() {
    let (source, data) = random_source(4096, 4096, 39);
    let options = LoaderOptions {
        batch_size: 16,
        shuffle: Shuffle::Random,
        seed: 2,
        pinned_budget: 4 * 16 * 4096,
        device: DeviceSpec::Cuda(0),
        ..LoaderOptions::default()
    };
    let devices = [DeviceSpec::Cuda(0), DeviceSpec::Cuda(0)];
    let multi = MultiLoader::replicated(Arc::clone(&source), options.clone(), &devices).unwrap();
    let held: Vec<_> = multi.map(|s| s.unwrap()).collect();
    for step in &held {
        for batch in step {
            let mut back = vec![0u8; batch.len_bytes()];
            batch.read_back(&mut back).unwrap();
            for (k, &r) in batch.records().to_vec().iter().enumerate() {
                let r = r as usize;
                assert_eq!(
                    back[k * 4096..(k + 1) * 4096],
                    data[r * 4096..(r + 1) * 4096]
                );
            }
        }
    }
    let multi = MultiLoader::replicated(source, options, &devices).unwrap();
    let c = crcs(multi);
    assert_eq!(c[0], c[1]);
}

#[test]
fn a_read_error_ends_a_replicated_run_after_the_whole_steps_before_it() {
    let (inner, data) = random_source(1000, 16, 40);
    let source = Arc::new(Faulty {
        inner,
        bad_record: 555,
        fault: Fault::Error,
    });
    for piece_bytes in [None, Some(3 * 16)] {
        let options = LoaderOptions {
            piece_bytes,
            ..host_options(10)
        };
        let multi =
            MultiLoader::replicated(source.clone(), options, &[DeviceSpec::Cpu; 2]).unwrap();
        let mut good = 0;
        let mut error = None;
        for step in multi {
            match step {
                Ok(step) => {
                    assert_eq!(step.len(), 2);
                    for batch in &step {
                        let at = good * 160;
                        assert_eq!(batch.host_bytes().unwrap().unwrap(), &data[at..at + 160]);
                    }
                    good += 1;
                }
                Err(e) => error = Some(e),
            }
        }
        let error = error.expect("the error reaches the consumer");
        assert!(error.to_string().contains("injected"), "{error}");
        // As with one device (faults.rs): the error stops the readers, so batches before the
        // bad one that other readers had not finished are not delivered; none after it is.
        assert!(
            good <= 55,
            "pieces {piece_bytes:?}: {good} steps delivered past the bad batch"
        );
    }
}
