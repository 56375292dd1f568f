//! `s3://bucket/key` URLs: the bucket by S3's naming rules, the key (or prefix) as
//! `/`-separated segments that are never empty, `.` or `..`, with no control character,
//! backslash, `?` or `#`.
//!
//! Invariant: a parsed URL prints back as its canonical text (`s3://bucket/key`, no
//! trailing slash), and `join` only ever appends plain segments below it, so a name
//! read from storage can never address an object outside the prefix.

use super::S3Error;

/// The scheme every object-storage URL starts with.
pub const URL_SCHEME: &str = "s3://";
/// The longest key S3 accepts, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;
/// Bucket names are 3 to 63 characters.
const BUCKET_LEN: std::ops::RangeInclusive<usize> = 3..=63;

/// True when `text` is meant as an object-storage URL (starts with `s3://`); whether
/// it is a valid one is [`S3Url::parse`]'s to say.
pub fn is_s3_url(text: &str) -> bool {
    text.starts_with(URL_SCHEME)
}

/// A validated `s3://bucket/key` URL; `key` is empty for the bucket's root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct S3Url {
    bucket: String,
    key: String,
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{URL_SCHEME}{}", self.bucket)
        } else {
            write!(f, "{URL_SCHEME}{}/{}", self.bucket, self.key)
        }
    }
}

impl S3Url {
    /// Parse and validate `text`; one trailing `/` (a prefix written as a folder) is
    /// accepted and dropped.
    pub fn parse(text: &str) -> Result<Self, S3Error> {
        let bad = |reason: &str| S3Error::BadUrl {
            url: crate::text::escape(&crate::text::redact(text)),
            reason: reason.to_string(),
        };
        let rest = text
            .strip_prefix(URL_SCHEME)
            .ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket).map_err(|r| bad(&r))?;
        let key = key.strip_suffix('/').unwrap_or(key);
        if !key.is_empty() {
            check_key(key).map_err(|r| bad(&r))?;
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key (or prefix), without a leading or trailing `/`; empty for the root.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The last segment of the key (the "file name"); empty for the root.
    pub fn name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or("")
    }

    /// The URL of `name` below this one; `name` must be one or more valid segments.
    pub fn join(&self, name: &str) -> Result<Self, S3Error> {
        let key = if self.key.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.key)
        };
        check_key(&key).map_err(|reason| S3Error::BadUrl {
            url: crate::text::escape(&crate::text::redact(&format!("{self}/{name}"))),
            reason,
        })?;
        Ok(S3Url {
            bucket: self.bucket.clone(),
            key,
        })
    }

    /// The key of `name` below this prefix, as a listing returns it (`prefix/name`).
    pub fn child_key(&self, name: &str) -> String {
        if self.key.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.key)
        }
    }

    /// The URL of another key in the same bucket.
    pub fn with_key(&self, key: &str) -> Result<Self, S3Error> {
        S3Url::parse(&format!("{URL_SCHEME}{}/{key}", self.bucket))
    }
}

/// S3's bucket rules: 3-63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit, no `..`.
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("no bucket name".to_string());
    }
    if !BUCKET_LEN.contains(&bucket.len()) {
        return Err(format!(
            "bucket name {} is not 3 to 63 characters long",
            crate::text::quote(bucket)
        ));
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let bytes = bucket.as_bytes();
    if !bytes.iter().all(|&b| allowed(b))
        || !edge(bytes.first())
        || !edge(bytes.last())
        || bucket.contains("..")
    {
        return Err(format!(
            "bucket name {} breaks S3's rules (lowercase letters, digits, '.' and '-', starting and ending with a letter or digit)",
            crate::text::quote(bucket)
        ));
    }
    Ok(())
}

/// A key: at most [`MAX_KEY_BYTES`], segments never empty, `.` or `..`, no control
/// character, `\`, `?` or `#`.
fn check_key(key: &str) -> Result<(), String> {
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("the key is longer than {MAX_KEY_BYTES} bytes"));
    }
    if let Some(c) = key
        .chars()
        .find(|&c| c.is_control() || matches!(c, '\\' | '?' | '#'))
    {
        return Err(format!(
            "the key holds {}, which tlio does not accept in a key",
            crate::text::quote(&c.to_string())
        ));
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err("the key has an empty segment ('//' or a leading '/')".into()),
            "." | ".." => {
                return Err(format!(
                    "the key has a {} segment",
                    crate::text::quote(segment)
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_and_key_canonically() {
        let u = S3Url::parse("s3://my-bucket/runs/ckpt/").unwrap();
        assert_eq!(u.bucket(), "my-bucket");
        assert_eq!(u.key(), "runs/ckpt");
        assert_eq!(u.name(), "ckpt");
        assert_eq!(u.to_string(), "s3://my-bucket/runs/ckpt");
        let root = S3Url::parse("s3://b.example-1").unwrap();
        assert_eq!(root.key(), "");
        assert_eq!(root.to_string(), "s3://b.example-1");
        assert_eq!(
            S3Url::parse("s3://abc/").unwrap(),
            S3Url::parse("s3://abc").unwrap()
        );
        let j = u.join("step-000001/MANIFEST.json").unwrap();
        assert_eq!(
            j.to_string(),
            "s3://my-bucket/runs/ckpt/step-000001/MANIFEST.json"
        );
        assert_eq!(root.join("x").unwrap().key(), "x");
        assert_eq!(u.child_key("LATEST"), "runs/ckpt/LATEST");
    }

    #[test]
    fn refuses_malformed_urls_with_the_rule() {
        for (text, rule) in [
            ("/local/path", "does not start with s3://"),
            ("S3://bucket/k", "does not start with s3://"),
            ("s3:/bucket/k", "does not start with s3://"),
            ("s3://", "no bucket name"),
            ("s3:///key", "no bucket name"),
            ("s3://ab/k", "not 3 to 63"),
            ("s3://Upper/k", "breaks S3's rules"),
            ("s3://-lead/k", "breaks S3's rules"),
            ("s3://trail-/k", "breaks S3's rules"),
            ("s3://a..b/k", "breaks S3's rules"),
            ("s3://under_score/k", "breaks S3's rules"),
            ("s3://bucket//k", "empty segment"),
            ("s3://bucket/a//b", "empty segment"),
            ("s3://bucket/a/../b", "\"..\" segment"),
            ("s3://bucket/./b", "\".\" segment"),
            ("s3://bucket/a?b", "does not accept"),
            ("s3://bucket/a#b", "does not accept"),
            ("s3://bucket/a\\b", "does not accept"),
            ("s3://bucket/a\nb", "does not accept"),
        ] {
            let err = S3Url::parse(text).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(rule), "{text:?}: {msg}");
            assert!(msg.contains("not a valid s3://bucket/key URL"), "{msg}");
        }
        let long = format!("s3://bucket/{}", "k".repeat(MAX_KEY_BYTES + 1));
        assert!(S3Url::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("longer than"));
        let u = S3Url::parse("s3://bucket/p").unwrap();
        assert!(u.join("../x").is_err());
        assert!(u.join("").is_err());
        assert!(u.join("a/").is_err());
    }

    proptest::proptest! {
        /// Whatever text comes in, parsing never panics, and a URL that parses prints
        /// back as text that parses to the same URL.
        #[test]
        fn parse_round_trips_or_refuses(text in "s3://[a-z0-9.\\-]{0,8}(/[a-zA-Z0-9._\\-/?#]{0,12})?") {
            if let Ok(u) = S3Url::parse(&text) {
                let again = S3Url::parse(&u.to_string()).unwrap();
                proptest::prop_assert_eq!(again, u);
            }
        }
    }
}
