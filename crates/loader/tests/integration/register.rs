//! The register reader: batches copied straight from windows of a mapped file, on the host
//! backend (the windows are locked with mlock where the limit allows, and copied with memcpy).

use std::sync::Arc;

use pinfeed::{Loader, LoaderOptions, Reader};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::npy::NpyWriter;
use pinfeed_source::{open_path, Layout, Source};
use rand::{RngCore, SeedableRng};

use crate::common::{collect, host_options};

pub(crate) fn npy_file(
    dir: &tempfile::TempDir,
    records: u64,
    shape: Vec<u64>,
    seed: u64,
) -> (Arc<dyn Source>, Vec<u8>) {
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    let layout = Layout::new(dtype, shape).unwrap();
    let mut data = vec![0u8; records as usize * layout.record_bytes()];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    let path = dir.path().join(format!("d{seed}.npy"));
    let mut writer = NpyWriter::create(&path, layout, records).unwrap();
    writer.write(&data).unwrap();
    writer.finish().unwrap();
    (Arc::from(open_path(&path, None).unwrap()), data)
}

#[test]
fn register_reader_is_byte_exact_across_window_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    // 2883-byte records: batches straddle 4096-byte pages and window boundaries everywhere.
    let (source, data) = npy_file(&dir, 3000, vec![3, 31, 31], 1);
    for (batch_size, budget, epochs, drop_last) in [
        (1, 64 << 10, 1, false),
        (7, 200 << 10, 2, false),
        (100, 1 << 20, 1, true),
        (1024, 64 << 20, 2, false),
        (3000, 64 << 20, 1, false),
    ] {
        let options = LoaderOptions {
            reader: Reader::Register,
            pinned_budget: budget,
            epochs,
            drop_last,
            ..host_options(batch_size)
        };
        let loader = Loader::new(Arc::clone(&source), options).unwrap();
        let stats = loader.stats();
        assert_eq!(stats.reader, Reader::Register);
        assert!(
            stats.pinned_bytes_peak <= budget,
            "budget {budget}: {stats:?}"
        );
        let (bytes, _) = collect(loader);
        let kept = if drop_last {
            3000 / batch_size * batch_size
        } else {
            3000
        };
        let expected = data[..kept * 2883].repeat(epochs as usize);
        assert_eq!(
            crc32fast::hash(&bytes),
            crc32fast::hash(&expected),
            "batch {batch_size}, budget {budget}"
        );
        assert_eq!(bytes.len(), expected.len());
    }
}

#[test]
fn register_reader_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = npy_file(&dir, 100, vec![1000], 2);
    let tiny = LoaderOptions {
        reader: Reader::Register,
        pinned_budget: 210_000,
        ..host_options(100)
    };
    let err = Loader::new(Arc::clone(&source), tiny).unwrap_err();
    assert!(err.to_string().contains("two windows"), "{err}");
    let (host, _) = crate::common::random_source(10, 10, 3);
    let err = Loader::new(
        host,
        LoaderOptions {
            reader: Reader::Register,
            ..host_options(2)
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs a file source"), "{err}");
}

#[test]
fn auto_uses_slots_on_the_host_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (source, data) = npy_file(&dir, 500, vec![64], 4);
    let mut loader = Loader::new(source, host_options(64)).unwrap();
    assert_eq!(loader.stats().reader, Reader::Pread);
    let mut bytes = Vec::new();
    for batch in loader.by_ref() {
        bytes.extend_from_slice(batch.unwrap().host_bytes().unwrap().unwrap());
    }
    assert_eq!(bytes, data);
}

/// O_DIRECT and io_uring readers through the whole loader: aligned reads land past the slot's
/// start and the copy starts there. Files live on disk (the target directory), since tmpfs may
/// refuse O_DIRECT.
#[test]
fn direct_and_uring_readers_are_byte_exact_through_the_loader() {
    use pinfeed_source::{open_with, ReadOptions, Reader};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_, data) = npy_file(&dir, 2000, vec![3, 31, 31], 5);
    let path = dir.path().join("d5.npy");
    for mode in [Reader::Direct, Reader::Uring, Reader::Pread] {
        for read_size in [4096, 1 << 20] {
            let read = ReadOptions {
                reader: mode,
                read_size,
                ..ReadOptions::default()
            };
            let source: Arc<dyn Source> = Arc::from(open_with(&path, None, &read).unwrap());
            for (batch_size, shuffle) in [
                (1, pinfeed::Shuffle::None),
                (333, pinfeed::Shuffle::None),
                (1024, pinfeed::Shuffle::Random),
            ] {
                let options = LoaderOptions {
                    shuffle,
                    num_threads: Some(3),
                    ..host_options(batch_size)
                };
                let loader = Loader::new(Arc::clone(&source), options).unwrap();
                let description = loader.stats().reader_description;
                let mut bytes = Vec::new();
                let mut order = Vec::new();
                for batch in loader {
                    let batch = batch.unwrap();
                    order.extend(batch.records().to_vec());
                    bytes.extend_from_slice(batch.host_bytes().unwrap().unwrap());
                }
                let expected: Vec<u8> = order
                    .iter()
                    .flat_map(|&r| data[r as usize * 2883..(r as usize + 1) * 2883].to_vec())
                    .collect();
                assert_eq!(order.len(), 2000);
                assert_eq!(
                    crc32fast::hash(&bytes),
                    crc32fast::hash(&expected),
                    "{mode:?} ({description}) read size {read_size} batch {batch_size}"
                );
            }
        }
    }
}

/// A loader that starts at a later epoch, or mid-epoch, with the register reader (what every
/// Python pass after the first is): it must deliver the rest exactly, not stall.
#[test]
fn register_reader_resumes_at_later_epochs_and_mid_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (source, data) = npy_file(&dir, 3000, vec![3, 31, 31], 6);
    for (epoch, done) in [(1, 0), (3, 0), (0, 5), (2, 11)] {
        let options = LoaderOptions {
            reader: Reader::Register,
            pinned_budget: 1 << 20,
            epochs: 2,
            start: pinfeed::Position {
                epoch,
                batches_done: done,
                consumed: 0,
            },
            ..host_options(100)
        };
        let (bytes, batches) = collect(Loader::new(Arc::clone(&source), options).unwrap());
        let expected = [&data[done as usize * 100 * 2883..], &data[..]].concat();
        assert_eq!(batches.first().map(|b| b.0), Some(epoch));
        assert_eq!(
            crc32fast::hash(&bytes),
            crc32fast::hash(&expected),
            "start {epoch}/{done}"
        );
    }
}

/// A file truncated while the register reader streams it, to nothing or into its header: every
/// batch delivered holds the file's bytes (on the host backend a copy from a page past the end
/// reads a page of zeroes, so a batch is checked once its copy has finished), then an error
/// naming the file, then the end.
#[test]
fn register_reader_delivers_no_byte_of_a_truncated_file() {
    for cut in [0u64, 50] {
        let dir = tempfile::tempdir().unwrap();
        let (source, data) = npy_file(&dir, 3000, vec![3, 31, 31], 7);
        let path = dir.path().join("d7.npy");
        let options = LoaderOptions {
            reader: Reader::Register,
            // One window holds the whole file: nothing is locked after the cut.
            pinned_budget: 64 << 20,
            prefetch: 1,
            ..host_options(10)
        };
        let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
        let mut delivered = 0usize;
        let mut error = None;
        for batch in loader.by_ref() {
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            };
            let mut back = vec![0u8; batch.len_bytes()];
            batch.read_back(&mut back).unwrap();
            let at = batch.first_record() as usize * 2883;
            assert!(
                back == data[at..at + back.len()],
                "cut at {cut}: batch at record {} holds bytes that are not the file's",
                batch.first_record()
            );
            delivered += 1;
            if delivered == 2 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(cut)
                    .unwrap();
            }
        }
        let e = error.unwrap_or_else(|| panic!("cut at {cut}: no error after {delivered}"));
        assert!(e.contains("d7.npy") && e.contains("shrank"), "{e}");
        assert!(loader.next().is_none(), "cut at {cut}: the loader went on");
    }
}
