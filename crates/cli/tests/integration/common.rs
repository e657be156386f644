//! Running `pinfeed`, checking its one-line errors, and making fixtures with numpy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What a run of `pinfeed` left behind.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `pinfeed` with `args`. `RUST_BACKTRACE=1` makes any panic loud instead of terse.
pub fn pinfeed<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out: Output = Command::new(env!("CARGO_BIN_EXE_pinfeed"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("cannot run the pinfeed binary");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `pinfeed` as [`pinfeed`] does, killing it and failing the test if it has not ended
/// within `limit` (for input that once made it block: a FIFO).
pub fn pinfeed_within(args: &[&str], limit: std::time::Duration) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinfeed"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run the pinfeed binary");
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("{args:?} did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Asserts the error contract and returns the message after `pinfeed: error: `: exit code 2,
/// nothing on stdout, exactly one line on stderr starting with `pinfeed: error:`, no panic or
/// backtrace, and every one of `needles` in the line.
#[track_caller]
pub fn one_line_error(run: &Run, needles: &[&str]) -> String {
    let context = format!(
        "exit code {:?}\n--- stderr ---\n{}--- stdout ---\n{}",
        run.code, run.stderr, run.stdout
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!run.stderr.contains(bad), "{bad:?} on stderr\n{context}");
    }
    assert_eq!(run.code, Some(2), "expected exit code 2\n{context}");
    assert!(
        run.stdout.is_empty(),
        "an error run wrote to stdout\n{context}"
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one line on stderr\n{context}"
    );
    assert!(
        run.stderr.ends_with('\n'),
        "the line is not terminated\n{context}"
    );
    let line = lines[0];
    let message = line
        .strip_prefix("pinfeed: error: ")
        .unwrap_or_else(|| panic!("the line does not start with `pinfeed: error: `\n{context}"));
    for needle in needles {
        assert!(
            line.contains(needle),
            "the error does not mention {needle:?}\n{context}"
        );
    }
    message.to_owned()
}

/// The path as `pinfeed` prints it in messages.
pub fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Runs `script` with numpy imported as `np`, `d` the fixture folder, and `zlib`, `os`,
/// `struct` imported; returns its stdout. Fails (never skips) without python3 and numpy.
pub fn python(dir: &Path, script: &str) -> String {
    let full =
        format!("import os, struct, sys, zlib\nimport numpy as np\nd = sys.argv[1]\n{script}");
    let out = Command::new("python3")
        .arg("-c")
        .arg(&full)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}); these tests make fixtures with numpy: `pip install numpy`")
        });
    assert!(
        out.status.success(),
        "python3 failed ({}):\n{}\nscript:\n{script}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh temporary folder and the path of `name` in it.
pub fn fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// A `.npy` preamble and header of `version` (1, 2 or 3) around `text`, with no padding and no
/// data: for headers numpy refuses to write.
pub fn npy_header(version: u8, text: &[u8]) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&u16::try_from(text.len()).unwrap().to_le_bytes());
    } else {
        out.extend_from_slice(&u32::try_from(text.len()).unwrap().to_le_bytes());
    }
    out.extend_from_slice(text);
    out
}

/// Ten records of 3 x 4 bytes, saved by numpy: the good file the option tests stream.
pub fn small_npy() -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = fixture("small.npy");
    python(
        dir.path(),
        "np.save(os.path.join(d, 'small.npy'), np.arange(120, dtype=np.uint8).reshape(10, 3, 4))",
    );
    (dir, path)
}

/// `pinfeed stream <path> --batch-size 2 --device cpu` followed by `extra`.
pub fn stream(path: &Path, extra: &[&str]) -> Run {
    stream_batches(path, "2", extra)
}

/// `pinfeed stream <path> --batch-size <batch_size> --device cpu` followed by `extra`.
pub fn stream_batches(path: &Path, batch_size: &str, extra: &[&str]) -> Run {
    let mut args: Vec<String> = vec![
        "stream".into(),
        path.display().to_string(),
        "--batch-size".into(),
        batch_size.into(),
        "--device".into(),
        "cpu".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    pinfeed(args)
}

/// The JSON report of a run that must have succeeded.
#[track_caller]
pub fn json_report(run: &Run) -> serde_json::Value {
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.stdout))
}
