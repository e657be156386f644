//! `pinfeed stream`: every record of a dataset to the device, with the rate and where time went.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use anyhow::{bail, Result};
use clap::Args;
use pinfeed::{
    parse_size, Batch, BatchRecords, DeviceSpec, LoaderOptions, MultiLoader, PinMethod, Shuffle,
    Stats,
};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::tokens::TokenSource;
use pinfeed_source::{open_with, FormatOptions, Layout, ReadOptions, Reader, Source};
use serde_json::json;

use crate::gen::{parse_shape, Shape};
use crate::usage::{cpu_time, peak_rss};
use crate::Outcome;

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
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
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
    /// Reads in flight per thread for the uring reader.
    #[arg(long, default_value_t = pinfeed_source::DEFAULT_QUEUE_DEPTH)]
    queue_depth: u32,
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
    /// Draw throughput and each stage's waiting over time into this PNG file.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn parse_shuffle(text: &str) -> Result<Shuffle> {
    let bad = || {
        anyhow::anyhow!(
            "unknown shuffle {text:?}: expected none, random or block:B:W (e.g. block:64:16)"
        )
    };
    match text {
        "none" => Ok(Shuffle::None),
        "random" => Ok(Shuffle::Random),
        _ => {
            let rest = text.strip_prefix("block:").ok_or_else(bad)?;
            let (b, w) = rest.split_once(':').ok_or_else(bad)?;
            let block = b.parse().map_err(|_| bad())?;
            let window = w.parse().map_err(|_| bad())?;
            Ok(Shuffle::Block { block, window })
        }
    }
}

pub fn parse_pin_method(text: &str) -> Result<PinMethod> {
    match text {
        "register" => Ok(PinMethod::Register),
        "hostalloc" | "host-alloc" => Ok(PinMethod::HostAlloc),
        _ => bail!("unknown pin method {text:?}: expected register or hostalloc"),
    }
}

/// Opens the dataset at `path`. `dtype` and `shape` describe a raw record file's records, as
/// numpy's `np.memmap(path, dtype, shape=(n, *shape))` would (the dims of a sub-array dtype
/// such as `2,3B` come after `shape`); for a file with a header they must agree with it.
pub fn open_source(
    path: &std::path::Path,
    dtype: Option<&str>,
    shape: Option<&[u64]>,
    read: &ReadOptions,
) -> Result<Arc<dyn Source>> {
    let raw_layout = match dtype {
        None => None,
        Some(dtype) => Some(
            parse_user_dtype(dtype)
                .and_then(|(dtype, sub)| Layout::new(dtype, record_shape(shape, &sub)))
                .with_context(|| format!("{}: --dtype/--shape", path.display()))?,
        ),
    };
    let source: Arc<dyn Source> = match open_with(path, raw_layout.clone(), read) {
        Ok(source) => Arc::from(source),
        // Python refuses to guess the element type of raw records; so does the command.
        Err(_) if raw_layout.is_none() && shape.is_some() && is_raw(path, read) => bail!(
            "{}: a raw record file needs --dtype (its element type, e.g. --dtype u8) as well as \
             --shape",
            path.display()
        ),
        Err(e) => return Err(e.into()),
    };
    // Without --dtype, --shape is checked against the header's element type.
    let asked = match (raw_layout, shape) {
        (Some(layout), _) => Some(layout),
        (None, Some(shape)) => Some(
            Layout::new(source.layout().dtype.clone(), shape.to_vec())
                .with_context(|| format!("{}: --shape", path.display()))?,
        ),
        (None, None) => None,
    };
    if let Some(asked) = asked {
        if source.layout() != &asked {
            bail!(
                "{}: the file's header gives records of {} {:?} ({} bytes), not the --dtype/--shape given, {} {:?} ({} bytes)",
                path.display(),
                source.layout().dtype,
                source.layout().shape,
                source.layout().record_bytes(),
                asked.dtype,
                asked.shape,
                asked.record_bytes()
            );
        }
    }
    Ok(source)
}

/// The shape of one record: `shape`, then the dims of a sub-array dtype, as numpy orders them
/// (`np.zeros(4, dtype='2,3B').shape` is `(4, 2, 3)`).
pub fn record_shape(shape: Option<&[u64]>, subarray: &[u64]) -> Vec<u64> {
    let mut full = shape.unwrap_or(&[]).to_vec();
    full.extend(subarray);
    full
}

/// Whether `path` opens as raw records when given an element type: a dataset without a header.
fn is_raw(path: &std::path::Path, read: &ReadOptions) -> bool {
    parse_user_dtype("u8")
        .and_then(|(dtype, _)| Layout::new(dtype, Vec::new()))
        .is_ok_and(|bytes| open_with(path, Some(bytes), read).is_ok())
}

pub fn run(args: StreamArgs) -> Result<Outcome> {
    let Plan {
        source,
        options,
        devices,
        auto_reason,
        tokens,
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
}

/// The source, the loader's options and the devices that `args` ask for.
fn prepare(args: &StreamArgs) -> Result<Plan> {
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
    let source = match &tokens {
        Some(windows) => windows.source(),
        None => open_source(
            &args.path,
            args.dtype.as_deref(),
            args.shape.as_ref().map(|s| s.0.as_slice()),
            &read,
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
    })
}

/// What iterating the loader gathered.
struct Delivery {
    /// Every delivered byte, step by step, each step's batches in device order.
    crc: crc32fast::Hasher,
    /// Each device's own batches.
    device_crcs: Vec<crc32fast::Hasher>,
    mismatches: Vec<String>,
    timeline: Option<crate::plot::Timeline>,
}

/// Takes every step from `loader`, reading each batch back from its device for `--crc` and
/// `--verify`, or else only waiting, at the end, for the last step's copies.
fn deliver(
    args: &StreamArgs,
    reference: &Reference,
    loader: &mut MultiLoader,
    started: Instant,
) -> Result<Delivery> {
    let check = args.verify || args.crc;
    let record_bytes = loader.record_bytes();
    let mut crc = crc32fast::Hasher::new();
    let mut device_crcs = vec![crc32fast::Hasher::new(); loader.devices().len()];
    let mut device_bytes = Vec::new();
    let mut source_bytes = Vec::new();
    let mut mismatches: Vec<String> = Vec::new();
    let progress = progress_bar(args, loader.num_batches());
    let mut timeline = args.plot.as_ref().map(|_| crate::plot::Timeline::default());
    let mut last = Vec::new();
    while let Some(step) = loader.next() {
        let step = step?;
        progress.inc(1);
        if let Some(timeline) = timeline.as_mut() {
            timeline.sample(started, 0.02, || loader.stats());
        }
        if step[0].seq() % 64 == 0 {
            let step_bytes = step.iter().map(Batch::len_bytes).sum();
            progress.set_message(format!(
                "{:.2} GB/s",
                loader_rate(started, &progress, step_bytes)
            ));
        }
        if !check {
            // No host synchronisation per batch: dropping a batch frees its memory in stream
            // order after its copy. Each device's copies finish in order on its stream, so
            // waiting for its last batch below waits for them all.
            last = step;
            continue;
        }
        for (device_crc, batch) in device_crcs.iter_mut().zip(&step) {
            device_bytes.resize(batch.len_bytes(), 0);
            batch.read_back(&mut device_bytes)?;
            crc.update(&device_bytes);
            device_crc.update(&device_bytes);
            if args.verify {
                let found = mismatch(
                    reference,
                    batch,
                    record_bytes,
                    &device_bytes,
                    &mut source_bytes,
                )?;
                mismatches.extend(found.map(|m| match args.devices {
                    Some(_) => format!("{}: {m}", batch.device()),
                    None => m,
                }));
            }
        }
    }
    for batch in &last {
        batch.wait_ready()?;
    }
    progress.finish_and_clear();
    Ok(Delivery {
        crc,
        device_crcs,
        mismatches,
        timeline,
    })
}

/// `--plot`: the timeline drawn, titled with the file, the rate, the device and the bottleneck.
fn draw_plot(
    args: &StreamArgs,
    mut timeline: crate::plot::Timeline,
    started: Instant,
    stats: &Stats,
    seconds: f64,
) -> Result<()> {
    let Some(path) = args.plot.as_ref() else {
        return Ok(());
    };
    timeline.finish(started, stats.clone());
    timeline.draw(
        path,
        &format!(
            "{}: {:.2} GB/s to {}, {}",
            args.path.file_name().map_or_else(
                || args.path.display().to_string(),
                |n| n.to_string_lossy().into()
            ),
            stats.bytes as f64 / seconds / 1e9,
            stats.device,
            stats.bottleneck()
        ),
    )
}

/// Fails unless every device received what it should: replicated, every record; split, its
/// shard of every epoch, padded to the same length as ranks are (one device: every record).
fn check_delivered(
    args: &StreamArgs,
    source: &dyn Source,
    stats: &Stats,
    devices: usize,
) -> Result<()> {
    if args.drop_last {
        return Ok(());
    }
    let n = source.num_records();
    let per_device = if args.replicate {
        n
    } else {
        n.div_ceil(devices as u64)
    } * args.epochs;
    for d in &stats.devices {
        if d.records != per_device {
            bail!(
                "{}: delivered {} records to {}, expected {per_device}",
                source.name(),
                d.records,
                d.device
            );
        }
    }
    Ok(())
}

/// What one run measured, for the report.
struct Measured {
    stats: Stats,
    /// The devices as given (`--device`, or each of `--devices`).
    devices: Vec<DeviceSpec>,
    seconds: f64,
    cpu_seconds: f64,
    cuda_init_s: f64,
    /// `--crc`: every delivered byte, step by step, each step's batches in device order.
    crc: Option<u32>,
    /// `--crc`: each device's own batches.
    device_crcs: Vec<Option<u32>>,
    verified: bool,
    auto_reason: Option<String>,
}

/// Starts CUDA on each CUDA device in `devices` before the clock, as torch's baselines do: a
/// process pays it once, whatever it streams (about 0.2 s on the H200 machine). Returns the
/// contexts, to hold for the run, and the seconds it took.
fn start_cuda(devices: &[DeviceSpec]) -> Result<(Vec<Arc<pinfeed_cuda::Context>>, f64)> {
    let started = Instant::now();
    let mut contexts = Vec::new();
    for device in devices {
        if let DeviceSpec::Cuda(ordinal) = device.resolve() {
            contexts.push(pinfeed_cuda::Context::new(ordinal)?);
        }
    }
    Ok((contexts, started.elapsed().as_secs_f64()))
}

/// Prints the first mismatches of a `--verify` run and the count; true when there were any.
fn report_mismatches(source: &dyn Source, mismatches: &[String], batches: u64) -> bool {
    for m in mismatches.iter().take(10) {
        note!("pinfeed: mismatch in {}: {m}", source.name());
    }
    if !mismatches.is_empty() {
        note!(
            "pinfeed: verification failed: {} of {} batches differ from {}",
            mismatches.len(),
            batches,
            source.name()
        );
    }
    !mismatches.is_empty()
}

/// Fills a record's buffer with the bytes record `v` must hold.
type ExpectedRecord<'a> = dyn Fn(u64, &mut [u8]) -> pinfeed_source::Result<()> + 'a;

/// What `--verify` holds delivered batches to.
struct Reference<'a> {
    source: &'a dyn Source,
    /// Each record's bytes worked out on their own, where the source's read is not the
    /// reference (token windows: the rule that picks them, read from the tokens); else the
    /// source's own reads, a batch at a time.
    record: Option<&'a ExpectedRecord<'a>>,
}

/// Where `batch`, read back into `device_bytes`, differs from `reference` (`source_bytes` is
/// a buffer for the expected bytes); `None` when it does not.
fn mismatch(
    reference: &Reference,
    batch: &Batch,
    record_bytes: usize,
    device_bytes: &[u8],
    source_bytes: &mut Vec<u8>,
) -> Result<Option<String>> {
    source_bytes.resize(batch.len_bytes(), 0);
    let records = source_bytes.chunks_exact_mut(record_bytes);
    match (reference.record, batch.records()) {
        (Some(expected), BatchRecords::Range { first, .. }) => {
            for (v, dst) in (*first..).zip(records) {
                expected(v, dst)?;
            }
        }
        (Some(expected), BatchRecords::Indices(indices)) => {
            for (&v, dst) in indices.iter().zip(records) {
                expected(v, dst)?;
            }
        }
        (None, BatchRecords::Range { first, .. }) => {
            reference.source.read_records(*first, source_bytes)?
        }
        (None, BatchRecords::Indices(indices)) => reference.source.gather(indices, source_bytes)?,
    }
    if source_bytes[..] == device_bytes[..] {
        return Ok(None);
    }
    let at = source_bytes
        .iter()
        .zip(device_bytes)
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let record = match batch.records() {
        BatchRecords::Range { first, .. } => first + (at / record_bytes) as u64,
        BatchRecords::Indices(indices) => indices[at / record_bytes],
    };
    Ok(Some(format!(
        "batch {} (epoch {}, index {}): first difference at record {record} byte {}",
        batch.seq(),
        batch.epoch(),
        batch.index(),
        at % record_bytes
    )))
}

/// A progress bar on standard error, hidden for --json and when standard error is not a
/// terminal (indicatif checks that itself).
fn progress_bar(args: &StreamArgs, batches: u64) -> indicatif::ProgressBar {
    if args.json {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(batches);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} batches {msg} eta {eta}")
            .expect("a valid template"),
    );
    bar
}

/// Rough delivery rate so far, for the progress bar (batches are of nearly equal size).
fn loader_rate(started: Instant, progress: &indicatif::ProgressBar, batch_bytes: usize) -> f64 {
    progress.position() as f64 * batch_bytes as f64
        / started.elapsed().as_secs_f64().max(1e-9)
        / 1e9
}

/// The `--json` report. With `--devices`, also `mode`, `devices` (each device's bytes, rate
/// and CRC-32), `read_bytes` and `read_gbps`, and `device` lists every device.
fn report_json(args: &StreamArgs, m: &Measured) -> serde_json::Value {
    let (stats, seconds) = (&m.stats, m.seconds);
    let mut report = json!({
        "path": args.path.display().to_string(),
        "device": stats.device.to_string(),
        "bytes": stats.bytes,
        "records": stats.records,
        "batches": stats.batches,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seconds": seconds,
        "gbps": stats.bytes as f64 / seconds / 1e9,
        // Without start-up (page-locking the pool, starting threads), which a process pays once
        // per loader rather than per byte: the rate a long run approaches.
        "setup_s": stats.startup.as_secs_f64(),
        "streaming_gbps": stats.bytes as f64 / (seconds - stats.startup.as_secs_f64()).max(1e-9) / 1e9,
        "records_per_s": stats.records as f64 / seconds,
        "cpu_seconds": m.cpu_seconds,
        "verified": m.verified,
        "crc32": m.crc,
        "pinned_bytes_peak": stats.pinned_bytes_peak,
        "pinned_locked": stats.pinned_locked,
        "pinned_numa": stats.pinned_numa,
        "pinned_allocations_after_start": stats.pinned_allocations_after_start,
        "device_bytes_peak": stats.device_bytes_peak,
        "peak_rss_bytes": peak_rss(),
        "threads": stats.threads,
        "shuffle": args.shuffle,
        "reader": match stats.reader {
            Reader::Register => "register".to_string(),
            _ => stats.reader_description.clone(),
        },
        "reader_kind": stats.reader.to_string(),
        "reader_auto_reason": m.auto_reason,
        "piece_size": args.piece_size,
        "slots": stats.slots,
        "slot_bytes": stats.slot_bytes,
        "slots_recycled": stats.slots_recycled,
        "slot_waits": stats.slot_waits,
        "slots_peak_in_use": stats.slots_peak_in_use,
        "cuda_init_s": m.cuda_init_s,
        "stages": {
            "startup_s": stats.startup.as_secs_f64(),
            "read_s": stats.read_time.as_secs_f64(),
            "transform_s": stats.transform_time.as_secs_f64(),
            "wait_free_slot_s": stats.wait_free_slot.as_secs_f64(),
            "copy_wait_filled_s": stats.wait_filled.as_secs_f64(),
            "copy_issue_s": stats.copy_issue_time.as_secs_f64(),
            "copy_wait_consumer_s": stats.wait_consumer.as_secs_f64(),
            "consumer_wait_s": stats.consumer_wait.as_secs_f64(),
        },
        "bottleneck": stats.bottleneck().to_string(),
        "explanation": stats.explain(),
    });
    if args.devices.is_some() {
        add_devices(&mut report, args, m);
    }
    if let Some(seq_len) = args.seq_len {
        let fields = report.as_object_mut().expect("the report is an object");
        fields.insert("sample".into(), json!(crate::tokens::sample(args).name()));
        fields.insert("seq_len".into(), json!(seq_len));
        fields.insert("steps".into(), json!(args.steps));
        fields.insert(
            "tokens_per_second".into(),
            json!(tokens_per_second(stats, seq_len, seconds)),
        );
    }
    report
}

/// The fields of a `--devices` report.
fn add_devices(report: &mut serde_json::Value, args: &StreamArgs, m: &Measured) {
    let (stats, seconds) = (&m.stats, m.seconds);
    let names: Vec<String> = m.devices.iter().map(|d| d.resolve().to_string()).collect();
    let per_device: Vec<serde_json::Value> = stats
        .devices
        .iter()
        .zip(&m.device_crcs)
        .map(|(d, crc)| {
            json!({
                "device": d.device.to_string(),
                "bytes": d.bytes,
                "records": d.records,
                "batches": d.batches,
                "gbps": d.bytes as f64 / seconds / 1e9,
                "device_bytes_peak": d.device_bytes_peak,
                "crc32": crc,
            })
        })
        .collect();
    let fields = report.as_object_mut().expect("the report is an object");
    fields.insert("device".into(), json!(names.join(",")));
    fields.insert("mode".into(), json!(mode(args)));
    fields.insert("devices".into(), json!(per_device));
    fields.insert("read_bytes".into(), json!(stats.read_bytes));
    fields.insert(
        "read_gbps".into(),
        json!(stats.read_bytes as f64 / seconds / 1e9),
    );
}

/// Input tokens delivered a second: `seq_len` a window, as a training step counts them.
fn tokens_per_second(stats: &Stats, seq_len: u64, seconds: f64) -> f64 {
    (stats.records * seq_len) as f64 / seconds
}

fn mode(args: &StreamArgs) -> &'static str {
    if args.replicate {
        "replicate"
    } else {
        "split"
    }
}

/// The text report; with `--devices`, a line for each device and one for the source.
fn print_report(out: &mut impl Write, args: &StreamArgs, m: &Measured) -> io::Result<()> {
    let (stats, seconds, cpu_seconds) = (&m.stats, m.seconds, m.cpu_seconds);
    let names: Vec<String> = m.devices.iter().map(|d| d.resolve().to_string()).collect();
    let target = match args.devices {
        Some(_) => format!("{} ({})", names.join(", "), mode(args)),
        None => stats.device.to_string(),
    };
    let gb = stats.bytes as f64 / 1e9;
    writeln!(
        out,
        "{}: {} records in {} batches to {} in {:.3} s",
        args.path.display(),
        stats.records,
        stats.batches,
        target,
        seconds
    )?;
    writeln!(
        out,
        "  {:.2} GB/s, {:.2} M records/s, {:.3} GB, CPU time {:.3} s",
        gb / seconds,
        stats.records as f64 / seconds / 1e6,
        gb,
        cpu_seconds
    )?;
    let startup = stats.startup.as_secs_f64();
    writeln!(
        out,
        "  start-up (page-locking the pool, starting threads) {:.3} s; {:.2} GB/s after it",
        startup,
        gb / (seconds - startup).max(1e-9)
    )?;
    writeln!(
        out,
        "  pinned: {} bytes in {} slots of {} ({}), page-locked allocations after start: {}",
        stats.pinned_bytes_peak,
        stats.slots,
        stats.slot_bytes,
        if stats.pinned_locked {
            "page-locked"
        } else {
            "not page-locked: memory-lock limit too low"
        },
        stats.pinned_allocations_after_start
    )?;
    writeln!(out, "  pinned NUMA placement: {}", stats.pinned_numa)?;
    writeln!(
        out,
        "  reader: {} ({} thread(s))",
        stats.reader_description, stats.threads
    )?;
    writeln!(
        out,
        "  slots: recycled {}, readers waited for a free slot {} times ({:.3} s), peak in use {}",
        stats.slots_recycled,
        stats.slot_waits,
        stats.wait_free_slot.as_secs_f64(),
        stats.slots_peak_in_use
    )?;
    if let Some(seq_len) = args.seq_len {
        writeln!(
            out,
            "  {:.2} M tokens/s ({} windows of seq_len {seq_len})",
            tokens_per_second(stats, seq_len, seconds) / 1e6,
            crate::tokens::sample(args).name()
        )?;
    }
    writeln!(out, "  {}", stats.explain())?;
    if let Some(crc) = m.crc {
        writeln!(
            out,
            "  crc32 {crc:#010x}{}",
            if args.verify {
                ", verified against the source"
            } else {
                ""
            }
        )?;
    }
    if args.devices.is_some() {
        print_devices(out, args, m)?;
    }
    Ok(())
}

fn print_devices(out: &mut impl Write, args: &StreamArgs, m: &Measured) -> io::Result<()> {
    let (stats, seconds) = (&m.stats, m.seconds);
    for (d, crc) in stats.devices.iter().zip(&m.device_crcs) {
        writeln!(
            out,
            "  {}: {:.3} GB in {} batches, {:.2} GB/s{}",
            d.device,
            d.bytes as f64 / 1e9,
            d.batches,
            d.bytes as f64 / seconds / 1e9,
            crc.map_or(String::new(), |c| format!(", crc32 {c:#010x}"))
        )?;
    }
    writeln!(
        out,
        "  read {:.3} GB from the source ({:.2} GB/s){}",
        stats.read_bytes as f64 / 1e9,
        stats.read_bytes as f64 / seconds / 1e9,
        if args.replicate {
            ", once for every device"
        } else {
            ", each device its shard"
        }
    )
}
