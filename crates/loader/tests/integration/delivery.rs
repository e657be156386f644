//! Every byte delivered equals the source; every record once per epoch, in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pinfeed::{Loader, LoaderOptions, Transform};

use crate::common::{
    collect, host_bytes, host_options, random_source, slow_first_batch, Fault, Faulty, Gate,
};

#[test]
fn byte_exact_for_batch_sizes_that_divide_and_do_not() {
    let (source, data) = random_source(1000, 37, 1);
    for batch_size in [1, 7, 100, 250, 333, 999, 1000, 1001] {
        for threads in [1, 3] {
            let options = LoaderOptions {
                num_threads: Some(threads),
                ..host_options(batch_size)
            };
            let loader = Loader::new(Arc::clone(&source), options).unwrap();
            assert_eq!(loader.num_batches(), 1000u64.div_ceil(batch_size as u64));
            let (bytes, batches) = collect(loader);
            assert_eq!(
                crc32fast::hash(&bytes),
                crc32fast::hash(&data),
                "batch size {batch_size}, {threads} threads"
            );
            assert_eq!(bytes.len(), data.len());
            let mut expected_first = 0;
            for (_, first, records) in batches {
                assert_eq!(first, expected_first);
                expected_first += records as u64;
            }
            assert_eq!(expected_first, 1000);
        }
    }
}

#[test]
fn drop_last_drops_only_the_partial_batch() {
    let (source, data) = random_source(103, 5, 2);
    let options = LoaderOptions {
        drop_last: true,
        ..host_options(10)
    };
    let (bytes, batches) = collect(Loader::new(source, options).unwrap());
    assert_eq!(batches.len(), 10);
    assert_eq!(bytes, data[..100 * 5]);
}

#[test]
fn epochs_repeat_the_dataset() {
    let (source, data) = random_source(50, 8, 3);
    let options = LoaderOptions {
        epochs: 3,
        ..host_options(16)
    };
    let (bytes, batches) = collect(Loader::new(source, options).unwrap());
    assert_eq!(bytes, data.repeat(3));
    let epochs: Vec<u64> = batches.iter().map(|b| b.0).collect();
    assert_eq!(epochs, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
}

#[test]
fn many_epochs_through_a_two_slot_ring() {
    // A budget of exactly two slots makes every batch wait for a recycled slot.
    let (source, data) = random_source(64, 4096, 4);
    let options = LoaderOptions {
        epochs: 20,
        pinned_budget: 2 * 4 * 4096,
        num_threads: Some(4),
        ..host_options(4)
    };
    let mut loader = Loader::new(source, options).unwrap();
    let bytes = host_bytes(&mut loader);
    let stats = loader.stats();
    assert_eq!(stats.slots, 2);
    assert!(stats.slots_recycled >= 318, "{stats:?}");
    assert_eq!(crc32fast::hash(&bytes), crc32fast::hash(&data.repeat(20)));
}

#[test]
fn stats_count_the_claims_and_those_of_a_readers_own_slot() {
    // One claim a batch; a lone reader's claims are of its own slots but for the first of each
    // slot (the ring's own test checks which slot each of several readers gets).
    let (source, data) = random_source(64, 4096, 5);
    let options = LoaderOptions {
        epochs: 10,
        pinned_budget: 4 * 4 * 4096,
        num_threads: Some(1),
        ..host_options(4)
    };
    let mut loader = Loader::new(source, options).unwrap();
    let bytes = host_bytes(&mut loader);
    assert_eq!(bytes, data.repeat(10));
    let stats = loader.stats();
    assert_eq!(stats.slots, 4);
    assert_eq!(stats.slot_claims, 160, "{stats:?}");
    let not_own = stats.slot_claims - stats.slot_claims_own;
    assert!((1..=stats.slots as u64).contains(&not_own), "{stats:?}");
}

#[test]
fn stats_tell_apart_the_copy_held_behind_a_batch_still_being_read() {
    // Two readers and two slots; the first batch takes 100 ms longer to read. The second is
    // copied as soon as it is filled, but the copy thread takes nothing past the ring's two
    // slots from the first: the third is filled while it still waits for the first, and the
    // second reader then waits for a slot with no copy in flight. (A wait counts once it ends
    // in a claim: with 100 batches, the first reader does not take all the rest meanwhile.)
    let delay = Duration::from_millis(100);
    let (source, data) = slow_first_batch(delay);
    let options = LoaderOptions {
        num_threads: Some(2),
        pinned_budget: 2 * 4096,
        ..host_options(10)
    };
    let mut loader = Loader::new(source, options).unwrap();
    let bytes = host_bytes(&mut loader);
    assert_eq!(bytes, data);
    let stats = loader.stats();
    assert_eq!(stats.slots, 2);
    // A quarter: the waits start a little after the slow read does.
    assert!(stats.wait_filled_behind >= delay / 4, "{stats:?}");
    assert!(stats.wait_filled >= stats.wait_filled_behind, "{stats:?}");
    assert!(stats.wait_free_slot_no_copy >= delay / 4, "{stats:?}");
    assert!(
        stats.wait_free_slot >= stats.wait_free_slot_no_copy,
        "{stats:?}"
    );
}

#[test]
fn later_batches_are_copied_while_an_earlier_one_is_still_read() {
    // Two readers; the first batch's read is held until the test has seen device memory taken.
    // The copy thread may take the two pieces the readers work on, so the second batch is
    // copied as soon as it is filled, while the first is still read, and nothing past it (in
    // sequence order nothing would be copied before the first, and the wait below would end
    // at its deadline with none). The batches still reach the consumer in order, every byte
    // equal, and the device never holds more than the window's two batches, one in the
    // channel and one the consumer holds.
    let gate = Arc::new(Gate::default());
    let (inner, data) = random_source(1000, 16, 7);
    let source = Arc::new(Faulty {
        inner,
        bad_record: 0,
        fault: Fault::Wait(Arc::clone(&gate)),
    });
    let options = LoaderOptions {
        num_threads: Some(2),
        pinned_budget: 16 * 4096,
        prefetch: 1,
        ..host_options(10)
    };
    let batch_bytes = 10 * 16;
    let mut loader = Loader::new(source, options).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while loader.stats().device_bytes_peak == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The second reader has filled slots past the window meanwhile: none of them is copied.
    std::thread::sleep(Duration::from_millis(50));
    let held_while_read = loader.stats().device_bytes_peak;
    gate.open();
    assert_eq!(held_while_read, batch_bytes, "the second batch alone");
    assert_eq!(host_bytes(&mut loader), data, "every byte, in order");
    let stats = loader.stats();
    assert_eq!(stats.slots, 10);
    assert!(stats.device_bytes_peak <= 4 * batch_bytes, "{stats:?}");
}

#[test]
fn with_a_device_budget_batches_are_copied_in_sequence_order() {
    // As above, with a device budget of twenty batches: the copy thread takes the batches in
    // order, so the device holds at most the one being copied, the one in the channel
    // (prefetch 1) and the one the consumer holds.
    let (source, data) = slow_first_batch(Duration::from_millis(100));
    let batch_bytes = 10 * 16;
    let options = LoaderOptions {
        num_threads: Some(2),
        pinned_budget: 16 * 4096,
        prefetch: 1,
        device_budget: Some(20 * batch_bytes),
        ..host_options(10)
    };
    let mut loader = Loader::new(source, options).unwrap();
    assert_eq!(host_bytes(&mut loader), data, "every byte, in order");
    let stats = loader.stats();
    assert!(stats.device_bytes_peak >= batch_bytes, "{stats:?}");
    assert!(stats.device_bytes_peak <= 3 * batch_bytes, "{stats:?}");
}

struct Negate;
impl Transform for Negate {
    fn output_record_bytes(&self) -> usize {
        6
    }
    fn apply(&self, input: &[u8], records: usize, output: &mut [u8]) -> Result<(), String> {
        assert_eq!(input.len(), records * 3);
        assert_eq!(output.len(), records * 6);
        for (i, o) in input.iter().zip(output.chunks_exact_mut(2)) {
            o[0] = !i;
            o[1] = *i;
        }
        Ok(())
    }
}

#[test]
fn transform_writes_into_the_slot() {
    let (source, data) = random_source(77, 3, 5);
    let options = LoaderOptions {
        transform: Some(Arc::new(Negate)),
        ..host_options(10)
    };
    let loader = Loader::new(source, options).unwrap();
    assert_eq!(loader.record_bytes(), 6);
    let (bytes, _) = collect(loader);
    let expected: Vec<u8> = data.iter().flat_map(|b| [!b, *b]).collect();
    assert_eq!(bytes, expected);
}

#[test]
fn stats_account_for_everything_delivered() {
    let (source, data) = random_source(300, 11, 6);
    let mut loader = Loader::new(source, host_options(32)).unwrap();
    let mut count = 0;
    for batch in loader.by_ref() {
        batch.unwrap();
        count += 1;
    }
    let stats = loader.stats();
    assert_eq!(count, 10);
    assert_eq!(stats.batches, 10);
    assert_eq!(stats.records, 300);
    assert_eq!(stats.bytes, data.len() as u64);
    assert_eq!(stats.read_bytes, data.len() as u64);
    assert!(stats.gbps() > 0.0);
}
