//! Raw record files: records back to back with no header, described by a [`Layout`] the user gives.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::read::{open_regular, read_exact_at};
use crate::{check_request, Layout, Result, Source, SourceError};

/// A headerless file of fixed-size records, such as one written by
/// `np.memmap(path, '3,31,31B', 'w+', shape=(n,))` or `arr.tofile(path)`.
#[derive(Debug)]
pub struct RawFile {
    file: File,
    path: PathBuf,
    name: String,
    layout: Layout,
    /// `file size / record_bytes` at open; the size was an exact multiple.
    num_records: u64,
}

impl RawFile {
    /// Opens `path` as records of `layout`; the file size must be a non-zero multiple of the
    /// record size.
    pub fn open(path: impl AsRef<Path>, layout: Layout) -> Result<RawFile> {
        let path = path.as_ref();
        let (file, size) = open_regular(path)?;
        RawFile::from_file(file, path, size, layout)
    }

    pub(crate) fn from_file(file: File, path: &Path, size: u64, layout: Layout) -> Result<RawFile> {
        // Fields are public, so a layout may not have come through `Layout::new`.
        let layout = Layout::new(layout.dtype, layout.shape).map_err(|e| e.with_path(path))?;
        let name = path.display().to_string();
        let record_bytes = layout.record_bytes();
        let trailing = size % record_bytes as u64;
        if trailing != 0 {
            return Err(SourceError::RecordSize {
                name,
                size,
                record_bytes,
                trailing,
            });
        }
        let num_records = size / record_bytes as u64;
        if num_records == 0 {
            return Err(SourceError::Empty { name });
        }
        Ok(RawFile {
            file,
            path: path.to_path_buf(),
            name,
            layout,
            num_records,
        })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Source for RawFile {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.num_records
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        check_request(self, first, dst.len())?;
        // In range, so the offset is below the file size checked at open.
        let offset = first * self.layout.record_bytes() as u64;
        read_exact_at(&self.file, &self.path, offset, dst)
    }

    fn file(&self) -> Option<crate::FileRegion<'_>> {
        Some(crate::FileRegion {
            file: &self.file,
            path: &self.path,
            data_offset: 0,
        })
    }
}
