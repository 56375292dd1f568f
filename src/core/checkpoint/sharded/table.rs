//! `shards.json`, the chunk table of a sharded step (docs/checkpoints.md): every global
//! tensor (group, name, dtype, global shape) with its chunks (offsets and sizes in the
//! global tensor, the file and key holding it, its absolute byte range in that file,
//! the digests of its pieces), plus free string metadata per group.
//!
//! Invariants: a table that parsed is valid: tensors sorted by (group, name) without
//! duplicates, chunks sorted by offsets, every chunk inside its tensor's shape, no two
//! chunks of a tensor overlapping, the chunks of each tensor covering it exactly, each
//! byte range as long as its chunk's bytes, one well-formed digest per piece, no two
//! chunks naming the same (file, key). The bytes written are a pure function of the
//! table (sorted keys, no map order, no time, no path).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{table_err, ShardedError, SHARDS_FORMAT, SHARDS_NAME, SHARDS_VERSION};
use crate::checkpoint::manifest::is_plain_name;
use crate::digest::is_lower_hex;
use crate::safetensors::dtype::{byte_len, Dtype};

/// Largest `shards.json` read: about 4 million piece digests, a step of 4 TB.
pub const MAX_TABLE_BYTES: u64 = 256 << 20;
/// Most dimensions a tensor of the table may have.
pub const MAX_RANK: usize = 32;
/// Most chunks one tensor may have (one per rank of a very large run, and then some).
pub const MAX_CHUNKS: usize = 1 << 20;
/// Smallest and largest piece sizes a table may declare.
pub const PIECE_BYTES_RANGE: std::ops::RangeInclusive<u64> = 4096..=(1 << 30);
/// The piece digest's name in `shards.json` (see `piece`).
pub const DIGEST_NAME: &str = super::piece::DIGEST_NAME;
/// Hex digits of one piece digest.
pub const PIECE_HEX_LEN: usize = 64;

/// The groups of tensors a sharded step holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// The model's `state_dict()`.
    Model,
    /// The optimizer's state arrays (`<parameter>.<state key>`).
    Optimizer,
    /// A state dict saved through PyTorch DCP (`tlio.dcp`): every item under its
    /// flattened key, tensors as they are, DCP's bytes items as `U8` vectors of one
    /// chunk (which items are bytes is the group's `dcp` metadata). Only a table of
    /// version [`DCP_VERSION`] holds this group.
    Dcp,
}

/// The table version that holds a [`Group::Dcp`]; a table without one is written as
/// version [`SHARDS_VERSION`], byte for byte as before.
pub const DCP_VERSION: u64 = 2;

impl Group {
    /// Every group, in table order.
    pub const ALL: [Group; 3] = [Group::Model, Group::Optimizer, Group::Dcp];

    /// The group's name in `shards.json`.
    pub fn name(self) -> &'static str {
        match self {
            Group::Model => "model",
            Group::Optimizer => "optimizer",
            Group::Dcp => "dcp",
        }
    }

    /// The group of that name.
    pub fn from_name(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One chunk of a global tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkEntry {
    /// Where the chunk starts in the global tensor, per dimension.
    pub offsets: Vec<u64>,
    /// The chunk's shape.
    pub sizes: Vec<u64>,
    /// The data file holding it (a plain name listed by the manifest).
    pub file: String,
    /// Its tensor name inside that file.
    pub key: String,
    /// First byte of its data in the file (absolute).
    pub begin: u64,
    /// End of its data in the file (absolute, exclusive).
    pub end: u64,
    /// One digest per piece: the bytes `[begin + k * piece_bytes, ...)`, the last shorter.
    pub pieces: Vec<String>,
}

impl ChunkEntry {
    /// The byte length of the chunk's data.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }

    /// True when the chunk holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One global tensor and its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableTensor {
    /// Its group.
    pub group: Group,
    /// Its name (a `state_dict()` key, or `<parameter>.<state key>`).
    pub name: String,
    /// Its dtype (whole bytes per element).
    pub dtype: Dtype,
    /// Its global shape.
    pub shape: Vec<u64>,
    /// Its chunks, sorted by offsets.
    pub chunks: Vec<ChunkEntry>,
}

impl TableTensor {
    /// `group/name`, as errors name a tensor.
    pub fn label(&self) -> String {
        format!("{}/{}", self.group, self.name)
    }

    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size().map_or(0, |s| s as u64)
    }

    /// The global tensor's byte length (checked when the table was validated).
    pub fn byte_len(&self) -> u64 {
        byte_len(self.dtype, &self.shape).unwrap_or(0)
    }
}

/// A validated chunk table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardsTable {
    /// The piece size of every chunk.
    pub piece_bytes: u64,
    /// String metadata per group (`tied` of the model, the optimizer's `state`).
    pub meta: BTreeMap<Group, BTreeMap<String, String>>,
    /// The global tensors, sorted by (group, name).
    pub tensors: Vec<TableTensor>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireTensor {
    group: String,
    name: String,
    dtype: String,
    shape: Vec<u64>,
    chunks: Vec<ChunkEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireTable {
    format: String,
    version: u64,
    digest: String,
    piece_bytes: u64,
    meta: BTreeMap<String, BTreeMap<String, String>>,
    tensors: Vec<WireTensor>,
}

impl ShardsTable {
    /// A table over these parts, sorted and validated.
    pub fn new(
        piece_bytes: u64,
        meta: BTreeMap<Group, BTreeMap<String, String>>,
        mut tensors: Vec<TableTensor>,
    ) -> Result<Self, ShardedError> {
        tensors.sort_by(|a, b| (a.group, a.name.as_bytes()).cmp(&(b.group, b.name.as_bytes())));
        for t in &mut tensors {
            t.chunks.sort_by(|a, b| a.offsets.cmp(&b.offsets));
        }
        let table = ShardsTable {
            piece_bytes,
            meta,
            tensors,
        };
        table.validate()?;
        Ok(table)
    }

    /// Parse and validate `shards.json` bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ShardedError> {
        let bad = |e: &dyn std::fmt::Display| table_err(SHARDS_NAME, e.to_string());
        let wire: WireTable = serde_json::from_slice(bytes).map_err(|e| bad(&e))?;
        if wire.format != SHARDS_FORMAT {
            return Err(bad(&format!(
                "format is {:?}, not {SHARDS_FORMAT:?}",
                wire.format
            )));
        }
        if wire.version != SHARDS_VERSION && wire.version != DCP_VERSION {
            return Err(bad(&format!(
                "version {} is not supported (this tlio reads versions {SHARDS_VERSION} and \
                 {DCP_VERSION})",
                wire.version
            )));
        }
        if wire.digest != DIGEST_NAME {
            return Err(bad(&format!(
                "piece digest {:?} is not supported (this tlio knows {DIGEST_NAME:?})",
                wire.digest
            )));
        }
        let mut meta = BTreeMap::new();
        for (g, m) in wire.meta {
            let group = Group::from_name(&g)
                .ok_or_else(|| bad(&format!("meta names an unknown group {g:?}")))?;
            meta.insert(group, m);
        }
        let tensors = wire
            .tensors
            .into_iter()
            .map(|t| {
                let group = Group::from_name(&t.group).ok_or_else(|| {
                    bad(&format!(
                        "tensor {:?} has an unknown group {:?}",
                        t.name, t.group
                    ))
                })?;
                let dtype = Dtype::from_name(&t.dtype).ok_or_else(|| {
                    bad(&format!(
                        "tensor {:?} has an unknown dtype {:?}",
                        t.name, t.dtype
                    ))
                })?;
                Ok(TableTensor {
                    group,
                    name: t.name,
                    dtype,
                    shape: t.shape,
                    chunks: t.chunks,
                })
            })
            .collect::<Result<Vec<_>, ShardedError>>()?;
        let table = ShardsTable {
            piece_bytes: wire.piece_bytes,
            meta,
            tensors,
        };
        table.validate()?;
        if table.version() != wire.version {
            return Err(bad(&format!(
                "version {} with{} a dcp group (a dcp group is version {DCP_VERSION}, and \
                 only it)",
                wire.version,
                if table.has_dcp() { "" } else { "out" }
            )));
        }
        Ok(table)
    }

    /// Whether the table holds DCP's state (a tensor of [`Group::Dcp`], or its metadata).
    pub fn has_dcp(&self) -> bool {
        self.meta.contains_key(&Group::Dcp) || self.tensors.iter().any(|t| t.group == Group::Dcp)
    }

    /// The version this table is written as: [`DCP_VERSION`] when it holds DCP's
    /// state, else [`SHARDS_VERSION`].
    pub fn version(&self) -> u64 {
        if self.has_dcp() {
            DCP_VERSION
        } else {
            SHARDS_VERSION
        }
    }

    /// The canonical bytes: compact JSON, keys in a fixed order, a final newline.
    pub fn to_json(&self) -> Vec<u8> {
        let wire = WireTable {
            format: SHARDS_FORMAT.to_string(),
            version: self.version(),
            digest: DIGEST_NAME.to_string(),
            piece_bytes: self.piece_bytes,
            meta: self
                .meta
                .iter()
                .map(|(g, m)| (g.name().to_string(), m.clone()))
                .collect(),
            tensors: self
                .tensors
                .iter()
                .map(|t| WireTensor {
                    group: t.group.name().to_string(),
                    name: t.name.clone(),
                    dtype: t.dtype.name().to_string(),
                    shape: t.shape.clone(),
                    chunks: t.chunks.clone(),
                })
                .collect(),
        };
        // Serialising plain structs, strings and integers into a Vec cannot fail.
        let mut bytes = serde_json::to_vec(&wire).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// [`Self::to_json`], refused when it is larger than [`MAX_TABLE_BYTES`]: a step
    /// whose table no reader takes must never be committed (a save of a very large
    /// layout fails, naming the size, instead of leaving a step nothing can load).
    pub fn to_json_checked(&self) -> Result<Vec<u8>, ShardedError> {
        within_limit(self.to_json(), MAX_TABLE_BYTES, self.chunk_count())
    }

    /// Chunks of every tensor together.
    pub fn chunk_count(&self) -> usize {
        self.tensors.iter().map(|t| t.chunks.len()).sum()
    }

    /// The tensor of `group` named `name`.
    pub fn get(&self, group: Group, name: &str) -> Option<&TableTensor> {
        self.tensors
            .binary_search_by(|t| (t.group, t.name.as_bytes()).cmp(&(group, name.as_bytes())))
            .ok()
            .and_then(|i| self.tensors.get(i))
    }

    /// The data files the chunks name, sorted, each once.
    pub fn files(&self) -> BTreeSet<&str> {
        self.tensors
            .iter()
            .flat_map(|t| t.chunks.iter().map(|c| c.file.as_str()))
            .collect()
    }

    /// Every rule of the module documentation.
    fn validate(&self) -> Result<(), ShardedError> {
        if !PIECE_BYTES_RANGE.contains(&self.piece_bytes) {
            return Err(table_err(
                SHARDS_NAME,
                format!(
                    "piece_bytes {} is outside {}..={}",
                    self.piece_bytes,
                    PIECE_BYTES_RANGE.start(),
                    PIECE_BYTES_RANGE.end()
                ),
            ));
        }
        for pair in self.tensors.windows(2) {
            if let [a, b] = pair {
                if (a.group, a.name.as_bytes()) >= (b.group, b.name.as_bytes()) {
                    return Err(table_err(
                        SHARDS_NAME,
                        format!(
                            "tensors are not sorted by group and name without duplicates at {}",
                            b.label()
                        ),
                    ));
                }
            }
        }
        let mut keys = BTreeSet::new();
        for t in &self.tensors {
            validate_tensor(t, self.piece_bytes)?;
            for c in &t.chunks {
                if !keys.insert((c.file.as_str(), c.key.as_str())) {
                    return Err(tensor_err(
                        t,
                        format!("a second chunk names {} key {:?}", c.file, c.key),
                    ));
                }
            }
        }
        super::dcp::document(self)?;
        Ok(())
    }
}

/// `bytes` of a table of `chunks` chunks, or the error saying it exceeds `limit`.
pub(crate) fn within_limit(
    bytes: Vec<u8>,
    limit: u64,
    chunks: usize,
) -> Result<Vec<u8>, ShardedError> {
    if bytes.len() as u64 > limit {
        return Err(table_err(
            SHARDS_NAME,
            format!(
                "{} bytes for {chunks} chunks, more than the {limit} bytes a reader takes \
                 (fewer chunks per tensor, from fewer shards, keep it smaller)",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

fn tensor_err(t: &TableTensor, reason: impl Into<String>) -> ShardedError {
    table_err(format!("{SHARDS_NAME}: tensor {}", t.label()), reason)
}

/// Pieces of a chunk of `len` bytes.
pub fn piece_count(len: u64, piece_bytes: u64) -> u64 {
    len.div_ceil(piece_bytes.max(1))
}

/// One tensor's rules: name, dtype, rank, chunk order, byte ranges, pieces, coverage.
fn validate_tensor(t: &TableTensor, piece_bytes: u64) -> Result<(), ShardedError> {
    if t.name.is_empty() {
        return Err(tensor_err(t, "the name is empty"));
    }
    if t.dtype.size().is_none() {
        return Err(tensor_err(
            t,
            format!(
                "dtype {} has no whole byte per element, which sharded steps do not hold",
                t.dtype
            ),
        ));
    }
    if t.shape.len() > MAX_RANK {
        return Err(tensor_err(t, format!("more than {MAX_RANK} dimensions")));
    }
    if byte_len(t.dtype, &t.shape).is_err() {
        // The safetensors rule counts bits (elements x bits per element) before bytes,
        // so name what overflows: a BOOL [2^31, 2^31] fits in bytes but not in bits.
        let what = match crate::safetensors::dtype::numel(&t.shape) {
            None => "its element count overflows 64 bits".to_string(),
            Some(_) => format!(
                "its size in bits (elements x {} bits per element) overflows 64 bits",
                t.dtype.bits()
            ),
        };
        return Err(tensor_err(t, what));
    }
    if t.chunks.len() > MAX_CHUNKS {
        return Err(tensor_err(t, format!("more than {MAX_CHUNKS} chunks")));
    }
    for pair in t.chunks.windows(2) {
        if let [a, b] = pair {
            if a.offsets >= b.offsets {
                return Err(tensor_err(
                    t,
                    format!(
                        "chunks are not sorted by offsets without duplicates at {:?}",
                        b.offsets
                    ),
                ));
            }
        }
    }
    for c in &t.chunks {
        validate_chunk(t, c, piece_bytes)?;
    }
    let boxes: Vec<(&[u64], &[u64])> = t
        .chunks
        .iter()
        .map(|c| (c.offsets.as_slice(), c.sizes.as_slice()))
        .collect();
    super::coverage::check_coverage(&t.shape, &boxes).map_err(|reason| tensor_err(t, reason))
}

fn validate_chunk(t: &TableTensor, c: &ChunkEntry, piece_bytes: u64) -> Result<(), ShardedError> {
    let at = |reason: String| tensor_err(t, format!("chunk at {:?}: {reason}", c.offsets));
    if !is_plain_name(&c.file) || !c.file.ends_with(".safetensors") {
        return Err(at(format!(
            "file {:?} is not a plain name ending in .safetensors",
            c.file
        )));
    }
    if c.key.is_empty() {
        return Err(at("the key is empty".into()));
    }
    if c.sizes.len() != t.shape.len() {
        return Err(at(format!(
            "sizes {:?} do not have the tensor's {} dimensions",
            c.sizes,
            t.shape.len()
        )));
    }
    let expected = byte_len(t.dtype, &c.sizes).map_err(|_| at("its size overflows".into()))?;
    if c.end < c.begin || c.end - c.begin != expected {
        return Err(at(format!(
            "bytes {}..{} are not its {expected} bytes",
            c.begin, c.end
        )));
    }
    let pieces = piece_count(expected, piece_bytes);
    if c.pieces.len() as u64 != pieces {
        return Err(at(format!(
            "{} piece digests for {pieces} pieces",
            c.pieces.len()
        )));
    }
    if let Some(bad) = c.pieces.iter().find(|p| !is_lower_hex(p, PIECE_HEX_LEN)) {
        return Err(at(format!(
            "piece digest {bad:?} is not {PIECE_HEX_LEN} lowercase hex digits"
        )));
    }
    Ok(())
}
