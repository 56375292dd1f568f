//! Property tests of the chunk table's coverage check and of the read plan: random
//! global shapes tiled by random chunkings cover exactly, a removed or grown chunk is a
//! gap or an overlap, and a region assembled from any chunking through the planned
//! runs and pieces equals the region of the global tensor, and the range requests of a
//! remote read hold every piece once. Also: the local protocol refuses an `s3://` URL
//! before anything is made (remote::location sends those to the remote one). And the
//! streamed piece checks of a remote verify find exactly the damaged pieces, however
//! the file's bytes arrive.

use proptest::prelude::*;

use super::coverage::{check_counted, check_coverage, check_coverage_pairwise};
use super::plan::{intersect, Region};

/// Split the box (offsets, sizes) recursively at random cut points: an exact tiling.
fn tile(
    o: Vec<u64>,
    s: Vec<u64>,
    cuts: &mut impl Iterator<Item = u64>,
    out: &mut Vec<(Vec<u64>, Vec<u64>)>,
) {
    let c = cuts.next().unwrap_or(0);
    let d = (c as usize) % s.len().max(1);
    if s.is_empty() || c.is_multiple_of(3) || s[d] < 2 || out.len() > 40 {
        out.push((o, s));
        return;
    }
    let at = 1 + (c / 3) % (s[d] - 1);
    let (mut o2, mut s1, mut s2) = (o.clone(), s.clone(), s.clone());
    s1[d] = at;
    o2[d] += at;
    s2[d] -= at;
    tile(o, s1, cuts, out);
    tile(o2, s2, cuts, out);
}

fn row_major(shape: &[u64], idx: &[u64]) -> u64 {
    shape.iter().zip(idx).fold(0, |acc, (&d, &i)| acc * d + i)
}

/// The bytes of the region (offsets, sizes) of a tensor whose element k is k as u16.
fn region_bytes(shape: &[u64], o: &[u64], s: &[u64]) -> Vec<u8> {
    let n: u64 = s.iter().product();
    let mut out = Vec::new();
    for k in 0..n {
        let mut rest = k;
        let mut idx = vec![0; s.len()];
        for d in (0..s.len()).rev() {
            idx[d] = o[d] + rest % s[d];
            rest /= s[d];
        }
        out.extend_from_slice(&(row_major(shape, &idx) as u16).to_le_bytes());
    }
    out
}

proptest! {
    #[test]
    fn random_tilings_cover_exactly_and_broken_ones_are_refused(
        shape in proptest::collection::vec(1u64..7, 0..4),
        cuts in proptest::collection::vec(0u64..1000, 64),
    ) {
        let mut chunks = Vec::new();
        tile(vec![0; shape.len()], shape.clone(), &mut cuts.into_iter(), &mut chunks);
        let boxes: Vec<(&[u64], &[u64])> = chunks.iter().map(|(o, s)| (o.as_slice(), s.as_slice())).collect();
        prop_assert_eq!(check_coverage(&shape, &boxes), Ok(()));
        if boxes.len() > 1 {
            let gap = check_coverage(&shape, &boxes[1..]).unwrap_err();
            prop_assert!(gap.contains("gap"), "{}", gap);
            let mut twice = boxes.clone();
            twice.push(boxes[0]);
            let overlap = check_coverage(&shape, &twice).unwrap_err();
            prop_assert!(overlap.contains("overlaps"), "{}", overlap);
        }
        if let Some(d) = shape.iter().position(|_| true) {
            let (o, s) = &chunks[0];
            let mut grown = s.clone();
            grown[d] += shape[d];
            let mut out = boxes.clone();
            out[0] = (o.as_slice(), grown.as_slice());
            prop_assert!(check_coverage(&shape, &out).is_err());
        }
    }

    #[test]
    fn regions_assembled_from_any_chunking_equal_the_global_region(
        shape in proptest::collection::vec(1u64..7, 0..4),
        cuts in proptest::collection::vec(0u64..1000, 64),
        region_seed in proptest::collection::vec(0u64..1000, 8),
        piece in 1u64..20,
    ) {
        let mut chunks = Vec::new();
        tile(vec![0; shape.len()], shape.clone(), &mut cuts.into_iter(), &mut chunks);
        let ro: Vec<u64> = shape.iter().zip(&region_seed).map(|(&d, &r)| r % d).collect();
        let rs: Vec<u64> = shape.iter().zip(&ro).zip(region_seed.iter().skip(4))
            .map(|((&d, &o), &r)| 1 + r % (d - o)).collect();
        let want = region_bytes(&shape, &ro, &rs);
        let mut got = vec![0xAAu8; want.len()];
        let mut filled = 0u64;
        for (co, cs) in &chunks {
            let data = region_bytes(&shape, co, cs);
            let chunk = Region { offsets: co, sizes: cs };
            let Some(runs) = intersect(2, chunk, Region { offsets: &ro, sizes: &rs }) else { continue };
            for p in runs.pieces(piece) {
                let start = p * piece;
                let end = (start + piece).min(data.len() as u64);
                for (from, to, n) in runs.segments(start, end - start) {
                    let src = &data[(start + from) as usize..(start + from + n) as usize];
                    got[to as usize..(to + n) as usize].copy_from_slice(src);
                    filled += n;
                }
            }
        }
        prop_assert_eq!(filled, want.len() as u64);
        prop_assert_eq!(got, want);
    }
}

fn spans_strategy() -> impl Strategy<Value = (Vec<super::plan::Span>, u64)> {
    (
        proptest::collection::vec((0usize..3, 0u64..40, 0u64..12), 0..40),
        1u64..32,
    )
        .prop_map(|(raw, max)| {
            let spans = raw
                .into_iter()
                .map(|(file, at, len)| super::plan::Span { file, at, len })
                .collect();
            (spans, max)
        })
}

proptest! {
    /// Coalesced range requests hold every span exactly once, inside their range, stay
    /// within the size bound unless one span alone exceeds it, never mix files, and
    /// only join spans that touch (no byte fetched that no span needs).
    #[test]
    fn coalesced_fetches_hold_every_span_once_within_the_bound((spans, max) in spans_strategy()) {
        let fetches = super::plan::coalesce(&spans, max);
        let mut seen = vec![0usize; spans.len()];
        for f in &fetches {
            prop_assert!(!f.members.is_empty());
            let mut covered = f.begin;
            for &i in &f.members {
                seen[i] += 1;
                let s = spans[i];
                prop_assert_eq!(s.file, f.file);
                prop_assert!(s.at >= f.begin && s.at + s.len <= f.end);
                prop_assert!(s.at <= covered, "a gap before span {:?} in {:?}", s, f);
                covered = covered.max(s.at + s.len);
            }
            prop_assert_eq!(covered, f.end);
            if f.members.len() > 1 {
                prop_assert!(f.end - f.begin <= max);
            }
        }
        prop_assert!(seen.iter().all(|&n| n == 1));
    }
}

#[test]
fn the_local_protocol_refuses_an_object_storage_url_before_anything_is_made() {
    for url in ["s3://bucket/run", "s3://bucket/run/"] {
        let dir = std::path::Path::new(url);
        let Err(err) = super::commit::begin(dir, 1, false) else {
            panic!("{url}: a sharded save began");
        };
        assert!(err.to_string().contains("object storage"), "{err}");
        let Err(err) = super::open::open_step(dir, None) else {
            panic!("{url}: a sharded step opened");
        };
        assert!(err.to_string().contains("object storage"), "{err}");
    }
    // The local protocol would have made a directory named after the URL's text.
    assert!(!std::path::Path::new("s3:").exists());
}

/// A step of one data file of `file_len` bytes (byte k is k as u8) holding chunks at
/// the given (begin, len), with the table's piece digests of those bytes.
fn one_file_step(file_len: u64, chunks: &[(u64, u64)], piece_bytes: u64) -> super::ShardedStep {
    use super::open::{DataFile, Source, StepChunk, StepTensor};
    let bytes: Vec<u8> = (0..file_len).map(|k| k as u8).collect();
    let tensors = chunks
        .iter()
        .enumerate()
        .map(|(i, &(begin, len))| {
            let data = &bytes[begin as usize..(begin + len) as usize];
            let pieces = data
                .chunks(piece_bytes as usize)
                .map(super::piece::piece_digest_bytes)
                .collect();
            StepTensor {
                group: super::table::Group::Model,
                name: format!("t{i}"),
                dtype: crate::safetensors::Dtype::U8,
                shape: vec![len],
                longest: len,
                chunks: vec![StepChunk {
                    offsets: vec![0],
                    sizes: vec![len],
                    file: 0,
                    begin,
                    end: begin + len,
                    pieces,
                }],
            }
        })
        .collect();
    super::ShardedStep {
        path: std::path::PathBuf::from("step-000001"),
        step: 1,
        sharded: true,
        state: crate::checkpoint::TrainerState::new(1),
        config: None,
        skipped: Vec::new(),
        meta: Default::default(),
        piece_bytes,
        tensors,
        files: vec![DataFile {
            name: "model-rank00000.safetensors".to_string(),
            source: Source::Owned(bytes),
        }],
    }
}

/// Disjoint (begin, len) chunks inside a file, from random gaps and lengths, listed in
/// a shuffled order (the table's order need not be the file's); the file's length.
fn layout_strategy() -> impl Strategy<Value = (Vec<(u64, u64)>, u64)> {
    proptest::collection::vec((0u64..20, 0u64..50), 0..8).prop_map(|parts| {
        let mut at = 0;
        let mut chunks = Vec::new();
        for (gap, len) in parts {
            chunks.push((at + gap, len));
            at += gap + len;
        }
        chunks.reverse();
        (chunks, at + 7)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn streamed_piece_checks_find_exactly_the_damaged_pieces_whatever_the_splits(
        (chunks, file_len) in layout_strategy(),
        piece_bytes in 1u64..16,
        cuts in proptest::collection::vec(0usize..400, 0..12),
        flip in proptest::option::of(0u64..400),
    ) {
        let step = one_file_step(file_len, &chunks, piece_bytes);
        let mut bytes: Vec<u8> = (0..file_len).map(|k| k as u8).collect();
        let flip = flip.filter(|&f| f < file_len);
        if let Some(f) = flip {
            bytes[f as usize] ^= 1;
        }
        let mut scan = super::verify::FilePieces::new(&step, "model-rank00000.safetensors").unwrap();
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= bytes.len()).collect();
        cuts.sort_unstable();
        let mut from = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            scan.feed(&bytes[from..c]);
            from = c;
        }
        let found = scan.finish();
        // The damaged piece, when the flipped byte lies in a chunk: (tensor, piece).
        let damaged: Vec<(usize, u64)> = flip
            .into_iter()
            .flat_map(|f| chunks.iter().enumerate().filter(move |(_, &(b, l))| f >= b && f < b + l)
                .map(move |(i, &(b, _))| (i, (f - b) / piece_bytes)))
            .collect();
        let got: Vec<(usize, u64)> = found.iter().map(|((t, _, p), _)| (*t, *p)).collect();
        prop_assert_eq!(&got, &damaged);
        for (_, problem) in &found {
            prop_assert!(problem.contains("does not match its blake3 digest"), "{}", problem);
        }
    }
}

/// How many chunks hold each element of `shape` (row-major), by brute force.
fn counts(shape: &[u64], boxes: &[(&[u64], &[u64])]) -> Vec<u32> {
    let n: u64 = shape.iter().product();
    let mut out = vec![0u32; n as usize];
    for (o, s) in boxes {
        for k in 0..s.iter().product::<u64>() {
            let mut rest = k;
            let mut idx = vec![0; s.len()];
            for d in (0..s.len()).rev() {
                idx[d] = o[d] + rest % s[d];
                rest /= s[d];
            }
            out[row_major(shape, &idx) as usize] += 1;
        }
    }
    out
}

/// Random boxes inside `shape` (each dimension's start and length from the seeds).
fn random_boxes(shape: &[u64], seeds: &[u64], n: usize) -> Vec<(Vec<u64>, Vec<u64>)> {
    let mut it = seeds.iter().copied().cycle();
    (0..n)
        .map(|_| {
            let mut o = Vec::new();
            let mut s = Vec::new();
            for &d in shape {
                let start = it.next().unwrap_or(0) % d;
                o.push(start);
                s.push(1 + it.next().unwrap_or(0) % (d - start));
            }
            (o, s)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The sweep gives the pairwise checker's verdict on exact tilings, on tilings with
    /// a chunk removed, repeated, grown or moved, and on random boxes; a refusal names
    /// an element no chunk holds or two chunks that overlap, as counting shows.
    #[test]
    fn the_sweep_agrees_with_the_pairwise_check_and_with_counting(
        shape in proptest::collection::vec(1u64..6, 0..5),
        cuts in proptest::collection::vec(0u64..1000, 64),
        edit in 0u8..6,
        pick in 0usize..64,
        seeds in proptest::collection::vec(0u64..1000, 40),
    ) {
        let mut chunks = Vec::new();
        tile(vec![0; shape.len()], shape.clone(), &mut cuts.into_iter(), &mut chunks);
        let k = pick % chunks.len();
        match edit {
            1 if chunks.len() > 1 => { chunks.remove(k); }
            2 => { let c = chunks[k].clone(); chunks.push(c); }
            3 if !shape.is_empty() => {
                let d = pick % shape.len();
                if chunks[k].0[d] + chunks[k].1[d] < shape[d] { chunks[k].1[d] += 1; }
            }
            4 if !shape.is_empty() => {
                let d = pick % shape.len();
                if chunks[k].0[d] + chunks[k].1[d] < shape[d] { chunks[k].0[d] += 1; }
            }
            5 if !shape.is_empty() => chunks = random_boxes(&shape, &seeds, 1 + pick % 8),
            _ => {}
        }
        let boxes: Vec<(&[u64], &[u64])> =
            chunks.iter().map(|(o, s)| (o.as_slice(), s.as_slice())).collect();
        let new = check_coverage(&shape, &boxes);
        let old = check_coverage_pairwise(&shape, &boxes);
        prop_assert_eq!(new.is_ok(), old.is_ok(), "{:?} vs {:?}", new, old);
        let per_element = counts(&shape, &boxes);
        prop_assert_eq!(new.is_ok(), per_element.iter().all(|&c| c == 1));
        if let Err(why) = new {
            if let Some(at) = why.strip_prefix("no chunk holds the element at ") {
                let end = at.find(']').unwrap() + 1;
                let idx: Vec<u64> = serde_json::from_str(&at[..end]).unwrap();
                prop_assert_eq!(per_element[row_major(&shape, &idx) as usize], 0, "{}", why);
            } else {
                prop_assert!(why.contains(" overlaps chunk at "), "{}", why);
            }
        }
    }
}

/// The chunks of a `rows` x `cols` grid over a tensor of that shape; with `brick`, every
/// other row's cut moved by one column (the rows above and below a cut differ).
fn grid(rows: u64, cols: u64, brick: bool) -> Vec<(Vec<u64>, Vec<u64>)> {
    let mut out = Vec::new();
    for r in 0..rows {
        let shift = u64::from(brick && r % 2 == 1);
        let mut c = 0;
        while c < cols {
            let w = if c == 0 { 2 - shift.min(1) } else { 2 }.min(cols - c);
            out.push((vec![r, c], vec![1, w]));
            c += w;
        }
    }
    out
}

/// The check's steps (comparisons and box visits) for `count` chunks stay within a small
/// multiple of count x log2(count): the pairwise check took count^2 / 2 on one row.
fn within_n_log_n(steps: u64, count: u64) -> bool {
    let log = u64::from(u64::BITS - count.leading_zeros());
    steps <= 16 * count * log
}

#[test]
fn the_coverage_check_takes_n_log_n_steps_on_the_layouts_shardings_make() {
    // The format's limit of chunks, all in one row of single elements: the layout whose
    // pairwise check compared every pair.
    let n: u64 = super::table::MAX_CHUNKS as u64;
    let one_row: Vec<(Vec<u64>, Vec<u64>)> = (0..n).map(|i| (vec![0, i], vec![1, 1])).collect();
    let rows: Vec<(Vec<u64>, Vec<u64>)> = (0..1 << 14).map(|i| (vec![i, 0], vec![1, 8])).collect();
    let cases = [
        ("one row in single elements", vec![1, n], one_row),
        ("rows", vec![1 << 14, 8], rows),
        ("a grid", vec![128, 256], grid(128, 256, false)),
        ("bricks", vec![128, 256], grid(128, 256, true)),
    ];
    for (what, shape, chunks) in cases {
        let mut boxes: Vec<(&[u64], &[u64])> = chunks
            .iter()
            .map(|(o, s)| (o.as_slice(), s.as_slice()))
            .collect();
        let count = boxes.len() as u64;
        let (ok, steps) = check_counted(&shape, &boxes, u64::MAX);
        assert_eq!(ok, Ok(()), "{what}");
        assert!(
            within_n_log_n(steps, count),
            "{what}: {steps} steps for {count} chunks"
        );
        // One chunk repeated in the middle: an overlap, found in as few steps.
        boxes.push(boxes[boxes.len() / 2]);
        let (refused, steps) = check_counted(&shape, &boxes, u64::MAX);
        assert!(refused.unwrap_err().contains("overlaps"), "{what}");
        assert!(
            within_n_log_n(steps, count),
            "{what}: {steps} steps refusing"
        );
        // And one removed: a gap.
        boxes.pop();
        boxes.remove(boxes.len() / 3);
        let (refused, steps) = check_counted(&shape, &boxes, u64::MAX);
        assert!(refused.unwrap_err().contains("a gap"), "{what}");
        assert!(
            within_n_log_n(steps, count),
            "{what}: {steps} steps refusing"
        );
    }
}

#[test]
fn a_table_that_would_take_more_steps_than_its_budget_is_refused_naming_the_rule() {
    let chunks = grid(64, 64, true);
    let boxes: Vec<(&[u64], &[u64])> = chunks
        .iter()
        .map(|(o, s)| (o.as_slice(), s.as_slice()))
        .collect();
    let (refused, steps) = check_counted(&[64, 64], &boxes, 1000);
    let why = refused.unwrap_err();
    assert!(why.contains("more than 1000 steps"), "{why}");
    assert!(steps <= 1000 + 2 * boxes.len() as u64 * 64, "{steps}");
}

#[test]
fn a_tensor_too_large_to_count_is_refused_naming_what_overflows() {
    use super::table::{Group, ShardsTable, TableTensor};
    use crate::safetensors::Dtype;
    use std::collections::BTreeMap;
    let tensor = |dtype, shape: Vec<u64>| TableTensor {
        group: Group::Model,
        name: "w".into(),
        dtype,
        shape,
        chunks: Vec::new(),
    };
    // 2^62 elements of one byte: 2^62 bytes fit in 64 bits, 2^65 bits do not.
    let why = ShardsTable::new(
        1 << 20,
        BTreeMap::new(),
        vec![tensor(Dtype::BOOL, vec![1 << 31, 1 << 31])],
    )
    .unwrap_err()
    .to_string();
    assert!(
        why.contains("its size in bits (elements x 8 bits per element) overflows 64 bits"),
        "{why}"
    );
    assert!(!why.contains("byte size"), "{why}");
    let why = ShardsTable::new(
        1 << 20,
        BTreeMap::new(),
        vec![tensor(Dtype::U8, vec![u64::MAX, 2])],
    )
    .unwrap_err()
    .to_string();
    assert!(why.contains("its element count overflows 64 bits"), "{why}");
}

/// Boxes as table chunks (the planner's input), sorted by offsets as a table holds them.
fn as_entries(boxes: &[(Vec<u64>, Vec<u64>)]) -> Vec<super::table::ChunkEntry> {
    let mut out: Vec<super::table::ChunkEntry> = boxes
        .iter()
        .map(|(o, s)| super::table::ChunkEntry {
            offsets: o.clone(),
            sizes: s.clone(),
            file: "f.safetensors".into(),
            key: "k".into(),
            begin: 0,
            end: 0,
            pieces: Vec::new(),
        })
        .collect();
    out.sort_by(|a, b| a.offsets.cmp(&b.offsets));
    out
}

proptest! {
    #[test]
    fn the_planner_finds_every_chunk_a_full_scan_finds(
        shape in proptest::collection::vec(1u64..9, 1..4),
        cuts in proptest::collection::vec(0u64..1000, 64),
        corner in proptest::collection::vec(0u64..9, 3),
        extent in proptest::collection::vec(1u64..9, 3),
    ) {
        let mut boxes = Vec::new();
        tile(vec![0; shape.len()], shape.clone(), &mut cuts.into_iter(), &mut boxes);
        let chunks = as_entries(&boxes);
        let o: Vec<u64> = shape.iter().zip(&corner).map(|(&d, &c)| c % d).collect();
        let s: Vec<u64> = shape.iter().zip(&o).zip(&extent).map(|((&d, &o), &e)| 1 + (e - 1) % (d - o)).collect();
        let region = Region { offsets: &o, sizes: &s };
        let longest = super::plan::longest_extent(chunks.iter().map(|c| c.sizes.as_slice()));
        let (reads, _) = super::plan::plan_region(2, 4096, &chunks, longest, region);
        let planned: Vec<usize> = reads.iter().map(|r| r.chunk).collect();
        let scanned: Vec<usize> = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| intersect(2, Region { offsets: &c.offsets, sizes: &c.sizes }, region).is_some())
            .map(|(i, _)| i)
            .collect();
        prop_assert_eq!(planned, scanned);
    }
}

#[test]
fn a_resharded_rank_plans_against_the_chunks_near_its_rows_not_all_of_them() {
    // A [32768, 4] tensor saved by 4,096 ranks (8 rows each, FSDP), read by one rank of
    // 512 (64 rows), and a 2-D grid (FSDP x TP) read by rows: a full scan would
    // intersect every chunk (4,096 of them).
    let rows: Vec<(Vec<u64>, Vec<u64>)> = (0..4096).map(|r| (vec![r * 8, 0], vec![8, 4])).collect();
    let grid: Vec<(Vec<u64>, Vec<u64>)> = (0..512)
        .flat_map(|r| (0..8).map(move |c| (vec![r * 64, c], vec![64, 1])))
        .collect();
    for (boxes, most) in [(rows, 9), (grid, 16)] {
        let chunks = as_entries(&boxes);
        let longest = super::plan::longest_extent(chunks.iter().map(|c| c.sizes.as_slice()));
        let (o, s) = (vec![64 * 300, 0], vec![64, 4]);
        let region = Region {
            offsets: &o,
            sizes: &s,
        };
        let (reads, visited) = super::plan::plan_region(2, 4096, &chunks, longest, region);
        let bytes: u64 = reads.iter().map(|r| r.runs.len * r.runs.count).sum();
        assert_eq!(bytes, 2 * 64 * 4);
        assert!(visited <= most, "{visited} chunks visited");
    }
}

#[test]
fn a_table_larger_than_a_reader_takes_is_refused_at_commit() {
    let bytes = vec![b' '; 100];
    let e = super::table::within_limit(bytes.clone(), 99, 7)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("100 bytes for 7 chunks, more than the 99 bytes a reader takes"),
        "{e}"
    );
    assert_eq!(
        super::table::within_limit(bytes, 100, 7).unwrap().len(),
        100
    );
}
