//! Image datasets: JPEG and PNG images in the ImageFolder layout or in WebDataset tar shards,
//! decoded on the loader's reader threads into fixed-size records.
//!
//! [`ImageIndex`] lists the samples and their labels once; an [`ImageSource`] (one per epoch:
//! its random crops depend on it) is a [`Source`] whose record `i` is sample `i` read (its
//! compressed bytes, once), decoded to RGB ([`zune-jpeg`](zune_jpeg), [`png`]), cropped as
//! [`Crop`] says ([`random_resized_crop`]: torchvision's `RandomResizedCrop`, or
//! [`center_crop`]), resized with Pillow's bilinear filter (`fast_image_resize`), flipped
//! with probability ½ when asked, and written straight into the caller's memory (the pinned
//! slot) as uint8 HWC or CHW, followed by the label as a little-endian int64 at the next
//! multiple of 8 bytes ([`ImageSource::label_offset`]). The random draws are a pure function
//! of (seed, epoch, sample), so shuffling, sharding and resuming give the same pixels.
//!
//! For GPU decoding, a [`CompressedImageSource`] wraps an `ImageSource`: its records carry the
//! JPEG bytes with the same draws and the label, for the loader's copy side to decode.
//!
//! ```no_run
//! use std::sync::Arc;
//! use pinfeed_source::images::{ImageIndex, ImageOptions, ImageSource};
//! use pinfeed_source::Source;
//!
//! let index = Arc::new(ImageIndex::open("train/".as_ref(), false)?);
//! let source = ImageSource::new(index, ImageOptions { epoch: 3, ..ImageOptions::default() })?;
//! let mut record = vec![0u8; source.layout().record_bytes()];
//! source.read_records(0, &mut record)?; // 224 x 224 x 3 pixels, then the label
//! # Ok::<(), pinfeed_source::SourceError>(())
//! ```

mod compressed;
mod decode;
mod geometry;
mod index;
mod output;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use compressed::{
    CompressedImageSource, RecordHeader, RecordKind, DEFAULT_CAPACITY, HEADER_BYTES,
};
pub use decode::decode_rgb;
pub use geometry::{center_crop, center_padding, random_resized_crop, CropBox, Placement};
pub use index::{ImageIndex, IMAGE_EXTENSIONS, MAX_COMPRESSED_BYTES};

use crate::{DType, Layout, Result, Source, SourceError};

/// Pixels an image may have before it is refused undecoded: Pillow's `MAX_IMAGE_PIXELS`
/// (89,478,485, about 9459 x 9459), past which Pillow warns of a decompression bomb. A decoded
/// image takes 3 bytes a pixel on its reader thread (about 256 MiB at the limit).
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// Bytes of decoded pixels a reader thread keeps between images (a 4096 x 4096 RGB image); a
/// larger image's buffer is freed once it is resized, so rare huge images do not pin their
/// size on every thread.
const RETAINED_PIXEL_BYTES: usize = 4096 * 4096 * 3;

/// Failed samples in a row that `OnError::Skip` replaces before giving up.
const MAX_REPLACEMENTS: u64 = 64;

/// How the output image is cut from the decoded one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Crop {
    /// torchvision's `RandomResizedCrop(size, scale, ratio)`: a box of `scale` of the area
    /// and an aspect ratio in `ratio` (drawn log-uniformly), 10 attempts, then the center.
    RandomResized {
        /// Bounds of the box's share of the image's area; torchvision's default (0.08, 1).
        scale: (f64, f64),
        /// Bounds of the box's width over its height; torchvision's default (3/4, 4/3).
        ratio: (f64, f64),
    },
    /// torchvision's `Resize(resize)` then `CenterCrop(size)`: evaluation's transform.
    Center {
        /// The shorter side after resizing (256 for a 224 crop in ImageNet's recipe).
        resize: u32,
    },
}

impl Crop {
    /// Whether the resize filter reads only the crop box: `RandomResizedCrop` crops, then
    /// resizes the crop (its box is whole pixels); `Resize` then `CenterCrop` resizes the whole
    /// image and crops that, so the box (fractional, in source pixels) is sampled with its
    /// neighbours outside it, as torchvision does.
    pub fn filter_within_box(&self) -> bool {
        matches!(self, Crop::RandomResized { .. })
    }
}

/// The order of an output image's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelLayout {
    /// Height, width, channel (`channels_last`).
    Nhwc,
    /// Channel, height, width.
    Nchw,
}

/// What a sample that cannot be read or decoded does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// The read fails with an error naming the file.
    Raise,
    /// The sample is counted ([`ImageSource::skipped`], once each time it is read) and its
    /// place filled with the next sample of the dataset that decodes (the batch keeps its
    /// size), trying up to 64.
    Skip,
}

/// How an [`ImageSource`] makes its records.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// The crop.
    pub crop: Crop,
    /// Flip horizontally with probability ½ (torchvision's `RandomHorizontalFlip`).
    pub flip: bool,
    /// HWC or CHW.
    pub layout: PixelLayout,
    /// Bad samples: raise or skip.
    pub on_error: OnError,
    /// Images with more pixels are refused before decoding.
    pub max_pixels: u64,
    /// Seed of the random crops and flips.
    pub seed: u64,
    /// The epoch whose draws the records get.
    pub epoch: u64,
}

impl Default for ImageOptions {
    /// 224 x 224, `RandomResizedCrop` with torchvision's defaults, flipped, HWC, raising.
    fn default() -> ImageOptions {
        ImageOptions {
            height: 224,
            width: 224,
            crop: Crop::RandomResized {
                scale: (0.08, 1.0),
                ratio: (3.0 / 4.0, 4.0 / 3.0),
            },
            flip: true,
            layout: PixelLayout::Nhwc,
            on_error: OnError::Raise,
            max_pixels: DEFAULT_MAX_PIXELS,
            seed: 0,
            epoch: 0,
        }
    }
}

impl ImageOptions {
    /// Checks sizes and bounds; the error says which option is wrong.
    pub fn check(&self, name: &str) -> Result<()> {
        let refuse = |reason: String| {
            Err(SourceError::Options {
                reason: format!("{name}: {reason}"),
            })
        };
        if self.height == 0 || self.width == 0 || self.height > 8192 || self.width > 8192 {
            return refuse(format!(
                "image size {}x{} must be 1 to 8192 pixels a side",
                self.height, self.width
            ));
        }
        if self.max_pixels == 0 {
            return refuse("max_pixels must be at least 1".into());
        }
        match self.crop {
            Crop::RandomResized { scale, ratio } => {
                let ok = |(a, b): (f64, f64)| a.is_finite() && b.is_finite() && 0.0 < a && a <= b;
                if !ok(scale) || scale.1 > 1.0 || !ok(ratio) {
                    return refuse(format!(
                        "RandomResizedCrop needs 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] \
                         <= ratio[1] (found scale {scale:?}, ratio {ratio:?})"
                    ));
                }
            }
            Crop::Center { resize: 0 } => {
                return refuse("the center crop's resize must be at least 1".into())
            }
            Crop::Center { .. } => {}
        }
        Ok(())
    }
}

thread_local! {
    static SCRATCH: RefCell<output::Scratch> = RefCell::default();
}

/// An image dataset as records: see the [module](self) documentation.
#[derive(Debug)]
pub struct ImageSource {
    index: Arc<ImageIndex>,
    options: ImageOptions,
    layout: Layout,
    skipped: Arc<AtomicU64>,
}

impl ImageSource {
    /// The records of `index` under `options`, with a skipped-sample counter of its own.
    pub fn new(index: Arc<ImageIndex>, options: ImageOptions) -> Result<ImageSource> {
        ImageSource::with_counter(index, options, Arc::default())
    }

    /// As [`new`](ImageSource::new), counting skipped samples into `skipped` (shared by the
    /// sources of every epoch).
    pub fn with_counter(
        index: Arc<ImageIndex>,
        options: ImageOptions,
        skipped: Arc<AtomicU64>,
    ) -> Result<ImageSource> {
        options.check(index.name())?;
        let pixels = options.height as u64 * options.width as u64 * 3;
        let layout = Layout::new(DType::uint8(), vec![pixels.next_multiple_of(8) + 8])?;
        Ok(ImageSource {
            index,
            options,
            layout,
            skipped,
        })
    }

    /// Bytes of pixels at the start of a record.
    pub fn pixel_bytes(&self) -> usize {
        self.options.height as usize * self.options.width as usize * 3
    }

    /// Where in a record its label (little-endian int64) starts: the pixel bytes rounded up
    /// to a multiple of 8.
    pub fn label_offset(&self) -> usize {
        self.pixel_bytes().next_multiple_of(8)
    }

    /// The output image's height, width and layout.
    pub fn output_form(&self) -> (u32, u32, PixelLayout) {
        (self.options.height, self.options.width, self.options.layout)
    }

    /// The crop.
    pub fn crop(&self) -> Crop {
        self.options.crop
    }

    /// The dataset.
    pub fn index(&self) -> &Arc<ImageIndex> {
        &self.index
    }

    /// Samples skipped so far (with [`OnError::Skip`]), by every source sharing the counter.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The crop box of `sample` in an image of `width` x `height`, and whether it is flipped,
    /// under this source's seed and epoch: what [`read_records`](Source::read_records) uses.
    pub fn crop_of(&self, sample: u64, width: u32, height: u32) -> (CropBox, bool) {
        let o = &self.options;
        let mut rng = geometry::sample_rng(o.seed, o.epoch, sample);
        let crop = match o.crop {
            Crop::RandomResized { scale, ratio } => {
                random_resized_crop(width, height, scale, ratio, || geometry::unit(&mut rng))
            }
            Crop::Center { resize } => center_crop(width, height, resize, o.height, o.width),
        };
        // Drawn after the crop, as torchvision's flip follows its crop.
        let flip = o.flip && geometry::unit(&mut rng) < 0.5;
        (crop, flip)
    }

    /// Where the output's pixels lie when a center crop is larger than the resized image
    /// (the rest zero, as torchvision's `CenterCrop` pads); `None` when they fill the output.
    pub fn padding_of(&self, width: u32, height: u32) -> Option<Placement> {
        let o = &self.options;
        match o.crop {
            Crop::Center { resize } => center_padding(width, height, resize, o.height, o.width),
            Crop::RandomResized { .. } => None,
        }
    }

    /// Record `place` of a read: sample `sample`'s image (drawn as sample `place`) and label.
    fn decode_one(&self, sample: u64, place: u64, record: &mut [u8]) -> Result<()> {
        let (pixels, label_at) = (self.pixel_bytes(), self.label_offset());
        let failed = |reason: String| SourceError::Image {
            name: self.index.sample_name(sample),
            reason,
        };
        SCRATCH.with_borrow_mut(|scratch| {
            self.index.read(sample, &mut scratch.compressed)?;
            let (w, h) = decode::decode_rgb(
                &scratch.compressed,
                self.options.max_pixels,
                &mut scratch.decoded,
            )
            .map_err(failed)?;
            let (crop, flip) = self.crop_of(place, w, h);
            let target = output::Target {
                height: self.options.height,
                width: self.options.width,
                layout: self.options.layout,
                flip,
                within_box: self.options.crop.filter_within_box(),
                place: self.padding_of(w, h),
            };
            let written = output::write(scratch, w, h, crop, &target, &mut record[..pixels]);
            if scratch.decoded.capacity() > RETAINED_PIXEL_BYTES {
                scratch.decoded = Vec::new();
            }
            written.map_err(failed)
        })?;
        record[pixels..label_at].fill(0);
        record[label_at..].copy_from_slice(&self.index.label(sample).to_le_bytes());
        Ok(())
    }

    /// Record `i` into `record`, replacing a bad sample by the next good one when skipping.
    fn fill(&self, i: u64, record: &mut [u8]) -> Result<()> {
        let first = match self.decode_one(i, i, record) {
            Ok(()) => return Ok(()),
            Err(e) if self.options.on_error == OnError::Raise => return Err(e),
            Err(e) => e,
        };
        self.skipped.fetch_add(1, Ordering::Relaxed);
        let n = self.index.len();
        // A replacement that fails too is counted where it is read as itself, not here: each
        // bad sample counts once an epoch.
        for k in 1..=MAX_REPLACEMENTS.min(n - 1) {
            if self.decode_one((i + k) % n, i, record).is_ok() {
                return Ok(());
            }
        }
        Err(SourceError::Image {
            name: self.index.name().to_owned(),
            reason: format!(
                "sample {i} and the {} after it failed to decode (the first: {first})",
                MAX_REPLACEMENTS.min(n - 1)
            ),
        })
    }
}

impl Source for ImageSource {
    fn name(&self) -> &str {
        self.index.name()
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.index.len()
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
        "image decode (zune-jpeg, png; fast_image_resize)".into()
    }
}
