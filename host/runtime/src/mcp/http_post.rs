//! A Streamable HTTP POST whose answer the host reads itself.
//!
//! rmcp's reqwest client reads a plain JSON answer up to a fixed 16 MiB and parses it with
//! serde_json before any cap or check of the host's can apply; its docs leave limits on
//! non-streaming bodies to custom clients. [`post`] is that client: the request and the
//! outcomes of rmcp 3.9's own (auth challenges, statuses and their `Retry-After`, the
//! fallback for a server that rejects `server/discover`, event streams), except that
//!
//! - a JSON answer is read only up to the cap of the request it answers (its `Content-Length`
//!   is checked first, then the bytes as they come) and parsed by [`crate::json`], which
//!   refuses serde_json's reserved key; a body that does not parse is
//!   [`StreamableHttpError::Deserialize`], which the caller turns into a failure of that
//!   request;
//! - an event stream is cut once one event holds more than that cap ([`EventLimit`]), before
//!   the SSE parser buffers it.

use std::borrow::Cow;
use std::collections::HashMap;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::{HeaderName, HeaderValue, StatusCode, header};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE as EVENT_STREAM, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID as SESSION_ID,
    JSON_MIME_TYPE as JSON,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Error as SseError, Sse, SseStream};

use super::outbound::{ReadBodyError, read_capped};
use crate::defaults;

type HttpError = StreamableHttpError<reqwest::Error>;

/// Headers the transport sets itself, which a custom header may not replace.
/// (`MCP-Protocol-Version` may be one: rmcp's transport passes it that way.)
const RESERVED_HEADERS: [&str; 3] = ["accept", SESSION_ID, HEADER_LAST_EVENT_ID];

/// POSTs `message` and reads the answer, a JSON body or an event stream, neither holding
/// more than `max` bytes of one message.
pub(super) async fn post(
    http: &reqwest::Client,
    uri: &str,
    message: &ClientJsonRpcMessage,
    session_id: Option<&str>,
    bearer: Option<String>,
    headers: HashMap<HeaderName, HeaderValue>,
    max: usize,
) -> Result<StreamableHttpPostResponse, HttpError> {
    let mut request = http
        .post(uri)
        .header(header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        if RESERVED_HEADERS
            .iter()
            .any(|reserved| name.as_str().eq_ignore_ascii_case(reserved))
        {
            return Err(StreamableHttpError::ReservedHeaderConflict(
                name.to_string(),
            ));
        }
        request = request.header(name, value);
    }
    if let Some(session) = session_id {
        request = request.header(SESSION_ID, session);
    }
    let response = request
        .json(message)
        .send()
        .await
        .map_err(StreamableHttpError::Client)?;
    let status = response.status();
    challenge(status, response.headers())?;
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && session_id.is_some() {
        return Err(StreamableHttpError::SessionExpired);
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let is = |mime: &str| {
        content_type
            .as_deref()
            .is_some_and(|ct| ct.starts_with(mime))
    };
    // Rate limits and failures without a JSON body end here, unread; a JSON one may hold
    // the JSON-RPC error worth passing on.
    let mut status_error = status_error(status, response.headers());
    if (!is(JSON) || status == StatusCode::TOO_MANY_REQUESTS)
        && let Some(error) = status_error.take()
    {
        return Err(error.into());
    }
    let session = response
        .headers()
        .get(SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let expects_no_answer = !matches!(message, ClientJsonRpcMessage::Request(_));
    // Some servers answer a notification with an empty 200 rather than 202.
    if status.is_success() && response.content_length() == Some(0) && expects_no_answer {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if !status.is_success() {
        let body = match read_body(response, defaults::MCP_MAX_HTTP_ERROR_BODY_BYTES).await {
            Ok(body) => String::from_utf8_lossy(&body).into_owned(),
            Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                return Err(status_error.map_or(error, Into::into));
            }
            Err(_) => "<failed to read response body>".to_owned(),
        };
        if let Some(answer) = discover_rejected(message, session_id.is_some(), status, &body) {
            return Ok(answer);
        }
        let auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if !auth_failure && is(JSON) {
            if let Ok(error @ ServerJsonRpcMessage::Error(_)) = crate::json::from_str(&body) {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            tracing::warn!("HTTP {status}: the JSON body is not a JSON-RPC error");
        }
        return Err(match status_error {
            Some(error) => error.into(),
            None => StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "HTTP {status}: {body}"
            ))),
        });
    }
    if is(EVENT_STREAM) {
        let events = bounded_events(response.bytes_stream(), max);
        return Ok(StreamableHttpPostResponse::Sse(events, session));
    }
    if is(JSON) {
        let body = read_body(response, max).await?;
        return match crate::json::from_slice::<ServerJsonRpcMessage>(&body) {
            Ok(answer) => Ok(StreamableHttpPostResponse::Json(answer, session)),
            // Nothing waits for an answer: an unusable one is as good as none.
            Err(error) if expects_no_answer => {
                tracing::warn!(%error, "the JSON answer to a notification or reply is not JSON-RPC; ignored");
                Ok(StreamableHttpPostResponse::Accepted)
            }
            Err(error) => Err(StreamableHttpError::Deserialize(error)),
        };
    }
    Err(StreamableHttpError::UnexpectedContentType(content_type))
}

/// A `401` or `403` with a `WWW-Authenticate` challenge, as rmcp's auth layers expect it.
fn challenge(status: StatusCode, headers: &http::HeaderMap) -> Result<(), HttpError> {
    let forbidden = match status {
        StatusCode::UNAUTHORIZED => false,
        StatusCode::FORBIDDEN => true,
        _ => return Ok(()),
    };
    let Some(value) = headers.get(header::WWW_AUTHENTICATE) else {
        return Ok(());
    };
    let value = value.to_str().map_err(|_| {
        StreamableHttpError::UnexpectedServerResponse(Cow::Borrowed(
            "invalid www-authenticate header value",
        ))
    })?;
    Err(if forbidden {
        StreamableHttpError::InsufficientScope(InsufficientScopeError::new(
            value.to_owned(),
            scope_in(value),
        ))
    } else {
        StreamableHttpError::AuthRequired(AuthRequiredError::new(value.to_owned()))
    })
}

/// The `scope` parameter of a challenge, quoted or not.
fn scope_in(challenge: &str) -> Option<String> {
    let at = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let value = &challenge[at..];
    let scope = match value.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => {
            let end = value
                .find(|c: char| c == ',' || c == ';' || c.is_whitespace())
                .unwrap_or(value.len());
            &value[..end]
        }
    };
    (!scope.is_empty() || value.starts_with('"')).then(|| scope.to_owned())
}

/// What the transport keeps of a rate limit or a server error: the status and a short
/// `Retry-After`.
fn status_error(status: StatusCode, headers: &http::HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    // `new` drops a value over 128 bytes.
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// A server before 2026-07-28 that rejects `server/discover` with a client error: answered
/// as a JSON-RPC error to that request, so the lifecycle falls back to `initialize` (the
/// id is the request's: such a rejection, often a proxy's, cannot echo it).
fn discover_rejected(
    message: &ClientJsonRpcMessage,
    session_attached: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if session_attached
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match crate::json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

/// `response`'s body, refused past `max` bytes ([`read_capped`]).
async fn read_body(response: reqwest::Response, max: usize) -> Result<Vec<u8>, HttpError> {
    read_capped(response, max)
        .await
        .map_err(|error| match error {
            ReadBodyError::TooLarge(_) => {
                StreamableHttpError::ResponseBodyTooLarge { max_size: max }
            }
            ReadBodyError::Read(error) => StreamableHttpError::Client(error),
        })
}

/// One event of an answer's stream held more than the cap of the request it answers.
#[derive(Debug, thiserror::Error)]
#[error("an SSE event is over {max} bytes")]
struct EventTooLarge {
    max: usize,
}

/// Whether `error` ended an answer's event stream at an event over its cap.
pub(super) fn is_event_too_large(error: &SseError) -> bool {
    matches!(error, SseError::Body(error)
        if matches!(error.downcast_ref::<StreamError>(), Some(StreamError::TooLarge(_))))
}

/// Why the bytes of an event stream stopped.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error(transparent)]
    TooLarge(#[from] EventTooLarge),
    #[error(transparent)]
    Read(#[from] reqwest::Error),
}

/// `body` parsed as server-sent events, ended (with [`EventTooLarge`] in
/// [`SseError::Body`]) once one event holds more than `max` bytes.
fn bounded_events(
    body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    max: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    let mut limit = EventLimit::new(max);
    let mut body = Box::pin(body);
    let mut failed = false;
    // Nothing after the first error, and the body is not read again: the parser would go
    // on with what follows it.
    let bytes = futures::stream::poll_fn(move |cx| {
        if failed {
            return std::task::Poll::Ready(None);
        }
        let chunk = std::task::ready!(body.as_mut().poll_next(cx)).map(|chunk| {
            let chunk = chunk?;
            limit.observe(&chunk)?;
            Ok::<_, StreamError>(chunk)
        });
        failed = chunk.as_ref().is_some_and(Result::is_err);
        std::task::Poll::Ready(chunk)
    });
    SseStream::from_bytes_stream(bytes).boxed()
}

/// Counts the bytes the SSE parser holds for the event being read: its lines so far that
/// are not comments (the parser joins them with a newline) and the line it is in, which
/// may be a comment. A blank line ends the event. Lines end with LF, CR or CRLF.
#[derive(Debug)]
struct EventLimit {
    max: usize,
    held: usize,
    line: usize,
    comment: bool,
    after_cr: bool,
}

impl EventLimit {
    fn new(max: usize) -> Self {
        EventLimit {
            max,
            held: 0,
            line: 0,
            comment: false,
            after_cr: false,
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) -> Result<(), EventTooLarge> {
        while !bytes.is_empty() {
            if std::mem::take(&mut self.after_cr) && bytes[0] == b'\n' {
                bytes = &bytes[1..];
                continue;
            }
            let Some(at) = memchr::memchr2(b'\n', b'\r', bytes) else {
                return self.extend(bytes);
            };
            self.extend(&bytes[..at])?;
            self.end_line();
            self.check()?;
            self.after_cr = bytes[at] == b'\r';
            bytes = &bytes[at + 1..];
        }
        Ok(())
    }

    fn extend(&mut self, part: &[u8]) -> Result<(), EventTooLarge> {
        if let Some(&first) = part.first() {
            if self.line == 0 {
                self.comment = first == b':';
            }
            self.line = self.line.saturating_add(part.len());
        }
        self.check()
    }

    fn end_line(&mut self) {
        if self.line == 0 {
            self.held = 0;
        } else if !self.comment {
            self.held = self.held.saturating_add(self.line).saturating_add(1);
        }
        self.line = 0;
        self.comment = false;
    }

    fn check(&self) -> Result<(), EventTooLarge> {
        if self.held.saturating_add(self.line) > self.max {
            return Err(EventTooLarge { max: self.max });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` to a limit of `max`; the index of the chunk it refused.
    fn refused_at(max: usize, chunks: &[&str]) -> Option<usize> {
        let mut limit = EventLimit::new(max);
        chunks
            .iter()
            .position(|chunk| limit.observe(chunk.as_bytes()).is_err())
    }

    #[test]
    fn an_event_is_held_until_its_blank_line_whatever_ends_its_lines() {
        // "data: 12345\n" holds 12 bytes (11 and the joining newline).
        assert_eq!(refused_at(12, &["data: 12345\n"]), None);
        assert_eq!(refused_at(11, &["data: 12345\n"]), Some(0));
        for end in ["\n", "\r", "\r\n"] {
            let event = format!("data: 12345{end}{end}");
            // Ended events do not add up.
            assert_eq!(refused_at(12, &[&event, &event, &event]), None, "{end:?}");
            // Two lines of one event do.
            let two = format!("data: 12345{end}data: 12345{end}");
            assert_eq!(refused_at(23, &[&two]), Some(0), "{end:?}");
            assert_eq!(refused_at(24, &[&two]), None, "{end:?}");
        }
    }

    #[test]
    fn a_crlf_split_across_chunks_is_one_line_end() {
        // Were the LF read as a blank line, the second line would start a new event.
        assert_eq!(
            refused_at(23, &["data: 12345\r", "\ndata: 12345\n"]),
            Some(1)
        );
    }

    #[test]
    fn a_line_is_counted_as_it_comes_and_comments_only_while_they_last() {
        assert_eq!(refused_at(12, &["data: ", "12345", "6789"]), Some(2));
        // A comment is not kept once it ends, but an endless one is cut.
        let comment = format!(":{}\n", "x".repeat(100));
        assert_eq!(refused_at(101, &[&comment, &comment, "data: 1\n"]), None);
        assert_eq!(refused_at(50, &[&comment]), Some(0));
    }

    #[test]
    fn the_scope_of_a_challenge_is_read_quoted_or_not() {
        let quoted = r#"Bearer error="insufficient_scope", scope="files:read files:write""#;
        assert_eq!(scope_in(quoted).as_deref(), Some("files:read files:write"));
        assert_eq!(
            scope_in("Bearer SCOPE=read:data, error=x").as_deref(),
            Some("read:data")
        );
        assert_eq!(scope_in(r#"Bearer scope="unterminated"#), None);
        assert_eq!(scope_in("Bearer error=insufficient_scope"), None);
        assert_eq!(scope_in("Bearer scope="), None);
    }

    fn request(text: &str) -> ClientJsonRpcMessage {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_rejected_discover_becomes_its_error_and_nothing_else_does() {
        let discover =
            request(r#"{"jsonrpc":"2.0","id":7,"method":"server/discover","params":{}}"#);
        let error_of = |answer: Option<StreamableHttpPostResponse>| match answer {
            Some(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(error), None)) => {
                assert_eq!(error.id, Some(rmcp::model::RequestId::Number(7)));
                error.error
            }
            _ => panic!("not a JSON-RPC error"),
        };
        let kept =
            r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32601,"message":"no"}}"#;
        let error = error_of(discover_rejected(
            &discover,
            false,
            StatusCode::BAD_REQUEST,
            kept,
        ));
        assert_eq!((error.code.0, error.message.as_ref()), (-32601, "no"));
        let error = error_of(discover_rejected(
            &discover,
            false,
            StatusCode::NOT_FOUND,
            "nope",
        ));
        assert!(
            error.message.contains("HTTP 404 Not Found: nope"),
            "{error:?}"
        );
        // The reserved key is not read as the error.
        let hidden = r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","data":{"$serde_json::private::RawValue":"1"}}}"#;
        let error = error_of(discover_rejected(
            &discover,
            false,
            StatusCode::BAD_REQUEST,
            hidden,
        ));
        assert_eq!(error.code.0, rmcp::model::ErrorCode::INVALID_REQUEST.0);
        // With a session, an auth failure, a server error or another request: not this.
        assert!(discover_rejected(&discover, true, StatusCode::BAD_REQUEST, kept).is_none());
        for status in [
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::BAD_GATEWAY,
        ] {
            assert!(
                discover_rejected(&discover, false, status, kept).is_none(),
                "{status}"
            );
        }
        let ping = request(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        assert!(discover_rejected(&ping, false, StatusCode::BAD_REQUEST, kept).is_none());
    }

    #[test]
    fn rate_limits_and_server_errors_keep_a_short_retry_after() {
        let mut headers = http::HeaderMap::new();
        assert!(status_error(StatusCode::BAD_REQUEST, &headers).is_none());
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
        let error = status_error(StatusCode::TOO_MANY_REQUESTS, &headers).unwrap();
        assert_eq!(
            (error.status, error.retry_after.as_deref()),
            (429, Some("30"))
        );
        let long = "9".repeat(129);
        headers.insert(header::RETRY_AFTER, HeaderValue::from_str(&long).unwrap());
        let error = status_error(StatusCode::SERVICE_UNAVAILABLE, &headers).unwrap();
        assert_eq!((error.status, error.retry_after), (503, None));
    }

    #[test]
    fn challenges_become_the_errors_the_auth_layers_read() {
        let mut headers = http::HeaderMap::new();
        assert!(challenge(StatusCode::UNAUTHORIZED, &headers).is_ok());
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer error="insufficient_scope", scope="a b""#),
        );
        assert!(challenge(StatusCode::OK, &headers).is_ok());
        match challenge(StatusCode::UNAUTHORIZED, &headers) {
            Err(StreamableHttpError::AuthRequired(error)) => {
                assert!(error.www_authenticate_header.contains("insufficient_scope"))
            }
            other => panic!("{other:?}"),
        }
        match challenge(StatusCode::FORBIDDEN, &headers) {
            Err(StreamableHttpError::InsufficientScope(error)) => {
                assert_eq!(error.required_scope.as_deref(), Some("a b"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_event_over_the_cap_ends_the_stream_with_its_error() {
        let chunks = ["data: 1\n\n", "data: 12345678", "90\n\n", "data: 2\n\n"]
            .map(|chunk| Ok(Bytes::from_static(chunk.as_bytes())));
        // Nor is the body read again: it would wait here.
        let body = futures::stream::iter(chunks).chain(futures::stream::pending());
        let events: Vec<_> = bounded_events(body, 12).collect().await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].as_ref().unwrap().data.as_deref(), Some("1"));
        assert!(
            events[1].as_ref().is_err_and(is_event_too_large),
            "{:?}",
            events[1]
        );
    }
}
