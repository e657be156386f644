//! Files for the tests of this module: token bytes, `.npy` files and a Megatron indexed
//! dataset written by the format's specification (megatron-core's `_IndexWriter`), so that the
//! tests run without megatron-core installed.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{TokenDType, TokenStream};
use crate::{HostBuffer, Layout, NetworkStats, Result, Source};

/// Little-endian uint16 tokens `range`.
pub(crate) fn u16_bytes(range: std::ops::Range<u64>) -> Vec<u8> {
    range.flat_map(|t| (t as u16).to_le_bytes()).collect()
}

/// Writes a version 1.0 `.npy` file of `data` (`typestr`, `shape`).
pub(crate) fn write_npy(path: &Path, typestr: &str, data: &[u8], shape: &[u64]) {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{typestr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// Megatron's dtype code of a token dtype (megatron-core's `DType` enum).
pub(crate) fn megatron_code(dtype: TokenDType) -> u8 {
    match dtype {
        TokenDType::U8 => 1,
        TokenDType::I8 => 2,
        TokenDType::I16 => 3,
        TokenDType::I32 => 4,
        TokenDType::I64 => 5,
        TokenDType::U16 => 8,
        other => panic!("megatron has no code for {other}"),
    }
}

/// Token bytes of `tokens` at `dtype`'s width.
pub(crate) fn token_bytes(dtype: TokenDType, tokens: &[i64]) -> Vec<u8> {
    let w = dtype.width();
    tokens
        .iter()
        .flat_map(|t| t.to_le_bytes()[..w].to_vec())
        .collect()
}

/// Writes `prefix.bin` and `prefix.idx` as `IndexedDatasetBuilder` does: every document is a
/// list of sequences, written back to back; `document_indices` starts with 0 and gains the
/// sequence count after each document.
pub(crate) fn write_indexed(prefix: &Path, dtype: TokenDType, documents: &[Vec<Vec<i64>>]) {
    let mut bin = Vec::new();
    let (mut lengths, mut pointers, mut doc_indices) = (vec![], vec![], vec![0i64]);
    for doc in documents {
        for seq in doc {
            pointers.push(bin.len() as i64);
            lengths.push(seq.len() as i32);
            bin.extend(token_bytes(dtype, seq));
        }
        doc_indices.push(lengths.len() as i64);
    }
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(megatron_code(dtype));
    idx.extend((lengths.len() as u64).to_le_bytes());
    idx.extend((doc_indices.len() as u64).to_le_bytes());
    idx.extend(lengths.iter().flat_map(|l| l.to_le_bytes()));
    idx.extend(pointers.iter().flat_map(|p| p.to_le_bytes()));
    idx.extend(doc_indices.iter().flat_map(|d| d.to_le_bytes()));
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
}

/// A stream of tokens 0 .. 40 (uint16) over three files of 7, 20 and 13 tokens.
pub(crate) fn three_files() -> (tempfile::TempDir, std::sync::Arc<super::TokenStream>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0.bin"), u16_bytes(0..7)).unwrap();
    std::fs::write(dir.path().join("1.bin"), u16_bytes(7..27)).unwrap();
    std::fs::write(dir.path().join("2.bin"), u16_bytes(27..40)).unwrap();
    let s = super::TokenStream::open(dir.path(), Some(TokenDType::U16)).unwrap();
    (dir, std::sync::Arc::new(s))
}

/// Uint16 tokens `0 .. n` as a stream over a source standing in for object storage (a host
/// buffer that reports network counters, as `pinfeed-store`'s datasets do), and the number of
/// gathers the source has been given.
pub(crate) fn gathered_stream(n: u64) -> (TokenStream, Arc<AtomicUsize>) {
    let layout = Layout::new(TokenDType::U16.dtype(), Vec::new()).unwrap();
    let buffer = HostBuffer::from_vec(u16_bytes(0..n), layout).unwrap();
    let gathers = Arc::new(AtomicUsize::new(0));
    let source = Gathered(buffer, Arc::clone(&gathers));
    (
        TokenStream::from_source(Box::new(source), None).unwrap(),
        gathers,
    )
}

#[derive(Debug)]
struct Gathered(HostBuffer, Arc<AtomicUsize>);

impl Source for Gathered {
    fn name(&self) -> &str {
        "s3://bucket/train.bin"
    }
    fn layout(&self) -> &Layout {
        self.0.layout()
    }
    fn num_records(&self) -> u64 {
        self.0.num_records()
    }
    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        self.0.read_records(first, dst)
    }
    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.gather_at(records, dst)
    }
    fn network(&self) -> Option<NetworkStats> {
        Some(NetworkStats::default())
    }
}
