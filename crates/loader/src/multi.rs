//! One process feeding several devices, in one of two ways.
//!
//! - **Split** ([`MultiLoader::new`]): a ring (a whole [`Loader`]) per device, each device on
//!   its own shard. With `n` devices and the options' rank `r` of `world_size` processes, device
//!   `i` is rank `r * n + i` of `world_size * n`, so the records of an epoch are split among
//!   every device of every process exactly as among ranks (equal batch counts, the same padding
//!   rules). The pinned budget is split evenly among the devices, so the process stays within
//!   the budget it was given.
//! - **Replicated** ([`MultiLoader::replicated`]): every device gets the same batches (a
//!   tensor- or pipeline-parallel group, evaluation on every GPU, an ensemble). One loader reads
//!   each batch once into one pinned slot of one pool (the whole budget), and its copy thread
//!   copies that slot to every device, each copy on its own device's stream into memory of that
//!   device; the slot goes back to the free list only once every device's copy has finished
//!   reading it ([`CopyFence::All`](crate::CopyFence::All)). Disk, page cache and reader threads
//!   work once for all devices; the host's memory bandwidth is spent once on the read and once
//!   per device on the copies.
//!
//! Either way iterating yields one [`Batch`] per device per step, in the order the devices were
//! given.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pinfeed_source::Source;

use crate::backend::Backend;
use crate::error::{LoaderError, Result};
use crate::{Batch, DeviceSpec, Loader, LoaderOptions, Reader, Stats, Waited};

/// What one device of a split [`MultiLoader`] streams: device `index` of `devices` in the
/// process of rank `r` among `world_size` is rank `r * devices + index` of
/// `world_size * devices`, with an equal part of the process's pinned budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceShare {
    /// The device's rank among every device of every process.
    pub rank: u64,
    /// Devices of every process together.
    pub world_size: u64,
    /// The device's part of the pinned budget.
    pub pinned_budget: usize,
}

impl DeviceShare {
    /// The share of device `index` of `devices` under `options` (its `rank`, `world_size` and
    /// `pinned_budget`).
    pub fn of(options: &LoaderOptions, devices: usize, index: usize) -> Result<DeviceShare> {
        DeviceShare::split(
            options.rank,
            options.world_size,
            options.pinned_budget,
            devices,
            index,
        )
    }

    /// The share of device `index` of `devices` in the process of rank `rank` among
    /// `world_size`, with `pinned_budget` for the whole process.
    pub fn split(
        rank: u64,
        world_size: u64,
        pinned_budget: usize,
        devices: usize,
        index: usize,
    ) -> Result<DeviceShare> {
        if devices == 0 {
            return Err(LoaderError::Config("no device given".into()));
        }
        if index >= devices {
            return Err(LoaderError::Config(format!(
                "device {index} is out of range for {devices} device(s)"
            )));
        }
        let n = devices as u64;
        let world_size = world_size
            .checked_mul(n)
            .ok_or_else(|| LoaderError::Config("world size × devices overflows".into()))?;
        let rank = rank
            .checked_mul(n)
            .and_then(|r| r.checked_add(index as u64))
            .ok_or_else(|| LoaderError::Config("rank × devices overflows".into()))?;
        Ok(DeviceShare {
            rank,
            world_size,
            pinned_budget: pinned_budget / devices,
        })
    }
}

/// What feeds the devices.
#[derive(Debug)]
enum Feed {
    /// A loader per device, each on its shard.
    Split(Vec<Loader>),
    /// One loader whose batches are each copied to every device; its channel carries the
    /// batches of a step one after the other, in device order.
    Replicated(Loader),
}

/// Batches for several devices at once; iterating yields one batch per device.
#[derive(Debug)]
pub struct MultiLoader {
    feed: Feed,
    devices: usize,
    /// The batches of the step being received: a [`next_within`](MultiLoader::next_within)
    /// that timed out part way keeps them for the next call. Fewer than `devices`.
    step: Vec<Batch>,
    finished: bool,
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
        let loaders = devices
            .iter()
            .enumerate()
            .map(|(i, &device)| {
                let share = DeviceShare::of(&options, devices.len(), i)?;
                Loader::new(
                    Arc::clone(&source),
                    LoaderOptions {
                        device,
                        rank: share.rank,
                        world_size: share.world_size,
                        pinned_budget: share.pinned_budget,
                        ..options.clone()
                    },
                )
            })
            .collect::<Result<Vec<_>>>()?;
        // Each loader counted page-locked allocations from its own start, before the next
        // device's pool was made: count from when all of them have started.
        for loader in &loaders {
            loader.count_allocations_from_now();
        }
        Ok(MultiLoader::with_feed(Feed::Split(loaders), devices.len()))
    }

    /// Starts one loader that reads each batch once and copies it to every device in
    /// `devices` (a device may be named twice: two copy streams, and two copies, on one GPU).
    ///
    /// `options` are those of one loader: its rank and world size shard the dataset among
    /// processes as usual, and every device of this process gets this rank's batches;
    /// `pinned_budget` bounds the one pool; `device_budget` and `prefetch` hold for each device
    /// (prefetch counts steps); `options.device` is not used. The register reader is refused:
    /// its slots are windows of the file that one registrar locks, and sharing them among
    /// devices would need a release rule of its own for what it would save.
    pub fn replicated(
        source: Arc<dyn Source>,
        options: LoaderOptions,
        devices: &[DeviceSpec],
    ) -> Result<MultiLoader> {
        let loader = Loader::replicated(source, options, devices)?;
        Ok(MultiLoader::with_feed(
            Feed::Replicated(loader),
            devices.len(),
        ))
    }

    /// [`replicated`](MultiLoader::replicated) to `devices` backends made by `make_backends`.
    #[cfg(test)]
    fn replicated_on(
        source: Arc<dyn Source>,
        options: LoaderOptions,
        devices: usize,
        make_backends: impl FnOnce() -> Result<Vec<Arc<Backend>>>,
    ) -> Result<MultiLoader> {
        let loader = replicated_loader(source, options, devices, make_backends)?;
        Ok(MultiLoader::with_feed(Feed::Replicated(loader), devices))
    }

    fn with_feed(feed: Feed, devices: usize) -> MultiLoader {
        MultiLoader {
            feed,
            devices,
            step: Vec::with_capacity(devices),
            finished: false,
        }
    }

    /// Whether every device gets the same batches ([`replicated`](MultiLoader::replicated)).
    pub fn is_replicated(&self) -> bool {
        matches!(self.feed, Feed::Replicated(_))
    }

    /// The loaders: one per device, in the order the devices were given, when split; the one
    /// loader that feeds every device when replicated (iterate the `MultiLoader`, not it).
    pub fn loaders(&self) -> &[Loader] {
        match &self.feed {
            Feed::Split(loaders) => loaders,
            Feed::Replicated(loader) => std::slice::from_ref(loader),
        }
    }

    /// The devices, in the order they were given.
    pub fn devices(&self) -> Vec<DeviceSpec> {
        match &self.feed {
            Feed::Split(loaders) => loaders.iter().map(Loader::device).collect(),
            Feed::Replicated(loader) => loader.devices(),
        }
    }

    /// Steps of one batch per device, over all epochs (the same for every device).
    pub fn num_batches(&self) -> u64 {
        self.loaders()[0].num_batches()
    }

    /// Steps per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.loaders()[0].batches_per_epoch()
    }

    /// Bytes of one output record.
    pub fn record_bytes(&self) -> usize {
        self.loaders()[0].record_bytes()
    }

    /// The counters of the whole: for a replicated loader its own (`read_bytes` counts each
    /// batch once, `bytes` once per device); when split, every device's loader's, combined
    /// ([`Stats::combine`]). `devices` says what each device received.
    pub fn stats(&self) -> Stats {
        match &self.feed {
            Feed::Split(loaders) => {
                let parts: Vec<Stats> = loaders.iter().map(Loader::stats).collect();
                Stats::combine(&parts).expect("at least one device")
            }
            Feed::Replicated(loader) => loader.stats(),
        }
    }

    /// Device bytes held now by batches not yet dropped, on all devices together.
    pub fn device_bytes_held(&self) -> usize {
        self.loaders().iter().map(Loader::device_bytes_held).sum()
    }

    /// Like [`Iterator::next`], but returns [`Waited::TimedOut`] after about `timeout` without a
    /// whole step, keeping the batches of the step received so far for the next call; so that
    /// a caller (the Python bindings) can check for Ctrl-C while it waits.
    pub fn next_within(&mut self, timeout: Duration) -> Waited<Option<Result<Vec<Batch>>>> {
        let deadline = Instant::now() + timeout;
        self.receive(|loader| {
            loader.next_within(deadline.saturating_duration_since(Instant::now()))
        })
    }

    /// Receives the rest of the step, each batch from `pull` on the loader that has it.
    fn receive(
        &mut self,
        mut pull: impl FnMut(&mut Loader) -> Waited<Option<Result<Batch>>>,
    ) -> Waited<Option<Result<Vec<Batch>>>> {
        if self.finished {
            return Waited::Ready(None);
        }
        while self.step.len() < self.devices {
            let loader = match &mut self.feed {
                Feed::Split(loaders) => &mut loaders[self.step.len()],
                Feed::Replicated(loader) => loader,
            };
            // An error from any device ends the iteration; so does the end, which comes
            // between steps (every device has the same number of batches).
            let end = match pull(loader) {
                Waited::TimedOut => return Waited::TimedOut,
                Waited::Ready(Some(Ok(batch))) => {
                    self.step.push(batch);
                    continue;
                }
                Waited::Ready(Some(Err(e))) => Some(Err(e)),
                Waited::Ready(None) => None,
            };
            self.finished = true;
            self.step.clear();
            return Waited::Ready(end);
        }
        let step = std::mem::replace(&mut self.step, Vec::with_capacity(self.devices));
        Waited::Ready(Some(Ok(step)))
    }
}

impl Loader {
    /// A loader that reads each batch once and copies it to every device in `devices`, yielding
    /// the batches of each step one after the other, in device order ([`Batch::target`]);
    /// [`MultiLoader::replicated`] groups them into steps. The options are as there.
    pub fn replicated(
        source: Arc<dyn Source>,
        options: LoaderOptions,
        devices: &[DeviceSpec],
    ) -> Result<Loader> {
        let pin_method = options.pin_method;
        replicated_loader(source, options, devices.len(), || {
            devices
                .iter()
                .map(|&device| Ok(Arc::new(Backend::new(device, pin_method)?)))
                .collect()
        })
    }
}

/// The one loader of a replicated feed, to `devices` backends made by `make_backends`.
fn replicated_loader(
    source: Arc<dyn Source>,
    options: LoaderOptions,
    devices: usize,
    make_backends: impl FnOnce() -> Result<Vec<Arc<Backend>>>,
) -> Result<Loader> {
    if options.reader == Reader::Register && devices > 1 {
        return Err(LoaderError::Config(
            "the register reader feeds one device; replicating to several needs --reader pread (or auto)".into(),
        ));
    }
    Loader::start(source, options, make_backends)
}

impl Iterator for MultiLoader {
    type Item = Result<Vec<Batch>>;

    /// The next batch of every device; an error from any device ends the iteration.
    fn next(&mut self) -> Option<Result<Vec<Batch>>> {
        match self.receive(|loader| Waited::Ready(loader.next())) {
            Waited::Ready(next) => next,
            Waited::TimedOut => unreachable!("next() waits as long as it takes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CopyGate;
    use pinfeed_source::dtype::parse_user_dtype;
    use pinfeed_source::{HostBuffer, Layout};

    #[test]
    fn device_i_of_rank_r_is_shard_r_times_n_plus_i_with_an_equal_budget() {
        let share = DeviceShare::split(2, 4, 1000, 3, 1).unwrap();
        assert_eq!(
            share,
            DeviceShare {
                rank: 7,
                world_size: 12,
                pinned_budget: 333
            }
        );
        // Every shard of the world is some device of some process, once.
        let mut ranks: Vec<u64> = (0..4)
            .flat_map(|r| (0..3).map(move |i| DeviceShare::split(r, 4, 0, 3, i).unwrap().rank))
            .collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..12).collect::<Vec<_>>());
        assert!(DeviceShare::split(0, 1, 1, 0, 0).is_err());
        assert!(DeviceShare::split(0, 1, 1, 2, 2).is_err());
        assert!(DeviceShare::split(0, u64::MAX, 1, 2, 0).is_err());
    }

    fn source(records: usize, record_bytes: usize) -> (Arc<dyn Source>, Vec<u8>) {
        let data: Vec<u8> = (0..records * record_bytes)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let (dtype, _) = parse_user_dtype("u8").unwrap();
        let layout = Layout::new(dtype, vec![record_bytes as u64]).unwrap();
        let buffer = HostBuffer::from_vec(data.clone(), layout).unwrap();
        (Arc::new(buffer), data)
    }

    /// One device's copies held back: the readers must stop once every slot waits for that
    /// device, although the other device's copies of them finished; and when its copies go
    /// through, what they read is still the batch, not a later one written over it.
    #[test]
    fn a_slot_waits_for_the_slowest_device() {
        let (source, data) = source(400, 64);
        let gate = CopyGate::closed();
        let held = Arc::clone(&gate);
        let options = LoaderOptions {
            batch_size: 10,
            pinned_budget: 4 * 4096,
            num_threads: Some(2),
            prefetch: 64,
            device: DeviceSpec::Cpu,
            ..LoaderOptions::default()
        };
        let mut multi = MultiLoader::replicated_on(source, options, 2, move || {
            Ok(vec![
                Arc::new(Backend::new(DeviceSpec::Cpu, crate::PinMethod::Register)?),
                Arc::new(Backend::host_gated(held)?),
            ])
        })
        .unwrap();
        // Dropped before `multi` when an assertion fails, so that its drop, which waits for
        // the copies, does not wait forever.
        struct OpenOnDrop(Arc<CopyGate>);
        impl Drop for OpenOnDrop {
            fn drop(&mut self) {
                self.0.open();
            }
        }
        let _opened = OpenOnDrop(Arc::clone(&gate));
        let slots = multi.stats().slots;
        assert!(slots < 40, "the test needs fewer slots than batches");
        // Long enough for the readers to run far ahead if a slot were freed by the fast copy.
        std::thread::sleep(Duration::from_millis(300));
        let stats = multi.stats();
        assert_eq!(
            stats.slots_recycled, 0,
            "a slot was freed before every device's copy"
        );
        assert!(
            stats.read_bytes <= (slots * 10 * 64) as u64,
            "read {} bytes into {slots} slots with the slow device's copies held back",
            stats.read_bytes
        );
        gate.open();
        let mut got = [Vec::new(), Vec::new()];
        for step in multi.by_ref() {
            for (device, batch) in step.unwrap().into_iter().enumerate() {
                got[device].extend_from_slice(batch.host_bytes().unwrap().unwrap());
            }
        }
        assert!(
            got[0] == data,
            "the fast device's bytes differ from the source"
        );
        assert!(
            got[1] == data,
            "the slow device's bytes differ from the source"
        );
        assert_eq!(multi.stats().read_bytes, data.len() as u64);
    }

    #[test]
    fn replication_refuses_what_it_cannot_do() {
        let (source, _) = source(10, 8);
        let register = LoaderOptions {
            reader: Reader::Register,
            ..LoaderOptions::default()
        };
        let devices = [DeviceSpec::Cpu, DeviceSpec::Cpu];
        let err = MultiLoader::replicated(Arc::clone(&source), register, &devices).unwrap_err();
        assert!(err.to_string().contains("register reader"), "{err}");
        let err = MultiLoader::replicated(source, LoaderOptions::default(), &[]).unwrap_err();
        assert!(err.to_string().contains("no device"), "{err}");
    }
}
