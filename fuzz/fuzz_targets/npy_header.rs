//! Arbitrary bytes as the start of a `.npy` file.
//!
//! Properties, beyond "never panics": the slice parser (`Header::parse`) and the stream parser
//! (`Header::read_from`) agree; every error names the file; a parsed header's data starts inside or at the end of the bytes
//! it came from; and a header that gives a layout round-trips through `header_bytes`.
#![no_main]

use std::io::Cursor;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pinfeed_source::npy::{header_bytes, Header};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.npy");
    let parsed = Header::parse(data, path);
    let streamed = Header::read_from(&mut Cursor::new(data), path);
    match (&parsed, &streamed) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "parse and read_from disagree"),
        (Err(_), Err(_)) => {}
        _ => panic!("parse gave {parsed:?} but read_from gave {streamed:?}"),
    }
    let header = match parsed {
        Ok(header) => header,
        Err(e) => {
            assert!(e.to_string().contains("fuzz.npy"), "{e}");
            return;
        }
    };
    assert!(header.data_offset <= data.len() as u64);
    assert!(!header.shape.is_empty());
    assert!(!header.fortran_order);
    let _ = header.data_bytes();
    let layout = match header.layout() {
        Ok(layout) => layout,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let again = header_bytes(&layout, header.num_records());
    assert_eq!(again.len() % 64, 0, "data must start 64-byte aligned");
    let reparsed = Header::parse(&again, path).expect("our own header must parse");
    assert_eq!(reparsed.descr, header.descr);
    assert_eq!(reparsed.shape, header.shape);
    assert_eq!(reparsed.data_offset, again.len() as u64);
});
