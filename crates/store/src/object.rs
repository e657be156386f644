//! Objects as sources: an `.npy` object or a raw record object, read by ranged GETs; an
//! object of a format that reads by ranges (a table), read through [`ObjectBytes`]; and the
//! dataset of all of them that carries the client's counters.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use pinfeed_source::formats::ranges::check_range;
use pinfeed_source::formats::{self, ByteRanges, Format, OpenRanges, SNIFF_BYTES};
use pinfeed_source::npy::{Header, MAX_HEADER_LEN};
use pinfeed_source::{
    check_request, gather_runs, gather_runs_at, Layout, NetworkStats, ReadOptions, Result, Source,
    SourceError,
};

use crate::client::{Client, Object};
use crate::fetch::{parts_of, Part};

/// Bytes fetched first for a `.npy` header: numpy writes headers of 128 bytes or a few
/// hundred; a longer one costs a second request.
const HEAD_BYTES: u64 = 4096;

/// Records of one object, record `i` at byte `data_offset + i * record_bytes`.
#[derive(Debug)]
pub(crate) struct ObjectRecords {
    client: Arc<Client>,
    object: Object,
    layout: Layout,
    num_records: u64,
    data_offset: u64,
}

/// Opens `object`: `.npy` (by its name or its magic) or raw records of `raw_layout` as
/// [`ObjectRecords`]; a format that reads by ranges (a table, by its name or its first bytes)
/// through [`ObjectBytes`], its ranges coalesced across at most `ranges_gap` bytes; any other
/// format is refused by name. Says too whether a format read it by ranges.
pub(crate) fn open_object(
    client: Arc<Client>,
    object: Object,
    raw_layout: Option<&Layout>,
    read: &ReadOptions,
    ranges_gap: u64,
) -> Result<(Box<dyn Source>, bool)> {
    let url = object.url.clone();
    let path = Path::new(&url);
    let by_name = formats::by_extension(path);
    let by_ranges = |format: &dyn Format, client: Arc<Client>, object: Object| {
        read.format.check_for(format, path)?;
        let bytes = Arc::new(ObjectBytes {
            client,
            object,
            gap: ranges_gap,
        });
        let source = format.open_ranges(OpenRanges {
            bytes,
            options: read,
        })?;
        Ok((source, true))
    };
    // A table is not asked for its first bytes: they are a column's, perhaps not one asked for.
    if let Some(format) = by_name.filter(|f| !matches!(f.name(), "npy" | "raw")) {
        return by_ranges(format, client, object);
    }
    let head = client.fetch_vec(&object, 0..object.size.min(HEAD_BYTES))?;
    let format =
        by_name.unwrap_or_else(|| formats::claim(path, &head[..head.len().min(SNIFF_BYTES)]));
    if !matches!(format.name(), "npy" | "raw") {
        return by_ranges(format, client, object);
    }
    read.format.check_for(format, path)?;
    let (layout, num_records, data_offset) = match format.name() {
        "npy" => npy_layout(&client, &object, head)?,
        _ => raw_layout_of(&object, raw_layout)?,
    };
    if num_records == 0 {
        return Err(SourceError::Empty { name: object.url });
    }
    let records = ObjectRecords {
        client,
        object,
        layout,
        num_records,
        data_offset,
    };
    Ok((Box::new(records), false))
}

/// An object read by ranges, for formats that read parts of it ([`Format::open_ranges`]).
#[derive(Debug)]
pub(crate) struct ObjectBytes {
    client: Arc<Client>,
    object: Object,
    /// Ranges at most this far apart are fetched as one request.
    gap: u64,
}

impl ByteRanges for ObjectBytes {
    fn name(&self) -> &str {
        &self.object.url
    }

    fn size(&self) -> u64 {
        self.object.size
    }

    fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        for r in ranges {
            check_range(&self.object.url, self.object.size, r)?;
        }
        let mut buffers: Vec<Vec<u8>> = ranges
            .iter()
            .map(|r| vec![0u8; (r.end - r.start) as usize])
            .collect();
        let parts = ranges
            .iter()
            .zip(buffers.iter_mut())
            .map(|(r, dst)| Part {
                offset: r.start,
                dst,
            })
            .collect();
        self.client.fetch_with_gap(&self.object, parts, self.gap)?;
        Ok(buffers)
    }
}

/// The layout, record count and data offset of an `.npy` object from the first bytes fetched
/// (`head`), fetching the rest of a long header first; the size is checked as for a file.
fn npy_layout(client: &Client, object: &Object, head: Vec<u8>) -> Result<(Layout, u64, u64)> {
    let path = Path::new(&object.url);
    let header = match Header::parse(&head, path) {
        Err(_) if (head.len() as u64) < object.size => {
            // The preamble says how long the header is: version, then a 2- or 4-byte length.
            let len_bytes = if head.get(6) == Some(&1) { 2 } else { 4 };
            let mut len = [0u8; 4];
            len[..len_bytes]
                .copy_from_slice(head.get(8..8 + len_bytes).unwrap_or(&[0; 4][..len_bytes]));
            let end = (8 + len_bytes as u64 + u32::from_le_bytes(len) as u64)
                .min(MAX_HEADER_LEN + 12)
                .min(object.size);
            Header::parse(&client.fetch_vec(object, 0..end)?, path)?
        }
        parsed => parsed?,
    };
    let found = object.size.saturating_sub(header.data_offset);
    if header.data_offset > object.size || found != header.data_bytes() {
        return Err(SourceError::DataSize {
            path: path.to_path_buf(),
            data_offset: header.data_offset,
            expected: header.data_bytes(),
            found,
        });
    }
    Ok((header.layout()?, header.num_records(), header.data_offset))
}

/// The layout and record count of a raw record object: whole records of the layout given.
fn raw_layout_of(object: &Object, layout: Option<&Layout>) -> Result<(Layout, u64, u64)> {
    let Some(layout) = layout else {
        return Err(SourceError::NotNpy {
            path: Path::new(&object.url).to_path_buf(),
        });
    };
    let record_bytes = layout.record_bytes() as u64;
    if object.size % record_bytes != 0 {
        return Err(SourceError::RecordSize {
            name: object.url.clone(),
            size: object.size,
            record_bytes: layout.record_bytes(),
            trailing: object.size % record_bytes,
        });
    }
    Ok((layout.clone(), object.size / record_bytes, 0))
}

impl Source for ObjectRecords {
    fn name(&self) -> &str {
        &self.object.url
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.num_records
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        check_request(self, first, dst.len())?;
        let offset = self.data_offset + first * self.layout.record_bytes() as u64;
        self.client.fetch(&self.object, vec![Part { offset, dst }])
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        let runs = gather_runs(self, self.data_offset, indices, dst.len())?;
        self.client.fetch(&self.object, parts_of(&runs, dst))
    }

    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        let runs = gather_runs_at(self, self.data_offset, records, dst.len())?;
        self.client.fetch(&self.object, parts_of(&runs, dst))
    }
}

/// A dataset in object storage: one object or several as shards, and the client that reads
/// them, whose counters [`Source::network`] reports.
#[derive(Debug)]
pub struct RemoteDataset {
    inner: Box<dyn Source>,
    client: Arc<Client>,
    description: String,
}

impl RemoteDataset {
    /// `inner` read through `client` from the store `base`; `by_ranges` when a format read its
    /// objects by ranges (tables), whose own description is then said too.
    pub(crate) fn new(
        inner: Box<dyn Source>,
        client: Arc<Client>,
        base: &str,
        by_ranges: bool,
    ) -> RemoteDataset {
        let mut description = client.describe(base);
        if by_ranges {
            description = format!("{description}; {}", inner.reader_description());
        }
        RemoteDataset {
            inner,
            client,
            description,
        }
    }
}

impl Source for RemoteDataset {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn layout(&self) -> &Layout {
        self.inner.layout()
    }

    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        self.inner.read_records(first, dst)
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        self.inner.gather(indices, dst)
    }

    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        self.inner.gather_at(records, dst)
    }

    fn reader_description(&self) -> String {
        self.description.clone()
    }

    fn natural_block(&self) -> Option<u64> {
        self.inner.natural_block()
    }

    fn document_lengths(&self) -> Option<Vec<u64>> {
        self.inner.document_lengths()
    }

    fn chunk_lengths(&self) -> Option<Vec<u64>> {
        self.inner.chunk_lengths()
    }

    fn chunk_decodes(&self) -> Option<u64> {
        self.inner.chunk_decodes()
    }

    fn columns(&self) -> Option<&[pinfeed_source::table::Column]> {
        self.inner.columns()
    }

    fn network(&self) -> Option<NetworkStats> {
        Some(self.client.stats())
    }
}
