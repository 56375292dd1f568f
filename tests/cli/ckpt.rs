//! `tlio ckpt`: save / verify / latest / gc from the shell, a crash drill that aborts a
//! real save at every fsync and rename, corruption and path-safety, and the lock.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tlio_core::checkpoint::{OptimizerFile, OptimizerState};
use tlio_core::safetensors::{self as st, Dtype, Tensor, TensorData};

use super::{tlio, tmp};

/// fsyncs and renames of one `ckpt save` with a model, an optimizer and a state.
const FSYNCS: usize = 8;
const RENAMES: usize = 2;

/// Write the model and optimizer inputs of step `step` into `dir`; values depend on
/// the step so that two steps never share bytes.
fn inputs(dir: &Path, step: u64) -> (PathBuf, PathBuf) {
    let w = [0.1f32 * step as f32, -0.0];
    let b = [f32::from_bits(step as u32 + 1)];
    let meta = BTreeMap::from([("format".to_string(), "tinyllm".to_string())]);
    let model = dir.join(format!("model-{step}.safetensors"));
    let tensors = [
        Tensor {
            name: "weight".into(),
            dtype: Dtype::F32,
            shape: vec![1, 2],
            data: TensorData::F32(&w),
        },
        Tensor {
            name: "bias".into(),
            dtype: Dtype::F32,
            shape: vec![1],
            data: TensorData::F32(&b),
        },
    ];
    st::save(&model, &tensors, &meta).unwrap();
    let opt = OptimizerFile {
        state: OptimizerState::AdamW {
            step,
            lr: 0.01,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
        },
        tensors: BTreeMap::from([
            (
                "weight.exp_avg".to_string(),
                (vec![1, 2], vec![0.5, step as f32]),
            ),
            (
                "weight.exp_avg_sq".to_string(),
                (vec![1, 2], vec![0.25, 1e-30]),
            ),
            ("bias.exp_avg".to_string(), (vec![1], vec![-1.5])),
            ("bias.exp_avg_sq".to_string(), (vec![1], vec![2.25])),
        ]),
    };
    let optimizer = dir.join(format!("opt-{step}.safetensors"));
    let mut bytes = Vec::new();
    opt.write(&mut bytes).unwrap();
    fs::write(&optimizer, bytes).unwrap();
    (model, optimizer)
}

fn save_cmd(ck: &Path, inputs_dir: &Path, step: u64) -> assert_cmd::Command {
    let (model, opt) = inputs(inputs_dir, step);
    let mut cmd = tlio();
    cmd.args(["ckpt", "save"])
        .arg(ck)
        .args([
            "--step",
            &step.to_string(),
            "--tokens-seen",
            "64",
            "--lr",
            "0.01",
        ])
        .arg("--model")
        .arg(model)
        .arg("--optimizer")
        .arg(opt);
    cmd
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn latest(ck: &Path) -> Option<String> {
    let out = tlio().args(["ckpt", "latest"]).arg(ck).output().unwrap();
    match out.status.code() {
        Some(0) => Some(stdout(&out).trim_end().to_string()),
        Some(1) => None,
        other => panic!("latest exited {other:?}"),
    }
}

fn verify_json(ck: &Path) -> (i32, serde_json::Value) {
    let out = tlio()
        .args(["ckpt", "verify", "--json"])
        .arg(ck)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[test]
fn save_verify_latest_gc() {
    let dir = tmp();
    let ck = dir.path().join("run/ckpt");
    for step in [5u64, 7, 9] {
        let out = save_cmd(&ck, dir.path(), step).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            stdout(&out).trim_end(),
            ck.join(format!("step-00000{step}")).display().to_string()
        );
    }
    // The inputs are copied, never moved.
    assert!(dir.path().join("model-9.safetensors").exists());
    assert_eq!(
        fs::read(dir.path().join("model-9.safetensors")).unwrap(),
        fs::read(ck.join("step-000009/model.safetensors")).unwrap()
    );
    assert_eq!(
        latest(&ck).unwrap(),
        ck.join("step-000009").display().to_string()
    );
    let (code, v) = verify_json(&ck);
    assert_eq!(code, 0);
    assert_eq!(v["ok"], true);
    assert_eq!(v["latest"], "step-000009");
    assert_eq!(v["load"], "step-000009");
    assert_eq!(v["steps"].as_array().unwrap().len(), 3);
    assert!(v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["status"] == "ok"));
    // The human table names every step.
    let out = tlio().args(["ckpt", "verify"]).arg(&ck).output().unwrap();
    let text = stdout(&out);
    assert!(
        text.contains("step-000005") && text.contains("LATEST"),
        "{text}"
    );
    // One step directory.
    tlio()
        .args(["ckpt", "verify"])
        .arg(ck.join("step-000007"))
        .assert()
        .success();
    // The step LATEST names is refused: a save must move LATEST forward.
    save_cmd(&ck, dir.path(), 9)
        .assert()
        .code(1)
        .stderr(predicates::str::contains(
            "step 9 is not newer than step-000009",
        ))
        .stderr(predicates::str::contains("--overwrite"));
    save_cmd(&ck, dir.path(), 9)
        .arg("--overwrite")
        .assert()
        .success();
    // gc --keep 1: dry run lists, then removes.
    let out = tlio()
        .args(["ckpt", "gc", "--keep", "1", "--dry-run", "--json"])
        .arg(&ck)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(removed, ["step-000005", "step-000007"]);
    assert!(ck.join("step-000005").exists());
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
    assert!(!ck.join("step-000005").exists() && !ck.join("step-000007").exists());
    assert!(ck.join("step-000009").exists());
    tlio()
        .args(["ckpt", "gc", "--keep", "0"])
        .arg(&ck)
        .assert()
        .code(2);
}

#[test]
fn save_validates_every_input_first() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    let (model, opt) = inputs(dir.path(), 3);
    let bad_state = dir.path().join("state.json");
    let cases: Vec<(&str, String, i32)> =
        vec![
        ("unknown key", r#"{"step": 3, "epoch": 1}"#.into(), 1),
        (
            "even increment",
            r#"{"step": 3, "rng_state": {"state": "185706b82c2e03f8", "inc": "000000000000006c"}}"#
                .into(),
            1,
        ),
        ("negative cursor", r#"{"step": 3, "data_cursor": {"shard": 0, "offset": -2}}"#.into(), 1),
        ("short git sha", r#"{"step": 3, "git_sha": "abc1234"}"#.into(), 1),
        ("negative step", r#"{"step": -3}"#.into(), 1),
        ("other step", r#"{"step": 4}"#.into(), 1),
    ];
    for (what, text, code) in cases {
        fs::write(&bad_state, text).unwrap();
        tlio()
            .args(["ckpt", "save"])
            .arg(&ck)
            .args(["--step", "3", "--model"])
            .arg(&model)
            .arg("--state")
            .arg(&bad_state)
            .assert()
            .code(code)
            .stderr(predicates::str::starts_with("tlio: error: "));
        assert!(!ck.exists(), "{what}: something was written");
    }
    // A model that breaks a reader rule; a missing model; an optimizer for another
    // model; a config that is not JSON.
    let junk = dir.path().join("junk.safetensors");
    fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\xffnot a header").unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(&junk)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("rule"));
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(dir.path().join("missing.safetensors"))
        .assert()
        .code(2);
    assert!(!ck.exists());
    let config = dir.path().join("config.json");
    fs::write(&config, b"{oops").unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(&model)
        .arg("--config")
        .arg(&config)
        .assert()
        .code(1);
    assert!(!ck.exists());
    let other = dir.path().join("other.safetensors");
    let w = [1.0f32];
    st::save(
        &other,
        &[Tensor {
            name: "head".into(),
            dtype: Dtype::F32,
            shape: vec![1],
            data: TensorData::F32(&w),
        }],
        &BTreeMap::new(),
    )
    .unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(&other)
        .arg("--optimizer")
        .arg(&opt)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("optimizer"));
    assert_eq!(
        fs::read_dir(&ck)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name() != ".lock")
            .count(),
        0,
        "a refused save leaves nothing behind"
    );
    // A dangling symlink as input is a missing file (exit 2); a symlink to a real
    // model is followed.
    let dangling = dir.path().join("dangling.safetensors");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(&dangling)
        .assert()
        .code(2);
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "2", "--model"])
        .arg(&link)
        .assert()
        .success();
    assert_eq!(
        fs::read(ck.join("step-000002/model.safetensors")).unwrap(),
        fs::read(&model).unwrap()
    );
    // With a config and a state file that leaves keys out, the defaults are written.
    fs::write(&config, br#"{"vocab": 256}"#).unwrap();
    fs::write(&bad_state, br#"{"step": 3, "tokens_seen": 99}"#).unwrap();
    tlio()
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "3", "--model"])
        .arg(&model)
        .arg("--state")
        .arg(&bad_state)
        .arg("--config")
        .arg(&config)
        .assert()
        .success();
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(ck.join("step-000003/trainer_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["tokens_seen"], 99);
    assert_eq!(state["config_sha256"].as_str().unwrap().len(), 64);
    assert!(state["lr"].is_null() && state["git_sha"].is_null());
}

/// Files of a step directory by name.
fn contents(step_dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(step_dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn crash_drill_at_every_fsync_and_rename() {
    let dir = tmp();
    let inputs_dir = dir.path().join("inputs");
    fs::create_dir(&inputs_dir).unwrap();
    let (model5, _) = inputs(&inputs_dir, 5);
    let (model7, _) = inputs(&inputs_dir, 7);
    let (m5, m7) = (fs::read(model5).unwrap(), fs::read(model7).unwrap());
    for (point, count) in [("ckpt/fsync", FSYNCS), ("ckpt/rename", RENAMES)] {
        for k in 0..=count {
            let ck = dir.path().join(format!("{}-{k}", point.replace('/', "-")));
            save_cmd(&ck, &inputs_dir, 5).assert().success();
            let old = contents(&ck.join("step-000005"));
            let out = save_cmd(&ck, &inputs_dir, 7)
                .env("FAILPOINTS", format!("{point}={k}*off->return"))
                .output()
                .unwrap();
            // The k-th point aborts the process (a signal, no exit code); after the
            // last one the save completes.
            if k < count {
                assert_eq!(
                    out.status.code(),
                    None,
                    "{point} k={k}: not aborted: {out:?}"
                );
            } else {
                assert!(out.status.success(), "{point} k={k}: {out:?}");
            }
            let picked = latest(&ck).expect("a checkpoint survives every crash");
            let (code, v) = verify_json(&ck);
            assert_eq!(code, 0, "{point} k={k}: {v}");
            assert_eq!(
                ck.join(v["load"].as_str().unwrap()).display().to_string(),
                picked,
                "{point} k={k}"
            );
            let got = contents(Path::new(&picked));
            if picked.ends_with("step-000005") {
                assert_eq!(got, old, "{point} k={k}");
            } else {
                assert!(picked.ends_with("step-000007"));
                assert_eq!(got["model.safetensors"], m7, "{point} k={k}");
            }
            assert_ne!(m5, m7);
            // Crashes before the LATEST rename keep the old step, after it the new:
            // the LATEST rename is the second rename, after the seventh fsync.
            let expect_new = match point {
                "ckpt/rename" => k == RENAMES,
                _ => k >= FSYNCS - 1,
            };
            assert_eq!(picked.ends_with("step-000007"), expect_new, "{point} k={k}");
            // The next save cleans up whatever the crash left.
            save_cmd(&ck, &inputs_dir, 9).assert().success();
            let names: Vec<String> = fs::read_dir(&ck)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect();
            assert!(names.is_empty(), "{point} k={k}: {names:?}");
        }
    }
}

#[test]
fn corruption_is_named_and_load_falls_back() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    save_cmd(&ck, dir.path(), 5).assert().success();
    save_cmd(&ck, dir.path(), 7).assert().success();
    let sd = ck.join("step-000007");
    let pristine = contents(&sd);
    let restore = || {
        for entry in fs::read_dir(&sd).unwrap() {
            let p = entry.unwrap().path();
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                fs::remove_dir_all(&p).unwrap();
            } else {
                fs::remove_file(&p).unwrap();
            }
        }
        for (n, b) in &pristine {
            fs::write(sd.join(n), b).unwrap();
        }
    };
    let outside = dir.path().join("outside.txt");
    fs::write(&outside, b"keep me").unwrap();
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "flipped byte",
            Box::new(|sd: &Path| {
                let p = sd.join("optimizer.safetensors");
                let mut b = fs::read(&p).unwrap();
                let i = b.len() - 3;
                b[i] ^= 1;
                fs::write(&p, b).unwrap();
            }),
            "optimizer.safetensors sha256 mismatch",
        ),
        (
            "truncated",
            Box::new(|sd: &Path| {
                let p = sd.join("model.safetensors");
                let b = fs::read(&p).unwrap();
                fs::write(&p, &b[..b.len() - 4]).unwrap();
            }),
            "model.safetensors has",
        ),
        (
            "missing file",
            Box::new(|sd: &Path| fs::remove_file(sd.join("trainer_state.json")).unwrap()),
            "trainer_state.json is missing",
        ),
        (
            "extra file",
            Box::new(|sd: &Path| fs::write(sd.join("notes.txt"), b"x").unwrap()),
            "unlisted file notes.txt",
        ),
        (
            "missing manifest",
            Box::new(|sd: &Path| fs::remove_file(sd.join("MANIFEST.json")).unwrap()),
            "missing MANIFEST.json",
        ),
        (
            "manifest naming ../x",
            Box::new(|sd: &Path| {
                fs::write(
                    sd.join("MANIFEST.json"),
                    br#"{"format":"tlio-manifest","version":1,"step":7,"files":[{"name":"../outside.txt","size":7,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"}]}"#,
                )
                .unwrap()
            }),
            "not a plain file name",
        ),
        (
            "manifest naming an absolute path",
            Box::new(|sd: &Path| {
                let text = format!(
                    r#"{{"format":"tlio-manifest","version":1,"step":7,"files":[{{"name":{},"size":7,"sha256":"{}"}}]}}"#,
                    serde_json::to_string(
                        &sd.parent().unwrap().parent().unwrap().join("outside.txt")
                    )
                    .unwrap(),
                    "0".repeat(64)
                );
                fs::write(sd.join("MANIFEST.json"), text).unwrap()
            }),
            "not a plain file name",
        ),
        (
            "symlink",
            Box::new(|sd: &Path| {
                let p = sd.join("trainer_state.json");
                fs::remove_file(&p).unwrap();
                std::os::unix::fs::symlink(
                    sd.parent().unwrap().parent().unwrap().join("outside.txt"),
                    &p,
                )
                .unwrap();
            }),
            "symbolic link",
        ),
    ];
    for (what, damage, message) in cases {
        damage(&sd);
        let (code, v) = verify_json(&ck);
        assert_eq!(code, 1, "{what}");
        assert_eq!(v["load"], "step-000005", "{what}");
        let row = &v["steps"][1];
        assert!(
            row["status"].as_str().unwrap().contains(message),
            "{what}: {}",
            row["status"]
        );
        assert_eq!(
            latest(&ck).unwrap(),
            ck.join("step-000005").display().to_string()
        );
        // The step directory alone fails too, and names the problem.
        let out = tlio().args(["ckpt", "verify"]).arg(&sd).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(stdout(&out).contains(message), "{what}");
        assert_eq!(fs::read(&outside).unwrap(), b"keep me", "{what}");
        restore();
    }
    // LATEST naming nothing.
    fs::write(ck.join("LATEST"), b"step-000042\n").unwrap();
    let (code, v) = verify_json(&ck);
    assert_eq!(code, 1);
    assert_eq!(v["load"], "step-000007");
    assert!(v["latest_problem"]
        .as_str()
        .unwrap()
        .contains("does not exist"));
    // Nothing valid at all: latest exits 1 and says why for each directory.
    fs::remove_file(ck.join("step-000005/MANIFEST.json")).unwrap();
    fs::remove_file(ck.join("step-000007/MANIFEST.json")).unwrap();
    tlio()
        .args(["ckpt", "latest"])
        .arg(&ck)
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicates::str::contains(
            "step-000005: missing MANIFEST.json",
        ));
    // gc with a symlinked step directory removes the link only.
    fs::remove_dir_all(&ck).unwrap();
    save_cmd(&ck, dir.path(), 5).assert().success();
    save_cmd(&ck, dir.path(), 7).assert().success();
    let target = dir.path().join("precious");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("MANIFEST.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(&target, ck.join("step-000006")).unwrap();
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
    assert!(target.join("MANIFEST.json").exists());
    assert!(fs::symlink_metadata(ck.join("step-000006")).is_err());
}

#[test]
fn a_save_waits_for_the_lock_while_gc_fails_at_once() {
    use std::io::{BufRead, BufReader};
    let dir = tmp();
    let ck = dir.path().join("ck");
    save_cmd(&ck, dir.path(), 5).assert().success();
    // This test holds the directory's lock itself, so no timing window is involved:
    // every step below happens while the lock is certainly held.
    let held = tlio_core::checkpoint::DirLock::acquire(&ck).unwrap();
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "locked by another tlio save or gc",
        ));
    // A dry run needs no lock.
    tlio()
        .args(["ckpt", "gc", "--dry-run", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
    let (model, opt) = inputs(dir.path(), 9);
    let mut saver = Command::new(assert_cmd::cargo::cargo_bin("tlio"))
        .args(["ckpt", "save"])
        .arg(&ck)
        .args(["--step", "9", "--model"])
        .arg(&model)
        .arg("--optimizer")
        .arg(&opt)
        .env_remove("FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Handshake: the save says that it waits (after about a second) and is still
    // running; only then is the lock released.
    let mut stderr = BufReader::new(saver.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(
        line.contains("waiting for") && line.contains(".lock"),
        "{line}"
    );
    assert!(saver.try_wait().unwrap().is_none(), "the save gave up");
    assert!(!ck.join("step-000009").exists());
    drop(held);
    assert!(saver.wait().unwrap().success());
    assert_eq!(
        latest(&ck).unwrap(),
        ck.join("step-000009").display().to_string()
    );
}

#[test]
fn a_refused_lock_names_its_holders_pid_and_host() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    save_cmd(&ck, dir.path(), 5).assert().success();
    // This process takes the lock as a tlio save would; the gc of another process is
    // refused at once and names this one.
    let held = tlio_core::checkpoint::DirLock::acquire(&ck).unwrap();
    let me = tlio_core::checkpoint::holder::Holder::this_process();
    let out = tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let named = format!(
        "locked by another tlio save or gc (pid {} on host {})",
        me.pid, me.host
    );
    assert!(err.contains(&named), "{err}");
    drop(held);
    // Released, the record left behind names no one: the next taker replaces it.
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
}

#[test]
fn gc_dry_run_works_on_a_read_only_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    let ck = dir.path().join("ck");
    save_cmd(&ck, dir.path(), 5).assert().success();
    save_cmd(&ck, dir.path(), 7).assert().success();
    fs::remove_file(ck.join(".lock")).unwrap();
    fs::set_permissions(&ck, fs::Permissions::from_mode(0o555)).unwrap();
    let out = tlio()
        .args(["ckpt", "gc", "--dry-run", "--keep", "1"])
        .arg(&ck)
        .output()
        .unwrap();
    fs::set_permissions(&ck, fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("would remove step-000005"));
    assert!(!ck.join(".lock").exists());
}

#[test]
fn a_save_behind_latest_is_refused_and_gc_keeps_unproven_steps() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    for n in [150, 200] {
        save_cmd(&ck, dir.path(), n).assert().success();
    }
    // The reproducer: step 1 into a directory whose LATEST names 200.
    let out = save_cmd(&ck, dir.path(), 1).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("step 1 is not newer than step-000200") && err.contains("--force"),
        "{err}"
    );
    assert!(!ck.join("step-000001").exists());
    // Nothing is lost to gc, and resume still finds 200.
    tlio()
        .args(["ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .assert()
        .success();
    assert_eq!(
        latest(&ck).unwrap(),
        ck.join("step-000200").display().to_string()
    );
    // With --force LATEST moves back (someone who means it).
    save_cmd(&ck, dir.path(), 1)
        .arg("--force")
        .assert()
        .success();
    assert_eq!(
        latest(&ck).unwrap(),
        ck.join("step-000001").display().to_string()
    );

    // A dangling LATEST: gc removes nothing newer than the newest verifying step,
    // and says so.
    let ck = dir.path().join("ck2");
    for n in [100, 150, 200] {
        save_cmd(&ck, dir.path(), n).assert().success();
    }
    let model = ck.join("step-000200").join("model.safetensors");
    let mut b = fs::read(&model).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    fs::write(&model, b).unwrap();
    fs::write(ck.join("LATEST"), b"step-000120\n").unwrap();
    let out = tlio()
        .args(["--json", "ckpt", "gc", "--keep", "1"])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["kept_newer"],
        serde_json::json!(["step-000200"]),
        "{doc}"
    );
    assert!(doc["latest_problem"]
        .as_str()
        .unwrap()
        .contains("step-000120"));
    assert!(ck.join("step-000200").exists());
    let text = stdout(
        &tlio()
            .args(["ckpt", "gc", "--keep", "1", "--dry-run"])
            .arg(&ck)
            .output()
            .unwrap(),
    );
    assert!(text.contains("kept step-000200"), "{text}");

    // `ckpt latest` says which newer step it refused, and why.
    fs::write(ck.join("LATEST"), b"step-000200\n").unwrap();
    let out = tlio().args(["ckpt", "latest"]).arg(&ck).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("skipped step-000200") && err.contains("sha256 mismatch"),
        "{err}"
    );
    let out = tlio()
        .args(["--json", "ckpt", "latest"])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(out.stderr.is_empty());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["skipped"][0]["name"], "step-000200", "{doc}");
    assert!(doc["skipped"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("sha256 mismatch"));
}

#[test]
fn verify_json_carries_exact_names_and_the_table_escapes_them() {
    let dir = tmp();
    let ck = dir.path().join("ck");
    save_cmd(&ck, dir.path(), 3).assert().success();
    let evil = "evil\u{1b}[31m\u{202e}txt";
    fs::write(ck.join("step-000003").join(evil), b"x").unwrap();
    let (code, doc) = verify_json(&ck);
    assert_eq!(code, 1);
    let problem = doc["steps"][0]["problems"][0].as_str().unwrap();
    assert!(problem.contains(evil), "{problem}");
    assert!(doc["steps"][0]["status"].as_str().unwrap().contains(evil));
    // The step directory itself, JSON and human.
    let out = tlio()
        .args(["ckpt", "verify", "--json"])
        .arg(ck.join("step-000003"))
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["problems"][0].as_str().unwrap().contains(evil), "{doc}");
    for target in [ck.clone(), ck.join("step-000003")] {
        let out = tlio()
            .args(["ckpt", "verify"])
            .arg(&target)
            .output()
            .unwrap();
        let text = stdout(&out);
        assert!(text.contains("evil\\u{1b}[31m\\u{202e}txt"), "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{202e}'),
            "{text}"
        );
    }
}
