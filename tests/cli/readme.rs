//! The docs run as written: every ```` ```console ```` block of README.md and of each
//! docs/*.md page is executed, command by command, and what each command prints must
//! equal what the page shows under it; every other shell block carries the reason it
//! cannot run here (`every_shell_block_of_the_docs_runs_or_says_why`).
//!
//! How to write a block this test checks (for anyone adding a README section):
//! - Fence it with ```` ```console ````. A line starting `$ ` is a command, run by
//!   `sh` with `tlio` (the binary under test) first on PATH; the lines after it, up to
//!   the next `$ ` line, are its standard output and standard error together, in the
//!   order they were written.
//! - `[exit N]` on the line after the output means the command exits N (otherwise it
//!   must exit 0).
//! - Figures that change from run to run are masked on both sides: `tok/s <number>`
//!   and `in <number> s`. Anything else must match byte for byte.
//! - Every `###` section starts at the checkout's root (the test runs in a scratch copy
//!   where `assets/` and `fixtures/` are the checkout's own); a `cd` inside a section
//!   carries over to the section's later commands. Sections that write files begin
//!   with `mkdir -p tour/<name> && cd tour/<name>` (`tour/` is git-ignored).
//! - A block that must not run here (it needs torch, a server, a GPU, a download, a
//!   cluster) is preceded by the line `<!-- readme-test: skip: REASON -->`, REASON
//!   saying why in a few words (the Python tests run the README's `sh` blocks and the
//!   object-storage quick start; their markers say so). Every fence names its
//!   language: a shell block (`sh`, `bash`, ...) without the marker is an error, and so
//!   is a block of another language (`text` for a layout or a grammar) holding a line
//!   that reads as a command (`tlio ...`, `python ...`, `VAR=x tlio ...`), or a command
//!   indented four spaces. Python and JSON blocks are not shell.
//! - After a deliberate change, `TLIO_README_UPDATE=1 cargo test --release --test cli
//!   readme` writes each command's actual output (and `[exit N]`) into README.md in
//!   place of the old one; review the diff before committing.
//! - The shell's own report of a process killed by a signal (`Aborted`, printed by
//!   `sh` and not by tlio) is not part of the output; the README shows only
//!   `[exit 134]`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

/// One command of a block: the command line, the expected output, the exit code.
#[derive(Debug)]
struct Step {
    line: usize,
    section: usize,
    command: String,
    expected: String,
    code: i32,
}

/// Parse README text into steps.
fn steps(readme: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut section = 0;
    let mut in_block = false;
    let mut skip_next = false;
    let mut current: Option<Step> = None;
    for (i, line) in readme.lines().enumerate() {
        if !in_block {
            if line.starts_with("## ") || line.starts_with("### ") {
                section += 1;
            }
            if line.trim().starts_with("<!-- readme-test: skip") {
                skip_next = true;
                continue;
            }
            if line.starts_with("```") {
                in_block = true;
                if line.trim() != "```console" || skip_next {
                    // Not a tested block: consume until its end.
                    in_block = true;
                    current = None;
                    skip_next = false;
                    // Mark with an impossible section to skip its lines.
                    out.push(Step {
                        line: usize::MAX,
                        section,
                        command: String::new(),
                        expected: String::new(),
                        code: 0,
                    });
                }
                continue;
            }
            continue;
        }
        if line.starts_with("```") {
            in_block = false;
            if let Some(step) = current.take() {
                out.push(step);
            }
            // Drop the marker of a skipped block.
            if out.last().is_some_and(|s| s.line == usize::MAX) {
                out.pop();
            }
            continue;
        }
        if out.last().is_some_and(|s| s.line == usize::MAX) {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            if let Some(step) = current.take() {
                out.push(step);
            }
            current = Some(Step {
                line: i + 1,
                section,
                command: command.to_string(),
                expected: String::new(),
                code: 0,
            });
        } else if let Some(step) = current.as_mut() {
            if let Some(code) = line
                .strip_prefix("[exit ")
                .and_then(|r| r.strip_suffix(']'))
            {
                step.code = code.parse().expect("[exit N] holds a number");
            } else {
                step.expected.push_str(line);
                step.expected.push('\n');
            }
        } else {
            panic!("README.md:{}: output before any `$ ` command", i + 1);
        }
    }
    out
}

/// README text with the output under each command line (by 1-based line number)
/// replaced by the actual output and exit code.
fn rewrite(readme: &str, actuals: &[(usize, String, i32)]) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for (i, line) in readme.lines().enumerate() {
        if skipping {
            if line.starts_with("$ ") || line.starts_with("```") {
                skipping = false;
            } else {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
        if let Some((_, actual, code)) = actuals.iter().find(|(n, _, _)| *n == i + 1) {
            out.push_str(actual);
            if *code != 0 {
                out.push_str(&format!("[exit {code}]\n"));
            }
            skipping = true;
        }
    }
    out
}

/// Mask the figures that change from run to run.
fn mask(text: &str) -> String {
    let rate = Regex::new(r"tok/s \d+").unwrap();
    let secs = Regex::new(r"in \d+(\.\d+)? s\b").unwrap();
    let text = rate.replace_all(text, "tok/s [N]");
    secs.replace_all(&text, "in [T] s").into_owned()
}

/// The shell's report of a child killed by a signal, which is not tlio's output.
fn is_shell_signal_report(line: &str) -> bool {
    line == "Aborted" || line.ends_with(" Aborted") || line.starts_with("Aborted (core dumped)")
}

fn link_or_copy(from: &Path, to: &Path) {
    #[cfg(unix)]
    std::os::unix::fs::symlink(from, to).unwrap();
    #[cfg(not(unix))]
    panic!(
        "the README test needs symlinks: {} -> {}",
        from.display(),
        to.display()
    );
}

/// The pages that must hold a tour of at least five commands.
const TOUR_PAGES: [&str; 2] = ["README.md", "docs/tour.md"];

/// Every page whose blocks are held to these rules: the README and each `docs/*.md`,
/// relative to the checkout, in name order.
fn doc_pages(root: &Path) -> Vec<String> {
    let mut pages: Vec<String> = fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    pages.insert(0, "README.md".to_string());
    pages
}

#[test]
fn every_console_block_of_the_docs_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for page in doc_pages(root) {
        run_page(root, &page);
    }
}

/// Run every `console` block of `page` (relative to the checkout) and compare.
fn run_page(root: &Path, page: &str) {
    let readme = fs::read_to_string(root.join(page)).unwrap();
    let steps = steps(&readme);
    if steps.is_empty() && !TOUR_PAGES.contains(&page) {
        return;
    }
    assert!(
        steps.len() >= 5 || !TOUR_PAGES.contains(&page),
        "{page}: found only {} commands",
        steps.len()
    );
    let scratch = super::tmp();
    for name in ["assets", "fixtures"] {
        link_or_copy(&root.join(name), &scratch.path().join(name));
    }
    let bin = assert_cmd::cargo::cargo_bin("tlio");
    let bin_dir = bin.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let pwd_file = scratch.path().join(".pwd");
    let mut cwd = scratch.path().to_path_buf();
    let mut section = usize::MAX;
    let mut failures = Vec::new();
    let mut actuals = Vec::new();
    for step in &steps {
        if step.section != section {
            section = step.section;
            cwd = scratch.path().to_path_buf();
        }
        let script = format!(
            "{{ {}\n}} 2>&1\nrc=$?\npwd > \"$TOUR_PWD\"\nexit $rc",
            step.command
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(&cwd)
            .env("PATH", &path)
            .env("TOUR_PWD", &pwd_file)
            .env_remove("FAILPOINTS")
            .env_remove("NO_COLOR")
            .env_remove("CLICOLOR_FORCE")
            .output()
            .unwrap();
        if let Ok(dir) = fs::read_to_string(&pwd_file) {
            cwd = PathBuf::from(dir.trim_end_matches('\n'));
        }
        let _ = fs::remove_file(&pwd_file);
        let actual: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !is_shell_signal_report(l))
            .map(|l| format!("{l}\n"))
            .collect();
        let code = out.status.code().unwrap_or(-1);
        actuals.push((step.line, actual.clone(), code));
        if mask(&actual) != mask(&step.expected) || code != step.code {
            failures.push(format!(
                "{page}:{}: $ {}\n--- {page} (exit {})\n{}--- actual (exit {code})\n{actual}",
                step.line, step.command, step.code, step.expected
            ));
        }
    }
    if std::env::var_os("TLIO_README_UPDATE").is_some() {
        fs::write(root.join(page), rewrite(&readme, &actuals)).unwrap();
        return;
    }
    assert!(
        failures.is_empty(),
        "{} of {} commands of {page} differ:\n\n{}",
        failures.len(),
        steps.len(),
        failures.join("\n")
    );
}

/// A fenced block of a page: where it starts, its language, the reason of the skip
/// marker before it (if any) and its lines.
#[derive(Debug)]
struct Block {
    line: usize,
    lang: String,
    skip: Option<String>,
    lines: Vec<String>,
}

/// The languages of shell blocks: a block in one of them runs (`console`) or carries
/// the skip marker with its reason.
const SHELL_LANGS: [&str; 5] = ["console", "sh", "bash", "shell", "zsh"];

/// The first words of a line that is a command to type (in a block of any other
/// language than Python or JSON, or in an indented block).
const COMMAND_WORDS: [&str; 10] = [
    "$ ",
    "tlio ",
    "python ",
    "torchrun ",
    "pip ",
    "kill ",
    "cd ",
    "mkdir ",
    "export ",
    "sbatch ",
];

/// Whether `line` reads as a command: one of [`COMMAND_WORDS`], maybe after `VAR=value`
/// assignments.
fn is_command(line: &str) -> bool {
    let mut rest = line.trim_start();
    // `FAILPOINTS='...' tlio ...`, `PARTS=64 OUT=... examples/pack_slurm.sh ...`
    while let Some((word, tail)) = rest.split_once(' ') {
        let assignment = word.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        });
        if !assignment {
            break;
        }
        if tail
            .trim_start()
            .starts_with(|c: char| c.is_ascii_lowercase() || c == '.')
        {
            return true;
        }
        rest = tail.trim_start();
    }
    COMMAND_WORDS.iter().any(|w| rest.starts_with(w))
}

/// The reason of a skip marker line (`<!-- readme-test: skip: REASON -->`), `Some("")`
/// for a marker without one.
fn skip_reason(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("<!-- readme-test: skip")?;
    let rest = rest.strip_suffix("-->").unwrap_or(rest).trim();
    Some(rest.strip_prefix(':').unwrap_or(rest).trim().to_string())
}

/// Every fenced block of `text` (fences may be indented, inside a list item).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut skip: Option<String> = None;
    let mut current: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(block) = current.as_mut() {
            if trimmed.starts_with("```") {
                out.extend(current.take());
            } else {
                block.lines.push(line.to_string());
            }
            continue;
        }
        if let Some(lang) = trimmed.strip_prefix("```") {
            current = Some(Block {
                line: i + 1,
                lang: lang.trim().to_string(),
                skip: skip.take(),
                lines: Vec::new(),
            });
        } else if let Some(reason) = skip_reason(line) {
            skip = Some(reason);
        } else if !line.trim().is_empty() {
            skip = None;
        }
    }
    out
}

/// What is wrong with the blocks of `text` (page `page`): one line per block that
/// neither runs nor says why, and per indented command block.
fn block_problems(page: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for b in blocks(text) {
        let at = format!("{page}:{}", b.line);
        match &b.skip {
            Some(reason) if reason.split_whitespace().count() < 3 => problems.push(format!(
                "{at}: the skip marker gives no reason (`<!-- readme-test: skip: REASON -->`)"
            )),
            Some(_) => {}
            None if b.lang.is_empty() => problems.push(format!(
                "{at}: a fence names its language (`console` runs; `text` for a layout or a grammar)"
            )),
            None if b.lang == "console" => {}
            None if SHELL_LANGS.contains(&b.lang.as_str()) => problems.push(format!(
                "{at}: a `{}` block neither runs (`console`) nor carries the skip marker with its reason",
                b.lang
            )),
            None if ["python", "json", "jsonl"].contains(&b.lang.as_str()) => {}
            None => {
                if let Some(cmd) = b.lines.iter().find(|l| is_command(l)) {
                    problems.push(format!(
                        "{at}: a `{}` block holds the command `{}`: run it (`console`) or mark it with the reason",
                        b.lang,
                        cmd.trim()
                    ));
                }
            }
        }
    }
    // Indented code blocks (four spaces after a blank line, outside any fence).
    let mut in_fence = false;
    let mut previous_blank = true;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && previous_blank && line.starts_with("    ") && is_command(line) {
            problems.push(format!(
                "{page}:{}: an indented command (`{}`): fence it as `console`, or mark it with the reason",
                i + 1,
                line.trim()
            ));
        }
        previous_blank = line.trim().is_empty();
    }
    problems
}

#[test]
fn every_shell_block_of_the_docs_runs_or_says_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut ran = 0;
    for page in doc_pages(root) {
        let text = fs::read_to_string(root.join(&page)).unwrap();
        ran += steps(&text).len();
        problems.extend(block_problems(&page, &text));
    }
    assert!(ran >= 40, "only {ran} commands of the docs run");
    assert!(
        problems.is_empty(),
        "{} blocks neither run nor say why (tests/cli/readme.rs says how to write one):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_block_rules_catch_each_kind_of_unrun_block() {
    let page = "<!-- readme-test: skip: needs a GPU here -->\n```sh\nnvidia-smi\n```\n\
                ```console\n$ tlio demo\n```\n\
                ```python\nimport tlio\n```\n\
                ```text\nstep-000001/\n```\n\
                ```\nbare\n```\n\
                ```sh\ntlio st inspect m.safetensors\n```\n\
                <!-- readme-test: skip -->\n```sh\ntlio x\n```\n\
                ```text\nFAILPOINTS='a' tlio train bigram d.bin\n```\n\
                \n    tlio tokens header x.bin\n";
    let problems = block_problems("p.md", page);
    let lines: Vec<&str> = problems
        .iter()
        .map(|p| p.split(':').nth(1).unwrap())
        .collect();
    assert_eq!(lines, ["14", "17", "21", "24", "28"], "{problems:#?}");
    assert!(is_command("PARTS=64 OUT=/x examples/pack_slurm.sh submit"));
    assert!(!is_command("model.safetensors       the model's tensors"));
}

#[test]
fn the_parser_reads_commands_outputs_exit_codes_and_skips() {
    let text = "### a\n```console\n$ tlio x\nout 1\nout 2\n[exit 1]\n$ tlio y\n```\n\
                <!-- readme-test: skip -->\n```console\n$ tlio skipped\n```\n\
                ```text\n$ not run\n```\n### b\n```console\n$ tlio z\n```\n";
    let s = steps(text);
    let got: Vec<(&str, &str, i32, usize)> = s
        .iter()
        .map(|s| (s.command.as_str(), s.expected.as_str(), s.code, s.section))
        .collect();
    assert_eq!(
        got,
        vec![
            ("tlio x", "out 1\nout 2\n", 1, 1),
            ("tlio y", "", 0, 1),
            ("tlio z", "", 0, 2)
        ]
    );
    assert_eq!(mask("tok/s 123 in 1.5 s"), "tok/s [N] in [T] s");
}

#[test]
fn ci_runs_exactly_the_readme_test_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    // The README's first block: the demo, then the test command.
    let command = readme
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .nth(2)
        .map(str::trim)
        .expect("the README's test command");
    // The line as written, character for character: no comment on either side that a
    // reader (or a tool) comparing the two would have to cut.
    let ci = fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l == command),
        ".ci/run runs `{command}` as a line of its own"
    );
    // The test command runs cargo's whole suite with the committed lock file.
    let path = command.strip_prefix("bash ").unwrap_or(command);
    let script = fs::read_to_string(root.join(path)).unwrap();
    assert!(
        script
            .lines()
            .any(|l| l.trim() == "cargo test --release --locked"),
        "{command} runs `cargo test --release --locked`"
    );
}

/// The README's block of install lines (completions and man pages), found by its first
/// line.
fn install_block(readme: &str) -> Vec<String> {
    readme
        .split("```")
        // The fence's language (`sh`) is the block's first line.
        .filter_map(|block| block.strip_prefix("sh\n"))
        .find(|block| block.trim_start().starts_with("mkdir -p ~/.local"))
        .expect("the README's install block (```sh) starts with `mkdir -p ~/.local`")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_install_lines_work_on_a_fresh_home() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    // The binary is installed with the committed lock file, never a fresh resolution.
    assert!(
        readme.contains("`cargo install --path . --locked`"),
        "the README installs with --locked"
    );
    let lines = install_block(&readme);
    assert!(lines.len() >= 5, "{lines:?}");
    let home = super::tmp();
    let bin = assert_cmd::cargo::cargo_bin("tlio");
    let bin_dir = bin.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    // Every line as written, in one shell (the `export` carries over), stopping at the
    // first that fails; then what `man` is given, and the page it finds (where `man`
    // is installed).
    let script = format!(
        "set -e\n{}\nprintf '%s\\n' \"$MANPATH\"\n\
         if command -v man >/dev/null 2>&1; then man -w tlio-st-inspect; fi",
        lines.join("\n")
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(home.path())
        .env("HOME", home.path())
        .env("PATH", &path)
        .env_remove("MANPATH")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let h = home.path();
    for file in [
        ".local/share/bash-completion/completions/tlio",
        ".zfunc/_tlio",
        ".config/fish/completions/tlio.fish",
        ".local/share/man/man1/tlio-st-inspect.1",
        ".local/share/man/man1/tlio.1",
    ] {
        let len = fs::metadata(h.join(file)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "~/{file} was not written: {out:?}");
    }
    // MANPATH names the directory holding man1/, and keeps the system's pages (a
    // trailing or doubled `:`).
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut printed = stdout.lines();
    let manpath = printed.next().unwrap_or_default();
    let want = format!("{}:", h.join(".local/share/man").display());
    assert!(manpath.starts_with(&want), "MANPATH={manpath:?}");
    if let Some(page) = printed.next() {
        assert!(
            page.ends_with("/.local/share/man/man1/tlio-st-inspect.1"),
            "man -w tlio-st-inspect: {page:?}"
        );
    }
}
