//! An exact encoder for `o200k_base` without a backtracking regex: tiktoken's pattern
//! run alternative by alternative, the only lookahead (`\s+(?!\S)`) decided by hand,
//! and a heap-based byte-pair merge.
//!
//! Invariants: `encode` returns exactly what tiktoken's `encode_ordinary` returns
//! wherever tiktoken succeeds, and also where it fails: fancy-regex runs `\s+(?!\S)` in
//! its backtracking machine, one stack entry per character, and gives up on a
//! whitespace run of about a million characters (tiktoken then panics). Here the five
//! alternatives before it, which have no lookaround, are one anchored `regex` (the
//! engine fancy-regex itself delegates them to, with the same leftmost-first
//! preference), and the last two are decided from the length of the whitespace run. No
//! piece longer than [`MAX_PIECE_BYTES`] is merged (see there). Property tests hold
//! the pieces to fancy-regex and the ids to tiktoken-rs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use tiktoken_rs::CoreBPE;

/// The longest pre-token (bytes) that is byte-pair merged. The merge costs tens of
/// bytes of memory per byte of one piece (a 1 GB run of one letter asked tiktoken for
/// 32 GB), so a longer piece is refused instead: no real text has a 4 MiB word, and a
/// run of a million no-break spaces (2 MB) still fits.
pub const MAX_PIECE_BYTES: usize = 4 << 20;

/// The alternatives of o200k's pattern before `\s+(?!\S)`, anchored.
const HEAD: &str = concat!(
    r"^(?:",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r")"
);

/// The o200k encoder.
pub struct O200kFast {
    ranks: HashMap<Vec<u8>, u32>,
    head: regex::Regex,
    space: regex::Regex,
}

/// A piece too long to merge (its length in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceTooLong(pub usize);

impl O200kFast {
    /// Build from tiktoken's o200k core, whose ids are `0..n_vocab` but `specials`.
    pub fn from_core(core: &CoreBPE, n_vocab: u32, specials: &[u32]) -> Option<O200kFast> {
        let mut ranks = HashMap::with_capacity(n_vocab as usize);
        for rank in (0..n_vocab).filter(|r| !specials.contains(r)) {
            // o200k has holes below n_vocab (unused ids between the ranks and the
            // specials): skip what does not decode.
            if let Ok(bytes) = core.decode_bytes(&[rank]) {
                ranks.insert(bytes, rank);
            }
        }
        Some(O200kFast {
            ranks,
            head: regex::Regex::new(HEAD).ok()?,
            space: regex::Regex::new(r"^\s+").ok()?,
        })
    }

    /// The end (byte offset) of the piece starting at `start` (< `text.len()`).
    fn piece_end(&self, text: &str, start: usize) -> usize {
        let rest = text.get(start..).unwrap_or("");
        if let Some(m) = self.head.find(rest) {
            if !m.as_str().is_empty() {
                return start + m.end();
            }
        }
        let Some(run) = self.space.find(rest) else {
            // Unreachable for this pattern (every character matches some
            // alternative); one character keeps the scan going.
            return start + rest.chars().next().map_or(1, char::len_utf8);
        };
        let end = start + run.end();
        if end == text.len() {
            // \s+(?!\S) to the end of the text.
            return end;
        }
        let last = run.as_str().chars().last().map_or(0, char::len_utf8);
        if run.end() > last {
            // \s+(?!\S): all but the last whitespace character.
            end - last
        } else {
            // \s+ of a single character.
            end
        }
    }

    /// The pieces of `text` (for tests).
    #[cfg(test)]
    fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = self.piece_end(text, start).max(start + 1);
            out.push(text.get(start..end).unwrap_or(""));
            start = end;
        }
        out
    }

    /// Ids of `text`, as tiktoken's `encode_ordinary`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PieceTooLong> {
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        let mut start = 0;
        while start < text.len() {
            let end = self.piece_end(text, start).max(start + 1);
            let piece = text.as_bytes().get(start..end).unwrap_or(&[]);
            start = end;
            if let Some(&id) = self.ranks.get(piece) {
                out.push(id);
                continue;
            }
            if piece.len() > MAX_PIECE_BYTES {
                return Err(PieceTooLong(piece.len()));
            }
            merge(piece, &self.ranks, &mut out);
        }
        Ok(out)
    }
}

/// tiktoken's byte-pair merge (repeatedly merge the adjacent pair of lowest rank, the
/// leftmost of equals) in O(n log n): a linked list of parts and a heap of candidate
/// pairs, stale entries skipped when popped.
pub(super) fn merge(piece: &[u8], ranks: &HashMap<Vec<u8>, u32>, out: &mut Vec<u32>) {
    let n = piece.len();
    // next[i]: the start of the part after the part starting at i (n at the end).
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let rank_at = |next: &[usize], i: usize| -> Option<u32> {
        let j = *next.get(i)?;
        let k = *next.get(j)?;
        ranks.get(piece.get(i..k)?).copied()
    };
    let mut heap: BinaryHeap<Reverse<(u32, usize)>> = (0..n)
        .filter_map(|i| rank_at(&next, i).map(|r| Reverse((r, i))))
        .collect();
    while let Some(Reverse((rank, i))) = heap.pop() {
        if alive.get(i) != Some(&true) || rank_at(&next, i) != Some(rank) {
            continue;
        }
        // Merge the part at i with the next one.
        let Some(&j) = next.get(i) else { continue };
        let Some(&after) = next.get(j) else { continue };
        if let Some(a) = alive.get_mut(j) {
            *a = false;
        }
        if let Some(x) = next.get_mut(i) {
            *x = after;
        }
        if let Some(p) = prev.get_mut(after) {
            *p = i;
        }
        if let Some(r) = rank_at(&next, i) {
            heap.push(Reverse((r, i)));
        }
        if let Some(&p) = prev.get(i) {
            if let Some(r) = rank_at(&next, p) {
                heap.push(Reverse((r, p)));
            }
        }
    }
    let mut i = 0;
    while i < n {
        let j = next.get(i).copied().unwrap_or(n);
        out.extend(piece.get(i..j).and_then(|s| ranks.get(s)).copied());
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn fast() -> &'static O200kFast {
        static F: OnceLock<O200kFast> = OnceLock::new();
        F.get_or_init(|| {
            let core = tiktoken_rs::o200k_base_singleton();
            let specials: Vec<u32> = core
                .special_tokens()
                .iter()
                .map(|s| core.encode_with_special_tokens(s)[0])
                .collect();
            O200kFast::from_core(core, 200_019, &specials).unwrap()
        })
    }

    fn regex_split(text: &str) -> Vec<&str> {
        let re = fancy_regex::Regex::new(tiktoken_rs::O200K_BASE_PAT_STR).unwrap();
        re.find_iter(text).map(|m| m.unwrap().as_str()).collect()
    }

    #[test]
    fn scanner_matches_the_regex_on_edge_cases() {
        for text in [
            "",
            " ",
            "  ",
            " a",
            "  a",
            "\t\ta",
            "a  ",
            "a \n",
            " \n x",
            "x\n\n  \n y",
            "Hello World's AND I'LL",
            "123456 7 ",
            "x  !!?? ..  \n/",
            "a/\r\n/\nb",
            "\r\n\r\n  \u{a0}\u{3000}z",
            "é\u{301}ñ \u{301}x",
            "😀 😀😀 a😀",
            "a\u{85}b\u{2028}c",
        ] {
            assert_eq!(fast().split(text), regex_split(text), "{text:?}");
        }
    }

    #[test]
    fn long_whitespace_runs_encode_where_tiktoken_panics() {
        // tiktoken's pieces of "x" + n spaces + "y" are "x", n-1 spaces, " y"; the
        // merge of the long run is held to tiktoken's on a run it can still do.
        let core = tiktoken_rs::o200k_base_singleton();
        let run = " ".repeat(200_000);
        let expect: Vec<u32> = core.encode_ordinary(&format!("x{run}y"));
        assert_eq!(fast().encode(&format!("x{run}y")).unwrap(), expect);
        for ws in [" ", "\t", "\u{a0}"] {
            let text = ws.repeat(1_000_000);
            let ids = fast().encode(&text).unwrap();
            let back = core.decode_bytes(&ids).unwrap();
            assert_eq!(back, text.as_bytes());
        }
        let huge = "a".repeat(MAX_PIECE_BYTES + 1);
        assert_eq!(fast().encode(&huge), Err(PieceTooLong(huge.len())));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        #[test]
        fn scanner_matches_the_regex(text in "(\\PC|[ \t\n\r/'sdmtlvreSDMTLVRE0-9]|\\p{M}|\\p{Zs}|\\p{Lu}|\\p{Lt}|\\p{Lm}){0,40}") {
            proptest::prop_assert_eq!(fast().split(&text), regex_split(&text));
        }

        #[test]
        fn encoder_matches_tiktoken_rs(text in "(\\PC|[ \t\n'a-zA-Z0-9]|a{100,130}| {99,300}|ab{50,200}){0,60}") {
            let core = tiktoken_rs::o200k_base_singleton();
            proptest::prop_assert_eq!(fast().encode(&text).unwrap(), core.encode_ordinary(&text));
        }

        #[test]
        fn merge_matches_tiktoken_on_single_pieces(piece in "[a-z]{2,400}|[ ]{2,400}|[=]{2,400}") {
            // Pieces of one class, which tiktoken's regex leaves whole.
            let core = tiktoken_rs::o200k_base_singleton();
            let mut out = Vec::new();
            merge(piece.as_bytes(), &fast().ranks, &mut out);
            proptest::prop_assert_eq!(out, core.encode_ordinary(&piece));
        }
    }
}
