//! The one place that turns text from outside (tensor names, paths, metadata, checkpoint
//! names, error causes) into something safe to show on a terminal.
//!
//! Invariants: `escape` never lets a control character, a bidirectional control, a
//! zero-width character or a line/paragraph separator through raw (they become
//! `\u{..}`); every other character, `café` included, is shown as itself; and escaping
//! is idempotent (`escape(escape(s)) == escape(s)`), so a message that already holds
//! escaped names can be escaped again as a whole without changing. JSON output never
//! goes through here: it carries names exactly and lets the JSON encoder escape.
//! `redact` takes the secrets a URL can carry (a password before the host, a presigned
//! URL's signature, credential and token) out of a message that echoes it.

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

/// What a secret in a message is replaced by.
pub const REDACTED: &str = "***";

/// The query parameters whose values are secrets (a presigned URL's signature, its key
/// id and scope, its session token), in lowercase: names are compared ignoring case.
const SECRET_PARAMS: [&str; 3] = [
    "x-amz-signature=",
    "x-amz-credential=",
    "x-amz-security-token=",
];

/// Where a URL (or a value inside one) ends in a message: at white space or a quote.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>')
}

/// `text` with every secret a URL in it may carry replaced by [`REDACTED`]: the user
/// name and password before the host (`http://***@host`) and the values of
/// [`SECRET_PARAMS`] (`X-Amz-Signature=***`). Everything else is kept, so a message
/// still names the URL and its rule; redacting is idempotent. The one function every
/// message that echoes an endpoint or a URL goes through.
pub fn redact(text: &str) -> String {
    // Query values first: a value may hold an `@` that a userinfo must not end at.
    redact_userinfo(&redact_params(text))
}

/// The userinfo of every `scheme://userinfo@host` in `text` made [`REDACTED`]. An
/// `s3://` URL has none (its authority is a bucket, which holds no `@`), so a key with
/// an `@` in it is kept; elsewhere everything up to the last `@` before the URL's
/// query or end goes, even a password with an unencoded `/`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at.saturating_add(3));
        out.push_str(head);
        let scheme_is_s3 = head
            .strip_suffix("://")
            .is_some_and(|h| h.to_ascii_lowercase().ends_with("s3"));
        let end = tail
            .find(|c: char| ends_url(c) || matches!(c, '?' | '#'))
            .unwrap_or(tail.len());
        let (authority, after) = tail.split_at(end);
        match authority.rfind('@') {
            Some(i) if !scheme_is_s3 => {
                out.push_str(REDACTED);
                out.push_str(authority.get(i..).unwrap_or(""));
            }
            _ => out.push_str(authority),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The value of every [`SECRET_PARAMS`] parameter in `text` made [`REDACTED`] (up to
/// the next `&`, `#`, white space or quote).
fn redact_params(text: &str) -> String {
    // ASCII lowercasing keeps every byte offset, so positions found in `lower` cut
    // `text` at the same places (always after an ASCII `=`, a character boundary).
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    loop {
        let next = SECRET_PARAMS
            .iter()
            .filter_map(|p| {
                let found = lower.get(pos..)?.find(p)?;
                pos.checked_add(found)?.checked_add(p.len())
            })
            .min();
        let Some(start) = next else { break };
        out.push_str(text.get(pos..start).unwrap_or(""));
        out.push_str(REDACTED);
        let value = text.get(start..).unwrap_or("");
        pos = value
            .find(|c: char| ends_url(c) || matches!(c, '&' | '#'))
            .map_or(text.len(), |i| start.saturating_add(i));
    }
    out.push_str(text.get(pos..).unwrap_or(""));
    out
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

    #[test]
    fn redacts_userinfo_and_presigned_values_keeping_the_rest() {
        use super::redact;
        assert_eq!(
            redact("AWS_ENDPOINT_URL \"http://admin:PW@127.0.0.1:9000\": rule"),
            "AWS_ENDPOINT_URL \"http://***@127.0.0.1:9000\": rule"
        );
        assert_eq!(redact("https://a:p/w@h/x"), "https://***@h/x");
        assert_eq!(
            redact("s3://b/k?X-Amz-Signature=abc&X-Amz-Date=1&x-amz-credential=AK%2F1#f"),
            "s3://b/k?X-Amz-Signature=***&X-Amz-Date=1&x-amz-credential=***#f"
        );
        assert_eq!(
            redact("u?X-Amz-Security-Token=t0k\" and http://u@h"),
            "u?X-Amz-Security-Token=***\" and http://***@h"
        );
        // An s3:// key may hold an `@`; a bucket never does.
        assert_eq!(redact("s3://b/me@x/k"), "s3://b/me@x/k");
        let tricky = "http://x-amz-signature=v?z&u@h";
        assert_eq!(redact(tricky), "http://***@h");
        assert_eq!(redact(&redact(tricky)), redact(tricky));
        for kept in ["a@b: no scheme", "http://host:9/p", "", "x-amz-date=1"] {
            assert_eq!(redact(kept), kept);
        }
    }

    proptest! {
        #[test]
        fn redacting_is_idempotent_and_keeps_text_without_urls(s in any::<String>()) {
            let once = super::redact(&s);
            prop_assert_eq!(super::redact(&once), once.clone());
            if !s.contains("://") && !s.to_ascii_lowercase().contains("x-amz-") {
                prop_assert_eq!(once, s);
            }
        }

        #[test]
        fn a_secret_never_survives(user in "[a-z]{1,8}", secret in "[A-Za-z0-9/+]{8,20}") {
            let text = format!(
                "http://{user}:{secret}@127.0.0.1:9/?X-Amz-Signature={secret}&X-Amz-Security-Token={secret}"
            );
            let out = super::redact(&text);
            prop_assert!(!out.contains(&secret), "{}", out);
        }
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
