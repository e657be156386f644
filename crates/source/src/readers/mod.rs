//! How file-backed sources read their records: one module per way of reading, each a
//! [`FileReader`].
//!
//! Every file source keeps its ordinary descriptor (for the header and for
//! [`Source::read_records`](crate::Source::read_records)) and a [`FileReader`] chosen by the
//! user's [`Reader`]:
//!
//! - [`pread`]: `pread` through the page cache ([`Reader::Pread`], and [`Reader::Register`],
//!   whose data the loader copies from a registered mapping instead); [`pread::Fallback`] wraps
//!   whatever a refused reader fell back to, with the reason.
//! - [`mapped`]: ranges of records by `pread`; gathers (shuffled batches) by `memcpy` out of a
//!   read-only mapping of the file, made at the first gather and shared by every thread
//!   ([`Reader::Mmap`]). Where the file cannot be mapped it gathers with `pread` and says so.
//! - [`direct`]: the file opened a second time with `O_DIRECT`; aligned spans are read
//!   straight into the caller's aligned buffer and the records are found inside at an offset
//!   ([`Source::read_records_aligned`](crate::Source::read_records_aligned)). A file system that
//!   refuses `O_DIRECT` (tmpfs, some overlays) falls back to `pread`, and the reader says so.
//! - [`uring`]: the read is cut into `read_size` pieces submitted together on an io_uring, at
//!   most `queue_depth` in flight. Aligned reads go through the `O_DIRECT` descriptor when the
//!   file system allows it (what a queue depth is for: the page cache already reads ahead for
//!   buffered reads), plain reads through the ordinary one. Where `io_uring_setup` is refused
//!   (containers: `EPERM`, old kernels: `ENOSYS`) it falls back and says so.
//! - [`auto`]: [`Reader::Auto`] resolved for one path into one of the above, with the reason.

use std::fmt;
use std::fs::File;
use std::path::Path;

use crate::read::read_exact_at;
use crate::{FormatOptions, Result, SourceError};

mod aligned;
pub(crate) mod auto;
pub(crate) mod direct;
pub(crate) mod mapped;
pub(crate) mod pread;
pub(crate) mod uring;

pub use aligned::AlignedBuffer;
pub use auto::resolve_auto;
pub use mapped::GatherRun;
use pread::{Fallback, Pread};

/// Default [`ReadOptions::read_size`]: 1 MiB.
///
/// Large enough that the cost of one request (a system call or a submission-queue entry, a few
/// microseconds) is small beside moving its bytes (about 0.7 ms at 1.5 GB/s), and that a
/// request is one or two block-layer requests on common devices (`max_sectors_kb` is usually
/// 512 KiB to 1 MiB); small enough that one batch of a few MiB becomes several pieces the
/// device can serve in parallel. A multiple of every `O_DIRECT` alignment in use.
pub const DEFAULT_READ_SIZE: usize = 1 << 20;

/// Default [`ReadOptions::queue_depth`]: 32 pieces in flight, enough to keep an NVMe device or a
/// virtual disk busy from one thread.
pub const DEFAULT_QUEUE_DEPTH: u32 = 32;

/// The smallest alignment used for `O_DIRECT`: the page size, which is also at least the logical
/// block size of every common device.
pub const DIRECT_ALIGN: usize = 4096;

/// Largest accepted [`ReadOptions::read_size`]: one io_uring read carries a 32-bit length, and
/// Linux moves at most about 2 GiB in one read anyway.
const MAX_READ_SIZE: usize = 1 << 30;

/// Largest accepted [`ReadOptions::queue_depth`]; io_uring itself allows 32768 entries.
const MAX_QUEUE_DEPTH: u32 = 4096;

/// How records are read: the one reader type of pinfeed, parsed from the user's string by
/// [`FromStr`](std::str::FromStr) (case-insensitive; `buffered`, `o_direct`, `io_uring` and
/// `io-uring` are accepted aliases) and printed by `Display` as its name in [`Reader::NAMES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Reader {
    /// Picked per path by [`resolve_auto`]: the mapped gather for files mostly page-cached or
    /// that fit in memory, `O_DIRECT` for cold files larger than half the memory available,
    /// `pread` for anything that is not one regular file. The loader treats it as `Pread`:
    /// threads copying a page-cached file into slots outrun `Register`, which the driver's
    /// registration rate bounds.
    #[default]
    Auto,
    /// `pread` through the page cache.
    Pread,
    /// `pread` for ranges of records; gathers copy records out of a read-only mapping of the
    /// file with `memcpy`, one system call a batch instead of one a record. `pread` where the
    /// file cannot be mapped.
    Mmap,
    /// `O_DIRECT` reads of aligned spans, bypassing the page cache; `pread` where the file
    /// system refuses `O_DIRECT`.
    Direct,
    /// io_uring with [`ReadOptions::queue_depth`] pieces of [`ReadOptions::read_size`] in
    /// flight, through `O_DIRECT` for aligned reads where the file system allows it; `pread`
    /// where io_uring is refused.
    Uring,
    /// The loader copies straight from a registered read-only mapping of the file (its
    /// `register` module); the source itself reads with `pread`.
    Register,
}

impl Reader {
    /// Every reader's name, as `Display` prints it and `FromStr` accepts it.
    pub const NAMES: [&'static str; 6] = ["auto", "pread", "mmap", "direct", "uring", "register"];

    /// The reader a source uses for `path`, and why when it was picked rather than asked for:
    /// [`Reader::Auto`] resolved by [`resolve_auto`]; any other reader as it is, with no reason.
    pub fn resolve(self, path: &Path) -> (Reader, Option<String>) {
        match self {
            Reader::Auto => {
                let (reader, why) = resolve_auto(path);
                (reader, Some(why))
            }
            other => (other, None),
        }
    }
}

/// A reader name that is not one of [`Reader::NAMES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown reader {name:?}: expected auto, pread, mmap, direct, uring or register")]
pub struct UnknownReader {
    /// The name given.
    pub name: String,
}

impl From<UnknownReader> for SourceError {
    fn from(e: UnknownReader) -> SourceError {
        SourceError::Options {
            reason: e.to_string(),
        }
    }
}

impl std::str::FromStr for Reader {
    type Err = UnknownReader;

    fn from_str(s: &str) -> std::result::Result<Reader, UnknownReader> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Reader::Auto),
            "pread" | "buffered" => Ok(Reader::Pread),
            "mmap" => Ok(Reader::Mmap),
            "direct" | "o_direct" => Ok(Reader::Direct),
            "uring" | "io_uring" | "io-uring" => Ok(Reader::Uring),
            "register" => Ok(Reader::Register),
            _ => Err(UnknownReader { name: s.to_owned() }),
        }
    }
}

impl fmt::Display for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reader::Auto => "auto",
            Reader::Pread => "pread",
            Reader::Mmap => "mmap",
            Reader::Direct => "direct",
            Reader::Uring => "uring",
            Reader::Register => "register",
        })
    }
}

/// How [`open_with`](crate::open_with) opens and reads a dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// How record data is read; [`Reader::Auto`] is resolved once for the path opened.
    pub reader: Reader,
    /// Bytes in one io_uring read ([`DEFAULT_READ_SIZE`] says why 1 MiB); rounded up to the
    /// `O_DIRECT` alignment for direct reads. Between 1 byte and 1 GiB.
    pub read_size: usize,
    /// io_uring reads in flight at once per reading thread, 1 to 4096.
    pub queue_depth: u32,
    /// Options of the source formats (`tensor=NAME` for `.safetensors` files), each checked
    /// by the format that takes it.
    pub format: FormatOptions,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            reader: Reader::Pread,
            read_size: DEFAULT_READ_SIZE,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            format: FormatOptions::default(),
        }
    }
}

impl ReadOptions {
    /// Checks the read size and queue depth.
    pub fn check(&self) -> Result<()> {
        if self.read_size == 0 || self.read_size > MAX_READ_SIZE {
            return Err(SourceError::Options {
                reason: format!(
                    "read size {} bytes: expected 1 byte to {MAX_READ_SIZE} bytes",
                    self.read_size
                ),
            });
        }
        if self.queue_depth == 0 || self.queue_depth > MAX_QUEUE_DEPTH {
            return Err(SourceError::Options {
                reason: format!(
                    "queue depth {}: expected 1 to {MAX_QUEUE_DEPTH}",
                    self.queue_depth
                ),
            });
        }
        Ok(())
    }
}

/// How one open file's record bytes are read: one implementation per way of reading. `file`
/// is the ordinary descriptor the source opened at `path`.
pub(crate) trait FileReader: Send + Sync + fmt::Debug {
    /// How it reads, for statistics: `"pread"`, `"mmap gather, pread ranges"`, `"O_DIRECT"`,
    /// `"io_uring (depth 32)"`, or a fallback with its reason.
    fn describe(&self) -> String;

    /// The alignment `read_aligned` needs of the buffer's address and length.
    fn alignment(&self) -> usize {
        1
    }

    /// Fills `dst` from byte `offset` of `file`.
    fn read(&self, file: &File, path: &Path, offset: u64, dst: &mut [u8]) -> Result<()> {
        read_exact_at(file, path, offset, dst)
    }

    /// Reads the bytes `offset .. offset + len` of `file` into `buf` and returns where in `buf`
    /// they start: 0 unless the reader reads aligned spans. The caller has checked that `buf`
    /// is aligned to `alignment()` and long enough for the span (`len + 2 * align` suffices).
    fn read_aligned(
        &self,
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.read(file, path, offset, &mut buf[..len])?;
        Ok(0)
    }

    /// Reads runs of records into `dst`, each to its place. `data` is the file's record bytes.
    /// The runs' destinations lie inside `dst`, in increasing order, without overlapping.
    fn gather(
        &self,
        file: &File,
        path: &Path,
        data: std::ops::Range<u64>,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        let _ = data;
        pread::pread_runs(file, path, runs, dst)
    }
}

/// The reader for `file` (opened from `path`) that `options` ask for, falling back to `pread`
/// (or, for io_uring, to `O_DIRECT`) where the system refuses what was asked, and saying so.
pub(crate) fn for_file(
    file: &File,
    path: &Path,
    options: &ReadOptions,
) -> Result<Box<dyn FileReader>> {
    options.check()?;
    Ok(match options.reader.resolve(path).0 {
        Reader::Auto | Reader::Pread | Reader::Register => Box::new(Pread),
        Reader::Mmap => Box::new(mapped::Mapped::default()),
        Reader::Direct => match direct::Direct::open(file, path) {
            Ok(direct) => Box::new(direct),
            Err(e) => Box::new(Fallback::new(Pread, format!("O_DIRECT refused: {e}"))),
        },
        Reader::Uring => {
            // Optional: buffered io_uring reads are still io_uring reads.
            let direct = direct::Direct::open(file, path).ok();
            match uring::probe(file, options.queue_depth) {
                Ok(()) => Box::new(uring::Uring::new(
                    direct,
                    options.read_size,
                    options.queue_depth,
                )),
                Err(e) => {
                    let why = format!("io_uring refused: {e}");
                    match direct {
                        Some(direct) => Box::new(Fallback::new(direct, why)),
                        None => Box::new(Fallback::new(Pread, why)),
                    }
                }
            }
        }
    })
}

/// The reader of a source before [`for_file`]: `pread`.
pub(crate) fn pread() -> Box<dyn FileReader> {
    Box::new(Pread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_parse_and_print() {
        for (s, r) in [
            ("auto", Reader::Auto),
            ("pread", Reader::Pread),
            ("buffered", Reader::Pread),
            ("mmap", Reader::Mmap),
            ("Direct", Reader::Direct),
            ("o_direct", Reader::Direct),
            ("io_uring", Reader::Uring),
            ("io-uring", Reader::Uring),
            ("REGISTER", Reader::Register),
        ] {
            let parsed: Reader = s.parse().unwrap();
            assert_eq!(parsed, r);
            assert_eq!(parsed.to_string().parse::<Reader>().unwrap(), r);
            assert!(Reader::NAMES.contains(&parsed.to_string().as_str()));
        }
        assert_eq!("MMAP".parse::<Reader>().unwrap(), Reader::Mmap);
        let e = "telepathy".parse::<Reader>().unwrap_err();
        assert_eq!(e.name, "telepathy");
        assert!(
            e.to_string()
                .contains("auto, pread, mmap, direct, uring or register"),
            "{e}"
        );
    }

    #[test]
    fn options_are_checked() {
        assert!(ReadOptions::default().check().is_ok());
        let bad = |read_size, queue_depth| ReadOptions {
            read_size,
            queue_depth,
            ..ReadOptions::default()
        };
        assert!(bad(0, 32).check().is_err());
        assert!(bad(2 << 30, 32).check().is_err());
        let e = bad(4096, 0).check().unwrap_err().to_string();
        assert!(e.contains("queue depth 0"), "{e}");
    }

    #[test]
    fn readers_describe_themselves_and_their_fallbacks() {
        assert_eq!(pread().describe(), "pread");
        assert_eq!(pread().alignment(), 1);
        let eperm = std::io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            Fallback::new(Pread, format!("io_uring refused: {eperm}")).describe(),
            format!("pread (io_uring refused: {eperm})")
        );
        assert_eq!(
            Fallback::new(Pread, "O_DIRECT refused: x".into()).describe(),
            "pread (O_DIRECT refused: x)"
        );
        assert_eq!(
            uring::Uring::new(None, 1 << 20, 8).describe(),
            "io_uring (depth 8)"
        );
    }

    #[test]
    fn refused_o_direct_falls_back_to_pread() {
        // /proc files refuse O_DIRECT opens or reads on every kernel.
        let path = Path::new("/proc/self/stat");
        let file = File::open(path).unwrap();
        let options = ReadOptions {
            reader: Reader::Direct,
            ..ReadOptions::default()
        };
        let reader = for_file(&file, path, &options).unwrap();
        assert!(
            reader.describe().starts_with("pread (O_DIRECT refused: "),
            "{}",
            reader.describe()
        );
        assert_eq!(reader.alignment(), 1);
    }
}
