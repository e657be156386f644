//! Parquet columns of records decoded by parquet's column readers straight into the records.
//! Arrow's reader (`parquet.rs`) builds arrays a batch at a time and hands them on to be copied
//! once more; this path takes a column whose physical type holds its values as the record does
//! (a float32 in a FLOAT, a uint8 in an INT32, ...), one level deep. Fixed-size lists, half
//! floats and anything else go to arrow's reader.
//!
//! On the reader's thread alone, a window of rows at a time: every column's values of the
//! window into a small buffer, then into the records, while both are in the cache. Where cores
//! are idle ([`Busy`]), a row group of several megabytes is split among helper threads instead:
//! each column chunk decoded by one thread (its pages decode in order) into a buffer of every
//! column's values, then the records packed a block of rows at a time, each block by one
//! thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_buffer::ToByteSlice;
use arrow_schema::{DataType, Field};
use parquet::basic::Type as Physical;
use parquet::column::reader::{
    get_column_reader, get_typed_column_reader, ColumnReader, ColumnReaderImpl,
};
use parquet::data_type::{
    BoolType, DataType as ParquetType, DoubleType, FloatType, Int32Type, Int64Type,
};
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::{ColumnDescPtr, SchemaDescriptor};

use super::columns::{scatter_rows, table_error, Column};
use super::cores::Busy;
use super::spares;
use crate::Result;

/// Bytes of records a thread is given at least: a row group smaller than this decodes on its
/// reader's thread alone, so that threads are not started for less work than they cost.
const SPLIT_BYTES: usize = 4 << 20;

/// Bytes of records packed at a time: a block of rows whose values stay in a core's cache.
const BLOCK_BYTES: usize = 512 << 10;

/// Rows a column reader decodes in one call, so that the null check reads levels still in the
/// cache.
const WINDOW_ROWS: usize = 1 << 16;

/// What one record column's values are in the file.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Bool,
    /// An INT32, of which the record keeps this many low bytes (4, or 2 or 1 for the narrower
    /// integers, which Parquet stores as INT32).
    Int32(usize),
    Int64,
    Float,
    Double,
}

/// How the columns of the records are read: each column's leaf in the file and its kind, in
/// the record's order.
#[derive(Debug)]
pub(crate) struct Plan {
    leaves: Vec<(usize, ColumnDescPtr, Kind)>,
}

impl Plan {
    /// The plan for `fields` (the record's `columns`, in order) of a file of `schema`, when
    /// every column is a top-level primitive whose physical type holds it as the record does.
    pub(crate) fn new(schema: &SchemaDescriptor, fields: &[&Field]) -> Option<Plan> {
        let mut leaves = Vec::with_capacity(fields.len());
        for field in fields {
            let (leaf, desc) = schema.columns().iter().enumerate().find(|(_, c)| {
                c.path().parts().len() == 1 && c.path().parts()[0] == *field.name()
            })?;
            if desc.max_rep_level() != 0 || desc.max_def_level() > 1 {
                return None;
            }
            let kind = match (desc.physical_type(), field.data_type()) {
                (Physical::BOOLEAN, DataType::Boolean) => Kind::Bool,
                (Physical::INT32, DataType::Int32 | DataType::UInt32) => Kind::Int32(4),
                (Physical::INT32, DataType::Int16 | DataType::UInt16) => Kind::Int32(2),
                (Physical::INT32, DataType::Int8 | DataType::UInt8) => Kind::Int32(1),
                (Physical::INT64, DataType::Int64 | DataType::UInt64) => Kind::Int64,
                (Physical::FLOAT, DataType::Float32) => Kind::Float,
                (Physical::DOUBLE, DataType::Float64) => Kind::Double,
                _ => return None,
            };
            leaves.push((leaf, desc.clone(), kind));
        }
        Some(Plan { leaves })
    }
}

/// Row group `group`'s records of `columns` (`record_bytes` each), as `plan` reads them from
/// `chunks` (its column chunks), on the caller's thread and helpers where cores are idle;
/// `at` names the row group for errors.
pub(crate) fn decode<R: ChunkReader + 'static>(
    plan: &Plan,
    chunks: Arc<R>,
    group: &RowGroupMetaData,
    columns: &[Column],
    record_bytes: usize,
    at: &str,
) -> Result<Vec<u8>> {
    let decode = Decode {
        plan,
        group,
        columns,
        record_bytes,
        at,
    };
    let total = decode.rows().saturating_mul(record_bytes);
    let busy = Busy::take((total / SPLIT_BYTES).min(columns.len()).saturating_sub(1));
    decode.on(chunks, busy.threads())
}

/// What [`decode`] decodes.
struct Decode<'a> {
    plan: &'a Plan,
    group: &'a RowGroupMetaData,
    columns: &'a [Column],
    record_bytes: usize,
    at: &'a str,
}

impl Decode<'_> {
    /// The row group's rows, as its footer says.
    fn rows(&self) -> usize {
        usize::try_from(self.group.num_rows().max(0)).unwrap_or(usize::MAX)
    }

    /// The records, on `threads` threads.
    fn on<R: ChunkReader + 'static>(&self, chunks: Arc<R>, threads: usize) -> Result<Vec<u8>> {
        let rows = self.rows();
        let (columns, record_bytes) = (self.columns, self.record_bytes);
        let mut cursors = self.cursors(chunks, rows)?;
        // Where the columns leave no padding in a record, every byte of it is written.
        let padded = columns.iter().map(Column::bytes).sum::<usize>() != record_bytes;
        let mut out = spares::take(rows.saturating_mul(record_bytes), padded);
        match &mut cursors[..] {
            [one] if columns[0].bytes() == record_bytes => {
                one.fill(&mut out)?;
                one.finish()?;
            }
            _ if threads > 1 => split(cursors, threads, columns, rows, record_bytes, &mut out)?,
            _ => self.windows(&mut cursors, &mut out)?,
        }
        Ok(out)
    }

    /// A cursor over each column's chunk of `rows` rows, read from `chunks`.
    fn cursors<R: ChunkReader + 'static>(
        &self,
        chunks: Arc<R>,
        rows: usize,
    ) -> Result<Vec<Box<dyn Cursor + '_>>> {
        let mut cursors = Vec::with_capacity(self.columns.len());
        for ((leaf, desc, kind), column) in self.plan.leaves.iter().zip(self.columns) {
            let chunk = Chunk {
                rows,
                column,
                at: self.at,
                nullable: desc.max_def_level() > 0,
            };
            let props = Arc::new(ReaderProperties::builder().build());
            let meta = self.group.column(*leaf);
            let pages =
                SerializedPageReader::new_with_properties(chunks.clone(), meta, rows, None, props)
                    .map_err(|e| chunk.fail(format!("cannot be decoded: {e}")))?;
            let reader = get_column_reader(desc.clone(), Box::new(pages));
            cursors.push(cursor(chunk, reader, *kind));
        }
        Ok(cursors)
    }

    /// The records on one thread, a window of rows at a time: each column's values into a
    /// buffer of its own, then into the records, while both are in the cache.
    fn windows(&self, cursors: &mut [Box<dyn Cursor + '_>], out: &mut [u8]) -> Result<()> {
        let (columns, record_bytes) = (self.columns, self.record_bytes);
        let window = (BLOCK_BYTES / record_bytes.max(1)).clamp(1, WINDOW_ROWS);
        let mut buffers: Vec<Vec<u8>> = columns
            .iter()
            .map(|c| vec![0; window * c.bytes()])
            .collect();
        for records in out.chunks_mut(window * record_bytes) {
            let n = records.len() / record_bytes.max(1);
            for (cursor, (buffer, column)) in
                cursors.iter_mut().zip(buffers.iter_mut().zip(columns))
            {
                cursor.fill(&mut buffer[..n * column.bytes()])?;
            }
            let parts: Vec<(&[u8], &Column)> = buffers
                .iter()
                .zip(columns)
                .map(|(b, c)| (&b[..n * c.bytes()], c))
                .collect();
            scatter_rows(&parts, records, record_bytes);
        }
        cursors.iter_mut().try_for_each(|c| c.finish())
    }
}

/// [`decode`] on `threads` threads: each column chunk by one thread, the columns taken in
/// turn, into its part of a buffer of every column's values (column after column); then the
/// records a block of rows at a time, the blocks taken in turn.
fn split(
    cursors: Vec<Box<dyn Cursor + '_>>,
    threads: usize,
    columns: &[Column],
    rows: usize,
    record_bytes: usize,
    out: &mut [u8],
) -> Result<()> {
    let mut values = spares::take(
        rows * columns.iter().map(Column::bytes).sum::<usize>(),
        false,
    );
    let mut work = Vec::with_capacity(columns.len());
    let mut rest = &mut values[..];
    for (cursor, column) in cursors.into_iter().zip(columns) {
        let (part, after) = rest.split_at_mut(rows * column.bytes());
        work.push((cursor, part));
        rest = after;
    }
    let failed: Mutex<Option<crate::SourceError>> = Mutex::new(None);
    each_on(threads, work, |(mut cursor, part)| {
        if let Err(e) = cursor.fill(part).and_then(|()| cursor.finish()) {
            let mut failed = failed.lock().unwrap_or_else(|e| e.into_inner());
            failed.get_or_insert(e);
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut parts: Vec<(&[u8], &Column)> = Vec::with_capacity(columns.len());
    let mut rest = &values[..];
    for c in columns {
        let (part, after) = rest.split_at(rows * c.bytes());
        parts.push((part, c));
        rest = after;
    }
    let block_rows = (BLOCK_BYTES / record_bytes.max(1)).max(1);
    let blocks = out
        .chunks_mut(block_rows * record_bytes)
        .enumerate()
        .collect();
    each_on(threads, blocks, |(b, records)| {
        let (first, count) = (b * block_rows, records.len() / record_bytes);
        let rows: Vec<(&[u8], &Column)> = parts
            .iter()
            .map(|(v, c)| (&v[first * c.bytes()..(first + count) * c.bytes()], *c))
            .collect();
        scatter_rows(&rows, records, record_bytes);
    });
    drop(parts);
    super::cache::give_back(values);
    Ok(())
}

/// Runs `each` on every one of `items`, on the calling thread and `threads - 1` more, each
/// item taken by the next thread free.
fn each_on<T: Send>(threads: usize, items: Vec<T>, each: impl Fn(T) + Sync) {
    let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
            if let Some(item) = item.lock().unwrap_or_else(|e| e.into_inner()).take() {
                each(item);
            }
        }
    };
    if threads <= 1 {
        return work();
    }
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(work);
        }
        work();
    });
}

/// A column chunk being read, rows in order.
trait Cursor: Send {
    /// Decodes the next rows' values into `out`, which holds as many as it is long.
    fn fill(&mut self, out: &mut [u8]) -> Result<()>;
    /// Checks that the chunk holds no more rows than were read.
    fn finish(&mut self) -> Result<()>;
}

/// A column chunk of a row group: its rows, and what names it in errors.
struct Chunk<'a> {
    rows: usize,
    column: &'a Column,
    at: &'a str,
    /// The column may hold nulls (its definition levels are read, and must all be set).
    nullable: bool,
}

impl Chunk<'_> {
    fn fail(&self, reason: String) -> crate::SourceError {
        table_error(self.at, format!("column {:?} {reason}", self.column.name))
    }
}

/// The cursor over `chunk`, read by `reader` as its values are of `kind`.
fn cursor<'a>(chunk: Chunk<'a>, reader: ColumnReader, kind: Kind) -> Box<dyn Cursor + 'a> {
    fn typed<'a, T: ParquetType>(
        chunk: Chunk<'a>,
        reader: ColumnReader,
        put: fn(&[T::T], &mut [u8]),
    ) -> Box<dyn Cursor + 'a> {
        Box::new(Typed::<T> {
            reader: get_typed_column_reader::<T>(reader),
            put,
            values: Vec::new(),
            levels: Vec::new(),
            done: 0,
            chunk,
        })
    }
    /// Values whose bytes are the record's, as they are.
    fn same<T: arrow_buffer::ArrowNativeType>(values: &[T], out: &mut [u8]) {
        out.copy_from_slice(values.to_byte_slice());
    }
    match kind {
        Kind::Bool => typed::<BoolType>(chunk, reader, |v, out| {
            for (b, o) in v.iter().zip(out) {
                *o = u8::from(*b);
            }
        }),
        Kind::Int32(4) => typed::<Int32Type>(chunk, reader, same),
        Kind::Int32(2) => typed::<Int32Type>(chunk, reader, |v, out| {
            for (x, o) in v.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&(*x as u16).to_le_bytes());
            }
        }),
        Kind::Int32(_) => typed::<Int32Type>(chunk, reader, |v, out| {
            for (x, o) in v.iter().zip(out) {
                *o = *x as u8;
            }
        }),
        Kind::Int64 => typed::<Int64Type>(chunk, reader, same),
        Kind::Float => typed::<FloatType>(chunk, reader, same),
        Kind::Double => typed::<DoubleType>(chunk, reader, same),
    }
}

/// A [`Cursor`] over a column of parquet type `T`, a window's values put in place by `put`.
struct Typed<'a, T: ParquetType> {
    reader: ColumnReaderImpl<T>,
    put: fn(&[T::T], &mut [u8]),
    values: Vec<T::T>,
    levels: Vec<i16>,
    /// Rows read so far.
    done: usize,
    chunk: Chunk<'a>,
}

impl<T: ParquetType> Typed<'_, T> {
    fn decode(&self, e: parquet::errors::ParquetError) -> crate::SourceError {
        self.chunk.fail(format!("cannot be decoded: {e}"))
    }
}

impl<T: ParquetType> Cursor for Typed<'_, T> {
    fn fill(&mut self, out: &mut [u8]) -> Result<()> {
        let width = self.chunk.column.bytes();
        let mut at = 0;
        while at < out.len() {
            self.values.clear();
            self.levels.clear();
            let want = ((out.len() - at) / width).min(WINDOW_ROWS);
            let defs = self.chunk.nullable.then_some(&mut self.levels);
            let (records, read, _) = self
                .reader
                .read_records(want, defs, None, &mut self.values)
                .map_err(|e| self.decode(e))?;
            if read < records {
                let null = self.levels.iter().position(|&d| d == 0).unwrap_or(0);
                return Err(self.chunk.fail(format!(
                    "holds a null at row {}; records cannot hold a missing value (fill or drop \
                     them first)",
                    self.done + null
                )));
            }
            if records == 0 {
                return Err(self.chunk.fail(format!(
                    "ends after {} rows where the footer says {}",
                    self.done, self.chunk.rows
                )));
            }
            (self.put)(&self.values, &mut out[at..at + records * width]);
            at += records * width;
            self.done += records;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let defs = self.chunk.nullable.then_some(&mut self.levels);
        let (more, _, _) = self
            .reader
            .read_records(1, defs, None, &mut self.values)
            .map_err(|e| self.decode(e))?;
        if more > 0 {
            return Err(self.chunk.fail(format!(
                "holds more than the {} rows the footer says",
                self.chunk.rows
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::RecordBatch;
    use parquet::arrow::arrow_reader::ArrowReaderMetadata;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    /// A Parquet file of `batch` in memory, snappy-compressed, in row groups of `group_rows`,
    /// pages of at most 3,000 rows, with or without statistics.
    fn written(batch: &RecordBatch, group_rows: usize, statistics: bool) -> bytes::Bytes {
        let stats = if statistics {
            parquet::file::properties::EnabledStatistics::Page
        } else {
            parquet::file::properties::EnabledStatistics::None
        };
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group_rows))
            .set_data_page_row_count_limit(3000)
            .set_write_batch_size(1000)
            .set_compression(parquet::basic::Compression::SNAPPY)
            .set_statistics_enabled(stats)
            .build();
        let mut file = Vec::new();
        let mut w = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
        file.into()
    }

    /// Each row group's records of the columns `names` of `file`, decoded on `threads`
    /// threads, one after the other; `None` where the columns take arrow's reader.
    fn records(file: &bytes::Bytes, names: &[&str], threads: usize) -> Option<Result<Vec<u8>>> {
        let meta = ArrowReaderMetadata::load(file, Default::default()).unwrap();
        let schema = meta.schema();
        let fields: Vec<_> = names
            .iter()
            .map(|n| schema.field_with_name(n).unwrap())
            .collect();
        let (layout, columns) = super::super::columns::layout_of("t", &fields).unwrap();
        let plan = Plan::new(meta.parquet_schema(), &fields)?;
        let mut all = Vec::new();
        for group in meta.metadata().row_groups() {
            let decode = Decode {
                plan: &plan,
                group,
                columns: &columns,
                record_bytes: layout.record_bytes(),
                at: "t, row group",
            };
            match decode.on(Arc::new(file.clone()), threads) {
                Ok(records) => all.extend(records),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(all))
    }

    #[test]
    fn every_primitive_column_decodes_to_its_value_on_one_thread_or_several() {
        use arrow_array::*;
        let n = 40_000usize; // row groups of several blocks and windows of rows
        let int = |i: usize| (i as i64 * 7919 % 1000) - 500; // repeats: dictionary pages
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "a",
                Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 3 == 0)))),
            ),
            (
                "b",
                Arc::new(Int8Array::from_iter_values((0..n).map(|i| int(i) as i8))),
            ),
            (
                "c",
                Arc::new(UInt8Array::from_iter_values((0..n).map(|i| i as u8))),
            ),
            (
                "d",
                Arc::new(Int16Array::from_iter_values(
                    (0..n).map(|i| int(i) as i16 * 60),
                )),
            ),
            (
                "e",
                Arc::new(UInt16Array::from_iter_values(
                    (0..n).map(|i| (i as u16).wrapping_mul(3)),
                )),
            ),
            (
                "f",
                Arc::new(Int32Array::from_iter_values(
                    (0..n).map(|i| (int(i) as i32) << 20),
                )),
            ),
            (
                "g",
                Arc::new(UInt32Array::from_iter_values(
                    (0..n).map(|i| u32::MAX - i as u32),
                )),
            ),
            (
                "h",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| int(i) << 40))),
            ),
            (
                "i",
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| u64::MAX - i as u64),
                )),
            ),
            (
                "j",
                Arc::new(Float32Array::from_iter_values(
                    (0..n).map(|i| i as f32 / 3.0),
                )),
            ),
            (
                "k",
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| -(i as f64) / 7.0),
                )),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns.clone()).unwrap();
        let file = written(&batch, 25_000, true);
        // Out of the file's order, and padded: `a` (1 byte) before `h` (8).
        let names = ["k", "a", "h", "b", "g", "d", "c", "i", "e", "f", "j"];
        let one = records(&file, &names, 1).unwrap().unwrap();
        assert!(one == records(&file, &names, 3).unwrap().unwrap());
        // The records by hand: each value at its column's offset, padding zero.
        let fields: Vec<_> = names
            .iter()
            .map(|&n| batch.schema().field_with_name(n).unwrap().clone())
            .collect();
        let refs: Vec<_> = fields.iter().collect();
        let (layout, cols) = super::super::columns::layout_of("t", &refs).unwrap();
        let rb = layout.record_bytes();
        let mut want = vec![0u8; n * rb];
        for (c, name) in cols.iter().zip(names) {
            let array = &columns.iter().find(|(k, _)| *k == name).unwrap().1;
            let data = array.to_data();
            for (r, record) in want.chunks_exact_mut(rb).enumerate() {
                let w = c.bytes();
                let value: Vec<u8> = if name == "a" {
                    vec![u8::from(r % 3 == 0)]
                } else {
                    data.buffers()[0].as_slice()[r * w..(r + 1) * w].to_vec()
                };
                record[c.offset..c.offset + w].copy_from_slice(&value);
            }
        }
        assert!(one == want);
    }

    #[test]
    fn a_fixed_size_list_column_takes_arrows_reader() {
        use arrow_array::*;
        let pairs = (0..10).map(|i| Some([Some(i as f32), Some(-(i as f32))]));
        let pairs = FixedSizeListArray::from_iter_primitive::<types::Float32Type, _, _>(pairs, 2);
        let batch = RecordBatch::try_from_iter([
            (
                "x",
                Arc::new(Float32Array::from_iter_values((0..10).map(|i| i as f32))) as ArrayRef,
            ),
            ("h", Arc::new(pairs) as ArrayRef),
        ])
        .unwrap();
        let file = written(&batch, 10, true);
        assert!(records(&file, &["x"], 1).is_some());
        assert!(records(&file, &["x", "h"], 1).is_none());
    }

    #[test]
    fn a_null_the_footer_does_not_count_is_refused_naming_its_row() {
        use arrow_array::*;
        let values = (0..10_000).map(|i| (i != 6_543).then_some(i as f64));
        let batch = RecordBatch::try_from_iter([(
            "v",
            Arc::new(Float64Array::from_iter(values)) as ArrayRef,
        )])
        .unwrap();
        let file = written(&batch, 10_000, false);
        for threads in [1, 2] {
            let e = records(&file, &["v"], threads)
                .unwrap()
                .unwrap_err()
                .to_string();
            assert!(e.contains("column \"v\" holds a null at row 6543"), "{e}");
        }
    }

    #[test]
    fn garbled_pages_are_refused_or_read_never_a_panic() {
        use arrow_array::*;
        let n = 30_000usize;
        let batch = RecordBatch::try_from_iter([
            (
                "f",
                Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32))) as ArrayRef,
            ),
            (
                "d",
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| (i % 100) as i64),
                )) as _,
            ),
        ])
        .unwrap();
        let file = written(&batch, 10_000, false);
        let body = file.len() - 2000; // the footer left whole
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as usize
        };
        let mut refused = 0;
        for trial in 0..400 {
            let mut data = file.to_vec();
            for _ in 0..1 + trial % 40 {
                let at = 4 + next() % (body - 4);
                data[at] = next() as u8;
            }
            let data = bytes::Bytes::from(data);
            let got = std::panic::catch_unwind(|| records(&data, &["f", "d"], 1 + trial % 2));
            match got {
                Ok(read) => refused += usize::from(read.expect("a plan").is_err()),
                Err(_) => panic!("garbled trial {trial} panicked"),
            }
        }
        assert!(refused > 0, "no garbled page was refused");
    }
}
