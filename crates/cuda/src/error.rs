//! The one error type of this crate.

use cudarc::driver::sys;

/// What went wrong talking to the CUDA driver.
///
/// Every driver call that fails becomes [`CudaError::Driver`], naming the call; conditions this
/// crate detects itself (no driver library, a bad ordinal, a forked child) have their own variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library (`libcuda.so.1`) could not be loaded, or it is a stub with no driver
    /// behind it. The message is one line: what is missing and the fix; the library names that
    /// were tried are in `tried` (for a verbose report).
    #[error(
        "no CUDA driver found ({detail}): install the NVIDIA driver, or use device=\"cpu\" / --device cpu"
    )]
    NoDriver {
        /// What is missing: `libcuda.so.1`, or that the library loaded is the toolkit's stub.
        detail: String,
        /// The library names searched, in order, each once (empty when a library loaded but
        /// was a stub).
        tried: Vec<String>,
    },

    /// The requested device ordinal does not exist.
    #[error("cuda:{ordinal} requested but {count} device{} found", if *count == 1 { "" } else { "s" })]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },

    /// A driver call returned an error code.
    #[error("{call} failed: {name} ({message})")]
    Driver {
        /// The driver entry point, without its `_v2` suffix (`cuMemHostRegister`).
        call: &'static str,
        /// The raw `CUresult` value.
        code: i32,
        /// The symbolic name from `cuGetErrorName` (`CUDA_ERROR_INVALID_VALUE`).
        name: String,
        /// The description from `cuGetErrorString` (`invalid argument`).
        message: String,
    },

    /// A CUDA object created in a parent process was used after `fork()`.
    ///
    /// The driver's state does not survive a fork; using it in the child hangs or fails in
    /// confusing ways, so this crate refuses before calling the driver.
    #[error("CUDA state cannot be used in a forked child; create the loader after the fork (CUDA was initialised in pid {parent}, this is pid {child})")]
    Forked {
        /// The process that initialised CUDA or created the object.
        parent: i32,
        /// The calling process.
        child: i32,
    },

    /// An argument was rejected before reaching the driver.
    #[error("invalid argument to {call}: {detail}")]
    InvalidArgument {
        /// The function of this crate that rejected it.
        call: &'static str,
        /// What was expected and what was found.
        detail: String,
    },

    /// The device or driver lacks a feature this crate needs.
    #[error("unsupported on this device or driver: {detail}")]
    Unsupported {
        /// What is missing.
        detail: String,
    },

    /// A CUDA library loaded at run time (`libnvjpeg`, `libnvrtc`) was not found, or lacks an
    /// entry point this crate needs.
    #[error(
        "{library} not found or unusable ({} locations tried{}): install it (`pip install \
         nvidia-nvjpeg nvidia-cuda-nvrtc`, or the CUDA toolkit) or name its folder in \
         PINFEED_CUDA_LIBS",
        tried.len(),
        last_error.as_deref().map(|e| format!("; {e}")).unwrap_or_default()
    )]
    LibraryMissing {
        /// The library (`libnvjpeg`).
        library: &'static str,
        /// Every path or file name tried, in order.
        tried: Vec<String>,
        /// The loader's message for the last file that existed but did not load, or the
        /// missing entry point.
        last_error: Option<String>,
    },

    /// An nvJPEG call returned an error status.
    #[error("{call} failed: {name} (nvjpegStatus_t {status})")]
    Nvjpeg {
        /// The nvJPEG entry point (`nvjpegDecodeBatched`).
        call: &'static str,
        /// The raw `nvjpegStatus_t`.
        status: i32,
        /// Its symbolic name (`NVJPEG_STATUS_BAD_JPEG`).
        name: &'static str,
    },

    /// NVRTC failed to compile one of this crate's kernels.
    #[error("{call} failed: {message}{}", if log.is_empty() { String::new() } else { format!("; compiler log: {log}") })]
    Nvrtc {
        /// The NVRTC entry point.
        call: &'static str,
        /// `nvrtcGetErrorString` of the result.
        message: String,
        /// The compiler's log (empty when none).
        log: String,
    },

    /// An operating-system call (not a driver call) failed.
    #[error("{call} of {bytes} bytes failed: {source}")]
    Os {
        /// The system call (`mmap`).
        call: &'static str,
        /// The size that was asked for.
        bytes: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`CudaError`] as the default error.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl CudaError {
    /// The raw `CUresult` when this is a driver error.
    pub fn driver_code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The driver library names searched before giving up ([`CudaError::NoDriver`]); empty for
    /// any other error.
    pub fn tried(&self) -> &[String] {
        match self {
            CudaError::NoDriver { tried, .. } => tried,
            _ => &[],
        }
    }

    /// Whether `cuMemHostRegister` refused a range because (part of) it is already page-locked.
    pub fn is_already_registered(&self) -> bool {
        self.driver_code() == Some(sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED as i32)
    }

    /// Builds [`CudaError::Driver`] from a failed call, asking the driver for the name and text.
    ///
    /// Only called once the driver library is known to be loadable (every `CUresult` in hand came
    /// from it), so `cuGetErrorName` cannot hit the loader's panic path.
    pub(crate) fn from_driver(call: &'static str, result: sys::CUresult) -> CudaError {
        let code = result as i32;
        let name = error_text(result, true).unwrap_or_else(|| format!("CUDA_ERROR_{code}"));
        let message = error_text(result, false).unwrap_or_else(|| "unrecognised error code".into());
        CudaError::Driver {
            call,
            code,
            name,
            message,
        }
    }
}

/// `cuGetErrorName` (`name == true`) or `cuGetErrorString` as an owned string.
fn error_text(result: sys::CUresult, name: bool) -> Option<String> {
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer for the duration of the call; the driver library is
    // loaded (see `from_driver`). Neither function needs cuInit.
    let status = unsafe {
        if name {
            sys::cuGetErrorName(result, &mut text)
        } else {
            sys::cuGetErrorString(result, &mut text)
        }
    };
    if status != sys::CUresult::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver sets `text` to a NUL-terminated static string it owns.
    let text = unsafe { std::ffi::CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_went_wrong() {
        let e = CudaError::NoDevice {
            ordinal: 3,
            count: 1,
        };
        assert_eq!(e.to_string(), "cuda:3 requested but 1 device found");
        let e = CudaError::NoDevice {
            ordinal: 3,
            count: 2,
        };
        assert_eq!(e.to_string(), "cuda:3 requested but 2 devices found");
        let e = CudaError::Driver {
            call: "cuMemHostRegister",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            message: "invalid argument".into(),
        };
        assert_eq!(
            e.to_string(),
            "cuMemHostRegister failed: CUDA_ERROR_INVALID_VALUE (invalid argument)"
        );
        assert_eq!(e.driver_code(), Some(1));
        let tried: Vec<String> = ["libcuda.so", "libcuda.so.1"].map(String::from).into();
        let e = CudaError::NoDriver {
            detail: "libcuda.so.1".into(),
            tried: tried.clone(),
        };
        assert_eq!(
            e.to_string(),
            "no CUDA driver found (libcuda.so.1): install the NVIDIA driver, or use \
             device=\"cpu\" / --device cpu"
        );
        assert_eq!(e.tried(), tried.as_slice());
        let e = CudaError::Forked {
            parent: 1,
            child: 2,
        };
        assert!(e.to_string().starts_with(
            "CUDA state cannot be used in a forked child; create the loader after the fork"
        ));
    }
}
