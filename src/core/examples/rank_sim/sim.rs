//! The rank simulator: what R ranks of a sharded save would send rank 0 for a model of
//! T tensors of a 70B-class model's shapes, under FSDP (1-D), FSDP x TP (2-D) and HSDP,
//! and everything rank 0 then does before the commit, through the very core functions
//! the save calls (`assign_writers`, `tensor_requests`, `build_table` with its coverage
//! check, the table's and the manifest's bytes); then the read plan of one rank of
//! another layout loading that table (`plan_region`), and the table's parse on load.
//! No torch, no process, no data file: the ranks' file tables are what
//! `write_rank_file` would return (the canonical header's real byte ranges; the
//! digests a constant, since no data is hashed).
//!
//! Invariants: every plan is checked exact, outside the timings: every distinct chunk
//! has exactly one writer, among its holders; every tensor's chunks tile it (the table
//! validated, and their elements summed); the load plan's runs fill the rank's regions
//! byte for byte.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tlio_core::checkpoint::sharded::plan::{longest_extent, plan_region, Region};
use tlio_core::checkpoint::sharded::table::{piece_count, ShardsTable, MAX_TABLE_BYTES};
use tlio_core::checkpoint::sharded::{
    assign_writers, chunk_key, commit::build_table, rank_file_name, tensor_requests, Group,
    HeldChunk, RankFile, WrittenChunk, PIECE_BYTES,
};
use tlio_core::checkpoint::{Manifest, ManifestEntry};
use tlio_core::digest::sha256_hex;
use tlio_core::safetensors::write::{canonical_header, TensorSpec};
use tlio_core::safetensors::Dtype;

/// Hidden size, key/value width, MLP width and vocabulary of a Llama-3-70B-class model.
const HIDDEN: u64 = 8192;
const KV: u64 = 1024;
const MLP: u64 = 28672;
const VOCAB: u64 = 128_256;
/// Ranks of one tensor-parallel group (one node's GPUs).
pub const TP: u64 = 8;
/// Ranks of one HSDP shard group (four nodes); the replicas are R / HSDP_SHARD.
pub const HSDP_SHARD: u64 = 32;

/// How tensor parallelism splits a weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tp {
    /// Along dimension 0 (column-wise linear, embedding).
    Col,
    /// Along dimension 1 (row-wise linear).
    Row,
    /// Not at all (norms): the TP ranks hold the same chunk.
    Replicate,
}

/// One tensor of the model.
#[derive(Debug, Clone)]
pub struct Param {
    name: String,
    shape: Vec<u64>,
    tp: Tp,
}

/// The first `t` tensors of a Llama-3-70B-shaped model (the embedding, then layers of
/// nine tensors each, as many as it takes), float32 as FSDP keeps its shards.
pub fn model(t: usize) -> Vec<Param> {
    let layer: [(&str, Vec<u64>, Tp); 9] = [
        ("attention_norm.weight", vec![HIDDEN], Tp::Replicate),
        ("attention.wq.weight", vec![HIDDEN, HIDDEN], Tp::Col),
        ("attention.wk.weight", vec![KV, HIDDEN], Tp::Col),
        ("attention.wv.weight", vec![KV, HIDDEN], Tp::Col),
        ("attention.wo.weight", vec![HIDDEN, HIDDEN], Tp::Row),
        ("ffn_norm.weight", vec![HIDDEN], Tp::Replicate),
        ("feed_forward.w1.weight", vec![MLP, HIDDEN], Tp::Col),
        ("feed_forward.w3.weight", vec![MLP, HIDDEN], Tp::Col),
        ("feed_forward.w2.weight", vec![HIDDEN, MLP], Tp::Row),
    ];
    let mut out = vec![Param {
        name: "tok_embeddings.weight".into(),
        shape: vec![VOCAB, HIDDEN],
        tp: Tp::Col,
    }];
    let mut l = 0usize;
    while out.len() < t {
        for (name, shape, tp) in &layer {
            if out.len() < t {
                out.push(Param {
                    name: format!("layers.{l}.{name}"),
                    shape: shape.clone(),
                    tp: *tp,
                });
            }
        }
        l += 1;
    }
    out.truncate(t);
    out
}

/// How the ranks hold the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// FSDP2 over all R ranks: dimension 0 split R ways.
    Fsdp,
    /// FSDP over R / TP ranks times tensor parallelism over TP.
    FsdpTp,
    /// HSDP: FSDP within groups of HSDP_SHARD ranks, replicated R / HSDP_SHARD times.
    Hsdp,
}

impl Layout {
    /// Every layout, in table order.
    pub const ALL: [Layout; 3] = [Layout::Fsdp, Layout::FsdpTp, Layout::Hsdp];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Fsdp => "FSDP",
            Layout::FsdpTp => "FSDPxTP8",
            Layout::Hsdp => "HSDP32",
        }
    }

    /// The layout a resharded load of a step saved in this one reads into.
    pub fn target(self) -> Layout {
        match self {
            Layout::Fsdp | Layout::Hsdp => Layout::FsdpTp,
            Layout::FsdpTp => Layout::Fsdp,
        }
    }
}

/// Part `i` of `n` of the extent `d`, as `torch.chunk` (and FSDP2) splits: parts of
/// ceil(d / n), the last ones shorter or empty.
fn part(d: u64, n: u64, i: u64) -> (u64, u64) {
    let c = d.div_ceil(n.max(1));
    let lo = c.saturating_mul(i).min(d);
    let hi = c.saturating_mul(i.saturating_add(1)).min(d);
    (lo, hi - lo)
}

/// Rank `r`'s box of `p` under `layout` over `ranks` ranks; `None` for an empty share.
pub fn rank_box(p: &Param, layout: Layout, ranks: u64, r: u64) -> Option<(Vec<u64>, Vec<u64>)> {
    let mut off = vec![0u64; p.shape.len()];
    let mut size = p.shape.clone();
    let d0 = p.shape.first().copied().unwrap_or(0);
    let (dp, dp_i) = match layout {
        Layout::Fsdp => (ranks, r),
        Layout::FsdpTp => (ranks / TP, r / TP),
        Layout::Hsdp => (HSDP_SHARD.min(ranks), r % HSDP_SHARD.min(ranks)),
    };
    if layout == Layout::FsdpTp {
        let tp_i = r % TP;
        match p.tp {
            Tp::Col => {
                let (o, s) = part(d0, TP, tp_i);
                let (o2, s2) = part(s, dp, dp_i);
                *off.first_mut()? = o + o2;
                *size.first_mut()? = s2;
                return (s2 > 0).then_some((off, size));
            }
            Tp::Row => {
                let d1 = p.shape.get(1).copied().unwrap_or(0);
                let (o, s) = part(d1, TP, tp_i);
                *off.get_mut(1)? = o;
                *size.get_mut(1)? = s;
            }
            Tp::Replicate => {}
        }
    }
    let (o, s) = part(d0, dp, dp_i);
    *off.first_mut()? = o;
    *size.first_mut()? = s;
    (s > 0 && size.iter().all(|&z| z > 0)).then_some((off, size))
}

/// What every rank reports: its chunks, in the model's order.
pub fn reports(params: &[Param], layout: Layout, ranks: u64) -> Vec<Vec<HeldChunk>> {
    (0..ranks)
        .map(|r| {
            params
                .iter()
                .filter_map(|p| {
                    let (offsets, sizes) = rank_box(p, layout, ranks, r)?;
                    Some(HeldChunk {
                        group: Group::Model,
                        name: p.name.clone(),
                        dtype: Dtype::F32,
                        shape: p.shape.clone(),
                        offsets,
                        sizes,
                    })
                })
                .collect()
        })
        .collect()
}

/// The tables of the files every rank writes, as `write_rank_file` returns them: the
/// real canonical header's byte ranges, constant digests.
pub fn rank_files(
    reports: &[Vec<HeldChunk>],
    writes: &dyn Fn(usize) -> Vec<bool>,
) -> Result<Vec<RankFile>, String> {
    const DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";
    let mut files = Vec::new();
    for (rank, mine) in reports.iter().enumerate() {
        let w = writes(rank);
        let written: Vec<(&HeldChunk, String)> = mine
            .iter()
            .zip(&w)
            .filter(|(_, &x)| x)
            .map(|(c, _)| (c, chunk_key(&c.name, &c.offsets)))
            .collect();
        if written.is_empty() {
            continue;
        }
        let specs: Vec<TensorSpec<'_>> = written
            .iter()
            .map(|(c, k)| TensorSpec::new(k, c.dtype, &c.sizes))
            .collect();
        let layout = canonical_header(&specs, &BTreeMap::new()).map_err(|e| e.to_string())?;
        let start = layout.header.len() as u64;
        let mut tensors = BTreeMap::new();
        for ((c, k), &(b, e)) in written.iter().zip(&layout.offsets) {
            let pieces = piece_count(e - b, PIECE_BYTES);
            tensors.insert(
                k.clone(),
                WrittenChunk {
                    dtype: c.dtype,
                    shape: c.sizes.clone(),
                    begin: start + b,
                    end: start + e,
                    pieces: (0..pieces).map(|_| DIGEST.to_string()).collect(),
                },
            );
        }
        files.push(RankFile {
            name: rank_file_name(Group::Model, rank),
            size: start + layout.data_len,
            sha256: DIGEST.to_string(),
            tensors,
        });
    }
    Ok(files)
}

/// One simulated save and load.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Chunks the ranks reported.
    pub reported: usize,
    /// Distinct chunks in the table.
    pub chunks: usize,
    /// Bytes of shards.json.
    pub table_bytes: usize,
    /// Rank 0's steps: writers, tensor list, table (with coverage), table and manifest
    /// bytes.
    pub assign: Duration,
    /// `tensor_requests`.
    pub requests: Duration,
    /// `build_table`: every chunk against its file's table, then coverage.
    pub table: Duration,
    /// shards.json's bytes and sha256, then the manifest's bytes.
    pub manifest: Duration,
    /// One loading rank: the table parsed and validated.
    pub open: Duration,
    /// One loading rank: the read plan of its regions.
    pub plan: Duration,
    /// Pieces that rank reads.
    pub pieces: u64,
}

impl Outcome {
    /// Rank 0's pre-commit work.
    pub fn pre_commit(&self) -> Duration {
        self.assign + self.requests + self.table + self.manifest
    }
}

/// A clock: the bench reads the process's CPU time (the machine may be shared), the
/// tests the wall clock.
pub type Clock = dyn Fn() -> Duration;

/// The wall clock since the first call.
pub fn wall() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Simulate a save of `params` by `ranks` ranks in `layout`, check it, and plan the load
/// of rank `load_rank` of the target layout. `mark` is called before rank 0's work
/// starts (the bench resets its peak-memory count there).
pub fn run(
    params: &[Param],
    layout: Layout,
    ranks: u64,
    load_rank: u64,
    clock: &Clock,
    mark: &mut dyn FnMut(),
) -> Result<Outcome, String> {
    let reports = reports(params, layout, ranks);
    simulate(
        params,
        reports,
        layout.target(),
        ranks,
        load_rank,
        clock,
        mark,
    )
}

/// [`run`] from the ranks' `reports`, loading into `target`.
pub fn simulate(
    params: &[Param],
    reports: Vec<Vec<HeldChunk>>,
    target: Layout,
    ranks: u64,
    load_rank: u64,
    clock: &Clock,
    mark: &mut dyn FnMut(),
) -> Result<Outcome, String> {
    // The writers as the ranks themselves compute them, to know what files they write.
    let writers = assign_writers(&reports).map_err(|e| e.to_string())?;
    let files = rank_files(&reports, &|r| writers.of_rank(r).to_vec())?;
    let reported = reports.iter().map(Vec::len).sum();
    drop(writers);
    mark();
    let t0 = clock();
    let writers = assign_writers(&reports).map_err(|e| e.to_string())?;
    let t1 = clock();
    let tensors = tensor_requests(&reports, &writers);
    let t2 = clock();
    let table = build_table(&files, tensors, BTreeMap::new()).map_err(|e| e.to_string())?;
    let t3 = clock();
    let bytes = table.to_json();
    let mut entries: Vec<ManifestEntry> = files
        .iter()
        .map(|f| ManifestEntry {
            name: f.name.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
        })
        .collect();
    entries.push(ManifestEntry {
        name: "shards.json".into(),
        size: bytes.len() as u64,
        sha256: sha256_hex(&bytes),
    });
    let manifest = Manifest::new(1, entries).map_err(|e| e.to_string())?;
    let manifest_bytes = manifest.to_json();
    let t4 = clock();
    check_writers(&reports, &writers)?;
    check_tiling(&table)?;
    let chunks = writers.distinct();
    drop((manifest_bytes, manifest, writers, files, reports));
    let table_bytes = bytes.len();
    // A loading rank: the table it reads (refused above the reader's limit, where only
    // the plan on the table in memory can be timed).
    let t5 = clock();
    let opened = if table_bytes as u64 <= MAX_TABLE_BYTES {
        Some(ShardsTable::from_json(&bytes).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let open = clock() - t5;
    let table = opened.unwrap_or(table);
    let (plan, pieces) = load_plan(&table, params, target, ranks, load_rank, clock)?;
    Ok(Outcome {
        reported,
        chunks,
        table_bytes,
        assign: t1 - t0,
        requests: t2 - t1,
        table: t3 - t2,
        manifest: t4 - t3,
        open,
        plan,
        pieces,
    })
}

/// Every distinct chunk written exactly once, by one of its holders.
fn check_writers(
    reports: &[Vec<HeldChunk>],
    writers: &tlio_core::checkpoint::sharded::Writers,
) -> Result<(), String> {
    let mut count: HashMap<(&str, &[u64], &[u64]), u32> = HashMap::new();
    for (rank, mine) in reports.iter().enumerate() {
        for (c, &w) in mine.iter().zip(writers.of_rank(rank)) {
            let n = count
                .entry((c.name.as_str(), c.offsets.as_slice(), c.sizes.as_slice()))
                .or_insert(0);
            *n += u32::from(w);
        }
    }
    if count.len() != writers.distinct() {
        return Err(format!(
            "{} distinct chunks reported, {} assigned",
            count.len(),
            writers.distinct()
        ));
    }
    match count.iter().find(|(_, &n)| n != 1) {
        Some((k, n)) => Err(format!("chunk {k:?} has {n} writers")),
        None => Ok(()),
    }
}

/// Every tensor's chunks hold exactly its elements (the table's own check found no
/// gap and no overlap; this one counts independently).
fn check_tiling(table: &ShardsTable) -> Result<(), String> {
    for t in &table.tensors {
        let whole: u64 = t.shape.iter().product();
        let sum: u64 = t
            .chunks
            .iter()
            .map(|c| c.sizes.iter().product::<u64>())
            .sum();
        if whole != sum {
            return Err(format!("{}: chunks hold {sum} of {whole} elements", t.name));
        }
    }
    Ok(())
}

/// The read plan of rank `r` of `target` over `ranks` ranks: its time, and the pieces it
/// reads; the runs are checked to fill each region exactly.
fn load_plan(
    table: &ShardsTable,
    params: &[Param],
    target: Layout,
    ranks: u64,
    r: u64,
    clock: &Clock,
) -> Result<(Duration, u64), String> {
    // What opening the step computes once per tensor (`StepTensor::longest`).
    let wants: Vec<(usize, u64, Vec<u64>, Vec<u64>)> = params
        .iter()
        .filter_map(|p| {
            let (o, s) = rank_box(p, target, ranks, r)?;
            let t = table
                .tensors
                .binary_search_by(|t| t.name.as_str().cmp(&p.name))
                .ok()?;
            let longest = longest_extent(
                table
                    .tensors
                    .get(t)?
                    .chunks
                    .iter()
                    .map(|c| c.sizes.as_slice()),
            );
            Some((t, longest, o, s))
        })
        .collect();
    let start = clock();
    let mut plans = Vec::with_capacity(wants.len());
    for (t, longest, o, s) in &wants {
        let tensor = table.tensors.get(*t).ok_or("a planned tensor")?;
        let longest = *longest;
        let region = Region {
            offsets: o,
            sizes: s,
        };
        plans.push(plan_region(4, PIECE_BYTES, &tensor.chunks, longest, region).0);
    }
    let took = clock() - start;
    let mut pieces = 0u64;
    for ((_, _, _, s), plan) in wants.iter().zip(&plans) {
        let want: u64 = 4 * s.iter().product::<u64>();
        let got: u64 = plan.iter().map(|c| c.runs.len * c.runs.count).sum();
        if want != got {
            return Err(format!("a region of {want} bytes planned as {got}"));
        }
        pieces += plan.iter().map(|c| c.pieces.len() as u64).sum::<u64>();
    }
    Ok((took, pieces))
}
