//! Directories and glob patterns of `.npy` shards read as one dataset.

use pinfeed_source::{open_with, NpyFile, ReadOptions, Reader, ShardedSource, Source, SourceError};

use crate::util::{
    check_against_numpy, check_aligned_reads, crcs, direct_granted, disk_dir, python, write_indices,
};

/// Three shards of 2883-byte records (5, 1 and 7 records), in an order that only sorting by
/// name gets right, beside files that are not shards.
const SHARDS: &str = r#"
sizes = [5, 1, 7]
parts = [rng.integers(0, 256, size=(k, 3, 31, 31), dtype=np.uint8) for k in sizes]
for i, p in reversed(list(enumerate(parts))):
    np.save(os.path.join(d, 'shard-%03d.npy' % i), p)
open(os.path.join(d, 'README.txt'), 'w').write('not a shard')
np.save(os.path.join(d, '.hidden.npy'), np.zeros((2, 3), dtype=np.float64))
emit(np.concatenate(parts))
"#;

const N: u64 = 13;

fn reference(dir: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for i in 0..3 {
        let shard = NpyFile::open(dir.join(format!("shard-{i:03}.npy"))).unwrap();
        let mut bytes = vec![0u8; shard.num_records() as usize * 2883];
        shard.read_records(0, &mut bytes).unwrap();
        all.extend(bytes);
    }
    all
}

#[test]
fn a_directory_reads_as_one_dataset() {
    let dir = disk_dir();
    let idx = write_indices(dir.path(), N);
    let out = crcs(&python(dir.path(), SHARDS));
    let src = open_with(dir.path(), None, &ReadOptions::default()).unwrap();
    assert_eq!(src.name(), dir.path().display().to_string());
    assert!(src.file().is_none());
    assert_eq!(src.reader_description(), "pread");
    // Every chunking spans two or three shards somewhere; gathers cross them at random.
    check_against_numpy(src.as_ref(), N, &idx, out);
    check_aligned_reads(src.as_ref(), &reference(dir.path()));

    let sharded = ShardedSource::open(dir.path(), None, &ReadOptions::default()).unwrap();
    let names: Vec<&str> = sharded.shards().iter().map(|s| s.name()).collect();
    assert!(names[0].ends_with("shard-000.npy") && names[2].ends_with("shard-002.npy"));
    assert_eq!(sharded.locate(5), (1, 0));
    assert_eq!(sharded.locate(12), (2, 6));
}

#[test]
fn a_pattern_reads_as_one_dataset_through_o_direct() {
    let dir = disk_dir();
    let idx = write_indices(dir.path(), N);
    let out = crcs(&python(dir.path(), SHARDS));
    let pattern = dir.path().join("shard-*.npy");
    for mode in [Reader::Direct, Reader::Uring] {
        let options = ReadOptions {
            reader: mode,
            read_size: 4096,
            ..ReadOptions::default()
        };
        let src = open_with(&pattern, None, &options).unwrap();
        assert_eq!(src.name(), pattern.display().to_string());
        if mode == Reader::Direct {
            direct_granted(src.as_ref());
        }
        check_against_numpy(src.as_ref(), N, &idx, out);
        check_aligned_reads(src.as_ref(), &reference(dir.path()));
    }
    // A pattern of one file keeps its file region.
    let one = open_with(
        dir.path().join("shard-00[1].npy"),
        None,
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(one.num_records(), 1);
    assert!(one.file().is_some());
}

/// The mapped gather across shards: each shard copies its records of a gather out of its own
/// mapping, in one call, into the places the batch gives them; the same bytes as numpy's.
#[test]
fn a_directory_gathers_through_mappings() {
    let dir = disk_dir();
    let idx = write_indices(dir.path(), N);
    let out = crcs(&python(dir.path(), SHARDS));
    let options = ReadOptions {
        reader: Reader::Mmap,
        ..ReadOptions::default()
    };
    let src = open_with(dir.path(), None, &options).unwrap();
    check_against_numpy(src.as_ref(), N, &idx, out);
    // Made and used, not refused.
    assert_eq!(src.reader_description(), "mmap gather, pread ranges");
    let all = reference(dir.path());
    let rb = 2883;
    // gather_at: records to chosen places, the others left alone; places must increase.
    let mut dst = vec![0xEEu8; 5 * rb];
    src.gather_at(&[(12, 0), (4, 1), (5, 3), (0, 4)], &mut dst)
        .unwrap();
    for (place, record) in [(0, 12), (1, 4), (3, 5), (4, 0)] {
        assert!(dst[place * rb..(place + 1) * rb] == all[record * rb..(record + 1) * rb]);
    }
    assert!(dst[2 * rb..3 * rb].iter().all(|&b| b == 0xEE));
    for bad in [&[(1, 2), (2, 1)][..], &[(1, 1), (2, 1)], &[(0, 5)]] {
        assert!(
            matches!(
                src.gather_at(bad, &mut dst),
                Err(SourceError::Destination { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        src.gather_at(&[(N, 0)], &mut dst),
        Err(SourceError::OutOfRange { .. })
    ));
}

#[test]
fn a_shard_of_another_layout_is_named_with_both_layouts() {
    let dir = disk_dir();
    python(
        dir.path(),
        "np.save(os.path.join(d, 'a.npy'), np.zeros((4, 3, 31, 31), dtype=np.uint8))\n\
         np.save(os.path.join(d, 'b.npy'), np.zeros((4, 3, 31, 31), dtype=np.uint8))\n\
         np.save(os.path.join(d, 'c.npy'), np.zeros((4, 3, 32, 31), dtype=np.uint8))",
    );
    let e = open_with(dir.path(), None, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, SourceError::ShardLayout { .. }), "{e:?}");
    let msg = e.to_string();
    for part in [
        "a.npy",
        "c.npy",
        "record shape [3, 31, 31]",
        "record shape [3, 32, 31]",
        "uint8",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
}

#[test]
fn empty_directories_and_patterns_are_errors() {
    let dir = disk_dir();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    let e = open_with(dir.path(), None, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, SourceError::NoShards { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("no .npy, .safetensors, .pftxt, .parquet, .arrow or .jsonl files"),
        "{e}"
    );
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
    let e = open_with(dir.path().join("*.npy"), None, &ReadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no file matches"), "{e}");
    let e = open_with(dir.path().join("*/x.npy"), None, &ReadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("file name only"), "{e}");
    // A shard that fails to open is named.
    std::fs::write(dir.path().join("bad.npy"), b"\x93NUMPY\x09\x00").unwrap();
    let e = open_with(dir.path(), None, &ReadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("bad.npy"), "{e}");
}

/// A shard directory holding an entry named like a shard that is not one: streaming the other
/// shards alone would drop its records, so the directory is refused, naming the entry.
#[test]
fn an_entry_named_like_a_shard_that_is_not_a_file_is_refused_by_name() {
    type Plant = fn(&std::path::Path, &std::path::Path);
    let cases: [(&str, Plant, &str); 4] = [
        (
            "broken.npy",
            |_, p| std::os::unix::fs::symlink("missing.npy", p).unwrap(),
            "broken.npy",
        ),
        (
            "loop.npy",
            |_, p| std::os::unix::fs::symlink(p, p).unwrap(),
            "loop.npy",
        ),
        ("fifo.npy", |_, p| mkfifo(p), "not a regular file"),
        (
            "sub.npy",
            |_, p| std::fs::create_dir(p).unwrap(),
            "a directory named like a shard",
        ),
    ];
    for (name, plant, says) in cases {
        let dir = disk_dir();
        std::fs::write(dir.path().join("good.npy"), npy_of_ones()).unwrap();
        let entry = dir.path().join(name);
        plant(dir.path(), &entry);
        let e = open_with(dir.path(), None, &ReadOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains(says), "{name}: {msg}");
        assert!(!msg.contains('\n'), "{name}: one line: {msg}");
    }
}

fn mkfifo(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A `.npy` of four uint8 records of three bytes, written by hand (version 1.0 header).
fn npy_of_ones() -> Vec<u8> {
    let mut header = "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3), }".to_string();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend([1u8; 12]);
    out
}
