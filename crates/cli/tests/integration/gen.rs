//! `pinfeed gen` errors.

use crate::common::{fixture, one_line_error, pinfeed, shown};

#[test]
fn zero_records() {
    let (_dir, path) = fixture("g.npy");
    one_line_error(
        &pinfeed(["gen", &shown(&path), "--records", "0"]),
        &[&shown(&path), "--records", "at least 1"],
    );
    assert!(!path.exists(), "a refused gen left a file behind");
}

#[test]
fn into_a_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no").join("such").join("g.npy");
    one_line_error(
        &pinfeed(["gen", &shown(&path), "--records", "3"]),
        &[&shown(&path), "No such file or directory"],
    );
}

#[test]
fn onto_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    one_line_error(
        &pinfeed(["gen", &shown(dir.path()), "--records", "3"]),
        &[&shown(dir.path()), "directory"],
    );
}

#[test]
fn bad_dtype_or_layout() {
    let (_dir, path) = fixture("g.npy");
    let g = |extra: &[&str]| {
        let mut args = vec![
            "gen".to_owned(),
            shown(&path),
            "--records".into(),
            "3".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        pinfeed(args)
    };
    one_line_error(&g(&["--dtype", "quux"]), &["dtype", "quux"]);
    one_line_error(&g(&["--dtype", "|O"]), &["object"]);
    one_line_error(&g(&["--shape", "0"]), &["zero bytes"]);
    one_line_error(&g(&["--shape", "4294967296,4294967296,4"]), &["overflows"]);
    assert!(!path.exists(), "a refused gen left a file behind");
}

#[test]
fn records_whose_total_overflows() {
    let (_dir, path) = fixture("g.npy");
    one_line_error(
        &pinfeed(["gen", &shown(&path), "--records", "18446744073709551615"]),
        &[&shown(&path), "overflows 64 bits"],
    );
}
