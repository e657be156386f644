//! The report of a run: text, `--json`, and `--plot`.

use std::io::{self, Write};
use std::time::Instant;

use anyhow::Result;
use pinfeed::{DeviceSpec, Stats};
use pinfeed_source::Reader;
use serde_json::json;

use super::StreamArgs;
use crate::usage::peak_rss;

/// What one run measured, for the report.
pub(super) struct Measured {
    pub(super) stats: Stats,
    /// The devices as given (`--device`, or each of `--devices`).
    pub(super) devices: Vec<DeviceSpec>,
    pub(super) seconds: f64,
    pub(super) cpu_seconds: f64,
    pub(super) cuda_init_s: f64,
    /// `--crc`: every delivered byte, step by step, each step's batches in device order.
    pub(super) crc: Option<u32>,
    /// `--crc`: each device's own batches.
    pub(super) device_crcs: Vec<Option<u32>>,
    pub(super) verified: bool,
    /// `--images`: samples skipped (`--on-error skip`).
    pub(super) skipped: Option<u64>,
    pub(super) auto_reason: Option<String>,
}

/// `--plot`: the timeline drawn, titled with the file, the rate, the device and the bottleneck.
pub(super) fn draw_plot(
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

/// The `--json` report. With `--devices`, also `mode`, `devices` (each device's bytes, rate
/// and CRC-32), `read_bytes` and `read_gbps`, and `device` lists every device.
pub(super) fn report_json(args: &StreamArgs, m: &Measured) -> serde_json::Value {
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
        "threads_reason": stats.threads_reason,
        "copy_gbps": stats.machine.map(|m| m.copy_gbps),
        "bus_gbps": stats.machine.map(|m| m.bus_gbps),
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
        "slot_claims": stats.slot_claims,
        "slot_claims_own": stats.slot_claims_own,
        "slots_peak_in_use": stats.slots_peak_in_use,
        "cuda_init_s": m.cuda_init_s,
        "stages": {
            "startup_s": stats.startup.as_secs_f64(),
            "read_s": stats.read_time.as_secs_f64(),
            "transform_s": stats.transform_time.as_secs_f64(),
            "wait_free_slot_s": stats.wait_free_slot.as_secs_f64(),
            "wait_free_slot_no_copy_s": stats.wait_free_slot_no_copy.as_secs_f64(),
            "copy_wait_filled_s": stats.wait_filled.as_secs_f64(),
            "copy_wait_filled_behind_s": stats.wait_filled_behind.as_secs_f64(),
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
    if let Some(net) = &stats.network {
        let fields = report.as_object_mut().expect("the report is an object");
        fields.insert(
            "network".into(),
            json!({
                "bytes_fetched": net.bytes_fetched,
                "requests": net.requests,
                "retries": net.retries,
                "cache_hits": net.cache_hits,
                "cache_misses": net.cache_misses,
                "cache_errors": net.cache_errors,
                "wait_s": net.wait.as_secs_f64(),
            }),
        );
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
    if let Some(skipped) = m.skipped {
        let fields = report.as_object_mut().expect("the report is an object");
        fields.insert(
            "images_per_second".into(),
            json!(stats.records as f64 / seconds),
        );
        fields.insert(
            "cpu_seconds_per_1000_images".into(),
            json!(m.cpu_seconds * 1000.0 / stats.records.max(1) as f64),
        );
        fields.insert("skipped".into(), json!(skipped));
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
pub(super) fn print_report(
    out: &mut impl Write,
    args: &StreamArgs,
    m: &Measured,
) -> io::Result<()> {
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
    print_pipeline(out, args, m)?;
    if args.devices.is_some() {
        print_devices(out, args, m)?;
    }
    Ok(())
}

/// The text report's lines on the reader, the slots, the tokens, the bottleneck and the CRC.
fn print_pipeline(out: &mut impl Write, args: &StreamArgs, m: &Measured) -> io::Result<()> {
    let (stats, seconds) = (&m.stats, m.seconds);
    writeln!(
        out,
        "  reader: {}; threads {}",
        stats.reader_description, stats.threads_reason
    )?;
    writeln!(
        out,
        "  slots: recycled {}, readers waited for a free slot {} times ({:.3} s, {:.3} s with no \
         copy in flight), peak in use {}, {} of {} claims a reader's own",
        stats.slots_recycled,
        stats.slot_waits,
        stats.wait_free_slot.as_secs_f64(),
        stats.wait_free_slot_no_copy.as_secs_f64(),
        stats.slots_peak_in_use,
        stats.slot_claims_own,
        stats.slot_claims
    )?;
    writeln!(
        out,
        "  copy thread: waited {:.3} s for the next batch ({:.3} s of it with later ones filled), \
         {:.3} s for the consumer",
        stats.wait_filled.as_secs_f64(),
        stats.wait_filled_behind.as_secs_f64(),
        stats.wait_consumer.as_secs_f64()
    )?;
    if let Some(net) = &stats.network {
        writeln!(
            out,
            "  network: {:.1} MB fetched in {} requests ({} retried), readers waited {:.3} s; \
             cache {} hits, {} misses, {} errors",
            net.bytes_fetched as f64 / 1e6,
            net.requests,
            net.retries,
            net.wait.as_secs_f64(),
            net.cache_hits,
            net.cache_misses,
            net.cache_errors
        )?;
    }
    if let Some(seq_len) = args.seq_len {
        writeln!(
            out,
            "  {:.2} M tokens/s ({} windows of seq_len {seq_len})",
            tokens_per_second(stats, seq_len, seconds) / 1e6,
            crate::tokens::sample(args).name()
        )?;
    }
    if let Some(skipped) = m.skipped {
        writeln!(
            out,
            "  {:.0} images/s, {:.2} CPU s per 1000 images, {skipped} skipped",
            stats.records as f64 / seconds,
            m.cpu_seconds * 1000.0 / stats.records.max(1) as f64
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
