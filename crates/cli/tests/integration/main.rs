//! Integration tests of the `pinfeed` command, one module per area (ripgrep's layout).
//!
//! Most tests run the built binary (`CARGO_BIN_EXE_pinfeed`) on files written by hand or by
//! numpy in a temporary folder, and hold it to the promise of the README: an error is exactly
//! one line on stderr, `pinfeed: error: ...`, naming the file and the problem, with exit code 2
//! and never a panic. `library` covers what the command line cannot reach (a file shrinking while
//! it streams), and `corpus` replays the fuzz seed corpus through the parsers on stable Rust.

mod common;
mod corpus;
mod gen;
mod images;
mod library;
mod multi;
mod npy_errors;
mod options;
mod output;
mod raw;
mod success;
mod tokens;
