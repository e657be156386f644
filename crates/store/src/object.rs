//! Objects as sources: an `.npy` object or a raw record object, read by ranged GETs, and the
//! dataset of all of them that carries the client's counters.

use std::path::Path;
use std::sync::Arc;

use pinfeed_source::formats::ALL;
use pinfeed_source::npy::{self, Header, MAX_HEADER_LEN};
use pinfeed_source::{
    check_request, gather_runs, gather_runs_at, Layout, NetworkStats, Result, Source, SourceError,
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

impl ObjectRecords {
    /// Opens `object` as `.npy` (by its name or its magic) or as raw records of
    /// `raw_layout`; other formats are refused by name.
    pub(crate) fn open(
        client: Arc<Client>,
        object: Object,
        raw_layout: Option<&Layout>,
    ) -> Result<ObjectRecords> {
        let path = Path::new(&object.url);
        let by_name = ALL
            .iter()
            .find(|f| f.extensions().iter().any(|e| has_extension(&object.url, e)))
            .map(|f| f.name());
        let head = client.fetch_vec(&object, 0..object.size.min(HEAD_BYTES))?;
        let (layout, num_records, data_offset) = match by_name {
            Some("npy") => npy_layout(&client, &object, head)?,
            None | Some("raw") if npy::has_magic(&head) => npy_layout(&client, &object, head)?,
            None | Some("raw") => raw_layout_of(&object, raw_layout)?,
            Some(other) => {
                return Err(SourceError::Open {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        format!(
                            "{other} files are not read from object storage yet; .npy and raw \
                             record files are"
                        ),
                    ),
                })
            }
        };
        if num_records == 0 {
            return Err(SourceError::Empty { name: object.url });
        }
        Ok(ObjectRecords {
            client,
            object,
            layout,
            num_records,
            data_offset,
        })
    }
}

fn has_extension(url: &str, ext: &str) -> bool {
    url.rsplit_once('.')
        .is_some_and(|(_, e)| e.eq_ignore_ascii_case(ext))
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
    pub(crate) fn new(inner: Box<dyn Source>, client: Arc<Client>, base: &str) -> RemoteDataset {
        let description = client.describe(base);
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

    fn network(&self) -> Option<NetworkStats> {
        Some(self.client.stats())
    }
}
