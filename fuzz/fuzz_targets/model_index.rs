//! Fuzzes a sharded model's `*.index.json` through the same scan the model commands
//! run: the input is written as the index beside two valid shards, and any bytes must
//! come back as findings or a typed error, never a panic or a hang.
#![no_main]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tlio_core::model::{Model, INDEX_NAME};
use tlio_core::safetensors::{save, Dtype, Tensor, TensorData};

/// A directory holding `a.safetensors` (tensor `x`) and `b.safetensors` (tensor `y`),
/// made once per process; the index is rewritten in it for every input.
fn index_path() -> &'static PathBuf {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        for (file, name) in [("a.safetensors", "x"), ("b.safetensors", "y")] {
            let t = Tensor {
                name: name.into(),
                dtype: Dtype::F32,
                shape: vec![2],
                data: TensorData::Raw(Cow::Owned(vec![0; 8])),
            };
            save(&dir.path().join(file), &[t], &BTreeMap::new()).expect("shard written");
        }
        let index = dir.path().join(INDEX_NAME);
        (dir, index)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    let path = index_path();
    std::fs::write(path, data).expect("index written");
    let _ = Model::scan(path);
});
