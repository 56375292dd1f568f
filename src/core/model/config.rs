//! The files of a model directory beside its tensors that the model's checks read:
//! `config.json` (bounded in size, an object without repeated keys or a finding) and whether
//! `tokenizer.json` is present as `config.json`'s `tl_tokenizer` says.

use std::io;
use std::path::Path;

use super::files::ModelFiles;
use super::{finding, Model, ModelError, CONFIG_NAME, MAX_CONFIG_SIZE, TOKENIZER_NAME};
use crate::safetensors::verify::Findings;

pub(super) fn read_config(
    path: &Path,
    files: &dyn ModelFiles,
    problems: &mut Findings,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ModelError> {
    let size = match files.size(path) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if size > MAX_CONFIG_SIZE {
        problems.push(finding(
            "config",
            None,
            format!("config: {CONFIG_NAME} is {size} bytes, over the limit of {MAX_CONFIG_SIZE}"),
        ));
        return Ok(None);
    }
    let text = files
        .read_limited(path, MAX_CONFIG_SIZE)
        .map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    // A repeated key is refused, as in an index or a header: serde_json's Value would
    // keep the last one silently, and transformers' json.load keeps it too.
    match crate::wire::parse_strict(&text) {
        Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
        Ok(_) => {
            problems.push(finding(
                "config",
                None,
                format!("config: {CONFIG_NAME} is not a JSON object"),
            ));
            Ok(None)
        }
        Err(e) => {
            problems.push(finding(
                "config",
                None,
                format!("config: {CONFIG_NAME} is not valid JSON: {e}"),
            ));
            Ok(None)
        }
    }
}

/// The format page: a directory holds `tokenizer.json` exactly when `config.json` says
/// `"tl_tokenizer": "file"`; without `tl_tokenizer` (Hugging Face) either is fine.
pub(super) fn check_tokenizer(model: &Model, files: &dyn ModelFiles, problems: &mut Findings) {
    let (Some(config), Some(dir)) = (&model.config, &model.dir) else {
        return;
    };
    let Some(mode) = config.get("tl_tokenizer") else {
        return;
    };
    let has = files.exists(&dir.join(TOKENIZER_NAME));
    let wants = mode.as_str() == Some("file");
    if wants && !has {
        problems.push(finding(
            "tokenizer",
            None,
            format!("tokenizer: config.json says \"tl_tokenizer\": \"file\" but the directory has no {TOKENIZER_NAME}"),
        ));
    } else if !wants && has {
        problems.push(finding(
            "tokenizer",
            None,
            format!(
                "tokenizer: the directory holds {TOKENIZER_NAME} but config.json's tl_tokenizer is {}, not \"file\"",
                mode
            ),
        ));
    }
}
