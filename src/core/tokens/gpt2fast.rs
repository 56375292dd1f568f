//! A fast exact encoder for the GPT-2 family (`r50k_base`, `p50k_base`): tiktoken's
//! algorithm with its regex replaced by a hand-written scanner and a cache of pieces.
//!
//! Invariants: `encode` returns exactly what tiktoken's `encode_ordinary` returns.
//! The scanner implements GPT-2's pattern
//! `'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s`
//! alternative by alternative (leftmost-first), with the character classes taken from
//! the same Unicode tables the regex engine uses (built once by running `regex` over
//! every code point); the merge loop is tiktoken's `byte_pair_encode`, over ranks read
//! back from the built-in encoding itself. A property test holds the scanner to the
//! regex on random Unicode text, and the reference fixtures hold the whole encoder to
//! tiktoken.
//!
//! Why: the regex (fancy-regex, as in tiktoken) is most of tiktoken's cost; this
//! scanner does one table lookup per character.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

use super::o200k::{PieceTooLong, MAX_PIECE_BYTES};

/// Character classes of the GPT-2 pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s` (Unicode White_Space).
    Space,
    /// Everything else.
    Other,
}

/// The largest piece whose encoding is cached (longer ones are rare and costly to hold).
const MAX_CACHED_PIECE: usize = 64;
/// Pieces this long or longer go to tiktoken's own merge (a heap-based variant that
/// stays fast on huge pieces, where the simple loop is quadratic).
const LONG_PIECE: usize = 100;
/// Cached pieces per thread before the cache is cleared (bounded memory).
const MAX_CACHE_ENTRIES: usize = 1 << 16;

/// Class of every code point, two bits each.
struct Classes {
    bits: Vec<u8>,
}

impl Classes {
    fn build() -> Classes {
        let mut bits = vec![0u8; 0x110000 / 4];
        // Every scalar value, in order, as one string; then each class marked by the
        // regex engine's own Unicode tables. The regexes are constants that compile.
        let all: String = (0..0x110000u32).filter_map(char::from_u32).collect();
        for (pattern, class) in [(r"\p{L}+", 1u8), (r"\p{N}+", 2), (r"\s+", 3)] {
            let Ok(re) = regex::Regex::new(pattern) else {
                continue;
            };
            for m in re.find_iter(&all) {
                for c in m.as_str().chars() {
                    let i = c as usize;
                    if let Some(b) = bits.get_mut(i / 4) {
                        *b |= class << ((i % 4) * 2);
                    }
                }
            }
        }
        Classes { bits }
    }

    fn of(&self, c: char) -> Class {
        if c.is_ascii() {
            return match c {
                'a'..='z' | 'A'..='Z' => Class::Letter,
                '0'..='9' => Class::Number,
                ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => Class::Space,
                _ => Class::Other,
            };
        }
        let i = c as usize;
        let v = self.bits.get(i / 4).map_or(0, |b| (b >> ((i % 4) * 2)) & 3);
        match v {
            1 => Class::Letter,
            2 => Class::Number,
            3 => Class::Space,
            _ => Class::Other,
        }
    }
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(Classes::build)
}

/// The end (byte offset) of the piece starting at `start` of `text`, by the GPT-2
/// pattern. `start < text.len()`, on a character boundary.
fn piece_end(text: &str, start: usize, cls: &Classes) -> usize {
    let rest = text.get(start..).unwrap_or("");
    let bytes = rest.as_bytes();
    // 1. '(?:[sdmt]|ll|ve|re)
    if bytes.first() == Some(&b'\'') {
        match bytes.get(1) {
            Some(b's' | b'd' | b'm' | b't') => return start + 2,
            Some(b'l') if bytes.get(2) == Some(&b'l') => return start + 3,
            Some(b'v') if bytes.get(2) == Some(&b'e') => return start + 3,
            Some(b'r') if bytes.get(2) == Some(&b'e') => return start + 3,
            _ => {}
        }
    }
    let mut chars = rest.char_indices().peekable();
    let Some((_, first)) = chars.next() else {
        return text.len();
    };
    // 2-4.  ?\p{L}++ |  ?\p{N}++ |  ?[^\s\p{L}\p{N}]++
    let (run_class, run_start) = if first == ' ' {
        match chars.peek() {
            Some(&(_, c)) if cls.of(c) != Class::Space => {
                chars.next();
                (cls.of(c), true)
            }
            _ => (Class::Space, false),
        }
    } else {
        (cls.of(first), true)
    };
    if run_start && run_class != Class::Space {
        for (i, c) in chars {
            if cls.of(c) != run_class {
                return start + i;
            }
        }
        return text.len();
    }
    // 5-7. \s++$ | \s+(?!\S) | \s  (first is whitespace here)
    let mut last_start = 0;
    let mut end = rest.len();
    let mut count = 1usize;
    for (i, c) in rest.char_indices().skip(1) {
        if cls.of(c) != Class::Space {
            end = i;
            break;
        }
        last_start = i;
        count += 1;
    }
    if end == rest.len() {
        // The run reaches the end of the text: all of it.
        return text.len();
    }
    if count >= 2 {
        // Followed by a non-space: all but the last whitespace character.
        start + last_start
    } else {
        // A single whitespace character.
        start + end
    }
}

/// tiktoken's merge loop: repeatedly merge the adjacent pair of lowest rank.
fn byte_pair_encode(piece: &[u8], ranks: &HashMap<Vec<u8>, u32>, out: &mut Vec<u32>) {
    if piece.len() == 1 {
        out.extend(ranks.get(piece).copied());
        return;
    }
    let rank_of = |parts: &[(usize, u32)], i: usize| -> u32 {
        match (parts.get(i), parts.get(i + 3)) {
            (Some(&(a, _)), Some(&(b, _))) => piece
                .get(a..b)
                .and_then(|s| ranks.get(s))
                .copied()
                .unwrap_or(u32::MAX),
            _ => u32::MAX,
        }
    };
    // (start, rank of the pair starting here), plus two sentinels, as tiktoken.
    let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
    let mut min_rank = (u32::MAX, usize::MAX);
    for i in 0..piece.len().saturating_sub(1) {
        let rank = piece
            .get(i..i + 2)
            .and_then(|s| ranks.get(s))
            .copied()
            .unwrap_or(u32::MAX);
        if rank < min_rank.0 {
            min_rank = (rank, i);
        }
        parts.push((i, rank));
    }
    parts.push((piece.len() - 1, u32::MAX));
    parts.push((piece.len(), u32::MAX));
    while min_rank.0 != u32::MAX {
        let i = min_rank.1;
        if i > 0 {
            let r = rank_of(&parts, i - 1);
            if let Some(p) = parts.get_mut(i - 1) {
                p.1 = r;
            }
        }
        let r = rank_of(&parts, i);
        if let Some(p) = parts.get_mut(i) {
            p.1 = r;
        }
        if i + 1 < parts.len() {
            parts.remove(i + 1);
        }
        min_rank = (u32::MAX, usize::MAX);
        for (j, &(_, rank)) in parts.iter().enumerate().take(parts.len().saturating_sub(1)) {
            if rank < min_rank.0 {
                min_rank = (rank, j);
            }
        }
    }
    for w in parts.windows(2) {
        if let [(a, _), (b, _)] = w {
            out.extend(piece.get(*a..*b).and_then(|s| ranks.get(s)).copied());
        }
    }
}

/// The fast GPT-2-family encoder.
pub struct Gpt2Fast {
    core: &'static CoreBPE,
    ranks: HashMap<Vec<u8>, u32>,
}

thread_local! {
    /// Encodings of pieces that are not one token, per thread.
    static CACHE: RefCell<HashMap<Vec<u8>, Vec<u32>>> = RefCell::new(HashMap::new());
}

impl Gpt2Fast {
    /// Build from a tiktoken core with the GPT-2 pattern, whose ids are `0..n_vocab`,
    /// the special tokens `specials` aside.
    pub fn from_core(core: &'static CoreBPE, n_vocab: u32, specials: &[u32]) -> Option<Gpt2Fast> {
        let mut ranks = HashMap::with_capacity(n_vocab as usize);
        for rank in (0..n_vocab).filter(|r| !specials.contains(r)) {
            let bytes = core.decode_bytes(&[rank]).ok()?;
            ranks.insert(bytes, rank);
        }
        // Build the class table now, not inside the first document.
        let _ = classes();
        Some(Gpt2Fast { core, ranks })
    }

    /// Ids of `text`, as tiktoken's `encode_ordinary`; a piece longer than
    /// `MAX_PIECE_BYTES` is refused (tiktoken's merge would need tens of bytes per byte).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PieceTooLong> {
        let cls = classes();
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        let mut start = 0;
        let mut too_long = None;
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            while start < text.len() {
                let end = piece_end(text, start, cls).max(start + 1);
                let piece = text.as_bytes().get(start..end).unwrap_or(&[]);
                start = end;
                if let Some(&id) = self.ranks.get(piece) {
                    out.push(id);
                    continue;
                }
                if piece.len() <= MAX_CACHED_PIECE {
                    if let Some(ids) = cache.get(piece) {
                        out.extend_from_slice(ids);
                        continue;
                    }
                }
                if piece.len() > MAX_PIECE_BYTES {
                    too_long = Some(PieceTooLong(piece.len()));
                    return;
                }
                if piece.len() >= LONG_PIECE {
                    // A piece of the pattern is its own single piece again.
                    let text = text.get(start - piece.len()..start).unwrap_or("");
                    out.extend(self.core.encode_ordinary(text));
                    continue;
                }
                let from = out.len();
                byte_pair_encode(piece, &self.ranks, &mut out);
                if piece.len() <= MAX_CACHED_PIECE {
                    if cache.len() >= MAX_CACHE_ENTRIES {
                        cache.clear();
                    }
                    cache.insert(piece.to_vec(), out.get(from..).unwrap_or(&[]).to_vec());
                }
            }
        });
        too_long.map_or(Ok(out), Err)
    }

    /// The pieces of `text` by the scanner (for tests).
    #[cfg(test)]
    fn split(text: &str) -> Vec<&str> {
        let cls = classes();
        let mut out = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = piece_end(text, start, cls).max(start + 1);
            out.push(&text[start..end]);
            start = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPT-2 pattern through fancy-regex, as tiktoken runs it.
    fn regex_split(text: &str) -> Vec<&str> {
        let re = fancy_regex::Regex::new(
            r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s",
        )
        .unwrap();
        re.find_iter(text).map(|m| m.unwrap().as_str()).collect()
    }

    #[test]
    fn scanner_matches_the_regex_on_edge_cases() {
        for text in [
            "",
            " ",
            "  ",
            "a",
            " a",
            "  a",
            "\ta",
            " \ta",
            "a  ",
            "a \n",
            "hello world",
            "I'm you'll they've we're it's 'x ''s",
            "'S 'LL",
            "12 34  56\n\n7",
            "x  !!?? ..  ",
            "\r\n\r\n  \u{a0}\u{3000}z",
            "é\u{301}ñ \u{301}x",
            "😀 😀😀 a😀",
            "   leading and trailing   ",
            "a\u{85}b\u{2028}c",
        ] {
            assert_eq!(Gpt2Fast::split(text), regex_split(text), "{text:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        #[test]
        fn scanner_matches_the_regex(text in "(\\PC|[ \t\n\r'sdmtlvre0-9]|\\p{M}|\\p{Zs}){0,40}") {
            proptest::prop_assert_eq!(Gpt2Fast::split(&text), regex_split(&text));
        }

        #[test]
        fn encoder_matches_tiktoken_rs(text in "(\\PC|[ \t\n'a-z0-9]|a{100,130}| {99,101}){0,60}") {
            let core = tiktoken_rs::r50k_base_singleton();
            let fast = fast_gpt2();
            proptest::prop_assert_eq!(fast.encode(&text).unwrap(), core.encode_ordinary(&text));
        }
    }

    fn fast_gpt2() -> &'static Gpt2Fast {
        static F: OnceLock<Gpt2Fast> = OnceLock::new();
        F.get_or_init(|| {
            Gpt2Fast::from_core(tiktoken_rs::r50k_base_singleton(), 50257, &[50256]).unwrap()
        })
    }
}
