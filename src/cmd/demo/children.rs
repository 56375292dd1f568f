//! The demo's child processes: how `tlio demo` runs the `tlio` binary itself, reads
//! what a child printed and tells how it ended. Invariant: children run in the work
//! directory with relative paths and a cleared `FAILPOINTS` unless one is given, so
//! nothing they print depends on where the work directory is or on the caller's
//! environment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::Context;
use serde_json::Value;

use super::{BATCH, CKPT_EVERY, LR, SEED, SEQ_LEN, SHARD, STEPS};
use crate::output::Printer;

/// Runs `tlio` children in the work directory with relative paths, so that nothing
/// they print depends on where the work directory is.
pub(super) struct Children<'a> {
    pub(super) exe: PathBuf,
    pub(super) dir: &'a Path,
    pub(super) printer: &'a Printer,
    /// One tick per child; drawn only on a terminal (the Printer decides).
    pub(super) bar: indicatif::ProgressBar,
}

impl Children<'_> {
    /// Run `tlio ARGS` with `FAILPOINTS` set to `failpoints` (or cleared).
    pub(super) fn run(&self, args: &[&str], failpoints: Option<&str>) -> anyhow::Result<Output> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .current_dir(self.dir)
            .stdin(Stdio::null())
            .env_remove("FAILPOINTS");
        if let Some(spec) = failpoints {
            cmd.env("FAILPOINTS", spec);
        }
        let out = cmd
            .output()
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        self.bar.inc(1);
        Ok(out)
    }

    /// Show what a child said on stderr, because it did something unexpected.
    pub(super) fn show_failure(&self, args: &[&str], out: &Output) {
        self.bar.suspend(|| self.write_failure(args, out));
    }

    pub(super) fn write_failure(&self, args: &[&str], out: &Output) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "tlio demo: `tlio {}` ended with {}; its stderr:",
            args.join(" "),
            describe(&out.status)
        );
        let _ = err.write_all(&out.stderr);
        if !out.stderr.ends_with(b"\n") && !out.stderr.is_empty() {
            let _ = writeln!(err);
        }
    }

    /// Say what the demo is doing: the bar's message on a terminal, else a line of
    /// chatter (silenced by `-q`).
    pub(super) fn stage(&self, what: &str) {
        if self.printer.wants_progress() {
            self.bar.set_message(what.to_string());
        } else {
            self.printer.info(format!("tlio demo: {what}"));
        }
    }
}

/// How a child ended, in words.
pub(super) fn describe(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            if sig == libc::SIGABRT {
                return format!("SIGABRT (signal {sig})");
            }
            return format!("signal {sig}");
        }
    }
    "an unknown status".to_string()
}

/// True when the child was ended by `abort()` (SIGABRT), as the failpoint's `return`
/// action does.
pub(super) fn aborted(status: &ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal() == Some(libc::SIGABRT)
    }
    #[cfg(not(unix))]
    {
        !status.success()
    }
}

pub(super) fn stdout_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The first value under `key` anywhere in `v`, depth first, objects before arrays'
/// later elements.
pub(super) fn find<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(map) => {
            if let Some(found) = map.get(key) {
                return Some(found);
            }
            map.values().find_map(|x| find(x, key))
        }
        Value::Array(items) => items.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

/// The flags shared by the three training runs.
pub(super) fn train_args(out: &str) -> Vec<String> {
    vec![
        "train".into(),
        "bigram".into(),
        SHARD.into(),
        "-o".into(),
        out.into(),
        "--max-steps".into(),
        STEPS.to_string(),
        "--ckpt-every".into(),
        CKPT_EVERY.to_string(),
        "--batch".into(),
        BATCH.to_string(),
        "--seq-len".into(),
        SEQ_LEN.to_string(),
        "--seed".into(),
        SEED.to_string(),
        "--lr".into(),
        LR.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_searches_nested_documents() {
        let v: Value = serde_json::json!({"files": [{"path": "x", "n": 3}]});
        assert_eq!(find(&v, "n"), Some(&Value::from(3)));
        assert_eq!(find(&v, "missing"), None);
    }
}
