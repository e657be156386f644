//! Raw record files written by `np.memmap`.

use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{open_path, Layout, RawFile, Source};

use crate::util::{check_against_numpy, crcs, python, write_indices};

#[test]
fn memmap_records_with_comma_dtype() {
    const N: u64 = 97;
    let dir = tempfile::tempdir().unwrap();
    let idx = write_indices(dir.path(), N);
    let out = python(
        dir.path(),
        &format!(
            "m = np.memmap(os.path.join(d, 'r.raw'), '3,31,31B', 'w+', shape=({N},))\n\
             m[:] = rng.integers(0, 256, size=({N}, 3, 31, 31), dtype=np.uint8)\n\
             m.flush()\n\
             arr = np.array(m)\n\
             assert arr.shape == ({N}, 3, 31, 31), arr.shape\n\
             emit(arr)"
        ),
    );
    let (dtype, shape) = parse_user_dtype("3,31,31B").unwrap();
    assert_eq!((dtype.itemsize, shape.as_slice()), (1, &[3u64, 31, 31][..]));
    let layout = Layout::new(dtype, shape).unwrap();
    let path = dir.path().join("r.raw");
    let src = RawFile::open(&path, layout.clone()).unwrap();
    assert_eq!(src.name(), path.display().to_string());
    check_against_numpy(&src, N, &idx, crcs(&out));
    let boxed = open_path(&path, Some(layout)).unwrap();
    check_against_numpy(boxed.as_ref(), N, &idx, crcs(&out));
}

#[test]
fn float_records_from_tofile() {
    const N: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let idx = write_indices(dir.path(), N);
    let out = python(
        dir.path(),
        &format!("arr = rng.random(({N}, 5), dtype=np.float32)\narr.tofile(os.path.join(d, 'f.raw'))\nemit(arr)"),
    );
    let (dtype, shape) = parse_user_dtype("f32").unwrap();
    assert!(shape.is_empty());
    let src = RawFile::open(
        dir.path().join("f.raw"),
        Layout::new(dtype, vec![5]).unwrap(),
    )
    .unwrap();
    check_against_numpy(&src, N, &idx, crcs(&out));
}
