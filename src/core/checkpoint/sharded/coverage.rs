//! Whether a tensor's chunks tile it exactly (every element in exactly one chunk), in
//! O(n log n) steps for n chunks.
//!
//! The check sums signed boxes: the chunks count +1, the whole tensor -1, and the
//! chunks tile the tensor exactly when that sum is zero at every element. A sweep along
//! dimension 0 visits the coordinates where a box starts or ends; between two of them
//! the sum's cross-section does not change, so the sum is zero everywhere when, at each
//! such coordinate, the boxes that start there minus the boxes that end there sum to
//! zero over the remaining dimensions, which is the same question one dimension down.
//! Boxes of equal cross-section that start and end at one coordinate cancel before the
//! question is asked again (the row above a cut is the row below it), so a layout that
//! splits a tensor along one or two dimensions costs a sort per dimension. The first
//! coordinate, at each level, whose difference does not vanish gives an element whose
//! count is not 1: no chunk holds it (a gap), or two do (an overlap, both named).
//!
//! Invariants: the work is counted (each comparison of a sort and each box visited)
//! and bounded by [`STEPS_PER_CHUNK`] × n × (log2 n + 1); a table whose chunks would
//! need more (boxes ending inside the tensor along many dimensions, in no pattern a
//! sharding makes) is refused by that rule, so no table costs more than O(n log n).

use crate::safetensors::dtype::numel;

/// Steps (comparisons and box visits) the check may take per chunk and per bit of the
/// chunk count: far more than a sharding's layout takes (one or two sorts per
/// dimension it splits), so only a table that no sharding writes meets the bound.
pub const STEPS_PER_CHUNK: u64 = 256;

/// Check that `chunks` (offsets, sizes) tile a tensor of `shape` exactly: every chunk has
/// the tensor's rank and lies inside it, no chunk is empty (except the one chunk of a
/// tensor with no element, which is the whole tensor), no two overlap, and together they
/// cover every element. The error says which rule and which chunk or element.
pub fn check_coverage(shape: &[u64], chunks: &[(&[u64], &[u64])]) -> Result<(), String> {
    check_counted(shape, chunks, budget(chunks.len())).0
}

/// The step budget of `n` chunks.
fn budget(n: usize) -> u64 {
    let n = n as u64 + 1;
    let log = u64::from(u64::BITS - n.leading_zeros());
    STEPS_PER_CHUNK.saturating_mul(n).saturating_mul(log + 1)
}

/// [`check_coverage`] within `budget` steps, and the steps it took.
pub(crate) fn check_counted(
    shape: &[u64],
    chunks: &[(&[u64], &[u64])],
    budget: u64,
) -> (Result<(), String>, u64) {
    let Some(total) = numel(shape) else {
        return (Err("its element count overflows".into()), 0);
    };
    if total == 0 {
        let one = match chunks {
            [(o, s)] if o.iter().all(|&x| x == 0) && *s == shape && o.len() == shape.len() => {
                Ok(())
            }
            _ => Err(format!(
                "a tensor of no element has exactly one chunk, offsets 0 and sizes {shape:?}"
            )),
        };
        return (one, 0);
    }
    for (o, s) in chunks {
        if let Err(e) = check_box(shape, o, s) {
            return (Err(e), 0);
        }
    }
    let mut sweep = Sweep {
        shape,
        chunks,
        steps: 0,
        budget,
        point: Vec::with_capacity(shape.len()),
    };
    let mut set: Vec<Signed> = (0..chunks.len()).map(|i| Signed { id: i, w: 1 }).collect();
    set.push(Signed {
        id: chunks.len(),
        w: -1,
    });
    let found = sweep.solve(0, set);
    let steps = sweep.steps;
    let result = match found {
        Ok(()) => Ok(()),
        Err(Stop::Budget) => Err(format!(
            "checking that its {} chunks tile it would take more than {budget} steps \
             ({STEPS_PER_CHUNK} per chunk and bit of their count): they end inside the \
             tensor along more dimensions than a sharding splits",
            chunks.len()
        )),
        Err(Stop::At(point)) => Err(describe(shape, chunks, &point, total)),
    };
    (result, steps)
}

/// One chunk: the tensor's rank, not empty, inside the shape.
pub(crate) fn check_box(shape: &[u64], o: &[u64], s: &[u64]) -> Result<(), String> {
    if o.len() != shape.len() || s.len() != shape.len() {
        return Err(format!(
            "chunk offsets {o:?} sizes {s:?} do not have the tensor's {} dimensions",
            shape.len()
        ));
    }
    for ((&off, &size), &dim) in o.iter().zip(s).zip(shape) {
        if size == 0 {
            return Err(format!("chunk at {o:?} sizes {s:?} is empty"));
        }
        if off.checked_add(size).is_none_or(|end| end > dim) {
            return Err(format!(
                "chunk at {o:?} sizes {s:?} reaches outside the shape {shape:?}"
            ));
        }
    }
    Ok(())
}

/// A box with its weight: a chunk (`id` < n), or the whole tensor (`id` == n).
#[derive(Debug, Clone, Copy)]
struct Signed {
    id: usize,
    w: i64,
}

/// Why the sweep stopped.
enum Stop {
    /// The sum is not zero at this element.
    At(Vec<u64>),
    /// The budget is spent.
    Budget,
}

struct Sweep<'a> {
    shape: &'a [u64],
    chunks: &'a [(&'a [u64], &'a [u64])],
    steps: u64,
    budget: u64,
    /// The coordinates chosen so far, one per dimension above the current one.
    point: Vec<u64>,
}

impl Sweep<'_> {
    /// Where box `id` starts and ends along dimension `d` (the checked boxes lie inside
    /// the shape, so the sum cannot overflow).
    fn span(&self, id: usize, d: usize) -> (u64, u64) {
        match self.chunks.get(id) {
            Some((o, s)) => {
                let lo = o.get(d).copied().unwrap_or(0);
                (lo, lo.saturating_add(s.get(d).copied().unwrap_or(0)))
            }
            None => (0, self.shape.get(d).copied().unwrap_or(0)),
        }
    }

    /// Boxes `a` and `b` ordered by their extents along dimensions `from..`.
    fn cross_section(&self, a: usize, b: usize, from: usize) -> std::cmp::Ordering {
        (from..self.shape.len())
            .map(|d| self.span(a, d).cmp(&self.span(b, d)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }

    fn charge(&mut self, n: u64) -> Result<(), Stop> {
        self.steps = self.steps.saturating_add(n);
        if self.steps > self.budget {
            Err(Stop::Budget)
        } else {
            Ok(())
        }
    }

    /// The signed sum of `set` over dimensions `j..` is zero everywhere.
    fn solve(&mut self, j: usize, set: Vec<Signed>) -> Result<(), Stop> {
        self.charge(set.len() as u64)?;
        if j >= self.shape.len() {
            // No dimension left: every box is the one element.
            return if set.iter().map(|b| b.w).sum::<i64>() == 0 {
                Ok(())
            } else {
                Err(Stop::At(self.point.clone()))
            };
        }
        let dim = self.shape.get(j).copied().unwrap_or(0);
        // (coordinate, box, weight): a box adds its weight where it starts and takes it
        // away where it ends (an end at the shape's edge changes nothing inside).
        let mut events: Vec<(u64, Signed)> = Vec::with_capacity(set.len().saturating_mul(2));
        for b in &set {
            let (lo, hi) = self.span(b.id, j);
            events.push((lo, *b));
            if hi < dim {
                events.push((hi, Signed { id: b.id, w: -b.w }));
            }
        }
        drop(set);
        let mut compared = 0u64;
        events.sort_unstable_by(|a, b| {
            compared += 1;
            a.0.cmp(&b.0)
        });
        self.charge(compared)?;
        let mut rest = events.as_slice();
        while let Some(&(at, _)) = rest.first() {
            let n = rest.iter().take_while(|e| e.0 == at).count();
            let (here, later) = rest.split_at(n);
            rest = later;
            let mut sub: Vec<Signed> = here.iter().map(|e| e.1).collect();
            if j + 1 < self.shape.len() {
                sub = self.cancel(sub, j + 1)?;
            }
            if sub.is_empty() {
                continue;
            }
            self.point.push(at);
            self.solve(j + 1, sub)?;
            self.point.pop();
        }
        Ok(())
    }

    /// `set` with the boxes of equal extent along dimensions `from..` merged into one of
    /// their summed weight, those of weight zero dropped.
    fn cancel(&mut self, mut set: Vec<Signed>, from: usize) -> Result<Vec<Signed>, Stop> {
        let mut compared = 0u64;
        set.sort_unstable_by(|a, b| {
            compared += 1;
            self.cross_section(a.id, b.id, from)
        });
        self.charge(compared.saturating_add(set.len() as u64))?;
        let mut out: Vec<Signed> = Vec::with_capacity(set.len());
        for b in set {
            match out.last_mut() {
                Some(last) if self.cross_section(last.id, b.id, from).is_eq() => last.w += b.w,
                _ => out.push(b),
            }
        }
        out.retain(|b| b.w != 0);
        Ok(out)
    }
}

/// The problem at `point`, an element whose count is not 1: the two first chunks that
/// hold it, or that none does.
fn describe(shape: &[u64], chunks: &[(&[u64], &[u64])], point: &[u64], total: u64) -> String {
    let holds = |(o, s): &(&[u64], &[u64])| {
        o.iter()
            .zip(s.iter())
            .zip(point)
            .all(|((&o, &s), &p)| o <= p && p < o.saturating_add(s))
    };
    let mut holders = chunks.iter().filter(|c| holds(c));
    match (holders.next(), holders.next()) {
        (Some(a), Some(b)) => format!(
            "chunk at {:?} sizes {:?} overlaps chunk at {:?} sizes {:?}",
            a.0, a.1, b.0, b.1
        ),
        _ => {
            let covered: u128 = chunks
                .iter()
                .map(|(_, s)| s.iter().map(|&d| u128::from(d)).product::<u128>())
                .fold(0, u128::saturating_add);
            format!(
                "no chunk holds the element at {point:?} of the shape {shape:?}: the chunks \
                 cover {covered} of its {total} elements (a gap)"
            )
        }
    }
}

/// The pairwise check this module replaces, kept as the oracle of its tests: every pair
/// of chunks that share rows compared, then the covered count.
#[cfg(test)]
pub(crate) fn check_coverage_pairwise(
    shape: &[u64],
    chunks: &[(&[u64], &[u64])],
) -> Result<(), String> {
    let total = numel(shape).ok_or("its element count overflows")?;
    if total == 0 {
        return check_counted(shape, chunks, 0).0;
    }
    let mut covered: u128 = 0;
    for (o, s) in chunks {
        check_box(shape, o, s)?;
        covered = covered.saturating_add(s.iter().map(|&d| u128::from(d)).product::<u128>());
    }
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_by(|&a, &b| {
        let first = |i: usize| chunks.get(i).map(|(o, _)| *o);
        first(a).cmp(&first(b))
    });
    let overlap = |(ao, asz): (&[u64], &[u64]), (bo, bsz): (&[u64], &[u64])| {
        ao.iter()
            .zip(asz)
            .zip(bo.iter().zip(bsz))
            .all(|((&a0, &al), (&b0, &bl))| {
                a0 < b0.saturating_add(bl) && b0 < a0.saturating_add(al)
            })
    };
    for (i, &ia) in order.iter().enumerate() {
        let Some(&a) = chunks.get(ia) else { continue };
        let a_end = match (a.0.first(), a.1.first()) {
            (Some(&o), Some(&s)) => o.saturating_add(s),
            _ => u64::MAX,
        };
        for &ib in order.iter().skip(i + 1) {
            let Some(&b) = chunks.get(ib) else { continue };
            if b.0.first().is_some_and(|&start| start >= a_end) {
                break;
            }
            if overlap(a, b) {
                return Err(format!(
                    "chunk at {:?} sizes {:?} overlaps chunk at {:?} sizes {:?}",
                    a.0, a.1, b.0, b.1
                ));
            }
        }
    }
    if covered != u128::from(total) {
        return Err(format!(
            "the chunks cover {covered} of its {total} elements (a gap)"
        ));
    }
    Ok(())
}
