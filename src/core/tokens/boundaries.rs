//! Document boundaries of a stream's windows (scale.md section 8): `positions`, the
//! distance of each input from the start of its document (or from the window's start
//! when the document began before it), and `cu_seqlens`, the cumulative lengths of the
//! window's document pieces, as HF's flattening collator and the varlen kernels take
//! them.
//!
//! Invariants: a document starts at each offset its shard's sidecar (docs.rs) records,
//! or, for a shard without one, at each end-of-text id of the stream's `eot`; row `b`
//! of `cu_seqlens` is `0, s_1, ..., s_k, T` (the starts strictly inside the window)
//! padded with -1 to [`cu_seqlens_width`]`(T) = T + 1` values, the most a window can
//! need (a document at every input); a shard with neither source of boundaries is an
//! error naming it, and a batch that fails leaves the stream where it was.

use super::checks::Ticker;
use super::docs::{docs_path, read_docs, DocsError};
use super::mixture::Mixture;
use super::shard::Shard;
use super::stream::TokenStream;
use super::{TokensError, WindowOrigin};

/// The width of each row of `cu_seqlens` for windows of `seq_len` inputs: T + 1.
pub fn cu_seqlens_width(seq_len: usize) -> usize {
    seq_len.saturating_add(1)
}

/// Fill one window's `positions` (T values) and `cu_seqlens` (T + 1 values) from the
/// offsets in the window at which documents start (increasing; 0 and offsets at or
/// past T are ignored, the window's start always being a piece's start).
pub fn window_pieces(
    starts: impl IntoIterator<Item = usize>,
    positions: &mut [i32],
    cu_seqlens: &mut [i32],
) -> Result<(), TokensError> {
    let t = positions.len();
    let too_large = || TokensError::TooLarge {
        name: "seq_len",
        value: t as u64,
        limit: i32::MAX as u64 - 1,
    };
    let t32 = i32::try_from(t).map_err(|_| too_large())?;
    if cu_seqlens.len() != cu_seqlens_width(t) || t32 == i32::MAX {
        return Err(TokensError::BadOptions(format!(
            "cu_seqlens holds {} values, a window of {t} needs {}",
            cu_seqlens.len(),
            cu_seqlens_width(t)
        )));
    }
    cu_seqlens.fill(-1);
    let mut cuts = cu_seqlens.iter_mut();
    if let Some(c) = cuts.next() {
        *c = 0;
    }
    let mut starts = starts.into_iter().filter(|&s| s > 0 && s < t).peekable();
    let mut piece_start = 0usize;
    for (i, p) in positions.iter_mut().enumerate() {
        while let Some(s) = starts.next_if(|&s| s <= i) {
            // A repeated start is no new piece (every start > 0, so the first is new).
            if s > piece_start {
                piece_start = s;
                if let Some(c) = cuts.next() {
                    *c = i32::try_from(s).map_err(|_| too_large())?;
                }
            }
        }
        *p = i32::try_from(i.saturating_sub(piece_start)).map_err(|_| too_large())?;
    }
    if let Some(c) = cuts.next() {
        *c = t32;
    }
    Ok(())
}

/// Where a stream's document starts come from: each shard's sidecar, else `eot`.
/// Holds the sidecar of the shard read last (a stream reads one shard at a time).
#[derive(Debug, Default)]
pub struct Boundaries {
    eot: Option<u32>,
    cached: Option<(usize, Option<Vec<u64>>)>,
}

impl Boundaries {
    /// Boundaries from the shards' sidecars, else at each `eot` id.
    pub fn new(eot: Option<u32>) -> Boundaries {
        Boundaries { eot, cached: None }
    }

    /// The end-of-text id the boundaries fall back on.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Fill the positions and cu_seqlens of the window of `inputs` at `offset` of
    /// shard `index` (`shard`).
    pub fn fill_window(
        &mut self,
        shard: &Shard,
        index: usize,
        offset: usize,
        inputs: &[i64],
        positions: &mut [i32],
        cu_seqlens: &mut [i32],
    ) -> Result<(), TokensError> {
        if self.cached.as_ref().is_none_or(|(i, _)| *i != index) {
            let starts = read_docs(shard.local_path(), shard.len() as u64)?;
            self.cached = Some((index, starts));
        }
        let sidecar = self.cached.as_ref().and_then(|(_, s)| s.as_deref());
        match (sidecar, self.eot) {
            (Some(starts), _) => {
                let from = offset as u64;
                let end = from.saturating_add(inputs.len() as u64);
                let first = starts.partition_point(|&s| s < from);
                let inside = starts
                    .get(first..)
                    .unwrap_or_default()
                    .iter()
                    .take_while(|&&s| s < end)
                    .map(|&s| usize::try_from(s.saturating_sub(from)).unwrap_or(usize::MAX));
                window_pieces(inside, positions, cu_seqlens)
            }
            (None, Some(eot)) => {
                let eot = i64::from(eot);
                let inside = inputs.iter().enumerate().filter(|(_, &id)| id == eot);
                window_pieces(inside.map(|(i, _)| i), positions, cu_seqlens)
            }
            (None, None) => Err(DocsError::NoBoundaries {
                shard: shard.path().to_path_buf(),
                sidecar: docs_path(shard.path()),
            }
            .into()),
        }
    }
}

/// Check that `positions` holds B × T values and `cu_seqlens` B × (T + 1).
fn check_buffers(b: usize, t: usize, positions: &[i32], cu: &[i32]) -> Result<(), TokensError> {
    let want = [
        ("positions", positions.len(), b.saturating_mul(t)),
        (
            "cu_seqlens",
            cu.len(),
            b.saturating_mul(cu_seqlens_width(t)),
        ),
    ];
    for (name, len, need) in want {
        if len != need {
            return Err(TokensError::BadOptions(format!(
                "{name} holds {len} values, a batch of {b} windows of {t} needs {need}"
            )));
        }
    }
    Ok(())
}

impl TokenStream {
    /// [`TokenStream::next_batch_into_cancellable`] that also fills each window's
    /// `positions` ([B, T]) and `cu_seqlens` ([B, T + 1]) from `boundaries`; on an
    /// error the stream is unchanged.
    pub fn next_batch_boundaries_into(
        &mut self,
        boundaries: &mut Boundaries,
        inputs: &mut [i64],
        targets: &mut [i64],
        positions: &mut [i32],
        cu_seqlens: &mut [i32],
        cancel: &mut dyn FnMut() -> bool,
    ) -> Result<(), TokensError> {
        let (b, t) = (self.batch(), self.seq_len());
        check_buffers(b, t, positions, cu_seqlens)?;
        let want = b.saturating_mul(t);
        for (name, len) in [("inputs", inputs.len()), ("targets", targets.len())] {
            if len != want {
                return Err(TokensError::BatchBuffer {
                    name,
                    len,
                    batch: b,
                    seq_len: t,
                });
            }
        }
        let before = self.mark();
        let mut ticks = Ticker::new(cancel);
        let result = self.walk_with_boundaries(
            boundaries,
            (inputs, targets),
            (positions, cu_seqlens),
            &mut ticks,
        );
        if result.is_err() {
            self.reset(before);
        }
        result
    }

    fn walk_with_boundaries(
        &mut self,
        boundaries: &mut Boundaries,
        (inputs, targets): (&mut [i64], &mut [i64]),
        (positions, cu): (&mut [i32], &mut [i32]),
        ticks: &mut Ticker<'_>,
    ) -> Result<(), TokensError> {
        let (b, t) = (self.batch(), self.seq_len());
        let ranks = self.ranks();
        self.skip(ranks.rank.saturating_mul(b), ticks)?;
        let rows = inputs
            .chunks_exact_mut(t)
            .zip(targets.chunks_exact_mut(t))
            .zip(positions.chunks_exact_mut(t))
            .zip(cu.chunks_exact_mut(cu_seqlens_width(t)));
        for (((x, y), p), c) in rows {
            let at = self.advance(ticks)?;
            self.read_window(at, x, y)?;
            if let Some(shard) = self.shards().get(at.0) {
                boundaries.fill_window(shard, at.0, at.1, x, p, c)?;
            }
            ticks.add(t)?;
        }
        let after = ranks
            .world_size
            .saturating_sub(ranks.rank)
            .saturating_sub(1);
        self.skip(after.saturating_mul(b), ticks)?;
        self.check_held()
    }
}

impl Mixture {
    /// Fill `positions` ([B, T]) and `cu_seqlens` ([B, T + 1]) of the batch just read
    /// into `inputs`, whose rows came from `origins`, with `boundaries[j]` for source
    /// `j`. Reads only sidecars (the ids are in `inputs`).
    pub fn fill_boundaries(
        &self,
        boundaries: &mut [Boundaries],
        origins: &[WindowOrigin],
        inputs: &[i64],
        positions: &mut [i32],
        cu_seqlens: &mut [i32],
    ) -> Result<(), TokensError> {
        let (b, t) = (self.batch(), self.seq_len());
        check_buffers(b, t, positions, cu_seqlens)?;
        let rows = inputs
            .chunks_exact(t)
            .zip(positions.chunks_exact_mut(t))
            .zip(cu_seqlens.chunks_exact_mut(cu_seqlens_width(t)));
        for (((x, p), c), origin) in rows.zip(origins) {
            let shard = self
                .source(origin.source)
                .and_then(|s| s.shards().get(origin.shard));
            let (Some(shard), Some(bounds)) = (shard, boundaries.get_mut(origin.source)) else {
                return Err(TokensError::BadOptions(format!(
                    "no source {} shard {} in this mixture",
                    origin.source, origin.shard
                )));
            };
            bounds.fill_window(shard, origin.shard, origin.offset, x, p, c)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: split the window at the starts, as the collator sees pieces.
    fn reference(t: usize, starts: &[usize]) -> (Vec<i32>, Vec<i32>) {
        let mut cuts = vec![0usize];
        cuts.extend(starts.iter().copied().filter(|&s| s > 0 && s < t));
        cuts.push(t);
        let mut positions = Vec::new();
        for w in cuts.windows(2) {
            positions.extend((0..w[1] - w[0]).map(|i| i as i32));
        }
        let mut cu: Vec<i32> = cuts.iter().map(|&c| c as i32).collect();
        cu.resize(t + 1, -1);
        (positions, cu)
    }

    proptest! {
        #[test]
        fn pieces_equal_the_reference(t in 1usize..64, mut starts in proptest::collection::vec(0usize..80, 0..20)) {
            starts.sort_unstable();
            starts.dedup();
            let mut p = vec![7; t];
            let mut c = vec![7; t + 1];
            window_pieces(starts.iter().copied(), &mut p, &mut c).unwrap();
            prop_assert_eq!((p, c), reference(t, &starts));
        }
    }

    #[test]
    fn a_window_of_hand_pieces() {
        let mut p = vec![0; 6];
        let mut c = vec![0; 7];
        window_pieces([0, 2, 5], &mut p, &mut c).unwrap();
        assert_eq!(p, [0, 1, 0, 1, 2, 0]);
        assert_eq!(c, [0, 2, 5, 6, -1, -1, -1]);
        window_pieces([], &mut p, &mut c).unwrap();
        assert_eq!(p, [0, 1, 2, 3, 4, 5]);
        assert_eq!(c, [0, 6, -1, -1, -1, -1, -1]);
        assert!(window_pieces([], &mut p, &mut [0; 6]).is_err());
    }
}
