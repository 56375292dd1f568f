//! Opening a step for region reads: the step `load` would pick (LATEST, else the
//! newest older step that passes; with a step, that one and no other), with
//! a check that reads little for a sharded step and everything once for an unsharded
//! one.
//!
//! For a sharded step the check covers the directory (no symlink, no unlisted or
//! missing file), the manifest, every small JSON file by its sha256 (the trainer state
//! and config by their schema), every data file's size, the chunk table's rules and
//! every chunk against its file's header; the data files are opened here, once
//! (`O_NOFOLLOW`), and every later read comes from these descriptors and is verified
//! piece by piece. For an unsharded step the model and optimizer files are read whole
//! into memory through sha256, so what is read later is exactly what was hashed.
//!
//! Invariants: nothing outside the step directory is opened; a step that fails any
//! check is skipped with its first problem as the reason, as `load` does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::table::{Group, ShardsTable};
use super::{ShardedError, PIECE_BYTES, SHARDS_NAME};
use crate::checkpoint::fsops::open_no_follow;
use crate::checkpoint::manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
use crate::checkpoint::state::TrainerState;
use crate::checkpoint::verify::MAX_JSON_BYTES;
use crate::checkpoint::{
    list, parse_step_name, step_name, CheckpointError, Latest, CONFIG_NAME, MODEL_NAME,
    OPTIMIZER_NAME, STATE_NAME,
};
use crate::digest::hex;
use crate::safetensors::dtype::Dtype;
use crate::safetensors::header::{parse_header, read_header_from, ReadFailure};
use crate::safetensors::Header;

/// Largest manifest read.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Where a data file's bytes come from.
#[derive(Debug)]
pub(crate) enum Source {
    /// A sharded step's data file, opened once; reads are verified by piece digests.
    File(File),
    /// An unsharded step's file, read whole through its sha256.
    Owned(Vec<u8>),
    /// An unsharded step's file, hashed whole through this descriptor when opened.
    Verified(File),
    /// A sharded step's data object on object storage; reads are range requests,
    /// verified by piece digests.
    #[cfg(feature = "s3")]
    Remote {
        /// The bucket's client.
        store: std::sync::Arc<crate::s3::Store>,
        /// The object's key.
        key: String,
    },
}

/// One data file of an opened step.
#[derive(Debug)]
pub(crate) struct DataFile {
    /// Its name in the step directory.
    pub name: String,
    /// Its bytes.
    pub source: Source,
}

/// One chunk of an opened step.
#[derive(Debug, Clone)]
pub(crate) struct StepChunk {
    pub offsets: Vec<u64>,
    pub sizes: Vec<u64>,
    /// Index into the step's files.
    pub file: usize,
    pub begin: u64,
    pub end: u64,
    /// The piece digests (none for an owned, already verified source).
    pub pieces: Vec<[u8; 32]>,
}

impl super::plan::ChunkBox for StepChunk {
    fn chunk_box(&self) -> super::plan::Region<'_> {
        super::plan::Region {
            offsets: &self.offsets,
            sizes: &self.sizes,
        }
    }
}

/// One global tensor of an opened step.
#[derive(Debug, Clone)]
pub(crate) struct StepTensor {
    pub group: Group,
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub chunks: Vec<StepChunk>,
    /// The longest extent of a chunk along dimension 0 (`plan::longest_extent`), which
    /// bounds a region's search for its chunks.
    pub longest: u64,
}

impl StepTensor {
    /// The global tensor's bytes (its size was checked when the step was opened).
    pub fn byte_len(&self) -> u64 {
        crate::safetensors::dtype::byte_len(self.dtype, &self.shape).unwrap_or(0)
    }

    /// `group/name`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.group, self.name)
    }
}

/// A step opened for region reads.
#[derive(Debug)]
pub struct ShardedStep {
    /// The step directory.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// Whether it is a sharded step (else today's unsharded format).
    pub sharded: bool,
    /// `trainer_state.json`.
    pub state: TrainerState,
    /// `config.json`, when present.
    pub config: Option<Vec<u8>>,
    /// What was refused on the way to this step, newest first (as `load` reports).
    pub skipped: Vec<(String, String)>,
    /// String metadata per group (an unsharded step: each file's metadata).
    pub meta: BTreeMap<Group, BTreeMap<String, String>>,
    pub(crate) piece_bytes: u64,
    pub(crate) tensors: Vec<StepTensor>,
    pub(crate) files: Vec<DataFile>,
}

impl ShardedStep {
    /// Every global tensor: (group, name) -> (dtype, global shape), sorted.
    pub fn tensors(&self) -> Vec<(Group, &str, Dtype, &[u64])> {
        self.tensors
            .iter()
            .map(|t| (t.group, t.name.as_str(), t.dtype, t.shape.as_slice()))
            .collect()
    }

    /// The tensor of `group` named `name`.
    pub(crate) fn tensor(&self, group: Group, name: &str) -> Option<&StepTensor> {
        self.tensors
            .binary_search_by(|t| (t.group, t.name.as_bytes()).cmp(&(group, name.as_bytes())))
            .ok()
            .and_then(|i| self.tensors.get(i))
    }
}

/// Open the step `load` would pick from `dir` (or, with `step`, exactly that step: a
/// missing or damaged one is [`CheckpointError::NotFound`] naming why, never another).
pub fn open_step(dir: &Path, step: Option<u64>) -> Result<ShardedStep, ShardedError> {
    open_chosen(dir, step, None)
}

/// Open the step `load`'s rules for no named step pick among those older than `below`
/// (`LATEST` still bounds them): the next candidate once step `below` was found
/// damaged elsewhere (another rank of a collective load), with no reason listed for a
/// step that does not exist.
pub fn open_step_below(dir: &Path, below: u64) -> Result<ShardedStep, ShardedError> {
    open_chosen(dir, None, Some(below))
}

fn open_chosen(
    dir: &Path,
    step: Option<u64>,
    below: Option<u64>,
) -> Result<ShardedStep, ShardedError> {
    super::refuse_remote(dir)?;
    let listing = list(dir)?;
    let mut reasons: Vec<(String, String)> = Vec::new();
    let mut newer = Vec::new();
    let tried: Vec<u64> = match step {
        Some(n) if listing.steps.contains(&n) => vec![n],
        Some(n) => {
            reasons.push((step_name(n), "does not exist".to_string()));
            Vec::new()
        }
        None => {
            match listing.latest() {
                Latest::Names(n) if !listing.steps.contains(&n) => reasons.push((
                    "LATEST".to_string(),
                    format!("names {}, which does not exist", step_name(n)),
                )),
                Latest::Malformed(why) => reasons.push(("LATEST".to_string(), why)),
                _ => {}
            }
            let bound = listing.latest().step();
            let (ok, later): (Vec<u64>, Vec<u64>) = listing
                .steps
                .iter()
                .rev()
                .filter(|&&k| below.is_none_or(|b| k < b))
                .partition(|&&k| bound.is_none_or(|b| k <= b));
            newer = later;
            ok
        }
    };
    for k in tried {
        match open_one(&dir.join(step_name(k)), k) {
            Ok(mut s) => {
                s.skipped = reasons;
                return Ok(s);
            }
            Err(why) => reasons.push((step_name(k), why)),
        }
    }
    for n in newer.into_iter().rev() {
        reasons.push((
            step_name(n),
            "newer than LATEST (never declared complete)".to_string(),
        ));
    }
    Err(CheckpointError::NotFound {
        dir: dir.to_path_buf(),
        reasons,
    }
    .into())
}

/// What the light check of a step directory found.
pub(crate) struct Checked {
    /// The manifest (its step checked).
    pub manifest: Manifest,
    /// Every listed JSON file's bytes, checked by sha256.
    pub small: BTreeMap<String, Vec<u8>>,
}

/// Where an opened step's data files come from: a step directory, or an attempt on
/// object storage. Sizes are checked against the manifest entry by both methods.
pub(crate) trait StepFiles {
    /// A sharded step's data file, opened for verified region reads, and its header.
    fn data(&self, e: &ManifestEntry) -> Result<(Source, Header), String>;
    /// An unsharded step's file checked whole by its sha256 (kept open and streamed
    /// when `streamed`, else read into memory), and its header when it has one.
    fn whole(
        &self,
        e: &ManifestEntry,
        streamed: bool,
    ) -> Result<(Source, Result<Header, String>), String>;
}

/// The data files of a local step directory.
struct LocalFiles<'a>(&'a Path);

impl StepFiles for LocalFiles<'_> {
    fn data(&self, e: &ManifestEntry) -> Result<(Source, Header), String> {
        open_data(&self.0.join(&e.name), e).map(|(f, h)| (Source::File(f), h))
    }

    fn whole(
        &self,
        e: &ManifestEntry,
        streamed: bool,
    ) -> Result<(Source, Result<Header, String>), String> {
        let path = self.0.join(&e.name);
        if streamed {
            return hash_open(&path, e);
        }
        let (bytes, sha) = read_hashed(&path, e)?;
        if sha != e.sha256 {
            return Err(sha_problem(e, &sha));
        }
        Ok(owned(e, bytes))
    }
}

/// An unsharded step's file whose bytes were checked by sha256, and its header.
pub(crate) fn owned(e: &ManifestEntry, bytes: Vec<u8>) -> (Source, Result<Header, String>) {
    let header = parse_header(&bytes).map_err(|err| header_problem(e, &err));
    (Source::Owned(bytes), header)
}

/// A data file's header that breaks a reader rule, as a reason.
pub(crate) fn header_problem(
    e: &ManifestEntry,
    err: &crate::safetensors::SafetensorsError,
) -> String {
    format!(
        "{} breaks a safetensors reader rule: {}",
        e.name,
        crate::failure::full_text(err)
    )
}

/// Open one step directory, or say why it does not pass.
pub(crate) fn open_one(path: &Path, step: u64) -> Result<ShardedStep, String> {
    open_dir(path, step, false)
}

/// [`open_one`]; with `streamed`, an unsharded step's data files are hashed through
/// their descriptors and kept open instead of read into memory (for `export`, whose
/// memory must stay bounded).
pub(crate) fn open_dir(path: &Path, step: u64, streamed: bool) -> Result<ShardedStep, String> {
    let checked = check_dir(path, step)?;
    let mut out = open_checked(&checked, step, &LocalFiles(path), streamed)?;
    out.path = path.to_path_buf();
    Ok(out)
}

/// A step whose manifest and small files passed the light check, opened from `files`:
/// the trainer state and config by their rules, then the data files (sharded: the
/// table against every file's header; unsharded: every file checked whole).
pub(crate) fn open_checked(
    checked: &Checked,
    step: u64,
    files: &dyn StepFiles,
    streamed: bool,
) -> Result<ShardedStep, String> {
    let state = checked
        .small
        .get(STATE_NAME)
        .ok_or_else(|| format!("MANIFEST.json does not list {STATE_NAME}"))
        .and_then(|b| TrainerState::from_json(b).map_err(|e| bad_json(STATE_NAME, &e)))?;
    if state.step != step {
        return Err(bad_json(
            STATE_NAME,
            &format!("step {} differs from the manifest's {step}", state.step),
        ));
    }
    let config = checked.small.get(CONFIG_NAME).cloned();
    if let Some(c) = &config {
        let sha = crate::digest::sha256_hex(c);
        if state.config_sha256.as_deref() != Some(sha.as_str()) {
            return Err(bad_json(
                STATE_NAME,
                &format!("config_sha256 is not the sha256 of config.json ({sha})"),
            ));
        }
    }
    let mut out = if checked.manifest.get(SHARDS_NAME).is_some() {
        open_sharded(checked, files)?
    } else {
        open_unsharded(checked, files, streamed)?
    };
    out.step = step;
    out.state = state;
    out.config = config;
    Ok(out)
}

fn bad_json(name: &str, e: &dyn std::fmt::Display) -> String {
    format!("{name} is malformed: {e}")
}

/// The directory, the manifest, every listed file's presence, kind and size, and the
/// small JSON files by their sha256.
fn check_dir(path: &Path, step: u64) -> Result<Checked, String> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err("not a directory (symbolic links are not followed)".into()),
        Err(e) => return Err(format!("cannot read .: {e}")),
    }
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(path).map_err(|e| format!("cannot read .: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot read .: {e}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ft = entry
            .file_type()
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        if ft.is_symlink() {
            return Err(format!("{name} is a symbolic link (not followed)"));
        }
        if !ft.is_file() {
            return Err(format!("{name} is not a regular file"));
        }
        names.insert(name);
    }
    if !names.contains(MANIFEST_NAME) {
        return Err("missing MANIFEST.json".into());
    }
    let bytes = crate::files::read_limited(&path.join(MANIFEST_NAME), MAX_MANIFEST_BYTES)
        .map_err(|e| format!("invalid MANIFEST.json: {e}"))?;
    let manifest =
        Manifest::from_json(&bytes).map_err(|e| format!("invalid MANIFEST.json: {e}"))?;
    if manifest.step != step {
        return Err(format!(
            "MANIFEST.json says step {}, the directory is step {step}",
            manifest.step
        ));
    }
    if let Some(extra) = names
        .iter()
        .find(|n| n.as_str() != MANIFEST_NAME && manifest.get(n).is_none())
    {
        return Err(format!("unlisted file {extra}"));
    }
    let mut small = BTreeMap::new();
    for e in &manifest.files {
        if !names.contains(&e.name) {
            return Err(format!("{} is missing", e.name));
        }
        if e.name.ends_with(".json") {
            small.insert(e.name.clone(), read_small(path, e)?);
        }
    }
    Ok(Checked { manifest, small })
}

/// A listed JSON file, read whole (within its limit) and checked against its entry.
fn read_small(dir: &Path, e: &ManifestEntry) -> Result<Vec<u8>, String> {
    small_limit(e)?;
    let (bytes, sha) = read_hashed(&dir.join(&e.name), e)?;
    check_small(e, bytes, &sha)
}

/// The most bytes a listed JSON file may have (the chunk table has its own limit); a
/// larger entry is a problem.
pub(crate) fn small_limit(e: &ManifestEntry) -> Result<u64, String> {
    let limit = if e.name == SHARDS_NAME {
        super::table::MAX_TABLE_BYTES
    } else {
        MAX_JSON_BYTES
    };
    if e.size > limit {
        return Err(format!(
            "{} is malformed: larger than {limit} bytes",
            e.name
        ));
    }
    Ok(limit)
}

/// A listed JSON file's bytes (of sha256 `sha`) against its entry and the JSON rules.
pub(crate) fn check_small(e: &ManifestEntry, bytes: Vec<u8>, sha: &str) -> Result<Vec<u8>, String> {
    if bytes.len() as u64 != e.size {
        return Err(size_problem(e, bytes.len() as u64));
    }
    if sha != e.sha256 {
        return Err(sha_problem(e, sha));
    }
    if e.name != STATE_NAME && e.name != SHARDS_NAME {
        serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
            .map_err(|err| bad_json(&e.name, &err))?;
    }
    Ok(bytes)
}

pub(crate) fn sha_problem(e: &ManifestEntry, actual: &str) -> String {
    format!(
        "{} sha256 mismatch: MANIFEST.json says {}, the file has {actual}",
        e.name, e.sha256
    )
}

pub(crate) fn size_problem(e: &ManifestEntry, actual: u64) -> String {
    format!(
        "{} has {actual} bytes, MANIFEST.json says {}",
        e.name, e.size
    )
}

/// A listed file read whole through sha256, its size checked before and after.
fn read_hashed(path: &Path, e: &ManifestEntry) -> Result<(Vec<u8>, String), String> {
    let unreadable = |err: std::io::Error| format!("cannot read {}: {err}", e.name);
    let file = open_no_follow(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    if size != e.size {
        return Err(size_problem(e, size));
    }
    let cap = usize::try_from(size).map_err(|_| size_problem(e, size))?;
    let mut bytes = Vec::with_capacity(cap);
    file.take(e.size.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 != e.size {
        return Err(size_problem(e, bytes.len() as u64));
    }
    // Hash on the pool in parallel slices? No: sha256 is sequential; one pass.
    let sha = hex(&Sha256::digest(&bytes));
    Ok((bytes, sha))
}

/// A sharded step: the table, every data file opened once and checked against it.
fn open_sharded(checked: &Checked, source: &dyn StepFiles) -> Result<ShardedStep, String> {
    let table_bytes = checked
        .small
        .get(SHARDS_NAME)
        .ok_or_else(|| format!("MANIFEST.json does not list {SHARDS_NAME}"))?;
    let table = ShardsTable::from_json(table_bytes).map_err(|e| e.to_string())?;
    let data: BTreeSet<&str> = checked
        .manifest
        .files
        .iter()
        .map(|e| e.name.as_str())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    let named = table.files();
    if let Some(f) = named.difference(&data).next() {
        return Err(format!(
            "{SHARDS_NAME} names {f}, which MANIFEST.json does not list"
        ));
    }
    if let Some(f) = data.difference(&named).next() {
        return Err(format!("{f} is listed but holds no chunk of {SHARDS_NAME}"));
    }
    let mut files = Vec::with_capacity(named.len());
    let mut headers = BTreeMap::new();
    for name in &named {
        let e = checked
            .manifest
            .get(name)
            .ok_or_else(|| format!("MANIFEST.json does not list {name}"))?;
        let (opened, header) = source.data(e)?;
        headers.insert(*name, (files.len(), header));
        files.push(DataFile {
            name: (*name).to_string(),
            source: opened,
        });
    }
    let tensors = super::verify::step_tensors(&table, &headers)?;
    Ok(ShardedStep {
        path: PathBuf::new(),
        step: 0,
        sharded: true,
        state: TrainerState::new(0),
        config: None,
        skipped: Vec::new(),
        meta: table.meta.clone(),
        piece_bytes: table.piece_bytes,
        tensors,
        files,
    })
}

/// Open a data file (no symlink), check its size, read its header.
pub(crate) fn open_data(path: &Path, e: &ManifestEntry) -> Result<(File, Header), String> {
    let unreadable = |err: std::io::Error| format!("cannot read {}: {err}", e.name);
    let mut file = open_no_follow(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    if size != e.size {
        return Err(size_problem(e, size));
    }
    let header = read_header_from(&mut file, size).map_err(|err| match err {
        ReadFailure::Io(err) => unreadable(err),
        ReadFailure::Invalid(err) => format!(
            "{} breaks a safetensors reader rule: {}",
            e.name,
            crate::failure::full_text(&err)
        ),
    })?;
    Ok((file, header))
}

/// An unsharded step: the model and optimizer files read whole through sha256, every
/// other listed file hashed; one chunk per tensor.
fn open_unsharded(
    checked: &Checked,
    source: &dyn StepFiles,
    streamed: bool,
) -> Result<ShardedStep, String> {
    if checked.manifest.get(MODEL_NAME).is_none() {
        return Err(format!("MANIFEST.json does not list {MODEL_NAME}"));
    }
    let mut files = Vec::new();
    let mut tensors = Vec::new();
    let mut meta = BTreeMap::new();
    for e in &checked.manifest.files {
        if e.name.ends_with(".json") {
            continue;
        }
        let (opened, header) = source.whole(e, streamed)?;
        let group = match e.name.as_str() {
            MODEL_NAME => Group::Model,
            OPTIMIZER_NAME => Group::Optimizer,
            _ => continue,
        };
        let header = header?;
        let start = header.data_start();
        for t in header.tensors() {
            tensors.push(StepTensor {
                group,
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                longest: t.shape.first().copied().unwrap_or(0),
                chunks: vec![StepChunk {
                    offsets: vec![0; t.shape.len()],
                    sizes: t.shape.clone(),
                    file: files.len(),
                    begin: start.saturating_add(t.data_offsets.0),
                    end: start.saturating_add(t.data_offsets.1),
                    pieces: Vec::new(),
                }],
            });
        }
        meta.insert(group, header.metadata.clone());
        files.push(DataFile {
            name: e.name.clone(),
            source: opened,
        });
    }
    tensors.sort_by(|a, b| (a.group, a.name.as_bytes()).cmp(&(b.group, b.name.as_bytes())));
    Ok(ShardedStep {
        path: PathBuf::new(),
        step: 0,
        sharded: false,
        state: TrainerState::new(0),
        config: None,
        skipped: Vec::new(),
        meta,
        piece_bytes: PIECE_BYTES,
        tensors,
        files,
    })
}

/// A listed file hashed through a descriptor kept open (the reads that follow come
/// from the very file that was hashed), and its header when it is a safetensors file.
fn hash_open(path: &Path, e: &ManifestEntry) -> Result<(Source, Result<Header, String>), String> {
    use std::io::{Seek, SeekFrom};
    let unreadable = |err: std::io::Error| format!("cannot read {}: {err}", e.name);
    let mut file = open_no_follow(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    if size != e.size {
        return Err(size_problem(e, size));
    }
    let (n, digest) =
        crate::digest::sha256_stream(&mut file, None, &mut |_| {}).map_err(unreadable)?;
    if n != e.size {
        return Err(size_problem(e, n));
    }
    let sha = hex(&digest);
    if sha != e.sha256 {
        return Err(sha_problem(e, &sha));
    }
    file.seek(SeekFrom::Start(0)).map_err(unreadable)?;
    let header = if e.name.ends_with(".safetensors") {
        read_header_from(&mut file, size).map_err(|err| match err {
            ReadFailure::Io(err) => unreadable(err),
            ReadFailure::Invalid(err) => format!(
                "{} breaks a safetensors reader rule: {}",
                e.name,
                crate::failure::full_text(&err)
            ),
        })
    } else {
        Err(format!("{} is not a safetensors file", e.name))
    };
    Ok((Source::Verified(file), header))
}

/// One global tensor of a sharded step as `st inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalTensor {
    /// Its group.
    pub group: Group,
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its global shape.
    pub shape: Vec<u64>,
    /// How many chunks hold it.
    pub chunks: usize,
    /// Its bytes.
    pub bytes: u64,
}

/// The global tensors of the sharded step directory `step_dir`, after the light check
/// `open_step` makes (manifest, small files, sizes, the chunk table against the files'
/// headers; the pieces are not read).
pub fn global_tensors(step_dir: &Path) -> Result<(u64, Vec<GlobalTensor>), ShardedError> {
    let step = dir_step(step_dir).ok_or_else(|| {
        ShardedError::Request(format!(
            "{} is not a step directory (step-NNNNNN)",
            step_dir.display()
        ))
    })?;
    let checked = check_dir(step_dir, step).map_err(|why| not_found(step_dir, step, why))?;
    if checked.manifest.get(SHARDS_NAME).is_none() {
        return Err(ShardedError::Request(format!(
            "{} is not a sharded step (its manifest does not list {SHARDS_NAME})",
            step_dir.display()
        )));
    }
    let opened = open_sharded(&checked, &LocalFiles(step_dir))
        .map_err(|why| not_found(step_dir, step, why))?;
    Ok((step, global_list(&opened)))
}

/// The global tensors of an opened step, as `st inspect` shows them.
pub(crate) fn global_list(opened: &ShardedStep) -> Vec<GlobalTensor> {
    opened
        .tensors
        .iter()
        .map(|t| GlobalTensor {
            group: t.group,
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            chunks: t.chunks.len(),
            bytes: t.byte_len(),
        })
        .collect()
}

fn not_found(dir: &Path, step: u64, why: String) -> ShardedError {
    CheckpointError::NotFound {
        dir: dir.to_path_buf(),
        reasons: vec![(step_name(step), why)],
    }
    .into()
}

/// True when the directory's manifest (already parsed) is a sharded step's.
pub fn is_sharded(manifest: &Manifest) -> bool {
    manifest.get(SHARDS_NAME).is_some()
}

/// The step of a step directory's name, when it is one.
pub fn dir_step(path: &Path) -> Option<u64> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_step_name)
}
