//! Compiling this crate's CUDA C kernels to a cubin with NVRTC, loaded at run time.
//!
//! Why NVRTC and a cubin rather than PTX shipped from `nvcc`: the build machines have no CUDA
//! toolkit, and a cubin for the device's exact architecture needs no driver JIT, so it does not
//! depend on the driver accepting the PTX version of whichever toolkit built it. cudarc's `nvrtc`
//! module is not used because its loader panics when the library is absent and searches only
//! the system loader's paths; this one shares [`crate::dynlib`]'s search with `libnvjpeg`
//! (the CUDA 13 toolkit and the `nvidia-cuda-nvrtc` wheel ship it beside `libnvjpeg`).

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, OnceLock};

use crate::error::{CudaError, Result};

type NvrtcResult = c_int;
type Program = *mut std::ffi::c_void;

/// The entry points used, resolved once.
#[allow(non_snake_case)]
struct Api {
    _lib: libloading::Library,
    nvrtcCreateProgram: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    nvrtcCompileProgram: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    nvrtcGetProgramLogSize: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    nvrtcGetProgramLog: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    nvrtcGetCUBINSize: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    nvrtcGetCUBIN: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    nvrtcDestroyProgram: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    nvrtcGetErrorString: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
}

// SAFETY: a library handle and function pointers; NVRTC is thread-safe across programs.
unsafe impl Send for Api {}
// SAFETY: shared access only reads function pointers.
unsafe impl Sync for Api {}

fn api() -> Result<Arc<Api>> {
    static API: OnceLock<crate::dynlib::Loaded<Api>> = OnceLock::new();
    let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
    crate::dynlib::cached(&API, "libnvrtc", &names, |lib| {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is looked up with the signature `nvrtc.h` declares for it;
                // it stays valid while `_lib` keeps the library loaded.
                *unsafe { lib.get($name) }
                    .map_err(|e| format!("missing entry point {}: {e}", $name))?
            };
        }
        Ok(Api {
            nvrtcCreateProgram: sym!("nvrtcCreateProgram"),
            nvrtcCompileProgram: sym!("nvrtcCompileProgram"),
            nvrtcGetProgramLogSize: sym!("nvrtcGetProgramLogSize"),
            nvrtcGetProgramLog: sym!("nvrtcGetProgramLog"),
            nvrtcGetCUBINSize: sym!("nvrtcGetCUBINSize"),
            nvrtcGetCUBIN: sym!("nvrtcGetCUBIN"),
            nvrtcDestroyProgram: sym!("nvrtcDestroyProgram"),
            nvrtcGetErrorString: sym!("nvrtcGetErrorString"),
            _lib: lib,
        })
    })
}

/// A program, destroyed on drop.
struct Prog<'a> {
    api: &'a Api,
    raw: Program,
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from nvrtcCreateProgram and is destroyed once, here.
        unsafe { (self.api.nvrtcDestroyProgram)(&mut self.raw) };
    }
}

impl Prog<'_> {
    fn check(&self, call: &'static str, result: NvrtcResult, with_log: bool) -> Result<()> {
        if result == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any value.
        let message = unsafe { CStr::from_ptr((self.api.nvrtcGetErrorString)(result)) }
            .to_string_lossy()
            .into_owned();
        let log = if with_log { self.log() } else { String::new() };
        Err(CudaError::Nvrtc { call, message, log })
    }

    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: `raw` is a live program; `size` is a valid out-pointer.
        if unsafe { (self.api.nvrtcGetProgramLogSize)(self.raw, &mut size) } != 0 || size <= 1 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes (NUL included) the log needs.
        if unsafe { (self.api.nvrtcGetProgramLog)(self.raw, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        buf.truncate(size - 1);
        String::from_utf8_lossy(&buf).trim().to_string()
    }
}

/// Compiles `source` (CUDA C, named `name` in messages) to a cubin for compute capability
/// `major.minor`.
pub(crate) fn compile_cubin(source: &str, name: &str, major: i32, minor: i32) -> Result<Vec<u8>> {
    let api = api()?;
    let invalid = |what: &str| CudaError::InvalidArgument {
        call: "nvrtc::compile_cubin",
        detail: format!("{what} contains a NUL byte"),
    };
    let src = CString::new(source).map_err(|_| invalid("the source"))?;
    let cname = CString::new(name).map_err(|_| invalid("the name"))?;
    let mut raw: Program = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; the strings are NUL-terminated and outlive the call;
    // no headers are passed (count 0, null arrays).
    let created = unsafe {
        (api.nvrtcCreateProgram)(
            &mut raw,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    let prog = Prog { api: &api, raw };
    if created != 0 {
        // Nothing to destroy: creation failed.
        let prog = std::mem::ManuallyDrop::new(prog);
        prog.check("nvrtcCreateProgram", created, false)?;
        return Err(CudaError::Nvrtc {
            call: "nvrtcCreateProgram",
            message: format!("result {created}"),
            log: String::new(),
        });
    }
    let options = [
        CString::new(format!("--gpu-architecture=sm_{major}{minor}")).expect("no NUL"),
        CString::new("--std=c++17").expect("no NUL"),
        // No fused multiply-adds: the same rounding as the CPU reference, step for step.
        CString::new("--fmad=false").expect("no NUL"),
    ];
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the program is live; `option_ptrs` holds `len` NUL-terminated strings that outlive
    // the call.
    let compiled = unsafe {
        (api.nvrtcCompileProgram)(prog.raw, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    prog.check("nvrtcCompileProgram", compiled, true)?;
    let mut size = 0usize;
    // SAFETY: the program compiled; `size` is a valid out-pointer.
    let r = unsafe { (api.nvrtcGetCUBINSize)(prog.raw, &mut size) };
    prog.check("nvrtcGetCUBINSize", r, false)?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes the call writes.
    let r = unsafe { (api.nvrtcGetCUBIN)(prog.raw, cubin.as_mut_ptr().cast()) };
    prog.check("nvrtcGetCUBIN", r, false)?;
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_or_present_compiling_never_panics() {
        match compile_cubin("extern \"C\" __global__ void k() {}", "k.cu", 9, 0) {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file"),
            Err(CudaError::LibraryMissing { library, .. }) => assert_eq!(library, "libnvrtc"),
            Err(other) => panic!("{other}"),
        }
    }
}
