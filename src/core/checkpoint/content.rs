//! The content checks of one listed file of a step once its bytes were hashed, wherever
//! they were read from (a local file or an object): the sha256 against the manifest,
//! then by kind (a JSON file parsed, the trainer state by its schema, a safetensors
//! header by the reader rules).
//!
//! Invariant: a file's content is judged only after its digest matched, so a check
//! never parses bytes the manifest does not vouch for.

use super::manifest::{Manifest, ManifestEntry};
use super::state::TrainerState;
use super::verify::{Inspection, Problem, MAX_JSON_BYTES};
use super::{CONFIG_NAME, STATE_NAME};

/// The checks of one listed file once its bytes were hashed (`actual`), wherever it is
/// stored: the sha256 against the manifest, then its content by kind (a JSON file
/// parsed from `kept`, a safetensors header from `header`). With `keep_all` the bytes
/// go to [`Inspection::data`].
pub(crate) fn check_hashed(
    entry: &ManifestEntry,
    actual: String,
    kept: Vec<u8>,
    keep_all: bool,
    header: &mut dyn FnMut(
        &[u8],
    ) -> Result<
        crate::safetensors::Header,
        crate::safetensors::SafetensorsError,
    >,
    out: &mut Inspection,
    config_sha: &mut Option<String>,
) {
    let name = &entry.name;
    if actual != entry.sha256 {
        out.problems.push(Problem::Sha256 {
            name: name.clone(),
            expected: entry.sha256.clone(),
            actual,
        });
        return;
    }
    if name.ends_with(".json") {
        check_json(entry, kept, actual, out, config_sha);
        return;
    }
    if name.ends_with(".safetensors") {
        if let Err(e) = header(&kept) {
            out.problems.push(Problem::BadSafetensors {
                name: name.clone(),
                reason: crate::failure::full_text(&e),
            });
            return;
        }
    }
    if keep_all {
        out.data.insert(name.clone(), kept);
    }
}

/// A listed JSON file whose bytes match: small enough, valid JSON, the trainer state
/// by its schema; the config (and its sha256) kept for the loader.
pub(crate) fn check_json(
    entry: &ManifestEntry,
    kept: Vec<u8>,
    actual: String,
    out: &mut Inspection,
    config_sha: &mut Option<String>,
) {
    let name = &entry.name;
    let bad = |reason: String| Problem::BadJson {
        name: name.clone(),
        reason,
    };
    if entry.size > MAX_JSON_BYTES {
        out.problems
            .push(bad(format!("larger than {MAX_JSON_BYTES} bytes")));
    } else if name == STATE_NAME {
        match TrainerState::from_json(&kept) {
            Ok(s) => out.state = Some(s),
            Err(e) => out.problems.push(bad(e.to_string())),
        }
    } else if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&kept) {
        out.problems.push(bad(e.to_string()));
    } else if name == CONFIG_NAME {
        *config_sha = Some(actual);
        out.config = Some(kept);
    }
}

/// The trainer state agrees with the manifest's step and with config.json's sha256.
pub(crate) fn check_state(manifest: &Manifest, config_sha: Option<&str>, out: &mut Inspection) {
    let Some(state) = &out.state else {
        return;
    };
    let mut problems = Vec::new();
    if state.step != manifest.step {
        problems.push(Problem::BadJson {
            name: STATE_NAME.into(),
            reason: format!(
                "step {} differs from the manifest's {}",
                state.step, manifest.step
            ),
        });
    }
    if let Some(sha) = config_sha {
        if state.config_sha256.as_deref() != Some(sha) {
            problems.push(Problem::BadJson {
                name: STATE_NAME.into(),
                reason: format!("config_sha256 is not the sha256 of config.json ({sha})"),
            });
        }
    }
    out.problems.extend(problems);
}
