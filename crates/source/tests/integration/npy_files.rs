//! `.npy` files written by numpy, read back through every path of `Source`.

use pinfeed_source::{npy, open_path, NpyFile, Source};

use crate::util::{check_against_numpy, crcs, python, write_indices};

const N: u64 = 120;

/// Writes a fixture with `body` (which must call `emit(arr)`), opens `file` and checks it.
fn check(file: &str, body: &str) -> NpyFile {
    let dir = tempfile::tempdir().unwrap();
    let idx = write_indices(dir.path(), N);
    let out = python(dir.path(), &format!("N = {N}\n{body}"));
    let path = dir.path().join(file);
    let src = NpyFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    check_against_numpy(&src, N, &idx, crcs(&out));
    // The same file through open_path, which must recognise it by its magic.
    let boxed = open_path(&path, None).unwrap();
    check_against_numpy(boxed.as_ref(), N, &idx, crcs(&out));
    src
}

#[test]
fn uint8_images() {
    let src = check(
        "a.npy",
        "arr = rng.integers(0, 256, size=(N, 3, 31, 31), dtype=np.uint8)\n\
         np.save(os.path.join(d, 'a.npy'), arr); emit(arr)",
    );
    assert_eq!(src.layout().shape, vec![3, 31, 31]);
    assert_eq!(src.layout().record_bytes(), 3 * 31 * 31);
    assert_eq!(src.header().descr.to_string(), "uint8");
    assert_eq!(src.header().version, (1, 0));
    assert_eq!(src.header().data_offset % 64, 0);
}

#[test]
fn float32_rows() {
    let src = check(
        "f.npy",
        "arr = rng.random((N, 7), dtype=np.float32)\nnp.save(os.path.join(d, 'f.npy'), arr); emit(arr)",
    );
    assert_eq!(src.layout().record_bytes(), 28);
    assert_eq!(src.header().descr.descr, "'<f4'");
}

#[test]
fn structured_with_subarray_and_padding() {
    let src = check(
        "s.npy",
        "dt = np.dtype({'names': ['a', 'b'], 'formats': ['<f4', ('u1', (3,))], 'offsets': [0, 8], 'itemsize': 16})\n\
         arr = np.zeros(N, dt)\n\
         arr['a'] = rng.random(N)\n\
         arr['b'] = rng.integers(0, 256, size=(N, 3))\n\
         np.save(os.path.join(d, 's.npy'), arr); emit(arr)",
    );
    let dt = &src.header().descr;
    assert!(!dt.is_simple());
    assert_eq!(dt.itemsize, 16);
    assert_eq!(
        dt.descr,
        "[('a', '<f4'), ('', '|V4'), ('b', '|u1', (3,)), ('', '|V5')]"
    );
    assert!(src.layout().shape.is_empty());
}

/// numpy writes a field whose dtype is itself a sub-array as a nested pair: field `c` of
/// `[('c', ('<f8', (5,)), (2,))]` holds (2, 5) float64 values.
#[test]
fn nested_subarray_field() {
    let src = check(
        "n.npy",
        "dt = np.dtype([('c', ('<f8', (5,)), (2,))])\n\
         assert dt.descr == [('c', ('<f8', (5,)), (2,))], dt.descr\n\
         arr = np.zeros(N, dt)\n\
         arr['c'] = rng.random((N, 2, 5))\n\
         np.save(os.path.join(d, 'n.npy'), arr); emit(arr)",
    );
    let dt = &src.header().descr;
    assert_eq!(dt.itemsize, 2 * 5 * 8);
    assert_eq!(dt.descr, "[('c', ('<f8', (5,)), (2,))]");
    assert_eq!(src.layout().record_bytes(), 80);
}

#[test]
fn write_array_version_1() {
    let src = check(
        "v1.npy",
        "arr = rng.integers(-2**31, 2**31, size=(N, 5), dtype=np.int32)\n\
         with open(os.path.join(d, 'v1.npy'), 'wb') as f: np.lib.format.write_array(f, arr, version=(1, 0))\n\
         emit(arr)",
    );
    assert_eq!(src.header().version, (1, 0));
}

#[test]
fn write_array_version_2() {
    let src = check(
        "v2.npy",
        "arr = rng.random((N, 2, 3))\n\
         with open(os.path.join(d, 'v2.npy'), 'wb') as f: np.lib.format.write_array(f, arr, version=(2, 0))\n\
         emit(arr)",
    );
    assert_eq!(src.header().version, (2, 0));
    assert_eq!(src.header().descr.to_string(), "float64");
}

#[test]
fn write_array_version_3_with_unicode_field_name() {
    let src = check(
        "v3.npy",
        "dt = np.dtype([('é名', '<f4'), ('k', '<i2', (2,)), ('s', 'S3')])\n\
         arr = np.zeros(N, dt)\n\
         arr['é名'] = rng.random(N)\n\
         arr['k'] = rng.integers(-1000, 1000, size=(N, 2))\n\
         arr['s'] = [b'x%d' % (i % 100) for i in range(N)]\n\
         with open(os.path.join(d, 'v3.npy'), 'wb') as f: np.lib.format.write_array(f, arr, version=(3, 0))\n\
         emit(arr)",
    );
    assert_eq!(src.header().version, (3, 0));
    assert_eq!(src.header().descr.itemsize, 4 + 4 + 3);
    assert!(src.header().descr.descr.contains("'é名'"));
}

#[test]
fn npy_with_another_extension_is_found_by_magic() {
    let dir = tempfile::tempdir().unwrap();
    let idx = write_indices(dir.path(), N);
    let out = python(
        dir.path(),
        &format!(
            "N = {N}\narr = rng.integers(0, 2**16, size=(N, 4), dtype=np.uint16)\n\
             with open(os.path.join(d, 'data.bin'), 'wb') as f: np.save(f, arr)\nemit(arr)"
        ),
    );
    let u8_layout = pinfeed_source::Layout::new(pinfeed_source::DType::uint8(), vec![1]).unwrap();
    let src = open_path(dir.path().join("data.bin"), Some(u8_layout)).unwrap();
    assert_eq!(src.layout().record_bytes(), 8);
    check_against_numpy(src.as_ref(), N, &idx, crcs(&out));
}

/// `npy::header_bytes` must write what numpy writes, byte for byte.
#[test]
fn header_bytes_match_numpy() {
    let dir = tempfile::tempdir().unwrap();
    python(
        dir.path(),
        "np.save(os.path.join(d, 'h0.npy'), np.zeros((1000, 3, 31, 31), np.uint8))\n\
         np.save(os.path.join(d, 'h1.npy'), np.zeros((7,), '<f8'))\n\
         h = np.lib.format.header_data_from_array_1_0(np.zeros((1, 7), '<f4'))\n\
         h['shape'] = (12345678901234, 7)\n\
         with open(os.path.join(d, 'h2.npy'), 'wb') as f: np.lib.format.write_array_header_1_0(f, h)\n\
         dt = np.dtype({'names': ['a', 'b'], 'formats': ['<f4', ('u1', (3,))], 'offsets': [0, 8], 'itemsize': 16})\n\
         np.save(os.path.join(d, 'h3.npy'), np.zeros((9, 2), dt))\n\
         np.save(os.path.join(d, 'h4.npy'), np.zeros(3, [('é名', '<i4'), ('t', '<M8[ns]')]))\n\
         import warnings; warnings.simplefilter('ignore')\n\
         np.save(os.path.join(d, 'h5.npy'), np.zeros(2, [('f%d' % i, '<f4') for i in range(4000)]))",
    );
    for i in 0..6 {
        let path = dir.path().join(format!("h{i}.npy"));
        let bytes = std::fs::read(&path).unwrap();
        let header = npy::Header::parse(&bytes, &path).unwrap();
        let layout = header.layout().unwrap();
        let ours = npy::header_bytes(&layout, header.num_records());
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&bytes[..header.data_offset as usize]),
            "h{i}"
        );
        assert_eq!(ours, &bytes[..header.data_offset as usize], "h{i}");
    }
}
