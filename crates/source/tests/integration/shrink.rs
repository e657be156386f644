//! A file that shrinks after it was opened gives `Truncated`, never a panic or short data.

use std::fs::OpenOptions;

use pinfeed_source::{DType, Layout, NpyFile, RawFile, ReadOptions, Reader, Source, SourceError};

use crate::util::{names_path, python};

#[test]
fn npy_shrinks_after_open() {
    let dir = tempfile::tempdir().unwrap();
    python(
        dir.path(),
        "np.save(os.path.join(d, 's.npy'), np.arange(100 * 8, dtype='<u2').reshape(100, 8))",
    );
    let path = dir.path().join("s.npy");
    let src = NpyFile::open(&path).unwrap();
    let data_offset = src.header().data_offset;
    // Cut the file in the middle of record 50.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(data_offset + 50 * 16 + 6)
        .unwrap();

    let mut dst = vec![0u8; 16 * 10];
    src.read_records(40, &mut dst).unwrap();
    assert_eq!(&dst[..2], &(40u16 * 8).to_le_bytes());
    dst.fill(0);
    match src.read_records(45, &mut dst) {
        Err(e @ SourceError::Truncated { .. }) => {
            let SourceError::Truncated {
                offset,
                expected,
                found,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(
                (*offset, *expected, *found),
                (data_offset + 45 * 16, 160, 5 * 16 + 6)
            );
            names_path(&e, &path);
            assert!(e.to_string().contains("shrank"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        src.gather(&[1, 99], &mut dst[..32]),
        Err(SourceError::Truncated { .. })
    ));
}

/// The mapped gather of a file cut after the mapping was made: records before the cut still
/// read right, a record in the page the cut runs through (zeroes past the cut, no fault) and
/// one in a page wholly past it (a fault) are `Truncated`, never a crash or zeroes.
#[test]
fn mapped_gather_of_a_shrunk_file_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.raw");
    let bytes: Vec<u8> = (0..64 * 1000).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let options = ReadOptions {
        reader: Reader::Mmap,
        ..ReadOptions::default()
    };
    let layout = Layout::new(DType::uint8(), vec![64]).unwrap();
    let src = RawFile::open_with(&path, layout, &options).unwrap();
    let mut dst = vec![0u8; 64 * 3];
    src.gather(&[900, 3, 500], &mut dst).unwrap();
    assert!(dst[64..128] == bytes[3 * 64..4 * 64]);
    // Cut 10 bytes into record 200 (byte 12810, in the page of bytes 12288..16384).
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(200 * 64 + 10)
        .unwrap();
    src.gather(&[199, 0, 150], &mut dst).unwrap();
    assert!(dst[..64] == bytes[199 * 64..200 * 64]);
    for (indices, faults) in [([199, 201, 0], false), ([3, 900, 4], true)] {
        match src.gather(&indices, &mut dst) {
            Err(e @ SourceError::Truncated { .. }) => {
                names_path(&e, &path);
                assert!(e.to_string().contains("shrank"), "{e}");
            }
            other => panic!("{indices:?}: {other:?}"),
        }
        assert_eq!(
            src.reader_description().contains("stopped"),
            faults,
            "{indices:?}: {}",
            src.reader_description()
        );
    }
    src.gather(&[5], &mut dst[..64]).unwrap();
    assert!(dst[..64] == bytes[5 * 64..6 * 64]);
}

#[test]
fn raw_shrinks_to_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.raw");
    std::fs::write(&path, vec![7u8; 4096]).unwrap();
    let src = RawFile::open(&path, Layout::new(DType::uint8(), vec![64]).unwrap()).unwrap();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut dst = vec![0u8; 64];
    match src.read_records(0, &mut dst) {
        Err(SourceError::Truncated {
            offset: 0,
            expected: 64,
            found: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}
