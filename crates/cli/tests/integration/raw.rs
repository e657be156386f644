//! Raw record files and the --dtype / --shape options that describe them.

use std::fs;

use crate::common::{fixture, one_line_error, pinfeed, python, shown, small_npy, stream};

/// 64 zero bytes in `records.bin`: a raw file any one-byte dtype reads.
fn records_bin() -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, path) = fixture("records.bin");
    fs::write(&path, vec![0u8; 64]).unwrap();
    (dir, path)
}

#[test]
fn raw_size_not_a_multiple_of_the_record_size() {
    let (_dir, path) = fixture("odd.bin");
    fs::write(&path, vec![0u8; 2883 * 3 + 5]).unwrap();
    one_line_error(
        &stream(&path, &["--dtype", "3,31,31B"]),
        &[
            &shown(&path),
            "8654 bytes",
            "record size 2883",
            "5 trailing bytes",
        ],
    );
}

#[test]
fn raw_file_without_dtype() {
    let (_dir, path) = records_bin();
    one_line_error(&stream(&path, &[]), &[&shown(&path), "not a .npy file"]);
}

#[test]
fn empty_raw_file() {
    let (_dir, path) = fixture("empty.bin");
    fs::write(&path, b"").unwrap();
    one_line_error(
        &stream(&path, &["--dtype", "u8"]),
        &[&shown(&path), "empty"],
    );
}

#[test]
fn unknown_dtype() {
    let (_dir, path) = records_bin();
    for dtype in ["quux", "f4", "3,,31B", "B,B", "", "[('x', '<f4'"] {
        let shown_dtype = format!("{dtype:?}");
        let needle = if dtype.starts_with('[') {
            "dtype"
        } else {
            &shown_dtype
        };
        one_line_error(&stream(&path, &["--dtype", dtype]), &["dtype", needle]);
    }
}

/// The README promises errors name the file; a --dtype that does not parse is reported before
/// the file is opened, without it (crates/cli/src/stream.rs, `open_source`).
#[test]
fn unknown_dtype_names_the_file() {
    let (_dir, path) = records_bin();
    one_line_error(
        &stream(&path, &["--dtype", "quux"]),
        &[&shown(&path), "quux"],
    );
}

/// A dtype of more than `usize::MAX / 8` bytes: `Layout::new` refuses it and formats it for the
/// message, and `DType`'s `Display` (crates/source/src/dtype.rs, `let bits = self.itemsize * 8`)
/// overflows, which panics in debug builds such as this test's. Found by `fuzz/` (user_dtype);
/// the input is in fuzz/regressions/.
#[test]
fn a_dtype_too_large_to_name_is_an_error_not_a_panic() {
    let (dir, path) = records_bin();
    let huge = "[('x', '|u2', (6148914691236517198,))]";
    one_line_error(&stream(&path, &["--dtype", huge]), &["overflows"]);
    let npy = dir.path().join("huge.npy");
    fs::write(
        &npy,
        crate::common::npy_header(
            1,
            format!("{{'descr': {huge}, 'fortran_order': False, 'shape': (1,), }}\n").as_bytes(),
        ),
    )
    .unwrap();
    one_line_error(&stream(&npy, &[]), &[&shown(&npy), "overflows"]);
    let out = dir.path().join("g.npy");
    one_line_error(
        &pinfeed(["gen", &shown(&out), "--records", "1", "--dtype", huge]),
        &["overflows"],
    );
}

#[test]
fn refused_dtypes_say_why() {
    let (_dir, path) = records_bin();
    one_line_error(&stream(&path, &["--dtype", ">f4"]), &["big-endian"]);
    one_line_error(&stream(&path, &["--dtype", "f4"]), &["byte order", "'<f4'"]);
    one_line_error(
        &stream(&path, &["--dtype", "u8", "--shape", "0"]),
        &["zero bytes"],
    );
    one_line_error(
        &stream(
            &path,
            &["--dtype", "u8", "--shape", "4294967296,4294967296,4"],
        ),
        &["overflows"],
    );
}

/// What holds today for a --shape clap cannot read: exit code 2, the bad value named, no panic.
#[test]
fn bad_shape_is_refused() {
    let (_dir, path) = records_bin();
    for shape in ["3,x", "-1", "3;4", "99999999999999999999"] {
        let run = stream(&path, &["--dtype", "u8", "--shape", shape]);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(run.stderr.contains(shape), "{}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

/// The README's promise for the same input: one line, `pinfeed: error:`. Today clap prints its
/// own three lines (`error: invalid value ...`, a blank line, `For more information ...`); see
/// docs/RELIABILITY.md.
#[test]
fn bad_shape_is_one_line() {
    let (_dir, path) = records_bin();
    one_line_error(
        &stream(&path, &["--dtype", "u8", "--shape", "3,x"]),
        &["3,x"],
    );
    one_line_error(&pinfeed(["stream", &shown(&path)]), &["--batch-size"]);
}

#[test]
fn dtype_contradicting_the_npy_header() {
    let (_dir, path) = small_npy();
    one_line_error(
        &stream(&path, &["--dtype", "<f4"]),
        &[&shown(&path), "(12 bytes)", "4 bytes", "--dtype/--shape"],
    );
    one_line_error(
        &stream(&path, &["--shape", "3,5"]),
        &[&shown(&path), "(12 bytes)", "15 bytes"],
    );
    // Same size, other shape: refused too (the message gives both dtypes and shapes).
    one_line_error(
        &stream(&path, &["--dtype", "u8", "--shape", "12"]),
        &[&shown(&path), "--dtype/--shape"],
    );
}

#[test]
fn dtype_agreeing_with_the_npy_header_is_accepted() {
    let (_dir, path) = small_npy();
    for extra in [
        &["--dtype", "u8", "--shape", "3,4"][..],
        &["--dtype", "3,4B"],
        &["--dtype", "3,4|u1"],
    ] {
        let run = stream(&path, extra);
        assert_eq!(run.code, Some(0), "{extra:?}: {}", run.stderr);
    }
}

#[test]
fn numpy_memmap_records_stream_with_the_comma_dtype() {
    let (dir, path) = fixture("images.bin");
    let crc: u32 = python(
        dir.path(),
        "m = np.memmap(os.path.join(d, 'images.bin'), dtype='3,31,31B', mode='w+', shape=(37,))\n\
         m[:] = np.random.default_rng(5).integers(0, 256, size=(37, 3, 31, 31), dtype=np.uint8)\n\
         m.flush()\n\
         print(zlib.crc32(np.fromfile(os.path.join(d, 'images.bin'), dtype='3,31,31B').tobytes()))",
    )
    .trim()
    .parse()
    .unwrap();
    let run = stream(&path, &["--dtype", "3,31,31B", "--verify", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["records"], 37);
    assert_eq!(report["bytes"], 37 * 2883);
    assert_eq!(report["verified"], true);
    assert_eq!(report["crc32"], crc);
}

/// Python refuses raw records without a dtype; so does the command, rather than guess uint8.
#[test]
fn raw_file_with_shape_but_no_dtype() {
    let (_dir, path) = records_bin();
    one_line_error(
        &stream(&path, &["--shape", "4"]),
        &[&shown(&path), "raw record file", "--dtype"],
    );
}
