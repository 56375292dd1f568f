//! `s3://` URLs against a real local S3 server (moto, started here through the test
//! virtual environment's Python by `tests/s3_server.py`, on 127.0.0.1 and a free port):
//! `st inspect` and `tokens header` of objects uploaded with boto3 give the local
//! results, and a server that is down, a missing bucket or object, missing
//! credentials and malformed URLs each give one clear error naming the URL.
//!
//! The server is started once per test binary and stops when this process exits (its
//! standard input closes). Without a Python that has moto the tests fail: they are
//! never skipped.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command as StdCommand, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::tlio;

/// The server process and its request channel.
pub(crate) struct Server {
    pub(crate) url: String,
    channel: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _child: Child,
}

/// The Python of the test virtual environment: `TLIO_TEST_PYTHON`, else `.venv` at the
/// repository root (where `tests/run` makes it).
pub(crate) fn python() -> PathBuf {
    std::env::var_os("TLIO_TEST_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
        PathBuf::from,
    )
}

pub(crate) fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_server.py");
        let mut child = StdCommand::new(python())
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the local S3 server with {} (run bash tests/run, which installs moto): {e}",
                    python().display()
                )
            });
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut url = String::new();
        stdout.read_line(&mut url).unwrap();
        // The first line is `URL KEY SECRET`; this server checks no signature, so the
        // test credentials of `tlio_s3` work.
        let line = url;
        let url = line.split_whitespace().next().unwrap_or("").to_string();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "the local S3 server did not start (is moto installed in {}?): {line:?}",
            python().display()
        );
        Server {
            url,
            channel: Mutex::new((stdin, stdout)),
            _child: child,
        }
    })
}

/// Send one request line to the server; its `ok` value.
pub(crate) fn ask(request: &str) -> String {
    let s = server();
    let mut guard = s.channel.lock().unwrap();
    let (stdin, stdout) = &mut *guard;
    writeln!(stdin, "{request}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let line = line.trim_end();
    match line.strip_prefix("ok") {
        Some(v) => v.trim().to_string(),
        None => panic!("{request}: {line}"),
    }
}

/// A fresh bucket for one test.
pub(crate) fn bucket() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "tlio-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    ask(&format!("bucket {name}"));
    name
}

/// The AWS variables a test command clears: only the server's own ones are set.
const CLEARED_AWS_VARS: [&str; 4] = [
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
];

/// The server's endpoint and the test credentials.
fn server_vars() -> [(&'static str, String); 3] {
    [
        ("AWS_ENDPOINT_URL", server().url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
    ]
}

/// `tlio` with the server's endpoint and test credentials, and no other AWS variable.
pub(crate) fn tlio_s3() -> assert_cmd::Command {
    let mut cmd = tlio();
    for var in CLEARED_AWS_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(server_vars());
    cmd
}

/// The first key under `prefix` of bucket `b` that `matches`.
pub(crate) fn find_key(b: &str, prefix: &str, matches: impl Fn(&str) -> bool) -> String {
    let keys = ask(&format!("keys {b} {prefix}"));
    keys.split(' ')
        .find(|k| matches(k))
        .unwrap_or_else(|| panic!("no such key under {prefix}: {keys}"))
        .to_string()
}

/// Flip the last byte of object `key` of bucket `b` (same size, other bytes), through
/// files in `dir`; returns the path of a copy of the undamaged object, to put back.
pub(crate) fn flip_last_byte_of_object(dir: &Path, b: &str, key: &str) -> PathBuf {
    let good = dir.join(format!("good-{}", key.replace('/', "-")));
    ask(&format!("get {b} {key} {}", good.display()));
    let mut bytes = std::fs::read(&good).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let bad = dir.join(format!("bad-{}", key.replace('/', "-")));
    std::fs::write(&bad, &bytes).unwrap();
    ask(&format!("put {b} {key} {}", bad.display()));
    good
}

/// [`tlio_s3`] as a `std` command (no failpoint set), for a child a test holds or
/// kills.
pub(crate) fn tlio_s3_std() -> StdCommand {
    let mut cmd = StdCommand::new(env!("CARGO_BIN_EXE_tlio"));
    for var in CLEARED_AWS_VARS.into_iter().chain(["FAILPOINTS"]) {
        cmd.env_remove(var);
    }
    cmd.envs(server_vars());
    cmd
}

pub(crate) fn model_file(dir: &Path) -> PathBuf {
    let path = dir.join("model.safetensors");
    let header = br#"{"__metadata__":{"format":"pt"},"wte":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend((0..6u32).flat_map(|i| (i as f32).to_le_bytes()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn shard_file(dir: &Path) -> PathBuf {
    let path = dir.join("shard.bin");
    let mut header = [0u8; 1024];
    for (i, w) in [20240520i32, 1, 5, 50257].iter().enumerate() {
        header[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    let mut bytes = header.to_vec();
    bytes.extend((0..5u16).flat_map(u16::to_le_bytes));
    std::fs::write(&path, bytes).unwrap();
    path
}

pub(crate) fn stdout_of(cmd: &mut assert_cmd::Command) -> String {
    String::from_utf8(cmd.assert().success().get_output().stdout.clone()).unwrap()
}

#[test]
fn st_inspect_of_an_object_matches_the_local_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    ask(&format!("put {b} models/m.safetensors {}", model.display()));
    let url = format!("s3://{b}/models/m.safetensors");
    let remote = stdout_of(tlio_s3().args(["--json", "st", "inspect", &url]));
    let local = stdout_of(tlio().args(["--json", "st", "inspect"]).arg(&model));
    let strip = |text: &str| {
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        for f in v["files"].as_array_mut().unwrap() {
            f.as_object_mut().unwrap().remove("path");
        }
        v
    };
    assert_eq!(strip(&remote), strip(&local));
    let doc: serde_json::Value = serde_json::from_str(&remote).unwrap();
    assert_eq!(doc["files"][0]["path"], url.as_str());
    // The table names the URL too.
    let table = stdout_of(tlio_s3().args(["st", "inspect", &url]));
    assert!(table.contains("wte"), "{table}");
}

#[test]
fn tokens_header_of_an_object_matches_the_local_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = shard_file(tmp.path());
    let b = bucket();
    ask(&format!("put {b} data/shard.bin {}", shard.display()));
    let url = format!("s3://{b}/data/shard.bin");
    let remote = stdout_of(tlio_s3().args(["--json", "tokens", "header", &url]));
    let local = stdout_of(tlio().args(["--json", "tokens", "header"]).arg(&shard));
    assert_eq!(
        remote.replace(&url, "FILE"),
        local.replace(&shard.display().to_string(), "FILE")
    );
    assert!(remote.contains("\"valid\":true"), "{remote}");
}

#[test]
fn an_invalid_object_is_a_no_answer_naming_the_url() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk");
    std::fs::write(&junk, b"PK\x03\x04 this is no safetensors file").unwrap();
    let b = bucket();
    ask(&format!("put {b} junk.safetensors {}", junk.display()));
    let url = format!("s3://{b}/junk.safetensors");
    let out = tlio_s3().args(["st", "inspect", &url]).assert().code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.starts_with("tlio: error: cannot inspect s3://"),
        "{err}"
    );
    assert!(err.contains(&url) && err.contains("zip archive"), "{err}");
}

#[test]
fn missing_objects_and_buckets_are_errors_naming_the_url() {
    let b = bucket();
    let url = format!("s3://{b}/absent.safetensors");
    let out = tlio_s3().args(["st", "inspect", &url]).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains(&url) && err.contains("no such object"),
        "{err}"
    );

    let url = "s3://no-such-bucket-here/m.safetensors";
    let out = tlio_s3().args(["tokens", "header", url]).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains(url) && err.contains("no such bucket"), "{err}");
}

#[test]
fn missing_credentials_fail_at_once_naming_the_variable() {
    let b = bucket();
    let url = format!("s3://{b}/m.safetensors");
    let start = Instant::now();
    let out = tlio_s3()
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args(["st", "inspect", &url])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains(&url) && err.contains("AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_server_that_is_down_is_an_error_within_seconds() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    let out = tlio_s3()
        .env("AWS_ENDPOINT_URL", &endpoint)
        .args(["st", "inspect", "s3://some-bucket/m.safetensors"])
        .timeout(Duration::from_secs(60))
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains("s3://some-bucket/m.safetensors") && err.contains("cannot reach the server"),
        "{err}"
    );
    assert!(err.contains(&endpoint), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn malformed_urls_and_plain_http_elsewhere_are_refused() {
    for (url, rule) in [
        ("s3://", "no bucket name"),
        ("s3://Bad_Bucket/k", "breaks S3's rules"),
        ("s3://bucket//k", "empty segment"),
        ("s3://bucket/a/../k", "\"..\" segment"),
    ] {
        let out = tlio_s3().args(["st", "inspect", url]).assert().code(1);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(
            err.contains("not a valid s3://bucket/key URL") && err.contains(rule),
            "{url}: {err}"
        );
    }
    let out = tlio_s3()
        .env("AWS_ENDPOINT_URL", "http://192.0.2.1:9000")
        .args(["tokens", "header", "s3://bucket/x.bin"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains("AWS_ENDPOINT_URL") && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn st_inspect_stats_of_an_object_matches_the_local_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_file(tmp.path());
    let b = bucket();
    ask(&format!("put {b} models/m.safetensors {}", model.display()));
    let url = format!("s3://{b}/models/m.safetensors");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let remote = stdout_of(
        tlio_s3()
            .env("TMPDIR", &scratch)
            .args(["--json", "st", "inspect", "--stats", &url]),
    );
    let local = stdout_of(
        tlio()
            .args(["--json", "st", "inspect", "--stats"])
            .arg(&model),
    );
    assert_eq!(
        remote.replace(&url, "FILE"),
        local.replace(&model.display().to_string(), "FILE")
    );
    assert!(remote.contains("\"max\":5.0"), "{remote}");
    // The downloaded copy is gone once the command ends.
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
    // An object that is no safetensors file fails on its header, naming the URL.
    let junk = tmp.path().join("junk");
    std::fs::write(&junk, b"PK\x03\x04 this is no safetensors file").unwrap();
    ask(&format!("put {b} junk.safetensors {}", junk.display()));
    let bad = format!("s3://{b}/junk.safetensors");
    let out = tlio_s3()
        .args(["st", "inspect", "--stats", &bad])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains(&bad) && err.contains("zip archive"), "{err}");
}

#[test]
fn tokens_header_check_ids_of_objects_gives_the_local_verdicts() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let good = shard_file(tmp.path());
    // Its ids are 0..5: all below the header's 50257; the copy records 3.
    let oov = tmp.path().join("oov.bin");
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[12..16].copy_from_slice(&3i32.to_le_bytes());
    std::fs::write(&oov, bytes).unwrap();
    let b = bucket();
    ask(&format!("put {b} data/shard.bin {}", good.display()));
    ask(&format!("put {b} data/oov.bin {}", oov.display()));
    for (flags, local, name, code) in [
        (&["--check-ids"][..], &good, "shard.bin", 0),
        (&["--check-ids"][..], &oov, "oov.bin", 1),
        (&["--vocab-size", "50257"][..], &good, "shard.bin", 0),
        (&["--vocab-size", "5"][..], &good, "shard.bin", 1),
    ] {
        let url = format!("s3://{b}/data/{name}");
        let run = |cmd: &mut assert_cmd::Command| {
            let out = cmd.output().unwrap();
            assert_eq!(out.status.code(), Some(code), "{flags:?} {name}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let remote = run(tlio_s3()
            .env("TLIO_CACHE_DIR", &cache)
            .args(["--json", "tokens", "header"])
            .args(flags)
            .arg(&url));
        let here = run(tlio()
            .args(["--json", "tokens", "header"])
            .args(flags)
            .arg(local));
        assert_eq!(
            remote.replace(&url, "FILE"),
            here.replace(&local.display().to_string(), "FILE"),
            "{flags:?} {name}"
        );
        if name == "oov.bin" {
            assert!(
                remote.contains("is not below the vocabulary size"),
                "{remote}"
            );
        }
    }
    // A missing object is an error naming it (exit 2), as without the flag.
    let out = tlio_s3()
        .env("TLIO_CACHE_DIR", &cache)
        .args([
            "tokens",
            "header",
            "--check-ids",
            &format!("s3://{b}/data/none.bin"),
        ])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains("none.bin") && err.contains("no such object"),
        "{err}"
    );
}

#[test]
fn st_verify_of_an_int4_object_checks_its_scales_as_the_local_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    let good = crate::fixture("models/int4/quantized-g8.safetensors");
    let bad = crate::models::bad_scale(tmp.path(), 0x7e00);
    for (name, local, code) in [("good", &good, 0), ("bad", &bad, 1)] {
        ask(&format!(
            "put {b} int4/{name}.safetensors {}",
            local.display()
        ));
        let url = format!("s3://{b}/int4/{name}.safetensors");
        let run = |cmd: &mut assert_cmd::Command| {
            let out = cmd.output().unwrap();
            assert_eq!(out.status.code(), Some(code), "{name}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let remote = run(tlio_s3().args(["--json", "st", "verify", &url]));
        let here = run(tlio().args(["--json", "st", "verify"]).arg(local));
        assert_eq!(
            remote.replace(&url, "FILE"),
            here.replace(&local.display().to_string(), "FILE"),
            "{name}"
        );
        if code == 1 {
            assert!(
                remote.contains("int4-scales") && remote.contains("finite and >= 0"),
                "{remote}"
            );
            // --stats refuses the bad scale as it does locally, naming the tensor.
            let out = tlio_s3()
                .args(["st", "inspect", "--stats", &url])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{out:?}");
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(
                err.contains(&url) && err.contains("brain.weight.scales"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_model_directory_and_its_index_in_storage_inspect_and_verify_as_the_local_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let m = crate::sharded_model(tmp.path(), "m");
    let b = bucket();
    let names: Vec<String> = std::fs::read_dir(&m)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for name in &names {
        ask(&format!(
            "put {b} models/m/{name} {}",
            m.join(name).display()
        ));
    }
    let prefix = format!("s3://{b}/models/m");
    let index = "model.safetensors.index.json";
    let pairs = [
        (prefix.clone(), m.clone()),
        (format!("{prefix}/{index}"), m.join(index)),
    ];
    for (there, here) in &pairs {
        let same = |args: &[&str], code: i32| {
            let remote = tlio_s3().args(args).arg(there).output().unwrap();
            let local = tlio().args(args).arg(here).output().unwrap();
            assert_eq!(
                remote.status.code(),
                Some(code),
                "{args:?} {there}: {remote:?}"
            );
            assert_eq!(
                local.status.code(),
                Some(code),
                "{args:?} {here:?}: {local:?}"
            );
            let remote = String::from_utf8(remote.stdout).unwrap();
            assert_eq!(
                remote.replace(&prefix, "DIR"),
                String::from_utf8(local.stdout)
                    .unwrap()
                    .replace(&m.display().to_string(), "DIR"),
                "{args:?} {there}"
            );
            remote
        };
        let shown = same(&["--json", "st", "inspect"], 0);
        assert!(shown.contains("\"kind\""), "{shown}");
        same(&["st", "inspect"], 0);
        let stats = same(&["--json", "st", "inspect", "--stats"], 0);
        assert!(stats.contains("\"stats\""), "{stats}");
        same(&["--json", "st", "verify", "--canonical", "--finite"], 0);
    }

    // A shard missing in storage is the local finding; a prefix holding nothing is an
    // error naming it.
    let shard = names
        .iter()
        .find(|n| n.ends_with(".safetensors") && n.contains("-of-"))
        .unwrap();
    ask(&format!("delete {b} models/m/{shard}"));
    std::fs::remove_file(m.join(shard)).unwrap();
    let remote = tlio_s3()
        .args(["--json", "st", "verify", &prefix])
        .output()
        .unwrap();
    let local = tlio()
        .args(["--json", "st", "verify"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(remote.status.code(), Some(1), "{remote:?}");
    assert_eq!(
        String::from_utf8(remote.stdout)
            .unwrap()
            .replace(&prefix, "DIR"),
        String::from_utf8(local.stdout)
            .unwrap()
            .replace(&m.display().to_string(), "DIR")
    );
    let out = tlio_s3()
        .args(["st", "inspect", &format!("s3://{b}/models/none")])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains(&format!("s3://{b}/models/none")), "{err}");
}
