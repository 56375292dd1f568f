//! The errors of opening, checking and transforming models, and which exit status
//! each one means (operational: exit 2; a broken rule or an unfit input: exit 1).
//!
//! Invariant: every variant names the path, tensor or rule concerned, and its source
//! error once (the CLI prints the chain with each cause once).

use std::io;
use std::path::PathBuf;

use super::{INDEX_NAME, SINGLE_NAME};
use crate::failure::{Failure, FailureKind};
use crate::safetensors::SafetensorsError;
use crate::text::quote;

/// Errors of opening and transforming models.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file or directory could not be read.
    #[error("cannot read {}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A directory holds both an index and `model.safetensors` (the user must pick one).
    #[error("{} is ambiguous: it holds both {INDEX_NAME} and {SINGLE_NAME}; name the one to use ({} or {})", .0.display(), .0.join(INDEX_NAME).display(), .0.join(SINGLE_NAME).display())]
    Ambiguous(PathBuf),
    /// A directory holds neither an index nor `model.safetensors`.
    #[error("{} is not a model directory: it holds neither {INDEX_NAME} nor {SINGLE_NAME}", .path.display())]
    NotAModel {
        /// The directory.
        path: PathBuf,
    },
    /// The model breaks one or more rules (the first is shown; `st verify` lists all).
    #[error("{first}{}", more_text(*.more))]
    Invalid {
        /// The first problem found.
        first: String,
        /// How many more problems there are.
        more: usize,
    },
    /// A safetensors error while reading or writing the file of a single-file model
    /// (or a shard the caller has yet to name, see [`ModelError::in_shard`]).
    #[error(transparent)]
    Safetensors(SafetensorsError),
    /// A safetensors error while reading or writing one shard of a sharded model.
    #[error("shard {}", quote(.shard))]
    Shard {
        /// The shard concerned.
        shard: String,
        /// The cause.
        source: SafetensorsError,
    },
    /// A weight to quantize is NaN or infinite.
    #[error("quantize: tensor {}: row {row}, column {col}: the weight {value} is not finite", quote(.tensor))]
    NonFinite {
        /// Tensor name.
        tensor: String,
        /// Row.
        row: u64,
        /// Column.
        col: u64,
        /// The value.
        value: f32,
    },
    /// A group's scale amax / 7 overflows F16.
    #[error("quantize: tensor {}: row {row}, group {group}: the scale {amax}/7 overflows F16", quote(.tensor))]
    ScaleOverflow {
        /// Tensor name.
        tensor: String,
        /// Row.
        row: u64,
        /// Group index within the row.
        group: u64,
        /// The group's largest magnitude.
        amax: f32,
    },
    /// A tensor cannot be quantized as asked (F64, odd column count, group not dividing).
    #[error("quantize: tensor {}: {detail}", quote(.tensor))]
    CannotQuantize {
        /// Tensor name.
        tensor: String,
        /// Why.
        detail: String,
    },
    /// The group size is not an even number >= 2.
    #[error("the group size must be an even number >= 2, not {group}")]
    BadGroup {
        /// The group size given.
        group: u64,
    },
    /// The output already exists and is not an empty directory.
    #[error("refusing to write {}: it already exists and is not an empty directory", .path.display())]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// The output would be (or be inside) the input.
    #[error("refusing to write {}: it is the input or lies inside the input model's directory", .path.display())]
    SameAsInput {
        /// The output path.
        path: PathBuf,
    },
    /// Writing the output failed.
    #[error("cannot write {}", .path.display())]
    Write {
        /// The path being written.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The atomic-write protocol refused or failed (e.g. the process is being interrupted).
    #[error(transparent)]
    Atomic(#[from] crate::atomic::AtomicError),
    /// A file in, a directory out (or the reverse) is not what the command does.
    #[error("{detail}")]
    Usage {
        /// What was asked.
        detail: String,
    },
}

fn more_text(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (and 1 more problem; st verify lists them all)".to_string(),
        n => format!(" (and {n} more problems; st verify lists them all)"),
    }
}

impl ModelError {
    /// A safetensors error, in the shard `shard` when the model has several (`None`:
    /// a single-file model, whose one file the message needs not name again).
    pub fn in_shard(shard: Option<String>, source: SafetensorsError) -> ModelError {
        match shard {
            Some(shard) => ModelError::Shard { shard, source },
            None => ModelError::Safetensors(source),
        }
    }
}

impl Failure for ModelError {
    fn kind(&self) -> FailureKind {
        match self {
            ModelError::Io { .. }
            | ModelError::Write { .. }
            | ModelError::OutputExists { .. }
            | ModelError::SameAsInput { .. }
            | ModelError::BadGroup { .. }
            | ModelError::Usage { .. } => FailureKind::Operational,
            ModelError::Shard { source, .. } | ModelError::Safetensors(source) => source.kind(),
            ModelError::Atomic(source) => source.kind(),
            ModelError::NotAModel { .. }
            | ModelError::Ambiguous(_)
            | ModelError::Invalid { .. }
            | ModelError::NonFinite { .. }
            | ModelError::ScaleOverflow { .. }
            | ModelError::CannotQuantize { .. } => FailureKind::Invalid,
        }
    }
}
