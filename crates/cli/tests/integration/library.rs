//! What the command line cannot reach: a file that shrinks while it streams.
//!
//! `pinfeed stream` reads as fast as it can, so a test cannot truncate the file between two of
//! its batches; the loader (which the command runs) can be held between batches instead.

use std::fs::OpenOptions;
use std::sync::Arc;

use pinfeed::{DeviceSpec, Loader, LoaderOptions};
use pinfeed_source::{open_path, NpyFile, Source};

use crate::common::{fixture, python, shown};

#[test]
fn a_file_shrinking_while_streaming_is_an_error_at_the_consumer() {
    let (dir, path) = fixture("shrink.npy");
    // 1024 records of 4096 bytes; record i is filled with i % 251.
    python(
        dir.path(),
        "a = np.repeat((np.arange(1024) % 251).astype(np.uint8)[:, None], 4096, axis=1)\n\
         np.save(os.path.join(d, 'shrink.npy'), a)",
    );
    let data_offset = NpyFile::open(&path).unwrap().header().data_offset;
    let source: Arc<dyn Source> = Arc::from(open_path(&path, None).unwrap());
    let options = LoaderOptions {
        batch_size: 4,
        num_threads: Some(2),
        prefetch: 1,
        pinned_budget: 4 * 16384,
        device: DeviceSpec::Cpu,
        ..LoaderOptions::default()
    };
    let mut loader = Loader::new(source, options).unwrap();
    let first = loader.next().unwrap().unwrap();
    assert_eq!(first.num_records(), 4);
    // Cut the file in the middle of record 500.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(data_offset + 500 * 4096 + 100)
        .unwrap();
    let mut records = 4u64;
    let mut error = None;
    for batch in loader.by_ref() {
        match batch {
            Ok(batch) => {
                let mut back = vec![0u8; batch.len_bytes()];
                batch.read_back(&mut back).unwrap();
                for (i, record) in back.chunks(4096).enumerate() {
                    let n = batch.first_record() + i as u64;
                    assert!(n < 500, "record {n} delivered from past the cut");
                    assert!(
                        record.iter().all(|&b| u64::from(b) == n % 251),
                        "record {n} corrupt"
                    );
                }
                records += batch.num_records() as u64;
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let error = error.unwrap_or_else(|| panic!("no error after {records} records"));
    assert!(error.contains(&shown(&path)), "{error}");
    assert!(error.contains("shrank"), "{error}");
    assert!(records <= 500, "{records}");
    // After the error the loader ends; dropping it joins its threads (no hang).
    assert!(loader.next().is_none_or(|b| b.is_err()));
    drop(loader);
}
