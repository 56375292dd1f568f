//! Checkpoints on object storage, committed without rename (scale.md section 3): the
//! layout under a prefix `P`, its listing, the manifest that names its attempt, and
//! the pieces the save (`save`), the reads (`read`) and `gc` share.
//!
//! ```text
//! P/LATEST                                  "step-000050\n", a hint (never moves back)
//! P/step-000050/MANIFEST.json               the commit: created with If-None-Match: *
//! P/step-000050/attempt-<32 hex>/model.safetensors   the data of one attempt
//! P/step-000050/attempt-<32 hex>/trainer_state.json
//! ```
//!
//! Invariants: a step exists exactly when its `MANIFEST.json` exists (and it loads only
//! when it verifies); a manifest names one attempt and lists that attempt's objects
//! with their sizes and sha256 by the local manifest's rules; data objects are written
//! only under a fresh attempt's prefix, never over anything a manifest names; only keys
//! whose shape the protocol owns are ever read as part of a step or deleted.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::checkpoint::manifest::{is_plain_name, Manifest, ManifestError, MANIFEST_NAME};
use crate::checkpoint::{parse_latest, parse_step_name, step_name, Latest, LATEST_NAME};
use crate::s3::{ObjectInfo, S3Error, S3Url, Store};
use crate::safetensors::header::{header_len, parse_header_bytes, N_LEN};
use crate::safetensors::{Header, SafetensorsError, MAX_HEADER_SIZE};

pub mod choose;
pub mod gc;
pub mod read;
pub mod save;
pub mod sharded;

pub use choose::{load, load_unless_sharded, pick, Wanted};
pub use gc::gc;
pub use read::{download_step, inspect_step, survey};
pub use save::save;

/// The start of an attempt's name: `attempt-` and [`ATTEMPT_ID_HEX`] lowercase hex.
pub const ATTEMPT_PREFIX: &str = "attempt-";
/// Hex digits of an attempt's random id (128 bits).
pub const ATTEMPT_ID_HEX: usize = 32;
/// How old the newest object of an attempt that no manifest names must be before `gc`
/// (or a save's cleanup) removes it: a writer still uploading has written an object
/// more recently than this. Longer than any one object's upload should take.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);
/// The manifest key that names the attempt.
const ATTEMPT_KEY: &str = "attempt";

/// A fresh attempt name: `attempt-` and 128 bits that no other writer draws (the
/// process, the thread, the time in nanoseconds, a counter and an address, hashed).
pub fn new_attempt() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let local = 0u8;
    h.update(&(std::ptr::addr_of!(local) as usize).to_le_bytes());
    let hex = crate::digest::hex(h.finalize().as_bytes());
    format!(
        "{ATTEMPT_PREFIX}{}",
        hex.get(..ATTEMPT_ID_HEX).unwrap_or(&hex)
    )
}

/// True when `name` has the shape [`new_attempt`] gives.
pub fn is_attempt_name(name: &str) -> bool {
    name.strip_prefix(ATTEMPT_PREFIX)
        .is_some_and(|id| crate::digest::is_lower_hex(id, ATTEMPT_ID_HEX))
}

/// A checkpoint prefix and a client of its bucket.
#[derive(Debug)]
pub struct Remote {
    /// The client (shared with the sources of a step opened for region reads).
    pub store: std::sync::Arc<Store>,
    /// The checkpoint prefix (`s3://bucket/P`).
    pub root: S3Url,
}

impl Remote {
    /// Connect to the bucket of `root` (no request is sent yet).
    pub fn connect(root: &S3Url) -> Result<Self, S3Error> {
        Ok(Remote {
            store: std::sync::Arc::new(crate::s3::connect(root)?),
            root: root.clone(),
        })
    }

    /// The full key of `rel` below the prefix.
    pub fn key(&self, rel: &str) -> String {
        self.root.child_key(rel)
    }

    /// The URL of `rel` below the prefix (the prefix itself for an empty `rel`).
    pub fn url(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.root.to_string()
        } else {
            format!("{}/{rel}", self.root)
        }
    }

    /// [`Remote::url`] as the path a report names (core's reports name paths).
    pub fn path(&self, rel: &str) -> PathBuf {
        PathBuf::from(self.url(rel))
    }
}

/// `step-N/MANIFEST.json`.
pub fn manifest_rel(step: u64) -> String {
    format!("{}/{MANIFEST_NAME}", step_name(step))
}

/// `step-N/attempt-x/name`.
pub fn object_rel(step: u64, attempt: &str, name: &str) -> String {
    format!("{}/{attempt}/{name}", step_name(step))
}

/// The objects of one step prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepObjects {
    /// `MANIFEST.json`, when the step is committed.
    pub manifest: Option<ObjectInfo>,
    /// Each attempt's objects, by attempt, then by file name.
    pub attempts: BTreeMap<String, BTreeMap<String, ObjectInfo>>,
    /// Other keys below the step prefix (not the protocol's; never deleted by name).
    pub others: Vec<ObjectInfo>,
}

/// What one listing shows of a checkpoint prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteListing {
    /// Every step prefix (canonical step names), by step.
    pub steps: BTreeMap<u64, StepObjects>,
    /// The `LATEST` object.
    pub latest: Option<ObjectInfo>,
    /// Keys below the prefix (relative to it) that no object-store path names, such
    /// as `notes//x` or `./x`: not the protocol's, so never read or deleted; `verify`
    /// names them.
    pub foreign: Vec<String>,
}

impl RemoteListing {
    /// The committed steps (those with a manifest), ascending.
    pub fn committed(&self) -> Vec<u64> {
        self.steps
            .iter()
            .filter(|(_, s)| s.manifest.is_some())
            .map(|(&n, _)| n)
            .collect()
    }

    /// The committed steps with their manifests' entity tags: two listings that agree
    /// on this saw the same commits.
    pub fn commits(&self) -> Vec<(u64, Option<String>)> {
        self.steps
            .iter()
            .filter_map(|(&n, s)| s.manifest.as_ref().map(|m| (n, m.etag.clone())))
            .collect()
    }
}

/// Sort one listed object into `listing` by its key below the prefix (`rel`).
fn place(listing: &mut RemoteListing, rel: &str, info: ObjectInfo) {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        [LATEST_NAME] => listing.latest = Some(info),
        [step, rest @ ..] => {
            let Some(n) = parse_step_name(step) else {
                return;
            };
            let entry = listing.steps.entry(n).or_default();
            match rest {
                [name] if *name == MANIFEST_NAME => entry.manifest = Some(info),
                [attempt, name] if is_attempt_name(attempt) && is_plain_name(name) => {
                    entry
                        .attempts
                        .entry((*attempt).to_string())
                        .or_default()
                        .insert((*name).to_string(), info);
                }
                _ => entry.others.push(info),
            }
        }
        [] => {}
    }
}

/// List the prefix: every step's manifest and attempts, and `LATEST` (one request per
/// thousand keys). A bucket that does not exist is an error naming it.
pub fn list(remote: &Remote) -> Result<RemoteListing, S3Error> {
    list_under(remote, "")
}

/// [`list`] restricted to `rel` below the prefix (one step: `step-N`).
pub fn list_under(remote: &Remote, rel: &str) -> Result<RemoteListing, S3Error> {
    let base = remote.root.key();
    let prefix = if rel.is_empty() {
        base.to_string()
    } else {
        remote.key(rel)
    };
    let mut listing = RemoteListing::default();
    let below = |key: &str| -> Option<String> {
        if base.is_empty() {
            Some(key.to_string())
        } else {
            key.strip_prefix(base)
                .and_then(|r| r.strip_prefix('/'))
                .map(str::to_string)
        }
    };
    let listed = remote.store.list_all(&prefix)?;
    for info in listed.objects {
        if let Some(rel) = below(&info.key) {
            place(&mut listing, &rel, info);
        }
    }
    listing.foreign = listed.foreign.iter().filter_map(|k| below(k)).collect();
    Ok(listing)
}

/// What `LATEST` says and its entity tag (for the conditional replace); `None` when
/// there is none.
pub fn read_latest(remote: &Remote) -> Result<Option<(Latest, Option<String>)>, S3Error> {
    let limit = crate::checkpoint::MAX_LATEST_BYTES;
    match remote.store.get_if_exists(&remote.key(LATEST_NAME), limit) {
        Ok(Some((bytes, etag))) => Ok(Some((parse_latest(&bytes), etag))),
        Ok(None) => Ok(None),
        Err(S3Error::TooLarge { .. }) => {
            // Still replaceable: its tag is what a save's If-Match needs.
            let etag = remote
                .store
                .head(&remote.key(LATEST_NAME))?
                .and_then(|i| i.etag);
            Ok(Some((
                Latest::Malformed(format!("LATEST is larger than {limit} bytes")),
                etag,
            )))
        }
        Err(e) => Err(e),
    }
}

/// A manifest on object storage: the local manifest's content (checkpoint.md's rules,
/// checked by [`Manifest`]) and the attempt whose objects it lists, as one more key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteManifest {
    /// The attempt (`attempt-<hex>`) holding the files.
    pub attempt: String,
    /// The step and its files.
    pub manifest: Manifest,
}

impl RemoteManifest {
    /// The bytes: the local manifest's, with `"attempt":"..."` after the step.
    pub fn to_json(&self) -> Vec<u8> {
        let local = String::from_utf8_lossy(&self.manifest.to_json()).into_owned();
        let at = format!("\"step\":{},", self.manifest.step);
        let with = format!("{at}\"{ATTEMPT_KEY}\":\"{}\",", self.attempt);
        local.replacen(&at, &with, 1).into_bytes()
    }

    /// Parse and validate: the attempt must be one [`new_attempt`] could give; the
    /// rest must be a valid local manifest.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        let malformed = |why: &str| ManifestError::Malformed(why.to_string());
        let mut value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        let object = value
            .as_object_mut()
            .ok_or_else(|| malformed("the manifest must be a JSON object"))?;
        let attempt = match object.remove(ATTEMPT_KEY) {
            Some(serde_json::Value::String(a)) if is_attempt_name(&a) => a,
            Some(_) => {
                return Err(malformed(
                    "\"attempt\" is not attempt- and 32 lowercase hex digits",
                ))
            }
            None => return Err(malformed(
                "no \"attempt\" (a manifest on object storage names the attempt holding its files)",
            )),
        };
        let rest =
            serde_json::to_vec(&value).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        Ok(RemoteManifest {
            attempt,
            manifest: Manifest::from_json(&rest)?,
        })
    }
}

/// Keeps the safetensors header of a stream of bytes as it passes (the 8-byte length,
/// then that many bytes, at most [`MAX_HEADER_SIZE`]), so a file written or read once
/// is checked against the reader rules without a second pass.
#[derive(Debug, Default)]
pub struct HeaderCapture {
    bytes: Vec<u8>,
}

impl HeaderCapture {
    /// Take what this chunk adds to the header.
    pub fn see(&mut self, chunk: &[u8]) {
        let want = match self.bytes.get(..N_LEN as usize) {
            Some(prefix) => {
                let mut n = [0u8; N_LEN as usize];
                n.copy_from_slice(prefix);
                N_LEN.saturating_add(u64::from_le_bytes(n).min(MAX_HEADER_SIZE))
            }
            None => N_LEN,
        };
        let missing =
            usize::try_from(want.saturating_sub(self.bytes.len() as u64)).unwrap_or(usize::MAX);
        if missing == 0 {
            return;
        }
        let take = missing.min(chunk.len());
        self.bytes
            .extend_from_slice(chunk.get(..take).unwrap_or_default());
        if take < chunk.len() && self.bytes.len() as u64 == N_LEN {
            // The length just became known: the rest of this chunk may hold the header.
            self.see(chunk.get(take..).unwrap_or_default());
        }
    }

    /// The validated header of a file of `size` bytes whose start passed through.
    pub fn header(&self, size: u64) -> Result<Header, SafetensorsError> {
        let mut prefix = [0u8; N_LEN as usize];
        if size >= N_LEN {
            for (p, b) in prefix.iter_mut().zip(&self.bytes) {
                *p = *b;
            }
        }
        let n = header_len(prefix, size)?;
        let start = N_LEN as usize;
        let end = usize::try_from(N_LEN.saturating_add(n)).unwrap_or(usize::MAX);
        parse_header_bytes(self.bytes.get(start..end).unwrap_or_default(), size)
    }
}

/// A writer that hashes, counts and (for safetensors) keeps the header of what passes
/// through to `inner`.
pub(crate) struct Tee<'w> {
    pub inner: &'w mut dyn Write,
    pub hasher: Sha256,
    pub size: u64,
    pub header: Option<HeaderCapture>,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        let done = buf.get(..n).unwrap_or_default();
        self.hasher.update(done);
        if let Some(h) = &mut self.header {
            h.see(done);
        }
        self.size = self.size.saturating_add(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::manifest::ManifestEntry;

    #[test]
    fn attempts_are_fresh_and_recognised() {
        let a = new_attempt();
        let b = new_attempt();
        assert_ne!(a, b);
        assert!(is_attempt_name(&a), "{a}");
        assert_eq!(a.len(), ATTEMPT_PREFIX.len() + ATTEMPT_ID_HEX);
        for bad in ["attempt-", "attempt-XYZ", "step-000001", &a[..a.len() - 1]] {
            assert!(!is_attempt_name(bad), "{bad}");
        }
    }

    fn manifest() -> RemoteManifest {
        RemoteManifest {
            attempt: format!("{ATTEMPT_PREFIX}{}", "ab".repeat(16)),
            manifest: Manifest::new(
                7,
                vec![ManifestEntry {
                    name: "model.safetensors".into(),
                    size: 3,
                    sha256: "0".repeat(64),
                }],
            )
            .unwrap(),
        }
    }

    #[test]
    fn remote_manifest_round_trips_and_is_the_local_one_plus_the_attempt() {
        let m = manifest();
        let bytes = m.to_json();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.starts_with(&format!(
                "{{\"format\":\"tlio-manifest\",\"version\":1,\"step\":7,\"attempt\":\"{}\",\"files\":[",
                m.attempt
            )),
            "{text}"
        );
        assert_eq!(RemoteManifest::from_json(&bytes).unwrap(), m);
        // Without the attempt it is exactly the local manifest.
        let local = text.replace(&format!("\"attempt\":\"{}\",", m.attempt), "");
        assert_eq!(local.as_bytes(), m.manifest.to_json().as_slice());
        // A local manifest names no attempt; a bad attempt or a bad entry is refused.
        assert!(RemoteManifest::from_json(local.as_bytes()).is_err());
        for bad in [
            text.replace(&m.attempt, "attempt-../../x"),
            text.replace("model.safetensors", "../model.safetensors"),
            text.replace("\"version\":1", "\"version\":2"),
            "[]".to_string(),
        ] {
            assert!(RemoteManifest::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn listing_sorts_keys_into_steps_attempts_and_latest() {
        let info = |key: &str| ObjectInfo {
            key: key.to_string(),
            size: 1,
            etag: None,
            last_modified: std::time::UNIX_EPOCH,
        };
        let a = new_attempt();
        let mut l = RemoteListing::default();
        for rel in [
            "LATEST".to_string(),
            "step-000001/MANIFEST.json".to_string(),
            format!("step-000001/{a}/model.safetensors"),
            format!("step-000002/{a}/model.safetensors"),
            "step-000002/junk".to_string(),
            "step-7/MANIFEST.json".to_string(),
            "notes.txt".to_string(),
            format!("step-000003/{a}/x/y"),
        ] {
            place(&mut l, &rel, info(&rel));
        }
        assert!(l.latest.is_some());
        assert_eq!(l.committed(), vec![1]);
        assert_eq!(l.steps.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        let two = l.steps.get(&2).unwrap();
        assert!(two
            .attempts
            .get(&a)
            .unwrap()
            .contains_key("model.safetensors"));
        assert_eq!(two.others.len(), 1);
        assert_eq!(l.steps.get(&3).unwrap().others.len(), 1);
    }

    #[test]
    fn header_capture_keeps_the_header_across_chunks() {
        let mut file = Vec::new();
        let header = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        file.extend_from_slice(&(header.len() as u64).to_le_bytes());
        file.extend_from_slice(header);
        file.extend_from_slice(&[0u8; 8]);
        for chunk in [1usize, 3, 8, 9, 100] {
            let mut c = HeaderCapture::default();
            for part in file.chunks(chunk) {
                c.see(part);
            }
            let h = c.header(file.len() as u64).unwrap();
            assert_eq!(h.tensors().len(), 1, "chunk {chunk}");
        }
        let mut c = HeaderCapture::default();
        c.see(b"PK\x03\x04junkjunkjunk");
        assert!(c.header(15).is_err());
        assert!(HeaderCapture::default().header(0).is_err());
    }
}
