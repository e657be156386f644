//! Taking every batch from the loader, and checking what reached the devices.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use pinfeed::{Batch, BatchRecords, DeviceSpec, MultiLoader, Stats};
use pinfeed_source::Source;

use super::StreamArgs;

/// What iterating the loader gathered.
pub(super) struct Delivery {
    /// Every delivered byte, step by step, each step's batches in device order.
    pub(super) crc: crc32fast::Hasher,
    /// Each device's own batches.
    pub(super) device_crcs: Vec<crc32fast::Hasher>,
    pub(super) mismatches: Vec<String>,
    pub(super) timeline: Option<crate::plot::Timeline>,
}

/// Takes every step from `loader`, reading each batch back from its device for `--crc` and
/// `--verify`, or else only waiting, at the end, for the last step's copies.
pub(super) fn deliver(
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

/// Fails unless every device received what it should: replicated, every record; split, its
/// shard of every epoch, padded to the same length as ranks are (one device: every record).
pub(super) fn check_delivered(
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

/// Starts CUDA on each CUDA device in `devices` before the clock, as torch's baselines do: a
/// process pays it once, whatever it streams (a fraction of a second). Returns the
/// contexts, to hold for the run, and the seconds it took.
pub(super) fn start_cuda(devices: &[DeviceSpec]) -> Result<(Vec<Arc<pinfeed_cuda::Context>>, f64)> {
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
pub(super) fn report_mismatches(source: &dyn Source, mismatches: &[String], batches: u64) -> bool {
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
pub(super) type ExpectedRecord<'a> = dyn Fn(u64, &mut [u8]) -> pinfeed_source::Result<()> + 'a;

/// What `--verify` holds delivered batches to.
pub(super) struct Reference<'a> {
    pub(super) source: &'a dyn Source,
    /// Each record's bytes worked out on their own, where the source's read is not the
    /// reference (token windows: the rule that picks them, read from the tokens); else the
    /// source's own reads, a batch at a time.
    pub(super) record: Option<&'a ExpectedRecord<'a>>,
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
