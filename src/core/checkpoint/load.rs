//! Loading with the rules of checkpoint.md: `LATEST` first, then the newest older
//! directory that verifies; directories newer than `LATEST` were never declared done
//! and are ignored. `survey` applies the same rules to every directory for
//! `ckpt verify` and `gc`.
//!
//! Invariant: a loaded checkpoint verified completely, and its state and config are
//! the very bytes that were hashed.

use std::path::{Path, PathBuf};

use super::manifest::Manifest;
use super::optimizer::{model_params, OptimizerError, OptimizerFile};
use super::state::TrainerState;
use super::verify::{inspect, inspect_with, step_dir_bytes, Inspection, Problem};
use super::{list, step_name, CheckpointError, Latest, Listing};
use super::{MODEL_NAME, OPTIMIZER_NAME};
use crate::safetensors::{MappedFile, SafetensorsError};

/// A checkpoint that verified.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The step directory.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// `trainer_state.json`.
    pub state: TrainerState,
    /// `config.json`, when the checkpoint has one.
    pub config: Option<Vec<u8>>,
    /// The manifest (which files exist, their sizes and digests).
    pub manifest: Manifest,
    /// What `load` refused on the way to this checkpoint, newest first: a bad `LATEST`
    /// and each newer step that did not verify, with why (names exact, not escaped).
    pub skipped: Vec<(String, String)>,
}

impl Loaded {
    /// The path of a file of the checkpoint.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The model file, mapped (its bytes verified by `load` a moment ago).
    pub fn model(&self) -> Result<MappedFile, SafetensorsError> {
        MappedFile::open(&self.file(MODEL_NAME))
    }

    /// The optimizer file, validated against the model's parameters; `None` when the
    /// checkpoint has no optimizer state.
    pub fn optimizer(&self) -> Result<Option<OptimizerFile>, OptimizerError> {
        if self.manifest.get(OPTIMIZER_NAME).is_none() {
            return Ok(None);
        }
        let params = model_params(&self.file(MODEL_NAME))?;
        OptimizerFile::read(&self.file(OPTIMIZER_NAME), Some(&params)).map(Some)
    }
}

/// The checkpoint when the inspection found no problem, else the first problem.
fn loaded(path: PathBuf, step: u64, ins: Inspection) -> Result<Loaded, String> {
    let first = ins.problems.first().map(Problem::to_string);
    match (first, ins.state, ins.manifest) {
        (None, Some(state), Some(manifest)) => Ok(Loaded {
            path,
            step,
            state,
            config: ins.config,
            manifest,
            skipped: Vec::new(),
        }),
        (first, _, _) => Err(first.unwrap_or_else(|| "incomplete".to_string())),
    }
}

/// The steps `load` tries, newest first (those not newer than `LATEST`), and the ones
/// it ignores for being newer.
fn candidates(listing: &Listing) -> (Vec<u64>, Vec<u64>) {
    let bound = listing.latest().step();
    let mut tried = Vec::new();
    let mut newer = Vec::new();
    for &n in listing.steps.iter().rev() {
        match bound {
            Some(b) if n > b => newer.push(n),
            _ => tried.push(n),
        }
    }
    (tried, newer)
}

/// Load the checkpoint `load` rules pick from `dir`; with `step`, that step when it
/// verifies, else the newest older one that does (a caller resuming "at step N or
/// before" never gets a later step). `skipped` lists what was refused on the way.
pub fn load(dir: &Path, step: Option<u64>) -> Result<Loaded, CheckpointError> {
    if let Some(n) = step {
        return load_at_most(dir, n);
    }
    let listing = list(dir)?;
    let (tried, newer) = candidates(&listing);
    let mut reasons = Vec::new();
    match listing.latest() {
        Latest::Names(n) if !listing.steps.contains(&n) => reasons.push((
            "LATEST".to_string(),
            format!("names {}, which does not exist", step_name(n)),
        )),
        Latest::Malformed(why) => reasons.push(("LATEST".to_string(), why)),
        _ => {}
    }
    for n in tried {
        let path = dir.join(step_name(n));
        match loaded(path, n, inspect(&dir.join(step_name(n)))) {
            Ok(mut l) => {
                l.skipped = reasons;
                return Ok(l);
            }
            Err(why) => reasons.push((step_name(n), why)),
        }
    }
    for n in newer.into_iter().rev() {
        reasons.push((
            step_name(n),
            "newer than LATEST (never declared complete)".to_string(),
        ));
    }
    Err(CheckpointError::NotFound {
        dir: dir.to_path_buf(),
        reasons,
    })
}

/// `load(dir, Some(n))`: step `n`, or the newest older step that verifies. `LATEST`
/// plays no part: the caller named the step.
fn load_at_most(dir: &Path, n: u64) -> Result<Loaded, CheckpointError> {
    let listing = list(dir)?;
    let mut reasons = Vec::new();
    if !listing.steps.contains(&n) {
        reasons.push((step_name(n), "does not exist".to_string()));
    }
    for &k in listing.steps.iter().rev().filter(|&&k| k <= n) {
        let path = dir.join(step_name(k));
        match loaded(path.clone(), k, inspect(&path)) {
            Ok(mut l) => {
                l.skipped = reasons;
                return Ok(l);
            }
            Err(why) => reasons.push((step_name(k), why)),
        }
    }
    Err(CheckpointError::NotFound {
        dir: dir.to_path_buf(),
        reasons,
    })
}

/// One step directory as `ckpt verify` shows it.
#[derive(Debug, Clone)]
pub struct SurveyRow {
    /// The step.
    pub step: u64,
    /// Every problem (empty when it verifies).
    pub problems: Vec<Problem>,
    /// Bytes of its verified files.
    pub size: u64,
    /// Whether `LATEST` names it.
    pub latest: bool,
    /// Whether it is newer than `LATEST` (ignored by `load`).
    pub newer_than_latest: bool,
    /// Whether `load` would pick it.
    pub picked: bool,
}

/// Every step directory of a checkpoint directory, verified, with `load`'s choice.
#[derive(Debug, Clone)]
pub struct Survey {
    /// What `LATEST` says.
    pub latest: Latest,
    /// One row per step directory, ascending by step.
    pub rows: Vec<SurveyRow>,
    /// The step `load` would pick.
    pub pick: Option<u64>,
    /// Leftover `step-N.tmp` entries.
    pub tmps: Vec<String>,
    /// Whether a leftover `LATEST.tmp` exists.
    pub latest_tmp: bool,
}

impl SurveyRow {
    /// The row's one-word verdict: `ok`, or its first problem.
    pub fn status(&self) -> String {
        self.problems
            .first()
            .map_or_else(|| "ok".to_string(), Problem::to_string)
    }

    /// The verdict as the table shows it: a sound step newer than `LATEST` says that
    /// `load` ignores it.
    pub fn verdict(&self) -> String {
        if self.newer_than_latest && self.problems.is_empty() {
            "ok (newer than LATEST: ignored)".to_string()
        } else {
            self.status()
        }
    }
}

impl Survey {
    /// True when `LATEST` names a directory that verifies (and so `load` picks it).
    pub fn latest_is_valid(&self) -> bool {
        self.rows.iter().any(|r| r.latest && r.problems.is_empty())
    }

    /// The step name `LATEST` holds, if it holds one.
    pub fn latest_name(&self) -> Option<String> {
        match &self.latest {
            Latest::Names(n) => Some(step_name(*n)),
            Latest::Missing | Latest::Malformed(_) => None,
        }
    }

    /// What is wrong with `LATEST` itself: missing, malformed, or naming a step
    /// directory that does not exist; `None` when it names one that exists.
    pub fn latest_problem(&self) -> Option<String> {
        match &self.latest {
            Latest::Missing => Some("no LATEST".to_string()),
            Latest::Malformed(why) => Some(why.clone()),
            Latest::Names(n) if !self.rows.iter().any(|r| r.step == *n) => Some(format!(
                "LATEST names {}, which does not exist",
                step_name(*n)
            )),
            Latest::Names(_) => None,
        }
    }

    /// Leftover temporary entries (`step-N.tmp`, then `LATEST.tmp`), which the next save
    /// or gc removes.
    pub fn stale(&self) -> Vec<String> {
        let mut stale = self.tmps.clone();
        if self.latest_tmp {
            stale.push(super::LATEST_TMP_NAME.to_string());
        }
        stale
    }
}

/// Verify every step directory of `dir` and apply `load`'s rules.
pub fn survey(dir: &Path) -> Result<Survey, CheckpointError> {
    survey_with(dir, &mut |_| {}, &mut |_| {})
}

/// `survey`, telling `total` the bytes it is about to hash and `advance` each chunk.
pub fn survey_with(
    dir: &Path,
    total: &mut dyn FnMut(u64),
    advance: &mut dyn FnMut(u64),
) -> Result<Survey, CheckpointError> {
    let listing = list(dir)?;
    total(
        listing
            .steps
            .iter()
            .map(|&n| step_dir_bytes(&dir.join(step_name(n))))
            .fold(0u64, u64::saturating_add),
    );
    let latest = listing.latest();
    let bound = latest.step();
    let mut rows: Vec<SurveyRow> = listing
        .steps
        .iter()
        .map(|&n| {
            let ins = inspect_with(&dir.join(step_name(n)), advance);
            SurveyRow {
                step: n,
                problems: ins.problems,
                size: ins.size,
                latest: bound == Some(n),
                newer_than_latest: bound.is_some_and(|b| n > b),
                picked: false,
            }
        })
        .collect();
    let pick = rows
        .iter()
        .rev()
        .find(|r| !r.newer_than_latest && r.problems.is_empty())
        .map(|r| r.step);
    for r in &mut rows {
        r.picked = Some(r.step) == pick;
    }
    Ok(Survey {
        latest,
        rows,
        pick,
        tmps: listing.tmps,
        latest_tmp: listing.latest_tmp,
    })
}
