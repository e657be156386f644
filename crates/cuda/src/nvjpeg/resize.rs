//! The GPU crop + resize + flip + layout step (`crop_resize.cu`), and the CPU reference of the
//! same formula that the tests compare it against.

use std::ffi::{c_int, c_void, CString};
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys::{CUdevice_attribute, CUdeviceptr, CUfunction, CUmodule};

use crate::context::Context;
use crate::driver::named;
use crate::error::{CudaError, Result};
use crate::stream::Stream;

/// The kernel's source, compiled by NVRTC when a decoder is made.
pub(crate) const SOURCE: &str = include_str!("crop_resize.cu");

/// The order of an output batch's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[batch, height, width, 3]`.
    Nhwc,
    /// `[batch, 3, height, width]`.
    Nchw,
}

/// The element type of an output batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutputType {
    /// `uint8`, the resized pixel rounded half up.
    U8,
    /// `float32`: `(u8 / 255 - mean[c]) / std[c]`, from the same rounded `u8` value
    /// (torchvision's `ToDtype(float32, scale=True)` then `Normalize(mean, std)`).
    F32 {
        /// Per-channel mean (R, G, B), on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation (R, G, B), on the 0..1 scale; each must be positive.
        std: [f32; 3],
    },
}

/// The fixed size and form of every image of an output batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSpec {
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// Dimension order.
    pub layout: Layout,
    /// Element type.
    pub dtype: OutputType,
    /// torchvision's `antialias`: when shrinking, widen the bilinear filter by the scale (as PIL
    /// and `transforms.v2` by default do); `false` is plain two-tap bilinear.
    pub antialias: bool,
}

impl OutputSpec {
    /// Bytes one output image takes.
    pub fn image_bytes(&self) -> usize {
        let elem = match self.dtype {
            OutputType::U8 => 1,
            OutputType::F32 { .. } => 4,
        };
        self.height as usize * self.width as usize * 3 * elem
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(CudaError::InvalidArgument {
                call: "JpegDecoder::new",
                detail,
            })
        };
        if self.height == 0 || self.width == 0 {
            return bad(format!(
                "output size {}x{} must be positive",
                self.width, self.height
            ));
        }
        if u64::from(self.height) * u64::from(self.width) > i32::MAX as u64 / 3 {
            return bad(format!(
                "output size {}x{} is too large",
                self.width, self.height
            ));
        }
        if let OutputType::F32 { std, .. } = self.dtype {
            if std
                .iter()
                .any(|s| s.is_nan() || *s <= 0.0 || s.is_infinite())
            {
                return bad(format!("std {std:?} must be positive and finite"));
            }
        }
        Ok(())
    }
}

/// A crop box in the pixels of the decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width, at least 1.
    pub width: u32,
    /// Height, at least 1.
    pub height: u32,
}

impl CropBox {
    /// The whole of a `width` x `height` image.
    pub fn full(width: u32, height: u32) -> CropBox {
        CropBox {
            x: 0,
            y: 0,
            width,
            height,
        }
    }

    /// Whether the box is non-empty and lies inside a `width` x `height` image.
    pub fn fits(&self, width: u32, height: u32) -> bool {
        self.width > 0
            && self.height > 0
            && u64::from(self.x) + u64::from(self.width) <= u64::from(width)
            && u64::from(self.y) + u64::from(self.height) <= u64::from(height)
    }
}

/// One image's parameters as the kernel reads them (`CropParams` in `crop_resize.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CropParams {
    pub src: u64,
    pub pitch: i32,
    pub crop_x: i32,
    pub crop_y: i32,
    pub crop_w: i32,
    pub crop_h: i32,
    pub flip: i32,
    pub out_index: i32,
    pub pad: i32,
}

/// Threads per block of the kernel.
const BLOCK: u32 = 256;

/// The compiled kernel, loaded into one context.
#[derive(Debug)]
pub(crate) struct CropKernel {
    ctx: Arc<Context>,
    /// Invariant: loaded by `cuModuleLoadData` in `ctx`, unloaded only in Drop.
    module: CUmodule,
    /// `crop_resize` of `module`.
    func: CUfunction,
}

// SAFETY: module and function handles are process-wide driver handles; the driver API is
// thread-safe.
unsafe impl Send for CropKernel {}
// SAFETY: shared access only passes the handles to thread-safe driver calls.
unsafe impl Sync for CropKernel {}

impl CropKernel {
    /// Compiles the kernel for `ctx`'s device and loads it.
    pub(crate) fn load(ctx: &Arc<Context>) -> Result<CropKernel> {
        let major =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let cubin = super::nvrtc::compile_cubin(SOURCE, "crop_resize.cu", major, minor)?;
        let _current = ctx.enter()?;
        // SAFETY: `cubin` is a complete ELF image from NVRTC that outlives the call; our context
        // is current.
        let module = named("cuModuleLoadData", unsafe {
            result::module::load_data(cubin.as_ptr().cast())
        })?;
        let mut kernel = CropKernel {
            ctx: Arc::clone(ctx),
            module,
            func: std::ptr::null_mut(),
        };
        // SAFETY: the module is live; the name is NUL-terminated. On failure `kernel` drops and
        // unloads the module.
        kernel.func = named("cuModuleGetFunction", unsafe {
            result::module::get_function(module, CString::new("crop_resize").expect("no NUL"))
        })?;
        Ok(kernel)
    }

    /// Launches the kernel for `count` images whose [`CropParams`] sit at `params` in device
    /// memory, writing into the batch at `out`.
    ///
    /// # Safety
    /// `params` holds `count` valid `CropParams` whose source ranges are readable device memory,
    /// and `out` holds `spec.image_bytes()` bytes for every `out_index` named, all until the
    /// launch completes on `stream`.
    pub(crate) unsafe fn launch(
        &self,
        stream: &Stream,
        params: CUdeviceptr,
        count: usize,
        out: CUdeviceptr,
        spec: &OutputSpec,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let count = u32::try_from(count)
            .ok()
            .filter(|c| *c <= 65_535)
            .ok_or_else(|| CudaError::InvalidArgument {
                call: "JpegDecoder::decode_batch",
                detail: format!("{count} images in one launch; at most 65535"),
            })?;
        let pixels = spec.height * spec.width;
        let (mut out_u8, mut out_f32) = match spec.dtype {
            OutputType::U8 => (out, 0),
            OutputType::F32 { .. } => (0, out),
        };
        let (mean, std) = match spec.dtype {
            OutputType::U8 => ([0.0; 3], [1.0; 3]),
            OutputType::F32 { mean, std } => (mean, std),
        };
        let mut params = params;
        let mut oh = spec.height as c_int;
        let mut ow = spec.width as c_int;
        let mut nchw = c_int::from(spec.layout == Layout::Nchw);
        let mut antialias = c_int::from(spec.antialias);
        let [mut m0, mut m1, mut m2] = mean;
        let [mut s0, mut s1, mut s2] = std;
        let mut args: [*mut c_void; 13] = [
            (&mut params as *mut CUdeviceptr).cast(),
            (&mut out_u8 as *mut CUdeviceptr).cast(),
            (&mut out_f32 as *mut CUdeviceptr).cast(),
            (&mut oh as *mut c_int).cast(),
            (&mut ow as *mut c_int).cast(),
            (&mut nchw as *mut c_int).cast(),
            (&mut antialias as *mut c_int).cast(),
            (&mut m0 as *mut f32).cast(),
            (&mut m1 as *mut f32).cast(),
            (&mut m2 as *mut f32).cast(),
            (&mut s0 as *mut f32).cast(),
            (&mut s1 as *mut f32).cast(),
            (&mut s2 as *mut f32).cast(),
        ];
        let _current = self.ctx.enter()?;
        // SAFETY: `args` points at one local of the kernel's declared type per parameter, alive
        // for the call (the driver copies them at launch); the memory they name is valid by this
        // function's contract; the function belongs to our (current) context.
        named("cuLaunchKernel", unsafe {
            result::launch_kernel(
                self.func,
                (pixels.div_ceil(BLOCK), count, 1),
                (BLOCK, 1, 1),
                0,
                stream.raw(),
                &mut args,
            )
        })
    }
}

impl Drop for CropKernel {
    fn drop(&mut self) {
        if !self.ctx.in_owner_process() {
            return;
        }
        let Ok(_current) = self.ctx.enter() else {
            return;
        };
        // SAFETY: the module is live (field invariant) and no launch of it can be pending: the
        // decoder that owns this kernel synchronises its stream before dropping it.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// The taps `lo..hi` of output index `i` along one axis, the centre and the filter's scale, as
/// `taps` in `crop_resize.cu` computes them.
fn taps(i: u32, out_size: u32, in_size: u32, antialias: bool) -> (i32, i32, f32, f32) {
    let scale = in_size as f32 / out_size as f32;
    let widen = antialias && scale > 1.0;
    let support = if widen { scale } else { 1.0 };
    let inv = if widen { 1.0 / scale } else { 1.0 };
    let center = scale * (i as f32 + 0.5);
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
/// `src` (rows of `width * 3` bytes), resizes it to `spec`'s size, mirrors it when `flip`, and
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
    for pixel in 0..plane {
        let (oy, ox) = (pixel as u32 / ow, pixel as u32 % ow);
        let rx = if flip { ow - 1 - ox } else { ox };
        let (ylo, yhi, yc, yinv) = taps(oy, oh, crop.height, spec.antialias);
        let (xlo, xhi, xc, xinv) = taps(rx, ow, crop.width, spec.antialias);
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

    #[test]
    fn params_match_the_kernel_struct() {
        // CropParams in crop_resize.cu: one u64 then eight ints.
        assert_eq!(std::mem::size_of::<CropParams>(), 40);
    }
}

#[cfg(test)]
mod compile_tests {
    /// The kernel compiles for Hopper (sm_90) and Ampere (sm_80). Needs only NVRTC, not a GPU:
    /// `PINFEED_CUDA_LIBS=<folder of libnvrtc.so.13> cargo test -p pinfeed-cuda -- --ignored
    /// kernel_compiles`.
    #[test]
    #[ignore = "needs libnvrtc (CUDA toolkit or the nvidia-cuda-nvrtc wheel)"]
    fn kernel_compiles() {
        for (major, minor) in [(9, 0), (8, 0)] {
            let cubin =
                super::super::nvrtc::compile_cubin(super::SOURCE, "crop_resize.cu", major, minor)
                    .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            assert!(cubin.starts_with(b"\x7fELF"));
            let name = b"crop_resize";
            assert!(
                cubin.windows(name.len()).any(|w| w == name),
                "no crop_resize symbol"
            );
        }
    }
}
