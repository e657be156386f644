//! One nvJPEG handle with the state and parse stream that go with it, and the batched decode
//! through it.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use super::ffi::{self, check, Api, Handle, Image, JpegState, JpegStream};
use crate::context::Context;
use crate::error::{CudaError, Result};
use crate::stream::{Event, Stream};

/// Device and pinned memory nvJPEG adds to each of its buffers when it grows one, so that a
/// slightly larger image does not reallocate (nvJPEG's own allocations are not stream-ordered).
const PADDING: usize = 4 << 20;

/// A handle of one nvJPEG backend, with two decode states and a parse stream.
///
/// A state's buffers must not be reused while a decode queued with it may still run (NVIDIA's
/// nvImageCodec waits for the previous batch before each `nvjpegDecodeBatched`), so batches
/// alternate between two states and each waits only for the batch before last: the host work
/// of one batch overlaps the device work of the one before.
pub(crate) struct Backend {
    api: Arc<Api>,
    ctx: Arc<Context>,
    /// Invariant: the handles were created by this value's `create` (handle first) and are
    /// destroyed only in Drop (handle last); a null state or stream was never created.
    handle: Handle,
    states: [JpegState; 2],
    parsed: JpegStream,
    /// Recorded after the last decode queued with `states[k]`.
    in_flight: [Event; 2],
    /// The state the next decode uses.
    turn: usize,
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
        let create = |flags: c_uint, handle: &mut Handle| {
            // SAFETY: null allocators select nvJPEG's defaults; `handle` is a valid out-pointer.
            unsafe {
                (api.nvjpegCreateEx)(
                    backend,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    flags,
                    handle,
                )
            }
        };
        // Chroma upsampled by interpolation, as libjpeg's "fancy upsampling" (Pillow's default)
        // does, rather than replicated: closer to the CPU decode. nvJPEG before 12.1 lacks the
        // flag and refuses it as an invalid parameter; it then decodes without.
        let mut status = create(ffi::FLAGS_UPSAMPLING_WITH_INTERPOLATION, &mut handle);
        if status == ffi::INVALID_PARAMETER {
            status = create(0, &mut handle);
        }
        check("nvjpegCreateEx", status)?;
        let events = (Event::new(ctx), Event::new(ctx));
        let mut b = Backend {
            api: Arc::clone(api),
            ctx: Arc::clone(ctx),
            handle,
            states: [std::ptr::null_mut(); 2],
            parsed: std::ptr::null_mut(),
            in_flight: [events.0?, events.1?],
            turn: 0,
        };
        // On failure below, `b` drops and destroys what was made.
        for k in 0..2 {
            // SAFETY: `b.handle` is live; the out-pointer is valid.
            check("nvjpegJpegStateCreate", unsafe {
                (api.nvjpegJpegStateCreate)(b.handle, &mut b.states[k])
            })?;
            if backend == ffi::BACKEND_HARDWARE {
                // Makes the hardware decoder use its memory pool (nvImageCodec: "considerable
                // performance benefit - >20% for 8GPU training").
                // SAFETY: handle and state are live.
                check("nvjpegDecodeBatchedPreAllocate", unsafe {
                    (api.nvjpegDecodeBatchedPreAllocate)(
                        b.handle,
                        b.states[k],
                        1,
                        1,
                        1,
                        ffi::CSS_444,
                        ffi::OUTPUT_RGBI,
                    )
                })?;
            }
        }
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
        let k = self.turn;
        self.turn ^= 1;
        self.in_flight[k].synchronize()?;
        let state = self.states[k];
        // SAFETY: handle and state are live, and no decode queued with the state is pending
        // (waited for above); one CPU thread (the calling one).
        let decoded = check("nvjpegDecodeBatchedInitialize", unsafe {
            (self.api.nvjpegDecodeBatchedInitialize)(self.handle, state, n, 1, ffi::OUTPUT_RGBI)
        })
        .and_then(|()| {
            // SAFETY: the three arrays hold `n` entries each; what they point at is valid by
            // this function's contract.
            check("nvjpegDecodeBatched", unsafe {
                (self.api.nvjpegDecodeBatched)(
                    self.handle,
                    state,
                    data.as_ptr(),
                    lengths.as_ptr(),
                    destinations.as_mut_ptr(),
                    stream.raw(),
                )
            })
        });
        // Also after a failure: part of the work may have been queued.
        self.in_flight[k].record(stream)?;
        decoded
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
            for state in self.states {
                if !state.is_null() {
                    (self.api.nvjpegJpegStateDestroy)(state);
                }
            }
            (self.api.nvjpegDestroy)(self.handle);
        }
    }
}

/// What this process's nvJPEG offers on one device, for a report such as `pinfeed doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvjpegProbe {
    /// nvJPEG's version, `(major, minor, patch)`.
    pub version: (i32, i32, i32),
    /// The hardware JPEG decoder: `(engines, cores per engine)`, or why it cannot be used.
    pub hardware: std::result::Result<(u32, u32), String>,
}

/// Loads nvJPEG and asks for the hardware decoder of `ctx`'s device (a handle made and
/// destroyed). Fails only when `libnvjpeg` cannot be loaded or the context not entered.
pub fn probe(ctx: &Arc<Context>) -> Result<NvjpegProbe> {
    let version = ffi::version()?;
    let api = ffi::api()?;
    let _current = ctx.enter()?;
    let hardware = Backend::create(&api, ctx, ffi::BACKEND_HARDWARE)
        .and_then(|b| b.hardware_info())
        .map_err(|e| e.to_string());
    Ok(NvjpegProbe { version, hardware })
}
