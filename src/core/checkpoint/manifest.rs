//! `MANIFEST.json`: the list of every other file of a step directory with its size
//! and sha256, written last; plus the file-name rule that keeps a manifest from ever
//! pointing outside its directory.
//!
//! Invariants: entries are sorted by name (byte order) without duplicates; every name
//! is a plain file name (no `/`, `\`, NUL, not `.`, `..` or empty) and never
//! `MANIFEST.json` itself; the bytes written are a pure function of the entries.

use serde::{Deserialize, Serialize};

use crate::digest::{is_lower_hex, SHA256_HEX_LEN};

/// The manifest's own file name.
pub const MANIFEST_NAME: &str = "MANIFEST.json";
/// The value of the manifest's `format` key.
pub const MANIFEST_FORMAT: &str = "tlio-manifest";
/// The manifest schema version this code writes and reads.
pub const MANIFEST_VERSION: u64 = 1;

/// One listed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Plain file name inside the step directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 of the content, lowercase hex.
    pub sha256: String,
}

/// A parsed, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The step the directory holds.
    pub step: u64,
    /// The files, sorted by name.
    pub files: Vec<ManifestEntry>,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of the manifest schema.
    #[error("malformed manifest: {0}")]
    Malformed(String),
    /// A name that is not a plain file name.
    #[error("manifest names {0:?}, which is not a plain file name")]
    BadName(String),
    /// Names out of byte order or repeated.
    #[error("manifest entries are not sorted by name without duplicates at {0:?}")]
    Unsorted(String),
    /// A sha256 that is not 64 lowercase hex digits.
    #[error("manifest sha256 of {0:?} is not 64 lowercase hex digits")]
    BadSha(String),
}

impl crate::failure::Failure for ManifestError {
    fn kind(&self) -> crate::failure::FailureKind {
        match self {
            ManifestError::Malformed(_)
            | ManifestError::BadName(_)
            | ManifestError::Unsorted(_)
            | ManifestError::BadSha(_) => crate::failure::FailureKind::Invalid,
        }
    }
}

/// True when `name` is a plain file name a manifest may list: not empty, not `.` or
/// `..`, no `/`, `\` or NUL.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == b'\\' || b == 0)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireManifest {
    format: String,
    version: u64,
    step: u64,
    files: Vec<ManifestEntry>,
}

impl Manifest {
    /// A manifest for `files` (sorted here); refuses bad names and duplicates.
    pub fn new(step: u64, mut files: Vec<ManifestEntry>) -> Result<Self, ManifestError> {
        files.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        let m = Manifest { step, files };
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        for e in &self.files {
            if !is_plain_name(&e.name) || e.name == MANIFEST_NAME {
                return Err(ManifestError::BadName(e.name.clone()));
            }
            if !is_lower_hex(&e.sha256, SHA256_HEX_LEN) {
                return Err(ManifestError::BadSha(e.name.clone()));
            }
        }
        for w in self.files.windows(2) {
            if let [a, b] = w {
                if a.name.as_bytes() >= b.name.as_bytes() {
                    return Err(ManifestError::Unsorted(b.name.clone()));
                }
            }
        }
        Ok(())
    }

    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Option<&ManifestEntry> {
        self.files.iter().find(|e| e.name == name)
    }

    /// The canonical bytes: one line of header keys, one line per file, a final newline.
    #[allow(
        clippy::expect_used,
        reason = "serde_json fails only on non-string map keys or a failing Serialize impl; an entry has neither"
    )]
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = format!(
            "{{\"format\":\"{MANIFEST_FORMAT}\",\"version\":{MANIFEST_VERSION},\"step\":{},\"files\":[",
            self.step
        );
        for (i, e) in self.files.iter().enumerate() {
            out.push_str(if i == 0 { "\n  " } else { ",\n  " });
            out.push_str(
                &serde_json::to_string(e)
                    .expect("invariant: an entry of strings and integers serializes"),
            );
        }
        out.push_str("]}\n");
        out.into_bytes()
    }

    /// Parse and validate manifest bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        // serde's derive also accepts structs written as arrays; the schema is objects.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        let objects = value.is_object()
            && value
                .get("files")
                .and_then(|f| f.as_array())
                .is_none_or(|a| a.iter().all(|e| e.is_object()));
        if !objects {
            return Err(ManifestError::Malformed(
                "the manifest and its entries must be JSON objects".into(),
            ));
        }
        let wire: WireManifest =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        if wire.format != MANIFEST_FORMAT {
            return Err(ManifestError::Malformed(format!(
                "format is {:?}, not {MANIFEST_FORMAT:?}",
                wire.format
            )));
        }
        if wire.version != MANIFEST_VERSION {
            return Err(ManifestError::Malformed(format!(
                "version {} is not {MANIFEST_VERSION}",
                wire.version
            )));
        }
        let m = Manifest {
            step: wire.step,
            files: wire.files,
        };
        m.validate()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> ManifestEntry {
        ManifestEntry {
            name: name.into(),
            size: 3,
            sha256: "0".repeat(64),
        }
    }

    #[test]
    fn layout_is_the_spec_example() {
        let m = Manifest::new(
            50,
            vec![entry("trainer_state.json"), entry("model.safetensors")],
        )
        .unwrap();
        let text = String::from_utf8(m.to_json()).unwrap();
        let z = "0".repeat(64);
        assert_eq!(
            text,
            format!(
                "{{\"format\":\"tlio-manifest\",\"version\":1,\"step\":50,\"files\":[\n  \
                 {{\"name\":\"model.safetensors\",\"size\":3,\"sha256\":\"{z}\"}},\n  \
                 {{\"name\":\"trainer_state.json\",\"size\":3,\"sha256\":\"{z}\"}}]}}\n"
            )
        );
        assert_eq!(Manifest::from_json(text.as_bytes()).unwrap(), m);
    }

    #[test]
    fn refuses_names_outside_the_directory() {
        for name in [
            "../x",
            "/etc/passwd",
            "a/b",
            "a\\b",
            ".",
            "..",
            "",
            "a\0b",
            MANIFEST_NAME,
        ] {
            assert!(
                matches!(
                    Manifest::new(1, vec![entry(name)]),
                    Err(ManifestError::BadName(_))
                ),
                "{name:?}"
            );
        }
        assert!(matches!(
            Manifest::new(1, vec![entry("a"), entry("a")]),
            Err(ManifestError::Unsorted(_))
        ));
    }

    #[test]
    fn refuses_malformed_and_unsorted_bytes() {
        let z = "0".repeat(64);
        let unsorted = format!(
            r#"{{"format":"tlio-manifest","version":1,"step":1,"files":[{{"name":"b","size":1,"sha256":"{z}"}},{{"name":"a","size":1,"sha256":"{z}"}}]}}"#
        );
        assert!(matches!(
            Manifest::from_json(unsorted.as_bytes()),
            Err(ManifestError::Unsorted(_))
        ));
        for bad in [
            r#"{"format":"tlio-manifest","version":2,"step":1,"files":[]}"#.to_string(),
            r#"{"format":"x","version":1,"step":1,"files":[]}"#.to_string(),
            r#"{"format":"tlio-manifest","version":1,"step":-1,"files":[]}"#.to_string(),
            r#"{"format":"tlio-manifest","version":1,"step":1,"files":[],"x":1}"#.to_string(),
            format!(
                r#"{{"format":"tlio-manifest","version":1,"step":1,"files":[{{"name":"a","size":1,"sha256":"{}"}}]}}"#,
                "A".repeat(64)
            ),
            "{".to_string(),
            "[\"tlio-manifest\",1,1,[]]".to_string(),
            format!(r#"{{"format":"tlio-manifest","version":1,"step":1,"files":[["a",1,"{z}"]]}}"#),
        ] {
            assert!(Manifest::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
