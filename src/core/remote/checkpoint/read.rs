//! Reading checkpoints on object storage: verifying a step (its manifest, then every
//! object it lists, downloaded once and hashed as it arrives, checked by the local
//! rules; a sharded step's piece digests from the same bytes), and the choice `load` makes: the newest committed step that verifies (with
//! `step`, that one or the newest older one). `LATEST` is a hint on object storage: a
//! writer stopped between its commit and `LATEST` leaves a committed step newer than
//! `LATEST`, and the listing finds it.
//!
//! Invariants: the bytes a load returns are the bytes that were hashed, read once into
//! owned memory; a step whose objects vanish while it is read (a concurrent `keep` or
//! `gc`) makes the choice start over from a new listing, at most
//! [`MAX_RESTARTS`] times.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::choose::first_problem;
use super::{
    list, list_under, manifest_rel, object_rel, read_latest, HeaderCapture, Remote, RemoteListing,
    RemoteManifest, StepObjects,
};
use crate::checkpoint::content::{check_hashed, check_state};
use crate::checkpoint::load::{Survey, SurveyRow};
use crate::checkpoint::manifest::{ManifestEntry, MANIFEST_NAME};
use crate::checkpoint::sharded::open::is_sharded;
use crate::checkpoint::sharded::verify::FilePieces;
use crate::checkpoint::sharded::ShardedStep;
use crate::checkpoint::verify::{
    check_manifest_step, Inspection, Problem, MAX_JSON_BYTES, MAX_MANIFEST_BYTES,
};
use crate::checkpoint::{step_name, CheckpointError, Latest};
use crate::digest::hex;
use crate::s3::{S3Error, S3Url};

/// A piece mismatch found while a file streamed past, keyed (tensor, chunk, piece) for
/// table order.
type PieceProblem = ((usize, usize, u64), String);

/// One listed file checked: its findings, its sha256 when it is the config, its piece
/// problems, and a read that failed for a reason [`is_unreachable`].
type Checked = (
    Inspection,
    Option<String>,
    Vec<PieceProblem>,
    Option<S3Error>,
);

/// Which listed files' bytes an inspection keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The JSON files (the state and config are parsed), nothing else.
    Json,
    /// Every file (a load).
    All,
}

/// The manifest of `step`, or the problem that stops its verification.
fn fetch_manifest(remote: &Remote, step: u64, out: &mut Inspection) -> Option<RemoteManifest> {
    let mut failed = None;
    let got = fetch_manifest_or(remote, step, out, &mut failed);
    if let Some(e) = failed {
        out.problems.push(Problem::Unreadable {
            name: MANIFEST_NAME.to_string(),
            reason: crate::failure::full_text(&e),
        });
    }
    got
}

/// Whether a failed read of a step's object says nothing about the step: the server
/// could not be reached, refused or failed. Only a missing object (or one of another
/// size) is a finding about the step; for anything else a load stops rather than
/// fall back to an older step.
pub(crate) fn is_unreachable(err: &S3Error) -> bool {
    match err {
        S3Error::Request { source, .. } => source.kind() != io::ErrorKind::NotFound,
        S3Error::NotBuilt { .. } | S3Error::Config { .. } | S3Error::BadVariable { .. } => true,
        S3Error::BadUrl { .. } | S3Error::TooLarge { .. } => false,
    }
}

/// [`fetch_manifest`], except that a read that failed for a reason [`is_unreachable`]
/// is left in `failed` (no problem is recorded for it).
fn fetch_manifest_or(
    remote: &Remote,
    step: u64,
    out: &mut Inspection,
    failed: &mut Option<S3Error>,
) -> Option<RemoteManifest> {
    let got = remote
        .store
        .get_if_exists(&remote.key(&manifest_rel(step)), MAX_MANIFEST_BYTES);
    let bytes = match got {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => {
            out.problems.push(Problem::MissingManifest);
            return None;
        }
        Err(S3Error::TooLarge { limit, .. }) => {
            out.problems
                .push(Problem::BadManifest(format!("larger than {limit} bytes")));
            return None;
        }
        Err(e) if is_unreachable(&e) => {
            *failed = Some(e);
            return None;
        }
        Err(e) => {
            out.problems.push(Problem::Unreadable {
                name: MANIFEST_NAME.to_string(),
                reason: crate::failure::full_text(&e),
            });
            return None;
        }
    };
    out.size = out.size.saturating_add(bytes.len() as u64);
    match RemoteManifest::from_json(&bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            out.problems.push(Problem::BadManifest(e.to_string()));
            None
        }
    }
}

/// Verify committed step `step` of the listing: what a local verification checks, on
/// the objects of the attempt its manifest names (every byte downloaded once). A read
/// that failed for a reason [`is_unreachable`] is a problem of the step here.
pub fn inspect(remote: &Remote, step: u64, listing: &RemoteListing, keep: Keep) -> Inspection {
    match inspect_or(remote, step, listing, keep) {
        Ok(ins) => ins,
        Err(e) => {
            let mut out = Inspection::default();
            out.problems.push(Problem::Unreadable {
                name: step_name(step),
                reason: crate::failure::full_text(&e),
            });
            out
        }
    }
}

/// [`inspect`], except that a read that failed for a reason [`is_unreachable`] is the
/// error: it says nothing about the step.
pub fn inspect_or(
    remote: &Remote,
    step: u64,
    listing: &RemoteListing,
    keep: Keep,
) -> Result<Inspection, S3Error> {
    let empty = StepObjects::default();
    let objects = listing.steps.get(&step).unwrap_or(&empty);
    let mut out = Inspection::default();
    if objects.manifest.is_none() {
        out.problems.push(Problem::MissingManifest);
        return Ok(out);
    }
    let mut failed = None;
    let Some(rm) = fetch_manifest_or(remote, step, &mut out, &mut failed) else {
        return failed.map_or(Ok(out), Err);
    };
    let manifest = rm.manifest;
    check_manifest_step(Path::new(&step_name(step)), &manifest, &mut out);
    let no_objects = BTreeMap::new();
    let stored = objects.attempts.get(&rm.attempt).unwrap_or(&no_objects);
    let mut config_sha = None;
    // A sharded step opened first (its table against the objects' headers, by range
    // requests) has its pieces checked from the very bytes its files' sha256 is
    // computed from: each data object is downloaded once.
    let opened = (is_sharded(&manifest) && keep == Keep::Json)
        .then(|| super::sharded::open_one(remote, step, listing).ok())
        .flatten();
    let checked = check_objects(
        remote,
        step,
        &rm.attempt,
        &manifest.files,
        stored,
        keep,
        opened.as_ref(),
    );
    let mut piece_problems = Vec::new();
    for (local, sha, pieces, failed) in checked {
        if let Some(e) = failed {
            return Err(e);
        }
        out.problems.extend(local.problems);
        out.size = out.size.saturating_add(local.size);
        out.state = out.state.or(local.state);
        out.config = out.config.or(local.config);
        out.data.extend(local.data);
        config_sha = config_sha.or(sha);
        piece_problems.extend(pieces);
    }
    for name in stored.keys() {
        if manifest.get(name).is_none() {
            out.problems.push(Problem::Unlisted(name.clone()));
        }
    }
    check_state(&manifest, config_sha.as_deref(), &mut out);
    // As locally, the sharded checks speak only when every file verified.
    if out.problems.is_empty() && is_sharded(&manifest) {
        let found = if opened.is_some() {
            piece_problems.sort_by_key(|(key, _)| *key);
            piece_problems.into_iter().map(|(_, p)| p).collect()
        } else {
            super::sharded::check_step(remote, step, listing)
        };
        out.problems.extend(found.into_iter().map(Problem::Sharded));
    }
    out.manifest = Some(manifest);
    if !out.problems.is_empty() {
        out.state = None;
        out.config = None;
        out.data.clear();
    }
    Ok(out)
}

/// [`check_object`] of every listed file, each on a thread of its own; with `opened`
/// (the sharded step, opened), each data object's pieces are checked from its bytes
/// as they arrive.
fn check_objects(
    remote: &Remote,
    step: u64,
    attempt: &str,
    files: &[ManifestEntry],
    stored: &BTreeMap<String, crate::s3::ObjectInfo>,
    keep: Keep,
    opened: Option<&ShardedStep>,
) -> Vec<Checked> {
    std::thread::scope(|s| {
        let workers: Vec<_> = files
            .iter()
            .map(|entry| {
                let rel = object_rel(step, attempt, &entry.name);
                let size = stored.get(&entry.name).map(|i| i.size);
                s.spawn(move || {
                    let mut pieces = opened.and_then(|o| FilePieces::new(o, &entry.name));
                    let mut also = |chunk: &[u8]| {
                        if let Some(p) = pieces.as_mut() {
                            p.feed(chunk);
                        }
                    };
                    let (local, sha, failed) =
                        check_object(remote, &rel, entry, size, keep, &mut also);
                    (
                        local,
                        sha,
                        pieces.map(FilePieces::finish).unwrap_or_default(),
                        failed,
                    )
                })
            })
            .collect();
        workers
            .into_iter()
            .zip(files)
            .map(|(w, entry)| {
                w.join().unwrap_or_else(|_| {
                    let mut local = Inspection::default();
                    local.problems.push(Problem::Unreadable {
                        name: entry.name.clone(),
                        reason: "its check did not finish".to_string(),
                    });
                    (local, None, Vec::new(), None)
                })
            })
            .collect()
    })
}

/// What the listing already says is wrong with a listed file (absent, or another
/// size), before any byte is read.
fn listed_problem(entry: &ManifestEntry, size: Option<u64>) -> Option<Problem> {
    match size {
        None => Some(Problem::Missing(entry.name.clone())),
        Some(actual) if actual != entry.size => Some(Problem::Size {
            name: entry.name.clone(),
            expected: entry.size,
            actual,
        }),
        Some(_) => None,
    }
}

/// A failed download of a listed file as a verification problem.
fn read_problem(entry: &ManifestEntry, err: S3Error) -> Problem {
    match err {
        e if e.is_not_found() => Problem::Missing(entry.name.clone()),
        S3Error::TooLarge { size, .. } => Problem::Size {
            name: entry.name.clone(),
            expected: entry.size,
            actual: size,
        },
        e => Problem::Unreadable {
            name: entry.name.clone(),
            reason: crate::failure::full_text(&e),
        },
    }
}

/// One listed object (listed at `size`, `None` when the listing has no such object):
/// downloaded once, hashed and checked by the local rules; `also` sees every byte too
/// (a sharded step's piece checks).
fn check_object(
    remote: &Remote,
    rel: &str,
    entry: &ManifestEntry,
    size: Option<u64>,
    keep: Keep,
    also: &mut dyn FnMut(&[u8]),
) -> (Inspection, Option<String>, Option<S3Error>) {
    let mut out = Inspection::default();
    let name = &entry.name;
    if let Some(p) = listed_problem(entry, size) {
        out.problems.push(p);
        return (out, None, None);
    }
    let keeps = keep == Keep::All || (name.ends_with(".json") && entry.size <= MAX_JSON_BYTES);
    let mut hasher = Sha256::new();
    let mut header = name.ends_with(".safetensors").then(HeaderCapture::default);
    let mut count = 0u64;
    let mut seen = |chunk: &[u8]| {
        hasher.update(chunk);
        also(chunk);
        if let Some(h) = &mut header {
            h.see(chunk);
        }
        count = count.saturating_add(chunk.len() as u64);
    };
    let key = remote.key(rel);
    let read = if keeps {
        remote.store.read_object(&key, entry.size, &mut seen)
    } else {
        remote
            .store
            .download(&key, &mut io::sink(), &mut seen)
            .map(|_| Vec::new())
    };
    let kept = match read {
        Ok(k) => k,
        Err(e) if is_unreachable(&e) => return (out, None, Some(e)),
        Err(e) => {
            out.problems.push(read_problem(entry, e));
            return (out, None, None);
        }
    };
    out.size = count;
    if count != entry.size {
        out.problems.push(Problem::Size {
            name: name.clone(),
            expected: entry.size,
            actual: count,
        });
        return (out, None, None);
    }
    let actual = hex(&hasher.finalize());
    let mut config_sha = None;
    let captured = header.unwrap_or_default();
    let mut parse = |kept: &[u8]| {
        if keep == Keep::All {
            crate::safetensors::parse_header(kept)
        } else {
            captured.header(entry.size)
        }
    };
    check_hashed(
        entry,
        actual,
        kept,
        keep == Keep::All,
        &mut parse,
        &mut out,
        &mut config_sha,
    );
    (out, config_sha, None)
}

/// Whether committed step `step` looks whole without reading its data: its manifest
/// parses and names this step, and every object it lists is there at its size. What
/// `keep` counts steps by (reading every byte of `keep` steps at each save would cost
/// as many downloads); the step `load` picks is always verified in full.
pub fn sound(remote: &Remote, step: u64, listing: &RemoteListing) -> bool {
    let mut out = Inspection::default();
    let Some(rm) = fetch_manifest(remote, step, &mut out) else {
        return false;
    };
    check_manifest_step(Path::new(&step_name(step)), &rm.manifest, &mut out);
    let stored = listing
        .steps
        .get(&step)
        .and_then(|s| s.attempts.get(&rm.attempt));
    out.problems.is_empty()
        && rm.manifest.files.iter().all(|e| {
            stored
                .and_then(|objects| objects.get(&e.name))
                .is_some_and(|i| i.size == e.size)
        })
}

/// Every committed step of the prefix, verified, with `load`'s choice; `tmps` lists the
/// attempts no manifest names (`step-N/attempt-x`: in progress, lost or abandoned).
pub fn survey(root: &S3Url) -> Result<Survey, CheckpointError> {
    let remote = Remote::connect(root)?;
    let listing = list(&remote)?;
    let latest = read_latest(&remote)?.map_or(Latest::Missing, |(l, _)| l);
    let bound = latest.step();
    let mut named = BTreeMap::new();
    let mut rows: Vec<SurveyRow> = listing
        .committed()
        .into_iter()
        .map(|n| {
            let ins = inspect(&remote, n, &listing, Keep::Json);
            SurveyRow {
                step: n,
                problems: ins.problems,
                size: ins.size,
                latest: bound == Some(n),
                newer_than_latest: false,
                picked: false,
            }
        })
        .collect();
    for &n in &listing.committed() {
        if let Some(a) = super::gc::committed_attempt(&remote, n) {
            named.insert(n, a);
        }
    }
    let pick = rows
        .iter()
        .rev()
        .find(|r| r.problems.is_empty())
        .map(|r| r.step);
    for r in &mut rows {
        r.picked = Some(r.step) == pick;
    }
    let mut tmps = Vec::new();
    for (&n, objects) in &listing.steps {
        for attempt in objects.attempts.keys() {
            if named.get(&n) != Some(attempt) {
                tmps.push(format!("{}/{attempt}", step_name(n)));
            }
        }
    }
    Ok(Survey {
        latest,
        rows,
        pick,
        tmps,
        latest_tmp: false,
        foreign: listing.foreign.iter().map(|rel| remote.url(rel)).collect(),
    })
}

/// Verify the one step at `url` (`s3://bucket/P/step-N`).
pub fn inspect_step(url: &S3Url) -> Result<Inspection, CheckpointError> {
    let (remote, step) = step_remote(url)?;
    let listing = list_under(&remote, &step_name(step))?;
    Ok(inspect(&remote, step, &listing, Keep::Json))
}

/// Download the step at `url` (`s3://bucket/P/step-N`) into the new local directory
/// `dest` as a local step directory: every object its manifest lists (hashed as it
/// arrives, checked against the manifest) and the manifest in its local form. The
/// caller verifies `dest` by the local rules before using it.
pub fn download_step(url: &S3Url, dest: &Path) -> Result<(), CheckpointError> {
    let (remote, step) = step_remote(url)?;
    let mut out = Inspection::default();
    let Some(rm) = fetch_manifest(&remote, step, &mut out) else {
        let why = first_problem(&out).unwrap_or_else(|| "missing MANIFEST.json".into());
        return Err(CheckpointError::Request(format!("{url}: {why}")));
    };
    let io_at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    std::fs::create_dir(dest).map_err(io_at(dest))?;
    for entry in &rm.manifest.files {
        let path = dest.join(&entry.name);
        let mut file = std::fs::File::create(&path).map_err(io_at(&path))?;
        let mut hasher = Sha256::new();
        let rel = object_rel(step, &rm.attempt, &entry.name);
        let n = remote
            .store
            .download(&remote.key(&rel), &mut file, &mut |c| hasher.update(c))?;
        let actual = hex(&hasher.finalize());
        if n != entry.size || actual != entry.sha256 {
            return Err(CheckpointError::Request(format!(
                "{}: {n} bytes with sha256 {actual}; MANIFEST.json says {} bytes with sha256 {}",
                remote.url(&rel),
                entry.size,
                entry.sha256
            )));
        }
        file.sync_all().map_err(io_at(&path))?;
    }
    let path = dest.join(MANIFEST_NAME);
    std::fs::write(&path, rm.manifest.to_json()).map_err(io_at(&path))?;
    Ok(())
}

/// The prefix a step URL is in, connected, and its step.
pub(crate) fn step_remote(url: &S3Url) -> Result<(Remote, u64), CheckpointError> {
    let step = crate::checkpoint::parse_step_name(url.name()).ok_or_else(|| {
        CheckpointError::Request(format!(
            "{url} is not a step (its last segment is not a step name such as step-000050)"
        ))
    })?;
    let parent = url.key().rsplit_once('/').map_or("", |(parent, _)| parent);
    let root = S3Url::parse(&format!(
        "{}{}/{parent}",
        crate::s3::URL_SCHEME,
        url.bucket()
    ))?;
    Ok((Remote::connect(&root)?, step))
}
