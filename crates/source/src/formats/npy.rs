//! The `.npy` format: header parsing, header writing, [`NpyFile`] and [`NpyWriter`].
//!
//! A `.npy` file is the magic `\x93NUMPY`, a version, a header length, a Python dict literal
//! (`{'descr': '<f4', 'fortran_order': False, 'shape': (3, 7), }`) padded so that the data
//! begins 64-byte aligned, and then the array's bytes in C order.

use std::borrow::Borrow;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::dtype::DType;
use crate::literal::{self, Node, Value};
use crate::read::{open_regular, read_exact_at};
use crate::records::{delegate_source_to_records, FileRecords};
use crate::ReadOptions;
use crate::{Layout, Result, SourceError};

/// The first six bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Headers longer than this are refused before anything is allocated for them; numpy's own
/// reader refuses anything over 10 000 bytes by default.
pub const MAX_HEADER_LEN: u64 = 16 << 20;

/// Room numpy leaves after the header dict so the first axis can grow in place.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// Data starts at a multiple of this many bytes from the start of the file.
const ARRAY_ALIGN: usize = 64;

/// A parsed `.npy` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version: (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    /// The element dtype.
    pub descr: DType,
    /// Always `false`: Fortran-order files are rejected while parsing.
    pub fortran_order: bool,
    /// The full array shape; the first axis indexes records. Never empty, and the data size
    /// (product of the shape times the itemsize) fits in `u64`.
    pub shape: Vec<u64>,
    /// Offset of the first data byte from the start of the file.
    pub data_offset: u64,
}

/// Where the header text lies, from the fixed-size preamble.
struct Preamble {
    version: (u8, u8),
    header_start: u64,
    header_len: u64,
}

fn header_err(
    path: &Path,
    offset: u64,
    expected: impl Into<String>,
    found: impl Into<String>,
) -> SourceError {
    SourceError::Header {
        path: path.to_path_buf(),
        offset,
        expected: expected.into(),
        found: found.into(),
    }
}

/// `true` when `bytes` starts with the `.npy` magic.
pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Reads the magic, version and header length from the first (up to) 12 bytes.
fn preamble(bytes: &[u8], path: &Path) -> Result<Preamble> {
    if !has_magic(bytes) {
        let found = bytes.get(..6).unwrap_or(bytes);
        let found = if found.is_empty() {
            "an empty file".to_owned()
        } else {
            format!("\"{}\"", found.escape_ascii())
        };
        return Err(header_err(path, 0, "the .npy magic \"\\x93NUMPY\"", found));
    }
    let (Some(&major), Some(&minor)) = (bytes.get(6), bytes.get(7)) else {
        return Err(header_err(
            path,
            bytes.len() as u64,
            "the format version (2 bytes)",
            "end of file",
        ));
    };
    let len_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => {
            return Err(header_err(
                path,
                6,
                "format version 1.0, 2.0 or 3.0",
                format!("{major}.{minor}"),
            ))
        }
    };
    let Some(len_field) = bytes.get(8..8 + len_bytes) else {
        return Err(header_err(
            path,
            8,
            format!("a {len_bytes}-byte header length"),
            "end of file",
        ));
    };
    let header_len = len_field
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    if header_len > MAX_HEADER_LEN {
        return Err(header_err(
            path,
            8,
            format!("a header length of at most {MAX_HEADER_LEN} bytes"),
            format!("{header_len} bytes"),
        ));
    }
    Ok(Preamble {
        version: (major, minor),
        header_start: 8 + len_bytes as u64,
        header_len,
    })
}

impl Header {
    /// Parses a header from the start of a file's bytes; `bytes` must hold at least the whole
    /// header (data after it is ignored). `path` is only used in error messages.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Header> {
        let pre = preamble(bytes, path)?;
        let end = pre.header_start + pre.header_len;
        let Some(text) = usize::try_from(end)
            .ok()
            .and_then(|end| bytes.get(pre.header_start as usize..end))
        else {
            return Err(header_err(
                path,
                bytes.len() as u64,
                format!(
                    "a header of {} bytes ending at offset {end}",
                    pre.header_len
                ),
                format!("only {} bytes", bytes.len()),
            ));
        };
        Header::parse_text(text, &pre, path)
    }

    /// Reads and parses a header from the start of a stream, leaving it at the first data byte.
    pub fn read_from(reader: &mut impl Read, path: &Path) -> Result<Header> {
        let mut buf = Vec::with_capacity(12);
        let mut pre = None;
        for want in [8usize, 10, 12] {
            let have = buf.len();
            buf.resize(want, 0);
            read_fully(reader, &mut buf[have..], have as u64, path)?;
            match preamble(&buf, path) {
                Ok(p) => {
                    pre = Some(p);
                    break;
                }
                Err(SourceError::Header { ref found, .. }) if found == "end of file" => continue,
                Err(e) => return Err(e),
            }
        }
        let Some(pre) = pre else {
            return Err(header_err(path, 0, "a .npy preamble", "an unreadable one"));
        };
        buf.truncate(pre.header_start as usize);
        let mut text = vec![0u8; pre.header_len as usize];
        read_fully(reader, &mut text, pre.header_start, path)?;
        Header::parse_text(&text, &pre, path)
    }

    fn parse_text(raw: &[u8], pre: &Preamble, path: &Path) -> Result<Header> {
        let start = pre.header_start;
        let utf8 = pre.version.0 >= 3;
        let text = decode_text(raw, start, utf8, path)?;
        // Offsets inside `text` are UTF-8 byte offsets; in a latin-1 file one char is one byte.
        let at = |i: usize| -> u64 {
            let n = if utf8 {
                i
            } else {
                text.get(..i).map_or(i, |t| t.chars().count())
            };
            start + n as u64
        };
        let root =
            literal::parse(&text).map_err(|e| header_err(path, at(e.at), e.expected, e.found))?;
        let Value::Dict(items) = &root.value else {
            return Err(header_err(path, at(root.at), "a dict", root.value.kind()));
        };
        let [descr_node, fortran_node, shape_node] = header_keys(items, &root, path, &at)?;

        let descr = DType::from_node(descr_node).map_err(|e| e.with_path(path))?;
        let fortran_order = match fortran_node.value {
            Value::Bool(false) => false,
            Value::Bool(true) => {
                return Err(SourceError::FortranOrder {
                    path: path.to_path_buf(),
                })
            }
            ref other => {
                return Err(header_err(
                    path,
                    at(fortran_node.at),
                    "True or False",
                    other.kind(),
                ))
            }
        };
        let Value::Tuple(dims) = &shape_node.value else {
            return Err(header_err(
                path,
                at(shape_node.at),
                "a tuple of integers",
                shape_node.value.kind(),
            ));
        };
        let shape = dimensions(dims, path, &at)?;
        let shape_err = |reason| SourceError::Shape {
            path: path.to_path_buf(),
            shape: shape.clone(),
            descr: descr.descr.clone(),
            reason,
        };
        if shape.is_empty() {
            return Err(shape_err(
                "a 0-d (scalar) array holds no records; save an array whose first axis indexes the records",
            ));
        }
        if data_bytes(&descr, &shape).is_none() {
            return Err(shape_err("the data size overflows 64 bits"));
        }
        Ok(Header {
            version: pre.version,
            descr,
            fortran_order,
            shape,
            data_offset: start + pre.header_len,
        })
    }

    /// Records in the file: the first axis.
    pub fn num_records(&self) -> u64 {
        self.shape[0]
    }

    /// Bytes of array data the header promises.
    pub fn data_bytes(&self) -> u64 {
        // Checked when the header was parsed.
        data_bytes(&self.descr, &self.shape).unwrap_or(u64::MAX)
    }

    /// The record layout: the dtype and the shape without its first axis.
    pub fn layout(&self) -> Result<Layout> {
        Layout::new(self.descr.clone(), self.shape[1..].to_vec())
    }
}

fn data_bytes(descr: &DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(descr.itemsize as u64, |acc, &d| acc.checked_mul(d))
}

fn read_fully(reader: &mut impl Read, buf: &mut [u8], offset: u64, path: &Path) -> Result<()> {
    reader.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            header_err(
                path,
                offset,
                format!("{} more header bytes", buf.len()),
                "end of file",
            )
        } else {
            SourceError::Read {
                path: path.to_path_buf(),
                offset,
                len: buf.len(),
                source: e,
            }
        }
    })
}

/// A numpy-compatible header for `num_records` records of `layout`, byte for byte what numpy
/// 2.x writes: version 1.0 if its length fits in 16 bits, else 2.0 (3.0 when the descr has
/// characters outside latin-1), padded with spaces and a final `'\n'` so that the data starts
/// 64-byte aligned.
pub fn header_bytes(layout: &Layout, num_records: u64) -> Vec<u8> {
    let mut shape = format!("({num_records}");
    for d in &layout.shape {
        shape.push_str(&format!(", {d}"));
    }
    shape.push_str(if layout.shape.is_empty() { ",)" } else { ")" });
    let mut dict = format!(
        "{{'descr': {}, 'fortran_order': False, 'shape': {shape}, }}",
        layout.dtype.descr
    );
    let digits = num_records.to_string().len();
    dict.extend(std::iter::repeat_n(
        ' ',
        GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits),
    ));

    let latin1: Option<Vec<u8>> = dict
        .chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect();
    let wrap = |text: &[u8], version: u8, len_bytes: usize| -> Option<Vec<u8>> {
        let hlen = text.len() + 1;
        let padlen = ARRAY_ALIGN - (MAGIC.len() + 2 + len_bytes + hlen) % ARRAY_ALIGN;
        let total = hlen + padlen;
        let mut out = Vec::with_capacity(MAGIC.len() + 2 + len_bytes + total);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[version, 0]);
        if len_bytes == 2 {
            out.extend_from_slice(&u16::try_from(total).ok()?.to_le_bytes());
        } else {
            out.extend_from_slice(&u32::try_from(total).ok()?.to_le_bytes());
        }
        out.extend_from_slice(text);
        out.extend(std::iter::repeat_n(b' ', padlen));
        out.push(b'\n');
        Some(out)
    };
    let out = match &latin1 {
        Some(text) => wrap(text, 1, 2).or_else(|| wrap(text, 2, 4)),
        None => wrap(dict.as_bytes(), 3, 4),
    };
    // Only a descr of more than 4 GiB could fail both; no dtype that large can be built.
    out.unwrap_or_default()
}

/// A `.npy` file opened for reading records.
#[derive(Debug)]
pub struct NpyFile {
    records: FileRecords,
    header: Header,
}

impl NpyFile {
    /// Opens a `.npy` file and checks its header against its size.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyFile> {
        let path = path.as_ref();
        let (file, size) = open_regular(path)?;
        NpyFile::from_file(file, path, size)
    }

    pub(crate) fn from_file(file: File, path: &Path, size: u64) -> Result<NpyFile> {
        let mut pre = [0u8; 12];
        let n = size.min(12) as usize;
        read_exact_at(&file, path, 0, &mut pre[..n])?;
        let p = preamble(&pre[..n], path)?;
        let end = p.header_start + p.header_len;
        if end > size {
            return Err(header_err(
                path,
                8,
                format!("a header of {} bytes ending at offset {end}", p.header_len),
                format!("a file of {size} bytes"),
            ));
        }
        // `end` is at most 12 + MAX_HEADER_LEN.
        let mut buf = vec![0u8; end as usize];
        read_exact_at(&file, path, 0, &mut buf)?;
        let header = Header::parse(&buf, path)?;
        let layout = header.layout().map_err(|e| e.with_path(path))?;
        let name = crate::escape_path(path);
        if header.num_records() == 0 {
            return Err(SourceError::Empty { name });
        }
        let found = size - header.data_offset;
        if found != header.data_bytes() {
            return Err(SourceError::DataSize {
                path: path.to_path_buf(),
                data_offset: header.data_offset,
                expected: header.data_bytes(),
                found,
            });
        }
        Ok(NpyFile {
            records: FileRecords::new(file, path, layout, header.num_records(), header.data_offset),
            header,
        })
    }

    /// Opens a `.npy` file to be read as `options` ask (`options.tensor` is ignored).
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<NpyFile> {
        let mut npy = NpyFile::open(path)?;
        npy.set_reader(options)?;
        Ok(npy)
    }

    pub(crate) fn set_reader(&mut self, options: &ReadOptions) -> Result<()> {
        self.records.set_reader(options)
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.records.path
    }
}

delegate_source_to_records!(NpyFile);

/// Writes a `.npy` file of a known number of records, streaming the data through a large buffer.
///
/// Dropping a writer without [`finish`](NpyWriter::finish) leaves a file whose data may be
/// short; `finish` is where a wrong byte count is reported.
#[derive(Debug)]
pub struct NpyWriter {
    out: BufWriter<File>,
    path: PathBuf,
    /// Data bytes the header promises.
    expected: u64,
    /// Data bytes accepted so far; never more than `expected`.
    written: u64,
    header_len: u64,
}

/// Big enough that a writer makes few system calls while `pinfeed gen` writes gigabytes.
const WRITE_BUFFER: usize = 8 << 20;

impl NpyWriter {
    /// Creates (or truncates) `path` and writes the header for `num_records` records of `layout`.
    pub fn create(
        path: impl AsRef<Path>,
        layout: impl Borrow<Layout>,
        num_records: u64,
    ) -> Result<NpyWriter> {
        let path = path.as_ref();
        let layout = layout.borrow();
        let layout = Layout::new(layout.dtype.clone(), layout.shape.clone())
            .map_err(|e| e.with_path(path))?;
        if num_records == 0 {
            return Err(SourceError::Empty {
                name: crate::escape_path(path),
            });
        }
        let Some(expected) = num_records.checked_mul(layout.record_bytes() as u64) else {
            let mut shape = vec![num_records];
            shape.extend(&layout.shape);
            return Err(SourceError::Shape {
                path: path.to_path_buf(),
                shape,
                descr: layout.dtype.descr.clone(),
                reason: "the data size overflows 64 bits",
            });
        };
        let header = header_bytes(&layout, num_records);
        let file = create_regular(path, header.len() as u64 + expected)?;
        let mut w = NpyWriter {
            out: BufWriter::with_capacity(WRITE_BUFFER, file),
            path: path.to_path_buf(),
            expected,
            written: 0,
            header_len: header.len() as u64,
        };
        w.out
            .write_all(&header)
            .map_err(|source| SourceError::Write {
                path: w.path.clone(),
                offset: 0,
                source,
            })?;
        Ok(w)
    }

    /// Appends data bytes; more than the header promises in total is an error and writes nothing.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let total = self.written.saturating_add(bytes.len() as u64);
        if total > self.expected {
            return Err(SourceError::WriteCount {
                path: self.path.clone(),
                expected: self.expected,
                found: total,
            });
        }
        self.out
            .write_all(bytes)
            .map_err(|source| SourceError::Write {
                path: self.path.clone(),
                offset: self.header_len + self.written,
                source,
            })?;
        self.written = total;
        Ok(())
    }

    /// Checks that exactly the promised bytes were written and flushes them to the file.
    pub fn finish(mut self) -> Result<()> {
        if self.written != self.expected {
            return Err(SourceError::WriteCount {
                path: self.path.clone(),
                expected: self.expected,
                found: self.written,
            });
        }
        let offset = self.header_len + self.written;
        self.out.flush().map_err(|source| SourceError::Write {
            path: self.path.clone(),
            offset,
            source,
        })
    }
}

/// Creates (or truncates) the regular file `path` for a file of `bytes` bytes, refusing before
/// anything is written a path that is not a regular file (opening a FIFO for writing blocks
/// until a reader comes) and a file system without room for it (the blocks of a file it
/// replaces count as room).
fn create_regular(path: &Path, bytes: u64) -> Result<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let open_err = |source| SourceError::Open {
        path: path.to_path_buf(),
        source,
    };
    let not_regular = |meta: &std::fs::Metadata| {
        if meta.is_dir() {
            Some(std::io::Error::from_raw_os_error(libc::EISDIR))
        } else {
            (!meta.is_file()).then(|| std::io::Error::other("not a regular file"))
        }
    };
    // Follows links, as the open does: `pinfeed gen --force` writes through one.
    let (room_of, replaced) = match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(e) = not_regular(&meta) {
                return Err(open_err(e));
            }
            (path, meta.blocks().saturating_mul(512))
        }
        Err(_) => match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => (dir, 0),
            _ => (Path::new("."), 0),
        },
    };
    if let Some(free) = crate::system::free_bytes(room_of) {
        let room = free.saturating_add(replaced);
        if bytes > room {
            return Err(SourceError::Write {
                path: path.to_path_buf(),
                offset: 0,
                source: std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!(
                        "the file needs {bytes} bytes ({:.1} GiB) and its file system has \
                         {room} free ({:.1} GiB); nothing was written",
                        bytes as f64 / f64::from(1 << 30),
                        room as f64 / f64::from(1 << 30)
                    ),
                ),
            });
        }
    }
    // O_NONBLOCK: were the path replaced by a FIFO after the check, the open fails instead of
    // waiting for a reader; on a regular file the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    match not_regular(&meta) {
        Some(e) => Err(open_err(e)),
        None => Ok(file),
    }
}

/// The `.npy` format: files named `*.npy` or starting with the `.npy` magic, whatever their
/// name (a file named `*.npy` without the magic is reported as a malformed header rather than
/// read as raw).
#[derive(Debug)]
pub struct Npy;

impl super::Format for Npy {
    fn name(&self) -> &'static str {
        "npy"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["npy"]
    }

    fn sniff(&self, head: &[u8]) -> bool {
        has_magic(head)
    }

    fn open(&self, open: super::OpenFile<'_>) -> Result<Box<dyn crate::Source>> {
        let mut npy = NpyFile::from_file(open.file, open.path, open.size)?;
        npy.set_reader(open.options)?;
        Ok(Box::new(npy))
    }
}

/// A header's text: UTF-8 from version 3.0, Latin-1 before; `start` is its offset in the file.
fn decode_text(raw: &[u8], start: u64, utf8: bool, path: &Path) -> Result<String> {
    Ok(if utf8 {
        match std::str::from_utf8(raw) {
            Ok(s) => s.to_owned(),
            Err(e) => {
                let bad = raw.get(e.valid_up_to()).copied().unwrap_or(0);
                return Err(header_err(
                    path,
                    start + e.valid_up_to() as u64,
                    "UTF-8 text (version 3.0 header)",
                    format!("byte 0x{bad:02x}"),
                ));
            }
        }
    } else {
        // Latin-1: every byte is the code point of the same value.
        raw.iter().map(|&b| char::from(b)).collect()
    })
}

/// The values of the header dict's three keys, `descr`, `fortran_order` and `shape`, each
/// present once and no other key; `at` maps a text offset to a file offset.
fn header_keys<'a>(
    items: &'a [(Node, Node)],
    root: &Node,
    path: &Path,
    at: &dyn Fn(usize) -> u64,
) -> Result<[&'a Node; 3]> {
    let (mut descr, mut fortran, mut shape): (Option<&Node>, Option<&Node>, Option<&Node>) =
        (None, None, None);
    for (key, value) in items {
        let slot = match &key.value {
            Value::Str(k) if k == "descr" => &mut descr,
            Value::Str(k) if k == "fortran_order" => &mut fortran,
            Value::Str(k) if k == "shape" => &mut shape,
            other => {
                let mut found = String::new();
                literal::repr(other, &mut found);
                return Err(header_err(
                    path,
                    at(key.at),
                    "only the keys 'descr', 'fortran_order' and 'shape'",
                    format!("key {found}"),
                ));
            }
        };
        if slot.is_some() {
            let mut found = String::new();
            literal::repr(&key.value, &mut found);
            return Err(header_err(
                path,
                at(key.at),
                "each key once",
                format!("a second {found}"),
            ));
        }
        *slot = Some(value);
    }
    let missing = |k: &str| {
        header_err(
            path,
            at(root.at),
            format!("the key '{k}'"),
            "a dict without it",
        )
    };
    let descr_node = descr.ok_or_else(|| missing("descr"))?;
    let fortran_node = fortran.ok_or_else(|| missing("fortran_order"))?;
    let shape_node = shape.ok_or_else(|| missing("shape"))?;

    Ok([descr_node, fortran_node, shape_node])
}

/// The shape tuple's dimensions, each an integer of 0 or more.
fn dimensions(dims: &[Node], path: &Path, at: &dyn Fn(usize) -> u64) -> Result<Vec<u64>> {
    let mut shape = Vec::with_capacity(dims.len());
    for d in dims {
        match d.value {
            Value::Int(n) => shape.push(n),
            Value::Neg(n) => {
                let found = format!("the negative dimension -{n}");
                return Err(header_err(
                    path,
                    at(d.at),
                    "a dimension of 0 or more",
                    &found,
                ));
            }
            ref other => return Err(header_err(path, at(d.at), "an integer", other.kind())),
        }
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("x.npy")
    }

    fn file_with(version: u8, text: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[version, 0]);
        if version == 1 {
            b.extend_from_slice(&(text.len() as u16).to_le_bytes());
        } else {
            b.extend_from_slice(&(text.len() as u32).to_le_bytes());
        }
        b.extend_from_slice(text);
        b
    }

    fn header_error(bytes: &[u8]) -> (u64, String, String) {
        match Header::parse(bytes, p()) {
            Err(SourceError::Header {
                offset,
                expected,
                found,
                path,
            }) => {
                assert_eq!(path, p());
                (offset, expected, found)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn written_header_parses_back() {
        for (descr, shape, n) in [
            ("'|u1'", vec![3, 31, 31], 1000u64),
            ("'<f4'", vec![], 5),
            (
                "[('a', '<f4'), ('', '|V4'), ('b', '|u1', (3,)), ('', '|V5')]",
                vec![2],
                u64::MAX / 64,
            ),
            ("[('é名', '<i4')]", vec![7], 3),
        ] {
            let layout =
                Layout::new(DType::from_descr_literal(descr).unwrap(), shape.clone()).unwrap();
            let bytes = header_bytes(&layout, n);
            assert_eq!(bytes.len() % 64, 0);
            assert_eq!(bytes.last(), Some(&b'\n'));
            let h = Header::parse(&bytes, p()).unwrap();
            assert_eq!(h.data_offset, bytes.len() as u64);
            assert_eq!(h.version, if descr.contains('é') { (3, 0) } else { (1, 0) });
            assert_eq!(h.descr, layout.dtype);
            assert_eq!(h.shape[0], n);
            assert_eq!(&h.shape[1..], &shape[..]);
            assert_eq!(h.layout().unwrap(), layout);
            let h2 = Header::read_from(&mut &bytes[..], p()).unwrap();
            assert_eq!(h2, h);
        }
    }

    #[test]
    fn big_headers_use_version_2() {
        let fields: Vec<String> = (0..3000).map(|i| format!("('field_{i}', '<f4')")).collect();
        let d = DType::from_descr_literal(&format!("[{}]", fields.join(", "))).unwrap();
        let bytes = header_bytes(&Layout::new(d, vec![]).unwrap(), 10);
        assert_eq!(&bytes[6..8], &[2, 0]);
        assert_eq!(bytes.len() % 64, 0);
        assert_eq!(Header::parse(&bytes, p()).unwrap().descr.itemsize, 12000);
    }

    #[test]
    fn preamble_errors() {
        assert_eq!(header_error(b"").0, 0);
        let (off, exp, found) = header_error(b"PK\x03\x04abcdefgh");
        assert_eq!(off, 0);
        assert!(exp.contains("magic"));
        assert!(found.contains("PK"));
        assert_eq!(header_error(b"\x93NUMPY\x01").0, 7);
        let (off, _, found) = header_error(b"\x93NUMPY\x04\x00\x00\x00");
        assert_eq!((off, found.as_str()), (6, "4.0"));
        assert_eq!(header_error(b"\x93NUMPY\x02\x00\x10").0, 8);
        let (off, exp, _) = header_error(b"\x93NUMPY\x02\x00\xff\xff\xff\xff");
        assert_eq!(off, 8);
        assert!(exp.contains("at most"));
        // Header length beyond the bytes given.
        let mut b = file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
        );
        b.truncate(30);
        assert!(header_error(&b).1.contains("ending at offset"));
        assert!(Header::read_from(&mut &b[..], p()).is_err());
    }

    #[test]
    fn dict_errors_carry_file_offsets() {
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}",
        ));
        assert_eq!(e.0, 10 + 56);
        assert!(e.2.contains("'x'"));
        let e = header_error(&file_with(1, b"{'descr': '<f4', 'fortran_order': False}"));
        assert_eq!((e.0, e.1.as_str()), (10, "the key 'shape'"));
        let e = header_error(&file_with(
            2,
            b"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
        ));
        assert_eq!(e.0, 12 + 17);
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}",
        ));
        assert_eq!((e.0, e.2.as_str()), (10 + 34, "an integer"));
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': [3]}",
        ));
        assert_eq!(e.0, 10 + 50);
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 'a')}",
        ));
        assert_eq!(e.0, 10 + 54);
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}",
        ));
        assert_eq!((e.0, e.2.as_str()), (10 + 54, "the negative dimension -3"));
        let e = header_error(&file_with(1, b"['descr']"));
        assert_eq!(e.1, "a dict");
        // Latin-1 byte 0xe9 is one byte in the file though two in the decoded text.
        let e = header_error(&file_with(1, b"{'\xe9': 1, 'x'"));
        assert_eq!(e.0, 10 + 12);
        // Truncated literal and huge numbers.
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,",
        ));
        assert_eq!(e.0, 10 + 53);
        let e = header_error(&file_with(
            1,
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
        ));
        assert_eq!(e.0, 10 + 51);
        assert!(e.1.contains("at most"));
    }

    #[test]
    fn version_3_must_be_utf8() {
        let e = header_error(&file_with(
            3,
            b"{'descr': [('\xff', '<f4')], 'fortran_order': False, 'shape': (3,)}",
        ));
        assert_eq!((e.0, e.2.as_str()), (12 + 13, "byte 0xff"));
        // The same bytes are fine as latin-1 in version 2.
        let h = Header::parse(
            &file_with(
                2,
                b"{'descr': [('\xff', '<f4')], 'fortran_order': False, 'shape': (3,)}",
            ),
            p(),
        )
        .unwrap();
        assert_eq!(h.descr.descr, "[('\u{ff}', '<f4')]");
    }

    #[test]
    fn semantic_errors() {
        let parse = |t: &[u8]| Header::parse(&file_with(1, t), p());
        assert!(matches!(
            parse(b"{'descr': '<f4', 'fortran_order': True, 'shape': (3,)}"),
            Err(SourceError::FortranOrder { .. })
        ));
        match parse(b"{'descr': '>f4', 'fortran_order': False, 'shape': (3,)}") {
            Err(e @ SourceError::DType { path: Some(_), .. }) => {
                assert!(e.to_string().starts_with("x.npy: dtype '>f4': big-endian"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(b"{'descr': '|O', 'fortran_order': False, 'shape': (3,)}"),
            Err(SourceError::DType { .. })
        ));
        assert!(matches!(
            parse(b"{'descr': '<f4', 'fortran_order': False, 'shape': ()}"),
            Err(SourceError::Shape { .. })
        ));
        match parse(b"{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 536870912)}") {
            Err(e @ SourceError::Shape { .. }) => assert!(e.to_string().contains("overflows")),
            other => panic!("{other:?}"),
        }
        // 2^32 * 2^29 * 8 = 2^64: one past the largest size; 2^63 is fine.
        assert!(parse(
            b"{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 268435456)}"
        )
        .is_ok());
        // Key order and whitespace do not matter; Python 2 longs are accepted.
        let h =
            parse(b"  {\"shape\": (3L, 2L), 'fortran_order': False, 'descr': u'<f4'}\n").unwrap();
        assert_eq!(h.shape, vec![3, 2]);
    }

    #[test]
    fn no_panic_on_mangled_headers() {
        let good = header_bytes(
            &Layout::new(
                DType::from_descr_literal("[('a', '<f4', (2,))]").unwrap(),
                vec![3],
            )
            .unwrap(),
            9,
        );
        for end in 0..good.len() {
            let _ = Header::parse(&good[..end], p());
            let _ = Header::read_from(&mut &good[..end], p());
        }
        for i in 0..good.len() {
            for b in [0u8, 0xff, b'\'', b'(', b')', b'[', b'9', b'\\', 3] {
                let mut m = good.clone();
                m[i] = b;
                let _ = Header::parse(&m, p());
            }
        }
    }
}
