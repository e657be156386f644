//! Malformed and refused `.npy` files: each is one line naming the file and the problem.

use std::fs;
use std::path::Path;

use crate::common::{fixture, npy_header, one_line_error, python, shown, small_npy, stream};

/// Saves `expr` (numpy) as `name` in a fresh folder and streams it; returns the error message.
fn saved_error(expr: &str, name: &str, needles: &[&str]) -> String {
    let (dir, path) = fixture(name);
    python(
        dir.path(),
        &format!("np.save(os.path.join(d, {name:?}), {expr}, allow_pickle=True)"),
    );
    error_naming(&path, needles)
}

/// Writes `bytes` as `name` in a fresh folder and streams it; returns the error message.
fn bytes_error(bytes: &[u8], name: &str, needles: &[&str]) -> String {
    let (_dir, path) = fixture(name);
    fs::write(&path, bytes).unwrap();
    error_naming(&path, needles)
}

/// Streams `path` and returns the error message, which must name the file and every needle.
fn error_naming(path: &Path, needles: &[&str]) -> String {
    let path_shown = shown(path);
    let mut all = vec![path_shown.as_str()];
    all.extend_from_slice(needles);
    one_line_error(&stream(path, &[]), &all)
}

fn small_bytes() -> Vec<u8> {
    let (_dir, path) = small_npy();
    fs::read(path).unwrap()
}

#[test]
fn truncated_inside_the_header() {
    let good = small_bytes();
    bytes_error(
        &good[..30],
        "cut.npy",
        &["malformed .npy header", "file of 30 bytes"],
    );
}

#[test]
fn truncated_inside_the_preamble() {
    let good = small_bytes();
    bytes_error(
        &good[..9],
        "cut.npy",
        &["malformed .npy header", "end of file"],
    );
    bytes_error(b"", "empty.npy", &["an empty file"]);
}

#[test]
fn header_promises_more_data_than_the_file_holds() {
    let good = small_bytes();
    bytes_error(
        &good[..good.len() - 5],
        "short.npy",
        &["header promises 120 bytes", "holds 115", "truncated"],
    );
}

#[test]
fn header_lying_about_the_shape() {
    // A header that claims 1000 records in front of the data of 10.
    let (dir, path) = fixture("lying.npy");
    python(
        dir.path(),
        "from numpy.lib import format as f\n\
         with open(os.path.join(d, 'lying.npy'), 'wb') as o:\n\
         \x20   f.write_array_header_1_0(o, {'descr': '|u1', 'fortran_order': False, 'shape': (1000, 12)})\n\
         \x20   o.write(bytes(120))",
    );
    one_line_error(
        &stream(&path, &[]),
        &[
            &shown(&path),
            "promises 12000 bytes",
            "holds 120",
            "truncated",
        ],
    );
}

#[test]
fn extra_trailing_bytes() {
    let mut bytes = small_bytes();
    bytes.extend_from_slice(b"xyz");
    bytes_error(
        &bytes,
        "extra.npy",
        &["holds 123", "extra bytes after the array data"],
    );
}

#[test]
fn fortran_order() {
    saved_error(
        "np.asfortranarray(np.zeros((4, 5), np.float32))",
        "f.npy",
        &["Fortran order", "np.ascontiguousarray"],
    );
}

#[test]
fn big_endian_dtype() {
    saved_error(
        "np.zeros((4, 5), '>f4')",
        "be.npy",
        &["'>f4'", "big-endian"],
    );
}

#[test]
fn object_dtype() {
    saved_error(
        "np.array([1, 'a', None], dtype=object)",
        "obj.npy",
        &["'|O'", "object arrays"],
    );
}

#[test]
fn shape_product_overflows_u64() {
    let header = npy_header(
        1,
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }\n",
    );
    bytes_error(&header, "huge.npy", &["4294967296", "overflows 64 bits"]);
}

#[test]
fn a_dimension_past_u64_is_a_header_error() {
    let header = npy_header(
        1,
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999,), }\n",
    );
    bytes_error(&header, "huge.npy", &["malformed .npy header"]);
}

#[test]
fn zero_records() {
    saved_error(
        "np.zeros((0, 5), np.uint8)",
        "zero.npy",
        &["empty (0 records)"],
    );
}

#[test]
fn zero_byte_records_from_a_zero_dimension() {
    saved_error(
        "np.zeros((5, 0), np.uint8)",
        "z.npy",
        &["[0]", "zero bytes"],
    );
}

#[test]
fn zero_byte_records_from_an_empty_structured_dtype() {
    saved_error(
        "np.zeros((5,), np.dtype([]))",
        "z.npy",
        &["dtype []", "zero bytes"],
    );
}

#[test]
fn scalar_array() {
    saved_error("np.float32(3)", "scalar.npy", &["0-d (scalar)"]);
}

#[test]
fn missing_file() {
    let (_dir, path) = fixture("nowhere.npy");
    one_line_error(
        &stream(&path, &[]),
        &[&shown(&path), "cannot open", "No such file"],
    );
}

#[test]
fn a_directory() {
    let dir = tempfile::tempdir().unwrap();
    one_line_error(
        &stream(dir.path(), &[]),
        // A directory is a dataset of shards; an empty one is refused.
        &[
            &shown(dir.path()),
            "directory holds no .npy, .safetensors, .pftxt, .parquet, .arrow or .jsonl files",
        ],
    );
}

#[test]
fn unreadable_file() {
    // Root reads whatever the mode says; the test only means something for other users.
    if is_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = fixture("secret.npy");
    fs::write(&path, small_bytes()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).unwrap();
    one_line_error(
        &stream(&path, &[]),
        &[&shown(&path), "cannot open", "ermission denied"],
    );
}

fn is_root() -> bool {
    // /proc/self/status holds the real and effective uids; no libc call needed.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn bad_magic() {
    let mut bytes = small_bytes();
    bytes[5] = b'X';
    bytes_error(&bytes, "magic.npy", &["magic", "\\x93NUMPX"]);
}

#[test]
fn unknown_version() {
    let mut bytes = small_bytes();
    bytes[6] = 4;
    bytes_error(&bytes, "v4.npy", &["format version", "4.0"]);
}

#[test]
fn header_length_past_the_end_of_the_file() {
    let mut bytes = b"\x93NUMPY\x01\x00\xff\xff".to_vec();
    bytes.extend_from_slice(b"{'descr': '|u1'");
    bytes_error(&bytes, "hlen.npy", &["65535 bytes", "file of 25 bytes"]);
    let mut v2 = b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec();
    v2.extend_from_slice(b"{'descr': '|u1'");
    bytes_error(&v2, "hlen2.npy", &["4294967295 bytes"]);
}

#[test]
fn non_utf8_version_3_header() {
    let mut bytes = npy_header(
        3,
        b"{'descr': '|u\xff', 'fortran_order': False, 'shape': (4,), }\n",
    );
    bytes.extend_from_slice(&[0; 4]);
    bytes_error(&bytes, "v3.npy", &["UTF-8", "0xff"]);
}

#[test]
fn malformed_dict() {
    bytes_error(
        &npy_header(
            1,
            b"{'descr': '|u1', 'fortran_order': False, 'shape': (4,\n",
        ),
        "open.npy",
        &["malformed .npy header"],
    );
    bytes_error(
        &npy_header(1, b"{'descr': '|u1', 'shape': (4,), }\n"),
        "nokey.npy",
        &["'fortran_order'"],
    );
    bytes_error(
        &npy_header(
            1,
            b"{'descr': '|u1', 'fortran_order': False, 'shape': (4,), 'x': 1}\n",
        ),
        "extrakey.npy",
        &["key 'x'"],
    );
}

#[test]
fn valid_npy_with_another_name_but_not_npy_named_garbage() {
    // A file named .npy without the magic is a header error, not a raw file.
    bytes_error(&[0u8; 100], "zeros.npy", &["magic"]);
}

/// A FIFO given as the dataset, with every reader the command picks by default and with
/// `doctor`: refused by its file type, without opening it (opening a FIFO for reading blocks
/// until a writer comes, which would hang the command).
#[test]
fn a_fifo_is_refused_not_opened() {
    use std::os::unix::ffi::OsStrExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("data.npy");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo_arg = fifo.to_str().unwrap();
    for args in [
        vec!["stream", fifo_arg, "--batch-size", "4", "--device", "cpu"],
        vec![
            "stream",
            fifo_arg,
            "--batch-size",
            "4",
            "--device",
            "cpu",
            "--reader",
            "mmap",
        ],
        vec!["doctor", fifo_arg, "--device", "cpu"],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pinfeed"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(30) {
                child.kill().unwrap();
                panic!("{args:?} hung on a FIFO");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if args[0] == "doctor" {
            // doctor reports on the machine whatever the dataset; it must name the FIFO's trouble.
            assert!(
                stderr.contains("data.npy")
                    || String::from_utf8_lossy(&out.stdout).contains("data.npy"),
                "{args:?}: {stderr}"
            );
        } else {
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("data.npy") && stderr.lines().count() == 1,
                "{args:?}: {stderr}"
            );
        }
    }
}
