//! Several files of one record layout read as one dataset: a directory, or a glob pattern.
//!
//! Shards are taken in byte order of their file names (`ls` order: name shards with
//! zero-padded numbers, `part-00002` before `part-00010`), and records are numbered across them
//! in that order.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::ReadOptions;
use crate::{check_request, Layout, Result, Source, SourceError};

/// Records of several files of one layout, numbered across the files in order.
///
/// Reads that span shard boundaries are split; [`Source::file`] is `None` unless there is a
/// single shard, since the register reader maps one file.
#[derive(Debug)]
pub struct ShardedSource {
    /// The directory or pattern, as given.
    name: String,
    layout: Layout,
    /// Never empty; every shard has `layout` and at least one record.
    shards: Vec<Box<dyn Source>>,
    /// `starts[i]` is the first record of shard `i`; `starts[shards.len()]` is the total.
    /// Strictly increasing.
    starts: Vec<u64>,
    /// The largest alignment of any shard.
    align: usize,
}

impl ShardedSource {
    /// Opens every `.npy` and `.safetensors` file of a directory (hidden files skipped), or
    /// every regular file whose name matches a glob pattern (`*`, `?`, `[a-z]`, `[!a-z]`, in the
    /// last path component only); files that are not `.npy` or `.safetensors` are read as raw
    /// records of `raw_layout`. Each shard is read as `options` ask.
    pub fn open(
        path: impl AsRef<Path>,
        raw_layout: Option<Layout>,
        options: &ReadOptions,
    ) -> Result<ShardedSource> {
        let path = path.as_ref();
        options.check()?;
        let dataset = crate::escape_path(path);
        let is_dir = path.is_dir();
        let files = if is_dir {
            list_directory(path)?
        } else {
            list_pattern(path)?
        };
        if files.is_empty() {
            let reason = if is_dir {
                format!(
                    "the directory holds no {} files",
                    crate::formats::shard_extensions()
                )
            } else {
                "no file matches this pattern".to_owned()
            };
            return Err(SourceError::NoShards { dataset, reason });
        }
        let shards = files
            .iter()
            .map(|f| crate::formats::open_file(f, raw_layout.as_ref(), options))
            .collect::<Result<Vec<_>>>()?;
        ShardedSource::from_sources(dataset, shards)
    }

    /// Joins sources of one layout, in the order given; `name` is what errors call the whole.
    pub fn from_sources(
        name: impl Into<String>,
        shards: Vec<Box<dyn Source>>,
    ) -> Result<ShardedSource> {
        let name = name.into();
        let Some(first) = shards.first() else {
            return Err(SourceError::NoShards {
                dataset: name,
                reason: "no shards given".into(),
            });
        };
        let layout = first.layout().clone();
        let describe = |l: &Layout| format!("dtype {}, record shape {:?}", l.dtype, l.shape);
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut total = 0u64;
        for shard in &shards {
            if *shard.layout() != layout {
                return Err(SourceError::ShardLayout {
                    dataset: name,
                    first: first.name().to_owned(),
                    first_layout: describe(&layout),
                    other: shard.name().to_owned(),
                    other_layout: describe(shard.layout()),
                });
            }
            starts.push(total);
            total =
                total
                    .checked_add(shard.num_records())
                    .ok_or_else(|| SourceError::NoShards {
                        dataset: name.clone(),
                        reason: "the shards hold more than 2^64 records together".into(),
                    })?;
        }
        starts.push(total);
        let align = shards.iter().map(|s| s.alignment()).max().unwrap_or(1);
        Ok(ShardedSource {
            name,
            layout,
            shards,
            starts,
            align,
        })
    }

    /// The shards, in record order.
    pub fn shards(&self) -> &[Box<dyn Source>] {
        &self.shards
    }

    /// The shard holding `record` and the record's index inside it; `record` must be below
    /// `num_records()`.
    pub fn locate(&self, record: u64) -> (usize, u64) {
        debug_assert!(record < self.num_records());
        // `starts[0] == 0 <= record`, so the partition point is at least 1.
        let i = self.starts.partition_point(|&s| s <= record) - 1;
        (i.min(self.shards.len() - 1), record - self.starts[i])
    }

    /// Hands each shard its records of a gather, with their places: one
    /// [`gather_at`](Source::gather_at) per shard touched, so a shard that reads through a
    /// mapping copies its records in one go. The places increase (checked by the callers).
    fn gather_by_shard(
        &self,
        records: impl Iterator<Item = (u64, usize)>,
        dst: &mut [u8],
    ) -> Result<()> {
        let num_records = self.num_records();
        let mut parts: Vec<(usize, (u64, usize))> = Vec::with_capacity(records.size_hint().0);
        for (record, place) in records {
            if record >= num_records {
                return Err(SourceError::OutOfRange {
                    name: self.name.clone(),
                    first: record,
                    count: 1,
                    num_records,
                });
            }
            let (shard, local) = self.locate(record);
            parts.push((shard, (local, place)));
        }
        // Stable: each shard's places stay increasing.
        parts.sort_by_key(|p| p.0);
        let locals: Vec<(u64, usize)> = parts.iter().map(|p| p.1).collect();
        let mut start = 0;
        while start < parts.len() {
            let shard = parts[start].0;
            let end = start + parts[start..].partition_point(|p| p.0 == shard);
            self.shards[shard].gather_at(&locals[start..end], dst)?;
            start = end;
        }
        Ok(())
    }

    /// Calls `each(shard, first record in it, records, records before this part)` for the
    /// parts of `first .. first + count` in each shard, in order. The range is in range.
    fn split(
        &self,
        first: u64,
        count: u64,
        mut each: impl FnMut(&dyn Source, u64, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let mut done = 0u64;
        while done < count {
            let (i, local) = self.locate(first + done);
            let take = (self.starts[i + 1] - (first + done)).min(count - done);
            each(self.shards[i].as_ref(), local, take, done)?;
            done += take;
        }
        Ok(())
    }
}

impl Source for ShardedSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.starts[self.shards.len()]
    }

    fn natural_block(&self) -> Option<u64> {
        self.shards.iter().filter_map(|s| s.natural_block()).max()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        let count = check_request(self, first, dst.len())?;
        let rb = self.layout.record_bytes();
        self.split(first, count, |shard, local, n, before| {
            // `before + n <= count` records fit in `dst`.
            let at = before as usize * rb;
            shard.read_records(local, &mut dst[at..at + n as usize * rb])
        })
    }

    fn file(&self) -> Option<crate::FileRegion<'_>> {
        match self.shards.as_slice() {
            [only] => only.file(),
            _ => None,
        }
    }

    fn alignment(&self) -> usize {
        self.align
    }

    /// The first part is read in place; each later part is read at the next aligned position
    /// after the records so far and moved down to follow them, so only batches that span a
    /// shard boundary pay for a copy.
    fn read_records_aligned(&self, first: u64, count: usize, buf: &mut [u8]) -> Result<usize> {
        if let [only] = self.shards.as_slice() {
            return only.read_records_aligned(first, count, buf);
        }
        crate::check_aligned_request(self, first, count, buf)?;
        let rb = self.layout.record_bytes();
        let align = self.align;
        let mut start = None;
        let mut end = 0usize;
        self.split(first, count as u64, |shard, local, n, _| {
            let n = n as usize;
            let Some(begin) = start else {
                let off = shard.read_records_aligned(local, n, buf)?;
                start = Some(off);
                end = off + n * rb;
                return Ok(());
            };
            // Below `end + align`, and `aligned_span` leaves room for this part after it.
            let at = end.div_ceil(align) * align;
            let off = shard.read_records_aligned(local, n, &mut buf[at..])?;
            buf.copy_within(at + off..at + off + n * rb, end);
            end += n * rb;
            debug_assert!(end - begin <= count * rb);
            Ok(())
        })?;
        Ok(start.unwrap_or(0))
    }

    /// Room for the parts of a read that spans shards: the first starts less than one
    /// alignment in, each later one is read less than one alignment past the records so far
    /// and needs the shard's own span (records plus three alignments at most).
    fn aligned_span(&self, count: usize) -> usize {
        if let [only] = self.shards.as_slice() {
            return only.aligned_span(count);
        }
        let bytes = count.saturating_mul(self.layout.record_bytes());
        match self.align {
            0 | 1 => bytes,
            a => bytes.saturating_add(5 * a).div_ceil(a).saturating_mul(a),
        }
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        if let [only] = self.shards.as_slice() {
            return only.gather(indices, dst);
        }
        crate::check_gather_len(self, indices.len(), dst.len())?;
        self.gather_by_shard(indices.iter().copied().zip(0..), dst)
    }

    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        if let [only] = self.shards.as_slice() {
            return only.gather_at(records, dst);
        }
        crate::check_places(self, records, dst.len())?;
        self.gather_by_shard(records.iter().copied(), dst)
    }

    fn document_lengths(&self) -> Option<Vec<u64>> {
        let mut all = Vec::new();
        for shard in &self.shards {
            all.extend(shard.document_lengths()?);
        }
        Some(all)
    }

    fn chunk_lengths(&self) -> Option<Vec<u64>> {
        let mut all = Vec::new();
        for shard in &self.shards {
            all.extend(shard.chunk_lengths()?);
        }
        Some(all)
    }

    fn chunk_decodes(&self) -> Option<u64> {
        self.shards.iter().map(|s| s.chunk_decodes()).sum()
    }

    fn columns(&self) -> Option<&[crate::table::Column]> {
        // Every shard has the layout of the first, so the same columns.
        self.shards[0].columns()
    }

    fn reader_description(&self) -> String {
        let mut seen: Vec<String> = Vec::new();
        for shard in &self.shards {
            let d = shard.reader_description();
            if !seen.contains(&d) {
                seen.push(d);
            }
        }
        seen.join("; ")
    }
}

/// `true` when the path has glob wildcards.
pub(crate) fn is_pattern(path: &Path) -> bool {
    path.as_os_str()
        .as_bytes()
        .iter()
        .any(|b| matches!(b, b'*' | b'?' | b'['))
}

fn open_err(path: &Path, source: std::io::Error) -> SourceError {
    SourceError::Open {
        path: path.to_path_buf(),
        source,
    }
}

/// Files in `dir` whose names match `keep`, sorted by name: the one rule for listing the files
/// of a dataset, record shards and token files alike.
///
/// A matching entry that is not a regular file (a broken symbolic link, a link loop, a FIFO, a
/// socket; a directory too when `dirs_too` is false) is refused with its name rather than
/// skipped: streaming the other shards alone would silently drop its records.
pub(crate) fn list(
    dir: &Path,
    dirs_too: bool,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| open_err(dir, e))? {
        let entry = entry.map_err(|e| open_err(dir, e))?;
        let name = entry.file_name();
        if !keep(name.as_bytes()) {
            continue;
        }
        // Follows symbolic links: a link to a shard is a shard.
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| open_err(&path, e))?;
        if meta.is_file() {
            files.push(path);
        } else if !(meta.is_dir() && dirs_too) {
            let what = if meta.is_dir() {
                "a directory named like a shard"
            } else {
                "not a regular file"
            };
            return Err(open_err(&path, std::io::Error::other(what)));
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

fn list_directory(dir: &Path) -> Result<Vec<PathBuf>> {
    list(dir, false, |name| {
        !name.starts_with(b".") && crate::formats::is_shard_name(Path::new(OsStr::from_bytes(name)))
    })
}

fn list_pattern(path: &Path) -> Result<Vec<PathBuf>> {
    let dataset = crate::escape_path(path);
    let (Some(dir), Some(pattern)) = (path.parent(), path.file_name()) else {
        return Err(SourceError::NoShards {
            dataset,
            reason: "expected a directory or a pattern of file names".into(),
        });
    };
    if is_pattern(dir) {
        return Err(SourceError::NoShards {
            dataset,
            reason: "wildcards are supported in the file name only, not in directories".into(),
        });
    }
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let pattern = pattern.as_bytes();
    list(dir, true, |name| {
        (pattern.starts_with(b".") || !name.starts_with(b".")) && glob_match(pattern, name)
    })
}

/// Shell-style matching of one file name, byte by byte: `*` any run, `?` one byte, `[abc]`,
/// `[a-z]` and `[!a-z]` (or `[^a-z]`) one byte of a set. A `[` without a closing `]` is literal.
/// Shard patterns of local paths and of object-store URLs match by this one rule.
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // Where the last `*` was and the name position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(b'?') => Some(1),
            Some(b'[') => match class(&pattern[p..], name[n]) {
                Some((true, len)) => Some(len),
                Some((false, _)) => None,
                None => (name[n] == b'[').then_some(1),
            },
            Some(&c) => (c == name[n]).then_some(1),
            None => None,
        };
        match (step, star) {
            (Some(len), _) => {
                p += len;
                n += 1;
            }
            (None, Some((sp, sn))) => {
                // Let the last `*` swallow one more byte and try again.
                star = Some((sp, sn + 1));
                p = sp + 1;
                n = sn + 1;
            }
            (None, None) => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class at the start of `pattern` (which starts with `[`): whether it
/// matched and the class's length, or `None` when the class is not closed.
fn class(pattern: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let &lo = pattern.get(i)?;
        if lo == b']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&h| h != b']') {
            let hi = pattern[i + 2];
            hit |= lo <= c && c <= hi;
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let yes = |p: &str, n: &str| glob_match(p.as_bytes(), n.as_bytes());
        assert!(yes("*.npy", "a.npy"));
        assert!(yes("*.npy", ".npy"));
        assert!(!yes("*.npy", "a.npyx"));
        assert!(yes("part-*-of-*.npy", "part-001-of-003.npy"));
        assert!(!yes("part-*-of-*.npy", "part-001-of-003.np"));
        assert!(yes("p?.npy", "p1.npy"));
        assert!(!yes("p?.npy", "p.npy"));
        assert!(yes("p[0-9][!a-z].npy", "p17.npy"));
        assert!(!yes("p[0-9][!a-z].npy", "p1x.npy"));
        assert!(yes("p[]x].npy", "p].npy"));
        assert!(yes("p[.npy", "p[.npy"));
        assert!(yes("*", ""));
        assert!(yes("**a*", "bab"));
        assert!(!yes("a", ""));
        assert!(yes("*a*b*c", "xxaxxbxxbxc"));
    }

    #[test]
    fn patterns_are_recognised() {
        assert!(is_pattern(Path::new("d/*.npy")));
        assert!(is_pattern(Path::new("d/p[12].npy")));
        assert!(!is_pattern(Path::new("d/p.npy")));
    }
}
