//! The `pinfeed` command: generate a dataset, stream it to the GPU, run the seed benchmark.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// The `json!` report of `stream` has more keys than the default limit expands.
#![recursion_limit = "256"]

mod bench;
mod doctor;
mod gen;
mod plot;
mod stream;
mod usage;

use std::process::ExitCode;

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
pub enum Outcome {
    /// Everything as asked.
    Ok,
    /// The command ran but found what it was asked to look for (a verification mismatch).
    Failed,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to standard output with exit 0.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
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
            eprintln!(
                "pinfeed: error: {} (see `pinfeed --help`)",
                message.join(" ")
            );
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Gen(args) => gen::run(args),
        Command::Stream(args) => stream::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Doctor(args) => doctor::run(args),
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(1),
        Err(e) => {
            // One line, the whole chain of causes, no backtrace.
            eprintln!("pinfeed: error: {}", one_line(&e));
            ExitCode::from(2)
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
