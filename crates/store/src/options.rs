//! How a store is reached: `key=value` storage options, the retry limit and the local cache.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use pinfeed_source::{Result, SourceError};

/// Default [`StoreOptions::retries`]: a range is sent again up to 10 times.
pub const DEFAULT_RETRIES: u32 = 10;

/// Default [`StoreOptions::request_size`]: ranged GETs of up to 8 MiB. Large enough that a
/// request's fixed cost (a round trip, the server's lookup, a few hundred microseconds on
/// loopback) is small beside its transfer; small enough that a batch of a few MiB is several
/// requests in flight at once.
pub const DEFAULT_REQUEST_SIZE: usize = 8 << 20;

/// Default [`StoreOptions::coalesce_gap`]: two ranges of one object at most 1 MiB apart are
/// fetched as one request and the bytes between them dropped; a round trip costs more than
/// receiving 1 MiB on any network pinfeed is meant for.
pub const DEFAULT_COALESCE_GAP: u64 = 1 << 20;

/// The first wait before a retry; each later one doubles, up to [`MAX_BACKOFF`], and is drawn
/// uniformly from its upper half (jitter, so that throttled readers do not return together).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait before one retry.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Per-request time limits set unless the storage options say otherwise: a request gives up
/// after `timeout` in all, after `connect_timeout` without a connection, and after
/// `read_timeout` without a byte of the body; each is then retried like a reset.
pub const DEFAULT_TIMEOUTS: [(&str, &str); 3] = [
    ("timeout", "60s"),
    ("connect_timeout", "5s"),
    ("read_timeout", "15s"),
];

/// Keys pinfeed reads itself; every other key goes to the store's builder in `object_store`
/// (`endpoint`, `region`, `access_key_id`, `allow_http`, `timeout`, ...).
const OWN_KEYS: [&str; 5] = [
    "retries",
    "request_size",
    "coalesce_gap",
    "path_style",
    "root_certificate",
];

/// Words that mark an option (or environment variable) as a credential: its value is never
/// printed.
const SECRET_WORDS: [&str; 6] = ["secret", "token", "key", "password", "sas", "credential"];

/// The one rule for store settings given with a dataset that is not a URL, for every entry
/// point: refused, naming the settings given as the caller spells them (`--cache-dir`,
/// `storage_options`), since on a local path they would do nothing and whoever gave them
/// expected object storage. The caller leads the message with the dataset's name.
pub fn refuse_on_local_path(is_url: bool, given: &[&str]) -> std::result::Result<(), String> {
    if is_url || given.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} given for a local path: store settings apply to object-storage URLs (s3://, gs://, \
         az://, https://) only",
        given.join(" and ")
    ))
}

/// How objects are fetched: options for the store's client, pinfeed's own limits, and the
/// optional local cache. `Debug` never shows a credential's value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// `key=value` options, pinfeed's own and the builder's.
    pairs: BTreeMap<String, String>,
    /// Where fetched blocks are kept between epochs and processes; `None` for no cache.
    pub cache_dir: Option<PathBuf>,
    /// Bytes the cache may hold; least recently used blocks are removed past it. Ignored
    /// without `cache_dir`.
    pub cache_limit: u64,
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: BTreeMap<&str, &str> = self
            .pairs
            .iter()
            .map(|(k, v)| {
                let v = if is_secret_key(k) { "***" } else { v.as_str() };
                (k.as_str(), v)
            })
            .collect();
        f.debug_struct("StoreOptions")
            .field("pairs", &shown)
            .field("cache_dir", &self.cache_dir)
            .field("cache_limit", &self.cache_limit)
            .finish()
    }
}

fn options_err(reason: String) -> SourceError {
    SourceError::Options { reason }
}

impl StoreOptions {
    /// No options: the standard credential chain, default limits, no cache.
    pub fn new() -> StoreOptions {
        StoreOptions::default()
    }

    /// Sets `key` to `value` (keys are lower-cased; a later value replaces an earlier one).
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> Result<()> {
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty() {
            return Err(options_err("storage option with an empty key".into()));
        }
        let value = value.into();
        self.pairs.insert(key.clone(), value);
        // Checked now, so that a typo fails at open rather than mid-epoch.
        if let Err(e) = self.own(&key) {
            self.pairs.remove(&key);
            return Err(e);
        }
        Ok(())
    }

    /// Parses one `key=value` pair (`--storage-option endpoint=http://127.0.0.1:9000`) and
    /// sets it.
    pub fn set_pair(&mut self, pair: &str) -> Result<()> {
        let Some((key, value)) = pair.split_once('=') else {
            let key = pair.trim();
            return Err(options_err(format!(
                "storage option {key:?}: expected key=value"
            )));
        };
        self.set(key, value)
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.get(key).map(String::as_str)
    }

    /// Times a failed range is sent again before the read fails ([`DEFAULT_RETRIES`]).
    pub fn retries(&self) -> u32 {
        self.own("retries")
            .ok()
            .flatten()
            .map_or(DEFAULT_RETRIES, |n| n as u32)
    }

    /// The largest ranged GET ([`DEFAULT_REQUEST_SIZE`]).
    pub fn request_size(&self) -> usize {
        self.own("request_size")
            .ok()
            .flatten()
            .map_or(DEFAULT_REQUEST_SIZE, |n| n as usize)
    }

    /// Ranges of one object at most this far apart are fetched together
    /// ([`DEFAULT_COALESCE_GAP`]).
    pub fn coalesce_gap(&self) -> u64 {
        self.own("coalesce_gap")
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_COALESCE_GAP)
    }

    /// A PEM file of certificates trusted, besides the system's, as roots for an https://
    /// server's certificate (`root_certificate=/path/ca.pem`): a private certificate
    /// authority's, or a test server's. `object_store` takes them for its HTTP store only
    /// through `ClientOptions`, not as a `key=value` setting, so pinfeed reads this key itself.
    pub fn root_certificate(&self) -> Option<&str> {
        self.get("root_certificate")
    }

    /// pinfeed's own numeric option `key`, checked; `None` when not set or not numeric.
    fn own(&self, key: &str) -> Result<Option<u64>> {
        let Some(value) = self.pairs.get(key) else {
            return Ok(None);
        };
        let value = value.trim();
        let (lo, hi): (u64, u64) = match key {
            "retries" => (0, 1000),
            "request_size" => (4096, 1 << 30),
            "coalesce_gap" => (0, 1 << 30),
            "path_style" => {
                return match value {
                    "true" | "1" | "false" | "0" => Ok(None),
                    _ => Err(options_err(format!(
                        "storage option path_style={value:?}: expected true or false"
                    ))),
                }
            }
            _ => return Ok(None),
        };
        match value.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(options_err(format!(
                "storage option {key}={value:?}: expected an integer from {lo} to {hi}"
            ))),
        }
    }

    /// The options for the store's builder: the default timeouts, then every key that is
    /// not pinfeed's own (`path_style=true` becomes `virtual_hosted_style_request=false`).
    pub(crate) fn builder_pairs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = DEFAULT_TIMEOUTS
            .iter()
            .filter(|(k, _)| !self.pairs.contains_key(*k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in &self.pairs {
            if k == "path_style" {
                let path_style = matches!(v.trim(), "true" | "1");
                out.push((
                    "virtual_hosted_style_request".into(),
                    (!path_style).to_string(),
                ));
            } else if !OWN_KEYS.contains(&k.as_str()) {
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }

    /// Every credential this process could send: the values of secret-looking options and of
    /// the environment's secret-looking cloud variables. Errors are scrubbed of them.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let env = std::env::vars().filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            ["aws_", "google_", "azure_", "gcs_"]
                .iter()
                .any(|p| k.starts_with(p))
                && is_secret_key(&k)
        });
        let mut secrets: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| is_secret_key(k))
            .map(|(_, v)| v.clone())
            .chain(env.map(|(_, v)| v))
            .filter(|v| v.len() >= 4)
            .collect();
        // Longest first, so that a secret containing another is removed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets
    }
}

/// Whether an option or environment variable named `key` holds a credential.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| key.contains(w))
}

/// `text` with every credential replaced by `***`, on one line.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.replace(['\n', '\r'], " ");
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_split_between_pinfeed_and_the_builder() {
        let mut o = StoreOptions::new();
        o.set_pair("endpoint=http://127.0.0.1:9000").unwrap();
        o.set_pair("Retries=3").unwrap();
        o.set_pair("path_style=true").unwrap();
        o.set_pair("timeout=2s").unwrap();
        assert_eq!(o.retries(), 3);
        let pairs = o.builder_pairs();
        assert!(pairs.contains(&("endpoint".into(), "http://127.0.0.1:9000".into())));
        assert!(pairs.contains(&("virtual_hosted_style_request".into(), "false".into())));
        assert!(pairs.contains(&("timeout".into(), "2s".into())));
        assert!(!pairs.contains(&("timeout".into(), "60s".into())));
        assert!(pairs.contains(&("connect_timeout".into(), "5s".into())));
        assert!(!pairs.iter().any(|(k, _)| k == "retries"));
    }

    #[test]
    fn bad_pairs_are_refused_at_once() {
        let mut o = StoreOptions::new();
        let e = o.set_pair("retries").unwrap_err().to_string();
        assert!(e.contains("expected key=value"), "{e}");
        let e = o.set_pair("retries=many").unwrap_err().to_string();
        assert!(e.contains("retries=\"many\""), "{e}");
        assert!(o.set_pair("request_size=12").is_err());
        assert!(o.set_pair("path_style=maybe").is_err());
        assert!(o.set_pair("=x").is_err());
    }

    #[test]
    fn credentials_are_never_shown() {
        let mut o = StoreOptions::new();
        o.set("secret_access_key", "hunter2-very-secret").unwrap();
        o.set("region", "us-east-1").unwrap();
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("us-east-1"),
            "{shown}"
        );
        let text = scrub("denied for hunter2-very-secret\nnext", &o.secrets());
        assert_eq!(text, "denied for *** next");
    }
}
