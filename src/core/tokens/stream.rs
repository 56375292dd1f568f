//! The token stream of tokens.md: windows of T + 1 ids, T apart within a pass, each pass
//! starting at a random phase drawn from PCG32, shards in order, wrapping; and its ranks
//! (python.md): rank r of W reads windows r*B .. (r+1)*B of each global batch of B*W.
//!
//! Invariants: the current shard index is always valid and the offset never exceeds
//! the shard's length, so every window read is in range; the generator is used only
//! when a pass starts; every rank walks the whole global batch (skipping the other
//! ranks' windows without reading them), so the cursor is the same on every rank;
//! `cursor()` (shard, offset of the NEXT window, generator state, and the global batch
//! when there are ranks) is the whole position, so `restore(cursor())` on a fresh
//! stream over the same shards continues bit for bit.

use std::num::NonZeroU64;
use std::path::Path;

use super::shard::{check_shard_vocab, Shard};
use super::TokensError;
use crate::cursor::Cursor;
use crate::pcg::{Pcg32, RngState};

/// One batch: B windows as fresh row-major [B, T] arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// inputs[b * T + t] = ids[o_b + t].
    pub inputs: Vec<i64>,
    /// targets[b * T + t] = ids[o_b + t + 1]: the next token of each input.
    pub targets: Vec<i64>,
    /// B, the number of rows.
    pub batch: usize,
    /// T, the number of columns.
    pub seq_len: usize,
}

impl Batch {
    /// Row `b` of the inputs.
    pub fn input_row(&self, b: usize) -> Option<&[i64]> {
        row(&self.inputs, b, self.seq_len)
    }

    /// Row `b` of the targets.
    pub fn target_row(&self, b: usize) -> Option<&[i64]> {
        row(&self.targets, b, self.seq_len)
    }
}

fn row(values: &[i64], b: usize, t: usize) -> Option<&[i64]> {
    let start = b.checked_mul(t)?;
    values.get(start..start.checked_add(t)?)
}

fn bad(field: &str, reason: impl Into<String>) -> TokensError {
    TokensError::BadCursor {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Which part of each global batch a stream reads: rank `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    /// This process's rank, below `world_size`.
    pub rank: usize,
    /// The number of ranks, at least 1.
    pub world_size: usize,
}

impl Ranks {
    /// One process: rank 0 of 1.
    pub const SINGLE: Ranks = Ranks {
        rank: 0,
        world_size: 1,
    };
}

/// Windows over a list of shards, resumable from a `Cursor`.
#[derive(Debug)]
pub struct TokenStream {
    shards: Vec<Shard>,
    seq_len: usize,
    batch: usize,
    ranks: Ranks,
    rng: Pcg32,
    shard: usize,
    offset: usize,
}

/// The phase of a pass over a shard of `n` ids: `rng.below(min(T, n - T))`; the bound
/// keeps one window in range on a short shard.
fn draw_phase(rng: &mut Pcg32, n: usize, seq_len: usize) -> usize {
    let bound = seq_len.min(n.saturating_sub(seq_len)).max(1);
    // Shards hold at most 2^31 - 1 ids, so the bound fits; saturating keeps the draw
    // in range even if it did not.
    rng.below(u32::try_from(bound).unwrap_or(u32::MAX)) as usize
}

/// Largest cursor file read (a cursor is about 100 bytes of JSON).
pub const MAX_CURSOR_BYTES: u64 = 1 << 16;

/// Most ids one batch may span, B × (T + 1): each batch allocates two [B, T] arrays of
/// i64 (256 MiB together at the limit), so a size from a flag can never ask for more.
pub const MAX_BATCH_TOKENS: u64 = 1 << 24;

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

/// Check world_size >= 1, rank < world_size, and that B × world_size windows fit a
/// count (the global batch is walked, never allocated).
pub fn check_ranks(batch: usize, ranks: Ranks) -> Result<(), TokensError> {
    if ranks.world_size < 1 {
        return Err(TokensError::BadArg {
            name: "world_size",
            value: ranks.world_size,
        });
    }
    if ranks.rank >= ranks.world_size {
        return Err(TokensError::BadRank {
            rank: ranks.rank,
            world_size: ranks.world_size,
        });
    }
    batch
        .checked_mul(ranks.world_size)
        .map(|_| ())
        .ok_or(TokensError::GlobalBatchOverflow {
            batch,
            world_size: ranks.world_size,
        })
}

/// One stream, one vocabulary: shards recording different ones (a GPT-2 shard next to
/// a Llama-3 one) are never mixed.
fn check_one_vocab(shards: &[Shard]) -> Result<(), TokensError> {
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
fn check_each_shard(
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

impl TokenStream {
    /// A stream over `shards` with windows of `seq_len` (T) inputs and `batch` (B)
    /// windows per batch. Checks: at least one shard, T >= 1, B >= 1, every shard holds
    /// at least T + 1 ids, the shards that record a vocabulary record the same one, and
    /// a given `vocab_size` equals each shard's vocabulary (a shard that records none
    /// has its ids checked against it). The first pass starts
    /// on shard 0 at a phase drawn from `rng`.
    pub fn new(
        shards: Vec<Shard>,
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab_size: Option<u32>,
    ) -> Result<TokenStream, TokensError> {
        TokenStream::with_ranks(shards, seq_len, batch, rng, vocab_size, Ranks::SINGLE)
    }

    /// [`TokenStream::new`] for rank `ranks.rank` of `ranks.world_size`: the global
    /// stream is the single-process stream of batch B × world_size, and this stream
    /// yields windows rank*B .. (rank+1)*B of each global batch.
    pub fn with_ranks(
        shards: Vec<Shard>,
        seq_len: usize,
        batch: usize,
        mut rng: Pcg32,
        vocab_size: Option<u32>,
        ranks: Ranks,
    ) -> Result<TokenStream, TokensError> {
        if shards.is_empty() {
            return Err(TokensError::NoShards);
        }
        check_batch_shape(seq_len, batch)?;
        check_ranks(batch, ranks)?;
        let vocab = vocab_size
            .map(|v| check_shard_vocab(u64::from(v)))
            .transpose()?;
        check_one_vocab(&shards)?;
        check_each_shard(&shards, seq_len, vocab)?;
        let first_len = shards.first().map_or(0, Shard::len);
        let offset = draw_phase(&mut rng, first_len, seq_len);
        Ok(TokenStream {
            shards,
            seq_len,
            batch,
            ranks,
            rng,
            shard: 0,
            offset,
        })
    }

    /// Open `paths` as shards (each validated, its ids checked against `vocab_size`
    /// when it records none) and build the stream of [`TokenStream::with_ranks`].
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab_size: Option<u32>,
        ranks: Ranks,
    ) -> Result<TokenStream, TokensError> {
        let shards = paths
            .iter()
            .map(|p| Shard::open(p.as_ref(), vocab_size))
            .collect::<Result<Vec<_>, _>>()?;
        TokenStream::with_ranks(shards, seq_len, batch, rng, vocab_size, ranks)
    }

    /// T.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// B, this rank's windows per batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The rank and world size.
    pub fn ranks(&self) -> Ranks {
        self.ranks
    }

    /// B × world_size, the windows of one global batch (checked at construction).
    pub fn global_batch(&self) -> usize {
        self.batch.saturating_mul(self.ranks.world_size)
    }

    /// The shards, in stream order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    fn shard_len(&self, index: usize) -> usize {
        self.shards.get(index).map_or(0, Shard::len)
    }

    /// Move past the next window, starting a new pass first when no window fits at the
    /// offset; returns the window's shard and offset.
    fn advance(&mut self) -> (usize, usize) {
        let span = self.seq_len.saturating_add(1);
        if self.offset.saturating_add(span) > self.shard_len(self.shard) {
            self.shard = (self.shard + 1) % self.shards.len();
            let n = self.shard_len(self.shard);
            self.offset = draw_phase(&mut self.rng, n, self.seq_len);
        }
        let at = (self.shard, self.offset);
        self.offset = self.offset.saturating_add(self.seq_len);
        at
    }

    /// Read the next window (T + 1 ids) straight into one row of inputs (its first T
    /// ids) and one row of targets (its last T): no intermediate buffer, each id
    /// widened once per row it lands in.
    fn next_window(&mut self, inputs: &mut [i64], targets: &mut [i64]) {
        let (shard, offset) = self.advance();
        let read = self.shards.get(shard).and_then(|s| {
            s.copy_to_i64(offset, inputs)?;
            s.copy_to_i64(offset.checked_add(1)?, targets)
        });
        // Every shard holds at least T + 1 ids and a pass starts at a phase below
        // n - T, so the window is always in range (the struct invariant). Were it ever
        // broken, a silently stale window would train on wrong data: stop instead.
        #[allow(
            clippy::expect_used,
            reason = "a broken struct invariant must stop, never yield a stale window"
        )]
        read.expect("invariant: every window of a pass lies inside its shard");
    }

    /// Skip `n` windows without reading them (the other ranks' part of a batch).
    fn skip(&mut self, n: usize) {
        for _ in 0..n {
            self.advance();
        }
    }

    /// The next B windows as fresh [B, T] arrays. A batch may span passes and shards.
    pub fn next_batch(&mut self) -> Batch {
        let (b, t) = (self.batch, self.seq_len);
        let mut inputs = vec![0i64; b.saturating_mul(t)];
        let mut targets = vec![0i64; b.saturating_mul(t)];
        self.fill_batch(&mut inputs, &mut targets);
        Batch {
            inputs,
            targets,
            batch: b,
            seq_len: t,
        }
    }

    /// The next B windows into caller-provided row-major [B, T] arrays (for a binding
    /// that owns the memory). Both must hold exactly B × T values; on an error nothing
    /// is read and the stream is unchanged.
    pub fn next_batch_into(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
    ) -> Result<(), TokensError> {
        let want = self.batch.saturating_mul(self.seq_len);
        for (name, len) in [("inputs", inputs.len()), ("targets", targets.len())] {
            if len != want {
                return Err(TokensError::BatchBuffer {
                    name,
                    len,
                    batch: self.batch,
                    seq_len: self.seq_len,
                });
            }
        }
        self.fill_batch(inputs, targets);
        Ok(())
    }

    /// Walk one global batch, reading this rank's B windows into `inputs` and
    /// `targets` (each of B × T values, checked by the callers).
    fn fill_batch(&mut self, inputs: &mut [i64], targets: &mut [i64]) {
        let t = self.seq_len;
        self.skip(self.ranks.rank.saturating_mul(self.batch));
        for (x, y) in inputs.chunks_exact_mut(t).zip(targets.chunks_exact_mut(t)) {
            self.next_window(x, y);
        }
        let after = self
            .ranks
            .world_size
            .saturating_sub(self.ranks.rank)
            .saturating_sub(1);
        self.skip(after.saturating_mul(self.batch));
    }

    /// The whole position: shard, offset of the next window, generator state, and the
    /// global batch when the stream has ranks (identical on every rank).
    pub fn cursor(&self) -> Cursor {
        let global_batch = if self.ranks.world_size > 1 {
            NonZeroU64::new(self.global_batch() as u64)
        } else {
            None
        };
        Cursor {
            shard: self.shard as u64,
            offset: self.offset as u64,
            rng: RngState::of(&self.rng),
            global_batch,
        }
    }

    /// Move to `cursor`. Checks shard < S, offset <= the shard's length (an offset where
    /// no window fits starts a new pass at the next read), an odd increment, and a
    /// `global_batch`, when the cursor carries one, equal to B × world_size; on error
    /// the stream is unchanged.
    pub fn restore(&mut self, cursor: &Cursor) -> Result<(), TokensError> {
        if let Some(g) = cursor.global_batch {
            let ours = self.global_batch() as u64;
            if g.get() != ours {
                return Err(TokensError::GlobalBatchMismatch {
                    cursor: g.get(),
                    stream: ours,
                    batch: self.batch,
                    world_size: self.ranks.world_size,
                });
            }
        }
        let shard = usize::try_from(cursor.shard)
            .ok()
            .filter(|&s| s < self.shards.len())
            .ok_or_else(|| {
                bad(
                    "shard",
                    format!(
                        "{} is out of range: the stream has {} shard(s)",
                        cursor.shard,
                        self.shards.len()
                    ),
                )
            })?;
        let n = self.shard_len(shard);
        let offset = usize::try_from(cursor.offset)
            .ok()
            .filter(|&o| o <= n)
            .ok_or_else(|| {
                let path = self
                    .shards
                    .get(shard)
                    .map(|s| s.path().display().to_string())
                    .unwrap_or_default();
                bad(
                    "offset",
                    format!(
                        "{} is past the end of shard {shard} ({path}, {n} ids)",
                        cursor.offset
                    ),
                )
            })?;
        let rng = cursor.rng.to_rng().ok_or_else(|| {
            bad(
                "rng.inc",
                format!(
                    "{:016x} is even; a PCG32 increment is always odd",
                    cursor.rng.inc
                ),
            )
        })?;
        self.shard = shard;
        self.offset = offset;
        self.rng = rng;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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

    fn open_all(paths: &[PathBuf]) -> Vec<Shard> {
        paths
            .iter()
            .map(|p| Shard::open(p, None).unwrap())
            .collect()
    }

    /// The first seed whose first two `below(3)` draws are `a` then `b`.
    fn seed_drawing(a: u32, b: u32) -> u64 {
        (0u64..)
            .find(|&s| {
                let mut r = Pcg32::seed(s, DEFAULT_SEQ);
                r.below(3) == a && r.below(3) == b
            })
            .unwrap()
    }

    #[test]
    fn test_hand_example_token_windows() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<u32> = (10..20).collect();
        let path = write(dir.path(), "hand.bin", &ids, 256);
        // The spec's generator: seed(42, 54) draws 0, 0, 2, 1, 1, 1, 2, 0, 0, 2 from below(3).
        let mut r = Pcg32::seed(42, DEFAULT_SEQ);
        let draws: Vec<u32> = (0..10).map(|_| r.below(3)).collect();
        assert_eq!(draws, [0, 0, 2, 1, 1, 1, 2, 0, 0, 2]);

        // The worked example needs phase draws 1 then 0.
        let seed = seed_drawing(1, 0);
        let mut s = TokenStream::new(
            open_all(std::slice::from_ref(&path)),
            3,
            2,
            Pcg32::seed(seed, DEFAULT_SEQ),
            Some(256),
        )
        .unwrap();
        assert_eq!(s.cursor().offset, 1, "pass 1 starts at phase 1");
        let b1 = s.next_batch();
        assert_eq!(b1.inputs, [11, 12, 13, 14, 15, 16]);
        assert_eq!(b1.targets, [12, 13, 14, 15, 16, 17]);
        assert_eq!((b1.batch, b1.seq_len), (2, 3));
        assert_eq!(b1.input_row(1).unwrap(), [14, 15, 16]);
        // The cursor names the NEXT window (offset 7), not the one just read (4).
        assert_eq!((s.cursor().shard, s.cursor().offset), (0, 7));
        let b2 = s.next_batch();
        assert_eq!(b2.inputs, [10, 11, 12, 13, 14, 15]);
        assert_eq!(b2.targets, [11, 12, 13, 14, 15, 16]);
        let c = s.cursor();
        assert_eq!((c.shard, c.offset), (0, 6));
        // The generator has drawn exactly two phases.
        let mut g = Pcg32::seed(seed, DEFAULT_SEQ);
        g.below(3);
        g.below(3);
        assert_eq!(c.rng, RngState::of(&g));

        // With seed 42 both phases are 0.
        let mut s =
            TokenStream::new(open_all(&[path]), 3, 2, Pcg32::seed(42, DEFAULT_SEQ), None).unwrap();
        assert_eq!(s.next_batch().inputs, [10, 11, 12, 13, 14, 15]);
        assert_eq!(s.next_batch().inputs, [16, 17, 18, 10, 11, 12]);
    }

    /// A few shards of distinct ids: shard k holds k * 1000 + i at position i, so an id
    /// names its shard and position.
    fn tagged_shards(dir: &Path, lens: &[usize]) -> Vec<PathBuf> {
        lens.iter()
            .enumerate()
            .map(|(k, &n)| {
                let ids: Vec<u32> = (0..n).map(|i| (k * 1000 + i) as u32).collect();
                write(dir, &format!("s{k}.bin"), &ids, 100_000)
            })
            .collect()
    }

    #[test]
    fn test_cursor_restore_is_bitwise() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[23, 9, 40]);
        let (t, b) = (4, 3);
        let mut one =
            TokenStream::new(open_all(&paths), t, b, Pcg32::seed(7, DEFAULT_SEQ), None).unwrap();
        let all: Vec<Batch> = (0..16).map(|_| one.next_batch()).collect();

        let mut first =
            TokenStream::new(open_all(&paths), t, b, Pcg32::seed(7, DEFAULT_SEQ), None).unwrap();
        for _ in 0..7 {
            first.next_batch();
        }
        // Through JSON, as a checkpoint or `--save-cursor` carries it.
        let text = first.cursor().to_json();
        let cursor = Cursor::from_json(&text).unwrap();
        assert_eq!(cursor, first.cursor());
        assert_eq!(serde_json::to_string(&cursor).unwrap(), text);
        // A fresh stream with a different seed: the cursor replaces its whole position.
        let mut resumed =
            TokenStream::new(open_all(&paths), t, b, Pcg32::seed(999, 1), None).unwrap();
        resumed.restore(&cursor).unwrap();
        let rest: Vec<Batch> = (0..9).map(|_| resumed.next_batch()).collect();
        assert_eq!(rest, all[7..]);
        assert_eq!(resumed.cursor(), one.cursor());

        // Without the generator state the resumed run diverges at its next pass.
        let mut wrong =
            TokenStream::new(open_all(&paths), t, b, Pcg32::seed(999, 1), None).unwrap();
        wrong
            .restore(&Cursor {
                rng: RngState::of(&Pcg32::seed(999, 1)),
                ..cursor
            })
            .unwrap();
        let diverged: Vec<Batch> = (0..9).map(|_| wrong.next_batch()).collect();
        assert_ne!(diverged, all[7..]);
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "a table of bad arguments, one row per rule (a seed test name)"
    )]
    fn test_stream_rejects_bad_args() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ten = write(d, "ten.bin", &(0..10).collect::<Vec<_>>(), 256);
        let four = write(d, "four.bin", &[1, 2, 3, 4], 256);
        let big = write(d, "big.bin", &(0..10).collect::<Vec<_>>(), 512);
        let rng = Pcg32::seed(1, DEFAULT_SEQ);
        let err = |shards: Vec<PathBuf>, t, b, v| {
            TokenStream::new(open_all(&shards), t, b, rng, v).unwrap_err()
        };
        assert!(matches!(err(vec![], 3, 1, None), TokensError::NoShards));
        assert!(matches!(
            err(vec![ten.clone()], 0, 1, None),
            TokensError::BadArg {
                name: "seq_len",
                ..
            }
        ));
        assert!(matches!(
            err(vec![ten.clone()], 3, 0, None),
            TokensError::BadArg { name: "batch", .. }
        ));
        // Too short: T + 1 = 5 ids needed, the second shard holds 4; the error names it.
        let e = err(vec![ten.clone(), four.clone()], 4, 1, None);
        assert!(
            matches!(
                e,
                TokensError::ShardTooShort {
                    shard: 1,
                    count: 4,
                    seq_len: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("four.bin"), "{e}");
        // Vocabulary mismatch names the shard.
        let e = err(vec![big.clone()], 3, 1, Some(256));
        assert!(
            matches!(
                e,
                TokensError::VocabMismatch {
                    recorded: 512,
                    expected: 256,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("big.bin"), "{e}");
        // Shards recording different vocabularies never form one stream, with or
        // without a given one.
        for given in [None, Some(256)] {
            let e = err(vec![ten.clone(), big.clone()], 3, 1, given);
            assert!(
                matches!(
                    e,
                    TokensError::MixedVocab {
                        recorded: 512,
                        first_recorded: 256,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("big.bin"), "{e}");
        }
        assert!(matches!(
            err(vec![ten.clone()], 3, 1, Some(0)),
            TokensError::BadVocab { .. }
        ));
        // A shard that records no vocabulary has its ids checked against the given one.
        let mut unrecorded = vec![0u8; 1024];
        unrecorded[..12].copy_from_slice(&[0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 5, 0, 0, 0]);
        unrecorded.extend([0u8, 0, 1, 0, 2, 0, 3, 0, 9, 0]);
        let gpt2 = d.join("gpt2.bin");
        std::fs::write(&gpt2, unrecorded).unwrap();
        let e = err(vec![gpt2.clone()], 2, 1, Some(9));
        assert!(
            matches!(
                e,
                TokensError::IdOutOfVocab {
                    index: 4,
                    id: 9,
                    ..
                }
            ),
            "{e}"
        );
        assert!(TokenStream::new(open_all(&[gpt2]), 2, 1, rng, Some(10)).is_ok());
        // A shard with exactly one window is fine: phase below(min(T, 1)) = 0, and
        // every pass reads the same window.
        let mut s = TokenStream::new(open_all(&[four]), 3, 3, rng, None).unwrap();
        let b = s.next_batch();
        assert_eq!(b.inputs, [1, 2, 3, 1, 2, 3, 1, 2, 3]);
        assert_eq!(b.targets, [2, 3, 4, 2, 3, 4, 2, 3, 4]);
    }

    #[test]
    fn ranks_and_buffers_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[20]);
        let rng = Pcg32::seed(3, DEFAULT_SEQ);
        let open = |rank, world_size| {
            TokenStream::open(&paths, 3, 2, rng, None, Ranks { rank, world_size })
        };
        assert!(matches!(
            open(0, 0),
            Err(TokensError::BadArg {
                name: "world_size",
                ..
            })
        ));
        assert!(matches!(
            open(2, 2),
            Err(TokensError::BadRank {
                rank: 2,
                world_size: 2
            })
        ));
        let mut s = open(1, 2).unwrap();
        let mut reference = open(1, 2).unwrap();
        let (mut x, mut y) = (vec![0i64; 6], vec![0i64; 5]);
        assert!(matches!(
            s.next_batch_into(&mut x, &mut y),
            Err(TokensError::BatchBuffer {
                name: "targets",
                ..
            })
        ));
        let mut y = vec![0i64; 6];
        s.next_batch_into(&mut x, &mut y).unwrap();
        let want = reference.next_batch();
        assert_eq!((x, y), (want.inputs, want.targets));
        assert_eq!(s.cursor(), reference.cursor());
    }

    #[test]
    fn test_restore_rejects_bad_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[10, 12]);
        let mut s =
            TokenStream::new(open_all(&paths), 3, 1, Pcg32::seed(5, DEFAULT_SEQ), None).unwrap();
        s.next_batch();
        let before = s.cursor();
        let good = Cursor {
            shard: 1,
            offset: 4,
            rng: RngState::of(&Pcg32::seed(8, 9)),
            global_batch: None,
        };
        for (bad, field) in [
            (Cursor { shard: 2, ..good }, "shard"),
            (
                Cursor {
                    shard: u64::MAX,
                    ..good
                },
                "shard",
            ),
            (Cursor { offset: 13, ..good }, "offset"),
            (
                Cursor {
                    offset: u64::MAX,
                    ..good
                },
                "offset",
            ),
            (
                Cursor {
                    rng: RngState { state: 1, inc: 6 },
                    ..good
                },
                "rng.inc",
            ),
        ] {
            let e = s.restore(&bad).unwrap_err();
            assert!(
                matches!(&e, TokensError::BadCursor { field: f, .. } if f == field),
                "{e}"
            );
            assert_eq!(
                s.cursor(),
                before,
                "a rejected cursor leaves the stream unchanged"
            );
        }
        // The offset at the end of the shard is valid: the next read starts a new pass
        // on the next shard (wrapping), with a phase from the restored generator.
        let rng = Pcg32::seed(8, 9);
        s.restore(&Cursor {
            shard: 1,
            offset: 12,
            rng: RngState::of(&rng),
            global_batch: None,
        })
        .unwrap();
        let mut g = rng;
        let phase = g.below(3) as i64;
        assert_eq!(s.next_batch().inputs, [phase, phase + 1, phase + 2]);
        assert_eq!(s.cursor().shard, 0);
        // The last offset where a window fits (6 + T + 1 = 10 ids), then the next pass.
        s.restore(&Cursor {
            shard: 0,
            offset: 6,
            rng: RngState::of(&rng),
            global_batch: None,
        })
        .unwrap();
        assert_eq!(s.next_batch().inputs, [6, 7, 8]);
        assert_eq!(s.next_batch().inputs[0] / 1000, 1, "then shard 1");
        // Offset 7 on the 10-id shard: no window fits, so the next read starts a pass.
        s.restore(&Cursor {
            shard: 0,
            offset: 7,
            rng: RngState::of(&rng),
            global_batch: None,
        })
        .unwrap();
        assert_eq!(s.next_batch().inputs[0], 1000 + phase);
    }

    /// A random stream configuration: shard lengths (each at least T + 1), T, B, seed.
    fn config() -> impl Strategy<Value = (Vec<usize>, usize, usize, u64)> {
        (1usize..7, 1usize..5).prop_flat_map(|(t, b)| {
            (
                proptest::collection::vec(t + 1..t + 40, 1..5),
                Just(t),
                Just(b),
                any::<u64>(),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        #[test]
        fn restore_continue_equals_one_stream(
            (lens, t, b, seed) in config(),
            n in 0usize..12,
            m in 1usize..12,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let mut one = TokenStream::new(open_all(&paths), t, b, rng, None).unwrap();
            let all: Vec<Batch> = (0..n + m).map(|_| one.next_batch()).collect();
            let mut first = TokenStream::new(open_all(&paths), t, b, rng, None).unwrap();
            for _ in 0..n {
                first.next_batch();
            }
            let cursor = Cursor::from_json(&first.cursor().to_json()).unwrap();
            drop(first);
            let mut resumed = TokenStream::new(open_all(&paths), t, b, Pcg32::seed(0, 0), None).unwrap();
            resumed.restore(&cursor).unwrap();
            let rest: Vec<Batch> = (0..m).map(|_| resumed.next_batch()).collect();
            prop_assert_eq!(&rest[..], &all[n..]);
            prop_assert_eq!(resumed.cursor(), one.cursor());
        }

        #[test]
        fn test_windows_tile_each_pass((lens, t, b, seed) in config(), batches in 1usize..30) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let mut s = TokenStream::new(open_all(&paths), t, b, Pcg32::seed(seed, DEFAULT_SEQ), None).unwrap();
            // Every window as (shard, start, targets), in stream order.
            let mut windows = Vec::new();
            for _ in 0..batches {
                let batch = s.next_batch();
                for row in 0..b {
                    let inputs = batch.input_row(row).unwrap();
                    let targets = batch.target_row(row).unwrap();
                    let first = inputs[0] as usize;
                    windows.push((first / 1000, first % 1000, targets.to_vec()));
                }
            }
            // Split into passes: a pass continues while the shard stays and the start
            // moves by exactly T.
            let mut passes: Vec<Vec<(usize, usize, Vec<i64>)>> = Vec::new();
            for w in windows {
                match passes.last_mut() {
                    Some(p) if p.last().is_some_and(|l| l.0 == w.0 && l.1 + t == w.1) => p.push(w),
                    _ => passes.push(vec![w]),
                }
            }
            let last = passes.len() - 1;
            for (i, pass) in passes.iter().enumerate() {
                let shard = pass[0].0;
                prop_assert_eq!(shard, i % lens.len(), "shards in order, wrapping");
                let n = lens[shard];
                let phase = pass[0].1;
                prop_assert!(phase < t.min(n - t), "phase {} on n {} T {}", phase, n, t);
                // Every token after the phase is a target exactly once, in order.
                let targets: Vec<i64> = pass.iter().flat_map(|w| w.2.iter().copied()).collect();
                let expect: Vec<i64> = (phase + 1..phase + 1 + pass.len() * t)
                    .map(|p| (shard * 1000 + p) as i64)
                    .collect();
                prop_assert_eq!(targets, expect);
                let next = pass.last().unwrap().1 + t;
                if i < last {
                    // The pass ends exactly where the next window would not fit.
                    prop_assert!(next + t + 1 > n);
                } else {
                    prop_assert!(next <= n);
                }
            }
        }

        /// For world sizes 1 to 4 the ranks' batches, side by side, are the
        /// single-process stream of the global batch, bit for bit, and every rank's
        /// cursor is that stream's cursor.
        #[test]
        fn ranks_tile_the_global_stream((lens, t, b, seed) in config(), world in 1usize..5, batches in 1usize..8) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let mut global = TokenStream::open(&paths, t, b * world, rng, None, Ranks::SINGLE).unwrap();
            let mut ranks: Vec<TokenStream> = (0..world)
                .map(|rank| TokenStream::open(&paths, t, b, rng, None, Ranks { rank, world_size: world }).unwrap())
                .collect();
            for _ in 0..batches {
                let want = global.next_batch();
                let mut inputs = Vec::new();
                let mut targets = Vec::new();
                for r in &mut ranks {
                    let got = r.next_batch();
                    inputs.extend(got.inputs);
                    targets.extend(got.targets);
                }
                prop_assert_eq!(&inputs, &want.inputs);
                prop_assert_eq!(&targets, &want.targets);
                let expect = Cursor {
                    global_batch: (world > 1).then(|| NonZeroU64::new((b * world) as u64).unwrap()),
                    ..global.cursor()
                };
                for r in &ranks {
                    prop_assert_eq!(r.cursor(), expect);
                }
            }
        }

        /// Elastic resumption: a cursor of 2 ranks of 8 continues in 1 rank of 16 and
        /// in 4 ranks of 4 exactly as the run would have; another global batch is
        /// refused with both numbers.
        #[test]
        fn elastic_restore_keeps_the_global_stream((lens, t, _b, seed) in config(), n in 0usize..6, m in 1usize..6) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let ranked = |rank, world_size, b| {
                TokenStream::open(&paths, t, b, rng, None, Ranks { rank, world_size }).unwrap()
            };
            let mut one = ranked(0, 1, 16);
            let all: Vec<Batch> = (0..n + m).map(|_| one.next_batch()).collect();
            let mut r0 = ranked(0, 2, 8);
            for _ in 0..n {
                r0.next_batch();
            }
            let cursor = Cursor::from_json(&r0.cursor().to_json()).unwrap();
            prop_assert_eq!(cursor.global_batch, NonZeroU64::new(16));
            for (world, b) in [(1usize, 16usize), (4, 4)] {
                let mut streams: Vec<TokenStream> = (0..world).map(|r| ranked(r, world, b)).collect();
                for s in &mut streams {
                    s.restore(&cursor).unwrap();
                }
                for want in &all[n..] {
                    let mut inputs = Vec::new();
                    for s in &mut streams {
                        inputs.extend(s.next_batch().inputs);
                    }
                    prop_assert_eq!(&inputs, &want.inputs);
                }
            }
            let mut other = ranked(1, 3, 8);
            let e = other.restore(&cursor).unwrap_err();
            prop_assert!(matches!(e, TokensError::GlobalBatchMismatch { cursor: 16, stream: 24, .. }), "{}", e);
            let text = e.to_string();
            prop_assert!(text.contains("16") && text.contains("24"), "{}", text);
            // A cursor without the key restores into any stream.
            other.restore(&Cursor { global_batch: None, ..cursor }).unwrap();
        }

        #[test]
        fn test_targets_are_inputs_shifted((lens, t, b, seed) in config(), batches in 1usize..10) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let shards = open_all(&paths);
            let mut s = TokenStream::new(shards, t, b, Pcg32::seed(seed, DEFAULT_SEQ), None).unwrap();
            let mut previous: Option<Batch> = None;
            for _ in 0..batches {
                let batch = s.next_batch();
                prop_assert_eq!(batch.inputs.len(), b * t);
                prop_assert_eq!(batch.targets.len(), b * t);
                for row in 0..b {
                    let x = batch.input_row(row).unwrap();
                    let y = batch.target_row(row).unwrap();
                    prop_assert_eq!(&y[..t - 1], &x[1..]);
                    // The last target is the id after the last input in the shard.
                    let last = x[t - 1] as usize;
                    let shard = &s.shards()[last / 1000];
                    prop_assert_eq!(y[t - 1], i64::from(shard.get(last % 1000 + 1).unwrap()));
                }
                // Fresh arrays: a new allocation each batch, never a view of the last.
                if let Some(p) = &previous {
                    prop_assert_ne!(p.inputs.as_ptr(), batch.inputs.as_ptr());
                }
                previous = Some(batch);
            }
        }
    }
}
