//! Records for GPU decoding: each sample's compressed JPEG bytes with what the GPU needs to
//! turn them into the same output as the CPU path (the crop box and flip drawn from
//! `(seed, epoch, sample)` exactly as [`ImageSource`] draws them, and the label), read once by
//! the reader threads into the pinned slot; samples the GPU should not get (PNG, CMYK, a
//! header the JPEG parser refuses, over the pixel limit, more bytes than a record holds) are
//! decoded on the reader thread by the CPU path into the same record instead.
//!
//! A record is [`HEADER_BYTES`] of header, then the payload (`capacity` bytes, a multiple of 8
//! and at least the output image's bytes). All fields little-endian:
//!
//! | bytes   | field                                                                   |
//! |---------|-------------------------------------------------------------------------|
//! | 0..4    | kind: [`RecordKind::Jpeg`] (1) or [`RecordKind::Pixels`] (2)              |
//! | 4..8    | payload bytes used: the bitstream's length, or the CPU path's record's  |
//! | 8..16   | the record's index in the source (its place; the draws are its)         |
//! | 16..48  | crop box as f64: top, left, height, width (in the decoded image)         |
//! | 48..56  | the decoded image's width, height (u32; from the JPEG header)           |
//! | 56..60  | flip (u32: 0 or 1)                                                      |
//! | 60..64  | zero                                                                    |
//! | 64..72  | the label (i64)                                                         |
//!
//! For a `Pixels` record the crop fields are zero and the payload is the CPU path's record
//! (the output image with layout, crop and flip applied, padding, then the label).

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;

use super::{ImageSource, SCRATCH};
use crate::{DType, Layout, Result, Source, SourceError};

/// Bytes of a record's header.
pub const HEADER_BYTES: usize = 72;

/// Payload bytes a record holds by default: JPEGs larger than this (a few percent of
/// ImageNet's, whose mean is about 110 KiB) are decoded on the reader threads. A batch of 256
/// then takes just over 64 MiB of pinned memory: the default pinned budget (256 MiB) holds 3
/// slots, and `pinned_budget` must grow with larger batches.
pub const DEFAULT_CAPACITY: usize = 256 << 10;

/// What a record's payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A JPEG bitstream for the GPU decoder.
    Jpeg = 1,
    /// The output image, decoded on the CPU.
    Pixels = 2,
}

/// One record's header, parsed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordHeader {
    /// What the payload holds.
    pub kind: RecordKind,
    /// Payload bytes used.
    pub len: usize,
    /// The record's index in the source.
    pub place: u64,
    /// The crop box in the decoded image (a `Jpeg` record's).
    pub crop: super::CropBox,
    /// The decoded image's width and height (a `Jpeg` record's, from its header).
    pub image: (u32, u32),
    /// Whether the output is mirrored.
    pub flip: bool,
    /// The sample's label.
    pub label: i64,
}

impl RecordHeader {
    /// Parses the header at the start of `record`; the error says what is wrong (a record the
    /// source did not write).
    pub fn parse(record: &[u8]) -> std::result::Result<RecordHeader, String> {
        let head = record.get(..HEADER_BYTES).ok_or_else(|| {
            format!(
                "a compressed image record of {} bytes (the header alone is {HEADER_BYTES})",
                record.len()
            )
        })?;
        let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4"));
        let f64_at = |at: usize| f64::from_le_bytes(head[at..at + 8].try_into().expect("8"));
        let kind = match u32_at(0) {
            1 => RecordKind::Jpeg,
            2 => RecordKind::Pixels,
            other => return Err(format!("unknown compressed image record kind {other}")),
        };
        let len = u32_at(4) as usize;
        if HEADER_BYTES + len > record.len() {
            return Err(format!(
                "payload of {len} bytes in a record of {} bytes",
                record.len()
            ));
        }
        Ok(RecordHeader {
            kind,
            len,
            place: u64::from_le_bytes(head[8..16].try_into().expect("8")),
            crop: super::CropBox {
                top: f64_at(16),
                left: f64_at(24),
                height: f64_at(32),
                width: f64_at(40),
            },
            image: (u32_at(48), u32_at(52)),
            flip: u32_at(56) != 0,
            label: i64::from_le_bytes(head[64..72].try_into().expect("8")),
        })
    }

    fn write(&self, head: &mut [u8]) {
        let head = &mut head[..HEADER_BYTES];
        head.fill(0);
        head[0..4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        head[4..8].copy_from_slice(&(self.len as u32).to_le_bytes());
        head[8..16].copy_from_slice(&self.place.to_le_bytes());
        let c = &self.crop;
        for (at, v) in [(16, c.top), (24, c.left), (32, c.height), (40, c.width)] {
            head[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        head[48..52].copy_from_slice(&self.image.0.to_le_bytes());
        head[52..56].copy_from_slice(&self.image.1.to_le_bytes());
        head[56..60].copy_from_slice(&u32::from(self.flip).to_le_bytes());
        head[64..72].copy_from_slice(&self.label.to_le_bytes());
    }
}

/// An image dataset as records for GPU decoding (the module's documentation says how).
/// Record `i` carries sample `i` drawn as the wrapped [`ImageSource`] draws it, whose
/// [`read_records`](Source::read_records) is the CPU path for the same record.
#[derive(Debug)]
pub struct CompressedImageSource {
    images: ImageSource,
    capacity: usize,
    layout: Layout,
}

impl CompressedImageSource {
    /// Records of `images`' samples with `capacity` payload bytes each (rounded up to a
    /// multiple of 8, and to at least a record of the CPU path).
    pub fn new(images: ImageSource, capacity: usize) -> Result<CompressedImageSource> {
        let capacity = capacity
            .max(images.layout().record_bytes())
            .checked_next_multiple_of(8)
            .filter(|c| *c <= u32::MAX as usize)
            .ok_or_else(|| SourceError::Options {
                reason: format!(
                    "{}: a compressed record capacity of {capacity} bytes is over 4 GiB",
                    images.name()
                ),
            })?;
        let layout = Layout::new(DType::uint8(), vec![(HEADER_BYTES + capacity) as u64])?;
        Ok(CompressedImageSource {
            images,
            capacity,
            layout,
        })
    }

    /// The CPU path's source: its records are the output images and labels, and its
    /// `read_records(i, ..)` is record `i` decoded on the CPU (for bitstreams the GPU hands
    /// back).
    pub fn images(&self) -> &ImageSource {
        &self.images
    }

    /// Payload bytes a record holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Record `place`: the bitstream and its draws when the GPU can take it, else the CPU
    /// path's output image.
    fn fill(&self, place: u64, record: &mut [u8]) -> Result<()> {
        let (head, payload) = record.split_at_mut(HEADER_BYTES);
        let max_pixels = self.images.options.max_pixels;
        let jpeg = SCRATCH.with_borrow_mut(|scratch| -> Result<Option<RecordHeader>> {
            self.images.index.read(place, &mut scratch.compressed)?;
            let bytes = &scratch.compressed;
            let Some((w, h)) = gpu_jpeg_size(bytes, max_pixels) else {
                return Ok(None);
            };
            // A center crop that pads is the CPU path's: the GPU kernel fills the whole output.
            if bytes.len() > payload.len() || self.images.padding_of(w, h).is_some() {
                return Ok(None);
            }
            payload[..bytes.len()].copy_from_slice(bytes);
            let (crop, flip) = self.images.crop_of(place, w, h);
            Ok(Some(RecordHeader {
                kind: RecordKind::Jpeg,
                len: bytes.len(),
                place,
                crop,
                image: (w, h),
                flip,
                label: self.images.index.label(place),
            }))
        })?;
        let header = match jpeg {
            Some(header) => header,
            None => self.fill_pixels(place, payload)?,
        };
        header.write(head);
        Ok(())
    }

    /// Record `place` decoded by the CPU path into `payload` (its record: pixels, padding,
    /// label); its header.
    fn fill_pixels(&self, place: u64, payload: &mut [u8]) -> Result<RecordHeader> {
        let cpu_bytes = self.images.layout().record_bytes();
        self.images.read_records(place, &mut payload[..cpu_bytes])?;
        let label_at = self.images.label_offset();
        Ok(RecordHeader {
            kind: RecordKind::Pixels,
            len: cpu_bytes,
            place,
            crop: super::CropBox {
                top: 0.0,
                left: 0.0,
                height: 0.0,
                width: 0.0,
            },
            image: (0, 0),
            flip: false,
            label: i64::from_le_bytes(payload[label_at..cpu_bytes].try_into().expect("8 bytes")),
        })
    }
}

/// The size of a JPEG the GPU decoder can take (a parsable header of 1 or 3 colour components,
/// within `max_pixels`), or `None` for the CPU path (which decodes it or says what is wrong).
fn gpu_jpeg_size(bytes: &[u8], max_pixels: u64) -> Option<(u32, u32)> {
    if !bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return None;
    }
    let mut decoder = zune_jpeg::JpegDecoder::new(ZCursor::new(bytes));
    decoder.decode_headers().ok()?;
    let (w, h) = decoder.dimensions()?;
    let gpu_colours = matches!(
        decoder.input_colorspace()?,
        ColorSpace::YCbCr | ColorSpace::Luma | ColorSpace::RGB
    );
    let pixels = (w as u64).checked_mul(h as u64)?;
    (gpu_colours && w > 0 && h > 0 && pixels <= max_pixels)
        .then(|| Some((u32::try_from(w).ok()?, u32::try_from(h).ok()?)))
        .flatten()
}

impl Source for CompressedImageSource {
    fn name(&self) -> &str {
        self.images.name()
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.images.num_records()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        crate::check_request(self, first, dst.len())?;
        let record_bytes = self.layout.record_bytes();
        for (i, record) in (first..).zip(dst.chunks_exact_mut(record_bytes)) {
            self.fill(i, record)?;
        }
        Ok(())
    }

    fn reader_description(&self) -> String {
        "image bytes for GPU decoding (CPU decode for the rest)".into()
    }
}
