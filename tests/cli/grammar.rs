//! The grammar of docs/cli.md holds for every command: inputs positional, `-o/--output`
//! for what a command creates, examples at the end of every `--help`, the old
//! spellings still accepted (and hidden), dtype names accepted as people type them,
//! `tlio` alone lists the commands.

use std::fs;

use super::{command_paths, fixture, tlio, tmp};

fn stdout(args: &[&str]) -> String {
    let out = tlio().args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_help_ends_with_two_to_four_real_examples() {
    // Groups too (`tlio st --help`), not only the leaf commands.
    for mut path in command_paths() {
        path.push("--help".into());
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = stdout(&args);
        let (_, examples) = help
            .rsplit_once("\nExamples:\n")
            .unwrap_or_else(|| panic!("{args:?}: no Examples section:\n{help}"));
        let lines: Vec<&str> = examples.lines().collect();
        assert!(
            (2..=4).contains(&lines.len()),
            "{args:?}: {} examples",
            lines.len()
        );
        let command = path[..path.len() - 1].join(" ");
        for line in lines {
            assert!(line.starts_with("  "), "{args:?}: indented: {line:?}");
            assert!(line.contains("tlio "), "{args:?}: runs tlio: {line:?}");
            // Each example of a leaf command runs that command.
            assert!(
                line.contains(&command),
                "{args:?}: runs {command}: {line:?}"
            );
        }
    }
}

#[test]
fn every_group_summary_names_all_its_subcommands() {
    let all = command_paths();
    let top = stdout(&["--help"]);
    for group in all.iter().filter(|p| p.len() == 1) {
        let name = &group[0];
        let summary = top
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("tlio --help lists {name}:\n{top}"));
        // A summary may wrap: its continuation lines are indented past the names.
        let start = top.find(summary).unwrap_or(0);
        let rest: String = top[start..]
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .enumerate()
            .take_while(|(i, l)| *i == 0 || l.starts_with("     "))
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join(" ");
        let subs: Vec<&String> = all
            .iter()
            .filter(|p| p.len() == 2 && p[0] == *name)
            .map(|p| &p[1])
            .collect();
        for sub in subs {
            assert!(
                rest.contains(sub.as_str()),
                "tlio --help's summary of {name} names {sub}: {rest:?}"
            );
        }
    }
}

#[test]
fn old_spellings_are_hidden_from_help() {
    let help = stdout(&["train", "bigram", "--help"]);
    assert!(!help.contains("--data"), "{help}");
    assert!(!help.contains("--out "), "{help}");
    assert!(help.contains("-o, --output <DIR>"), "{help}");
    let help = stdout(&["st", "convert", "--help"]);
    assert!(!help.contains("<OUTPUT>"), "{help}");
    assert!(help.contains("-o, --output <OUT>"), "{help}");
}

#[test]
fn the_same_placeholders_everywhere() {
    let usage = |args: &[&str]| {
        let help = stdout(args);
        help.lines()
            .find_map(|l| l.strip_prefix("Usage: ").map(str::to_string))
            .unwrap()
    };
    assert!(usage(&["ckpt", "verify", "--help"]).ends_with("<DIR>"));
    assert!(usage(&["ckpt", "latest", "--help"]).ends_with("<DIR>"));
    assert!(usage(&["ckpt", "gc", "--help"]).ends_with("<DIR>"));
    assert!(usage(&["ckpt", "save", "--help"]).ends_with("<DIR>"));
    assert!(usage(&["tokens", "header", "--help"]).ends_with("<SHARD>..."));
    assert!(usage(&["tokens", "windows", "--help"]).ends_with("<SHARD>..."));
    assert!(usage(&["train", "bigram", "--help"]).contains("[SHARD]... -o <DIR>"));
    // The usage line and the Arguments section write the shards the same way.
    let help = stdout(&["train", "bigram", "--help"]);
    assert!(help.contains("\n  [SHARD]..."), "{help}");
    assert!(usage(&["st", "inspect", "--help"]).ends_with("<MODEL>..."));
    assert!(usage(&["st", "verify", "--help"]).ends_with("<MODEL>..."));
    assert!(usage(&["st", "diff", "--help"]).ends_with("<MODEL> <MODEL>"));
    assert!(usage(&["st", "convert", "--help"]).contains("<MODEL> -o <OUT>"));
    assert!(usage(&["st", "quantize", "--help"]).contains("<MODEL> -o <OUT>"));
    assert!(usage(&["st", "dequantize", "--help"]).contains("<MODEL> -o <OUT>"));
    // `ckpt latest` describes what it prints without naming a command that does not
    // exist.
    let help = stdout(&["ckpt", "latest", "--help"]);
    assert!(!help.contains("`load`"), "{help}");
}

#[test]
fn convert_accepts_the_output_both_ways_and_dtype_names_as_typed() {
    let dir = tmp();
    let src = fixture("safetensors/golden/dtype_F32.safetensors");
    let canonical = dir.path().join("canonical.safetensors");
    let out = tlio()
        .args(["st", "convert"])
        .arg(&src)
        .arg("-o")
        .arg(&canonical)
        .args(["--dtype", "F16"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let want = fs::read(&canonical).unwrap();
    for (i, name) in ["half", "fp16", "FLOAT16", "f16", "Fp16"]
        .iter()
        .enumerate()
    {
        let path = dir.path().join(format!("{i}.safetensors"));
        let mut cmd = tlio();
        cmd.args(["st", "convert"]).arg(&src);
        // Alternate between -o, --output and the old positional output.
        match i % 3 {
            0 => cmd.arg("-o").arg(&path),
            1 => cmd.arg("--output").arg(&path),
            _ => cmd.arg(&path),
        };
        let out = cmd.args(["--dtype", name]).output().unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("to F16,"),
            "{name}: prints the canonical name: {said}"
        );
        assert_eq!(fs::read(&path).unwrap(), want, "{name}");
    }
    // Both spellings at once is a usage error, not a silent pick.
    let out = tlio()
        .args(["st", "convert"])
        .arg(&src)
        .arg(dir.path().join("a"))
        .arg("-o")
        .arg(dir.path().join("b"))
        .args(["--dtype", "F16"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // Not a float dtype: the error lists the canonical names.
    let out = tlio()
        .args(["st", "convert"])
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join("c"))
        .args(["--dtype", "int8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains("BF16, F16, F8_E4M3, F8_E5M2"), "{line}");
}

#[test]
fn dtype_completion_offers_dtype_names_not_files() {
    let script = stdout(&["generate", "completions", "bash"]);
    assert!(script.contains("F64 F32 BF16 F16 F8_E4M3 F8_E5M2"), "bash");
    let script = stdout(&["generate", "completions", "fish"]);
    assert!(
        script.contains("-l dtype") && script.contains("BF16"),
        "fish"
    );
}

#[test]
fn train_accepts_positional_shards_and_the_old_data_out_flags() {
    let dir = tmp();
    let shard = dir.path().join("corpus.bin");
    let text = "the grammar is the same for every command. ".repeat(20);
    let out = tlio()
        .args(["tokens", "pack", "-o"])
        .arg(&shard)
        .arg("-")
        .write_stdin(text)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let flags = ["--max-steps", "4", "--batch", "2", "--seq-len", "8", "-q"];
    let new = dir.path().join("new");
    let out = tlio()
        .args(["train", "bigram"])
        .arg(&shard)
        .arg("-o")
        .arg(&new)
        .args(flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let old = dir.path().join("old");
    let out = tlio()
        .args(["train", "bigram", "--data"])
        .arg(&shard)
        .arg("--out")
        .arg(&old)
        .args(flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::read(new.join("final.json")).unwrap(),
        fs::read(old.join("final.json")).unwrap()
    );
    // No shard at all is a usage error.
    let out = tlio()
        .args(["train", "bigram", "-o"])
        .arg(dir.path().join("none"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn generate_man_takes_o_and_the_old_positional() {
    let dir = tmp();
    for args in [vec!["-o", "a"], vec!["--output", "b"], vec!["c"]] {
        let out = tlio()
            .current_dir(dir.path())
            .args(["-q", "generate", "man"])
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let dir_name = args.last().unwrap();
        assert!(
            dir.path().join(dir_name).join("tlio.1").is_file(),
            "{args:?}"
        );
    }
}

#[test]
fn tlio_alone_lists_the_commands_and_exits_2() {
    for path in [vec![], vec!["st"], vec!["ckpt"]] {
        let out = tlio().args(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{path:?}");
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(list.contains("Commands:"), "{path:?}: {list}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("tlio: error: a subcommand is required"));
    }
    let out = tlio().output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    for group in ["ckpt", "demo", "generate", "st", "tokens", "train"] {
        assert!(list.contains(&format!("\n  {group} ")), "{group}: {list}");
    }
}

#[test]
fn global_options_have_their_own_heading() {
    for args in [vec!["--help"], vec!["st", "inspect", "--help"]] {
        let help = stdout(&args);
        let (own, global) = help.split_once("\nGlobal options:\n").unwrap();
        for flag in ["--json", "--quiet", "--color <WHEN>"] {
            assert!(
                global.contains(flag),
                "{args:?}: {flag} under Global options"
            );
            assert!(
                !own.contains(flag),
                "{args:?}: {flag} not among the command's own"
            );
        }
    }
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let file = fixture("safetensors/golden/mixed_f32_i32_u8.safetensors");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = tlio();
        cmd.env_remove("NO_COLOR").env_remove("CLICOLOR_FORCE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .args(args)
            .arg("st")
            .arg("verify")
            .arg(&file)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let esc = '\u{1b}';
    assert!(!run(&[], &[]).contains(esc), "piped: no colour");
    assert!(run(&["--color", "always"], &[]).contains(esc));
    assert!(run(&["--color", "always"], &[("NO_COLOR", "1")]).contains(esc));
    assert!(run(&[], &[("CLICOLOR_FORCE", "1")]).contains(esc));
    assert!(!run(&[], &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]).contains(esc));
    assert!(!run(&["--color", "never"], &[("CLICOLOR_FORCE", "1")]).contains(esc));
    assert!(
        !run(&["--json", "--color", "always"], &[]).contains(esc),
        "JSON never"
    );
    // Errors: `tlio: error:` in colour only when asked.
    let out = tlio()
        .args(["--color", "always", "st", "inspect", "missing.safetensors"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).starts_with(&format!("{esc}[")));
    let out = tlio()
        .args(["st", "inspect", "missing.safetensors"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("tlio: error: "));
}

#[test]
fn no_output_line_ends_in_whitespace() {
    let corrupt = fixture("cli/ckpt-corrupt");
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["ckpt".into(), "verify".into(), corrupt.into()],
        vec![
            "st".into(),
            "inspect".into(),
            "--stats".into(),
            fixture("safetensors/golden/mixed_every_dtype.safetensors").into(),
        ],
        vec![
            "tokens".into(),
            "header".into(),
            fixture("cli/tiny.bin").into(),
            fixture("cli/truncated.bin").into(),
        ],
    ];
    for args in cases {
        let out = tlio().args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.is_empty(), "{args:?}");
        for line in text.lines() {
            assert_eq!(line, line.trim_end(), "{args:?}: trailing whitespace");
        }
    }
}

#[test]
fn json_is_one_compact_document_per_line_everywhere() {
    let dir = tmp();
    let golden = |n: &str| fixture(&format!("safetensors/golden/{n}.safetensors"));
    let out_file = dir.path().join("o.safetensors");
    let shard = dir.path().join("s.bin");
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec![
            "st".into(),
            "inspect".into(),
            golden("mixed_f32_i32_u8").into(),
        ],
        vec![
            "st".into(),
            "verify".into(),
            golden("mixed_f32_i32_u8").into(),
        ],
        vec![
            "st".into(),
            "diff".into(),
            golden("dtype_F32").into(),
            golden("dtype_F32").into(),
        ],
        vec![
            "st".into(),
            "convert".into(),
            golden("dtype_F32").into(),
            "-o".into(),
            out_file.into(),
            "--dtype".into(),
            "bf16".into(),
        ],
        vec![
            "ckpt".into(),
            "verify".into(),
            fixture("cli/ckpt-corrupt").into(),
        ],
        vec!["ckpt".into(), "latest".into(), fixture("cli/ckpt").into()],
        vec![
            "ckpt".into(),
            "gc".into(),
            fixture("cli/ckpt").into(),
            "--keep".into(),
            "1".into(),
            "--dry-run".into(),
        ],
        vec![
            "tokens".into(),
            "header".into(),
            fixture("cli/tiny.bin").into(),
            fixture("cli/truncated.bin").into(),
        ],
        vec![
            "tokens".into(),
            "pack".into(),
            fixture("cli/README.md").into(),
            "-o".into(),
            shard.into(),
        ],
    ];
    for args in cases {
        let out = tlio().arg("--json").args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!text.is_empty(), "{args:?}: {out:?}");
        for line in text.lines() {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{args:?}: a line is not a JSON document: {e}: {line}"));
            // Compact: as long as serde_json's compact form (which may order keys
            // differently, hence lengths rather than bytes).
            assert_eq!(
                line.len(),
                serde_json::to_string(&value).unwrap().len(),
                "{args:?}: compact: {line}"
            );
        }
    }
}

#[test]
fn cli_md_grammar_names_every_flag_of_every_command() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("docs/cli.md")).unwrap();
    let grammar = page
        .split_once("Every command, in this grammar")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/cli.md holds the grammar block");
    // A long flag at the start of an option's line in --help (after `-o, `).
    let option = regex::Regex::new(r"^\s+(?:(-[a-zA-Z]), )?(--[a-z][a-z0-9-]*)").unwrap();
    for path in super::leaf_commands() {
        let prefix = format!("tlio {}", path.join(" "));
        let lines: Vec<&str> = grammar
            .lines()
            .filter(|l| l == &prefix || l.starts_with(&format!("{prefix} ")))
            .collect();
        assert!(
            !lines.is_empty(),
            "docs/cli.md's grammar has no line for `{prefix}`"
        );
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = stdout(&args);
        let options = help
            .split_once("\nOptions:\n")
            .map(|(_, rest)| rest.split("\nGlobal options:").next().unwrap_or(rest))
            .unwrap_or("");
        // The flag as a whole word: `--val-tokens` is not `--val`.
        let has = |flag: &str| {
            lines.iter().any(|l| {
                l.match_indices(flag).any(|(at, _)| {
                    !l.get(at + flag.len()..).is_some_and(|rest| {
                        rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                    })
                })
            })
        };
        for line in options.lines() {
            let Some(caps) = option.captures(line) else {
                continue;
            };
            let long = caps.get(2).map_or("", |m| m.as_str());
            if long == "--help" || long == "--version" {
                continue;
            }
            let short = caps.get(1).map(|m| m.as_str());
            assert!(
                has(long) || short.is_some_and(has),
                "docs/cli.md's grammar for `{prefix}` lacks {long}"
            );
        }
    }
}

#[test]
fn every_command_that_takes_s3_urls_says_so_in_its_help() {
    // The commands whose inputs (or, for `tokens pack`, output) may be s3:// URLs
    // (docs/object-storage.md).
    for path in [
        "st inspect",
        "st verify",
        "ckpt save",
        "ckpt verify",
        "ckpt latest",
        "ckpt gc",
        "ckpt export",
        "tokens header",
        "tokens pack",
        "tokens merge",
        "tokens windows",
    ] {
        let mut args: Vec<&str> = path.split(' ').collect();
        args.push("--help");
        let help = stdout(&args);
        assert!(
            help.contains("s3://"),
            "tlio {path} --help does not say it takes s3://"
        );
    }
}
