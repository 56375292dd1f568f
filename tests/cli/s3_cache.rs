//! The local cache of `s3://` shards, attacked on disk: a copy edited in place (same
//! size, ids still in range) is fetched again whether a manifest records its sha256 or
//! only the cache's own digest vouches for it; a symlink planted under an entry's
//! (predictable) name is never followed and its target never written; the cache's
//! folder is made 0700 and one that others can write is refused, naming it and the rule.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::s3::{bucket, stdout_of, tlio_s3};
use super::s3_data::{corpus, pack_local, upload_all, windows};
use super::tlio;

/// Where the ids of a shard's bytes begin.
const HEADER_BYTES: usize = 1024;

/// The object copies (`.bin`) in the folder `dir`, sorted.
fn copies(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    found.sort();
    found
}

/// `bytes` of a shard with every id replaced by 7: the same size, still a valid shard.
fn every_id_seven(bytes: &[u8]) -> Vec<u8> {
    let version = i32::from_le_bytes(bytes[4..8].try_into().unwrap());
    let item: usize = if version == 1 { 2 } else { 4 };
    let mut out = bytes[..HEADER_BYTES].to_vec();
    for _ in (HEADER_BYTES..bytes.len()).step_by(item) {
        out.extend_from_slice(&7u32.to_le_bytes()[..item]);
    }
    assert_eq!(out.len(), bytes.len());
    assert_ne!(out, bytes);
    out
}

/// One shard of 3000 byte-level tokens, packed locally and also to `s3://b/m/fw` (with
/// its manifest): (the local shard, the plain object's URL, the manifest's URL).
fn one_shard_in_storage(tmp: &Path, b: &str) -> (String, String, String) {
    let input = tmp.join("corpus.bin");
    std::fs::write(&input, corpus(3000)).unwrap();
    let shards = pack_local(&input, &tmp.join("t"), 3000);
    assert_eq!(shards.len(), 1);
    let url = upload_all(b, "plain", &shards).remove(0);
    stdout_of(
        tlio_s3()
            .args(["-q", "tokens", "pack", "--shard-tokens", "3000", "-o"])
            .arg(format!("s3://{b}/m/fw"))
            .arg(&input),
    );
    let local = shards[0].display().to_string();
    (local, url, format!("s3://{b}/m/fw.manifest.json"))
}

const ARGS: [&str; 4] = ["--seed", "3", "--batches", "20"];

#[test]
fn an_edited_cache_copy_is_fetched_again_with_or_without_a_recorded_sha256() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    let (local, plain, manifest) = one_shard_in_storage(tmp.path(), &b);
    let want = windows(tlio(), &tmp.path().join("unused"), &[local], &ARGS);
    for (i, source) in [plain, manifest].into_iter().enumerate() {
        let cache = tmp.path().join(format!("cache{i}"));
        let sources = [source];
        assert_eq!(windows(tlio_s3(), &cache, &sources, &ARGS), want);
        let found = copies(&cache.join("s3"));
        assert_eq!(found.len(), 1, "{found:?}");
        let good = std::fs::read(&found[0]).unwrap();
        // Edited on disk: same size, every id 7 (in range), so it still validates as a
        // shard; only its digest tells it from the object.
        std::fs::write(&found[0], every_id_seven(&good)).unwrap();
        assert_eq!(
            windows(tlio_s3(), &cache, &sources, &ARGS),
            want,
            "{}",
            sources[0]
        );
        assert_eq!(std::fs::read(&found[0]).unwrap(), good, "fetched again");
    }
}

#[test]
fn a_symlink_planted_under_an_entrys_name_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    let (local, plain, manifest) = one_shard_in_storage(tmp.path(), &b);
    let want = windows(tlio(), &tmp.path().join("unused"), &[local], &ARGS);
    for (i, source) in [plain, manifest].into_iter().enumerate() {
        // The entry's name is predictable: learn it from a cache of one's own.
        let scout = tmp.path().join(format!("scout{i}"));
        let sources = [source];
        assert_eq!(windows(tlio_s3(), &scout, &sources, &ARGS), want);
        let entry = copies(&scout.join("s3")).remove(0);
        let name = entry.file_name().unwrap();
        // A shard of other ids, and a cache whose entry is a symlink to it (its digest
        // file, planted too, vouches for the target's bytes).
        let target = tmp.path().join(format!("planted{i}.bin"));
        let planted = every_id_seven(&std::fs::read(&entry).unwrap());
        std::fs::write(&target, &planted).unwrap();
        let cache = tmp.path().join(format!("cache{i}"));
        std::fs::create_dir_all(cache.join("s3")).unwrap();
        std::fs::set_permissions(cache.join("s3"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = cache.join("s3").join(name);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mut digest = link.clone().into_os_string();
        digest.push(".blake3");
        let planted_digest = blake3::hash(&planted).to_hex().to_string();
        std::fs::write(&digest, format!("{planted_digest}\n")).unwrap();

        assert_eq!(
            windows(tlio_s3(), &cache, &sources, &ARGS),
            want,
            "{}",
            sources[0]
        );
        assert_eq!(std::fs::read(&target).unwrap(), planted, "target unchanged");
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(meta.is_file(), "the symlink is replaced by a copy");
        assert_eq!(
            std::fs::read(&link).unwrap(),
            std::fs::read(&entry).unwrap()
        );
    }
}

#[test]
fn the_cache_folder_is_private_and_one_others_can_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let b = bucket();
    let (local, plain, _) = one_shard_in_storage(tmp.path(), &b);
    let want = windows(tlio(), &tmp.path().join("unused"), &[local], &ARGS);
    let cache = tmp.path().join("fresh").join("cache");
    let sources = [plain];
    assert_eq!(windows(tlio_s3(), &cache, &sources, &ARGS), want);
    for dir in [cache.clone(), cache.join("s3")] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    }
    let objects = cache.join("s3");
    std::fs::set_permissions(&objects, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = tlio_s3()
        .env("TLIO_CACHE_DIR", &cache)
        .args(["tokens", "windows", "--seq-len", "7", "--batch", "3"])
        .args(&sources)
        .args(ARGS)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains(&objects.display().to_string()), "{err}");
    assert!(
        err.contains("no one else can write (mode 0700): it is mode 0777"),
        "{err}"
    );
    assert!(out.get_output().stdout.is_empty());
}
