//! Megatron indexed datasets: a `.bin` of tokens and the `.idx` that cuts it into sequences
//! and documents, as megatron-core's `megatron/core/datasets/indexed_dataset.py` writes them.
//!
//! The `.idx` layout, little-endian: the magic `MMIDIDX\0\0` (9 bytes), the version (u64, 1),
//! the dtype code (u8), the sequence count `S` (u64), the document-index count `D` (u64), then
//! `S` sequence lengths in tokens (i32), `S` sequence pointers (i64, byte offsets into the
//! `.bin`), `D` document indices (i64: document `d` is sequences `di[d] .. di[d + 1]`, so
//! there are `D - 1` documents), and for multimodal datasets `S` sequence modes (i8).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{invalid, TokenDType, TokenStream};
use crate::read::{open_regular, read_exact_at};
use crate::{Result, SourceError};

const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
const HEADER_BYTES: u64 = 9 + 8 + 1 + 8 + 8;

/// The token dtype of megatron-core's `DType` code; float codes (6, 7) are not tokens.
fn dtype_of_code(code: u8) -> Option<TokenDType> {
    Some(match code {
        1 => TokenDType::U8,
        2 => TokenDType::I8,
        3 => TokenDType::I16,
        4 => TokenDType::I32,
        5 => TokenDType::I64,
        8 => TokenDType::U16,
        _ => return None,
    })
}

/// A Megatron `.bin` + `.idx` pair, its index checked against the `.bin` at open.
///
/// Holds the index in memory (12 bytes a sequence, 8 a document) and the `.bin` as a
/// [`TokenStream`], so that [`TokenWindows`](super::TokenWindows) can cut it like any token
/// file.
#[derive(Debug)]
pub struct IndexedDataset {
    idx_path: PathBuf,
    bin: Arc<TokenStream>,
    /// Tokens of each sequence.
    lengths: Vec<u32>,
    /// Token offset in the `.bin` of each sequence; `starts[s] + lengths[s]` is inside it.
    starts: Vec<u64>,
    /// Non-decreasing, each at most the sequence count.
    document_indices: Vec<u64>,
    /// Whether the `.idx` holds sequence modes (multimodal datasets).
    multimodal: bool,
}

impl IndexedDataset {
    /// Opens `prefix.bin` and `prefix.idx`; `prefix` may also be given with either extension.
    pub fn open(prefix: impl AsRef<Path>) -> Result<IndexedDataset> {
        let prefix = prefix.as_ref();
        let has = |ext| prefix.extension().is_some_and(|e| e == ext);
        let prefix = if has("bin") || has("idx") {
            prefix.with_extension("")
        } else {
            prefix.to_path_buf()
        };
        let idx_path = append(&prefix, ".idx");
        let bin_path = append(&prefix, ".bin");
        let (idx, idx_size) = open_regular(&idx_path)?;
        let fail = |reason: String| invalid(idx_path.display(), reason);
        if idx_size < HEADER_BYTES {
            return Err(fail(format!(
                "{idx_size} bytes is too short for the {HEADER_BYTES}-byte header"
            )));
        }
        let mut header = [0u8; HEADER_BYTES as usize];
        read_exact_at(&idx, &idx_path, 0, &mut header)?;
        if &header[..9] != MAGIC {
            return Err(fail(format!(
                "not a Megatron index: expected the magic b\"MMIDIDX\\x00\\x00\", found {:?}",
                String::from_utf8_lossy(&header[..9])
            )));
        }
        let word =
            |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or_default());
        let version = word(9);
        if version != 1 {
            return Err(fail(format!("version {version}: expected 1")));
        }
        let code = header[17];
        let dtype = dtype_of_code(code).ok_or_else(|| {
            fail(format!(
                "dtype code {code}: expected a token dtype (1 uint8, 2 int8, 3 int16, 4 int32, \
                 5 int64, 8 uint16)"
            ))
        })?;
        let (sequences, doc_entries) = (word(18), word(26));
        let body = sequences
            .checked_mul(12)
            .and_then(|b| b.checked_add(doc_entries.checked_mul(8)?))
            .and_then(|b| b.checked_add(HEADER_BYTES))
            .ok_or_else(|| fail(format!("{sequences} sequences overflow 64 bits")))?;
        let multimodal = match idx_size.checked_sub(body) {
            Some(0) => false,
            Some(extra) if extra == sequences => true,
            _ => {
                return Err(fail(format!(
                    "{sequences} sequences and {doc_entries} document indices need {body} bytes \
                     ({} with sequence modes), found {idx_size}",
                    body.saturating_add(sequences)
                )))
            }
        };
        // The counts fit in the file, so they fit in memory.
        let (s, d) = (sequences as usize, doc_entries as usize);
        let mut table = vec![0u8; 12 * s + 8 * d];
        read_exact_at(&idx, &idx_path, HEADER_BYTES, &mut table)?;
        let bin = TokenStream::from_files(
            bin_path.display().to_string(),
            std::slice::from_ref(&bin_path),
            Some(dtype),
        )?;
        let (lengths, starts) = check_sequences(&table[..12 * s], &bin, &fail)?;
        let document_indices = check_documents(&table[12 * s..], sequences, &fail)?;
        Ok(IndexedDataset {
            idx_path,
            bin: Arc::new(bin),
            lengths,
            starts,
            document_indices,
            multimodal,
        })
    }

    /// The `.idx` file.
    pub fn idx_path(&self) -> &Path {
        &self.idx_path
    }

    /// The `.bin` file's tokens, every sequence back to back.
    pub fn tokens(&self) -> &Arc<TokenStream> {
        &self.bin
    }

    /// The token dtype (from the `.idx` dtype code).
    pub fn dtype(&self) -> TokenDType {
        self.bin.dtype()
    }

    /// Whether the `.idx` holds sequence modes (megatron-core's multimodal datasets); they are
    /// not read.
    pub fn is_multimodal(&self) -> bool {
        self.multimodal
    }

    /// Sequences in the dataset.
    pub fn num_sequences(&self) -> u64 {
        self.lengths.len() as u64
    }

    /// Documents in the dataset: one less than the document indices.
    pub fn num_documents(&self) -> u64 {
        self.document_indices.len().saturating_sub(1) as u64
    }

    /// Sequence `s`'s first token in the `.bin` and its token count.
    ///
    /// # Panics
    /// If `s >= num_sequences()`.
    pub fn sequence(&self, s: u64) -> (u64, u64) {
        (self.starts[s as usize], u64::from(self.lengths[s as usize]))
    }

    /// The sequences of document `d`.
    ///
    /// # Panics
    /// If `d >= num_documents()`.
    pub fn document_sequences(&self, d: u64) -> std::ops::Range<u64> {
        self.document_indices[d as usize]..self.document_indices[d as usize + 1]
    }

    /// Tokens in document `d`: the sum of its sequences' lengths.
    pub fn document_len(&self, d: u64) -> u64 {
        let r = self.document_sequences(d);
        self.lengths[r.start as usize..r.end as usize]
            .iter()
            .map(|&l| u64::from(l))
            .sum()
    }

    /// Reads tokens `offset ..` of document `d` (its sequences back to back) into `dst`, one
    /// read per sequence touched. Out of the document is an error naming the `.idx`.
    pub fn read_document(&self, d: u64, offset: u64, dst: &mut [u8]) -> Result<()> {
        let width = self.dtype().width();
        let mut skip = offset;
        let mut done = 0;
        for s in self.document_sequences(d) {
            if done == dst.len() {
                break;
            }
            let (start, len) = self.sequence(s);
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min((dst.len() - done) / width);
            self.bin
                .read_tokens(start + skip, &mut dst[done..done + n * width])?;
            done += n * width;
            skip = 0;
        }
        if done != dst.len() {
            return Err(invalid(
                self.idx_path.display(),
                format!(
                    "tokens {offset} .. {} of document {d} asked for, past its {} tokens",
                    offset + (dst.len() / width) as u64,
                    self.document_len(d)
                ),
            ));
        }
        Ok(())
    }
}

/// The lengths (i32) and byte pointers (i64) of the `.idx`'s sequences, as lengths and first
/// tokens, each checked to lie inside the `.bin`.
fn check_sequences(
    table: &[u8],
    bin: &TokenStream,
    fail: &dyn Fn(String) -> SourceError,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let s = table.len() / 12;
    let (width, bin_tokens) = (bin.dtype().width() as u64, bin.num_tokens());
    let mut lengths = Vec::with_capacity(s);
    let mut starts = Vec::with_capacity(s);
    for k in 0..s {
        let len = i32::from_le_bytes(table[4 * k..4 * k + 4].try_into().unwrap_or_default());
        let at = 4 * s + 8 * k;
        let ptr = i64::from_le_bytes(table[at..at + 8].try_into().unwrap_or_default());
        let start = u64::try_from(ptr)
            .ok()
            .filter(|p| p % width == 0)
            .map(|p| p / width);
        let (Ok(len), Some(start)) = (u32::try_from(len), start) else {
            return Err(fail(format!(
                "sequence {k}: length {len} and byte offset {ptr} must be non-negative, the \
                 offset a multiple of the {width}-byte token"
            )));
        };
        if start + u64::from(len) > bin_tokens {
            return Err(fail(format!(
                "sequence {k} (tokens {start} .. {}) runs past the {bin_tokens} tokens of {}",
                start + u64::from(len),
                bin.name()
            )));
        }
        lengths.push(len);
        starts.push(start);
    }
    Ok((lengths, starts))
}

/// The `.idx`'s document indices (i64), checked to be non-decreasing and at most the sequence
/// count.
fn check_documents(
    table: &[u8],
    sequences: u64,
    fail: &dyn Fn(String) -> SourceError,
) -> Result<Vec<u64>> {
    let mut document_indices: Vec<u64> = Vec::with_capacity(table.len() / 8);
    for (k, bytes) in table.chunks_exact(8).enumerate() {
        let v = i64::from_le_bytes(bytes.try_into().unwrap_or_default());
        let prev = document_indices.last().copied().unwrap_or(0);
        match u64::try_from(v) {
            Ok(v) if v >= prev && v <= sequences => document_indices.push(v),
            _ => {
                return Err(fail(format!(
                    "document index {k} is {v}: expected non-decreasing indices from {prev} up \
                     to the sequence count {sequences}"
                )))
            }
        }
    }
    Ok(document_indices)
}

/// `prefix` with `ext` appended to its file name (not replacing a dotted part of it).
fn append(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::testing::{token_bytes, write_indexed};

    fn docs() -> Vec<Vec<Vec<i64>>> {
        vec![
            vec![vec![1, 2, 3], vec![4, 5]],
            vec![vec![6]],
            vec![],
            vec![vec![7, 8, 9, 10], vec![], vec![11]],
        ]
    }

    #[test]
    fn reads_what_the_builder_writes() {
        let dir = tempfile::tempdir().unwrap();
        for dtype in [
            TokenDType::U16,
            TokenDType::I32,
            TokenDType::U8,
            TokenDType::I64,
        ] {
            let prefix = dir.path().join("corpus_text_document");
            write_indexed(&prefix, dtype, &docs());
            for given in [
                prefix.clone(),
                prefix.with_extension("bin"),
                prefix.with_extension("idx"),
            ] {
                let ds = IndexedDataset::open(&given).unwrap();
                assert_eq!(ds.dtype(), dtype);
                assert_eq!((ds.num_sequences(), ds.num_documents()), (6, 4));
                assert!(!ds.is_multimodal());
                assert_eq!(ds.tokens().num_tokens(), 11);
                for (d, doc) in docs().iter().enumerate() {
                    let all: Vec<i64> = doc.concat();
                    assert_eq!(ds.document_len(d as u64), all.len() as u64);
                    for from in 0..all.len() {
                        for to in from..=all.len() {
                            let mut dst = vec![0u8; (to - from) * dtype.width()];
                            ds.read_document(d as u64, from as u64, &mut dst).unwrap();
                            assert_eq!(dst, token_bytes(dtype, &all[from..to]));
                        }
                    }
                    let mut one = vec![0u8; dtype.width()];
                    assert!(ds
                        .read_document(d as u64, all.len() as u64, &mut one)
                        .is_err());
                }
                assert_eq!(ds.sequence(5), (10, 1));
                assert_eq!(ds.document_sequences(2), 3..3);
            }
        }
    }

    /// Writes the dataset, lets `corrupt` change the `.idx` bytes, and returns the error.
    fn error_after(corrupt: impl Fn(&mut Vec<u8>)) -> String {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("d");
        write_indexed(&prefix, TokenDType::U16, &docs());
        let idx = prefix.with_extension("idx");
        let mut bytes = std::fs::read(&idx).unwrap();
        corrupt(&mut bytes);
        std::fs::write(&idx, bytes).unwrap();
        let e = IndexedDataset::open(&prefix).unwrap_err().to_string();
        assert!(e.contains("d.idx") || e.contains("d.bin"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn bad_indexes_are_one_line_errors_naming_the_file() {
        // Header: magic 0..9, version 9..17, code 17, sequences 18..26, doc entries 26..34;
        // lengths from 34 (6 x 4), pointers from 58 (6 x 8), document indices from 106.
        assert!(error_after(|b| b[0] = b'X').contains("magic"));
        assert!(error_after(|b| b[9] = 2).contains("version 2"));
        assert!(error_after(|b| b[17] = 7).contains("dtype code 7"));
        assert!(error_after(|b| b[17] = 9).contains("dtype code 9"));
        assert!(error_after(|b| b.truncate(20)).contains("too short"));
        assert!(error_after(|b| b.truncate(b.len() - 1)).contains("need"));
        // Sequence 5 one token longer: past the .bin.
        assert!(error_after(|b| b[34 + 20] = 2).contains("runs past the 11 tokens"));
        assert!(
            error_after(|b| b[34 + 20..34 + 24].copy_from_slice(&(-1i32).to_le_bytes()))
                .contains("non-negative")
        );
        // Pointer of sequence 1 odd for 2-byte tokens.
        assert!(error_after(|b| b[58 + 8] = 7).contains("multiple"));
        // Document indices 0, 2, 3, 3, 6: make the third 1 (decreasing), then 7 (past).
        assert!(error_after(|b| b[106 + 16] = 1).contains("non-decreasing"));
        assert!(error_after(|b| b[106 + 32] = 7).contains("sequence count 6"));
        // Sequence modes (one i8 each) make it multimodal, not an error.
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("m");
        write_indexed(&prefix, TokenDType::U16, &docs());
        let idx = prefix.with_extension("idx");
        let mut bytes = std::fs::read(&idx).unwrap();
        bytes.extend([0u8; 6]);
        std::fs::write(&idx, bytes).unwrap();
        assert!(IndexedDataset::open(&prefix).unwrap().is_multimodal());
    }

    #[test]
    fn missing_bin_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("d");
        write_indexed(&prefix, TokenDType::U16, &docs());
        std::fs::remove_file(prefix.with_extension("bin")).unwrap();
        let e = IndexedDataset::open(&prefix).unwrap_err().to_string();
        assert!(e.contains("d.bin"), "{e}");
    }
    /// An int64 `.npy` file as numbers.
    fn read_i64_npy(path: &Path) -> Vec<i64> {
        let npy = crate::NpyFile::open(path).unwrap();
        let mut bytes = vec![0u8; crate::Source::num_records(&npy) as usize * 8];
        crate::Source::read_records(&npy, 0, &mut bytes).unwrap();
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Checks the datasets that megatron-core's own builder wrote (`bench/tokens.py fixtures`)
    /// against what its own reader and the script's numpy arrays say. The fixtures live in
    /// tests/fixtures/megatron, or where `PINFEED_MEGATRON_FIXTURES` points; the test says so
    /// and passes when neither holds them.
    #[test]
    fn reads_megatron_core_fixtures() {
        let dir = std::env::var_os("PINFEED_MEGATRON_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron")
            });
        assert!(
            dir.join("uint16.idx").exists(),
            "no megatron-core fixtures in {} (`python3 bench/tokens.py fixtures` writes them)",
            dir.display()
        );
        for (name, dtype) in [("uint16", TokenDType::U16), ("int32", TokenDType::I32)] {
            let file = |suffix: &str| dir.join(format!("{name}{suffix}"));
            let ds = IndexedDataset::open(file("")).unwrap();
            assert_eq!(ds.dtype(), dtype);
            let lengths = read_i64_npy(&file("_sequence_lengths.npy"));
            let pointers = read_i64_npy(&file("_sequence_pointers.npy"));
            let doc_indices = read_i64_npy(&file("_document_indices.npy"));
            assert_eq!(ds.num_sequences(), lengths.len() as u64);
            for (s, (&len, &ptr)) in lengths.iter().zip(&pointers).enumerate() {
                let width = dtype.width() as i64;
                assert_eq!(ds.sequence(s as u64), ((ptr / width) as u64, len as u64));
            }
            assert_eq!(ds.num_documents() + 1, doc_indices.len() as u64);
            for d in 0..ds.num_documents() {
                let r = ds.document_sequences(d);
                assert_eq!(
                    (r.start as i64, r.end as i64),
                    (doc_indices[d as usize], doc_indices[d as usize + 1])
                );
            }
            let tokens = read_i64_npy(&file("_tokens.npy"));
            let doc_lengths = read_i64_npy(&file("_document_lengths.npy"));
            let mut all = Vec::new();
            for (d, &n) in doc_lengths.iter().enumerate() {
                assert_eq!(ds.document_len(d as u64), n as u64);
                let mut dst = vec![0u8; n as usize * dtype.width()];
                ds.read_document(d as u64, 0, &mut dst).unwrap();
                all.extend(dst);
            }
            assert_eq!(all, token_bytes(dtype, &tokens), "{name}");
        }
    }
}
