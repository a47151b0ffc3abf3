//! Remote MCP transports: Streamable HTTP (rmcp's reqwest client) and the legacy HTTP+SSE
//! transport (our own rmcp `Transport`), with per-server headers and credentials. Both send
//! through [`OutboundClient`], which applies the egress policy to every request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Error as SseError, Sse, SseStream};
use tokio::sync::mpsc;

use super::auth::{Credentials, OAuthClient};
use super::outbound::OutboundClient;

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
) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    let mut map = HashMap::new();
    let mut insert = |name: &str, value: &str, field: &str| -> Result<(), String> {
        let name = HeaderName::try_from(name)
            .map_err(|e| format!("server `{server_id}`: {field}: bad header name: {e}"))?;
        // The value may be a secret: never echo it.
        let mut value = HeaderValue::try_from(value)
            .map_err(|_| format!("server `{server_id}`: {field}: the header value is not valid"))?;
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

/// rmcp's HTTP client with OAuth tokens: each request carries the current token; a 401
/// triggers one refresh and one retry.
#[derive(Clone)]
pub(crate) struct AuthedClient {
    pub(crate) inner: OutboundClient,
    pub(crate) oauth: Option<Arc<OAuthClient>>,
}

type HttpError = StreamableHttpError<reqwest::Error>;

impl AuthedClient {
    async fn with_token<T, F, Fut>(&self, given: Option<String>, call: F) -> Result<T, HttpError>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let Some(oauth) = &self.oauth else {
            return call(given).await;
        };
        let token = oauth
            .token()
            .await
            .map_err(|e| StreamableHttpError::UnexpectedServerResponse(e.into()))?;
        match call(Some(token.clone())).await {
            Err(StreamableHttpError::AuthRequired(_)) => {
                tracing::info!(
                    "MCP server rejected the access token; fetching a new one and retrying once"
                );
                let fresh = oauth
                    .refresh(&token)
                    .await
                    .map_err(|e| StreamableHttpError::UnexpectedServerResponse(e.into()))?;
                call(Some(fresh)).await
            }
            other => other,
        }
    }
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
        self.with_token(auth_header, |token| {
            self.inner.post_message(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
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
        self.with_token(auth_header, |token| {
            self.inner.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.with_token(auth_header, |token| {
            self.inner.delete_session(
                uri.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
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
        self.with_token(auth_header, |token| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
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
        self.with_token(auth_header, |token| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}

/// The Streamable HTTP transport of one server.
pub(crate) fn streamable_http(
    url: &str,
    client: AuthedClient,
    headers: HashMap<HeaderName, HeaderValue>,
) -> StreamableHttpClientTransport<AuthedClient> {
    // A dropped response stream means the server went away mid-call: fail that call now
    // (`mcp_unavailable`) rather than resuming the stream until the tool timeout.
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .custom_headers(headers)
        .reinit_on_expired_session(true);
    config.retry_config = Arc::new(NoStreamRetry);
    StreamableHttpClientTransport::with_client(client, config)
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
    incoming: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: tokio::task::JoinHandle<()>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum LegacySseError {
    #[error("{0}")]
    Http(String),
}

async fn bearer(client: &AuthedClient) -> Result<Option<String>, String> {
    match &client.oauth {
        Some(oauth) => oauth.token().await.map(Some),
        None => Ok(None),
    }
}

impl LegacySse {
    /// Opens the event stream and waits for the `endpoint` event.
    pub(crate) async fn connect(
        url: &str,
        client: AuthedClient,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Self, String> {
        let base = reqwest::Url::parse(url).map_err(|e| format!("bad URL {url}: {e}"))?;
        let mut request = client
            .inner
            .get(url)
            .map_err(|denied| denied.to_string())?
            .header("accept", "text/event-stream");
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        if let Some(token) = bearer(&client).await? {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("GET {url}: {}", chain(&e)))?;
        if !response.status().is_success() {
            return Err(format!("GET {url} answered HTTP {}", response.status()));
        }
        let mut events = SseStream::from_bytes_stream(response.bytes_stream());
        let endpoint = loop {
            match events.next().await {
                Some(Ok(event)) if event.event.as_deref() == Some("endpoint") => {
                    let data = event.data.unwrap_or_default();
                    break base
                        .join(data.trim())
                        .map_err(|e| format!("bad endpoint event {data:?}: {e}"))?;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("event stream of {url}: {e}")),
                None => {
                    return Err(format!(
                        "{url} closed the event stream before announcing its endpoint"
                    ));
                }
            }
        };
        // Named by the server, so checked like any URL before it is used; the error shows
        // its origin only (the path and query may carry a session id).
        let origin = endpoint.origin().ascii_serialization();
        client
            .inner
            .check(&endpoint)
            .map_err(|denied| format!("{url} announced an endpoint on {origin}: {denied}"))?;
        if endpoint.origin() != base.origin() {
            return Err(format!(
                "{url} announced an endpoint on another origin ({origin}); refused"
            ));
        }
        let (tx, incoming) = mpsc::channel(64);
        let reader = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let Ok(event) = event else { break };
                if event.event.as_deref().is_some_and(|e| e != "message") {
                    continue;
                }
                let Some(data) = event.data else { continue };
                match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
                    Ok(message) => {
                        if tx.send(message).await.is_err() {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "legacy SSE: ignoring an event that is not a JSON-RPC message")
                    }
                }
            }
        });
        Ok(Self {
            post_url: endpoint.as_str().into(),
            client,
            headers,
            incoming,
            reader,
        })
    }
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Transport<RoleClient> for LegacySse {
    type Error = LegacySseError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
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
                    .map_err(|denied| LegacySseError::Http(denied.to_string()))?
                    .json(&item);
                for (name, value) in &headers {
                    request = request.header(name, value);
                }
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                Ok::<_, LegacySseError>(request.send())
            };
            let token = bearer(&client).await.map_err(LegacySseError::Http)?;
            let mut response = post(token.clone())?
                .await
                .map_err(|e| LegacySseError::Http(chain(&e)))?;
            if response.status() == reqwest::StatusCode::UNAUTHORIZED
                && let (Some(oauth), Some(token)) = (&client.oauth, token)
            {
                let fresh = oauth.refresh(&token).await.map_err(LegacySseError::Http)?;
                response = post(Some(fresh))?
                    .await
                    .map_err(|e| LegacySseError::Http(chain(&e)))?;
            }
            if !response.status().is_success() {
                return Err(LegacySseError::Http(format!(
                    "POST {url} answered HTTP {}",
                    response.status()
                )));
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.incoming.recv()
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
