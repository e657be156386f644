//! Datasets already in host memory.

use std::any::Any;
use std::fmt;

use crate::{check_request, Layout, Result, Source, SourceError};

/// What every host-buffer error calls the dataset.
const NAME: &str = "host buffer";

/// Records held in memory: a `Vec`, or memory owned by something else (a numpy array kept
/// alive by the Python bindings, a memory map).
pub struct HostBuffer {
    /// Start of the records; `ptr..ptr + len` is valid for reads and unchanged while `_owner`
    /// lives (the contract of [`HostBuffer::from_raw`]; `from_vec` owns the Vec itself).
    ptr: *const u8,
    /// Bytes in the buffer: a non-zero multiple of `layout.record_bytes()`.
    len: usize,
    layout: Layout,
    num_records: u64,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the buffer is only ever read, through shared references, and its owner is Send + Sync;
// the raw pointer is what makes the compiler unsure, not any thread-affine state.
unsafe impl Send for HostBuffer {}
// SAFETY: as above: concurrent reads of memory nobody writes are data-race free.
unsafe impl Sync for HostBuffer {}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("layout", &self.layout)
            .field("num_records", &self.num_records)
            .finish_non_exhaustive()
    }
}

impl HostBuffer {
    /// Takes ownership of `data`, whose length must be a non-zero multiple of the record size.
    pub fn from_vec(data: Vec<u8>, layout: Layout) -> Result<HostBuffer> {
        let ptr = data.as_ptr();
        let len = data.len();
        // SAFETY: moving a Vec into the box does not move its heap buffer, and nothing mutates
        // the Vec once it is boxed as an opaque owner, so `ptr..ptr + len` stays valid and
        // unchanged for the owner's life.
        unsafe { HostBuffer::from_raw(ptr, len, layout, Box::new(data)) }
    }

    /// Wraps memory owned by `owner`, which is dropped with the buffer.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for reads and must not change while `owner` lives.
    pub unsafe fn from_raw(
        ptr: *const u8,
        len: usize,
        layout: Layout,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<HostBuffer> {
        let layout = Layout::new(layout.dtype, layout.shape)?;
        let record_bytes = layout.record_bytes();
        let trailing = len % record_bytes;
        if trailing != 0 {
            return Err(SourceError::RecordSize {
                name: NAME.to_owned(),
                size: len as u64,
                record_bytes,
                trailing: trailing as u64,
            });
        }
        if len == 0 {
            return Err(SourceError::Empty {
                name: NAME.to_owned(),
            });
        }
        Ok(HostBuffer {
            ptr,
            len,
            num_records: (len / record_bytes) as u64,
            layout,
            _owner: owner,
        })
    }

    /// Start of the records.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Bytes in the buffer.
    pub fn len_bytes(&self) -> usize {
        self.len
    }

    /// The records as a slice.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is valid and unchanged while `_owner` lives (field invariant),
        // and `_owner` lives as long as `self`; `len` is non-zero, so `ptr` is not dangling.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Source for HostBuffer {
    fn name(&self) -> &str {
        NAME
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.num_records
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        check_request(self, first, dst.len())?;
        // In range, so start..start + dst.len() lies inside the buffer.
        let start = first as usize * self.layout.record_bytes();
        dst.copy_from_slice(&self.as_slice()[start..start + dst.len()]);
        Ok(())
    }

    fn reader_description(&self) -> String {
        "memory copy".into()
    }
}
