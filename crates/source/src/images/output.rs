//! A decoded image to the slot: the crop box resized to the output size with Pillow's
//! bilinear filter (antialiased when shrinking, as torchvision's `RandomResizedCrop` on PIL
//! images does), flipped if drawn so, in HWC or CHW order.
//!
//! Where the filter may read is torchvision's order of operations: `RandomResizedCrop` crops,
//! then resizes the crop, so the filter reads only the box (pixels next to its edges weigh
//! nothing); `Resize` then `CenterCrop` resizes the whole image, then crops, so the box's edge
//! pixels blend in their neighbours outside it (fast_image_resize's fractional crop, as
//! Pillow's `resize(box=...)`). The GPU kernel follows the same rule
//! (`pinfeed_cuda::nvjpeg::CropBox`).

use fast_image_resize as fr;

use super::geometry::{CropBox, Placement};
use super::PixelLayout;

/// Per-thread buffers, reused from image to image.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The compressed bytes.
    pub(crate) compressed: Vec<u8>,
    /// The decoded RGB image.
    pub(crate) decoded: Vec<u8>,
    /// The resized image in HWC order, when the slot wants CHW.
    resized: Vec<u8>,
    /// The resized image before it is placed in a padded output.
    inner: Vec<u8>,
    resizer: fr::Resizer,
}

/// What to write: the output size, the layout, and whether to flip.
pub(crate) struct Target {
    pub(crate) height: u32,
    pub(crate) width: u32,
    pub(crate) layout: PixelLayout,
    pub(crate) flip: bool,
    /// The filter reads only the crop box (whole pixels): crop, then resize. Else the whole
    /// image: resize, then crop.
    pub(crate) within_box: bool,
    /// Where the box lands when it does not fill the output (the rest zero): a center crop
    /// larger than the resized image, padded as torchvision pads it.
    pub(crate) place: Option<Placement>,
}

/// Resizes `crop` of the `width` x `height` RGB image in `scratch.decoded` into `dst`
/// (exactly `target.height * target.width * 3` bytes).
pub(crate) fn write(
    scratch: &mut Scratch,
    width: u32,
    height: u32,
    crop: CropBox,
    target: &Target,
    dst: &mut [u8],
) -> Result<(), String> {
    let Scratch {
        decoded,
        resized,
        inner,
        resizer,
        ..
    } = scratch;
    let (ow, oh) = (target.width as usize, target.height as usize);
    debug_assert_eq!(dst.len(), ow * oh * 3);
    let src = fr::images::ImageRef::new(width, height, decoded, fr::PixelType::U8x3)
        .map_err(|e| format!("decoded image of unexpected size: {e}"))?;
    let hwc: &mut [u8] = match target.layout {
        PixelLayout::Nhwc => dst,
        PixelLayout::Nchw => {
            resized.resize(ow * oh * 3, 0);
            resized
        }
    };
    // With padding the box is resized into `inner` and placed in the zeroed output after.
    let (iw, ih) = target
        .place
        .map_or((target.width, target.height), |p| (p.width, p.height));
    let into: &mut [u8] = match target.place {
        None => hwc,
        Some(_) => {
            inner.resize(iw as usize * ih as usize * 3, 0);
            inner
        }
    };
    let mut out = fr::images::Image::from_slice_u8(iw, ih, into, fr::PixelType::U8x3)
        .map_err(|e| format!("output buffer: {e}"))?;
    let options =
        fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear));
    let done = if target.within_box {
        debug_assert!([crop.left, crop.top, crop.width, crop.height]
            .iter()
            .all(|v| v.fract() == 0.0));
        let boxed = fr::images::CroppedImage::new(
            &src,
            crop.left as u32,
            crop.top as u32,
            crop.width as u32,
            crop.height as u32,
        )
        .map_err(|e| format!("crop box {crop:?}: {e}"))?;
        resizer.resize(&boxed, &mut out, &options)
    } else {
        let options = options.crop(crop.left, crop.top, crop.width, crop.height);
        resizer.resize(&src, &mut out, &options)
    };
    done.map_err(|e| format!("resize failed: {e}"))?;
    if let Some(p) = target.place {
        let hwc: &mut [u8] = match target.layout {
            PixelLayout::Nhwc => dst,
            PixelLayout::Nchw => resized,
        };
        hwc.fill(0);
        let row = iw as usize * 3;
        for (y, src) in inner.chunks_exact(row).enumerate() {
            let at = ((p.top as usize + y) * ow + p.left as usize) * 3;
            hwc[at..at + row].copy_from_slice(src);
        }
    }
    match target.layout {
        PixelLayout::Nhwc => {
            if target.flip {
                for row in dst.chunks_exact_mut(ow * 3) {
                    flip_row(row);
                }
            }
        }
        PixelLayout::Nchw => to_planes(resized, ow, oh, target.flip, dst),
    }
    Ok(())
}

/// Reverses a row of RGB pixels in place.
fn flip_row(row: &mut [u8]) {
    let n = row.len() / 3;
    for x in 0..n / 2 {
        let (a, b) = (x * 3, (n - 1 - x) * 3);
        for c in 0..3 {
            row.swap(a + c, b + c);
        }
    }
}

/// HWC `src` to CHW `dst`, each row reversed if `flip`.
fn to_planes(src: &[u8], w: usize, h: usize, flip: bool, dst: &mut [u8]) {
    let plane = w * h;
    let (r, rest) = dst.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    for y in 0..h {
        let row = &src[y * w * 3..(y + 1) * w * 3];
        let at = y * w;
        for (x, px) in row.chunks_exact(3).enumerate() {
            let to = at + if flip { w - 1 - x } else { x };
            r[to] = px[0];
            g[to] = px[1];
            b[to] = px[2];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flips_and_planes() {
        let src: Vec<u8> = (0..2 * 3 * 3).collect(); // 2 rows of 3 pixels
        let mut dst = vec![0; src.len()];
        to_planes(&src, 3, 2, false, &mut dst);
        assert_eq!(&dst[..6], &[0, 3, 6, 9, 12, 15]);
        to_planes(&src, 3, 2, true, &mut dst);
        assert_eq!(&dst[..6], &[6, 3, 0, 15, 12, 9]);
        assert_eq!(&dst[6..9], &[7, 4, 1]);
        let mut row: Vec<u8> = (0..9).collect();
        flip_row(&mut row);
        assert_eq!(row, vec![6, 7, 8, 3, 4, 5, 0, 1, 2]);
    }
}
