//! Token shards and safetensors files on object storage, against the local S3 server of
//! `s3.rs`: `tokens windows` over `s3://` shards (listed, by pattern, through a pack's
//! manifest, resumed from a cursor) prints what it prints over local copies;
//! `tokens pack -o s3://` uploads the bytes a local pack writes, with its manifest last,
//! and never replaces objects; a pack in parts into storage (one part killed before
//! its marker, two runners of another) merges into the shards and manifest of one
//! pack, naming missing and damaged parts by URL; `st verify` of an object gives a local verify's verdicts
//! (reader rules, canonical bytes, finite values streamed).

use std::path::{Path, PathBuf};

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::s3::{ask, bucket, find_key, flip_last_byte_of_object, stdout_of, tlio_s3, tlio_s3_std};
use super::{fixture, tlio};

/// Deterministic bytes for packing (a 32-bit LCG's high bytes).
pub(crate) fn corpus(len: usize) -> Vec<u8> {
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
pub(crate) fn pack_local(input: &Path, out: &Path, n: u32) -> Vec<PathBuf> {
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
    shard_files(&serde_json::from_str(&text).unwrap())
}

/// The shard paths of a pack's JSON report.
fn shard_files(doc: &serde_json::Value) -> Vec<PathBuf> {
    doc["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| PathBuf::from(s["file"].as_str().unwrap()))
        .collect()
}

/// The shards a pack into `s3://b/prefix/` reports (`doc`, its JSON report) are the
/// local shards `local`: the same names, in order, and the same bytes (read back with
/// boto3 into `dir`).
fn assert_published_as_local(
    dir: &Path,
    b: &str,
    prefix: &str,
    doc: &serde_json::Value,
    local: &[PathBuf],
) {
    assert_eq!(
        doc["shards"].as_array().unwrap().len(),
        local.len(),
        "{doc}"
    );
    for (i, path) in local.iter().enumerate() {
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            doc["shards"][i]["file"],
            format!("s3://{b}/{prefix}/{name}").as_str()
        );
        let got = dir.join(format!("got-{prefix}-{name}"));
        ask(&format!("get {b} {prefix}/{name} {}", got.display()));
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(path).unwrap(),
            "{name}"
        );
    }
}

pub(crate) fn upload_all(b: &str, prefix: &str, files: &[PathBuf]) -> Vec<String> {
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
pub(crate) fn windows(
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

/// The object copies in a cache folder (each beside its digest file).
pub(crate) fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "bin"))
        })
        .count()
    })
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
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap();
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
    assert_published_as_local(tmp.path(), &b, "packed", &doc, &local);
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
    assert_published_as_local(tmp.path(), &b, "fw", &remote_doc, &shard_files(&local_doc));
    assert!(shards[0]["file"]
        .as_str()
        .unwrap()
        .ends_with("fw_val_000000.bin"));
    // Each shard's document sidecar is uploaded beside it, the local one's bytes, and
    // the manifest lists it with its size and sha256.
    let got = tmp.path().join("got-manifest.json");
    ask(&format!("get {b} fw/fw.manifest.json {}", got.display()));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&got).unwrap()).unwrap();
    for (entry, path) in manifest["shards"]
        .as_array()
        .unwrap()
        .iter()
        .zip(shard_files(&local_doc))
    {
        let docs = path.with_extension("docs");
        let name = docs.file_name().unwrap().to_str().unwrap();
        assert_eq!(entry["docs"]["name"], name, "{manifest}");
        let bytes = std::fs::read(&docs).unwrap();
        assert_eq!(entry["docs"]["bytes"], bytes.len() as u64);
        let fetched = tmp.path().join(format!("got-{name}"));
        ask(&format!("get {b} fw/{name} {}", fetched.display()));
        assert_eq!(std::fs::read(&fetched).unwrap(), bytes, "{name}");
    }
}

#[test]
fn a_packs_manifest_as_a_source_is_its_train_shards_unless_a_split_is_named() {
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
    let local_doc: serde_json::Value = serde_json::from_str(&stdout_of(
        tlio()
            .args(["--json", "tokens", "pack"])
            .args(flags)
            .arg("-o")
            .arg(tmp.path().join("fw"))
            .arg(&text),
    ))
    .unwrap();
    let b = bucket();
    stdout_of(
        tlio_s3()
            .args(["-q", "tokens", "pack"])
            .args(flags)
            .args(["-o", &format!("s3://{b}/m/fw")])
            .arg(&text),
    );
    let local: Vec<String> = shard_files(&local_doc)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let (val, train) = local.split_first().unwrap();
    assert!(
        val.ends_with("fw_val_000000.bin") && train.len() >= 2,
        "{local:?}"
    );
    let cache = tmp.path().join("cache");
    let manifest = format!("s3://{b}/m/fw.manifest.json");
    let args = ["--seed", "3", "--batches", "30"];
    // Without a split, the manifest is its training shards: the batches of those alone.
    let train_only = windows(tlio(), &cache, train, &args);
    assert_eq!(
        windows(tlio_s3(), &cache, std::slice::from_ref(&manifest), &args),
        train_only
    );
    assert_eq!(
        windows(tlio_s3(), &cache, &[format!("{manifest}#train")], &args),
        train_only
    );
    assert_eq!(
        windows(tlio_s3(), &cache, &[format!("{manifest}#val")], &args),
        windows(tlio(), &cache, std::slice::from_ref(val), &args)
    );
    assert_eq!(
        windows(tlio_s3(), &cache, &[format!("{manifest}#all")], &args),
        windows(tlio(), &cache, &local, &args)
    );
    // A copy of the pack on disk reads the same way.
    let copy = tmp.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for key in ask(&format!("keys {b} m/")).split_whitespace() {
        let name = key.rsplit('/').next().unwrap();
        ask(&format!("get {b} {key} {}", copy.join(name).display()));
    }
    let local_manifest = copy.join("fw.manifest.json").display().to_string();
    assert_eq!(
        windows(tlio(), &cache, std::slice::from_ref(&local_manifest), &args),
        train_only
    );
    // A split that does not exist is refused, naming the choices.
    let err = fails(
        tlio()
            .env("TLIO_CACHE_DIR", &cache)
            .args(["tokens", "windows", "--seq-len", "7", "--batch", "3"])
            .arg(format!("{local_manifest}#test")),
        1,
    );
    assert!(
        err.contains("unknown split \"test\" after # (train, val or all)"),
        "{err}"
    );
}

/// Wait until a part's ids are in storage under `prefix` of bucket `b`.
fn wait_for_ids(b: &str, prefix: &str) {
    let started = Instant::now();
    while !ask(&format!("keys {b} {prefix}")).contains("/ids-") {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no ids under {prefix} in time"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error output of a command expected to exit with `code`.
fn fails(cmd: &mut assert_cmd::Command, code: i32) -> String {
    let out = cmd.assert().code(code);
    String::from_utf8_lossy(&out.get_output().stderr).to_string()
}

#[test]
fn parts_packed_into_storage_merge_into_the_shards_of_one_pack() {
    let tmp = tempfile::tempdir().unwrap();
    // JSONL the plan cuts inside: the corpus, three times over.
    let corpus = std::fs::read_to_string(fixture("tokenizers/corpus.jsonl")).unwrap();
    let input = tmp.path().join("docs.jsonl");
    std::fs::write(&input, corpus.repeat(3)).unwrap();
    let flags = [
        "--from",
        "jsonl",
        "--tokenizer",
        "gpt2",
        "--val-tokens",
        "700",
        "--shard-tokens",
        "2000",
    ];
    let local = tmp.path().join("fw");
    let listed = stdout_of(
        tlio()
            .args(["--json", "tokens", "pack"])
            .args(flags)
            .arg("-o")
            .arg(&local)
            .arg(&input),
    );
    let local_doc: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let b = bucket();
    let out = format!("s3://{b}/data/fw");
    let part = |k: usize, extra: &[&str]| {
        let mut cmd = tlio_s3();
        cmd.args(["--json", "tokens", "pack"])
            .args(flags)
            .args(extra)
            .args(["-o", &out, "--part", &format!("{k}/3")])
            .arg(&input);
        cmd
    };
    // Part 1 is killed after its ids are in storage and before its marker.
    let mut held = tlio_s3_std();
    held.env("FAILPOINTS", "tokens/part-commit=sleep(600000)")
        .args(["tokens", "pack"])
        .args(flags)
        .args(["-o", &out, "--part", "1/3"])
        .arg(&input)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = held.spawn().unwrap();
    wait_for_ids(&b, "data/fw.parts/1-of-3/");
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    // Two runners of part 2 at once (a retried task beside a slow one): the first to
    // create the marker packed it, the other finds it complete.
    let mut slow = tlio_s3_std();
    slow.env("FAILPOINTS", "tokens/part-commit=sleep(5000)")
        .args(["--json", "tokens", "pack"])
        .args(flags)
        .args(["-o", &out, "--part", "2/3"])
        .arg(&input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let slow = slow.spawn().unwrap();
    // Its ids are up, so it found no marker; it commits after the other runner.
    wait_for_ids(&b, "data/fw.parts/2-of-3/");
    for k in [2, 0] {
        let doc: serde_json::Value = serde_json::from_str(&stdout_of(&mut part(k, &[]))).unwrap();
        assert_eq!(doc["status"], "packed", "{doc}");
        assert_eq!(doc["dir"], format!("{out}.parts/{k}-of-3").as_str());
    }
    let late = slow.wait_with_output().unwrap();
    assert!(
        late.status.success(),
        "{}",
        String::from_utf8_lossy(&late.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&late.stdout).unwrap();
    assert_eq!(doc["status"], "complete", "{doc}");
    // Part 1 has its ids but no marker: the merge names it and writes nothing.
    let err = fails(tlio_s3().args(["tokens", "merge", &out]), 1);
    assert!(
        err.contains(&format!(
            "{out}.parts: 1 of 3 parts missing or incomplete: 1-of-3"
        )),
        "{err}"
    );
    assert!(!ask(&format!("keys {b} data/")).contains("fw_"));
    // A part run with other options than the parts in storage is refused, naming both.
    let err = fails(&mut part(0, &["--skip-bad"]), 1);
    assert!(
        err.contains(&format!(
            "{out}.parts/0-of-3: made with skip_bad false, but this run has true"
        )),
        "{err}"
    );
    // The rerun packs part 1 (it never completed); a rerun of part 0 does nothing.
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&mut part(1, &[]))).unwrap();
    assert_eq!(doc["status"], "packed", "{doc}");
    let doc: serde_json::Value = serde_json::from_str(&stdout_of(&mut part(0, &[]))).unwrap();
    assert_eq!(doc["status"], "complete", "{doc}");
    // A damaged part is named by its object, and nothing is published.
    let ids_key = find_key(&b, "data/fw.parts/2-of-3/", |k| k.contains("/ids-"));
    let good = flip_last_byte_of_object(tmp.path(), &b, &ids_key);
    let err = fails(tlio_s3().args(["tokens", "merge", &out]), 1);
    assert!(
        err.contains(&format!("s3://{b}/{ids_key}: blake3 "))
            && err.contains("but the marker records"),
        "{err}"
    );
    assert!(!ask(&format!("keys {b} data/")).contains("fw_"));
    ask(&format!("put {b} {ids_key} {}", good.display()));
    // The merge publishes the shards of one pack, byte for byte, and a manifest.
    let merged: serde_json::Value = serde_json::from_str(&stdout_of(
        tlio_s3().args(["--json", "tokens", "merge", &out]),
    ))
    .unwrap();
    assert_eq!(merged["tokens"], local_doc["tokens"]);
    assert_eq!(merged["documents"], local_doc["documents"]);
    assert_eq!(
        merged["manifest"],
        format!("s3://{b}/data/fw.manifest.json").as_str()
    );
    let shards = shard_files(&local_doc);
    assert!(shards.len() >= 3, "{listed}");
    assert_published_as_local(tmp.path(), &b, "data", &merged, &shards);
    // Its manifest is the one a single pack to storage creates.
    stdout_of(
        tlio_s3()
            .args(["tokens", "pack"])
            .args(flags)
            .args(["-o", &format!("s3://{b}/one/fw")])
            .arg(&input),
    );
    let manifest = |key: &str| {
        let path = tmp.path().join(key.replace('/', "-"));
        ask(&format!("get {b} {key} {}", path.display()));
        std::fs::read(&path).unwrap()
    };
    assert_eq!(
        manifest("data/fw.manifest.json"),
        manifest("one/fw.manifest.json")
    );
    // A second merge never replaces what the first published: it finds the very
    // manifest it would create, says the output is complete and uploads nothing.
    let keys = ask(&format!("keys {b} data/"));
    let again = tlio_s3().args(["tokens", "merge", &out]).assert().success();
    let err = String::from_utf8_lossy(&again.get_output().stderr).to_string();
    assert!(err.contains("already complete"), "{err}");
    assert_eq!(ask(&format!("keys {b} data/")), keys);
}
