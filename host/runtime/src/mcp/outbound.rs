//! The MCP side's one HTTP client, and the only way to send with it: every request has its
//! URL checked against the egress policy first, whoever builds it.
//!
//! Checking the configured URL once at connect time is not enough. A legacy SSE server
//! names the URL its messages are posted to; OAuth metadata names the token endpoint that
//! receives the client secret; rmcp hands a URI to every Streamable HTTP call. Any of them
//! may point somewhere the allow rules do not cover. So the `reqwest::Client` is private to
//! this module: code elsewhere gets an [`Outbound`] request from [`OutboundClient::request`]
//! (checked when it is made, and its URL cannot change afterwards), or goes through
//! [`OutboundClient`]'s own [`StreamableHttpClient`] impl (checked per call). Redirects are
//! not followed, since a hop would skip the check, and the client's resolver
//! ([`EgressResolver`]) checks every address a name resolves to. rmcp's OAuth discovery
//! uses the same client through its `OAuthHttpClient` trait, with bounded bodies and time.
//!
//! The client never takes a proxy from the environment (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `ALL_PROXY`): a proxy resolves the target's name itself, so the resolver would only ever
//! see the proxy's. Only `[egress] proxy` sets one, and then every request's target is
//! resolved and checked here ([`EgressPolicy::check_through_proxy`]) before it is handed
//! to the proxy. The proxy may still resolve a name differently a moment later (DNS
//! rebinding between the two lookups); docs/policy.md says to let the proxy refuse private
//! addresses too.
//!
//! A refusal ([`EgressRefused`]) names the scheme, host and port and the rule that refused
//! them; never the path or query, which may carry session ids or tokens.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue, Method};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::auth::{OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRequest};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::{Error as SseError, Sse};

use super::egress::{EgressDenied, EgressPolicy, EgressResolveError, EgressResolver};
use super::http::ensure_tls_provider;
use crate::defaults;

/// The error of parsing a URL (`url::ParseError`, named through reqwest's re-export).
pub(crate) type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// A request the egress policy refused (or a URL it could not judge).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EgressRefused {
    #[error("egress policy: {0}")]
    Denied(#[source] EgressDenied),
    /// Only the parse error: the URL may carry a secret in its query.
    #[error("egress policy: cannot check a URL that does not parse ({0})")]
    Unparsable(#[source] UrlParseError),
    /// Through `[egress] proxy`: the target's addresses, checked before sending.
    #[error("{0}")]
    Resolved(#[source] Box<EgressResolveError>),
}

/// A request that was refused before it was sent, or failed in the sending.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error(transparent)]
    Refused(EgressRefused),
    #[error(transparent)]
    Http(reqwest::Error),
}

/// The shared HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub(crate) struct ClientBuildError(#[source] reqwest::Error);

/// The egress-checked HTTP client shared by every remote server (one connection pool).
#[derive(Clone)]
pub(crate) struct OutboundClient {
    http: reqwest::Client,
    policy: Arc<EgressPolicy>,
}

impl OutboundClient {
    /// The client: the egress resolver, no redirects, the connect timeout, and no proxy
    /// but the policy's.
    pub(crate) fn new(
        policy: Arc<EgressPolicy>,
        connect_timeout: Duration,
    ) -> Result<Self, ClientBuildError> {
        ensure_tls_provider();
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(EgressResolver {
                policy: policy.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .connect_timeout(connect_timeout);
        if let Some(proxy) = policy.proxy() {
            builder = builder.proxy(reqwest::Proxy::all(proxy.clone()).map_err(ClientBuildError)?);
        }
        let http = builder.build().map_err(ClientBuildError)?;
        Ok(Self { http, policy })
    }

    /// Whether the policy lets a request go to `url`.
    pub(crate) fn check(&self, url: &reqwest::Url) -> Result<(), EgressRefused> {
        self.policy.check_url(url).map_err(EgressRefused::Denied)
    }

    /// Whether `url`'s host resolves to an address the policy lets a request reach; a
    /// lookup that fails is left for the request itself to report.
    pub(crate) async fn check_resolved(
        &self,
        url: &reqwest::Url,
    ) -> Result<(), EgressResolveError> {
        let Some(host) = url.host_str() else {
            return Ok(());
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match self.policy.resolve(host).await {
            Ok(Err(refused)) => Err(refused),
            Ok(Ok(_)) | Err(_) => Ok(()),
        }
    }

    /// Through a proxy, the check the resolver makes on a direct connection: `url`'s host
    /// and every address it resolves to. Without a proxy, nothing to do here.
    async fn checked_target(&self, url: &reqwest::Url) -> Result<(), EgressRefused> {
        if self.policy.proxy().is_none() {
            return Ok(());
        }
        let Some(host) = url.host_str() else {
            return Ok(());
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.policy
            .check_through_proxy(host)
            .await
            .map_err(|refused| EgressRefused::Resolved(Box::new(refused)))
    }

    fn checked(&self, url: &str) -> Result<reqwest::Url, EgressRefused> {
        // The parse error alone: the URL may carry a secret in its query.
        let parsed = reqwest::Url::parse(url).map_err(EgressRefused::Unparsable)?;
        self.check(&parsed)?;
        Ok(parsed)
    }

    /// A `method` request to `url`, if the egress policy allows `url`.
    pub(crate) fn request(&self, method: Method, url: &str) -> Result<Outbound, EgressRefused> {
        let url = self.checked(url)?;
        Ok(Outbound {
            request: self.http.request(method, url.clone()),
            url,
            client: self.clone(),
        })
    }

    pub(crate) fn get(&self, url: &str) -> Result<Outbound, EgressRefused> {
        self.request(Method::GET, url)
    }

    pub(crate) fn post(&self, url: &str) -> Result<Outbound, EgressRefused> {
        self.request(Method::POST, url)
    }

    /// rmcp's calls carry their own URI: check it, or fail the call as an I/O error
    /// (`PermissionDenied`) whose text is the refusal.
    async fn checked_uri(&self, uri: &str) -> Result<(), HttpError> {
        let checked = match self.checked(uri) {
            Ok(url) => self.checked_target(&url).await,
            Err(denied) => Err(denied),
        };
        checked.map_err(|denied| {
            StreamableHttpError::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                denied,
            ))
        })
    }
}

/// A request whose URL passed the egress check. It can gain headers and a body, not a
/// new URL, and it does not hand out the client it will be sent with.
pub(crate) struct Outbound {
    request: reqwest::RequestBuilder,
    url: reqwest::Url,
    client: OutboundClient,
}

impl Outbound {
    pub(crate) fn header<K, V>(self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        Self {
            request: self.request.header(name, value),
            ..self
        }
    }

    pub(crate) fn bearer_auth(self, token: impl std::fmt::Display) -> Self {
        Self {
            request: self.request.bearer_auth(token),
            ..self
        }
    }

    pub(crate) fn basic_auth(
        self,
        user: impl std::fmt::Display,
        password: Option<impl std::fmt::Display>,
    ) -> Self {
        Self {
            request: self.request.basic_auth(user, password),
            ..self
        }
    }

    /// The whole exchange, body included, ends by `timeout`.
    pub(crate) fn timeout(self, timeout: Duration) -> Self {
        Self {
            request: self.request.timeout(timeout),
            ..self
        }
    }

    pub(crate) fn form<T: serde::Serialize + ?Sized>(self, form: &T) -> Self {
        Self {
            request: self.request.form(form),
            ..self
        }
    }

    pub(crate) fn json<T: serde::Serialize + ?Sized>(self, json: &T) -> Self {
        Self {
            request: self.request.json(json),
            ..self
        }
    }

    /// Sends the request; through a proxy, only once its target's addresses pass.
    pub(crate) async fn send(self) -> Result<reqwest::Response, SendError> {
        self.client
            .checked_target(&self.url)
            .await
            .map_err(SendError::Refused)?;
        self.request.send().await.map_err(SendError::Http)
    }
}

/// A response body over the cap a caller set; reading stopped there.
#[derive(Debug, thiserror::Error)]
#[error("the response body is larger than {max} bytes")]
pub(crate) struct BodyTooLarge {
    pub(crate) max: usize,
}

/// Why a capped body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadBodyError {
    #[error(transparent)]
    TooLarge(BodyTooLarge),
    #[error("reading the response body: {0}")]
    Read(#[source] reqwest::Error),
}

/// `response`'s body, at most `max` bytes: a hostile server cannot make the host buffer
/// more. A `Content-Length` over `max` is refused unread; one under it is not trusted,
/// and chunks are counted as they arrive.
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, ReadBodyError> {
    let too_large = || ReadBodyError::TooLarge(BodyTooLarge { max });
    let expected = response.content_length().unwrap_or(0);
    if expected > max as u64 {
        return Err(too_large());
    }
    // Sized once when the length is known: doubling would briefly hold twice it.
    let mut body = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(ReadBodyError::Read)? {
        if chunk.len() > max.saturating_sub(body.len()) {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// rmcp's OAuth discovery (protected-resource and authorization-server metadata) goes
/// through here: each request's URL is checked, redirects come back unfollowed (rmcp
/// follows same-origin ones by sending a new request, checked again), and the time and
/// body size are capped.
impl OAuthHttpClient for OutboundClient {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(self.execute_http(request.request, request.timeout))
    }
}

impl OutboundClient {
    /// One OAuth request, egress-checked, redirects not followed, its body capped.
    pub(crate) async fn execute_http(
        &self,
        request: http::Request<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> Result<http::Response<Vec<u8>>, rmcp::transport::auth::OAuthHttpClientError> {
        {
            let timeout = timeout.map_or(defaults::OAUTH_HTTP_TIMEOUT, |t| {
                t.min(defaults::OAUTH_HTTP_TIMEOUT)
            });
            let (parts, body) = request.into_parts();
            let url = self.checked(&parts.uri.to_string())?;
            self.checked_target(&url).await?;
            let response = self
                .http
                .request(parts.method, url.clone())
                .headers(parts.headers)
                .body(body)
                .timeout(timeout)
                .send()
                .await?;
            let mut answer = http::Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                headers.extend(response.headers().clone());
            }
            let body = read_capped(response, defaults::OAUTH_MAX_RESPONSE_BYTES).await?;
            // rmcp parses it into maps of `Value`s (see `crate::json`), and may show only
            // that a request failed.
            if let Err(error) = crate::json::refuse_raw_value_key(&body) {
                tracing::warn!(host = ?url.host_str(), %error, "refused an OAuth answer");
                return Err(error.into());
            }
            Ok(answer.body(body)?)
        }
    }
}

type HttpError = StreamableHttpError<reqwest::Error>;

/// rmcp's Streamable HTTP calls, each checked against the egress policy. A POST's answer is
/// read by [`http_post::post`](super::http_post::post), within the request's cap; the rest
/// are made by rmcp's own reqwest implementation on the private client.
impl StreamableHttpClient for OutboundClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        // rmcp's transport always passes a cap; without one, that of a message that is not
        // a call's or a listing's answer.
        let max = defaults::MAX_MCP_MESSAGE_BYTES.saturating_add(defaults::MCP_ENVELOPE_BYTES);
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        self.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            max,
        )
        .await
    }

    /// `max_sse_event_size` caps a JSON answer too: the caller passes the cap of the
    /// request the answer is for.
    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.checked_uri(&uri).await?;
        let custom_headers = super::spans::with_trace_headers(&message, custom_headers);
        super::http_post::post(
            &self.http,
            &uri,
            &message,
            session_id.as_deref(),
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.checked_uri(&uri).await?;
        self.http
            .delete_session(uri, session_id, auth_header, custom_headers)
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
        self.checked_uri(&uri).await?;
        self.http
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
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
        self.checked_uri(&uri).await?;
        self.http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::mcp::egress::EgressConfig;

    fn client(allow: &[&str]) -> OutboundClient {
        let policy = EgressPolicy::from_config(&EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_private: vec!["127.0.0.0/8".into()],
            proxy: None,
        })
        .unwrap();
        OutboundClient::new(Arc::new(policy), Duration::from_secs(5)).unwrap()
    }

    /// A loopback HTTP server answering every request with `answer`; counts connections.
    async fn server(answer: String) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (addr, seen)
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

    #[tokio::test]
    async fn a_request_outside_the_rules_is_never_sent() {
        let (addr, seen) = server(OK.into()).await;
        let client = client(&["http://127.0.0.1:1"]);
        let url = format!("http://{addr}/token?client_secret=s3cret");
        let denied = client.post(&url).err().expect("refused");
        let text = denied.to_string();
        assert!(
            text.contains("egress policy")
                && text.contains(&addr.to_string())
                && text.contains("[egress] allow"),
            "{text}"
        );
        assert!(
            !text.contains("s3cret") && !text.contains("/token"),
            "{text}"
        );

        let message: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "ping"
        }))
        .unwrap();
        let uri: Arc<str> = format!("http://{addr}/mcp?session=s3cret").into();
        let error = client
            .post_message(uri.clone(), message, None, None, HashMap::new())
            .await
            .expect_err("refused");
        assert!(error.to_string().contains("egress policy"), "{error}");
        assert!(!error.to_string().contains("s3cret"), "{error}");
        assert!(
            client
                .get_stream(uri.clone(), None, None, None, HashMap::new())
                .await
                .is_err()
        );
        assert!(
            client
                .delete_session(uri, "sid".into(), None, HashMap::new())
                .await
                .is_err()
        );
        assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing reached the server");

        let allowed = self::client(&[&format!("http://{addr}")]);
        let response = allowed
            .get(&format!("http://{addr}/"))
            .unwrap()
            .send()
            .await;
        assert_eq!(response.unwrap().status(), 200);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (target, seen) = server(OK.into()).await;
        let (redirector, _) = server(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{target}/x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ))
        .await;
        let client = client(&["http://*:*"]);
        let response = client
            .post(&format!("http://{redirector}/mcp"))
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 307);
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }
}
