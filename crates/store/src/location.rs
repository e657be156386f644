//! Dataset URLs: which store, and which objects of it (one, a prefix, or a glob pattern).

use pinfeed_source::formats::is_shard_name;
use pinfeed_source::{glob_match, Result, SourceError};

/// URL schemes read from object storage, as `object_store` names them: S3 (and S3-compatible
/// stores), Google Cloud Storage, Azure Blob Storage and plain HTTP(S).
const SCHEMES: [&str; 10] = [
    "s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "http", "https",
];

/// Whether `text` names a dataset in object storage (`s3://...`, `gs://...`, `az://...`,
/// `https://...`) rather than a local path.
pub fn is_url(text: &str) -> bool {
    text.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// Which objects a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Selection {
    /// One object: its key.
    Object(String),
    /// The shards directly under a prefix (the key ends in `/`, or is empty).
    Prefix(String),
    /// Objects directly under `prefix` whose last name component matches `pattern`.
    Pattern { prefix: String, pattern: String },
}

/// A parsed dataset URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    /// `scheme://authority`: the store (bucket, container, or host).
    pub(crate) base: String,
    /// What of the store is read.
    pub(crate) selection: Selection,
}

impl Selection {
    /// Whether a listed object named `name` (its last key component) is a shard: under a
    /// prefix, objects named with a format's extension (`.npy`, `.parquet`, ...), hidden ones
    /// skipped, as a local directory's shards are taken; for a pattern, the names it matches,
    /// hidden ones only when the pattern starts with `.`.
    pub(crate) fn keeps(&self, name: &str) -> bool {
        match self {
            Selection::Object(key) => key.rsplit('/').next() == Some(name),
            Selection::Prefix(_) => {
                !name.starts_with('.') && is_shard_name(std::path::Path::new(name))
            }
            Selection::Pattern { pattern, .. } => {
                (pattern.starts_with('.') || !name.starts_with('.'))
                    && glob_match(pattern.as_bytes(), name.as_bytes())
            }
        }
    }
}

impl Location {
    /// Splits a URL into its store and its key; the key is taken as written (`?`, `*` and `[`
    /// are glob characters, not a query).
    pub(crate) fn parse(url: &str) -> Result<Location> {
        let bad = |reason: &str| SourceError::NoShards {
            dataset: url.to_owned(),
            reason: reason.to_owned(),
        };
        let Some((scheme, rest)) = url.split_once("://").filter(|_| is_url(url)) else {
            return Err(bad("expected a URL such as s3://bucket/prefix/"));
        };
        let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(bad("the URL names no bucket, container or host"));
        }
        let base = format!("{}://{authority}", scheme.to_ascii_lowercase());
        if key.rsplit_once('/').is_some_and(|(dir, _)| is_pattern(dir)) {
            return Err(bad(
                "wildcards are supported in the last name component only",
            ));
        }
        let last = key.rsplit('/').next().unwrap_or_default();
        let selection = if key.is_empty() || key.ends_with('/') {
            Selection::Prefix(key.to_owned())
        } else if is_pattern(last) {
            Selection::Pattern {
                prefix: key[..key.len() - last.len()].to_owned(),
                pattern: last.to_owned(),
            }
        } else {
            Selection::Object(key.to_owned())
        };
        Ok(Location { base, selection })
    }

    /// The URL of the object with key `key` in this store: what errors name.
    pub(crate) fn url_of(&self, key: &str) -> String {
        format!("{}/{key}", self.base)
    }
}

fn is_pattern(text: &str) -> bool {
    text.bytes().any(|b| matches!(b, b'*' | b'?' | b'['))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_from_paths() {
        assert!(is_url("s3://b/k.npy") && is_url("GS://b/") && is_url("https://h/x.npy"));
        assert!(!is_url("/data/x.npy") && !is_url("file:///x") && !is_url("s3:/b"));
    }

    #[test]
    fn selections() {
        let sel = |u: &str| Location::parse(u).unwrap().selection;
        assert_eq!(sel("s3://b/p/x.npy"), Selection::Object("p/x.npy".into()));
        assert_eq!(sel("s3://b/p/"), Selection::Prefix("p/".into()));
        assert_eq!(sel("s3://b"), Selection::Prefix(String::new()));
        assert_eq!(
            sel("s3://b/p/q/part-?[0-9]*.npy"),
            Selection::Pattern {
                prefix: "p/q/".into(),
                pattern: "part-?[0-9]*.npy".into()
            }
        );
        assert_eq!(
            sel("s3://b/*.npy"),
            Selection::Pattern {
                prefix: String::new(),
                pattern: "*.npy".into()
            }
        );
        let l = Location::parse("S3://bucket/a/b.npy").unwrap();
        assert_eq!(l.base, "s3://bucket");
        assert_eq!(l.url_of("a/b.npy"), "s3://bucket/a/b.npy");
        assert!(Location::parse("s3:///x").is_err());
        let pattern = sel("s3://b/p/part-*.npy");
        assert!(pattern.keeps("part-1.npy") && !pattern.keeps("x.npy"));
        let prefix = sel("s3://b/p/");
        assert!(prefix.keeps("a.NPY") && !prefix.keeps(".a.npy") && !prefix.keeps("a.bin"));
        assert!(prefix.keeps("part-0.parquet") && prefix.keeps("b.jsonl.gz"));
        let e = Location::parse("s3://b/p*/x.npy").unwrap_err().to_string();
        assert!(e.contains("last name component"), "{e}");
    }
}
