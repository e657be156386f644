//! The mapped gather: a shuffled batch's records copied with `memcpy` out of a read-only
//! mapping of the file, made once per source and shared by every reading thread, instead of
//! one `pread` system call per record.
//!
//! A file that shrinks under the mapping would raise `SIGBUS`; [`crate::sigbus`] turns that
//! into a page of zeroes and a count, and [`MappedFile::gather`] checks the count and the
//! file's size after each batch, reading the batch again with `pread` (which reports the short
//! file) when either says the copy may be wrong.

use std::fs::File;
use std::path::Path;

use std::sync::OnceLock;

use super::pread::pread_runs;
use super::FileReader;
use crate::sigbus::{self, Guard};
use crate::Result;

/// `pread` for ranges of records; gathers copy out of a mapping of the file's record bytes,
/// made at the first gather.
#[derive(Debug, Default)]
pub(crate) struct Mapped {
    /// The mapping, or why the file could not be mapped.
    mapped: OnceLock<std::result::Result<MappedFile, String>>,
}

impl FileReader for Mapped {
    /// "mmap gather, pread ranges", or the fallback with its reason: "pread (mmap refused:
    /// ...)", "pread (mmap gather stopped: ...)".
    fn describe(&self) -> String {
        match self.mapped.get() {
            Some(Err(why)) => format!("pread (mmap refused: {why})"),
            Some(Ok(map)) if map.faulted() => {
                "pread (mmap gather stopped: the file shrank while mapped)".to_owned()
            }
            _ => "mmap gather, pread ranges".to_owned(),
        }
    }

    fn gather(
        &self,
        file: &File,
        path: &Path,
        data: std::ops::Range<u64>,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        let mapped = self
            .mapped
            .get_or_init(|| MappedFile::new(file, data).map_err(|e| e.to_string()));
        match mapped {
            Ok(map) => map.gather(file, path, runs, dst),
            Err(_) => pread_runs(file, path, runs, dst),
        }
    }
}

/// One run of a gather: `len` bytes from byte `offset` of the file to `dst[at .. at + len]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherRun {
    /// Byte offset of the run in the file (or object).
    pub offset: u64,
    /// Where the run goes in the destination.
    pub at: usize,
    /// Bytes in the run: whole records.
    pub len: usize,
}

/// Bytes `offset .. offset + len` of a file, mapped read-only and shared.
#[derive(Debug)]
pub(crate) struct MappedFile {
    // Field order is drop order: the guard is released before the mapping is unmapped.
    guard: Guard,
    /// The mapping: page-aligned, mapped until drop. Only ever read through raw pointers
    /// (`gather`), never as a slice: another process may change or truncate the file.
    map: memmap2::Mmap,
    /// File offset of the first mapped byte; a multiple of the page size.
    offset: u64,
}

impl MappedFile {
    /// Maps bytes `data.start .. data.end` of `file` (rounded out to pages) and guards the
    /// mapping against the file shrinking.
    pub(crate) fn new(file: &File, data: std::ops::Range<u64>) -> std::io::Result<MappedFile> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let offset = data.start - data.start % page;
        let len = usize::try_from(data.end - offset)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let size = file.metadata()?.len();
        if size < data.end {
            return Err(std::io::Error::other(format!(
                "the file is {size} bytes, shorter than its records' {} (it shrank)",
                data.end
            )));
        }
        // SAFETY: a read-only shared mapping of a descriptor we hold. The file may change or
        // shrink under it: the mapping is only copied from with raw pointers (never borrowed as
        // `&[u8]`), and faults past a shrunk end are caught by the guard below.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(file)
        }?;
        // No MADV_RANDOM: on a page-cached file advice changes nothing measurable, and on a cold
        // one that fits in memory the kernel's read-around (which it stops by itself after many
        // misses without hits) makes faulting gathers several times faster than page-sized faults,
        // and faster than `pread`. No MAP_POPULATE either: it would read a cold file whole at open,
        // and faults (mapping 16 pages each) cost the first epoch of a cached one nothing
        // measurable.
        let guard = sigbus::guard(map.as_ptr(), map.len()).map_err(std::io::Error::other)?;
        Ok(MappedFile { guard, map, offset })
    }

    /// Whether a copy out of the mapping has faulted: its pages may then hold zeroes in place
    /// of file data, so it is read no more.
    pub(crate) fn faulted(&self) -> bool {
        self.guard.faults() != 0
    }

    /// Copies each run out of the mapping into `dst` (file offsets inside the mapped range,
    /// destinations inside `dst`), then checks that the file still holds every byte copied
    /// and that no copy faulted. Where it does not, the runs are read again with `pread`
    /// through `file`, which gives the error a short file deserves (or the bytes, if the file
    /// grew back).
    pub(crate) fn gather(
        &self,
        file: &File,
        path: &Path,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        if self.faulted() {
            return pread_runs(file, path, runs, dst);
        }
        let mut end = 0u64;
        for run in runs {
            let from = run
                .offset
                .checked_sub(self.offset)
                .map(|from| from as usize);
            let len = self.map.len();
            let inside = from.is_some_and(|from| from <= len && run.len <= len - from);
            assert!(
                inside && run.at <= dst.len() && run.len <= dst.len() - run.at,
                "a gather run outside the mapping or the destination: {run:?}"
            );
            let from = from.expect("checked");
            // SAFETY: both ranges were checked just above to lie inside the mapping and `dst`;
            // `dst` is exclusively borrowed and cannot overlap our read-only mapping. Another
            // process may change the file's bytes meanwhile: we then copy whatever is there, as
            // `pread` would, and never form a reference to the mapped bytes. A page past a
            // shrunk file's end faults and reads as zeroes (see `crate::sigbus`), which the
            // checks below catch.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.map.as_ptr().add(from),
                    dst.as_mut_ptr().add(run.at),
                    run.len,
                );
            }
            end = end.max(run.offset + run.len as u64);
        }
        // A file cut in the middle of a page reads as zeroes after the cut without a fault:
        // the size tells. (One `fstat` a batch, against one `pread` a record.)
        match file.metadata() {
            Ok(meta) if meta.len() >= end && !self.faulted() => Ok(()),
            _ => pread_runs(file, path, runs, dst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SourceError;
    use std::fs::OpenOptions;

    const PAGE: usize = 4096;

    fn fixture(pages: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.bin");
        let bytes: Vec<u8> = (0..pages * PAGE).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        (dir, path, bytes)
    }

    #[test]
    fn runs_land_where_they_are_told() {
        let _serial = crate::sigbus::TEST_GUARDS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (_dir, path, bytes) = fixture(4);
        let file = File::open(&path).unwrap();
        // A region that does not start on a page, as a .npy header leaves it.
        let map = MappedFile::new(&file, 100..bytes.len() as u64).unwrap();
        let runs = [
            GatherRun {
                offset: 5000,
                at: 30,
                len: 10,
            },
            GatherRun {
                offset: 100,
                at: 0,
                len: 30,
            },
            GatherRun {
                offset: bytes.len() as u64 - 8,
                at: 40,
                len: 8,
            },
        ];
        let mut dst = vec![0u8; 48];
        map.gather(&file, &path, &runs, &mut dst).unwrap();
        for run in runs {
            let o = run.offset as usize;
            assert_eq!(
                dst[run.at..run.at + run.len],
                bytes[o..o + run.len],
                "{run:?}"
            );
        }
    }

    #[test]
    fn a_shrunk_file_is_an_error_not_a_crash() {
        let _serial = crate::sigbus::TEST_GUARDS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (_dir, path, bytes) = fixture(8);
        let file = File::open(&path).unwrap();
        let map = MappedFile::new(&file, 0..bytes.len() as u64).unwrap();
        let mut dst = vec![0u8; 100];
        let tail = GatherRun {
            offset: 6 * PAGE as u64 + 10,
            at: 0,
            len: 100,
        };
        map.gather(&file, &path, &[tail], &mut dst).unwrap();
        // Cut in the middle of page 3: pages 4.. are gone (a copy from them faults), page 3
        // reads as zeroes after the cut (no fault).
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3 * PAGE as u64 + 50)
            .unwrap();
        let head = GatherRun {
            offset: 10,
            at: 0,
            len: 100,
        };
        map.gather(&file, &path, &[head], &mut dst).unwrap();
        assert_eq!(dst, bytes[10..110]);
        let straddling = GatherRun {
            offset: 3 * PAGE as u64,
            at: 0,
            len: 100,
        };
        match map.gather(&file, &path, &[straddling], &mut dst) {
            Err(SourceError::Truncated {
                offset,
                expected: 100,
                found: 50,
                ..
            }) => {
                assert_eq!(offset, 3 * PAGE as u64)
            }
            other => panic!("{other:?}"),
        }
        assert!(!map.faulted(), "a partial page does not fault");
        let mut two = vec![0u8; 200];
        let tail_after = GatherRun { at: 100, ..tail };
        match map.gather(&file, &path, &[head, tail_after], &mut two) {
            Err(SourceError::Truncated { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(map.faulted(), "the copy from a page past the end faulted");
        // From now on, pread: what is still there reads right, the rest is an error.
        map.gather(&file, &path, &[head], &mut dst).unwrap();
        assert_eq!(dst, bytes[10..110]);
        assert!(map.gather(&file, &path, &[tail], &mut dst).is_err());
    }
}
