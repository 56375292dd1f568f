//! Token shards on object storage for the stream (scale.md section 3): `s3://` sources
//! (one object, a `*` pattern in the last segment matched against a listing, or a pack
//! manifest naming its shards: those of the split its source chooses, training by
//! default, by `tokens::manifest`'s rule, which also opens a manifest on disk), each
//! fetched once into a verified local cache and then
//! read exactly as a local shard, so the stream's batches are the local ones bit for bit.
//!
//! Invariants: a cache entry is named by the object's URL, entity tag and size, so a
//! replaced object never reuses an old copy; it is downloaded under a temporary name
//! with `If-Match` on the tag (an object replaced mid-download is an error, never a mix
//! of versions), checked for its size (and its sha256 when a manifest records one),
//! synced, then renamed into place beside its blake3; a cached copy is used only after
//! `cache` proves it (a file of the user's in a private directory, no symlink, its
//! manifest's sha256 or else the recorded blake3 matching in one pass); every copy,
//! fresh or cached, is opened through [`Shard::open_named`], which validates header,
//! size and ids as for a local file and names the URL in every error. A cached copy
//! that fails is removed and fetched again once.

use std::path::{Path, PathBuf};

use super::RemoteError;
use crate::pcg::Pcg32;
use crate::s3::{is_s3_url, S3Error, S3Url};
pub use crate::tokens::manifest::{
    Manifest, ManifestShard, MANIFEST_FORMAT, MANIFEST_SUFFIX, MAX_MANIFEST_BYTES,
};
use crate::tokens::{
    check_batch_shape, check_ranks, manifest_source, Shard, ShardHeader, Split, StreamOptions,
    TokenStream, TokensError,
};

/// The variable naming the cache directory (else `$XDG_CACHE_HOME/tlio`, else
/// `$HOME/.cache/tlio`).
pub const CACHE_ENV: &str = "TLIO_CACHE_DIR";
/// The folder of object copies inside the cache directory.
#[cfg(feature = "s3")]
const OBJECTS_DIR: &str = "s3";
/// The pattern character of a source's last segment.
#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the fetcher (feature s3) uses it")
)]
const WILDCARD: char = '*';
/// Hex digits of the cache key kept in an entry's file name (128 bits).
#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the fetcher (feature s3) uses it")
)]
const CACHE_KEY_HEX: usize = 32;

/// The directory of the local cache: `TLIO_CACHE_DIR`, else `$XDG_CACHE_HOME/tlio`,
/// else `$HOME/.cache/tlio`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    var(CACHE_ENV)
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("tlio")))
        .or_else(|| var("HOME").map(|d| PathBuf::from(d).join(".cache").join("tlio")))
}

/// A path argument as a stored source: an `s3://` URL is kept as given, a local path is
/// made absolute (what a pickled stream opens again from another directory).
pub fn absolute_source(path: &Path) -> PathBuf {
    match path.to_str() {
        Some(text) if is_s3_url(text) => path.to_path_buf(),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The validated header of a shard given by path or `s3://` URL, reading its 1024
/// header bytes only (a range request for an object).
pub fn read_shard_header(path: &Path) -> Result<ShardHeader, RemoteError> {
    match path.to_str() {
        Some(text) if is_s3_url(text) => {
            let url = S3Url::parse(text)?;
            Ok(super::shard_header(&url)?.header?)
        }
        _ => Ok(crate::tokens::read_shard_header(path)?),
    }
}

/// Open and validate `sources` as shards, in order: local paths as [`Shard::open`]
/// does, `s3://` sources expanded (a `*` pattern or a manifest) and fetched through the
/// cache. Each shard's descriptor is closed once it validates.
pub fn open_shards<P: AsRef<Path>>(
    sources: &[P],
    vocab: Option<u32>,
) -> Result<Vec<Shard>, RemoteError> {
    let mut shards = Vec::with_capacity(sources.len());
    #[cfg(feature = "s3")]
    let mut stores = fetch::Stores::default();
    for source in sources {
        let path = source.as_ref();
        // A manifest stands for its training shards unless a `#split` says otherwise.
        let manifest = path.to_str().map(manifest_source).transpose()?.flatten();
        match path.to_str() {
            Some(text) if is_s3_url(text) => {
                let (text, split) = manifest.unwrap_or((text, Split::Train));
                let url = S3Url::parse(text)?;
                #[cfg(feature = "s3")]
                stores.open(&url, split, vocab, &mut shards)?;
                #[cfg(not(feature = "s3"))]
                {
                    let _ = split; // the fetcher (feature s3) reads it
                    return Err(S3Error::NotBuilt {
                        url: url.to_string(),
                    }
                    .into());
                }
            }
            Some(shown) if manifest.is_some() => {
                let (local, split) = manifest.unwrap_or((shown, Split::Train));
                shards.extend(crate::tokens::manifest::open_manifest(
                    Path::new(local),
                    split,
                    vocab,
                    shown,
                )?);
            }
            _ => {
                let mut shard = Shard::open(path, vocab)?;
                shard.release();
                shards.push(shard);
            }
        }
        if shards.len() > crate::tokens::MAX_SHARDS {
            return Err(TokensError::TooLarge {
                name: "the number of shards",
                value: shards.len() as u64,
                limit: crate::tokens::MAX_SHARDS as u64,
            }
            .into());
        }
    }
    Ok(shards)
}

/// [`TokenStream::with_options`] over `sources` (local paths and `s3://` sources, as
/// [`open_shards`] takes them): shape and ranks are checked before any shard is read.
pub fn open_stream<P: AsRef<Path>>(
    sources: &[P],
    seq_len: usize,
    batch: usize,
    rng: Pcg32,
    vocab: Option<u32>,
    options: StreamOptions,
) -> Result<TokenStream, RemoteError> {
    check_batch_shape(seq_len, batch)?;
    check_ranks(batch, options.ranks)?;
    let shards = open_shards(sources, vocab)?;
    Ok(TokenStream::with_options(
        shards, seq_len, batch, rng, vocab, options,
    )?)
}

/// Whether `name` matches `pattern`, whose `*` stands for any run of characters.
#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the fetcher (feature s3) uses it")
)]
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split(WILDCARD);
    let Some(first) = parts.next() else {
        return pattern == name;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = rest.get(at.saturating_add(piece.len())..).unwrap_or(""),
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The cache file name of an object: sha256 of its URL, entity tag and size.
#[cfg_attr(
    not(feature = "s3"),
    allow(dead_code, reason = "the fetcher (feature s3) uses it")
)]
fn cache_name(url: &S3Url, etag: Option<&str>, size: u64) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        url.to_string().as_str(),
        etag.unwrap_or(""),
        &size.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let hex = crate::digest::hex(&h.finalize());
    format!("{}.bin", hex.get(..CACHE_KEY_HEX).unwrap_or(&hex))
}

#[cfg(feature = "s3")]
mod fetch {
    use std::collections::BTreeMap;
    use std::io::{self, Write};

    use super::*;
    use crate::remote::cache::{self, Expected};
    use crate::s3::{ObjectInfo, Store};

    /// Connections by bucket, for one opening.
    #[derive(Default)]
    pub(super) struct Stores {
        by_bucket: BTreeMap<String, Store>,
        dir: Option<PathBuf>,
    }

    /// One object to fetch, with what is known of it.
    struct Wanted {
        url: S3Url,
        /// Size and tag from a listing (no HEAD needed then).
        listed: Option<ObjectInfo>,
        /// Size and sha256 from a manifest (checked against the object).
        recorded: Option<(u64, String)>,
    }

    impl Stores {
        fn store(&mut self, url: &S3Url) -> Result<&Store, S3Error> {
            if !self.by_bucket.contains_key(url.bucket()) {
                let store = crate::s3::connect(url)?;
                self.by_bucket.insert(url.bucket().to_string(), store);
            }
            self.by_bucket.get(url.bucket()).ok_or_else(|| {
                S3Error::request(url.to_string(), io::ErrorKind::Other, "no client".into())
            })
        }

        fn dir(&mut self, url: &S3Url) -> Result<PathBuf, RemoteError> {
            if let Some(d) = &self.dir {
                return Ok(d.clone());
            }
            let base = cache_dir().ok_or_else(|| RemoteError::Cache {
                url: url.to_string(),
                path: PathBuf::new(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no cache directory: set {CACHE_ENV} (or HOME)"),
                ),
            })?;
            let dir = base.join(OBJECTS_DIR);
            cache::private_dir(&dir).map_err(|source| RemoteError::Cache {
                url: url.to_string(),
                path: dir.clone(),
                source,
            })?;
            self.dir = Some(dir.clone());
            Ok(dir)
        }

        /// Expand `url` and open each of its shards into `out`.
        pub(super) fn open(
            &mut self,
            url: &S3Url,
            split: Split,
            vocab: Option<u32>,
            out: &mut Vec<Shard>,
        ) -> Result<(), RemoteError> {
            for wanted in self.expand(url, split)? {
                let mut shard = self.open_one(&wanted, vocab)?;
                shard.release();
                out.push(shard);
            }
            Ok(())
        }

        /// The objects a source names: itself, the matches of its pattern (in key
        /// order), or the shards of `split` its manifest lists.
        fn expand(&mut self, url: &S3Url, split: Split) -> Result<Vec<Wanted>, RemoteError> {
            let name = url.name();
            let parent_key = url
                .key()
                .strip_suffix(name)
                .map(|p| p.trim_end_matches('/'))
                .unwrap_or("");
            if url.key().contains(WILDCARD) {
                if parent_key.contains(WILDCARD) {
                    return Err(S3Error::BadUrl {
                        url: url.to_string(),
                        reason: format!("{WILDCARD} may appear in the last segment only"),
                    }
                    .into());
                }
                let store = self.store(url)?;
                let (_, objects) = store.list_dir(parent_key)?;
                let found: Vec<Wanted> = objects
                    .into_iter()
                    .filter(|o| glob_match(name, o.key.rsplit('/').next().unwrap_or("")))
                    .map(|o| {
                        Ok(Wanted {
                            url: url.with_key(&o.key)?,
                            listed: Some(o),
                            recorded: None,
                        })
                    })
                    .collect::<Result<_, S3Error>>()?;
                if found.is_empty() {
                    return Err(S3Error::request(
                        url.to_string(),
                        io::ErrorKind::NotFound,
                        "no object matches the pattern".to_string(),
                    )
                    .into());
                }
                return Ok(found);
            }
            if name.ends_with(MANIFEST_SUFFIX) {
                return self.manifest_shards(url, split, parent_key);
            }
            Ok(vec![Wanted {
                url: url.clone(),
                listed: None,
                recorded: None,
            }])
        }

        fn manifest_shards(
            &mut self,
            url: &S3Url,
            split: Split,
            parent_key: &str,
        ) -> Result<Vec<Wanted>, RemoteError> {
            let bytes = self.store(url)?.get(url.key(), MAX_MANIFEST_BYTES)?;
            let shown = url.to_string();
            let manifest = Manifest::parse(&bytes, &shown)?;
            let chosen = if split == Split::Train {
                shown.clone()
            } else {
                format!(
                    "{shown}{}{}",
                    crate::tokens::manifest::SPLIT_MARK,
                    split.name()
                )
            };
            manifest
                .select(url.name(), split, &chosen)?
                .into_iter()
                .map(|s| {
                    let key = if parent_key.is_empty() {
                        s.name.clone()
                    } else {
                        format!("{parent_key}/{}", s.name)
                    };
                    Ok(Wanted {
                        url: url.with_key(&key)?,
                        listed: None,
                        recorded: Some((s.bytes, s.sha256.clone())),
                    })
                })
                .collect()
        }

        /// The shard of one object: its cached copy when that validates, else a fresh
        /// download.
        fn open_one(&mut self, wanted: &Wanted, vocab: Option<u32>) -> Result<Shard, RemoteError> {
            let url = &wanted.url;
            let head = match &wanted.listed {
                Some(info) => info.clone(),
                None => self.store(url)?.head(url.key())?.ok_or_else(|| {
                    S3Error::request(
                        url.to_string(),
                        io::ErrorKind::NotFound,
                        "no such object".to_string(),
                    )
                })?,
            };
            // A manifest's size must still be the object's.
            if let Some((expected, _)) = &wanted.recorded {
                if *expected != head.size {
                    return Err(S3Error::request(
                        url.to_string(),
                        io::ErrorKind::InvalidData,
                        format!(
                            "the object has {} bytes, the manifest records {expected}",
                            head.size
                        ),
                    )
                    .into());
                }
            }
            let dir = self.dir(url)?;
            let local = dir.join(cache_name(url, head.etag.as_deref(), head.size));
            let shown = crate::remote::url_path(url);
            let sha256 = wanted.recorded.as_ref().map(|(_, h)| h.as_str());
            let expected = sha256.map_or(Expected::Recorded, Expected::Sha256);
            // A copy that cannot be read is treated as damaged: fetched again below.
            if cache::verified(&local, head.size, expected).unwrap_or(false) {
                if let Ok(shard) = Shard::open_named(&local, &shown, vocab) {
                    return Ok(shard);
                }
            }
            // Missing, planted, edited or damaged: removed and fetched again.
            cache::discard(&local);
            self.download(url, &head, sha256, &dir, &local)?;
            Ok(Shard::open_named(&local, &shown, vocab)?)
        }

        /// Download the object into `local` (a temporary file renamed into place once
        /// its size, and sha256 when known, are right and its bytes are synced).
        fn download(
            &mut self,
            url: &S3Url,
            head: &ObjectInfo,
            sha256: Option<&str>,
            dir: &Path,
            local: &Path,
        ) -> Result<(), RemoteError> {
            use sha2::{Digest, Sha256};
            let cache_err = |path: &Path| {
                let path = path.to_path_buf();
                let url = url.to_string();
                move |source| RemoteError::Cache {
                    url: url.clone(),
                    path: path.clone(),
                    source,
                }
            };
            let tmp = tempfile::Builder::new()
                .prefix(".partial-")
                .tempfile_in(dir)
                .map_err(cache_err(dir))?;
            let mut hasher = sha256.map(|_| Sha256::new());
            let mut own = blake3::Hasher::new();
            let store = self.store(url)?;
            let mut out = io::BufWriter::new(tmp.as_file());
            let got = store.download_matching(
                url.key(),
                head.etag.as_deref(),
                &mut out,
                &mut |chunk| {
                    if let Some(h) = hasher.as_mut() {
                        h.update(chunk);
                    }
                    own.update(chunk);
                },
            )?;
            out.flush().map_err(cache_err(tmp.path()))?;
            drop(out);
            let mismatch =
                |what: String| S3Error::request(url.to_string(), io::ErrorKind::InvalidData, what);
            if got != head.size {
                return Err(mismatch(format!(
                    "the download has {got} bytes, the object {}",
                    head.size
                ))
                .into());
            }
            if let (Some(want), Some(h)) = (sha256, hasher) {
                let have = crate::digest::hex(&h.finalize());
                if have != want {
                    return Err(
                        mismatch(format!("sha256 {have}, the manifest records {want}")).into(),
                    );
                }
            }
            tmp.as_file().sync_all().map_err(cache_err(tmp.path()))?;
            // The digest first: a copy in place always has the digest of its bytes.
            cache::record(dir, local, own.finalize().to_hex().as_str())
                .map_err(cache_err(local))?;
            tmp.persist(local).map_err(|e| cache_err(local)(e.error))?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_star_runs_only() {
        for (p, n, want) in [
            ("train_*.bin", "train_000001.bin", true),
            ("train_*.bin", "train_.bin", true),
            ("train_*.bin", "val_000000.bin", false),
            ("train_*.bin", "train_000001.bin.tmp", false),
            ("*", "anything", true),
            ("*_val_*", "fw_val_000000.bin", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} {n}");
        }
    }

    #[test]
    fn cache_names_differ_by_url_tag_and_size() {
        let a = S3Url::parse("s3://bucket/a.bin").unwrap();
        let b = S3Url::parse("s3://bucket/b.bin").unwrap();
        let n = cache_name(&a, Some("\"x\""), 10);
        assert_eq!(n.len(), CACHE_KEY_HEX + 4);
        assert_eq!(n, cache_name(&a, Some("\"x\""), 10));
        assert_ne!(n, cache_name(&b, Some("\"x\""), 10));
        assert_ne!(n, cache_name(&a, Some("\"y\""), 10));
        assert_ne!(n, cache_name(&a, Some("\"x\""), 11));
        assert_ne!(n, cache_name(&a, None, 10));
    }

    #[test]
    fn urls_stay_as_given_and_paths_become_absolute() {
        assert_eq!(
            absolute_source(Path::new("s3://bucket/d/x.bin")),
            PathBuf::from("s3://bucket/d/x.bin")
        );
        assert!(absolute_source(Path::new("rel/x.bin")).is_absolute());
    }

    proptest::proptest! {
        /// A pattern without `*` matches exactly itself; `*` alone matches anything; a
        /// name always matches the pattern made of its own prefix, `*` and suffix.
        #[test]
        fn glob_agrees_with_splitting(name in "[a-z_.0-9]{0,12}", cut in 0usize..13, cut2 in 0usize..13) {
            let (a, b) = (cut.min(name.len()), cut2.min(name.len()));
            let (lo, hi) = (a.min(b), a.max(b));
            proptest::prop_assert!(glob_match(&name, &name));
            proptest::prop_assert!(glob_match("*", &name));
            let pattern = format!("{}*{}", &name[..lo], &name[hi..]);
            proptest::prop_assert!(glob_match(&pattern, &name));
            let longer = format!("{name}x");
            proptest::prop_assert!(!glob_match(&name, &longer));
        }
    }
}
