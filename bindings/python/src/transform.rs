//! Transforms run by the reader threads: built-ins in Rust (no GIL) and Python callables.

use std::cell::Cell;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use pinfeed::Transform;
use pinfeed_source::dtype::ScalarKind;
use pinfeed_source::Layout;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{Kind, Raised};

/// Element types the built-in transforms read.
#[derive(Clone, Copy, Debug)]
enum Input {
    U8,
    U16,
    F32,
}

impl Input {
    fn of(layout: &Layout, what: &str) -> Result<Input, String> {
        match (layout.dtype.scalar_kind(), layout.dtype.itemsize) {
            (Some(ScalarKind::UInt), 1) => Ok(Input::U8),
            (Some(ScalarKind::UInt), 2) => Ok(Input::U16),
            (Some(ScalarKind::Float), 4) => Ok(Input::F32),
            _ => Err(format!(
                "{what} reads uint8, uint16 or float32 records, not {}",
                layout.dtype
            )),
        }
    }

    fn bytes(self) -> usize {
        match self {
            Input::U8 => 1,
            Input::U16 => 2,
            Input::F32 => 4,
        }
    }

    /// Element `i` of `input` as `f32`.
    #[inline(always)]
    fn get(self, input: &[u8], i: usize) -> f32 {
        match self {
            Input::U8 => input[i] as f32,
            Input::U16 => u16::from_ne_bytes([input[2 * i], input[2 * i + 1]]) as f32,
            Input::F32 => {
                let b = &input[4 * i..4 * i + 4];
                f32::from_ne_bytes([b[0], b[1], b[2], b[3]])
            }
        }
    }
}

/// Elements in one record of `layout`.
fn elements(layout: &Layout) -> usize {
    layout.record_bytes() / layout.dtype.itemsize
}

/// `x * scale` as float32: the built-in behind `pinfeed.transforms.ToFloat`.
pub(crate) struct ToFloat {
    input: Input,
    scale: f32,
    per_record: usize,
}

impl ToFloat {
    pub(crate) fn new(layout: &Layout, scale: f32) -> Result<ToFloat, String> {
        Ok(ToFloat {
            input: Input::of(layout, "ToFloat")?,
            scale,
            per_record: elements(layout),
        })
    }
}

impl Transform for ToFloat {
    fn output_record_bytes(&self) -> usize {
        self.per_record * 4
    }

    fn apply(&self, input: &[u8], records: usize, output: &mut [u8]) -> Result<(), String> {
        let n = records * self.per_record;
        check_sizes(input.len(), n * self.input.bytes(), output.len(), n * 4)?;
        let (input_kind, scale) = (self.input, self.scale);
        for (i, out) in output.chunks_exact_mut(4).enumerate() {
            out.copy_from_slice(&(input_kind.get(input, i) * scale).to_ne_bytes());
        }
        Ok(())
    }
}

/// `(x * scale - mean[c]) / std[c]` per channel `c` (the record shape's first dimension) as
/// float32: the built-in behind `pinfeed.transforms.Normalize`.
pub(crate) struct Normalize {
    input: Input,
    scale: f32,
    mean: Vec<f32>,
    std: Vec<f32>,
    /// Elements of one channel of one record.
    per_channel: usize,
}

impl Normalize {
    pub(crate) fn new(
        layout: &Layout,
        mean: &[f32],
        std: &[f32],
        scale: f32,
    ) -> Result<Normalize, String> {
        let input = Input::of(layout, "Normalize")?;
        let channels = layout.shape.first().map_or(1, |&c| c as usize);
        let widen = |v: &[f32], what: &str| -> Result<Vec<f32>, String> {
            match v.len() {
                1 => Ok(vec![v[0]; channels]),
                n if n == channels => Ok(v.to_vec()),
                n => Err(format!(
                    "Normalize: {what} has {n} values but the records have {channels} channel(s) \
                     (their first dimension, record shape {:?}); give 1 or {channels}",
                    layout.shape
                )),
            }
        };
        let mean = widen(mean, "mean")?;
        let std = widen(std, "std")?;
        if let Some(i) = std.iter().position(|&s| s == 0.0 || !s.is_finite()) {
            return Err(format!(
                "Normalize: std[{i}] is {}; it must be finite and non-zero",
                std[i]
            ));
        }
        Ok(Normalize {
            input,
            scale,
            per_channel: elements(layout) / channels,
            mean,
            std,
        })
    }
}

impl Transform for Normalize {
    fn output_record_bytes(&self) -> usize {
        self.per_channel * self.mean.len() * 4
    }

    fn apply(&self, input: &[u8], records: usize, output: &mut [u8]) -> Result<(), String> {
        let n = records * self.per_channel * self.mean.len();
        check_sizes(input.len(), n * self.input.bytes(), output.len(), n * 4)?;
        let channels = self.mean.len();
        for (i, out) in output.chunks_exact_mut(4).enumerate() {
            let c = (i / self.per_channel) % channels;
            let y = (self.input.get(input, i) * self.scale - self.mean[c]) / self.std[c];
            out.copy_from_slice(&y.to_ne_bytes());
        }
        Ok(())
    }
}

fn check_sizes(input: usize, want_in: usize, output: usize, want_out: usize) -> Result<(), String> {
    if input != want_in || output != want_out {
        return Err(format!(
            "transform given {input} input and {output} output bytes, expected {want_in} and {want_out}"
        ));
    }
    Ok(())
}

/// A Python callable run on the reader threads, with the GIL taken for each batch.
///
/// `caller(raw, out, records)` (made by `pinfeed._transform.make_caller`) gets two memoryviews,
/// of the raw records (read-only) and of the output slot, which it wraps in numpy arrays, hands
/// to the user's function and releases before returning, so that no Python object refers to
/// the slot once it goes to the copy engine.
pub(crate) struct PyTransform {
    caller: Py<PyAny>,
    out_record_bytes: usize,
    /// The exception of the last failed call, to chain onto the loader's error.
    pub(crate) last_error: Mutex<Option<PyErr>>,
}

impl PyTransform {
    pub(crate) fn new(caller: Py<PyAny>, out_record_bytes: usize) -> Arc<PyTransform> {
        Arc::new(PyTransform {
            caller,
            out_record_bytes,
            last_error: Mutex::new(None),
        })
    }
}

/// A memoryview of `len` bytes at `ptr` (`writable` or read-only); it must be released before
/// the memory goes away.
fn memoryview<'py>(
    py: Python<'py>,
    ptr: *const u8,
    len: usize,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    // CPython's `PyBUF_READ` and `PyBUF_WRITE` (memoryobject.h), which pyo3-ffi leaves out.
    const PYBUF_READ: i32 = 0x100;
    const PYBUF_WRITE: i32 = 0x200;
    let flags = if writable { PYBUF_WRITE } else { PYBUF_READ };
    // SAFETY: the caller keeps `ptr .. ptr + len` valid until the view is released.
    let view =
        unsafe { ffi::PyMemoryView_FromMemory(ptr as *mut c_char, len as ffi::Py_ssize_t, flags) };
    // SAFETY: a new reference, or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, view) }
}

thread_local! {
    /// The Python transform the calling thread is running (its caller object's address), 0
    /// outside one: a reader thread of the loader whose transform it is, which starting,
    /// stepping or stopping that loader's passes would wait on.
    static RUNNING: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is inside `transform` (the callable a Loader's passes run, the
/// same object for all of them): one of that loader's reader threads.
pub(crate) fn running(transform: &Py<PyAny>) -> bool {
    RUNNING.with(Cell::get) == transform.as_ptr() as usize
}

/// Marks the thread as inside a transform until dropped.
struct InTransform {
    /// What the thread was running before (nothing: a reader runs one transform at a time).
    previous: usize,
}

impl InTransform {
    fn enter(caller: &Py<PyAny>) -> InTransform {
        InTransform {
            previous: RUNNING.with(|c| c.replace(caller.as_ptr() as usize)),
        }
    }
}

impl Drop for InTransform {
    fn drop(&mut self) {
        RUNNING.with(|c| c.set(self.previous));
    }
}

/// What a thread inside a Loader's transform may not do to that Loader's passes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PassCall {
    /// Start a pass (`iter()`), which stops the one under way.
    Iter,
    /// Wait for a batch (`next()`).
    Next,
    /// Stop the pass (`close()`).
    Close,
}

/// Refuses `call` on a pass of the source `name` whose transform is `transform`, when the
/// calling thread is inside that transform: one of the pass's reader threads, which stopping
/// the pass joins (it would wait for itself) and whose batch `next()` may be waiting for.
pub(crate) fn refuse_inside(
    py: Python<'_>,
    name: &str,
    transform: Option<&Py<PyAny>>,
    call: PassCall,
) -> PyResult<()> {
    if !transform.is_some_and(running) {
        return Ok(());
    }
    let (variant, message) = match call {
        PassCall::Iter => (
            "IterInTransform",
            "iter() was called from inside the Loader's own transform, on a reader thread of \
             the pass under way; a new pass stops that one, which waits for this thread: \
             iterate the Loader from the thread that consumes it",
        ),
        PassCall::Next => (
            "NextInTransform",
            "next() was called from inside the Loader's own transform, on a reader thread of \
             the pass; the batch it waits for may be the one this thread is making: take \
             batches from the thread that consumes the Loader",
        ),
        PassCall::Close => (
            "CloseInTransform",
            "close() was called from inside a transform, on a reader thread that closing must \
             stop; close the Loader from the thread that iterates it",
        ),
    };
    Err(Raised::new(Kind::Base, variant, format!("{name}: {message}")).into_pyerr(py))
}

impl PyTransform {
    /// The Python callable: the same object for every pass of one Loader.
    pub(crate) fn caller(&self) -> &Py<PyAny> {
        &self.caller
    }
}

impl Transform for PyTransform {
    fn output_record_bytes(&self) -> usize {
        self.out_record_bytes
    }

    fn apply(&self, input: &[u8], records: usize, output: &mut [u8]) -> Result<(), String> {
        let _inside = InTransform::enter(&self.caller);
        let outcome = Python::try_attach(|py| {
            let mut call = || -> PyResult<()> {
                let raw = memoryview(py, input.as_ptr(), input.len(), false)?;
                let out = memoryview(py, output.as_mut_ptr(), output.len(), true)?;
                let result = self.caller.bind(py).call1((&raw, &out, records));
                // `caller` releases both views; releasing again is a no-op, and makes sure even
                // when it failed early. A view still exported by a live array cannot be
                // released: report it rather than let the array outlive the slot.
                let released = [&raw, &out]
                    .iter()
                    .try_for_each(|view| view.call_method0("release").map(drop));
                result?;
                released
            };
            call().map_err(|e| {
                let message = e.to_string();
                *crate::lock(&self.last_error) = Some(e);
                message
            })
        });
        outcome.unwrap_or_else(|| Err("the Python interpreter is shutting down".into()))
    }
}
