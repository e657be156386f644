//! Each batch's document count (`Batch::documents`), counted on the reader threads off the
//! pinned slots: equal to the count of the rule's starts in the bytes the batch delivers,
//! however the batch is cut into pieces and whichever threads read them.

use pinfeed::{Loader, LoaderOptions, Shuffle};
use pinfeed_source::tokens::{self, Boundaries, Sample, TokenDType, TokenOptions, TokenSource};

use crate::common::host_options;

const EOS: u32 = 7;
const BOS: u32 = 3;

/// uint32 tokens `0 .. 20` at random, so that eos (7) and bos (3) each end or open about one
/// document in 20 tokens.
fn token_file(dir: &std::path::Path, tokens: usize) -> std::path::PathBuf {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let bytes: Vec<u8> = (0..tokens)
        .flat_map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((state >> 33) % 20) as u32).to_le_bytes()
        })
        .collect();
    let path = dir.join("tokens.bin");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn windows(path: &std::path::Path, sample: Sample, seq_len: u64) -> TokenSource {
    let options = TokenOptions {
        dtype: Some(TokenDType::U32),
        seq_len,
        sample,
        seed: 4,
        epoch: 0,
        steps: Some(9),
        batch_size: 6,
        world_size: 1,
        steps_per_batch: 1,
        shuffle: Default::default(),
    };
    tokens::open(path, &options).unwrap()
}

/// Documents in delivered windows of `window` uint32 tokens, by the rule written out plainly:
/// one a window, and one more at each input that is bos or follows eos.
fn starts(bytes: &[u8], window: usize, b: Boundaries) -> u64 {
    let tokens: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|t| u32::from_le_bytes(t.try_into().unwrap()))
        .collect();
    let mut count = 0;
    for w in tokens.chunks_exact(window) {
        count += 1;
        for i in 1..window - 1 {
            if Some(w[i]) == b.bos || Some(w[i - 1]) == b.eos {
                count += 1;
            }
        }
    }
    count
}

fn check(source: &TokenSource, options: LoaderOptions, window: usize, b: Boundaries) -> usize {
    let mut batches = 0;
    for batch in Loader::new(source.source(), options).unwrap() {
        let batch = batch.unwrap();
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        assert_eq!(batch.documents(), Some(starts(&back, window, b)));
        batches += 1;
    }
    batches
}

#[test]
fn a_batch_counts_the_documents_its_windows_pack_in_any_pieces_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = token_file(dir.path(), 5000);
    let seq_len = 40;
    let window = seq_len as usize + 1;
    for (bos, eos) in [(None, Some(EOS)), (Some(BOS), Some(EOS)), (Some(BOS), None)] {
        let b = Boundaries { bos, eos };
        for sample in [Sample::Sequential, Sample::Random] {
            let source = windows(&path, sample, seq_len);
            source.stream().set_boundaries(b);
            for (shuffle, piece_bytes, threads) in [
                (Shuffle::None, None, 1),
                (Shuffle::Random, Some(2 * window * 4 + 9), 3),
                (Shuffle::None, Some(window * 4), 2),
            ] {
                let options = LoaderOptions {
                    shuffle: if sample == Sample::Random {
                        Shuffle::None
                    } else {
                        shuffle
                    },
                    piece_bytes,
                    num_threads: Some(threads),
                    ..host_options(6)
                };
                assert!(check(&source, options, window, b) > 1);
            }
        }
    }
}

#[test]
fn windows_of_a_stream_that_names_no_boundaries_count_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = token_file(dir.path(), 500);
    let source = windows(&path, Sample::Sequential, 10);
    let loader = Loader::new(source.source(), host_options(4)).unwrap();
    for batch in loader {
        assert_eq!(batch.unwrap().documents(), None);
    }
    let (records, _) = crate::common::random_source(10, 8, 1);
    for batch in Loader::new(records, host_options(3)).unwrap() {
        assert_eq!(batch.unwrap().documents(), None);
    }
}
