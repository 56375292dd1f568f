//! Object storage (S3-compatible, scale.md section 3): `s3://bucket/prefix` URLs with
//! strict validation, the configuration from the standard AWS variables, and a small
//! blocking client ([`Store`]) over the `object_store` crate with its own runtime,
//! timeouts and bounded retries.
//!
//! Invariants: every failure is one error naming the URL (never a hang: each request
//! has a connect timeout, a read timeout and a bounded number of retries); credentials
//! come only from the environment given, never from an instance-metadata service (a
//! missing key is an error at once, not a slow probe); without the `s3` feature the
//! URL rules still apply and connecting is [`S3Error::NotBuilt`].

use std::io;

#[cfg(feature = "s3")]
mod client;
mod url;

pub use url::{is_s3_url, S3Url, MAX_KEY_BYTES, URL_SCHEME};

#[cfg(feature = "s3")]
pub use client::{is_nameable, Listed, ObjectWriter, Store, MULTIPART_THRESHOLD};

/// The standard AWS variables this module reads (and nothing else).
pub const ENV_VARS: [&str; 6] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
];

/// The region used when neither `AWS_REGION` nor `AWS_DEFAULT_REGION` is set.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Errors of object storage; each names the URL it concerns.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// The text is not a valid `s3://bucket/key` URL.
    #[error("{url}: not a valid s3://bucket/key URL: {reason}")]
    BadUrl {
        /// The text given.
        url: String,
        /// The rule it breaks.
        reason: String,
    },
    /// This build has no object-storage client.
    #[error("{url}: this build lacks the `s3` feature needed to reach object storage")]
    NotBuilt {
        /// The URL asked for.
        url: String,
    },
    /// The configuration (the AWS variables) is unusable.
    #[error("{url}: {reason}")]
    Config {
        /// The URL asked for.
        url: String,
        /// What is missing or wrong, naming the variable.
        reason: String,
    },
    /// An AWS variable holds a value that cannot be sent (a byte an HTTP header cannot
    /// carry, a region that cannot be part of a host name); its value is never shown,
    /// since it may be a secret.
    #[error("{url}: {name} {reason} (its value is not shown)")]
    BadVariable {
        /// The URL asked for.
        url: String,
        /// The variable.
        name: &'static str,
        /// The rule its value breaks.
        reason: &'static str,
    },
    /// A request failed: the kind of the source says how (`NotFound` for a missing
    /// object or bucket, `PermissionDenied` for refused credentials, `ConnectionRefused`
    /// or `TimedOut` for a server that cannot be reached).
    #[error("{url}")]
    Request {
        /// The object or prefix the request was about.
        url: String,
        /// What went wrong, as an I/O error of the matching kind.
        source: io::Error,
    },
    /// An object larger than the caller can hold in memory.
    #[error("{url}: {size} bytes, more than the {limit} read into memory")]
    TooLarge {
        /// The object.
        url: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
}

impl S3Error {
    /// A request error of `kind` with `message`.
    pub fn request(url: impl Into<String>, kind: io::ErrorKind, message: String) -> Self {
        S3Error::Request {
            url: url.into(),
            source: io::Error::new(kind, message),
        }
    }

    /// True when the error says the object (or bucket) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, S3Error::Request { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl crate::failure::Failure for S3Error {
    fn kind(&self) -> crate::failure::FailureKind {
        use crate::failure::FailureKind;
        match self {
            S3Error::BadUrl { .. } => FailureKind::Invalid,
            S3Error::NotBuilt { .. }
            | S3Error::Config { .. }
            | S3Error::BadVariable { .. }
            | S3Error::Request { .. }
            | S3Error::TooLarge { .. } => FailureKind::Operational,
        }
    }
}

/// The configuration read from the AWS variables.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`, when set.
    pub session_token: Option<String>,
    /// `AWS_REGION`, else `AWS_DEFAULT_REGION`, else [`DEFAULT_REGION`].
    pub region: String,
    /// `AWS_ENDPOINT_URL`, when set (then requests use path-style addressing).
    pub endpoint: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret, even in a debug dump.
        f.debug_struct("Config")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Read the variables through `var` (the process environment in [`Config::from_env`]);
    /// `url` is named in the error.
    pub fn from_vars(url: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<Self, S3Error> {
        for name in ENV_VARS {
            if let Some(value) = var(name) {
                check_variable(url, name, &value)?;
            }
        }
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let missing = |name: &str| {
            S3Error::request(
            url,
            io::ErrorKind::PermissionDenied,
            format!(
                "no credentials: {name} is not set (object storage needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ),
        )
        };
        let access_key_id = get("AWS_ACCESS_KEY_ID").ok_or_else(|| missing("AWS_ACCESS_KEY_ID"))?;
        let secret_access_key =
            get("AWS_SECRET_ACCESS_KEY").ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY"))?;
        let region = get("AWS_REGION")
            .or_else(|| get("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        let endpoint = match get("AWS_ENDPOINT_URL") {
            Some(e) => Some(check_endpoint(url, &e)?),
            None => None,
        };
        Ok(Config {
            access_key_id,
            secret_access_key,
            session_token: get("AWS_SESSION_TOKEN"),
            region,
            endpoint,
        })
    }

    /// Read the variables from the process environment (a value that is not UTF-8 is
    /// refused by [`check_variable`], never taken as unset).
    pub fn from_env(url: &str) -> Result<Self, S3Error> {
        Config::from_vars(url, &|name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })
    }
}

/// The value of variable `name` can be sent: every byte printable ASCII (an access
/// key, a secret, a token and an endpoint go into headers, where a CR or LF would end
/// the header and other control bytes are refused by the HTTP client), and a region
/// only letters, digits, `-`, `_` and `.` (it becomes part of the host name).
fn check_variable(url: &str, name: &'static str, value: &str) -> Result<(), S3Error> {
    let bad = |reason: &'static str| S3Error::BadVariable {
        url: url.to_string(),
        name,
        reason,
    };
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad(
            "holds a byte an HTTP header cannot carry (a control character such as CR or LF, or a non-ASCII one)",
        ));
    }
    let is_region = name == "AWS_REGION" || name == "AWS_DEFAULT_REGION";
    if is_region
        && !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad(
            "is not a region name (letters, digits, '-', '_' and '.' only)",
        ));
    }
    Ok(())
}

/// An endpoint is `https://host[:port][/]`, or `http://` to a loopback host (a local
/// test server); plain http elsewhere would send the data in the clear.
fn check_endpoint(url: &str, endpoint: &str) -> Result<String, S3Error> {
    if endpoint.contains('@') {
        // A user name and password (with or without a scheme before them) are never
        // echoed, even redacted: the value is not shown at all.
        return Err(S3Error::BadVariable {
            url: url.to_string(),
            name: "AWS_ENDPOINT_URL",
            reason: "holds a user name or password (user:password@host), which is never sent: credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        });
    }
    let bad = |reason: &str| S3Error::Config {
        url: url.to_string(),
        reason: format!(
            "AWS_ENDPOINT_URL {}: {reason}",
            crate::text::quote(&crate::text::redact(endpoint))
        ),
    };
    let (scheme, rest) = endpoint
        .split_once("://")
        .ok_or_else(|| bad("not an http:// or https:// URL"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
        || rest.chars().any(char::is_whitespace)
    {
        return Err(bad("expected scheme://host[:port] and nothing more"));
    }
    match scheme {
        "https" => Ok(endpoint.trim_end_matches('/').to_string()),
        "http" if is_loopback_authority(rest) => Ok(endpoint.trim_end_matches('/').to_string()),
        "http" => Err(bad(
            "plain http is used only on loopback (127.0.0.1, ::1, localhost); use https",
        )),
        _ => Err(bad("not an http:// or https:// URL")),
    }
}

/// `host[:port]` names this machine.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// What a listing or a HEAD says about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The full key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entity tag, when the server gave one.
    pub etag: Option<String>,
    /// When it was last written, by the server's clock.
    pub last_modified: std::time::SystemTime,
}

/// What a conditional put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditional {
    /// The object was written; its new entity tag, when the server gave one.
    Written(Option<String>),
    /// The precondition failed: another writer got there first.
    Lost,
}

/// Connect to the bucket of `url` with the process environment's configuration.
#[cfg(feature = "s3")]
pub fn connect(url: &S3Url) -> Result<Store, S3Error> {
    Store::connect(url, &Config::from_env(&url.to_string())?)
}

/// Without the `s3` feature there is no client: connecting is [`S3Error::NotBuilt`].
#[cfg(not(feature = "s3"))]
pub fn connect(url: &S3Url) -> Result<std::convert::Infallible, S3Error> {
    Err(S3Error::NotBuilt {
        url: url.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            owned
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn config_needs_both_keys_and_names_the_missing_variable() {
        let err = Config::from_vars("s3://b/k", &vars(&[("AWS_ACCESS_KEY_ID", "a")])).unwrap_err();
        let text = crate::failure::full_text(&err);
        assert!(text.starts_with("s3://b/k: no credentials"), "{text}");
        assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
        assert!(
            matches!(&err, S3Error::Request { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
        );
        let empty = Config::from_vars("s3://b/k", &vars(&[("AWS_ACCESS_KEY_ID", "")])).unwrap_err();
        assert!(crate::failure::full_text(&empty).contains("AWS_ACCESS_KEY_ID"));
    }

    #[test]
    fn config_reads_region_fallback_and_token() {
        let base = [("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "s")];
        let c = Config::from_vars("s3://b", &vars(&base)).unwrap();
        assert_eq!(c.region, DEFAULT_REGION);
        assert_eq!(c.session_token, None);
        assert_eq!(c.endpoint, None);
        let mut more = base.to_vec();
        more.extend([
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_SESSION_TOKEN", "t"),
        ]);
        let c = Config::from_vars("s3://b", &vars(&more)).unwrap();
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.session_token.as_deref(), Some("t"));
        more.push(("AWS_REGION", "ap-south-1"));
        assert_eq!(
            Config::from_vars("s3://b", &vars(&more)).unwrap().region,
            "ap-south-1"
        );
        // The secret and the token never appear in a debug dump.
        let dump = format!("{c:?}");
        assert!(!dump.contains("\"s\"") && !dump.contains("\"t\""), "{dump}");
    }

    #[test]
    fn a_value_no_header_can_carry_is_refused_naming_the_variable_not_the_value() {
        let base = [
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
        ];
        for name in ENV_VARS {
            for value in [
                "hunter2\r\nX-Injected: 1",
                "hunter2\n",
                "hunter2\u{7f}",
                "hunter2\u{e9}",
            ] {
                let mut pairs: Vec<(&str, &str)> =
                    base.iter().filter(|(k, _)| *k != name).copied().collect();
                pairs.push((name, value));
                let err = Config::from_vars("s3://b/k", &vars(&pairs)).unwrap_err();
                let text = crate::failure::full_text(&err);
                assert!(matches!(err, S3Error::BadVariable { .. }), "{name}: {text}");
                assert!(
                    text.starts_with("s3://b/k: ") && text.contains(name),
                    "{text}"
                );
                assert!(!text.contains("hunter2"), "{text}");
            }
        }
        for region in ["evil.example/x", "us east", "a@b"] {
            let mut pairs = base.to_vec();
            pairs.push(("AWS_REGION", region));
            let err = Config::from_vars("s3://b", &vars(&pairs)).unwrap_err();
            assert!(
                err.to_string().contains("AWS_REGION is not a region name"),
                "{err}"
            );
        }
        let mut pairs = base.to_vec();
        pairs.push(("AWS_REGION", "eu-central-1"));
        assert!(Config::from_vars("s3://b", &vars(&pairs)).is_ok());
    }

    #[test]
    fn endpoint_http_only_on_loopback() {
        let with = |e: &str| {
            Config::from_vars(
                "s3://b",
                &vars(&[
                    ("AWS_ACCESS_KEY_ID", "a"),
                    ("AWS_SECRET_ACCESS_KEY", "s"),
                    ("AWS_ENDPOINT_URL", e),
                ]),
            )
        };
        for ok in [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
            "http://localhost:5000",
            "http://[::1]:80",
            "https://s3.example.com",
            "https://minio.internal:9443",
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            with("http://127.0.0.1:9000/").unwrap().endpoint.as_deref(),
            Some("http://127.0.0.1:9000")
        );
        for bad in [
            "http://10.0.0.1:9000",
            "http://example.com",
            "ftp://127.0.0.1",
            "127.0.0.1:9000",
            "https://",
            "https://host/path",
            "https://user@host",
        ] {
            let err = with(bad).unwrap_err();
            assert!(
                crate::failure::full_text(&err).contains("AWS_ENDPOINT_URL"),
                "{bad}: {err}"
            );
        }
    }
}
