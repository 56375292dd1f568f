//! Loading with the rules of checkpoint.md: `LATEST` first, then the newest older
//! directory that verifies; directories newer than `LATEST` were never declared done
//! and are ignored. `survey` applies the same rules to every directory for
//! `ckpt verify` and `gc`.
//!
//! Invariants: a loaded checkpoint verified completely, and everything it holds (the
//! state, the config, every file's bytes) is the very bytes that were hashed, read
//! once from descriptors opened before any was read, into owned memory: nothing is
//! read by path afterwards, so a save that deletes or replaces the step meanwhile
//! changes nothing loaded. A step that disappears while it is being read (a
//! concurrent save's `keep`) makes the choice start over from the directory as it is
//! now, never fail while a verified step exists.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::manifest::Manifest;
use super::optimizer::{check_header, OptimizerError, OptimizerFile, OptimizerState};
use super::state::TrainerState;
use super::verify::{
    inspect, inspect_with, manifest_is_sharded, read_step, step_dir_bytes, Inspection, Problem,
};
use super::{list, step_name, CheckpointError, Latest, Listing};
use super::{MODEL_NAME, OPTIMIZER_NAME};
use crate::safetensors::float::decode_f32;
use crate::safetensors::{parse_header, Header, SafetensorsError, TensorInfo};

/// How many times one `load` starts its choice over because the directory changed
/// under it (a step it was reading was removed or replaced by a concurrent save).
/// Opening a step's files takes microseconds, so losing that race this many times in a
/// row means a directory rewritten continuously; the load then reports what it saw.
pub const MAX_RESTARTS: usize = 16;

/// A checkpoint that verified, with the bytes of its files.
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
    /// The verified bytes of every listed file except the JSON ones (`state` and
    /// `config` hold those), by name: owned memory, read once while being hashed.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// A safetensors file held in memory: its validated header and its bytes.
#[derive(Debug)]
pub struct TensorBytes<'a> {
    header: Header,
    bytes: &'a [u8],
}

impl<'a> TensorBytes<'a> {
    /// Validate the header of a whole file held in `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, SafetensorsError> {
        Ok(TensorBytes {
            header: parse_header(bytes)?,
            bytes,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The bytes of a tensor of the header (inside the file: the header was validated
    /// against exactly these bytes).
    pub fn info_bytes(&self, info: &TensorInfo) -> Option<&'a [u8]> {
        self.bytes.get(self.range(info)?)
    }

    /// Where a tensor of the header lies in the file's bytes; `None` outside them.
    pub fn range(&self, info: &TensorInfo) -> Option<Range<usize>> {
        let start = self.header.data_start().checked_add(info.data_offsets.0)?;
        let end = self.header.data_start().checked_add(info.data_offsets.1)?;
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        (range.start <= range.end && range.end <= self.bytes.len()).then_some(range)
    }

    /// Decode tensor `name` to f32 values (as `MappedFile::decode_f32`).
    pub fn decode_f32(&self, name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let missing = || SafetensorsError::NoSuchTensor {
            tensor: name.to_string(),
        };
        let info = self.header.get(name).ok_or_else(missing)?;
        let bytes = self.info_bytes(info).ok_or_else(missing)?;
        let mut out = Vec::new();
        if !decode_f32(info.dtype, bytes, &mut out) {
            return Err(SafetensorsError::CannotDecode {
                tensor: name.to_string(),
                dtype: info.dtype,
            });
        }
        Ok(out)
    }
}

impl Loaded {
    /// The path of a file of the checkpoint.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The verified bytes of a listed (non-JSON) file.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(Vec::as_slice)
    }

    /// The model file, from the bytes `load` verified.
    pub fn model(&self) -> Result<TensorBytes<'_>, SafetensorsError> {
        TensorBytes::parse(self.bytes(MODEL_NAME).unwrap_or_default())
    }

    /// The optimizer file, validated against the model's parameters; `None` when the
    /// checkpoint has no optimizer state.
    pub fn optimizer(&self) -> Result<Option<OptimizerFile>, OptimizerError> {
        let Some((state, file)) = self.optimizer_bytes()? else {
            return Ok(None);
        };
        let mut tensors = BTreeMap::new();
        for t in file.header().tensors() {
            tensors.insert(t.name.clone(), (t.shape.clone(), file.decode_f32(&t.name)?));
        }
        Ok(Some(OptimizerFile { state, tensors }))
    }

    /// The optimizer file's state and validated header (checked against the model's
    /// parameters, as [`Loaded::optimizer`] checks it) over its bytes, nothing decoded:
    /// for a caller that views the tensors where they lie. `None`: no optimizer state.
    pub fn optimizer_bytes(
        &self,
    ) -> Result<Option<(OptimizerState, TensorBytes<'_>)>, OptimizerError> {
        let Some(bytes) = self.bytes(OPTIMIZER_NAME) else {
            return Ok(None);
        };
        let params: BTreeMap<String, Vec<u64>> = self
            .model()?
            .header()
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        let file = TensorBytes::parse(bytes)?;
        let state = check_header(file.header(), Some(&params))?;
        Ok(Some((state, file)))
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
            files: ins.data,
        }),
        (first, _, _) => Err(first.unwrap_or_else(|| "incomplete".to_string())),
    }
}

/// The step `load`'s rules chose, without the bytes of its files (`pick`).
#[derive(Debug, Clone)]
pub struct Picked {
    /// The step directory.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// What was refused on the way, as [`Loaded::skipped`].
    pub skipped: Vec<(String, String)>,
}

/// The steps tried, newest first, with the reasons known before any is tried (a bad
/// `LATEST`, a missing asked-for step) and those reported after them (steps newer than
/// `LATEST`, never tried).
struct Plan {
    tried: Vec<u64>,
    before: Vec<(String, String)>,
    after: Vec<(String, String)>,
}

/// `load`'s candidates: with `step`, that step alone (`LATEST` plays no part and no
/// other step is tried: the caller named the step, a damaged or missing one is an error
/// naming why); else those not newer than `LATEST`, newest first.
fn plan(listing: &Listing, step: Option<u64>) -> Plan {
    let mut out = Plan {
        tried: Vec::new(),
        before: Vec::new(),
        after: Vec::new(),
    };
    if let Some(n) = step {
        if listing.steps.contains(&n) {
            out.tried.push(n);
        } else {
            out.before
                .push((step_name(n), "does not exist".to_string()));
        }
        return out;
    }
    match listing.latest() {
        Latest::Names(n) if !listing.steps.contains(&n) => out.before.push((
            "LATEST".to_string(),
            format!("names {}, which does not exist", step_name(n)),
        )),
        Latest::Malformed(why) => out.before.push(("LATEST".to_string(), why)),
        _ => {}
    }
    let bound = listing.latest().step();
    for &n in listing.steps.iter().rev() {
        match bound {
            Some(b) if n > b => out.after.push((
                step_name(n),
                "newer than LATEST (never declared complete)".to_string(),
            )),
            _ => out.tried.push(n),
        }
    }
    out.after.reverse();
    out
}

/// Apply `load`'s rules with `attempt` as the check of one step directory: the first
/// candidate it accepts, with what was refused before it. When a candidate fails and
/// the directory's steps or `LATEST` changed meanwhile, the choice starts over from the
/// new listing (at most [`MAX_RESTARTS`] times): a step removed by a concurrent save is
/// not a broken step, and a newer one may have been declared.
pub fn choose<T>(
    dir: &Path,
    step: Option<u64>,
    attempt: &mut dyn FnMut(&Path, u64) -> Result<T, String>,
) -> Result<(T, Picked), CheckpointError> {
    let mut listing = list(dir)?;
    let mut restarts = 0usize;
    'again: loop {
        let Plan {
            tried,
            before: mut reasons,
            after,
        } = plan(&listing, step);
        for n in tried {
            let path = dir.join(step_name(n));
            match attempt(&path, n) {
                Ok(value) => {
                    return Ok((
                        value,
                        Picked {
                            path,
                            step: n,
                            skipped: reasons,
                        },
                    ))
                }
                Err(why) => {
                    if restarts < MAX_RESTARTS {
                        let now = list(dir)?;
                        if now.steps != listing.steps || now.latest != listing.latest {
                            restarts = restarts.saturating_add(1);
                            listing = now;
                            continue 'again;
                        }
                    }
                    reasons.push((step_name(n), why));
                }
            }
        }
        reasons.extend(after);
        return Err(CheckpointError::NotFound {
            dir: dir.to_path_buf(),
            reasons,
        });
    }
}

/// Load the checkpoint `load` rules pick from `dir`; with `step`, exactly that step,
/// and [`CheckpointError::NotFound`] naming why when it is missing or does not verify
/// (never another step: the fallback is for `step` None). `skipped` lists what was
/// refused on the way.
/// Every listed file is read once, into owned memory, while it is hashed
/// ([`read_step`]); [`Loaded::files`] holds the bytes.
pub fn load(dir: &Path, step: Option<u64>) -> Result<Loaded, CheckpointError> {
    let (mut loaded, picked) = choose(dir, step, &mut |path, n| {
        loaded(path.to_path_buf(), n, read_step(path))
    })?;
    loaded.skipped = picked.skipped;
    Ok(loaded)
}

/// What [`load_unless_sharded`] found.
#[derive(Debug)]
pub enum Unsharded {
    /// An unsharded step, verified and read, as [`load`] returns it.
    Loaded(Box<Loaded>),
    /// The first candidate `load`'s rules reached is a sharded step: nothing of it was
    /// read but its manifest; the caller's sharded loader applies the same rules (and
    /// verifies) from the start.
    Sharded(Picked),
}

/// [`load`], except that reaching a sharded step stops the choice before any of its
/// files is read: a loader that reads sharded steps in its own way then never reads
/// one twice. Candidates before it were refused as in `load` (`Picked::skipped`).
pub fn load_unless_sharded(dir: &Path, step: Option<u64>) -> Result<Unsharded, CheckpointError> {
    let (found, picked) = choose(dir, step, &mut |path, n| {
        if manifest_is_sharded(path) {
            return Ok(None);
        }
        loaded(path.to_path_buf(), n, read_step(path)).map(Some)
    })?;
    Ok(match found {
        Some(mut l) => {
            l.skipped = picked.skipped;
            Unsharded::Loaded(Box::new(l))
        }
        None => Unsharded::Sharded(picked),
    })
}

/// The step `load` would pick, verified by streaming (nothing kept in memory): for
/// `ckpt latest`, which prints the path and reads nothing else.
pub fn pick(dir: &Path, step: Option<u64>) -> Result<Picked, CheckpointError> {
    choose(dir, step, &mut |path, n| {
        loaded(path.to_path_buf(), n, inspect(path)).map(|_| ())
    })
    .map(|(_, picked)| picked)
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
    /// Names below the directory that no protocol owns and the storage cannot even
    /// address one by one (on object storage: keys with an empty segment, `.` or
    /// `..`, such as `run//notes.txt`), as URLs: ignored by every operation, named by
    /// `verify`. Always empty for a local directory.
    pub foreign: Vec<String>,
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
        foreign: Vec::new(),
    })
}
