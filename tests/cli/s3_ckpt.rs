//! `tlio ckpt` on `s3://` prefixes against the local S3 server (tests/s3_server.py):
//! save, verify, latest, gc and export give the local results; of two writers of one
//! step exactly one commits; writers killed at random instants leave no partial step;
//! a corrupted object fails verify and `latest` falls back; a sharded step verifies,
//! inspects and exports as the local one (a piece changed behind its manifest found by
//! the piece digests); a server stopped in the middle of a save, a missing bucket and
//! missing credentials are clear errors within seconds.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use super::s3::{
    ask, bucket, find_key, flip_last_byte_of_object, model_file, python, server, stdout_of, tlio_s3,
};
use super::tlio;

/// A safetensors file of one U8 tensor of `bytes` bytes (large ones go up in parts).
fn big_model(dir: &Path, name: &str, bytes: usize, fill: u8) -> PathBuf {
    let path = dir.join(name);
    let header =
        format!(r#"{{"w":{{"dtype":"U8","shape":[{bytes}],"data_offsets":[0,{bytes}]}}}}"#);
    let mut data = (header.len() as u64).to_le_bytes().to_vec();
    data.extend_from_slice(header.as_bytes());
    data.extend((0..bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(fill)));
    std::fs::write(&path, data).unwrap();
    path
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn stderr_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stderr).to_string()
}

/// `ckpt verify --json` without the sizes (a manifest on object storage also names
/// its attempt, so it is longer by that key).
fn verify_json(dir: &str, remote: bool) -> serde_json::Value {
    let mut cmd = if remote { tlio_s3() } else { tlio() };
    let out = cmd.args(["--json", "ckpt", "verify", dir]).assert();
    let mut v = json(&String::from_utf8_lossy(&out.get_output().stdout));
    for step in v["steps"].as_array_mut().unwrap() {
        step.as_object_mut().unwrap().remove("size");
    }
    v
}

/// Save step `n` of `dir` with the given model and optimizer.
fn save(dir: &str, n: u64, model: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    let mut cmd = if dir.starts_with("s3://") {
        tlio_s3()
    } else {
        tlio()
    };
    cmd.args(["--json", "ckpt", "save", dir, "--step", &n.to_string()])
        .arg("--model")
        .arg(model)
        .args(["--tokens-seen", &(n * 100).to_string(), "--lr", "0.01"])
        .args(extra)
        .assert()
}

#[test]
fn ckpt_save_verify_latest_gc_and_export_on_s3_give_the_local_results() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let config = tmp.path().join("config.json");
    std::fs::write(&config, b"{\"n_layer\": 2}\n").unwrap();
    let local = tmp.path().join("ckpt");
    let local = local.to_str().unwrap();
    let remote = format!("s3://{}/runs/a/ckpt", bucket());
    for n in [1, 2, 3] {
        let args = ["--config", config.to_str().unwrap(), "--keep", "2"];
        let l = save(local, n, &model, &args).success();
        let r = save(&remote, n, &model, &args).success();
        // The same files with the same digests.
        assert_eq!(
            json(&String::from_utf8_lossy(&l.get_output().stdout)),
            json(&String::from_utf8_lossy(&r.get_output().stdout))
        );
    }
    assert_eq!(verify_json(local, false), verify_json(&remote, true));
    let v = verify_json(&remote, true);
    assert_eq!(v["ok"], true);
    assert_eq!(v["load"], "step-000003");
    assert_eq!(v["steps"].as_array().unwrap().len(), 2, "{v}");
    // The table of a remote prefix.
    let table = stdout_of(tlio_s3().args(["ckpt", "verify", &remote]));
    assert!(table.contains("load picks step-000003"), "{table}");
    // One step.
    let one = stdout_of(tlio_s3().args(["ckpt", "verify", &format!("{remote}/step-000002")]));
    assert!(one.starts_with("ok ("), "{one}");

    let latest = stdout_of(tlio_s3().args(["ckpt", "latest", &remote]));
    assert_eq!(latest.trim(), format!("{remote}/step-000003"));
    assert_eq!(
        stdout_of(tlio().args(["ckpt", "latest", local])).trim(),
        format!("{local}/step-000003")
    );

    // The refusals of a save, in the same words and with the same status.
    for (n, extra) in [(3u64, vec![]), (2, vec![])] {
        let l = save(local, n, &model, &extra).failure();
        let r = save(&remote, n, &model, &extra).failure();
        assert_eq!(
            l.get_output().status.code(),
            r.get_output().status.code(),
            "step {n}"
        );
        if n == 3 {
            assert_eq!(
                stderr_of(&l).replace(local, "DIR"),
                stderr_of(&r).replace(&remote, "DIR")
            );
        } else {
            assert!(
                stderr_of(&r).contains("older than step-000003"),
                "{}",
                stderr_of(&r)
            );
        }
    }
    // --overwrite replaces the step (conditionally on the manifest it saw).
    let args = ["--config", config.to_str().unwrap(), "--overwrite"];
    save(local, 3, &model, &args).success();
    save(&remote, 3, &model, &args).success();
    assert_eq!(verify_json(&remote, true)["load"], "step-000003");

    // gc: the same removals, then the same survey.
    let gc = |dir: &str, remote: bool, dry: bool| {
        let mut cmd = if remote { tlio_s3() } else { tlio() };
        cmd.args(["--json", "ckpt", "gc", dir, "--keep", "1"]);
        if dry {
            cmd.arg("--dry-run");
        }
        if remote {
            // The attempt step 3 named before --overwrite is abandoned at once.
            cmd.args(["--grace", "0"]);
        }
        json(&stdout_of(&mut cmd))
    };
    let dry = gc(&remote, true, true);
    let removed: Vec<String> = dry["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} ({})",
                r["name"].as_str().unwrap(),
                r["reason"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(removed[0], "step-000002 (beyond keep)");
    assert!(
        removed[1].starts_with("step-000003/attempt-")
            && removed[1].ends_with("(abandoned attempt)"),
        "{removed:?}"
    );
    assert_eq!(
        verify_json(&remote, true)["steps"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    gc(local, false, false);
    gc(&remote, true, false);
    let (l, r) = (verify_json(local, false), verify_json(&remote, true));
    assert_eq!(l, r);
    assert_eq!(r["steps"].as_array().unwrap().len(), 1);
    // Nothing but step 3's manifest and its one attempt remain, and LATEST.
    let b = remote
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap();
    let keys = ask(&format!("keys {b} runs/a/ckpt/"));
    let keys: Vec<&str> = keys.split(' ').collect();
    assert_eq!(keys.len(), 1 + 1 + 3, "{keys:?}");
    assert!(keys.contains(&"runs/a/ckpt/LATEST"));
    assert!(keys.contains(&"runs/a/ckpt/step-000003/MANIFEST.json"));

    // Export of a remote step: the same model directory as of the local step.
    let (lo, ro) = (tmp.path().join("lo"), tmp.path().join("ro"));
    tlio()
        .args(["ckpt", "export", &format!("{local}/step-000003"), "-o"])
        .arg(&lo)
        .assert()
        .success();
    tlio_s3()
        .args(["ckpt", "export", &format!("{remote}/step-000003"), "-o"])
        .arg(&ro)
        .assert()
        .success();
    for name in ["model.safetensors", "config.json"] {
        assert_eq!(
            std::fs::read(lo.join(name)).unwrap(),
            std::fs::read(ro.join(name)).unwrap(),
            "{name}"
        );
    }
    // The download's scratch directory is gone.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tlio"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn of_two_writers_of_one_step_exactly_one_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let a = big_model(tmp.path(), "a.safetensors", 1000, 1);
    let b = big_model(tmp.path(), "b.safetensors", 1000, 2);
    let remote = format!("s3://{}/ckpt", bucket());
    // Writer A uploads everything, then is held before its commit while writer B saves
    // the same step whole: A's conditional create must fail.
    let mut slow = StdCommand::new(env!("CARGO_BIN_EXE_tlio"));
    slow.env("FAILPOINTS", "s3/commit=sleep(3000)")
        .env("AWS_ENDPOINT_URL", &server().url)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .args(["ckpt", "save", &remote, "--step", "7", "--model"])
        .arg(&a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = slow.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    save(&remote, 7, &b, &[]).success();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{remote}/step-000007 was committed by another writer"
        )),
        "{err}"
    );
    // The step is B's, whole; A's objects are gone.
    let v = verify_json(&remote, true);
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["stale"].as_array().unwrap().is_empty(), "{v}");
    let bucket_name = remote
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap();
    let keys = ask(&format!("keys {bucket_name} ckpt/step-000007/"));
    let keys: Vec<&str> = keys.split(' ').collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    let key = keys
        .iter()
        .find(|k| k.ends_with("/model.safetensors"))
        .unwrap();
    let got = tmp.path().join("got");
    ask(&format!("get {bucket_name} {key} {}", got.display()));
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn writers_killed_at_random_instants_leave_no_partial_step() {
    let tmp = tempfile::tempdir().unwrap();
    // Over the multipart threshold: the kill can land between parts.
    let model = big_model(tmp.path(), "m.safetensors", 70 << 20, 3);
    let remote = format!("s3://{}/ckpt", bucket());
    save(&remote, 1, &model, &[]).success();
    // A fixed sequence of instants (a linear congruential generator), from before the
    // first request to after the commit.
    let mut x: u64 = 0x2545_f491;
    let mut committed = vec![1u64];
    for n in 2..=7u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis((x >> 33) % 2500);
        let mut child = StdCommand::new(env!("CARGO_BIN_EXE_tlio"))
            .env("AWS_ENDPOINT_URL", &server().url)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .args(["ckpt", "save", &remote, "--step", &n.to_string(), "--model"])
            .arg(&model)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SIGKILL: no unwinding, no cleanup.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        // Every step that exists verifies, whatever instant the kill hit.
        let v = verify_json(&remote, true);
        for step in v["steps"].as_array().unwrap() {
            assert_eq!(step["status"], "ok", "killed after {delay:?}: {v}");
        }
        let steps: Vec<u64> = v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["step"].as_u64().unwrap())
            .collect();
        if steps.contains(&n) {
            committed.push(n);
        }
        assert_eq!(steps, committed, "killed after {delay:?} ({status})");
        let latest = stdout_of(tlio_s3().args(["ckpt", "latest", &remote]));
        assert_eq!(
            latest.trim(),
            format!("{remote}/step-{:06}", committed.last().unwrap())
        );
    }
    // The next save succeeds, and gc (no grace) leaves only committed attempts.
    save(&remote, 8, &model_file(tmp.path()), &[]).success();
    tlio_s3()
        .args(["ckpt", "gc", &remote, "--keep", "100", "--grace", "0"])
        .assert()
        .success();
    let v = verify_json(&remote, true);
    assert!(v["stale"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(v["ok"], true, "{v}");
}

#[test]
fn a_corrupted_object_fails_verify_and_latest_falls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    save(&remote, 1, &model, &[]).success();
    save(&remote, 2, &model, &[]).success();
    // Flip one byte of step 2's model object (same size).
    let key = find_key(&b, "ckpt/step-000002/", |k| {
        k.ends_with("/model.safetensors")
    });
    flip_last_byte_of_object(tmp.path(), &b, &key);

    let out = tlio_s3()
        .args(["ckpt", "verify", &format!("{remote}/step-000002")])
        .assert()
        .code(1);
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("model.safetensors sha256 mismatch"), "{text}");
    let v = verify_json(&remote, true);
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["load"], "step-000001", "{v}");
    // A step named by its URL is that step: exporting it is refused naming why,
    // never answered with step 1.
    let out_dir = tmp.path().join("export");
    let out = tlio_s3()
        .args(["ckpt", "export", &format!("{remote}/step-000002")])
        .arg(&out_dir)
        .assert()
        .failure();
    let text = stderr_of(&out);
    assert!(
        text.contains("step-000002") && text.contains("model.safetensors sha256 mismatch"),
        "{text}"
    );
    assert!(!out_dir.exists());
    let out = tlio_s3()
        .args(["ckpt", "latest", &remote])
        .assert()
        .success();
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stdout).trim(),
        format!("{remote}/step-000001")
    );
    assert!(
        stderr_of(&out).contains("skipped step-000002: model.safetensors sha256 mismatch"),
        "{}",
        stderr_of(&out)
    );
}

/// A server of this test's own (it is stopped in the middle of a save).
struct OwnServer {
    url: String,
    child: std::process::Child,
}

impl OwnServer {
    fn start() -> OwnServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_server.py");
        let mut child = StdCommand::new(python())
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        // The first line is `URL KEY SECRET`; this server checks no signature.
        let url = line.split_whitespace().next().unwrap_or("").to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{line:?}");
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "bucket own-bucket").unwrap();
        stdin.flush().unwrap();
        let mut ok = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut ok)
            .unwrap();
        assert!(ok.starts_with("ok"), "{ok}");
        OwnServer { url, child }
    }

    /// Stop it now (closing its input ends it) and wait until it is gone.
    fn stop(&mut self) {
        drop(self.child.stdin.take());
        self.child.wait().unwrap();
    }
}

#[test]
fn a_server_stopped_in_the_middle_of_a_save_is_an_error_within_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let mut own = OwnServer::start();
    let remote = "s3://own-bucket/ckpt";
    // Held after its uploads, before its commit: the server stops meanwhile.
    let child = StdCommand::new(env!("CARGO_BIN_EXE_tlio"))
        .env("FAILPOINTS", "s3/commit=sleep(2000)")
        .env("AWS_ENDPOINT_URL", &own.url)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .args(["ckpt", "save", remote, "--step", "1", "--model"])
        .arg(&model)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    own.stop();
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("tlio: error: cannot save step 1 in s3://own-bucket/ckpt: s3://own-bucket/ckpt/step-000001/")
            && err.contains("cannot reach the server"),
        "{err}"
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "took {:?}",
        stopped.elapsed()
    );
    // Reading from the stopped server fails as fast.
    let start = Instant::now();
    let out = tlio_s3()
        .env("AWS_ENDPOINT_URL", &own.url)
        .args(["ckpt", "latest", remote])
        .timeout(Duration::from_secs(60))
        .assert()
        .code(2);
    assert!(
        stderr_of(&out).contains("cannot reach the server"),
        "{}",
        stderr_of(&out)
    );
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_missing_bucket_and_missing_credentials_fail_a_save_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let start = Instant::now();
    let out = save("s3://no-such-bucket-tlio/ckpt", 1, &model, &[]).code(2);
    let err = stderr_of(&out);
    assert!(
        err.contains(
            "cannot save step 1 in s3://no-such-bucket-tlio/ckpt: s3://no-such-bucket-tlio/ckpt"
        ) && err.contains("no such bucket no-such-bucket-tlio"),
        "{err}"
    );
    for cmd in [["ckpt", "verify"], ["ckpt", "latest"]] {
        let out = tlio_s3()
            .args(cmd)
            .arg("s3://no-such-bucket-tlio/ckpt")
            .assert()
            .code(2);
        assert!(
            stderr_of(&out).contains("no such bucket"),
            "{}",
            stderr_of(&out)
        );
    }
    let remote = format!("s3://{}/ckpt", bucket());
    let out = tlio_s3()
        .env_remove("AWS_ACCESS_KEY_ID")
        .args(["ckpt", "save", &remote, "--step", "1", "--model"])
        .arg(&model)
        .assert()
        .code(2);
    assert!(
        stderr_of(&out).contains(&remote) && stderr_of(&out).contains("AWS_ACCESS_KEY_ID"),
        "{}",
        stderr_of(&out)
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    // Nothing was written by the refused save.
    let b = remote
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap();
    assert_eq!(ask(&format!("keys {b}")), "");
    // An empty prefix has no checkpoint: exit 1, as an empty directory.
    let out = tlio_s3().args(["ckpt", "latest", &remote]).assert().code(1);
    assert!(
        stderr_of(&out).contains("no loadable checkpoint"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn gc_keeps_a_young_abandoned_attempt_and_refuses_grace_for_local_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    save(&remote, 1, &model, &[]).success();
    // An attempt no manifest names, as a writer still uploading leaves it.
    let attempt = format!(
        "ckpt/step-000002/attempt-{}/model.safetensors",
        "ab".repeat(16)
    );
    ask(&format!("put {b} {attempt} {}", model.display()));
    let v = verify_json(&remote, true);
    assert_eq!(
        v["stale"],
        serde_json::json!([format!("step-000002/attempt-{}", "ab".repeat(16))])
    );
    let out = json(&stdout_of(
        tlio_s3().args(["--json", "ckpt", "gc", &remote, "--keep", "1"]),
    ));
    assert_eq!(out["removed"], serde_json::json!([]), "{out}");
    assert!(ask(&format!("keys {b}")).contains(&attempt));
    let out = json(&stdout_of(tlio_s3().args([
        "--json", "ckpt", "gc", &remote, "--keep", "1", "--grace", "0",
    ])));
    assert_eq!(out["removed"][0]["reason"], "abandoned attempt", "{out}");
    assert!(!ask(&format!("keys {b}")).contains(&attempt));
    let out = tlio()
        .args(["ckpt", "gc"])
        .arg(tmp.path())
        .args(["--keep", "1", "--grace", "0"])
        .assert()
        .code(2);
    assert!(
        stderr_of(&out).contains("--grace applies to object storage"),
        "{}",
        stderr_of(&out)
    );
}

/// Upload the local step directory `step_dir` as committed step `name` under
/// `s3://bucket/prefix`, in the layout a save on object storage makes (its files under
/// one attempt, the manifest naming the attempt, `LATEST`); returns the attempt.
fn upload_step(b: &str, prefix: &str, step_dir: &Path, scratch: &Path) -> String {
    use tlio_core::checkpoint::manifest::Manifest;
    use tlio_core::remote::checkpoint::RemoteManifest;
    let name = step_dir.file_name().unwrap().to_str().unwrap();
    let attempt = format!("attempt-{}", "5a".repeat(16));
    let manifest =
        Manifest::from_json(&std::fs::read(step_dir.join("MANIFEST.json")).unwrap()).unwrap();
    for e in &manifest.files {
        let file = step_dir.join(&e.name);
        ask(&format!(
            "put {b} {prefix}/{name}/{attempt}/{} {}",
            e.name,
            file.display()
        ));
    }
    let remote = RemoteManifest {
        attempt: attempt.clone(),
        manifest,
    };
    let copy = scratch.join("manifest.json");
    std::fs::write(&copy, remote.to_json()).unwrap();
    ask(&format!(
        "put {b} {prefix}/{name}/MANIFEST.json {}",
        copy.display()
    ));
    std::fs::write(&copy, format!("{name}\n")).unwrap();
    ask(&format!("put {b} {prefix}/LATEST {}", copy.display()));
    attempt
}

/// Flip the last byte of `file` and give its manifest entry the new sha256: the
/// damage only the piece digests of shards.json can find.
fn flip_behind_the_manifest(step_dir: &Path, file: &str) {
    use tlio_core::checkpoint::manifest::Manifest;
    let path = step_dir.join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let mpath = step_dir.join("MANIFEST.json");
    let mut m = Manifest::from_json(&std::fs::read(&mpath).unwrap()).unwrap();
    for e in &mut m.files {
        if e.name == file {
            e.sha256 = tlio_core::digest::sha256_hex(&bytes);
        }
    }
    std::fs::write(&mpath, m.to_json()).unwrap();
}

#[test]
fn a_sharded_step_on_s3_verifies_inspects_and_exports_as_the_local_one() {
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path().join("local");
    let (step, _, _) = super::sharded::sharded_step(&local, 7);
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    upload_step(&b, "ckpt", &step, tmp.path());
    let local_text = local.display().to_string();

    assert_eq!(verify_json(&remote, true), verify_json(&local_text, false));
    let latest = stdout_of(tlio_s3().args(["ckpt", "latest", &remote]));
    assert_eq!(latest.trim(), format!("{remote}/step-000007"));
    let there = stdout_of(tlio_s3().args(["st", "inspect", &format!("{remote}/step-000007")]));
    let here = stdout_of(tlio().args(["st", "inspect"]).arg(&step));
    assert_eq!(
        there.replace(&remote, "DIR"),
        here.replace(&local_text, "DIR")
    );
    let (a, c) = (tmp.path().join("from-s3"), tmp.path().join("from-local"));
    tlio_s3()
        .args(["ckpt", "export", &format!("{remote}/step-000007"), "-o"])
        .arg(&a)
        .assert()
        .success();
    tlio()
        .args(["ckpt", "export"])
        .arg(&step)
        .arg("-o")
        .arg(&c)
        .assert()
        .success();
    for name in ["model.safetensors", "config.json"] {
        assert_eq!(
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(c.join(name)).unwrap(),
            "{name}"
        );
    }

    // A piece changed behind a manifest that agrees with it: only the piece digests of
    // shards.json see it, on object storage as locally, and latest finds no step.
    flip_behind_the_manifest(&step, "model-rank00001.safetensors");
    let b2 = bucket();
    let remote2 = format!("s3://{b2}/ckpt");
    upload_step(&b2, "ckpt", &step, tmp.path());
    let problem = |out: &assert_cmd::assert::Assert| {
        String::from_utf8_lossy(&out.get_output().stdout).replace(&remote2, "DIR")
    };
    let there = tlio_s3()
        .args(["ckpt", "verify", &format!("{remote2}/step-000007")])
        .assert()
        .code(1);
    let here = tlio().args(["ckpt", "verify"]).arg(&step).assert().code(1);
    let text = problem(&there);
    assert!(
        text.contains("model-rank00001.safetensors: piece 0") && text.contains("blake3"),
        "{text}"
    );
    assert_eq!(
        text,
        String::from_utf8_lossy(&here.get_output().stdout).replace(&local_text, "DIR")
    );
    tlio_s3()
        .args(["ckpt", "latest", &remote2])
        .assert()
        .code(1);
}
