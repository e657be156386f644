//! The blend's rules: shares of every step, draws, exhaustion, curriculum, and the mixture's
//! reads (each record once a pass).

use std::collections::HashSet;
use std::sync::Arc;

use super::*;
use crate::{HostBuffer, Layout, Source};

fn names(n: usize) -> Vec<String> {
    ["web", "code", "math", "books", "news"][..n]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn spec(pass_len: Vec<u64>, mode: BlendMode, step: u64, weights: Vec<f64>) -> BlendSpec {
    BlendSpec {
        exhausted: vec![Exhausted::Cycle; pass_len.len()],
        pass_len,
        mode,
        seed: 3,
        step,
        curriculum: vec![(0, weights)],
        samples_per_epoch: None,
    }
}

fn sources_of(blend: &EpochBlend) -> Vec<u16> {
    blend
        .locate(0, blend.len())
        .iter()
        .map(|&(s, _)| s)
        .collect()
}

#[test]
fn every_exact_step_holds_each_share() {
    for step in [10u64, 20, 30, 60] {
        let mut sp = spec(
            vec![50, 70, 90],
            BlendMode::Exact,
            step,
            vec![0.5, 0.3, 0.2],
        );
        sp.samples_per_epoch = Some(1000 * step);
        let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
        let all = sources_of(&blend);
        assert_eq!(all.len() as u64, 1000 * step);
        for (t, chunk) in all.chunks(step as usize).enumerate() {
            let count = |s| chunk.iter().filter(|&&x| x == s).count() as u64;
            assert_eq!(
                [count(0), count(1), count(2)],
                [step / 2, step * 3 / 10, step / 5],
                "step {t} of {step}"
            );
        }
    }
}

#[test]
fn sampled_shares_come_within_one_percent() {
    let mut sp = spec(
        vec![50, 70, 90],
        BlendMode::Sampled,
        32,
        vec![0.5, 0.3, 0.2],
    );
    sp.samples_per_epoch = Some(1000 * 32);
    let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
    let all = sources_of(&blend);
    for (s, w) in [0.5, 0.3, 0.2].into_iter().enumerate() {
        let share = all.iter().filter(|&&x| x == s as u16).count() as f64 / all.len() as f64;
        assert!((share - w).abs() < 0.01, "source {s}: {share} for {w}");
    }
    // Steps are not exact: some step differs from the rounded shares.
    assert!(all
        .chunks(32)
        .any(|c| c.iter().filter(|&&x| x == 0).count() != 16));
}

/// Ordinals count each source's samples from 0 with no gap, and `given_before` agrees with
/// them; any range gives what single samples give.
fn check_ordinals(blend: &EpochBlend, n: usize) {
    let located = blend.locate(0, blend.len());
    let mut next = vec![0u64; n];
    for (i, &(s, k)) in located.iter().enumerate() {
        assert_eq!(k, next[usize::from(s)], "sample {i}");
        if i % 97 == 0 {
            assert_eq!(blend.given_before(i as u64), next, "before {i}");
            let one = blend.locate(i as u64, 1)[0];
            assert_eq!(one, (s, k));
        }
        next[usize::from(s)] += 1;
    }
    assert_eq!(blend.given_before(blend.len()), next);
    for (first, count) in [(0u64, 7u64), (13, 40), (4090, 20), (blend.len() - 5, 5)] {
        if first + count <= blend.len() {
            assert_eq!(
                blend.locate(first, count),
                located[first as usize..(first + count) as usize]
            );
        }
    }
}

#[test]
fn ordinals_are_consecutive_in_both_modes() {
    for mode in [BlendMode::Exact, BlendMode::Sampled] {
        let mut sp = spec(vec![50, 70, 90], mode, 12, vec![0.5, 0.3, 0.2]);
        sp.exhausted = vec![
            Exhausted::Cycle,
            Exhausted::Passes(30),
            Exhausted::Samples(2000),
        ];
        let blend = Blend::new(sp, &names(3)).unwrap().epoch(1).unwrap();
        check_ordinals(&blend, 3);
    }
}

#[test]
fn a_stopping_source_ends_the_epoch_where_it_would_repeat() {
    for mode in [BlendMode::Exact, BlendMode::Sampled] {
        let mut sp = spec(vec![100, 1000, 1000], mode, 10, vec![0.5, 0.3, 0.2]);
        sp.exhausted[0] = Exhausted::Stop;
        let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
        let given = blend.given_before(blend.len());
        assert_eq!(given[0], 100, "{mode:?}");
        if mode == BlendMode::Exact {
            // 10 steps of 5 / 3 / 2, and the 11th up to its first sample of "web".
            assert_eq!(blend.len(), 200);
            assert_eq!(given, [100, 60, 40]);
        }
        check_ordinals(&blend, 3);
    }
}

#[test]
fn a_source_with_a_set_number_leaves_and_the_others_fill_its_place() {
    let mut sp = spec(
        vec![40, 1000, 1000],
        BlendMode::Exact,
        10,
        vec![0.5, 0.3, 0.2],
    );
    sp.exhausted = vec![
        Exhausted::Passes(2),
        Exhausted::Cycle,
        Exhausted::Samples(100),
    ];
    let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
    let all = sources_of(&blend);
    let given = blend.given_before(blend.len());
    // "web" gives its two passes (80) in 16 steps, "math" its 100: the epoch ends when both
    // have, with "code" filling the steps between.
    assert_eq!((given[0], given[2]), (80, 100));
    let steps: Vec<&[u16]> = all.chunks(10).collect();
    assert_eq!(steps[16].iter().filter(|&&s| s == 0).count(), 0);
    // After "web" left, 0.3 : 0.2 of 10 is 6 and 4.
    assert_eq!(steps[16].iter().filter(|&&s| s == 1).count(), 6);
    // The step in which "math" gives its last is filled by "code"; the epoch ends with it.
    assert_eq!(blend.len() % 10, 0);
    assert_eq!(blend.len(), all.len() as u64);
    check_ordinals(&blend, 3);
}

#[test]
fn curriculum_changes_the_shares_from_its_step_across_epochs() {
    let mut sp = spec(vec![30, 30], BlendMode::Exact, 10, vec![0.5, 0.5]);
    sp.samples_per_epoch = Some(100); // 10 steps an epoch
    sp.curriculum.push((15, vec![0.9, 0.1]));
    let blend = Blend::new(sp, &names(2)).unwrap();
    let (e0, e1) = (blend.epoch(0).unwrap(), blend.epoch(1).unwrap());
    assert_eq!(e1.first_step(), 10);
    let all = sources_of(&e1);
    let web = |t: usize| all[t * 10..t * 10 + 10].iter().filter(|&&s| s == 0).count();
    assert_eq!((web(4), web(5), web(9)), (5, 9, 9));
    assert!(sources_of(&e0)
        .chunks(10)
        .all(|c| c.iter().filter(|&&s| s == 0).count() == 5));
    check_ordinals(&e1, 2);
}

#[test]
fn one_step_of_the_whole_epoch_is_megatrons_blend() {
    // A step as long as the epoch is BlendedDataset's exhaustive blend of the rounded counts.
    let weights = vec![0.43, 0.31, 0.26];
    let mut sp = spec(vec![9, 9, 9], BlendMode::Exact, 997, weights.clone());
    sp.samples_per_epoch = Some(997);
    let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
    assert_eq!(
        sources_of(&blend),
        exhaustive_order(&rounded_counts(&weights, 997))
    );
}

#[test]
fn epochs_and_seeds_draw_differently() {
    let mut sp = spec(vec![5, 5], BlendMode::Sampled, 8, vec![0.5, 0.5]);
    sp.samples_per_epoch = Some(256);
    let blend = Blend::new(sp.clone(), &names(2)).unwrap();
    let (a, b) = (blend.epoch(0).unwrap(), blend.epoch(1).unwrap());
    assert_ne!(sources_of(&a), sources_of(&b));
    assert_eq!(sources_of(&a), sources_of(&blend.epoch(0).unwrap()));
    sp.seed = 4;
    let c = Blend::new(sp, &names(2)).unwrap().epoch(0).unwrap();
    assert_ne!(sources_of(&a), sources_of(&c));
}

#[test]
fn bad_specs_are_refused_by_name() {
    let ok = spec(vec![5, 5], BlendMode::Exact, 8, vec![0.5, 0.5]);
    let refused = |sp: BlendSpec| Blend::new(sp, &names(2)).unwrap_err().to_string();
    assert!(refused(ok.clone()).contains("every source of the mixture cycles"));
    let mut sp = ok.clone();
    sp.samples_per_epoch = Some(10);
    sp.curriculum[0].1[1] = f64::NAN;
    assert!(refused(sp).contains("\"code\""));
    let mut sp = ok.clone();
    sp.samples_per_epoch = Some(10);
    sp.curriculum.push((0, vec![1.0, 0.0]));
    assert!(refused(sp).contains("increase"));
    let mut sp = ok;
    sp.exhausted[0] = Exhausted::Stop;
    sp.curriculum[0].1 = vec![0.0, 0.0];
    assert!(refused(sp).contains("all 0"));
}

fn host_source(first: u8, n: u64) -> Arc<dyn Source> {
    let layout = Layout::new(crate::dtype::parse_user_dtype("<u2").unwrap().0, vec![2]).unwrap();
    // Record r holds (first, r) as two uint16.
    let data = (0..n)
        .flat_map(|r| [u16::from(first), r as u16])
        .flat_map(u16::to_le_bytes)
        .collect();
    Arc::new(HostBuffer::from_vec(data, layout).unwrap())
}

fn read_all(m: &Mixture) -> Vec<(u16, u16)> {
    let mut buf = vec![0u8; m.num_records() as usize * 4];
    // In uneven pieces, as reader threads would.
    let mut first = 0;
    for piece in [1usize, 7, 64, 3].iter().cycle() {
        let count = (*piece as u64).min(m.num_records() - first);
        let (a, b) = (first as usize * 4, (first + count) as usize * 4);
        m.read_records(first, &mut buf[a..b]).unwrap();
        first += count;
        if first == m.num_records() {
            break;
        }
    }
    buf.chunks(4)
        .map(|c| {
            (
                u16::from_le_bytes([c[0], c[1]]),
                u16::from_le_bytes([c[2], c[3]]),
            )
        })
        .collect()
}

#[test]
fn each_record_comes_once_a_pass_and_passes_differ() {
    let mut sp = spec(vec![37, 50, 20], BlendMode::Exact, 10, vec![0.5, 0.3, 0.2]);
    sp.exhausted[1] = Exhausted::Stop;
    let blend = Blend::new(sp, &names(3)).unwrap().epoch(0).unwrap();
    let sources = vec![host_source(0, 37), host_source(1, 50), host_source(2, 20)];
    let m = Mixture::new(names(3), sources, blend, true).unwrap();
    let got = read_all(&m);
    for (s, n) in [(0u16, 37usize), (1, 50), (2, 20)] {
        let records: Vec<u16> = got.iter().filter(|r| r.0 == s).map(|r| r.1).collect();
        for (p, pass) in records.chunks(n).enumerate() {
            let seen: HashSet<u16> = pass.iter().copied().collect();
            assert_eq!(
                seen.len(),
                pass.len(),
                "source {s} pass {p} repeats a record"
            );
            if pass.len() == n {
                assert_eq!(seen, (0..n as u16).collect(), "source {s} pass {p}");
            }
        }
        if records.len() >= 2 * n {
            assert_ne!(
                records[..n],
                records[n..2 * n],
                "source {s}: passes in one order"
            );
        }
    }
    // "code" stops the epoch after its one pass.
    assert_eq!(got.iter().filter(|r| r.0 == 1).count(), 50);
    let stats = m.source_stats();
    assert_eq!(
        stats.iter().map(|s| s.samples).sum::<u64>(),
        m.num_records()
    );
    assert_eq!(stats[1].bytes, 50 * 4);
}

#[test]
fn the_source_slowest_per_sample_is_named() {
    let of = |name: &str, samples, millis| SourceStats {
        name: name.into(),
        samples,
        read_time: std::time::Duration::from_millis(millis),
        ..SourceStats::default()
    };
    // "code" gives 30% of the samples in 60% of the time.
    let stats = [of("web", 50, 30), of("code", 30, 60), of("math", 20, 10)];
    assert_eq!(
        holding_back(&stats).unwrap(),
        "source \"code\" holds the mixture back: 60% of the reading time for 30% of the samples"
    );
    // Reading at one rate per sample, no source is named.
    let even = [of("web", 50, 50), of("code", 30, 31), of("math", 20, 19)];
    assert_eq!(holding_back(&even), None);
    assert_eq!(holding_back(&[of("web", 0, 0)]), None);
}

#[test]
fn sources_of_another_layout_are_refused_by_name() {
    let mut sp = spec(vec![4, 4], BlendMode::Exact, 2, vec![0.5, 0.5]);
    sp.samples_per_epoch = Some(8);
    let blend = Blend::new(sp, &names(2)).unwrap().epoch(0).unwrap();
    let layout = Layout::new(crate::dtype::parse_user_dtype("<u2").unwrap().0, vec![3]).unwrap();
    let other: Arc<dyn Source> = Arc::new(HostBuffer::from_vec(vec![0; 24], layout).unwrap());
    let err = Mixture::new(names(2), vec![host_source(0, 4), other], blend, false).unwrap_err();
    assert!(err.to_string().contains("\"code\""), "{err}");
}

#[test]
fn a_gather_to_places_reads_and_counts_what_reads_of_each_sample_do() {
    for mode in [BlendMode::Exact, BlendMode::Sampled] {
        let mut sp = spec(vec![37, 50, 20], mode, 10, vec![0.5, 0.3, 0.2]);
        sp.samples_per_epoch = Some(200);
        let blend = |sp: &BlendSpec| Blend::new(sp.clone(), &names(3)).unwrap().epoch(0).unwrap();
        let sources = || vec![host_source(0, 37), host_source(1, 50), host_source(2, 20)];
        let one = Mixture::new(names(3), sources(), blend(&sp), true).unwrap();
        let gathered = Mixture::new(names(3), sources(), blend(&sp), true).unwrap();
        // Runs of samples, as a loader batch of several steps holds them, and single ones.
        let records: Vec<(u64, usize)> = (20..30)
            .chain(60..70)
            .chain([5, 199, 100])
            .zip([
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 25, 27, 30,
            ])
            .collect();
        let mut dst = vec![0xeeu8; 31 * 4];
        gathered.gather_at(&records, &mut dst).unwrap();
        for (place, got) in dst.chunks(4).enumerate() {
            match records.iter().find(|r| r.1 == place) {
                Some(&(i, _)) => {
                    let mut want = [0u8; 4];
                    one.read_records(i, &mut want).unwrap();
                    assert_eq!(got, want, "{mode:?} place {place}");
                }
                None => assert_eq!(got, [0xee; 4], "{mode:?} place {place}"),
            }
        }
        let samples = |m: &Mixture| {
            m.source_stats()
                .iter()
                .map(|s| s.samples)
                .collect::<Vec<_>>()
        };
        assert_eq!(samples(&gathered), samples(&one), "{mode:?}");
        let err = gathered.gather_at(&[(200, 0)], &mut dst).unwrap_err();
        assert!(
            matches!(err, crate::SourceError::OutOfRange { .. }),
            "{err}"
        );
    }
}
