//! Credentials for remote MCP servers, referenced by a registry record's `http.auth_ref` and
//! defined only in host config (`[auth.NAME]` of `quiver.toml`), never in a guest's reach.
//!
//! - `api_key`: a static key from an environment variable, sent in a header.
//! - `oauth_client_credentials`: OAuth 2.0 client credentials, by the MCP authorization
//!   spec for a client without a browser ([`oauth`]): the token endpoint is configured,
//!   or discovered from the server's 401 challenge and protected-resource metadata, then
//!   the authorization server's metadata; the client authenticates with a secret (Basic
//!   or form) or a signed JWT ([`jwt`]).
//! - `oauth_token_exchange`: OAuth 2.0 token exchange (RFC 8693): the task's subject token
//!   ([`SubjectToken`], from the platform that submitted it) is exchanged at the
//!   authorization server, found as for client credentials, for a token scoped to the
//!   server; the client authenticates as above or not at all (`none`).
//! - `oauth_enterprise_managed`: enterprise-managed authorization (SEP-990): the task's
//!   subject token, an ID token, is exchanged at the configured IdP for an ID-JAG, which
//!   the server's authorization server (found as above) redeems as an RFC 7523 grant;
//!   rmcp's `enterprise` module does both exchanges over the egress-checked client.
//! - `oauth_authorization_code` ([`user`]): a person's grant per server and principal;
//!   with `dpop = true` its tokens are DPoP-bound to a key kept in the grant ([`dpop`]).
//!
//! Config is checked and private keys are read once, when the host is built
//! ([`AuthSet::load`]); secrets are read from the environment when used. Neither appears
//! in logs or errors. Every discovery and token request goes through the egress-checked
//! client, so a token endpoint named by metadata gets a credential only if the `[egress]`
//! allow rules cover it.

mod dpop;
mod grants;
mod jwt;
mod oauth;
mod subject;
mod user;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::outbound::{EgressRefused, OutboundClient, ReadBodyError, SendError, UrlParseError};
use crate::config::ConfigError;
use crate::defaults;
use crate::registry::RuleViolation;
pub(crate) use dpop::{nonce_of, wants_nonce};
pub(crate) use grants::Grants;
pub use grants::{
    DirGrantStore, Grant, GrantKey, GrantStatus, GrantStore, GrantStoreError, MemoryGrantStore,
    REGISTRY_GRANTS_DIR, Registration,
};
pub use jwt::SigningAlg;
use jwt::{ClientKey, SignError};
pub(crate) use oauth::OAuthClient;
pub(crate) use subject::{SubjectRegistration, SubjectTokens};
pub use subject::{SubjectToken, SubjectTokenError};
pub(crate) use user::UserToken;
pub use user::{AuthorizationPrompt, AuthorizeError, OAuthAuthorizationCodeConfig, UserAuthorizer};

/// Credentials that cannot be resolved or a token that cannot be had. It names the server,
/// the `auth_ref`, the variable and the endpoint; never a key, secret or token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthError {
    #[error(
        "server `{server_id}`: http.auth_ref `{auth_ref}` is not defined in the host config ([auth.{auth_ref}])"
    )]
    Undefined { server_id: String, auth_ref: String },
    /// The record names a credential its binding does not let it use.
    #[error("server `{server_id}`: {message}")]
    NotBound { server_id: String, message: String },
    #[error(
        "server `{server_id}`: api_key auth `{auth_ref}`: environment variable `{var}` is not set"
    )]
    ApiKeyEnvMissing {
        server_id: String,
        auth_ref: String,
        var: String,
    },
    /// The task's principal has no grant for the server and nobody can be asked now.
    #[error(
        "server `{server_id}` needs a user's authorization and principal `{principal}` has not given it; run `quiver mcp login {server_id} --as {principal}` (or authorize it on the node's admin page)"
    )]
    NotAuthorized {
        server_id: String,
        principal: String,
    },
    /// The server uses user authorization and the task acts for nobody.
    #[error(
        "server `{server_id}` needs a user's authorization (http.auth_ref `{auth_ref}`) and the task has no principal; run it as one (TaskSpec::principal, `quiver run --as NAME`)"
    )]
    NoPrincipal { server_id: String, auth_ref: String },
    #[error(
        "server `{server_id}`: oauth_authorization_code auth `{auth_ref}` for principal `{principal}`: {problem}"
    )]
    User {
        server_id: String,
        principal: String,
        auth_ref: String,
        #[source]
        problem: Box<OAuthProblem>,
    },
    /// A token-exchange credential and a task with no subject token to exchange.
    #[error(
        "server `{server_id}`: {kind} auth `{auth_ref}` exchanges the task's subject token, and {who} has none; submit the task with one (the node's `Quiver-Subject-Token` header, `--subject-token-env VAR` of the CLI, or TaskSpec::subject_token)"
    )]
    NoSubjectToken {
        server_id: String,
        kind: OAuthKind,
        auth_ref: String,
        /// "the task" or "principal `NAME`".
        who: String,
    },
    /// Running tasks of one principal carry different subject tokens: they would share
    /// one exchanged identity, so none is used.
    #[error(
        "server `{server_id}`: running tasks {who} carry different subject tokens, and tasks of one principal share one connection; submit each user's tasks as that user (the node's body `principal` with the client's act_for, or TaskSpec::principal)"
    )]
    SubjectTokensDiffer { server_id: String, who: String },
    /// The server asked for a DPoP nonce and gave none usable, or asked again.
    #[error(
        "server `{server_id}`: the server asks for a DPoP nonce (use_dpop_nonce) and gave no usable DPoP-Nonce header (at most 512 bytes of visible ASCII), or refused the one it gave"
    )]
    DpopNonce { server_id: String },
    #[error("server `{server_id}`: {kind} auth `{auth_ref}`: {problem}")]
    OAuth {
        server_id: String,
        kind: OAuthKind,
        auth_ref: String,
        /// Boxed: the error travels inside transport errors, which must stay small.
        #[source]
        problem: Box<OAuthProblem>,
    },
}

/// Which OAuth kind failed, for errors (a byte, to keep [`AuthError`] small).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OAuthKind {
    ClientCredentials,
    TokenExchange,
    EnterpriseManaged,
    JwtBearer,
}

impl std::fmt::Display for OAuthKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OAuthKind::ClientCredentials => "oauth_client_credentials",
            OAuthKind::TokenExchange => "oauth_token_exchange",
            OAuthKind::EnterpriseManaged => "oauth_enterprise_managed",
            OAuthKind::JwtBearer => "oauth_jwt_bearer",
        })
    }
}

impl AuthError {
    fn no_subject(
        server_id: &str,
        kind: OAuthKind,
        auth_ref: &str,
        principal: Option<&str>,
    ) -> Self {
        AuthError::NoSubjectToken {
            server_id: server_id.to_owned(),
            kind,
            auth_ref: auth_ref.to_owned(),
            who: principal.map_or_else(|| "the task".to_owned(), |p| format!("principal `{p}`")),
        }
    }
}

/// What went wrong getting an OAuth token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OAuthProblem {
    /// Discovery failed: rmcp's error with its causes (URLs and statuses, no credentials).
    #[error("metadata discovery: {0}")]
    Discovery(String),
    /// The whole discovery took longer than [`crate::defaults::OAUTH_DISCOVERY_TIMEOUT`].
    #[error(
        "metadata discovery did not finish within {ms} ms; check that the server and the authorization server answer, or set issuer or token_url"
    )]
    DiscoveryTimeout { ms: u64 },
    /// Discovery failed a moment ago: its error, remembered rather than run again at once.
    #[error("{problem} (discovery is tried again in {retry_in_ms} ms)")]
    DiscoveryFailedRecently { problem: String, retry_in_ms: u64 },
    /// Nothing published metadata: rmcp would guess `/token` on the server's origin.
    #[error(
        "no protected-resource or authorization-server metadata found for {url}; set issuer or token_url"
    )]
    NoMetadata { url: String },
    /// The configured issuer publishes no authorization-server metadata.
    #[error(
        "no RFC 8414 or OpenID metadata found for issuer {issuer}; check issuer or set token_url"
    )]
    NoIssuerMetadata { issuer: String },
    /// The configured `issuer` is not the one the authorization server's metadata names.
    #[error(
        "the metadata found for issuer {configured} names issuer {received}; set issuer to exactly the authorization server's issuer identifier"
    )]
    IssuerMismatch {
        configured: String,
        received: String,
    },
    /// A step-up challenge names scopes outside `scopes` and `step_up_scopes`.
    #[error(
        "the server asks for scopes {scopes:?} beyond the configured ones; list them in step_up_scopes if this host may ask for them"
    )]
    StepUpRefused { scopes: Vec<String> },
    /// The server's challenge or metadata names more scopes than one request may carry.
    #[error(
        "the server asks for {count} scopes, more than {max}; set scopes (and step_up_scopes) to the ones needed",
        max = crate::defaults::OAUTH_MAX_SCOPES
    )]
    TooManyScopes { count: usize },
    #[error("the metadata of {issuer} has no token_endpoint; set token_url")]
    NoTokenEndpoint { issuer: String },
    /// The authorization server offers no client authentication this config can do.
    #[error(
        "the authorization server accepts {offered:?} at its token endpoint; set token_endpoint_auth, private_key_file or client_secret_env to match"
    )]
    NoUsableAuthMethod { offered: Vec<String> },
    #[error(
        "the authorization server accepts client assertions signed with {offered:?}, not {alg}; set signing_alg and a matching key"
    )]
    SigningAlgRefused {
        alg: &'static str,
        offered: Vec<String>,
    },
    /// Discovery named a token endpoint outside the egress rules (or none that parses);
    /// checked before a credential is read.
    #[error("token endpoint: {0}")]
    TokenEndpointDenied(#[source] EgressRefused),
    /// Discovery named a token endpoint the credential's binding does not list; nothing
    /// was sent to it.
    #[error(
        "the server's metadata names token endpoint {url}, whose origin {origin} is not in [auth.{auth_ref}] origins; add {origin:?} there, or set issuer or token_url, so the client secret or assertion goes only where the host config says"
    )]
    TokenEndpointNotBound {
        url: String,
        origin: String,
        auth_ref: String,
    },
    /// A plain-http token endpoint while the authorization server or the MCP server is
    /// https: the credential would travel in clear.
    #[error(
        "token endpoint {url} is plain http while {https} is https, so the client secret or assertion would travel in clear; use an https token endpoint (token_url, or the authorization server's metadata)"
    )]
    TokenEndpointInClear { url: String, https: String },
    /// The variable holding the client secret is not set.
    #[error("environment variable `{var}` is not set")]
    SecretEnvMissing { var: String },
    #[error(transparent)]
    Sign(SignError),
    #[error("token endpoint {url} unreachable: {source}")]
    TokenUnreachable {
        url: String,
        #[source]
        source: Box<SendError>,
    },
    #[error("token endpoint {url}: {source}")]
    TokenBody {
        url: String,
        #[source]
        source: ReadBodyError,
    },
    /// The token endpoint said no; `error` is its OAuth error code.
    #[error(
        "token endpoint {url} answered HTTP {status} ({error}); check client_id and the secret or key"
    )]
    TokenRefused {
        url: String,
        status: reqwest::StatusCode,
        error: String,
    },
    #[error("the token response has no access_token")]
    NoAccessToken,
    /// A token exchange answered with another token type than the one asked for (or none).
    #[error(
        "the token endpoint issued a token of type {received}, not the {requested} asked for; check requested_token_type and the authorization server's exchange policy"
    )]
    WrongTokenType { requested: String, received: String },
    /// Enterprise-managed authorization failed at `stage` (rmcp's sanitized reason: no
    /// token, no response body).
    #[error("{stage} {url}: {reason}")]
    IdJag {
        stage: &'static str,
        url: String,
        reason: String,
    },
    /// The authorization server's issuer, which an ID-JAG is addressed to, is not known.
    #[error(
        "the authorization server's issuer is not known (token_url without issuer); set issuer, which the ID-JAG is addressed to"
    )]
    NoIssuer,
    /// `dpop = true` and the authorization server does not bind tokens to ES256 keys.
    #[error(
        "dpop = true, and the authorization server offers DPoP with {offered:?} (dpop_signing_alg_values_supported), not ES256; drop dpop, or use an authorization server that offers ES256"
    )]
    DpopNotOffered { offered: Vec<String> },
    /// The token is not a bearer token (e.g. DPoP-bound), which this host cannot present.
    #[error(
        "the token endpoint issued a token of token_type {token_type}, not Bearer; this host presents bearer tokens only"
    )]
    NotBearer { token_type: String },
    /// The workload's JWT cannot be read (it names the variable or file, never the value).
    #[error("the workload JWT: {0}")]
    Assertion(String),
    /// The MCP server's URL, needed for discovery, does not parse.
    #[error("{0}")]
    ServerUrl(#[source] UrlParseError),
    /// The grant store failed (its message names the place, never a token).
    #[error("{0}")]
    Store(String),
    /// A step of the authorization code flow failed: rmcp's error, which names endpoints
    /// and OAuth error codes, never a token or secret.
    #[error("{0}")]
    Flow(String),
    /// A 403 asked for more scopes, which only a person can grant.
    #[error(
        "the server asks for scopes `{scopes}` beyond the grant; authorize them with `quiver mcp login` (add --scope)"
    )]
    StepUpNeedsPerson { scopes: String },
}

/// The first `[auth.NAME]` of the raw `[auth]` table that sets `dpop` with another kind
/// than `oauth_authorization_code`, as the field and a message naming the fix: DPoP is
/// built for user grants only, and serde alone would call the field unknown.
pub(crate) fn misplaced_dpop(auth: &toml::Value) -> Option<(String, String)> {
    let (name, kind) = auth.as_table()?.iter().find_map(|(name, table)| {
        let table = table.as_table()?;
        let kind = table
            .get("kind")
            .and_then(toml::Value::as_str)
            .unwrap_or("");
        (kind != "oauth_authorization_code" && table.contains_key("dpop")).then_some((name, kind))
    })?;
    let kind = crate::text::printable(kind);
    Some((
        format!("auth.{name}.dpop"),
        format!(
            "DPoP (RFC 9449) is built for kind = \"oauth_authorization_code\" only, not `{}`: remove `dpop` (tokens of this kind are bearer tokens)",
            crate::text::cut(&kind, 64)
        ),
    ))
}

/// `[auth.NAME]` of the host config.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AuthConfig {
    ApiKey(ApiKeyConfig),
    OauthClientCredentials(OAuthClientCredentialsConfig),
    OauthAuthorizationCode(OAuthAuthorizationCodeConfig),
    OauthTokenExchange(OAuthTokenExchangeConfig),
    OauthEnterpriseManaged(OAuthEnterpriseManagedConfig),
    OauthJwtBearer(OAuthJwtBearerConfig),
}

/// `[auth.NAME] kind = "oauth_jwt_bearer"`: workload identity. A JWT the platform issues to
/// this workload (a Kubernetes service-account token, a cloud identity token) is presented
/// at the authorization server as an RFC 7523 JWT bearer grant for a token for the server.
/// Discovery and the binding work as for [`OAuthClientCredentialsConfig`]; the client is
/// public (`client_id` only).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OAuthJwtBearerConfig {
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub origins: Vec<String>,
    pub client_id: String,
    /// Environment variable holding the workload JWT.
    #[serde(default)]
    pub assertion_env: Option<String>,
    /// File holding the workload JWT, read at each token request (platforms rotate it);
    /// relative to the config file.
    #[serde(default)]
    pub assertion_file: Option<PathBuf>,
    #[serde(default)]
    pub token_url: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The RFC 8707 `resource` parameter (default: the MCP server's URL).
    #[serde(default)]
    pub resource: Option<String>,
}

impl OAuthJwtBearerConfig {
    fn client(&self) -> OAuthClientCredentialsConfig {
        OAuthClientCredentialsConfig {
            servers: self.servers.clone(),
            origins: self.origins.clone(),
            client_id: self.client_id.clone(),
            client_secret_env: None,
            token_url: self.token_url.clone(),
            issuer: self.issuer.clone(),
            scopes: self.scopes.clone(),
            step_up_scopes: Vec::new(),
            resource: self.resource.clone(),
            token_endpoint_auth: Some(TokenEndpointAuth::None),
            private_key_file: None,
            signing_alg: None,
            assertion_audience: None,
        }
    }

    fn source(&self) -> AssertionSource {
        match (&self.assertion_env, &self.assertion_file) {
            (Some(var), _) => AssertionSource::Env(var.clone()),
            (None, Some(file)) => AssertionSource::File(file.clone()),
            // The load requires one.
            (None, None) => AssertionSource::Env(String::new()),
        }
    }
}

/// Where a workload JWT is read from.
pub(crate) enum AssertionSource {
    Env(String),
    File(PathBuf),
}

impl AssertionSource {
    /// The JWT, checked like a subject token (bounded, visible ASCII; a file's trailing
    /// newline is dropped).
    fn read(&self) -> Result<SubjectToken, OAuthProblem> {
        let text = match self {
            AssertionSource::Env(var) => std::env::var(var).map_err(|_| {
                OAuthProblem::Assertion(format!("environment variable `{var}` is not set"))
            })?,
            AssertionSource::File(path) => {
                let mut text = String::new();
                std::fs::File::open(path)
                    .and_then(|file| {
                        file.take(defaults::MAX_SUBJECT_TOKEN_BYTES as u64 + 2)
                            .read_to_string(&mut text)
                    })
                    .map_err(|e| {
                        OAuthProblem::Assertion(format!("cannot read {}: {e}", path.display()))
                    })?;
                text.trim_end_matches(['\r', '\n']).to_owned()
            }
        };
        SubjectToken::new(&text).map_err(|e| OAuthProblem::Assertion(e.to_string()))
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The servers (record ids) that may use this credential; with `origins` too, a
    /// server must be in both.
    #[serde(default)]
    pub servers: Vec<String>,
    /// The URL origins (`https://host[:port]`) this credential may be sent to: the MCP
    /// servers' URLs, and for OAuth a discovered token endpoint.
    #[serde(default)]
    pub origins: Vec<String>,
    /// Environment variable holding the key.
    pub value_env: String,
    /// Header carrying it (default `Authorization`).
    #[serde(default = "authorization")]
    pub header: String,
    /// Text before the key (default `Bearer ` for `Authorization`, else none).
    #[serde(default)]
    pub prefix: Option<String>,
}

fn authorization() -> String {
    "Authorization".into()
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OAuthClientCredentialsConfig {
    /// The servers (record ids) that may use this credential; with `origins` too, a
    /// server must be in both.
    #[serde(default)]
    pub servers: Vec<String>,
    /// The URL origins (`https://host[:port]`) this credential may be sent to: the MCP
    /// servers' URLs, and for OAuth a discovered token endpoint.
    #[serde(default)]
    pub origins: Vec<String>,
    pub client_id: String,
    /// Environment variable holding the client secret; required unless the client
    /// authenticates with `private_key_jwt`.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// The token endpoint; without it, discovered from `issuer` or the server's metadata.
    #[serde(default)]
    pub token_url: Option<String>,
    /// The authorization server: only its own metadata is read (not the MCP server's, nor
    /// protected-resource metadata at the issuer), and it must name this issuer.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Scopes asked for; without them, the server's challenge or metadata decides.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Scopes a 403 `insufficient_scope` may add beyond `scopes`. With `scopes` or this
    /// set, step-up asks for no scope outside the two; with neither, the server decides
    /// (up to [`crate::defaults::OAUTH_MAX_SCOPES`]).
    #[serde(default)]
    pub step_up_scopes: Vec<String>,
    /// The RFC 8707 `resource` parameter (default: the MCP server's URL).
    #[serde(default)]
    pub resource: Option<String>,
    /// How the client authenticates at the token endpoint (default: `private_key_jwt`
    /// with a `private_key_file`, else what the server's metadata lists, Basic first).
    #[serde(default)]
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// PKCS#8 PEM private key for `private_key_jwt`; relative to the config file.
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// `ES256` or `RS256` (default: from the key).
    #[serde(default)]
    pub signing_alg: Option<SigningAlg>,
    /// The client assertion's `aud` (default: the authorization server's issuer).
    #[serde(default)]
    pub assertion_audience: Option<String>,
}

/// `[auth.NAME] kind = "oauth_token_exchange"`: the task's subject token exchanged at the
/// authorization server (RFC 8693) for a token for the server. Discovery, client
/// authentication and the binding work as for [`OAuthClientCredentialsConfig`].
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OAuthTokenExchangeConfig {
    /// The servers (record ids) that may use this credential; with `origins` too, a
    /// server must be in both.
    #[serde(default)]
    pub servers: Vec<String>,
    /// The URL origins (`https://host[:port]`) this credential may be sent to: the MCP
    /// servers' URLs, and a discovered token endpoint.
    #[serde(default)]
    pub origins: Vec<String>,
    pub client_id: String,
    /// Environment variable holding the client secret (`client_secret_basic`/`_post`).
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// The token endpoint; without it, discovered from `issuer` or the server's metadata.
    #[serde(default)]
    pub token_url: Option<String>,
    /// The authorization server, as for client credentials.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Scopes asked for; without them, the server's challenge or metadata decides.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The RFC 8707 `resource` parameter (default: the MCP server's URL).
    #[serde(default)]
    pub resource: Option<String>,
    /// The RFC 8693 `audience` parameter (the logical name of the target service), if the
    /// authorization server wants one.
    #[serde(default)]
    pub audience: Option<String>,
    /// How the client authenticates at the token endpoint (default: `private_key_jwt`
    /// with a `private_key_file`, Basic or post with a secret, else `none`).
    #[serde(default)]
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    /// PKCS#8 PEM private key for `private_key_jwt`; relative to the config file.
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// `ES256` or `RS256` (default: from the key).
    #[serde(default)]
    pub signing_alg: Option<SigningAlg>,
    /// The client assertion's `aud` (default: the authorization server's issuer).
    #[serde(default)]
    pub assertion_audience: Option<String>,
    /// What the task's subject token is (default `access_token`).
    #[serde(default = "access_token")]
    pub subject_token_type: TokenType,
    /// What to ask for (default `access_token`); the answer must say it is that.
    #[serde(default = "access_token")]
    pub requested_token_type: TokenType,
}

/// `[auth.NAME] kind = "oauth_enterprise_managed"`: enterprise-managed authorization
/// (the MCP extension, SEP-990). The task's subject token, an ID token from the
/// enterprise IdP, is exchanged at the IdP (RFC 8693) for an identity assertion JWT
/// authorization grant (ID-JAG) for the MCP server's authorization server, which is then
/// presented there as an RFC 7523 JWT bearer grant for an access token. The authorization
/// server is found as for [`OAuthClientCredentialsConfig`], and the client authenticates
/// there as it does; the IdP's token endpoint is configured, and its origin must be in
/// `origins`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OAuthEnterpriseManagedConfig {
    /// The servers (record ids) that may use this credential.
    #[serde(default)]
    pub servers: Vec<String>,
    /// The URL origins the tokens may go to: the MCP servers' URLs, the IdP's token
    /// endpoint (required here) and a discovered token endpoint.
    #[serde(default)]
    pub origins: Vec<String>,
    /// The client's id at the MCP server's authorization server.
    pub client_id: String,
    #[serde(default)]
    pub client_secret_env: Option<String>,
    #[serde(default)]
    pub token_url: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub resource: Option<String>,
    #[serde(default)]
    pub token_endpoint_auth: Option<TokenEndpointAuth>,
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    #[serde(default)]
    pub signing_alg: Option<SigningAlg>,
    #[serde(default)]
    pub assertion_audience: Option<String>,
    /// The enterprise IdP's issuer identifier: the ID-JAG's `iss` must be it.
    pub idp_issuer: String,
    /// The IdP's token endpoint, where the ID token is exchanged for an ID-JAG.
    pub idp_token_url: String,
    /// The client's id at the IdP.
    pub idp_client_id: String,
    /// The variable holding the client's secret at the IdP (`client_secret_basic`);
    /// without it the client is public there.
    #[serde(default)]
    pub idp_client_secret_env: Option<String>,
}

impl OAuthEnterpriseManagedConfig {
    /// The client part at the MCP server's authorization server.
    fn client(&self) -> OAuthClientCredentialsConfig {
        OAuthClientCredentialsConfig {
            servers: self.servers.clone(),
            origins: self.origins.clone(),
            client_id: self.client_id.clone(),
            client_secret_env: self.client_secret_env.clone(),
            token_url: self.token_url.clone(),
            issuer: self.issuer.clone(),
            scopes: self.scopes.clone(),
            step_up_scopes: Vec::new(),
            resource: self.resource.clone(),
            token_endpoint_auth: self.token_endpoint_auth,
            private_key_file: self.private_key_file.clone(),
            signing_alg: self.signing_alg,
            assertion_audience: self.assertion_audience.clone(),
        }
    }
}

fn access_token() -> TokenType {
    TokenType::AccessToken
}

/// RFC 8693 §3 token type identifiers, by their short names.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TokenType {
    AccessToken,
    IdToken,
    Jwt,
}

impl TokenType {
    /// The `urn:ietf:params:oauth:token-type:*` URI.
    pub fn uri(self) -> &'static str {
        match self {
            TokenType::AccessToken => "urn:ietf:params:oauth:token-type:access_token",
            TokenType::IdToken => "urn:ietf:params:oauth:token-type:id_token",
            TokenType::Jwt => "urn:ietf:params:oauth:token-type:jwt",
        }
    }
}

impl OAuthTokenExchangeConfig {
    /// The client part, as the client-credentials kind has it (no step-up scopes: a
    /// step-up would need another exchange policy).
    fn client(&self) -> OAuthClientCredentialsConfig {
        OAuthClientCredentialsConfig {
            servers: self.servers.clone(),
            origins: self.origins.clone(),
            client_id: self.client_id.clone(),
            client_secret_env: self.client_secret_env.clone(),
            token_url: self.token_url.clone(),
            issuer: self.issuer.clone(),
            scopes: self.scopes.clone(),
            step_up_scopes: Vec::new(),
            resource: self.resource.clone(),
            token_endpoint_auth: self.token_endpoint_auth,
            private_key_file: self.private_key_file.clone(),
            signing_alg: self.signing_alg,
            assertion_audience: self.assertion_audience.clone(),
        }
    }
}

impl AuthConfig {
    /// The binding: the servers and the origins that may use the credential.
    fn binding(&self) -> (&[String], &[String]) {
        match self {
            AuthConfig::ApiKey(c) => (&c.servers, &c.origins),
            AuthConfig::OauthClientCredentials(c) => (&c.servers, &c.origins),
            AuthConfig::OauthAuthorizationCode(c) => (&c.servers, &c.origins),
            AuthConfig::OauthTokenExchange(c) => (&c.servers, &c.origins),
            AuthConfig::OauthEnterpriseManaged(c) => (&c.servers, &c.origins),
            AuthConfig::OauthJwtBearer(c) => (&c.servers, &c.origins),
        }
    }

    /// Whether tokens are a principal's (its grant, or its tasks' subject tokens): then
    /// each principal connects with its own.
    pub(crate) fn is_per_principal(&self) -> bool {
        matches!(
            self,
            AuthConfig::OauthAuthorizationCode(_)
                | AuthConfig::OauthTokenExchange(_)
                | AuthConfig::OauthEnterpriseManaged(_)
        )
    }
}

/// `scheme://host[:port]` of `url` as the binding compares it (default ports dropped,
/// host lowercased); `None` when it has none.
pub(crate) fn origin_of(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    let origin = url.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// Whether `origin` is one of `origins` (exact, or by a `*` pattern).
pub(crate) fn origin_listed(origins: &[String], origin: Option<&str>) -> bool {
    origin.is_some_and(|origin| {
        origins.iter().any(|o| {
            let o = o.trim_end_matches('/');
            o == origin || (o.contains('*') && crate::policy::Pattern::new(o).matches(origin))
        })
    })
}

/// Client authentication at the token endpoint (RFC 7591 names).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TokenEndpointAuth {
    ClientSecretBasic,
    ClientSecretPost,
    PrivateKeyJwt,
    /// A public client: only `client_id` is sent (token exchange only).
    None,
}

impl TokenEndpointAuth {
    fn name(self) -> &'static str {
        match self {
            TokenEndpointAuth::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuth::ClientSecretPost => "client_secret_post",
            TokenEndpointAuth::PrivateKeyJwt => "private_key_jwt",
            TokenEndpointAuth::None => "none",
        }
    }
}

/// An `[auth.NAME]` table that cannot be used: the field (`auth.NAME.FIELD`) and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AuthConfigError {
    pub field: String,
    pub message: String,
    /// The key file's error, when `message` is about one.
    #[source]
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl AuthConfigError {
    /// This error as the host config's, naming `file` and keeping the cause.
    pub(crate) fn in_file(self, file: &Path) -> ConfigError {
        ConfigError {
            source: self.source,
            ..ConfigError::new(file, self.field, self.message)
        }
    }
}

/// The host's `[auth.*]` tables, checked, with their private keys read.
#[derive(Clone, Debug, Default)]
pub struct AuthSet {
    configs: BTreeMap<String, AuthConfig>,
    keys: BTreeMap<String, Arc<ClientKey>>,
    user: UserAuth,
    /// The subject tokens of running tasks, for token exchange; shared by every clone.
    subjects: SubjectTokens,
}

/// Where user grants are kept and who can ask a person, set by the embedder.
#[derive(Clone, Default)]
struct UserAuth {
    grants: Grants,
    authorizer: Option<Arc<dyn UserAuthorizer>>,
}

impl std::fmt::Debug for UserAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserAuth")
            .field("authorizer", &self.authorizer.is_some())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SubjectTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectTokens(<redacted>)")
    }
}

impl AuthSet {
    /// Checks every table and reads its `private_key_file` (relative to `dir`, the config
    /// file's directory).
    pub fn load(
        configs: &BTreeMap<String, AuthConfig>,
        dir: &Path,
    ) -> Result<Self, AuthConfigError> {
        let mut keys = BTreeMap::new();
        let mut assertion_files = BTreeMap::new();
        for (name, config) in configs {
            let error = |field: &str, message: String| AuthConfigError {
                field: format!("auth.{name}.{field}"),
                message,
                source: None,
            };
            check_binding_config(config, &error)?;
            let (oauth, public) = match config {
                AuthConfig::ApiKey(_) => continue,
                AuthConfig::OauthAuthorizationCode(user) => {
                    check_user_config(user, &error)?;
                    continue;
                }
                AuthConfig::OauthClientCredentials(oauth) => {
                    if oauth.token_endpoint_auth == Some(TokenEndpointAuth::None) {
                        return Err(error(
                            "token_endpoint_auth",
                            "client credentials need the client to authenticate: use client_secret_basic, client_secret_post or private_key_jwt (none is for oauth_token_exchange)".into(),
                        ));
                    }
                    (oauth.clone(), false)
                }
                AuthConfig::OauthTokenExchange(exchange) => {
                    let public = match exchange.token_endpoint_auth {
                        Some(method) => method == TokenEndpointAuth::None,
                        None => {
                            exchange.client_secret_env.is_none()
                                && exchange.private_key_file.is_none()
                        }
                    };
                    if public
                        && (exchange.client_secret_env.is_some()
                            || exchange.private_key_file.is_some())
                    {
                        return Err(error(
                            "token_endpoint_auth",
                            "token_endpoint_auth = \"none\" sends no secret or assertion: drop client_secret_env and private_key_file, or pick the method that uses them".into(),
                        ));
                    }
                    (exchange.client(), public)
                }
                AuthConfig::OauthEnterpriseManaged(ema) => {
                    check_ema_config(ema, &error)?;
                    (ema.client(), false)
                }
                AuthConfig::OauthJwtBearer(bearer) => {
                    if bearer.assertion_env.is_some() == bearer.assertion_file.is_some() {
                        return Err(error(
                            "assertion_env",
                            "set exactly one of assertion_env (the variable holding the workload JWT) and assertion_file (the file the platform writes it to)".into(),
                        ));
                    }
                    if let Some(file) = &bearer.assertion_file {
                        assertion_files.insert(name.clone(), dir.join(file));
                    }
                    (bearer.client(), true)
                }
            };
            let oauth = &oauth;
            if oauth.scopes.len() + oauth.step_up_scopes.len() > defaults::OAUTH_MAX_SCOPES {
                return Err(error(
                    "scopes",
                    format!(
                        "scopes and step_up_scopes list more than {} scopes together",
                        defaults::OAUTH_MAX_SCOPES
                    ),
                ));
            }
            let jwt = match oauth.token_endpoint_auth {
                Some(method) => method == TokenEndpointAuth::PrivateKeyJwt,
                None => oauth.private_key_file.is_some(),
            };
            match (&oauth.private_key_file, jwt) {
                (None, true) => {
                    return Err(error(
                        "private_key_file",
                        "private_key_jwt needs a private_key_file (a PKCS#8 PEM key)".into(),
                    ));
                }
                (Some(_), false) => {
                    return Err(error(
                        "private_key_file",
                        "a private key is only used with token_endpoint_auth = \"private_key_jwt\""
                            .into(),
                    ));
                }
                (Some(file), true) => {
                    let key = ClientKey::load(&dir.join(file), oauth.signing_alg).map_err(|e| {
                        let mut unusable = error("private_key_file", e.to_string());
                        unusable.source = Some(Box::new(e));
                        unusable
                    })?;
                    keys.insert(name.clone(), Arc::new(key));
                }
                (None, false) => {
                    if oauth.signing_alg.is_some() {
                        return Err(error(
                            "signing_alg",
                            "signing_alg is only used with a private_key_file".into(),
                        ));
                    }
                    if oauth.client_secret_env.is_none() && !public {
                        return Err(error(
                            "client_secret_env",
                            "set the name of the variable holding the client secret, or use \
                             private_key_jwt with a private_key_file"
                                .into(),
                        ));
                    }
                }
            }
        }
        let mut configs = configs.clone();
        for (name, path) in assertion_files {
            if let Some(AuthConfig::OauthJwtBearer(bearer)) = configs.get_mut(&name) {
                bearer.assertion_file = Some(path);
            }
        }
        Ok(Self {
            configs,
            keys,
            user: UserAuth::default(),
            subjects: SubjectTokens::default(),
        })
    }

    /// Keeps user grants in `store` instead of memory.
    pub(crate) fn with_grant_store(mut self, store: Arc<dyn GrantStore>) -> Self {
        self.user.grants = Grants::new(store);
        self
    }

    /// Lets connections ask a person to authorize (the CLI's terminal flow).
    pub(crate) fn with_authorizer(mut self, authorizer: Arc<dyn UserAuthorizer>) -> Self {
        self.user.authorizer = Some(authorizer);
        self
    }

    /// The host's grants.
    pub(crate) fn grants(&self) -> &Grants {
        &self.user.grants
    }

    /// Whether `auth_ref` names user authorization, so connections are per principal.
    pub(crate) fn is_per_principal(&self, auth_ref: &str) -> bool {
        self.configs
            .get(auth_ref)
            .is_some_and(AuthConfig::is_per_principal)
    }

    /// For a server whose credential is `oauth_token_exchange`: whether a running task of
    /// `principal` has a subject token to exchange.
    pub(crate) fn check_subject(
        &self,
        entry: &crate::registry::ServerEntry,
        principal: Option<&str>,
    ) -> Result<(), AuthError> {
        let Some(auth_ref) = entry
            .record
            .http
            .as_ref()
            .and_then(|h| h.auth_ref.as_deref())
        else {
            return Ok(());
        };
        let kind = match self.configs.get(auth_ref) {
            Some(AuthConfig::OauthTokenExchange(_)) => OAuthKind::TokenExchange,
            Some(AuthConfig::OauthEnterpriseManaged(_)) => OAuthKind::EnterpriseManaged,
            _ => return Ok(()),
        };
        if self.subjects.current(principal).is_some() {
            return Ok(());
        }
        if self.subjects.differ(principal) {
            return Err(AuthError::SubjectTokensDiffer {
                server_id: entry.server_id().to_owned(),
                who: principal.map_or_else(
                    || "without a principal".to_owned(),
                    |p| format!("of principal `{p}`"),
                ),
            });
        }
        Err(AuthError::no_subject(
            entry.server_id(),
            kind,
            auth_ref,
            principal,
        ))
    }

    /// Registers a task's subject token under its principal while the task runs.
    pub(crate) fn register_subject(
        &self,
        principal: Option<&str>,
        token: SubjectToken,
    ) -> SubjectRegistration {
        self.subjects.register(principal, token)
    }
}

/// The IdP gets the user's identity token: its token endpoint must be one the binding
/// lists, and https next to an https IdP.
fn check_ema_config(
    config: &OAuthEnterpriseManagedConfig,
    error: &dyn Fn(&str, String) -> AuthConfigError,
) -> Result<(), AuthConfigError> {
    let url = &config.idp_token_url;
    let Some(origin) = origin_of(url) else {
        return Err(error(
            "idp_token_url",
            format!(
                "{url:?} is not an http(s) URL; set the IdP's token endpoint, e.g. \"https://login.corp.example/oauth2/token\""
            ),
        ));
    };
    if !origin_listed(&config.origins, Some(&origin)) {
        return Err(error(
            "origins",
            format!(
                "the IdP token endpoint {url} gets the user's identity token: add its origin {origin:?} to origins"
            ),
        ));
    }
    if url.starts_with("http://") && config.idp_issuer.starts_with("https://") {
        return Err(error(
            "idp_token_url",
            format!(
                "{url} is plain http while idp_issuer is https: the identity token would travel in clear; use the IdP's https token endpoint"
            ),
        ));
    }
    if reqwest::Url::parse(&config.idp_issuer).is_err() {
        return Err(error(
            "idp_issuer",
            format!(
                "{:?} is not a URL; set the IdP's issuer identifier, as its metadata names it",
                config.idp_issuer
            ),
        ));
    }
    Ok(())
}

fn check_user_config(
    config: &OAuthAuthorizationCodeConfig,
    error: &dyn Fn(&str, String) -> AuthConfigError,
) -> Result<(), AuthConfigError> {
    if config.client_secret_env.is_some() && config.client_id.is_none() {
        return Err(error(
            "client_secret_env",
            "a client secret belongs to a pre-registered client: set client_id too, or drop client_secret_env to register dynamically".into(),
        ));
    }
    if let Some(url) = &config.client_metadata_url {
        let usable = reqwest::Url::parse(url)
            .is_ok_and(|u| u.scheme() == "https" && u.path() != "/" && !u.path().is_empty());
        if !usable {
            return Err(error(
                "client_metadata_url",
                format!(
                    "{url:?} is not an https URL with a path; a Client ID Metadata Document is served at e.g. \"https://quiver.example.com/oauth/client.json\""
                ),
            ));
        }
    }
    if config.scopes.len() > defaults::OAUTH_MAX_SCOPES {
        return Err(error(
            "scopes",
            format!("more than {} scopes", defaults::OAUTH_MAX_SCOPES),
        ));
    }
    Ok(())
}

/// A credential must say where it may go, in ids and origins that can match.
fn check_binding_config(
    config: &AuthConfig,
    error: &dyn Fn(&str, String) -> AuthConfigError,
) -> Result<(), AuthConfigError> {
    let (servers, origins) = config.binding();
    if servers.is_empty() && origins.is_empty() {
        return Err(error(
            "servers",
            "say where this credential may go: servers = [\"SERVER_ID\"] (the records that may name it) and/or origins = [\"https://host\"] (the URLs it may be sent to)".into(),
        ));
    }
    if let Some(bad) = servers
        .iter()
        .find(|id| !crate::registry::is_valid_server_id(id))
    {
        return Err(error(
            "servers",
            format!("{bad:?} is not a server id (letters, digits, `_` and `-`)"),
        ));
    }
    for origin in origins {
        // A pattern (`http://127.0.0.1:*`) has a scheme and no path, like an origin.
        let pattern = origin.contains('*')
            && ["https://", "http://"].iter().any(|scheme| {
                origin
                    .strip_prefix(scheme)
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
            });
        if !pattern && origin_of(origin).as_deref() != Some(origin.trim_end_matches('/')) {
            return Err(error(
                "origins",
                format!(
                    "{origin:?} is not an origin: write scheme://host[:port] with no path, no default port and a lowercase host, e.g. \"https://mcp.example.com\" (`*` matches any run, e.g. \"http://127.0.0.1:*\")"
                ),
            ));
        }
    }
    Ok(())
}

impl AuthError {
    /// Whether only a person (authorizing, or naming a principal) can fix it: no retry
    /// and no backoff would.
    pub(crate) fn needs_person(&self) -> bool {
        matches!(
            self,
            AuthError::NotAuthorized { .. } | AuthError::NoPrincipal { .. }
        )
    }
}

impl AuthSet {
    /// Whether server `server_id` at `url` may name `auth_ref`: the record's id must be in
    /// the credential's `servers` and its URL's origin in its `origins` (each when given).
    /// An undefined `auth_ref` is left to connect time, which says so.
    pub(crate) fn check_binding(
        &self,
        auth_ref: &str,
        server_id: &str,
        url: &str,
    ) -> Result<(), RuleViolation> {
        let Some(config) = self.configs.get(auth_ref) else {
            return Ok(());
        };
        let (servers, origins) = config.binding();
        if !servers.is_empty() && !servers.iter().any(|s| s == server_id) {
            return Err(RuleViolation::new(
                "http.auth_ref",
                format!(
                    "credential `{auth_ref}` is bound to servers {servers:?}, not `{server_id}`; add `{server_id}` to [auth.{auth_ref}] servers in the host config, or name another auth_ref"
                ),
            ));
        }
        let origin = origin_of(url);
        if !origins.is_empty() && !origin_listed(origins, origin.as_deref()) {
            let origin = origin.unwrap_or_else(|| "(none)".into());
            return Err(RuleViolation::new(
                "http.auth_ref",
                format!(
                    "credential `{auth_ref}` may be sent to {origins:?}, not {origin}; add {origin:?} to [auth.{auth_ref}] origins in the host config, or point http.url at a bound origin"
                ),
            ));
        }
        Ok(())
    }
}

/// A connection's source of bearer tokens: OAuth client credentials (the host's own) or a
/// user's grant (one principal's).
#[derive(Clone)]
pub(crate) enum TokenSource {
    Client(Arc<OAuthClient>),
    User(Arc<UserToken>),
}

impl TokenSource {
    /// The grant's DPoP key when its tokens are DPoP-bound and it is known.
    pub(crate) fn dpop(&self) -> Option<Arc<dpop::DpopKey>> {
        match self {
            TokenSource::Client(_) => None,
            TokenSource::User(u) => u.dpop(),
        }
    }

    /// A token for a first attempt; `None` when only the server's 401 can say where to go.
    pub(crate) async fn token_if_known(&self) -> Result<Option<String>, AuthError> {
        match self {
            TokenSource::Client(c) => c.token_if_known().await,
            // Boxed: rmcp's flow futures are large, and a connection is made on a guest's
            // fiber stack.
            TokenSource::User(u) => Box::pin(u.token_if_known()).await,
        }
    }

    /// A token now, for transports that cannot wait for a 401.
    pub(crate) async fn token(&self) -> Result<Option<String>, AuthError> {
        match self {
            TokenSource::Client(c) => c.token().await.map(Some),
            TokenSource::User(u) => Box::pin(u.token_if_known()).await,
        }
    }

    /// A token after the server refused `rejected` with a 401 carrying `challenge`.
    pub(crate) async fn unauthorized(
        &self,
        rejected: Option<&str>,
        challenge: Option<&str>,
    ) -> Result<String, AuthError> {
        match self {
            TokenSource::Client(c) => c.unauthorized(rejected, challenge).await,
            TokenSource::User(u) => Box::pin(u.unauthorized(rejected, challenge)).await,
        }
    }

    /// A token with more scopes after a 403 `insufficient_scope`; `None` when the 403
    /// stands.
    pub(crate) async fn step_up(
        &self,
        rejected: Option<&str>,
        challenge: &str,
    ) -> Result<Option<String>, AuthError> {
        match self {
            TokenSource::Client(c) => c.step_up(rejected, challenge).await,
            TokenSource::User(u) => Box::pin(u.step_up(challenge)).await,
        }
    }
}

/// Credentials of one server, ready to use.
#[derive(Clone)]
pub(crate) enum Credentials {
    ApiKey { header: String, value: String },
    OAuth(Arc<OAuthClient>),
    User(Arc<UserToken>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::ApiKey { header, .. } => write!(f, "ApiKey({header}: <redacted>)"),
            Credentials::OAuth(_) => f.write_str("OAuth(<redacted>)"),
            Credentials::User(_) => f.write_str("OAuth(<user authorization>)"),
        }
    }
}

impl Credentials {
    /// Where the connection gets bearer tokens, for the kinds that use them.
    pub(crate) fn tokens(&self) -> Option<TokenSource> {
        match self {
            Credentials::ApiKey { .. } => None,
            Credentials::OAuth(client) => Some(TokenSource::Client(client.clone())),
            Credentials::User(user) => Some(TokenSource::User(user.clone())),
        }
    }

    /// Resolves `auth_ref` for `server_id` (at connect time, so a rotated key is picked up).
    /// `principal` is whom the connection acts for: it picks the grant of user
    /// authorization, and token exchange uses the subject tokens of that principal's
    /// tasks (`None`: tasks without one).
    pub(crate) fn resolve(
        server_id: &str,
        auth_ref: &str,
        auth: &AuthSet,
        server_url: &str,
        http: OutboundClient,
        principal: Option<&str>,
    ) -> Result<Self, AuthError> {
        let config = auth
            .configs
            .get(auth_ref)
            .ok_or_else(|| AuthError::Undefined {
                server_id: server_id.to_owned(),
                auth_ref: auth_ref.to_owned(),
            })?;
        // The load refused such a record already; a registry built in code meets it here,
        // before any secret is read.
        auth.check_binding(auth_ref, server_id, server_url)
            .map_err(|v| AuthError::NotBound {
                server_id: server_id.to_owned(),
                message: v.message,
            })?;
        match config {
            AuthConfig::ApiKey(key) => {
                let value =
                    std::env::var(&key.value_env).map_err(|_| AuthError::ApiKeyEnvMissing {
                        server_id: server_id.to_owned(),
                        auth_ref: auth_ref.to_owned(),
                        var: key.value_env.clone(),
                    })?;
                let prefix = key.prefix.clone().unwrap_or_else(|| {
                    if key.header.eq_ignore_ascii_case("authorization") {
                        "Bearer ".into()
                    } else {
                        String::new()
                    }
                });
                Ok(Credentials::ApiKey {
                    header: key.header.clone(),
                    value: format!("{prefix}{value}"),
                })
            }
            AuthConfig::OauthClientCredentials(oauth) => {
                Ok(Credentials::OAuth(Arc::new(OAuthClient::new(
                    oauth::Identity {
                        server_id: server_id.to_owned(),
                        auth_ref: auth_ref.to_owned(),
                        principal: principal.map(Arc::from),
                    },
                    oauth.clone(),
                    auth.keys.get(auth_ref).cloned(),
                    server_url.to_owned(),
                    http,
                ))))
            }
            AuthConfig::OauthAuthorizationCode(user) => {
                let principal = principal.ok_or_else(|| AuthError::NoPrincipal {
                    server_id: server_id.to_owned(),
                    auth_ref: auth_ref.to_owned(),
                })?;
                Ok(Credentials::User(Arc::new(UserToken::new(
                    GrantKey::new(server_id, principal),
                    auth_ref.to_owned(),
                    user.clone(),
                    server_url.to_owned(),
                    http,
                    auth.user.grants.clone(),
                    auth.user.authorizer.clone(),
                ))))
            }
            AuthConfig::OauthTokenExchange(exchange) => {
                let client = OAuthClient::new(
                    oauth::Identity {
                        server_id: server_id.to_owned(),
                        auth_ref: auth_ref.to_owned(),
                        principal: principal.map(Arc::from),
                    },
                    exchange.client(),
                    auth.keys.get(auth_ref).cloned(),
                    server_url.to_owned(),
                    http,
                )
                .exchanging(oauth::Exchange {
                    grant: oauth::ExchangeGrant::TokenExchange(exchange.clone()),
                    subjects: auth.subjects.clone(),
                });
                Ok(Credentials::OAuth(Arc::new(client)))
            }
            AuthConfig::OauthEnterpriseManaged(ema) => {
                let client = OAuthClient::new(
                    oauth::Identity {
                        server_id: server_id.to_owned(),
                        auth_ref: auth_ref.to_owned(),
                        principal: principal.map(Arc::from),
                    },
                    ema.client(),
                    auth.keys.get(auth_ref).cloned(),
                    server_url.to_owned(),
                    http,
                )
                .exchanging(oauth::Exchange {
                    grant: oauth::ExchangeGrant::IdJag(ema.clone()),
                    subjects: auth.subjects.clone(),
                });
                Ok(Credentials::OAuth(Arc::new(client)))
            }
            AuthConfig::OauthJwtBearer(bearer) => {
                let client = OAuthClient::new(
                    oauth::Identity {
                        server_id: server_id.to_owned(),
                        auth_ref: auth_ref.to_owned(),
                        principal: principal.map(Arc::from),
                    },
                    bearer.client(),
                    None,
                    server_url.to_owned(),
                    http,
                )
                .asserting(bearer.source());
                Ok(Credentials::OAuth(Arc::new(client)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mcp::egress::{EgressConfig, EgressPolicy};

    const SECRET: &str = "s3cret-value";

    fn shows_no_secret(error: &AuthError) {
        let (shown, debug) = (error.to_string(), format!("{error:?}"));
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!debug.contains(SECRET), "{debug}");
    }

    fn client(allow: &[&str]) -> OutboundClient {
        let policy = EgressPolicy::from_config(&EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            allow_private: vec![],
            proxy: None,
        })
        .unwrap();
        OutboundClient::new(Arc::new(policy), Duration::from_secs(1)).unwrap()
    }

    fn oauth(problem: OAuthProblem) -> AuthError {
        AuthError::OAuth {
            server_id: "web".into(),
            kind: OAuthKind::ClientCredentials,
            auth_ref: "corp".into(),
            problem: Box::new(problem),
        }
    }

    fn load(table: &str) -> Result<AuthSet, AuthConfigError> {
        let text = format!(
            "kind = \"oauth_client_credentials\"\nservers = [\"web\"]\nclient_id = \"q\"\n{table}"
        );
        let config: AuthConfig = toml::from_str(&text).map_err(|e| AuthConfigError {
            field: String::new(),
            message: e.message().to_owned(),
            source: None,
        })?;
        AuthSet::load(
            &BTreeMap::from([("corp".to_owned(), config)]),
            Path::new("."),
        )
    }

    #[test]
    fn auth_tables_name_the_field_and_the_fix() {
        assert!(load("client_secret_env = \"S\"\n").is_ok());
        let cases = [
            ("", "auth.corp.client_secret_env", "private_key_jwt"),
            (
                "token_endpoint_auth = \"private_key_jwt\"\n",
                "auth.corp.private_key_file",
                "PKCS#8",
            ),
            (
                "client_secret_env = \"S\"\ntoken_endpoint_auth = \"client_secret_post\"\nprivate_key_file = \"k.pem\"\n",
                "auth.corp.private_key_file",
                "only used with",
            ),
            (
                "client_secret_env = \"S\"\nsigning_alg = \"ES256\"\n",
                "auth.corp.signing_alg",
                "private_key_file",
            ),
            (
                &format!(
                    "client_secret_env = \"S\"\nscopes = [\"a\"]\nstep_up_scopes = {:?}\n",
                    vec!["b"; defaults::OAUTH_MAX_SCOPES]
                ),
                "auth.corp.scopes",
                "more than 64 scopes",
            ),
            (
                "private_key_file = \"/nonexistent/quiver-key.pem\"\n",
                "auth.corp.private_key_file",
                "cannot read /nonexistent/quiver-key.pem",
            ),
        ];
        for (table, field, fix) in cases {
            let error = load(table).expect_err(table);
            assert_eq!(error.field, field, "{table}");
            assert!(error.message.contains(fix), "{table}: {}", error.message);
        }
        let unknown = load("client_secret_env = \"S\"\nclient_secret = \"x\"\n").unwrap_err();
        assert!(
            unknown.message.contains("unknown field `client_secret`"),
            "{}",
            unknown.message
        );
        let bad_method =
            load("client_secret_env = \"S\"\ntoken_endpoint_auth = \"none\"\n").unwrap_err();
        assert_eq!(bad_method.field, "auth.corp.token_endpoint_auth");
        assert!(
            bad_method
                .message
                .contains("none is for oauth_token_exchange"),
            "{}",
            bad_method.message
        );
    }

    #[test]
    fn a_credential_says_where_it_may_go_and_goes_nowhere_else() {
        let unbound = |table: &str| {
            let config: AuthConfig =
                toml::from_str(&format!("kind = \"api_key\"\nvalue_env = \"K\"\n{table}")).unwrap();
            AuthSet::load(
                &BTreeMap::from([("prod".to_owned(), config)]),
                Path::new("."),
            )
        };
        let error = unbound("").unwrap_err();
        assert_eq!(error.field, "auth.prod.servers");
        assert!(error.message.contains("origins = ["), "{}", error.message);
        let error = unbound("origins = [\"https://x.example/path\"]").unwrap_err();
        assert_eq!(error.field, "auth.prod.origins");

        let set =
            unbound("servers = [\"github\"]\norigins = [\"https://api.example.com\"]").unwrap();
        set.check_binding("prod", "github", "https://api.example.com/mcp")
            .unwrap();
        let other_id = set
            .check_binding("prod", "evil", "https://api.example.com/mcp")
            .unwrap_err();
        assert_eq!(other_id.field, "http.auth_ref");
        assert!(
            other_id.message.contains("[auth.prod] servers"),
            "{other_id}"
        );
        let other_url = set
            .check_binding("prod", "github", "https://evil.example/mcp")
            .unwrap_err();
        assert!(
            other_url.message.contains("https://evil.example")
                && other_url.message.contains("[auth.prod] origins"),
            "{other_url}"
        );
        let patterned = unbound("origins = [\"http://127.0.0.1:*\"]").unwrap();
        patterned
            .check_binding("prod", "any", "http://127.0.0.1:8080/mcp")
            .unwrap();
        assert!(
            patterned
                .check_binding("prod", "any", "http://127.0.0.2:8080/mcp")
                .is_err()
        );
    }

    #[test]
    fn auth_errors_keep_their_text_and_never_show_a_secret() {
        let configs = BTreeMap::from([(
            "key".to_owned(),
            AuthConfig::ApiKey(ApiKeyConfig {
                servers: vec!["web".into()],
                origins: vec![],
                value_env: "QUIVER_UNIT_TEST_UNSET_KEY".into(),
                header: authorization(),
                prefix: None,
            }),
        )]);
        let configs = AuthSet::load(&configs, Path::new(".")).unwrap();
        let http = client(&["https://*:*"]);
        let undefined =
            Credentials::resolve("web", "nope", &configs, "https://x", http.clone(), None)
                .expect_err("undefined");
        assert_eq!(
            undefined.to_string(),
            "server `web`: http.auth_ref `nope` is not defined in the host config ([auth.nope])"
        );
        let missing = Credentials::resolve("web", "key", &configs, "https://x", http.clone(), None)
            .expect_err("unset");
        assert_eq!(
            missing.to_string(),
            "server `web`: api_key auth `key`: environment variable `QUIVER_UNIT_TEST_UNSET_KEY` is not set"
        );

        // A token endpoint whose query carries the secret, outside the egress rules.
        let denied = http
            .post(&format!("http://tokens.example/t?client_secret={SECRET}"))
            .err()
            .expect("refused");
        let errors = [
            undefined,
            missing,
            oauth(OAuthProblem::TokenEndpointDenied(denied)),
            oauth(OAuthProblem::SecretEnvMissing {
                var: "CLIENT_SECRET".into(),
            }),
            oauth(OAuthProblem::TokenRefused {
                url: "https://tokens.example/t".into(),
                status: reqwest::StatusCode::UNAUTHORIZED,
                error: "invalid_client".into(),
            }),
            oauth(OAuthProblem::NoAccessToken),
        ];
        for error in &errors {
            shows_no_secret(error);
        }
        assert_eq!(
            errors[2].to_string(),
            "server `web`: oauth_client_credentials auth `corp`: token endpoint: egress policy: \
             http://tokens.example:80 is not in the egress allowlist ([egress] allow)"
        );
        assert_eq!(
            errors[4].to_string(),
            "server `web`: oauth_client_credentials auth `corp`: token endpoint \
             https://tokens.example/t answered HTTP 401 Unauthorized (invalid_client); check \
             client_id and the secret or key"
        );
        let source = std::error::Error::source(&errors[2]).expect("the problem");
        assert!(
            source
                .to_string()
                .starts_with("token endpoint: egress policy")
        );
    }
}
