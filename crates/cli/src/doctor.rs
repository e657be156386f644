//! `pinfeed doctor`: what this machine offers a data loader, measured, and what that means.
//!
//! Host facts (cores, memory, the memory-lock limit, transparent hugepages), the GPU and its PCIe
//! link and NUMA node, copy rates from pinned and pageable memory, what page-locking one batch
//! costs against copying it, a file's read rate from disk and from the page cache; then advice in
//! plain words computed from those numbers. Every part that cannot be measured here (no driver,
//! no sysfs, O_DIRECT refused) is reported as such, and the rest still runs.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use pinfeed::{DeviceSpec, PinMethod, DEFAULT_PINNED_BUDGET};
use pinfeed_cuda::{
    numa, CUdevice_attribute, Context, CudaError, DevicePool, Event, PinnedMemory, Registration,
    Stream,
};
use serde::Serialize;

use crate::Outcome;

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
    file: Option<FileReport>,
    advice: Vec<String>,
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
            let mut facts = gpu_facts(&ctx);
            match measure_gpu(&ctx, &mut facts) {
                Ok(copies) => report.gpu_copies = Some(copies),
                Err(e) => report.gpu_copies_error = Some(crate::one_line(&e)),
            }
            report.gpu = Some(facts);
        }
        Err(why) => report.gpu_unavailable = Some(why),
    }
    report.host_copies = measure_host(report.host.mem_available_bytes);
    if let (Some(path), Some(file)) = (&args.path, &file) {
        report.file = Some(measure_file(path, file)?);
    }
    report.advice = advise(&report);

    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render(&report, args.path.as_deref()));
    }
    Ok(Outcome::Ok)
}

fn open_dataset(path: &Path) -> Result<File> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file: doctor measures reading a dataset file",
            path.display()
        );
    }
    Ok(file)
}

/// The context to examine, or one line saying why there is none.
fn open_gpu(device: DeviceSpec) -> std::result::Result<Arc<Context>, String> {
    let ordinal = match device {
        DeviceSpec::Cpu => return Err("not examined (--device cpu)".into()),
        DeviceSpec::Cuda(n) => n,
        DeviceSpec::Auto => 0,
    };
    let describe = |e: CudaError| match e {
        // The library's list of every name it tried is noise here.
        CudaError::NoDriver { tried, .. } if !tried.is_empty() => {
            "no CUDA driver: libcuda.so.1 could not be loaded (install the NVIDIA driver, or put \
             its libcuda.so.1 on LD_LIBRARY_PATH)"
                .to_owned()
        }
        CudaError::NoDriver { detail, .. } => format!("no CUDA driver: {detail}"),
        other => format!("CUDA unusable: {other}"),
    };
    match pinfeed_cuda::probe() {
        Err(e) => return Err(describe(e)),
        Ok(0) => {
            let version = pinfeed_cuda::driver_version()
                .map(|v| format!(" (CUDA {})", cuda_version(v)))
                .unwrap_or_default();
            return Err(format!("a CUDA driver{version} but no CUDA device"));
        }
        Ok(_) => {}
    }
    Context::new(ordinal).map_err(describe)
}

// ------------------------------------------------------------------------------------------
// Host facts
// ------------------------------------------------------------------------------------------

fn host_facts() -> Host {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (memlock_bytes, memlock_unlimited) = memlock_limit();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Host {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total_bytes: meminfo_bytes(&meminfo, "MemTotal"),
        mem_available_bytes: meminfo_bytes(&meminfo, "MemAvailable"),
        memlock_bytes,
        memlock_unlimited,
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        cap_ipc_lock: has_capability(&status, CAP_IPC_LOCK),
        transparent_hugepages: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")
            .and_then(|s| bracketed(&s).map(str::to_owned)),
        numa_nodes: numa::online_node_count(),
    }
}

/// `(soft limit, unlimited)`; `(None, false)` when getrlimit fails.
fn memlock_limit() -> (Option<u64>, bool) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for one rlimit; RLIMIT_MEMLOCK is always accepted.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return (None, false);
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        (None, true)
    } else {
        // rlim_t is narrower than u64 on some targets.
        #[allow(clippy::unnecessary_cast)]
        let soft = limit.rlim_cur as u64;
        (Some(soft), false)
    }
}

const CAP_IPC_LOCK: u32 = 14;

/// Whether the `CapEff:` mask of a /proc/PID/status text has capability `bit`.
fn has_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << bit) != 0)
}

/// A `Name:   123 kB` line of /proc/meminfo, in bytes.
fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.split(':').next() == Some(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The selected word of a sysfs choice list (`always [madvise] never` gives `madvise`).
fn bracketed(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

// ------------------------------------------------------------------------------------------
// GPU facts
// ------------------------------------------------------------------------------------------

/// `13000` as `13.0`, `12080` as `12.8`.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The PCIe generation of a sysfs link speed (`16.0 GT/s PCIe`, or `8 GT/s` on old kernels).
fn pcie_gen(speed: &str) -> Option<u32> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let gens = [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
        (128.0, 7),
    ];
    gens.iter()
        .find(|(rate, _)| (gts - rate).abs() < 0.01)
        .map(|&(_, gen)| gen)
}

/// What a link moves per direction, in GB/s, before packet overhead: the encoding is 8b/10b up
/// to Gen2, 128b/130b for Gen3 to Gen5, and (roughly) 242 of 256 bytes a flit from Gen6.
fn link_gbps(gen: u32, width: u32) -> Option<f64> {
    let per_lane = match gen {
        1 => 2.5 * 0.8,
        2 => 5.0 * 0.8,
        3 => 8.0 * 128.0 / 130.0,
        4 => 16.0 * 128.0 / 130.0,
        5 => 32.0 * 128.0 / 130.0,
        6 => 64.0 * 242.0 / 256.0,
        7 => 128.0 * 242.0 / 256.0,
        _ => return None,
    };
    Some(per_lane / 8.0 * f64::from(width))
}

fn link_state(dir: &Path, prefix: &str) -> LinkState {
    let speed = read_trimmed(dir.join(format!("{prefix}_link_speed")));
    LinkState {
        gen: speed.as_deref().and_then(pcie_gen),
        speed,
        width: read_trimmed(dir.join(format!("{prefix}_link_width"))).and_then(|w| w.parse().ok()),
    }
}

/// Everything about the device that does not need a measurement. Any fact the driver or sysfs
/// will not give is left out, not fatal.
fn gpu_facts(ctx: &Arc<Context>) -> GpuFacts {
    let attr = |a| ctx.attribute(a).ok();
    let cc = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).zip(attr(
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    ));
    let mem = ctx.mem_info().ok();
    let pci_bus_id = ctx.pci_bus_id().ok();
    let sysfs = pci_bus_id.as_deref().and_then(numa::pci_device_dir);
    let (link, numa_node, numa_cpus) = match &sysfs {
        Some(dir) => (
            Link {
                sysfs: Some(dir.display().to_string()),
                current: link_state(dir, "current"),
                max: link_state(dir, "max"),
                under_load: None,
            },
            numa::device_numa_node(dir),
            read_trimmed(dir.join("local_cpulist")),
        ),
        None => (Link::default(), None, None),
    };
    GpuFacts {
        ordinal: ctx.ordinal(),
        name: ctx.name().unwrap_or_else(|_| "unknown".into()),
        cuda_version: pinfeed_cuda::driver_version().ok().map(cuda_version),
        kernel_driver: read_trimmed("/sys/module/nvidia/version"),
        compute_capability: cc.map(|(major, minor)| format!("{major}.{minor}")),
        memory_total_bytes: mem.map(|(_, total)| total as u64),
        memory_free_bytes: mem.map(|(free, _)| free as u64),
        pci_bus_id,
        copy_engines: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
        link,
        numa_node,
        numa_cpus,
    }
}

// ------------------------------------------------------------------------------------------
// GPU measurements
// ------------------------------------------------------------------------------------------

/// Times single host-to-device copies, with timing events when the driver has them.
struct CopyTimer {
    start: Event,
    end: Event,
    events: bool,
}

impl CopyTimer {
    fn new(ctx: &Arc<Context>) -> Result<CopyTimer> {
        Ok(CopyTimer {
            start: Event::new_timing(ctx)?,
            end: Event::new_timing(ctx)?,
            events: true,
        })
    }

    /// Milliseconds one copy of `len` bytes from `src` to `dst` takes.
    ///
    /// # Safety
    /// `src` must be readable and `dst` a device allocation writable for `len` bytes.
    unsafe fn once(
        &mut self,
        stream: &Stream,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<f64> {
        if self.events {
            self.start.record(stream)?;
            // SAFETY: valid ranges by this function's contract; the copy completes before we
            // return (the end event is waited for).
            unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, len, stream)? };
            self.end.record(stream)?;
            self.end.synchronize()?;
            match Event::elapsed_ms(&self.start, &self.end) {
                Ok(ms) => return Ok(f64::from(ms)),
                // An older driver: time on the wall clock from now on.
                Err(CudaError::Unsupported { .. }) => self.events = false,
                Err(e) => return Err(e.into()),
            }
        }
        let t = Instant::now();
        // SAFETY: as above; the stream is synchronised before we return.
        unsafe { pinfeed_cuda::memcpy_htod_async(dst, src, len, stream)? };
        stream.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// The median of `reps` copies, after one that warms up.
    ///
    /// # Safety
    /// As [`CopyTimer::once`].
    unsafe fn median(
        &mut self,
        stream: &Stream,
        dst: u64,
        src: *const u8,
        len: usize,
        reps: usize,
    ) -> Result<f64> {
        // SAFETY: forwarded contract.
        unsafe { self.once(stream, dst, src, len)? };
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            // SAFETY: forwarded contract.
            times.push(unsafe { self.once(stream, dst, src, len)? });
        }
        Ok(median(times))
    }
}

fn reps_for(bytes: usize) -> usize {
    if bytes >= BIG {
        5
    } else if bytes >= 16 << 20 {
        10
    } else {
        20
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The median milliseconds of `reps` runs of `f`.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                ms_since(t)
            })
            .collect(),
    )
}

/// The copy rates and the page-locking costs; about a second on a PCIe Gen5 GPU. Also reads the
/// link state while copies run (into `facts`).
fn measure_gpu(ctx: &Arc<Context>, facts: &mut GpuFacts) -> Result<GpuCopies> {
    let stream = Stream::new(ctx)?;
    let pool = DevicePool::new(ctx)?;
    let dst = pool.alloc_async(BIG, &stream)?;
    stream.synchronize()?;

    let t = Instant::now();
    let pinned = PinnedMemory::alloc(ctx, BIG, PinMethod::HostAlloc)?;
    let host_alloc_256mib_ms = ms_since(t);
    // SAFETY: `pinned` holds BIG bytes and nothing else uses it yet.
    unsafe { std::ptr::write_bytes(pinned.as_ptr(), 1, BIG) };
    // Filled, so its pages are real and not the shared zero page.
    let pageable = vec![1u8; BIG];

    let buffers = Buffers {
        stream: &stream,
        dst: dst.ptr(),
        pinned: pinned.as_ptr(),
        pageable: pageable.as_ptr(),
    };
    let result = measure_copies(ctx, &buffers, facts, host_alloc_256mib_ms);
    // A failure may leave copies queued that still read the buffers: wait before they drop.
    let _ = stream.synchronize();
    result
}

/// The three buffers of [`measure_gpu`], each BIG bytes, and the stream that copies between them.
struct Buffers<'a> {
    stream: &'a Stream,
    dst: u64,
    pinned: *const u8,
    pageable: *const u8,
}

fn measure_copies(
    ctx: &Arc<Context>,
    b: &Buffers<'_>,
    facts: &mut GpuFacts,
    host_alloc_256mib_ms: f64,
) -> Result<GpuCopies> {
    let stream = b.stream;
    let mut timer = CopyTimer::new(ctx)?;
    let mut rates = |src: *const u8| -> Result<Vec<Rate>> {
        COPY_SIZES
            .iter()
            .map(|&len| {
                // SAFETY: `src` and `b.dst` hold BIG bytes each and outlive this function
                // (`Buffers`); `len <= BIG`; each copy is waited for.
                let ms = unsafe { timer.median(stream, b.dst, src, len, reps_for(len))? };
                Ok(Rate::new(len, ms))
            })
            .collect()
    };
    let pinned_rates = rates(b.pinned)?;
    let pageable_rates = rates(b.pageable)?;

    // The link state under load: queue a few hundred milliseconds of copies at most, read sysfs
    // while they run.
    if let Some(dir) = facts.link.sysfs.clone() {
        for _ in 0..8 {
            // SAFETY: both buffers hold BIG bytes and outlive the copies (`measure_gpu`
            // synchronises the stream before they drop).
            unsafe { pinfeed_cuda::memcpy_htod_async(b.dst, b.pinned, BIG, stream)? };
        }
        std::thread::sleep(Duration::from_millis(5));
        facts.link.under_load = Some(link_state(Path::new(&dir), "current"));
        stream.synchronize()?;
    }

    // One batch: fresh page-locked memory (what pin_memory() does for each batch) against
    // registering memory that already exists, against copying it.
    let mut alloc = Vec::new();
    let mut free = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let memory = PinnedMemory::alloc(ctx, BATCH_BYTES, PinMethod::HostAlloc)?;
        alloc.push(ms_since(t));
        let t = Instant::now();
        drop(memory);
        free.push(ms_since(t));
    }
    let mut buffer = Mapping::new(BATCH_BYTES).context("mmap of a batch buffer")?;
    buffer.as_mut_slice().fill(1);
    let mut register = Vec::new();
    let mut unregister = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        // SAFETY: the mapping is ours, read-write, and outlives the registration, which no copy
        // uses.
        let registration = unsafe {
            Registration::new(ctx, buffer.as_mut_slice().as_mut_ptr(), BATCH_BYTES, false)?
        };
        register.push(ms_since(t));
        let t = Instant::now();
        drop(registration);
        unregister.push(ms_since(t));
    }
    // SAFETY: as for the rates above; BATCH_BYTES <= BIG.
    let pinned_copy_ms = unsafe { timer.median(stream, b.dst, b.pinned, BATCH_BYTES, 20)? };
    // SAFETY: as above.
    let pageable_copy_ms = unsafe { timer.median(stream, b.dst, b.pageable, BATCH_BYTES, 20)? };

    Ok(GpuCopies {
        timing: if timer.events { "events" } else { "wall" },
        pinned: pinned_rates,
        pageable: pageable_rates,
        host_alloc_256mib_ms,
        batch: BatchCost {
            bytes: BATCH_BYTES,
            host_alloc_ms: median(alloc),
            free_host_ms: median(free),
            register_ms: median(register),
            unregister_ms: median(unregister),
            pinned_copy_ms,
            pageable_copy_ms,
        },
    })
}

// ------------------------------------------------------------------------------------------
// Host measurements
// ------------------------------------------------------------------------------------------

/// An anonymous private mapping: page-aligned, as O_DIRECT and `mlock` want it.
struct Mapping {
    /// Invariant: `len` bytes at `ptr` are mapped read-write until Drop, and only this value
    /// hands out references into them.
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous private mapping aliases nothing; failure is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: mapped read-write for `len` bytes (field invariant); `&mut self` makes this
        // the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped, once; no reference outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Fresh mapping + `mlock` of `len` bytes, then `munlock` + `munmap`: `(lock ms, unlock ms)`.
fn mlock_once(len: usize) -> io::Result<(f64, f64)> {
    let t = Instant::now();
    let mapping = Mapping::new(len)?;
    // SAFETY: the range is the mapping just made.
    if unsafe { libc::mlock(mapping.ptr.cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let lock = ms_since(t);
    let t = Instant::now();
    // SAFETY: unlocking what we locked; the mapping is unmapped right after.
    unsafe { libc::munlock(mapping.ptr.cast(), len) };
    drop(mapping);
    Ok((lock, ms_since(t)))
}

/// memcpy rates on one and on all cores, a batch's memcpy and `mlock` costs; well under a second.
fn measure_host(available: Option<u64>) -> HostCopies {
    // Source and destination must fit with room to spare.
    let mut bytes = BIG;
    if let Some(available) = available {
        while bytes > (1 << 20) && (bytes as u64) * 4 > available {
            bytes /= 2;
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let src = vec![1u8; bytes];
    let mut dst = vec![2u8; bytes];

    let one = median_ms(3, || dst.copy_from_slice(&src));
    let chunk = bytes.div_ceil(threads);
    let all = median_ms(3, || {
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        })
    });
    let batch = BATCH_BYTES.min(bytes);
    let batch_memcpy_ms = median_ms(21, || dst[..batch].copy_from_slice(&src[..batch]));

    let mut report = HostCopies {
        bytes,
        threads,
        memcpy_1_thread_gbps: Rate::new(bytes, one).gbps,
        memcpy_all_threads_gbps: Rate::new(bytes, all).gbps,
        batch_bytes: batch,
        batch_memcpy_ms,
        ..HostCopies::default()
    };
    let mut lock = Vec::new();
    let mut unlock = Vec::new();
    for _ in 0..5 {
        match mlock_once(BATCH_BYTES) {
            Ok((l, u)) => {
                lock.push(l);
                unlock.push(u);
            }
            Err(e) => {
                report.mlock_error = Some(e.to_string());
                return report;
            }
        }
    }
    report.batch_mlock_ms = Some(median(lock));
    report.batch_munlock_ms = Some(median(unlock));
    report
}

// ------------------------------------------------------------------------------------------
// The file
// ------------------------------------------------------------------------------------------

/// The fraction of `offset .. offset + len` of `file` in the page cache (`mincore` over a
/// read-only mapping, 1 GiB at a time).
fn cached_fraction(file: &File, offset: u64, len: u64) -> io::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let start = offset / page * page;
    let end = offset + len;
    if end <= start {
        return Ok(1.0);
    }
    const WINDOW: u64 = 1 << 30;
    let mut vec = vec![0u8; (WINDOW / page) as usize];
    let (mut resident, mut total) = (0u64, 0u64);
    let mut at = start;
    while at < end {
        let window = (end - at).min(WINDOW) as usize;
        // SAFETY: a read-only shared mapping of an open file aliases no Rust memory; failure is
        // checked below. The mapping is never read, only passed to mincore.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                window,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                at as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let pages = window.div_ceil(page as usize);
        // SAFETY: `ptr .. ptr + window` is the mapping just made (page-aligned); `vec` holds at
        // least one byte for each of its pages.
        let status = unsafe { libc::mincore(ptr, window, vec.as_mut_ptr()) };
        let error = io::Error::last_os_error();
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(ptr, window) };
        if status != 0 {
            return Err(error);
        }
        resident += vec[..pages].iter().filter(|&&b| b & 1 != 0).count() as u64;
        total += pages as u64;
        at += window as u64;
    }
    Ok(resident as f64 / total.max(1) as f64)
}

/// Sequential `pread`s of `buf.len()` bytes from offset 0, up to `limit` bytes or
/// [`READ_TIME_CAP`].
fn read_pass(
    file: &File,
    buf: &mut [u8],
    limit: u64,
    cached_before: Option<f64>,
) -> io::Result<ReadRate> {
    let t = Instant::now();
    let mut offset = 0u64;
    while offset < limit && t.elapsed() < READ_TIME_CAP {
        let n = file.read_at(buf, offset)?;
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(ReadRate {
        bytes: offset,
        seconds,
        gbps: offset as f64 / seconds.max(1e-9) / 1e9,
        cached_before,
    })
}

/// Size, page-cache residency, the disk's rate (O_DIRECT, which the cache does not serve) and the
/// buffered rate, cold as found and again once cached. At most three passes of [`READ_TIME_CAP`].
fn measure_file(path: &Path, file: &File) -> Result<FileReport> {
    let size = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut report = FileReport {
        path: path.display().to_string(),
        size_bytes: size,
        ..FileReport::default()
    };
    if size == 0 {
        return Ok(report);
    }
    report.cached_fraction = cached_fraction(file, 0, size).ok();

    // O_DIRECT first: it neither fills nor empties the page cache, so the buffered pass after
    // still sees the cache as it was.
    let direct_len = size.min(DIRECT_LIMIT);
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Err(e) => report.direct_refused = Some(format!("O_DIRECT open refused: {e}")),
        Ok(direct) => {
            let mut buf = Mapping::new(4 << 20).context("mmap of a read buffer")?;
            match read_pass(&direct, buf.as_mut_slice(), direct_len, None) {
                Ok(rate) => report.direct = Some(rate),
                Err(e) => report.direct_refused = Some(format!("O_DIRECT read refused: {e}")),
            }
        }
    }

    let buffered_len = size.min(BUFFERED_LIMIT);
    let mut buf = vec![0u8; 8 << 20];
    let before = cached_fraction(file, 0, buffered_len).ok();
    let first = read_pass(file, &mut buf, buffered_len, before)
        .with_context(|| format!("cannot read {}", path.display()))?;
    report.buffered = Some(first);
    let after = cached_fraction(file, 0, first.bytes).unwrap_or(0.0);
    if before.is_some_and(|b| b >= 0.99) {
        report.buffered_again_skipped = Some("already cached before the first pass".into());
    } else if after < 0.9 {
        report.buffered_again_skipped = Some(format!(
            "the page cache kept only {:.0}% of what was read",
            after * 100.0
        ));
    } else {
        report.buffered_again = Some(
            read_pass(file, &mut buf, first.bytes, Some(after))
                .with_context(|| format!("cannot read {}", path.display()))?,
        );
    }
    Ok(report)
}

// ------------------------------------------------------------------------------------------
// Advice
// ------------------------------------------------------------------------------------------

fn ms(x: f64) -> String {
    if x < 0.01 {
        format!("{:.1} µs", x * 1e3)
    } else if x >= 100.0 {
        format!("{x:.0} ms")
    } else if x >= 10.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.2} ms")
    }
}

fn times(ratio: f64) -> String {
    if ratio >= 10.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.1}x")
    }
}

fn mb(bytes: usize) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// `8 MiB`, `125.0 GiB`: binary units for memory sizes and limits.
fn binary(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// What page-locking each batch costs against copying it (pin_memory() per batch vs pinfeed).
fn pin_advice(lock_ms: f64, copy_ms: f64, bytes: usize, how: &str, copy: &str) -> String {
    format!(
        "page-locking a {} batch costs {} here ({how}), what pin_memory() does for every batch; \
         {copy} takes {}: {} longer. pinfeed page-locks once.",
        mb(bytes),
        ms(lock_ms),
        ms(copy_ms),
        times(lock_ms / copy_ms.max(1e-9)),
    )
}

/// Registering existing memory against allocating page-locked memory.
fn register_advice(register_ms: f64, host_alloc_ms: f64, bytes: usize) -> String {
    if register_ms < host_alloc_ms {
        format!(
            "registering {} of memory that already exists and unregistering it costs {}, {} \
             less than cuMemHostAlloc and cuMemFreeHost's {}: pinfeed's default --pin-method \
             register is the right one here.",
            mb(bytes),
            ms(register_ms),
            times(host_alloc_ms / register_ms.max(1e-9)),
            ms(host_alloc_ms),
        )
    } else {
        format!(
            "cuMemHostAlloc and cuMemFreeHost of {} ({}) are no slower than registering and \
             unregistering it ({}) here: --pin-method hostalloc costs nothing extra.",
            mb(bytes),
            ms(host_alloc_ms),
            ms(register_ms),
        )
    }
}

fn copy_advice(pageable_gbps: f64, pinned_gbps: f64) -> String {
    if pinned_gbps > pageable_gbps * 1.2 {
        format!(
            "pageable copies run at {pageable_gbps:.1} GB/s, pinned at {pinned_gbps:.1} GB/s \
             (256 MiB copies): feeding the GPU from pinned memory is {} faster.",
            times(pinned_gbps / pageable_gbps.max(1e-9)),
        )
    } else {
        format!(
            "pageable copies run at {pageable_gbps:.1} GB/s, pinned at {pinned_gbps:.1} GB/s \
             (256 MiB copies): pinned memory buys little on this machine.",
        )
    }
}

/// `None` when the limit does not get in the way.
fn memlock_advice(limit: Option<u64>, unlimited: bool, can_exceed: bool) -> Option<String> {
    let limit = limit?;
    if unlimited || can_exceed || limit >= DEFAULT_PINNED_BUDGET as u64 {
        return None;
    }
    Some(format!(
        "the memory-lock limit (RLIMIT_MEMLOCK) is {}, below pinfeed's default pinned budget of \
         {}: raise it with ulimit -l or pinfeed falls back to unlocked memory on the host backend.",
        binary(limit),
        binary(DEFAULT_PINNED_BUDGET as u64),
    ))
}

/// The link as it runs against what it could do, and the copy rate against the link.
fn link_advice(link: &Link, pinned_gbps: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    let (running, when) = match &link.under_load {
        Some(state) => (state, "during copies"),
        None => (&link.current, "at rest"),
    };
    if let (Some(g), Some(w), Some(mg), Some(mw)) =
        (running.gen, running.width, link.max.gen, link.max.width)
    {
        if g < mg || w < mw {
            let idle = if link.under_load.is_none() {
                " (GPUs slow an idle link down to save power; a busy one should train up)"
            } else {
                ": check the slot, riser or BIOS setting, since the GPU's copies are held to the slower link"
            };
            out.push(format!(
                "the GPU's PCIe link runs at Gen{g} x{w} {when}, below the Gen{mg} x{mw} it supports{idle}."
            ));
        }
        if let (Some(pinned), Some(line)) = (pinned_gbps, link_gbps(g, w)) {
            if link.under_load.is_some() && pinned < 0.6 * line {
                out.push(format!(
                    "pinned copies reach {pinned:.1} GB/s of the {line:.1} GB/s a Gen{g} x{w} link \
                     carries: something else shares the link, or the IOMMU or a virtual machine \
                     slows DMA down."
                ));
            }
        }
    }
    out
}

fn numa_advice(nodes: Option<usize>, gpu_node: Option<u32>, cpus: Option<&str>) -> Option<String> {
    let nodes = nodes?;
    let node = gpu_node?;
    if nodes < 2 {
        return None;
    }
    let cpus = cpus.map(|c| format!(" (CPUs {c})")).unwrap_or_default();
    Some(format!(
        "this machine has {nodes} NUMA nodes and the GPU hangs off node {node}{cpus}: run under \
         `numactl --cpunodebind={node} --membind={node}` so the pinned pool and the reader \
         threads sit beside it."
    ))
}

/// What the file's rates say. `disk` is the rate from disk (O_DIRECT, or a cold buffered pass),
/// `cached` from the page cache; `gpu_gbps` the pinned copy rate when there is a GPU.
fn disk_advice(
    size: u64,
    disk: Option<f64>,
    cached: Option<f64>,
    mem_available: Option<u64>,
    gpu_gbps: Option<f64>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(d), Some(c)) = (disk, cached) {
        if d < 0.5 * c {
            out.push(format!(
                "your file reads at {d:.1} GB/s from disk but {c:.1} GB/s when cached: the disk \
                 is the bottleneck for cold epochs."
            ));
        } else {
            out.push(format!(
                "your file reads at {d:.1} GB/s from disk and {c:.1} GB/s when cached: the disk \
                 keeps up with the page cache."
            ));
        }
    }
    if let (Some(d), Some(g)) = (disk, gpu_gbps) {
        if d < g {
            out.push(format!(
                "from disk the file feeds at most {d:.1} GB/s, against {g:.1} GB/s the GPU takes \
                 from pinned memory."
            ));
        }
    }
    if let Some(available) = mem_available {
        if size <= available {
            if let Some(c) = cached {
                out.push(format!(
                    "the whole file ({}) fits in the page cache ({} available): epochs after the \
                     first can read it at {c:.1} GB/s.",
                    binary(size),
                    binary(available),
                ));
            }
        } else if let Some(d) = disk {
            out.push(format!(
                "the file ({}) is larger than available memory ({}): every epoch reads it from \
                 disk, at {d:.1} GB/s.",
                binary(size),
                binary(available),
            ));
        }
    }
    out
}

/// One buffered reader of the uncached file against O_DIRECT. `None` unless it falls well short.
fn buffered_advice(cold_buffered: f64, direct: f64) -> Option<String> {
    (cold_buffered < 0.5 * direct).then(|| {
        format!(
            "one thread reading the uncached file through the page cache got {cold_buffered:.1} \
             GB/s, against {direct:.1} GB/s with O_DIRECT: the disk gives more than one buffered \
             reader takes; more reader threads (--threads) may get closer to it."
        )
    })
}

fn meaningful(rate: Option<ReadRate>) -> Option<ReadRate> {
    rate.filter(|r| r.bytes >= MEANINGFUL_READ)
}

fn advise(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &r.gpu_copies {
        let b = &c.batch;
        out.push(pin_advice(
            b.host_alloc_ms + b.free_host_ms,
            b.pinned_copy_ms,
            b.bytes,
            "cuMemHostAlloc and cuMemFreeHost",
            "copying it to the GPU from pinned memory",
        ));
        out.push(register_advice(
            b.register_ms + b.unregister_ms,
            b.host_alloc_ms + b.free_host_ms,
            b.bytes,
        ));
        if let (Some(pageable), Some(pinned)) = (c.pageable.last(), c.pinned.last()) {
            out.push(copy_advice(pageable.gbps, pinned.gbps));
        }
    } else if let (Some(lock), Some(unlock)) =
        (r.host_copies.batch_mlock_ms, r.host_copies.batch_munlock_ms)
    {
        out.push(pin_advice(
            lock + unlock,
            r.host_copies.batch_memcpy_ms,
            r.host_copies.batch_bytes,
            "mmap, mlock, munlock and munmap, on the host backend",
            "copying it in memory",
        ));
    }
    let pinned_gbps = r
        .gpu_copies
        .as_ref()
        .and_then(|c| c.pinned.last())
        .map(|p| p.gbps);
    if let Some(gpu) = &r.gpu {
        out.extend(link_advice(&gpu.link, pinned_gbps));
        out.extend(numa_advice(
            r.host.numa_nodes,
            gpu.numa_node,
            gpu.numa_cpus.as_deref(),
        ));
    }
    out.extend(memlock_advice(
        r.host.memlock_bytes,
        r.host.memlock_unlimited,
        r.host.cap_ipc_lock,
    ));
    if let Some(f) = &r.file {
        let disk = meaningful(f.direct)
            .or(meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c < 0.1)))
            .map(|d| d.gbps);
        let cached = meaningful(f.buffered_again)
            .or(meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c >= 0.99)))
            .map(|c| c.gbps);
        let cold = meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c < 0.1));
        if let (Some(cold), Some(direct)) = (cold, meaningful(f.direct)) {
            out.extend(buffered_advice(cold.gbps, direct.gbps));
        }
        out.extend(disk_advice(
            f.size_bytes,
            disk,
            cached,
            r.host.mem_available_bytes,
            pinned_gbps,
        ));
    }
    out
}

// ------------------------------------------------------------------------------------------
// Text output
// ------------------------------------------------------------------------------------------

fn opt<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "unknown".into(), show)
}

fn link_text(state: &LinkState) -> String {
    match (state.gen, state.width, &state.speed) {
        (Some(g), Some(w), _) => format!("Gen{g} x{w}"),
        (None, Some(w), Some(s)) => format!("{s} x{w}"),
        (_, None, Some(s)) => s.clone(),
        _ => "unknown".into(),
    }
}

/// One `  label   value` line, values in one column.
fn line(s: &mut String, label: &str, value: impl std::fmt::Display) {
    s.push_str(&format!("  {label:<28}{value}\n"));
}

fn render(r: &Report, path: Option<&Path>) -> String {
    let mut s = String::new();
    let h = &r.host;
    s.push_str("host\n");
    line(&mut s, "CPUs", h.cpus);
    line(
        &mut s,
        "memory",
        format!(
            "{} total, {} available",
            opt(h.mem_total_bytes, binary),
            opt(h.mem_available_bytes, binary)
        ),
    );
    let who = match (h.root, h.cap_ipc_lock) {
        (true, true) => ", running as root",
        (false, true) => ", with CAP_IPC_LOCK",
        (true, false) => ", root without CAP_IPC_LOCK",
        (false, false) => "",
    };
    let limit = if h.memlock_unlimited {
        "unlimited".to_owned()
    } else {
        opt(h.memlock_bytes, binary)
    };
    line(&mut s, "memory-lock limit", format!("{limit}{who}"));
    line(
        &mut s,
        "transparent hugepages",
        h.transparent_hugepages.as_deref().unwrap_or("unknown"),
    );
    line(&mut s, "NUMA nodes", opt(h.numa_nodes, |n| n.to_string()));

    s.push_str("gpu\n");
    if let Some(why) = &r.gpu_unavailable {
        s.push_str(&format!("  {why}\n"));
    }
    if let Some(g) = &r.gpu {
        line(
            &mut s,
            "device",
            format!(
                "cuda:{} {} (compute capability {})",
                g.ordinal,
                g.name,
                g.compute_capability.as_deref().unwrap_or("unknown")
            ),
        );
        line(
            &mut s,
            "driver",
            format!(
                "{} (CUDA {})",
                g.kernel_driver.as_deref().unwrap_or("unknown"),
                g.cuda_version.as_deref().unwrap_or("unknown")
            ),
        );
        line(
            &mut s,
            "memory",
            format!(
                "{} total, {} free",
                opt(g.memory_total_bytes, binary),
                opt(g.memory_free_bytes, binary)
            ),
        );
        line(
            &mut s,
            "PCI bus id",
            format!(
                "{}, {} copy engines",
                g.pci_bus_id.as_deref().unwrap_or("unknown"),
                opt(g.copy_engines, |n| n.to_string())
            ),
        );
        let link = if g.link.sysfs.is_some() {
            let load = g
                .link
                .under_load
                .as_ref()
                .map(|l| format!(", {} during copies", link_text(l)))
                .unwrap_or_default();
            format!(
                "{} at rest{load}, {} at most",
                link_text(&g.link.current),
                link_text(&g.link.max)
            )
        } else {
            "unknown (no sysfs entry for the device)".to_owned()
        };
        line(&mut s, "PCIe link", link);
        let node = match (g.numa_node, &g.link.sysfs) {
            (Some(n), _) => n.to_string(),
            (None, Some(_)) => "none reported".to_owned(),
            (None, None) => "unknown".to_owned(),
        };
        let cpus = g
            .numa_cpus
            .as_deref()
            .map(|c| format!(" (local CPUs {c})"))
            .unwrap_or_default();
        line(&mut s, "NUMA node", format!("{node}{cpus}"));
    }

    s.push_str("measurements\n");
    if let Some(e) = &r.gpu_copies_error {
        line(&mut s, "GPU measurements", format!("failed: {e}"));
    }
    if let Some(c) = &r.gpu_copies {
        let row = |rates: &[Rate]| {
            rates
                .iter()
                .map(|r| format!("{} {:.1} GB/s", binary(r.bytes as u64), r.gbps))
                .collect::<Vec<_>>()
                .join(", ")
        };
        line(&mut s, "to GPU from pinned", row(&c.pinned));
        line(&mut s, "to GPU from pageable", row(&c.pageable));
        let b = &c.batch;
        let batch = format!("one {} batch", mb(b.bytes));
        line(
            &mut s,
            &batch,
            format!(
                "cuMemHostAlloc {} + cuMemFreeHost {}; cuMemHostRegister {} + unregister {}",
                ms(b.host_alloc_ms),
                ms(b.free_host_ms),
                ms(b.register_ms),
                ms(b.unregister_ms),
            ),
        );
        line(
            &mut s,
            "",
            format!(
                "copy to GPU {} from pinned, {} from pageable",
                ms(b.pinned_copy_ms),
                ms(b.pageable_copy_ms)
            ),
        );
        line(
            &mut s,
            "cuMemHostAlloc of 256 MiB",
            format!(
                "{} (copies timed with {})",
                ms(c.host_alloc_256mib_ms),
                if c.timing == "events" {
                    "CUDA events"
                } else {
                    "the wall clock"
                }
            ),
        );
    }
    let hc = &r.host_copies;
    line(
        &mut s,
        "host memcpy",
        format!(
            "{:.1} GB/s on 1 thread, {:.1} GB/s on {} ({} copies)",
            hc.memcpy_1_thread_gbps,
            hc.memcpy_all_threads_gbps,
            hc.threads,
            binary(hc.bytes as u64)
        ),
    );
    let batch = format!("mlock of one {} batch", mb(BATCH_BYTES));
    match (&hc.mlock_error, hc.batch_mlock_ms, hc.batch_munlock_ms) {
        (Some(e), _, _) => line(&mut s, &batch, format!("refused: {e}")),
        (None, Some(l), Some(u)) => line(
            &mut s,
            &batch,
            format!(
                "{} with a fresh mapping, munlock {}; memcpy of it {}",
                ms(l),
                ms(u),
                ms(hc.batch_memcpy_ms)
            ),
        ),
        _ => {}
    }

    if let Some(f) = &r.file {
        let name = path.map_or_else(|| f.path.clone(), |p| p.display().to_string());
        s.push_str(&format!("file {name}\n"));
        let cached = f
            .cached_fraction
            .map(|c| format!(", {:.0}% in the page cache", c * 100.0))
            .unwrap_or_default();
        line(&mut s, "size", format!("{}{cached}", binary(f.size_bytes)));
        let rate = |r: &ReadRate| {
            format!(
                "{:.2} GB/s ({} in {})",
                r.gbps,
                binary(r.bytes),
                ms(r.seconds * 1e3)
            )
        };
        if let Some(b) = &f.buffered {
            let state = match b.cached_before {
                None => "cache state unknown".to_owned(),
                Some(c) if c >= 0.99 => "cached".to_owned(),
                Some(c) if c < 0.01 => "not cached".to_owned(),
                Some(c) => format!("{:.0}% cached", c * 100.0),
            };
            line(&mut s, "buffered read", format!("{} ({state})", rate(b)));
        }
        if let Some(b) = &f.buffered_again {
            line(
                &mut s,
                "buffered read again",
                format!("{} (cached)", rate(b)),
            );
        } else if let Some(why) = &f.buffered_again_skipped {
            line(&mut s, "buffered read again", format!("skipped: {why}"));
        }
        if let Some(d) = &f.direct {
            line(&mut s, "O_DIRECT read", format!("{} (from disk)", rate(d)));
        } else if let Some(why) = &f.direct_refused {
            line(&mut s, "O_DIRECT read", why);
        }
        if f.buffered.is_some_and(|b| b.bytes < MEANINGFUL_READ) {
            line(
                &mut s,
                "",
                format!(
                    "(under {} read: these rates are mostly timer noise)",
                    binary(MEANINGFUL_READ)
                ),
            );
        }
    }

    if !r.advice.is_empty() {
        s.push_str("advice\n");
        for a in &r.advice {
            s.push_str(&format!("  - {a}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds_give_generations() {
        assert_eq!(pcie_gen("32.0 GT/s PCIe"), Some(5));
        assert_eq!(pcie_gen("16.0 GT/s PCIe"), Some(4));
        assert_eq!(pcie_gen("8 GT/s"), Some(3));
        assert_eq!(pcie_gen("2.5 GT/s PCIe"), Some(1));
        assert_eq!(pcie_gen("Unknown"), None);
        assert_eq!(pcie_gen(""), None);
        let gen5 = link_gbps(5, 16).unwrap();
        assert!((gen5 - 63.0).abs() < 0.1, "{gen5}");
        let gen3 = link_gbps(3, 16).unwrap();
        assert!((gen3 - 15.75).abs() < 0.1, "{gen3}");
    }

    #[test]
    fn kernel_texts_parse() {
        assert_eq!(bracketed("always [madvise] never"), Some("madvise"));
        assert_eq!(bracketed("always madvise never"), None);
        let meminfo = "MemTotal:       24684084 kB\nMemFree:  1 kB\nMemAvailable:   24269648 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(24684084 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable"),
            Some(24269648 * 1024)
        );
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
        assert!(has_capability("CapEff:\t000001fffeffffff\n", CAP_IPC_LOCK));
        assert!(!has_capability("CapEff:\t00000000a80425fb\n", CAP_IPC_LOCK));
        assert!(!has_capability("", CAP_IPC_LOCK));
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12080), "12.8");
    }

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(binary(8 << 20), "8 MiB");
        assert_eq!(binary(256 << 20), "256 MiB");
        assert_eq!(binary(1536), "1.5 KiB");
        assert_eq!(binary(12), "12 B");
        assert_eq!(ms(1.764), "1.76 ms");
        assert_eq!(ms(92.04), "92.0 ms");
        assert_eq!(ms(411.2), "411 ms");
        assert_eq!(ms(0.0036), "3.6 µs");
        assert_eq!(mb(BATCH_BYTES), "2.95 MB");
    }

    #[test]
    fn pin_advice_compares_locking_with_copying() {
        let text = pin_advice(
            1.76,
            0.05,
            BATCH_BYTES,
            "cuMemHostAlloc and cuMemFreeHost",
            "copying it to the GPU from pinned memory",
        );
        assert!(
            text.starts_with("page-locking a 2.95 MB batch costs 1.76 ms here"),
            "{text}"
        );
        assert!(
            text.contains("copying it to the GPU from pinned memory takes 0.05 ms: 35x longer"),
            "{text}"
        );
        assert!(text.ends_with("pinfeed page-locks once."), "{text}");
    }

    #[test]
    fn register_and_copy_advice_pick_the_winner() {
        let text = register_advice(0.98, 2.14, BATCH_BYTES);
        assert!(
            text.contains(
                "costs 0.98 ms, 2.2x less than cuMemHostAlloc and cuMemFreeHost's 2.14 ms"
            ),
            "{text}"
        );
        assert!(text.contains("--pin-method register"), "{text}");
        assert!(register_advice(3.0, 2.0, BATCH_BYTES).contains("hostalloc"));
        let text = copy_advice(8.1, 55.2);
        assert!(
            text.starts_with("pageable copies run at 8.1 GB/s, pinned at 55.2 GB/s"),
            "{text}"
        );
        assert!(text.contains("6.8x faster"), "{text}");
        assert!(copy_advice(10.0, 10.5).contains("buys little"));
    }

    #[test]
    fn memlock_advice_only_when_it_binds() {
        let text = memlock_advice(Some(8 << 20), false, false).unwrap();
        assert!(
            text.contains("is 8 MiB, below pinfeed's default pinned budget of 256 MiB"),
            "{text}"
        );
        assert!(text.contains(
            "raise it with ulimit -l or pinfeed falls back to unlocked memory on the host backend"
        ));
        assert_eq!(memlock_advice(Some(8 << 20), false, true), None);
        assert_eq!(memlock_advice(None, true, false), None);
        assert_eq!(memlock_advice(Some(1 << 30), false, false), None);
    }

    #[test]
    fn link_advice_names_a_slow_link() {
        let state = |g, w| LinkState {
            speed: None,
            gen: Some(g),
            width: Some(w),
        };
        let mut link = Link {
            sysfs: Some("/sys/bus/pci/devices/0000:3b:00.0".into()),
            current: state(1, 16),
            max: state(5, 16),
            under_load: None,
        };
        let idle = link_advice(&link, None);
        assert_eq!(idle.len(), 1);
        assert!(
            idle[0].contains("Gen1 x16 at rest, below the Gen5 x16"),
            "{idle:?}"
        );
        assert!(idle[0].contains("idle link"), "{idle:?}");
        link.under_load = Some(state(5, 16));
        assert!(link_advice(&link, Some(55.2)).is_empty());
        let slow = link_advice(&link, Some(20.0));
        assert_eq!(slow.len(), 1);
        assert!(
            slow[0].contains("20.0 GB/s of the 63.0 GB/s a Gen5 x16 link"),
            "{slow:?}"
        );
        link.under_load = Some(state(4, 8));
        let narrow = link_advice(&link, Some(14.0));
        assert!(
            narrow[0].contains("Gen4 x8 during copies, below the Gen5 x16"),
            "{narrow:?}"
        );
    }

    #[test]
    fn numa_advice_only_with_several_nodes() {
        let text = numa_advice(Some(2), Some(1), Some("16-31")).unwrap();
        assert!(text.contains("GPU hangs off node 1 (CPUs 16-31)"), "{text}");
        assert!(
            text.contains("numactl --cpunodebind=1 --membind=1"),
            "{text}"
        );
        assert_eq!(numa_advice(Some(1), Some(0), None), None);
        assert_eq!(numa_advice(Some(2), None, None), None);
        assert_eq!(numa_advice(None, Some(1), None), None);
    }

    #[test]
    fn disk_advice_finds_the_bottleneck() {
        let gib = 1u64 << 30;
        let text = disk_advice(4 * gib, Some(1.5), Some(10.0), Some(100 * gib), Some(55.0));
        assert_eq!(
            text[0],
            "your file reads at 1.5 GB/s from disk but 10.0 GB/s when cached: the disk is the \
             bottleneck for cold epochs."
        );
        assert!(
            text[1].contains("at most 1.5 GB/s, against 55.0 GB/s"),
            "{text:?}"
        );
        assert!(text[2].contains("fits in the page cache"), "{text:?}");
        let big = disk_advice(200 * gib, Some(1.5), None, Some(100 * gib), None);
        assert_eq!(big.len(), 1);
        assert!(big[0].contains("larger than available memory"), "{big:?}");
        assert!(disk_advice(gib, None, None, Some(100 * gib), None).is_empty());
        let slow = buffered_advice(0.4, 1.7).unwrap();
        assert!(
            slow.contains("got 0.4 GB/s, against 1.7 GB/s with O_DIRECT"),
            "{slow}"
        );
        assert_eq!(buffered_advice(1.4, 1.7), None);
    }

    #[test]
    fn advice_from_a_whole_report() {
        let report = Report {
            host: Host {
                memlock_bytes: Some(8 << 20),
                ..Host::default()
            },
            gpu_copies: Some(GpuCopies {
                timing: "events",
                pinned: vec![Rate::new(BIG, 4.86)],
                pageable: vec![Rate::new(BIG, 33.1)],
                host_alloc_256mib_ms: 92.0,
                batch: BatchCost {
                    bytes: BATCH_BYTES,
                    host_alloc_ms: 1.4,
                    free_host_ms: 0.36,
                    register_ms: 0.8,
                    unregister_ms: 0.17,
                    pinned_copy_ms: 0.05,
                    pageable_copy_ms: 0.3,
                },
            }),
            ..Report::default()
        };
        let advice = advise(&report);
        assert!(advice[0].contains("costs 1.76 ms"), "{advice:?}");
        assert!(advice[0].contains("35x longer"), "{advice:?}");
        assert!(advice[1].contains("--pin-method register"), "{advice:?}");
        assert!(
            advice[2].contains("pageable copies run at 8.1 GB/s, pinned at 55.2 GB/s"),
            "{advice:?}"
        );
        assert!(advice[3].contains("ulimit -l"), "{advice:?}");
        assert_eq!(advice.len(), 4);
    }

    #[test]
    fn page_cache_residency_of_a_file_just_written() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 1 << 20]).unwrap();
        let fraction = cached_fraction(file.as_file(), 0, 1 << 20).unwrap();
        assert!((0.0..=1.0).contains(&fraction), "{fraction}");
        let report = measure_file(file.path(), file.as_file()).unwrap();
        assert_eq!(report.size_bytes, 1 << 20);
        assert_eq!(report.buffered.unwrap().bytes, 1 << 20);
    }
}
