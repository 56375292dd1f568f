//! Integration tests of the `tlio` binary: one module per command group, a fresh
//! temporary directory per test, the binary run through `assert_cmd`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed unwrap, expect or index is the test's report"
)]
#![allow(
    clippy::too_many_lines,
    reason = "a CLI scenario reads top to bottom as one story; its steps share one temp directory"
)]
#![allow(
    unsafe_code,
    reason = "test set-up calls libc (mkfifo, umask, kill) that std does not wrap"
)]

use assert_cmd::Command;

mod ckpt;
mod demo;
mod errors;
mod generate;
mod grammar;
mod hardening;
mod hardening_tokens;
mod inputs;
mod models;
mod output;
mod readme;
mod round2;
mod round2_small;
mod shapes;
mod snapshots;
mod st;
mod tokens;
mod train;

/// The variables through which a terminal changes what `tlio` prints: the help's wrap
/// width (`COLUMNS`, `LINES`) and colour (`CLICOLOR_FORCE`, `CLICOLOR`, `NO_COLOR`,
/// `TERM`). Tests clear them so no output depends on the shell that runs the suite; a
/// test of one of them sets it again on its own command.
pub const TERMINAL_VARS: [&str; 6] = [
    "COLUMNS",
    "LINES",
    "CLICOLOR_FORCE",
    "CLICOLOR",
    "NO_COLOR",
    "TERM",
];

/// The `tlio` binary under test, with failpoints and the terminal variables cleared so
/// the caller's environment cannot leak in.
pub fn tlio() -> Command {
    let mut cmd = Command::cargo_bin("tlio").expect("the tlio binary is built");
    cmd.env_remove("FAILPOINTS");
    for var in TERMINAL_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// Make `cmd` see a full disk: no file it writes may grow past `bytes` (writes beyond
/// fail with EFBIG, SIGXFSZ being ignored so the write fails instead of killing it).
pub fn cap_file_size(cmd: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A fresh temporary directory for one test.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// The path of a committed fixture file.
pub fn fixture(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel)
}

/// Every command and group as its argument path (`[]` for `tlio` itself, `["st"]`,
/// `["st", "inspect"]`, ...), sorted. They come from the binary's own man pages (one
/// page per command, `tlio-st-inspect.1`), so the tests walk what a user can run and a
/// new command is covered by every test that walks them.
pub fn command_paths() -> Vec<Vec<String>> {
    let dir = tmp();
    let out = tlio()
        .args(["generate", "man", "-o"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "tlio generate man: {out:?}");
    let mut paths: Vec<Vec<String>> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| name.strip_suffix(".1").map(str::to_string))
        .map(|stem| stem.split('-').skip(1).map(str::to_string).collect())
        .collect();
    paths.sort();
    assert!(paths.len() >= 10, "too few man pages: {paths:?}");
    paths
}

/// Every leaf command's argument path (`["st", "inspect"]`, ...): a command no other
/// command extends.
pub fn leaf_commands() -> Vec<Vec<String>> {
    let all = command_paths();
    all.iter()
        .filter(|p| !all.iter().any(|q| q.len() > p.len() && q.starts_with(p)))
        .cloned()
        .collect()
}
