//! A mixture as a [`Source`]: record `i` of an epoch is the sample its blend picks, read from
//! its own source into the caller's buffer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mixture_error;
use super::permute::Permutation;
use super::schedule::EpochBlend;
use crate::rng::{hash2, mix64};
use crate::{check_places, check_request, for_each_run, Layout, NetworkStats, Result, Source};

/// Tags the key of pass orders.
const PASSES: u64 = 0x7061_7373_6573; // "passes"

/// The key of a source's pass orders, from its name: a source keeps its order when others are
/// added to or taken from the mixture.
pub fn source_key(name: &str) -> u64 {
    // FNV-1a, then mixed: stable across platforms and releases, unlike std's hasher.
    let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    mix64(fnv)
}

/// What one source of a mixture gave in a pass of the loader.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStats {
    /// The source's name in the mixture.
    pub name: String,
    /// Samples read from it (a padded step's repeats included).
    pub samples: u64,
    /// Bytes of those samples.
    pub bytes: u64,
    /// Time reader threads spent reading them, summed over threads.
    pub read_time: Duration,
    /// What it fetched over the network, for a source in object storage.
    pub network: Option<NetworkStats>,
}

#[derive(Debug, Default)]
struct Counters {
    samples: AtomicU64,
    bytes: AtomicU64,
    read_nanos: AtomicU64,
}

/// Sources whose records agree in layout, blended: record `i` is sample `i` of the epoch's
/// [`EpochBlend`], the record of its source at its ordinal's place in that source's pass.
///
/// A source's ordinal `k` is pass `k / N` of its `N` records, place `k % N`; with `shuffle`
/// each pass is in the order of a [`Permutation`] keyed by the seed, the source's name, the
/// epoch and the pass, so every record comes once a pass and each pass in a new order.
#[derive(Debug)]
pub struct Mixture {
    name: String,
    names: Vec<String>,
    sources: Vec<Arc<dyn Source>>,
    layout: Layout,
    blend: EpochBlend,
    shuffle: bool,
    keys: Vec<u64>,
    counters: Vec<Counters>,
}

impl Mixture {
    /// The mixture of `sources` (named `names`) by `blend`, whose pass lengths must be the
    /// sources' record counts. Errors name a source whose layout differs from the first's.
    pub fn new(
        names: Vec<String>,
        sources: Vec<Arc<dyn Source>>,
        blend: EpochBlend,
        shuffle: bool,
    ) -> Result<Mixture> {
        let spec = blend.spec();
        if sources.len() != names.len() || sources.len() != spec.pass_len.len() {
            return Err(mixture_error(format!(
                "{} sources, {} names and a blend of {} sources",
                sources.len(),
                names.len(),
                spec.pass_len.len()
            )));
        }
        let layout = sources[0].layout().clone();
        for (s, source) in sources.iter().enumerate() {
            if source.layout() != &layout {
                return Err(mixture_error(format!(
                    "source {:?} ({}) has records of {} {:?}, source {:?} ({}) of {} {:?}: the \
                     sources of a mixture have records of one shape and dtype",
                    names[s],
                    source.name(),
                    source.layout().dtype,
                    source.layout().shape,
                    names[0],
                    sources[0].name(),
                    layout.dtype,
                    layout.shape
                )));
            }
            if source.num_records() != spec.pass_len[s] {
                return Err(mixture_error(format!(
                    "source {:?} has {} records, its blend says {}",
                    names[s],
                    source.num_records(),
                    spec.pass_len[s]
                )));
            }
        }
        Ok(Mixture {
            name: format!("mixture of {}", names.join(", ")),
            keys: names.iter().map(|n| source_key(n)).collect(),
            counters: names.iter().map(|_| Counters::default()).collect(),
            names,
            sources,
            layout,
            blend,
            shuffle,
        })
    }

    /// The blend of this epoch.
    pub fn blend(&self) -> &EpochBlend {
        &self.blend
    }

    /// The sources' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The record of source `s` that its ordinal `k` of this epoch reads.
    pub fn record_of(&self, s: usize, k: u64) -> u64 {
        let n = self.blend.spec().pass_len[s];
        let (pass, place) = (k / n, k % n);
        if !self.shuffle {
            return place;
        }
        let key = hash2(
            hash2(hash2(PASSES, self.blend.spec().seed), self.keys[s]),
            hash2(self.blend.epoch(), pass),
        );
        Permutation::new(n, key).get(place)
    }

    /// What each source gave so far.
    pub fn source_stats(&self) -> Vec<SourceStats> {
        self.names
            .iter()
            .zip(&self.counters)
            .zip(&self.sources)
            .map(|((name, c), source)| SourceStats {
                name: name.clone(),
                samples: c.samples.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                read_time: Duration::from_nanos(c.read_nanos.load(Ordering::Relaxed)),
                network: source.network(),
            })
            .collect()
    }

    /// Reads the samples `first .. first + count` of each `(first, place, count)` of `runs` into
    /// places `place ..` of `dst` (records checked to lie in the epoch), each source gathering
    /// its own, and counts them.
    fn read_runs(&self, runs: &[(u64, usize, usize)], dst: &mut [u8]) -> Result<()> {
        let mut places: Vec<Vec<(u64, usize)>> = vec![Vec::new(); self.sources.len()];
        for &(first, at, count) in runs {
            let located = self.blend.locate(first, count as u64);
            for (place, (s, k)) in (at..).zip(located) {
                let s = usize::from(s);
                places[s].push((self.record_of(s, k), place));
            }
        }
        let record_bytes = self.layout.record_bytes() as u64;
        for (s, records) in places.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let start = Instant::now();
            self.sources[s].gather_at(records, dst)?;
            let c = &self.counters[s];
            let n = records.len() as u64;
            c.samples.fetch_add(n, Ordering::Relaxed);
            c.bytes.fetch_add(n * record_bytes, Ordering::Relaxed);
            c.read_nanos
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Source for Mixture {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.blend.len()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        let count = check_request(self, first, dst.len())?;
        self.read_runs(&[(first, 0, count as usize)], dst)
    }

    /// Each source reads its samples of all the runs at once: a loader batch that carries
    /// several steps (the loader's `StepGroups`) costs each source one gather, not one a step.
    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        check_places(self, records, dst.len())?;
        let record_bytes = self.layout.record_bytes();
        let mut runs = Vec::new();
        for_each_run(records.iter().copied(), |first, place, count| {
            check_request(self, first, count * record_bytes)?;
            runs.push((first, place, count));
            Ok(())
        })?;
        self.read_runs(&runs, dst)
    }

    fn reader_description(&self) -> String {
        let each: Vec<String> = self
            .names
            .iter()
            .zip(&self.sources)
            .map(|(n, s)| format!("{n}: {}", s.reader_description()))
            .collect();
        format!("mixture ({})", each.join("; "))
    }

    fn network(&self) -> Option<NetworkStats> {
        let all: Vec<NetworkStats> = self.sources.iter().filter_map(|s| s.network()).collect();
        (!all.is_empty()).then(|| {
            all.iter()
                .fold(NetworkStats::default(), |a, b| NetworkStats {
                    bytes_fetched: a.bytes_fetched + b.bytes_fetched,
                    requests: a.requests + b.requests,
                    retries: a.retries + b.retries,
                    cache_hits: a.cache_hits + b.cache_hits,
                    cache_misses: a.cache_misses + b.cache_misses,
                    cache_errors: a.cache_errors + b.cache_errors,
                    wait: a.wait + b.wait,
                })
        })
    }
}

/// How much more a source's share of the reading time must be than its share of the samples
/// for it to be named as holding the mixture back.
const SLOWER: f64 = 1.25;

/// The source that holds a read-bound mixture back, in words: the one whose share of the
/// reading time most exceeds its share of the samples, when it exceeds it by a quarter or
/// more; `None` when no source reads markedly slower per sample, or before anything was read.
pub fn holding_back(stats: &[SourceStats]) -> Option<String> {
    let time: f64 = stats.iter().map(|s| s.read_time.as_secs_f64()).sum();
    let samples: u64 = stats.iter().map(|s| s.samples).sum();
    if time <= 0.0 || samples == 0 {
        return None;
    }
    let shares = |s: &SourceStats| {
        (
            s.read_time.as_secs_f64() / time,
            s.samples as f64 / samples as f64,
        )
    };
    let ratio = |s: &SourceStats| {
        let (t, n) = shares(s);
        if n > 0.0 {
            t / n
        } else {
            0.0
        }
    };
    let slowest = stats.iter().max_by(|a, b| ratio(a).total_cmp(&ratio(b)))?;
    let (t, n) = shares(slowest);
    (ratio(slowest) >= SLOWER).then(|| {
        format!(
            "source {:?} holds the mixture back: {:.0}% of the reading time for {:.0}% of the \
             samples",
            slowest.name,
            100.0 * t,
            100.0 * n
        )
    })
}
