//! Raw record files: records back to back with no header, described by a [`Layout`] the user gives.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::read::open_regular;
use crate::reader::{ReadOptions, Reader};
use crate::{check_request, file_read_aligned, Layout, Result, Source, SourceError};

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
    reader: Reader,
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
            reader: Reader::buffered(),
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
        self.reader = Reader::new(&self.file, &self.path, options)?;
        Ok(())
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
        self.reader.read(&self.file, &self.path, offset, dst)
    }

    fn alignment(&self) -> usize {
        self.reader.alignment()
    }

    fn read_records_aligned(&self, first: u64, count: usize, buf: &mut [u8]) -> Result<usize> {
        file_read_aligned(
            self,
            &self.reader,
            &self.file,
            &self.path,
            0,
            first,
            count,
            buf,
        )
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        let runs = crate::gather_runs(self, 0, indices, dst.len())?;
        self.reader.gather(&self.file, &self.path, &runs, dst)
    }

    fn reader_description(&self) -> String {
        self.reader.description()
    }

    fn file(&self) -> Option<crate::FileRegion<'_>> {
        Some(crate::FileRegion {
            file: &self.file,
            path: &self.path,
            data_offset: 0,
        })
    }
}
