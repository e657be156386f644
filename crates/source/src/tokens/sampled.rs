//! nanoGPT's random windows as a [`Source`]: record `v` is the window at a token offset drawn
//! from `(seed, epoch, v)`, so the loader's ordinary in-order reading gives a stream that is
//! deterministic in (seed, step), split across ranks by the loader's rule and resumed exactly
//! from a loader position.

use std::sync::Arc;

use super::{invalid, TokenStream};
use crate::rng::{hash2, SplitMix64};
use crate::{check_places, check_request, Layout, Result, Source, SourceError};

/// Tags the key of random window draws, so they share no stream with other draws of a seed.
const TAG: u64 = 0x746f_6b65_6e73; // "tokens"

/// The token offset of sampled window `v`: uniform over `0 .. num_offsets`, without modulo
/// bias, a pure function of its arguments.
///
/// With `N` tokens and windows of `seq_len + 1`, `num_offsets` is `N - seq_len` (nanoGPT's
/// `torch.randint(len(data) - block_size, ...)`). The draw is the first bounded draw
/// (Lemire's multiply-and-reject) of SplitMix64 seeded with
/// `hash2(hash2(hash2(TAG, seed), epoch), v)`; saved positions rely on this exact rule.
///
/// # Panics
/// If `num_offsets` is 0 (a [`SampledWindows`] never has none).
pub fn sampled_offset(seed: u64, epoch: u64, num_offsets: u64, v: u64) -> u64 {
    assert!(num_offsets > 0, "a window offset drawn from an empty range");
    SplitMix64::new(hash2(epoch_key(seed, epoch), v)).below(num_offsets)
}

fn epoch_key(seed: u64, epoch: u64) -> u64 {
    hash2(hash2(TAG, seed), epoch)
}

/// Windows of `seq_len + 1` tokens at uniformly random token offsets, drawn with replacement:
/// nanoGPT's `get_batch` sampling as fixed-size records.
///
/// Record `v` is the window starting at [`sampled_offset(seed, epoch, N - seq_len,
/// v)`](sampled_offset), at the stream's width. Read in order by a loader without shuffling,
/// step `i` on rank `r` of `world_size` takes records `(i × world_size + r) × batch_size ..`,
/// so the global batch of a step does not depend on how it is split among ranks, and a loader
/// position (epoch, batches done) is all a resume needs.
///
/// The number of records is the caller's: `steps × batch_size × world_size` for a run of a
/// known length, or [`SampledWindows::ENDLESS`]. Records are computed, never stored: memory is
/// constant in the number of records.
#[derive(Debug)]
pub struct SampledWindows {
    stream: Arc<TokenStream>,
    layout: Layout,
    /// Tokens in a window: `seq_len + 1`.
    window: u64,
    /// `num_tokens - seq_len`: window offsets lie in `0 .. num_offsets`; at least 1.
    num_offsets: u64,
    seed: u64,
    epoch: u64,
    key: u64,
    /// At least 1.
    len: u64,
    /// How the loader's records map to windows when several steps travel in one batch (see
    /// [`SampledWindows::grouped`]); `None`: record `v` is window `v`.
    grouping: Option<Grouping>,
}

/// `steps` steps of `batch` windows on each of `world` ranks in one loader batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grouping {
    batch: u64,
    world: u64,
    steps: u64,
}

impl SampledWindows {
    /// A record count for a stream without a set number of steps: 2^40 windows, more than
    /// any run reads, with no memory held for them.
    pub const ENDLESS: u64 = 1 << 40;

    /// `len` windows of `seq_len + 1` tokens of `stream`, drawn under `(seed, epoch)`; errors
    /// when a window is longer than the stream, or `seq_len` or `len` is 0.
    pub fn new(
        stream: Arc<TokenStream>,
        seq_len: u64,
        seed: u64,
        epoch: u64,
        len: u64,
    ) -> Result<SampledWindows> {
        let name = stream.name().to_owned();
        if seq_len == 0 || len == 0 {
            return Err(invalid(
                name,
                format!("seq_len and the number of windows must be at least 1 (got {seq_len} and {len})"),
            ));
        }
        let window = seq_len.saturating_add(1);
        if window > stream.num_tokens() {
            return Err(invalid(
                name,
                format!(
                    "a window of seq_len + 1 = {window} tokens is longer than the {} tokens \
                     of the data",
                    stream.num_tokens()
                ),
            ));
        }
        let layout = Layout::new(stream.dtype().dtype(), vec![window])
            .map_err(|_| invalid(&name, format!("seq_len {seq_len} is too large")))?;
        Ok(SampledWindows {
            num_offsets: stream.num_tokens() - seq_len,
            stream,
            layout,
            window,
            seed,
            epoch,
            key: epoch_key(seed, epoch),
            len,
            grouping: None,
        })
    }

    /// The same windows, numbered for a loader whose batch carries `steps` steps of `batch`
    /// windows each, with `world` ranks: the loader's batch `g` (of `steps × batch` records)
    /// is rank `g % world`'s steps `(g / world) × steps ..`, and its record `j` is window
    /// `(s × world + r) × batch + j % batch` of step `s = (g / world) × steps + j / batch` on
    /// rank `r`, the window that rank reads at step `s` with one step a batch. So a consumer can
    /// take several steps' windows in one slot, one copy and one widening, and still get
    /// exactly the windows of each step. The record count must be a multiple of
    /// `steps × batch × world`.
    pub fn grouped(mut self, batch: u64, world: u64, steps: u64) -> Result<SampledWindows> {
        let per_batch = steps.checked_mul(batch).and_then(|n| n.checked_mul(world));
        if batch == 0 || world == 0 || steps == 0 || per_batch.is_none_or(|n| self.len % n != 0) {
            return Err(invalid(
                self.stream.name(),
                format!(
                    "{} windows do not split into loader batches of {steps} steps of {batch} \
                     windows on {world} rank(s)",
                    self.len
                ),
            ));
        }
        self.grouping = (steps > 1).then_some(Grouping {
            batch,
            world,
            steps,
        });
        Ok(self)
    }

    /// The window the loader's record `u` holds (see [`SampledWindows::grouped`]).
    pub fn window_of(&self, u: u64) -> u64 {
        let Some(Grouping {
            batch,
            world,
            steps,
        }) = self.grouping
        else {
            return u;
        };
        let (g, j) = (u / (steps * batch), u % (steps * batch));
        let (rank, step) = (g % world, (g / world) * steps + j / batch);
        (step * world + rank) * batch + j % batch
    }

    /// The token offset window `v` starts at; `v` may be any number, inside the records or not.
    pub fn offset(&self, v: u64) -> u64 {
        SplitMix64::new(hash2(self.key, v)).below(self.num_offsets)
    }

    /// Offsets windows may start at: `num_tokens - seq_len`.
    pub fn num_offsets(&self) -> u64 {
        self.num_offsets
    }

    /// Tokens a window holds as inputs: one less than it reads.
    pub fn seq_len(&self) -> u64 {
        self.window - 1
    }

    /// The seed and epoch the offsets are drawn under.
    pub fn seed_and_epoch(&self) -> (u64, u64) {
        (self.seed, self.epoch)
    }

    /// The stream the windows are cut from.
    pub fn stream(&self) -> &Arc<TokenStream> {
        &self.stream
    }
}

impl Source for SampledWindows {
    fn name(&self) -> &str {
        self.stream.name()
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.len
    }

    /// One positioned read per window (two where a window crosses from one file into the
    /// next): a gather of scattered offsets straight into `dst`; from object storage, the
    /// windows' ranged GETs in flight together ([`TokenStream::read_windows`]).
    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        check_request(self, first, dst.len())?;
        let count = (dst.len() / self.layout.record_bytes()) as u64;
        let starts: Vec<u64> = (first..first + count)
            .map(|v| self.offset(self.window_of(v)))
            .collect();
        self.stream.read_windows(&starts, dst)
    }

    /// The windows of a gather are read as those of a run ([`TokenStream::read_windows_at`]):
    /// a mixture hands each source its records of a batch this way.
    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        check_places(self, records, dst.len())?;
        let windows = records
            .iter()
            .map(|&(v, place)| match v < self.len {
                true => Ok((self.offset(self.window_of(v)), place)),
                false => Err(SourceError::OutOfRange {
                    name: self.name().to_owned(),
                    first: v,
                    count: 1,
                    num_records: self.len,
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        self.stream
            .read_windows_at(&windows, self.layout.record_bytes(), dst)
    }

    fn documents_in(&self, records: &[u8]) -> Option<u64> {
        self.stream.documents_in(records, self.window as usize)
    }

    fn reader_description(&self) -> String {
        match self.stream.network() {
            Some(_) => "object store (ranged GETs of a batch's windows in flight together)".into(),
            None => "pread (a read per window)".into(),
        }
    }
    fn network(&self) -> Option<crate::NetworkStats> {
        self.stream.network()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::testing::{three_files, u16_bytes};

    #[test]
    fn windows_are_the_slices_at_their_offsets() {
        let (_dir, s) = three_files();
        let w = SampledWindows::new(s, 8, 3, 0, 500).unwrap();
        assert_eq!((w.num_records(), w.num_offsets()), (500, 32));
        let mut dst = vec![0u8; 500 * 18];
        w.read_records(0, &mut dst).unwrap();
        for (v, got) in dst.chunks_exact(18).enumerate() {
            let o = w.offset(v as u64);
            assert_eq!(o, sampled_offset(3, 0, 32, v as u64));
            assert_eq!(got, u16_bytes(o..o + 9), "window {v}");
        }
        // A run read from the middle is the same windows.
        let mut part = vec![0u8; 7 * 18];
        w.read_records(100, &mut part).unwrap();
        assert_eq!(part, dst[100 * 18..107 * 18]);
        assert!(w.read_records(494, &mut part).is_err());
    }

    #[test]
    fn offsets_are_pure_in_seed_epoch_and_index_and_uniform() {
        assert_eq!(sampled_offset(7, 1, 1000, 5), sampled_offset(7, 1, 1000, 5));
        let draws = |seed, epoch| -> Vec<u64> {
            (0..64)
                .map(|v| sampled_offset(seed, epoch, 1 << 20, v))
                .collect()
        };
        assert_ne!(draws(7, 0), draws(8, 0));
        assert_ne!(draws(7, 0), draws(7, 1));
        // 64 000 draws over 64 offsets: every count within 5 standard deviations of 1000.
        let mut counts = [0u32; 64];
        for v in 0..64_000 {
            counts[sampled_offset(11, 0, 64, v) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(sampled_offset(0, 0, 1, 123), 0);
    }

    #[test]
    fn pinned_so_saved_positions_stay_valid() {
        // Computed once by this function: a change here changes every random stream.
        let got: Vec<u64> = (0..4).map(|v| sampled_offset(0, 0, 1000, v)).collect();
        assert_eq!(got, PINNED);
    }

    const PINNED: [u64; 4] = [273, 934, 47, 843];

    #[test]
    fn windows_longer_than_the_data_are_refused_naming_the_file() {
        let (dir, s) = three_files();
        SampledWindows::new(s.clone(), 39, 0, 0, 1).unwrap();
        let e = SampledWindows::new(s.clone(), 40, 0, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&dir.path().display().to_string()), "{e}");
        assert!(e.contains("41 tokens is longer than the 40 tokens"), "{e}");
        assert!(SampledWindows::new(s.clone(), 0, 0, 0, 1).is_err());
        assert!(SampledWindows::new(s, 4, 0, 0, 0).is_err());
    }

    #[test]
    fn a_gather_to_places_reads_each_window_as_a_read_of_it_does() {
        let (_dir, s) = three_files();
        let w = SampledWindows::new(s, 8, 3, 0, 500)
            .unwrap()
            .grouped(2, 1, 5)
            .unwrap();
        let records: Vec<(u64, usize)> = [7u64, 8, 3, 499, 0, 250]
            .into_iter()
            .zip([0usize, 2, 3, 5, 8, 9])
            .collect();
        let mut dst = vec![0xaau8; 10 * 18];
        w.gather_at(&records, &mut dst).unwrap();
        for (place, got) in dst.chunks_exact(18).enumerate() {
            match records.iter().find(|r| r.1 == place) {
                Some(&(v, _)) => {
                    let mut one = vec![0u8; 18];
                    w.read_records(v, &mut one).unwrap();
                    assert_eq!(got, one, "place {place}");
                }
                None => assert!(got.iter().all(|&b| b == 0xaa), "place {place}"),
            }
        }
        let e = w.gather_at(&[(500, 0)], &mut dst).unwrap_err();
        assert!(matches!(e, SourceError::OutOfRange { .. }), "{e}");
        let e = w.gather_at(&[(1, 10)], &mut dst).unwrap_err();
        assert!(matches!(e, SourceError::Destination { .. }), "{e}");
    }

    #[test]
    fn grouped_batches_hold_each_steps_windows_of_one_step_a_batch() {
        let (_dir, stream) = three_files();
        for (batch, world, steps) in [(2, 1, 3), (2, 3, 2), (3, 2, 4), (1, 1, 1)] {
            let len = 4 * steps * batch * world;
            let plain = SampledWindows::new(Arc::clone(&stream), 8, 5, 1, len).unwrap();
            let grouped = SampledWindows::new(Arc::clone(&stream), 8, 5, 1, len)
                .unwrap()
                .grouped(batch, world, steps)
                .unwrap();
            let record = grouped.layout().record_bytes();
            let mut seen = vec![false; len as usize];
            for g in 0..len / (steps * batch) {
                let (rank, first_step) = (g % world, (g / world) * steps);
                let mut got = vec![0u8; (steps * batch) as usize * record];
                grouped.read_records(g * steps * batch, &mut got).unwrap();
                for k in 0..steps {
                    // Step `first_step + k` of `rank`, as one step a batch reads it.
                    let v = ((first_step + k) * world + rank) * batch;
                    let mut want = vec![0u8; batch as usize * record];
                    plain.read_records(v, &mut want).unwrap();
                    let at = (k * batch) as usize * record;
                    assert_eq!(
                        &got[at..at + want.len()],
                        &want[..],
                        "{batch} {world} {steps} {g} {k}"
                    );
                    for i in 0..batch {
                        assert!(!std::mem::replace(&mut seen[(v + i) as usize], true));
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "every window once");
        }
        let odd = SampledWindows::new(Arc::clone(&stream), 8, 5, 1, 10).unwrap();
        assert!(
            odd.grouped(2, 1, 3).is_err(),
            "10 windows are not whole batches of 6"
        );
    }
}
