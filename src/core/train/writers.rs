//! The canonical bytes of the trainer's two safetensors files: the model
//! (`bigram.weight`) and the optimizer (its state tensors and `state` JSON, by the
//! rules of `checkpoint::optimizer`, the one home of that file's form).
//!
//! Invariant: both are written through `safetensors::write` with metadata
//! {"format":"tinyllm"} (plus `state` for the optimizer), so the same values always
//! give the same bytes.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::bigram::{Bigram, WEIGHT_NAME};
use super::layout::{FORMAT_KEY, FORMAT_VALUE};
use crate::checkpoint::OptimizerFile;
use crate::optim::Optimizer;
use crate::safetensors::{self, Dtype, Tensor, TensorData};

/// The metadata of model and optimizer files' `format` key.
fn format_meta() -> BTreeMap<String, String> {
    BTreeMap::from([(FORMAT_KEY.to_string(), FORMAT_VALUE.to_string())])
}

/// Write the model canonically (`bigram.weight`, F32, metadata {"format":"tinyllm"}).
pub fn write_model(out: &mut dyn Write, model: &Bigram) -> io::Result<()> {
    let tensors = [Tensor {
        name: WEIGHT_NAME.to_string(),
        dtype: Dtype::F32,
        shape: model.shape().to_vec(),
        data: TensorData::F32(model.weight()),
    }];
    safetensors::write(out, &tensors, &format_meta())
        .map(|_| ())
        .map_err(io::Error::other)
}

/// Write the optimizer file canonically: its state tensors (each shaped like
/// `bigram.weight`) and metadata {"format":"tinyllm","state":<JSON>}.
pub fn write_optimizer(out: &mut dyn Write, opt: &Optimizer, shape: &[u64]) -> io::Result<()> {
    let meta = OptimizerFile {
        state: opt.state(),
        tensors: BTreeMap::new(),
    }
    .metadata()
    .map_err(io::Error::other)?;
    let tensors: Vec<Tensor<'_>> = opt
        .state_tensors()
        .into_iter()
        .map(|(name, values)| Tensor {
            name,
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data: TensorData::F32(values),
        })
        .collect();
    safetensors::write(out, &tensors, &meta)
        .map(|_| ())
        .map_err(io::Error::other)
}
