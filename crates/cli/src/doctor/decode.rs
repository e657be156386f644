//! What `decode="auto"` picks for image datasets here: the rule's answer for the device, the
//! measurements kept this boot (`pinfeed::decode_auto`), and with `--images PATH` a fresh one.

use std::path::Path;
use std::sync::Arc;

use pinfeed::decode_auto::{decode_rates, measured_this_boot, MAX_BATCH};
use pinfeed::{Decode, DeviceSpec, LoaderError, LoaderOptions};
use pinfeed_source::images::{ImageIndex, ImageOptions};
use serde::Serialize;

/// One measurement of the two decoders on a dataset.
#[derive(Serialize, Debug)]
pub(super) struct DecodeMeasured {
    pub(super) dataset: String,
    pub(super) device: String,
    pub(super) cpu_images_per_s: f64,
    pub(super) gpu_images_per_s: f64,
    /// The pick and why, in words.
    pub(super) choice: String,
}

/// `decode="auto"` on `device`, timed on the image dataset at `images` (224 x 224 random crops
/// in batches of [`MAX_BATCH`]) where given; without one, on a CUDA device with nvJPEG, where
/// the measurement happens instead. A dataset that does not open is an error.
pub(super) fn image_decode(device: DeviceSpec, images: Option<&Path>) -> anyhow::Result<String> {
    let index = match images {
        Some(path) => Some(Arc::new(
            ImageIndex::open(path, false).map_err(|e| anyhow::anyhow!("{e}"))?,
        )),
        None => None,
    };
    let present = Decode::gpu_decoder_present();
    if index.is_none() && present.is_ok() && matches!(device.resolve(), DeviceSpec::Cuda(_)) {
        return Ok(
            "timed on each dataset's own images when an image loader starts (kept per \
                   boot, listed below; --images PATH times one now)"
                .into(),
        );
    }
    let options = ImageOptions::default();
    let base = LoaderOptions {
        batch_size: MAX_BATCH,
        ..LoaderOptions::default()
    };
    let resolved = Decode::resolve("auto", device, present, |ordinal| match &index {
        Some(index) => decode_rates(index, &options, ordinal, &base),
        None => Err(LoaderError::Config("no image dataset given".into())),
    });
    Ok(match resolved {
        Ok((_, why)) => why,
        Err(e) => e.to_string(),
    })
}

/// This boot's measurements, from any process.
pub(super) fn measured() -> Vec<DecodeMeasured> {
    measured_this_boot()
        .into_iter()
        .map(|r| DecodeMeasured {
            device: format!("cuda:{}", r.ordinal),
            cpu_images_per_s: r.cpu_images_per_s,
            gpu_images_per_s: r.gpu_images_per_s,
            choice: r.choice().1,
            dataset: r.dataset,
        })
        .collect()
}
