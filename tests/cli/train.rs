//! `tlio train bigram`: MS-L0 (a run aborted after step 60 resumes and ends bitwise
//! equal), real SIGKILLs at random instants, determinism, the loss on real text, the
//! count model, and the refusals.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use predicates::prelude::*;
use rand_core::RngCore;

use crate::{tlio, tmp};

/// Text for the shards: the kind of prose the project's docs hold.
const TEXT: &str = "A checkpoint is written into a temporary directory, every file \
synced, the manifest last, then renamed into place, then LATEST replaced by a rename: \
a crash at any instant leaves the old checkpoint or the new one. The token stream's \
cursor is its whole position: the shard, the offset of the next window and the state \
of the generator. A bigram model predicts the next byte from the current one. ";

/// Write `ids` as a version-1 shard recording vocabulary `vocab` (the byte layout of
/// tokens.md, written here by hand so the test does not trust the writer under test).
fn write_shard(path: &Path, ids: &[u16], vocab: i32) {
    let mut bytes = Vec::new();
    for word in [20240520i32, 1, ids.len() as i32, vocab] {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes.resize(1024, 0);
    for id in ids {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    fs::write(path, bytes).unwrap();
}

/// A byte-level shard of `TEXT` repeated `times` times.
fn text_shard(dir: &Path, name: &str, times: usize) -> PathBuf {
    let path = dir.join(name);
    let ids: Vec<u16> = TEXT.repeat(times).bytes().map(u16::from).collect();
    write_shard(&path, &ids, 256);
    path
}

/// The flags of the MS-L0 run (small B and T so the test is quick).
fn ms_l0_args(data: &Path, out: &Path) -> Vec<String> {
    [
        "train",
        "bigram",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--max-steps",
        "100",
        "--ckpt-every",
        "25",
        "--batch",
        "4",
        "--seq-len",
        "16",
        "--seed",
        "7",
        "--lr",
        "0.05",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_ok(args: &[String]) -> Vec<u8> {
    let out = tlio().args(args).assert().success().get_output().clone();
    out.stdout
}

fn final_files(out: &Path, step: u64) -> (Vec<u8>, Vec<u8>) {
    let dir = out.join("ckpt").join(format!("step-{step:06}"));
    (
        fs::read(dir.join("model.safetensors")).unwrap(),
        fs::read(dir.join("optimizer.safetensors")).unwrap(),
    )
}

#[test]
fn ms_l0_failpoint_abort_then_resume_is_bitwise() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 20);
    let full = dir.path().join("full");
    let line_a = run_ok(&ms_l0_args(&data, &full));
    assert_eq!(line_a, fs::read(full.join("final.json")).unwrap());
    assert_eq!(line_a.iter().filter(|&&b| b == b'\n').count(), 1);
    let text = String::from_utf8(line_a.clone()).unwrap();
    assert!(
        text.starts_with("{\"step\":100,\"tokens_seen\":6400,"),
        "{text}"
    );

    let resumed = dir.path().join("resumed");
    let out = tlio()
        .args(ms_l0_args(&data, &resumed))
        .env("FAILPOINTS", "train/after-step=60*off->return")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint aborts the run");
    assert!(out.stdout.is_empty());
    assert!(!resumed.join("final.json").exists());
    assert_eq!(
        fs::read_to_string(resumed.join("ckpt/LATEST")).unwrap(),
        "step-000050\n"
    );

    let mut args = ms_l0_args(&data, &resumed);
    args.push("--resume".into());
    let out = tlio().args(&args).assert().success().get_output().clone();
    assert!(String::from_utf8_lossy(&out.stderr).contains("step-000050"));
    assert_eq!(out.stdout, line_a, "final lines byte-identical");
    assert_eq!(fs::read(resumed.join("final.json")).unwrap(), line_a);
    assert_eq!(final_files(&full, 100), final_files(&resumed, 100));
    for file in ["model.safetensors", "optimizer.safetensors"] {
        tlio()
            .args(["st", "diff"])
            .arg(full.join("ckpt/step-000100").join(file))
            .arg(resumed.join("ckpt/step-000100").join(file))
            .assert()
            .success();
    }
    assert_eq!(
        fs::read(full.join("config.json")).unwrap(),
        fs::read(resumed.join("config.json")).unwrap()
    );

    // Resuming a finished run prints the same line again; extending it continues.
    tlio().args(&args).assert().success().stdout(line_a.clone());
    let mut longer = args.clone();
    longer[7] = "110".into();
    let extended = run_ok(&longer);
    assert!(String::from_utf8(extended)
        .unwrap()
        .starts_with("{\"step\":110,"));
}

#[test]
fn sgd_runs_resume_bitwise_too() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 20);
    for momentum in ["0.9", "0"] {
        let with = |out: &Path| {
            let mut a = ms_l0_args(&data, out);
            a[7] = "40".into();
            a[9] = "10".into();
            a.extend(["--optimizer", "sgd", "--momentum", momentum].map(String::from));
            a
        };
        let full = dir.path().join(format!("full-{momentum}"));
        let line = run_ok(&with(&full));
        let cut = dir.path().join(format!("cut-{momentum}"));
        tlio()
            .args(with(&cut))
            .env("FAILPOINTS", "train/after-step=24*off->return")
            .assert()
            .failure();
        let mut resume = with(&cut);
        resume.push("--resume".into());
        assert_eq!(run_ok(&resume), line);
        assert_eq!(final_files(&full, 40), final_files(&cut, 40));
    }
}

/// Run `tlio` with `args` and SIGKILL it after `delay`. `Some(stdout)` when it ended by
/// itself (successfully), `None` when the kill hit a running process: the exit status
/// says which, so a process that exits just before the kill is not counted as killed.
fn run_and_kill(args: &[String], delay: Duration) -> Option<Vec<u8>> {
    use std::os::unix::process::ExitStatusExt;
    let bin = assert_cmd::cargo::cargo_bin("tlio");
    let mut child = StdCommand::new(bin)
        .args(args)
        .env_remove("FAILPOINTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + delay;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    if child.try_wait().unwrap().is_none() {
        // SIGKILL: no handler, no unwinding, no cleanup.
        child.kill().unwrap();
    }
    let out = child.wait_with_output().unwrap();
    if out.status.signal() == Some(libc::SIGKILL) {
        return None;
    }
    assert!(out.status.success(), "training failed: {:?}", out.status);
    Some(out.stdout)
}

/// Kills tried per round before the run is let finish.
const KILLS_PER_ROUND: u32 = 3;

/// A kill instant inside an uninterrupted run of `full`: the first of a round lands in
/// the first half (that run does the whole work, so it is still running), later ones
/// anywhere in the first 70% (a resumed run has less left to do, and may finish first).
fn kill_instant(rng: &mut rand_pcg::Pcg32, full: Duration, attempt: u32) -> Duration {
    let (lo, hi) = if attempt == 0 { (50, 500) } else { (50, 700) };
    let permille = lo + rng.next_u32() % (hi - lo);
    full * permille / 1000
}

/// The `.tmp` names a kill left in the checkpoint directory (a kill inside a save).
fn leftovers(out: &Path) -> Vec<String> {
    fs::read_dir(out.join("ckpt"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sigkill_at_random_instants_then_resume_is_bitwise() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 20);
    let flags = |out: &Path, ckpt_every: &str| {
        let mut a = ms_l0_args(&data, out);
        a[7] = "30".into();
        a[9] = ckpt_every.into();
        a.extend(["-q", "--keep", "3", "--resume"].map(String::from));
        a
    };
    let reference = dir.path().join("reference");
    let line = run_ok(&flags(&reference, "1000"));
    let mut rng = rand_pcg::Pcg32::new(0x5eed, 54);
    // Checkpointing every step puts most of the wall time inside saves, so most kills
    // land in the middle of one; every 4 steps mixes kills between steps.
    let rounds = ["1", "4", "1"];
    let mut hit_rounds = 0;
    let mut total_kills = 0;
    for (round, ckpt_every) in rounds.into_iter().enumerate() {
        // An uninterrupted run of the same flags: its wall time bounds the kill instants.
        let timed = dir.path().join(format!("timed-{round}"));
        let started = Instant::now();
        assert_eq!(run_ok(&flags(&timed, ckpt_every)), line);
        let full = started.elapsed();
        let out = dir.path().join(format!("killed-{round}"));
        let args = flags(&out, ckpt_every);
        let mut kills = 0;
        for attempt in 0..KILLS_PER_ROUND {
            let delay = kill_instant(&mut rng, full, attempt);
            if run_and_kill(&args, delay).is_some() {
                break;
            }
            kills += 1;
            eprintln!(
                "round {round} (full run {full:?}): kill {kills} after {delay:?}, leftovers {:?}",
                leftovers(&out)
            );
        }
        let final_line = run_ok(&args);
        assert_eq!(final_line, line, "round {round} after {kills} kills");
        assert_eq!(fs::read(out.join("final.json")).unwrap(), line);
        assert_eq!(final_files(&reference, 30), final_files(&out, 30));
        hit_rounds += usize::from(kills > 0);
        total_kills += kills;
    }
    eprintln!(
        "{total_kills} kills hit a running process, in {hit_rounds} of {} rounds",
        rounds.len()
    );
    // Timing can let one round's process win every race; not two, and not most kills.
    assert!(
        hit_rounds + 1 >= rounds.len(),
        "{hit_rounds} of {} rounds were killed",
        rounds.len()
    );
    assert!(
        total_kills as usize >= rounds.len(),
        "only {total_kills} kills hit"
    );
}

#[test]
fn same_flags_give_identical_final_lines() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 10);
    let mut a = ms_l0_args(&data, &dir.path().join("a"));
    a[7] = "20".into();
    let mut b = ms_l0_args(&data, &dir.path().join("b"));
    b[7] = "20".into();
    let line = run_ok(&a);
    assert_eq!(run_ok(&b), line);
    // The same data under another name is the same run; another seed is not.
    let copy = dir.path().join("copy.bin");
    fs::copy(&data, &copy).unwrap();
    let mut c = ms_l0_args(&copy, &dir.path().join("c"));
    c[7] = "20".into();
    assert_eq!(run_ok(&c), line);
    assert_eq!(
        fs::read(dir.path().join("a/config.json")).unwrap(),
        fs::read(dir.path().join("c/config.json")).unwrap()
    );
    let mut d = ms_l0_args(&data, &dir.path().join("d"));
    d[7] = "20".into();
    d[15] = "8".into();
    assert_ne!(run_ok(&d), line);
}

fn loss_of(line: &[u8]) -> f64 {
    let v: serde_json::Value = serde_json::from_slice(line).unwrap();
    v["loss"].as_f64().unwrap()
}

#[test]
fn loss_decreases_on_real_text() {
    let dir = tmp();
    // Real prose, packed by `tokens pack` as a user would.
    let text = dir.path().join("text.txt");
    fs::write(&text, TEXT.repeat(20)).unwrap();
    let data = dir.path().join("text.bin");
    tlio()
        .args(["tokens", "pack"])
        .arg(&text)
        .arg("-o")
        .arg(&data)
        .assert()
        .success();
    let run = |steps: &str, name: &str| {
        let mut a = ms_l0_args(&data, &dir.path().join(name));
        a[7] = steps.into();
        a[11] = "16".into();
        a[17] = "0.1".into();
        loss_of(&run_ok(&a))
    };
    let first = run("1", "one");
    assert!(
        (first - 256f64.ln()).abs() < 1e-5,
        "step 1 from zeros: ln 256, got {first}"
    );
    let later = run("150", "many");
    assert!(later < 3.0, "the loss fell from {first} to {later}");
}

#[test]
fn counts_method_writes_the_smoothed_log_probabilities() {
    let dir = tmp();
    let text = b"abracadabra, a bar of cab abra";
    let ids: Vec<u16> = text.iter().map(|&b| u16::from(b)).collect();
    let data = dir.path().join("t.bin");
    write_shard(&data, &ids, 256);
    let out = dir.path().join("run");
    let line = tlio()
        .args(["train", "bigram", "--method", "counts", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(fs::read(out.join("final.json")).unwrap(), line);
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["tokens_seen"], text.len() - 1);
    assert!(v["optimizer_sha256"].is_null() && v["cursor"].is_null());

    let bytes = fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor("bigram.weight").unwrap();
    assert_eq!(w.shape(), [256, 256]);
    let w: Vec<f32> = w
        .data()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut pair = vec![0u64; 256 * 256];
    let mut n = vec![0u64; 256];
    for p in text.windows(2) {
        pair[p[0] as usize * 256 + p[1] as usize] += 1;
        n[p[0] as usize] += 1;
    }
    for i in 0..256 {
        for j in 0..256 {
            let want = ((pair[i * 256 + j] as f64 + 1.0) / (n[i] as f64 + 256.0)).ln() as f32;
            assert_eq!(w[i * 256 + j].to_bits(), want.to_bits(), "W[{i}][{j}]");
        }
    }
    // The same model is the checkpoint's.
    assert_eq!(
        fs::read(out.join("ckpt/step-000001/model.safetensors")).unwrap(),
        bytes
    );
}

#[test]
fn resume_with_nothing_starts_at_zero_and_says_so() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 10);
    let out = dir.path().join("run");
    let mut args = ms_l0_args(&data, &out);
    args[7] = "5".into();
    let plain = run_ok(&args);
    let out2 = dir.path().join("run2");
    let mut resume = ms_l0_args(&data, &out2);
    resume[7] = "5".into();
    resume.push("--resume".into());
    tlio()
        .args(&resume)
        .assert()
        .success()
        .stdout(plain)
        .stderr(predicate::str::contains("no checkpoint").and(predicate::str::contains("step 0")));
}

#[test]
fn refusals_name_their_cause() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 10);
    let out = dir.path().join("run");
    let mut args = ms_l0_args(&data, &out);
    args[7] = "5".into();
    run_ok(&args);
    // Checkpoints exist: without --resume the run is refused, nothing is touched.
    let before = fs::read(out.join("final.json")).unwrap();
    tlio()
        .args(&args)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already holds checkpoints"));
    assert_eq!(fs::read(out.join("final.json")).unwrap(), before);
    // A disagreeing flag is named.
    for (index, value, field) in [
        (11, "5", "--batch"),
        (13, "3", "--seq-len"),
        (17, "0.5", "--lr"),
    ] {
        let mut a = args.clone();
        a[index] = value.into();
        a.push("--resume".into());
        tlio()
            .args(&a)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("{field} disagrees")));
    }
    let mut a = args.clone();
    a.extend(["--resume", "--optimizer", "sgd"].map(String::from));
    tlio()
        .args(&a)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--optimizer disagrees"));
    // A vocabulary whose state would not fit the limit is refused before allocating.
    let big = dir.path().join("big.bin");
    write_shard(&big, &[1, 2, 3, 4, 5], 50257);
    tlio()
        .args(["train", "bigram", "--data"])
        .arg(&big)
        .arg("--out")
        .arg(dir.path().join("big"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("30309192588 bytes"));
    // --momentum belongs to SGD.
    tlio()
        .args(["train", "bigram", "--momentum", "0.5", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(dir.path().join("m"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--momentum"));
}

/// The exact final line (loss bits and both digests) of two fixed runs: the MS-L0 run
/// (AdamW) and a small SGD-with-momentum run. Any change to the numerics (the AdamW
/// `lerp` form, the order of a sum, the loss) changes these bytes and fails here; the
/// resume tests alone cannot see it because both sides of their comparison change.
#[test]
fn final_lines_of_fixed_runs_are_pinned() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 20);
    let line = run_ok(&ms_l0_args(&data, &dir.path().join("ms")));
    assert_eq!(String::from_utf8(line).unwrap(), MS_L0_LINE);
    let mut args = ms_l0_args(&data, &dir.path().join("sgd"));
    args.retain(|a| !["--lr", "0.05", "--max-steps", "100"].contains(&a.as_str()));
    args.extend(
        [
            "--max-steps",
            "30",
            "--optimizer",
            "sgd",
            "--lr",
            "0.5",
            "--momentum",
            "0.9",
        ]
        .map(String::from),
    );
    let line = run_ok(&args);
    assert_eq!(String::from_utf8(line).unwrap(), SGD_LINE);
}

const MS_L0_LINE: &str = concat!(
    r#"{"step":100,"tokens_seen":6400,"loss":2.2058935,"loss_bits":"400d2d5c","#,
    r#""model_sha256":"b56615de18bd7031d5ee90b784fe284401bce7ead064bf6de52ea5d3935c039d","#,
    r#""optimizer_sha256":"5e5539f23df25196239de16ade22472237065521bb0171020fb8580d764504fd","#,
    r#""cursor":{"shard":0,"offset":6403,"rng":{"state":"e63620b250c1f42a","inc":"000000000000006d"}}}"#,
    "\n"
);
const SGD_LINE: &str = concat!(
    r#"{"step":30,"tokens_seen":1920,"loss":4.2019396,"loss_bits":"4086764a","#,
    r#""model_sha256":"85f29db2600b8fb2d277221d95084c974de6d3625292b838bb9014efc04402c9","#,
    r#""optimizer_sha256":"e68683570ecc0cb7adc6ceae00ef0ed62ec0e2f1525fcb633d2b67f2a2b25177","#,
    r#""cursor":{"shard":0,"offset":1923,"rng":{"state":"e63620b250c1f42a","inc":"000000000000006d"}}}"#,
    "\n"
);

#[test]
fn bad_float_flags_are_usage_errors_naming_the_flag_and_range() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 2);
    for (flag, value, want) in [
        ("--lr", "1e39", "not finite in f32"),
        ("--lr", "nan", "not finite in f32"),
        ("--lr", "-1", "negative"),
        ("--weight-decay", "inf", "not finite in f32"),
        ("--momentum", "-0.5", "negative"),
        ("--lr", "abc", "not a number"),
    ] {
        let out = dir.path().join("run");
        let mut args = ms_l0_args(&data, &out);
        args.retain(|a| a != "--lr" && a != "0.05");
        if flag == "--momentum" {
            args.extend(["--optimizer".to_string(), "sgd".to_string()]);
        }
        args.extend([flag.to_string(), value.to_string()]);
        let res = tlio().args(&args).output().unwrap();
        let err = String::from_utf8(res.stderr).unwrap();
        assert_eq!(res.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.starts_with("tlio: error: ") && err.contains(flag) && err.contains(want),
            "{flag} {value}: {err}"
        );
        assert!(err.contains("[0, 3.4028235e38]"), "{err}");
        assert!(!out.exists(), "nothing created for {flag} {value}");
    }
}

#[test]
fn a_diverging_run_stops_with_exit_1_naming_the_step() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 2);
    let out = dir.path().join("run");
    let mut args = ms_l0_args(&data, &out);
    args.retain(|a| a != "--lr" && a != "0.05");
    args.extend(["--lr".to_string(), "1e30".to_string()]);
    let res = tlio().args(&args).output().unwrap();
    let err = String::from_utf8(res.stderr).unwrap();
    assert_eq!(res.status.code(), Some(1), "{err}");
    assert!(res.stdout.is_empty());
    assert!(
        err.contains("the loss became") && err.contains("at step "),
        "{err}"
    );
    assert!(!out.join("final.json").exists());
}

#[test]
fn resume_says_which_newer_step_it_refused_and_repairs_it() {
    let dir = tmp();
    let data = text_shard(dir.path(), "text.bin", 20);
    let out = dir.path().join("run");
    let line = run_ok(&ms_l0_args(&data, &out));
    let model = out.join("ckpt/step-000100/model.safetensors");
    let mut b = fs::read(&model).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    fs::write(&model, b).unwrap();
    let mut args = ms_l0_args(&data, &out);
    args.push("--resume".to_string());
    let res = tlio().args(&args).output().unwrap();
    let err = String::from_utf8(res.stderr).unwrap();
    assert!(res.status.success(), "{err}");
    assert!(
        err.contains("skipped step-000100") && err.contains("sha256 mismatch"),
        "{err}"
    );
    assert!(err.contains("step-000075"), "{err}");
    // The save after the fallback is allowed (LATEST named a corrupt step) and the
    // run ends exactly where the uninterrupted one did.
    assert_eq!(res.stdout, line);
}

#[test]
fn bigram_help_states_the_model_state_limit_before_a_user_tries() {
    let out = tlio().args(["train", "bigram", "--help"]).output().unwrap();
    // The help is wrapped to the terminal's width: compare words, not lines.
    let help = String::from_utf8_lossy(&out.stdout);
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("V x V x 3 x 4 bytes")
            && words.contains("4 GiB")
            && words.contains("18,918"),
        "{help}"
    );
}

#[test]
fn shuffled_runs_resume_bitwise_and_cannot_resume_unshuffled() {
    let dir = tmp();
    let texts = [
        TEXT.to_string(),
        TEXT.to_uppercase(),
        TEXT.chars().rev().collect::<String>(),
    ];
    let mut shards = Vec::new();
    for (i, (text, times)) in texts.iter().zip([2, 3, 5]).enumerate() {
        let path = dir.path().join(format!("s{i}.bin"));
        let ids: Vec<u16> = text.repeat(times).bytes().map(u16::from).collect();
        write_shard(&path, &ids, 256);
        shards.push(path.to_str().unwrap().to_string());
    }
    let args = |out: &Path, shuffle: bool| {
        let mut a: Vec<String> = ["train", "bigram"].map(String::from).to_vec();
        a.extend(shards.iter().cloned());
        a.extend(
            [
                "--out",
                out.to_str().unwrap(),
                "--max-steps",
                "60",
                "--ckpt-every",
                "10",
                "--batch",
                "4",
                "--seq-len",
                "16",
                "--seed",
                "7",
                "--lr",
                "0.05",
            ]
            .map(String::from),
        );
        if shuffle {
            a.push("--shuffle".into());
        }
        a
    };
    let full = dir.path().join("full");
    let shuffled = run_ok(&args(&full, true));
    let plain = run_ok(&args(&dir.path().join("plain"), false));
    assert_ne!(shuffled, plain, "the shard order changed nothing");
    let cut = dir.path().join("cut");
    tlio()
        .args(args(&cut, true))
        .env("FAILPOINTS", "train/after-step=34*off->return")
        .assert()
        .failure();
    // Resuming without --shuffle would change the order: refused.
    let mut unshuffled = args(&cut, false);
    unshuffled.push("--resume".into());
    let out = tlio().args(&unshuffled).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("epoch_rng"), "{err}");
    let mut resume = args(&cut, true);
    resume.push("--resume".into());
    assert_eq!(run_ok(&resume), shuffled);
    assert_eq!(final_files(&full, 60), final_files(&cut, 60));
    // The count model reads every shard whole: the flag is refused, not ignored.
    let mut counts = args(&dir.path().join("counts"), true);
    counts.extend(["--method", "counts"].map(String::from));
    tlio().args(&counts).assert().code(2);
}
