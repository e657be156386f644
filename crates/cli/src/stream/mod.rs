//! `pinfeed stream`: every record of a dataset to the device, with the rate and where time went.

mod deliver;
mod open;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use pinfeed::{parse_size, DeviceSpec, LoaderOptions, MultiLoader};
use pinfeed_source::images::ImageSource;
use pinfeed_source::tokens::TokenSource;
use pinfeed_source::{FormatOptions, ReadOptions, Reader, Source};

use crate::gen::{parse_shape, Shape};
use crate::usage::cpu_time;
use crate::Outcome;
use deliver::{check_delivered, deliver, report_mismatches, start_cuda, ExpectedRecord, Reference};
pub use open::record_shape;
use open::{open_source, parse_pin_method, parse_shuffle};
use report::{draw_plot, print_report, report_json, Measured};

#[derive(Args, Debug)]
pub struct StreamArgs {
    /// The dataset: a .npy file, a .safetensors file (see --tensor), a raw record file (with
    /// --dtype, and --shape unless the dtype carries it, as in 3,31,31B), or a directory or
    /// glob (quoted, e.g. 'shards/*.npy') of such files, read as one dataset in name order.
    /// With --seq-len, token data: a raw token file (with --tokens, e.g. nanoGPT's train.bin),
    /// a 1-D integer .npy, a directory or glob of them, or a Megatron .bin/.idx pair.
    pub(crate) path: PathBuf,
    /// Records in a batch (with --seq-len, windows in a batch).
    #[arg(long)]
    pub(crate) batch_size: usize,
    /// auto, cpu, cuda or cuda:N. auto picks the first GPU, or the host backend without one.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Several devices fed by one process, comma-separated (e.g. cuda:0,cuda:1; a device may
    /// repeat): split, each device streams its shard of every epoch through its own ring and a
    /// part of the pinned budget; with --replicate, every device gets every batch.
    #[arg(long, conflicts_with = "device", value_delimiter = ',')]
    devices: Option<Vec<String>>,
    /// With --devices: read each batch once into one pinned pool and copy it to every device.
    #[arg(long, requires = "devices")]
    replicate: bool,
    /// Passes over the dataset.
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    /// Most page-locked memory to use, e.g. 256MiB or 1GiB.
    #[arg(long, default_value = "256MiB")]
    pinned_budget: String,
    /// Reader threads (default: one per core, at most 8).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
        .range(1..=pinfeed::tune::MAX_THREADS as u64))]
    threads: Option<usize>,
    /// Batches larger than this are read and copied in pieces of about this size, a slot
    /// each, e.g. 4MiB; `whole` keeps each batch in one slot.
    #[arg(long, default_value = "4MiB")]
    piece_size: String,
    /// Drop the last batch of each epoch if it is partial.
    #[arg(long)]
    drop_last: bool,
    /// Check every delivered batch, read back from the device, against the source; exit 1 on a
    /// mismatch. Implies --crc.
    #[arg(long)]
    verify: bool,
    /// Compute the CRC-32 of everything delivered, read back from the device (`crc32`): every
    /// byte, batch by batch; with --devices, step by step, each step's batches in device order,
    /// which equals one device's CRC when the devices split the records evenly (no padding);
    /// each device's own CRC is in `devices[i].crc32`.
    #[arg(long)]
    crc: bool,
    /// Element type of a raw record file (see `pinfeed gen --help`), or numpy's `3,31,31B` form
    /// (a sub-array dtype: its dims come after --shape's, as in numpy). Raw files need it.
    #[arg(long)]
    dtype: Option<String>,
    /// Shape of one record of a raw record file, e.g. 3,31,31 (with a .npy file, a check of
    /// its header).
    #[arg(long, value_parser = parse_shape)]
    shape: Option<Shape>,
    /// How the pinned pool is page-locked on CUDA: register (malloc + cuMemHostRegister) or
    /// hostalloc (cuMemHostAlloc).
    #[arg(long, default_value = "register")]
    pin_method: String,
    /// How records reach the device: pread (buffered reads into pinned slots), mmap (pread for
    /// ranges; shuffled batches copied out of a read-only mapping of the file, one system call a
    /// batch instead of one a record), direct (O_DIRECT reads, bypassing the page cache), uring
    /// (io_uring with --queue-depth reads in flight), register (copies straight from a
    /// registered mapping of a page-cached file), or auto: mmap for files mostly in the page
    /// cache or smaller than half the memory available, direct for larger cold files.
    #[arg(long, default_value = "auto")]
    reader: String,
    /// Bytes per read request of the direct and uring readers, e.g. 1MiB.
    #[arg(long, default_value = "1MiB")]
    read_size: String,
    /// Reads in flight per thread for the uring reader; for a dataset in object storage, ranged
    /// GETs in flight over all reader threads.
    #[arg(long, default_value_t = pinfeed_source::DEFAULT_QUEUE_DEPTH)]
    queue_depth: u32,
    /// An option of the object store a URL dataset (s3://, gs://, az://, https://) is read
    /// from, KEY=VALUE, repeatable: endpoint, region, path_style, allow_http, access_key_id,
    /// secret_access_key, timeout, connect_timeout, read_timeout (object_store's keys), and
    /// pinfeed's retries, request_size, coalesce_gap. Credentials otherwise come from the
    /// store's standard chain (AWS_* variables, instance metadata, ...).
    #[arg(long = "storage-option", value_name = "KEY=VALUE")]
    storage_options: Vec<String>,
    /// Keep blocks fetched from object storage in this directory, for later epochs and other
    /// processes (least recently used removed past --cache-limit).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Most bytes --cache-dir may hold, e.g. 10GiB.
    #[arg(long, default_value = "10GiB", requires = "cache_dir")]
    cache_limit: String,
    /// The tensor of a .safetensors file whose first dimension counts records.
    #[arg(long)]
    tensor: Option<String>,
    /// Record order: none, random, or block:B:W (blocks of B records in random order, shuffled
    /// within windows of W blocks).
    #[arg(long, default_value = "none")]
    pub(crate) shuffle: String,
    /// Seed of the shuffled order (the order is a pure function of seed and epoch), and of
    /// random token windows and the document order of --sample.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Token data: the token type of a raw token file, e.g. uint16 for nanoGPT's train.bin (a
    /// .npy header or a Megatron .idx gives its own; this must match it).
    #[arg(long, requires = "seq_len")]
    pub(crate) tokens: Option<String>,
    /// Stream token data as windows of seq_len + 1 tokens (inputs and shifted targets).
    #[arg(long, conflicts_with_all = ["dtype", "shape", "tensor"],
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub(crate) seq_len: Option<u64>,
    /// How token windows are picked: random (uniform offsets drawn from --seed; needs
    /// --steps), sequential (every seq_len tokens, each window's last token the next one's
    /// first) or documents (a Megatron dataset's documents in the shuffled order of --seed,
    /// cut as sequential; each record is the tokens then a uint16 segment id per token). Every
    /// pass of --epochs reads the same windows.
    #[arg(long, requires = "seq_len")]
    pub(crate) sample: Option<pinfeed_source::tokens::Sample>,
    /// Batches of random token windows to stream (to each device of --devices).
    #[arg(long, requires = "seq_len",
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub(crate) steps: Option<u64>,
    /// Stream an image dataset: an ImageFolder tree (PATH/<class>/<image>, labels from the
    /// sorted class names) or WebDataset .tar shards (a file, a directory or a glob), each
    /// JPEG or PNG decoded, cropped and resized on the reader threads; a record is the uint8
    /// pixels then the label as int64. Every pass of --epochs draws the crops of epoch 0.
    #[arg(long, conflicts_with_all = ["dtype", "shape", "tensor", "seq_len"])]
    pub(crate) images: bool,
    /// With --images: the output side in pixels (square).
    #[arg(long, requires = "images",
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=8192))]
    pub(crate) size: Option<u32>,
    /// With --images: random (torchvision's RandomResizedCrop and a random flip) or center
    /// (Resize to size / 0.875, then CenterCrop).
    #[arg(long, requires = "images", default_value = "random")]
    pub(crate) crop: String,
    /// With --images: NCHW or NHWC.
    #[arg(long, requires = "images", default_value = "NCHW")]
    pub(crate) layout: String,
    /// With --images: raise (stop at an image that does not decode, naming it) or skip (count
    /// it and fill its place with the next image that decodes).
    #[arg(long, requires = "images", default_value = "raise")]
    pub(crate) on_error: String,
    /// With --images: images with more pixels are refused before decoding (default 89478485,
    /// Pillow's limit).
    #[arg(long, requires = "images")]
    pub(crate) max_pixels: Option<u64>,
    /// Draw throughput and each stage's waiting over time into this PNG file.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StreamArgs) -> Result<Outcome> {
    let Plan {
        source,
        options,
        devices,
        auto_reason,
        tokens,
        images,
    } = prepare(&args)?;
    if args.devices.is_some() && args.plot.is_some() {
        bail!("--plot draws the stages of one loader; it does not take --devices");
    }
    let (contexts, cuda_init_s) = start_cuda(&devices)?;
    let cpu_before = cpu_time();
    let started = Instant::now();
    // One device is a MultiLoader of one loader: the same loader, rank and budget as
    // `Loader::new` gives, so that one driver serves every case.
    let mut loader = if args.replicate {
        MultiLoader::replicated(Arc::clone(&source), options, &devices)?
    } else {
        MultiLoader::new(Arc::clone(&source), options, &devices)?
    };
    let expected = |v: u64, dst: &mut [u8]| match &tokens {
        Some(windows) => crate::tokens::expected_record(windows, v, dst),
        None => source.read_records(v, dst),
    };
    let reference = Reference {
        source: source.as_ref(),
        record: tokens.is_some().then_some(&expected as &ExpectedRecord),
    };
    let delivery = deliver(&args, &reference, &mut loader, started)?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (cpu_time() - cpu_before).as_secs_f64();
    let stats = loader.stats();
    if let Some(timeline) = delivery.timeline {
        draw_plot(&args, timeline, started, &stats, seconds)?;
    }
    check_delivered(&args, source.as_ref(), &stats, devices.len())?;
    let check = args.verify || args.crc;
    let measured = Measured {
        seconds,
        cpu_seconds,
        cuda_init_s,
        crc: check.then(|| delivery.crc.finalize()),
        device_crcs: delivery
            .device_crcs
            .into_iter()
            .map(|crc| check.then(|| crc.finalize()))
            .collect(),
        verified: args.verify && delivery.mismatches.is_empty(),
        skipped: images.as_ref().map(|i| i.skipped()),
        auto_reason,
        devices,
        stats,
    };
    let mut out = crate::output::stdout();
    if args.json {
        writeln!(out, "{}", report_json(&args, &measured))?;
    } else {
        print_report(&mut out, &args, &measured)?;
    }
    out.flush()?;
    let failed = report_mismatches(
        source.as_ref(),
        &delivery.mismatches,
        measured.stats.batches,
    );
    drop(contexts);
    Ok(if failed { Outcome::Failed } else { Outcome::Ok })
}

/// What `args` ask to stream, and how.
struct Plan {
    source: Arc<dyn Source>,
    options: LoaderOptions,
    /// `--device`, or each of `--devices`.
    devices: Vec<DeviceSpec>,
    /// Why `--reader auto` chose what it did.
    auto_reason: Option<String>,
    /// With `--seq-len`: the token windows `source` is.
    tokens: Option<TokenSource>,
    /// With `--images`: the image dataset `source` is.
    images: Option<Arc<ImageSource>>,
}

/// The object-store options of `--storage-option`, `--cache-dir` and `--cache-limit`, and the
/// read options that apply to object storage (`--queue-depth`).
pub(crate) fn store_options(
    args: &StreamArgs,
) -> Result<(pinfeed_store::StoreOptions, ReadOptions)> {
    let mut store = pinfeed_store::StoreOptions::new();
    for pair in &args.storage_options {
        store.set_pair(pair)?;
    }
    store.cache_dir = args.cache_dir.clone();
    store.cache_limit = parse_size(&args.cache_limit)? as u64;
    let read = ReadOptions {
        queue_depth: args.queue_depth,
        ..ReadOptions::default()
    };
    Ok((store, read))
}

/// The source, the loader's options and the devices that `args` ask for.
fn prepare(args: &StreamArgs) -> Result<Plan> {
    let given: Vec<&str> = [
        ("--storage-option", !args.storage_options.is_empty()),
        ("--cache-dir", args.cache_dir.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, given)| given.then_some(name))
    .collect();
    let is_url = args.path.to_str().is_some_and(pinfeed_store::is_url);
    if let Err(message) = pinfeed_store::refuse_on_local_path(is_url, &given) {
        bail!("{}: {message}", args.path.display());
    }
    let reader: Reader = args.reader.parse()?;
    let (source_reader, why) = reader.resolve(&args.path);
    let mut format = FormatOptions::new();
    if let Some(tensor) = &args.tensor {
        format.set("tensor", tensor);
    }
    let read = ReadOptions {
        reader: source_reader,
        read_size: parse_size(&args.read_size)?,
        queue_depth: args.queue_depth,
        format,
    };
    let device: DeviceSpec = args.device.parse()?;
    let devices = match &args.devices {
        Some(names) => names
            .iter()
            .map(|name| name.trim().parse::<DeviceSpec>())
            .collect::<pinfeed::Result<Vec<_>>>()?,
        None => vec![device],
    };
    if devices.is_empty() {
        bail!("--devices: no device given");
    }
    let tokens = match args.seq_len {
        // Split devices are ranks that each take a batch of every step.
        Some(seq_len) => Some(crate::tokens::open(
            args,
            seq_len,
            if args.replicate {
                1
            } else {
                devices.len() as u64
            },
        )?),
        None if args.path.extension().is_some_and(|e| e == "idx") => bail!(
            "{}: a Megatron index: stream its tokens with --seq-len N",
            args.path.display()
        ),
        None => None,
    };
    let images = if args.images {
        Some(crate::images::open(args)?)
    } else {
        None
    };
    let source = match (&tokens, &images) {
        (Some(windows), _) => windows.source(),
        (None, Some(images)) => Arc::clone(images) as Arc<dyn Source>,
        (None, None) => open_source(
            &args.path,
            args.dtype.as_deref(),
            args.shape.as_ref().map(|s| s.0.as_slice()),
            &read,
            &store_options(args)?.0,
        )?,
    };
    let options = LoaderOptions {
        batch_size: args.batch_size,
        drop_last: args.drop_last,
        epochs: args.epochs,
        pinned_budget: parse_size(&args.pinned_budget)?,
        num_threads: args.threads,
        piece_bytes: match args.piece_size.as_str() {
            "whole" => None,
            size => Some(parse_size(size)?),
        },
        device,
        pin_method: parse_pin_method(&args.pin_method)?,
        reader,
        shuffle: parse_shuffle(&args.shuffle)?,
        seed: args.seed,
        ..LoaderOptions::default()
    };
    Ok(Plan {
        source,
        options,
        devices,
        auto_reason: why,
        tokens,
        images,
    })
}
