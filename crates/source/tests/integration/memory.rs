//! Streaming a file several times larger than a memory bound through `read_records_aligned`
//! with `O_DIRECT` keeps the resident set within the bound: nothing buffers the file.
//!
//! The streaming runs in a child process (this test binary, filtered to `stream_child`) so that
//! tests running beside it cannot move the resident set it measures.

use std::io::Write;
use std::process::Command;

use pinfeed_source::{open_with, AlignedBuffer, DType, Layout, ReadOptions, Reader};

use crate::util::disk_dir;

const FILE_BYTES: usize = 512 << 20;
/// Growth of the resident set allowed over its value before streaming: 1/8 of the file.
const BOUND: usize = 64 << 20;
const RECORD: usize = 2883;
/// Records per read: about 11.5 MiB, the batch of the README's example.
const BATCH: usize = 4096;

/// `VmRSS` of this process, in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

#[test]
fn o_direct_streaming_stays_bounded() {
    let dir = disk_dir();
    let path = dir.path().join("big.bin");
    // Whole records, and a size that is not a multiple of the block size.
    let records = FILE_BYTES / RECORD;
    let total = records * RECORD;
    let mut block = vec![0u8; 4 << 20];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for chunk in block.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut hasher = crc32fast::Hasher::new();
    let mut written = 0;
    for i in 0u64.. {
        if written == total {
            break;
        }
        // Every block differs, so a read from the wrong place cannot match.
        block[..8].copy_from_slice(&i.to_le_bytes());
        let n = block.len().min(total - written);
        out.write_all(&block[..n]).unwrap();
        hasher.update(&block[..n]);
        written += n;
    }
    out.into_inner().unwrap().sync_all().unwrap();
    drop(block);

    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "memory::stream_child",
            "--exact",
            "--include-ignored",
            "--nocapture",
        ])
        .env("PINFEED_STREAM_FILE", &path)
        .env("PINFEED_STREAM_CRC", hasher.finalize().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("streamed"),
        "the child did not stream:\n{stdout}\n{stderr}"
    );
    eprintln!(
        "{}",
        stderr.lines().find(|l| l.contains("streamed")).unwrap()
    );
}

#[test]
#[ignore = "run by o_direct_streaming_stays_bounded in a process of its own"]
fn stream_child() {
    let (Ok(path), Ok(crc)) = (
        std::env::var("PINFEED_STREAM_FILE"),
        std::env::var("PINFEED_STREAM_CRC"),
    ) else {
        return;
    };
    let start = rss();
    let layout = Layout::new(DType::uint8(), vec![RECORD as u64]).unwrap();
    let options = ReadOptions {
        reader: Reader::Direct,
        ..ReadOptions::default()
    };
    let src = open_with(&path, Some(layout), &options).unwrap();
    let n = src.num_records() as usize;
    let mut buf = AlignedBuffer::new(src.aligned_span(BATCH), src.alignment().max(4096));
    let mut hasher = crc32fast::Hasher::new();
    let mut peak = start;
    let mut first = 0;
    while first < n {
        let count = BATCH.min(n - first);
        let off = src
            .read_records_aligned(first as u64, count, &mut buf)
            .unwrap();
        hasher.update(&buf[off..off + count * RECORD]);
        first += count;
        peak = peak.max(rss());
    }
    assert_eq!(
        hasher.finalize().to_string(),
        crc,
        "{}",
        src.reader_description()
    );
    let grew = peak.saturating_sub(start);
    eprintln!(
        "streamed {} MiB with {}: resident set grew by {} KiB (bound {} KiB)",
        (n * RECORD) >> 20,
        src.reader_description(),
        grew >> 10,
        BOUND >> 10
    );
    assert!(
        grew < BOUND,
        "resident set grew by {grew} bytes, bound {BOUND}"
    );
}
