//! Hugging Face sharded checkpoints: `model.safetensors.index.json` maps each tensor to
//! the shard file that holds it; reading one validates every shard's header and that
//! the map and the shards agree.
//!
//! Invariants: shard names are plain file names next to the index (no directories, no
//! `..`), so an index cannot point outside its folder; duplicate keys are errors, as in
//! headers; every tensor is in exactly one shard, the one the map names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;

use super::{read_header, Header, SafetensorsError};
use crate::core::text::quote;

/// Largest index file read (real indexes are a few hundred KiB).
pub const MAX_INDEX_SIZE: u64 = 100_000_000;

/// A sharded checkpoint: the index and each shard's header.
#[derive(Debug, Clone)]
pub struct ShardedHeader {
    /// The index's `metadata` object (free-form JSON, often `total_size`).
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Tensor name to shard file name.
    pub weight_map: BTreeMap<String, String>,
    /// Each shard's file name and header, in name order.
    pub shards: Vec<(String, Header)>,
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
                            "duplicate tensor {} in weight_map",
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
#[serde(deny_unknown_fields)]
struct IndexFile {
    #[serde(default)]
    metadata: BTreeMap<String, serde_json::Value>,
    weight_map: StrictMap,
}

fn bad(path: &Path, detail: String) -> SafetensorsError {
    SafetensorsError::Index {
        path: path.to_path_buf(),
        detail,
    }
}

/// Read a sharded index and the header of every shard it names.
pub fn read_index(path: &Path) -> Result<ShardedHeader, SafetensorsError> {
    let io = |source| SafetensorsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_INDEX_SIZE {
        return Err(bad(
            path,
            format!("the index is {size} bytes, over the limit"),
        ));
    }
    let text = crate::core::files::read_limited(path, MAX_INDEX_SIZE).map_err(io)?;
    // serde reads a struct from a JSON array too (fields by position); an index is an
    // object, so anything else is refused before parsing.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(bad(path, "the index must be a JSON object".to_string()));
    }
    let index: IndexFile = serde_json::from_slice(&text).map_err(|e| bad(path, e.to_string()))?;
    let weight_map = index.weight_map.0;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let shard_names: BTreeSet<&String> = weight_map.values().collect();
    let mut shards = Vec::with_capacity(shard_names.len());
    let mut holder: BTreeMap<&str, &str> = BTreeMap::new();
    for name in shard_names {
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.contains('\\');
        if !plain {
            return Err(bad(
                path,
                format!(
                    "shard {} is not a plain file name next to the index",
                    quote(name)
                ),
            ));
        }
        let header = read_header(&dir.join(name))?;
        shards.push((name.clone(), header));
    }
    for (shard, header) in &shards {
        for t in &header.tensors {
            if let Some(other) = holder.insert(&t.name, shard) {
                return Err(bad(
                    path,
                    format!(
                        "tensor {} is in both {} and {}",
                        quote(&t.name),
                        quote(other),
                        quote(shard)
                    ),
                ));
            }
            match weight_map.get(&t.name) {
                Some(named) if named == shard => {}
                Some(named) => {
                    return Err(bad(
                        path,
                        format!(
                            "tensor {} is in {} but the index names {}",
                            quote(&t.name),
                            quote(shard),
                            quote(named)
                        ),
                    ))
                }
                None => {
                    return Err(bad(
                        path,
                        format!(
                            "tensor {} of {} is missing from the index",
                            quote(&t.name),
                            quote(shard)
                        ),
                    ))
                }
            }
        }
    }
    for (tensor, shard) in &weight_map {
        if !holder.contains_key(tensor.as_str()) {
            return Err(bad(
                path,
                format!(
                    "tensor {} is listed in {} but that shard does not hold it",
                    quote(tensor),
                    quote(shard)
                ),
            ));
        }
    }
    Ok(ShardedHeader {
        metadata: index.metadata,
        weight_map,
        shards,
    })
}
