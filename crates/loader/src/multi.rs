//! One process feeding several devices: a ring (a whole [`Loader`]) per device.
//!
//! Each device streams its own shard of the dataset: with `n` devices and the options' rank `r`
//! of `world_size` processes, device `i` is rank `r * n + i` of `world_size * n`, so the records
//! of an epoch are split among every device of every process exactly as among ranks (equal
//! batch counts, the same padding rules). The pinned budget is split evenly among the devices,
//! so the process stays within the budget it was given.

use std::sync::Arc;

use pinfeed_source::Source;

use crate::error::{LoaderError, Result};
use crate::{Batch, DeviceSpec, Loader, LoaderOptions};

/// Several loaders in step, one per device; iterating yields one batch per device.
#[derive(Debug)]
pub struct MultiLoader {
    loaders: Vec<Loader>,
}

impl MultiLoader {
    /// Starts a loader per device in `devices`, each on its shard, each with an equal part of
    /// `options.pinned_budget`.
    pub fn new(
        source: Arc<dyn Source>,
        options: LoaderOptions,
        devices: &[DeviceSpec],
    ) -> Result<MultiLoader> {
        if devices.is_empty() {
            return Err(LoaderError::Config("no device given".into()));
        }
        let n = devices.len() as u64;
        let world_size = options
            .world_size
            .checked_mul(n)
            .ok_or_else(|| LoaderError::Config("world size × devices overflows".into()))?;
        let loaders = devices
            .iter()
            .enumerate()
            .map(|(i, &device)| {
                Loader::new(
                    Arc::clone(&source),
                    LoaderOptions {
                        device,
                        rank: options.rank * n + i as u64,
                        world_size,
                        pinned_budget: options.pinned_budget / devices.len(),
                        ..options.clone()
                    },
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiLoader { loaders })
    }

    /// The loaders, one per device, in the order the devices were given.
    pub fn loaders(&self) -> &[Loader] {
        &self.loaders
    }

    /// Steps of one batch per device, over all epochs (the same for every device).
    pub fn num_batches(&self) -> u64 {
        self.loaders[0].num_batches()
    }
}

impl Iterator for MultiLoader {
    type Item = Result<Vec<Batch>>;

    /// The next batch of every device; an error from any device ends the iteration.
    fn next(&mut self) -> Option<Result<Vec<Batch>>> {
        let mut step = Vec::with_capacity(self.loaders.len());
        for loader in &mut self.loaders {
            match loader.next()? {
                Ok(batch) => step.push(batch),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(step))
    }
}
