//! Text columns tokenized on the reader threads: each row a document, encoded with a
//! `tokenizer.json` (the Rust library under the Python `tokenizers` package, so the ids are
//! `Tokenizer.encode`'s), led by `bos` and followed by `eos` when given, the documents' ids
//! concatenated into one stream of uint32 tokens.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use tokenizers::Tokenizer;

use super::columns::table_error;
use crate::Result;

/// A loaded tokenizer and the special tokens put around each document.
pub struct Text {
    tokenizer: Tokenizer,
    /// The tokenizer file, for errors.
    path: String,
    /// The token put before each document.
    pub bos: Option<u32>,
    /// The token put after each document.
    pub eos: Option<u32>,
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
        let tokenizer = Tokenizer::from_file(path).map_err(|e| {
            table_error(
                path,
                format!("cannot load the tokenizer: {}", one_line(&e.to_string())),
            )
        })?;
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
        Ok(Text {
            bos: special("bos_token", bos)?,
            eos: special("eos_token", eos)?,
            path: path.to_owned(),
            tokenizer,
        })
    }

    /// The token of id `id`, if the vocabulary has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
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
        mut documents: Option<&mut Vec<u64>>,
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
        let mut each = |text: &str| -> Result<()> {
            let encoding = self.tokenizer.encode(text, true).map_err(|e| {
                table_error(at, format!("column {column:?}: cannot tokenize a row: {e}"))
            })?;
            let ids = self
                .bos
                .iter()
                .chain(encoding.get_ids())
                .chain(self.eos.iter());
            let before = out.len();
            for id in ids {
                out.extend_from_slice(&id.to_le_bytes());
            }
            if let Some(documents) = documents.as_deref_mut() {
                documents.push(((out.len() - before) / 4) as u64);
            }
            Ok(())
        };
        match array.data_type() {
            DataType::Utf8 => array
                .as_string::<i32>()
                .iter()
                .try_for_each(|t| each(t.unwrap_or(""))),
            DataType::LargeUtf8 => array
                .as_string::<i64>()
                .iter()
                .try_for_each(|t| each(t.unwrap_or(""))),
            DataType::Utf8View => array
                .as_string_view()
                .iter()
                .try_for_each(|t| each(t.unwrap_or(""))),
            t => Err(table_error(
                at,
                format!("column {column:?} changed type to {t} in this chunk"),
            )),
        }
    }
}

/// `s` on one line: the library's messages may hold line breaks.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
