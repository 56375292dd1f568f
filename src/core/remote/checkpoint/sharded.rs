//! Sharded checkpoints on object storage, with the protocol of `super` (no rename, the
//! manifest's conditional put as the commit):
//!
//! ```text
//! P/step-000050/MANIFEST.json                                  names the attempt
//! P/step-000050/attempt-<32 hex>/model-rank00000.safetensors   one object per rank file
//! P/step-000050/attempt-<32 hex>/optimizer-rank00001.safetensors
//! P/step-000050/attempt-<32 hex>/shards.json                   the chunk table
//! P/step-000050/attempt-<32 hex>/trainer_state.json
//! ```
//!
//! Rank 0's [`RemoteSave::begin`] makes the save's refusals from one listing and draws
//! the attempt; every rank uploads its files under the attempt ([`write_rank_file`],
//! hashed by the local writer's code from the buffers it sends); [`RemoteSave::commit`]
//! checks the chunk table by the local rules against the ranks' tables, the listed
//! objects' sizes and their headers (range requests), uploads the small files and
//! commits. [`open_step`] picks a step as the remote `load` does and checks it lightly
//! (manifest, small files by sha256, sizes from the listing, headers by range
//! requests); its region reads are range requests verified piece by piece.
//!
//! Invariants: the ranks write only under an attempt (a `tmp_dir` of another shape is
//! refused); nothing is committed unless every check passed; a failure before the
//! commit removes the attempt (best effort: `gc` removes what is left); a step is read
//! only from the attempt its manifest names.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::choose::{choose, Refusal, Wanted};
use super::save::{after_commit, commit, put, refusals, remove_attempt};
use super::{
    is_attempt_name, list, list_under, manifest_rel, new_attempt, object_rel, Remote,
    RemoteListing, RemoteManifest, DEFAULT_GRACE,
};
use crate::checkpoint::manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
use crate::checkpoint::save::{state_bytes, Payload, SaveReport};
use crate::checkpoint::sharded::commit::{build_table, check_file_set, check_reported_header};
use crate::checkpoint::sharded::open::{
    check_small, global_list, header_problem, is_sharded, open_checked, owned, sha_problem,
    size_problem, small_limit, Checked, GlobalTensor, Source, StepFiles,
};
use crate::checkpoint::sharded::write::{stream_all, write_rank_file_with};
use crate::checkpoint::sharded::{
    table_err, ChunkData, CommitRequest, RankFile, ShardedError, ShardedStep, SHARDS_NAME,
};
use crate::checkpoint::verify::MAX_MANIFEST_BYTES;
use crate::checkpoint::{parse_step_name, step_name, CheckpointError, CONFIG_NAME, STATE_NAME};
use crate::digest::hex;
use crate::remote::header::HeaderFailure;
use crate::s3::{S3Error, S3Url, Store};
use crate::safetensors::Header;

/// Bytes of a data object's start fetched to read its header: one range request holds
/// the usual header whole; a larger one takes a second request for the rest.
const HEADER_GUESS_BYTES: u64 = 64 << 10;

fn remote_err(e: S3Error) -> ShardedError {
    ShardedError::Checkpoint(CheckpointError::Remote(e))
}

/// A sharded save in progress on object storage (rank 0's side).
#[derive(Debug)]
pub struct RemoteSave {
    remote: Remote,
    step: u64,
    attempt: String,
    /// The entity tag of the manifest the commit replaces (`overwrite`).
    replace: Option<String>,
    tmp: PathBuf,
    open: bool,
}

impl RemoteSave {
    /// The refusals of a save of `step` under the prefix `url` (from one listing), and
    /// a fresh attempt for the ranks' files.
    pub fn begin(url: &S3Url, step: u64, overwrite: bool) -> Result<Self, ShardedError> {
        let remote = Remote::connect(url).map_err(remote_err)?;
        let listing = list(&remote).map_err(remote_err)?;
        let replace = refusals(&remote, &listing, step, overwrite)?;
        let attempt = new_attempt();
        let tmp = remote.path(&format!("{}/{attempt}", step_name(step)));
        Ok(RemoteSave {
            remote,
            step,
            attempt,
            replace,
            tmp,
            open: true,
        })
    }

    /// The attempt's URL, where every rank writes its files.
    pub fn tmp_dir(&self) -> Option<&Path> {
        self.open.then_some(self.tmp.as_path())
    }

    /// Remove the attempt's objects (best effort); nothing is committed. Doing it twice
    /// (or after a commit) does nothing.
    pub fn abort(&mut self) {
        if std::mem::take(&mut self.open) {
            // Best effort: gc removes an abandoned attempt once its grace is over.
            let _ = remove_attempt(&self.remote, self.step, &self.attempt);
        }
    }

    /// Check, upload the small files, commit with the manifest's conditional put, move
    /// `LATEST` and apply `keep` and the cleanup as an unsharded save does.
    pub fn commit(&mut self, req: CommitRequest) -> Result<SaveReport, ShardedError> {
        if !std::mem::take(&mut self.open) {
            return Err(ShardedError::Request(
                "this sharded save was already committed or aborted".into(),
            ));
        }
        let keep = req.keep;
        let manifest = match self.prepare(req) {
            Ok(m) => m,
            Err(e) => {
                // Best effort, as for an unsharded save: the error matters more.
                let _ = remove_attempt(&self.remote, self.step, &self.attempt);
                return Err(e);
            }
        };
        commit(&self.remote, self.step, &manifest, self.replace.as_deref())?;
        Ok(after_commit(&self.remote, manifest, keep, DEFAULT_GRACE))
    }

    /// Everything before the commit: the table by the local rules, the attempt's objects
    /// against the ranks' tables, the small files uploaded; the manifest to create.
    fn prepare(&self, req: CommitRequest) -> Result<RemoteManifest, ShardedError> {
        let CommitRequest {
            files,
            tensors,
            meta,
            mut state,
            config,
            keep,
        } = req;
        let (remote, step, attempt) = (&self.remote, self.step, self.attempt.as_str());
        let state_json = state_bytes(step, &mut state, config.as_deref(), keep)?;
        let table = build_table(&files, tensors, meta)?;
        check_objects(remote, step, attempt, &files)?;
        let mut entries: Vec<ManifestEntry> = files
            .iter()
            .map(|f| ManifestEntry {
                name: f.name.clone(),
                size: f.size,
                sha256: f.sha256.clone(),
            })
            .collect();
        let small = [
            (SHARDS_NAME, Some(table.to_json_checked()?)),
            (STATE_NAME, Some(state_json)),
            (CONFIG_NAME, config),
        ];
        for (name, bytes) in small {
            if let Some(bytes) = bytes {
                let payload = Payload::Bytes(Cow::Owned(bytes));
                entries.push(put(remote, step, attempt, name, payload)?.0);
            }
        }
        let manifest =
            Manifest::new(step, entries).map_err(|e| CheckpointError::Request(e.to_string()))?;
        Ok(RemoteManifest {
            attempt: attempt.to_string(),
            manifest,
        })
    }
}

impl Drop for RemoteSave {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The attempt holds exactly the reported files, each at its reported size (from one
/// listing) with a header that places every key where its rank said (range requests).
fn check_objects(
    remote: &Remote,
    step: u64,
    attempt: &str,
    files: &[RankFile],
) -> Result<(), ShardedError> {
    let listing =
        list_under(remote, &format!("{}/{attempt}", step_name(step))).map_err(remote_err)?;
    let empty = BTreeMap::new();
    let stored = listing
        .steps
        .get(&step)
        .and_then(|s| s.attempts.get(attempt))
        .unwrap_or(&empty);
    let found: BTreeSet<String> = stored.keys().cloned().collect();
    check_file_set(&found, files, &|stray| {
        remote.url(&object_rel(step, attempt, stray))
    })?;
    for f in files {
        let size = stored.get(&f.name).map_or(0, |i| i.size);
        if size != f.size {
            return Err(table_err(
                format!("rank file {}", f.name),
                format!("has {size} bytes, its rank reported {}", f.size),
            ));
        }
        let key = remote.key(&object_rel(step, attempt, &f.name));
        let url = remote.url(&object_rel(step, attempt, &f.name));
        let header = read_header(&remote.store, &key, &url, size).map_err(|e| match e {
            HeaderFailure::Remote(e) => remote_err(e),
            HeaderFailure::Invalid(source) => ShardedError::Safetensors {
                path: remote.path(&object_rel(step, attempt, &f.name)),
                source,
            },
        })?;
        check_reported_header(&header, f)?;
    }
    Ok(())
}

/// Upload one rank's chunks as the canonical safetensors object `name` under the
/// attempt `tmp_dir` (`s3://bucket/P/step-N/attempt-x`, what `begin` gave), in parts
/// when large; the sha256 and the piece digests come from the buffers sent.
pub fn write_rank_file(
    tmp_dir: &Path,
    name: &str,
    chunks: &[ChunkData<'_>],
) -> Result<RankFile, ShardedError> {
    let text = tmp_dir.to_str().unwrap_or_default();
    let url = S3Url::parse(text).map_err(remote_err)?;
    let parent = url.key().rsplit_once('/').map(|(p, _)| p).unwrap_or("");
    let parent_step = parent.rsplit('/').next().and_then(parse_step_name);
    if !is_attempt_name(url.name()) || parent_step.is_none() {
        return Err(ShardedError::Request(format!(
            "{url} is not the attempt of a sharded save on object storage \
             (s3://bucket/P/step-N/attempt-<hex>, the tmp_dir that begin gives)"
        )));
    }
    crate::checkpoint::sharded::write::check_file_name(name)?;
    // A test holds a rank here (`sleep`), before anything of its file is sent, to kill
    // its host in the middle of a save; `return` is a crash at that instant.
    fail::fail_point!("s3/rank-file", |_| std::process::abort());
    let store = crate::s3::connect(&url).map_err(remote_err)?;
    let key = url.child_key(name);
    let object = format!("{url}/{name}");
    write_rank_file_with(name, chunks, &|header, ordered| {
        let mut writer = store.writer(&key).map_err(remote_err)?;
        match stream_all(&mut writer, header, ordered) {
            Ok(written) => {
                writer.finish().map_err(remote_err)?;
                Ok(written)
            }
            // Dropped unfinished, the upload is aborted: nothing appears at the key.
            Err(source) => Err(match writer.take_error() {
                Some(e) => remote_err(e),
                None => ShardedError::Io {
                    path: PathBuf::from(&object),
                    source,
                },
            }),
        }
    })
}

/// The safetensors header of the object `key` of `size` bytes: the first
/// [`HEADER_GUESS_BYTES`] in one range request, the rest of the header when larger.
/// `url` names the object in errors.
fn read_header(store: &Store, key: &str, url: &str, size: u64) -> Result<Header, HeaderFailure> {
    Ok(crate::remote::header::read_header(store, key, url, size, HEADER_GUESS_BYTES)?.header)
}

/// The data objects of one committed step's attempt.
struct RemoteFiles<'a> {
    remote: &'a Remote,
    step: u64,
    attempt: &'a str,
}

impl RemoteFiles<'_> {
    fn key(&self, name: &str) -> String {
        self.remote.key(&object_rel(self.step, self.attempt, name))
    }
}

impl StepFiles for RemoteFiles<'_> {
    fn data(&self, e: &ManifestEntry) -> Result<(Source, Header), String> {
        let key = self.key(&e.name);
        let url = self
            .remote
            .url(&object_rel(self.step, self.attempt, &e.name));
        let header = read_header(&self.remote.store, &key, &url, e.size).map_err(|f| match f {
            HeaderFailure::Remote(err) => {
                format!(
                    "cannot read {}: {}",
                    e.name,
                    crate::failure::full_text(&err)
                )
            }
            HeaderFailure::Invalid(err) => header_problem(e, &err),
        })?;
        let source = Source::Remote {
            store: self.remote.store.clone(),
            key,
        };
        Ok((source, header))
    }

    fn whole(
        &self,
        e: &ManifestEntry,
        _streamed: bool,
    ) -> Result<(Source, Result<Header, String>), String> {
        let mut hasher = Sha256::new();
        let bytes = self
            .remote
            .store
            .read_object(&self.key(&e.name), e.size, &mut |c| hasher.update(c))
            .map_err(|err| match err {
                S3Error::TooLarge { size, .. } => size_problem(e, size),
                err => format!(
                    "cannot read {}: {}",
                    e.name,
                    crate::failure::full_text(&err)
                ),
            })?;
        if bytes.len() as u64 != e.size {
            return Err(size_problem(e, bytes.len() as u64));
        }
        let sha = hex(&hasher.finalize());
        if sha != e.sha256 {
            return Err(sha_problem(e, &sha));
        }
        Ok(owned(e, bytes))
    }
}

/// The manifest of committed step `n` of the listing, and the light check of its
/// attempt: every object it lists there at its size, none unlisted, the JSON files
/// read and checked by sha256.
fn check_attempt(
    remote: &Remote,
    n: u64,
    listing: &RemoteListing,
) -> Result<(Checked, String), String> {
    let objects = listing.steps.get(&n);
    if objects.and_then(|o| o.manifest.as_ref()).is_none() {
        return Err(format!("missing {MANIFEST_NAME}"));
    }
    let got = remote
        .store
        .get_if_exists(&remote.key(&manifest_rel(n)), MAX_MANIFEST_BYTES)
        .map_err(|e| {
            format!(
                "cannot read {MANIFEST_NAME}: {}",
                crate::failure::full_text(&e)
            )
        })?;
    let Some((bytes, _)) = got else {
        return Err(format!("missing {MANIFEST_NAME}"));
    };
    let rm =
        RemoteManifest::from_json(&bytes).map_err(|e| format!("invalid {MANIFEST_NAME}: {e}"))?;
    if rm.manifest.step != n {
        return Err(format!(
            "{MANIFEST_NAME} says step {}, the prefix is step {n}",
            rm.manifest.step
        ));
    }
    let empty = BTreeMap::new();
    let stored = objects
        .and_then(|o| o.attempts.get(&rm.attempt))
        .unwrap_or(&empty);
    if let Some(extra) = stored.keys().find(|k| rm.manifest.get(k).is_none()) {
        return Err(format!("unlisted file {extra}"));
    }
    let mut small = BTreeMap::new();
    for e in &rm.manifest.files {
        let size = stored
            .get(&e.name)
            .map(|i| i.size)
            .ok_or_else(|| format!("{} is missing", e.name))?;
        if size != e.size {
            return Err(size_problem(e, size));
        }
        if e.name.ends_with(".json") {
            let limit = small_limit(e)?;
            let key = remote.key(&object_rel(n, &rm.attempt, &e.name));
            let bytes = remote.store.get(&key, limit).map_err(|err| {
                format!(
                    "cannot read {}: {}",
                    e.name,
                    crate::failure::full_text(&err)
                )
            })?;
            let sha = hex(&Sha256::digest(&bytes));
            small.insert(e.name.clone(), check_small(e, bytes, &sha)?);
        }
    }
    Ok((
        Checked {
            manifest: rm.manifest,
            small,
        },
        rm.attempt,
    ))
}

/// Open committed step `n` of the listing for region reads, or say why it does not
/// pass (as `load` reports a refused step).
pub(crate) fn open_one(
    remote: &Remote,
    n: u64,
    listing: &RemoteListing,
) -> Result<ShardedStep, String> {
    let (checked, attempt) = check_attempt(remote, n, listing)?;
    let files = RemoteFiles {
        remote,
        step: n,
        attempt: &attempt,
    };
    let mut out = open_checked(&checked, n, &files, false)?;
    out.path = remote.path(&step_name(n));
    Ok(out)
}

/// Open the step the remote `load` would pick under the prefix `url` (the newest
/// committed step that passes the light check; with `step`, exactly that one or an
/// error naming why), sharded or not.
pub fn open_step(url: &S3Url, step: Option<u64>) -> Result<ShardedStep, ShardedError> {
    open_wanted(url, step.into())
}

/// Open the step a `step=None` choice picks among those older than `below` (the next
/// candidate once step `below` was found damaged on another rank).
pub fn open_step_below(url: &S3Url, below: u64) -> Result<ShardedStep, ShardedError> {
    open_wanted(url, Wanted::Below(below))
}

fn open_wanted(url: &S3Url, wanted: Wanted) -> Result<ShardedStep, ShardedError> {
    let remote = Remote::connect(url).map_err(remote_err)?;
    let (mut opened, picked) = choose(&remote, wanted, &mut |n, listing| {
        open_one(&remote, n, listing).map_err(Refusal::Broken)
    })?;
    opened.skipped = picked.skipped;
    Ok(opened)
}

/// The sharded problems of committed step `n` whose other checks passed: the table
/// against the objects' headers, then every piece digest (coalesced range requests).
pub(crate) fn check_step(remote: &Remote, n: u64, listing: &RemoteListing) -> Vec<String> {
    match open_one(remote, n, listing) {
        Ok(step) => crate::checkpoint::sharded::verify::check_pieces(&step),
        Err(why) => vec![why],
    }
}

/// Whether committed step `n`'s manifest (read, not verified) lists a chunk table.
pub(crate) fn manifest_is_sharded(remote: &Remote, n: u64) -> bool {
    remote
        .store
        .get_if_exists(&remote.key(&manifest_rel(n)), MAX_MANIFEST_BYTES)
        .ok()
        .flatten()
        .and_then(|(bytes, _)| RemoteManifest::from_json(&bytes).ok())
        .is_some_and(|m| is_sharded(&m.manifest))
}

/// The global tensors of the sharded step at `url` (`s3://bucket/P/step-N`), after the
/// light check `open_step` makes (the pieces are not read).
pub fn global_tensors(url: &S3Url) -> Result<(u64, Vec<GlobalTensor>), ShardedError> {
    let (remote, n) = super::read::step_remote(url)?;
    let listing = list_under(&remote, &step_name(n)).map_err(remote_err)?;
    let opened = open_one(&remote, n, &listing).map_err(|why| {
        ShardedError::Checkpoint(CheckpointError::NotFound {
            dir: PathBuf::from(url.to_string()),
            reasons: vec![(step_name(n), why)],
        })
    })?;
    if !opened.sharded {
        return Err(ShardedError::Request(format!(
            "{url} is not a sharded step (its manifest does not list {SHARDS_NAME})"
        )));
    }
    Ok((n, global_list(&opened)))
}
