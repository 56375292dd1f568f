//! What kind of failure a core error is: bad input, or an operation that could not be
//! done. Core owns the vocabulary; the command layer alone turns a kind into an exit
//! code.
//!
//! Invariant: every error type core defines implements [`Failure`] and is listed once in
//! [`kind_of`]'s registry; a unit test reads core's sources and fails when a type that
//! derives `thiserror::Error` is missing from the registry, so no error can silently
//! fall back to a default kind.

use std::error::Error;

/// The two kinds of failure the CLI contract tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The input is invalid: a malformed file, a value out of range, a failed check.
    Invalid,
    /// The operation could not be done: a missing file, a permission, a full disk, a
    /// lock held by another process, or a request that makes no sense.
    Operational,
}

/// Implemented by every error type of core: which kind of failure the value is.
///
/// Implementations match every variant explicitly (no `_` arm), so adding a variant
/// makes the compiler ask which kind it is.
pub trait Failure: Error {
    /// Whether this error means bad input or a failed operation.
    fn kind(&self) -> FailureKind;
}

/// Builds [`kind_of`] and the list of registered type names from one list of types, so
/// the two cannot drift apart. Every listed type must implement [`Failure`].
macro_rules! registry {
    ($($ty:path),+ $(,)?) => {
        /// The kind of `err` when it is one of core's error types, `None` otherwise.
        pub fn kind_of(err: &(dyn Error + 'static)) -> Option<FailureKind> {
            $(
                if let Some(e) = err.downcast_ref::<$ty>() {
                    return Some(Failure::kind(e));
                }
            )+
            None
        }

        /// The last path segment of every registered type, for the completeness test.
        #[cfg(test)]
        const REGISTERED: &[&str] = &[$(last_segment(stringify!($ty))),+];
    };
}

registry![
    super::atomic::AtomicError,
    super::checkpoint::CheckpointError,
    super::checkpoint::manifest::ManifestError,
    super::checkpoint::optimizer::OptimizerError,
    super::checkpoint::state::StateError,
    super::checkpoint::verify::Problem,
    super::model::ModelError,
    super::failpoints::FailpointsError,
    super::optim::OptimError,
    super::safetensors::SafetensorsError,
    super::tokens::TokensError,
    super::tokens::tokenizer::TokenizerError,
    super::train::TrainError,
];

/// The text after the last `::` of a stringified path (whitespace-tolerant).
#[cfg(test)]
const fn last_segment(path: &'static str) -> &'static str {
    let bytes = path.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b':' || bytes[i] == b' ' {
            start = i + 1;
        }
        i += 1;
    }
    let (_, tail) = bytes.split_at(start);
    match std::str::from_utf8(tail) {
        Ok(s) => s,
        Err(_) => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every `pub enum`/`pub struct` under `src/core` that derives `thiserror::Error`.
    fn error_types(dir: &Path, found: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("src/core is readable")
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                error_types(&path, found);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source is UTF-8");
            // Test-only modules may define helper error types; stop at the test module.
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let mut pending = false;
            for line in text.lines().map(str::trim) {
                if line.starts_with("#[derive(") && line.contains("thiserror::Error") {
                    pending = true;
                    continue;
                }
                if pending && !line.starts_with("#[") && !line.starts_with("///") {
                    let name = line
                        .split_whitespace()
                        .skip_while(|w| !matches!(*w, "enum" | "struct"))
                        .nth(1)
                        .map(|w| w.trim_end_matches(['{', '(', ';']).to_string());
                    if let Some(name) = name {
                        found.push((path.display().to_string(), name));
                    }
                    pending = false;
                }
            }
        }
    }

    #[test]
    fn every_core_error_type_is_registered() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
        let mut found = Vec::new();
        error_types(&root, &mut found);
        assert!(
            found.len() >= 5,
            "the scan found too few error types: {found:?}"
        );
        let missing: Vec<_> = found
            .iter()
            .filter(|(_, name)| !REGISTERED.contains(&name.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "core error types missing from core::failure's registry: {missing:?}"
        );
    }

    #[test]
    fn registered_names_are_the_type_names() {
        assert!(REGISTERED.contains(&"AtomicError"));
        assert!(REGISTERED.contains(&"Problem"));
    }

    #[test]
    fn foreign_errors_have_no_core_kind() {
        let err = std::io::Error::other("x");
        assert_eq!(kind_of(&err), None);
    }
}
