//! The checkpoint tests of the seed's section 4 (test_checkpoint_roundtrip through
//! test_rejects_bad_state), plus corruption, path-safety and lock checks.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::fsops::{Fill, FsOps, Op, RealFs, RecordingFs};
use super::*;
use crate::digest::hex;
use crate::safetensors::{self as st, Dtype, Tensor, TensorData};

/// Section 3's Linear(2, 1) after two AdamW steps: awkward float bits on purpose.
pub(crate) fn linear_model() -> Vec<(String, Vec<u64>, Vec<f32>)> {
    vec![
        ("weight".into(), vec![1, 2], vec![0.1, -0.0]),
        ("bias".into(), vec![1], vec![f32::from_bits(1)]),
    ]
}

pub(crate) fn model_bytes(tensors: &[(String, Vec<u64>, Vec<f32>)]) -> Vec<u8> {
    let ts: Vec<Tensor<'_>> = tensors
        .iter()
        .map(|(n, s, v)| Tensor {
            name: n.clone(),
            dtype: Dtype::F32,
            shape: s.clone(),
            data: TensorData::F32(v),
        })
        .collect();
    let meta = BTreeMap::from([("format".to_string(), "tinyllm".to_string())]);
    let mut out = Vec::new();
    st::write(&mut out, &ts, &meta).unwrap();
    out
}

pub(crate) fn adamw(step: u64, seed: f32) -> OptimizerFile {
    let mut tensors = BTreeMap::new();
    tensors.insert("weight.exp_avg".into(), (vec![1, 2], vec![seed, -1e-30]));
    tensors.insert(
        "weight.exp_avg_sq".into(),
        (vec![1, 2], vec![seed * seed, 3e-38]),
    );
    tensors.insert("bias.exp_avg".into(), (vec![1], vec![-seed]));
    tensors.insert("bias.exp_avg_sq".into(), (vec![1], vec![0.7]));
    OptimizerFile {
        state: OptimizerState::AdamW {
            step,
            lr: 0.01,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
        },
        tensors,
    }
}

pub(crate) fn opt_bytes(opt: &OptimizerFile) -> Vec<u8> {
    let mut out = Vec::new();
    opt.write(&mut out).unwrap();
    out
}

/// A complete save of `step` whose model bias encodes the step, so steps differ.
pub(crate) fn request(step: u64) -> SaveRequest<'static> {
    let mut model = linear_model();
    model[1].2 = vec![step as f32];
    let mut req = SaveRequest::new(
        step,
        Payload::Bytes(Cow::Owned(model_bytes(&model))),
        TrainerState {
            tokens_seen: step * 16,
            rng_state: Some(RngState {
                state: 0x185706b82c2e03f8 ^ step,
                inc: 0x6d,
            }),
            ..TrainerState::new(step)
        },
    );
    req.optimizer = Some(Payload::Bytes(Cow::Owned(opt_bytes(&adamw(step, 0.5)))));
    req
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn step_names() {
    assert_eq!(step_name(7), "step-000007");
    assert_eq!(step_name(1234567), "step-1234567");
    assert_eq!(parse_step_name("step-000007"), Some(7));
    assert_eq!(parse_step_name("step-1234567"), Some(1234567));
    for bad in [
        "step-7",
        "step-0000007",
        "step-00000a",
        "step-000007.tmp",
        "xstep-000007",
    ] {
        assert_eq!(parse_step_name(bad), None, "{bad}");
    }
    // Numbers, not strings: step 1000000 is newer than 999999.
    assert!(parse_step_name("step-1000000") > parse_step_name("step-999999"));
}

#[test]
fn test_checkpoint_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ckpt");
    let model = linear_model();
    let opt = adamw(2, 0.1);
    let (model_ref, opt_ref) = (&model, &opt);
    let mut req = SaveRequest::new(
        7,
        Payload::Writer(Box::new(move |w: &mut dyn Write| {
            w.write_all(&model_bytes(model_ref))
        })),
        TrainerState {
            tokens_seen: 28,
            data_cursor: Some(DataCursor {
                shard: 0,
                offset: 6,
                global_batch: None,
                epoch_rng: None,
            }),
            rng_state: Some(RngState {
                state: 0x185706b82c2e03f8,
                inc: 0x6d,
            }),
            lr: Some(0.01),
            ..TrainerState::new(7)
        },
    );
    req.optimizer = Some(Payload::Writer(Box::new(move |w: &mut dyn Write| {
        opt_ref.write(w).map(|_| ()).map_err(std::io::Error::other)
    })));
    let report = save(&ck, req).unwrap();
    assert_eq!(report.path, ck.join("step-000007"));
    assert_eq!(names(&ck), [".lock", "LATEST", "step-000007"]);
    assert_eq!(fs::read(ck.join("LATEST")).unwrap(), b"step-000007\n");
    assert_eq!(
        names(&report.path),
        [
            "MANIFEST.json",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json"
        ]
    );

    let loaded = load(&ck, None).unwrap();
    assert_eq!(loaded.step, 7);
    assert_eq!(
        loaded.state.data_cursor,
        Some(DataCursor {
            shard: 0,
            offset: 6,
            global_batch: None,
            epoch_rng: None,
        })
    );
    assert_eq!(loaded.state.rng_state.unwrap().state, 0x185706b82c2e03f8);
    assert_eq!(loaded.state.lr.map(f64::to_bits), Some(0.01f64.to_bits()));
    assert_eq!(loaded.config, None);
    let m = loaded.model().unwrap();
    for (name, shape, values) in &model {
        assert_eq!(&m.header().get(name).unwrap().shape, shape);
        assert_eq!(bits(&m.decode_f32(name).unwrap()), bits(values), "{name}");
    }
    let back = loaded.optimizer().unwrap().unwrap();
    assert_eq!(back.state, opt.state);
    for (name, (shape, values)) in &opt.tensors {
        let (s, v) = &back.tensors[name];
        assert_eq!(s, shape);
        assert_eq!(bits(v), bits(values), "{name}");
    }
    assert_eq!(back.tensors.len(), 4);
    // Loading an explicit step gives the same directory.
    assert_eq!(load(&ck, Some(7)).unwrap().path, loaded.path);
}

#[test]
fn test_layout_matches_the_formats() {
    let dir = tempfile::tempdir().unwrap();
    let step_dir = save(dir.path(), request(5)).unwrap().path;
    // trainer_state.json: every key, hex words.
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(step_dir.join(STATE_NAME)).unwrap()).unwrap();
    let keys: Vec<&str> = state
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let mut want = vec![
        "config_sha256",
        "data_cursor",
        "git_sha",
        "lr",
        "rng_state",
        "step",
        "tokens_seen",
    ];
    want.sort();
    let mut got = keys.clone();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(
        state["rng_state"]["state"],
        format!("{:016x}", 0x185706b82c2e03f8u64 ^ 5)
    );
    assert_eq!(state["rng_state"]["inc"], "000000000000006d");
    // MANIFEST.json: sorted, true sizes and hashes, every other file, nothing else.
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(step_dir.join(MANIFEST_NAME)).unwrap()).unwrap();
    assert_eq!(manifest["format"], "tlio-manifest");
    assert_eq!(manifest["version"], 1);
    assert_eq!(manifest["step"], 5);
    let files = manifest["files"].as_array().unwrap();
    let listed: Vec<&str> = files.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(listed, [MODEL_NAME, OPTIMIZER_NAME, STATE_NAME]);
    for f in files {
        let bytes = fs::read(step_dir.join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(f["size"], bytes.len() as u64);
        assert_eq!(f["sha256"], hex(&Sha256::digest(&bytes)));
    }
    // Tensor names and the optimizer metadata.
    let model = st::read_header(&step_dir.join(MODEL_NAME)).unwrap();
    let mut model_names: Vec<&str> = model.tensors().iter().map(|t| t.name.as_str()).collect();
    model_names.sort();
    assert_eq!(model_names, ["bias", "weight"]);
    assert_eq!(model.metadata["format"], "tinyllm");
    let opt = st::read_header(&step_dir.join(OPTIMIZER_NAME)).unwrap();
    let mut opt_names: Vec<&str> = opt.tensors().iter().map(|t| t.name.as_str()).collect();
    opt_names.sort();
    assert_eq!(
        opt_names,
        [
            "bias.exp_avg",
            "bias.exp_avg_sq",
            "weight.exp_avg",
            "weight.exp_avg_sq"
        ]
    );
    assert!(opt.tensors().iter().all(|t| t.dtype == Dtype::F32));
    assert_eq!(opt.metadata["format"], "tinyllm");
    assert!(opt.metadata["state"].starts_with("{\"type\":\"adamw\",\"step\":5,"));
    // An unlisted file makes the directory fail.
    assert!(verify(&step_dir).is_empty());
    fs::write(step_dir.join("notes.txt"), b"hi").unwrap();
    assert_eq!(verify(&step_dir), [Problem::Unlisted("notes.txt".into())]);
}

#[test]
fn test_config_and_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let config = br#"{"vocab": 256, "lr": 0.01}"#.to_vec();
    let mut req = SaveRequest::new(
        3,
        Payload::Bytes(Cow::Owned(model_bytes(&linear_model()))),
        TrainerState::new(3),
    );
    req.config = Some(Cow::Owned(config.clone()));
    let path = save(dir.path(), req).unwrap().path;
    assert_eq!(fs::read(path.join(CONFIG_NAME)).unwrap(), config);
    let sha = hex(&Sha256::digest(&config));
    let loaded = load(dir.path(), None).unwrap();
    assert_eq!(loaded.config.as_deref(), Some(config.as_slice()));
    assert_eq!(
        loaded.state,
        TrainerState {
            config_sha256: Some(sha.clone()),
            ..TrainerState::new(3)
        }
    );
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(path.join(STATE_NAME)).unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"step": 3, "tokens_seen": 0, "data_cursor": null, "rng_state": null,
            "lr": null, "config_sha256": sha, "git_sha": null})
    );
    // A config_sha256 that disagrees with the config is refused, nothing written.
    let other = tempfile::tempdir().unwrap();
    let ck = other.path().join("ck");
    let mut req = SaveRequest::new(
        3,
        Payload::Bytes(Cow::Owned(model_bytes(&linear_model()))),
        TrainerState {
            config_sha256: Some("0".repeat(64)),
            ..TrainerState::new(3)
        },
    );
    req.config = Some(Cow::Owned(config.clone()));
    assert!(matches!(
        save(&ck, req),
        Err(CheckpointError::State(
            state::StateError::ConfigMismatch { .. }
        ))
    ));
    assert!(!ck.exists());
    // A config that is not JSON is refused too.
    let mut req = SaveRequest::new(
        3,
        Payload::Bytes(Cow::Owned(model_bytes(&linear_model()))),
        TrainerState::new(3),
    );
    req.config = Some(Cow::Borrowed(b"{not json"));
    assert!(matches!(save(&ck, req), Err(CheckpointError::Config(_))));
    assert!(!ck.exists());
    // A tampered config fails verification through its hash in the state.
    fs::write(path.join(CONFIG_NAME), br#"{"vocab": 512, "lr": 0.01}"#).unwrap();
    assert!(!verify(&path).is_empty());
}

#[test]
fn test_sgd_momentum_names() {
    let dir = tempfile::tempdir().unwrap();
    let sgd = |momentum: f64| OptimizerState::Sgd {
        lr: 0.1,
        momentum,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 1e-4,
    };
    let with = OptimizerFile {
        state: sgd(0.9),
        tensors: BTreeMap::from([
            (
                "weight.momentum_buffer".to_string(),
                (vec![1, 2], vec![0.25, -0.5]),
            ),
            ("bias.momentum_buffer".to_string(), (vec![1], vec![1e-20])),
        ]),
    };
    let mut req = request(4);
    req.optimizer = Some(Payload::Bytes(Cow::Owned(opt_bytes(&with))));
    let path = save(dir.path(), req).unwrap().path;
    let params = optimizer::model_params(&path.join(MODEL_NAME)).unwrap();
    let back = OptimizerFile::read(&path.join(OPTIMIZER_NAME), Some(&params)).unwrap();
    assert_eq!(back, with);
    let header = st::read_header(&path.join(OPTIMIZER_NAME)).unwrap();
    let mut names: Vec<&str> = header.tensors().iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["bias.momentum_buffer", "weight.momentum_buffer"]);

    // Momentum 0: no arrays at all.
    let without = OptimizerFile {
        state: sgd(0.0),
        tensors: BTreeMap::new(),
    };
    let mut req = request(5);
    req.optimizer = Some(Payload::Bytes(Cow::Owned(opt_bytes(&without))));
    let path = save(dir.path(), req).unwrap().path;
    let back = OptimizerFile::read(&path.join(OPTIMIZER_NAME), Some(&params)).unwrap();
    assert_eq!(back, without);

    // Before the first step SGD with momentum has no buffers yet (like torch).
    let fresh = OptimizerFile {
        state: sgd(0.9),
        tensors: BTreeMap::new(),
    };
    assert!(fresh.validate(Some(&params)).is_ok());
    // Wrong names are refused: a buffer with momentum 0, a missing parameter, AdamW
    // names under SGD, an array for a parameter the model does not have.
    let bad = [
        OptimizerFile {
            state: sgd(0.0),
            tensors: with.tensors.clone(),
        },
        OptimizerFile {
            state: sgd(0.9),
            tensors: BTreeMap::from([(
                "weight.momentum_buffer".to_string(),
                (vec![1, 2], vec![0.0, 0.0]),
            )]),
        },
        OptimizerFile {
            state: sgd(0.9),
            tensors: adamw(1, 0.1).tensors,
        },
    ];
    for (i, b) in bad.iter().enumerate() {
        assert!(b.validate(Some(&params)).is_err(), "case {i}");
    }
    let mut extra = with.clone();
    extra
        .tensors
        .insert("head.momentum_buffer".into(), (vec![1], vec![0.0]));
    let mut req = request(6);
    req.optimizer = Some(Payload::Bytes(Cow::Owned(opt_bytes(&extra))));
    assert!(matches!(
        save(dir.path(), req),
        Err(CheckpointError::Optimizer(_))
    ));
    assert!(!dir.path().join("step-000006").exists());
    assert!(!dir.path().join("step-000006.tmp").exists());
    assert_eq!(load(dir.path(), None).unwrap().step, 5);
}

/// A seam that "crashes" (unwinds, skipping every later effect and cleanup) at the
/// k-th fsync or rename, counting both kinds together.
struct CrashFs {
    inner: RealFs,
    countdown: usize,
}

struct Crash;

impl CrashFs {
    fn tick(&mut self) {
        if self.countdown == 0 {
            panic::panic_any(Crash);
        }
        self.countdown -= 1;
    }
}

impl FsOps for CrashFs {
    fn create_dir_all(&mut self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(p)
    }
    fn create_dir(&mut self, p: &Path) -> std::io::Result<()> {
        self.inner.create_dir(p)
    }
    fn write_file(&mut self, p: &Path, fill: &mut Fill<'_>) -> std::io::Result<()> {
        self.inner.write_file(p, fill)
    }
    fn fsync_file(&mut self, p: &Path) -> std::io::Result<()> {
        self.tick();
        self.inner.fsync_file(p)
    }
    fn fsync_dir(&mut self, p: &Path) -> std::io::Result<()> {
        self.tick();
        self.inner.fsync_dir(p)
    }
    fn rename(&mut self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.tick();
        self.inner.rename(a, b)
    }
    fn exchange(&mut self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.tick();
        self.inner.exchange(a, b)
    }
    fn remove_dir_all(&mut self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_dir_all(p)
    }
    fn remove_file(&mut self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
}

/// Files of a step directory by name, for exact old-or-new comparisons.
pub(crate) fn contents(step_dir: &Path) -> BTreeMap<String, Vec<u8>> {
    names(step_dir)
        .into_iter()
        .map(|n| {
            let bytes = fs::read(step_dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

#[test]
fn test_crash_at_every_write_keeps_a_valid_checkpoint() {
    // How many fsyncs and renames one save makes.
    let probe = tempfile::tempdir().unwrap();
    save(probe.path(), request(5)).unwrap();
    let mut rec = RecordingFs::new();
    save_with(&mut rec, probe.path(), request(7)).unwrap();
    let fsyncs = rec
        .ops
        .iter()
        .filter(|o| matches!(o, Op::FsyncFile(_) | Op::FsyncDir(_)))
        .count();
    let renames = rec
        .ops
        .iter()
        .filter(|o| matches!(o, Op::Rename { .. } | Op::Exchange { .. }))
        .count();
    assert!(fsyncs >= 8, "only {fsyncs} fsyncs per save");
    assert_eq!(renames, 2);
    let old = contents(&probe.path().join("step-000005"));
    let new = contents(&probe.path().join("step-000007"));

    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let mut outcomes = BTreeMap::new();
    for k in 0..=fsyncs + renames {
        let dir = tempfile::tempdir().unwrap();
        // A stale tmp of the step being saved and one of another step.
        save(dir.path(), request(5)).unwrap();
        fs::create_dir(dir.path().join("step-000007.tmp")).unwrap();
        fs::write(
            dir.path().join("step-000007.tmp/model.safetensors"),
            b"junk",
        )
        .unwrap();
        let mut fs_ops = CrashFs {
            inner: RealFs,
            countdown: k,
        };
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            save_with(&mut fs_ops, dir.path(), request(7)).map(|_| ())
        }));
        let crashed = match result {
            Err(payload) => {
                assert!(payload.is::<Crash>(), "k={k}: a real panic");
                true
            }
            Ok(r) => {
                r.unwrap();
                false
            }
        };
        // Every step-N directory is complete, LATEST names one of them, load gives
        // exactly the old or the new bytes.
        let listing = list(dir.path()).unwrap();
        for n in &listing.steps {
            assert!(
                verify(&dir.path().join(step_name(*n))).is_empty(),
                "k={k} step {n}"
            );
        }
        let latest = listing.latest().step().unwrap();
        assert!(listing.steps.contains(&latest), "k={k}");
        let loaded = load(dir.path(), None).unwrap();
        let got = contents(&loaded.path);
        assert!(got == old || got == new, "k={k}: mixed bytes");
        assert_eq!(got == new, loaded.step == 7);
        if !crashed {
            assert_eq!(loaded.step, 7);
        }
        *outcomes.entry(loaded.step).or_insert(0) += 1;
    }
    panic::set_hook(hook);
    // Crashes before the LATEST rename keep 5, after it give 7.
    assert!(outcomes[&5] >= fsyncs, "{outcomes:?}");
    assert!(outcomes[&7] >= 2, "{outcomes:?}");
}

/// Flip one byte of `path` at `at`.
fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    let i = at.min(bytes.len() - 1);
    bytes[i] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: every kind of incomplete or corrupt step in one directory, then what load and verify say"
)]
fn test_load_skips_incomplete_and_corrupt() {
    // A flipped byte anywhere in any file: load falls back, verify names the file.
    let base = tempfile::tempdir().unwrap();
    save(base.path(), request(5)).unwrap();
    save(base.path(), request(7)).unwrap();
    let files = names(&base.path().join("step-000007"));
    for name in &files {
        let len = fs::metadata(base.path().join("step-000007").join(name))
            .unwrap()
            .len() as usize;
        for at in [0, len / 2, len - 1] {
            let dir = tempfile::tempdir().unwrap();
            save(dir.path(), request(5)).unwrap();
            save(dir.path(), request(7)).unwrap();
            let sd = dir.path().join("step-000007");
            flip(&sd.join(name), at);
            let problems = verify(&sd);
            assert!(!problems.is_empty(), "{name}@{at}");
            let text = problems[0].to_string();
            assert!(
                text.contains(name) || text.contains("MANIFEST"),
                "{name}@{at}: {text}"
            );
            assert_eq!(load(dir.path(), None).unwrap().step, 5, "{name}@{at}");
        }
        // Truncated, missing.
        for damage in ["truncate", "remove"] {
            let dir = tempfile::tempdir().unwrap();
            save(dir.path(), request(5)).unwrap();
            save(dir.path(), request(7)).unwrap();
            let p = dir.path().join("step-000007").join(name);
            if damage == "truncate" {
                let len = fs::metadata(&p).unwrap().len();
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    // The manifest's final newline is not part of its meaning.
                    .set_len(if name == MANIFEST_NAME {
                        len / 2
                    } else {
                        len - 1
                    })
                    .unwrap();
            } else {
                fs::remove_file(&p).unwrap();
            }
            let problems = verify(&dir.path().join("step-000007"));
            let want = if name == MANIFEST_NAME && damage == "remove" {
                Problem::MissingManifest
            } else if damage == "remove" {
                Problem::Missing(name.clone())
            } else {
                problems[0].clone()
            };
            assert_eq!(problems[0], want, "{name} {damage}");
            assert_eq!(load(dir.path(), None).unwrap().step, 5, "{name} {damage}");
        }
    }
    // An extra file.
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(5)).unwrap();
    save(dir.path(), request(7)).unwrap();
    fs::write(dir.path().join("step-000007/extra.bin"), b"x").unwrap();
    assert_eq!(
        verify(&dir.path().join("step-000007")),
        [Problem::Unlisted("extra.bin".into())]
    );
    assert_eq!(load(dir.path(), None).unwrap().step, 5);
    // A stale LATEST naming nothing: the newest older directory that verifies.
    fs::remove_file(dir.path().join("step-000007/extra.bin")).unwrap();
    fs::write(dir.path().join(LATEST_NAME), b"step-000009\n").unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 7);
    // Nothing valid: a not-found error listing each directory and why.
    flip(&dir.path().join("step-000007/model.safetensors"), 100);
    fs::remove_file(dir.path().join("step-000005/MANIFEST.json")).unwrap();
    match load(dir.path(), None) {
        Err(e @ CheckpointError::NotFound { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("step-000005: missing MANIFEST.json"),
                "{text}"
            );
            assert!(
                text.contains("step-000007: model.safetensors sha256 mismatch"),
                "{text}"
            );
            assert!(text.contains("LATEST: names step-000009"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        load(dir.path(), Some(7)),
        Err(CheckpointError::NotFound { .. })
    ));
}

#[test]
fn test_newer_than_latest_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(5)).unwrap();
    save(dir.path(), request(7)).unwrap();
    save(dir.path(), request(9)).unwrap();
    // A crash between the directory rename and LATEST: 9 is complete but undeclared.
    fs::write(dir.path().join(LATEST_NAME), b"step-000007\n").unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 7);
    let s = survey(dir.path()).unwrap();
    assert_eq!(s.pick, Some(7));
    assert!(s
        .rows
        .iter()
        .any(|r| r.step == 9 && r.newer_than_latest && !r.picked));
    // LATEST names a broken directory: fall back below it, never above.
    flip(&dir.path().join("step-000007/trainer_state.json"), 3);
    assert_eq!(load(dir.path(), None).unwrap().step, 5);
    // Without LATEST the newest complete directory wins.
    fs::remove_file(dir.path().join(LATEST_NAME)).unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 9);
    // A malformed LATEST counts as none.
    fs::write(dir.path().join(LATEST_NAME), b"step-7\n").unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 9);
    // Saving over an undeclared directory replaces it without overwrite.
    fs::write(dir.path().join(LATEST_NAME), b"step-000005\n").unwrap();
    let mut req = request(7);
    req.state.tokens_seen = 12345;
    save(dir.path(), req).unwrap();
    let l = load(dir.path(), None).unwrap();
    assert_eq!((l.step, l.state.tokens_seen), (7, 12345));
    // A declared complete step is refused unless overwrite: it would not move LATEST
    // forward.
    assert!(matches!(
        save(dir.path(), request(7)),
        Err(CheckpointError::NotNewer {
            step: 7,
            latest: 7,
            ..
        })
    ));
    let mut req = request(7);
    req.overwrite = true;
    save(dir.path(), req).unwrap();
    assert_eq!(load(dir.path(), None).unwrap().state.tokens_seen, 7 * 16);
    assert!(!dir.path().join("step-000007.tmp").exists());
}

#[test]
fn test_keep_and_stale_tmp() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path()).ok();
    fs::create_dir(dir.path().join("step-000010.tmp")).unwrap();
    fs::write(
        dir.path().join("step-000010.tmp/model.safetensors"),
        b"half",
    )
    .unwrap();
    fs::write(dir.path().join("LATEST.tmp"), b"step-00").unwrap();
    for step in 1..=4 {
        let mut req = request(step);
        req.keep = Some(2);
        save(dir.path(), req).unwrap();
    }
    assert_eq!(
        names(dir.path()),
        [".lock", "LATEST", "step-000003", "step-000004"]
    );
    // gc: keep 1 removes 3; a stale tmp and a directory newer than LATEST go too.
    fs::create_dir(dir.path().join("step-000011.tmp")).unwrap();
    save(dir.path(), request(6)).unwrap();
    fs::write(dir.path().join(LATEST_NAME), b"step-000004\n").unwrap();
    fs::create_dir(dir.path().join("step-000012.tmp")).unwrap();
    let dry = gc(dir.path(), 1, true).unwrap();
    let planned: Vec<(String, GcReason)> = dry
        .removed
        .iter()
        .map(|r| {
            (
                r.path.file_name().unwrap().to_string_lossy().into_owned(),
                r.reason,
            )
        })
        .collect();
    assert_eq!(
        planned,
        [
            ("step-000012.tmp".to_string(), GcReason::StaleTmp),
            ("step-000006".to_string(), GcReason::NewerThanLatest),
            ("step-000003".to_string(), GcReason::BeyondKeep),
        ]
    );
    assert_eq!(names(dir.path()).len(), 6, "a dry run removes nothing");
    let done = gc(dir.path(), 1, false).unwrap();
    assert_eq!(done.removed, dry.removed);
    assert_eq!(names(dir.path()), [".lock", "LATEST", "step-000004"]);
    // gc never removes what LATEST names nor what load picks, even when it is broken.
    save(dir.path(), request(8)).unwrap();
    flip(&dir.path().join("step-000008/model.safetensors"), 120);
    gc(dir.path(), 1, false).unwrap();
    assert_eq!(
        names(dir.path()),
        [".lock", "LATEST", "step-000004", "step-000008"]
    );
    assert_eq!(load(dir.path(), None).unwrap().step, 4);
    assert!(gc(dir.path(), 0, false).is_err());
}

#[test]
fn test_rejects_bad_state() {
    let bad_json: &[&str] = &[
        r#"{"step": 7, "tokens_seen": 0, "epoch": 3}"#,
        r#"{"step": 7, "rng_state": {"state": "185706b82c2e03f8", "inc": "000000000000006c"}}"#,
        r#"{"step": 7, "data_cursor": {"shard": 0, "offset": -1}}"#,
        r#"{"step": 7, "git_sha": "abc1234"}"#,
        r#"{"step": -7}"#,
        r#"{"step": 7.5}"#,
    ];
    for text in bad_json {
        assert!(
            TrainerState::from_json_with_defaults(text.as_bytes()).is_err(),
            "{text}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ckpt");
    let bad_states = [
        TrainerState {
            rng_state: Some(RngState { state: 1, inc: 2 }),
            ..TrainerState::new(7)
        },
        TrainerState {
            git_sha: Some("abc1234".into()),
            ..TrainerState::new(7)
        },
        TrainerState {
            git_sha: Some("G".repeat(40)),
            ..TrainerState::new(7)
        },
        TrainerState {
            config_sha256: Some("abc".into()),
            ..TrainerState::new(7)
        },
        TrainerState {
            lr: Some(f64::NAN),
            ..TrainerState::new(7)
        },
        TrainerState::new(8),
    ];
    for state in bad_states {
        let mut req = request(7);
        req.state = state.clone();
        assert!(save(&ck, req).is_err(), "{state:?}");
        assert!(!ck.exists(), "something was written for {state:?}");
    }
    // In an existing directory nothing changes either.
    save(&ck, request(5)).unwrap();
    let before = names(&ck);
    let mut req = request(7);
    req.state.rng_state = Some(RngState { state: 1, inc: 4 });
    assert!(save(&ck, req).is_err());
    assert_eq!(names(&ck), before);
    // A model that breaks a reader rule is refused and leaves no tmp behind.
    let mut req = request(7);
    req.model = Payload::Bytes(Cow::Borrowed(b"\x08\0\0\0\0\0\0\0{}"));
    assert!(matches!(
        save(&ck, req),
        Err(CheckpointError::Payload { .. })
    ));
    assert_eq!(names(&ck), before);
}

#[test]
fn manifest_names_outside_and_symlinks_are_rejected_without_touching_anything() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside.bin");
    fs::write(&outside, b"precious").unwrap();
    let ck = dir.path().join("ck");
    save(&ck, request(5)).unwrap();
    save(&ck, request(7)).unwrap();
    let sd = ck.join("step-000007");
    let sha = hex(&Sha256::digest(b"precious"));
    for name in ["../outside.bin", outside.to_str().unwrap()] {
        let text = format!(
            "{{\"format\":\"tlio-manifest\",\"version\":1,\"step\":7,\"files\":[{}]}}",
            serde_json::json!({"name": name, "size": 8, "sha256": sha})
        );
        fs::write(sd.join(MANIFEST_NAME), text).unwrap();
        let problems = verify(&sd);
        assert!(
            matches!(problems.as_slice(), [Problem::BadManifest(_), ..]),
            "{problems:?}"
        );
        assert_eq!(load(&ck, None).unwrap().step, 5);
    }
    // A symlink inside a step directory fails it, and gc removes the link, not its
    // target.
    let ck2 = dir.path().join("ck2");
    save(&ck2, request(5)).unwrap();
    save(&ck2, request(7)).unwrap();
    let sd5 = ck2.join("step-000005");
    let manifest_bytes = fs::read(sd5.join(MANIFEST_NAME)).unwrap();
    fs::remove_file(sd5.join(STATE_NAME)).unwrap();
    std::os::unix::fs::symlink(&outside, sd5.join(STATE_NAME)).unwrap();
    assert_eq!(
        verify(&sd5).first(),
        Some(&Problem::Symlink(STATE_NAME.into()))
    );
    fs::write(sd5.join(MANIFEST_NAME), manifest_bytes).unwrap();
    let link_dir = ck2.join("step-000006");
    std::os::unix::fs::symlink(&sd5, &link_dir).unwrap();
    assert_eq!(verify(&link_dir), [Problem::NotADirectory]);
    gc(&ck2, 1, false).unwrap();
    assert_eq!(fs::read(&outside).unwrap(), b"precious");
    assert!(!sd5.exists());
    assert!(!link_dir.exists() && fs::symlink_metadata(&link_dir).is_err());
    assert_eq!(load(&ck2, None).unwrap().step, 7);
}

#[test]
fn a_held_lock_refuses_a_save_that_may_not_wait_and_a_gc() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(5)).unwrap();
    let held = DirLock::acquire(dir.path()).unwrap();
    let mut no_wait = request(7);
    no_wait.lock_wait = std::time::Duration::ZERO;
    assert!(matches!(
        save(dir.path(), no_wait),
        Err(CheckpointError::Locked { .. })
    ));
    assert!(matches!(
        gc(dir.path(), 1, false),
        Err(CheckpointError::Locked { .. })
    ));
    drop(held);
    save(dir.path(), request(7)).unwrap();
}

#[test]
fn the_seam_sees_every_effect_in_protocol_order() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(5)).unwrap();
    let mut rec = RecordingFs::new();
    save_with(&mut rec, dir.path(), request(7)).unwrap();
    let d = dir.path();
    let t = d.join("step-000007.tmp");
    let kinds: Vec<String> = rec
        .ops
        .iter()
        .map(|o| match o {
            Op::CreateDirAll(p) => format!("mkdir -p {}", rel(d, p)),
            Op::CreateDir(p) => format!("mkdir {}", rel(d, p)),
            Op::WriteFile { path, .. } => format!("write {}", rel(d, path)),
            Op::FsyncFile(p) => format!("fsync {}", rel(d, p)),
            Op::FsyncDir(p) => format!("fsyncdir {}", rel(d, p)),
            Op::Rename { from, to } => format!("rename {} {}", rel(d, from), rel(d, to)),
            Op::Exchange { a, b } => format!("exchange {} {}", rel(d, a), rel(d, b)),
            Op::RemoveDirAll(p) => format!("rm -r {}", rel(d, p)),
            Op::RemoveFile(p) => format!("rm {}", rel(d, p)),
        })
        .collect();
    let _ = t;
    assert_eq!(
        kinds,
        [
            "mkdir -p .",
            "mkdir step-000007.tmp",
            "write step-000007.tmp/model.safetensors",
            "fsync step-000007.tmp/model.safetensors",
            "write step-000007.tmp/optimizer.safetensors",
            "fsync step-000007.tmp/optimizer.safetensors",
            "write step-000007.tmp/trainer_state.json",
            "fsync step-000007.tmp/trainer_state.json",
            "write step-000007.tmp/MANIFEST.json",
            "fsync step-000007.tmp/MANIFEST.json",
            "fsyncdir step-000007.tmp",
            "rename step-000007.tmp step-000007",
            "fsyncdir .",
            "write LATEST.tmp",
            "fsync LATEST.tmp",
            "rename LATEST.tmp LATEST",
            "fsyncdir .",
        ]
    );
}

fn rel(base: &Path, p: &Path) -> String {
    let r: PathBuf = p.strip_prefix(base).unwrap().to_path_buf();
    if r.as_os_str().is_empty() {
        ".".into()
    } else {
        r.display().to_string()
    }
}

#[test]
fn verify_names_a_file_of_the_wrong_size() {
    let dir = tempfile::tempdir().unwrap();
    let step_dir = save(dir.path(), request(5)).unwrap().path;
    let p = step_dir.join(MODEL_NAME);
    let len = fs::metadata(&p).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    assert_eq!(
        verify(&step_dir),
        [Problem::Size {
            name: MODEL_NAME.into(),
            expected: len,
            actual: len - 1,
        }]
    );
}

#[test]
fn a_save_never_moves_latest_backwards_unless_forced() {
    use crate::failure::{Failure, FailureKind};
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(150)).unwrap();
    save(dir.path(), request(200)).unwrap();
    let err = save(dir.path(), request(1)).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::NotNewer {
                step: 1,
                latest: 200,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.kind(), FailureKind::Invalid);
    assert!(
        matches!(
            err,
            CheckpointError::NotNewer {
                hint: crate::checkpoint::SaveAnyway::Force,
                ..
            }
        ),
        "{err}"
    );
    assert!(!dir.path().join("step-000001").exists());
    assert_eq!(load(dir.path(), None).unwrap().step, 200);
    // A gc after the refused save keeps everything.
    assert!(gc(dir.path(), 1, false)
        .unwrap()
        .removed
        .iter()
        .all(|r| r.reason != GcReason::NewerThanLatest));
    assert!(dir.path().join("step-000200").exists());
    // LATEST naming a step that does not verify proves nothing: saving an older step
    // is how a run recovers after falling back.
    flip(&dir.path().join("step-000200/model.safetensors"), 3);
    save(dir.path(), request(160)).unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 160);
    // With force, LATEST moves back.
    save(dir.path(), request(170)).unwrap();
    let mut req = request(2);
    req.force = true;
    save(dir.path(), req).unwrap();
    assert_eq!(load(dir.path(), None).unwrap().step, 2);
}

#[test]
fn gc_removes_newer_than_latest_only_when_latest_verifies() {
    let dir = tempfile::tempdir().unwrap();
    for n in [100, 150, 200] {
        save(dir.path(), request(n)).unwrap();
    }
    let newer = |r: &GcReport| -> Vec<PathBuf> {
        r.removed
            .iter()
            .filter(|x| x.reason == GcReason::NewerThanLatest)
            .map(|x| x.path.clone())
            .collect()
    };
    // LATEST dangling, missing, malformed, or naming a corrupt step: nothing newer
    // than the newest verifying step is removed, and the report says why.
    for latest in [Some(&b"step-000120\n"[..]), None, Some(&b"garbage"[..])] {
        match latest {
            Some(b) => fs::write(dir.path().join(LATEST_NAME), b).unwrap(),
            None => fs::remove_file(dir.path().join(LATEST_NAME)).unwrap(),
        }
        let r = gc(dir.path(), 3, true).unwrap();
        assert!(newer(&r).is_empty(), "{latest:?}: {r:?}");
        assert!(r.kept_newer.is_empty(), "{r:?}");
    }
    // A corrupt newest step with LATEST naming an older corrupt step.
    fs::write(dir.path().join(LATEST_NAME), b"step-000150\n").unwrap();
    flip(&dir.path().join("step-000150/model.safetensors"), 3);
    let r = gc(dir.path(), 3, true).unwrap();
    assert!(newer(&r).is_empty(), "{r:?}");
    assert_eq!(r.kept_newer, Vec::<u64>::new(), "200 verifies: {r:?}");
    flip(&dir.path().join("step-000200/model.safetensors"), 3);
    let r = gc(dir.path(), 1, false).unwrap();
    assert!(newer(&r).is_empty(), "{r:?}");
    assert_eq!(r.kept_newer, vec![150, 200]);
    assert!(r.latest_problem.unwrap().contains("does not verify"));
    assert!(dir.path().join("step-000200").exists());
    // LATEST naming a verifying step: newer steps are removed.
    fs::write(dir.path().join(LATEST_NAME), b"step-000100\n").unwrap();
    let r = gc(dir.path(), 1, false).unwrap();
    assert_eq!(newer(&r).len(), 2, "{r:?}");
    assert!(!dir.path().join("step-000200").exists());
}

#[test]
fn gc_dry_run_takes_no_lock_and_save_waits_for_one() {
    let dir = tempfile::tempdir().unwrap();
    save(dir.path(), request(1)).unwrap();
    fs::remove_file(dir.path().join(LOCK_NAME)).unwrap();
    gc(dir.path(), 1, true).unwrap();
    assert!(
        !dir.path().join(LOCK_NAME).exists(),
        "a dry run creates no .lock"
    );
    // While a lock is held, gc fails (it takes the lock without waiting: no bound on
    // time is asserted, a slow machine only makes it slower) and a save waits for its
    // release.
    let held = DirLock::acquire(dir.path()).unwrap();
    assert!(matches!(
        gc(dir.path(), 1, false),
        Err(CheckpointError::Locked { .. })
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    let saver = std::thread::spawn(move || {
        crate::checkpoint::save_waiting(&path, request(2), &mut |p| {
            tx.send(p.to_path_buf()).unwrap();
        })
        .map(|r| r.step)
    });
    // The notice comes after SAVE_LOCK_NOTICE: the save is waiting, not failed.
    let noticed = rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
    assert!(noticed.ends_with(LOCK_NAME));
    drop(held);
    assert_eq!(saver.join().unwrap().unwrap(), 2);
    // Waiting is bounded.
    let _held = DirLock::acquire(dir.path()).unwrap();
    let err = DirLock::acquire_waiting(
        dir.path(),
        std::time::Duration::from_millis(200),
        std::time::Duration::from_millis(50),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, CheckpointError::Locked { .. }));
}

#[test]
fn load_at_a_named_step_gives_that_step_or_an_error_naming_why_never_another() {
    let dir = tempfile::tempdir().unwrap();
    for n in [3, 5, 7, 9] {
        save(dir.path(), request(n)).unwrap();
    }
    // Exactly the step asked for, even below LATEST.
    let l = load(dir.path(), Some(5)).unwrap();
    assert_eq!((l.step, l.skipped.len()), (5, 0));
    let refused = |step: u64| match load(dir.path(), Some(step)) {
        Err(CheckpointError::NotFound { reasons, .. }) => reasons,
        other => panic!("step {step}: {other:?}"),
    };
    // A damaged step is an error naming it and why, not the older step 5.
    flip(&dir.path().join("step-000007/model.safetensors"), 100);
    let reasons = refused(7);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert_eq!(reasons[0].0, "step-000007");
    assert!(reasons[0].1.contains("sha256 mismatch"), "{reasons:?}");
    let text = load(dir.path(), Some(7)).unwrap_err().to_string();
    assert!(
        text.contains("step-000007: model.safetensors sha256 mismatch"),
        "{text}"
    );
    // A step that does not exist: named as such, no other step tried.
    assert_eq!(
        refused(8),
        vec![("step-000008".to_string(), "does not exist".to_string())]
    );
    assert_eq!(refused(2).len(), 1);
    // The same rule when the streamed check picks (`ckpt latest`'s path).
    assert!(load::pick(dir.path(), Some(7)).is_err());
    assert_eq!(load::pick(dir.path(), Some(9)).unwrap().step, 9);
    // No named step: the fallback past the damaged step still works.
    flip(&dir.path().join("step-000009/model.safetensors"), 100);
    let l = load(dir.path(), None).unwrap();
    assert_eq!(l.step, 5);
    let names: Vec<&str> = l.skipped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["step-000009", "step-000007"]);
}

/// python.md's torch optimizer form: `type` `torch.<ClassName>`, tensors in their own
/// dtypes under any `<param>.<key>`; saved, verified and refused for unknown parameters.
#[test]
fn torch_optimizer_files_keep_their_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let torch_opt = |param: &str, group_param: &str| {
        let step = 3.0f32.to_le_bytes();
        let avg: Vec<u8> = [0x3f80u16, 0xc000]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        let ts = vec![
            Tensor {
                name: format!("{param}.step"),
                dtype: Dtype::F32,
                shape: vec![],
                data: TensorData::Raw(Cow::Owned(step.to_vec())),
            },
            Tensor {
                name: format!("{param}.exp_avg"),
                dtype: Dtype::BF16,
                shape: vec![1, 2],
                data: TensorData::Raw(Cow::Owned(avg)),
            },
        ];
        let state = format!(
            r#"{{"type":"torch.AdamW","param_groups":[{{"lr":0.01,"params":["{group_param}"]}}],"state":{{}}}}"#
        );
        let meta = BTreeMap::from([
            ("format".to_string(), "tinyllm".to_string()),
            ("state".to_string(), state),
        ]);
        let mut out = Vec::new();
        st::write(&mut out, &ts, &meta).unwrap();
        out
    };
    let mut req = request(1);
    req.optimizer = Some(Payload::Bytes(Cow::Owned(torch_opt("weight", "weight"))));
    let path = save(dir.path(), req).unwrap().path;
    assert_eq!(verify(&path), vec![]);
    let header = st::read_header(&path.join(OPTIMIZER_NAME)).unwrap();
    assert!(optimizer::is_torch_state(&header));
    for (param, group) in [("head", "weight"), ("weight", "head")] {
        let mut req = request(2);
        req.optimizer = Some(Payload::Bytes(Cow::Owned(torch_opt(param, group))));
        assert!(
            matches!(save(dir.path(), req), Err(CheckpointError::Optimizer(_))),
            "{param} {group}"
        );
        assert!(!dir.path().join("step-000002").exists());
    }
}

#[test]
fn problems_come_in_manifest_order_whatever_the_hashing_threads_did() {
    let dir = tempfile::tempdir().unwrap();
    let step_dir = save(dir.path(), request(3)).unwrap().path;
    // Two listed files damaged, hashed on different threads: the report lists them in
    // the manifest's order on every run, and the progress adds up to every byte.
    let listed: Vec<String> = super::verify::inspect(&step_dir)
        .manifest
        .unwrap()
        .files
        .iter()
        .map(|e| e.name.clone())
        .collect();
    for name in ["model.safetensors", "optimizer.safetensors"] {
        let p = step_dir.join(name);
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&p, bytes).unwrap();
    }
    let want: Vec<&String> = listed
        .iter()
        .filter(|n| n.as_str() == "model.safetensors" || n.as_str() == "optimizer.safetensors")
        .collect();
    for _ in 0..20 {
        let mut seen = 0u64;
        let ins = super::verify::inspect_with(&step_dir, &mut |n| seen += n);
        let named: Vec<&String> = ins
            .problems
            .iter()
            .map(|p| match p {
                super::verify::Problem::Sha256 { name, .. } => name,
                other => panic!("unexpected problem {other:?}"),
            })
            .collect();
        assert_eq!(named, want);
        assert!(seen > 0 && seen <= ins.size);
    }
}
