//! The `pinfeed` command: generate a dataset, stream it to the GPU, run the seed benchmark.

mod bench;
mod gen;
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
enum Command {
    /// Write a .npy dataset of random records.
    Gen(gen::GenArgs),
    /// Stream every record of a dataset to the device and report the rate.
    Stream(stream::StreamArgs),
    /// The seed experiment: a large tensor moved row by row, three ways.
    Bench(bench::BenchArgs),
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
        Err(e) => {
            // clap prints help and version to stdout with exit 0, usage errors with exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Gen(args) => gen::run(args),
        Command::Stream(args) => stream::run(args),
        Command::Bench(args) => bench::run(args),
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
