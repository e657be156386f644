//! Device memory handed to Python through DLPack.
//!
//! A [`DeviceBuffer`] wraps one [`DeviceData`] (a loader batch or an uploaded array) with the
//! shape and element type to export it as. `__dlpack__` makes the consumer's stream wait for
//! our copy (`cuStreamWaitEvent`, no host synchronisation) and hands out a capsule; the
//! capsule's deleter frees the memory in stream order after the work queued on that same stream
//! (`release_after`), so a later batch never reuses memory a queued kernel may still read.
//!
//! The DLPack structs are dlpark's `ffi` module (bindgen output of `dlpack.h` 1.x); nothing else
//! of dlpark is used, since its ownership wrappers would need a pyo3 of their own.

use std::collections::BTreeMap;
use std::ffi::{c_void, CStr};
use std::sync::Mutex;

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor,
};
use dlpark::DlpackFlags;
use pinfeed::{DeviceData, DeviceSpec};
use pinfeed_source::dtype::ScalarKind;
use pinfeed_source::DType;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{loader_error, value_error, ToPy};
use crate::fork::{self, ForkSafe};
use crate::{drop_detached, lock};

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";

/// DLPack's CUDA stream numbers (array API `__dlpack__`): 1 is the legacy default stream, 2 the
/// per-thread default stream; as `CUstream` handles the driver reads 1 and 2 the same way
/// (`CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
const LEGACY_DEFAULT_STREAM: u64 = 1;

/// The DLPack element type of a simple dtype; `None` for structured dtypes and for kinds
/// DLPack has no code for (strings, bytes, dates).
pub(crate) fn dl_dtype(dtype: &DType) -> Option<DLDataType> {
    let code = match dtype.scalar_kind()? {
        ScalarKind::Bool => DLDataTypeCode::BOOL,
        ScalarKind::Int => DLDataTypeCode::INT,
        ScalarKind::UInt => DLDataTypeCode::UINT,
        ScalarKind::Float => DLDataTypeCode::FLOAT,
        ScalarKind::Complex => DLDataTypeCode::COMPLEX,
        _ => return None,
    };
    Some(DLDataType {
        code,
        bits: u8::try_from(dtype.itemsize * 8).ok()?,
        lanes: 1,
    })
}

/// A DLPack element type from Python's `(code, bits, lanes)`.
pub(crate) fn dl_dtype_from_tuple(t: (u8, u8, u16)) -> DLDataType {
    DLDataType {
        code: DLDataTypeCode(t.0),
        bits: t.1,
        lanes: t.2,
    }
}

/// Bytes of one element of `dtype`.
pub(crate) fn element_bytes(dtype: DLDataType) -> usize {
    (dtype.bits as usize * dtype.lanes as usize).div_ceil(8)
}

/// Where the batch's memory is, as DLPack says it.
fn dl_device(device: DeviceSpec) -> DLDevice {
    match device {
        DeviceSpec::Cuda(n) => DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: n as i32,
        },
        _ => DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
    }
}

/// Index of a batch delivered by a loader.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchInfo {
    pub(crate) epoch: u64,
    pub(crate) index: u64,
    pub(crate) first_record: u64,
    /// The documents its windows pack, where the source counts them.
    pub(crate) documents: Option<u64>,
}

/// Device memory (a loader batch, or an array uploaded by a stager) exportable once through
/// DLPack: ``torch.from_dlpack(buf)`` on CUDA, ``numpy.from_dlpack(buf)`` on the host backend.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct DeviceBuffer {
    /// `None` once exported or released.
    data: Mutex<Option<ForkSafe<Box<dyn DeviceData>>>>,
    shape: Vec<i64>,
    dtype: DLDataType,
    device: DeviceSpec,
    /// Bytes in the buffer.
    #[pyo3(get)]
    nbytes: usize,
    /// The device address (a host address on the host backend).
    #[pyo3(get)]
    address: u64,
    info: Option<BatchInfo>,
}

impl DeviceBuffer {
    /// Wraps `data` to be exported with `shape` and `dtype`, which must cover exactly its bytes.
    pub(crate) fn new(
        data: Box<dyn DeviceData>,
        shape: Vec<i64>,
        dtype: DLDataType,
        info: Option<BatchInfo>,
    ) -> Result<DeviceBuffer, String> {
        let elements = shape.iter().try_fold(1usize, |acc, &d| {
            usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        });
        let want = elements.and_then(|n| n.checked_mul(element_bytes(dtype)));
        if want != Some(data.len_bytes()) {
            return Err(format!(
                "shape {shape:?} of {}-bit elements does not cover the {} bytes delivered",
                dtype.bits as usize * dtype.lanes as usize,
                data.len_bytes()
            ));
        }
        Ok(DeviceBuffer {
            shape,
            dtype,
            device: data.device(),
            nbytes: data.len_bytes(),
            address: data.address(),
            info,
            data: Mutex::new(Some(ForkSafe::new(data))),
        })
    }

    fn take(&self) -> Option<ForkSafe<Box<dyn DeviceData>>> {
        lock(&self.data).take()
    }

    fn put_back(&self, data: ForkSafe<Box<dyn DeviceData>>) {
        *lock(&self.data) = Some(data);
    }

    /// `(stream to wait on, stream to release after)` for the consumer's `stream` of
    /// `__dlpack__`.
    fn export_streams(&self, py: Python<'_>, stream: Option<i64>) -> PyResult<(Option<u64>, u64)> {
        if !matches!(self.device, DeviceSpec::Cuda(_)) {
            // The host backend has no streams: the copy is waited for and the memory freed
            // whenever the consumer lets go.
            return Ok((Some(0), 0));
        }
        match stream {
            None => Ok((Some(LEGACY_DEFAULT_STREAM), LEGACY_DEFAULT_STREAM)),
            Some(-1) => Ok((None, LEGACY_DEFAULT_STREAM)),
            Some(0) => Err(value_error(
                py,
                "Config",
                "stream=0 is ambiguous for CUDA in DLPack; pass 1 (legacy default), 2 \
                 (per-thread default) or a stream handle",
            )),
            Some(s) if s > 0 => Ok((Some(s as u64), s as u64)),
            Some(s) => Err(value_error(
                py,
                "Config",
                format!("invalid CUDA stream {s} for DLPack"),
            )),
        }
    }

    fn forked_error(&self, py: Python<'_>, owner: u32) -> PyErr {
        crate::errors::Raised::new(
            crate::errors::Kind::Base,
            "Forked",
            format!(
                "this buffer was made in process {owner} and cannot be used in forked child {}",
                fork::pid()
            ),
        )
        .into_pyerr(py)
    }
}

/// Exports not yet released, counted by the stream each is released after.
static OUTSTANDING: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

fn count_export(stream: u64, up: bool) {
    let mut counts = OUTSTANDING.lock().unwrap_or_else(|p| p.into_inner());
    let n = counts.entry(stream).or_insert(0);
    *n = if up { *n + 1 } else { n.saturating_sub(1) };
    if *n == 0 {
        counts.remove(&stream);
    }
}

/// Exported buffers not yet freed, counted by the consumer stream (CUDA stream handle) each
/// will be released after: the deleter records an event on that stream, so it must still
/// exist then. CuPy destroys a stream when its Python object goes, so
/// `_frameworks.cupy_array` keeps each stream it exports on until it leaves this map.
#[pyfunction]
pub fn streams_with_exports() -> BTreeMap<u64, usize> {
    OUTSTANDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// What a capsule's deleter frees: the device data and the arrays the `DLTensor` points into.
struct Export {
    data: ForkSafe<Box<dyn DeviceData>>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// The consumer's stream, recorded at export: the memory is freed after the work queued on
    /// it by the time the deleter runs.
    release_stream: u64,
}

impl Export {
    /// Frees the data in stream order. Runs in a DLPack deleter: on any thread, with or without
    /// the GIL, so it must not touch Python, and must not unwind into C.
    fn release(self) {
        let Export {
            data,
            release_stream,
            ..
        } = self;
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            if let Some(data) = data.into_inner() {
                // SAFETY: `release_stream` is the stream the consumer gave `__dlpack__` (a live
                // stream of the data's context, or the legacy default stream), or any value on
                // the host backend. An error leaves nothing to do but let the memory go.
                let _ = unsafe { data.release_after(release_stream) };
            }
        }));
        count_export(release_stream, false);
    }

    fn tensor(&mut self, address: u64, device: DeviceSpec, dtype: DLDataType) -> DLTensor {
        DLTensor {
            data: address as *mut c_void,
            device: dl_device(device),
            ndim: self.shape.len() as i32,
            dtype,
            shape: self.shape.as_mut_ptr(),
            strides: self.strides.as_mut_ptr(),
            byte_offset: 0,
        }
    }
}

/// The DLPack capsule of `export` (whose `tensor` was taken from it): versioned when the
/// consumer's `max_version` is 1 or more, else the legacy one. On failure the export is freed.
fn capsule<'py>(
    py: Python<'py>,
    export: Box<Export>,
    tensor: DLTensor,
    max_version: Option<(u32, u32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let ctx = Box::into_raw(export).cast::<c_void>();
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    let (pointer, name, free): (*mut c_void, &CStr, Box<dyn Fn()>) = if versioned {
        let mut flags = DlpackFlags::empty();
        if copy == Some(true) {
            // The buffer is exported once and nothing else refers to its memory: the
            // consumer owns it alone, as a copy would be.
            flags |= DlpackFlags::IS_COPIED;
        }
        let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx,
            deleter: Some(delete_versioned),
            flags,
            dl_tensor: tensor,
        }));
        // SAFETY: `managed` is live and ours until the capsule exists.
        let free = Box::new(move || unsafe { delete_versioned(managed) });
        (managed.cast(), VERSIONED, free)
    } else {
        let managed = Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: ctx,
            deleter: Some(delete_legacy),
        }));
        // SAFETY: as above.
        let free = Box::new(move || unsafe { delete_legacy(managed) });
        (managed.cast(), LEGACY, free)
    };
    // SAFETY: `pointer` is non-null and `name` a static C string; the destructor only frees
    // `pointer` while the capsule still bears `name`.
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(capsule_destructor)) };
    // SAFETY: `PyCapsule_New` returns a new reference or null with an exception set.
    match unsafe { Bound::from_owned_ptr_or_err(py, capsule) } {
        Ok(capsule) => Ok(capsule),
        Err(e) => {
            free();
            Err(e)
        }
    }
}

/// C-contiguous strides, in elements.
fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` came from `Box::into_raw` in `__dlpack__` and DLPack calls the deleter
    // once; its `manager_ctx` is the `Box<Export>` made there.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: as above.
    let export = unsafe { Box::from_raw(managed.manager_ctx.cast::<Export>()) };
    export.release();
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as for `delete_versioned`.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: as for `delete_versioned`.
    let export = unsafe { Box::from_raw(managed.manager_ctx.cast::<Export>()) };
    export.release();
}

/// Frees a capsule nobody consumed. A consumer renames the capsule (`used_dltensor...`) when it
/// takes ownership, so only a capsule still bearing our name owns its tensor.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with a live capsule; `PyCapsule_IsValid` never fails or sets an
    // error, and a valid capsule of that name holds the pointer `__dlpack__` stored.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        } else if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        }
    }
}

#[pymethods]
impl DeviceBuffer {
    /// ``(device_type, device_id)``: ``(2, ordinal)`` for CUDA (kDLCUDA), ``(1, 0)`` for the
    /// host backend (kDLCPU).
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = dl_device(self.device);
        (d.device_type.0 as i32, d.device_id)
    }

    /// Exports the buffer as a DLPack capsule; a buffer can be exported once.
    ///
    /// On CUDA, ``stream`` is the consumer's stream: it is made to wait for the copy that fills
    /// the buffer (no host synchronisation), and the memory is freed after the work queued on
    /// it once the consumer drops the tensor. ``None`` means the legacy default stream (1), 2 the
    /// per-thread default stream, -1 no synchronisation (the consumer orders its reads itself),
    /// and 0 is refused as ambiguous. On the host backend the copy is waited for.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(requested) = dl_device {
            if requested != self.__dlpack_device__() {
                return Err(PyBufferError::new_err(format!(
                    "the buffer is on device {:?}; pinfeed does not copy between devices on export \
                     (asked for {requested:?})",
                    self.__dlpack_device__()
                )));
            }
        }
        let (wait_on, release_after) = self.export_streams(py, stream)?;
        let Some(data) = self.take() else {
            return Err(PyBufferError::new_err(
                "this pinfeed buffer was already exported (or released); a buffer can be \
                 exported through DLPack once",
            ));
        };
        if !data.is_owner() {
            let owner = data.owner_pid();
            drop(data); // leaked, see `ForkSafe`
            return Err(self.forked_error(py, owner));
        }
        if let Some(s) = wait_on {
            let shared: &dyn DeviceData = &**data;
            // SAFETY: on CUDA `s` is the consumer's stream of this device (the DLPack
            // contract) or a default-stream handle; any value is fine on the host backend.
            let waited = py.detach(move || unsafe { shared.stream_wait(s) });
            if let Err(e) = waited {
                self.put_back(data);
                return Err(loader_error(&e).into_pyerr(py));
            }
        }
        let mut export = Box::new(Export {
            data,
            strides: contiguous_strides(&self.shape),
            shape: self.shape.clone(),
            release_stream: release_after,
        });
        count_export(release_after, true);
        let tensor = export.tensor(self.address, self.device, self.dtype);
        capsule(py, export, tensor, max_version, copy)
    }

    /// The shape the buffer exports as.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// The DLPack element type ``(code, bits, lanes)``.
    #[getter]
    fn dtype(&self) -> (u8, u8, u16) {
        (self.dtype.code.0, self.dtype.bits, self.dtype.lanes)
    }

    /// ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        self.device.to_string()
    }

    /// Whether the buffer was exported or released (its memory now belongs to the consumer).
    #[getter]
    fn exported(&self) -> bool {
        lock(&self.data).is_none()
    }

    /// The epoch of a loader batch (``None`` for an upload).
    #[getter]
    fn epoch(&self) -> Option<u64> {
        self.info.map(|i| i.epoch)
    }

    /// The index of a loader batch within its epoch (``None`` for an upload).
    #[getter]
    fn index(&self) -> Option<u64> {
        self.info.map(|i| i.index)
    }

    /// The dataset index of a loader batch's first record (``None`` for an upload).
    #[getter]
    fn first_record(&self) -> Option<u64> {
        self.info.map(|i| i.first_record)
    }

    /// The documents a loader batch of token windows packs, counted on the reader threads
    /// (``None`` for other batches): known while the copy may still run.
    #[getter]
    fn documents(&self) -> Option<u64> {
        self.info.and_then(|i| i.documents)
    }

    /// Blocks (without the GIL) until the copy filling the buffer has finished.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let guard = lock(&self.data);
        let Some(data) = guard.as_ref() else {
            return Err(PyBufferError::new_err("the buffer was already exported"));
        };
        if !data.is_owner() {
            return Err(self.forked_error(py, data.owner_pid()));
        }
        let shared: &dyn DeviceData = &***data;
        py.detach(move || shared.wait_ready()).py_err(py)
    }

    /// Copies the buffer's bytes back to the host (after its copy finished) as ``bytes``.
    fn read_back<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let guard = lock(&self.data);
        let Some(data) = guard.as_ref() else {
            return Err(PyBufferError::new_err("the buffer was already exported"));
        };
        if !data.is_owner() {
            return Err(self.forked_error(py, data.owner_pid()));
        }
        let mut host = vec![0u8; self.nbytes];
        let shared: &dyn DeviceData = &***data;
        let host_ref = &mut host;
        py.detach(move || shared.read_back(host_ref)).py_err(py)?;
        Ok(pyo3::types::PyBytes::new(py, &host))
    }

    /// Frees the buffer now (after its copy finished) instead of exporting it.
    fn release(&self, py: Python<'_>) {
        if let Some(data) = self.take() {
            py.detach(move || drop(data));
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceBuffer(device={}, shape={:?}, dtype=({}, {}, {}), nbytes={}{})",
            self.device,
            self.shape,
            self.dtype.code.0,
            self.dtype.bits,
            self.dtype.lanes,
            self.nbytes,
            if self.exported() { ", exported" } else { "" }
        )
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Dropping a host-backend batch may wait for its copy; not with the GIL held.
        if let Some(data) = self.take() {
            drop_detached(data);
        }
    }
}
