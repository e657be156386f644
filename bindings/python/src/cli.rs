//! `pinfeed._pinfeed.cli_main`: the `pinfeed` command run inside this Python process, for the
//! package's `pinfeed` console script (`pinfeed._cli.main`).

use pyo3::prelude::*;

/// Runs the `pinfeed` command line `argv` (the program's name first) and returns its exit
/// status: 0 done (also when standard output was closed early), 1 a `--verify` mismatch, 2 an
/// error. The GIL is released while the command runs; it never exits the process itself.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| pinfeed_cli::main_with_args(argv))
}
