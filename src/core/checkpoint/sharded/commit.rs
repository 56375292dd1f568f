//! Rank 0's side of a sharded save: [`begin`] takes the checkpoint lock, applies the
//! refusals of an unsharded save and creates a fresh `step-N.tmp/`; the ranks write
//! their files into it; [`ShardedSave::commit`] checks the chunk table (coverage, every
//! chunk in a file that holds it at the byte range the rank reported, every file's size
//! and header as reported, no stray file), writes `shards.json`, the trainer state and
//! the config, the manifest last, and publishes with checkpoint.md's protocol.
//!
//! Invariants: the lock is held from `begin` until the commit or abort ends (or the
//! value is dropped); a failed commit or an abort removes the tmp directory and
//! commits nothing; the data files are never re-read whole (their sha256 and piece
//! digests were computed while they were written), only their headers are checked.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::table::{ChunkEntry, Group, ShardsTable, TableTensor};
use super::write::RankFile;
use super::{io_at, table_err, ShardedError, PIECE_BYTES, SHARDS_NAME};
use crate::checkpoint::fsops::{open_no_follow, FsOps, RealFs};
use crate::checkpoint::manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
use crate::checkpoint::save::{clear, prepare, publish, put, state_bytes, Payload, Target};
use crate::checkpoint::state::TrainerState;
use crate::checkpoint::{
    io_at as ck_io_at, CheckpointError, DirLock, SaveReport, CONFIG_NAME, SAVE_LOCK_NOTICE,
    SAVE_LOCK_WAIT, STATE_NAME,
};
use crate::safetensors::dtype::Dtype;
use crate::safetensors::header::read_header_from;
use crate::safetensors::Header;

/// One chunk of a global tensor as the ranks report it (before the byte ranges and
/// digests are filled in from the files' tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRequest {
    /// Where it starts in the global tensor.
    pub offsets: Vec<u64>,
    /// Its shape.
    pub sizes: Vec<u64>,
    /// The rank file holding it.
    pub file: String,
    /// Its key in that file.
    pub key: String,
}

/// One global tensor and where its chunks were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRequest {
    /// Its group.
    pub group: Group,
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its global shape.
    pub shape: Vec<u64>,
    /// Its chunks.
    pub chunks: Vec<ChunkRequest>,
}

/// What rank 0 commits besides the data files.
#[derive(Debug, Clone)]
pub struct CommitRequest {
    /// Every rank file written (the tables `write_rank_file` returned).
    pub files: Vec<RankFile>,
    /// Every global tensor.
    pub tensors: Vec<TensorRequest>,
    /// String metadata per group.
    pub meta: BTreeMap<Group, BTreeMap<String, String>>,
    /// The trainer state; its step must be the save's.
    pub state: TrainerState,
    /// `config.json` bytes, when the run has a config.
    pub config: Option<Vec<u8>>,
    /// Keep only the newest `keep` valid steps.
    pub keep: Option<usize>,
}

/// A sharded save in progress: the lock held and `step-N.tmp/` created.
#[derive(Debug)]
pub struct ShardedSave {
    dir: PathBuf,
    step: u64,
    target: Option<Target>,
    lock: Option<DirLock>,
    /// A directory of the caller's name (`named::begin_named`): published without
    /// LATEST or retention.
    named: bool,
    /// The token of the probe in the tmp directory (`shared`).
    probe: String,
}

/// Start a sharded save of `step` in `dir` with the real file system, waiting up to
/// [`SAVE_LOCK_WAIT`] for another save or gc. A directory on object storage is
/// `remote::location::sharded_begin`'s.
pub fn begin(dir: &Path, step: u64, overwrite: bool) -> Result<ShardedSave, ShardedError> {
    begin_with(&mut RealFs, dir, step, overwrite, SAVE_LOCK_WAIT)
}

/// [`begin`] through `fs`, waiting up to `lock_wait` for the lock.
pub fn begin_with(
    fs: &mut dyn FsOps,
    dir: &Path,
    step: u64,
    overwrite: bool,
    lock_wait: std::time::Duration,
) -> Result<ShardedSave, ShardedError> {
    super::refuse_remote(dir)?;
    fs.create_dir_all(dir).map_err(ck_io_at(dir))?;
    let lock = DirLock::acquire_waiting(dir, lock_wait, SAVE_LOCK_NOTICE, &mut |_| {})?;
    let target = prepare(fs, dir, step, overwrite, false)?;
    let probe = probe_or_clear(fs, &target.tmp)?;
    Ok(ShardedSave {
        dir: dir.to_path_buf(),
        step,
        target: Some(target),
        lock: Some(lock),
        named: false,
        probe,
    })
}

/// The probe of a fresh `tmp` (`shared::write_probe`); `tmp` removed when it fails.
pub(crate) fn probe_or_clear(fs: &mut dyn FsOps, tmp: &Path) -> Result<String, ShardedError> {
    super::shared::write_probe(tmp).inspect_err(|_| {
        let _ = clear(fs, tmp);
    })
}

impl ShardedSave {
    /// A save into `target` under `dir`'s lock, published by rename only (no LATEST).
    pub(crate) fn named(
        dir: &Path,
        step: u64,
        target: Target,
        lock: DirLock,
        probe: String,
    ) -> Self {
        ShardedSave {
            dir: dir.to_path_buf(),
            step,
            target: Some(target),
            lock: Some(lock),
            named: true,
            probe,
        }
    }
}

impl ShardedSave {
    /// The step being saved.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// `step-N.tmp/`, where every rank writes its files.
    pub fn tmp_dir(&self) -> Option<&Path> {
        self.target.as_ref().map(|t| t.tmp.as_path())
    }

    /// The token every rank checks in `tmp_dir` before writing ([`super::check_shared`]).
    pub fn probe(&self) -> &str {
        &self.probe
    }

    /// Remove the tmp directory and release the lock; nothing is committed. Doing it
    /// twice does nothing.
    pub fn abort(&mut self) {
        self.abort_with(&mut RealFs);
    }

    fn abort_with(&mut self, fs: &mut dyn FsOps) {
        if let Some(t) = self.target.take() {
            // Best effort: a leftover tmp directory is removed by the next save or gc.
            let _ = clear(fs, &t.tmp);
        }
        self.lock = None;
    }

    /// Commit with the real file system.
    pub fn commit(&mut self, req: CommitRequest) -> Result<SaveReport, ShardedError> {
        self.commit_with(&mut RealFs, req)
    }

    /// Check the table and the files, write the small files and the manifest, publish.
    /// On any error the tmp directory is removed and the lock released.
    pub fn commit_with(
        &mut self,
        fs: &mut dyn FsOps,
        req: CommitRequest,
    ) -> Result<SaveReport, ShardedError> {
        let Some(target) = self.target.take() else {
            return Err(ShardedError::Request(
                "this sharded save was already committed or aborted".into(),
            ));
        };
        let result = commit_target(fs, &self.dir, self.step, &target, req, self.named);
        if result.is_err() {
            let _ = clear(fs, &target.tmp);
        }
        self.lock = None;
        result
    }
}

impl Drop for ShardedSave {
    fn drop(&mut self) {
        self.abort();
    }
}

fn commit_target(
    fs: &mut dyn FsOps,
    dir: &Path,
    step: u64,
    target: &Target,
    req: CommitRequest,
    named: bool,
) -> Result<SaveReport, ShardedError> {
    let CommitRequest {
        files,
        tensors,
        meta,
        mut state,
        config,
        keep,
    } = req;
    let state_json = state_bytes(step, &mut state, config.as_deref(), keep)?;
    let table = build_table(&files, tensors, meta)?;
    super::shared::remove_probe(&target.tmp)?;
    check_tmp_files(&target.tmp, &files)?;
    let mut entries: Vec<ManifestEntry> = files
        .iter()
        .map(|f| ManifestEntry {
            name: f.name.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
        })
        .collect();
    let tmp = &target.tmp;
    entries.push(put(
        fs,
        tmp,
        SHARDS_NAME,
        Payload::Bytes(Cow::Owned(table.to_json_checked()?)),
    )?);
    entries.push(put(
        fs,
        tmp,
        STATE_NAME,
        Payload::Bytes(Cow::Owned(state_json)),
    )?);
    if let Some(config) = config {
        entries.push(put(
            fs,
            tmp,
            CONFIG_NAME,
            Payload::Bytes(Cow::Owned(config)),
        )?);
    }
    let manifest =
        Manifest::new(step, entries).map_err(|e| CheckpointError::Request(e.to_string()))?;
    let bytes = manifest.to_json();
    let path = tmp.join(MANIFEST_NAME);
    fs.write_file(&path, &mut |w: &mut dyn Write| w.write_all(&bytes))
        .map_err(ck_io_at(&path))?;
    fs.fsync_file(&path).map_err(ck_io_at(&path))?;
    fs.fsync_dir(tmp).map_err(ck_io_at(tmp))?;
    let (removed, cleanup_problems) = if named {
        super::named::publish_named(fs, dir, target)?
    } else {
        publish(fs, dir, step, target, keep)?
    };
    Ok(SaveReport {
        path: target.final_path.clone(),
        step,
        files: manifest.files,
        removed,
        cleanup_problems,
    })
}

/// The chunk table from the tensors and the files' tables: every chunk in a file that
/// holds its key with the tensor's dtype and the chunk's shape, every key of every file
/// used by exactly one chunk; then the table's own rules (coverage).
pub fn build_table(
    files: &[RankFile],
    tensors: Vec<TensorRequest>,
    meta: BTreeMap<Group, BTreeMap<String, String>>,
) -> Result<ShardsTable, ShardedError> {
    let mut by_name: BTreeMap<&str, &RankFile> = BTreeMap::new();
    for f in files {
        super::write::check_file_name(&f.name)?;
        if by_name.insert(f.name.as_str(), f).is_some() {
            return Err(table_err(format!("rank file {}", f.name), "reported twice"));
        }
    }
    // Borrowed from the files' own tables: one entry per chunk, no copy of its names.
    let mut used: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let label = format!("tensor {}/{}", t.group, t.name);
        let mut chunks = Vec::with_capacity(t.chunks.len());
        for c in t.chunks {
            let at =
                |reason: String| table_err(format!("{label}: chunk at {:?}", c.offsets), reason);
            let file = by_name
                .get(c.file.as_str())
                .ok_or_else(|| at(format!("its file {:?} was not written by any rank", c.file)))?;
            let (key, w) = file
                .tensors
                .get_key_value(&c.key)
                .ok_or_else(|| at(format!("{} holds no key {:?}", c.file, c.key)))?;
            if w.dtype != t.dtype || w.shape != c.sizes {
                return Err(at(format!(
                    "{} holds {:?} as {} {:?}, not {} {:?}",
                    c.file, c.key, w.dtype, w.shape, t.dtype, c.sizes
                )));
            }
            if !used.insert((file.name.as_str(), key.as_str())) {
                return Err(at(format!("{} key {:?} is claimed twice", c.file, c.key)));
            }
            chunks.push(ChunkEntry {
                offsets: c.offsets,
                sizes: c.sizes,
                file: c.file,
                key: c.key,
                begin: w.begin,
                end: w.end,
                pieces: w.pieces.clone(),
            });
        }
        out.push(TableTensor {
            group: t.group,
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            chunks,
        });
    }
    for f in files {
        if let Some(key) = f
            .tensors
            .keys()
            .find(|k| !used.contains(&(f.name.as_str(), k.as_str())))
        {
            return Err(table_err(
                format!("rank file {}", f.name),
                format!("holds {key:?}, which no chunk of the table names"),
            ));
        }
    }
    ShardsTable::new(PIECE_BYTES, meta, out)
}

/// The tmp directory holds exactly the reported files, each a regular file of the
/// reported size whose header places every key where its rank said.
fn check_tmp_files(tmp: &Path, files: &[RankFile]) -> Result<(), ShardedError> {
    let mut found = BTreeSet::new();
    for entry in fs::read_dir(tmp).map_err(io_at(tmp))? {
        let entry = entry.map_err(io_at(tmp))?;
        found.insert(entry.file_name().to_string_lossy().into_owned());
    }
    check_file_set(&found, files, &|stray| {
        format!("{}", tmp.join(stray).display())
    })?;
    for f in files {
        check_rank_header(&tmp.join(&f.name), f)?;
    }
    Ok(())
}

/// The files `found` where the ranks wrote are exactly the files they reported;
/// `at` names a stray one.
pub(crate) fn check_file_set(
    found: &BTreeSet<String>,
    files: &[RankFile],
    at: &dyn Fn(&str) -> String,
) -> Result<(), ShardedError> {
    let reported: BTreeSet<String> = files.iter().map(|f| f.name.clone()).collect();
    if let Some(stray) = found.difference(&reported).next() {
        return Err(table_err(at(stray), "a file no rank reported"));
    }
    if let Some(missing) = reported.difference(found).next() {
        return Err(table_err(
            format!("rank file {missing}"),
            "reported but not in the step directory",
        ));
    }
    Ok(())
}

/// One rank file: its size and header as its rank reported.
fn check_rank_header(path: &Path, f: &RankFile) -> Result<(), ShardedError> {
    let mut file = open_no_follow(path).map_err(io_at(path))?;
    let size = file.metadata().map_err(io_at(path))?.len();
    let mismatch = |reason: String| table_err(format!("rank file {}", f.name), reason);
    if size != f.size {
        return Err(mismatch(format!(
            "has {size} bytes, its rank reported {}",
            f.size
        )));
    }
    let header = read_header_from(&mut file, size).map_err(|e| match e {
        crate::safetensors::header::ReadFailure::Io(source) => io_at(path)(source),
        crate::safetensors::header::ReadFailure::Invalid(source) => ShardedError::Safetensors {
            path: path.to_path_buf(),
            source,
        },
    })?;
    check_reported_header(&header, f)
}

/// A rank file's header (as read back from storage) places every key where its rank
/// reported it, and holds nothing else.
pub(crate) fn check_reported_header(header: &Header, f: &RankFile) -> Result<(), ShardedError> {
    let mismatch = |reason: String| table_err(format!("rank file {}", f.name), reason);
    if header.len() != f.tensors.len() {
        return Err(mismatch(format!(
            "holds {} tensors, its rank reported {}",
            header.len(),
            f.tensors.len()
        )));
    }
    let start = header.data_start();
    for (key, w) in &f.tensors {
        let ok = header.get(key).is_some_and(|info| {
            info.dtype == w.dtype
                && info.shape == w.shape
                && start.checked_add(info.data_offsets.0) == Some(w.begin)
                && start.checked_add(info.data_offsets.1) == Some(w.end)
        });
        if !ok {
            return Err(mismatch(format!(
                "its header does not hold {key:?} where its rank reported it"
            )));
        }
    }
    Ok(())
}
