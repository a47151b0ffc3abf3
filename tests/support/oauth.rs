//! A small OAuth 2.0 authorization server for tests: the client-credentials and RFC 8693
//! token-exchange grants, RFC 7662 token introspection and RFC 8414 or OpenID metadata.
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
//! - `POST /introspect` (form `token=...`): `{"active": true, "client_id", "exp", "scope"?,
//!   "token_type": "Bearer"}` while the token is issued, not revoked and not expired (by the
//!   real clock), else `{"active": false}`.
//! - `GET /.well-known/oauth-authorization-server` (RFC 8414) or, with
//!   [`AsOptions::openid_only`], only `GET /.well-known/openid-configuration`: the server's
//!   metadata, listing `auth_methods`.
//!
//! A token is active for exactly the `ttl` given to [`TokenServer::start`]; `expires_in` reports
//! it in whole seconds (rounded down, at least 1), so a sub-second `ttl` makes tokens expire
//! before the client expects. [`TokenServer::revoke_all`] deactivates every token issued so far
//! (to force a 401 and a refresh).
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
    /// The access token issued, or `None` if the request was refused.
    pub issued: Option<String>,
}

struct Issued {
    client_id: String,
    scope: Option<String>,
    expires_at: SystemTime,
    revoked: bool,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, Issued>,
    requests: Vec<TokenRequest>,
    introspections: usize,
}

struct Shared {
    client_id: String,
    client_secret: String,
    ttl: Duration,
    issuer: String,
    auth_methods: Vec<String>,
    jwt_public_key: Option<Vec<u8>>,
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
}

impl Default for AsOptions {
    fn default() -> Self {
        Self {
            auth_methods: vec!["client_secret_basic".into(), "client_secret_post".into()],
            jwt_public_key: None,
            openid_only: false,
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
            auth_methods: options.auth_methods,
            jwt_public_key: options.jwt_public_key,
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
            .route(metadata_path, get(metadata))
            .with_state(shared.clone());

        let server = bound.serve("token-server", router);

        TokenServer {
            addr,
            shared,
            _server: server,
        }
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

    /// Deactivates every token issued so far; later tokens are unaffected.
    pub fn revoke_all(&self) {
        for issued in self.shared.lock().tokens.values_mut() {
            issued.revoked = true;
        }
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
        issued: None,
    };
    let exchange = request.grant_type == TOKEN_EXCHANGE;

    let mut inner = shared.lock();
    let refusal = if request.grant_type.is_empty() {
        Some((StatusCode::BAD_REQUEST, "invalid_request"))
    } else if request.grant_type != "client_credentials" && !exchange {
        Some((StatusCode::BAD_REQUEST, "unsupported_grant_type"))
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

    let access_token = format!("tok-{}-{}", inner.tokens.len() + 1, random_hex());
    inner.tokens.insert(
        access_token.clone(),
        Issued {
            client_id: shared.client_id.clone(),
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
    json_response(StatusCode::OK, body)
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
            answer
        }
        _ => json!({"active": false}),
    };
    drop(inner);
    json_response(StatusCode::OK, answer)
}

async fn metadata(State(shared): State<Arc<Shared>>) -> Response<Body> {
    json_response(
        StatusCode::OK,
        json!({
            "issuer": shared.issuer,
            "token_endpoint": format!("{}/token", shared.issuer),
            "introspection_endpoint": format!("{}/introspect", shared.issuer),
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": shared.auth_methods,
            "token_endpoint_auth_signing_alg_values_supported": ["ES256"],
            "response_types_supported": [],
        }),
    )
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
                issued: Some(token.clone()),
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
        assert_eq!(body["grant_types_supported"], json!(["client_credentials"]));
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
