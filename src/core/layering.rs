//! The dependency picture of the core, checked against the sources: which area may use
//! which (the table in docs/architecture.md, which the module doc of `core` summarises),
//! no edge outside it and no listed edge left unused. Cargo keeps the command layer out
//! of this crate (it is not a dependency); this test holds the lines Cargo cannot see,
//! between the areas inside the crate.
//!
//! Invariant: the check reads every file whole except its test-only items (each
//! `#[cfg(test)]` item, whether a `mod x;` line or a block, and `tests.rs` files), so
//! test fixtures may cross areas but no non-test line escapes the scan.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Areas every other area may use: they depend on nothing of tlio's but each other.
    const LEAVES: &[&str] = &[
        "cursor",
        "digest",
        "failpoints",
        "failure",
        "pcg",
        "text",
        "wire",
    ];

    /// The picture as docs/architecture.md draws it: its table of areas, each with what
    /// it may use besides the leaves. The docs are the one source, so they cannot drift.
    fn documented_picture() -> BTreeMap<String, BTreeSet<String>> {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
        let text = std::fs::read_to_string(&docs).unwrap();
        let mut picture = BTreeMap::new();
        let mut in_table = false;
        for line in text.lines() {
            if line.starts_with("| area | may use |") {
                in_table = true;
                continue;
            }
            if !in_table || line.starts_with("| ---") {
                continue;
            }
            let Some(row) = line.strip_prefix('|') else {
                break;
            };
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let area = cells[0].trim_matches('`').to_string();
            let uses = cells[1]
                .split(',')
                .map(|u| u.trim().trim_matches('`').to_string())
                .filter(|u| !u.is_empty())
                .collect();
            picture.insert(area, uses);
        }
        assert!(
            picture.len() >= 8,
            "docs/architecture.md: no area table found"
        );
        picture
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }

    /// The module path of a file below src/core (`a/b.rs` and `a/b/mod.rs` are a::b).
    fn module_path(rel: &Path) -> Vec<String> {
        let mut parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if let Some(last) = parts.pop() {
            if last != "mod.rs" {
                parts.push(last.trim_end_matches(".rs").to_string());
            }
        }
        parts
    }

    /// The core areas `code` (of the module at `module`) refers to.
    fn referenced_areas(code: &str, module: &[String]) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let word = regex::Regex::new(r"^[a-z_][a-z0-9_]*").unwrap();
        // `crate::x` and `crate::{x, y::z}`.
        let abs = regex::Regex::new(r"crate::(\{[^;]*?\}|[a-z_][a-z0-9_]*)").unwrap();
        for m in abs.captures_iter(code) {
            let g = &m[1];
            if let Some(inner) = g.strip_prefix('{') {
                let mut depth = 0usize;
                let mut start = true;
                for (i, ch) in inner.char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => depth = depth.saturating_sub(1),
                        ',' if depth == 0 => start = true,
                        c if start && !c.is_whitespace() => {
                            start = false;
                            if let Some(w) = word.find(&inner[i..]) {
                                found.insert(w.as_str().to_string());
                            }
                        }
                        _ => {}
                    }
                }
            } else {
                found.insert(g.to_string());
            }
        }
        // `super::...::x` climbing to the core's root names area x.
        let rel = regex::Regex::new(r"((?:super::)+)([a-z_][a-z0-9_]*)").unwrap();
        for m in rel.captures_iter(code) {
            let ups = m[1].len() / "super::".len();
            if ups == module.len() {
                found.insert(m[2].to_string());
            }
        }
        found
    }

    /// `text` with every `#[cfg(test)]` item removed: a `mod x;` declaration up to its
    /// `;`, anything else up to the brace that closes its first `{`.
    fn without_test_items(text: &str) -> String {
        const MARK: &str = "#[cfg(test)]";
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(MARK) {
            out.push_str(&rest[..at]);
            let item = &rest[at + MARK.len()..];
            let semi = item.find(';').unwrap_or(item.len());
            let open = item.find('{').unwrap_or(item.len());
            if semi < open {
                rest = &item[semi + 1..];
                continue;
            }
            let mut depth = 0usize;
            let mut end = item.len();
            for (i, ch) in item.char_indices().skip(open) {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &item[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn test_items_are_cut_and_the_rest_is_kept() {
        let text = "use crate::a;\n#[cfg(test)]\nmod t;\nuse crate::b;\n#[cfg(test)]\nmod tests {\n    fn f() { use crate::c; }\n}\nuse crate::d;\n";
        let code = without_test_items(text);
        assert!(
            code.contains("crate::a") && code.contains("crate::b") && code.contains("crate::d")
        );
        assert!(!code.contains("crate::c"), "{code}");
    }

    #[test]
    fn core_areas_use_only_what_the_picture_allows() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let allowed = documented_picture();
        let mut bad = Vec::new();
        let mut seen_edges = 0;
        let mut used_edges: BTreeSet<(String, String)> = BTreeSet::new();
        for path in files {
            let rel = path.strip_prefix(&root).unwrap().to_path_buf();
            if rel.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = without_test_items(&text);
            let code = code.as_str();
            let module = module_path(&rel);
            let Some(area) = module.first() else {
                continue; // core's own mod.rs
            };
            for used in referenced_areas(code, &module) {
                if &used == area || LEAVES.contains(&used.as_str()) {
                    continue;
                }
                seen_edges += 1;
                used_edges.insert((area.clone(), used.clone()));
                let ok = allowed
                    .get(area.as_str())
                    .is_some_and(|list| list.contains(&used));
                if !ok {
                    bad.push(format!("{}: {area} uses {used}", rel.display()));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "edges outside the picture:\n{}",
            bad.join("\n")
        );
        // The scan must see the edges that do exist (a regex that matches nothing
        // would pass vacuously), and the picture may not keep an edge nothing uses.
        assert!(seen_edges > 10, "only {seen_edges} edges found");
        let stale: Vec<String> = allowed
            .iter()
            .flat_map(|(area, uses)| uses.iter().map(move |u| (area.clone(), u.clone())))
            .filter(|edge| !used_edges.contains(edge))
            .map(|(a, u)| format!("{a} -> {u}"))
            .collect();
        assert!(
            stale.is_empty(),
            "docs/architecture.md lists edges the sources no longer have: {stale:?}"
        );
    }

    #[test]
    fn the_reference_scan_reads_every_form() {
        let m = vec!["a".to_string(), "b".to_string()];
        let found = referenced_areas(
            "use crate::{x::Y, z, w::{P, Q}};\nuse super::super::v::T;\nuse super::sibling;",
            &m,
        );
        let want: BTreeSet<String> = ["v", "w", "x", "z"].iter().map(|s| s.to_string()).collect();
        assert_eq!(found, want);
    }
}
