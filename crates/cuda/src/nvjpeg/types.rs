//! The types of [`JpegDecoder`](super::JpegDecoder)'s API, and the rules that sort images
//! between the GPU and the CPU.

use crate::error::CudaError;

/// Pillow's `Image.MAX_IMAGE_PIXELS`: larger images are refused, not decoded.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// Device memory for decoded images before the crop, by default: at most this much is held.
pub const DEFAULT_SCRATCH_BYTES: usize = 1 << 30;

/// Start of each decoded image in the scratch buffer, in bytes.
pub(crate) const ALIGN: usize = 256;

/// Which nvJPEG backend decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JpegBackend {
    /// The hardware decoder where the device has one and it supports the image, the GPU hybrid
    /// backend for the rest.
    Auto,
    /// As `Auto`, but a device without the hardware decoder is an error (for measuring it).
    Hardware,
    /// The GPU hybrid backend only (for measuring it, or on devices without the engines).
    Hybrid,
}

/// How a [`JpegDecoder`](super::JpegDecoder) is set up.
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// The backend choice.
    pub backend: JpegBackend,
    /// Images with more pixels than this are refused ([`JpegOutcome::Refused`]); at most
    /// `i32::MAX / 3`.
    pub max_pixels: u64,
    /// The most device memory held for decoded images before the crop; a batch needing more is
    /// decoded in parts. At least `3 * max_pixels` (one image of the largest size).
    pub scratch_bytes: usize,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            backend: JpegBackend::Auto,
            max_pixels: DEFAULT_MAX_PIXELS,
            scratch_bytes: DEFAULT_SCRATCH_BYTES,
        }
    }
}

/// One image of a batch: its bitstream's place in the batch's host bytes, and whether to
/// mirror it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRequest {
    /// Offset of the JPEG bitstream in the batch's host bytes.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
    /// Mirror the output horizontally.
    pub flip: bool,
}

/// What the header says about an image, handed to the crop callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Colour components: 1 (grayscale) or 3.
    pub components: u32,
}

/// What became of one image of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JpegOutcome {
    /// Decoded by the hardware JPEG engines; its output is written.
    Hardware,
    /// Decoded by the GPU hybrid backend; its output is written.
    Hybrid,
    /// Not decoded here (not a JPEG, CMYK, truncated, or nvJPEG refused it): its output is
    /// untouched and the caller decodes it on the CPU, whose decoder has the last word.
    Cpu {
        /// Why, in words.
        reason: String,
    },
    /// Larger than [`DecoderOptions::max_pixels`]: refused, output untouched.
    Refused {
        /// The size and the limit, in words.
        reason: String,
    },
}

impl JpegOutcome {
    /// Whether the image's output was written by the GPU.
    pub fn decoded(&self) -> bool {
        matches!(self, JpegOutcome::Hardware | JpegOutcome::Hybrid)
    }
}

/// Whether an nvJPEG error is about the bitstream (the image goes to the CPU) rather than a
/// fault of the library or device (an error of the batch).
pub(crate) fn about_the_image(e: &CudaError) -> bool {
    matches!(
        e,
        CudaError::Nvjpeg {
            status: 2..=4 | 9 | 10,
            ..
        }
    )
}

/// Why a bitstream is not for nvJPEG by its framing alone: no start-of-image marker (not a
/// JPEG), or no end-of-image marker near its end. nvJPEG may decode a truncated scan without
/// complaint, filling the rest; the CPU decoder reports it, so such a stream goes there. (The
/// marker cannot occur inside entropy-coded data, where every 0xFF byte is followed by 0x00 or
/// a restart marker; 64 bytes leave room for trailing padding.)
pub(crate) fn framing_problem(data: &[u8]) -> Option<&'static str> {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return Some("not a JPEG bitstream (no start-of-image marker)");
    }
    let tail = &data[data.len().saturating_sub(64)..];
    if !tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        return Some("no end-of-image marker at the end (truncated?)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvjpeg::ffi;

    #[test]
    fn image_faults_and_device_faults_are_told_apart() {
        let nv = |status| CudaError::Nvjpeg {
            call: "nvjpegDecodeBatched",
            status,
            name: ffi::status_name(status),
        };
        for status in [2, 3, 4, 9, 10] {
            assert!(about_the_image(&nv(status)), "{status}");
        }
        for status in [1, 5, 6, 7, 8] {
            assert!(!about_the_image(&nv(status)), "{status}");
        }
    }

    #[test]
    fn framing_sends_non_jpegs_and_truncated_streams_to_the_cpu() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../source/tests/fixtures/images");
        let read = |name: &str| std::fs::read(dir.join(name)).expect("fixture");
        for good in [
            "baseline.jpg",
            "progressive.jpg",
            "grayscale.jpg",
            "cmyk.jpg",
            "bomb.jpg",
        ] {
            assert_eq!(framing_problem(&read(good)), None, "{good}");
        }
        let truncated = framing_problem(&read("truncated.jpg")).expect("truncated");
        assert!(truncated.contains("end-of-image"), "{truncated}");
        for other in ["not_an_image.jpg", "rgb.png"] {
            let why = framing_problem(&read(other)).expect(other);
            assert!(why.contains("not a JPEG"), "{other}: {why}");
        }
        assert!(framing_problem(&[]).is_some());
        assert!(framing_problem(&[0xFF, 0xD8]).is_some());
    }
}
