//! Arbitrary UTF-8 as a `--dtype` argument.
//!
//! Properties, beyond "never panics": an accepted dtype's canonical descr parses as a descr
//! literal to the same dtype, and building a layout from it either succeeds or fails with an
//! error (never a panic), whatever the sub-array shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{DType, Layout};

fuzz_target!(|text: &str| {
    let (dtype, shape) = match parse_user_dtype(text) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let _ = dtype.to_string();
    let again = DType::from_descr_literal(&dtype.descr)
        .unwrap_or_else(|e| panic!("descr {} of {text:?} does not parse: {e}", dtype.descr));
    assert_eq!(again, dtype);
    match Layout::new(dtype, shape) {
        Ok(layout) => {
            assert!(layout.record_bytes() > 0);
            assert!(layout.record_bytes() <= isize::MAX as usize);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
