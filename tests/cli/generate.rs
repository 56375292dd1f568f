//! `tlio generate`: man pages stay current, completions are produced for every shell.

use super::{tlio, tmp};

#[test]
fn committed_man_pages_are_current() {
    let dir = tmp();
    tlio()
        .args(["generate", "man"])
        .arg(dir.path())
        .assert()
        .success();
    let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let mut fresh: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    fresh.sort();
    let mut have: Vec<_> = std::fs::read_dir(&committed)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".1"))
        .collect();
    have.sort();
    assert_eq!(
        fresh, have,
        "man/ lists other pages: run `tlio generate man -o man`"
    );
    for name in fresh {
        let a = std::fs::read(dir.path().join(&name)).unwrap();
        let b = std::fs::read(committed.join(&name)).unwrap();
        assert!(
            a == b,
            "man/{} is out of date: run `tlio generate man -o man`",
            name.to_string_lossy()
        );
    }
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = tlio()
            .args(["generate", "completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("tlio"));
    }
}

#[test]
fn bad_shell_is_a_usage_error() {
    tlio()
        .args(["generate", "completions", "powershell-9"])
        .assert()
        .code(2);
}

#[test]
fn json_generate_man_prints_a_summary() {
    let dir = crate::tmp();
    let out = crate::tlio()
        .args(["--json", "generate", "man", "-o"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pages = doc["pages"].as_array().unwrap();
    assert!(pages.iter().any(|p| p == "tlio.1"), "{doc}");
    assert_eq!(
        pages.len(),
        std::fs::read_dir(dir.path()).unwrap().count(),
        "{doc}"
    );
}
