//! User authorization through the node: a client with the `authorize` role starts the
//! OAuth authorization code flow of a server for a principal it may act for
//! (`POST /v1/authorizations/{server_id}/{principal}`, answered with a node URL for a
//! person to open), the authorization server sends the person's browser back to the
//! node's own `GET /oauth/callback`, and the grant goes to the host's grant store. The
//! same route reads a grant's status (`GET`, never a token) and revokes it (`DELETE`).
//!
//! The flow is bound to the browser that carries it on (docs/security.md, "User
//! authorization through a node"):
//!
//! 1. The start answers `{public_url}/oauth/authorize/{handle}`, never the authorization
//!    server's URL. The handle is 32 random bytes, single use, and expires with the flow.
//! 2. `GET` there shows which server and principal the grant is for ("continue only if
//!    you are P"); its button posts to the same path, and that sets a `__Host-` cookie
//!    (Secure, HttpOnly, SameSite=Lax; random, the flow keeps only its digest) and
//!    redirects to the authorization server with `prompt=consent`.
//! 3. The callback needs the flow's `state` (single use) and that cookie, and clears it.
//!    A browser without it (someone else who got the authorization server's URL) gets the
//!    `400` page.
//!
//! Secrets are kept and compared as digests, in constant time over every flow. Pending
//! flows are bounded ([`defaults::AUTHORIZATION_MAX_PENDING`], one per server and
//! principal, [`defaults::AUTHORIZATION_MAX_PENDING_PER_CLIENT`] per client) and expire
//! (`[serve] authorization_timeout_ms`), so neither starts nor browsers can grow the node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::sync::oneshot;

use super::NodeState;
use super::auth::{Caller, same_digest};
use super::error::ApiError;
use crate::defaults;
use quiver::{AuthorizationPrompt, AuthorizeError, GrantKey, McpErrorCode, PreviewError};

pub(crate) use super::guard::{CALLBACK_PATH, START_PATH};

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
    random: SystemRandom,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    flows: HashMap<GrantKey, Flow>,
}

/// Secrets of a flow are kept as SHA-256 digests and compared with
/// [`same_digest`](super::auth::same_digest) over every flow, so neither the table nor the
/// time a lookup takes tells them.
type Digest = [u8; 32];

struct Flow {
    id: u64,
    expires: Instant,
    /// The client that started it (the per-client cap).
    client: String,
    /// The node URL's handle, until a browser proceeds from its page (single use).
    handle: Option<Digest>,
    /// The authorization server's URL, once known, until a browser proceeds.
    authorization_url: Option<String>,
    /// The flow's `state`, once its authorization URL is known, until its callback.
    state: Option<Digest>,
    /// The cookie of the browser that proceeded: only it may come back.
    cookie: Option<Digest>,
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

fn digest(secret: &str) -> Digest {
    Sha256::digest(secret.as_bytes()).into()
}

/// Why a browser's request for a flow was refused.
enum Refused {
    /// Unknown, used or expired.
    Unknown,
    /// The flow's `state`, but not the browser that proceeded from the node's page.
    OtherBrowser(GrantKey),
}

/// The name of the cookie binding flow `id` to the browser that proceeded: one per flow,
/// so a browser can run several at once. `__Host-`: only this origin can set it.
fn cookie_name(id: u64) -> String {
    format!("__Host-quiver-authorization-{id}")
}

impl Flows {
    pub(crate) fn new(redirect_uri: Option<String>, timeout: Duration) -> Self {
        Self {
            redirect_uri,
            timeout,
            random: SystemRandom::new(),
            table: Mutex::new(Table::default()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// 32 random bytes in hex, or `None` if the system has none.
    fn secret(&self) -> Option<String> {
        let mut bytes = [0u8; 32];
        self.random.fill(&mut bytes).ok()?;
        Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The node URL a person opens for the flow with `handle`.
    fn start_url(&self, handle: &str) -> Option<String> {
        let base = self.redirect_uri.as_deref()?.strip_suffix(CALLBACK_PATH)?;
        Some(format!("{base}{START_PATH}/{handle}"))
    }

    /// Ends the flow `id` of `key` if it is still the current one; its task, to abort
    /// unless it is the caller.
    fn finish(&self, key: &GrantKey, id: u64) -> Option<tokio::task::AbortHandle> {
        let mut table = self.table();
        if table.flows.get(key).is_some_and(|f| f.id == id) {
            return table.flows.remove(key).map(|f| f.task);
        }
        None
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

    /// The live flow whose secret `pick` gives equals `secret`: every flow is compared.
    fn find<'t>(
        table: &'t mut Table,
        secret: &str,
        pick: impl Fn(&Flow) -> Option<&Digest>,
    ) -> Option<(&'t GrantKey, &'t mut Flow)> {
        let given = digest(secret);
        let now = Instant::now();
        let mut found = None;
        for (key, flow) in table.flows.iter_mut() {
            let same = pick(flow).is_some_and(|d| same_digest(d, &given));
            if same && flow.expires > now {
                found = Some((key, flow));
            }
        }
        found
    }

    /// The server and principal of the unused, live flow with `handle`.
    fn by_handle(&self, handle: &str) -> Option<GrantKey> {
        let mut table = self.table();
        Self::find(&mut table, handle, |f| f.handle.as_ref()).map(|(key, _)| key.clone())
    }

    /// A browser proceeds from the node's page of `handle` (single use): the flow's
    /// authorization URL, and the cookie (name, value, seconds left) that binds the flow
    /// to that browser.
    fn proceed(&self, handle: &str) -> Option<(String, String, String, u64)> {
        let cookie = self.secret()?;
        let mut table = self.table();
        let (_, flow) = Self::find(&mut table, handle, |f| f.handle.as_ref())?;
        let url = flow.authorization_url.take()?;
        flow.handle = None;
        flow.cookie = Some(digest(&cookie));
        let left = flow.expires.saturating_duration_since(Instant::now());
        Some((url, cookie_name(flow.id), cookie, left.as_secs().max(1)))
    }

    /// Takes the flow whose `state` this is, if it has not expired and `cookies` hold the
    /// cookie of the browser that proceeded to it: single use. The flow's cookie name.
    fn take_by_state(
        &self,
        state: &str,
        cookies: &HeaderMap,
    ) -> Result<(GrantKey, String, oneshot::Sender<Callback>), Refused> {
        let mut table = self.table();
        let (key, flow) =
            Self::find(&mut table, state, |f| f.state.as_ref()).ok_or(Refused::Unknown)?;
        let name = cookie_name(flow.id);
        let bound = flow.cookie.as_ref().is_some_and(|expected| {
            cookie_values(cookies, &name).any(|value| same_digest(expected, &digest(value)))
        });
        if !bound {
            return Err(Refused::OtherBrowser(key.clone()));
        }
        flow.state = None;
        flow.cookie = None;
        let callback = flow.callback.take().ok_or(Refused::Unknown)?;
        Ok((key.clone(), name, callback))
    }
}

/// The values of the cookies called `name` in `headers`.
fn cookie_values<'h>(headers: &'h HeaderMap, name: &'h str) -> impl Iterator<Item = &'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// The [`UserAuthorizer`](quiver::UserAuthorizer) of one flow: keeps its authorization URL
/// for the browser that proceeds from the node's page, tells the starting request it is
/// ready, and waits for that browser at the node's callback.
struct FlowAuthorizer {
    flows: Arc<Flows>,
    key: GrantKey,
    id: u64,
    redirect_uri: String,
    expires: Instant,
    /// That the authorization URL is known (or why there is none), to the starting request.
    started: Mutex<Option<oneshot::Sender<Result<(), ApiError>>>>,
    /// How the flow ended, to the callback's page.
    done: Mutex<Option<oneshot::Sender<Result<(), String>>>>,
}

impl FlowAuthorizer {
    fn take_started(&self) -> Option<oneshot::Sender<Result<(), ApiError>>> {
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
            let url = with_consent_prompt(&prompt.url)
                .ok_or_else(|| AuthorizeError("the authorization URL is not a URL".into()))?;
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
                flow.state = Some(digest(&state));
                flow.authorization_url = Some(url);
                flow.callback = Some(tx);
            }
            if let Some(started) = self.take_started() {
                let _ = started.send(Ok(()));
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

/// `url` asking the authorization server to show its consent screen (OpenID Connect
/// `prompt=consent`) rather than approve silently a person already logged in there: the
/// person sees which account and what they grant.
fn with_consent_prompt(url: &str) -> Option<String> {
    let mut url = url::Url::parse(url).ok()?;
    if !url.query_pairs().any(|(k, _)| k == "prompt") {
        url.query_pairs_mut().append_pair("prompt", "consent");
    }
    Some(url.into())
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
        // Only pinning refuses this way; an authorization never does.
        PreviewError::NotPinnable(message) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "not_pinnable", message)
        }
    }
}

/// `POST /v1/authorizations/{server_id}/{principal}`: starts a flow and answers the node
/// URL a person opens (single use, until the flow expires): the node's page there names
/// the server and principal, and sends the browser on to the authorization server.
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
    let handle = flows.secret().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the system gave no random bytes",
        )
    })?;
    let url = flows.start_url(&handle).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the node's redirect URI does not end in its callback path",
        )
    })?;
    let (started_tx, started_rx) = oneshot::channel();
    let id = {
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
        let client = caller.name();
        let own = table.flows.values().filter(|f| f.client == client).count();
        let (full, cap) = if own >= defaults::AUTHORIZATION_MAX_PENDING_PER_CLIENT {
            (
                format!("client `{client}` has"),
                defaults::AUTHORIZATION_MAX_PENDING_PER_CLIENT,
            )
        } else {
            (
                "the node has".to_owned(),
                defaults::AUTHORIZATION_MAX_PENDING,
            )
        };
        if own >= cap || table.flows.len() >= cap {
            return Err(ApiError::busy(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_authorizations",
                format!(
                    "{full} {cap} authorizations waiting for a browser; retry when one ends or expires"
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
                client: client.to_owned(),
                handle: Some(digest(&handle)),
                authorization_url: None,
                state: None,
                cookie: None,
                callback: None,
                task: task.abort_handle(),
            },
        );
        id
    };
    match tokio::time::timeout(defaults::AUTHORIZATION_START_TIMEOUT, started_rx).await {
        Ok(Ok(answer)) => answer?,
        Ok(Err(_)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "authorization_replaced",
                "another request started an authorization of this server for this principal meanwhile",
            ));
        }
        Err(_) => {
            // This flow only: a newer one for the same key is another request's.
            if let Some(task) = flows.finish(&key, id) {
                task.abort();
            }
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
    }
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

/// The flow's handle from a `/oauth/authorize/{handle}` path: 64 hex digits.
fn handle_of(path: Result<Path<String>, PathRejection>) -> Option<String> {
    let Path(handle) = path.ok()?;
    (handle.len() == 64 && handle.bytes().all(|b| b.is_ascii_hexdigit())).then_some(handle)
}

const UNKNOWN_LINK: &str = "This authorization link is unknown, was already used, or has expired. Start the authorization again from the admin page or the API, and open the new link in your own browser.";

/// `GET /oauth/authorize/{handle}`: the node's page a person opens, naming the server and
/// the principal the grant will serve, with a button (a same-origin form, no script) that
/// posts to the same path. Showing it uses nothing up.
pub(super) async fn consent(
    State(state): State<Arc<NodeState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let found = handle_of(path).and_then(|h| state.flows.by_handle(&h).map(|key| (h, key)));
    let Some((handle, key)) = found else {
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            UNKNOWN_LINK,
        );
    };
    let Some(action) = state.flows.start_url(&handle) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            UNKNOWN_LINK,
        );
    };
    let (server, principal) = (escape(&key.server_id), escape(&key.principal));
    let body = format!(
        "<p>Authorize server <b>{server}</b> for principal <b>{principal}</b>.</p>\
         <p><b>Continue only if you are {principal}.</b> The account you log in with next \
         is used for every task of {principal} that calls {server}: if someone sent you this \
         link to act for another principal, close this window.</p>\
         <form method=\"post\" action=\"{}\"><button type=\"submit\">Continue to log in</button></form>",
        escape(&action)
    );
    let mut response = page_html(StatusCode::OK, "Authorize a server", &body);
    // Under `no-referrer` a browser posts the form with `Origin: null` (Fetch), which the
    // node's guard refuses; `same-origin` gives the node its own origin and still sends
    // the handle in this URL to no one else.
    response.headers_mut().insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// `POST /oauth/authorize/{handle}`: the browser proceeds from the node's page (single
/// use). It gets a `__Host-` cookie whose value the flow keeps as a digest, and is sent on
/// to the authorization server; only a browser with that cookie may finish the flow at
/// the callback.
pub(super) async fn proceed(
    State(state): State<Arc<NodeState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let Some((url, name, value, max_age)) = handle_of(path).and_then(|h| state.flows.proceed(&h))
    else {
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            UNKNOWN_LINK,
        );
    };
    let cookie =
        format!("{name}={value}; Path=/; Max-Age={max_age}; Secure; HttpOnly; SameSite=Lax");
    let mut response = page(
        StatusCode::SEE_OTHER,
        "Continue to log in",
        "Your browser is being sent to the authorization server.",
    );
    let headers = response.headers_mut();
    match (HeaderValue::try_from(url), HeaderValue::try_from(cookie)) {
        (Ok(location), Ok(cookie)) => {
            headers.insert(header::LOCATION, location);
            headers.insert(header::SET_COOKIE, cookie);
            response
        }
        _ => page(
            StatusCode::BAD_GATEWAY,
            "Authorization failed",
            "The authorization server's URL cannot be sent as a redirect. Start the authorization again.",
        ),
    }
}

/// `GET /oauth/callback?code=..&state=..[&iss=..]` (or `?error=..&state=..`): where the
/// authorization server sends the person's browser. Authorised by `state` (single use)
/// and the cookie of the browser that proceeded from the node's page: anything else is a
/// `400` page. Answers once the code was exchanged, and clears the cookie.
pub(super) async fn callback(
    State(state): State<Arc<NodeState>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let pairs = || url::form_urlencoded::parse(query.as_bytes());
    // One value each: a repeated one could be read one way here and another by rmcp.
    for name in ["state", "code", "iss", "error"] {
        if pairs().filter(|(k, _)| k == name).nth(1).is_some() {
            return page(
                StatusCode::BAD_REQUEST,
                "Authorization not accepted",
                &format!(
                    "The request repeats the parameter `{name}`. Open the link the node gave, not this address."
                ),
            );
        }
    }
    let param = |name: &str| {
        pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let Some(flow_state) = param("state").filter(|s| !s.is_empty() && s.len() <= 512) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Authorization not accepted",
            "The request has no state. Open the link the node gave, not this address.",
        );
    };
    let (key, cookie, callback) = match state.flows.take_by_state(&flow_state, &headers) {
        Ok(found) => found,
        Err(Refused::Unknown) => {
            // Debug only: anyone can send these, and a flood must not flood the log.
            tracing::debug!("an authorization callback with an unknown, used or expired state");
            return page(
                StatusCode::BAD_REQUEST,
                "Authorization not accepted",
                "This authorization is unknown, was already used, or has expired. Start it again from the admin page or the API.",
            );
        }
        Err(Refused::OtherBrowser(key)) => {
            // The state is secret: whoever sent it had the authorization server's URL.
            tracing::warn!(server_id = %key.server_id, principal = %key.principal, "an authorization callback from a browser that did not start the flow was refused");
            return page(
                StatusCode::BAD_REQUEST,
                "Authorization not accepted",
                "This browser did not start this authorization: finish it in the browser that opened the node's authorization link, or start it again.",
            );
        }
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
    let mut response =
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
        };
    let clear = format!("{cookie}=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=Lax");
    if let Ok(clear) = HeaderValue::try_from(clear) {
        response.headers_mut().insert(header::SET_COOKIE, clear);
    }
    response
}

/// A small HTML page of plain text, escaped.
fn page(status: StatusCode, title: &str, text: &str) -> Response {
    page_html(status, title, &format!("<p>{}</p>", escape(text)))
}

/// A small HTML page around `body` (HTML the caller escaped); no script, nothing loaded,
/// never framed.
fn page_html(status: StatusCode, title: &str, body: &str) -> Response {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{0}</title></head><body><h1>{0}</h1>{body}</body></html>",
        escape(title),
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, "default-src 'none'"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // The URL holds the code or the handle: never sent on as a Referer.
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
