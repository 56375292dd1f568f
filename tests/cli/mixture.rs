//! `tokens windows --mix`: a mixture of sources from the command line. Each row's
//! source follows scale.md section 8's greedy rule (checked against this file's own
//! reading of it), each row is a window of its source's bytes, a saved cursor resumes
//! bit for bit (across a stage and shuffled), ranks tile the one-process stream, and
//! `--report`'s shares, passes and epochs agree with the windows themselves; bad weights
//! and sources are refused with one error line and nothing on stdout.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{stderr_text, tlio, tmp};

/// Pack `len` pseudo-random printable bytes into `dir/name` (a byte shard, V 256).
fn byte_shard(dir: &Path, name: &str, len: usize, seed: u64, extra: &[&str]) -> PathBuf {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let text: Vec<u8> = (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b'!' + ((x >> 33) % 90) as u8
        })
        .collect();
    let input = dir.join(format!("{name}.txt"));
    std::fs::write(&input, &text).unwrap();
    let out = dir.join(name);
    tlio()
        .args(["-q", "tokens", "pack"])
        .arg(&input)
        .args(extra)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    input
}

/// Run `tokens windows` with `args` in `dir`; the JSON lines.
fn windows(dir: &Path, args: &[&str]) -> Vec<Value> {
    let out = tlio()
        .current_dir(dir)
        .args(["tokens", "windows"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr_text(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// scale.md section 8's rule, written from its text: window g of a stage goes to the j
/// maximising w_j * (k + 1) - n_j (k the window's index in the stage), ties lowest j.
fn reference_sources(stages: &[(u64, Vec<f64>)], global: u64, count: u64) -> Vec<usize> {
    let n = stages[0].1.len();
    let mut out = Vec::new();
    let (mut stage, mut start, mut counts) = (0usize, 0u64, vec![0u64; n]);
    for g in 0..count {
        let batch = g / global;
        let now = stages.iter().rposition(|s| s.0 <= batch).unwrap();
        if now != stage {
            (stage, start, counts) = (now, g, vec![0; n]);
        }
        let k = (g - start) as f64;
        let w = &stages[stage].1;
        let mut best = 0;
        for j in 1..n {
            if w[j] * (k + 1.0) - counts[j] as f64 > w[best] * (k + 1.0) - counts[best] as f64 {
                best = j;
            }
        }
        counts[best] += 1;
        out.push(best);
    }
    out
}

fn rows(line: &Value, key: &str) -> Vec<Vec<u8>> {
    line[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u8)
                .collect()
        })
        .collect()
}

fn sources(line: &Value) -> Vec<usize> {
    line["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect()
}

fn three_sources(dir: &Path) -> Vec<Vec<u8>> {
    let web = byte_shard(dir, "web.bin", 3000, 1, &[]);
    std::fs::create_dir(dir.join("code")).unwrap();
    let code = byte_shard(dir, "code/part", 2500, 2, &["--shard-tokens", "900"]);
    let math = byte_shard(dir, "math.bin", 700, 3, &[]);
    [web, code, math]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

const MIX: [&str; 6] = [
    "--mix",
    "web.bin:0.5",
    "--mix",
    "code/part_*.bin:0.3",
    "--mix",
    "math.bin:0.2",
];

#[test]
fn each_row_comes_from_the_source_the_greedy_rule_names_and_is_a_window_of_it() {
    let dir = tmp();
    let texts = three_sources(dir.path());
    let args = [
        &MIX[..],
        &["--seq-len", "16", "--batch", "5", "--batches", "12"],
    ]
    .concat();
    let lines = windows(dir.path(), &args);
    let got: Vec<usize> = lines.iter().flat_map(sources).collect();
    let stages = [(0, vec![0.5, 0.3, 0.2])];
    assert_eq!(got, reference_sources(&stages, 5, 60));
    for line in &lines {
        let (x, y) = (rows(line, "inputs"), rows(line, "targets"));
        for ((x, y), j) in x.iter().zip(&y).zip(sources(line)) {
            assert_eq!(x[1..], y[..15], "targets are the inputs shifted");
            let mut window = x.clone();
            window.push(*y.last().unwrap());
            let text = &texts[j];
            assert!(
                text.windows(17).any(|w| w == window.as_slice()),
                "a row of source {j} is not a window of it"
            );
        }
    }
}

#[test]
fn a_saved_mixture_cursor_resumes_bit_for_bit_across_a_stage_shuffled() {
    let dir = tmp();
    three_sources(dir.path());
    let base = [
        "--mix",
        "web.bin",
        "--mix",
        "code/part_*.bin",
        "--mix",
        "math.bin",
        "--stage",
        "0:0.5,0.3,0.2",
        "--stage",
        "3:0.1,0.1,0.8",
        "--seq-len",
        "8",
        "--batch",
        "4",
        "--shuffle",
    ];
    let whole = windows(
        dir.path(),
        &[&base[..], &["--batches", "6", "--seed", "9"]].concat(),
    );
    let got: Vec<usize> = whole.iter().flat_map(sources).collect();
    let stages = [(0, vec![0.5, 0.3, 0.2]), (3, vec![0.1, 0.1, 0.8])];
    assert_eq!(got, reference_sources(&stages, 4, 24));
    for cut in [1, 3, 4] {
        let c = format!("c{cut}.json");
        let first = windows(
            dir.path(),
            &[
                &base[..],
                &[
                    "--batches",
                    &cut.to_string(),
                    "--seed",
                    "9",
                    "--save-cursor",
                    &c,
                ],
            ]
            .concat(),
        );
        let rest = windows(
            dir.path(),
            &[
                &base[..],
                &["--batches", &(6 - cut).to_string(), "--cursor", &c],
            ]
            .concat(),
        );
        let both: Vec<Value> = first.into_iter().chain(rest).collect();
        assert_eq!(both, whole, "resumed after {cut} batch(es)");
    }
}

#[test]
fn the_ranks_of_a_mixture_tile_the_one_process_stream() {
    let dir = tmp();
    three_sources(dir.path());
    let shape = ["--seq-len", "8", "--batches", "5"];
    let one = windows(dir.path(), &[&MIX[..], &shape, &["--batch", "6"]].concat());
    let ranks: Vec<Vec<Value>> = (0..3)
        .map(|r| {
            let r = r.to_string();
            let extra = ["--batch", "2", "--world-size", "3", "--rank", &r];
            windows(dir.path(), &[&MIX[..], &shape, &extra].concat())
        })
        .collect();
    for (b, line) in one.iter().enumerate() {
        let mut x = Vec::new();
        let mut s = Vec::new();
        for rank in &ranks {
            x.extend(rows(&rank[b], "inputs"));
            s.extend(sources(&rank[b]));
            assert_eq!(
                rank[b]["cursor"], line["cursor"],
                "the cursor is the global one"
            );
        }
        assert_eq!(x, rows(line, "inputs"));
        assert_eq!(s, sources(line));
    }
}

#[test]
fn the_report_counts_the_windows_passes_and_epochs_the_windows_show() {
    let dir = tmp();
    let texts = three_sources(dir.path());
    let shape = ["--seq-len", "16", "--batch", "5", "--batches", "100"];
    let lines = windows(dir.path(), &[&MIX[..], &shape].concat());
    let out = tlio()
        .current_dir(dir.path())
        .args(["--json", "tokens", "windows", "--report"])
        .args(MIX)
        .args(shape)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["batches"], 100);
    assert_eq!(report["windows"], 500);
    for (j, weight, shards) in [(0usize, 0.5, 1u64), (1, 0.3, 3), (2, 0.2, 1)] {
        // Where each of the source's windows lies in its text: a window that does not
        // follow the source's last one by T begins a new pass (a new shard or a new
        // phase; a window never spans shards).
        let mut at = Vec::new();
        for line in &lines {
            let (x, y) = (rows(line, "inputs"), rows(line, "targets"));
            for ((x, y), s) in x.iter().zip(&y).zip(sources(line)) {
                if s == j {
                    let mut w = x.clone();
                    w.push(*y.last().unwrap());
                    at.push(
                        texts[j]
                            .windows(17)
                            .position(|v| v == w.as_slice())
                            .unwrap(),
                    );
                }
            }
        }
        let passes = at.windows(2).filter(|p| p[1] != p[0] + 16).count() as u64;
        assert!(passes >= 1, "source {j} wraps in 100 batches");
        let row = &report["sources"][j];
        assert_eq!(row["windows"], at.len() as u64, "source {j}");
        assert!((row["share"].as_f64().unwrap() - at.len() as f64 / 500.0).abs() < 1e-12);
        assert!((row["expected"].as_f64().unwrap() - weight).abs() < 1e-9);
        assert!(row["worst_batch_gap"].as_f64().unwrap() <= 2.0);
        assert_eq!(row["passes"], passes, "source {j}");
        assert_eq!(row["epochs"], passes / shards, "source {j}");
    }
    // The human form names each source.
    let out = tlio()
        .current_dir(dir.path())
        .args(["tokens", "windows", "--report"])
        .args(MIX)
        .args(shape)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("code/part_*.bin") && text.contains("epochs"),
        "{text}"
    );
}

#[test]
fn bad_mixtures_are_refused_with_one_error_line_naming_the_rule() {
    let dir = tmp();
    three_sources(dir.path());
    std::fs::write(
        dir.path().join("ids.txt"),
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    )
    .unwrap();
    tlio()
        .current_dir(dir.path())
        .args([
            "-q",
            "tokens",
            "pack",
            "ids.txt",
            "--from",
            "ids",
            "--vocab-size",
            "300",
        ])
        .args(["-o", "v300.bin"])
        .assert()
        .success();
    let shape = ["--seq-len", "4", "--batch", "2"];
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--mix", "web.bin:-0.5", "--mix", "math.bin:1.5"],
            2,
            "is -0.5; a weight is a finite number above 0",
        ),
        (
            &["--mix", "web.bin:0", "--mix", "math.bin:1"],
            2,
            "is 0; a weight is a finite number above 0",
        ),
        (
            &["--mix", "web.bin:NaN", "--mix", "math.bin:1"],
            2,
            "is NaN",
        ),
        (
            &["--mix", "web.bin:0.5", "--mix", "math.bin:0.6"],
            2,
            "sum to 1.1, not 1",
        ),
        (
            &["--mix", "web.bin:0.5", "--mix", "none_*.bin:0.5"],
            2,
            "none_*.bin matches no file",
        ),
        (
            &["--mix", "web.bin:0.5", "--mix", "v300.bin:0.5"],
            1,
            "v300.bin",
        ),
        (
            &["--mix", "web.bin", "--mix", "math.bin:1"],
            2,
            "--mix web.bin: a source needs a weight",
        ),
        (
            &[
                "--mix",
                "web.bin:0.5",
                "--mix",
                "math.bin:0.5",
                "--stage",
                "0:0.6,0.4",
            ],
            2,
            "differ from the first --stage's",
        ),
        (
            &["--mix", "web.bin", "--mix", "math.bin", "--stage", "0:0.5"],
            2,
            "1 weight(s) for 2 source(s)",
        ),
        (
            &["--mix", "web.bin", "--stage", "x:1"],
            2,
            "--stage x:1: the global batch",
        ),
        (
            &["web.bin", "--stage", "0:1"],
            2,
            "--stage applies to a mixture",
        ),
        (&["web.bin", "--report"], 2, "--report applies to a mixture"),
    ];
    for (args, code, says) in cases {
        let out = tlio()
            .current_dir(dir.path())
            .args(["tokens", "windows"])
            .args(*args)
            .args(shape)
            .output()
            .unwrap();
        let err = stderr_text(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("tlio: error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
    // A cursor of another mixture is refused naming the difference, unless on purpose.
    let saved = [&MIX[..], &shape, &["--save-cursor", "c.json"]].concat();
    windows(dir.path(), &saved);
    let other = [
        "--mix",
        "web.bin:0.4",
        "--mix",
        "code/part_*.bin:0.4",
        "--mix",
        "math.bin:0.2",
    ];
    let out = tlio()
        .current_dir(dir.path())
        .args(["tokens", "windows", "--cursor", "c.json"])
        .args(other)
        .args(shape)
        .output()
        .unwrap();
    let err = stderr_text(&out);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert!(
        err.contains("c.json") && err.contains("weights are [0.5, 0.3, 0.2]"),
        "{err}"
    );
    let allowed = [
        &other[..],
        &shape,
        &["--cursor", "c.json", "--allow-new-mixture"],
    ]
    .concat();
    assert_eq!(windows(dir.path(), &allowed).len(), 1);
    // A single stream's cursor is no mixture's.
    windows(
        dir.path(),
        &[
            "web.bin",
            "--seq-len",
            "4",
            "--batch",
            "2",
            "--save-cursor",
            "s.json",
        ],
    );
    let out = tlio()
        .current_dir(dir.path())
        .args(["tokens", "windows", "--cursor", "s.json"])
        .args(MIX)
        .args(shape)
        .output()
        .unwrap();
    let err = stderr_text(&out);
    assert!(
        !out.status.success() && out.stdout.is_empty() && err.contains("s.json"),
        "{err}"
    );
}
