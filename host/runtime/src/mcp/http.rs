//! Remote MCP transports: Streamable HTTP (rmcp's transport over our own POST) and the legacy
//! HTTP+SSE transport (our own rmcp `Transport`), with per-server headers and credentials.
//! Both send through [`OutboundClient`], which applies the egress policy to every request.
//!
//! Both read with the server's byte caps. For Streamable HTTP, [`AuthedClient`] passes each
//! POST the cap of the request it answers (`http_post.rs` holds a JSON body or one SSE
//! event to it) and turns an answer over it into that request's `mcp_output_too_large`, and
//! a JSON body that is not JSON-RPC into its `tool_exec_failed`; an HTTP error body over
//! 64 KiB is the server's failure (`tool_exec_failed`). The transport is behind a
//! [`Guarded`] like every connection. A stream the server closes is resumed (GET with
//! `Last-Event-ID`) after the server's `retry:` field, cut to
//! [`defaults::MAX_SSE_RETRY`](crate::defaults::MAX_SSE_RETRY); without `retry:` a closed
//! stream fails its call. The legacy SSE stream is parsed by our bounded
//! [`SseReader`] (capped, like stdio lines, at the largest answer pending) and checked by a
//! [`Guard`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::model::RequestId;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, GetMeta, ProtocolVersion, ServerJsonRpcMessage,
    ServerResult,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Error as SseError, Sse};
use tokio::sync::mpsc;

use super::auth::{AuthError, Credentials, TokenSource};
use super::connect::{
    Guard, Guarded, IdScan, Incoming, Kind, Limits, Problem, SseEvent, SseReader,
};
use super::error::{error_chain, host_error};
use super::outbound::{EgressRefused, OutboundClient, SendError, UrlParseError};
use super::tool_headers::LeftOut;
use crate::defaults;

/// A configured header that cannot be sent. The value may be a secret, so it is never
/// shown, and neither is the parse error of a value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("server `{server_id}`: {field}: bad header name: {source}")]
    BadName {
        server_id: String,
        field: String,
        #[source]
        source: http::header::InvalidHeaderName,
    },
    #[error("server `{server_id}`: {field}: the header value is not valid")]
    BadValue { server_id: String, field: String },
}

/// Why the legacy SSE transport could not open its event stream and learn its endpoint.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseConnectError {
    #[error("bad URL {url}: {source}")]
    BadUrl {
        url: String,
        #[source]
        source: UrlParseError,
    },
    #[error(transparent)]
    Denied(EgressRefused),
    #[error(transparent)]
    Auth(AuthError),
    #[error("GET {url}: {}", error_chain(.source))]
    Unreachable {
        url: String,
        #[source]
        source: Box<SendError>,
    },
    #[error("GET {url} answered HTTP {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("event stream of {url}: {}", error_chain(.source))]
    Stream {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} closed the event stream before announcing its endpoint")]
    ClosedEarly { url: String },
    #[error("bad endpoint event {data:?}: {source}")]
    BadEndpoint {
        data: String,
        #[source]
        source: UrlParseError,
    },
    /// The endpoint the server announced is outside the egress rules.
    #[error("{url} announced an endpoint on {origin}: {denied}")]
    EndpointDenied {
        url: String,
        origin: String,
        #[source]
        denied: EgressRefused,
    },
    #[error("{url} announced an endpoint on another origin ({origin}); refused")]
    OtherOrigin { url: String, origin: String },
}

/// rustls needs a process-wide crypto provider before any HTTP client is built; `ring`
/// builds without extra tooling.
pub fn ensure_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Static headers of a server: its record's `http.headers` and an API key.
pub(crate) fn header_map(
    server_id: &str,
    headers: &std::collections::BTreeMap<String, String>,
    credentials: Option<&Credentials>,
) -> Result<HashMap<HeaderName, HeaderValue>, HeaderError> {
    let mut map = HashMap::new();
    let mut insert = |name: &str, value: &str, field: &str| -> Result<(), HeaderError> {
        let name = HeaderName::try_from(name).map_err(|source| HeaderError::BadName {
            server_id: server_id.to_owned(),
            field: field.to_owned(),
            source,
        })?;
        // The value may be a secret: never echo it.
        let mut value = HeaderValue::try_from(value).map_err(|_| HeaderError::BadValue {
            server_id: server_id.to_owned(),
            field: field.to_owned(),
        })?;
        value.set_sensitive(true);
        map.insert(name, value);
        Ok(())
    };
    for (name, value) in headers {
        insert(name, value, &format!("http.headers.{name}"))?;
    }
    if let Some(Credentials::ApiKey { header, value }) = credentials {
        insert(header, value, "auth_ref")?;
    }
    Ok(map)
}

/// rmcp's HTTP client with OAuth tokens and one server's byte caps. Each request carries
/// the current token (none yet when only the server's 401 can say where to get one); a
/// 401 triggers one new token and one retry, a 403 `insufficient_scope` a token with more
/// scopes and [`defaults::OAUTH_STEP_UP_ATTEMPTS`] retries.
#[derive(Clone)]
pub(crate) struct AuthedClient {
    pub(crate) inner: OutboundClient,
    pub(crate) oauth: Option<TokenSource>,
    pub(crate) limits: Limits,
    /// Where a refusal only a person can fix is noted for the connection's calls.
    pub(crate) refusal: AuthRefusal,
    /// Notes the listed tools rmcp will leave out for invalid `x-mcp-header` declarations.
    pub(crate) left_out: LeftOut,
    /// Notes when the session's first standalone GET stream was answered.
    pub(crate) common_stream: CommonStream,
}

/// Whether a 2025-era session's standalone GET stream (where a server sends what belongs
/// to no request, like some servers' questions during a call) was answered yet, opened or
/// refused. rmcp opens it in the background after the handshake; a call sent before it is
/// open can have such a server's question go nowhere, so calls wait for it a little.
#[derive(Clone, Default)]
pub(crate) struct CommonStream(Arc<(std::sync::atomic::AtomicBool, tokio::sync::Notify)>);

impl CommonStream {
    fn answered(&self) {
        if !self.0.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.0.1.notify_waiters();
        }
    }

    /// Waits until the stream was answered, at most `up_to`, and only once a session: a
    /// server that never answers it costs the first request the wait, not every request.
    pub(crate) async fn wait(&self, up_to: std::time::Duration) {
        let answered = || self.0.0.load(std::sync::atomic::Ordering::SeqCst);
        if answered() {
            return;
        }
        let notified = self.0.1.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !answered() && tokio::time::timeout(up_to, notified).await.is_err() {
            self.answered();
        }
    }
}

/// The last refusal of a connection's requests that only a person can fix (a grant
/// revoked or refused mid-session): the transport can only end the session, so a call
/// that fails with it says this instead of "went away".
#[derive(Clone, Default)]
pub(crate) struct AuthRefusal(Arc<std::sync::Mutex<Option<String>>>);

impl AuthRefusal {
    fn note(&self, error: &AuthError) {
        if error.needs_person() {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.to_string());
        }
    }

    /// The refusal noted, as a policy error (not the server's failure), once.
    pub(crate) fn take(&self) -> Option<super::McpError> {
        let noted = self.0.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        Some(super::McpError::new(
            super::McpErrorCode::PolicyDenied,
            noted,
        ))
    }
}

type HttpError = StreamableHttpError<reqwest::Error>;

impl AuthedClient {
    /// `error` as the transport's, noted first if only a person can fix it.
    fn auth_failed(&self, error: AuthError) -> HttpError {
        self.refusal.note(&error);
        StreamableHttpError::UnexpectedServerResponse(error.to_string().into())
    }
}

impl AuthedClient {
    /// Makes `call` (a `method` request to `uri` with `headers`) with the current token: a
    /// bearer token as rmcp sends it, or a DPoP-bound one in the headers with a fresh
    /// proof, renewed, stepped up or given a new DPoP nonce as the server's answer asks.
    async fn with_token<T, F, Fut>(
        &self,
        given: Option<String>,
        method: &'static str,
        uri: &str,
        headers: &HashMap<HeaderName, HeaderValue>,
        call: F,
    ) -> Result<T, HttpError>
    where
        F: Fn(Option<String>, HashMap<HeaderName, HeaderValue>) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let Some(oauth) = &self.oauth else {
            return call(given, headers.clone()).await;
        };
        let mut token = oauth
            .token_if_known()
            .await
            .map_err(|e| self.auth_failed(e))?;
        let (mut renewed, mut step_ups, mut nonces) = (false, 0, 0);
        loop {
            let (bearer, sent) = present(oauth, token.as_deref(), method, uri, headers)?;
            match call(bearer, sent).await {
                // A DPoP nonce, once; a server that keeps asking fails the call (no new
                // token or flow would help).
                Err(StreamableHttpError::AuthRequired(challenge))
                    if token.is_some()
                        && super::auth::wants_nonce(&challenge.www_authenticate_header)
                        && oauth.dpop().is_some() =>
                {
                    let learned = nonces < defaults::DPOP_NONCE_RETRIES
                        && self
                            .learn_nonce(oauth, token.as_deref().unwrap_or_default(), uri, headers)
                            .await;
                    if !learned {
                        return Err(self.auth_failed(AuthError::DpopNonce {
                            server_id: self.limits.server_id.to_string(),
                        }));
                    }
                    nonces += 1;
                }
                Err(StreamableHttpError::AuthRequired(challenge)) if !renewed => {
                    renewed = true;
                    if token.is_some() {
                        tracing::info!(
                            "MCP server rejected the access token; fetching a new one and retrying once"
                        );
                    }
                    let fresh = oauth
                        .unauthorized(token.as_deref(), Some(&challenge.www_authenticate_header))
                        .await
                        .map_err(|e| self.auth_failed(e))?;
                    token = Some(fresh);
                }
                Err(StreamableHttpError::InsufficientScope(challenge))
                    if step_ups < defaults::OAUTH_STEP_UP_ATTEMPTS =>
                {
                    step_ups += 1;
                    match oauth
                        .step_up(token.as_deref(), &challenge.www_authenticate_header)
                        .await
                        .map_err(|e| self.auth_failed(e))?
                    {
                        Some(fresh) => token = Some(fresh),
                        None => return Err(StreamableHttpError::InsufficientScope(challenge)),
                    }
                }
                other => return other,
            }
        }
    }

    /// After a `use_dpop_nonce` challenge: rmcp keeps only the challenge, not the
    /// `DPoP-Nonce` header beside it, so the nonce is learned from one `ping` (harmless
    /// whether or not the server takes it) made with the same token and a fresh proof.
    /// Whether a usable nonce came back.
    async fn learn_nonce(
        &self,
        oauth: &TokenSource,
        token: &str,
        uri: &str,
        headers: &HashMap<HeaderName, HeaderValue>,
    ) -> bool {
        let Some(key) = oauth.dpop() else {
            return false;
        };
        let Ok(presented) = key.present("POST", uri, token) else {
            return false;
        };
        let Ok(mut request) = self.inner.post(uri) else {
            return false;
        };
        for (name, value) in headers.iter().chain(presented.iter().map(|(n, v)| (n, v))) {
            request = request.header(name, value);
        }
        let ping =
            serde_json::json!({"jsonrpc": "2.0", "id": "quiver-dpop-nonce", "method": "ping"});
        let response = request
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .timeout(defaults::OAUTH_HTTP_TIMEOUT)
            .json(&ping)
            .send()
            .await;
        match response
            .ok()
            .and_then(|r| super::auth::nonce_of(r.headers()))
        {
            Some(nonce) => {
                key.set_rs_nonce(nonce);
                true
            }
            None => false,
        }
    }
}

/// What carries `token` on a `method` request to `uri`: rmcp's bearer token, or for a
/// DPoP-bound token the `Authorization: DPoP` and `DPoP` headers added to `headers`.
fn present(
    oauth: &TokenSource,
    token: Option<&str>,
    method: &str,
    uri: &str,
    headers: &HashMap<HeaderName, HeaderValue>,
) -> Result<(Option<String>, HashMap<HeaderName, HeaderValue>), HttpError> {
    let (Some(token), Some(key)) = (token, oauth.dpop()) else {
        return Ok((token.map(str::to_owned), headers.clone()));
    };
    let presented = key
        .present(method, uri, token)
        .map_err(|e| StreamableHttpError::UnexpectedServerResponse(e.to_string().into()))?;
    let mut sent = headers.clone();
    sent.extend(presented);
    Ok((None, sent))
}

impl StreamableHttpClient for AuthedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.with_token(
            auth_header,
            "POST",
            &uri,
            &custom_headers,
            |token, headers| {
                self.inner.post_message(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    headers,
                )
            },
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let request = match &message {
            ClientJsonRpcMessage::Request(request) => {
                Some((request.id.clone(), Kind::of(&request.request)))
            }
            _ => None,
        };
        // rmcp filters a listing by its tools' header declarations from 2026-07-28 on.
        let checks_headers = match &message {
            ClientJsonRpcMessage::Request(request) => {
                matches!(request.request, ClientRequest::ListToolsRequest(_))
                    && request
                        .request
                        .get_meta()
                        .protocol_version()
                        .is_some_and(|v| v >= ProtocolVersion::STANDARD_HEADERS)
            }
            _ => false,
        };
        let max = match &request {
            Some((_, kind)) => self.limits.message_cap(kind).min(max_sse_event_size),
            None => max_sse_event_size,
        };
        let response = self
            .with_token(
                auth_header,
                "POST",
                &uri,
                &custom_headers,
                |token, headers| {
                    self.inner.post_message_with_max_sse_event_size(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        token,
                        headers,
                        max,
                    )
                },
            )
            .await;
        let Some((id, kind)) = request else {
            // rmcp takes an event stream in answer to a notification or a reply too.
            return match response {
                Ok(StreamableHttpPostResponse::Sse(events, session)) => {
                    Ok(StreamableHttpPostResponse::Sse(
                        bound_retry(events, self.limits.clone()),
                        session,
                    ))
                }
                other => other,
            };
        };
        let response = match response {
            Ok(StreamableHttpPostResponse::Json(answer, session)) if checks_headers => {
                note_left_out(&self.left_out, &answer);
                Ok(StreamableHttpPostResponse::Json(answer, session))
            }
            Ok(StreamableHttpPostResponse::Sse(events, session)) if checks_headers => {
                let left_out = self.left_out.clone();
                let events = events
                    .inspect(move |event| {
                        if let Ok(Sse {
                            data: Some(data), ..
                        }) = event
                            && let Ok(answer) = crate::json::from_str(data)
                        {
                            note_left_out(&left_out, &answer);
                        }
                    })
                    .boxed();
                Ok(StreamableHttpPostResponse::Sse(events, session))
            }
            other => other,
        };
        match response {
            // A JSON result is read up to the request's own cap, an HTTP error's body up to
            // 64 KiB: only a limit at or past that cap means the result was too large.
            Err(StreamableHttpError::ResponseBodyTooLarge { max_size })
                if max_size >= self.limits.message_cap(&kind) =>
            {
                let seen = (max_size as u64).saturating_add(1);
                let error = self.limits.too_large(&kind, seen);
                let answer = failure_answer(&self.limits, &error, id);
                Ok(StreamableHttpPostResponse::Json(answer, None))
            }
            Err(StreamableHttpError::ResponseBodyTooLarge { max_size }) => {
                let error = self.limits.error_body_too_large(&kind, max_size);
                let answer = failure_answer(&self.limits, &error, id);
                Ok(StreamableHttpPostResponse::Json(answer, None))
            }
            // A JSON answer that is not JSON-RPC, or uses serde_json's reserved key (an
            // error to `server/discover`, like a rejection, makes rmcp try `initialize`).
            Err(StreamableHttpError::Deserialize(error)) => {
                let error = self.limits.invalid(&kind, &error.to_string());
                let answer = failure_answer(&self.limits, &error, id);
                Ok(StreamableHttpPostResponse::Json(answer, None))
            }
            Ok(StreamableHttpPostResponse::Sse(events, session)) => {
                let events = cap_events(events, self.limits.clone(), kind, id, max);
                Ok(StreamableHttpPostResponse::Sse(events, session))
            }
            other => other,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.with_token(
            auth_header,
            "DELETE",
            &uri,
            &custom_headers,
            |token, headers| {
                self.inner
                    .delete_session(uri.clone(), session_id.clone(), token, headers)
            },
        )
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let first = last_event_id.is_none();
        let stream = self
            .with_token(
                auth_header,
                "GET",
                &uri,
                &custom_headers,
                |token, headers| {
                    self.inner.get_stream(
                        uri.clone(),
                        session_id.clone(),
                        last_event_id.clone(),
                        token,
                        headers,
                    )
                },
            )
            .await;
        if first {
            self.common_stream.answered();
        }
        stream
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let max = self.limits.largest_message().min(max_sse_event_size);
        let first = last_event_id.is_none();
        let stream = self
            .with_token(
                auth_header,
                "GET",
                &uri,
                &custom_headers,
                |token, headers| {
                    self.inner.get_stream_with_max_sse_event_size(
                        uri.clone(),
                        session_id.clone(),
                        last_event_id.clone(),
                        token,
                        headers,
                        max,
                    )
                },
            )
            .await
            .map(|events| bound_retry(events, self.limits.clone()));
        if first {
            self.common_stream.answered();
        }
        stream
    }
}

/// Notes the tools of a `tools/list` answer whose header declarations are invalid.
fn note_left_out(left_out: &LeftOut, answer: &ServerJsonRpcMessage) {
    if let ServerJsonRpcMessage::Response(response) = answer
        && let ServerResult::ListToolsResult(list) = &response.result
    {
        left_out.check(list);
    }
}

/// The answer that fails request `id` with `error`, logged with the server's id.
fn failure_answer(limits: &Limits, error: &super::McpError, id: RequestId) -> ServerJsonRpcMessage {
    tracing::warn!(server_id = %limits.server_id, %error, "failing one request");
    ServerJsonRpcMessage::error(host_error(error), Some(id))
}

/// The events answering request `id`, where an event over `max` (the POST ends the stream
/// with an error) becomes that request's `mcp_output_too_large`.
fn cap_events(
    events: BoxStream<'static, Result<Sse, SseError>>,
    limits: Limits,
    kind: Kind,
    id: RequestId,
    max: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    events
        .map(move |event| match event {
            Err(error) if super::http_post::is_event_too_large(&error) => {
                let error = limits.too_large(&kind, (max as u64).saturating_add(1));
                let answer = failure_answer(&limits, &error, id.clone());
                let data = serde_json::to_string(&answer).map_err(|e| SseError::Body(e.into()))?;
                Ok(Sse::default().data(data))
            }
            Ok(sse) if hides_values(&sse) => {
                let error = limits.invalid(&kind, crate::json::RESERVED);
                let answer = failure_answer(&limits, &error, id.clone());
                let data = serde_json::to_string(&answer).map_err(|e| SseError::Body(e.into()))?;
                Ok(Sse::default().data(data))
            }
            other => other,
        })
        .map(bounded_retry)
        .boxed()
}

/// Whether a message event's data uses serde_json's reserved key (see `crate::json`):
/// rmcp parses that data itself, so the host checks it first. rmcp never parses the data
/// of other events.
fn hides_values(sse: &Sse) -> bool {
    matches!(sse.event.as_deref(), None | Some("" | "message"))
        && sse
            .data
            .as_deref()
            .is_some_and(|data| crate::json::refuse_raw_value_key(data.as_bytes()).is_err())
}

/// `event` with its `retry:` cut to [`crate::defaults::MAX_SSE_RETRY`]: rmcp waits that
/// long before resuming a stream the server closed.
fn bounded_retry(event: Result<Sse, SseError>) -> Result<Sse, SseError> {
    event.map(|mut sse| {
        let most = crate::defaults::MAX_SSE_RETRY.as_millis();
        if let Some(retry) = &mut sse.retry
            && u128::from(*retry) > most
        {
            *retry = u64::try_from(most).unwrap_or(u64::MAX);
        }
        sse
    })
}

/// [`bounded_retry`] for every event of a stream not answering a request the host knows
/// (the GET stream, a resumed one, an answer to a notification). An event that
/// [`hides_values`] becomes, if it answers one of our requests, that request's failure;
/// any other loses its data, and rmcp skips an event without data.
fn bound_retry(
    events: BoxStream<'static, Result<Sse, SseError>>,
    limits: Limits,
) -> BoxStream<'static, Result<Sse, SseError>> {
    events
        .map(move |event| {
            bounded_retry(event).map(|mut sse| {
                if hides_values(&sse) {
                    sse.data = sse.data.and_then(|data| failure_of_answer(&limits, &data));
                }
                sse
            })
        })
        .boxed()
}

/// For an answer `data` that [`hides_values`], the failure of the request it answers, as
/// event data; `None` for anything else (a request or notification of the server's).
fn failure_of_answer(limits: &Limits, data: &str) -> Option<String> {
    let mut scan = IdScan::default();
    scan.feed(data.as_bytes());
    let id = scan.id().filter(|_| scan.is_answer());
    let Some(id) = id else {
        tracing::warn!(server_id = %limits.server_id, "dropped a server event: {}", crate::json::RESERVED);
        return None;
    };
    let error = limits.invalid(&Kind::Other("a request"), crate::json::RESERVED);
    serde_json::to_string(&failure_answer(limits, &error, id.clone())).ok()
}

/// The Streamable HTTP transport of one server.
pub(crate) fn streamable_http(
    url: &str,
    client: AuthedClient,
    headers: HashMap<HeaderName, HeaderValue>,
) -> Guarded<StreamableHttpClientTransport<AuthedClient>> {
    // A dropped response stream means the server went away mid-call: fail that call now
    // (`mcp_unavailable`) rather than resuming the stream until the tool timeout.
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .custom_headers(headers)
        .reinit_on_expired_session(true);
    config.retry_config = Arc::new(NoStreamRetry);
    config.max_sse_event_size = client.limits.largest_message();
    let limits = client.limits.clone();
    Guarded::new(
        StreamableHttpClientTransport::with_client(client, config),
        limits,
    )
}

/// Never resume a broken response stream (see [`streamable_http`]).
#[derive(Debug)]
struct NoStreamRetry;

impl rmcp::transport::common::client_side_sse::SseRetryPolicy for NoStreamRetry {
    fn retry(&self, _attempts: usize) -> Option<Duration> {
        None
    }
}

/// The legacy HTTP+SSE transport (MCP 2024-11-05): a GET opens an event stream whose
/// first `endpoint` event names the URL to POST JSON-RPC messages to; the server's
/// messages arrive as `message` events on the stream.
pub(crate) struct LegacySse {
    post_url: Arc<str>,
    client: AuthedClient,
    headers: HashMap<HeaderName, HeaderValue>,
    incoming: mpsc::Receiver<Incoming>,
    guard: Guard,
    /// The guard's read cap (the largest answer pending), for the reader task: it changes
    /// as requests are sent and answered.
    read_cap: Arc<AtomicUsize>,
    reader: tokio::task::JoinHandle<()>,
}

/// A failed send on the legacy SSE transport.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LegacySseError {
    #[error(transparent)]
    Denied(EgressRefused),
    #[error(transparent)]
    Auth(AuthError),
    #[error("{}", error_chain(.0))]
    Send(#[source] Box<SendError>),
    #[error("POST {url} answered HTTP {status}")]
    Status {
        url: Arc<str>,
        status: reqwest::StatusCode,
    },
}

async fn bearer(client: &AuthedClient) -> Result<Option<String>, AuthError> {
    match &client.oauth {
        Some(oauth) => oauth.token().await,
        None => Ok(None),
    }
}

impl LegacySse {
    /// Opens the event stream and waits for the `endpoint` event.
    pub(crate) async fn connect(
        url: &str,
        client: AuthedClient,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Self, SseConnectError> {
        let base = reqwest::Url::parse(url).map_err(|source| SseConnectError::BadUrl {
            url: url.to_owned(),
            source,
        })?;
        let mut request = client
            .inner
            .get(url)
            .map_err(SseConnectError::Denied)?
            .header("accept", "text/event-stream");
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        if let Some(token) = bearer(&client).await.map_err(SseConnectError::Auth)? {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|source| SseConnectError::Unreachable {
                url: url.to_owned(),
                source: Box::new(source),
            })?;
        if !response.status().is_success() {
            return Err(SseConnectError::Status {
                url: url.to_owned(),
                status: response.status(),
            });
        }
        let mut body = response.bytes_stream();
        let guard = Guard::new(client.limits.clone());
        let read_cap = Arc::new(AtomicUsize::new(guard.read_cap()));
        let mut reader = SseReader::new(guard.read_cap());
        let mut events = Vec::new();
        let endpoint = 'endpoint: loop {
            for event in events.drain(..) {
                if let SseEvent::Complete {
                    kind: Some(kind),
                    data,
                } = event
                    && kind == "endpoint"
                {
                    match base.join(data.trim()) {
                        Ok(endpoint) => break 'endpoint endpoint,
                        Err(source) => return Err(SseConnectError::BadEndpoint { data, source }),
                    }
                }
            }
            match body.next().await {
                Some(Ok(bytes)) => reader.push(&bytes, &mut events),
                Some(Err(source)) => {
                    return Err(SseConnectError::Stream {
                        url: url.to_owned(),
                        source,
                    });
                }
                None => {
                    return Err(SseConnectError::ClosedEarly {
                        url: url.to_owned(),
                    });
                }
            }
        };
        // Named by the server, so checked like any URL before it is used; the error shows
        // its origin only (the path and query may carry a session id).
        let origin = endpoint.origin().ascii_serialization();
        if let Err(denied) = client.inner.check(&endpoint) {
            return Err(SseConnectError::EndpointDenied {
                url: url.to_owned(),
                origin,
                denied,
            });
        }
        if endpoint.origin() != base.origin() {
            return Err(SseConnectError::OtherOrigin {
                url: url.to_owned(),
                origin,
            });
        }
        let (tx, incoming) = mpsc::channel(64);
        let cap = read_cap.clone();
        let reader = tokio::spawn(async move {
            // Events that came with the endpoint's bytes are read first.
            let mut events = events;
            loop {
                for event in events.drain(..) {
                    if let Some(incoming) = incoming_of(event)
                        && tx.send(incoming).await.is_err()
                    {
                        return;
                    }
                }
                match body.next().await {
                    Some(Ok(bytes)) => {
                        reader.set_cap(cap.load(Ordering::SeqCst));
                        reader.push(&bytes, &mut events);
                    }
                    Some(Err(error)) => {
                        tracing::warn!(error = %error_chain(&error), "legacy SSE: the event stream failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok(Self {
            post_url: endpoint.as_str().into(),
            client,
            headers,
            incoming,
            guard,
            read_cap,
            reader,
        })
    }
}

/// What a legacy SSE event carries for the guard; `None` for events of other types.
fn incoming_of(event: SseEvent) -> Option<Incoming> {
    match event {
        SseEvent::Complete { kind, data } => {
            if kind.as_deref().is_some_and(|kind| kind != "message") {
                return None;
            }
            Some(match crate::json::from_str::<ServerJsonRpcMessage>(&data) {
                Ok(message) => Incoming::Message(message),
                Err(error) => {
                    let mut scan = IdScan::default();
                    scan.feed(data.as_bytes());
                    Incoming::Unreadable {
                        id: scan.id().cloned(),
                        answer: scan.is_answer(),
                        problem: Problem::Invalid(error.to_string()),
                    }
                }
            })
        }
        SseEvent::TooLarge { id, answer, seen } => Some(Incoming::Unreadable {
            id,
            answer,
            problem: Problem::TooLarge { seen },
        }),
        SseEvent::Endless { seen } => Some(Incoming::Endless { seen }),
    }
}

impl Transport<RoleClient> for LegacySse {
    type Error = LegacySseError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.guard.on_send(&item);
        self.read_cap.store(self.guard.read_cap(), Ordering::SeqCst);
        let (url, client, headers) = (
            self.post_url.clone(),
            self.client.clone(),
            self.headers.clone(),
        );
        async move {
            // Every POST is checked again: the endpoint came from the server.
            let post = |token: Option<String>| {
                let mut request = client
                    .inner
                    .post(&url)
                    .map_err(LegacySseError::Denied)?
                    .json(&item);
                for (name, value) in &headers {
                    request = request.header(name, value);
                }
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                Ok::<_, LegacySseError>(request.send())
            };
            let auth = |e: AuthError| {
                client.refusal.note(&e);
                LegacySseError::Auth(e)
            };
            let token = bearer(&client).await.map_err(auth)?;
            let mut response = post(token.clone())?
                .await
                .map_err(|e| LegacySseError::Send(Box::new(e)))?;
            if response.status() == reqwest::StatusCode::UNAUTHORIZED
                && let (Some(oauth), Some(token)) = (&client.oauth, token)
            {
                let challenge = response
                    .headers()
                    .get(http::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok());
                let fresh = oauth
                    .unauthorized(Some(&token), challenge)
                    .await
                    .map_err(auth)?;
                response = post(Some(fresh))?
                    .await
                    .map_err(|e| LegacySseError::Send(Box::new(e)))?;
            }
            if !response.status().is_success() {
                return Err(LegacySseError::Status {
                    url,
                    status: response.status(),
                });
            }
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            if let Some(next) = self.guard.next_ready() {
                return next;
            }
            let incoming = self.incoming.recv().await?;
            self.guard.take(incoming);
            self.read_cap.store(self.guard.read_cap(), Ordering::SeqCst);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.reader.abort();
        std::future::ready(Ok(()))
    }
}

impl Drop for LegacySse {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_header_error_never_shows_the_value() {
        let secret = "Bearer s3cret-value\n";
        let headers = BTreeMap::from([("Authorization".to_owned(), secret.to_owned())]);
        let error = header_map("web", &headers, None).expect_err("a newline is not valid");
        assert_eq!(
            error.to_string(),
            "server `web`: http.headers.Authorization: the header value is not valid"
        );
        assert!(!format!("{error:?}").contains("s3cret"), "{error:?}");

        let key = Credentials::ApiKey {
            header: "x api key".into(),
            value: "s3cret-value".into(),
        };
        let error = header_map("web", &BTreeMap::new(), Some(&key)).expect_err("bad name");
        assert!(
            error
                .to_string()
                .starts_with("server `web`: auth_ref: bad header name"),
            "{error}"
        );
        assert!(std::error::Error::source(&error).is_some());
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    #[test]
    fn a_server_retry_is_kept_up_to_the_cap_and_cut_past_it() {
        let retry = |ms: Option<u64>| {
            let event = Sse {
                retry: ms,
                ..Sse::default()
            };
            bounded_retry(Ok(event)).map(|e| e.retry).ok().flatten()
        };
        let most = u64::try_from(crate::defaults::MAX_SSE_RETRY.as_millis()).unwrap();
        assert_eq!(
            retry(Some(500)),
            Some(500),
            "the conformance suite's 500 ms"
        );
        assert_eq!(retry(Some(most)), Some(most));
        assert_eq!(retry(Some(u64::MAX)), Some(most));
        assert_eq!(retry(None), None, "no retry field: nothing is resumed");
    }
}
