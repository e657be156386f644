//! Loading the driver, `cuInit`, error conversion and the fork guard.
//!
//! cudarc's `sys` functions panic when `libcuda` cannot be loaded (and when a symbol is missing),
//! so every public entry point goes through [`ensure_loaded`] before its first driver call.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::error::{CudaError, Result};

/// The pid of the process in which `cuInit` first succeeded; 0 until then.
static INIT_PID: AtomicI32 = AtomicI32::new(0);

/// The calling process's id.
pub(crate) fn current_pid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// Whether `libcuda` can be loaded, decided once per process.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` dlopens the candidate names (running the library's
    // initialisers, as any CUDA program does) and closes them again; it never panics.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Fails with [`CudaError::NoDriver`] unless `libcuda` can be loaded. After `Ok`, cudarc's
/// `sys` functions no longer panic for want of the library.
pub(crate) fn ensure_loaded() -> Result<()> {
    if driver_present() {
        return Ok(());
    }
    let mut tried: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("cuda") {
        if !tried.contains(&name) {
            tried.push(name);
        }
    }
    Err(CudaError::NoDriver {
        detail: "libcuda.so.1".into(),
        tried,
    })
}

/// Fails with [`CudaError::Forked`] when `owner` (a pid recorded at creation) is not this process.
pub(crate) fn check_pid(owner: i32) -> Result<()> {
    let now = current_pid();
    if owner == now {
        Ok(())
    } else {
        Err(CudaError::Forked {
            parent: owner,
            child: now,
        })
    }
}

/// Turns what a function of cudarc's `result` layer returned into this crate's error, naming
/// `call`: the `result` functions make the driver call and check it, and the name is what a
/// user needs to see in the message.
pub(crate) fn named<T>(
    call: &'static str,
    result: std::result::Result<T, DriverError>,
) -> Result<T> {
    result.map_err(|e| CudaError::from_driver(call, e.0))
}

/// Turns a `CUresult` into `Ok` or [`CudaError::Driver`] naming `call`: for the driver calls
/// cudarc's `result` layer has no function for, or one that differs (a slice where a raw
/// address is needed, another symbol version).
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::from_driver(call, result))
    }
}

/// Loads the driver, runs `cuInit(0)` and returns the device count.
///
/// A driver that reports no device gives `Ok(0)`. A stub library (the toolkit's
/// `stubs/libcuda.so`) gives [`CudaError::NoDriver`].
pub(crate) fn init() -> Result<usize> {
    ensure_loaded()?;
    let first = INIT_PID.load(Ordering::Acquire);
    if first != 0 {
        // cuInit in a child of an initialised parent fails with an unhelpful
        // CUDA_ERROR_NOT_INITIALIZED (or worse); say what happened instead.
        check_pid(first)?;
    }
    // The library is loaded (ensure_loaded); cuInit may be called any number of times.
    match result::init() {
        Ok(()) => {}
        Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(0),
        Err(DriverError(sys::CUresult::CUDA_ERROR_STUB_LIBRARY)) => {
            return Err(CudaError::NoDriver {
                detail: "the libcuda.so.1 loaded is the toolkit's stub: put the driver's first on \
                         LD_LIBRARY_PATH"
                    .into(),
                tried: Vec::new(),
            })
        }
        Err(other) => return named("cuInit", Err(other)),
    }
    let _ = INIT_PID.compare_exchange(0, current_pid(), Ordering::AcqRel, Ordering::Acquire);
    let count = named("cuDeviceGetCount", result::device::get_count())?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Whether the loaded driver exports `name`. cudarc panics on a missing symbol, so entry points
/// newer than the oldest driver we accept are checked with this first.
pub(crate) fn has_symbol(name: &str) -> bool {
    if ensure_loaded().is_err() {
        return false;
    }
    // SAFETY: the library is loadable (checked above), so `culib` does not panic; looking a symbol
    // up does not call it, and the `fn()` type is never used to call through.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(name.as_bytes())
            .is_ok()
    }
}

/// `Ok(device count)` if a driver is present and `cuInit` succeeds; a typed error otherwise.
///
/// Never panics, also on machines with no driver at all. A driver with no device gives `Ok(0)`.
pub fn probe() -> Result<usize> {
    init()
}

/// The driver's CUDA version as `1000 * major + 10 * minor` (13000 for CUDA 13.0).
pub fn driver_version() -> Result<i32> {
    ensure_loaded()?;
    let mut version: std::ffi::c_int = 0;
    // SAFETY: the library is loaded; `version` is a valid out-pointer. cuDriverGetVersion does
    // not need cuInit.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    Ok(version)
}
