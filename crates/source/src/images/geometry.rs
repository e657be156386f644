//! Where each output image comes from: torchvision's `RandomResizedCrop` and
//! `Resize` + `CenterCrop` boxes, and the flip, drawn from `(seed, epoch, sample)`.

use crate::rng::{hash2, SplitMix64};

/// A crop box in source pixels: rows `top .. top + height`, columns `left .. left + width`
/// (fractional for the center crop, whose box comes from a resize).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CropBox {
    /// First row.
    pub top: f64,
    /// First column.
    pub left: f64,
    /// Rows.
    pub height: f64,
    /// Columns.
    pub width: f64,
}

/// torchvision's `RandomResizedCrop.get_params` (torchvision/transforms/transforms.py), with
/// its random draws taken from `unit` (uniform in `[0, 1)`) instead of torch's generator, in
/// torchvision's order: per attempt the scale, the log-ratio, then (if the box fits) the row
/// and column. torch draws the scale and ratio in `float32` and takes `log` of the ratio bounds
/// in `float32`, so they are computed so here; Python's `round` rounds half to even, as
/// `round_ties_even` does. After 10 attempts that do not fit, the center fallback.
pub fn random_resized_crop(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    mut unit: impl FnMut() -> f64,
) -> CropBox {
    let (w0, h0) = (f64::from(width), f64::from(height));
    let area = w0 * h0;
    let log_ratio = ((ratio.0 as f32).ln(), (ratio.1 as f32).ln());
    for _ in 0..10 {
        let target_area = area * f64::from(uniform_f32(unit(), scale.0 as f32, scale.1 as f32));
        let aspect = f64::from(uniform_f32(unit(), log_ratio.0, log_ratio.1).exp());
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if 0.0 < w && w <= w0 && 0.0 < h && h <= h0 {
            let top = randint(unit(), h0 - h + 1.0);
            let left = randint(unit(), w0 - w + 1.0);
            return CropBox {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    let in_ratio = w0 / h0;
    let (min_ratio, max_ratio) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_ratio {
        (w0, (w0 / min_ratio).round_ties_even())
    } else if in_ratio > max_ratio {
        ((h0 * max_ratio).round_ties_even(), h0)
    } else {
        (w0, h0)
    };
    CropBox {
        top: ((h0 - h) / 2.0).floor(),
        left: ((w0 - w) / 2.0).floor(),
        height: h,
        width: w,
    }
}

/// torch's `uniform_(from, to)` of one `float32` given a unit draw.
fn uniform_f32(u: f64, from: f32, to: f32) -> f32 {
    (u as f32) * (to - from) + from
}

/// `randint(0, n)` given a unit draw.
fn randint(u: f64, n: f64) -> f64 {
    (u * n).floor().min(n - 1.0)
}

/// The size of torchvision's `Resize(resize)` of a `width` x `height` image: the shorter
/// side to `resize`, the longer scaled and truncated as `int()` does.
fn resized(width: u32, height: u32, resize: u32) -> (f64, f64) {
    let (w0, h0) = (f64::from(width), f64::from(height));
    let r = f64::from(resize);
    if w0 <= h0 {
        (r, (r * h0 / w0).floor())
    } else {
        ((r * w0 / h0).floor(), r)
    }
}

/// Where the output's pixels come from, in output pixels: rows `top .. top + height`,
/// columns `left .. left + width`; the rest is zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// First row.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

/// torchvision's `Resize(resize)` (the shorter side to `resize`, the longer scaled and
/// truncated as `int()` does) then `CenterCrop((out_h, out_w))` (offsets
/// `int(round((resized - crop) / 2))`), as one box in source pixels. Where the crop is larger
/// than the resized image, the box takes the image whole in that direction, and
/// [`center_padding`] says where it lands in the output.
pub fn center_crop(width: u32, height: u32, resize: u32, out_h: u32, out_w: u32) -> CropBox {
    let (w0, h0) = (f64::from(width), f64::from(height));
    let (rw, rh) = resized(width, height, resize);
    let (cw, ch) = (f64::from(out_w).min(rw), f64::from(out_h).min(rh));
    let top = ((rh - ch) / 2.0).round_ties_even();
    let left = ((rw - cw) / 2.0).round_ties_even();
    let (sx, sy) = (w0 / rw, h0 / rh);
    CropBox {
        top: top * sy,
        left: left * sx,
        height: ch * sy,
        width: cw * sx,
    }
}

/// Where [`center_crop`]'s box lands in the `out_w` x `out_h` output when the crop is larger
/// than the resized image: torchvision's `CenterCrop` pads the image with zeros, `(crop -
/// size) // 2` before it in each such direction, and crops the padded image. `None` when the
/// box fills the output.
pub fn center_padding(
    width: u32,
    height: u32,
    resize: u32,
    out_h: u32,
    out_w: u32,
) -> Option<Placement> {
    let (rw, rh) = resized(width, height, resize);
    // Whole numbers of at most `u32::MAX` (the output's size bounds them here).
    let (iw, ih) = (
        rw.min(f64::from(out_w)) as u32,
        rh.min(f64::from(out_h)) as u32,
    );
    ((iw, ih) != (out_w, out_h)).then_some(Placement {
        top: (out_h - ih) / 2,
        left: (out_w - iw) / 2,
        height: ih,
        width: iw,
    })
}

/// The generator of one sample's draws in one epoch: independent of every other sample's,
/// and of how the samples are batched, sharded or read.
pub(crate) fn sample_rng(seed: u64, epoch: u64, sample: u64) -> SplitMix64 {
    SplitMix64::new(hash2(hash2(seed ^ 0x696d_6167_6573, epoch), sample))
}

/// A unit draw (53 random bits) from `rng`.
pub(crate) fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_crops_lie_inside_the_image() {
        let mut rng = SplitMix64::new(7);
        for (w, h) in [
            (500, 375),
            (375, 500),
            (1, 1),
            (2, 900),
            (900, 2),
            (224, 224),
        ] {
            for _ in 0..500 {
                let b =
                    random_resized_crop(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), || unit(&mut rng));
                assert!(b.width >= 1.0 && b.height >= 1.0, "{b:?}");
                assert!(b.left + b.width <= f64::from(w) && b.top + b.height <= f64::from(h));
                assert_eq!((b.left.fract(), b.top.fract()), (0.0, 0.0));
            }
        }
    }

    #[test]
    fn the_fallback_is_torchvisions_center_crop() {
        // Draws that never fit (scale 1, the widest ratio on a tall image) reach the fallback.
        let b = random_resized_crop(100, 1000, (1.0, 1.0), (0.75, 4.0 / 3.0), || 0.999);
        // in_ratio 0.1 < 0.75: w = 100, h = round(100 / 0.75) = 133, centred.
        assert_eq!(
            b,
            CropBox {
                top: 433.0,
                left: 0.0,
                height: 133.0,
                width: 100.0
            }
        );
    }

    #[test]
    fn a_center_crop_larger_than_the_resized_image_is_padded_as_torchvision_pads() {
        // 77x53 -> Resize(2): 2x2 (53 -> 2, int(2 * 77 / 53) = 2) -> CenterCrop(8): padded
        // by (8 - 2) // 2 = 3 before it, the whole image in the box.
        let place = center_padding(77, 53, 2, 8, 8).unwrap();
        assert_eq!(
            place,
            Placement {
                top: 3,
                left: 3,
                height: 2,
                width: 2
            }
        );
        assert_eq!(
            center_crop(77, 53, 2, 8, 8),
            CropBox {
                top: 0.0,
                left: 0.0,
                height: 53.0,
                width: 77.0
            }
        );
        // Padded one way, cropped the other: 500x375 -> Resize(6): 8x6 -> CenterCrop((7, 5)).
        let place = center_padding(500, 375, 6, 7, 5).unwrap();
        assert_eq!(
            (place.top, place.left, place.height, place.width),
            (0, 0, 6, 5)
        );
        assert_eq!(center_padding(500, 375, 256, 224, 224), None);
    }

    #[test]
    fn center_crop_of_imagenet_eval() {
        // 500x375 -> Resize(256): 341x256 -> CenterCrop(224): offset (16, 58.5 -> 58).
        let b = center_crop(500, 375, 256, 224, 224);
        let s = 375.0 / 256.0;
        assert!((b.top - 16.0 * s).abs() < 1e-9 && (b.height - 224.0 * s).abs() < 1e-9);
        assert!((b.left - 58.0 * 500.0 / 341.0).abs() < 1e-9, "{b:?}");
    }
}
