use cudarc::driver::sys;
use pinfeed_cuda::{driver_version, probe, CUdevice_attribute, Context, CudaError};

use crate::common::ctx;

#[test]
#[ignore = "needs a CUDA device"]
fn probe_counts_devices_and_version_is_known() {
    let count = probe().unwrap();
    assert!(count >= 1);
    let version = driver_version().unwrap();
    assert!(version >= 12000, "driver version {version}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn ordinal_out_of_range_is_no_device() {
    let count = probe().unwrap();
    match Context::new(99) {
        Err(e @ CudaError::NoDevice { .. }) => {
            assert!(matches!(e, CudaError::NoDevice { ordinal: 99, count: c } if c == count));
            assert!(e.to_string().starts_with("cuda:99 requested but "), "{e}");
        }
        other => panic!("expected NoDevice, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_queries() {
    let ctx = ctx();
    assert_eq!(ctx.ordinal(), 0);
    let name = ctx.name().unwrap();
    assert!(!name.is_empty());
    let bus = ctx.pci_bus_id().unwrap();
    assert!(bus.contains(':'), "{bus}");
    let (free, total) = ctx.mem_info().unwrap();
    assert!(free > 0 && free <= total, "{free} / {total}");
    let major = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .unwrap();
    assert!(major >= 3, "{major}");
    eprintln!("{name} at {bus}, sm_{major}x, {free} of {total} bytes free");
}

#[test]
#[ignore = "needs a CUDA device"]
fn calls_restore_the_threads_current_context() {
    let ctx = ctx();
    std::thread::spawn(move || {
        let current = || {
            let mut c: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the driver is initialised (we hold a context).
            assert_eq!(
                unsafe { sys::cuCtxGetCurrent(&mut c) },
                sys::CUresult::CUDA_SUCCESS
            );
            c
        };
        assert!(current().is_null(), "a fresh thread has no current context");
        ctx.mem_info().unwrap();
        assert!(current().is_null(), "mem_info left its context current");
        ctx.bind().unwrap();
        assert_eq!(current(), ctx.raw());
        ctx.mem_info().unwrap();
        assert_eq!(current(), ctx.raw());
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn forked_child_gets_forked_error() {
    let ctx = ctx();
    // SAFETY: the child only calls getpid, formats an error and exits with _exit; glibc keeps
    // malloc usable in the child of a multi-threaded parent.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = matches!(ctx.mem_info(), Err(CudaError::Forked { .. }))
            && matches!(probe(), Err(CudaError::Forked { .. }))
            && matches!(Context::new(0), Err(CudaError::Forked { .. }));
        // Leak: dropping would be skipped anyway, but do not run destructors in the child.
        std::mem::forget(ctx);
        // SAFETY: terminates the child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    // The parent is unaffected.
    ctx.mem_info().unwrap();
}
