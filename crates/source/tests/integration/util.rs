//! Running numpy to make fixtures, and checking a source against numpy's bytes.

use std::path::Path;
use std::process::Command;

use pinfeed_source::{Source, SourceError};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Defines `d` (the fixture directory), `idx` (indices from `idx.txt`), `rng`, and `emit(arr)`,
/// which prints the CRC-32 of `arr.tobytes()` and of `arr[idx].tobytes()`.
const PRELUDE: &str = r#"
import sys, os, zlib
import numpy as np
d = sys.argv[1]
_p = os.path.join(d, 'idx.txt')
idx = np.array([int(x) for x in open(_p).read().split()], dtype=np.int64) if os.path.exists(_p) else None
rng = np.random.default_rng(1234)
def emit(arr):
    print(zlib.crc32(arr.tobytes()), zlib.crc32(arr[idx].tobytes()) if idx is not None else 0)
"#;

/// Runs `script` (after [`PRELUDE`]) with the fixture directory as `sys.argv[1]` and returns
/// its standard output. Fails, never skips, when python3 or numpy is missing.
pub fn python(dir: &Path, script: &str) -> String {
    let full = format!("{PRELUDE}\n{script}");
    let out = Command::new("python3").arg("-c").arg(&full).arg(dir).output().unwrap_or_else(|e| {
        panic!("cannot run python3 ({e}); these tests make their fixtures with numpy: install python3 and `pip install numpy`")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let hint = if stderr.contains("No module named 'numpy'") {
            "numpy is missing: pip install numpy\n"
        } else {
            ""
        };
        panic!(
            "{hint}python3 failed ({}):\n{stderr}\nscript:\n{script}",
            out.status
        );
    }
    String::from_utf8(out.stdout).expect("python printed UTF-8")
}

/// The gather order used everywhere: a random permutation, then runs and repeats.
pub fn indices(n: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.shuffle(&mut rand::rngs::StdRng::seed_from_u64(n));
    v.extend([0, 1, 2, 3, n - 1, 5, 5, 5, n - 2, n - 1, 0]);
    v
}

/// Writes `indices(n)` where the prelude reads them.
pub fn write_indices(dir: &Path, n: u64) -> Vec<u64> {
    let idx = indices(n);
    let text: Vec<String> = idx.iter().map(u64::to_string).collect();
    std::fs::write(dir.join("idx.txt"), text.join(" ")).unwrap();
    idx
}

/// Parses the two CRCs printed by `emit`.
pub fn crcs(stdout: &str) -> (u32, u32) {
    let v: Vec<u32> = stdout
        .split_whitespace()
        .map(|s| s.parse().expect("a CRC"))
        .collect();
    assert_eq!(v.len(), 2, "python printed {stdout:?}");
    (v[0], v[1])
}

/// Reads all of `src` in chunks of sizes that do and do not divide N, and gathers `idx` in one
/// call and in batches, comparing CRC-32s with numpy's.
pub fn check_against_numpy(src: &dyn Source, n: u64, idx: &[u64], (crc_all, crc_idx): (u32, u32)) {
    assert_eq!(src.num_records(), n);
    let rb = src.layout().record_bytes();
    for chunk in [1u64, 7, 8, 13, 30, n, n + 5] {
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; chunk as usize * rb];
        let mut first = 0;
        while first < n {
            let count = chunk.min(n - first);
            let dst = &mut buf[..count as usize * rb];
            dst.fill(0xAB);
            src.read_records(first, dst)
                .unwrap_or_else(|e| panic!("chunk {chunk} at {first}: {e}"));
            hasher.update(dst);
            first += count;
        }
        assert_eq!(
            hasher.finalize(),
            crc_all,
            "{}: sequential read in chunks of {chunk}",
            src.name()
        );
    }
    let mut all = vec![0u8; idx.len() * rb];
    src.gather(idx, &mut all).unwrap();
    assert_eq!(
        crc32fast::hash(&all),
        crc_idx,
        "{}: gather in one call",
        src.name()
    );
    let mut hasher = crc32fast::Hasher::new();
    for batch in idx.chunks(16) {
        let mut dst = vec![0u8; batch.len() * rb];
        src.gather(batch, &mut dst).unwrap();
        hasher.update(&dst);
    }
    assert_eq!(
        hasher.finalize(),
        crc_idx,
        "{}: gather in batches of 16",
        src.name()
    );
}

/// Asserts that an error message names the path.
pub fn names_path(err: &SourceError, path: &Path) {
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message does not name {}: {msg}",
        path.display()
    );
}

/// A temporary directory on the target directory's disk: `/tmp` may be a tmpfs, which refuses
/// `O_DIRECT`.
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Whether `O_DIRECT` was granted; when it was not, the description must say why.
pub fn direct_granted(src: &dyn Source) -> bool {
    let d = src.reader_description();
    if d.contains("O_DIRECT refused") {
        eprintln!("{}: {d}; comparing the fallback's bytes", src.name());
        assert_eq!(src.alignment(), 1, "{d}");
        false
    } else {
        assert!(d.contains("O_DIRECT"), "{}: {d}", src.name());
        assert!(src.alignment() >= 4096, "{d}");
        assert!(src.alignment().is_power_of_two(), "{d}");
        true
    }
}

/// Reads every `first`/`count` combination with `read_records_aligned` into one aligned buffer
/// and compares the records with `reference` (all records back to back); checks the errors for
/// buffers that are misaligned or short.
pub fn check_aligned_reads(src: &dyn Source, reference: &[u8]) {
    let n = src.num_records() as usize;
    let rb = src.layout().record_bytes();
    assert_eq!(reference.len(), n * rb);
    let align = src.alignment();
    let mut buf = pinfeed_source::AlignedBuffer::new(src.aligned_span(n) + align, align.max(64));
    for first in 0..n {
        for count in 0..=n - first {
            let span = src.aligned_span(count);
            assert!(span >= count * rb);
            let dst = &mut buf[..span];
            dst.fill(0xAB);
            let off = src
                .read_records_aligned(first as u64, count, dst)
                .unwrap_or_else(|e| panic!("first {first} count {count}: {e}"));
            assert!(
                off + count * rb <= span,
                "first {first} count {count}: offset {off}"
            );
            assert!(
                dst[off..off + count * rb] == reference[first * rb..(first + count) * rb],
                "{}: records {first}..+{count} differ (offset {off}, {})",
                src.name(),
                src.reader_description()
            );
        }
    }
    // One byte short, and (for aligned sources) one byte off the alignment.
    let span = src.aligned_span(3);
    assert!(matches!(
        src.read_records_aligned(1, 3, &mut buf[..span - 1]),
        Err(SourceError::Destination { .. })
    ));
    if align > 1 {
        let e = src
            .read_records_aligned(1, 3, &mut buf[1..span + 1])
            .unwrap_err();
        assert!(e.to_string().contains("aligned to"), "{e}");
    }
    assert!(matches!(
        src.read_records_aligned(n as u64 - 1, 2, &mut buf),
        Err(SourceError::OutOfRange { .. })
    ));
}
