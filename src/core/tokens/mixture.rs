//! A mixture of token sources (scale.md section 8): several streams, each over its own
//! shards with its own passes, phases, shuffle order and epochs, drawing from its own
//! PCG32, interleaved window by window by the greedy rule of [`rule`], with weights
//! that may change in stages at global batches.
//!
//! Invariants: every source is a one-rank stream of one window per batch, so a source
//! that runs out starts its next epoch on its own; the rule is walked over the whole
//! global batch on every rank (each rank reads its B windows and skips the others'
//! without reading them), so the cursor is the same on every rank and ranks tile the
//! one-process stream; the cursor is the whole position (the next global window, the
//! rule's stage and counts, every source's cursor), so a restore continues bit for bit;
//! a batch that fails leaves every source and the rule where they were.

mod cursor;
mod pattern;
mod report;
mod rule;
mod skip;

use std::num::NonZeroU64;
use std::ops::Range;

pub use cursor::{source_digest, MixtureCursor, SourceCursor, StageRecord};
pub use pattern::expand_source;
pub use report::{MixReport, SourceReport};
pub use rule::{
    check_stages, check_weights, choose as choose_source, sources_of, stage_at, Rule, Stage,
    MAX_SOURCES, WEIGHT_SUM_TOLERANCE,
};

use super::batch::Batch;
use super::checks::{check_batch_shape, check_ranks, Ticker};
use super::stream::{Mark, Ranks, ShardOrder, StreamOptions, TokenStream};
use super::{Shard, TokensError};
use crate::pcg::Pcg32;

/// One source of a mixture: a name for messages (what the user wrote) and its shards.
#[derive(Debug)]
pub struct MixtureSource {
    /// The source as given (`web/*.bin`), for messages.
    pub name: String,
    /// Its opened shards, in stream order.
    pub shards: Vec<Shard>,
}

/// How a mixture reads beyond its shape: which ranks, and each source's shard order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MixtureOptions {
    /// This stream's rank and the world size.
    pub ranks: Ranks,
    /// Each source's shard order.
    pub order: ShardOrder,
}

/// Where one window of a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowOrigin {
    /// The source's index.
    pub source: usize,
    /// The shard's index within the source.
    pub shard: usize,
    /// The offset of the window's first input in that shard.
    pub offset: usize,
}

/// One batch of a mixture: the windows, and where each row came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixtureBatch {
    /// The B windows, as the single-source stream's batch.
    pub batch: Batch,
    /// Row `b`'s origin.
    pub origins: Vec<WindowOrigin>,
}

/// Windows from several sources at given weights, resumable from a [`MixtureCursor`].
#[derive(Debug)]
pub struct Mixture {
    sources: Vec<TokenStream>,
    names: Vec<String>,
    digests: Vec<String>,
    stages: Vec<Stage>,
    seq_len: usize,
    batch: usize,
    ranks: Ranks,
    order: ShardOrder,
    /// The global index of the next window (a multiple of the global batch).
    window: u64,
    rule: Rule,
}

/// Source `j`'s generator, derived from the mixture's `(state, inc)`:
/// `seed(state ^ ((j + 1) * 0x9E3779B97F4A7C15), (inc >> 1) + j + 1)`, wrapping; it
/// depends on `j` alone, so appending a source never changes the others' draws.
pub fn source_rng(rng: &Pcg32, j: usize) -> Pcg32 {
    let k = (j as u64).wrapping_add(1);
    Pcg32::seed(
        rng.state() ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        (rng.inc() >> 1).wrapping_add(k),
    )
}

fn bad_cursor(field: &str, reason: impl Into<String>) -> TokensError {
    TokensError::BadCursor {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// The stages as a message shows them: `[0.6, 0.4] from batch 0, [0.5, 0.5] from 100`.
fn show_stages(stages: &[StageRecord]) -> String {
    let parts: Vec<String> = stages
        .iter()
        .map(|s| {
            // Nine decimals: a normalised 0.6 shows as 0.6, not 0.6000000000000001.
            let ws: Vec<String> = s
                .weights
                .iter()
                .map(|w| {
                    let text = format!("{w:.9}");
                    text.trim_end_matches('0').trim_end_matches('.').to_string()
                })
                .collect();
            format!("[{}] from batch {}", ws.join(", "), s.batch)
        })
        .collect();
    parts.join(", ")
}

impl Mixture {
    /// A mixture of `sources` under `stages` (the first at batch 0), windows of
    /// `seq_len` inputs, `batch` windows per batch for this rank. Checks, before any
    /// shard is read: the shape and ranks, the stages and weights, every source holding
    /// a shard, one vocabulary across all sources; then each source's stream is built
    /// (its own checks) from [`source_rng`].
    pub fn new(
        sources: Vec<MixtureSource>,
        stages: &[Stage],
        seq_len: usize,
        batch: usize,
        rng: Pcg32,
        vocab: Option<u32>,
        options: MixtureOptions,
    ) -> Result<Mixture, TokensError> {
        check_batch_shape(seq_len, batch)?;
        check_ranks(batch, options.ranks)?;
        let stages = check_stages(stages, sources.len())?;
        for (j, source) in sources.iter().enumerate() {
            if source.shards.is_empty() {
                return Err(TokensError::BadMixture {
                    reason: format!(
                        "source {j} ({}) has no shards: a source needs at least one",
                        source.name
                    ),
                });
            }
        }
        let firsts: Vec<&Shard> = sources
            .iter()
            .flat_map(|s| s.shards.iter().find(|x| x.vocab().is_some()))
            .collect();
        check_one_vocab_refs(&firsts)?;
        let count = sources.len();
        let mut names = Vec::with_capacity(count);
        let mut digests = Vec::with_capacity(count);
        let mut streams = Vec::with_capacity(count);
        let one = StreamOptions {
            ranks: Ranks::SINGLE,
            order: options.order,
        };
        for (j, source) in sources.into_iter().enumerate() {
            digests.push(source_digest(&source.shards));
            names.push(source.name);
            let rng = source_rng(&rng, j);
            streams.push(TokenStream::with_options(
                source.shards,
                seq_len,
                1,
                rng,
                vocab,
                one,
            )?);
        }
        Ok(Mixture {
            sources: streams,
            names,
            digests,
            stages,
            seq_len,
            batch,
            ranks: options.ranks,
            order: options.order,
            window: 0,
            rule: Rule::fresh(0, 0, count),
        })
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

    /// Each source's shard order.
    pub fn order(&self) -> ShardOrder {
        self.order
    }

    /// B × world_size (checked at construction).
    pub fn global_batch(&self) -> usize {
        self.batch.saturating_mul(self.ranks.world_size)
    }

    /// The stages, normalised.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The sources' names, as given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Source `j`'s stream.
    pub fn source(&self, j: usize) -> Option<&TokenStream> {
        self.sources.get(j)
    }

    /// The number of sources.
    pub fn source_count(&self) -> usize {
        self.sources.len()
    }

    /// Every shard of every source, for a session that must not write over one.
    pub fn all_shards(&self) -> impl Iterator<Item = &Shard> {
        self.sources.iter().flat_map(|s| s.shards().iter())
    }

    /// The global index of the next window.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The next B windows as fresh [B, T] arrays, with each row's origin.
    pub fn next_batch(&mut self) -> Result<MixtureBatch, TokensError> {
        let (b, t) = (self.batch, self.seq_len);
        let mut inputs = vec![0i64; b.saturating_mul(t)];
        let mut targets = vec![0i64; b.saturating_mul(t)];
        let mut origins = Vec::with_capacity(b);
        self.next_batch_into_cancellable(&mut inputs, &mut targets, &mut origins, &mut || false)?;
        Ok(MixtureBatch {
            batch: Batch {
                inputs,
                targets,
                batch: b,
                seq_len: t,
            },
            origins,
        })
    }

    /// The next B windows into caller-provided [B, T] arrays (each exactly B × T
    /// values), `origins` replaced by each row's origin, asking `cancel` every million
    /// or so units of work; on an error (including [`TokensError::Interrupted`]) every
    /// source and the rule are where they were.
    pub fn next_batch_into_cancellable(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
        origins: &mut Vec<WindowOrigin>,
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
        let marks: Vec<Mark> = self.sources.iter().map(TokenStream::mark).collect();
        let before = (self.window, self.rule.clone());
        origins.clear();
        let mut ticks = Ticker::new(cancel);
        let start = self.ranks.rank.saturating_mul(self.batch);
        let mine = start..start.saturating_add(self.batch);
        let result = self.walk_batch(inputs, targets, origins, mine, &mut ticks);
        if result.is_err() {
            for (source, mark) in self.sources.iter_mut().zip(marks) {
                source.reset(mark);
            }
            (self.window, self.rule) = before;
            origins.clear();
        }
        result
    }

    /// Start the stage of the coming global batch when one begins there.
    fn enter_stage(&mut self) {
        let global = (self.global_batch() as u64).max(1);
        let stage = stage_at(&self.stages, self.window / global);
        if stage > self.rule.stage {
            self.rule = Rule::fresh(stage, self.window, self.sources.len());
        }
    }

    /// Walk one global batch, reading its windows `mine` (this rank's, or none when
    /// skipping) into `inputs` and `targets` and skipping the others without reading.
    fn walk_batch(
        &mut self,
        inputs: &mut [i64],
        targets: &mut [i64],
        origins: &mut Vec<WindowOrigin>,
        mine: Range<usize>,
        ticks: &mut Ticker<'_>,
    ) -> Result<(), TokensError> {
        self.enter_stage();
        let t = self.seq_len;
        let global = self.global_batch();
        let weights = self
            .stages
            .get(self.rule.stage)
            .map(|s| s.weights.clone())
            .unwrap_or_default();
        let mut pending = vec![0usize; self.sources.len()];
        let mut rows = inputs.chunks_exact_mut(t).zip(targets.chunks_exact_mut(t));
        for i in 0..global {
            let g = self.window.saturating_add(i as u64);
            let j = self.rule.next(&weights, g);
            let (Some(source), Some(skip)) = (self.sources.get_mut(j), pending.get_mut(j)) else {
                continue;
            };
            if !mine.contains(&i) {
                *skip = skip.saturating_add(1);
                ticks.add(1)?;
                continue;
            }
            source.skip(std::mem::take(skip), ticks)?;
            let at = source.advance(ticks)?;
            if let Some((x, y)) = rows.next() {
                source.read_window(at, x, y)?;
            }
            origins.push(WindowOrigin {
                source: j,
                shard: at.0,
                offset: at.1,
            });
            ticks.add(t)?;
        }
        for (source, skip) in self.sources.iter_mut().zip(pending) {
            source.skip(skip, ticks)?;
            source.check_held()?;
        }
        self.window = self.window.saturating_add(global as u64);
        Ok(())
    }

    fn stage_records(&self) -> Vec<StageRecord> {
        self.stages
            .iter()
            .map(|s| StageRecord {
                batch: s.batch,
                weights: s.weights.clone(),
            })
            .collect()
    }

    /// The whole position: the next global window, the global batch, the rule's stage,
    /// start and counts, the stages, and each source's digest and cursor.
    pub fn cursor(&self) -> MixtureCursor {
        MixtureCursor {
            window: self.window,
            global_batch: NonZeroU64::new(self.global_batch() as u64).unwrap_or(NonZeroU64::MIN),
            stage: self.rule.stage as u64,
            stage_start: self.rule.start,
            counts: self.rule.counts.clone(),
            stages: self.stage_records(),
            sources: self
                .sources
                .iter()
                .zip(&self.digests)
                .map(|(s, d)| SourceCursor {
                    digest: d.clone(),
                    cursor: s.cursor(),
                })
                .collect(),
        }
    }

    /// Move to `cursor`. A cursor of another mixture (other shards in a source, other
    /// stages or weights) is refused naming the difference, unless `allow_new_mixture`:
    /// then each source resumes where it was and the rule starts a new stage (of this
    /// mixture's schedule) at the next global batch. The number of sources and the
    /// global batch must match in any case. On error nothing changes.
    pub fn restore(
        &mut self,
        cursor: &MixtureCursor,
        allow_new_mixture: bool,
    ) -> Result<(), TokensError> {
        let count = self.sources.len();
        if cursor.sources.len() != count {
            return Err(bad_cursor(
                "sources",
                format!(
                    "the cursor is of a mixture of {} source(s), this one has {count}",
                    cursor.sources.len()
                ),
            ));
        }
        let global = self.global_batch() as u64;
        if cursor.global_batch.get() != global {
            return Err(TokensError::GlobalBatchMismatch {
                cursor: cursor.global_batch.get(),
                stream: global,
                batch: self.batch,
                world_size: self.ranks.world_size,
            });
        }
        if !cursor.window.is_multiple_of(global) {
            return Err(bad_cursor(
                "window",
                format!(
                    "{} is not a multiple of the global batch {global}",
                    cursor.window
                ),
            ));
        }
        let same = self.same_mixture(cursor, allow_new_mixture)?;
        let rule = if same {
            self.rule_of(cursor)?
        } else {
            Rule::fresh(
                stage_at(&self.stages, cursor.window / global),
                cursor.window,
                count,
            )
        };
        let marks: Vec<Mark> = self.sources.iter().map(TokenStream::mark).collect();
        for (j, (source, part)) in self.sources.iter_mut().zip(&cursor.sources).enumerate() {
            if let Err(e) = source.restore(&part.cursor) {
                for (s, m) in self.sources.iter_mut().zip(marks) {
                    s.reset(m);
                }
                let name = self.names.get(j).cloned().unwrap_or_default();
                return Err(bad_cursor(
                    &format!("sources[{j}].cursor"),
                    format!("source {j} ({name}): {e}"),
                ));
            }
        }
        self.window = cursor.window;
        self.rule = rule;
        Ok(())
    }

    /// Whether `cursor` is of this very mixture; a difference is an error naming it
    /// unless `allow_new` (then `false`).
    fn same_mixture(&self, cursor: &MixtureCursor, allow_new: bool) -> Result<bool, TokensError> {
        let hint = "pass allow_new_mixture to resume each source where it was under \
                    this mixture's weights (a new stage at the next global batch)";
        for (j, (ours, theirs)) in self.digests.iter().zip(&cursor.sources).enumerate() {
            if *ours != theirs.digest {
                if allow_new {
                    return Ok(false);
                }
                let name = self.names.get(j).cloned().unwrap_or_default();
                return Err(bad_cursor(
                    &format!("sources[{j}].digest"),
                    format!(
                        "source {j} ({name}) has other shards than the cursor's (digest \
                         {ours}, the cursor's {}): the cursor is of another mixture; {hint}",
                        theirs.digest
                    ),
                ));
            }
        }
        let ours = self.stage_records();
        if ours != cursor.stages {
            if allow_new {
                return Ok(false);
            }
            return Err(bad_cursor(
                "stages",
                format!(
                    "the cursor's weights are {}, this mixture's {}: the cursor is of \
                     another mixture; {hint}",
                    show_stages(&cursor.stages),
                    show_stages(&ours)
                ),
            ));
        }
        Ok(true)
    }

    /// The rule's state a cursor of this mixture names, checked: a stage that exists
    /// and is not ahead of the cursor's batch, a start at or before the window, one
    /// count per source summing to the windows since the start.
    fn rule_of(&self, cursor: &MixtureCursor) -> Result<Rule, TokensError> {
        let global = (self.global_batch() as u64).max(1);
        let stage = usize::try_from(cursor.stage)
            .ok()
            .filter(|&k| k <= stage_at(&self.stages, cursor.window / global))
            .ok_or_else(|| {
                bad_cursor(
                    "stage",
                    format!(
                        "{} is not a stage in force at window {}",
                        cursor.stage, cursor.window
                    ),
                )
            })?;
        if cursor.counts.len() != self.sources.len() {
            return Err(bad_cursor(
                "counts",
                format!(
                    "{} count(s) for {} source(s)",
                    cursor.counts.len(),
                    self.sources.len()
                ),
            ));
        }
        let rule = Rule {
            stage,
            start: cursor.stage_start,
            counts: cursor.counts.clone(),
        };
        let since = cursor.window.checked_sub(cursor.stage_start);
        if since != Some(rule.assigned()) {
            return Err(bad_cursor(
                "counts",
                format!(
                    "they sum to {}, but {} window(s) passed since the stage's start {}",
                    rule.assigned(),
                    cursor.window.saturating_sub(cursor.stage_start),
                    cursor.stage_start
                ),
            ));
        }
        Ok(rule)
    }
}

/// The first recorded vocabulary of each source must agree across sources.
fn check_one_vocab_refs(firsts: &[&Shard]) -> Result<(), TokensError> {
    let mut seen: Option<(&Shard, u32)> = None;
    for shard in firsts {
        let Some(v) = shard.vocab() else { continue };
        match seen {
            None => seen = Some((shard, v)),
            Some((first, w)) if w != v => {
                return Err(TokensError::MixedVocab {
                    path: shard.path().to_path_buf(),
                    recorded: v,
                    first: first.path().to_path_buf(),
                    first_recorded: w,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
