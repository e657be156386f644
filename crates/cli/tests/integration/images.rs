//! Image datasets: `stream --images` over an ImageFolder tree, held to a decode of each
//! record by --verify, and the one-line errors of bad images.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{json_report, one_line_error, stream_batches};

fn image(name: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../source/tests/fixtures/images")
            .join(name),
    )
    .unwrap()
}

/// `train/` with two classes of the given fixtures.
fn tree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    for (rel, name) in files {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, image(name)).unwrap();
    }
    (dir, root)
}

const GOOD: &[(&str, &str)] = &[
    ("cat/1.jpg", "baseline.jpg"),
    ("cat/2.jpg", "progressive.jpg"),
    ("dog/3.png", "rgb.png"),
    ("dog/4.jpg", "cmyk.jpg"),
    ("dog/5.jpg", "grayscale.jpg"),
];

#[test]
fn images_stream_and_verify() {
    let (_dir, root) = tree(GOOD);
    for extra in [
        &["--crop", "random"][..],
        &["--crop", "center", "--layout", "NHWC"],
    ] {
        let mut args = vec![
            "--images",
            "--size",
            "32",
            "--shuffle",
            "random",
            "--verify",
        ];
        args.extend(extra);
        args.push("--json");
        let report = json_report(&stream_batches(&root, "2", &args));
        assert_eq!(report["verified"], true, "{extra:?}");
        assert_eq!(report["records"], 5);
        assert_eq!(report["bytes"], 5 * (32 * 32 * 3 + 8));
        assert_eq!(report["skipped"], 0);
        assert!(report["images_per_second"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn a_bad_image_is_one_line_naming_it_or_skipped() {
    let mut files = GOOD.to_vec();
    files.push(("dog/6.jpg", "truncated.jpg"));
    let (_dir, root) = tree(&files);
    let run = stream_batches(&root, "2", &["--images", "--size", "16"]);
    one_line_error(&run, &["dog/6.jpg", "corrupt or truncated JPEG"]);
    let skip = ["--images", "--size", "16", "--on-error", "skip", "--json"];
    let report = json_report(&stream_batches(&root, "2", &skip));
    assert_eq!(
        (report["records"].as_u64(), report["skipped"].as_u64()),
        (Some(6), Some(1))
    );
    let (_dir, empty) = tree(&[
        ("cat/1.jpg", "baseline.jpg"),
        ("dog/notes.txt", "baseline.jpg"),
    ]);
    let run = stream_batches(&empty, "2", &["--images"]);
    one_line_error(&run, &["dog", "empty class folder"]);
    let run = stream_batches(&root, "2", &["--images", "--layout", "CHW"]);
    one_line_error(&run, &["--layout", "NCHW or NHWC"]);
}

#[test]
fn doctor_shows_what_decode_auto_picks() {
    let run = crate::common::pinfeed(["doctor", "--device", "cpu", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        report["image_decode"],
        "cpu: batches go to the host backend"
    );
    let text = crate::common::pinfeed(["doctor", "--device", "cpu"]);
    let shown = text
        .stdout
        .lines()
        .find(|l| l.contains("image decode=\"auto\""));
    assert!(
        shown.is_some_and(|l| l.ends_with("cpu: batches go to the host backend")),
        "{}",
        text.stdout
    );
    // --images names a dataset to time the decoders on; one that does not open is an error.
    let missing = crate::common::pinfeed(["doctor", "--device", "cpu", "--images", "/no/such"]);
    assert_ne!(missing.code, Some(0));
    assert!(missing.stderr.contains("/no/such"), "{}", missing.stderr);
}
