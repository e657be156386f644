//! What works: gen then stream with --verify --json, and bench.

use crate::common::{fixture, json_report, pinfeed, python, shown, stream_batches};

#[test]
fn gen_then_stream_verify_json() {
    let (dir, path) = fixture("gen.npy");
    let run = pinfeed([
        "gen",
        &shown(&path),
        "--records",
        "257",
        "--shape",
        "3,5",
        "--dtype",
        "f32",
        "--seed",
        "9",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.is_empty());
    let crc: u32 = python(
        dir.path(),
        "a = np.load(os.path.join(d, 'gen.npy'))\n\
         assert a.dtype == np.float32 and a.shape == (257, 3, 5), (a.dtype, a.shape)\n\
         assert np.isfinite(a).all()\n\
         print(zlib.crc32(a.tobytes()))",
    )
    .trim()
    .parse()
    .unwrap();
    for (batch_size, threads) in [("7", "1"), ("64", "3"), ("257", "2"), ("1000", "4")] {
        let r = json_report(&stream_batches(
            &path,
            batch_size,
            &["--threads", threads, "--verify", "--json"],
        ));
        assert_eq!(r["bytes"], 257 * 60);
        assert_eq!(r["records"], 257);
        assert!(r["seconds"].as_f64().unwrap() > 0.0);
        assert!(r["gbps"].as_f64().unwrap() > 0.0);
        assert_eq!(r["verified"], true);
        assert!(r["pinned_bytes_peak"].as_u64().unwrap() > 0);
        assert!(r["pinned_bytes_peak"].as_u64().unwrap() <= 256 << 20);
        assert_eq!(r["pinned_allocations_after_start"], 0);
        assert_eq!(r["pinned_numa"], "not placed: no GPU (host backend)");
        assert_eq!(r["crc32"], crc, "batch size {batch_size}");
    }
}

#[test]
fn crc_is_null_without_crc_or_verify() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "10"]).code,
        Some(0)
    );
    let r = json_report(&stream_batches(&path, "4", &["--json"]));
    assert!(r["crc32"].is_null());
    assert_eq!(r["verified"], false);
}

#[test]
fn epochs_and_drop_last_count_records() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "10", "--shape", "4"]).code,
        Some(0)
    );
    let r = json_report(&stream_batches(
        &path,
        "3",
        &["--epochs", "3", "--drop-last", "--json", "--verify"],
    ));
    assert_eq!(
        (r["records"].as_u64(), r["batches"].as_u64()),
        (Some(27), Some(9))
    );
    assert_eq!(r["verified"], true);
}

/// Shuffled streams gather with the mapped gather or with pread as asked, and say which in the
/// report's `reader`; both deliver the same bytes, verified against the file. `auto` takes the
/// mapped gather for a file just written (so page-cached).
#[test]
fn shuffled_streams_say_which_gather_ran() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "1001", "--seed", "4"]).code,
        Some(0)
    );
    for shuffle in ["random", "block:8:4"] {
        let mut crcs = Vec::new();
        for (reader, said) in [
            ("pread", "pread"),
            ("mmap", "mmap gather, pread ranges"),
            ("auto", "mmap gather, pread ranges"),
        ] {
            // 91 divides 1001 records; 100 does not.
            for batch_size in ["91", "100"] {
                let run = stream_batches(
                    &path,
                    batch_size,
                    &[
                        "--shuffle",
                        shuffle,
                        "--reader",
                        reader,
                        "--threads",
                        "2",
                        "--epochs",
                        "2",
                        "--verify",
                        "--json",
                    ],
                );
                assert_eq!(run.code, Some(0), "{reader} {shuffle}: {}", run.stderr);
                let r = json_report(&run);
                assert_eq!(r["reader"], said, "{reader} {shuffle}");
                assert_eq!(r["verified"], true, "{reader} {shuffle}");
                assert_eq!(r["records"], 2002);
                if reader == "auto" {
                    assert!(r["reader_auto_reason"].as_str().is_some(), "{r}");
                }
                crcs.push((batch_size, r["crc32"].as_u64().unwrap()));
            }
        }
        for (batch_size, crc) in &crcs {
            let first = crcs.iter().find(|c| c.0 == *batch_size).unwrap().1;
            assert_eq!(*crc, first, "{shuffle}, batches of {batch_size}: {crcs:?}");
        }
    }
}

#[test]
fn bench_json_names_the_three_variants() {
    let run = pinfeed([
        "bench", "--device", "cpu", "--rows", "8", "--cols", "4096", "--repeat", "1", "--json",
    ]);
    let r = json_report(&run);
    let names: Vec<&str> = r["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for want in ["pageable", "pinned_per_batch", "pinfeed"] {
        assert!(names.contains(&want), "{names:?}");
    }
    for v in r["variants"].as_array().unwrap() {
        assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    }
}

#[test]
fn bench_on_the_host_backend_says_so() {
    let args = [
        "bench", "--device", "cpu", "--rows", "8", "--cols", "4096", "--repeat", "1",
    ];
    let run = pinfeed(args);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let first = run.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("host backend: no GPU here;") && first.contains("not PCIe"),
        "{}",
        run.stdout
    );
    let run = pinfeed(args.iter().copied().chain(["--json"]));
    assert_eq!(json_report(&run)["backend"], "host");
}

#[test]
fn stream_plot_writes_a_png() {
    let (dir, path) = fixture("plot.npy");
    let run = pinfeed(["gen", &shown(&path), "--records", "20000", "--shape", "256"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let png = dir.path().join("timeline.png");
    let run = stream_batches(&path, "100", &["--epochs", "3", "--plot", &shown(&png)]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let bytes = std::fs::read(&png).expect("the plot was written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        bytes.len() > 10_000,
        "a {}-byte PNG has no chart in it",
        bytes.len()
    );
    let bad = stream_batches(
        &path,
        "100",
        &["--plot", &shown(&dir.path().join("missing-dir/x.png"))],
    );
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains("cannot draw the plot"),
        "{}",
        bad.stderr
    );
}
