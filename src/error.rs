//! Mapping errors to the exit codes and the one-line message of the CLI contract.
//!
//! Invariant: every error leaves the process as exactly one line on stderr,
//! `tlio: error: <cause>: <cause>...`, with exit 1 when the input is invalid and 2 for
//! usage and operational failures; a broken pipe on stdout ends quietly with 0.

use std::io::{self, Write};
use std::process::ExitCode;

use tlio_core::FailureKind;

/// The exit code of cli.md for a kind of failure: 1 for invalid input, 2 for usage
/// and operational failures. Exhaustive on purpose: a new kind must choose its code.
pub fn exit_code(kind: FailureKind) -> u8 {
    match kind {
        FailureKind::Invalid => 1,
        FailureKind::Operational => 2,
    }
}

/// An error that carries its kind explicitly, for checks made at the command layer.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Classified {
    /// What went wrong.
    pub message: String,
    /// The kind of failure to report.
    pub kind: FailureKind,
}

/// An `anyhow` error whose exit code is 2 (usage or operational).
pub fn operational(message: impl Into<String>) -> anyhow::Error {
    Classified {
        message: message.into(),
        kind: FailureKind::Operational,
    }
    .into()
}

/// A bare I/O error reaching the command layer: data that ends early or is not what
/// it claims is invalid input, everything else an operational failure.
fn io_kind(err: &io::Error) -> FailureKind {
    match err.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => FailureKind::Invalid,
        _ => FailureKind::Operational,
    }
}

/// The kind of an error chain: the outermost cause that knows its kind wins; a chain
/// of nothing but foreign errors (clap, serde, a bare message) is operational.
pub fn classify(err: &anyhow::Error) -> FailureKind {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Classified>() {
            return e.kind;
        }
        if let Some(kind) = kind_of(cause) {
            return kind;
        }
        if let Some(e) = cause.downcast_ref::<io::Error>() {
            return io_kind(e);
        }
    }
    FailureKind::Operational
}

/// True when the chain contains a broken pipe (the reader of stdout went away).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The chain of causes on one line, outermost first, joined with ": ".
///
/// Each cause is printed once by construction: an error of tlio-core either prints its
/// source in its message or returns it from `source()`, never both (a core test holds
/// every error type to it), and a context added here names what was being done, not
/// what the cause below already says. Secrets a URL carries are redacted
/// (`core::text::redact`). The whole line goes through
/// `core::text::escape`: a newline inside a cause would break the one-line contract, and
/// a name or path with a control or bidi character must not reach the terminal raw, no
/// matter which error carried it (escaping is idempotent, so causes that already
/// escaped their names are unchanged).
pub fn one_line(err: &anyhow::Error) -> String {
    let causes: Vec<String> = err.chain().map(ToString::to_string).collect();
    // Redacted as a whole too: a path given as a presigned URL is echoed by whichever
    // error could not open it, and a secret must never reach stderr.
    tlio_core::text::escape(&tlio_core::text::redact(&causes.join(": ")))
}

/// Print the one-line error and return the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        return ExitCode::SUCCESS;
    }
    let _ = writeln!(io::stderr().lock(), "{} {}", error_prefix(), one_line(err));
    ExitCode::from(exit_code(classify(err)))
}

/// A panic that no core call caught (a bug): one error line, exit 2, never the default
/// hook's text.
pub fn report_panic(payload: &(dyn std::any::Any + Send)) -> ExitCode {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string());
    let _ = writeln!(
        io::stderr().lock(),
        "{} internal error (a bug in tlio, please report it): {}",
        error_prefix(),
        text.replace('\n', " ")
    );
    ExitCode::from(2)
}

/// `tlio: error:`, in red when stderr gets colour (`--color`, NO_COLOR, a terminal).
fn error_prefix() -> String {
    crate::output::paint(
        "tlio: error:",
        crate::output::Tone::Bad,
        crate::output::stderr_color(),
    )
}

/// Report a command-line parsing outcome that is not a parsed command: `--help` and
/// `--version` print as clap renders them (stdout, exit 0); every usage error becomes
/// one line, `tlio: error: <what> (usage: <usage line>)`, with exit 2.
///
/// clap's own rendering spans several lines (the error, a tip, the usage, a pointer to
/// `--help`); the contract of cli.md is one line per error, so the first line and the
/// usage line are joined.
pub fn report_usage(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        // A closed stdout while printing help is not worth reporting.
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // `tlio` or `tlio st` alone: the list of commands, on stdout like --help, then
        // the one error line; still a usage error (exit 2), so a script that forgot
        // its command does not read success.
        let mut out = io::stdout().lock();
        let _ = write!(out, "{}", err.render()).and_then(|()| out.flush());
    }
    let mut line = usage_line(err);
    if crate::output::stderr_color() {
        if let Some(rest) = line.strip_prefix("tlio: error: ") {
            line = format!("{} {rest}", error_prefix());
        }
    }
    let _ = writeln!(io::stderr().lock(), "{line}");
    ExitCode::from(exit_code(FailureKind::Operational))
}

/// The one-line form of a clap usage error.
pub fn usage_line(err: &clap::Error) -> String {
    use clap::error::ErrorKind;
    // `to_string` on the rendered text drops colour codes.
    let rendered = err.render().to_string();
    let usage = rendered
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Usage: "))
        .map(str::trim);
    let what = if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        "a subcommand is required".to_string()
    } else {
        // Everything but the usage block and the pointer to --help, on one line:
        // "invalid value 'x' for '<SHELL>' [possible values: ...]".
        let mut what = String::new();
        for line in rendered.lines().map(str::trim) {
            if line.is_empty() || line.starts_with("Usage:") || line.starts_with("For more") {
                continue;
            }
            let line = line.strip_prefix("error: ").unwrap_or(line);
            if !what.is_empty() {
                what.push_str(if line.starts_with("tip:") { "; " } else { " " });
            }
            what.push_str(line);
        }
        if what.is_empty() {
            what.push_str("invalid arguments");
        }
        what
    };
    match usage {
        Some(usage) => format!("tlio: error: {what} (usage: {usage}; see --help)"),
        None => format!("tlio: error: {what} (see --help)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_joins_the_chain_once() {
        let inner = io::Error::new(io::ErrorKind::NotFound, "No such file");
        let err = anyhow::Error::new(tlio_core::atomic::AtomicError::Write {
            path: "x.bin".into(),
            source: inner,
        })
        .context("cannot save");
        assert_eq!(
            one_line(&err),
            "cannot save: cannot write x.bin: No such file"
        );
    }

    #[test]
    fn one_line_joins_distinct_causes_and_escapes_newlines() {
        let err = anyhow::anyhow!("bad\nvalue").context("outer");
        assert_eq!(one_line(&err), "outer: bad\\u{a}value");
        let err = anyhow::anyhow!("tensor \"x\u{202e}y\" in café").context("outer");
        assert_eq!(one_line(&err), "outer: tensor \"x\\u{202e}y\" in café");
    }
}

/// Every error type of tlio-core, so that [`classify`] can find the kind of a cause it
/// only sees as `dyn Error`. The list lives here, beside its only user, and not in core,
/// where naming every area's error type from one module would be a cycle; a test below
/// reads core's sources and fails when a type that derives `thiserror::Error` is
/// missing, so no core error can fall back to a default kind.
///
/// One list of types builds both [`kind_of`] and the registered names, so the two
/// cannot drift apart. Every listed type must implement `tlio_core::Failure`.
macro_rules! registry {
    ($($ty:path),+ $(,)?) => {
        /// The kind of `err` when it is one of core's error types, `None` otherwise.
        fn kind_of(err: &(dyn std::error::Error + 'static)) -> Option<FailureKind> {
            $(
                if let Some(e) = err.downcast_ref::<$ty>() {
                    return Some(tlio_core::Failure::kind(e));
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
    tlio_core::atomic::AtomicError,
    tlio_core::checkpoint::CheckpointError,
    tlio_core::checkpoint::manifest::ManifestError,
    tlio_core::checkpoint::optimizer::OptimizerError,
    tlio_core::checkpoint::state::StateError,
    tlio_core::checkpoint::verify::Problem,
    tlio_core::checkpoint::sharded::ShardedError,
    tlio_core::model::ModelError,
    tlio_core::failpoints::FailpointsError,
    tlio_core::optim::OptimError,
    tlio_core::remote::RemoteError,
    tlio_core::s3::S3Error,
    tlio_core::safetensors::SafetensorsError,
    tlio_core::safetensors::slice::SliceError,
    tlio_core::tokens::TokensError,
    tlio_core::tokens::parts::PartsError,
    tlio_core::tokens::docs::DocsError,
    tlio_core::tokens::tokenizer::TokenizerError,
    tlio_core::train::TrainError,
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
mod registry_tests {
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
            "core error types missing from error.rs's registry: {missing:?}"
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
