//! The counts and the order of the sources within one step: shares rounded so that they add
//! up, and Megatron's error-minimising rule to interleave them.

/// Counts for `total` samples in proportion to `weights` (finite, at least 0, summing to more
/// than 0), rounded so that they add up to `total`: each count is the floor or the ceiling of
/// its exact share (Hamilton's largest-remainder rule; ties go to the lower index).
pub fn rounded_counts(weights: &[f64], total: u64) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    debug_assert!(sum > 0.0, "rounding counts of weights that sum to 0");
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut counts: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    // Floors of shares that sum to `total` fall short by less than one a source, but rounding
    // of the division may leave one too many: give back from the largest floors first.
    let mut given: u64 = counts.iter().sum();
    while given > total {
        let s = (0..counts.len()).max_by_key(|&s| counts[s]).unwrap_or(0);
        counts[s] -= 1;
        given -= 1;
    }
    let mut order: Vec<usize> = (0..weights.len()).filter(|&s| weights[s] > 0.0).collect();
    // Largest remainder first; a stable sort keeps the lower index first among equals.
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - counts[a] as f64, exact[b] - counts[b] as f64);
        rb.total_cmp(&ra)
    });
    for &s in order.iter().cycle().take((total - given) as usize) {
        counts[s] += 1;
    }
    counts
}

/// The order in which a step draws `sizes[s]` samples of each source `s`: Megatron's
/// error-minimising rule, `build_exhaustive_blending_indices` of megatron-core's
/// `datasets/helpers.cpp` (what its `BlendedDataset` runs when given sample counts rather than
/// a size): at place `i` the source whose count lags its target `sizes[s] / total × max(i, 1)`
/// most is taken (the lowest index among equals), and a source leaves once it has given its
/// size. Sources of size 0 take no part (Megatron asserts that none is 0).
pub fn exhaustive_order(sizes: &[u64]) -> Vec<u16> {
    let total: u64 = sizes.iter().sum();
    let weights: Vec<f64> = sizes
        .iter()
        .map(|&n| n as f64 / total.max(1) as f64)
        .collect();
    let mut counts = vec![0u64; sizes.len()];
    let mut unspent: Vec<usize> = (0..sizes.len()).filter(|&s| sizes[s] > 0).collect();
    let mut order = Vec::with_capacity(total as usize);
    for i in 0..total {
        let x = (i as f64).max(1.0);
        let mut best = (usize::MAX, f64::MIN);
        for &s in &unspent {
            let error = weights[s] * x - counts[s] as f64;
            if error > best.1 {
                best = (s, error);
            }
        }
        let s = best.0;
        order.push(s as u16);
        counts[s] += 1;
        if counts[s] == sizes[s] {
            unspent.retain(|&u| u != s);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// megatron-core's `build_blending_indices` (`datasets/helpers.cpp`), transcribed line by
    /// line: `size` samples blended by `weights`, with no counts given.
    fn megatron_blending_indices(weights: &[f64], size: u64) -> Vec<u16> {
        let mut current = vec![0i64; weights.len()];
        let mut out = Vec::new();
        for sample_idx in 0..size {
            let x = (sample_idx as f64).max(1.0);
            let mut max_error_index = 0;
            let mut max_error = weights[0] * x - current[0] as f64;
            for (d, w) in weights.iter().enumerate().skip(1) {
                let error = w * x - current[d] as f64;
                if error > max_error {
                    max_error = error;
                    max_error_index = d;
                }
            }
            out.push(max_error_index as u16);
            current[max_error_index] += 1;
        }
        out
    }

    /// megatron-core's `build_exhaustive_blending_indices`, transcribed line by line (a
    /// `std::set` of unspent datasets, iterated in increasing order).
    fn megatron_exhaustive_indices(sizes: &[i64]) -> Vec<u16> {
        let total: i64 = sizes.iter().sum();
        let weights: Vec<f64> = sizes.iter().map(|&n| n as f64 / total as f64).collect();
        let mut counts = vec![0i64; sizes.len()];
        let mut unspent: std::collections::BTreeSet<usize> = (0..sizes.len()).collect();
        let mut out = Vec::new();
        let mut index_sample = 0i64;
        while !unspent.is_empty() {
            let x = (index_sample as f64).max(1.0);
            let (mut argmax, mut max) = (usize::MAX, f64::MIN);
            for &d in &unspent {
                let error = weights[d] * x - counts[d] as f64;
                if error > max {
                    argmax = d;
                    max = error;
                }
            }
            out.push(argmax as u16);
            counts[argmax] += 1;
            if sizes[argmax] as f64 - counts[argmax] as f64 == 0.0 {
                unspent.remove(&argmax);
            }
            index_sample += 1;
        }
        out
    }

    fn weights_of(seed: u64, n: usize) -> Vec<f64> {
        let mut rng = crate::rng::SplitMix64::new(seed);
        (0..n).map(|_| (rng.below(1000) + 1) as f64).collect()
    }

    #[test]
    fn counts_are_floors_or_ceilings_that_add_up() {
        for seed in 0..2000 {
            let n = 1 + (seed % 6) as usize;
            let weights = weights_of(seed, n);
            let total = seed % 257;
            let counts = rounded_counts(&weights, total);
            let sum: f64 = weights.iter().sum();
            assert_eq!(counts.iter().sum::<u64>(), total, "{weights:?} {total}");
            for (w, c) in weights.iter().zip(&counts) {
                let exact = w / sum * total as f64;
                assert!(
                    (*c as f64) >= exact.floor() - 1e-9 && (*c as f64) <= exact.ceil() + 1e-9,
                    "{weights:?} {total}: {counts:?}"
                );
            }
        }
        assert_eq!(rounded_counts(&[0.5, 0.3, 0.2], 10), [5, 3, 2]);
        assert_eq!(rounded_counts(&[0.5, 0.3, 0.2], 7), [4, 2, 1]);
        assert_eq!(rounded_counts(&[1.0, 0.0], 3), [3, 0]);
    }

    #[test]
    fn order_is_megatrons_exhaustive_rule() {
        for seed in 0..500 {
            let n = 1 + (seed % 5) as usize;
            let mut rng = crate::rng::SplitMix64::new(seed);
            let sizes: Vec<u64> = (0..n).map(|_| rng.below(40) + 1).collect();
            let theirs =
                megatron_exhaustive_indices(&sizes.iter().map(|&s| s as i64).collect::<Vec<_>>());
            assert_eq!(exhaustive_order(&sizes), theirs, "sizes {sizes:?}");
        }
    }

    #[test]
    fn where_the_counts_agree_the_order_is_megatrons_blend_of_a_size() {
        // BlendedDataset(weights, size) runs build_blending_indices; where its counts are the
        // rounded shares (as for 0.5/0.3/0.2 over whole tens), the step's order is the same.
        for total in [10, 20, 30, 100, 1000] {
            let w = [0.5, 0.3, 0.2];
            let theirs = megatron_blending_indices(&w, total);
            assert_eq!(exhaustive_order(&rounded_counts(&w, total)), theirs);
        }
        assert_eq!(exhaustive_order(&[5, 3, 2]), [0, 1, 2, 0, 1, 0, 2, 0, 1, 0]);
    }

    #[test]
    fn sizes_of_zero_take_no_part() {
        assert_eq!(exhaustive_order(&[0, 2, 0, 1]), [1, 3, 1]);
        assert!(exhaustive_order(&[0, 0]).is_empty());
    }
}
