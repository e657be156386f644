//! Copies into memory that the CPU will not read again: a pinned slot or staging buffer whose
//! next reader is the GPU's copy engine.
//!
//! A plain `memcpy` of a few hundred KB stores through the cache: each destination line is
//! first read from memory (to own it), then written back when it is evicted, so the bus carries
//! the destination twice and the source once. Non-temporal (streaming) stores write whole lines
//! to memory without reading them, and do not evict the source's lines or anybody else's.
//! glibc switches to them by itself only above a threshold of the order of the last-level cache
//! (megabytes), which the copies of a copy gang (chunks of 256 KB) and of small batches stay
//! below.
//!
//! ```
//! let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
//! let mut dst = vec![0u8; src.len()];
//! pinfeed_source::streaming::copy(&mut dst, &src);
//! assert_eq!(dst, src);
//! ```

/// Below this a streaming copy saves too little to pay for its fence and the partial lines at
/// either end: a plain copy.
pub const MIN_STREAMING_BYTES: usize = 4096;

/// Copies `src` into `dst` (of the same length) with streaming stores where the CPU has them
/// (x86-64: SSE2 always, AVX2 when detected), a plain copy elsewhere and below
/// [`MIN_STREAMING_BYTES`]. The stores are fenced before it returns, so whatever the caller
/// does next (hand the memory to another thread, to the driver) sees them as after a plain copy.
///
/// # Panics
/// If the lengths differ, as [`slice::copy_from_slice`] does.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "streaming copy: destination and source lengths differ"
    );
    // SAFETY: both slices are valid for their (equal) length, and `dst`, borrowed mutably,
    // cannot overlap `src`.
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// [`copy`] between raw pointers: for sources that must not be borrowed as slices (a mapping of
/// a file that another process may change while it is copied).
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, the two do not overlap, and
/// nothing else writes to `dst` until this returns.
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= MIN_STREAMING_BYTES {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected just above; the ranges as the caller promised.
            unsafe { x86::copy_avx2(dst, src, len) };
        } else {
            // SAFETY: SSE2 is part of x86-64; the ranges as the caller promised.
            unsafe { x86::copy_sse2(dst, src, len) };
        }
        return;
    }
    // SAFETY: as the caller promised.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_loadu_si128, _mm_sfence,
        _mm_stream_si128,
    };

    /// Bytes one turn of a loop moves: four vectors of 32 bytes, two lines.
    const STEP_AVX2: usize = 128;
    /// Four vectors of 16 bytes, one line.
    const STEP_SSE2: usize = 64;

    /// Splits `len` bytes at `dst` into a head copied plainly up to `align`, a body of whole
    /// `step`s, and a tail copied plainly; returns the ends of the head and the body.
    fn split(dst: *mut u8, len: usize, align: usize, step: usize) -> (usize, usize) {
        let head = dst.align_offset(align).min(len);
        (head, head + (len - head) / step * step)
    }

    /// # Safety
    /// The CPU has AVX2; `src` is valid for reads and `dst` for writes of `len` bytes, and the
    /// two do not overlap.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_avx2(dst: *mut u8, src: *const u8, len: usize) {
        let (head, body_end) = split(dst, len, 32, STEP_AVX2);
        // SAFETY: the head lies inside both ranges (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut at = head;
        while at < body_end {
            // SAFETY: `at + STEP_AVX2 <= body_end <= len`, so the four vectors lie inside
            // both ranges; `dst + at` is 32-byte aligned (`head` aligns it and every step is a
            // multiple of 32), as the streaming store needs; the loads are unaligned ones.
            unsafe {
                let s = src.add(at).cast::<__m256i>();
                let d = dst.add(at).cast::<__m256i>();
                let (a, b) = (_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)));
                let (c, e) = (_mm256_loadu_si256(s.add(2)), _mm256_loadu_si256(s.add(3)));
                _mm256_stream_si256(d, a);
                _mm256_stream_si256(d.add(1), b);
                _mm256_stream_si256(d.add(2), c);
                _mm256_stream_si256(d.add(3), e);
            }
            at += STEP_AVX2;
        }
        // SAFETY: the tail, `at..len`, lies inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
        // Streaming stores are weakly ordered: the fence makes them visible before anything
        // this thread does next, as Rust requires before the memory is touched again.
        _mm_sfence();
    }

    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes, and the two do not overlap.
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
        let (head, body_end) = split(dst, len, 16, STEP_SSE2);
        // SAFETY: the head lies inside both ranges (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut at = head;
        while at < body_end {
            // SAFETY: as in `copy_avx2`, with 16-byte vectors and alignment.
            unsafe {
                let s = src.add(at).cast::<__m128i>();
                let d = dst.add(at).cast::<__m128i>();
                let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
                let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            at += STEP_SSE2;
        }
        // SAFETY: the tail, `at..len`, lies inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
        _mm_sfence();
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Every length around the step and alignment edges, at every destination and source
        /// misalignment within a vector, against a plain copy; bytes outside `dst` untouched.
        fn check(copy: unsafe fn(*mut u8, *const u8, usize)) {
            let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut out = vec![0u8; 20_100];
            for len in [
                0, 1, 31, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097, 12_345,
            ] {
                for d_off in [0, 1, 15, 16, 31, 33] {
                    for s_off in [0, 3, 32] {
                        out.fill(0xA5);
                        let s = &src[s_off..s_off + len];
                        let d = &mut out[d_off..d_off + len];
                        // SAFETY: equal lengths, distinct allocations; AVX2 asserted by the caller.
                        unsafe { copy(d.as_mut_ptr(), s.as_ptr(), len) };
                        assert_eq!(&out[d_off..d_off + len], s, "len {len} +{d_off} +{s_off}");
                        assert!(out[..d_off].iter().all(|&b| b == 0xA5));
                        assert!(out[d_off + len..].iter().all(|&b| b == 0xA5));
                    }
                }
            }
        }

        #[test]
        fn sse2_copies_every_length_and_alignment_exactly() {
            check(copy_sse2);
        }

        #[test]
        fn avx2_copies_every_length_and_alignment_exactly() {
            // Every x86-64 server since 2013 has AVX2; a CI machine without it should say so
            // rather than pass without running the copy.
            assert!(
                std::arch::is_x86_feature_detected!("avx2"),
                "no AVX2 to test"
            );
            check(copy_avx2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_large_and_small_alike() {
        for len in [
            0,
            100,
            MIN_STREAMING_BYTES - 1,
            MIN_STREAMING_BYTES,
            1 << 20,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let mut dst = vec![0xFFu8; len];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "len {len}");
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn refuses_different_lengths() {
        copy(&mut [0u8; 8], &[1u8; 9]);
    }
}
