//! Images per second of batched GPU JPEG decoding + crop/resize/flip of a folder of JPEGs, per
//! nvJPEG backend (hardware engines, GPU hybrid), with the process's CPU seconds per 1000 images.
//!
//! The files are read once into pinned memory (as a ring slot holds them), so what is timed is
//! the decode, the crop kernel and nvJPEG's host work, not the disk.
//!
//! ```text
//! nvjpeg_bench DIR [--batch 256] [--size 224] [--rounds 3] [--threads 1,2,4]
//!              [--backends hardware,hybrid,auto] [--limit N] [--out FILE.json]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use pinfeed_cuda::nvjpeg::{
    CropBox, DecoderOptions, ImageInfo, ImageRequest, JpegBackend, JpegDecoder, JpegOutcome,
    Layout, OutputSpec, OutputType,
};
use pinfeed_cuda::{Context, DevicePool, Event, PinMethod, PinnedMemory, Stream};

struct Args {
    dir: PathBuf,
    batch: usize,
    size: u32,
    rounds: usize,
    threads: Vec<usize>,
    backends: Vec<JpegBackend>,
    limit: usize,
    out: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        dir: PathBuf::new(),
        batch: 256,
        size: 224,
        rounds: 3,
        threads: vec![1, 2, 4],
        backends: vec![JpegBackend::Hardware, JpegBackend::Hybrid],
        limit: usize::MAX,
        out: None,
    };
    let num = |v: Option<String>, name: &str| -> Result<usize, String> {
        v.as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or(format!("{name} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--batch" => args.batch = num(it.next(), "--batch")?,
            "--size" => args.size = num(it.next(), "--size")? as u32,
            "--rounds" => args.rounds = num(it.next(), "--rounds")?,
            "--limit" => args.limit = num(it.next(), "--limit")?,
            "--threads" => {
                let v = it.next().ok_or("--threads needs a list")?;
                args.threads = v
                    .split(',')
                    .map(|t| t.parse().map_err(|_| format!("--threads: {t}")))
                    .collect::<Result<_, _>>()?;
            }
            "--backends" => {
                let v = it.next().ok_or("--backends needs a list")?;
                args.backends = v
                    .split(',')
                    .map(|b| match b {
                        "hardware" => Ok(JpegBackend::Hardware),
                        "hybrid" => Ok(JpegBackend::Hybrid),
                        "auto" => Ok(JpegBackend::Auto),
                        other => Err(format!("--backends: {other} (hardware, hybrid, auto)")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--out" => args.out = Some(it.next().ok_or("--out needs a file")?.into()),
            d if !d.starts_with("--") && args.dir.as_os_str().is_empty() => args.dir = d.into(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.dir.as_os_str().is_empty() || args.batch == 0 || args.rounds == 0 {
        return Err("usage: nvjpeg_bench DIR [--batch N] [--size N] [--rounds N] [--threads 1,2] [--backends hardware,hybrid,auto] [--limit N] [--out FILE]".into());
    }
    Ok(args)
}

/// Every `.jpg`/`.jpeg` under `dir`, sorted.
fn jpegs(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            jpegs(&path, found)?;
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
        {
            found.push(path);
        }
    }
    Ok(())
}

fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value, and getrusage fills it for RUSAGE_SELF.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// A square centre crop of the shorter side (torchvision's CenterCrop before Resize's aspect).
fn centre_square(_: usize, info: ImageInfo) -> CropBox {
    let side = info.width.min(info.height);
    CropBox {
        x: (info.width - side) / 2,
        y: (info.height - side) / 2,
        width: side,
        height: side,
        window: None,
    }
}

struct Run {
    backend: JpegBackend,
    threads: usize,
    images: usize,
    seconds: f64,
    cpu_seconds: f64,
    hardware: usize,
    hybrid: usize,
    cpu: usize,
    refused: usize,
}

/// Decodes every batch `rounds` times over `threads` threads (one stream and decoder each) and
/// returns the totals of the timed rounds (after one untimed warm-up round).
fn run(
    ctx: &std::sync::Arc<Context>,
    slot: &PinnedMemory,
    batches: &[Vec<ImageRequest>],
    spec: OutputSpec,
    backend: JpegBackend,
    threads: usize,
    rounds: usize,
) -> Result<Run, String> {
    // SAFETY: `slot` is ours, fully written before this call and not written during it.
    let bytes = unsafe { std::slice::from_raw_parts(slot.as_ptr(), slot.len()) };
    let barrier = std::sync::Barrier::new(threads + 1);
    let counts = std::sync::Mutex::new([0usize; 4]);
    let result = std::thread::scope(|s| -> Result<(f64, f64), String> {
        let mut handles = Vec::new();
        for t in 0..threads {
            let (barrier, counts) = (&barrier, &counts);
            handles.push(s.spawn(move || -> Result<(), String> {
                let mut passed = 0;
                let result = decode_rounds(
                    ctx,
                    bytes,
                    batches,
                    spec,
                    backend,
                    (t, threads),
                    rounds,
                    barrier,
                    &mut passed,
                );
                // On an early error, pass the remaining barriers so no thread waits forever.
                for _ in passed..3 {
                    barrier.wait();
                }
                let tally = result?;
                let mut c = counts.lock().expect("not poisoned");
                for (a, b) in c.iter_mut().zip(tally) {
                    *a += b;
                }
                Ok(())
            }));
        }
        barrier.wait(); // every thread made its decoder
        barrier.wait(); // every thread warm: start
        let (t0, c0) = (Instant::now(), cpu_seconds());
        barrier.wait(); // every thread done
        let elapsed = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
        for h in handles {
            h.join()
                .map_err(|_| "a decode thread panicked".to_string())??;
        }
        Ok(elapsed)
    });
    let (seconds, cpu) = result?;
    let c = counts.into_inner().expect("not poisoned");
    Ok(Run {
        backend,
        threads,
        images: c.iter().sum(),
        seconds,
        cpu_seconds: cpu,
        hardware: c[0],
        hybrid: c[1],
        cpu: c[2],
        refused: c[3],
    })
}

/// One thread's share: its own stream and decoder, batches `t, t + threads, ...` of every
/// round; the barriers are passed before round 0 (warm-up), before round 1 (the clock starts)
/// and after the last (the clock stops). Returns the outcomes counted in the timed rounds.
#[allow(clippy::too_many_arguments)]
fn decode_rounds(
    ctx: &std::sync::Arc<Context>,
    bytes: &[u8],
    batches: &[Vec<ImageRequest>],
    spec: OutputSpec,
    backend: JpegBackend,
    (t, threads): (usize, usize),
    rounds: usize,
    barrier: &std::sync::Barrier,
    passed: &mut usize,
) -> Result<[usize; 4], String> {
    let e = |e: pinfeed_cuda::CudaError| e.to_string();
    let stream = Stream::new(ctx).map_err(e)?;
    let pool = DevicePool::new(ctx).map_err(e)?;
    let options = DecoderOptions {
        backend,
        ..DecoderOptions::default()
    };
    let mut decoder = JpegDecoder::new(&stream, &pool, spec, options).map_err(e)?;
    let out_len = batches.iter().map(Vec::len).max().unwrap_or(0) * spec.image_bytes();
    let out = pool.alloc_async(out_len, &stream).map_err(e)?;
    let done = Event::new(ctx).map_err(e)?;
    let mut outcomes = Vec::new();
    let mut tally = [0usize; 4];
    for round in 0..=rounds {
        if round <= 1 {
            stream.synchronize().map_err(e)?;
            barrier.wait();
            *passed += 1;
        }
        for batch in batches.iter().skip(t).step_by(threads) {
            // SAFETY: `bytes` and `out` outlive the work (the stream is synchronised below,
            // before they go); `out` is used only by this stream.
            unsafe {
                decoder
                    .decode_batch(
                        bytes,
                        batch,
                        &mut centre_square,
                        out.ptr(),
                        out_len,
                        &done,
                        &mut outcomes,
                    )
                    .map_err(e)?
            };
            if round > 0 {
                for o in &outcomes {
                    tally[match o {
                        JpegOutcome::Hardware => 0,
                        JpegOutcome::Hybrid => 1,
                        JpegOutcome::Refused { .. } => 3,
                        _ => 2,
                    }] += 1;
                }
            }
        }
    }
    stream.synchronize().map_err(e)?;
    barrier.wait();
    *passed += 1;
    Ok(tally)
}

fn main() {
    if let Err(msg) = real_main() {
        eprintln!("nvjpeg_bench: {msg}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), String> {
    let args = parse_args()?;
    let mut files = Vec::new();
    jpegs(&args.dir, &mut files).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    files.sort();
    files.truncate(args.limit);
    if files.is_empty() {
        return Err(format!("no .jpg/.jpeg files under {}", args.dir.display()));
    }
    let e = |e: pinfeed_cuda::CudaError| e.to_string();
    let ctx = Context::new(0).map_err(e)?;
    println!(
        "nvJPEG {:?}, {} ({} files)",
        pinfeed_cuda::nvjpeg::version().map_err(e)?,
        ctx.name().map_err(e)?,
        files.len()
    );
    let contents: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).map_err(|err| format!("{}: {err}", f.display())))
        .collect::<Result<_, _>>()?;
    let total: usize = contents.iter().map(Vec::len).sum();
    let slot = PinnedMemory::alloc(&ctx, total, PinMethod::HostAlloc).map_err(e)?;
    let mut requests = Vec::new();
    let mut at = 0;
    for (i, c) in contents.iter().enumerate() {
        // SAFETY: `slot` holds `total` bytes and the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), slot.as_ptr().add(at), c.len()) };
        requests.push(ImageRequest {
            offset: at,
            len: c.len(),
            flip: i % 2 == 1,
        });
        at += c.len();
    }
    let batches: Vec<Vec<ImageRequest>> = requests.chunks(args.batch).map(<[_]>::to_vec).collect();
    let spec = OutputSpec {
        height: args.size,
        width: args.size,
        layout: Layout::Nchw,
        dtype: OutputType::U8,
        antialias: true,
    };
    println!(
        "{:<9} {:>7} {:>10} {:>12} {:>9} {:>8} {:>6} {:>5}",
        "backend", "threads", "images/s", "cpu s/1000", "hardware", "hybrid", "cpu", "refused"
    );
    let mut json = Vec::new();
    for &backend in &args.backends {
        for &threads in &args.threads {
            match run(&ctx, &slot, &batches, spec, backend, threads, args.rounds) {
                Ok(r) => {
                    let rate = r.images as f64 / r.seconds;
                    let cpu_k = r.cpu_seconds / r.images as f64 * 1000.0;
                    println!(
                        "{:<9} {:>7} {:>10.0} {:>12.3} {:>9} {:>8} {:>6} {:>5}",
                        format!("{:?}", r.backend).to_lowercase(),
                        r.threads,
                        rate,
                        cpu_k,
                        r.hardware,
                        r.hybrid,
                        r.cpu,
                        r.refused
                    );
                    json.push(format!(
                        "{{\"backend\":\"{:?}\",\"threads\":{},\"batch\":{},\"size\":{},\"images\":{},\"seconds\":{:.6},\"cpu_seconds\":{:.6},\"images_per_s\":{:.1},\"cpu_s_per_1000\":{:.4},\"hardware\":{},\"hybrid\":{},\"cpu\":{},\"refused\":{}}}",
                        r.backend, r.threads, args.batch, args.size, r.images, r.seconds, r.cpu_seconds, rate, cpu_k, r.hardware, r.hybrid, r.cpu, r.refused
                    ));
                }
                Err(msg) => println!(
                    "{:<9} {:>7} FAILED: {msg}",
                    format!("{backend:?}").to_lowercase(),
                    threads
                ),
            }
        }
    }
    if let Some(out) = &args.out {
        let body = format!(
            "{{\"files\":{},\"bytes\":{},\"device\":\"{}\",\"runs\":[{}]}}\n",
            files.len(),
            total,
            ctx.name().map_err(e)?,
            json.join(",")
        );
        std::fs::write(out, body).map_err(|err| format!("{}: {err}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
