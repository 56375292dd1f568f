//! Piece digests: BLAKE3 of each `piece_bytes` slice of a chunk's data, counted from
//! the chunk's first byte, in lowercase hex. Measured on the development machine
//! (docs/checkpoints.md, bench/sharded_digest.sh): BLAKE3 hashes 1 MiB pieces at about
//! 3.6 GB/s on one core, sha256 (with the CPU's SHA extensions) at about 1.0 GB/s, so
//! a verified read is bounded by memory, not by the digest. The whole-file sha256 of the
//! manifest stays as it is.
//!
//! Invariant: the same bytes always give the same digest whatever the writer's or
//! reader's buffering (a streaming hasher per piece, split exactly at piece boundaries).

use crate::digest::hex;

/// The digest's name in `shards.json`.
pub const DIGEST_NAME: &str = "blake3";

/// The digest of one piece, lowercase hex.
pub fn piece_digest(bytes: &[u8]) -> String {
    hex(blake3::hash(bytes).as_bytes())
}

/// The digest of one piece, as bytes (to compare without formatting).
pub fn piece_digest_bytes(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// Hashes a chunk's bytes as they stream past, closing a piece every `piece_bytes`.
#[derive(Debug)]
pub struct PieceHasher {
    piece_bytes: u64,
    filled: u64,
    hasher: blake3::Hasher,
    done: Vec<String>,
}

impl PieceHasher {
    /// A hasher for one chunk.
    pub fn new(piece_bytes: u64) -> Self {
        PieceHasher {
            piece_bytes: piece_bytes.max(1),
            filled: 0,
            hasher: blake3::Hasher::new(),
            done: Vec::new(),
        }
    }

    /// Feed the next bytes of the chunk.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.piece_bytes.saturating_sub(self.filled);
            let take = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.hasher.update(now);
            self.filled = self.filled.saturating_add(take as u64);
            if self.filled == self.piece_bytes {
                self.done.push(hex(self.hasher.finalize().as_bytes()));
                self.hasher.reset();
                self.filled = 0;
            }
            bytes = rest;
        }
    }

    /// The digests of every piece (the last one shorter when the chunk does not end on
    /// a piece boundary); none for an empty chunk.
    pub fn finish(mut self) -> Vec<String> {
        if self.filled > 0 {
            self.done.push(hex(self.hasher.finalize().as_bytes()));
        }
        self.done
    }
}
