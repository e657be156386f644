//! What a machine with no driver sees. Runs everywhere; asserts only where there is no driver.

use pinfeed_cuda::{driver_present, probe, Context, CudaError};

#[test]
fn probe_and_context_fail_typed_without_driver() {
    if driver_present() {
        eprintln!("a CUDA driver is present; the no-driver assertions do not apply");
        return;
    }
    match probe() {
        Err(e @ CudaError::NoDriver { .. }) => {
            let message = e.to_string();
            assert!(message.contains("libcuda.so.1"), "{message}");
            assert!(!message.contains('\n') && message.len() < 160, "{message}");
            assert!(message.contains("--device cpu"), "{message}");
            let tried = e.tried();
            assert!(tried.iter().any(|n| n == "libcuda.so.1"), "{tried:?}");
            let mut unique = tried.to_vec();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), tried.len(), "a name tried twice: {tried:?}");
        }
        other => panic!("expected NoDriver, got {other:?}"),
    }
    match Context::new(0) {
        Err(CudaError::NoDriver { .. }) => {}
        other => panic!("expected NoDriver, got {other:?}"),
    }
    // Asking twice must not change the answer (nothing half-initialised).
    assert!(matches!(probe(), Err(CudaError::NoDriver { .. })));
}
