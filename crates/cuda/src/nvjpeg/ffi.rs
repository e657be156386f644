//! The part of `nvjpeg.h` this crate calls, resolved from `libnvjpeg` at run time.
//!
//! Types and values are copied from `nvjpeg.h` of nvJPEG 13.3 (the `nvidia-nvjpeg` wheel); every
//! one used here has been stable since CUDA 11.

use std::ffi::{c_int, c_uchar, c_uint, c_void};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUstream;

use crate::error::{CudaError, Result};

/// `nvjpegStatus_t`.
pub(crate) type Status = c_int;
/// `NVJPEG_STATUS_SUCCESS`.
pub(crate) const SUCCESS: Status = 0;

/// `nvjpegHandle_t`.
pub(crate) type Handle = *mut c_void;
/// `nvjpegJpegState_t`.
pub(crate) type JpegState = *mut c_void;
/// `nvjpegJpegStream_t`.
pub(crate) type JpegStream = *mut c_void;

/// `nvjpegBackend_t` values.
pub(crate) const BACKEND_GPU_HYBRID: c_int = 2;
pub(crate) const BACKEND_HARDWARE: c_int = 3;

/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` (nvJPEG 12.1 and later).
pub(crate) const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 32;
/// `NVJPEG_STATUS_INVALID_PARAMETER`.
pub(crate) const INVALID_PARAMETER: Status = 2;

/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB in `channel[0]`.
pub(crate) const OUTPUT_RGBI: c_int = 5;

/// `nvjpegChromaSubsampling_t`'s `NVJPEG_CSS_444`.
pub(crate) const CSS_444: c_int = 0;
/// `nvjpegChromaSubsampling_t`'s `NVJPEG_CSS_UNKNOWN`.
pub(crate) const CSS_UNKNOWN: c_int = -1;

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Image {
    pub channel: [*mut c_uchar; 4],
    pub pitch: [usize; 4],
}

impl Image {
    /// An interleaved image at `ptr` with rows of `pitch` bytes (the other planes unused).
    pub(crate) fn interleaved(ptr: u64, pitch: usize) -> Image {
        let mut img = Image {
            channel: [std::ptr::null_mut(); 4],
            pitch: [0; 4],
        };
        img.channel[0] = ptr as usize as *mut c_uchar;
        img.pitch[0] = pitch;
        img
    }
}

/// The symbolic name of a status (`nvjpeg.h`'s enum).
pub(crate) fn status_name(status: Status) -> &'static str {
    match status {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "NVJPEG_STATUS_UNKNOWN",
    }
}

/// `Ok` for `NVJPEG_STATUS_SUCCESS`, else [`CudaError::Nvjpeg`] naming `call`.
pub(crate) fn check(call: &'static str, status: Status) -> Result<()> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Nvjpeg {
            call,
            status,
            name: status_name(status),
        })
    }
}

macro_rules! nvjpeg_api {
    ($($name:ident: fn($($arg:ty),*);)*) => {
        /// The entry points, resolved once; `_lib` keeps them mapped.
        #[allow(non_snake_case)]
        pub(crate) struct Api {
            _lib: libloading::Library,
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) -> Status,)*
        }

        impl Api {
            #[allow(non_snake_case)]
            fn resolve(lib: libloading::Library) -> std::result::Result<Api, String> {
                // SAFETY: each symbol is looked up with the signature `nvjpeg.h` declares for it
                // (copied above); the pointers stay valid while `_lib` keeps the library loaded.
                unsafe {
                    $(let $name = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> Status>(stringify!($name))
                        .map_err(|e| format!("missing entry point {}: {e}", stringify!($name)))?;)*
                    Ok(Api { _lib: lib, $($name,)* })
                }
            }
        }
    };
}

nvjpeg_api! {
    nvjpegGetProperty: fn(c_int, *mut c_int);
    nvjpegCreateEx: fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle);
    nvjpegDestroy: fn(Handle);
    nvjpegSetDeviceMemoryPadding: fn(usize, Handle);
    nvjpegSetPinnedMemoryPadding: fn(usize, Handle);
    nvjpegGetHardwareDecoderInfo: fn(Handle, *mut c_uint, *mut c_uint);
    nvjpegJpegStateCreate: fn(Handle, *mut JpegState);
    nvjpegJpegStateDestroy: fn(JpegState);
    nvjpegGetImageInfo: fn(Handle, *const c_uchar, usize, *mut c_int, *mut c_int, *mut c_int, *mut c_int);
    nvjpegDecodeBatchedInitialize: fn(Handle, JpegState, c_int, c_int, c_int);
    nvjpegDecodeBatched: fn(Handle, JpegState, *const *const c_uchar, *const usize, *mut Image, CUstream);
    nvjpegJpegStreamCreate: fn(Handle, *mut JpegStream);
    nvjpegJpegStreamDestroy: fn(JpegStream);
    nvjpegJpegStreamParseHeader: fn(Handle, *const c_uchar, usize, JpegStream);
    nvjpegDecodeBatchedSupported: fn(Handle, JpegStream, *mut c_int);
    nvjpegDecodeBatchedPreAllocate: fn(Handle, JpegState, c_int, c_int, c_int, c_int, c_int);
}

// SAFETY: the struct holds the library handle and plain function pointers; nvJPEG's functions are
// thread-safe across handles, and this crate serialises the use of each handle (`&mut`).
unsafe impl Send for Api {}
// SAFETY: as for Send: shared access only reads function pointers.
unsafe impl Sync for Api {}

/// The file names tried, newest first: a CUDA 12 library works under a CUDA 13 driver.
const NAMES: [&str; 3] = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"];

/// The library, loaded on first use; the outcome (also a failure) is kept for the process.
pub(crate) fn api() -> Result<Arc<Api>> {
    static API: OnceLock<crate::dynlib::Loaded<Api>> = OnceLock::new();
    crate::dynlib::cached(&API, "libnvjpeg", &NAMES, Api::resolve)
}

/// nvJPEG's version as `(major, minor, patch)`, or the error that it is absent.
pub fn version() -> Result<(i32, i32, i32)> {
    let api = api()?;
    let mut v = [0 as c_int; 3];
    for (property, out) in v.iter_mut().enumerate() {
        // SAFETY: `libraryPropertyType` is MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2;
        // `out` is a valid out-pointer. The call needs no CUDA context.
        check("nvjpegGetProperty", unsafe {
            (api.nvjpegGetProperty)(property as c_int, out)
        })?;
    }
    Ok((v[0], v[1], v[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_their_header_names() {
        assert_eq!(status_name(3), "NVJPEG_STATUS_BAD_JPEG");
        assert_eq!(status_name(10), "NVJPEG_STATUS_INCOMPLETE_BITSTREAM");
        assert_eq!(status_name(99), "NVJPEG_STATUS_UNKNOWN");
        let e = check("nvjpegDecodeBatched", 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nvjpegDecodeBatched failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED (nvjpegStatus_t 4)"
        );
    }

    #[test]
    fn image_layout_matches_the_header() {
        // nvjpegImage_t: four channel pointers then four size_t pitches.
        assert_eq!(std::mem::size_of::<Image>(), 64);
        let img = Image::interleaved(0x1000, 300);
        assert_eq!(img.channel[0] as usize, 0x1000);
        assert_eq!(img.pitch, [300, 0, 0, 0]);
    }

    #[test]
    fn absent_or_present_the_library_never_panics() {
        match version() {
            Ok((major, _, _)) => assert!(major >= 11),
            Err(e) => assert!(e.to_string().contains("libnvjpeg"), "{e}"),
        }
    }
}
