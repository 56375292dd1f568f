//! Verification of one step directory against its manifest: every listed file present
//! with its size and sha256, no unlisted file, no symlink, every JSON file well-formed,
//! every safetensors file within the reader rules.
//!
//! Invariants: nothing is read outside the step directory (manifest names are checked
//! before any is opened, symlinks are never followed, files are opened `O_NOFOLLOW`);
//! every byte of every listed file is read exactly once, through sha256.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;

use super::content::{check_hashed, check_state};
use super::fsops::open_no_follow;
use super::manifest::{Manifest, ManifestEntry, MANIFEST_NAME};
use super::state::TrainerState;
use super::{parse_step_name, MODEL_NAME, STATE_NAME};
use crate::digest::{hex, sha256_read_owned, sha256_stream};

/// Largest manifest read (a manifest lists a handful of files).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// Largest JSON file of a step directory kept in memory for parsing.
pub const MAX_JSON_BYTES: u64 = 64 << 20;
/// Files a checkpoint cannot be loaded without.
const REQUIRED: [&str; 2] = [MODEL_NAME, STATE_NAME];

/// One reason a step directory fails verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The step directory itself is a symlink or not a directory.
    #[error("not a directory (symbolic links are not followed)")]
    NotADirectory,
    /// There is no `MANIFEST.json`.
    #[error("missing MANIFEST.json")]
    MissingManifest,
    /// `MANIFEST.json` is not a valid manifest (bad JSON, bad name, unsorted, ...).
    #[error("invalid MANIFEST.json: {0}")]
    BadManifest(String),
    /// The manifest's step is not the directory's.
    #[error("MANIFEST.json says step {manifest}, the directory is step {dir}")]
    StepMismatch {
        /// Step in the manifest.
        manifest: u64,
        /// Step from the directory name.
        dir: u64,
    },
    /// A file a checkpoint needs is not listed.
    #[error("MANIFEST.json does not list {0}")]
    NotListed(String),
    /// A listed file is absent.
    #[error("{0} is missing")]
    Missing(String),
    /// A listed file has another size.
    #[error("{name} has {actual} bytes, MANIFEST.json says {expected}")]
    Size {
        /// The file.
        name: String,
        /// Size listed.
        expected: u64,
        /// Size found.
        actual: u64,
    },
    /// A listed file has another sha256.
    #[error("{name} sha256 mismatch: MANIFEST.json says {expected}, the file has {actual}")]
    Sha256 {
        /// The file.
        name: String,
        /// Digest listed.
        expected: String,
        /// Digest found.
        actual: String,
    },
    /// A file the manifest does not list.
    #[error("unlisted file {0}")]
    Unlisted(String),
    /// A symbolic link inside the step directory.
    #[error("{0} is a symbolic link (not followed)")]
    Symlink(String),
    /// A directory or special file inside the step directory.
    #[error("{0} is not a regular file")]
    NotAFile(String),
    /// A JSON file that does not parse (or breaks its schema).
    #[error("{name} is malformed: {reason}")]
    BadJson {
        /// The file.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A safetensors file that breaks a reader rule.
    #[error("{name} breaks a safetensors reader rule: {reason}")]
    BadSafetensors {
        /// The file.
        name: String,
        /// The rule and tensor.
        reason: String,
    },
    /// A sharded step's chunk table, a chunk against its file, or a piece digest
    /// (the text names the file, the tensor and the piece).
    #[error("{0}")]
    Sharded(String),
    /// A file could not be read.
    #[error("cannot read {name}: {reason}")]
    Unreadable {
        /// The file.
        name: String,
        /// The I/O error.
        reason: String,
    },
}

impl crate::failure::Failure for Problem {
    fn kind(&self) -> crate::failure::FailureKind {
        use crate::failure::FailureKind;
        match self {
            // The file is there but could not be read: the operation failed, the
            // checkpoint may be fine.
            Problem::Unreadable { .. } => FailureKind::Operational,
            Problem::NotADirectory
            | Problem::MissingManifest
            | Problem::BadManifest(_)
            | Problem::StepMismatch { .. }
            | Problem::NotListed(_)
            | Problem::Missing(_)
            | Problem::Size { .. }
            | Problem::Sha256 { .. }
            | Problem::Unlisted(_)
            | Problem::Symlink(_)
            | Problem::NotAFile(_)
            | Problem::BadJson { .. }
            | Problem::BadSafetensors { .. }
            | Problem::Sharded(_) => FailureKind::Invalid,
        }
    }
}

/// What verification found, with the small files it read (so a loader uses exactly
/// the bytes that were hashed).
#[derive(Debug, Clone, Default)]
pub struct Inspection {
    /// Every problem, in a stable order; empty when the directory verifies.
    pub problems: Vec<Problem>,
    /// Bytes of the listed files (plus the manifest) found on disk.
    pub size: u64,
    /// The manifest, when it parsed.
    pub manifest: Option<Manifest>,
    /// The trainer state, when it verified and parsed.
    pub state: Option<TrainerState>,
    /// The config bytes, when present and verified.
    pub config: Option<Vec<u8>>,
    /// Every listed file's bytes but the JSON files' (parsed into `state` and kept as
    /// `config`), by name, when the inspection kept them ([`read_step`]) and the
    /// directory verified; empty otherwise.
    pub data: BTreeMap<String, Vec<u8>>,
}

/// The problems of one step directory (empty when it verifies).
pub fn verify(step_dir: &Path) -> Vec<Problem> {
    inspect(step_dir).problems
}

/// Check a safetensors file against the reader rules (header and size only).
pub fn safetensors_problem(path: &Path) -> Option<String> {
    crate::safetensors::read_header(path)
        .err()
        .map(|e| crate::failure::full_text(&e))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Symlink,
    Other,
}

/// Bytes of the regular files of a step directory (symlinks not followed): the work
/// `inspect` will do, for a progress bar.
pub fn step_dir_bytes(step_dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(step_dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.file_type().is_file())
        .fold(0u64, |acc, m| acc.saturating_add(m.len()))
}

/// Verify one step directory, keeping what a loader needs.
pub fn inspect(step_dir: &Path) -> Inspection {
    inspect_with(step_dir, &mut |_| {})
}

/// `inspect`, reporting the bytes hashed as it goes.
pub fn inspect_with(step_dir: &Path, progress: &mut dyn FnMut(u64)) -> Inspection {
    inspect_keeping(step_dir, Keep::Json, progress)
}

/// Verify one step directory and keep every listed file's bytes (`Inspection::data`):
/// each file is opened once, without following a symlink, and read once into owned
/// memory, hashed as it is read; nothing is read by path again afterwards, so what a
/// loader decodes is exactly what was hashed, whatever happens to the files later.
pub fn read_step(step_dir: &Path) -> Inspection {
    inspect_keeping(step_dir, Keep::All, &mut |_| {})
}

/// Which listed files' bytes an inspection keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// The JSON files up to [`MAX_JSON_BYTES`] (the loader parses them).
    Json,
    /// Every file (a load that decodes tensors from what it verified).
    All,
}

#[cfg(test)]
thread_local! {
    /// Inspections started on this thread (tests count the step directories read).
    pub(crate) static INSPECTIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn inspect_keeping(step_dir: &Path, keep: Keep, progress: &mut dyn FnMut(u64)) -> Inspection {
    #[cfg(test)]
    INSPECTIONS.with(|n| n.set(n.get().saturating_add(1)));
    let mut out = Inspection::default();
    let Some(entries) = read_entries(step_dir, &mut out) else {
        return out;
    };
    let Some(manifest) = read_manifest(step_dir, &entries, &mut out) else {
        return out;
    };
    check_manifest_step(step_dir, &manifest, &mut out);
    // Every listed file is opened before any is read: from here on a deletion or a
    // rename of the step directory changes nothing this inspection sees.
    let opened = open_entries(step_dir, &manifest.files, &entries, &mut out);
    let mut config_sha = None;
    for (local, sha) in check_entries(&manifest.files, opened, keep, progress) {
        out.problems.extend(local.problems);
        out.size = out.size.saturating_add(local.size);
        out.state = out.state.or(local.state);
        out.config = out.config.or(local.config);
        out.data.extend(local.data);
        config_sha = config_sha.or(sha);
    }
    for name in entries.keys() {
        if name != MANIFEST_NAME && manifest.get(name).is_none() {
            out.problems.push(Problem::Unlisted(name.clone()));
        }
    }
    check_state(&manifest, config_sha.as_deref(), &mut out);
    if out.problems.is_empty() && super::sharded::open::is_sharded(&manifest) {
        let found = super::sharded::verify::check_step(step_dir, &manifest);
        out.problems.extend(found.into_iter().map(Problem::Sharded));
    }
    out.manifest = Some(manifest);
    if !out.problems.is_empty() {
        out.state = None;
        out.config = None;
        out.data.clear();
    }
    out
}

/// Open every listed file that the directory holds as a regular file (a problem for
/// each that is missing or cannot be opened), in manifest order.
fn open_entries(
    step_dir: &Path,
    files: &[ManifestEntry],
    entries: &BTreeMap<String, Kind>,
    out: &mut Inspection,
) -> Vec<Option<File>> {
    files
        .iter()
        .map(|entry| {
            let name = &entry.name;
            match entries.get(name.as_str()) {
                None => {
                    out.problems.push(Problem::Missing(name.clone()));
                    None
                }
                // Already reported as a symlink or not a regular file.
                Some(Kind::Symlink | Kind::Other) => None,
                Some(Kind::File) => match open_no_follow(&step_dir.join(name)) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        out.problems.push(Problem::Unreadable {
                            name: name.clone(),
                            reason: e.to_string(),
                        });
                        None
                    }
                },
            }
        })
        .collect()
}

/// [`check_entry`] of every opened file, the files read on parallel threads (a
/// checkpoint is a few large files, and sha256 of one file is sequential), each into
/// its own [`Inspection`]; returned in manifest order, so problems come in the same
/// order whatever the threads did. Progress is reported from the calling thread.
fn check_entries(
    files: &[ManifestEntry],
    opened: Vec<Option<File>>,
    keep: Keep,
    progress: &mut dyn FnMut(u64),
) -> Vec<(Inspection, Option<String>)> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Mutex};
    let slots: Vec<Mutex<Option<File>>> = opened.into_iter().map(Mutex::new).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<u64>();
    let mut results: Vec<(usize, Inspection, Option<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let tx = tx.clone();
                let (next, slots) = (&next, &slots);
                s.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(entry) = files.get(i) else {
                            return done;
                        };
                        // Each index is taken by exactly one worker; a poisoned slot
                        // (a panic elsewhere) still holds its file.
                        let file = slots
                            .get(i)
                            .and_then(|m| m.lock().unwrap_or_else(|p| p.into_inner()).take());
                        let (mut local, mut sha) = (Inspection::default(), None);
                        if let Some(file) = file {
                            let mut tick = |n| {
                                let _ = tx.send(n);
                            };
                            check_entry(file, entry, keep, &mut local, &mut tick, &mut sha);
                        }
                        done.push((i, local, sha));
                    }
                })
            })
            .collect();
        // The workers hold the only senders left: the loop ends when all are done.
        drop(tx);
        for n in rx {
            progress(n);
        }
        workers
            .into_iter()
            // A worker panicking is a bug; its files then count as unreadable below.
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    results.sort_by_key(|(i, _, _)| *i);
    let mut ordered = Vec::with_capacity(files.len());
    let mut results = results.into_iter().peekable();
    for (i, entry) in files.iter().enumerate() {
        match results.next_if(|(j, _, _)| *j == i) {
            Some((_, local, sha)) => ordered.push((local, sha)),
            None => {
                let mut local = Inspection::default();
                local.problems.push(Problem::Unreadable {
                    name: entry.name.clone(),
                    reason: "its check did not finish".to_string(),
                });
                ordered.push((local, None));
            }
        }
    }
    ordered
}

/// The step directory's entries, with a problem for each that is not a regular file;
/// `None` (the problem recorded) when the directory itself cannot be read.
fn read_entries(step_dir: &Path, out: &mut Inspection) -> Option<BTreeMap<String, Kind>> {
    let unreadable = |e: io::Error| Problem::Unreadable {
        name: ".".into(),
        reason: e.to_string(),
    };
    match fs::symlink_metadata(step_dir) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => {
            out.problems.push(Problem::NotADirectory);
            return None;
        }
        Err(e) => {
            out.problems.push(unreadable(e));
            return None;
        }
    }
    let entries = match list_entries(step_dir) {
        Ok(e) => e,
        Err(e) => {
            out.problems.push(unreadable(e));
            return None;
        }
    };
    for (name, kind) in &entries {
        match kind {
            Kind::File => {}
            Kind::Symlink => out.problems.push(Problem::Symlink(name.clone())),
            Kind::Other => out.problems.push(Problem::NotAFile(name.clone())),
        }
    }
    Some(entries)
}

/// The parsed manifest; `None` when it is missing, not a file (already reported as
/// such) or broken.
fn read_manifest(
    step_dir: &Path,
    entries: &BTreeMap<String, Kind>,
    out: &mut Inspection,
) -> Option<Manifest> {
    match entries.get(MANIFEST_NAME) {
        None => {
            out.problems.push(Problem::MissingManifest);
            None
        }
        Some(Kind::File) => match read_small(&step_dir.join(MANIFEST_NAME), MAX_MANIFEST_BYTES) {
            Ok(bytes) => {
                out.size = out.size.saturating_add(bytes.len() as u64);
                match Manifest::from_json(&bytes) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        out.problems.push(Problem::BadManifest(e.to_string()));
                        None
                    }
                }
            }
            Err(e) => {
                out.problems.push(Problem::BadManifest(e.to_string()));
                None
            }
        },
        Some(_) => None,
    }
}

/// The manifest's step is the directory's, and it lists every required file.
pub(crate) fn check_manifest_step(step_dir: &Path, manifest: &Manifest, out: &mut Inspection) {
    let dir_step = step_dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_step_name);
    if let Some(dir) = dir_step {
        if dir != manifest.step {
            out.problems.push(Problem::StepMismatch {
                manifest: manifest.step,
                dir,
            });
        }
    }
    // A sharded step holds its tensors in rank files that its chunk table names.
    let required = if super::sharded::open::is_sharded(manifest) {
        [super::sharded::SHARDS_NAME, STATE_NAME]
    } else {
        REQUIRED
    };
    for required in required {
        if manifest.get(required).is_none() {
            out.problems.push(Problem::NotListed(required.into()));
        }
    }
}

/// One opened listed file: its size and sha256 as listed, then its content by kind.
fn check_entry(
    mut file: File,
    entry: &ManifestEntry,
    keep: Keep,
    out: &mut Inspection,
    progress: &mut dyn FnMut(u64),
    config_sha: &mut Option<String>,
) {
    let Some((actual, kept)) = hash_entry(&mut file, entry, keep, out, progress) else {
        return;
    };
    // The header of the bytes just hashed (kept) or of the same descriptor read again
    // (never the path: the file may have been replaced since).
    let mut header = |kept: &[u8]| match keep {
        Keep::All => crate::safetensors::parse_header(kept),
        Keep::Json => header_of(&mut file, entry.size, &entry.name),
    };
    check_hashed(
        entry,
        actual,
        kept,
        keep == Keep::All,
        &mut header,
        out,
        config_sha,
    );
}

/// The safetensors header of an opened file of `size` bytes, read from its start.
fn header_of(
    file: &mut File,
    size: u64,
    name: &str,
) -> Result<crate::safetensors::Header, crate::safetensors::SafetensorsError> {
    use std::io::Seek;
    let io = |source| crate::safetensors::SafetensorsError::Io {
        path: name.into(),
        source,
    };
    file.seek(io::SeekFrom::Start(0)).map_err(io)?;
    crate::safetensors::header::read_header_from(file, size).map_err(|e| match e {
        crate::safetensors::header::ReadFailure::Io(source) => io(source),
        crate::safetensors::header::ReadFailure::Invalid(e) => e,
    })
}

/// Read and hash an opened listed file (keeping a small JSON file's bytes, or every
/// byte with `Keep::All`, read straight into one buffer of the listed size); `None`
/// with the problem recorded when it cannot be read or its size is not the listed one.
fn hash_entry(
    file: &mut File,
    entry: &ManifestEntry,
    keep: Keep,
    out: &mut Inspection,
    progress: &mut dyn FnMut(u64),
) -> Option<(String, Vec<u8>)> {
    let name = &entry.name;
    // The size is checked before reading (from the metadata) and after (by the bytes
    // actually read: a file that shrank or grew meanwhile is caught).
    let unreadable = |e: io::Error| Problem::Unreadable {
        name: name.clone(),
        reason: e.to_string(),
    };
    let wrong_size = |actual: u64| {
        (actual != entry.size).then(|| Problem::Size {
            name: name.clone(),
            expected: entry.size,
            actual,
        })
    };
    if let Some(p) = wrong_size(file.metadata().map(|m| m.len()).unwrap_or(u64::MAX)) {
        out.problems.push(p);
        return None;
    }
    let is_json = name.ends_with(".json");
    let keeps = keep == Keep::All || (is_json && entry.size <= MAX_JSON_BYTES);
    let hashed = if keeps {
        sha256_read_owned(file, entry.size, progress)
    } else {
        sha256_stream(file, None, progress).map(|(n, d)| (n, d, Vec::new()))
    };
    let (n, digest, kept) = match hashed {
        Ok(r) => r,
        Err(e) => {
            out.problems.push(unreadable(e));
            return None;
        }
    };
    out.size = out.size.saturating_add(n);
    if let Some(p) = wrong_size(n) {
        out.problems.push(p);
        return None;
    }
    Some((hex(&digest), kept))
}

/// Names and kinds of a directory's entries, sorted; a name that is not UTF-8 is kept
/// lossily (it can never be listed, so it is reported as unlisted).
fn list_entries(dir: &Path) -> io::Result<BTreeMap<String, Kind>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let ft = entry.file_type()?;
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        out.insert(entry.file_name().to_string_lossy().into_owned(), kind);
    }
    Ok(out)
}

/// Whether `step_dir`'s manifest, read without verifying anything, describes a sharded
/// step; `false` when it cannot be read or parsed (a verification reports that).
pub(crate) fn manifest_is_sharded(step_dir: &Path) -> bool {
    read_small(&step_dir.join(MANIFEST_NAME), MAX_MANIFEST_BYTES)
        .ok()
        .and_then(|bytes| Manifest::from_json(&bytes).ok())
        .is_some_and(|m| super::sharded::open::is_sharded(&m))
}

fn read_small(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file: File = open_no_follow(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}
