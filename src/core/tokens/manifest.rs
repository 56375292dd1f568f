//! A pack's manifest (`OUT.manifest.json`, which a pack to object storage creates last)
//! as a source of shards, and the split a source of it chooses.
//!
//! A pack with a validation split writes `OUT_val_000000.bin` first and its training
//! shards after it, and the manifest lists all of them in that order. A manifest named as
//! a source therefore stands for its training shards only: a run that names it trains
//! on the training data, never on the validation shard. Anything else is chosen
//! explicitly with a fragment: `OUT.manifest.json#val` (the validation shard),
//! `#train` (the default, said out loud) or `#all` (every shard it lists, in its order).
//!
//! Invariants: which split a shard belongs to follows from its name alone, by the pack's
//! naming (`{base}_val_{digits}.bin` is validation, every other name is training), so
//! local and object-storage manifests expand alike; a selection that would be empty is
//! an error naming the manifest and what it does list; a shard name is one plain path
//! segment, so a manifest never reaches outside its folder.

use std::path::{Path, PathBuf};

use super::{Shard, TokensError};

/// A source naming a pack's manifest ends so (before an optional `#split`).
pub const MANIFEST_SUFFIX: &str = ".manifest.json";
/// The `format` value of a pack manifest.
pub const MANIFEST_FORMAT: &str = "tlio token shards 1";
/// The largest manifest read (about 300,000 shards).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// What separates a manifest from the split chosen of it.
pub const SPLIT_MARK: char = '#';

/// One shard of a pack manifest, as a pack writes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestShard {
    /// The object's name beside the manifest (one plain segment).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// sha256 of its bytes, lowercase hex.
    pub sha256: String,
    /// Its id count.
    pub n: u64,
    /// Its document sidecar (docs.rs), beside it, when the pack recorded documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<ManifestDocs>,
}

/// A shard's document sidecar, as a pack's manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestDocs {
    /// The object's name beside the manifest (one plain segment).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// sha256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// A pack's manifest: the shards, in order, written last, so a reader that goes
/// through it sees every shard of the pack or none.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// The shards in stream order.
    pub shards: Vec<ManifestShard>,
    /// The ids of all shards.
    pub tokens: u64,
}

/// Which shards of a manifest a source stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training shards (the default: what a run trains on).
    Train,
    /// The validation shard(s), `{base}_val_NNNNNN.bin`.
    Val,
    /// Every shard the manifest lists, in its order.
    All,
}

impl Split {
    /// The split's name in a source (`train`, `val`, `all`).
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::All => "all",
        }
    }

    fn parse(text: &str) -> Option<Split> {
        [Split::Train, Split::Val, Split::All]
            .into_iter()
            .find(|s| s.name() == text)
    }
}

/// When `source` names a manifest (`X.manifest.json`, or `X.manifest.json#split`): the
/// manifest's own path or URL and the split chosen ([`Split::Train`] without one). `None`
/// for any other source. A fragment that is not a split is an error naming the choices.
pub fn manifest_source(source: &str) -> Result<Option<(&str, Split)>, TokensError> {
    if source.ends_with(MANIFEST_SUFFIX) {
        return Ok(Some((source, Split::Train)));
    }
    let Some((head, tail)) = source.rsplit_once(SPLIT_MARK) else {
        return Ok(None);
    };
    if !head.ends_with(MANIFEST_SUFFIX) {
        return Ok(None);
    }
    match Split::parse(tail) {
        Some(split) => Ok(Some((head, split))),
        None => Err(TokensError::BadManifest {
            path: source.to_string(),
            reason: format!(
                "unknown split {} after {SPLIT_MARK} (train, val or all)",
                crate::text::quote(tail)
            ),
        }),
    }
}

/// Whether the shard `name` of the manifest whose base (its name less
/// [`MANIFEST_SUFFIX`]) is `base` holds validation ids, by the pack's naming.
pub fn is_val_shard(base: &str, name: &str) -> bool {
    name.strip_prefix(base)
        .and_then(|rest| rest.strip_prefix("_val_"))
        .and_then(|rest| rest.strip_suffix(".bin"))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

impl Manifest {
    /// Parse and check a manifest's bytes: its JSON, its format, and that every shard
    /// name is one plain segment. `shown` names it in errors.
    pub fn parse(bytes: &[u8], shown: &str) -> Result<Manifest, TokensError> {
        let bad = |reason: String| TokensError::BadManifest {
            path: shown.to_string(),
            reason,
        };
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a pack manifest: {e}")))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(bad(format!(
                "not a pack manifest: format {} (expected {})",
                crate::text::quote(&manifest.format),
                crate::text::quote(MANIFEST_FORMAT)
            )));
        }
        let plain = |name: &str| {
            !(name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '*']))
        };
        let names = manifest.shards.iter().flat_map(|s| {
            std::iter::once(s.name.as_str()).chain(s.docs.as_ref().map(|d| d.name.as_str()))
        });
        if let Some(name) = names.into_iter().find(|n| !plain(n)) {
            return Err(bad(format!(
                "shard name {} is not one plain segment",
                crate::text::quote(name)
            )));
        }
        Ok(manifest)
    }

    /// The shards of `split`, in the manifest's order. `name` is the manifest's own
    /// name (its last segment), whose base tells validation shards apart; `shown`
    /// names it in errors. An empty selection is an error saying what it lists.
    pub fn select(
        &self,
        name: &str,
        split: Split,
        shown: &str,
    ) -> Result<Vec<&ManifestShard>, TokensError> {
        let base = name.strip_suffix(MANIFEST_SUFFIX).unwrap_or(name);
        let chosen: Vec<&ManifestShard> = self
            .shards
            .iter()
            .filter(|s| match split {
                Split::All => true,
                Split::Val => is_val_shard(base, &s.name),
                Split::Train => !is_val_shard(base, &s.name),
            })
            .collect();
        if chosen.is_empty() {
            let val = self
                .shards
                .iter()
                .filter(|s| is_val_shard(base, &s.name))
                .count();
            let train = self.shards.len().saturating_sub(val);
            let hint = match (split, val, train) {
                (Split::Train, 1.., _) => {
                    format!(" (name {shown}{SPLIT_MARK}val to read the validation split)")
                }
                _ => String::new(),
            };
            return Err(TokensError::BadManifest {
                path: shown.to_string(),
                reason: format!(
                    "lists no {} shard: {train} training and {val} validation shards{hint}",
                    split.name()
                ),
            });
        }
        Ok(chosen)
    }
}

/// Open the shards of `split` of the local manifest at `path`, each beside it, checked
/// for the size and id count the manifest records and validated as [`Shard::open`]
/// validates a file (header, size, every id). Each shard's descriptor is closed once it
/// validates. `shown` names the source in errors (with its `#split`).
pub fn open_manifest(
    path: &Path,
    split: Split,
    vocab: Option<u32>,
    shown: &str,
) -> Result<Vec<Shard>, TokensError> {
    let bytes =
        crate::files::read_limited(path, MAX_MANIFEST_BYTES).map_err(|error| TokensError::Io {
            path: path.to_path_buf(),
            error,
        })?;
    let manifest = Manifest::parse(&bytes, &path.display().to_string())?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
    let mut out = Vec::new();
    for entry in manifest.select(name, split, shown)? {
        let file = dir.join(&entry.name);
        let mut shard = Shard::open(&file, vocab)?;
        let size = std::fs::metadata(&file)
            .map(|m| m.len())
            .map_err(|error| TokensError::Io {
                path: file.clone(),
                error,
            })?;
        if size != entry.bytes || shard.len() as u64 != entry.n {
            return Err(TokensError::BadManifest {
                path: path.display().to_string(),
                reason: format!(
                    "{} has {size} bytes and {} ids, the manifest records {} bytes and {} ids",
                    file.display(),
                    shard.len(),
                    entry.bytes,
                    entry.n
                ),
            });
        }
        shard.release();
        out.push(shard);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(names: &[&str]) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT.to_string(),
            shards: names
                .iter()
                .map(|n| ManifestShard {
                    name: n.to_string(),
                    bytes: 1026,
                    sha256: String::new(),
                    n: 1,
                    docs: None,
                })
                .collect(),
            tokens: names.len() as u64,
        }
    }

    fn names(m: &Manifest, split: Split) -> Result<Vec<String>, TokensError> {
        Ok(m.select("fw.manifest.json", split, "fw.manifest.json")?
            .into_iter()
            .map(|s| s.name.clone())
            .collect())
    }

    #[test]
    fn a_manifest_source_stands_for_its_training_shards() {
        let m = manifest(&[
            "fw_val_000000.bin",
            "fw_train_000001.bin",
            "fw_train_000002.bin",
        ]);
        assert_eq!(
            names(&m, Split::Train).unwrap(),
            ["fw_train_000001.bin", "fw_train_000002.bin"]
        );
        assert_eq!(names(&m, Split::Val).unwrap(), ["fw_val_000000.bin"]);
        assert_eq!(names(&m, Split::All).unwrap().len(), 3);
        // A pack without a validation split: every shard trains, none is validation.
        let plain = manifest(&["fw_000000.bin", "fw_000001.bin"]);
        assert_eq!(names(&plain, Split::Train).unwrap().len(), 2);
        let err = names(&plain, Split::Val).unwrap_err().to_string();
        assert!(
            err.contains("lists no val shard: 2 training and 0 validation"),
            "{err}"
        );
        // Only validation: training from it is refused, saying how to read it.
        let only_val = manifest(&["fw_val_000000.bin"]);
        let err = names(&only_val, Split::Train).unwrap_err().to_string();
        assert!(
            err.contains("lists no train shard: 0 training and 1 validation"),
            "{err}"
        );
        assert!(err.contains("fw.manifest.json#val"), "{err}");
    }

    #[test]
    fn val_shards_are_told_apart_by_the_packs_naming() {
        assert!(is_val_shard("fw", "fw_val_000000.bin"));
        assert!(is_val_shard("fw", "fw_val_000012.bin"));
        for other in [
            "fw_train_000001.bin",
            "fw_000000.bin",
            "fw_val_.bin",
            "fw_val_00x000.bin",
            "other_val_000000.bin",
            "fw_val_000000.bin.tmp",
            "fw",
        ] {
            assert!(!is_val_shard("fw", other), "{other}");
        }
    }

    #[test]
    fn a_fragment_chooses_the_split() {
        assert_eq!(
            manifest_source("s3://b/fw.manifest.json").unwrap(),
            Some(("s3://b/fw.manifest.json", Split::Train))
        );
        for (text, split) in [
            ("train", Split::Train),
            ("val", Split::Val),
            ("all", Split::All),
        ] {
            let source = format!("d/fw.manifest.json#{text}");
            assert_eq!(
                manifest_source(&source).unwrap(),
                Some(("d/fw.manifest.json", split))
            );
        }
        assert_eq!(manifest_source("fw_000000.bin").unwrap(), None);
        assert_eq!(manifest_source("a#val").unwrap(), None);
        let err = manifest_source("fw.manifest.json#test")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown split \"test\""), "{err}");
    }

    #[test]
    fn hostile_manifests_are_refused_naming_the_rule() {
        let shown = "m.manifest.json";
        for (text, want) in [
            ("{", "not a pack manifest"),
            (r#"{"format":"x","shards":[],"tokens":0}"#, "format \"x\""),
            (
                r#"{"format":"tlio token shards 1","shards":[{"name":"../x","bytes":1,"sha256":"","n":1}],"tokens":1}"#,
                "not one plain segment",
            ),
            (
                r#"{"format":"tlio token shards 1","shards":[{"name":"..","bytes":1,"sha256":"","n":1}],"tokens":1}"#,
                "not one plain segment",
            ),
            (
                r#"{"format":"tlio token shards 1","shards":[],"tokens":0,"extra":1}"#,
                "unknown field",
            ),
        ] {
            let err = Manifest::parse(text.as_bytes(), shown)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(shown) && err.contains(want),
                "{text}: {err}"
            );
        }
    }
}
