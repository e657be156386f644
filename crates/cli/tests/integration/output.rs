//! What reaches the terminal: a closed standard output ends a command quietly, and file names
//! in errors cannot send escape sequences.

use std::process::{Command, Stdio};

use crate::common::{fixture, one_line_error, pinfeed, shown};

/// Runs `pinfeed args` with its standard output a pipe whose reader has gone before anything was
/// written (`pinfeed ... | true`); returns the exit code and standard error.
fn into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinfeed"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run the pinfeed binary");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_every_report_quietly() {
    let (_dir, path) = fixture("data.npy");
    let p = shown(&path);
    assert_eq!(
        pinfeed(["gen", &p, "--records", "4096", "--shape", "16"]).code,
        Some(0)
    );
    let stream = [
        "stream",
        p.as_str(),
        "--batch-size",
        "1024",
        "--device",
        "cpu",
    ];
    let json: Vec<&str> = stream.iter().copied().chain(["--json"]).collect();
    let verify: Vec<&str> = stream.iter().copied().chain(["--verify"]).collect();
    let runs: [&[&str]; 5] = [
        &stream,
        &json,
        &verify,
        &["doctor", "--device", "cpu", "--json"],
        &[
            "bench", "--device", "cpu", "--rows", "8", "--cols", "16", "--json",
        ],
    ];
    for args in runs {
        let (code, stderr) = into_closed_pipe(args);
        // Status 0: the reader wanted no more, as with ripgrep; nothing on stderr at all.
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
    }
}

#[test]
fn control_characters_in_file_names_are_escaped() {
    let (dir, _) = fixture("unused");
    let path = dir.path().join("bad\u{1b}[31mname\r.npy");
    let run = pinfeed(["stream", &shown(&path), "--batch-size", "4"]);
    let message = one_line_error(&run, &["bad\\u{1b}[31mname\\r.npy"]);
    assert!(!run.stderr.contains('\u{1b}'), "{message}");
    assert!(!run.stderr.contains('\r'), "{message}");
    // The usage errors of clap too (clap drops the escape sequence itself).
    let run = pinfeed(["stream", &shown(&path), "--batch-size", "x\u{1b}[2J\u{7}"]);
    one_line_error(&run, &["--batch-size"]);
    assert!(
        !run.stderr.contains(['\u{1b}', '\u{7}']),
        "{:?}",
        run.stderr
    );
}
