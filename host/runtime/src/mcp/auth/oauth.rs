//! OAuth 2.0 client credentials for one remote server, as the MCP authorization spec has
//! a client without a browser do it.
//!
//! Where the token endpoint is: `token_url` if configured; else the metadata of `issuer`
//! (only its authorization-server metadata, which must name that issuer); else discovered from the server itself, with rmcp's `AuthorizationManager`: the
//! `resource_metadata` URL of the server's 401 challenge, then the path-based and root
//! `/.well-known/oauth-protected-resource` URIs (RFC 9728), then the authorization server's
//! RFC 8414 or OpenID metadata (path insertion, issuer checked). Every one of those
//! requests goes through [`OutboundClient`], so the egress rules apply to each.
//!
//! Without a known endpoint the first request goes out without a token: the spec's flow
//! starts from the server's 401, whose challenge also names the scopes. Scopes are the
//! configured ones, else the challenge's, else the protected-resource metadata's
//! `scopes_supported`. A 403 `insufficient_scope` gets a new token for the union of the
//! scopes held and those asked for ([`OAuthClient::step_up`]), within the configured
//! `scopes` and `step_up_scopes` when either is set, and never more than
//! [`defaults::OAUTH_MAX_SCOPES`].
//!
//! The token request itself is ours, not rmcp's: rmcp picks the client authentication
//! from metadata with no override, and its `private_key_jwt` needs aws-lc ([`super::jwt`]
//! signs with ring). Tokens are cached until shortly before they expire.
//!
//! The same client does token exchange (RFC 8693) for `oauth_token_exchange`: the grant
//! carries the subject token of a running task of the client's principal
//! ([`super::SubjectTokens`]), and the cached token is kept only while that subject
//! token is the current one (a new task's newer token is exchanged again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::transport::auth::{
    AuthorizationManager, OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRequest,
    WWWAuthenticateParams,
};
use serde_json::Value;

use super::{
    AuthError, ClientKey, OAuthClientCredentialsConfig, OAuthEnterpriseManagedConfig, OAuthProblem,
    OAuthTokenExchangeConfig, SubjectToken, SubjectTokens, TokenEndpointAuth, TokenType,
};
use crate::defaults;
use crate::mcp::error::error_chain;
use crate::mcp::outbound::{OutboundClient, read_capped};

const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// When to fetch a token again. `lifetime` comes from the token endpoint: it is kept within
/// [`defaults::OAUTH_TOKEN_MIN_LIFETIME`] (so `expires_in: 0` cannot make every request
/// fetch a token) and [`defaults::OAUTH_TOKEN_MAX_LIFETIME`] (so a huge one cannot
/// overflow the clock).
fn refresh_at(fetched: Instant, lifetime: Duration) -> Instant {
    let lifetime = lifetime.clamp(
        defaults::OAUTH_TOKEN_MIN_LIFETIME,
        defaults::OAUTH_TOKEN_MAX_LIFETIME,
    );
    fetched + lifetime - defaults::OAUTH_TOKEN_REFRESH_MARGIN.min(lifetime / 10)
}

/// Which server and `auth_ref` a client serves, for its errors.
pub(crate) struct Identity {
    pub(crate) server_id: String,
    pub(crate) auth_ref: String,
    /// Whom the connection acts for (its subject token's principal for token exchange).
    pub(crate) principal: Option<std::sync::Arc<str>>,
}

/// What a token-exchange client asks for, and where it finds the subject token.
pub(crate) struct Exchange {
    pub(crate) grant: ExchangeGrant,
    pub(crate) subjects: SubjectTokens,
}

/// How the subject token becomes a token for the server.
pub(crate) enum ExchangeGrant {
    /// RFC 8693 at the server's authorization server.
    TokenExchange(OAuthTokenExchangeConfig),
    /// RFC 8693 at the enterprise IdP for an ID-JAG, then RFC 7523 with it at the server's
    /// authorization server.
    IdJag(OAuthEnterpriseManagedConfig),
}

/// Where and how tokens are requested, once known.
#[derive(Clone)]
struct Endpoint {
    token_url: String,
    /// The authorization server's issuer: the default audience of a client assertion.
    issuer: Option<String>,
    method: TokenEndpointAuth,
}

#[derive(Default)]
struct State {
    endpoint: Option<Endpoint>,
    /// The scopes of the last token request; step-up only adds to them.
    scopes: Vec<String>,
    /// The cached token and when to replace it.
    token: Option<(String, Instant)>,
    /// For token exchange, the fingerprint of the subject token the cached one came from.
    subject: Option<[u8; 32]>,
    /// The last failed discovery (its error text) and when it failed.
    failed: Option<(String, Instant)>,
}

impl State {
    /// The cached token while it is fresh and, for token exchange, came from `subject`.
    fn fresh_token(&self, subject: Option<&SubjectToken>) -> Option<String> {
        if self.subject != subject.map(SubjectToken::fingerprint) {
            return None;
        }
        match &self.token {
            Some((token, refresh_at)) if Instant::now() < *refresh_at => Some(token.clone()),
            _ => None,
        }
    }

    /// A discovery failure less than [`defaults::OAUTH_DISCOVERY_RETRY_AFTER`] old at `now`:
    /// its text and how long until discovery is tried again.
    fn recent_failure(&self, now: Instant) -> Option<(&str, Duration)> {
        let (problem, at) = self.failed.as_ref()?;
        let left = defaults::OAUTH_DISCOVERY_RETRY_AFTER
            .checked_sub(now.saturating_duration_since(*at))?;
        (!left.is_zero()).then_some((problem.as_str(), left))
    }

    /// The cached token unless it is the one the server just rejected or, for token
    /// exchange, came from another subject token.
    fn other_than(&self, rejected: Option<&str>, subject: Option<&SubjectToken>) -> Option<String> {
        if self.subject != subject.map(SubjectToken::fingerprint) {
            return None;
        }
        match &self.token {
            Some((token, _)) if Some(token.as_str()) != rejected => Some(token.clone()),
            _ => None,
        }
    }
}

/// An OAuth client-credentials token source for one server.
pub(crate) struct OAuthClient {
    who: Identity,
    config: OAuthClientCredentialsConfig,
    key: Option<Arc<ClientKey>>,
    server_url: String,
    /// Discovery and token requests, each checked against the egress policy.
    http: OutboundClient,
    /// The whole discovery's deadline ([`defaults::OAUTH_DISCOVERY_TIMEOUT`]; shorter in
    /// tests).
    discovery_timeout: Duration,
    state: tokio::sync::Mutex<State>,
    /// Set for token exchange: the grant is RFC 8693 instead of client credentials.
    exchange: Option<Exchange>,
    /// Set for workload identity: the grant is an RFC 7523 JWT bearer with this assertion.
    assertion: Option<super::AssertionSource>,
}

impl OAuthClient {
    pub(super) fn new(
        who: Identity,
        config: OAuthClientCredentialsConfig,
        key: Option<Arc<ClientKey>>,
        server_url: String,
        http: OutboundClient,
    ) -> Self {
        Self {
            who,
            config,
            key,
            server_url,
            http,
            discovery_timeout: defaults::OAUTH_DISCOVERY_TIMEOUT,
            state: tokio::sync::Mutex::new(State::default()),
            exchange: None,
            assertion: None,
        }
    }

    /// The same client presenting a workload's JWT (RFC 7523 §2.1) instead.
    pub(super) fn asserting(mut self, source: super::AssertionSource) -> Self {
        self.assertion = Some(source);
        self
    }

    /// The same client exchanging subject tokens (RFC 8693) instead.
    pub(super) fn exchanging(mut self, exchange: Exchange) -> Self {
        self.exchange = Some(exchange);
        self
    }

    fn kind(&self) -> super::OAuthKind {
        match (&self.exchange, &self.assertion) {
            (
                Some(Exchange {
                    grant: ExchangeGrant::IdJag(_),
                    ..
                }),
                _,
            ) => super::OAuthKind::EnterpriseManaged,
            (Some(_), _) => super::OAuthKind::TokenExchange,
            (None, Some(_)) => super::OAuthKind::JwtBearer,
            (None, None) => super::OAuthKind::ClientCredentials,
        }
    }

    fn fail(&self, problem: OAuthProblem) -> AuthError {
        AuthError::OAuth {
            server_id: self.who.server_id.clone(),
            kind: self.kind(),
            auth_ref: self.who.auth_ref.clone(),
            problem: Box::new(problem),
        }
    }

    /// For token exchange, the subject token of a running task of the principal; `None`
    /// for client credentials. Read at each use: tasks come and go.
    fn subject(&self) -> Result<Option<SubjectToken>, AuthError> {
        let Some(exchange) = &self.exchange else {
            return Ok(None);
        };
        let principal = self.who.principal.as_deref();
        exchange
            .subjects
            .current(principal)
            .map(Some)
            .ok_or_else(|| {
                AuthError::no_subject(
                    &self.who.server_id,
                    self.kind(),
                    &self.who.auth_ref,
                    principal,
                )
            })
    }

    /// A valid token, discovering the endpoint without a challenge if need be (rmcp
    /// probes the server for one).
    pub(crate) async fn token(&self) -> Result<String, AuthError> {
        let subject = self.subject()?;
        let mut state = self.state.lock().await;
        if let Some(token) = state.fresh_token(subject.as_ref()) {
            return Ok(token);
        }
        self.ensure_endpoint(&mut state, None).await?;
        self.fetch(&mut state, subject.as_ref()).await
    }

    /// The token for a first attempt: cached, or fetched when the endpoint is known
    /// without asking the server. `None` when only the server's 401 can say where to go.
    pub(crate) async fn token_if_known(&self) -> Result<Option<String>, AuthError> {
        let subject = self.subject()?;
        let mut state = self.state.lock().await;
        if let Some(token) = state.fresh_token(subject.as_ref()) {
            return Ok(Some(token));
        }
        if state.endpoint.is_none()
            && self.config.token_url.is_none()
            && self.config.issuer.is_none()
        {
            return Ok(None);
        }
        self.ensure_endpoint(&mut state, None).await?;
        self.fetch(&mut state, subject.as_ref()).await.map(Some)
    }

    /// A token after the server answered 401 to `rejected` (no token, or an expired or
    /// revoked one) with `challenge` (its `WWW-Authenticate`): another caller's newer
    /// token, or a new one, discovering the endpoint from the challenge if need be.
    pub(crate) async fn unauthorized(
        &self,
        rejected: Option<&str>,
        challenge: Option<&str>,
    ) -> Result<String, AuthError> {
        let subject = self.subject()?;
        let mut state = self.state.lock().await;
        if let Some(token) = state.other_than(rejected, subject.as_ref()) {
            return Ok(token);
        }
        self.ensure_endpoint(&mut state, challenge).await?;
        self.fetch(&mut state, subject.as_ref()).await
    }

    /// A token for more scopes after a 403 `insufficient_scope` `challenge` to `rejected`:
    /// the union of the scopes held and those challenged, bounded by [`Self::widen`].
    /// `None` when the challenge is not a step-up or asks for nothing new (the 403 stands).
    pub(crate) async fn step_up(
        &self,
        rejected: Option<&str>,
        challenge: &str,
    ) -> Result<Option<String>, AuthError> {
        let base = reqwest::Url::parse(&self.server_url)
            .map_err(|e| self.fail(OAuthProblem::ServerUrl(e)))?;
        let params = WWWAuthenticateParams::parse(challenge, &base);
        if !params.is_insufficient_scope() {
            return Ok(None);
        }
        let wanted: Vec<String> = params
            .scope
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let subject = self.subject()?;
        let mut state = self.state.lock().await;
        if wanted.iter().all(|scope| state.scopes.contains(scope)) {
            // Another call stepped up already, or the server wants what this token has.
            return Ok(state.other_than(rejected, subject.as_ref()));
        }
        self.ensure_endpoint(&mut state, Some(challenge)).await?;
        let Some(wider) = self
            .widen(&state.scopes, &wanted)
            .map_err(|problem| self.fail(problem))?
        else {
            return Ok(state.other_than(rejected, subject.as_ref()));
        };
        // The wider scopes are kept only once a token was issued for them: a server naming
        // a scope the authorization server refuses must not break later token requests.
        let granted = std::mem::replace(&mut state.scopes, wider);
        tracing::info!(
            server_id = %self.who.server_id,
            scopes = %state.scopes.join(" "),
            "MCP server asked for more scopes; requesting a new token"
        );
        let token = self.fetch(&mut state, subject.as_ref()).await;
        if token.is_err() {
            state.scopes = granted;
        }
        token.map(Some)
    }

    /// The scopes to ask for when a step-up challenge wants `wanted`: `held` and what it
    /// lacks, or `None` when it lacks nothing. With `scopes` or `step_up_scopes` configured,
    /// only scopes they list may be added; in any case at most
    /// [`defaults::OAUTH_MAX_SCOPES`] in all, so scopes cannot grow without bound.
    fn widen(
        &self,
        held: &[String],
        wanted: &[String],
    ) -> Result<Option<Vec<String>>, OAuthProblem> {
        let mut wider = held.to_vec();
        for scope in wanted {
            if !wider.contains(scope) {
                wider.push(scope.clone());
            }
        }
        let added = &wider[held.len()..];
        if added.is_empty() {
            return Ok(None);
        }
        let (configured, step_up) = (&self.config.scopes, &self.config.step_up_scopes);
        if !configured.is_empty() || !step_up.is_empty() {
            let refused: Vec<String> = added
                .iter()
                .filter(|scope| !configured.contains(scope) && !step_up.contains(scope))
                .cloned()
                .collect();
            if !refused.is_empty() {
                return Err(OAuthProblem::StepUpRefused { scopes: refused });
            }
        }
        if wider.len() > defaults::OAUTH_MAX_SCOPES {
            return Err(OAuthProblem::TooManyScopes { count: wider.len() });
        }
        Ok(Some(wider))
    }

    /// Makes sure the token endpoint is known, discovering it within one deadline. A failure
    /// is remembered for [`defaults::OAUTH_DISCOVERY_RETRY_AFTER`]: calls meanwhile (those
    /// that waited for this lock too) fail at once with the same error instead of each
    /// running the whole discovery again while holding the server's token lock.
    async fn ensure_endpoint(
        &self,
        state: &mut State,
        challenge: Option<&str>,
    ) -> Result<(), AuthError> {
        if state.endpoint.is_some() {
            return Ok(());
        }
        if let Some((problem, left)) = state.recent_failure(Instant::now()) {
            return Err(self.fail(OAuthProblem::DiscoveryFailedRecently {
                problem: problem.to_owned(),
                retry_in_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            }));
        }
        let found = tokio::time::timeout(self.discovery_timeout, self.discover(challenge))
            .await
            .unwrap_or_else(|_| {
                Err(OAuthProblem::DiscoveryTimeout {
                    ms: u64::try_from(self.discovery_timeout.as_millis()).unwrap_or(u64::MAX),
                })
            });
        match found {
            Ok((endpoint, scopes)) => {
                state.endpoint = Some(endpoint);
                state.scopes = scopes;
                state.failed = None;
                Ok(())
            }
            Err(problem) => {
                state.failed = Some((problem.to_string(), Instant::now()));
                Err(self.fail(problem))
            }
        }
    }

    /// Finds the token endpoint, how to authenticate there, and the scopes to ask for.
    async fn discover(
        &self,
        challenge: Option<&str>,
    ) -> Result<(Endpoint, Vec<String>), OAuthProblem> {
        if let Some(token_url) = &self.config.token_url {
            self.check_in_clear(token_url, self.config.issuer.as_deref())?;
            let endpoint = Endpoint {
                token_url: token_url.clone(),
                issuer: self.config.issuer.clone(),
                method: self.method(None)?,
            };
            return Ok((endpoint, self.config.scopes.clone()));
        }
        // A configured issuer is asked directly, for its own metadata only: the server's
        // challenge does not apply, and a protected-resource document at the issuer must
        // not send the credential to another authorization server.
        let (base, challenge) = match &self.config.issuer {
            Some(issuer) => (issuer.as_str(), None),
            None => (self.server_url.as_str(), challenge),
        };
        let discovery =
            |e: rmcp::transport::auth::AuthError| OAuthProblem::Discovery(error_chain(&e));
        let client = Discovery {
            http: self.http.clone(),
            authorization_server_only: self.config.issuer.is_some(),
        };
        let manager = AuthorizationManager::new_with_oauth_http_client(base, Arc::new(client))
            .await
            .map_err(discovery)?;
        let resolution = manager
            .resolve_metadata_from_challenge(challenge)
            .await
            .map_err(discovery)?;
        if !resolution.source.is_discovered() {
            return Err(match &self.config.issuer {
                Some(issuer) => OAuthProblem::NoIssuerMetadata {
                    issuer: issuer.clone(),
                },
                None => OAuthProblem::NoMetadata {
                    url: base.to_owned(),
                },
            });
        }
        let metadata = resolution.metadata;
        // rmcp checks the issuer against the URL the metadata came from; its last candidate
        // for an issuer with a path is the origin's, so the configured one is checked here.
        if let Some(configured) = &self.config.issuer
            && !metadata
                .issuer
                .as_deref()
                .is_some_and(|received| same_issuer(received, configured))
        {
            return Err(OAuthProblem::IssuerMismatch {
                configured: configured.clone(),
                received: metadata.issuer.unwrap_or_else(|| "none".into()),
            });
        }
        let issuer = metadata.issuer.clone().or(self.config.issuer.clone());
        if metadata.token_endpoint.is_empty() {
            return Err(OAuthProblem::NoTokenEndpoint {
                issuer: issuer.unwrap_or_else(|| base.to_owned()),
            });
        }
        let listed = |field: &str| -> Option<Vec<String>> {
            let values = metadata.additional_fields.get(field)?.as_array()?;
            Some(
                values
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            )
        };
        self.check_in_clear(&metadata.token_endpoint, issuer.as_deref())?;
        // Only the operator names where a secret or assertion may go: a configured issuer,
        // or for an endpoint the server's own metadata named, an origin the binding lists.
        let endpoint_origin = super::origin_of(&metadata.token_endpoint);
        if self.config.issuer.is_none()
            && !super::origin_listed(&self.config.origins, endpoint_origin.as_deref())
        {
            return Err(OAuthProblem::TokenEndpointNotBound {
                url: metadata.token_endpoint.clone(),
                origin: endpoint_origin.unwrap_or_else(|| "(none)".into()),
                auth_ref: self.who.auth_ref.clone(),
            });
        }
        let method = self.method(listed("token_endpoint_auth_methods_supported"))?;
        if method == TokenEndpointAuth::PrivateKeyJwt
            && let (Some(key), Some(algs)) = (
                &self.key,
                listed("token_endpoint_auth_signing_alg_values_supported"),
            )
            && !algs.iter().any(|alg| alg == key.alg().name())
        {
            return Err(OAuthProblem::SigningAlgRefused {
                alg: key.alg().name(),
                offered: algs,
            });
        }
        let scopes = if self.config.scopes.is_empty() {
            // Client credentials get no refresh token: offline_access would be noise.
            let mut scopes = manager.select_initial_scopes(&[]).await;
            scopes.retain(|scope| scope != "offline_access");
            if scopes.len() > defaults::OAUTH_MAX_SCOPES {
                return Err(OAuthProblem::TooManyScopes {
                    count: scopes.len(),
                });
            }
            scopes
        } else {
            self.config.scopes.clone()
        };
        tracing::debug!(
            server_id = %self.who.server_id,
            token_endpoint = %metadata.token_endpoint,
            method = method.name(),
            "discovered the OAuth token endpoint"
        );
        let endpoint = Endpoint {
            token_url: metadata.token_endpoint,
            issuer,
            method,
        };
        Ok((endpoint, scopes))
    }

    /// Refuses a plain-http `token_url` when the authorization server (`issuer`) or the MCP
    /// server is reached over https: the egress rules may allow plain http (for local
    /// servers), but the secret or assertion must not cross the network in clear where
    /// everything around it is encrypted.
    fn check_in_clear(&self, token_url: &str, issuer: Option<&str>) -> Result<(), OAuthProblem> {
        let scheme = |url: &str| reqwest::Url::parse(url).map(|u| u.scheme().to_owned());
        if scheme(token_url).is_ok_and(|s| s == "http")
            && let Some(https) = [issuer, Some(self.server_url.as_str())]
                .into_iter()
                .flatten()
                .find(|url| scheme(url).is_ok_and(|s| s == "https"))
        {
            return Err(OAuthProblem::TokenEndpointInClear {
                url: token_url.to_owned(),
                https: https.to_owned(),
            });
        }
        Ok(())
    }

    /// The client authentication to use: the configured one; `private_key_jwt` with a
    /// key; else from the methods the server lists (`offered`), Basic first, as RFC 8414
    /// defaults to it.
    fn method(&self, offered: Option<Vec<String>>) -> Result<TokenEndpointAuth, OAuthProblem> {
        if let Some(method) = self.config.token_endpoint_auth {
            return Ok(method);
        }
        let candidates: &[TokenEndpointAuth] = if self.key.is_some() {
            &[TokenEndpointAuth::PrivateKeyJwt]
        } else if self.config.client_secret_env.is_none() {
            // Only token exchange may have neither (the load refuses it otherwise).
            &[TokenEndpointAuth::None]
        } else {
            &[
                TokenEndpointAuth::ClientSecretBasic,
                TokenEndpointAuth::ClientSecretPost,
            ]
        };
        let Some(offered) = offered else {
            return Ok(candidates[0]);
        };
        candidates
            .iter()
            .copied()
            .find(|method| offered.iter().any(|o| o == method.name()))
            .ok_or(OAuthProblem::NoUsableAuthMethod { offered })
    }

    fn secret(&self) -> Result<String, AuthError> {
        let var = self.config.client_secret_env.as_deref().unwrap_or_default();
        std::env::var(var).map_err(|_| {
            self.fail(OAuthProblem::SecretEnvMissing {
                var: var.to_owned(),
            })
        })
    }

    /// Requests a token: client credentials, or the exchange of `subject`.
    async fn fetch(
        &self,
        state: &mut State,
        subject: Option<&SubjectToken>,
    ) -> Result<String, AuthError> {
        let Some(endpoint) = state.endpoint.clone() else {
            return Err(self.fail(OAuthProblem::NoTokenEndpoint {
                issuer: self.server_url.clone(),
            }));
        };
        if let (
            Some(Exchange {
                grant: ExchangeGrant::IdJag(config),
                ..
            }),
            Some(subject),
        ) = (&self.exchange, subject)
        {
            return self
                .fetch_via_id_jag(state, &endpoint, config, subject)
                .await;
        }
        let token_url = endpoint.token_url;
        // Checked before a credential is even read: a token endpoint named by metadata
        // may point anywhere, and it is what receives the credential.
        let mut request = self
            .http
            .post(&token_url)
            .map_err(|denied| self.fail(OAuthProblem::TokenEndpointDenied(denied)))?
            .header(http::header::ACCEPT, "application/json")
            .timeout(defaults::OAUTH_HTTP_TIMEOUT);
        let mut form = match (&self.exchange, subject) {
            (
                Some(Exchange {
                    grant: ExchangeGrant::TokenExchange(config),
                    ..
                }),
                Some(subject),
            ) => {
                let mut form = vec![
                    ("grant_type", TOKEN_EXCHANGE.to_owned()),
                    ("subject_token", subject.expose().to_owned()),
                    (
                        "subject_token_type",
                        config.subject_token_type.uri().to_owned(),
                    ),
                    (
                        "requested_token_type",
                        config.requested_token_type.uri().to_owned(),
                    ),
                ];
                if let Some(audience) = &config.audience {
                    form.push(("audience", audience.clone()));
                }
                form
            }
            _ => match &self.assertion {
                // Read at each request: workload tokens are rotated by the platform.
                Some(source) => {
                    let assertion = source.read().map_err(|problem| self.fail(problem))?;
                    vec![
                        ("grant_type", JWT_BEARER_GRANT.to_owned()),
                        ("assertion", assertion.expose().to_owned()),
                    ]
                }
                None => vec![("grant_type", "client_credentials".to_owned())],
            },
        };
        if !state.scopes.is_empty() {
            form.push(("scope", state.scopes.join(" ")));
        }
        form.push((
            "resource",
            self.config
                .resource
                .clone()
                .unwrap_or_else(|| self.server_url.clone()),
        ));
        let client_id = &self.config.client_id;
        match endpoint.method {
            TokenEndpointAuth::ClientSecretBasic => {
                // RFC 6749 §2.3.1: both parts form-encoded before Basic.
                let secret = self.secret()?;
                request = request.basic_auth(form_encode(client_id), Some(form_encode(&secret)));
            }
            TokenEndpointAuth::ClientSecretPost => {
                form.push(("client_id", client_id.clone()));
                form.push(("client_secret", self.secret()?));
            }
            TokenEndpointAuth::PrivateKeyJwt => {
                let key = self.key.as_ref().ok_or_else(|| {
                    self.fail(OAuthProblem::NoUsableAuthMethod {
                        offered: vec!["private_key_jwt (no private_key_file)".into()],
                    })
                })?;
                let audience = self
                    .config
                    .assertion_audience
                    .as_deref()
                    .or(endpoint.issuer.as_deref())
                    .unwrap_or(&token_url);
                let assertion = key
                    .assertion(client_id, audience)
                    .map_err(|e| self.fail(OAuthProblem::Sign(e)))?;
                form.push(("client_assertion_type", JWT_BEARER.to_owned()));
                form.push(("client_assertion", assertion));
            }
            TokenEndpointAuth::None => form.push(("client_id", client_id.clone())),
        }
        let response = request.form(&form).send().await.map_err(|source| {
            self.fail(OAuthProblem::TokenUnreachable {
                url: token_url.clone(),
                source: Box::new(source),
            })
        })?;
        let status = response.status();
        let body = read_capped(response, defaults::OAUTH_MAX_RESPONSE_BYTES)
            .await
            .map_err(|source| {
                self.fail(OAuthProblem::TokenBody {
                    url: token_url.clone(),
                    source,
                })
            })?;
        let body: Value = crate::json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(self.fail(OAuthProblem::TokenRefused {
                url: token_url,
                status,
                error: error_code(&body),
            }));
        }
        let token = body["access_token"]
            .as_str()
            .filter(|token| !token.is_empty())
            .ok_or_else(|| self.fail(OAuthProblem::NoAccessToken))?;
        if let Some(Exchange {
            grant: ExchangeGrant::TokenExchange(config),
            ..
        }) = &self.exchange
        {
            check_exchanged(config.requested_token_type, &body)
                .map_err(|problem| self.fail(problem))?;
        }
        let lifetime = body["expires_in"]
            .as_u64()
            .map_or(defaults::OAUTH_TOKEN_DEFAULT_LIFETIME, Duration::from_secs);
        tracing::debug!(
            server_id = %self.who.server_id,
            method = endpoint.method.name(),
            expires_in_s = lifetime.as_secs(),
            "fetched an OAuth access token"
        );
        state.token = Some((token.to_owned(), refresh_at(Instant::now(), lifetime)));
        state.subject = subject.map(SubjectToken::fingerprint);
        Ok(token.to_owned())
    }
}

impl OAuthClient {
    /// Enterprise-managed authorization: the ID token is exchanged at the IdP for an
    /// ID-JAG addressed to the server's authorization server (`endpoint`), which is then
    /// redeemed there (rmcp's `enterprise` module, over the egress-checked client; it
    /// checks the ID-JAG's type, issuer, audience, client, resource and scopes).
    async fn fetch_via_id_jag(
        &self,
        state: &mut State,
        endpoint: &Endpoint,
        config: &OAuthEnterpriseManagedConfig,
        subject: &SubjectToken,
    ) -> Result<String, AuthError> {
        use rmcp::transport::auth::enterprise::{
            EmaAuthorizationServer, EmaClientAuthentication, EmaError, EmaExchangeRequest,
            EmaExchangeStage,
        };
        let issuer = endpoint
            .issuer
            .clone()
            .ok_or_else(|| self.fail(OAuthProblem::NoIssuer))?;
        // Both endpoints are checked before anything is read or sent: rmcp's errors name
        // no cause.
        for url in [&config.idp_token_url, &endpoint.token_url] {
            self.http
                .post(url)
                .map_err(|denied| self.fail(OAuthProblem::TokenEndpointDenied(denied)))?;
        }
        self.check_in_clear(&config.idp_token_url, Some(&config.idp_issuer))
            .map_err(|problem| self.fail(problem))?;
        let secret = |var: &str| {
            std::env::var(var).map_err(|_| {
                self.fail(OAuthProblem::SecretEnvMissing {
                    var: var.to_owned(),
                })
            })
        };
        let idp_auth = match &config.idp_client_secret_env {
            Some(var) => {
                EmaClientAuthentication::ClientSecretBasic(oauth2::ClientSecret::new(secret(var)?))
            }
            None => EmaClientAuthentication::None,
        };
        let as_auth = match endpoint.method {
            TokenEndpointAuth::ClientSecretBasic => EmaClientAuthentication::ClientSecretBasic(
                oauth2::ClientSecret::new(self.secret()?),
            ),
            TokenEndpointAuth::ClientSecretPost => {
                EmaClientAuthentication::ClientSecretPost(oauth2::ClientSecret::new(self.secret()?))
            }
            TokenEndpointAuth::PrivateKeyJwt => {
                let key = self.key.clone().ok_or_else(|| {
                    self.fail(OAuthProblem::NoUsableAuthMethod {
                        offered: vec!["private_key_jwt (no private_key_file)".into()],
                    })
                })?;
                let audience = self
                    .config
                    .assertion_audience
                    .clone()
                    .unwrap_or_else(|| issuer.clone());
                EmaClientAuthentication::JwtAssertion(Arc::new(Assertions { key, audience }))
            }
            TokenEndpointAuth::None => EmaClientAuthentication::None,
        };
        let idp = EmaAuthorizationServer::new(
            config.idp_issuer.clone(),
            config.idp_token_url.clone(),
            config.idp_client_id.clone(),
        )
        .with_client_authentication(idp_auth);
        let resource_as = EmaAuthorizationServer::new(
            issuer,
            endpoint.token_url.clone(),
            config.client_id.clone(),
        )
        .with_client_authentication(as_auth);
        let resource = self
            .config
            .resource
            .clone()
            .unwrap_or_else(|| self.server_url.clone());
        let request =
            EmaExchangeRequest::new_with_id_token(idp, resource_as, &resource, subject.expose())
                .with_scopes(state.scopes.iter().cloned());
        let token = request
            .exchange(&self.http, &self.http)
            .await
            .map_err(|e| {
                let (stage, url) = match &e {
                    EmaError::InvalidResponse { stage, .. }
                    | EmaError::RequestFailed(stage)
                    | EmaError::InvalidGrant(stage)
                    | EmaError::InsufficientUserAuthentication(stage)
                    | EmaError::OAuthRejected { stage, .. } => (Some(*stage), None),
                    _ => (None, Some(config.idp_token_url.clone())),
                };
                let (stage, url) = match stage {
                    Some(EmaExchangeStage::ResourceAuthorizationServer) => (
                        "the authorization server's token endpoint (ID-JAG redemption)",
                        endpoint.token_url.clone(),
                    ),
                    _ => (
                        "the IdP token endpoint (ID-JAG request)",
                        url.unwrap_or_else(|| config.idp_token_url.clone()),
                    ),
                };
                self.fail(OAuthProblem::IdJag {
                    stage,
                    url,
                    reason: e.to_string(),
                })
            })?;
        let lifetime = token
            .expires_in
            .unwrap_or(defaults::OAUTH_TOKEN_DEFAULT_LIFETIME);
        tracing::debug!(
            server_id = %self.who.server_id,
            expires_in_s = lifetime.as_secs(),
            "redeemed an ID-JAG for an access token"
        );
        let token = token.access_token.secret().clone();
        state.token = Some((token.clone(), refresh_at(Instant::now(), lifetime)));
        state.subject = Some(subject.fingerprint());
        Ok(token)
    }
}

/// Client assertions for the ID-JAG redemption, signed when rmcp asks (each fresh).
struct Assertions {
    key: Arc<ClientKey>,
    audience: String,
}

#[async_trait::async_trait]
impl rmcp::transport::auth::enterprise::EmaClientAssertionProvider for Assertions {
    async fn create_assertion(
        &self,
        server: &rmcp::transport::auth::enterprise::EmaAuthorizationServer,
    ) -> Result<
        rmcp::transport::auth::enterprise::EmaClientAssertion,
        Box<dyn std::error::Error + Send + Sync>,
    > {
        let assertion = self.key.assertion(&server.client_id, &self.audience)?;
        Ok(rmcp::transport::auth::enterprise::EmaClientAssertion::new(
            assertion,
        ))
    }
}

/// An RFC 8693 answer must say it issued the type asked for (`issued_token_type` is
/// required), and be a token this host can present: `Bearer`, or `N_A` for a token that is
/// not an access token.
fn check_exchanged(requested: TokenType, body: &Value) -> Result<(), OAuthProblem> {
    let shown = |field: &str| {
        body[field].as_str().map_or_else(
            || "none".to_owned(),
            |value| {
                value
                    .chars()
                    .filter(char::is_ascii_graphic)
                    .take(defaults::OAUTH_ERROR_CODE_MAX_CHARS)
                    .collect()
            },
        )
    };
    if body["issued_token_type"].as_str() != Some(requested.uri()) {
        return Err(OAuthProblem::WrongTokenType {
            requested: requested.uri().to_owned(),
            received: shown("issued_token_type"),
        });
    }
    let token_type = body["token_type"].as_str().unwrap_or_default();
    let usable = token_type.eq_ignore_ascii_case("bearer")
        || (requested != TokenType::AccessToken && token_type.eq_ignore_ascii_case("n_a"));
    if !usable {
        return Err(OAuthProblem::NotBearer {
            token_type: shown("token_type"),
        });
    }
    Ok(())
}

/// Whether two issuer identifiers are the same, by rmcp's rule (RFC 8414 §3.3 compares them
/// exactly; a trailing slash is ignored only on an issuer without a path).
fn same_issuer(received: &str, expected: &str) -> bool {
    let trim_root_slash = |issuer: &'_ str| -> String {
        issuer
            .strip_suffix('/')
            .filter(|bare| {
                reqwest::Url::parse(bare).is_ok_and(|url| matches!(url.path(), "" | "/"))
            })
            .unwrap_or(issuer)
            .to_owned()
    };
    received == expected || trim_root_slash(received) == trim_root_slash(expected)
}

/// Whether `path` is one of the RFC 8414 or OpenID authorization-server metadata URIs rmcp
/// tries (root, path-inserted or path-appended).
fn is_authorization_server_metadata(path: &str) -> bool {
    path.starts_with("/.well-known/oauth-authorization-server")
        || path.starts_with("/.well-known/openid-configuration")
        || path.ends_with("/.well-known/openid-configuration")
}

/// rmcp's discovery, through the egress-checked client. rmcp 3.9 reads authorization-server
/// metadata only with an `authorization_endpoint`, which RFC 8414 lets a server without
/// the code grant leave out (client-credentials-only servers do): such a document gets an
/// empty one, never used here.
struct Discovery {
    http: OutboundClient,
    /// For a configured issuer. rmcp 3.9 has no public discovery of authorization-server
    /// metadata alone: its general one first probes the URL and reads protected-resource
    /// metadata there. Those requests get a 404 here, unsent, so only the issuer's own
    /// metadata is read.
    authorization_server_only: bool,
}

impl OAuthHttpClient for Discovery {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            if self.authorization_server_only
                && !is_authorization_server_metadata(request.request.uri().path())
            {
                tracing::debug!(url = %request.request.uri(), "not read: issuer is configured");
                let not_found = http::Response::builder()
                    .status(http::StatusCode::NOT_FOUND)
                    .body(Vec::new())?;
                return Ok(not_found);
            }
            let response = self.http.execute(request).await?;
            let (parts, body) = response.into_parts();
            let patched = match crate::json::from_slice::<Value>(&body) {
                Ok(Value::Object(mut document))
                    if document.get("token_endpoint").is_some_and(Value::is_string)
                        && !document.contains_key("authorization_endpoint") =>
                {
                    document.insert(
                        "authorization_endpoint".into(),
                        Value::String(String::new()),
                    );
                    serde_json::to_vec(&document).ok()
                }
                _ => None,
            };
            Ok(http::Response::from_parts(parts, patched.unwrap_or(body)))
        })
    }
}

/// The `error` code of a refused token request, as shown in errors and logs: printable
/// ASCII only (RFC 6749 codes are), cut to [`defaults::OAUTH_ERROR_CODE_MAX_CHARS`], so a
/// hostile server cannot flood or forge log lines.
fn error_code(body: &Value) -> String {
    let Some(code) = body["error"].as_str() else {
        return "no error code".into();
    };
    code.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(defaults::OAUTH_ERROR_CODE_MAX_CHARS)
        .collect()
}

/// `application/x-www-form-urlencoded` encoding of one value.
pub(super) fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::egress::{EgressConfig, EgressPolicy};

    /// A client for `server_url` with the `[auth.corp]` lines of `table`; every loopback
    /// and public http(s) URL is allowed.
    fn oauth_client(table: &str, server_url: &str) -> OAuthClient {
        let config: OAuthClientCredentialsConfig = toml::from_str(&format!(
            "client_id = \"q\"\nclient_secret_env = \"QUIVER_UNIT_UNSET_SECRET\"\n{table}"
        ))
        .unwrap();
        let policy = EgressPolicy::from_config(&EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        })
        .unwrap();
        let http = OutboundClient::new(Arc::new(policy), Duration::from_secs(5)).unwrap();
        let who = Identity {
            principal: None,
            server_id: "web".into(),
            auth_ref: "corp".into(),
        };
        OAuthClient::new(who, config, None, server_url.to_owned(), http)
    }

    /// A loopback server answering every request 404 (or, with `hang`, never), one request
    /// per connection; returns its address and how many connections it got.
    async fn metadata_server(
        hang: bool,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const NOT_FOUND: &[u8] =
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if hang {
                    held.push(stream);
                    continue;
                }
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(NOT_FOUND).await;
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_failed_discovery_is_remembered_for_a_while_then_tried_again() {
        let (addr, seen) = metadata_server(false).await;
        let hits = || seen.load(std::sync::atomic::Ordering::SeqCst);
        let client = oauth_client(
            &format!("issuer = \"http://{addr}\"\n"),
            &format!("http://{addr}/mcp"),
        );
        let failed = format!("no RFC 8414 or OpenID metadata found for issuer http://{addr}");
        let remembered = "(discovery is tried again in";

        // Concurrent calls: one discovery; those that waited for it get its error at once.
        let (a, b, c) = tokio::join!(client.token(), client.token(), client.token());
        let errors = [a, b, c].map(|r| r.expect_err("no metadata").to_string());
        assert!(errors.iter().all(|e| e.contains(&failed)), "{errors:?}");
        let waited = errors.iter().filter(|e| e.contains(remembered)).count();
        assert_eq!(waited, 2, "{errors:?}");
        let one_discovery = hits();
        assert!(one_discovery > 0);

        // A following call too, without a request.
        let again = client.token().await.unwrap_err().to_string();
        assert!(
            again.contains(&failed) && again.contains(remembered),
            "{again}"
        );
        assert_eq!(hits(), one_discovery);

        // Once the failure is old enough, discovery runs again.
        let long_ago = Instant::now()
            .checked_sub(defaults::OAUTH_DISCOVERY_RETRY_AFTER)
            .expect("the clock started long enough ago");
        client
            .state
            .lock()
            .await
            .failed
            .as_mut()
            .expect("remembered")
            .1 = long_ago;
        let retried = client.token().await.unwrap_err().to_string();
        assert!(
            retried.contains(&failed) && !retried.contains(remembered),
            "{retried}"
        );
        assert_eq!(hits(), 2 * one_discovery);
    }

    #[tokio::test]
    async fn the_whole_discovery_has_one_deadline() {
        let (addr, seen) = metadata_server(true).await;
        let mut client = oauth_client(
            &format!("issuer = \"http://{addr}\"\n"),
            &format!("http://{addr}/mcp"),
        );
        client.discovery_timeout = Duration::from_millis(300);
        let started = Instant::now();
        let error = client.token().await.unwrap_err().to_string();
        let timed_out = "metadata discovery did not finish within 300 ms";
        assert!(error.contains(timed_out), "{error}");
        // Each request alone may take 30 s.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let again = client.token().await.unwrap_err().to_string();
        assert!(
            again.contains(timed_out) && again.contains("tried again"),
            "{again}"
        );
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn a_plain_http_token_endpoint_is_refused_next_to_https() {
        let cases = [
            (
                "http://as.example/t",
                Some("https://as.example"),
                "http://mcp.example/mcp",
                Some("https://as.example"),
            ),
            (
                "http://as.example/t",
                None,
                "https://mcp.example/mcp",
                Some("https://mcp.example/mcp"),
            ),
            (
                "http://as.example/t",
                Some("http://as.example"),
                "http://mcp.example/mcp",
                None,
            ),
            (
                "https://as.example/t",
                Some("https://as.example"),
                "https://mcp.example/mcp",
                None,
            ),
            (
                "https://as.example/t",
                Some("http://as.example"),
                "http://mcp.example/mcp",
                None,
            ),
        ];
        for (token_url, issuer, server_url, refused_for) in cases {
            let client = oauth_client("", server_url);
            let checked = client.check_in_clear(token_url, issuer);
            match (refused_for, checked) {
                (None, Ok(())) => {}
                (Some(https), Err(error)) => {
                    let text = error.to_string();
                    assert!(
                        text.contains(&format!(
                            "token endpoint {token_url} is plain http while {https} is https"
                        )) && text.contains("use an https token endpoint"),
                        "{text}"
                    );
                }
                (expected, got) => panic!(
                    "{token_url} {issuer:?} {server_url}: expected {expected:?}, got {got:?}"
                ),
            }
        }
    }

    #[test]
    fn a_huge_expires_in_does_not_overflow_the_clock() {
        let now = Instant::now();
        let at = refresh_at(now, Duration::from_secs(u64::MAX));
        assert!(at > now && at <= now + defaults::OAUTH_TOKEN_MAX_LIFETIME);
        let short = refresh_at(now, Duration::from_secs(60));
        assert_eq!(short, now + Duration::from_secs(54));
    }

    #[test]
    fn a_zero_or_tiny_expires_in_still_caches_the_token_a_while() {
        let now = Instant::now();
        let min = defaults::OAUTH_TOKEN_MIN_LIFETIME;
        for secs in [0, 1] {
            let at = refresh_at(now, Duration::from_secs(secs));
            assert_eq!(at, now + min - min / 10, "expires_in {secs}");
            assert!(at > now + Duration::from_secs(5), "expires_in {secs}");
        }
    }

    #[test]
    fn error_codes_are_printable_and_short() {
        assert_eq!(
            error_code(&serde_json::json!({"error": "invalid_scope"})),
            "invalid_scope"
        );
        assert_eq!(error_code(&serde_json::json!({})), "no error code");
        let hostile = format!("bad\n2026-01-01 INFO forged\u{1b}[31m{}", "x".repeat(500));
        let shown = error_code(&serde_json::json!({ "error": hostile }));
        assert_eq!(shown.chars().count(), defaults::OAUTH_ERROR_CODE_MAX_CHARS);
        assert!(
            shown.starts_with("bad2026-01-01 INFO forged[31mxx"),
            "{shown}"
        );
    }

    fn scopes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn step_up_stays_within_the_configured_scopes_and_the_cap() {
        let url = "http://127.0.0.1:9/mcp";
        let held = scopes(&["mcp:tools"]);

        // Configured scopes alone: no widening at all.
        let fixed = oauth_client("scopes = [\"mcp:tools\"]\n", url);
        let refused = fixed
            .widen(&held, &scopes(&["mcp:write", "mcp:tools"]))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("[\"mcp:write\"] beyond the configured ones")
                && refused.contains("step_up_scopes"),
            "{refused}"
        );
        assert_eq!(fixed.widen(&held, &held).unwrap(), None, "nothing new");

        // With an allow-list: those and no others.
        let listed = oauth_client(
            "scopes = [\"mcp:tools\"]\nstep_up_scopes = [\"mcp:write\"]\n",
            url,
        );
        assert_eq!(
            listed
                .widen(&held, &scopes(&["mcp:write", "mcp:write"]))
                .unwrap(),
            Some(scopes(&["mcp:tools", "mcp:write"]))
        );
        let refused = listed
            .widen(&held, &scopes(&["mcp:write", "mcp:admin"]))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("[\"mcp:admin\"]"), "{refused}");

        // Nothing configured: the server decides, up to the cap.
        let open = oauth_client("", url);
        let mut held = Vec::new();
        for n in 0..defaults::OAUTH_MAX_SCOPES {
            held = open
                .widen(&held, &[format!("s{n}")])
                .unwrap()
                .expect("a new scope");
        }
        let full = open
            .widen(&held, &scopes(&["one-more"]))
            .unwrap_err()
            .to_string();
        assert!(
            full.contains("asks for 65 scopes, more than 64") && full.contains("set scopes"),
            "{full}"
        );
    }

    #[test]
    fn issuers_match_exactly_but_for_a_root_trailing_slash() {
        assert!(same_issuer("https://as.example/", "https://as.example"));
        assert!(same_issuer("https://as.example", "https://as.example/"));
        assert!(same_issuer(
            "https://as.example/t1",
            "https://as.example/t1"
        ));
        assert!(!same_issuer(
            "https://as.example/t1/",
            "https://as.example/t1"
        ));
        assert!(!same_issuer("https://as.example", "https://as.example/t1"));
        assert!(!same_issuer("https://evil.example/", "https://as.example/"));
    }

    #[test]
    fn only_authorization_server_metadata_is_read_for_a_configured_issuer() {
        for path in [
            "/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/t1",
            "/.well-known/openid-configuration",
            "/.well-known/openid-configuration/t1",
            "/t1/.well-known/openid-configuration",
        ] {
            assert!(is_authorization_server_metadata(path), "{path}");
        }
        for path in [
            "/",
            "/t1",
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/t1",
        ] {
            assert!(!is_authorization_server_metadata(path), "{path}");
        }
    }

    #[test]
    fn basic_credentials_are_form_encoded() {
        assert_eq!(form_encode("a:b c/é"), "a%3Ab+c%2F%C3%A9");
        assert_eq!(form_encode("client-1.x_y*"), "client-1.x_y*");
    }
}
