//! `tokens pack --part K/N` and `tokens merge`: parts run concurrently (one killed and
//! rerun) merge into shards `cmp`-equal to one pack, for a built-in encoding and a
//! tokenizer.json over JSONL, text and .gz inputs (document sidecars included); a merge
//! before completion names the missing part; a rerun of a complete part does nothing;
//! bad part numbers exit 2; `--part slurm` reads the Slurm array variables.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::{fixture, tlio, tmp};

/// How long a killed part may take to reach the failpoint before the test gives up.
const WAIT_FOR_PART: Duration = Duration::from_secs(120);

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// The corpus lines, as JSONL files and as text files: (jsonl inputs, text inputs).
/// Each list has a large plain file (cut inside by the plan), a .gz file (kept whole)
/// and small files.
fn corpora(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let corpus = std::fs::read_to_string(fixture("tokenizers/corpus.jsonl")).unwrap();
    let lines: Vec<&str> = corpus.lines().collect();
    let third = lines.len() / 3;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let jsonl = vec![
        write(
            "a.jsonl",
            format!("{}\n", lines[..third * 2].join("\n")).as_bytes(),
        ),
        write(
            "b.jsonl.gz",
            &gz(format!("{}\n", lines[third * 2..].join("\n")).as_bytes()),
        ),
        write("c.jsonl", corpus.as_bytes()),
    ];
    let mut text = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let doc: serde_json::Value = serde_json::from_str(line).unwrap();
        let doc = doc["text"].as_str().unwrap().as_bytes().to_vec();
        text.push(if i % 5 == 1 {
            write(&format!("t{i:02}.txt.gz"), &gz(&doc))
        } else {
            write(&format!("t{i:02}.txt"), &doc)
        });
    }
    (jsonl, text)
}

/// The pack flags of one scenario: a tokenizer, an input format, small val and train
/// shards so that shard boundaries fall inside parts.
fn flags(tokenizer: &str, from: &str) -> Vec<String> {
    let mut f: Vec<String> = ["--tokenizer", tokenizer, "--from", from]
        .iter()
        .map(ToString::to_string)
        .collect();
    if tokenizer.ends_with(".json") {
        f.extend(["--eot".to_string(), "<|endoftext|>".to_string()]);
    }
    f.extend(
        [
            "--val-tokens",
            "1500",
            "--shard-tokens",
            "2500",
            "--threads",
            "2",
        ]
        .iter()
        .map(ToString::to_string),
    );
    f
}

fn pack_cmd(flags: &[String], inputs: &[PathBuf], out: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("tlio"));
    cmd.env_remove("FAILPOINTS")
        .args(["-q", "tokens", "pack"])
        .args(flags)
        .args(inputs)
        .arg("-o")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn finish(child: Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {err}");
    err
}

/// The shard files in `dir` (not the part area), sorted by name, with their bytes.
fn shards(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// 4 parts at once, part 2 killed (SIGKILL) after its ids are written and before its
/// marker; a merge then names part 2; part 2 rerun; the merge equals one pack.
fn parts_scenario(tokenizer: &str, from: &str, inputs: &[PathBuf], dir: &Path) {
    let one = dir.join(format!("one-{from}"));
    let many = dir.join(format!("many-{from}"));
    std::fs::create_dir(&one).unwrap();
    std::fs::create_dir(&many).unwrap();
    let flags = flags(tokenizer, from);
    let single = pack_cmd(&flags, inputs, &one.join("fw")).spawn().unwrap();
    let out = many.join("fw");
    let mut children = Vec::new();
    for k in 0..4 {
        let mut cmd = pack_cmd(&flags, inputs, &out);
        cmd.arg("--part").arg(format!("{k}/4"));
        if k == 2 {
            cmd.env("FAILPOINTS", "tokens/part-marker=sleep(600000)");
        }
        children.push((k, cmd.spawn().unwrap()));
    }
    let ids = many.join("fw.parts/2-of-4/ids.bin");
    let started = Instant::now();
    while !ids.exists() {
        assert!(
            started.elapsed() < WAIT_FOR_PART,
            "part 2 never wrote its ids"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (k, mut child) in children {
        if k == 2 {
            child.kill().unwrap();
            let status = child.wait().unwrap();
            assert!(!status.success());
        } else {
            finish(child, &format!("part {k}"));
        }
    }
    finish(single, "the single pack");
    // Part 2 has its ids but no marker: incomplete, and the merge says so.
    let merge = tlio().args(["tokens", "merge"]).arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&merge.stderr);
    assert_eq!(merge.status.code(), Some(1), "{err}");
    assert!(
        err.contains("1 of 4 parts missing or incomplete: 2-of-4"),
        "{err}"
    );
    assert!(!out.with_file_name("fw_val_000000.bin").exists());
    // The rerun packs it (not a no-op: it never completed).
    let err = finish(
        pack_cmd(&flags, inputs, &out)
            .arg("--part")
            .arg("2/4")
            .stderr(Stdio::piped())
            .env_remove("FAILPOINTS")
            .spawn()
            .unwrap(),
        "rerun of part 2",
    );
    assert!(!err.contains("complete already"), "{err}");
    // A rerun of a complete part does nothing and says so.
    let marker = many.join("fw.parts/1-of-4/complete.json");
    let before = std::fs::read(&marker).unwrap();
    let mut rerun = pack_cmd(&flags, inputs, &out);
    rerun.args(["--part", "1/4"]);
    // Without -q, so that the message shows.
    let args: Vec<_> = rerun
        .get_args()
        .filter(|a| *a != "-q")
        .map(ToOwned::to_owned)
        .collect();
    let out_put = tlio().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out_put.stderr);
    assert!(out_put.status.success(), "{err}");
    assert!(
        err.contains("part 1-of-4 is complete already") && err.contains("nothing to do"),
        "{err}"
    );
    assert_eq!(std::fs::read(&marker).unwrap(), before);
    let merged = tlio()
        .args(["--json", "tokens", "merge", "--verify"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        merged.status.success(),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&merged.stdout).unwrap();
    let want = shards(&one);
    assert!(
        want.len() >= 3,
        "{tokenizer} {from}: {:?}",
        want.iter().map(|w| &w.0).collect::<Vec<_>>()
    );
    let bins = want.iter().filter(|w| w.0.ends_with(".bin")).count();
    assert_eq!(report["shards"].as_array().unwrap().len(), bins);
    let got = shards(&many);
    assert_eq!(
        got.iter().map(|g| &g.0).collect::<Vec<_>>(),
        want.iter().map(|w| &w.0).collect::<Vec<_>>(),
        "{tokenizer} {from}"
    );
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert!(
            a == b,
            "{tokenizer} {from}: {name} differs from the single pack's"
        );
    }
    // Every shard has its document sidecar, and the merge's equal the pack's (above).
    let bin_names: Vec<&String> = want
        .iter()
        .map(|w| &w.0)
        .filter(|n| n.ends_with(".bin"))
        .collect();
    for bin in &bin_names {
        let docs = format!("{}.docs", bin.strip_suffix(".bin").unwrap());
        assert!(
            want.iter().any(|w| w.0 == docs),
            "{tokenizer} {from}: no {docs}"
        );
    }
    assert_eq!(want.len(), 2 * bins, "{tokenizer} {from}");
}

#[test]
fn four_parts_one_killed_and_rerun_merge_into_the_single_pack() {
    let dir = tmp();
    let (jsonl, text) = corpora(dir.path());
    let tokenizer_json = fixture("tokenizers/bpe_small.json");
    for (t, tokenizer) in ["gpt2", tokenizer_json.to_str().unwrap()]
        .iter()
        .enumerate()
    {
        for (from, inputs) in [("jsonl", &jsonl), ("text", &text)] {
            let sub = dir.path().join(format!("{t}"));
            std::fs::create_dir_all(&sub).unwrap();
            parts_scenario(tokenizer, from, inputs, &sub);
        }
    }
}

#[test]
fn a_merge_refuses_parts_of_other_options_and_bad_part_numbers_exit_2() {
    let dir = tmp();
    let (jsonl, _) = corpora(dir.path());
    let out = dir.path().join("o");
    let run = |k: usize, extra: &[&str]| {
        tlio()
            .args([
                "-q",
                "tokens",
                "pack",
                "--tokenizer",
                "gpt2",
                "--from",
                "jsonl",
            ])
            .args(&jsonl)
            .arg("-o")
            .arg(&out)
            .arg("--part")
            .arg(format!("{k}/2"))
            .args(extra)
            .output()
            .unwrap()
    };
    assert!(run(0, &[]).status.success());
    assert!(run(1, &["--eot", "none"]).status.success());
    let merge = tlio().args(["tokens", "merge"]).arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&merge.stderr);
    assert_eq!(merge.status.code(), Some(1), "{err}");
    assert!(
        err.contains("1-of-2: made with eot none, but part 0-of-2 has 50256"),
        "{err}"
    );
    // A rerun with other options than the complete part's is refused, naming them.
    let again = run(0, &["--shard-tokens", "1000"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(
        err.contains("0-of-2: made with shard_tokens none, but this run has 1000"),
        "{err}"
    );
    for bad in ["2/2", "-1/2", "1/0", "x", "1/2/3", "slurm"] {
        let out_put = tlio()
            .args(["tokens", "pack", "--tokenizer", "gpt2", "--from", "jsonl"])
            .args(&jsonl)
            .arg("-o")
            .arg(&out)
            .arg(format!("--part={bad}"))
            .env_remove("SLURM_ARRAY_TASK_ID")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out_put.stderr);
        assert_eq!(out_put.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--part takes K/N"), "{bad}: {err}");
    }
    // Standard input cannot be split.
    let out_put = tlio()
        .args(["tokens", "pack", "--part", "0/2", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(out_put.status.code(), Some(2));
    // Nothing to merge.
    let merge = tlio()
        .args(["tokens", "merge"])
        .arg(dir.path().join("none"))
        .output()
        .unwrap();
    assert_eq!(merge.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&merge.stderr).contains("no parts"));
}

#[test]
fn part_slurm_reads_the_array_task_variables() {
    let dir = tmp();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, vec![3u8; 4000]).unwrap();
    let out = dir.path().join("o.bin");
    for id in 4..7 {
        let out_put = tlio()
            .args([
                "--json",
                "tokens",
                "pack",
                "--part",
                "slurm",
                "--shard-tokens",
                "1000",
            ])
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .env("SLURM_ARRAY_TASK_ID", id.to_string())
            .env("SLURM_ARRAY_TASK_MIN", "4")
            .env("SLURM_ARRAY_TASK_COUNT", "3")
            .env("SLURM_ARRAY_TASK_STEP", "1")
            .output()
            .unwrap();
        assert!(
            out_put.status.success(),
            "{}",
            String::from_utf8_lossy(&out_put.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out_put.stdout).unwrap();
        assert_eq!(report["part"], format!("{}-of-3", id - 4));
        assert_eq!(report["status"], "packed");
    }
    assert!(dir.path().join("o.bin.parts/2-of-3/complete.json").exists());
    let merged = tlio()
        .args(["-q", "tokens", "merge"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(merged.status.success());
    let names: Vec<_> = (0..4)
        .map(|i| dir.path().join(format!("o_{i:06}.bin")))
        .collect();
    assert!(names.iter().all(|n| n.exists()), "{names:?}");
    let single = dir.path().join("single.bin");
    let ok = tlio()
        .args(["-q", "tokens", "pack", "--shard-tokens", "1000"])
        .arg(&input)
        .arg("-o")
        .arg(&single)
        .output()
        .unwrap();
    assert!(ok.status.success());
    for i in 0..4 {
        assert_eq!(
            std::fs::read(dir.path().join(format!("o_{i:06}.bin"))).unwrap(),
            std::fs::read(dir.path().join(format!("single_{i:06}.bin"))).unwrap()
        );
    }
    // A task id outside the array is refused with exit 2.
    let out_put = tlio()
        .args(["tokens", "pack", "--part", "slurm"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .env("SLURM_ARRAY_TASK_ID", "9")
        .env("SLURM_ARRAY_TASK_MIN", "4")
        .env("SLURM_ARRAY_TASK_COUNT", "3")
        .output()
        .unwrap();
    assert_eq!(out_put.status.code(), Some(2));
}

#[test]
fn a_merge_refuses_parts_whose_val_split_leaves_no_train_token() {
    let dir = tmp();
    let (jsonl, _) = corpora(dir.path());
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("fw");
    let mut tokens = 0;
    for k in 0..2 {
        let part = tlio()
            .args([
                "--json",
                "tokens",
                "pack",
                "--tokenizer",
                "gpt2",
                "--from",
                "jsonl",
            ])
            .args(["--val-tokens", "100000000", "--part", &format!("{k}/2")])
            .args(&jsonl)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&part.stderr);
        assert!(part.status.success(), "part {k}: {err}");
        let report: serde_json::Value = serde_json::from_slice(&part.stdout).unwrap();
        tokens += report["tokens"].as_u64().unwrap();
    }
    let merge = tlio().args(["tokens", "merge"]).arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&merge.stderr);
    assert_eq!(merge.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the inputs yield {tokens} tokens and the validation shard takes the first 100000000: no token is left for a training shard"
        )),
        "{err}"
    );
    // Nothing but the part area.
    let names: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["fw.parts"]);
}

/// `tokens pack --part K/2` of `inputs` into `out` with the gpt2 tokenizer and `extra`.
fn gpt2_part(inputs: &[PathBuf], out: &Path, k: usize, extra: &[&str]) -> std::process::Output {
    tlio()
        .args([
            "-q",
            "tokens",
            "pack",
            "--from",
            "jsonl",
            "--part",
            &format!("{k}/2"),
        ])
        .args(extra)
        .args(inputs)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn parts_of_an_input_rewritten_with_the_same_size_are_refused_naming_it() {
    let dir = tmp();
    let (jsonl, _) = corpora(dir.path());
    let out = dir.path().join("fw");
    let gpt2 = ["--tokenizer", "gpt2"];
    assert!(gpt2_part(&jsonl, &out, 0, &gpt2).status.success());
    // The last input, in part 1's share, rewritten with the same size and a later
    // modification time between the two parts' runs.
    let changed = &jsonl[2];
    let bytes = std::fs::read(changed).unwrap();
    let text = String::from_utf8(bytes.clone())
        .unwrap()
        .replacen("Hello", "Jello", 1);
    assert_eq!(text.len(), bytes.len());
    assert_ne!(text.as_bytes(), &bytes[..]);
    let modified = std::fs::metadata(changed).unwrap().modified().unwrap();
    std::fs::write(changed, &text).unwrap();
    let file = std::fs::File::options().write(true).open(changed).unwrap();
    file.set_modified(modified + Duration::from_secs(10))
        .unwrap();
    drop(file);
    let part = gpt2_part(&jsonl, &out, 1, &gpt2);
    assert!(
        part.status.success(),
        "{}",
        String::from_utf8_lossy(&part.stderr)
    );
    let name = format!("input 2 \"{}\" of modification time", changed.display());
    for verify in [&[][..], &["--verify"][..]] {
        let merge = tlio()
            .args(["tokens", "merge"])
            .args(verify)
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&merge.stderr);
        assert_eq!(merge.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("1-of-2: made with {name}")), "{err}");
        assert!(err.contains("but part 0-of-2 has"), "{err}");
    }
    assert!(!dir.path().join("fw_000000.bin").exists() && !dir.path().join("fw").exists());
    // A rerun of the complete part 0 over the changed input is refused, not reported
    // complete: its ids are of the old bytes.
    let rerun = gpt2_part(&jsonl, &out, 0, &gpt2);
    let err = String::from_utf8_lossy(&rerun.stderr);
    assert_eq!(rerun.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("0-of-2: made with {name}")) && err.contains("this run has"),
        "{err}"
    );
    assert!(!err.contains("complete already"), "{err}");
    // Once the area is removed, the parts redo and merge into the single pack of the
    // new bytes.
    std::fs::remove_dir_all(dir.path().join("fw.parts")).unwrap();
    for k in 0..2 {
        assert!(gpt2_part(&jsonl, &out, k, &gpt2).status.success());
    }
    let merge = tlio()
        .args(["-q", "tokens", "merge", "--verify"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        merge.status.success(),
        "{}",
        String::from_utf8_lossy(&merge.stderr)
    );
    let single = dir.path().join("single");
    let one = tlio()
        .args(["-q", "tokens", "pack", "--from", "jsonl"])
        .args(gpt2)
        .args(&jsonl)
        .arg("-o")
        .arg(&single)
        .output()
        .unwrap();
    assert!(one.status.success());
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&single).unwrap());
}

#[test]
fn parts_of_two_tokenizers_are_refused_naming_both() {
    let dir = tmp();
    let (jsonl, _) = corpora(dir.path());
    let out = dir.path().join("fw");
    assert!(gpt2_part(&jsonl, &out, 0, &["--tokenizer", "gpt2"])
        .status
        .success());
    assert!(gpt2_part(&jsonl, &out, 1, &["--tokenizer", "cl100k_base"])
        .status
        .success());
    let merge = tlio().args(["tokens", "merge"]).arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&merge.stderr);
    assert_eq!(merge.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "1-of-2: made with tokenizer \"cl100k_base\", but part 0-of-2 has \"r50k_base\""
        ),
        "{err}"
    );
    assert!(!err.contains("eot"), "{err}");
    // A tokenizer.json is named by its file name and digest.
    let json = fixture("tokenizers/bpe_small.json");
    let tokenizer = json.to_str().unwrap();
    let rerun = gpt2_part(
        &jsonl,
        &out,
        1,
        &["--tokenizer", tokenizer, "--eot", "<|endoftext|>"],
    );
    let err = String::from_utf8_lossy(&rerun.stderr);
    assert_eq!(rerun.status.code(), Some(1), "{err}");
    let named =
        "1-of-2: made with tokenizer \"cl100k_base\", but this run has \"bpe_small.json blake3:";
    let at = err.find(named).unwrap_or_else(|| panic!("{err}"));
    let digest: String = err[at + named.len()..]
        .chars()
        .take_while(|&c| c != '"')
        .collect();
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{err}"
    );
}
