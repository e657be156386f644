//! Image datasets as loader sources: `pinfeed.ImageLoader`'s Rust half.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pinfeed_cuda::nvjpeg::JpegBackend;
use pinfeed_source::images::{
    random_resized_crop, CompressedImageSource, Crop, ImageIndex, ImageOptions, ImageSource,
    OnError, PixelLayout,
};
use pyo3::prelude::*;

use crate::errors::{value_error, ToPy};
use crate::loader::Source;

/// Adds this module's classes and functions to `_pinfeed`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ImageDataset>()?;
    m.add(
        "DEFAULT_MAX_PIXELS",
        pinfeed_source::images::DEFAULT_MAX_PIXELS,
    )?;
    m.add_function(wrap_pyfunction!(crop_params, m)?)?;
    m.add_function(wrap_pyfunction!(channel_triple, m)?)?;
    m.add_function(wrap_pyfunction!(image_decoder, m)?)
}

/// ``ImageLoader``'s ``mean`` or ``std`` (``what``) as one value per channel (R, G, B): one
/// value stands for all three. Every value must be finite, and a ``std`` above 0: a NaN would
/// make every batch NaN. ``name`` (the dataset) leads the error.
#[pyfunction]
pub(crate) fn channel_triple(
    py: Python<'_>,
    values: Vec<f64>,
    what: &str,
    name: &str,
) -> PyResult<(f64, f64, f64)> {
    let triple = match values[..] {
        [v] => Some((v, v, v)),
        [r, g, b] => Some((r, g, b)),
        _ => None,
    };
    let good = |v: f64| v.is_finite() && (what != "std" || v > 0.0);
    match triple {
        Some((r, g, b)) if good(r) && good(g) && good(b) => Ok((r, g, b)),
        _ => Err(value_error(
            py,
            "Config",
            format!(
                "{name}: {what} must be one value or three (R, G, B), each finite{}, not {values:?}",
                if what == "std" { " and > 0" } else { "" }
            ),
        )),
    }
}

/// ``(decoder, why)``: where ``decode`` (``"cpu"``, ``"gpu"`` or ``"auto"``) decodes
/// ``dataset``'s images for batches going to ``device``: ``"auto"`` is the faster of the two on
/// a CUDA device where nvJPEG loads, timed on the dataset's first images with this batch size
/// (at most 128), ``num_threads`` and ``pinned_budget`` (once per boot; kept in a cache file),
/// else ``"cpu"``.
#[pyfunction]
#[pyo3(signature = (decode, device, dataset, batch_size, num_threads=None, pinned_budget=None))]
pub(crate) fn image_decoder(
    py: Python<'_>,
    decode: &str,
    device: &str,
    dataset: &ImageDataset,
    batch_size: usize,
    num_threads: Option<usize>,
    pinned_budget: Option<Bound<'_, PyAny>>,
) -> PyResult<(String, String)> {
    let device = crate::options::device_arg(py, device)?;
    let base = pinfeed::LoaderOptions {
        batch_size: batch_size.max(1),
        num_threads,
        pinned_budget: crate::options::byte_size(pinned_budget, "pinned_budget")?
            .unwrap_or(pinfeed::DEFAULT_PINNED_BUDGET),
        ..pinfeed::LoaderOptions::default()
    };
    let (index, options) = (&dataset.index, &dataset.options);
    let resolved = py.detach(|| {
        let present = pinfeed::Decode::gpu_decoder_present();
        pinfeed::Decode::resolve(decode, device, present, |ordinal| {
            pinfeed::decode_auto::decode_rates(index, options, ordinal, &base)
        })
    });
    let (choice, why) = resolved.py_err(py)?;
    let name = match choice {
        pinfeed::Decode::Cpu => "cpu",
        pinfeed::Decode::Gpu => "gpu",
    };
    Ok((name.to_owned(), why))
}

/// An image dataset (an ImageFolder tree or WebDataset ``.tar`` shards), indexed once, and how
/// its records are made; :meth:`source` gives the loader source of one epoch.
#[pyclass(module = "pinfeed._pinfeed", frozen)]
pub struct ImageDataset {
    index: Arc<ImageIndex>,
    options: ImageOptions,
    skipped: Arc<AtomicU64>,
}

#[pymethods]
impl ImageDataset {
    /// Indexes ``path`` and checks the options. ``crop`` is ``"random"`` (torchvision's
    /// ``RandomResizedCrop(size, scale, ratio)``) or ``"center"`` (``Resize(resize)`` then
    /// ``CenterCrop(size)``); ``layout`` ``"NHWC"`` or ``"NCHW"``; ``on_error`` ``"raise"`` or
    /// ``"skip"``.
    #[new]
    #[pyo3(signature = (
        path, *, height, width, crop="random", scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0),
        resize=None, flip=true, layout="NCHW", on_error="raise", max_pixels=None, seed=0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        height: u32,
        width: u32,
        crop: &str,
        scale: (f64, f64),
        ratio: (f64, f64),
        resize: Option<u32>,
        flip: bool,
        layout: &str,
        on_error: &str,
        max_pixels: Option<u64>,
        seed: u64,
    ) -> PyResult<ImageDataset> {
        let name = path.display().to_string();
        let bad = |what: &str, found: &str, expected: &str| {
            value_error(
                py,
                "Config",
                format!("{name}: unknown {what} {found:?}: expected {expected}"),
            )
        };
        let crop = match crop {
            "random" => Crop::RandomResized { scale, ratio },
            // ImageNet's evaluation recipe: resize to size / 0.875 (256 for 224), crop.
            "center" => Crop::Center {
                resize: resize.unwrap_or_else(|| (f64::from(height.min(width)) / 0.875) as u32),
            },
            other => return Err(bad("crop", other, "\"random\" or \"center\"")),
        };
        let layout = match layout {
            "NHWC" | "nhwc" => PixelLayout::Nhwc,
            "NCHW" | "nchw" => PixelLayout::Nchw,
            other => return Err(bad("layout", other, "\"NCHW\" or \"NHWC\"")),
        };
        let on_error = match on_error {
            "raise" => OnError::Raise,
            "skip" => OnError::Skip,
            other => return Err(bad("on_error", other, "\"raise\" or \"skip\"")),
        };
        let options = ImageOptions {
            height,
            width,
            crop,
            flip,
            layout,
            on_error,
            max_pixels: max_pixels.unwrap_or(pinfeed_source::images::DEFAULT_MAX_PIXELS),
            seed,
            epoch: 0,
        };
        options.check(&name).py_err(py)?;
        let skip = on_error == OnError::Skip;
        let index = py.detach(|| ImageIndex::open(&path, skip)).py_err(py)?;
        let skipped = Arc::new(AtomicU64::new(index.skipped().len() as u64));
        Ok(ImageDataset {
            index: Arc::new(index),
            options,
            skipped,
        })
    }

    /// The loader source of ``epoch``: record ``i`` is sample ``i`` with that epoch's crop.
    /// With ``gpu``, its records are the compressed bytes and draws, decoded by nvJPEG on the
    /// device; delivered batches are then planar (the images, then the labels from
    /// ``batch * label offset``).
    #[pyo3(signature = (epoch, gpu=false))]
    fn source(&self, py: Python<'_>, epoch: u64, gpu: bool) -> PyResult<Source> {
        let options = ImageOptions {
            epoch,
            ..self.options.clone()
        };
        let source = ImageSource::with_counter(self.index.clone(), options, self.skipped.clone())
            .py_err(py)?;
        if !gpu {
            return Ok(Source {
                inner: Arc::new(source),
                gpu_images: None,
            });
        }
        let compressed = Arc::new(
            CompressedImageSource::new(source, pinfeed_source::images::DEFAULT_CAPACITY)
                .py_err(py)?,
        );
        let decode = pinfeed::GpuImageDecode::new(compressed.clone(), JpegBackend::Auto);
        Ok(Source {
            inner: compressed,
            gpu_images: Some(Arc::new(decode)),
        })
    }

    /// Samples in the dataset.
    fn __len__(&self) -> usize {
        self.index.len() as usize
    }

    /// The sorted class names of an ImageFolder tree (label ``k`` is ``classes[k]``); empty
    /// for tar shards.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.index.classes().to_vec()
    }

    /// Every sample's label, in dataset order.
    fn labels(&self) -> Vec<i64> {
        self.index.labels().collect()
    }

    /// Sample ``i``'s file (or ``shard.tar:member``).
    fn sample_name(&self, py: Python<'_>, i: u64) -> PyResult<String> {
        if i >= self.index.len() {
            return Err(value_error(
                py,
                "OutOfRange",
                format!("sample {i} of {} samples", self.index.len()),
            ));
        }
        Ok(self.index.sample_name(i))
    }

    /// Samples skipped so far: unusable at indexing (empty class folders, unlabelled tar
    /// samples) and failed decodes, each replaced by the next good sample.
    fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Messages of what was skipped at indexing.
    fn skipped_at_open(&self) -> Vec<String> {
        self.index.skipped().to_vec()
    }

    /// Bytes of pixels at the start of each record, and where its int64 label starts.
    fn record_parts(&self) -> (usize, usize) {
        let pixels = self.options.height as usize * self.options.width as usize * 3;
        (pixels, pixels.next_multiple_of(8))
    }

    /// ``(top, left, height, width, flipped)``: the crop box (in source pixels) and flip of
    /// ``sample`` in ``epoch`` for an image of ``width`` x ``height``, as the records use.
    fn crop_of(
        &self,
        py: Python<'_>,
        sample: u64,
        epoch: u64,
        width: u32,
        height: u32,
    ) -> PyResult<(f64, f64, f64, f64, bool)> {
        let options = ImageOptions {
            epoch,
            ..self.options.clone()
        };
        let source = ImageSource::new(self.index.clone(), options).py_err(py)?;
        let (b, flip) = source.crop_of(sample, width, height);
        Ok((b.top, b.left, b.height, b.width, flip))
    }
}

/// torchvision's ``RandomResizedCrop.get_params`` for an image of ``width`` x ``height``, with
/// its random draws given: ``draws`` are uniform in ``[0, 1)``, taken in torchvision's order
/// (per attempt the scale, the log-ratio, then the row and column if the box fits). Returns
/// ``(top, left, height, width)``. For checks of the crop geometry.
#[pyfunction]
#[pyo3(signature = (width, height, scale, ratio, draws))]
pub(crate) fn crop_params(
    py: Python<'_>,
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    draws: Vec<f64>,
) -> PyResult<(u32, u32, u32, u32)> {
    if width == 0 || height == 0 {
        return Err(value_error(py, "Config", "crop_params: an empty image"));
    }
    let mut it = draws.into_iter();
    let mut missing = false;
    let b = random_resized_crop(width, height, scale, ratio, || {
        it.next().unwrap_or_else(|| {
            missing = true;
            0.0
        })
    });
    if missing {
        return Err(value_error(
            py,
            "Config",
            "crop_params: too few draws (up to 4 an attempt, 10 attempts)",
        ));
    }
    Ok((b.top as u32, b.left as u32, b.height as u32, b.width as u32))
}
