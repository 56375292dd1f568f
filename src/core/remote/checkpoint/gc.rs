//! Garbage collection of a checkpoint prefix on object storage: attempts that no
//! manifest names (a writer that failed, lost the race or was killed, or the attempt a
//! replaced step used to name) once their newest object is older than the grace
//! period, and committed steps beyond the newest `keep` sound ones.
//!
//! Invariants: the step `load` would pick is found by verifying in full and is never
//! removed, nor any step newer than it; a step is removed manifest first, so it stops
//! existing in one request and a half-removed step is never a step; only keys of the
//! protocol's shapes are deleted; an attempt a manifest names is never removed alone.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::read::{inspect, sound, Keep};
use super::{list, manifest_rel, Remote, RemoteListing, RemoteManifest};
use crate::checkpoint::gc::{GcReason, GcReport, Removal};
use crate::checkpoint::verify::MAX_MANIFEST_BYTES;
use crate::checkpoint::{step_name, CheckpointError};
use crate::s3::{S3Error, S3Url};

/// Something `gc` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Doomed {
    /// A whole committed step (manifest first, then every attempt's objects).
    Step(u64),
    /// The objects of one attempt that no manifest names.
    Attempt(u64, String),
}

impl Doomed {
    /// The key below the prefix that names it (`step-N` or `step-N/attempt-x`).
    pub(crate) fn rel(&self) -> String {
        match self {
            Doomed::Step(n) => step_name(*n),
            Doomed::Attempt(n, a) => format!("{}/{a}", step_name(*n)),
        }
    }
}

/// The attempt the manifest of `step` names, when it can be read and parses.
pub(crate) fn committed_attempt(remote: &Remote, step: u64) -> Option<String> {
    let got = remote
        .store
        .get_if_exists(&remote.key(&manifest_rel(step)), MAX_MANIFEST_BYTES)
        .ok()??;
    RemoteManifest::from_json(&got.0).ok().map(|m| m.attempt)
}

/// The attempts no manifest names whose newest object is older than `grace` at `now`.
/// A committed step whose manifest cannot be read keeps all its attempts (which one
/// it names is unknown).
pub(crate) fn abandoned(
    remote: &Remote,
    listing: &RemoteListing,
    grace: Duration,
    now: SystemTime,
) -> Result<Vec<Doomed>, S3Error> {
    let mut out = Vec::new();
    for (&n, objects) in &listing.steps {
        if objects.attempts.is_empty() {
            continue;
        }
        let named = match &objects.manifest {
            None => None,
            Some(_) => match committed_attempt(remote, n) {
                Some(a) => Some(a),
                None => continue,
            },
        };
        for (attempt, files) in &objects.attempts {
            if named.as_ref() == Some(attempt) {
                continue;
            }
            let newest = files
                .values()
                .map(|i| i.last_modified)
                .max()
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let age = now.duration_since(newest).unwrap_or(Duration::ZERO);
            if age >= grace {
                out.push(Doomed::Attempt(n, attempt.clone()));
            }
        }
    }
    Ok(out)
}

/// Delete what `d` names, as the listing shows it.
pub(crate) fn remove(remote: &Remote, listing: &RemoteListing, d: &Doomed) -> Result<(), S3Error> {
    let Some(objects) = listing.steps.get(match d {
        Doomed::Step(n) | Doomed::Attempt(n, _) => n,
    }) else {
        return Ok(());
    };
    match d {
        Doomed::Step(n) => {
            // The manifest first: from that request on the step does not exist.
            remote.store.delete(&remote.key(&manifest_rel(*n)))?;
            for files in objects.attempts.values() {
                for info in files.values() {
                    remote.store.delete(&info.key)?;
                }
            }
        }
        Doomed::Attempt(_, attempt) => {
            for info in objects
                .attempts
                .get(attempt)
                .into_iter()
                .flat_map(|f| f.values())
            {
                remote.store.delete(&info.key)?;
            }
        }
    }
    Ok(())
}

/// Collect garbage under the prefix `root`: abandoned attempts older than `grace`, and
/// committed steps older than the newest `keep` (at least 1) sound ones, never the step
/// `load` would pick (verified in full) nor one newer than it. With `dry_run` nothing
/// is removed.
pub fn gc(
    root: &S3Url,
    keep: usize,
    dry_run: bool,
    grace: Duration,
) -> Result<GcReport, CheckpointError> {
    if keep == 0 {
        return Err(CheckpointError::Request(
            "keep must be at least 1 (gc never removes the checkpoint load would pick)".into(),
        ));
    }
    let remote = Remote::connect(root)?;
    let listing = list(&remote)?;
    let committed = listing.committed();
    // The pick: the newest committed step that verifies.
    let pick = committed.iter().rev().copied().find(|&n| {
        inspect(&remote, n, &listing, Keep::Json)
            .problems
            .is_empty()
    });
    let mut plan: Vec<(Doomed, GcReason)> = Vec::new();
    if let Some(p) = pick {
        let mut valid = 0usize;
        let mut cutoff = None;
        for &n in committed.iter().rev().filter(|&&n| n <= p) {
            if n == p || sound(&remote, n, &listing) {
                valid = valid.saturating_add(1);
                if valid >= keep {
                    cutoff = Some(n);
                    break;
                }
            }
        }
        if let Some(c) = cutoff {
            for &n in committed.iter().filter(|&&n| n < c) {
                plan.push((Doomed::Step(n), GcReason::BeyondKeep));
            }
        }
    }
    for d in abandoned(&remote, &listing, grace, SystemTime::now())? {
        let covered = matches!(&d, Doomed::Attempt(n, _)
            if plan.iter().any(|(p, _)| *p == Doomed::Step(*n)));
        if !covered {
            plan.push((d, GcReason::AbandonedAttempt));
        }
    }
    if !dry_run {
        for (d, _) in &plan {
            remove(&remote, &listing, d)?;
        }
    }
    Ok(GcReport {
        removed: plan
            .iter()
            .map(|(d, reason)| Removal {
                path: PathBuf::from(remote.url(&d.rel())),
                reason: *reason,
            })
            .collect(),
        kept_newer: Vec::new(),
        latest_problem: None,
    })
}
