//! Raw record files: records back to back with no header, described by a [`Layout`] the user gives.

use std::fs::File;
use std::path::Path;

use crate::read::open_regular;
use crate::records::{delegate_source_to_records, FileRecords};
use crate::ReadOptions;
use crate::{Layout, Result, SourceError};

/// A headerless file of fixed-size records, such as one written by
/// `np.memmap(path, '3,31,31B', 'w+', shape=(n,))` or `arr.tofile(path)`.
#[derive(Debug)]
pub struct RawFile {
    /// `file size / record_bytes` records from byte 0; the size was an exact multiple.
    records: FileRecords,
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
        let name = crate::escape_path(path);
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
            records: FileRecords::new(file, path, layout, num_records, 0),
        })
    }

    /// Opens `path` as records of `layout`, to be read as `options` ask (`options.tensor` is
    /// ignored).
    pub fn open_with(
        path: impl AsRef<Path>,
        layout: Layout,
        options: &ReadOptions,
    ) -> Result<RawFile> {
        let mut raw = RawFile::open(path, layout)?;
        raw.set_reader(options)?;
        Ok(raw)
    }

    pub(crate) fn set_reader(&mut self, options: &ReadOptions) -> Result<()> {
        self.records.set_reader(options)
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.records.path
    }
}

delegate_source_to_records!(RawFile);

/// Raw records: any file no other format claims, read with the layout the user gives.
#[derive(Debug)]
pub(crate) struct Raw;

impl super::Format for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    fn open(&self, open: super::OpenFile<'_>) -> Result<Box<dyn crate::Source>> {
        let Some(layout) = open.layout else {
            return Err(SourceError::NotNpy {
                path: open.path.to_path_buf(),
            });
        };
        let mut raw = RawFile::from_file(open.file, open.path, open.size, layout.clone())?;
        raw.set_reader(open.options)?;
        Ok(Box::new(raw))
    }
}
