//! Tables (Parquet, Arrow IPC, JSON lines) opened as record sources of the columns asked for,
//! from local files or object storage.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed_source::ReadOptions;
use pyo3::prelude::*;

use crate::errors::{value_error, ToPy};
use crate::loader::Source;

/// The object-storage arguments of a table's opener, as on `Source.open`.
pub(crate) struct StoreArgs<'py> {
    pairs: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<Bound<'py, PyAny>>,
    queue_depth: Option<u32>,
}

/// Opens `path` as `read` asks: a URL (`s3://`, `gs://`, `az://`, `https://`) from object
/// storage as `store` says, where each table is read by ranges; a local path from its files,
/// where `store` is refused (it would change nothing).
fn open_path_or_url(
    py: Python<'_>,
    path: &Path,
    mut read: ReadOptions,
    store: StoreArgs<'_>,
) -> PyResult<Box<dyn pinfeed_source::Source>> {
    let url = path.to_str().filter(|p| pinfeed_store::is_url(p));
    let options = crate::store::store_options(
        py,
        url.is_some(),
        store.pairs,
        store.cache_dir,
        store.cache_limit.as_ref(),
    )?;
    let Some(url) = url else {
        if store.queue_depth.is_some() {
            return Err(value_error(
                py,
                "Config",
                format!(
                    "{}: queue_depth applies to tables in object storage (s3://, gs://, az://, \
                     https://) only",
                    path.display()
                ),
            ));
        }
        return py
            .detach(|| pinfeed_source::open_with(path, None, &read))
            .py_err(py);
    };
    read.queue_depth = store
        .queue_depth
        .unwrap_or(pinfeed_source::DEFAULT_QUEUE_DEPTH);
    let opened = py.detach(|| pinfeed_store::open(url, None, &read, &options));
    Ok(Box::new(opened.py_err(py)?))
}

/// Opens a Parquet file, an Arrow IPC file or stream, JSON lines (plain, gzip or zstd), or a
/// directory or glob of them, as records of ``columns`` (all when None), in that order; each
/// column at an offset aligned to its element size. ``on_error`` is ``"raise"`` or ``"skip"``
/// (malformed JSON lines skipped and counted). A URL (``s3://bucket/tables/``, a glob of
/// objects, one object; ``gs://``, ``az://``, ``https://``) is read from object storage as
/// ``storage_options``, ``cache_dir``, ``cache_limit`` and ``queue_depth`` say (as for
/// :meth:`Source.open`): a Parquet object by its footer and the chunks of the columns asked
/// for, an Arrow IPC file by its footer and those columns' buffers, an Arrow stream or JSON
/// lines whole.
#[pyfunction]
#[pyo3(signature = (path, columns=None, *, on_error="raise", reader="auto", storage_options=None, cache_dir=None, cache_limit=None, queue_depth=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_table(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    on_error: &str,
    reader: &str,
    storage_options: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<Bound<'_, PyAny>>,
    queue_depth: Option<u32>,
) -> PyResult<Source> {
    let reader: pinfeed_source::Reader = reader
        .parse()
        .map_err(|e: pinfeed_source::UnknownReader| value_error(py, "Config", e.to_string()))?;
    let mut format = pinfeed_source::FormatOptions::new();
    if let Some(columns) = columns {
        let list = serde_json::to_string(&columns).unwrap_or_default();
        format.set(pinfeed_source::table::COLUMNS, list);
    }
    if on_error != "raise" {
        format.set(pinfeed_source::table::ON_ERROR, on_error);
    }
    let is_url = path.to_str().is_some_and(pinfeed_store::is_url);
    let read = ReadOptions {
        reader: match is_url {
            true => pinfeed_source::Reader::Pread,
            false => py.detach(|| reader.resolve(&path).0),
        },
        format,
        ..Default::default()
    };
    let store = StoreArgs {
        pairs: storage_options,
        cache_dir,
        cache_limit,
        queue_depth,
    };
    let inner = open_path_or_url(py, &path, read, store)?;
    Ok(Source {
        inner: Arc::from(inner),
        gpu_images: None,
    })
}

/// Records best read together for block shuffling (a Parquet row group's rows), or None.
#[pyfunction]
pub(crate) fn natural_block(source: &Source) -> Option<u64> {
    source.inner.natural_block()
}

/// The table(s) at `path` (a path or a URL) opened with the column's `format` options (and,
/// with `documents`, each row's start kept) as one token stream.
fn column_stream(
    py: Python<'_>,
    path: &Path,
    mut format: pinfeed_source::FormatOptions,
    documents: bool,
    store: StoreArgs<'_>,
    dtype: Option<pinfeed_source::tokens::TokenDType>,
) -> PyResult<crate::tokens::TokenStream> {
    if documents {
        format.set(pinfeed_source::table::DOCUMENTS, "true");
    }
    let read = ReadOptions {
        format,
        ..Default::default()
    };
    token_stream(py, open_path_or_url(py, path, read, store)?, dtype)
}

/// Opens the token column ``column`` (a list of integers per row, a document) of a Parquet file,
/// an Arrow IPC file or stream, or JSON lines, or of a directory or glob of them, as one stream
/// of tokens: the rows' lists concatenated in order, for ``open_tokens(opened=...)``. With
/// ``documents``, the stream keeps where each row starts, for ``sample="documents"``. A URL is
/// read from object storage as for :func:`open_table`.
#[pyfunction]
#[pyo3(signature = (path, column, *, dtype=None, documents=false, storage_options=None, cache_dir=None, cache_limit=None, queue_depth=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_token_column(
    py: Python<'_>,
    path: PathBuf,
    column: String,
    dtype: Option<&str>,
    documents: bool,
    storage_options: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<Bound<'_, PyAny>>,
    queue_depth: Option<u32>,
) -> PyResult<crate::tokens::TokenStream> {
    let dtype = dtype
        .map(pinfeed_source::tokens::TokenDType::parse)
        .transpose()
        .py_err(py)?;
    let format = pinfeed_source::FormatOptions::new().with(pinfeed_source::table::TOKENS, column);
    let store = StoreArgs {
        pairs: storage_options,
        cache_dir,
        cache_limit,
        queue_depth,
    };
    column_stream(py, &path, format, documents, store, dtype)
}

/// The tokens of `source` (a token or text column's) as one stream.
fn token_stream(
    py: Python<'_>,
    source: Box<dyn pinfeed_source::Source>,
    dtype: Option<pinfeed_source::tokens::TokenDType>,
) -> PyResult<crate::tokens::TokenStream> {
    let stream = py
        .detach(|| pinfeed_source::tokens::TokenStream::from_source(source, dtype))
        .py_err(py)?;
    Ok(crate::tokens::TokenStream {
        inner: Arc::new(stream),
    })
}

/// Opens the text column ``column`` of a Parquet file, an Arrow IPC file or stream, or JSON
/// lines (or a directory or glob of them), tokenized on the reader threads with ``tokenizer``
/// (a local ``tokenizer.json``), ``bos`` before and ``eos`` after each document (tokens or
/// ids), as one stream of uint32 tokens; returns it with the ids of ``bos`` and ``eos``. With
/// ``documents``, the stream keeps where each row starts, for ``sample="documents"``. A URL is
/// read from object storage as for :func:`open_table`.
#[pyfunction]
#[pyo3(signature = (path, column, tokenizer, *, bos=None, eos=None, documents=false, storage_options=None, cache_dir=None, cache_limit=None, queue_depth=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_text_column(
    py: Python<'_>,
    path: PathBuf,
    column: String,
    tokenizer: String,
    bos: Option<Bound<'_, PyAny>>,
    eos: Option<Bound<'_, PyAny>>,
    documents: bool,
    storage_options: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<Bound<'_, PyAny>>,
    queue_depth: Option<u32>,
) -> PyResult<(crate::tokens::TokenStream, Option<u32>, Option<u32>)> {
    use pinfeed_source::table;
    let plain = py
        .detach(|| table::Text::load(&tokenizer, None, None))
        .py_err(py)?;
    // An int is an id, a str a token; the files are told the token, which every file's
    // tokenizer resolves alike (an id written as digits could also be a token: "0").
    let as_token = |which: &str, given: Option<Bound<'_, PyAny>>| -> PyResult<Option<String>> {
        let Some(given) = given else { return Ok(None) };
        if let Ok(id) = given.extract::<u32>() {
            return plain.token(id).map(Some).ok_or_else(|| {
                value_error(
                    py,
                    "Table",
                    format!("{tokenizer}: {which} {id} is not an id of the tokenizer"),
                )
            });
        }
        Ok(Some(given.str()?.to_string()))
    };
    let (bos, eos) = (as_token("bos_token", bos)?, as_token("eos_token", eos)?);
    let text = py
        .detach(|| table::Text::load(&tokenizer, bos.as_deref(), eos.as_deref()))
        .py_err(py)?;
    let mut format = pinfeed_source::FormatOptions::new()
        .with(table::TEXT, column)
        .with(table::TOKENIZER, tokenizer);
    if let Some(bos) = bos {
        format.set(table::BOS, bos);
    }
    if let Some(eos) = eos {
        format.set(table::EOS, eos);
    }
    let store = StoreArgs {
        pairs: storage_options,
        cache_dir,
        cache_limit,
        queue_depth,
    };
    let stream = column_stream(py, &path, format, documents, store, None)?;
    // Windows of the text count the documents they pack by the ids that bound them.
    stream
        .inner
        .set_boundaries(pinfeed_source::tokens::Boundaries {
            bos: text.bos,
            eos: text.eos,
        });
    Ok((stream, text.bos, text.eos))
}

/// Rows of text this process has tokenized so far, in every table (rows read back from the
/// token cache on disk or the chunk cache are not counted again).
#[pyfunction]
pub(crate) fn tokenized_rows() -> u64 {
    pinfeed_source::table::tokenized_rows()
}
