//! What a run refuses before its first step: a spec out of range, a vocabulary that
//! does not fit, another run holding the directory, a config that disagrees with the
//! checkpoint it would resume; and the run's config bytes it builds to compare.
//!
//! Invariant: every check here runs before a step is computed or a file of the run is
//! replaced, so a refused run leaves `--out` as it found it (but for the lock file).

use std::fs::{File, TryLockError};
use std::path::Path;

use super::config::{DataId, RunConfig, CONFIG_FORMAT, CONFIG_VERSION};
use super::final_line::sha256_file;
use super::layout::LOCK_FILE;
use super::spec::{Method, RunSpec};
use super::{Field, TrainError};
use crate::checkpoint::{self, Loaded};
use crate::tokens::{self, Shard};

/// Holds `DIR/.train.lock` for the run's life so that two runs never share a
/// directory; released by the OS when the process ends, however it ends.
#[derive(Debug)]
pub(super) struct RunLock {
    _file: File,
}

impl RunLock {
    pub(super) fn acquire(out: &Path) -> Result<Self, TrainError> {
        let path = out.join(LOCK_FILE);
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        // Never follow a symlink or block on a FIFO planted at the lock's name, and
        // lock only a regular file.
        let file = checkpoint::fsops::open_lock_file(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {
                checkpoint::holder::record(&file);
                Ok(RunLock { _file: file })
            }
            Err(TryLockError::WouldBlock) => Err(TrainError::Locked {
                holder: checkpoint::holder::read(&file),
                path,
            }),
            Err(TryLockError::Error(source)) => Err(TrainError::Io { path, source }),
        }
    }
}

/// Refuse flags out of range before anything is created or allocated.
pub(super) fn check_spec(spec: &RunSpec) -> Result<(), TrainError> {
    let bad = |field, rule| Err(TrainError::BadField { field, rule });
    const AT_LEAST_1: &str = "must be at least 1";
    if spec.data.is_empty() {
        return bad(Field::Data, "needs at least one shard");
    }
    if spec.method == Method::Gradient {
        if spec.max_steps == 0 {
            return bad(Field::MaxSteps, AT_LEAST_1);
        }
        if spec.ckpt_every == 0 {
            return bad(Field::CkptEvery, AT_LEAST_1);
        }
        if spec.batch == 0 {
            return bad(Field::Batch, AT_LEAST_1);
        }
        if spec.seq_len == 0 {
            return bad(Field::SeqLen, AT_LEAST_1);
        }
        // Before anything is created or allocated: a huge --batch is one error line.
        tokens::check_batch_shape(spec.seq_len, spec.batch)?;
    }
    if spec.keep == Some(0) {
        return bad(Field::Keep, AT_LEAST_1);
    }
    spec.optim.validate()?;
    Ok(())
}

/// V from `--vocab-size` or the first shard that records one (the others are checked
/// against it when opened); refused when the state would not fit the memory limit.
pub(super) fn decide_vocab(spec: &RunSpec) -> Result<u32, TrainError> {
    let vocab = match spec.vocab_size {
        Some(v) => v,
        None => {
            let mut found = None;
            for path in &spec.data {
                if let Some(v) = tokens::read_shard_header(path)?.vocab {
                    found = Some(v);
                    break;
                }
            }
            found.ok_or(TrainError::NoVocab)?
        }
    };
    super::check_model_vocab(vocab)?;
    Ok(vocab)
}

/// The run's config.json bytes: its identity (see `config`).
pub(super) fn build_config(
    spec: &RunSpec,
    vocab: u32,
    shards: &[Shard],
) -> Result<Vec<u8>, TrainError> {
    let mut data = Vec::with_capacity(shards.len());
    for shard in shards {
        data.push(DataId {
            sha256: sha256_file(shard.path())?,
            tokens: shard.len() as u64,
        });
    }
    let gradient = spec.method == Method::Gradient;
    let config = RunConfig {
        format: CONFIG_FORMAT.to_string(),
        version: CONFIG_VERSION,
        model: "bigram".to_string(),
        method: spec.method.name().to_string(),
        vocab_size: vocab,
        data,
        batch: gradient.then_some(spec.batch as u64),
        seq_len: gradient.then_some(spec.seq_len as u64),
        seed: gradient.then_some(spec.seed),
        optimizer: gradient.then_some(spec.optim),
    };
    Ok(config.to_bytes())
}

/// Whether `ckpt` holds any checkpoint (a step directory or a `LATEST`).
pub(super) fn holds_checkpoints(ckpt: &Path) -> Result<bool, TrainError> {
    if !ckpt.exists() {
        return Ok(false);
    }
    let listing = checkpoint::list(ckpt)?;
    Ok(!listing.steps.is_empty() || listing.latest.is_some())
}

/// Refuse a config that disagrees with the checkpoint's, naming the field.
pub(super) fn check_resume_config(loaded: &Loaded, config: &[u8]) -> Result<(), TrainError> {
    let bad = |why: String| TrainError::BadCheckpoint {
        path: loaded.path.clone(),
        why,
    };
    let stored = loaded
        .config
        .as_deref()
        .ok_or_else(|| bad("it has no config.json: not a train bigram checkpoint".into()))?;
    let theirs = RunConfig::from_bytes(stored).map_err(|e| bad(format!("config.json: {e}")))?;
    let ours = RunConfig::from_bytes(config).map_err(|e| bad(format!("config: {e}")))?;
    if let Some(m) = theirs.first_mismatch(&ours) {
        return Err(TrainError::ConfigMismatch {
            field: m.field,
            shard: m.shard,
            checkpoint: m.checkpoint,
            given: m.given,
        });
    }
    if stored != config {
        return Err(bad(
            "config.json is not in this version's canonical form".into()
        ));
    }
    Ok(())
}
