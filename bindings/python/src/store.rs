//! Object storage: the `storage_options`, `cache_dir` and `cache_limit` of `Source.open`, and
//! the `network` entry of `stats()`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pinfeed_source::NetworkStats;
use pinfeed_store::StoreOptions;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{source_error, value_error};
use crate::options::size_arg;

/// Default `cache_limit`: 10 GiB, as the command's `--cache-limit`.
const DEFAULT_CACHE_LIMIT: u64 = 10 << 30;

/// The store options of `Source.open`; refused for a local path, where they would do nothing.
pub(crate) fn store_options(
    py: Python<'_>,
    is_url: bool,
    pairs: Option<BTreeMap<String, String>>,
    cache_dir: Option<PathBuf>,
    cache_limit: Option<&Bound<'_, PyAny>>,
) -> PyResult<StoreOptions> {
    let given: Vec<&str> = [
        (
            "storage_options",
            pairs.as_ref().is_some_and(|p| !p.is_empty()),
        ),
        ("cache_dir", cache_dir.is_some()),
        ("cache_limit", cache_limit.is_some_and(|l| !l.is_none())),
    ]
    .into_iter()
    .filter_map(|(name, given)| given.then_some(name))
    .collect();
    pinfeed_store::refuse_on_local_path(is_url, &given)
        .map_err(|message| value_error(py, "Config", message))?;
    let mut store = StoreOptions::new();
    for (key, value) in pairs.unwrap_or_default() {
        store
            .set(&key, value)
            .map_err(|e| source_error(&e).into_pyerr(py))?;
    }
    store.cache_limit =
        size_arg(cache_limit, "cache_limit")?.map_or(DEFAULT_CACHE_LIMIT, |n| n as u64);
    store.cache_dir = cache_dir;
    Ok(store)
}

/// `stats()["network"]`: what the source fetched from object storage, or `None`.
pub(crate) fn network_dict<'py>(
    py: Python<'py>,
    network: Option<&NetworkStats>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(n) = network else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("bytes_fetched", n.bytes_fetched)?;
    d.set_item("requests", n.requests)?;
    d.set_item("retries", n.retries)?;
    d.set_item("cache_hits", n.cache_hits)?;
    d.set_item("cache_misses", n.cache_misses)?;
    d.set_item("cache_errors", n.cache_errors)?;
    d.set_item("wait", n.wait.as_secs_f64())?;
    Ok(Some(d))
}

/// Whether ``path`` names objects in object storage (``s3://``, ``gs://``, ``az://``,
/// ``https://``, ...) rather than a local file: the rule every source opener uses.
#[pyfunction]
pub(crate) fn is_url(path: &str) -> bool {
    pinfeed_store::is_url(path)
}
