//! Random windows: nanoGPT's sampling, as a pure function of (seed, step, rank).

use super::rng::{hash2, SplitMix64};

/// Tags the key of random window draws, so they share no stream with other draws of a seed.
const TAG: u64 = 0x746f_6b65_6e73; // "tokens"

/// The windows of step `step`'s batch on `rank`: `batch_size` indices drawn uniformly, with
/// replacement, from `0 .. num_windows`.
///
/// With [`TokenWindows`](super::TokenWindows) of stride 1 over `N` tokens, `num_windows` is
/// `N - seq_len` and window `i` starts at token `i`: nanoGPT's
/// `torch.randint(len(data) - block_size, (batch_size,))`.
///
/// Draw `i` of the batch is the first bounded draw of SplitMix64 keyed by
/// `(seed, step, rank * batch_size + i)`, so any step's batch on any rank is computed alone:
/// resuming needs the step only, ranks never coordinate, and the global batch of a step (ranks
/// `0 .. world_size` in order) does not depend on how it is split among ranks of one batch size.
/// The stream is endless; a caller stops it after a number of steps.
///
/// # Panics
/// If `num_windows` is 0 (a [`TokenWindows`](super::TokenWindows) never has none).
pub fn random_windows(
    seed: u64,
    step: u64,
    rank: u64,
    batch_size: u64,
    num_windows: u64,
) -> Vec<u64> {
    assert!(num_windows > 0, "random windows drawn from an empty set");
    let key = hash2(hash2(TAG, seed), step);
    let first = rank.wrapping_mul(batch_size);
    (0..batch_size)
        .map(|i| SplitMix64::new(hash2(key, first.wrapping_add(i))).below(num_windows))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_in_seed_step_and_rank() {
        let a = random_windows(7, 100, 1, 12, 1_000_000);
        assert_eq!(a, random_windows(7, 100, 1, 12, 1_000_000));
        assert_ne!(a, random_windows(7, 101, 1, 12, 1_000_000));
        assert_ne!(a, random_windows(8, 100, 1, 12, 1_000_000));
        assert_ne!(a, random_windows(7, 100, 0, 12, 1_000_000));
        assert!(a.iter().all(|&i| i < 1_000_000));
    }

    #[test]
    fn ranks_share_out_one_global_batch() {
        // Two ranks of 4 draw what one rank of 8 would: rank r's draws are global indices
        // r * 4 .. r * 4 + 4 of the step.
        let global = random_windows(3, 5, 0, 8, 999);
        let mut split = random_windows(3, 5, 0, 4, 999);
        split.extend(random_windows(3, 5, 1, 4, 999));
        assert_eq!(global, split);
    }

    #[test]
    fn draws_cover_the_range_uniformly() {
        // 64 000 draws over 64 windows: every count within 5 standard deviations of 1000.
        let mut counts = [0u32; 64];
        for step in 0..1000 {
            for i in random_windows(11, step, 0, 64, 64) {
                counts[i as usize] += 1;
            }
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(random_windows(0, 0, 0, 5, 1), vec![0; 5]);
    }

    #[test]
    fn pinned_so_saved_steps_stay_valid() {
        // Computed once by this function: a change here changes every random stream.
        assert_eq!(random_windows(0, 0, 0, 4, 1000), PINNED);
    }

    const PINNED: [u64; 4] = [273, 934, 47, 843];
}
