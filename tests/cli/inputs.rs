//! The opening rule for input files: every file a command reads is opened without
//! blocking and checked to be a regular file on the open descriptor, so a FIFO (or a
//! symlink to one) anywhere a command takes a path is one error line, never a hang.
//! The walk covers every leaf command, so a new command is covered as soon as it exists.
//! A closed standard input is refused, never read as an empty one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use crate::errors::assert_one_error_line;
use crate::{fixture, leaf_commands, tlio, tmp};

/// How long a command may take to refuse a FIFO; a hang is killed after it.
const LIMIT: Duration = Duration::from_secs(8);

pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// Run `tlio args` with a deadline; `None` when it had to be killed.
fn run(args: &[String]) -> Option<std::process::Output> {
    let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("tlio"))
        .args(args)
        .env_remove("FAILPOINTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// The files the templates name: `@name` in a template is replaced by one of these.
struct Inputs {
    dir: tempfile::TempDir,
}

impl Inputs {
    fn new() -> Self {
        let dir = tmp();
        let d = dir.path();
        fs::copy(
            fixture("models/bigram/model.safetensors"),
            d.join("model.safetensors"),
        )
        .unwrap();
        fs::copy(
            fixture("models/int4/quantized-g8.safetensors"),
            d.join("q.safetensors"),
        )
        .unwrap();
        fs::write(
            d.join("c.txt"),
            (0..600u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        tlio()
            .args(["-q", "tokens", "pack"])
            .arg(d.join("c.txt"))
            .arg("-o")
            .arg(d.join("shard.bin"))
            .assert()
            .success();
        for name in ["fifo.safetensors", "fifo.bin", "fifo.json", "fifo"] {
            mkfifo(&d.join(name));
        }
        std::os::unix::fs::symlink(d.join("fifo.safetensors"), d.join("link.safetensors")).unwrap();
        Inputs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The argument list of `template`, with `@x` replaced by the path of `x` and `@out`
    /// by a fresh output path.
    fn argv(&self, leaf: &[String], template: &[&str], n: usize) -> Vec<String> {
        let mut argv: Vec<String> = leaf.to_vec();
        for arg in template {
            argv.push(
                match arg.strip_prefix('@') {
                    Some("out") => self.path(&format!("out-{}-{n}", leaf.join("-"))),
                    Some(name) => self.path(name),
                    None => PathBuf::from(arg),
                }
                .to_string_lossy()
                .into_owned(),
            );
        }
        argv
    }
}

/// Templates expected to hang because their reader does not yet go through the opening
/// rule. Empty: every reader does. The mechanism stays so that a reader taken over from
/// elsewhere can be listed while it is routed, and the test fails as soon as a listed one
/// stops hanging, so the list cannot go stale.
const AWAITING: &[&[&str]] = &[];

/// For each leaf command, argument lists that put a FIFO (`@fifo*`, or `@link`, a
/// symlink to one) in each slot that takes a path, the other slots holding valid files.
fn templates(leaf: &[String]) -> Option<Vec<Vec<&'static str>>> {
    let leaf: Vec<&str> = leaf.iter().map(String::as_str).collect();
    let q = "@q.safetensors";
    let m = "@model.safetensors";
    let f = "@fifo.safetensors";
    let l = "@link.safetensors";
    let save = ["@out", "--step", "1", "--tokens-seen", "0", "--lr", "0.01"];
    let with = |extra: &[&'static str]| [save.as_slice(), extra].concat();
    Some(match leaf.as_slice() {
        ["st", "inspect"] => vec![vec![f], vec![l], vec![m, f], vec!["--stats", f]],
        ["st", "verify"] => vec![vec![f], vec![l], vec![m, f]],
        ["st", "diff"] => vec![vec![f, m], vec![m, f], vec![m, l]],
        ["st", "convert"] => vec![
            vec![f, "-o", "@out", "--dtype", "bf16"],
            vec![l, "-o", "@out", "--dtype", "bf16"],
            vec![m, "-o", "@fifo.safetensors", "--dtype", "bf16"],
            vec![m, "-o", "@fifo/m.safetensors", "--dtype", "bf16"],
        ],
        ["st", "quantize"] => vec![
            vec![f, "-o", "@out", "--int4"],
            vec![l, "-o", "@out", "--int4"],
            vec![m, "-o", "@fifo.safetensors", "--int4"],
        ],
        ["st", "dequantize"] => vec![
            vec![f, "-o", "@out"],
            vec![l, "-o", "@out"],
            vec![q, "-o", "@fifo.safetensors"],
        ],
        ["ckpt", "save"] => vec![
            with(&["--model", f]),
            with(&["--model", l]),
            with(&["--model", m, "--optimizer", f]),
            with(&["--model", m, "--config", "@fifo.json"]),
            [&["@out", "--step", "1", "--model", m, "--state", "@fifo.json"][..]].concat(),
            vec![
                "@fifo",
                "--step",
                "1",
                "--model",
                m,
                "--tokens-seen",
                "0",
                "--lr",
                "0",
            ],
            [&["@fifo/run", "--step", "1", "--model", m][..], &save[3..]].concat(),
        ],
        ["ckpt", "verify"] => vec![vec!["@fifo"]],
        ["ckpt", "latest"] => vec![vec!["@fifo"]],
        ["ckpt", "gc"] => vec![vec!["@fifo", "--keep", "1"]],
        ["ckpt", "export"] => vec![vec!["@fifo", "-o", "@out"]],
        ["ckpt", "import"] => vec![vec!["@fifo", "-o", "@out"]],
        ["tokens", "merge"] => vec![vec!["@fifo/x.bin"]],
        ["tokens", "header"] => vec![vec!["@fifo.bin"], vec!["@shard.bin", "@fifo.bin"]],
        ["tokens", "windows"] => vec![
            vec!["@fifo.bin", "--seq-len", "4", "--batch", "2"],
            vec!["@shard.bin", "@fifo.bin", "--seq-len", "4", "--batch", "2"],
            vec![
                "@shard.bin",
                "--seq-len",
                "4",
                "--batch",
                "2",
                "--cursor",
                "@fifo.json",
            ],
            vec![
                "@shard.bin",
                "--seq-len",
                "4",
                "--batch",
                "2",
                "--save-cursor",
                "@fifo",
            ],
        ],
        ["tokens", "decode"] => vec![
            vec!["@fifo.bin", "--tokenizer", "gpt2"],
            vec!["@shard.bin", "--tokenizer", "@fifo.json"],
        ],
        ["tokens", "pack"] => vec![
            vec!["@fifo", "-o", "@out"],
            vec!["@c.txt", "@fifo", "-o", "@out"],
            vec!["@c.txt", "-o", "@fifo.bin"],
            vec!["@c.txt", "-o", "@fifo/x.bin"],
            vec![
                "@c.txt",
                "--tokenizer",
                "@fifo.json",
                "--eot",
                "none",
                "-o",
                "@out",
            ],
            vec![
                "@fifo",
                "--from",
                "text",
                "--tokenizer",
                "gpt2",
                "-o",
                "@out",
            ],
        ],
        ["train", "bigram"] => vec![
            vec!["@fifo.bin", "-o", "@out", "--max-steps", "1"],
            vec!["@shard.bin", "-o", "@fifo", "--max-steps", "1"],
            vec!["@shard.bin", "-o", "@fifo/run", "--max-steps", "1"],
        ],
        ["generate", "man"] => vec![vec!["-o", "@fifo"], vec!["-o", "@fifo/man1"]],
        ["demo"] => vec![vec!["-o", "@fifo"]],
        // Takes no path.
        ["generate", "completions"] => vec![],
        _ => return None,
    })
}

/// The value names of `leaf`'s help that stand for a path (`<MODEL>`, `--model <FILE>`):
/// each must be given a FIFO by some template, so a new path argument is covered too.
fn path_slots(leaf: &[String]) -> Vec<String> {
    let out = tlio().args(leaf).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let mut slots = Vec::new();
    for line in help.lines().map(str::trim) {
        let head = line.split_once("  ").map_or(line, |(head, _)| head);
        let words: Vec<&str> = head.split_whitespace().collect();
        let (flag, value) = match words.as_slice() {
            [value] if value.starts_with(['<', '[']) => (None, *value),
            [.., flag, value] if flag.starts_with("--") && value.starts_with('<') => {
                (Some(*flag), *value)
            }
            _ => continue,
        };
        let name = value.trim_matches(['<', '>', '[', ']', '.']);
        let path = ["MODEL", "FILE", "SHARD", "DIR", "OUT"].contains(&name);
        if path || flag == Some("--tokenizer") {
            slots.push(flag.unwrap_or(name).to_string());
        }
    }
    slots
}

/// Whether some template gives slot `slot` (a flag, or a positional's value name) a FIFO.
fn covered(templates: &[Vec<&str>], slot: &str) -> bool {
    templates.iter().any(|t| {
        t.iter().enumerate().any(|(i, arg)| {
            let fifo = arg.starts_with("@fifo") || arg.starts_with("@link");
            let after_flag = i.checked_sub(1).and_then(|j| t.get(j));
            fifo && match after_flag {
                Some(prev) if prev.starts_with('-') => {
                    *prev == slot || (slot == "--output" && *prev == "-o")
                }
                _ => !slot.starts_with('-'),
            }
        })
    })
}

#[test]
fn every_command_refuses_a_fifo_in_every_path_slot_without_hanging() {
    let inputs = Inputs::new();
    let mut failures = Vec::new();
    for leaf in leaf_commands() {
        let Some(templates) = templates(&leaf) else {
            failures.push(format!(
                "{leaf:?}: no FIFO template (add one to templates())"
            ));
            continue;
        };
        for slot in path_slots(&leaf) {
            if !covered(&templates, &slot) {
                failures.push(format!("{leaf:?}: no template puts a FIFO in {slot}"));
            }
        }
        for (n, template) in templates.iter().enumerate() {
            let argv = inputs.argv(&leaf, template, n);
            let awaited = AWAITING.contains(&template.as_slice());
            let Some(out) = run(&argv) else {
                if !awaited {
                    failures.push(format!("{argv:?}: still running after {LIMIT:?} (hangs)"));
                }
                continue;
            };
            if awaited {
                failures.push(format!(
                    "{argv:?}: no longer hangs: remove it from AWAITING"
                ));
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            let code = out.status.code();
            // A FIFO given as a file, as a directory (a checkpoint, a run, an output
            // directory) or as an output's parent is named as what it is, never left to
            // the system's "File exists" or "Not a directory".
            let named = stderr.contains("FIFO");
            if out.status.success() || !named || stderr.lines().count() != 1 {
                failures.push(format!("{argv:?}: exit {code:?}, stderr {stderr:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A model directory whose shard is a FIFO, or a symlink to one (the Hugging Face cache
/// links every shard): every command that reads the model refuses it at once.
#[test]
fn a_fifo_shard_of_a_model_directory_is_refused_without_hanging() {
    let d = tmp();
    for how in ["fifo", "link"] {
        let m = d.path().join(how);
        fs::create_dir(&m).unwrap();
        for e in fs::read_dir(fixture("models/llama-sharded")).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), m.join(e.file_name())).unwrap();
        }
        let shard = m.join("model-00002-of-00003.safetensors");
        fs::remove_file(&shard).unwrap();
        if how == "fifo" {
            mkfifo(&shard);
        } else {
            mkfifo(&d.path().join("elsewhere"));
            std::os::unix::fs::symlink(d.path().join("elsewhere"), &shard).unwrap();
        }
        let m = m.to_string_lossy().into_owned();
        let index = format!("{m}/model.safetensors.index.json");
        let out = |n: &str| {
            d.path()
                .join(format!("{how}-{n}"))
                .to_string_lossy()
                .into_owned()
        };
        let cases: Vec<Vec<String>> = vec![
            vec!["st".into(), "verify".into(), m.clone()],
            vec!["st".into(), "inspect".into(), m.clone()],
            vec![
                "st".into(),
                "inspect".into(),
                "--stats".into(),
                index.clone(),
            ],
            vec!["st".into(), "diff".into(), m.clone(), index.clone()],
            vec![
                "st".into(),
                "convert".into(),
                m.clone(),
                "-o".into(),
                out("c"),
                "--dtype".into(),
                "bf16".into(),
            ],
            vec![
                "st".into(),
                "quantize".into(),
                m.clone(),
                "-o".into(),
                out("q"),
                "--int4".into(),
            ],
            vec![
                "st".into(),
                "dequantize".into(),
                index.clone(),
                "-o".into(),
                out("d"),
            ],
        ];
        for argv in cases {
            let out = run(&argv).unwrap_or_else(|| panic!("{argv:?} hangs"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{argv:?}");
            assert!(
                stderr.contains("not a regular file but a FIFO"),
                "{argv:?}: {stderr}"
            );
            assert!(
                stderr.contains("model-00002-of-00003.safetensors"),
                "{argv:?}: {stderr}"
            );
        }
    }
}

#[test]
fn a_closed_standard_input_is_refused_not_packed() {
    let d = tmp();
    let bin = assert_cmd::cargo::cargo_bin("tlio");
    for from in [&[][..], &["--from", "u16le", "--vocab-size", "10"][..]] {
        let out = std::process::Command::new("sh")
            .current_dir(d.path())
            .arg("-c")
            .arg("exec \"$0\" \"$@\" <&-")
            .arg(&bin)
            .args(["tokens", "pack", "-", "-o", "t.bin"])
            .args(from)
            .output()
            .unwrap();
        assert_one_error_line(&out, 2, "closed standard input");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("standard input is closed"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!d.path().join("t.bin").exists());
    }
}
