//! Sharded steps in a directory the caller names (PyTorch DCP's `checkpoint_id`, e.g.
//! torchtitan's `{folder}/step-100`), beside the run directories of `step-NNNNNN` steps.
//!
//! A canonical name (`run/step-000100`) is the run directory's step and goes through
//! [`super::begin`] (LATEST, retention). Any other name is saved with the same protocol
//! minus LATEST: the files into `<name>.tmp/` under the parent's lock, fsynced, the
//! manifest last, one rename to `<name>`, the parent fsynced.
//!
//! Invariants: an existing entry under the name is never replaced without `overwrite`;
//! a name that the checkpoint protocol reserves (`LATEST`, `.lock`, anything ending in
//! `.tmp`) is refused before anything is created; nothing is read or written outside
//! the parent directory.

use std::fs;
use std::path::{Path, PathBuf};

use super::commit::ShardedSave;
use super::open::{open_dir, ShardedStep};
use super::{ShardedError, SHARDS_NAME};
use crate::checkpoint::fsops::{FsOps, RealFs};
use crate::checkpoint::manifest::{is_plain_name, Manifest, MANIFEST_NAME};
use crate::checkpoint::save::{clear, Target};
use crate::checkpoint::verify::inspect;
use crate::checkpoint::{
    io_at as ck_io_at, parse_step_name, CheckpointError, DirLock, LATEST_NAME, SAVE_LOCK_NOTICE,
    SAVE_LOCK_WAIT, TMP_SUFFIX,
};

/// Largest manifest read to learn a named step's number.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// The parent directory and the plain name of `step_dir`, or why it cannot be a step.
fn split(step_dir: &Path) -> Result<(PathBuf, String), ShardedError> {
    let bad = |why: &str| ShardedError::Request(format!("{}: {why}", step_dir.display()));
    let name = step_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| bad("a step directory needs a UTF-8 name"))?;
    if !is_plain_name(name) {
        return Err(bad("a step directory needs a plain name"));
    }
    if name.ends_with(TMP_SUFFIX) || name == LATEST_NAME || name.starts_with('.') {
        return Err(bad(
            "the name is one the checkpoint protocol reserves (LATEST, a hidden name, *.tmp)",
        ));
    }
    let parent = match step_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_string()))
}

/// Start a sharded save of `step` into the directory `step_dir` (which must not exist
/// as a step yet, unless `overwrite`). A canonical name must carry `step`.
pub fn begin_named(
    step_dir: &Path,
    step: u64,
    overwrite: bool,
) -> Result<ShardedSave, ShardedError> {
    super::refuse_remote(step_dir)?;
    let (parent, name) = split(step_dir)?;
    if let Some(n) = parse_step_name(&name) {
        if n != step {
            return Err(ShardedError::Request(format!(
                "{}: the directory is step {n}, the save is step {step}",
                step_dir.display()
            )));
        }
        return super::begin(&parent, step, overwrite);
    }
    let fs: &mut dyn FsOps = &mut RealFs;
    fs.create_dir_all(&parent).map_err(ck_io_at(&parent))?;
    let lock = DirLock::acquire_waiting(&parent, SAVE_LOCK_WAIT, SAVE_LOCK_NOTICE, &mut |_| {})?;
    let final_path = parent.join(&name);
    let tmp = parent.join(format!("{name}{TMP_SUFFIX}"));
    let exists = fs::symlink_metadata(&final_path).is_ok();
    if exists && !overwrite {
        if inspect(&final_path).problems.is_empty() {
            return Err(CheckpointError::Exists { path: final_path }.into());
        }
        return Err(ShardedError::Request(format!(
            "{} already exists and is not a tlio step (save with overwrite to replace it)",
            final_path.display()
        )));
    }
    clear(fs, &tmp)?;
    fs.create_dir(&tmp).map_err(ck_io_at(&tmp))?;
    let probe = super::commit::probe_or_clear(fs, &tmp)?;
    let target = Target {
        final_path,
        tmp,
        exists,
    };
    Ok(ShardedSave::named(&parent, step, target, lock, probe))
}

/// Step 3 of the protocol for a named step: the rename (an exchange when something was
/// there, whose old content is then removed), the parent fsynced. No LATEST, no
/// retention. Returns what was removed and what could not be.
pub(crate) fn publish_named(
    fs: &mut dyn FsOps,
    parent: &Path,
    target: &Target,
) -> Result<(Vec<PathBuf>, Vec<String>), CheckpointError> {
    let (tmp, final_path) = (&target.tmp, &target.final_path);
    if target.exists {
        fs.exchange(tmp, final_path).map_err(ck_io_at(final_path))?;
    } else {
        fs.rename(tmp, final_path).map_err(ck_io_at(final_path))?;
    }
    fs.fsync_dir(parent).map_err(ck_io_at(parent))?;
    // Committed: what the exchange moved aside is removed, a failure reported only.
    let mut removed = Vec::new();
    let mut problems = Vec::new();
    if target.exists {
        match clear(fs, tmp) {
            Ok(()) => removed.push(tmp.clone()),
            Err(e) => problems.push(crate::failure::full_text(&e)),
        }
    }
    Ok((removed, problems))
}

/// Open exactly the step directory `step_dir` (any name) for verified region reads:
/// its manifest gives the step; it must pass the same light check `open_step` makes.
pub fn open_step_dir(step_dir: &Path) -> Result<ShardedStep, ShardedError> {
    super::refuse_remote(step_dir)?;
    let fail = |why: String| ShardedError::Request(format!("{}: {why}", step_dir.display()));
    let manifest_path = step_dir.join(MANIFEST_NAME);
    let bytes = crate::files::read_limited(&manifest_path, MAX_MANIFEST_BYTES).map_err(|e| {
        fail(format!(
            "not a committed step: cannot read {MANIFEST_NAME}: {e}"
        ))
    })?;
    let manifest =
        Manifest::from_json(&bytes).map_err(|e| fail(format!("invalid {MANIFEST_NAME}: {e}")))?;
    if manifest.get(SHARDS_NAME).is_none() {
        return Err(fail(format!("not a sharded step (no {SHARDS_NAME})")));
    }
    open_dir(step_dir, manifest.step, false).map_err(fail)
}

impl ShardedStep {
    /// The chunks (offsets, sizes) of the global tensor `group/name`, sorted by
    /// offsets, as its table gives them (an unsharded step: one chunk, the whole tensor).
    pub fn chunk_boxes(&self, group: super::Group, name: &str) -> Option<Vec<(&[u64], &[u64])>> {
        self.tensor(group, name).map(|t| {
            t.chunks
                .iter()
                .map(|c| (c.offsets.as_slice(), c.sizes.as_slice()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_refused() {
        for name in ["LATEST", "x.tmp", ".lock", "step-000001.tmp", ".."] {
            let err = begin_named(&Path::new("/nonexistent-tlio").join(name), 1, false);
            assert!(err.is_err(), "{name} was accepted");
        }
    }

    #[test]
    fn a_canonical_name_must_carry_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let err = begin_named(&dir.path().join("step-000003"), 4, false).unwrap_err();
        assert!(err.to_string().contains("step 3"), "{err}");
    }
}
