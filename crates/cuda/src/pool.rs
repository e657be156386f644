//! Device memory from a stream-ordered pool of our own.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys::{
    CUdevice_attribute, CUdeviceptr, CUmemAllocationHandleType, CUmemAllocationType,
    CUmemLocationType, CUmemPoolProps, CUmemPool_attribute, CUmemoryPool,
};

use crate::context::Context;
use crate::driver::named;
use crate::error::{CudaError, Result};
use crate::stream::{Stream, StreamInner};

/// A device memory pool of our own (`cuMemPoolCreate`), so that torch's caching allocator and
/// ours do not trim each other.
///
/// Its release threshold is `u64::MAX`: freed blocks stay cached in the pool, so once the loader
/// is warm no batch causes a real device allocation. Allocation and free are stream-ordered
/// (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`).
#[derive(Debug)]
pub struct DevicePool {
    ctx: Arc<Context>,
    /// Invariant: created by `cuMemPoolCreate` for `ctx`'s device, destroyed only in Drop, which
    /// cannot run while a [`DeviceBuffer`] of the pool lives (each holds an `Arc`).
    raw: CUmemoryPool,
}

// SAFETY: a CUmemoryPool is a process-wide driver handle usable from any thread; the driver API
// is thread-safe.
unsafe impl Send for DevicePool {}
// SAFETY: shared access only passes the handle to thread-safe driver calls.
unsafe impl Sync for DevicePool {}

impl DevicePool {
    /// Creates a pool of pinned device memory on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<DevicePool>> {
        if ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? == 0 {
            return Err(CudaError::Unsupported {
                detail: format!("cuda:{} does not support memory pools", ctx.ordinal()),
            });
        }
        let _current = ctx.enter()?;
        // SAFETY: every field of CUmemPoolProps is an integer, a raw pointer, or an enum with a
        // variant of value 0, so all-zero bytes are a valid value (and what the C API expects
        // for the fields we do not set).
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.device();
        // SAFETY: `props` is a fully initialised struct of the layout cudarc generated for the
        // CUDA version we build for; our context is current.
        let raw = named("cuMemPoolCreate", unsafe {
            result::mem_pool::create(&props)
        })?;
        let pool = DevicePool {
            ctx: Arc::clone(ctx),
            raw,
        };
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the pool is live; RELEASE_THRESHOLD takes a pointer to a cuuint64_t, which
        // `threshold` is for the duration of the call. On failure `pool` drops and is destroyed.
        named("cuMemPoolSetAttribute", unsafe {
            result::mem_pool::set_attribute(
                pool.raw,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })?;
        Ok(Arc::new(pool))
    }

    /// The raw pool handle.
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// The context the pool belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Allocates `bytes` in stream order on `stream`: usable by work queued on `stream` after this
    /// call, and by other streams once they wait on an event recorded on `stream` after it.
    ///
    /// A zero-byte request gives a buffer with address 0 and no driver call.
    pub fn alloc_async(self: &Arc<Self>, bytes: usize, stream: &Stream) -> Result<DeviceBuffer> {
        self.same_device("DevicePool::alloc_async", stream)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let _current = self.ctx.enter()?;
            // SAFETY: the pool and stream are live and of the same device.
            ptr = named("cuMemAllocFromPoolAsync", unsafe {
                result::mem_pool::alloc_async(self.raw, bytes, stream.raw())
            })?;
        }
        Ok(DeviceBuffer {
            ptr,
            len: bytes,
            stream: Arc::clone(&stream.inner),
            pool: Arc::clone(self),
        })
    }

    /// Bytes the pool currently holds from the device, in use or cached
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.u64_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// Bytes currently handed out (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub fn used_bytes(&self) -> Result<u64> {
        self.u64_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// Returns cached memory to the device, keeping at least `keep` bytes (`cuMemPoolTrimTo`).
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let _current = self.ctx.enter()?;
        // SAFETY: the pool is live (field invariant).
        named("cuMemPoolTrimTo", unsafe {
            result::mem_pool::trim_to(self.raw, keep)
        })
    }

    fn u64_attribute(&self, attr: CUmemPool_attribute) -> Result<u64> {
        let _current = self.ctx.enter()?;
        let mut value: u64 = 0;
        // SAFETY: the pool is live; these attributes write one cuuint64_t to `value`.
        named("cuMemPoolGetAttribute", unsafe {
            result::mem_pool::get_attribute(self.raw, attr, (&mut value as *mut u64).cast())
        })?;
        Ok(value)
    }

    fn same_device(&self, call: &'static str, stream: &Stream) -> Result<()> {
        if stream.context().ordinal() == self.ctx.ordinal() {
            Ok(())
        } else {
            Err(CudaError::InvalidArgument {
                call,
                detail: format!(
                    "pool of cuda:{} used with a stream of cuda:{}",
                    self.ctx.ordinal(),
                    stream.context().ordinal()
                ),
            })
        }
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        let _current = self.ctx.enter();
        // SAFETY: the pool is live and no buffer of it remains (each holds an Arc of the pool);
        // frees still pending on streams are allowed, the driver finishes them first.
        let _ = unsafe { result::mem_pool::destroy(self.raw) };
    }
}

/// Owned device bytes from a [`DevicePool`].
///
/// Dropping queues `cuMemFreeAsync` on the stream the buffer was allocated on (errors are
/// ignored). The memory may be handed out again to work queued later on that stream, so
/// **before dropping, make that stream wait for every other stream that uses the buffer**
/// (record an event there, [`Stream::wait_event`] it), or free it on the last user's stream with
/// [`DeviceBuffer::free_on`].
#[derive(Debug)]
pub struct DeviceBuffer {
    /// Invariant: 0 when there is nothing to free (zero-byte buffer, or already freed by
    /// `free_on`); otherwise `len` bytes from `pool`, not yet freed.
    ptr: CUdeviceptr,
    len: usize,
    /// Keeps the allocation stream alive for the stream-ordered free in Drop.
    stream: Arc<StreamInner>,
    pool: Arc<DevicePool>,
}

// SAFETY: the device address and the Arc'd handles are usable from any thread; the driver API is
// thread-safe, and the type creates no host references.
unsafe impl Send for DeviceBuffer {}
// SAFETY: `&self` methods read only immutable fields.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// The device address (0 for a zero-byte buffer).
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the buffer was allocated on (and that Drop frees it on).
    pub fn stream(&self) -> Stream {
        Stream {
            inner: Arc::clone(&self.stream),
        }
    }

    /// The pool the buffer came from.
    pub fn pool(&self) -> &Arc<DevicePool> {
        &self.pool
    }

    /// Frees the buffer in stream order on `stream` instead of the allocation stream: the memory
    /// is reused only by work queued on `stream` after this call (or on streams that wait for it).
    ///
    /// `stream` must already be ordered after every use of the buffer on other streams.
    pub fn free_on(mut self, stream: &Stream) -> Result<()> {
        self.pool.same_device("DeviceBuffer::free_on", stream)?;
        if self.ptr == 0 {
            return Ok(());
        }
        let _current = stream.context().enter()?;
        // SAFETY: `ptr` is a live allocation of the pool (field invariant), freed once: on
        // success it is zeroed so Drop skips it.
        named("cuMemFreeAsync", unsafe {
            result::free_async(self.ptr, stream.raw())
        })?;
        self.ptr = 0;
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 || !self.stream.ctx.in_owner_process() {
            return;
        }
        let Ok(_current) = self.stream.ctx.enter() else {
            return;
        };
        // SAFETY: `ptr` is a live allocation of the pool (field invariant), freed once, here, on
        // the stream it was allocated on, which the Arc keeps alive.
        let _ = unsafe { result::free_async(self.ptr, self.stream.raw) };
    }
}
