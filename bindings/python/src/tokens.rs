//! Token streams as loader sources: `pinfeed.TokenLoader`'s Rust half.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use pinfeed_source::tokens::{
    self, sampled_offset, ChunkOrder, Sample, TokenDType, TokenOptions, TokenShuffle,
};
use pinfeed_source::{ReadOptions, SourceError};
use pyo3::prelude::*;

use crate::errors::{source_error, value_error, Raised, ToPy};
use crate::loader::Source;
use crate::store::store_options;
use pinfeed_store::StoreOptions;

/// Adds this module's functions and classes to `_pinfeed`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TokenStream>()?;
    m.add_function(wrap_pyfunction!(open_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(token_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(document_order, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_order, m)?)?;
    m.add_function(wrap_pyfunction!(table_cache_limit, m)?)
}

/// Token data in object storage as :func:`open_tokens` opened it: the objects listed and their
/// headers read, the client and its cache ready. Given back to ``open_tokens`` as ``opened``,
/// the windows of another epoch are cut from it without asking the store again.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub(crate) struct TokenStream {
    pub(crate) inner: Arc<tokens::TokenStream>,
}

#[pymethods]
impl TokenStream {
    fn __repr__(&self) -> String {
        format!(
            "TokenStream({:?}, dtype={}, num_tokens={})",
            self.inner.name(),
            self.inner.dtype(),
            self.inner.num_tokens()
        )
    }

    /// Chunks (a table's row groups, record batches, JSON-lines files) that reads of this
    /// stream have decoded so far; ``None`` for a stream without chunks.
    #[getter]
    fn chunk_decodes(&self) -> Option<u64> {
        self.inner.chunk_decodes()
    }
}

/// Opens a token dataset as a loader source whose records are windows of ``seq_len + 1``
/// tokens at their stored width, and returns it with the token dtype (a numpy typestring), the
/// number of tokens, for token data in object storage the :class:`TokenStream` it was cut from
/// (``None`` for local files), and the data's fingerprint (a hash of its dtype, size and
/// tokens sampled across it, the same for a copy anywhere: what a saved position is checked
/// against).
///
/// ``output`` (``"int64"``, ``"int32"``) is the integer type the tokens are converted to after
/// the copy: where the stored dtype holds values it cannot (uint32 as int32, uint64 as int64),
/// the reader threads check every token they read, and a batch holding one that does not fit
/// fails, naming the file, the token's offset and value.
///
/// ``path`` is a raw token file (nanoGPT's ``train.bin``; ``dtype`` required), a 1-D integer
/// ``.npy``, a directory or glob of them read as one stream, or a Megatron ``.bin``/``.idx``
/// pair (its dtype from the ``.idx``). It may be a URL (``s3://bucket/train.bin``, a prefix's
/// ``.npy`` objects, a glob of objects; ``gs://``, ``az://``, ``https://``), read by ranged
/// GETs as ``storage_options``, ``cache_dir``, ``cache_limit`` and ``queue_depth`` say (as for
/// :meth:`Source.open`; refused for a local path); the Megatron index is read from local disk
/// only. ``opened`` (a :class:`TokenStream` an earlier call returned) is used instead of
/// opening ``path`` again. ``sample``:
///
/// - ``"random"``: record ``v`` is the window at the uniformly random offset
///   :func:`token_offsets` gives for ``(seed, epoch, v)``; ``steps × batch_size × world_size``
///   records, or 2^40 without ``steps``. With ``steps_per_batch`` k > 1 the records are
///   numbered for a loader batch of ``k × batch_size``: batch ``g`` holds rank
///   ``g % world_size``'s steps ``(g // world_size) × k ..``, each step's windows as they would
///   be with one step a batch (the count rounded up to whole loader batches).
/// - ``"sequential"``: consecutive windows every ``seq_len`` tokens (each window's last token
///   is the next one's first).
/// - ``"documents"`` (a Megatron dataset, or ``opened`` from a table's column with
///   ``documents=True``): the documents in the order :func:`document_order` gives for
///   ``(seed, epoch)`` (for a table's column, unless ``shuffle="random"``, the order
///   :func:`chunk_order` gives its rows), empty ones left out, concatenated and cut as
///   ``"sequential"``; each record is the window's tokens followed by ``seq_len + 1`` uint16
///   segment ids (the ordinal of each token's document in the window), as uint8 bytes.
///
/// ``shuffle`` (``"none"``, ``"random"`` or ``"block"``) is ``TokenLoader``'s mode as far as it
/// concerns the source: ``"random"`` leaves the permutation to the loader; ``"block"`` (a
/// table's column) puts sequential windows in the row-group-aware order of :func:`chunk_order`
/// (each window counted in the chunk its first token lies in), and shuffles the windows cut
/// from each group of documents among themselves. The last item returned is then the
/// fingerprint of that rule (``None`` for orders that are not row-group aware), which a saved
/// position is checked against.
#[pyfunction]
#[pyo3(signature = (
    path, *, seq_len, batch_size, dtype=None, sample="random", seed=0, steps=None,
    world_size=1, epoch=0, steps_per_batch=1, storage_options=None, cache_dir=None,
    cache_limit=None, queue_depth=None, opened=None, output=None, shuffle="none"
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_tokens(
    py: Python<'_>,
    path: PathBuf,
    seq_len: u64,
    batch_size: u64,
    dtype: Option<&str>,
    sample: &str,
    seed: u64,
    steps: Option<u64>,
    world_size: u64,
    epoch: u64,
    steps_per_batch: u64,
    storage_options: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<Bound<'_, PyAny>>,
    queue_depth: Option<u32>,
    opened: Option<Bound<'_, TokenStream>>,
    output: Option<&str>,
    shuffle: &str,
) -> PyResult<Opened> {
    let name = path.display().to_string();
    let named = |e: SourceError| with_name(&name, e);
    let dtype = token_dtype(py, &name, dtype)?;
    let config = |message: String| value_error(py, "Config", format!("{name}: {message}"));
    let sample = sample.parse::<Sample>().map_err(config)?;
    let shuffle = shuffle.parse::<TokenShuffle>().map_err(config)?;
    let options = TokenOptions {
        dtype,
        seq_len,
        sample,
        seed,
        epoch,
        steps,
        batch_size,
        world_size,
        steps_per_batch,
        shuffle,
    };
    let url = path.to_str().filter(|p| pinfeed_store::is_url(p));
    let store = store_options(
        py,
        url.is_some(),
        storage_options,
        cache_dir,
        cache_limit.as_ref(),
    )?;
    let remote = match (opened, url) {
        (Some(opened), _) => Some(Arc::clone(&opened.get().inner)),
        (None, url) => remote_stream(py, url, &name, dtype, &store, queue_depth)?,
    };
    let output = token_dtype(py, &name, output)?;
    let (windows, fingerprint, order) = py
        .detach(|| -> Result<_, SourceError> {
            let windows = match &remote {
                Some(stream) => pinfeed_store::token_windows(Arc::clone(stream), &options),
                None => tokens::open(&path, &options),
            }?;
            let fingerprint = windows.stream().fingerprint()?;
            let order = tokens::order_fingerprint(windows.stream(), &options)?;
            Ok((windows, fingerprint, order))
        })
        .map_err(&named)
        .py_err(py)?;
    let stream = windows.stream();
    if let Some(out) = output {
        stream.set_output(out);
    }
    let info = (stream.dtype().typestr().to_owned(), stream.num_tokens());
    Ok((
        Source {
            inner: windows.source(),
            gpu_images: None,
        },
        info.0,
        info.1,
        remote.map(|inner| TokenStream { inner }),
        fingerprint,
        order,
    ))
}

/// What :func:`open_tokens` returns: the source, the token dtype's typestring, the number of
/// tokens, the stream of token data in object storage, the data's fingerprint and the order's.
type Opened = (Source, String, u64, Option<TokenStream>, u64, Option<u64>);

/// A token type named in Python (`"uint16"`, `"<u4"`), or a `ValueError` naming the source.
fn token_dtype(py: Python<'_>, name: &str, dtype: Option<&str>) -> PyResult<Option<TokenDType>> {
    dtype
        .map(TokenDType::parse)
        .transpose()
        .map_err(|e| with_name(name, e))
        .py_err(py)
}

/// The token data at `url` opened as one stream (the objects listed and their headers read), or
/// `None` for a local path, where `queue_depth` is refused: local token files are read by
/// `pread`, which it would not change.
fn remote_stream(
    py: Python<'_>,
    url: Option<&str>,
    name: &str,
    dtype: Option<TokenDType>,
    store: &StoreOptions,
    queue_depth: Option<u32>,
) -> PyResult<Option<Arc<tokens::TokenStream>>> {
    let Some(url) = url else {
        return match queue_depth {
            Some(_) => Err(value_error(
                py,
                "Config",
                format!(
                    "{name}: queue_depth applies to token data in object storage (s3://, \
                     gs://, az://, https://) only"
                ),
            )),
            None => Ok(None),
        };
    };
    let read = ReadOptions {
        queue_depth: queue_depth.unwrap_or(pinfeed_source::DEFAULT_QUEUE_DEPTH),
        ..ReadOptions::default()
    };
    let stream = py.detach(|| pinfeed_store::open_tokens(url, dtype, &read, store));
    Ok(Some(Arc::new(
        stream.map_err(|e| with_name(name, e)).py_err(py)?,
    )))
}

/// `e` as raised, led by the data's `name` unless its message names the data or its index.
fn with_name(name: &str, e: SourceError) -> Raised {
    let mut raised = source_error(&e);
    if !raised.message.contains(name) && !raised.message.contains(".idx") {
        raised.message = format!("{name}: {}", raised.message);
    }
    raised
}

/// The token offsets of random windows ``first .. first + count`` under ``(seed, epoch)``, with
/// ``num_offsets`` (``num_tokens - seq_len``) places a window can start: what
/// ``open_tokens(sample="random")`` reads, for checks. Step ``i`` of rank ``r`` reads windows
/// ``(i × world_size + r) × batch_size ..`` of them.
#[pyfunction]
#[pyo3(signature = (seed, epoch, num_offsets, first, count))]
pub(crate) fn token_offsets(
    py: Python<'_>,
    seed: u64,
    epoch: u64,
    num_offsets: u64,
    first: u64,
    count: u64,
) -> PyResult<Vec<u64>> {
    if num_offsets == 0 || first.checked_add(count).is_none() {
        return Err(value_error(
            py,
            "Config",
            "token_offsets: num_offsets must be at least 1 and first + count below 2^64",
        ));
    }
    Ok((first..first + count)
        .map(|v| sampled_offset(seed, epoch, num_offsets, v))
        .collect())
}

/// The documents ``0 .. num_documents`` (a Megatron dataset's, or a table's rows) in the
/// shuffled order of ``(seed, epoch)``: ``open_tokens(sample="documents")`` concatenates them
/// in this order, empty ones left out. For checks.
#[pyfunction]
#[pyo3(signature = (seed, epoch, num_documents))]
pub(crate) fn document_order(seed: u64, epoch: u64, num_documents: u64) -> Vec<u64> {
    tokens::document_order(seed, epoch, num_documents)
}

/// The items ``0 .. sum(counts)`` (windows or documents of a table's column, numbered chunk by
/// chunk: chunk ``c`` holds ``counts[c]`` and decodes to ``bytes[c]`` bytes) in the
/// row-group-aware order of ``(seed, epoch)``: the chunks shuffled, cut into groups of
/// consecutive chunks of at most ``budget`` decoded bytes, and each group's items shuffled
/// among themselves. ``open_tokens`` orders a table column's sequential windows
/// (``shuffle="block"``) and its rows (``sample="documents"``) so, with half of
/// :func:`table_cache_limit` as the budget. For checks.
#[pyfunction]
#[pyo3(signature = (seed, epoch, counts, bytes, budget))]
pub(crate) fn chunk_order(
    py: Python<'_>,
    seed: u64,
    epoch: u64,
    counts: Vec<u64>,
    bytes: Vec<u64>,
    budget: u64,
) -> PyResult<Vec<u64>> {
    if counts.len() != bytes.len() {
        return Err(value_error(
            py,
            "Config",
            format!(
                "chunk_order: {} counts and {} sizes; give one of each a chunk",
                counts.len(),
                bytes.len()
            ),
        ));
    }
    Ok(ChunkOrder::new(seed, epoch, &counts, &bytes, budget).into_items())
}

/// The bytes of decoded table chunks (row groups) that the process keeps at most, 1 GiB to
/// begin with (or ``$PINFEED_CHUNK_CACHE_BYTES``); with ``limit``, sets it (0 restores that
/// rule), lets go of chunks down to it and returns the setting it had (0 when none was set).
/// Row-group-aware orders opened later take their chunks by half this much.
#[pyfunction]
#[pyo3(signature = (limit=None))]
pub(crate) fn table_cache_limit(limit: Option<usize>) -> usize {
    match limit {
        Some(bytes) => pinfeed_source::table::set_cache_limit(bytes),
        None => pinfeed_source::table::cache_limit(),
    }
}
