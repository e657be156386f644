//! Sources and loader passes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dlpark::ffi::DLDataType;
use pinfeed::{Loader, LoaderError, LoaderOptions, Position, Stats, Transform};
use pinfeed_source::{dtype::parse_user_dtype, DType, HostBuffer, Layout};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dlpack::{dl_dtype, element_bytes, BatchInfo, DeviceBuffer};
use crate::errors::{loader_error, source_error, value_error, Kind, Raised, ToPy};
use crate::fork::{self, ForkSafe};
use crate::options::{int_arg, order_spec, size_arg, StreamOptions};
use crate::transform::{refuse_inside, Normalize, PassCall, PyTransform, ToFloat};
use crate::{array_memory, drop_detached, lock};

/// A dataset of fixed-size records: a `.npy` or raw record file, or a numpy array.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct Source {
    pub(crate) inner: Arc<dyn pinfeed_source::Source>,
    /// With `decode="gpu"`: the decoder of `inner`'s compressed image records, whose delivered
    /// records are the CPU path's size.
    pub(crate) gpu_images: Option<Arc<pinfeed::GpuImageDecode>>,
}

#[pymethods]
impl Source {
    /// Opens a `.npy` file, or a raw record file of the given record dtype and shape.
    ///
    /// ``descr`` is a numpy descr literal (``repr(numpy.lib.format.dtype_to_descr(dt))``);
    /// ``user_dtype`` is pinfeed's dtype syntax (``"3,31,31B"``, ``"f32"``, ``"<u8"``);
    /// ``shape`` is the per-record shape, to which a sub-array shape in ``user_dtype`` is
    /// appended. Both are ignored for `.npy` files, whose header says.
    /// A directory or glob of `.npy` shards and `.safetensors` files (``tensor`` names the
    /// tensor) open as one dataset. ``reader`` picks how files are read: ``"pread"`` (also for
    /// ``"register"``, which reads through a mapping instead), ``"mmap"`` (``pread`` for ranges,
    /// shuffled batches copied out of a read-only mapping of the file), ``"direct"``
    /// (``O_DIRECT``), ``"uring"`` (io_uring, ``queue_depth`` reads in flight, ``read_size``
    /// bytes each), or ``"auto"``: ``"mmap"`` for files mostly page-cached or smaller than half
    /// the memory available, ``O_DIRECT`` for larger cold ones.
    /// A URL (``s3://bucket/prefix/``, a glob of objects, ``gs://``, ``az://``, ``https://``)
    /// is read from object storage by ranged GETs, ``queue_depth`` in flight over all reader
    /// threads, as ``storage_options`` (str to str) say, with an optional block cache in
    /// ``cache_dir`` of at most ``cache_limit`` bytes.
    #[staticmethod]
    #[pyo3(signature = (path, *, descr=None, user_dtype=None, shape=None, reader="auto", read_size=None, queue_depth=None, tensor=None, storage_options=None, cache_dir=None, cache_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        descr: Option<&str>,
        user_dtype: Option<&str>,
        shape: Option<Vec<u64>>,
        reader: &str,
        read_size: Option<Bound<'_, PyAny>>,
        queue_depth: Option<u32>,
        tensor: Option<String>,
        storage_options: Option<std::collections::BTreeMap<String, String>>,
        cache_dir: Option<PathBuf>,
        cache_limit: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Source> {
        let url = path.to_str().filter(|p| pinfeed_store::is_url(p));
        let store = crate::store::store_options(
            py,
            url.is_some(),
            storage_options,
            cache_dir,
            cache_limit.as_ref(),
        )?;
        let named = |e: pinfeed_source::SourceError| {
            let mut raised = source_error(&e);
            let name = path.display().to_string();
            if !raised.message.contains(&name) {
                raised.message = format!("{name}: {}", raised.message);
            }
            raised
        };
        let (layout, shape_given) = given_layout(descr, user_dtype, shape.as_ref())
            .map_err(named)
            .py_err(py)?;
        let reader: pinfeed_source::Reader = reader
            .parse()
            .map_err(|e: pinfeed_source::UnknownReader| value_error(py, "Config", e.to_string()))?;
        let mut format = pinfeed_source::FormatOptions::new();
        if let Some(tensor) = tensor {
            format.set("tensor", tensor);
        }
        let read = pinfeed_source::ReadOptions {
            reader: match url {
                Some(_) => pinfeed_source::Reader::Pread,
                None => py.detach(|| reader.resolve(&path).0),
            },
            read_size: size_arg(read_size.as_ref(), "read_size")?
                .unwrap_or(pinfeed_source::DEFAULT_READ_SIZE),
            queue_depth: queue_depth.unwrap_or(pinfeed_source::DEFAULT_QUEUE_DEPTH),
            format,
        };
        let opened = py.detach(|| match url {
            Some(url) => pinfeed_store::open(url, layout.clone(), &read, &store)
                .map(|s| Box::new(s) as Box<dyn pinfeed_source::Source>),
            None => pinfeed_source::open_with(&path, layout.clone(), &read),
        });
        let inner: Box<dyn pinfeed_source::Source> = opened.map_err(named).py_err(py)?;
        check_header(
            py,
            &path,
            inner.layout(),
            layout.as_ref(),
            shape_given,
            shape,
        )?;
        Ok(Source {
            inner: Arc::from(inner),
            gpu_images: None,
        })
    }

    /// Wraps a C-contiguous numpy array (or memmap) without copying: its first dimension is the
    /// records. The array is kept alive, and must not be written, while the source lives.
    #[staticmethod]
    fn from_array(py: Python<'_>, array: &Bound<'_, PyAny>, descr: &str) -> PyResult<Source> {
        let (address, nbytes, shape) = array_memory(py, array)?;
        if shape.is_empty() {
            return Err(value_error(
                py,
                "Layout",
                "a 0-d array holds no records: the first dimension is the record index",
            ));
        }
        let dtype = DType::from_descr_literal(descr).py_err(py)?;
        let layout = Layout::new(dtype, shape[1..].to_vec()).py_err(py)?;
        let want = (shape[0] as u128) * layout.record_bytes() as u128;
        if want != nbytes as u128 {
            return Err(value_error(
                py,
                "Layout",
                format!("array of shape {shape:?} holds {nbytes} bytes, but records of dtype {} take {want}", layout.dtype),
            ));
        }
        let owner: Py<PyAny> = array.clone().unbind();
        // SAFETY: `address .. address + nbytes` is the array's data (numpy's array interface),
        // valid for reads while the array lives; the owner keeps it alive as long as the
        // buffer. That nobody writes it meanwhile is the documented contract of this function.
        let buffer =
            unsafe { HostBuffer::from_raw(address as *const u8, nbytes, layout, Box::new(owner)) }
                .py_err(py)?;
        Ok(Source {
            inner: Arc::new(buffer),
            gpu_images: None,
        })
    }

    /// What errors call the source: the file path, or "host buffer".
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_owned()
    }

    /// Records in the dataset.
    /// A hash of the dataset's layout, size and a few records spread across it
    /// (``pinfeed_source::data_fingerprint``): a resume state names the data it was saved on.
    fn data_fingerprint(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || pinfeed_source::data_fingerprint(inner.as_ref()))
            .map_err(|e| source_error(&e).into_pyerr(py))
    }

    #[getter]
    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }

    /// Bytes in one record as delivered (with GPU image decoding, the decoded record's).
    #[getter]
    fn record_bytes(&self) -> usize {
        match &self.gpu_images {
            Some(g) => g.output_record_bytes(),
            None => self.inner.layout().record_bytes(),
        }
    }

    /// The shape of one record as delivered.
    #[getter]
    fn record_shape(&self) -> Vec<u64> {
        match &self.gpu_images {
            Some(g) => vec![g.output_record_bytes() as u64],
            None => self.inner.layout().shape.clone(),
        }
    }

    /// The element dtype as a numpy descr literal.
    #[getter]
    fn descr(&self) -> String {
        self.inner.layout().dtype.descr.clone()
    }

    /// The names of a table's columns, in record order, or ``None`` for other sources.
    #[getter]
    fn columns(&self) -> Option<Vec<String>> {
        let columns = self.inner.columns()?;
        Some(columns.iter().map(|c| c.name.clone()).collect())
    }

    /// The DLPack ``(code, bits, lanes)`` of the element dtype, or ``None`` when DLPack has
    /// none (structured dtypes, strings, dates).
    #[getter]
    fn dlpack_dtype(&self) -> Option<(u8, u8, u16)> {
        dl_dtype(&self.inner.layout().dtype).map(|d| (d.code.0, d.bits, d.lanes))
    }

    fn __repr__(&self) -> String {
        let l = self.inner.layout();
        format!(
            "Source({:?}, records={}, dtype={}, record_shape={:?})",
            self.inner.name(),
            self.inner.num_records(),
            l.dtype,
            l.shape
        )
    }
}

/// `pinfeed.transforms.ToFloat`: records as float32 times ``scale``, in Rust on the reader
/// threads (no GIL).
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct ToFloatSpec {
    #[pyo3(get)]
    scale: f32,
}

#[pymethods]
impl ToFloatSpec {
    #[new]
    #[pyo3(signature = (scale = 1.0 / 255.0))]
    fn new(scale: f64) -> ToFloatSpec {
        ToFloatSpec {
            scale: scale as f32,
        }
    }

    fn __repr__(&self) -> String {
        format!("ToFloat(scale={})", self.scale)
    }
}

/// `pinfeed.transforms.Normalize`: ``(x * scale - mean[c]) / std[c]`` per channel ``c`` (the
/// record shape's first dimension) as float32, in Rust on the reader threads (no GIL).
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct NormalizeSpec {
    #[pyo3(get)]
    mean: Vec<f32>,
    #[pyo3(get)]
    std: Vec<f32>,
    #[pyo3(get)]
    scale: f32,
}

#[pymethods]
impl NormalizeSpec {
    #[new]
    #[pyo3(signature = (mean, std, *, scale = 1.0))]
    fn new(mean: Vec<f32>, std: Vec<f32>, scale: f64) -> NormalizeSpec {
        NormalizeSpec {
            mean,
            std,
            scale: scale as f32,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Normalize(mean={:?}, std={:?}, scale={})",
            self.mean, self.std, self.scale
        )
    }
}

/// One pass of a loader over its source: a Rust `Loader` whose batches come out as
/// [`DeviceBuffer`]s. Made anew for each pass.
#[pyclass(module = "pinfeed._pinfeed", frozen, weakref)]
pub struct Stream {
    /// `None` once the pass finished, failed or was closed.
    loader: Mutex<Option<ForkSafe<Loader>>>,
    /// The process that started the pass.
    pid: u32,
    export_dtype: DLDataType,
    record_shape: Vec<i64>,
    /// ``"cpu"`` or ``"cuda:N"`` (the first device of a replicated pass).
    #[pyo3(get)]
    device: String,
    /// Every device batches go to: ``[device]``, or those of a replicated pass, whose batches
    /// come one per device per step, in this order.
    #[pyo3(get)]
    devices: Vec<String>,
    /// Batches over all epochs.
    #[pyo3(get)]
    num_batches: u64,
    /// Batches per epoch.
    #[pyo3(get)]
    batches_per_epoch: u64,
    /// Bytes of one delivered record (after the transform).
    #[pyo3(get)]
    record_bytes: usize,
    source_name: String,
    /// The Rust ``OrderSpec::fingerprint()`` of the pass's order: a hash of everything but the
    /// rank and the epoch that decides which records each batch holds.
    #[pyo3(get)]
    fingerprint: u64,
    /// Counters at the end of the pass, with the device bytes then held.
    final_stats: Mutex<Option<(Stats, usize)>>,
    transform: Option<Arc<PyTransform>>,
    /// Set when `close()` stopped the pass before its end: asking it for a batch then raises,
    /// also in a `next()` that was already waiting (on another thread) when it was closed.
    cut: AtomicBool,
}

/// Refuses an export dtype and record shape whose size is not the records' bytes.
fn check_export_layout(
    export_dtype: DLDataType,
    record_shape: &[i64],
    record_bytes: usize,
) -> Result<(), String> {
    let elements = record_shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    if elements.and_then(|n| n.checked_mul(element_bytes(export_dtype))) == Some(record_bytes) {
        return Ok(());
    }
    Err(format!(
        "records of {record_bytes} bytes cannot be viewed as shape {record_shape:?} of {}-bit \
         elements; check the dtype and shape (and the transform's output dtype and shape)",
        export_dtype.bits as usize * export_dtype.lanes as usize
    ))
}

#[pymethods]
impl Stream {
    /// Starts a pass with ``options`` at epoch ``start_epoch``, after its first
    /// ``start_batches_done`` batches (of the split of the rest after ``start_consumed``
    /// records of its global order: an elastic resume, see ``reshard_position``): makes the pinned ring and starts the reader and copy
    /// threads (without the GIL). Batches export as ``options``' export dtype and
    /// ``(records, *record_shape)``.
    ///
    /// With the ``devices`` of a replicated pass each batch is read once and copied to every
    /// one of them (``MultiLoader::replicated``): the pass yields the batches of each step one
    /// after the other, in the order of ``devices``.
    #[new]
    #[pyo3(signature = (options, *, start_epoch=None, start_batches_done=None, start_consumed=None))]
    fn new(
        py: Python<'_>,
        options: &StreamOptions,
        start_epoch: Option<Bound<'_, PyAny>>,
        start_batches_done: Option<Bound<'_, PyAny>>,
        start_consumed: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Stream> {
        let at = |value: Option<Bound<'_, PyAny>>, name| {
            value.map_or(Ok(0), |v| int_arg(&v, name, 0, u64::MAX))
        };
        let start = Position {
            epoch: at(start_epoch, "epoch")?,
            batches_done: at(start_batches_done, "batches_done")?,
            consumed: at(start_consumed, "consumed")?,
        };
        let src = Arc::clone(&options.source);
        let source_name = src.name().to_owned();
        refuse_inside(py, &source_name, options.transform.as_ref(), PassCall::Iter)?;
        let named = |message: String| {
            if message.contains(&source_name) {
                message
            } else {
                format!("{source_name}: {message}")
            }
        };
        let (transform, py_transform) = build_transform(py, options, &named)?;
        let out_record_bytes = match (&transform, &options.loader.gpu_images) {
            (Some(t), _) => t.output_record_bytes(),
            (None, Some(g)) => g.output_record_bytes(),
            (None, None) => src.layout().record_bytes(),
        };
        let (export_dtype, record_shape) = (options.export_dtype, options.record_shape.clone());
        check_export_layout(export_dtype, &record_shape, out_record_bytes)
            .map_err(|message| value_error(py, "Layout", named(message)))?;
        let fingerprint = order_spec(src.num_records(), &options.loader).fingerprint();
        let loader_options = LoaderOptions {
            transform,
            start,
            ..options.loader.clone()
        };
        let replicas = options.replicas.clone();
        let started = py.detach(move || match replicas {
            None => Loader::new(src, loader_options),
            Some(devices) => Loader::replicated(src, loader_options, &devices),
        });
        let loader = started.map_err(|e| {
            let mut raised = loader_error(&e);
            raised.message = named(raised.message);
            raised.into_pyerr(py)
        })?;
        Ok(Stream {
            pid: fork::pid(),
            export_dtype,
            record_shape,
            device: loader.device().to_string(),
            devices: loader.devices().iter().map(|d| d.to_string()).collect(),
            num_batches: loader.num_batches(),
            batches_per_epoch: loader.batches_per_epoch(),
            record_bytes: loader.record_bytes(),
            source_name,
            fingerprint,
            final_stats: Mutex::new(None),
            transform: py_transform,
            cut: AtomicBool::new(false),
            loader: Mutex::new(Some(ForkSafe::new(loader))),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (waiting without the GIL); the pass ends with ``StopIteration``.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<DeviceBuffer>> {
        if fork::pid() != self.pid {
            return Err(Raised::new(
                Kind::Base,
                "Forked",
                format!(
                    "{}: this loader pass was started in process {} and cannot run in forked child {}; \
                     create the Loader in the child (e.g. in a DataLoader worker_init_fn)",
                    self.source_name,
                    self.pid,
                    fork::pid()
                ),
            )
            .into_pyerr(py));
        }
        let transform = self.transform.as_ref().map(|t| t.caller());
        refuse_inside(py, &self.source_name, transform, PassCall::Next)?;
        // Wait in short slices with the GIL released, checking for Ctrl-C between them, so that
        // KeyboardInterrupt interrupts a wait for a slow source. The end or an error finishes
        // the pass under the same lock, so a batch costs one release of the GIL, not two.
        let step = loop {
            let waited = py.detach(|| {
                let mut guard = lock(&self.loader);
                let next = match guard.as_mut() {
                    Some(l) => l.next_within(std::time::Duration::from_millis(50)),
                    None => pinfeed::Waited::Ready(None),
                };
                if let pinfeed::Waited::Ready(None | Some(Err(_))) = next {
                    self.finish(&mut guard);
                }
                next
            });
            match waited {
                pinfeed::Waited::TimedOut => py.check_signals()?,
                pinfeed::Waited::Ready(next) => break next.transpose(),
            }
        };
        match step {
            Ok(Some(batch)) => {
                let info = BatchInfo {
                    epoch: batch.epoch(),
                    index: batch.index(),
                    first_record: batch.first_record(),
                    documents: batch.documents(),
                };
                let mut shape = Vec::with_capacity(self.record_shape.len() + 1);
                shape.push(batch.num_records() as i64);
                shape.extend_from_slice(&self.record_shape);
                DeviceBuffer::new(Box::new(batch), shape, self.export_dtype, Some(info))
                    .map(Some)
                    .map_err(|m| value_error(py, "Layout", m))
            }
            // Closed before its end, maybe while this call waited: a cut pass raises, so that
            // its consumer does not take it for a finished one.
            Ok(None) if self.cut.load(Ordering::Acquire) => Err(Raised::new(
                Kind::Base,
                "Closed",
                format!(
                    "{}: this pass was closed before its end (close(), or a new iteration of \
                     its Loader, on another thread while this one waited for a batch); iterate \
                     the Loader again for a new pass",
                    self.source_name
                ),
            )
            .into_pyerr(py)),
            Ok(None) => Ok(None),
            Err(e) => Err(self.raise(py, e)),
        }
    }

    /// Stops the pass now: stops the threads and frees the pinned ring (batches already
    /// delivered stay valid).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if fork::pid() != self.pid {
            return Ok(());
        }
        let transform = self.transform.as_ref().map(|t| t.caller());
        refuse_inside(py, &self.source_name, transform, PassCall::Close)?;
        py.detach(|| {
            let mut guard = lock(&self.loader);
            if guard.is_some() {
                self.cut.store(true, Ordering::Release);
            }
            self.finish(&mut guard);
        });
        Ok(())
    }

    /// Whether the pass has finished, failed or been closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.loader).is_none()
    }

    /// The pass's counters as a dict (see ``pinfeed.Loader.stats``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.snapshot() {
            Some((stats, held)) => stats_dict(py, &stats, held),
            None => Ok(PyDict::new(py)),
        }
    }
}

impl Stream {
    /// The pass's counters and the device memory its batches hold: live while it runs in this
    /// process, else as it ended (`None` before it ended in another process).
    fn snapshot(&self) -> Option<(Stats, usize)> {
        let live = {
            let guard = lock(&self.loader);
            guard
                .as_ref()
                .filter(|l| l.is_owner())
                .map(|l| (l.stats(), l.device_bytes_held()))
        };
        live.or_else(|| lock(&self.final_stats).clone())
    }
}

/// The counters of passes running side by side (a split ``MultiLoader``'s, one a device, `None`
/// for a device with no pass yet): one dict by [`Stats::combine`]'s rules, the device memory
/// their batches hold summed, and each pass's own dict, all from one snapshot of each pass (so
/// the sums agree while the passes run). A dict is empty where there are no counters.
#[pyfunction]
pub fn combined_stats<'py>(
    py: Python<'py>,
    streams: Vec<Option<PyRef<'py, Stream>>>,
) -> PyResult<(Bound<'py, PyDict>, Vec<Bound<'py, PyDict>>)> {
    let snapshots: Vec<Option<(Stats, usize)>> = streams
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.snapshot()))
        .collect();
    let each = snapshots
        .iter()
        .map(|snap| match snap {
            Some((stats, held)) => stats_dict(py, stats, *held),
            None => Ok(PyDict::new(py)),
        })
        .collect::<PyResult<Vec<_>>>()?;
    let (parts, held): (Vec<Stats>, Vec<usize>) = snapshots.into_iter().flatten().unzip();
    let all = match Stats::combine(&parts) {
        Some(all) => stats_dict(py, &all, held.iter().sum())?,
        None => PyDict::new(py),
    };
    Ok((all, each))
}

/// The transform of a pass: a built-in (Rust, no GIL) or a Python callable, which is also
/// returned so that its exception can be chained onto the loader's error.
type BuiltTransform = (Option<Arc<dyn Transform>>, Option<Arc<PyTransform>>);

fn build_transform(
    py: Python<'_>,
    options: &StreamOptions,
    named: &dyn Fn(String) -> String,
) -> PyResult<BuiltTransform> {
    let Some(t) = options.transform.as_ref().map(|t| t.bind(py)) else {
        return Ok((None, None));
    };
    let layout = options.source.layout();
    if let Ok(spec) = t.cast::<ToFloatSpec>() {
        let t = ToFloat::new(layout, spec.get().scale)
            .map_err(|m| value_error(py, "Transform", named(m)))?;
        Ok((Some(Arc::new(t)), None))
    } else if let Ok(spec) = t.cast::<NormalizeSpec>() {
        let spec = spec.get();
        let t = Normalize::new(layout, &spec.mean, &spec.std, spec.scale)
            .map_err(|m| value_error(py, "Transform", named(m)))?;
        Ok((Some(Arc::new(t)), None))
    } else if t.is_callable() {
        let out = options.transform_out_bytes.ok_or_else(|| {
            value_error(
                py,
                "Transform",
                "a Python transform needs transform_out_bytes",
            )
        })?;
        let t = PyTransform::new(t.clone().unbind(), out);
        Ok((Some(Arc::clone(&t) as Arc<dyn Transform>), Some(t)))
    } else {
        Err(crate::errors::type_error(py, "transform must be callable"))
    }
}

impl Stream {
    /// Keeps the final counters and drops the loader (joining its threads). Called without the
    /// GIL: a Python transform on a reader thread may be waiting for it.
    fn finish(&self, guard: &mut Option<ForkSafe<Loader>>) {
        if let Some(loader) = guard.take() {
            if loader.is_owner() {
                *lock(&self.final_stats) = Some((loader.stats(), loader.device_bytes_held()));
            }
            drop(loader);
        }
    }

    fn raise(&self, py: Python<'_>, e: LoaderError) -> PyErr {
        let mut raised = loader_error(&e);
        if !raised.message.contains(&self.source_name) {
            raised.message = format!("{}: {}", self.source_name, raised.message);
        }
        let err = raised.into_pyerr(py);
        if let (LoaderError::Transform { .. }, Some(t)) = (&e, &self.transform) {
            if let Some(cause) = lock(&t.last_error).take() {
                err.set_cause(py, Some(cause));
            }
        }
        err
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let loader = self
            .loader
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(loader) = loader {
            drop_detached(loader);
        }
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats, held: usize) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("device", s.device.to_string())?;
    // What each device received: one entry, or one per device of a replicated pass (whose
    // `bytes` count every device and `read_bytes` the dataset once).
    let devices = s
        .devices
        .iter()
        .map(|dev| {
            let e = PyDict::new(py);
            e.set_item("device", dev.device.to_string())?;
            e.set_item("batches", dev.batches)?;
            e.set_item("records", dev.records)?;
            e.set_item("bytes", dev.bytes)?;
            e.set_item("device_bytes_peak", dev.device_bytes_peak)?;
            Ok(e)
        })
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("devices", devices)?;
    d.set_item("elapsed", s.elapsed.as_secs_f64())?;
    // The pass's start (its order, ring and threads), before and outside `elapsed`.
    d.set_item("startup", s.startup.as_secs_f64())?;
    d.set_item("batches", s.batches)?;
    d.set_item("records", s.records)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("threads", s.threads)?;
    d.set_item("threads_reason", &s.threads_reason)?;
    // The machine's rates the thread count came from (None where it was given or unknown).
    d.set_item("copy_gbps", s.machine.map(|m| m.copy_gbps))?;
    d.set_item("bus_gbps", s.machine.map(|m| m.bus_gbps))?;
    // Which reader ran: "pread" or "register", and in words how the source read ("pread",
    // "mmap gather, pread ranges", a fallback with its reason).
    d.set_item("reader", s.reader.to_string())?;
    d.set_item("reader_description", &s.reader_description)?;
    d.set_item("read_time", s.read_time.as_secs_f64())?;
    d.set_item("read_bytes", s.read_bytes)?;
    d.set_item("transform_time", s.transform_time.as_secs_f64())?;
    d.set_item("wait_free_slot", s.wait_free_slot.as_secs_f64())?;
    d.set_item(
        "wait_free_slot_no_copy",
        s.wait_free_slot_no_copy.as_secs_f64(),
    )?;
    d.set_item("wait_filled", s.wait_filled.as_secs_f64())?;
    d.set_item("wait_filled_behind", s.wait_filled_behind.as_secs_f64())?;
    d.set_item("copy_issue_time", s.copy_issue_time.as_secs_f64())?;
    d.set_item("wait_consumer", s.wait_consumer.as_secs_f64())?;
    d.set_item("consumer_wait", s.consumer_wait.as_secs_f64())?;
    d.set_item("slots", s.slots)?;
    d.set_item("slot_bytes", s.slot_bytes)?;
    d.set_item("pinned_bytes", s.pinned_bytes)?;
    d.set_item("pinned_bytes_peak", s.pinned_bytes_peak)?;
    d.set_item("pinned_locked", s.pinned_locked)?;
    // "node 1 (the GPU's)", "no NUMA (one node)" or "not placed: <reason>".
    d.set_item("pinned_numa", &s.pinned_numa)?;
    d.set_item(
        "pinned_allocations_after_start",
        s.pinned_allocations_after_start,
    )?;
    d.set_item("slots_recycled", s.slots_recycled)?;
    d.set_item("slot_waits", s.slot_waits)?;
    d.set_item("slot_claims", s.slot_claims)?;
    d.set_item("slot_claims_own", s.slot_claims_own)?;
    d.set_item("slots_peak_in_use", s.slots_peak_in_use)?;
    d.set_item("device_bytes_peak", s.device_bytes_peak)?;
    d.set_item("device_bytes_held", held)?;
    d.set_item("gbps", s.gbps())?;
    d.set_item("bottleneck", s.bottleneck().to_string())?;
    d.set_item("explanation", s.explain())?;
    d.set_item(
        "network",
        crate::store::network_dict(py, s.network.as_ref())?,
    )?;
    Ok(d)
}

/// The layout `Source.open` was given: a numpy `descr` or pinfeed's `user_dtype` syntax, with
/// the record `shape` (a sub-array dtype adds its dimensions), and whether a shape was given
/// (a `.npy` header's shape is then checked against it, as its dtype always is).
fn given_layout(
    descr: Option<&str>,
    user_dtype: Option<&str>,
    shape: Option<&Vec<u64>>,
) -> Result<(Option<Layout>, bool), pinfeed_source::SourceError> {
    let dtype = match (descr, user_dtype) {
        (Some(d), _) => Some((DType::from_descr_literal(d)?, Vec::new())),
        (None, Some(u)) => Some(parse_user_dtype(u)?),
        (None, None) => None,
    };
    let shape_given = shape.is_some() || dtype.as_ref().is_some_and(|(_, s)| !s.is_empty());
    let layout = match dtype {
        Some((dtype, sub)) => {
            let mut record_shape = shape.cloned().unwrap_or_default();
            record_shape.extend(sub);
            Some(Layout::new(dtype, record_shape)?)
        }
        None => None,
    };
    Ok((layout, shape_given))
}

/// Refuses a file whose header's layout (`found`) contradicts the one given.
fn check_header(
    py: Python<'_>,
    path: &std::path::Path,
    found: &Layout,
    layout: Option<&Layout>,
    shape_given: bool,
    shape: Option<Vec<u64>>,
) -> PyResult<()> {
    let contradicts = match layout {
        Some(given) => given.dtype != found.dtype || (shape_given && given.shape != found.shape),
        None => shape.as_ref().is_some_and(|s| *s != found.shape),
    };
    if !contradicts {
        return Ok(());
    }
    let given = match layout {
        Some(l) if shape_given => format!("dtype {} and record shape {:?}", l.dtype, l.shape),
        Some(l) => format!("dtype {}", l.dtype),
        None => format!("record shape {:?}", shape.unwrap_or_default()),
    };
    Err(value_error(
        py,
        "Layout",
        format!(
            "{}: the header says records of dtype {} and shape {:?}, but it was given {given}; \
             leave dtype and shape out for a file whose header says them",
            path.display(),
            found.dtype,
            found.shape
        ),
    ))
}
