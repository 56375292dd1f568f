//! The blocking client over `object_store`'s S3 store: one small runtime per [`Store`],
//! every call run to completion on it, every failure mapped to one [`S3Error`] naming
//! the object's URL and saying how it failed (missing, refused, unreachable).
//!
//! Invariants: each request has a connect timeout, a read timeout and an overall
//! timeout, and is retried a bounded number of times within a bounded time; nothing
//! here reads credentials from anywhere but the [`Config`] given; large uploads go in
//! parts, so no object is held whole in memory.

use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    Attribute, AttributeValue, Attributes, BackoffConfig, ClientOptions, GetOptions, GetRange,
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion,
    WriteMultipart,
};

use super::{Conditional, Config, ObjectInfo, S3Error, S3Url};

mod classify;
mod listing;
mod transfer;
use classify::classify;
pub use listing::{is_nameable, Listed};
pub use transfer::ObjectWriter;

/// How long establishing a connection may take (a server that is down fails at once on
/// loopback; elsewhere this bounds the wait for a SYN that is never answered).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest silence while reading a response before the request counts as failed.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a single request may take in all (one part of a multipart upload included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Retries of a failed request (server errors, dropped connections).
const MAX_RETRIES: usize = 3;
/// Past this time since the first attempt, a request is not retried again.
const RETRY_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause between retries; doubled each time, up to [`MAX_BACKOFF`].
const INIT_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Files at least this large are uploaded in parts.
pub const MULTIPART_THRESHOLD: u64 = 64 << 20;
/// The size of one part of a multipart upload.
pub const PART_BYTES: usize = 16 << 20;
/// Parts in flight at once during a multipart upload.
pub(crate) const PARTS_IN_FLIGHT: usize = 4;
/// Read buffer while uploading or downloading a file.
const IO_BUFFER_BYTES: usize = 4 << 20;
/// Worker threads of a store's runtime (requests in flight, not CPU work).
const RUNTIME_THREADS: usize = 4;

/// An object's bytes and its entity tag.
pub type Fetched = (Vec<u8>, Option<String>);

/// A connection to one bucket, with its own runtime; every method blocks.
#[derive(Debug)]
pub struct Store {
    bucket_url: S3Url,
    endpoint: String,
    store: Arc<AmazonS3>,
    /// The same store with no retries, for conditional puts (see [`Store::put_if`]).
    once: Arc<AmazonS3>,
    /// Listings, sent by tlio itself (see [`listing`]).
    lister: listing::Lister,
    runtime: tokio::runtime::Runtime,
}

/// The retry schedule of a listing: the one the store's other requests follow.
const LIST_RETRY: listing::Retry = listing::Retry {
    max_retries: MAX_RETRIES,
    retry_timeout: RETRY_TIMEOUT,
    init_backoff: INIT_BACKOFF,
    max_backoff: MAX_BACKOFF,
};

impl Store {
    /// A client for the bucket of `url` configured by `config`; no request is sent yet.
    pub fn connect(url: &S3Url, config: &Config) -> Result<Store, S3Error> {
        // rustls needs a process-wide provider for https; installing it twice is a
        // no-op error that says one is already there.
        // ring, not aws-lc-rs: no C toolchain beyond cc, a fraction of the build time;
        // it offers no post-quantum key exchange, which is why rustls deprecates it.
        #[allow(
            deprecated,
            reason = "ring keeps the s3 feature free of aws-lc; https still works, without post-quantum key exchange"
        )]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config_err = |reason: String| S3Error::Config {
            url: url.to_string(),
            reason,
        };
        let options = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_read_timeout(READ_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_allow_http(
                config
                    .endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://")),
            );
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: INIT_BACKOFF,
                max_backoff: MAX_BACKOFF,
                base: 2.0,
            },
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(url.bucket())
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_client_options(options)
            .with_retry(retry)
            .with_checksum_algorithm(object_store::aws::Checksum::SHA256);
        if let Some(token) = &config.session_token {
            builder = builder.with_token(token);
        }
        let endpoint = match &config.endpoint {
            Some(e) => {
                builder = builder
                    .with_endpoint(e)
                    .with_virtual_hosted_style_request(false);
                e.clone()
            }
            None => format!("https://s3.{}.amazonaws.com", config.region),
        };
        let store = builder
            .clone()
            .build()
            .map_err(|e| config_err(crate::failure::full_text(&e)))?;
        // A conditional put is not safe to repeat: object_store retries a request
        // whose reply was lost (a dropped connection, a 500) and the repeat then fails
        // its own condition, hiding that the first one was applied. Sent once; the
        // caller reads the object back to learn what happened.
        let once = builder
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| config_err(crate::failure::full_text(&e)))?;
        // A few worker threads: the parts of an upload go out while the caller
        // produces the next ones (a current-thread runtime would only send while the
        // caller waits).
        let timeouts = listing::Timeouts {
            connect: CONNECT_TIMEOUT,
            read: READ_TIMEOUT,
            request: REQUEST_TIMEOUT,
        };
        let lister =
            listing::Lister::new(config, &endpoint, url.bucket(), &timeouts).map_err(config_err)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("tlio-s3")
            .enable_all()
            .build()
            .map_err(|e| config_err(format!("cannot start the I/O runtime: {e}")))?;
        Ok(Store {
            bucket_url: S3Url::parse(&format!("{}{}", super::URL_SCHEME, url.bucket()))?,
            endpoint,
            store: Arc::new(store),
            once: Arc::new(once),
            lister,
            runtime,
        })
    }

    /// The URL of `key` in this bucket, for messages.
    fn url(&self, key: &str) -> String {
        if key.is_empty() {
            self.bucket_url.to_string()
        } else {
            format!("{}/{key}", self.bucket_url)
        }
    }

    fn key(&self, key: &str) -> Result<Key, S3Error> {
        Key::parse(key).map_err(|e| S3Error::BadUrl {
            url: self.url(key),
            reason: e.to_string(),
        })
    }

    /// Map an `object_store` error about `key` to one error naming it.
    fn fail(&self, key: &str, err: &object_store::Error) -> S3Error {
        let (kind, message) = classify(err, &self.endpoint, self.bucket_url.bucket());
        // A server's or the HTTP client's text may quote a request's URL.
        S3Error::request(self.url(key), kind, crate::text::redact(&message))
    }

    /// The whole object, at most `limit` bytes (a larger one is [`S3Error::TooLarge`]).
    pub fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            let got = self
                .store
                .get_opts(&path, GetOptions::default())
                .await
                .map_err(|e| self.fail(key, &e))?;
            if got.meta.size > limit {
                return Err(S3Error::TooLarge {
                    url: self.url(key),
                    size: got.meta.size,
                    limit,
                });
            }
            let bytes = got.bytes().await.map_err(|e| self.fail(key, &e))?;
            Ok(bytes.to_vec())
        })
    }

    /// The whole object and its entity tag, or `None` when it does not exist.
    pub fn get_if_exists(&self, key: &str, limit: u64) -> Result<Option<Fetched>, S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            let got = match self.store.get_opts(&path, GetOptions::default()).await {
                Ok(g) => g,
                Err(object_store::Error::NotFound { .. }) => {
                    return self.check_bucket(key).await.map(|()| None)
                }
                Err(e) => return Err(self.fail(key, &e)),
            };
            if got.meta.size > limit {
                return Err(S3Error::TooLarge {
                    url: self.url(key),
                    size: got.meta.size,
                    limit,
                });
            }
            let etag = got.meta.e_tag.clone();
            let bytes = got.bytes().await.map_err(|e| self.fail(key, &e))?;
            Ok(Some((bytes.to_vec(), etag)))
        })
    }

    /// A missing object in a missing bucket is the bucket's error, not the object's.
    async fn check_bucket(&self, key: &str) -> Result<(), S3Error> {
        let probe = self.lister.list("", true, Some(1), &LIST_RETRY, "").await;
        match probe {
            Ok(_) => Ok(()),
            Err(e) => Err(self.fail(key, &e)),
        }
    }

    /// Bytes `range` of the object (a range request).
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>, S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            let options = GetOptions {
                range: Some(GetRange::Bounded(range)),
                ..GetOptions::default()
            };
            let got = self
                .store
                .get_opts(&path, options)
                .await
                .map_err(|e| self.fail(key, &e))?;
            let bytes = got.bytes().await.map_err(|e| self.fail(key, &e))?;
            Ok(bytes.to_vec())
        })
    }

    /// The object's size and entity tag, or `None` when it does not exist (in a bucket
    /// that does).
    pub fn head(&self, key: &str) -> Result<Option<ObjectInfo>, S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            match self.store.head(&path).await {
                Ok(meta) => Ok(Some(info(meta))),
                Err(object_store::Error::NotFound { .. }) => {
                    self.check_bucket(key).await.map(|()| None)
                }
                Err(e) => Err(self.fail(key, &e)),
            }
        })
    }

    /// The user metadata value `name` of the object, with its size; `None` when the
    /// object does not exist.
    pub fn metadata(&self, key: &str, name: &str) -> Result<Option<Option<String>>, S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            let options = GetOptions {
                head: true,
                ..GetOptions::default()
            };
            match self.store.get_opts(&path, options).await {
                Ok(got) => Ok(Some(
                    got.attributes
                        .get(&Attribute::Metadata(name.to_string().into()))
                        .map(|v| v.as_ref().to_string()),
                )),
                Err(object_store::Error::NotFound { .. }) => {
                    self.check_bucket(key).await.map(|()| None)
                }
                Err(e) => Err(self.fail(key, &e)),
            }
        })
    }

    /// Write `data` to `key`, replacing whatever is there.
    pub fn put(&self, key: &str, data: Vec<u8>) -> Result<(), S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            self.store
                .put(&path, PutPayload::from(data))
                .await
                .map(|_| ())
                .map_err(|e| self.fail(key, &e))
        })
    }

    /// Write `data` to `key` only if the condition holds: `etag` `None` means the key
    /// must not exist (`If-None-Match: *`), `Some(tag)` that it still has that tag
    /// (`If-Match`). `metadata` is stored as user metadata (`x-amz-meta-*`).
    ///
    /// Sent exactly once, never retried: after an error the request may or may not
    /// have been applied, and only reading the object back tells (a retry would meet
    /// its own first attempt and report [`Conditional::Lost`]).
    pub fn put_if(
        &self,
        key: &str,
        data: Vec<u8>,
        etag: Option<&str>,
        metadata: &[(&str, &str)],
    ) -> Result<Conditional, S3Error> {
        let path = self.key(key)?;
        let mut attributes = Attributes::new();
        for (name, value) in metadata {
            attributes.insert(
                Attribute::Metadata(name.to_string().into()),
                AttributeValue::from(value.to_string()),
            );
        }
        let mode = match etag {
            None => PutMode::Create,
            Some(tag) => PutMode::Update(UpdateVersion {
                e_tag: Some(tag.to_string()),
                version: None,
            }),
        };
        let options = PutOptions {
            mode,
            attributes,
            ..PutOptions::default()
        };
        self.runtime.block_on(async {
            match self
                .once
                .put_opts(&path, PutPayload::from(data), options)
                .await
            {
                Ok(r) => Ok(Conditional::Written(r.e_tag)),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => Ok(Conditional::Lost),
                // An If-Match on an object that is gone: the condition failed too.
                Err(object_store::Error::NotFound { .. }) if etag.is_some() => {
                    Ok(Conditional::Lost)
                }
                Err(e) => Err(self.fail(key, &e)),
            }
        })
    }

    /// Upload the file at `path` to `key` (in parts when large), calling `seen` with
    /// each chunk as it is read (the caller hashes what is sent); returns its size.
    pub fn upload(
        &self,
        key: &str,
        path: &Path,
        seen: &mut dyn FnMut(&[u8]),
    ) -> Result<u64, S3Error> {
        let target = self.key(key)?;
        let local = |e: io::Error| {
            S3Error::request(self.url(key), e.kind(), format!("{}: {e}", path.display()))
        };
        let mut file = crate::files::open_regular(path).map_err(local)?;
        let size = file.metadata().map_err(local)?.len();
        if size < MULTIPART_THRESHOLD {
            let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            file.read_to_end(&mut data).map_err(local)?;
            seen(&data);
            let n = data.len() as u64;
            self.runtime.block_on(async {
                self.store
                    .put(&target, PutPayload::from(data))
                    .await
                    .map_err(|e| self.fail(key, &e))
            })?;
            return Ok(n);
        }
        self.runtime.block_on(async {
            let upload = self
                .store
                .put_multipart(&target)
                .await
                .map_err(|e| self.fail(key, &e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buf = vec![0u8; IO_BUFFER_BYTES];
            let mut total = 0u64;
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        writer.abort().await.ok();
                        return Err(local(e));
                    }
                };
                let chunk = buf.get(..n).ok_or_else(|| {
                    local(io::Error::other(
                        "a read reported more bytes than its buffer",
                    ))
                })?;
                seen(chunk);
                total = total.saturating_add(n as u64);
                if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    return Err(self.fail(key, &e));
                }
                writer.write(chunk);
            }
            writer.finish().await.map_err(|e| self.fail(key, &e))?;
            Ok(total)
        })
    }

    /// Download `key` into `out`, calling `seen` with each chunk; returns its size.
    pub fn download(
        &self,
        key: &str,
        out: &mut dyn Write,
        seen: &mut dyn FnMut(&[u8]),
    ) -> Result<u64, S3Error> {
        self.download_matching(key, None, out, seen)
    }

    /// [`Store::download`] of the version whose entity tag is `etag` (`If-Match`): an
    /// object replaced since its tag was read is an error, never a mix of versions.
    pub fn download_matching(
        &self,
        key: &str,
        etag: Option<&str>,
        out: &mut dyn Write,
        seen: &mut dyn FnMut(&[u8]),
    ) -> Result<u64, S3Error> {
        let path = self.key(key)?;
        let options = GetOptions {
            if_match: etag.map(str::to_string),
            ..GetOptions::default()
        };
        self.runtime.block_on(async {
            let got = match self.store.get_opts(&path, options).await {
                Ok(got) => got,
                Err(object_store::Error::Precondition { .. }) => {
                    return Err(S3Error::request(
                        self.url(key),
                        io::ErrorKind::Other,
                        format!(
                            "the object changed while it was being read (its entity tag is no longer {})",
                            etag.unwrap_or("")
                        ),
                    ))
                }
                Err(e) => return Err(self.fail(key, &e)),
            };
            let mut stream = got.into_stream();
            let mut total = 0u64;
            while let Some(chunk) = stream.try_next().await.map_err(|e| self.fail(key, &e))? {
                seen(&chunk);
                out.write_all(&chunk).map_err(|e| {
                    S3Error::request(self.url(key), e.kind(), format!("writing the copy: {e}"))
                })?;
                total = total.saturating_add(chunk.len() as u64);
            }
            Ok(total)
        })
    }

    /// Every object whose key starts with `prefix/` (all of the bucket for an empty
    /// prefix), in key order; keys no object-store path names are left out (see
    /// [`Store::list_all`]).
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, S3Error> {
        self.list_all(prefix).map(|l| l.objects)
    }

    /// [`Store::list`] with the keys it leaves out: those no object-store path names
    /// (an empty segment, `.` or `..`), which no request of this client can address,
    /// so no protocol owns them. Both in key order.
    pub fn list_all(&self, prefix: &str) -> Result<Listed, S3Error> {
        let below = self.below(prefix)?;
        self.runtime.block_on(async {
            let mut listed = self
                .lister
                .list(&below, false, None, &LIST_RETRY, prefix)
                .await
                .map_err(|e| self.fail(prefix, &e))?;
            listed.objects.sort_by(|a, b| a.key.cmp(&b.key));
            listed.foreign.sort();
            Ok(listed)
        })
    }

    /// The names one level below `prefix/`: the "directories" (common prefixes) and
    /// the objects, each as its last segment, sorted (names no object-store path
    /// names left out).
    pub fn list_dir(&self, prefix: &str) -> Result<(Vec<String>, Vec<ObjectInfo>), S3Error> {
        let below = self.below(prefix)?;
        self.runtime.block_on(async {
            let listed = self
                .lister
                .list(&below, true, None, &LIST_RETRY, prefix)
                .await
                .map_err(|e| self.fail(prefix, &e))?;
            let mut dirs: Vec<String> = listed
                .prefixes
                .iter()
                .filter_map(|p| p.rsplit('/').next().map(str::to_string))
                .collect();
            dirs.sort();
            let mut objects = listed.objects;
            objects.sort_by(|a, b| a.key.cmp(&b.key));
            Ok((dirs, objects))
        })
    }

    /// The listing prefix of `prefix`: `prefix/`, or empty for the whole bucket (the
    /// prefix itself must be a valid key).
    fn below(&self, prefix: &str) -> Result<String, S3Error> {
        Ok(match self.key_or_root(prefix)? {
            Some(key) => format!("{key}/"),
            None => String::new(),
        })
    }

    fn key_or_root(&self, prefix: &str) -> Result<Option<Key>, S3Error> {
        if prefix.is_empty() {
            Ok(None)
        } else {
            self.key(prefix).map(Some)
        }
    }

    /// Delete `key` (deleting a missing object is not an error).
    pub fn delete(&self, key: &str) -> Result<(), S3Error> {
        let path = self.key(key)?;
        self.runtime.block_on(async {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.fail(key, &e)),
            }
        })
    }
}

fn info(meta: object_store::ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        key: meta.location.to_string(),
        size: meta.size,
        etag: meta.e_tag,
        // Whole seconds are all S3 keeps; a time before 1970 is taken as 1970.
        last_modified: std::time::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(meta.last_modified.timestamp()).unwrap_or(0)),
    }
}
