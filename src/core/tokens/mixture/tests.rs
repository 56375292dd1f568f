use super::*;
use crate::pcg::DEFAULT_SEQ;
use crate::tokens::ShardWriter;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn write(dir: &Path, name: &str, ids: &[u32], vocab: u32) -> PathBuf {
    let path = dir.join(name);
    let mut w = ShardWriter::create(&path, vocab).unwrap();
    w.push(ids).unwrap();
    w.finish().unwrap();
    path
}

/// Source `s`'s shard `k` holds `s * 100_000 + k * 1000 + i` at position `i`, so an id
/// names its source, shard and position.
fn tagged(dir: &Path, lens: &[&[usize]]) -> Vec<Vec<PathBuf>> {
    lens.iter()
        .enumerate()
        .map(|(s, shards)| {
            shards
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let ids: Vec<u32> = (0..n)
                        .map(|i| (s * 100_000 + k * 1000 + i) as u32)
                        .collect();
                    write(dir, &format!("src{s}_{k}.bin"), &ids, 1_000_000)
                })
                .collect()
        })
        .collect()
}

fn sources(paths: &[Vec<PathBuf>]) -> Vec<MixtureSource> {
    paths
        .iter()
        .enumerate()
        .map(|(j, ps)| MixtureSource {
            name: format!("source{j}"),
            shards: ps.iter().map(|p| Shard::open(p, None).unwrap()).collect(),
        })
        .collect()
}

fn stage(batch: u64, weights: &[f64]) -> Stage {
    Stage {
        batch,
        weights: weights.to_vec(),
    }
}

fn mixture(
    paths: &[Vec<PathBuf>],
    stages: &[Stage],
    t: usize,
    b: usize,
    ranks: Ranks,
    order: ShardOrder,
) -> Result<Mixture, TokensError> {
    Mixture::new(
        sources(paths),
        stages,
        t,
        b,
        Pcg32::seed(11, DEFAULT_SEQ),
        None,
        MixtureOptions { ranks, order },
    )
}

/// The rule written again from scale.md's words, independently of `rule.rs`: for
/// each window, every source's lag `w_j * (k + 1) - n_j`; the first source whose lag
/// is at least every other's wins.
fn reference(stages: &[Stage], global_batch: u64, count: u64) -> Vec<usize> {
    let mut out = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let mut start = 0u64;
    let mut current: Option<usize> = None;
    for g in 0..count {
        let batch = g / global_batch;
        let k_stage = (0..stages.len())
            .filter(|&k| stages[k].batch <= batch)
            .max()
            .unwrap();
        if current != Some(k_stage) && g % global_batch == 0 {
            current = Some(k_stage);
            start = g;
            counts = vec![0; stages[k_stage].weights.len()];
        }
        let w = &stages[current.unwrap()].weights;
        let k = (g - start) as f64;
        let lags: Vec<f64> = (0..w.len())
            .map(|j| w[j] * (k + 1.0) - counts[j] as f64)
            .collect();
        let j = (0..w.len())
            .find(|&j| lags.iter().all(|&other| lags[j] >= other))
            .unwrap();
        counts[j] += 1;
        out.push(j);
    }
    out
}

/// Random weights summing to 1: positive integers over their sum.
fn weights_strategy(max_sources: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(1u32..50, 1..=max_sources).prop_map(|raw| {
        let sum: u32 = raw.iter().sum();
        raw.iter().map(|&r| f64::from(r) / f64::from(sum)).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The rule's sequence equals the reference on random weights, stages and global
    /// batches, and every global batch holds each source's share within two windows.
    #[test]
    fn the_rule_is_the_reference_and_every_batch_holds_its_share(
        w0 in weights_strategy(6),
        later in prop::collection::vec((1u64..8, 1u32..50), 0..3),
        global_batch in 1u64..40,
        batches in 1u64..30,
    ) {
        let n = w0.len();
        let mut stages = vec![stage(0, &w0)];
        let mut at = 0;
        for (step, seed) in later {
            at += step;
            // Another weight vector of the same length, rotated and reweighted.
            let raw: Vec<f64> = (0..n).map(|j| f64::from(1 + (seed + j as u32 * 7) % 13)).collect();
            let sum: f64 = raw.iter().sum();
            stages.push(stage(at, &raw.iter().map(|r| r / sum).collect::<Vec<_>>()));
        }
        let stages = check_stages(&stages, n).unwrap();
        let count = global_batch * batches;
        let got = sources_of(&stages, global_batch, count);
        prop_assert_eq!(&got, &reference(&stages, global_batch, count));
        for b in 0..batches {
            let w = &stages[stage_at(&stages, b)].weights;
            let window = &got[(b * global_batch) as usize..((b + 1) * global_batch) as usize];
            for (j, &wj) in w.iter().enumerate() {
                let held = window.iter().filter(|&&s| s == j).count() as f64;
                let share = wj * global_batch as f64;
                prop_assert!((held - share).abs() <= 2.0,
                    "batch {b}: source {j} holds {held}, its share is {share}");
            }
        }
    }
}

#[test]
fn ties_go_to_the_lowest_source_and_the_rule_needs_no_generator() {
    let stages = check_stages(&[stage(0, &[0.5, 0.5])], 2).unwrap();
    assert_eq!(sources_of(&stages, 4, 8), [0, 1, 0, 1, 0, 1, 0, 1]);
    let stages = check_stages(&[stage(0, &[0.6, 0.3, 0.1])], 3).unwrap();
    let got = sources_of(&stages, 10, 10);
    assert_eq!(got.iter().filter(|&&s| s == 0).count(), 6);
    assert_eq!(got.iter().filter(|&&s| s == 2).count(), 1);
}

fn run(m: &mut Mixture, n: usize) -> Vec<MixtureBatch> {
    (0..n).map(|_| m.next_batch().unwrap()).collect()
}

fn three(dir: &Path) -> Vec<Vec<PathBuf>> {
    tagged(dir, &[&[23, 9, 40], &[17], &[12, 31]])
}

#[test]
fn each_window_is_its_sources_own_stream() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.5, 0.3, 0.2])];
    let mut m = mixture(&paths, &stages, 4, 5, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
    let batches = run(&mut m, 12);
    let expected = sources_of(&check_stages(&stages, 3).unwrap(), 5, 60);
    // Source j alone, one window per batch, from source_rng(j).
    let mut alone: Vec<TokenStream> = (0..3)
        .map(|j| {
            let shards = paths[j]
                .iter()
                .map(|p| Shard::open(p, None).unwrap())
                .collect();
            TokenStream::new(
                shards,
                4,
                1,
                source_rng(&Pcg32::seed(11, DEFAULT_SEQ), j),
                None,
            )
            .unwrap()
        })
        .collect();
    let mut g = 0;
    for batch in &batches {
        for (row, origin) in batch.origins.iter().enumerate() {
            assert_eq!(origin.source, expected[g]);
            let own = alone[origin.source].next_batch().unwrap();
            assert_eq!(batch.batch.input_row(row).unwrap(), &own.inputs[..]);
            assert_eq!(batch.batch.target_row(row).unwrap(), &own.targets[..]);
            assert_eq!(own.inputs[0] as usize / 100_000, origin.source);
            g += 1;
        }
    }
    // Source 1 (17 ids, T 4) ran out many times and started its next epochs.
    assert!(alone[1].cursor().offset < 17);
}

/// Bitwise resume at every batch, in order and shuffled, across a stage boundary.
#[test]
fn resume_is_bitwise_at_every_batch_across_a_stage_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.6, 0.3, 0.1]), stage(5, &[0.2, 0.2, 0.6])];
    for order in [ShardOrder::InOrder, ShardOrder::Shuffled] {
        let mut one = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, order).unwrap();
        let all = run(&mut one, 12);
        for k in 0..12 {
            let mut first = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, order).unwrap();
            run(&mut first, k);
            let text = first.cursor().to_json();
            let cursor = MixtureCursor::from_json(&text).unwrap();
            assert_eq!(cursor, first.cursor());
            let mut second = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, order).unwrap();
            second.restore(&cursor, false).unwrap();
            assert_eq!(run(&mut second, 12 - k), all[k..], "order {order:?} k {k}");
        }
    }
}

/// 2 → 3 → 1 ranks with one global batch: the union of the ranks' windows is one
/// process's stream, batch by batch, and every rank's cursor is the same.
#[test]
fn ranks_tile_one_process_and_resume_elastically() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.5, 0.25, 0.25]), stage(3, &[0.1, 0.1, 0.8])];
    let order = ShardOrder::Shuffled;
    let mut single = mixture(&paths, &stages, 3, 6, Ranks::SINGLE, order).unwrap();
    let all = run(&mut single, 9);
    let mut cursor: Option<MixtureCursor> = None;
    for (phase, world) in [2usize, 3, 1].into_iter().enumerate() {
        let b = 6 / world;
        let mut ranks: Vec<Mixture> = (0..world)
            .map(|rank| {
                let mut m = mixture(
                    &paths,
                    &stages,
                    3,
                    b,
                    Ranks {
                        rank,
                        world_size: world,
                    },
                    order,
                )
                .unwrap();
                if let Some(c) = &cursor {
                    m.restore(c, false).unwrap();
                }
                m
            })
            .collect();
        for step in 0..3 {
            let want = &all[phase * 3 + step];
            let mut inputs = Vec::new();
            let mut origins = Vec::new();
            for m in &mut ranks {
                let got = m.next_batch().unwrap();
                inputs.extend(got.batch.inputs);
                origins.extend(got.origins);
            }
            assert_eq!(inputs, want.batch.inputs, "world {world} step {step}");
            assert_eq!(origins, want.origins);
        }
        let c0 = ranks[0].cursor();
        assert!(ranks.iter().all(|m| m.cursor() == c0));
        cursor = Some(c0);
    }
}

#[test]
fn bad_weights_are_refused_naming_the_rule() {
    let cases: [(&[f64], &str); 6] = [
        (&[0.5, -0.5, 1.0], "finite number above 0"),
        (&[0.0, 1.0], "finite number above 0"),
        (&[f64::NAN, 1.0], "finite number above 0"),
        (&[f64::INFINITY, 1.0], "finite number above 0"),
        (&[0.6, 0.3], "sum to"),
        (&[0.5, 0.6], "sum to"),
    ];
    for (w, needle) in cases {
        let e = check_stages(&[stage(0, w)], w.len())
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{w:?}: {e}");
    }
    let e = check_stages(&[stage(0, &[1.0])], 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 weight(s) for 2 source(s)"), "{e}");
    let e = check_stages(&[stage(1, &[1.0])], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("must start at 0"), "{e}");
    let e = check_stages(&[stage(0, &[1.0]), stage(0, &[1.0])], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("increasing"), "{e}");
    // Within the tolerance, normalised.
    let ok = check_weights(&[0.5, 0.5000001], 2, "stage 0").unwrap();
    assert!((ok.iter().sum::<f64>() - 1.0).abs() < 1e-15);
}

#[test]
fn a_source_without_shards_or_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let mut srcs = sources(&paths);
    srcs[1].shards.clear();
    let e = Mixture::new(
        srcs,
        &[stage(0, &[0.5, 0.3, 0.2])],
        3,
        2,
        Pcg32::seed(1, DEFAULT_SEQ),
        None,
        MixtureOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("source 1 (source1) has no shards"), "{e}");
    let other = write(dir.path(), "v.bin", &(0..50).collect::<Vec<_>>(), 50_000);
    let mut srcs = sources(&paths);
    srcs[2].shards = vec![Shard::open(&other, None).unwrap()];
    let e = Mixture::new(
        srcs,
        &[stage(0, &[0.5, 0.3, 0.2])],
        3,
        2,
        Pcg32::seed(1, DEFAULT_SEQ),
        None,
        MixtureOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, TokensError::MixedVocab { .. }), "{e}");
    assert!(e.to_string().contains("v.bin"), "{e}");
}

#[test]
fn a_cursor_of_another_mixture_is_refused_naming_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.5, 0.3, 0.2])];
    let mut m = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
    run(&mut m, 3);
    let cursor = m.cursor();

    let other_weights = [stage(0, &[0.2, 0.3, 0.5])];
    let mut w = mixture(
        &paths,
        &other_weights,
        3,
        4,
        Ranks::SINGLE,
        ShardOrder::InOrder,
    )
    .unwrap();
    let before = w.cursor();
    let e = w.restore(&cursor, false).unwrap_err().to_string();
    assert!(
        e.contains("[0.5, 0.3, 0.2] from batch 0") && e.contains("[0.2, 0.3, 0.5]"),
        "{e}"
    );
    assert_eq!(w.cursor(), before, "a refused cursor changes nothing");

    let mut swapped = paths.clone();
    swapped[1] = paths[0].clone();
    let mut s = mixture(&swapped, &stages, 3, 4, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
    let e = s.restore(&cursor, false).unwrap_err().to_string();
    assert!(e.contains("source 1 (source1) has other shards"), "{e}");

    let two = vec![paths[0].clone(), paths[1].clone()];
    let mut t = mixture(
        &two,
        &[stage(0, &[0.5, 0.5])],
        3,
        4,
        Ranks::SINGLE,
        ShardOrder::InOrder,
    )
    .unwrap();
    let e = t.restore(&cursor, true).unwrap_err().to_string();
    assert!(e.contains("3 source(s), this one has 2"), "{e}");

    // On purpose: each source resumes where it was, a new stage starts now.
    w.restore(&cursor, true).unwrap();
    let resumed = w.cursor();
    assert_eq!(resumed.window, cursor.window);
    assert_eq!(resumed.stage_start, cursor.window);
    assert_eq!(resumed.counts, [0, 0, 0]);
    for (a, b) in resumed.sources.iter().zip(&cursor.sources) {
        assert_eq!(a.cursor, b.cursor);
    }
    let next = w.next_batch().unwrap();
    let fresh = sources_of(&check_stages(&other_weights, 3).unwrap(), 4, 4);
    let got: Vec<usize> = next.origins.iter().map(|o| o.source).collect();
    assert_eq!(got, fresh);
}

#[test]
fn a_tampered_cursor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.5, 0.3, 0.2])];
    let mut m = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
    run(&mut m, 2);
    let good = m.cursor();
    let mut counts = good.clone();
    counts.counts[0] += 1;
    let mut window = good.clone();
    window.window += 1;
    let mut stage_ahead = good.clone();
    stage_ahead.stage = 1;
    let mut global = good.clone();
    global.global_batch = NonZeroU64::new(8).unwrap();
    let mut shard = good.clone();
    shard.sources[2].cursor.shard = 9;
    for (c, needle) in [
        (counts, "counts"),
        (window, "multiple of the global batch"),
        (stage_ahead, "not a stage"),
        (global, "global_batch is 8"),
        (shard, "source 2 (source2)"),
    ] {
        let mut fresh = mixture(&paths, &stages, 3, 4, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
        let before = fresh.cursor();
        let e = fresh.restore(&c, false).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle}: {e}");
        assert_eq!(fresh.cursor(), before);
    }
    for text in [
        r#"{"window":0}"#.to_string(),
        format!("{}x", good.to_json()),
        good.to_json()
            .replace("\"window\"", "\"extra\":1,\"window\""),
    ] {
        assert!(MixtureCursor::from_json(&text).is_err(), "accepted {text}");
    }
}

#[test]
fn appending_a_source_keeps_the_others_generators() {
    let rng = Pcg32::seed(5, DEFAULT_SEQ);
    let a: Vec<Pcg32> = (0..3).map(|j| source_rng(&rng, j)).collect();
    assert_ne!(a[0], a[1]);
    assert_ne!(a[1], a[2]);
    assert_eq!(source_rng(&rng, 1), a[1]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Skipping n global batches of a mixture leaves the cursor where reading them
    /// leaves it, across a stage boundary, on every rank, shuffled or not.
    #[test]
    fn skipping_mixture_batches_is_reading_them_without_the_tokens(
        b in 1usize..4,
        world in 1usize..3,
        shuffled in any::<bool>(),
        before in 0usize..5,
        n in 0u64..9,
        boundary in 1u64..6,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let paths = three(dir.path());
        let stages = [stage(0, &[0.5, 0.3, 0.2]), stage(boundary, &[0.2, 0.2, 0.6])];
        let order = if shuffled { ShardOrder::Shuffled } else { ShardOrder::InOrder };
        for rank in 0..world {
            let ranks = Ranks { rank, world_size: world };
            let mut read = mixture(&paths, &stages, 3, b, ranks, order).unwrap();
            let mut skipped = mixture(&paths, &stages, 3, b, ranks, order).unwrap();
            run(&mut read, before);
            run(&mut skipped, before);
            run(&mut read, n as usize);
            skipped.skip_batches(n, &mut || false).unwrap();
            prop_assert_eq!(skipped.cursor(), read.cursor());
            prop_assert_eq!(skipped.next_batch().unwrap(), read.next_batch().unwrap());
        }
    }
}

#[test]
fn an_interrupted_mixture_skip_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = three(dir.path());
    let stages = [stage(0, &[0.5, 0.3, 0.2])];
    let mut m = mixture(&paths, &stages, 4, 5, Ranks::SINGLE, ShardOrder::InOrder).unwrap();
    run(&mut m, 2);
    let at = m.cursor();
    let err = m.skip_batches(1 << 20, &mut || true).unwrap_err();
    assert!(matches!(err, TokensError::Interrupted), "{err}");
    assert_eq!(m.cursor(), at);
}
