//! The connection to one store: `object_store`'s client, driven by the reading threads on
//! lanes of their own ([`crate::lane`]), the bound on requests in flight, retries, the
//! counters, and the optional local cache.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as ObjectPath;
use object_store::{
    Certificate, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt as _,
    RetryConfig,
};
use pinfeed_source::{NetworkStats, Result, SourceError};
use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::fault::{backoff, one_line, Fault};
use crate::fetch::{plan, Part, Request};
use crate::lane::{LaneConnector, Lanes};
use crate::location::Location;
use crate::options::{scrub, StoreOptions};

/// One object of a dataset, as listed (or looked up) once when the dataset was opened.
#[derive(Clone, Debug)]
pub(crate) struct Object {
    pub(crate) path: ObjectPath,
    /// `scheme://bucket/key`: what errors name.
    pub(crate) url: String,
    pub(crate) size: u64,
    /// Sent as `If-Match` with every read, so that an object replaced while it is streamed is
    /// an error rather than a mix of two versions (see [`Object::if_match`]).
    pub(crate) etag: Option<String>,
}

impl Object {
    /// The `If-Match` a read sends: the ETag when it is a quoted entity-tag (RFC 9110), as
    /// S3, GCS, Azure and conforming WebDAV servers give it. Some servers give ETags without
    /// the quotes (SeaweedFS's WebDAV gateway, in its listing and its GET headers alike); Go's
    /// `net/http`, which serves those GETs, then refuses every `If-Match` with 412, so such an
    /// ETag is not sent but compared with each response's own ([`Client::get_once`]).
    fn if_match(&self) -> Option<String> {
        let tag = self.etag.as_deref()?;
        let quoted = tag.strip_prefix("W/").unwrap_or(tag);
        (quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'))
            .then(|| tag.to_owned())
    }
}

/// Counters behind [`NetworkStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) bytes_fetched: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) cache_misses: AtomicU64,
    pub(crate) cache_errors: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A store's client and everything reads of it share.
#[derive(Debug)]
pub(crate) struct Client {
    // Field order is drop order: the store's connections go before the runtimes they run on.
    store: Arc<dyn ObjectStore>,
    /// The same store's listing page by page, where its API pages (S3, GCS, Azure).
    pages: Option<Pages>,
    /// Where requests run: each reading thread drives one while it reads.
    lanes: Lanes,
    /// Requests in flight over all reading threads: `queue_depth` permits.
    in_flight: Semaphore,
    queue_depth: u32,
    retries: u32,
    request_size: usize,
    coalesce_gap: u64,
    /// Values removed from every message ([`StoreOptions::secrets`]).
    secrets: Vec<String>,
    pub(crate) counters: Counters,
    cache: Option<Cache>,
}

/// A store, and its listing page by page where it has one.
type Stores = (Arc<dyn ObjectStore>, Option<Pages>);

/// A store's listing page by page (`PaginatedListStore` has no `Debug` of its own).
struct Pages(Arc<dyn PaginatedListStore>);

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PaginatedListStore")
    }
}

/// The most pages a listing may take (S3 gives up to 1000 objects a page): past it, a server
/// whose listing does not end is an error rather than a constructor that never returns.
const MAX_LIST_PAGES: usize = 100_000;

/// Builds the store for `base` (`s3://bucket`, ...) from the environment's standard
/// configuration and then `pairs`, with `object_store`'s own retries off (pinfeed retries
/// itself, resuming a range where it broke off, and counts the retries).
macro_rules! build_store {
    ($builder:expr, $key:ty, $base:expr, $pairs:expr, $scheme:expr, $err:expr) => {{
        let mut builder = $builder
            .with_url($base)
            .with_http_connector(LaneConnector)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        for (key, value) in $pairs {
            let parsed: $key = key.parse().map_err(|_| SourceError::Options {
                reason: format!(
                    "storage option {key:?} is not a setting of {} stores (object_store's {})",
                    $scheme,
                    stringify!($key)
                ),
            })?;
            builder = builder.with_config(parsed, value);
        }
        Arc::new(builder.build().map_err($err)?)
    }};
}

impl Client {
    /// Connects to the store of `location` as `options` say, with at most `queue_depth`
    /// requests in flight.
    pub(crate) fn connect(
        location: &Location,
        options: &StoreOptions,
        queue_depth: u32,
    ) -> Result<Client> {
        let secrets = options.secrets();
        let base = location.base.as_str();
        let pairs = options.builder_pairs();
        let build_err = |e: object_store::Error| SourceError::Open {
            path: PathBuf::from(base),
            source: io::Error::other(scrub(&e.to_string(), &secrets)),
        };
        use object_store::{aws, azure, gcp, http};
        let scheme = base.split("://").next().unwrap_or_default();
        if options.root_certificate().is_some() && !matches!(scheme, "http" | "https") {
            return Err(SourceError::Options {
                reason: format!(
                    "storage option root_certificate applies to http(s):// URLs, not {scheme}://; \
                     there, set SSL_CERT_FILE to a PEM file of the roots to trust"
                ),
            });
        }
        // The stores whose listings come in pages are kept as such too: `list` follows their
        // pages itself, to stop a listing that never ends.
        fn paged<S: ObjectStore + PaginatedListStore>(store: Arc<S>) -> Stores {
            (store.clone(), Some(Pages(store)))
        }
        let (store, pages): Stores = match scheme {
            "s3" | "s3a" => paged(build_store!(
                aws::AmazonS3Builder::from_env(),
                aws::AmazonS3ConfigKey,
                base,
                pairs,
                "s3://",
                build_err
            )),
            "gs" => paged(build_store!(
                gcp::GoogleCloudStorageBuilder::from_env(),
                gcp::GoogleConfigKey,
                base,
                pairs,
                "gs://",
                build_err
            )),
            "http" | "https" => (
                build_store!(
                    http::HttpBuilder::new().with_client_options(http_client_options(options)?),
                    object_store::ClientConfigKey,
                    base,
                    pairs,
                    "http(s)://",
                    build_err
                ),
                None,
            ),
            _ => paged(build_store!(
                azure::MicrosoftAzureBuilder::from_env(),
                azure::AzureConfigKey,
                base,
                pairs,
                "az://",
                build_err
            )),
        };
        let cache = options
            .cache_dir
            .as_ref()
            .map(|dir| Cache::new(dir.clone(), options.cache_limit));
        Ok(Client {
            store,
            pages,
            lanes: Lanes::default(),
            in_flight: Semaphore::new(queue_depth.max(1) as usize),
            queue_depth: queue_depth.max(1),
            retries: options.retries(),
            request_size: options.request_size(),
            coalesce_gap: options.coalesce_gap(),
            secrets,
            counters: Counters::default(),
            cache,
        })
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> NetworkStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        NetworkStats {
            bytes_fetched: get(&c.bytes_fetched),
            requests: get(&c.requests),
            retries: get(&c.retries),
            cache_hits: get(&c.cache_hits),
            cache_misses: get(&c.cache_misses),
            cache_errors: get(&c.cache_errors),
            wait: Duration::from_nanos(get(&c.wait_ns)),
        }
    }

    /// "object store s3://bucket (32 requests in flight, ...)", for statistics.
    pub(crate) fn describe(&self, base: &str) -> String {
        let cache = match &self.cache {
            Some(c) => format!(", cache {}", c.describe()),
            None => String::new(),
        };
        format!(
            "object store {base} (ranged GETs of up to {} MiB, {} in flight, {} retries{cache})",
            self.request_size >> 20,
            self.queue_depth,
            self.retries
        )
    }

    /// Scrubs credentials out of `text` and keeps it on one line.
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub(text, &self.secrets)
    }

    /// The error for an object that cannot be listed, looked up or opened.
    pub(crate) fn open_error(&self, url: &str, fault: Fault) -> SourceError {
        let mut message = self.scrub(&fault.message);
        if message.contains("169.254.169.254") {
            // The end of the credential chain: nothing was configured, so the client asked
            // the instance metadata endpoint, which is not there.
            message = format!(
                "no credentials found (storage options access_key_id/secret_access_key, the \
                 AWS_* environment variables, or instance metadata, which did not answer): \
                 {message}"
            );
        } else if message.contains("URL scheme is not allowed") {
            // reqwest refuses plain http:// unless object_store was told to allow it.
            message = format!("plain http:// needs the storage option allow_http=true: {message}");
        } else if message.contains("invalid peer certificate") {
            message = format!(
                "the server's certificate is not trusted (a private authority's root is trusted \
                 with the storage option root_certificate=FILE.pem or SSL_CERT_FILE): {message}"
            );
        }
        SourceError::Open {
            path: PathBuf::from(url),
            source: io::Error::new(fault.kind, message),
        }
    }

    /// Runs `future` on a lane driven by the calling thread, and counts the time as waiting
    /// on the network. `url` names what was read in the error of a lane that could not start.
    fn block_on<F: std::future::Future>(&self, url: &str, future: F) -> Result<F::Output> {
        let start = Instant::now();
        let out = self.lanes.block_on(future);
        bump(&self.counters.wait_ns, start.elapsed().as_nanos() as u64);
        out.map_err(|e| SourceError::Open {
            path: PathBuf::from(url),
            source: io::Error::new(e.kind(), format!("could not start an HTTP runtime: {e}")),
        })
    }

    /// Runs every request of `requests` on `object`, all of them in flight together up to the
    /// queue depth.
    pub(crate) fn get_all(&self, object: &Object, requests: &mut [Request<'_>]) -> Result<()> {
        let gets = requests.iter_mut().map(|r| self.get(object, r));
        self.block_on(&object.url, futures::future::try_join_all(gets))??;
        Ok(())
    }

    /// The objects directly under `prefix` (`""` for the whole store), as one listing,
    /// retried as a ranged GET is.
    pub(crate) fn list(&self, location: &Location, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let url = location.url_of(prefix);
        let path = parse_path(prefix.trim_end_matches('/'), &url)?;
        let prefix = (!prefix.is_empty()).then_some(&path);
        let listed = match &self.pages {
            Some(Pages(pages)) => self.block_on(&url, self.list_pages(pages.as_ref(), prefix))?,
            None => self.block_on(&url, async {
                let mut retry = Retry::default();
                loop {
                    bump(&self.counters.requests, 1);
                    match self.store.list_with_delimiter(prefix).await {
                        Ok(listed) => return Ok(listed.objects),
                        Err(e) => retry.after(self, Fault::of(&e)).await?,
                    }
                }
            })?,
        };
        listed.map_err(|(fault, retries)| self.open_error(&url, retries.explain(fault)))
    }

    /// The objects directly under `prefix`, page after page, each page retried as a ranged
    /// GET is. A page token given twice (the listing would start over, forever) or a listing
    /// of more than [`MAX_LIST_PAGES`] pages is an error.
    async fn list_pages(
        &self,
        pages: &dyn PaginatedListStore,
        prefix: Option<&ObjectPath>,
    ) -> std::result::Result<Vec<ObjectMeta>, (Fault, Retries)> {
        // `list_with_delimiter` adds the delimiter after the prefix; a paged listing does not.
        let prefix = prefix.map(|p| format!("{p}/"));
        let mut objects = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut token = None;
        let endless = |message: String| {
            let fault = Fault {
                kind: io::ErrorKind::InvalidData,
                retry: false,
                message,
            };
            let retries = Retries { done: 0, limit: 0 };
            Err((fault, retries))
        };
        for _ in 0..MAX_LIST_PAGES {
            let mut retry = Retry::default();
            let page = loop {
                bump(&self.counters.requests, 1);
                let options = PaginatedListOptions {
                    delimiter: Some("/".into()),
                    page_token: token.clone(),
                    ..PaginatedListOptions::default()
                };
                match pages.list_paginated(prefix.as_deref(), options).await {
                    Ok(page) => break page,
                    Err(e) => retry.after(self, Fault::of(&e)).await?,
                }
            };
            objects.extend(page.result.objects);
            match page.page_token {
                None => return Ok(objects),
                Some(next) if !seen.insert(next.clone()) => {
                    return endless(format!(
                        "the listing gave the continuation token {next:?} a second time, after \
                         {} objects: it would never end",
                        objects.len()
                    ))
                }
                Some(next) => token = Some(next),
            }
        }
        endless(format!(
            "the listing went on past {MAX_LIST_PAGES} pages ({} objects)",
            objects.len()
        ))
    }

    /// The object named `key`, looked up with one `HEAD`, retried as a ranged GET is.
    pub(crate) fn head(&self, location: &Location, key: &str) -> Result<ObjectMeta> {
        let url = location.url_of(key);
        let path = parse_path(key, &url)?;
        let found = self.block_on(&url, async {
            let mut retry = Retry::default();
            loop {
                bump(&self.counters.requests, 1);
                match self.store.head(&path).await {
                    Ok(meta) => return Ok(meta),
                    Err(e) => retry.after(self, Fault::of(&e)).await?,
                }
            }
        })?;
        found.map_err(|(fault, retries)| self.open_error(&url, retries.explain(fault)))
    }

    /// Bytes `range` of `object` in a new buffer (headers).
    pub(crate) fn fetch_vec(
        &self,
        object: &Object,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        self.fetch(
            object,
            vec![Part {
                offset: range.start,
                dst: &mut buf,
            }],
        )?;
        Ok(buf)
    }

    /// Fills `parts` from `object` (through the cache when there is one): requests of at most
    /// the request size, neighbours coalesced, all of them in flight together up to the queue
    /// depth. An error names the object and the range that failed; the parts are then partly
    /// written and must not be used.
    pub(crate) fn fetch(&self, object: &Object, parts: Vec<Part<'_>>) -> Result<()> {
        self.fetch_with_gap(object, parts, self.coalesce_gap)
    }

    /// [`Client::fetch`] coalescing ranges at most `gap` bytes apart (the cache's blocks are
    /// its own).
    pub(crate) fn fetch_with_gap(
        &self,
        object: &Object,
        parts: Vec<Part<'_>>,
        gap: u64,
    ) -> Result<()> {
        if let Some(cache) = &self.cache {
            return cache.fetch(self, object, parts);
        }
        let mut requests = plan(parts, self.request_size, gap);
        self.get_all(object, &mut requests)
    }

    /// Bytes of `request` from `object`, retried after a retryable fault from where the
    /// last attempt broke off (the bytes before it are in place and correct: the `If-Match`
    /// ETag pins the object's version), at most `retries` times with [`backoff`].
    async fn get(&self, object: &Object, request: &mut Request<'_>) -> Result<()> {
        let mut pos = request.start;
        let mut retry = Retry::default();
        loop {
            let fault = match self.get_once(object, request, &mut pos).await {
                Ok(()) => return Ok(()),
                Err(fault) => fault,
            };
            // Every byte of the range is in place: what failed after them (a connection cut
            // once a body that promised more had sent them) loses nothing, and asking again
            // would ask for an empty range.
            if pos == request.end && fault.retry {
                return Ok(());
            }
            if let Err((fault, retries)) = retry.after(self, fault).await {
                let fault = retries.explain(fault);
                return Err(SourceError::Read {
                    path: PathBuf::from(&object.url),
                    offset: request.start,
                    len: request.len() as usize,
                    source: io::Error::new(fault.kind, self.scrub(&fault.message)),
                });
            }
        }
    }

    /// One GET of `pos .. request.end`, copying the body into the request's parts as it
    /// arrives and advancing `pos` past every byte placed.
    async fn get_once(
        &self,
        object: &Object,
        request: &mut Request<'_>,
        pos: &mut u64,
    ) -> std::result::Result<(), Fault> {
        // The semaphore is never closed, so acquiring only waits.
        let _permit = self.in_flight.acquire().await.ok();
        bump(&self.counters.requests, 1);
        let begin = *pos;
        let if_match = object.if_match();
        let compare = if_match
            .is_none()
            .then_some(object.etag.as_deref())
            .flatten();
        let options = GetOptions {
            range: Some(GetRange::Bounded(begin..request.end)),
            if_match,
            ..GetOptions::default()
        };
        let got = self
            .store
            .get_opts(&object.path, options)
            .await
            .map_err(|e| Fault::of(&e))?;
        // An ETag not sent as `If-Match` pins the version here: the response names its own.
        if compare.is_some_and(|want| got.meta.e_tag.as_deref().is_some_and(|tag| tag != want)) {
            return Err(Fault::changed());
        }
        let mut body = got.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // The range is complete; the rest of a body that promised more is not needed.
                Err(_) if *pos == request.end => break,
                Err(e) => return Err(Fault::of(&e)),
            };
            let n = chunk.len() as u64;
            if *pos + n > request.end {
                return Err(Fault::overlong(request.end - begin));
            }
            request.fill(*pos, &chunk);
            *pos += n;
            bump(&self.counters.bytes_fetched, n);
        }
        if *pos < request.end {
            return Err(Fault::truncated(*pos - begin, request.end - begin));
        }
        Ok(())
    }
}

/// The one retry policy of every request to a store (LIST, HEAD and ranged GETs): a
/// retryable fault is retried after [`backoff`], at most [`StoreOptions::retries`] times.
#[derive(Default)]
struct Retry {
    done: u32,
}

/// How many retries a request had when it failed for good, and the limit, for its message.
#[derive(Clone, Copy)]
struct Retries {
    done: u32,
    limit: u32,
}

impl Retries {
    /// `fault` with the retries it took said in its message (nothing when there were none).
    fn explain(self, mut fault: Fault) -> Fault {
        if self.done > 0 {
            fault.message = format!(
                "{} (after {} retries; storage option retries={})",
                fault.message, self.done, self.limit
            );
        }
        fault
    }
}

impl Retry {
    /// Waits before the next attempt after `fault`, counting the retry; or gives the fault
    /// back, with the retries so far, when it is not worth another request or the limit is
    /// reached.
    async fn after(
        &mut self,
        client: &Client,
        fault: Fault,
    ) -> std::result::Result<(), (Fault, Retries)> {
        if !fault.retry || self.done >= client.retries {
            let retries = Retries {
                done: self.done,
                limit: client.retries,
            };
            return Err((fault, retries));
        }
        self.done += 1;
        bump(&client.counters.retries, 1);
        tokio::time::sleep(backoff(self.done)).await;
        Ok(())
    }
}

/// `object_store`'s client options for an http(s):// store: the system's roots, and those of
/// the `root_certificate` storage option's file besides.
fn http_client_options(options: &StoreOptions) -> Result<ClientOptions> {
    let client = ClientOptions::new();
    let Some(file) = options.root_certificate() else {
        return Ok(client);
    };
    let bad = |what: String| SourceError::Options {
        reason: format!("storage option root_certificate={file:?}: {what}"),
    };
    let pem = std::fs::read(file).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let roots = Certificate::from_pem_bundle(&pem)
        .map_err(|e| bad(format!("not PEM certificates: {}", one_line(&e))))?;
    if roots.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(roots
        .into_iter()
        .fold(client, ClientOptions::with_root_certificate))
}

/// An object path from a key of the URL, or an error naming the URL.
fn parse_path(key: &str, url: &str) -> Result<ObjectPath> {
    ObjectPath::parse(key).map_err(|e| SourceError::NoShards {
        dataset: url.to_owned(),
        reason: format!("not a valid object key: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quoted_etags_are_sent_as_if_match() {
        let object = |etag: Option<&str>| Object {
            path: ObjectPath::from("k"),
            url: "http://h/k".into(),
            size: 1,
            etag: etag.map(str::to_owned),
        };
        let sent = |etag| object(etag).if_match();
        assert_eq!(sent(Some("\"abc\"")).as_deref(), Some("\"abc\""));
        assert_eq!(sent(Some("W/\"abc\"")).as_deref(), Some("W/\"abc\""));
        assert_eq!(sent(Some("0b6536fcaf64")), None);
        assert_eq!(sent(Some("\"")), None);
        assert_eq!(sent(None), None);
    }
}
