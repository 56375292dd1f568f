//! The `tlio` binary: parse the command line, dispatch to `cmd`, map the outcome to an
//! exit code (0 success, 1 invalid input or a "no" answer, 2 usage or operational error).

use std::process::ExitCode;

fn main() -> ExitCode {
    // Failpoints come from the FAILPOINTS environment variable; the scenario must live
    // for the whole run so that every evaluated point sees it.
    let _failpoints = fail::FailScenario::setup();
    let cli = match tlio::cmd::parse() {
        Ok(cli) => cli,
        Err(err) => return tlio::error::report_usage(&err),
    };
    match tlio::cmd::run(cli) {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => tlio::error::report(&err),
    }
}
