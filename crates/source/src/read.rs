//! Opening files and positioned reads that fill the caller's buffer completely.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Result, SourceError};

/// Opens a regular file for reading and returns it with its size.
///
/// The path is checked with `stat` before `open` so that a FIFO is refused instead of blocking.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let open_err = |source| SourceError::Open {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(open_err)?;
    check_regular(&meta).map_err(open_err)?;
    // O_NONBLOCK: were the path replaced by a FIFO between stat and open, opening it would
    // block until a writer came; on a regular file the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(open_err)?;
    // The path may have been replaced between stat and open; trust the open file.
    let meta = file.metadata().map_err(open_err)?;
    check_regular(&meta).map_err(open_err)?;
    Ok((file, meta.len()))
}

fn check_regular(meta: &std::fs::Metadata) -> io::Result<()> {
    if meta.is_dir() {
        Err(io::Error::from_raw_os_error(libc::EISDIR))
    } else if !meta.is_file() {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    } else {
        Ok(())
    }
}

/// Fills `dst` from `offset`, retrying interrupted reads and continuing after short ones.
///
/// The end of the file before `dst` is full is [`SourceError::Truncated`]: sizes are checked at
/// open, so this means the file shrank.
pub(crate) fn read_exact_at(file: &File, path: &Path, offset: u64, dst: &mut [u8]) -> Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        // `done` never exceeds `dst.len()`, and offset + dst.len() was checked against the file size.
        let pos = offset.saturating_add(done as u64);
        match file.read_at(&mut dst[done..], pos) {
            Ok(0) => {
                return Err(SourceError::Truncated {
                    path: path.to_path_buf(),
                    offset,
                    expected: dst.len() as u64,
                    found: done as u64,
                })
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(SourceError::Read {
                    path: path.to_path_buf(),
                    offset: pos,
                    len: dst.len() - done,
                    source,
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fully_and_reports_eof() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let (f, len) = open_regular(&p).unwrap();
        assert_eq!(len, 10);
        let mut buf = [0u8; 4];
        read_exact_at(&f, &p, 3, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        match read_exact_at(&f, &p, 8, &mut buf) {
            Err(SourceError::Truncated {
                offset: 8,
                expected: 4,
                found: 2,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn directories_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        match open_regular(dir.path()) {
            Err(SourceError::Open { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EISDIR))
            }
            other => panic!("{other:?}"),
        }
        match open_regular(&dir.path().join("nope")) {
            Err(SourceError::Open { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
    }
}
