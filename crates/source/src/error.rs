//! The one error type of this crate.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

/// A path as errors print it: lossy UTF-8 with control characters escaped (`\u{1b}`, `\n`),
/// so that a file name cannot drive the terminal or forge a line of output. Every error of
/// pinfeed that prints a path goes through here.
pub fn escape_path(path: &Path) -> String {
    escape_text(&path.to_string_lossy())
}

/// A name that is not a path (a tar member's, an object key) as errors print it, escaped as
/// [`escape_path`] escapes paths.
pub fn escape_text(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Everything that can go wrong while opening, reading or writing a dataset.
///
/// Every message names the file (or "host buffer"), and where it applies the byte offset,
/// what was expected and what was found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The file is missing, unreadable, a directory or not a regular file.
    #[error("cannot open {}: {source}", crate::escape_path(.path))]
    Open {
        /// The path as given.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A read failed with an error other than reaching the end of the file.
    #[error("cannot read {len} bytes at offset {offset} of {}: {source}", crate::escape_path(.path))]
    Read {
        /// The file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// How many bytes were asked for.
        len: usize,
        /// What the operating system said.
        source: io::Error,
    },
    /// The file ended before the bytes its size (checked at open) promised.
    #[error(
        "{}: expected {expected} bytes at offset {offset} but the file ended after {found} \
         (file shrank while streaming?)",
        crate::escape_path(.path)
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// Bytes asked for.
        expected: u64,
        /// Bytes that were there.
        found: u64,
    },
    /// The file does not start with a well-formed `.npy` header.
    #[error("{}: malformed .npy header at byte {offset}: expected {expected}, found {found}", crate::escape_path(.path))]
    Header {
        /// The file.
        path: PathBuf,
        /// Byte offset in the file where parsing failed.
        offset: u64,
        /// What the parser wanted there.
        expected: String,
        /// What it saw.
        found: String,
    },
    /// The `.npy` file stores its array in Fortran (column-major) order.
    #[error(
        "{}: Fortran order is not supported; save with np.ascontiguousarray",
        crate::escape_path(.path)
    )]
    FortranOrder {
        /// The file.
        path: PathBuf,
    },
    /// A dtype that cannot be streamed as plain bytes, or a dtype string that is not understood.
    #[error("{}dtype {descr}: {reason}", loc(.path.as_deref()))]
    DType {
        /// The file whose header holds the dtype; `None` for a string given directly.
        path: Option<PathBuf>,
        /// The dtype as given.
        descr: String,
        /// Why it was rejected, and what is accepted.
        reason: String,
    },
    /// The array shape in a `.npy` header is unusable.
    #[error("{}: shape {shape:?} (dtype {descr}): {reason}", crate::escape_path(.path))]
    Shape {
        /// The file.
        path: PathBuf,
        /// The shape from the header.
        shape: Vec<u64>,
        /// The dtype from the header.
        descr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A record layout whose size is zero or does not fit in memory.
    #[error("{}record layout dtype {dtype} with shape {shape:?}: {reason}", loc(.path.as_deref()))]
    Layout {
        /// The file the layout came from, if any.
        path: Option<PathBuf>,
        /// The element dtype.
        dtype: String,
        /// The per-record shape.
        shape: Vec<u64>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The data after a `.npy` header is shorter or longer than the header promises.
    #[error(
        "{}: header promises {expected} bytes of data from offset {data_offset} but the file holds {found}: {}",
        crate::escape_path(.path),
        if .found < .expected { "the file is truncated" } else { "extra bytes after the array data" }
    )]
    DataSize {
        /// The file.
        path: PathBuf,
        /// Where the data starts.
        data_offset: u64,
        /// Bytes of data the header promises.
        expected: u64,
        /// Bytes of data in the file.
        found: u64,
    },
    /// A raw record file or host buffer whose size is not a whole number of records.
    #[error(
        "{name}: size {size} bytes is not a multiple of the record size {record_bytes} bytes \
         ({trailing} trailing bytes); check the record dtype and shape"
    )]
    RecordSize {
        /// The file path or "host buffer".
        name: String,
        /// Bytes in the file or buffer.
        size: u64,
        /// Bytes in one record.
        record_bytes: usize,
        /// `size % record_bytes`.
        trailing: u64,
    },
    /// The dataset holds no records.
    #[error("{name}: dataset is empty (0 records)")]
    Empty {
        /// The file path or "host buffer".
        name: String,
    },
    /// A file that is not `.npy` was opened without a record layout.
    #[error(
        "{}: not a .npy file; give the record dtype and shape for a raw record file",
        crate::escape_path(.path)
    )]
    NotNpy {
        /// The file.
        path: PathBuf,
    },
    /// Records were asked for past the end of the dataset.
    #[error(
        "{name}: records {first}..{first}+{count} are out of range: expected indices below {num_records}"
    )]
    OutOfRange {
        /// The file path or "host buffer".
        name: String,
        /// First record asked for.
        first: u64,
        /// Records asked for.
        count: u64,
        /// Records in the dataset.
        num_records: u64,
    },
    /// The destination buffer does not have the size the request needs.
    #[error("{name}: destination buffer of {len} bytes: expected {expected}")]
    Destination {
        /// The file path or "host buffer".
        name: String,
        /// Length of the buffer given.
        len: usize,
        /// What length was needed.
        expected: String,
    },
    /// Writing a `.npy` file failed.
    #[error("cannot write {} at offset {offset}: {source}", crate::escape_path(.path))]
    Write {
        /// The file.
        path: PathBuf,
        /// Bytes written before the failure.
        offset: u64,
        /// What the operating system said.
        source: io::Error,
    },
    /// A `.npy` writer was given more or fewer data bytes than its header promises.
    #[error(
        "{}: header promises {expected} bytes of data but {found} {}",
        crate::escape_path(.path),
        if .found > .expected { "were offered" } else { "were written before finish" }
    )]
    WriteCount {
        /// The file.
        path: PathBuf,
        /// Bytes the header promises.
        expected: u64,
        /// Bytes written (or offered).
        found: u64,
    },
    /// Read options that cannot work: a zero read size or queue depth, an unknown read mode, a
    /// tensor name for a dataset without `.safetensors` files.
    #[error("read options: {reason}")]
    Options {
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// The tensor asked for is not in a `.safetensors` file, or none was named and the file
    /// holds several.
    #[error("{}: {}", crate::escape_path(.path), tensor_message(.wanted.as_deref(), .available))]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The name asked for; `None` when none was given.
        wanted: Option<String>,
        /// The tensors in the file, sorted by name.
        available: Vec<String>,
    },
    /// A `.safetensors` header that is malformed or inconsistent with itself or the file.
    #[error("{}: malformed .safetensors header at byte {offset}: {reason}", crate::escape_path(.path))]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// Byte offset in the file of the problem (the header's JSON starts at 8).
        offset: u64,
        /// What is wrong: what was expected and what was found.
        reason: String,
    },
    /// Two shards of one dataset whose records differ.
    #[error(
        "{dataset}: shards must share one record layout: {first} holds {first_layout} but {other} holds {other_layout}"
    )]
    ShardLayout {
        /// The directory or pattern.
        dataset: String,
        /// The first shard.
        first: String,
        /// Its layout, as "dtype uint8, record shape [3, 31, 31]".
        first_layout: String,
        /// The shard that differs.
        other: String,
        /// Its layout.
        other_layout: String,
    },
    /// A directory or pattern that names no dataset file.
    #[error("{dataset}: {reason}")]
    NoShards {
        /// The directory or pattern.
        dataset: String,
        /// What was looked for.
        reason: String,
    },
    /// A token dataset (a token file, a Megatron `.bin`/`.idx` pair, or a directory or pattern
    /// of token files) that cannot be used as asked.
    #[error("{name}: {reason}")]
    Tokens {
        /// The file, pair or pattern.
        name: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// A mixture of sources that cannot be made as asked (its weights, policies or sources).
    #[error("mixture: {reason}")]
    Mixture {
        /// What is wrong, naming the source.
        reason: String,
    },
    /// An image that cannot be decoded as asked: not a JPEG or PNG, truncated, corrupt, or
    /// larger than the pixel limit. `name` is the file, or `shard.tar:member` for a sample
    /// of a tar shard.
    #[error("{name}: {reason}")]
    Image {
        /// The file or tar member.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An image dataset (an ImageFolder tree or WebDataset tar shards) that cannot be used: no
    /// classes, an empty class folder, a tar sample without its label.
    #[error("{name}: {reason}")]
    ImageDataset {
        /// The folder, shard or sample.
        name: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// A table (a Parquet, Arrow IPC or JSON-lines file) that cannot be read as asked: a
    /// missing column, a type that is not a record's, a null, a corrupt footer or page, a
    /// malformed line. `name` is the file, with the row group, record batch or line.
    #[error("{name}: {reason}")]
    Table {
        /// The file, and where in it (`data.parquet, row group 3`, `data.jsonl:17`).
        name: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// A raw token file was opened without its token type (a `.npy` or a Megatron index says
    /// its own; a raw file cannot).
    #[error(
        "{}: a raw token file needs its token dtype (uint16 for nanoGPT's train.bin)",
        crate::escape_path(.path)
    )]
    TokenDtypeMissing {
        /// The file.
        path: PathBuf,
    },
}

fn tensor_message(wanted: Option<&str>, available: &[String]) -> String {
    let names = available
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    match (wanted, available.is_empty()) {
        (_, true) => "the file holds no tensors".to_owned(),
        (Some(w), false) => format!("no tensor named {w:?}; the file holds {names}"),
        (None, false) => {
            format!("the file holds several tensors ({names}); name one with the tensor option")
        }
    }
}

/// `"path: "` or nothing, to prefix messages whose path is optional.
fn loc(path: Option<&Path>) -> String {
    let mut s = String::new();
    if let Some(p) = path {
        let _ = write!(s, "{}: ", crate::escape_path(p));
    }
    s
}

impl SourceError {
    /// Fills in the path of errors that can arise without one (dtype and layout checks).
    pub(crate) fn with_path(mut self, file: &Path) -> SourceError {
        match &mut self {
            SourceError::DType { path, .. } | SourceError::Layout { path, .. }
                if path.is_none() =>
            {
                *path = Some(file.to_path_buf());
            }
            _ => {}
        }
        self
    }
}
