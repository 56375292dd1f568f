//! Garbage collection of a checkpoint directory: stale `step-N.tmp` entries and
//! `LATEST.tmp`, directories newer than `LATEST`, and complete steps beyond the newest
//! `keep` valid ones.
//!
//! Invariants: never removes the directory `LATEST` names nor the one `load` would
//! pick; holds the same lock as a save, so it never runs during one; only entries
//! whose names the protocol owns are ever touched.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::fsops::{FsOps, RealFs};
use super::known;
use super::verify::inspect;
use super::{io_at, list, step_name, CheckpointError, DirLock, Latest, Listing, LATEST_TMP_NAME};

/// Why `gc` removes an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcReason {
    /// A `step-N.tmp` left by an interrupted save.
    StaleTmp,
    /// A `LATEST.tmp` left by an interrupted save.
    StaleLatestTmp,
    /// A step directory newer than `LATEST`: never declared done.
    NewerThanLatest,
    /// A step older than the newest `keep` valid ones.
    BeyondKeep,
    /// On object storage: an attempt no manifest names, older than the grace period
    /// (the object-storage form of a stale `.tmp` directory).
    AbandonedAttempt,
}

impl GcReason {
    /// A short description for tables and JSON.
    pub fn describe(self) -> &'static str {
        match self {
            GcReason::StaleTmp => "stale temporary directory",
            GcReason::StaleLatestTmp => "stale LATEST.tmp",
            GcReason::NewerThanLatest => "newer than LATEST",
            GcReason::BeyondKeep => "beyond keep",
            GcReason::AbandonedAttempt => "abandoned attempt",
        }
    }
}

/// One entry `gc` removed (or would remove, dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The entry's path.
    pub path: PathBuf,
    /// Why.
    pub reason: GcReason,
}

/// What `gc` did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// The entries removed, in order; with `dry_run`, the ones that would be.
    pub removed: Vec<Removal>,
    /// Steps newer than the newest verifying one that were kept because `LATEST` does
    /// not name a verifying step (so nothing says they were never completed).
    pub kept_newer: Vec<u64>,
    /// Why `kept_newer` was kept: what is wrong with `LATEST`.
    pub latest_problem: Option<String>,
}

/// Remove whatever sits at `path`: a directory tree (symlinks inside are unlinked,
/// never followed) or a single file or symlink.
pub(crate) fn remove_entry(fs_ops: &mut dyn FsOps, path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_dir() {
        fs_ops.remove_dir_all(path)
    } else {
        fs_ops.remove_file(path)
    }
}

/// The steps beyond the newest `keep` valid ones among those not newer than `LATEST`.
/// `known_valid` is a step just written and known to verify (not read again); an older
/// step this process verified before and that has not changed since is not read again
/// either (`known`).
pub(crate) fn plan_keep(
    dir: &Path,
    listing: &Listing,
    keep: usize,
    known_valid: Option<u64>,
) -> Vec<u64> {
    let bound = listing.latest().step();
    let considered: Vec<u64> = listing
        .steps
        .iter()
        .rev()
        .copied()
        .filter(|&n| bound.is_none_or(|b| n <= b))
        .collect();
    let mut valid = 0usize;
    let mut cutoff = None;
    for &n in &considered {
        let ok = known_valid == Some(n) || known::verifies(&dir.join(step_name(n)));
        if ok {
            valid = valid.saturating_add(1);
            if valid >= keep {
                cutoff = Some(n);
                break;
            }
        }
    }
    match cutoff {
        Some(c) => considered.into_iter().filter(|&n| n < c).rev().collect(),
        None => Vec::new(),
    }
}

/// Collect garbage in `dir`, keeping the newest `keep` (at least 1) valid steps.
pub fn gc(dir: &Path, keep: usize, dry_run: bool) -> Result<GcReport, CheckpointError> {
    gc_with(&mut RealFs, dir, keep, dry_run)
}

/// `gc` through the file-system seam.
pub fn gc_with(
    fs_ops: &mut dyn FsOps,
    dir: &Path,
    keep: usize,
    dry_run: bool,
) -> Result<GcReport, CheckpointError> {
    if keep == 0 {
        return Err(CheckpointError::Request(
            "keep must be at least 1 (gc never removes the checkpoint load would pick)".into(),
        ));
    }
    fs::metadata(dir).map_err(io_at(dir))?;
    // A dry run changes nothing, so it takes no lock: it must work on a read-only
    // mount and must not create `.lock`. A real gc fails at once when a save holds
    // the lock (a save waits instead; gc is the one that can run later).
    let _lock = if dry_run {
        None
    } else {
        Some(DirLock::acquire(dir)?)
    };
    let listing = list(dir)?;
    let mut plan: Vec<Removal> = Vec::new();
    for t in &listing.tmps {
        plan.push(Removal {
            path: dir.join(t),
            reason: GcReason::StaleTmp,
        });
    }
    if listing.latest_tmp {
        plan.push(Removal {
            path: dir.join(LATEST_TMP_NAME),
            reason: GcReason::StaleLatestTmp,
        });
    }
    let newer = newer_than_latest(dir, &listing);
    plan.extend(newer.removals);
    for n in plan_keep(dir, &listing, keep, None) {
        plan.push(Removal {
            path: dir.join(step_name(n)),
            reason: GcReason::BeyondKeep,
        });
    }
    if !dry_run {
        for r in &plan {
            remove_entry(fs_ops, &r.path).map_err(io_at(&r.path))?;
        }
    }
    Ok(GcReport {
        removed: plan,
        kept_newer: newer.kept,
        latest_problem: newer.latest_problem,
    })
}

/// What to do with the steps newer than `LATEST`.
struct Newer {
    /// Their removals, when `LATEST` names a verifying step.
    removals: Vec<Removal>,
    /// Steps newer than the newest verifying one, kept because `LATEST` proves nothing.
    kept: Vec<u64>,
    /// Why they were kept.
    latest_problem: Option<String>,
}

/// "Newer than LATEST" means "never declared complete" only when LATEST itself names a
/// checkpoint that verifies; a missing, dangling, malformed or corrupt LATEST proves
/// nothing about newer steps, so none newer than the newest verifying step is removed.
fn newer_than_latest(dir: &Path, listing: &Listing) -> Newer {
    let mut newer = Newer {
        removals: Vec::new(),
        kept: Vec::new(),
        latest_problem: None,
    };
    let latest_check = match listing.latest() {
        Latest::Names(b) => match inspect(&dir.join(step_name(b))).problems.first() {
            None => Ok(b),
            Some(p) => Err(format!(
                "LATEST names {}, which does not verify: {p}",
                step_name(b)
            )),
        },
        Latest::Missing => Err("there is no LATEST".to_string()),
        Latest::Malformed(why) => Err(format!("LATEST is malformed: {why}")),
    };
    match latest_check {
        Ok(b) => {
            for &n in listing.steps.iter().filter(|&&n| n > b) {
                newer.removals.push(Removal {
                    path: dir.join(step_name(n)),
                    reason: GcReason::NewerThanLatest,
                });
            }
        }
        Err(why) => {
            let newest_valid = listing
                .steps
                .iter()
                .rev()
                .copied()
                .find(|&n| inspect(&dir.join(step_name(n))).problems.is_empty());
            newer.kept = listing
                .steps
                .iter()
                .copied()
                .filter(|&n| newest_valid.is_none_or(|v| n > v))
                .collect();
            if !newer.kept.is_empty() {
                newer.latest_problem = Some(why);
            }
        }
    }
    newer
}
