//! Training: the bigram model, its exact gradient, the count model, and the memory
//! limit that refuses a vocabulary too large for this machine before allocating.
//!
//! The modules, by job: `bigram` (the model and its gradient), `counts` (the count
//! model), `config` (config.json, a run's identity), `spec` (what a run is asked and
//! reports), `layout` (the names inside `--out`), `checks` (what is refused before the
//! first step, and the run's lock), `trainer` (a gradient run in memory and its
//! checkpoints), `writers` (the model and optimizer files' bytes), `final_line` (the
//! final line and its hashes), `run` (the orchestration of both methods).
//!
//! Invariant: a run is a pure function of its flags and data: every reduction runs in a
//! fixed order on one thread, so the same inputs give the same bits on the same machine.

pub mod bigram;
pub mod checks;
pub mod config;
pub mod counts;
pub mod final_line;
pub mod layout;
pub mod run;
pub mod spec;
pub mod trainer;
pub mod writers;

use std::io;
use std::path::PathBuf;

use crate::atomic::AtomicError;
use crate::checkpoint::CheckpointError;
use crate::failure::{Failure, FailureKind};
use crate::optim::OptimError;
use crate::safetensors::SafetensorsError;
use crate::tokens::TokensError;

/// The most memory the model state may take: the [V, V] F32 weights plus two
/// [V, V] F32 AdamW moments (`V * V * 3 * 4` bytes); the count model needs the same
/// (u64 counts plus F32 weights). 4 GiB admits V up to 18 918; GPT-2's 50 257 would
/// need 30.3 GB and is refused up front.
pub const MAX_STATE_BYTES: u64 = 4 << 30;

/// Bytes per vocabulary entry squared that the limit counts: three F32 arrays.
pub const STATE_BYTES_PER_ENTRY: u64 = 3 * 4;

/// A field of the run's spec that an error is about. Core names it by its field
/// (`max_steps`); the command layer, which knows how the user set it, by its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The token shards.
    Data,
    /// The last step.
    MaxSteps,
    /// Steps between checkpoints.
    CkptEvery,
    /// Sequences per batch.
    Batch,
    /// Tokens per sequence.
    SeqLen,
    /// Checkpoints kept.
    Keep,
    /// The vocabulary size.
    VocabSize,
    /// The training method.
    Method,
    /// The data-order seed.
    Seed,
    /// The optimizer kind.
    Optimizer,
    /// The learning rate.
    Lr,
    /// The weight decay.
    WeightDecay,
    /// SGD's momentum.
    Momentum,
    /// AdamW's betas.
    Betas,
    /// AdamW's epsilon.
    Eps,
    /// SGD's dampening.
    Dampening,
    /// SGD's Nesterov switch.
    Nesterov,
    /// The config's format, version and model.
    ConfigFormat,
}

impl Field {
    /// The field's name in the spec.
    pub fn name(self) -> &'static str {
        match self {
            Field::Data => "data",
            Field::MaxSteps => "max_steps",
            Field::CkptEvery => "ckpt_every",
            Field::Batch => "batch",
            Field::SeqLen => "seq_len",
            Field::Keep => "keep",
            Field::VocabSize => "vocab_size",
            Field::Method => "method",
            Field::Seed => "seed",
            Field::Optimizer => "optimizer",
            Field::Lr => "lr",
            Field::WeightDecay => "weight_decay",
            Field::Momentum => "momentum",
            Field::Betas => "betas",
            Field::Eps => "eps",
            Field::Dampening => "dampening",
            Field::Nesterov => "nesterov",
            Field::ConfigFormat => "config format",
        }
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The vocabulary's [V, V] state would exceed [`MAX_STATE_BYTES`].
    #[error(
        "vocabulary size {vocab} needs {bytes} bytes of model state (V*V*3*4: weights and two optimizer moments), beyond the limit of {limit} bytes"
    )]
    VocabTooLarge {
        /// V.
        vocab: u64,
        /// The bytes it would need (saturated at u64::MAX).
        bytes: u64,
        /// [`MAX_STATE_BYTES`].
        limit: u64,
    },
    /// The vocabulary is empty.
    #[error("vocabulary size 0: the model needs at least one token")]
    EmptyVocab,
    /// A token id is negative or not below the vocabulary size.
    #[error("token id {id} is out of range for vocabulary size {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: i64,
        /// V.
        vocab: u64,
    },
    /// Arrays whose sizes do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The optimizer refused.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// A shard or the token stream refused.
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// The checkpoint protocol failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A safetensors file could not be read or written.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// An atomic output file could not be written.
    #[error(transparent)]
    Atomic(#[from] AtomicError),
    /// A file-system operation failed.
    #[error("{}", path.display())]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The flags contradict themselves or are out of range.
    #[error("{0}")]
    Usage(String),
    /// A field of the run's spec is out of range (the command layer names the flag
    /// that set it).
    #[error("{field} {rule}")]
    BadField {
        /// The field.
        field: Field,
        /// What it must be, e.g. `must be at least 1`.
        rule: &'static str,
    },
    /// No shard records its vocabulary size and none was given.
    #[error("no shard records its vocabulary size (header word 3 is 0): give vocab_size")]
    NoVocab,
    /// Another training run holds the run directory.
    #[error("{} is held by another tlio train run{holder}", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The process holding it, as the lock file records it.
        holder: crate::checkpoint::holder::HeldBy,
    },
    /// Without `--resume`, the run directory already holds checkpoints.
    #[error("{} already holds checkpoints: resume that run, or choose another output directory", dir.display())]
    ExistingCheckpoints {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// `--resume` with flags that disagree with the checkpoint's config.
    #[error("cannot resume: {field}{} disagrees with the checkpoint's run: it used {checkpoint}, this run asks for {given}", shard_text(*.shard))]
    ConfigMismatch {
        /// The field that differs.
        field: Field,
        /// The data shard that differs, when `field` is `data` and the counts agree.
        shard: Option<usize>,
        /// The checkpoint's value.
        checkpoint: String,
        /// This run's value.
        given: String,
    },
    /// A checkpoint that verifies but does not fit this run (shapes, missing state).
    #[error("{}: {why}", path.display())]
    BadCheckpoint {
        /// The step directory.
        path: PathBuf,
        /// What does not fit.
        why: String,
    },
    /// The checkpoint is at or past `--max-steps` and there is nothing to print.
    #[error("the run's checkpoint is at step {step}, max_steps is {max_steps}: give a larger max_steps to continue it")]
    PastMaxSteps {
        /// The checkpoint's step.
        step: u64,
        /// `--max-steps`.
        max_steps: u64,
    },
    /// The loss stopped being a finite number: training diverged.
    #[error("the loss became {loss} at step {step}: training diverged (try a smaller lr); the checkpoints before it are kept, nothing of this step is saved")]
    NonFiniteLoss {
        /// The step whose loss was not finite.
        step: u64,
        /// That loss.
        loss: f32,
    },
}

/// ` (shard i)` after `data` when one shard differs.
pub fn shard_text(shard: Option<usize>) -> String {
    shard.map(|i| format!(" (shard {i})")).unwrap_or_default()
}

impl Failure for TrainError {
    fn kind(&self) -> FailureKind {
        match self {
            TrainError::Optim(e) => e.kind(),
            TrainError::Tokens(e) => e.kind(),
            TrainError::Checkpoint(e) => e.kind(),
            TrainError::Safetensors(e) => e.kind(),
            TrainError::Atomic(e) => e.kind(),
            TrainError::Io { .. }
            | TrainError::Usage(_)
            | TrainError::BadField { .. }
            | TrainError::NoVocab
            | TrainError::Locked { .. }
            | TrainError::ExistingCheckpoints { .. }
            | TrainError::ConfigMismatch { .. }
            | TrainError::PastMaxSteps { .. } => FailureKind::Operational,
            TrainError::VocabTooLarge { .. }
            | TrainError::EmptyVocab
            | TrainError::TokenOutOfRange { .. }
            | TrainError::Shape(_)
            | TrainError::BadCheckpoint { .. }
            | TrainError::NonFiniteLoss { .. } => FailureKind::Invalid,
        }
    }
}

/// The bytes of model state vocabulary `vocab` needs (`V * V * 3 * 4`), saturating.
pub fn state_bytes(vocab: u32) -> u64 {
    let v = vocab as u64;
    v.checked_mul(v)
        .and_then(|vv| vv.checked_mul(STATE_BYTES_PER_ENTRY))
        .unwrap_or(u64::MAX)
}

/// Refuse an empty vocabulary or one whose state exceeds [`MAX_STATE_BYTES`].
pub fn check_model_vocab(vocab: u32) -> Result<(), TrainError> {
    if vocab == 0 {
        return Err(TrainError::EmptyVocab);
    }
    let bytes = state_bytes(vocab);
    if bytes > MAX_STATE_BYTES {
        return Err(TrainError::VocabTooLarge {
            vocab: vocab as u64,
            bytes,
            limit: MAX_STATE_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_limit_is_checked_before_allocating() {
        assert!(check_model_vocab(256).is_ok());
        assert!(check_model_vocab(18_918).is_ok());
        let err = check_model_vocab(50_257).unwrap_err();
        assert!(matches!(
            err,
            TrainError::VocabTooLarge {
                vocab: 50_257,
                bytes: 30_309_192_588,
                ..
            }
        ));
        assert!(err.to_string().contains("30309192588 bytes"), "{err}");
        assert!(bigram::Bigram::zeros(u32::MAX).is_err());
        assert!(counts::CountsBuilder::new(100_000).is_err());
        assert!(matches!(check_model_vocab(0), Err(TrainError::EmptyVocab)));
    }
}
