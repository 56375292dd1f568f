//! What a directory output holds besides its shards: the index rewritten with the true
//! `total_size` (and `total_parameters` where the source had it), `config.json` with
//! convert's dtype, and the directory's other files copied as they are.
//!
//! Invariant: the JSON is written as transformers writes it (two-space indent, sorted
//! keys, a final newline), so an unchanged model round-trips byte for byte.

use std::collections::BTreeMap;
use std::ffi::OsString;

use serde_json::Value;

use super::super::mx_pairs::QUANTIZATION_CONFIG;
use super::super::outdir::OutDir;
use super::super::{torch_name, Model, ModelError, CONFIG_NAME, INDEX_NAME, SINGLE_NAME};
use super::{Op, Report, ShardResult};

/// What marks a tlio temporary name (`.NAME.tlio-tmp-PID-XXXXXX`): never copied.
const TEMP_MARK: &str = ".tlio-tmp-";

/// What the rewritten index records over all shards.
pub(super) struct Totals {
    /// Tensor name to the shard file holding it.
    weight_map: BTreeMap<String, Value>,
    /// Tensor data bytes.
    size: u64,
    /// Parameters.
    params: u64,
}

/// Add every shard's counts to `report` and gather the index's totals.
pub(super) fn tally(model: &Model, results: &[ShardResult], report: &mut Report) -> Totals {
    let mut totals = Totals {
        weight_map: BTreeMap::new(),
        size: 0,
        params: 0,
    };
    for (shard, r) in model.shards.iter().zip(results) {
        report.transformed += r.transformed;
        report.copied += r.copied;
        report.bytes_out = report.bytes_out.saturating_add(r.file_size);
        totals.size = totals.size.saturating_add(r.data_len);
        totals.params = totals.params.saturating_add(r.params);
        for n in &r.names {
            totals
                .weight_map
                .insert(n.clone(), Value::String(shard.name.clone()));
        }
    }
    totals
}

/// Rewrite the index (if the model has one) with the true `total_size`, and
/// `total_parameters` where the source had it.
pub(super) fn write_index(model: &Model, out: &OutDir, totals: &Totals) -> Result<(), ModelError> {
    let Some(index_path) = &model.index_path else {
        return Ok(());
    };
    let mut metadata: serde_json::Map<String, Value> = model
        .index_metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.insert("total_size".to_string(), Value::from(totals.size));
    if metadata.contains_key("total_parameters") {
        metadata.insert("total_parameters".to_string(), Value::from(totals.params));
    }
    let index = serde_json::json!({ "metadata": metadata, "weight_map": totals.weight_map });
    let name = index_path
        .file_name()
        .map_or_else(|| INDEX_NAME.to_string(), |n| n.to_string_lossy().into());
    out.write_file(&name, &pretty(&index)?)
}

/// `config.json`: its dtype updated by convert, copied as it is otherwise.
pub(super) fn write_config(model: &Model, out: &OutDir, op: &Op<'_>) -> Result<(), ModelError> {
    let Some(dir) = &model.dir else {
        return Ok(());
    };
    let config_path = dir.join(CONFIG_NAME);
    if let Some(config) = &model.config {
        match op {
            Op::Convert { target, .. } => {
                let mut c = config.clone();
                if let Some(name) = torch_name(*target) {
                    c.insert("torch_dtype".to_string(), Value::from(name));
                    if c.contains_key("dtype") {
                        c.insert("dtype".to_string(), Value::from(name));
                    }
                }
                out.write_file(CONFIG_NAME, &pretty(&Value::Object(c))?)?;
            }
            // A dequantized model is no longer quantized: transformers must load it as
            // the plain model.
            Op::Dequantize { .. } if config.contains_key(QUANTIZATION_CONFIG) => {
                let mut c = config.clone();
                c.remove(QUANTIZATION_CONFIG);
                out.write_file(CONFIG_NAME, &pretty(&Value::Object(c))?)?;
            }
            _ => out.copy_file(CONFIG_NAME, &config_path)?,
        }
    } else if config_path.is_file() {
        out.copy_file(CONFIG_NAME, &config_path)?;
    }
    Ok(())
}

/// Copy a model directory's other files (see [`other_files`]); returns their names.
pub(super) fn copy_other_files(model: &Model, out: &OutDir) -> Result<Vec<String>, ModelError> {
    let mut copied = Vec::new();
    let Some(dir) = &model.dir else {
        return Ok(copied);
    };
    // A model named by its index has the same other files as its directory has.
    for (name, link) in other_files(model)? {
        let from = dir.join(&name);
        if link {
            out.copy_link(&name, &from)?;
        } else {
            out.copy_file(&name, &from)?;
        }
        copied.push(name.to_string_lossy().into_owned());
    }
    Ok(copied)
}

/// JSON as transformers writes its index and config: two-space indent, sorted keys,
/// a final newline.
fn pretty(v: &Value) -> Result<Vec<u8>, ModelError> {
    let mut s = serde_json::to_vec_pretty(v).map_err(|e| ModelError::Usage {
        detail: format!("cannot serialise JSON: {e}"),
    })?;
    s.push(b'\n');
    Ok(s)
}

/// The regular files of a model directory that are not the model's own (index,
/// shards, config): tokenizer, generation config and the like, in name order, each
/// with whether it is a symlink (to a regular file), which is copied as a link rather
/// than followed. A name need not be UTF-8: it is copied as it is, never dropped. An
/// index named beside a `model.safetensors` was picked over it (the directory itself is
/// ambiguous), so that file is the other model's, not an extra of this one.
fn other_files(model: &Model) -> Result<Vec<(OsString, bool)>, ModelError> {
    let Some(dir) = &model.dir else {
        return Ok(Vec::new());
    };
    let io = |source| ModelError::Io {
        path: dir.clone(),
        source,
    };
    let mut own: Vec<String> = model.shards.iter().map(|s| s.name.clone()).collect();
    own.extend([INDEX_NAME, CONFIG_NAME].map(String::from));
    if let Some(index) = model.index_path.as_ref().and_then(|p| p.file_name()) {
        own.push(index.to_string_lossy().into_owned());
        own.push(SINGLE_NAME.to_string());
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let link = entry.file_type().map_err(io)?.is_symlink();
        let is_file = std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        let text = name.to_string_lossy();
        let ours = own.iter().any(|o| o.as_str() == text.as_ref()) || text.starts_with(".tlio-");
        if is_file && !ours && !text.contains(TEMP_MARK) {
            names.push((name, link));
        }
    }
    names.sort();
    Ok(names)
}
