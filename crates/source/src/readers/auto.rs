//! [`Reader::Auto`] resolved for one path: which reader, and why.

use std::path::Path;

use super::Reader;

/// Page size of the `mincore` sample.
const PAGE: usize = 4096;

/// How [`Reader::Auto`] reads `path`, and why: through the page cache when the file is mostly in it
/// or fits comfortably in memory (the next epoch then reads from memory), with `pread` for ranges
/// and the mapped gather ([`Reader::Mmap`]) for shuffled batches, which spares a system call per
/// record and so moves records faster than a `pread` each, cached or not; `O_DIRECT` when it is
/// cold and larger than half the memory available, where the page cache would only churn and copy
/// twice. Anything but one regular file (a directory of shards, a pattern, a FIFO) is read with
/// `pread`.
///
/// The path is checked with `stat` before it is opened: opening a FIFO for reading would block
/// until a writer came.
pub fn resolve_auto(path: &Path) -> (Reader, String) {
    let not_one_file = || (Reader::Pread, "not a single file".to_owned());
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        _ => return not_one_file(),
    }
    let Ok(file) = std::fs::File::open(path) else {
        return not_one_file();
    };
    let Ok(meta) = file.metadata() else {
        return (Reader::Pread, "size unknown".into());
    };
    if !meta.is_file() {
        return not_one_file();
    }
    let cached = cached_fraction(&file).unwrap_or(0.0);
    let available = crate::system::mem_available().unwrap_or(u64::MAX);
    if cached >= 0.5 {
        (Reader::Mmap, format!("{:.0}% page-cached", cached * 100.0))
    } else if meta.len() > available / 2 {
        (
            Reader::Direct,
            format!(
                "{:.0}% page-cached and {:.1} GB against {:.1} GB of memory available",
                cached * 100.0,
                meta.len() as f64 / 1e9,
                available as f64 / 1e9
            ),
        )
    } else {
        (
            Reader::Mmap,
            format!("fits in memory ({:.0}% page-cached now)", cached * 100.0),
        )
    }
}

/// Fraction of a file's pages in the page cache, sampled with `mincore` over its mapping.
pub fn cached_fraction(file: &std::fs::File) -> Option<f64> {
    let len = file.metadata().ok()?.len() as usize;
    if len == 0 {
        return None;
    }
    // SAFETY: a read-only shared mapping we only pass to mincore; nothing reads through it.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let pages = len.div_ceil(PAGE);
    let mut resident = vec![0u8; pages];
    // SAFETY: `map` covers `len` bytes from a page-aligned address and `resident` has one byte
    // per page of it.
    let ok = unsafe { libc::mincore(map.as_ptr() as *mut _, len, resident.as_mut_ptr()) } == 0;
    ok.then(|| resident.iter().filter(|&&r| r & 1 == 1).count() as f64 / pages as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening it would block this test forever: no writer ever comes.
        assert_eq!(resolve_auto(&fifo).0, Reader::Pread);
        assert_eq!(resolve_auto(dir.path()).0, Reader::Pread);
    }

    #[test]
    fn a_small_file_is_read_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 10_000]).unwrap();
        assert_eq!(resolve_auto(&p).0, Reader::Mmap);
        assert!(crate::system::mem_total().unwrap() > 0);
    }
}
