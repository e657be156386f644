//! Token streams as loader sources: `pinfeed.TokenLoader`'s Rust half.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed_source::tokens::{
    sampled_offset, DocumentPlan, DocumentWindows, IndexedDataset, SampledWindows, TokenDType,
    TokenStream, TokenWindows,
};
use pinfeed_source::SourceError;
use pyo3::prelude::*;

use crate::errors::{source_error, value_error, ToPy};
use crate::loader::Source;

/// Adds this module's functions to `_pinfeed`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(token_offsets, m)?)
}

/// Whether `path` names a Megatron indexed dataset: a `.idx`, a `.bin` beside its `.idx`, or a
/// prefix with a `.idx`.
fn is_indexed(path: &Path) -> bool {
    let with = |ext: &str| {
        let mut s = path.as_os_str().to_owned();
        s.push(ext);
        PathBuf::from(s)
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("idx") => true,
        Some("bin") => path.with_extension("idx").is_file(),
        _ => !path.is_dir() && with(".idx").is_file(),
    }
}

/// Opens a token dataset as a loader source whose records are windows of ``seq_len + 1``
/// tokens at their stored width, and returns it with the token dtype (a numpy typestring) and
/// the number of tokens.
///
/// ``path`` is a raw token file (nanoGPT's ``train.bin``; ``dtype`` required), a 1-D integer
/// ``.npy``, a directory or glob of them read as one stream, or a Megatron ``.bin``/``.idx``
/// pair (its dtype from the ``.idx``). ``sample``:
///
/// - ``"random"``: record ``v`` is the window at the uniformly random offset
///   :func:`token_offsets` gives for ``(seed, epoch, v)``; ``steps × batch_size × world_size``
///   records, or 2^40 without ``steps``.
/// - ``"sequential"``: consecutive windows every ``seq_len`` tokens (each window's last token
///   is the next one's first).
/// - ``"documents"`` (Megatron only): the documents in the shuffled order of ``(seed,
///   epoch)``, concatenated and cut as ``"sequential"``; each record is the window's tokens
///   followed by ``seq_len + 1`` uint16 segment ids (the ordinal of each token's document in
///   the window), as uint8 bytes.
#[pyfunction]
#[pyo3(signature = (
    path, *, seq_len, batch_size, dtype=None, sample="random", seed=0, steps=None,
    world_size=1, epoch=0
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
) -> PyResult<(Source, String, u64)> {
    let name = path.display().to_string();
    let named = |e: SourceError| {
        let mut raised = source_error(&e);
        if !raised.message.contains(&name) && !raised.message.contains(".idx") {
            raised.message = format!("{name}: {}", raised.message);
        }
        raised
    };
    let dtype = dtype
        .map(TokenDType::parse)
        .transpose()
        .map_err(&named)
        .py_err(py)?;
    let config = |message: String| value_error(py, "Config", format!("{name}: {message}"));
    if !matches!(sample, "random" | "sequential" | "documents") {
        return Err(config(format!(
            "unknown sample {sample:?}: expected \"random\", \"sequential\" or \"documents\""
        )));
    }
    let indexed = is_indexed(&path);
    if sample == "documents" && !indexed {
        return Err(config(
            "sample=\"documents\" needs a Megatron indexed dataset (a .bin beside its .idx)".into(),
        ));
    }
    let opened = py.detach(|| -> pinfeed_source::Result<_> {
        if !indexed {
            return Ok((Arc::new(TokenStream::open(&path, dtype)?), None));
        }
        let ds = IndexedDataset::open(&path)?;
        if let Some(asked) = dtype.filter(|&d| d != ds.dtype()) {
            return Err(SourceError::NoShards {
                dataset: ds.idx_path().display().to_string(),
                reason: format!(
                    "the index says {} tokens, but dtype {asked} was given",
                    ds.dtype()
                ),
            });
        }
        Ok((Arc::clone(ds.tokens()), Some(Arc::new(ds))))
    });
    let (stream, dataset) = opened.map_err(&named).py_err(py)?;
    let info = (stream.dtype().typestr().to_owned(), stream.num_tokens());
    let inner: Arc<dyn pinfeed_source::Source> = match (sample, dataset) {
        ("sequential", _) => Arc::new(
            TokenWindows::new(stream, seq_len, seq_len.max(1))
                .map_err(&named)
                .py_err(py)?,
        ),
        ("random", _) => {
            let len = match steps {
                None => SampledWindows::ENDLESS,
                Some(s) => s
                    .checked_mul(batch_size)
                    .and_then(|n| n.checked_mul(world_size))
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        config(format!(
                            "steps × batch_size × world_size must be between 1 and 2^64 - 1 \
                             (got {s} × {batch_size} × {world_size})"
                        ))
                    })?,
            };
            Arc::new(
                SampledWindows::new(stream, seq_len, seed, epoch, len)
                    .map_err(&named)
                    .py_err(py)?,
            )
        }
        ("documents", Some(ds)) => {
            let built = py
                .detach(|| DocumentPlan::new(ds, seq_len, seed, epoch))
                .and_then(DocumentWindows::new);
            Arc::new(built.map_err(&named).py_err(py)?)
        }
        _ => {
            return Err(config(
                "sample=\"documents\" needs a Megatron indexed dataset".into(),
            ))
        }
    };
    Ok((Source { inner }, info.0, info.1))
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
