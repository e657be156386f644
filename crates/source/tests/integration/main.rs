//! Integration tests of pinfeed-source, one module per area. Fixtures are written by numpy
//! itself (`python3 -c ...`), so numpy must be installed: `pip install numpy`.

mod compressed_images;
mod direct;
mod errors;
mod images;
mod memory;
mod npy_files;
mod raw_files;
mod safetensors_files;
mod shards;
mod shrink;
mod tables;
mod text_files;
mod uring;
mod util;
mod writer;
