//! The one place that turns text from outside (tensor names, paths, metadata, checkpoint
//! names, error causes) into something safe to show on a terminal.
//!
//! Invariants: `escape` never lets a control character, a bidirectional control, a
//! zero-width character or a line/paragraph separator through raw (they become
//! `\u{..}`); every other character, `café` included, is shown as itself; and escaping
//! is idempotent (`escape(escape(s)) == escape(s)`), so a message that already holds
//! escaped names can be escaped again as a whole without changing. JSON output never
//! goes through here: it carries names exactly and lets the JSON encoder escape.

/// Characters that are not control characters (Unicode Cc) but still change what a
/// terminal shows, so that a name could display as another name ("Trojan Source"):
/// the bidirectional marks, embeddings, overrides and isolates, the zero-width and
/// invisible formatting characters, and the line and paragraph separators.
const INVISIBLE: &[char] = &[
    '\u{00ad}', // soft hyphen: invisible unless a line breaks there
    '\u{061c}', // Arabic letter mark (bidi)
    '\u{180e}', // Mongolian vowel separator (zero width)
    '\u{200b}', // zero width space
    '\u{200c}', // zero width non-joiner
    '\u{200d}', // zero width joiner
    '\u{200e}', // left-to-right mark
    '\u{200f}', // right-to-left mark
    '\u{2028}', // line separator
    '\u{2029}', // paragraph separator
    '\u{202a}', // left-to-right embedding
    '\u{202b}', // right-to-left embedding
    '\u{202c}', // pop directional formatting
    '\u{202d}', // left-to-right override
    '\u{202e}', // right-to-left override
    '\u{2060}', // word joiner
    '\u{2061}', // function application (invisible)
    '\u{2062}', // invisible times
    '\u{2063}', // invisible separator
    '\u{2064}', // invisible plus
    '\u{2066}', // left-to-right isolate
    '\u{2067}', // right-to-left isolate
    '\u{2068}', // first strong isolate
    '\u{2069}', // pop directional isolate
    '\u{feff}', // zero width no-break space (byte order mark)
];

/// Whether `c` must not reach a terminal raw.
fn needs_escape(c: char) -> bool {
    c.is_control() || INVISIBLE.contains(&c)
}

/// Escape text from outside for display: control characters, bidirectional controls,
/// zero-width characters and U+2028/U+2029 become `\u{hex}`; everything else,
/// including all other non-ASCII text, is kept as it is.
pub fn escape(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len().saturating_add(8));
    for c in s.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` between double quotes, for a name inside a sentence of a core message. It does
/// not escape: core messages carry names exactly (JSON output must show them exactly),
/// and are escaped as a whole where they reach a terminal (`error::one_line` for errors,
/// the command layer for reports).
pub fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

#[cfg(test)]
mod tests {
    use super::{escape, quote};
    use proptest::prelude::*;

    #[test]
    fn escapes_controls_bidi_zero_width_and_separators() {
        assert_eq!(
            escape("a\u{0}b\u{1b}c\nd\u{7f}"),
            "a\\u{0}b\\u{1b}c\\u{a}d\\u{7f}"
        );
        assert_eq!(escape("l\u{2028}s\u{2029}x"), "l\\u{2028}s\\u{2029}x");
        for c in ('\u{202a}'..='\u{202e}').chain('\u{2066}'..='\u{2069}') {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", u32::from(c)));
        }
        for c in ['\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}'] {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", u32::from(c)));
        }
        // C1 controls (U+0080..U+009F) are controls too.
        assert_eq!(escape("\u{85}\u{9b}"), "\\u{85}\\u{9b}");
    }

    #[test]
    fn keeps_ordinary_non_ascii_text() {
        for s in [
            "café",
            "naïve Ñandú",
            "日本語",
            "Ελληνικά",
            "emoji 🦀",
            "a\\b",
        ] {
            assert_eq!(escape(s), s);
        }
        assert_eq!(quote("café"), "\"café\"");
        assert_eq!(escape(&quote("x\u{202e}y")), "\"x\\u{202e}y\"");
    }

    proptest! {
        #[test]
        fn escaped_text_is_safe_and_escaping_is_idempotent(s in any::<String>()) {
            let once = escape(&s);
            prop_assert!(!once.chars().any(super::needs_escape));
            prop_assert_eq!(escape(&once), once.clone());
            // Nothing is lost: without escapable characters the text is unchanged.
            if !s.chars().any(super::needs_escape) {
                prop_assert_eq!(once, s);
            }
        }
    }
}
