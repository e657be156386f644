//! Page-locked host memory and the asynchronous copies that use it.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdeviceptr};

use crate::context::Context;
use crate::driver::{check, named};
use crate::error::{CudaError, Result};
use crate::numa::{self, NumaPlacement};
use crate::stream::Stream;

/// How page-locked host memory is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PinMethod {
    /// `cuMemHostAlloc` (portable, not write-combined, so the CPU reads it at full speed). The
    /// driver allocates and pins in one call; many times slower than [`PinMethod::Register`] for
    /// large sizes. Its NUMA node cannot be chosen: the driver places the pages.
    HostAlloc,
    /// An anonymous `mmap` with its pages touched up front, then `cuMemHostRegister`. On a host
    /// with several NUMA nodes the mapping is first bound (`mbind`, `MPOL_PREFERRED`) to the
    /// GPU's node, so the pages are allocated there
    /// ([`PinnedMemory::numa_placement`] says what happened).
    Register,
}

/// One page-locked host allocation, made once and reused.
///
/// The memory is not inherited by forked children (the driver marks `cuMemHostAlloc` memory so,
/// and [`PinMethod::Register`] memory gets `MADV_DONTFORK`): copy-on-write after a fork could
/// otherwise move a page under a running DMA. A child must not touch it.
///
/// Dropping frees the memory (`cuMemFreeHost`, or `cuMemHostUnregister` then `munmap`).
/// **The owner must make sure no copy that reads or writes it is still in flight**, for example by
/// synchronising the events recorded after those copies; this type cannot know which streams use it.
#[derive(Debug)]
pub struct PinnedMemory {
    ctx: Arc<Context>,
    /// Invariant: `len` bytes at `ptr` are mapped, readable, writable and page-locked until Drop;
    /// obtained by `method` and freed only in Drop.
    ptr: *mut u8,
    len: usize,
    method: PinMethod,
    placement: NumaPlacement,
    /// The mapping of [`PinMethod::Register`] memory, unmapped in Drop after it is
    /// unregistered; `None` for `cuMemHostAlloc` memory.
    mapping: Option<memmap2::MmapMut>,
}

// SAFETY: the allocation is plain process memory owned by this value, not tied to a thread; the
// type only hands out a raw pointer, so it creates no aliasing references itself.
unsafe impl Send for PinnedMemory {}
// SAFETY: `&self` methods read only immutable fields.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// Allocates `bytes` of page-locked memory with `method`.
    pub fn alloc(ctx: &Arc<Context>, bytes: usize, method: PinMethod) -> Result<PinnedMemory> {
        if bytes == 0 {
            return Err(CudaError::InvalidArgument {
                call: "PinnedMemory::alloc",
                detail: "0 bytes requested; a pinned allocation must be at least 1 byte".into(),
            });
        }
        let _current = ctx.enter()?;
        let mut placement = numa::decide(numa::online_node_count(), ctx.numa_node());
        let mut mapping = None;
        let ptr = match method {
            PinMethod::HostAlloc => {
                if let NumaPlacement::GpuNode(_) = placement {
                    placement = NumaPlacement::NotPlaced(
                        "cuMemHostAlloc memory is placed by the driver".into(),
                    );
                }
                // SAFETY: our context is current (guard). Flags: portable only, deliberately not
                // write-combined (the CPU writes and may read it).
                let p = named("cuMemHostAlloc", unsafe {
                    result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
                })?;
                p.cast::<u8>()
            }
            PinMethod::Register => {
                let (mut map, placed) =
                    numa::map_placed(bytes, placement).map_err(|source| CudaError::Os {
                        call: "mmap",
                        bytes,
                        source,
                    })?;
                placement = placed;
                // Failure only means the child would inherit it, which is not worth failing the
                // allocation for.
                let _ = map.advise(memmap2::Advice::DontFork);
                let p = map.as_mut_ptr().cast::<c_void>();
                // SAFETY: the range is mapped read-write for `bytes` and stays mapped until Drop
                // unregisters it first; our context is current (guard). On failure `map` is
                // unmapped unregistered.
                check("cuMemHostRegister", unsafe {
                    sys::cuMemHostRegister_v2(p, bytes, sys::CU_MEMHOSTREGISTER_PORTABLE)
                })?;
                mapping = Some(map);
                p.cast::<u8>()
            }
        };
        debug_assert!(!ptr.is_null());
        Ok(PinnedMemory {
            ctx: Arc::clone(ctx),
            ptr,
            len: bytes,
            method,
            placement,
            mapping,
        })
    }

    /// The first byte. Valid for `len()` bytes for as long as `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a zero-byte allocation is refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How the memory was obtained.
    pub fn method(&self) -> PinMethod {
        self.method
    }

    /// Which NUMA node the pages were put on, and why.
    pub fn numa_placement(&self) -> &NumaPlacement {
        &self.placement
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        let owner = self.ctx.in_owner_process();
        match self.method {
            PinMethod::HostAlloc => {
                if !owner {
                    return; // driver memory of the parent; not ours to free here
                }
                let _current = self.ctx.enter();
                // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here; the owner
                // guarantees no copy still uses it (type docs).
                let _ = unsafe { result::free_host(self.ptr.cast()) };
            }
            PinMethod::Register => {
                if owner {
                    let _current = self.ctx.enter();
                    // SAFETY: `ptr` was registered in `alloc` and is unregistered once, here; the
                    // owner guarantees no copy still uses it (type docs).
                    let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
                }
                // Unmapped only now that it is unregistered.
                drop(self.mapping.take());
            }
        }
    }
}

/// Existing host memory registered (page-locked) in place: a user's array, or a read-only file
/// mapping. Unregisters on drop.
///
/// Registering costs time in proportion to the pages (tens of milliseconds a GiB of pages
/// already touched); the driver serialises it.
#[derive(Debug)]
pub struct Registration {
    ctx: Arc<Context>,
    /// Invariant: `len` bytes at `ptr` are registered until Drop (mapped by `new`'s contract).
    ptr: *mut u8,
    len: usize,
    read_only: bool,
}

// SAFETY: the registration is a process-wide driver record, not tied to a thread; the type only
// holds a raw pointer and creates no references into the memory.
unsafe impl Send for Registration {}
// SAFETY: `&self` methods read only immutable fields.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `len` bytes at `ptr` with `cuMemHostRegister` (portable; plus
    /// `CU_MEMHOSTREGISTER_READ_ONLY` when `read_only`, which a read-only file mapping needs:
    /// without it the driver answers invalid argument).
    ///
    /// Whole pages are pinned; a range already registered, even in part, fails with
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
    ///
    /// # Safety
    /// The range must be mapped (readable, and writable unless `read_only`) and stay mapped until
    /// the `Registration` is dropped; and when it is dropped no copy may still be using it.
    pub unsafe fn new(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        read_only: bool,
    ) -> Result<Registration> {
        if ptr.is_null() || len == 0 {
            return Err(CudaError::InvalidArgument {
                call: "Registration::new",
                detail: format!(
                    "expected a non-null pointer and a non-zero length, found {ptr:p} and {len}"
                ),
            });
        }
        let _current = ctx.enter()?;
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if read_only {
            flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        // SAFETY: the range is mapped for `len` bytes by this function's contract; our context is
        // current (guard).
        // cudarc's `result` layer has no `cuMemHostRegister` (nor `cuMemHostUnregister`).
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), len, flags)
        })?;
        Ok(Registration {
            ctx: Arc::clone(ctx),
            ptr,
            len,
            read_only,
        })
    }

    /// The first registered byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a zero-byte registration is refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it was registered with `CU_MEMHOSTREGISTER_READ_ONLY`.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        let _current = self.ctx.enter();
        // SAFETY: registered in `new`, unregistered once, here; still mapped and idle by `new`'s
        // contract.
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
    }
}

/// Whether `ptr` lies in host memory the driver already treats as page-locked: a
/// `cuMemHostAlloc` allocation (torch's `pin_memory()`) or a `cuMemHostRegister`ed range. Copies
/// from such memory are true DMA; registering it again would fail with
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
///
/// Pageable memory answers `false` (the driver does not know the address).
pub fn is_page_locked(ctx: &Arc<Context>, ptr: *const u8) -> Result<bool> {
    let _current = ctx.enter()?;
    let mut kind: u32 = 0;
    // SAFETY: `kind` is a valid out-pointer for the attribute's 32-bit value; the driver only
    // looks the address up, it never dereferences it. Our context is current (guard).
    let status = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as sys::CUdeviceptr,
        )
    };
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32),
        // An address the driver has never seen: ordinary pageable memory.
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => Ok(false),
        other => Err(CudaError::from_driver("cuPointerGetAttribute", other)),
    }
}

/// Queues a host-to-device copy of `len` bytes on `stream` (`cuMemcpyHtoDAsync`).
///
/// Truly asynchronous only when `src` is page-locked ([`PinnedMemory`], [`Registration`]);
/// from pageable memory the driver stages it and the call returns late.
///
/// # Safety
/// `src` must be valid for reading `len` bytes and `dst` a device allocation valid for `len`
/// bytes, both until the copy completes (track it with an [`Event`](crate::Event) recorded on
/// `stream` afterwards); nothing may write `src` meanwhile.
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _current = stream.context().enter()?;
    // SAFETY: validity of both ranges until completion is this function's contract; the stream is
    // live (borrowed).
    // Not `result::memcpy_htod_async`: it takes a slice, and a slice over a slot the copy
    // engine reads while readers fill its neighbours is more than this raw range promises.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.raw())
    })
}

/// Queues a device-to-host copy of `len` bytes on `stream` (`cuMemcpyDtoHAsync`).
///
/// # Safety
/// `dst` must be valid for writing `len` bytes and `src` a device allocation valid for `len`
/// bytes, both until the copy completes (track it with an [`Event`](crate::Event)); nothing may
/// read or write `dst` meanwhile.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _current = stream.context().enter()?;
    // SAFETY: validity of both ranges until completion is this function's contract; the stream is
    // live (borrowed).
    // Not `result::memcpy_dtoh_async`: it takes a slice (see `memcpy_htod_async`).
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.raw())
    })
}

/// Queues a device-to-device copy of `len` bytes on `stream` (`cuMemcpyDtoDAsync`).
///
/// # Safety
/// Both ranges must be device allocations valid for `len` bytes until the copy completes, and
/// must not overlap.
pub unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _current = stream.context().enter()?;
    // SAFETY: validity of both ranges until completion is this function's contract.
    named("cuMemcpyDtoDAsync", unsafe {
        result::memcpy_dtod_async(dst, src, len, stream.raw())
    })
}
