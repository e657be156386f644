//! `O_DIRECT`: aligned spans read straight into the caller's aligned buffer, bypassing the
//! page cache; the records are found inside at an offset.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::{AlignedBuffer, FileReader, DIRECT_ALIGN};
use crate::read::read_exact_at;
use crate::{Result, SourceError};

/// The file opened a second time with `O_DIRECT`: the same inode as the ordinary descriptor
/// (checked at open), and a direct read of it worked.
#[derive(Debug)]
pub(crate) struct Direct {
    direct: File,
    /// Alignment of direct reads: a power of two, at least [`DIRECT_ALIGN`].
    align: usize,
}

impl Direct {
    /// Opens `path` again with `O_DIRECT`, checks it is the same file as `file` and that a
    /// direct read works, and finds the alignment it needs.
    pub(crate) fn open(file: &File, path: &Path) -> io::Result<Direct> {
        let (direct, align) = open_direct(file, path)?;
        Ok(Direct { direct, align })
    }

    /// Where the aligned span around bytes `offset .. offset + len` lies: its aligned start,
    /// the bytes before `offset` in it, the bytes that must arrive, and its aligned length.
    pub(crate) fn span(&self, offset: u64, len: usize) -> (u64, usize, usize, usize) {
        let align = self.align as u64;
        let start = offset - offset % align;
        let lead = (offset - start) as usize;
        let need = lead + len;
        (start, lead, need, need.div_ceil(self.align) * self.align)
    }

    /// The `O_DIRECT` descriptor.
    pub(crate) fn file(&self) -> &File {
        &self.direct
    }

    /// Reads `buf` (an aligned span from the aligned offset `start`) until `need` bytes are in.
    pub(crate) fn read_span(
        &self,
        buffered: &File,
        path: &Path,
        start: u64,
        buf: &mut [u8],
        need: usize,
    ) -> Result<()> {
        read_direct(&self.direct, buffered, path, start, buf, need, self.align)
    }
}

impl FileReader for Direct {
    fn describe(&self) -> String {
        "O_DIRECT".to_owned()
    }

    fn alignment(&self) -> usize {
        self.align
    }

    fn read_aligned(
        &self,
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<usize> {
        let (start, lead, need, span) = self.span(offset, len);
        debug_assert!(buf.len() >= span && buf.as_ptr() as usize % self.align == 0);
        if len > 0 {
            self.read_span(file, path, start, &mut buf[..span], need)?;
        }
        Ok(lead)
    }
}

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

pub(crate) fn truncated(path: &Path, offset: u64, expected: usize, found: usize) -> SourceError {
    SourceError::Truncated {
        path: path.to_path_buf(),
        offset,
        expected: expected as u64,
        found: found as u64,
    }
}
