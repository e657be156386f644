//! What a loader pass needs, read and checked once: [`StreamOptions`], built by the Python
//! `Loader` from its keywords. Every rule on those values (ranges, sizes, names) is here or in
//! the `pinfeed` crate, so Python only translates (a `torch.device` to a name, `True` to
//! `"random"`) and each rule has one message.

use std::sync::Arc;

use dlpark::ffi::DLDataType;
use pinfeed::{DeviceSpec, LoaderOptions, OrderSpec, Reader, Shuffle};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use crate::dlpack::dl_dtype_from_tuple;
use crate::errors::{type_error, value_error, ToPy};
use crate::loader::Source;

/// The integer arguments of every entry point and their ranges: one rule a name, used by
/// [`StreamOptions`] and by [`check_ints`] (`TokenLoader`, `ImageLoader`, states), so that
/// `seq_len=1.5`, `batch_size=True` or `epoch=-1` get one message wherever they are given.
const INT_RULES: &[(&str, u64, u64)] = &[
    ("batch_size", 1, usize::MAX as u64),
    ("seq_len", 1, u64::MAX - 1),
    ("steps", 1, u64::MAX),
    ("epochs", 1, u64::MAX),
    ("epoch", 0, u64::MAX),
    ("batches_done", 0, u64::MAX),
    ("consumed", 0, u64::MAX),
    ("seed", 0, u64::MAX),
    ("rank", 0, u64::MAX),
    ("world_size", 1, u64::MAX),
    ("prefetch", 1, usize::MAX as u64),
    ("num_threads", 1, usize::MAX as u64),
    ("queue_depth", 1, u32::MAX as u64),
    ("block_size", 1, u64::MAX),
    ("block_window", 1, u64::MAX),
    ("transform_out_bytes", 1, usize::MAX as u64),
    ("shape", 0, u64::MAX),
    ("num_samples", 0, u64::MAX),
    ("max_pixels", 1, u64::MAX),
    ("size", 1, u32::MAX as u64),
    ("resize", 1, u32::MAX as u64),
];

/// The range of the integer argument `name` (its last word after a space or dot, without an
/// index: `"state epoch"` is `epoch`'s, `"shape[1]"` is `shape`'s).
fn int_rule(name: &str) -> (u64, u64) {
    let word = name.rsplit([' ', '.']).next().unwrap_or(name);
    let key = word.split('[').next().unwrap_or(word);
    INT_RULES
        .iter()
        .find(|(n, ..)| *n == key)
        .map_or((0, u64::MAX), |&(_, min, max)| (min, max))
}

/// The keywords of one constructor, taken one by one; any left over is an error.
struct Keywords<'py> {
    dict: Bound<'py, PyDict>,
    /// The source's name, which every message starts with.
    source: String,
}

impl<'py> Keywords<'py> {
    /// The value of `name`, `None` when absent or `None`.
    fn take(&self, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let value = self.dict.get_item(name)?;
        if value.is_some() {
            self.dict.del_item(name)?;
        }
        Ok(value.filter(|v| !v.is_none()))
    }

    /// `name` as messages call it: after the source's name.
    fn label(&self, name: &str) -> String {
        format!("{}: {name}", self.source)
    }

    /// `name` in its [`INT_RULES`] range, `default` when absent.
    fn int(&self, name: &str, default: u64) -> PyResult<u64> {
        Ok(self.opt_int(name)?.unwrap_or(default))
    }

    fn opt_int(&self, name: &str) -> PyResult<Option<u64>> {
        let (min, max) = int_rule(name);
        self.take(name)?
            .map(|v| int_arg(&v, &self.label(name), min, max))
            .transpose()
    }

    fn flag(&self, name: &str) -> PyResult<bool> {
        self.take(name)?.map_or(Ok(false), |v| v.is_truthy())
    }

    fn text(&self, name: &str, default: &str) -> PyResult<String> {
        match self.take(name)? {
            None => Ok(default.to_owned()),
            Some(v) => v.extract::<String>().map_err(|_| {
                type_error(
                    v.py(),
                    format!(
                        "{} must be a string, not {}",
                        self.label(name),
                        type_name(&v)
                    ),
                )
            }),
        }
    }

    /// Fails on a keyword nobody took.
    fn finish(self, what: &str) -> PyResult<()> {
        match self.dict.keys().iter().next() {
            Some(key) => Err(type_error(
                self.dict.py(),
                format!("{what} got an unexpected keyword argument {key}"),
            )),
            None => Ok(()),
        }
    }
}

/// The name of `value`'s type, for messages.
fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// An int in `min ..= max`, from anything with `__index__` but a bool: a `PinfeedTypeError`
/// for another type (a float, a string, `None`), a `PinfeedValueError` naming `name` and the
/// range for one out of it.
pub(crate) fn int_arg(value: &Bound<'_, PyAny>, name: &str, min: u64, max: u64) -> PyResult<u64> {
    let py = value.py();
    let index = if value.is_instance_of::<PyBool>() {
        None
    } else {
        py.import("operator")?.call_method1("index", (value,)).ok()
    };
    let Some(index) = index else {
        return Err(type_error(
            py,
            format!("{name} must be an int, not {}", type_name(value)),
        ));
    };
    match index.extract::<i128>() {
        Ok(n) if n >= min as i128 && n <= max as i128 => Ok(n as u64),
        _ => Err(value_error(
            py,
            "Config",
            format!("{name} must be an int in {min} ..= {max}, got {index}"),
        )),
    }
}

/// The integer arguments ``values`` (``{name: value}``) checked by the rules every entry point
/// shares (``batch_size`` at least 1, ``epoch`` in ``0 ..= 2**64 - 1``, no bools, floats or
/// strings), in the same order; messages start with ``what`` (the source's name). A name
/// may carry a qualifier before its last word (``"state epoch"``).
#[pyfunction]
#[pyo3(signature = (what, **values))]
pub(crate) fn check_ints(what: &str, values: Option<Bound<'_, PyDict>>) -> PyResult<Vec<u64>> {
    let Some(values) = values else {
        return Ok(Vec::new());
    };
    values
        .iter()
        .map(|(name, value)| {
            let name = name.to_string();
            let (min, max) = int_rule(&name);
            let label = if what.is_empty() {
                name.clone()
            } else {
                format!("{what}: {name}")
            };
            int_arg(&value, &label, min, max)
        })
        .collect()
}

/// A size given as an int of bytes or a string such as "256MiB".
pub(crate) fn size_arg(value: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<usize>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(text) = value.extract::<String>() {
        return pinfeed::parse_size(&text)
            .map_err(|e| pinfeed::LoaderError::Config(format!("{what}: {e}")))
            .py_err(value.py())
            .map(Some);
    }
    if value.is_instance_of::<PyBool>() || value.call_method0("__index__").is_err() {
        return Err(type_error(
            value.py(),
            format!(
                "{what} must be an int (bytes) or a string such as \"256MiB\", not {}",
                type_name(value)
            ),
        ));
    }
    int_arg(value, what, 0, usize::MAX as u64).map(|n| Some(n as usize))
}

/// A device name: "cpu", "cuda", "cuda:N" or "auto".
pub(crate) fn device_arg(py: Python<'_>, device: &str) -> PyResult<DeviceSpec> {
    device
        .trim()
        .to_ascii_lowercase()
        .parse::<DeviceSpec>()
        .py_err(py)
}

/// A shuffle name (``"none"``, ``"random"``, ``"block"``) as a [`Shuffle`]; ``"block"`` needs
/// both sizes (the Python layer picks the defaults, which depend on the record size).
pub(crate) fn shuffle_arg(
    py: Python<'_>,
    name: &str,
    block: Option<u64>,
    window: Option<u64>,
) -> PyResult<Shuffle> {
    match name {
        "none" => Ok(Shuffle::None),
        "random" => Ok(Shuffle::Random),
        "block" => match (block, window) {
            (Some(block), Some(window)) => Ok(Shuffle::Block { block, window }),
            _ => Err(value_error(
                py,
                "Config",
                "block shuffling needs block_size and block_window",
            )),
        },
        other => Err(value_error(
            py,
            "Config",
            format!("unknown shuffle {other:?}: expected \"none\", \"random\" or \"block\""),
        )),
    }
}

/// Everything a pass of a loader needs but where it starts, checked: made once per `Loader`
/// from its keywords, then given to each [`Stream`](crate::loader::Stream).
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct StreamOptions {
    pub(crate) source: Arc<dyn pinfeed_source::Source>,
    /// The `pinfeed::Loader`'s options but the transform and the start, set per pass.
    pub(crate) loader: LoaderOptions,
    /// A built-in transform spec or a Python callable.
    pub(crate) transform: Option<Py<PyAny>>,
    pub(crate) transform_out_bytes: Option<usize>,
    pub(crate) export_dtype: DLDataType,
    pub(crate) record_shape: Vec<i64>,
    /// The devices of a replicated pass (`loader.device` is then not used).
    pub(crate) replicas: Option<Vec<DeviceSpec>>,
}

#[pymethods]
impl StreamOptions {
    /// Reads and checks the options of a pass over ``source``: ``batch_size``, ``export_dtype``
    /// (DLPack ``(code, bits, lanes)``) and ``record_shape`` (which must cover a delivered
    /// record exactly), and the keywords ``drop_last``, ``epochs``, ``pinned_budget``,
    /// ``device_budget``, ``num_threads``, ``device``, ``prefetch``, ``piece_size`` (``None``:
    /// whole batches), ``transform``, ``transform_out_bytes``, ``reader``, ``shuffle``,
    /// ``block_size``, ``block_window``, ``seed``, ``rank``, ``world_size`` and ``devices``
    /// (device names: each batch is read once and copied to every one of them).
    #[new]
    #[pyo3(signature = (source, batch_size, *, export_dtype, record_shape, **options))]
    fn new(
        py: Python<'_>,
        source: &Source,
        batch_size: &Bound<'_, PyAny>,
        export_dtype: (u8, u8, u16),
        record_shape: Vec<i64>,
        options: Option<Bound<'_, PyDict>>,
    ) -> PyResult<StreamOptions> {
        let kw = Keywords {
            dict: options.map_or_else(|| PyDict::new(py), |d| d.copy().unwrap_or(d)),
            source: source.inner.name().to_owned(),
        };
        let (min, max) = int_rule("batch_size");
        let batch_size = int_arg(batch_size, &kw.label("batch_size"), min, max)? as usize;
        let loader = LoaderOptions {
            batch_size,
            gpu_images: source.gpu_images.clone(),
            ..loader_options(py, &kw)?
        };
        let transform = kw.take("transform")?.map(Bound::unbind);
        let transform_out_bytes = kw.opt_int("transform_out_bytes")?.map(|n| n as usize);
        let replicas = kw
            .take("devices")?
            .map(|names| {
                names
                    .extract::<Vec<String>>()?
                    .iter()
                    .map(|name| device_arg(py, name))
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        kw.finish("StreamOptions")?;
        Ok(StreamOptions {
            source: Arc::clone(&source.inner),
            loader,
            transform,
            transform_out_bytes,
            export_dtype: dl_dtype_from_tuple(export_dtype),
            record_shape,
            replicas,
        })
    }

    /// The options of the GPU-resident mode's upload: every record once, in file order, on one
    /// rank, in batches of ``batch_size``, with no device budget (the resident copy is bounded
    /// apart).
    fn upload(&self, py: Python<'_>, batch_size: &Bound<'_, PyAny>) -> PyResult<StreamOptions> {
        let (min, max) = int_rule("batch_size");
        let batch_size = int_arg(batch_size, "batch_size", min, max)? as usize;
        Ok(StreamOptions {
            source: Arc::clone(&self.source),
            loader: LoaderOptions {
                batch_size,
                drop_last: false,
                epochs: 1,
                device_budget: None,
                shuffle: Shuffle::None,
                rank: 0,
                world_size: 1,
                ..self.loader.clone()
            },
            transform: self.transform.as_ref().map(|t| t.clone_ref(py)),
            transform_out_bytes: self.transform_out_bytes,
            export_dtype: self.export_dtype,
            record_shape: self.record_shape.clone(),
            replicas: self.replicas.clone(),
        })
    }

    /// Records in a batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.loader.batch_size
    }

    /// Epochs a pass runs.
    #[getter]
    fn epochs(&self) -> u64 {
        self.loader.epochs
    }

    /// Whether each epoch's last, partial batch is dropped.
    #[getter]
    fn drop_last(&self) -> bool {
        self.loader.drop_last
    }

    /// The order's seed.
    #[getter]
    fn seed(&self) -> u64 {
        self.loader.seed
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u64 {
        self.loader.rank
    }

    /// Ranks sharing each epoch.
    #[getter]
    fn world_size(&self) -> u64 {
        self.loader.world_size
    }

    /// Bytes page-locked at most, per pass.
    #[getter]
    fn pinned_budget(&self) -> usize {
        self.loader.pinned_budget
    }

    /// Device bytes the batches (or the resident copy) may hold, ``None`` for no bound.
    #[getter]
    fn device_budget(&self) -> Option<usize> {
        self.loader.device_budget
    }

    /// The device asked for: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        self.loader.device.to_string()
    }

    /// The Rust ``OrderSpec::fingerprint()`` of the order: a hash of everything but the rank
    /// and the epoch that decides which records each batch holds.
    #[getter]
    fn fingerprint(&self) -> u64 {
        order_spec(self.source.num_records(), &self.loader).fingerprint()
    }

    /// The fingerprint the same order would have at ``world_size`` ranks: what a state saved
    /// at that world size carries when it was saved with these options otherwise.
    fn fingerprint_at(&self, world_size: u64) -> u64 {
        let mut spec = order_spec(self.source.num_records(), &self.loader);
        spec.world_size = world_size;
        spec.fingerprint()
    }

    /// Raises :class:`pinfeed.PinfeedError` when called on a reader thread inside these
    /// options' own transform: a new iteration there would stop the pass that thread serves.
    /// For ``Loader.__iter__``, before it changes anything.
    fn check_iter(&self, py: Python<'_>) -> PyResult<()> {
        crate::transform::refuse_inside(
            py,
            self.source.name(),
            self.transform.as_ref(),
            crate::transform::PassCall::Iter,
        )
    }

    fn __repr__(&self) -> String {
        format!("StreamOptions({:?})", self.loader)
    }
}

/// The shared options of a pass, checked by their [`INT_RULES`] (the batch size and the
/// source's parts are the caller's).
fn loader_options(py: Python<'_>, kw: &Keywords<'_>) -> PyResult<LoaderOptions> {
    let pinned_budget = size_arg(
        kw.take("pinned_budget")?.as_ref(),
        &kw.label("pinned_budget"),
    )?
    .unwrap_or(pinfeed::DEFAULT_PINNED_BUDGET);
    let device_budget = size_arg(
        kw.take("device_budget")?.as_ref(),
        &kw.label("device_budget"),
    )?;
    let reader = kw
        .text("reader", "auto")?
        .parse::<Reader>()
        .map_err(|e| value_error(py, "Config", e.to_string()))?;
    let block_size = kw.opt_int("block_size")?;
    let block_window = kw.opt_int("block_window")?;
    Ok(LoaderOptions {
        drop_last: kw.flag("drop_last")?,
        epochs: kw.int("epochs", 1)?,
        pinned_budget,
        device_budget,
        num_threads: kw.opt_int("num_threads")?.map(|n| n as usize),
        device: device_arg(py, &kw.text("device", "auto")?)?,
        prefetch: kw.int("prefetch", 4)? as usize,
        piece_bytes: piece_size(py, kw)?,
        // Parsed once, here: only register changes how batches reach the device; the others
        // are ways of reading into the pinned slots, chosen when the source opened.
        reader,
        shuffle: shuffle_arg(py, &kw.text("shuffle", "none")?, block_size, block_window)?,
        seed: kw.int("seed", 0)?,
        rank: kw.int("rank", 0)?,
        world_size: kw.int("world_size", 1)?,
        ..LoaderOptions::default()
    })
}

/// `piece_size`: bytes of a piece of a batch, `None` for whole batches.
fn piece_size(py: Python<'_>, kw: &Keywords<'_>) -> PyResult<Option<usize>> {
    let Some(size) = kw.take("piece_size")? else {
        return Ok(None);
    };
    match size_arg(Some(&size), &kw.label("piece_size"))? {
        Some(0) | None => Err(value_error(
            py,
            "Config",
            format!(
                "{}: piece_size must be at least 1 byte (or None), got {size}",
                kw.source
            ),
        )),
        some => Ok(some),
    }
}

/// The order of a pass with `options` over `num_records` records.
pub(crate) fn order_spec(num_records: u64, options: &LoaderOptions) -> OrderSpec {
    OrderSpec {
        num_records,
        batch_size: options.batch_size as u64,
        drop_last: options.drop_last,
        shuffle: options.shuffle,
        seed: options.seed,
        rank: options.rank,
        world_size: options.world_size,
    }
}

/// ``(rank, world_size, pinned_budget)`` of device ``index`` of ``devices`` in rank ``rank`` of
/// ``world_size`` when the devices split each epoch: ``pinfeed::DeviceShare::split``, the
/// process's budget (``None``: the default) divided among the devices.
#[pyfunction]
#[pyo3(signature = (rank, world_size, devices, index, pinned_budget=None))]
pub(crate) fn device_share(
    py: Python<'_>,
    rank: &Bound<'_, PyAny>,
    world_size: &Bound<'_, PyAny>,
    devices: usize,
    index: usize,
    pinned_budget: Option<Bound<'_, PyAny>>,
) -> PyResult<(u64, u64, usize)> {
    let rank = int_arg(rank, "rank", 0, u64::MAX)?;
    let world_size = int_arg(world_size, "world_size", 1, u64::MAX)?;
    let budget = size_arg(pinned_budget.as_ref(), "pinned_budget")?
        .unwrap_or(pinfeed::DEFAULT_PINNED_BUDGET);
    let share = pinfeed::DeviceShare::split(rank, world_size, budget, devices, index).py_err(py)?;
    Ok((share.rank, share.world_size, share.pinned_budget))
}

/// A byte size given as an int or a string such as ``"256MiB"`` (``None`` stays ``None``),
/// checked as the loader checks ``what``.
#[pyfunction]
#[pyo3(signature = (value, what="size"))]
pub(crate) fn byte_size(value: Option<Bound<'_, PyAny>>, what: &str) -> PyResult<Option<usize>> {
    size_arg(value.as_ref(), what)
}

/// What limits a pipeline, from its wall time, items delivered and where the copy stage and the
/// consumer waited (seconds), by the one rule (``pinfeed::StageTimes``): ``(kind, line)``,
/// ``kind`` being ``"consumer"``, ``"read"`` (the producer: readers, or prefetch's iterable),
/// ``"copy"`` or ``"unknown"``, and ``line`` the verdict in words, naming the stages
/// ``producer`` and ``copier``.
#[pyfunction]
#[pyo3(signature = (
    *, elapsed, delivered, consumer_wait, copy_starved, copy_blocked,
    producer="the producer", copier="the copy stage"
))]
#[allow(clippy::too_many_arguments)] // keyword-only: each is a named measurement
pub(crate) fn bottleneck(
    elapsed: f64,
    delivered: u64,
    consumer_wait: f64,
    copy_starved: f64,
    copy_blocked: f64,
    producer: &str,
    copier: &str,
) -> (&'static str, String) {
    let secs = |s: f64| {
        std::time::Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(std::time::Duration::MAX)
    };
    let times = pinfeed::StageTimes {
        elapsed: secs(elapsed),
        items: delivered,
        consumer_wait: secs(consumer_wait),
        copy_starved: secs(copy_starved),
        copy_blocked: Some(secs(copy_blocked)),
        network: None,
    };
    let kind = match times.bottleneck() {
        pinfeed::Bottleneck::Consumer => "consumer",
        pinfeed::Bottleneck::Read => "read",
        pinfeed::Bottleneck::Copy => "copy",
        _ => "unknown",
    };
    (kind, times.explain(producer, copier))
}
