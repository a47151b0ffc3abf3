//! Credentials for remote MCP servers, referenced by a registry record's `http.auth_ref` and
//! defined only in host config (`[auth.NAME]` of `quiver.toml`), never in a guest's reach.
//!
//! - `api_key`: a static key from an environment variable, sent in a header.
//! - `oauth_client_credentials`: OAuth 2.0 client credentials. The token endpoint is
//!   configured, or discovered from the authorization server's metadata (`issuer`, or the
//!   MCP server's protected-resource metadata). Tokens are cached and fetched again shortly
//!   before they expire; a 401 from the server triggers one refresh and one retry.
//!
//! Secrets are read from the environment when used and never appear in logs or errors.
//! Discovery and token requests go through the egress-checked client like every other
//! request, so a token endpoint named by metadata gets the secret only if the `[egress]`
//! allow rules cover it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::outbound::{EgressRefused, OutboundClient, UrlParseError};

/// Credentials that cannot be resolved or a token that cannot be had. It names the server,
/// the `auth_ref`, the variable and the endpoint; never a key, secret or token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthError {
    #[error(
        "server `{server_id}`: http.auth_ref `{auth_ref}` is not defined in the host config ([auth.{auth_ref}])"
    )]
    Undefined { server_id: String, auth_ref: String },
    #[error(
        "server `{server_id}`: api_key auth `{auth_ref}`: environment variable `{var}` is not set"
    )]
    ApiKeyEnvMissing {
        server_id: String,
        auth_ref: String,
        var: String,
    },
    #[error("server `{server_id}`: oauth_client_credentials auth `{auth_ref}`: {problem}")]
    OAuth {
        server_id: String,
        auth_ref: String,
        #[source]
        problem: OAuthProblem,
    },
}

/// What went wrong getting an OAuth client-credentials token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OAuthProblem {
    /// The MCP server's URL, needed for discovery, does not parse.
    #[error("{0}")]
    ServerUrl(#[source] UrlParseError),
    #[error("metadata document: {0}")]
    MetadataDenied(#[source] EgressRefused),
    #[error("cannot fetch {url}: {source}")]
    MetadataUnreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered HTTP {status}")]
    MetadataStatus {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("{url} is not JSON: {source}")]
    MetadataNotJson {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "the server's protected-resource metadata names no authorization server; set token_url"
    )]
    NoAuthorizationServer,
    #[error("the metadata of {issuer} has no token_endpoint; set token_url")]
    NoTokenEndpoint { issuer: String },
    /// Discovery failed or named a token endpoint outside the egress rules; checked before
    /// the secret is read.
    #[error("token endpoint: {0}")]
    TokenEndpointDenied(#[source] EgressRefused),
    /// The variable holding the client secret is not set.
    #[error("environment variable `{var}` is not set")]
    SecretEnvMissing { var: String },
    #[error("token endpoint {url} unreachable: {source}")]
    TokenUnreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The token endpoint said no; `error` is its OAuth error code.
    #[error(
        "token endpoint {url} answered HTTP {status} ({error}); check client_id and the secret"
    )]
    TokenRefused {
        url: String,
        status: reqwest::StatusCode,
        error: String,
    },
    #[error("the token response has no access_token")]
    NoAccessToken,
}

/// How long before expiry a cached token is replaced: 30 s, or a tenth of a short-lived
/// token's lifetime.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);

/// When to fetch a token again. `lifetime` comes from the token endpoint: it is capped at
/// [`defaults::OAUTH_TOKEN_MAX_LIFETIME`] so a huge `expires_in` cannot overflow the clock.
fn refresh_at(fetched: Instant, lifetime: Duration) -> Instant {
    let lifetime = lifetime.min(crate::defaults::OAUTH_TOKEN_MAX_LIFETIME);
    fetched + lifetime - REFRESH_MARGIN.min(lifetime / 10)
}

/// `[auth.NAME]` of the host config.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AuthConfig {
    ApiKey(ApiKeyConfig),
    OauthClientCredentials(OAuthClientCredentialsConfig),
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
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
    pub client_id: String,
    /// Environment variable holding the client secret.
    pub client_secret_env: String,
    /// The token endpoint; without it, discovered from `issuer` or the server's metadata.
    #[serde(default)]
    pub token_url: Option<String>,
    /// The authorization server, for metadata discovery.
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The RFC 8707 `resource` parameter (default: the MCP server's URL).
    #[serde(default)]
    pub resource: Option<String>,
}

/// Credentials of one server, ready to use.
#[derive(Clone)]
pub(crate) enum Credentials {
    ApiKey { header: String, value: String },
    OAuth(std::sync::Arc<OAuthClient>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::ApiKey { header, .. } => write!(f, "ApiKey({header}: <redacted>)"),
            Credentials::OAuth(_) => f.write_str("OAuth(<client credentials>)"),
        }
    }
}

impl Credentials {
    /// Resolves `auth_ref` for `server_id` (at connect time, so a rotated key is picked up).
    pub(crate) fn resolve(
        server_id: &str,
        auth_ref: &str,
        configs: &BTreeMap<String, AuthConfig>,
        server_url: &str,
        http: OutboundClient,
    ) -> Result<Self, AuthError> {
        let config = configs.get(auth_ref).ok_or_else(|| AuthError::Undefined {
            server_id: server_id.to_owned(),
            auth_ref: auth_ref.to_owned(),
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
                Ok(Credentials::OAuth(std::sync::Arc::new(OAuthClient {
                    server_id: server_id.to_owned(),
                    auth_ref: auth_ref.to_owned(),
                    config: oauth.clone(),
                    server_url: server_url.to_owned(),
                    http,
                    state: tokio::sync::Mutex::new(OAuthState::default()),
                })))
            }
        }
    }
}

#[derive(Default)]
struct OAuthState {
    token_url: Option<String>,
    /// The cached token and when to replace it.
    token: Option<(String, Instant)>,
}

/// An OAuth client-credentials token source for one server.
pub(crate) struct OAuthClient {
    server_id: String,
    auth_ref: String,
    config: OAuthClientCredentialsConfig,
    server_url: String,
    /// Discovery and token requests, each checked against the egress policy.
    http: OutboundClient,
    state: tokio::sync::Mutex<OAuthState>,
}

impl OAuthClient {
    fn fail(&self, problem: OAuthProblem) -> AuthError {
        AuthError::OAuth {
            server_id: self.server_id.clone(),
            auth_ref: self.auth_ref.clone(),
            problem,
        }
    }

    /// A valid token: the cached one, or a fresh one when none is cached or it is about to
    /// expire.
    pub(crate) async fn token(&self) -> Result<String, AuthError> {
        let mut state = self.state.lock().await;
        if let Some((token, refresh_at)) = &state.token
            && Instant::now() < *refresh_at
        {
            return Ok(token.clone());
        }
        self.fetch(&mut state).await
    }

    /// A new token after the server rejected `rejected` (unless another caller already
    /// replaced it).
    pub(crate) async fn refresh(&self, rejected: &str) -> Result<String, AuthError> {
        let mut state = self.state.lock().await;
        if let Some((token, _)) = &state.token
            && token != rejected
        {
            return Ok(token.clone());
        }
        self.fetch(&mut state).await
    }

    async fn fetch(&self, state: &mut OAuthState) -> Result<String, AuthError> {
        let token_url = match &state.token_url {
            Some(url) => url.clone(),
            None => {
                let url = self.discover_token_url().await?;
                state.token_url = Some(url.clone());
                url
            }
        };
        // Checked before the secret is even read: a token endpoint named by metadata may
        // point anywhere, and it is what receives the secret.
        let request = self
            .http
            .post(&token_url)
            .map_err(|denied| self.fail(OAuthProblem::TokenEndpointDenied(denied)))?;
        let secret = std::env::var(&self.config.client_secret_env).map_err(|_| {
            self.fail(OAuthProblem::SecretEnvMissing {
                var: self.config.client_secret_env.clone(),
            })
        })?;
        let mut form = vec![("grant_type", "client_credentials".to_owned())];
        if !self.config.scopes.is_empty() {
            form.push(("scope", self.config.scopes.join(" ")));
        }
        form.push((
            "resource",
            self.config
                .resource
                .clone()
                .unwrap_or_else(|| self.server_url.clone()),
        ));
        let response = request
            .basic_auth(&self.config.client_id, Some(secret))
            .form(&form)
            .send()
            .await
            .map_err(|source| {
                self.fail(OAuthProblem::TokenUnreachable {
                    url: token_url.clone(),
                    source,
                })
            })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let error = body["error"].as_str().unwrap_or("no error code");
            return Err(self.fail(OAuthProblem::TokenRefused {
                url: token_url,
                status,
                error: error.to_owned(),
            }));
        }
        let token = body["access_token"]
            .as_str()
            .ok_or_else(|| self.fail(OAuthProblem::NoAccessToken))?;
        let lifetime = Duration::from_secs(body["expires_in"].as_u64().unwrap_or(3600));
        tracing::debug!(server_id = %self.server_id, expires_in_s = lifetime.as_secs(), "fetched an OAuth access token");
        state.token = Some((token.to_owned(), refresh_at(Instant::now(), lifetime)));
        Ok(token.to_owned())
    }

    /// The token endpoint from the configured URL, the issuer's metadata, or the server's
    /// protected-resource metadata (RFC 9728) and then its authorization server's.
    async fn discover_token_url(&self) -> Result<String, AuthError> {
        if let Some(url) = &self.config.token_url {
            return Ok(url.clone());
        }
        let issuer = match &self.config.issuer {
            Some(issuer) => issuer.clone(),
            None => {
                let origin = reqwest::Url::parse(&self.server_url)
                    .map_err(|e| self.fail(OAuthProblem::ServerUrl(e)))?
                    .origin()
                    .ascii_serialization();
                let metadata = self
                    .get_json(&format!("{origin}/.well-known/oauth-protected-resource"))
                    .await?;
                metadata["authorization_servers"][0]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| self.fail(OAuthProblem::NoAuthorizationServer))?
            }
        };
        let metadata = self
            .get_json(&format!(
                "{}/.well-known/oauth-authorization-server",
                issuer.trim_end_matches('/')
            ))
            .await?;
        metadata["token_endpoint"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.fail(OAuthProblem::NoTokenEndpoint { issuer }))
    }

    async fn get_json(&self, url: &str) -> Result<Value, AuthError> {
        let response = self
            .http
            .get(url)
            .map_err(|denied| self.fail(OAuthProblem::MetadataDenied(denied)))?
            .send()
            .await
            .map_err(|source| {
                self.fail(OAuthProblem::MetadataUnreachable {
                    url: url.to_owned(),
                    source,
                })
            })?;
        if !response.status().is_success() {
            return Err(self.fail(OAuthProblem::MetadataStatus {
                url: url.to_owned(),
                status: response.status(),
            }));
        }
        response.json().await.map_err(|source| {
            self.fail(OAuthProblem::MetadataNotJson {
                url: url.to_owned(),
                source,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_expires_in_does_not_overflow_the_clock() {
        let now = std::time::Instant::now();
        let at = super::refresh_at(now, std::time::Duration::from_secs(u64::MAX));
        assert!(at > now && at <= now + crate::defaults::OAUTH_TOKEN_MAX_LIFETIME);
        let short = super::refresh_at(now, std::time::Duration::from_secs(60));
        assert_eq!(short, now + std::time::Duration::from_secs(54));
    }

    use std::sync::Arc;

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
        })
        .unwrap();
        OutboundClient::new(Arc::new(policy), Duration::from_secs(1)).unwrap()
    }

    fn oauth(problem: OAuthProblem) -> AuthError {
        AuthError::OAuth {
            server_id: "web".into(),
            auth_ref: "corp".into(),
            problem,
        }
    }

    #[test]
    fn auth_errors_keep_their_text_and_never_show_a_secret() {
        let configs = BTreeMap::from([(
            "key".to_owned(),
            AuthConfig::ApiKey(ApiKeyConfig {
                value_env: "QUIVER_UNIT_TEST_UNSET_KEY".into(),
                header: authorization(),
                prefix: None,
            }),
        )]);
        let http = client(&["https://*:*"]);
        let undefined = Credentials::resolve("web", "nope", &configs, "https://x", http.clone())
            .expect_err("undefined");
        assert_eq!(
            undefined.to_string(),
            "server `web`: http.auth_ref `nope` is not defined in the host config ([auth.nope])"
        );
        let missing = Credentials::resolve("web", "key", &configs, "https://x", http.clone())
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
             client_id and the secret"
        );
        let source = std::error::Error::source(&errors[2]).expect("the problem");
        assert!(
            source
                .to_string()
                .starts_with("token endpoint: egress policy")
        );
    }
}
