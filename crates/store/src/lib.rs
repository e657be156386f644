//! Object storage for pinfeed: `.npy` shards, raw record files and tables in S3 (or any
//! S3-compatible store), Google Cloud Storage, Azure Blob Storage or over HTTP(S), read by
//! ranged GETs straight into the caller's memory (in pinfeed, a slot of the pinned ring).
//!
//! [`open`] takes a URL (`s3://bucket/prefix/`, `s3://bucket/prefix/part-*.npy`,
//! `s3://bucket/data.npy`, `gs://...`, `az://...`, `https://host/data.npy`) and returns a
//! [`RemoteDataset`], a [`Source`] like a local file: the objects are listed and their `.npy`
//! headers read once, at open (a table's format reads what it needs through the same client:
//! a Parquet object's footer, then the chunks of the columns asked for, as its row groups are
//! decoded); after that each read is ranged GETs of the records asked for,
//! neighbouring ranges coalesced ([`StoreOptions::coalesce_gap`]), long ranges cut
//! ([`StoreOptions::request_size`]), every request of a read in flight at once up to the queue
//! depth (over all reading threads), and each body copied into its place in the caller's
//! buffer as it arrives: one copy. `object_store` (Apache Arrow's) is the client. Its async
//! work runs only inside this crate, on the reading threads: each read drives a tokio runtime
//! of its own (a lane: a current-thread runtime and connections of its own, reused by the next
//! read) until its requests are done, so the rest of pinfeed stays synchronous and a body's
//! chunks never cross threads.
//!
//! Credentials come from the store's standard chain (for S3: `AWS_*` environment variables,
//! web identity, the container and instance metadata endpoints) and [`StoreOptions`]
//! (`endpoint`, `region`, `path_style`, `allow_http`, `access_key_id`, ...). No message,
//! `Debug` output or statistic holds a credential.
//!
//! A throttling reply (429, 503 SlowDown), a server error, a reset, a timeout or a body cut
//! short is retried with exponential backoff and jitter, resuming the range where it broke off,
//! at most [`StoreOptions::retries`] times; then the read fails with an error naming the object
//! and the range, and its buffer is not delivered. An optional local cache
//! ([`StoreOptions::cache_dir`]) keeps fetched blocks for later epochs and other processes.
//!
//! ```no_run
//! use pinfeed_source::{ReadOptions, Source};
//! use pinfeed_store::StoreOptions;
//!
//! let mut store = StoreOptions::new();
//! store.set_pair("endpoint=http://127.0.0.1:9000")?;
//! store.set_pair("allow_http=true")?;
//! let source = pinfeed_store::open("s3://bucket/train/", None, &ReadOptions::default(), &store)?;
//! let mut first = vec![0u8; source.layout().record_bytes()];
//! source.read_records(0, &mut first)?;
//! # Ok::<(), pinfeed_source::SourceError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pinfeed_source::tokens::{self, Sample, TokenDType, TokenOptions, TokenSource, TokenStream};
use pinfeed_source::{Layout, ReadOptions, Result, ShardedSource, Source, SourceError};

mod cache;
mod client;
mod fault;
mod fetch;
mod lane;
mod location;
mod object;
mod options;

pub use location::is_url;
pub use object::RemoteDataset;
pub use options::{
    refuse_on_local_path, StoreOptions, DEFAULT_COALESCE_GAP, DEFAULT_REQUEST_SIZE,
    DEFAULT_RETRIES, DEFAULT_TIMEOUTS, FIRST_BACKOFF, MAX_BACKOFF,
};

use client::{Client, Object};
use location::{Location, Selection};
use object::open_object;

/// Opens the dataset at `url`: one object, the objects directly under a prefix (a URL ending
/// in `/`) named with a format's extension (`.npy`, `.parquet`, ...), or the objects whose last
/// name component matches a glob pattern (`*`, `?`, `[a-z]`, matched as local shard patterns
/// are); several objects are shards, taken in byte order of their keys. Objects that are not
/// `.npy` and that no format claims by name or first bytes are raw records of `raw_layout`.
/// Tables (Parquet, Arrow IPC, JSON lines) are read by ranges, as their formats ask, with the
/// format options of `read` (`columns`, ...); their ranges are coalesced only across gaps of
/// at most [`TABLE_COALESCE_GAP`] unless `store` sets `coalesce_gap`. `read.queue_depth`
/// bounds the requests in flight over all reading threads.
pub fn open(
    url: &str,
    raw_layout: Option<Layout>,
    read: &ReadOptions,
    store: &StoreOptions,
) -> Result<RemoteDataset> {
    read.check()?;
    read.format.check()?;
    let location = Location::parse(url)?;
    let client = Arc::new(Client::connect(&location, store, read.queue_depth)?);
    let objects = objects(&client, &location, url)?;
    let gap = match store.get("coalesce_gap") {
        Some(_) => store.coalesce_gap(),
        None => TABLE_COALESCE_GAP,
    };
    let opened = open_all(&client, &objects, raw_layout.as_ref(), read, gap)?;
    let by_ranges = opened.iter().any(|o| o.1);
    let mut shards: Vec<Box<dyn Source>> = opened.into_iter().map(|o| o.0).collect();
    let inner: Box<dyn Source> = match shards.len() {
        1 => shards.pop().expect("one shard"),
        _ => Box::new(ShardedSource::from_sources(url, shards)?),
    };
    Ok(RemoteDataset::new(inner, client, &location.base, by_ranges))
}

/// [`StoreOptions::coalesce_gap`] of tables unless one is given: ranges are coalesced only
/// where they touch, since what lies between two column chunks asked for is a column not
/// asked for.
pub const TABLE_COALESCE_GAP: u64 = 0;

/// Objects whose headers are read at once when a dataset is opened.
const OPEN_THREADS: usize = 16;

/// Opens every object of `objects` in order (a `.npy` object's header is one GET, a Parquet
/// object's footer two), up to [`OPEN_THREADS`] at once: a prefix of a thousand shards is a
/// thousand round trips, which one after another would add seconds to the start. The error of
/// the first object that fails, in their order, is returned.
fn open_all(
    client: &Arc<Client>,
    objects: &[Object],
    raw_layout: Option<&Layout>,
    read: &ReadOptions,
    gap: u64,
) -> Result<Vec<(Box<dyn Source>, bool)>> {
    let next = AtomicUsize::new(0);
    type Opened = Result<(Box<dyn Source>, bool)>;
    let opened: Vec<Mutex<Option<Opened>>> = objects.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..OPEN_THREADS.min(objects.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(object) = objects.get(i) else { break };
                let result = open_object(client.clone(), object.clone(), raw_layout, read, gap);
                *opened[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
            });
        }
    });
    opened
        .into_iter()
        .map(|m| {
            let result = m.into_inner().unwrap_or_else(|p| p.into_inner());
            result.expect("every object was taken by a thread")
        })
        .collect()
}

/// Opens the token data at `url` (a raw token object such as nanoGPT's `train.bin`, `dtype`
/// required; a 1-D integer `.npy`; or several as shards, as [`open`] takes them) as one stream
/// of tokens, for [`token_windows`]. The objects are listed and their headers read here, once:
/// windows of every epoch can be cut from the one stream.
///
/// Ranges of the windows are coalesced only across gaps of at most [`TOKEN_COALESCE_GAP`]
/// unless `store` sets `coalesce_gap`.
///
/// A Megatron index (`.idx`) is refused: the indexed format is read from local disk only. Its
/// `.bin` is a raw token object, which random and sequential windows read as any other.
pub fn open_tokens(
    url: &str,
    dtype: Option<TokenDType>,
    read: &ReadOptions,
    store: &StoreOptions,
) -> Result<TokenStream> {
    if url
        .rsplit('/')
        .next()
        .is_some_and(|name| name.len() > 4 && name[name.len() - 4..].eq_ignore_ascii_case(".idx"))
    {
        return Err(SourceError::Tokens {
            name: url.to_owned(),
            reason: format!("a Megatron index is read from local disk only; {MEGATRON_REMOTE}"),
        });
    }
    let layout = dtype
        .map(|d| Layout::new(d.dtype(), Vec::new()))
        .transpose()?;
    let mut store = store.clone();
    if store.get("coalesce_gap").is_none() {
        store.set("coalesce_gap", TOKEN_COALESCE_GAP.to_string())?;
    }
    let source = match open(url, layout, read, &store) {
        Err(SourceError::NotNpy { path }) => {
            return Err(SourceError::TokenDtypeMissing { path });
        }
        other => other?,
    };
    TokenStream::from_source(Box::new(source), dtype)
}

/// [`StoreOptions::coalesce_gap`] of token data unless one is given: random windows are a few
/// KiB each and scattered, so the records' 1 MiB gap would fetch hundreds of times the
/// windows' bytes. Measured on loopback SeaweedFS (320 steps of 12 random windows of 1025
/// uint16 tokens from a 128 MiB object, 2 reader threads): a 1 MiB gap fetched 694 MB for
/// 7.9 MB of windows at 80 steps/s; 16 KiB fetched 8 MB at 119 steps/s, 0 and 128 KiB alike.
pub const TOKEN_COALESCE_GAP: u64 = 16 << 10;

/// What object storage offers for Megatron data, in the errors that refuse the indexed format.
const MEGATRON_REMOTE: &str = "from object storage, random and sequential windows read its .bin \
     as a raw token object (give its dtype)";

/// The windows of token data opened by [`open_tokens`] (or of a stream opened elsewhere, such
/// as a table's column), picked as `options` say ([`tokens::from_stream`]). Documents sampling
/// needs a Megatron index, which is read from local disk only, or a stream that knows its
/// documents; for other streams it is refused here with an error naming the data.
pub fn token_windows(stream: Arc<TokenStream>, options: &TokenOptions) -> Result<TokenSource> {
    if options.sample == Sample::Documents && stream.document_starts().is_none() {
        return Err(SourceError::Tokens {
            name: stream.name().to_owned(),
            reason: format!(
                "documents sampling needs a Megatron .bin/.idx pair on local disk; \
                 {MEGATRON_REMOTE}"
            ),
        });
    }
    tokens::from_stream(stream, options)
}

/// The objects `location` names, listed once, in byte order of their keys.
fn objects(client: &Client, location: &Location, url: &str) -> Result<Vec<Object>> {
    let prefix = match &location.selection {
        Selection::Object(key) => {
            let meta = client.head(location, key)?;
            return Ok(vec![object_of(location, meta)]);
        }
        Selection::Prefix(prefix) | Selection::Pattern { prefix, .. } => prefix,
    };
    let mut found: Vec<Object> = client
        .list(location, prefix)?
        .into_iter()
        .filter(|m| {
            m.location
                .filename()
                .is_some_and(|name| location.selection.keeps(name))
        })
        .map(|m| object_of(location, m))
        .collect();
    found.sort_by(|a, b| a.url.cmp(&b.url));
    if found.is_empty() {
        let reason = match location.selection {
            Selection::Prefix(_) => format!(
                "no {} object under this prefix",
                pinfeed_source::formats::shard_extensions()
            ),
            _ => "no object matches this pattern".to_owned(),
        };
        return Err(SourceError::NoShards {
            dataset: url.to_owned(),
            reason,
        });
    }
    Ok(found)
}

fn object_of(location: &Location, meta: object_store::ObjectMeta) -> Object {
    Object {
        url: location.url_of(meta.location.as_ref()),
        path: meta.location,
        size: meta.size,
        etag: meta.e_tag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_megatron_index_is_refused_by_name_before_any_request() {
        // No endpoint answers here: the refusal must come before the store is asked.
        let e = open_tokens(
            "s3://bucket/data/corpus_text_document.IDX",
            None,
            &ReadOptions::default(),
            &StoreOptions::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("s3://bucket/data/corpus_text_document.IDX: a Megatron index"),
            "{e}"
        );
        assert!(e.contains("raw token object") && !e.contains('\n'), "{e}");
    }
}
