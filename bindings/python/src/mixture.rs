//! Data mixtures: the blend of several sources, `pinfeed.TokenLoader`'s mixtures' Rust half.

use std::sync::Arc;

use pinfeed_source::mixture::{self, BlendMode, BlendSpec, Exhausted};
use pinfeed_source::rng::hash2;
use pinfeed_source::tokens::{TokenDType, Widened};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::errors::{value_error, ToPy};
use crate::loader::Source;

/// Adds this module's functions and classes to `_pinfeed`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Blend>()?;
    m.add_class::<Mixture>()?;
    m.add_function(wrap_pyfunction!(mixture_seed, m)?)?;
    m.add_function(wrap_pyfunction!(common_token_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(widen_tokens, m)?)
}

/// The schedule of a mixture: which source each sample of an epoch comes from, and its
/// ordinal there, a pure function of these arguments, the epoch and the sample's index.
///
/// ``names`` name the sources, ``pass_len`` their samples in one pass; ``weights`` is a
/// curriculum, ``[(from_step, [weight of each source]), ...]`` with the first at step 0;
/// ``mode`` ``"exact"`` (every step of ``step`` samples holds each source's rounded share, in
/// Megatron's order) or ``"sampled"`` (independent draws); ``exhausted`` one policy a
/// source: ``"cycle"``, ``"stop"``, ``{"samples": n}`` or ``{"passes": n}``;
/// ``samples_per_epoch`` the most samples an epoch holds.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub(crate) struct Blend {
    inner: Arc<mixture::Blend>,
    names: Vec<String>,
}

#[pymethods]
impl Blend {
    #[new]
    #[pyo3(signature = (names, pass_len, *, weights, exhausted, step, mode="exact", seed=0, samples_per_epoch=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        names: Vec<String>,
        pass_len: Vec<u64>,
        weights: Vec<(u64, Vec<f64>)>,
        exhausted: Vec<Bound<'_, PyAny>>,
        step: u64,
        mode: &str,
        seed: u64,
        samples_per_epoch: Option<u64>,
    ) -> PyResult<Blend> {
        let mode = match mode {
            "exact" => BlendMode::Exact,
            "sampled" => BlendMode::Sampled,
            other => {
                return Err(value_error(
                    py,
                    "Mixture",
                    format!("mixture: unknown mode {other:?}: expected \"exact\" or \"sampled\""),
                ))
            }
        };
        let exhausted = exhausted
            .iter()
            .zip(&names)
            .map(|(e, name)| policy(py, e, name))
            .collect::<PyResult<Vec<_>>>()?;
        let spec = BlendSpec {
            pass_len,
            exhausted,
            mode,
            seed,
            step,
            curriculum: weights,
            samples_per_epoch,
        };
        let inner = mixture::Blend::new(spec, &names).py_err(py)?;
        Ok(Blend {
            inner: Arc::new(inner),
            names,
        })
    }

    /// The mixture of ``sources`` (one loader source a name, in the order of ``names``, each
    /// with ``pass_len`` records) in ``epoch``; with ``shuffle`` each pass of a source in a new
    /// order.
    fn mixture(
        &self,
        py: Python<'_>,
        sources: Vec<PyRef<'_, Source>>,
        epoch: u64,
        shuffle: bool,
    ) -> PyResult<Mixture> {
        let sources: Vec<Arc<dyn pinfeed_source::Source>> =
            sources.iter().map(|s| Arc::clone(&s.inner)).collect();
        let names = self.names.clone();
        let inner = py
            .detach(|| {
                let blend = self.inner.epoch(epoch)?;
                mixture::Mixture::new(names, sources, blend, shuffle)
            })
            .py_err(py)?;
        Ok(Mixture {
            inner: Arc::new(inner),
        })
    }

    /// Samples each source gave in ``epoch`` before its sample ``i`` (at most the epoch's
    /// length), in the order of the names.
    fn given_before(&self, py: Python<'_>, epoch: u64, i: u64) -> PyResult<Vec<u64>> {
        let blend = py.detach(|| self.inner.epoch(epoch)).py_err(py)?;
        Ok(blend.given_before(i.min(blend.len())))
    }

    /// ``(samples, first_step)`` of ``epoch``: its length and the global step it starts at.
    fn epoch_size(&self, py: Python<'_>, epoch: u64) -> PyResult<(u64, u64)> {
        let blend = py.detach(|| self.inner.epoch(epoch)).py_err(py)?;
        Ok((blend.len(), blend.first_step()))
    }
}

/// A policy as Python gives it: ``"cycle"``, ``"stop"``, ``{"samples": n}`` or
/// ``{"passes": n}``.
fn policy(py: Python<'_>, e: &Bound<'_, PyAny>, name: &str) -> PyResult<Exhausted> {
    let refuse = || {
        value_error(
            py,
            "Mixture",
            format!(
                "mixture: source {name:?}: on_exhausted is \"cycle\", \"stop\", \
                 {{\"samples\": n}} or {{\"passes\": n}}, not {e}"
            ),
        )
    };
    if e.cast::<PyString>().is_ok() {
        return match e.extract::<String>()?.as_str() {
            "cycle" => Ok(Exhausted::Cycle),
            "stop" => Ok(Exhausted::Stop),
            _ => Err(refuse()),
        };
    }
    let dict = e.cast::<PyDict>().map_err(|_| refuse())?;
    if dict.len() != 1 {
        return Err(refuse());
    }
    let (key, value) = dict.iter().next().ok_or_else(refuse)?;
    let n: u64 = value.extract().map_err(|_| refuse())?;
    match key.extract::<String>().map_err(|_| refuse())?.as_str() {
        "samples" => Ok(Exhausted::Samples(n)),
        "passes" => Ok(Exhausted::Passes(n)),
        _ => Err(refuse()),
    }
}

/// One epoch of a mixture as a loader source (:meth:`source`), with what each of its sources
/// gave.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub(crate) struct Mixture {
    inner: Arc<mixture::Mixture>,
}

#[pymethods]
impl Mixture {
    /// The mixture as a loader source: record ``i`` is sample ``i`` of the epoch.
    fn source(&self) -> Source {
        Source {
            inner: Arc::clone(&self.inner) as Arc<dyn pinfeed_source::Source>,
            gpu_images: None,
        }
    }

    /// Samples in the epoch.
    #[getter]
    fn num_samples(&self) -> u64 {
        self.inner.blend().len()
    }

    /// ``(source, ordinal)`` of samples ``first .. first + count``.
    fn locate(&self, py: Python<'_>, first: u64, count: u64) -> PyResult<Vec<(u16, u64)>> {
        let len = self.inner.blend().len();
        if first.checked_add(count).is_none_or(|end| end > len) {
            return Err(value_error(
                py,
                "OutOfRange",
                format!("mixture: samples {first} + {count} past the epoch's {len}"),
            ));
        }
        Ok(py.detach(|| self.inner.blend().locate(first, count)))
    }

    /// The record of source ``s`` that its ordinal ``k`` of the epoch reads.
    fn record_of(&self, s: usize, k: u64) -> u64 {
        self.inner.record_of(s.min(self.inner.names().len() - 1), k)
    }

    /// What each source gave so far, in the order of the names: ``name``, ``samples``,
    /// ``bytes``, ``read_time`` (reader threads' time reading it), ``wait_time`` (the part
    /// spent waiting on object storage) and ``network`` (its fetch counters, or ``None``).
    fn source_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .source_stats()
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("name", &s.name)?;
                d.set_item("samples", s.samples)?;
                d.set_item("bytes", s.bytes)?;
                d.set_item("read_time", s.read_time.as_secs_f64())?;
                // What of it was spent waiting on object storage (none for local files).
                let waited = s.network.as_ref().map_or(0.0, |n| n.wait.as_secs_f64());
                d.set_item("wait_time", waited)?;
                d.set_item(
                    "network",
                    crate::store::network_dict(py, s.network.as_ref())?,
                )?;
                Ok(d)
            })
            .collect()
    }

    /// The source that holds a read-bound mixture back, in words (``None`` before any read).
    fn holding_back(&self) -> Option<String> {
        mixture::holding_back(&self.inner.source_stats())
    }
}

/// The seed of source ``name``'s own draws (random windows) in a mixture seeded ``seed``:
/// sources draw apart, and each keeps its draws when others join or leave.
#[pyfunction]
pub(crate) fn mixture_seed(seed: u64, name: &str) -> u64 {
    hash2(seed, mixture::source_key(name))
}

/// The narrowest token dtype (a numpy typestring) that holds every token of each of
/// ``typestrs``: what a mixture of sources stored at different widths is read as.
#[pyfunction]
pub(crate) fn common_token_dtype(py: Python<'_>, typestrs: Vec<String>) -> PyResult<String> {
    let dtypes = typestrs
        .iter()
        .map(|t| TokenDType::parse(t))
        .collect::<Result<Vec<_>, _>>()
        .py_err(py)?;
    TokenDType::common(&dtypes)
        .map(|d| d.typestr().to_owned())
        .map_err(|why| value_error(py, "Mixture", format!("mixture: {why}")))
}

/// ``source``'s token windows of ``from_dtype`` read as ``to_dtype`` tokens (typestrings),
/// widened in place in the slot.
#[pyfunction]
pub(crate) fn widen_tokens(
    py: Python<'_>,
    source: PyRef<'_, Source>,
    from_dtype: &str,
    to_dtype: &str,
) -> PyResult<Source> {
    let from = TokenDType::parse(from_dtype).py_err(py)?;
    let to = TokenDType::parse(to_dtype).py_err(py)?;
    let widened = Widened::new(Arc::clone(&source.inner), from, to).py_err(py)?;
    Ok(Source {
        inner: Arc::new(widened),
        gpu_images: None,
    })
}
