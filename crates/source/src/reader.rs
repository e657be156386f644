//! How file-backed sources read: buffered `pread`, a mapped gather, `O_DIRECT`, and io_uring.
//!
//! Every file source keeps its ordinary descriptor (for the header and for
//! [`Source::read_records`](crate::Source::read_records)) and a [`Reader`] that says how record
//! data is read:
//!
//! - [`ReadMode::Buffered`]: `pread` through the page cache.
//! - [`ReadMode::Mmap`]: ranges of records by `pread`; gathers (shuffled batches) by `memcpy`
//!   out of a read-only mapping of the file, made at the first gather and shared by every
//!   thread ([`crate::mapped`]). Where the file cannot be mapped it gathers with `pread` and
//!   says so.
//! - [`ReadMode::Direct`]: the file opened a second time with `O_DIRECT`; aligned spans are read
//!   straight into the caller's aligned buffer and the records are found inside at an offset
//!   ([`Source::read_records_aligned`](crate::Source::read_records_aligned)). A file system that
//!   refuses `O_DIRECT` (tmpfs, some overlays) falls back to `pread`, and the reader says so.
//! - [`ReadMode::Uring`]: the read is cut into `read_size` pieces submitted together on an
//!   io_uring, at most `queue_depth` in flight. Aligned reads go through the `O_DIRECT`
//!   descriptor when the file system allows it (what a queue depth is for: the page cache
//!   already reads ahead for buffered reads), plain reads through the ordinary one. Where
//!   `io_uring_setup` is refused (containers: `EPERM`, old kernels: `ENOSYS`) it falls back to
//!   `pread` and says so.
//!
//! Rings belong to threads (one ring per reading thread and queue depth, kept in a
//! thread-local and closed when the thread exits), so readers never contend for a ring and any
//! number of files share them.

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring};

use crate::mapped::{pread_runs, GatherRun, MappedFile};
use crate::read::read_exact_at;
use crate::{Result, SourceError};

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

/// How a file source reads its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// `pread` through the page cache.
    #[default]
    Buffered,
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
}

impl std::str::FromStr for ReadMode {
    type Err = SourceError;

    /// `pread` or `buffered`; `mmap`; `direct` or `o_direct`; `uring` or `io_uring`.
    fn from_str(s: &str) -> Result<ReadMode> {
        match s.to_ascii_lowercase().as_str() {
            "pread" | "buffered" => Ok(ReadMode::Buffered),
            "mmap" => Ok(ReadMode::Mmap),
            "direct" | "o_direct" => Ok(ReadMode::Direct),
            "uring" | "io_uring" | "io-uring" => Ok(ReadMode::Uring),
            _ => Err(SourceError::Options {
                reason: format!("unknown read mode {s:?}: expected pread, mmap, direct or uring"),
            }),
        }
    }
}

impl fmt::Display for ReadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReadMode::Buffered => "pread",
            ReadMode::Mmap => "mmap",
            ReadMode::Direct => "direct",
            ReadMode::Uring => "uring",
        })
    }
}

/// How [`open_with`](crate::open_with) opens and reads a dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// How record data is read.
    pub mode: ReadMode,
    /// Bytes in one io_uring read ([`DEFAULT_READ_SIZE`] says why 1 MiB); rounded up to the
    /// `O_DIRECT` alignment for direct reads. Between 1 byte and 1 GiB.
    pub read_size: usize,
    /// io_uring reads in flight at once per reading thread, 1 to 4096.
    pub queue_depth: u32,
    /// For `.safetensors` files: the tensor whose first dimension counts the records. `None`
    /// takes the file's only tensor (an error lists the names when there are several). Setting
    /// it for a dataset without `.safetensors` files is an error.
    pub tensor: Option<String>,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            mode: ReadMode::Buffered,
            read_size: DEFAULT_READ_SIZE,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            tensor: None,
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

/// A zeroed heap buffer whose address is aligned, for
/// [`Source::read_records_aligned`](crate::Source::read_records_aligned) outside the pinned pool
/// (a transform's scratch buffer, tests).
pub struct AlignedBuffer {
    /// Start of `len` bytes allocated with `layout`, initialised (zeroed) at allocation.
    ptr: NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer owns its allocation outright, like a `Vec<u8>`; nothing is thread-affine.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared references only read the bytes, like `&[u8]`.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocates `len` zeroed bytes at an address that is a multiple of `align`.
    ///
    /// # Panics
    ///
    /// When `align` is not a power of two or `len` rounded up to it overflows `isize` (the
    /// conditions of [`std::alloc::Layout`]); aborts when the allocation fails, like `Vec`.
    pub fn new(len: usize, align: usize) -> AlignedBuffer {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .expect("alignment a power of two and size below isize::MAX");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuffer { ptr, len, layout }
    }

    /// The alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }
}

impl std::ops::Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by `self` (field invariant).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout and not freed before.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}

/// How one file's record data is read; see the module documentation.
#[derive(Debug)]
pub(crate) struct Reader {
    /// The mode asked for.
    mode: ReadMode,
    /// The same file opened with `O_DIRECT`, for `Direct` and `Uring` when the file system
    /// allows it; the same inode as the ordinary descriptor (checked at open).
    direct: Option<File>,
    /// Alignment of direct reads: a power of two, at least [`DIRECT_ALIGN`]; 1 when `direct` is
    /// `None`.
    align: usize,
    /// `Uring` mode and io_uring accepted at open.
    uring: bool,
    /// Why the reader is not (entirely) what was asked for, for `reader_description`.
    refused: Option<String>,
    read_size: usize,
    queue_depth: u32,
    /// `Mmap` mode: the file's record bytes, mapped at the first gather (or why they could
    /// not be).
    mapped: OnceLock<std::result::Result<MappedFile, String>>,
}

impl Reader {
    /// `pread`, nothing else.
    pub(crate) fn buffered() -> Reader {
        Reader {
            mode: ReadMode::Buffered,
            direct: None,
            align: 1,
            uring: false,
            refused: None,
            read_size: DEFAULT_READ_SIZE,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            mapped: OnceLock::new(),
        }
    }

    /// Sets up reading `file` (opened from `path`) as `options` ask, falling back to `pread`
    /// where the system refuses `O_DIRECT` or io_uring.
    pub(crate) fn new(file: &File, path: &Path, options: &ReadOptions) -> Result<Reader> {
        options.check()?;
        let mut reader = Reader {
            mode: options.mode,
            read_size: options.read_size,
            queue_depth: options.queue_depth,
            ..Reader::buffered()
        };
        if matches!(options.mode, ReadMode::Buffered | ReadMode::Mmap) {
            return Ok(reader);
        }
        match open_direct(file, path) {
            Ok((direct, align)) => {
                reader.direct = Some(direct);
                reader.align = align;
            }
            // Optional under Uring: buffered io_uring reads are still io_uring reads.
            Err(e) if options.mode == ReadMode::Direct => {
                reader.refused = Some(format!("O_DIRECT refused: {e}"));
            }
            Err(_) => {}
        }
        if options.mode == ReadMode::Uring {
            match probe_uring(file, options.queue_depth) {
                Ok(()) => reader.uring = true,
                Err(e) => reader.refused = Some(format!("io_uring refused: {e}")),
            }
        }
        Ok(reader)
    }

    /// The alignment `read_aligned` needs of the buffer's address and length.
    pub(crate) fn alignment(&self) -> usize {
        self.align
    }

    /// "pread", "mmap gather, pread ranges", "O_DIRECT", "io_uring (depth 32)", "io_uring
    /// (depth 32, O_DIRECT)", or the fallback with its reason: "pread (io_uring refused: ...)",
    /// "pread (mmap refused: ...)".
    pub(crate) fn description(&self) -> String {
        if self.mode == ReadMode::Mmap {
            return match self.mapped.get() {
                Some(Err(why)) => format!("pread (mmap refused: {why})"),
                Some(Ok(map)) if map.faulted() => {
                    "pread (mmap gather stopped: the file shrank while mapped)".to_owned()
                }
                _ => "mmap gather, pread ranges".to_owned(),
            };
        }
        let base = match (self.mode, self.uring, self.direct.is_some()) {
            (ReadMode::Uring, true, direct) => format!(
                "io_uring (depth {}{})",
                self.queue_depth,
                if direct { ", O_DIRECT" } else { "" }
            ),
            (ReadMode::Buffered | ReadMode::Mmap, _, _) | (_, _, false) => "pread".to_owned(),
            (_, _, true) => "O_DIRECT".to_owned(),
        };
        match &self.refused {
            Some(why) => format!("{base} ({why})"),
            None => base,
        }
    }

    /// Fills `dst` from byte `offset` of `file` through the ordinary descriptor: one `pread`, or
    /// `read_size` pieces on io_uring.
    pub(crate) fn read(&self, file: &File, path: &Path, offset: u64, dst: &mut [u8]) -> Result<()> {
        // One piece gains nothing from a queue: a plain pread costs one system call too.
        if !self.uring || dst.len() <= self.read_size {
            return read_exact_at(file, path, offset, dst);
        }
        let fd = file.as_raw_fd();
        let base = dst.as_mut_ptr();
        let pieces = (0..dst.len())
            .step_by(self.read_size)
            .map(|at| {
                let len = self.read_size.min(dst.len() - at);
                Piece {
                    fd,
                    // `at < dst.len()`, so this stays inside `dst`.
                    buf: base.wrapping_add(at),
                    offset: offset + at as u64,
                    len,
                    need: len,
                    done: 0,
                    direct: false,
                }
            })
            .collect();
        // SAFETY: the pieces cover disjoint parts of `dst`, which is exclusively borrowed for
        // this call, and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path) }
    }

    /// Reads runs of records into `dst`, each to its place: with `Mmap`, by `memcpy` out of the
    /// mapping of `data` (the file's record bytes, mapped at the first gather); with io_uring,
    /// `queue_depth` reads in flight, one system call per `queue_depth` records instead of one
    /// per record; otherwise one `pread` per run.
    ///
    /// The runs' destinations lie inside `dst`, in increasing order, without overlapping
    /// (checked: the kernel writes them with io_uring).
    pub(crate) fn gather(
        &self,
        file: &File,
        path: &Path,
        data: std::ops::Range<u64>,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        if self.mode == ReadMode::Mmap {
            let mapped = self
                .mapped
                .get_or_init(|| MappedFile::new(file, data).map_err(|e| e.to_string()));
            return match mapped {
                Ok(map) => map.gather(file, path, runs, dst),
                Err(_) => pread_runs(file, path, runs, dst),
            };
        }
        if !self.uring || runs.len() < 2 {
            return pread_runs(file, path, runs, dst);
        }
        // The kernel writes the pieces: they must not overlap. Runs come in the order of their
        // places (`crate::gather_runs`), so this is one pass.
        let disjoint = runs.windows(2).all(|w| w[0].at + w[0].len <= w[1].at)
            && runs.last().is_none_or(|r| r.at + r.len <= dst.len());
        assert!(disjoint, "gather runs overlap or leave the destination");
        let fd = file.as_raw_fd();
        let base = dst.as_mut_ptr();
        let mut pieces = Vec::with_capacity(runs.len());
        for &GatherRun { offset, at, len } in runs {
            let mut done = 0;
            // Runs longer than `read_size` are cut as `read` cuts them.
            while done < len {
                let piece = self.read_size.min(len - done);
                pieces.push(Piece {
                    fd,
                    // `at + done < at + len <= dst.len()` (checked above).
                    buf: base.wrapping_add(at + done),
                    offset: offset + done as u64,
                    len: piece,
                    need: piece,
                    done: 0,
                    direct: false,
                });
                done += piece;
            }
        }
        // SAFETY: the pieces cover disjoint parts of `dst` (checked above), exclusively
        // borrowed for this call, and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path) }
    }

    /// Reads the bytes `offset .. offset + len` of `file` into `buf` and returns where in `buf`
    /// they start.
    ///
    /// Without `O_DIRECT` the bytes go to `buf[..len]` and the answer is 0. With it, the
    /// enclosing aligned span is read into `buf` through the direct descriptor, and the answer
    /// is `offset % align`. The caller has checked that `buf` is aligned to `alignment()` and
    /// long enough for the span (`len + 2 * align` suffices).
    pub(crate) fn read_aligned(
        &self,
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<usize> {
        let Some(direct) = &self.direct else {
            self.read(file, path, offset, &mut buf[..len])?;
            return Ok(0);
        };
        let align = self.align as u64;
        let start = offset - offset % align;
        let lead = (offset - start) as usize;
        let need = lead + len;
        let span = need.div_ceil(self.align) * self.align;
        debug_assert!(buf.len() >= span && buf.as_ptr() as usize % self.align == 0);
        let buf = &mut buf[..span];
        if len == 0 {
            return Ok(lead);
        }
        // As in `read`: one piece is one pread.
        if !self.uring || span <= self.read_size {
            read_direct(direct, file, path, start, buf, need, self.align)?;
            return Ok(lead);
        }
        let piece = self.read_size.div_ceil(self.align) * self.align;
        let fd = direct.as_raw_fd();
        let base = buf.as_mut_ptr();
        let pieces = (0..span)
            .step_by(piece)
            .map(|at| Piece {
                fd,
                // `at < span <= buf.len()`.
                buf: base.wrapping_add(at),
                offset: start + at as u64,
                len: piece.min(span - at),
                // Every piece starts before `need`: the span ends less than one alignment
                // (at most one piece) past it.
                need: piece.min(need - at),
                done: 0,
                direct: true,
            })
            .collect();
        // SAFETY: the pieces cover disjoint parts of `buf`, exclusively borrowed for this call,
        // and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path)? };
        Ok(lead)
    }

    /// Runs `pieces` on this thread's ring, `queue_depth` at a time.
    ///
    /// # Safety
    ///
    /// Every piece's `buf .. buf + len` must be valid for writes, not overlap another piece's,
    /// and not be touched by anything else until this returns.
    unsafe fn uring_read(&self, pieces: Vec<Piece>, file: &File, path: &Path) -> Result<()> {
        let mut ring = match take_ring(self.queue_depth) {
            Ok(ring) => ring,
            // Another ring refused after the first was accepted (a limit on rings or locked
            // memory): this read still succeeds, through pread.
            Err(_) => {
                for p in &pieces {
                    // SAFETY: valid for writes and exclusively ours (the caller's contract).
                    let dst = unsafe { std::slice::from_raw_parts_mut(p.buf, p.need) };
                    read_exact_at(file, path, p.offset, dst)?;
                }
                return Ok(());
            }
        };
        let mut run = Run {
            ring: &mut ring,
            pieces,
            depth: self.queue_depth as usize,
            file,
            path,
            align: self.align,
        };
        let outcome = run.go();
        // `go` returns only with nothing in flight and the submission queue empty.
        give_ring(self.queue_depth, ring);
        outcome
    }
}

/// Opens `path` again with `O_DIRECT`, checks it is the same file as `file` and that a direct
/// read works, and returns it with the alignment it needs.
fn open_direct(file: &File, path: &Path) -> io::Result<(File, usize)> {
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let (a, b) = (file.metadata()?, direct.metadata()?);
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(io::Error::other("the path now names another file"));
    }
    let align = dio_alignment(&direct)?;
    // Some file systems accept the flag at open and refuse the reads.
    let mut probe = AlignedBuffer::new(align, align);
    loop {
        match direct.read_at(&mut probe, 0) {
            Ok(_) => return Ok((direct, align)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The `O_DIRECT` alignment: [`DIRECT_ALIGN`], or more where `statx` reports that the file
/// system needs more; an error where it reports that direct I/O is not supported.
fn dio_alignment(file: &File) -> io::Result<usize> {
    // SAFETY: statx is plain old data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, an empty NUL-terminated path with AT_EMPTY_PATH, and a
    // pointer to a statx the kernel may write.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    // Kernels before 6.1 do not report it: the page size is safe for every common device.
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(DIRECT_ALIGN);
    }
    if stx.stx_dio_offset_align == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let need = stx.stx_dio_offset_align.max(stx.stx_dio_mem_align) as usize;
    Ok(need.next_power_of_two().max(DIRECT_ALIGN))
}

/// Reads `buf` (aligned span from the aligned offset `start`) through the direct descriptor
/// until at least `need` bytes are in.
///
/// A short read that ends off the alignment (only at the end of the file, in practice) cannot
/// be continued with `O_DIRECT`, so the rest of `..need` comes through `buffered`.
fn read_direct(
    direct: &File,
    buffered: &File,
    path: &Path,
    start: u64,
    buf: &mut [u8],
    need: usize,
    align: usize,
) -> Result<()> {
    let mut done = 0;
    while done < need {
        let pos = start + done as u64;
        match direct.read_at(&mut buf[done..], pos) {
            Ok(0) => return Err(truncated(path, start, need, done)),
            Ok(n) => {
                done += n;
                if done < need && done % align != 0 {
                    return read_exact_at(
                        buffered,
                        path,
                        start + done as u64,
                        &mut buf[done..need],
                    );
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(SourceError::Read {
                    path: path.to_path_buf(),
                    offset: pos,
                    len: buf.len() - done,
                    source,
                })
            }
        }
    }
    Ok(())
}

fn truncated(path: &Path, offset: u64, expected: usize, found: usize) -> SourceError {
    SourceError::Truncated {
        path: path.to_path_buf(),
        offset,
        expected: expected as u64,
        found: found as u64,
    }
}

thread_local! {
    /// This thread's idle rings, by queue depth.
    static RINGS: RefCell<Vec<(u32, IoUring)>> = const { RefCell::new(Vec::new()) };
}

fn take_ring(depth: u32) -> io::Result<IoUring> {
    let idle = RINGS.with_borrow_mut(|rings| {
        let i = rings.iter().position(|(d, _)| *d == depth)?;
        Some(rings.swap_remove(i).1)
    });
    match idle {
        Some(ring) => Ok(ring),
        // The completion queue is twice the submission queue, so `depth` reads in flight can
        // never overflow it.
        None => IoUring::new(depth),
    }
}

fn give_ring(depth: u32, ring: IoUring) {
    RINGS.with_borrow_mut(|rings| rings.push((depth, ring)));
}

/// Creates this thread's ring and reads one byte through it: the kernel may accept
/// `io_uring_setup` and still lack the read opcode (before 5.6).
fn probe_uring(file: &File, depth: u32) -> io::Result<()> {
    let mut ring = take_ring(depth)?;
    let mut byte = 0u8;
    let sqe = opcode::Read::new(types::Fd(file.as_raw_fd()), &mut byte, 1)
        .offset(0)
        .build();
    // SAFETY: `byte` outlives the read: we wait for its completion below before returning.
    unsafe { ring.submission().push(&sqe) }.map_err(io::Error::other)?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Nothing was submitted; the ring is dropped with its entry unsubmitted.
            Err(e) => return Err(e),
        }
    }
    let res = ring.completion().next().map_or(-libc::EIO, |c| c.result());
    give_ring(depth, ring);
    if res < 0 {
        return Err(io::Error::from_raw_os_error(-res));
    }
    Ok(())
}

/// One io_uring read: `need` bytes (at least) of `len` into `buf` from `offset`.
struct Piece {
    fd: i32,
    buf: *mut u8,
    offset: u64,
    /// Bytes asked for: a multiple of the alignment for direct pieces.
    len: usize,
    /// Bytes that must arrive; `0 < need <= len`. Less than `len` only for the last direct
    /// piece, whose aligned length may run past the end of the file.
    need: usize,
    /// Bytes that arrived; `done < need` while the piece is queued or in flight.
    done: usize,
    /// Through the `O_DIRECT` descriptor: continued through the buffered one if a short read
    /// leaves it off the alignment.
    direct: bool,
}

/// A batch of pieces on one ring.
struct Run<'a> {
    ring: &'a mut IoUring,
    pieces: Vec<Piece>,
    depth: usize,
    /// The ordinary descriptor, for finishing direct pieces that end off the alignment.
    file: &'a File,
    path: &'a Path,
    align: usize,
}

impl Run<'_> {
    /// Submits every piece, `depth` in flight at a time, and returns once none is in flight:
    /// the first error, after the reads already submitted have completed.
    fn go(&mut self) -> Result<()> {
        let mut queue: std::collections::VecDeque<usize> = (0..self.pieces.len()).collect();
        let mut in_flight = 0usize;
        let mut failed: Option<SourceError> = None;
        loop {
            while failed.is_none() && in_flight < self.depth {
                let Some(i) = queue.pop_front() else { break };
                let p = &self.pieces[i];
                let sqe = opcode::Read::new(
                    types::Fd(p.fd),
                    p.buf.wrapping_add(p.done),
                    // At most `read_size`, which is at most 1 GiB.
                    (p.len - p.done) as u32,
                )
                .offset(p.offset + p.done as u64)
                .build()
                .user_data(i as u64);
                // SAFETY: the buffer stays valid and untouched until the piece completes
                // (`uring_read`'s contract), and we do not return before it has.
                if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    // Full: submit what is queued first.
                    queue.push_front(i);
                    break;
                }
                in_flight += 1;
            }
            if in_flight == 0 {
                return failed.map_or(Ok(()), Err);
            }
            self.enter(in_flight);
            let done: Vec<(usize, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            for (i, res) in done {
                in_flight -= 1;
                if let Err(e) = self.complete(i, res, &mut queue) {
                    failed.get_or_insert(e);
                }
            }
        }
    }

    /// Submits what is queued and waits for at least one completion.
    ///
    /// Reads may be in flight into the caller's memory, so giving up here could let the kernel
    /// write into memory the caller has reused: errors other than the transient ones (which
    /// `io_uring_enter` with a valid ring does not return) abort the process instead.
    fn enter(&mut self, in_flight: usize) {
        let mut failures = 0;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) && failures < 1000 =>
                {
                    failures += 1;
                    std::thread::yield_now();
                }
                Err(e) => {
                    eprintln!(
                        "pinfeed: io_uring_enter failed with {in_flight} reads of {} in flight: {e}",
                        self.path.display()
                    );
                    std::process::abort();
                }
            }
        }
    }

    /// Accounts for one completion: done, queued again for the rest, or an error.
    fn complete(
        &mut self,
        i: usize,
        res: i32,
        queue: &mut std::collections::VecDeque<usize>,
    ) -> Result<()> {
        let Some(p) = self.pieces.get_mut(i) else {
            return Ok(());
        };
        if res < 0 {
            if matches!(-res, libc::EINTR | libc::EAGAIN) {
                queue.push_back(i);
                return Ok(());
            }
            return Err(SourceError::Read {
                path: self.path.to_path_buf(),
                offset: p.offset + p.done as u64,
                len: p.len - p.done,
                source: io::Error::from_raw_os_error(-res),
            });
        }
        if res == 0 {
            return Err(truncated(self.path, p.offset, p.need, p.done));
        }
        p.done += res as usize;
        if p.done >= p.need {
            return Ok(());
        }
        if p.direct && p.done % self.align != 0 {
            // SAFETY: `done < need <= len`: inside this piece's buffer, which is ours until we
            // return (`uring_read`'s contract) and has no read in flight now.
            let rest = unsafe {
                std::slice::from_raw_parts_mut(p.buf.wrapping_add(p.done), p.need - p.done)
            };
            return read_exact_at(self.file, self.path, p.offset + p.done as u64, rest);
        }
        queue.push_back(i);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for (s, m) in [
            ("pread", ReadMode::Buffered),
            ("mmap", ReadMode::Mmap),
            ("Direct", ReadMode::Direct),
            ("io_uring", ReadMode::Uring),
        ] {
            let parsed: ReadMode = s.parse().unwrap();
            assert_eq!(parsed, m);
            assert_eq!(parsed.to_string().parse::<ReadMode>().unwrap(), m);
        }
        assert_eq!("MMAP".parse::<ReadMode>().unwrap(), ReadMode::Mmap);
        let e = "telepathy".parse::<ReadMode>().unwrap_err().to_string();
        assert!(e.contains("pread, mmap, direct or uring"), "{e}");
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
    fn aligned_buffers_are_aligned() {
        for align in [1, 64, 4096, 1 << 16] {
            let mut b = AlignedBuffer::new(10_000, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!(b.len(), 10_000);
            assert!(b.iter().all(|&x| x == 0));
            b[9_999] = 7;
            assert_eq!(b[9_999], 7);
        }
        assert!(AlignedBuffer::new(0, 4096).is_empty());
    }

    #[test]
    fn readers_describe_themselves_and_their_fallbacks() {
        assert_eq!(Reader::buffered().description(), "pread");
        assert_eq!(Reader::buffered().alignment(), 1);
        let refused = |mode, uring, why: &str| Reader {
            mode,
            uring,
            refused: Some(why.to_owned()),
            ..Reader::buffered()
        };
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            refused(
                ReadMode::Uring,
                false,
                &format!("io_uring refused: {eperm}")
            )
            .description(),
            format!("pread (io_uring refused: {eperm})")
        );
        assert_eq!(
            refused(ReadMode::Direct, false, "O_DIRECT refused: x").description(),
            "pread (O_DIRECT refused: x)"
        );
        let uring = Reader {
            mode: ReadMode::Uring,
            uring: true,
            queue_depth: 8,
            ..Reader::buffered()
        };
        assert_eq!(uring.description(), "io_uring (depth 8)");
    }

    #[test]
    fn refused_o_direct_falls_back_to_pread() {
        // /proc files refuse O_DIRECT opens or reads on every kernel.
        let path = Path::new("/proc/self/stat");
        let file = File::open(path).unwrap();
        let options = ReadOptions {
            mode: ReadMode::Direct,
            ..ReadOptions::default()
        };
        let reader = Reader::new(&file, path, &options).unwrap();
        assert!(
            reader
                .description()
                .starts_with("pread (O_DIRECT refused: "),
            "{}",
            reader.description()
        );
        assert_eq!(reader.alignment(), 1);
    }
}
