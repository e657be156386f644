//! The `pinfeed` command; everything but the exit is in the library (`pinfeed_cli`), which the
//! Python package's `pinfeed` entry point calls as well.

use std::process::ExitCode;

fn main() -> ExitCode {
    let status = pinfeed_cli::main_with_args(std::env::args_os());
    ExitCode::from(u8::try_from(status).unwrap_or(2))
}
