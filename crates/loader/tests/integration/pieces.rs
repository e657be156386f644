//! Batches read and copied in pieces (`LoaderOptions::piece_bytes`): the same bytes, order and
//! batches as whole-batch slots, from memory and from files by every read mode.

use std::sync::Arc;

use pinfeed::{Loader, LoaderOptions, Shuffle};
use pinfeed_source::{open_with, ReadOptions, Reader, Source};

use crate::common::{host_options, random_source};
use crate::register::npy_file;

/// A batch's epoch, index and records.
type BatchPlace = (u64, u64, Vec<u64>);

/// Bytes, and the place of each batch, in delivery order.
fn run(source: &Arc<dyn Source>, options: LoaderOptions) -> (Vec<u8>, Vec<BatchPlace>) {
    let loader = Loader::new(Arc::clone(source), options).unwrap();
    let mut bytes = Vec::new();
    let mut batches = Vec::new();
    for batch in loader {
        let batch = batch.unwrap();
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        bytes.extend_from_slice(&back);
        batches.push((batch.epoch(), batch.index(), batch.records().to_vec()));
    }
    (bytes, batches)
}

#[test]
fn pieces_deliver_what_whole_batches_do_in_every_order() {
    let (source, data) = random_source(1000, 37, 11);
    for shuffle in [
        Shuffle::None,
        Shuffle::Random,
        Shuffle::Block {
            block: 16,
            window: 4,
        },
    ] {
        for batch_size in [1, 7, 100, 333, 1000] {
            let whole = LoaderOptions {
                shuffle,
                seed: 5,
                epochs: 2,
                piece_bytes: None,
                ..host_options(batch_size)
            };
            let want = run(&source, whole.clone());
            if shuffle == Shuffle::None {
                assert_eq!(want.0, data.repeat(2));
            }
            // A piece of one record, of two and a bit (not a whole number of records), and
            // of three records (not dividing most batch sizes).
            for piece_bytes in [1, 2 * 37 + 5, 3 * 37] {
                for threads in [1, 3] {
                    let options = LoaderOptions {
                        piece_bytes: Some(piece_bytes),
                        num_threads: Some(threads),
                        ..whole.clone()
                    };
                    let got = run(&source, options);
                    assert!(
                        got == want,
                        "{shuffle:?}, batch {batch_size}, pieces of {piece_bytes} bytes, {threads} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn pieces_keep_drop_last_and_short_last_batches() {
    let (source, data) = random_source(103, 5, 12);
    for drop_last in [false, true] {
        let options = LoaderOptions {
            drop_last,
            piece_bytes: Some(3 * 5),
            ..host_options(10)
        };
        let (bytes, batches) = run(&source, options);
        let records = if drop_last { 100 } else { 103 };
        assert_eq!(bytes, data[..records * 5]);
        assert_eq!(batches.len(), if drop_last { 10 } else { 11 });
        assert_eq!(
            batches.last().unwrap().2.len(),
            if drop_last { 10 } else { 3 }
        );
    }
}

#[test]
fn a_batch_larger_than_the_budget_streams_in_pieces() {
    let (source, data) = random_source(4096, 1024, 13);
    // 1 MiB batches through 256 KiB of pinned memory: four 64 KiB slots.
    let options = LoaderOptions {
        pinned_budget: 256 << 10,
        piece_bytes: Some(64 << 10),
        num_threads: Some(3),
        ..host_options(1024)
    };
    let loader = Loader::new(Arc::clone(&source), options.clone()).unwrap();
    let stats = loader.stats();
    assert!(stats.slot_bytes <= 64 << 10, "{}", stats.slot_bytes);
    assert!(stats.pinned_bytes_peak <= 256 << 10);
    drop(loader);
    assert_eq!(run(&source, options).0, data);
    // Without pieces the same budget cannot hold two batches.
    let whole = LoaderOptions {
        piece_bytes: None,
        pinned_budget: 256 << 10,
        ..host_options(1024)
    };
    let err = Loader::new(source, whole).unwrap_err();
    assert!(err.to_string().contains("pinned budget"), "{err}");
}

/// Pieces of a file read with O_DIRECT land past their slot's start, like whole batches; files
/// live on disk (the target directory), since tmpfs may refuse O_DIRECT.
#[test]
fn pieces_are_byte_exact_from_files_by_every_read_mode() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_, data) = npy_file(&dir, 2000, vec![3, 31, 31], 14);
    let path = dir.path().join("d14.npy");
    for mode in [Reader::Direct, Reader::Uring, Reader::Pread, Reader::Mmap] {
        let read = ReadOptions {
            reader: mode,
            ..ReadOptions::default()
        };
        let source: Arc<dyn Source> = Arc::from(open_with(&path, None, &read).unwrap());
        for shuffle in [Shuffle::None, Shuffle::Random] {
            let options = LoaderOptions {
                shuffle,
                num_threads: Some(3),
                piece_bytes: Some(100 * 2883 + 1000),
                ..host_options(1024)
            };
            let (bytes, batches) = run(&source, options);
            let expected: Vec<u8> = batches
                .iter()
                .flat_map(|b| b.2.iter())
                .flat_map(|&r| data[r as usize * 2883..(r as usize + 1) * 2883].to_vec())
                .collect();
            assert_eq!(batches.len(), 2);
            assert!(bytes == expected, "{mode:?} {shuffle:?}");
        }
    }
}
