//! Bytes read by ranges: what a format reads when it wants parts of a file, not records at a
//! stride (a Parquet file's footer, then the column chunks asked for). A local file is read by
//! `pread` ([`FileRanges`]); an object in object storage by ranged GETs (`pinfeed-store`'s
//! implementation), so one format's code reads both.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{ReadOptions, Result, SourceError};

/// A file or an object whose bytes are read by ranges.
pub trait ByteRanges: Send + Sync + std::fmt::Debug {
    /// What errors call it: the path or the URL.
    fn name(&self) -> &str;

    /// Its size in bytes.
    fn size(&self) -> u64;

    /// The bytes of each of `ranges`, in the order given. The ranges are asked for together,
    /// so that an object's go out as ranged GETs in flight at once (neighbours coalesced); a
    /// range past the end is an error naming it.
    fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>>;

    /// The bytes of one range.
    fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let mut one = self.read_ranges(std::slice::from_ref(&range))?;
        Ok(one.pop().unwrap_or_default())
    }

    /// The local file and its path, where these bytes are one (what keys a cache on disk of
    /// what was derived from them); `None` for an object in object storage.
    fn local_file(&self) -> Option<(&Path, &File)> {
        None
    }
}

/// Bytes to open as a source, as [`super::Format::open_ranges`] receives them.
#[derive(Debug)]
pub struct OpenRanges<'a> {
    /// The file or object.
    pub bytes: Arc<dyn ByteRanges>,
    /// How to read it, and the format options.
    pub options: &'a ReadOptions,
}

/// A local file read by `pread`.
#[derive(Debug)]
pub struct FileRanges {
    file: File,
    path: PathBuf,
    name: String,
    size: u64,
}

impl FileRanges {
    /// The open `file` at `path`, `size` bytes long.
    pub fn new(file: File, path: &Path, size: u64) -> FileRanges {
        FileRanges {
            file,
            path: path.to_path_buf(),
            name: crate::escape_path(path),
            size,
        }
    }
}

impl ByteRanges for FileRanges {
    fn name(&self) -> &str {
        &self.name
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn local_file(&self) -> Option<(&Path, &File)> {
        Some((&self.path, &self.file))
    }

    fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        ranges
            .iter()
            .map(|r| {
                check_range(&self.name, self.size, r)?;
                let mut buf = vec![0u8; (r.end - r.start) as usize];
                crate::read::read_exact_at(&self.file, &self.path, r.start, &mut buf)?;
                Ok(buf)
            })
            .collect()
    }
}

/// Checks that `range` lies in the `size` bytes of `name`.
pub fn check_range(name: &str, size: u64, range: &Range<u64>) -> Result<()> {
    if range.start > range.end || range.end > size {
        return Err(SourceError::Table {
            name: name.to_owned(),
            reason: format!(
                "bytes {}..{} asked for, but it holds {size} bytes",
                range.start, range.end
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_file_reads_its_ranges_and_refuses_one_past_its_end() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&(0u8..100).collect::<Vec<_>>()).unwrap();
        let (file, size) = crate::read::open_regular(f.path()).unwrap();
        let r = FileRanges::new(file, f.path(), size);
        let got = r.read_ranges(&[90..100, 0..3, 5..5]).unwrap();
        assert_eq!(got, vec![(90..100).collect(), vec![0, 1, 2], vec![]]);
        let e = r.read_range(95..101).unwrap_err().to_string();
        assert!(
            e.contains("bytes 95..101 asked for, but it holds 100 bytes"),
            "{e}"
        );
    }
}
