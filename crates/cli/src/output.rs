//! Writing to the terminal without panicking: `println!` panics when standard output is a
//! closed pipe, so every command writes to [`stdout`] with `writeln!` and returns the error,
//! which the top level recognises ([`is_broken_pipe`]) and ends on quietly.

use std::io;

/// Standard output, locked for the command's report. Write errors come back to the caller.
pub fn stdout() -> io::StdoutLock<'static> {
    io::stdout().lock()
}

/// Whether `error` is, or was caused by, a write to a pipe whose reader has gone.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `text` with every control character but newline escaped as Rust writes it (`\u{1b}`, `\t`,
/// `\r`), so that a file name cannot move the cursor or recolour the terminal.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape_controls("a\u{1b}[31mred\tb\rc\nd\u{7f}é"),
            "a\\u{1b}[31mred\\tb\\rc\nd\\u{7f}é"
        );
    }

    #[test]
    fn broken_pipe_is_found_in_the_chain() {
        let pipe = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&pipe.context("writing the report")));
        let other = anyhow::Error::from(io::Error::from(io::ErrorKind::NotFound));
        assert!(!is_broken_pipe(&other));
    }
}
