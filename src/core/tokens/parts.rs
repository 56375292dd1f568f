//! A pack split into parts that run anywhere (`tokens pack --part K/N`) and their merge
//! (`tokens merge`), whose shards are byte-identical to one `tokens pack` of the same
//! inputs with the same options.
//!
//! Invariants:
//! - The plan is a pure function of the input sizes, their document boundaries and N:
//!   part K is a contiguous share of the document sequence (whole files in the order
//!   given, a large uncompressed JSONL or id file cut at a document boundary found by
//!   seeking), the parts tile the sequence in order, and each cut is within one
//!   document (or one unsplittable file) of the ideal `K * total / N` byte.
//! - A part writes its ids as a raw little-endian stream in the final shards' dtype
//!   (never shards: shard boundaries are the merge's), then its completion marker, last
//!   and atomically; a part without a marker is incomplete and is redone from scratch.
//! - A shard of a single pack is a function of the concatenated id stream alone (the
//!   sink cuts it at fixed counts), so the merge cuts the concatenated part streams at
//!   the same counts, writes the same headers, and names the shards the same way.
//!   Every shard is made durable under a temporary name before any final name appears.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::corpus::{
    check_text_options, open_range, range_name, tokenize_sources, Source, TextPackOptions,
    TextPackProgress,
};
use super::pack::{pack_input, IdSink, InputFormat, PackInput, PackOptions, ShardPlan, READ_CHUNK};
pub use super::part_docs::DOCS_FILE;
use super::part_docs::{MergeDocs, PartDocs};
use super::shard::{IdDtype, Layout, ShardHeader, MAX_COUNT, U16_VOCAB_LIMIT};
use super::tokenizer::Tokenizer;
use super::{CorpusFormat, TokensError};
use crate::atomic::{self, AtomicError, AtomicFile, Prepared};
use crate::failure::{Failure, FailureKind};

/// The most parts a pack may be split into.
pub const MAX_PARTS: usize = 1_000_000;
/// The suffix of the part area: `OUT.parts/` beside the output.
pub const AREA_SUFFIX: &str = ".parts";
/// A part's ids, inside its directory `K-of-N`.
pub const IDS_FILE: &str = "ids.bin";
/// A part's completion marker, written last.
pub const MARKER_FILE: &str = "complete.json";
/// The `format` of a marker.
pub const MARKER_FORMAT: &str = "tlio-tokens-part";
/// The marker version this build writes and reads.
pub const MARKER_VERSION: u32 = 2;
/// The largest marker read (it holds the input list).
pub(crate) const MAX_MARKER_BYTES: u64 = 64 << 20;
/// Bytes read at a time when looking for a document boundary.
const SCAN_CHUNK: usize = 64 << 10;
/// Longest value shown in a difference message.
const SHOWN_VALUE_CHARS: usize = 200;

/// Errors of partitioned packs and their merge.
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    /// A part number that is not `K/N` with `0 <= K < N <= MAX_PARTS`.
    #[error("bad part {given:?}: {reason}")]
    BadPart {
        /// What was given.
        given: String,
        /// The rule it breaks.
        reason: String,
    },
    /// Standard input, or no input, cannot be split among machines.
    #[error("a pack in parts reads named files (every part plans the same split); standard input cannot be split")]
    Stdin,
    /// Nothing to merge.
    #[error("{}: no parts (nothing was packed with a part number into this output)", area.display())]
    NoParts {
        /// The part area.
        area: PathBuf,
    },
    /// Parts of different counts in one area.
    #[error("{}: holds parts of {found} and of {expected}: one output is packed in one number of parts (remove the area to start over)", area.display())]
    CountMismatch {
        /// The part area.
        area: PathBuf,
        /// One count found.
        found: usize,
        /// The other.
        expected: usize,
    },
    /// Parts that are missing or have not completed.
    #[error("{}: {count} of {parts} parts missing or incomplete: {missing}", area.display())]
    Missing {
        /// The part area.
        area: PathBuf,
        /// How many.
        count: usize,
        /// N.
        parts: usize,
        /// Their names (`K-of-N`), the first ones.
        missing: String,
    },
    /// Two parts (or a part and this run) made with different options or inputs.
    #[error("{}: made with {field} {theirs}, but {other} has {ours}: every part of one output takes the same inputs and options (remove the area to start over with new ones)", part.display())]
    Mismatch {
        /// The part's directory.
        part: PathBuf,
        /// The differing setting.
        field: String,
        /// Its value in that part.
        theirs: String,
        /// What it is compared with (`this run`, `part 0-of-4`).
        other: String,
        /// Its value there.
        ours: String,
    },
    /// Parts that do not tile the document sequence.
    #[error("{}: starts at {found}, but the part before it ends at {expected}: the parts do not tile the inputs", part.display())]
    NotContiguous {
        /// The part's directory.
        part: PathBuf,
        /// Where it starts.
        found: String,
        /// Where it should.
        expected: String,
    },
    /// A marker that is not one.
    #[error("{}: not a part completion marker: {reason}", path.display())]
    BadMarker {
        /// The marker.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A part's ids that disagree with its marker.
    #[error("{}: {reason} (rerun that part)", path.display())]
    BadIds {
        /// The ids file.
        path: PathBuf,
        /// What disagrees.
        reason: String,
    },
    /// A file or directory could not be read or made.
    #[error("{}: {error}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error (in the message only, printed once).
        error: io::Error,
    },
    /// Packing the part failed.
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// Writing a file failed.
    #[error(transparent)]
    Write(#[from] AtomicError),
}

impl Failure for PartsError {
    fn kind(&self) -> FailureKind {
        match self {
            PartsError::BadPart { .. } | PartsError::Stdin | PartsError::Io { .. } => {
                FailureKind::Operational
            }
            PartsError::NoParts { .. }
            | PartsError::CountMismatch { .. }
            | PartsError::Missing { .. }
            | PartsError::Mismatch { .. }
            | PartsError::NotContiguous { .. }
            | PartsError::BadMarker { .. }
            | PartsError::BadIds { .. } => FailureKind::Invalid,
            PartsError::Tokens(e) => e.kind(),
            PartsError::Write(e) => e.kind(),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PartsError + '_ {
    move |error| PartsError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Part K of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// K, from 0.
    pub index: usize,
    /// N.
    pub count: usize,
}

impl Part {
    /// `K/N` with `0 <= K < N <= MAX_PARTS`.
    pub fn parse(given: &str) -> Result<Part, PartsError> {
        let bad = |reason: &str| PartsError::BadPart {
            given: given.to_string(),
            reason: reason.to_string(),
        };
        let (k, n) = given
            .split_once('/')
            .ok_or_else(|| bad("expected K/N (part K of N, K from 0)"))?;
        let number = |s: &str, what: &str| {
            // Digits only: no sign, no spaces, no 0x.
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{what} is not a number")));
            }
            s.parse::<usize>()
                .ok()
                .filter(|&v| v <= MAX_PARTS)
                .ok_or_else(|| bad(&format!("{what} is above the limit of {MAX_PARTS}")))
        };
        Part::new(number(k, "K")?, number(n, "N")?).map_err(|e| match e {
            PartsError::BadPart { reason, .. } => bad(&reason),
            other => other,
        })
    }

    /// Part `index` of `count`, checked.
    pub fn new(index: usize, count: usize) -> Result<Part, PartsError> {
        let bad = |reason: String| PartsError::BadPart {
            given: format!("{index}/{count}"),
            reason,
        };
        if count == 0 || count > MAX_PARTS {
            return Err(bad(format!("N must be 1 to {MAX_PARTS}")));
        }
        if index >= count {
            return Err(bad(format!(
                "K must be below N (parts are 0 to {})",
                count - 1
            )));
        }
        Ok(Part { index, count })
    }

    /// The part of a Slurm array task: K = `SLURM_ARRAY_TASK_ID` minus
    /// `SLURM_ARRAY_TASK_MIN`, N = `SLURM_ARRAY_TASK_COUNT`, from `var` (the
    /// environment's lookup). The array must be a range with step 1 (`--array=0-15`),
    /// so that the task ids are K's.
    pub fn from_slurm(var: &dyn Fn(&str) -> Option<String>) -> Result<Part, PartsError> {
        let get = |name: &str| -> Result<usize, PartsError> {
            let value = var(name).ok_or_else(|| PartsError::BadPart {
                given: "slurm".to_string(),
                reason: format!("{name} is not set (not inside a Slurm array job)"),
            })?;
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| PartsError::BadPart {
                    given: "slurm".to_string(),
                    reason: format!("{name}={value:?} is not a number"),
                })
        };
        if let Some(step) = var("SLURM_ARRAY_TASK_STEP") {
            if step.trim() != "1" {
                return Err(PartsError::BadPart {
                    given: "slurm".to_string(),
                    reason: format!("SLURM_ARRAY_TASK_STEP is {step}: the array must be a range with step 1 (an array such as 0-N)"),
                });
            }
        }
        let id = get("SLURM_ARRAY_TASK_ID")?;
        let min = get("SLURM_ARRAY_TASK_MIN")?;
        let count = get("SLURM_ARRAY_TASK_COUNT")?;
        let index = id.checked_sub(min).ok_or_else(|| PartsError::BadPart {
            given: "slurm".to_string(),
            reason: format!("SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"),
        })?;
        Part::new(index, count).map_err(|e| match e {
            PartsError::BadPart { reason, .. } => PartsError::BadPart {
                given: "slurm".to_string(),
                reason: format!("{reason} (task {id} of an array from {min}, {count} tasks; the array must be one range with step 1)"),
            },
            other => other,
        })
    }

    /// The part's directory name, `K-of-N`.
    pub fn dir_name(&self) -> String {
        format!("{}-of-{}", self.index, self.count)
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-of-{}", self.index, self.count)
    }
}

/// The part area of output `out`: `OUT.parts` beside it.
pub fn part_area(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_os_string();
    name.push(AREA_SUFFIX);
    PathBuf::from(name)
}

// ----------------------------------------------------------------------------------
// The plan.

/// A point in the document sequence: byte `offset` of input `input`. Ordered as the
/// sequence is; the end is `(inputs, 0)`. A cut's offset is 0 or inside the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    /// The input's index.
    pub input: usize,
    /// The byte offset in it.
    pub offset: u64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "input {} byte {}", self.input, self.offset)
    }
}

/// Bytes `start..end` of input `input`, one piece of a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The input's index.
    pub input: usize,
    /// The first byte.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// The N + 1 cuts of the document sequence into N parts: `cuts[k]..cuts[k + 1]` is
/// part k. `boundary(i, o)` is the first document start at or after byte `o` (0 < o <
/// size) of input `i` (the file's size when none follows), or `None` when that input
/// must stay whole (then the cut goes to the nearer end of the file).
pub fn plan_cuts<E>(
    sizes: &[u64],
    parts: usize,
    boundary: &mut dyn FnMut(usize, u64) -> Result<Option<u64>, E>,
) -> Result<Vec<Position>, E> {
    let total: u128 = sizes.iter().map(|&s| u128::from(s)).sum();
    let end = Position {
        input: sizes.len(),
        offset: 0,
    };
    let mut cuts = vec![Position {
        input: 0,
        offset: 0,
    }];
    for k in 1..parts {
        // floor(total * k / N) < total fits u64 (total is a sum of u64 sizes, but
        // saturate rather than trust that).
        let ideal = total.saturating_mul(k as u128) / parts.max(1) as u128;
        let ideal = u64::try_from(ideal).unwrap_or(u64::MAX);
        let mut cut = end;
        let mut before = 0u64;
        for (i, &size) in sizes.iter().enumerate() {
            let after = before.saturating_add(size);
            if ideal < after {
                let offset = ideal.saturating_sub(before);
                cut = if offset == 0 {
                    Position {
                        input: i,
                        offset: 0,
                    }
                } else {
                    match boundary(i, offset)? {
                        Some(b) if b < size => Position {
                            input: i,
                            offset: b,
                        },
                        Some(_) => Position {
                            input: i.saturating_add(1),
                            offset: 0,
                        },
                        // Whole files: the cut goes to the nearer end.
                        None if offset.saturating_mul(2) < size => Position {
                            input: i,
                            offset: 0,
                        },
                        None => Position {
                            input: i.saturating_add(1),
                            offset: 0,
                        },
                    }
                };
                break;
            }
            before = after;
        }
        let last = cuts.last().copied().unwrap_or(cut);
        cuts.push(cut.max(last));
    }
    cuts.push(end);
    Ok(cuts)
}

/// The segments of the part `from..to` (two consecutive cuts), in order. A file of
/// zero bytes belongs to the part whose range holds its start (a `--from text` file is
/// a document even when empty).
pub fn part_segments(sizes: &[u64], from: Position, to: Position) -> Vec<Segment> {
    let last = to.input.min(sizes.len().saturating_sub(1));
    let mut out = Vec::new();
    if sizes.is_empty() {
        return out;
    }
    for (input, &size) in sizes
        .iter()
        .enumerate()
        .take(last.saturating_add(1))
        .skip(from.input)
    {
        let start = if input == from.input { from.offset } else { 0 };
        let end = if input == to.input { to.offset } else { size };
        if input < to.input || end > start {
            out.push(Segment { input, start, end });
        }
    }
    out
}

/// How an input may be cut.
#[derive(Debug, Clone, Copy)]
enum Split {
    /// Never (one document, Parquet, compressed).
    Whole,
    /// After a byte for which `is_end` holds (a newline, whitespace).
    After(fn(u8) -> bool),
    /// At a multiple of this many bytes (raw ids).
    Every(u64),
}

fn is_newline(b: u8) -> bool {
    b == b'\n'
}

fn is_space(b: u8) -> bool {
    b.is_ascii_whitespace()
}

fn compressed(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("gz" | "zst")
    )
}

/// The first position at or after `offset` that follows a byte for which `is_end`
/// holds, reading forward from `offset - 1` (the file's size when there is none).
fn scan_boundary(path: &Path, offset: u64, is_end: fn(u8) -> bool) -> Result<u64, PartsError> {
    let mut file = crate::files::open_regular(path).map_err(io_err(path))?;
    let mut at = offset.saturating_sub(1);
    file.seek(SeekFrom::Start(at)).map_err(io_err(path))?;
    let mut buf = vec![0u8; SCAN_CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(path)(e)),
        };
        if n == 0 {
            return Ok(at);
        }
        if let Some(i) = buf.get(..n).and_then(|b| b.iter().position(|&b| is_end(b))) {
            return Ok(at.saturating_add(i as u64).saturating_add(1));
        }
        at = at.saturating_add(n as u64);
    }
}

// ----------------------------------------------------------------------------------
// What a part records.

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
fn mtime_ns(path: &Path, meta: &fs::Metadata) -> Result<i64, PartsError> {
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

    fn layout(&self) -> Layout {
        if self.layout == "v2" {
            Layout::V2
        } else {
            Layout::Llama3
        }
    }

    /// The first setting in which `self` and `other` differ, with both values.
    fn difference(&self, other: &PartIdentity) -> Option<(String, String, String)> {
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

fn layout_name(vocab: u32, layout: Layout) -> &'static str {
    match layout {
        _ if vocab <= U16_VOCAB_LIMIT => "llama3",
        Layout::Llama3 => "llama3",
        Layout::V2 => "v2",
    }
}

fn plan_fields(plan: &ShardPlan) -> (&'static str, Option<u64>, Option<u64>) {
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

// ----------------------------------------------------------------------------------
// Running a part.

/// What a part packs with.
#[derive(Clone)]
pub enum PartSource<'a> {
    /// Documents through a tokenizer (`opts.plan` names the final shards).
    Text {
        /// The tokenizer.
        tokenizer: &'a Tokenizer,
        /// Its [`tokenizer_identity`].
        identity: String,
        /// The pack's options.
        opts: &'a TextPackOptions,
    },
    /// Ids: bytes, decimal text or raw arrays.
    Ids {
        /// The pack's options.
        opts: &'a PackOptions,
    },
}

/// One part of a pack.
pub struct PartJob<'a> {
    /// The pack's output (the part area is `OUT.parts`).
    pub out: &'a Path,
    /// Every input of the whole pack, in order.
    pub inputs: &'a [PathBuf],
    /// Which part.
    pub part: Part,
    /// How to pack.
    pub source: PartSource<'a>,
}

/// What running a part did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartOutcome {
    /// The part was complete already (same inputs and options): nothing was done.
    AlreadyComplete(PartMarker),
    /// The part was packed now.
    Packed(PartMarker),
}

impl PartJob<'_> {
    fn vocab(&self) -> u32 {
        match &self.source {
            PartSource::Text { tokenizer, .. } => tokenizer.vocab_size(),
            PartSource::Ids { opts } => opts.vocab,
        }
    }

    fn layout(&self) -> Layout {
        match &self.source {
            PartSource::Text { opts, .. } => opts.layout,
            PartSource::Ids { opts } => opts.layout,
        }
    }

    fn plan(&self) -> ShardPlan {
        match &self.source {
            PartSource::Text { opts, .. } => opts.plan.clone(),
            PartSource::Ids { opts } => match opts.shard_tokens {
                Some(shard_tokens) => ShardPlan::Numbered {
                    out: self.out.to_path_buf(),
                    shard_tokens,
                },
                None => ShardPlan::Single(self.out.to_path_buf()),
            },
        }
    }

    fn identity(&self, stats: &[(u64, i64)]) -> PartIdentity {
        let vocab = self.vocab();
        let (shards, shard_tokens, val_tokens) = plan_fields(&self.plan());
        let (format, tokenizer, field, eot, skip_bad) = match &self.source {
            PartSource::Text { identity, opts, .. } => (
                match opts.format {
                    CorpusFormat::Text => "text",
                    CorpusFormat::Jsonl => "jsonl",
                    CorpusFormat::Parquet => "parquet",
                },
                Some(identity.clone()),
                // Text files have no field.
                (opts.format != CorpusFormat::Text).then(|| opts.field.clone()),
                opts.eot,
                opts.skip_bad,
            ),
            PartSource::Ids { opts } => (
                match opts.format {
                    InputFormat::Bytes => "bytes",
                    InputFormat::Ids => "ids",
                    InputFormat::U16le => "u16le",
                    InputFormat::U32le => "u32le",
                },
                None,
                None,
                None,
                false,
            ),
        };
        PartIdentity {
            parts: self.part.count,
            format: format.to_string(),
            tokenizer,
            field,
            eot,
            skip_bad,
            vocab_size: vocab,
            layout: layout_name(vocab, self.layout()).to_string(),
            shards: shards.to_string(),
            shard_tokens,
            val_tokens,
            inputs: self
                .inputs
                .iter()
                .zip(stats)
                .map(|(p, &(size, mtime_ns))| InputId {
                    path: p.display().to_string(),
                    size,
                    mtime_ns,
                })
                .collect(),
        }
    }

    /// Check the job (before anything is read or written), then its inputs' sizes and
    /// the identity a part of it records.
    pub(crate) fn checked_identity(&self) -> Result<(Vec<u64>, PartIdentity), PartsError> {
        let stats = check_job(self)?;
        let identity = self.identity(&stats);
        Ok((stats.iter().map(|&(size, _)| size).collect(), identity))
    }

    fn split(&self, path: &Path) -> Split {
        match &self.source {
            PartSource::Text { opts, .. } => match opts.format {
                CorpusFormat::Jsonl if !compressed(path) => Split::After(is_newline),
                _ => Split::Whole,
            },
            PartSource::Ids { opts } => match opts.format {
                InputFormat::Bytes => Split::Every(1),
                InputFormat::U16le => Split::Every(2),
                InputFormat::U32le => Split::Every(4),
                InputFormat::Ids => Split::After(is_space),
            },
        }
    }
}

/// Writes a part's ids as a raw little-endian stream in the shards' dtype, hashing
/// them as they go.
struct PartWriter {
    file: AtomicFile,
    path: PathBuf,
    vocab: u32,
    dtype: IdDtype,
    count: u64,
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    /// The document starts, for a tokenized pack.
    docs: Option<PartDocs>,
}

impl PartWriter {
    fn create(path: &Path, vocab: u32, layout: Layout) -> Result<PartWriter, PartsError> {
        let dtype = ShardHeader::for_layout(0, vocab, layout)?.dtype;
        Ok(PartWriter {
            file: AtomicFile::create(path)?,
            path: path.to_path_buf(),
            vocab,
            dtype,
            count: 0,
            hasher: blake3::Hasher::new(),
            buf: Vec::new(),
            docs: None,
        })
    }

    /// Make the ids (and document starts) durable under their final names; returns
    /// the count, bytes, digest and document starts.
    fn finish(self) -> Result<(u64, u64, String, Option<u64>), PartsError> {
        let bytes = self.count.saturating_mul(self.dtype.itemsize() as u64);
        let digest = self.hasher.finalize().to_hex().to_string();
        self.file.commit()?;
        let docs = self.docs.map(PartDocs::finish).transpose()?;
        Ok((self.count, bytes, digest, docs))
    }
}

impl IdSink for PartWriter {
    fn vocab(&self) -> u32 {
        self.vocab
    }

    fn push(&mut self, ids: &[u32]) -> Result<(), TokensError> {
        if let Some((index, &id)) = ids.iter().enumerate().find(|(_, &id)| id >= self.vocab) {
            return Err(TokensError::IdOutOfVocab {
                path: self.path.clone(),
                index: self.count.saturating_add(index as u64),
                id: u64::from(id),
                vocab: self.vocab,
            });
        }
        if let (Some(docs), false) = (&mut self.docs, ids.is_empty()) {
            docs.before_push(self.count)?;
        }
        self.buf.clear();
        match self.dtype {
            // Below vocab <= 65536 (checked above), so each fits u16.
            IdDtype::U16 => self
                .buf
                .extend(ids.iter().flat_map(|&id| (id as u16).to_le_bytes())),
            IdDtype::U32 => self.buf.extend(ids.iter().flat_map(|&id| id.to_le_bytes())),
        }
        self.hasher.update(&self.buf);
        self.file
            .write_all(&self.buf)
            .map_err(|error| TokensError::Io {
                path: self.path.clone(),
                error,
            })?;
        self.count = self.count.saturating_add(ids.len() as u64);
        Ok(())
    }

    fn tokens(&self) -> u64 {
        self.count
    }

    fn start_document(&mut self) {
        if let Some(docs) = &mut self.docs {
            docs.start();
        }
    }
}

/// Read the marker in part directory `dir`, if there is one.
fn read_marker(dir: &Path) -> Result<Option<PartMarker>, PartsError> {
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
fn list_parts(area: &Path) -> Result<Vec<(usize, usize, PathBuf)>, PartsError> {
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
fn check_count(area: &Path, count: usize) -> Result<(), PartsError> {
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

/// Check a part job before anything is read or written; returns each input's size
/// and modification time.
fn check_job(job: &PartJob<'_>) -> Result<Vec<(u64, i64)>, PartsError> {
    if job.inputs.is_empty() || job.inputs.iter().any(|p| p.as_os_str() == "-") {
        return Err(PartsError::Stdin);
    }
    super::pack::refuse_url_inputs(job.inputs.iter().map(PathBuf::as_path))?;
    if let PartSource::Text {
        tokenizer, opts, ..
    } = &job.source
    {
        check_text_options(tokenizer, opts)?;
    }
    let plan = job.plan();
    plan.check()?;
    plan.refuse_inputs(job.inputs.iter().map(PathBuf::as_path))?;
    let mut stats = Vec::with_capacity(job.inputs.len());
    for path in job.inputs {
        let file = crate::files::open_regular(path).map_err(io_err(path))?;
        let meta = file.metadata().map_err(io_err(path))?;
        stats.push((meta.len(), mtime_ns(path, &meta)?));
    }
    check_count(&part_area(job.out), job.part.count)?;
    Ok(stats)
}

/// The marker of the complete part in `dir` made with `identity`; `None` when the part
/// is to be packed (no marker, or one whose ids are gone or cut short, which is
/// removed); an error when it was made with another identity.
fn complete_marker(dir: &Path, identity: &PartIdentity) -> Result<Option<PartMarker>, PartsError> {
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

/// The document sources of a part's segments: whole files, or line ranges.
fn text_sources(inputs: &[PathBuf], sizes: &[u64], segments: &[Segment]) -> Vec<Source> {
    segments
        .iter()
        .filter_map(|s| {
            let path = inputs.get(s.input)?.clone();
            let whole = s.start == 0 && Some(&s.end) == sizes.get(s.input);
            Some(if whole {
                Source::Whole(path)
            } else {
                Source::Lines {
                    path,
                    start: s.start,
                    end: s.end,
                }
            })
        })
        .collect()
}

/// Write a part's marker, atomically: the part's commit.
fn write_marker(dir: &Path, marker: &PartMarker) -> Result<(), PartsError> {
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

/// Pack part `job.part` of the inputs into the part area of `job.out`: its ids, then
/// its marker, last. A part already complete with the same inputs and options is left
/// as it is ([`PartOutcome::AlreadyComplete`]); one without a marker (killed, never
/// run) is packed from scratch; one complete with other inputs or options is refused,
/// naming the difference. `progress` gets the running totals.
pub fn pack_part(
    job: &PartJob<'_>,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<PartOutcome, PartsError> {
    let (sizes, identity) = job.checked_identity()?;
    let dir = part_area(job.out).join(job.part.dir_name());
    if let Some(marker) = complete_marker(&dir, &identity)? {
        return Ok(PartOutcome::AlreadyComplete(marker));
    }
    let cuts = plan_cuts(&sizes, job.part.count, &mut |i, offset| {
        let path = job.inputs.get(i).map_or(Path::new(""), PathBuf::as_path);
        match job.split(path) {
            Split::Whole => Ok(None),
            Split::Every(n) => Ok(Some(offset.div_ceil(n).saturating_mul(n))),
            Split::After(is_end) => scan_boundary(path, offset, is_end).map(Some),
        }
    })?;
    // plan_cuts returns N + 1 cuts and K < N.
    let cut = |i: usize| {
        cuts.get(i).copied().unwrap_or(Position {
            input: sizes.len(),
            offset: 0,
        })
    };
    let (start, end) = (cut(job.part.index), cut(job.part.index.saturating_add(1)));
    let segments = part_segments(&sizes, start, end);
    crate::files::create_dir_all(&dir).map_err(io_err(&dir))?;
    let ids_path = dir.join(IDS_FILE);
    let mut writer = PartWriter::create(&ids_path, job.vocab(), job.layout())?;
    let (documents, skipped) = match &job.source {
        PartSource::Text {
            tokenizer, opts, ..
        } => {
            let sources = text_sources(job.inputs, &sizes, &segments);
            writer.docs = Some(PartDocs::create(&dir.join(DOCS_FILE))?);
            tokenize_sources(&sources, tokenizer, opts, &mut writer, progress)?
        }
        PartSource::Ids { opts } => {
            pack_id_segments(job.inputs, &segments, opts.format, &mut writer, progress)?;
            (0, 0)
        }
    };
    let (tokens, bytes, blake3, doc_starts) = writer.finish()?;
    let marker = PartMarker {
        format: MARKER_FORMAT.to_string(),
        version: MARKER_VERSION,
        part: job.part.index,
        identity,
        start,
        end,
        documents,
        skipped,
        tokens,
        bytes,
        blake3,
        doc_starts,
    };
    write_marker(&dir, &marker)?;
    Ok(PartOutcome::Packed(marker))
}

/// Pack the id segments into `sink`, each read by seeking to its start.
fn pack_id_segments(
    inputs: &[PathBuf],
    segments: &[Segment],
    format: InputFormat,
    sink: &mut PartWriter,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<(), PartsError> {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut ids = Vec::with_capacity(READ_CHUNK);
    let mut totals = TextPackProgress::default();
    for segment in segments {
        let Some(path) = inputs.get(segment.input) else {
            continue;
        };
        let name = if segment.start == 0 {
            path.display().to_string()
        } else {
            range_name(path, segment.start)
        };
        let mut input = PackInput {
            name,
            reader: Box::new(open_range(path, segment.start, segment.end)?),
            path: Some(path.clone()),
        };
        pack_input(&mut input, sink, format, &mut buf, &mut ids, &mut |n| {
            totals.bytes = totals.bytes.saturating_add(n);
        })?;
        totals.tokens = sink.tokens();
        progress(&totals);
    }
    Ok(())
}

// ----------------------------------------------------------------------------------
// The merge.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::pack;
    use proptest::prelude::*;

    fn ids_opts(format: InputFormat, vocab: u32, shard_tokens: Option<u64>) -> PackOptions {
        PackOptions {
            format,
            vocab,
            shard_tokens,
            layout: Layout::default(),
        }
    }

    fn run_part(
        out: &Path,
        inputs: &[PathBuf],
        part: Part,
        opts: &PackOptions,
    ) -> Result<PartOutcome, PartsError> {
        let job = PartJob {
            out,
            inputs,
            part,
            source: PartSource::Ids { opts },
        };
        pack_part(&job, &mut |_| {})
    }

    /// The files of a directory (not the part area), name and bytes, sorted.
    fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    fs::read(&p).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn part_numbers() {
        assert_eq!(Part::parse("0/1").unwrap(), Part { index: 0, count: 1 });
        assert_eq!(Part::parse("3/4").unwrap().dir_name(), "3-of-4");
        for bad in [
            "4/4",
            "1/0",
            "-1/4",
            "1",
            "a/b",
            "1/4/5",
            " 1/4",
            "0x1/4",
            "1/10000001",
            "",
        ] {
            let e = Part::parse(bad).unwrap_err();
            assert!(matches!(e, PartsError::BadPart { .. }), "{bad}: {e}");
            assert_eq!(e.kind(), FailureKind::Operational);
        }
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let ok = env(&[
            ("SLURM_ARRAY_TASK_ID", "7"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Part::from_slurm(&ok).unwrap(), Part { index: 2, count: 4 });
        for bad in [
            &[("SLURM_ARRAY_TASK_ID", "7")][..],
            &[
                ("SLURM_ARRAY_TASK_ID", "9"),
                ("SLURM_ARRAY_TASK_MIN", "5"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
            &[
                ("SLURM_ARRAY_TASK_ID", "4"),
                ("SLURM_ARRAY_TASK_MIN", "5"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
            &[
                ("SLURM_ARRAY_TASK_ID", "6"),
                ("SLURM_ARRAY_TASK_MIN", "5"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
                ("SLURM_ARRAY_TASK_STEP", "2"),
            ],
        ] {
            let lookup = env(bad);
            assert!(Part::from_slurm(&lookup).is_err(), "{bad:?}");
        }
    }

    /// Files as (size, whole?, document starts strictly inside the file).
    fn files_strategy() -> impl Strategy<Value = Vec<(u64, bool, Vec<u64>)>> {
        proptest::collection::vec(
            (
                0u64..200,
                any::<bool>(),
                proptest::collection::vec(1u64..200, 0..8),
            ),
            0..7,
        )
        .prop_map(|files| {
            files
                .into_iter()
                .map(|(size, whole, mut starts)| {
                    starts.retain(|&s| s < size);
                    starts.sort_unstable();
                    starts.dedup();
                    (size, whole, starts)
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The parts tile the inputs in order (every byte of every file in exactly
        /// one part, every empty file in exactly one), every cut is a document
        /// boundary or a file boundary, and each cut is within one document (or one
        /// whole file) of the ideal K * total / N.
        #[test]
        fn part_plan_is_contiguous_complete_and_balanced(
            files in files_strategy(),
            parts in 1usize..12,
        ) {
            let sizes: Vec<u64> = files.iter().map(|f| f.0).collect();
            let cuts = plan_cuts::<()>(&sizes, parts, &mut |i, o| {
                let (size, whole, starts) = &files[i];
                Ok(if *whole { None } else { Some(starts.iter().copied().find(|&s| s >= o).unwrap_or(*size)) })
            }).unwrap();
            prop_assert_eq!(cuts.len(), parts + 1);
            prop_assert_eq!(cuts[0], Position { input: 0, offset: 0 });
            prop_assert_eq!(cuts[parts], Position { input: sizes.len(), offset: 0 });
            let starts_of = |c: &Position| -> u64 { sizes[..c.input].iter().sum::<u64>() + c.offset };
            let total: u64 = sizes.iter().sum();
            // The largest unit a cut cannot enter.
            let unit = files.iter().map(|(size, whole, starts)| {
                if *whole { *size } else {
                    let mut points = vec![0];
                    points.extend(starts);
                    points.push(*size);
                    points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
                }
            }).max().unwrap_or(0);
            for (k, w) in cuts.windows(2).enumerate() {
                prop_assert!(w[0] <= w[1], "cuts out of order at {k}: {cuts:?}");
            }
            for (k, c) in cuts.iter().enumerate().take(parts).skip(1) {
                if c.offset != 0 {
                    let (size, whole, starts) = &files[c.input];
                    prop_assert!(!whole && c.offset < *size && starts.contains(&c.offset), "cut {k} {c:?} is no boundary");
                }
                let ideal = (u128::from(total) * k as u128 / parts as u128) as u64;
                prop_assert!(starts_of(c).abs_diff(ideal) <= unit, "cut {k} at {} is far from {ideal} (unit {unit})", starts_of(c));
            }
            // Every byte once, in order; every file (empty ones too) in exactly one part.
            let mut seen: Vec<(usize, u64, u64)> = Vec::new();
            for k in 0..parts {
                for s in part_segments(&sizes, cuts[k], cuts[k + 1]) {
                    seen.push((s.input, s.start, s.end));
                }
            }
            let mut expect_file = 0;
            let mut expect_offset = 0;
            for &(input, start, end) in &seen {
                if input != expect_file {
                    prop_assert_eq!(expect_offset, sizes[expect_file], "file {} not finished", expect_file);
                    prop_assert_eq!(input, expect_file + 1, "file skipped: {:?}", seen);
                    expect_file = input;
                    expect_offset = 0;
                }
                prop_assert_eq!(start, expect_offset);
                prop_assert!(end >= start && end <= sizes[input]);
                expect_offset = end;
            }
            if !sizes.is_empty() {
                prop_assert_eq!(expect_file, sizes.len() - 1, "files missing: {:?}", seen);
                prop_assert_eq!(expect_offset, sizes[sizes.len() - 1]);
            } else {
                prop_assert!(seen.is_empty());
            }
            let per_file = sizes.iter().enumerate().all(|(i, _)| seen.iter().any(|s| s.0 == i));
            prop_assert!(per_file, "a file in no part: {:?}", seen);
            prop_assert!(seen.iter().all(|s| sizes[s.0] == 0 || s.2 > s.1), "an empty piece of a non-empty file: {:?}", seen);
        }
    }

    proptest! {
        // Each case packs and merges files with fsyncs: fewer cases.
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Any number of parts, merged, gives the files one pack writes, byte for byte,
        /// for every id format (cut inside files at id boundaries).
        #[test]
        fn parts_merge_into_the_single_pack(
            chunks in proptest::collection::vec(proptest::collection::vec(0u16..600, 0..60), 1..4),
            parts in 1usize..6,
            shard in proptest::option::of(1u64..40),
            format in prop_oneof![Just(InputFormat::Bytes), Just(InputFormat::Ids), Just(InputFormat::U16le)],
        ) {
            let dir = tempfile::tempdir().unwrap();
            let one = dir.path().join("one");
            let many = dir.path().join("many");
            let data = dir.path().join("data");
            for d in [&one, &many, &data] { fs::create_dir(d).unwrap(); }
            let vocab = if format == InputFormat::Bytes { 256 } else { 600 };
            let mut inputs = Vec::new();
            for (i, chunk) in chunks.iter().enumerate() {
                let bytes: Vec<u8> = match format {
                    InputFormat::Bytes => chunk.iter().map(|&v| v as u8).collect(),
                    InputFormat::Ids => chunk.iter().map(|v| format!("{v}{}", if v % 3 == 0 { "\n" } else { "  " })).collect::<String>().into_bytes(),
                    _ => chunk.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                let p = data.join(format!("in{i}"));
                fs::write(&p, bytes).unwrap();
                inputs.push(p);
            }
            let opts = ids_opts(format, vocab, shard);
            let readers = inputs.iter().map(|p| PackInput::open(p).unwrap().0).collect();
            let single = pack(readers, &one.join("out"), &opts, &mut |_| {});
            for k in 0..parts {
                let outcome = run_part(&many.join("out"), &inputs, Part::new(k, parts).unwrap(), &opts).unwrap();
                prop_assert!(matches!(outcome, PartOutcome::Packed(_)));
            }
            let merged = merge_parts(&many.join("out"), true, &mut |_| {});
            match single {
                Err(TokensError::Empty) => {
                    prop_assert!(matches!(merged, Err(PartsError::Tokens(TokensError::Empty))), "{merged:?}");
                }
                Err(e) => panic!("{e}"),
                Ok(s) => {
                    let m = merged.unwrap();
                    prop_assert_eq!(m.tokens, s.tokens);
                    prop_assert_eq!(m.shards.len(), s.shards.len());
                    prop_assert_eq!(outputs(&one), outputs(&many));
                }
            }
        }
    }

    #[test]
    fn rerun_is_a_no_op_missing_parts_are_named_and_options_must_agree() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.bin");
        fs::write(&input, vec![7u8; 1000]).unwrap();
        let inputs = vec![input.clone()];
        let out = dir.path().join("o");
        let opts = ids_opts(InputFormat::Bytes, 256, Some(300));
        let p = |k| Part::new(k, 3).unwrap();
        assert!(matches!(
            run_part(&out, &inputs, p(1), &opts).unwrap(),
            PartOutcome::Packed(_)
        ));
        let marker = part_area(&out).join("1-of-3").join(MARKER_FILE);
        let before = fs::read(&marker).unwrap();
        assert!(matches!(
            run_part(&out, &inputs, p(1), &opts).unwrap(),
            PartOutcome::AlreadyComplete(_)
        ));
        assert_eq!(fs::read(&marker).unwrap(), before);
        let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string()
                .contains("2 of 3 parts missing or incomplete: 0-of-3, 2-of-3"),
            "{e}"
        );
        assert_eq!(e.kind(), FailureKind::Invalid);
        // Another shard size for the same part: refused, naming the setting.
        let other = ids_opts(InputFormat::Bytes, 256, Some(200));
        let e = run_part(&out, &inputs, p(1), &other).unwrap_err();
        assert!(
            e.to_string()
                .contains("made with shard_tokens 300, but this run has 200"),
            "{e}"
        );
        // Another part made with it: the merge names the difference.
        run_part(&out, &inputs, p(0), &opts).unwrap();
        run_part(&out, &inputs, p(2), &other).unwrap();
        let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string()
                .contains("2-of-3: made with shard_tokens 200, but part 0-of-3 has 300"),
            "{e}"
        );
        // Another count in the same area.
        let e = run_part(&out, &inputs, Part::new(0, 2).unwrap(), &opts).unwrap_err();
        assert!(matches!(e, PartsError::CountMismatch { .. }), "{e}");
        // A part whose ids were cut short is redone by a rerun, refused by the merge.
        fs::remove_dir_all(part_area(&out).join("2-of-3")).unwrap();
        run_part(&out, &inputs, p(2), &opts).unwrap();
        let ids = part_area(&out).join("0-of-3").join(IDS_FILE);
        fs::write(&ids, b"x").unwrap();
        let e = merge_parts(&out, false, &mut |_| {}).unwrap_err();
        assert!(matches!(e, PartsError::BadIds { .. }), "{e}");
        assert!(matches!(
            run_part(&out, &inputs, p(0), &opts).unwrap(),
            PartOutcome::Packed(_)
        ));
        let m = merge_parts(&out, true, &mut |_| {}).unwrap();
        assert_eq!(m.tokens, 1000);
        assert_eq!(m.shards.len(), 4);
        // Standard input cannot be split.
        let e = run_part(&out, &[PathBuf::from("-")], p(0), &opts).unwrap_err();
        assert!(matches!(e, PartsError::Stdin));
    }
}
