//! Reproducers of issue 21 item 14: repeated keys in config.json (refused, named), a
//! repeated JSONL field (the last wins, as documented), a closed standard input
//! (refused), and a model named by its index (its directory's other files copied).

use std::fs;
use std::path::{Path, PathBuf};

use crate::errors::assert_one_error_line;
use crate::{fixture, tlio, tmp};

/// A copy of the sharded llama fixture at `dir/name`.
fn sharded(dir: &Path, name: &str) -> PathBuf {
    let m = dir.join(name);
    fs::create_dir(&m).unwrap();
    for e in fs::read_dir(fixture("models/llama-sharded")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), m.join(e.file_name())).unwrap();
    }
    m
}

#[test]
fn a_config_json_with_a_repeated_key_is_refused_naming_the_key_and_the_file() {
    let d = tmp();
    let m = sharded(d.path(), "m");
    let config = fs::read_to_string(m.join("config.json")).unwrap();
    let twice = config.replacen('{', "{\"num_hidden_layers\": 9,", 1);
    assert_ne!(twice, config);
    fs::write(m.join("config.json"), twice).unwrap();
    let out = tlio().args(["st", "verify"]).arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("config.json") && all.contains("duplicate key \"num_hidden_layers\""),
        "{all}"
    );
    let out = tlio()
        .args(["-q", "st", "convert"])
        .arg(&m)
        .arg("-o")
        .arg(d.path().join("o"))
        .args(["--dtype", "bf16"])
        .output()
        .unwrap();
    assert_one_error_line(&out, 1, "convert of a config with a repeated key");
    assert!(!d.path().join("o").exists());
}

#[test]
fn a_model_named_by_its_index_copies_generation_config_json_as_its_directory_does() {
    let d = tmp();
    let m = sharded(d.path(), "m");
    let o = d.path().join("o");
    tlio()
        .args(["-q", "st", "convert"])
        .arg(m.join("model.safetensors.index.json"))
        .arg("-o")
        .arg(&o)
        .args(["--dtype", "bf16"])
        .assert()
        .success();
    assert_eq!(
        fs::read(o.join("generation_config.json")).unwrap(),
        fs::read(m.join("generation_config.json")).unwrap()
    );
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

#[test]
fn a_jsonl_line_that_repeats_the_field_packs_its_last_value() {
    let d = tmp();
    fs::write(
        d.path().join("two.jsonl"),
        "{\"text\":\"first\",\"text\":\"last one\"}\n",
    )
    .unwrap();
    fs::write(d.path().join("one.jsonl"), "{\"text\":\"last one\"}\n").unwrap();
    for name in ["two", "one"] {
        tlio()
            .current_dir(d.path())
            .args(["-q", "tokens", "pack"])
            .arg(format!("{name}.jsonl"))
            .args(["--from", "jsonl", "--tokenizer", "gpt2", "-o"])
            .arg(format!("{name}.bin"))
            .assert()
            .success();
    }
    assert_eq!(
        fs::read(d.path().join("two.bin")).unwrap(),
        fs::read(d.path().join("one.bin")).unwrap()
    );
}
