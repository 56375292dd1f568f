//! The choice `load` makes on object storage: the newest committed step that
//! verifies, `LATEST` only a hint; with `step`, exactly that step or an error naming
//! why (missing, or the reason it failed verification), never another step.
//!
//! Invariants: a step whose objects vanish while it is read (a concurrent `keep` or
//! `gc`) makes the choice start over from a new listing, at most [`MAX_RESTARTS`]
//! times; a step that could not be read because the server could not be reached ends
//! the choice with that error (it says nothing about the step, so no older step is
//! loaded in its place).

use super::read::{inspect_or, Keep};
use super::{list, read_latest, Remote, RemoteListing};
use crate::checkpoint::load::{Loaded, Picked, Unsharded, MAX_RESTARTS};
use crate::checkpoint::verify::Inspection;
use crate::checkpoint::verify::Problem;
use crate::checkpoint::{step_name, CheckpointError, Latest};
use crate::s3::{S3Error, S3Url};

/// Which committed steps a choice tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// The newest that passes (`step=None`): a step that fails is passed over.
    Newest,
    /// Exactly this step (the caller named it): missing or failing, it is an error
    /// naming why, never answered with another step.
    Exactly(u64),
    /// The newest that passes among those older than this one: the next candidate of
    /// a `step=None` choice once this step was found damaged elsewhere (another rank
    /// of a collective load).
    Below(u64),
}

impl From<Option<u64>> for Wanted {
    fn from(step: Option<u64>) -> Self {
        step.map_or(Wanted::Newest, Wanted::Exactly)
    }
}

/// The candidates of a choice, newest first, and the reasons known before any is tried.
fn plan(
    listing: &RemoteListing,
    latest: Option<&Latest>,
    wanted: Wanted,
) -> (Vec<u64>, Vec<(String, String)>) {
    let committed = listing.committed();
    let mut before = Vec::new();
    match wanted {
        // The caller named the step: that one alone, or an error naming why (a
        // damaged or missing step N is never answered with an older one).
        Wanted::Exactly(n) if committed.contains(&n) => return (vec![n], before),
        Wanted::Exactly(n) => {
            before.push((step_name(n), "does not exist".to_string()));
            return (Vec::new(), before);
        }
        Wanted::Below(b) => {
            return (
                committed.into_iter().rev().filter(|&k| k < b).collect(),
                before,
            )
        }
        Wanted::Newest => {}
    }
    match latest {
        Some(Latest::Names(n)) if !committed.contains(n) => before.push((
            "LATEST".to_string(),
            format!("names {}, which does not exist", step_name(*n)),
        )),
        Some(Latest::Malformed(why)) => before.push(("LATEST".to_string(), why.clone())),
        _ => {}
    }
    (committed.into_iter().rev().collect(), before)
}

/// Why `load`'s check of one step refused it.
#[derive(Debug)]
pub enum Refusal {
    /// The step is broken (it failed verification): the choice goes on to the next.
    Broken(String),
    /// Its objects could not be read ([`is_unreachable`]): the choice stops with
    /// this error, since it says nothing about the step.
    Unreachable(S3Error),
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Refusal::Broken(why)
    }
}

/// `load`'s choice with `attempt` as the check of one step: the first candidate it
/// accepts, with what was refused before it; starts over (at most [`MAX_RESTARTS`]
/// times) when a candidate fails and the commits changed meanwhile. A candidate that
/// could not be read ([`Refusal::Unreachable`]) ends the choice with that error: an
/// older step is never loaded because the newest one could not be reached.
pub fn choose<T>(
    remote: &Remote,
    wanted: Wanted,
    attempt: &mut dyn FnMut(u64, &RemoteListing) -> Result<T, Refusal>,
) -> Result<(T, Picked), CheckpointError> {
    let mut listing = list(remote)?;
    let mut latest = read_latest(remote)?.map(|(l, _)| l);
    let mut restarts = 0usize;
    'again: loop {
        let (tried, mut reasons) = plan(&listing, latest.as_ref(), wanted);
        for n in tried {
            match attempt(n, &listing) {
                Ok(value) => {
                    let picked = Picked {
                        path: remote.path(&step_name(n)),
                        step: n,
                        skipped: reasons,
                    };
                    return Ok((value, picked));
                }
                Err(Refusal::Unreachable(e)) => return Err(e.into()),
                Err(Refusal::Broken(why)) => {
                    if restarts < MAX_RESTARTS {
                        let now = list(remote)?;
                        if now.commits() != listing.commits() {
                            restarts = restarts.saturating_add(1);
                            listing = now;
                            latest = read_latest(remote)?.map(|(l, _)| l);
                            continue 'again;
                        }
                    }
                    reasons.push((step_name(n), why));
                }
            }
        }
        return Err(CheckpointError::NotFound {
            dir: remote.path(""),
            reasons,
        });
    }
}

/// The first problem of an inspection, as `load` reports a refused step.
pub(super) fn first_problem(ins: &Inspection) -> Option<String> {
    ins.problems.first().map(Problem::to_string)
}

/// Load the step `load`'s rules pick from the prefix `root` (see the module
/// documentation); every listed object downloaded once into owned memory while hashed.
pub fn load(root: &S3Url, step: Option<u64>) -> Result<Loaded, CheckpointError> {
    let remote = Remote::connect(root)?;
    let (mut loaded, picked) = choose(&remote, step.into(), &mut |n, listing| {
        load_one(&remote, n, listing)
    })?;
    loaded.skipped = picked.skipped;
    Ok(loaded)
}

/// Committed step `n` verified and read whole, or the reason it was refused.
fn load_one(remote: &Remote, n: u64, listing: &RemoteListing) -> Result<Loaded, Refusal> {
    let ins = inspect_or(remote, n, listing, Keep::All).map_err(Refusal::Unreachable)?;
    if let Some(why) = first_problem(&ins) {
        return Err(Refusal::Broken(why));
    }
    match (ins.state, ins.manifest) {
        (Some(state), Some(manifest)) => Ok(Loaded {
            path: remote.path(&step_name(n)),
            step: n,
            state,
            config: ins.config,
            manifest,
            skipped: Vec::new(),
            files: ins.data,
        }),
        _ => Err(Refusal::Broken("incomplete".to_string())),
    }
}

/// [`load`], except that reaching a sharded step stops the choice before any of its
/// objects but the manifest is read (the sharded loader reads it by ranges, once).
pub fn load_unless_sharded(root: &S3Url, step: Option<u64>) -> Result<Unsharded, CheckpointError> {
    let remote = Remote::connect(root)?;
    let (found, picked) = choose(&remote, step.into(), &mut |n, listing| {
        if super::sharded::manifest_is_sharded(&remote, n) {
            return Ok(None);
        }
        load_one(&remote, n, listing).map(Some)
    })?;
    Ok(match found {
        Some(mut l) => {
            l.skipped = picked.skipped;
            Unsharded::Loaded(Box::new(l))
        }
        None => Unsharded::Sharded(picked),
    })
}

/// The step `load` would pick, verified by streaming (nothing kept in memory).
pub fn pick(root: &S3Url, step: Option<u64>) -> Result<Picked, CheckpointError> {
    let remote = Remote::connect(root)?;
    choose(&remote, step.into(), &mut |n, listing| {
        let ins = inspect_or(&remote, n, listing, Keep::Json).map_err(Refusal::Unreachable)?;
        match first_problem(&ins) {
            None => Ok(()),
            Some(why) => Err(Refusal::Broken(why)),
        }
    })
    .map(|(_, picked)| picked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::ObjectInfo;

    fn listing(steps: &[u64]) -> RemoteListing {
        let mut l = RemoteListing::default();
        for &n in steps {
            l.steps.entry(n).or_default().manifest = Some(ObjectInfo {
                key: format!("p/{}/MANIFEST.json", step_name(n)),
                size: 1,
                etag: None,
                last_modified: std::time::UNIX_EPOCH,
            });
        }
        l
    }

    #[test]
    fn a_named_step_is_the_only_candidate_and_a_missing_one_none() {
        let l = listing(&[3, 5, 7]);
        let exactly = |n| Wanted::from(Some(n));
        assert_eq!(plan(&l, None, exactly(5)), (vec![5], Vec::new()));
        // Never an older step in place of a named one.
        let (tried, before) = plan(&l, None, exactly(6));
        assert!(tried.is_empty());
        assert_eq!(
            before,
            [(step_name(6), "does not exist".to_string())].to_vec()
        );
        assert!(plan(&l, Some(&Latest::Names(7)), exactly(9)).0.is_empty());
        // Without a step: every committed one, newest first (the fallback).
        assert_eq!(
            plan(&l, Some(&Latest::Names(7)), Wanted::Newest).0,
            vec![7, 5, 3]
        );
        // Below a step another rank found damaged: the older ones, newest first.
        assert_eq!(plan(&l, None, Wanted::Below(7)), (vec![5, 3], Vec::new()));
        assert!(plan(&l, None, Wanted::Below(3)).0.is_empty());
    }
}
