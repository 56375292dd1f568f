//! Snapshots (insta) of every command's `--help`, and of the human and JSON output of
//! the reporting commands on committed fixtures.
//!
//! Every command runs with the repository root as its working directory and fixture
//! paths relative to it, so no output depends on where the checkout lives. A snapshot
//! holds the exit code, stdout and stderr. To accept a deliberate change, run
//! `INSTA_UPDATE=always cargo test --test cli snapshots` and review the `.snap` diff
//! (no extra tool needed; `cargo insta review` works too).
//!
//! Invariant: no snapshot depends on the terminal. `tlio()` clears every variable that
//! changes the help's width or the colour (`TERMINAL_VARS`), and
//! `snapshots_ignore_a_hostile_terminal` reruns these tests under a narrow, short,
//! colour-forcing environment and expects the very same snapshots.

use super::{tlio, TERMINAL_VARS};

/// Run `tlio ARGS` from the repository root, with no terminal variable set (whatever
/// the suite's own environment); the exit code, stdout and stderr as text.
fn run(args: &[&str]) -> String {
    let mut cmd = tlio();
    for var in TERMINAL_VARS {
        cmd.env_remove(var);
    }
    let out = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    format!(
        "exit: {}\n--- stdout\n{}--- stderr\n{}",
        out.status
            .code()
            .map_or("signal".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn help_of_every_command() {
    for path in crate::command_paths() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let mut name = String::from("help_tlio");
        for part in &path {
            name.push('_');
            name.push_str(part);
        }
        insta::assert_snapshot!(name, run(&args));
    }
}

const MIXED: &str = "fixtures/safetensors/golden/mixed_f32_i32_u8.safetensors";
const ESCAPES: &str = "fixtures/safetensors/golden/escapes.safetensors";
const SHARD: &str = "fixtures/cli/tiny.bin";
const TRUNCATED: &str = "fixtures/cli/truncated.bin";
const CKPT: &str = "fixtures/cli/ckpt";
const CKPT_CORRUPT: &str = "fixtures/cli/ckpt-corrupt";
const BAD_ST: &str = "fixtures/safetensors/malformed/r2_duplicate_tensor.safetensors";

#[test]
fn st_inspect_human_and_json() {
    insta::assert_snapshot!("st_inspect", run(&["st", "inspect", MIXED]));
    insta::assert_snapshot!("st_inspect_json", run(&["--json", "st", "inspect", MIXED]));
    insta::assert_snapshot!("st_inspect_escapes", run(&["st", "inspect", ESCAPES]));
}

#[test]
fn st_verify_human_and_json() {
    insta::assert_snapshot!("st_verify", run(&["st", "verify", MIXED, BAD_ST]));
    insta::assert_snapshot!(
        "st_verify_json",
        run(&["--json", "st", "verify", MIXED, BAD_ST])
    );
}

#[test]
fn tokens_header_human_and_json() {
    insta::assert_snapshot!(
        "tokens_header",
        run(&["tokens", "header", SHARD, TRUNCATED])
    );
    insta::assert_snapshot!(
        "tokens_header_json",
        run(&["--json", "tokens", "header", SHARD, TRUNCATED])
    );
}

#[test]
fn tokens_windows_json_lines() {
    let args = [
        "tokens",
        "windows",
        SHARD,
        "--seq-len",
        "4",
        "--batch",
        "2",
        "--batches",
        "3",
        "--seed",
        "1",
    ];
    insta::assert_snapshot!("tokens_windows", run(&args));
}

#[test]
fn ckpt_latest_human_and_json() {
    insta::assert_snapshot!("ckpt_latest", run(&["ckpt", "latest", CKPT]));
    insta::assert_snapshot!("ckpt_latest_json", run(&["--json", "ckpt", "latest", CKPT]));
    insta::assert_snapshot!(
        "ckpt_latest_fallback",
        run(&["ckpt", "latest", CKPT_CORRUPT])
    );
}

#[test]
fn ckpt_verify_human_and_json() {
    insta::assert_snapshot!("ckpt_verify", run(&["ckpt", "verify", CKPT]));
    insta::assert_snapshot!("ckpt_verify_json", run(&["--json", "ckpt", "verify", CKPT]));
    insta::assert_snapshot!(
        "ckpt_verify_corrupt",
        run(&["ckpt", "verify", CKPT_CORRUPT])
    );
}

/// The environment of a terminal that would change the help if it leaked through: 20
/// columns, 3 lines, colour forced on.
const HOSTILE: [(&str, &str); 5] = [
    ("COLUMNS", "20"),
    ("LINES", "3"),
    ("CLICOLOR_FORCE", "1"),
    ("CLICOLOR", "1"),
    ("TERM", "xterm-256color"),
];

/// The hostile values do change what `tlio` prints when they reach it, so the rerun
/// below tests something.
#[test]
fn hostile_terminal_changes_unprotected_help() {
    let mut cmd = tlio();
    cmd.envs(HOSTILE).args(["st", "--help"]);
    let hostile = cmd.output().unwrap().stdout;
    let plain = tlio().args(["st", "--help"]).output().unwrap().stdout;
    assert_ne!(hostile, plain);
    assert!(hostile.contains(&0x1b), "colour forced on");
}

/// Every snapshot of this module, rendered again by a copy of this test binary whose
/// own environment is hostile, is identical (insta compares; it writes no `.snap.new`).
#[test]
fn snapshots_ignore_a_hostile_terminal() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["snapshots::", "--skip", "hostile", "--test-threads", "2"])
        .envs(HOSTILE)
        .env("INSTA_UPDATE", "no")
        .env_remove("INSTA_FORCE_PASS")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{log}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The rerun did run the snapshot tests (a filter matching nothing also succeeds).
    assert!(log.contains("help_of_every_command ... ok"), "{log}");
}
