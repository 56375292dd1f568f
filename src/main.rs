//! The `tlio` binary: parse the command line, dispatch to `cmd`, map the outcome to an
//! exit code (0 success, 1 invalid input or a "no" answer, 2 usage or operational error).
//!
//! Everything the commands do is a call into `tlio_core`; this crate only parses
//! (`cmd`), prints (`output`), turns failures into exit codes (`error`) and cleans up
//! after a signal (`interrupt`).

mod cmd;
mod error;
mod interrupt;
mod output;

use std::process::ExitCode;

fn main() -> ExitCode {
    // First, before any thread exists: every thread must inherit the blocked signals.
    interrupt::install();
    // Failpoints come from the FAILPOINTS environment variable, checked whole before
    // anything runs: a malformed value is a usage error, never a panic.
    if let Err(err) = tlio_core::failpoints::configure_from_env() {
        return error::report(&err.into());
    }
    let cli = match cmd::parse() {
        Ok(cli) => cli,
        Err(err) => return error::report_usage(&err),
    };
    // No crate's panic text may reach the user (cli.md: one error line, never a panic
    // message): the hook prints nothing, a panic inside a tokenizer library becomes a
    // typed error where tlio-core catches it, and any other panic becomes one error
    // line here.
    std::panic::set_hook(Box::new(|_| {}));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cmd::run(cli))) {
        Ok(Ok(outcome)) => outcome.exit_code(),
        Ok(Err(err)) => error::report(&err),
        Err(payload) => error::report_panic(payload.as_ref()),
    }
}
