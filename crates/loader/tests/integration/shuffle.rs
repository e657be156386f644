//! Shuffled and sharded loaders deliver what the order says, and resume exactly.

use std::sync::Arc;

use pinfeed::{EpochOrder, Loader, LoaderOptions, OrderSpec, Position, Shuffle};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{HostBuffer, Layout, Source};

use crate::common::host_options;

/// Records of 16 bytes whose first 8 hold their own index.
fn numbered(n: u64) -> Arc<dyn Source> {
    let data: Vec<u8> = (0..n)
        .flat_map(|i| [i.to_le_bytes(), (!i).to_le_bytes()].concat())
        .collect();
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    Arc::new(HostBuffer::from_vec(data, Layout::new(dtype, vec![16]).unwrap()).unwrap())
}

/// The record indices a loader delivers, batch by batch, checking each record is intact.
fn delivered(loader: Loader) -> Vec<Vec<u64>> {
    loader
        .map(|b| {
            let b = b.unwrap();
            b.host_bytes()
                .unwrap()
                .unwrap()
                .chunks_exact(16)
                .map(|r| {
                    let i = u64::from_le_bytes(r[..8].try_into().unwrap());
                    assert_eq!(
                        u64::from_le_bytes(r[8..].try_into().unwrap()),
                        !i,
                        "record {i} torn"
                    );
                    i
                })
                .collect()
        })
        .collect()
}

fn options(shuffle: Shuffle, batch: usize, seed: u64, rank: u64, world: u64) -> LoaderOptions {
    LoaderOptions {
        shuffle,
        seed,
        rank,
        world_size: world,
        num_threads: Some(3),
        ..host_options(batch)
    }
}

#[test]
fn every_record_once_per_epoch_across_ranks() {
    let n = 1000;
    let source = numbered(n);
    for shuffle in [
        Shuffle::Random,
        Shuffle::Block {
            block: 16,
            window: 4,
        },
        Shuffle::None,
    ] {
        for world in [1, 2, 3, 8] {
            for seed in [0, 7] {
                let mut seen = vec![0u32; n as usize];
                let mut batches_per_rank = Vec::new();
                for rank in 0..world {
                    let o = options(shuffle, 32, seed, rank, world);
                    let spec = OrderSpec {
                        num_records: n,
                        batch_size: 32,
                        drop_last: false,
                        shuffle,
                        seed,
                        rank,
                        world_size: world,
                    };
                    let expected = EpochOrder::new(&spec, 0).unwrap();
                    let got = delivered(Loader::new(Arc::clone(&source), o).unwrap());
                    batches_per_rank.push(got.len());
                    for (i, batch) in got.iter().enumerate() {
                        assert_eq!(
                            batch,
                            &expected.batch(i as u64).to_vec(),
                            "{shuffle:?} world {world} rank {rank} batch {i}"
                        );
                        for &r in batch {
                            seen[r as usize] += 1;
                        }
                    }
                }
                assert!(
                    batches_per_rank.windows(2).all(|w| w[0] == w[1]),
                    "{batches_per_rank:?}"
                );
                let padded = (n.div_ceil(world) * world - n) as usize;
                let twice = seen.iter().filter(|&&c| c == 2).count();
                assert!(
                    seen.iter().all(|&c| c == 1 || c == 2),
                    "{shuffle:?} world {world}"
                );
                assert_eq!(
                    twice, padded,
                    "{shuffle:?} world {world}: only the documented padding repeats"
                );
            }
        }
    }
}

#[test]
fn epochs_differ_and_seeds_repeat() {
    let source = numbered(500);
    let run = |seed| {
        let o = LoaderOptions {
            epochs: 2,
            ..options(Shuffle::Random, 50, seed, 0, 1)
        };
        delivered(Loader::new(Arc::clone(&source), o).unwrap()).concat()
    };
    let a = run(3);
    assert_eq!(a, run(3), "same seed, same order");
    assert_ne!(a[..500], a[500..], "epochs differ");
    assert_ne!(a, run(4), "seeds differ");
    let mut first = a[..500].to_vec();
    first.sort_unstable();
    assert_eq!(first, (0..500).collect::<Vec<u64>>());
}

#[test]
fn resuming_at_any_point_gives_the_rest_exactly() {
    let source = numbered(300);
    let full = delivered(
        Loader::new(
            Arc::clone(&source),
            LoaderOptions {
                epochs: 2,
                ..options(Shuffle::Random, 32, 9, 1, 2)
            },
        )
        .unwrap(),
    );
    let per_epoch = full.len() as u64 / 2;
    for done in 0..full.len() as u64 {
        let start = Position {
            epoch: done / per_epoch,
            batches_done: done % per_epoch,
            consumed: 0,
        };
        let o = LoaderOptions {
            epochs: 2 - start.epoch,
            start,
            ..options(Shuffle::Random, 32, 9, 1, 2)
        };
        let rest = delivered(Loader::new(Arc::clone(&source), o).unwrap());
        assert_eq!(rest, full[done as usize..], "resumed after {done} batches");
    }
}

#[test]
fn batches_report_where_to_resume() {
    let source = numbered(100);
    let loader = Loader::new(
        source,
        LoaderOptions {
            epochs: 2,
            ..options(Shuffle::Random, 30, 1, 0, 1)
        },
    )
    .unwrap();
    let positions: Vec<Position> = loader.map(|b| b.unwrap().position_after()).collect();
    assert_eq!(positions.len(), 8);
    assert_eq!(
        positions[3],
        Position {
            epoch: 0,
            batches_done: 4,
            consumed: 0,
        }
    );
    assert_eq!(
        positions[4],
        Position {
            epoch: 1,
            batches_done: 1,
            consumed: 0,
        }
    );
}

/// One process, several devices: each gets its shard, in step, and together (with the other
/// processes) they deliver every record of an epoch once, apart from the documented padding.
#[test]
fn several_devices_in_one_process_split_the_epoch() {
    use pinfeed::{DeviceSpec, MultiLoader};
    let n = 1000;
    let source = numbered(n);
    for (processes, devices) in [(1u64, 3usize), (2, 2), (3, 1)] {
        let mut seen = vec![0u32; n as usize];
        let mut steps = Vec::new();
        for rank in 0..processes {
            let o = LoaderOptions {
                pinned_budget: 4 << 20,
                ..options(Shuffle::Random, 32, 11, rank, processes)
            };
            let multi =
                MultiLoader::new(Arc::clone(&source), o, &vec![DeviceSpec::Cpu; devices]).unwrap();
            let mut count = 0;
            for step in multi {
                let step = step.unwrap();
                assert_eq!(step.len(), devices);
                for batch in step {
                    for r in batch.host_bytes().unwrap().unwrap().chunks_exact(16) {
                        seen[u64::from_le_bytes(r[..8].try_into().unwrap()) as usize] += 1;
                    }
                }
                count += 1;
            }
            steps.push(count);
        }
        let shards = processes * devices as u64;
        assert!(steps.windows(2).all(|w| w[0] == w[1]), "{steps:?}");
        assert!(seen.iter().all(|&c| c == 1 || c == 2));
        assert_eq!(
            seen.iter().filter(|&&c| c == 2).count() as u64,
            n.div_ceil(shards) * shards - n
        );
    }
}

/// The loader's order is the one its options name: the fingerprint a checkpoint keeps can be
/// taken from either, and does not depend on the rank.
#[test]
fn the_loaders_order_spec_is_its_options_order() {
    let source = numbered(100);
    let options = |rank| LoaderOptions {
        shuffle: Shuffle::Random,
        seed: 11,
        rank,
        world_size: 2,
        ..host_options(8)
    };
    let loader = Loader::new(Arc::clone(&source), options(1)).unwrap();
    assert_eq!(loader.order_spec(), &options(1).order_spec(100));
    assert_eq!(loader.order_spec().rank, 1);
    assert_eq!(
        loader.order_spec().fingerprint(),
        options(0).order_spec(100).fingerprint()
    );
    let other_seed = LoaderOptions {
        seed: 12,
        ..options(1)
    };
    assert_ne!(
        loader.order_spec().fingerprint(),
        other_seed.order_spec(100).fingerprint()
    );
}
