//! The core: formats, algorithms and file-system protocols with typed errors.
//!
//! Arrows run one way; docs/architecture.md has the table, and `layering`'s test holds
//! the sources to it: `train` uses `checkpoint`, `tokens`, `safetensors` and `optim`;
//! `checkpoint` uses `safetensors` and `optim` (whose hyper-parameter type the
//! optimizer file stores); `model` uses `safetensors` and `files`; every area that
//! writes uses `atomic`, and `files` uses `atomic`. The leaves `failure` (what kind of
//! failure an error is), `text` (escaping names for display), `digest` (sha256 and
//! hex), `pcg` (the generator), `wire` (16-hex words, objects-only JSON), `cursor`
//! (the stream position's JSON) and `failpoints` use nothing of tlio's but each other,
//! and every area may use them. Nothing here prints, exits, looks at a terminal or
//! imports `cmd`, `error` or `output`: errors say their [`FailureKind`] and the
//! command layer alone turns that into an exit code.

pub mod atomic;
pub mod checkpoint;
pub mod cursor;
pub mod digest;
pub mod failpoints;
pub mod failure;
mod file_size;
pub mod files;
mod layering;
pub mod model;
pub mod optim;
pub mod pcg;
pub mod remote;
pub mod s3;
pub mod safetensors;
pub mod text;
pub mod tokens;
pub mod train;
pub mod wire;

pub use failure::{Failure, FailureKind};

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::io;
    use std::path::PathBuf;

    use crate::atomic::AtomicError;
    use crate::checkpoint::{state::StateError, CheckpointError};
    use crate::model::ModelError;
    use crate::safetensors::SafetensorsError;
    use crate::train::TrainError;

    fn io() -> io::Error {
        io::Error::new(io::ErrorKind::NotFound, "No such file or directory")
    }

    fn path() -> PathBuf {
        PathBuf::from("x.bin")
    }

    /// An error prints its source or returns it, never both: the CLI joins the chain
    /// with ": " and nothing else, so a source in the message would print twice.
    #[test]
    fn no_error_prints_the_source_it_returns() {
        let errors: Vec<Box<dyn Error>> = vec![
            Box::new(AtomicError::Create {
                dir: path(),
                source: io(),
            }),
            Box::new(AtomicError::Parent {
                dir: path(),
                source: io(),
            }),
            Box::new(AtomicError::Write {
                path: path(),
                source: io(),
            }),
            Box::new(SafetensorsError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(SafetensorsError::Write(io())),
            Box::new(ModelError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(ModelError::Write {
                path: path(),
                source: io(),
            }),
            Box::new(ModelError::Shard {
                shard: "a.safetensors".into(),
                source: SafetensorsError::Io {
                    path: path(),
                    source: io(),
                },
            }),
            Box::new(ModelError::Safetensors(SafetensorsError::Io {
                path: path(),
                source: io(),
            })),
            Box::new(TrainError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(CheckpointError::Io {
                path: path(),
                source: io(),
            }),
            Box::new(CheckpointError::State(StateError::Schema(
                "unknown key `x`".into(),
            ))),
        ];
        let mut with_source = 0;
        for err in &errors {
            let text = err.to_string();
            let mut cause = err.source();
            while let Some(c) = cause {
                with_source += 1;
                assert!(
                    !text.contains(&c.to_string()),
                    "{text:?} prints its source {:?}",
                    c.to_string()
                );
                cause = c.source();
            }
        }
        assert!(with_source >= errors.len());
    }

    /// Files whose flag names another change is moving out (none now).
    const FLAG_ALLOWED: &[&str] = &[];

    fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Core speaks of fields and values; only the command layer knows the flags. No
    /// string literal of core's non-test code holds `--` followed by a letter.
    #[test]
    fn no_core_string_names_a_flag() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let literal = regex::Regex::new(r#""(?:[^"\\]|\\.)*""#).unwrap();
        let char_literal = regex::Regex::new(r"'(?:[^'\\]|\\.)'").unwrap();
        let flag = regex::Regex::new(r"--[A-Za-z]").unwrap();
        let mut found = Vec::new();
        for path in &files {
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let name = path.file_name().unwrap().to_string_lossy();
            // An example under examples/ (the bench's rank simulator) is a program of
            // its own with its own flags, not core's library.
            let example = path.starts_with(root.join("examples"));
            if example
                || name == "tests.rs"
                || name.ends_with("_tests.rs")
                || FLAG_ALLOWED.contains(&&*rel)
            {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for (i, line) in code.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                let line = char_literal.replace_all(line, "' '");
                for m in literal.find_iter(&line) {
                    if flag.is_match(m.as_str()) {
                        found.push(format!("{rel}:{}: {}", i + 1, m.as_str()));
                    }
                }
            }
        }
        assert!(files.len() > 20, "the scan found too few files");
        assert!(
            found.is_empty(),
            "core strings that name a flag: {found:#?}"
        );
    }
}
