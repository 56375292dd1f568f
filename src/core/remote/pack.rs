//! `tokens pack -o s3://bucket/prefix` (scale.md section 3): the shards are packed
//! exactly as locally, into a staging directory, then uploaded (in parts when large,
//! hashed as they go) under the names a local pack gives them, and a manifest naming
//! every shard with its size and sha256 is created last with a conditional put.
//!
//! Invariants: nothing is uploaded before the whole input was packed (a bad input
//! leaves nothing in storage); a pack never replaces an object: it refuses when a
//! shard name of its output already exists without a manifest, or the manifest names
//! other shards (checked before packing and again before uploading; single-request
//! uploads are conditional too); a rerun whose manifest would be the stored one's
//! bytes is complete and uploads nothing; on a failed upload the shards this pack
//! uploaded are deleted again (best effort), but never once the manifest's put was
//! sent (its reply may be lost after the server created it: it is read back, see
//! [`super::create`]); the manifest exists only when every shard it names was
//! uploaded whole, so a reader going through it sees all of the pack or none of it.

use std::path::{Path, PathBuf};

#[cfg(feature = "s3")]
use super::create::{put_once, Outcome};
use super::shards::MANIFEST_SUFFIX;
#[cfg(feature = "s3")]
use super::shards::{Manifest, ManifestShard, MANIFEST_FORMAT};
use super::RemoteError;
#[cfg(feature = "s3")]
use crate::s3::S3Error;
use crate::s3::{is_s3_url, S3Url};
#[cfg(feature = "s3")]
use crate::tokens::manifest::ManifestDocs;
use crate::tokens::{ShardHeader, TokensError};

/// A shard written by a pack: its path or URL, and its header.
pub type Written = (String, ShardHeader);

/// The shards a pack wrote and, for object storage, the manifest it created last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Each shard, in order: its path (local) or URL.
    pub shards: Vec<Written>,
    /// The manifest's URL (object storage only).
    pub manifest: Option<String>,
    /// The output was there already, complete, with the very manifest this pack would
    /// create: nothing was uploaded (object storage only).
    pub already_complete: bool,
}

/// The base of the output's names: a trailing `.bin` dropped, as shard names drop it.
fn base_name(name: &str) -> &str {
    name.strip_suffix(".bin").unwrap_or(name)
}

/// The manifest's name for an output named `name` (`train.bin` or `train`:
/// `train.manifest.json`).
pub fn manifest_name(name: &str) -> String {
    format!("{}{MANIFEST_SUFFIX}", base_name(name))
}

/// Whether an existing object `name` is one a pack to `out_name` could write: the
/// output itself, a numbered or val/train shard of it, or its manifest.
pub fn is_output_name(out_name: &str, name: &str) -> bool {
    let base = base_name(out_name);
    name == out_name
        || name == manifest_name(out_name)
        || name.strip_prefix(base) == Some(".docs")
        || name
            .strip_prefix(base)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|rest| rest.ends_with(".bin") || rest.ends_with(".docs"))
}

/// Run `pack` with its output at `out`: a local path is written by `pack` as always;
/// an `s3://` URL is packed into a staging directory, then published (see the module
/// doc). `pack` gets the local output path and returns the shards it wrote.
pub fn pack_to<F>(out: &Path, pack: F) -> Result<Published, RemoteError>
where
    F: FnOnce(&Path) -> Result<Vec<(PathBuf, ShardHeader)>, TokensError>,
{
    match out.to_str() {
        Some(text) if is_s3_url(text) => {
            let url = S3Url::parse(text)?;
            publish(&url, pack)
        }
        _ => Ok(Published {
            shards: pack(out)?
                .into_iter()
                .map(|(p, h)| (p.display().to_string(), h))
                .collect(),
            manifest: None,
            already_complete: false,
        }),
    }
}

#[cfg(not(feature = "s3"))]
fn publish<F>(url: &S3Url, _pack: F) -> Result<Published, RemoteError>
where
    F: FnOnce(&Path) -> Result<Vec<(PathBuf, ShardHeader)>, TokensError>,
{
    Err(super::not_built(url))
}

#[cfg(feature = "s3")]
fn publish<F>(url: &S3Url, pack: F) -> Result<Published, RemoteError>
where
    F: FnOnce(&Path) -> Result<Vec<(PathBuf, ShardHeader)>, TokensError>,
{
    publish_with(url, |out| Ok((pack(out)?, ()))).map(|(published, ())| published)
}

/// The name of the output `url` and the key of the prefix it lies in; an output
/// needs a name below the bucket.
#[cfg(feature = "s3")]
pub(super) fn output_parent(url: &S3Url) -> Result<(&str, String), S3Error> {
    let name = url.name();
    if name.is_empty() {
        return Err(S3Error::BadUrl {
            url: url.to_string(),
            reason: "the output needs a name below the bucket (s3://bucket/prefix)".to_string(),
        });
    }
    let parent_key = url
        .key()
        .strip_suffix(name)
        .map(|p| p.trim_end_matches('/'))
        .unwrap_or("")
        .to_string();
    Ok((name, parent_key))
}

/// A staging directory (under `$TMPDIR`, named `prefix...`) for the local half of the
/// work on `url`.
#[cfg(feature = "s3")]
pub(super) fn staging(url: &S3Url, prefix: &str) -> Result<tempfile::TempDir, RemoteError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| RemoteError::Cache {
            url: url.to_string(),
            path: std::env::temp_dir(),
            source,
        })
}

/// [`publish`] of shards that `pack` (packing, or merging parts) writes into the
/// staging directory (its output path there is the argument), with what else `pack`
/// returns. When the output's manifest is already there, a pack whose manifest would
/// be the same bytes is complete (nothing is uploaded; every shard it names must be
/// there at its size), and any other pack is refused.
#[cfg(feature = "s3")]
pub(super) fn publish_with<F, T>(url: &S3Url, pack: F) -> Result<(Published, T), RemoteError>
where
    F: FnOnce(&Path) -> Result<(Vec<(PathBuf, ShardHeader)>, T), RemoteError>,
{
    let (name, parent_key) = output_parent(url)?;
    let store = crate::s3::connect(url)?;
    let manifest_url = url.with_key(&key_in(&parent_key, &manifest_name(url.name())))?;
    let existing = read_manifest(&store, &manifest_url)?;
    if existing.is_none() {
        refuse_existing(&store, url, &parent_key)?;
    }
    let stage = staging(url, "tlio-pack-")?;
    let (written, extra) = pack(&stage.path().join(name))?;
    if let Some(theirs) = existing {
        let (ours, shards) = staged_manifest(url, &parent_key, &written)?;
        return complete(&store, &manifest_url, &parent_key, &theirs, &ours)
            .map(|()| (published(shards, &manifest_url, true), extra));
    }
    // Packing may have taken hours: another writer may have come meanwhile.
    refuse_existing(&store, url, &parent_key)?;
    let mut uploaded: Vec<String> = Vec::new();
    let (text, shards) = match upload_all(&store, url, &parent_key, &written, &mut uploaded) {
        Ok(done) => done,
        Err(e) => {
            // No manifest was sent: nothing names these shards.
            for key in &uploaded {
                store.delete(key).ok();
            }
            return Err(e);
        }
    };
    // The commit, sent once and settled by reading the manifest back: whatever its
    // outcome, the shards stay (a manifest may name them).
    let mine = |bytes: &[u8]| bytes == text.as_slice();
    let limit = super::shards::MAX_MANIFEST_BYTES;
    let url_text = manifest_url.to_string();
    match put_once(
        &store,
        &url_text,
        manifest_url.key(),
        &text,
        None,
        limit,
        &mine,
    )? {
        Outcome::Ours => Ok((published(shards, &manifest_url, false), extra)),
        Outcome::Theirs(..) | Outcome::Gone => Err(exists(&manifest_url).into()),
    }
}

/// The key of `name` in the prefix `parent_key`.
#[cfg(feature = "s3")]
fn key_in(parent_key: &str, name: &str) -> String {
    if parent_key.is_empty() {
        name.to_string()
    } else {
        format!("{parent_key}/{name}")
    }
}

/// What a pack published: its shards' URLs and headers, and its manifest's URL.
#[cfg(feature = "s3")]
fn published(shards: Vec<Written>, manifest_url: &S3Url, already_complete: bool) -> Published {
    Published {
        shards,
        manifest: Some(manifest_url.to_string()),
        already_complete,
    }
}

/// The output's manifest, when it is there.
#[cfg(feature = "s3")]
fn read_manifest(store: &crate::s3::Store, url: &S3Url) -> Result<Option<Vec<u8>>, RemoteError> {
    let limit = super::shards::MAX_MANIFEST_BYTES;
    match store.get_if_exists(url.key(), limit) {
        Ok(found) => Ok(found.map(|(bytes, _)| bytes)),
        Err(S3Error::TooLarge { .. }) => Ok(Some(Vec::new())),
        Err(e) => Err(e.into()),
    }
}

/// A rerun of a pack whose manifest is there: complete when the stored manifest is
/// the one this pack would create (`ours`) and every shard it names is there at its
/// size; refused otherwise.
#[cfg(feature = "s3")]
fn complete(
    store: &crate::s3::Store,
    manifest_url: &S3Url,
    parent_key: &str,
    theirs: &[u8],
    ours: &[u8],
) -> Result<(), RemoteError> {
    if theirs != ours {
        return Err(S3Error::request(
            manifest_url.to_string(),
            std::io::ErrorKind::AlreadyExists,
            "already exists, with other shards than this pack's: a pack never replaces objects \
             in storage (remove the old output first, or pick another prefix)"
                .to_string(),
        )
        .into());
    }
    let manifest: Manifest = serde_json::from_slice(ours).map_err(|e| {
        S3Error::request(
            manifest_url.to_string(),
            std::io::ErrorKind::Other,
            e.to_string(),
        )
    })?;
    let files = manifest.shards.iter().flat_map(|s| {
        std::iter::once((s.name.as_str(), s.bytes))
            .chain(s.docs.as_ref().map(|d| (d.name.as_str(), d.bytes)))
    });
    for (name, bytes) in files {
        let url = manifest_url.with_key(&key_in(parent_key, name))?;
        let size = store.head(url.key())?.map(|i| i.size);
        if size != Some(bytes) {
            return Err(S3Error::request(
                url.to_string(),
                std::io::ErrorKind::NotFound,
                format!(
                    "{} names it with {} bytes, but it is {}: the output is damaged (remove it \
                     and pack again)",
                    manifest_url,
                    bytes,
                    size.map_or("missing".to_string(), |n| format!("{n} bytes"))
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// The manifest bytes a pack of the staged shards `written` creates (each staged file
/// hashed), and the shards' URLs beside `url`.
#[cfg(feature = "s3")]
fn staged_manifest(
    url: &S3Url,
    parent_key: &str,
    written: &[(PathBuf, ShardHeader)],
) -> Result<(Vec<u8>, Vec<Written>), RemoteError> {
    use sha2::{Digest, Sha256};
    let mut listed = Vec::new();
    let mut shards = Vec::new();
    let hashed = |path: &Path| -> Result<(u64, String), S3Error> {
        let mut hasher = Sha256::new();
        let mut file = std::fs::File::open(path).map_err(|e| local_err(url, path, &e))?;
        let bytes = std::io::copy(&mut file, &mut hasher).map_err(|e| local_err(url, path, &e))?;
        Ok((bytes, crate::digest::hex(&hasher.finalize())))
    };
    for (path, header) in written {
        let file_name = staged_name(url, path)?;
        let (bytes, sha256) = hashed(path)?;
        let shard_url = url.with_key(&key_in(parent_key, &file_name))?;
        let docs = match staged_docs(path) {
            Some(docs) => {
                let (bytes, sha256) = hashed(&docs)?;
                let name = staged_name(url, &docs)?;
                Some(ManifestDocs {
                    name,
                    bytes,
                    sha256,
                })
            }
            None => None,
        };
        listed.push(ManifestShard {
            name: file_name,
            bytes,
            sha256,
            n: header.count,
            docs,
        });
        shards.push((shard_url.to_string(), *header));
    }
    Ok((manifest_text(url, listed)?, shards))
}

/// The document sidecar the pack staged beside the shard at `path`, if it wrote one.
#[cfg(feature = "s3")]
fn staged_docs(path: &Path) -> Option<PathBuf> {
    let docs = crate::tokens::docs::docs_path(path);
    docs.is_file().then_some(docs)
}

/// A local I/O error about a staged file of the output `url`.
#[cfg(feature = "s3")]
fn local_err(url: &S3Url, path: &Path, e: &std::io::Error) -> S3Error {
    S3Error::request(
        url.to_string(),
        e.kind(),
        format!("{}: {e}", path.display()),
    )
}

/// The name of a staged shard (its file name, UTF-8).
#[cfg(feature = "s3")]
fn staged_name(url: &S3Url, path: &Path) -> Result<String, S3Error> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| {
            S3Error::request(
                url.to_string(),
                std::io::ErrorKind::InvalidInput,
                format!("staged shard {} has no UTF-8 name", path.display()),
            )
        })
}

/// The manifest's bytes for the shards `listed` (pretty JSON and a newline).
#[cfg(feature = "s3")]
fn manifest_text(url: &S3Url, listed: Vec<ManifestShard>) -> Result<Vec<u8>, S3Error> {
    let tokens = listed.iter().fold(0u64, |t, s| t.saturating_add(s.n));
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_string(),
        shards: listed,
        tokens,
    };
    let mut text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| S3Error::request(url.to_string(), std::io::ErrorKind::Other, e.to_string()))?;
    text.push(b'\n');
    Ok(text)
}

/// Upload the staged shards `written` beside `url` (in `parent_key`), recording each
/// key uploaded in `uploaded`; the manifest's bytes to create last, and the shards.
#[cfg(feature = "s3")]
fn upload_all(
    store: &crate::s3::Store,
    url: &S3Url,
    parent_key: &str,
    written: &[(PathBuf, ShardHeader)],
    uploaded: &mut Vec<String>,
) -> Result<(Vec<u8>, Vec<Written>), RemoteError> {
    let mut shards = Vec::new();
    let mut listed = Vec::new();
    for (path, header) in written {
        let file_name = staged_name(url, path)?;
        let shard_url = url.with_key(&key_in(parent_key, &file_name))?;
        let (bytes, sha256) = upload_new(store, &shard_url, path)?;
        uploaded.push(shard_url.key().to_string());
        let docs = match staged_docs(path) {
            Some(docs) => {
                let name = staged_name(url, &docs)?;
                let docs_url = url.with_key(&key_in(parent_key, &name))?;
                let (bytes, sha256) = upload_new(store, &docs_url, &docs)?;
                uploaded.push(docs_url.key().to_string());
                Some(ManifestDocs {
                    name,
                    bytes,
                    sha256,
                })
            }
            None => None,
        };
        listed.push(ManifestShard {
            name: file_name,
            bytes,
            sha256,
            n: header.count,
            docs,
        });
        shards.push((shard_url.to_string(), *header));
    }
    Ok((manifest_text(url, listed)?, shards))
}

/// The error for an output object that is already there.
#[cfg(feature = "s3")]
fn exists(url: &S3Url) -> S3Error {
    S3Error::request(
        url.to_string(),
        std::io::ErrorKind::AlreadyExists,
        "already exists: a pack never replaces objects in storage (remove the old output first, or pick another prefix)"
            .to_string(),
    )
}

/// Refuse when any object a pack to `url` could write is there already.
#[cfg(feature = "s3")]
fn refuse_existing(
    store: &crate::s3::Store,
    url: &S3Url,
    parent_key: &str,
) -> Result<(), RemoteError> {
    let (_, objects) = store.list_dir(parent_key)?;
    let name = url.name();
    match objects
        .iter()
        .find(|o| is_output_name(name, o.key.rsplit('/').next().unwrap_or("")))
    {
        Some(o) => Err(exists(&url.with_key(&o.key)?).into()),
        None => Ok(()),
    }
}

/// Upload the file at `path` as the new object `url` (a single conditional put when
/// small, parts otherwise), hashing it on the way; its size and sha256.
#[cfg(feature = "s3")]
fn upload_new(
    store: &crate::s3::Store,
    url: &S3Url,
    path: &Path,
) -> Result<(u64, String), RemoteError> {
    use sha2::{Digest, Sha256};
    use std::io::Read;

    let local = |e: std::io::Error| {
        S3Error::request(
            url.to_string(),
            e.kind(),
            format!("{}: {e}", path.display()),
        )
    };
    let size = std::fs::metadata(path).map_err(local)?.len();
    let mut hasher = Sha256::new();
    if size < crate::s3::MULTIPART_THRESHOLD {
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut data))
            .map_err(local)?;
        hasher.update(&data);
        let n = data.len() as u64;
        // Sent once, settled by reading back: a lost reply is not another writer.
        let mine = |bytes: &[u8]| bytes == data.as_slice();
        let url_text = url.to_string();
        return match put_once(store, &url_text, url.key(), &data, None, size, &mine)? {
            Outcome::Ours => Ok((n, crate::digest::hex(&hasher.finalize()))),
            Outcome::Theirs(..) | Outcome::Gone => Err(exists(url).into()),
        };
    }
    let n = store.upload(url.key(), path, &mut |chunk| hasher.update(chunk))?;
    Ok((n, crate::digest::hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_are_the_ones_a_pack_writes() {
        assert_eq!(manifest_name("train"), "train.manifest.json");
        assert_eq!(manifest_name("train.bin"), "train.manifest.json");
        for (out, name, want) in [
            ("train", "train", true),
            ("train", "train_000000.bin", true),
            ("train.bin", "train_000012.bin", true),
            ("train.bin", "train.bin", true),
            ("fw", "fw_val_000000.bin", true),
            ("fw", "fw_train_000001.bin", true),
            ("fw", "fw.manifest.json", true),
            ("train", "training_000000.bin", false),
            ("train", "train_000000.bin.tmp", false),
            ("train", "other.bin", false),
        ] {
            assert_eq!(is_output_name(out, name), want, "{out} {name}");
        }
    }

    #[test]
    fn a_local_output_is_the_pack_itself() {
        let header = ShardHeader::for_ids(3, 256).unwrap();
        let got = pack_to(Path::new("out.bin"), |p| {
            assert_eq!(p, Path::new("out.bin"));
            Ok(vec![(p.to_path_buf(), header)])
        })
        .unwrap();
        assert_eq!(got.shards, vec![("out.bin".to_string(), header)]);
        assert_eq!(got.manifest, None);
    }
}
