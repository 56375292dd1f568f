//! `tokens pack` with a tokenizer writes beside each shard `X.bin` its document sidecar
//! `X.docs`: its offsets are where the documents start (with `--eot`, exactly where the
//! end-of-text ids lie, document starts split across shards included); a pack of raw
//! ids writes none.

use std::path::Path;

use super::{fixture, shard_ids, tlio, tmp};

/// The offsets of a sidecar, read by this test's own reading of the documented format.
fn sidecar(path: &Path, shard_tokens: u64) -> Vec<u64> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"TLIODOCS", "{}", path.display());
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 0);
    assert_eq!(
        u64::from_le_bytes(b[16..24].try_into().unwrap()),
        shard_tokens
    );
    let count = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
    assert_eq!(b.len(), 32 + 8 * count);
    b[32..]
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn pack(dir: &Path, extra: &[&str]) -> Vec<std::path::PathBuf> {
    let out = dir.join("fw");
    tlio()
        .args([
            "-q",
            "tokens",
            "pack",
            "--from",
            "jsonl",
            "--tokenizer",
            "gpt2",
        ])
        .args(["--shard-tokens", "300"])
        .args(extra)
        .arg(fixture("tokenizers/corpus.jsonl"))
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let mut bins: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    bins.sort();
    assert!(bins.len() >= 3, "{bins:?}");
    bins
}

#[test]
fn sidecar_offsets_are_the_end_of_text_ids_of_each_shard() {
    let dir = tmp();
    let bins = pack(dir.path(), &[]);
    let mut starts = 0;
    for bin in &bins {
        let ids = shard_ids(bin);
        let got = sidecar(&bin.with_extension("docs"), ids.len() as u64);
        let want: Vec<u64> = (0..ids.len() as u64)
            .filter(|&i| ids[i as usize] == 50256)
            .collect();
        assert_eq!(got, want, "{}", bin.display());
        starts += got.len();
    }
    // One start per document of the corpus (each begins with its EOT).
    assert_eq!(starts, 44);
}

#[test]
fn without_an_end_of_text_id_the_sidecars_count_the_non_empty_documents() {
    let dir = tmp();
    let bins = pack(dir.path(), &["--eot", "none"]);
    let corpus = std::fs::read_to_string(fixture("tokenizers/corpus.jsonl")).unwrap();
    let non_empty = corpus
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            !v["text"].as_str().unwrap().is_empty()
        })
        .count();
    let mut starts = Vec::new();
    let mut base = 0u64;
    for bin in &bins {
        let n = shard_ids(bin).len() as u64;
        starts.extend(
            sidecar(&bin.with_extension("docs"), n)
                .iter()
                .map(|s| s + base),
        );
        base += n;
    }
    assert_eq!(starts.len(), non_empty);
    assert_eq!(starts[0], 0);
}

#[test]
fn a_pack_of_raw_ids_writes_no_sidecar() {
    let dir = tmp();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "1 2 3 4 5 6").unwrap();
    tlio()
        .args([
            "-q",
            "tokens",
            "pack",
            "--from",
            "ids",
            "--vocab-size",
            "10",
        ])
        .arg(&input)
        .arg("-o")
        .arg(dir.path().join("o.bin"))
        .assert()
        .success();
    assert!(dir.path().join("o.bin").exists());
    assert!(!dir.path().join("o.docs").exists());
}
