//! Errors look the same everywhere: for every command, a bad flag, a missing file and a
//! corrupt input each give exactly one line on stderr starting `tlio: error:`, nothing
//! on stdout, and the exit code of cli.md (2 usage/operational, 1 invalid input); a
//! range is checked while parsing, and even an uncaught panic is one line.

use super::{leaf_commands, run_without_panic, stderr_text, tlio, tmp};

/// Assert the one-line error contract on a finished command.
pub fn assert_one_error_line(out: &std::process::Output, code: i32, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit code; stderr: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: exactly one stderr line, got {stderr:?}"
    );
    assert!(
        lines[0].starts_with("tlio: error: "),
        "{what}: the line starts with `tlio: error: `, got {stderr:?}"
    );
}

#[test]
fn every_command_reports_a_bad_flag_on_one_line() {
    let commands = leaf_commands();
    assert!(commands.len() >= 3, "found only {commands:?}");
    for path in commands {
        let out = tlio().args(&path).arg("--no-such-flag").output().unwrap();
        let what = format!("tlio {} --no-such-flag", path.join(" "));
        assert_one_error_line(&out, 2, &what);
        assert!(out.stdout.is_empty(), "{what}: nothing on stdout");
        let line = String::from_utf8_lossy(&out.stderr);
        assert!(line.contains("--no-such-flag"), "names the flag: {line}");
    }
}

#[test]
fn every_group_without_a_subcommand_is_a_one_line_usage_error() {
    let leaves = crate::leaf_commands();
    let groups: Vec<Vec<String>> = crate::command_paths()
        .into_iter()
        .filter(|p| !leaves.contains(p))
        .collect();
    assert!(groups.len() >= 5, "found only {groups:?}");
    for path in groups {
        let out = tlio().args(&path).output().unwrap();
        assert_one_error_line(&out, 2, &format!("tlio {}", path.join(" ")));
    }
}

#[test]
fn a_bad_value_is_a_one_line_usage_error() {
    let out = tlio()
        .args(["generate", "completions", "powershell-9"])
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "bad shell");
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains("possible values"), "{line}");
}

#[test]
fn help_and_version_are_not_errors() {
    for args in [vec!["--help"], vec!["--version"], vec!["demo", "--help"]] {
        let out = tlio().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?} prints to stdout");
        assert!(out.stderr.is_empty(), "{args:?} prints nothing on stderr");
    }
}

#[test]
fn demo_refuses_a_non_empty_out_dir_on_one_line() {
    let dir = tmp();
    std::fs::write(dir.path().join("old"), b"x").unwrap();
    let out = tlio()
        .args(["-q", "demo", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "demo --out non-empty");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
}

#[test]
fn demo_reports_an_out_dir_it_cannot_create_on_one_line() {
    let dir = tmp();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = tlio()
        .args(["-q", "demo", "--out"])
        .arg(file.join("sub"))
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "demo --out under a file");
}

#[test]
fn generate_man_into_a_file_is_one_line() {
    let dir = tmp();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = tlio()
        .args(["generate", "man"])
        .arg(&file)
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "generate man into a file");
}

/// What a failing command must show.
enum Expect {
    /// One `tlio: error:` line on stderr and this exit code.
    Error(i32),
    /// A "no" answer: a report on stdout naming the file, nothing on stderr, exit 1.
    Report(&'static str),
}

/// Run `tlio ARGS` in `dir` and check the contract of cli.md for a failure.
fn check(dir: &std::path::Path, args: &[&str], expect: Expect) {
    let out = tlio().current_dir(dir).args(args).output().unwrap();
    let what = format!("tlio {}", args.join(" "));
    match expect {
        Expect::Error(code) => assert_one_error_line(&out, code, &what),
        Expect::Report(file) => {
            assert_eq!(out.status.code(), Some(1), "{what}: exit 1");
            assert!(
                out.stderr.is_empty(),
                "{what}: a no is not an error: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                String::from_utf8_lossy(&out.stdout).contains(file),
                "{what}: the report names {file}"
            );
        }
    }
}

/// A directory with a corrupt safetensors file, a corrupt shard, a checkpoint directory
/// whose only step has a corrupt manifest, and a text file.
fn corrupt_inputs() -> tempfile::TempDir {
    let dir = tmp();
    let p = dir.path();
    // The header length claims far more than the file holds.
    std::fs::write(p.join("bad.safetensors"), b"garbage!garbage").unwrap();
    std::fs::write(p.join("bad.bin"), b"xx").unwrap();
    std::fs::create_dir_all(p.join("badckpt/step-000001")).unwrap();
    std::fs::write(p.join("badckpt/step-000001/MANIFEST.json"), b"junk").unwrap();
    std::fs::write(p.join("badckpt/LATEST"), b"step-000001\n").unwrap();
    std::fs::write(p.join("ids.txt"), b"1 2 x 3").unwrap();
    dir
}

#[test]
fn st_missing_and_corrupt_inputs_are_one_line() {
    let dir = corrupt_inputs();
    let d = dir.path();
    for cmd in ["inspect", "verify"] {
        check(d, &["st", cmd, "missing.safetensors"], Expect::Error(2));
    }
    check(
        d,
        &["st", "diff", "missing.safetensors", "bad.safetensors"],
        Expect::Error(2),
    );
    let convert = [
        "st",
        "convert",
        "missing.safetensors",
        "o.safetensors",
        "--dtype",
        "BF16",
    ];
    check(d, &convert, Expect::Error(2));
    check(d, &["st", "inspect", "bad.safetensors"], Expect::Error(1));
    check(
        d,
        &["st", "verify", "bad.safetensors"],
        Expect::Report("bad.safetensors"),
    );
    check(
        d,
        &["st", "diff", "bad.safetensors", "bad.safetensors"],
        Expect::Error(1),
    );
    let convert = [
        "st",
        "convert",
        "bad.safetensors",
        "o.safetensors",
        "--dtype",
        "BF16",
    ];
    check(d, &convert, Expect::Error(1));
    assert!(
        !d.join("o.safetensors").exists(),
        "no output after an error"
    );
}

#[test]
fn tokens_missing_and_corrupt_inputs_are_one_line() {
    let dir = corrupt_inputs();
    let d = dir.path();
    check(d, &["tokens", "header", "missing.bin"], Expect::Error(2));
    check(
        d,
        &["tokens", "header", "bad.bin"],
        Expect::Report("bad.bin"),
    );
    check(
        d,
        &["tokens", "pack", "missing.txt", "-o", "o.bin"],
        Expect::Error(2),
    );
    let ids = [
        "tokens",
        "pack",
        "ids.txt",
        "-o",
        "o.bin",
        "--from",
        "ids",
        "--vocab-size",
        "9",
    ];
    check(d, &ids, Expect::Error(1));
    assert!(!d.join("o.bin").exists(), "no output after an error");
    let windows = ["--seq-len", "2", "--batch", "1"];
    let mut args = vec!["tokens", "windows", "missing.bin"];
    args.extend(windows);
    check(d, &args, Expect::Error(2));
    let mut args = vec!["tokens", "windows", "bad.bin"];
    args.extend(windows);
    check(d, &args, Expect::Error(1));
}

#[test]
fn ckpt_missing_and_corrupt_inputs_are_one_line() {
    let dir = corrupt_inputs();
    let d = dir.path();
    check(d, &["ckpt", "verify", "missing"], Expect::Error(2));
    check(d, &["ckpt", "latest", "missing"], Expect::Error(2));
    check(
        d,
        &["ckpt", "gc", "missing", "--keep", "1"],
        Expect::Error(2),
    );
    let save = [
        "ckpt",
        "save",
        "out",
        "--step",
        "1",
        "--model",
        "missing.safetensors",
    ];
    check(d, &save, Expect::Error(2));
    check(
        d,
        &["ckpt", "verify", "badckpt"],
        Expect::Report("step-000001"),
    );
    check(d, &["ckpt", "latest", "badckpt"], Expect::Error(1));
    let save = [
        "ckpt",
        "save",
        "out",
        "--step",
        "1",
        "--model",
        "bad.safetensors",
    ];
    check(d, &save, Expect::Error(1));
    assert!(
        !d.join("out/step-000001").exists(),
        "nothing saved from a corrupt input"
    );
}

#[test]
fn train_missing_and_corrupt_inputs_are_one_line() {
    let dir = corrupt_inputs();
    let d = dir.path();
    let train = |data: &'static str| {
        [
            "train",
            "bigram",
            "--data",
            data,
            "--out",
            "run",
            "--max-steps",
            "1",
        ]
    };
    check(d, &train("missing.bin"), Expect::Error(2));
    check(d, &train("bad.bin"), Expect::Error(1));
    assert!(
        !d.join("run/final.json").exists(),
        "no final line after an error"
    );
}

#[test]
fn zero_group_and_zero_jobs_are_refused_when_parsing_naming_the_flag() {
    // The input does not exist: a range error must come before any read.
    let missing = "missing.safetensors";
    let cases: [&[&str]; 4] = [
        &[
            "st", "quantize", missing, "-o", "q", "--int4", "--group", "0",
        ],
        &[
            "st", "convert", missing, "-o", "c", "--dtype", "bf16", "--jobs", "0",
        ],
        &[
            "st", "quantize", missing, "-o", "q", "--int4", "--jobs", "0",
        ],
        &["st", "dequantize", missing, "-o", "d", "--jobs", "0"],
    ];
    for args in cases {
        let flag = args[args.len() - 2];
        let out = tlio().args(args).output().unwrap();
        assert_one_error_line(&out, 2, flag);
        assert!(
            !stderr_text(&out).contains(missing),
            "{args:?}: {}",
            stderr_text(&out)
        );
    }
}

#[test]
fn an_uncaught_panic_is_one_error_line_without_the_hook_text() {
    // The failpoint crate's `panic` action is a panic no core call catches.
    let dir = tmp();
    let shard = dir.path().join("s.bin");
    let input = dir.path().join("t.txt");
    std::fs::write(&input, "abcabcabcabcabcabcabcabcabcabcabcabc").unwrap();
    let (code, err) = run_without_panic(
        tlio()
            .args(["tokens", "pack"])
            .arg(&input)
            .arg("-o")
            .arg(&shard),
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run_without_panic(
        tlio()
            .env("FAILPOINTS", "train/after-step=panic(boom)")
            .args([
                "train",
                "bigram",
                "--max-steps",
                "3",
                "--seq-len",
                "4",
                "--batch",
                "2",
                "-o",
            ])
            .arg(dir.path().join("ck"))
            .arg(&shard),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tlio: error: internal error"), "{err}");
    assert!(err.contains("boom"), "{err}");
}
