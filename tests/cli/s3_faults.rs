//! The commits on object storage when the network misbehaves: tlio against the local S3
//! server behind the project's fault-injecting proxy (tests/fault_proxy.py), which
//! lets the server store a request and then loses the reply (the connection dropped,
//! or a 500 sent after the write), drops requests, or holds them.
//!
//! What must hold: a reply lost after the server applied a commit is settled by reading
//! the object back, so a committed step, a pack's manifest or a part's marker is never
//! taken for another writer's and its objects are never deleted; a gc whose grace is
//! shorter than a live writer's upload makes that writer fail instead of committing an
//! attempt with missing objects, and `keep` counts only steps it has verified; a step
//! that cannot be reached is an error, never a reason to load an older step.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use super::s3::{ask, bucket, model_file, python, server, stdout_of, tlio_s3, tlio_s3_std};

/// The fault proxy in front of the test server, and its request channel.
struct Proxy {
    url: String,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    child: Child,
}

impl Proxy {
    fn start() -> Proxy {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fault_proxy.py");
        let mut child = StdCommand::new(python())
            .arg(script)
            .arg(&server().url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start tests/fault_proxy.py");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut url = String::new();
        stdout.read_line(&mut url).unwrap();
        let url = url.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        Proxy {
            url,
            stdin,
            stdout,
            child,
        }
    }

    /// One request line; its `ok` value.
    fn ask(&mut self, request: &str) -> String {
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        match line.trim_end().strip_prefix("ok") {
            Some(v) => v.trim().to_string(),
            None => panic!("{request}: {line}"),
        }
    }

    /// Add a rule (see the proxy's doc); its id.
    fn rule(&mut self, method: &str, pattern: &str, nth: &str, action: &str) -> String {
        self.ask(&format!("rule {method} {pattern} {nth} {action} 0"))
    }

    /// How many requests rule `id` acted on.
    fn hits(&mut self, id: &str) -> u64 {
        self.ask(&format!("hits {id}")).parse().unwrap()
    }

    /// `ckpt save REMOTE --step STEP [EXTRA] --model MODEL` through the proxy.
    fn save(
        &self,
        remote: &str,
        step: &str,
        extra: &[&str],
        model: &Path,
    ) -> assert_cmd::assert::Assert {
        self.tlio()
            .args(["ckpt", "save", remote, "--step", step])
            .args(extra)
            .arg("--model")
            .arg(model)
            .timeout(Duration::from_secs(120))
            .assert()
    }

    /// `tlio` with the proxy as its endpoint.
    fn tlio(&self) -> assert_cmd::Command {
        let mut cmd = tlio_s3();
        cmd.env("AWS_ENDPOINT_URL", &self.url);
        cmd
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn stderr_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stderr).to_string()
}

/// The steps `ckpt verify --json` finds in `remote` (straight to the server), each
/// with its status.
fn verified(remote: &str) -> Vec<(u64, String)> {
    let out = tlio_s3()
        .args(["--json", "ckpt", "verify", remote])
        .assert();
    let v = json(&String::from_utf8_lossy(&out.get_output().stdout));
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["step"].as_u64().unwrap(),
                s["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The step `ckpt latest` names (straight to the server).
fn latest(remote: &str) -> String {
    stdout_of(tlio_s3().args(["ckpt", "latest", remote]))
}

/// A safetensors file of one F32 tensor `[2]` holding `a`, `b`.
fn small_model(dir: &Path, name: &str, a: f32, b: f32) -> std::path::PathBuf {
    let path = dir.join(name);
    let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend(a.to_le_bytes());
    bytes.extend(b.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_lost_reply_to_the_commit_keeps_the_committed_step() {
    let tmp = tempfile::tempdir().unwrap();
    let first = small_model(tmp.path(), "a.safetensors", 1.0, 2.0);
    let second = small_model(tmp.path(), "b.safetensors", 3.0, 4.0);
    let mut proxy = Proxy::start();
    for action in ["store-drop", "store-500"] {
        let b = bucket();
        let remote = format!("s3://{b}/ckpt");
        let manifest = format!("^/{b}/ckpt/step-000001/MANIFEST\\.json$");
        // The server creates the manifest; its reply is lost.
        let lost = proxy.rule("PUT", &manifest, "1", action);
        let out = proxy.save(&remote, "1", &[], &first);
        assert_eq!(proxy.hits(&lost), 1, "{action}");
        assert!(
            out.get_output().status.success(),
            "{action}: {}",
            stderr_of(&out)
        );
        assert_eq!(verified(&remote), [(1, "ok".to_string())], "{action}");
        assert_eq!(latest(&remote).trim_end(), format!("{remote}/step-000001"));

        // Replacing a sound step (--overwrite, If-Match), the reply lost again; LATEST's
        // conditional replace loses its reply too (a second save, step 2).
        let lost = proxy.rule("PUT", &manifest, "1", action);
        let out = proxy.save(&remote, "1", &["--overwrite"], &second);
        assert_eq!(proxy.hits(&lost), 1, "{action}");
        assert!(
            out.get_output().status.success(),
            "{action}: {}",
            stderr_of(&out)
        );
        assert_eq!(verified(&remote), [(1, "ok".to_string())], "{action}");
        let exported = tmp.path().join(format!("export-{action}"));
        tlio_s3()
            .args(["ckpt", "export", &format!("{remote}/step-000001"), "-o"])
            .arg(&exported)
            .assert()
            .success();
        let got = std::fs::read(exported.join("model.safetensors")).unwrap();
        assert!(got.ends_with(&[3.0f32.to_le_bytes(), 4.0f32.to_le_bytes()].concat()));

        let latest_rule = proxy.rule("PUT", &format!("^/{b}/ckpt/LATEST$"), "1", action);
        let out = proxy.save(&remote, "2", &[], &first);
        assert_eq!(proxy.hits(&latest_rule), 1, "{action}");
        let err = stderr_of(&out);
        assert!(out.get_output().status.success(), "{action}: {err}");
        assert!(!err.contains("cannot move"), "{action}: {err}");
        let latest_key = tmp.path().join(format!("LATEST-{action}"));
        ask(&format!("get {b} ckpt/LATEST {}", latest_key.display()));
        assert_eq!(
            std::fs::read_to_string(&latest_key).unwrap(),
            "step-000002\n"
        );
    }
}

#[test]
fn a_request_the_server_never_saw_is_sent_again() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let mut proxy = Proxy::start();
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    let dropped = proxy.rule(
        "PUT",
        &format!("^/{b}/ckpt/step-000001/MANIFEST\\.json$"),
        "1",
        "drop",
    );
    proxy
        .tlio()
        .args(["ckpt", "save", &remote, "--step", "1", "--model"])
        .arg(&model)
        .timeout(Duration::from_secs(120))
        .assert()
        .success();
    assert_eq!(proxy.hits(&dropped), 1);
    assert_eq!(verified(&remote), [(1, "ok".to_string())]);
}

#[test]
fn a_lost_reply_to_a_packs_manifest_or_a_parts_marker_keeps_what_it_names() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("corpus.txt");
    std::fs::write(
        &input,
        "the quick brown fox jumps over the lazy dog\n".repeat(200),
    )
    .unwrap();
    let mut proxy = Proxy::start();
    for action in ["store-drop", "store-500"] {
        let b = bucket();
        let out = format!("s3://{b}/data/fw");
        let lost = proxy.rule(
            "PUT",
            &format!("^/{b}/data/fw\\.manifest\\.json$"),
            "1",
            action,
        );
        let report = proxy
            .tlio()
            .args([
                "--json",
                "tokens",
                "pack",
                "--shard-tokens",
                "3000",
                "-o",
                &out,
            ])
            .arg(&input)
            .timeout(Duration::from_secs(120))
            .assert();
        assert_eq!(proxy.hits(&lost), 1, "{action}");
        assert!(
            report.get_output().status.success(),
            "{action}: {}",
            stderr_of(&report)
        );
        let keys = ask(&format!("keys {b} data/"));
        assert_eq!(
            keys, "data/fw.manifest.json data/fw_000000.bin data/fw_000001.bin data/fw_000002.bin",
            "{action}"
        );
        // Readers find every shard the manifest names; a rerun is complete.
        let cache = tmp.path().join(format!("cache-{action}"));
        tlio_s3()
            .env("TLIO_CACHE_DIR", &cache)
            .args(["tokens", "windows", &format!("{out}.manifest.json")])
            .args(["--seq-len", "8", "--batch", "2", "--batches", "3"])
            .assert()
            .success();
        let again = tlio_s3()
            .args(["tokens", "pack", "--shard-tokens", "3000", "-o", &out])
            .arg(&input)
            .assert()
            .success();
        assert!(
            stderr_of(&again).contains("already complete"),
            "{}",
            stderr_of(&again)
        );
        assert_eq!(ask(&format!("keys {b} data/")), keys);

        // Parts: part 0's marker and the merge's manifest lose their replies.
        let parted = format!("s3://{b}/parted/fw");
        let marker = proxy.rule(
            "PUT",
            &format!("^/{b}/parted/fw\\.parts/0-of-2/complete\\.json$"),
            "1",
            action,
        );
        for k in 0..2 {
            let doc = json(&stdout_of(
                proxy
                    .tlio()
                    .args(["--json", "tokens", "pack", "--shard-tokens", "3000"])
                    .args(["-o", &parted, "--part", &format!("{k}/2")])
                    .arg(&input)
                    .timeout(Duration::from_secs(120)),
            ));
            assert_eq!(doc["status"], "packed", "{action}: {doc}");
        }
        assert_eq!(proxy.hits(&marker), 1, "{action}");
        let merged = proxy.rule(
            "PUT",
            &format!("^/{b}/parted/fw\\.manifest\\.json$"),
            "1",
            action,
        );
        proxy
            .tlio()
            .args(["tokens", "merge", &parted])
            .timeout(Duration::from_secs(120))
            .assert()
            .success();
        assert_eq!(proxy.hits(&merged), 1, "{action}");
        assert_eq!(
            ask(&format!("keys {b} parted/fw_")),
            "parted/fw_000000.bin parted/fw_000001.bin parted/fw_000002.bin",
            "{action}"
        );
    }
}

#[test]
fn gc_during_a_live_upload_makes_the_writer_fail_and_keep_spares_the_last_sound_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    tlio_s3()
        .args(["ckpt", "save", &remote, "--step", "10", "--model"])
        .arg(&model)
        .assert()
        .success();
    // A writer held after its uploads, before its commit, while a gc with a short grace
    // removes its attempt.
    let mut writer = tlio_s3_std();
    writer
        .env("FAILPOINTS", "s3/commit=sleep(4000)")
        .args([
            "ckpt", "save", &remote, "--step", "20", "--keep", "1", "--model",
        ])
        .arg(&model)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let writer = writer.spawn().unwrap();
    let started = Instant::now();
    while !ask(&format!("keys {b} ckpt/step-000020/")).contains("state.json") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the writer uploaded nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1200));
    let gc = json(&stdout_of(tlio_s3().args([
        "--json", "ckpt", "gc", &remote, "--keep", "2", "--grace", "1",
    ])));
    assert_eq!(gc["removed"][0]["reason"], "abandoned attempt", "{gc}");
    let out = writer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("nothing was committed"), "{err}");
    assert!(!ask(&format!("keys {b} ckpt/")).contains("step-000020/MANIFEST.json"));
    assert_eq!(latest(&remote).trim_end(), format!("{remote}/step-000010"));
}

#[test]
fn a_step_that_cannot_be_reached_is_an_error_not_a_fallback() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    for step in ["10", "20"] {
        tlio_s3()
            .args(["ckpt", "save", &remote, "--step", step, "--model"])
            .arg(&model)
            .assert()
            .success();
    }
    let mut proxy = Proxy::start();
    // Every read of step 20's objects is dropped; its listing still shows it.
    proxy.rule("GET", &format!("^/{b}/ckpt/step-000020/"), "*", "drop");
    let out = proxy
        .tlio()
        .args(["ckpt", "latest", &remote])
        .timeout(Duration::from_secs(120))
        .assert()
        .code(2);
    let err = stderr_of(&out);
    assert!(
        err.contains("step-000020") && err.contains("cannot reach the server"),
        "{err}"
    );
    assert!(out.get_output().stdout.is_empty());
}

#[test]
fn failpoint_return_aborts_at_the_commit_or_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    let out = tlio_s3_std()
        .env("FAILPOINTS", "s3/commit=return")
        .args(["ckpt", "save", &remote, "--step", "1", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    // A crash at that instant: no exit code, no "internal error", nothing committed.
    assert_eq!(
        out.status.code(),
        None,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("internal error"));
    let keys = ask(&format!("keys {b} ckpt/"));
    assert!(!keys.contains("MANIFEST.json"), "{keys}");
    let out = tlio_s3()
        .env("FAILPOINTS", "model/before-commit=return")
        .args(["ckpt", "save", &remote, "--step", "1", "--model"])
        .arg(&model)
        .assert()
        .code(2);
    assert!(
        stderr_of(&out).contains("return is not supported"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(ask(&format!("keys {b} ckpt/")), keys);
}

#[test]
fn gc_that_cannot_list_the_prefix_fails_instead_of_finding_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    let remote = format!("s3://{b}/ckpt");
    for step in ["10", "20"] {
        tlio_s3()
            .args(["ckpt", "save", &remote, "--step", step, "--model"])
            .arg(&model)
            .assert()
            .success();
    }
    let mut proxy = Proxy::start();
    for (action, dry) in [
        ("drop", true),
        ("drop", false),
        ("store-500", false),
        ("store-drop", false),
    ] {
        proxy.ask("clear");
        // Every request is dropped before the server sees it, or its reply is lost.
        let all = proxy.rule("*", ".*", "*", action);
        let mut cmd = proxy.tlio();
        cmd.args(["ckpt", "gc", &remote, "--keep", "1"]);
        if dry {
            cmd.arg("--dry-run");
        }
        let out = cmd.timeout(Duration::from_secs(120)).assert().code(2);
        let err = stderr_of(&out);
        assert!(
            err.contains(&format!("cannot collect garbage in {remote}"))
                && !err.contains("nothing to remove"),
            "{action}: {err}"
        );
        assert!(out.get_output().stdout.is_empty(), "{action}");
        assert!(proxy.hits(&all) > 0, "{action}");
    }
    // Nothing was removed: both steps are still there.
    assert_eq!(
        verified(&remote)
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>(),
        [10, 20]
    );
}

#[test]
fn a_refused_token_or_key_is_a_refusal_naming_the_servers_code() {
    let b = bucket();
    let remote = format!("s3://{b}/run");
    let mut proxy = Proxy::start();
    for (status, code) in [
        ("400", "InvalidToken"),
        ("400", "ExpiredToken"),
        ("403", "InvalidAccessKeyId"),
        ("403", "SignatureDoesNotMatch"),
        ("403", "AccessDenied"),
    ] {
        proxy.ask("clear");
        proxy.ask(&format!("rule GET /{b} * answer {status} {code}"));
        let out = proxy
            .tlio()
            .args(["ckpt", "latest", &remote])
            .timeout(Duration::from_secs(60))
            .assert()
            .code(2);
        let err = stderr_of(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&remote) && err.contains(code), "{err}");
        assert!(
            err.contains(&format!("refused the request: {status} ")),
            "{err}"
        );
        assert_eq!(err.matches("refused").count(), 1, "{err}");
    }
    // A HEAD's reply has no body, hence no code: the status once, and what was asked.
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    ask(&format!("put {b} m.safetensors {}", model.display()));
    proxy.ask("clear");
    proxy.ask(&format!("rule HEAD /{b} * answer 403 AccessDenied"));
    let url = format!("s3://{b}/m.safetensors");
    let out = proxy
        .tlio()
        .args(["st", "inspect", &url])
        .timeout(Duration::from_secs(60))
        .assert()
        .code(2);
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&url) && err.contains("HEAD"), "{err}");
    assert_eq!(err.matches("403 Forbidden").count(), 1, "{err}");
    assert!(!err.trim_end().ends_with(':'), "{err}");
}
