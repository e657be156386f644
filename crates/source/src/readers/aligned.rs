//! Aligned heap buffers for `O_DIRECT` reads outside the pinned pool.

use std::fmt;
use std::ptr::NonNull;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
