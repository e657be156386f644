//! The optional local cache: blocks of objects kept as files in one directory, bounded in
//! size, least recently used removed first, shared safely by several processes.
//!
//! A block is [`BLOCK`] bytes of one object version (the last block of an object is shorter),
//! stored as one file named by a hash of the object's URL, size and ETag and the block's
//! index. A block is written to a temporary name (`*.part.PID.N`) and renamed into place, so
//! a reader (in this process or another, torchrun's ranks on one host) finds either no file
//! or a whole one; a file of the wrong length is not used. Partial files never count as
//! cached, and are removed once they are an hour old (a process killed while writing). Reading
//! a block sets its modification time, which eviction orders by. A cache directory that
//! cannot be written (full, deleted, read-only) costs nothing but the caching: the block
//! comes from the store and the failure is counted.

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use pinfeed_source::Result;

use crate::client::{bump, Client, Object};
use crate::fetch::{plan, Part};

/// Bytes in one cached block: large enough that a block is one request of the usual size,
/// small enough that a shuffled batch's miss does not fetch much it does not need.
pub(crate) const BLOCK: u64 = 8 << 20;

/// Blocks fetched at once by one reading thread on a miss: bounds the memory a read through
/// the cache holds (4 x 8 MiB).
const BLOCKS_AT_ONCE: usize = 4;

/// Age after which a partial file is taken as left by a dead process.
const STALE_PART: Duration = Duration::from_secs(3600);

/// A cache directory and its size limit.
#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    limit: u64,
    /// Makes this process's temporary names unique.
    next_part: AtomicU64,
}

impl Cache {
    pub(crate) fn new(dir: PathBuf, limit: u64) -> Cache {
        Cache {
            dir,
            limit,
            next_part: AtomicU64::new(0),
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "{} up to {:.1} GiB",
            self.dir.display(),
            self.limit as f64 / (1u64 << 30) as f64
        )
    }

    /// Fills `parts` from `object`, block by block: a cached block is read from its file
    /// straight into the parts; missing blocks are fetched whole (a few at a time), kept, and
    /// copied into the parts.
    pub(crate) fn fetch(
        &self,
        client: &Client,
        object: &Object,
        mut parts: Vec<Part<'_>>,
    ) -> Result<()> {
        let key = object_key(object);
        let mut blocks: Vec<u64> = parts
            .iter()
            .filter(|p| !p.dst.is_empty())
            .flat_map(|p| p.offset / BLOCK..=(p.offset + p.dst.len() as u64 - 1) / BLOCK)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut missing = Vec::new();
        for &block in &blocks {
            let range = block_range(object, block);
            if self.read_block(&key, block, range, &mut parts, client) {
                bump(&client.counters.cache_hits, 1);
            } else {
                bump(&client.counters.cache_misses, 1);
                missing.push(block);
            }
        }
        for group in missing.chunks(BLOCKS_AT_ONCE) {
            let mut buffers: Vec<Vec<u8>> = group
                .iter()
                .map(|&b| {
                    let r = block_range(object, b);
                    vec![0u8; (r.end - r.start) as usize]
                })
                .collect();
            let wanted = group.iter().zip(buffers.iter_mut()).map(|(&b, buf)| Part {
                offset: b * BLOCK,
                dst: buf.as_mut_slice(),
            });
            let mut requests = plan(wanted.collect(), usize::MAX, 0);
            client.get_all(object, &mut requests)?;
            drop(requests);
            for (&block, buf) in group.iter().zip(&buffers) {
                copy_into(&mut parts, block * BLOCK, buf);
                if self.store(&key, block, buf).is_err() {
                    bump(&client.counters.cache_errors, 1);
                }
            }
        }
        Ok(())
    }

    fn path(&self, key: &str, block: u64) -> PathBuf {
        self.dir.join(format!("{key}-{block}"))
    }

    /// Reads block `block` (bytes `range` of the object) from its file into `parts`; `false`
    /// when the file is missing or unusable (then the block is fetched and nothing read here
    /// is relied on: the fetch overwrites every byte of the parts it covers).
    fn read_block(
        &self,
        key: &str,
        block: u64,
        range: std::ops::Range<u64>,
        parts: &mut [Part<'_>],
        client: &Client,
    ) -> bool {
        let path = self.path(key, block);
        let Ok(file) = File::open(&path) else {
            return false;
        };
        let len_ok = file
            .metadata()
            .is_ok_and(|m| m.len() == range.end - range.start);
        let read = len_ok
            && parts.iter_mut().all(|part| {
                let lo = part.offset.max(range.start);
                let hi = (part.offset + part.dst.len() as u64).min(range.end);
                lo >= hi || {
                    let at = (lo - part.offset) as usize;
                    let dst = &mut part.dst[at..at + (hi - lo) as usize];
                    file.read_exact_at(dst, lo - range.start).is_ok()
                }
            });
        if !read {
            bump(&client.counters.cache_errors, 1);
            return false;
        }
        // Most recently used: the order eviction keeps. A failure only ages the block.
        let _ = file.set_modified(SystemTime::now());
        true
    }

    /// Keeps `bytes` as block `block`: written under a temporary name and renamed into place,
    /// then blocks evicted down to the limit.
    fn store(&self, key: &str, block: u64, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() as u64 > self.limit {
            return Ok(());
        }
        fs::create_dir_all(&self.dir)?;
        let n = self.next_part.fetch_add(1, Ordering::Relaxed);
        let part = self
            .dir
            .join(format!("{key}-{block}.part.{}.{n}", std::process::id()));
        let written = File::create(&part).and_then(|mut f| f.write_all(bytes));
        let renamed = written.and_then(|()| fs::rename(&part, self.path(key, block)));
        if renamed.is_err() {
            let _ = fs::remove_file(&part);
        }
        renamed?;
        self.evict()
    }

    /// Removes the least recently used blocks until the cache holds at most the limit, and
    /// partial files left by dead processes. Another process may remove the same file at the
    /// same time: a file already gone is fine.
    fn evict(&self) -> std::io::Result<()> {
        let now = SystemTime::now();
        let mut blocks: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(now);
            if is_partial(&entry.path()) {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_PART)
                {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            blocks.push((modified, meta.len(), entry.path()));
        }
        let mut total: u64 = blocks.iter().map(|b| b.1).sum();
        if total <= self.limit {
            return Ok(());
        }
        blocks.sort();
        for (_, len, path) in blocks {
            if total <= self.limit {
                break;
            }
            match fs::remove_file(&path) {
                Ok(()) => total -= len,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => total -= len,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn is_partial(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().contains(".part."))
}

/// Bytes of `object` in block `block`.
fn block_range(object: &Object, block: u64) -> std::ops::Range<u64> {
    let start = block * BLOCK;
    start..(start + BLOCK).min(object.size)
}

/// Names one version of an object: its URL, size and ETag.
fn object_key(object: &Object) -> String {
    let mut h = DefaultHasher::new();
    (&object.url, object.size, &object.etag).hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Copies `bytes`, the object's bytes from `at`, into every part they overlap.
fn copy_into(parts: &mut [Part<'_>], at: u64, bytes: &[u8]) {
    let end = at + bytes.len() as u64;
    for part in parts {
        let lo = part.offset.max(at);
        let hi = (part.offset + part.dst.len() as u64).min(end);
        if lo < hi {
            let n = (hi - lo) as usize;
            let to = (lo - part.offset) as usize;
            let from = (lo - at) as usize;
            part.dst[to..to + n].copy_from_slice(&bytes[from..from + n]);
        }
    }
}
