//! Tables as records: Parquet files, Arrow IPC files and streams, and JSON lines, whose
//! columns (the ones asked for with the `columns` format option, else all of them) become
//! fixed-size records.
//!
//! A table is cut into chunks: a Parquet row group, an Arrow record batch, a JSON-lines file.
//! A chunk's records are decoded whole, packed as [`columns`] lays them out, and kept in one
//! cache for the process (`cache`), so that reading a range decodes each chunk once, while
//! reading records in random order decodes a chunk for nearly every record once the chunks
//! outgrow the cache (`shuffle="block"` with blocks of a row group reads each once an epoch;
//! a token column's shuffled orders take the chunks a few at a time,
//! [`ChunkOrder`](crate::tokens::ChunkOrder)). The cache holds [`cache_limit`] bytes
//! (1 GiB unless [`set_cache_limit`] says otherwise), and a quarter as much again of buffers
//! of chunks let go, kept for the next decodes while a table is open (`spares`).
//!
//! Each format reads its file through [`crate::formats::ByteRanges`]: a local file by `pread`,
//! an object in object storage by ranged GETs (`Format::open_ranges`), so that only what the
//! columns asked for need is read, wherever the table lies.

mod bytelevel;
mod cache;
pub mod columns;
mod cores;
mod ipc;
mod jsonl;
mod pages;
mod parquet;
mod spares;
mod spill;
mod text;

use std::sync::Arc;

use crate::formats::{Format, FormatOptions};
use crate::{check_request, Layout, Result, Source};
pub use cache::LIMIT_VAR as CHUNK_CACHE_LIMIT_VAR;
pub use columns::Column;
pub use spill::LIMIT_VAR as TEXT_CACHE_LIMIT_VAR;
pub use text::{tokenized_rows, Text};

pub(crate) use ipc::Arrow;
pub(crate) use jsonl::Jsonl;
pub(crate) use parquet::Parquet;

/// The format option naming the columns to read, as `a,b,c` or a JSON list of names.
pub const COLUMNS: &str = "columns";
/// The format option saying what a malformed JSON line does: `raise` (the default) or `skip`.
pub const ON_ERROR: &str = "on_error";

/// The format option naming a token column: a list of integers per row (a document), read
/// as one stream of tokens, the rows' lists concatenated in order.
pub const TOKENS: &str = "tokens";

/// The format option naming a text column to tokenize, with [`TOKENIZER`] (a
/// `tokenizer.json`) and the optional [`BOS`] and [`EOS`] tokens put around each document.
pub const TEXT: &str = "text";
/// The format option naming the `tokenizer.json` of a [`TEXT`] column.
pub const TOKENIZER: &str = "tokenizer";
/// The token put before each document of a [`TEXT`] column (a token or an id).
pub const BOS: &str = "bos";
/// The token put after each document of a [`TEXT`] column (a token or an id).
pub const EOS: &str = "eos";

/// The format option (`true`) that makes a [`TOKENS`] or [`TEXT`] column keep each row's
/// token count, for [`Source::document_lengths`]: 8 bytes a row, counted when the tokens are.
pub const DOCUMENTS: &str = "documents";

/// Bytes of decoded chunks the process's cache keeps at most.
pub fn cache_limit() -> usize {
    cache::limit()
}

/// Sets the limit of the process's cache of decoded chunks (1 GiB to begin with, or
/// `$PINFEED_CHUNK_CACHE_BYTES`; 0 restores that rule), lets go of chunks down to it, and
/// returns the setting it had (0 when none was set). Row-group-aware orders opened after it
/// take their chunks by half this much.
pub fn set_cache_limit(bytes: usize) -> usize {
    cache::set_limit(bytes)
}

/// The format options every table format reads.
pub(crate) const OPTION_KEYS: &[&str] = &[COLUMNS, TOKENS, TEXT, TOKENIZER, BOS, EOS, DOCUMENTS];

/// The columns asked for with [`COLUMNS`], in order (or the token column of [`TOKENS`], the
/// text column of [`TEXT`]); `None` for all of them.
pub(crate) fn columns_option(format: &FormatOptions) -> Result<Option<Vec<String>>> {
    if let Some(column) = format.get(TOKENS).or(format.get(TEXT)) {
        return Ok(Some(vec![column.to_owned()]));
    }
    let Some(value) = format.get(COLUMNS) else {
        return Ok(None);
    };
    let names: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| crate::SourceError::Options {
            reason: format!("columns option {value:?}: expected a JSON list of names: {e}"),
        })?
    } else {
        value.split(',').map(|s| s.trim().to_owned()).collect()
    };
    if names.is_empty() || names.iter().any(String::is_empty) {
        return Err(crate::SourceError::Options {
            reason: format!("columns option {value:?}: expected one or more column names"),
        });
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(crate::SourceError::Options {
                reason: format!("columns option {value:?}: column {n:?} is named twice"),
            });
        }
    }
    Ok(Some(names))
}

/// The layout of records of `fields` of the table in `bytes` as the format options ask: columns
/// as records, a token column, or a text column tokenized (its tokens kept on local disk for a
/// local file, `spill`).
pub(crate) fn layout_for(
    format: &FormatOptions,
    name: &str,
    fields: &[&arrow_schema::Field],
    bytes: &dyn crate::formats::ByteRanges,
) -> Result<(Layout, Vec<Column>)> {
    let documents = match format.get(DOCUMENTS) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(crate::SourceError::Options {
                reason: format!("{name}: documents option {other:?}: expected true or false"),
            })
        }
    };
    let (layout, mut columns) = if format.get(TEXT).is_some() {
        let Some(tokenizer) = format.get(TOKENIZER) else {
            return Err(crate::SourceError::Options {
                reason: format!("{name}: a text column needs a tokenizer (a tokenizer.json)"),
            });
        };
        let mut text = Text::load(tokenizer, format.get(BOS), format.get(EOS))?;
        let column = format.get(TEXT).unwrap_or_default();
        text.spill = bytes
            .local_file()
            .and_then(|(path, file)| spill::Spill::for_file(path, file, column, text.fingerprint));
        columns::text_layout(name, fields[0], Arc::new(text))?
    } else if format.get(TOKENS).is_some() {
        columns::token_layout(name, fields[0])?
    } else if documents {
        return Err(crate::SourceError::Options {
            reason: format!("{name}: the documents option applies to a tokens or text column"),
        });
    } else if format.get(COLUMNS).is_none() {
        columns::layout_of(name, fields)
            .map_err(|e| columns::name_the_columns(e, &columns::readable(fields)))?
    } else {
        columns::layout_of(name, fields)?
    };
    if let Some(first) = columns.first_mut() {
        first.documents = documents; // false but for a token or text column
    }
    Ok((layout, columns))
}

/// A table's chunks, decoded on demand.
pub(crate) trait Chunks: Send + Sync + std::fmt::Debug {
    /// Rows of each chunk.
    fn rows(&self) -> &[u64];
    /// Chunk `i`'s rows as records of `columns`, `record_bytes` each; for a token or text
    /// column, each row's token count is pushed to `documents` when given.
    fn pack(
        &self,
        i: usize,
        columns: &[Column],
        record_bytes: usize,
        documents: Option<&mut Vec<u64>>,
    ) -> Result<Vec<u8>>;

    /// Tokens in each row of every chunk, in order, where they were kept.
    fn documents(&self) -> Option<&[u64]> {
        None
    }
}

/// A token column's chunks, counted in tokens: each chunk decoded once at open to count them
/// (Parquet's footer counts rows, not the integers of their lists). A text column's tokens are
/// kept on disk as they are counted ([`spill`]), and read back from there later.
#[derive(Debug)]
struct TokenChunks {
    inner: Box<dyn Chunks>,
    tokens: Vec<u64>,
    /// Tokens in each row, all chunks in order, when the column was opened with [`DOCUMENTS`].
    documents: Option<Vec<u64>>,
    /// The text column's tokens on disk.
    spill: Option<Arc<Text>>,
}

/// A chunk's token count, and its rows' when they are kept.
type Counted = Option<Result<(u64, Vec<u64>)>>;

impl TokenChunks {
    /// Counts the tokens of every chunk (and of each row, for [`DOCUMENTS`]), on as many
    /// threads as there are cores; the chunks go into the cache under `id` and, for text, to
    /// disk, so that no read tokenizes them again. Text kept on disk before is not
    /// tokenized: its counts are read.
    fn count(
        inner: Box<dyn Chunks>,
        columns: &[Column],
        itemsize: usize,
        id: u64,
    ) -> Result<TokenChunks> {
        let n = inner.rows().len();
        let keep = columns[0].documents;
        let spill = columns[0].text.clone().filter(|t| t.spill.is_some());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let counts: Vec<std::sync::Mutex<Counted>> = (0..n).map(|_| Default::default()).collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, |p| p.get())
            .min(n.max(1));
        let count_one = |i: usize| -> Result<(u64, Vec<u64>)> {
            let disk = spill.as_ref().and_then(|t| t.spill.as_ref());
            if let Some(kept) = disk.and_then(|d| d.counts(i)) {
                return Ok(kept);
            }
            let mut rows = Vec::new();
            let wanted = (keep || disk.is_some()).then_some(&mut rows);
            // The table's id is new: nothing is cached under it yet, so `pack` runs.
            let chunk = cache::get(id, i, || inner.pack(i, columns, itemsize, wanted))?;
            if let Some(disk) = disk {
                disk.write(i, &chunk, &rows);
            }
            Ok(((chunk.len() / itemsize) as u64, rows))
        };
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let got = count_one(i);
                    *counts[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(got);
                });
            }
        });
        let mut tokens = Vec::with_capacity(n);
        let mut documents = keep.then(Vec::new);
        for c in counts {
            let (count, rows) = c
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or(Ok((0, Vec::new())))?;
            debug_assert!(rows.is_empty() || rows.iter().sum::<u64>() == count);
            tokens.push(count);
            if let Some(documents) = &mut documents {
                documents.extend(rows);
            }
        }
        Ok(TokenChunks {
            inner,
            tokens,
            documents,
            spill,
        })
    }
}

impl Chunks for TokenChunks {
    fn rows(&self) -> &[u64] {
        &self.tokens
    }

    fn pack(
        &self,
        i: usize,
        columns: &[Column],
        record_bytes: usize,
        documents: Option<&mut Vec<u64>>,
    ) -> Result<Vec<u8>> {
        // Only the count asks for the rows' counts, and it reads them from disk itself.
        if documents.is_none() {
            let disk = self.spill.as_ref().and_then(|t| t.spill.as_ref());
            if let Some(kept) = disk.and_then(|d| d.read(i, self.tokens[i])) {
                return Ok(kept);
            }
        }
        self.inner.pack(i, columns, record_bytes, documents)
    }

    fn documents(&self) -> Option<&[u64]> {
        self.documents.as_deref()
    }
}

/// Records of a table's columns, read chunk by chunk.
#[derive(Debug)]
pub struct TableSource {
    name: String,
    layout: Layout,
    columns: Vec<Column>,
    chunks: Box<dyn Chunks>,
    /// `starts[k]` is the first record of the `k`-th non-empty chunk, whose index is
    /// `index[k]`; `starts[last]` is the total.
    starts: Vec<u64>,
    index: Vec<usize>,
    /// This table's key in the chunk cache.
    id: u64,
    /// Chunks decoded by reads (not by the count at open), for statistics.
    decodes: std::sync::atomic::AtomicU64,
    /// What reading this table says for statistics (malformed lines skipped).
    description: String,
    /// Counts this table among the open ones, whose decoding keeps spare buffers ([`spares`]).
    _open: spares::Open,
}

impl TableSource {
    pub(crate) fn new(
        name: String,
        layout: Layout,
        columns: Vec<Column>,
        chunks: Box<dyn Chunks>,
        description: String,
    ) -> Result<TableSource> {
        let open = spares::Open::new();
        let id = cache::new_id();
        let chunks: Box<dyn Chunks> = match columns.first() {
            Some(c) if c.tokens => Box::new(TokenChunks::count(chunks, &columns, c.itemsize, id)?),
            _ => chunks,
        };
        let mut starts = vec![0u64];
        let mut index = Vec::new();
        for (i, &rows) in chunks.rows().iter().enumerate() {
            if rows > 0 {
                index.push(i);
                starts.push(starts[starts.len() - 1] + rows);
            }
        }
        if index.is_empty() {
            return Err(crate::SourceError::Empty { name });
        }
        Ok(TableSource {
            name,
            layout,
            columns,
            chunks,
            starts,
            index,
            id,
            decodes: Default::default(),
            description,
            _open: open,
        })
    }

    /// The columns of each record, in order, with their offsets.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Rows of each chunk (row group, record batch), empty ones included.
    pub fn chunk_rows(&self) -> &[u64] {
        self.chunks.rows()
    }

    fn chunk(&self, k: usize) -> Result<cache::Chunk> {
        let i = self.index[k];
        let record_bytes = self.layout.record_bytes();
        let load = |i: usize| {
            move || {
                self.decodes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.chunks.pack(i, &self.columns, record_bytes, None)
            }
        };
        // Readers in file order all want the chunk one of them is decoding: rather than wait,
        // each decodes a later chunk nobody has asked for yet, so that decoding runs on every
        // reader thread. Within half the cache, so that the chunk being read stays in it; and
        // only where the chunk before was read (in order), not for records in random order.
        let in_order = k == 0 || cache::asked(self.id, self.index[k - 1]);
        let (mut ahead, mut bytes) = (k + 1, 0u64);
        while in_order && ahead < self.index.len() && cache::decoding(self.id, i) {
            bytes += (self.starts[ahead + 1] - self.starts[ahead]) * record_bytes as u64;
            if bytes > cache::limit() as u64 / 2 {
                break;
            }
            let j = self.index[ahead];
            cache::load_ahead(self.id, j, load(j));
            ahead += 1;
        }
        cache::get(self.id, i, load(i))
    }
}

impl Drop for TableSource {
    fn drop(&mut self) {
        cache::forget(self.id);
    }
}

impl Source for TableSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        let count = check_request(self, first, dst.len())?;
        let record_bytes = self.layout.record_bytes();
        let (mut record, end, mut done) = (first, first + count, 0usize);
        while record < end {
            let k = self.starts.partition_point(|&s| s <= record) - 1;
            let chunk = self.chunk(k)?;
            let from = (record - self.starts[k]) as usize;
            let take = (end.min(self.starts[k + 1]) - record) as usize;
            let bytes = take * record_bytes;
            dst[done..done + bytes]
                .copy_from_slice(&chunk[from * record_bytes..from * record_bytes + bytes]);
            done += bytes;
            record += take as u64;
        }
        Ok(())
    }

    fn reader_description(&self) -> String {
        self.description.clone()
    }

    fn natural_block(&self) -> Option<u64> {
        self.chunks.rows().iter().copied().max()
    }

    fn document_lengths(&self) -> Option<Vec<u64>> {
        self.chunks.documents().map(<[u64]>::to_vec)
    }

    fn chunk_lengths(&self) -> Option<Vec<u64>> {
        Some(self.chunks.rows().to_vec())
    }

    fn chunk_decodes(&self) -> Option<u64> {
        Some(self.decodes.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn columns(&self) -> Option<&[Column]> {
        Some(&self.columns)
    }
}

/// The formats of this module, for [`crate::formats::ALL`].
pub(crate) static PARQUET: &dyn Format = &Parquet;
/// Arrow IPC.
pub(crate) static ARROW: &dyn Format = &Arrow;
/// JSON lines.
pub(crate) static JSONL: &dyn Format = &Jsonl;
