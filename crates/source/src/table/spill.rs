//! Tokenized text kept on local disk, so that no row is tokenized twice: the count made when a
//! text table is opened writes each chunk's tokens (and each row's token count) here, and a
//! chunk read after the chunk cache let it go, or by a later loader or process, is read back
//! instead of tokenized again.
//!
//! A table's chunks live in a folder of `cache_dir()/text-tokens` named by a hash of what its
//! tokens depend on: the file's path, size and modification time, the column, the tokenizer
//! file's bytes and the special tokens, and this crate's version. A file changed since is a
//! new folder; the old one is never read again and goes when the cache outgrows its bound.
//! The whole holds at most [`limit`] bytes: at the first use in a process the oldest folders
//! are removed until it fits, and a chunk that would pass it is not written (it is tokenized
//! again when read after the chunk cache).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::rng::hash2;

/// The variable bounding the bytes of tokens kept on disk (`0` keeps none).
pub const LIMIT_VAR: &str = "PINFEED_TEXT_CACHE_BYTES";

/// Where one table's tokenized chunks are kept.
#[derive(Debug)]
pub(crate) struct Spill {
    dir: PathBuf,
}

/// Bytes in the cache: what was there at the first use (after the bound was enforced), plus
/// what this process wrote since.
static USED: OnceLock<AtomicU64> = OnceLock::new();

/// The cache's folder: `text-tokens` under the process's cache directory.
fn root() -> Option<PathBuf> {
    Some(crate::system::cache_dir()?.join("text-tokens"))
}

/// The bound on the cache's bytes: [`LIMIT_VAR`] when set, else half the free space of the
/// file system holding it when first asked.
fn limit(root: &Path) -> u64 {
    if let Some(v) = std::env::var(LIMIT_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return v;
    }
    static FREE: OnceLock<u64> = OnceLock::new();
    *FREE.get_or_init(|| {
        let existing = root.ancestors().find(|p| p.exists()).unwrap_or(root);
        crate::system::free_bytes(existing).unwrap_or(0) / 2
    })
}

impl Spill {
    /// The place of the tokens of `path`'s column `column` under the tokenizer of
    /// `fingerprint`; `None` where there is no cache directory or the bound is 0.
    pub(crate) fn for_file(
        path: &Path,
        file: &File,
        column: &str,
        fingerprint: u64,
    ) -> Option<Spill> {
        let root = root()?;
        if limit(&root) == 0 {
            return None;
        }
        let meta = file.metadata().ok()?;
        let modified = meta
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        let path = std::fs::canonicalize(path).ok()?;
        let mut h = hash2(fingerprint, meta.len());
        h = hash2(h, modified.as_secs());
        h = hash2(h, u64::from(modified.subsec_nanos()));
        let words = [
            path.as_os_str().as_encoded_bytes(),
            column.as_bytes(),
            env!("CARGO_PKG_VERSION").as_bytes(),
        ];
        for bytes in words {
            h = hash2(h, bytes.len() as u64);
            for w in bytes.chunks(8) {
                let mut word = [0u8; 8];
                word[..w.len()].copy_from_slice(w);
                h = hash2(h, u64::from_le_bytes(word));
            }
        }
        USED.get_or_init(|| AtomicU64::new(shrink(&root, limit(&root))));
        Some(Spill {
            dir: root.join(format!("{h:016x}")),
        })
    }

    fn tokens_path(&self, chunk: usize) -> PathBuf {
        self.dir.join(format!("{chunk}.tokens"))
    }

    fn rows_path(&self, chunk: usize) -> PathBuf {
        self.dir.join(format!("{chunk}.rows"))
    }

    /// Chunk `chunk`'s token count and its rows' counts, where both were kept and agree.
    pub(crate) fn counts(&self, chunk: usize) -> Option<(u64, Vec<u64>)> {
        let rows = std::fs::read(self.rows_path(chunk)).ok()?;
        if rows.len() % 8 != 0 {
            return None;
        }
        let rows: Vec<u64> = rows
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let tokens = std::fs::metadata(self.tokens_path(chunk)).ok()?.len();
        let sum = rows.iter().try_fold(0u64, |s, &r| s.checked_add(r))?;
        (sum.checked_mul(4) == Some(tokens)).then_some((sum, rows))
    }

    /// Chunk `chunk`'s tokens, where they were kept and are `tokens` long.
    pub(crate) fn read(&self, chunk: usize, tokens: u64) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.tokens_path(chunk)).ok()?;
        (bytes.len() as u64 == tokens * 4).then_some(bytes)
    }

    /// Keeps chunk `chunk`'s tokens and rows' counts, unless that would pass the bound; a
    /// failure to write leaves the chunk to be tokenized again, as a full cache does.
    pub(crate) fn write(&self, chunk: usize, tokens: &[u8], rows: &[u64]) {
        let Some(used) = USED.get() else { return };
        let bytes = (tokens.len() + rows.len() * 8) as u64;
        let Some(root) = self.dir.parent() else {
            return;
        };
        if used.fetch_add(bytes, Ordering::Relaxed) + bytes > limit(root) {
            used.fetch_sub(bytes, Ordering::Relaxed);
            return;
        }
        let rows: Vec<u8> = rows.iter().flat_map(|r| r.to_le_bytes()).collect();
        // The rows go first: a chunk counts as kept once its tokens file is there.
        let written = std::fs::create_dir_all(&self.dir).is_ok()
            && put(&self.rows_path(chunk), &rows)
            && put(&self.tokens_path(chunk), tokens);
        if !written {
            used.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// Writes `bytes` to `path` whole or not at all: into a file of its own, then renamed.
fn put(path: &Path, bytes: &[u8]) -> bool {
    let thread = format!("{:?}", std::thread::current().id());
    let digits: String = thread.chars().filter(char::is_ascii_digit).collect();
    let tmp = path.with_extension(format!("tmp-{}-{digits}", std::process::id()));
    let ok = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path))
        .is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
    ok
}

/// Removes the least recently written tables' folders under `root` until it holds at most
/// `limit` bytes; returns the bytes left.
fn shrink(root: &Path, limit: u64) -> u64 {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut tables: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let (mut newest, mut bytes) = (std::time::UNIX_EPOCH, 0);
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if let Ok(m) = f.metadata() {
                    bytes += m.len();
                    newest = newest.max(m.modified().unwrap_or(std::time::UNIX_EPOCH));
                }
            }
            (newest, bytes, e.path())
        })
        .collect();
    tables.sort();
    let mut used: u64 = tables.iter().map(|t| t.1).sum();
    for (_, bytes, dir) in tables {
        if used <= limit {
            break;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            used -= bytes;
        }
    }
    used
}
