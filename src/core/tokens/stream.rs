//! The token stream of tokens.md: windows of T + 1 ids, T apart within a pass, each pass
//! starting at a random phase drawn from PCG32, shards in order (or, shuffled, in a
//! permutation per epoch drawn from the same generator, scale.md), wrapping; and its
//! ranks (python.md): rank r of W reads windows r*B .. (r+1)*B of each global batch of
//! B*W.
//!
//! Invariants: the current shard index is always valid and the offset never exceeds
//! the shard's length, so every window read is in range; the generator is used only
//! when a pass starts (and, shuffled, when an epoch starts, for its order first);
//! every rank walks the whole global batch (skipping the other ranks' windows without
//! reading them, a pass at a time), so the cursor is the same on every rank;
//! `cursor()` (shard, offset of the NEXT window, generator state, the global batch when
//! there are ranks, the epoch's starting generator when shuffled) is the whole
//! position, so `restore(cursor())` on a fresh stream over the same shards continues
//! bit for bit; a batch that fails (a shard changed underneath, an interruption)
//! leaves the position where it was.

use std::num::NonZeroU64;
use std::path::Path;

pub use super::batch::Batch;
use super::checks::Ticker;
pub use super::checks::{
    check_batch_shape, check_ranks, MAX_BATCH_TOKENS, MAX_CURSOR_BYTES, MAX_GLOBAL_BATCH,
    MAX_SHARDS, MAX_WORLD_SIZE,
};
use super::checks::{check_each_shard, check_one_vocab};
use super::order::{draw_phase, Epoch};
pub use super::order::{shuffle_order, ShardOrder};
use super::shard::{check_shard_vocab, Shard};
use super::TokensError;
use crate::cursor::Cursor;
use crate::pcg::{Pcg32, RngState};

fn bad(field: &str, reason: impl Into<String>) -> TokensError {
    TokensError::BadCursor {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// A stream's walk position: shard, offset, generator, epoch.
pub(super) type Mark = (usize, usize, Pcg32, Epoch);

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

impl Default for Ranks {
    fn default() -> Ranks {
        Ranks::SINGLE
    }
}

/// How a stream reads beyond its shape: which ranks, in which shard order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// This stream's rank and the world size.
    pub ranks: Ranks,
    /// In order or shuffled per epoch.
    pub order: ShardOrder,
}

/// Windows over a list of shards, resumable from a `Cursor`.
#[derive(Debug)]
pub struct TokenStream {
    shards: Vec<Shard>,
    seq_len: usize,
    batch: usize,
    ranks: Ranks,
    order: ShardOrder,
    rng: Pcg32,
    shard: usize,
    offset: usize,
    epoch: Epoch,
    /// The shard whose descriptor is held (the one read last); the others are closed,
    /// so a stream over thousands of shards holds one descriptor.
    held: Option<usize>,
    /// Reused bytes of one window's read.
    scratch: Vec<u8>,
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
        TokenStream::with_options(
            shards,
            seq_len,
            batch,
            rng,
            vocab_size,
            StreamOptions::default(),
        )
    }

    /// [`TokenStream::new`] for rank `ranks.rank` of `ranks.world_size`: the global
    /// stream is the single-process stream of batch B × world_size, and this stream
    /// yields windows rank*B .. (rank+1)*B of each global batch.
    pub fn with_ranks(
        shards: Vec<Shard>,
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab_size: Option<u32>,
        ranks: Ranks,
    ) -> Result<TokenStream, TokensError> {
        let options = StreamOptions {
            ranks,
            ..StreamOptions::default()
        };
        TokenStream::with_options(shards, seq_len, batch, rng, vocab_size, options)
    }

    /// [`TokenStream::with_ranks`] in the shard order `options.order`: shuffled, the
    /// first epoch's order is drawn from `rng` before the first pass's phase.
    pub fn with_options(
        mut shards: Vec<Shard>,
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab_size: Option<u32>,
        options: StreamOptions,
    ) -> Result<TokenStream, TokensError> {
        if shards.is_empty() {
            return Err(TokensError::NoShards);
        }
        if shards.len() > MAX_SHARDS {
            return Err(TokensError::TooLarge {
                name: "the number of shards",
                value: shards.len() as u64,
                limit: MAX_SHARDS as u64,
            });
        }
        check_batch_shape(seq_len, batch)?;
        check_ranks(batch, options.ranks)?;
        let vocab = vocab_size
            .map(|v| check_shard_vocab(u64::from(v)))
            .transpose()?;
        check_one_vocab(&shards)?;
        check_each_shard(&shards, seq_len, vocab)?;
        shards.iter_mut().for_each(Shard::release);
        let mut stream = TokenStream {
            shards,
            seq_len,
            batch,
            ranks: options.ranks,
            order: options.order,
            rng,
            shard: 0,
            offset: 0,
            epoch: Epoch::in_order(0),
            held: None,
            scratch: Vec::new(),
        };
        stream.start_epoch();
        let first_len = stream.shard_len(stream.shard);
        stream.offset = draw_phase(&mut stream.rng, first_len, seq_len);
        Ok(stream)
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
        let options = StreamOptions {
            ranks,
            ..StreamOptions::default()
        };
        TokenStream::open_with(paths, seq_len, batch, rng, vocab_size, options)
    }

    /// [`TokenStream::open`] with the shard order of `options` too. Each shard's
    /// descriptor is closed once it validates, so opening thousands of shards holds one
    /// at a time.
    pub fn open_with<P: AsRef<Path>>(
        paths: &[P],
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab_size: Option<u32>,
        options: StreamOptions,
    ) -> Result<TokenStream, TokensError> {
        check_batch_shape(seq_len, batch)?;
        check_ranks(batch, options.ranks)?;
        let shards = paths
            .iter()
            .map(|p| {
                let mut shard = Shard::open(p.as_ref(), vocab_size)?;
                shard.release();
                Ok(shard)
            })
            .collect::<Result<Vec<_>, TokensError>>()?;
        TokenStream::with_options(shards, seq_len, batch, rng, vocab_size, options)
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

    /// In order or shuffled.
    pub fn order(&self) -> ShardOrder {
        self.order
    }

    /// B × world_size, the windows of one global batch (checked at construction).
    pub fn global_batch(&self) -> usize {
        self.batch.saturating_mul(self.ranks.world_size)
    }

    /// The shards, in file order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    fn shard_len(&self, index: usize) -> usize {
        self.shards.get(index).map_or(0, Shard::len)
    }

    /// Start an epoch: in order, shard 0; shuffled, an order drawn from the generator
    /// (remembering the generator before the draw, which the cursor carries).
    fn start_epoch(&mut self) {
        self.epoch = match self.order {
            ShardOrder::InOrder => Epoch::in_order(0),
            ShardOrder::Shuffled => {
                let start = RngState::of(&self.rng);
                let order = shuffle_order(&mut self.rng, self.shards.len());
                Epoch {
                    start: Some(start),
                    order,
                    pos: 0,
                }
            }
        };
        self.shard = self.epoch.shard_at(0);
    }

    /// End the current pass: the next shard of the epoch (a new epoch after its last),
    /// at a phase drawn from the generator. Returns the work done, for the ticker.
    fn start_pass(&mut self) -> usize {
        let next = self.epoch.pos.saturating_add(1);
        let mut work: usize = 1;
        if next < self.shards.len() {
            self.epoch.pos = next;
            self.shard = self.epoch.shard_at(next);
        } else {
            self.start_epoch();
            work = work.saturating_add(self.epoch.order.len());
        }
        let n = self.shard_len(self.shard);
        self.offset = draw_phase(&mut self.rng, n, self.seq_len);
        work
    }

    /// The windows that still fit in the current pass from the offset.
    pub(super) fn windows_left(&self) -> usize {
        let n = self.shard_len(self.shard);
        let span = self.seq_len.saturating_add(1);
        match n.checked_sub(self.offset).and_then(|r| r.checked_sub(span)) {
            Some(rest) => rest / self.seq_len + 1,
            None => 0,
        }
    }

    /// Move past the next window, starting a new pass first when no window fits at the
    /// offset; returns the window's shard and offset.
    pub(super) fn advance(
        &mut self,
        ticks: &mut Ticker<'_>,
    ) -> Result<(usize, usize), TokensError> {
        if self.windows_left() == 0 {
            let work = self.start_pass();
            ticks.add(work)?;
        }
        let at = (self.shard, self.offset);
        self.offset = self.offset.saturating_add(self.seq_len);
        Ok(at)
    }

    /// Skip `n` windows without reading them (the other ranks' part of a batch), a
    /// pass at a time.
    pub(super) fn skip(&mut self, mut n: usize, ticks: &mut Ticker<'_>) -> Result<(), TokensError> {
        while n > 0 {
            let left = self.windows_left();
            if left == 0 {
                let work = self.start_pass();
                ticks.add(work)?;
                continue;
            }
            let k = left.min(n);
            self.offset = self.offset.saturating_add(k.saturating_mul(self.seq_len));
            n -= k;
        }
        Ok(())
    }

    /// Read the window at (`shard`, `offset`) into one row of inputs and one of
    /// targets, holding that shard's descriptor (and closing the last one's, after
    /// checking that it did not change while it was read).
    pub(super) fn read_window(
        &mut self,
        (shard, offset): (usize, usize),
        inputs: &mut [i64],
        targets: &mut [i64],
    ) -> Result<(), TokensError> {
        if self.held != Some(shard) {
            if let Some(old) = self.held.take().and_then(|i| self.shards.get_mut(i)) {
                old.check_unchanged()?;
                old.release();
            }
            if let Some(new) = self.shards.get_mut(shard) {
                new.hold()?;
                self.held = Some(shard);
            }
        }
        // The walk only ever names a valid shard (the struct invariant).
        #[allow(
            clippy::expect_used,
            reason = "a broken struct invariant must stop, never yield a stale window"
        )]
        let s = self
            .shards
            .get(shard)
            .expect("invariant: the walk names a shard of the stream");
        s.read_window(offset, inputs, targets, &mut self.scratch)
    }

    /// The next B windows as fresh [B, T] arrays. A batch may span passes and shards.
    /// An error (a shard changed underneath) leaves the stream where it was.
    pub fn next_batch(&mut self) -> Result<Batch, TokensError> {
        let (b, t) = (self.batch, self.seq_len);
        let mut inputs = vec![0i64; b.saturating_mul(t)];
        let mut targets = vec![0i64; b.saturating_mul(t)];
        self.fill_batch(&mut inputs, &mut targets, &mut || false)?;
        Ok(Batch {
            inputs,
            targets,
            batch: b,
            seq_len: t,
        })
    }

    /// The next B windows into caller-provided row-major [B, T] arrays (for a binding
    /// that owns the memory). Both must hold exactly B × T values; on an error the
    /// stream is unchanged.
    pub fn next_batch_into(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
    ) -> Result<(), TokensError> {
        self.next_batch_into_cancellable(inputs, targets, &mut || false)
    }

    /// [`TokenStream::next_batch_into`], asking `cancel` every million or so ids read
    /// or passes walked: when it returns true the batch stops with
    /// [`TokensError::Interrupted`] and the stream is unchanged (how a binding keeps a
    /// long batch interruptible while it runs without its interpreter's lock).
    pub fn next_batch_into_cancellable(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
        cancel: &mut dyn FnMut() -> bool,
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
        self.fill_batch(inputs, targets, cancel)
    }

    /// Walk one global batch, reading this rank's B windows into `inputs` and
    /// `targets` (each of B × T values, checked by the callers); on an error the
    /// position is put back.
    fn fill_batch(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
        cancel: &mut dyn FnMut() -> bool,
    ) -> Result<(), TokensError> {
        let before = self.mark();
        let mut ticks = Ticker::new(cancel);
        let result = self.walk_batch(inputs, targets, &mut ticks);
        if result.is_err() {
            self.reset(before);
        }
        result
    }

    /// The walk's position, for a caller that walks several streams (a mixture) and
    /// puts them all back when one fails.
    pub(super) fn mark(&self) -> Mark {
        (self.shard, self.offset, self.rng, self.epoch.clone())
    }

    /// Back to a [`TokenStream::mark`] of this stream.
    pub(super) fn reset(&mut self, mark: Mark) {
        (self.shard, self.offset, self.rng, self.epoch) = mark;
    }

    /// Check that the shard read last did not change since it was opened (a shard
    /// rewritten in place with the same size is caught before a batch is handed out).
    pub(super) fn check_held(&self) -> Result<(), TokensError> {
        match self.held.and_then(|i| self.shards.get(i)) {
            Some(held) => held.check_unchanged(),
            None => Ok(()),
        }
    }

    fn walk_batch(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
        ticks: &mut Ticker<'_>,
    ) -> Result<(), TokensError> {
        let t = self.seq_len;
        self.skip(self.ranks.rank.saturating_mul(self.batch), ticks)?;
        for (x, y) in inputs.chunks_exact_mut(t).zip(targets.chunks_exact_mut(t)) {
            let at = self.advance(ticks)?;
            self.read_window(at, x, y)?;
            ticks.add(t)?;
        }
        let after = self
            .ranks
            .world_size
            .saturating_sub(self.ranks.rank)
            .saturating_sub(1);
        self.skip(after.saturating_mul(self.batch), ticks)?;
        self.check_held()
    }

    /// The whole position: shard, offset of the next window, generator state, the
    /// global batch when the stream has ranks (identical on every rank), and the
    /// epoch's starting generator when the shard order is shuffled.
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
            epoch_rng: self.epoch.start,
        }
    }

    /// Move to `cursor`. Checks shard < S, offset <= the shard's length (an offset where
    /// no window fits starts a new pass at the next read), an odd increment, a
    /// `global_batch`, when the cursor carries one, equal to B × world_size, and an
    /// `epoch_rng` only in a shuffled stream; on error the stream is unchanged.
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
        let epoch = self.epoch_of(cursor.epoch_rng, shard)?;
        self.shard = shard;
        self.offset = offset;
        self.rng = rng;
        self.epoch = epoch;
        Ok(())
    }

    /// The epoch a cursor's `epoch_rng` names: its order drawn again from that
    /// generator (a shuffled stream), or file order when the cursor has none (an
    /// in-order cursor continues its epoch in file order, and the next epoch of a
    /// shuffled stream is drawn as usual). An in-order stream refuses a shuffled cursor.
    fn epoch_of(&self, start: Option<RngState>, shard: usize) -> Result<Epoch, TokensError> {
        let Some(start) = start else {
            return Ok(Epoch::in_order(shard));
        };
        if self.order == ShardOrder::InOrder {
            return Err(bad(
                "epoch_rng",
                "the cursor is of a stream with shuffled shard order, and this stream reads \
                 its shards in order: open it with shuffle to resume",
            ));
        }
        let mut rng = start.to_rng().ok_or_else(|| {
            bad(
                "epoch_rng.inc",
                format!(
                    "{:016x} is even; a PCG32 increment is always odd",
                    start.inc
                ),
            )
        })?;
        let order = shuffle_order(&mut rng, self.shards.len());
        // The order is a permutation of every shard index, so the shard is in it.
        let pos = order.iter().position(|&s| s == shard).unwrap_or(0);
        Ok(Epoch {
            start: Some(start),
            order,
            pos,
        })
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
        let b1 = s.next_batch().unwrap();
        assert_eq!(b1.inputs, [11, 12, 13, 14, 15, 16]);
        assert_eq!(b1.targets, [12, 13, 14, 15, 16, 17]);
        assert_eq!((b1.batch, b1.seq_len), (2, 3));
        assert_eq!(b1.input_row(1).unwrap(), [14, 15, 16]);
        // The cursor names the NEXT window (offset 7), not the one just read (4).
        assert_eq!((s.cursor().shard, s.cursor().offset), (0, 7));
        let b2 = s.next_batch().unwrap();
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
        assert_eq!(s.next_batch().unwrap().inputs, [10, 11, 12, 13, 14, 15]);
        assert_eq!(s.next_batch().unwrap().inputs, [16, 17, 18, 10, 11, 12]);
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
        let all: Vec<Batch> = (0..16).map(|_| one.next_batch().unwrap()).collect();

        let mut first =
            TokenStream::new(open_all(&paths), t, b, Pcg32::seed(7, DEFAULT_SEQ), None).unwrap();
        for _ in 0..7 {
            first.next_batch().unwrap();
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
        let rest: Vec<Batch> = (0..9).map(|_| resumed.next_batch().unwrap()).collect();
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
        let diverged: Vec<Batch> = (0..9).map(|_| wrong.next_batch().unwrap()).collect();
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
        let b = s.next_batch().unwrap();
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
        let want = reference.next_batch().unwrap();
        assert_eq!((x, y), (want.inputs, want.targets));
        assert_eq!(s.cursor(), reference.cursor());
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "a table of bad cursors, one row per rule (a seed test name)"
    )]
    fn test_restore_rejects_bad_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[10, 12]);
        let mut s =
            TokenStream::new(open_all(&paths), 3, 1, Pcg32::seed(5, DEFAULT_SEQ), None).unwrap();
        s.next_batch().unwrap();
        let before = s.cursor();
        let good = Cursor {
            shard: 1,
            offset: 4,
            rng: RngState::of(&Pcg32::seed(8, 9)),
            global_batch: None,
            epoch_rng: None,
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
            epoch_rng: None,
        })
        .unwrap();
        let mut g = rng;
        let phase = g.below(3) as i64;
        assert_eq!(
            s.next_batch().unwrap().inputs,
            [phase, phase + 1, phase + 2]
        );
        assert_eq!(s.cursor().shard, 0);
        // The last offset where a window fits (6 + T + 1 = 10 ids), then the next pass.
        s.restore(&Cursor {
            shard: 0,
            offset: 6,
            rng: RngState::of(&rng),
            global_batch: None,
            epoch_rng: None,
        })
        .unwrap();
        assert_eq!(s.next_batch().unwrap().inputs, [6, 7, 8]);
        assert_eq!(s.next_batch().unwrap().inputs[0] / 1000, 1, "then shard 1");
        // Offset 7 on the 10-id shard: no window fits, so the next read starts a pass.
        s.restore(&Cursor {
            shard: 0,
            offset: 7,
            rng: RngState::of(&rng),
            global_batch: None,
            epoch_rng: None,
        })
        .unwrap();
        assert_eq!(s.next_batch().unwrap().inputs[0], 1000 + phase);
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
            let all: Vec<Batch> = (0..n + m).map(|_| one.next_batch().unwrap()).collect();
            let mut first = TokenStream::new(open_all(&paths), t, b, rng, None).unwrap();
            for _ in 0..n {
                first.next_batch().unwrap();
            }
            let cursor = Cursor::from_json(&first.cursor().to_json()).unwrap();
            drop(first);
            let mut resumed = TokenStream::new(open_all(&paths), t, b, Pcg32::seed(0, 0), None).unwrap();
            resumed.restore(&cursor).unwrap();
            let rest: Vec<Batch> = (0..m).map(|_| resumed.next_batch().unwrap()).collect();
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
                let batch = s.next_batch().unwrap();
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
                let want = global.next_batch().unwrap();
                let mut inputs = Vec::new();
                let mut targets = Vec::new();
                for r in &mut ranks {
                    let got = r.next_batch().unwrap();
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
            let all: Vec<Batch> = (0..n + m).map(|_| one.next_batch().unwrap()).collect();
            let mut r0 = ranked(0, 2, 8);
            for _ in 0..n {
                r0.next_batch().unwrap();
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
                        inputs.extend(s.next_batch().unwrap().inputs);
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
                let batch = s.next_batch().unwrap();
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

    fn shuffled(rank: usize, world_size: usize) -> StreamOptions {
        StreamOptions {
            ranks: Ranks { rank, world_size },
            order: ShardOrder::Shuffled,
        }
    }

    /// Every window of `batches` batches as (shard, start offset).
    fn windows_of(s: &mut TokenStream, batches: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for _ in 0..batches {
            let batch = s.next_batch().unwrap();
            for row in 0..batch.batch {
                let first = batch.input_row(row).unwrap()[0] as usize;
                out.push((first / 1000, first % 1000));
            }
        }
        out
    }

    #[test]
    fn shuffle_order_is_fisher_yates_from_the_generator() {
        let mut rng = Pcg32::seed(42, DEFAULT_SEQ);
        let mut reference = rng;
        let order = shuffle_order(&mut rng, 5);
        let mut want = vec![0usize, 1, 2, 3, 4];
        for i in (1..5).rev() {
            let j = reference.below(i as u32 + 1) as usize;
            want.swap(i, j);
        }
        assert_eq!(order, want);
        assert_eq!(rng, reference, "exactly S - 1 draws");
        let mut one = Pcg32::seed(7, DEFAULT_SEQ);
        let before = one;
        assert_eq!(shuffle_order(&mut one, 1), [0]);
        assert_eq!(one, before, "one shard draws nothing");
    }

    /// With one shard a shuffled stream is the in-order stream, cursor bytes aside.
    #[test]
    fn a_single_shard_shuffles_to_the_same_batches() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[37]);
        let rng = Pcg32::seed(9, DEFAULT_SEQ);
        let mut plain = TokenStream::open(&paths, 4, 3, rng, None, Ranks::SINGLE).unwrap();
        let mut mixed = TokenStream::open_with(&paths, 4, 3, rng, None, shuffled(0, 1)).unwrap();
        for _ in 0..9 {
            assert_eq!(plain.next_batch().unwrap(), mixed.next_batch().unwrap());
            let (a, b) = (plain.cursor(), mixed.cursor());
            assert_eq!(
                Cursor {
                    epoch_rng: None,
                    ..b
                },
                a
            );
            assert!(b.epoch_rng.is_some());
        }
    }

    #[test]
    fn cursors_move_between_in_order_and_shuffled_streams_as_documented() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[12, 14, 16, 18]);
        let rng = Pcg32::seed(5, DEFAULT_SEQ);
        let mut plain = TokenStream::open(&paths, 3, 1, rng, None, Ranks::SINGLE).unwrap();
        plain.next_batch().unwrap();
        let old = plain.cursor();
        // An in-order cursor loads into a shuffled stream: the epoch it is in finishes
        // in file order, then the next epoch's order is drawn.
        let mut mixed = TokenStream::open_with(&paths, 3, 1, rng, None, shuffled(0, 1)).unwrap();
        mixed.restore(&old).unwrap();
        let mut reference = TokenStream::open(&paths, 3, 1, rng, None, Ranks::SINGLE).unwrap();
        reference.restore(&old).unwrap();
        let mut seen = Vec::new();
        loop {
            let got = mixed.next_batch().unwrap();
            if mixed.cursor().epoch_rng.is_some() {
                break;
            }
            assert_eq!(got, reference.next_batch().unwrap());
            seen.push(mixed.cursor().shard);
        }
        assert_eq!(
            seen.last(),
            Some(&3),
            "the in-order epoch ran to its last shard"
        );
        assert!(
            seen.windows(2).all(|w| w[0] <= w[1]),
            "file order first: {seen:?}"
        );
        // A shuffled cursor is refused by an in-order stream, naming the key.
        let e = plain.restore(&mixed.cursor()).unwrap_err();
        assert!(
            e.to_string().contains("epoch_rng") && e.to_string().contains("shuffle"),
            "{e}"
        );
    }

    #[test]
    fn argument_bounds_are_named_and_a_huge_world_walks_fast() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[10, 11]);
        let rng = Pcg32::seed(1, DEFAULT_SEQ);
        let open = |rank, world_size, b| {
            TokenStream::open(&paths, 3, b, rng, None, Ranks { rank, world_size })
        };
        let e = open(0, 1 << 40, 1).unwrap_err();
        assert!(
            matches!(
                e,
                TokensError::TooLarge {
                    name: "world_size",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains(&MAX_WORLD_SIZE.to_string()), "{e}");
        let e = open(0, MAX_WORLD_SIZE, 32).unwrap_err();
        assert!(matches!(e, TokensError::GlobalBatchOverflow { .. }), "{e}");
        // At the limits, every pass of a 10-id shard holds two or three windows, so the
        // last rank's batch walks millions of passes: a pass at a time, it returns.
        let mut last = open(MAX_WORLD_SIZE - 1, MAX_WORLD_SIZE, 16).unwrap();
        let got = last.next_batch().unwrap();
        let mut single = TokenStream::open(&paths, 3, 1, rng, None, Ranks::SINGLE).unwrap();
        let mut cancel_never = || false;
        // Walking the same global batch in one process ends at the same cursor.
        let mut x = vec![0i64; 3];
        let mut y = vec![0i64; 3];
        let mut ticks = Ticker::new(&mut cancel_never);
        single.skip(MAX_GLOBAL_BATCH - 1, &mut ticks).unwrap();
        single.next_batch_into(&mut x, &mut y).unwrap();
        assert_eq!(&got.inputs[got.inputs.len() - 3..], &x[..]);
        assert_eq!(
            Cursor {
                global_batch: None,
                ..last.cursor()
            },
            single.cursor()
        );
    }

    #[test]
    fn a_cancelled_batch_leaves_the_stream_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let paths = tagged_shards(dir.path(), &[5000, 7000]);
        let rng = Pcg32::seed(2, DEFAULT_SEQ);
        let mut s = TokenStream::open_with(&paths, 1000, 2000, rng, None, shuffled(0, 1)).unwrap();
        let before = s.cursor();
        let mut asked = 0;
        let mut cancel = || {
            asked += 1;
            true
        };
        let (mut x, mut y) = (vec![0i64; 2_000_000], vec![0i64; 2_000_000]);
        let e = s
            .next_batch_into_cancellable(&mut x, &mut y, &mut cancel)
            .unwrap_err();
        assert!(matches!(e, TokensError::Interrupted), "{e}");
        assert_eq!(asked, 1);
        assert_eq!(s.cursor(), before);
        let mut reference =
            TokenStream::open_with(&paths, 1000, 2000, rng, None, shuffled(0, 1)).unwrap();
        assert_eq!(s.next_batch().unwrap(), reference.next_batch().unwrap());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Shuffled: each epoch visits every shard once (the passes of an epoch are a
        /// permutation of the shards, the first epoch's the generator's first draw), and
        /// within a pass windows stay T apart from a phase below min(T, n - T).
        #[test]
        fn each_shuffled_epoch_is_a_permutation((lens, t, b, seed) in config(), batches in 1usize..40) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let mut s = TokenStream::open_with(&paths, t, b, rng, None, shuffled(0, 1)).unwrap();
            let windows = windows_of(&mut s, batches);
            let mut passes: Vec<Vec<(usize, usize)>> = Vec::new();
            for w in windows {
                match passes.last_mut() {
                    Some(p) if p.last().is_some_and(|l| l.0 == w.0 && l.1 + t == w.1) => p.push(w),
                    _ => passes.push(vec![w]),
                }
            }
            // Split passes into epochs of S; a one-shard stream may merge passes that
            // happen to continue T apart, so only S >= 2 is checked pass by pass.
            let s_count = lens.len();
            if s_count >= 2 {
                let order: Vec<usize> = passes.iter().map(|p| p[0].0).collect();
                for epoch in order.chunks(s_count) {
                    let mut sorted = epoch.to_vec();
                    sorted.sort_unstable();
                    sorted.dedup();
                    prop_assert_eq!(sorted.len(), epoch.len(), "a shard twice in one epoch: {:?}", order);
                }
                let mut g = rng;
                let first = shuffle_order(&mut g, s_count);
                let n = order.len().min(s_count);
                prop_assert_eq!(&order[..n], &first[..n]);
            }
            for pass in &passes {
                let n = lens[pass[0].0];
                prop_assert!(pass[0].1 < t.min(n - t).max(1) || s_count == 1);
            }
        }

        /// Shuffled: N batches, cursor (through its JSON), restore into a fresh stream,
        /// M batches == N + M batches of one stream.
        #[test]
        fn shuffled_restore_continues_bit_for_bit(
            (lens, t, b, seed) in config(),
            n in 0usize..16,
            m in 1usize..16,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let mut one = TokenStream::open_with(&paths, t, b, rng, None, shuffled(0, 1)).unwrap();
            let all: Vec<Batch> = (0..n + m).map(|_| one.next_batch().unwrap()).collect();
            let mut first = TokenStream::open_with(&paths, t, b, rng, None, shuffled(0, 1)).unwrap();
            for _ in 0..n {
                first.next_batch().unwrap();
            }
            let cursor = Cursor::from_json(&first.cursor().to_json()).unwrap();
            let mut resumed = TokenStream::open_with(&paths, t, b, Pcg32::seed(0, 0), None, shuffled(0, 1)).unwrap();
            resumed.restore(&cursor).unwrap();
            let rest: Vec<Batch> = (0..m).map(|_| resumed.next_batch().unwrap()).collect();
            prop_assert_eq!(&rest[..], &all[n..]);
            prop_assert_eq!(resumed.cursor(), one.cursor());
        }

        /// Shuffled: the ranks' batches side by side are the single-process shuffled
        /// stream of the global batch, and a cursor of 2 ranks of 8 continues in 4 ranks
        /// of 4 (elastic resumption).
        #[test]
        fn shuffled_ranks_tile_and_resume_elastically(
            (lens, t, _b, seed) in config(),
            world in 1usize..5,
            n in 0usize..6,
            m in 1usize..6,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let paths = tagged_shards(dir.path(), &lens);
            let rng = Pcg32::seed(seed, DEFAULT_SEQ);
            let open = |rank, world_size, b| {
                TokenStream::open_with(&paths, t, b, rng, None, shuffled(rank, world_size)).unwrap()
            };
            let mut global = open(0, 1, 16);
            let all: Vec<Batch> = (0..n + m).map(|_| global.next_batch().unwrap()).collect();
            let mut ranks: Vec<TokenStream> = (0..world).map(|r| open(r, world, 16 / world.next_power_of_two().min(16))).collect();
            let b = 16 / world.next_power_of_two().min(16);
            if b * world == 16 {
                for want in &all {
                    let mut inputs = Vec::new();
                    for r in &mut ranks {
                        inputs.extend(r.next_batch().unwrap().inputs);
                    }
                    prop_assert_eq!(&inputs, &want.inputs);
                }
            }
            let mut two: Vec<TokenStream> = (0..2).map(|r| open(r, 2, 8)).collect();
            for _ in 0..n {
                for s in &mut two {
                    s.next_batch().unwrap();
                }
            }
            let cursor = Cursor::from_json(&two[0].cursor().to_json()).unwrap();
            prop_assert_eq!(two[1].cursor(), cursor);
            let mut four: Vec<TokenStream> = (0..4).map(|r| open(r, 4, 4)).collect();
            for s in &mut four {
                s.restore(&cursor).unwrap();
            }
            for want in &all[n..] {
                let mut inputs = Vec::new();
                for s in &mut four {
                    inputs.extend(s.next_batch().unwrap().inputs);
                }
                prop_assert_eq!(&inputs, &want.inputs);
            }
        }
    }
}
