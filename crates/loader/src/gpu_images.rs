//! GPU decoding of image batches (`decode="gpu"`): the copy thread turns a slot of
//! [`CompressedImageSource`] records into the batch's device memory with nvJPEG
//! ([`JpegDecoder`]) on the copy stream, in place of the plain copy (the loader's delivery for
//! these batches, chosen when it starts).
//!
//! A delivered batch of `count` images is planar: image `i` (the CPU path's pixels, layout and
//! form) at `i * pixel_bytes`, then the labels (int64) from
//! [`labels_offset(count)`](GpuImageDecode::labels_offset): the decoder writes images back to
//! back. Per slot the copy thread
//! 1. reads each record's header (the reader thread wrote the crop box, flip and label drawn as
//!    the CPU path draws them),
//! 2. issues [`JpegDecoder::decode_batch`] over the slot's bitstreams (records the reader
//!    decoded on the CPU get an empty request, which the decoder hands back untouched),
//! 3. copies the CPU-decoded records' pixels into their places; bitstreams the decoder hands
//!    back (truncated, a header nvJPEG refuses) are decoded here by the CPU path into their
//!    own record's payload (nothing reads it on the device: the decoder declined it) and
//!    copied from there, with the CPU path's `on_error` policy and label,
//! 4. gathers the labels into the slot's tail and copies them in one piece,
//!
//! then the slot's fence is an event recorded after all of it on the copy stream: the ring
//! reuses the slot only once the decoder, the pixel copies and the label copy are done.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pinfeed_cuda::nvjpeg::{
    CropBox, DecoderOptions, ImageRequest, JpegBackend, JpegDecoder, JpegOutcome, Layout,
    OutputSpec, OutputType,
};
use pinfeed_cuda::{DevicePool, EventPool, Stream};
use pinfeed_source::images::{
    CompressedImageSource, PixelLayout, RecordHeader, RecordKind, HEADER_BYTES,
};
use pinfeed_source::Source;

use crate::error::{LoaderError, Result};

/// Decodes a [`CompressedImageSource`]'s records on the GPU: give it as
/// [`LoaderOptions::gpu_images`](crate::LoaderOptions::gpu_images) with the same source.
pub struct GpuImageDecode {
    source: Arc<CompressedImageSource>,
    backend: JpegBackend,
    /// Made on the first batch, on the copy stream (the copy thread is its only user).
    decoder: Mutex<Option<JpegDecoder>>,
    outcomes: Mutex<Vec<JpegOutcome>>,
    /// Images decoded on the GPU, and those the copy thread decoded on the CPU.
    on_gpu: AtomicU64,
    on_cpu: AtomicU64,
}

impl std::fmt::Debug for GpuImageDecode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuImageDecode")
            .field("source", &self.source.name())
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl GpuImageDecode {
    /// Decoding of `source`'s records with nvJPEG's `backend`.
    pub fn new(source: Arc<CompressedImageSource>, backend: JpegBackend) -> GpuImageDecode {
        GpuImageDecode {
            source,
            backend,
            decoder: Mutex::new(None),
            outcomes: Mutex::new(Vec::new()),
            on_gpu: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
        }
    }

    /// The records it decodes.
    pub fn source(&self) -> &Arc<CompressedImageSource> {
        &self.source
    }

    /// Bytes of a delivered batch per image: the CPU path's record (pixels, padding, label).
    pub fn output_record_bytes(&self) -> usize {
        self.source.images().layout().record_bytes()
    }

    /// Bytes of one output image.
    pub fn pixel_bytes(&self) -> usize {
        self.source.images().pixel_bytes()
    }

    /// Where the labels of a delivered batch of `count` images start.
    pub fn labels_offset(&self, count: usize) -> usize {
        count * self.source.images().label_offset()
    }

    /// Images decoded so far on the GPU, and on the CPU (by the readers or the copy thread).
    pub fn decoded(&self) -> (u64, u64) {
        (
            self.on_gpu.load(Ordering::Relaxed),
            self.on_cpu.load(Ordering::Relaxed),
        )
    }

    /// The kernel's output: the CPU path's size and layout, uint8, resized with Pillow's
    /// (antialiased) bilinear filter.
    pub fn output_spec(&self) -> OutputSpec {
        let images = self.source.images();
        let (height, width, layout) = images.output_form();
        OutputSpec {
            height,
            width,
            layout: match layout {
                PixelLayout::Nhwc => Layout::Nhwc,
                PixelLayout::Nchw => Layout::Nchw,
            },
            dtype: OutputType::U8,
            // Pillow's bilinear filter widens when shrinking, as the CPU path's resize does.
            antialias: true,
        }
    }

    /// Issues the decode of the `count` records at the start of `slot` into the batch's device
    /// memory at `out` (`count * output_record_bytes()` bytes) on `stream`; the labels are
    /// gathered into `slot[labels_at ..]` first. Returns once everything is queued; the caller
    /// records the slot's fence on `stream` after it.
    ///
    /// # Safety
    /// `slot` is page-locked memory of this stream's context that nothing else reads or writes
    /// until that fence completes; `out` is device memory of `count * output_record_bytes()`
    /// bytes that nothing reads until then.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn issue(
        &self,
        stream: &Stream,
        pool: &Arc<DevicePool>,
        events: &Arc<EventPool>,
        slot: &mut [u8],
        count: usize,
        labels_at: usize,
        out: u64,
    ) -> Result<()> {
        let (pix, label_offset) = (self.pixel_bytes(), self.labels_offset(count));
        let (headers, requests) = self.requests(slot, count)?;
        let mut decoder = self.decoder.lock().unwrap_or_else(|p| p.into_inner());
        if decoder.is_none() {
            let options = DecoderOptions {
                backend: self.backend,
                ..DecoderOptions::default()
            };
            *decoder = Some(JpegDecoder::new(stream, pool, self.output_spec(), options)?);
        }
        let decoder = decoder.as_mut().expect("made above");
        let mut crop = |i: usize, info: pinfeed_cuda::nvjpeg::ImageInfo| {
            self.crop_box(&headers[i], info.width, info.height)
        };
        let done = events.get()?;
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the slot and `out` are as the decoder needs them until the caller's fence,
        // recorded on the same stream after `done` (this function's contract); the images
        // (`count * pix` bytes) lie inside `out`.
        unsafe {
            decoder.decode_batch(
                slot,
                &requests,
                &mut crop,
                out,
                count * pix,
                &done,
                &mut outcomes,
            )?
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.place_cpu_images(stream, slot, &headers, &outcomes, labels_at, out)? };
        // SAFETY: the labels lie in the slot's tail (kept until the caller's fence); their
        // place, `count * 8` bytes at `label_offset`, ends at `count * output_record_bytes()`.
        unsafe {
            pinfeed_cuda::memcpy_htod_async(
                out + label_offset as u64,
                slot[labels_at..].as_ptr(),
                count * 8,
                stream,
            )?
        };
        Ok(())
    }

    /// The crop box the kernel gets for the record with header `head`, whose image nvJPEG
    /// reads as `width` x `height`: the one the reader drew, sampled as the CPU path samples it
    /// (a random crop: its whole pixels, the filter reading only those; a center crop: a
    /// window of the whole image, see [`Crop::filter_within_box`]).
    ///
    /// [`Crop::filter_within_box`]: pinfeed_source::images::Crop::filter_within_box
    pub fn crop_box(&self, head: &RecordHeader, width: u32, height: u32) -> CropBox {
        let images = self.source.images();
        let bx = if head.image == (width, height) {
            head.crop
        } else {
            // nvJPEG read other dimensions than the reader's parser: draw for those.
            images.crop_of(head.place, width, height).0
        };
        if images.crop().filter_within_box() {
            whole_pixels(bx, width, height)
        } else {
            window_of_image(bx, width, height)
        }
    }

    /// Each record's header, and its request to the decoder (an empty one, which the decoder
    /// hands back untouched, for a record the reader decoded on the CPU).
    fn requests(
        &self,
        slot: &[u8],
        count: usize,
    ) -> Result<(Vec<RecordHeader>, Vec<ImageRequest>)> {
        let rb = self.source.layout().record_bytes();
        let mut headers = Vec::with_capacity(count);
        let mut requests = Vec::with_capacity(count);
        for i in 0..count {
            let head = RecordHeader::parse(&slot[i * rb..(i + 1) * rb]).map_err(|reason| {
                LoaderError::Config(format!("{}: record {i}: {reason}", self.source.name()))
            })?;
            let jpeg = head.kind == RecordKind::Jpeg;
            requests.push(ImageRequest {
                offset: i * rb + HEADER_BYTES,
                len: if jpeg { head.len } else { 0 },
                flip: head.flip,
            });
            headers.push(head);
        }
        Ok((headers, requests))
    }

    /// Copies the images the GPU did not decode into their places in `out` (those the reader
    /// decoded, and those the decoder declined, decoded here by the CPU path over their own
    /// payload, which nothing on the device reads), and gathers every label into the slot's
    /// tail at `labels_at`.
    ///
    /// # Safety
    /// As for [`issue`](Self::issue), after the decoder's work was queued with `outcomes`.
    unsafe fn place_cpu_images(
        &self,
        stream: &Stream,
        slot: &mut [u8],
        headers: &[RecordHeader],
        outcomes: &[JpegOutcome],
        labels_at: usize,
        out: u64,
    ) -> Result<()> {
        let images = self.source.images();
        let rb = self.source.layout().record_bytes();
        let (pix, label_at) = (self.pixel_bytes(), images.label_offset());
        let cpu_bytes = self.output_record_bytes();
        let mut on_gpu = 0;
        for (i, (head, outcome)) in headers.iter().zip(outcomes).enumerate() {
            if outcome.decoded() {
                on_gpu += 1;
                self.put_label(slot, labels_at, i, head.label);
                continue;
            }
            let record = &mut slot[i * rb + HEADER_BYTES..(i + 1) * rb];
            if head.kind == RecordKind::Jpeg {
                // Raising or skipping as the CPU path would.
                images.read_records(head.place, &mut record[..cpu_bytes])?;
            }
            let label = i64::from_le_bytes(record[label_at..label_at + 8].try_into().expect("8"));
            // SAFETY: the pixels lie in the slot (kept until the caller's fence) and image
            // `i`'s place lies inside `out`.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    out + (i * pix) as u64,
                    record.as_ptr(),
                    pix,
                    stream,
                )?
            };
            self.on_cpu.fetch_add(1, Ordering::Relaxed);
            self.put_label(slot, labels_at, i, label);
        }
        self.on_gpu.fetch_add(on_gpu, Ordering::Relaxed);
        Ok(())
    }

    fn put_label(&self, slot: &mut [u8], labels_at: usize, i: usize, label: i64) {
        slot[labels_at + 8 * i..labels_at + 8 * (i + 1)].copy_from_slice(&label.to_le_bytes());
    }
}

/// Where images are decoded: `decode="cpu"`, `"gpu"` or `"auto"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decode {
    /// On the reader threads.
    Cpu,
    /// With nvJPEG on the device, by the copy thread.
    Gpu,
}

impl Decode {
    /// What `decode` asks for on `device`: `"gpu"` is the GPU whatever the device (the loader
    /// refuses it on the host backend, saying so). `"auto"` is the CPU on the host backend or
    /// where nvJPEG does not load (`gpu_decoder` says why); on a CUDA device with nvJPEG it is
    /// the faster on the dataset, as `measure(ordinal)` finds
    /// ([`decode_rates`](crate::decode_auto::decode_rates); the CPU if that fails, saying
    /// why). Returns the choice and why, in words.
    pub fn resolve(
        decode: &str,
        device: crate::DeviceSpec,
        gpu_decoder: std::result::Result<(), String>,
        measure: impl FnOnce(usize) -> Result<crate::DecodeRates>,
    ) -> Result<(Decode, String)> {
        match decode {
            "cpu" => Ok((Decode::Cpu, "cpu: as asked".into())),
            "gpu" => Ok((Decode::Gpu, "gpu: as asked".into())),
            "auto" => Ok(match (device.resolve(), gpu_decoder) {
                (crate::DeviceSpec::Cuda(n), Ok(())) => match measure(n) {
                    Ok(rates) => rates.choice(),
                    Err(e) => (
                        Decode::Cpu,
                        format!("cpu: the decoders could not be timed on cuda:{n}: {e}"),
                    ),
                },
                (crate::DeviceSpec::Cuda(_), Err(why)) => {
                    (Decode::Cpu, format!("cpu: no GPU decoder ({why})"))
                }
                _ => (Decode::Cpu, "cpu: batches go to the host backend".into()),
            }),
            other => Err(LoaderError::Config(format!(
                "unknown decode {other:?}: expected cpu, gpu or auto"
            ))),
        }
    }

    /// Whether nvJPEG loads here, or why not: what [`resolve`](Decode::resolve) takes.
    pub fn gpu_decoder_present() -> std::result::Result<(), String> {
        pinfeed_cuda::nvjpeg::version()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// The CPU path's crop box in whole pixels, inside a `width` x `height` image (random crops are
/// whole already; a center crop's fractional edges are rounded).
pub(crate) fn whole_pixels(
    bx: pinfeed_source::images::CropBox,
    width: u32,
    height: u32,
) -> CropBox {
    let x = (bx.left.round().max(0.0) as u32).min(width - 1);
    let y = (bx.top.round().max(0.0) as u32).min(height - 1);
    let w = (bx.width.round().max(1.0) as u32).min(width - x);
    let h = (bx.height.round().max(1.0) as u32).min(height - y);
    CropBox {
        x,
        y,
        width: w,
        height: h,
        window: None,
    }
}

/// A fractional crop box as a window of the whole `width` x `height` image, kept inside it.
pub(crate) fn window_of_image(
    bx: pinfeed_source::images::CropBox,
    width: u32,
    height: u32,
) -> CropBox {
    let axis = |start: f64, size: f64, room: u32| {
        let room = f64::from(room);
        let start = start.clamp(0.0, room - 1.0);
        // At least a thousandth of a pixel, and inside the image in f32 too.
        let size = size.clamp(1e-3, room - start);
        let (start, size) = (start as f32, size as f32);
        (start, size.min(room as f32 - start))
    };
    let (left, w) = axis(bx.left, bx.width, width);
    let (top, h) = axis(bx.top, bx.height, height);
    CropBox {
        window: Some([left, top, w, h]),
        ..CropBox::full(width, height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinfeed_source::images::CropBox as Box64;

    fn rates(ordinal: usize, cpu: f64, gpu: f64) -> Result<crate::DecodeRates> {
        Ok(crate::DecodeRates {
            dataset: "train".into(),
            ordinal,
            images: 512,
            cpu_images_per_s: cpu,
            gpu_images_per_s: gpu,
        })
    }

    #[test]
    fn auto_measures_on_a_cuda_device_with_nvjpeg_only() {
        use crate::DeviceSpec;
        let unmeasured = |_: usize| -> Result<crate::DecodeRates> {
            panic!("measured where it should not have been")
        };
        let pick = |decode, device, present: std::result::Result<(), String>| {
            Decode::resolve(decode, device, present, unmeasured).map(|(d, _)| d)
        };
        let absent = || Err("libnvjpeg not found".to_string());
        let faster = Decode::resolve("auto", DeviceSpec::Cuda(0), Ok(()), |n| {
            rates(n, 3000.0, 9000.0)
        });
        let (d, why) = faster.unwrap();
        assert_eq!(d, Decode::Gpu, "{why}");
        assert!(why.contains("nvJPEG on cuda:0 9000 images/s"), "{why}");
        let slower = Decode::resolve("auto", DeviceSpec::Cuda(2), Ok(()), |n| {
            rates(n, 7705.0, 3401.0)
        });
        assert_eq!(slower.unwrap().0, Decode::Cpu);
        let failed = Decode::resolve("auto", DeviceSpec::Cuda(0), Ok(()), |_| {
            Err(LoaderError::Config("train: 3 images are too few".into()))
        });
        let (d, why) = failed.unwrap();
        assert_eq!(d, Decode::Cpu);
        assert!(
            why.contains("could not be timed on cuda:0: train: 3 images"),
            "{why}"
        );
        assert_eq!(
            pick("auto", DeviceSpec::Cuda(0), absent()).unwrap(),
            Decode::Cpu
        );
        assert_eq!(pick("auto", DeviceSpec::Cpu, Ok(())).unwrap(), Decode::Cpu);
        let (_, why) = Decode::resolve("auto", DeviceSpec::Cuda(1), absent(), unmeasured).unwrap();
        assert!(why.contains("libnvjpeg not found"), "{why}");
        assert_eq!(pick("gpu", DeviceSpec::Cpu, absent()).unwrap(), Decode::Gpu);
        assert_eq!(
            pick("cpu", DeviceSpec::Cuda(0), Ok(())).unwrap(),
            Decode::Cpu
        );
        let err = pick("nvjpeg", DeviceSpec::Cpu, Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpu, gpu or auto"), "{err}");
    }

    #[test]
    fn crop_boxes_become_whole_pixels_inside_the_image() {
        let b = |left, top, width, height| Box64 {
            top,
            left,
            height,
            width,
        };
        // A random crop is whole already.
        let whole = whole_pixels(b(10.0, 20.0, 100.0, 50.0), 500, 375);
        assert_eq!(
            (whole.x, whole.y, whole.width, whole.height),
            (10, 20, 100, 50)
        );
        // A center crop's fractional box is rounded and kept inside.
        let c = whole_pixels(b(84.97, 23.43, 328.4, 328.1), 500, 375);
        assert_eq!((c.x, c.y, c.width, c.height), (85, 23, 328, 328));
        let edge = whole_pixels(b(499.6, 374.7, 5.0, 5.0), 500, 375);
        assert!(edge.fits(500, 375), "{edge:?}");
        assert!(whole_pixels(b(0.0, 0.0, 0.2, 0.2), 1, 1).fits(1, 1));
    }

    #[test]
    fn center_crops_become_windows_of_the_whole_image() {
        let b = |left, top, width, height| Box64 {
            top,
            left,
            height,
            width,
        };
        let w = window_of_image(b(84.97, 23.43, 328.4, 328.1), 500, 375);
        assert_eq!((w.x, w.y, w.width, w.height), (0, 0, 500, 375));
        assert_eq!(w.window, Some([84.97, 23.43, 328.4, 328.1]));
        assert!(w.fits(500, 375));
        // Rounding past the edge is kept inside.
        let edge = window_of_image(b(100.0, 0.0, 400.000_000_1, 375.000_01), 500, 375);
        assert!(edge.fits(500, 375), "{edge:?}");
        assert!(window_of_image(b(0.0, 0.0, 0.0, 1.0), 1, 1).fits(1, 1));
    }
}
