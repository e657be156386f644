//! Arrow IPC files and streams (`*.arrow`, `*.feather`; the Hugging Face `datasets` cache is
//! the stream format): the columns asked for are decoded at open, batch by batch, and each
//! record batch is a chunk.

use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_schema::Schema;

use super::columns::{pack, table_error, Column};
use super::{columns_option, Chunks, TableSource};
use crate::formats::{Format, OpenFile};
use crate::{escape_path, Result, Source};

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
        Ok(Box::new(open_ipc(&open)?))
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

/// Opens an IPC file or stream's columns (all when none are asked for) as records.
fn open_ipc(open: &OpenFile<'_>) -> Result<TableSource> {
    let name = escape_path(open.path);
    let mut head = [0u8; 6];
    let is_file = open.size >= 6
        && crate::read::read_exact_at(&open.file, open.path, 0, &mut head).is_ok()
        && &head == b"ARROW1";
    let kind = if is_file { "file" } else { "stream" };
    let wanted = columns_option(open)?;
    // The schema first, then the batches with only the wanted columns decoded.
    let schema = reader(open, &name, is_file, None)?.schema();
    let indices = resolve(&name, &schema, wanted.as_deref())?;
    let fields: Vec<_> = indices.iter().map(|&i| schema.field(i)).collect();
    let (layout, columns) = super::layout_for(open, &name, &fields)?;
    let mut batches = Vec::new();
    for (i, batch) in reader(open, &name, is_file, Some(indices))?.enumerate() {
        let at = format!("{name}, record batch {i}");
        let batch = batch.map_err(|e| table_error(&at, format!("cannot decode: {e}")))?;
        // Nulls are refused now: the batches are in memory already.
        if !columns[0].tokens {
            super::columns::check_nulls(&batch, &columns, &at)?;
        }
        batches.push(batch);
    }
    let chunks = InMemory::new(name.clone(), batches);
    TableSource::new(
        name,
        layout,
        columns,
        Box::new(chunks),
        format!("arrow {kind}, decoded at open"),
    )
}

/// A reader of the IPC file or stream, decoding the columns of `projection`.
fn reader(
    open: &OpenFile<'_>,
    name: &str,
    is_file: bool,
    projection: Option<Vec<usize>>,
) -> Result<Box<dyn arrow_array::RecordBatchReader>> {
    let kind = if is_file { "file" } else { "stream" };
    let corrupt = |e: &dyn std::fmt::Display| {
        table_error(name, format!("not a readable Arrow IPC {kind}: {e}"))
    };
    let mut file: File = open.file.try_clone().map_err(|e| corrupt(&e))?;
    file.seek(SeekFrom::Start(0)).map_err(|e| corrupt(&e))?;
    let file = BufReader::new(file);
    Ok(if is_file {
        Box::new(FileReader::try_new(file, projection).map_err(|e| corrupt(&e))?)
    } else {
        Box::new(StreamReader::try_new(file, projection).map_err(|e| corrupt(&e))?)
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
