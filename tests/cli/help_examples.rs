//! Every example at the end of a command's `--help` (and so in its man page's
//! EXAMPLES) runs as written: each line after `Examples:` is run by `sh`, in order, in
//! a scratch directory holding the inputs the examples name (`corpus.bin`,
//! `model.safetensors`, `run/ckpt`, ...), and must exit 0. An example that cannot run
//! here is listed in [`NOT_RUN`] with its reason; a listed example that no help shows
//! any more is an error too, so the list stays true.
//!
//! How the inputs are made: [`INPUTS`] is one shell script run once with `tlio` first
//! on PATH and `$ROOT` the checkout; each command's examples then run in a fresh copy
//! of that directory (one command's outputs never meet another's), after the
//! command's own few lines of [`extra_setup`], with `HOME` inside the copy.

use std::path::Path;
use std::process::Command;

use super::{command_paths, tmp};

/// The examples that do not run here, each with its reason.
const NOT_RUN: [(&str, &str); 2] = [
    (
        "tlio ckpt import outputs/checkpoint/step-1000 -o run/ckpt",
        "needs a PyTorch DCP checkpoint and torch; tests/cli/dcp_import.rs imports real ones",
    ),
    (
        "TLIO_PYTHON=.venv/bin/python tlio ckpt import dcp_ckpt -o run/ckpt --step 1000",
        "needs a PyTorch DCP checkpoint and torch; tests/cli/dcp_import.rs imports real ones",
    ),
];

/// The inputs every example may name, made once.
const INPUTS: &str = r#"set -e
cp "$ROOT/assets/demo_corpus.txt" corpus.txt
tlio -q tokens pack corpus.txt -o corpus.bin
printf '464 2068 7586 21831 50256 314 716\n' > ids.txt
tlio -q tokens pack corpus.txt -o train.bin --shard-tokens 40000
M="$ROOT/fixtures/models"
for name in model a b before after; do cp "$M/llama-single/model.safetensors" "$name.safetensors"; done
mkdir -p path/to
cp -R "$M/llama-sharded" path/to/model-dir
cp -R "$M/llama-sharded" model_dir
cp "$M"/llama-sharded/model-0000*.safetensors "$M/llama-sharded/model.safetensors.index.json" .
cp "$ROOT/fixtures/safetensors/golden/worked_example_f32.safetensors" optim.safetensors
tlio -q st quantize model.safetensors -o model-int4.safetensors --int4
tlio -q st quantize path/to/model-dir -o model-dir-int4 --int4
tlio -q st quantize model.safetensors -o model-mxfp8.safetensors --mx fp8
mkdir -p web code
for d in web code; do cp corpus.bin $d/a.bin; cp corpus.bin $d.bin; done
zstd -q "$ROOT/fixtures/tokenizers/corpus.jsonl" -o docs.jsonl.zst
tlio -q tokens pack docs.jsonl.zst --from jsonl --tokenizer gpt2 --val-tokens 4000 -o fw
cp "$ROOT/fixtures/tokenizers/corpus.parquet" t.parquet
cp "$ROOT/fixtures/tokenizers/bpe_small.json" tok.json
tlio -q tokens pack t.parquet --from parquet --tokenizer tok.json --eot none --skip-bad -o ll.bin
tlio -q train bigram corpus.bin -o run --max-steps 500 --ckpt-every 100 > /dev/null
cp run/ckpt/step-000500/trainer_state.json trainer_state.json
mkdir -p home/.local/share/bash-completion/completions home/.zfunc home/.config/fish/completions
"#;

/// Lines run before one command's examples, for inputs that would be in another
/// command's way (`tokens merge` needs parts, not the shards of a finished pack).
fn extra_setup(path: &[String]) -> &'static str {
    match path.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["tokens", "merge"] => {
            "set -e\nrm -f fw_* corpus.bin\n\
             tlio -q tokens pack docs.jsonl.zst --from jsonl --tokenizer gpt2 --val-tokens 4000 -o fw --part 0/2\n\
             tlio -q tokens pack docs.jsonl.zst --from jsonl --tokenizer gpt2 --val-tokens 4000 -o fw --part 1/2\n\
             tlio -q tokens pack corpus.txt -o corpus.bin --part 0/1\n"
        }
        // `ckpt save` starts a checkpoint directory of its own, from the files of a
        // run's step 300 (an optimizer file holds its `state` metadata, a trainer
        // state names its step).
        ["ckpt", "save"] => {
            "set -e\nrm -rf ckpt\n\
             tlio -q train bigram corpus.bin -o run3 --max-steps 300 --ckpt-every 300 > /dev/null\n\
             cp run3/ckpt/step-000300/model.safetensors model.safetensors\n\
             cp run3/ckpt/step-000300/optimizer.safetensors optim.safetensors\n\
             cp run3/ckpt/step-000300/trainer_state.json trainer_state.json\n"
        }
        // A training example starts the run `run` itself.
        [] | ["train"] | ["train", "bigram"] => "rm -rf run\n",
        // The quantize examples write what the inputs hold quantized already.
        ["st", "quantize"] => "rm -rf model-dir-int4 model-int4.safetensors model-mxfp8.safetensors\n",
        _ => "",
    }
}

/// The lines after `Examples:` in `tlio PATH --help`, trimmed.
fn examples(path: &[String]) -> Vec<String> {
    let out = super::tlio().args(path).arg("--help").output().unwrap();
    assert!(out.status.success(), "{path:?} --help: {out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    let (_, tail) = help
        .rsplit_once("\nExamples:\n")
        .unwrap_or_else(|| panic!("{path:?}: no Examples section"));
    tail.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// `sh -c SCRIPT` in `dir` with tlio first on PATH, `ROOT` the checkout and `HOME` at
/// `home`; the exit code and the output.
fn sh(script: &str, dir: &Path, home: &Path) -> (Option<i32>, String) {
    let bin = assert_cmd::cargo::cargo_bin("tlio");
    let bin_dir = bin.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path)
        .env("ROOT", env!("CARGO_MANIFEST_DIR"))
        .env("HOME", home)
        .env_remove("FAILPOINTS")
        .env_remove("TLIO_PYTHON")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn every_help_example_runs_as_written() {
    let scratch = tmp();
    let base = scratch.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let (code, text) = sh(INPUTS, &base, &base.join("home"));
    assert_eq!(code, Some(0), "making the examples' inputs failed:\n{text}");
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut listed_seen = Vec::new();
    for (k, path) in command_paths().into_iter().enumerate() {
        let dir = scratch.path().join(format!("cmd{k}"));
        let copy = format!("cp -R '{}' '{}'", base.display(), dir.display());
        let (code, text) = sh(&copy, scratch.path(), scratch.path());
        assert_eq!(code, Some(0), "{copy}: {text}");
        let (code, text) = sh(extra_setup(&path), &dir, &dir.join("home"));
        assert_eq!(code, Some(0), "setup of {path:?}: {text}");
        for example in examples(&path) {
            if NOT_RUN.iter().any(|(e, _)| *e == example) {
                listed_seen.push(example);
                continue;
            }
            let (code, text) = sh(&example, &dir, &dir.join("home"));
            ran += 1;
            if code != Some(0) {
                failures.push(format!(
                    "tlio {} --help: `{example}` exited {code:?}:\n{text}",
                    path.join(" ")
                ));
            }
        }
    }
    for (example, _) in NOT_RUN {
        assert!(
            listed_seen.iter().any(|e| e == example),
            "NOT_RUN lists `{example}`, which no --help shows any more"
        );
    }
    assert!(ran >= 50, "only {ran} examples ran");
    assert!(
        failures.is_empty(),
        "{} of {ran} help examples fail as written:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}
