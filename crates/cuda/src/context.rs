//! The primary context of one device.

use std::ffi::{c_char, c_int, CStr};
use std::sync::{Arc, OnceLock};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute};

use crate::driver::{check, check_pid, current_pid, init, named};
use crate::error::{CudaError, Result};

/// The primary context of one device, retained for as long as this value lives.
///
/// The primary context is the one the CUDA runtime (and so PyTorch) uses, so memory and events
/// made here can be used by torch on the same device without peer mappings.
///
/// Methods make the context current only for the duration of the call and restore whatever was
/// current before (see [`Context::bind`] for the permanent version), so calling them from a thread
/// where torch works on another device does not move torch to this one.
#[derive(Debug)]
pub struct Context {
    /// Invariant: a context retained by `cuDevicePrimaryCtxRetain(dev)` in process `pid` and
    /// released only in `Drop`.
    ctx: CUcontext,
    dev: CUdevice,
    ordinal: usize,
    /// The process that retained the context; any other process is a forked child.
    pid: i32,
    /// The device's NUMA node, read from sysfs on first use: a device does not move, and every
    /// [`PinnedMemory::alloc`](crate::PinnedMemory::alloc) asks, inside the time that `bench`
    /// and `doctor` measure for it.
    numa_node: OnceLock<Option<u32>>,
    /// The device's memory in bytes (`cuDeviceTotalMem`), read on first use: every loader
    /// start checks a batch against it, and it never changes.
    total_memory: OnceLock<usize>,
}

// SAFETY: a CUcontext is a process-wide driver handle, not tied to the thread that created it;
// the driver API is thread-safe, and this type hands out no references into driver memory.
unsafe impl Send for Context {}
// SAFETY: every method takes `&self` and only passes the handle to thread-safe driver calls.
unsafe impl Sync for Context {}

/// Restores the previously current context when dropped.
///
/// Holds a raw pointer, so it is neither `Send` nor `Sync`: it must be dropped on the thread that
/// made it, which is the thread whose current context it changed.
#[must_use]
pub(crate) struct CurrentGuard {
    prev: CUcontext,
    changed: bool,
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        if self.changed {
            // SAFETY: `prev` was current on this thread when the guard was made (or null, which
            // unbinds); the guard never leaves this thread (it is !Send).
            let _ = unsafe { result::ctx::set_current(self.prev) };
        }
    }
}

impl Context {
    /// Retains the primary context of device `ordinal`.
    ///
    /// Fails with [`CudaError::NoDriver`] when there is no driver and [`CudaError::NoDevice`]
    /// when the ordinal is out of range.
    pub fn new(ordinal: usize) -> Result<Arc<Context>> {
        let count = init()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ordinal_c =
            c_int::try_from(ordinal).map_err(|_| CudaError::NoDevice { ordinal, count })?;
        // cuInit succeeded (init) and the ordinal is in range.
        let dev = named("cuDeviceGet", result::device::get(ordinal_c))?;
        // SAFETY: `dev` came from cuDeviceGet. The retain is balanced by the release in Drop.
        let ctx = named("cuDevicePrimaryCtxRetain", unsafe {
            result::primary_ctx::retain(dev)
        })?;
        Ok(Arc::new(Context {
            ctx,
            dev,
            ordinal,
            pid: current_pid(),
            numa_node: OnceLock::new(),
            total_memory: OnceLock::new(),
        }))
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`) and leaves it so.
    ///
    /// Not needed before calling this crate: every method that needs a current context makes it
    /// current itself, for the duration of the call.
    pub fn bind(&self) -> Result<()> {
        self.check_fork()?;
        // SAFETY: `self.ctx` is a live retained context (field invariant) in this process.
        named("cuCtxSetCurrent", unsafe {
            result::ctx::set_current(self.ctx)
        })
    }

    /// Makes the context current until the guard drops, then restores the previous one.
    pub(crate) fn enter(&self) -> Result<CurrentGuard> {
        self.check_fork()?;
        // The driver is initialised (we hold a context); none current is a null handle.
        let prev =
            named("cuCtxGetCurrent", result::ctx::get_current())?.unwrap_or(std::ptr::null_mut());
        if prev == self.ctx {
            return Ok(CurrentGuard {
                prev,
                changed: false,
            });
        }
        // SAFETY: `self.ctx` is a live retained context (field invariant).
        named("cuCtxSetCurrent", unsafe {
            result::ctx::set_current(self.ctx)
        })?;
        Ok(CurrentGuard {
            prev,
            changed: true,
        })
    }

    /// Fails with [`CudaError::Forked`] in a forked child.
    pub(crate) fn check_fork(&self) -> Result<()> {
        check_pid(self.pid)
    }

    /// Whether this is still the process that created the context (drops skip the driver if not).
    pub(crate) fn in_owner_process(&self) -> bool {
        self.pid == current_pid()
    }

    /// The device ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The raw context handle.
    pub fn raw(&self) -> CUcontext {
        self.ctx
    }

    /// The raw device handle.
    pub fn device(&self) -> CUdevice {
        self.dev
    }

    /// The device's marketing name (`NVIDIA H200`).
    pub fn name(&self) -> Result<String> {
        self.check_fork()?;
        // Not `result::device::get_name`: it panics on a name without a NUL in 128 bytes.
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for the length passed; `self.dev` is a valid device.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, self.dev)
        })?;
        Ok(c_buf_to_string(&buf))
    }

    /// The PCI bus id in `domain:bus:device.function` form (`0000:3b:00.0`).
    pub fn pci_bus_id(&self) -> Result<String> {
        self.check_fork()?;
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` is writable for the length passed; `self.dev` is a valid device.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, self.dev)
        })?;
        Ok(c_buf_to_string(&buf))
    }

    /// The NUMA node the device hangs off, from sysfs; `None` when the bus id, the sysfs entry
    /// or the node (`-1`) is missing. Read once per context.
    pub fn numa_node(&self) -> Option<u32> {
        *self.numa_node.get_or_init(|| {
            let dir = crate::numa::pci_device_dir(&self.pci_bus_id().ok()?)?;
            crate::numa::device_numa_node(&dir)
        })
    }

    /// `(free, total)` device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let _current = self.enter()?;
        // Our context is current (guard).
        named("cuMemGetInfo", result::mem_get_info())
    }

    /// The device's memory in bytes (`cuDeviceTotalMem`, read once): unlike [`Context::mem_info`]
    /// it asks the driver nothing after the first call, so a loader's start pays nothing for it.
    pub fn total_memory(&self) -> Result<usize> {
        if let Some(&total) = self.total_memory.get() {
            return Ok(total);
        }
        self.check_fork()?;
        // SAFETY: `self.dev` came from cuDeviceGet.
        let total = named("cuDeviceTotalMem", unsafe {
            result::device::total_mem(self.dev)
        })?;
        Ok(*self.total_memory.get_or_init(|| total))
    }

    /// One device attribute (`cuDeviceGetAttribute`).
    pub fn attribute(&self, attr: CUdevice_attribute) -> Result<i32> {
        self.check_fork()?;
        // SAFETY: `self.dev` came from cuDeviceGet.
        named("cuDeviceGetAttribute", unsafe {
            result::device::get_attribute(self.dev, attr)
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.in_owner_process() {
            // The driver state belongs to the parent; touching it here is what we must not do.
            return;
        }
        // SAFETY: balances the retain in `new`; every object using the context holds an
        // `Arc<Context>`, so none is left when this runs.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// The NUL-terminated prefix of `buf` as a string.
fn c_buf_to_string(buf: &[c_char]) -> String {
    // c_char is i8 or u8 depending on the target; reinterpret as bytes.
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}
