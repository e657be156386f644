//! `pread` through the page cache: the reader every other one falls back to.

use std::fs::File;
use std::path::Path;

use super::{FileReader, GatherRun};
use crate::read::read_exact_at;
use crate::Result;

/// One `pread` per request, one per run of a gather.
#[derive(Debug)]
pub(crate) struct Pread;

impl FileReader for Pread {
    fn describe(&self) -> String {
        "pread".to_owned()
    }
}

/// A reader that is not (entirely) what was asked for, and why: `"pread (io_uring refused:
/// ...)"`, `"O_DIRECT (io_uring refused: ...)"`.
#[derive(Debug)]
pub(crate) struct Fallback {
    inner: Box<dyn FileReader>,
    why: String,
}

impl Fallback {
    pub(crate) fn new(inner: impl FileReader + 'static, why: String) -> Fallback {
        Fallback {
            inner: Box::new(inner),
            why,
        }
    }
}

impl FileReader for Fallback {
    fn describe(&self) -> String {
        format!("{} ({})", self.inner.describe(), self.why)
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn read(&self, file: &File, path: &Path, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.inner.read(file, path, offset, dst)
    }

    fn read_aligned(
        &self,
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<usize> {
        self.inner.read_aligned(file, path, offset, len, buf)
    }

    fn gather(
        &self,
        file: &File,
        path: &Path,
        data: std::ops::Range<u64>,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        self.inner.gather(file, path, data, runs, dst)
    }
}

/// One `pread` per run.
pub(crate) fn pread_runs(
    file: &File,
    path: &Path,
    runs: &[GatherRun],
    dst: &mut [u8],
) -> Result<()> {
    for run in runs {
        read_exact_at(file, path, run.offset, &mut dst[run.at..run.at + run.len])?;
    }
    Ok(())
}
