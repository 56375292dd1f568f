//! The AWS variables as the CLI reads them, against the local S3 server: a value no
//! HTTP header can carry (a CR or LF in a token, a key or a region) and an endpoint
//! that holds a password or a signature are usage errors (exit 2, one line) that name
//! the variable and the rule, and never print the value.

use super::s3::{bucket, tlio_s3};

/// The one error line of a command expected to exit 2.
fn refusal(cmd: &mut assert_cmd::Command) -> String {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("tlio: error: "), "{err}");
    assert!(!err.contains("internal error"), "{err}");
    err
}

#[test]
fn a_variable_no_header_can_carry_is_a_usage_error_naming_it_not_its_value() {
    let b = bucket();
    let url = format!("s3://{b}/m.safetensors");
    for name in [
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
    ] {
        for value in ["hunter2\r\nX-Injected: 1", "hunter2\n", "hunter2\u{1}"] {
            let err = refusal(tlio_s3().env(name, value).args(["st", "inspect", &url]));
            assert!(err.contains(&url) && err.contains(name), "{name}: {err}");
            assert!(err.contains("HTTP header"), "{name}: {err}");
            assert!(!err.contains("hunter2"), "{name}: {err}");
        }
    }
    let err = refusal(
        tlio_s3()
            .env("AWS_REGION", "hunter2.example/x")
            .args(["tokens", "header", &url]),
    );
    assert!(err.contains("AWS_REGION is not a region name"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn an_endpoint_or_url_holding_a_secret_is_refused_without_printing_it() {
    let b = bucket();
    let url = format!("s3://{b}/m.safetensors");
    let port = super::s3::server()
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    // A password in the endpoint: refused naming the variable and the rule.
    for endpoint in [
        format!("http://admin:hunter2@127.0.0.1:{port}"),
        format!("admin:hunter2@127.0.0.1:{port}"),
        "https://admin:hunter2/x@s3.example.com".to_string(),
    ] {
        let err = refusal(
            tlio_s3()
                .env("AWS_ENDPOINT_URL", &endpoint)
                .args(["st", "inspect", &url]),
        );
        assert!(
            err.contains("AWS_ENDPOINT_URL") && err.contains("user name or password"),
            "{err}"
        );
        assert!(!err.contains("hunter2") && !err.contains("admin"), "{err}");
    }
    // A presigned query in the endpoint: the value is shown redacted, with the rule.
    let endpoint = format!(
        "http://127.0.0.1:{port}/?X-Amz-Credential=AKIDhunter1&X-Amz-Signature=hunter2&X-Amz-Security-Token=hunter3"
    );
    let err = refusal(
        tlio_s3()
            .env("AWS_ENDPOINT_URL", &endpoint)
            .args(["st", "inspect", &url]),
    );
    assert!(
        err.contains("AWS_ENDPOINT_URL") && err.contains("scheme://host[:port] and nothing more"),
        "{err}"
    );
    assert!(err.contains("X-Amz-Signature=***"), "{err}");
    assert!(!err.contains("hunter"), "{err}");
    // A presigned s3:// URL, and a presigned https URL given where a file is expected.
    let presigned =
        format!("s3://{b}/m.safetensors?X-Amz-Signature=hunter2&X-Amz-Credential=hunter3");
    let out = tlio_s3()
        .args(["st", "inspect", &presigned])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not a valid s3://bucket/key URL"), "{err}");
    assert!(!err.contains("hunter"), "{err}");
    let https = "https://admin:hunter1@example.com/m.safetensors?X-Amz-Signature=hunter2";
    let out = tlio_s3().args(["st", "inspect", https]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.starts_with("tlio: error: "),
        "{err}"
    );
    assert!(
        err.contains("https://***@example.com/m.safetensors"),
        "{err}"
    );
    assert!(!err.contains("hunter"), "{err}");
}
