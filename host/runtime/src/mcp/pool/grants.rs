//! A person's authorization of a server for a principal, made or revoked outside any call:
//! `quiver mcp login` / `logout` and their library and admin counterparts.

use std::sync::Arc;

use super::McpPool;
use super::slot::slot_key;
use crate::mcp::auth::{GrantKey, GrantStatus, UserAuthorizer};
use crate::mcp::{McpError, McpErrorCode};
use crate::registry::ServerEntry;

impl McpPool {
    /// Runs the authorization code flow for `principal` at `entry`'s server now, through
    /// `authorizer` or else the host's [`UserAuthorizer`], and keeps the grant. A server
    /// whose credential is not user authorization is refused.
    pub(crate) async fn authorize(
        &self,
        entry: &Arc<ServerEntry>,
        principal: &str,
        authorizer: Option<Arc<dyn UserAuthorizer>>,
    ) -> Result<(), McpError> {
        let user = self.connector.user_token(entry, principal)?;
        user.login(authorizer)
            .await
            .map_err(|e| McpError::new(McpErrorCode::Unavailable, e.to_string()))?;
        // A connection made with the old grant goes; the next call connects with the new.
        self.forget_principal(entry, principal);
        Ok(())
    }

    /// Forgets `principal`'s grant for `entry`'s server, closes the connection made with
    /// it, and revokes its tokens at the authorization server (RFC 7009, bounded; a failure
    /// there is logged, the grant is gone here all the same); whether there was a grant.
    pub(crate) async fn revoke(
        &self,
        entry: &Arc<ServerEntry>,
        principal: &str,
    ) -> Result<bool, McpError> {
        let key = GrantKey::new(entry.server_id(), principal);
        let (removed, held) = self
            .rules()
            .auth
            .grants()
            .take(&key)
            .await
            .map_err(|e| McpError::new(McpErrorCode::Unavailable, e.to_string()))?;
        self.forget_principal(entry, principal);
        if let Some(grant) = held.filter(|g| g.has_tokens()) {
            match self.connector.user_token(entry, principal) {
                Ok(user) => user.revoke_at_server(grant).await,
                Err(e) => {
                    tracing::warn!(server_id = %key.server_id, principal, error = %e.message, "the grant is forgotten, but its tokens cannot be revoked at the authorization server")
                }
            }
        }
        Ok(removed)
    }

    /// What `principal`'s grant for `entry`'s server holds (never its tokens); `None`
    /// without one. A server whose credential is not user authorization is refused.
    pub(crate) async fn grant_status(
        &self,
        entry: &Arc<ServerEntry>,
        principal: &str,
    ) -> Result<Option<GrantStatus>, McpError> {
        self.connector.user_token(entry, principal)?;
        let key = GrantKey::new(entry.server_id(), principal);
        let grant = self
            .rules()
            .auth
            .grants()
            .store
            .load(&key)
            .await
            .map_err(|e| McpError::new(McpErrorCode::Unavailable, e.to_string()))?;
        Ok(grant.and_then(|g| g.status()))
    }

    /// Drops the slot of `principal` at `entry`'s server; its connection closes with its
    /// last call.
    fn forget_principal(&self, entry: &ServerEntry, principal: &str) {
        let key = slot_key(entry.server_id(), Some(principal));
        if let Some(slot) = self.shared.slots().remove(&*key)
            && let Ok(mut conn) = slot.conn.try_lock()
            && let Some(conn) = conn.take()
        {
            self.retire(&slot, conn);
        }
    }
}
