//! The plan of a partitioned pack: the cuts of the document sequence into N parts, a
//! pure function of the input sizes, their document boundaries and N, and the segments
//! of each part.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{io_err, PartsError};

/// Bytes read at a time when looking for a document boundary.
const SCAN_CHUNK: usize = 64 << 10;

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
pub(super) enum Split {
    /// Never (one document, Parquet, compressed).
    Whole,
    /// After a byte for which `is_end` holds (a newline, whitespace).
    After(fn(u8) -> bool),
    /// At a multiple of this many bytes (raw ids).
    Every(u64),
}

pub(super) fn is_newline(b: u8) -> bool {
    b == b'\n'
}

pub(super) fn is_space(b: u8) -> bool {
    b.is_ascii_whitespace()
}

pub(super) fn compressed(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("gz" | "zst")
    )
}

/// The first position at or after `offset` that follows a byte for which `is_end`
/// holds, reading forward from `offset - 1` (the file's size when there is none).
pub(super) fn scan_boundary(
    path: &Path,
    offset: u64,
    is_end: fn(u8) -> bool,
) -> Result<u64, PartsError> {
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
