//! Read planning: which bytes of which chunk a region of a global tensor needs, as
//! runs of contiguous bytes (the same runs in the chunk's row-major bytes and in the
//! region's), and which pieces of the chunk those runs touch.
//!
//! Invariants: runs are in row-major order of the intersection, so their offsets grow
//! both in the chunk and in the region; the runs of all the chunks of a tensor never
//! write the same byte of the region (the chunks do not overlap) and, when the chunks
//! cover the tensor, fill every byte of it; the plan's memory is one entry per outer
//! dimension and one per needed piece, never one per run.

/// A box of a global tensor: where it starts and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region<'a> {
    /// First index per dimension.
    pub offsets: &'a [u64],
    /// Extent per dimension.
    pub sizes: &'a [u64],
}

/// The runs of one chunk that fall inside a region: `count` runs of `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runs {
    /// Bytes per run.
    pub len: u64,
    /// Number of runs.
    pub count: u64,
    /// Offset of the first run in the chunk's bytes.
    pub src_start: u64,
    /// Offset of the first run in the region's bytes.
    pub dst_start: u64,
    /// The dimensions iterated to go from run to run, outermost first: (extent, stride
    /// in the chunk, stride in the region), in bytes.
    outer: Vec<(u64, u64, u64)>,
}

/// Row-major byte strides of a shape with `elem` bytes per element (checked).
fn strides(elem: u64, shape: &[u64]) -> Option<Vec<u64>> {
    let mut out = vec![0u64; shape.len()];
    let mut acc = elem;
    for (s, &d) in out.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.checked_mul(d)?;
    }
    Some(out)
}

/// Check that `region` lies inside `shape`; the error names the rule.
pub fn check_region(shape: &[u64], region: Region<'_>) -> Result<(), String> {
    if region.offsets.len() != shape.len() || region.sizes.len() != shape.len() {
        return Err(format!(
            "the region (offsets {:?}, sizes {:?}) does not have the tensor's {} dimensions",
            region.offsets,
            region.sizes,
            shape.len()
        ));
    }
    for ((&o, &s), &d) in region.offsets.iter().zip(region.sizes).zip(shape) {
        if o.checked_add(s).is_none_or(|end| end > d) {
            return Err(format!(
                "the region (offsets {:?}, sizes {:?}) reaches outside the shape {shape:?}",
                region.offsets, region.sizes
            ));
        }
    }
    Ok(())
}

/// The runs of `chunk` inside `region` (both boxes of one tensor of `elem`-byte
/// elements, of equal rank), or `None` when they do not meet (or either is empty).
pub fn intersect(elem: u64, chunk: Region<'_>, region: Region<'_>) -> Option<Runs> {
    let rank = chunk.offsets.len();
    if [chunk.sizes.len(), region.offsets.len(), region.sizes.len()] != [rank; 3] {
        return None;
    }
    let mut lo = Vec::with_capacity(rank);
    let mut ext = Vec::with_capacity(rank);
    for d in 0..rank {
        let (co, cs) = (*chunk.offsets.get(d)?, *chunk.sizes.get(d)?);
        let (ro, rs) = (*region.offsets.get(d)?, *region.sizes.get(d)?);
        let l = co.max(ro);
        let h = co.checked_add(cs)?.min(ro.checked_add(rs)?);
        if l >= h {
            return None;
        }
        lo.push(l);
        ext.push(h - l);
    }
    let cst = strides(elem, chunk.sizes)?;
    let rst = strides(elem, region.sizes)?;
    let mut src_start = 0u64;
    let mut dst_start = 0u64;
    for d in 0..rank {
        let l = *lo.get(d)?;
        src_start =
            src_start.checked_add((l - chunk.offsets.get(d)?).checked_mul(*cst.get(d)?)?)?;
        dst_start =
            dst_start.checked_add((l - region.offsets.get(d)?).checked_mul(*rst.get(d)?)?)?;
    }
    // Dimensions d >= j form one contiguous run when every dimension after j is whole
    // in both the chunk and the region.
    let mut j = rank;
    let mut len = elem;
    while j > 0 {
        let d = j - 1;
        let e = *ext.get(d)?;
        len = len.checked_mul(e)?;
        j = d;
        if e != *chunk.sizes.get(d)? || e != *region.sizes.get(d)? {
            break;
        }
    }
    let mut outer = Vec::with_capacity(j);
    let mut count = 1u64;
    for d in 0..j {
        let e = *ext.get(d)?;
        count = count.checked_mul(e)?;
        outer.push((e, *cst.get(d)?, *rst.get(d)?));
    }
    Some(Runs {
        len,
        count,
        src_start,
        dst_start,
        outer,
    })
}

impl Runs {
    /// Offsets of run `k` (in the chunk, in the region); `k < count`.
    pub fn at(&self, k: u64) -> (u64, u64) {
        let mut rest = k;
        let (mut src, mut dst) = (self.src_start, self.dst_start);
        for &(e, cs, rs) in self.outer.iter().rev() {
            let i = rest % e.max(1);
            rest /= e.max(1);
            // Within the chunk and region, whose byte sizes fit u64: no overflow.
            src = src.saturating_add(i.saturating_mul(cs));
            dst = dst.saturating_add(i.saturating_mul(rs));
        }
        (src, dst)
    }

    /// The first run that ends after chunk byte `pos` (`count` when none does).
    pub fn first_ending_after(&self, pos: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.at(mid).0.saturating_add(self.len) > pos {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// The pieces (of `piece_bytes`, counted from the chunk's first byte) that the runs
    /// touch, ascending, each once.
    pub fn pieces(&self, piece_bytes: u64) -> Vec<u64> {
        let p = piece_bytes.max(1);
        let mut out: Vec<u64> = Vec::new();
        if self.len == 0 {
            return out;
        }
        let mut k = 0;
        while k < self.count {
            let (src, _) = self.at(k);
            let first = src / p;
            let last = (src.saturating_add(self.len) - 1) / p;
            let from = match out.last() {
                Some(&l) if l >= first => l + 1,
                _ => first,
            };
            out.extend(from..=last);
            // Skip the runs that lie wholly inside the last piece already listed.
            let piece_end = last.saturating_add(1).saturating_mul(p);
            let next = self.first_ending_after(piece_end);
            k = next.max(k + 1);
        }
        out
    }

    /// The parts of the runs inside the chunk bytes `[start, start + len)`: (offset in
    /// that piece, offset in the region, length), in order.
    pub fn segments(&self, start: u64, len: u64) -> Segments<'_> {
        Segments {
            runs: self,
            k: self.first_ending_after(start),
            start,
            end: start.saturating_add(len),
        }
    }
}

/// Iterator of [`Runs::segments`].
#[derive(Debug)]
pub struct Segments<'r> {
    runs: &'r Runs,
    k: u64,
    start: u64,
    end: u64,
}

impl Iterator for Segments<'_> {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<Self::Item> {
        if self.k >= self.runs.count {
            return None;
        }
        let (src, dst) = self.runs.at(self.k);
        if src >= self.end {
            return None;
        }
        self.k += 1;
        let a = src.max(self.start);
        let b = src.saturating_add(self.runs.len).min(self.end);
        Some((a - self.start, dst + (a - src), b - a))
    }
}

/// The longest extent along dimension 0 of these chunk shapes (0 for none, or for
/// scalars): what [`candidates`] needs to bound its search.
pub fn longest_extent<'a>(sizes: impl Iterator<Item = &'a [u64]>) -> u64 {
    sizes.filter_map(|s| s.first().copied()).max().unwrap_or(0)
}

/// The chunks that may meet `region`, among `chunks` sorted by offsets (so by their
/// start along dimension 0) whose extents along dimension 0 are at most `longest`:
/// those that start within `(region start - longest, region end)` along dimension 0.
/// Two binary searches, so a rank reading one shard of a tensor saved as R chunks
/// visits the few chunks near its rows, not all R (which made a resharded load plan
/// O(R) per tensor).
pub fn candidates<T: ChunkBox>(
    chunks: &[T],
    longest: u64,
    region: Region<'_>,
) -> std::ops::Range<usize> {
    let (Some(&lo), Some(&len)) = (region.offsets.first(), region.sizes.first()) else {
        return 0..chunks.len();
    };
    let hi = lo.saturating_add(len);
    let start = |c: &T| c.chunk_box().offsets.first().copied().unwrap_or(0);
    // A chunk that starts at or before `lo - longest` ends at or before `lo`.
    let first = chunks.partition_point(|c| start(c).saturating_add(longest) <= lo);
    let end = chunks.partition_point(|c| start(c) < hi).max(first);
    first..end
}

/// A chunk of a tensor, as the read planner sees it: its box in the global tensor.
pub trait ChunkBox {
    /// Its offsets and sizes.
    fn chunk_box(&self) -> Region<'_>;
}

impl ChunkBox for super::table::ChunkEntry {
    fn chunk_box(&self) -> Region<'_> {
        Region {
            offsets: &self.offsets,
            sizes: &self.sizes,
        }
    }
}

/// One chunk's part of a region read: the chunk's index, its runs inside the region,
/// and the pieces those runs touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRead {
    /// The chunk's index among the tensor's chunks.
    pub chunk: usize,
    /// Its runs inside the region.
    pub runs: Runs,
    /// The pieces (of the step's piece size) the runs touch, ascending.
    pub pieces: Vec<u64>,
}

/// The read plan of `region` of a tensor of `elem`-byte elements: for each chunk (of
/// `chunks`, sorted by offsets, dimension-0 extents at most `longest`) that meets the
/// region, its runs and pieces. Also
/// returns how many chunks were intersected (the work, which the tests count).
pub fn plan_region<T: ChunkBox>(
    elem: u64,
    piece_bytes: u64,
    chunks: &[T],
    longest: u64,
    region: Region<'_>,
) -> (Vec<ChunkRead>, usize) {
    let range = candidates(chunks, longest, region);
    let visited = range.len();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate().skip(range.start).take(visited) {
        if let Some(runs) = intersect(elem, c.chunk_box(), region) {
            let pieces = runs.pieces(piece_bytes);
            out.push(ChunkRead {
                chunk: i,
                runs,
                pieces,
            });
        }
    }
    (out, visited)
}

/// Bytes `[at, at + len)` of data file `file` that a read needs (one piece).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The data file's index in the opened step.
    pub file: usize,
    /// First byte in the file.
    pub at: u64,
    /// Its length.
    pub len: u64,
}

impl Span {
    fn end(&self) -> u64 {
        self.at.saturating_add(self.len)
    }
}

/// One range request of a coalesced read: bytes `[begin, end)` of `file`, which hold
/// the spans `members` (indices into the spans given to [`coalesce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// The data file.
    pub file: usize,
    /// First byte.
    pub begin: u64,
    /// End.
    pub end: u64,
    /// The spans it holds, in file order.
    pub members: Vec<usize>,
}

/// Group `spans` into range requests: spans of one file that touch or overlap (the same
/// piece wanted twice) share a request, as long as it stays within `max_bytes` (a span
/// larger than that is a request of its own). Every span is in exactly one request,
/// inside its range; the requests come in (file, offset) order.
pub fn coalesce(spans: &[Span], max_bytes: u64) -> Vec<Fetch> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans.get(i).map(|s| (s.file, s.at, s.len)));
    let mut out: Vec<Fetch> = Vec::new();
    for i in order {
        let Some(s) = spans.get(i) else { continue };
        if let Some(last) = out.last_mut() {
            let end = last.end.max(s.end());
            if last.file == s.file && s.at <= last.end && end - last.begin <= max_bytes {
                last.end = end;
                last.members.push(i);
                continue;
            }
        }
        out.push(Fetch {
            file: s.file,
            begin: s.at,
            end: s.end(),
            members: vec![i],
        });
    }
    out
}
