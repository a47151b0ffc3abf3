//! Delegated user authorization: OAuth 2.1 authorization code with PKCE, as the MCP
//! authorization spec has a client do it, for servers whose `[auth.NAME]` has
//! `kind = "oauth_authorization_code"`. A person authorizes a server for a principal once;
//! the [`Grant`](super::Grant) is kept per server and principal, and every task of that
//! principal calls the server with its own token.
//!
//! The mechanics are rmcp's `AuthorizationManager` (discovery by RFC 9728 and RFC 8414 or
//! OIDC, PKCE, the `resource` parameter, scope selection, `offline_access`, refresh, the
//! RFC 9207 `iss` check), over our egress-checked client. What is ours: where grants live,
//! which principal a connection acts for, how the client is identified (a configured
//! client, a Client ID Metadata Document, else dynamic registration, kept in the grant
//! and redone when the server moves to another authorization server), and who shows the
//! person the authorization URL: a [`UserAuthorizer`]. A host without one (a node, a
//! scheduler) never starts a flow on its own: a task whose principal has no grant gets an
//! error naming the server, the principal and how to authorize.
//!
//! With `dpop = true` the grant's tokens are DPoP-bound ([`super::dpop`]): rmcp's requests
//! go through [`DpopHttp`], which signs a proof for each token request with the grant's
//! key, and the transport presents the token with a fresh proof per request.

use std::sync::Arc;

use oauth2::TokenResponse;
use rmcp::transport::auth::{
    AuthError as RmcpAuthError, AuthorizationManager, AuthorizationMetadata, AuthorizationRequest,
    AuthorizationSession, WWWAuthenticateParams,
};
use serde::Deserialize;

use super::dpop::{DpopHttp, DpopKey};
use super::grants::{Grant, GrantKey, Grants, Registration, dpop_key, save_registration};
use super::{AuthError, OAuthProblem};
use crate::defaults;
use crate::mcp::error::error_chain;
use crate::mcp::outbound::OutboundClient;

/// `[auth.NAME] kind = "oauth_authorization_code"`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OAuthAuthorizationCodeConfig {
    /// The servers (record ids) that may use this credential; with `origins` too, a
    /// server must be in both.
    #[serde(default)]
    pub servers: Vec<String>,
    /// The URL origins (`https://host[:port]`) tokens may be sent to.
    #[serde(default)]
    pub origins: Vec<String>,
    /// A client registered with the authorization server beforehand; without it, the
    /// client is identified by `client_metadata_url` where the server supports it, else
    /// registered dynamically (RFC 7591).
    #[serde(default)]
    pub client_id: Option<String>,
    /// Environment variable holding a pre-registered confidential client's secret.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// An `https` URL serving this host's Client ID Metadata Document.
    #[serde(default)]
    pub client_metadata_url: Option<String>,
    /// The name dynamic registration gives (default `Quiver`).
    #[serde(default)]
    pub client_name: Option<String>,
    /// Scopes asked for; without them, the server's challenge, else its
    /// `scopes_supported`, else none.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Ask for sender-constrained tokens (DPoP, RFC 9449): the authorization server must
    /// offer ES256 in `dpop_signing_alg_values_supported`, and a token that is not
    /// DPoP-bound is refused. Off by default: a server that does not expect DPoP would
    /// refuse its proofs.
    #[serde(default)]
    pub dpop: bool,
}

/// What a person is asked to authorize.
#[derive(Clone, Debug)]
pub struct AuthorizationPrompt {
    pub server_id: String,
    pub principal: String,
    /// Open this in a browser.
    pub url: String,
}

/// Why a person's authorization did not come back.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AuthorizeError(pub String);

/// Shows a person an authorization URL and waits for the authorization server to send the
/// browser back to [`redirect_uri`](Self::redirect_uri). The CLI's listens on loopback
/// (RFC 8252); a node's would finish at its own endpoint.
pub trait UserAuthorizer: Send + Sync + 'static {
    /// Where the authorization server sends the person back, as registered with it.
    fn redirect_uri(&self) -> String;
    /// Shows `prompt.url` and returns the full URL the browser was sent back to (its
    /// query carries `code`, `state` and maybe `iss`), within a bounded time.
    fn authorize(
        &self,
        prompt: AuthorizationPrompt,
    ) -> futures::future::BoxFuture<'_, Result<String, AuthorizeError>>;
}

/// The tokens of one principal for one server: the connection's credential source.
pub(crate) struct UserToken {
    key: GrantKey,
    auth_ref: String,
    config: OAuthAuthorizationCodeConfig,
    server_url: String,
    http: OutboundClient,
    grants: Grants,
    authorizer: Option<Arc<dyn UserAuthorizer>>,
    /// rmcp's manager, once discovery ran; one flow at a time.
    manager: tokio::sync::Mutex<Option<Ready>>,
    /// With `dpop`: the grant's key, once read or made.
    dpop: std::sync::Mutex<Option<Arc<DpopKey>>>,
}

/// rmcp's manager after discovery, with what this module needs of the metadata it keeps
/// private.
struct Ready {
    manager: AuthorizationManager,
    issuer: Option<String>,
    /// The authorization server accepts Client ID Metadata Documents.
    cimd: bool,
}

impl UserToken {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        key: GrantKey,
        auth_ref: String,
        config: OAuthAuthorizationCodeConfig,
        server_url: String,
        http: OutboundClient,
        grants: Grants,
        authorizer: Option<Arc<dyn UserAuthorizer>>,
    ) -> Self {
        Self {
            key,
            auth_ref,
            config,
            server_url,
            http,
            grants,
            authorizer,
            manager: tokio::sync::Mutex::new(None),
            dpop: std::sync::Mutex::new(None),
        }
    }

    /// The grant's DPoP key, when tokens are DPoP-bound (`dpop = true`) and it is known.
    pub(crate) fn dpop(&self) -> Option<Arc<DpopKey>> {
        self.dpop.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn fail(&self, problem: OAuthProblem) -> AuthError {
        AuthError::User {
            server_id: self.key.server_id.clone(),
            principal: self.key.principal.clone(),
            auth_ref: self.auth_ref.clone(),
            problem: Box::new(problem),
        }
    }

    fn rmcp(&self, error: RmcpAuthError) -> AuthError {
        match error {
            RmcpAuthError::AuthorizationRequired | RmcpAuthError::TokenRefreshRejected(_) => {
                self.needs_authorization()
            }
            other => self.fail(flow(&other)),
        }
    }

    /// The principal has no usable grant and this host cannot ask a person.
    fn needs_authorization(&self) -> AuthError {
        AuthError::NotAuthorized {
            server_id: self.key.server_id.clone(),
            principal: self.key.principal.clone(),
        }
    }

    /// Fails at once when the principal has no grant and nobody can be asked: such a
    /// connection would only end in the same error after a round trip to the server.
    pub(crate) async fn require_grant(&self) -> Result<(), AuthError> {
        if self.authorizer.is_some() {
            return Ok(());
        }
        let grant = self
            .grants
            .store
            .load(&self.key)
            .await
            .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?;
        match grant.is_some_and(|g| g.has_tokens()) {
            true => Ok(()),
            false => Err(self.needs_authorization()),
        }
    }

    /// The token to send before the server has said anything: the grant's, refreshed when
    /// it expired; `None` when there is no grant yet and a person can be asked (the
    /// server's 401 then says where).
    pub(crate) async fn token_if_known(&self) -> Result<Option<String>, AuthError> {
        let grant = self
            .grants
            .store
            .load(&self.key)
            .await
            .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?;
        if !grant.as_ref().is_some_and(|g| g.has_tokens()) {
            return match self.authorizer {
                Some(_) => Ok(None),
                None => Err(self.needs_authorization()),
            };
        }
        let held = grant.as_ref().and_then(access_token);
        let mut guard = self.manager.lock().await;
        let ready = self.ready(&mut guard, None).await?;
        let current = ready.manager.get_access_token().await;
        // Other calls of this principal need not queue behind a wait for another node.
        drop(guard);
        match current {
            Ok(token) => Ok(Some(token)),
            // An expired token's refresh was refused or not saved: another node may have
            // refreshed first. (An authorization server that could not be asked is no race.)
            Err(e) => match self.winners_token(held.as_deref(), &e).await {
                Some(token) => Ok(Some(token)),
                None if matches!(e, RmcpAuthError::AuthorizationRequired)
                    && self.authorizer.is_some() =>
                {
                    Ok(None)
                }
                None => Err(self.rmcp(e)),
            },
        }
    }

    /// The access token another caller saved after a refresh of this grant failed here:
    /// two nodes sharing the grant store that refresh it at once both present the same
    /// refresh token, and an authorization server that rotates them refuses the second
    /// (or the second save finds the grant changed). The winner saves its new tokens
    /// shortly after; they are waited for (up to [`defaults::GRANT_REFRESH_RACE_WAIT`])
    /// and used, so the loser neither fails its call nor sends a person to authorize
    /// again. `None` when the grant is gone or still holds `held` (the refresh token was
    /// really refused), and at once when `failed` says the authorization server could not
    /// be asked (that is no race).
    async fn winners_token(&self, held: Option<&str>, failed: &RmcpAuthError) -> Option<String> {
        if let RmcpAuthError::TokenRefreshFailed(_) = failed {
            return None;
        }
        let deadline = tokio::time::Instant::now() + defaults::GRANT_REFRESH_RACE_WAIT;
        let mut pause = std::time::Duration::from_millis(25);
        loop {
            let load = self.grants.store.load(&self.key);
            let grant = tokio::time::timeout_at(deadline, load).await.ok()?.ok()??;
            let token = access_token(&grant)?;
            if Some(token.as_str()) != held {
                tracing::info!(server_id = %self.key.server_id, principal = %self.key.principal, "using the tokens another caller refreshed the grant to");
                return Some(token);
            }
            // Without a refresh token there was no refresh to lose: nothing to wait for.
            let refreshable = grant
                .credentials
                .as_ref()
                .and_then(|c| c.token_response.as_ref())
                .is_some_and(|t| oauth2::TokenResponse::refresh_token(t).is_some());
            if !refreshable || tokio::time::Instant::now() + pause > deadline {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    /// A token after the server refused `rejected` with a 401 carrying `challenge`:
    /// another call's newer token, a refreshed one, or a person's new authorization.
    pub(crate) async fn unauthorized(
        &self,
        rejected: Option<&str>,
        challenge: Option<&str>,
    ) -> Result<String, AuthError> {
        let mut guard = self.manager.lock().await;
        // Discovery again: the server may have moved to another authorization server.
        *guard = None;
        let ready = self.ready(&mut guard, challenge).await?;
        if let Ok(token) = ready.manager.get_access_token().await
            && Some(token.as_str()) != rejected
        {
            return Ok(token);
        }
        if rejected.is_some() {
            match ready.manager.refresh_token().await {
                Ok(tokens) => {
                    return Ok(tokens.access_token().secret().clone());
                }
                Err(e) => {
                    // Refused, or not saved: another node may have refreshed it first.
                    if let Some(token) = self.winners_token(rejected, &e).await {
                        return Ok(token);
                    }
                    // The authorization server could not be asked: the grant stands, so
                    // no person is bothered for it. Otherwise (no refresh token, a refused
                    // one, no client any more as the server moved to another
                    // authorization server) a person authorizes again.
                    if let RmcpAuthError::TokenRefreshFailed(_) = e {
                        return Err(self.rmcp(e));
                    }
                }
            }
        }
        let Some(authorizer) = self.authorizer.clone() else {
            return Err(self.needs_authorization());
        };
        let ready = guard.take().expect("ready() set it");
        let (ready, token) = self.authorize(ready, None, &authorizer).await?;
        *guard = Some(ready);
        Ok(token)
    }

    /// Runs the flow now, whatever the grant holds (`quiver mcp login`), asking the person
    /// through `authorizer`, else the host's.
    pub(crate) async fn login(
        &self,
        authorizer: Option<Arc<dyn UserAuthorizer>>,
    ) -> Result<(), AuthError> {
        let Some(authorizer) = authorizer.or_else(|| self.authorizer.clone()) else {
            return Err(self.needs_authorization());
        };
        let mut guard = self.manager.lock().await;
        *guard = None;
        self.ready(&mut guard, None).await?;
        let ready = guard.take().expect("ready() set it");
        let (ready, _) = self.authorize(ready, None, &authorizer).await?;
        *guard = Some(ready);
        Ok(())
    }

    /// A token with more scopes after a 403 `insufficient_scope` `challenge`: the person
    /// authorizes the union of the scopes held and those asked for. `None` when the
    /// challenge is not a step-up.
    pub(crate) async fn step_up(&self, challenge: &str) -> Result<Option<String>, AuthError> {
        let base = reqwest::Url::parse(&self.server_url).map_err(|e| self.fail(flow(&e)))?;
        let params = WWWAuthenticateParams::parse(challenge, &base);
        if !params.is_insufficient_scope() {
            return Ok(None);
        }
        if self.authorizer.is_none() {
            return Err(self.fail(OAuthProblem::StepUpNeedsPerson {
                scopes: params.scope.unwrap_or_default(),
            }));
        }
        let mut guard = self.manager.lock().await;
        self.ready(&mut guard, None).await?;
        let ready = guard.take().expect("ready() set it");
        // The union with the scopes the grant holds (SEP-2350): rmcp remembers those only
        // for grants it made in this process.
        let held = self
            .grants
            .store
            .load(&self.key)
            .await
            .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?
            .and_then(|g| g.credentials)
            .map(|c| c.granted_scopes)
            .unwrap_or_default();
        let mut wanted: Vec<String> = held;
        for scope in params.scope.unwrap_or_default().split_whitespace() {
            if !wanted.iter().any(|s| s == scope) {
                wanted.push(scope.to_owned());
            }
        }
        let wanted = wanted.join(" ");
        let authorizer = self.authorizer.clone().expect("checked above");
        let (ready, token) = self.authorize(ready, Some(&wanted), &authorizer).await?;
        *guard = Some(ready);
        Ok(Some(token))
    }

    /// rmcp's manager over `http`, and the authorization server's metadata, found from
    /// `challenge` or the well-known paths within [`defaults::OAUTH_DISCOVERY_TIMEOUT`] and
    /// checked (https next to an https server; a configured secret's token endpoint).
    async fn discover(
        &self,
        http: Arc<dyn rmcp::transport::auth::OAuthHttpClient>,
        challenge: Option<&str>,
    ) -> Result<(AuthorizationManager, AuthorizationMetadata), AuthError> {
        let manager =
            AuthorizationManager::new_with_oauth_http_client(self.server_url.as_str(), http)
                .await
                .map_err(|e| self.rmcp(e))?;
        // One deadline for the whole discovery: each request has its own, and a slow
        // server could otherwise hold a call for several of them.
        let timeout = defaults::OAUTH_DISCOVERY_TIMEOUT;
        let resolution = tokio::time::timeout(
            timeout,
            Box::pin(manager.resolve_metadata_from_challenge(challenge)),
        )
        .await
        .map_err(|_| {
            self.fail(OAuthProblem::DiscoveryTimeout {
                ms: timeout.as_millis() as u64,
            })
        })?
        .map_err(|e| {
            let chain = crate::text::printable(&error_chain(&e));
            let chain = crate::text::cut(&chain, defaults::OAUTH_FLOW_ERROR_MAX_BYTES);
            self.fail(OAuthProblem::Discovery(chain.to_owned()))
        })?;
        let metadata = resolution.metadata;
        self.check_in_clear(&metadata)?;
        self.check_secret_bound(&metadata)?;
        Ok((manager, metadata))
    }

    /// The manager with discovery done and the grant's client configured.
    async fn ready<'a>(
        &self,
        slot: &'a mut Option<Ready>,
        challenge: Option<&str>,
    ) -> Result<&'a mut Ready, AuthError> {
        if slot.is_none() {
            let token_endpoint = Arc::new(std::sync::Mutex::new(None));
            let http: Arc<dyn rmcp::transport::auth::OAuthHttpClient> = match self.config.dpop {
                true => {
                    let key = dpop_key(self.grants.store.as_ref(), &self.key)
                        .await
                        .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?;
                    let key = Arc::new(key);
                    *self.dpop.lock().unwrap_or_else(|e| e.into_inner()) = Some(key.clone());
                    Arc::new(DpopHttp {
                        inner: self.http.clone(),
                        key,
                        token_endpoint: token_endpoint.clone(),
                    })
                }
                false => Arc::new(self.http.clone()),
            };
            let (mut manager, metadata) = self.discover(http, challenge).await?;
            if self.config.dpop {
                self.check_dpop_offered(&metadata)?;
                *token_endpoint.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(metadata.token_endpoint.clone());
            }
            let issuer = metadata.issuer.clone();
            let cimd = metadata
                .additional_fields
                .get("client_id_metadata_document_supported")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false);
            manager.set_metadata(metadata);
            manager.set_credential_store(self.grants.credentials(self.key.clone()));
            // Tokens made by another authorization server are dropped here (rmcp checks
            // the issuer they were stored with).
            manager
                .initialize_from_store()
                .await
                .map_err(|e| self.rmcp(e))?;
            if let Some(registration) = self.registration(issuer.as_deref()).await? {
                manager
                    .configure_client(client_config(registration, self.redirect_uri()))
                    .map_err(|e| self.rmcp(e))?;
            }
            *slot = Some(Ready {
                manager,
                issuer,
                cimd,
            });
        }
        Ok(slot.as_mut().expect("set above"))
    }

    /// An https server's authorization endpoints must be https too: the code, the PKCE
    /// verifier and the tokens would otherwise travel in clear.
    fn check_in_clear(&self, metadata: &AuthorizationMetadata) -> Result<(), AuthError> {
        if !self.server_url.starts_with("https://") {
            return Ok(());
        }
        let endpoints = [
            Some(&metadata.authorization_endpoint),
            Some(&metadata.token_endpoint),
            metadata.registration_endpoint.as_ref(),
        ];
        match endpoints
            .into_iter()
            .flatten()
            .find(|url| !url.starts_with("https://"))
        {
            Some(url) => Err(self.fail(OAuthProblem::TokenEndpointInClear {
                url: url.clone(),
                https: self.server_url.clone(),
            })),
            None => Ok(()),
        }
    }

    /// `dpop = true` needs an authorization server that binds tokens to ES256 keys.
    fn check_dpop_offered(&self, metadata: &AuthorizationMetadata) -> Result<(), AuthError> {
        let offered: Vec<String> = metadata
            .additional_fields
            .get("dpop_signing_alg_values_supported")
            .and_then(serde_json::Value::as_array)
            .map(|algs| {
                algs.iter()
                    .filter_map(|alg| alg.as_str())
                    .take(16)
                    .map(|alg| crate::text::cut(&crate::text::printable(alg), 32).to_owned())
                    .collect()
            })
            .unwrap_or_default();
        if offered.iter().any(|alg| alg == "ES256") {
            return Ok(());
        }
        Err(self.fail(OAuthProblem::DpopNotOffered { offered }))
    }

    /// A configured client secret goes only to a token endpoint whose origin the host
    /// config lists: the server's metadata names it, and a hostile server would name its
    /// own.
    fn check_secret_bound(&self, metadata: &AuthorizationMetadata) -> Result<(), AuthError> {
        self.secret_bound(&metadata.token_endpoint)
    }

    /// A configured client secret goes to `url` only if the host config lists its origin.
    fn secret_bound(&self, url: &str) -> Result<(), AuthError> {
        if self.config.client_secret_env.is_none() {
            return Ok(());
        }
        let origin = super::origin_of(url);
        if super::origin_listed(&self.config.origins, origin.as_deref()) {
            return Ok(());
        }
        Err(self.fail(OAuthProblem::TokenEndpointNotBound {
            url: url.to_owned(),
            origin: origin.unwrap_or_else(|| "(none)".into()),
            auth_ref: self.auth_ref.clone(),
        }))
    }

    fn redirect_uri(&self) -> String {
        self.authorizer
            .as_ref()
            .map(|a| a.redirect_uri())
            .unwrap_or_else(|| "http://127.0.0.1/callback".into())
    }

    /// The client this host is at the current authorization server, if known: the
    /// configured one, else the one kept in the grant when the same server registered it.
    async fn registration(&self, issuer: Option<&str>) -> Result<Option<Registration>, AuthError> {
        if let Some(client_id) = &self.config.client_id {
            return Ok(Some(Registration {
                client_id: client_id.clone(),
                client_secret: self.configured_secret()?,
                issuer: None,
            }));
        }
        let grant = self
            .grants
            .store
            .load(&self.key)
            .await
            .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?;
        Ok(kept_registration(
            grant.and_then(|g| g.registration),
            issuer,
        ))
    }

    fn configured_secret(&self) -> Result<Option<String>, AuthError> {
        match &self.config.client_secret_env {
            None => Ok(None),
            Some(var) => std::env::var(var)
                .map(Some)
                .map_err(|_| self.fail(OAuthProblem::SecretEnvMissing { var: var.clone() })),
        }
    }

    /// Runs the authorization code flow with a person: identifies the client (registering
    /// it when needed), shows the URL, exchanges the code. `step_up` adds the scopes a 403
    /// asked for to those held.
    async fn authorize(
        &self,
        ready: Ready,
        step_up: Option<&str>,
        authorizer: &Arc<dyn UserAuthorizer>,
    ) -> Result<(Ready, String), AuthError> {
        let Ready {
            mut manager,
            issuer,
            cimd,
        } = ready;
        let redirect_uri = authorizer.redirect_uri();
        let url = match step_up {
            Some(scope) => {
                let url = manager
                    .request_scope_upgrade(scope)
                    .await
                    .map_err(|e| self.fail(flow(&e)))?;
                AuthorizationSession::for_scope_upgrade(manager, url, &redirect_uri)
            }
            None => {
                let mut request = AuthorizationRequest::new(redirect_uri.clone())
                    .with_initial_scope_selection()
                    .with_client_name(self.config.client_name.as_deref().unwrap_or("Quiver"));
                if !self.config.scopes.is_empty() {
                    request = request.with_scopes(self.config.scopes.iter().cloned());
                }
                if let Some(url) = &self.config.client_metadata_url {
                    request = request.with_client_metadata_url(url.clone());
                }
                let known = self.registration(issuer.as_deref()).await?;
                let registration = match known {
                    Some(known) => Some(known),
                    None if cimd && self.config.client_metadata_url.is_some() => None,
                    None => Some(
                        self.register(&mut manager, &redirect_uri, issuer.clone())
                            .await?,
                    ),
                };
                if let Some(registration) = registration {
                    request = request.with_preregistered_client(registration.client_id);
                    if let Some(secret) = registration.client_secret {
                        request = request.with_client_secret(secret);
                    }
                }
                AuthorizationSession::new(manager, request)
                    .await
                    .map_err(|(_, e)| self.fail(flow(&e)))?
            }
        };
        tracing::info!(
            server_id = %self.key.server_id,
            principal = %self.key.principal,
            "asking a person to authorize the MCP server"
        );
        let callback = authorizer
            .authorize(AuthorizationPrompt {
                server_id: self.key.server_id.clone(),
                principal: self.key.principal.clone(),
                url: url.get_authorization_url().to_owned(),
            })
            .await
            .map_err(|e| self.fail(flow(&e.0)))?;
        let tokens = url
            .handle_callback_url(&callback)
            .await
            .map_err(|e| self.fail(flow(&e)))?;
        let token = tokens.access_token().secret().clone();
        let ready = Ready {
            manager: url.auth_manager,
            issuer,
            cimd,
        };
        Ok((ready, token))
    }

    /// Revokes the tokens of `grant` (already gone from the store) at the authorization
    /// server (RFC 7009), when its metadata lists a `revocation_endpoint`: the refresh
    /// token, then the access token, the client authenticated as at the token endpoint.
    /// Within [`defaults::OAUTH_REVOCATION_TIMEOUT`]; a failure is logged (the endpoint and
    /// the answer's status, never a token) and changes nothing here.
    pub(crate) async fn revoke_at_server(&self, grant: Grant) {
        let timeout = defaults::OAUTH_REVOCATION_TIMEOUT;
        let outcome = match tokio::time::timeout(timeout, self.revoke_tokens(grant)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "the authorization server did not answer within {} ms",
                timeout.as_millis()
            )),
        };
        let (server_id, principal) = (&self.key.server_id, &self.key.principal);
        match outcome {
            Ok(0) => {
                tracing::debug!(%server_id, %principal, "the authorization server lists no revocation endpoint")
            }
            Ok(revoked) => {
                tracing::info!(%server_id, %principal, revoked, "tokens revoked at the authorization server")
            }
            Err(error) => {
                let error = crate::text::printable(&error);
                let error = crate::text::cut(&error, defaults::OAUTH_FLOW_ERROR_MAX_BYTES);
                tracing::warn!(%server_id, %principal, %error, "the grant is forgotten here, but its tokens could not be revoked at the authorization server")
            }
        }
    }

    /// How many of `grant`'s tokens the authorization server took back.
    async fn revoke_tokens(&self, grant: Grant) -> Result<usize, String> {
        let Some(credentials) = grant.credentials else {
            return Ok(0);
        };
        let minted_by = credentials.issuer;
        let Some(tokens) = credentials.token_response else {
            return Ok(0);
        };
        let (_, metadata) = self
            .discover(Arc::new(self.http.clone()), None)
            .await
            .map_err(|e| e.to_string())?;
        let Some(endpoint) = metadata
            .additional_fields
            .get("revocation_endpoint")
            .and_then(serde_json::Value::as_str)
        else {
            return Ok(0);
        };
        let shown = crate::text::cut(endpoint, 200);
        // The tokens go back only to the server that minted them: the resource's metadata
        // may name another authorization server by now (a hostile or moved server), and
        // its revocation endpoint must be on that issuer's origin (or one `origins` lists).
        let issuer = match (&minted_by, &metadata.issuer) {
            (Some(minted), Some(now)) if minted == now => now,
            _ => {
                return Err(format!(
                    "the authorization server is now {:?}, not {:?} that issued the tokens; none was sent to it",
                    metadata.issuer.as_deref().map(|i| crate::text::cut(i, 200)),
                    minted_by.as_deref().map(|i| crate::text::cut(i, 200)),
                ));
            }
        };
        let endpoint_origin = super::origin_of(endpoint);
        if endpoint_origin.is_none()
            || (endpoint_origin != super::origin_of(issuer)
                && !super::origin_listed(&self.config.origins, endpoint_origin.as_deref()))
        {
            return Err(format!(
                "the revocation endpoint {shown} is not on the origin of its issuer; no token was sent there (list its origin in `origins` to allow it)"
            ));
        }
        if self.server_url.starts_with("https://") && !endpoint.starts_with("https://") {
            return Err(format!(
                "the revocation endpoint {shown} is plain http next to an https server; no token was sent there"
            ));
        }
        self.secret_bound(endpoint).map_err(|e| e.to_string())?;
        let registration = match &self.config.client_id {
            Some(client_id) => Registration {
                client_id: client_id.clone(),
                client_secret: self.configured_secret().map_err(|e| e.to_string())?,
                issuer: None,
            },
            None => kept_registration(grant.registration, metadata.issuer.as_deref())
                .ok_or("the grant holds no client registration of this authorization server")?,
        };
        // As rmcp chooses at the token endpoint: Basic unless only post is offered.
        let post_only = metadata
            .additional_fields
            .get("token_endpoint_auth_methods_supported")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|methods| {
                let has = |m: &str| methods.iter().any(|v| v.as_str() == Some(m));
                has("client_secret_post") && !has("client_secret_basic")
            });
        let mut revoked = 0;
        let refresh = tokens.refresh_token().map(|t| t.secret().clone());
        let access = Some(tokens.access_token().secret().clone());
        for (token, hint) in [(refresh, "refresh_token"), (access, "access_token")] {
            let Some(token) = token else { continue };
            let mut form = vec![("token", token), ("token_type_hint", hint.to_owned())];
            let mut request = self
                .http
                .post(endpoint)
                .map_err(|e| format!("the revocation endpoint {shown}: {e}"))?
                .timeout(defaults::OAUTH_HTTP_TIMEOUT);
            match &registration.client_secret {
                Some(secret) if !post_only => {
                    // RFC 6749 §2.3.1: both parts form-encoded before Basic.
                    request = request.basic_auth(
                        super::oauth::form_encode(&registration.client_id),
                        Some(super::oauth::form_encode(secret)),
                    );
                }
                Some(secret) => {
                    form.push(("client_id", registration.client_id.clone()));
                    form.push(("client_secret", secret.clone()));
                }
                None => form.push(("client_id", registration.client_id.clone())),
            }
            let answer = request
                .form(&form)
                .send()
                .await
                .map_err(|e| format!("the revocation endpoint {shown}: {e}"))?;
            if !answer.status().is_success() {
                return Err(format!(
                    "the revocation endpoint {shown} answered {} to the {hint}",
                    answer.status()
                ));
            }
            revoked += 1;
        }
        Ok(revoked)
    }

    /// Dynamic client registration (RFC 7591), kept in the grant with its issuer.
    async fn register(
        &self,
        manager: &mut AuthorizationManager,
        redirect_uri: &str,
        issuer: Option<String>,
    ) -> Result<Registration, AuthError> {
        let name = self.config.client_name.as_deref().unwrap_or("Quiver");
        let scopes: Vec<&str> = self.config.scopes.iter().map(String::as_str).collect();
        let client = manager
            .register_client(name, redirect_uri, &scopes)
            .await
            .map_err(|e| self.fail(flow(&e)))?;
        let registration = Registration {
            client_id: client.client_id,
            client_secret: client.client_secret,
            issuer,
        };
        save_registration(self.grants.store.as_ref(), &self.key, registration.clone())
            .await
            .map_err(|e| self.fail(OAuthProblem::Store(e.0)))?;
        Ok(registration)
    }
}

/// The access token `grant` holds, if any.
fn access_token(grant: &Grant) -> Option<String> {
    let tokens = grant.credentials.as_ref()?.token_response.as_ref()?;
    Some(tokens.access_token().secret().clone())
}

/// A registration kept in a grant, if it is still this host's client at the authorization
/// server `issuer`: one made there, or a Client ID Metadata Document (valid anywhere).
fn kept_registration(kept: Option<Registration>, issuer: Option<&str>) -> Option<Registration> {
    kept.filter(|r| r.issuer.as_deref() == issuer || r.client_id.starts_with("https://"))
}

fn client_config(
    registration: Registration,
    redirect_uri: String,
) -> rmcp::transport::auth::OAuthClientConfig {
    let config =
        rmcp::transport::auth::OAuthClientConfig::new(registration.client_id, redirect_uri);
    match registration.client_secret {
        Some(secret) => config.with_client_secret(secret),
        None => config,
    }
}

/// A flow step's error as shown: rmcp's text can quote the authorization server's answer
/// (a registration response, an `error_description`), so controls are escaped and it is
/// cut to [`defaults::OAUTH_FLOW_ERROR_MAX_BYTES`].
fn flow(error: &dyn std::fmt::Display) -> OAuthProblem {
    let text = crate::text::printable(&error.to_string());
    OAuthProblem::Flow(crate::text::cut(&text, defaults::OAUTH_FLOW_ERROR_MAX_BYTES).to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mcp::egress::{EgressConfig, EgressPolicy};

    fn user_token(table: &str) -> UserToken {
        let config: OAuthAuthorizationCodeConfig =
            toml::from_str(&format!("origins = [\"https://mcp.example.com\"]\n{table}")).unwrap();
        let policy = EgressPolicy::from_config(&EgressConfig::default()).unwrap();
        let http = OutboundClient::new(Arc::new(policy), Duration::from_secs(5)).unwrap();
        UserToken::new(
            GrantKey::new("web", "alice"),
            "corp".into(),
            config,
            "https://mcp.example.com/mcp".into(),
            http,
            Grants::default(),
            None,
        )
    }

    fn metadata(token_endpoint: &str) -> rmcp::transport::auth::AuthorizationMetadata {
        let mut metadata = rmcp::transport::auth::AuthorizationMetadata::default();
        metadata.authorization_endpoint = "https://as.example.com/authorize".into();
        metadata.token_endpoint = token_endpoint.into();
        metadata
    }

    #[test]
    fn a_configured_secret_goes_only_to_a_listed_token_endpoint() {
        let confidential = user_token("client_id = \"q\"\nclient_secret_env = \"UNSET\"");
        let elsewhere = metadata("https://evil.example.net/token");
        let refused = confidential.check_secret_bound(&elsewhere).unwrap_err();
        assert!(
            refused.to_string().contains("https://evil.example.net"),
            "{refused}"
        );
        let listed = metadata("https://mcp.example.com/oauth/token");
        assert!(confidential.check_secret_bound(&listed).is_ok());
        // A public client sends no secret: any token endpoint the egress rules allow.
        let public = user_token("");
        assert!(public.check_secret_bound(&elsewhere).is_ok());
    }

    #[test]
    fn an_https_server_needs_https_authorization_endpoints() {
        let user = user_token("");
        let clear = metadata("http://as.example.com/token");
        let refused = user.check_in_clear(&clear).unwrap_err();
        assert!(refused.to_string().contains("plain http"), "{refused}");
        assert!(
            user.check_in_clear(&metadata("https://as.example.com/token"))
                .is_ok()
        );
    }
}
