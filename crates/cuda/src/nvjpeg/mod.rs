//! GPU JPEG decoding with nvJPEG, and the crop + resize + flip + layout step that turns the
//! decoded images into a fixed-size batch.
//!
//! - [`JpegDecoder`]: per batch, reads each bitstream's header on the host, sends what the
//!   hardware JPEG engines support (`NVJPEG_BACKEND_HARDWARE`, A100/H100/H200) to them in one
//!   batched call and the rest to the GPU hybrid backend (`NVJPEG_BACKEND_GPU_HYBRID`), then one
//!   kernel crops, resizes, flips and writes every image into the output batch. Images nvJPEG
//!   should not decode (CMYK, truncated, not a JPEG) come back as [`JpegOutcome::Cpu`] for the
//!   caller's CPU decoder; images over the pixel limit as [`JpegOutcome::Refused`].
//! - [`probe`]: nvJPEG's version and the device's hardware decoder, for a report.
//! - [`OutputSpec`], [`CropBox`], [`crop_resize_reference`]: the output form, and the CPU
//!   reference of the kernel's formula (torchvision's bilinear resize, optionally antialiased).
//!
//! `libnvjpeg` and `libnvrtc` are loaded at run time (see [`LIBS_ENV`] for where they are
//! looked for); without them [`JpegDecoder::new`] fails with
//! [`CudaError::LibraryMissing`](crate::CudaError::LibraryMissing) and nothing else changes.
//!
//! ```no_run
//! use pinfeed_cuda::nvjpeg::{
//!     CropBox, DecoderOptions, ImageRequest, JpegDecoder, Layout, OutputSpec, OutputType,
//! };
//! use pinfeed_cuda::{Context, DevicePool, Event, Stream};
//!
//! # fn main() -> pinfeed_cuda::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! let pool = DevicePool::new(&ctx)?;
//! let spec = OutputSpec {
//!     height: 224,
//!     width: 224,
//!     layout: Layout::Nchw,
//!     dtype: OutputType::U8,
//!     antialias: true,
//! };
//! let mut decoder = JpegDecoder::new(&stream, &pool, spec, DecoderOptions::default())?;
//! let bytes = std::fs::read("photo.jpg").expect("a JPEG");
//! let out = pool.alloc_async(spec.image_bytes(), &stream)?;
//! let done = Event::new(&ctx)?;
//! let mut outcomes = Vec::new();
//! let images = [ImageRequest { offset: 0, len: bytes.len(), flip: false }];
//! // SAFETY: `bytes` and `out` outlive the work, which `done.synchronize()` waits for.
//! unsafe {
//!     decoder.decode_batch(&bytes, &images, &mut |_, info| CropBox::full(info.width, info.height),
//!         out.ptr(), out.len(), &done, &mut outcomes)?
//! };
//! done.synchronize()?;
//! assert!(outcomes[0].decoded());
//! # Ok(())
//! # }
//! ```

mod backend;
mod decoder;
mod ffi;
mod nvrtc;
mod reference;
mod resize;
mod types;

pub use crate::dynlib::LIBS_ENV;
pub use backend::{probe, NvjpegProbe};
pub use decoder::JpegDecoder;
pub use ffi::version;
pub use reference::crop_resize_reference;
pub use resize::{CropBox, Layout, OutputSpec, OutputType};
pub use types::{
    DecoderOptions, ImageInfo, ImageRequest, JpegBackend, JpegOutcome, DEFAULT_MAX_PIXELS,
    DEFAULT_SCRATCH_BYTES,
};
