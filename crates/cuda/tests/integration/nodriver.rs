//! What a machine with no driver sees. Runs everywhere; asserts only where there is no driver.

use pinfeed_cuda::{driver_present, probe, Context, CudaError};

#[test]
fn probe_and_context_fail_typed_without_driver() {
    if driver_present() {
        eprintln!("a CUDA driver is present; the no-driver assertions do not apply");
        return;
    }
    match probe() {
        Err(CudaError::NoDriver { detail }) => assert!(detail.contains("libcuda.so.1"), "{detail}"),
        other => panic!("expected NoDriver, got {other:?}"),
    }
    match Context::new(0) {
        Err(CudaError::NoDriver { .. }) => {}
        other => panic!("expected NoDriver, got {other:?}"),
    }
    // Asking twice must not change the answer (nothing half-initialised).
    assert!(matches!(probe(), Err(CudaError::NoDriver { .. })));
}
