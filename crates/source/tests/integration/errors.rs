//! Every way a dataset can be unusable gives a typed error that names the file.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{npy, open_path, DType, Layout, NpyFile, RawFile, Source, SourceError};

use crate::util::{names_path, python};

/// Saves `expr` with `np.save` as `name` in a fresh directory.
fn saved(expr: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    python(
        dir.path(),
        &format!("np.save(os.path.join(d, '{name}'), {expr}, allow_pickle=True)"),
    );
    let path = dir.path().join(name);
    (dir, path)
}

fn open_err(path: &Path) -> SourceError {
    let err = NpyFile::open(path).expect_err("opened a bad file");
    names_path(&err, path);
    // open_path must report the same problem.
    let err2 = open_path(path, None).expect_err("open_path opened a bad file");
    assert_eq!(err2.to_string(), err.to_string());
    err
}

fn u8_layout(shape: Vec<u64>) -> Layout {
    Layout::new(DType::uint8(), shape).unwrap()
}

#[test]
fn truncated_npy() {
    let (_d, path) = saved("np.arange(40, dtype='<f4').reshape(10, 4)", "t.npy");
    let len = std::fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    match open_err(&path) {
        e @ SourceError::DataSize {
            expected: 160,
            found: 157,
            ..
        } => {
            assert!(e.to_string().contains("truncated"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn header_promising_more_data_than_the_file_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lie.npy");
    let layout = Layout::new(DType::from_descr_literal("'<f4'").unwrap(), vec![4]).unwrap();
    let mut bytes = npy::header_bytes(&layout, 11);
    bytes.extend(vec![0u8; 10 * 16]);
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(
        open_err(&path),
        SourceError::DataSize {
            expected: 176,
            found: 160,
            ..
        }
    ));
}

#[test]
fn extra_trailing_bytes() {
    let (_d, path) = saved("np.zeros((5, 2), np.uint8)", "x.npy");
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"junk")
        .unwrap();
    match open_err(&path) {
        e @ SourceError::DataSize {
            expected: 10,
            found: 14,
            ..
        } => assert!(e.to_string().contains("extra bytes"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fortran_order() {
    let (_d, path) = saved("np.asfortranarray(np.zeros((4, 3), '<f4'))", "fo.npy");
    match open_err(&path) {
        e @ SourceError::FortranOrder { .. } => {
            assert!(e.to_string().contains("np.ascontiguousarray"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn big_endian() {
    let (_d, path) = saved("np.zeros((4, 3), '>f4')", "be.npy");
    match open_err(&path) {
        e @ SourceError::DType { .. } => assert!(e.to_string().contains("big-endian"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn object_dtype() {
    let (_d, path) = saved("np.array([1, 'a', None], dtype=object)", "o.npy");
    match open_err(&path) {
        e @ SourceError::DType { .. } => assert!(e.to_string().contains("object"), "{e}"),
        other => panic!("{other:?}"),
    }
    let (_d, path) = saved("np.zeros(3, [('a', '<f4'), ('b', 'O')])", "o2.npy");
    assert!(matches!(open_err(&path), SourceError::DType { .. }));
}

#[test]
fn shape_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.npy");
    python(
        dir.path(),
        "h = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1), '<f8'))\n\
         h['shape'] = (2**40, 2**40)\n\
         with open(os.path.join(d, 'big.npy'), 'wb') as f: np.lib.format.write_array_header_1_0(f, h)",
    );
    match open_err(&path) {
        e @ SourceError::Shape { .. } => assert!(e.to_string().contains("overflows"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_header_names_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.npy");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let text = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,, }\n";
    bytes.extend((text.len() as u16).to_le_bytes());
    bytes.extend(text);
    bytes.extend([0u8; 12]);
    std::fs::write(&path, bytes).unwrap();
    match open_err(&path) {
        e @ SourceError::Header { offset: 63, .. } => {
            assert!(e.to_string().contains("at byte 63"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A .npy name without the magic is a bad header, not a raw file.
    std::fs::write(&path, b"plain bytes").unwrap();
    assert!(matches!(
        open_path(&path, Some(u8_layout(vec![1]))),
        Err(SourceError::Header { offset: 0, .. })
    ));
}

#[test]
fn zero_records() {
    let (_d, path) = saved("np.zeros((0, 5), '<f4')", "empty.npy");
    match open_err(&path) {
        e @ SourceError::Empty { .. } => assert!(e.to_string().contains("dataset is empty"), "{e}"),
        other => panic!("{other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("empty.raw");
    std::fs::write(&raw, b"").unwrap();
    let e = RawFile::open(&raw, u8_layout(vec![4])).unwrap_err();
    assert!(matches!(e, SourceError::Empty { .. }), "{e:?}");
    names_path(&e, &raw);
}

#[test]
fn zero_size_records() {
    let (_d, path) = saved("np.zeros((5, 0), '<f4')", "zs.npy");
    match open_err(&path) {
        e @ SourceError::Layout { .. } => assert!(e.to_string().contains("zero bytes"), "{e}"),
        other => panic!("{other:?}"),
    }
    let (dtype, shape) = parse_user_dtype("0u8").unwrap();
    assert!(matches!(
        Layout::new(dtype, shape),
        Err(SourceError::Layout { .. })
    ));
}

#[test]
fn directory() {
    let dir = tempfile::tempdir().unwrap();
    for e in [
        NpyFile::open(dir.path()).unwrap_err(),
        RawFile::open(dir.path(), u8_layout(vec![1])).unwrap_err(),
        open_path(dir.path(), None).unwrap_err(),
    ] {
        assert!(matches!(e, SourceError::Open { .. }), "{e:?}");
        names_path(&e, dir.path());
        assert!(e.to_string().contains("Is a directory"), "{e}");
    }
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing-here.npy");
    for e in [
        NpyFile::open(&path).unwrap_err(),
        RawFile::open(&path, u8_layout(vec![1])).unwrap_err(),
        open_path(&path, None).unwrap_err(),
    ] {
        assert!(matches!(e, SourceError::Open { .. }), "{e:?}");
        names_path(&e, &path);
        assert!(e.to_string().contains("No such file"), "{e}");
    }
}

#[test]
fn raw_size_not_a_multiple() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.raw");
    std::fs::write(&path, vec![0u8; 100]).unwrap();
    let e = RawFile::open(&path, u8_layout(vec![3, 11])).unwrap_err();
    assert!(
        matches!(
            e,
            SourceError::RecordSize {
                size: 100,
                record_bytes: 33,
                trailing: 1,
                ..
            }
        ),
        "{e:?}"
    );
    names_path(&e, &path);
    let msg = e.to_string();
    assert!(
        msg.contains("100") && msg.contains("33") && msg.contains("1 trailing"),
        "{msg}"
    );
}

#[test]
fn raw_without_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    std::fs::write(&path, vec![0u8; 100]).unwrap();
    let e = open_path(&path, None).unwrap_err();
    assert!(matches!(e, SourceError::NotNpy { .. }), "{e:?}");
    names_path(&e, &path);
    assert!(e
        .to_string()
        .contains("not a .npy file; give the record dtype and shape for a raw record file"));
    assert_eq!(
        open_path(&path, Some(u8_layout(vec![10])))
            .unwrap()
            .num_records(),
        10
    );
}

#[test]
fn read_out_of_range() {
    let (_d, path) = saved("np.zeros((10, 4), np.uint8)", "r.npy");
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("r.raw");
    std::fs::write(&raw, vec![0u8; 40]).unwrap();
    let sources: Vec<(Box<dyn Source>, PathBuf)> = vec![
        (Box::new(NpyFile::open(&path).unwrap()), path.clone()),
        (
            Box::new(RawFile::open(&raw, u8_layout(vec![4])).unwrap()),
            raw.clone(),
        ),
    ];
    for (src, p) in &sources {
        let mut dst = vec![0u8; 8];
        let e = src.read_records(9, &mut dst).unwrap_err();
        assert!(
            matches!(
                e,
                SourceError::OutOfRange {
                    first: 9,
                    count: 2,
                    num_records: 10,
                    ..
                }
            ),
            "{e:?}"
        );
        names_path(&e, p);
        let e = src.gather(&[3, 10], &mut dst).unwrap_err();
        assert!(
            matches!(e, SourceError::OutOfRange { first: 10, .. }),
            "{e:?}"
        );
        let e = src.read_records(0, &mut dst[..6]).unwrap_err();
        assert!(matches!(e, SourceError::Destination { .. }), "{e:?}");
        names_path(&e, p);
        src.read_records(8, &mut dst).unwrap();
    }
}
