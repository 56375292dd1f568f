//! Making text from files safe to show: names, metadata and details can hold any
//! Unicode, and must never reach a terminal raw.
//!
//! Invariant: [`escape`]'s output contains no control character and none of the
//! invisible or bidirectional characters listed in `INVISIBLE`; everything else,
//! non-ASCII included, is kept as is.

/// Characters that are not control characters (Unicode Cc) but still change what a
/// terminal shows: line and paragraph separators (U+2028, U+2029), zero-width
/// characters, and the bidirectional controls that can make a name display as another
/// (the "Trojan Source" trick).
const INVISIBLE: &[char] = &[
    '\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{2028}', '\u{2029}', '\u{202a}',
    '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
    '\u{feff}',
];

/// Escape control characters so that names from files never reach a terminal raw:
/// NUL, ESC, newline and friends, and the invisible characters above, are shown as
/// `\u{..}`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || INVISIBLE.contains(&c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_control_characters() {
        assert_eq!(escape("a\u{0}b\u{1b}c\nd"), "a\\u{0}b\\u{1b}c\\u{a}d");
        assert_eq!(escape("héllo"), "héllo");
        assert_eq!(escape("l\u{2028}s\u{202e}x"), "l\\u{2028}s\\u{202e}x");
    }
}
