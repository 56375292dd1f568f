//! Hostile use across command groups: sizes from flags, the FAILPOINTS variable,
//! output paths that are not regular files, outputs that are inputs, checkpoint
//! entries that are not what they seem, and interrupted writes.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use crate::errors::assert_one_error_line;
use crate::{tlio, tmp};

/// A byte-level shard of `n` ids at `dir/name`.
fn shard(dir: &Path, name: &str, n: usize) -> PathBuf {
    let text = dir.join(format!("{name}.txt"));
    fs::write(&text, (0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
    let out = dir.join(name);
    tlio()
        .args(["-q", "tokens", "pack"])
        .arg(&text)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    out
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(path)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

/// Every entry of `dir` whose name marks it as a tlio temporary file.
fn temps(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tlio-tmp-"))
        .collect()
}

/// Run with a deadline: a command that would hang on a FIFO fails the test instead.
fn run_with_timeout(mut cmd: StdCommand, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("{cmd:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn bin() -> StdCommand {
    let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("tlio"));
    cmd.env_remove("FAILPOINTS");
    cmd
}

#[test]
fn a_malformed_failpoints_value_or_a_misspelt_tlio_failpoint_is_a_usage_error() {
    for value in [
        "garbage",
        "ckpt/fsnyc=return",
        "ckpt/fsync=bogus(",
        ";=",
        "raft/append=panic;train/after-stepp=return",
    ] {
        let out = tlio()
            .env("FAILPOINTS", value)
            .arg("--version")
            .output()
            .unwrap();
        assert_one_error_line(&out, 2, value);
        assert!(String::from_utf8_lossy(&out.stderr).contains("FAILPOINTS"));
    }
    tlio()
        .env("FAILPOINTS", "")
        .arg("--version")
        .assert()
        .success();
}

#[test]
fn another_programs_failpoints_are_ignored() {
    // FAILPOINTS is the fail crate's variable: a value meant for another program that
    // uses the crate (names outside tlio's groups, actions tlio never parses) changes
    // nothing here.
    for value in ["raft/append=panic", "before_apply=bogus(;kv/commit=return"] {
        tlio()
            .env("FAILPOINTS", value)
            .arg("--version")
            .assert()
            .success()
            .stderr("");
    }
    // tlio's own point beside another program's still applies.
    let dir = tmp();
    let model = crate::fixture("safetensors/golden/dtype_F32.safetensors");
    let ckpt = dir.path().join("ckpt");
    let out = tlio()
        .env("FAILPOINTS", "raft/append=panic;ckpt/rename=return")
        .args(["ckpt", "save"])
        .arg(&ckpt)
        .args(["--step", "1", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ckpt.join("step-000001").exists());
}

#[test]
fn huge_batch_sizes_are_one_line_before_anything_is_written() {
    let dir = tmp();
    let data = shard(dir.path(), "d.bin", 1000);
    for batch in ["1000000000000", "18446744073709551615", "2000000"] {
        let out = tlio()
            .args(["tokens", "windows"])
            .arg(&data)
            .args(["--seq-len", "8", "--batch", batch])
            .output()
            .unwrap();
        assert_one_error_line(&out, 2, batch);
        assert!(out.stdout.is_empty());
        let run = dir.path().join("run");
        let out = tlio()
            .args(["train", "bigram", "--data"])
            .arg(&data)
            .arg("--out")
            .arg(&run)
            .args(["--seq-len", "8", "--batch", batch])
            .output()
            .unwrap();
        assert_one_error_line(&out, 2, batch);
        assert!(
            !run.exists(),
            "no config.json, no .train.lock, no directory"
        );
    }
}

#[test]
fn no_writer_renames_over_a_fifo_or_directory() {
    let dir = tmp();
    let d = dir.path();
    let data = shard(d, "d.bin", 1000);
    let model = crate::fixture("safetensors/golden/dtype_F32.safetensors");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let a_dir = d.join("a_dir");
    fs::create_dir(&a_dir).unwrap();
    for target in [&fifo, &a_dir] {
        let writers: Vec<Vec<std::ffi::OsString>> = vec![
            vec![
                "tokens".into(),
                "pack".into(),
                d.join("d.bin.txt").into(),
                "-o".into(),
                target.into(),
            ],
            vec![
                "tokens".into(),
                "windows".into(),
                data.clone().into(),
                "--seq-len".into(),
                "4".into(),
                "--batch".into(),
                "2".into(),
                "--save-cursor".into(),
                target.into(),
            ],
            vec![
                "st".into(),
                "convert".into(),
                model.clone().into(),
                target.into(),
                "--dtype".into(),
                "F16".into(),
            ],
        ];
        for args in writers {
            let mut cmd = bin();
            cmd.arg("-q").args(&args);
            let out = run_with_timeout(cmd, Duration::from_secs(20));
            assert_one_error_line(&out, 2, &format!("{args:?}"));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("not a regular file"), "{err}");
            assert!(!err.contains("tlio-tmp"), "no temporary name: {err}");
            assert!(out.stdout.is_empty(), "refused before any output: {args:?}");
        }
    }
    assert!(is_fifo(&fifo), "the FIFO is still a FIFO");
    assert!(a_dir.is_dir());
    assert_eq!(temps(d), Vec::<String>::new());

    // generate man: a FIFO where a page goes.
    let man = d.join("man");
    fs::create_dir(&man).unwrap();
    mkfifo(&man.join("tlio.1"));
    let mut cmd = bin();
    cmd.args(["generate", "man"]).arg(&man);
    assert_one_error_line(&run_with_timeout(cmd, Duration::from_secs(20)), 2, "man");
    assert!(is_fifo(&man.join("tlio.1")));

    // train: a FIFO where config.json goes.
    let run = d.join("run");
    fs::create_dir(&run).unwrap();
    mkfifo(&run.join("config.json"));
    let mut cmd = bin();
    cmd.args(["train", "bigram", "--max-steps", "2", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&run);
    assert_one_error_line(&run_with_timeout(cmd, Duration::from_secs(20)), 2, "train");
    assert!(is_fifo(&run.join("config.json")));
}

#[test]
fn a_symlinked_output_replaces_the_file_it_points_to() {
    let dir = tmp();
    let d = dir.path();
    fs::create_dir(d.join("real")).unwrap();
    fs::write(d.join("real/out.bin"), b"old").unwrap();
    std::os::unix::fs::symlink("real/out.bin", d.join("link.bin")).unwrap();
    fs::write(d.join("in.txt"), b"hello").unwrap();
    tlio()
        .current_dir(d)
        .args(["-q", "tokens", "pack", "in.txt", "-o", "link.bin"])
        .assert()
        .success();
    assert!(fs::symlink_metadata(d.join("link.bin"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::metadata(d.join("real/out.bin")).unwrap().len(),
        1024 + 5 * 2
    );
    assert_eq!(temps(d), Vec::<String>::new());
    assert_eq!(temps(&d.join("real")), Vec::<String>::new());
}

#[test]
fn no_command_writes_over_its_input_even_through_a_hard_link() {
    let dir = tmp();
    let d = dir.path();
    let data = shard(d, "w.bin", 1000);
    let before = fs::read(&data).unwrap();
    fs::hard_link(&data, d.join("alias.bin")).unwrap();
    for target in [data.clone(), d.join("alias.bin")] {
        let out = tlio()
            .args(["tokens", "windows"])
            .arg(&data)
            .args(["--seq-len", "8", "--batch", "2", "--save-cursor"])
            .arg(&target)
            .output()
            .unwrap();
        assert_one_error_line(&out, 2, "save-cursor over the shard");
        assert!(out.stdout.is_empty(), "refused before any batch is printed");
    }
    let out = tlio()
        .args(["-q", "tokens", "pack"])
        .arg(d.join("alias.bin"))
        .args(["--from", "bytes", "-o"])
        .arg(&data)
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, "pack over its input");
    assert_eq!(fs::read(&data).unwrap(), before);
}

#[test]
fn outputs_follow_the_umask_replaced_files_keep_their_mode_and_parents_are_created() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    let d = dir.path();
    fs::write(d.join("in.txt"), b"hello").unwrap();
    let exe = assert_cmd::cargo::cargo_bin("tlio");
    for (mask, mode) in [("002", 0o664), ("027", 0o640)] {
        let status = StdCommand::new("sh")
            .current_dir(d)
            .env_remove("FAILPOINTS")
            .arg("-c")
            .arg(format!(
                "umask {mask} && exec \"$0\" -q tokens pack in.txt -o deep/{mask}/out.bin"
            ))
            .arg(&exe)
            .status()
            .unwrap();
        assert!(status.success());
        let meta = fs::metadata(d.join(format!("deep/{mask}/out.bin"))).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, mode, "umask {mask}");
    }
    // A file replaced keeps its own mode (read-only stays read-only), as with `sed -i`.
    let out = d.join("deep/002/out.bin");
    fs::set_permissions(&out, fs::Permissions::from_mode(0o440)).unwrap();
    tlio()
        .current_dir(d)
        .args(["-q", "tokens", "pack", "in.txt", "-o"])
        .arg(&out)
        .assert()
        .success();
    let meta = fs::metadata(&out).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o440);
}

/// Start `tokens pack - -o OUT --shard-tokens N` fed `bytes` on stdin; returns once
/// `want` temporary files exist, with the stdin pipe, which the caller keeps open so
/// the pack is still waiting for input when it is signalled.
fn pack_in_progress(
    d: &Path,
    bytes: usize,
    shard_tokens: &str,
    want: usize,
) -> (Child, std::process::ChildStdin) {
    let mut child = bin()
        .current_dir(d)
        .args(["-q", "tokens", "pack", "-", "-o", "out.bin"])
        .args(["--shard-tokens", shard_tokens])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![7u8; bytes]).unwrap();
    stdin.flush().unwrap();
    let start = Instant::now();
    while temps(d).len() < want {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pack never wrote {want} temporary files"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, stdin)
}

#[test]
fn sigint_and_sigterm_remove_every_temporary_file() {
    for (sig, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
    ] {
        let dir = tmp();
        let d = dir.path();
        let (child, stdin) = pack_in_progress(d, 2_500_000, "1000000", 3);
        // SAFETY: signalling our own child process by its id.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        // stdin stays open until the child has exited: the pack can only end by the
        // signal, never by reaching the end of its input.
        let out = child.wait_with_output().unwrap();
        drop(stdin);
        assert_one_error_line(&out, code, name);
        assert!(String::from_utf8_lossy(&out.stderr).contains(name));
        let left: Vec<_> = fs::read_dir(d).unwrap().collect();
        assert!(left.is_empty(), "{name}: nothing left, got {left:?}");
    }
}

#[test]
fn a_killed_multi_shard_pack_leaves_no_final_shard_name() {
    let dir = tmp();
    let d = dir.path();
    // Two shards complete, a third in progress: none may appear under its final name.
    let (mut child, stdin) = pack_in_progress(d, 2_500_000, "1000000", 3);
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    let finals: Vec<_> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out_"))
        .collect();
    assert!(finals.is_empty(), "{finals:?}");
    assert_eq!(temps(d).len(), 3, "what a kill -9 leaves is recognisable");
    // The next pack to the same target removes them.
    fs::write(d.join("in.txt"), b"x").unwrap();
    tlio()
        .current_dir(d)
        .args(["-q", "tokens", "pack", "in.txt", "-o", "out.bin"])
        .args(["--shard-tokens", "10"])
        .assert()
        .success();
    assert_eq!(temps(d), Vec::<String>::new());
}

/// A checkpoint directory with steps 1 and 2 (LATEST names 2), saved by `ckpt save`.
fn two_steps(d: &Path) -> PathBuf {
    let ck = d.join("ck");
    let model = crate::fixture("safetensors/golden/dtype_F32.safetensors");
    for step in ["1", "2"] {
        tlio()
            .args(["ckpt", "save"])
            .arg(&ck)
            .args([
                "--step",
                step,
                "--tokens-seen",
                "1",
                "--lr",
                "0.1",
                "--model",
            ])
            .arg(&model)
            .assert()
            .success();
    }
    ck
}

#[test]
fn a_latest_that_is_not_a_regular_file_is_malformed_and_never_blocks() {
    let dir = tmp();
    let ck = two_steps(dir.path());
    let latest = ck.join("LATEST");
    for make in ["fifo", "dir"] {
        fs::remove_file(&latest)
            .or_else(|_| fs::remove_dir(&latest))
            .unwrap();
        if make == "fifo" {
            mkfifo(&latest);
        } else {
            fs::create_dir(&latest).unwrap();
        }
        let mut cmd = bin();
        cmd.args(["ckpt", "latest"]).arg(&ck);
        let out = run_with_timeout(cmd, Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(0), "{make}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("step-000002"));
        let mut cmd = bin();
        cmd.args(["ckpt", "verify"]).arg(&ck);
        let out = run_with_timeout(cmd, Duration::from_secs(20));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{make}: malformed LATEST, {out:?}"
        );
    }
}

#[test]
fn a_bad_lock_is_refused_before_any_training_step() {
    let dir = tmp();
    let d = dir.path();
    let data = shard(d, "d.bin", 2000);
    let run = d.join("run");
    fs::create_dir_all(run.join("ckpt/.lock")).unwrap();
    let mut cmd = bin();
    cmd.args([
        "train",
        "bigram",
        "--max-steps",
        "3",
        "--ckpt-every",
        "1",
        "--data",
    ])
    .arg(&data)
    .arg("--out")
    .arg(&run);
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    assert_one_error_line(&out, 2, ".lock directory");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".lock") && err.contains("directory"), "{err}");
    assert!(!run.join("final.json").exists());

    // A symlinked .lock: save fails naming it, and never touches the link's target.
    let ck = two_steps(d);
    let outside = d.join("outside");
    std::os::unix::fs::symlink(&outside, ck.join(".lock")).unwrap_or(());
    fs::remove_file(ck.join(".lock")).unwrap();
    std::os::unix::fs::symlink(&outside, ck.join(".lock")).unwrap();
    let out = tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args([
            "--step",
            "3",
            "--tokens-seen",
            "1",
            "--lr",
            "0.1",
            "--model",
        ])
        .arg(crate::fixture("safetensors/golden/dtype_F32.safetensors"))
        .output()
        .unwrap();
    assert_one_error_line(&out, 2, ".lock symlink");
    assert!(!outside.exists());
}

/// A safetensors file of one F32 tensor `name` with `shape` (one element in all).
fn one_tensor(path: &Path, name: &str, shape: &[u64]) {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let mut json = format!(
        r#"{{"{name}":{{"dtype":"F32","shape":[{}],"data_offsets":[0,4]}}}}"#,
        dims.join(",")
    )
    .into_bytes();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(&[0u8; 4]);
    fs::write(path, bytes).unwrap();
}

#[test]
fn an_index_that_is_a_json_array_is_refused() {
    let dir = tmp();
    let d = dir.path();
    one_tensor(&d.join("s.safetensors"), "a", &[1]);
    let index = d.join("model.safetensors.index.json");
    // serde would fill the fields from the array's elements in order.
    fs::write(&index, r#" [{"total_size": 4}, {"a": "s.safetensors"}]"#).unwrap();
    let out = tlio().args(["st", "inspect"]).arg(&index).output().unwrap();
    assert_one_error_line(&out, 1, "array index");
    assert!(String::from_utf8_lossy(&out.stderr).contains("JSON object"));
    fs::write(&index, r#"{"weight_map": {"a": "s.safetensors"}}"#).unwrap();
    tlio()
        .args(["st", "inspect"])
        .arg(&index)
        .assert()
        .success();
}

#[test]
fn the_table_abbreviates_a_huge_shape_and_json_keeps_it_whole() {
    let dir = tmp();
    let p = dir.path().join("dims.safetensors");
    let long_name = "n".repeat(5000);
    one_tensor(&p, &long_name, &[1; 200_000]);
    let out = tlio().args(["st", "inspect"]).arg(&p).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("… (200000 dims)]"), "{}", &text[..300]);
    assert!(text.contains("… (3976 more bytes)"));
    assert!(text.len() < 10_000, "the table stays small: {}", text.len());
    let out = tlio()
        .args(["--json", "st", "inspect"])
        .arg(&p)
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &doc["files"][0]["tensors"][0];
    assert_eq!(t["shape"].as_array().unwrap().len(), 200_000);
    assert_eq!(t["name"].as_str().unwrap(), long_name);
}
