//! The MCP connection pool: one long-lived rmcp connection per server, for the whole host.
//!
//! Opening or closing a guest fd never spawns or kills a process; the first call that needs
//! a server connects it, every fd of every task shares that connection, and a server that
//! dies is started again by the next call. Each server's budgets live here: a semaphore for
//! `max_concurrency`, a timeout for `tool_timeout_ms`, a cap for `max_tool_output_bytes`.
//! `tools/list` is read in full (at most `max_tool_list_bytes` over all pages, refused whole
//! past it) and cached until the server says the list changed or the TTL passes, so listing
//! is never on a hot path; resource and prompt listings are kept when the server's hints
//! say for how long ([`crate::mcp::cache`]). A call the server runs as a task is followed
//! to its end here ([`tasks`]).
//!
//! The host's own limits ([`PoolLimits`]) live here too. A call takes its server's permit,
//! then one of the host's `max_concurrent_calls` permits, both within its
//! `tool_timeout_ms`; in that order, so calls queued behind one slow server hold no host
//! permit and never starve the others. At most `max_server_processes` stdio servers run:
//! starting one more stops the least recently used server with no call in flight, or fails
//! at once when all are busy. A background task ([`reaper`]) stops stdio servers idle for
//! their idle timeout. A server is stopped whole (stdin, SIGTERM, SIGKILL to its process
//! group; see [`super::connect`]) wherever it stops: idle, evicted, replaced after a
//! crash or a registry change, at shutdown; dropping the pool kills what is left.
//!
//! Errors leave the pool without the values the server's `${ENV:..}` references resolved
//! to ([`Secrets`](crate::registry::Secrets)), whatever produced them.
//!
//! How a connection is made (spawning a process, reaching a URL, the handshake) is
//! [`super::connect`]'s job; the pool only decides when, and what to do when it fails.
//!
//! By job: [`slot`] (slots in flight, following registry snapshots), [`connecting`]
//! (connect, backoff, stopping replaced connections), [`processes`] (the process cap),
//! [`requests`] (every request the pool sends) with [`paging`], [`tasks`] and [`failure`] (where a
//! request failed and what error it becomes), [`status`] and [`health`] (what it reports),
//! [`limits`] and [`reaper`].

mod connecting;
mod failure;
mod grants;
mod health;
mod limits;
mod paging;
mod processes;
mod reaper;
mod requests;
mod slot;
mod status;
mod tasks;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use super::auth::AuthSet;
use super::connect::{CallRound, Connection, Connector};
use super::egress::EgressPolicy;
use crate::defaults;
use crate::mcp::{LaunchRules, ServerRules};
use crate::registry::Registry;
use health::Health;
pub use health::ServerState;
pub use limits::{McpHostConfig, PoolLimits};
pub use requests::ToolCallOutput;
use slot::ServerSlot;
pub(crate) use slot::ToolsLeftOut;
pub use status::{PoolUsage, ServerStatus};

/// What the pool needs for remote servers (credentials and the egress policy) and for
/// stdio ones (the launch rules).
pub(crate) struct RemoteOptions {
    pub(crate) auth: AuthSet,
    pub(crate) egress: EgressPolicy,
    pub(crate) launch: LaunchRules,
}

/// What the pool and its reaper share.
struct Shared {
    slots: Mutex<HashMap<String, Arc<ServerSlot>>>,
    /// Slots replaced by a changed record whose server may still run.
    retired: Mutex<Vec<Arc<ServerSlot>>>,
    /// Each server's health, by id, kept across slots (bounded by the registry's ids).
    health: Mutex<HashMap<String, Arc<Health>>>,
    /// The registry snapshot the pool follows, once a reload set one: an entry it does not
    /// match comes from an older snapshot.
    registry: Mutex<Option<Arc<Registry>>>,
    limits: PoolLimits,
    /// The host-wide call permits.
    calls: Semaphore,
    /// One permit per running stdio server process.
    processes: Arc<Semaphore>,
    /// Wakes the reaper early: a new server (maybe with a shorter idle timeout), or a
    /// retired slot's last call ended.
    reaper_wake: Arc<Notify>,
    reaper_started: AtomicBool,
    /// Shutdowns so far, and their wake-up: a connect in progress gives up at one rather
    /// than make shutdown wait for its connect timeout.
    shutdowns: AtomicU64,
    shutdown: Notify,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, HashMap<String, Arc<ServerSlot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn retired(&self) -> MutexGuard<'_, Vec<Arc<ServerSlot>>> {
        self.retired.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn health(&self) -> MutexGuard<'_, HashMap<String, Arc<Health>>> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The host's MCP connections. Cheap to share behind an `Arc`. Crate-private: tool calls
/// reach it only through the call gate (`mcp/call.rs`), which applies policy, approvals and
/// observers first.
pub(crate) struct McpPool {
    shared: Arc<Shared>,
    tools_ttl: Duration,
    connector: Connector,
    reaper: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Default for McpPool {
    fn default() -> Self {
        Self::new(defaults::TOOLS_CACHE_TTL, defaults::CONNECT_TIMEOUT)
    }
}

impl McpPool {
    pub(crate) fn new(tools_ttl: Duration, connect_timeout: Duration) -> Self {
        let remote = RemoteOptions {
            auth: Default::default(),
            egress: EgressPolicy::default(),
            launch: LaunchRules::unrestricted(),
        };
        Self::with_remote(tools_ttl, connect_timeout, remote)
    }

    pub(crate) fn with_remote(
        tools_ttl: Duration,
        connect_timeout: Duration,
        remote: RemoteOptions,
    ) -> Self {
        Self {
            shared: Arc::new(Self::shared(PoolLimits::default())),
            tools_ttl,
            connector: Connector::new(
                connect_timeout,
                Arc::new(ServerRules {
                    launch: remote.launch,
                    egress: remote.egress,
                    auth: remote.auth,
                }),
            ),
            reaper: Mutex::new(None),
        }
    }

    /// The operator's rules records are held to, for building registries under them.
    pub(crate) fn rules(&self) -> Arc<ServerRules> {
        self.connector.rules().clone()
    }

    /// The same pool with host-wide `limits` (caps are kept between 1 and what a
    /// semaphore holds). Call it before the pool is used.
    #[must_use]
    pub(crate) fn with_limits(mut self, limits: PoolLimits) -> Self {
        let limits = PoolLimits {
            max_concurrent_calls: limits.max_concurrent_calls.clamp(1, Semaphore::MAX_PERMITS),
            max_server_processes: limits.max_server_processes.clamp(1, Semaphore::MAX_PERMITS),
            ..limits
        };
        self.shared = Arc::new(Self::shared(limits));
        self
    }

    fn shared(limits: PoolLimits) -> Shared {
        Shared {
            slots: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            health: Mutex::new(HashMap::new()),
            registry: Mutex::new(None),
            calls: Semaphore::new(limits.max_concurrent_calls),
            processes: Arc::new(Semaphore::new(limits.max_server_processes)),
            limits,
            reaper_wake: Arc::new(Notify::new()),
            reaper_started: AtomicBool::new(false),
            shutdowns: AtomicU64::new(0),
            shutdown: Notify::new(),
        }
    }

    /// The host-wide limits in force.
    pub(crate) fn limits(&self) -> &PoolLimits {
        &self.shared.limits
    }

    /// Closes every connection and stops every server process group: stdin closed, then
    /// SIGTERM, then SIGKILL, with [`defaults::SHUTDOWN_GRACE`] per step. Calls still in
    /// flight fail with `mcp_unavailable`, connects in progress at once. The pool stays usable: a later call starts its
    /// server again.
    pub(crate) async fn shutdown(&self) {
        self.shared.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.shared.shutdown.notify_waiters();
        let mut slots: Vec<Arc<ServerSlot>> = self.shared.slots().drain().map(|(_, s)| s).collect();
        slots.append(&mut self.shared.retired());
        let closing = slots.into_iter().map(|slot| async move {
            let Some(conn) = slot.conn.lock().await.take() else {
                return;
            };
            slot.health
                .stopped(slot.health_token.load(Ordering::SeqCst));
            conn.close(slot.entry.server_id(), defaults::SHUTDOWN_GRACE)
                .await;
        });
        futures::future::join_all(closing).await;
    }
}

impl Drop for McpPool {
    /// Stops the reaper; dropping the slots kills every server's process group.
    fn drop(&mut self) {
        if let Some(reaper) = self.reaper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reaper.abort();
        }
    }
}
