//! `tlio ckpt import`: a checkpoint of PyTorch DCP's FileSystemWriter made a verified
//! tlio step. Its `.metadata` is a Python pickle, which this binary never reads: the
//! command runs the installed Python package (`python -m tlio._dcp_import`), whose
//! reader resolves no global outside DCP's metadata classes, and passes its exit
//! status and output through.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;
use serde::Serialize;

use super::super::Outcome;
use crate::output::Printer;

/// The variable naming the Python interpreter that has tlio and torch installed.
pub const PYTHON_VAR: &str = "TLIO_PYTHON";
/// The interpreter used when the variable is unset.
const DEFAULT_PYTHON: &str = "python3";

/// Run the import in Python; its errors go to stderr as it writes them, and the step
/// directory it prints is this command's result.
pub fn run(
    dcp_dir: &Path,
    run_dir: &Path,
    step: Option<u64>,
    printer: &Printer,
) -> anyhow::Result<Outcome> {
    // The source is checked here, so a FIFO or a missing directory is named at once,
    // whatever the interpreter has installed.
    let meta =
        std::fs::metadata(dcp_dir).with_context(|| format!("cannot read {}", dcp_dir.display()))?;
    if !meta.is_dir() {
        let err = tlio_core::files::name_non_directory(
            dcp_dir,
            std::io::Error::from(std::io::ErrorKind::NotADirectory),
        );
        return Err(err).with_context(|| format!("cannot import {}", dcp_dir.display()));
    }
    let python = std::env::var_os(PYTHON_VAR).unwrap_or_else(|| DEFAULT_PYTHON.into());
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "tlio._dcp_import"])
        .arg(dcp_dir)
        .arg(run_dir);
    if let Some(n) = step {
        cmd.arg("--step").arg(n.to_string());
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).output();
    let output = child.with_context(|| {
        format!(
            "cannot run {} (ckpt import reads DCP's pickled metadata in Python: set {PYTHON_VAR} \
             to an interpreter with the tlio package and torch installed)",
            Path::new(&python).display()
        )
    })?;
    match output.status.code() {
        Some(0) => {
            let path = String::from_utf8_lossy(&output.stdout)
                .trim_end()
                .to_string();
            if printer.json {
                #[derive(Serialize)]
                struct Out<'a> {
                    path: &'a str,
                }
                printer.json_line(&Out { path: &path })?;
            } else {
                writeln!(printer.out(), "{path}")?;
            }
            Ok(Outcome::Success)
        }
        Some(1) => Ok(Outcome::No),
        Some(2) => Ok(Outcome::Refused),
        other => anyhow::bail!(
            "{} -m tlio._dcp_import ended with {} (is the tlio Python package installed there? \
             set {PYTHON_VAR} to the interpreter that has it)",
            Path::new(&python).display(),
            other.map_or_else(|| "a signal".to_string(), |c| format!("exit status {c}"))
        ),
    }
}
