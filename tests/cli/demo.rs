//! `tlio demo`: the whole mission end to end, from the outside: exit 0, every check
//! passed, the two final lines identical, the temporary directory gone (or the files
//! kept with --out).

use super::{tlio, tmp};

#[test]
fn demo_passes_every_check_and_cleans_up() {
    let dir = tmp();
    let scratch = dir.path().join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    let out = tlio()
        .env("TMPDIR", &scratch)
        .args(["-q", "demo"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty(), "-q: nothing on stderr");
    assert!(stdout.contains("checks passed"), "{stdout}");
    assert!(
        !stdout.lines().any(|l| l.contains(" FAIL ")),
        "no check row failed: {stdout}"
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "the temporary directory is removed"
    );
}

#[test]
fn demo_json_report_and_kept_files() {
    let dir = tmp();
    let keep = dir.path().join("demo");
    let out = tlio()
        .args(["--json", "demo", "--out"])
        .arg(&keep)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["completed"], true);
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 10, "{checks:?}");
    assert!(checks.iter().all(|c| c["ok"] == true), "{checks:?}");
    let a = std::fs::read(keep.join("run-uninterrupted/final.json")).unwrap();
    let b = std::fs::read(keep.join("run-resumed/final.json")).unwrap();
    assert_eq!(a, b, "the kept final lines are identical");
    let line: serde_json::Value = serde_json::from_slice(&a).unwrap();
    assert_eq!(report["final_line"], line);
    assert!(keep.join("run-resumed/ckpt/step-000100").is_dir());
    assert!(keep.join("corpus.bin").is_file());
}
