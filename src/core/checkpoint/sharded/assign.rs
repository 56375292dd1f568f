//! Planning a sharded save from what every rank holds: one writer per distinct chunk (a
//! chunk one rank holds is that rank's; a replicated one goes, largest first, to the
//! holder with the fewest bytes so far, ties to the lowest rank), the rank files' names,
//! each chunk's key in its file, and the tensor list [`super::ShardedSave::commit`]
//! takes. Every rank can run it on the same gathered reports and get the same answer.
//!
//! Invariants: the answer does not depend on the order in which a rank lists its
//! chunks; every distinct chunk (group, name, offsets, sizes) has exactly one writer,
//! one of its holders; ranks that disagree on a tensor's dtype or global shape are an
//! error naming both. The work is one hash lookup per reported chunk, one pass over the
//! holders and a sort of the distinct chunks (O(N + C log C) for N reports of C
//! distinct chunks), never a scan of the other chunks per chunk: the rank simulator
//! (`examples/rank_sim`) runs it at 16,384 ranks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::commit::{ChunkRequest, TensorRequest};
use super::table::Group;
use super::{table_err, ShardedError};
use crate::safetensors::dtype::{byte_len, Dtype};

/// Digits of the rank in a rank file's name (`model-rank00007.safetensors`).
pub const FILE_DIGITS: usize = 5;

/// One chunk a rank holds, as it reports it to the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldChunk {
    /// The tensor's group.
    pub group: Group,
    /// The tensor's name.
    pub name: String,
    /// The tensor's dtype (whole bytes per element).
    pub dtype: Dtype,
    /// The tensor's global shape.
    pub shape: Vec<u64>,
    /// Where the chunk starts in the global tensor.
    pub offsets: Vec<u64>,
    /// The chunk's shape.
    pub sizes: Vec<u64>,
}

/// The rank file of `group` written by `rank`.
pub fn rank_file_name(group: Group, rank: usize) -> String {
    format!(
        "{}-rank{rank:0w$}.safetensors",
        group.name(),
        w = FILE_DIGITS
    )
}

/// A chunk's key in its rank file: the tensor's name and the chunk's offsets (unique
/// within a file, since the chunks of a tensor start at distinct offsets).
pub fn chunk_key(name: &str, offsets: &[u64]) -> String {
    let mut key = String::with_capacity(name.len() + 2 + 8 * offsets.len());
    key.push_str(name);
    key.push('@');
    for (i, o) in offsets.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(&o.to_string());
    }
    key
}

/// A multiply-rotate hasher (the one-word mix of Firefox's hash, reimplemented here):
/// a lookup per reported chunk must cost a few nanoseconds, not SipHash's tens. The
/// keys come from the ranks of one job, not from an adversary.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            if let Some(dst) = w.get_mut(..c.len()) {
                dst.copy_from_slice(c);
            }
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, w: u32) {
        self.write_u64(u64::from(w));
    }
    fn write_u8(&mut self, w: u8) {
        self.write_u64(u64::from(w));
    }
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
}

type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<Mix>>;

/// One distinct chunk: where it was first reported, its size, its holders.
#[derive(Debug, Clone)]
struct Distinct {
    tensor: u32,
    rank: u32,
    index: u32,
    bytes: u64,
    writer: u32,
}

/// The writers of a save: for every rank, which of its reported chunks it writes, and
/// every distinct chunk with its writer.
#[derive(Debug, Clone)]
pub struct Writers {
    /// Per rank, per reported chunk (in the rank's order): whether the rank writes it.
    writes: Vec<Vec<bool>>,
    /// The distinct tensors: (rank, index) of their first report.
    tensors: Vec<(u32, u32)>,
    chunks: Vec<Distinct>,
    /// Bytes each rank writes.
    load: Vec<u64>,
}

impl Writers {
    /// Whether `rank` writes its `index`-th reported chunk.
    pub fn writes(&self, rank: usize, index: usize) -> bool {
        self.writes
            .get(rank)
            .and_then(|w| w.get(index))
            .copied()
            .unwrap_or(false)
    }

    /// Per reported chunk of `rank`, whether it writes it.
    pub fn of_rank(&self, rank: usize) -> &[bool] {
        self.writes.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Number of distinct chunks.
    pub fn distinct(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes each rank writes.
    pub fn load(&self) -> &[u64] {
        &self.load
    }

    /// Every distinct chunk as (rank, index) of its first report and its writer.
    pub fn chunks(&self) -> impl Iterator<Item = ((usize, usize), usize)> + '_ {
        self.chunks
            .iter()
            .map(|c| ((c.rank as usize, c.index as usize), c.writer as usize))
    }
}

fn too_many(what: &str) -> ShardedError {
    table_err("the ranks' chunk reports", format!("more than 2^32 {what}"))
}

/// The writer of every chunk of `reports` (the chunks each rank holds, by rank).
pub fn assign_writers(reports: &[Vec<HeldChunk>]) -> Result<Writers, ShardedError> {
    let (tensors, ids) = intern_tensors(reports)?;
    let mut index: MixMap<(u32, &[u64], &[u64]), u32> = MixMap::default();
    let mut chunks: Vec<Distinct> = Vec::new();
    // (distinct chunk, holder), appended in rank order.
    let mut held: Vec<(u32, u32)> = Vec::new();
    for ((rank, mine), tids) in reports.iter().enumerate().zip(&ids) {
        let r = u32::try_from(rank).map_err(|_| too_many("ranks"))?;
        for ((i, c), &tid) in mine.iter().enumerate().zip(tids) {
            let next = u32::try_from(chunks.len()).map_err(|_| too_many("chunks"))?;
            let cid = *index
                .entry((tid, c.offsets.as_slice(), c.sizes.as_slice()))
                .or_insert(next);
            if cid == next {
                let bytes = byte_len(c.dtype, &c.sizes).map_err(|_| {
                    table_err(
                        format!("{} tensor {:?}", c.group, c.name),
                        format!("chunk {:?} of rank {rank}: its size overflows", c.sizes),
                    )
                })?;
                let index = u32::try_from(i).map_err(|_| too_many("chunks on a rank"))?;
                chunks.push(Distinct {
                    tensor: tid,
                    rank: r,
                    index,
                    bytes,
                    writer: r,
                });
            }
            held.push((cid, r));
        }
    }
    drop(index);
    let load = choose(reports, &mut chunks, &held)?;
    let mut writes: Vec<Vec<bool>> = reports.iter().map(|m| vec![false; m.len()]).collect();
    // `held` lists the reports in rank order, each rank's in its order: each report
    // learns whether its rank writes it.
    let mut k = 0usize;
    for (rank, mine) in reports.iter().enumerate() {
        let w = writes.get_mut(rank).ok_or_else(|| too_many("ranks"))?;
        for slot in w.iter_mut().take(mine.len()) {
            if let Some(&(cid, r)) = held.get(k) {
                *slot = chunks.get(cid as usize).is_some_and(|c| c.writer == r);
            }
            k += 1;
        }
    }
    Ok(Writers {
        writes,
        tensors,
        chunks,
        load,
    })
}

/// Each distinct tensor once, checked to have one dtype and shape on every rank: the
/// tensors' first reports and, per rank, each report's tensor id.
#[allow(
    clippy::type_complexity,
    reason = "two parallel tables, named at the call"
)]
fn intern_tensors(
    reports: &[Vec<HeldChunk>],
) -> Result<(Vec<(u32, u32)>, Vec<Vec<u32>>), ShardedError> {
    let mut by_name: MixMap<(Group, &str), u32> = MixMap::default();
    let mut first: Vec<(u32, u32)> = Vec::new();
    let mut ids: Vec<Vec<u32>> = Vec::with_capacity(reports.len());
    for (rank, mine) in reports.iter().enumerate() {
        let r = u32::try_from(rank).map_err(|_| too_many("ranks"))?;
        let prev: Option<(&Vec<HeldChunk>, &Vec<u32>)> = rank
            .checked_sub(1)
            .and_then(|p| reports.get(p).zip(ids.get(p)));
        let mut mine_ids = Vec::with_capacity(mine.len());
        for (i, c) in mine.iter().enumerate() {
            // Ranks list their tensors in the same order: the previous rank's report at
            // the same place usually names the same tensor, a compare instead of a hash.
            let same = prev.and_then(|(pc, pi)| {
                pc.get(i)
                    .filter(|p| p.group == c.group && p.name == c.name)
                    .and(pi.get(i).copied())
            });
            let tid = match same {
                Some(t) => t,
                None => {
                    let next = u32::try_from(first.len()).map_err(|_| too_many("tensors"))?;
                    let t = *by_name.entry((c.group, c.name.as_str())).or_insert(next);
                    if t == next {
                        let index = u32::try_from(i).map_err(|_| too_many("chunks on a rank"))?;
                        first.push((r, index));
                    }
                    t
                }
            };
            let seen = first
                .get(tid as usize)
                .and_then(|&(fr, fi)| Some((fr, reports.get(fr as usize)?.get(fi as usize)?)));
            if let Some((fr, f)) = seen {
                if f.dtype != c.dtype || f.shape != c.shape {
                    return Err(table_err(
                        format!("{} tensor {:?}", c.group, c.name),
                        format!(
                            "{} {:?} on rank {fr} but {} {:?} on rank {rank}",
                            f.dtype, f.shape, c.dtype, c.shape
                        ),
                    ));
                }
            }
            mine_ids.push(tid);
        }
        ids.push(mine_ids);
    }
    Ok((first, ids))
}

/// Choose the writers: a chunk of one holder is its; then the replicated ones, largest
/// first (ties in (group, name, offsets, sizes) order), each to its least loaded holder
/// (ties: the lowest rank). Returns the bytes per rank.
fn choose(
    reports: &[Vec<HeldChunk>],
    chunks: &mut [Distinct],
    held: &[(u32, u32)],
) -> Result<Vec<u64>, ShardedError> {
    // The holders of each chunk, contiguous and in rank order (a counting sort of the
    // pairs, which were appended in rank order).
    let mut start = vec![0usize; chunks.len().saturating_add(1)];
    for &(cid, _) in held {
        if let Some(s) = start.get_mut(cid as usize + 1) {
            *s += 1;
        }
    }
    for i in 1..start.len() {
        let before = start.get(i - 1).copied().unwrap_or(0);
        if let Some(s) = start.get_mut(i) {
            *s += before;
        }
    }
    let mut fill = start.clone();
    let mut holders = vec![0u32; held.len()];
    for &(cid, r) in held {
        if let Some(at) = fill.get_mut(cid as usize) {
            if let Some(slot) = holders.get_mut(*at) {
                *slot = r;
            }
            *at += 1;
        }
    }
    let holders_of = |cid: usize| -> &[u32] {
        match (start.get(cid), start.get(cid + 1)) {
            (Some(&a), Some(&b)) => holders.get(a..b).unwrap_or(&[]),
            _ => &[],
        }
    };
    let mut load = vec![0u64; reports.len()];
    let mut replicated: Vec<usize> = Vec::new();
    for (cid, c) in chunks.iter().enumerate() {
        match holders_of(cid) {
            [one] => {
                if let Some(l) = load.get_mut(*one as usize) {
                    *l = l.saturating_add(c.bytes);
                }
            }
            _ => replicated.push(cid),
        }
    }
    let report = |c: &Distinct| {
        reports
            .get(c.rank as usize)
            .and_then(|m| m.get(c.index as usize))
    };
    let key = |cid: usize| {
        let c = chunks.get(cid);
        let h = c.and_then(report);
        (
            std::cmp::Reverse(c.map_or(0, |c| c.bytes)),
            h.map(|h| h.group.name()),
            h.map(|h| h.name.as_str()),
            h.map(|h| h.offsets.as_slice()),
            h.map(|h| h.sizes.as_slice()),
        )
    };
    replicated.sort_unstable_by(|&a, &b| key(a).cmp(&key(b)));
    for cid in replicated {
        let best = holders_of(cid)
            .iter()
            .copied()
            .min_by_key(|&r| (load.get(r as usize).copied().unwrap_or(u64::MAX), r))
            .ok_or_else(|| too_many("holders"))?;
        let c = chunks.get_mut(cid).ok_or_else(|| too_many("chunks"))?;
        c.writer = best;
        if let Some(l) = load.get_mut(best as usize) {
            *l = l.saturating_add(c.bytes);
        }
    }
    Ok(load)
}

/// The tensors of the chunk table `commit` takes: every distinct tensor, sorted by
/// (group, name), with its distinct chunks sorted by (offsets, sizes), each in the file
/// of its writer under its [`chunk_key`].
pub fn tensor_requests(reports: &[Vec<HeldChunk>], writers: &Writers) -> Vec<TensorRequest> {
    let first = |(r, i): (u32, u32)| reports.get(r as usize).and_then(|m| m.get(i as usize));
    let mut per_tensor: Vec<Vec<usize>> = vec![Vec::new(); writers.tensors.len()];
    for (cid, c) in writers.chunks.iter().enumerate() {
        if let Some(list) = per_tensor.get_mut(c.tensor as usize) {
            list.push(cid);
        }
    }
    let mut order: Vec<usize> = (0..writers.tensors.len()).collect();
    let tensor_key = |t: usize| {
        writers
            .tensors
            .get(t)
            .copied()
            .and_then(first)
            .map(|h| (h.group.name(), h.name.as_str()))
    };
    order.sort_unstable_by(|&a, &b| tensor_key(a).cmp(&tensor_key(b)));
    let mut out = Vec::with_capacity(order.len());
    for t in order {
        let Some(head) = writers.tensors.get(t).copied().and_then(first) else {
            continue;
        };
        let mut cids = per_tensor
            .get_mut(t)
            .map(std::mem::take)
            .unwrap_or_default();
        let chunk_of = |cid: usize| {
            writers
                .chunks
                .get(cid)
                .and_then(|c| Some((c, first((c.rank, c.index))?)))
        };
        cids.sort_unstable_by(|&a, &b| {
            let k = |cid| chunk_of(cid).map(|(_, h)| (h.offsets.as_slice(), h.sizes.as_slice()));
            k(a).cmp(&k(b))
        });
        let chunks = cids
            .into_iter()
            .filter_map(chunk_of)
            .map(|(c, h)| ChunkRequest {
                offsets: h.offsets.clone(),
                sizes: h.sizes.clone(),
                file: rank_file_name(h.group, c.writer as usize),
                key: chunk_key(&h.name, &h.offsets),
            })
            .collect();
        out.push(TensorRequest {
            group: head.group,
            name: head.name.clone(),
            dtype: head.dtype,
            shape: head.shape.clone(),
            chunks,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn held(name: &str, shape: &[u64], offsets: &[u64], sizes: &[u64]) -> HeldChunk {
        HeldChunk {
            group: Group::Model,
            name: name.into(),
            dtype: Dtype::U8,
            shape: shape.to_vec(),
            offsets: offsets.to_vec(),
            sizes: sizes.to_vec(),
        }
    }

    /// A world size, chunks (bytes, holders) and a shuffle seed per rank.
    type Holdings = (usize, Vec<(u64, Vec<usize>)>, Vec<u64>);

    /// Chunks of distinct tensors, each of some bytes, held by a nonempty set of ranks.
    fn holdings() -> impl Strategy<Value = Holdings> {
        (1usize..7).prop_flat_map(|world| {
            let chunk = (
                1u64..100,
                proptest::collection::btree_set(0..world, 1..=world),
            )
                .prop_map(|(n, h)| (n, h.into_iter().collect::<Vec<_>>()));
            (
                Just(world),
                proptest::collection::vec(chunk, 0..24),
                proptest::collection::vec(any::<u64>(), world),
            )
        })
    }

    fn reports_of(world: usize, chunks: &[(u64, Vec<usize>)]) -> Vec<Vec<HeldChunk>> {
        let mut out = vec![Vec::new(); world];
        for (i, (n, holders)) in chunks.iter().enumerate() {
            for &r in holders {
                out[r].push(held(&format!("t{i}"), &[*n], &[0], &[*n]));
            }
        }
        out
    }

    /// (tensor name, writer) of every distinct chunk.
    fn answer(reports: &[Vec<HeldChunk>], w: &Writers) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (r, mine) in reports.iter().enumerate() {
            for (c, &x) in mine.iter().zip(w.of_rank(r)) {
                if x {
                    assert!(
                        out.insert(c.name.clone(), r).is_none(),
                        "{} written twice",
                        c.name
                    );
                }
            }
        }
        out
    }

    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn every_chunk_has_one_writer_among_its_holders((world, chunks, seeds) in holdings()) {
            let reports = reports_of(world, &chunks);
            let w = assign_writers(&reports).unwrap();
            prop_assert_eq!(w.distinct(), chunks.len());
            let got = answer(&reports, &w);
            prop_assert_eq!(got.len(), chunks.len());
            let mut load = vec![0u64; world];
            for (i, (n, holders)) in chunks.iter().enumerate() {
                let r = got[&format!("t{i}")];
                prop_assert!(holders.contains(&r));
                load[r] += n;
            }
            prop_assert_eq!(w.load(), load.as_slice());
            // The same answer whatever order each rank lists its chunks in.
            let mut shuffled = reports.clone();
            for (mine, seed) in shuffled.iter_mut().zip(&seeds) {
                let n = mine.len().max(1);
                mine.rotate_left((*seed as usize) % n);
                if seed % 2 == 1 {
                    mine.reverse();
                }
            }
            let again = assign_writers(&shuffled).unwrap();
            prop_assert_eq!(answer(&shuffled, &again), got);
            // Chunks every rank holds: no rank ends more than the largest above another.
            if chunks.iter().all(|(_, h)| h.len() == world) && !chunks.is_empty() {
                let spread = load.iter().max().unwrap() - load.iter().min().unwrap();
                prop_assert!(spread <= chunks.iter().map(|c| c.0).max().unwrap());
            }
        }
    }

    #[test]
    fn ranks_disagreeing_on_a_tensor_are_refused_naming_both() {
        let a = HeldChunk {
            dtype: Dtype::F32,
            ..held("w", &[4, 2], &[0, 0], &[2, 2])
        };
        let b = HeldChunk {
            dtype: Dtype::F32,
            ..held("w", &[4, 3], &[2, 0], &[2, 3])
        };
        let e = assign_writers(&[vec![a], vec![b]]).unwrap_err().to_string();
        assert!(
            e.contains("\"w\"") && e.contains("F32 [4, 2] on rank 0 but F32 [4, 3] on rank 1"),
            "{e}"
        );
    }

    #[test]
    fn the_tensor_list_names_each_writers_file_and_key() {
        // Two ranks hold the two halves of `b`; both hold all of `a` (replicated).
        let reports = vec![
            vec![held("b", &[4], &[0], &[2]), held("a", &[3], &[0], &[3])],
            vec![held("a", &[3], &[0], &[3]), held("b", &[4], &[2], &[2])],
        ];
        let w = assign_writers(&reports).unwrap();
        let t = tensor_requests(&reports, &w);
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        // `a` goes to the holder with fewer bytes so far: both have 2, so rank 0.
        assert_eq!(t[0].chunks[0].file, "model-rank00000.safetensors");
        assert_eq!(t[0].chunks[0].key, "a@0");
        let b: Vec<(&str, &str)> = t[1]
            .chunks
            .iter()
            .map(|c| (c.file.as_str(), c.key.as_str()))
            .collect();
        assert_eq!(
            b,
            [
                ("model-rank00000.safetensors", "b@0"),
                ("model-rank00001.safetensors", "b@2")
            ]
        );
        assert_eq!(chunk_key("w", &[3, 0, 12]), "w@3,0,12");
        assert_eq!(
            rank_file_name(Group::Optimizer, 42),
            "optimizer-rank00042.safetensors"
        );
    }
}
