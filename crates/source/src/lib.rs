//! Datasets of fixed-size records for pinfeed.
//!
//! A dataset is N records of one [`Layout`] (an element [`DType`] and a per-record shape). The
//! [`Source`] trait reads consecutive records ([`Source::read_records`]) or records in any order
//! ([`Source::gather`]) straight into the caller's memory, which in pinfeed is a slot of the
//! pinned ring. These sources implement it:
//!
//! - [`NpyFile`]: a numpy `.npy` file (versions 1.0, 2.0 and 3.0), header checked at open by a
//!   strict parser ([`npy::Header`]);
//! - [`RawFile`]: a headerless file of records, described by a layout from
//!   [`dtype::parse_user_dtype`];
//! - [`HostBuffer`]: records already in memory.
//!
//! - [`SafetensorsFile`]: one tensor of a `.safetensors` file, its first dimension counting the
//!   records;
//! - [`ShardedSource`]: several files of one layout (a directory or a glob pattern), records
//!   numbered across them.
//! - [`table::TableSource`]: columns of a Parquet file, an Arrow IPC file or stream, or JSON
//!   lines, each row a record of the columns asked for (the `columns` format option);
//! - [`images::ImageSource`]: JPEG and PNG images (an ImageFolder tree or WebDataset tar
//!   shards), each record an image decoded, cropped and resized to a fixed size, then its label.
//!
//! Every file format is a [`Format`] listed in [`formats::ALL`]; [`open_path`] picks one by the
//! file's extension or first bytes; [`open_with`] also opens directories, patterns and
//! `.safetensors` files, and reads as [`ReadOptions`] ask ([`Reader`]): buffered `pread`;
//! `pread` for ranges and `memcpy` out of a read-only mapping of the file for gathers
//! ([`Reader::Mmap`]); `O_DIRECT` into aligned buffers
//! ([`Source::read_records_aligned`]); or io_uring with a queue depth; each falling back to
//! `pread` where the system refuses it and saying so ([`Source::reader_description`]).
//! [`npy::NpyWriter`] writes `.npy` files. Every failure is a [`SourceError`] naming the file,
//! and where it applies the offset, what was expected and what was found.
//!
//! ```
//! use pinfeed_source::{dtype::parse_user_dtype, HostBuffer, Layout, Source};
//!
//! let (dtype, shape) = parse_user_dtype("2,3u8")?; // records of 2 x 3 bytes
//! let layout = Layout::new(dtype, shape)?;
//! let data: Vec<u8> = (0..60).collect(); // 10 records
//! let source = HostBuffer::from_vec(data, layout)?;
//! assert_eq!(source.num_records(), 10);
//!
//! let mut two = vec![0u8; 12];
//! source.read_records(4, &mut two)?;
//! assert_eq!(two[0], 24);
//! source.gather(&[9, 0], &mut two)?;
//! assert_eq!((two[0], two[6]), (54, 0));
//! assert!(source.read_records(9, &mut two).is_err()); // records 9 and 10: past the end
//! # Ok::<(), pinfeed_source::SourceError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

use std::path::Path;

pub mod dtype;
mod error;
mod fingerprint;
pub mod formats;
mod host;
pub mod images;
mod literal;
pub mod mixture;
mod network;
mod read;
mod readers;
mod records;
pub mod rng;
mod shards;
mod sigbus;
pub mod system;
pub mod table;
pub mod tokens;

pub use dtype::DType;
pub use error::{escape_path, escape_text, SourceError};
pub use fingerprint::data_fingerprint;
pub use formats::raw::RawFile;
pub use formats::{npy, safetensors, Format, FormatOptions};
pub use host::HostBuffer;
pub use network::NetworkStats;
pub use npy::NpyFile;
pub use read::open_regular;
pub use readers::auto::cached_fraction;
pub use readers::{
    resolve_auto, AlignedBuffer, GatherRun, ReadOptions, Reader, UnknownReader,
    DEFAULT_QUEUE_DEPTH, DEFAULT_READ_SIZE, DIRECT_ALIGN,
};
pub use safetensors::SafetensorsFile;
pub use shards::{glob_match, ShardedSource};

pub use sigbus::Guard as MappingGuard;

/// Guards `len` bytes from `start` against `SIGBUS`: a fault there (the mapped file shrank)
/// leaves a page of zeroes and counts one on the guard ([`MappingGuard::faults`]) instead of
/// killing the process. An error says why the handler cannot be installed.
///
/// # Safety
///
/// `start .. start + len` must be a shared mapping of a file owned by the caller, read by
/// nothing that would misbehave on a page of zeroes, and unmapped only after the guard drops.
pub unsafe fn guard_mapping(
    start: *const u8,
    len: usize,
) -> std::result::Result<MappingGuard, String> {
    sigbus::guard(start, len)
}

/// `Result` with a [`SourceError`].
pub type Result<T, E = SourceError> = std::result::Result<T, E>;

/// A record's layout: element dtype and per-record shape (the array shape without its first
/// dimension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The element dtype.
    pub dtype: DType,
    /// The shape of one record; empty for one element per record.
    pub shape: Vec<u64>,
}

impl Layout {
    /// Checks that a record has a non-zero size that fits in memory.
    pub fn new(dtype: DType, shape: Vec<u64>) -> Result<Layout> {
        let err = |dtype: &DType, shape: &[u64], reason| SourceError::Layout {
            path: None,
            dtype: dtype.to_string(),
            shape: shape.to_vec(),
            reason,
        };
        match record_bytes(&dtype, &shape) {
            None => Err(err(
                &dtype,
                &shape,
                "the record size overflows this machine's address space",
            )),
            Some(0) => Err(err(
                &dtype,
                &shape,
                "records of zero bytes cannot be streamed",
            )),
            Some(_) => Ok(Layout { dtype, shape }),
        }
    }

    /// Bytes in one record: the itemsize times the product of the shape.
    ///
    /// For a layout built by [`Layout::new`] this neither overflows nor is zero; a layout built
    /// from its public fields saturates at `usize::MAX` instead of overflowing.
    pub fn record_bytes(&self) -> usize {
        record_bytes(&self.dtype, &self.shape).unwrap_or(usize::MAX)
    }
}

fn record_bytes(dtype: &DType, shape: &[u64]) -> Option<usize> {
    // Kept below isize::MAX: no allocation or slice can be larger.
    let max = isize::MAX as usize;
    shape
        .iter()
        .try_fold(dtype.itemsize, |acc, &d| {
            usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        })
        .filter(|&n| n <= max)
}

/// Where a file-backed source's records are: record `i` starts at byte
/// `data_offset + i * record_bytes` of `file`.
#[derive(Clone, Copy, Debug)]
pub struct FileRegion<'a> {
    /// The open file.
    pub file: &'a std::fs::File,
    /// Its path, for errors.
    pub path: &'a Path,
    /// Byte offset of the first record.
    pub data_offset: u64,
}

/// A dataset of N fixed-size records.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// What errors call it: the file path, or "host buffer".
    fn name(&self) -> &str;

    /// The layout of every record.
    fn layout(&self) -> &Layout;

    /// Records in the dataset; never zero.
    fn num_records(&self) -> u64;

    /// Reads `dst.len() / record_bytes` consecutive records starting at record `first` straight
    /// into `dst` (a positioned read into the caller's memory, with no intermediate buffer).
    ///
    /// `dst.len()` must be a multiple of the record size ([`SourceError::Destination`]) and the
    /// records must lie inside the dataset ([`SourceError::OutOfRange`]).
    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()>;

    /// The file behind a file-backed source, its path, and the byte offset of record 0 in it:
    /// for readers that map the file rather than read it. `None` for other sources.
    fn file(&self) -> Option<FileRegion<'_>> {
        None
    }

    /// Alignment (bytes) that [`read_records_aligned`](Source::read_records_aligned) needs of
    /// the buffer's address: 1 for buffered reads; for `O_DIRECT`, 4096, or more where the file
    /// system reports (`statx`) that direct I/O needs more. Always a power of two.
    fn alignment(&self) -> usize {
        1
    }

    /// Reads `count` records starting at `first` into `buf` and returns the offset in `buf`
    /// where record `first` starts; the records lie at `buf[offset .. offset + count *
    /// record_bytes]`.
    ///
    /// `buf` must start at an address aligned to [`alignment`](Source::alignment) and hold at
    /// least [`aligned_span(count)`](Source::aligned_span) bytes ([`SourceError::Destination`]
    /// otherwise). An `O_DIRECT` source reads the aligned span around the records straight into
    /// `buf` (headers and record boundaries need not be aligned: the offset is what trims them);
    /// other sources read into `buf[..count * record_bytes]` and return 0, as this default does.
    fn read_records_aligned(&self, first: u64, count: usize, buf: &mut [u8]) -> Result<usize> {
        let len = check_aligned_request(self, first, count, buf)?;
        self.read_records(first, &mut buf[..len])?;
        Ok(0)
    }

    /// Bytes [`read_records_aligned`](Source::read_records_aligned) needs for `count` records,
    /// whatever `first` is: `count * record_bytes` when the alignment is 1, otherwise that plus
    /// twice the alignment, rounded up to the alignment. Saturates instead of overflowing.
    ///
    /// Sources that assemble records from several files need more; size buffers with the
    /// source's own answer.
    fn aligned_span(&self, count: usize) -> usize {
        let bytes = count.saturating_mul(self.layout().record_bytes());
        match self.alignment() {
            0 | 1 => bytes,
            a => bytes.saturating_add(2 * a).div_ceil(a).saturating_mul(a),
        }
    }

    /// How this source reads, for statistics: `"pread"`, `"mmap gather, pread ranges"`,
    /// `"O_DIRECT"`, `"io_uring (depth 32)"`, `"io_uring (depth 32, O_DIRECT)"`, or a fallback
    /// with its reason, such as `"pread (io_uring refused: Operation not permitted (os error
    /// 1))"`.
    fn reader_description(&self) -> String {
        "pread".into()
    }

    /// Records best read together, for block shuffling: a Parquet row group's rows (decoded
    /// whole whatever is read of it); `None` where any run of records reads as cheaply.
    fn natural_block(&self) -> Option<u64> {
        None
    }

    /// What the source fetched over the network so far (an object-store source's requests,
    /// retries, cache hits and time waited); `None` for sources that read local files or memory.
    fn network(&self) -> Option<NetworkStats> {
        None
    }

    /// Records in each document, in order, for a source whose records are the tokens of
    /// documents back to back: a table's token or text column (one document a row) opened with
    /// the [`table::DOCUMENTS`] option. The lengths add up to
    /// [`num_records`](Source::num_records). `None` for every other source.
    fn document_lengths(&self) -> Option<Vec<u64>> {
        None
    }

    /// Documents packed into `records` (records of this source, back to back, as read):
    /// summed over their windows, those that each window's inputs start or continue, by the
    /// rule of [`tokens::Boundaries`]. `None` for records that are not windows of documents, or
    /// where the stream does not say where its documents start.
    fn documents_in(&self, _records: &[u8]) -> Option<u64> {
        None
    }

    /// Records in each chunk that a read decodes whole (a table's row group, record batch or
    /// JSON-lines file; for a token or text column, its tokens), in order, empty chunks
    /// included; they add up to [`num_records`](Source::num_records). `None` for sources whose
    /// records cost the same read in any order.
    fn chunk_lengths(&self) -> Option<Vec<u64>> {
        None
    }

    /// Chunks (see [`chunk_lengths`](Source::chunk_lengths)) that reads have decoded so far,
    /// each decode counted once, however many reads it served; `None` for other sources.
    fn chunk_decodes(&self) -> Option<u64> {
        None
    }

    /// The columns of a table's records ([`table::TableSource`], or shards of tables), in
    /// record order; `None` for any other source.
    fn columns(&self) -> Option<&[table::Column]> {
        None
    }

    /// Gathers records in the given order (any order, repeats allowed) into `dst`, back to back;
    /// `dst.len()` must be `indices.len()` records.
    ///
    /// Runs of consecutive indices are read with one [`read_records`](Source::read_records) call.
    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        check_gather_len(self, indices.len(), dst.len())?;
        let record_bytes = self.layout().record_bytes();
        for_each_run(indices.iter().copied().zip(0..), |first, place, count| {
            self.read_records(
                first,
                &mut dst[place * record_bytes..(place + count) * record_bytes],
            )
        })
    }

    /// Gathers records to chosen places of `dst`: for each `(record, place)` of `records`, the
    /// record goes to bytes `place * record_bytes .. (place + 1) * record_bytes`. `dst.len()`
    /// must be whole records and the places strictly increasing and inside `dst`
    /// ([`SourceError::Destination`] otherwise); places not named are left as they are.
    /// [`ShardedSource`] hands each shard its records of a batch this way.
    ///
    /// Runs of consecutive records at consecutive places are read with one
    /// [`read_records`](Source::read_records) call.
    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        check_places(self, records, dst.len())?;
        let record_bytes = self.layout().record_bytes();
        for_each_run(records.iter().copied(), |first, place, count| {
            self.read_records(
                first,
                &mut dst[place * record_bytes..(place + count) * record_bytes],
            )
        })
    }
}

/// Calls `each(first record, its place, records)` for every run of `records` consecutive both
/// in the dataset and in their places, in order: the one coalescing rule of every gather.
pub(crate) fn for_each_run(
    records: impl IntoIterator<Item = (u64, usize)>,
    mut each: impl FnMut(u64, usize, usize) -> Result<()>,
) -> Result<()> {
    // The run being built: first record, its place, and records in it.
    let mut open: Option<(u64, usize, usize)> = None;
    for (record, place) in records {
        open = match open {
            Some((first, at, count))
                if first.checked_add(count as u64) == Some(record) && at + count == place =>
            {
                Some((first, at, count + 1))
            }
            Some((first, at, count)) => {
                each(first, at, count)?;
                Some((record, place, 1))
            }
            None => Some((record, place, 1)),
        };
    }
    match open {
        Some((first, at, count)) => each(first, at, count),
        None => Ok(()),
    }
}

/// Checks that a gather's destination holds exactly `indices` records.
pub(crate) fn check_gather_len(
    source: &(impl Source + ?Sized),
    indices: usize,
    dst_len: usize,
) -> Result<()> {
    let record_bytes = source.layout().record_bytes();
    if indices.checked_mul(record_bytes) != Some(dst_len) {
        return Err(SourceError::Destination {
            name: source.name().to_owned(),
            len: dst_len,
            expected: format!("{indices} indices x {record_bytes} bytes"),
        });
    }
    Ok(())
}

/// Checks a `gather_at` request: `dst_len` is whole records, and the places strictly increase
/// and lie inside it.
pub(crate) fn check_places(
    source: &(impl Source + ?Sized),
    records: &[(u64, usize)],
    dst_len: usize,
) -> Result<()> {
    let record_bytes = source.layout().record_bytes();
    let slots = dst_len / record_bytes;
    let increasing = records.windows(2).all(|w| w[0].1 < w[1].1);
    if dst_len % record_bytes != 0 || !increasing || records.last().is_some_and(|r| r.1 >= slots) {
        return Err(SourceError::Destination {
            name: source.name().to_owned(),
            len: dst_len,
            expected: format!(
                "whole records of {record_bytes} bytes, and places strictly increasing below \
                 {slots} (found {} records for places {:?} .. {:?})",
                records.len(),
                records.first().map(|r| r.1),
                records.last().map(|r| r.1),
            ),
        });
    }
    Ok(())
}

/// Coalesces a gather's indices into runs of consecutive records, after checking the
/// destination's size and every index; for sources that read a file at `data_offset + index *
/// record_bytes`. Record `k` goes to place `k`.
pub fn gather_runs(
    source: &(impl Source + ?Sized),
    data_offset: u64,
    indices: &[u64],
    dst_len: usize,
) -> Result<Vec<readers::GatherRun>> {
    check_gather_len(source, indices.len(), dst_len)?;
    runs_of(source, data_offset, indices.iter().copied().zip(0..))
}

/// [`gather_runs`] for [`Source::gather_at`]: records to the places given.
pub fn gather_runs_at(
    source: &(impl Source + ?Sized),
    data_offset: u64,
    records: &[(u64, usize)],
    dst_len: usize,
) -> Result<Vec<readers::GatherRun>> {
    check_places(source, records, dst_len)?;
    runs_of(source, data_offset, records.iter().copied())
}

/// Runs of records consecutive both in the file and in their places, each checked to lie in
/// the dataset; in the order of their places, which the callers checked to increase.
fn runs_of(
    source: &(impl Source + ?Sized),
    data_offset: u64,
    records: impl Iterator<Item = (u64, usize)>,
) -> Result<Vec<readers::GatherRun>> {
    let record_bytes = source.layout().record_bytes();
    let mut runs: Vec<readers::GatherRun> = Vec::with_capacity(records.size_hint().0);
    for_each_run(records, |first, place, count| {
        check_request(source, first, count * record_bytes)?;
        runs.push(readers::GatherRun {
            offset: data_offset + first * record_bytes as u64,
            at: place * record_bytes,
            len: count * record_bytes,
        });
        Ok(())
    })?;
    Ok(runs)
}

/// Checks a `read_records` request: `len` is whole records and they lie inside the dataset.
/// Returns the number of records.
pub fn check_request(source: &(impl Source + ?Sized), first: u64, len: usize) -> Result<u64> {
    let record_bytes = source.layout().record_bytes();
    if len % record_bytes != 0 {
        return Err(SourceError::Destination {
            name: source.name().to_owned(),
            len,
            expected: format!("a multiple of the record size {record_bytes} bytes"),
        });
    }
    let count = (len / record_bytes) as u64;
    let num_records = source.num_records();
    if first.checked_add(count).is_none_or(|end| end > num_records) {
        return Err(SourceError::OutOfRange {
            name: source.name().to_owned(),
            first,
            count,
            num_records,
        });
    }
    Ok(count)
}

/// Checks a `read_records_aligned` request: the records lie inside the dataset and `buf` is
/// aligned and long enough. Returns the number of record bytes.
pub(crate) fn check_aligned_request(
    source: &(impl Source + ?Sized),
    first: u64,
    count: usize,
    buf: &[u8],
) -> Result<usize> {
    let record_bytes = source.layout().record_bytes();
    let Some(len) = count
        .checked_mul(record_bytes)
        .filter(|&n| n <= isize::MAX as usize)
    else {
        return Err(SourceError::OutOfRange {
            name: source.name().to_owned(),
            first,
            count: count as u64,
            num_records: source.num_records(),
        });
    };
    check_request(source, first, len)?;
    let align = source.alignment().max(1);
    let span = source.aligned_span(count);
    let addr = buf.as_ptr() as usize;
    if addr % align != 0 || buf.len() < span {
        return Err(SourceError::Destination {
            name: source.name().to_owned(),
            len: buf.len(),
            expected: format!(
                "at least {span} bytes (aligned_span of {count} records) at an address aligned \
                 to {align} bytes (found address {addr:#x})"
            ),
        });
    }
    Ok(len)
}

/// Opens a dataset file: a `.npy` file when it starts with the `.npy` magic (whatever its
/// name), otherwise a raw record file of `raw_layout`, or any other format of
/// [`formats::ALL`] that claims it.
///
/// `raw_layout` is ignored for `.npy` files, whose header gives the layout. A file named
/// `*.npy` without the magic is reported as a malformed `.npy` header rather than read as raw.
pub fn open_path(path: impl AsRef<Path>, raw_layout: Option<Layout>) -> Result<Box<dyn Source>> {
    formats::open_file(path.as_ref(), raw_layout.as_ref(), &ReadOptions::default())
}

/// Like [`open_path`], plus: a directory of shards or a glob pattern of shards (a
/// [`ShardedSource`]), every format of [`formats::ALL`] (`.safetensors` files by extension),
/// and the reader, read size, queue depth and format options of `options`.
///
/// A path that exists is opened as it is (a directory as shards, a file by its kind); a path
/// that does not exist and holds `*`, `?` or `[` is a pattern. `raw_layout` describes files that
/// no format claims, alone or matched by a pattern. [`Reader::Auto`] is resolved once, for
/// `path` ([`resolve_auto`]).
pub fn open_with(
    path: impl AsRef<Path>,
    raw_layout: Option<Layout>,
    options: &ReadOptions,
) -> Result<Box<dyn Source>> {
    options.check()?;
    options.format.check()?;
    let path = path.as_ref();
    let resolved;
    let options = match options.reader {
        Reader::Auto => {
            resolved = ReadOptions {
                reader: resolve_auto(path).0,
                ..options.clone()
            };
            &resolved
        }
        _ => options,
    };
    let exists = std::fs::metadata(path);
    if exists.as_ref().is_ok_and(|m| m.is_dir()) || (exists.is_err() && shards::is_pattern(path)) {
        return Ok(Box::new(ShardedSource::open(path, raw_layout, options)?));
    }
    formats::open_file(path, raw_layout.as_ref(), options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u8_layout(shape: Vec<u64>) -> Layout {
        Layout::new(DType::uint8(), shape).unwrap()
    }

    #[test]
    fn layout_sizes() {
        let f4 = DType::from_descr_literal("'<f4'").unwrap();
        assert_eq!(
            Layout::new(f4.clone(), vec![3, 5]).unwrap().record_bytes(),
            60
        );
        assert_eq!(Layout::new(f4.clone(), vec![]).unwrap().record_bytes(), 4);
        assert!(matches!(
            Layout::new(f4.clone(), vec![3, 0]),
            Err(SourceError::Layout { .. })
        ));
        let e = Layout::new(f4.clone(), vec![u64::MAX / 2, 3]).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        assert!(Layout::new(f4, vec![1 << 62]).is_err());
        assert!(Layout::new(DType::from_descr_literal("[]").unwrap(), vec![4]).is_err());
    }

    #[test]
    fn host_buffer_reads_and_gathers() {
        let data: Vec<u8> = (0..=255).collect();
        let b = HostBuffer::from_vec(data.clone(), u8_layout(vec![4])).unwrap();
        assert_eq!(
            (b.num_records(), b.len_bytes(), b.name()),
            (64, 256, "host buffer")
        );
        let mut dst = vec![0u8; 8];
        b.read_records(62, &mut dst).unwrap();
        assert_eq!(dst, &data[248..]);
        let idx = [5u64, 6, 7, 0, 0, 63, 1];
        let mut dst = vec![0u8; 4 * idx.len()];
        b.gather(&idx, &mut dst).unwrap();
        let want: Vec<u8> = idx
            .iter()
            .flat_map(|&i| data[i as usize * 4..i as usize * 4 + 4].to_vec())
            .collect();
        assert_eq!(dst, want);
        b.read_records(64, &mut []).unwrap();
    }

    #[test]
    fn request_errors() {
        let b = HostBuffer::from_vec(vec![0; 40], u8_layout(vec![4])).unwrap();
        let mut dst = vec![0u8; 8];
        assert!(matches!(
            b.read_records(9, &mut dst),
            Err(SourceError::OutOfRange {
                first: 9,
                count: 2,
                num_records: 10,
                ..
            })
        ));
        assert!(matches!(
            b.read_records(u64::MAX, &mut dst),
            Err(SourceError::OutOfRange { .. })
        ));
        assert!(matches!(
            b.read_records(0, &mut dst[..5]),
            Err(SourceError::Destination { .. })
        ));
        assert!(matches!(
            b.gather(&[0, 10], &mut dst),
            Err(SourceError::OutOfRange { first: 10, .. })
        ));
        assert!(matches!(
            b.gather(&[u64::MAX, 0], &mut dst),
            Err(SourceError::OutOfRange { .. })
        ));
        assert!(matches!(
            b.gather(&[0], &mut dst),
            Err(SourceError::Destination { .. })
        ));
        assert!(matches!(
            HostBuffer::from_vec(vec![0; 41], u8_layout(vec![4])),
            Err(SourceError::RecordSize { trailing: 1, .. })
        ));
        assert!(matches!(
            HostBuffer::from_vec(vec![], u8_layout(vec![4])),
            Err(SourceError::Empty { .. })
        ));
    }

    /// Counts calls so the coalescing of `gather` is observable.
    #[derive(Debug)]
    struct Counting(HostBuffer, std::sync::Mutex<Vec<(u64, usize)>>);

    impl Source for Counting {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn layout(&self) -> &Layout {
            self.0.layout()
        }
        fn num_records(&self) -> u64 {
            self.0.num_records()
        }
        fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
            self.1.lock().unwrap().push((first, dst.len()));
            self.0.read_records(first, dst)
        }
    }

    #[test]
    fn gather_coalesces_runs() {
        let c = Counting(
            HostBuffer::from_vec((0..20).collect(), u8_layout(vec![2])).unwrap(),
            Default::default(),
        );
        let mut dst = vec![0u8; 14];
        c.gather(&[3, 4, 5, 9, 2, 3, 3], &mut dst).unwrap();
        assert_eq!(*c.1.lock().unwrap(), vec![(3, 6), (9, 2), (2, 4), (3, 2)]);
        assert_eq!(dst, vec![6, 7, 8, 9, 10, 11, 18, 19, 4, 5, 6, 7, 6, 7]);
    }

    #[test]
    fn gather_at_coalesces_runs_consecutive_in_records_and_places() {
        let c = Counting(
            HostBuffer::from_vec((0..20).collect(), u8_layout(vec![2])).unwrap(),
            Default::default(),
        );
        let mut dst = vec![0xffu8; 12];
        // Records 3, 4 at places 0, 1: one run; record 5 at place 3 (a gap): another.
        c.gather_at(&[(3, 0), (4, 1), (5, 3), (6, 4), (0, 5)], &mut dst)
            .unwrap();
        assert_eq!(*c.1.lock().unwrap(), vec![(3, 4), (5, 4), (0, 2)]);
        assert_eq!(dst, vec![6, 7, 8, 9, 0xff, 0xff, 10, 11, 12, 13, 0, 1]);
        assert!(matches!(
            c.gather_at(&[(0, 1), (1, 1)], &mut dst),
            Err(SourceError::Destination { .. })
        ));
    }
}
