//! Errors look the same everywhere: for every command, a bad flag, a missing file and a
//! corrupt input each give exactly one line on stderr starting `tlio: error:`, nothing
//! on stdout, and the exit code of cli.md (2 usage/operational, 1 invalid input).

use clap::CommandFactory;

use super::{tlio, tmp};

/// Every leaf command as its argument path, e.g. `["st", "inspect"]`, from the same
/// clap definition the binary parses with, so a new command is covered automatically.
fn leaf_commands() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .collect();
        if subs.is_empty() {
            out.push(path.clone());
        }
        for sub in subs {
            path.push(sub.get_name().to_string());
            walk(sub, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(&tlio::cmd::Cli::command(), &mut Vec::new(), &mut out);
    out
}

/// Assert the one-line error contract on a finished command.
pub fn assert_one_error_line(out: &std::process::Output, code: i32, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit code; stderr: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{what}: stdout must be empty, got {}",
        String::from_utf8_lossy(&out.stdout)
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
        assert_one_error_line(&out, 2, &format!("tlio {} --no-such-flag", path.join(" ")));
        let line = String::from_utf8_lossy(&out.stderr);
        assert!(line.contains("--no-such-flag"), "names the flag: {line}");
    }
}

#[test]
fn every_group_without_a_subcommand_is_a_one_line_usage_error() {
    let cli = tlio::cmd::Cli::command();
    let mut groups = vec![Vec::<String>::new()];
    for sub in cli.get_subcommands() {
        if sub.get_subcommands().next().is_some() {
            groups.push(vec![sub.get_name().to_string()]);
        }
    }
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
