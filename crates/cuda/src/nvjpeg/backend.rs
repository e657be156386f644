//! One nvJPEG handle with the state and parse stream that go with it, and the batched decode
//! through it.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use super::ffi::{self, check, Api, Handle, Image, JpegState, JpegStream};
use crate::context::Context;
use crate::error::{CudaError, Result};
use crate::stream::Stream;

/// Device and pinned memory nvJPEG adds to each of its buffers when it grows one, so that a
/// slightly larger image does not reallocate (nvJPEG's own allocations are not stream-ordered).
const PADDING: usize = 4 << 20;

/// A handle of one nvJPEG backend, with its decode state and a parse stream.
pub(crate) struct Backend {
    api: Arc<Api>,
    ctx: Arc<Context>,
    /// Invariant: the three handles were created by this value's `create`, in this order, and
    /// are destroyed only in Drop, in the reverse order.
    handle: Handle,
    state: JpegState,
    parsed: JpegStream,
}

// SAFETY: nvJPEG handles may be used from any thread; `Backend` is used through `&mut` (or
// `&self` for the host-only header calls on `parsed`, which only the owning decoder makes), so
// one thread at a time.
unsafe impl Send for Backend {}

impl Backend {
    /// Creates a handle for `backend` (an `nvjpegBackend_t`), its state and a parse stream.
    /// The caller has `ctx` current.
    pub(crate) fn create(api: &Arc<Api>, ctx: &Arc<Context>, backend: c_int) -> Result<Backend> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: null allocators select nvJPEG's defaults; `handle` is a valid out-pointer.
        check("nvjpegCreateEx", unsafe {
            (api.nvjpegCreateEx)(
                backend,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                &mut handle,
            )
        })?;
        let mut b = Backend {
            api: Arc::clone(api),
            ctx: Arc::clone(ctx),
            handle,
            state: std::ptr::null_mut(),
            parsed: std::ptr::null_mut(),
        };
        // On failure below, `b` drops and destroys what was made.
        // SAFETY: `b.handle` is live; the out-pointer is valid.
        check("nvjpegJpegStateCreate", unsafe {
            (api.nvjpegJpegStateCreate)(b.handle, &mut b.state)
        })?;
        // SAFETY: as above.
        check("nvjpegJpegStreamCreate", unsafe {
            (api.nvjpegJpegStreamCreate)(b.handle, &mut b.parsed)
        })?;
        // SAFETY: `b.handle` is live.
        check("nvjpegSetDeviceMemoryPadding", unsafe {
            (api.nvjpegSetDeviceMemoryPadding)(PADDING, b.handle)
        })?;
        // SAFETY: `b.handle` is live.
        check("nvjpegSetPinnedMemoryPadding", unsafe {
            (api.nvjpegSetPinnedMemoryPadding)(PADDING, b.handle)
        })?;
        Ok(b)
    }

    /// `(engines, cores per engine)` of the hardware decoder, for a hardware handle.
    pub(crate) fn hardware_info(&self) -> Result<(u32, u32)> {
        let (mut engines, mut cores): (c_uint, c_uint) = (0, 0);
        // SAFETY: the handle is live; the out-pointers are valid.
        check("nvjpegGetHardwareDecoderInfo", unsafe {
            (self.api.nvjpegGetHardwareDecoderInfo)(self.handle, &mut engines, &mut cores)
        })?;
        Ok((engines, cores))
    }

    /// `nvjpegGetImageInfo`: `(components, chroma subsampling, width, height)`.
    pub(crate) fn image_info(&self, data: &[u8]) -> Result<(i32, i32, i32, i32)> {
        let (mut n, mut css) = (0 as c_int, 0 as c_int);
        let (mut widths, mut heights) = ([0 as c_int; 4], [0 as c_int; 4]);
        // SAFETY: `data` is readable for its length; `widths`/`heights` hold the
        // NVJPEG_MAX_COMPONENT (4) entries the call may write. Host-only.
        check("nvjpegGetImageInfo", unsafe {
            (self.api.nvjpegGetImageInfo)(
                self.handle,
                data.as_ptr(),
                data.len(),
                &mut n,
                &mut css,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        })?;
        Ok((n, css, widths[0], heights[0]))
    }

    /// Whether `nvjpegDecodeBatched` of this handle can decode `data` (for the hardware
    /// backend, whether its engines support the stream's encoding and subsampling).
    pub(crate) fn batched_supported(&mut self, data: &[u8]) -> Result<bool> {
        // SAFETY: `data` is readable for its length during the call; handle and stream are
        // live. Host-only.
        check("nvjpegJpegStreamParseHeader", unsafe {
            (self.api.nvjpegJpegStreamParseHeader)(
                self.handle,
                data.as_ptr(),
                data.len(),
                self.parsed,
            )
        })?;
        let mut unsupported: c_int = 1;
        // SAFETY: the stream was just parsed; the out-pointer is valid.
        check("nvjpegDecodeBatchedSupported", unsafe {
            (self.api.nvjpegDecodeBatchedSupported)(self.handle, self.parsed, &mut unsupported)
        })?;
        // nvJPEG's convention: 0 means supported.
        Ok(unsupported == 0)
    }

    /// Queues the decode of the bitstreams `data[i]` (of `lengths[i]` bytes) into
    /// `destinations[i]` (interleaved RGB) on `stream`. The caller has the context current.
    ///
    /// # Safety
    /// Every `data[i]` is host memory readable for `lengths[i]` bytes and every destination
    /// device memory of `height` rows of `pitch[0]` bytes for its image, both until the work
    /// queued on `stream` completes.
    pub(crate) unsafe fn decode_batched(
        &mut self,
        data: &[*const u8],
        lengths: &[usize],
        destinations: &mut [Image],
        stream: &Stream,
    ) -> Result<()> {
        debug_assert!(data.len() == lengths.len() && data.len() == destinations.len());
        let n = c_int::try_from(data.len()).map_err(|_| CudaError::InvalidArgument {
            call: "nvjpegDecodeBatched",
            detail: format!("{} images", data.len()),
        })?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: handle and state are live; one CPU thread (the calling one).
        check("nvjpegDecodeBatchedInitialize", unsafe {
            (self.api.nvjpegDecodeBatchedInitialize)(
                self.handle,
                self.state,
                n,
                1,
                ffi::OUTPUT_RGBI,
            )
        })?;
        // SAFETY: the three arrays hold `n` entries each; what they point at is valid by this
        // function's contract.
        check("nvjpegDecodeBatched", unsafe {
            (self.api.nvjpegDecodeBatched)(
                self.handle,
                self.state,
                data.as_ptr(),
                lengths.as_ptr(),
                destinations.as_mut_ptr(),
                stream.raw(),
            )
        })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        let Ok(_current) = self.ctx.enter() else {
            return;
        };
        // SAFETY: each non-null handle is live (field invariant) and destroyed once; the decoder
        // that owns this backend synchronised its stream first, so no queued work uses them.
        unsafe {
            if !self.parsed.is_null() {
                (self.api.nvjpegJpegStreamDestroy)(self.parsed);
            }
            if !self.state.is_null() {
                (self.api.nvjpegJpegStateDestroy)(self.state);
            }
            (self.api.nvjpegDestroy)(self.handle);
        }
    }
}
