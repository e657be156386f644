//! Text columns tokenized on the reader threads: each row a document, encoded with a
//! `tokenizer.json` (the Rust library under the Python `tokenizers` package, so the ids are
//! `Tokenizer.encode`'s), led by `bos` and followed by `eos` when given, the documents' ids
//! concatenated into one stream of uint32 tokens. A chunk's rows are split among idle cores,
//! so a file of one row group is not tokenized on one thread. A byte-level BPE of GPT-2's or
//! Llama 3's shape is run by [`super::bytelevel`], to the same ids. The tokenizer's truncation
//! and padding are turned off: documents are packed whole, never cut or padded.

use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use tokenizers::Tokenizer;

use super::bytelevel::{post_processed, ByteLevel};
use super::columns::table_error;
use super::cores::Busy;
use crate::rng::hash2;
use crate::Result;

/// A loaded tokenizer and the special tokens put around each document.
pub struct Text {
    tokenizer: Tokenizer,
    /// The fast path, for a byte-level BPE of a shape [`ByteLevel`] takes.
    fast: Option<ByteLevel>,
    /// The tokenizer file, for errors.
    path: String,
    /// The token put before each document.
    pub bos: Option<u32>,
    /// The token put after each document.
    pub eos: Option<u32>,
    /// A hash of the tokenizer file's bytes and the special tokens: what the ids depend on.
    pub(crate) fingerprint: u64,
    /// Where this file's tokens are kept on disk, if they are.
    pub(crate) spill: Option<super::spill::Spill>,
}

/// Rows tokenized by this process, for [`tokenized_rows`].
static TOKENIZED_ROWS: AtomicU64 = AtomicU64::new(0);
/// The version of how documents become ids, in the fingerprint of the tokens kept on disk.
const ENCODING: u64 = 2;
/// Text bytes of a chunk below which it is tokenized on its caller's thread alone.
const SPLIT_BYTES: usize = 256 << 10;

/// Rows of text this process has tokenized so far, in every table: a row read from the
/// token cache (or the chunk cache) is not counted again.
pub fn tokenized_rows() -> u64 {
    TOKENIZED_ROWS.load(Ordering::Relaxed)
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Text")
            .field("tokenizer", &self.path)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Text {
    /// Loads `path` (a `tokenizer.json`); `bos` and `eos` are tokens of its vocabulary
    /// (`<|endoftext|>`), or, when no token is so written, ids.
    pub fn load(path: &str, bos: Option<&str>, eos: Option<&str>) -> Result<Text> {
        let cannot = |why: &dyn std::fmt::Display| {
            table_error(
                path,
                format!("cannot load the tokenizer: {}", one_line(&why.to_string())),
            )
        };
        let bytes = std::fs::read(path).map_err(|e| cannot(&e))?;
        let mut tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| cannot(&e))?;
        tokenizer.with_truncation(None).map_err(|e| cannot(&e))?;
        tokenizer.with_padding(None);
        let probed = post_processed(&tokenizer).map_err(|why| cannot(&why))?;
        let special = |which: &str, given: Option<&str>| -> Result<Option<u32>> {
            let Some(given) = given else { return Ok(None) };
            if let Some(id) = tokenizer.token_to_id(given) {
                return Ok(Some(id));
            }
            let vocab = tokenizer.get_vocab_size(true) as u64;
            match given.parse::<u64>() {
                Ok(id) if id < vocab => Ok(Some(id as u32)),
                _ => Err(table_error(
                    path,
                    format!(
                        "{which} {given:?} is neither a token of the tokenizer nor an id below \
                         its vocabulary size {vocab}"
                    ),
                )),
            }
        };
        let (bos, eos) = (special("bos_token", bos)?, special("eos_token", eos)?);
        let id = |t: Option<u32>| t.map_or(u64::MAX, u64::from);
        // ENCODING changes with the way documents become ids: tokens kept on disk by another
        // way are not reused.
        let fingerprint = bytes
            .chunks(8)
            .fold(hash2(id(bos), id(eos) ^ ENCODING), |h, w| {
                let mut word = [0u8; 8];
                word[..w.len()].copy_from_slice(w);
                hash2(h, u64::from_le_bytes(word))
            });
        Ok(Text {
            bos,
            eos,
            fingerprint: hash2(fingerprint, bytes.len() as u64),
            path: path.to_owned(),
            spill: None,
            fast: ByteLevel::of(&tokenizer, &probed),
            tokenizer,
        })
    }

    /// The token of id `id`, if the vocabulary has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Appends the tokens of `documents` to `out` as uint32 bytes, as a text column's rows are:
    /// each led by `bos` and followed by `eos` where given. `at` names them in an error.
    pub fn encode(&self, documents: &[&str], at: &str, out: &mut Vec<u8>) -> Result<()> {
        self.encode_rows(documents, "text", at, out, None)
    }

    /// Whether `t` is a text type this reads.
    pub(crate) fn takes(t: &DataType) -> bool {
        matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    }

    /// Appends the tokens of every row of `array` (a text column) to `out`, as uint32 bytes,
    /// and each row's token count to `documents` when given.
    pub(crate) fn encode_into(
        &self,
        array: &ArrayRef,
        column: &str,
        at: &str,
        out: &mut Vec<u8>,
        documents: Option<&mut Vec<u64>>,
    ) -> Result<()> {
        if array.null_count() > 0 {
            return Err(table_error(
                at,
                format!(
                    "column {column:?} holds {} null documents",
                    array.null_count()
                ),
            ));
        }
        let texts: Vec<&str> = match array.data_type() {
            DataType::Utf8 => array
                .as_string::<i32>()
                .iter()
                .map(Option::unwrap_or_default)
                .collect(),
            DataType::LargeUtf8 => array
                .as_string::<i64>()
                .iter()
                .map(Option::unwrap_or_default)
                .collect(),
            DataType::Utf8View => array
                .as_string_view()
                .iter()
                .map(Option::unwrap_or_default)
                .collect(),
            t => {
                return Err(table_error(
                    at,
                    format!("column {column:?} changed type to {t} in this chunk"),
                ))
            }
        };
        let bytes: usize = texts.iter().map(|t| t.len()).sum();
        let busy = Busy::take(if bytes < SPLIT_BYTES {
            0
        } else {
            texts.len().saturating_sub(1)
        });
        self.encode_split(&texts, busy.threads(), column, at, out, documents)
    }

    /// [`Text::encode_into`] of `texts`, cut into `parts` runs of rows, each encoded on a
    /// thread of its own and appended in order.
    fn encode_split(
        &self,
        texts: &[&str],
        parts: usize,
        column: &str,
        at: &str,
        out: &mut Vec<u8>,
        documents: Option<&mut Vec<u64>>,
    ) -> Result<()> {
        if parts <= 1 {
            return self.encode_rows(texts, column, at, out, documents);
        }
        let per = texts.len().div_ceil(parts);
        let want = documents.is_some();
        let pieces: Vec<Result<(Vec<u8>, Vec<u64>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = texts
                .chunks(per)
                .map(|rows| {
                    scope.spawn(move || {
                        let (mut bytes, mut counts) = (Vec::new(), Vec::new());
                        let counted = want.then_some(&mut counts);
                        self.encode_rows(rows, column, at, &mut bytes, counted)
                            .map(|()| (bytes, counts))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut documents = documents;
        for piece in pieces {
            let (bytes, counts) = piece?;
            out.extend_from_slice(&bytes);
            if let Some(documents) = documents.as_deref_mut() {
                documents.extend(counts);
            }
        }
        Ok(())
    }

    /// Appends the tokens of `texts` to `out`, and each one's count to `documents`.
    fn encode_rows(
        &self,
        texts: &[&str],
        column: &str,
        at: &str,
        out: &mut Vec<u8>,
        mut documents: Option<&mut Vec<u64>>,
    ) -> Result<()> {
        let mut cache = self.fast.as_ref().map(ByteLevel::take);
        let mut encode = |text: &str, out: &mut Vec<u8>| -> tokenizers::Result<()> {
            if let (Some(fast), Some(cache)) = (&self.fast, &mut cache) {
                if fast.takes(text) && fast.encode(&self.tokenizer, text, cache, out)? {
                    return Ok(());
                }
            }
            // `encode_fast` leaves the offsets out; the ids are `encode`'s.
            let encoding = self.tokenizer.encode_fast(text, true)?;
            for id in encoding.get_ids() {
                out.extend_from_slice(&id.to_le_bytes());
            }
            Ok(())
        };
        let mut encoded = Ok(());
        for text in texts {
            let before = out.len();
            if let Some(bos) = self.bos {
                out.extend_from_slice(&bos.to_le_bytes());
            }
            encoded = encode(text, out);
            if encoded.is_err() {
                break;
            }
            if let Some(eos) = self.eos {
                out.extend_from_slice(&eos.to_le_bytes());
            }
            if let Some(documents) = documents.as_deref_mut() {
                documents.push(((out.len() - before) / 4) as u64);
            }
        }
        if let (Some(fast), Some(cache)) = (&self.fast, cache) {
            fast.give(cache);
        }
        encoded.map_err(|e| {
            table_error(at, format!("column {column:?}: cannot tokenize a row: {e}"))
        })?;
        TOKENIZED_ROWS.fetch_add(texts.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// `s` on one line: the library's messages may hold line breaks.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
