//! The shard order of the stream's epochs (scale.md section 5) and the phase of a pass
//! (tokens.md): in file order, or a Fisher-Yates permutation per epoch drawn from the
//! stream's generator; each pass starts at a phase drawn from the same generator.
//!
//! Invariants: an order is always a permutation of the shard indices, whatever the
//! generator gives; a phase always leaves one window in range.

use crate::pcg::{Pcg32, RngState};

/// The order in which each epoch (one pass over every shard) visits the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardOrder {
    /// 0, 1, ..., S - 1 every epoch: tokens.md's stream.
    #[default]
    InOrder,
    /// A permutation per epoch, drawn from the stream's generator at the epoch's start
    /// (before the first pass's phase) by [`shuffle_order`].
    Shuffled,
}

/// The shard order of one epoch of a shuffled stream over `count` shards: Fisher-Yates
/// from the identity, `for i in (1..count).rev() { swap(i, rng.below(i + 1)) }`, so one
/// shard draws nothing and the order is a permutation whatever the generator gives.
pub fn shuffle_order(rng: &mut Pcg32, count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    for i in (1..count).rev() {
        // count <= MAX_SHARDS, so i + 1 fits u32.
        let bound = u32::try_from(i.saturating_add(1)).unwrap_or(u32::MAX);
        order.swap(i, (rng.below(bound) as usize).min(i));
    }
    order
}

/// The epoch the stream is in: its shard order and where in it the stream is.
#[derive(Debug, Clone)]
pub(super) struct Epoch {
    /// The generator before this epoch's order was drawn; `None` for an epoch in file
    /// order (every epoch of an in-order stream, and the rest of the epoch an in-order
    /// cursor was restored into in a shuffled stream).
    pub(super) start: Option<RngState>,
    /// The shards in visiting order; empty for file order.
    pub(super) order: Vec<usize>,
    /// The index in the visiting order of the current shard.
    pub(super) pos: usize,
}

impl Epoch {
    pub(super) fn in_order(shard: usize) -> Epoch {
        Epoch {
            start: None,
            order: Vec::new(),
            pos: shard,
        }
    }

    /// The shard at position `pos` of the order.
    pub(super) fn shard_at(&self, pos: usize) -> usize {
        if self.order.is_empty() {
            pos
        } else {
            self.order.get(pos).copied().unwrap_or(0)
        }
    }
}

/// The phase of a pass over a shard of `n` ids: `rng.below(min(T, n - T))`; the bound
/// keeps one window in range on a short shard.
pub(super) fn draw_phase(rng: &mut Pcg32, n: usize, seq_len: usize) -> usize {
    let bound = seq_len.min(n.saturating_sub(seq_len)).max(1);
    // Shards hold at most 2^31 - 1 ids, so the bound fits; saturating keeps the draw
    // in range even if it did not.
    rng.below(u32::try_from(bound).unwrap_or(u32::MAX)) as usize
}
