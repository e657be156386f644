//! Uploads of arbitrary arrays through a fixed pinned arena, and page-locking in place.

use std::sync::Mutex;

use pinfeed::{DeviceSpec, StagerOptions};
use pyo3::prelude::*;

use crate::array_memory;
use crate::dlpack::{dl_dtype_from_tuple, DeviceBuffer};
use crate::errors::{value_error, Kind, Raised, ToPy};
use crate::fork::{self, ForkSafe};
use crate::options::{device_arg, size_arg};
use crate::{drop_detached, lock};

fn forked(py: Python<'_>, what: &str, owner: u32) -> PyErr {
    Raised::new(
        Kind::Base,
        "Forked",
        format!(
            "this {what} was made in process {owner} and cannot be used in forked child {}; make a new one in the child",
            fork::pid()
        ),
    )
    .into_pyerr(py)
}

/// The bytes of a C-contiguous array, valid while `array` lives.
fn array_bytes<'a>(py: Python<'_>, array: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    let (address, nbytes, _) = array_memory(py, array)?;
    if nbytes == 0 {
        return Ok(&[]);
    }
    // SAFETY: numpy's array interface gives the data of a C-contiguous array of `nbytes`
    // bytes, valid while the array lives, which the borrow of `array` ensures for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) })
}

/// Copies host arrays of any size to the device through one fixed pinned arena (allocated
/// once); each upload returns a [`DeviceBuffer`] as soon as its copies are issued.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct Stager {
    inner: Option<ForkSafe<pinfeed::Stager>>,
}

#[pymethods]
impl Stager {
    #[new]
    #[pyo3(signature = (device="cuda", pinned_budget=None, num_threads=None, method="stage", piece_size=None))]
    fn new(
        py: Python<'_>,
        device: &str,
        pinned_budget: Option<Bound<'_, PyAny>>,
        num_threads: Option<usize>,
        method: &str,
        piece_size: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Stager> {
        let options = StagerOptions {
            device: device_arg(py, device)?,
            pinned_budget: size_arg(pinned_budget.as_ref(), "pinned_budget")?
                .unwrap_or(pinfeed::DEFAULT_STAGING_BUDGET),
            num_threads,
            method: method.parse::<pinfeed::UploadMethod>().py_err(py)?,
            piece_bytes: size_arg(piece_size.as_ref(), "piece_size")?,
            ..StagerOptions::default()
        };
        let stager = py
            .detach(move || pinfeed::Stager::new(options))
            .py_err(py)?;
        Ok(Stager {
            inner: Some(ForkSafe::new(stager)),
        })
    }

    /// Copies a C-contiguous array to new device memory, exported as ``dtype`` (DLPack
    /// ``(code, bits, lanes)``) and ``shape``. Blocks (without the GIL) while the arena is full.
    fn upload(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        dtype: (u8, u8, u16),
        shape: Vec<i64>,
    ) -> PyResult<DeviceBuffer> {
        let stager = self.get(py)?;
        let bytes = array_bytes(py, array)?;
        let uploaded = py.detach(|| stager.upload(bytes)).py_err(py)?;
        DeviceBuffer::new(Box::new(uploaded), shape, dl_dtype_from_tuple(dtype), None)
            .map_err(|m| value_error(py, "Layout", m))
    }

    /// ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.device().to_string())
    }

    /// Bytes of page-locked memory in the arena.
    #[getter]
    fn pinned_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.get(py)?.pinned_bytes())
    }

    /// Whether the arena is really page-locked.
    #[getter]
    fn pinned_locked(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.get(py)?.pinned_locked())
    }

    /// The most bytes page-locked at once: the arena plus the source chunks the register lane
    /// may hold.
    #[getter]
    fn pinned_budget(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.get(py)?.pinned_budget())
    }

    /// ``"both"``, ``"stage"`` or ``"register"``.
    #[getter]
    fn method(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.method().to_string())
    }

    /// Bytes moved so far by each way: ``staged_bytes``, ``registered_bytes``,
    /// ``direct_bytes`` (from an already page-locked source) and ``register_error`` (why
    /// registration failed, if it did; those chunks were staged).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let stager = self.get(py)?;
        let (c, threads) = (stager.counters(), stager.threads());
        let d = pyo3::types::PyDict::new(py);
        d.set_item("threads", threads.threads)?;
        d.set_item("threads_reason", &threads.reason)?;
        d.set_item("copy_gbps", threads.rates.map(|m| m.copy_gbps))?;
        d.set_item("bus_gbps", threads.rates.map(|m| m.bus_gbps))?;
        d.set_item("staged_bytes", c.staged_bytes)?;
        d.set_item("registered_bytes", c.registered_bytes)?;
        d.set_item("direct_bytes", c.direct_bytes)?;
        d.set_item("register_error", c.register_error)?;
        Ok(d)
    }
}

impl Stager {
    fn get(&self, py: Python<'_>) -> PyResult<&pinfeed::Stager> {
        let inner = self.inner.as_ref().expect("set at construction");
        if !inner.is_owner() {
            return Err(forked(py, "Stager", inner.owner_pid()));
        }
        Ok(inner)
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        // Freeing the arena waits for the copies still reading it.
        if let Some(inner) = self.inner.take() {
            drop_detached(inner);
        }
    }
}

/// A C-contiguous array page-locked in place (``cuMemHostRegister`` on CUDA, ``mlock`` on the
/// host backend) until ``close()``; the array is kept alive meanwhile.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct PinnedRegion {
    region: Mutex<Option<ForkSafe<pinfeed::PinnedRegion>>>,
    #[pyo3(get)]
    nbytes: usize,
    /// Keeps the locked memory mapped while the region lives.
    _owner: Py<PyAny>,
}

#[pymethods]
impl PinnedRegion {
    #[new]
    #[pyo3(signature = (array, device="cuda"))]
    fn new(py: Python<'_>, array: &Bound<'_, PyAny>, device: &str) -> PyResult<PinnedRegion> {
        let device: DeviceSpec = device_arg(py, device)?;
        let (address, nbytes, _) = array_memory(py, array)?;
        // Raw pointers are not Send; the address crosses into the GIL-free closure as a number.
        let region = py
            .detach(move || {
                // SAFETY: the range is the array's data, kept mapped by `_owner` until the region
                // is dropped (the struct holds both, and `close`/`Drop` drop the region first).
                // That no copy from it is in flight at `close` is the caller's documented duty.
                unsafe { pinfeed::PinnedRegion::new(device, address as *mut u8, nbytes) }
            })
            .py_err(py)?;
        Ok(PinnedRegion {
            region: Mutex::new(Some(ForkSafe::new(region))),
            nbytes,
            _owner: array.clone().unbind(),
        })
    }

    /// Unlocks the memory (idempotent).
    fn close(&self, py: Python<'_>) {
        let region = lock(&self.region).take();
        if let Some(region) = region {
            py.detach(move || drop(region));
        }
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.region).is_none()
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        let region = self
            .region
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(region) = region {
            drop_detached(region);
        }
    }
}
