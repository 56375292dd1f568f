//! Saving a step on object storage, where nothing can be renamed:
//! 1. every check a local save makes, before the first request that writes;
//! 2. the refusals (a committed step that verifies, without `overwrite`; a step older
//!    than a committed one that verifies), from one listing;
//! 3. each file uploaded under `step-N/attempt-<fresh>/` (in parts when large), hashed
//!    and its safetensors header checked as it goes;
//! 4. the commit: the attempt checked whole (listed, every object at its size), then
//!    `step-N/MANIFEST.json` created with `If-None-Match: *` (or, to replace a step,
//!    `If-Match` on the manifest seen in 2), sent once; an error or a refusal is
//!    settled by reading the manifest back: one naming this attempt is this commit (its
//!    reply was lost); only a writer whose manifest names another attempt has lost the
//!    race, removes its attempt and fails with [`CheckpointError::Lost`];
//! 5. `LATEST` moved forward with `If-Match` on the tag it read (re-read and retried
//!    when another writer moved it meanwhile; never moved back);
//! 6. cleanup: steps beyond `keep` and attempts no manifest names older than the
//!    grace period.
//!
//! Invariants: nothing a load could pick exists before 4, and 4 is one request, so a
//! writer stopped at any instant leaves either no new step or a complete one; after 4
//! the save has succeeded, and what 5 and 6 cannot do is reported, never raised.

use std::borrow::Cow;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::read::{inspect, sound, Keep};
use super::{
    list, manifest_rel, new_attempt, object_rel, read_latest, HeaderCapture, Remote, RemoteListing,
    RemoteManifest, Tee,
};
use crate::checkpoint::manifest::{Manifest, ManifestEntry};
use crate::checkpoint::optimizer::check_any_header;
use crate::checkpoint::save::{validate, Payload, SaveReport, SaveRequest};
use crate::checkpoint::verify::MAX_MANIFEST_BYTES;
use crate::checkpoint::{
    parse_latest, step_name, CheckpointError, Latest, SaveAnyway, CONFIG_NAME, LATEST_NAME,
    MODEL_NAME, OPTIMIZER_NAME, STATE_NAME,
};
use crate::digest::hex;
use crate::remote::create::{put_once, Outcome};
use crate::s3::{S3Error, S3Url};
use crate::safetensors::Header;

/// Read buffer when a payload is a copy of a local file.
const COPY_BUFFER_BYTES: usize = 4 << 20;
/// How many times a save re-reads `LATEST` after another writer moved it between the
/// read and the conditional replace.
const LATEST_TRIES: usize = 8;

/// Save `req` as a step of the checkpoint prefix `root`; attempts no manifest names
/// are removed by the cleanup once older than `grace`.
pub fn save(
    root: &S3Url,
    mut req: SaveRequest<'_>,
    grace: Duration,
) -> Result<SaveReport, CheckpointError> {
    if req.force {
        return Err(CheckpointError::Request(
            "force is not available on object storage: LATEST never moves back there, and \
             load picks the newest committed step whatever LATEST says"
                .into(),
        ));
    }
    let state_bytes = validate(&mut req)?;
    let remote = Remote::connect(root)?;
    let listing = list(&remote)?;
    let replace = refusals(&remote, &listing, req.step, req.overwrite)?;
    let attempt = new_attempt();
    let uploaded = upload(
        &remote,
        req.step,
        &attempt,
        req.model,
        req.optimizer,
        state_bytes,
        req.config,
    );
    let files = match uploaded.and_then(|files| {
        Manifest::new(req.step, files).map_err(|e| CheckpointError::Request(e.to_string()))
    }) {
        Ok(m) => m,
        Err(e) => {
            // Best effort: the error that stopped the save matters more, and gc
            // removes what is left once the grace period is over.
            let _ = remove_attempt(&remote, req.step, &attempt);
            return Err(e);
        }
    };
    let manifest = RemoteManifest {
        attempt: attempt.clone(),
        manifest: files,
    };
    commit(&remote, req.step, &manifest, replace.as_deref())?;
    Ok(after_commit(&remote, manifest, req.keep, grace))
}

/// Steps 5 and 6, once `manifest` is committed: what they cannot do is reported in
/// the save's report, never raised (the save has succeeded).
pub(crate) fn after_commit(
    remote: &Remote,
    manifest: RemoteManifest,
    keep: Option<usize>,
    grace: Duration,
) -> SaveReport {
    let step = manifest.manifest.step;
    let mut problems = Vec::new();
    if let Err(e) = advance_latest(remote, step) {
        problems.push(format!(
            "cannot move {} to {}: {} (load finds the step by listing)",
            remote.url(LATEST_NAME),
            step_name(step),
            crate::failure::full_text(&e)
        ));
    }
    let removed = cleanup(remote, step, keep, grace, &mut problems);
    SaveReport {
        path: remote.path(&step_name(step)),
        step,
        files: manifest.manifest.files,
        removed,
        cleanup_problems: problems,
    }
}

/// The refusals of a save, from one listing; returns the entity tag of the manifest
/// the commit replaces (`None`: the step is new).
pub(crate) fn refusals(
    remote: &Remote,
    listing: &RemoteListing,
    step: u64,
    overwrite: bool,
) -> Result<Option<String>, CheckpointError> {
    let committed = listing.committed();
    for &newer in committed.iter().rev().filter(|&&k| k > step) {
        if inspect(remote, newer, listing, Keep::Json)
            .problems
            .is_empty()
        {
            return Err(CheckpointError::Request(format!(
                "step {step} is older than {}, which is committed in {} and verifies; on \
                 object storage a save never goes back (load picks the newest committed step)",
                step_name(newer),
                remote.root
            )));
        }
    }
    let Some(existing) = listing.steps.get(&step).and_then(|s| s.manifest.as_ref()) else {
        return Ok(None);
    };
    // Only a step load could pick is protected: a broken one holds nothing to keep.
    if !overwrite
        && inspect(remote, step, listing, Keep::Json)
            .problems
            .is_empty()
    {
        // In the words of a local save when LATEST names it (the usual case).
        let named = matches!(read_latest(remote)?, Some((Latest::Names(n), _)) if n == step);
        return Err(if named {
            CheckpointError::NotNewer {
                step,
                latest: step,
                hint: SaveAnyway::Overwrite,
            }
        } else {
            CheckpointError::Exists {
                path: remote.path(&step_name(step)),
            }
        });
    }
    match &existing.etag {
        Some(tag) => Ok(Some(tag.clone())),
        None => Err(CheckpointError::Remote(S3Error::request(
            remote.url(&manifest_rel(step)),
            io::ErrorKind::Unsupported,
            "the server gave the manifest no entity tag, so it cannot be replaced conditionally"
                .to_string(),
        ))),
    }
}

/// Step 3: every file of the step under the attempt's prefix; their manifest entries.
fn upload(
    remote: &Remote,
    step: u64,
    attempt: &str,
    model: Payload<'_>,
    optimizer: Option<Payload<'_>>,
    state: Vec<u8>,
    config: Option<Cow<'_, [u8]>>,
) -> Result<Vec<ManifestEntry>, CheckpointError> {
    let (model_entry, model_header) = put(remote, step, attempt, MODEL_NAME, model)?;
    let mut files = vec![model_entry];
    if let Some(opt) = optimizer {
        let (entry, header) = put(remote, step, attempt, OPTIMIZER_NAME, opt)?;
        files.push(entry);
        // Names and shapes against the model, from the two headers as written.
        let params = model_header
            .map(|h| {
                h.into_tensors()
                    .into_iter()
                    .map(|t| (t.name, t.shape))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(header) = header {
            check_any_header(&header, Some(&params))
                .map_err(|e| CheckpointError::Optimizer(e.to_string()))?;
        }
    }
    let state = Payload::Bytes(Cow::Owned(state));
    files.push(put(remote, step, attempt, STATE_NAME, state)?.0);
    if let Some(config) = config {
        files.push(put(remote, step, attempt, CONFIG_NAME, Payload::Bytes(config))?.0);
    }
    Ok(files)
}

/// Upload one payload, hashing it (and keeping a safetensors header) as it goes; its
/// manifest entry and, for a safetensors file, its validated header.
pub(crate) fn put(
    remote: &Remote,
    step: u64,
    attempt: &str,
    name: &str,
    payload: Payload<'_>,
) -> Result<(ManifestEntry, Option<Header>), CheckpointError> {
    let rel = object_rel(step, attempt, name);
    let url = remote.url(&rel);
    let mut writer = remote.store.writer(&remote.key(&rel))?;
    let is_safetensors = name.ends_with(".safetensors");
    let mut tee = Tee {
        inner: &mut writer,
        hasher: Sha256::new(),
        size: 0,
        header: is_safetensors.then(HeaderCapture::default),
    };
    let filled = match payload {
        Payload::Bytes(b) => tee.write_all(&b),
        Payload::Copy(src) => crate::files::open_regular(&src).and_then(|f| {
            io::copy(
                &mut BufReader::with_capacity(COPY_BUFFER_BYTES, f),
                &mut tee,
            )
            .map(|_| ())
        }),
        Payload::Writer(f) => f(&mut tee),
    };
    let Tee {
        hasher,
        size,
        header,
        ..
    } = tee;
    if let Err(e) = filled {
        return Err(match writer.take_error() {
            Some(s3) => CheckpointError::Remote(s3),
            None => CheckpointError::Io {
                path: PathBuf::from(url),
                source: e,
            },
        });
    }
    let header = match header.map(|h| h.header(size)).transpose() {
        Ok(h) => h,
        Err(e) => {
            // Nothing is committed: the object is left for the attempt's removal.
            return Err(CheckpointError::Payload {
                name: name.to_string(),
                reason: crate::failure::full_text(&e),
            });
        }
    };
    writer.finish()?;
    Ok((
        ManifestEntry {
            name: name.to_string(),
            size,
            sha256: hex(&hasher.finalize()),
        },
        header,
    ))
}

/// Step 4, the commit: the manifest created only if absent (or replacing exactly the
/// manifest the refusals saw), once the attempt is checked whole. The put is sent
/// once; when its reply is an error or a refusal the manifest is read back, and the
/// attempt it names decides (see [`crate::remote::create`]): this attempt means the
/// commit happened; another writer's means the race was lost, and only then is this
/// attempt removed. When the manifest cannot be read back the attempt stays (a
/// manifest might name it; `gc` removes it once none does).
pub(crate) fn commit(
    remote: &Remote,
    step: u64,
    manifest: &RemoteManifest,
    replace: Option<&str>,
) -> Result<(), CheckpointError> {
    // A test stops or delays a writer here: every object uploaded, nothing committed;
    // `return` is a crash at that instant.
    fail::fail_point!("s3/commit", |_| std::process::abort());
    check_whole(remote, step, manifest)?;
    let rel = manifest_rel(step);
    let ours = |bytes: &[u8]| {
        RemoteManifest::from_json(bytes).is_ok_and(|m| m.attempt == manifest.attempt)
    };
    let outcome = put_once(
        &remote.store,
        &remote.url(&rel),
        &remote.key(&rel),
        &manifest.to_json(),
        replace,
        MAX_MANIFEST_BYTES,
        &ours,
    )?;
    match outcome {
        Outcome::Ours => Ok(()),
        Outcome::Theirs(..) | Outcome::Gone => {
            // Read back: another writer's manifest (or none, for a replace); nothing
            // names this attempt.
            let _ = remove_attempt(remote, step, &manifest.attempt);
            Err(CheckpointError::Lost {
                url: remote.url(&step_name(step)),
            })
        }
    }
}

/// Refuse to commit an attempt that is no longer whole: every object the manifest
/// lists must still be there at its size (a `gc` whose grace is shorter than this
/// upload may have removed some while it was written).
fn check_whole(
    remote: &Remote,
    step: u64,
    manifest: &RemoteManifest,
) -> Result<(), CheckpointError> {
    let rel = format!("{}/{}", step_name(step), manifest.attempt);
    let listed = remote.store.list(&remote.key(&rel))?;
    for entry in &manifest.manifest.files {
        let key = remote.key(&object_rel(step, &manifest.attempt, &entry.name));
        let size = listed.iter().find(|i| i.key == key).map(|i| i.size);
        if size != Some(entry.size) {
            let what = match size {
                None => "is gone".to_string(),
                Some(n) => format!("is {n} bytes, not the {} uploaded", entry.size),
            };
            return Err(CheckpointError::Remote(S3Error::request(
                remote.url(&object_rel(step, &manifest.attempt, &entry.name)),
                io::ErrorKind::NotFound,
                format!(
                    "{what} before the commit (removed by a gc whose --grace is shorter than \
                     this save took?); nothing was committed"
                ),
            )));
        }
    }
    Ok(())
}

/// Step 5: `LATEST` names `step` unless it already names a step at least as new;
/// replaced only with `If-Match` on the tag read, so it never moves back. A lost
/// reply is settled by reading it back ([`put_once`]); another writer's move, by
/// reading it again.
fn advance_latest(remote: &Remote, step: u64) -> Result<(), S3Error> {
    let key = remote.key(LATEST_NAME);
    let line = format!("{}\n", step_name(step));
    let ours = |bytes: &[u8]| matches!(parse_latest(bytes), Latest::Names(m) if m >= step);
    for _ in 0..LATEST_TRIES {
        let current = read_latest(remote)?;
        let condition =
            match &current {
                Some((Latest::Names(m), _)) if *m >= step => return Ok(()),
                None => None,
                Some((_, Some(tag))) => Some(tag.as_str()),
                Some((_, None)) => return Err(S3Error::request(
                    remote.url(LATEST_NAME),
                    io::ErrorKind::Unsupported,
                    "the server gave LATEST no entity tag, so it cannot be replaced conditionally"
                        .to_string(),
                )),
            };
        let limit = crate::checkpoint::MAX_LATEST_BYTES;
        let url = remote.url(LATEST_NAME);
        match put_once(
            &remote.store,
            &url,
            &key,
            line.as_bytes(),
            condition,
            limit,
            &ours,
        )? {
            Outcome::Ours => return Ok(()),
            // Another writer moved it (or removed it) meanwhile: read it again.
            Outcome::Theirs(..) | Outcome::Gone => continue,
        }
    }
    Err(S3Error::request(
        remote.url(LATEST_NAME),
        io::ErrorKind::WouldBlock,
        format!("other writers kept moving it; gave up after {LATEST_TRIES} tries"),
    ))
}

/// Delete every object of one attempt.
pub(crate) fn remove_attempt(remote: &Remote, step: u64, attempt: &str) -> Result<(), S3Error> {
    let rel = format!("{}/{attempt}", step_name(step));
    for info in remote.store.list(&remote.key(&rel))? {
        remote.store.delete(&info.key)?;
    }
    Ok(())
}

/// Step 6: the steps beyond `keep` among those not newer than `committed` (each,
/// `committed` included, counts only when sound in a listing made after the commit,
/// see [`sound`]) and attempts no
/// manifest names, older than `grace`. Returns what was removed; what could not be is
/// added to `problems`.
fn cleanup(
    remote: &Remote,
    committed: u64,
    keep: Option<usize>,
    grace: Duration,
    problems: &mut Vec<String>,
) -> Vec<PathBuf> {
    let listing = match list(remote) {
        Ok(l) => l,
        Err(e) => {
            problems.push(crate::failure::full_text(&e));
            return Vec::new();
        }
    };
    let mut doomed: Vec<super::gc::Doomed> = Vec::new();
    let mut beyond = Vec::new();
    if let Some(keep) = keep {
        let mut valid = 0usize;
        let mut cutoff = None;
        for &n in listing
            .committed()
            .iter()
            .rev()
            .filter(|&&n| n <= committed)
        {
            // The new step counts only when it is still whole (a gc may have removed
            // its objects meanwhile): keep never removes the last sound step.
            if sound(remote, n, &listing) {
                valid = valid.saturating_add(1);
                if valid >= keep {
                    cutoff = Some(n);
                    break;
                }
            }
        }
        if let Some(c) = cutoff {
            beyond = listing.committed().into_iter().filter(|&n| n < c).collect();
        }
    }
    for &n in &beyond {
        doomed.push(super::gc::Doomed::Step(n));
    }
    match super::gc::abandoned(remote, &listing, grace, std::time::SystemTime::now()) {
        Ok(found) => doomed.extend(
            found
                .into_iter()
                .filter(|d| !matches!(d, super::gc::Doomed::Attempt(n, _) if beyond.contains(n))),
        ),
        Err(e) => problems.push(crate::failure::full_text(&e)),
    }
    let mut removed = Vec::new();
    for d in doomed {
        match super::gc::remove(remote, &listing, &d) {
            Ok(()) => removed.push(remote.path(&d.rel())),
            Err(e) => problems.push(format!(
                "cannot remove {}: {}",
                remote.url(&d.rel()),
                crate::failure::full_text(&e)
            )),
        }
    }
    removed
}
