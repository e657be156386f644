//! `pinfeed._pinfeed`: the Rust half of the `pinfeed` Python package.
//!
//! Thin wrappers: `loader::Source` and `loader::Stream` (one pass of a `pinfeed::Loader`), the
//! record order (`order::epoch_order` and its sizes, `order::StepGroups`),
//! `stage::Stager` and `stage::PinnedRegion`, and
//! `dlpack::DeviceBuffer`, the DLPack object every batch and upload comes out as. Anything
//! that blocks runs without the GIL; errors become the classes of `pinfeed.errors`. The
//! Python-facing API (`pinfeed.Loader`, `pinfeed.prefetch`, ...) is in `python/pinfeed`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cli;
mod dlpack;
mod errors;
mod fork;
mod images;
mod loader;
mod mixture;
mod options;
mod order;
mod stage;
mod store;
mod tables;
mod tokens;
mod transform;

use std::sync::{Mutex, MutexGuard};

use pinfeed_source::DType;
use pyo3::prelude::*;

use crate::errors::{value_error, ToPy};

/// Locks `mutex`, poisoned or not: what these mutexes guard (an `Option` taken once, counters)
/// is whole after any panic, and a poisoned lock must not turn `close()` or `Drop` into a panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops `value` with the GIL released, from `Drop` or anywhere the GIL may be held: dropping a
/// loader joins threads that may be waiting for the GIL inside a Python transform, and freeing
/// pinned or host-backend memory waits for the copies still reading it.
pub(crate) fn drop_detached<T: Send>(value: T) {
    Python::attach(|py| py.detach(move || drop(value)));
}

/// The address and length of a C-contiguous numpy array (anything with
/// `__array_interface__` and `nbytes`), which must stay alive while the memory is used.
pub(crate) fn array_memory(
    py: Python<'_>,
    array: &Bound<'_, PyAny>,
) -> PyResult<(usize, usize, Vec<u64>)> {
    let interface = array.getattr("__array_interface__")?;
    let (address, _readonly): (usize, bool) = interface.get_item("data")?.extract()?;
    if !interface.get_item("strides")?.is_none() {
        return Err(value_error(
            py,
            "Layout",
            "the array is not C-contiguous; pass numpy.ascontiguousarray(x) (a copy)",
        ));
    }
    let shape: Vec<u64> = interface.get_item("shape")?.extract()?;
    let nbytes: usize = array.getattr("nbytes")?.extract()?;
    Ok((address, nbytes, shape))
}

/// The DLPack ``(code, bits, lanes)`` of a numpy descr literal, or ``None`` when DLPack has no
/// code for it (structured dtypes, strings, dates).
#[pyfunction]
fn dlpack_dtype(py: Python<'_>, descr: &str) -> PyResult<Option<(u8, u8, u16)>> {
    let dtype = DType::from_descr_literal(descr).py_err(py)?;
    Ok(dlpack::dl_dtype(&dtype).map(|d| (d.code.0, d.bits, d.lanes)))
}

/// Parses pinfeed's dtype syntax (``"3,31,31B"``, ``"f32"``, ``"<u8"``) into a numpy descr
/// literal and the sub-array shape.
#[pyfunction]
fn parse_dtype(py: Python<'_>, text: &str) -> PyResult<(String, Vec<u64>)> {
    let (dtype, shape) = pinfeed_source::dtype::parse_user_dtype(text).py_err(py)?;
    Ok((dtype.descr, shape))
}

/// Number of CUDA devices, 0 when there is no driver or no device.
#[pyfunction]
fn cuda_device_count() -> usize {
    pinfeed_cuda::probe().unwrap_or(0)
}

/// Page-locked allocations this process has made (pools, arenas, regions).
#[pyfunction]
fn pinned_allocations() -> u64 {
    pinfeed::pinned_allocations()
}

#[pymodule]
fn _pinfeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_PINNED_BUDGET", pinfeed::DEFAULT_PINNED_BUDGET)?;
    m.add("DEFAULT_STAGING_BUDGET", pinfeed::DEFAULT_STAGING_BUDGET)?;
    m.add_class::<loader::Source>()?;
    m.add_class::<loader::Stream>()?;
    m.add_class::<options::StreamOptions>()?;
    m.add_class::<loader::ToFloatSpec>()?;
    m.add_class::<loader::NormalizeSpec>()?;
    m.add_class::<dlpack::DeviceBuffer>()?;
    m.add_class::<stage::Stager>()?;
    m.add_class::<stage::PinnedRegion>()?;
    m.add_class::<order::StepGroups>()?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::streams_with_exports, m)?)?;
    m.add_function(wrap_pyfunction!(parse_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(loader::combined_stats, m)?)?;
    m.add_function(wrap_pyfunction!(tables::open_table, m)?)?;
    m.add_function(wrap_pyfunction!(tables::natural_block, m)?)?;
    m.add_function(wrap_pyfunction!(tables::open_token_column, m)?)?;
    m.add_function(wrap_pyfunction!(tables::open_text_column, m)?)?;
    m.add_function(wrap_pyfunction!(tables::tokenized_rows, m)?)?;
    m.add_function(wrap_pyfunction!(order::epoch_order, m)?)?;
    m.add_function(wrap_pyfunction!(order::epoch_size, m)?)?;
    m.add_function(wrap_pyfunction!(order::reshard_position, m)?)?;
    m.add_function(wrap_pyfunction!(options::device_share, m)?)?;
    m.add_function(wrap_pyfunction!(options::byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(options::check_ints, m)?)?;
    m.add_function(wrap_pyfunction!(store::is_url, m)?)?;
    m.add_function(wrap_pyfunction!(options::bottleneck, m)?)?;
    tokens::register(m)?;
    mixture::register(m)?;
    images::register(m)?;
    Ok(())
}
