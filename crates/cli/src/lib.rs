//! The `pinfeed` command: generate a dataset, stream it to the GPU, run the seed benchmark.
//!
//! The command is a library so that more than one program can be it: the `pinfeed` binary, and
//! the Python package's `pinfeed` entry point (which calls [`main_with_args`] with the GIL
//! released). Nothing here exits the process or panics on a closed output: a command returns
//! its exit status.
//!
//! Exit statuses: 0 done (also when standard output was closed early, as by `| head`: the
//! reader wanted no more, as ripgrep and other command-line tools treat it), 1 a `--verify`
//! mismatch, 2 any error (one line on standard error).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// The `json!` report of `stream` has more keys than the default limit expands.
#![recursion_limit = "256"]

/// `eprintln!` that never panics: a closed standard error loses the line, nothing more.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod doctor;
mod gen;
mod images;
mod output;
mod plot;
mod stream;
mod tokens;
mod usage;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// Feed training data from disk or host memory to NVIDIA GPUs at the speed of the bus.
#[derive(Parser, Debug)]
#[command(name = "pinfeed", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing would buy nothing
enum Command {
    /// Write a .npy dataset of random records.
    Gen(gen::GenArgs),
    /// Stream every record of a dataset to the device and report the rate.
    Stream(stream::StreamArgs),
    /// The seed experiment: a large tensor moved row by row, three ways.
    Bench(bench::BenchArgs),
    /// Describe this machine and what it can do for data loading.
    Doctor(doctor::DoctorArgs),
}

/// How a command ended when it did not fail outright.
pub(crate) enum Outcome {
    /// Everything as asked.
    Ok,
    /// The command ran but found what it was asked to look for (a verification mismatch).
    Failed,
}

/// Runs the command line `args` (the program's name first) and returns the exit status: 0
/// done, 1 a `--verify` mismatch, 2 an error. Help and version go to standard output.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        // Help and version go to standard output with exit 0.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return 0;
        }
        // Usage errors: one line like every other error, exit 2.
        Err(e) => {
            // clap's message, without its usage block, folded onto one line.
            let detail = e.to_string();
            let message: Vec<&str> = detail
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(|l| l.trim().trim_start_matches("error: "))
                .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
                .collect();
            note!(
                "pinfeed: error: {} (see `pinfeed --help`)",
                output::escape_controls(&message.join(" "))
            );
            return 2;
        }
    };
    let result = match cli.command {
        Command::Gen(args) => gen::run(args),
        Command::Stream(args) => stream::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Doctor(args) => doctor::run(args),
    };
    match result {
        Ok(Outcome::Ok) => 0,
        Ok(Outcome::Failed) => 1,
        // The reader of standard output has gone (`| head`, `| true`): it wanted no more.
        Err(e) if output::is_broken_pipe(&e) => 0,
        Err(e) => {
            // One line, the whole chain of causes, no backtrace; nothing raw reaches the
            // terminal (a file name may hold escape sequences).
            note!("pinfeed: error: {}", output::escape_controls(&one_line(&e)));
            2
        }
    }
}

fn one_line(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ").replace('\n', " ")
}
