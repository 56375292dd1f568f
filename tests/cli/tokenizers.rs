//! Packing text through tokenizers: o200k packs long whitespace runs, one huge word and
//! an over-long document are refused with their limits, a tokenizer.json's padding and
//! truncation never apply to packing, a normalizer the library panics on is one error
//! line, and a JSONL line that repeats its field packs the last value.

use std::fs;
use std::path::{Path, PathBuf};

use super::{fixture, pack_text as pack, run_without_panic as run, shard_ids as ids, tlio, tmp};

#[test]
fn o200k_packs_a_million_spaces_tabs_or_no_break_spaces() {
    let dir = tmp();
    for (name, ws) in [("sp", " "), ("tab", "\t"), ("nbsp", "\u{a0}")] {
        let input = dir.path().join(format!("{name}.txt"));
        std::fs::write(&input, ws.repeat(1_000_000)).unwrap();
        let out = dir.path().join(format!("{name}.bin"));
        let (code, err) = run(pack(&input, "o200k_base", &out).arg("--threads").arg("1"));
        assert_eq!(code, Some(0), "{name}: {err}");
        // The end-of-text, then the run decodes back to itself.
        let got = ids(&out);
        assert_eq!(got.first(), Some(&199_999), "{name}");
        let text = tlio()
            .args([
                "tokens",
                "decode",
                "--tokenizer",
                "o200k_base",
                "--start",
                "1",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(text.status.success(), "{name}");
        let text = String::from_utf8(text.stdout).unwrap();
        assert_eq!(text.trim_end_matches('\n'), ws.repeat(1_000_000), "{name}");
    }
}

#[test]
fn one_huge_word_is_refused_with_its_limit_not_an_abort() {
    let dir = tmp();
    let input = dir.path().join("a.txt");
    std::fs::write(&input, "a".repeat(5 << 20)).unwrap();
    // A tokenizer.json's pieces are its pre-tokenizer's: one run of a letter under
    // ByteLevel's regex, the whole document when it has no pre-tokenizer at all (here
    // 5 MiB of short words, which every other tokenizer splits).
    let json = fixture("tokenizers").join("bpe_small.json");
    let bare = edited_tokenizer(dir.path(), "bare.json", &|j| {
        j["pre_tokenizer"] = serde_json::Value::Null;
    });
    let words = dir.path().join("words.txt");
    std::fs::write(&words, "ab cd ".repeat(1 << 20)).unwrap();
    let cases = [
        (&input, "gpt2"),
        (&input, "cl100k_base"),
        (&input, "o200k_base"),
        (&input, json.to_str().unwrap()),
        (&words, bare.to_str().unwrap()),
    ];
    for (input, tokenizer) in cases {
        let out = dir.path().join("a.bin");
        let (code, err) = run(pack(input, tokenizer, &out).args(["--eot", "none"]));
        assert_eq!(code, Some(1), "{tokenizer}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("pre-token") && err.contains("4194304"),
            "{err}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn a_tokenizer_json_refuses_a_document_over_its_limit_naming_it() {
    // 9 MiB of short words: every piece is small, but the library would hold ~1 GB.
    let dir = tmp();
    let input = dir.path().join("w.txt");
    std::fs::write(&input, "ab cd ".repeat((9 << 20) / 6)).unwrap();
    let json = fixture("tokenizers").join("bpe_small.json");
    let out = dir.path().join("w.bin");
    let (code, err) = run(pack(&input, json.to_str().unwrap(), &out).args(["--eot", "none"]));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("8388608") && err.contains("split the document"),
        "{err}"
    );
    assert!(!out.exists());
}

/// bpe_small.json with `edit` applied to its top-level object.
fn edited_tokenizer(dir: &Path, name: &str, edit: &dyn Fn(&mut serde_json::Value)) -> PathBuf {
    let bytes = std::fs::read(fixture("tokenizers").join("bpe_small.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    edit(&mut json);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    path
}

#[test]
fn a_precompiled_normalizer_the_library_panics_on_is_one_error_line() {
    let dir = tmp();
    let tok = edited_tokenizer(dir.path(), "pre.json", &|j| {
        j["normalizer"] =
            serde_json::json!({"type": "Precompiled", "precompiled_charsmap": "AAAA"});
    });
    let input = dir.path().join("t.txt");
    std::fs::write(&input, "hello").unwrap();
    let out = dir.path().join("t.bin");
    let (code, err) = run(pack(&input, tok.to_str().unwrap(), &out).args(["--eot", "none"]));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tlio: error: ") && err.contains("pre.json"),
        "{err}"
    );
}

#[test]
fn padding_and_truncation_of_a_tokenizer_json_do_not_apply_to_packing() {
    let dir = tmp();
    let input = dir.path().join("t.txt");
    std::fs::write(&input, "hello world, hello tokens and more words").unwrap();
    let plain = edited_tokenizer(dir.path(), "plain.json", &|_| {});
    let want_out = dir.path().join("plain.bin");
    let (code, err) = run(pack(&input, plain.to_str().unwrap(), &want_out).args(["--eot", "none"]));
    assert_eq!(code, Some(0), "{err}");
    let want = ids(&want_out);
    assert!(want.len() > 3, "{want:?}");
    let padding = |strategy: serde_json::Value, multiple: serde_json::Value| {
        serde_json::json!({"strategy": strategy, "direction": "Right",
            "pad_to_multiple_of": multiple, "pad_id": 0, "pad_type_id": 0, "pad_token": "a"})
    };
    let cases = [
        (
            "fixed",
            padding(
                serde_json::json!({"Fixed": 100_000_000}),
                serde_json::Value::Null,
            ),
            serde_json::Value::Null,
        ),
        (
            "multiple",
            padding(
                serde_json::json!("BatchLongest"),
                serde_json::json!(10_000_000),
            ),
            serde_json::Value::Null,
        ),
        (
            "trunc",
            serde_json::Value::Null,
            serde_json::json!({"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0}),
        ),
    ];
    for (name, pad, trunc) in cases {
        let tok = edited_tokenizer(dir.path(), &format!("{name}.json"), &|j| {
            j["padding"] = pad.clone();
            j["truncation"] = trunc.clone();
        });
        let out = dir.path().join(format!("{name}.bin"));
        let (code, err) = run(pack(&input, tok.to_str().unwrap(), &out).args(["--eot", "none"]));
        assert_eq!(code, Some(0), "{name}: {err}");
        assert_eq!(ids(&out), want, "{name}");
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
