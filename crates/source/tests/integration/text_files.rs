//! The text records format (`*.pftxt`): the proof of the "Adding a source format" recipe.

use std::path::{Path, PathBuf};

use pinfeed_source::{open_with, FormatOptions, ReadOptions};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/small.pftxt")
}

#[test]
fn reads_the_fixture_byte_exact() {
    let src = open_with(fixture(), None, &ReadOptions::default()).unwrap();
    assert_eq!((src.num_records(), src.layout().record_bytes()), (3, 6));
    let want: Vec<u8> = [1i16, 2, 3, -4, 5, 300, 7, 8, -32768]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut all = vec![0u8; 18];
    src.read_records(0, &mut all).unwrap();
    assert_eq!(all, want);
    let mut two = vec![0u8; 12];
    src.gather(&[2, 0], &mut two).unwrap();
    assert_eq!(two, [&want[12..], &want[..6]].concat());
}

#[test]
fn options_give_the_layout_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.pftxt");
    std::fs::write(&p, "1.5 2\n3 4\n").unwrap();
    let options = ReadOptions {
        format: FormatOptions::new().with("dtype", "f32").with("shape", "2"),
        ..ReadOptions::default()
    };
    let src = open_with(&p, None, &options).unwrap();
    let mut dst = vec![0u8; 8];
    src.read_records(0, &mut dst).unwrap();
    assert_eq!(dst, [1.5f32.to_le_bytes(), 2f32.to_le_bytes()].concat());
    let tensor = ReadOptions {
        format: FormatOptions::new().with("tensor", "x"),
        ..ReadOptions::default()
    };
    let e = open_with(&p, None, &tensor).unwrap_err().to_string();
    assert!(
        e.contains("tensor option") && e.contains("text files"),
        "{e}"
    );
}

#[test]
fn malformed_lines_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, line, what) in [
        (
            "# dtype=u8 shape=2\n1 2\n3\n",
            3,
            "expected 2 numbers, found 1",
        ),
        ("# dtype=u8 shape=2\n1 2\n3 256\n", 3, "does not fit"),
        ("# dtype=i32\n1\nx\n", 3, "is not a '<i4' number"),
        ("# colour=red\n1\n", 1, "header word"),
        ("1 2\n", 1, "no dtype"),
    ] {
        let p = dir.path().join("bad.pftxt");
        std::fs::write(&p, text).unwrap();
        let e = open_with(&p, None, &ReadOptions::default())
            .unwrap_err()
            .to_string();
        let at = format!("{}:{line}: ", p.display());
        assert!(
            e.contains(&at) && e.contains(what) && !e.contains('\n'),
            "{e}"
        );
    }
}
