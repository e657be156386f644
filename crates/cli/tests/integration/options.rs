//! Options of `stream` that are wrong whatever the file: batch size, budget, device, reader.

use crate::common::{
    fixture, json_report, one_line_error, pinfeed, python, shown, small_npy, stream, stream_batches,
};

#[test]
fn batch_size_zero() {
    let (_dir, path) = small_npy();
    let run = stream_batches(&path, "0", &[]);
    one_line_error(&run, &["batch size", "at least 1"]);
}

#[test]
fn batch_larger_than_the_dataset_with_drop_last() {
    let (_dir, path) = small_npy();
    let run = stream_batches(&path, "11", &["--drop-last"]);
    one_line_error(&run, &[&shown(&path), "11", "10 records", "drop_last"]);
}

#[test]
fn batch_larger_than_the_dataset_without_drop_last_is_one_batch() {
    let (_dir, path) = small_npy();
    let report = json_report(&stream_batches(&path, "1000", &["--json"]));
    assert_eq!(
        (report["records"].as_u64(), report["batches"].as_u64()),
        (Some(10), Some(1))
    );
}

#[test]
fn epochs_zero() {
    let (_dir, path) = small_npy();
    one_line_error(
        &stream(&path, &["--epochs", "0"]),
        &["epochs", "at least 1"],
    );
}

#[test]
fn pinned_budget_that_is_not_a_size() {
    let (_dir, path) = small_npy();
    for (budget, needle) in [
        ("12 parsecs", "unknown unit"),
        ("1e30", "1e30"),
        ("-5MiB", "-5MiB"),
        ("", "expected a number"),
        ("99999999999TiB", "out of range"),
    ] {
        // `--opt=value`, so that clap takes "-5MiB" as a value rather than a flag.
        let arg = format!("--pinned-budget={budget}");
        one_line_error(&stream(&path, &[&arg]), &["size", needle]);
    }
}

#[test]
fn pinned_budget_zero_gives_advice() {
    let (_dir, path) = small_npy();
    let message = one_line_error(
        &stream(&path, &["--pinned-budget", "0"]),
        &[
            "pinned budget of 0 bytes",
            "raise the pinned budget to at least",
        ],
    );
    assert!(needed_bytes(&message) > 0, "{message}");
}

#[test]
fn pinned_budget_below_two_batches_names_the_bytes_needed() {
    let (dir, path) = fixture("rows.npy");
    python(
        dir.path(),
        "np.save(os.path.join(d, 'rows.npy'), np.zeros((1000, 1000), np.uint8))",
    );
    let run = stream_batches(&path, "64", &["--pinned-budget", "100KiB"]);
    let message = one_line_error(
        &run,
        &["102400 bytes", "64 records of 1000 bytes", "at least 2"],
    );
    let needed = needed_bytes(&message);
    assert!(needed >= 2 * 64 * 1000, "{message}");
    // And the advice is right: that budget works.
    let budget = needed.to_string();
    let report = json_report(&stream_batches(
        &path,
        "64",
        &["--pinned-budget", &budget, "--json"],
    ));
    assert!(report["pinned_bytes_peak"].as_u64().unwrap() <= needed as u64);
}

/// The number in "raise the pinned budget to at least N bytes".
fn needed_bytes(message: &str) -> usize {
    let tail = message.split("at least ").last().unwrap();
    tail.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn unknown_device() {
    let (_dir, path) = small_npy();
    for device in ["tpu", "cuda:x", "cuda:-1", "gpu0", ""] {
        let run = pinfeed([
            "stream",
            &shown(&path),
            "--batch-size",
            "2",
            "--device",
            device,
        ]);
        one_line_error(&run, &["device"]);
    }
}

#[test]
fn cuda_without_a_driver_is_an_error_not_a_panic() {
    let (_dir, path) = small_npy();
    let run = pinfeed([
        "stream",
        &shown(&path),
        "--batch-size",
        "2",
        "--device",
        "cuda:0",
    ]);
    if run.code == Some(0) {
        return; // a machine with a GPU: nothing to check here (crates/cuda tests the device)
    }
    let message = one_line_error(&run, &[]);
    assert!(
        message.contains("CUDA") || message.contains("cuda"),
        "{message}"
    );
    if !std::path::Path::new("/dev/nvidiactl").exists() && !has_libcuda() {
        assert!(message.contains("no CUDA driver"), "{message}");
    }
}

fn has_libcuda() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

#[test]
fn unknown_reader_and_pin_method() {
    let (_dir, path) = small_npy();
    one_line_error(
        &stream(&path, &["--reader", "nonsense"]),
        &["reader", "nonsense", "pread"],
    );
    one_line_error(
        &stream(&path, &["--pin-method", "glue"]),
        &["pin method", "glue", "hostalloc"],
    );
}

#[test]
fn register_reader_on_the_host_backend() {
    // The register reader needs CUDA; on the host backend asking for it is refused or falls
    // back, but never panics.
    let (_dir, path) = small_npy();
    let run = stream(&path, &["--reader", "register"]);
    if run.code != Some(0) {
        one_line_error(&run, &["register"]);
    }
}

#[test]
fn zero_threads_or_repeats_are_refused() {
    for (args, needle) in [
        (
            &["bench", "--device", "cpu", "--repeat", "0"][..],
            "--repeat",
        ),
        (&["bench", "--device", "cpu", "--threads", "0"], "--threads"),
    ] {
        one_line_error(&pinfeed(args), &[needle, "0"]);
    }
    let (_dir, path) = small_npy();
    one_line_error(&stream(&path, &["--threads", "0"]), &["--threads", "0"]);
}

/// More threads than any machine has cores, or a row of more bytes than memory holds, is
/// refused in one line before anything is set up (100 000 threads aborted setting up their
/// stacks; `--cols 2^64-1` overflowed a capacity). The thread limit is the loader's
/// (`pinfeed::tune::MAX_THREADS`), which Python's `num_threads` meets too.
#[test]
fn thread_counts_and_rows_past_what_a_machine_holds_are_refused() {
    let (_dir, path) = small_npy();
    let limit = pinfeed::tune::MAX_THREADS.to_string();
    for run in [
        stream(&path, &["--threads", "100000"]),
        pinfeed(["bench", "--device", "cpu", "--threads", "100000"]),
    ] {
        one_line_error(&run, &["--threads", "100000", &limit]);
    }
    one_line_error(
        &pinfeed(["bench", "--device", "cpu", "--cols", "18446744073709551615"]),
        &["--cols 18446744073709551615", "available memory"],
    );
}

/// `stream --help` names every kind of dataset it takes, and the dtype that carries its shape.
#[test]
fn stream_help_names_every_dataset_kind() {
    let run = pinfeed(["stream", "--help"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for needle in [
        ".npy",
        ".safetensors",
        "raw record file",
        "directory",
        "glob",
        "3,31,31B",
    ] {
        assert!(
            run.stdout.contains(needle),
            "{needle:?} missing:\n{}",
            run.stdout
        );
    }
}

/// Store settings do nothing for a local file; they are refused by the rule Python's
/// `storage_options` follows (`pinfeed_store::refuse_on_local_path`), for records and tokens.
#[test]
fn store_settings_for_a_local_path_are_refused() {
    let (dir, path) = small_npy();
    let cache = shown(&dir.path().join("cache"));
    for (extra, named) in [
        (
            vec!["--storage-option", "region=eu-west-1"],
            "--storage-option",
        ),
        (vec!["--cache-dir", &cache], "--cache-dir"),
        (
            vec![
                "--seq-len",
                "2",
                "--tokens",
                "uint8",
                "--sample",
                "sequential",
                "--cache-dir",
                &cache,
            ],
            "--cache-dir",
        ),
    ] {
        one_line_error(
            &stream(&path, &extra),
            &[&shown(&path), named, "local path", "object-storage URLs"],
        );
    }
}
