//! Source formats: how a file's bytes become records. One module per format, each a
//! [`Format`], all listed once in [`ALL`].
//!
//! Adding a format is one new module here and one line in [`ALL`] (see "Extending pinfeed" in
//! docs/ARCHITECTURE.md). A format names its file extensions (which shard discovery in a
//! directory collects), may recognise files by their first bytes ([`Format::sniff`]), may
//! name companion files it opens itself ([`Format::companions`], skipped by shard discovery),
//! and owns the [`FormatOptions`] keys it lists in [`Format::option_keys`]. A format that reads
//! parts of a file rather than records at a stride may also open bytes read by ranges
//! ([`Format::open_ranges`], [`ranges::ByteRanges`]): an object in object storage.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use crate::{Layout, ReadOptions, Result, Source, SourceError};
pub use ranges::{ByteRanges, FileRanges, OpenRanges};

pub mod npy;
pub mod ranges;
pub(crate) mod raw;
pub mod safetensors;
pub(crate) mod text;

/// Every format, in the order files are matched: first by extension, then by
/// [`Format::sniff`]. Raw records come last: they claim any file no other format does.
pub static ALL: &[&dyn Format] = &[
    &npy::Npy,
    &safetensors::Safetensors,
    &text::Text,
    crate::table::PARQUET,
    crate::table::ARROW,
    crate::table::JSONL,
    &raw::Raw,
];

/// Bytes of a file's start handed to [`Format::sniff`] (fewer for a shorter file): enough for
/// the `.npy` magic, and for a tar header's `ustar` magic at byte 257.
pub const SNIFF_BYTES: usize = 512;

/// One file to open as a source, as [`Format::open`] receives it.
#[derive(Debug)]
pub struct OpenFile<'a> {
    /// The file, opened for reading (a regular file, checked with `stat` before `open`).
    pub file: File,
    /// Its path, for errors and for finding companion files beside it.
    pub path: &'a Path,
    /// Its size in bytes at open.
    pub size: u64,
    /// The record layout the user gave (a dtype and shape), for formats whose files do not say.
    pub layout: Option<&'a Layout>,
    /// How to read it, and the format options.
    pub options: &'a ReadOptions,
}

/// A file format that yields records: `.npy`, `.safetensors`, raw records, ...
pub trait Format: Sync {
    /// What errors and the documentation call it: `"npy"`, `"safetensors"`.
    fn name(&self) -> &'static str;

    /// File name extensions, without the leading dot (`parquet`, `jsonl.gz`), matched in any
    /// case: files so named are opened
    /// with this format, and a directory's files so named are its shards.
    fn extensions(&self) -> &'static [&'static str];

    /// Extensions of files this format opens beside the one named (a Megatron `.idx` beside
    /// its `.bin`): shard discovery skips them.
    fn companions(&self) -> &'static [&'static str] {
        &[]
    }

    /// The [`FormatOptions`] keys this format reads.
    fn option_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether a file whose name no format claims is of this format, from its first bytes
    /// (at most [`SNIFF_BYTES`]).
    fn sniff(&self, head: &[u8]) -> bool {
        let _ = head;
        false
    }

    /// Opens the file as a source of records, read as `open.options` ask.
    fn open(&self, open: OpenFile<'_>) -> Result<Box<dyn Source>>;

    /// Opens bytes read by ranges (an object in object storage) as a source of records. A
    /// format that reads whole local files only refuses, as this default does, naming itself.
    fn open_ranges(&self, open: OpenRanges<'_>) -> Result<Box<dyn Source>> {
        Err(SourceError::Open {
            path: open.bytes.name().into(),
            source: std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "{} files are read from local disk only; from object storage, .npy and raw \
                     records, Parquet, Arrow IPC and JSON lines are",
                    self.name()
                ),
            ),
        })
    }
}

/// Options of source formats as `key=value` strings, each key owned by the formats that list
/// it in [`Format::option_keys`] and validated by them at open (`tensor=NAME` for
/// `.safetensors`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormatOptions {
    entries: BTreeMap<String, String>,
}

impl FormatOptions {
    /// No options.
    pub fn new() -> FormatOptions {
        FormatOptions::default()
    }

    /// These options with `key` set to `value`.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> FormatOptions {
        self.set(key, value);
        self
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.entries.insert(key.into(), value.into());
    }

    /// Parses one `key=value` pair and sets it.
    pub fn set_pair(&mut self, pair: &str) -> Result<()> {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(SourceError::Options {
                reason: format!("format option {pair:?}: expected key=value"),
            });
        };
        self.set(key.trim(), value);
        Ok(())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// The keys set, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether no option is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks that some format takes every key set.
    pub fn check(&self) -> Result<()> {
        match self
            .keys()
            .find(|k| !ALL.iter().any(|f| f.option_keys().contains(k)))
        {
            Some(key) => Err(SourceError::Options {
                reason: format!("unknown format option {key:?}: {}", formats_with_options()),
            }),
            None => Ok(()),
        }
    }

    /// Checks that `format`, which opened `path`, takes every key set: an option no opened
    /// file understands is a mistake worth a message, not something to ignore.
    pub fn check_for(&self, format: &dyn Format, path: &Path) -> Result<()> {
        match self.keys().find(|k| !format.option_keys().contains(k)) {
            Some(key) => Err(SourceError::Options {
                reason: format!(
                    "{}: the {key} option ({:?}) does not apply to {} files; {}",
                    crate::escape_path(path),
                    self.get(key).unwrap_or_default(),
                    format.name(),
                    formats_with_options()
                ),
            }),
            None => Ok(()),
        }
    }
}

/// "formats that take options: safetensors (tensor), ...", for errors.
fn formats_with_options() -> String {
    let list: Vec<String> = ALL
        .iter()
        .filter(|f| !f.option_keys().is_empty())
        .map(|f| format!("{} ({})", f.name(), f.option_keys().join(", ")))
        .collect();
    format!("formats that take options: {}", list.join(", "))
}

/// Whether the file name ends in `.ext`, in any case; `ext` may hold dots (`jsonl.gz`).
pub(crate) fn has_extension(path: &Path, ext: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Some(name) = path.file_name().map(|n| n.as_bytes()) else {
        return false;
    };
    let ext = ext.as_bytes();
    name.len() > ext.len() + 1
        && name[name.len() - ext.len() - 1] == b'.'
        && name[name.len() - ext.len()..].eq_ignore_ascii_case(ext)
}

/// The format that claims `path`: by extension, else by its first bytes `head`.
pub fn claim(path: &Path, head: &[u8]) -> &'static dyn Format {
    let by_bytes = || ALL.iter().copied().find(|f| f.sniff(head));
    by_extension(path)
        .or_else(by_bytes)
        .unwrap_or(ALL[ALL.len() - 1])
}

/// The format whose extension `path` has, if any.
pub fn by_extension(path: &Path) -> Option<&'static dyn Format> {
    ALL.iter()
        .copied()
        .find(|f| f.extensions().iter().any(|e| has_extension(path, e)))
}

/// Whether shard discovery (of a directory, or of a prefix in object storage) takes an entry
/// named `path`: some format's extension.
pub fn is_shard_name(path: &Path) -> bool {
    ALL.iter()
        .any(|f| f.extensions().iter().any(|e| has_extension(path, e)))
}

/// ".npy, .safetensors, ... or .jsonl", for shard discovery's errors: each format's first
/// extension.
pub fn shard_extensions() -> String {
    let exts: Vec<String> = ALL
        .iter()
        .filter_map(|f| f.extensions().first().map(|e| format!(".{e}")))
        .collect();
    match exts.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Opens one file of any format, read as `options` ask.
pub(crate) fn open_file(
    path: &Path,
    layout: Option<&Layout>,
    options: &ReadOptions,
) -> Result<Box<dyn Source>> {
    let (file, size) = crate::read::open_regular(path)?;
    let mut head = vec![0u8; size.min(SNIFF_BYTES as u64) as usize];
    crate::read::read_exact_at(&file, path, 0, &mut head)?;
    let format = claim(path, &head);
    options.format.check_for(format, path)?;
    format.open(OpenFile {
        file,
        path,
        size,
        layout,
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_owned_by_formats() {
        let mut o = FormatOptions::new();
        o.set_pair("tensor=emb").unwrap();
        assert_eq!(o.get("tensor"), Some("emb"));
        o.check().unwrap();
        assert!(o.set_pair("novalue").is_err());
        let e = FormatOptions::new()
            .with("colour", "red")
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown format option \"colour\"") && e.contains("safetensors (tensor)"),
            "{e}"
        );
    }

    #[test]
    fn files_are_claimed_by_extension_then_bytes() {
        let p = Path::new;
        assert_eq!(claim(p("a.NPY"), b"").name(), "npy");
        assert_eq!(claim(p("a.bin"), b"\x93NUMPY\x01\x00").name(), "npy");
        assert_eq!(
            claim(p("a.safetensors"), b"\x93NUMPY").name(),
            "safetensors"
        );
        assert_eq!(claim(p("a.bin"), b"1 2 3").name(), "raw");
        assert!(is_shard_name(p("x.safetensors")) && !is_shard_name(p("x.bin")));
    }
}
