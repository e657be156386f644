//! [`JpegDecoder`]: a batch of JPEG bitstreams in host memory to a batch of fixed-size images in
//! device memory, on one stream.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use super::backend::Backend;
use super::ffi::{self, Image};
use super::resize::{CropBox, CropKernel, CropParams, OutputSpec};
use super::types::{
    about_the_image, framing_problem, DecoderOptions, ImageInfo, ImageRequest, JpegBackend,
    JpegOutcome, ALIGN,
};
use crate::context::Context;
use crate::error::{CudaError, Result};
use crate::memory::memcpy_htod_async;
use crate::pool::{DeviceBuffer, DevicePool};
use crate::stream::{Event, Stream};

/// An image headed for the GPU: where its bitstream and its decoded pixels are.
#[derive(Debug, Clone, Copy)]
struct Planned {
    index: usize,
    info: ImageInfo,
    crop: CropBox,
    hardware: bool,
    /// Offset of its decoded pixels in the scratch buffer (set per part).
    scratch_offset: usize,
}

impl Planned {
    fn decoded_bytes(&self) -> usize {
        (self.info.width as usize * self.info.height as usize * 3).next_multiple_of(ALIGN)
    }
}

/// Decodes batches of JPEG bitstreams with nvJPEG and crops, resizes, flips and lays them out
/// into a fixed-size output batch in device memory, all queued on one stream.
///
/// Memory is bounded and reused: the decoded images of a batch sit in one scratch buffer that
/// grows to at most [`DecoderOptions::scratch_bytes`] and is kept; nvJPEG's own buffers grow to
/// the largest image seen. In steady state a batch allocates no device memory.
pub struct JpegDecoder {
    ctx: Arc<Context>,
    stream: Stream,
    pool: Arc<DevicePool>,
    spec: OutputSpec,
    options: DecoderOptions,
    /// The hardware backend, when used: None for [`JpegBackend::Hybrid`] and on devices without
    /// the engines (`hardware_absent` says why).
    hardware: Option<Backend>,
    hardware_absent: Option<String>,
    hybrid: Backend,
    kernel: CropKernel,
    /// Decoded images before the crop; grows, never shrinks.
    scratch: Option<DeviceBuffer>,
    /// The kernel's per-image parameters; grows, never shrinks.
    params_dev: Option<DeviceBuffer>,
    // Per-batch host vectors, kept to reuse their capacity.
    planned: Vec<Planned>,
    group: Vec<Planned>,
    params: Vec<CropParams>,
    data: Vec<*const u8>,
    lengths: Vec<usize>,
    images: Vec<Image>,
}

// SAFETY: the raw pointers in the reusable vectors are only meaningful during one
// `decode_batch` call (cleared at its start); nvJPEG handles and the driver handles may be used
// from any thread, and `&mut self` keeps it to one thread at a time.
unsafe impl Send for JpegDecoder {}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder")
            .field("device", &self.ctx.ordinal())
            .field("spec", &self.spec)
            .field("options", &self.options)
            .field("hardware", &self.hardware.is_some())
            .finish_non_exhaustive()
    }
}

impl JpegDecoder {
    /// Loads nvJPEG and NVRTC, creates the backends and compiles the crop kernel for
    /// `stream`'s device. Output batches have the form `spec`.
    ///
    /// Fails with [`CudaError::LibraryMissing`] when `libnvjpeg` or `libnvrtc` cannot be found,
    /// and with [`CudaError::Unsupported`] for [`JpegBackend::Hardware`] on a device without
    /// the hardware decoder.
    pub fn new(
        stream: &Stream,
        pool: &Arc<DevicePool>,
        spec: OutputSpec,
        options: DecoderOptions,
    ) -> Result<JpegDecoder> {
        spec.validate()?;
        let one_image = usize::try_from(options.max_pixels.saturating_mul(3))
            .unwrap_or(usize::MAX)
            .next_multiple_of(ALIGN);
        // Row pitches and kernel indices are 32-bit: a row of 3-byte pixels must fit an i32.
        if options.max_pixels == 0 || options.max_pixels > (i32::MAX / 3) as u64 {
            return Err(CudaError::InvalidArgument {
                call: "JpegDecoder::new",
                detail: format!(
                    "max_pixels {} must be between 1 and {}",
                    options.max_pixels,
                    i32::MAX / 3
                ),
            });
        }
        if options.scratch_bytes < one_image {
            return Err(CudaError::InvalidArgument {
                call: "JpegDecoder::new",
                detail: format!(
                    "scratch_bytes {} must hold one image of max_pixels {} (3 bytes a pixel)",
                    options.scratch_bytes, options.max_pixels
                ),
            });
        }
        let api = ffi::api()?;
        let ctx = Arc::clone(stream.context());
        let kernel = CropKernel::load(&ctx)?;
        let _current = ctx.enter()?;
        let hybrid = Backend::create(&api, &ctx, ffi::BACKEND_GPU_HYBRID)?;
        let (hardware, hardware_absent) = match options.backend {
            JpegBackend::Hybrid => (None, Some("not asked for (backend=hybrid)".to_string())),
            JpegBackend::Auto | JpegBackend::Hardware => {
                match Backend::create(&api, &ctx, ffi::BACKEND_HARDWARE) {
                    Ok(b) => (Some(b), None),
                    Err(e) if options.backend == JpegBackend::Auto => (None, Some(e.to_string())),
                    Err(e) => {
                        return Err(CudaError::Unsupported {
                            detail: format!(
                                "the hardware JPEG decoder on cuda:{} ({e})",
                                ctx.ordinal()
                            ),
                        })
                    }
                }
            }
        };
        drop(_current);
        Ok(JpegDecoder {
            ctx,
            stream: stream.clone(),
            pool: Arc::clone(pool),
            spec,
            options,
            hardware,
            hardware_absent,
            hybrid,
            kernel,
            scratch: None,
            params_dev: None,
            planned: Vec::new(),
            group: Vec::new(),
            params: Vec::new(),
            data: Vec::new(),
            lengths: Vec::new(),
            images: Vec::new(),
        })
    }

    /// The stream all work is queued on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The output form.
    pub fn spec(&self) -> &OutputSpec {
        &self.spec
    }

    /// `(engines, cores per engine)` of the hardware decoder in use, or why it is not used.
    pub fn hardware(&self) -> std::result::Result<(u32, u32), String> {
        match (&self.hardware, &self.hardware_absent) {
            (Some(hw), _) => hw.hardware_info().map_err(|e| e.to_string()),
            (None, why) => Err(why.clone().unwrap_or_default()),
        }
    }

    /// Decodes the JPEG bitstreams `images` (ranges of `bytes`) into the output batch at `out`,
    /// image `i` at `i * spec.image_bytes()`, and records `done` on [`Self::stream`] after the
    /// last of the work. `crop(i, info)` picks image `i`'s crop box once its header is read (a
    /// box outside the image is an error); it is called only for images headed to the GPU.
    ///
    /// `outcomes` is cleared and gets one [`JpegOutcome`] per image; images not
    /// [`decoded`](JpegOutcome::decoded) have their output left untouched for the caller.
    /// Errors are reserved for bad arguments and runtime faults (driver, nvJPEG allocation or
    /// execution), never for a bad image. After an error `done` is not recorded and work may
    /// already be queued: synchronise [`Self::stream`] before reusing `bytes` or `out`.
    ///
    /// # Safety
    /// `bytes` (best page-locked: a ring slot) must stay valid and unmodified, and `out` must be
    /// device memory of `out_len` bytes of this decoder's context that nothing else touches,
    /// until `done` completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decode_batch(
        &mut self,
        bytes: &[u8],
        images: &[ImageRequest],
        crop: &mut dyn FnMut(usize, ImageInfo) -> CropBox,
        out: CUdeviceptr,
        out_len: usize,
        done: &Event,
        outcomes: &mut Vec<JpegOutcome>,
    ) -> Result<()> {
        let need = images.len().saturating_mul(self.spec.image_bytes());
        if out_len < need {
            return Err(bad_batch(format!(
                "output of {out_len} bytes; {} images of {} bytes need {need}",
                images.len(),
                self.spec.image_bytes()
            )));
        }
        let _current = self.ctx.enter()?;
        self.plan(bytes, images, crop, outcomes)?;
        let mut start = 0;
        while start < self.planned.len() {
            let mut end = start;
            let mut used = 0;
            while end < self.planned.len()
                && (end == start
                    || used + self.planned[end].decoded_bytes() <= self.options.scratch_bytes)
            {
                self.planned[end].scratch_offset = used;
                used += self.planned[end].decoded_bytes();
                end += 1;
            }
            // SAFETY: forwarded from this function's contract.
            unsafe { self.decode_part(bytes, images, start..end, used, out, outcomes)? };
            start = end;
        }
        done.record(&self.stream)
    }

    /// Reads each image's header and sorts it: to the GPU (into `self.planned`, with its crop
    /// box and backend), or to the CPU or refused (its outcome set here).
    fn plan(
        &mut self,
        bytes: &[u8],
        images: &[ImageRequest],
        crop: &mut dyn FnMut(usize, ImageInfo) -> CropBox,
        outcomes: &mut Vec<JpegOutcome>,
    ) -> Result<()> {
        outcomes.clear();
        self.planned.clear();
        for (index, req) in images.iter().enumerate() {
            let data = req
                .offset
                .checked_add(req.len)
                .and_then(|end| bytes.get(req.offset..end))
                .ok_or_else(|| {
                    bad_batch(format!(
                        "image {index}: bytes {}..+{} outside the batch's {} bytes",
                        req.offset,
                        req.len,
                        bytes.len()
                    ))
                })?;
            let info = match self.inspect(data)? {
                Ok(info) => info,
                Err(outcome) => {
                    outcomes.push(outcome);
                    continue;
                }
            };
            let bx = crop(index, info);
            if !bx.fits(info.width, info.height) {
                return Err(bad_batch(format!(
                    "image {index}: crop {bx:?} outside its {}x{} pixels",
                    info.width, info.height
                )));
            }
            let hardware = match self.hardware.as_mut() {
                // A header nvJPEG's hybrid parser read but the hardware one does not: hybrid.
                Some(hw) => hw.batched_supported(data).unwrap_or(false),
                None => false,
            };
            outcomes.push(if hardware {
                JpegOutcome::Hardware
            } else {
                JpegOutcome::Hybrid
            });
            self.planned.push(Planned {
                index,
                info,
                crop: bx,
                hardware,
                scratch_offset: 0,
            });
        }
        Ok(())
    }

    /// The header of one bitstream, or the outcome that keeps it off the GPU.
    fn inspect(&self, data: &[u8]) -> Result<std::result::Result<ImageInfo, JpegOutcome>> {
        let cpu = |reason: String| Ok(Err(JpegOutcome::Cpu { reason }));
        if let Some(reason) = framing_problem(data) {
            return cpu(reason.into());
        }
        let (components, css, width, height) = match self.hybrid.image_info(data) {
            Ok(v) => v,
            Err(CudaError::Nvjpeg { name, .. }) => {
                return cpu(format!("nvJPEG cannot read the header ({name})"))
            }
            Err(e) => return Err(e),
        };
        if components != 1 && components != 3 {
            return cpu(format!(
                "{components} colour components (CMYK or YCCK): converted on the CPU"
            ));
        }
        if css == ffi::CSS_UNKNOWN {
            return cpu("a chroma subsampling nvJPEG does not know".into());
        }
        let (Ok(w), Ok(h)) = (u32::try_from(width), u32::try_from(height)) else {
            return cpu(format!("header says {width}x{height} pixels"));
        };
        if w == 0 || h == 0 {
            return cpu(format!("header says {w}x{h} pixels"));
        }
        let pixels = u64::from(w) * u64::from(h);
        if pixels > self.options.max_pixels {
            return Ok(Err(JpegOutcome::Refused {
                reason: format!(
                    "{w}x{h} is {pixels} pixels, over the limit of {}",
                    self.options.max_pixels
                ),
            }));
        }
        Ok(Ok(ImageInfo {
            width: w,
            height: h,
            components: components as u32,
        }))
    }

    /// Grows a kept buffer to at least `bytes`; never shrinks it.
    fn ensure(&self, buf: &mut Option<DeviceBuffer>, bytes: usize, cap: usize) -> Result<()> {
        if buf.as_ref().is_some_and(|b| b.len() >= bytes) {
            return Ok(());
        }
        let old = buf.as_ref().map_or(0, |b| b.len());
        let size = bytes.max(old.saturating_mul(2).min(cap));
        // The old buffer's free is stream-ordered after the work that used it.
        *buf = None;
        *buf = Some(self.pool.alloc_async(size, &self.stream)?);
        Ok(())
    }

    /// Decodes `self.planned[range]` (whose scratch offsets start at 0 and end at `used`) and
    /// runs the crop kernel over those that decoded.
    ///
    /// # Safety
    /// As for [`Self::decode_batch`].
    unsafe fn decode_part(
        &mut self,
        bytes: &[u8],
        images: &[ImageRequest],
        range: std::ops::Range<usize>,
        used: usize,
        out: CUdeviceptr,
        outcomes: &mut [JpegOutcome],
    ) -> Result<()> {
        let mut scratch = self.scratch.take();
        let grown = self.ensure(&mut scratch, used, self.options.scratch_bytes);
        self.scratch = scratch;
        grown?;
        let base = self.scratch.as_ref().map_or(0, |b| b.ptr());
        for hardware in [true, false] {
            let mut group = std::mem::take(&mut self.group);
            group.clear();
            group.extend(
                self.planned[range.clone()]
                    .iter()
                    .filter(|p| p.hardware == hardware),
            );
            let decoded = if group.is_empty() {
                Ok(())
            } else {
                // SAFETY: the bitstreams lie in `bytes` (checked in `plan`) and each destination
                // in the scratch buffer (`used` bytes from `base`, sized above); both stay valid
                // until the stream's work completes by this function's contract and the
                // buffer's stream-ordered free.
                unsafe { self.decode_group(bytes, images, &group, base, hardware, outcomes) }
            };
            self.group = group;
            decoded?;
        }
        self.params.clear();
        for p in &self.planned[range] {
            if !outcomes[p.index].decoded() {
                continue;
            }
            let window = p.crop.window_or_box();
            self.params.push(CropParams {
                src: base + p.scratch_offset as u64,
                pitch: (p.info.width * 3) as i32,
                crop_x: p.crop.x as i32,
                crop_y: p.crop.y as i32,
                crop_w: p.crop.width as i32,
                crop_h: p.crop.height as i32,
                flip: i32::from(images[p.index].flip),
                out_index: p.index as i32,
                win_x: window[0],
                win_y: window[1],
                win_w: window[2],
                win_h: window[3],
                pad: 0,
            });
        }
        if self.params.is_empty() {
            return Ok(());
        }
        let param_bytes = std::mem::size_of_val(self.params.as_slice());
        let mut params_dev = self.params_dev.take();
        let grown = self.ensure(&mut params_dev, param_bytes, usize::MAX);
        self.params_dev = params_dev;
        grown?;
        let params_ptr = self.params_dev.as_ref().map_or(0, |b| b.ptr());
        // SAFETY: the destination holds `param_bytes` (sized above). The source is pageable
        // memory, which the driver copies into its staging buffer before the call returns
        // (CUDA's "API synchronization behavior"), so reusing `self.params` afterwards is safe.
        unsafe {
            memcpy_htod_async(
                params_ptr,
                self.params.as_ptr().cast(),
                param_bytes,
                &self.stream,
            )?
        };
        // SAFETY: the params name decoded images inside the scratch buffer and output slots
        // `out_index < images.len()`, inside `out` (checked in `decode_batch`).
        unsafe {
            self.kernel
                .launch(&self.stream, params_ptr, self.params.len(), out, &self.spec)
        }
    }

    /// Decodes one backend's share of a part with one batched call; when nvJPEG refuses the
    /// batch for its content (or the hardware engines refuse it at all), decodes each image
    /// alone on the hybrid backend, and the images refused again go to the CPU.
    ///
    /// # Safety
    /// As for [`Self::decode_part`].
    unsafe fn decode_group(
        &mut self,
        bytes: &[u8],
        images: &[ImageRequest],
        group: &[Planned],
        base: CUdeviceptr,
        hardware: bool,
        outcomes: &mut [JpegOutcome],
    ) -> Result<()> {
        self.data.clear();
        self.lengths.clear();
        self.images.clear();
        for p in group {
            let req = images[p.index];
            self.data.push(bytes[req.offset..].as_ptr());
            self.lengths.push(req.len);
            self.images.push(Image::interleaved(
                base + p.scratch_offset as u64,
                p.info.width as usize * 3,
            ));
        }
        let backend = match (hardware, self.hardware.as_mut()) {
            (true, Some(hw)) => hw,
            _ => &mut self.hybrid,
        };
        // SAFETY: forwarded from this function's contract (see `decode_part`).
        let whole = unsafe {
            backend.decode_batched(&self.data, &self.lengths, &mut self.images, &self.stream)
        };
        match whole {
            Ok(()) => return Ok(()),
            // Any nvJPEG status from the hardware engines is retried on the hybrid backend: a
            // device fault fails there again and is returned below.
            Err(CudaError::Nvjpeg { .. }) if hardware => {}
            Err(e) if !about_the_image(&e) => return Err(e),
            Err(_) => {}
        }
        for (k, p) in group.iter().enumerate() {
            // SAFETY: as above, for one image.
            let one = unsafe {
                self.hybrid.decode_batched(
                    &self.data[k..=k],
                    &self.lengths[k..=k],
                    &mut self.images[k..=k],
                    &self.stream,
                )
            };
            outcomes[p.index] = match one {
                Ok(()) => JpegOutcome::Hybrid,
                Err(e) if about_the_image(&e) => JpegOutcome::Cpu {
                    reason: format!("nvJPEG refused it: {e}"),
                },
                Err(e) => return Err(e),
            };
        }
        Ok(())
    }
}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // nvJPEG's handles and the scratch buffer must outlive the work queued with them.
        let _ = self.stream.synchronize();
    }
}

fn bad_batch(detail: String) -> CudaError {
    CudaError::InvalidArgument {
        call: "JpegDecoder::decode_batch",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoded_images_are_aligned() {
        let p = Planned {
            index: 0,
            info: ImageInfo {
                width: 3,
                height: 1,
                components: 3,
            },
            crop: CropBox::full(3, 1),
            hardware: false,
            scratch_offset: 0,
        };
        assert_eq!(p.decoded_bytes(), ALIGN);
    }
}
