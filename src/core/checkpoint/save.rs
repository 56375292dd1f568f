//! Saving with the five-step protocol of checkpoint.md:
//! 1. create `step-N.tmp/` (removing a stale one), write every file, fsync each;
//! 2. write MANIFEST.json last, fsync it, fsync the `.tmp` directory;
//! 3. rename `step-N.tmp` to `step-N`, fsync the parent;
//! 4. write `LATEST.tmp`, fsync, rename to `LATEST`, fsync the parent;
//! 5. only then remove stale `.tmp` directories and, with `keep`, old steps.
//!
//! Invariants: everything that can be checked is checked before the first write (a
//! bad field leaves the disk untouched); a crash at any instant leaves every `step-N`
//! complete and `LATEST` naming one of them; the whole save holds the directory lock.

use std::borrow::Cow;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::fsops::{FsOps, RealFs};
use super::gc::{plan_keep, remove_entry};
use super::manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
use super::optimizer::{check_any_header, model_params};
use super::state::TrainerState;
use super::verify::{inspect, safetensors_problem, MAX_JSON_BYTES};
use super::{
    io_at, list, step_name, CheckpointError, DirLock, Listing, SaveAnyway, CONFIG_NAME,
    LATEST_NAME, LATEST_TMP_NAME, MODEL_NAME, OPTIMIZER_NAME, SAVE_LOCK_NOTICE, SAVE_LOCK_WAIT,
    STATE_NAME, TMP_SUFFIX,
};
use crate::digest::{hex, sha256_hex};
use crate::safetensors::read_header;

/// Copy buffer for `Payload::Copy`.
const COPY_BUFFER_BYTES: usize = 4 << 20;

/// A callback that writes one file's content.
pub type WriteFn<'a> = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + 'a>;

/// The content of one file to save.
pub enum Payload<'a> {
    /// These bytes.
    Bytes(Cow<'a, [u8]>),
    /// A copy of this file (never moved, never modified).
    Copy(PathBuf),
    /// Whatever this callback writes (the trainer streams safetensors straight into
    /// the step directory through it).
    Writer(WriteFn<'a>),
}

impl std::fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Payload::Copy(p) => write!(f, "Copy({})", p.display()),
            Payload::Writer(_) => write!(f, "Writer(..)"),
        }
    }
}

/// What to save.
#[derive(Debug)]
pub struct SaveRequest<'a> {
    /// The optimizer step; names the directory.
    pub step: u64,
    /// `model.safetensors`.
    pub model: Payload<'a>,
    /// `optimizer.safetensors`, when the run has an optimizer state.
    pub optimizer: Option<Payload<'a>>,
    /// `trainer_state.json`; its `step` must equal `step`.
    pub state: TrainerState,
    /// `config.json` bytes, when the run has a config (must be JSON).
    pub config: Option<Cow<'a, [u8]>>,
    /// Keep only the newest `keep` valid steps (at least 1).
    pub keep: Option<usize>,
    /// Replace a complete step of the same number instead of refusing.
    pub overwrite: bool,
    /// Save even when the step is not newer than the verifying step LATEST names
    /// (moving LATEST backwards). Without it such a save is refused: a later gc would
    /// otherwise delete the newer steps as "newer than LATEST".
    pub force: bool,
    /// How long to wait for another save or gc to release the directory's lock before
    /// failing with `Locked` ([`SAVE_LOCK_WAIT`] for the CLI; zero: fail at once).
    pub lock_wait: std::time::Duration,
}

impl<'a> SaveRequest<'a> {
    /// A request with no optimizer, no config, no keep, no overwrite, waiting up to
    /// [`SAVE_LOCK_WAIT`] for the lock.
    pub fn new(step: u64, model: Payload<'a>, state: TrainerState) -> Self {
        SaveRequest {
            step,
            model,
            optimizer: None,
            state,
            config: None,
            keep: None,
            overwrite: false,
            force: false,
            lock_wait: SAVE_LOCK_WAIT,
        }
    }
}

/// What a save did.
#[derive(Debug, Clone)]
pub struct SaveReport {
    /// The committed step directory.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// Its manifest entries.
    pub files: Vec<ManifestEntry>,
    /// Entries removed in step 5 (stale `.tmp` directories, steps beyond `keep`).
    pub removed: Vec<PathBuf>,
    /// What step 5 could not do, one line each naming the entry. The save succeeded
    /// all the same (LATEST names the new step); the next save or gc removes what is
    /// left, and a step left half-deleted fails verification, so no load takes it.
    pub cleanup_problems: Vec<String>,
}

/// Save with the real file system (failpoints included).
pub fn save(dir: &Path, req: SaveRequest<'_>) -> Result<SaveReport, CheckpointError> {
    save_waiting(dir, req, &mut |_| {})
}

/// `save`, calling `on_wait` with the lock's path when the save has waited
/// `SAVE_LOCK_NOTICE` for another save or gc to finish (it waits up to `req.lock_wait`).
pub fn save_waiting(
    dir: &Path,
    req: SaveRequest<'_>,
    on_wait: &mut dyn FnMut(&Path),
) -> Result<SaveReport, CheckpointError> {
    save_with_wait(&mut RealFs, dir, req, on_wait)
}

/// The first `n` bytes of `buf`, as a `Read` or `Write` reported them; a count past
/// the buffer (a broken reader or writer) is an error, never an empty slice.
pub(crate) fn written(buf: &[u8], n: usize) -> io::Result<&[u8]> {
    buf.get(..n).ok_or_else(|| {
        io::Error::other(format!(
            "a reader or writer reported {n} bytes of a {}-byte buffer",
            buf.len()
        ))
    })
}

/// A writer that hashes and counts what passes through.
struct Hashing<'w> {
    inner: &'w mut dyn Write,
    hasher: Sha256,
    size: u64,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(written(buf, n)?);
        self.size = self.size.saturating_add(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn copy_from(path: &Path, out: &mut dyn Write) -> io::Result<()> {
    // An input outside the checkpoint directory may well be a symlink; following it is
    // what the caller asked for.
    let mut src = crate::files::open_regular(path)?;
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(written(&buf, n)?)?;
    }
}

/// Write one payload into the tmp directory, fsync it, return its manifest entry.
pub(crate) fn put(
    fs: &mut dyn FsOps,
    tmp: &Path,
    name: &str,
    payload: Payload<'_>,
) -> Result<ManifestEntry, CheckpointError> {
    let path = tmp.join(name);
    let mut payload = Some(payload);
    let mut digest = None;
    let mut fill = |w: &mut dyn Write| -> io::Result<()> {
        let mut h = Hashing {
            inner: w,
            hasher: Sha256::new(),
            size: 0,
        };
        match payload.take() {
            Some(Payload::Bytes(b)) => h.write_all(&b)?,
            Some(Payload::Copy(src)) => copy_from(&src, &mut h)?,
            Some(Payload::Writer(f)) => f(&mut h)?,
            None => return Err(io::Error::other("payload written twice")),
        }
        digest = Some((h.size, h.hasher.finalize()));
        Ok(())
    };
    fs.write_file(&path, &mut fill).map_err(io_at(&path))?;
    let (size, sha) = digest.ok_or_else(|| io_at(&path)(io::Error::other("nothing written")))?;
    if name.ends_with(".safetensors") {
        if let Some(reason) = safetensors_problem(&path) {
            return Err(CheckpointError::Payload {
                name: name.to_string(),
                reason,
            });
        }
    }
    fs.fsync_file(&path).map_err(io_at(&path))?;
    Ok(ManifestEntry {
        name: name.to_string(),
        size,
        sha256: hex(&sha),
    })
}

/// Remove whatever sits at `path` (directory tree, file or symlink), if anything.
pub(crate) fn clear(fs: &mut dyn FsOps, path: &Path) -> Result<(), CheckpointError> {
    match fs::symlink_metadata(path) {
        Ok(_) => remove_entry(fs, path).map_err(io_at(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at(path)(e)),
    }
}

/// The trainer state's bytes, after the checks every save makes of its small parts:
/// the state's step is the step saved, `keep` is at least 1, the config is JSON and
/// the state names its sha256 (shared by unsharded and sharded saves).
pub(crate) fn state_bytes(
    step: u64,
    state: &mut TrainerState,
    config: Option<&[u8]>,
    keep: Option<usize>,
) -> Result<Vec<u8>, CheckpointError> {
    if state.step != step {
        return Err(CheckpointError::Request(format!(
            "the trainer state's step {} is not the step being saved ({step})",
            state.step
        )));
    }
    if keep == Some(0) {
        return Err(CheckpointError::Request(
            "keep must be at least 1 (the checkpoint just saved)".into(),
        ));
    }
    let config_sha = match config {
        // A load refuses a larger config.json (it is parsed whole); a step it could not
        // load must never be committed, let alone count toward `keep`.
        Some(bytes) if bytes.len() as u64 > MAX_JSON_BYTES => {
            return Err(CheckpointError::Config(format!(
                "config.json would be {} bytes, more than the {MAX_JSON_BYTES} bytes (64 MiB) \
                 a load reads; nothing was written",
                bytes.len()
            )))
        }
        Some(bytes) => {
            serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
                .map_err(|e| CheckpointError::Config(e.to_string()))?;
            Some(sha256_hex(bytes))
        }
        None => None,
    };
    state.bind_config(config_sha.as_deref())?;
    Ok(state.to_json()?)
}

/// Check everything that can be checked before touching the disk; returns the state
/// bytes to write.
pub(crate) fn validate(req: &mut SaveRequest<'_>) -> Result<Vec<u8>, CheckpointError> {
    let state = state_bytes(req.step, &mut req.state, req.config.as_deref(), req.keep)?;
    for (name, payload) in [
        (MODEL_NAME, Some(&req.model)),
        (OPTIMIZER_NAME, req.optimizer.as_ref()),
    ] {
        if let Some(Payload::Copy(src)) = payload {
            // An unreadable source is an operational error, reported as such; only a
            // readable file that breaks the rules is invalid input.
            fs::metadata(src).map_err(io_at(src))?;
            if let Some(reason) = safetensors_problem(src) {
                return Err(CheckpointError::Payload {
                    name: name.to_string(),
                    reason: format!("{}: {reason}", src.display()),
                });
            }
        }
    }
    Ok(state)
}

/// Save through `fs` (the seam); see the module documentation for the protocol.
pub fn save_with(
    fs: &mut dyn FsOps,
    dir: &Path,
    req: SaveRequest<'_>,
) -> Result<SaveReport, CheckpointError> {
    save_with_wait(fs, dir, req, &mut |_| {})
}

/// Refuse a save that would move LATEST backwards (or sideways without `overwrite`):
/// only when LATEST names a step that verifies, since a missing, dangling or corrupt
/// LATEST is exactly what a save after a fallback repairs. The step directory is read
/// only in that rare case, never on the usual forward save.
fn check_forward(
    dir: &Path,
    listing: &Listing,
    step: u64,
    overwrite: bool,
    force: bool,
) -> Result<(), CheckpointError> {
    if force {
        return Ok(());
    }
    let Some(latest) = listing.latest().step() else {
        return Ok(());
    };
    let backwards = step < latest || (step == latest && !overwrite);
    if backwards && inspect(&dir.join(step_name(latest))).problems.is_empty() {
        return Err(CheckpointError::NotNewer {
            step,
            latest,
            hint: if step == latest {
                SaveAnyway::Overwrite
            } else {
                SaveAnyway::Force
            },
        });
    }
    Ok(())
}

/// `save_with`, waiting for the lock (see `save_waiting`).
pub fn save_with_wait(
    fs: &mut dyn FsOps,
    dir: &Path,
    mut req: SaveRequest<'_>,
    on_wait: &mut dyn FnMut(&Path),
) -> Result<SaveReport, CheckpointError> {
    let state_bytes = validate(&mut req)?;
    fs.create_dir_all(dir).map_err(io_at(dir))?;
    let _lock = DirLock::acquire_waiting(dir, req.lock_wait, SAVE_LOCK_NOTICE, on_wait)?;

    let target = prepare(fs, dir, req.step, req.overwrite, req.force)?;
    let tmp = &target.tmp;
    let written = write_files(
        fs,
        tmp,
        req.step,
        req.model,
        req.optimizer,
        state_bytes,
        req.config,
    );
    let files = match written {
        Ok(files) => files,
        Err(e) => {
            // Best effort: the error that stopped the save matters more.
            let _ = clear(fs, tmp);
            return Err(e);
        }
    };
    let (removed, cleanup_problems) = publish(fs, dir, req.step, &target, req.keep)?;
    Ok(SaveReport {
        path: target.final_path,
        step: req.step,
        files,
        removed,
        cleanup_problems,
    })
}

/// Where a save writes, found under the lock before step 1.
#[derive(Debug)]
pub(crate) struct Target {
    /// `step-N`.
    pub final_path: PathBuf,
    /// `step-N.tmp`, created fresh by [`prepare`].
    pub tmp: PathBuf,
    /// Whether something already exists at `final_path` (replaced by exchange).
    pub exists: bool,
}

/// The refusals of a save (a step not moving LATEST forward, a complete step without
/// `overwrite`), then step 1's fresh, empty `step-N.tmp/`. The caller holds the lock.
pub(crate) fn prepare(
    fs: &mut dyn FsOps,
    dir: &Path,
    step: u64,
    overwrite: bool,
    force: bool,
) -> Result<Target, CheckpointError> {
    let name = step_name(step);
    let final_path = dir.join(&name);
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let listing = list(dir)?;
    check_forward(dir, &listing, step, overwrite, force)?;
    let exists = fs::symlink_metadata(&final_path).is_ok();
    if exists && !overwrite {
        // Only a checkpoint `load` could pick is protected: a directory newer than
        // LATEST was never declared done, and a broken one holds nothing to keep.
        let declared = listing.latest().step().is_none_or(|b| step <= b);
        if declared && inspect(&final_path).problems.is_empty() {
            return Err(CheckpointError::Exists { path: final_path });
        }
    }
    clear(fs, &tmp)?;
    fs.create_dir(&tmp).map_err(io_at(&tmp))?;
    Ok(Target {
        final_path,
        tmp,
        exists,
    })
}

/// Steps 3 to 5 once the tmp directory holds every file and its manifest: the rename
/// (or exchange), LATEST, then the cleanup and `keep`. Returns what step 5 removed.
pub(crate) fn publish(
    fs: &mut dyn FsOps,
    dir: &Path,
    step: u64,
    target: &Target,
    keep: Option<usize>,
) -> Result<(Vec<PathBuf>, Vec<String>), CheckpointError> {
    let (tmp, final_path) = (&target.tmp, &target.final_path);
    // Step 3: the directory appears whole under its name.
    if target.exists {
        fs.exchange(tmp, final_path).map_err(io_at(final_path))?;
    } else {
        fs.rename(tmp, final_path).map_err(io_at(final_path))?;
    }
    fs.fsync_dir(dir).map_err(io_at(dir))?;

    // Step 4: LATEST by rename.
    let latest_tmp = dir.join(LATEST_TMP_NAME);
    clear(fs, &latest_tmp)?;
    let line = format!("{}\n", step_name(step));
    fs.write_file(&latest_tmp, &mut |w: &mut dyn Write| {
        w.write_all(line.as_bytes())
    })
    .map_err(io_at(&latest_tmp))?;
    fs.fsync_file(&latest_tmp).map_err(io_at(&latest_tmp))?;
    let latest = dir.join(LATEST_NAME);
    fs.rename(&latest_tmp, &latest).map_err(io_at(&latest))?;
    fs.fsync_dir(dir).map_err(io_at(dir))?;

    // Step 5: cleanup, only now that the new step is declared. From here on the save
    // has succeeded: a failure is reported, never raised (a caller retrying a
    // committed save would be refused, and the step is there).
    Ok(cleanup(fs, dir, keep, step))
}

/// Step 5: stale `.tmp` entries and, with `keep`, the steps beyond the newest `keep`
/// valid ones (the step just committed, `committed`, counts without being read: every
/// rule load applies was checked before it was written, and its bytes were hashed as
/// they were written). Returns what was removed and what could not be.
fn cleanup(
    fs: &mut dyn FsOps,
    dir: &Path,
    keep: Option<usize>,
    committed: u64,
) -> (Vec<PathBuf>, Vec<String>) {
    let (mut removed, mut problems) = (Vec::new(), Vec::new());
    let listing = match list(dir) {
        Ok(l) => l,
        Err(e) => {
            problems.push(crate::failure::full_text(&e));
            return (removed, problems);
        }
    };
    let mut doomed: Vec<PathBuf> = listing.tmps.iter().map(|t| dir.join(t)).collect();
    if let Some(keep) = keep {
        doomed.extend(
            plan_keep(dir, &listing, keep, Some(committed))
                .into_iter()
                .map(|n| dir.join(step_name(n))),
        );
    }
    for path in doomed {
        match remove_entry(fs, &path) {
            Ok(()) => removed.push(path),
            Err(e) => problems.push(format!("cannot remove {}: {e}", path.display())),
        }
    }
    (removed, problems)
}

/// Steps 1 and 2 inside the tmp directory.
fn write_files(
    fs: &mut dyn FsOps,
    tmp: &Path,
    step: u64,
    model: Payload<'_>,
    optimizer: Option<Payload<'_>>,
    state: Vec<u8>,
    config: Option<Cow<'_, [u8]>>,
) -> Result<Vec<ManifestEntry>, CheckpointError> {
    let mut files = vec![put(fs, tmp, MODEL_NAME, model)?];
    if let Some(opt) = optimizer {
        files.push(put(fs, tmp, OPTIMIZER_NAME, opt)?);
        // Names and shapes against the model, from the two headers as written.
        let invalid = |e: &dyn std::fmt::Display| CheckpointError::Optimizer(e.to_string());
        let params = model_params(&tmp.join(MODEL_NAME)).map_err(|e| invalid(&e))?;
        let header = read_header(&tmp.join(OPTIMIZER_NAME)).map_err(|e| invalid(&e))?;
        check_any_header(&header, Some(&params)).map_err(|e| invalid(&e))?;
    }
    files.push(put(fs, tmp, STATE_NAME, Payload::Bytes(Cow::Owned(state)))?);
    if let Some(config) = config {
        files.push(put(fs, tmp, CONFIG_NAME, Payload::Bytes(config))?);
    }
    let manifest =
        Manifest::new(step, files).map_err(|e| CheckpointError::Request(e.to_string()))?;
    let bytes = manifest.to_json();
    let path = tmp.join(MANIFEST_NAME);
    fs.write_file(&path, &mut |w: &mut dyn Write| w.write_all(&bytes))
        .map_err(io_at(&path))?;
    fs.fsync_file(&path).map_err(io_at(&path))?;
    fs.fsync_dir(tmp).map_err(io_at(tmp))?;
    Ok(manifest.files)
}
