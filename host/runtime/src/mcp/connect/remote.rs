//! Reaching a remote server: Streamable HTTP or legacy HTTP+SSE, with the record's headers
//! and the credentials its `auth_ref` names, through the host's one HTTP client.
//!
//! The configured URL is checked against the egress policy before anything else happens,
//! so a server outside the allow rules fails with the rule that refused it and no token is
//! fetched for it. Every later request (to that URL, to an endpoint the server names, to an
//! OAuth endpoint) is checked again by the client itself ([`crate::mcp::outbound`]).

use std::collections::BTreeMap;

use super::{ConnectError, Connection, Connector, Peer, unavailable};
use std::sync::Arc;

use crate::mcp::auth::{AuthError, Credentials, UserToken};
use crate::mcp::error::McpError;
use crate::mcp::http::{
    AuthRefusal, AuthedClient, CommonStream, LegacySse, header_map, streamable_http,
};
use crate::mcp::tool_headers::LeftOut;
use crate::registry::{ServerEntry, Transport};

impl Connector {
    /// The user-authorization credential of `entry` for `principal`, for a flow run
    /// outside a call; an error if the server's credential is another kind.
    pub(crate) fn user_token(
        &self,
        entry: &ServerEntry,
        principal: &str,
    ) -> Result<Arc<UserToken>, McpError> {
        let server_id = entry.server_id();
        let (url, auth_ref) = match &entry.record.http {
            Some(http) => (http.url.as_str(), http.auth_ref.as_deref()),
            None => ("", None),
        };
        let http = self
            .http
            .as_ref()
            .map_err(|e| unavailable(format!("server `{server_id}`: {e}")))?
            .clone();
        match auth_ref.map(|auth_ref| {
            Credentials::resolve(
                server_id,
                auth_ref,
                &self.rules.auth,
                url,
                http,
                Some(principal),
            )
        }) {
            Some(Ok(Credentials::User(user))) => Ok(user),
            Some(Err(e)) => Err(auth_refused(e)),
            _ => Err(McpError::new(
                crate::mcp::McpErrorCode::InvalidArguments,
                format!(
                    "server `{server_id}` does not use user authorization: its http.auth_ref must name an [auth.NAME] with kind = \"oauth_authorization_code\""
                ),
            )),
        }
    }

    pub(super) async fn open_remote(
        &self,
        entry: &ServerEntry,
        url: &str,
        headers: &BTreeMap<String, String>,
        serial: u64,
        principal: Option<&str>,
    ) -> Result<Connection, McpError> {
        let server_id = entry.server_id();
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| unavailable(format!("server `{server_id}`: bad http.url: {e}")))?;
        let http = self
            .http
            .as_ref()
            .map_err(|e| unavailable(format!("server `{server_id}`: {e}")))?
            .clone();
        // The client checks every request anyway; checking here first fails fast, before
        // credentials are resolved or a token is fetched for a server we may not reach.
        http.check(&parsed)
            .map_err(|denied| unavailable(format!("server `{server_id}`: {denied}")))?;
        http.check_resolved(&parsed)
            .await
            .map_err(|refused| unavailable(format!("server `{server_id}`: {refused}")))?;
        let credentials = match entry
            .record
            .http
            .as_ref()
            .and_then(|h| h.auth_ref.as_deref())
        {
            Some(auth_ref) => Some(
                Credentials::resolve(
                    server_id,
                    auth_ref,
                    &self.rules.auth,
                    url,
                    http.clone(),
                    principal,
                )
                .map_err(auth_refused)?,
            ),
            None => None,
        };
        if let Some(Credentials::User(user)) = &credentials {
            user.require_grant().await.map_err(auth_refused)?;
        }
        let headers = header_map(server_id, headers, credentials.as_ref())
            .map_err(|e| unavailable(e.to_string()))?;
        let oauth = credentials.as_ref().and_then(Credentials::tokens);
        let refusal = AuthRefusal::default();
        let left_out = LeftOut::default();
        let common_stream = CommonStream::default();
        let client = AuthedClient {
            inner: http,
            oauth,
            limits: super::Limits::of(entry),
            refusal: refusal.clone(),
            left_out: left_out.clone(),
            common_stream: common_stream.clone(),
        };
        let peer = Peer::Url(url, left_out);
        let connected = match entry.record.transport {
            Transport::HttpSseLegacy => {
                let transport = async {
                    LegacySse::connect(url, client, headers)
                        .await
                        .map_err(ConnectError::LegacySse)
                };
                self.establish(entry, serial, peer, transport).await
            }
            _ => {
                let transport = streamable_http(url, client, headers);
                self.establish(entry, serial, peer, async { Ok(transport) })
                    .await
            }
        };
        connected.map(|conn| {
            conn.with_auth_refusal(refusal)
                .with_common_stream(common_stream)
        })
    }
}

/// A credential that cannot be had: refused by policy when only a person can fix it (no
/// grant, no principal), so it is not retried and not held against the server's health;
/// else the server is unavailable.
fn auth_refused(error: AuthError) -> McpError {
    match error.needs_person() {
        true => McpError::new(crate::mcp::McpErrorCode::PolicyDenied, error.to_string()),
        false => unavailable(error.to_string()),
    }
}
