//! pinfeed moves fixed-size records from disk or host memory to an NVIDIA GPU through a bounded
//! ring of pinned memory.
//!
//! A [`Loader`] joins a [`Source`](pinfeed_source::Source) (a `.npy` file, a raw record file, a
//! host buffer) to a device. At start-up it makes one page-locked allocation, within the budget
//! the user set, and carves it into slots. Reader threads read batches straight into free slots;
//! a copy thread issues each filled slot's copy to the device on its own stream and records an
//! event; the slot is reused only once that event has completed. Batches arrive in order as
//! [`Batch`]es that own their device memory and know when their copy finished.
//!
//! Without a CUDA driver (or with [`DeviceSpec::Cpu`]) the same pipeline runs on the host
//! backend, where device memory is host memory and the copy engine is a `memcpy` thread.
//!
//! ```
//! use std::sync::Arc;
//! use pinfeed::{DeviceSpec, Loader, LoaderOptions};
//! use pinfeed_source::{dtype::parse_user_dtype, HostBuffer, Layout};
//!
//! let (dtype, shape) = parse_user_dtype("u8").unwrap();
//! let layout = Layout::new(dtype, vec![4]).unwrap();
//! let source = HostBuffer::from_vec((0..40u8).collect(), layout).unwrap();
//! let options = LoaderOptions { batch_size: 3, device: DeviceSpec::Cpu, ..LoaderOptions::default() };
//! let loader = Loader::new(Arc::new(source), options).unwrap();
//! assert_eq!(loader.num_batches(), 4);
//! let mut bytes = Vec::new();
//! for batch in loader {
//!     let batch = batch.unwrap();
//!     let mut host = vec![0; batch.len_bytes()];
//!     batch.read_back(&mut host).unwrap();
//!     bytes.extend(host);
//! }
//! assert_eq!(bytes, (0..40u8).collect::<Vec<_>>());
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

mod backend;
pub mod decode_auto;
mod error;
mod gpu_images;
mod multi;
mod order;
mod pipeline;
mod pool;
mod register;
mod stager;
mod stats;
pub mod tune;

use std::sync::Arc;

pub use backend::{CopyFence, CudaFence, DeviceMemory, DeviceSpec};
pub use decode_auto::DecodeRates;
pub use error::{LoaderError, Result};
pub use gpu_images::{Decode, GpuImageDecode};
pub use multi::{DeviceShare, MultiLoader};
pub use order::{BatchRecords, EpochOrder, OrderSpec, Position, Shuffle, StepGroups};
pub use pinfeed_cuda::PinMethod;
pub use pinfeed_source::system;
pub use pipeline::{Batch, Loader, Waited};
pub use pool::{pinned_allocations, release_idle_pinned_memory};
pub use register::{Reader, UnknownReader};
pub use stager::{
    to_device, DeviceArray, PinnedRegion, Stager, StagerOptions, UploadCounters, UploadMethod,
    DEFAULT_STAGING_BUDGET,
};
pub use stats::{Bottleneck, DeviceStats, StageTimes, Stats};

/// Anything delivered into device memory: a loader's [`Batch`] or a [`Stager`]'s
/// [`DeviceArray`]. What the Python bindings export through DLPack.
pub trait DeviceData: Send + Sync {
    /// The device address (a host address on the host backend).
    fn address(&self) -> u64;
    /// Bytes of data.
    fn len_bytes(&self) -> usize;
    /// Where the data lives.
    fn device(&self) -> DeviceSpec;
    /// Blocks until the copy that fills the data has finished.
    fn wait_ready(&self) -> Result<()>;
    /// Makes `stream` wait for the copy without blocking the host (CUDA); waits on the host
    /// backend.
    ///
    /// # Safety
    /// `stream` is a live CUDA stream of the data's context, or any value on the host backend.
    unsafe fn stream_wait(&self, stream: u64) -> Result<()>;
    /// Frees the data once the work queued on `stream` so far is done with it.
    ///
    /// # Safety
    /// As for [`stream_wait`](DeviceData::stream_wait).
    unsafe fn release_after(self: Box<Self>, stream: u64) -> Result<()>;
    /// Copies the data back to the host, after its copy finished.
    fn read_back(&self, dst: &mut [u8]) -> Result<()>;
    /// The bytes on the host backend, after the copy finished; `None` on CUDA.
    fn host_bytes(&self) -> Result<Option<&[u8]>>;
}

impl DeviceData for Batch {
    fn address(&self) -> u64 {
        Batch::address(self)
    }
    fn len_bytes(&self) -> usize {
        Batch::len_bytes(self)
    }
    fn device(&self) -> DeviceSpec {
        Batch::device(self)
    }
    fn wait_ready(&self) -> Result<()> {
        Batch::wait_ready(self)
    }
    unsafe fn stream_wait(&self, stream: u64) -> Result<()> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { Batch::stream_wait(self, stream) }
    }
    unsafe fn release_after(self: Box<Self>, stream: u64) -> Result<()> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { Batch::release_after(*self, stream) }
    }
    fn read_back(&self, dst: &mut [u8]) -> Result<()> {
        Batch::read_back(self, dst)
    }
    fn host_bytes(&self) -> Result<Option<&[u8]>> {
        Batch::host_bytes(self)
    }
}

/// The pinned budget when the user sets none: 256 MiB, a few hundred slots of typical batches,
/// small next to any training machine's memory, and page-locked in a few milliseconds.
pub const DEFAULT_PINNED_BUDGET: usize = 256 << 20;

/// Slots the ring never goes beyond, however large the budget: past a few dozen batches in
/// flight, more slots only lock more memory.
pub const MAX_SLOTS: usize = 64;

/// The default largest slot: batches above it are read and copied in pieces. A large batch
/// filled whole by one reader keeps the copy engine waiting for that reader; in pieces, several
/// readers fill it at once and its first pieces are copied while the last are read
/// (docs/BENCHMARKS.md, "Records").
pub const DEFAULT_PIECE_BYTES: usize = 4 << 20;

/// Preprocessing run by the reader threads between the read and the slot.
///
/// With a transform, each reader reads raw records into a scratch buffer of its own and the
/// transform writes its output straight into the pinned slot.
pub trait Transform: Send + Sync {
    /// Bytes of one output record.
    fn output_record_bytes(&self) -> usize;
    /// Transforms `records` raw records in `input` into `output` (exactly
    /// `records * output_record_bytes()` bytes).
    fn apply(
        &self,
        input: &[u8],
        records: usize,
        output: &mut [u8],
    ) -> std::result::Result<(), String>;
}

/// How a [`Loader`] runs.
#[derive(Clone)]
pub struct LoaderOptions {
    /// Records in a batch.
    pub batch_size: usize,
    /// Drop the last batch of an epoch when it holds fewer than `batch_size` records.
    pub drop_last: bool,
    /// Passes over the dataset.
    pub epochs: u64,
    /// Most bytes of page-locked memory the loader may hold ([`DEFAULT_PINNED_BUDGET`]).
    pub pinned_budget: usize,
    /// Most device bytes held by delivered batches at once; `None` for no limit beyond the
    /// device's own.
    pub device_budget: Option<usize>,
    /// Reader threads; `None` for one per core, at most 8.
    pub num_threads: Option<usize>,
    /// Where batches go.
    pub device: DeviceSpec,
    /// How the pinned pool is page-locked on CUDA (registration is the default: it page-locks
    /// large pools faster than `cuMemHostAlloc`, and on the GPU's NUMA node).
    pub pin_method: PinMethod,
    /// Batches copied ahead of the consumer.
    pub prefetch: usize,
    /// A batch larger than this is read in pieces of about this size (whole records), each in
    /// its own slot, filled by whichever reader is free and copied into its place in the
    /// batch's device memory as soon as it is filled; `None` keeps every batch in one slot.
    /// Default [`DEFAULT_PIECE_BYTES`]. Not with a transform (it sees whole batches) or the
    /// register reader (its windows are the file's).
    pub piece_bytes: Option<usize>,
    /// Optional preprocessing on the reader threads.
    pub transform: Option<Arc<dyn Transform>>,
    /// Image records decoded on the GPU by the copy thread (`decode="gpu"`): the source must be
    /// this decoder's [`CompressedImageSource`](pinfeed_source::images::CompressedImageSource);
    /// batches are delivered planar (see [`GpuImageDecode`]). CUDA devices only, one batch a
    /// slot; not with a transform or the register reader.
    pub gpu_images: Option<Arc<GpuImageDecode>>,
    /// How records reach the device: through pinned slots, or straight from a registered
    /// mapping of a page-cached file.
    pub reader: Reader,
    /// The order of records in each epoch.
    pub shuffle: Shuffle,
    /// Seed of shuffled orders; the order is a pure function of (seed, epoch).
    pub seed: u64,
    /// This process's rank among `world_size` sharing the dataset.
    pub rank: u64,
    /// Processes sharing the dataset: each epoch, every record goes to one of them.
    pub world_size: u64,
    /// Where to start: an epoch and the batches of it already delivered (a resumed run), or
    /// the rest of an epoch after `consumed` records of its global order (an elastic resume,
    /// see [`Position::reshard`]). `epochs` counts from this epoch; the ones after it are whole.
    pub start: Position,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1024,
            drop_last: false,
            epochs: 1,
            pinned_budget: DEFAULT_PINNED_BUDGET,
            device_budget: None,
            num_threads: None,
            device: DeviceSpec::Auto,
            pin_method: PinMethod::Register,
            prefetch: 4,
            piece_bytes: Some(DEFAULT_PIECE_BYTES),
            transform: None,
            gpu_images: None,
            reader: Reader::Auto,
            shuffle: Shuffle::None,
            seed: 0,
            rank: 0,
            world_size: 1,
            start: Position::default(),
        }
    }
}

impl std::fmt::Debug for LoaderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoaderOptions")
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .field("epochs", &self.epochs)
            .field("pinned_budget", &self.pinned_budget)
            .field("device_budget", &self.device_budget)
            .field("num_threads", &self.num_threads)
            .field("device", &self.device)
            .field("pin_method", &self.pin_method)
            .field("prefetch", &self.prefetch)
            .field("piece_bytes", &self.piece_bytes)
            .field("transform", &self.transform.is_some())
            .field("reader", &self.reader)
            .field("shuffle", &self.shuffle)
            .field("seed", &self.seed)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("start", &self.start)
            .finish()
    }
}

impl LoaderOptions {
    /// Checks the options that make sense on their own, before any source or device is
    /// touched; each error names the option, the value and what is allowed. What depends on the
    /// source (a batch larger than the dataset with `drop_last`, the pinned budget, 0 included,
    /// against the slot size, with the budget that would do) is checked when the loader starts.
    pub fn validate(&self) -> Result<()> {
        let fail = |message: String| Err(LoaderError::Config(message));
        if self.batch_size == 0 {
            return fail("batch size must be at least 1".into());
        }
        if self.epochs == 0 {
            return fail("epochs must be at least 1".into());
        }
        if self.prefetch == 0 {
            return fail("prefetch must be at least 1".into());
        }
        if let Some(threads) = self.num_threads {
            crate::tune::check_threads(threads)?;
        }
        if self.piece_bytes == Some(0) {
            return fail(
                "piece size must be at least 1 byte (or None to keep each batch in one slot)"
                    .into(),
            );
        }
        self.order_spec(0).validate()
    }

    /// The order these options give a dataset of `num_records` records: what
    /// [`OrderSpec::fingerprint`] hashes to check a saved [`Position`] against.
    pub fn order_spec(&self, num_records: u64) -> OrderSpec {
        OrderSpec {
            num_records,
            batch_size: self.batch_size as u64,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
            seed: self.seed,
            rank: self.rank,
            world_size: self.world_size,
        }
    }
}

/// Parses a byte size such as `256MiB`, `1g`, `512k` or `1048576` (binary units; a bare
/// number is bytes).
pub fn parse_size(text: &str) -> Result<usize> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(LoaderError::Config(format!(
                "cannot read size {text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB or TiB)"
            )))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        LoaderError::Config(format!("cannot read size {text:?}: expected a number"))
    })?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 / 2.0 {
        return Err(LoaderError::Config(format!(
            "size {text:?} is out of range"
        )));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1e300").is_err());
    }

    #[test]
    fn options_are_validated_with_a_message_naming_the_option() {
        assert!(LoaderOptions::default().validate().is_ok());
        let cases: [(LoaderOptions, &str); 7] = [
            (
                LoaderOptions {
                    batch_size: 0,
                    ..LoaderOptions::default()
                },
                "batch size",
            ),
            (
                LoaderOptions {
                    epochs: 0,
                    ..LoaderOptions::default()
                },
                "epochs",
            ),
            (
                LoaderOptions {
                    prefetch: 0,
                    ..LoaderOptions::default()
                },
                "prefetch",
            ),
            (
                LoaderOptions {
                    num_threads: Some(0),
                    ..LoaderOptions::default()
                },
                "threads",
            ),
            (
                LoaderOptions {
                    piece_bytes: Some(0),
                    ..LoaderOptions::default()
                },
                "piece size",
            ),
            (
                LoaderOptions {
                    world_size: 0,
                    ..LoaderOptions::default()
                },
                "world size",
            ),
            (
                LoaderOptions {
                    rank: 2,
                    world_size: 2,
                    ..LoaderOptions::default()
                },
                "rank 2",
            ),
        ];
        for (options, named) in cases {
            match options.validate() {
                Err(LoaderError::Config(message)) => {
                    assert!(
                        message.contains(named),
                        "{message:?} does not name {named:?}"
                    )
                }
                other => panic!("{options:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn the_order_spec_is_the_options_order() {
        let options = LoaderOptions {
            batch_size: 7,
            drop_last: true,
            shuffle: Shuffle::Random,
            seed: 3,
            rank: 1,
            world_size: 4,
            ..LoaderOptions::default()
        };
        let spec = options.order_spec(100);
        assert_eq!(
            (
                spec.num_records,
                spec.batch_size,
                spec.drop_last,
                spec.seed,
                spec.rank,
                spec.world_size
            ),
            (100, 7, true, 3, 1, 4)
        );
        assert_eq!(spec.shuffle, Shuffle::Random);
    }

    #[test]
    fn sizes_parse_with_spaces_and_any_case() {
        assert_eq!(parse_size(" 2 GiB ").unwrap(), 2 << 30);
        assert_eq!(parse_size("64KB").unwrap(), 64 << 10);
        assert_eq!(parse_size("3b").unwrap(), 3);
        assert!(parse_size("-1").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert!("tpu:0".parse::<DeviceSpec>().is_err());
    }
}
