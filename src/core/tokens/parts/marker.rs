//! What a part records: its inputs and options (the identity two parts must share to
//! merge), and its completion marker, written last and atomically, read back and
//! compared naming the first difference.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::plan::Position;
use super::{
    io_err, part_area, PartsError, IDS_FILE, MARKER_FILE, MARKER_FORMAT, MARKER_VERSION,
    MAX_MARKER_BYTES,
};
use crate::atomic;
use crate::tokens::pack::ShardPlan;
use crate::tokens::shard::{Layout, U16_VOCAB_LIMIT};
use crate::tokens::tokenizer::Tokenizer;

/// Longest value shown in a difference message.
const SHOWN_VALUE_CHARS: usize = 200;

/// One input as a part saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputId {
    /// The path as given.
    pub path: String,
    /// Its size in bytes when the part ran.
    pub size: u64,
    /// Its modification time when the part ran, in nanoseconds since the Unix epoch
    /// (negative before it): a file rewritten with the same size between two parts'
    /// runs has another one, so the two parts do not merge.
    pub mtime_ns: i64,
}

/// The modification time of `meta` (of the file at `path`) in nanoseconds since the
/// Unix epoch, negative before it, saturated at i64's range (the years 1677 to 2262).
pub(super) fn mtime_ns(path: &Path, meta: &fs::Metadata) -> Result<i64, PartsError> {
    let modified = meta.modified().map_err(io_err(path))?;
    let saturate = |ns: u128| i64::try_from(ns).unwrap_or(i64::MAX);
    Ok(match modified.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => saturate(after.as_nanos()),
        Err(before) => saturate(before.duration().as_nanos()).saturating_neg(),
    })
}

/// Everything that decides a pack's shards but the part number: two parts merge only
/// when theirs are equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartIdentity {
    /// N.
    pub parts: usize,
    /// How inputs are read: text, jsonl, parquet, bytes, ids, u16le, u32le.
    pub format: String,
    /// The tokenizer: a built-in encoding's name, or a tokenizer.json's file name and
    /// the blake3 of its bytes.
    pub tokenizer: Option<String>,
    /// The JSONL field or Parquet column.
    pub field: Option<String>,
    /// The id before each document.
    pub eot: Option<u32>,
    /// Bad lines skipped rather than fatal.
    pub skip_bad: bool,
    /// The vocabulary recorded in every shard.
    pub vocab_size: u32,
    /// The uint32 header (`llama3` or `v2`; `llama3` for uint16 shards, where it does
    /// not matter).
    pub layout: String,
    /// The shard files: `single`, `numbered` or `val_train`.
    pub shards: String,
    /// Ids per (training) shard.
    pub shard_tokens: Option<u64>,
    /// Ids of the validation shard.
    pub val_tokens: Option<u64>,
    /// The inputs, in order.
    pub inputs: Vec<InputId>,
}

/// A part's completion marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartMarker {
    /// [`MARKER_FORMAT`].
    pub format: String,
    /// [`MARKER_VERSION`].
    pub version: u32,
    /// K.
    pub part: usize,
    /// The options and inputs.
    pub identity: PartIdentity,
    /// Where the part starts in the document sequence.
    pub start: Position,
    /// Where it ends (the next part's start).
    pub end: Position,
    /// Documents packed (0 for id inputs).
    pub documents: u64,
    /// Bad lines or rows skipped.
    pub skipped: u64,
    /// Ids in the part.
    pub tokens: u64,
    /// Bytes of its ids file.
    pub bytes: u64,
    /// blake3 of its ids file, lowercase hex.
    pub blake3: String,
    /// Document starts in its `docs.bin` (part_docs.rs); absent for id inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_starts: Option<u64>,
}

impl PartIdentity {
    /// The shard files of this identity for output `out`.
    pub(crate) fn plan(&self, out: &Path) -> Result<ShardPlan, PartsError> {
        let bad = |reason: String| PartsError::BadMarker {
            path: part_area(out),
            reason,
        };
        Ok(
            match (self.shards.as_str(), self.shard_tokens, self.val_tokens) {
                ("single", None, None) => ShardPlan::Single(out.to_path_buf()),
                ("numbered", Some(shard_tokens), None) => ShardPlan::Numbered {
                    out: out.to_path_buf(),
                    shard_tokens,
                },
                ("val_train", Some(shard_tokens), Some(val_tokens)) => ShardPlan::ValTrain {
                    prefix: out.to_path_buf(),
                    val_tokens,
                    shard_tokens,
                },
                (kind, _, _) => return Err(bad(format!("unknown shard plan {kind:?}"))),
            },
        )
    }

    pub(super) fn layout(&self) -> Layout {
        if self.layout == "v2" {
            Layout::V2
        } else {
            Layout::Llama3
        }
    }

    /// The first setting in which `self` and `other` differ, with both values.
    pub(super) fn difference(&self, other: &PartIdentity) -> Option<(String, String, String)> {
        let a = serde_json::to_value(self).ok()?;
        let b = serde_json::to_value(other).ok()?;
        let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (a, b) else {
            return None;
        };
        let show = |v: Option<&serde_json::Value>| {
            let text = match v {
                None | Some(serde_json::Value::Null) => "none".to_string(),
                Some(v) => v.to_string(),
            };
            if text.chars().count() > SHOWN_VALUE_CHARS {
                let cut: String = text.chars().take(SHOWN_VALUE_CHARS).collect();
                format!("{cut}...")
            } else {
                text
            }
        };
        // The tokenizer first: its end-of-text id and vocabulary differ with it, and
        // the tokenizers are what the message must name.
        if self.tokenizer != other.tokenizer {
            let name = |t: &Option<String>| t.as_deref().map_or("none".to_string(), quote);
            return Some((
                "tokenizer".to_string(),
                name(&self.tokenizer),
                name(&other.tokenizer),
            ));
        }
        if self.inputs != other.inputs {
            return Some(input_difference(&self.inputs, &other.inputs));
        }
        a.iter()
            .find(|(k, v)| b.get(k.as_str()) != Some(*v))
            .map(|(k, v)| (k.clone(), show(Some(v)), show(b.get(k.as_str()))))
    }
}

fn quote(text: &str) -> String {
    crate::text::quote(text)
}

/// The first input in which `ours` and `theirs` differ, naming the file and the
/// property (path, size or modification time), with both values.
fn input_difference(ours: &[InputId], theirs: &[InputId]) -> (String, String, String) {
    let i = ours
        .iter()
        .zip(theirs)
        .position(|(x, y)| x != y)
        .unwrap_or(ours.len().min(theirs.len()));
    match (ours.get(i), theirs.get(i)) {
        (Some(x), Some(y)) if x.path != y.path => {
            (format!("input {i}"), quote(&x.path), quote(&y.path))
        }
        (Some(x), Some(y)) if x.size != y.size => (
            format!("input {i} {} of size", quote(&x.path)),
            format!("{} bytes", x.size),
            format!("{} bytes", y.size),
        ),
        (Some(x), Some(y)) => (
            format!("input {i} {} of modification time", quote(&x.path)),
            format!("{} ns", x.mtime_ns),
            format!("{} ns", y.mtime_ns),
        ),
        (x, y) => {
            let one = |v: Option<&InputId>| v.map_or("nothing".to_string(), |v| quote(&v.path));
            (format!("input {i}"), one(x), one(y))
        }
    }
}

pub(super) fn layout_name(vocab: u32, layout: Layout) -> &'static str {
    match layout {
        _ if vocab <= U16_VOCAB_LIMIT => "llama3",
        Layout::Llama3 => "llama3",
        Layout::V2 => "v2",
    }
}

pub(super) fn plan_fields(plan: &ShardPlan) -> (&'static str, Option<u64>, Option<u64>) {
    match plan {
        ShardPlan::Single(_) => ("single", None, None),
        ShardPlan::Numbered { shard_tokens, .. } => ("numbered", Some(*shard_tokens), None),
        ShardPlan::ValTrain {
            val_tokens,
            shard_tokens,
            ..
        } => ("val_train", Some(*shard_tokens), Some(*val_tokens)),
    }
}

/// The identity of a tokenizer loaded from `spec`: the encoding's name for a built-in
/// one (so `gpt2` and `r50k_base` agree), else the tokenizer.json's file name and the
/// blake3 of its bytes (so the same file at another directory on another machine
/// agrees, and an edited one does not).
pub fn tokenizer_identity(spec: &str, tokenizer: &Tokenizer) -> Result<String, PartsError> {
    if let Some(encoding) = tokenizer.openai_encoding() {
        return Ok(encoding.name().to_string());
    }
    let path = Path::new(spec);
    let mut file = crate::files::open_regular(path).map_err(io_err(path))?;
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(&mut file).map_err(io_err(path))?;
    let name = path
        .file_name()
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
    Ok(format!("{name} blake3:{}", hasher.finalize().to_hex()))
}

/// Read the marker in part directory `dir`, if there is one.
pub(super) fn read_marker(dir: &Path) -> Result<Option<PartMarker>, PartsError> {
    let path = dir.join(MARKER_FILE);
    let bytes = match crate::files::read_limited(&path, MAX_MARKER_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(PartsError::Io { path, error }),
    };
    parse_marker(&bytes, path).map(Some)
}

/// The marker in `bytes`, read from `path` (a file, or an object's URL).
pub(crate) fn parse_marker(bytes: &[u8], path: PathBuf) -> Result<PartMarker, PartsError> {
    let marker: PartMarker = serde_json::from_slice(bytes).map_err(|e| PartsError::BadMarker {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if marker.format != MARKER_FORMAT || marker.version != MARKER_VERSION {
        return Err(PartsError::BadMarker {
            path,
            reason: format!(
                "format {:?} version {}, this build reads {MARKER_FORMAT:?} version {MARKER_VERSION}",
                marker.format, marker.version
            ),
        });
    }
    Ok(marker)
}

/// The size of the ids file in `dir`, if it exists.
fn ids_size(dir: &Path) -> Option<u64> {
    fs::metadata(dir.join(IDS_FILE)).ok().map(|m| m.len())
}

/// The part directories in `area`: (K, N, path), sorted by K.
pub(super) fn list_parts(area: &Path) -> Result<Vec<(usize, usize, PathBuf)>, PartsError> {
    let entries = match fs::read_dir(area) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        // A FIFO or file where a directory of the path should be is named as what it is.
        Err(e) => return Err(io_err(area)(crate::files::name_non_directory(area, e))),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(area))?;
        if let Some((k, n)) = entry.file_name().to_str().and_then(parse_dir_name) {
            found.push((k, n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// (K, N) of a part directory's name `K-of-N`.
pub(crate) fn parse_dir_name(name: &str) -> Option<(usize, usize)> {
    let (k, n) = name.split_once("-of-")?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

/// Refuse an area holding parts of another count than `count`.
pub(super) fn check_count(area: &Path, count: usize) -> Result<(), PartsError> {
    let found: Vec<usize> = list_parts(area)?.into_iter().map(|(_, n, _)| n).collect();
    check_counts(area, &found, count)
}

/// Refuse part counts `found` (of the parts in `area`) other than `count`.
pub(crate) fn check_counts(area: &Path, found: &[usize], count: usize) -> Result<(), PartsError> {
    match found.iter().find(|&&n| n != count) {
        Some(&found) => Err(PartsError::CountMismatch {
            area: area.to_path_buf(),
            found,
            expected: count,
        }),
        None => Ok(()),
    }
}

/// The marker of the complete part in `dir` made with `identity`; `None` when the part
/// is to be packed (no marker, or one whose ids are gone or cut short, which is
/// removed); an error when it was made with another identity.
pub(super) fn complete_marker(
    dir: &Path,
    identity: &PartIdentity,
) -> Result<Option<PartMarker>, PartsError> {
    let Some(marker) = read_marker(dir)? else {
        return Ok(None);
    };
    check_made_with(dir, &marker, identity)?;
    if ids_size(dir) == Some(marker.bytes) {
        return Ok(Some(marker));
    }
    let marker_path = dir.join(MARKER_FILE);
    fs::remove_file(&marker_path).map_err(io_err(&marker_path))?;
    Ok(None)
}

/// Refuse the part in `dir` (a directory, or an object prefix's URL) when its marker
/// was made with other inputs or options than `identity`, this run's.
pub(crate) fn check_made_with(
    dir: &Path,
    marker: &PartMarker,
    identity: &PartIdentity,
) -> Result<(), PartsError> {
    match marker.identity.difference(identity) {
        Some((field, theirs, ours)) => Err(PartsError::Mismatch {
            part: dir.to_path_buf(),
            field,
            theirs,
            other: "this run".to_string(),
            ours,
        }),
        None => Ok(()),
    }
}

/// Write a part's marker, atomically: the part's commit.
pub(super) fn write_marker(dir: &Path, marker: &PartMarker) -> Result<(), PartsError> {
    let mut text = serde_json::to_vec_pretty(marker).map_err(|e| PartsError::BadMarker {
        path: dir.join(MARKER_FILE),
        reason: e.to_string(),
    })?;
    text.push(b'\n');
    // The ids are durable under their name; a crash test stops here (the part must
    // then count as incomplete).
    fail::fail_point!("tokens/part-marker");
    atomic::write_file(&dir.join(MARKER_FILE), &text)?;
    Ok(())
}
