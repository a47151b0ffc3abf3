//! Connecting a slot's server when a call needs it: reusing a live connection, replacing a
//! lost one, backing off after failed attempts, and stopping connections no longer used.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::slot::ServerSlot;
use super::{Connection, McpPool, reaper};
use crate::defaults;
use crate::mcp::{McpError, McpErrorCode};
use crate::registry::Launch;
use crate::sandbox::off_stack;

pub(super) struct Backoff {
    pub(super) failures: u32,
    pub(super) next_attempt: Instant,
    pub(super) last_error: String,
}

impl McpPool {
    /// The live connection of `slot`, connecting (or reconnecting) if needed.
    pub(super) async fn connect(&self, slot: &ServerSlot) -> Result<Arc<Connection>, McpError> {
        // A token-exchange server needs a running task's subject token: without one the
        // call fails here, clearly, instead of breaking the connection or the backoff
        // other tasks (with tokens) depend on.
        self.rules()
            .auth
            .check_subject(&slot.entry, slot.principal.as_deref())
            .map_err(|e| McpError::new(McpErrorCode::Unavailable, e.to_string()))?;
        let shutdowns = self.shared.shutdowns.load(Ordering::SeqCst);
        if let Some(live) = slot.conn.lock().await.as_ref().filter(|c| c.is_alive()) {
            return Ok(live.clone());
        }
        // Off the stack: opening a connection (a process, the handshake, HTTP and OAuth) is
        // a large future, which every call would otherwise carry in its future and frames.
        off_stack(|| self.reconnect(slot, shutdowns)).await
    }

    /// [`Self::connect`] when the slot had no live connection: `shutdowns` is the pool's
    /// count of shutdowns when the call began.
    async fn reconnect(
        &self,
        slot: &ServerSlot,
        shutdowns: u64,
    ) -> Result<Arc<Connection>, McpError> {
        let mut conn = slot.conn.lock().await;
        // Another call may have connected while this one waited for the lock.
        if let Some(live) = conn.as_ref().filter(|c| c.is_alive()) {
            return Ok(live.clone());
        }
        if let Some(dead) = conn.take() {
            tracing::info!(
                server_id = slot.entry.server_id(),
                "server connection lost; reconnecting"
            );
            slot.health.lost(slot.health_token.load(Ordering::SeqCst));
            self.retire(slot, dead);
        }
        if let Some(backoff) = slot
            .backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            && backoff.next_attempt > Instant::now()
        {
            let wait = backoff.next_attempt - Instant::now();
            return Err(McpError::new(
                McpErrorCode::Unavailable,
                format!(
                    "{} (next connection attempt in {} ms)",
                    backoff.last_error,
                    wait.as_millis()
                ),
            ));
        }
        let process_permit = match slot.entry.launch {
            Ok(Launch::Stdio { .. }) => Some(self.process_permit(slot).await?),
            _ => None,
        };
        let stdio = process_permit.is_some();
        let serial = slot.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let shut_down = self.shared.shutdown.notified();
        tokio::pin!(shut_down);
        shut_down.as_mut().enable();
        let cancelled = || {
            McpError::new(
                McpErrorCode::Unavailable,
                "the MCP pool was shut down while connecting",
            )
        };
        // Not a failure of the server's: no backoff.
        if self.shared.shutdowns.load(Ordering::SeqCst) != shutdowns {
            return Err(cancelled());
        }
        let opened = tokio::select! {
            opened = self.connector.open(&slot.entry, serial, process_permit, slot.principal.as_deref()) => opened,
            () = shut_down => return Err(cancelled()),
        };
        match opened {
            Ok(fresh) => {
                *slot.backoff.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let token = slot.health.connected(slot.retired.load(Ordering::SeqCst));
                slot.health_token.store(token, Ordering::SeqCst);
                // Server processes and per-principal slots are dropped when idle.
                if stdio || slot.principal.is_some() {
                    self.start_reaper();
                }
                let fresh = Arc::new(fresh);
                *conn = Some(fresh.clone());
                Ok(fresh)
            }
            // A principal without a grant: nothing is wrong with the server.
            Err(error) if error.code == McpErrorCode::PolicyDenied => Err(error),
            Err(error) => {
                let mut backoff = slot.backoff.lock().unwrap_or_else(|e| e.into_inner());
                let failures = backoff.as_ref().map_or(0, |b| b.failures).saturating_add(1);
                let delay = (defaults::RECONNECT_BACKOFF_BASE * 2u32.saturating_pow(failures - 1))
                    .min(defaults::RECONNECT_BACKOFF_MAX);
                tracing::warn!(server_id = slot.entry.server_id(), failures, retry_in_ms = delay.as_millis() as u64, %error, "cannot connect to MCP server");
                slot.health
                    .connect_failed(&slot.entry.secrets().redact(&error.message));
                *backoff = Some(Backoff {
                    failures,
                    next_attempt: Instant::now() + delay,
                    last_error: error.message.clone(),
                });
                Err(error)
            }
        }
    }

    /// Starts the idle reaper once, on the first server process (so a pool that never
    /// starts one needs no runtime).
    pub(super) fn start_reaper(&self) {
        self.shared.reaper_wake.notify_one();
        if self.shared.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let task = tokio::spawn(reaper::run(
            Arc::downgrade(&self.shared),
            self.shared.reaper_wake.clone(),
        ));
        *self.reaper.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
    }

    /// Stops `conn`, no longer the slot's connection, in the background once no call
    /// uses it (those holding it see it fail).
    pub(super) fn retire(&self, slot: &ServerSlot, conn: Arc<Connection>) {
        let server_id = slot.entry.server_id().to_owned();
        tokio::spawn(async move { conn.close(&server_id, defaults::SHUTDOWN_GRACE).await });
    }

    /// Forgets `conn` if it is still the slot's current connection, so the next call
    /// reconnects, and stops it.
    pub(super) async fn discard(&self, slot: &ServerSlot, conn: &Connection) {
        let mut current = slot.conn.lock().await;
        if current.as_ref().is_some_and(|c| c.serial == conn.serial)
            && let Some(gone) = current.take()
        {
            slot.health.lost(slot.health_token.load(Ordering::SeqCst));
            self.retire(slot, gone);
        }
    }
}
