//! Parquet files: each row group a chunk, only the columns asked for read and decoded. A file
//! is read by ranges ([`ByteRanges`]), locally or from object storage alike: the footer's
//! 8-byte tail, then the footer, at open; then for each row group decoded, the byte ranges of
//! the chunks of the columns asked for, all at once, and nothing else.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{FooterTail, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::FOOTER_SIZE;

use super::columns::{pack, pack_into, table_error, Column};
use super::pages::{decode, Plan};
use super::{columns_option, Chunks, TableSource};
use crate::formats::{ByteRanges, FileRanges, Format, OpenFile, OpenRanges};
use crate::{ReadOptions, Result, Source};

/// Parquet (`*.parquet`, or a file starting with `PAR1`); options `columns`.
#[derive(Debug)]
pub(crate) struct Parquet;

impl Format for Parquet {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["parquet", "pq"]
    }

    fn option_keys(&self) -> &'static [&'static str] {
        super::OPTION_KEYS
    }

    fn sniff(&self, head: &[u8]) -> bool {
        head.starts_with(b"PAR1")
    }

    fn open(&self, open: OpenFile<'_>) -> Result<Box<dyn Source>> {
        let bytes = Arc::new(FileRanges::new(open.file, open.path, open.size));
        Ok(Box::new(open_parquet(bytes, open.options)?))
    }

    fn open_ranges(&self, open: OpenRanges<'_>) -> Result<Box<dyn Source>> {
        Ok(Box::new(open_parquet(open.bytes, open.options)?))
    }
}

/// The footer of a Parquet file: its last 8 bytes say how long the metadata before them is.
fn read_footer(bytes: &dyn ByteRanges) -> Result<ParquetMetaData> {
    let name = bytes.name();
    let corrupt =
        |e: &dyn std::fmt::Display| table_error(name, format!("not a readable Parquet file: {e}"));
    let size = bytes.size();
    let tail_at = FOOTER_SIZE as u64;
    if size < tail_at + 4 {
        return Err(corrupt(&format!(
            "{size} bytes, fewer than a magic number and a footer"
        )));
    }
    let tail = bytes.read_range(size - tail_at..size)?;
    let tail = FooterTail::try_from(&tail[..]).map_err(|e| corrupt(&e))?;
    if tail.is_encrypted_footer() {
        return Err(corrupt(
            &"its footer is encrypted, which pinfeed does not read",
        ));
    }
    let len = tail.metadata_length() as u64;
    if len + tail_at + 4 > size {
        return Err(corrupt(&format!(
            "the footer says its metadata is {len} bytes, more than the file holds before it"
        )));
    }
    let metadata = bytes.read_range(size - tail_at - len..size - tail_at)?;
    ParquetMetaDataReader::decode_metadata(&metadata).map_err(|e| corrupt(&e))
}

/// Opens a Parquet file's columns (all when none are asked for) as records.
pub(crate) fn open_parquet(
    bytes: Arc<dyn ByteRanges>,
    options: &ReadOptions,
) -> Result<TableSource> {
    let name = bytes.name().to_owned();
    let metadata =
        ArrowReaderMetadata::try_new(Arc::new(read_footer(&*bytes)?), ArrowReaderOptions::new())
            .map_err(|e| table_error(&name, format!("not a readable Parquet file: {e}")))?;
    let schema = metadata.schema().clone();
    let format = &options.format;
    let wanted = columns_option(format)?;
    let indices = super::ipc::resolve(&name, &schema, wanted.as_deref())?;
    let fields: Vec<_> = indices.iter().map(|&i| schema.field(i)).collect();
    let (layout, columns) = super::layout_for(format, &name, &fields, &*bytes)?;
    let meta = metadata.metadata();
    // Nulls are refused at open where the writer kept counts (pyarrow does), else when the
    // row group is decoded.
    for (g, group) in meta.row_groups().iter().enumerate() {
        for chunk in group.columns() {
            let root = &chunk.column_path().parts()[0];
            let nulls = chunk
                .statistics()
                .and_then(|s| s.null_count_opt())
                .unwrap_or(0);
            if nulls > 0 && columns.iter().any(|c| &c.name == root && !c.tokens) {
                return Err(table_error(
                    &format!("{name}, row group {g}"),
                    format!(
                        "column {root:?} holds {nulls} nulls; records cannot hold a missing \
                         value (fill or drop them first)"
                    ),
                ));
            }
        }
    }
    let rows: Vec<u64> = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .collect();
    if columns.first().is_some_and(|c| !c.tokens) {
        let memory = crate::system::mem_total();
        for (g, &n) in rows.iter().enumerate() {
            let at = format!("{name}, row group {g}");
            fits_in_memory(&at, n, layout.record_bytes(), memory)?;
        }
    }
    let plan = match columns.first() {
        Some(c) if !c.tokens => Plan::new(metadata.parquet_schema(), &fields),
        _ => None,
    };
    let mask = ProjectionMask::roots(metadata.parquet_schema(), indices.iter().copied());
    let leaves = (0..metadata.parquet_schema().num_columns())
        .filter(|&c| mask.leaf_included(c))
        .collect();
    let chunks = RowGroups {
        name: name.clone(),
        bytes,
        metadata,
        mask,
        leaves,
        rows,
        plan,
    };
    TableSource::new(
        name,
        layout,
        columns,
        Box::new(chunks),
        "parquet row groups".into(),
    )
}

/// Refuses a row group whose `rows` records of `record_bytes` each, decoded whole, would not
/// fit in the machine's `memory`: a footer that says so is corrupt or the file is not meant
/// for records, and allocating them would end the process rather than fail.
fn fits_in_memory(at: &str, rows: u64, record_bytes: usize, memory: Option<u64>) -> Result<()> {
    let bytes = rows.saturating_mul(record_bytes as u64);
    match memory {
        Some(memory) if bytes > memory => Err(table_error(
            at,
            format!(
                "the footer says {rows} rows, {bytes} bytes of records decoded, more than this \
                 machine's {memory} bytes of memory"
            ),
        )),
        _ => Ok(()),
    }
}

/// A Parquet file's row groups.
struct RowGroups {
    name: String,
    bytes: Arc<dyn ByteRanges>,
    metadata: ArrowReaderMetadata,
    mask: ProjectionMask,
    /// The leaf columns `mask` takes: the column chunks read of each row group.
    leaves: Vec<usize>,
    rows: Vec<u64>,
    /// How records are decoded without arrow's reader, where their columns allow it.
    plan: Option<Plan>,
}

impl std::fmt::Debug for RowGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroups")
            .field("name", &self.name)
            .field("rows", &self.rows)
            .finish()
    }
}

impl RowGroups {
    /// The chunks of the columns asked for in row group `i`, read together.
    fn fetch(&self, i: usize, at: &str) -> Result<Fetched> {
        let group = self.metadata.metadata().row_group(i);
        let size = self.bytes.size();
        let mut ranges: Vec<Range<u64>> = Vec::with_capacity(self.leaves.len());
        for &c in &self.leaves {
            let (start, len) = group.column(c).byte_range();
            let range = start..start.saturating_add(len);
            if range.end > size {
                return Err(table_error(
                    at,
                    format!(
                        "the footer puts column chunk {c} at bytes {}..{}, past the end of the \
                         file ({size} bytes)",
                        range.start, range.end
                    ),
                ));
            }
            ranges.push(range);
        }
        let buffers = self.bytes.read_ranges(&ranges)?;
        let parts = ranges
            .iter()
            .zip(buffers)
            .map(|(r, b)| (r.start, Bytes::from(b)))
            .collect();
        Ok(Fetched { parts, size })
    }
}

impl Chunks for RowGroups {
    fn rows(&self) -> &[u64] {
        &self.rows
    }

    fn pack(
        &self,
        i: usize,
        columns: &[Column],
        record_bytes: usize,
        mut documents: Option<&mut Vec<u64>>,
    ) -> Result<Vec<u8>> {
        let at = format!("{}, row group {i}", self.name);
        let fail = |e: &dyn std::fmt::Display| table_error(&at, format!("cannot decode: {e}"));
        let fetched = self.fetch(i, &at)?;
        if let Some(plan) = &self.plan {
            let group = self.metadata.metadata().row_group(i);
            return decode(plan, Arc::new(fetched), group, columns, record_bytes, &at);
        }
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(fetched, self.metadata.clone())
                .with_projection(self.mask.clone())
                .with_row_groups(vec![i])
                .with_batch_size(batch_rows(columns, record_bytes, self.rows[i]))
                .build()
                .map_err(|e| fail(&e))?;
        if columns.first().is_some_and(|c| c.tokens) {
            let mut out = Vec::with_capacity(self.rows[i] as usize * record_bytes);
            for batch in reader {
                let batch = batch.map_err(|e| fail(&e))?;
                pack(
                    &batch,
                    columns,
                    record_bytes,
                    &at,
                    &mut out,
                    documents.as_deref_mut(),
                )?;
            }
            return Ok(out);
        }
        // Records: the row group's in one zeroed buffer (a spare, or fresh pages: no memset, as
        // growing a Vec batch by batch did), each batch packed into its place.
        let rows = self.rows[i] as usize;
        let mut out = super::spares::take(rows * record_bytes, true);
        let mut decoded = 0;
        for batch in reader {
            let batch = batch.map_err(|e| fail(&e))?;
            let end = decoded + batch.num_rows();
            let Some(records) = out.get_mut(decoded * record_bytes..end * record_bytes) else {
                return Err(table_error(
                    &at,
                    format!("decoded more rows than the {rows} the footer says"),
                ));
            };
            pack_into(&batch, columns, record_bytes, &at, records)?;
            decoded = end;
        }
        if decoded != rows {
            return Err(table_error(
                &at,
                format!("decoded {decoded} rows where the footer says {rows}"),
            ));
        }
        Ok(out)
    }
}

/// Rows a record batch decodes: for records, a batch's arrays small enough to be packed
/// while they are still in the cache (a whole row group's would go out to memory and back);
/// a token or text column's rows (documents) as they come, up to a row group.
fn batch_rows(columns: &[Column], record_bytes: usize, rows: u64) -> usize {
    let most = if columns.first().is_some_and(|c| c.tokens) {
        1 << 20
    } else {
        (BATCH_BYTES / record_bytes.max(1)).max(1)
    };
    rows.clamp(1, most as u64) as usize
}

/// Bytes of records a decoded record batch holds at most.
const BATCH_BYTES: usize = 1 << 20;

/// A row group's column chunks in memory, as parquet's reader asks for them: every page it
/// reads lies inside the chunk of its column.
struct Fetched {
    /// Each chunk's first byte in the file, and its bytes.
    parts: Vec<(u64, Bytes)>,
    /// The file's size.
    size: u64,
}

impl Fetched {
    /// Bytes `start .. start + len`, or from `start` to the end of the chunk it lies in when
    /// `len` is `None` (chunks may touch: the byte at `start` is then the next chunk's).
    fn slice(&self, start: u64, len: Option<usize>) -> parquet::errors::Result<Bytes> {
        let within = self.parts.iter().find_map(|(at, b)| {
            let from = usize::try_from(start.checked_sub(*at)?).ok()?;
            let to = match len {
                Some(n) => from.checked_add(n)?,
                None if from < b.len() => b.len(),
                None => return None,
            };
            (to <= b.len()).then(|| b.slice(from..to))
        });
        within.ok_or_else(|| {
            parquet::errors::ParquetError::General(format!(
                "bytes from {start} asked for lie outside the column chunks read"
            ))
        })
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, Some(length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_group_of_many_batches_packs_every_record_in_its_place() {
        use arrow_array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt8Array};
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::WriterProperties;
        let rows = 100_000usize; // batches of `batch_rows`, the last one short
        let n = rows as i64;
        let pairs = (0..n).map(|i| Some([Some(i as f32), Some(-(i as f32))]));
        let pairs = FixedSizeListArray::from_iter_primitive::<arrow_array::types::Float32Type, _, _>(
            pairs, 2,
        );
        let batch = RecordBatch::try_from_iter([
            (
                "a",
                Arc::new(UInt8Array::from_iter_values((0..n).map(|i| i as u8))) as _,
            ),
            (
                "b",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i * 3))) as _,
            ),
            ("c", Arc::new(pairs) as _),
            (
                "d",
                Arc::new(Float32Array::from_iter_values(
                    (0..n).map(|i| i as f32 / 2.0),
                )) as _,
            ),
        ])
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.parquet");
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .set_data_page_row_count_limit(7000)
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let size = file.metadata().unwrap().len();
        let mut options = ReadOptions::default();
        options.format.set("columns", "d,a,c,b");
        let source = open_parquet(Arc::new(FileRanges::new(file, &path, size)), &options).unwrap();
        let columns = source.columns();
        let rb = source.layout().record_bytes();
        assert!(rows > 2 * batch_rows(columns, rb, rows as u64));
        // The records by hand: each column's value at its offset, padding zero.
        let at = |name: &str| columns.iter().find(|c| c.name == name).unwrap().offset;
        let mut want = vec![0u8; rows * rb];
        for (i, record) in want.chunks_exact_mut(rb).enumerate() {
            let mut put = |o: usize, b: &[u8]| record[o..o + b.len()].copy_from_slice(b);
            put(at("a"), &[i as u8]);
            put(at("b"), &(i as i64 * 3).to_le_bytes());
            put(at("c"), &(i as f32).to_le_bytes());
            put(at("c") + 4, &(-(i as f32)).to_le_bytes());
            put(at("d"), &(i as f32 / 2.0).to_le_bytes());
        }
        let mut got = vec![1u8; rows * rb];
        source.read_records(0, &mut got).unwrap();
        assert!(got == want);
    }

    #[test]
    fn a_row_group_larger_than_memory_is_refused_naming_it() {
        assert!(fits_in_memory("f, row group 2", 1000, 128, Some(128_000)).is_ok());
        assert!(fits_in_memory("f, row group 2", u64::MAX, 128, None).is_ok());
        let e = fits_in_memory("f, row group 2", 1001, 128, Some(128_000)).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("f, row group 2") && e.contains("1001 rows, 128128 bytes"),
            "{e}"
        );
        assert!(fits_in_memory("f", u64::MAX, 128, Some(u64::MAX - 1)).is_err());
    }

    #[test]
    fn a_read_where_two_chunks_touch_starts_in_the_second() {
        let fetched = Fetched {
            parts: vec![
                (10, Bytes::from_static(b"abcd")),
                (14, Bytes::from_static(b"efg")),
            ],
            size: 100,
        };
        assert_eq!(&fetched.get_bytes(12, 2).unwrap()[..], b"cd");
        assert_eq!(&fetched.get_bytes(14, 0).unwrap()[..], b"");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut fetched.get_read(14).unwrap(), &mut rest).unwrap();
        assert_eq!(rest, "efg");
        let e = fetched.get_bytes(12, 4).unwrap_err().to_string();
        assert!(e.contains("bytes from 12 asked for lie outside"), "{e}");
        assert!(fetched.get_read(17).is_err() && fetched.get_bytes(9, 1).is_err());
    }
}
