//! `O_DIRECT` reads: aligned spans trimmed to records that straddle blocks, after headers of
//! every `.npy` version, in files whose size is not a multiple of the block size.

use std::fs::OpenOptions;

use pinfeed_source::{open_with, AlignedBuffer, NpyFile, ReadOptions, Reader, Source, SourceError};

use crate::util::{check_aligned_reads, crcs, direct_granted, disk_dir, python};

/// 37 records of 2883 bytes: 106 671 bytes, not a multiple of 4096, every record but a few
/// straddling a block boundary.
const N: u64 = 37;

/// The same records as `.npy` files with headers of versions 1.0 (short and 2 KiB long), 2.0
/// (19 KiB) and 3.0 (UTF-8 field names), and as a raw file.
const FIXTURES: &str = r#"
N = 37
base = rng.integers(0, 256, size=(N, 3, 31, 31), dtype=np.uint8)
flat = base.reshape(N, -1)
np.save(os.path.join(d, 'v1.npy'), base)
def save(name, dt, version):
    with open(os.path.join(d, name), 'wb') as f:
        np.lib.format.write_array(f, flat.view(dt).reshape(N), version=version)
save('v1_long.npy', np.dtype([('field_%d' % i, 'u1', (31,)) for i in range(93)]), (1, 0))
save('v2.npy', np.dtype([('field_%04d' % i, 'u1', (3,)) for i in range(961)]), (2, 0))
save('v3.npy', np.dtype([('\u00e9\u540d_%d' % i, 'u1', (31,)) for i in range(93)]), (3, 0))
base.tofile(os.path.join(d, 'raw.bin'))
emit(base)
"#;

fn options(mode: Reader) -> ReadOptions {
    ReadOptions {
        reader: mode,
        ..ReadOptions::default()
    }
}

#[test]
fn every_first_and_count_matches_buffered_reads() {
    let dir = disk_dir();
    let (crc, _) = crcs(&python(dir.path(), FIXTURES));
    let reference = std::fs::read(dir.path().join("raw.bin")).unwrap();
    assert_eq!(crc32fast::hash(&reference), crc);
    assert!(reference.len() % 4096 != 0);

    let versions = [
        ("v1.npy", (1, 0)),
        ("v1_long.npy", (1, 0)),
        ("v2.npy", (2, 0)),
        ("v3.npy", (3, 0)),
    ];
    let mut offsets = Vec::new();
    for (file, version) in versions {
        let path = dir.path().join(file);
        let header = NpyFile::open(&path).unwrap().header().clone();
        assert_eq!(header.version, version, "{file}");
        offsets.push(header.data_offset);
        for mode in [Reader::Direct, Reader::Pread] {
            let src = open_with(&path, None, &options(mode)).unwrap();
            assert_eq!(src.num_records(), N);
            assert_eq!(src.layout().record_bytes(), 2883);
            if mode == Reader::Direct {
                direct_granted(src.as_ref());
            } else {
                assert_eq!(
                    (src.reader_description().as_str(), src.alignment()),
                    ("pread", 1)
                );
            }
            check_aligned_reads(src.as_ref(), &reference);
            // The unaligned API still works on a direct source.
            let mut all = vec![0u8; reference.len()];
            src.read_records(0, &mut all).unwrap();
            assert!(all == reference);
        }
    }
    // The headers really do end at different, unaligned places.
    assert!(offsets.iter().all(|o| o % 4096 != 0), "{offsets:?}");
    assert!(offsets.iter().any(|&o| o > 4096), "{offsets:?}");

    let layout = NpyFile::open(dir.path().join("v1.npy"))
        .unwrap()
        .layout()
        .clone();
    let raw = open_with(
        dir.path().join("raw.bin"),
        Some(layout),
        &options(Reader::Direct),
    )
    .unwrap();
    direct_granted(raw.as_ref());
    check_aligned_reads(raw.as_ref(), &reference);
}

#[test]
fn direct_read_of_a_shrunk_file_is_truncated() {
    let dir = disk_dir();
    python(dir.path(), FIXTURES);
    let path = dir.path().join("v2.npy");
    for mode in [Reader::Direct, Reader::Uring] {
        std::fs::copy(&path, dir.path().join("s.npy")).unwrap();
        let shrunk = dir.path().join("s.npy");
        let src = open_with(&shrunk, None, &options(mode)).unwrap();
        let data_offset = src.file().unwrap().data_offset;
        // Cut in the middle of record 30.
        OpenOptions::new()
            .write(true)
            .open(&shrunk)
            .unwrap()
            .set_len(data_offset + 30 * 2883 + 100)
            .unwrap();
        let mut buf = AlignedBuffer::new(src.aligned_span(N as usize), src.alignment());
        let off = src.read_records_aligned(0, 30, &mut buf).unwrap();
        assert_eq!(off as u64, data_offset % src.alignment() as u64);
        for (first, count) in [(25u64, 6usize), (30, 1), (36, 1), (0, 37)] {
            match src.read_records_aligned(first, count, &mut buf) {
                Err(SourceError::Truncated { path, .. }) => assert_eq!(path, shrunk),
                other => panic!("{mode}: {first}+{count}: {other:?}"),
            }
        }
    }
}

#[test]
fn tmpfs_falls_back_and_says_so() {
    // /dev/shm is a tmpfs where there is one; older kernels refuse O_DIRECT there, newer ones
    // accept it. Either way the bytes must be right and the description must say which.
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    python(
        dir.path(),
        "np.save(os.path.join(d, 'a.npy'), np.arange(5000, dtype='<u2').reshape(1000, 5))",
    );
    let src = open_with(dir.path().join("a.npy"), None, &options(Reader::Direct)).unwrap();
    let granted = direct_granted(src.as_ref());
    eprintln!("tmpfs: {} (granted: {granted})", src.reader_description());
    let reference: Vec<u8> = (0u16..5000).flat_map(|v| v.to_le_bytes()).collect();
    let mut buf = AlignedBuffer::new(src.aligned_span(1000), src.alignment());
    let off = src.read_records_aligned(0, 1000, &mut buf).unwrap();
    assert!(buf[off..off + 10_000] == reference[..]);
}
