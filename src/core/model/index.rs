//! The index rules of a sharded model: `{"metadata": {...}, "weight_map": {tensor:
//! shard}}`, every named shard present and valid, every tensor where the map says and
//! only there, no unlisted tensor, `total_size` equal to the tensors' bytes.
//!
//! Invariants: a shard name is accepted only as a plain file name (no `/`, `\`, `..`,
//! NUL, not empty) joined to the index's directory, so the map can never name another
//! path; the shard file itself may be a symlink and is followed; duplicate JSON keys
//! are errors (a map type would keep the last); every violation is one finding.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::Path;

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;

use super::{finding, parent, Entry, Model, ModelError, Shard};
use crate::safetensors::verify::{Finding, Findings};
use crate::text::quote;

/// Largest index file read (real indexes are a few hundred KiB).
pub const MAX_INDEX_SIZE: u64 = 100_000_000;

/// A parsed index with the headers of the shards that could be read.
#[derive(Debug)]
pub struct Parsed {
    /// The `metadata` object.
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Tensor name to shard name.
    pub weight_map: BTreeMap<String, String>,
    /// The readable shards, in name order.
    pub shards: Vec<Shard>,
}

/// A JSON object of strings that refuses duplicate keys.
struct StrictMap(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for StrictMap {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrictMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    if out.contains_key(&k) {
                        return Err(de::Error::custom(format!(
                            "tensor {} appears twice in weight_map",
                            quote(&k)
                        )));
                    }
                    out.insert(k, v);
                }
                Ok(StrictMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct IndexFile {
    #[serde(default)]
    metadata: BTreeMap<String, serde_json::Value>,
    weight_map: StrictMap,
}

/// True for a plain file name: not empty, not `.` or `..`, no separator, no NUL.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

/// Read the index at `path` and the header of every shard it names, through `files`.
/// Broken rules are pushed to `problems`; None when the document itself is unusable.
pub fn read(
    path: &Path,
    files: &dyn super::files::ModelFiles,
    problems: &mut Findings,
) -> Result<Option<Parsed>, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = files.size(path).map_err(io)?;
    if size > MAX_INDEX_SIZE {
        problems.push(finding(
            "index-json",
            None,
            format!("index: the index is {size} bytes, over the limit of {MAX_INDEX_SIZE}"),
        ));
        return Ok(None);
    }
    // Bounded and regular-file only: a FIFO or device named as an index must not hang.
    let text = files.read_limited(path, MAX_INDEX_SIZE).map_err(io)?;
    // serde would accept a JSON array for a struct: the document must be an object.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        problems.push(finding(
            "index-json",
            None,
            "index (document): the index is not a JSON object".to_string(),
        ));
        return Ok(None);
    }
    let index: IndexFile = match serde_json::from_slice(&text) {
        Ok(i) => i,
        Err(e) => {
            problems.push(finding(
                "index-json",
                None,
                format!(
                    "index (document): not an object with an object weight_map of strings: {e}"
                ),
            ));
            return Ok(None);
        }
    };
    let weight_map = index.weight_map.0;
    let shards = read_shards(&parent(path), &weight_map, files, problems)?;
    Ok(Some(Parsed {
        metadata: index.metadata,
        weight_map,
        shards,
    }))
}

/// The header of every shard the map names, in name order; unreadable or missing
/// shards are findings, an operational failure an error.
fn read_shards(
    dir: &Path,
    weight_map: &BTreeMap<String, String>,
    files: &dyn super::files::ModelFiles,
    problems: &mut Findings,
) -> Result<Vec<Shard>, ModelError> {
    let names: BTreeSet<&String> = weight_map.values().collect();
    let mut shards = Vec::with_capacity(names.len());
    for name in names {
        if !is_plain_name(name) {
            problems.push(finding(
                "index-shard-name",
                None,
                format!(
                    "index (shard name): shard {} is not a plain file name beside the index",
                    quote(name)
                ),
            ));
            continue;
        }
        let shard_path = dir.join(name);
        match files.read_header(&shard_path) {
            Ok(header) => shards.push(Shard {
                name: name.clone(),
                path: shard_path,
                header,
            }),
            Err(e) => match e.rule() {
                Some(rule) => problems.push(Finding {
                    rule: rule.to_string(),
                    tensor: e.tensor().map(str::to_string),
                    message: format!("shard {}: {e}", quote(name)),
                }),
                None => {
                    let missing = matches!(&e,
                        crate::safetensors::SafetensorsError::Io { source, .. }
                            if source.kind() == io::ErrorKind::NotFound);
                    if missing {
                        problems.push(finding(
                            "index-missing-shard",
                            None,
                            format!(
                                "index (missing shard): shard {} is named by the index but does not exist: the model is incomplete",
                                quote(name)
                            ),
                        ));
                    } else {
                        return Err(ModelError::Shard {
                            shard: name.clone(),
                            source: e,
                        });
                    }
                }
            },
        }
    }
    Ok(shards)
}

/// Every physical tensor once, sorted by name; with a weight map, the rules that tie
/// the map to the shards.
pub fn entries(
    shards: &[Shard],
    weight_map: Option<&BTreeMap<String, String>>,
    problems: &mut Findings,
) -> Vec<Entry> {
    let mut holder: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (si, shard) in shards.iter().enumerate() {
        for t in shard.header.tensors() {
            if let Some(&other) = holder.get(t.name.as_str()) {
                let other = shards.get(other).map_or("", |s| s.name.as_str());
                problems.push(finding(
                    "index-duplicate-tensor",
                    Some(&t.name),
                    format!(
                        "index (duplicate tensor): tensor {} is in both {} and {}",
                        quote(&t.name),
                        quote(other),
                        quote(&shard.name)
                    ),
                ));
                continue;
            }
            holder.insert(&t.name, si);
            if let Some(map) = weight_map {
                match map.get(&t.name) {
                    Some(named) if *named == shard.name => {}
                    Some(named) => problems.push(finding(
                        "index-wrong-shard",
                        Some(&t.name),
                        format!(
                            "index (wrong shard): tensor {} is in {} but the index names {}",
                            quote(&t.name),
                            quote(&shard.name),
                            quote(named)
                        ),
                    )),
                    None => problems.push(finding(
                        "index-unlisted-tensor",
                        Some(&t.name),
                        format!(
                            "index (unlisted tensor): tensor {} of {} is missing from weight_map",
                            quote(&t.name),
                            quote(&shard.name)
                        ),
                    )),
                }
            }
            out.push(Entry {
                shard: si,
                info: t.clone(),
            });
        }
    }
    if let Some(map) = weight_map {
        let readable: BTreeSet<&str> = shards.iter().map(|s| s.name.as_str()).collect();
        for (tensor, shard) in map {
            // Tensors of unreadable or missing shards were reported with the shard.
            if !holder.contains_key(tensor.as_str()) && readable.contains(shard.as_str()) {
                problems.push(finding(
                    "index-missing-tensor",
                    Some(tensor),
                    format!(
                        "index (missing tensor): tensor {} is listed in {} but that shard does not hold it",
                        quote(tensor),
                        quote(shard)
                    ),
                ));
            }
        }
    }
    out.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    out
}

/// `metadata.total_size`, when present, is a non-negative integer equal to the sum of
/// the tensors' byte lengths (what transformers writes).
pub fn check_total_size(value: &serde_json::Value, model: &Model, problems: &mut Findings) {
    let actual = model.data_bytes();
    match value.as_u64() {
        Some(n) if n == actual => {}
        Some(n) => problems.push(finding(
            "index-total-size",
            None,
            format!(
                "index (total_size): metadata.total_size is {n} but the tensors hold {actual} bytes"
            ),
        )),
        None => problems.push(finding(
            "index-total-size",
            None,
            format!(
                "index (total_size): metadata.total_size is {value}, not a non-negative integer"
            ),
        )),
    }
}
