//! The blend schedule: which source the sample at index `i` of an epoch comes from, and its
//! ordinal within that source, as a pure function of the [`BlendSpec`], the epoch and `i`.

use std::sync::{Arc, Mutex};

use super::mixture_error;
use super::rule::{exhaustive_order, rounded_counts};
use crate::rng::{hash2, mix64};
use crate::Result;

/// Tags the key of sampled draws, so they share no stream with other draws of a seed.
const DRAWS: u64 = 0x626c_656e_6473; // "blends"
/// Sampled blends keep each source's count at every multiple of this many samples, so that
/// finding sample `i`'s ordinal draws fewer than this many samples again.
const CHUNK: u64 = 4096;

/// What a source does when one pass of it has been read within an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exhausted {
    /// Another pass, in a new order (the pass number is part of its seed): it never runs out.
    Cycle,
    /// The epoch ends where this source would give a sample past its one pass.
    Stop,
    /// This many samples an epoch (Mosaic's `choose`), passes cycled as needed; then the
    /// source leaves the blend and the others' weights share its place.
    Samples(u64),
    /// This many passes an epoch (Mosaic's `repeat`); then the source leaves the blend.
    Passes(u64),
}

/// How the sources of a step are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlendMode {
    /// Every step holds each source's share of its samples, rounded so that the counts add up
    /// ([`rounded_counts`](super::rounded_counts)), in the order of Megatron's
    /// error-minimising rule ([`exhaustive_order`](super::exhaustive_order)).
    Exact,
    /// Each sample's source is an independent draw from `(seed, epoch, i)`, by the weights.
    Sampled,
}

/// Everything a blend depends on, apart from the epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct BlendSpec {
    /// Samples in one pass of each source; at least 1 each, at most 65535 sources.
    pub pass_len: Vec<u64>,
    /// What each source does when a pass of it runs out.
    pub exhausted: Vec<Exhausted>,
    /// Exact steps or sampled draws.
    pub mode: BlendMode,
    /// Seed of sampled draws; each source's pass orders are keyed by it too.
    pub seed: u64,
    /// Samples in a step (the global batch of the world size the blend was laid out for).
    pub step: u64,
    /// `(from_step, weights)`, one weight a source, in increasing `from_step`, the first at
    /// step 0: the weights of steps `from_step ..` up to the next entry. Steps count from the
    /// start of epoch 0, across epochs (an epoch of `L` samples has `ceil(L / step)`).
    pub curriculum: Vec<(u64, Vec<f64>)>,
    /// The most samples an epoch holds; needed when every source cycles.
    pub samples_per_epoch: Option<u64>,
}

impl BlendSpec {
    /// Checks the spec; the error names what is wrong, with the source's name from `names`.
    pub fn validate(&self, names: &[String]) -> Result<()> {
        let n = self.pass_len.len();
        let fail = |reason: String| Err(mixture_error(reason));
        if n == 0 || n > usize::from(u16::MAX) || names.len() != n || self.exhausted.len() != n {
            return fail(format!(
                "a mixture needs 1 to 65535 sources, each with a length, a name and a policy \
                 (got {n} lengths, {} names, {} policies)",
                names.len(),
                self.exhausted.len()
            ));
        }
        if self.step == 0 {
            return fail("a step of a mixture holds at least 1 sample".into());
        }
        for (s, name) in names.iter().enumerate() {
            if self.pass_len[s] == 0 {
                return fail(format!("source {name:?} has no samples"));
            }
            if matches!(
                self.exhausted[s],
                Exhausted::Samples(0) | Exhausted::Passes(0)
            ) {
                return fail(format!(
                    "source {name:?}: a number of samples or passes an epoch is at least 1"
                ));
            }
        }
        let Some((first, _)) = self.curriculum.first() else {
            return fail("a mixture needs weights".into());
        };
        if *first != 0 {
            return fail(format!(
                "the weights of a mixture start at step 0, not {first} (give the weights of \
                 step 0 first)"
            ));
        }
        for (k, (from, weights)) in self.curriculum.iter().enumerate() {
            if k > 0 && *from <= self.curriculum[k - 1].0 {
                return fail(format!(
                    "the steps of a curriculum increase: step {from} follows step {}",
                    self.curriculum[k - 1].0
                ));
            }
            if weights.len() != n {
                return fail(format!(
                    "the weights from step {from} name {} sources, the mixture has {n}",
                    weights.len()
                ));
            }
            if let Some(s) = (0..n).find(|&s| !(weights[s].is_finite() && weights[s] >= 0.0)) {
                return fail(format!(
                    "the weight of source {:?} from step {from} is {}: weights are finite and \
                     at least 0",
                    names[s], weights[s]
                ));
            }
            if weights.iter().sum::<f64>() <= 0.0 {
                return fail(format!("the weights from step {from} are all 0"));
            }
        }
        if self.samples_per_epoch == Some(0) {
            return fail("an epoch of a mixture holds at least 1 sample".into());
        }
        if self.samples_per_epoch.is_none() && self.exhausted.iter().all(|e| *e == Exhausted::Cycle)
        {
            return fail(
                "every source of the mixture cycles, so an epoch has no end: give its length \
                 (steps), or a source that stops or gives a set number of samples or passes"
                    .into(),
            );
        }
        Ok(())
    }

    /// Samples source `s` may give in an epoch (`u64::MAX`: no end).
    fn budget(&self, s: usize) -> u64 {
        match self.exhausted[s] {
            Exhausted::Cycle => u64::MAX,
            Exhausted::Stop => self.pass_len[s],
            Exhausted::Samples(n) => n,
            Exhausted::Passes(p) => p.saturating_mul(self.pass_len[s]),
        }
    }

    /// The curriculum entry of global step `t`, and the step of the next entry.
    fn entry_at(&self, t: u64) -> (usize, Option<u64>) {
        let e = self.curriculum.partition_point(|(from, _)| *from <= t) - 1;
        (e, self.curriculum.get(e + 1).map(|(from, _)| *from))
    }
}

/// Which sources may still give samples, and which of them can end the epoch.
struct Counts<'a> {
    spec: &'a BlendSpec,
    budget: Vec<u64>,
    /// Samples each source gave so far this epoch.
    given: Vec<u64>,
}

impl<'a> Counts<'a> {
    fn new(spec: &'a BlendSpec) -> Counts<'a> {
        let n = spec.pass_len.len();
        Counts {
            spec,
            budget: (0..n).map(|s| spec.budget(s)).collect(),
            given: vec![0; n],
        }
    }

    /// Whether `s` is still in the blend: a source with a set number leaves once it gave it;
    /// a stopping source stays (taking it once more ends the epoch).
    fn active(&self, s: usize) -> bool {
        match self.spec.exhausted[s] {
            Exhausted::Samples(_) | Exhausted::Passes(_) => self.given[s] < self.budget[s],
            Exhausted::Cycle | Exhausted::Stop => true,
        }
    }

    /// The weights of entry `e` of the active sources (0 for the others).
    fn weights(&self, e: usize) -> Vec<f64> {
        let w = &self.spec.curriculum[e].1;
        (0..w.len())
            .map(|s| if self.active(s) { w[s] } else { 0.0 })
            .collect()
    }

    /// Whether the epoch can still end other than by its length: an active source that stops
    /// or gives a set number has weight now or later.
    fn can_end(&self, e: usize) -> bool {
        let spec = self.spec;
        (0..self.given.len()).any(|s| {
            spec.exhausted[s] != Exhausted::Cycle
                && self.active(s)
                && spec.curriculum[e..].iter().any(|(_, w)| w[s] > 0.0)
        })
    }
}

/// The steps of a run that share one order: `steps` steps from `first` (steps of the
/// epoch), each drawing its sources in `order`.
#[derive(Debug)]
struct Run {
    first: u64,
    steps: u64,
    order: Vec<u16>,
    /// `rank[p]`: samples of source `order[p]` at places before `p` of a step.
    rank: Vec<u32>,
    /// Samples of each source in a step.
    per_step: Vec<u64>,
    /// Samples of each source before the run.
    before: Vec<u64>,
}

impl Run {
    fn new(first: u64, steps: u64, order: Vec<u16>, before: Vec<u64>) -> Run {
        let mut per_step = vec![0u64; before.len()];
        let rank = order
            .iter()
            .map(|&s| {
                per_step[usize::from(s)] += 1;
                (per_step[usize::from(s)] - 1) as u32
            })
            .collect();
        Run {
            first,
            steps,
            order,
            rank,
            per_step,
            before,
        }
    }
}

/// Sampled draws of one epoch: each source's count at every multiple of [`CHUNK`] samples,
/// drawn as far as needed, and at the ends of the last reads ([`RECENT`]), where the next
/// batches usually start.
#[derive(Debug)]
struct Draws {
    key: u64,
    checkpoints: Mutex<Vec<Vec<u64>>>,
    recent: Mutex<Vec<(u64, Vec<u64>)>>,
}

/// Ends of reads kept: more than the batches reader threads hold at once.
const RECENT: usize = 64;

/// The blend of one epoch: a pure function from a sample's index to its source and ordinal.
#[derive(Debug)]
pub struct EpochBlend {
    spec: Arc<BlendSpec>,
    epoch: u64,
    /// Global step the epoch starts at (for the curriculum).
    first_step: u64,
    len: u64,
    plan: Plan,
}

#[derive(Debug)]
enum Plan {
    Exact(Vec<Run>),
    Sampled(Draws),
}

impl EpochBlend {
    /// The blend of `epoch`, whose first step is global step `first_step`. The spec must be
    /// valid ([`BlendSpec::validate`]).
    pub fn new(spec: Arc<BlendSpec>, epoch: u64, first_step: u64) -> Result<EpochBlend> {
        let (plan, len) = match spec.mode {
            BlendMode::Exact => {
                let (runs, len) = exact_plan(&spec, first_step)?;
                (Plan::Exact(runs), len)
            }
            BlendMode::Sampled => {
                let draws = Draws {
                    key: hash2(hash2(DRAWS, spec.seed), epoch),
                    checkpoints: Mutex::new(vec![vec![0; spec.pass_len.len()]]),
                    recent: Mutex::new(Vec::with_capacity(RECENT)),
                };
                let blend = EpochBlend {
                    spec: Arc::clone(&spec),
                    epoch,
                    first_step,
                    len: spec.samples_per_epoch.unwrap_or(u64::MAX),
                    plan: Plan::Sampled(draws),
                };
                let len = blend.sampled_len()?;
                return Ok(EpochBlend { len, ..blend });
            }
        };
        if len == 0 {
            return Err(mixture_error(format!(
                "epoch {epoch} of the mixture has no sample: its sources that end the epoch \
                 have no weight"
            )));
        }
        Ok(EpochBlend {
            spec,
            epoch,
            first_step,
            len,
            plan,
        })
    }

    /// Samples in the epoch.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the epoch has no sample (never: [`EpochBlend::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The global step the epoch starts at.
    pub fn first_step(&self) -> u64 {
        self.first_step
    }

    /// Steps in the epoch (the last may be partial).
    pub fn steps(&self) -> u64 {
        self.len.div_ceil(self.spec.step)
    }

    /// The spec.
    pub fn spec(&self) -> &Arc<BlendSpec> {
        &self.spec
    }

    /// `(source, ordinal)` of samples `first .. first + count` (below [`len`](Self::len)):
    /// the ordinal counts the source's samples of this epoch before it, from 0.
    pub fn locate(&self, first: u64, count: u64) -> Vec<(u16, u64)> {
        debug_assert!(first + count <= self.len);
        match &self.plan {
            Plan::Exact(runs) => (first..first + count)
                .map(|i| exact_locate(runs, self.spec.step, i))
                .collect(),
            Plan::Sampled(draws) => {
                let (from, mut given) = self.nearest(draws, first);
                let mut out = Vec::with_capacity(count as usize);
                for i in from..first + count {
                    let s = self.draw(draws, i, &given).unwrap_or(0);
                    if i >= first {
                        out.push((s as u16, given[s]));
                    }
                    given[s] += 1;
                }
                let mut recent = draws.recent.lock().unwrap_or_else(|p| p.into_inner());
                if recent.len() == RECENT {
                    recent.remove(0);
                }
                recent.push((first + count, given));
                out
            }
        }
    }

    /// Samples each source gave before sample `i` (at most [`len`](Self::len)) of the epoch.
    pub fn given_before(&self, i: u64) -> Vec<u64> {
        match &self.plan {
            Plan::Exact(runs) => {
                let step = self.spec.step;
                let (t, place) = (i / step, (i % step) as usize);
                let r = &runs[runs.partition_point(|r| r.first <= t).max(1) - 1];
                let whole = (t - r.first).min(r.steps);
                let mut given: Vec<u64> = (0..r.before.len())
                    .map(|s| r.before[s] + whole * r.per_step[s])
                    .collect();
                if whole < r.steps {
                    for &s in &r.order[..place.min(r.order.len())] {
                        given[usize::from(s)] += 1;
                    }
                }
                given
            }
            Plan::Sampled(draws) => {
                let mut given = self.checkpoint(draws, i);
                for j in (i - i % CHUNK)..i {
                    let s = self.draw(draws, j, &given).unwrap_or(0);
                    given[s] += 1;
                }
                given
            }
        }
    }

    /// The counts at the nearest place at or before `i` that is known: the end of a recent
    /// read in `i`'s chunk, or the chunk's start.
    fn nearest(&self, draws: &Draws, i: u64) -> (u64, Vec<u64>) {
        let chunk = i - i % CHUNK;
        let recent = draws.recent.lock().unwrap_or_else(|p| p.into_inner());
        let best = recent
            .iter()
            .filter(|(end, _)| *end <= i && *end >= chunk)
            .max_by_key(|(end, _)| *end)
            .cloned();
        drop(recent);
        best.unwrap_or_else(|| (chunk, self.checkpoint(draws, i)))
    }

    /// The counts at the multiple of [`CHUNK`] at or before `i`, drawing up to it if needed.
    fn checkpoint(&self, draws: &Draws, i: u64) -> Vec<u64> {
        let c = (i / CHUNK) as usize;
        let mut kept = draws.checkpoints.lock().unwrap_or_else(|p| p.into_inner());
        while kept.len() <= c {
            let m = (kept.len() - 1) as u64;
            let mut given = kept[kept.len() - 1].clone();
            for j in m * CHUNK..(m + 1) * CHUNK {
                match self.draw(draws, j, &given) {
                    Some(s) => given[s] += 1,
                    None => break,
                }
            }
            kept.push(given);
        }
        kept[c].clone()
    }

    /// The source of sampled draw `i` after the counts `given`, or `None` where the epoch
    /// ends at `i`.
    fn draw(&self, draws: &Draws, i: u64, given: &[u64]) -> Option<usize> {
        let spec = &*self.spec;
        if spec.samples_per_epoch.is_some_and(|n| i >= n) {
            return None;
        }
        let (e, _) = spec.entry_at(self.first_step.saturating_add(i / spec.step));
        let weights = &spec.curriculum[e].1;
        // As `Counts::active` and `Counts::can_end`, without a copy of the counts per draw.
        let active = |s: usize| match spec.exhausted[s] {
            Exhausted::Samples(_) | Exhausted::Passes(_) => given[s] < spec.budget(s),
            Exhausted::Cycle | Exhausted::Stop => true,
        };
        let can_end = (0..given.len()).any(|s| {
            spec.exhausted[s] != Exhausted::Cycle
                && active(s)
                && spec.curriculum[e..].iter().any(|(_, w)| w[s] > 0.0)
        });
        if spec.samples_per_epoch.is_none() && !can_end {
            return None;
        }
        let weight = |s: usize| if active(s) { weights[s] } else { 0.0 };
        let total: f64 = (0..given.len()).map(weight).sum();
        if total <= 0.0 {
            return None;
        }
        // 53 random bits as a fraction of 1, scaled to the weights' sum.
        let u = (mix64(hash2(draws.key, i)) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut acc = 0.0;
        let mut chosen = None;
        for s in 0..given.len() {
            let w = weight(s);
            if w > 0.0 {
                chosen = Some(s);
                acc += w;
                if u < acc {
                    break;
                }
            }
        }
        let s = chosen?;
        if spec.exhausted[s] == Exhausted::Stop && given[s] >= spec.budget(s) {
            return None;
        }
        Some(s)
    }

    /// Where a sampled epoch ends: its length when every source cycles, otherwise the first
    /// draw that ends it (drawing the whole epoch once; its checkpoints are kept).
    fn sampled_len(&self) -> Result<u64> {
        let Plan::Sampled(draws) = &self.plan else {
            unreachable!("sampled_len of an exact blend")
        };
        let spec = &*self.spec;
        if spec.exhausted.iter().all(|e| *e == Exhausted::Cycle) {
            return Ok(self.len);
        }
        let mut i = 0u64;
        loop {
            let mut given = self.checkpoint(draws, i);
            for j in i..i + CHUNK {
                match self.draw(draws, j, &given) {
                    Some(s) => given[s] += 1,
                    None if j == 0 => {
                        return Err(mixture_error(format!(
                            "epoch {} of the mixture has no sample: its sources that end the \
                             epoch have no weight",
                            self.epoch
                        )))
                    }
                    None => return Ok(j),
                }
            }
            i += CHUNK;
        }
    }
}

fn exact_locate(runs: &[Run], step: u64, i: u64) -> (u16, u64) {
    let (t, place) = (i / step, (i % step) as usize);
    let r = &runs[runs.partition_point(|r| r.first <= t) - 1];
    let s = r.order[place];
    let k = r.before[usize::from(s)]
        + (t - r.first) * r.per_step[usize::from(s)]
        + u64::from(r.rank[place]);
    (s, k)
}

/// The runs of an exact epoch starting at global step `first_step`, and its length.
fn exact_plan(spec: &BlendSpec, first_step: u64) -> Result<(Vec<Run>, u64)> {
    let g = spec.step;
    let cap = spec.samples_per_epoch.unwrap_or(u64::MAX);
    let mut counts = Counts::new(spec);
    let mut runs = Vec::new();
    let mut t = 0u64; // steps of the epoch done
    loop {
        let pos = t.saturating_mul(g);
        let global = first_step.saturating_add(t);
        let (e, next) = spec.entry_at(global);
        if pos >= cap || (spec.samples_per_epoch.is_none() && !counts.can_end(e)) {
            return Ok((runs, pos.min(cap)));
        }
        let weights = counts.weights(e);
        if weights.iter().sum::<f64>() <= 0.0 {
            return Ok((runs, pos));
        }
        let c = rounded_counts(&weights, g);
        // Whole steps of these counts: until a weights change, the length, or a source that
        // ends the epoch or leaves it running short.
        let mut whole = next.map_or(u64::MAX, |n| n - global);
        whole = whole.min((cap - pos) / g);
        for (s, &n) in c.iter().enumerate() {
            if n > 0 && spec.exhausted[s] != Exhausted::Cycle {
                whole = whole.min((counts.budget[s] - counts.given[s]) / n);
            }
        }
        if whole == u64::MAX {
            let starved = (0..c.len())
                .find(|&s| spec.exhausted[s] != Exhausted::Cycle && weights[s] > 0.0)
                .unwrap_or(0);
            return Err(mixture_error(format!(
                "source number {starved}'s share of a step of {g} samples rounds to 0, so it never \
                 runs out and the epoch never ends: raise its weight, the step, or give the \
                 epoch's length"
            )));
        }
        if whole > 0 {
            let order = exhaustive_order(&c);
            runs.push(Run::new(t, whole, order, counts.given.clone()));
            for (s, n) in c.iter().enumerate() {
                counts.given[s] += whole * n;
            }
            t += whole;
            continue;
        }
        let order = short_step(&counts, &weights, c, g, cap - pos);
        let full = order.len() as u64 == g;
        runs.push(Run::new(t, 1, order.clone(), counts.given.clone()));
        for s in order {
            counts.given[usize::from(s)] += 1;
        }
        if !full {
            let last = runs.last().map_or(0, |r| r.order.len() as u64);
            return Ok((runs, pos + last));
        }
        t += 1;
    }
}

/// The order of a step in which a source runs short: sources leaving the blend give what they
/// have left and the others share their places by weight; a stopping source ends the epoch
/// where it would take a sample past its pass; `room` cuts the step at the epoch's length.
fn short_step(
    counts: &Counts,
    weights: &[f64],
    mut sizes: Vec<u64>,
    g: u64,
    room: u64,
) -> Vec<u16> {
    let spec = counts.spec;
    let n = sizes.len();
    let mut fixed = vec![false; n];
    loop {
        let short: Vec<usize> = (0..n)
            .filter(|&s| {
                !fixed[s]
                    && matches!(
                        spec.exhausted[s],
                        Exhausted::Samples(_) | Exhausted::Passes(_)
                    )
                    && counts.budget[s] - counts.given[s] < sizes[s]
            })
            .collect();
        if short.is_empty() {
            break;
        }
        for s in short {
            sizes[s] = counts.budget[s] - counts.given[s];
            fixed[s] = true;
        }
        let rest = g - (0..n).filter(|&s| fixed[s]).map(|s| sizes[s]).sum::<u64>();
        let free: Vec<f64> = (0..n)
            .map(|s| if fixed[s] { 0.0 } else { weights[s] })
            .collect();
        if free.iter().sum::<f64>() <= 0.0 {
            (0..n).filter(|&s| !fixed[s]).for_each(|s| sizes[s] = 0);
            break;
        }
        let shared = rounded_counts(&free, rest);
        (0..n)
            .filter(|&s| !fixed[s])
            .for_each(|s| sizes[s] = shared[s]);
    }
    let mut order = exhaustive_order(&sizes);
    let mut given = counts.given.clone();
    let end = order
        .iter()
        .position(|&s| {
            let s = usize::from(s);
            let past = spec.exhausted[s] == Exhausted::Stop && given[s] >= counts.budget[s];
            given[s] += 1;
            past
        })
        .unwrap_or(order.len());
    order.truncate(end.min(room.min(g) as usize));
    order
}

/// A blend over epochs: each epoch's [`EpochBlend`], with the global step each starts at.
#[derive(Debug)]
pub struct Blend {
    spec: Arc<BlendSpec>,
    /// `starts[e]`: the global step epoch `e` starts at, for the epochs worked out so far.
    starts: Mutex<Vec<u64>>,
}

impl Blend {
    /// A blend of `spec`, checked with the sources' `names`.
    pub fn new(spec: BlendSpec, names: &[String]) -> Result<Blend> {
        spec.validate(names)?;
        Ok(Blend {
            spec: Arc::new(spec),
            starts: Mutex::new(vec![0]),
        })
    }

    /// The spec.
    pub fn spec(&self) -> &Arc<BlendSpec> {
        &self.spec
    }

    /// The blend of `epoch`. Its first step follows the steps of the epochs before it, which
    /// are worked out once (for a sampled blend whose sources end epochs, by drawing them).
    pub fn epoch(&self, epoch: u64) -> Result<EpochBlend> {
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        while (starts.len() as u64) <= epoch {
            let e = starts.len() as u64 - 1;
            let blend = EpochBlend::new(Arc::clone(&self.spec), e, starts[e as usize])?;
            let next = blend.first_step.saturating_add(blend.steps());
            starts.push(next);
        }
        let first = starts[epoch as usize];
        drop(starts);
        EpochBlend::new(Arc::clone(&self.spec), epoch, first)
    }
}
