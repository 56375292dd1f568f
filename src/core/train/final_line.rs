//! The final line and the hashes it carries.
//!
//! The final line, `{"step","tokens_seen","loss","loss_bits","model_sha256",
//! "optimizer_sha256","cursor"}`: `loss` is the last step's training loss (f32,
//! shortest form), `loss_bits` its f32 bits as 8 lowercase hex digits; `model_sha256`
//! and `optimizer_sha256` are the sha256 of the tensor bytes in canonical order, i.e.
//! the concatenated little-endian F32 data of every tensor of the file sorted by name
//! (exactly the data section of the canonical safetensors file, headers excluded):
//! `bigram.weight` for the model; `bigram.weight.exp_avg` then
//! `bigram.weight.exp_avg_sq` for AdamW, `bigram.weight.momentum_buffer` for SGD with
//! momentum, nothing (the sha256 of zero bytes) for plain SGD. The count model has no
//! optimizer and no stream: both fields are null.
//!
//! Invariant: the hashes depend only on tensor values (never on a file's header), so
//! a model or optimizer saved, loaded and saved again hashes the same.

use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::TrainError;
use crate::digest::{hex, sha256_stream};
use crate::optim::Optimizer;
use crate::tokens::Cursor;

/// f32 values converted per chunk when hashing tensors.
const HASH_FLOATS: usize = 1 << 16;

/// The final line (see the module documentation for every field).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalLine {
    /// The last step.
    pub step: u64,
    /// Tokens consumed (positions counted, for the count model).
    pub tokens_seen: u64,
    /// The last step's training loss.
    pub loss: f32,
    /// Its f32 bits, 8 lowercase hex digits.
    pub loss_bits: String,
    /// sha256 of the model's tensor bytes in canonical order.
    pub model_sha256: String,
    /// sha256 of the optimizer's tensor bytes in canonical order (null: no optimizer).
    pub optimizer_sha256: Option<String>,
    /// The stream's cursor after the last step (null: no stream).
    pub cursor: Option<Cursor>,
}

impl FinalLine {
    /// The compact JSON line with its newline: the bytes of stdout and final.json.
    #[allow(
        clippy::expect_used,
        reason = "serde_json fails only on non-string map keys or a failing Serialize impl; the line has neither"
    )]
    pub fn to_line(&self) -> String {
        // A NaN loss becomes null; its bits stay in loss_bits.
        let mut s = serde_json::to_string(self)
            .expect("invariant: integers, strings, an f32 and a cursor of them serialize");
        s.push('\n');
        s
    }
}

/// sha256 of f32 tensors' little-endian bytes, tensors in the given order.
pub fn sha256_f32<'a>(tensors: impl IntoIterator<Item = &'a [f32]>) -> String {
    let mut hasher = Sha256::new();
    let mut buf = Vec::with_capacity(HASH_FLOATS * 4);
    for values in tensors {
        for chunk in values.chunks(HASH_FLOATS) {
            buf.clear();
            for v in chunk {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            hasher.update(&buf);
        }
    }
    hex(&hasher.finalize())
}

/// sha256 of a whole file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, TrainError> {
    let io_err = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = crate::files::open_regular(path).map_err(io_err)?;
    let (_, digest) = sha256_stream(&mut file, None, &mut |_| {}).map_err(io_err)?;
    Ok(hex(&digest))
}

/// The optimizer's tensors sorted by name (the canonical order of an all-F32 file).
pub(super) fn optimizer_sha256(opt: &Optimizer) -> String {
    let mut tensors = opt.state_tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    sha256_f32(tensors.into_iter().map(|(_, v)| v))
}
