//! Issue 21's tokenizer and memory reproducers: no crate's panic text reaches the
//! user, o200k packs long whitespace runs, a tokenizer.json neither pads nor
//! truncates a packed document, and one huge word is refused within bounded memory.

use std::path::{Path, PathBuf};

use super::{fixture, tlio, tmp};

/// Run; returns (exit code, stderr), after checking no panic text was printed.
fn run(cmd: &mut assert_cmd::Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
    (out.status.code(), err)
}

/// The ids of a version-1 or -2 shard (u16 or u32 by the version word).
fn ids(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    let wide = bytes[4] != 1;
    let body = &bytes[1024..];
    if wide {
        body.chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    } else {
        body.chunks(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    }
}

fn pack(input: &Path, tokenizer: &str, out: &Path) -> assert_cmd::Command {
    let mut cmd = tlio();
    cmd.args(["tokens", "pack", "--from", "text", "--tokenizer", tokenizer])
        .arg(input)
        .arg("-o")
        .arg(out);
    cmd
}

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
fn an_uncaught_panic_is_one_error_line_without_the_hook_text() {
    // The failpoint crate's `panic` action is a panic no core call catches.
    let dir = tmp();
    let shard = dir.path().join("s.bin");
    let input = dir.path().join("t.txt");
    std::fs::write(&input, "abcabcabcabcabcabcabcabcabcabcabcabc").unwrap();
    let (code, err) = run(tlio()
        .args(["tokens", "pack"])
        .arg(&input)
        .arg("-o")
        .arg(&shard));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run(tlio()
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
        .arg(&shard));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tlio: error: internal error"), "{err}");
    assert!(err.contains("boom"), "{err}");
}

/// A skippable zstd frame (RFC 8878) of `len` bytes.
fn skippable(len: u32) -> Vec<u8> {
    let mut v = 0x184D_2A50u32.to_le_bytes().to_vec();
    v.extend(len.to_le_bytes());
    v.extend(std::iter::repeat_n(7u8, len as usize));
    v
}

#[test]
fn a_zstd_stream_with_skippable_frames_decodes_as_zstd_dc_does() {
    let dir = tmp();
    let frame = |t: &str| {
        ruzstd::encoding::compress_to_vec(t.as_bytes(), ruzstd::encoding::CompressionLevel::Fastest)
    };
    let mut bytes = skippable(8);
    bytes.extend(frame("hello "));
    bytes.extend(skippable(0));
    bytes.extend(frame("world"));
    bytes.extend(skippable(3));
    let input = dir.path().join("s.txt.zst");
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("s.bin");
    let (code, err) = run(&mut pack(&input, "gpt2", &out));
    assert_eq!(code, Some(0), "{err}");
    // The end-of-text, then "hello world" exactly as gpt2 encodes it.
    assert_eq!(ids(&out), [50256, 31373, 995]);
}

#[test]
fn corrupt_or_truncated_gzip_and_zstd_are_bad_data_in_one_readable_line() {
    let dir = tmp();
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, "hello world ".repeat(100).as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let zst = ruzstd::encoding::compress_to_vec(
        "hello world ".repeat(100).as_bytes(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("trunc.txt.gz", gz.get(..20).unwrap().to_vec()),
        ("bad.txt.gz", b"garbage garbage".to_vec()),
        ("trunc.txt.zst", zst.get(..10).unwrap().to_vec()),
        ("short.txt.zst", zst.get(..3).unwrap().to_vec()),
        ("empty.txt.zst", Vec::new()),
        ("bad.txt.zst", b"garbage garbage".to_vec()),
        ("skip.txt.zst", skippable(100).get(..50).unwrap().to_vec()),
    ];
    for (name, bytes) in cases {
        let input = dir.path().join(name);
        std::fs::write(&input, bytes).unwrap();
        let out = dir.path().join("o.bin");
        let (code, err) = run(&mut pack(&input, "gpt2", &out));
        assert_eq!(code, Some(1), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("not valid"),
            "{name}: {err}"
        );
        for debug in ["Error {", "kind:", "MagicNumber", "SkipFrame", "(Error"] {
            assert!(!err.contains(debug), "{name}: {err}");
        }
        assert!(!out.exists(), "{name}");
    }
}
