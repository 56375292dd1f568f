//! `tokens pack --part K/N` and `tokens merge` with an `s3://` output: the parts of one
//! pack run on machines that share nothing but the bucket, and the merge publishes the
//! shards one `tokens pack -o s3://` of the same inputs would.
//!
//! Layout: part K of N of the output `s3://b/p/fw` lies under `s3://b/p/fw.parts/K-of-N/`
//! as `ids-<blake3>.bin` (its ids, named by their digest) and `complete.json` (its
//! marker, what a local part writes).
//!
//! Invariants:
//! - A part is packed exactly as locally, into a staging directory; then its ids are
//!   uploaded, then its marker is created with `If-None-Match: *`. So a marker exists
//!   only when the ids it names were uploaded whole, and a runner killed at any instant
//!   leaves a part that is either complete or redone from scratch by the next run.
//! - The ids are named by their digest, so two runners of one part (a retried task
//!   beside a slow one, a rerun) never replace each other's ids with other bytes: the
//!   same inputs give the same key and bytes, other inputs another key. Of two markers
//!   the first created stands; the later runner finds it and reports the part complete,
//!   or refuses when it was made with other inputs or options.
//! - The merge checks the markers as the local merge does (all N present, one identity,
//!   tiling the inputs), downloads each part's ids checking their size and blake3 as the
//!   bytes arrive, merges them in a staging directory with the local merge, and
//!   publishes the shards as a pack to storage does: the shards, then the manifest,
//!   last, never replacing an object. Every error names the URL.

use std::path::Path;

#[cfg(not(feature = "s3"))]
use super::not_built;
use super::pack::Published;
#[cfg(feature = "s3")]
use super::pack::{output_parent, publish_with, staging};
use super::RemoteError;
use crate::s3::{is_s3_url, S3Url};
use crate::tokens::parts::{part_area, MergeSummary, PartJob, PartOutcome};
use crate::tokens::{merge_parts, pack_part, TextPackProgress};

/// Pack part `job.part` of a pack whose output is `job.out`: beside a local output as
/// [`pack_part`] does, or into the part area of an `s3://` output (see the module doc).
/// Returns what was done and where the part lies (its directory, or its prefix's URL).
pub fn pack_part_at(
    job: &PartJob<'_>,
    progress: &mut dyn FnMut(&TextPackProgress),
) -> Result<(PartOutcome, String), RemoteError> {
    match job.out.to_str() {
        Some(text) if is_s3_url(text) => storage::pack_part(&S3Url::parse(text)?, job, progress),
        _ => {
            let outcome = pack_part(job, progress)?;
            let dir = part_area(job.out).join(job.part.dir_name());
            Ok((outcome, dir.display().to_string()))
        }
    }
}

/// Merge the parts of `out` into its final shards: locally as [`merge_parts`] does, or,
/// for an `s3://` output, from its part area in storage into shards published beside
/// it with their manifest (the parts' digests are always checked then: they come with
/// the download). The summary's shard paths are the local ones or the staging copies;
/// the published names are in the second value.
pub fn merge_at(
    out: &Path,
    verify: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<(MergeSummary, Published), RemoteError> {
    match out.to_str() {
        Some(text) if is_s3_url(text) => storage::merge(&S3Url::parse(text)?, progress),
        _ => {
            let summary = merge_parts(out, verify, progress)?;
            let published = Published {
                shards: summary
                    .shards
                    .iter()
                    .map(|(p, h)| (p.display().to_string(), *h))
                    .collect(),
                manifest: None,
                already_complete: false,
            };
            Ok((summary, published))
        }
    }
}

#[cfg(not(feature = "s3"))]
mod storage {
    use super::*;

    pub(super) fn pack_part(
        url: &S3Url,
        _job: &PartJob<'_>,
        _progress: &mut dyn FnMut(&TextPackProgress),
    ) -> Result<(PartOutcome, String), RemoteError> {
        Err(not_built(url))
    }

    pub(super) fn merge(
        url: &S3Url,
        _progress: &mut dyn FnMut(u64),
    ) -> Result<(MergeSummary, Published), RemoteError> {
        Err(not_built(url))
    }
}

#[cfg(feature = "s3")]
mod storage {
    use std::fs;
    use std::io::{self, BufWriter, Write};
    use std::path::PathBuf;

    use super::*;
    use crate::remote::create::{put_once, Outcome};
    use crate::s3::{S3Error, Store};
    use crate::tokens::parts::{
        check_counts, check_ids_digest, check_ids_size, check_made_with, check_parts_total,
        check_tiling, missing_parts, parse_dir_name, parse_marker, PartMarker, PartsError,
        AREA_SUFFIX, DOCS_FILE, IDS_FILE, MARKER_FILE, MAX_MARKER_BYTES,
    };

    /// A URL as the path an error of the part rules names.
    fn url_path(url: &S3Url) -> PathBuf {
        PathBuf::from(url.to_string())
    }

    /// The part area of the output `url`: `url` + `.parts`.
    fn area_of(url: &S3Url) -> Result<S3Url, RemoteError> {
        output_parent(url)?;
        Ok(url.with_key(&format!("{}{AREA_SUFFIX}", url.key()))?)
    }

    /// The object holding the ids `marker` names, in the part prefix `part`.
    fn ids_url(part: &S3Url, marker: &PartMarker) -> Result<S3Url, RemoteError> {
        Ok(part.join(&format!("ids-{}.bin", marker.blake3))?)
    }

    /// The object holding the document starts of the part `marker` names (beside its
    /// ids, named by the same digest: they are a function of the same inputs).
    fn docs_url(part: &S3Url, marker: &PartMarker) -> Result<S3Url, RemoteError> {
        Ok(part.join(&format!("docs-{}.bin", marker.blake3))?)
    }

    /// The part counts N of the `K-of-N` prefixes in `area`, in the order of K.
    fn counts_in(store: &Store, area: &S3Url) -> Result<Vec<usize>, RemoteError> {
        let (dirs, _) = store.list_dir(area.key())?;
        let mut found: Vec<(usize, usize)> =
            dirs.iter().filter_map(|d| parse_dir_name(d)).collect();
        found.sort_unstable();
        Ok(found.into_iter().map(|(_, n)| n).collect())
    }

    /// The marker of the part prefix `part`, if it has one.
    fn marker_of(store: &Store, part: &S3Url) -> Result<Option<PartMarker>, RemoteError> {
        let url = part.join(MARKER_FILE)?;
        match store.get_if_exists(url.key(), MAX_MARKER_BYTES)? {
            Some((bytes, _)) => Ok(Some(parse_marker(&bytes, url_path(&url))?)),
            None => Ok(None),
        }
    }

    pub(super) fn pack_part(
        url: &S3Url,
        job: &PartJob<'_>,
        progress: &mut dyn FnMut(&TextPackProgress),
    ) -> Result<(PartOutcome, String), RemoteError> {
        let area = area_of(url)?;
        let part = area.join(&job.part.dir_name())?;
        let marker_url = part.join(MARKER_FILE)?;
        let stage = staging(url, "tlio-part-")?;
        let staged_out = stage.path().join(url.name());
        let staged = PartJob {
            out: &staged_out,
            inputs: job.inputs,
            part: job.part,
            source: job.source.clone(),
        };
        // The inputs and options first: a bad flag never reaches the network.
        let (_, identity) = staged.checked_identity()?;
        let store = crate::s3::connect(url)?;
        check_counts(&url_path(&area), &counts_in(&store, &area)?, job.part.count)?;
        if let Some(marker) = marker_of(&store, &part)? {
            check_made_with(&url_path(&part), &marker, &identity)?;
            let ids = ids_url(&part, &marker)?;
            if store.head(ids.key())?.map(|i| i.size) == Some(marker.bytes) {
                return Ok((PartOutcome::AlreadyComplete(marker), part.to_string()));
            }
            // The ids it names are gone or cut short: the part is redone, as a local
            // marker without its ids is.
            store.delete(marker_url.key())?;
        }
        let marker = match crate::tokens::pack_part(&staged, progress)? {
            PartOutcome::Packed(m) | PartOutcome::AlreadyComplete(m) => m,
        };
        let dir = part_area(&staged_out).join(job.part.dir_name());
        let ids = ids_url(&part, &marker)?;
        store.upload(ids.key(), &dir.join(IDS_FILE), &mut |_| {})?;
        if marker.doc_starts.is_some() {
            let docs = docs_url(&part, &marker)?;
            store.upload(docs.key(), &dir.join(DOCS_FILE), &mut |_| {})?;
        }
        let marker_path = dir.join(MARKER_FILE);
        let text = fs::read(&marker_path).map_err(|source| RemoteError::Cache {
            url: marker_url.to_string(),
            path: marker_path,
            source,
        })?;
        // The ids are in storage under their final key; a crash test stops here (the
        // part must then count as incomplete, and a rerun redo it); `return` is a crash.
        fail::fail_point!("tokens/part-commit", |_| std::process::abort());
        // Sent once, settled by reading the marker back: a lost reply is not another
        // runner, and a marker with this runner's bytes is this commit.
        let mine = |bytes: &[u8]| bytes == text.as_slice();
        let url_text = marker_url.to_string();
        let outcome = put_once(
            &store,
            &url_text,
            marker_url.key(),
            &text,
            None,
            MAX_MARKER_BYTES,
            &mine,
        )?;
        match outcome {
            Outcome::Ours => Ok((PartOutcome::Packed(marker), part.to_string())),
            Outcome::Theirs(bytes, _) => {
                // Another runner of this part committed first: its part stands.
                let theirs = parse_marker(&bytes, url_path(&marker_url))?;
                check_made_with(&url_path(&part), &theirs, &identity)?;
                Ok((PartOutcome::AlreadyComplete(theirs), part.to_string()))
            }
            Outcome::Gone => Err(S3Error::request(
                marker_url.to_string(),
                io::ErrorKind::Other,
                "a create of the marker was answered as a replace of a removed one".to_string(),
            )
            .into()),
        }
    }

    pub(super) fn merge(
        url: &S3Url,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(MergeSummary, Published), RemoteError> {
        let area = area_of(url)?;
        let area_path = url_path(&area);
        let store = crate::s3::connect(url)?;
        let counts = counts_in(&store, &area)?;
        let Some(&count) = counts.first() else {
            return Err(PartsError::NoParts { area: area_path }.into());
        };
        check_counts(&area_path, &counts, count)?;
        let mut parts = Vec::with_capacity(count);
        let mut missing = Vec::new();
        for k in 0..count {
            let name = format!("{k}-of-{count}");
            let part = area.join(&name)?;
            match marker_of(&store, &part)? {
                Some(marker) => parts.push((url_path(&part), marker)),
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            return Err(missing_parts(&area_path, &missing, count).into());
        }
        check_tiling(&area_path, &parts)?;
        // Before any download: a merge that would write no training shard is refused
        // from the markers alone.
        if let Some((_, first)) = parts.first() {
            check_parts_total(&first.identity.plan(&url_path(url))?, &parts)?;
        }
        publish_with(url, |staged_out| {
            let staged_area = part_area(staged_out);
            for (k, (_, marker)) in parts.iter().enumerate() {
                let name = format!("{k}-of-{count}");
                let part = area.join(&name)?;
                fetch_part(&store, &part, marker, &staged_area.join(&name), progress)?;
            }
            // Checked as they arrived: the local merge need not read them twice.
            let merged = merge_parts(staged_out, false, progress)?;
            Ok((merged.shards.clone(), merged))
        })
        .map(|(published, summary)| (summary, published))
    }

    /// Download part `part` (its `marker` read already) into the local part directory
    /// `dir`: its ids, checked against the marker's size and blake3 as they arrive, then
    /// the marker.
    fn fetch_part(
        store: &Store,
        part: &S3Url,
        marker: &PartMarker,
        dir: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), RemoteError> {
        let ids = ids_url(part, marker)?;
        let local = |path: &Path| {
            let path = path.to_path_buf();
            let url = ids.to_string();
            move |source| RemoteError::Cache { url, path, source }
        };
        crate::files::create_dir_all(dir).map_err(local(dir))?;
        let ids_path = dir.join(IDS_FILE);
        let file = fs::File::create(&ids_path).map_err(local(&ids_path))?;
        let mut out = BufWriter::new(file);
        let mut hasher = blake3::Hasher::new();
        let got = store.download(ids.key(), &mut out, &mut |chunk| {
            hasher.update(chunk);
            progress(chunk.len() as u64);
        })?;
        out.flush().map_err(local(&ids_path))?;
        check_ids_size(&url_path(&ids), marker, got)?;
        check_ids_digest(&url_path(&ids), marker, &hasher.finalize().to_hex())?;
        if marker.doc_starts.is_some() {
            // Its size is checked against the marker by the merge.
            let docs = docs_url(part, marker)?;
            let docs_path = dir.join(DOCS_FILE);
            let file = fs::File::create(&docs_path).map_err(local(&docs_path))?;
            let mut out = BufWriter::new(file);
            store.download(docs.key(), &mut out, &mut |_| {})?;
            out.flush().map_err(local(&docs_path))?;
        }
        let marker_url = part.join(MARKER_FILE)?;
        let mut text = serde_json::to_vec_pretty(marker).map_err(|e| PartsError::BadMarker {
            path: url_path(&marker_url),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        let marker_path = dir.join(MARKER_FILE);
        fs::write(&marker_path, text).map_err(local(&marker_path))?;
        Ok(())
    }
}
