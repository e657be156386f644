//! Opening the dataset and parsing the options that name how it is read.

use std::sync::Arc;

use anyhow::Context as _;
use anyhow::{bail, Result};
use pinfeed::{PinMethod, Shuffle};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{open_with, Layout, ReadOptions, Source};

pub fn parse_shuffle(text: &str) -> Result<Shuffle> {
    let bad = || {
        anyhow::anyhow!(
            "unknown shuffle {text:?}: expected none, random or block:B:W (e.g. block:64:16)"
        )
    };
    match text {
        "none" => Ok(Shuffle::None),
        "random" => Ok(Shuffle::Random),
        _ => {
            let rest = text.strip_prefix("block:").ok_or_else(bad)?;
            let (b, w) = rest.split_once(':').ok_or_else(bad)?;
            let block = b.parse().map_err(|_| bad())?;
            let window = w.parse().map_err(|_| bad())?;
            Ok(Shuffle::Block { block, window })
        }
    }
}

pub fn parse_pin_method(text: &str) -> Result<PinMethod> {
    match text {
        "register" => Ok(PinMethod::Register),
        "hostalloc" | "host-alloc" => Ok(PinMethod::HostAlloc),
        _ => bail!("unknown pin method {text:?}: expected register or hostalloc"),
    }
}

/// Opens the dataset at `path`. `dtype` and `shape` describe a raw record file's records, as
/// numpy's `np.memmap(path, dtype, shape=(n, *shape))` would (the dims of a sub-array dtype
/// such as `2,3B` come after `shape`); for a file with a header they must agree with it.
pub fn open_source(
    path: &std::path::Path,
    dtype: Option<&str>,
    shape: Option<&[u64]>,
    read: &ReadOptions,
    store: &pinfeed_store::StoreOptions,
) -> Result<Arc<dyn Source>> {
    let raw_layout = match dtype {
        None => None,
        Some(dtype) => Some(
            parse_user_dtype(dtype)
                .and_then(|(dtype, sub)| Layout::new(dtype, record_shape(shape, &sub)))
                .with_context(|| format!("{}: --dtype/--shape", path.display()))?,
        ),
    };
    let url = path.to_str().filter(|p| pinfeed_store::is_url(p));
    let opened = match url {
        Some(url) => pinfeed_store::open(url, raw_layout.clone(), read, store)
            .map(|s| Box::new(s) as Box<dyn Source>),
        None => open_with(path, raw_layout.clone(), read),
    };
    let source: Arc<dyn Source> = match opened {
        Ok(source) => Arc::from(source),
        Err(e) if url.is_some() => return Err(e.into()),
        // Python refuses to guess the element type of raw records; so does the command.
        Err(_) if raw_layout.is_none() && shape.is_some() && is_raw(path, read) => bail!(
            "{}: a raw record file needs --dtype (its element type, e.g. --dtype u8) as well as \
             --shape",
            path.display()
        ),
        Err(e) => return Err(e.into()),
    };
    // Without --dtype, --shape is checked against the header's element type.
    let asked = match (raw_layout, shape) {
        (Some(layout), _) => Some(layout),
        (None, Some(shape)) => Some(
            Layout::new(source.layout().dtype.clone(), shape.to_vec())
                .with_context(|| format!("{}: --shape", path.display()))?,
        ),
        (None, None) => None,
    };
    if let Some(asked) = asked {
        if source.layout() != &asked {
            bail!(
                "{}: the file's header gives records of {} {:?} ({} bytes), not the --dtype/--shape given, {} {:?} ({} bytes)",
                path.display(),
                source.layout().dtype,
                source.layout().shape,
                source.layout().record_bytes(),
                asked.dtype,
                asked.shape,
                asked.record_bytes()
            );
        }
    }
    Ok(source)
}

/// The shape of one record: `shape`, then the dims of a sub-array dtype, as numpy orders them
/// (`np.zeros(4, dtype='2,3B').shape` is `(4, 2, 3)`).
pub fn record_shape(shape: Option<&[u64]>, subarray: &[u64]) -> Vec<u64> {
    let mut full = shape.unwrap_or(&[]).to_vec();
    full.extend(subarray);
    full
}

/// Whether `path` opens as raw records when given an element type: a dataset without a header.
fn is_raw(path: &std::path::Path, read: &ReadOptions) -> bool {
    parse_user_dtype("u8")
        .and_then(|(dtype, _)| Layout::new(dtype, Vec::new()))
        .is_ok_and(|bytes| open_with(path, Some(bytes), read).is_ok())
}
