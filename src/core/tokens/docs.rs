//! The document sidecar of a shard (`X.docs` beside `X.bin`, docs/tokens.md): where each
//! document that starts inside the shard starts, so a stream can reset positions and
//! cut varlen attention at document starts without scanning for an end-of-text id.
//!
//! Format, all little-endian: a 32-byte header — the magic `TLIODOCS` (8 bytes), the
//! version (u32, 1), a reserved u32 (0), the shard's id count (u64, so a sidecar of
//! another shard is refused), the number of documents `count` (u64) — then `count` u64
//! offsets, each the index within the shard of a document's first id.
//!
//! Invariants: offsets are strictly increasing and below the shard's id count (a shard
//! that begins inside a document has no offset 0; one wholly inside a document has none
//! at all); the file is exactly `32 + 8 * count` bytes; `count` is at most
//! [`MAX_DOCUMENTS`], so reading one is bounded; every rule broken names the file.

use std::path::{Path, PathBuf};

use crate::atomic::{AtomicError, AtomicFile, Prepared};
use crate::failure::{Failure, FailureKind};

/// The first 8 bytes of a sidecar.
pub const DOCS_MAGIC: [u8; 8] = *b"TLIODOCS";
/// The sidecar version this build writes and reads.
pub const DOCS_VERSION: u32 = 1;
/// The header's size in bytes.
pub const DOCS_HEADER_BYTES: usize = 32;
/// The most documents one sidecar may record (1 GiB of offsets): reading one is bounded.
pub const MAX_DOCUMENTS: u64 = 1 << 27;
/// The sidecar's extension, in place of the shard's `.bin`.
pub const DOCS_EXTENSION: &str = "docs";
/// Bytes of one offset.
const OFFSET_BYTES: usize = 8;

/// A sidecar that breaks a rule of the format, or cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// Reading or writing the sidecar failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The sidecar.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Committing the sidecar failed.
    #[error(transparent)]
    Write(#[from] AtomicError),
    /// A broken rule of the format.
    #[error("{}: not a valid document sidecar: {rule}", path.display())]
    Bad {
        /// The sidecar.
        path: PathBuf,
        /// The rule it breaks, with the values.
        rule: String,
    },
    /// A window needs boundaries, its shard has no sidecar and no end-of-text id was
    /// given.
    #[error("{}: no document boundaries: the shard has no sidecar {} and the stream has no eot=ID", shard.display(), sidecar.display())]
    NoBoundaries {
        /// The shard.
        shard: PathBuf,
        /// The sidecar looked for.
        sidecar: PathBuf,
    },
}

impl Failure for DocsError {
    fn kind(&self) -> FailureKind {
        match self {
            DocsError::Io { .. } | DocsError::Write(_) | DocsError::NoBoundaries { .. } => {
                FailureKind::Operational
            }
            DocsError::Bad { .. } => FailureKind::Invalid,
        }
    }
}

fn bad(path: &Path, rule: String) -> DocsError {
    DocsError::Bad {
        path: path.to_path_buf(),
        rule,
    }
}

/// The sidecar of the shard at `shard`: `X.docs` for `X.bin`, `X.docs` appended to any
/// other name (so `fw.v2` gives `fw.v2.docs`, never `fw.docs`).
pub fn docs_path(shard: &Path) -> PathBuf {
    if shard.extension().is_some_and(|e| e == "bin") {
        return shard.with_extension(DOCS_EXTENSION);
    }
    let mut name = shard.as_os_str().to_os_string();
    name.push(".");
    name.push(DOCS_EXTENSION);
    PathBuf::from(name)
}

/// Check `starts` against the rules for a shard of `tokens` ids.
fn check_starts(path: &Path, tokens: u64, starts: &[u64]) -> Result<(), DocsError> {
    if starts.len() as u64 > MAX_DOCUMENTS {
        return Err(bad(
            path,
            format!(
                "{} documents, more than the limit of {MAX_DOCUMENTS}",
                starts.len()
            ),
        ));
    }
    let mut previous: Option<u64> = None;
    for (index, &offset) in starts.iter().enumerate() {
        if previous.is_some_and(|p| offset <= p) {
            return Err(bad(
                path,
                format!(
                    "offsets must increase: offset {index} is {offset}, after {}",
                    previous.unwrap_or(0)
                ),
            ));
        }
        if offset >= tokens {
            return Err(bad(
                path,
                format!("offset {index} is {offset}, beyond the shard's {tokens} ids"),
            ));
        }
        previous = Some(offset);
    }
    Ok(())
}

/// The sidecar bytes for a shard of `tokens` ids whose documents start at `starts`
/// (checked as [`decode`] checks them; `path` names it in errors).
pub fn encode(path: &Path, tokens: u64, starts: &[u64]) -> Result<Vec<u8>, DocsError> {
    check_starts(path, tokens, starts)?;
    let size = starts
        .len()
        .checked_mul(OFFSET_BYTES)
        .and_then(|n| n.checked_add(DOCS_HEADER_BYTES))
        .ok_or_else(|| bad(path, "too many documents".to_string()))?;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&DOCS_MAGIC);
    out.extend_from_slice(&DOCS_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&tokens.to_le_bytes());
    out.extend_from_slice(&(starts.len() as u64).to_le_bytes());
    for s in starts {
        out.extend_from_slice(&s.to_le_bytes());
    }
    Ok(out)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(b) = bytes.get(at..at.saturating_add(4)) {
        w.copy_from_slice(b);
    }
    u32::from_le_bytes(w)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(b) = bytes.get(at..at.saturating_add(8)) {
        w.copy_from_slice(b);
    }
    u64::from_le_bytes(w)
}

/// The document starts recorded in the sidecar `bytes` of a shard of `shard_tokens`
/// ids, every rule of the format checked; `path` names it in errors.
pub fn decode(path: &Path, bytes: &[u8], shard_tokens: u64) -> Result<Vec<u64>, DocsError> {
    if bytes.len() < DOCS_HEADER_BYTES {
        return Err(bad(
            path,
            format!(
                "truncated: {} bytes, the header alone is {DOCS_HEADER_BYTES}",
                bytes.len()
            ),
        ));
    }
    if bytes.get(..8) != Some(&DOCS_MAGIC[..]) {
        return Err(bad(path, "bad magic (expected \"TLIODOCS\")".to_string()));
    }
    let version = u32_at(bytes, 8);
    if version != DOCS_VERSION {
        return Err(bad(
            path,
            format!("unsupported version {version} (expected {DOCS_VERSION})"),
        ));
    }
    let reserved = u32_at(bytes, 12);
    if reserved != 0 {
        return Err(bad(path, format!("reserved word is {reserved}, must be 0")));
    }
    let tokens = u64_at(bytes, 16);
    if tokens != shard_tokens {
        return Err(bad(
            path,
            format!("records a shard of {tokens} ids, but its shard holds {shard_tokens}"),
        ));
    }
    let count = u64_at(bytes, 24);
    if count > MAX_DOCUMENTS {
        return Err(bad(
            path,
            format!("{count} documents, more than the limit of {MAX_DOCUMENTS}"),
        ));
    }
    // count <= MAX_DOCUMENTS, so the size fits.
    let expected = (count as usize)
        .checked_mul(OFFSET_BYTES)
        .and_then(|n| n.checked_add(DOCS_HEADER_BYTES))
        .ok_or_else(|| bad(path, "too many documents".to_string()))?;
    if bytes.len() != expected {
        let what = if bytes.len() < expected {
            "truncated"
        } else {
            "trailing bytes"
        };
        return Err(bad(
            path,
            format!(
                "{what}: {count} documents need {expected} bytes, the file has {}",
                bytes.len()
            ),
        ));
    }
    let body = bytes.get(DOCS_HEADER_BYTES..).unwrap_or_default();
    let (offsets, _) = body.as_chunks::<OFFSET_BYTES>();
    let starts: Vec<u64> = offsets.iter().map(|c| u64::from_le_bytes(*c)).collect();
    check_starts(path, tokens, &starts)?;
    Ok(starts)
}

/// The document starts of the shard whose local file is `shard` (of `shard_tokens`
/// ids), from its sidecar; `None` when it has none.
pub fn read_docs(shard: &Path, shard_tokens: u64) -> Result<Option<Vec<u64>>, DocsError> {
    let path = docs_path(shard);
    let limit = MAX_DOCUMENTS
        .saturating_mul(OFFSET_BYTES as u64)
        .saturating_add(DOCS_HEADER_BYTES as u64);
    match crate::files::read_limited(&path, limit) {
        Ok(bytes) => decode(&path, &bytes, shard_tokens).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(DocsError::Io { path, error }),
    }
}

/// Write the sidecar of the shard `shard` (of `tokens` ids, documents at `starts`)
/// durable under a temporary name; the caller renames it into place with the shard.
pub fn prepare_docs(shard: &Path, tokens: u64, starts: &[u64]) -> Result<Prepared, DocsError> {
    let path = docs_path(shard);
    let bytes = encode(&path, tokens, starts)?;
    let mut file = AtomicFile::create(&path)?;
    std::io::Write::write_all(file.writer(), &bytes)
        .map_err(|error| DocsError::Io { path, error })?;
    Ok(file.prepare()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn starts_strategy() -> impl Strategy<Value = (u64, Vec<u64>)> {
        (1u64..5000, proptest::collection::vec(0u64..5000, 0..64)).prop_map(|(n, mut s)| {
            s.retain(|&x| x < n);
            s.sort_unstable();
            s.dedup();
            (n, s)
        })
    }

    proptest! {
        #[test]
        fn sidecars_round_trip((n, starts) in starts_strategy()) {
            let p = Path::new("s.docs");
            let bytes = encode(p, n, &starts).unwrap();
            prop_assert_eq!(bytes.len(), DOCS_HEADER_BYTES + 8 * starts.len());
            prop_assert_eq!(decode(p, &bytes, n).unwrap(), starts);
        }

        /// Any cut of a valid sidecar is refused as truncated, never read short.
        #[test]
        fn truncated_sidecars_are_refused((n, starts) in starts_strategy(), cut in 0usize..600) {
            let p = Path::new("s.docs");
            let bytes = encode(p, n, &starts).unwrap();
            prop_assume!(cut < bytes.len());
            let err = decode(p, &bytes[..cut], n).unwrap_err().to_string();
            prop_assert!(err.contains("s.docs") && err.contains("truncated"), "{}", err);
        }
    }

    fn raw(tokens: u64, offsets: &[u64]) -> Vec<u8> {
        let mut b = DOCS_MAGIC.to_vec();
        b.extend(DOCS_VERSION.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(tokens.to_le_bytes());
        b.extend((offsets.len() as u64).to_le_bytes());
        for o in offsets {
            b.extend(o.to_le_bytes());
        }
        b
    }

    #[test]
    fn bad_sidecars_are_refused_naming_the_file_and_rule() {
        let p = Path::new("d/x.docs");
        let cases: Vec<(Vec<u8>, u64, &str)> = vec![
            (
                raw(10, &[0, 5, 5]),
                10,
                "offsets must increase: offset 2 is 5, after 5",
            ),
            (
                raw(10, &[3, 1]),
                10,
                "offsets must increase: offset 1 is 1, after 3",
            ),
            (
                raw(10, &[0, 10]),
                10,
                "offset 1 is 10, beyond the shard's 10 ids",
            ),
            (
                raw(10, &[0]),
                11,
                "records a shard of 10 ids, but its shard holds 11",
            ),
            (
                {
                    let mut b = raw(10, &[0]);
                    b[0] = b'X';
                    b
                },
                10,
                "bad magic",
            ),
            (
                {
                    let mut b = raw(10, &[0]);
                    b[8] = 2;
                    b
                },
                10,
                "unsupported version 2",
            ),
            (
                {
                    let mut b = raw(10, &[0]);
                    b[12] = 1;
                    b
                },
                10,
                "reserved word is 1",
            ),
            (
                {
                    let mut b = raw(10, &[0]);
                    b.push(0);
                    b
                },
                10,
                "trailing bytes",
            ),
            (
                {
                    let mut b = raw(10, &[]);
                    b[24..32].copy_from_slice(&(MAX_DOCUMENTS + 1).to_le_bytes());
                    b
                },
                10,
                "more than the limit",
            ),
        ];
        for (bytes, n, rule) in cases {
            let err = decode(p, &bytes, n).unwrap_err().to_string();
            assert!(
                err.starts_with("d/x.docs: not a valid document sidecar"),
                "{err}"
            );
            assert!(err.contains(rule), "{err} lacks {rule}");
        }
        assert!(encode(p, 4, &[1, 1]).is_err());
        assert!(encode(p, 4, &[4]).is_err());
    }

    #[test]
    fn the_sidecar_of_a_shard_replaces_bin_only() {
        assert_eq!(
            docs_path(Path::new("a/fw_000001.bin")),
            Path::new("a/fw_000001.docs")
        );
        assert_eq!(docs_path(Path::new("a/fw.v2")), Path::new("a/fw.v2.docs"));
        assert_eq!(docs_path(Path::new("train")), Path::new("train.docs"));
    }

    #[test]
    fn a_missing_sidecar_is_none_and_a_written_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.bin");
        assert!(read_docs(&shard, 9).unwrap().is_none());
        prepare_docs(&shard, 9, &[0, 4]).unwrap().publish().unwrap();
        assert_eq!(read_docs(&shard, 9).unwrap(), Some(vec![0, 4]));
        let err = read_docs(&shard, 8).unwrap_err().to_string();
        assert!(err.contains("s.docs") && err.contains("holds 8"), "{err}");
    }
}
