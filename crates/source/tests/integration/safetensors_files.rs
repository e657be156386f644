//! `.safetensors` files written by the `safetensors` Python library (`pip install
//! safetensors`), one tensor read as records, alone and as shards.

use pinfeed_source::{open_with, FormatOptions, ReadOptions, Reader, SafetensorsFile, SourceError};

use crate::util::{
    check_against_numpy, check_aligned_reads, crcs, direct_granted, disk_dir, python, write_indices,
};

const N: u64 = 50;

/// Fails, never skips, without the library: its files are the point of these tests.
fn python_st(dir: &std::path::Path, body: &str) -> String {
    python(
        dir,
        &format!(
            "try:\n    from safetensors.numpy import save_file\n\
             except ImportError:\n    raise SystemExit('the safetensors package is missing: pip install safetensors')\n\
             N = {N}\n{body}"
        ),
    )
}

fn options(tensor: Option<&str>, mode: Reader) -> ReadOptions {
    ReadOptions {
        reader: mode,
        format: tensor
            .map(|t| FormatOptions::new().with("tensor", t))
            .unwrap_or_default(),
        ..ReadOptions::default()
    }
}

#[test]
fn each_tensor_matches_numpy() {
    let dir = disk_dir();
    let idx = write_indices(dir.path(), N);
    let cases = [
        (
            "images",
            "rng.integers(0, 256, size=(N, 3, 31, 31), dtype=np.uint8)",
            vec![3, 31, 31],
            "uint8",
        ),
        (
            "labels",
            "rng.integers(-9, 9, size=(N,), dtype=np.int64)",
            vec![],
            "int64",
        ),
        (
            "emb",
            "rng.standard_normal((N, 7)).astype(np.float16)",
            vec![7],
            "float16",
        ),
        (
            "mask",
            "rng.integers(0, 2, size=(N, 5), dtype=np.uint8).astype(bool)",
            vec![5],
            "bool",
        ),
    ];
    let mut script = String::from("t = {}\n");
    for (name, expr, _, _) in &cases {
        script.push_str(&format!("t['{name}'] = {expr}\n"));
    }
    script
        .push_str("save_file(t, os.path.join(d, 'many.safetensors'), metadata={'kind': 'test'})\n");
    for (name, ..) in &cases {
        script.push_str(&format!("emit(t['{name}'])\n"));
    }
    let out = python_st(dir.path(), &script);
    let lines: Vec<&str> = out.lines().collect();
    let path = dir.path().join("many.safetensors");
    for (i, (name, _, shape, dtype)) in cases.iter().enumerate() {
        for mode in [Reader::Pread, Reader::Direct, Reader::Uring] {
            let src = open_with(&path, None, &options(Some(name), mode)).unwrap();
            assert_eq!(&src.layout().shape, shape, "{name}");
            assert_eq!(src.layout().dtype.to_string(), *dtype, "{name}");
            // The data offset is 8 + header length + begin: not aligned to anything.
            assert!(src.file().unwrap().data_offset > 8);
            if mode == Reader::Direct {
                direct_granted(src.as_ref());
            }
            check_against_numpy(src.as_ref(), N, &idx, crcs(lines[i]));
            let mut all = vec![0u8; N as usize * src.layout().record_bytes()];
            src.read_records(0, &mut all).unwrap();
            check_aligned_reads(src.as_ref(), &all);
        }
    }
    let st = SafetensorsFile::open(&path, &options(Some("emb"), Reader::Pread)).unwrap();
    assert_eq!((st.tensor(), st.safetensors_dtype()), ("emb", "F16"));
}

#[test]
fn missing_and_ambiguous_tensors_name_the_available_ones() {
    let dir = disk_dir();
    python_st(
        dir.path(),
        "save_file({'x': np.zeros((N, 2), np.float32), 'y': np.zeros((N,), np.int32)}, os.path.join(d, 'two.safetensors'))\n\
         save_file({'only': np.arange(N * 3, dtype=np.uint16).reshape(N, 3)}, os.path.join(d, 'one.safetensors'))",
    );
    let two = dir.path().join("two.safetensors");
    let e = open_with(&two, None, &options(Some("z"), Reader::Pread)).unwrap_err();
    assert!(matches!(e, SourceError::Tensor { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("no tensor named \"z\"")
            && msg.contains("\"x\", \"y\"")
            && msg.contains("two.safetensors"),
        "{msg}"
    );
    let msg = open_with(&two, None, &options(None, Reader::Pread))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("several tensors") && msg.contains("\"x\", \"y\""),
        "{msg}"
    );
    // The only tensor needs no name.
    let one = open_with(
        dir.path().join("one.safetensors"),
        None,
        &ReadOptions::default(),
    )
    .unwrap();
    let mut rec = [0u8; 6];
    one.read_records(N - 1, &mut rec).unwrap();
    assert_eq!(u16::from_le_bytes([rec[4], rec[5]]), (N * 3 - 1) as u16);
    // A tensor name for a file that is not safetensors is refused.
    python(
        dir.path(),
        "np.save(os.path.join(d, 'a.npy'), np.zeros((3, 2)))",
    );
    let e = open_with(
        dir.path().join("a.npy"),
        None,
        &options(Some("x"), Reader::Pread),
    )
    .unwrap_err();
    assert!(matches!(e, SourceError::Options { .. }), "{e:?}");
}

#[test]
fn truncated_files_and_wrong_offsets() {
    let dir = disk_dir();
    python_st(
        dir.path(),
        "save_file({'x': np.arange(N * 4, dtype=np.float32).reshape(N, 4)}, os.path.join(d, 'x.safetensors'))",
    );
    let path = dir.path().join("x.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let e = open_with(&path, None, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, SourceError::DataSize { .. }), "{e:?}");
    assert!(
        e.to_string().contains("truncated") && e.to_string().contains("x.safetensors"),
        "{e}"
    );
    // Offsets that disagree with the shape, same header length.
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let wrong = text.replacen(
        &format!("[0,{}]", N * 16),
        &format!("[0,{}]", N * 16 - 16),
        1,
    );
    assert_ne!(wrong, text, "the header holds data_offsets [0,{}]", N * 16);
    std::fs::write(&path, wrong.as_bytes()).unwrap();
    let e = open_with(&path, None, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, SourceError::Safetensors { .. }), "{e:?}");
    assert!(e.to_string().contains("data_offsets"), "{e}");
}

#[test]
fn safetensors_shards_of_one_tensor() {
    let dir = disk_dir();
    let idx = write_indices(dir.path(), N);
    let out = python_st(
        dir.path(),
        "parts = np.array_split(rng.standard_normal((N, 5, 3)).astype(np.float32), [17, 18])\n\
         for i, p in enumerate(parts):\n    save_file({'feat': p, 'id': np.arange(len(p))}, os.path.join(d, 'part-%d.safetensors' % i))\n\
         emit(np.concatenate(parts))",
    );
    for mode in [Reader::Pread, Reader::Direct] {
        let src = open_with(dir.path(), None, &options(Some("feat"), mode)).unwrap();
        assert_eq!(src.layout().record_bytes(), 60);
        check_against_numpy(src.as_ref(), N, &idx, crcs(&out));
        let mut all = vec![0u8; N as usize * 60];
        src.read_records(0, &mut all).unwrap();
        check_aligned_reads(src.as_ref(), &all);
    }
    let pattern = dir.path().join("part-*.safetensors");
    let src = open_with(&pattern, None, &options(Some("feat"), Reader::Pread)).unwrap();
    check_against_numpy(src.as_ref(), N, &idx, crcs(&out));
    // Without a name, each shard holds two tensors: the error names the first shard.
    let e = open_with(&pattern, None, &ReadOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("part-0.safetensors") && e.to_string().contains("\"feat\", \"id\""),
        "{e}"
    );
}
