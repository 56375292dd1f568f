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

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn man_pages_name_every_environment_variable_tlio_reads() {
    // The variables the source names: tlio's own (TLIO_*), object storage's (AWS_*),
    // Slurm's and the cache's, the failpoints and the colour ones.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let literal = regex::Regex::new(
        r#""((?:TLIO|AWS|SLURM|XDG)_[A-Z0-9_]+|FAILPOINTS|NO_COLOR|CLICOLOR_FORCE|HOME)""#,
    )
    .unwrap();
    let mut names = std::collections::BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // Only the code, not its unit tests (which set variables of their own).
        let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
        for caps in literal.captures_iter(code) {
            names.insert(caps[1].to_string());
        }
    }
    for expected in [
        "AWS_ACCESS_KEY_ID",
        "TLIO_CACHE_DIR",
        "TLIO_PYTHON",
        "FAILPOINTS",
    ] {
        assert!(
            names.contains(expected),
            "{expected} not found in src: {names:?}"
        );
    }
    let dir = tmp();
    assert!(tlio()
        .args(["generate", "man", "-o"])
        .arg(dir.path())
        .output()
        .unwrap()
        .status
        .success());
    for page in ["tlio.1", "tlio-tokens-windows.1", "tlio-ckpt-import.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        let environment = text
            .split_once(".SH ENVIRONMENT\n")
            .map(|(_, rest)| rest.split("\n.SH ").next().unwrap_or(rest))
            .unwrap_or_else(|| panic!("{page} has no ENVIRONMENT section"));
        let plain = environment.replace("\\-", "-").replace("\\_", "_");
        for name in &names {
            assert!(
                plain.contains(name.as_str()),
                "{page}'s ENVIRONMENT lacks {name}"
            );
        }
    }
}

#[test]
fn man_synopsis_shows_each_option_with_its_value() {
    let dir = tmp();
    assert!(tlio()
        .args(["generate", "man", "-o"])
        .arg(dir.path())
        .output()
        .unwrap()
        .status
        .success());
    let page = std::fs::read_to_string(dir.path().join("tlio-tokens-header.1")).unwrap();
    let synopsis = page
        .split_once(".SH SYNOPSIS\n")
        .and_then(|(_, rest)| rest.lines().next())
        .expect("a SYNOPSIS line");
    assert!(
        synopsis.starts_with("\\fBtlio tokens header\\fR ")
            && synopsis.contains("[\\fB\\-\\-vocab\\-size\\fR \\fI<V>\\fR]")
            && synopsis.contains("[\\fB\\-\\-color\\fR \\fI<WHEN>\\fR]")
            && synopsis.ends_with("\\fI<SHARD>\\fR..."),
        "{synopsis}"
    );
}
