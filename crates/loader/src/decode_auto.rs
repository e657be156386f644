//! `decode="auto"`: the image decoder that is faster for a dataset on this machine, measured.
//!
//! Which decoder is faster depends on the machine (cores, the GPU, whether it has hardware JPEG
//! engines), on the images (their size and encoding) and on the output, so it is measured where
//! it is used, on the dataset's own images: a loader of each kind (the reader threads decoding,
//! and the reader threads reading while nvJPEG and the crop kernel decode on the device) delivers
//! the dataset's first batches with the caller's device, threads and batch size (capped at
//! [`MAX_BATCH`]), `WARM_BATCHES` untimed (pinned pool, threads, nvJPEG's buffers, the kernel's
//! compilation), then `TIMED_BATCHES` timed, each waited for as a training loop waits. The
//! GPU is chosen when it moved at least [`GPU_MARGIN`] times the CPU's images per second.
//!
//! The rates are kept in the process and in a file per boot (beside [`tune`](crate::tune)'s,
//! named by the boot, the device and a checksum of what was measured), so later loaders and
//! processes on the machine read them; `pinfeed doctor` lists this boot's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use pinfeed_source::images::{
    CompressedImageSource, ImageIndex, ImageOptions, ImageSource, DEFAULT_CAPACITY,
};
use pinfeed_source::Source;

use crate::gpu_images::Decode;
use crate::{DeviceSpec, GpuImageDecode, Loader, LoaderError, LoaderOptions, Result, Shuffle};
use pinfeed_cuda::nvjpeg::JpegBackend;

/// Batches each decoder delivers before the timing starts.
const WARM_BATCHES: usize = 1;
/// Batches timed per decoder.
const TIMED_BATCHES: usize = 4;
/// The largest batch measured with: the loader's batch size, capped so that the sample stays
/// small (640 images at most).
pub const MAX_BATCH: usize = 128;
/// The smallest batch worth timing; a dataset too small for it is not measured.
const MIN_BATCH: usize = 4;
/// How many times the CPU's rate the GPU must reach to be chosen: decoding on the GPU takes
/// device memory and time on the copy stream from training, and two runs differ by a few
/// percent, so a near tie stays on the CPU.
pub const GPU_MARGIN: f64 = 1.1;

/// What a measurement found: each decoder's images per second on the same sample.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeRates {
    /// The dataset measured.
    pub dataset: String,
    /// The device's ordinal.
    pub ordinal: usize,
    /// Images each decoder delivered while timed.
    pub images: u64,
    /// Images per second decoded on the reader threads.
    pub cpu_images_per_s: f64,
    /// Images per second decoded with nvJPEG and the crop kernel.
    pub gpu_images_per_s: f64,
}

impl DecodeRates {
    /// The decoder the rates pick, and why in words.
    pub fn choice(&self) -> (Decode, String) {
        let (cpu, gpu) = (self.cpu_images_per_s, self.gpu_images_per_s);
        let measured = format!(
            "nvJPEG on cuda:{} {gpu:.0} images/s, the reader threads {cpu:.0} (measured on {} \
             of the dataset's images each)",
            self.ordinal, self.images
        );
        if gpu >= GPU_MARGIN * cpu {
            (Decode::Gpu, format!("gpu: {measured}"))
        } else {
            (
                Decode::Cpu,
                format!("cpu: {measured}; the GPU is chosen at {GPU_MARGIN} times the CPU"),
            )
        }
    }

    fn to_text(&self, key: &str) -> String {
        format!(
            "key {key}\ndataset {}\nordinal {}\nimages {}\ncpu_images_per_s {:.1}\n\
             gpu_images_per_s {:.1}\n",
            self.dataset, self.ordinal, self.images, self.cpu_images_per_s, self.gpu_images_per_s
        )
    }

    /// The rates in a cache file's text, with the key they were measured under; anything else
    /// (a partial or foreign file) is `None`.
    fn parse(text: &str) -> Option<(String, DecodeRates)> {
        let mut fields = HashMap::new();
        for line in text.lines() {
            let (k, v) = line.split_once(' ')?;
            fields.insert(k, v);
        }
        let rate = |k: &str| {
            fields
                .get(k)?
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let rates = DecodeRates {
            dataset: fields.get("dataset")?.to_string(),
            ordinal: fields.get("ordinal")?.parse().ok()?,
            images: fields.get("images")?.parse().ok()?,
            cpu_images_per_s: rate("cpu_images_per_s")?,
            gpu_images_per_s: rate("gpu_images_per_s")?,
        };
        Some((fields.get("key")?.to_string(), rates))
    }
}

static KNOWN: OnceLock<Mutex<HashMap<String, DecodeRates>>> = OnceLock::new();

/// Each decoder's rate on `index`'s images under `options` (epoch 0's crops) for batches going
/// to CUDA device `ordinal` with `base`'s threads, batch size (capped at [`MAX_BATCH`]) and
/// pinned budget: from this process's memory, the boot's cache file, or measured now and kept
/// in both. An error says why it could not be measured (a dataset too small, a fault).
pub fn decode_rates(
    index: &Arc<ImageIndex>,
    options: &ImageOptions,
    ordinal: usize,
    base: &LoaderOptions,
) -> Result<DecodeRates> {
    let batch = base.batch_size.min(MAX_BATCH);
    let batch = batch.min(index.len() as usize / (WARM_BATCHES + TIMED_BATCHES));
    if batch < MIN_BATCH {
        return Err(LoaderError::Config(format!(
            "{}: {} images are too few to time the decoders ({} batches of at least {MIN_BATCH})",
            index.name(),
            index.len(),
            WARM_BATCHES + TIMED_BATCHES
        )));
    }
    let key = format!(
        "{} images={} {}x{} crop={:?} layout={:?} cuda:{ordinal} batch={batch} threads={:?}",
        index.name(),
        index.len(),
        options.height,
        options.width,
        options.crop,
        options.layout,
        base.num_threads
    );
    let known = KNOWN.get_or_init(Mutex::default);
    // Held across the measurement, so that loaders started at once measure once.
    let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rates) = known.get(&key) {
        return Ok(rates.clone());
    }
    let path = cache_file(ordinal, &key);
    let cached = path
        .as_deref()
        .and_then(|p| DecodeRates::parse(&std::fs::read_to_string(p).ok()?))
        .filter(|(k, _)| *k == key);
    let rates = match cached {
        Some((_, rates)) => rates,
        None => {
            let rates = measure(index, options, ordinal, base, batch)?;
            if let Some(p) = &path {
                write_cache(p, &rates.to_text(&key)); // best effort: a re-measure otherwise
            }
            rates
        }
    };
    known.insert(key, rates.clone());
    Ok(rates)
}

fn measure(
    index: &Arc<ImageIndex>,
    options: &ImageOptions,
    ordinal: usize,
    base: &LoaderOptions,
    batch: usize,
) -> Result<DecodeRates> {
    let options = ImageOptions {
        epoch: 0,
        ..options.clone()
    };
    let loader_options = LoaderOptions {
        batch_size: batch,
        device: DeviceSpec::Cuda(ordinal),
        shuffle: Shuffle::None,
        epochs: 1,
        drop_last: true,
        start: Default::default(),
        gpu_images: None,
        rank: 0,
        world_size: 1,
        ..base.clone()
    };
    let cpu = Arc::new(ImageSource::new(index.clone(), options.clone())?);
    let cpu_rate = time_batches(cpu, loader_options.clone())?;
    let compressed = Arc::new(CompressedImageSource::new(
        ImageSource::new(index.clone(), options)?,
        DEFAULT_CAPACITY,
    )?);
    let gpu = Arc::new(GpuImageDecode::new(compressed.clone(), JpegBackend::Auto));
    let gpu_rate = time_batches(
        compressed,
        LoaderOptions {
            gpu_images: Some(gpu),
            ..loader_options
        },
    )?;
    Ok(DecodeRates {
        dataset: index.name().to_owned(),
        ordinal,
        images: (TIMED_BATCHES * batch) as u64,
        cpu_images_per_s: cpu_rate,
        gpu_images_per_s: gpu_rate,
    })
}

/// Images per second a loader of `source` delivers over `TIMED_BATCHES` batches after
/// `WARM_BATCHES`, each waited for until its copy (or decode) finished.
fn time_batches(source: Arc<dyn Source>, options: LoaderOptions) -> Result<f64> {
    let batch = options.batch_size;
    let mut loader = Loader::new(source, options)?;
    for _ in 0..WARM_BATCHES {
        next_ready(&mut loader)?;
    }
    let t0 = Instant::now();
    for _ in 0..TIMED_BATCHES {
        next_ready(&mut loader)?;
    }
    let seconds = t0.elapsed().as_secs_f64().max(1e-9);
    Ok((TIMED_BATCHES * batch) as f64 / seconds)
}

fn next_ready(loader: &mut Loader) -> Result<()> {
    let batch = loader.next().ok_or_else(|| {
        LoaderError::Config("the loader ended before the measured batches".into())
    })??;
    batch.wait_ready()
}

/// This boot's file for the measurement named by `key` on device `ordinal`.
fn cache_file(ordinal: usize, key: &str) -> Option<PathBuf> {
    let boot = crate::tune::boot_id()?;
    let sum = crc32fast::hash(key.as_bytes());
    Some(crate::tune::cache_dir()?.join(format!("decode-{boot}-cuda{ordinal}-{sum:08x}.txt")))
}

/// Through a file of this process's own and a rename, as `tune` writes its file.
fn write_cache(path: &Path, text: &str) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".decode-{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The measurements kept in this boot's cache files (any process's), for `pinfeed doctor`.
pub fn measured_this_boot() -> Vec<DecodeRates> {
    let (Some(boot), Some(dir)) = (crate::tune::boot_id(), crate::tune::cache_dir()) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("decode-{boot}-");
    let mut found: Vec<DecodeRates> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_name().to_str()?.starts_with(&prefix).then_some(())?;
            Some(DecodeRates::parse(&std::fs::read_to_string(e.path()).ok()?)?.1)
        })
        .collect();
    found.sort_by(|a, b| (a.ordinal, &a.dataset).cmp(&(b.ordinal, &b.dataset)));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(cpu: f64, gpu: f64) -> DecodeRates {
        DecodeRates {
            dataset: "/data/train".into(),
            ordinal: 1,
            images: 512,
            cpu_images_per_s: cpu,
            gpu_images_per_s: gpu,
        }
    }

    #[test]
    fn the_gpu_needs_the_margin() {
        let (d, why) = rates(1000.0, 1200.0).choice();
        assert_eq!(d, Decode::Gpu, "{why}");
        assert!(
            why.starts_with("gpu: nvJPEG on cuda:1 1200 images/s"),
            "{why}"
        );
        let (d, why) = rates(1000.0, 1050.0).choice();
        assert_eq!(d, Decode::Cpu, "{why}");
        assert!(
            why.contains("the reader threads 1000") && why.contains("512"),
            "{why}"
        );
        assert_eq!(rates(3000.0, 1000.0).choice().0, Decode::Cpu);
    }

    #[test]
    fn the_cache_text_round_trips_and_refuses_partial_files() {
        let r = rates(7705.0, 3401.5);
        let text = r.to_text("k 1");
        assert_eq!(DecodeRates::parse(&text), Some(("k 1".into(), r)));
        let partial: String = text.lines().take(4).collect::<Vec<_>>().join("\n");
        assert_eq!(DecodeRates::parse(&partial), None);
        assert_eq!(
            DecodeRates::parse(&text.replace("3401.5", "-1")),
            None,
            "a rate must be positive"
        );
    }
}
