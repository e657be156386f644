//! The GPU crop + resize + flip + layout step: the kernel (`crop_resize.cu`), its parameters
//! and the output form.

use std::ffi::{c_int, c_void, CString};
use std::sync::{Arc, Mutex};

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

/// A crop box in the pixels of the decoded image: the resize filter reads only its pixels.
///
/// With no `window`, the whole box is resized to the output (torchvision's
/// `RandomResizedCrop`: crop, then resize the crop). A `window` resizes a fractional part of
/// the box, its pixels beyond the window's edges still weighing in (torchvision's `Resize`
/// then `CenterCrop`: the box is the whole image and the window the crop in it, sampled as
/// resizing the whole image would).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width, at least 1.
    pub width: u32,
    /// Height, at least 1.
    pub height: u32,
    /// The part resized to the output, in the box's pixels: left, top, width, height (width
    /// and height positive, inside the box); `None` is the whole box.
    pub window: Option<[f32; 4]>,
}

impl CropBox {
    /// The whole of a `width` x `height` image.
    pub fn full(width: u32, height: u32) -> CropBox {
        CropBox {
            x: 0,
            y: 0,
            width,
            height,
            window: None,
        }
    }

    /// The window (left, top, width, height in the box's pixels) the output samples: the
    /// whole box when there is none.
    pub fn window_or_box(&self) -> [f32; 4] {
        self.window
            .unwrap_or([0.0, 0.0, self.width as f32, self.height as f32])
    }

    /// Whether the box (and its window) is non-empty and lies inside a `width` x `height` image.
    pub fn fits(&self, width: u32, height: u32) -> bool {
        let [left, top, w, h] = self.window_or_box();
        let inside = |start: f32, size: f32, room: u32| {
            start.is_finite()
                && size.is_finite()
                && start >= 0.0
                && size > 0.0
                && start + size <= room as f32
        };
        inside(left, w, self.width)
            && inside(top, h, self.height)
            && self.width > 0
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
    pub win_x: f32,
    pub win_y: f32,
    pub win_w: f32,
    pub win_h: f32,
    pub pad: i32,
}

/// Threads per block of the kernel.
const BLOCK: u32 = 256;

/// The kernel compiled for compute capability `major.minor`, once per process (NVRTC takes a
/// noticeable fraction of a second; decoders are made per loader).
fn cubin_for(major: i32, minor: i32) -> Result<Arc<Vec<u8>>> {
    /// A compute capability and the kernel's cubin for it.
    type Compiled = ((i32, i32), Arc<Vec<u8>>);
    static CUBINS: Mutex<Vec<Compiled>> = Mutex::new(Vec::new());
    let mut cache = CUBINS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, cubin)) = cache.iter().find(|(cc, _)| *cc == (major, minor)) {
        return Ok(Arc::clone(cubin));
    }
    let cubin = Arc::new(super::nvrtc::compile_cubin(
        SOURCE,
        "crop_resize.cu",
        major,
        minor,
    )?);
    cache.push(((major, minor), Arc::clone(&cubin)));
    Ok(cubin)
}

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
        let cubin = cubin_for(major, minor)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_kernel_struct() {
        // CropParams in crop_resize.cu: one u64, seven ints, four floats and an int, no padding.
        assert_eq!(std::mem::size_of::<CropParams>(), 56);
        assert_eq!(std::mem::offset_of!(CropParams, win_x), 36);
        assert_eq!(std::mem::offset_of!(CropParams, pad), 52);
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
