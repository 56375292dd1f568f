//! The run bound of cl100k_base, which tiktoken encodes itself: a document over
//! [`MAX_PIECE_BYTES`] is scanned for a run of one kind of character longer than that.
//!
//! Invariant: the scan is linear (the `regex` crate, no backtracking) and refuses
//! exactly the documents holding such a run.

use super::o200k::PieceTooLong;
#[cfg(doc)]
use super::o200k::MAX_PIECE_BYTES;

/// Runs of letters, of other visible characters and of whitespace: every pre-token of
/// cl100k's pattern is one such run plus at most one character before it and a newline
/// run after it, so bounding the runs bounds the pieces tiktoken merges.
pub(super) const RUNS: &str = r"\p{L}+|[^\s\p{L}\p{N}]+|\s+";

/// Refuse `text` when a run of one kind of character is longer than `max` bytes.
///
/// cl100k is encoded by tiktoken itself (its pattern has no backtracking trap), whose
/// merge of one piece needs about 50 bytes of memory per byte: a 1 GB run of one letter
/// would ask for 50 GB. A run longer than `max` would be (part of) a piece longer than
/// `max`, which the other encoders refuse as well; shorter documents cannot hold one,
/// so only documents over `max` bytes are scanned (linear, by the non-backtracking
/// `regex` engine).
pub(super) fn longest_run_within(text: &str, max: usize) -> Result<(), PieceTooLong> {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    if text.len() <= max {
        return Ok(());
    }
    // The pattern is a constant known to compile (a unit test builds it); were it not,
    // nothing is scanned rather than every document refused.
    let Some(re) = RE.get_or_init(|| regex::Regex::new(RUNS).ok()) else {
        return Ok(());
    };
    match re.find_iter(text).map(|m| m.len()).find(|&n| n > max) {
        Some(n) => Err(PieceTooLong(n)),
        None => Ok(()),
    }
}
