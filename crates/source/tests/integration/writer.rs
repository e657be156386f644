//! `NpyWriter` output read back by numpy.

use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::npy::NpyWriter;
use pinfeed_source::{DType, Layout, NpyFile, Source, SourceError};

use crate::util::python;

#[test]
fn numpy_loads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let (dtype, shape) = parse_user_dtype("3,5<f4").unwrap();
    let layout = Layout::new(dtype, shape).unwrap();
    let n = 1000u64;
    let rb = layout.record_bytes();
    let data: Vec<u8> = (0..n as usize * rb).map(|i| (i * 7 % 251) as u8).collect();
    let path = dir.path().join("w.npy");
    let mut w = NpyWriter::create(&path, &layout, n).unwrap();
    for chunk in data.chunks(777) {
        w.write(chunk).unwrap();
    }
    w.finish().unwrap();

    let out = python(
        dir.path(),
        "a = np.load(os.path.join(d, 'w.npy'))\nprint(a.dtype.str, a.shape, a.flags['C_CONTIGUOUS'], zlib.crc32(a.tobytes()))",
    );
    assert_eq!(
        out.trim(),
        format!("<f4 (1000, 3, 5) True {}", crc32fast::hash(&data))
    );

    let src = NpyFile::open(&path).unwrap();
    assert_eq!(src.layout(), &layout);
    let mut back = vec![0u8; data.len()];
    src.read_records(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn wrong_byte_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.npy");
    let layout = Layout::new(DType::uint8(), vec![4]).unwrap();
    let mut w = NpyWriter::create(&path, layout.clone(), 3).unwrap();
    w.write(&[0; 8]).unwrap();
    let e = w.write(&[0; 5]).unwrap_err();
    assert!(
        matches!(
            e,
            SourceError::WriteCount {
                expected: 12,
                found: 13,
                ..
            }
        ),
        "{e:?}"
    );
    let e = w.finish().unwrap_err();
    assert!(
        matches!(
            e,
            SourceError::WriteCount {
                expected: 12,
                found: 8,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains(&path.display().to_string()));
    assert!(matches!(
        NpyWriter::create(&path, &layout, 0),
        Err(SourceError::Empty { .. })
    ));
    assert!(matches!(
        NpyWriter::create(&path, &layout, u64::MAX),
        Err(SourceError::Shape { .. })
    ));
    let e = NpyWriter::create(dir.path().join("no/such/dir.npy"), &layout, 1).unwrap_err();
    assert!(matches!(e, SourceError::Open { .. }), "{e:?}");
}
