//! A checkpoint directory named by a local path or by an `s3://bucket/prefix` URL: the
//! one place that sends each operation (save, load, pick, survey, verify, gc, export,
//! the sharded save, write and open) to the local protocol (`crate::checkpoint`) or to
//! the object-storage one (`super::checkpoint`).
//!
//! Invariant: a path is remote exactly when its text starts with `s3://` (and then it
//! must be a valid URL: a malformed one is an error, never a local directory named
//! `s3:`); everything else goes to the local functions unchanged.

use std::path::Path;
use std::time::Duration;

use crate::checkpoint::gc::GcReport;
use crate::checkpoint::load::{Loaded, Picked, Survey};
use crate::checkpoint::save::{SaveReport, SaveRequest};
use crate::checkpoint::sharded::{ExportReport, ShardedError};
use crate::checkpoint::verify::Inspection;
use crate::checkpoint::CheckpointError;
use crate::s3::{is_s3_url, S3Error, S3Url};

/// The URL `path` names, when it names object storage.
pub fn remote_url(path: &Path) -> Result<Option<S3Url>, S3Error> {
    match path.to_str() {
        Some(text) if is_s3_url(text) => S3Url::parse(text).map(Some),
        _ => Ok(None),
    }
}

/// Whether `path` names object storage (`s3://...`, valid or not).
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(is_s3_url)
}

#[cfg(feature = "s3")]
use super::checkpoint as remote;

/// Without the `s3` feature an `s3://` URL cannot be reached.
#[cfg(not(feature = "s3"))]
fn not_built(url: &S3Url) -> CheckpointError {
    CheckpointError::Remote(S3Error::NotBuilt {
        url: url.to_string(),
    })
}

/// `save::save_waiting`, or the object-storage save (which takes no lock: the
/// conditional commit decides between writers; `on_wait` is never called). Attempts no
/// manifest names are removed by its cleanup once older than `grace` (default
/// [`crate::remote::checkpoint::DEFAULT_GRACE`] when `None`).
pub fn save_waiting(
    dir: &Path,
    req: SaveRequest<'_>,
    grace: Option<Duration>,
    on_wait: &mut dyn FnMut(&Path),
) -> Result<SaveReport, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::save::save_waiting(dir, req, on_wait),
        #[cfg(feature = "s3")]
        Some(url) => remote::save(&url, req, grace.unwrap_or(remote::DEFAULT_GRACE)),
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = (req, grace);
            Err(not_built(&url))
        }
    }
}

/// `save::save` wherever `dir` is.
pub fn save(dir: &Path, req: SaveRequest<'_>) -> Result<SaveReport, CheckpointError> {
    save_waiting(dir, req, None, &mut |_| {})
}

/// `load::load` wherever `dir` is.
pub fn load(dir: &Path, step: Option<u64>) -> Result<Loaded, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::load::load(dir, step),
        #[cfg(feature = "s3")]
        Some(url) => remote::load(&url, step),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url)),
    }
}

/// `load::load_unless_sharded` wherever `dir` is.
pub fn load_unless_sharded(
    dir: &Path,
    step: Option<u64>,
) -> Result<crate::checkpoint::load::Unsharded, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::load::load_unless_sharded(dir, step),
        #[cfg(feature = "s3")]
        Some(url) => remote::load_unless_sharded(&url, step),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url)),
    }
}

/// The global tensors of a sharded step directory, or of the sharded step at an
/// `s3://.../step-N` URL (for `st inspect`).
pub fn global_tensors(
    step_dir: &Path,
) -> Result<(u64, Vec<crate::checkpoint::sharded::open::GlobalTensor>), ShardedError> {
    match remote_url(step_dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::open::global_tensors(step_dir),
        #[cfg(feature = "s3")]
        Some(url) => remote::sharded::global_tensors(&url),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url).into()),
    }
}

/// `load::pick` wherever `dir` is.
pub fn pick(dir: &Path, step: Option<u64>) -> Result<Picked, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::load::pick(dir, step),
        #[cfg(feature = "s3")]
        Some(url) => remote::pick(&url, step),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url)),
    }
}

/// `load::survey_with` wherever `dir` is (`total` and `advance` report the bytes
/// hashed of a local directory; a remote survey reports none).
pub fn survey_with(
    dir: &Path,
    total: &mut dyn FnMut(u64),
    advance: &mut dyn FnMut(u64),
) -> Result<Survey, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::load::survey_with(dir, total, advance),
        #[cfg(feature = "s3")]
        Some(url) => remote::survey(&url),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url)),
    }
}

/// Verify one step directory (or the step at an `s3://.../step-N` URL).
pub fn inspect_step(
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Inspection, CheckpointError> {
    match remote_url(path)? {
        None => Ok(crate::checkpoint::verify::inspect_with(path, progress)),
        #[cfg(feature = "s3")]
        Some(url) => remote::inspect_step(&url),
        #[cfg(not(feature = "s3"))]
        Some(url) => Err(not_built(&url)),
    }
}

/// `gc::gc` wherever `dir` is; on object storage attempts no manifest names are
/// removed once older than `grace` (default
/// [`crate::remote::checkpoint::DEFAULT_GRACE`]).
pub fn gc(
    dir: &Path,
    keep: usize,
    dry_run: bool,
    grace: Option<Duration>,
) -> Result<GcReport, CheckpointError> {
    match remote_url(dir)? {
        None => crate::checkpoint::gc::gc(dir, keep, dry_run),
        #[cfg(feature = "s3")]
        Some(url) => remote::gc(&url, keep, dry_run, grace.unwrap_or(remote::DEFAULT_GRACE)),
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = (keep, dry_run, grace);
            Err(not_built(&url))
        }
    }
}

/// `sharded::export` of a local step directory, or of the step at an
/// `s3://.../step-N` URL: downloaded (hashed as it arrives) into a temporary step
/// directory beside `out_dir`, verified there by the local rules, exported, removed.
pub fn export(
    step_dir: &Path,
    out_dir: &Path,
    max_shard_bytes: Option<u64>,
) -> Result<ExportReport, ShardedError> {
    match remote_url(step_dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::export(step_dir, out_dir, max_shard_bytes),
        #[cfg(feature = "s3")]
        Some(url) => {
            let parent = match out_dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            let io_at = |path: &Path| {
                let path = path.to_path_buf();
                move |source| ShardedError::Io { path, source }
            };
            let scratch = tempfile::Builder::new()
                .prefix(".tlio-download-")
                .tempdir_in(&parent)
                .map_err(io_at(&parent))?;
            let local = scratch.path().join(url.name());
            remote::download_step(&url, &local)?;
            let problems = crate::checkpoint::verify::verify(&local);
            if let Some(p) = problems.first() {
                return Err(ShardedError::Request(format!("{url} does not verify: {p}")));
            }
            crate::checkpoint::sharded::export(&local, out_dir, max_shard_bytes)
        }
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = (out_dir, max_shard_bytes);
            Err(not_built(&url).into())
        }
    }
}

/// A sharded save in progress, local (`step-N.tmp/` under the lock) or on object storage
/// (an attempt drawn after the refusals).
#[derive(Debug)]
pub enum ShardedSaveAt {
    /// In a local (or shared file-system) directory.
    Local(crate::checkpoint::sharded::ShardedSave),
    /// Under an `s3://` prefix.
    #[cfg(feature = "s3")]
    Remote(remote::sharded::RemoteSave),
}

impl ShardedSaveAt {
    /// Where every rank writes its files: `step-N.tmp/`, or the attempt's URL.
    pub fn tmp_dir(&self) -> Option<&Path> {
        match self {
            ShardedSaveAt::Local(s) => s.tmp_dir(),
            #[cfg(feature = "s3")]
            ShardedSaveAt::Remote(s) => s.tmp_dir(),
        }
    }

    /// The token every rank checks before writing into a local `tmp_dir`
    /// (`sharded::check_shared`); none on object storage, one store for every host.
    pub fn probe(&self) -> Option<&str> {
        match self {
            ShardedSaveAt::Local(s) => Some(s.probe()),
            #[cfg(feature = "s3")]
            ShardedSaveAt::Remote(_) => None,
        }
    }

    /// Check and commit (see the two protocols).
    pub fn commit(
        &mut self,
        req: crate::checkpoint::sharded::CommitRequest,
    ) -> Result<SaveReport, ShardedError> {
        match self {
            ShardedSaveAt::Local(s) => s.commit(req),
            #[cfg(feature = "s3")]
            ShardedSaveAt::Remote(s) => s.commit(req),
        }
    }

    /// Remove what the ranks wrote; nothing is committed. Idempotent.
    pub fn abort(&mut self) {
        match self {
            ShardedSaveAt::Local(s) => s.abort(),
            #[cfg(feature = "s3")]
            ShardedSaveAt::Remote(s) => s.abort(),
        }
    }
}

/// `sharded::begin` wherever `dir` is (on object storage no lock is taken: the
/// conditional commit decides between writers).
pub fn sharded_begin(
    dir: &Path,
    step: u64,
    overwrite: bool,
) -> Result<ShardedSaveAt, ShardedError> {
    match remote_url(dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::begin(dir, step, overwrite).map(ShardedSaveAt::Local),
        #[cfg(feature = "s3")]
        Some(url) => {
            remote::sharded::RemoteSave::begin(&url, step, overwrite).map(ShardedSaveAt::Remote)
        }
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = (step, overwrite);
            Err(not_built(&url).into())
        }
    }
}

/// `sharded::write_rank_file` wherever `tmp_dir` is (on object storage: the attempt's
/// URL that [`ShardedSaveAt::tmp_dir`] gave; `durable` is then moot, an object exists
/// only once stored).
pub fn sharded_write_rank_file(
    tmp_dir: &Path,
    name: &str,
    chunks: &[crate::checkpoint::sharded::ChunkData<'_>],
    durable: bool,
) -> Result<crate::checkpoint::sharded::RankFile, ShardedError> {
    match remote_url(tmp_dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::write_rank_file(tmp_dir, name, chunks, durable),
        #[cfg(feature = "s3")]
        Some(_) => remote::sharded::write_rank_file(tmp_dir, name, chunks),
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = (name, chunks, durable);
            Err(not_built(&url).into())
        }
    }
}

/// `sharded::open_step` wherever `dir` is.
pub fn sharded_open_step(
    dir: &Path,
    step: Option<u64>,
) -> Result<crate::checkpoint::sharded::ShardedStep, ShardedError> {
    match remote_url(dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::open_step(dir, step),
        #[cfg(feature = "s3")]
        Some(url) => remote::sharded::open_step(&url, step),
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = step;
            Err(not_built(&url).into())
        }
    }
}

/// `sharded::open::open_step_below` wherever `dir` is: the step a `step=None` choice
/// picks among those older than `below` (another rank found `below` damaged).
pub fn sharded_open_step_below(
    dir: &Path,
    below: u64,
) -> Result<crate::checkpoint::sharded::ShardedStep, ShardedError> {
    match remote_url(dir).map_err(CheckpointError::from)? {
        None => crate::checkpoint::sharded::open::open_step_below(dir, below),
        #[cfg(feature = "s3")]
        Some(url) => remote::sharded::open_step_below(&url, below),
        #[cfg(not(feature = "s3"))]
        Some(url) => {
            let _ = below;
            Err(not_built(&url).into())
        }
    }
}
