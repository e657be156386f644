//! The fuzz seed corpus (fuzz/corpus/<target>/) through the three parsers, on stable Rust.
//!
//! cargo-fuzz needs nightly; this replays the committed seeds (and any crash input saved next
//! to them) with the same properties the fuzz targets check, so a regression shows up in the
//! ordinary `cargo test`.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::npy::{header_bytes, Header};
use pinfeed_source::{DType, Layout};

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    out.sort();
    assert!(
        out.len() >= 10,
        "{}: only {} seeds",
        dir.display(),
        out.len()
    );
    out
}

/// Runs `f` and turns a panic into a failure that names the seed.
fn no_panic(seed: &Path, f: impl FnOnce() + std::panic::UnwindSafe) {
    if let Err(p) = std::panic::catch_unwind(f) {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("{} panicked: {what}", seed.display());
    }
}

#[test]
fn npy_header_seeds() {
    let mut parsed = 0;
    for (seed, bytes) in seeds("npy_header") {
        let ok = std::sync::atomic::AtomicBool::new(false);
        no_panic(&seed, || {
            let path = Path::new("seed.npy");
            let a = Header::parse(&bytes, path);
            let b = Header::read_from(&mut Cursor::new(&bytes), path);
            match (&a, &b) {
                (Ok(x), Ok(y)) => assert_eq!(x, y),
                (Err(x), Err(y)) => {
                    assert!(x.to_string().contains("seed.npy"), "{x}");
                    assert!(y.to_string().contains("seed.npy"), "{y}");
                }
                _ => panic!("parse {a:?} vs read_from {b:?}"),
            }
            if let Ok(h) = a {
                ok.store(true, std::sync::atomic::Ordering::Relaxed);
                if let Ok(layout) = h.layout() {
                    let again =
                        Header::parse(&header_bytes(&layout, h.num_records()), path).unwrap();
                    assert_eq!((again.descr, again.shape), (h.descr, h.shape));
                }
            }
        });
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let ok = ok.into_inner();
        // Seeds are named for what they are: numpy-written headers parse, `bad_*` ones do not.
        if name.starts_with("bad_") {
            assert!(
                !ok || name == "bad_zero_records" || name == "bad_zero_itemsize",
                "{name} parsed"
            );
        } else {
            assert!(ok, "{name} did not parse");
            parsed += 1;
        }
    }
    assert!(parsed >= 5);
}

#[test]
fn dtype_literal_seeds() {
    for (seed, bytes) in seeds("dtype_literal") {
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        no_panic(&seed, || {
            if let Ok(d) = DType::from_descr_literal(&text) {
                assert_eq!(DType::from_descr_literal(&d.descr).unwrap(), d);
            }
        });
    }
}

#[test]
fn user_dtype_seeds() {
    for (seed, bytes) in seeds("user_dtype") {
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        no_panic(&seed, || {
            if let Ok((d, shape)) = parse_user_dtype(&text) {
                assert_eq!(DType::from_descr_literal(&d.descr).unwrap(), d);
                let _ = Layout::new(d, shape);
            }
        });
    }
}

/// Inputs that once crashed a fuzz target (fuzz/regressions/), through every parser.
#[test]
fn regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let seed = entry.unwrap().path();
        let bytes = std::fs::read(&seed).unwrap();
        no_panic(&seed, || {
            let _ = Header::parse(&bytes, Path::new("seed.npy")).and_then(|h| h.layout());
            if let Ok(text) = std::str::from_utf8(&bytes) {
                if let Ok(d) = DType::from_descr_literal(text) {
                    let _ = d.to_string();
                    let _ = Layout::new(d, vec![]).map_err(|e| e.to_string());
                }
                if let Ok((d, shape)) = parse_user_dtype(text) {
                    let _ = Layout::new(d, shape).map_err(|e| e.to_string());
                }
            }
        });
    }
}
