//! A small OAuth 2.0 authorization server for tests: the client-credentials grant, the
//! authorization code grant with PKCE and refresh tokens (for user authorization), the RFC
//! 8693 token-exchange grant, RFC 7591 dynamic registration, RFC 7662 token introspection
//! and RFC 8414 or OpenID metadata.
//!
//! [`TokenServer`] is a real HTTP server on `127.0.0.1:<random port>`:
//!
//! - `POST /token` (form-encoded): `grant_type=client_credentials`, the client authenticated by
//!   HTTP Basic (`client_secret_basic`) or by `client_id` / `client_secret` form fields
//!   (`client_secret_post`), or by a `private_key_jwt` client assertion (ES256, verified
//!   against [`AsOptions::jwt_public_key`]: signature, `iss` = `sub` = the client,
//!   `aud` = the issuer, `exp` in the future); only the methods in
//!   [`AsOptions::auth_methods`] are accepted (`none`: a `client_id` form field alone);
//!   optional `scope` and `resource`. `grant_type=urn:ietf:params:oauth:grant-type:token-exchange`
//!   needs a `subject_token` and a `subject_token_type` (else `400 invalid_request`) and
//!   answers with `issued_token_type` = the `requested_token_type` (default access token);
//!   the subject token and `audience` are recorded. Success is
//!   `{"access_token": "tok-<n>-<random>", "token_type": "Bearer", "expires_in": secs,
//!   "scope": ...}` (`scope` only when one was requested). A wrong client is
//!   `401 {"error": "invalid_client"}`, another grant type `400 {"error":
//!   "unsupported_grant_type"}`, a request without `grant_type` `400 {"error":
//!   "invalid_request"}`. Every request is recorded, see [`TokenServer::token_requests`].
//! - As an enterprise IdP ([`AsOptions::id_jag_client_id`]): a token exchange with
//!   `requested_token_type=urn:ietf:params:oauth:token-type:id-jag` answers with an ID-JAG
//!   (`typ` `oauth-id-jag+jwt`, `iss` = the issuer, `aud` = the `audience`, `client_id`
//!   = the option, `resource`, `scope` when asked, a random signature no one checks),
//!   `token_type` `N_A`. As the MCP server's authorization server: the RFC 7523
//!   `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` with an `assertion` whose
//!   `aud` is this issuer (else `400 invalid_grant`) is answered like client credentials;
//!   the assertion is recorded.
//! - DPoP (RFC 9449, [`AsOptions::dpop`]) for the authorization code and refresh grants:
//!   the metadata lists `dpop_signing_alg_values_supported: ["ES256"]`, and the `DPoP`
//!   proof is checked (`typ` `dpop+jwt`, ES256 signature by its `jwk`, no private part,
//!   `htm` POST, `htu` the token endpoint, `iat` within 5 minutes, a `jti` never seen
//!   before); a bad or missing one is `400 invalid_dpop_proof`, a token is issued with
//!   `token_type` `DPoP`. See [`DpopMode`] for nonces and hostile modes;
//!   [`TokenServer::dpop_outcomes`] records each check.
//! - `POST /introspect` (form `token=...`): `{"active": true, "client_id", "exp", "scope"?,
//!   "token_type": "Bearer"}` while the token is issued, not revoked and not expired (by the
//!   real clock), else `{"active": false}`.
//! - `GET /.well-known/oauth-authorization-server` (RFC 8414) or, with
//!   [`AsOptions::openid_only`], only `GET /.well-known/openid-configuration`: the server's
//!   metadata, listing `auth_methods`.
//!
//! - `GET /authorize`: "logs in" the user named by the `x-test-user` header the test's
//!   HTTP client sends ([`USER_HEADER`]); without it, a login and consent page for a real
//!   browser: a form with the request's parameters, a `user` field and an Approve button
//!   that posts to `POST /authorize`, which then answers as `GET` with that header would.
//!   Both need `response_type=code`, a registered `client_id`
//!   (or the configured one) with its `redirect_uri` (any `http://127.0.0.1:` one for the
//!   configured client), `code_challenge_method=S256` with a `code_challenge`, `state`
//!   and `resource`. Answers `302` to `redirect_uri?code=..&state=..&iss=<issuer>`
//!   ([`AsOptions::authorize_iss`] forges the `iss`); a refusal is a `400` with the reason
//!   as text. Every accepted request is recorded, see [`TokenServer::authorizations`].
//! - `POST /token` with `grant_type=authorization_code` (a public client: `client_id`
//!   in the form): the code is single-use and must come with the same client and
//!   `redirect_uri` and a `code_verifier` whose S256 is the challenge; with
//!   `grant_type=refresh_token`: the refresh token is rotated (the old one stops working).
//!   Both issue `<user>-<n>-<random>` access tokens (so the fixture's `whoami` tells users
//!   apart) and `rt-<user>-<n>-<random>` refresh tokens; a bad code or refresh token is
//!   `400 {"error": "invalid_grant"}`.
//! - `POST /revoke` (RFC 7009, form `token=..` and maybe `token_type_hint`), listed as
//!   `revocation_endpoint` unless [`AsOptions::no_revocation`]: the client authenticates as
//!   at the token endpoint (a public client by `client_id`); an access token is deactivated,
//!   a refresh token forgotten, when it is that client's; always `200` (the RFC's answer to
//!   an unknown token) after [`AsOptions::revocation_delay`]. Every request is recorded,
//!   see [`TokenServer::revocations`].
//! - `POST /register` (RFC 7591, JSON): registers a public client for its `redirect_uris`
//!   and answers `201` with `client_id` `dyn-<n>`.
//!
//! A token is active for exactly the `ttl` given to [`TokenServer::start`]; `expires_in` reports
//! it in whole seconds (rounded down, at least 1), so a sub-second `ttl` makes tokens expire
//! before the client expects. [`TokenServer::revoke_all`] deactivates every access token issued
//! so far (to force a 401 and a refresh; refresh tokens stay good);
//! [`TokenServer::revoke_user`] deactivates one user's access and refresh tokens.
//!
//! ```ignore
//! let auth = TokenServer::start("client", "secret", Duration::from_secs(3600)).await;
//! let fixture = FixtureHttp::spawn("http", &["--bearer-introspect", &auth.introspect_url()]);
//! // ... point the host at fixture.url() with auth.token_url() ...
//! assert_eq!(auth.token_request_count(), 1);
//! ```
//!
//! Like [`crate::llm::ScriptedLlm`], the server runs on its own thread with its own Tokio
//! runtime and stops when the `TokenServer` is dropped.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;

use crate::serve::{BackgroundServer, Bound};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode, header};
use axum::routing::{get, post};
use serde_json::{Value, json};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";

/// One `POST /token` request, successful or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    /// The `grant_type` form field (empty if absent).
    pub grant_type: String,
    /// The client id presented (Basic or form), if any.
    pub client_id: Option<String>,
    /// Which client authentication was used: `"client_secret_basic"`, `"client_secret_post"` or
    /// `"none"`.
    pub auth_method: String,
    /// The `scope` form field.
    pub scope: Option<String>,
    /// The `resource` form field (RFC 8707).
    pub resource: Option<String>,
    /// The `subject_token` of a token exchange.
    pub subject_token: Option<String>,
    /// The `audience` of a token exchange.
    pub audience: Option<String>,
    /// The `requested_token_type` of a token exchange.
    pub requested_token_type: Option<String>,
    /// The `assertion` of a JWT bearer grant.
    pub assertion: Option<String>,
    /// With DPoP: the proof key's thumbprint, or why the proof was refused.
    pub dpop: Option<Result<String, String>>,
    /// The access token issued, or `None` if the request was refused.
    pub issued: Option<String>,
    /// The refresh token issued with it (authorization code and refresh grants).
    pub refresh_issued: Option<String>,
}

/// One accepted `GET /authorize` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizeRequest {
    /// The user the browser logged in as.
    pub user: String,
    pub client_id: String,
    pub redirect_uri: String,
    pub scope: Option<String>,
    pub resource: String,
    /// The OpenID Connect `prompt` parameter (`consent` asks for the consent screen).
    pub prompt: Option<String>,
}

/// One `POST /revoke` request (RFC 7009).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationRequest {
    /// The `token` form field.
    pub token: String,
    /// The `token_type_hint` form field.
    pub token_type_hint: Option<String>,
    /// The client id presented (Basic or form), if any.
    pub client_id: Option<String>,
    /// `"client_secret_basic"`, `"client_secret_post"` or `"none"`.
    pub auth_method: String,
    /// What was revoked: `"access_token"`, `"refresh_token"`, or `None` (unknown, or
    /// another client's).
    pub revoked: Option<String>,
}

/// The header a test's browser names its user in at `GET /authorize`.
pub const USER_HEADER: &str = "x-test-user";

struct Issued {
    client_id: String,
    /// The user of an authorization code or refresh grant.
    user: Option<String>,
    scope: Option<String>,
    expires_at: SystemTime,
    revoked: bool,
}

/// What an authorization code or a refresh token stands for.
#[derive(Clone)]
struct UserGrant {
    user: String,
    client_id: String,
    redirect_uri: String,
    scope: Option<String>,
    resource: String,
    /// The PKCE S256 challenge (codes only).
    challenge: String,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, Issued>,
    requests: Vec<TokenRequest>,
    introspections: usize,
    /// Dynamically registered clients: id -> redirect URIs.
    clients: HashMap<String, Vec<String>>,
    codes: HashMap<String, UserGrant>,
    refresh_tokens: HashMap<String, UserGrant>,
    authorizations: Vec<AuthorizeRequest>,
    revocations: Vec<RevocationRequest>,
    metadata_requests: usize,
    /// The `jti`s of DPoP proofs seen.
    dpop_jtis: std::collections::HashSet<String>,
}

struct Shared {
    client_id: String,
    client_secret: String,
    ttl: Duration,
    issuer: String,
    auth_methods: Vec<String>,
    jwt_public_key: Option<Vec<u8>>,
    options: AsOptions,
    inner: Mutex<Inner>,
}

/// How a [`TokenServer`] differs from the default one.
#[derive(Debug, Clone)]
pub struct AsOptions {
    /// The client authentication methods accepted and listed in the metadata (default
    /// Basic and post).
    pub auth_methods: Vec<String>,
    /// The client's EC P-256 public key (uncompressed point) for `private_key_jwt`.
    pub jwt_public_key: Option<Vec<u8>>,
    /// Metadata only at `/.well-known/openid-configuration`, none at the RFC 8414 URI.
    pub openid_only: bool,
    /// Hostile: this many bytes of padding in the metadata document.
    pub metadata_padding: usize,
    /// Hostile: a metadata field using serde_json's reserved key
    /// `$serde_json::private::RawValue`, which would turn its string into structure.
    pub metadata_hidden_values: bool,
    /// Hostile: wait this long before answering the metadata request.
    pub metadata_delay: Duration,
    /// Hostile: answer the metadata request with `307` to this URL.
    pub metadata_redirect: Option<String>,
    /// Hostile: the `iss` of the authorization response instead of the issuer.
    pub authorize_iss: Option<String>,
    /// Acts as an enterprise IdP: ID-JAGs for this client (at the MCP server's
    /// authorization server) are issued for token exchanges asking for one.
    pub id_jag_client_id: Option<String>,
    /// DPoP at the token endpoint for user grants.
    pub dpop: Option<DpopMode>,
    /// No `revocation_endpoint` in the metadata (and no `/revoke`).
    pub no_revocation: bool,
    /// Hostile: wait this long before answering a revocation.
    pub revocation_delay: Duration,
    /// Wait this long before answering a refresh grant (so two refreshes overlap).
    pub refresh_delay: Duration,
}

/// How a [`TokenServer`] treats DPoP proofs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DpopMode {
    /// Checks proofs and binds tokens; with a nonce, a proof without it gets
    /// `400 use_dpop_nonce` and `DPoP-Nonce: <nonce>`.
    Bind { nonce: Option<String> },
    /// Hostile: every token request gets `400 use_dpop_nonce` with a new nonce.
    NonceLoop,
    /// Hostile: proofs are ignored and tokens are bearer tokens.
    Unbound,
}

impl Default for AsOptions {
    fn default() -> Self {
        Self {
            auth_methods: vec!["client_secret_basic".into(), "client_secret_post".into()],
            jwt_public_key: None,
            openid_only: false,
            metadata_padding: 0,
            metadata_hidden_values: false,
            metadata_delay: Duration::ZERO,
            metadata_redirect: None,
            authorize_iss: None,
            id_jag_client_id: None,
            dpop: None,
            no_revocation: false,
            revocation_delay: Duration::ZERO,
            refresh_delay: Duration::ZERO,
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An OAuth 2.0 authorization server for tests; see the module docs.
pub struct TokenServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _server: BackgroundServer,
}

impl TokenServer {
    /// Binds `127.0.0.1:0` and serves until dropped; tokens live for `ttl`.
    pub async fn start(
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
        ttl: Duration,
    ) -> TokenServer {
        Self::start_blocking(client_id, client_secret, ttl)
    }

    /// [`TokenServer::start`] for synchronous tests; needs no Tokio runtime.
    pub fn start_blocking(
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
        ttl: Duration,
    ) -> TokenServer {
        Self::start_with(client_id, client_secret, ttl, AsOptions::default())
    }

    /// A server differing from the default as `options` say.
    pub fn start_with(
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
        ttl: Duration,
        options: AsOptions,
    ) -> TokenServer {
        let bound = Bound::new("token server");
        let addr = bound.addr;

        let shared = Arc::new(Shared {
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            ttl,
            issuer: format!("http://{addr}"),
            auth_methods: options.auth_methods.clone(),
            jwt_public_key: options.jwt_public_key.clone(),
            options: options.clone(),
            inner: Mutex::new(Inner::default()),
        });
        let metadata_path = if options.openid_only {
            "/.well-known/openid-configuration"
        } else {
            "/.well-known/oauth-authorization-server"
        };
        let router = Router::new()
            .route("/token", post(token))
            .route("/introspect", post(introspect))
            .route("/authorize", get(authorize).post(authorize_form))
            .route("/revoke", post(revoke))
            .route("/register", post(register))
            .route(metadata_path, get(metadata))
            .with_state(shared.clone());

        let server = bound.serve("token-server", router);

        TokenServer {
            addr,
            shared,
            _server: server,
        }
    }

    /// Each DPoP check of a token request: the key's thumbprint, or why it was refused.
    pub fn dpop_outcomes(&self) -> Vec<Result<String, String>> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter_map(|r| r.dpop.clone())
            .collect()
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn issuer(&self) -> String {
        self.shared.issuer.clone()
    }

    /// `http://127.0.0.1:PORT/token`.
    pub fn token_url(&self) -> String {
        format!("{}/token", self.shared.issuer)
    }

    /// `http://127.0.0.1:PORT/introspect`.
    pub fn introspect_url(&self) -> String {
        format!("{}/introspect", self.shared.issuer)
    }

    /// `http://127.0.0.1:PORT/.well-known/oauth-authorization-server`.
    pub fn metadata_url(&self) -> String {
        format!(
            "{}/.well-known/oauth-authorization-server",
            self.shared.issuer
        )
    }

    /// Every `POST /token` request received, in order (refused ones included).
    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.shared.lock().requests.clone()
    }

    /// How many `POST /token` requests were received (refused ones included).
    pub fn token_request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// How many tokens were issued.
    pub fn issued_count(&self) -> usize {
        self.shared.lock().tokens.len()
    }

    /// How many `POST /introspect` requests were received.
    pub fn introspect_count(&self) -> usize {
        self.shared.lock().introspections
    }

    /// Deactivates every access token issued so far; later tokens and refresh tokens are
    /// unaffected.
    pub fn revoke_all(&self) {
        for issued in self.shared.lock().tokens.values_mut() {
            issued.revoked = true;
        }
    }

    /// Deactivates `user`'s access tokens and refresh tokens (the user withdrew the grant).
    pub fn revoke_user(&self, user: &str) {
        let mut inner = self.shared.lock();
        for issued in inner.tokens.values_mut() {
            if issued.user.as_deref() == Some(user) {
                issued.revoked = true;
            }
        }
        inner.refresh_tokens.retain(|_, grant| grant.user != user);
    }

    /// Every `POST /revoke` request, in order.
    pub fn revocations(&self) -> Vec<RevocationRequest> {
        self.shared.lock().revocations.clone()
    }

    /// Every accepted `GET /authorize` request, in order.
    pub fn authorizations(&self) -> Vec<AuthorizeRequest> {
        self.shared.lock().authorizations.clone()
    }

    /// How many refresh tokens were exchanged for new tokens.
    pub fn refresh_count(&self) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.grant_type == "refresh_token" && r.issued.is_some())
            .count()
    }

    /// How many clients registered dynamically.
    pub fn registration_count(&self) -> usize {
        self.shared.lock().clients.len()
    }

    /// How many metadata requests arrived.
    pub fn metadata_count(&self) -> usize {
        self.shared.lock().metadata_requests
    }

    /// Every access and refresh token issued so far (to look for leaks).
    pub fn all_tokens(&self) -> Vec<String> {
        let inner = self.shared.lock();
        let mut all: Vec<String> = inner.tokens.keys().cloned().collect();
        all.extend(inner.refresh_tokens.keys().cloned());
        all.extend(
            inner
                .requests
                .iter()
                .filter_map(|r| r.refresh_issued.clone()),
        );
        all
    }

    /// Whether `token` is currently active (what `/introspect` would answer).
    pub fn is_active(&self, token: &str) -> bool {
        self.shared
            .lock()
            .tokens
            .get(token)
            .is_some_and(|t| !t.revoked && SystemTime::now() < t.expires_at)
    }
}

impl std::fmt::Debug for TokenServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenServer")
            .field("addr", &self.addr)
            .field("client_id", &self.shared.client_id)
            .field("token_requests", &self.token_request_count())
            .finish()
    }
}

async fn token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let form = parse_form(&body);
    let field = |name: &str| form.get(name).cloned();
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_basic);
    let assertion = field("client_assertion").filter(|_| {
        field("client_assertion_type").as_deref()
            == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
    });
    // A verified assertion stands in for the secret.
    let (auth_method, client_id, client_secret) = match (basic, assertion) {
        (Some((id, secret)), _) => ("client_secret_basic", Some(id), Some(secret)),
        (None, Some(jwt)) => match verify_assertion(&shared, &jwt) {
            Ok(id) => (
                "private_key_jwt",
                Some(id),
                Some(shared.client_secret.clone()),
            ),
            Err(why) => {
                eprintln!("token server: client assertion refused: {why}");
                ("private_key_jwt", None, None)
            }
        },
        (None, None)
            if form.contains_key("client_id")
                && !form.contains_key("client_secret")
                && shared.auth_methods.iter().any(|m| m == "none") =>
        {
            (
                "none",
                field("client_id"),
                Some(shared.client_secret.clone()),
            )
        }
        (None, None) if form.contains_key("client_id") => (
            "client_secret_post",
            field("client_id"),
            field("client_secret"),
        ),
        (None, None) => ("none", None, None),
    };
    let mut request = TokenRequest {
        grant_type: field("grant_type").unwrap_or_default(),
        client_id: client_id.clone(),
        auth_method: auth_method.to_owned(),
        scope: field("scope"),
        resource: field("resource"),
        subject_token: field("subject_token"),
        audience: field("audience"),
        requested_token_type: field("requested_token_type"),
        assertion: field("assertion"),
        dpop: None,
        issued: None,
        refresh_issued: None,
    };
    if matches!(
        request.grant_type.as_str(),
        "authorization_code" | "refresh_token"
    ) {
        let client_id = client_id.or_else(|| field("client_id"));
        if request.grant_type == "refresh_token" {
            tokio::time::sleep(shared.options.refresh_delay).await;
        }
        let bound = match check_dpop(&shared, &headers, &mut request) {
            Ok(bound) => bound,
            Err(refused) => {
                shared.lock().requests.push(request);
                return *refused;
            }
        };
        return user_token(&shared, request, client_id, &form, bound);
    }
    let exchange = request.grant_type == TOKEN_EXCHANGE;
    let jwt_bearer = request.grant_type == JWT_BEARER;
    let id_jag = exchange
        && request.requested_token_type.as_deref() == Some(ID_JAG)
        && shared.options.id_jag_client_id.is_some();

    let mut inner = shared.lock();
    let refusal = if request.grant_type.is_empty() {
        Some((StatusCode::BAD_REQUEST, "invalid_request"))
    } else if request.grant_type != "client_credentials" && !exchange && !jwt_bearer {
        Some((StatusCode::BAD_REQUEST, "unsupported_grant_type"))
    } else if jwt_bearer
        && request
            .assertion
            .as_deref()
            .and_then(jwt_claims)
            .is_none_or(|claims| claims["aud"] != shared.issuer.as_str())
    {
        Some((StatusCode::BAD_REQUEST, "invalid_grant"))
    } else if exchange
        && (request.subject_token.as_deref().is_none_or(str::is_empty)
            || field("subject_token_type").is_none())
    {
        Some((StatusCode::BAD_REQUEST, "invalid_request"))
    } else if client_id.as_deref() != Some(shared.client_id.as_str())
        || client_secret.as_deref() != Some(shared.client_secret.as_str())
        || !shared.auth_methods.iter().any(|m| m == auth_method)
    {
        Some((StatusCode::UNAUTHORIZED, "invalid_client"))
    } else {
        None
    };
    if let Some((status, error)) = refusal {
        inner.requests.push(request);
        drop(inner);
        let mut response = json_response(status, json!({"error": error}));
        if status == StatusCode::UNAUTHORIZED && auth_method == "client_secret_basic" {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"token\""),
            );
        }
        return response;
    }

    let access_token = match (id_jag, &shared.options.id_jag_client_id) {
        (true, Some(client)) => issue_id_jag(&shared.issuer, client, &request),
        _ => format!("tok-{}-{}", inner.tokens.len() + 1, random_hex()),
    };
    inner.tokens.insert(
        access_token.clone(),
        Issued {
            client_id: shared.client_id.clone(),
            user: None,
            scope: request.scope.clone(),
            expires_at: SystemTime::now() + shared.ttl,
            revoked: false,
        },
    );
    request.issued = Some(access_token.clone());
    let scope = request.scope.clone();
    inner.requests.push(request);
    drop(inner);

    let mut body = json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": shared.ttl.as_secs().max(1),
    });
    if let Some(scope) = scope {
        body["scope"] = json!(scope);
    }
    if exchange {
        body["issued_token_type"] = json!(
            field("requested_token_type")
                .unwrap_or_else(|| "urn:ietf:params:oauth:token-type:access_token".into())
        );
    }
    if id_jag {
        body["token_type"] = json!("N_A");
    }
    json_response(StatusCode::OK, body)
}

/// An ID-JAG for `request` (an IdP's answer): addressed to its `audience`, for `client`,
/// the user named by a hash of the subject token; the signature is random bytes.
fn issue_id_jag(issuer: &str, client: &str, request: &TokenRequest) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(
        request
            .subject_token
            .as_deref()
            .unwrap_or_default()
            .as_bytes(),
    );
    let mut claims = json!({
        "iss": issuer,
        "sub": format!("user-{:016x}", hasher.finish()),
        "aud": request.audience,
        "client_id": client,
        "jti": random_hex(),
        "iat": now,
        "exp": now + 300,
    });
    if let Some(resource) = &request.resource {
        claims["resource"] = json!(resource);
    }
    if let Some(scope) = &request.scope {
        claims["scope"] = json!(scope);
    }
    let header = json!({"alg": "ES256", "typ": "oauth-id-jag+jwt"});
    format!(
        "{}.{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes()),
        base64url(random_hex().as_bytes())
    )
}

/// The claims of a compact JWT, unverified.
pub fn jwt_claims(jwt: &str) -> Option<Value> {
    let payload = jwt.split('.').nth(1)?;
    serde_json::from_slice(&base64_decode(
        &payload.replace('-', "+").replace('_', "/"),
    )?)
    .ok()
}

/// Base64url without padding (for JWTs tests build).
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

async fn introspect(State(shared): State<Arc<Shared>>, body: Bytes) -> Response<Body> {
    let form = parse_form(&body);
    let mut inner = shared.lock();
    inner.introspections += 1;
    let now = SystemTime::now();
    let answer = match form.get("token").and_then(|t| inner.tokens.get(t)) {
        Some(issued) if !issued.revoked && now < issued.expires_at => {
            let exp = issued
                .expires_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
            let mut answer = json!({
                "active": true,
                "client_id": issued.client_id,
                "exp": exp,
                "token_type": "Bearer",
            });
            if let Some(scope) = &issued.scope {
                answer["scope"] = json!(scope);
            }
            if let Some(user) = &issued.user {
                answer["sub"] = json!(user);
            }
            answer
        }
        _ => json!({"active": false}),
    };
    drop(inner);
    json_response(StatusCode::OK, answer)
}

async fn metadata(State(shared): State<Arc<Shared>>) -> Response<Body> {
    shared.lock().metadata_requests += 1;
    let options = &shared.options;
    if !options.metadata_delay.is_zero() {
        tokio::time::sleep(options.metadata_delay).await;
    }
    if let Some(to) = &options.metadata_redirect {
        return Response::builder()
            .status(StatusCode::TEMPORARY_REDIRECT)
            .header(header::LOCATION, to.as_str())
            .body(Body::empty())
            .expect("token server: build redirect");
    }
    let issuer = &shared.issuer;
    let mut body = json!({
        "issuer": issuer,
        "token_endpoint": format!("{issuer}/token"),
        "introspection_endpoint": format!("{issuer}/introspect"),
        "authorization_endpoint": format!("{issuer}/authorize"),
        "registration_endpoint": format!("{issuer}/register"),
        "grant_types_supported": ["client_credentials", "authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": shared.auth_methods,
        "token_endpoint_auth_signing_alg_values_supported": ["ES256"],
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": true,
    });
    if options.metadata_padding > 0 {
        body["padding"] = json!("x".repeat(options.metadata_padding));
    }
    if options.metadata_hidden_values {
        body["extra"] = json!({"$serde_json::private::RawValue": "[[[1]]]"});
    }
    if options.dpop.is_some() {
        body["dpop_signing_alg_values_supported"] = json!(["ES256"]);
    }
    if !options.no_revocation {
        body["revocation_endpoint"] = json!(format!("{issuer}/revoke"));
    }
    json_response(StatusCode::OK, body)
}

/// `GET /authorize`: the user of [`USER_HEADER`] approves at once.
async fn authorize(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response<Body> {
    let query = parse_form(uri.query().unwrap_or_default().as_bytes());
    match headers
        .get(USER_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    {
        Some(user) => grant_code(&shared, &query, user),
        None => login_page(&query),
    }
}

/// `POST /authorize`: the login page's form, its `user` the person who approves.
async fn authorize_form(State(shared): State<Arc<Shared>>, body: Bytes) -> Response<Body> {
    let mut form = parse_form(&body);
    let user = form.remove("user").unwrap_or_default();
    if user.is_empty() {
        return login_page(&form);
    }
    grant_code(&shared, &form, &user)
}

/// The login and consent page a real browser sees: the request's parameters kept in
/// hidden fields, a `user` field, and an Approve button.
fn login_page(query: &HashMap<String, String>) -> Response<Body> {
    let hidden: String = query
        .iter()
        .map(|(name, value)| {
            format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                html_escape(name),
                html_escape(value)
            )
        })
        .collect();
    let client = html_escape(query.get("client_id").map_or("", String::as_str));
    let body = format!(
        "<!doctype html><html><head><title>Test authorization server</title></head><body>\
         <h1>Log in to the test authorization server</h1>\
         <p>Client <b id=\"client\">{client}</b> asks for access to your account.</p>\
         <form method=\"post\" action=\"/authorize\">{hidden}\
         <label>User <input id=\"user\" name=\"user\"></label>\
         <button id=\"approve\" type=\"submit\">Approve</button></form></body></html>"
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .body(Body::from(body))
        .expect("token server: build login page")
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `user` approves the authorization request `query`: a code, redirected to the client.
fn grant_code(shared: &Shared, query: &HashMap<String, String>, user: &str) -> Response<Body> {
    let field = |name: &str| query.get(name).cloned().unwrap_or_default();
    let refuse = |why: String| {
        Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Body::from(why))
            .expect("token server: build refusal")
    };
    let (client_id, redirect_uri) = (field("client_id"), field("redirect_uri"));
    let mut inner = shared.lock();
    let redirect_ok = match inner.clients.get(&client_id) {
        Some(uris) => uris.contains(&redirect_uri),
        None => client_id == shared.client_id && redirect_uri.starts_with("http://127.0.0.1:"),
    };
    let problem = if field("response_type") != "code" {
        Some("response_type must be code".to_owned())
    } else if !redirect_ok {
        Some(format!(
            "client {client_id:?} is unknown or did not register redirect_uri {redirect_uri:?}"
        ))
    } else if field("code_challenge_method") != "S256" || field("code_challenge").is_empty() {
        Some("PKCE with code_challenge_method=S256 is required".to_owned())
    } else if field("state").is_empty() {
        Some("state is required".to_owned())
    } else if field("resource").is_empty() {
        Some("resource is required".to_owned())
    } else {
        None
    };
    if let Some(why) = problem {
        return refuse(why);
    }
    let scope = query.get("scope").cloned();
    let grant = UserGrant {
        user: user.to_owned(),
        client_id: client_id.clone(),
        redirect_uri: redirect_uri.clone(),
        scope: scope.clone(),
        resource: field("resource"),
        challenge: field("code_challenge"),
    };
    let code = format!("code-{}", random_hex());
    inner.codes.insert(code.clone(), grant.clone());
    inner.authorizations.push(AuthorizeRequest {
        user: grant.user,
        client_id,
        redirect_uri: redirect_uri.clone(),
        scope,
        resource: grant.resource,
        prompt: query.get("prompt").cloned(),
    });
    drop(inner);
    let iss = shared
        .options
        .authorize_iss
        .clone()
        .unwrap_or_else(|| shared.issuer.clone());
    let separator = if redirect_uri.contains('?') { '&' } else { '?' };
    let location = format!(
        "{redirect_uri}{separator}code={}&state={}&iss={}",
        form_encode(&code),
        form_encode(&field("state")),
        form_encode(&iss)
    );
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, location)
        .body(Body::empty())
        .expect("token server: build redirect")
}

/// `POST /revoke` (RFC 7009): the client authenticated as at the token endpoint (a
/// public client by `client_id` alone) revokes one of its tokens; `200` whatever the token.
async fn revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    if shared.options.no_revocation {
        return json_response(StatusCode::NOT_FOUND, json!({"error": "not_found"}));
    }
    tokio::time::sleep(shared.options.revocation_delay).await;
    let form = parse_form(&body);
    let field = |name: &str| form.get(name).cloned();
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_basic);
    let (auth_method, client_id, secret) = match basic {
        Some((id, secret)) => ("client_secret_basic", Some(id), Some(secret)),
        None if form.contains_key("client_secret") => (
            "client_secret_post",
            field("client_id"),
            field("client_secret"),
        ),
        None => ("none", field("client_id"), None),
    };
    let mut inner = shared.lock();
    let known_client = client_id.as_ref().is_some_and(|id| {
        inner.clients.contains_key(id)
            || (*id == shared.client_id
                && secret.as_ref().is_none_or(|s| *s == shared.client_secret))
    });
    let token = field("token").unwrap_or_default();
    let mut request = RevocationRequest {
        token: token.clone(),
        token_type_hint: field("token_type_hint"),
        client_id: client_id.clone(),
        auth_method: auth_method.to_owned(),
        revoked: None,
    };
    if !known_client {
        inner.revocations.push(request);
        return json_response(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    }
    if let Some(issued) = inner.tokens.get_mut(&token)
        && Some(&issued.client_id) == client_id.as_ref()
    {
        issued.revoked = true;
        request.revoked = Some("access_token".into());
    } else if inner
        .refresh_tokens
        .get(&token)
        .is_some_and(|grant| Some(&grant.client_id) == client_id.as_ref())
    {
        inner.refresh_tokens.remove(&token);
        request.revoked = Some("refresh_token".into());
    }
    inner.revocations.push(request);
    drop(inner);
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::empty())
        .expect("token server: build revocation answer")
}

/// `POST /register` (RFC 7591): a public client for the redirect URIs given.
async fn register(State(shared): State<Arc<Shared>>, body: Bytes) -> Response<Body> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let uris: Vec<String> = request["redirect_uris"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if uris.is_empty() {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_redirect_uri"}),
        );
    }
    let mut inner = shared.lock();
    let client_id = format!("dyn-{}", inner.clients.len() + 1);
    inner.clients.insert(client_id.clone(), uris.clone());
    drop(inner);
    json_response(
        StatusCode::CREATED,
        json!({
            "client_id": client_id,
            "client_name": request["client_name"],
            "redirect_uris": uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        }),
    )
}

/// The authorization code and refresh token grants of a public client.
fn user_token(
    shared: &Shared,
    mut request: TokenRequest,
    client_id: Option<String>,
    form: &HashMap<String, String>,
    dpop_bound: bool,
) -> Response<Body> {
    let field = |name: &str| form.get(name).cloned().unwrap_or_default();
    let mut inner = shared.lock();
    let grant = if request.grant_type == "authorization_code" {
        // Single use: the code is gone whatever happens next.
        inner.codes.remove(&field("code")).filter(|grant| {
            grant.redirect_uri == field("redirect_uri")
                && pkce_s256(&field("code_verifier")) == grant.challenge
        })
    } else {
        // Rotated: the old refresh token is gone.
        inner.refresh_tokens.remove(&field("refresh_token"))
    };
    let grant = grant.filter(|grant| {
        Some(&grant.client_id) == client_id.as_ref()
            && request
                .resource
                .as_ref()
                .is_none_or(|resource| *resource == grant.resource)
    });
    let Some(grant) = grant else {
        inner.requests.push(request);
        drop(inner);
        return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
    };
    let n = inner.tokens.len() + 1;
    let access_token = format!("{}-{n}-{}", grant.user, random_hex());
    let refresh_token = format!("rt-{}-{n}-{}", grant.user, random_hex());
    inner.tokens.insert(
        access_token.clone(),
        Issued {
            client_id: grant.client_id.clone(),
            user: Some(grant.user.clone()),
            scope: grant.scope.clone(),
            expires_at: SystemTime::now() + shared.ttl,
            revoked: false,
        },
    );
    inner
        .refresh_tokens
        .insert(refresh_token.clone(), grant.clone());
    request.issued = Some(access_token.clone());
    request.refresh_issued = Some(refresh_token.clone());
    inner.requests.push(request);
    drop(inner);
    let mut body = json!({
        "access_token": access_token,
        "token_type": if dpop_bound { "DPoP" } else { "Bearer" },
        "expires_in": shared.ttl.as_secs().max(1),
        "refresh_token": refresh_token,
    });
    if let Some(scope) = grant.scope {
        body["scope"] = json!(scope);
    }
    json_response(StatusCode::OK, body)
}

/// The DPoP check of a user grant's token request: `Ok(true)` binds the token, `Ok(false)`
/// issues a bearer token, `Err` is the refusal to send.
fn check_dpop(
    shared: &Shared,
    headers: &HeaderMap,
    request: &mut TokenRequest,
) -> Result<bool, Box<Response<Body>>> {
    let Some(mode) = &shared.options.dpop else {
        return Ok(false);
    };
    let ask_nonce = |nonce: &str, request: &mut TokenRequest| {
        request.dpop = Some(Err("no nonce".into()));
        let mut response = json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "use_dpop_nonce", "error_description": "a nonce is needed"}),
        );
        if let Ok(value) = header::HeaderValue::from_str(nonce) {
            response.headers_mut().insert("dpop-nonce", value);
        }
        response
    };
    let nonce = match mode {
        DpopMode::Unbound => return Ok(false),
        DpopMode::NonceLoop => return Err(Box::new(ask_nonce(&random_hex(), request))),
        DpopMode::Bind { nonce } => nonce,
    };
    let proof = headers.get("dpop").and_then(|v| v.to_str().ok());
    let checked = match proof {
        Some(proof) => verify_dpop(shared, proof, &format!("{}/token", shared.issuer)),
        None => Err("no DPoP proof".to_owned()),
    };
    let claims = match checked {
        Ok(claims) => claims,
        Err(why) => {
            request.dpop = Some(Err(why.clone()));
            return Err(Box::new(json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_dpop_proof", "error_description": why}),
            )));
        }
    };
    if let Some(nonce) = nonce
        && claims.1["nonce"] != nonce.as_str()
    {
        return Err(Box::new(ask_nonce(nonce, request)));
    }
    request.dpop = Some(Ok(claims.0));
    Ok(true)
}

/// Checks a DPoP proof for `POST htu`: its key's thumbprint and its claims.
fn verify_dpop(shared: &Shared, proof: &str, htu: &str) -> Result<(String, Value), String> {
    let parts: Vec<&str> = proof.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err("not a compact JWT".into());
    };
    let decode = |part: &str| base64_decode(&part.replace('-', "+").replace('_', "/"));
    let header: Value = serde_json::from_slice(&decode(header).ok_or("header base64")?)
        .map_err(|e| format!("header: {e}"))?;
    if header["typ"] != "dpop+jwt" || header["alg"] != "ES256" {
        return Err(format!("typ/alg {header}"));
    }
    let jwk = &header["jwk"];
    if jwk.get("d").is_some() || jwk["kty"] != "EC" || jwk["crv"] != "P-256" {
        return Err("jwk is not a public P-256 key".into());
    }
    let coordinate = |name: &str| decode(jwk[name].as_str().unwrap_or_default());
    let (Some(x), Some(y)) = (coordinate("x"), coordinate("y")) else {
        return Err("jwk coordinates".into());
    };
    let point = [&[4u8][..], &x, &y].concat();
    let signature = decode(signature).ok_or("signature base64")?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
        .verify(
            &proof.as_bytes()[..proof.rfind('.').unwrap_or(0)],
            &signature,
        )
        .map_err(|_| "bad signature")?;
    let claims: Value = serde_json::from_slice(&decode(claims).ok_or("claims base64")?)
        .map_err(|e| format!("claims: {e}"))?;
    if claims["htm"] != "POST" {
        return Err(format!("htm {}", claims["htm"]));
    }
    if claims["htu"] != htu {
        return Err(format!("htu {} is not {htu}", claims["htu"]));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if claims["iat"]
        .as_u64()
        .is_none_or(|iat| iat.abs_diff(now) > 300)
    {
        return Err(format!("iat {}", claims["iat"]));
    }
    let jti = claims["jti"].as_str().unwrap_or_default().to_owned();
    if jti.is_empty() || !shared.lock().dpop_jtis.insert(jti) {
        return Err("replayed or missing jti".into());
    }
    let thumbprint_input = format!(
        "{{\"crv\":\"P-256\",\"kty\":\"EC\",\"x\":\"{}\",\"y\":\"{}\"}}",
        jwk["x"].as_str().unwrap_or_default(),
        jwk["y"].as_str().unwrap_or_default()
    );
    use sha2::Digest;
    let jkt = base64url(&sha2::Sha256::digest(thumbprint_input.as_bytes()));
    Ok((jkt, claims))
}

/// BASE64URL(SHA256(verifier)) without padding (RFC 7636 §4.2).
fn pkce_s256(verifier: &str) -> String {
    use sha2::Digest;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let digest = sha2::Sha256::digest(verifier.as_bytes());
    let mut out = String::new();
    for chunk in digest.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn json_response(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .expect("token server: build response")
}

/// 16 random hex digits (std's per-process random hash keys; good enough for test tokens).
fn random_hex() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", hasher.finish())
}

/// The client id of a valid ES256 client assertion: signature by the configured key,
/// `iss` = `sub` = the client, `aud` = the issuer, `exp` in the future, `iat` not ahead.
fn verify_assertion(shared: &Shared, jwt: &str) -> Result<String, String> {
    let key = shared
        .jwt_public_key
        .as_ref()
        .ok_or("no public key configured")?;
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err("not three parts".into());
    };
    let decode = |part: &str| base64_decode(&part.replace('-', "+").replace('_', "/"));
    let header: Value = serde_json::from_slice(&decode(header).ok_or("header base64")?)
        .map_err(|e| format!("header: {e}"))?;
    if header["alg"] != "ES256" {
        return Err(format!("alg {}", header["alg"]));
    }
    let signature = decode(signature).ok_or("signature base64")?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, key)
        .verify(&jwt.as_bytes()[..jwt.rfind('.').unwrap_or(0)], &signature)
        .map_err(|_| "bad signature")?;
    let claims: Value = serde_json::from_slice(&decode(claims).ok_or("claims base64")?)
        .map_err(|e| format!("claims: {e}"))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let client = claims["iss"].as_str().unwrap_or_default();
    if claims["sub"] != client || claims["aud"] != shared.issuer.as_str() {
        return Err(format!("claims {claims}"));
    }
    if claims["exp"].as_u64().unwrap_or(0) <= now
        || claims["iat"].as_u64().unwrap_or(u64::MAX) > now + 30
    {
        return Err(format!("times {claims}"));
    }
    Ok(client.to_owned())
}

/// Parses an `application/x-www-form-urlencoded` body; the first value of a name wins.
fn parse_form(body: &[u8]) -> HashMap<String, String> {
    let mut form = HashMap::new();
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        form.entry(form_decode(name))
            .or_insert_with(|| form_decode(value));
    }
    form
}

/// Decodes one form-urlencoded component (`+` is a space, `%XX` a byte).
fn form_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = raw
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `Authorization: Basic base64(id:secret)`, with id and secret form-decoded (RFC 6749 §2.3.1).
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64_decode(encoded.trim())?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some((form_decode(id.as_bytes()), form_decode(secret.as_bytes())))
}

/// Standard base64 with optional padding.
fn base64_decode(input: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in input.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::raw_http::{Answer, send};

    const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

    async fn post_form(
        server: &TokenServer,
        path: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut headers = vec![FORM];
        headers.extend_from_slice(extra);
        send(server.addr(), "POST", path, &headers, body).await
    }

    async fn introspect_token(server: &TokenServer, token: &str) -> Value {
        let answer = post_form(server, "/introspect", &[], &format!("token={token}")).await;
        assert_eq!(answer.status, 200);
        answer.json()
    }

    /// A DPoP proof for `POST htu` signed with `key`, with `jti`.
    fn dpop_proof(key: &ring::signature::EcdsaKeyPair, htu: &str, jti: &str) -> String {
        use ring::signature::KeyPair;
        let point = key.public_key().as_ref();
        let header = json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": {
            "kty": "EC", "crv": "P-256",
            "x": base64url(&point[1..33]), "y": base64url(&point[33..]),
        }});
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = json!({"htm": "POST", "htu": htu, "iat": now, "jti": jti});
        let input = format!(
            "{}.{}",
            base64url(header.to_string().as_bytes()),
            base64url(claims.to_string().as_bytes())
        );
        let rng = ring::rand::SystemRandom::new();
        let signature = key.sign(&rng, input.as_bytes()).unwrap();
        format!("{input}.{}", base64url(signature.as_ref()))
    }

    #[tokio::test]
    async fn dpop_proofs_are_checked_and_a_replayed_or_misaddressed_one_is_refused() {
        let server = TokenServer::start_with(
            "c",
            "s",
            Duration::from_secs(60),
            AsOptions {
                dpop: Some(DpopMode::Bind { nonce: None }),
                ..AsOptions::default()
            },
        );
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let token_url = server.token_url();
        let good = dpop_proof(&key, &token_url, "j1");
        let body = "grant_type=refresh_token&refresh_token=none&client_id=c";
        // A valid proof passes the DPoP check (the made-up refresh token does not).
        let answer = post_form(&server, "/token", &[("dpop", &good)], body).await;
        assert_eq!(answer.json()["error"], "invalid_grant");
        // The same proof again, one for another URL, and none: refused.
        let other = dpop_proof(&key, "http://127.0.0.1:1/token", "j2");
        for proof in [Some(good.as_str()), Some(other.as_str()), None] {
            let extra: Vec<(&str, &str)> = proof.map(|p| ("dpop", p)).into_iter().collect();
            let answer = post_form(&server, "/token", &extra, body).await;
            assert_eq!(answer.status, 400);
            assert_eq!(answer.json()["error"], "invalid_dpop_proof");
        }
        let outcomes = server.dpop_outcomes();
        assert!(outcomes[0].is_ok(), "{outcomes:?}");
        assert_eq!(outcomes[1], Err("replayed or missing jti".into()));
        assert!(
            outcomes[2].as_ref().unwrap_err().starts_with("htu"),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[3], Err("no DPoP proof".into()));
    }

    #[test]
    fn helpers_decode_forms_and_basic_credentials() {
        let form = parse_form(b"a=1&b=x+y%2Fz&a=2&flag&c=%zz&d=%4");
        assert_eq!(form["a"], "1");
        assert_eq!(form["b"], "x y/z");
        assert_eq!(form["flag"], "");
        assert_eq!(form["c"], "%zz");
        assert_eq!(form["d"], "%4");
        assert_eq!(
            base64_decode("Y2xpZW50OnNlY3JldA==").unwrap(),
            b"client:secret"
        );
        assert_eq!(base64_decode("YQ").unwrap(), b"a");
        assert_eq!(base64_decode("!").as_deref(), None);
        assert_eq!(
            parse_basic("Basic Y2xpZW50OnNlY3JldA=="),
            Some(("client".into(), "secret".into()))
        );
        // "a%3Ab:c+d" -> id "a:b", secret "c d"
        assert_eq!(
            parse_basic("basic YSUzQWI6YytkIA"),
            Some(("a:b".into(), "c d ".into()))
        );
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_ne!(random_hex(), random_hex());
    }

    #[tokio::test]
    async fn client_credentials_with_basic_auth_then_introspect() {
        let server = TokenServer::start("client", "secret", Duration::from_secs(3600)).await;
        assert!(server.issuer().starts_with("http://127.0.0.1:"));
        assert_eq!(server.token_url(), format!("{}/token", server.issuer()));
        assert_eq!(
            server.introspect_url(),
            format!("{}/introspect", server.issuer())
        );

        let answer = post_form(
            &server,
            "/token",
            &[("Authorization", "Basic Y2xpZW50OnNlY3JldA==")],
            "grant_type=client_credentials&scope=tools%3Aread+tools%3Acall&resource=http%3A%2F%2F127.0.0.1%3A1%2Fmcp",
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.header("cache-control"), Some("no-store"));
        let body = answer.json();
        let token = body["access_token"].as_str().unwrap().to_owned();
        assert!(token.starts_with("tok-1-"), "{token}");
        assert_eq!(body["token_type"], "Bearer");
        assert_eq!(body["expires_in"], 3600);
        assert_eq!(body["scope"], "tools:read tools:call");

        assert_eq!(server.token_request_count(), 1);
        assert_eq!(
            server.token_requests(),
            vec![TokenRequest {
                grant_type: "client_credentials".into(),
                client_id: Some("client".into()),
                auth_method: "client_secret_basic".into(),
                scope: Some("tools:read tools:call".into()),
                resource: Some("http://127.0.0.1:1/mcp".into()),
                subject_token: None,
                audience: None,
                requested_token_type: None,
                assertion: None,
                dpop: None,
                issued: Some(token.clone()),
                refresh_issued: None,
            }]
        );

        let active = introspect_token(&server, &token).await;
        assert_eq!(active["active"], true);
        assert_eq!(active["client_id"], "client");
        assert_eq!(active["scope"], "tools:read tools:call");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let exp = active["exp"].as_u64().unwrap();
        assert!(
            exp >= now + 3599 && exp <= now + 3601,
            "exp {exp}, now {now}"
        );
        assert!(server.is_active(&token));

        assert_eq!(
            introspect_token(&server, "tok-9-nope").await,
            json!({"active": false})
        );
        assert_eq!(
            post_form(&server, "/introspect", &[], "").await.json(),
            json!({"active": false})
        );
        assert_eq!(server.introspect_count(), 3);
    }

    #[tokio::test]
    async fn client_secret_post_and_refusals() {
        let server = TokenServer::start("client", "s3cr&t", Duration::from_secs(60)).await;

        let answer = post_form(
            &server,
            "/token",
            &[],
            "grant_type=client_credentials&client_id=client&client_secret=s3cr%26t",
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let body = answer.json();
        assert!(body["access_token"].as_str().unwrap().starts_with("tok-1-"));
        assert!(body.get("scope").is_none(), "{body}");

        let answer = post_form(
            &server,
            "/token",
            &[],
            "grant_type=client_credentials&client_id=client&client_secret=wrong",
        )
        .await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.json(), json!({"error": "invalid_client"}));

        // Basic with the wrong secret: "client:wrong".
        let answer = post_form(
            &server,
            "/token",
            &[("Authorization", "Basic Y2xpZW50Ondyb25n")],
            "grant_type=client_credentials",
        )
        .await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.json()["error"], "invalid_client");
        assert!(answer.header("www-authenticate").is_some());

        let answer = post_form(&server, "/token", &[], "grant_type=client_credentials").await;
        assert_eq!(answer.status, 401, "no client authentication at all");

        let answer = post_form(
            &server,
            "/token",
            &[],
            "grant_type=password&client_id=client&client_secret=s3cr%26t&username=u&password=p",
        )
        .await;
        assert_eq!(answer.status, 400);
        assert_eq!(answer.json(), json!({"error": "unsupported_grant_type"}));

        let answer = post_form(&server, "/token", &[], "client_id=client").await;
        assert_eq!(answer.status, 400);
        assert_eq!(answer.json(), json!({"error": "invalid_request"}));

        let requests = server.token_requests();
        assert_eq!(server.token_request_count(), 6);
        assert_eq!(requests[0].auth_method, "client_secret_post");
        assert!(requests[0].issued.is_some());
        assert!(requests[1..].iter().all(|r| r.issued.is_none()));
        assert_eq!(requests[2].auth_method, "client_secret_basic");
        assert_eq!(requests[3].auth_method, "none");
        assert_eq!(requests[3].client_id, None);
        assert_eq!(requests[4].grant_type, "password");
        assert_eq!(server.issued_count(), 1);
    }

    #[tokio::test]
    async fn tokens_expire_by_the_clock_and_can_be_revoked() {
        let server = TokenServer::start("c", "s", Duration::from_millis(300)).await;
        let get_token = || async {
            let answer = post_form(
                &server,
                "/token",
                &[],
                "grant_type=client_credentials&client_id=c&client_secret=s",
            )
            .await;
            let body = answer.json();
            assert_eq!(body["expires_in"], 1, "at least one second is reported");
            body["access_token"].as_str().unwrap().to_owned()
        };
        let first = get_token().await;
        assert_eq!(introspect_token(&server, &first).await["active"], true);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(introspect_token(&server, &first).await["active"], false);

        let second = get_token().await;
        assert!(second.starts_with("tok-2-"), "{second}");
        assert_eq!(introspect_token(&server, &second).await["active"], true);
        server.revoke_all();
        assert_eq!(introspect_token(&server, &second).await["active"], false);
        assert!(!server.is_active(&second));

        let third = get_token().await;
        assert_eq!(
            introspect_token(&server, &third).await["active"],
            true,
            "tokens issued after revoke_all work"
        );
    }

    #[tokio::test]
    async fn metadata_document() {
        let server = TokenServer::start("c", "s", Duration::from_secs(1)).await;
        let answer = send(
            server.addr(),
            "GET",
            "/.well-known/oauth-authorization-server",
            &[],
            "",
        )
        .await;
        assert_eq!(answer.status, 200);
        let body = answer.json();
        assert_eq!(body["issuer"], server.issuer());
        assert_eq!(body["token_endpoint"], server.token_url());
        assert_eq!(body["introspection_endpoint"], server.introspect_url());
        assert_eq!(
            body["grant_types_supported"],
            json!(["client_credentials", "authorization_code", "refresh_token"])
        );
        assert_eq!(
            body["authorization_endpoint"],
            format!("{}/authorize", server.issuer())
        );
        assert_eq!(body["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(
            body["token_endpoint_auth_methods_supported"],
            json!(["client_secret_basic", "client_secret_post"])
        );
        assert_eq!(
            server.metadata_url(),
            format!("{}/.well-known/oauth-authorization-server", server.issuer())
        );
    }

    #[test]
    fn pkce_s256_is_base64url_of_sha256() {
        assert_eq!(
            pkce_s256("dBjftJeZ4CVP-mJ92K9qqa9ZdQuiS9anXL0YPmq5wCk"),
            "-yDJ3ZT5WhX5s7pRJ_NIDi2VO3NaOFW5qC_WBeHaNMY"
        );
        assert_eq!(form_encode("a b/c~"), "a%20b%2Fc~");
    }

    #[tokio::test]
    async fn authorization_code_with_pkce_refresh_rotation_and_revocation() {
        let owned = TokenServer::start("c", "s", Duration::from_secs(60)).await;
        let server = &owned;
        let registered = send(
            server.addr(),
            "POST",
            "/register",
            &[("Content-Type", "application/json")],
            r#"{"client_name":"t","redirect_uris":["http://127.0.0.1:9/cb"]}"#,
        )
        .await;
        assert_eq!(registered.status, 201, "{}", registered.body);
        let client = registered.json()["client_id"].as_str().unwrap().to_owned();
        let verifier = "dBjftJeZ4CVP-mJ92K9qqa9ZdQuiS9anXL0YPmq5wCk";
        let authorize = |user: Option<&'static str>, redirect: &'static str| {
            let path = format!(
                "/authorize?response_type=code&client_id={client}&redirect_uri={}&code_challenge={}&code_challenge_method=S256&state=st&resource=http%3A%2F%2Fr%2Fmcp",
                form_encode(redirect),
                pkce_s256(verifier)
            );
            let headers: Vec<(&str, &str)> = user.map(|u| (USER_HEADER, u)).into_iter().collect();
            async move { send(server.addr(), "GET", &path, &headers, "").await }
        };
        // No person named: the login page a browser fills in, carrying the request on.
        let login = authorize(None, "http://127.0.0.1:9/cb").await;
        assert_eq!(login.status, 200, "{}", login.body);
        assert!(
            login
                .body
                .contains("<form method=\"post\" action=\"/authorize\">")
                && login.body.contains("name=\"code_challenge\""),
            "{}",
            login.body
        );
        assert_eq!(
            authorize(Some("alice"), "http://evil:9/cb").await.status,
            400,
            "an unregistered redirect_uri"
        );
        let answer = authorize(Some("alice"), "http://127.0.0.1:9/cb").await;
        assert_eq!(answer.status, 302, "{}", answer.body);
        let location = answer.header("location").unwrap().to_owned();
        let query = parse_form(location.split_once('?').unwrap().1.as_bytes());
        assert_eq!(query["state"], "st");
        assert_eq!(query["iss"], server.issuer());
        let exchange = |code: String, verifier: &'static str| {
            let body = format!(
                "grant_type=authorization_code&code={code}&redirect_uri=http%3A%2F%2F127.0.0.1%3A9%2Fcb&code_verifier={verifier}&client_id={client}"
            );
            async move { post_form(server, "/token", &[], &body).await }
        };
        let wrong = exchange(query["code"].clone(), "wrong-verifier").await;
        assert_eq!(wrong.json()["error"], "invalid_grant");
        let answer = authorize(Some("alice"), "http://127.0.0.1:9/cb").await;
        let location = answer.header("location").unwrap().to_owned();
        let code = parse_form(location.split_once('?').unwrap().1.as_bytes())["code"].clone();
        let tokens = exchange(code.clone(), verifier).await.json();
        let access = tokens["access_token"].as_str().unwrap().to_owned();
        let refresh = tokens["refresh_token"].as_str().unwrap().to_owned();
        assert!(access.starts_with("alice-"), "{access}");
        assert_eq!(introspect_token(server, &access).await["sub"], "alice");
        assert_eq!(
            exchange(code, verifier).await.status,
            400,
            "a code is single-use"
        );

        let refresh_with = |token: String| {
            let body = format!("grant_type=refresh_token&refresh_token={token}&client_id={client}");
            async move { post_form(server, "/token", &[], &body).await }
        };
        let rotated = refresh_with(refresh.clone()).await.json();
        assert!(
            rotated["access_token"]
                .as_str()
                .unwrap()
                .starts_with("alice-")
        );
        assert_eq!(refresh_with(refresh).await.status, 400, "rotated away");
        assert_eq!(server.refresh_count(), 1);
        server.revoke_user("alice");
        let newest = rotated["refresh_token"].as_str().unwrap().to_owned();
        assert_eq!(refresh_with(newest).await.status, 400, "revoked");
        assert_eq!(
            introspect_token(server, rotated["access_token"].as_str().unwrap()).await["active"],
            false
        );
        assert_eq!(server.authorizations().len(), 2);
        assert_eq!(server.registration_count(), 1);
    }

    #[test]
    fn works_without_a_runtime_and_stops_on_drop() {
        let server = TokenServer::start_blocking("c", "s", Duration::from_secs(5));
        let addr = server.addr();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = runtime.block_on(send(
            addr,
            "POST",
            "/token",
            &[FORM],
            "grant_type=client_credentials&client_id=c&client_secret=s",
        ));
        assert_eq!(answer.status, 200);
        let started = std::time::Instant::now();
        drop(server);
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
