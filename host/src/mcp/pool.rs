//! The MCP connection pool: one long-lived rmcp connection per server, for the whole host.
//!
//! Opening or closing a guest fd never spawns or kills a process; the first call that needs
//! a server connects it, every fd of every task shares that connection, and a server that
//! dies is started again by the next call. Each server's budgets live here: a semaphore for
//! `max_concurrency`, a timeout for `tool_timeout_ms`, a cap for `max_tool_output_bytes`.
//! `tools/list` is read in full and cached until the server says the list changed or the
//! TTL passes, so listing is never on a hot path.
//!
//! How a connection is made (spawning a process, reaching a URL, the handshake) is
//! [`super::connect`]'s job; the pool only decides when, and what to do when it fails.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, ErrorCode, JsonObject, PaginatedRequestParams};
use tokio::sync::Semaphore;

use super::auth::AuthConfig;
use super::connect::{Connection, Connector};
use super::egress::EgressPolicy;
use super::error::{McpError, McpErrorCode};
use super::{CallToolResult, Tool};
use crate::defaults;
use crate::registry::ServerEntry;

/// Connection state of one server, for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    pub server_id: String,
    /// The live server process, if connected over stdio.
    pub pid: Option<u32>,
    /// Connections made so far (1 + restarts).
    pub connections: u64,
}

/// A successful `tools/call`: the result and its JSON encoding (what guests receive).
#[derive(Clone, Debug)]
pub struct ToolCallOutput {
    pub result: CallToolResult,
    pub json: Vec<u8>,
}

struct CachedTools {
    fetched: Instant,
    conn_serial: u64,
    tools: Arc<[Tool]>,
}

struct ServerSlot {
    entry: Arc<ServerEntry>,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    permits: Semaphore,
    tools: Mutex<Option<CachedTools>>,
    connections: AtomicU64,
    /// After failed connection attempts: when the next may start, and why the last failed.
    backoff: Mutex<Option<Backoff>>,
}

struct Backoff {
    failures: u32,
    next_attempt: Instant,
    last_error: String,
}

/// What the pool needs for remote servers: credentials and the egress policy.
pub struct RemoteOptions {
    pub auth: std::collections::BTreeMap<String, AuthConfig>,
    pub egress: EgressPolicy,
}

/// The host's MCP connections. Cheap to share behind an `Arc`.
pub struct McpPool {
    slots: Mutex<HashMap<String, Arc<ServerSlot>>>,
    tools_ttl: Duration,
    connector: Connector,
}

impl Default for McpPool {
    fn default() -> Self {
        Self::new(defaults::TOOLS_CACHE_TTL, defaults::CONNECT_TIMEOUT)
    }
}

impl McpPool {
    pub fn new(tools_ttl: Duration, connect_timeout: Duration) -> Self {
        let remote = RemoteOptions {
            auth: Default::default(),
            egress: EgressPolicy::default(),
        };
        Self::with_remote(tools_ttl, connect_timeout, remote)
    }

    pub fn with_remote(
        tools_ttl: Duration,
        connect_timeout: Duration,
        remote: RemoteOptions,
    ) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            tools_ttl,
            connector: Connector::new(connect_timeout, remote.auth, remote.egress),
        }
    }

    /// The slot for `entry`; a changed record or launch config replaces the old slot, whose
    /// connection closes once its last in-flight call is done.
    fn slot(&self, entry: &Arc<ServerEntry>) -> Arc<ServerSlot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(entry.server_id())
            && (Arc::ptr_eq(&slot.entry, entry)
                || (slot.entry.record == entry.record && slot.entry.launch == entry.launch))
        {
            return slot.clone();
        }
        let slot = Arc::new(ServerSlot {
            entry: entry.clone(),
            conn: tokio::sync::Mutex::new(None),
            permits: Semaphore::new(entry.record.budgets.max_concurrency as usize),
            tools: Mutex::new(None),
            connections: AtomicU64::new(0),
            backoff: Mutex::new(None),
        });
        slots.insert(entry.server_id().to_owned(), slot.clone());
        slot
    }

    /// The live connection of `slot`, connecting (or reconnecting) if needed.
    async fn connect(&self, slot: &ServerSlot) -> Result<Arc<Connection>, McpError> {
        let mut conn = slot.conn.lock().await;
        if let Some(live) = conn.as_ref().filter(|c| c.is_alive()) {
            return Ok(live.clone());
        }
        if conn.take().is_some() {
            tracing::info!(
                server_id = slot.entry.server_id(),
                "server connection lost; reconnecting"
            );
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
        let serial = slot.connections.fetch_add(1, Ordering::SeqCst) + 1;
        match self.connector.open(&slot.entry, serial).await {
            Ok(fresh) => {
                *slot.backoff.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let fresh = Arc::new(fresh);
                *conn = Some(fresh.clone());
                Ok(fresh)
            }
            Err(error) => {
                let mut backoff = slot.backoff.lock().unwrap_or_else(|e| e.into_inner());
                let failures = backoff.as_ref().map_or(0, |b| b.failures) + 1;
                let delay = (defaults::RECONNECT_BACKOFF_BASE * 2u32.saturating_pow(failures - 1))
                    .min(defaults::RECONNECT_BACKOFF_MAX);
                tracing::warn!(server_id = slot.entry.server_id(), failures, retry_in_ms = delay.as_millis() as u64, %error, "cannot connect to MCP server");
                *backoff = Some(Backoff {
                    failures,
                    next_attempt: Instant::now() + delay,
                    last_error: error.message.clone(),
                });
                Err(error)
            }
        }
    }

    /// Forgets `conn` if it is still the slot's current connection, so the next call
    /// reconnects. In-flight calls keep it alive until they finish; then it is dropped,
    /// which ends the process.
    async fn discard(&self, slot: &ServerSlot, conn: &Connection) {
        let mut current = slot.conn.lock().await;
        if current.as_ref().is_some_and(|c| c.serial == conn.serial) {
            *current = None;
        }
    }

    /// Every tool the server lists (all pages), from the cache when fresh.
    pub async fn list_tools(&self, entry: &Arc<ServerEntry>) -> Result<Arc<[Tool]>, McpError> {
        let slot = self.slot(entry);
        let conn = self.connect(&slot).await?;
        {
            let cache = slot.tools.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(cached) = cache.as_ref()
                && cached.conn_serial == conn.serial
                && cached.fetched.elapsed() < self.tools_ttl
                && !conn.tools_stale.load(Ordering::SeqCst)
            {
                return Ok(cached.tools.clone());
            }
        }
        let server_id = entry.server_id();
        conn.tools_stale.store(false, Ordering::SeqCst);
        let timeout = entry.record.budgets.tool_timeout;
        let listed = tokio::time::timeout(timeout, list_all_pages(&conn))
            .await
            .map_err(|_| timed_out(server_id, "tools/list", timeout))?;
        let tools: Arc<[Tool]> = match listed {
            Ok(tools) => tools.into(),
            Err(e) => {
                let error = service_failed(server_id, "tools/list", e);
                if error.code == McpErrorCode::Unavailable {
                    self.discard(&slot, &conn).await;
                }
                return Err(error);
            }
        };
        *slot.tools.lock().unwrap_or_else(|e| e.into_inner()) = Some(CachedTools {
            fetched: Instant::now(),
            conn_serial: conn.serial,
            tools: tools.clone(),
        });
        Ok(tools)
    }

    /// Calls `name` on the server within its budgets. `arguments` is the JSON object sent.
    /// The caller has decided policy ([`Grant::check_call`](crate::policy::Grant::check_call)).
    pub async fn call_tool(
        &self,
        entry: &Arc<ServerEntry>,
        name: &str,
        arguments: JsonObject,
    ) -> Result<ToolCallOutput, McpError> {
        let server_id = entry.server_id();
        let record = &entry.record;
        let slot = self.slot(entry);
        let conn = self.connect(&slot).await?;
        let timeout = record.budgets.tool_timeout;
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let call = async {
            let _permit = slot.permits.acquire().await.map_err(|_| {
                McpError::new(
                    McpErrorCode::Unavailable,
                    format!("server `{server_id}` is shutting down"),
                )
            })?;
            conn.service
                .call_tool(params)
                .await
                .map_err(|e| service_failed(server_id, name, e))
        };
        let outcome = match tokio::time::timeout(timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timed_out(server_id, name, timeout)),
        };
        let result = match outcome {
            Ok(result) => result,
            Err(error) => {
                if error.code == McpErrorCode::Unavailable {
                    self.discard(&slot, &conn).await;
                }
                return Err(error);
            }
        };
        let json = serde_json::to_vec(&result).map_err(|e| {
            McpError::new(
                McpErrorCode::ToolExecFailed,
                format!("cannot encode the result: {e}"),
            )
        })?;
        let cap = record.budgets.max_tool_output_bytes;
        if json.len() as u64 > cap {
            return Err(McpError::new(
                McpErrorCode::OutputTooLarge,
                format!(
                    "tool `{name}` on server `{server_id}` returned {} bytes; the limit (budgets.max_tool_output_bytes) is {cap}",
                    json.len()
                ),
            ));
        }
        Ok(ToolCallOutput { result, json })
    }

    /// Connection state of every server used so far.
    pub fn status(&self) -> Vec<ServerStatus> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<ServerStatus> = slots
            .values()
            .map(|slot| ServerStatus {
                server_id: slot.entry.server_id().to_owned(),
                pid: slot
                    .conn
                    .try_lock()
                    .ok()
                    .and_then(|c| c.as_ref().filter(|c| c.is_alive()).and_then(|c| c.pid)),
                connections: slot.connections.load(Ordering::SeqCst),
            })
            .collect();
        out.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        out
    }

    /// Closes every connection: each server gets its stdin closed, then SIGTERM, then
    /// SIGKILL, within [`defaults::SHUTDOWN_GRACE`] per step.
    pub async fn shutdown(&self) {
        let slots: Vec<Arc<ServerSlot>> = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.drain().map(|(_, slot)| slot).collect()
        };
        let closing = slots.into_iter().map(|slot| async move {
            let Some(conn) = slot.conn.lock().await.take() else {
                return;
            };
            match Arc::try_unwrap(conn) {
                Ok(conn) => {
                    let server_id = slot.entry.server_id().to_owned();
                    let wait = defaults::SHUTDOWN_GRACE * 3;
                    if tokio::time::timeout(wait, conn.service.cancel())
                        .await
                        .is_err()
                    {
                        tracing::warn!(server_id, "server did not shut down in time; killed");
                    }
                }
                // Still in use by a call that is being abandoned: cancel it; the process is
                // killed when that call lets go.
                Err(shared) => shared.service.cancellation_token().cancel(),
            }
        });
        futures::future::join_all(closing).await;
    }
}

async fn list_all_pages(conn: &Connection) -> Result<Vec<Tool>, ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let page = conn
            .service
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await?;
        tools.extend(page.tools);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        "tools/list kept paging; using what was read"
    );
    Ok(tools)
}

fn timed_out(server_id: &str, what: &str, timeout: Duration) -> McpError {
    McpError::new(
        McpErrorCode::Timeout,
        format!(
            "server `{server_id}` did not answer {what} within {} ms (budgets.tool_timeout_ms)",
            timeout.as_millis()
        ),
    )
}

fn service_failed(server_id: &str, what: &str, error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => McpError::new(
            McpErrorCode::InvalidArguments,
            format!("server `{server_id}` rejected {what}: {}", data.message),
        ),
        ServiceError::McpError(data) => McpError::new(
            McpErrorCode::ToolExecFailed,
            format!(
                "server `{server_id}` failed {what}: {} (code {})",
                data.message, data.code.0
            ),
        ),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => McpError::new(
            McpErrorCode::Unavailable,
            format!("server `{server_id}` went away during {what}; the next call restarts it"),
        ),
        ServiceError::Timeout { timeout } => timed_out(server_id, what, timeout),
        other => McpError::new(
            McpErrorCode::ToolExecFailed,
            format!("server `{server_id}` failed {what}: {other}"),
        ),
    }
}
