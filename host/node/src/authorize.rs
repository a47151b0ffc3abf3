//! User authorization through the node: a client with the `authorize` role starts the
//! OAuth authorization code flow of a server for a principal it may act for
//! (`POST /v1/authorizations/{server_id}/{principal}`, answered with the authorization
//! URL for a person to open), the authorization server sends the person's browser back to
//! the node's own `GET /oauth/callback`, and the grant goes to the host's grant store. The
//! same route reads a grant's status (`GET`, never a token) and revokes it (`DELETE`).
//!
//! The callback carries no client token (a browser follows a redirect): it is authorised
//! only by the flow's `state`, which rmcp draws at random for the authorization URL, is
//! single-use (taken out of the table when it arrives) and expires with the flow
//! (`[serve] authorization_timeout_ms`). Pending flows are bounded
//! ([`defaults::AUTHORIZATION_MAX_PENDING`], one per server and principal), so neither
//! starts nor callbacks can grow the node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::oneshot;

use super::NodeState;
use super::auth::Caller;
use super::error::ApiError;
use crate::defaults;
use quiver::{AuthorizationPrompt, AuthorizeError, GrantKey, McpErrorCode, PreviewError};

pub(crate) use super::guard::CALLBACK_PATH;

/// The redirect URI of `public_url` (`[serve] public_url`): `https`, or `http` on a
/// loopback host (RFC 8252 allows nothing else in clear); no query, fragment or user.
pub(crate) fn redirect_uri(public_url: &str) -> Result<String, String> {
    let fix = "write the URL browsers reach the node at, e.g. \"https://quiver.example.com\" (http only for 127.0.0.1, [::1] or localhost)";
    let url = url::Url::parse(public_url).map_err(|e| format!("{e}; {fix}"))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "plain http is allowed only on a loopback host: authorization codes would travel in clear; {fix}"
            ));
        }
        _ => return Err(format!("expected an https URL; {fix}")),
    }
    if url.host().is_none()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(format!(
            "a host and no user, query or fragment are allowed; {fix}"
        ));
    }
    Ok(format!(
        "{}{CALLBACK_PATH}",
        url.as_str().trim_end_matches('/')
    ))
}

/// The host name of a redirect URI, which the node must serve (`[serve] allowed_hosts`).
pub(crate) fn redirect_host(redirect_uri: &str) -> Option<String> {
    let url = url::Url::parse(redirect_uri).ok()?;
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// The flows waiting for a browser, at most one per server and principal.
pub(crate) struct Flows {
    /// `None` without `[serve] public_url`: no flow starts.
    redirect_uri: Option<String>,
    timeout: Duration,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    flows: HashMap<GrantKey, Flow>,
}

struct Flow {
    id: u64,
    expires: Instant,
    /// The flow's `state`, once its authorization URL is known.
    state: Option<String>,
    /// Hands the browser's redirect to the waiting flow; taken by the first callback.
    callback: Option<oneshot::Sender<Callback>>,
    task: tokio::task::AbortHandle,
}

/// What came back to `/oauth/callback`: the redirect URL (or the authorization server's
/// error), and where to say how the flow ended.
struct Callback {
    redirect: Result<String, String>,
    done: oneshot::Sender<Result<(), String>>,
}

impl Flows {
    pub(crate) fn new(redirect_uri: Option<String>, timeout: Duration) -> Self {
        Self {
            redirect_uri,
            timeout,
            table: Mutex::new(Table::default()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the flow `id` of `key` if it is still the current one.
    fn finish(&self, key: &GrantKey, id: u64) {
        let mut table = self.table();
        if table.flows.get(key).is_some_and(|f| f.id == id) {
            table.flows.remove(key);
        }
    }

    /// Cancels the pending flow of `key`, if any; whether there was one.
    fn cancel(&self, key: &GrantKey) -> bool {
        let flow = self.table().flows.remove(key);
        flow.map(|f| f.task.abort()).is_some()
    }

    fn is_pending(&self, key: &GrantKey) -> bool {
        self.table()
            .flows
            .get(key)
            .is_some_and(|f| f.expires > Instant::now())
    }

    /// Cancels every flow (the node is stopping).
    pub(crate) fn cancel_all(&self) {
        for (_, flow) in self.table().flows.drain() {
            flow.task.abort();
        }
    }

    /// Takes the flow whose `state` this is, if it has not expired: single use.
    fn take_by_state(&self, state: &str) -> Option<(GrantKey, oneshot::Sender<Callback>)> {
        let mut table = self.table();
        let now = Instant::now();
        let (key, flow) = table
            .flows
            .iter_mut()
            .find(|(_, f)| f.state.as_deref() == Some(state))?;
        if flow.expires <= now {
            return None;
        }
        flow.state = None;
        Some((key.clone(), flow.callback.take()?))
    }
}

/// The [`UserAuthorizer`](quiver::UserAuthorizer) of one flow: publishes its URL to the
/// request that started it and waits for the browser at the node's callback.
struct FlowAuthorizer {
    flows: Arc<Flows>,
    key: GrantKey,
    id: u64,
    redirect_uri: String,
    expires: Instant,
    /// The authorization URL (or why there is none), to the starting request.
    started: Mutex<Option<oneshot::Sender<Result<String, ApiError>>>>,
    /// How the flow ended, to the callback's page.
    done: Mutex<Option<oneshot::Sender<Result<(), String>>>>,
}

impl FlowAuthorizer {
    fn take_started(&self) -> Option<oneshot::Sender<Result<String, ApiError>>> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn take_done(&self) -> Option<oneshot::Sender<Result<(), String>>> {
        self.done.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl quiver::UserAuthorizer for FlowAuthorizer {
    fn redirect_uri(&self) -> String {
        self.redirect_uri.clone()
    }

    fn authorize(
        &self,
        prompt: AuthorizationPrompt,
    ) -> BoxFuture<'_, Result<String, AuthorizeError>> {
        Box::pin(async move {
            let state = query_param(&prompt.url, "state")
                .ok_or_else(|| AuthorizeError("the authorization URL has no state".into()))?;
            let (tx, rx) = oneshot::channel();
            {
                let mut table = self.flows.table();
                let flow = table
                    .flows
                    .get_mut(&self.key)
                    .filter(|f| f.id == self.id)
                    .ok_or_else(|| {
                        AuthorizeError("a newer authorization replaced this one".into())
                    })?;
                flow.state = Some(state);
                flow.callback = Some(tx);
            }
            if let Some(started) = self.take_started() {
                let _ = started.send(Ok(prompt.url));
            }
            let wait = self.expires.saturating_duration_since(Instant::now());
            match tokio::time::timeout(wait, rx).await {
                Ok(Ok(Callback { redirect, done })) => {
                    *self.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
                    redirect.map_err(AuthorizeError)
                }
                Ok(Err(_)) => Err(AuthorizeError("the authorization was cancelled".into())),
                Err(_) => Err(AuthorizeError(format!(
                    "no browser came back within {} s; start the authorization again",
                    self.flows.timeout.as_secs()
                ))),
            }
        })
    }
}

/// The `{server_id}/{principal}` of a request, the principal one the caller may act for
/// (the rule of `POST /v1/tasks`).
fn target(
    state: &NodeState,
    caller: &Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<GrantKey, ApiError> {
    let Ok(Path((server_id, principal))) = path else {
        return Err(ApiError::bad(
            "path",
            "expected /v1/authorizations/{server_id}/{principal}, each percent-encoded",
        ));
    };
    if server_id.is_empty()
        || server_id.len() > 256
        || quiver::text::printable(&server_id) != server_id
    {
        return Err(ApiError::bad(
            "server_id",
            "expected a server id of the registry",
        ));
    }
    let principal = caller
        .principal_for(Some(&principal), &state.config.clients)?
        .ok_or_else(|| ApiError::unauthorized("send `Authorization: Bearer <token>`"))?;
    Ok(GrantKey::new(server_id, principal))
}

/// A library refusal as an API error: an unknown server is `404`, one that does not use
/// user authorization `422`, anything else (discovery, the authorization server) `502`.
fn refused(error: PreviewError) -> ApiError {
    match error {
        PreviewError::UnknownServer(_) => ApiError::not_found("server", "server_id"),
        PreviewError::Unavailable(e) if e.code == McpErrorCode::InvalidArguments => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_user_authorization",
            e.message,
        )
        .with_field("server_id"),
        PreviewError::Unavailable(e) => {
            ApiError::new(StatusCode::BAD_GATEWAY, "authorization_failed", e.message)
                .with_field("server_id")
        }
    }
}

/// `POST /v1/authorizations/{server_id}/{principal}`: starts a flow and answers its
/// authorization URL for the person to open; the browser comes back to the callback.
pub(super) async fn start(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = target(&state, &caller, path)?;
    let flows = state.flows.clone();
    let Some(redirect_uri) = flows.redirect_uri.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "authorization_disabled",
            "this node starts no user authorization: set `[serve] public_url` in quiver.toml to the URL browsers reach it at",
        )
        .with_field("path"));
    };
    let (started_tx, started_rx) = oneshot::channel();
    {
        let mut table = flows.table();
        let now = Instant::now();
        // A browser that never came back frees its place.
        table.flows.retain(|_, flow| {
            let live = flow.expires > now;
            if !live {
                flow.task.abort();
            }
            live
        });
        if let Some(old) = table.flows.remove(&key) {
            old.task.abort();
        }
        if table.flows.len() >= defaults::AUTHORIZATION_MAX_PENDING {
            return Err(ApiError::busy(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_authorizations",
                format!(
                    "{} authorizations are waiting for a browser; retry when one ends or expires",
                    defaults::AUTHORIZATION_MAX_PENDING
                ),
            ));
        }
        table.next_id += 1;
        let id = table.next_id;
        let expires = now + flows.timeout;
        let authorizer = Arc::new(FlowAuthorizer {
            flows: flows.clone(),
            key: key.clone(),
            id,
            redirect_uri,
            expires,
            started: Mutex::new(Some(started_tx)),
            done: Mutex::new(None),
        });
        let host = state.host.clone();
        let task = tokio::spawn(run_flow(host, authorizer));
        table.flows.insert(
            key.clone(),
            Flow {
                id,
                expires,
                state: None,
                callback: None,
                task: task.abort_handle(),
            },
        );
    }
    let url = match tokio::time::timeout(defaults::AUTHORIZATION_START_TIMEOUT, started_rx).await {
        Ok(Ok(answer)) => answer?,
        Ok(Err(_)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "authorization_replaced",
                "another request started an authorization of this server for this principal meanwhile",
            ));
        }
        Err(_) => {
            flows.cancel(&key);
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "authorization_failed",
                format!(
                    "the authorization server did not get ready within {} s",
                    defaults::AUTHORIZATION_START_TIMEOUT.as_secs()
                ),
            )
            .with_field("server_id"));
        }
    };
    tracing::info!(server_id = %key.server_id, principal = %key.principal, client = caller.name(), "user authorization started");
    Ok(axum::Json(json!({
        "server_id": key.server_id,
        "principal": key.principal,
        "authorization_url": url,
        "expires_in_ms": u64::try_from(flows.timeout.as_millis()).unwrap_or(u64::MAX),
    }))
    .into_response())
}

/// One flow, from discovery to the grant; tells the starting request or the callback's
/// page how it ended.
async fn run_flow(host: quiver::Host, authorizer: Arc<FlowAuthorizer>) {
    let key = authorizer.key.clone();
    let outcome = host
        .authorize_server_with(&key.server_id, &key.principal, authorizer.clone())
        .await;
    authorizer.flows.finish(&key, authorizer.id);
    match &outcome {
        Ok(()) => {
            tracing::info!(server_id = %key.server_id, principal = %key.principal, "user authorization granted")
        }
        Err(e) => {
            tracing::warn!(server_id = %key.server_id, principal = %key.principal, error = %e, "user authorization failed")
        }
    }
    if let Some(started) = authorizer.take_started() {
        let _ = started.send(Err(match outcome {
            Ok(()) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the authorization ended without asking a person",
            ),
            Err(e) => refused(e),
        }));
        return;
    }
    if let Some(done) = authorizer.take_done() {
        let _ = done.send(outcome.map_err(|e| e.to_string()));
    }
}

/// `GET /v1/authorizations/{server_id}/{principal}`: whether the principal has a grant,
/// its scopes and expiry (never a token), and whether a flow is waiting for a browser.
pub(super) async fn status(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = target(&state, &caller, path)?;
    let grant = state
        .host
        .grant_status(&key.server_id, &key.principal)
        .await
        .map_err(refused)?;
    Ok(axum::Json(json!({
        "server_id": key.server_id,
        "principal": key.principal,
        "authorized": grant.is_some(),
        "scopes": grant.as_ref().map(|g| g.scopes.clone()).unwrap_or_default(),
        "expires_at": grant.as_ref().and_then(|g| g.expires_at),
        "refreshable": grant.as_ref().is_some_and(|g| g.refreshable),
        "pending": state.flows.is_pending(&key),
    }))
    .into_response())
}

/// `DELETE /v1/authorizations/{server_id}/{principal}`: forgets the grant (and cancels a
/// pending flow); the principal's open connection to the server is closed.
pub(super) async fn revoke(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = target(&state, &caller, path)?;
    let cancelled = state.flows.cancel(&key);
    let revoked = state
        .host
        .revoke_server(&key.server_id, &key.principal)
        .await
        .map_err(refused)?;
    tracing::info!(server_id = %key.server_id, principal = %key.principal, client = caller.name(), revoked, "user authorization revoked");
    Ok(axum::Json(json!({
        "server_id": key.server_id,
        "principal": key.principal,
        "revoked": revoked,
        "cancelled_pending": cancelled,
    }))
    .into_response())
}

/// `GET /oauth/callback?code=..&state=..[&iss=..]` (or `?error=..&state=..`): where the
/// authorization server sends the person's browser. Authorised by `state` alone: unknown,
/// used or expired is a `400` page. Answers once the code was exchanged.
pub(super) async fn callback(
    State(state): State<Arc<NodeState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let param = |name: &str| {
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let Some(flow_state) = param("state").filter(|s| !s.is_empty() && s.len() <= 512) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            "The request has no state. Open the authorization URL the node gave, not this address.",
        );
    };
    let Some((key, callback)) = state.flows.take_by_state(&flow_state) else {
        // Debug only: anyone can send these, and a flood must not flood the log.
        tracing::debug!("an authorization callback with an unknown, used or expired state");
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            "This authorization is unknown, was already used, or has expired. Start it again from the admin page or the API.",
        );
    };
    let redirect = match (param("error"), &state.flows.redirect_uri) {
        (Some(error), _) => {
            let description = param("error_description").unwrap_or_default();
            let text = format!("the authorization server answered `{error}`: {description}");
            let text = quiver::text::printable(&text);
            Err(quiver::text::cut(&text, defaults::AUTHORIZATION_ERROR_MAX_BYTES).to_owned())
        }
        (None, Some(redirect_uri)) => Ok(format!("{redirect_uri}?{query}")),
        (None, None) => Err("this node has no public URL".to_owned()),
    };
    let (done_tx, done_rx) = oneshot::channel();
    let _ = callback.send(Callback {
        redirect,
        done: done_tx,
    });
    let what = format!("server `{}` for `{}`", key.server_id, key.principal);
    match tokio::time::timeout(defaults::AUTHORIZATION_FINISH_TIMEOUT, done_rx).await {
        Ok(Ok(Ok(()))) => page(
            StatusCode::OK,
            "Authorized",
            &format!("Quiver may now use {what}. You can close this window."),
        ),
        Ok(Ok(Err(error))) => page(
            StatusCode::BAD_REQUEST,
            "Authorization failed",
            &format!("Authorizing {what} failed: {error}"),
        ),
        Ok(Err(_)) | Err(_) => page(
            StatusCode::BAD_REQUEST,
            "Authorization failed",
            &format!("Authorizing {what} did not finish; start it again."),
        ),
    }
}

/// A small HTML page, its text escaped; no script, nothing loaded.
fn page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{0}</title></head><body><h1>{0}</h1><p>{1}</p></body></html>",
        escape(title),
        escape(text)
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, "default-src 'none'"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // The URL holds the code: never sent on as a Referer.
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `text` safe inside HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The value of `name` in `url`'s query.
fn query_param(url: &str, name: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_url_is_https_or_http_on_loopback() {
        assert_eq!(
            redirect_uri("https://quiver.example.com/").as_deref(),
            Ok("https://quiver.example.com/oauth/callback")
        );
        assert_eq!(
            redirect_uri("https://example.com/quiver").as_deref(),
            Ok("https://example.com/quiver/oauth/callback")
        );
        assert!(redirect_uri("http://127.0.0.1:8080").is_ok());
        assert!(redirect_uri("http://[::1]:8080").is_ok());
        assert!(redirect_uri("http://localhost:8080").is_ok());
        for bad in [
            "http://quiver.example.com",
            "http://10.0.0.1",
            "ftp://example.com",
            "https://u:p@example.com",
            "https://example.com/?a=b",
            "https://example.com/#x",
            "not a url",
        ] {
            assert!(redirect_uri(bad).is_err(), "{bad}");
        }
        let plain = redirect_uri("http://node.internal").unwrap_err();
        assert!(plain.contains("loopback"), "{plain}");
    }

    #[tokio::test]
    async fn a_node_refuses_a_public_url_browsers_could_not_come_back_to() {
        let host = quiver::Host::builder().build().expect("host");
        let bind = |url: &str| {
            let config =
                crate::NodeConfig::new("127.0.0.1:0".parse().expect("addr")).with_public_url(url);
            crate::Node::bind(host.clone(), config)
        };
        let refused = |result: Result<crate::Node, crate::ServeError>| match result {
            Ok(_) => panic!("a node started"),
            Err(e) => e.to_string(),
        };
        let clear = refused(bind("http://node.example").await);
        assert!(
            clear.contains("NodeConfig::with_public_url") && clear.contains("loopback"),
            "{clear}"
        );
        let unserved = refused(bind("https://node.example").await);
        assert!(unserved.contains("allowed_hosts"), "{unserved}");
        assert!(bind("http://127.0.0.1:8080").await.is_ok());
        host.shutdown().await;
    }

    #[test]
    fn page_text_is_escaped() {
        assert_eq!(
            escape("<script>\"x\"&'y'</script>"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;y&#39;&lt;/script&gt;"
        );
    }
}
