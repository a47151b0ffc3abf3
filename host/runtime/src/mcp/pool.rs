//! The MCP connection pool: one long-lived rmcp connection per server, for the whole host.
//!
//! Opening or closing a guest fd never spawns or kills a process; the first call that needs
//! a server connects it, every fd of every task shares that connection, and a server that
//! dies is started again by the next call. Each server's budgets live here: a semaphore for
//! `max_concurrency`, a timeout for `tool_timeout_ms`, a cap for `max_tool_output_bytes`.
//! `tools/list` is read in full (at most `max_tool_list_bytes` over all pages, refused whole
//! past it) and cached until the server says the list changed or the TTL passes, so listing
//! is never on a hot path.
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

mod health;
mod limits;
mod reaper;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequestParams, ErrorCode, GetPromptRequestParams, JsonObject, PaginatedRequestParams,
    Prompt, ReadResourceRequestParams, Resource, ResourceTemplate,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::auth::AuthSet;
use super::capped::{Encode, encode_capped, encoded_len};
use super::connect::{Connection, Connector};
use super::egress::EgressPolicy;
use super::error::{McpError, McpErrorCode, from_host_error};
use super::{CallToolResult, Tool};
use crate::defaults;
use crate::registry::{Launch, Registry, ServerEntry};
use health::Health;
pub use health::ServerState;
pub use limits::{McpHostConfig, PoolLimits};

/// Connection state and health of one server, for diagnostics and `quiver mcp status`.
/// Counters cover the host's whole life, across restarts and registry changes. New fields
/// may be added.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    pub server_id: String,
    pub state: ServerState,
    /// The live server process, if connected over stdio.
    pub pid: Option<u32>,
    /// Connections made so far.
    pub connections: u64,
    /// Connections made after the previous one was lost (the process died, the transport
    /// broke); idle stops and evictions are not counted.
    pub reconnects: u64,
    /// The last server-side failure (connect, transport, timeout on the wire, JSON-RPC
    /// error other than "method not found"), with the server's secrets redacted, control
    /// characters removed and cut to [`defaults::MAX_SERVER_ERROR_BYTES`]. A tool's own
    /// error result (`isError`) is an answer, not a failure.
    pub last_error: Option<String>,
    /// When the server last connected or answered (unix seconds).
    pub last_success: Option<u64>,
    /// Tools in its last `tools/list` (before any filter); `None` until listed.
    pub tool_count: Option<u64>,
    /// Latency percentiles of its last [`defaults::SERVER_LATENCY_WINDOW`] answered
    /// `tools/call`s (time on the wire, not waiting for permits); `None` before any.
    pub latency_p50_ms: Option<u64>,
    pub latency_p95_ms: Option<u64>,
    /// Calls (`tools/call`, `tools/list`) using the server now, those still waiting for a
    /// connection or a permit included.
    pub calls_in_flight: u32,
    /// Milliseconds since the server's last call ended; 0 while calls are in flight.
    pub idle_ms: u64,
}

/// The pool's use of its host-wide limits, for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Calls holding one of the host's call permits.
    pub calls_in_flight: usize,
    pub max_concurrent_calls: usize,
    /// Stdio server processes running (or still stopping).
    pub server_processes: usize,
    pub max_server_processes: usize,
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
    /// Shared with every slot this server had and will have.
    health: Arc<Health>,
    /// The health token of the slot's connection (see [`Health::connected`]).
    health_token: AtomicU64,
    /// After failed connection attempts: when the next may start, and why the last failed.
    backoff: Mutex<Option<Backoff>>,
    activity: Mutex<Activity>,
    /// Replaced by a changed record: stop its server as soon as no call uses it.
    retired: AtomicBool,
    /// Wakes the reaper (when a retired slot's last call ends).
    reaper: Arc<Notify>,
}

/// Calls using a slot, and when its last call ended.
struct Activity {
    in_flight: u32,
    last_used: Instant,
}

struct Backoff {
    failures: u32,
    next_attempt: Instant,
    last_error: String,
}

/// One call's use of a slot: counted in flight from before it connects until it is done
/// (or dropped), so no idle stop or eviction can take the server from under it.
struct InFlight {
    slot: Arc<ServerSlot>,
}

impl ServerSlot {
    fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        let mut activity = self.activity();
        activity.in_flight = activity.in_flight.saturating_add(1);
        activity.last_used = Instant::now();
        InFlight { slot: self.clone() }
    }

    /// How long the server may sit unused before it is stopped; `None`: forever.
    fn idle_timeout(&self, host_default: Duration) -> Option<Duration> {
        let own = self
            .entry
            .record
            .stdio
            .as_ref()
            .and_then(|stdio| stdio.idle_timeout_ms)
            .map(Duration::from_millis);
        Some(own.unwrap_or(host_default)).filter(|t| !t.is_zero())
    }

    /// Takes the slot's server process out of service if no call uses it and, with
    /// `min_idle`, none has for that long. Never waits: a slot that is busy connecting is
    /// not idle.
    fn take_if_idle(&self, min_idle: Option<Duration>) -> Option<Arc<Connection>> {
        let mut conn = self.conn.try_lock().ok()?;
        if !conn.as_ref()?.is_stdio() {
            return None;
        }
        let activity = self.activity();
        let idle_enough = min_idle.is_none_or(|min| activity.last_used.elapsed() >= min);
        if activity.in_flight > 0 || !idle_enough {
            return None;
        }
        self.health
            .stopped(self.health_token.load(Ordering::SeqCst));
        conn.take()
    }

    /// What `status()` shows of this slot. The connection is looked at only if no connect
    /// holds it; otherwise the health's own record stands.
    fn status(&self) -> ServerStatus {
        let seen = self
            .conn
            .try_lock()
            .ok()
            .map(|c| c.as_ref().filter(|c| c.is_alive()).map(|c| c.pid()));
        let alive = seen.map(|live| live.is_some());
        let mut status = status_of(self.entry.server_id(), &self.health, alive);
        status.pid = seen.flatten().flatten();
        let activity = self.activity();
        status.calls_in_flight = activity.in_flight;
        status.idle_ms = if activity.in_flight > 0 {
            0
        } else {
            u64::try_from(activity.last_used.elapsed().as_millis()).unwrap_or(u64::MAX)
        };
        status
    }
}

/// The status of a server from its health alone (no slot: no pid, nothing in flight).
fn status_of(server_id: &str, health: &Health, alive: Option<bool>) -> ServerStatus {
    let health = health.snapshot(alive);
    ServerStatus {
        server_id: server_id.to_owned(),
        state: health.state,
        pid: None,
        connections: health.connects,
        reconnects: health.reconnects,
        last_error: health.last_error,
        last_success: health.last_success,
        tool_count: health.tool_count,
        latency_p50_ms: health.latency_p50_ms,
        latency_p95_ms: health.latency_p95_ms,
        calls_in_flight: 0,
        idle_ms: 0,
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut activity = self.slot.activity();
        activity.in_flight = activity.in_flight.saturating_sub(1);
        activity.last_used = Instant::now();
        if activity.in_flight == 0 && self.slot.retired.load(Ordering::SeqCst) {
            self.slot.reaper.notify_one();
        }
    }
}

/// What the pool needs for remote servers: credentials and the egress policy.
pub struct RemoteOptions {
    pub auth: AuthSet,
    pub egress: EgressPolicy,
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

/// The host's MCP connections. Cheap to share behind an `Arc`.
pub struct McpPool {
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
            shared: Arc::new(Self::shared(PoolLimits::default())),
            tools_ttl,
            connector: Connector::new(connect_timeout, remote.auth, remote.egress),
            reaper: Mutex::new(None),
        }
    }

    /// The same pool with host-wide `limits` (caps are kept between 1 and what a
    /// semaphore holds). Call it before the pool is used.
    #[must_use]
    pub fn with_limits(mut self, limits: PoolLimits) -> Self {
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
    pub fn limits(&self) -> &PoolLimits {
        &self.shared.limits
    }

    /// Enters the slot for `entry` (counted in flight until the guard drops). A changed
    /// launch config replaces the old slot, whose server is stopped once its last call is
    /// done. An entry from a registry snapshot older than the one the pool follows
    /// ([`apply_registry`](Self::apply_registry)) never replaces the current slot: it reuses
    /// a retired slot that launches the same way, or gets one of its own, retired from the
    /// start, so a task still on that snapshot is served without stopping anyone's server.
    /// A current entry never uses a retired slot (the registry may have changed back to
    /// it): its server would be stopped under the current snapshot's calls.
    fn enter(&self, entry: &Arc<ServerEntry>) -> InFlight {
        let mut slots = self.shared.slots();
        let server_id = entry.server_id();
        if let Some(slot) = slots.get(server_id)
            && (Arc::ptr_eq(&slot.entry, entry) || slot.entry.connects_like(entry))
        {
            return slot.begin();
        }
        let outdated = self.is_outdated(entry);
        let mut retired = self.shared.retired();
        if outdated
            && let Some(slot) = retired
                .iter()
                .find(|slot| slot.entry.server_id() == server_id && slot.entry.connects_like(entry))
        {
            return slot.begin();
        }
        let slot = Arc::new(ServerSlot {
            entry: entry.clone(),
            conn: tokio::sync::Mutex::new(None),
            permits: Semaphore::new(entry.record.budgets.max_concurrency as usize),
            tools: Mutex::new(None),
            connections: AtomicU64::new(0),
            health: self
                .shared
                .health()
                .entry(server_id.to_owned())
                .or_default()
                .clone(),
            health_token: AtomicU64::new(0),
            backoff: Mutex::new(None),
            activity: Mutex::new(Activity {
                in_flight: 0,
                last_used: Instant::now(),
            }),
            retired: AtomicBool::new(false),
            reaper: self.shared.reaper_wake.clone(),
        });
        // Begun before anyone else can see the slot, so the reaper never drops it unused.
        let in_flight = slot.begin();
        if outdated {
            slot.retired.store(true, Ordering::SeqCst);
            retired.push(slot);
        } else if let Some(old) = slots.insert(server_id.to_owned(), slot) {
            old.retired.store(true, Ordering::SeqCst);
            retired.push(old);
            self.shared.reaper_wake.notify_one();
        }
        in_flight
    }

    /// Whether `entry` is from an older registry snapshot than the pool follows: the
    /// current one lacks its server or launches it differently.
    fn is_outdated(&self, entry: &ServerEntry) -> bool {
        let registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        registry.as_ref().is_some_and(|registry| {
            registry
                .get(entry.server_id())
                .is_none_or(|current| !current.connects_like(entry))
        })
    }

    /// Follows a new registry snapshot: the servers `registry` no longer has, or now
    /// launches differently, are retired (each stopped once no call uses it); the others
    /// keep their connection. Returns the ids retired.
    pub fn apply_registry(&self, registry: &Arc<Registry>) -> Vec<String> {
        let mut slots = self.shared.slots();
        *self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(registry.clone());
        let stale: Vec<String> = slots
            .iter()
            .filter(|(id, slot)| {
                registry
                    .get(id)
                    .is_none_or(|entry| !slot.entry.connects_like(entry))
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut retired = self.shared.retired();
        for id in &stale {
            if let Some(old) = slots.remove(id) {
                old.retired.store(true, Ordering::SeqCst);
                // Only a server process needs stopping; a remote connection closes with
                // its last user. A stdio slot with a call in flight is kept even without
                // a connection: that call may be about to start its process. What it
                // launches is the entry's, whatever it holds now.
                let stdio = matches!(old.entry.launch, Ok(Launch::Stdio { .. }));
                let unused = old.activity().in_flight == 0
                    && old.conn.try_lock().is_ok_and(|conn| conn.is_none());
                if stdio && !unused {
                    retired.push(old);
                }
            }
        }
        drop((slots, retired));
        if !stale.is_empty() {
            self.shared.reaper_wake.notify_one();
        }
        stale
    }

    /// The live connection of `slot`, connecting (or reconnecting) if needed.
    async fn connect(&self, slot: &ServerSlot) -> Result<Arc<Connection>, McpError> {
        let shutdowns = self.shared.shutdowns.load(Ordering::SeqCst);
        let mut conn = slot.conn.lock().await;
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
            opened = self.connector.open(&slot.entry, serial, process_permit) => opened,
            () = shut_down => return Err(cancelled()),
        };
        match opened {
            Ok(fresh) => {
                *slot.backoff.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let token = slot.health.connected(slot.retired.load(Ordering::SeqCst));
                slot.health_token.store(token, Ordering::SeqCst);
                if stdio {
                    self.start_reaper();
                }
                let fresh = Arc::new(fresh);
                *conn = Some(fresh.clone());
                Ok(fresh)
            }
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

    /// A permit to run one more server process. At the cap, stops the least recently used
    /// server no call is using. When none can be stopped but some permit is held by a
    /// server that is not serving (it died or is being stopped), waits for it to be gone,
    /// within `starting`'s `tool_timeout_ms`; fails at once when every one is busy.
    async fn process_permit(
        &self,
        starting: &ServerSlot,
    ) -> Result<OwnedSemaphorePermit, McpError> {
        let max = self.shared.limits.max_server_processes;
        let wait = starting.entry.record.budgets.tool_timeout;
        // Each round either gets a permit or stops a server; a few rounds cover servers
        // that other starting calls take meanwhile.
        for _ in 0..=max {
            if let Ok(permit) = self.shared.processes.clone().try_acquire_owned() {
                return Ok(permit);
            }
            let Some((victim, conn)) = reaper::least_recently_used_idle(&self.shared, starting)
            else {
                if reaper::serving_processes(&self.shared, starting) >= max {
                    break;
                }
                let processes = self.shared.processes.clone();
                match tokio::time::timeout(wait, processes.acquire_owned()).await {
                    Ok(Ok(permit)) => return Ok(permit),
                    Ok(Err(_)) => break,
                    Err(_) => {
                        return Err(McpError::new(
                            McpErrorCode::Unavailable,
                            format!(
                                "cannot start server `{}`: the host's {max} MCP server processes (max_server_processes) were still stopping after {} ms (budgets.tool_timeout_ms)",
                                starting.entry.server_id(),
                                wait.as_millis()
                            ),
                        ));
                    }
                }
            };
            tracing::info!(
                server_id = victim.entry.server_id(),
                starting = starting.entry.server_id(),
                max_server_processes = max,
                "stopping the least recently used idle MCP server to start another"
            );
            conn.close(victim.entry.server_id(), defaults::SHUTDOWN_GRACE)
                .await;
        }
        Err(McpError::new(
            McpErrorCode::Unavailable,
            format!(
                "cannot start server `{}`: the host already runs {max} MCP server processes (its limit, max_server_processes) and every one has a call in flight; raise [mcp] max_server_processes in the host config or HostBuilder::with_max_server_processes",
                starting.entry.server_id()
            ),
        ))
    }

    /// Starts the idle reaper once, on the first server process (so a pool that never
    /// starts one needs no runtime).
    fn start_reaper(&self) {
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
    fn retire(&self, slot: &ServerSlot, conn: Arc<Connection>) {
        let server_id = slot.entry.server_id().to_owned();
        tokio::spawn(async move { conn.close(&server_id, defaults::SHUTDOWN_GRACE).await });
    }

    /// Forgets `conn` if it is still the slot's current connection, so the next call
    /// reconnects, and stops it.
    async fn discard(&self, slot: &ServerSlot, conn: &Connection) {
        let mut current = slot.conn.lock().await;
        if current.as_ref().is_some_and(|c| c.serial == conn.serial)
            && let Some(gone) = current.take()
        {
            slot.health.lost(slot.health_token.load(Ordering::SeqCst));
            self.retire(slot, gone);
        }
    }

    /// A host-wide call permit, or why not. Waits (within the caller's timeout).
    async fn call_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, McpError> {
        self.shared
            .calls
            .acquire()
            .await
            .map_err(|_| McpError::new(McpErrorCode::Unavailable, "the MCP pool is closed"))
    }

    /// Every tool the server lists (all pages), from the cache when fresh.
    pub async fn list_tools(&self, entry: &Arc<ServerEntry>) -> Result<Arc<[Tool]>, McpError> {
        let in_flight = self.enter(entry);
        let slot = &in_flight.slot;
        let secrets = entry.secrets();
        let conn = self.connect(slot).await?;
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
        let cap = entry.record.budgets.max_tool_list_bytes;
        let phase = CallPhase::new(CallPhase::WAITING_FOR_HOST);
        let listing = async {
            let _permit = self.call_permit().await?;
            phase.set(CallPhase::ON_WIRE);
            list_all_pages(&conn, server_id, cap, &phase).await
        };
        let listed = match tokio::time::timeout(timeout, listing).await {
            Ok(listed) => listed,
            Err(_) => {
                let error = self.call_timed_out(slot, "tools/list", timeout, &phase);
                if phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                return Err(error);
            }
        };
        let listed = listed.map_err(|error| error.redacted(secrets));
        let tools: Arc<[Tool]> = match listed {
            Ok(tools) => tools.into(),
            Err(error) => {
                if error.code == McpErrorCode::Unavailable {
                    self.discard(slot, &conn).await;
                }
                if server_failure(error.code) && phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                return Err(error);
            }
        };
        slot.health.listed(tools.len());
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
        let in_flight = self.enter(entry);
        let slot = &in_flight.slot;
        let conn = self.connect(slot).await?;
        let timeout = record.budgets.tool_timeout;
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let phase = CallPhase::new(CallPhase::WAITING_FOR_SERVER);
        let call = async {
            let _permit = slot.permits.acquire().await.map_err(|_| {
                McpError::new(
                    McpErrorCode::Unavailable,
                    format!("server `{server_id}` is shutting down"),
                )
            })?;
            phase.set(CallPhase::WAITING_FOR_HOST);
            let _host_permit = self.call_permit().await?;
            phase.set(CallPhase::ON_WIRE);
            let sent = Instant::now();
            let result = conn
                .service
                .call_tool(params)
                .await
                .map_err(|e| service_failed(server_id, name, e, &phase))?;
            Ok((result, sent.elapsed()))
        };
        let outcome = match tokio::time::timeout(timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => Err(self.call_timed_out(slot, name, timeout, &phase)),
        };
        let result = match outcome {
            Ok((result, latency)) => {
                // An `isError` result is an answer too: the server is fine.
                slot.health.answered(latency);
                result
            }
            Err(error) => {
                let error = error.redacted(entry.secrets());
                if error.code == McpErrorCode::Unavailable {
                    self.discard(slot, &conn).await;
                }
                if server_failure(error.code) && phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                return Err(error);
            }
        };
        // The transport capped the answer as it was read; the guest gets it re-encoded,
        // which is checked again while it is written, so no more than the cap is buffered.
        let cap = record.budgets.max_tool_output_bytes;
        let json = encode_capped(&result, cap).map_err(|error| match error {
            Encode::TooLarge => McpError::new(
                McpErrorCode::OutputTooLarge,
                format!(
                    "tool `{name}` on server `{server_id}` returned more than {cap} bytes once encoded; the limit (budgets.max_tool_output_bytes) is {cap}"
                ),
            ),
            Encode::Failed(e) => McpError::new(
                McpErrorCode::ToolExecFailed,
                format!("cannot encode the result: {e}"),
            ),
        })?;
        Ok(ToolCallOutput { result, json })
    }

    /// Every resource the server lists (all pages, at most `budgets.max_tool_list_bytes`).
    /// Not cached: resource lists change more often than tools and are read rarely.
    pub async fn list_resources(
        &self,
        entry: &Arc<ServerEntry>,
    ) -> Result<Vec<Resource>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_list_bytes;
        self.request(entry, "resources/list", |conn, phase| async move {
            list_pages(server_id, "resources/list", cap, &phase, |cursor| {
                let conn = conn.clone();
                async move {
                    let params = PaginatedRequestParams::default().with_cursor(cursor);
                    let page = conn.service.list_resources(Some(params)).await?;
                    Ok((page.resources, page.next_cursor))
                }
            })
            .await
        })
        .await
    }

    /// Every resource template the server lists, bounded like [`Self::list_resources`].
    pub async fn list_resource_templates(
        &self,
        entry: &Arc<ServerEntry>,
    ) -> Result<Vec<ResourceTemplate>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_list_bytes;
        let what = "resources/templates/list";
        self.request(entry, what, |conn, phase| async move {
            list_pages(server_id, what, cap, &phase, |cursor| {
                let conn = conn.clone();
                async move {
                    let params = PaginatedRequestParams::default().with_cursor(cursor);
                    let page = conn.service.list_resource_templates(Some(params)).await?;
                    Ok((page.resource_templates, page.next_cursor))
                }
            })
            .await
        })
        .await
    }

    /// Reads `uri`; the result's JSON, at most `budgets.max_tool_output_bytes`. The caller
    /// has decided policy ([`Grant::check_resource`](crate::policy::Grant::check_resource)).
    pub async fn read_resource(
        &self,
        entry: &Arc<ServerEntry>,
        uri: &str,
    ) -> Result<Vec<u8>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_output_bytes;
        self.request(entry, "resources/read", |conn, phase| async move {
            let result = conn
                .service
                .read_resource(ReadResourceRequestParams::new(uri))
                .await
                .map_err(|e| service_failed(server_id, "resources/read", e, &phase))?;
            encode_capped(&result, cap).map_err(|error| match error {
                Encode::TooLarge => McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "resource `{uri}` on server `{server_id}` is more than {cap} bytes once encoded; the limit (budgets.max_tool_output_bytes) is {cap}"
                    ),
                ),
                Encode::Failed(e) => McpError::new(
                    McpErrorCode::ToolExecFailed,
                    format!("cannot encode the resource: {e}"),
                ),
            })
        })
        .await
    }

    /// Every prompt the server lists, bounded like [`Self::list_resources`].
    pub async fn list_prompts(&self, entry: &Arc<ServerEntry>) -> Result<Vec<Prompt>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_list_bytes;
        self.request(entry, "prompts/list", |conn, phase| async move {
            list_pages(server_id, "prompts/list", cap, &phase, |cursor| {
                let conn = conn.clone();
                async move {
                    let params = PaginatedRequestParams::default().with_cursor(cursor);
                    let page = conn.service.list_prompts(Some(params)).await?;
                    Ok((page.prompts, page.next_cursor))
                }
            })
            .await
        })
        .await
    }

    /// Gets the prompt `name` with `arguments`; the result's JSON, at most
    /// `budgets.max_tool_output_bytes`. The caller has decided policy
    /// ([`Grant::check_prompt`](crate::policy::Grant::check_prompt)).
    pub async fn get_prompt(
        &self,
        entry: &Arc<ServerEntry>,
        name: &str,
        arguments: JsonObject,
    ) -> Result<Vec<u8>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_output_bytes;
        let params = GetPromptRequestParams::new(name).with_arguments(arguments);
        self.request(entry, "prompts/get", |conn, phase| async move {
            let result = conn
                .service
                .get_prompt(params)
                .await
                .map_err(|e| service_failed(server_id, "prompts/get", e, &phase))?;
            encode_capped(&result, cap).map_err(|error| match error {
                Encode::TooLarge => McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "prompt `{name}` on server `{server_id}` is more than {cap} bytes once encoded; the limit (budgets.max_tool_output_bytes) is {cap}"
                    ),
                ),
                Encode::Failed(e) => McpError::new(
                    McpErrorCode::ToolExecFailed,
                    format!("cannot encode the prompt: {e}"),
                ),
            })
        })
        .await
    }

    /// Runs one request other than a tool call on `entry`'s server: within its
    /// `tool_timeout` and a host call permit, its failures counted to the server's health
    /// and redacted as `tools/list`'s are.
    async fn request<'a, T, F, Fut>(
        &self,
        entry: &'a Arc<ServerEntry>,
        what: &str,
        request: F,
    ) -> Result<T, McpError>
    where
        F: FnOnce(Arc<Connection>, Arc<CallPhase>) -> Fut,
        Fut: Future<Output = Result<T, McpError>> + 'a,
    {
        let in_flight = self.enter(entry);
        let slot = &in_flight.slot;
        let conn = self.connect(slot).await?;
        let timeout = entry.record.budgets.tool_timeout;
        let phase = Arc::new(CallPhase::new(CallPhase::WAITING_FOR_HOST));
        let run = async {
            let _permit = self.call_permit().await?;
            phase.set(CallPhase::ON_WIRE);
            request(conn.clone(), phase.clone()).await
        };
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(result) => result.map_err(|error| error.redacted(entry.secrets())),
            Err(_) => Err(self.call_timed_out(slot, what, timeout, &phase)),
        };
        if let Err(error) = &result {
            if error.code == McpErrorCode::Unavailable {
                self.discard(slot, &conn).await;
            }
            if server_failure(error.code) && phase.on_wire() {
                slot.health.failed(&error.message);
            }
        }
        result
    }

    /// A timeout while doing `what` on `slot`'s server; names the cap whose permit the
    /// call was still waiting for, if it was.
    fn call_timed_out(
        &self,
        slot: &ServerSlot,
        what: &str,
        timeout: Duration,
        phase: &CallPhase,
    ) -> McpError {
        let server_id = slot.entry.server_id();
        let waited_for = match phase.get() {
            CallPhase::WAITING_FOR_SERVER => format!(
                "the server's {} call permits (budgets.max_concurrency)",
                slot.entry.record.budgets.max_concurrency
            ),
            CallPhase::WAITING_FOR_HOST => format!(
                "the host's {} MCP call permits (max_concurrent_calls)",
                self.shared.limits.max_concurrent_calls
            ),
            _ => return timed_out(server_id, what, timeout),
        };
        McpError::new(
            McpErrorCode::Timeout,
            format!(
                "{what} on server `{server_id}` waited {} ms (budgets.tool_timeout_ms) for one of {waited_for} without getting one",
                timeout.as_millis(),
            ),
        )
    }

    /// Connects to `entry`'s server afresh, beside its pooled connection (whose health,
    /// tools cache and process are untouched), lists every tool, and closes it again,
    /// stopping a stdio server's process group. The connect is bounded by the connect
    /// timeout, the listing by `tool_timeout_ms`. A stdio probe takes one of the host's
    /// `max_server_processes` permits without stopping another server for it: at the cap
    /// it fails at once. Errors carry none of the launch's secrets.
    pub async fn probe(&self, entry: &ServerEntry) -> Result<Vec<Tool>, McpError> {
        let server_id = entry.server_id();
        let permit = match entry.launch {
            Ok(Launch::Stdio { .. }) => Some(
                self.shared
                    .processes
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| {
                        McpError::new(
                            McpErrorCode::Unavailable,
                            format!(
                                "cannot start server `{server_id}` for a test: the host already runs {} MCP server processes (max_server_processes); try again when one is idle",
                                self.shared.limits.max_server_processes
                            ),
                        )
                    })?,
            ),
            _ => None,
        };
        let conn = Arc::new(self.connector.open(entry, 0, permit).await?);
        let timeout = entry.record.budgets.tool_timeout;
        let cap = entry.record.budgets.max_tool_list_bytes;
        let phase = CallPhase::new(CallPhase::ON_WIRE);
        let listed = tokio::time::timeout(timeout, list_all_pages(&conn, server_id, cap, &phase))
            .await
            .unwrap_or_else(|_| Err(timed_out(server_id, "tools/list", timeout)));
        conn.close(server_id, defaults::SHUTDOWN_GRACE).await;
        listed.map_err(|error| error.redacted(entry.secrets()))
    }

    /// Starts `entries`' servers now (connecting and listing their tools), so the first
    /// call does not wait for them. Failures are logged, not returned.
    pub async fn prewarm(&self, entries: &[Arc<ServerEntry>]) {
        let warming = entries.iter().map(|entry| async move {
            let started = Instant::now();
            let server_id = entry.server_id();
            match self.list_tools(entry).await {
                Ok(tools) => tracing::info!(
                    server_id,
                    tools = tools.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "pre-warmed MCP server"
                ),
                Err(error) => tracing::warn!(server_id, %error, "cannot pre-warm MCP server"),
            }
        });
        futures::future::join_all(warming).await;
    }

    /// The status of `server_id`: that of its slot if it has one, else what its health
    /// remembers, else an `idle` server with nothing counted (never used).
    pub fn server_status(&self, server_id: &str) -> ServerStatus {
        let slot = self.shared.slots().get(server_id).cloned();
        if let Some(slot) = slot {
            return slot.status();
        }
        let health = self.shared.health().get(server_id).cloned();
        status_of(server_id, &health.unwrap_or_default(), None)
    }

    /// Connection state of every server used so far.
    pub fn status(&self) -> Vec<ServerStatus> {
        let mut out: Vec<ServerStatus> = self
            .shared
            .slots()
            .values()
            .map(|slot| slot.status())
            .collect();
        out.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        out
    }

    /// How much of the host-wide limits is in use.
    pub fn usage(&self) -> PoolUsage {
        let limits = &self.shared.limits;
        PoolUsage {
            calls_in_flight: limits
                .max_concurrent_calls
                .saturating_sub(self.shared.calls.available_permits()),
            max_concurrent_calls: limits.max_concurrent_calls,
            server_processes: limits
                .max_server_processes
                .saturating_sub(self.shared.processes.available_permits()),
            max_server_processes: limits.max_server_processes,
        }
    }

    /// Closes every connection and stops every server process group: stdin closed, then
    /// SIGTERM, then SIGKILL, with [`defaults::SHUTDOWN_GRACE`] per step. Calls still in
    /// flight fail with `mcp_unavailable`, connects in progress at once. The pool stays usable: a later call starts its
    /// server again.
    pub async fn shutdown(&self) {
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

/// Every page of the server's `tools/list`, the tools' JSON at most `cap` bytes in all
/// (each page was capped by the transport as it was read).
async fn list_all_pages(
    conn: &Connection,
    server_id: &str,
    cap: u64,
    phase: &CallPhase,
) -> Result<Vec<Tool>, McpError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    let mut total: u64 = 0;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let page = conn
            .service
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|e| service_failed(server_id, "tools/list", e, phase))?;
        let left = cap.saturating_sub(total);
        total = match encoded_len(&page.tools, left) {
            Some(len) => total.saturating_add(len),
            None => {
                return Err(McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "server `{server_id}` listed more than {cap} bytes of tools (after {} tools); the limit (budgets.max_tool_list_bytes) is {cap}",
                        tools.len()
                    ),
                ));
            }
        };
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

/// Reads every page of a `what` listing, at most `cap` bytes of items (encoded) and
/// [`defaults::MAX_TOOL_LIST_PAGES`] pages; a server paging past that gets what was read.
async fn list_pages<T, F, Fut>(
    server_id: &str,
    what: &str,
    cap: u64,
    phase: &CallPhase,
    mut page: F,
) -> Result<Vec<T>, McpError>
where
    T: serde::Serialize,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    let mut total: u64 = 0;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let (listed, next) = page(cursor)
            .await
            .map_err(|e| service_failed(server_id, what, e, phase))?;
        total = match encoded_len(&listed, cap.saturating_sub(total)) {
            Some(len) => total.saturating_add(len),
            None => {
                return Err(McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "server `{server_id}` answered {what} with more than {cap} bytes (after {} items); the limit (budgets.max_tool_list_bytes) is {cap}",
                        items.len()
                    ),
                ));
            }
        };
        items.extend(listed);
        cursor = next;
        if cursor.is_none() {
            return Ok(items);
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        what,
        "kept paging; using what was read"
    );
    Ok(items)
}

/// Where a call is, so a failure counts against the server's health only when it happened
/// on the wire: not while waiting for a permit, and not when the server answered that it
/// has no such tool or method.
struct CallPhase(AtomicU8);

impl CallPhase {
    const WAITING_FOR_SERVER: u8 = 0;
    const WAITING_FOR_HOST: u8 = 1;
    const ON_WIRE: u8 = 2;
    /// The server answered with an error that says nothing of its health.
    const ANSWERED: u8 = 3;

    fn new(phase: u8) -> Self {
        Self(AtomicU8::new(phase))
    }

    fn set(&self, phase: u8) {
        self.0.store(phase, Ordering::SeqCst);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }

    fn on_wire(&self) -> bool {
        self.get() == Self::ON_WIRE
    }
}

/// Whether an error of `code` is the server's (or its transport's) failure, as health
/// counts it; bad arguments, a policy refusal or a result over the host's cap are not.
fn server_failure(code: McpErrorCode) -> bool {
    matches!(
        code,
        McpErrorCode::Unavailable | McpErrorCode::Timeout | McpErrorCode::ToolExecFailed
    )
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

/// `error` as the guest sees it; a JSON-RPC "method not found" (an unknown tool, on some
/// servers) marks `phase` answered, as no failure of the server's.
fn service_failed(server_id: &str, what: &str, error: ServiceError, phase: &CallPhase) -> McpError {
    if let ServiceError::McpError(data) = &error
        && data.code == ErrorCode::METHOD_NOT_FOUND
    {
        phase.set(CallPhase::ANSWERED);
    }
    match error {
        // A transport failed this request itself and said why.
        ServiceError::McpError(data) if let Some(error) = from_host_error(&data) => error,
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
