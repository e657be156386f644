//! `pinfeed stream --images`: an image dataset (ImageFolder tree or WebDataset tar shards)
//! decoded, cropped and resized on the reader threads into records of a fixed size.

use std::sync::Arc;

use anyhow::{bail, Result};
use pinfeed_source::images::{Crop, ImageIndex, ImageOptions, ImageSource, OnError, PixelLayout};

use crate::stream::StreamArgs;

/// Opens the image dataset of `args`. Every pass of `--epochs` draws the crops of epoch 0, so
/// `--verify` can hold each delivered record to a decode of its own.
pub fn open(args: &StreamArgs) -> Result<Arc<ImageSource>> {
    let size = args.size.unwrap_or(224);
    let crop = match args.crop.as_str() {
        "random" => Crop::RandomResized {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        },
        "center" => Crop::Center {
            resize: (f64::from(size) / 0.875) as u32,
        },
        other => bail!("--crop {other:?}: expected random or center"),
    };
    let layout = match args.layout.as_str() {
        "NCHW" | "nchw" => PixelLayout::Nchw,
        "NHWC" | "nhwc" => PixelLayout::Nhwc,
        other => bail!("--layout {other:?}: expected NCHW or NHWC"),
    };
    let on_error = match args.on_error.as_str() {
        "raise" => OnError::Raise,
        "skip" => OnError::Skip,
        other => bail!("--on-error {other:?}: expected raise or skip"),
    };
    let options = ImageOptions {
        height: size,
        width: size,
        crop,
        flip: matches!(crop, Crop::RandomResized { .. }),
        layout,
        on_error,
        max_pixels: args
            .max_pixels
            .unwrap_or(pinfeed_source::images::DEFAULT_MAX_PIXELS),
        seed: args.seed,
        epoch: 0,
    };
    let index = ImageIndex::open(&args.path, on_error == OnError::Skip)?;
    Ok(Arc::new(ImageSource::new(Arc::new(index), options)?))
}
