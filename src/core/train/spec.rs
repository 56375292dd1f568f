//! What a run is asked to do ([`RunSpec`], [`Method`]), what it reports while it runs
//! ([`Progress`]) and how it ended ([`RunOutcome`]): the interface between the command
//! layer and the training loop.
//!
//! Invariant: plain data; nothing here touches a file. The command layer builds a
//! [`RunSpec`] from flags and draws [`Progress`]; `run` checks the spec before use.

use std::path::PathBuf;

use crate::optim::OptimConfig;

/// How the model is fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Optimizer steps on the mean cross-entropy.
    Gradient,
    /// One counting pass: W = ln((c + 1) / (n + V)).
    Counts,
}

impl Method {
    /// The config's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Gradient => "gradient",
            Method::Counts => "counts",
        }
    }
}

/// Everything `tlio train bigram` was asked to do.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The shards, in stream order.
    pub data: Vec<PathBuf>,
    /// The run directory.
    pub out: PathBuf,
    /// Train until this step.
    pub max_steps: u64,
    /// B.
    pub batch: usize,
    /// T.
    pub seq_len: usize,
    /// Checkpoint every this many steps (and after the last).
    pub ckpt_every: u64,
    /// Keep only this many newest checkpoints.
    pub keep: Option<usize>,
    /// The optimizer.
    pub optim: OptimConfig,
    /// `--seed S`: the stream's generator is `seed(S, 54)`.
    pub seed: u64,
    /// Continue from the newest checkpoint (or start at 0 when there is none).
    pub resume: bool,
    /// How the model is fitted.
    pub method: Method,
    /// V, required only when no shard records it.
    pub vocab_size: Option<u32>,
    /// Visit the shards in a new order each epoch (tokens.md's shuffled shard order).
    /// Not part of the run's config: a cursor resumes into a shuffled stream (the
    /// current epoch ends in file order), and a shuffled cursor is refused by an
    /// unshuffled stream, so a resume can switch it on but never off.
    pub shuffle: bool,
}

/// What the loop reports while it runs (the command layer draws it).
#[derive(Debug, Clone)]
pub enum Progress {
    /// About to start: at `step` (0 for a fresh run), towards `max_steps`.
    Start {
        /// The step the run continues from.
        step: u64,
        /// The last step.
        max_steps: u64,
        /// Tokens consumed before this process started.
        tokens_seen: u64,
        /// The checkpoint resumed from.
        resumed_from: Option<PathBuf>,
        /// `--resume` was given but there was no checkpoint yet.
        nothing_to_resume: bool,
    },
    /// A step finished.
    Step {
        /// Its number.
        step: u64,
        /// Its training loss.
        loss: f32,
        /// Tokens consumed so far.
        tokens_seen: u64,
    },
    /// A checkpoint was committed.
    Saved {
        /// Its step.
        step: u64,
        /// Its directory.
        path: PathBuf,
    },
    /// `--resume` refused a checkpoint (or a bad `LATEST`) on its way to an older one.
    Skipped {
        /// The refused entry (`LATEST` or a step directory name), exact.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// A save has been waiting a while for another save or gc to release the lock.
    WaitingForLock {
        /// The lock file.
        path: PathBuf,
    },
    /// The count model counted one shard.
    Counted {
        /// The shard's index.
        shard: usize,
        /// Positions counted so far.
        positions: u64,
    },
}

/// How the run ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The final line (with its newline), also in `DIR/final.json`.
    pub line: String,
    /// The last checkpoint, when one was written or loaded.
    pub checkpoint: Option<PathBuf>,
}
