//! `pinfeed stream`: every record of a dataset to the device, with the rate and where time went.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use pinfeed::{parse_size, DeviceSpec, Loader, LoaderOptions, PinMethod, Stats};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{open_path, Layout, Source};
use serde_json::json;

use crate::gen::{parse_shape, Shape};
use crate::usage::{cpu_time, peak_rss};
use crate::Outcome;

#[derive(Args, Debug)]
pub struct StreamArgs {
    /// A .npy file, or a raw record file with --dtype and --shape.
    path: PathBuf,
    /// Records in a batch.
    #[arg(long)]
    batch_size: usize,
    /// auto, cpu, cuda or cuda:N. auto picks the first GPU, or the host backend without one.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Passes over the dataset.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Most page-locked memory to use, e.g. 256MiB or 1GiB.
    #[arg(long, default_value = "256MiB")]
    pinned_budget: String,
    /// Reader threads (default: one per core, at most 8).
    #[arg(long)]
    threads: Option<usize>,
    /// Drop the last batch of each epoch if it is partial.
    #[arg(long)]
    drop_last: bool,
    /// Check every delivered batch, read back from the device, against the source; exit 1 on a
    /// mismatch. Implies --crc.
    #[arg(long)]
    verify: bool,
    /// Compute the CRC-32 of everything delivered, read back from the device.
    #[arg(long)]
    crc: bool,
    /// Element type of a raw record file (see `pinfeed gen --help`), or numpy's `3,31,31B` form.
    #[arg(long)]
    dtype: Option<String>,
    /// Shape of one record of a raw record file, e.g. 3,31,31.
    #[arg(long, value_parser = parse_shape)]
    shape: Option<Shape>,
    /// How the pinned pool is page-locked on CUDA: register (malloc + cuMemHostRegister) or
    /// hostalloc (cuMemHostAlloc).
    #[arg(long, default_value = "register")]
    pin_method: String,
    /// How records reach the device: auto, pread (through pinned slots) or register (straight
    /// from a registered mapping of the file; auto picks it for page-cached files on CUDA).
    #[arg(long, default_value = "auto")]
    reader: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn parse_pin_method(text: &str) -> Result<PinMethod> {
    match text {
        "register" => Ok(PinMethod::Register),
        "hostalloc" | "host-alloc" => Ok(PinMethod::HostAlloc),
        _ => bail!("unknown pin method {text:?}: expected register or hostalloc"),
    }
}

pub fn open_source(
    path: &std::path::Path,
    dtype: Option<&str>,
    shape: Option<&[u64]>,
) -> Result<Arc<dyn Source>> {
    let raw_layout = match (dtype, shape) {
        (None, None) => None,
        (dtype, shape) => {
            let (dtype, mut full_shape) = parse_user_dtype(dtype.unwrap_or("u8"))?;
            full_shape.extend(shape.unwrap_or(&[]));
            Some(Layout::new(dtype, full_shape)?)
        }
    };
    let source: Arc<dyn Source> = Arc::from(open_path(path, raw_layout.clone())?);
    if let Some(asked) = raw_layout {
        if source.layout() != &asked {
            bail!(
                "{}: the .npy header gives records of {} bytes ({}), not the --dtype/--shape given ({} bytes)",
                path.display(),
                source.layout().record_bytes(),
                source.layout().dtype,
                asked.record_bytes()
            );
        }
    }
    Ok(source)
}

pub fn run(args: StreamArgs) -> Result<Outcome> {
    let source = open_source(
        &args.path,
        args.dtype.as_deref(),
        args.shape.as_ref().map(|s| s.0.as_slice()),
    )?;
    let device: DeviceSpec = args.device.parse()?;
    let options = LoaderOptions {
        batch_size: args.batch_size,
        drop_last: args.drop_last,
        epochs: args.epochs,
        pinned_budget: parse_size(&args.pinned_budget)?,
        num_threads: args.threads,
        device,
        pin_method: parse_pin_method(&args.pin_method)?,
        reader: args.reader.parse()?,
        ..LoaderOptions::default()
    };
    let check = args.verify || args.crc;
    let cpu_before = cpu_time();
    let started = Instant::now();
    let mut loader = Loader::new(Arc::clone(&source), options)?;
    let record_bytes = loader.record_bytes();
    let mut crc = crc32fast::Hasher::new();
    let mut device_bytes = Vec::new();
    let mut source_bytes = Vec::new();
    let mut mismatches: Vec<String> = Vec::new();
    for batch in loader.by_ref() {
        let batch = batch?;
        if check {
            device_bytes.resize(batch.len_bytes(), 0);
            batch.read_back(&mut device_bytes)?;
            crc.update(&device_bytes);
            if args.verify {
                source_bytes.resize(batch.len_bytes(), 0);
                source.read_records(batch.first_record(), &mut source_bytes)?;
                if source_bytes != device_bytes {
                    let at = source_bytes
                        .iter()
                        .zip(&device_bytes)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    mismatches.push(format!(
                        "batch {} (epoch {}, records {}..{}): first difference at record {} byte {}",
                        batch.seq(),
                        batch.epoch(),
                        batch.first_record(),
                        batch.first_record() + batch.num_records() as u64,
                        batch.first_record() + (at / record_bytes) as u64,
                        at % record_bytes
                    ));
                }
            }
        } else {
            batch.wait_ready()?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (cpu_time() - cpu_before).as_secs_f64();
    let stats = loader.stats();
    let expected_records = source.num_records() * args.epochs;
    if !args.drop_last && stats.records != expected_records {
        bail!(
            "{}: delivered {} records, expected {}",
            source.name(),
            stats.records,
            expected_records
        );
    }
    let crc_value = check.then(|| crc.finalize());
    let verified = args.verify && mismatches.is_empty();
    if args.json {
        println!(
            "{}",
            report_json(&args, &stats, seconds, cpu_seconds, verified, crc_value)
        );
    } else {
        print_report(&args, &stats, seconds, cpu_seconds, crc_value);
    }
    for m in mismatches.iter().take(10) {
        eprintln!("pinfeed: mismatch in {}: {m}", source.name());
    }
    if !mismatches.is_empty() {
        eprintln!(
            "pinfeed: verification failed: {} of {} batches differ from {}",
            mismatches.len(),
            stats.batches,
            source.name()
        );
        return Ok(Outcome::Failed);
    }
    Ok(Outcome::Ok)
}

fn report_json(
    args: &StreamArgs,
    stats: &Stats,
    seconds: f64,
    cpu_seconds: f64,
    verified: bool,
    crc: Option<u32>,
) -> serde_json::Value {
    json!({
        "path": args.path.display().to_string(),
        "device": stats.device.to_string(),
        "bytes": stats.bytes,
        "records": stats.records,
        "batches": stats.batches,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seconds": seconds,
        "gbps": stats.bytes as f64 / seconds / 1e9,
        "records_per_s": stats.records as f64 / seconds,
        "cpu_seconds": cpu_seconds,
        "verified": verified,
        "crc32": crc,
        "pinned_bytes_peak": stats.pinned_bytes_peak,
        "pinned_locked": stats.pinned_locked,
        "pinned_allocations_after_start": stats.pinned_allocations_after_start,
        "device_bytes_peak": stats.device_bytes_peak,
        "peak_rss_bytes": peak_rss(),
        "threads": stats.threads,
        "reader": stats.reader.to_string(),
        "slots": stats.slots,
        "slot_bytes": stats.slot_bytes,
        "slots_recycled": stats.slots_recycled,
        "slot_waits": stats.slot_waits,
        "slots_peak_in_use": stats.slots_peak_in_use,
        "stages": {
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
    })
}

fn print_report(
    args: &StreamArgs,
    stats: &Stats,
    seconds: f64,
    cpu_seconds: f64,
    crc: Option<u32>,
) {
    let gb = stats.bytes as f64 / 1e9;
    println!(
        "{}: {} records in {} batches to {} in {:.3} s",
        args.path.display(),
        stats.records,
        stats.batches,
        stats.device,
        seconds
    );
    println!(
        "  {:.2} GB/s, {:.2} M records/s, {:.3} GB, CPU time {:.3} s",
        gb / seconds,
        stats.records as f64 / seconds / 1e6,
        gb,
        cpu_seconds
    );
    println!(
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
    );
    println!("  reader: {} ({} thread(s))", stats.reader, stats.threads);
    println!(
        "  slots: recycled {}, readers waited for a free slot {} times ({:.3} s), peak in use {}",
        stats.slots_recycled,
        stats.slot_waits,
        stats.wait_free_slot.as_secs_f64(),
        stats.slots_peak_in_use
    );
    println!("  {}", stats.explain());
    if let Some(crc) = crc {
        println!(
            "  crc32 {crc:#010x}{}",
            if args.verify {
                ", verified against the source"
            } else {
                ""
            }
        );
    }
}
