//! The merge of complete parts into the shards one `tokens pack` of the same inputs
//! and options writes: every part checked against the others, the concatenated ids cut
//! at the same counts, every shard durable before any final name appears.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::marker::{check_count, list_parts, read_marker, PartMarker};
use super::plan::Position;
use super::{io_err, part_area, PartsError, IDS_FILE, MARKER_FILE};
use crate::atomic::{self, AtomicFile, Prepared};
use crate::tokens::pack::ShardPlan;
use crate::tokens::part_docs::MergeDocs;
use crate::tokens::shard::{ShardHeader, MAX_COUNT};
use crate::tokens::TokensError;

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeSummary {
    /// Each shard, in order, with its header.
    pub shards: Vec<(PathBuf, ShardHeader)>,
    /// N.
    pub parts: usize,
    /// Documents in all parts.
    pub documents: u64,
    /// Ids in all.
    pub tokens: u64,
    /// Bad lines or rows skipped in all.
    pub skipped: u64,
}

/// The markers of parts 0..count in `area`, or the error naming the missing ones.
fn all_markers(area: &Path, count: usize) -> Result<Vec<(PathBuf, PartMarker)>, PartsError> {
    let mut missing = Vec::new();
    let mut parts = Vec::with_capacity(count);
    for k in 0..count {
        let dir = area.join(format!("{k}-of-{count}"));
        match read_marker(&dir)? {
            Some(marker) => parts.push((dir, marker)),
            None => missing.push(format!("{k}-of-{count}")),
        }
    }
    if !missing.is_empty() {
        return Err(missing_parts(area, &missing, count));
    }
    Ok(parts)
}

/// The error for the parts `missing` (their names `K-of-N`) of `count` in `area`.
pub(crate) fn missing_parts(area: &Path, missing: &[String], count: usize) -> PartsError {
    const SHOWN: usize = 20;
    let mut shown = missing
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if missing.len() > SHOWN {
        shown.push_str(", ...");
    }
    PartsError::Missing {
        area: area.to_path_buf(),
        count: missing.len(),
        parts: count,
        missing: shown,
    }
}

/// Check a part's ids file against its marker: the size, and the digest with `verify`.
fn check_ids(dir: &Path, marker: &PartMarker, verify: bool) -> Result<(), PartsError> {
    let ids = dir.join(IDS_FILE);
    let size = fs::metadata(&ids).map_err(io_err(&ids))?.len();
    check_ids_size(&ids, marker, size)?;
    if verify {
        let mut file = crate::files::open_regular(&ids).map_err(io_err(&ids))?;
        let mut hasher = blake3::Hasher::new();
        hasher.update_reader(&mut file).map_err(io_err(&ids))?;
        check_ids_digest(&ids, marker, &hasher.finalize().to_hex())?;
    }
    Ok(())
}

/// Refuse ids at `path` (a file or an object's URL) of `size` bytes when the marker
/// records another size, or a count that does not fill it.
pub(crate) fn check_ids_size(
    path: &Path,
    marker: &PartMarker,
    size: u64,
) -> Result<(), PartsError> {
    let itemsize = ShardHeader::for_layout(0, marker.identity.vocab_size, marker.identity.layout())?
        .dtype
        .itemsize() as u64;
    if size != marker.bytes || marker.tokens.checked_mul(itemsize) != Some(size) {
        return Err(PartsError::BadIds {
            path: path.to_path_buf(),
            reason: format!(
                "{size} bytes, but the marker records {} ids in {} bytes",
                marker.tokens, marker.bytes
            ),
        });
    }
    Ok(())
}

/// Refuse ids at `path` whose blake3 `digest` (lowercase hex) is not the marker's.
pub(crate) fn check_ids_digest(
    path: &Path,
    marker: &PartMarker,
    digest: &str,
) -> Result<(), PartsError> {
    if digest != marker.blake3 {
        return Err(PartsError::BadIds {
            path: path.to_path_buf(),
            reason: format!("blake3 {digest}, but the marker records {}", marker.blake3),
        });
    }
    Ok(())
}

/// The complete parts of `out`'s area, checked against each other: every part of N
/// present with a marker, the same identity, tiling the inputs, ids of the recorded
/// size (and digest with `verify`).
fn complete_parts(out: &Path, verify: bool) -> Result<Vec<(PathBuf, PartMarker)>, PartsError> {
    let area = part_area(out);
    let found = list_parts(&area)?;
    let Some(&(_, count, _)) = found.first() else {
        return Err(PartsError::NoParts { area });
    };
    check_count(&area, count)?;
    let parts = all_markers(&area, count)?;
    check_tiling(&area, &parts)?;
    for (dir, marker) in &parts {
        check_ids(dir, marker, verify)?;
    }
    Ok(parts)
}

/// Check the markers of all the parts of `area`, in part order, each with its
/// directory (a path, or an object prefix's URL): the same identity, numbered as they
/// lie, tiling the inputs from the first byte to the last.
pub(crate) fn check_tiling(area: &Path, parts: &[(PathBuf, PartMarker)]) -> Result<(), PartsError> {
    let count = parts.len();
    let first = parts.first().map(|(_, m)| m.identity.clone());
    let mut expected = Position {
        input: 0,
        offset: 0,
    };
    for (k, (dir, marker)) in parts.iter().enumerate() {
        if let Some(first) = &first {
            if let Some((field, theirs, ours)) = marker.identity.difference(first) {
                return Err(PartsError::Mismatch {
                    part: dir.clone(),
                    field,
                    theirs,
                    other: format!("part 0-of-{count}"),
                    ours,
                });
            }
        }
        if marker.part != k || marker.identity.parts != count {
            return Err(PartsError::BadMarker {
                path: dir.join(MARKER_FILE),
                reason: format!(
                    "it says part {} of {}, but lies in {}",
                    marker.part,
                    marker.identity.parts,
                    dir.display()
                ),
            });
        }
        if marker.start != expected {
            return Err(PartsError::NotContiguous {
                part: dir.clone(),
                found: marker.start.to_string(),
                expected: expected.to_string(),
            });
        }
        expected = marker.end;
    }
    let inputs = first.as_ref().map_or(0, |f| f.inputs.len());
    let end = Position {
        input: inputs,
        offset: 0,
    };
    if expected != end {
        return Err(PartsError::NotContiguous {
            part: area.join(format!("{}-of-{count}", count.saturating_sub(1))),
            found: format!("its end {expected}"),
            expected: end.to_string(),
        });
    }
    Ok(())
}

/// The ids of all `parts` together, refused before any shard is written when there is
/// none, or when `plan` would get no training shard from them (a validation shard of
/// at least the whole corpus).
pub(crate) fn check_parts_total(
    plan: &ShardPlan,
    parts: &[(PathBuf, PartMarker)],
) -> Result<u64, PartsError> {
    let tokens = parts
        .iter()
        .fold(0u64, |a, (_, m)| a.saturating_add(m.tokens));
    if tokens == 0 {
        return Err(TokensError::Empty.into());
    }
    plan.check_total(tokens)?;
    Ok(tokens)
}

/// Reads the part id files back to back, copying ranges into shards.
struct Concat<'a> {
    files: &'a [(PathBuf, u64)],
    index: usize,
    offset: u64,
    open: Option<File>,
}

impl Concat<'_> {
    /// Copy the next `n` bytes into `out` (in-kernel where the system can:
    /// `io::copy` between two files uses copy_file_range on Linux).
    fn copy_into(
        &mut self,
        mut n: u64,
        out: &mut File,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), PartsError> {
        while n > 0 {
            let Some((path, size)) = self.files.get(self.index) else {
                return Err(PartsError::BadIds {
                    path: PathBuf::new(),
                    reason: "the parts hold fewer ids than their markers say".to_string(),
                });
            };
            let left = size.saturating_sub(self.offset);
            if left == 0 {
                self.index = self.index.saturating_add(1);
                self.offset = 0;
                self.open = None;
                continue;
            }
            let take = left.min(n);
            let file = match &mut self.open {
                Some(f) => f,
                None => {
                    let mut f = crate::files::open_regular(path).map_err(io_err(path))?;
                    f.seek(SeekFrom::Start(self.offset)).map_err(io_err(path))?;
                    self.open.insert(f)
                }
            };
            let copied = io::copy(&mut Read::by_ref(file).take(take), out).map_err(io_err(path))?;
            if copied != take {
                return Err(PartsError::BadIds {
                    path: path.clone(),
                    reason: format!(
                        "ended {} bytes early (changed while merging)",
                        take - copied
                    ),
                });
            }
            progress(copied);
            self.offset = self.offset.saturating_add(take);
            n = n.saturating_sub(take);
        }
        Ok(())
    }
}

/// Merge the parts of `out` into its final shards: the files, names, headers and ids
/// one `tokens pack` of the same inputs and options writes. Every part must be
/// complete and agree with the others; `verify` also checks each part's digest.
/// Each shard is made durable under a temporary name, and only when all are do the
/// final names appear. `progress` hears of the bytes copied.
pub fn merge_parts(
    out: &Path,
    verify: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<MergeSummary, PartsError> {
    let parts = complete_parts(out, verify)?;
    let Some(identity) = parts.first().map(|(_, m)| m.identity.clone()) else {
        return Err(PartsError::NoParts {
            area: part_area(out),
        });
    };
    let plan = identity.plan(out)?;
    plan.check()?;
    let inputs: Vec<PathBuf> = identity
        .inputs
        .iter()
        .map(|i| PathBuf::from(&i.path))
        .collect();
    plan.refuse_inputs(inputs.iter().map(PathBuf::as_path))?;
    let layout = identity.layout();
    let vocab = identity.vocab_size;
    let itemsize = ShardHeader::for_layout(0, vocab, layout)?.dtype.itemsize() as u64;
    let sum =
        |f: fn(&PartMarker) -> u64| parts.iter().fold(0u64, |a, (_, m)| a.saturating_add(f(m)));
    let tokens = check_parts_total(&plan, &parts)?;
    let files: Vec<(PathBuf, u64)> = parts
        .iter()
        .map(|(dir, m)| (dir.join(IDS_FILE), m.bytes))
        .collect();
    let mut concat = Concat {
        files: &files,
        index: 0,
        offset: 0,
        open: None,
    };
    let mut docs = MergeDocs::open(&parts)?;
    let mut written: Vec<(PathBuf, ShardHeader)> = Vec::new();
    let mut ready: Vec<Prepared> = Vec::new();
    let mut left = tokens;
    while left > 0 {
        let (path, limit) = plan.shard(written.len());
        if limit == MAX_COUNT && left > MAX_COUNT && matches!(plan, ShardPlan::Single(_)) {
            return Err(TokensError::BadOptions(format!(
                "{}: more than {MAX_COUNT} ids do not fit one shard (split it with a smaller shard_tokens)",
                path.display()
            ))
            .into());
        }
        let count = left.min(limit);
        let header = ShardHeader::for_layout(count, vocab, layout)?;
        let mut file = AtomicFile::create(&path)?;
        let write_err = |error| PartsError::Io {
            path: path.clone(),
            error,
        };
        let w = file.writer();
        w.write_all(&header.to_bytes()).map_err(write_err)?;
        w.flush().map_err(write_err)?;
        concat.copy_into(count.saturating_mul(itemsize), w.get_mut(), progress)?;
        ready.push(file.prepare()?);
        if let Some(docs) = &mut docs {
            ready.push(docs.prepare_shard(&path, tokens.saturating_sub(left), count)?);
        }
        written.push((path, header));
        left = left.saturating_sub(count);
    }
    atomic::publish_all(ready)?;
    Ok(MergeSummary {
        shards: written,
        parts: parts.len(),
        documents: sum(|m| m.documents),
        tokens,
        skipped: sum(|m| m.skipped),
    })
}
