//! The mapped gather (`Reader::Mmap`): shuffled batches copied out of a mapping of the file
//! deliver exactly the bytes `pread` delivers, in every order and batching, across shards; and
//! a file that shrinks under the mapping is an error at the consumer, never a `SIGBUS`.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

use pinfeed::{Loader, LoaderOptions, Shuffle};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::npy::NpyWriter;
use pinfeed_source::{open_with, Layout, ReadOptions, Reader, Source};
use rand::{RngCore, SeedableRng};

use crate::common::host_options;

/// 2883-byte records: runs straddle pages everywhere.
const RECORD: usize = 2883;
const N: usize = 2000;

/// `.npy` files of `sizes` records each under `dir`, named in record order; their bytes.
fn write_npy(dir: &Path, sizes: &[usize]) -> Vec<u8> {
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    let layout = Layout::new(dtype, vec![3, 31, 31]).unwrap();
    let mut data = vec![0u8; sizes.iter().sum::<usize>() * RECORD];
    rand::rngs::StdRng::seed_from_u64(41).fill_bytes(&mut data);
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let path = dir.join(format!("part-{i:02}.npy"));
        let mut writer = NpyWriter::create(&path, layout.clone(), n as u64).unwrap();
        writer.write(&data[at..at + n * RECORD]).unwrap();
        writer.finish().unwrap();
        at += n * RECORD;
    }
    data
}

fn open(path: &Path, mode: Reader) -> Arc<dyn Source> {
    let read = ReadOptions {
        reader: mode,
        ..ReadOptions::default()
    };
    Arc::from(open_with(path, None, &read).unwrap())
}

/// What a loader delivers over two epochs, checked record by record against `data`, with its
/// reader description.
fn stream(source: Arc<dyn Source>, data: &[u8], shuffle: Shuffle, batch: usize) -> (u32, String) {
    let options = LoaderOptions {
        shuffle,
        seed: 5,
        epochs: 2,
        num_threads: Some(3),
        ..host_options(batch)
    };
    let mut loader = Loader::new(source, options).unwrap();
    let mut crc = crc32fast::Hasher::new();
    let mut records = 0;
    for batch in loader.by_ref() {
        let batch = batch.unwrap();
        let bytes = batch.host_bytes().unwrap().unwrap();
        for (k, &r) in batch.records().to_vec().iter().enumerate() {
            let want = &data[r as usize * RECORD..(r as usize + 1) * RECORD];
            assert!(
                &bytes[k * RECORD..(k + 1) * RECORD] == want,
                "record {r} at place {k} of batch {}",
                batch.seq()
            );
        }
        records += batch.num_records();
        crc.update(bytes);
    }
    assert_eq!(records, 2 * data.len() / RECORD);
    (crc.finalize(), loader.stats().reader_description)
}

#[test]
fn mapped_and_pread_gathers_deliver_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(&one).unwrap();
    std::fs::create_dir_all(&shards).unwrap();
    let data = write_npy(&one, &[N]);
    // Shards of 700, 1 and 1299 records: batches cross both boundaries, and one shard holds a
    // single record.
    assert_eq!(write_npy(&shards, &[700, 1, 1299]), data);
    let cases = [(one.join("part-00.npy"), "one file"), (shards, "shards")];
    for (path, what) in &cases {
        for shuffle in [
            Shuffle::Random,
            Shuffle::Block {
                block: 16,
                window: 4,
            },
        ] {
            // 1000 and 8 divide 2000 records; 333 and 1999 do not.
            for batch in [1000, 333, 8, 1999] {
                let (pread, pread_reader) =
                    stream(open(path, Reader::Pread), &data, shuffle, batch);
                let (mapped, mapped_reader) =
                    stream(open(path, Reader::Mmap), &data, shuffle, batch);
                let case = format!("{what}, {shuffle:?}, batches of {batch}");
                assert_eq!(pread_reader, "pread", "{case}");
                // The mapping was made and used: a refusal would say "pread (mmap refused: ..)".
                assert_eq!(mapped_reader, "mmap gather, pread ranges", "{case}");
                assert_eq!(mapped, pread, "{case}: CRC of the mapped gather");
            }
        }
    }
}

/// A file cut while a shuffled loader streams it: batches filled before the cut are intact,
/// then the consumer gets an error naming the file; the copies that run into the pages past
/// the new end fault, and the fault becomes that error instead of killing the process.
#[test]
fn a_file_shrinking_under_the_mapping_is_an_error_at_the_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_npy(dir.path(), &[N]);
    let path = dir.path().join("part-00.npy");
    let source = open(&path, Reader::Mmap);
    let data_offset = source.file().unwrap().data_offset;
    let options = LoaderOptions {
        shuffle: Shuffle::Random,
        num_threads: Some(2),
        prefetch: 1,
        pinned_budget: 4 * (64 * RECORD).next_multiple_of(4096),
        ..host_options(64)
    };
    let mut loader = Loader::new(Arc::clone(&source), options).unwrap();
    let first = loader.next().unwrap().unwrap();
    assert_eq!(first.num_records(), 64);
    // Cut in the middle of record 500 (of 2000): three quarters of the pages go.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(data_offset + 500 * RECORD as u64 + 100)
        .unwrap();
    let mut after_cut = 0;
    let error = loop {
        match loader.next() {
            Some(Ok(batch)) => {
                let bytes = batch.host_bytes().unwrap().unwrap();
                for (k, &r) in batch.records().to_vec().iter().enumerate() {
                    let want = &data[r as usize * RECORD..(r as usize + 1) * RECORD];
                    assert!(
                        &bytes[k * RECORD..(k + 1) * RECORD] == want,
                        "record {r} of batch {} is not the file's",
                        batch.seq()
                    );
                }
                after_cut += 1;
            }
            Some(Err(e)) => break e.to_string(),
            None => panic!("no error after {after_cut} batches past the cut"),
        }
    };
    assert!(error.contains(&path.display().to_string()), "{error}");
    assert!(error.contains("shrank"), "{error}");
    // Batches read before the cut may still arrive: the one in the channel (`prefetch` 1), the
    // one the copy thread holds until the channel has room, and the ring's four slots, filled
    // again as copies freed them.
    assert!(
        after_cut <= 6,
        "{after_cut} batches delivered after the cut"
    );
    assert!(loader.next().is_none_or(|b| b.is_err()));
    drop(loader);
    // Record 1500 lies in a page wholly past the new end: copying it faults (at the latest
    // here), and from then on the source gathers by pread and says so.
    let mut one = vec![0u8; RECORD];
    assert!(source.gather(&[1500], &mut one).is_err());
    assert_eq!(
        source.reader_description(),
        "pread (mmap gather stopped: the file shrank while mapped)"
    );
    source.gather(&[10], &mut one).unwrap();
    assert!(one == data[10 * RECORD..11 * RECORD]);
}
