//! Buffers of decoded chunks let go, kept for the next chunks decoded. A buffer of megabytes
//! new to the process is memory the kernel maps on first touch, zeroing each page, which took
//! about as long as decoding a Parquet row group into it; a buffer used before is not.
//!
//! Spares are kept while a table is open ([`Open`]), at most a quarter of the cache's limit
//! besides the cache (a row group evicted, kept for the next one decoded); the last table
//! closed lets go of them all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Tables open now, in the process.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// The spare buffers, and their bytes.
static SPARES: Mutex<(Vec<Vec<u8>>, usize)> = Mutex::new((Vec::new(), 0));

/// Bytes of a huge page, where the system has them (x86-64's and most arm64 kernels' size).
const HUGE_PAGE: usize = 2 << 20;

/// Buffers smaller than this are left to the allocator, which keeps them itself.
const SMALLEST: usize = 1 << 20;

/// An open table, counted until dropped.
#[derive(Debug)]
pub(crate) struct Open(());

impl Open {
    pub(crate) fn new() -> Open {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Open(())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if OPEN.fetch_sub(1, Ordering::Relaxed) == 1 {
            let freed = std::mem::take(&mut *lock());
            drop(freed);
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, (Vec<Vec<u8>>, usize)> {
    SPARES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `len` bytes: a spare that fits it (at most a quarter larger), else new memory
/// asked for as huge pages. Zeroed when `zeroed`; otherwise its bytes are whatever they were,
/// and its user writes every one.
pub(crate) fn take(len: usize, zeroed: bool) -> Vec<u8> {
    if len >= SMALLEST {
        let mut spares = lock();
        let fits = |b: &Vec<u8>| b.capacity() >= len && b.capacity() - len <= len / 4;
        if let Some(at) = spares.0.iter().position(fits) {
            let mut buf = spares.0.swap_remove(at);
            spares.1 -= buf.capacity();
            drop(spares);
            if zeroed {
                buf.clear();
            }
            buf.resize(len, 0);
            return buf;
        }
    }
    fresh(len)
}

/// Gives `buf` back, kept as a spare while a table is open and the spares stay within a
/// quarter of the cache's `limit`.
pub(crate) fn give(buf: Vec<u8>, limit: usize) {
    let bytes = buf.capacity();
    if bytes < SMALLEST || OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut spares = lock();
    if spares.1 + bytes <= limit / 4 {
        spares.1 += bytes;
        spares.0.push(buf);
    }
}

/// Lets go of spares beyond a quarter of the cache's `limit`.
pub(crate) fn trim(limit: usize) {
    let mut spares = lock();
    while spares.1 > limit / 4 {
        let Some(buf) = spares.0.pop() else { break };
        spares.1 -= buf.capacity();
    }
}

/// `len` zeroed bytes of memory new to the process, asked for as huge pages: one fault every
/// 2 MiB instead of every 4 KiB where the system lets a process ask (transparent huge pages
/// set to `madvise` or `always`).
fn fresh(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let start = (buf.as_mut_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (buf.as_mut_ptr() as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside `buf`'s allocation; the advice changes how its pages
        // are mapped, never their contents, and a kernel that refuses it leaves them as they are.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_only_while_a_table_is_open() {
        // Other tests open tables meanwhile: sizes no other test uses, and bounds that hold.
        let len = 3 * SMALLEST + 12345;
        let open = Open::new();
        let mut buf = take(len, true);
        assert!(buf.len() == len && buf.iter().all(|&b| b == 0));
        buf.fill(7);
        let at = buf.as_ptr();
        give(buf, usize::MAX);
        let again = take(len - 100, false);
        assert_eq!(again.as_ptr(), at, "the spare is taken again");
        assert!(again.len() == len - 100 && again.iter().all(|&b| b == 7));
        give(again, usize::MAX);
        let zeroed = take(len, true);
        assert!(zeroed.iter().all(|&b| b == 0));
        // Not kept past the limit.
        give(zeroed, 4 * SMALLEST);
        assert!(!lock().0.iter().any(|b| b.capacity() == len));
        drop(open);
    }
}
