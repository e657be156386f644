use std::io::Write;

use pinfeed_cuda::{CudaError, Registration};

use crate::common::{ctx, pattern, roundtrip};

#[test]
#[ignore = "needs a CUDA device"]
fn register_a_vec_in_place() {
    let ctx = ctx();
    let len = (4 << 20) + 7;
    let mut data = pattern(len, 0x11);
    let expected = data.clone();
    {
        // SAFETY: `data` is neither moved, resized nor dropped while `reg` lives.
        let reg = unsafe { Registration::new(&ctx, data.as_mut_ptr(), len, false) }.unwrap();
        assert_eq!(reg.len(), len);
        // Registering the same range twice is a typed error.
        // SAFETY: as above.
        match unsafe { Registration::new(&ctx, data.as_mut_ptr(), len, false) } {
            Err(CudaError::Driver { call, code, .. }) => {
                assert_eq!(call, "cuMemHostRegister");
                assert_eq!(
                    code, 712,
                    "expected CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
                );
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
        // SAFETY: `data` is valid for `len` bytes during the call.
        let back = unsafe { roundtrip(&ctx, data.as_ptr(), len) };
        assert!(back == expected);
    }
    // Unregistered: can be registered again.
    // SAFETY: as above.
    let again = unsafe { Registration::new(&ctx, data.as_mut_ptr(), len, false) };
    assert!(again.is_ok(), "{again:?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn register_read_only_file_mapping() {
    let ctx = ctx();
    let len = (4 << 20) + 100;
    let expected = pattern(len, 0x77);
    let path = std::env::temp_dir().join(format!("pinfeed-cuda-ro-{}.bin", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&expected)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared read-only mapping of a file we just wrote and nobody else changes.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    {
        // Without the read-only flag the driver refuses a read-only mapping.
        // SAFETY: the mapping stays until munmap below, after the registration is dropped.
        let rw = unsafe { Registration::new(&ctx, map.cast(), len, false) };
        assert!(
            rw.is_err(),
            "registering a read-only mapping read-write succeeded"
        );
        // SAFETY: as above.
        let reg = unsafe { Registration::new(&ctx, map.cast(), len, true) }.unwrap();
        assert!(reg.read_only());
        // SAFETY: the mapping is valid for `len` bytes during the call.
        let back = unsafe { roundtrip(&ctx, map.cast::<u8>(), len) };
        assert!(back == expected);
    }
    // SAFETY: the mapping made above; its registration is gone.
    unsafe { libc::munmap(map, len) };
    drop(file);
    let _ = std::fs::remove_file(&path);
}
