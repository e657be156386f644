//! How the mapped gather writes records into the caller's buffer: ordinary stores, or
//! streaming (non-temporal) stores, which write whole cache lines to memory without first
//! reading them into the cache. A slot is written once and then read by the copy engine, so
//! reading its lines first (as an ordinary store does) only adds memory traffic, and the
//! copy engine's reads of lines still dirty in a core's cache must fetch them from there.
//!
//! Which one runs is [`set_streaming`] (the `PINFEED_STREAM_STORES` environment variable,
//! `1` or `0`, sets it at the first gather).

use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STREAMING: AtomicU8 = AtomicU8::new(UNSET);

/// Whether gathers write with streaming stores.
pub fn streaming() -> bool {
    match STREAMING.load(Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var("PINFEED_STREAM_STORES").is_ok_and(|v| v == "1");
            STREAMING.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
        v => v == ON,
    }
}

/// Makes gathers write with streaming stores (`true`) or ordinary ones.
pub fn set_streaming(on: bool) {
    STREAMING.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// Copies `len` bytes from `src` to `dst`, with streaming stores where `streaming` is set and
/// the target has them. Call [`fence`] after the last copy of a batch, before the batch is
/// handed on: streaming stores are not ordered with later ordinary stores without it.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, not
/// overlapping.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize, streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming && len >= 256 {
        // SAFETY: the caller's contract.
        unsafe { stream_copy(src, dst, len) };
        return;
    }
    let _ = streaming;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Orders the streaming stores before it with every store after it (a no-op where `copy`
/// does not stream).
pub(crate) fn fence(streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming {
        // SAFETY: SSE is part of x86_64.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    let _ = streaming;
}

/// SSE2 streaming copy: the unaligned head with ordinary stores, 16-byte aligned stores
/// through the middle, the tail with ordinary stores.
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY: every range below lies inside the caller's `len` bytes; loads are unaligned,
    // stores 16-byte aligned (`d` starts aligned and moves in steps of 16).
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut s, mut d, mut n) = (src.add(head), dst.add(head), len - head);
        while n >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            (s, d, n) = (s.add(64), d.add(64), n - 64);
        }
        while n >= 16 {
            _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
            (s, d, n) = (s.add(16), d.add(16), n - 16);
        }
        std::ptr::copy_nonoverlapping(s, d, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length and alignment round the 16-byte steps copies exactly its bytes, streaming
    /// or not, and nothing around them.
    #[test]
    fn copies_exactly_at_any_alignment() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for streaming in [false, true] {
            for len in [0, 1, 15, 16, 63, 255, 256, 257, 1000, 2883, 4096] {
                for (from, to) in [(0, 0), (1, 0), (0, 1), (3, 13), (17, 5)] {
                    let mut dst = vec![0xEEu8; len + 64];
                    // SAFETY: `src[from..from + len]` and `dst[to..to + len]` are in bounds
                    // and distinct allocations.
                    unsafe {
                        copy(
                            src.as_ptr().add(from),
                            dst.as_mut_ptr().add(to),
                            len,
                            streaming,
                        )
                    };
                    fence(streaming);
                    assert_eq!(
                        &dst[to..to + len],
                        &src[from..from + len],
                        "{len} {from} {to}"
                    );
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0xEE));
                }
            }
        }
    }
}
