//! Arbitrary UTF-8 as the value of a `.npy` header's `'descr'` key.
//!
//! Properties, beyond "never panics": the canonical descr of an accepted dtype parses back to
//! the same dtype (canonicalisation is idempotent) and every result and error formats without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinfeed_source::DType;

fuzz_target!(|text: &str| {
    let dtype = match DType::from_descr_literal(text) {
        Ok(dtype) => dtype,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let again = DType::from_descr_literal(&dtype.descr)
        .unwrap_or_else(|e| panic!("canonical descr {} does not parse: {e}", dtype.descr));
    assert_eq!(again, dtype, "canonical descr is not a fixed point");
    let _ = (dtype.is_simple(), dtype.scalar_kind());
    let _ = dtype.to_string();
});
