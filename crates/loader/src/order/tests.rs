//! The order's rules, checked over many specs; the generator's output, pinned.

use super::global::*;
use super::random::*;
use super::*;
use std::collections::HashSet;

const WORLD_SIZES: [u64; 4] = [1, 2, 3, 8];
const SEEDS: [u64; 3] = [0, 1, 0xdead_beef_cafe_f00d];
const RECORD_COUNTS: [u64; 12] = [1, 2, 3, 5, 7, 8, 23, 24, 25, 64, 100, 1001];
const BATCH_SIZES: [u64; 5] = [1, 3, 4, 7, 64];
const SHUFFLES: [Shuffle; 7] = [
    Shuffle::None,
    Shuffle::Random,
    Shuffle::Block {
        block: 1,
        window: 1,
    },
    Shuffle::Block {
        block: 4,
        window: 3,
    },
    Shuffle::Block {
        block: 7,
        window: 2,
    },
    Shuffle::Block {
        block: 3,
        window: 100,
    },
    Shuffle::Block {
        block: 1000,
        window: 1,
    },
];

fn spec(n: u64, batch: u64, drop_last: bool, shuffle: Shuffle, seed: u64) -> OrderSpec {
    OrderSpec {
        num_records: n,
        batch_size: batch,
        drop_last,
        shuffle,
        seed,
        rank: 0,
        world_size: 1,
    }
}

fn on_rank(spec: &OrderSpec, rank: u64, world_size: u64) -> OrderSpec {
    OrderSpec {
        rank,
        world_size,
        ..spec.clone()
    }
}

/// Every batch of one rank's epoch, as lists.
fn batches(spec: &OrderSpec, epoch: u64) -> Vec<Vec<u64>> {
    let order = EpochOrder::new(spec, epoch).unwrap();
    (0..order.num_batches())
        .map(|i| order.batch(i).to_vec())
        .collect()
}

/// The global order `P` of an epoch, read from one rank's table.
fn global_order(spec: &OrderSpec, epoch: u64) -> Vec<u64> {
    // Any batching will do: `P` does not depend on it.
    let spec = OrderSpec {
        batch_size: 1,
        drop_last: false,
        ..spec.clone()
    };
    let order = EpochOrder::new(&spec, epoch).unwrap();
    let mut p = Vec::new();
    if spec.num_records > 0 {
        order.global.push(0, spec.num_records, &mut p);
    }
    p
}

/// The epoch's positions `E` as the ranks read them: step by step, rank by rank.
fn positions_from_ranks(spec: &OrderSpec, world_size: u64, epoch: u64) -> Vec<u64> {
    let ranks: Vec<_> = (0..world_size)
        .map(|r| batches(&on_rank(spec, r, world_size), epoch))
        .collect();
    interleave(&ranks)
}

/// The records of per-rank batch lists step by step, rank by rank (as a job reads them).
fn interleave(ranks: &[Vec<Vec<u64>>]) -> Vec<u64> {
    let mut e = Vec::new();
    for i in 0..ranks[0].len() {
        for rank in ranks {
            e.extend(&rank[i]);
        }
    }
    e
}

fn for_every_case(mut check: impl FnMut(&OrderSpec, u64)) {
    for &n in &RECORD_COUNTS {
        for &batch in &BATCH_SIZES {
            for &shuffle in &SHUFFLES {
                for &seed in &SEEDS {
                    for drop_last in [false, true] {
                        for &world in &WORLD_SIZES {
                            check(&spec(n, batch, drop_last, shuffle, seed), world);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn orders_are_pinned_so_saved_positions_stay_valid() {
    // Computed once by this module: a change here changes every order a checkpoint knows.
    let random = global_order(&spec(12, 5, false, Shuffle::Random, 42), 3);
    let block = global_order(
        &spec(
            12,
            5,
            false,
            Shuffle::Block {
                block: 2,
                window: 2,
            },
            42,
        ),
        3,
    );
    assert_eq!(random, PINNED_RANDOM);
    assert_eq!(block, PINNED_BLOCK);
    assert_eq!(
        spec(12, 5, false, Shuffle::Random, 42).fingerprint(),
        PINNED_FINGERPRINT
    );
}
const PINNED_RANDOM: [u64; 12] = [4, 1, 9, 5, 3, 10, 0, 6, 11, 8, 2, 7];
// Windows of two blocks of two: {4, 5, 8, 9}, {0, 1, 2, 3}, {6, 7, 10, 11}.
const PINNED_BLOCK: [u64; 12] = [5, 4, 9, 8, 2, 3, 1, 0, 10, 6, 7, 11];
const PINNED_FINGERPRINT: u64 = 0x5f7e_8434_e845_f095;

#[test]
fn bounded_draws_stay_in_range_and_are_unbiased() {
    let mut rng = SplitMix64::new(9);
    for n in [1, 2, 3, 7, 1 << 33, u64::MAX] {
        for _ in 0..1000 {
            assert!(rng.below(n) < n);
        }
    }
    // A range just over half of 2⁶⁴: a modulo draw would land in the lower third twice as
    // often as in the upper part.
    let n = (1u64 << 63) + (1 << 62);
    let low = (0..30_000).filter(|_| rng.below(n) < n / 3).count();
    assert!(
        (9_000..11_000).contains(&low),
        "{low} of 30000 in the lower third"
    );
}

#[test]
fn random_shuffles_make_every_permutation_equally_often() {
    // 6 permutations of 3 records over 6000 seeds: each about 1000 times (σ ≈ 29); the
    // textbook bug of swapping with any place skews them to 888..1185.
    let mut counts = std::collections::HashMap::new();
    for seed in 0..6000 {
        *counts
            .entry(global_order(&spec(3, 1, false, Shuffle::Random, seed), 0))
            .or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 6);
    for (perm, count) in counts {
        assert!((880..1120).contains(&count), "{perm:?} came {count} times");
    }
}

#[test]
fn narrow_and_wide_tables_make_the_same_permutation() {
    for n in [0, 1, 2, 17, 1000] {
        let narrow = Table::shuffled_with_width(n, &mut SplitMix64::new(5), true).unwrap();
        let wide = Table::shuffled_with_width(n, &mut SplitMix64::new(5), false).unwrap();
        assert!(matches!(narrow, Table::Narrow(_)) && matches!(wide, Table::Wide(_)));
        assert!((0..n).all(|i| narrow.get(i) == wide.get(i)));
    }
}

#[test]
fn every_record_goes_to_exactly_one_rank_apart_from_the_documented_padding_or_tail() {
    for_every_case(|spec, world| {
        let n = spec.num_records;
        let global = global_order(spec, 0);
        let mut sorted = global.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..n).collect::<Vec<_>>(),
            "{spec:?}: P is a permutation"
        );
        let step = world * spec.batch_size;
        if spec.drop_last && n < step {
            assert!(EpochOrder::new(&on_rank(spec, 0, world), 0).is_err());
            return;
        }
        let e = positions_from_ranks(spec, world, 0);
        let order = EpochOrder::new(&on_rank(spec, world - 1, world), 0).unwrap();
        if spec.drop_last {
            // Every rank: the same number of full batches; what is left out is the tail
            // of the global order, shorter than a step.
            let kept = n / step * step;
            assert_eq!(e, global[..kept as usize], "{spec:?} on {world}");
            assert_eq!(order.num_dropped(), n - kept);
            assert!(order.num_dropped() < step);
        } else {
            // Every record once, then the start of the global order again (cycling when
            // there are fewer records than ranks), fewer than `world` repeats.
            let total = n.div_ceil(world) * world;
            let expected: Vec<u64> = (0..total).map(|g| global[(g % n) as usize]).collect();
            assert_eq!(e, expected, "{spec:?} on {world}");
            assert_eq!(order.num_padded(), total - n);
            assert!(order.num_padded() < world);
            if world == 1 {
                assert_eq!(order.num_padded(), 0);
            }
        }
        let distinct: HashSet<u64> = e.iter().copied().collect();
        assert_eq!(distinct.len() as u64, n - order.num_dropped());
    });
}

#[test]
fn every_rank_has_the_same_batches_by_count_and_size() {
    for_every_case(|spec, world| {
        if spec.drop_last && spec.num_records < world * spec.batch_size {
            return;
        }
        let sizes: Vec<Vec<usize>> = (0..world)
            .map(|r| {
                batches(&on_rank(spec, r, world), 0)
                    .iter()
                    .map(Vec::len)
                    .collect()
            })
            .collect();
        let batch = spec.batch_size as usize;
        for rank in &sizes {
            assert_eq!(rank, &sizes[0], "{spec:?} on {world}");
            let (last, full) = rank.split_last().expect("at least one batch");
            assert!(full.iter().all(|&s| s == batch));
            assert!(*last >= 1 && *last <= batch);
            if spec.drop_last {
                assert_eq!(*last, batch);
            }
        }
    });
}

#[test]
fn the_global_order_is_the_same_on_any_number_of_ranks() {
    for_every_case(|spec, world| {
        if spec.drop_last && spec.num_records < world * spec.batch_size {
            return;
        }
        // Read back from the ranks' batches, against one rank with batches of one record.
        let reference = positions_from_ranks(
            &OrderSpec {
                batch_size: 1,
                drop_last: false,
                ..spec.clone()
            },
            1,
            2,
        );
        let e = positions_from_ranks(spec, world, 2);
        let common = e.len().min(reference.len());
        assert_eq!(e[..common], reference[..common], "{spec:?} on {world}");
    });
}

#[test]
fn one_seed_and_epoch_always_give_the_same_order() {
    for_every_case(|spec, world| {
        if spec.drop_last && spec.num_records < world * spec.batch_size {
            return;
        }
        for rank in 0..world {
            let spec = on_rank(spec, rank, world);
            assert_eq!(batches(&spec, 4), batches(&spec, 4));
        }
    });
}

#[test]
fn epochs_and_seeds_change_the_order() {
    for shuffle in SHUFFLES.into_iter().skip(1) {
        for seed in SEEDS {
            let spec = spec(100, 8, false, shuffle, seed);
            let orders: HashSet<Vec<u64>> = (0..6).map(|e| global_order(&spec, e)).collect();
            assert_eq!(orders.len(), 6, "{spec:?}: six epochs, six orders");
            let reseeded = OrderSpec {
                seed: seed ^ 1,
                ..spec.clone()
            };
            assert_ne!(global_order(&spec, 0), global_order(&reseeded, 0));
        }
    }
    // Shuffled at all: not the file order.
    let random = global_order(&spec(100, 8, false, Shuffle::Random, 0), 0);
    assert_ne!(random, (0..100).collect::<Vec<_>>());
}

#[test]
fn block_records_stay_within_their_window() {
    for &n in &RECORD_COUNTS {
        for &(block, window) in &[(1, 1), (1, 5), (4, 3), (7, 2), (3, 100), (1000, 1), (5, 1)] {
            for seed in SEEDS {
                for epoch in 0..3 {
                    let spec = spec(n, 4, false, Shuffle::Block { block, window }, seed);
                    let order = EpochOrder::new(&spec, epoch).unwrap();
                    let Global::Block(blocks) = &order.global else {
                        unreachable!()
                    };
                    let p = global_order(&spec, epoch);
                    let mut position_of = vec![0; n as usize];
                    for (at, &record) in p.iter().enumerate() {
                        position_of[record as usize] = at as u64;
                    }
                    let num_blocks = n.div_ceil(block);
                    let ids: HashSet<u64> = (0..num_blocks).map(|b| blocks.order.get(b)).collect();
                    assert_eq!(
                        ids.len() as u64,
                        num_blocks,
                        "the block order is a permutation"
                    );
                    let mut q = 0; // the position of the block at `b` of the block order
                    for b in 0..num_blocks {
                        let id = blocks.order.get(b);
                        let w = (b / window) as usize;
                        let (start, end) = (blocks.starts[w], blocks.starts[w + 1]);
                        assert!(end - start <= window * block);
                        assert!(start <= q && q < end);
                        for record in id * block..n.min((id + 1) * block) {
                            let at = position_of[record as usize];
                            assert!(
                                start <= at && at < end,
                                "{spec:?}: record {record} at {at}, outside its window {start}..{end}"
                            );
                            assert!(at.abs_diff(q) < window * block);
                        }
                        q += block.min(n - id * block);
                    }
                    assert_eq!(q, n);
                }
            }
        }
    }
}

#[test]
fn block_shuffle_reads_whole_blocks_one_window_at_a_time() {
    // Without the internals: the records of any block lie within `window × block`
    // positions of each other, and a window of blocks is not read in file order.
    let (block, window) = (16, 4);
    let spec = spec(10_000, 32, false, Shuffle::Block { block, window }, 3);
    let p = global_order(&spec, 1);
    let mut span = vec![(u64::MAX, 0u64); 10_000usize.div_ceil(block as usize)];
    for (at, &record) in p.iter().enumerate() {
        let s = &mut span[(record / block) as usize];
        *s = (s.0.min(at as u64), s.1.max(at as u64));
    }
    assert!(span.iter().all(|(lo, hi)| hi - lo < window * block));
    assert!(p.windows(2).filter(|w| w[1] == w[0] + 1).count() < p.len() / 4);
}

#[test]
fn block_windows_read_in_any_order_and_from_many_threads_agree() {
    let spec = spec(
        5_000,
        7,
        false,
        Shuffle::Block {
            block: 5,
            window: 3,
        },
        11,
    );
    let forward = batches(&spec, 0);
    let order = EpochOrder::new(&spec, 0).unwrap();
    let backward: Vec<Vec<u64>> = (0..order.num_batches())
        .rev()
        .map(|i| order.batch(i).to_vec())
        .collect();
    assert!(backward.into_iter().rev().eq(forward.iter().cloned()));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (order, forward) = (&order, &forward);
            s.spawn(move || {
                for i in (t..order.num_batches()).step_by(4) {
                    assert_eq!(order.batch(i).to_vec(), forward[i as usize]);
                }
            });
        }
    });
}

#[test]
fn resuming_anywhere_gives_the_rest_of_the_epoch() {
    for_every_case(|spec, world| {
        if spec.drop_last && spec.num_records < world * spec.batch_size {
            return;
        }
        let spec = on_rank(spec, world / 2, world);
        let full = batches(&spec, 1);
        let every = (full.len() / 16).max(1);
        let points = (0..=full.len())
            .step_by(every)
            .chain([1, full.len() - 1, full.len()]);
        for done in points.map(|d| d as u64) {
            let at = Position {
                epoch: 1,
                batches_done: done,
                consumed: 0,
            };
            let (order, left) = EpochOrder::resume(&spec, at).unwrap();
            assert_eq!(left, done..full.len() as u64);
            let rest: Vec<Vec<u64>> = left.map(|i| order.batch(i).to_vec()).collect();
            assert_eq!(rest, full[done as usize..], "{spec:?} resumed after {done}");
        }
        let past = Position {
            epoch: 1,
            batches_done: full.len() as u64 + 1,
            consumed: 0,
        };
        assert!(EpochOrder::resume(&spec, past).is_err());
    });
}

#[test]
fn positions_convert_to_and_from_delivery_order() {
    assert_eq!(
        Position::after_seq(0, 4),
        Some(Position {
            epoch: 0,
            batches_done: 1,
            consumed: 0,
        })
    );
    assert_eq!(
        Position::after_seq(3, 4),
        Some(Position {
            epoch: 1,
            batches_done: 0,
            consumed: 0,
        })
    );
    assert_eq!(
        Position::after_seq(9, 4),
        Some(Position {
            epoch: 2,
            batches_done: 2,
            consumed: 0,
        })
    );
    assert_eq!(Position::after_seq(9, 0), None);
    for seq in 0..20 {
        let at = Position::after_seq(seq, 3).unwrap();
        assert_eq!(at.seq(3), Some(seq + 1));
    }
    assert_eq!(
        Position {
            epoch: u64::MAX,
            batches_done: 1,
            consumed: 0,
        }
        .seq(2),
        None
    );
}

#[test]
fn file_order_on_one_rank_is_the_loaders_range_plan() {
    for &n in &RECORD_COUNTS {
        for &batch in &BATCH_SIZES {
            for drop_last in [false, true] {
                let spec = spec(n, batch, drop_last, Shuffle::None, 5);
                // The loader's plan: batch i is records i·B .. min((i + 1)·B, n).
                let planned = if drop_last {
                    n / batch
                } else {
                    n.div_ceil(batch)
                };
                if planned == 0 {
                    assert!(EpochOrder::new(&spec, 0).is_err());
                    continue;
                }
                let order = EpochOrder::new(&spec, 9).unwrap();
                assert_eq!(order.num_batches(), planned);
                for i in 0..planned {
                    let first = i * batch;
                    let count = batch.min(n - first);
                    assert_eq!(order.batch(i), BatchRecords::Range { first, count });
                }
            }
        }
    }
}

#[test]
fn file_order_on_many_ranks_reads_ranges_except_for_padding() {
    for_every_case(|spec, world| {
        let n = spec.num_records;
        if spec.shuffle != Shuffle::None || (spec.drop_last && n < world * spec.batch_size) {
            return;
        }
        for rank in 0..world {
            let order = EpochOrder::new(&on_rank(spec, rank, world), 0).unwrap();
            for i in 0..order.num_batches() {
                let count = order.batch(i).len();
                let first = i * spec.batch_size * world + rank * count;
                let records = order.batch(i);
                let expected: Vec<u64> = (first..first + count).map(|g| g % n).collect();
                assert_eq!(records.to_vec(), expected);
                let padded = first + count > n;
                assert_eq!(matches!(records, BatchRecords::Range { .. }), !padded);
            }
        }
    });
}

#[test]
fn bad_specs_are_refused_with_a_reason() {
    let good = OrderSpec {
        world_size: 4,
        rank: 3,
        ..spec(100, 8, false, Shuffle::Random, 0)
    };
    assert!(EpochOrder::new(&good, 0).is_ok());
    let refused = |spec: OrderSpec, needle: &str| {
        let err = EpochOrder::new(&spec, 0).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    refused(
        OrderSpec {
            rank: 4,
            ..good.clone()
        },
        "rank 4",
    );
    refused(
        OrderSpec {
            world_size: 0,
            rank: 0,
            ..good.clone()
        },
        "world size",
    );
    refused(
        OrderSpec {
            batch_size: 0,
            ..good.clone()
        },
        "batch size",
    );
    refused(
        OrderSpec {
            shuffle: Shuffle::Block {
                block: 0,
                window: 2,
            },
            ..good.clone()
        },
        "block = 0",
    );
    refused(
        OrderSpec {
            shuffle: Shuffle::Block {
                block: 2,
                window: 0,
            },
            ..good.clone()
        },
        "window = 0",
    );
}

#[test]
fn specs_too_large_or_too_small_for_the_dataset_are_refused_with_a_reason() {
    let good = OrderSpec {
        world_size: 4,
        rank: 3,
        ..spec(100, 8, false, Shuffle::Random, 0)
    };
    let refused = |spec: OrderSpec, needle: &str| {
        let err = EpochOrder::new(&spec, 0).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    refused(
        OrderSpec {
            drop_last: true,
            batch_size: 26,
            ..good.clone()
        },
        "no batch",
    );
    refused(
        OrderSpec {
            drop_last: true,
            batch_size: u64::MAX,
            ..good.clone()
        },
        "no batch",
    );
    refused(
        OrderSpec {
            num_records: u64::MAX,
            shuffle: Shuffle::None,
            ..good.clone()
        },
        "overflow",
    );
    refused(
        OrderSpec {
            num_records: u64::MAX / 2,
            ..good.clone()
        },
        "cannot hold",
    );
    // File order needs no table, however large the dataset.
    let huge = OrderSpec {
        num_records: u64::MAX / 8,
        shuffle: Shuffle::None,
        ..good.clone()
    };
    let order = EpochOrder::new(&huge, 0).unwrap();
    assert_eq!(
        order.batch(order.num_batches() - 1).len(),
        order.num_records() - (order.num_batches() - 1) * 8
    );
}

#[test]
fn an_empty_dataset_has_no_batches() {
    let order = EpochOrder::new(&spec(0, 4, false, Shuffle::Random, 0), 0).unwrap();
    assert_eq!(order.num_batches(), 0);
    let order = EpochOrder::new(
        &spec(
            0,
            4,
            false,
            Shuffle::Block {
                block: 2,
                window: 2,
            },
            0,
        ),
        0,
    )
    .unwrap();
    assert_eq!(order.num_batches(), 0);
}

#[test]
fn epochs_whose_batch_numbers_overflow_are_refused() {
    let at = |epoch| Position {
        epoch,
        batches_done: 0,
        consumed: 0,
    };
    assert_eq!(Position::last_epoch_allowed(1), u64::MAX - 1);
    let bpe = 1000;
    let allowed = Position::last_epoch_allowed(bpe);
    assert!(at(allowed).check_epochs(1, bpe).is_ok());
    assert!(at(allowed)
        .seq(bpe)
        .and_then(|s| s.checked_add(bpe))
        .is_some());
    let err = at(allowed + 1).check_epochs(1, bpe).unwrap_err();
    assert!(err.to_string().contains(&allowed.to_string()), "{err}");
    assert!(at(allowed).check_epochs(2, bpe).is_err());
    assert!(at(0).check_epochs(u64::MAX, bpe).is_err());
    assert!(at(u64::MAX).check_epochs(1, 1).is_err());
}

#[test]
fn fingerprints_ignore_the_rank_only() {
    let base = OrderSpec {
        world_size: 4,
        ..spec(100, 8, false, Shuffle::Random, 0)
    };
    let print = base.fingerprint();
    assert_eq!(
        OrderSpec {
            rank: 2,
            ..base.clone()
        }
        .fingerprint(),
        print
    );
    for other in [
        OrderSpec {
            num_records: 101,
            ..base.clone()
        },
        OrderSpec {
            batch_size: 9,
            ..base.clone()
        },
        OrderSpec {
            drop_last: true,
            ..base.clone()
        },
        OrderSpec {
            shuffle: Shuffle::None,
            ..base.clone()
        },
        OrderSpec {
            shuffle: Shuffle::Block {
                block: 1,
                window: 1,
            },
            ..base.clone()
        },
        OrderSpec {
            seed: 1,
            ..base.clone()
        },
        OrderSpec {
            world_size: 5,
            ..base.clone()
        },
    ] {
        assert_ne!(other.fingerprint(), print, "{other:?}");
    }
}

/// Every rank's batches of `at`'s split (the rest of its epoch), rank by rank.
fn split_batches(spec: &OrderSpec, world_size: u64, at: Position) -> Vec<Vec<Vec<u64>>> {
    (0..world_size)
        .map(|r| {
            let (order, left) = EpochOrder::resume(&on_rank(spec, r, world_size), at).unwrap();
            left.map(|i| order.batch(i).to_vec()).collect()
        })
        .collect()
}

#[test]
fn an_elastic_resume_splits_the_rest_of_the_epoch_over_the_new_ranks() {
    const COUNTS: [u64; 7] = [1, 5, 8, 23, 25, 64, 101];
    for &n in &COUNTS {
        for &batch in &[1, 3, 4, 64] {
            for &shuffle in &SHUFFLES[..4] {
                for drop_last in [false, true] {
                    for &old in &WORLD_SIZES {
                        for &new in &WORLD_SIZES {
                            let spec = spec(n, batch, drop_last, shuffle, 5);
                            if drop_last && n < old * batch {
                                continue;
                            }
                            check_elastic(&spec, old, new);
                        }
                    }
                }
            }
        }
    }
}

fn check_elastic(spec: &OrderSpec, old: u64, new: u64) {
    let (n, batch, drop_last) = (spec.num_records, spec.batch_size, spec.drop_last);
    let p = global_order(spec, 2);
    let saved = on_rank(spec, 0, old);
    let steps = EpochOrder::new(&saved, 2).unwrap().num_batches();
    // Loop-invariant: the old ranks' epoch, the new rank's spec, the next epoch's start.
    let all = positions_from_ranks(&saved, old, 2);
    let to = on_rank(spec, 1 % new, new);
    let next_epoch = Position {
        epoch: 3,
        ..Position::default()
    };
    for done in 0..=steps {
        let at = Position {
            epoch: 2,
            batches_done: done,
            consumed: 0,
        };
        let before = &all[..((done * old * batch) as usize).min(all.len())];
        let moved = at.reshard(&saved, &to).unwrap();
        let what = format!("{spec:?} {old} -> {new} ranks after {done} steps");
        if old == new {
            assert_eq!(moved, at, "{what}");
            continue;
        }
        let c = done * old * batch;
        if done == steps {
            assert_eq!(moved, next_epoch, "{what}");
            continue;
        }
        assert!(c < n, "{what}: padding is never consumed");
        assert_eq!(
            before,
            &p[..c as usize],
            "{what}: the ranks read a prefix of P"
        );
        let left = n - c;
        if drop_last && left < new * batch {
            assert_eq!(moved, next_epoch, "{what}");
            continue;
        }
        assert_eq!(
            moved,
            Position {
                epoch: 2,
                batches_done: 0,
                consumed: c
            },
            "{what}"
        );
        let ranks = split_batches(spec, new, moved);
        let counts: Vec<usize> = ranks.iter().map(Vec::len).collect();
        assert!(
            counts.iter().all(|&k| k == counts[0] && k > 0),
            "{what}: {counts:?}"
        );
        // Step by step, rank by rank: the rest of P, then (drop_last = false) its start again
        // as padding; or (drop_last = true) short of its tail.
        let after = interleave(&ranks);
        let rest = &p[c as usize..];
        if drop_last {
            let kept = (left / (new * batch) * new * batch) as usize;
            assert_eq!(after, rest[..kept], "{what}");
        } else {
            let padded = after.len() - rest.len();
            assert!(padded < new as usize, "{what}: {padded} padded");
            assert_eq!(after[..rest.len()], *rest, "{what}");
            // Fewer than `new` records repeat, cycling through a short rest.
            let pad: Vec<u64> = (0..padded).map(|j| rest[j % rest.len()]).collect();
            assert_eq!(after[rest.len()..], pad, "{what}");
        }
    }
    // The next epoch is an ordinary one at the new world size.
    if old != new && (!drop_last || n >= new * batch) {
        assert_eq!(
            EpochOrder::new(&to, 3).unwrap().batch(0),
            EpochOrder::resume(&to, next_epoch).unwrap().0.batch(0)
        );
    }
}

#[test]
fn resharding_refuses_another_order_and_positions_past_the_epoch() {
    let saved = on_rank(&spec(100, 4, false, Shuffle::Random, 1), 0, 2);
    let at = Position {
        epoch: 0,
        batches_done: 3,
        consumed: 0,
    };
    let to = on_rank(&saved, 2, 3);
    assert!(at.reshard(&saved, &to).is_ok());
    for other in [
        OrderSpec {
            seed: 2,
            ..to.clone()
        },
        OrderSpec {
            batch_size: 5,
            ..to.clone()
        },
        OrderSpec {
            num_records: 99,
            ..to.clone()
        },
        OrderSpec {
            drop_last: true,
            ..to.clone()
        },
        OrderSpec {
            shuffle: Shuffle::None,
            ..to.clone()
        },
    ] {
        let err = at.reshard(&saved, &other).unwrap_err().to_string();
        assert!(err.contains("differs in more than the world size"), "{err}");
    }
    let past = Position {
        batches_done: 14,
        ..at
    };
    let err = past.reshard(&saved, &to).unwrap_err().to_string();
    assert!(err.contains("after batch 14"), "{err}");
    // A split starting past the epoch's end is refused, not wrapped.
    let beyond = Position {
        consumed: 100,
        ..at
    };
    assert!(EpochOrder::resume(&to, beyond).is_err());
}

#[test]
fn resharding_twice_carries_the_consumed_records_forward() {
    let spec = spec(103, 3, false, Shuffle::Random, 9);
    let first = Position {
        epoch: 0,
        batches_done: 2,
        consumed: 0,
    }
    .reshard(&on_rank(&spec, 0, 8), &on_rank(&spec, 0, 3))
    .unwrap();
    assert_eq!(first.consumed, 48);
    let second = Position {
        batches_done: 4,
        ..first
    }
    .reshard(&on_rank(&spec, 0, 3), &on_rank(&spec, 0, 2))
    .unwrap();
    assert_eq!(second.consumed, 48 + 4 * 3 * 3);
    let ranks = split_batches(&spec, 2, second);
    let mut after: Vec<u64> = ranks.concat().concat();
    assert_eq!(after.len(), 20, "19 records left over 2 ranks: one padded");
    after.sort_unstable();
    after.dedup();
    let mut rest = global_order(&spec, 0)[84..].to_vec();
    rest.sort_unstable();
    assert_eq!(after, rest);
    let (_, size) = on_rank(&spec, 0, 2).epoch_size(84).unwrap();
    assert_eq!(size, ranks[0].len() as u64);
}
