//! A mixture source named by a local `*` pattern (`web/*.bin`): the files of its
//! directory whose names match, in byte order of their names.
//!
//! Invariants: only the last path segment may hold `*`; the listing is sorted, so the
//! shards (and with them every batch) never depend on the directory's order; a pattern
//! that matches nothing is an error naming it, never an empty source. `s3://` sources
//! and paths without `*` pass through unchanged.

use std::path::{Path, PathBuf};

use super::super::{TokensError, MAX_SHARDS};

/// The pattern character of a source's last segment.
const WILDCARD: char = '*';

/// Whether `name` matches `pattern`, whose `*` stands for any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split(WILDCARD);
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = rest.get(at.saturating_add(piece.len())..).unwrap_or(""),
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The paths a source names: a local path whose last segment holds `*` expands to the
/// matching files of its directory, sorted by name; anything else is itself.
pub fn expand_source(source: &Path) -> Result<Vec<PathBuf>, TokensError> {
    let Some(text) = source.to_str() else {
        return Ok(vec![source.to_path_buf()]);
    };
    if text.starts_with("s3://") || !text.contains(WILDCARD) {
        return Ok(vec![source.to_path_buf()]);
    }
    let name = source
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let dir = match source.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !name.contains(WILDCARD) || dir.to_str().is_some_and(|d| d.contains(WILDCARD)) {
        return Err(TokensError::BadMixture {
            reason: format!("{text}: only the last path segment of a source may hold '*'"),
        });
    }
    let entries = std::fs::read_dir(dir).map_err(|error| TokensError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| TokensError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        if matches(name, file) && entry.path().is_file() {
            found.push(file.to_string());
            if found.len() > MAX_SHARDS {
                return Err(TokensError::TooLarge {
                    name: "the number of shards",
                    value: found.len() as u64,
                    limit: MAX_SHARDS as u64,
                });
            }
        }
    }
    if found.is_empty() {
        return Err(TokensError::BadMixture {
            reason: format!("the source {text} matches no file: a source needs at least one shard"),
        });
    }
    found.sort();
    Ok(found.into_iter().map(|f| dir.join(f)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_matches_any_run() {
        assert!(matches("web_*.bin", "web_000001.bin"));
        assert!(matches("*.bin", ".bin"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(!matches("a*b*c", "aXcYb"));
        assert!(!matches("web_*.bin", "code_1.bin"));
        assert!(!matches("*.bin", "x.bin.tmp"));
    }

    #[test]
    fn a_pattern_lists_its_directory_sorted_and_refuses_nothing_found() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b_2.bin", "b_10.bin", "b_1.bin", "other.txt"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let got = expand_source(&dir.path().join("b_*.bin")).unwrap();
        let names: Vec<_> = got
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["b_1.bin", "b_10.bin", "b_2.bin"]);
        let e = expand_source(&dir.path().join("z_*.bin")).unwrap_err();
        assert!(e.to_string().contains("matches no file"), "{e}");
        let plain = dir.path().join("b_1.bin");
        assert_eq!(expand_source(&plain).unwrap(), [plain]);
    }
}
