//! `pinfeed bench`: the seed experiment. A float32 tensor moved to the device row by row as
//! (a) pageable copies, (b) copies through page-locked memory allocated for each row, and
//! (c) pinfeed's ring.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::Write;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use memmap2::MmapMut;
use pinfeed::{
    parse_size, DeviceData, DeviceSpec, Loader, LoaderOptions, PinMethod, Stager, StagerOptions,
    UploadMethod, DEFAULT_STAGING_BUDGET,
};
use pinfeed_cuda::{Context, DevicePool, PinnedMemory, Stream};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{HostBuffer, Layout};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::usage::cpu_time;
use crate::Outcome;
use pinfeed::system::mem_available;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Rows of the tensor (one row per copy).
    #[arg(long, default_value_t = 1024)]
    rows: usize,
    /// float32 columns in a row.
    #[arg(long, default_value_t = 655_360)]
    cols: usize,
    /// Most page-locked memory pinfeed may use.
    #[arg(long, default_value = "256MiB")]
    pinned_budget: String,
    /// pinfeed's reader threads (default: one per core) and the staging arena's copy threads
    /// (default: one per core, at most 8).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
        .range(1..=pinfeed::tune::MAX_THREADS as u64))]
    threads: Option<usize>,
    /// Repeat each variant this many times and report the median.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    repeat: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

struct Measured {
    name: &'static str,
    what: &'static str,
    wall: Duration,
    cpu: Duration,
    bytes: u64,
}

impl Measured {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64() / 1e9
    }
}

/// What variant (b) spent on page-locking, per row.
#[derive(Default)]
struct LockCost {
    alloc: Duration,
    free: Duration,
    count: u32,
}

/// Runs `f` `repeat` times; keeps the run with the median wall time.
fn median_of<T>(
    repeat: usize,
    mut f: impl FnMut() -> Result<(Duration, Duration, T)>,
) -> Result<(Duration, Duration, T)> {
    let mut runs = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        runs.push(f()?);
    }
    runs.sort_by_key(|r| r.0);
    let mid = runs.len() / 2;
    Ok(runs.swap_remove(mid))
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(Duration, Duration, T)> {
    let cpu = cpu_time();
    let wall = Instant::now();
    let out = f()?;
    Ok((wall.elapsed(), cpu_time() - cpu, out))
}

/// The tensor: uniform floats in [0, 1), like `torch.rand`, filled on all cores.
fn make_tensor(rows: usize, cols: usize) -> Vec<f32> {
    let mut data = vec![0f32; rows * cols];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = data.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, part) in data.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(i as u64);
                part.iter_mut().for_each(|x| *x = rng.random());
            });
        }
    });
    data
}

fn as_bytes(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8; the length in bytes is
    // exactly four times the element count.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

/// Pin-method costs: the method, the bytes page-locked, allocating and freeing them.
type PinCosts = Vec<(&'static str, usize, Duration, Duration)>;

/// The tensor every variant moves.
struct Tensor {
    data: Arc<Vec<f32>>,
    rows: usize,
    row_bytes: usize,
    total: u64,
    /// CRC-32 of its bytes, which every variant must deliver.
    crc: u32,
}

pub fn run(args: BenchArgs) -> Result<Outcome> {
    if args.rows == 0 || args.cols == 0 {
        bail!("--rows and --cols must be at least 1");
    }
    let device: DeviceSpec = args.device.parse::<DeviceSpec>()?.resolve();
    let rows = fit_rows(&args, device)?;
    let data = Arc::new(make_tensor(rows, args.cols));
    let t = Tensor {
        crc: crc32fast::hash(as_bytes(&data)),
        data,
        rows,
        row_bytes: args.cols * 4,
        total: (rows * args.cols * 4) as u64,
    };
    // Held for the whole run: the CUDA context is made once, as in any program that uses the GPU,
    // and stays out of every variant's time (torch's baselines warm up the same way).
    let ctx = match device {
        DeviceSpec::Cuda(ordinal) => Some(Context::new(ordinal)?),
        _ => None,
    };
    let (pageable, per_row, lock_cost, pin_methods) = seed_variants(&args, ctx.as_ref(), &t)?;
    let ring = ring_variant(&args, device, &t)?;
    let uploads = upload_variants(&args, device, &t)?;
    let total = t.total;
    let seed = [
        Measured {
            name: "pageable",
            what: "(a) pageable copy of each row",
            wall: pageable.0,
            cpu: pageable.1,
            bytes: total,
        },
        Measured {
            name: "pinned_per_batch",
            what: "(b) page-locked memory allocated for each row",
            wall: per_row.0,
            cpu: per_row.1,
            bytes: total,
        },
        Measured {
            name: "pinfeed",
            what: "(c) pinfeed ring",
            wall: ring.0,
            cpu: ring.1,
            bytes: total,
        },
    ];
    let variants: Vec<Measured> = seed.into_iter().chain(uploads).collect();
    let mut out = crate::output::stdout();
    write_report(
        &mut out,
        &args,
        device,
        &t,
        &variants,
        &lock_cost,
        &pin_methods,
    )?;
    out.flush()?;
    Ok(Outcome::Ok)
}

/// `--rows`, halved until the tensor and a destination as large on the host backend fit in the
/// memory available with room to spare.
fn fit_rows(args: &BenchArgs, device: DeviceSpec) -> Result<usize> {
    let mut rows = args.rows;
    let copies = if device == DeviceSpec::Cpu { 3 } else { 2 };
    // In u64 and saturating: a row of `--cols` floats may overflow the address space.
    let held = |rows: usize| {
        (rows as u64)
            .saturating_mul(args.cols as u64)
            .saturating_mul(4 * copies)
    };
    // Rows are halved to fit, never below one: a row that does not fit, or that a `usize`
    // cannot hold the bytes of, is refused before anything is allocated.
    let fits = |bytes: u64| mem_available().is_none_or(|available| bytes <= available);
    if !fits(held(1)) || args.cols.checked_mul(4 * copies as usize).is_none() {
        bail!(
            "--cols {}: one row is {} bytes, and the bench holds {copies} copies of it: more \
             than this machine's available memory",
            args.cols,
            (args.cols as u128) * 4,
        );
    }
    if let Some(available) = mem_available() {
        while rows > 1 && held(rows) > available {
            rows /= 2;
        }
        if rows != args.rows {
            note!(
                "pinfeed bench: {} MB of memory available; using {rows} rows instead of {}",
                available / 1_000_000,
                args.rows
            );
        }
    }
    Ok(rows)
}

/// Variants (a) and (b) of the seed: `(wall, cpu)` of each, what (b) spent page-locking, and
/// on a GPU what each pin method costs.
#[allow(clippy::type_complexity)] // one tuple, taken apart at the one call
fn seed_variants(
    args: &BenchArgs,
    ctx: Option<&Arc<Context>>,
    t: &Tensor,
) -> Result<(
    (Duration, Duration),
    (Duration, Duration),
    LockCost,
    PinCosts,
)> {
    let (tensor, row_bytes, total, source_crc) = (&t.data, t.row_bytes, t.total, t.crc);
    let mut pin_methods = Vec::new();
    let (pageable, per_row, lock_cost) = match ctx {
        Some(ctx) => {
            let cuda = CudaBench::new(ctx, total as usize)?;
            let pageable = median_of(args.repeat, || timed(|| cuda.pageable(tensor, row_bytes)))?;
            cuda.check(source_crc, "pageable")?;
            let per_row = median_of(args.repeat, || {
                timed(|| cuda.pinned_per_row(tensor, row_bytes))
            })?;
            cuda.check(source_crc, "pinned_per_batch")?;
            pin_methods = measure_pin_methods(ctx)?;
            ((pageable.0, pageable.1), (per_row.0, per_row.1), per_row.2)
        }
        None => {
            // Touched before any timing: first-touch page faults are not what (a) measures.
            let mut dst = vec![1u8; total as usize];
            let pageable = median_of(args.repeat, || {
                timed(|| host_pageable(tensor, &mut dst, row_bytes))
            })?;
            check_crc(crc32fast::hash(&dst), source_crc, "pageable")?;
            dst.fill(0);
            let per_row = median_of(args.repeat, || {
                timed(|| host_locked_per_row(tensor, &mut dst, row_bytes))
            })?;
            check_crc(crc32fast::hash(&dst), source_crc, "pinned_per_batch")?;
            ((pageable.0, pageable.1), (per_row.0, per_row.1), per_row.2)
        }
    };
    Ok((pageable, per_row, lock_cost, pin_methods))
}

/// Variant (c): every row through a loader's ring, checked untimed afterwards.
fn ring_variant(args: &BenchArgs, device: DeviceSpec, t: &Tensor) -> Result<(Duration, Duration)> {
    let (tensor, cols, row_bytes, total, source_crc) =
        (&t.data, args.cols, t.row_bytes, t.total, t.crc);
    let options = LoaderOptions {
        batch_size: 1,
        device,
        pinned_budget: parse_size(&args.pinned_budget)?,
        num_threads: Some(args.threads.unwrap_or_else(pinfeed_source::system::cores)),
        pin_method: PinMethod::Register,
        ..LoaderOptions::default()
    };
    let (dtype, _) = parse_user_dtype("f32")?;
    let layout = Layout::new(dtype, vec![cols as u64])?;
    let owner = Arc::clone(tensor);
    // SAFETY: the bytes belong to `tensor`, which `owner` keeps alive and nobody writes.
    let source = Arc::new(unsafe {
        HostBuffer::from_raw(
            tensor.as_ptr().cast(),
            total as usize,
            layout,
            Box::new(owner),
        )
    }?);
    let ring = median_of(args.repeat, || {
        timed(|| {
            let loader = Loader::new(source.clone(), options.clone())?;
            for batch in loader {
                batch?.wait_ready()?;
            }
            Ok(())
        })
    })?;
    // Untimed: what arrived through the ring, read back from the device.
    let mut crc = crc32fast::Hasher::new();
    let mut back = vec![0u8; row_bytes];
    for batch in Loader::new(source.clone(), options.clone())? {
        let batch = batch?;
        batch.read_back(&mut back)?;
        crc.update(&back);
    }
    check_crc(crc.finalize(), source_crc, "pinfeed")?;
    Ok((ring.0, ring.1))
}

/// Not one of the seed's per-row variants: the whole tensor at once, what `pinfeed.to_device`
/// does, by each upload method (the default, the arena alone, first).
fn upload_variants(args: &BenchArgs, device: DeviceSpec, t: &Tensor) -> Result<Vec<Measured>> {
    let (tensor, total, source_crc) = (&t.data, t.total, t.crc);
    let mut uploads = Vec::new();
    for (name, method) in [
        ("pinfeed_to_device", UploadMethod::Stage),
        ("pinfeed_to_device_both", UploadMethod::Both),
        ("pinfeed_to_device_register", UploadMethod::Register),
    ] {
        let stager = Stager::new(StagerOptions {
            device,
            // The staging arena's own default (64 MiB, faster than larger ones), within the budget.
            pinned_budget: DEFAULT_STAGING_BUDGET.min(parse_size(&args.pinned_budget)?),
            num_threads: args.threads,
            method,
            ..StagerOptions::default()
        })?;
        let whole = median_of(args.repeat, || {
            timed(|| {
                let array = stager.upload(as_bytes(tensor))?;
                array.wait_ready()?;
                Ok(())
            })
        })?;
        let array = stager.upload(as_bytes(tensor))?;
        let mut back = vec![0u8; total as usize];
        array.read_back(&mut back)?;
        check_crc(crc32fast::hash(&back), source_crc, name)?;
        let counters = stager.counters();
        if let Some(error) = counters.register_error {
            note!("{name}: registration failed, staged instead: {error}");
        }
        uploads.push((name, method, whole));
    }
    Ok(uploads
        .iter()
        .map(|&(name, method, (wall, cpu, _))| Measured {
            name,
            what: match method {
                UploadMethod::Both => "whole tensor, arena and registration at once",
                UploadMethod::Stage => "whole tensor through the staging arena (default)",
                UploadMethod::Register => "whole tensor registered chunk by chunk in place",
            },
            wall,
            cpu,
            bytes: total,
        })
        .collect())
}

/// Said before the table when there is no GPU, so that no one reads host rows as PCIe rates.
pub const HOST_BACKEND: &str = "host backend: no GPU here; the 'device' is host memory and the copy \
    engine a memcpy thread, so these rows measure CPU copies, not PCIe: the slot-to-device copy that \
    a GPU's DMA engine makes without the CPU is one more CPU memcpy here";

/// The table, or with --json one object, and why (b) loses.
fn write_report(
    out: &mut impl Write,
    args: &BenchArgs,
    device: DeviceSpec,
    t: &Tensor,
    variants: &[Measured],
    lock_cost: &LockCost,
    pin_methods: &PinCosts,
) -> std::io::Result<()> {
    let (rows, row_bytes, total) = (t.rows, t.row_bytes, t.total);
    let alloc_ms = lock_cost.alloc.as_secs_f64() * 1e3 / f64::from(lock_cost.count.max(1));
    let free_ms = lock_cost.free.as_secs_f64() * 1e3 / f64::from(lock_cost.count.max(1));
    let row_copy_ms = variants[2].wall.as_secs_f64() * 1e3 / rows as f64;
    let why = format!(
        "(b) loses because page-locking a fresh {:.1} MB buffer costs {alloc_ms:.3} ms (and freeing it {free_ms:.3} ms), \
         {:.1} times the {row_copy_ms:.3} ms one row takes through pinfeed's ring, which page-locked its memory once at start-up.",
        row_bytes as f64 / 1e6,
        (alloc_ms + free_ms) / row_copy_ms.max(1e-9),
    );

    if args.json {
        let list: Vec<_> = variants
            .iter()
            .map(|v| {
                json!({"name": v.name, "wall_s": v.wall.as_secs_f64(), "cpu_s": v.cpu.as_secs_f64(), "gbps": v.gbps()})
            })
            .collect();
        let methods: Vec<_> = pin_methods
            .iter()
            .map(|(m, bytes, alloc, free)| {
                json!({"method": m, "bytes": bytes, "alloc_ms": alloc.as_secs_f64() * 1e3, "free_ms": free.as_secs_f64() * 1e3})
            })
            .collect();
        writeln!(
            out,
            "{}",
            json!({
                "device": device.to_string(),
                "backend": if matches!(device, DeviceSpec::Cuda(_)) { "cuda" } else { "host" },
                "rows": rows,
                "cols": args.cols,
                "row_bytes": row_bytes,
                "bytes": total,
                "repeat": args.repeat,
                "variants": list,
                "page_lock_alloc_ms": alloc_ms,
                "page_lock_free_ms": free_ms,
                "row_copy_ms": row_copy_ms,
                "pin_methods": methods,
                "verified": true,
                "why": why,
            })
        )?;
    } else {
        if !matches!(device, DeviceSpec::Cuda(_)) {
            writeln!(out, "{HOST_BACKEND}")?;
        }
        write_table(out, args, device, t, variants, pin_methods, &why)?;
    }
    Ok(())
}

/// The text report: a row per variant, the pin methods' costs, and why (b) loses.
fn write_table(
    out: &mut impl Write,
    args: &BenchArgs,
    device: DeviceSpec,
    t: &Tensor,
    variants: &[Measured],
    pin_methods: &PinCosts,
    why: &str,
) -> std::io::Result<()> {
    let (rows, row_bytes, total, source_crc) = (t.rows, t.row_bytes, t.total, t.crc);
    writeln!(out,
        "seed experiment on {device}: {rows} × {} float32 ({:.2} GB), one row ({:.2} MB) per copy, median of {}",
        args.cols,
        total as f64 / 1e9,
        row_bytes as f64 / 1e6,
        args.repeat
    )?;
    let width = variants.iter().map(|v| v.what.len()).max().unwrap_or(0);
    writeln!(
        out,
        "{:<width$} {:>10} {:>10} {:>8}",
        "variant", "wall ms", "CPU ms", "GB/s"
    )?;
    for v in variants {
        writeln!(
            out,
            "{:<width$} {:>10.1} {:>10.1} {:>8.2}",
            v.what,
            v.wall.as_secs_f64() * 1e3,
            v.cpu.as_secs_f64() * 1e3,
            v.gbps()
        )?;
    }
    for (m, bytes, alloc, free) in pin_methods {
        writeln!(
            out,
            "page-locking {:.0} MiB with {m}: {:.1} ms, freeing it {:.1} ms",
            *bytes as f64 / (1u64 << 20) as f64,
            alloc.as_secs_f64() * 1e3,
            free.as_secs_f64() * 1e3
        )?;
    }
    writeln!(
        out,
        "every variant delivered bytes equal to the source (CRC-32 {source_crc:#010x})"
    )?;
    writeln!(out, "{why}")?;
    Ok(())
}

fn check_crc(got: u32, want: u32, variant: &str) -> Result<()> {
    if got != want {
        bail!("variant {variant} delivered wrong bytes: CRC-32 {got:#010x}, source {want:#010x}");
    }
    Ok(())
}

fn host_pageable(tensor: &[f32], dst: &mut [u8], row_bytes: usize) -> Result<()> {
    for (src, dst) in as_bytes(tensor)
        .chunks(row_bytes)
        .zip(dst.chunks_mut(row_bytes))
    {
        dst.copy_from_slice(src);
    }
    Ok(())
}

/// The host backend's (b): for each row, fresh memory locked with `mlock`, the row copied in,
/// copied out to the destination, then unlocked and unmapped.
fn host_locked_per_row(tensor: &[f32], dst: &mut [u8], row_bytes: usize) -> Result<LockCost> {
    let mut cost = LockCost::default();
    for (src, dst) in as_bytes(tensor)
        .chunks(row_bytes)
        .zip(dst.chunks_mut(row_bytes))
    {
        let t = Instant::now();
        let mut locked = MmapMut::map_anon(row_bytes).context("mmap of a row buffer")?;
        locked.lock().with_context(|| {
            format!(
                "mlock of one {row_bytes}-byte row (raise the memory-lock limit with `ulimit -l`)"
            )
        })?;
        cost.alloc += t.elapsed();
        cost.count += 1;
        locked.copy_from_slice(src);
        dst.copy_from_slice(&locked);
        let t = Instant::now();
        // Unmapping unlocks too, but the unlock is part of what (b) pays and is timed alike.
        locked.unlock().context("munlock of a row buffer")?;
        drop(locked);
        cost.free += t.elapsed();
    }
    Ok(cost)
}

/// Measures page-locking 256 MiB with each method (made once, so the cost is worth knowing,
/// and the faster method is the pool's default).
fn measure_pin_methods(
    ctx: &Arc<Context>,
) -> Result<Vec<(&'static str, usize, Duration, Duration)>> {
    let bytes = 256 << 20;
    let mut out = Vec::new();
    for (name, method) in [
        ("cuMemHostAlloc", PinMethod::HostAlloc),
        ("malloc+cuMemHostRegister", PinMethod::Register),
    ] {
        let t = Instant::now();
        let memory = PinnedMemory::alloc(ctx, bytes, method)?;
        let alloc = t.elapsed();
        let t = Instant::now();
        drop(memory);
        out.push((name, bytes, alloc, t.elapsed()));
    }
    Ok(out)
}

/// The CUDA variants (a) and (b), into one device buffer the size of the tensor.
struct CudaBench {
    ctx: Arc<Context>,
    stream: Stream,
    dst: pinfeed_cuda::DeviceBuffer,
    len: usize,
}

impl CudaBench {
    fn new(ctx: &Arc<Context>, len: usize) -> Result<CudaBench> {
        let stream = Stream::new(ctx)?;
        let pool = DevicePool::new(ctx)?;
        let dst = pool.alloc_async(len, &stream)?;
        stream.synchronize()?;
        Ok(CudaBench {
            ctx: Arc::clone(ctx),
            stream,
            dst,
            len,
        })
    }

    /// `i.cuda()` for each row: a copy from pageable memory, waited for.
    fn pageable(&self, tensor: &[f32], row_bytes: usize) -> Result<()> {
        for (i, row) in as_bytes(tensor).chunks(row_bytes).enumerate() {
            // SAFETY: `row` lives through the synchronisation below; the destination range is
            // inside `dst` (`i * row_bytes + row.len() <= len`).
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    self.dst.ptr() + (i * row_bytes) as u64,
                    row.as_ptr(),
                    row.len(),
                    &self.stream,
                )?;
            }
            self.stream.synchronize()?;
        }
        Ok(())
    }

    /// `i.pin_memory().cuda()` for each row: fresh page-locked memory, a copy in, the copy to
    /// the device, the memory freed once the copy is done.
    fn pinned_per_row(&self, tensor: &[f32], row_bytes: usize) -> Result<LockCost> {
        let mut cost = LockCost::default();
        for (i, row) in as_bytes(tensor).chunks(row_bytes).enumerate() {
            let t = Instant::now();
            let pinned = PinnedMemory::alloc(&self.ctx, row.len(), PinMethod::HostAlloc)?;
            cost.alloc += t.elapsed();
            cost.count += 1;
            // SAFETY: the allocation holds `row.len()` bytes and nothing else uses it yet.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), pinned.as_ptr(), row.len()) };
            // SAFETY: `pinned` lives until after the synchronisation; the destination range is
            // inside `dst`.
            unsafe {
                pinfeed_cuda::memcpy_htod_async(
                    self.dst.ptr() + (i * row_bytes) as u64,
                    pinned.as_ptr(),
                    row.len(),
                    &self.stream,
                )?;
            }
            self.stream.synchronize()?;
            let t = Instant::now();
            drop(pinned);
            cost.free += t.elapsed();
        }
        Ok(cost)
    }

    /// Reads the destination back and compares its CRC-32 with the source's.
    fn check(&self, want: u32, variant: &str) -> Result<()> {
        let mut back = vec![0u8; self.len];
        // SAFETY: `back` holds `len` bytes and lives through the synchronisation.
        unsafe {
            pinfeed_cuda::memcpy_dtoh_async(
                back.as_mut_ptr(),
                self.dst.ptr(),
                self.len,
                &self.stream,
            )?;
        }
        self.stream.synchronize()?;
        check_crc(crc32fast::hash(&back), want, variant)
    }
}
