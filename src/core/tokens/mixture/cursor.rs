//! The cursor of a mixture (scale.md section 8) in JSON: the global index of the next
//! window, the global batch, the rule's stage and counts, the stages' weights, and each
//! source's own stream cursor beside a digest of its shards.
//!
//! Invariants: one JSON form, derived, read from an object with exactly its keys (the
//! top level through `ObjectsOnly`, each source's stream cursor through its own strict
//! form); the stages and digests travel in the cursor so that a restore into another
//! mixture can name what differs, not only that something does.

use std::num::NonZeroU64;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::super::Shard;
use crate::cursor::Cursor;
use crate::wire::ObjectsOnly;

/// Hex digits of a source's digest kept in the cursor (64 bits: it tells sources
/// apart, it does not authenticate them).
pub const SOURCE_DIGEST_HEX: usize = 16;

/// One stage as the cursor records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageRecord {
    /// The stage's first global batch.
    pub batch: u64,
    /// Its weights, normalised, one per source.
    pub weights: Vec<f64>,
}

/// One source's part of the cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceCursor {
    /// [`source_digest`] of the source's shards.
    pub digest: String,
    /// The source's own stream position (one window per batch, one rank).
    pub cursor: Cursor,
}

/// The whole position of a mixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct MixtureCursor {
    /// The global index of the next window (a multiple of `global_batch`).
    pub window: u64,
    /// Windows per global batch: B times the world size.
    pub global_batch: NonZeroU64,
    /// The index of the stage the rule is in.
    pub stage: u64,
    /// The global index of the window at which the rule's counts started.
    pub stage_start: u64,
    /// Windows assigned to each source since `stage_start`.
    pub counts: Vec<u64>,
    /// The stages of the mixture that wrote the cursor.
    pub stages: Vec<StageRecord>,
    /// Each source's digest and stream cursor, in the sources' order.
    pub sources: Vec<SourceCursor>,
}

impl Serialize for MixtureCursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        MixtureCursor::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for MixtureCursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        MixtureCursor::deserialize(ObjectsOnly(deserializer))
    }
}

impl MixtureCursor {
    /// Parse strictly (see the type).
    pub fn from_json(text: &str) -> Result<MixtureCursor, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The compact JSON form.
    pub fn to_json(&self) -> String {
        #[allow(
            clippy::expect_used,
            reason = "integers, finite floats and fixed-width strings always serialize"
        )]
        serde_json::to_string(self).expect("invariant: a mixture cursor always serializes")
    }
}

/// The digest of a source: sha256 over each shard's file name, id count and recorded
/// vocabulary, in order, as [`SOURCE_DIGEST_HEX`] hex digits. File names, not paths,
/// so a pack moved to another directory or machine is the same source.
pub fn source_digest(shards: &[Shard]) -> String {
    let mut h = Sha256::new();
    for shard in shards {
        let name = shard
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update((shard.len() as u64).to_le_bytes());
        h.update(shard.vocab().unwrap_or(0).to_le_bytes());
    }
    let hex = crate::digest::hex(&h.finalize());
    hex.get(..SOURCE_DIGEST_HEX).unwrap_or(&hex).to_string()
}
