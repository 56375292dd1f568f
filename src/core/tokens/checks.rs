//! The limits of the token stream and the checks run before a stream is built: its
//! shape (T, B), its ranks, and its shards (one vocabulary, each holding a window).
//!
//! Invariants: every check runs with checked arithmetic before anything is allocated,
//! so a size from a flag can never ask for more than the named limits.

use super::shard::Shard;
use super::stream::Ranks;
use super::TokensError;

/// Largest cursor file read (a cursor is about 100 bytes of JSON).
pub const MAX_CURSOR_BYTES: u64 = 1 << 16;

/// Most ids one batch may span, B × (T + 1): each batch allocates two [B, T] arrays of
/// i64 (256 MiB together at the limit), so a size from a flag can never ask for more.
pub const MAX_BATCH_TOKENS: u64 = 1 << 24;

/// Most ranks one stream may be split into: far beyond any data-parallel run, and small
/// enough that a typo (`2**40`) is refused instead of walked.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Most windows of one global batch, B × world_size: every rank walks the whole global
/// batch, a pass at a time, so this bounds a batch's walk even when every pass holds a
/// single window.
pub const MAX_GLOBAL_BATCH: usize = 1 << 24;

/// Most shards of one stream (an epoch's order is drawn with 32-bit bounds).
pub const MAX_SHARDS: usize = 1 << 24;

/// Units of work (ids read, passes started) between two calls of a batch's `cancel`.
pub(super) const CANCEL_EVERY: usize = 1 << 20;

/// Check T >= 1, B >= 1 and B × (T + 1) <= [`MAX_BATCH_TOKENS`], with checked
/// arithmetic, before anything is allocated or created.
pub fn check_batch_shape(seq_len: usize, batch: usize) -> Result<(), TokensError> {
    if seq_len < 1 {
        return Err(TokensError::BadArg {
            name: "seq_len",
            value: seq_len,
        });
    }
    if batch < 1 {
        return Err(TokensError::BadArg {
            name: "batch",
            value: batch,
        });
    }
    let ids = (seq_len as u64)
        .checked_add(1)
        .and_then(|w| w.checked_mul(batch as u64));
    match ids {
        Some(n) if n <= MAX_BATCH_TOKENS => Ok(()),
        _ => Err(TokensError::BatchTooLarge {
            batch,
            seq_len,
            limit: MAX_BATCH_TOKENS,
        }),
    }
}

/// Check 1 <= world_size <= [`MAX_WORLD_SIZE`], rank < world_size, and B × world_size
/// <= [`MAX_GLOBAL_BATCH`] windows (the global batch is walked, never allocated).
pub fn check_ranks(batch: usize, ranks: Ranks) -> Result<(), TokensError> {
    if ranks.world_size < 1 {
        return Err(TokensError::BadArg {
            name: "world_size",
            value: ranks.world_size,
        });
    }
    if ranks.world_size > MAX_WORLD_SIZE {
        return Err(TokensError::TooLarge {
            name: "world_size",
            value: ranks.world_size as u64,
            limit: MAX_WORLD_SIZE as u64,
        });
    }
    if ranks.rank >= ranks.world_size {
        return Err(TokensError::BadRank {
            rank: ranks.rank,
            world_size: ranks.world_size,
        });
    }
    match batch.checked_mul(ranks.world_size) {
        Some(g) if g <= MAX_GLOBAL_BATCH => Ok(()),
        _ => Err(TokensError::GlobalBatchOverflow {
            batch,
            world_size: ranks.world_size,
            limit: MAX_GLOBAL_BATCH,
        }),
    }
}

/// One stream, one vocabulary: shards recording different ones (a GPT-2 shard next to
/// a Llama-3 one) are never mixed.
pub(super) fn check_one_vocab(shards: &[Shard]) -> Result<(), TokensError> {
    let mut first_recorded: Option<(&Shard, u32)> = None;
    for shard in shards {
        let Some(recorded) = shard.header().vocab else {
            continue;
        };
        match first_recorded {
            None => first_recorded = Some((shard, recorded)),
            Some((first, v)) if v != recorded => {
                return Err(TokensError::MixedVocab {
                    path: shard.path().to_path_buf(),
                    recorded,
                    first: first.path().to_path_buf(),
                    first_recorded: v,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Every shard holds a window, and matches the given vocabulary.
pub(super) fn check_each_shard(
    shards: &[Shard],
    seq_len: usize,
    vocab: Option<u32>,
) -> Result<(), TokensError> {
    for (index, shard) in shards.iter().enumerate() {
        if shard.len() <= seq_len {
            return Err(TokensError::ShardTooShort {
                shard: index,
                path: shard.path().to_path_buf(),
                count: shard.len() as u64,
                seq_len,
            });
        }
        if let Some(expected) = vocab {
            match shard.vocab() {
                Some(recorded) if recorded != expected => {
                    return Err(TokensError::VocabMismatch {
                        path: shard.path().to_path_buf(),
                        recorded,
                        expected,
                    })
                }
                Some(_) => {}
                None => shard.check_ids(expected)?,
            }
        }
    }
    Ok(())
}

/// Counts a batch's work and asks `cancel` every [`CANCEL_EVERY`] units.
pub(super) struct Ticker<'a> {
    cancel: &'a mut dyn FnMut() -> bool,
    work: usize,
}

impl<'a> Ticker<'a> {
    /// A ticker that has counted nothing yet.
    pub(super) fn new(cancel: &'a mut dyn FnMut() -> bool) -> Ticker<'a> {
        Ticker { cancel, work: 0 }
    }

    /// Count `units` of work; every [`CANCEL_EVERY`] units, ask `cancel`, and stop
    /// with [`TokensError::Interrupted`] when it says so.
    pub(super) fn add(&mut self, units: usize) -> Result<(), TokensError> {
        self.work = self.work.saturating_add(units);
        if self.work >= CANCEL_EVERY {
            self.work = 0;
            if (self.cancel)() {
                return Err(TokensError::Interrupted);
            }
        }
        Ok(())
    }
}
