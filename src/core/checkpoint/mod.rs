//! Atomic, verified training checkpoints (checkpoint.md): `step-NNNNNN/` directories
//! with a manifest written last, a `LATEST` pointer replaced by rename, loading that
//! verifies every byte and falls back to the newest older directory that verifies.
//!
//! Invariants: at every instant each `step-N` directory is complete and `LATEST` names
//! one of them (the save protocol in `save`); every file-system effect of a save goes
//! through `fsops::FsOps`; nothing reads or deletes outside the checkpoint directory.

use std::fs::{self, File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use crate::failure::{Failure, FailureKind};

pub(crate) mod content;
pub mod fsops;
pub mod gc;
pub mod holder;
mod known;
pub mod load;
pub mod manifest;
pub mod optimizer;
pub mod save;
pub mod sharded;
pub mod state;
pub mod verify;

#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod powerloss;
#[cfg(test)]
mod tests;

pub use gc::{gc, GcReason, GcReport, Removal};
pub use load::{
    choose, load, load_unless_sharded, pick, survey, Loaded, Picked, Survey, SurveyRow,
    TensorBytes, Unsharded,
};
pub use manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
pub use optimizer::{OptimizerFile, OptimizerState};
pub use save::{save, save_waiting, save_with, save_with_wait, Payload, SaveReport, SaveRequest};
pub use state::{DataCursor, RngState, TrainerState};
pub use verify::{read_step, verify, Problem};

/// The pointer file naming the newest declared-complete step.
pub const LATEST_NAME: &str = "LATEST";
/// Where `LATEST` is written before its rename.
pub const LATEST_TMP_NAME: &str = "LATEST.tmp";
/// The advisory lock file writers hold.
pub const LOCK_NAME: &str = ".lock";
/// The model's file in a step directory.
pub const MODEL_NAME: &str = "model.safetensors";
/// The optimizer's file in a step directory.
pub const OPTIMIZER_NAME: &str = "optimizer.safetensors";
/// The trainer state's file in a step directory.
pub const STATE_NAME: &str = "trainer_state.json";
/// The run configuration's file in a step directory.
pub const CONFIG_NAME: &str = "config.json";
/// Suffix of a step directory still being written (or a crash's leftover).
pub const TMP_SUFFIX: &str = ".tmp";
/// Minimum digits of the step in a directory name.
pub const STEP_DIGITS: usize = 6;
/// Longest `LATEST` file read (a step name and a newline fit easily).
pub const MAX_LATEST_BYTES: u64 = 64;
/// How long a save waits for another save or gc to release the lock before failing.
/// A gc from cron must not kill a training run; a save stuck for longer than this is
/// more likely a hung process than a slow one.
pub const SAVE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// After how long a waiting save tells the user why it is waiting.
pub const SAVE_LOCK_NOTICE: std::time::Duration = std::time::Duration::from_secs(1);
/// How often a waiting save tries the lock again.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// How a refused save can be made anyway: the `SaveRequest` field to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveAnyway {
    /// `overwrite`: replace the step of the same number.
    Overwrite,
    /// `force`: save an older step and move LATEST back.
    Force,
}

impl std::fmt::Display for SaveAnyway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SaveAnyway::Overwrite => "overwrite to replace it",
            SaveAnyway::Force => "force to save anyway and move LATEST back",
        })
    }
}

/// Errors of the checkpoint protocol.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The trainer state breaks the schema.
    #[error("invalid trainer state")]
    State(#[from] state::StateError),
    /// The optimizer file or state breaks the format.
    #[error("invalid optimizer state: {0}")]
    Optimizer(String),
    /// The config is not valid JSON.
    #[error("invalid config: {0}")]
    Config(String),
    /// A file to be saved breaks a format rule.
    #[error("invalid {name}: {reason}")]
    Payload {
        /// The file's name in the step directory.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The request contradicts itself (state step differs from the step, bad keep).
    #[error("{0}")]
    Request(String),
    /// The step already exists as a complete checkpoint.
    #[error("{} already exists as a complete checkpoint (save with overwrite to replace it)", path.display())]
    Exists {
        /// The existing directory.
        path: PathBuf,
    },
    /// The save would not move LATEST forward.
    #[error("step {step} is not newer than {latest}, which LATEST names and which verifies; a save must move LATEST forward ({hint})", latest = step_name(*.latest))]
    NotNewer {
        /// The step asked for.
        step: u64,
        /// The step LATEST names.
        latest: u64,
        /// How to save anyway.
        hint: SaveAnyway,
    },
    /// Another writer holds the directory's lock.
    #[error("{} is locked by another tlio save or gc{holder}; try again when it has finished", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The process holding it, as the lock file records it.
        holder: holder::HeldBy,
    },
    /// A file-system operation failed.
    #[error("{}", path.display())]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Object storage failed (the error names the URL).
    #[error(transparent)]
    Remote(#[from] crate::s3::S3Error),
    /// Another writer committed the same step on object storage first: exactly one
    /// writer of a step commits, and this one did not.
    #[error("{url} was committed by another writer while this save was writing; this save committed nothing (its objects were removed)")]
    Lost {
        /// The step's URL.
        url: String,
    },
    /// No directory verifies.
    #[error("no loadable checkpoint in {}{}", dir.display(), why(reasons))]
    NotFound {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Each step directory considered and why it failed.
        reasons: Vec<(String, String)>,
    },
}

fn why(reasons: &[(String, String)]) -> String {
    if reasons.is_empty() {
        return ": no step directory".to_string();
    }
    let parts: Vec<String> = reasons
        .iter()
        .map(|(name, reason)| format!("{name}: {reason}"))
        .collect();
    format!(" ({})", parts.join("; "))
}

impl Failure for CheckpointError {
    fn kind(&self) -> FailureKind {
        match self {
            CheckpointError::State(_)
            | CheckpointError::Optimizer(_)
            | CheckpointError::Config(_)
            | CheckpointError::Payload { .. }
            | CheckpointError::Request(_)
            | CheckpointError::NotFound { .. }
            | CheckpointError::NotNewer { .. } => FailureKind::Invalid,
            CheckpointError::Remote(e) => e.kind(),
            CheckpointError::Exists { .. }
            | CheckpointError::Locked { .. }
            | CheckpointError::Lost { .. }
            | CheckpointError::Io { .. } => FailureKind::Operational,
        }
    }
}

/// Attach a path to an I/O error.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    // A FIFO (or file) where the checkpoint directory should be is named as what it
    // is, not left to the system's "Not a directory".
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source: crate::files::name_non_directory(path, source),
    }
}

/// `step-` and `n` in at least six digits: `step-000007`, `step-1234567`.
pub fn step_name(n: u64) -> String {
    format!("step-{n:0width$}", width = STEP_DIGITS)
}

/// The step of a canonical step-directory name (`step_name(n) == name`), else `None`.
/// `step-7`, `step-0000007` and `step-+00007` are not step names.
pub fn parse_step_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.len() < STEP_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    (step_name(n) == name).then_some(n)
}

/// What `LATEST` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Latest {
    /// There is no `LATEST`.
    Missing,
    /// `LATEST` exists but does not hold one step name and a newline.
    Malformed(String),
    /// `LATEST` names this step (whether or not its directory exists).
    Names(u64),
}

impl Latest {
    /// The step named, when `LATEST` is usable.
    pub fn step(&self) -> Option<u64> {
        match self {
            Latest::Names(n) => Some(*n),
            _ => None,
        }
    }
}

/// The entries of a checkpoint directory that the protocol knows about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Step directories (by canonical name), ascending by step.
    pub steps: Vec<u64>,
    /// Names of `step-N.tmp` entries.
    pub tmps: Vec<String>,
    /// Whether `LATEST.tmp` exists.
    pub latest_tmp: bool,
    /// What `LATEST` says.
    pub latest: Option<Latest>,
}

impl Listing {
    /// What `LATEST` says (`Missing` when absent).
    pub fn latest(&self) -> Latest {
        self.latest.clone().unwrap_or(Latest::Missing)
    }
}

/// Read `LATEST` (without following a symlink).
fn read_latest(path: &Path) -> Result<Option<Latest>, CheckpointError> {
    use std::io::Read;
    let file = match fsops::open_regular(path) {
        Ok(Ok(f)) => f,
        // A FIFO, directory, socket or device named LATEST was not written by a save:
        // malformed, so loading falls back (and never blocks on a FIFO).
        Ok(Err(kind)) => {
            return Ok(Some(Latest::Malformed(format!(
                "LATEST is a {kind}, not a regular file"
            ))))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Some(Latest::Malformed("LATEST is a symbolic link".into())))
        }
        Err(e) => return Err(io_at(path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_LATEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_at(path))?;
    Ok(Some(parse_latest(&bytes)))
}

/// What the bytes of a `LATEST` say (one step name and a newline), wherever they
/// were read from.
pub(crate) fn parse_latest(bytes: &[u8]) -> Latest {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => return Latest::Malformed("LATEST is not UTF-8".into()),
    };
    let name = text.strip_suffix('\n').unwrap_or(text);
    match parse_step_name(name) {
        Some(n) => Latest::Names(n),
        None => Latest::Malformed(format!(
            "LATEST holds {}, not a step name",
            crate::text::quote(text)
        )),
    }
}

/// List a checkpoint directory.
pub fn list(dir: &Path) -> Result<Listing, CheckpointError> {
    let mut listing = Listing::default();
    for entry in fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = parse_step_name(name) {
            listing.steps.push(n);
        } else if name
            .strip_suffix(TMP_SUFFIX)
            .and_then(parse_step_name)
            .is_some()
        {
            listing.tmps.push(name.to_string());
        } else if name == LATEST_TMP_NAME {
            listing.latest_tmp = true;
        }
    }
    listing.steps.sort_unstable();
    listing.tmps.sort();
    listing.latest = read_latest(&dir.join(LATEST_NAME))?;
    Ok(listing)
}

/// Check, without creating or locking anything, that `<dir>/.lock` is absent or a
/// regular file, so a run can refuse a bad lock before it computes anything.
pub fn check_lock_file(dir: &Path) -> Result<(), CheckpointError> {
    let path = dir.join(LOCK_NAME);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at(&path)(e)),
        Ok(meta) => match crate::files::irregular_kind(&meta.file_type()) {
            None => Ok(()),
            Some(_) if meta.file_type().is_symlink() => {
                Err(io_at(&path)(fsops::not_regular("symbolic link")))
            }
            Some(kind) => Err(io_at(&path)(fsops::not_regular(kind))),
        },
    }
}

/// The exclusive advisory lock writers hold on `<dir>/.lock`; released on drop.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Take the lock at once or fail with `Locked`; never waits.
    pub fn acquire(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(LOCK_NAME);
        // Never follow a symlink planted at `.lock`: creating its target would write
        // outside the directory.
        let file = fsops::open_lock_file(&path).map_err(io_at(&path))?;
        match file.try_lock() {
            Ok(()) => {
                holder::record(&file);
                Ok(DirLock { _file: file })
            }
            Err(TryLockError::WouldBlock) => Err(CheckpointError::Locked {
                holder: holder::read(&file),
                path,
            }),
            Err(TryLockError::Error(e)) => Err(io_at(&path)(e)),
        }
    }

    /// Take the lock, waiting up to `max` while another save or gc holds it; `on_wait`
    /// is called once, with the lock's path, when the wait has lasted `notice`.
    pub fn acquire_waiting(
        dir: &Path,
        max: std::time::Duration,
        notice: std::time::Duration,
        on_wait: &mut dyn FnMut(&Path),
    ) -> Result<Self, CheckpointError> {
        let start = std::time::Instant::now();
        let mut told = false;
        loop {
            match Self::acquire(dir) {
                Err(CheckpointError::Locked { path, holder }) => {
                    let waited = start.elapsed();
                    if waited >= max {
                        return Err(CheckpointError::Locked { path, holder });
                    }
                    if !told && waited >= notice {
                        told = true;
                        on_wait(&path);
                    }
                    std::thread::sleep(LOCK_POLL.min(max.saturating_sub(waited)));
                }
                other => return other,
            }
        }
    }
}
