//! Tables (Parquet, Arrow IPC, JSON lines) opened as record sources of the columns asked for.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;

use crate::errors::{value_error, ToPy};
use crate::loader::Source;

/// Opens a Parquet file, an Arrow IPC file or stream, JSON lines (plain, gzip or zstd), or a
/// directory or glob of them, as records of ``columns`` (all when None), in that order; each
/// column at an offset aligned to its element size. ``on_error`` is ``"raise"`` or ``"skip"``
/// (malformed JSON lines skipped and counted).
#[pyfunction]
#[pyo3(signature = (path, columns=None, *, on_error="raise", reader="auto"))]
pub(crate) fn open_table(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    on_error: &str,
    reader: &str,
) -> PyResult<Source> {
    if path.to_str().is_some_and(pinfeed_store::is_url) {
        return Err(value_error(
            py,
            "Table",
            format!(
                "{}: tables are read from local files only so far; copy them to local disk",
                path.display()
            ),
        ));
    }
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
    let read = pinfeed_source::ReadOptions {
        reader: py.detach(|| reader.resolve(&path).0),
        format,
        ..Default::default()
    };
    let inner = py
        .detach(|| pinfeed_source::open_with(&path, None, &read))
        .py_err(py)?;
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

/// Opens the token column ``column`` (a list of integers per row, a document) of a Parquet file,
/// an Arrow IPC file or stream, or JSON lines, or of a directory or glob of them, as one stream
/// of tokens: the rows' lists concatenated in order, for ``open_tokens(opened=...)``. With
/// ``documents``, the stream keeps where each row starts, for ``sample="documents"``.
#[pyfunction]
#[pyo3(signature = (path, column, *, dtype=None, documents=false))]
pub(crate) fn open_token_column(
    py: Python<'_>,
    path: PathBuf,
    column: String,
    dtype: Option<&str>,
    documents: bool,
) -> PyResult<crate::tokens::TokenStream> {
    let dtype = dtype
        .map(pinfeed_source::tokens::TokenDType::parse)
        .transpose()
        .py_err(py)?;
    let mut format =
        pinfeed_source::FormatOptions::new().with(pinfeed_source::table::TOKENS, column);
    if documents {
        format.set(pinfeed_source::table::DOCUMENTS, "true");
    }
    let read = pinfeed_source::ReadOptions {
        format,
        ..Default::default()
    };
    let stream = py
        .detach(|| {
            let source = pinfeed_source::open_with(&path, None, &read)?;
            pinfeed_source::tokens::TokenStream::from_source(source, dtype)
        })
        .py_err(py)?;
    Ok(crate::tokens::TokenStream {
        inner: Arc::new(stream),
    })
}

/// Opens the text column ``column`` of a Parquet file, an Arrow IPC file or stream, or JSON
/// lines (or a directory or glob of them), tokenized on the reader threads with ``tokenizer``
/// (a ``tokenizer.json``), ``bos`` before and ``eos`` after each document (tokens or ids), as
/// one stream of uint32 tokens; returns it with the ids of ``bos`` and ``eos``. With
/// ``documents``, the stream keeps where each row starts, for ``sample="documents"``.
#[pyfunction]
#[pyo3(signature = (path, column, tokenizer, *, bos=None, eos=None, documents=false))]
pub(crate) fn open_text_column(
    py: Python<'_>,
    path: PathBuf,
    column: String,
    tokenizer: String,
    bos: Option<Bound<'_, PyAny>>,
    eos: Option<Bound<'_, PyAny>>,
    documents: bool,
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
    if documents {
        format.set(table::DOCUMENTS, "true");
    }
    let read = pinfeed_source::ReadOptions {
        format,
        ..Default::default()
    };
    let stream = py
        .detach(|| {
            let source = pinfeed_source::open_with(&path, None, &read)?;
            pinfeed_source::tokens::TokenStream::from_source(source, None)
        })
        .py_err(py)?;
    let stream = crate::tokens::TokenStream {
        inner: Arc::new(stream),
    };
    Ok((stream, text.bos, text.eos))
}

/// Rows of text this process has tokenized so far, in every table (rows read back from the
/// token cache on disk or the chunk cache are not counted again).
#[pyfunction]
pub(crate) fn tokenized_rows() -> u64 {
    pinfeed_source::table::tokenized_rows()
}
