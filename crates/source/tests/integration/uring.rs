//! io_uring reads deliver the same bytes as `pread` for every read size and queue depth, from
//! one thread and from several; where io_uring is refused the fallback says so.

use std::path::Path;

use pinfeed_source::{open_with, AlignedBuffer, DType, Layout, ReadOptions, Reader, Source};

use crate::util::{check_aligned_reads, disk_dir};

/// Records of 2883 bytes, so batches never line up with pieces or blocks.
const RECORD: usize = 2883;
const N: usize = 1001;

fn layout() -> Layout {
    Layout::new(DType::uint8(), vec![3, 31, 31]).unwrap()
}

/// A raw file of N pseudo-random records; returns its bytes.
fn write_fixture(path: &Path) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let bytes: Vec<u8> = (0..N * RECORD)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(path, &bytes).unwrap();
    bytes
}

/// Whether io_uring was granted; when it was not, the description must say why.
fn uring_granted(src: &dyn Source, depth: u32) -> bool {
    let d = src.reader_description();
    if d.contains("io_uring refused") {
        eprintln!("{d}: comparing the fallback's bytes");
        assert!(
            d.starts_with("pread (io_uring refused: ")
                || d.starts_with("O_DIRECT (io_uring refused: "),
            "{d}"
        );
        false
    } else {
        assert!(d.starts_with(&format!("io_uring (depth {depth}")), "{d}");
        true
    }
}

/// CRC of every record, read in batches of `batch` records with `read_records` and with
/// `read_records_aligned`.
fn crcs_in_batches(src: &dyn Source, batch: usize) -> (u32, u32) {
    let mut plain = crc32fast::Hasher::new();
    let mut aligned = crc32fast::Hasher::new();
    let mut dst = vec![0u8; batch * RECORD];
    let mut buf = AlignedBuffer::new(src.aligned_span(batch), src.alignment());
    let mut first = 0;
    while first < N {
        let count = batch.min(N - first);
        src.read_records(first as u64, &mut dst[..count * RECORD])
            .unwrap();
        plain.update(&dst[..count * RECORD]);
        let off = src
            .read_records_aligned(first as u64, count, &mut buf)
            .unwrap();
        aligned.update(&buf[off..off + count * RECORD]);
        first += count;
    }
    (plain.finalize(), aligned.finalize())
}

#[test]
fn same_bytes_as_pread_for_every_read_size_and_depth() {
    let dir = disk_dir();
    let path = dir.path().join("records.bin");
    let want = crc32fast::hash(&write_fixture(&path));
    let pread = open_with(&path, Some(layout()), &ReadOptions::default()).unwrap();
    assert_eq!(crcs_in_batches(pread.as_ref(), 700), (want, want));
    for read_size in [4096, 3000, 64 << 10, 1 << 20] {
        for depth in [1, 4, 32] {
            let options = ReadOptions {
                reader: Reader::Uring,
                read_size,
                queue_depth: depth,
                format: Default::default(),
            };
            let src = open_with(&path, Some(layout()), &options).unwrap();
            uring_granted(src.as_ref(), depth);
            for batch in [7, 333, N] {
                assert_eq!(
                    crcs_in_batches(src.as_ref(), batch),
                    (want, want),
                    "read size {read_size}, depth {depth}, batches of {batch}: {}",
                    src.reader_description()
                );
            }
        }
    }
}

#[test]
fn every_first_and_count_through_the_ring() {
    let dir = disk_dir();
    let path = dir.path().join("small.bin");
    let bytes = write_fixture(&path);
    let reference = &bytes[..40 * RECORD];
    std::fs::write(&path, reference).unwrap();
    // Pieces of one block, so every read of more than one block goes through the ring.
    let options = ReadOptions {
        reader: Reader::Uring,
        read_size: 4096,
        queue_depth: 3,
        format: Default::default(),
    };
    let src = open_with(&path, Some(layout()), &options).unwrap();
    uring_granted(src.as_ref(), 3);
    check_aligned_reads(src.as_ref(), reference);
}

#[test]
fn several_threads_share_one_source() {
    let dir = disk_dir();
    let path = dir.path().join("records.bin");
    let bytes = write_fixture(&path);
    let options = ReadOptions {
        reader: Reader::Uring,
        read_size: 16 << 10,
        queue_depth: 8,
        format: Default::default(),
    };
    let src = open_with(&path, Some(layout()), &options).unwrap();
    uring_granted(src.as_ref(), 8);
    let batch = 97;
    std::thread::scope(|s| {
        for t in 0..4 {
            let (src, bytes) = (&src, &bytes);
            s.spawn(move || {
                let mut buf = AlignedBuffer::new(src.aligned_span(batch), src.alignment());
                let mut dst = vec![0u8; batch * RECORD];
                // Thread t reads every fourth batch, twice over.
                for _ in 0..2 {
                    for first in (t * batch..N).step_by(4 * batch) {
                        let count = batch.min(N - first);
                        let want = &bytes[first * RECORD..(first + count) * RECORD];
                        let off = src
                            .read_records_aligned(first as u64, count, &mut buf)
                            .unwrap();
                        assert!(
                            &buf[off..off + count * RECORD] == want,
                            "thread {t} at {first}"
                        );
                        src.read_records(first as u64, &mut dst[..count * RECORD])
                            .unwrap();
                        assert!(&dst[..count * RECORD] == want, "thread {t} at {first}");
                    }
                }
            });
        }
    });
}

/// A shuffled gather through io_uring (many small reads in flight) equals the buffered one, for
/// permutations, repeats and runs of consecutive records, and out-of-range indices are refused.
#[test]
fn gathers_through_the_ring_equal_pread() {
    let dir = disk_dir();
    let path = dir.path().join("gather.bin");
    let data = write_fixture(&path);
    let record = layout().record_bytes();
    let n = (data.len() / record) as u64;
    let buffered = open_with(&path, Some(layout()), &ReadOptions::default()).unwrap();
    for depth in [1, 8, 64] {
        let uring = open_with(
            &path,
            Some(layout()),
            &ReadOptions {
                reader: Reader::Uring,
                queue_depth: depth,
                ..ReadOptions::default()
            },
        )
        .unwrap();
        let mut state = 0x9E3779B97F4A7C15u64;
        let mut indices: Vec<u64> = (0..n).collect();
        for i in (1..indices.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            indices.swap(i, (state % (i as u64 + 1)) as usize);
        }
        indices.extend([3, 4, 5, 6, 0, 0, n - 1]);
        let mut a = vec![0u8; indices.len() * record];
        let mut b = vec![1u8; indices.len() * record];
        buffered.gather(&indices, &mut a).unwrap();
        uring.gather(&indices, &mut b).unwrap();
        assert_eq!(a, b, "depth {depth} ({})", uring.reader_description());
        for (k, &i) in indices.iter().enumerate() {
            assert_eq!(
                a[k * record..(k + 1) * record],
                data[i as usize * record..(i as usize + 1) * record]
            );
        }
        let mut one = vec![0u8; record];
        assert!(
            uring.gather(&[n], &mut one).is_err(),
            "an index past the end was read"
        );
    }
}
