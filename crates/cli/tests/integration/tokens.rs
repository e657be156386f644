//! Token data: `stream --seq-len` windows (random, sequential, documents), held to the token
//! file by --verify, and the one-line errors of token options.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{fixture, json_report, one_line_error, shown, stream_batches};

/// Tokens in `train.bin`.
const N: u64 = 1000;

/// `train.bin` holding tokens `0 .. N` as uint16, nanoGPT's format.
fn train_bin() -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = fixture("train.bin");
    let bytes: Vec<u8> = (0..N as u16).flat_map(u16::to_le_bytes).collect();
    fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// The committed Megatron dataset of uint16 tokens.
fn megatron_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../source/tests/fixtures/megatron/uint16.bin")
}

#[test]
fn random_windows_verify_against_the_file() {
    let (_dir, path) = train_bin();
    let run = stream_batches(
        &path,
        "4",
        &[
            "--tokens",
            "uint16",
            "--seq-len",
            "16",
            "--steps",
            "10",
            "--verify",
            "--json",
        ],
    );
    let report = json_report(&run);
    assert_eq!(report["verified"], true);
    assert_eq!(report["sample"], "random");
    // 10 steps of 4 windows of 17 uint16 tokens.
    assert_eq!(report["records"], 40);
    assert_eq!(report["bytes"], 40 * 17 * 2);
    assert!(report["tokens_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn sequential_windows_cover_the_file_once() {
    let (_dir, path) = train_bin();
    let args = [
        "--tokens",
        "uint16",
        "--seq-len",
        "16",
        "--sample",
        "sequential",
        "--verify",
        "--json",
    ];
    let report = json_report(&stream_batches(&path, "4", &args));
    let windows = (N - 1) / 16;
    assert_eq!(report["verified"], true);
    assert_eq!(report["sample"], "sequential");
    assert_eq!(report["records"], windows);
    assert_eq!(report["bytes"], windows * 17 * 2);
    // Window w is tokens w * 16 ..= w * 16 + 16, and token t holds t.
    let expected: Vec<u8> = (0..windows)
        .flat_map(|w| (w * 16..=w * 16 + 16).flat_map(|t| (t as u16).to_le_bytes()))
        .collect();
    assert_eq!(report["crc32"], crc32fast::hash(&expected));
}

#[test]
fn document_windows_of_a_megatron_dataset_verify() {
    let bin = megatron_bin();
    for path in [bin.clone(), bin.with_extension("idx")] {
        let args = [
            "--seq-len",
            "8",
            "--sample",
            "documents",
            "--seed",
            "3",
            "--verify",
            "--json",
        ];
        let report = json_report(&stream_batches(&path, "2", &args));
        assert_eq!(report["verified"], true, "{}", shown(&path));
        assert_eq!(report["sample"], "documents");
        let records = report["records"].as_u64().unwrap();
        assert!(records > 0);
        // Each record: 9 uint16 tokens, then a uint16 segment id per token.
        assert_eq!(report["bytes"].as_u64().unwrap(), records * 9 * 4);
    }
}

#[test]
fn odd_sized_token_file() {
    let (_dir, path) = fixture("odd.bin");
    fs::write(&path, [0u8; 7]).unwrap();
    one_line_error(
        &stream_batches(
            &path,
            "4",
            &["--tokens", "uint16", "--seq-len", "2", "--steps", "1"],
        ),
        &[&shown(&path), "7 bytes", "1 trailing"],
    );
}

#[test]
fn window_longer_than_the_data() {
    let (_dir, path) = train_bin();
    one_line_error(
        &stream_batches(
            &path,
            "4",
            &["--tokens", "uint16", "--seq-len", "1000", "--steps", "1"],
        ),
        &[&shown(&path), "1001 tokens", "1000 tokens"],
    );
}

#[test]
fn random_windows_need_steps() {
    let (_dir, path) = train_bin();
    one_line_error(
        &stream_batches(&path, "4", &["--tokens", "uint16", "--seq-len", "16"]),
        &[&shown(&path), "--steps"],
    );
}

#[test]
fn options_that_do_not_apply_to_the_sample() {
    let (_dir, path) = train_bin();
    let tokens = ["--tokens", "uint16", "--seq-len", "16"];
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--steps", "2", "--shuffle", "random"],
            &["--shuffle", "random"],
        ),
        (
            &["--sample", "sequential", "--steps", "2"],
            &["--steps", "sequential"],
        ),
        (&["--sample", "documents"], &[&shown(&path), "Megatron"]),
        (&["--sample", "shuffled"], &["unknown sample"]),
        (&["--steps", "2", "--dtype", "u2"], &["--dtype"]),
    ];
    for (extra, needles) in cases {
        let args: Vec<&str> = tokens.iter().chain(extra).copied().collect();
        one_line_error(&stream_batches(&path, "4", &args), needles);
    }
    // Without --tokens, a raw token file's type is asked for.
    one_line_error(
        &stream_batches(&path, "4", &["--seq-len", "16", "--steps", "2"]),
        &[&shown(&path), "--tokens"],
    );
    // A Megatron index without --seq-len says how to stream it.
    let idx = megatron_bin().with_extension("idx");
    one_line_error(
        &stream_batches(&idx, "4", &[]),
        &[&shown(&idx), "--seq-len"],
    );
}

#[test]
fn a_raw_token_file_without_its_type_says_to_give_tokens() {
    let (_dir, path) = train_bin();
    one_line_error(
        &stream_batches(&path, "4", &["--seq-len", "16", "--steps", "1"]),
        &[&shown(&path), "give --tokens"],
    );
}

/// Random windows are not bounded by the data: a batch of 10^13 of them (180 TB) is refused
/// before anything is allocated, naming the bytes, where it used to abort the process.
#[test]
fn a_token_batch_larger_than_memory_is_refused_before_anything_is_allocated() {
    let (_dir, path) = train_bin();
    let run = crate::common::pinfeed_within(
        &[
            "stream",
            &shown(&path),
            "--batch-size",
            "10000000000000",
            "--device",
            "cpu",
            "--tokens",
            "uint16",
            "--seq-len",
            "8",
            "--steps",
            "1",
        ],
        std::time::Duration::from_secs(60),
    );
    one_line_error(
        &run,
        &[
            &shown(&path),
            "180000000000000 bytes",
            "memory of device cpu",
        ],
    );
}
