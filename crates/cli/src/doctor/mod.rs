//! `pinfeed doctor`: what this machine offers a data loader, measured, and what that means.
//!
//! Host facts (cores, memory, the memory-lock limit, transparent hugepages, whether the host takes
//! back freed memory), the GPU and its PCIe link and NUMA node, copy rates from pinned and
//! pageable memory, what page-locking one batch costs against copying it, a file's read rate from
//! disk and from the page cache; then advice in plain words computed from those numbers. Every
//! part that cannot be measured here (no driver, no sysfs, O_DIRECT refused) is reported as such,
//! and the rest still runs.

mod advise;
mod decode;
mod measure;
mod probe;
mod render;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::io::Write as _;

use anyhow::Result;
use clap::Args;
use pinfeed::DeviceSpec;
use serde::Serialize;

use crate::Outcome;
use advise::advise;
use measure::{measure_file, measure_gpu, measure_host};
use probe::{gpu_facts, host_facts, open_gpu};
use render::render;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// A dataset file whose read rate to measure (from disk and from the page cache).
    path: Option<PathBuf>,
    /// auto, cpu, cuda or cuda:N: the GPU to examine. cpu skips the GPU.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// An image dataset (an ImageFolder tree or .tar shards) on which to time decode="auto"'s
    /// two decoders now (224x224 random crops, batches of 128; needs a CUDA device and nvJPEG).
    #[arg(long, value_name = "PATH")]
    images: Option<PathBuf>,
}

/// A typical batch: 1024 records of `3,31,31` bytes (2.95 MB), the seed question's.
const BATCH_BYTES: usize = 1024 * 3 * 31 * 31;
/// The largest copy measured, and the size of the pinned buffer it comes from.
const BIG: usize = 256 << 20;
/// Copy sizes measured from pinned and from pageable memory.
const COPY_SIZES: [usize; 3] = [1 << 20, 16 << 20, BIG];
/// Most bytes read from the file buffered, and with O_DIRECT.
const BUFFERED_LIMIT: u64 = 1 << 30;
const DIRECT_LIMIT: u64 = 256 << 20;
/// Reads of one pass stop after this long, so a slow disk cannot stretch the run.
const READ_TIME_CAP: Duration = Duration::from_secs(2);
/// Below this many bytes read, a rate is mostly timer noise: reported, never advised on.
const MEANINGFUL_READ: u64 = 16 << 20;

// ------------------------------------------------------------------------------------------
// The report
// ------------------------------------------------------------------------------------------

#[derive(Serialize, Debug, Default)]
struct Report {
    host: Host,
    /// `None` when no GPU could be used; `gpu_unavailable` says why.
    gpu: Option<GpuFacts>,
    gpu_unavailable: Option<String>,
    gpu_copies: Option<GpuCopies>,
    /// A measurement on the GPU that failed after the GPU was found.
    gpu_copies_error: Option<String>,
    host_copies: HostCopies,
    /// The copy threads loaders and `to_device` start by default here, and the rates they were
    /// chosen from (`pinfeed::tune`).
    threads: Option<Threads>,
    file: Option<FileReport>,
    /// What `ImageLoader(decode="auto")` picks for this device, and why.
    image_decode: String,
    /// The decoders' rates measured this boot (by any process), per dataset.
    image_decode_measured: Vec<decode::DecodeMeasured>,
    advice: Vec<String>,
}

#[derive(Serialize, Debug)]
struct Threads {
    threads: usize,
    reason: String,
    copy_gbps: Option<f64>,
    bus_gbps: Option<f64>,
}

#[derive(Serialize, Debug, Default)]
struct Host {
    cpus: usize,
    mem_total_bytes: Option<u64>,
    mem_available_bytes: Option<u64>,
    /// The soft RLIMIT_MEMLOCK; `None` when unlimited (`memlock_unlimited`) or unreadable.
    memlock_bytes: Option<u64>,
    memlock_unlimited: bool,
    root: bool,
    /// CAP_IPC_LOCK lets a process lock memory beyond RLIMIT_MEMLOCK (root has it, except in
    /// most containers, whose root does not).
    cap_ipc_lock: bool,
    /// The selected mode in /sys/kernel/mm/transparent_hugepage/enabled.
    transparent_hugepages: Option<String>,
    /// Whether a virtio-balloon device reports freed memory to the host (free page reporting),
    /// which then backs it again, slowly, when it is next touched; `None` where no virtio-balloon
    /// device is seen (other hypervisors' balloon drivers are not looked for).
    free_page_reporting: Option<bool>,
    numa_nodes: Option<usize>,
}

#[derive(Serialize, Debug, Default, Clone, PartialEq)]
struct LinkState {
    /// As sysfs writes it (`32.0 GT/s PCIe`).
    speed: Option<String>,
    gen: Option<u32>,
    width: Option<u32>,
}

#[derive(Serialize, Debug, Default)]
struct Link {
    /// The sysfs directory read, `None` when the device has none.
    sysfs: Option<String>,
    current: LinkState,
    max: LinkState,
    /// Read while copies were running: GPUs slow an idle link down to save power.
    under_load: Option<LinkState>,
}

#[derive(Serialize, Debug, Default)]
struct GpuFacts {
    ordinal: usize,
    name: String,
    /// The CUDA version the driver supports (`13.0`).
    cuda_version: Option<String>,
    /// The kernel module's version (`580.65.06`), from sysfs.
    kernel_driver: Option<String>,
    compute_capability: Option<String>,
    memory_total_bytes: Option<u64>,
    memory_free_bytes: Option<u64>,
    pci_bus_id: Option<String>,
    copy_engines: Option<i32>,
    link: Link,
    /// From sysfs; `None` when the platform reports none (`-1`) or there is no sysfs entry.
    numa_node: Option<u32>,
    numa_cpus: Option<String>,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
struct Rate {
    bytes: usize,
    ms: f64,
    gbps: f64,
}

impl Rate {
    fn new(bytes: usize, ms: f64) -> Rate {
        Rate {
            bytes,
            ms,
            gbps: bytes as f64 / (ms.max(1e-9) * 1e-3) / 1e9,
        }
    }
}

#[derive(Serialize, Debug, Default)]
struct GpuCopies {
    /// `events` (CUDA timing events around each copy) or `wall` (drivers before CUDA 12.8).
    timing: &'static str,
    /// Host to device, median of several copies of each size.
    pinned: Vec<Rate>,
    pageable: Vec<Rate>,
    /// What page-locking the 256 MiB source buffer with cuMemHostAlloc took.
    host_alloc_256mib_ms: f64,
    batch: BatchCost,
}

/// One batch's page-locking against its copy, all medians.
#[derive(Serialize, Debug, Default, Clone, Copy)]
struct BatchCost {
    bytes: usize,
    host_alloc_ms: f64,
    free_host_ms: f64,
    register_ms: f64,
    unregister_ms: f64,
    pinned_copy_ms: f64,
    pageable_copy_ms: f64,
}

#[derive(Serialize, Debug, Default)]
struct HostCopies {
    bytes: usize,
    threads: usize,
    memcpy_1_thread_gbps: f64,
    memcpy_all_threads_gbps: f64,
    batch_bytes: usize,
    batch_memcpy_ms: f64,
    /// Fresh mapping + `mlock` of one batch, and `munlock` + `munmap`: what locking each batch on
    /// the host backend would cost.
    batch_mlock_ms: Option<f64>,
    batch_munlock_ms: Option<f64>,
    mlock_error: Option<String>,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
struct ReadRate {
    bytes: u64,
    seconds: f64,
    gbps: f64,
    /// Fraction of the range read that was in the page cache just before (`None` for O_DIRECT,
    /// which the cache does not serve).
    cached_before: Option<f64>,
}

#[derive(Serialize, Debug, Default)]
struct FileReport {
    path: String,
    size_bytes: u64,
    /// Fraction of the whole file in the page cache when doctor started.
    cached_fraction: Option<f64>,
    /// Sequential 8 MiB `pread`s of up to 1 GiB.
    buffered: Option<ReadRate>,
    /// The same range again, when the first pass left it in the page cache.
    buffered_again: Option<ReadRate>,
    /// Why there was no second pass.
    buffered_again_skipped: Option<String>,
    /// 4 MiB aligned O_DIRECT reads of up to 256 MiB: the disk, whatever is cached.
    direct: Option<ReadRate>,
    direct_refused: Option<String>,
}

// ------------------------------------------------------------------------------------------
// The command
// ------------------------------------------------------------------------------------------

pub fn run(args: DoctorArgs) -> Result<Outcome> {
    let device: DeviceSpec = args.device.parse()?;
    // Open the file first: a wrong path is the one error worth stopping for.
    let file = match &args.path {
        Some(path) => Some(open_dataset(path)?),
        None => None,
    };

    let mut report = Report {
        host: host_facts(),
        ..Report::default()
    };

    match open_gpu(device) {
        Ok(ctx) => {
            let choice = pinfeed::tune::choose_for(&ctx);
            report.threads = Some(Threads {
                threads: choice.threads,
                copy_gbps: choice.rates.map(|r| r.copy_gbps),
                bus_gbps: choice.rates.map(|r| r.bus_gbps),
                reason: choice.reason,
            });
            let mut facts = gpu_facts(&ctx);
            match measure_gpu(&ctx, &mut facts) {
                Ok(copies) => report.gpu_copies = Some(copies),
                Err(e) => report.gpu_copies_error = Some(crate::one_line(&e)),
            }
            report.gpu = Some(facts);
        }
        Err(why) => report.gpu_unavailable = Some(why),
    }
    report.image_decode = decode::image_decode(device, args.images.as_deref())?;
    report.image_decode_measured = decode::measured();
    report.host_copies = measure_host(report.host.mem_available_bytes);
    if let (Some(path), Some(file)) = (&args.path, &file) {
        report.file = Some(measure_file(path, file)?);
    }
    report.advice = advise(&report);

    let mut out = crate::output::stdout();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        write!(out, "{}", render(&report, args.path.as_deref()))?;
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

fn open_dataset(path: &Path) -> Result<File> {
    // By its file type first: a FIFO is refused, never opened (that would block).
    let (file, _) = pinfeed_source::open_regular(path)
        .map_err(|e| anyhow::anyhow!("{e}: doctor measures reading a dataset file"))?;
    Ok(file)
}
