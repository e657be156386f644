//! What every file source shares: records of one layout from a byte offset of one file, read
//! through a [`FileReader`]. `NpyFile`, `RawFile` and `SafetensorsFile` differ only in how they find
//! the layout and the offset; each holds a [`FileRecords`] and delegates `Source` to it.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::readers::{self, FileReader};
use crate::ReadOptions;
use crate::{check_aligned_request, check_request, FileRegion, Layout, Result, Source};

/// `num_records` records of `layout`, record `i` at byte `data_offset + i * record_bytes` of
/// `file` (checked to lie inside the file when it was opened).
#[derive(Debug)]
pub(crate) struct FileRecords {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    pub(crate) layout: Layout,
    pub(crate) num_records: u64,
    pub(crate) data_offset: u64,
    pub(crate) reader: Box<dyn FileReader>,
}

impl FileRecords {
    /// Records read with buffered `pread` until [`set_reader`](FileRecords::set_reader).
    pub(crate) fn new(
        file: File,
        path: &Path,
        layout: Layout,
        num_records: u64,
        data_offset: u64,
    ) -> FileRecords {
        FileRecords {
            file,
            path: path.to_path_buf(),
            name: crate::escape_path(path),
            layout,
            num_records,
            data_offset,
            reader: readers::pread(),
        }
    }

    /// Reads as `options` ask from now on (O_DIRECT, io_uring, their fallbacks).
    pub(crate) fn set_reader(&mut self, options: &ReadOptions) -> Result<()> {
        self.reader = readers::for_file(&self.file, &self.path, options)?;
        Ok(())
    }

    /// Byte offset of record `first`, for a request already checked to be in range.
    fn offset(&self, first: u64) -> u64 {
        self.data_offset + first * self.layout.record_bytes() as u64
    }

    /// The bytes of the file that hold records.
    fn data(&self) -> std::ops::Range<u64> {
        self.data_offset..self.offset(self.num_records)
    }
}

impl Source for FileRecords {
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
        self.reader
            .read(&self.file, &self.path, self.offset(first), dst)
    }

    fn alignment(&self) -> usize {
        self.reader.alignment()
    }

    fn read_records_aligned(&self, first: u64, count: usize, buf: &mut [u8]) -> Result<usize> {
        let len = check_aligned_request(self, first, count, buf)?;
        self.reader
            .read_aligned(&self.file, &self.path, self.offset(first), len, buf)
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        let runs = crate::gather_runs(self, self.data_offset, indices, dst.len())?;
        self.reader
            .gather(&self.file, &self.path, self.data(), &runs, dst)
    }

    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        let runs = crate::gather_runs_at(self, self.data_offset, records, dst.len())?;
        self.reader
            .gather(&self.file, &self.path, self.data(), &runs, dst)
    }

    fn reader_description(&self) -> String {
        self.reader.describe()
    }

    fn file(&self) -> Option<FileRegion<'_>> {
        Some(FileRegion {
            file: &self.file,
            path: &self.path,
            data_offset: self.data_offset,
        })
    }
}

/// Implements [`Source`] for a type with a `records: FileRecords` field, by delegation.
macro_rules! delegate_source_to_records {
    ($ty:ty) => {
        impl $crate::Source for $ty {
            fn name(&self) -> &str {
                self.records.name()
            }
            fn layout(&self) -> &$crate::Layout {
                self.records.layout()
            }
            fn num_records(&self) -> u64 {
                self.records.num_records()
            }
            fn read_records(&self, first: u64, dst: &mut [u8]) -> $crate::Result<()> {
                self.records.read_records(first, dst)
            }
            fn alignment(&self) -> usize {
                self.records.alignment()
            }
            fn read_records_aligned(
                &self,
                first: u64,
                count: usize,
                buf: &mut [u8],
            ) -> $crate::Result<usize> {
                self.records.read_records_aligned(first, count, buf)
            }
            fn aligned_span(&self, count: usize) -> usize {
                self.records.aligned_span(count)
            }
            fn gather(&self, indices: &[u64], dst: &mut [u8]) -> $crate::Result<()> {
                self.records.gather(indices, dst)
            }
            fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> $crate::Result<()> {
                self.records.gather_at(records, dst)
            }
            fn reader_description(&self) -> String {
                self.records.reader_description()
            }
            fn file(&self) -> Option<$crate::FileRegion<'_>> {
                self.records.file()
            }
        }
    };
}
pub(crate) use delegate_source_to_records;
