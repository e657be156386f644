//! Arrow IPC files and streams (`*.arrow`, `*.feather`; the Hugging Face `datasets` cache is
//! the stream format): the columns asked for are decoded at open, batch by batch, and each
//! record batch is a chunk. Both are read by ranges ([`ByteRanges`]), locally or from object
//! storage alike. Of a file, the footer's tail, the footer (the schema and where each record
//! batch lies), each batch's metadata (where its buffers lie), and then only the buffers of
//! the columns asked for; a stream, which has no index, is read whole.

use std::io::Cursor;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::reader::{FileDecoder, StreamReader};
use arrow_ipc::{Block, MetadataVersion};
use arrow_schema::{DataType, Field, Schema, UnionMode};

use super::columns::{pack, table_error, Column};
use super::{columns_option, Chunks, TableSource};
use crate::formats::{ByteRanges, FileRanges, Format, OpenFile, OpenRanges};
use crate::{ReadOptions, Result, Source};

/// Arrow IPC, file (`ARROW1` magic) or stream format; options `columns`.
#[derive(Debug)]
pub(crate) struct Arrow;

impl Format for Arrow {
    fn name(&self) -> &'static str {
        "arrow"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["arrow", "feather", "ipc", "arrows"]
    }

    fn option_keys(&self) -> &'static [&'static str] {
        super::OPTION_KEYS
    }

    fn sniff(&self, head: &[u8]) -> bool {
        head.starts_with(b"ARROW1")
    }

    fn open(&self, open: OpenFile<'_>) -> Result<Box<dyn Source>> {
        let bytes = Arc::new(FileRanges::new(open.file, open.path, open.size));
        Ok(Box::new(open_ipc(bytes, open.options)?))
    }

    fn open_ranges(&self, open: OpenRanges<'_>) -> Result<Box<dyn Source>> {
        Ok(Box::new(open_ipc(open.bytes, open.options)?))
    }
}

/// The indices in `schema` of the columns `wanted` (all when `None`), in the order wanted; a
/// missing one is an error naming the columns there are.
pub(crate) fn resolve(
    name: &str,
    schema: &Schema,
    wanted: Option<&[String]>,
) -> Result<Vec<usize>> {
    let Some(wanted) = wanted else {
        return Ok((0..schema.fields().len()).collect());
    };
    wanted
        .iter()
        .map(|w| {
            schema.index_of(w).map_err(|_| {
                let names: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| format!("{:?}", f.name()))
                    .collect();
                table_error(
                    name,
                    format!("no column {w:?}; the columns are {}", names.join(", ")),
                )
            })
        })
        .collect()
}

/// An IPC file's magic, at its start and its end.
const MAGIC: &[u8; 6] = b"ARROW1";

/// Opens an IPC file or stream's columns (all when none are asked for) as records: a file
/// when it ends with the magic (its footer's tail), else a stream.
fn open_ipc(bytes: Arc<dyn ByteRanges>, options: &ReadOptions) -> Result<TableSource> {
    let name = bytes.name().to_owned();
    let size = bytes.size();
    let tail = bytes.read_range(size.saturating_sub(10)..size)?;
    let (kind, schema, batches) = match tail.strip_suffix(MAGIC) {
        Some(len) if len.len() == 4 => {
            let footer_len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as u64;
            let file = IpcFile::open(&*bytes, footer_len)?;
            ("file", file.schema.clone(), Batches::File(file))
        }
        _ => {
            let whole = bytes.read_range(0..size)?;
            if whole.starts_with(MAGIC) {
                return Err(table_error(
                    &name,
                    "not a readable Arrow IPC file: it starts with the file magic but does not \
                     end with its footer (cut short?)"
                        .into(),
                ));
            }
            let schema = stream(&name, &whole, None)?.schema();
            ("stream", schema, Batches::Stream(whole))
        }
    };
    let wanted = columns_option(&options.format)?;
    let indices = resolve(&name, &schema, wanted.as_deref())?;
    let fields: Vec<_> = indices.iter().map(|&i| schema.field(i)).collect();
    let (layout, columns) = super::layout_for(&options.format, &name, &fields, &*bytes)?;
    let decoded = match batches {
        Batches::File(file) => file.decode(&*bytes, &indices)?,
        Batches::Stream(whole) => stream(&name, &whole, Some(indices.clone()))?
            .enumerate()
            .map(|(i, b)| {
                b.map_err(|e| table_error(&format!("{name}, record batch {i}"), cannot_decode(&e)))
            })
            .collect::<Result<_>>()?,
    };
    // Nulls are refused now: the batches are in memory already.
    if !columns[0].tokens {
        for (i, batch) in decoded.iter().enumerate() {
            super::columns::check_nulls(batch, &columns, &format!("{name}, record batch {i}"))?;
        }
    }
    let chunks = InMemory::new(name.clone(), decoded);
    TableSource::new(
        name,
        layout,
        columns,
        Box::new(chunks),
        format!("arrow {kind}, decoded at open"),
    )
}

fn cannot_decode(e: &dyn std::fmt::Display) -> String {
    format!("cannot decode: {e}")
}

/// The record batches of a file (by its footer) or of a stream (its bytes).
enum Batches {
    File(IpcFile),
    Stream(Vec<u8>),
}

/// A reader of the IPC stream `whole`, decoding the columns of `projection`.
fn stream<'a>(
    name: &str,
    whole: &'a [u8],
    projection: Option<Vec<usize>>,
) -> Result<StreamReader<Cursor<&'a [u8]>>> {
    StreamReader::try_new(Cursor::new(whole), projection)
        .map_err(|e| table_error(name, format!("not a readable Arrow IPC stream: {e}")))
}

/// An IPC file's footer: its schema, and where its record batches lie.
struct IpcFile {
    name: String,
    size: u64,
    schema: Arc<Schema>,
    version: MetadataVersion,
    blocks: Vec<Block>,
}

impl IpcFile {
    /// Reads the footer of `footer_len` bytes before the file's 10-byte tail.
    fn open(bytes: &dyn ByteRanges, footer_len: u64) -> Result<IpcFile> {
        let name = bytes.name().to_owned();
        let corrupt = |e: &dyn std::fmt::Display| {
            table_error(&name, format!("not a readable Arrow IPC file: {e}"))
        };
        let size = bytes.size();
        if footer_len + 10 + MAGIC.len() as u64 > size {
            return Err(corrupt(&format!(
                "the footer says it is {footer_len} bytes, more than the file holds"
            )));
        }
        let footer = bytes.read_range(size - 10 - footer_len..size - 10)?;
        let footer = arrow_ipc::root_as_footer(&footer).map_err(|e| corrupt(&e))?;
        let Some(ipc_schema) = footer.schema() else {
            return Err(corrupt(&"the footer holds no schema"));
        };
        if !ipc_schema.endianness().equals_to_target_endianness() {
            return Err(corrupt(&"written on a machine of the other byte order"));
        }
        let schema = Arc::new(arrow_ipc::convert::fb_to_schema(ipc_schema));
        let blocks: Vec<Block> = footer
            .recordBatches()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default();
        for (i, b) in blocks.iter().enumerate() {
            let end = (b.offset() as u64)
                .checked_add(b.metaDataLength() as u64)
                .and_then(|e| e.checked_add(b.bodyLength() as u64));
            let sane = b.offset() >= 0 && b.metaDataLength() >= 8 && b.bodyLength() >= 0;
            if !sane || end.is_none_or(|e| e > size) {
                return Err(table_error(
                    &format!("{name}, record batch {i}"),
                    format!(
                        "the footer puts it at bytes {}.., {} + {} long, outside the file ({size} \
                         bytes)",
                        b.offset(),
                        b.metaDataLength(),
                        b.bodyLength()
                    ),
                ));
            }
        }
        Ok(IpcFile {
            name,
            size,
            schema,
            version: footer.version(),
            blocks,
        })
    }

    /// Every record batch's columns `indices`: the batches' metadata read together, then the
    /// buffers of those columns of every batch together.
    fn decode(self, bytes: &dyn ByteRanges, indices: &[usize]) -> Result<Vec<RecordBatch>> {
        let meta_ranges: Vec<Range<u64>> = self
            .blocks
            .iter()
            .map(|b| b.offset() as u64..(b.offset() + b.metaDataLength() as i64) as u64)
            .collect();
        let metas = bytes.read_ranges(&meta_ranges)?;
        let mut wanted: Vec<Vec<Range<u64>>> = Vec::with_capacity(metas.len());
        for (i, (block, meta)) in self.blocks.iter().zip(&metas).enumerate() {
            let at = format!("{}, record batch {i}", self.name);
            let body = block.offset() as u64 + block.metaDataLength() as u64;
            let relative = column_ranges(&self.schema, self.version, meta, indices)
                .map_err(|e| table_error(&at, cannot_decode(&e)))?
                .unwrap_or_else(|| std::iter::once(0..block.bodyLength() as u64).collect());
            let ranges: Vec<Range<u64>> = relative
                .into_iter()
                .map(|r| body + r.start..body + r.end)
                .collect();
            if let Some(r) = ranges
                .iter()
                .find(|r| r.end > body + block.bodyLength() as u64 || r.end > self.size)
            {
                return Err(table_error(
                    &at,
                    format!(
                        "its metadata puts a buffer at bytes {}..{}, past its body",
                        r.start, r.end
                    ),
                ));
            }
            wanted.push(ranges);
        }
        let all: Vec<Range<u64>> = wanted.iter().flatten().cloned().collect();
        let mut fetched = bytes.read_ranges(&all)?.into_iter();
        let decoder =
            FileDecoder::new(self.schema.clone(), self.version).with_projection(indices.to_vec());
        let mut batches = Vec::with_capacity(self.blocks.len());
        for (i, ((block, meta), ranges)) in self.blocks.iter().zip(metas).zip(wanted).enumerate() {
            // The batch as the decoder reads it: its metadata, then its body with only the
            // buffers of the columns asked for in place (the rest, never read, zero).
            let start = block.offset() as u64;
            let len = meta.len() + block.bodyLength() as usize;
            let mut buf = MutableBuffer::from_len_zeroed(len);
            buf[..meta.len()].copy_from_slice(&meta);
            for (r, data) in ranges.iter().zip(fetched.by_ref()) {
                let from = (r.start - start) as usize;
                buf[from..from + data.len()].copy_from_slice(&data);
            }
            let buf: Buffer = buf.into();
            let at = || format!("{}, record batch {i}", self.name);
            let batch = decoder
                .read_record_batch(block, &buf)
                .map_err(|e| table_error(&at(), cannot_decode(&e)))?
                .ok_or_else(|| table_error(&at(), "not a record batch".into()))?;
            batches.push(batch);
        }
        Ok(batches)
    }
}

/// The byte ranges, in a record batch's body, of the buffers of the top-level columns
/// `indices`, from the batch's metadata `meta` (its message, after the continuation marker and
/// length); `None` when a column before or among them has a type whose buffers this does not
/// count (then the whole body is read).
fn column_ranges(
    schema: &Schema,
    version: MetadataVersion,
    meta: &[u8],
    indices: &[usize],
) -> std::result::Result<Option<Vec<Range<u64>>>, String> {
    let message = match meta.get(..4) {
        Some([0xff, 0xff, 0xff, 0xff]) => meta.get(8..),
        _ => meta.get(4..),
    }
    .ok_or("its metadata is cut short")?;
    let message = arrow_ipc::root_as_message(message).map_err(|e| format!("its metadata: {e}"))?;
    let batch = message
        .header_as_record_batch()
        .ok_or("its metadata is not a record batch's")?;
    let buffers: Vec<(u64, u64)> = batch
        .buffers()
        .map(|b| {
            b.iter()
                .map(|b| (b.offset().max(0) as u64, b.length().max(0) as u64))
                .collect()
        })
        .unwrap_or_default();
    let mut variadic = batch
        .variadicBufferCounts()
        .map(|v| v.iter().collect::<Vec<i64>>())
        .unwrap_or_default()
        .into_iter();
    let last = indices.iter().copied().max().unwrap_or(0);
    let mut first = 0usize;
    let mut spans = Vec::with_capacity(last + 1);
    for field in schema.fields().iter().take(last + 1) {
        let Some(n) = buffer_count(field, version, &mut variadic) else {
            return Ok(None);
        };
        spans.push(first..first + n);
        first += n;
    }
    if first > buffers.len() {
        return Err(format!(
            "its metadata lists {} buffers where its columns need at least {first}",
            buffers.len()
        ));
    }
    let ranges = indices
        .iter()
        .filter_map(|&i| {
            let own = buffers[spans[i].clone()].iter().filter(|b| b.1 > 0);
            let start = own.clone().map(|b| b.0).min()?;
            let end = own.map(|b| b.0 + b.1).max()?;
            Some(start..end)
        })
        .collect();
    Ok(Some(ranges))
}

/// Buffers of a column of `field`'s type in a record batch, its children's included, in the
/// order arrow's IPC reader walks them; `variadic` gives view columns' counts in turn. `None`
/// for a type this does not count.
fn buffer_count(
    field: &Field,
    version: MetadataVersion,
    variadic: &mut impl Iterator<Item = i64>,
) -> Option<usize> {
    let mut children = |fields: &mut dyn Iterator<Item = &Field>| -> Option<usize> {
        let mut n = 0;
        for f in fields {
            n += buffer_count(f, version, variadic)?;
        }
        Some(n)
    };
    Some(match field.data_type() {
        DataType::Null => 0,
        DataType::Utf8 | DataType::Binary | DataType::LargeBinary | DataType::LargeUtf8 => 3,
        DataType::Utf8View | DataType::BinaryView => 2 + usize::try_from(variadic.next()?).ok()?,
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => {
            2 + children(&mut std::iter::once(f.as_ref()))?
        }
        DataType::ListView(f) | DataType::LargeListView(f) => {
            3 + children(&mut std::iter::once(f.as_ref()))?
        }
        DataType::FixedSizeList(f, _) => 1 + children(&mut std::iter::once(f.as_ref()))?,
        DataType::Struct(fs) => 1 + children(&mut fs.iter().map(|f| f.as_ref()))?,
        DataType::RunEndEncoded(a, b) => children(&mut [a.as_ref(), b.as_ref()].into_iter())?,
        DataType::Union(fs, mode) => {
            let nulls = usize::from(version < MetadataVersion::V5);
            let offsets = usize::from(*mode == UnionMode::Dense);
            nulls + 1 + offsets + children(&mut fs.iter().map(|(_, f)| f.as_ref()))?
        }
        DataType::Dictionary(_, _) | DataType::FixedSizeBinary(_) => 2,
        t if t.is_primitive() || *t == DataType::Boolean => 2,
        _ => return None,
    })
}

/// Record batches in memory.
#[derive(Debug)]
pub(crate) struct InMemory {
    name: String,
    batches: Vec<RecordBatch>,
    rows: Vec<u64>,
}

impl InMemory {
    fn at(&self, i: usize) -> String {
        format!("{}, record batch {i}", self.name)
    }
}

impl Chunks for InMemory {
    fn rows(&self) -> &[u64] {
        &self.rows
    }

    fn pack(
        &self,
        i: usize,
        columns: &[Column],
        record_bytes: usize,
        documents: Option<&mut Vec<u64>>,
    ) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.batches[i].num_rows() * record_bytes);
        pack(
            &self.batches[i],
            columns,
            record_bytes,
            &self.at(i),
            &mut out,
            documents,
        )?;
        Ok(out)
    }
}

impl InMemory {
    /// Batches already in memory (parsed JSON lines), named `name`.
    pub(crate) fn new(name: String, batches: Vec<RecordBatch>) -> InMemory {
        let rows = batches.iter().map(|b| b.num_rows() as u64).collect();
        InMemory {
            name,
            batches,
            rows,
        }
    }
}
