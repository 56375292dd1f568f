//! The JSON shapes documented in docs/cli.md ("JSON output, command by command") hold:
//! every command that reports is run with `--json`, and every line it prints must match
//! one of the templates documented for it; every template must be matched by some run,
//! and every leaf command is either documented or known to print no JSON.

use crate::{fixture, leaf_commands, tlio, tmp};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

/// Leaf commands that print no JSON document of their own.
const NOT_JSON: &[&str] = &["generate completions"];

/// The documented templates, by command (`"st inspect"` → its blocks).
fn documented() -> BTreeMap<String, Vec<Value>> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md")).unwrap();
    let start = text
        .find("## JSON output, command by command")
        .expect("docs/cli.md has the JSON section");
    let section = &text[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut shapes: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut command: Option<String> = None;
    let mut block: Option<String> = None;
    for line in section[..end].lines() {
        if let Some(b) = block.as_mut() {
            if line == "```" {
                let name = command.clone().expect("a block under a command heading");
                let shape = serde_json::from_str(b)
                    .unwrap_or_else(|e| panic!("docs/cli.md: {name}: not JSON: {e}\n{b}"));
                shapes.entry(name).or_default().push(shape);
                block = None;
            } else {
                b.push_str(line);
                b.push('\n');
            }
        } else if let Some(h) = line.strip_prefix("### `") {
            command = Some(h.trim_end_matches('`').to_string());
        } else if line == "```json" {
            block = Some(String::new());
        }
    }
    shapes
}

/// Whether `v` matches template `t`; the error names the path of the first mismatch.
fn matches(t: &Value, v: &Value, at: &str) -> Result<(), String> {
    match t {
        Value::String(types) => {
            let ok = types.split('|').any(|ty| match ty {
                "string" => v.is_string(),
                "integer" => v.is_u64() || v.is_i64(),
                "number" => v.is_number(),
                "boolean" => v.is_boolean(),
                "null" => v.is_null(),
                "any" => true,
                other => panic!("docs/cli.md: unknown type {other:?} at {at}"),
            });
            if ok {
                Ok(())
            } else {
                Err(format!("{at}: {v} is not {types}"))
            }
        }
        Value::Array(elems) => {
            let elem = elems.first().expect("an array template has one element");
            let Some(items) = v.as_array() else {
                return Err(format!("{at}: {v} is not an array"));
            };
            for (i, item) in items.iter().enumerate() {
                matches(elem, item, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        Value::Object(keys) => {
            let Some(obj) = v.as_object() else {
                return Err(format!("{at}: {v} is not an object"));
            };
            if let Some(each) = keys.get("*") {
                for (k, item) in obj {
                    matches(each, item, &format!("{at}.{k}"))?;
                }
                return Ok(());
            }
            let mut listed = Vec::new();
            for (key, sub) in keys {
                let (name, optional) = match key.strip_suffix('?') {
                    Some(n) => (n, true),
                    None => (key.as_str(), false),
                };
                listed.push(name);
                match obj.get(name) {
                    Some(item) => matches(sub, item, &format!("{at}.{name}"))?,
                    None if optional => {}
                    None => return Err(format!("{at}: key {name:?} is missing")),
                }
            }
            match obj.keys().find(|k| !listed.contains(&k.as_str())) {
                Some(extra) => Err(format!("{at}: key {extra:?} is not documented")),
                None => Ok(()),
            }
        }
        _ => panic!("docs/cli.md: a template holds only strings, arrays and objects ({at})"),
    }
}

fn os(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

/// The runs whose output is checked: (command, arguments after `--json`), in an order
/// where later runs may use what earlier ones wrote in `dir`.
fn runs(dir: &Path) -> Vec<(&'static str, Vec<OsString>)> {
    let golden = |n: &str| fixture(&format!("safetensors/golden/{n}.safetensors"));
    let models = |n: &str| fixture(&format!("models/{n}"));
    let f32s = golden("dtype_F32");
    let shard = dir.join("s.bin");
    let gpt2 = dir.join("g.bin");
    let q = dir.join("q.safetensors");
    let mix_a = format!("{}:0.5", shard.display());
    let (sharded_step, _, _) = crate::sharded::sharded_step(&dir.join("sharded"), 3);
    vec![
        ("st inspect", os(&[&"st", &"inspect", &sharded_step])),
        (
            "st inspect",
            os(&[
                &"st",
                &"inspect",
                &golden("mixed_f32_i32_u8"),
                &models("llama-sharded"),
            ]),
        ),
        (
            "st inspect",
            os(&[
                &"st",
                &"inspect",
                &"--stats",
                &f32s,
                &golden("dtype_I64"),
                &golden("dtype_F4"),
            ]),
        ),
        (
            "st verify",
            os(&[&"st", &"verify", &f32s, &models("llama-sharded")]),
        ),
        (
            "st verify",
            os(&[&"st", &"verify", &fixture("cli/README.md")]),
        ),
        (
            "st diff",
            os(&[&"st", &"diff", &f32s, &golden("dtype_BF16")]),
        ),
        (
            "st diff",
            os(&[
                &"st",
                &"diff",
                &golden("metadata_one"),
                &golden("metadata_none"),
            ]),
        ),
        ("st diff", os(&[&"st", &"diff", &f32s, &f32s])),
        (
            "st convert",
            os(&[
                &"st",
                &"convert",
                &f32s,
                &"-o",
                &dir.join("c.safetensors"),
                &"--dtype",
                &"bf16",
            ]),
        ),
        (
            "st convert",
            os(&[
                &"st",
                &"convert",
                &models("llama-sharded"),
                &"-o",
                &dir.join("conv"),
                &"--dtype",
                &"bf16",
            ]),
        ),
        (
            "st quantize",
            os(&[
                &"st",
                &"quantize",
                &models("llama-single/model.safetensors"),
                &"-o",
                &q,
                &"--int4",
            ]),
        ),
        (
            "st dequantize",
            os(&[&"st", &"dequantize", &q, &"-o", &dir.join("dq.safetensors")]),
        ),
        (
            "ckpt save",
            os(&[
                &"ckpt",
                &"save",
                &dir.join("ck"),
                &"--step",
                &"5",
                &"--model",
                &f32s,
                &"--tokens-seen",
                &"10",
                &"--lr",
                &"0.1",
            ]),
        ),
        (
            "ckpt verify",
            os(&[&"ckpt", &"verify", &fixture("cli/ckpt-corrupt")]),
        ),
        (
            "ckpt verify",
            os(&[&"ckpt", &"verify", &dir.join("ck/step-000005")]),
        ),
        (
            "ckpt export",
            os(&[
                &"ckpt",
                &"export",
                &dir.join("ck/step-000005"),
                &"-o",
                &dir.join("exported"),
            ]),
        ),
        (
            "ckpt latest",
            os(&[&"ckpt", &"latest", &fixture("cli/ckpt-corrupt")]),
        ),
        (
            "ckpt import",
            os(&[
                &"ckpt",
                &"import",
                &crate::dcp_import::dcp_checkpoint(dir),
                &"-o",
                &dir.join("imported"),
            ]),
        ),
        (
            "ckpt gc",
            os(&[
                &"ckpt",
                &"gc",
                &fixture("cli/ckpt"),
                &"--keep",
                &"1",
                &"--dry-run",
            ]),
        ),
        (
            "tokens header",
            os(&[
                &"tokens",
                &"header",
                &fixture("cli/tiny.bin"),
                &fixture("cli/truncated.bin"),
                &fixture("cli/README.md"),
            ]),
        ),
        (
            "tokens pack",
            os(&[&"tokens", &"pack", &fixture("cli/README.md"), &"-o", &shard]),
        ),
        (
            "tokens pack",
            os(&[
                &"tokens",
                &"pack",
                &fixture("cli/README.md"),
                &"-o",
                &dir.join("parted.bin"),
                &"--part",
                &"0/1",
            ]),
        ),
        (
            "tokens merge",
            os(&[&"tokens", &"merge", &dir.join("parted.bin")]),
        ),
        (
            "tokens pack",
            os(&[
                &"tokens",
                &"pack",
                &fixture("cli/README.md"),
                &"--from",
                &"text",
                &"--tokenizer",
                &"gpt2",
                &"-o",
                &gpt2,
            ]),
        ),
        (
            "tokens windows",
            os(&[
                &"tokens",
                &"windows",
                &shard,
                &"--seq-len",
                &"4",
                &"--batch",
                &"2",
                &"--batches",
                &"2",
            ]),
        ),
        (
            "tokens windows",
            os(&[
                &"tokens",
                &"windows",
                &"--mix",
                &mix_a,
                &"--mix",
                &mix_a,
                &"--seq-len",
                &"4",
                &"--batch",
                &"2",
            ]),
        ),
        (
            "tokens windows",
            os(&[
                &"tokens",
                &"windows",
                &"--report",
                &"--mix",
                &mix_a,
                &"--mix",
                &mix_a,
                &"--seq-len",
                &"4",
                &"--batch",
                &"2",
                &"--batches",
                &"3",
            ]),
        ),
        (
            "tokens decode",
            os(&[
                &"tokens",
                &"decode",
                &gpt2,
                &"--tokenizer",
                &"gpt2",
                &"--count",
                &"5",
            ]),
        ),
        (
            "train bigram",
            os(&[
                &"train",
                &"bigram",
                &shard,
                &"-o",
                &dir.join("run"),
                &"--max-steps",
                &"3",
                &"--batch",
                &"2",
                &"--seq-len",
                &"8",
            ]),
        ),
        ("demo", os(&[&"demo"])),
        ("demo", os(&[&"demo", &"-o", &dir.join("demo")])),
        (
            "generate man",
            os(&[&"generate", &"man", &"-o", &dir.join("man")]),
        ),
    ]
}

#[test]
fn every_json_document_matches_its_documented_shape() {
    let shapes = documented();
    let dir = tmp();
    let mut used: BTreeMap<(String, usize), usize> = BTreeMap::new();
    for (command, args) in runs(dir.path()) {
        let templates = shapes
            .get(command)
            .unwrap_or_else(|| panic!("docs/cli.md documents no JSON for {command}"));
        let out = tlio()
            .env("TLIO_PYTHON", crate::s3::python())
            .arg("--json")
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout.clone()).unwrap();
        assert!(!text.is_empty(), "{args:?} printed nothing: {out:?}");
        for line in text.lines() {
            let value: Value = serde_json::from_str(line).unwrap();
            let verdicts: Vec<_> = templates
                .iter()
                .map(|t| matches(t, &value, command))
                .collect();
            match verdicts.iter().position(Result::is_ok) {
                Some(i) => *used.entry((command.to_string(), i)).or_default() += 1,
                None => {
                    panic!("{args:?}: the output matches no documented shape: {verdicts:?}\n{line}")
                }
            }
        }
    }
    for (command, templates) in &shapes {
        for i in 0..templates.len() {
            assert!(
                used.contains_key(&(command.clone(), i)),
                "docs/cli.md: shape {i} of {command} is matched by no run of this test"
            );
        }
    }
    for leaf in leaf_commands() {
        let name = leaf.join(" ");
        assert!(
            shapes.contains_key(&name) || NOT_JSON.contains(&name.as_str()),
            "docs/cli.md documents no JSON shape for {name}"
        );
    }
}

#[test]
fn the_shape_checker_rejects_what_it_should() {
    let t: Value =
        serde_json::from_str(r#"{"a": "integer", "b?": ["string|null"], "m": {"*": "any"}}"#)
            .unwrap();
    let ok = |s: &str| matches(&t, &serde_json::from_str(s).unwrap(), "x");
    assert!(ok(r#"{"a": 1, "m": {}}"#).is_ok());
    assert!(ok(r#"{"a": 1, "b": ["s", null], "m": {"k": [1]}}"#).is_ok());
    assert!(
        ok(r#"{"a": 1.5, "m": {}}"#).is_err(),
        "a float is not an integer"
    );
    assert!(ok(r#"{"m": {}}"#).is_err(), "a missing key");
    assert!(
        ok(r#"{"a": 1, "m": {}, "c": 0}"#).is_err(),
        "an undocumented key"
    );
    assert!(
        ok(r#"{"a": 1, "b": [1], "m": {}}"#).is_err(),
        "a wrong element type"
    );
}
