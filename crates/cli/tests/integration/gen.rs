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

#[test]
fn an_existing_file_or_link_needs_force() {
    let (dir, path) = fixture("g.npy");
    let p = shown(&path);
    assert_eq!(pinfeed(["gen", &p, "--records", "3"]).code, Some(0));
    let before = std::fs::read(&path).unwrap();
    one_line_error(
        &pinfeed(["gen", &p, "--records", "5", "--seed", "1"]),
        &[&p, "already exists", "--force"],
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "overwritten without --force"
    );
    let run = pinfeed(["gen", &p, "--records", "5", "--seed", "1", "--force"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_ne!(std::fs::read(&path).unwrap(), before);

    let target = dir.path().join("target.npy");
    std::fs::write(&target, b"keep").unwrap();
    let link = dir.path().join("link.npy");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    one_line_error(
        &pinfeed(["gen", &shown(&link), "--records", "3"]),
        &[&shown(&link), "symbolic link", "--force"],
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
}

/// numpy puts a sub-array dtype's dims after the shape: `np.zeros(4, dtype='2,3B')` has shape
/// (4, 2, 3). `gen` writes that, and `stream` reads the same options the same way.
#[test]
fn subarray_dims_come_after_the_shape_as_in_numpy() {
    let (dir, path) = fixture("g.npy");
    let p = shown(&path);
    let run = pinfeed([
        "gen",
        &p,
        "--records",
        "5",
        "--shape",
        "4",
        "--dtype",
        "2,3B",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let shape = crate::common::python(
        dir.path(),
        "print(np.load(os.path.join(d, 'g.npy')).shape == (5,) + np.zeros(4, dtype='2,3B').shape)",
    );
    assert_eq!(shape.trim(), "True");
    let agreeing = crate::common::stream(&path, &["--shape", "4", "--dtype", "2,3B"]);
    assert_eq!(agreeing.code, Some(0), "{}", agreeing.stderr);
    one_line_error(
        &crate::common::stream(&path, &["--shape", "2,3", "--dtype", "4B"]),
        &[&p, "[4, 2, 3]", "[2, 3, 4]"],
    );
}

/// Opening a FIFO for writing blocks until a reader comes: `gen` refuses any target that is not
/// a regular file by its type, `--force` or not.
#[test]
fn a_fifo_target_is_refused_not_opened() {
    let (_dir, path) = fixture("pipe.npy");
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let p = shown(&path);
    let run = crate::common::pinfeed_within(
        &["gen", &p, "--records", "3", "--force"],
        std::time::Duration::from_secs(30),
    );
    one_line_error(&run, &[&p, "not a regular file"]);
}

/// The size is checked against the file system's free space before anything is written, and
/// the refusal names the bytes needed.
#[test]
fn a_file_larger_than_the_free_space_is_refused_before_writing() {
    let (_dir, path) = fixture("g.npy");
    let p = shown(&path);
    // 10^14 one-byte records: 100 TB, more than any disk a test runs on.
    let run = crate::common::pinfeed_within(
        &["gen", &p, "--records", "100000000000000", "--shape", "1"],
        std::time::Duration::from_secs(30),
    );
    one_line_error(&run, &[&p, "needs 100000000000128 bytes", "free"]);
    assert!(!path.exists(), "a refused gen left a file behind");
}
