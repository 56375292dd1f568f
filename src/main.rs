//! The `tlio` binary: parse the command line, dispatch to `cmd`, map the outcome to an
//! exit code (0 success, 1 invalid input or a "no" answer, 2 usage or operational error).

use std::process::ExitCode;

fn main() -> ExitCode {
    // First, before any thread exists: every thread must inherit the blocked signals.
    tlio::interrupt::install();
    // Failpoints come from the FAILPOINTS environment variable, checked whole before
    // anything runs: a malformed value is a usage error, never a panic.
    if let Err(err) = tlio::core::failpoints::configure_from_env() {
        return tlio::error::report(&err.into());
    }
    let cli = match tlio::cmd::parse() {
        Ok(cli) => cli,
        Err(err) => return tlio::error::report_usage(&err),
    };
    match tlio::cmd::run(cli) {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => tlio::error::report(&err),
    }
}
