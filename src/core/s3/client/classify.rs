//! How a failed request failed, from what `object_store` and the server said: one I/O
//! kind (missing, refused, unreachable) and one short line naming the server's status
//! and error code.
//!
//! Invariant: a server's refusal of the credentials (a bad key, signature or session
//! token, an expired token, a denied access) is `PermissionDenied` whatever its status,
//! with the server's code in the message when its reply had a body; the message is one
//! line and says each thing once.

use std::io;

/// The error codes by which S3 refuses the credentials or the access, whatever the
/// status they come with (400 for a malformed or expired session token, 403 for the
/// rest).
const REFUSAL_CODES: [&str; 7] = [
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "InvalidSecurity",
];

/// How `object_store` introduces the status a server answered.
const STATUS_PREFIX: &str = "Server returned non-2xx status code: ";

/// How an `object_store` error failed, as an I/O kind and one short message: a
/// missing bucket, a missing object, refused credentials, an unreachable server.
pub(super) fn classify(
    err: &object_store::Error,
    endpoint: &str,
    bucket: &str,
) -> (io::ErrorKind, String) {
    let text = crate::failure::full_text(err);
    if text.contains("NoSuchBucket") {
        return (
            io::ErrorKind::NotFound,
            format!("no such bucket {bucket} at {endpoint}"),
        );
    }
    match err {
        object_store::Error::NotFound { .. } => {
            return (io::ErrorKind::NotFound, "no such object".to_string())
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            return (
                io::ErrorKind::PermissionDenied,
                refused(err, &text, endpoint),
            )
        }
        _ => {}
    }
    if let Some(kind) = network_kind(err) {
        return (
            kind,
            format!("cannot reach the server at {endpoint}: {}", leaf(err)),
        );
    }
    if REFUSAL_CODES.iter().any(|code| text.contains(code)) {
        return (
            io::ErrorKind::PermissionDenied,
            refused(err, &text, endpoint),
        );
    }
    (io::ErrorKind::Other, one_line_reply(&text))
}

/// The one line of a refusal: the server, the status, then the server's code and
/// message when its reply had a body. A HEAD's reply never has one, so instead of an
/// empty code the message says the request was a HEAD.
fn refused(err: &object_store::Error, text: &str, endpoint: &str) -> String {
    let said = leaf(err);
    let said = said
        .strip_prefix(STATUS_PREFIX)
        .unwrap_or(&said)
        .trim_end_matches([' ', ':']);
    let said = if said.is_empty() {
        "no reason given"
    } else {
        said
    };
    if text.contains("Error performing HEAD ") {
        format!(
            "the server at {endpoint} refused the request: {said} (to a HEAD request, whose reply carries no error code)"
        )
    } else {
        format!("the server at {endpoint} refused the request: {said}")
    }
}

/// The deepest cause's message (the one that says what happened), on one line: a
/// server's XML error body is shortened to its `Code` and `Message`, and line breaks
/// are spaces, so the error prints as the one line every tlio error is.
fn leaf(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    one_line_reply(&cause.to_string())
}

/// `text` with an S3 XML error body (`<Error><Code>..</Code><Message>..</Message>`)
/// replaced by `Code: Message`, and every run of whitespace made one space.
fn one_line_reply(text: &str) -> String {
    let field = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)?.checked_add(open.len())?;
        let len = text.get(start..)?.find(&format!("</{name}>"))?;
        text.get(start..start.checked_add(len)?)
    };
    let short = match (
        text.find("<?xml").or_else(|| text.find("<Error>")),
        field("Code"),
    ) {
        (Some(body), Some(code)) => {
            let before = text.get(..body).unwrap_or("").trim_end_matches([' ', ':']);
            let said = match field("Message") {
                Some(message) => format!("{code}: {message}"),
                None => code.to_string(),
            };
            if before.is_empty() {
                said
            } else {
                format!("{before}: {said}")
            }
        }
        _ => text.to_string(),
    };
    short.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `ConnectionRefused` or `TimedOut` when a transport error is in the chain.
fn network_kind(err: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<reqwest::Error>() {
            if r.is_timeout() {
                return Some(io::ErrorKind::TimedOut);
            }
            // A connection that closed before the reply completed (`is_request`, `is_body`
            // without a status) is a network failure too, never a server's answer.
            if r.is_connect() || ((r.is_request() || r.is_body()) && r.status().is_none()) {
                return Some(io::ErrorKind::ConnectionRefused);
            }
        }
        if let Some(e) = c.downcast_ref::<io::Error>() {
            match e.kind() {
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::NotConnected => return Some(io::ErrorKind::ConnectionRefused),
                io::ErrorKind::TimedOut => return Some(io::ErrorKind::TimedOut),
                _ => {}
            }
        }
        cause = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::one_line_reply;

    #[test]
    fn a_server_error_body_becomes_its_code_and_message_on_one_line() {
        let body = "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\" \
                    encoding=\"utf-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The \
                    request signature we calculated does not match.</Message><RequestId>x\
                    </RequestId></Error>";
        assert_eq!(
            one_line_reply(body),
            "Server returned non-2xx status code: 403 Forbidden: SignatureDoesNotMatch: The \
             request signature we calculated does not match."
        );
        assert_eq!(
            one_line_reply("<Error><Code>AccessDenied</Code></Error>"),
            "AccessDenied"
        );
        assert_eq!(one_line_reply("a\n  b\tc"), "a b c");
        // A cut body is kept whole (on one line), never sliced out of bounds.
        assert_eq!(
            one_line_reply("403: <Error><Code>Access"),
            "403: <Error><Code>Access"
        );
    }
}
