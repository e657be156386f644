//! Parquet files: each row group a chunk, only the columns asked for read and decoded.

use std::fs::File;

use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::{ChunkReader, Length};

use super::columns::{pack, table_error, Column};
use super::{columns_option, Chunks, TableSource};
use crate::formats::{Format, OpenFile};
use crate::{escape_path, Result, Source};

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
        Ok(Box::new(open_parquet(&open)?))
    }
}

/// Opens a Parquet file's columns (all when none are asked for) as records.
pub(crate) fn open_parquet(open: &OpenFile<'_>) -> Result<TableSource> {
    let name = escape_path(open.path);
    let file = open
        .file
        .try_clone()
        .map_err(|e| table_error(&name, format!("cannot reopen: {e}")))?;
    let file = PreadFile(std::sync::Arc::new(file));
    let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
        .map_err(|e| table_error(&name, format!("not a readable Parquet file: {e}")))?;
    let schema = metadata.schema().clone();
    let wanted = columns_option(open)?;
    let indices = super::ipc::resolve(&name, &schema, wanted.as_deref())?;
    let fields: Vec<_> = indices.iter().map(|&i| schema.field(i)).collect();
    let (layout, columns) = super::layout_for(open, &name, &fields)?;
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
    let rows = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .collect();
    let mask = ProjectionMask::roots(metadata.parquet_schema(), indices.iter().copied());
    let chunks = RowGroups {
        name: name.clone(),
        file,
        metadata,
        mask,
        rows,
    };
    TableSource::new(
        name,
        layout,
        columns,
        Box::new(chunks),
        "parquet row groups".into(),
    )
}

/// A Parquet file's row groups.
struct RowGroups {
    name: String,
    file: PreadFile,
    metadata: ArrowReaderMetadata,
    mask: ProjectionMask,
    rows: Vec<u64>,
}

impl std::fmt::Debug for RowGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroups")
            .field("name", &self.name)
            .field("rows", &self.rows)
            .finish()
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
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.file.clone(),
            self.metadata.clone(),
        )
        .with_projection(self.mask.clone())
        .with_row_groups(vec![i])
        .with_batch_size(batch_rows(columns, record_bytes, self.rows[i]))
        .build()
        .map_err(|e| fail(&e))?;
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
        let tokens = columns.first().is_some_and(|c| c.tokens);
        if !tokens && out.len() != self.rows[i] as usize * record_bytes {
            return Err(table_error(
                &at,
                format!(
                    "decoded {} rows where the footer says {}",
                    out.len() / record_bytes,
                    self.rows[i]
                ),
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

/// The file read with positioned reads: a `File` as parquet's `ChunkReader` seeks one offset
/// shared by every clone, which reader threads decoding row groups at once would race on.
#[derive(Clone, Debug)]
struct PreadFile(std::sync::Arc<File>);

/// A reader from an offset of a [`PreadFile`], by positioned reads.
struct PreadAt {
    file: std::sync::Arc<File>,
    at: u64,
}

impl std::io::Read for PreadAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(&*self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl Length for PreadFile {
    fn len(&self) -> u64 {
        self.0.metadata().map(|m| m.len()).unwrap_or(0)
    }
}

impl ChunkReader for PreadFile {
    type T = PreadAt;

    fn get_read(&self, start: u64) -> parquet::errors::Result<PreadAt> {
        Ok(PreadAt {
            file: self.0.clone(),
            at: start,
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        let mut buf = vec![0u8; length];
        std::os::unix::fs::FileExt::read_exact_at(&*self.0, &mut buf, start)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
        Ok(buf.into())
    }
}
