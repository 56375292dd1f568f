//! tlio's own listing request: a ListObjectsV2 signed with `object_store`'s SigV4 signer
//! and sent with the same timeouts and bounded retries as every other request, whose
//! reply is read key by key, so that one key `object_store`'s paths cannot name
//! (`run//notes.txt`, `run/./x`) is set aside as foreign instead of failing the whole
//! listing (which `object_store`'s own listing does).
//!
//! Invariants: every page is one request with a connect, read and overall timeout,
//! retried at most [`super::MAX_RETRIES`] times within [`super::RETRY_TIMEOUT`]; a page's
//! reply is read into at most [`MAX_PAGE_BYTES`]; a listing has at most
//! [`MAX_PAGES`] pages and stops on a repeated continuation token; a failure is an
//! `object_store` error of the kind `object_store` itself gives for the same status,
//! so one classifier names every failure; the signing key never appears in an error.

use std::fmt;
use std::time::{Duration, Instant};

use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;
use object_store::path::Path as Key;

use super::{Config, ObjectInfo};

/// The most bytes one page's reply may hold (1000 keys of the longest 1024 bytes, with
/// their XML, are far less).
const MAX_PAGE_BYTES: usize = 16 << 20;
/// The most pages one listing follows (a thousand keys each): past this a server that
/// keeps answering "more" is an error, never an endless loop.
const MAX_PAGES: usize = 100_000;
/// How `object_store` names the store in its errors.
const STORE: &str = "S3";
/// The signing scope's service.
const SERVICE: &str = "s3";
/// The bytes a query value keeps unencoded (RFC 3986's unreserved characters).
const UNRESERVED: &[u8] = b"-_.~";

/// What a listing found below a prefix.
#[derive(Debug, Default)]
pub struct Listed {
    /// The objects whose keys are valid object-store paths, in the server's order.
    pub objects: Vec<ObjectInfo>,
    /// The common prefixes (with a delimiter), without their trailing `/`, that are
    /// valid paths.
    pub prefixes: Vec<String>,
    /// Keys and common prefixes no valid path names (an empty segment, `.` or `..`,
    /// a trailing `/`): not the protocol's, never read or deleted, only named.
    pub foreign: Vec<String>,
}

/// True when `key` is exactly the text of a valid object-store path (so every other
/// request of this client can address it).
pub fn is_nameable(key: &str) -> bool {
    Key::parse(key).is_ok_and(|p| p.as_ref() == key)
}

/// One failed listing request, as the source of the `object_store` error it becomes.
#[derive(Debug)]
enum Failure {
    /// The server answered with a status other than 2xx.
    Status(reqwest::StatusCode, String),
    /// No answer: the connection failed, timed out or closed early.
    Transport(reqwest::Error),
    /// An answer that is not a listing.
    Reply(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The words `object_store` uses, which the classifier strips.
            Failure::Status(status, body) => {
                write!(f, "Server returned non-2xx status code: {status}: {body}")
            }
            Failure::Transport(e) => write!(f, "{e}"),
            Failure::Reply(why) => write!(f, "invalid listing reply: {why}"),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Failure::Transport(e) => Some(e),
            _ => None,
        }
    }
}

impl Failure {
    /// A dropped connection, a timeout, a server error or a throttle is worth another
    /// try (a listing is safe to repeat); a refusal or a malformed reply is not.
    fn retryable(&self) -> bool {
        match self {
            Failure::Transport(_) => true,
            Failure::Status(s, _) => s.is_server_error() || s.as_u16() == 429,
            Failure::Reply(_) => false,
        }
    }

    /// The `object_store` error of the same meaning, about `path`.
    fn into_store_error(self, path: &str) -> object_store::Error {
        let path = path.to_string();
        match &self {
            Failure::Status(s, _) if s.as_u16() == 401 => object_store::Error::Unauthenticated {
                path,
                source: Box::new(self),
            },
            Failure::Status(s, _) if s.as_u16() == 403 => object_store::Error::PermissionDenied {
                path,
                source: Box::new(self),
            },
            _ => object_store::Error::Generic {
                store: STORE,
                source: Box::new(self),
            },
        }
    }
}

/// One page of a ListObjectsV2 reply (the fields tlio reads).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    contents: Vec<Contents>,
    #[serde(default)]
    common_prefixes: Vec<CommonPrefix>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_continuation_token: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Contents {
    key: String,
    size: u64,
    last_modified: chrono::DateTime<chrono::Utc>,
    #[serde(rename = "ETag", default)]
    e_tag: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefix {
    prefix: String,
}

/// The HTTP client and signing material of one bucket's listings.
#[derive(Debug)]
pub struct Lister {
    client: reqwest::Client,
    /// `endpoint/bucket` (path-style, as the store's other requests).
    bucket_endpoint: String,
    credential: AwsCredential,
    region: String,
}

/// The retry schedule, shared with the store's other requests.
pub struct Retry {
    /// Retries after the first attempt.
    pub max_retries: usize,
    /// No retry starts past this time since the first attempt.
    pub retry_timeout: Duration,
    /// The first pause (doubled each time).
    pub init_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
}

/// The timeouts of each request.
pub struct Timeouts {
    /// Establishing the connection.
    pub connect: Duration,
    /// The longest silence while reading.
    pub read: Duration,
    /// The whole request.
    pub request: Duration,
}

impl Lister {
    /// A lister for `bucket` at `endpoint` (`scheme://host[:port]`) with `config`'s
    /// credentials.
    pub fn new(
        config: &Config,
        endpoint: &str,
        bucket: &str,
        timeouts: &Timeouts,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read)
            .timeout(timeouts.request)
            // A listing is answered where it was sent; a redirect would carry the
            // signature to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Lister {
            client,
            bucket_endpoint: format!("{}/{bucket}", endpoint.trim_end_matches('/')),
            credential: AwsCredential {
                key_id: config.access_key_id.clone(),
                secret_key: config.secret_access_key.clone(),
                token: config.session_token.clone(),
            },
            region: config.region.clone(),
        })
    }

    /// Every key below `prefix` (which ends in `/`, or is empty for the whole bucket),
    /// one level only with `delimiter`; `max_keys` asks for one small page only (a
    /// probe). `path` names the listing in errors.
    pub async fn list(
        &self,
        prefix: &str,
        delimiter: bool,
        max_keys: Option<usize>,
        retry: &Retry,
        path: &str,
    ) -> Result<Listed, object_store::Error> {
        let mut listed = Listed::default();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query: Vec<(&str, String)> = Vec::new();
            if let Some(t) = &token {
                query.push(("continuation-token", t.clone()));
            }
            if delimiter {
                query.push(("delimiter", "/".to_string()));
            }
            query.push(("list-type", "2".to_string()));
            if let Some(n) = max_keys {
                query.push(("max-keys", n.to_string()));
            }
            if !prefix.is_empty() {
                query.push(("prefix", prefix.to_string()));
            }
            let page = self
                .page_retried(&query, retry)
                .await
                .map_err(|f| f.into_store_error(path))?;
            sort_page(&mut listed, page.contents, page.common_prefixes);
            let next = page.next_continuation_token.filter(|_| page.is_truncated);
            match next {
                Some(t) if max_keys.is_none() => {
                    if token.as_deref() == Some(t.as_str()) {
                        return Err(Failure::Reply(
                            "the server repeated its continuation token".to_string(),
                        )
                        .into_store_error(path));
                    }
                    token = Some(t);
                }
                _ => return Ok(listed),
            }
        }
        Err(Failure::Reply(format!("more than {MAX_PAGES} pages of keys")).into_store_error(path))
    }

    /// One page, retried on failures worth another try.
    async fn page_retried(&self, query: &[(&str, String)], retry: &Retry) -> Result<Page, Failure> {
        let start = Instant::now();
        let mut backoff = retry.init_backoff;
        let mut tries = 0usize;
        loop {
            match self.page(query).await {
                Ok(page) => return Ok(page),
                Err(f)
                    if f.retryable()
                        && tries < retry.max_retries
                        && start.elapsed() < retry.retry_timeout =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2).min(retry.max_backoff);
                    tries = tries.saturating_add(1);
                }
                Err(f) => return Err(f),
            }
        }
    }

    /// One signed request for one page.
    async fn page(&self, query: &[(&str, String)]) -> Result<Page, Failure> {
        let text: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let url = format!("{}?{}", self.bucket_endpoint, text.join("&"));
        let mut request = http::Request::builder()
            .method(http::Method::GET)
            .uri(&url)
            .body(HttpRequestBody::empty())
            .map_err(|e| Failure::Reply(format!("cannot form the request: {e}")))?;
        AwsAuthorizer::new(&self.credential, SERVICE, &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| Failure::Reply(format!("cannot sign the request: {e}")))?;
        let mut send = self.client.get(&url);
        for (name, value) in request.headers() {
            send = send.header(name, value);
        }
        let mut response = send.send().await.map_err(Failure::Transport)?;
        let status = response.status();
        let mut body: Vec<u8> = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(Failure::Transport)? {
            if body.len().saturating_add(chunk.len()) > MAX_PAGE_BYTES {
                return Err(Failure::Reply(format!(
                    "a page of more than {MAX_PAGE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(Failure::Status(status, body));
        }
        quick_xml::de::from_str(&body).map_err(|e| Failure::Reply(e.to_string()))
    }
}

/// Add one page's objects and prefixes to `listed`, keys no path names set aside.
fn sort_page(listed: &mut Listed, contents: Vec<Contents>, prefixes: Vec<CommonPrefix>) {
    for c in contents {
        if !is_nameable(&c.key) {
            listed.foreign.push(c.key);
            continue;
        }
        listed.objects.push(ObjectInfo {
            key: c.key,
            size: c.size,
            etag: c.e_tag,
            // Whole seconds are all S3 keeps; a time before 1970 is taken as 1970.
            last_modified: std::time::UNIX_EPOCH
                + Duration::from_secs(u64::try_from(c.last_modified.timestamp()).unwrap_or(0)),
        });
    }
    for p in prefixes {
        match p.prefix.strip_suffix('/') {
            Some(dir) if is_nameable(dir) => listed.prefixes.push(dir.to_string()),
            _ => listed.foreign.push(p.prefix),
        }
    }
}

/// `value` percent-encoded for a query string: every byte but letters, digits and
/// `-_.~` (the signer re-encodes the same way, so the two agree).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || UNRESERVED.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_that_are_exactly_a_path_are_nameable() {
        for ok in [
            "a",
            "run/step-000001/MANIFEST.json",
            "data/x y.bin",
            "a/b.c",
        ] {
            assert!(is_nameable(ok), "{ok}");
        }
        for bad in [
            "run//notes.txt",
            "run/./x",
            "run/../x",
            "run/x/",
            "/run",
            "",
            "a/.",
        ] {
            assert!(!is_nameable(bad), "{bad}");
        }
    }

    #[test]
    fn a_page_sets_aside_foreign_keys_and_prefixes() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult><Name>b</Name><Prefix>run/</Prefix><IsTruncated>false</IsTruncated>
<Contents><Key>run//notes.txt</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>"e1"</ETag><Size>3</Size></Contents>
<Contents><Key>run/LATEST</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>"e2"</ETag><Size>12</Size></Contents>
<CommonPrefixes><Prefix>run/step-000001/</Prefix></CommonPrefixes>
<Contents><Key>run/./x</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><Size>1</Size></Contents>
<CommonPrefixes><Prefix>run//</Prefix></CommonPrefixes>
</ListBucketResult>"#;
        let page: Page = quick_xml::de::from_str(xml).unwrap();
        assert!(!page.is_truncated);
        let mut listed = Listed::default();
        sort_page(&mut listed, page.contents, page.common_prefixes);
        assert_eq!(listed.objects.len(), 1);
        let latest = &listed.objects[0];
        assert_eq!(
            (latest.key.as_str(), latest.size, latest.etag.as_deref()),
            ("run/LATEST", 12, Some("\"e2\""))
        );
        assert_eq!(
            latest.last_modified,
            std::time::UNIX_EPOCH + Duration::from_secs(1_704_164_645)
        );
        assert_eq!(listed.prefixes, ["run/step-000001"]);
        assert_eq!(listed.foreign, ["run//notes.txt", "run/./x", "run//"]);
    }

    #[test]
    fn query_values_are_encoded_as_the_signer_encodes_them() {
        assert_eq!(encode("run/a b+c~_.-"), "run%2Fa%20b%2Bc~_.-");
        assert_eq!(encode("\u{e9}"), "%C3%A9");
    }
}
