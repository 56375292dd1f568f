//! The formats of tlio read from and written to object storage (scale.md section 3):
//! a safetensors header or a token shard's header by range requests, and checkpoints
//! committed without rename (`checkpoint`). Every format rule is the local one, called
//! on the bytes fetched; only the storage differs.
//!
//! Invariants: a header is read with range requests only (the object's size from a
//! HEAD, then the 8-byte prefix and the `N` header bytes, or a shard's 1024 bytes),
//! never the whole object; a shard the stream reads is fetched whole, once, into a
//! verified local cache (`shards`); `st verify` streams data through a fixed buffer
//! (`verify`); a pack's shards are uploaded, then its manifest last (`pack`); every
//! error names the URL.

use std::path::{Path, PathBuf};

#[cfg(feature = "s3")]
mod cache;
#[cfg(feature = "s3")]
pub mod checkpoint;
#[cfg(feature = "s3")]
pub mod create;
#[cfg(feature = "s3")]
pub(crate) mod header;
pub mod location;
pub mod mixture;
pub mod pack;
pub mod parts;
pub mod shards;
pub mod verify;

pub use mixture::{open_mixture, NamedSource};
pub use shards::{absolute_source, open_shards, open_stream, read_shard_header};

use crate::failure::{Failure, FailureKind};
use crate::model::{Model, ModelError};
use crate::s3::{S3Error, S3Url};
#[cfg(feature = "s3")]
use crate::safetensors::header::N_LEN;
use crate::safetensors::{Header, SafetensorsError};
#[cfg(feature = "s3")]
use crate::tokens::HEADER_BYTES;
use crate::tokens::{HeaderReport, PartsError, TokensError};

/// Errors of reading tlio's formats from object storage.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Reaching the object failed (or the URL is malformed).
    #[error(transparent)]
    S3(#[from] S3Error),
    /// The object's safetensors header breaks a reader rule.
    #[error("{url}")]
    Safetensors {
        /// The object.
        url: String,
        /// The rule broken (boxed: the error of every remote read stays small).
        source: Box<SafetensorsError>,
    },
    /// The model (one safetensors object) breaks a rule.
    #[error("{url}")]
    Model {
        /// The object.
        url: String,
        /// The rule broken (boxed: the error of every remote read stays small).
        source: Box<ModelError>,
    },
    /// The token shard breaks a rule (the error names the URL as its path).
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// A part of a pack to storage, or their merge, breaks a rule (the error names the
    /// URL as its path).
    #[error(transparent)]
    Parts(#[from] PartsError),
    /// The local cache of an object could not be written or read.
    #[error("{url}: local cache {}", path.display())]
    Cache {
        /// The object.
        url: String,
        /// The cache file or directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

impl Failure for RemoteError {
    fn kind(&self) -> FailureKind {
        match self {
            RemoteError::S3(e) => e.kind(),
            RemoteError::Safetensors { source, .. } => source.kind(),
            RemoteError::Model { source, .. } => source.kind(),
            RemoteError::Tokens(e) => e.kind(),
            RemoteError::Parts(e) => e.kind(),
            RemoteError::Cache { .. } => FailureKind::Operational,
        }
    }
}

/// The size of the object at `url`; a missing object is a `NotFound` error.
#[cfg(feature = "s3")]
fn object_size(store: &crate::s3::Store, url: &S3Url) -> Result<u64, S3Error> {
    match store.head(url.key())? {
        Some(info) => Ok(info.size),
        None => Err(S3Error::request(
            url.to_string(),
            std::io::ErrorKind::NotFound,
            "no such object".to_string(),
        )),
    }
}

/// The validated header of the safetensors object at `url` and the object's size,
/// read with two range requests (the prefix, then the header).
#[cfg(feature = "s3")]
pub fn safetensors_header(url: &S3Url) -> Result<(Header, u64), RemoteError> {
    let store = crate::s3::connect(url)?;
    let (header, size, _) = header_of(&store, url)?;
    Ok((header, size))
}

/// [`safetensors_header`] through `store`, with the raw bytes it was parsed from (the
/// 8-byte prefix and the header text).
#[cfg(feature = "s3")]
fn header_of(store: &crate::s3::Store, url: &S3Url) -> Result<(Header, u64, Vec<u8>), RemoteError> {
    let size = object_size(store, url)?;
    // The prefix, then the header: two requests, never more bytes than the header.
    let read = header::read_header(store, url.key(), &url.to_string(), size, N_LEN).map_err(
        |failure| match failure {
            header::HeaderFailure::Remote(e) => RemoteError::S3(e),
            header::HeaderFailure::Invalid(source) => RemoteError::Safetensors {
                url: url.to_string(),
                source: Box::new(source),
            },
        },
    )?;
    Ok((read.header, size, read.raw))
}

/// Without the `s3` feature an object cannot be reached.
#[cfg(not(feature = "s3"))]
pub fn safetensors_header(url: &S3Url) -> Result<(Header, u64), RemoteError> {
    Err(not_built(url))
}

#[cfg(not(feature = "s3"))]
fn not_built(url: &S3Url) -> RemoteError {
    RemoteError::S3(S3Error::NotBuilt {
        url: url.to_string(),
    })
}

/// A server that answered a range request with another number of bytes.
#[cfg(feature = "s3")]
fn short_read(url: &S3Url, expected: u64, got: usize) -> S3Error {
    header::short_read(&url.to_string(), expected, got)
}

/// The safetensors object at `url` as a one-file [`Model`] (what `st inspect` shows),
/// from its header alone; or the model directory (a prefix) or index it names, from
/// its JSON files and its shards' headers. The model's paths are URLs.
pub fn open_model(url: &S3Url) -> Result<Model, RemoteError> {
    let invalid = |source| RemoteError::Model {
        url: url.to_string(),
        source: Box::new(source),
    };
    if url.key().ends_with(".safetensors") {
        let (header, _) = safetensors_header(url)?;
        return Model::from_header(&url_path(url), header).map_err(invalid);
    }
    open_model_files(url).map_err(|e| match e {
        RemoteError::Model { source, .. } => invalid(*source),
        e => e,
    })
}

/// [`open_model`] of anything but a `.safetensors` object, through [`RemoteFiles`].
#[cfg(feature = "s3")]
fn open_model_files(url: &S3Url) -> Result<Model, RemoteError> {
    let store = crate::s3::connect(url)?;
    let files = RemoteFiles { store: &store };
    let invalid = |source| RemoteError::Model {
        url: url.to_string(),
        source: Box::new(source),
    };
    let (model, problems) = Model::scan_with(&url_path(url), &files).map_err(invalid)?;
    Model::first_problem(model, problems).map_err(invalid)
}

#[cfg(not(feature = "s3"))]
fn open_model_files(url: &S3Url) -> Result<Model, RemoteError> {
    Err(not_built(url))
}

/// A model's files in storage, for [`Model::scan_with`]: existence and sizes by HEAD
/// (a directory is a prefix with objects under it), JSON files by one bounded GET,
/// headers by range requests. Its paths are URLs, as [`url_path`] makes them, so every
/// finding and error names the object.
#[cfg(feature = "s3")]
pub(crate) struct RemoteFiles<'a> {
    pub(crate) store: &'a crate::s3::Store,
}

/// The URL a path of [`url_path`] holds.
#[cfg(feature = "s3")]
pub(crate) fn path_url(path: &Path) -> Result<S3Url, RemoteError> {
    let text = path.to_str().ok_or_else(|| S3Error::BadUrl {
        url: path.display().to_string(),
        reason: "not UTF-8".to_string(),
    })?;
    Ok(S3Url::parse(text)?)
}

/// A request failure as the I/O error a local read of the same file gives (its kind
/// kept: `NotFound` for a missing object).
#[cfg(feature = "s3")]
fn io_error(e: RemoteError) -> std::io::Error {
    match e {
        RemoteError::S3(S3Error::Request { source, .. }) => source,
        e => std::io::Error::other(crate::failure::full_text(&e)),
    }
}

#[cfg(feature = "s3")]
impl crate::model::files::ModelFiles for RemoteFiles<'_> {
    fn is_dir(&self, path: &Path) -> std::io::Result<bool> {
        let url = path_url(path).map_err(io_error)?;
        let found = |e: S3Error| io_error(e.into());
        if self.store.head(url.key()).map_err(found)?.is_some() {
            return Ok(false);
        }
        let (dirs, objects) = self.store.list_dir(url.key()).map_err(found)?;
        if dirs.is_empty() && objects.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such object, and no object under it",
            ));
        }
        Ok(true)
    }

    fn exists(&self, path: &Path) -> bool {
        path_url(path)
            .ok()
            .and_then(|u| self.store.head(u.key()).ok().flatten())
            .is_some()
    }

    fn size(&self, path: &Path) -> std::io::Result<u64> {
        let url = path_url(path).map_err(io_error)?;
        match self.store.head(url.key()).map_err(|e| io_error(e.into()))? {
            Some(info) => Ok(info.size),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such object",
            )),
        }
    }

    fn read_limited(&self, path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
        let url = path_url(path).map_err(io_error)?;
        self.store
            .get(url.key(), limit)
            .map_err(|e| io_error(e.into()))
    }

    fn read_header(&self, path: &Path) -> Result<Header, SafetensorsError> {
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let url = path_url(path).map_err(|e| io(io_error(e)))?;
        match header_of(self.store, &url) {
            Ok((header, _, _)) => Ok(header),
            Err(RemoteError::Safetensors { source, .. }) => Err(*source),
            Err(e) => Err(io(io_error(e))),
        }
    }
}

/// The safetensors object at `url` (or the model directory or index it names) mapped
/// whole, for readers of every tensor (`st inspect --stats`): the model is checked
/// from its headers and JSON files first (a broken rule names the URL), then its files
/// are downloaded once into a scratch directory under the system's temporary
/// directory, under their own names, and mapped there. The scratch copies are
/// unlinked before this returns (the mappings keep their pages), so nothing is left
/// behind whatever happens next; the model's path is the URL.
#[cfg(feature = "s3")]
pub fn map_model(url: &S3Url) -> Result<crate::model::view::ModelView, RemoteError> {
    use crate::model::{Kind, CONFIG_NAME, TOKENIZER_NAME};
    let remote = open_model(url)?;
    let scratch = tempfile::Builder::new()
        .prefix("tlio-object-")
        .tempdir()
        .map_err(|e| {
            S3Error::request(
                url.to_string(),
                e.kind(),
                format!("cannot make a scratch directory for a copy: {e}"),
            )
        })?;
    let fetch = |from: &Path| -> Result<PathBuf, RemoteError> {
        let from = path_url(from)?;
        let to = scratch.path().join(from.name());
        download(&from, &to)?;
        Ok(to)
    };
    let local = match remote.kind {
        Kind::File => fetch(&url_path(url))?,
        Kind::Index | Kind::Directory => {
            let index = remote.index_path.as_deref().map(fetch).transpose()?;
            for shard in &remote.shards {
                fetch(&shard.path)?;
            }
            // What the directory's rules read beside the tensors, when it is there.
            if let Some(dir) = &remote.dir {
                let store = crate::s3::connect(url)?;
                for name in [CONFIG_NAME, TOKENIZER_NAME] {
                    let path = dir.join(name);
                    if store.head(path_url(&path)?.key())?.is_some() {
                        fetch(&path)?;
                    }
                }
            }
            match (remote.kind, index) {
                (Kind::Index, Some(index)) => index,
                _ => scratch.path().to_path_buf(),
            }
        }
    };
    let invalid = |source| RemoteError::Model {
        url: url.to_string(),
        source: Box::new(source),
    };
    let mut model = Model::open(&local).map_err(invalid)?;
    model.path = url_path(url);
    crate::model::view::ModelView::map(model).map_err(invalid)
}

/// Without the `s3` feature an object cannot be reached.
#[cfg(not(feature = "s3"))]
pub fn map_model(url: &S3Url) -> Result<crate::model::view::ModelView, RemoteError> {
    Err(not_built(url))
}

/// A URL as the path a local report names (core's reports name files by path).
pub fn url_path(url: &S3Url) -> PathBuf {
    PathBuf::from(url.to_string())
}

/// What `tokens header` shows of the shard object at `url`, from one range request
/// of its first 1024 bytes (fewer when the object is shorter).
#[cfg(feature = "s3")]
pub fn shard_header(url: &S3Url) -> Result<HeaderReport, RemoteError> {
    let store = crate::s3::connect(url)?;
    let size = object_size(&store, url)?;
    let want = size.min(HEADER_BYTES as u64);
    let got = if want == 0 {
        Vec::new()
    } else {
        store.get_range(url.key(), 0..want)?
    };
    if got.len() as u64 != want {
        return Err(short_read(url, want, got.len()).into());
    }
    let mut buf = [0u8; HEADER_BYTES];
    for (b, g) in buf.iter_mut().zip(&got) {
        *b = *g;
    }
    Ok(crate::tokens::report_from_bytes(
        Path::new(&url.to_string()),
        &buf,
        got.len(),
        size,
    ))
}

/// Without the `s3` feature an object cannot be reached.
#[cfg(not(feature = "s3"))]
pub fn shard_header(url: &S3Url) -> Result<HeaderReport, RemoteError> {
    Err(not_built(url))
}

/// Download the object at `url` into the file `dest` (created or truncated); returns
/// its size. For readers that need the whole object ([`map_model`]).
#[cfg(feature = "s3")]
pub fn download(url: &S3Url, dest: &Path) -> Result<u64, RemoteError> {
    let store = crate::s3::connect(url)?;
    let mut file = std::fs::File::create(dest).map_err(|e| {
        S3Error::request(
            url.to_string(),
            e.kind(),
            format!("{}: {e}", dest.display()),
        )
    })?;
    Ok(store.download(url.key(), &mut file, &mut |_| {})?)
}

/// Without the `s3` feature an object cannot be reached.
#[cfg(not(feature = "s3"))]
pub fn download(url: &S3Url, _dest: &Path) -> Result<u64, RemoteError> {
    Err(not_built(url))
}
