//! Mapping errors to the exit codes and the one-line message of the CLI contract.
//!
//! Invariant: every error leaves the process as exactly one line on stderr,
//! `tlio: error: <cause>: <cause>...`, with exit 1 when the input is invalid and 2 for
//! usage and operational failures; a broken pipe on stdout ends quietly with 0.

use std::io::{self, Write};
use std::process::ExitCode;

/// How an error maps to the exit code of cli.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// The input is invalid (a malformed file, a bad value): exit 1.
    Invalid,
    /// A usage or operational failure (missing file, permission, disk full): exit 2.
    Operational,
}

impl ExitClass {
    /// The process exit code for this class.
    pub fn code(self) -> u8 {
        match self {
            ExitClass::Invalid => 1,
            ExitClass::Operational => 2,
        }
    }
}

/// Implemented by every core error type so the binary can pick the exit code without
/// string matching.
pub trait Classify {
    /// Whether this error means bad input (1) or a failed operation (2).
    fn exit_class(&self) -> ExitClass;
}

/// An error that carries its exit class explicitly, for checks made at the command layer.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Classified {
    /// What went wrong.
    pub message: String,
    /// The exit class to report.
    pub class: ExitClass,
}

/// An `anyhow` error whose exit code is 1 (invalid input).
pub fn invalid(message: impl Into<String>) -> anyhow::Error {
    Classified {
        message: message.into(),
        class: ExitClass::Invalid,
    }
    .into()
}

/// An `anyhow` error whose exit code is 2 (usage or operational).
pub fn operational(message: impl Into<String>) -> anyhow::Error {
    Classified {
        message: message.into(),
        class: ExitClass::Operational,
    }
    .into()
}

fn io_class(err: &io::Error) -> ExitClass {
    match err.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => ExitClass::Invalid,
        _ => ExitClass::Operational,
    }
}

/// The exit class of an error chain: the outermost cause that knows its class wins.
pub fn classify(err: &anyhow::Error) -> ExitClass {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Classified>() {
            return e.class;
        }
        if let Some(class) = crate::core::classify_error(cause) {
            return class;
        }
        if let Some(e) = cause.downcast_ref::<io::Error>() {
            return io_class(e);
        }
    }
    ExitClass::Operational
}

/// True when the chain contains a broken pipe (the reader of stdout went away).
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Print the one-line error and return the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        return ExitCode::SUCCESS;
    }
    // `{:#}` joins the chain with ": "; newlines inside a cause would break the
    // one-line contract, so they are escaped.
    let line = format!("{err:#}").replace('\n', "\\n");
    let _ = writeln!(io::stderr().lock(), "tlio: error: {line}");
    ExitCode::from(classify(err).code())
}
