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
mod compressed;
mod dcp_import;
mod demo;
mod documents;
mod errors;
mod generate;
mod grammar;
mod hardening;
mod help_examples;
mod inputs;
mod mixture;
mod models;
mod mx;
mod output;
mod parts;
mod readme;
mod s3;
mod s3_cache;
mod s3_ckpt;
mod s3_config;
mod s3_data;
mod s3_faults;
mod s3_foreign_keys;
mod shapes;
mod sharded;
mod snapshots;
mod st;
mod temporaries;
mod tokenizers;
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

/// A copy of the sharded llama fixture (fixtures/models/llama-sharded) at `dir/name`.
pub fn sharded_model(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let m = dir.join(name);
    std::fs::create_dir(&m).unwrap();
    for e in std::fs::read_dir(fixture("models/llama-sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), m.join(e.file_name())).unwrap();
    }
    m
}

/// A finished command's stderr as text.
pub fn stderr_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run; returns (exit code, stderr), after checking no panic text was printed.
pub fn run_without_panic(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let err = stderr_text(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
    (out.status.code(), err)
}

/// The ids of a version-1 or -2 shard (u16 or u32 by the version word).
pub fn shard_ids(path: &std::path::Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    let wide = bytes[4] != 1;
    let body = &bytes[1024..];
    if wide {
        body.chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    } else {
        body.chunks(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    }
}

/// `tokens pack --from text --tokenizer TOKENIZER INPUT -o OUT`, not yet run.
pub fn pack_text(input: &std::path::Path, tokenizer: &str, out: &std::path::Path) -> Command {
    let mut cmd = tlio();
    cmd.args(["tokens", "pack", "--from", "text", "--tokenizer", tokenizer])
        .arg(input)
        .arg("-o")
        .arg(out);
    cmd
}
