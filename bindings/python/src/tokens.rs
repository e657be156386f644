//! Token streams as loader sources: `pinfeed.TokenLoader`'s Rust half.

use std::path::PathBuf;

use pinfeed_source::tokens::{self, sampled_offset, Sample, TokenDType, TokenOptions};
use pinfeed_source::SourceError;
use pyo3::prelude::*;

use crate::errors::{source_error, value_error, ToPy};
use crate::loader::Source;

/// Adds this module's functions to `_pinfeed`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(token_offsets, m)?)
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
///   records, or 2^40 without ``steps``. With ``steps_per_batch`` k > 1 the records are
///   numbered for a loader batch of ``k × batch_size``: batch ``g`` holds rank
///   ``g % world_size``'s steps ``(g // world_size) × k ..``, each step's windows as they would
///   be with one step a batch (the count rounded up to whole loader batches).
/// - ``"sequential"``: consecutive windows every ``seq_len`` tokens (each window's last token
///   is the next one's first).
/// - ``"documents"`` (Megatron only): the documents in the shuffled order of ``(seed,
///   epoch)``, concatenated and cut as ``"sequential"``; each record is the window's tokens
///   followed by ``seq_len + 1`` uint16 segment ids (the ordinal of each token's document in
///   the window), as uint8 bytes.
#[pyfunction]
#[pyo3(signature = (
    path, *, seq_len, batch_size, dtype=None, sample="random", seed=0, steps=None,
    world_size=1, epoch=0, steps_per_batch=1
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
    let sample = sample
        .parse::<Sample>()
        .map_err(|message| value_error(py, "Config", format!("{name}: {message}")))?;
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
    };
    let opened = py
        .detach(|| tokens::open(&path, &options))
        .map_err(&named)
        .py_err(py)?;
    let stream = opened.stream();
    let info = (stream.dtype().typestr().to_owned(), stream.num_tokens());
    Ok((
        Source {
            inner: opened.source(),
            gpu_images: None,
        },
        info.0,
        info.1,
    ))
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
