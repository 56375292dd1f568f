//! Unit tests of partitioned packs: the plan, the parts, the markers and the merge.
use std::fs;

use super::merge::*;
use super::plan::*;
use super::writer::*;
use super::*;
use crate::tokens::pack;
use crate::tokens::pack::{InputFormat, PackInput, PackOptions};
use crate::tokens::shard::Layout;
use proptest::prelude::*;

fn ids_opts(format: InputFormat, vocab: u32, shard_tokens: Option<u64>) -> PackOptions {
    PackOptions {
        format,
        vocab,
        shard_tokens,
        layout: Layout::default(),
    }
}

fn run_part(
    out: &Path,
    inputs: &[PathBuf],
    part: Part,
    opts: &PackOptions,
) -> Result<PartOutcome, PartsError> {
    let job = PartJob {
        out,
        inputs,
        part,
        source: PartSource::Ids { opts },
    };
    pack_part(&job, &mut |_| {})
}

/// The files of a directory (not the part area), name and bytes, sorted.
fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn part_numbers() {
    assert_eq!(Part::parse("0/1").unwrap(), Part { index: 0, count: 1 });
    assert_eq!(Part::parse("3/4").unwrap().dir_name(), "3-of-4");
    for bad in [
        "4/4",
        "1/0",
        "-1/4",
        "1",
        "a/b",
        "1/4/5",
        " 1/4",
        "0x1/4",
        "1/10000001",
        "",
    ] {
        let e = Part::parse(bad).unwrap_err();
        assert!(matches!(e, PartsError::BadPart { .. }), "{bad}: {e}");
        assert_eq!(e.kind(), FailureKind::Operational);
    }
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let ok = env(&[
        ("SLURM_ARRAY_TASK_ID", "7"),
        ("SLURM_ARRAY_TASK_MIN", "5"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
    ]);
    assert_eq!(Part::from_slurm(&ok).unwrap(), Part { index: 2, count: 4 });
    for bad in [
        &[("SLURM_ARRAY_TASK_ID", "7")][..],
        &[
            ("SLURM_ARRAY_TASK_ID", "9"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ],
        &[
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ],
        &[
            ("SLURM_ARRAY_TASK_ID", "6"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
        ],
    ] {
        let lookup = env(bad);
        assert!(Part::from_slurm(&lookup).is_err(), "{bad:?}");
    }
}

/// Files as (size, whole?, document starts strictly inside the file).
fn files_strategy() -> impl Strategy<Value = Vec<(u64, bool, Vec<u64>)>> {
    proptest::collection::vec(
        (
            0u64..200,
            any::<bool>(),
            proptest::collection::vec(1u64..200, 0..8),
        ),
        0..7,
    )
    .prop_map(|files| {
        files
            .into_iter()
            .map(|(size, whole, mut starts)| {
                starts.retain(|&s| s < size);
                starts.sort_unstable();
                starts.dedup();
                (size, whole, starts)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The parts tile the inputs in order (every byte of every file in exactly
    /// one part, every empty file in exactly one), every cut is a document
    /// boundary or a file boundary, and each cut is within one document (or one
    /// whole file) of the ideal K * total / N.
    #[test]
    fn part_plan_is_contiguous_complete_and_balanced(
        files in files_strategy(),
        parts in 1usize..12,
    ) {
        let sizes: Vec<u64> = files.iter().map(|f| f.0).collect();
        let cuts = plan_cuts::<()>(&sizes, parts, &mut |i, o| {
            let (size, whole, starts) = &files[i];
            Ok(if *whole { None } else { Some(starts.iter().copied().find(|&s| s >= o).unwrap_or(*size)) })
        }).unwrap();
        prop_assert_eq!(cuts.len(), parts + 1);
        prop_assert_eq!(cuts[0], Position { input: 0, offset: 0 });
        prop_assert_eq!(cuts[parts], Position { input: sizes.len(), offset: 0 });
        let starts_of = |c: &Position| -> u64 { sizes[..c.input].iter().sum::<u64>() + c.offset };
        let total: u64 = sizes.iter().sum();
        // The largest unit a cut cannot enter.
        let unit = files.iter().map(|(size, whole, starts)| {
            if *whole { *size } else {
                let mut points = vec![0];
                points.extend(starts);
                points.push(*size);
                points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
            }
        }).max().unwrap_or(0);
        for (k, w) in cuts.windows(2).enumerate() {
            prop_assert!(w[0] <= w[1], "cuts out of order at {k}: {cuts:?}");
        }
        for (k, c) in cuts.iter().enumerate().take(parts).skip(1) {
            if c.offset != 0 {
                let (size, whole, starts) = &files[c.input];
                prop_assert!(!whole && c.offset < *size && starts.contains(&c.offset), "cut {k} {c:?} is no boundary");
            }
            let ideal = (u128::from(total) * k as u128 / parts as u128) as u64;
            prop_assert!(starts_of(c).abs_diff(ideal) <= unit, "cut {k} at {} is far from {ideal} (unit {unit})", starts_of(c));
        }
        // Every byte once, in order; every file (empty ones too) in exactly one part.
        let mut seen: Vec<(usize, u64, u64)> = Vec::new();
        for k in 0..parts {
            for s in part_segments(&sizes, cuts[k], cuts[k + 1]) {
                seen.push((s.input, s.start, s.end));
            }
        }
        let mut expect_file = 0;
        let mut expect_offset = 0;
        for &(input, start, end) in &seen {
            if input != expect_file {
                prop_assert_eq!(expect_offset, sizes[expect_file], "file {} not finished", expect_file);
                prop_assert_eq!(input, expect_file + 1, "file skipped: {:?}", seen);
                expect_file = input;
                expect_offset = 0;
            }
            prop_assert_eq!(start, expect_offset);
            prop_assert!(end >= start && end <= sizes[input]);
            expect_offset = end;
        }
        if !sizes.is_empty() {
            prop_assert_eq!(expect_file, sizes.len() - 1, "files missing: {:?}", seen);
            prop_assert_eq!(expect_offset, sizes[sizes.len() - 1]);
        } else {
            prop_assert!(seen.is_empty());
        }
        let per_file = sizes.iter().enumerate().all(|(i, _)| seen.iter().any(|s| s.0 == i));
        prop_assert!(per_file, "a file in no part: {:?}", seen);
        prop_assert!(seen.iter().all(|s| sizes[s.0] == 0 || s.2 > s.1), "an empty piece of a non-empty file: {:?}", seen);
    }
}

proptest! {
    // Each case packs and merges files with fsyncs: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any number of parts, merged, gives the files one pack writes, byte for byte,
    /// for every id format (cut inside files at id boundaries).
    #[test]
    fn parts_merge_into_the_single_pack(
        chunks in proptest::collection::vec(proptest::collection::vec(0u16..600, 0..60), 1..4),
        parts in 1usize..6,
        shard in proptest::option::of(1u64..40),
        format in prop_oneof![Just(InputFormat::Bytes), Just(InputFormat::Ids), Just(InputFormat::U16le)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one");
        let many = dir.path().join("many");
        let data = dir.path().join("data");
        for d in [&one, &many, &data] { fs::create_dir(d).unwrap(); }
        let vocab = if format == InputFormat::Bytes { 256 } else { 600 };
        let mut inputs = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let bytes: Vec<u8> = match format {
                InputFormat::Bytes => chunk.iter().map(|&v| v as u8).collect(),
                InputFormat::Ids => chunk.iter().map(|v| format!("{v}{}", if v % 3 == 0 { "\n" } else { "  " })).collect::<String>().into_bytes(),
                _ => chunk.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let p = data.join(format!("in{i}"));
            fs::write(&p, bytes).unwrap();
            inputs.push(p);
        }
        let opts = ids_opts(format, vocab, shard);
        let readers = inputs.iter().map(|p| PackInput::open(p).unwrap().0).collect();
        let single = pack(readers, &one.join("out"), &opts, &mut |_| {});
        for k in 0..parts {
            let outcome = run_part(&many.join("out"), &inputs, Part::new(k, parts).unwrap(), &opts).unwrap();
            prop_assert!(matches!(outcome, PartOutcome::Packed(_)));
        }
        let merged = merge_parts(&many.join("out"), true, &mut |_| {});
        match single {
            Err(TokensError::Empty) => {
                prop_assert!(matches!(merged, Err(PartsError::Tokens(TokensError::Empty))), "{merged:?}");
            }
            Err(e) => panic!("{e}"),
            Ok(s) => {
                let m = merged.unwrap();
                prop_assert_eq!(m.tokens, s.tokens);
                prop_assert_eq!(m.shards.len(), s.shards.len());
                prop_assert_eq!(outputs(&one), outputs(&many));
            }
        }
    }
}

#[test]
fn rerun_is_a_no_op_missing_parts_are_named_and_options_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    fs::write(&input, vec![7u8; 1000]).unwrap();
    let inputs = vec![input.clone()];
    let out = dir.path().join("o");
    let opts = ids_opts(InputFormat::Bytes, 256, Some(300));
    let p = |k| Part::new(k, 3).unwrap();
    assert!(matches!(
        run_part(&out, &inputs, p(1), &opts).unwrap(),
        PartOutcome::Packed(_)
    ));
    let marker = part_area(&out).join("1-of-3").join(MARKER_FILE);
    let before = fs::read(&marker).unwrap();
    assert!(matches!(
        run_part(&out, &inputs, p(1), &opts).unwrap(),
        PartOutcome::AlreadyComplete(_)
    ));
    assert_eq!(fs::read(&marker).unwrap(), before);
    let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
    assert!(
        e.to_string()
            .contains("2 of 3 parts missing or incomplete: 0-of-3, 2-of-3"),
        "{e}"
    );
    assert_eq!(e.kind(), FailureKind::Invalid);
    // Another shard size for the same part: refused, naming the setting.
    let other = ids_opts(InputFormat::Bytes, 256, Some(200));
    let e = run_part(&out, &inputs, p(1), &other).unwrap_err();
    assert!(
        e.to_string()
            .contains("made with shard_tokens 300, but this run has 200"),
        "{e}"
    );
    // Another part made with it: the merge names the difference.
    run_part(&out, &inputs, p(0), &opts).unwrap();
    run_part(&out, &inputs, p(2), &other).unwrap();
    let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
    assert!(
        e.to_string()
            .contains("2-of-3: made with shard_tokens 200, but part 0-of-3 has 300"),
        "{e}"
    );
    // Another count in the same area.
    let e = run_part(&out, &inputs, Part::new(0, 2).unwrap(), &opts).unwrap_err();
    assert!(matches!(e, PartsError::CountMismatch { .. }), "{e}");
    // A part whose ids were cut short is redone by a rerun, refused by the merge.
    fs::remove_dir_all(part_area(&out).join("2-of-3")).unwrap();
    run_part(&out, &inputs, p(2), &opts).unwrap();
    let ids = part_area(&out).join("0-of-3").join(IDS_FILE);
    fs::write(&ids, b"x").unwrap();
    let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
    assert!(matches!(e, PartsError::BadIds { .. }), "{e}");
    assert!(matches!(
        run_part(&out, &inputs, p(0), &opts).unwrap(),
        PartOutcome::Packed(_)
    ));
    let m = merge_parts(&out, true, &mut |_| {}).unwrap();
    assert_eq!(m.tokens, 1000);
    assert_eq!(m.shards.len(), 4);
    // Standard input cannot be split.
    let e = run_part(&out, &[PathBuf::from("-")], p(0), &opts).unwrap_err();
    assert!(matches!(e, PartsError::Stdin));
}
