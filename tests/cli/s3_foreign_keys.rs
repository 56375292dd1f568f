//! Keys that no object-store path names (an empty segment, `.`, `..`: `run//notes.txt`,
//! `run/./x`), put beside a checkpoint prefix or token shards by boto3, against the
//! local S3 server of `s3.rs`: they are not the protocols' keys, so `ckpt latest`,
//! `save`, `verify` and `gc` and `tokens windows` over a pattern work as if they were
//! not there, `verify` names them, and nothing deletes them.

use super::s3::{ask, bucket, model_file, stdout_of, tlio_s3};
use super::s3_data::{corpus, pack_local, upload_all, windows};
use super::tlio;

/// The keys put beside the protocols' own (each one a listing of `object_store` cannot
/// parse).
const FOREIGN: [&str; 4] = ["//notes.txt", "/./x", "/.", "/../y"];

/// Put every [`FOREIGN`] key below `prefix` of bucket `b`; their keys.
fn put_foreign(b: &str, prefix: &str, scratch: &std::path::Path) -> Vec<String> {
    let file = scratch.join("notes.txt");
    std::fs::write(&file, b"not a checkpoint\n").unwrap();
    FOREIGN
        .iter()
        .map(|f| {
            let key = format!("{prefix}{f}");
            ask(&format!("put {b} {key} {}", file.display()));
            key
        })
        .collect()
}

fn keys(b: &str) -> Vec<String> {
    ask(&format!("keys {b}"))
        .split(' ')
        .map(str::to_string)
        .collect()
}

#[test]
fn foreign_keys_beside_a_checkpoint_are_ignored_by_ckpt_and_named_by_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let dir = format!("s3://{b}/run");
    let save = |n: u64| {
        tlio_s3()
            .args(["ckpt", "save", &dir, "--step", &n.to_string(), "--model"])
            .arg(&model)
            .assert()
            .success();
    };
    save(1);
    let foreign = put_foreign(&b, "run", tmp.path());
    // One more below a step prefix.
    let file = tmp.path().join("notes.txt");
    ask(&format!("put {b} run/step-000001//x {}", file.display()));
    let all = keys(&b);
    for k in &foreign {
        assert!(all.contains(k), "the server kept {k} as it is: {all:?}");
    }

    let latest = stdout_of(tlio_s3().args(["ckpt", "latest", &dir]));
    assert_eq!(latest.trim(), format!("{dir}/step-000001"));
    save(2);
    let text = stdout_of(tlio_s3().args(["ckpt", "verify", &dir]));
    assert!(text.contains("load picks step-000002"), "{text}");
    for k in foreign.iter().chain([&"run/step-000001//x".to_string()]) {
        assert!(
            text.contains(&format!(
                "ignored: s3://{b}/{k} (not a key of the checkpoint protocol"
            )),
            "verify names {k}: {text}"
        );
    }
    let json: serde_json::Value = serde_json::from_str(&stdout_of(
        tlio_s3().args(["--json", "ckpt", "verify", &dir]),
    ))
    .unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["foreign"].as_array().unwrap().len(), foreign.len() + 1);

    let gc = stdout_of(tlio_s3().args(["ckpt", "gc", &dir, "--keep", "1"]));
    assert!(gc.contains("removed step-000001"), "{gc}");
    let after = keys(&b);
    for k in &foreign {
        assert!(after.contains(k), "gc left {k}: {after:?}");
    }
    let latest = stdout_of(tlio_s3().args(["ckpt", "latest", &dir]));
    assert_eq!(latest.trim(), format!("{dir}/step-000002"));
    // A local directory's verify report has no such field.
    let local = tmp.path().join("local");
    tlio()
        .args(["ckpt", "save"])
        .arg(&local)
        .args(["--step", "1", "--model"])
        .arg(&model)
        .assert()
        .success();
    let json: serde_json::Value = serde_json::from_str(&stdout_of(
        tlio().args(["--json", "ckpt", "verify"]).arg(&local),
    ))
    .unwrap();
    assert!(json.get("foreign").is_none(), "{json}");
}

#[test]
fn a_pattern_over_shards_beside_foreign_keys_reads_the_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("corpus.bin");
    std::fs::write(&input, corpus(3000)).unwrap();
    let shards = pack_local(&input, &tmp.path().join("train"), 1800);
    let b = bucket();
    upload_all(&b, "data", &shards);
    put_foreign(&b, "data", tmp.path());
    let local: Vec<String> = shards.iter().map(|p| p.display().to_string()).collect();
    let cache = tmp.path().join("cache");
    let args = ["--seed", "3", "--batches", "20", "--shuffle"];
    let want = windows(tlio(), &cache, &local, &args);
    let pattern = format!("s3://{b}/data/*.bin");
    assert_eq!(windows(tlio_s3(), &cache, &[pattern], &args), want);
    let every = format!("s3://{b}/data/*");
    assert_eq!(windows(tlio_s3(), &cache, &[every], &args), want);
}
