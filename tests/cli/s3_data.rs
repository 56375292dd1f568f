//! Token shards and safetensors files on object storage, against the local S3 server of
//! `s3.rs`: `tokens windows` over `s3://` shards (listed, by pattern, through a pack's
//! manifest, resumed from a cursor) prints what it prints over local copies;
//! `tokens pack -o s3://` uploads the bytes a local pack writes, with its manifest last,
//! and never replaces objects; `st verify` of an object gives a local verify's verdicts
//! (reader rules, canonical bytes, finite values streamed).

use std::path::{Path, PathBuf};

use super::s3::{ask, bucket, stdout_of, tlio_s3};
use super::tlio;

/// Deterministic bytes for packing (a 32-bit LCG's high bytes).
fn corpus(len: usize) -> Vec<u8> {
    let mut x: u32 = 12345;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 24) as u8
        })
        .collect()
}

/// `tlio tokens pack` of `input` (bytes) into `out` with `--shard-tokens n`: the shard
/// paths written, in order.
fn pack_local(input: &Path, out: &Path, n: u32) -> Vec<PathBuf> {
    let text = stdout_of(
        tlio()
            .args([
                "--json",
                "tokens",
                "pack",
                "--shard-tokens",
                &n.to_string(),
                "-o",
            ])
            .arg(out)
            .arg(input),
    );
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| PathBuf::from(s["file"].as_str().unwrap()))
        .collect()
}

fn upload_all(b: &str, prefix: &str, files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            let name = f.file_name().unwrap().to_str().unwrap();
            ask(&format!("put {b} {prefix}/{name} {}", f.display()));
            format!("s3://{b}/{prefix}/{name}")
        })
        .collect()
}

/// `tokens windows` with T 7, B 3 and `extra`, through `cmd` (local or with the
/// server's environment and `cache` as the cache directory).
fn windows(
    mut cmd: assert_cmd::Command,
    cache: &Path,
    shards: &[String],
    extra: &[&str],
) -> String {
    cmd.env("TLIO_CACHE_DIR", cache)
        .args(["tokens", "windows", "--seq-len", "7", "--batch", "3"])
        .args(shards)
        .args(extra);
    stdout_of(&mut cmd)
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn windows_over_objects_print_the_local_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("corpus.bin");
    std::fs::write(&input, corpus(5000)).unwrap();
    let shards = pack_local(&input, &tmp.path().join("train"), 1800);
    assert_eq!(shards.len(), 3);
    let b = bucket();
    let urls = upload_all(&b, "data", &shards);
    let local: Vec<String> = shards.iter().map(|p| p.display().to_string()).collect();
    let cache = tmp.path().join("cache");
    let args = ["--seed", "7", "--batches", "300", "--shuffle"];
    let want = windows(tlio(), &cache, &local, &args);
    assert_eq!(want.lines().count(), 300);
    // Cold: each object fetched once into the cache; warm: read from it.
    let cold = windows(tlio_s3(), &cache, &urls, &args);
    assert_eq!(cold, want);
    assert_eq!(files_in(&cache.join("s3")), 3);
    let warm = windows(tlio_s3(), &cache, &urls, &args);
    assert_eq!(warm, want);
    assert_eq!(files_in(&cache.join("s3")), 3);
    // A pattern in the last segment lists the same shards in key order.
    let pattern = format!("s3://{b}/data/train_*.bin");
    assert_eq!(windows(tlio_s3(), &cache, &[pattern], &args), want);

    // Resumed from a cursor saved over objects: the local continuation.
    let cursor = tmp.path().join("cursor.json");
    let first = windows(
        tlio_s3(),
        &cache,
        &urls,
        &[
            "--seed",
            "7",
            "--batches",
            "120",
            "--shuffle",
            "--save-cursor",
            cursor.to_str().unwrap(),
        ],
    );
    let rest = windows(
        tlio_s3(),
        &cache,
        &urls,
        &[
            "--batches",
            "180",
            "--shuffle",
            "--cursor",
            cursor.to_str().unwrap(),
        ],
    );
    assert_eq!(format!("{first}{rest}"), want);
}

#[test]
fn a_damaged_cache_copy_is_fetched_again() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("corpus.bin");
    std::fs::write(&input, corpus(3000)).unwrap();
    let shards = pack_local(&input, &tmp.path().join("t"), 3000);
    let b = bucket();
    let urls = upload_all(&b, "d", &shards);
    let local = vec![shards[0].display().to_string()];
    let cache = tmp.path().join("cache");
    let args = ["--seed", "3", "--batches", "20"];
    let want = windows(tlio(), &cache, &local, &args);
    assert_eq!(windows(tlio_s3(), &cache, &urls, &args), want);
    let copy = std::fs::read_dir(cache.join("s3"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Truncated behind tlio's back: the size no longer matches, so it is fetched anew.
    let bytes = std::fs::read(&copy).unwrap();
    std::fs::write(&copy, &bytes[..bytes.len() - 2]).unwrap();
    assert_eq!(windows(tlio_s3(), &cache, &urls, &args), want);
    assert_eq!(std::fs::read(&copy).unwrap(), bytes);
}

#[test]
fn windows_over_missing_objects_name_the_url() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    for (url, says) in [
        (format!("s3://{b}/absent.bin"), "no such object"),
        (format!("s3://{b}/none_*.bin"), "no object matches"),
        (
            "s3://no-such-bucket-here/x.bin".to_string(),
            "no such bucket",
        ),
    ] {
        let out = tlio_s3()
            .env("TLIO_CACHE_DIR", tmp.path())
            .args(["tokens", "windows", "--seq-len", "4", "--batch", "2", &url])
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(err.contains(&url) && err.contains(says), "{url}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn pack_to_a_prefix_uploads_the_local_shards_and_a_manifest_last() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("corpus.bin");
    std::fs::write(&input, corpus(5000)).unwrap();
    let local = pack_local(&input, &tmp.path().join("train"), 1800);
    let b = bucket();
    let out = format!("s3://{b}/packed/train");
    let text = stdout_of(
        tlio_s3()
            .args([
                "--json",
                "tokens",
                "pack",
                "--shard-tokens",
                "1800",
                "-o",
                &out,
            ])
            .arg(&input),
    );
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["manifest"], format!("{out}.manifest.json").as_str());
    assert_eq!(doc["tokens"], 5000);
    let keys = ask(&format!("keys {b} packed/"));
    assert_eq!(
        keys,
        "packed/train.manifest.json packed/train_000000.bin packed/train_000001.bin packed/train_000002.bin"
    );
    // boto3 reads back the bytes a local pack wrote.
    for (i, path) in local.iter().enumerate() {
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            doc["shards"][i]["file"],
            format!("s3://{b}/packed/{name}").as_str()
        );
        let got = tmp.path().join(format!("got-{name}"));
        ask(&format!("get {b} packed/{name} {}", got.display()));
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(path).unwrap(),
            "{name}"
        );
    }
    let manifest = tmp.path().join("manifest.json");
    ask(&format!(
        "get {b} packed/train.manifest.json {}",
        manifest.display()
    ));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m["shards"].as_array().unwrap().len(), 3);
    assert_eq!(m["shards"][0]["name"], "train_000000.bin");
    assert_eq!(m["shards"][0]["n"], 1800);
    assert_eq!(m["shards"][2]["bytes"], 1024 + 2 * 1400);

    // Read through the manifest: the local batches.
    let cache = tmp.path().join("cache");
    let locals: Vec<String> = local.iter().map(|p| p.display().to_string()).collect();
    let args = ["--seed", "1", "--batches", "50"];
    assert_eq!(
        windows(tlio_s3(), &cache, &[format!("{out}.manifest.json")], &args),
        windows(tlio(), &cache, &locals, &args)
    );

    // A second pack to the same output refuses, naming an object, and changes nothing.
    let again = tlio_s3()
        .args(["tokens", "pack", "--shard-tokens", "100", "-o", &out])
        .arg(&input)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&again.get_output().stderr).to_string();
    assert!(
        err.contains(&format!("s3://{b}/packed/train")) && err.contains("already exists"),
        "{err}"
    );
    assert_eq!(ask(&format!("keys {b} packed/")), keys);
}

#[test]
fn a_failed_pack_to_storage_uploads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("ids.txt");
    std::fs::write(&bad, "1 2 3 999 4").unwrap();
    let b = bucket();
    let out = tlio_s3()
        .args([
            "tokens",
            "pack",
            "--from",
            "ids",
            "--vocab-size",
            "100",
            "-o",
        ])
        .arg(format!("s3://{b}/p/ids"))
        .arg(&bad)
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains("999"), "{err}");
    assert_eq!(ask(&format!("keys {b}")), "");
}

/// A safetensors file: F32 [2, 3] and F16 [4] (value `f16s`), canonical.
fn model_bytes(f16s: [u16; 4]) -> Vec<u8> {
    let header = br#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"h":{"dtype":"F16","shape":[4],"data_offsets":[24,32]}}"#;
    let mut header = header.to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend((0..6u32).flat_map(|i| (i as f32).to_le_bytes()));
    bytes.extend(f16s.iter().flat_map(|v| v.to_le_bytes()));
    bytes
}

#[test]
fn st_verify_of_objects_gives_the_local_verdicts() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    let good = model_bytes([0x3c00, 0, 0x4000, 0]);
    let nan = model_bytes([0x3c00, 0x7e00, 0x7c00, 0]);
    let mut bad_rule = good.clone();
    // The F16 tensor's end offset 32 -> 31: rule 5 (offsets) breaks.
    let at = bad_rule.windows(5).position(|w| w == b"24,32").unwrap();
    bad_rule[at + 4] = b'1';
    for (name, bytes) in [("good", &good), ("nan", &nan), ("bad", &bad_rule)] {
        let path = tmp.path().join(format!("{name}.safetensors"));
        std::fs::write(&path, bytes).unwrap();
        ask(&format!("put {b} m/{name}.safetensors {}", path.display()));
        let url = format!("s3://{b}/m/{name}.safetensors");
        for flags in [&[][..], &["--canonical", "--finite"][..]] {
            let run = |cmd: &mut assert_cmd::Command, file: &str| {
                let out = cmd
                    .args(["--json", "st", "verify"])
                    .args(flags)
                    .arg(file)
                    .output()
                    .unwrap();
                let text = String::from_utf8(out.stdout).unwrap();
                (out.status.code(), text.replace(file, "FILE"))
            };
            let local = run(&mut tlio(), path.to_str().unwrap());
            let remote = run(&mut tlio_s3(), &url);
            assert_eq!(remote, local, "{name} {flags:?}");
            let want = match (name, flags.is_empty()) {
                ("good", true) | ("nan", true) => Some(0),
                ("nan", false) | ("bad", _) => Some(1),
                _ => local.0,
            };
            assert_eq!(local.0, want, "{name} {flags:?}: {}", local.1);
        }
    }
    // The text form names the URL and the rule.
    let url = format!("s3://{b}/m/nan.safetensors");
    let out = tlio_s3()
        .args(["st", "verify", "--finite", &url])
        .assert()
        .code(1);
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(
        text.starts_with(&format!("{url}: finite: tensor"))
            && text.contains("1 NaN and 1 infinite values, the first at index 1"),
        "{text}"
    );
    let missing = format!("s3://{b}/m/absent.safetensors");
    let out = tlio_s3().args(["st", "verify", &missing]).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains(&missing) && err.contains("no such object"),
        "{err}"
    );
}

#[test]
fn a_tokenizer_pack_to_storage_writes_the_local_val_and_train_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("docs.txt");
    std::fs::write(&text, "Once upon a time there was a shard. ".repeat(40)).unwrap();
    let flags = [
        "--tokenizer",
        "gpt2",
        "--val-tokens",
        "60",
        "--shard-tokens",
        "150",
    ];
    let local = tmp.path().join("fw");
    let listed = stdout_of(
        tlio()
            .args(["--json", "tokens", "pack"])
            .args(flags)
            .arg("-o")
            .arg(&local)
            .arg(&text),
    );
    let b = bucket();
    let remote = stdout_of(
        tlio_s3()
            .args(["--json", "tokens", "pack"])
            .args(flags)
            .args(["-o", &format!("s3://{b}/fw/fw")])
            .arg(&text),
    );
    let local_doc: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let remote_doc: serde_json::Value = serde_json::from_str(&remote).unwrap();
    assert_eq!(remote_doc["tokens"], local_doc["tokens"]);
    assert_eq!(remote_doc["documents"], local_doc["documents"]);
    let shards = local_doc["shards"].as_array().unwrap();
    assert!(shards.len() >= 3, "{listed}");
    for (i, s) in shards.iter().enumerate() {
        let path = PathBuf::from(s["file"].as_str().unwrap());
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            remote_doc["shards"][i]["file"],
            format!("s3://{b}/fw/{name}").as_str()
        );
        let got = tmp.path().join(format!("got-{name}"));
        ask(&format!("get {b} fw/{name} {}", got.display()));
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(&path).unwrap(),
            "{name}"
        );
    }
    assert!(shards[0]["file"]
        .as_str()
        .unwrap()
        .ends_with("fw_val_000000.bin"));
    // Parts are packed and merged locally: --part with an s3:// output is refused.
    let out = tlio_s3()
        .args([
            "tokens",
            "pack",
            "--part",
            "0/2",
            "-o",
            &format!("s3://{b}/p/x"),
        ])
        .arg(&text)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains("--part 0/2") && err.contains("locally"),
        "{err}"
    );
}
