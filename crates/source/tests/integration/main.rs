//! Integration tests of pinfeed-source, one module per area. Fixtures are written by numpy
//! itself (`python3 -c ...`), so numpy must be installed: `pip install numpy`.

mod errors;
mod npy_files;
mod raw_files;
mod shrink;
mod util;
mod writer;
