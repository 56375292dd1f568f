//! A pack split into parts that run anywhere (`tokens pack --part K/N`) and their merge
//! (`tokens merge`), whose shards are byte-identical to one `tokens pack` of the same
//! inputs with the same options.
//!
//! Invariants:
//! - The plan is a pure function of the input sizes, their document boundaries and N:
//!   part K is a contiguous share of the document sequence (whole files in the order
//!   given, a large uncompressed JSONL or id file cut at a document boundary found by
//!   seeking), the parts tile the sequence in order, and each cut is within one
//!   document (or one unsplittable file) of the ideal `K * total / N` byte.
//! - A part writes its ids as a raw little-endian stream in the final shards' dtype
//!   (never shards: shard boundaries are the merge's), then its completion marker, last
//!   and atomically; a part without a marker is incomplete and is redone from scratch.
//! - A shard of a single pack is a function of the concatenated id stream alone (the
//!   sink cuts it at fixed counts), so the merge cuts the concatenated part streams at
//!   the same counts, writes the same headers, and names the shards the same way.
//!   Every shard is made durable under a temporary name before any final name appears.

use std::io;
use std::path::{Path, PathBuf};

pub use super::part_docs::DOCS_FILE;
use super::TokensError;
use crate::atomic::AtomicError;
use crate::failure::{Failure, FailureKind};

mod marker;
mod merge;
mod plan;
mod writer;

// The object-storage parts read and check the same markers (remote::parts).
#[cfg(feature = "s3")]
pub(crate) use marker::{check_counts, check_made_with, parse_dir_name, parse_marker};
pub use marker::{tokenizer_identity, InputId, PartIdentity, PartMarker};
#[cfg(feature = "s3")]
pub(crate) use merge::{
    check_ids_digest, check_ids_size, check_parts_total, check_tiling, missing_parts,
};
pub use merge::{merge_parts, MergeSummary};
pub use plan::{part_segments, plan_cuts, Position, Segment};
pub use writer::{pack_part, PartJob, PartOutcome, PartSource};

/// The most parts a pack may be split into.
pub const MAX_PARTS: usize = 1_000_000;
/// The suffix of the part area: `OUT.parts/` beside the output.
pub const AREA_SUFFIX: &str = ".parts";
/// A part's ids, inside its directory `K-of-N`.
pub const IDS_FILE: &str = "ids.bin";
/// A part's completion marker, written last.
pub const MARKER_FILE: &str = "complete.json";
/// The `format` of a marker.
pub const MARKER_FORMAT: &str = "tlio-tokens-part";
/// The marker version this build writes and reads.
pub const MARKER_VERSION: u32 = 2;
/// The largest marker read (it holds the input list).
pub(crate) const MAX_MARKER_BYTES: u64 = 64 << 20;

/// Errors of partitioned packs and their merge.
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    /// A part number that is not `K/N` with `0 <= K < N <= MAX_PARTS`.
    #[error("bad part {given:?}: {reason}")]
    BadPart {
        /// What was given.
        given: String,
        /// The rule it breaks.
        reason: String,
    },
    /// Standard input, or no input, cannot be split among machines.
    #[error("a pack in parts reads named files (every part plans the same split); standard input cannot be split")]
    Stdin,
    /// Nothing to merge.
    #[error("{}: no parts (nothing was packed with a part number into this output)", area.display())]
    NoParts {
        /// The part area.
        area: PathBuf,
    },
    /// Parts of different counts in one area.
    #[error("{}: holds parts of {found} and of {expected}: one output is packed in one number of parts (remove the area to start over)", area.display())]
    CountMismatch {
        /// The part area.
        area: PathBuf,
        /// One count found.
        found: usize,
        /// The other.
        expected: usize,
    },
    /// Parts that are missing or have not completed.
    #[error("{}: {count} of {parts} parts missing or incomplete: {missing}", area.display())]
    Missing {
        /// The part area.
        area: PathBuf,
        /// How many.
        count: usize,
        /// N.
        parts: usize,
        /// Their names (`K-of-N`), the first ones.
        missing: String,
    },
    /// Two parts (or a part and this run) made with different options or inputs.
    #[error("{}: made with {field} {theirs}, but {other} has {ours}: every part of one output takes the same inputs and options (remove the area to start over with new ones)", part.display())]
    Mismatch {
        /// The part's directory.
        part: PathBuf,
        /// The differing setting.
        field: String,
        /// Its value in that part.
        theirs: String,
        /// What it is compared with (`this run`, `part 0-of-4`).
        other: String,
        /// Its value there.
        ours: String,
    },
    /// Parts that do not tile the document sequence.
    #[error("{}: starts at {found}, but the part before it ends at {expected}: the parts do not tile the inputs", part.display())]
    NotContiguous {
        /// The part's directory.
        part: PathBuf,
        /// Where it starts.
        found: String,
        /// Where it should.
        expected: String,
    },
    /// A marker that is not one.
    #[error("{}: not a part completion marker: {reason}", path.display())]
    BadMarker {
        /// The marker.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A part's ids that disagree with its marker.
    #[error("{}: {reason} (rerun that part)", path.display())]
    BadIds {
        /// The ids file.
        path: PathBuf,
        /// What disagrees.
        reason: String,
    },
    /// A file or directory could not be read or made.
    #[error("{}: {error}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error (in the message only, printed once).
        error: io::Error,
    },
    /// Packing the part failed.
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// Writing a file failed.
    #[error(transparent)]
    Write(#[from] AtomicError),
}

impl Failure for PartsError {
    fn kind(&self) -> FailureKind {
        match self {
            PartsError::BadPart { .. } | PartsError::Stdin | PartsError::Io { .. } => {
                FailureKind::Operational
            }
            PartsError::NoParts { .. }
            | PartsError::CountMismatch { .. }
            | PartsError::Missing { .. }
            | PartsError::Mismatch { .. }
            | PartsError::NotContiguous { .. }
            | PartsError::BadMarker { .. }
            | PartsError::BadIds { .. } => FailureKind::Invalid,
            PartsError::Tokens(e) => e.kind(),
            PartsError::Write(e) => e.kind(),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PartsError + '_ {
    move |error| PartsError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Part K of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// K, from 0.
    pub index: usize,
    /// N.
    pub count: usize,
}

impl Part {
    /// `K/N` with `0 <= K < N <= MAX_PARTS`.
    pub fn parse(given: &str) -> Result<Part, PartsError> {
        let bad = |reason: &str| PartsError::BadPart {
            given: given.to_string(),
            reason: reason.to_string(),
        };
        let (k, n) = given
            .split_once('/')
            .ok_or_else(|| bad("expected K/N (part K of N, K from 0)"))?;
        let number = |s: &str, what: &str| {
            // Digits only: no sign, no spaces, no 0x.
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{what} is not a number")));
            }
            s.parse::<usize>()
                .ok()
                .filter(|&v| v <= MAX_PARTS)
                .ok_or_else(|| bad(&format!("{what} is above the limit of {MAX_PARTS}")))
        };
        Part::new(number(k, "K")?, number(n, "N")?).map_err(|e| match e {
            PartsError::BadPart { reason, .. } => bad(&reason),
            other => other,
        })
    }

    /// Part `index` of `count`, checked.
    pub fn new(index: usize, count: usize) -> Result<Part, PartsError> {
        let bad = |reason: String| PartsError::BadPart {
            given: format!("{index}/{count}"),
            reason,
        };
        if count == 0 || count > MAX_PARTS {
            return Err(bad(format!("N must be 1 to {MAX_PARTS}")));
        }
        if index >= count {
            return Err(bad(format!(
                "K must be below N (parts are 0 to {})",
                count - 1
            )));
        }
        Ok(Part { index, count })
    }

    /// The part of a Slurm array task: K = `SLURM_ARRAY_TASK_ID` minus
    /// `SLURM_ARRAY_TASK_MIN`, N = `SLURM_ARRAY_TASK_COUNT`, from `var` (the
    /// environment's lookup). The array must be a range with step 1 (`--array=0-15`),
    /// so that the task ids are K's.
    pub fn from_slurm(var: &dyn Fn(&str) -> Option<String>) -> Result<Part, PartsError> {
        let get = |name: &str| -> Result<usize, PartsError> {
            let value = var(name).ok_or_else(|| PartsError::BadPart {
                given: "slurm".to_string(),
                reason: format!("{name} is not set (not inside a Slurm array job)"),
            })?;
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| PartsError::BadPart {
                    given: "slurm".to_string(),
                    reason: format!("{name}={value:?} is not a number"),
                })
        };
        if let Some(step) = var("SLURM_ARRAY_TASK_STEP") {
            if step.trim() != "1" {
                return Err(PartsError::BadPart {
                    given: "slurm".to_string(),
                    reason: format!("SLURM_ARRAY_TASK_STEP is {step}: the array must be a range with step 1 (an array such as 0-N)"),
                });
            }
        }
        let id = get("SLURM_ARRAY_TASK_ID")?;
        let min = get("SLURM_ARRAY_TASK_MIN")?;
        let count = get("SLURM_ARRAY_TASK_COUNT")?;
        let index = id.checked_sub(min).ok_or_else(|| PartsError::BadPart {
            given: "slurm".to_string(),
            reason: format!("SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"),
        })?;
        Part::new(index, count).map_err(|e| match e {
            PartsError::BadPart { reason, .. } => PartsError::BadPart {
                given: "slurm".to_string(),
                reason: format!("{reason} (task {id} of an array from {min}, {count} tasks; the array must be one range with step 1)"),
            },
            other => other,
        })
    }

    /// The part's directory name, `K-of-N`.
    pub fn dir_name(&self) -> String {
        format!("{}-of-{}", self.index, self.count)
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-of-{}", self.index, self.count)
    }
}

/// The part area of output `out`: `OUT.parts` beside it.
pub fn part_area(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_os_string();
    name.push(AREA_SUFFIX);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
