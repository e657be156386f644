//! The CPU reference of the crop + resize + flip + layout kernel (`crop_resize.cu`): the same
//! float operations in the same order, so the GPU tests can compare byte for byte.

use super::resize::{CropBox, Layout, OutputSpec, OutputType};
use crate::error::{CudaError, Result};

/// The taps `lo..hi` of output index `i` along one axis, the centre and the filter's scale, as
/// `taps` in `crop_resize.cu` computes them: the window `start .. start + size` of the crop's
/// `in_size` pixels resized to `out_size`.
fn taps(
    i: u32,
    out_size: u32,
    (start, size): (f32, f32),
    in_size: u32,
    antialias: bool,
) -> (i32, i32, f32, f32) {
    let scale = size / out_size as f32;
    let widen = antialias && scale > 1.0;
    let support = if widen { scale } else { 1.0 };
    let inv = if widen { 1.0 / scale } else { 1.0 };
    let center = start + scale * (i as f32 + 0.5);
    let lo = ((center - support + 0.5) as i32).max(0);
    let hi = ((center + support + 0.5) as i32).min(in_size as i32);
    (lo, hi, center, inv)
}

fn triangle(x: f32) -> f32 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// The CPU reference of the GPU step: crops `crop` out of the `width` x `height` RGB image
/// `src` (rows of `width * 3` bytes), resizes it (or its window) to `spec`'s size, mirrors it when `flip`, and
/// writes it into `out` (`spec.image_bytes()` bytes; `f32` elements in native byte order) in
/// `spec`'s layout. Same float operations in the same order as the kernel.
pub fn crop_resize_reference(
    src: &[u8],
    width: u32,
    height: u32,
    crop: CropBox,
    flip: bool,
    spec: &OutputSpec,
    out: &mut [u8],
) -> Result<()> {
    let bad = |detail: String| {
        Err(CudaError::InvalidArgument {
            call: "crop_resize_reference",
            detail,
        })
    };
    if src.len() != width as usize * height as usize * 3 {
        return bad(format!(
            "{} source bytes for {width}x{height} RGB",
            src.len()
        ));
    }
    if !crop.fits(width, height) {
        return bad(format!("crop {crop:?} outside {width}x{height}"));
    }
    if out.len() != spec.image_bytes() {
        return bad(format!(
            "{} output bytes, {} needed",
            out.len(),
            spec.image_bytes()
        ));
    }
    let (oh, ow) = (spec.height, spec.width);
    let plane = oh as usize * ow as usize;
    let [win_x, win_y, win_w, win_h] = crop.window_or_box();
    for pixel in 0..plane {
        let (oy, ox) = (pixel as u32 / ow, pixel as u32 % ow);
        let rx = if flip { ow - 1 - ox } else { ox };
        let (ylo, yhi, yc, yinv) = taps(oy, oh, (win_y, win_h), crop.height, spec.antialias);
        let (xlo, xhi, xc, xinv) = taps(rx, ow, (win_x, win_w), crop.width, spec.antialias);
        let mut xsum = 0.0f32;
        for x in xlo..xhi {
            xsum += triangle((x as f32 - xc + 0.5) * xinv);
        }
        let mut acc = [0.0f32; 3];
        let mut ysum = 0.0f32;
        for y in ylo..yhi {
            let wy = triangle((y as f32 - yc + 0.5) * yinv);
            ysum += wy;
            let row = (crop.y as usize + y as usize) * width as usize * 3 + crop.x as usize * 3;
            let mut r = [0.0f32; 3];
            for x in xlo..xhi {
                let wx = triangle((x as f32 - xc + 0.5) * xinv);
                for (c, rc) in r.iter_mut().enumerate() {
                    *rc += wx * f32::from(src[row + 3 * x as usize + c]);
                }
            }
            for c in 0..3 {
                acc[c] += wy * r[c];
            }
        }
        let norm = xsum * ysum;
        for (c, a) in acc.iter().enumerate() {
            let v = (a / norm + 0.5).floor().clamp(0.0, 255.0);
            let at = match spec.layout {
                Layout::Nchw => c * plane + pixel,
                Layout::Nhwc => pixel * 3 + c,
            };
            match spec.dtype {
                OutputType::U8 => out[at] = v as u8,
                OutputType::F32 { mean, std } => {
                    let f = (v / 255.0 - mean[c]) / std[c];
                    out[4 * at..4 * at + 4].copy_from_slice(&f.to_ne_bytes());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(h: u32, w: u32, antialias: bool) -> OutputSpec {
        OutputSpec {
            height: h,
            width: w,
            layout: Layout::Nhwc,
            dtype: OutputType::U8,
            antialias,
        }
    }

    fn gradient(w: u32, h: u32) -> Vec<u8> {
        (0..h * w * 3).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn the_same_size_without_crop_is_the_identity() {
        let src = gradient(5, 4);
        for aa in [false, true] {
            let mut out = vec![0u8; 5 * 4 * 3];
            crop_resize_reference(
                &src,
                5,
                4,
                CropBox::full(5, 4),
                false,
                &spec(4, 5, aa),
                &mut out,
            )
            .unwrap();
            assert_eq!(out, src);
        }
    }

    #[test]
    fn flip_mirrors_and_crop_selects() {
        let src = gradient(6, 3);
        let crop = CropBox {
            x: 2,
            y: 1,
            width: 3,
            height: 2,
            window: None,
        };
        let mut out = vec![0u8; 3 * 2 * 3];
        crop_resize_reference(&src, 6, 3, crop, true, &spec(2, 3, true), &mut out).unwrap();
        for y in 0..2 {
            for x in 0..3 {
                for c in 0..3 {
                    let want = src[((1 + y) * 6 + (2 + 2 - x)) * 3 + c];
                    assert_eq!(out[(y * 3 + x) * 3 + c], want, "y {y} x {x} c {c}");
                }
            }
        }
    }

    #[test]
    fn halving_averages_pixel_pairs_like_torchvision() {
        // torch.nn.functional.interpolate(x, size=(1, 2), mode="bilinear", antialias=False)
        // of the row [0, 100, 200, 250] (align_corners=False): samples at 0.5 and 2.5, i.e.
        // 50 and 225. With antialias=True the 2x shrink averages over a 4-tap triangle: the
        // weights (0.25, 0.75, 0.75, 0.25) clipped at the edges: (0*.75+100*.75+200*.25)/1.75
        // = 71.43 and (100*.25+200*.75+250*.75)/1.75 = 207.14.
        let row = [0u8, 100, 200, 250];
        let src: Vec<u8> = row.iter().flat_map(|v| [*v, *v, *v]).collect();
        let mut out = vec![0u8; 2 * 3];
        crop_resize_reference(
            &src,
            4,
            1,
            CropBox::full(4, 1),
            false,
            &spec(1, 2, false),
            &mut out,
        )
        .unwrap();
        assert_eq!([out[0], out[3]], [50, 225]);
        crop_resize_reference(
            &src,
            4,
            1,
            CropBox::full(4, 1),
            false,
            &spec(1, 2, true),
            &mut out,
        )
        .unwrap();
        assert_eq!([out[0], out[3]], [71, 207]);
    }

    #[test]
    fn a_window_samples_as_resizing_the_whole_image_then_cropping() {
        // torchvision's Resize then CenterCrop: 13x9 resized to 29x20, then the 11x7 at
        // (9, 6) of that, is the window (9, 6, 11, 7) / (29 / 13, 20 / 9) of the whole image.
        let src = gradient(13, 9);
        let mut whole = vec![0u8; 29 * 20 * 3];
        let full = CropBox::full(13, 9);
        crop_resize_reference(&src, 13, 9, full, false, &spec(20, 29, true), &mut whole).unwrap();
        let (sx, sy) = (13.0 / 29.0, 9.0 / 20.0);
        let window = CropBox {
            window: Some([9.0 * sx, 6.0 * sy, 11.0 * sx, 7.0 * sy]),
            ..full
        };
        let mut out = vec![0u8; 11 * 7 * 3];
        crop_resize_reference(&src, 13, 9, window, false, &spec(7, 11, true), &mut out).unwrap();
        for y in 0..7 {
            for x in 0..11 {
                for c in 0..3 {
                    let want = whole[((6 + y) * 29 + 9 + x) * 3 + c];
                    let got = out[(y * 11 + x) * 3 + c];
                    // The window's centres are the whole resize's up to float rounding.
                    assert!(got.abs_diff(want) <= 1, "y {y} x {x} c {c}: {got} {want}");
                }
            }
        }
        let outside = CropBox {
            window: Some([3.0, 0.0, 10.5, 9.0]),
            ..full
        };
        assert!(!outside.fits(13, 9));
    }

    #[test]
    fn nchw_and_float_follow_the_spec() {
        let src = gradient(2, 2);
        let mut s = spec(2, 2, false);
        s.layout = Layout::Nchw;
        s.dtype = OutputType::F32 {
            mean: [0.5, 0.5, 0.5],
            std: [0.25, 0.5, 1.0],
        };
        let mut out = vec![0u8; s.image_bytes()];
        crop_resize_reference(&src, 2, 2, CropBox::full(2, 2), false, &s, &mut out).unwrap();
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        for pixel in 0..4 {
            for c in 0..3 {
                let v = f32::from(src[pixel * 3 + c]);
                let want = (v / 255.0 - 0.5) / [0.25, 0.5, 1.0][c];
                assert_eq!(f[c * 4 + pixel], want);
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let src = gradient(2, 2);
        let mut out = vec![0u8; 12];
        let outside = CropBox {
            x: 1,
            y: 0,
            width: 2,
            height: 2,
            window: None,
        };
        assert!(
            crop_resize_reference(&src, 2, 2, outside, false, &spec(2, 2, true), &mut out).is_err()
        );
        assert!(spec(0, 2, true).validate().is_err());
        let mut s = spec(2, 2, true);
        s.dtype = OutputType::F32 {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        };
        assert!(s.validate().is_err());
    }
}
