//! `tlio tokens`: header, pack and windows from the shell, including resuming a stream
//! across processes and one-line errors for bad shards and cursors.

use std::path::{Path, PathBuf};

use super::{tlio, tmp};

const MAGIC: i32 = 20240520;

/// A shard file with the given first header words and payload.
fn raw_shard(dir: &Path, name: &str, words: &[i32], payload: &[u8]) -> PathBuf {
    let mut bytes = vec![0u8; 1024];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    bytes.extend_from_slice(payload);
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn stdout_of(cmd: &mut assert_cmd::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `tlio tokens windows --seq-len T --batch B`, the rest to be added.
fn windows_cmd(seq_len: u32, batch: u32) -> assert_cmd::Command {
    let mut cmd = tlio();
    cmd.args(["tokens", "windows", "--seq-len"])
        .arg(seq_len.to_string())
        .arg("--batch")
        .arg(batch.to_string());
    cmd
}

/// `tlio tokens pack`, the rest to be added.
fn pack() -> assert_cmd::Command {
    let mut cmd = tlio();
    cmd.args(["tokens", "pack"]);
    cmd
}

/// Run and expect failure with `code`; returns stderr, which must be one line.
fn fails(cmd: &mut assert_cmd::Command, code: i32) -> String {
    let out = cmd.output().unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.starts_with("tlio: error: "), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {err}");
    err
}

#[test]
fn pack_ids_gives_the_worked_example_header() {
    let dir = tmp();
    let out = dir.path().join("ex.bin");
    pack()
        .args(["--from", "ids", "--vocab-size", "256", "-o"])
        .arg(&out)
        .write_stdin("1 2 3\n")
        .assert()
        .success();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), 1030);
    assert_eq!(
        &bytes[..16],
        &[0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0, 3, 0, 0, 0, 0, 1, 0, 0]
    );
    assert_eq!(&bytes[1024..], &[1, 0, 2, 0, 3, 0]);
    let json = stdout_of(tlio().args(["--json", "tokens", "header"]).arg(&out));
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["magic"], 20240520);
    assert_eq!(v["version"], 1);
    assert_eq!(v["dtype"], "uint16");
    assert_eq!(v["n"], 3);
    assert_eq!(v["vocab_size"], 256);
    assert_eq!(v["size"], 1030);
    assert_eq!(v["valid"], true);
    // Human output is a table naming the same facts.
    let table = stdout_of(tlio().args(["tokens", "header"]).arg(&out));
    // The size in human units (1030 bytes); --json above keeps the exact count.
    assert!(table.contains("20240520") && table.contains("uint16") && table.contains("1.01 KiB"));
}

#[test]
fn header_rejects_bad_shards() {
    let dir = tmp();
    let d = dir.path();
    let ok: Vec<u8> = [1u16, 2, 3].iter().flat_map(|i| i.to_le_bytes()).collect();
    let cases = [
        (
            raw_shard(d, "magic.bin", &[12345, 1, 3, 256], &ok),
            "bad magic 12345",
        ),
        (
            raw_shard(d, "version.bin", &[MAGIC, 9, 3, 256], &ok),
            "unsupported version 9",
        ),
        (
            raw_shard(
                d,
                "long.bin",
                &[MAGIC, 1, 3, 256],
                &[&ok[..], &[0, 0]].concat(),
            ),
            "size mismatch",
        ),
        (
            raw_shard(d, "cut.bin", &[MAGIC, 1, 3, 256], &ok[..5]),
            "size mismatch",
        ),
        (
            raw_shard(d, "neg.bin", &[MAGIC, 1, -1, 256], &ok),
            "negative id count -1",
        ),
        (
            raw_shard(d, "huge.bin", &[MAGIC, 2, i32::MAX, 256], &ok),
            "size mismatch",
        ),
        (
            raw_shard(d, "reserved.bin", &[MAGIC, 1, 3, 256, 1], &ok),
            "reserved header word 4",
        ),
    ];
    let short = d.join("short.bin");
    std::fs::write(&short, [0x88, 0xd8, 0x34, 0x01]).unwrap();
    for (path, want) in cases
        .iter()
        .chain([&(short.clone(), "short file: 4 bytes")])
    {
        let out = tlio()
            .args(["--json", "tokens", "header"])
            .arg(path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["valid"], false);
        let err = v["error"].as_str().unwrap();
        assert!(
            err.contains(want) && err.contains(&*path.display().to_string()),
            "{err}"
        );
        // Opening it for windows fails the same way, as one line naming the file.
        let e = fails(windows_cmd(1, 1).arg(path), 1);
        assert!(
            e.contains(want) && e.contains(&*path.display().to_string()),
            "{e}"
        );
    }
    // One bad file among good ones: every file is reported, exit 1.
    let good = raw_shard(d, "good.bin", &[MAGIC, 1, 3, 256], &ok);
    let out = tlio()
        .args(["tokens", "header"])
        .arg(&good)
        .arg(&cases[0].0)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 3);
    // An id at or above V: the header is fine, --check-ids and windows are not.
    let oov = raw_shard(d, "oov.bin", &[MAGIC, 1, 3, 3], &ok);
    tlio()
        .args(["tokens", "header"])
        .arg(&oov)
        .assert()
        .success();
    let out = tlio()
        .args(["--json", "tokens", "header", "--check-ids"])
        .arg(&oov)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("id 3 at index 2 is not below the vocabulary size 3"));
    let e = fails(windows_cmd(1, 1).arg(&oov), 1);
    assert!(
        e.contains("oov.bin") && e.contains("id 3 at index 2"),
        "{e}"
    );
    // A missing file is operational: exit 2.
    let e = fails(
        tlio().args(["tokens", "header"]).arg(d.join("missing.bin")),
        2,
    );
    assert!(e.contains("missing.bin"), "{e}");
    fails(windows_cmd(1, 1).arg(d.join("missing.bin")), 2);
}

#[test]
fn header_reads_only_the_header_of_a_huge_sparse_shard() {
    let dir = tmp();
    // The largest count a header records, as uint32: an 8.6 GB file, sparse on disk.
    let path = raw_shard(dir.path(), "huge.bin", &[MAGIC, 2, i32::MAX, 100_000], &[]);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(1024 + 4 * i32::MAX as u64).unwrap();
    let json = stdout_of(tlio().args(["--json", "tokens", "header"]).arg(&path));
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["n"], i32::MAX);
    assert_eq!(v["dtype"], "uint32");
}

fn pack_bytes(dir: &Path, text: &[u8], shard_tokens: Option<u64>) -> Vec<PathBuf> {
    let out = dir.join("data");
    let mut cmd = tlio();
    cmd.args(["--json", "tokens", "pack", "-o"])
        .arg(&out)
        .arg("-");
    if let Some(n) = shard_tokens {
        cmd.args(["--shard-tokens", &n.to_string()]);
    }
    let json = stdout_of(cmd.write_stdin(text.to_vec()));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["tokens"], text.len());
    v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| PathBuf::from(s["file"].as_str().unwrap()))
        .collect()
}

#[test]
fn pack_from_stdin_into_numbered_shards() {
    let dir = tmp();
    let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog. ".repeat(10);
    let shards = pack_bytes(dir.path(), &text, Some(128));
    let names: Vec<_> = shards
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "data_000000.bin",
            "data_000001.bin",
            "data_000002.bin",
            "data_000003.bin"
        ]
    );
    let mut ids = Vec::new();
    for s in &shards {
        let bytes = std::fs::read(s).unwrap();
        assert_eq!(i32::from_le_bytes(bytes[12..16].try_into().unwrap()), 256);
        ids.extend(bytes[1024..].chunks(2).map(|c| c[0]));
        assert!(bytes[1024..].chunks(2).all(|c| c[1] == 0));
    }
    assert_eq!(ids, text);
}

#[test]
fn pack_raw_inputs_from_files() {
    let dir = tmp();
    let d = dir.path();
    let ids: Vec<u32> = vec![5, 70_000, 0, 99_999];
    let raw = d.join("ids.u32");
    std::fs::write(
        &raw,
        ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let out = d.join("big.bin");
    pack()
        .args(["--from", "u32le", "--vocab-size", "100000", "-o"])
        .arg(&out)
        .arg(&raw)
        .arg(&raw)
        .assert()
        .success();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(
        (&bytes[0..4], &bytes[4..8]),
        (&20240801i32.to_le_bytes()[..], &7i32.to_le_bytes()[..]),
        "V > 65536 takes llm.c's Llama-3 layout"
    );
    assert_eq!(bytes.len(), 1024 + 8 * 4);
    let odd = d.join("odd.u16");
    std::fs::write(&odd, [1, 0, 2]).unwrap();
    let e = fails(
        pack()
            .args(["--from", "u16le", "--vocab-size", "10", "-o"])
            .arg(d.join("o.bin"))
            .arg(&odd),
        1,
    );
    assert!(e.contains("odd.u16") && e.contains("trailing"), "{e}");
    assert!(!d.join("o.bin").exists());
}

#[test]
fn pack_out_of_vocab_leaves_no_output() {
    let dir = tmp();
    let d = dir.path();
    let out = d.join("o.bin");
    let e = fails(
        pack()
            .args(["--from", "ids", "--vocab-size", "50", "-o"])
            .arg(&out)
            .write_stdin("1 2 3 49 50 4"),
        1,
    );
    assert!(
        e.contains("id 50 at position 4 is not below the vocabulary size 50"),
        "{e}"
    );
    // Several shards already complete when the bad id comes: none is left.
    let ids = "7 ".repeat(100) + "60";
    fails(
        pack()
            .args([
                "--from",
                "ids",
                "--vocab-size",
                "50",
                "--shard-tokens",
                "10",
                "-o",
            ])
            .arg(&out)
            .write_stdin(ids),
        1,
    );
    assert_eq!(
        std::fs::read_dir(d).unwrap().count(),
        0,
        "nothing left behind"
    );
    // Usage errors: no vocabulary for ids, a zero shard size, a missing input.
    fails(
        pack()
            .args(["--from", "ids", "-o"])
            .arg(&out)
            .write_stdin("1"),
        2,
    );
    fails(
        pack()
            .args(["--shard-tokens", "0", "-o"])
            .arg(&out)
            .write_stdin("a"),
        2,
    );
    let e = fails(pack().args(["-o"]).arg(&out).arg(d.join("nope.txt")), 2);
    assert!(e.contains("nope.txt"), "{e}");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 0);
}

fn windows(shards: &[PathBuf], seed: &str, extra: &[&str]) -> Vec<String> {
    let mut cmd = windows_cmd(5, 3);
    if !seed.is_empty() {
        cmd.args(["--seed", seed]);
    }
    cmd.args(shards).args(extra);
    stdout_of(&mut cmd).lines().map(str::to_string).collect()
}

/// The batches and cursors of `--rank R --world-size W`: side by side, the ranks'
/// rows are the single-process stream of batch B*W, and every rank prints the same
/// global cursor, which carries global_batch; out-of-range ranks are refused naming
/// the flags.
#[test]
fn windows_with_ranks_tile_the_global_batch() {
    let dir = tmp();
    let shards = pack_bytes(dir.path(), &(0u8..=200).collect::<Vec<_>>(), Some(67));
    let lines = |b: u32, extra: &[&str]| -> Vec<serde_json::Value> {
        let mut cmd = windows_cmd(4, b);
        cmd.args(["--seed", "9", "--batches", "5"])
            .args(&shards)
            .args(extra);
        stdout_of(&mut cmd)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let global = lines(6, &[]);
    let world = 3;
    let ranks: Vec<Vec<serde_json::Value>> = (0..world)
        .map(|r| {
            lines(
                2,
                &["--rank", &r.to_string(), "--world-size", &world.to_string()],
            )
        })
        .collect();
    for (i, want) in global.iter().enumerate() {
        let inputs: Vec<serde_json::Value> = ranks
            .iter()
            .flat_map(|r| r[i]["inputs"].as_array().unwrap().clone())
            .collect();
        assert_eq!(&inputs, want["inputs"].as_array().unwrap());
        assert!(want["cursor"].get("global_batch").is_none());
        for r in &ranks {
            assert_eq!(r[i]["cursor"]["global_batch"], 6);
            assert_eq!(r[i]["cursor"]["offset"], want["cursor"]["offset"]);
            assert_eq!(r[i]["cursor"]["rng"], want["cursor"]["rng"]);
        }
    }
    let e = fails(
        windows_cmd(4, 2)
            .args(["--rank", "3", "--world-size", "3"])
            .args(&shards),
        2,
    );
    assert!(
        e.contains("--rank 3") && e.contains("--world-size 3"),
        "{e}"
    );
    let out = windows_cmd(4, 2)
        .args(["--world-size", "0"])
        .args(&shards)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--world-size"));
    // A ranked cursor resumes only into the same global batch.
    let c = dir.path().join("c.json");
    stdout_of(
        windows_cmd(4, 2)
            .args(["--rank", "1", "--world-size", "3", "--save-cursor"])
            .arg(&c)
            .args(&shards),
    );
    assert!(std::fs::read_to_string(&c)
        .unwrap()
        .contains("\"global_batch\":6"));
    stdout_of(windows_cmd(4, 6).arg("--cursor").arg(&c).args(&shards));
    let e = fails(windows_cmd(4, 2).arg("--cursor").arg(&c).args(&shards), 1);
    assert!(e.contains("6") && e.contains("global_batch"), "{e}");
}

#[test]
fn windows_resume_across_processes_is_bitwise() {
    let dir = tmp();
    let text: Vec<u8> = (0..400u32).map(|i| (i * 7 % 251) as u8).collect();
    let shards = pack_bytes(dir.path(), &text, Some(90));
    let cursor = dir.path().join("c.json");
    let (n, m) = (6, 7);
    let all = windows(&shards, "42", &["--batches", &(n + m).to_string()]);
    assert_eq!(all.len(), n + m);
    let first = windows(
        &shards,
        "42",
        &[
            "--batches",
            &n.to_string(),
            "--save-cursor",
            cursor.to_str().unwrap(),
        ],
    );
    assert_eq!(first, all[..n]);
    let saved = std::fs::read_to_string(&cursor).unwrap();
    // The saved cursor is exactly the one printed with the last batch.
    assert!(
        first[n - 1].ends_with(&format!("\"cursor\":{}}}", saved.trim())),
        "{saved}"
    );
    // No seed on resume: the cursor holds the whole position, the generator's state
    // included (a seed beside it is refused).
    let rest = windows(
        &shards,
        "",
        &[
            "--batches",
            &m.to_string(),
            "--cursor",
            cursor.to_str().unwrap(),
        ],
    );
    assert_eq!(rest, all[n..]);
    // Each line: [B, T] inputs and targets shifted by one, and the cursor.
    let v: serde_json::Value = serde_json::from_str(&all[0]).unwrap();
    let inputs = v["inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), 3);
    for (x, y) in inputs.iter().zip(v["targets"].as_array().unwrap()) {
        let (x, y) = (x.as_array().unwrap(), y.as_array().unwrap());
        assert_eq!(x.len(), 5);
        assert_eq!(x[1..], y[..4]);
    }
    assert!(v["cursor"]["rng"]["inc"].as_str().unwrap().len() == 16);
}

#[test]
fn windows_rejects_bad_cursors() {
    let dir = tmp();
    let d = dir.path();
    let shards = pack_bytes(d, &[1u8; 50], None);
    let rng = r#"{"state":"185706b82c2e03f8","inc":"000000000000006d"}"#;
    let cases = [
        (
            format!(r#"{{"shard":1,"offset":0,"rng":{rng}}}"#),
            "\"shard\"",
        ),
        (
            format!(r#"{{"shard":0,"offset":51,"rng":{rng}}}"#),
            "\"offset\"",
        ),
        (
            format!(r#"{{"shard":0,"offset":-3,"rng":{rng}}}"#),
            "\"offset\"",
        ),
        (
            format!(r#"{{"shard":0,"offset":3,"rng":{rng},"extra":1}}"#),
            "unknown field `extra`",
        ),
        (
            r#"{"shard":0,"offset":3,"rng":{"state":"185706b82c2e03f8","inc":"000000000000006e"}}"#
                .to_string(),
            "inc 000000000000006e is even",
        ),
        (
            r#"{"shard":0,"offset":3,"rng":{"state":"185706b82c2e03F8","inc":"000000000000006d"}}"#
                .to_string(),
            "\"185706b82c2e03F8\" is not exactly 16 lowercase hex digits",
        ),
        ("not json".to_string(), "not a JSON document"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let c = d.join(format!("c{i}.json"));
        std::fs::write(&c, text).unwrap();
        let e = fails(
            windows_cmd(4, 1).args(["--cursor"]).arg(&c).args(&shards),
            1,
        );
        assert!(
            e.contains(field) && e.contains(&format!("c{i}.json")),
            "{e}"
        );
    }
    // The offset at the end of the shard is valid: the next read starts a new pass.
    let c = d.join("end.json");
    std::fs::write(&c, format!(r#"{{"shard":0,"offset":50,"rng":{rng}}}"#)).unwrap();
    windows_cmd(4, 1)
        .args(["--cursor"])
        .arg(&c)
        .args(&shards)
        .assert()
        .success();
    let e = fails(
        windows_cmd(4, 1)
            .args(["--cursor"])
            .arg(d.join("none.json"))
            .args(&shards),
        2,
    );
    assert!(e.contains("none.json"), "{e}");
}

#[test]
fn windows_refuses_a_shard_too_short_for_one_window() {
    let dir = tmp();
    let d = dir.path();
    let long = pack_bytes(d, &[3u8; 40], None);
    let short = raw_shard(d, "short5.bin", &[MAGIC, 1, 5, 256], &[0u8; 10]);
    let e = fails(windows_cmd(5, 1).args(&long).arg(&short), 1);
    assert!(e.contains("short5.bin") && e.contains("too short"), "{e}");
    // Exactly one window (T + 1 ids) is fine.
    windows_cmd(4, 2).arg(&short).assert().success();
    // T and B below 1 are usage errors.
    fails(windows_cmd(0, 1).arg(&short), 2);
    fails(windows_cmd(1, 0).arg(&short), 2);
}

#[test]
fn pack_draws_progress_on_a_terminal_only() {
    let dir = tmp();
    let input: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("in.txt"), &input).unwrap();
    let bar = |bytes: &[u8]| bytes.contains(&b'\r') || bytes.windows(2).any(|w| w == b"\x1b[");
    let run = super::output::run_with_tty_stderr(
        dir.path(),
        &["tokens", "pack", "in.txt", "-o", "a.bin"],
    );
    assert_eq!(run.code, Some(0));
    assert!(
        bar(&run.terminal),
        "no bar on a terminal: {:?}",
        String::from_utf8_lossy(&run.terminal)
    );
    assert!(!bar(&run.stdout));
    let quiet = super::output::run_with_tty_stderr(
        dir.path(),
        &["-q", "tokens", "pack", "in.txt", "-o", "b.bin"],
    );
    assert_eq!(quiet.code, Some(0));
    assert!(quiet.terminal.is_empty(), "-q silences the bar");
    let piped = tlio()
        .current_dir(dir.path())
        .args(["tokens", "pack", "in.txt", "-o", "c.bin"])
        .output()
        .unwrap();
    assert!(piped.status.success());
    assert!(!bar(&piped.stderr));
    let a = std::fs::read(dir.path().join("a.bin")).unwrap();
    assert_eq!(a, std::fs::read(dir.path().join("c.bin")).unwrap());
    assert_eq!(a.len(), 1024 + 2 * input.len());
}

#[test]
fn windows_into_a_closed_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    let dir = tmp();
    let shards = pack_bytes(dir.path(), &[9u8; 300], None);
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tlio"))
        .args([
            "tokens",
            "windows",
            "--seq-len",
            "8",
            "--batch",
            "4",
            "--batches",
            "10000000",
        ])
        .args(&shards)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("{\"inputs\":"));
    // The reader is gone (like `| head -1`): tlio stops with 0 and says nothing.
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn save_cursor_is_checked_before_the_work_and_written_into_a_closed_pipe() {
    use std::io::{BufRead, BufReader};
    let dir = tmp();
    let shards = pack_bytes(dir.path(), &[9u8; 300], None);
    let base = ["tokens", "windows", "--seq-len", "8", "--batch", "4"];
    // A cursor that cannot be written (here a directory: a missing parent would be
    // created, as for every output) fails before any batch is printed.
    let blocked = dir.path().join("adir");
    std::fs::create_dir(&blocked).unwrap();
    let out = tlio()
        .args(base)
        .args(["--batches", "5", "--save-cursor"])
        .arg(&blocked)
        .args(&shards)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no batch before the error");
    // The reference: the cursor after 20000 batches, stdout read to the end.
    let want = dir.path().join("want.json");
    tlio()
        .args(base)
        .args(["--batches", "20000", "--save-cursor"])
        .arg(&want)
        .args(&shards)
        .output()
        .unwrap();
    // The reader goes away after one line (`| head -1`): the file is still written,
    // with the position after every requested batch.
    let got = dir.path().join("got.json");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tlio"))
        .args(base)
        .args(["--batches", "20000", "--save-cursor"])
        .arg(&got)
        .args(&shards)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty());
    assert_eq!(
        std::fs::read(&got).unwrap(),
        std::fs::read(&want).unwrap(),
        "the cursor written into a closed pipe"
    );
}

#[test]
fn pack_shows_a_non_ascii_character_as_itself() {
    // The input "1 é 2": the error names the character, never its UTF-8 lead byte as
    // Latin-1 ('Ã'), and a bidi control in the input is escaped.
    let dir = tmp();
    for (input, want) in [
        ("1 é 2", "invalid character \"é\" at byte 2"),
        ("1 x\u{202e}", "invalid character \"x\" at byte 2"),
        ("1 \u{202e}", "invalid character \"\\u{202e}\" at byte 2"),
    ] {
        let e = fails(
            pack()
                .args(["--from", "ids", "--vocab-size", "50", "-o"])
                .arg(dir.path().join("o.bin"))
                .write_stdin(input),
            1,
        );
        assert!(e.contains(want), "{input:?}: {e}");
        assert!(!e.contains('Ã') && !e.contains('\u{202e}'), "{e}");
    }
}

#[test]
fn header_reports_every_file_read_before_the_error() {
    let dir = tmp();
    let good = raw_shard(dir.path(), "good.bin", &[20240520, 1, 2, 10], &[1, 0, 2, 0]);
    let out = tlio()
        .args(["tokens", "header"])
        .arg(&good)
        .arg(dir.path().join("missing.bin"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("good.bin") && text.contains("yes"), "{text}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("tlio: error: ") && err.contains("missing.bin"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------
// Real tokenizers: references from tiktoken and tokenizers (fixtures/gen_tokenizers.py)

/// The committed reference data of the real tokenizer libraries.
fn tok_fixture(name: &str) -> PathBuf {
    super::fixture("tokenizers").join(name)
}

/// The 256 header words and the id bytes of a shard file.
fn split_shard(bytes: &[u8]) -> (Vec<i32>, &[u8]) {
    let words = bytes[..1024]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (words, &bytes[1024..])
}

/// The ids of a shard, read as llm.c would (uint16 for 20240520 v1, else uint32).
fn shard_ids(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    let (words, ids) = split_shard(&bytes);
    if words[0] == MAGIC && words[1] == 1 {
        ids.chunks(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    } else {
        ids.chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// llm.c's `llmc/dataloader.h` checks on a GPT-2 shard, reproduced: magic 20240520,
/// version 1, ntok > 0, file size = 256 * 4 + ntok * 2.
fn llmc_dataloader_accepts(path: &Path) -> Result<i64, String> {
    let bytes = std::fs::read(path).unwrap();
    if bytes.len() < 1024 {
        return Err("short read of the header".into());
    }
    let (h, _) = split_shard(&bytes);
    if h[0] != 20240520 {
        return Err("Bad magic in the data file".into());
    }
    if h[1] != 1 {
        return Err("Bad version in data file".into());
    }
    let ntok = i64::from(h[2]);
    if ntok <= 0 {
        return Err("assert(ntok > 0)".into());
    }
    if bytes.len() as i64 != 256 * 4 + ntok * 2 {
        return Err("Error: file size is not as expected".into());
    }
    Ok(ntok)
}

/// llm.c's `train_llama3.py` shard loader checks, reproduced: magic 20240801, version
/// 7, the uint32 ids after the header number exactly ntok.
fn llmc_llama3_accepts(path: &Path) -> Result<i64, String> {
    let bytes = std::fs::read(path).unwrap();
    let (h, rest) = split_shard(&bytes);
    if h[0] != 20240801 {
        return Err("magic number mismatch in the data .bin file".into());
    }
    if h[1] != 7 {
        return Err("unsupported version".into());
    }
    let ntok = i64::from(h[2]);
    // np.frombuffer(f.read(), dtype=np.uint32) fails on a partial element.
    if rest.len() % 4 != 0 || (rest.len() / 4) as i64 != ntok {
        return Err("number of tokens read does not match header?".into());
    }
    Ok(ntok)
}

const ENCODINGS: [(&str, i32); 4] = [
    ("gpt2", 50257),
    ("p50k_base", 50281),
    ("cl100k_base", 100277),
    ("o200k_base", 200019),
];

/// Pack `inputs` with `args`, returning the output directory's guard.
fn pack_with(args: &[&str], inputs: &[PathBuf], out: &Path) {
    let out_put = pack()
        .args(["-q"])
        .args(args)
        .args(inputs)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        out_put.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out_put.stderr)
    );
}

#[test]
fn pack_openai_encodings_match_tiktoken_byte_for_byte_but_word_3() {
    let dir = tmp();
    let corpus = tok_fixture("corpus.jsonl");
    for (name, vocab) in ENCODINGS {
        let out = dir.path().join(format!("{name}.bin"));
        pack_with(
            &["--tokenizer", name, "--from", "jsonl"],
            std::slice::from_ref(&corpus),
            &out,
        );
        let ours = std::fs::read(&out).unwrap();
        let want = std::fs::read(tok_fixture(&format!("ref_{name}.bin"))).unwrap();
        let (ow, oids) = split_shard(&ours);
        let (ww, wids) = split_shard(&want);
        assert_eq!(ow[..3], ww[..3], "{name}: magic, version, n");
        assert_eq!(ww[3], 0, "llm.c writes no vocabulary");
        assert_eq!(ow[3], vocab, "{name}: V recorded");
        assert_eq!(ow[4..], ww[4..]);
        assert!(oids == wids, "{name}: ids differ from tiktoken's");
        // llm.c's own readers take them: GPT-2-sized by dataloader.h, the rest by
        // train_llama3.py.
        if vocab <= 65536 {
            assert_eq!(
                llmc_dataloader_accepts(&out),
                Ok(i64::from(ow[2])),
                "{name}"
            );
        } else {
            assert_eq!(llmc_llama3_accepts(&out), Ok(i64::from(ow[2])), "{name}");
            assert!(llmc_dataloader_accepts(&out).is_err());
        }
    }
}

#[test]
fn pack_val_train_shards_are_fineweb_py_shards() {
    let dir = tmp();
    let prefix = dir.path().join("fineweb");
    pack_with(
        &[
            "--tokenizer",
            "gpt2",
            "--from",
            "jsonl",
            "--val-tokens",
            "20000",
            "--shard-tokens",
            "20000",
        ],
        &[tok_fixture("corpus.jsonl"), tok_fixture("corpus.jsonl")],
        &prefix,
    );
    let mut ours: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ours.sort();
    // Each shard has its document sidecar beside it (fineweb.py writes none).
    for name in ours.iter().filter(|n| n.ends_with(".bin")) {
        let docs = format!("{}.docs", name.strip_suffix(".bin").unwrap());
        assert!(ours.contains(&docs), "{ours:?}");
    }
    ours.retain(|n| n.ends_with(".bin"));
    assert!(
        ours.contains(&"fineweb_val_000000.bin".to_string()),
        "{ours:?}"
    );
    let mut want: Vec<String> = std::fs::read_dir(super::fixture("tokenizers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fineweb_"))
        .collect();
    want.sort();
    assert!(want.len() >= 3, "{want:?}");
    assert_eq!(ours, want);
    for name in &ours {
        let o = std::fs::read(dir.path().join(name)).unwrap();
        let w = std::fs::read(tok_fixture(name)).unwrap();
        let (ow, oids) = split_shard(&o);
        let (ww, wids) = split_shard(&w);
        assert_eq!(ow[..3], ww[..3], "{name}");
        assert_eq!(ow[3], 50257, "{name}");
        assert!(oids == wids, "{name}");
        assert!(llmc_dataloader_accepts(&dir.path().join(name)).is_ok());
    }
}

#[test]
fn pack_is_the_same_for_any_thread_count_file_split_and_compression() {
    let dir = tmp();
    let corpus = std::fs::read_to_string(tok_fixture("corpus.jsonl")).unwrap();
    let want = shard_ids(&tok_fixture("ref_gpt2.bin"));
    for threads in ["1", "2", "4"] {
        let out = dir.path().join(format!("t{threads}.bin"));
        pack_with(
            &[
                "--tokenizer",
                "gpt2",
                "--from",
                "jsonl",
                "--threads",
                threads,
            ],
            &[tok_fixture("corpus.jsonl")],
            &out,
        );
        assert!(shard_ids(&out) == want, "--threads {threads}");
    }
    // Split into three files, one plain, one gzip, one zstd.
    let lines: Vec<&str> = corpus.lines().collect();
    let parts = [&lines[..7], &lines[7..20], &lines[20..]];
    let mut inputs = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let text = part.iter().map(|l| format!("{l}\n")).collect::<String>();
        let path = match i {
            0 => {
                let p = dir.path().join("a.jsonl");
                std::fs::write(&p, &text).unwrap();
                p
            }
            1 => {
                use std::io::Write;
                let p = dir.path().join("b.jsonl.gz");
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                enc.write_all(text.as_bytes()).unwrap();
                std::fs::write(&p, enc.finish().unwrap()).unwrap();
                p
            }
            _ => {
                let p = dir.path().join("c.jsonl.zst");
                // Two frames back to back, as concatenated .zst files are.
                let (x, y) = text.as_bytes().split_at(text.len() / 2);
                let mut z = ruzstd::encoding::compress_to_vec(
                    x,
                    ruzstd::encoding::CompressionLevel::Fastest,
                );
                z.extend(ruzstd::encoding::compress_to_vec(
                    y,
                    ruzstd::encoding::CompressionLevel::Fastest,
                ));
                std::fs::write(&p, z).unwrap();
                p
            }
        };
        inputs.push(path);
    }
    let out = dir.path().join("split.bin");
    pack_with(&["--tokenizer", "gpt2", "--from", "jsonl"], &inputs, &out);
    assert!(shard_ids(&out) == want, "split into files");
    // --from text: each file one document, same ids.
    let docs: Vec<PathBuf> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let p = dir.path().join(format!("doc{i:03}.txt"));
            std::fs::write(&p, v["text"].as_str().unwrap()).unwrap();
            p
        })
        .collect();
    let out = dir.path().join("text.bin");
    pack_with(
        &["--tokenizer", "gpt2", "--from", "text", "--threads", "3"],
        &docs,
        &out,
    );
    assert!(shard_ids(&out) == want, "--from text");
}

#[test]
fn pack_tokenizer_json_matches_the_tokenizers_library() {
    let dir = tmp();
    for name in ["bpe_small", "bpe_split"] {
        let out = dir.path().join(format!("{name}.bin"));
        pack_with(
            &[
                "--tokenizer",
                tok_fixture(&format!("{name}.json")).to_str().unwrap(),
                "--eot",
                "<|endoftext|>",
                "--from",
                "jsonl",
            ],
            &[tok_fixture("corpus.jsonl")],
            &out,
        );
        let want = tok_fixture(&format!("ref_{name}.bin"));
        assert!(shard_ids(&out) == shard_ids(&want), "{name}");
        let (ow, _) = split_shard(&std::fs::read(&out).unwrap());
        let (ww, _) = split_shard(&std::fs::read(&want).unwrap());
        assert_eq!(ow[..3], ww[..3], "{name}");
    }
    // A tokenizer.json has no standard end-of-text: it must be named (or none).
    let err = fails(
        pack()
            .args(["--from", "jsonl", "--tokenizer"])
            .arg(tok_fixture("bpe_small.json"))
            .arg(tok_fixture("corpus.jsonl"))
            .arg("-o")
            .arg(dir.path().join("x.bin")),
        2,
    );
    assert!(err.contains("--eot"), "{err}");
    let err = fails(
        pack()
            .args(["--eot", "<|nope|>", "--tokenizer"])
            .arg(tok_fixture("bpe_small.json"))
            .arg(tok_fixture("corpus.jsonl"))
            .arg("-o")
            .arg(dir.path().join("x.bin")),
        2,
    );
    assert!(err.contains("<|nope|>"), "{err}");
}

#[test]
fn pack_parquet_column_with_a_null_row() {
    let dir = tmp();
    let out = dir.path().join("pq.bin");
    let err = fails(
        pack()
            .args(["--tokenizer", "gpt2", "--from", "parquet"])
            .arg(tok_fixture("corpus.parquet"))
            .arg("-o")
            .arg(&out),
        1,
    );
    assert!(
        err.contains("corpus.parquet: row 6: null document"),
        "{err}"
    );
    assert!(!out.exists());
    let o = pack()
        .args([
            "--json",
            "--skip-bad",
            "--tokenizer",
            "gpt2",
            "--from",
            "parquet",
        ])
        .arg(tok_fixture("corpus.parquet"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["skipped"], 1);
    assert!(shard_ids(&out) == shard_ids(&tok_fixture("ref_gpt2.bin")));
    let err = fails(
        pack()
            .args([
                "--tokenizer",
                "gpt2",
                "--from",
                "parquet",
                "--field",
                "body",
            ])
            .arg(tok_fixture("corpus.parquet"))
            .arg("-o")
            .arg(&out),
        1,
    );
    assert!(err.contains("no top-level column \"body\""), "{err}");
    let err = fails(
        pack()
            .args(["--tokenizer", "gpt2", "--from", "parquet", "--field", "id"])
            .arg(tok_fixture("corpus.parquet"))
            .arg("-o")
            .arg(dir.path().join("id.bin")),
        1,
    );
    assert!(err.contains("not a string column"), "{err}");
}

#[test]
fn pack_bad_jsonl_lines_name_file_and_line_or_are_skipped() {
    let dir = tmp();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\nnot json\n[1]\n{\"body\": 1}\n{\"text\": 5}\n{\"text\": \"three\"}\n",
    )
    .unwrap();
    let out = dir.path().join("o.bin");
    let err = fails(
        pack()
            .args(["--tokenizer", "gpt2", "--from", "jsonl"])
            .arg(&input)
            .arg("-o")
            .arg(&out),
        1,
    );
    assert!(err.contains("in.jsonl:4: not JSON"), "{err}");
    assert!(!out.exists());
    let o = pack()
        .args(["--tokenizer", "gpt2", "--from", "jsonl", "--skip-bad"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("3 documents") && err.contains("4 bad lines or rows skipped"),
        "{err}"
    );
    // [eot] one [eot] two [eot] three
    assert_eq!(
        shard_ids(&out),
        vec![50256, 505, 50256, 11545, 50256, 15542]
    );
    // Each kind of bad line on its own.
    for (line, want) in [
        ("[1]", "in2.jsonl:1: not a JSON object"),
        ("{\"body\": \"x\"}", "in2.jsonl:1: no field \"text\""),
        (
            "{\"text\": null}",
            "in2.jsonl:1: field \"text\" is not a string",
        ),
        ("{\"text\": \"a\"} x", "in2.jsonl:1: not JSON"),
    ] {
        let input = dir.path().join("in2.jsonl");
        std::fs::write(&input, format!("{line}\n")).unwrap();
        let err = fails(
            pack()
                .args(["--tokenizer", "gpt2", "--from", "jsonl"])
                .arg(&input)
                .arg("-o")
                .arg(&out),
            1,
        );
        assert!(err.contains(want), "{line}: {err}");
    }
}

#[test]
fn pack_with_no_token_is_an_error_and_eot_none_adds_none() {
    let dir = tmp();
    let out = dir.path().join("o.bin");
    let empty = dir.path().join("e.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let err = fails(
        pack()
            .args(["--tokenizer", "gpt2", "--from", "jsonl"])
            .arg(&empty)
            .arg("-o")
            .arg(&out),
        1,
    );
    assert!(err.contains("no token"), "{err}");
    assert!(!out.exists());
    // An empty document under --eot none yields nothing either.
    let err = fails(
        pack()
            .args(["--tokenizer", "gpt2", "--eot", "none", "-o"])
            .arg(&out)
            .write_stdin(""),
        1,
    );
    assert!(err.contains("no token"), "{err}");
    let o = pack()
        .args(["--tokenizer", "gpt2", "--eot", "none", "-o"])
        .arg(&out)
        .write_stdin("Hello world")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(shard_ids(&out), vec![15496, 995]);
    // Special-token strings in a document are text, never the special token.
    pack()
        .args(["--tokenizer", "cl100k_base", "-o"])
        .arg(&out)
        .write_stdin("<|endoftext|>")
        .assert()
        .success();
    let ids = shard_ids(&out);
    assert_eq!(ids[0], 100257);
    assert!(!ids[1..].contains(&100257), "{ids:?}");
}

/// The names of the files in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn pack_refuses_a_val_split_that_leaves_no_train_token_writing_nothing() {
    let dir = tmp();
    let corpus = tok_fixture("corpus.jsonl");
    // The corpus's token count, from a pack without a split.
    let whole = dir.path().join("whole.bin");
    pack_with(
        &["--tokenizer", "gpt2", "--from", "jsonl"],
        std::slice::from_ref(&corpus),
        &whole,
    );
    let tokens = shard_ids(&whole).len() as u64;
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let prefix = out_dir.join("fw");
    for val in [tokens, tokens + 1, 100_000_000] {
        let err = fails(
            pack()
                .args(["--tokenizer", "gpt2", "--from", "jsonl", "--val-tokens"])
                .arg(val.to_string())
                .arg(&corpus)
                .arg("-o")
                .arg(&prefix),
            1,
        );
        assert!(
            err.contains("--val-tokens must be below")
                && err.contains(&format!("the inputs yield {tokens} tokens"))
                && err.contains(&format!("takes the first {val}")),
            "{err}"
        );
        assert!(names_in(&out_dir).is_empty(), "{:?}", names_in(&out_dir));
    }
    // One token left over is a training shard of one token.
    pack_with(
        &[
            "--tokenizer",
            "gpt2",
            "--from",
            "jsonl",
            "--val-tokens",
            &(tokens - 1).to_string(),
        ],
        &[corpus],
        &prefix,
    );
    assert_eq!(
        names_in(&out_dir),
        [
            "fw_train_000001.bin",
            "fw_train_000001.docs",
            "fw_val_000000.bin",
            "fw_val_000000.docs"
        ]
    );
    assert_eq!(shard_ids(&out_dir.join("fw_train_000001.bin")).len(), 1);
}

#[test]
fn pack_format_v2_keeps_20240520_version_2() {
    let dir = tmp();
    let out = dir.path().join("v2.bin");
    pack()
        .args(["-q", "--tokenizer", "cl100k_base", "--format", "v2", "-o"])
        .arg(&out)
        .write_stdin("Hello world")
        .assert()
        .success();
    let (w, _) = split_shard(&std::fs::read(&out).unwrap());
    assert_eq!(w[..4], [MAGIC, 2, 3, 100277]);
    assert!(llmc_llama3_accepts(&out).is_err() && llmc_dataloader_accepts(&out).is_err());
    // Raw ids above 65,536 take the Llama-3 layout by default too.
    let out = dir.path().join("ids.bin");
    pack()
        .args(["--from", "ids", "--vocab-size", "128256", "-o"])
        .arg(&out)
        .write_stdin("128000 9906 1917")
        .assert()
        .success();
    assert_eq!(llmc_llama3_accepts(&out), Ok(3));
    let (w, _) = split_shard(&std::fs::read(&out).unwrap());
    assert_eq!(w[3], 128256);
    // Both layouts read back.
    for p in [dir.path().join("v2.bin"), out] {
        tlio()
            .args(["tokens", "header", "--check-ids"])
            .arg(&p)
            .assert()
            .success();
    }
}

#[test]
fn decode_shows_the_first_document() {
    let ref_gpt2 = tok_fixture("ref_gpt2.bin");
    let out = stdout_of(
        tlio()
            .args([
                "tokens",
                "decode",
                "--tokenizer",
                "gpt2",
                "--start",
                "0",
                "--count",
                "18",
            ])
            .arg(&ref_gpt2),
    );
    assert!(
        out.starts_with("<|endoftext|>Hello world! This is a plain English sentence"),
        "{out}"
    );
    let json = stdout_of(
        tlio()
            .args([
                "tokens",
                "decode",
                "--json",
                "--tokenizer",
                "gpt2",
                "--start",
                "1",
                "--count",
                "2",
            ])
            .arg(&ref_gpt2),
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ids"], serde_json::json!([15496, 995]));
    assert_eq!(v["text"], "Hello world");
    // A shard recording another vocabulary is refused.
    let dir = tmp();
    let other = dir.path().join("cl.bin");
    pack()
        .args(["-q", "--tokenizer", "cl100k_base", "-o"])
        .arg(&other)
        .write_stdin("x")
        .assert()
        .success();
    let err = fails(
        tlio()
            .args(["tokens", "decode", "--tokenizer", "gpt2"])
            .arg(&other),
        1,
    );
    assert!(err.contains("vocabulary size mismatch"), "{err}");
    let err = fails(
        tlio()
            .args([
                "tokens",
                "decode",
                "--tokenizer",
                "gpt2",
                "--start",
                "999999999",
            ])
            .arg(&ref_gpt2),
        2,
    );
    assert!(err.contains("past the end"), "{err}");
}

#[test]
fn header_and_windows_take_vocab_size_and_refuse_mixed_vocabularies() {
    let ref_gpt2 = tok_fixture("ref_gpt2.bin");
    // llm.c's shard records no V: --vocab-size checks every id.
    tlio()
        .args(["tokens", "header", "--vocab-size", "50257"])
        .arg(&ref_gpt2)
        .assert()
        .success();
    let out = tlio()
        .args(["tokens", "header", "--vocab-size", "30000"])
        .arg(&ref_gpt2)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not below the vocabulary size 30000"));
    let err = fails(
        windows_cmd(4, 1)
            .args(["--vocab-size", "30000"])
            .arg(&ref_gpt2),
        1,
    );
    assert!(err.contains("not below the vocabulary size 30000"), "{err}");
    stdout_of(
        windows_cmd(4, 1)
            .args(["--vocab-size", "50257"])
            .arg(&ref_gpt2),
    );
    // Shards of different recorded vocabularies never form one stream.
    let dir = tmp();
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    for (p, t) in [(&a, "gpt2"), (&b, "cl100k_base")] {
        pack()
            .args(["-q", "--tokenizer", t, "-o"])
            .arg(p)
            .write_stdin("Some text that is long enough for a window or two.")
            .assert()
            .success();
    }
    let err = fails(windows_cmd(4, 1).arg(&a).arg(&b), 1);
    assert!(err.contains("different vocabularies"), "{err}");
}

#[test]
fn decode_reads_a_byte_level_shard_back_and_a_wrong_tokenizer_says_what_to_do() {
    let dir = tmp();
    let shard = dir.path().join("essay.bin");
    let text = "An essay, caf\u{e9} and all.\n";
    let out = pack()
        .arg("-")
        .arg("-o")
        .arg(&shard)
        .write_stdin(text)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let got = stdout_of(
        tlio()
            .args(["tokens", "decode"])
            .arg(&shard)
            .args(["--tokenizer", "bytes"]),
    );
    assert_eq!(got, text);
    let json = stdout_of(
        tlio()
            .args(["--json", "tokens", "decode"])
            .arg(&shard)
            .args(["--tokenizer", "bytes", "--start", "3", "--count", "5"]),
    );
    assert!(
        json.contains(r#""tokenizer":"bytes","start":3,"ids":[101,115,115,97,121],"text":"essay""#),
        "{json}"
    );
    // A BPE tokenizer on a byte-level shard: the error says which one to pass.
    let err = fails(
        tlio()
            .args(["tokens", "decode"])
            .arg(&shard)
            .args(["--tokenizer", "gpt2"]),
        1,
    );
    assert!(err.contains("vocabulary size mismatch"), "{err}");
    assert!(err.contains("use --tokenizer bytes"), "{err}");
}

#[test]
fn windows_refuses_a_seed_beside_a_cursor_saying_why_before_reading() {
    // The cursor holds the generator's state, so a seed beside it would be silently
    // ignored: the pair is refused before any file is read (the cursor need not
    // exist), and the message says why, not just that the flags conflict.
    let out = tlio()
        .args([
            "tokens",
            "windows",
            "s.bin",
            "--seq-len",
            "4",
            "--batch",
            "2",
        ])
        .args(["--cursor", "no-such.json", "--seed", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--seed") && err.contains("--cursor") && err.lines().count() == 1,
        "{err}"
    );
    assert!(
        err.contains("the cursor carries the generator's state"),
        "{err}"
    );
    assert!(
        !err.contains("cannot be used with '"),
        "clap's generic words: {err}"
    );
}

#[test]
fn pack_refuses_url_inputs_as_not_local_files() {
    let dir = tmp();
    let local = dir.path().join("in.jsonl");
    std::fs::write(&local, "{\"text\": \"hi\"}\n").unwrap();
    let out = dir.path().join("o.bin");
    for url in [
        "s3://bucket/in.jsonl",
        "https://example.com/in.jsonl",
        "gs://b/in.jsonl",
    ] {
        for extra in [
            &["--tokenizer", "gpt2", "--from", "jsonl"][..],
            &["--from", "bytes"][..],
            &["--tokenizer", "gpt2", "--from", "jsonl", "--part", "0/2"][..],
        ] {
            let err = fails(
                pack().args(extra).arg(&local).arg(url).arg("-o").arg(&out),
                2,
            );
            assert!(
                err.contains(&format!("{url}: a pack's inputs must be local files")),
                "{extra:?}: {err}"
            );
            assert!(!err.contains("No such file"), "{err}");
        }
    }
    assert_eq!(names_in(dir.path()), ["in.jsonl"]);
}
